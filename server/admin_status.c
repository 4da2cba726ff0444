/* cotrain-admin status: one screen on the state of the server: projects and
 * their versions, their training (committed rounds, latest loss, held-out
 * bits per byte, or an encoder's held-out masked-LM loss and accuracy), credit granted and pending, open spot checks, the bytes
 * of the file store, the microbatch pool and frontier, datasets, live work
 * units, hosts (with the class the NAT service gave each), accounts and
 * teams. */
#include "server/admin.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] = "usage: cotrain-admin status [--work-units N] [--hosts N]\n"
                            "\n"
                            "Shows the schema version, every project (version, checkpoint, frontier,\n"
                            "microbatches in the pool, live work units), its training (rounds committed,\n"
                            "the latest round's loss, the latest held-out bits per byte and its version,\n"
                            "the evaluation's mean CPU seconds per version, an encoder's held-out\n"
                            "masked-LM loss and accuracy), its credit granted and\n"
                            "pending, open spot checks, stored checkpoints and their bytes, pinned\n"
                            "versions, the file store's size, the datasets (tokens, of\n"
                            "them held out), the hosts (how\n"
                            "many of each NAT class), accounts and teams, the N most recently seen\n"
                            "hosts with their class, mapping, public endpoint and relayed bytes\n"
                            "(--hosts, default 20), and the N most recent live work units\n"
                            "(--work-units, default 20).\n";

/* Run a query without parameters and print its rows under a header with
 * the given printf formats (one %s per column). */
static int table(admin_ctx *ctx, const char *title, bool count, const char *sql, const char *const *heads,
                 const int *widths, int ncols)
{
	cot_errbuf eb = { "", "" };
	PGresult *r = admin_exec(ctx, sql, 0, NULL, &eb);
	if (!r)
		return admin_fail(&eb);
	if (count)
		printf("\n%s (%d)\n", title, PQntuples(r));
	else
		printf("\n%s\n", title);
	if (PQntuples(r) > 0) {
		printf(" ");
		for (int c = 0; c < ncols; c++)
			printf(" %-*s", c + 1 < ncols ? widths[c] : 0, heads[c]);
		printf("\n");
		for (int i = 0; i < PQntuples(r); i++) {
			printf(" ");
			for (int c = 0; c < ncols; c++)
				printf(" %-*s", c + 1 < ncols ? widths[c] : 0,
				       PQgetisnull(r, i, c) ? "-" : PQgetvalue(r, i, c));
			printf("\n");
		}
	}
	PQclear(r);
	return ADMIN_OK;
}

/* The bytes of every stored file under the store (indexed or not). */
static unsigned long long store_bytes(const char *store)
{
	unsigned long long total = 0;
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < 256; i++) {
		char dir[700];
		snprintf(dir, sizeof dir, "%s/%c%c", store, hex[i >> 4], hex[i & 15]);
		DIR *d = opendir(dir);
		if (!d)
			continue;
		struct dirent *e;
		while ((e = readdir(d))) {
			struct stat st;
			if (e->d_name[0] != '.' &&
			    fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    S_ISREG(st.st_mode))
				total += (unsigned long long)st.st_size;
		}
		closedir(d);
	}
	return total;
}

