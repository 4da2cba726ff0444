/* cotrain tests: the web site in headless Chromium (Debian's `chromium`),
 * against the real cotrain-server with data: the dashboard draws its
 * plots, the leaderboard lists its rows, a user named with markup shows
 * as text, not as elements, and a host's page shows its NAT class, the
 * rungs of its connections and the pairs that history relays at once.
 * Screenshots are written under the build folder (tests/web-screenshots/)
 * for people to look at.  SKIP when
 * chromium is absent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/tap.h"
#include "tests/test_server_harness.h"

#define HOSTILE "<b>x</b><script>document.title=\"pwned\"</script>"

static const char *chromium(void)
{
	static const char *const names[] = { "/usr/bin/chromium", "/usr/bin/chromium-browser" };
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (access(names[i], X_OK) == 0)
			return names[i];
	return NULL;
}

/* Load url in headless Chromium in a window width px wide, let its scripts
 * run for a few seconds of virtual time; the serialised DOM (malloc'd), or
 * NULL. */
static char *dump_dom_at(const char *chrome, const char *url, const char *shot, int width)
{
	char cmd[2048];
	char tmpl[] = "/tmp/cotrain-dom-XXXXXX";
	int fd = mkstemp(tmpl);
	if (fd < 0)
		return NULL;
	close(fd);
	/* --no-sandbox: tests run as root in CI; the page is our own. */
	snprintf(cmd, sizeof cmd,
	         "timeout 60 '%s' --headless --no-sandbox --disable-gpu --no-first-run "
	         "--user-data-dir=%s.profile --window-size=%d,1000 --virtual-time-budget=8000 "
	         "--dump-dom '%s' > %s 2>/dev/null",
	         chrome, tmpl, width, url, tmpl);
	/* Once more when Chromium fails (it has, rarely, under CI's load). */
	int rc = system(cmd);
	if (rc != 0) {
		diag("chromium --dump-dom %s: status %d; once more", url, rc);
		rc = system(cmd);
	}
	if (shot) {
		snprintf(cmd, sizeof cmd,
		         "timeout 60 '%s' --headless --no-sandbox --disable-gpu --no-first-run "
		         "--user-data-dir=%s.profile --window-size=%d,1000 --virtual-time-budget=8000 "
		         "--screenshot='%s' '%s' >/dev/null 2>&1",
		         chrome, tmpl, width, shot, url);
		if (system(cmd))
			diag("screenshot of %s failed", url);
	}
	char *dom = NULL;
	FILE *f = fopen(tmpl, "r");
	if (f && rc == 0) {
		fseek(f, 0, SEEK_END);
		long n = ftell(f);
		rewind(f);
		dom = n >= 0 ? calloc(1, (size_t)n + 1) : NULL;
		if (dom && fread(dom, 1, (size_t)n, f) != (size_t)n) {
			free(dom);
			dom = NULL;
		}
	}
	if (f)
		fclose(f);
	unlink(tmpl);
	snprintf(cmd, sizeof cmd, "rm -rf %s.profile", tmpl);
	if (system(cmd))
		diag("could not remove the profile");
	return dom;
}

static char *dump_dom(const char *chrome, const char *url, const char *shot)
{
	return dump_dom_at(chrome, url, shot, 1280);
}

/* An attribute of the page's <html> element, in a static buffer; "" when
 * it is not set.  app.js's markOverflow sets data-overflow (how far the page
 * is wider than the window) and data-cut-times (time cells that cut their
 * text), measured inside the page. */
static const char *html_attr(const char *dom, const char *name)
{
	static char val[32];
	char key[64];
	val[0] = 0;
	snprintf(key, sizeof key, " %s=\"", name);
	const char *h = dom ? strstr(dom, "<html") : NULL;
	const char *end = h ? strchr(h, '>') : NULL;
	const char *a = h ? strstr(h, key) : NULL;
	if (a && a < end) {
		a += strlen(key);
		snprintf(val, sizeof val, "%.*s", (int)strcspn(a, "\""), a);
	}
	return val;
}

static const char *overflow_of(const char *dom) { return html_attr(dom, "data-overflow"); }

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/* The value of attribute attr of the <canvas> labelled title in dom, in a
 * static buffer ("" when there is no such canvas or attribute). */
