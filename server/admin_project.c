/* cotrain-admin project: create a project from a project file, list and
 * show them, pause and resume them (project.active: sched_assign refuses
 * work for a paused project).
 *
 * update is in admin_project_update.c.
 *
 * create checks the file (server/project_file.c), then, in one transaction,
 * the things only the database knows: the dataset exists, its tokenizer
 * fits the model's vocabulary, it holds at least one microbatch; and
 * inserts the project and its model version 0, whose checkpoint (the model
 * initialised from the project's seed, kernels/checkpoint.h) is stored in
 * the file store first.
 *
 * The training stream: sample j of an epoch is tokens
 * [j*seq_len, j*seq_len + seq_len + 1) of the dataset (inputs and the next
 * tokens as targets), so an epoch has floor((n_tokens - 1) / seq_len)
 * samples and mb_per_epoch = that / microbatch_size whole microbatches.
 * Only the training part counts: a dataset's held-out part, its last
 * heldout_tokens tokens, is never in an epoch (doc/dataset.md), so
 * n_tokens here is the dataset's n_tokens - heldout_tokens. */
#include "server/admin.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "kernels/checkpoint.h"
#include "kernels/model.h"
#include "server/project_file.h"
#include "server/project_tokenizer.h"
#include "shared/common/filestore.h"

static const char usage[] = "usage: cotrain-admin project create FILE\n"
                            "       cotrain-admin project list [--json]\n"
                            "       cotrain-admin project show [--json] NAME\n"
                            "       cotrain-admin project pause NAME | project resume NAME\n"
                            "       cotrain-admin project delete [--force] NAME\n"
                            "       cotrain-admin project update [--json] [--at VERSION] NAME "
                            "SETTING=VALUE...\n"
                            "\n"
                            "create reads a project file (JSON, see doc/project-file.md; \"-\" reads\n"
                            "standard input), checks it against its dataset and creates the project with\n"
                            "its model version 0.  show prints one project, its config and its round.\n"
                            "pause stops handing out work for the project (clients are told it is not\n"
                            "active); resume starts it again.  delete removes the project with its rounds,\n"
                            "work units, model versions, spot checks and credit ledger; the credit it\n"
                            "granted stays in the hosts', accounts' and teams' totals, its pending credit\n"
                            "is never granted, and its checkpoints go at the next collection (files gc).\n"
                            "It is refused while hosts hold live work units of the project or a round\n"
                            "is closing or averaging, unless --force.  update changes hyperparameters\n"
                            "from a model version on (project update --help lists them).\n";

/* Read a whole file of at most max bytes into a malloc'd, NUL-terminated
 * buffer. */
static cot_err read_file(const char *path, size_t max, char **out, size_t *len, cot_errbuf *eb)
{
	int fd = strcmp(path, "-") == 0 ? 0 : open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not open project file \"%s\": %s", path,
		                  strerror(errno));
	char *buf = malloc(max + 2);
	size_t n = 0;
	cot_err rc = buf ? COT_OK : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	while (!rc && n <= max) {
		ssize_t k = read(fd, buf + n, max + 1 - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			rc = cot_seterr(eb, COT_ERR_IO, "could not read project file \"%s\": %s", path,
			                strerror(errno));
		else if (k == 0)
			break;
		else
			n += (size_t)k;
	}
	if (fd != 0)
		close(fd);
	if (!rc && n > max)
		rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "project file \"%s\" is larger than %zu bytes", path,
		                max);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return COT_OK;
}

static void to_kern_config(const pf_model *m, kern_config *c) { *c = *m; }

/* Initialise the model from the project's seed and store it as the
 * version-0 checkpoint; its name goes to sha. */
