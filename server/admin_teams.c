/* cotrain-admin team: teams and their members.  Team names are unique
 * without regard to case (the schema's team_name_key). */
#include "server/admin.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
        "usage: cotrain-admin team create [--description TEXT] [--founder EMAIL] NAME\n"
        "       cotrain-admin team list\n"
        "       cotrain-admin team add TEAM EMAIL...    make accounts members of TEAM\n"
        "       cotrain-admin team remove EMAIL...      take accounts out of their team\n"
        "       cotrain-admin team delete TEAM          delete a team (members stay, teamless)\n";

static bool text_ok(const char *s, size_t min, size_t max)
{
	size_t n = strlen(s);
	if (n < min || n > max)
		return false;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if (*p < ' ' && *p != '\n' && *p != '\t')
			return false;
	return true;
}

static int create_cmd(admin_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "description", required_argument, NULL, 'd' },
		{ "founder", required_argument, NULL, 'f' },
		{ NULL, 0, NULL, 0 },
	};
	const char *desc = "", *founder = NULL;
	int c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'd')
			desc = optarg;
		else if (c == 'f')
			founder = optarg;
		else
			return admin_usage(usage, "team create: bad option");
	}
	if (argc - optind != 1)
		return admin_usage(usage, "team create: give one team NAME");
	const char *name = argv[optind];
	if (!text_ok(name, 1, 100) || strchr(name, '\n'))
		return admin_failf("team name must be 1 to 100 printable characters");
	if (!text_ok(desc, 0, 4000))
		return admin_failf("team description must be at most 4000 printable characters");

	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	if (admin_begin(ctx, &eb))
		return admin_fail(&eb);
	char founder_id[32] = "";
	PGresult *r;
	if (founder) {
		const char *fp[1] = { founder };
		if (!(r = admin_exec(ctx, "SELECT id FROM account WHERE lower(email) = lower($1)", 1, fp,
		                     &eb)))
			goto fail;
		if (PQntuples(r) == 1)
			snprintf(founder_id, sizeof founder_id, "%s", PQgetvalue(r, 0, 0));
		PQclear(r);
		if (!founder_id[0]) {
			cot_seterr(&eb, COT_ERR_NOT_FOUND, "account \"%s\" does not exist", founder);
			goto fail;
		}
	}
	const char *p[3] = { name, desc, founder ? founder_id : NULL };
	r = admin_exec(ctx,
	               "INSERT INTO team (name, description, founder_id) VALUES ($1, $2, $3)"
	               " ON CONFLICT (lower(name)) DO NOTHING RETURNING id",
	               3, p, &eb);
	if (!r)
		goto fail;
	if (PQntuples(r) == 0) {
		PQclear(r);
		cot_seterr(&eb, COT_ERR_EXISTS, "team \"%s\" already exists", name);
		goto fail;
	}
	char id[32];
	snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	if (founder) { /* the founder joins the team */
		const char *up[2] = { founder_id, id };
		if (!(r = admin_exec(ctx, "UPDATE account SET team_id = $2 WHERE id = $1", 2, up, &eb)))
			goto fail;
		PQclear(r);
	}
	if (admin_commit(ctx, &eb))
		goto fail;
	printf("created team %s \"%s\"\n", id, name);
	return ADMIN_OK;
fail:
	admin_rollback(ctx);
	return admin_fail(&eb);
}

static int list_cmd(admin_ctx *ctx, int argc, char **argv)
{
	if (argc > 1)
		return admin_usage(usage, "team list: unexpected argument \"%s\"", argv[1]);
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	PGresult *r =
	        admin_exec(ctx,
	                   "SELECT t.id, t.name, (SELECT count(*) FROM account a WHERE a.team_id = t.id),"
	                   "       coalesce(f.email, '-'), to_char(t.created_at, 'YYYY-MM-DD HH24:MI')"
	                   "  FROM team t LEFT JOIN account f ON f.id = t.founder_id ORDER BY lower(t.name)",
	                   0, NULL, &eb);
	if (!r)
		return admin_fail(&eb);
	printf("%-6s %-30s %7s %-30s %s\n", "ID", "NAME", "MEMBERS", "FOUNDER", "CREATED");
	for (int i = 0; i < PQntuples(r); i++)
		printf("%-6s %-30s %7s %-30s %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
		       PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), PQgetvalue(r, i, 4));
	PQclear(r);
	return ADMIN_OK;
}

/* Set (team != NULL) or clear the team of every account in emails, all or
 * nothing. */
static int members_cmd(admin_ctx *ctx, const char *team, int n, char **emails)
{
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	if (admin_begin(ctx, &eb))
		return admin_fail(&eb);
	char team_id[32] = "";
	PGresult *r;
	if (team) {
		const char *tp[1] = { team };
		if (!(r = admin_exec(ctx, "SELECT id FROM team WHERE lower(name) = lower($1)", 1, tp, &eb)))
			goto fail;
		if (PQntuples(r) == 1)
			snprintf(team_id, sizeof team_id, "%s", PQgetvalue(r, 0, 0));
		PQclear(r);
		if (!team_id[0]) {
			cot_seterr(&eb, COT_ERR_NOT_FOUND, "team \"%s\" does not exist", team);
			goto fail;
		}
	}
	for (int i = 0; i < n; i++) {
		const char *p[2] = { emails[i], team ? team_id : NULL };
		if (!(r = admin_exec(ctx, "UPDATE account SET team_id = $2 WHERE lower(email) = lower($1)", 2,
		                     p, &eb)))
			goto fail;
		int changed = atoi(PQcmdTuples(r));
		PQclear(r);
		if (changed == 0) {
			cot_seterr(&eb, COT_ERR_NOT_FOUND, "account \"%s\" does not exist", emails[i]);
			goto fail;
		}
	}
	if (admin_commit(ctx, &eb))
		goto fail;
	for (int i = 0; i < n; i++)
		printf(team ? "account <%s> joined team \"%s\"\n" : "account <%s> left its team\n", emails[i],
		       team);
	return ADMIN_OK;
fail:
	admin_rollback(ctx);
	return admin_fail(&eb);
}

static int delete_cmd(admin_ctx *ctx, const char *team)
{
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	const char *p[1] = { team };
	PGresult *r = admin_exec(ctx, "DELETE FROM team WHERE lower(name) = lower($1)", 1, p, &eb);
	if (!r)
		return admin_fail(&eb);
	int n = atoi(PQcmdTuples(r));
	PQclear(r);
	if (n == 0)
		return admin_failf("team \"%s\" does not exist", team);
	printf("deleted team \"%s\"\n", team);
	return ADMIN_OK;
}

int admin_team_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "team: no command given");
	const char *cmd = argv[1];
	if (strcmp(cmd, "create") == 0)
		return create_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(cmd, "list") == 0)
		return list_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(cmd, "add") == 0) {
		if (argc < 4)
			return admin_usage(usage, "team add: give a TEAM and at least one EMAIL");
		return members_cmd(ctx, argv[2], argc - 3, argv + 3);
	}
	if (strcmp(cmd, "remove") == 0) {
		if (argc < 3)
			return admin_usage(usage, "team remove: give at least one EMAIL");
		return members_cmd(ctx, NULL, argc - 2, argv + 2);
	}
	if (strcmp(cmd, "delete") == 0) {
		if (argc != 3)
			return admin_usage(usage, "team delete: give one TEAM");
		return delete_cmd(ctx, argv[2]);
	}
	return admin_usage(usage, "team: unknown command \"%s\"", cmd);
}
