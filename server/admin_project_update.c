/* cotrain-admin project update: change a running project's hyperparameters
 * from a model version on (doc/project-file.md "changes", doc/design.md
 * "Changing a run").
 *
 * The change is appended to the project's config ("changes", with the
 * version it takes effect at and the time it was made), the whole config
 * is checked again as a project file (server/project_file.c: every
 * version's settings must be valid), and the columns the scheduler reads
 * follow (project_apply_settings, db/functions/project_settings.sql), all
 * in one transaction under the project's and its round's row locks, so a
 * round cannot close between the check of its state and the change.  The
 * server's step and every client's step read the config with its changes
 * (kernels/config_changes.h), so all apply the same optimizer at every
 * version. */
#include "server/admin.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "server/project_file.h"

static const char usage[] =
        "usage: cotrain-admin project update [--json] [--at VERSION] NAME SETTING=VALUE...\n"
        "\n"
        "Changes the settings of project NAME from model version VERSION on: the round\n"
        "that trains VERSION into VERSION+1 and every later one.  Without --at, the\n"
        "change applies from the current version when its round is still open, else\n"
        "from the next (a local-mode project's optimizer: from the next).  A version\n"
        "in the past is refused.  SETTING is one of:\n"
        "  optimizer.lr                      peak learning rate (above 0, at most 10)\n"
        "  optimizer.schedule.warmup_steps   steps of linear warm-up\n"
        "  optimizer.schedule.total_steps    end of the decay (extend the schedule)\n"
        "  optimizer.schedule.decay          constant, linear or cosine\n"
        "  optimizer.schedule.min_lr_ratio   floor of the decay, 0 to 1\n"
        "  target_batch                      samples per step, a multiple of microbatch_size\n"
        "  work_unit_seconds                 seconds of work a unit holds, 1 to 86400\n"
        "  validation.trusted_after          agreeing spot checks before a host's rate falls\n"
        "  validation.first_rate             spot-check rate of a new host, 0 to 1\n"
        "  validation.min_rate               least spot-check rate of a trusted host, 0 to 1\n"
        "  validation.decay                  rate factor per further agreeing check, (0, 1]\n"
        "The schedule counts optimizer steps from version 0, so a changed schedule\n"
        "takes its value at the version it applies from; in local mode the optimizer\n"
        "is the inner steps'.  The changes show in \"project show\" (config.changes).\n";

typedef enum { SET_INT, SET_REAL, SET_WORD } setting_kind;

static const struct {
	const char *name;
	setting_kind kind;
} settings[] = {
	{ "optimizer.lr", SET_REAL },
	{ "optimizer.schedule.warmup_steps", SET_INT },
	{ "optimizer.schedule.total_steps", SET_INT },
	{ "optimizer.schedule.decay", SET_WORD },
	{ "optimizer.schedule.min_lr_ratio", SET_REAL },
	{ "target_batch", SET_INT },
	{ "work_unit_seconds", SET_INT },
	{ "validation.trusted_after", SET_INT },
	{ "validation.first_rate", SET_REAL },
	{ "validation.min_rate", SET_REAL },
	{ "validation.decay", SET_REAL },
};
#define N_SETTINGS (sizeof settings / sizeof settings[0])

/* Put one "SETTING=VALUE" argument into change (nested objects by the
 * dotted name).  ADMIN_OK or ADMIN_USAGE with the message printed. */