static cot_err write_checkpoint(admin_ctx *ctx, const kern_config *cfg, uint64_t seed,
                                char sha[FS_SHA_HEX_LEN + 1], uint64_t *size, cot_errbuf *eb)
{
	kern_model *m = NULL;
	cot_err rc = kern_model_create(cfg, 0, &m, eb);
	if (rc)
		return rc;
	kern_model_init(m, seed);
	char tmpdir[600], path[700];
	snprintf(tmpdir, sizeof tmpdir, "%s/tmp", ctx->store_dir);
	snprintf(path, sizeof path, "%s/checkpoint-XXXXXX", tmpdir);
	if ((mkdir(ctx->store_dir, 0755) != 0 && errno != EEXIST) ||
	    (mkdir(tmpdir, 0755) != 0 && errno != EEXIST)) {
		kern_model_free(m);
		return cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", tmpdir,
		                  strerror(errno));
	}
	int fd = mkstemp(path);
	if (fd < 0) {
		kern_model_free(m);
		return cot_seterr(eb, COT_ERR_IO, "could not create file in \"%s\": %s", tmpdir,
		                  strerror(errno));
	}
	close(fd);
	rc = ckpt_save(m, path, eb);
	kern_model_free(m);
	if (!rc)
		rc = fs_put_file(ctx->store_dir, path, sha, size, eb);
	unlink(path);
	return rc;
}

/* An encoder on subword ids: its special ids from the dataset's tokenizer
 * (the model bytes at sha in the store, checked), and *normalized written
 * again with them (the old text freed).  cot_err as ptok_special_ids, and
 * the store's. */
static cot_err subword_special_ids(admin_ctx *ctx, pf_project *p, const char *sha, char **normalized,
                                   cot_errbuf *eb)
{
	spm_model *tok = NULL;
	cot_err rc = admin_tokenizer_load(ctx, sha, &tok, eb);
	if (!rc)
		rc = ptok_special_ids(p, tok, eb);
	spm_free(tok);
	if (rc)
		return rc;
	char *text = pf_normalize(p);
	if (!text)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the project's config");
	free(*normalized);
	*normalized = text;
	return COT_OK;
}

