/* cotrain-admin user: accounts.
 *
 * Passwords are stored with shared/password (PBKDF2-HMAC-SHA256) and account
 * keys as in the server (server/api_accounts.c): 32 random bytes in
 * base64url, of which only the sha256 is stored, one account_key row per key,
 * revocable. */
#include "server/admin.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/hash.h"
#include "shared/database/password.h"

#define KEY_BYTES 32
#define KEY_CHARS 48
#define PASSWORD_MIN_LEN 8

static const char usage[] =
        "usage: cotrain-admin user create [--admin] [--team TEAM] [--password-stdin] [--no-key]\n"
        "                                 EMAIL NAME\n"
        "       cotrain-admin user list\n"
        "       cotrain-admin user disable EMAIL\n"
        "       cotrain-admin user enable EMAIL\n"
        "       cotrain-admin user set-admin EMAIL yes|no\n"
        "       cotrain-admin user key EMAIL\n"
        "\n"
        "create makes an account and prints a fresh account key to hand to the\n"
        "volunteer (cotrain-client attaches with it).  --password-stdin reads the\n"
        "password (8 bytes or more) from the first line of standard input; without\n"
        "it the account gets a random password nobody knows, and logs in by key.\n"
        "disable refuses the account's keys and log-ins until enable.  key issues\n"
        "another account key.\n";

/* A valid-looking address: 3..254 bytes, one '@' not at either end, no
 * spaces or control characters. */
static bool email_ok(const char *e)
{
	size_t n = strlen(e);
	const char *at = strchr(e, '@');
	if (n < 3 || n > 254 || !at || at == e || at == e + n - 1 || strchr(at + 1, '@'))
		return false;
	for (const unsigned char *p = (const unsigned char *)e; *p; p++)
		if (*p <= ' ' || *p == 0x7f)
			return false;
	return true;
}

static bool name_ok(const char *s)
{
	size_t n = strlen(s);
	if (n < 1 || n > 100)
		return false;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if (*p < ' ' || *p == 0x7f)
			return false;
	return true;
}

/* Draw a key and insert its hash for account id; the key goes to key. */
static cot_err new_key(admin_ctx *ctx, const char *id, char key[KEY_CHARS], cot_errbuf *eb)
{
	unsigned char md[HASH_SHA256_LEN];
	char hp[2 + 2 * HASH_SHA256_LEN + 1] = "\\x";
	if (hash_random_token(KEY_BYTES, key, KEY_CHARS) || hash_sha256(key, strlen(key), md))
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not draw a random account key");
	hash_hex(md, sizeof md, hp + 2);
	const char *p[2] = { id, hp };
	PGresult *r = admin_exec(ctx, "INSERT INTO account_key (account_id, key_hash) VALUES ($1, $2::bytea)",
	                         2, p, eb);
	if (!r)
		return COT_ERR_DB;
	PQclear(r);
	return COT_OK;
}

/* Read one line of password from stdin into buf (without the newline). */
static cot_err read_password(char *buf, size_t len, cot_errbuf *eb)
{
	if (!fgets(buf, (int)len, stdin))
		return cot_seterr(eb, COT_ERR_INVALID, "no password on standard input");
	size_t n = strcspn(buf, "\r\n");
	if (buf[n] == '\0' && n == len - 1)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "password is longer than %d bytes",
		                  PASSWORD_MAX_LEN);
	buf[n] = '\0';
	if (n < PASSWORD_MIN_LEN)
		return cot_seterr(eb, COT_ERR_INVALID, "password must be at least %d bytes long",
		                  PASSWORD_MIN_LEN);
	return COT_OK;
}