static const char *canvas_attr(const char *dom, const char *title, const char *attr)
{
	static char val[64];
	char want[160];
	val[0] = 0;
	snprintf(want, sizeof want, "aria-label=\"%s\"", title);
	for (const char *c = strstr(dom, "<canvas"); c; c = strstr(c + 1, "<canvas")) {
		const char *end = strchr(c, '>');
		const char *lab = strstr(c, want);
		if (!end || !lab || lab > end)
			continue;
		char key[64];
		snprintf(key, sizeof key, " %s=\"", attr);
		const char *a = strstr(c, key);
		if (a && a < end) {
			a += strlen(key);
			size_t n = strcspn(a, "\"");
			snprintf(val, sizeof val, "%.*s", (int)(n < sizeof val ? n : sizeof val - 1), a);
		}
		break;
	}
	return val;
}

/* A committed round v at minute v, with n hosts' samples. */
static void round_committed(long long pid, int v, long long *hosts, int n)
{
	th_sql("UPDATE round SET opened_at = now() - interval '1 hour' + make_interval(mins => %d),"
	       " loss = %g WHERE project_id = %lld AND version = %d",
	       v * 2, 5.5 - 0.4 * v, pid, v);
	for (int i = 0; i < n; i++) {
		th_sql("INSERT INTO work_unit (project_id, host_id, version, lo, hi, mb_done, state, "
		       "deadline)"
		       " VALUES (%lld, %lld, %d, %d, %d, 5, 'returned', now())",
		       pid, hosts[i], v, 100 * v + 10 * i, 100 * v + 10 * i + 5);
		th_sql("INSERT INTO round_member (project_id, version, host_id, group_id, samples, endpoint,"
		       " bandwidth, can_aggregate, lo, hi, outcome, params_sha256, accepted)"
		       " VALUES (%lld, %d, %lld, 0, %d, '127.0.0.1:1', 1e6, true, 0, 0, 'ok', 'h', true)",
		       pid, v, hosts[i], 20 * (i + 1));
	}
	th_sql("UPDATE round SET state = 'committed', samples = (SELECT sum(samples) FROM round_member"
	       " WHERE project_id = %lld AND version = %d),"
	       " committed_at = opened_at + make_interval(secs => %d)"
	       " WHERE project_id = %lld AND version = %d",
	       pid, v, 60 + 7 * v, pid, v);
	th_sql("INSERT INTO round (project_id, version) VALUES (%lld, %d)", pid, v + 1);
	th_sql("UPDATE project SET current_version = %d WHERE id = %lld", v + 1, pid);
	/* The held-out evaluation of versions 0 to 5 only (the evaluator is
	 * behind), so its curve has 6 points beside the loss's 8. */
	if (v < 6)
		th_sql("INSERT INTO model_version (project_id, version, heldout_bpb, heldout_at)"
		       " VALUES (%lld, %d, %g, now()) ON CONFLICT (project_id, version)"
		       " DO UPDATE SET heldout_bpb = EXCLUDED.heldout_bpb, heldout_at = now()",
		       pid, v, 8.0 - 0.5 * v);
}

