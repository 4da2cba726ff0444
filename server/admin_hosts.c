/* cotrain-admin host: merging the hosts of one machine (BOINC's "merge
 * hosts").  The work is db/functions/hosts.sql's host_merge, which checks
 * the ids and moves credit, pending checks and finished units in one
 * transaction. */
#include "server/admin.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

static const char usage[] = "usage: cotrain-admin host merge OLD NEW\n"
                            "\n"
                            "merge folds host OLD into host NEW, both of one account: OLD's credit,\n"
                            "pending credit and spot checks, check record and finished work units\n"
                            "move to NEW, and OLD is revoked.  Use it for a machine that registered\n"
                            "twice (a client from before machine ids, or a reinstall that lost its\n"
                            "state folder).\n";

static int merge_cmd(admin_ctx *ctx, const char *old_s, const char *new_s)
{
	long long o, n;
	if (!admin_parse_ll(old_s, 1, (1LL << 62), &o))
		return admin_usage(usage, "host merge: OLD must be a host id, not \"%s\"", old_s);
	if (!admin_parse_ll(new_s, 1, (1LL << 62), &n))
		return admin_usage(usage, "host merge: NEW must be a host id, not \"%s\"", new_s);
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	cot_errbuf eb = { "", "" };
	const char *p[2] = { old_s, new_s };
	PGresult *r = admin_exec(ctx, "SELECT host_merge($1, $2)::text", 2, p, &eb);
	if (!r)
		return admin_fail(&eb);
	json_t *j = json_loads(PQgetvalue(r, 0, 0), 0, NULL);
	PQclear(r);
	json_int_t moved = 0, kept = 0, pending = 0, checks = 0, units = 0;
	if (!j || json_unpack(j, "{s:I, s:I, s:I, s:I, s:I}", "grants_moved", &moved, "grants_kept", &kept,
	                      "pending_moved", &pending, "checks_moved", &checks, "units_moved", &units)) {
		json_decref(j);
		return admin_failf("host_merge gave an answer of an unexpected shape");
	}
	json_decref(j);
	printf("host %lld merged into host %lld: %lld grants moved (%lld pending), %lld kept, "
	       "%lld spot checks, %lld work units\n",
	       o, n, (long long)moved, (long long)pending, (long long)kept, (long long)checks,
	       (long long)units);
	return ADMIN_OK;
}

int admin_host_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "host: no command given");
	if (strcmp(argv[1], "merge") == 0) {
		if (argc != 4)
			return admin_usage(usage, "host merge: give OLD and NEW host ids");
		return merge_cmd(ctx, argv[2], argv[3]);
	}
	return admin_usage(usage, "host: unknown command \"%s\"", argv[1]);
}