static int add_setting(json_t *change, const char *arg)
{
	const char *eq = strchr(arg, '=');
	size_t klen = eq ? (size_t)(eq - arg) : 0;
	int k = -1;
	for (size_t i = 0; eq && i < N_SETTINGS; i++)
		if (strlen(settings[i].name) == klen && memcmp(settings[i].name, arg, klen) == 0)
			k = (int)i;
	if (!eq)
		return admin_usage(usage, "project update: \"%.80s\" is not SETTING=VALUE", arg);
	if (k < 0)
		return admin_usage(usage, "project update: unknown setting \"%.*s\"",
		                   (int)(klen > 80 ? 80 : klen), arg);
	const char *val = eq + 1;
	json_t *v = NULL;
	if (settings[k].kind == SET_INT) {
		long long x;
		if (admin_parse_ll(val, LLONG_MIN, LLONG_MAX, &x))
			v = json_integer(x);
	} else if (settings[k].kind == SET_REAL) {
		char *end;
		double x = strtod(val, &end);
		if (*val && !*end && isfinite(x))
			v = json_real(x);
	} else if (*val && strlen(val) <= 32) {
		v = json_string(val);
	}
	if (!v)
		return admin_usage(usage, "project update: setting \"%s\" needs %s, not \"%.40s\"",
		                   settings[k].name,
		                   settings[k].kind == SET_INT    ? "an integer"
		                   : settings[k].kind == SET_REAL ? "a finite number"
		                                                  : "a word",
		                   val);
	/* Walk the dotted name, creating the objects on the way. */
	char path[64];
	snprintf(path, sizeof path, "%s", settings[k].name);
	json_t *obj = change;
	char *part = path, *dot;
	while ((dot = strchr(part, '.'))) {
		*dot = '\0';
		json_t *sub = json_object_get(obj, part);
		if (!sub) {
			sub = json_object();
			json_object_set_new(obj, part, sub);
		}
		obj = sub;
		part = dot + 1;
	}
	if (json_object_get(obj, part)) {
		json_decref(v);
		return admin_usage(usage, "project update: setting \"%s\" given twice", settings[k].name);
	}
	json_object_set_new(obj, part, v);
	return ADMIN_OK;
}

int admin_project_update(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	bool json = false;
	long long at = -1;
	const char *name = NULL;
	json_t *change = json_object();
	int ret = ADMIN_USAGE, i = 1;
	if (!change)
		return admin_failf("out of memory");
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = true;
		else if (strcmp(argv[i], "--at") == 0 && i + 1 < argc) {
			if (!admin_parse_ll(argv[++i], 0, INT32_MAX, &at)) {
				admin_usage(usage, "project update: --at needs a version, not \"%.40s\"",
				            argv[i]);
				goto out;
			}
		} else {
			admin_usage(usage, "project update: unknown option \"%.40s\"", argv[i]);
			goto out;
		}
	}
	if (i >= argc) {
		admin_usage(usage, "project update: give a project NAME");
		goto out;
	}
	name = argv[i++];
	if (i >= argc) {
		admin_usage(usage, "project update: give at least one SETTING=VALUE");
		goto out;
	}
	for (; i < argc; i++)
		if (add_setting(change, argv[i]))
			goto out;

	ret = ADMIN_FAIL;
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		goto out;
	if (admin_begin(ctx, &eb)) {
		admin_fail(&eb);
		goto out;
	}
	const char *np[1] = { name };
	/* Locks in the order the round's own paths take them (the round of the
	 * current version, then its project), so that an update beside a commit
	 * or an assignment waits instead of deadlocking: the version is read
	 * first without a lock, its round locked, then the project locked and
	 * the version read again; when a commit moved it on meanwhile, again. */
	PGresult *r;
	int tries = 0;
	long long locked;