static int create_cmd(admin_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "admin", no_argument, NULL, 'a' },
		{ "team", required_argument, NULL, 't' },
		{ "password-stdin", no_argument, NULL, 'p' },
		{ "no-key", no_argument, NULL, 'n' },
		{ NULL, 0, NULL, 0 },
	};
	bool admin = false, pw_stdin = false, want_key = true;
	const char *team = NULL;
	int c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'a':
			admin = true;
			break;
		case 't':
			team = optarg;
			break;
		case 'p':
			pw_stdin = true;
			break;
		case 'n':
			want_key = false;
			break;
		default:
			return admin_usage(usage, "user create: bad option");
		}
	}
	if (argc - optind != 2)
		return admin_usage(usage, "user create: give an EMAIL and a NAME");
	const char *email = argv[optind], *name = argv[optind + 1];
	if (!email_ok(email))
		return admin_failf("\"%.300s\" is not a valid email address", email);
	if (!name_ok(name))
		return admin_failf("account name must be 1 to 100 printable characters");

	cot_errbuf eb = { "", "" };
	static char password[PASSWORD_MAX_LEN + 2];
	if (pw_stdin) {
		if (read_password(password, sizeof password, &eb))
			return admin_fail(&eb);
	} else if (hash_random_token(32, password, sizeof password)) {
		return admin_failf("could not draw a random password");
	}
	char phash[PASSWORD_HASH_MAX], cpid[33];
	unsigned char cpid_raw[16];
	if (password_hash(password, PASSWORD_DEFAULT_ITERATIONS, phash, sizeof phash, &eb))
		return admin_fail(&eb);
	memset(password, 0, sizeof password);
	if (hash_random(cpid_raw, sizeof cpid_raw))
		return admin_failf("could not draw a random cross-project id");
	hash_hex(cpid_raw, sizeof cpid_raw, cpid);

	if (admin_connect(ctx, true) || admin_begin(ctx, &eb))
		return eb.msg[0] ? admin_fail(&eb) : ADMIN_FAIL;
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
			cot_sethint(&eb, "Create it with: cotrain-admin team create NAME");
			goto fail;
		}
	}
	const char *ap[6] = { email, name, phash, cpid, admin ? "true" : "false", team ? team_id : NULL };
	r = admin_exec(ctx,
	               "INSERT INTO account (email, name, password_hash, cross_project_id, is_admin, team_id)"
	               " VALUES ($1, $2, $3, $4, $5, $6)"
	               " ON CONFLICT (lower(email)) DO NOTHING RETURNING id",
	               6, ap, &eb);
	if (!r)
		goto fail;
	if (PQntuples(r) == 0) {
		PQclear(r);
		cot_seterr(&eb, COT_ERR_EXISTS, "an account with email address \"%s\" already exists", email);
		goto fail;
	}
	char id[32], key[KEY_CHARS] = "";
	snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	if (want_key && new_key(ctx, id, key, &eb))
		goto fail;
	if (admin_commit(ctx, &eb))
		goto fail;
	printf("created account %s <%s>%s%s%s\n", id, email, admin ? ", administrator" : "",
	       team ? ", team " : "", team ? team : "");
	if (want_key)
		printf("account key: %s\n", key);
	return ADMIN_OK;
fail:
	admin_rollback(ctx);
	return admin_fail(&eb);
}

static int list_cmd(admin_ctx *ctx, int argc, char **argv)
{
	if (argc > 1)
		return admin_usage(usage, "user list: unexpected argument \"%s\"", argv[1]);
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	PGresult *r =
	        admin_exec(ctx,
	                   "SELECT a.id, a.email, a.name, coalesce(t.name, '-'),"
	                   "       CASE WHEN a.is_admin THEN 'yes' ELSE 'no' END,"
	                   "       CASE WHEN a.disabled THEN 'yes' ELSE 'no' END,"
	                   "       (SELECT count(*) FROM account_key k WHERE k.account_id = a.id AND NOT "
	                   "k.revoked),"
	                   "       (SELECT count(*) FROM host h WHERE h.account_id = a.id AND NOT h.revoked),"
	                   "       to_char(a.created_at, 'YYYY-MM-DD HH24:MI')"
	                   "  FROM account a LEFT JOIN team t ON t.id = a.team_id ORDER BY a.id",
	                   0, NULL, &eb);
	if (!r)
		return admin_fail(&eb);
	printf("%-6s %-30s %-20s %-16s %-5s %-8s %4s %5s %s\n", "ID", "EMAIL", "NAME", "TEAM", "ADMIN",
	       "DISABLED", "KEYS", "HOSTS", "CREATED");
	for (int i = 0; i < PQntuples(r); i++)
		printf("%-6s %-30s %-20s %-16s %-5s %-8s %4s %5s %s\n", PQgetvalue(r, i, 0),
		       PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), PQgetvalue(r, i, 4),
		       PQgetvalue(r, i, 5), PQgetvalue(r, i, 6), PQgetvalue(r, i, 7), PQgetvalue(r, i, 8));
	PQclear(r);
	return ADMIN_OK;
}