static int create_cmd(admin_ctx *ctx, int argc, char **argv)
{
	if (argc != 2)
		return admin_usage(usage, "project create: give exactly one project FILE");
	cot_errbuf eb = { "", "" };
	char *text = NULL, *normalized = NULL;
	size_t len = 0;
	pf_project p;
	if (read_file(argv[1], PF_MAX_BYTES, &text, &len, &eb))
		return admin_fail(&eb);
	cot_err rc = pf_parse(text, len, &p, &normalized, &eb);
	free(text);
	if (rc)
		return admin_fail(&eb);
	int ret = ADMIN_FAIL;
	kern_config cfg;
	to_kern_config(&p.model, &cfg);
	if (kern_config_validate(&cfg, &eb)) { /* pf_parse checks the same bounds */
		admin_failf("field \"model\" is not a valid model: %s", eb.msg);
		goto out;
	}
	if (admin_connect(ctx, true))
		goto out;
	if (admin_begin(ctx, &eb)) {
		admin_fail(&eb);
		goto out;
	}

	const char *dp[1] = { p.dataset };
	PGresult *r = admin_exec(ctx,
	                         "SELECT id, n_tokens - heldout_tokens, tokenizer, heldout_tokens, vocab,"
	                         "       coalesce(tokenizer_sha256, '')"
	                         "  FROM dataset WHERE name = $1 FOR SHARE",
	                         1, dp, &eb);
	if (!r) {
		admin_fail(&eb);
		goto rollback;
	}
	if (PQntuples(r) == 0) {
		PQclear(r);
		cot_seterr(&eb, COT_ERR_NOT_FOUND,
		           "field \"dataset\" names dataset \"%s\", which does not exist", p.dataset);
		cot_sethint(&eb, "Import it first: cotrain-admin dataset import %s PATH...", p.dataset);
		admin_fail(&eb);
		goto rollback;
	}
	char dataset_id[32];
	snprintf(dataset_id, sizeof dataset_id, "%s", PQgetvalue(r, 0, 0));
	long long n_tokens = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
	int byte_tok = strcmp(PQgetvalue(r, 0, 2), "byte") == 0;
	long long heldout = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
	int vocab = atoi(PQgetvalue(r, 0, 4));
	char tok_type[16], tok_sha[FS_SHA_HEX_LEN + 1];
	snprintf(tok_type, sizeof tok_type, "%s", PQgetvalue(r, 0, 2));
	snprintf(tok_sha, sizeof tok_sha, "%s", PQgetvalue(r, 0, 5));
	PQclear(r);
	if (byte_tok && p.subword) {
		cot_seterr(&eb, COT_ERR_INVALID,
		           "field \"tokenizer\" is \"dataset\", but dataset \"%s\" was imported with the "
		           "byte tokenizer",
		           p.dataset);
		cot_sethint(&eb, "Give \"tokenizer\": \"byte\", or import the text with --tokenizer.");
		admin_fail(&eb);
		goto rollback;
	}
	if (!byte_tok && !p.subword) {
		cot_seterr(&eb, COT_ERR_INVALID,
		           "dataset \"%s\" holds %s token ids, but field \"tokenizer\" is \"byte\"",
		           p.dataset, tok_type);
		cot_sethint(&eb, "Give \"tokenizer\": \"dataset\" and \"model.vocab\": %d.", vocab);
		admin_fail(&eb);
		goto rollback;
	}
	/* an encoder adds its four special tokens after the 256 bytes */
	if (byte_tok && p.model.arch != KERN_ARCH_GPT)
		vocab = 256 + 4;
	if (p.model.vocab != vocab) {
		admin_failf("field \"model.vocab\" must be %d for dataset \"%s\", whose tokenizer is "
		            "\"%s\"",
		            vocab, p.dataset, tok_type);
		goto rollback;
	}
	if (byte_tok && p.model.arch != KERN_ARCH_GPT && p.model.unk_id != -1) {
		admin_failf("field \"model.unk_id\" must be -1 for dataset \"%s\": the byte tokenizer has "
		            "no unknown token",
		            p.dataset);
		goto rollback;
	}
	if (byte_tok && p.model.arch != KERN_ARCH_GPT &&
	    (p.model.cls_id < 256 || p.model.sep_id < 256 || p.model.mask_id < 256 || p.model.pad_id < 256)) {
		admin_failf("the special token ids of field \"model\" must lie in 256..259 for dataset "
		            "\"%s\", whose tokenizer is \"byte\"",
		            p.dataset);
		goto rollback;
	}
	if (p.subword && p.model.arch != KERN_ARCH_GPT) {
		if (subword_special_ids(ctx, &p, tok_sha, &normalized, &eb)) {
			admin_fail(&eb);
			goto rollback;
		}
		to_kern_config(&p.model, &cfg);
	}
	long long samples = (n_tokens - 1) / p.model.seq_len;
	long long mb_per_epoch = samples / p.microbatch_size;
	if (n_tokens < 1 || mb_per_epoch < 1) {
		cot_seterr(&eb, COT_ERR_INVALID,
		           "dataset \"%s\" holds %lld tokens, too few for one microbatch of field "
		           "\"microbatch_size\" (%d) samples of field \"model.seq_len\" (%d) tokens",
		           p.dataset, n_tokens, p.microbatch_size, p.model.seq_len);
		cot_sethint(&eb,
		            "A microbatch needs microbatch_size * seq_len + 1 = %lld tokens; import more "
		            "text or make them smaller.",
		            (long long)p.microbatch_size * p.model.seq_len + 1);
		admin_fail(&eb);
		goto rollback;
	}

	/* The held-out sample: the first eval_sequences sequences of seq_len + 1
	 * tokens of the held-out part (server/heldout_eval.h). */
	long long eval_seq = heldout > 0 ? (heldout - 1) / p.model.seq_len : 0;
	if (eval_seq > p.eval_sequences)
		eval_seq = p.eval_sequences;
	if (heldout > 0 && eval_seq < 1 && p.eval_every > 0) {
		cot_seterr(&eb, COT_ERR_INVALID,
		           "the held-out part of dataset \"%s\" (%lld tokens) is too small for one sequence "
		           "of "
		           "field \"model.seq_len\" (%d) tokens",
		           p.dataset, heldout, p.model.seq_len);
		cot_sethint(&eb, "Set field \"eval_every\" to 0 (no held-out evaluation), or import the "
		                 "dataset again with a larger --heldout-fraction.");
		admin_fail(&eb);
		goto rollback;
	}

	const char *np[1] = { p.name };
	if (!(r = admin_exec(ctx, "SELECT 1 FROM project WHERE name = $1", 1, np, &eb))) {
		admin_fail(&eb);
		goto rollback;
	}
	bool taken = PQntuples(r) > 0;
	PQclear(r);
	if (taken) {
		admin_failf("project \"%s\" already exists", p.name);
		goto rollback;
	}

	/* The initial checkpoint goes to the store before any row refers to it. */
	char ckpt[FS_SHA_HEX_LEN + 1], ckpt_size[32];
	uint64_t csize = 0;
	if (write_checkpoint(ctx, &cfg, (uint64_t)p.seed, ckpt, &csize, &eb)) {
		admin_fail(&eb);
		goto rollback;
	}
	snprintf(ckpt_size, sizeof ckpt_size, "%" PRIu64, csize);
	const char *fp[2] = { ckpt, ckpt_size };
	if (!(r = admin_exec(ctx,
	                     "INSERT INTO file (sha256, size, kind) VALUES ($1, $2, 'checkpoint')"
	                     " ON CONFLICT (sha256) DO NOTHING",
	                     2, fp, &eb))) {
		admin_fail(&eb);
		goto rollback;
	}
	PQclear(r);

	char seq_len[16], mb[16], tb[16], mbe[32], seed[32], flops[64], wus[16];
	snprintf(seq_len, sizeof seq_len, "%d", p.model.seq_len);
	snprintf(mb, sizeof mb, "%d", p.microbatch_size);
	snprintf(tb, sizeof tb, "%d", p.target_batch);
	snprintf(mbe, sizeof mbe, "%lld", mb_per_epoch);
	snprintf(seed, sizeof seed, "%" PRId64, p.seed);
	snprintf(flops, sizeof flops, "%.17g", kern_flops_per_sample(&cfg));
	snprintf(wus, sizeof wus, "%d", p.work_unit_seconds);
	const char *pp[12] = { p.name,     p.title,    p.description ? p.description : "",
		               normalized, dataset_id, seq_len,
		               mb,         tb,         mbe,
		               seed,       flops,      wus };
	r = admin_exec(ctx,
	               "INSERT INTO project (name, title, description, config, dataset_id, seq_len,"
	               "                     microbatch_size, target_batch, mb_per_epoch, seed,"
	               "                     flops_per_sample, wu_seconds)"
	               " VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11, $12)"
	               " ON CONFLICT (name) DO NOTHING RETURNING id",
	               12, pp, &eb);
	if (!r) {
		admin_fail(&eb);
		goto rollback;
	}
	if (PQntuples(r) == 0) {
		PQclear(r);
		admin_failf("project \"%s\" already exists", p.name);
		goto rollback;
	}
	char project_id[32];
	snprintf(project_id, sizeof project_id, "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	const char *vp[2] = { project_id, ckpt };
	if (!(r = admin_exec(ctx,
	                     "INSERT INTO model_version (project_id, version, checkpoint_sha256)"
	                     " VALUES ($1, 0, $2)",
	                     2, vp, &eb))) {
		admin_fail(&eb);
		goto rollback;
	}
	PQclear(r);
	/* The file's spot-check policy ("validation"), when it names one. */
	if (!(r = admin_exec(ctx, "SELECT project_apply_settings($1)", 1, vp, &eb))) {
		admin_fail(&eb);
		goto rollback;
	}
	PQclear(r);
	if (admin_commit(ctx, &eb)) {
		admin_fail(&eb);
		goto rollback;
	}
	printf("created project \"%s\" (id %s) on dataset \"%s\"\n", p.name, project_id, p.dataset);
	printf("%zu parameters; %lld microbatches of %d samples per epoch; %d samples per step; %.3g FLOPs "
	       "per sample\n",
	       kern_param_count(&cfg), mb_per_epoch, p.microbatch_size, p.target_batch,
	       kern_flops_per_sample(&cfg));
	printf("version 0 checkpoint %s\n", ckpt);
	if (p.eval_every > 0 && eval_seq > 0)
		printf("held-out evaluation: every %d version%s on %lld sequences (%lld tokens) of the %lld "
		       "held-out tokens\n",
		       p.eval_every, p.eval_every == 1 ? "" : "s", eval_seq, eval_seq * p.model.seq_len,
		       heldout);
	else
		printf("held-out evaluation: off (%s)\n",
		       heldout > 0 ? "eval_every is 0" : "the dataset has no held-out part");
	ret = ADMIN_OK;
	goto out;
rollback:
	admin_rollback(ctx);
out:
	free(normalized);
	pf_free(&p);
	return ret;
}

/* The JSON of one project (one row, one column), for list and show. */
#define PROJECT_JSON \
	"jsonb_build_object('name', p.name, 'title', p.title, 'description', p.description," \
	" 'dataset', d.name, 'active', p.active, 'current_version', p.current_version," \
	" 'target_batch', p.target_batch, 'microbatch_size', p.microbatch_size," \
	" 'mb_per_epoch', p.mb_per_epoch, 'frontier', p.frontier, 'seed', p.seed," \
	" 'work_unit_seconds', p.wu_seconds, 'flops_per_sample', p.flops_per_sample," \
	" 'created_at', p.created_at, 'config', p.config," \
	" 'round', (SELECT jsonb_build_object('version', r.version, 'state', r.state, 'attempt', r.attempt," \
	"                                    'loss', r.loss)" \
	"             FROM round r WHERE r.project_id = p.id AND r.version = p.current_version))"

/* Take a leading --json off argv (argc, argv as the command's); returns
 * whether it was there. */
static bool take_json(int *argc, char ***argv)
{
	for (int i = 1; i < *argc; i++)
		if (strcmp((*argv)[i], "--json") == 0) {
			for (int j = i; j + 1 < *argc; j++)
				(*argv)[j] = (*argv)[j + 1];
			(*argc)--;
			return true;
		}
	return false;
}

/* An argument that looks like an option and is not one we take. */
static int bad_option(int argc, char **argv, const char *cmd)
{
	for (int i = 1; i < argc; i++)
		if (argv[i][0] == '-' && argv[i][1])
			return admin_usage(usage, "project %s: unknown option \"%.40s\"", cmd, argv[i]);
	return ADMIN_OK;
}

static int list_cmd(admin_ctx *ctx, int argc, char **argv)
{
	bool json = take_json(&argc, &argv);
	if (bad_option(argc, argv, "list"))
		return ADMIN_USAGE;
	if (argc > 1)
		return admin_usage(usage, "project list: unexpected argument \"%.80s\"", argv[1]);
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	if (json) {
		PGresult *r = admin_exec(ctx,
		                         "SELECT coalesce(jsonb_agg(" PROJECT_JSON " ORDER BY p.name), '[]')"
		                         "  FROM project p JOIN dataset d ON d.id = p.dataset_id",
		                         0, NULL, &eb);
		if (!r)
			return admin_fail(&eb);
		printf("%s\n", PQgetvalue(r, 0, 0));
		PQclear(r);
		return ADMIN_OK;
	}
	PGresult *r =
	        admin_exec(ctx,
	                   "SELECT p.name, d.name, p.current_version, p.target_batch, p.microbatch_size,"
	                   "       p.mb_per_epoch, p.frontier, CASE WHEN p.active THEN 'yes' ELSE 'no' END, "
	                   "p.title"
	                   "  FROM project p JOIN dataset d ON d.id = p.dataset_id ORDER BY p.name",
	                   0, NULL, &eb);
	if (!r)
		return admin_fail(&eb);
	printf("%-20s %-20s %7s %8s %6s %12s %12s %-6s %s\n", "NAME", "DATASET", "VERSION", "BATCH", "MB",
	       "MB/EPOCH", "FRONTIER", "ACTIVE", "TITLE");
	for (int i = 0; i < PQntuples(r); i++)
		printf("%-20s %-20s %7s %8s %6s %12s %12s %-6s %s\n", PQgetvalue(r, i, 0),
		       PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3), PQgetvalue(r, i, 4),
		       PQgetvalue(r, i, 5), PQgetvalue(r, i, 6), PQgetvalue(r, i, 7), PQgetvalue(r, i, 8));
	PQclear(r);
	return ADMIN_OK;
}