int main(void)
{
	const char *chrome = chromium();
	if (!chrome) {
		printf("1..0 # SKIP chromium is not installed (Debian package \"chromium\")\n");
		return 0;
	}
	plan_lazy();
	th_start(NULL);
	long long pid = th_seed_project("webdemo", 180, 2e9, 4, 8, 4, 100000);
	th_sql("DELETE FROM spot_policy WHERE project_id = %lld", pid); /* no spot checks */
	long long hosts[3];
	char key[64], token[64];
	static const char *const tags[] = { "ann", "ben", "cat" };
	for (int i = 0; i < 3; i++)
		th_new_host(tags[i], 1e9, key, &hosts[i], token);
	th_sql("UPDATE account SET name = '%s' WHERE id = (SELECT account_id FROM host WHERE id = %lld)",
	       HOSTILE, hosts[2]);
	th_sql("INSERT INTO team (name, description) VALUES ('team <i>ital</i>', 'desc <img src=x "
	       "onerror=alert(1)>')");
	th_sql("UPDATE account SET team_id = (SELECT max(id) FROM team)");
	for (int v = 0; v < 8; v++)
		round_committed(pid, v, hosts, v < 3 ? 2 : 3);

	const char *bd = getenv("top_builddir");
	char shots[1024];
	snprintf(shots, sizeof shots, "%s/tests/web-screenshots", bd ? bd : ".");
	mkdir(shots, 0755);
	char url[512], shot[1200];

	snprintf(url, sizeof url, "%s/dashboard?project=webdemo", th_url());
	snprintf(shot, sizeof shot, "%s/dashboard.png", shots);
	char *dom = dump_dom(chrome, url, shot);
	ok(dom != NULL, "the dashboard loads in headless Chromium");
	if (dom) {
		ok(count(dom, "<canvas") == 4, "the dashboard has its four plots");
		static const char *const plots[] = { "Loss (bits per byte)", "Samples per second (per round)",
			                             "Time per round (s)", "Peers per round" };
		for (size_t i = 0; i < sizeof plots / sizeof plots[0]; i++)
			is_str(canvas_attr(dom, plots[i], "data-points"), "8",
			       "the plot \"%s\" was drawn with the 8 committed rounds", plots[i]);
		is_str(canvas_attr(dom, "Loss (bits per byte)", "data-points-2"), "6",
		       "the loss plot has the held-out curve beside it, with the 6 versions evaluated");
		ok(strstr(dom, "held-out bits / byte") && strstr(dom, "5.5 (v5)"),
		   "the dashboard shows the latest held-out bits per byte and its version");
		ok(strstr(dom, "Loading") == NULL && strstr(dom, "class=\"error\"") == NULL,
		   "the dashboard's data loaded without error");
		is_str(canvas_attr(dom, "Loss (bits per byte)", "data-x"), "version",
		       "the plots are against the model version by default");
		is_int(count(dom, "class=\"contributor\""), 3, "the contributors table has the 3 accounts");
		ok(strstr(dom, "<th class=\"num\">Samples</th>") &&
		           strstr(dom, "<th class=\"when\">Last seen</th>") &&
		           strstr(dom, "&lt;b&gt;x&lt;/b&gt;"),
		   "  with their names (as text), samples, credit and when last seen");
		is_str(overflow_of(dom), "0", "the dashboard fits a 1280 px window (no sideways scroll)");
	}
	free(dom);
	struct stat st;
	ok(stat(shot, &st) == 0 && st.st_size > 1000, "a screenshot of the dashboard is at %s", shot);

	snprintf(url, sizeof url, "%s/dashboard?project=webdemo&x=time", th_url());
	dom = dump_dom(chrome, url, NULL);
	ok(dom && !strcmp(canvas_attr(dom, "Loss (bits per byte)", "data-x"), "time") &&
	           !strcmp(canvas_attr(dom, "Loss (bits per byte)", "data-points"), "8") &&
	           !strcmp(canvas_attr(dom, "Peers per round", "data-x"), "time"),
	   "with ?x=time the plots are against the time each round committed");
	free(dom);

	/* A 390 px phone: every page fits its width, measured inside the page. */
	static const struct {
		const char *path, *file;
	} phone[] = { { "/dashboard?project=webdemo", "dashboard-390.png" },
		      { "/leaderboard?kind=users", "leaderboard-390.png" },
		      { "/", "project-390.png" },
		      { "/signup", "signup-390.png" } };
	for (size_t i = 0; i < sizeof phone / sizeof phone[0]; i++) {
		snprintf(url, sizeof url, "%s%s", th_url(), phone[i].path);
		snprintf(shot, sizeof shot, "%s/%s", shots, phone[i].file);
		dom = dump_dom_at(chrome, url, shot, 390);
		is_str(overflow_of(dom), "0", "%s fits a 390 px phone (no sideways scroll)", phone[i].path);
		is_str(html_attr(dom, "data-cut-times"), "0", "  and no time in it is cut");
		free(dom);
	}

	snprintf(url, sizeof url, "%s/leaderboard?kind=users", th_url());
	snprintf(shot, sizeof shot, "%s/leaderboard.png", shots);
	dom = dump_dom(chrome, url, shot);
	ok(dom != NULL, "the leaderboard loads");
	if (dom) {
		ok(count(dom, "class=\"row\"") == 3, "the leaderboard shows its 3 users");
		ok(strstr(dom, "&lt;b&gt;x&lt;/b&gt;&lt;script&gt;") != NULL,
		   "the user named with markup shows as text");
		ok(strstr(dom, "<b>x</b>") == NULL && strstr(dom, "<title>pwned") == NULL,
		   "no element came out of the user's name and its script never ran");
		ok(strstr(dom, "team &lt;i&gt;ital&lt;/i&gt;") != NULL,
		   "the team name with markup shows as text");
	}
	free(dom);
	ok(stat(shot, &st) == 0 && st.st_size > 1000, "a screenshot of the leaderboard is at %s", shot);

	snprintf(url, sizeof url, "%s/team?id=%lld", th_url(), th_sql_int("SELECT max(id) FROM team"));
	snprintf(shot, sizeof shot, "%s/team.png", shots);
	dom = dump_dom(chrome, url, shot);
	ok(dom && strstr(dom, "&lt;img src=x onerror=alert(1)&gt;") && !strstr(dom, "<img"),
	   "a team description with markup shows as text on the team page");
	free(dom);

	snprintf(url, sizeof url, "%s/", th_url());
	snprintf(shot, sizeof shot, "%s/project.png", shots);
	dom = dump_dom(chrome, url, shot);
	ok(dom && strstr(dom, "cotrainctl attach") && strstr(dom, "webdemo"),
	   "the project page says how to join");
	free(dom);

	/* The host page's network part (0009_nat_links.sql): the class, the
	 * rungs of the latest round's connections, never the address. */
	th_sql("UPDATE host SET nat_class = 'nat', nat_mapping = 'independent',"
	       " nat_public_addr = '198.51.100.9', nat_public_port = 40000, nat_observed_at = now(),"
	       " relay_bytes_in = 2500000, relay_bytes_out = 1200 WHERE id = %lld",
	       hosts[0]);
	th_sql("INSERT INTO round_link (project_id, version, host_id, peer_id, rung, connect_ms) VALUES"
	       " (%lld, 7, %lld, %lld, 'relay', 830), (%lld, 7, %lld, %lld, 'punch', 40.5)",
	       pid, hosts[0], hosts[1], pid, hosts[1], hosts[0]);
	/* A grant waiting for a spot check: pending credit beside the total. */
	th_sql("INSERT INTO credit_grant (kind, project_id, version, host_id, account_id, team_id, samples,"
	       " flops, credit, status, created_at)"
	       " SELECT 'round', %lld, 100, h.id, h.account_id, a.team_id, 4, 8e9, 1.25, 'pending', now()"
	       " FROM host h JOIN account a ON a.id = h.account_id WHERE h.id = %lld",
	       pid, hosts[0]);
	snprintf(url, sizeof url, "%s/host?id=%lld", th_url(), hosts[0]);
	snprintf(shot, sizeof shot, "%s/host.png", shots);
	dom = dump_dom(chrome, url, shot);
	ok(dom && strstr(dom, ">pending<") && strstr(dom, ">1.25<"),
	   "the host page shows its pending credit (1.25)");
	ok(dom && strstr(dom, "id=\"reachability\"") && strstr(dom, "behind NAT") && strstr(dom, "2.5 MB") &&
	           !strstr(dom, "class=\"error\""),
	   "the host page shows the host's reachability and relayed bytes");
	ok(dom && strstr(dom, "id=\"links\"") && count(dom, "class=\"link\"") == 2 &&
	           strstr(dom, "<td class=\"rung\">relay</td>") &&
	           strstr(dom, "<td class=\"rung\">punch</td>") && strstr(dom, "Connections of round 7"),
	   "  and the rung of each connection of its latest round, both ways");
	ok(dom && strstr(dom, "1 rounds: 0 in its household, 0 direct, 0 punched, 1 relayed"),
	   "  and the rungs it dialed over its latest rounds");
	ok(dom && !strstr(dom, "198.51.100.9"), "  but not its public address");
	free(dom);

	/* An encoder's dashboard names its objective and plots its loss in
	 * nats beside the held-out masked-LM loss (versions 0 and 1 evaluated),
	 * with the latest held-out accuracy. */
	long long eid = th_seed_project("encdemo", 180, 2e9, 4, 8, 4, 100000);
	th_sql("DELETE FROM spot_policy WHERE project_id = %lld", eid);
	th_sql("UPDATE project SET config = '{\"model\": {\"arch\": \"albert\", \"n_layer\": 2, "
	       "\"n_shared\": 1, "
	       "\"n_head\": 2, \"d_model\": 64, \"d_ff\": 256, \"seq_len\": 8, \"vocab\": 260, "
	       "\"d_embed\": 32, \"type_vocab\": 2, \"cls_id\": 256, \"sep_id\": 257, \"mask_id\": 258, "
	       "\"pad_id\": 259}}' WHERE id = %lld",
	       eid);
	for (int v = 0; v < 3; v++)
		round_committed(eid, v, hosts, 2);
	th_sql("UPDATE model_version SET heldout_bpb = NULL, heldout_at = NULL WHERE project_id = %lld", eid);
	for (int v = 0; v < 2; v++)
		th_sql("UPDATE model_version SET heldout_mlm_loss = %g, heldout_mlm_accuracy = %g,"
		       " heldout_at = now() WHERE project_id = %lld AND version = %d",
		       5.0 - v, 0.2 + 0.21 * v, eid, v);
	snprintf(url, sizeof url, "%s/dashboard?project=encdemo", th_url());
	snprintf(shot, sizeof shot, "%s/dashboard-encoder.png", shots);
	dom = dump_dom(chrome, url, shot);
	ok(dom && strstr(dom, "masked LM + sentence order") &&
	           !strcmp(canvas_attr(dom, "Loss (masked LM + sentence order, nats)", "data-points"), "3") &&
	           !strstr(dom, "Loss (bits per byte)") && !strstr(dom, "class=\"error\""),
	   "an ALBERT project's dashboard names its objective and plots its 3 rounds' loss in nats");
	ok(dom && !strcmp(canvas_attr(dom, "Loss (masked LM + sentence order, nats)", "data-points-2"), "2") &&
	           strstr(dom, "held-out MLM accuracy") && strstr(dom, "41 % (v1)") &&
	           !strstr(dom, "held-out bits"),
	   "  beside the held-out masked-LM loss of the 2 versions evaluated, and shows the latest "
	   "held-out accuracy");
	free(dom);

	for (int k = 0; k < 2; k++) { /* the grants' "When" column, the user's hosts */
		if (k == 0)
			snprintf(url, sizeof url, "%s/host?id=%lld", th_url(), hosts[0]);
		else
			snprintf(url, sizeof url, "%s/user?id=%lld", th_url(),
			         th_sql_int("SELECT account_id FROM host WHERE id = %lld", hosts[0]));
		snprintf(shot, sizeof shot, "%s/%s-390.png", shots, k ? "user" : "host");
		dom = dump_dom_at(chrome, url, shot, 390);
		is_str(overflow_of(dom), "0", "the %s page fits a 390 px phone", k ? "user" : "host");
		ok(dom && strstr(dom, "<td class=\"when\">") &&
		           !strcmp(html_attr(dom, "data-cut-times"), "0"),
		   "  with the whole time in the When column of its grants (%s cut)",
		   html_attr(dom, "data-cut-times"));
		free(dom);
	}
	/* Plans from history (doc/nat.md): the pair's punches failed both ways
	 * in round 8, so the NAT service relays it at once for now. */
	th_sql("INSERT INTO round_link (project_id, version, host_id, peer_id, rung, connect_ms, plan) VALUES"
	       " (%lld, 8, %lld, %lld, 'relay', 4210, 'punch'), (%lld, 8, %lld, %lld, 'relay', 4190, "
	       "'punch')",
	       pid, hosts[0], hosts[1], pid, hosts[1], hosts[0]);
	snprintf(url, sizeof url, "%s/host?id=%lld", th_url(), hosts[0]);
	snprintf(shot, sizeof shot, "%s/host-history.png", shots);
	dom = dump_dom(chrome, url, shot);
	char skipped[64];
	snprintf(skipped, sizeof skipped, "for now: host %lld (punch).", hosts[1]);
	ok(dom && strstr(dom, "id=\"history\"") && strstr(dom, "Failed punches in a row: 2.") &&
	           strstr(dom, skipped),
	   "  and, after two failed punches with a peer, that the pair goes through the relay for now");
	free(dom);
	done_testing();
	return exit_status();
}