int admin_status_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	long long n_wu = 20, n_hosts = 20;
	for (int i = 1; i < argc; i += 2) {
		bool wu = strcmp(argv[i], "--work-units") == 0;
		if (!wu && strcmp(argv[i], "--hosts") != 0)
			return admin_usage(usage, "status: unexpected argument \"%s\"", argv[i]);
		if (i + 1 >= argc || !admin_parse_ll(argv[i + 1], 0, 10000, wu ? &n_wu : &n_hosts))
			return admin_usage(usage, "status: %s must be an integer from 0 to 10000", argv[i]);
	}
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	int v = db_schema_version(ctx->db, &eb);
	printf("schema version %d (up to date)\n", v);

	static const char *const ph[] = { "NAME",     "DATASET", "VERSION", "CHECKPOINT", "FRONTIER",
		                          "MB/EPOCH", "POOL",    "POOL_MB", "LIVE_WU",    "ACTIVE" };
	static const int pw[] = { 20, 16, 7, 12, 10, 10, 5, 9, 7, 6 };
	if (table(ctx, "projects", true,
	          "SELECT p.name, d.name, p.current_version,"
	          "       left(v.checkpoint_sha256, 12),"
	          "       p.frontier, p.mb_per_epoch,"
	          "       (SELECT count(*) FROM mb_pool m WHERE m.project_id = p.id),"
	          "       (SELECT coalesce(sum(hi - lo), 0) FROM mb_pool m WHERE m.project_id = p.id),"
	          "       (SELECT count(*) FROM work_unit w WHERE w.project_id = p.id AND w.state = 'live'),"
	          "       CASE WHEN p.active THEN 'yes' ELSE 'no' END"
	          "  FROM project p JOIN dataset d ON d.id = p.dataset_id"
	          "  LEFT JOIN model_version v ON v.project_id = p.id AND v.version = p.current_version"
	          " ORDER BY p.name",
	          ph, pw, 10))
		return ADMIN_FAIL;

	/* HELDOUT_BPB for a GPT, MLM_LOSS and MLM_ACCURACY for an encoder */
	static const char *const th[] = { "PROJECT",         "ROUNDS",     "LATEST_LOSS", "HELDOUT_BPB",
		                          "HELDOUT_VERSION", "EVAL_CPU_S", "MLM_LOSS",    "MLM_ACCURACY" };
	static const int tw[] = { 20, 7, 11, 11, 15, 10, 8, 12 };
	if (table(ctx, "training", true,
	          "SELECT p.name,"
	          "       (SELECT count(*) FROM round r WHERE r.project_id = p.id AND r.state = 'committed'),"
	          "       (SELECT round(r.loss::numeric, 4) FROM round r"
	          "         WHERE r.project_id = p.id AND r.state = 'committed' AND r.loss IS NOT NULL"
	          "         ORDER BY r.version DESC LIMIT 1),"
	          "       round(h.heldout_bpb::numeric, 4), coalesce(h.version, m.version),"
	          "       (SELECT round(avg(v.heldout_cpu_seconds)::numeric, 3) FROM model_version v"
	          "         WHERE v.project_id = p.id"
	          "           AND (v.heldout_bpb IS NOT NULL OR v.heldout_mlm_loss IS NOT NULL)),"
	          "       round(m.heldout_mlm_loss::numeric, 4), round(m.heldout_mlm_accuracy::numeric, 4)"
	          "  FROM project p LEFT JOIN LATERAL heldout_latest(p.id) h ON true"
	          "  LEFT JOIN LATERAL heldout_mlm_latest(p.id) m ON true"
	          " ORDER BY p.name",
	          th, tw, 8))
		return ADMIN_FAIL;

	static const char *const ch[] = { "PROJECT",     "CREDIT_GRANTED",   "CREDIT_PENDING", "OPEN_CHECKS",
		                          "CHECKPOINTS", "CHECKPOINT_BYTES", "PINNED" };
	static const int cw[] = { 20, 14, 14, 11, 11, 16, 6 };
	if (table(ctx, "credit, spot checks and stored checkpoints", true,
	          "SELECT p.name,"
	          "       to_char(coalesce((SELECT sum(g.credit) FROM credit_grant g"
	          "         WHERE g.project_id = p.id AND g.status = 'granted'), 0), 'FM999999999990.00'),"
	          "       to_char(coalesce((SELECT sum(g.credit) FROM credit_grant g"
	          "         WHERE g.project_id = p.id AND g.status = 'pending'), 0), 'FM999999999990.00'),"
	          "       (SELECT count(*) FROM spot_check c WHERE c.project_id = p.id AND c.state = 'open'),"
	          "       (SELECT count(*) FROM model_version v"
	          "         WHERE v.project_id = p.id AND v.checkpoint_sha256 IS NOT NULL),"
	          "       file_project_bytes(p.id),"
	          "       (SELECT count(*) FROM model_version v WHERE v.project_id = p.id AND v.pinned)"
	          "  FROM project p ORDER BY p.name",
	          ch, cw, 7))
		return ADMIN_FAIL;

	static const char *const fh[] = { "FILES", "BYTES", "SHARDS_MANIFESTS", "CHECKPOINTS", "ON_DISK" };
	static const int fw[] = { 7, 14, 16, 14, 14 };
	char fsql[512];
	snprintf(fsql, sizeof fsql,
	         "SELECT count(*), coalesce(sum(size), 0),"
	         "       coalesce(sum(size) FILTER (WHERE kind IN ('shard', 'manifest')), 0),"
	         "       coalesce(sum(size) FILTER (WHERE kind = 'checkpoint'), 0), %llu::bigint FROM file",
	         store_bytes(ctx->store_dir));
	if (table(ctx, "file store (indexed files; on disk: everything under the store)", false, fsql, fh, fw,
	          5))
		return ADMIN_FAIL;

	static const char *const vh[] = { "PROJECT", "VERSIONS", "FIRST", "LATEST", "LATEST_AT" };
	static const int vw[] = { 20, 8, 5, 6, 16 };
	if (table(ctx, "model versions", true,
	          "SELECT p.name, count(*), min(v.version), max(v.version),"
	          "       to_char(max(v.created_at), 'YYYY-MM-DD HH24:MI')"
	          "  FROM model_version v JOIN project p ON p.id = v.project_id"
	          " GROUP BY p.name ORDER BY p.name",
	          vh, vw, 5))
		return ADMIN_FAIL;

	static const char *const dh[] = { "NAME", "TOKENIZER", "TOKENS", "HELDOUT", "SHARDS", "PROJECTS" };
	static const int dw[] = { 20, 9, 14, 12, 7, 8 };
	if (table(ctx, "datasets", true,
	          "SELECT d.name, d.tokenizer, d.n_tokens, d.heldout_tokens,"
	          "       (SELECT count(*) FROM shard s WHERE s.dataset_id = d.id),"
	          "       (SELECT count(*) FROM project p WHERE p.dataset_id = d.id)"
	          "  FROM dataset d ORDER BY d.name",
	          dh, dw, 6))
		return ADMIN_FAIL;

	static const char *const hh[] = { "HOSTS",  "SEEN_1H", "SEEN_24H", "REVOKED", "GFLOPS",
		                          "PUBLIC", "MAPPED",  "NAT",      "UNKNOWN" };
	static const int hw[] = { 6, 7, 8, 7, 10, 6, 6, 6, 7 };
	if (table(ctx, "hosts", false,
	          "SELECT count(*), count(*) FILTER (WHERE last_seen > now() - interval '1 hour'),"
	          "       count(*) FILTER (WHERE last_seen > now() - interval '24 hours'),"
	          "       count(*) FILTER (WHERE revoked),"
	          "       to_char(coalesce(sum(flops) FILTER (WHERE NOT revoked"
	          "                AND last_seen > now() - interval '24 hours'), 0) / 1e9, 'FM999999990.0'),"
	          "       count(*) FILTER (WHERE nat_class = 'public'),"
	          "       count(*) FILTER (WHERE nat_class = 'mapped'),"
	          "       count(*) FILTER (WHERE nat_class = 'nat'),"
	          "       count(*) FILTER (WHERE coalesce(nat_class, 'unknown') = 'unknown')"
	          "  FROM host",
	          hh, hw, 9))
		return ADMIN_FAIL;

	static const char *const nh[] = { "ID",        "ACCOUNT",         "LAST_SEEN",    "CLASS",
		                          "MAPPING",   "PUBLIC_ENDPOINT", "OBSERVED",     "RELAY_IN",
		                          "RELAY_OUT", "PUNCH_FAILS",     "PAIRS_RELAYED" };
	static const int nw[] = { 8, 8, 16, 7, 11, 47, 16, 10, 10, 11, 13 };
	char hsql[1280];
	snprintf(hsql, sizeof hsql,
	         "SELECT h.id, h.account_id, to_char(h.last_seen, 'YYYY-MM-DD HH24:MI'),"
	         "       coalesce(h.nat_class, 'unknown'), coalesce(h.nat_mapping, 'unknown'),"
	         "       CASE WHEN strpos(h.nat_public_addr, ':') > 0"
	         "            THEN '[' || h.nat_public_addr || ']:' || h.nat_public_port"
	         "            ELSE h.nat_public_addr || ':' || h.nat_public_port END,"
	         "       to_char(h.nat_observed_at, 'YYYY-MM-DD HH24:MI'),"
	         "       h.relay_bytes_in, h.relay_bytes_out,"
	         /* plans from history (doc/nat.md): the host's failed punches in
	          * a row, and its pairs the NAT service now relays at once */
	         "       (y.j->>'failed_punches'),"
	         "       (SELECT count(*) FROM jsonb_array_elements(y.j->'pairs') e"
	         "         WHERE (e->>'skipped')::boolean AND e->>'rung' = 'punch')"
	         "  FROM host h CROSS JOIN LATERAL (SELECT host_nat_history_json(h.id) AS j) y"
	         " WHERE NOT h.revoked ORDER BY h.last_seen DESC, h.id DESC LIMIT %lld",
	         n_hosts);
	if (table(ctx, "hosts seen most recently", true, hsql, nh, nw, 11))
		return ADMIN_FAIL;

	static const char *const ah[] = { "ACCOUNTS", "ADMINS", "DISABLED", "TEAMS" };
	static const int aw[] = { 8, 6, 8, 5 };
	if (table(ctx, "accounts", false,
	          "SELECT count(*), count(*) FILTER (WHERE is_admin), count(*) FILTER (WHERE disabled),"
	          "       (SELECT count(*) FROM team) FROM account",
	          ah, aw, 4))
		return ADMIN_FAIL;

	static const char *const wh[] = { "ID",    "PROJECT", "HOST",      "VERSION",
		                          "RANGE", "DONE",    "SAMPLES/S", "DEADLINE" };
	static const int ww[] = { 8, 20, 6, 7, 21, 6, 9, 19 };
	char sql[1024];
	snprintf(sql, sizeof sql,
	         "SELECT w.id, p.name, w.host_id, w.version, w.lo || '-' || w.hi, w.mb_done,"
	         "       round(w.samples_per_sec::numeric, 1),"
	         "       to_char(w.deadline, 'YYYY-MM-DD HH24:MI:SS')"
	         "  FROM work_unit w JOIN project p ON p.id = w.project_id"
	         " WHERE w.state = 'live' ORDER BY w.id DESC LIMIT %lld",
	         n_wu);
	return table(ctx, "live work units (most recent first)", true, sql, wh, ww, 8);
}