static int no_project(const char *name)
{
	cot_errbuf eb = { "", "" };
	cot_seterr(&eb, COT_ERR_NOT_FOUND, "project \"%.80s\" does not exist", name);
	cot_sethint(&eb, "cotrain-admin project list shows the projects.");
	return admin_fail(&eb);
}

static int show_cmd(admin_ctx *ctx, int argc, char **argv)
{
	bool json = take_json(&argc, &argv);
	if (bad_option(argc, argv, "show"))
		return ADMIN_USAGE;
	if (argc != 2)
		return admin_usage(usage, "project show: give exactly one project NAME");
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	const char *np[1] = { argv[1] };
	PGresult *r = admin_exec(ctx,
	                         "SELECT " PROJECT_JSON ", jsonb_pretty(p.config)"
	                         "  FROM project p JOIN dataset d ON d.id = p.dataset_id WHERE p.name = $1",
	                         1, np, &eb);
	if (!r)
		return admin_fail(&eb);
	if (PQntuples(r) == 0) {
		PQclear(r);
		return no_project(argv[1]);
	}
	if (json) {
		printf("%s\n", PQgetvalue(r, 0, 0));
		PQclear(r);
		return ADMIN_OK;
	}
	json_error_t je;
	json_t *j = json_loads(PQgetvalue(r, 0, 0), 0, &je);
	if (!j) {
		PQclear(r);
		return admin_failf("could not read the project's JSON: %s", je.text);
	}
	static const char *const keys[] = { "name",
		                            "title",
		                            "dataset",
		                            "active",
		                            "current_version",
		                            "target_batch",
		                            "microbatch_size",
		                            "mb_per_epoch",
		                            "frontier",
		                            "seed",
		                            "work_unit_seconds",
		                            "flops_per_sample",
		                            "created_at",
		                            NULL };
	for (int i = 0; keys[i]; i++) {
		char *v = json_dumps(json_object_get(j, keys[i]), JSON_ENCODE_ANY);
		const char *sv = json_string_value(json_object_get(j, keys[i]));
		printf("%-18s %s\n", keys[i], sv ? sv : v ? v : "");
		free(v);
	}
	json_t *rd = json_object_get(j, "round");
	if (json_is_object(rd)) {
		json_t *loss = json_object_get(rd, "loss");
		printf("%-18s version %lld, %s, attempt %lld", "round",
		       (long long)json_integer_value(json_object_get(rd, "version")),
		       json_string_value(json_object_get(rd, "state")),
		       (long long)json_integer_value(json_object_get(rd, "attempt")));
		if (json_is_number(loss))
			printf(", loss %.4f", json_number_value(loss));
		putchar('\n');
	}
	const char *desc = json_string_value(json_object_get(j, "description"));
	if (desc && *desc)
		printf("%-18s %s\n", "description", desc);
	printf("config\n%s\n", PQgetvalue(r, 0, 1));
	json_decref(j);
	PQclear(r);
	return ADMIN_OK;
}