/* UPDATE one account by email; reports a missing account. */
static int update_cmd(admin_ctx *ctx, const char *sql, const char *email, const char *value, const char *done)
{
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	const char *p[2] = { email, value };
	PGresult *r = admin_exec(ctx, sql, value ? 2 : 1, p, &eb);
	if (!r)
		return admin_fail(&eb);
	int n = atoi(PQcmdTuples(r));
	PQclear(r);
	if (n == 0)
		return admin_failf("account \"%s\" does not exist", email);
	printf("account <%s> %s\n", email, done);
	return ADMIN_OK;
}

static int key_cmd(admin_ctx *ctx, const char *email)
{
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	const char *p[1] = { email };
	PGresult *r =
	        admin_exec(ctx, "SELECT id, disabled FROM account WHERE lower(email) = lower($1)", 1, p, &eb);
	if (!r)
		return admin_fail(&eb);
	if (PQntuples(r) == 0) {
		PQclear(r);
		return admin_failf("account \"%s\" does not exist", email);
	}
	char id[32], key[KEY_CHARS];
	snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
	bool disabled = PQgetvalue(r, 0, 1)[0] == 't';
	PQclear(r);
	if (disabled) {
		cot_seterr(&eb, COT_ERR_CONFLICT, "account \"%s\" is disabled", email);
		cot_sethint(&eb, "Enable it first: cotrain-admin user enable %s", email);
		return admin_fail(&eb);
	}
	if (new_key(ctx, id, key, &eb))
		return admin_fail(&eb);
	printf("account key: %s\n", key);
	return ADMIN_OK;
}

int admin_user_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "user: no command given");
	const char *cmd = argv[1];
	if (strcmp(cmd, "create") == 0)
		return create_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(cmd, "list") == 0)
		return list_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(cmd, "disable") == 0 || strcmp(cmd, "enable") == 0 || strcmp(cmd, "key") == 0) {
		if (argc != 3)
			return admin_usage(usage, "user %s: give one EMAIL", cmd);
		if (strcmp(cmd, "key") == 0)
			return key_cmd(ctx, argv[2]);
		bool dis = strcmp(cmd, "disable") == 0;
		return update_cmd(ctx,
		                  dis ? "UPDATE account SET disabled = true WHERE lower(email) = lower($1)"
		                      : "UPDATE account SET disabled = false WHERE lower(email) = lower($1)",
		                  argv[2], NULL, dis ? "disabled" : "enabled");
	}
	if (strcmp(cmd, "set-admin") == 0) {
		if (argc != 4 || (strcmp(argv[3], "yes") && strcmp(argv[3], "no")))
			return admin_usage(usage, "user set-admin: give an EMAIL and yes or no");
		bool yes = strcmp(argv[3], "yes") == 0;
		return update_cmd(ctx, "UPDATE account SET is_admin = $2 WHERE lower(email) = lower($1)",
		                  argv[2], yes ? "true" : "false",
		                  yes ? "is an administrator" : "is no longer an administrator");
	}
	return admin_usage(usage, "user: unknown command \"%s\"", cmd);
}