again:
	locked = -1;
	if (!(r = admin_exec(ctx, "SELECT id, current_version FROM project WHERE name = $1", 1, np, &eb)))
		goto fail;
	if (PQntuples(r) == 1) {
		const char *lp[2] = { PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1) };
		locked = atoll(lp[1]);
		PGresult *l =
		        admin_exec(ctx,
		                   "SELECT 1 FROM round WHERE project_id = $1 AND version = $2 FOR UPDATE", 2,
		                   lp, &eb);
		PQclear(r);
		if (!l)
			goto fail;
		PQclear(l);
	} else {
		PQclear(r);
	}
	r = admin_exec(ctx,
	               "SELECT id, config::text, current_version FROM project WHERE name = $1"
	               " FOR UPDATE",
	               1, np, &eb);
	if (!r)
		goto fail;
	if (PQntuples(r) == 0) {
		PQclear(r);
		cot_seterr(&eb, COT_ERR_NOT_FOUND, "project \"%.80s\" does not exist", name);
		cot_sethint(&eb, "cotrain-admin project list shows the projects.");
		goto fail;
	}
	char id[32];
	snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
	json_t *config = json_loads(PQgetvalue(r, 0, 1), 0, NULL);
	long long current = atoll(PQgetvalue(r, 0, 2));
	PQclear(r);
	if (current != locked && ++tries < 5) {
		json_decref(config);
		admin_rollback(ctx);
		if (admin_begin(ctx, &eb)) {
			admin_fail(&eb);
			goto out;
		}
		goto again;
	}
	if (!json_is_object(config)) {
		json_decref(config);
		cot_seterr(&eb, COT_ERR_CORRUPT, "the config of project \"%.80s\" is not a JSON object",
		           name);
		goto fail;
	}
	/* The round of the current version, locked: while it is open its
	 * batch and step are still to come. */
	char cv[24];
	snprintf(cv, sizeof cv, "%lld", current);
	const char *rp[2] = { id, cv };
	r = admin_exec(ctx, "SELECT state FROM round WHERE project_id = $1 AND version = $2 FOR UPDATE", 2,
	               rp, &eb);
	if (!r) {
		json_decref(config);
		goto fail;
	}
	bool open = PQntuples(r) == 0 || strcmp(PQgetvalue(r, 0, 0), "open") == 0;
	char state[32];
	snprintf(state, sizeof state, "%s", PQntuples(r) ? PQgetvalue(r, 0, 0) : "open");
	PQclear(r);
	/* The earliest version the change may take: the current one while its
	 * round is open, except for a local-mode project's optimizer, which its
	 * peers took with the round's first work units (client/compute.c). */
	const char *mode = json_string_value(json_object_get(config, "mode"));
	bool local_opt = mode && strcmp(mode, "local") == 0 && json_object_get(change, "optimizer");
	long long earliest = open && !local_opt ? current : current + 1;
	if (at < 0)
		at = earliest;
	if (at < earliest) {
		json_decref(config);
		cot_seterr(&eb, COT_ERR_CONFLICT, "cannot change project \"%.80s\" from version %lld: %s",
		           name, at,
		           at < current ? "that version is in the past"
		           : local_opt  ? "its peers' inner steps of that version have begun"
		                        : "its round is no longer open");
		cot_sethint(&eb,
		            "The project is at version %lld, whose round is %s; give --at %lld or later, "
		            "or leave --at out.",
		            current, state, earliest);
		goto fail;
	}
	char stamp[32];
	time_t now = time(NULL);
	struct tm tm;
	strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
	json_object_set_new(change, "version", json_integer(at));
	json_object_set_new(change, "at", json_string(stamp));
	json_t *changes = json_object_get(config, "changes");
	if (!changes) {
		changes = json_array();
		json_object_set_new(config, "changes", changes);
	}
	json_array_append(changes, change);
	char *text = json_dumps(config, JSON_COMPACT | JSON_REAL_PRECISION(17));
	json_decref(config);
	char *normalized = NULL;
	pf_project pf;
	if (!text) {
		cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
		goto fail;
	}
	cot_err rc = pf_parse(text, strlen(text), &pf, &normalized, &eb);
	free(text);
	if (rc) {
		char msg[sizeof eb.msg];
		snprintf(msg, sizeof msg, "%s", eb.msg);
		cot_seterr(&eb, rc, "cannot change project \"%.80s\": %s", name, msg);
		goto fail;
	}
	pf_free(&pf);
	const char *up[2] = { id, normalized };
	r = admin_exec(ctx, "UPDATE project SET config = $2::jsonb WHERE id = $1", 2, up, &eb);
	free(normalized);
	if (!r)
		goto fail;
	PQclear(r);
	const char *ip[1] = { id };
	if (!(r = admin_exec(ctx, "SELECT project_apply_settings($1)", 1, ip, &eb)))
		goto fail;
	PQclear(r);
	if (admin_commit(ctx, &eb)) {
		admin_fail(&eb);
		goto out;
	}
	if (json) {
		json_t *o = json_pack("{s:s, s:I, s:I, s:O}", "project", name, "version", (json_int_t)at,
		                      "current_version", (json_int_t)current, "change", change);
		char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
		if (s)
			printf("%s\n", s);
		free(s);
		json_decref(o);
	} else {
		json_object_del(change, "version");
		json_object_del(change, "at");
		char *s = json_dumps(change, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
		printf("project \"%s\": from version %lld (now at %lld): %s\n", name, at, current,
		       s ? s : "");
		free(s);
	}
	ret = ADMIN_OK;
	goto out;
fail:
	admin_rollback(ctx);
	admin_fail(&eb);
out:
	json_decref(change);
	return ret;
}