/* pause (active = false) or resume (true). */
static int set_active_cmd(admin_ctx *ctx, int argc, char **argv, bool active)
{
	const char *cmd = active ? "resume" : "pause";
	if (bad_option(argc, argv, cmd))
		return ADMIN_USAGE;
	if (argc != 2)
		return admin_usage(usage, "project %s: give exactly one project NAME", cmd);
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	const char *pp[2] = { argv[1], active ? "true" : "false" };
	PGresult *r = admin_exec(ctx,
	                         "UPDATE project p SET active = $2::boolean"
	                         "  FROM (SELECT id, active AS was FROM project WHERE name = $1 FOR UPDATE) o"
	                         " WHERE p.id = o.id RETURNING o.was",
	                         2, pp, &eb);
	if (!r)
		return admin_fail(&eb);
	if (PQntuples(r) == 0) {
		PQclear(r);
		return no_project(argv[1]);
	}
	bool was = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	if (was == active)
		printf("project \"%s\" is already %s\n", argv[1], active ? "active" : "paused");
	else if (active)
		printf("resumed project \"%s\": clients get work again\n", argv[1]);
	else
		printf("paused project \"%s\": no new work is handed out until \"project resume\"\n",
		       argv[1]);
	return ADMIN_OK;
}

/* delete [--force] NAME: one transaction, the project's row locked first
 * (a work request in flight waits for it, then finds no project). */
