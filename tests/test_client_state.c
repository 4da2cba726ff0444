/* cotrain tests: the client's state file, configuration, preferences,
 * backoff and project URLs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/api.h"
#include "client/backoff.h"
#include "client/conf.h"
#include "client/prefs.h"
#include "client/state.h"
#include "tests/tap.h"

static char dir[64];

static void write_file(const char *name, const char *text)
{
	char path[256];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
}

int main(void)
{
	plan_lazy();
	snprintf(dir, sizeof dir, "/tmp/cotrain-clstate-XXXXXX");
	if (!mkdtemp(dir))
		bail_out("mkdtemp");
	cot_errbuf eb = { "", "" };

	/* state: round trip with a work unit and a journaled report */
	cl_state s, r;
	cl_state_init(&s);
	cl_project *p;
	ok(cl_state_add(&s, &p, &eb) == COT_OK, "add a project");
	strcpy(p->url, "http://h/projects/tiny");
	strcpy(p->base, "http://h");
	strcpy(p->name, "tiny");
	strcpy(p->host_token, "tok12345");
	p->host_id = 3;
	p->model.n_layer = 1;
	p->has_work = 1;
	p->work = (cl_work){ .id = 9,
		             .lo = 10,
		             .hi = 30,
		             .keep_hi = 30,
		             .mb_done = 7,
		             .mb_reported = 5,
		             .pending_op = CL_REPORT_HEARTBEAT,
		             .pending_mb = 7,
		             .deadline = 100,
		             .nfiles = 1 };
	strcpy(p->work.files[0].url, "/files/x");
	memset(p->work.files[0].sha256, 'a', 64);
	p->work.files[0].size = 12;
	cl_project_mark_done(p, 8);
	ok(cl_state_save(&s, dir, &eb) == COT_OK, "save: %s", eb.msg);
	ok(cl_state_save(&s, dir, &eb) == COT_OK, "save again (keeps a previous copy)");
	cl_state_init(&r);
	ok(cl_state_load(&r, dir, &eb) == COT_OK && eb.msg[0] == '\0', "load: %s", eb.msg);
	is_int(r.nprojects, 1, "one project back");
	is_int(r.projects[0].work.mb_done, 7, "mb_done back");
	is_int(r.projects[0].work.pending_op, CL_REPORT_HEARTBEAT, "journaled report back");
	ok(cl_project_recently_done(&r.projects[0], 8), "finished ids back");

	/* corrupt: one flipped byte fails the checksum; the previous copy is used */
	char path[256];
	snprintf(path, sizeof path, "%s/state.json", dir);
	FILE *f = fopen(path, "r+");
	fseek(f, 200, SEEK_SET);
	fputc('#', f);
	fclose(f);
	cl_state_free(&r);
	cl_state_init(&r);
	eb.msg[0] = '\0';
	ok(cl_state_load(&r, dir, &eb) == COT_OK, "a corrupt state still loads");
	ok(strstr(eb.msg, "checksum") && strstr(eb.msg, "previous copy"), "and says so: %s", eb.msg);
	is_int(r.nprojects, 1, "from the previous copy");
	/* both bad: empty state, message */
	write_file("state.json", "cotrain-client-state 1 00\n{}\n");
	write_file("state.json.prev", "garbage");
	cl_state_free(&r);
	cl_state_init(&r);
	ok(cl_state_load(&r, dir, &eb) == COT_OK && r.nprojects == 0, "both copies bad: empty state");
	ok(strstr(eb.msg, "no usable previous copy") != NULL, "with a clear message: %s", eb.msg);
	/* a valid checksum over a body of the wrong shape */
	char *text;
	size_t len;
	cl_state_to_text(&s, &text, &len, &eb);
	ok(cl_state_from_text(&r, text, len, &eb) == COT_OK, "text round trip");
	char *bad = strstr(text, "\"mb_done\": 7");
	ok(bad != NULL, "found mb_done in the text");
	free(text);

	/* an unwritable folder: the old file stays */
	ok(cl_state_save(&s, "/nonexistent/dir", &eb) == COT_ERR_IO, "unwritable folder: %s", eb.msg);

	/* preferences */
	cl_prefs pr = { .set = 0 };
	ok(cl_prefs_set_text(&pr, PREF_DISK_MAX, "2G", &eb) == COT_OK && pr.v[PREF_DISK_MAX] == 2LL << 30,
	   "disk_max 2G");
	ok(cl_prefs_set_text(&pr, PREF_CPU_PERCENT, "150", &eb) == COT_ERR_INVALID,
	   "cpu_percent 150 refused: %s", eb.msg);
	ok(cl_prefs_set_text(&pr, PREF_ONLY_WHEN_IDLE, "maybe", &eb) == COT_ERR_INVALID,
	   "bad boolean refused");
	json_t *j = json_pack("{s:s}", "max_threads", "two");
	ok(cl_prefs_from_json(&pr, j, &eb) == COT_ERR_INVALID, "wrong JSON type refused: %s", eb.msg);
	json_decref(j);
	cl_prefs_defaults(&pr);
	pr.v[PREF_CPU_PERCENT] = 50;
	is_int(cl_prefs_threads(&pr, 8), 4, "50%% of 8 cores is 4 threads");
	pr.v[PREF_MAX_THREADS] = 2;
	is_int(cl_prefs_threads(&pr, 8), 2, "max_threads caps it");

	/* configuration */
	cl_config c;
	cl_config_defaults(&c);
	write_file("good.conf",
	           "# comment\nstate_dir = \"/var/tmp/x\"\nheartbeat_interval=5\nonly_when_idle = yes\n");
	snprintf(path, sizeof path, "%s/good.conf", dir);
	ok(cl_config_load(&c, path, &eb) == COT_OK && c.heartbeat_interval == 5 &&
	           c.prefs.v[PREF_ONLY_WHEN_IDLE] == 1 && strcmp(c.state_dir, "/var/tmp/x") == 0,
	   "a good config");
	write_file("bad.conf", "state_dir = /x\nheartbeat_intervall = 5\n");
	snprintf(path, sizeof path, "%s/bad.conf", dir);
	ok(cl_config_load(&c, path, &eb) == COT_ERR_INVALID && strstr(eb.msg, ":2: unknown"),
	   "a typo is an error with the line: %s", eb.msg);
	write_file("bad2.conf", "retry_max = -3\n");
	snprintf(path, sizeof path, "%s/bad2.conf", dir);
	ok(cl_config_load(&c, path, &eb) == COT_ERR_INVALID, "a bad value: %s", eb.msg);

	/* backoff: doubling, jitter within [d/2, d], capped */
	cl_backoff b;
	cl_backoff_init(&b, 2, 60);
	double d1 = cl_backoff_fail(&b, 0, 0.0), d2 = cl_backoff_fail(&b, 0, 0.999);
	ok(d1 == 1 && d2 > 3.9 && d2 <= 4, "delays grow: %g then %g", d1, d2);
	for (int i = 0; i < 20; i++)
		d1 = cl_backoff_fail(&b, 0, 0.999);
	ok(d1 <= 60 && d1 > 59, "capped at retry_max: %g", d1);
	ok(!cl_backoff_ready(&b, 10), "not ready before the delay");
	cl_backoff_ok(&b);
	ok(cl_backoff_ready(&b, 0), "ready after a success");

	/* project URLs */
	char base[256], name[70];
	ok(cl_api_parse_project_url("https://ex.org/x/projects/demo", base, sizeof base, name, sizeof name,
	                            &eb) == COT_OK &&
	           strcmp(base, "https://ex.org/x") == 0 && strcmp(name, "demo") == 0,
	   "project URL");
	ok(cl_api_parse_project_url("http://h:8080/v1/projects/demo/", base, sizeof base, name, sizeof name,
	                            &eb) == COT_OK &&
	           strcmp(base, "http://h:8080") == 0,
	   "API-style project URL");
	ok(cl_api_parse_project_url("ftp://h/projects/demo", base, sizeof base, name, sizeof name, &eb) ==
	           COT_ERR_INVALID,
	   "ftp refused");
	ok(cl_api_parse_project_url("http://h/projects/../etc", base, sizeof base, name, sizeof name, &eb) ==
	           COT_ERR_INVALID,
	   "bad name refused");

	cl_state_free(&s);
	cl_state_free(&r);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		diag("could not remove %s", dir);
	done_testing();
	return exit_status();
}