static int delete_cmd(admin_ctx *ctx, int argc, char **argv)
{
	bool force = false;
	const char *name = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--force") == 0)
			force = true;
		else if (argv[i][0] == '-')
			return admin_usage(usage, "project delete: unknown option \"%s\"", argv[i]);
		else if (name)
			return admin_usage(usage, "project delete: give exactly one project NAME");
		else
			name = argv[i];
	}
	if (!name)
		return admin_usage(usage, "project delete: give exactly one project NAME");
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true) || admin_begin(ctx, &eb))
		return eb.msg[0] ? admin_fail(&eb) : ADMIN_FAIL;
	const char *pp[1] = { name };
	PGresult *r = admin_exec(ctx,
	                         "SELECT p.id,"
	                         "       (SELECT count(*) FROM work_unit w WHERE w.project_id = p.id AND "
	                         "w.state = 'live'),"
	                         "       (SELECT count(DISTINCT w.host_id) FROM work_unit w"
	                         "         WHERE w.project_id = p.id AND w.state = 'live'),"
	                         "       (SELECT count(*) FROM round r WHERE r.project_id = p.id"
	                         "           AND r.state IN ('closing', 'averaging')),"
	                         "       (SELECT count(*) FROM model_version v WHERE v.project_id = p.id),"
	                         "       (SELECT count(*) FROM round r WHERE r.project_id = p.id AND r.state "
	                         "= 'committed'),"
	                         "       (SELECT count(*) FROM credit_grant g WHERE g.project_id = p.id AND "
	                         "g.status = 'pending')"
	                         "  FROM project p WHERE p.name = $1 FOR UPDATE",
	                         1, pp, &eb);
	if (!r) {
		admin_rollback(ctx);
		return admin_fail(&eb);
	}
	if (PQntuples(r) == 0) {
		PQclear(r);
		admin_rollback(ctx);
		return no_project(name);
	}
	long long live = atoll(PQgetvalue(r, 0, 1)), hosts = atoll(PQgetvalue(r, 0, 2)),
	          busy = atoll(PQgetvalue(r, 0, 3)), versions = atoll(PQgetvalue(r, 0, 4)),
	          rounds = atoll(PQgetvalue(r, 0, 5)), pending = atoll(PQgetvalue(r, 0, 6));
	char id[32];
	snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	if ((live || busy) && !force) {
		admin_rollback(ctx);
		fprintf(stderr,
		        "cotrain-admin: error: cannot delete project \"%s\": %lld hosts hold %lld live work "
		        "units and %lld rounds are closing or averaging\n"
		        "cotrain-admin: hint: Pause it (project pause %s) and delete it once its work has "
		        "ended, or give --force.\n",
		        name, hosts, live, busy, name);
		return ADMIN_FAIL;
	}
	const char *ip[1] = { id };
	if (!(r = admin_exec(ctx, "DELETE FROM project WHERE id = $1", 1, ip, &eb))) {
		admin_rollback(ctx);
		return admin_fail(&eb);
	}
	PQclear(r);
	if (admin_commit(ctx, &eb))
		return admin_fail(&eb);
	printf("deleted project \"%s\": %lld model versions, %lld committed rounds, %lld live work units "
	       "(%lld pending credit grants never granted); its checkpoints go at the next files gc\n",
	       name, versions, rounds, live, pending);
	return ADMIN_OK;
}

int admin_project_main(admin_ctx *ctx, int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "update") == 0)
		return admin_project_update(ctx, argc - 1, argv + 1);
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "project: no command given");
	if (strcmp(argv[1], "create") == 0)
		return create_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(argv[1], "list") == 0)
		return list_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(argv[1], "show") == 0)
		return show_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(argv[1], "pause") == 0)
		return set_active_cmd(ctx, argc - 1, argv + 1, false);
	if (strcmp(argv[1], "resume") == 0)
		return set_active_cmd(ctx, argc - 1, argv + 1, true);
	if (strcmp(argv[1], "delete") == 0)
		return delete_cmd(ctx, argc - 1, argv + 1);
	return admin_usage(usage, "project: unknown command \"%s\"", argv[1]);
}
