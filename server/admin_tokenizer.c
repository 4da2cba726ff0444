/* cotrain-admin dataset tokenizer: train a subword tokenizer on a dataset's
 * text, and export it in Hugging Face's layout.
 *
 * Training reads the training part of a byte dataset back from its shards
 * (server/dataset_text.h; the held-out part is left out, so evaluation stays
 * honest), trains SentencePiece on it (kernels/spm.h), stores the model in
 * the file store under its sha256, then records in ONE transaction the
 * `file` row, the `tokenizer` row (which pins the file against the
 * collector) and dataset.trained_tokenizer.  Any error before the commit
 * changes nothing in the database; a model already stored stays as
 * unreferenced garbage. */
#include "server/admin.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kernels/hf_tokenizer.h"
#include "kernels/spm.h"
#include "server/dataset_text.h"
#include "shared/common/shard.h"

#define SPECIAL_DEFAULT "[CLS],[SEP],[MASK],[PAD],[UNK]"
#define NORMALIZE_DEFAULT "nfkc"

static const char usage[] =
        "usage: cotrain-admin dataset tokenizer train DATASET --type unigram|bpe --vocab N\n"
        "                     [--normalize nfkc,lowercase,keep-accents] [--special LIST]\n"
        "       cotrain-admin dataset tokenizer export DATASET DIR\n"
        "\n"
        "train trains a SentencePiece tokenizer of N pieces (special tokens included) on\n"
        "the training part of DATASET, a dataset imported as text (its first 512 MiB at\n"
        "most), stores it in the file store and records it on DATASET; `dataset import\n"
        "--tokenizer DATASET` then encodes text with it.  --normalize: nfkc (the\n"
        "default), nfkc,lowercase, or none; accents are always kept.  --special: the\n"
        "special tokens, comma-separated (default " SPECIAL_DEFAULT "); [UNK] is the\n"
        "unknown piece and [PAD] the padding piece.  The same text and options give the\n"
        "same tokenizer, byte for byte.\n"
        "\n"
        "export writes DATASET's tokenizer (the one its shards are encoded with, else the\n"
        "one trained on it) into the folder DIR as tokenizer.json (Hugging Face\n"
        "tokenizers), tokenizer_config.json and spiece.model.  See doc/dataset.md.\n";

typedef struct {
	char id[24];
	char tokenizer[16];
	char tokenizer_sha[FS_SHA_HEX_LEN + 1];
	char trained_sha[FS_SHA_HEX_LEN + 1];
	uint64_t n_tokens, heldout;
} dataset_row;

/* Look dataset `name` up; false (reported) when it cannot be read or does
 * not exist. */
static bool find_dataset(admin_ctx *ctx, const char *name, dataset_row *d)
{
	cot_errbuf eb = { "", "" };
	const char *p[1] = { name };
	PGresult *r = admin_exec(ctx,
	                         "SELECT id, tokenizer, coalesce(tokenizer_sha256, ''),"
	                         "       coalesce(trained_tokenizer, ''), n_tokens, heldout_tokens"
	                         "  FROM dataset WHERE name = $1",
	                         1, p, &eb);
	if (!r) {
		admin_fail(&eb);
		return false;
	}
	if (PQntuples(r) == 0) {
		PQclear(r);
		admin_failf("dataset \"%s\" does not exist", name);
		return false;
	}
	snprintf(d->id, sizeof d->id, "%s", PQgetvalue(r, 0, 0));
	snprintf(d->tokenizer, sizeof d->tokenizer, "%s", PQgetvalue(r, 0, 1));
	snprintf(d->tokenizer_sha, sizeof d->tokenizer_sha, "%s", PQgetvalue(r, 0, 2));
	snprintf(d->trained_sha, sizeof d->trained_sha, "%s", PQgetvalue(r, 0, 3));
	d->n_tokens = strtoull(PQgetvalue(r, 0, 4), NULL, 10);
	d->heldout = strtoull(PQgetvalue(r, 0, 5), NULL, 10);
	PQclear(r);
	return true;
}

/* The training part's text (at most DT_TEXT_MAX bytes) of byte dataset d. */
static cot_err read_text(admin_ctx *ctx, const char *name, const dataset_row *d, char **text, size_t *len,
                         cot_errbuf *eb)
{
	uint64_t limit = d->n_tokens - d->heldout;
	if (limit > DT_TEXT_MAX)
		limit = DT_TEXT_MAX;
	char lim[32];
	snprintf(lim, sizeof lim, "%" PRIu64, limit);
	const char *p[2] = { d->id, lim };
	PGresult *r = admin_exec(ctx,
	                         "SELECT first_token, n_tokens, sha256 FROM shard"
	                         " WHERE dataset_id = $1 AND first_token < $2 ORDER BY first_token",
	                         2, p, eb);
	if (!r)
		return COT_ERR_DB;
	size_t n = (size_t)PQntuples(r);
	dt_shard *s = calloc(n ? n : 1, sizeof *s);
	if (!s) {
		PQclear(r);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		s[i].first_token = strtoull(PQgetvalue(r, (int)i, 0), NULL, 10);
		s[i].n_tokens = strtoull(PQgetvalue(r, (int)i, 1), NULL, 10);
		snprintf(s[i].sha256, sizeof s[i].sha256, "%s", PQgetvalue(r, (int)i, 2));
	}
	PQclear(r);
	cot_err rc = dt_read_text(ctx->store_dir, name, s, n, limit, text, len, eb);
	free(s);
	return rc;
}

static cot_err record(admin_ctx *ctx, const dataset_row *d, const char *sha, uint64_t size, const char *type,
                      int vocab, const char *normalize, const char *special, cot_errbuf *eb)
{
	cot_err rc = admin_begin(ctx, eb);
	if (rc)
		return rc;
	char sz[32], voc[16];
	snprintf(sz, sizeof sz, "%" PRIu64, size);
	snprintf(voc, sizeof voc, "%d", vocab);
	const char *fp[2] = { sha, sz };
	const char *tp[5] = { sha, type, voc, normalize, special };
	const char *dp[2] = { d->id, sha };
	PGresult *r;
	if (!(r = admin_exec(ctx,
	                     "INSERT INTO file (sha256, size, kind) VALUES ($1, $2, 'tokenizer')"
	                     " ON CONFLICT (sha256) DO NOTHING",
	                     2, fp, eb)))
		goto fail;
	PQclear(r);
	if (!(r = admin_exec(ctx,
	                     "INSERT INTO tokenizer (sha256, type, vocab, normalize, special)"
	                     " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (sha256) DO NOTHING",
	                     5, tp, eb)))
		goto fail;
	PQclear(r);
	if (!(r = admin_exec(ctx, "UPDATE dataset SET trained_tokenizer = $2 WHERE id = $1", 2, dp, eb)))
		goto fail;
	PQclear(r);
	if (admin_commit(ctx, eb) == COT_OK)
		return COT_OK;
fail:
	admin_rollback(ctx);
	return COT_ERR_DB;
}

static int train_cmd(admin_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "type", required_argument, NULL, 't' },
		{ "vocab", required_argument, NULL, 'v' },
		{ "normalize", required_argument, NULL, 'n' },
		{ "special", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	const char *type = NULL, *normalize = NORMALIZE_DEFAULT, *special = SPECIAL_DEFAULT;
	long long vocab = 0;
	int c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 't')
			type = optarg;
		else if (c == 'v') {
			if (!admin_parse_ll(optarg, SPM_VOCAB_MIN, SPM_VOCAB_MAX, &vocab))
				return admin_usage(usage,
				                   "dataset tokenizer train: --vocab must be an integer from "
				                   "%d to %d",
				                   SPM_VOCAB_MIN, SPM_VOCAB_MAX);
		} else if (c == 'n')
			normalize = optarg;
		else if (c == 's')
			special = optarg;
		else
			return admin_usage(usage, "dataset tokenizer train: bad option");
	}
	if (argc - optind != 1)
		return admin_usage(usage, "dataset tokenizer train: give one DATASET");
	if (!type || (strcmp(type, "unigram") && strcmp(type, "bpe")))
		return admin_usage(usage, "dataset tokenizer train: --type must be unigram or bpe");
	if (!vocab)
		return admin_usage(usage, "dataset tokenizer train: give --vocab");
	const char *name = argv[optind];
	cot_errbuf eb = { "", "" };
	unsigned flags;
	const char *sp[SPM_SPECIAL_MAX];
	int n_special;
	if (strlen(special) > (SPM_SPECIAL_LEN_MAX + 1) * SPM_SPECIAL_MAX)
		return admin_failf("the list of special tokens is too long: at most %d tokens of %d bytes",
		                   SPM_SPECIAL_MAX, SPM_SPECIAL_LEN_MAX);
	char *special_buf = malloc(strlen(special) + 1);
	if (!special_buf)
		return admin_failf("out of memory");
	if (spm_parse_normalize(normalize, &flags, &eb) ||
	    spm_parse_special(special, special_buf, sp, &n_special, &eb)) {
		free(special_buf);
		return admin_fail(&eb);
	}
	if (!shard_name_valid(name)) {
		free(special_buf);
		return admin_failf("invalid dataset name \"%.80s\"", name);
	}
	if (admin_connect(ctx, true)) {
		free(special_buf);
		return ADMIN_FAIL;
	}
	dataset_row d;
	if (!find_dataset(ctx, name, &d)) {
		free(special_buf);
		return ADMIN_FAIL;
	}
	if (strcmp(d.tokenizer, "byte") != 0) {
		free(special_buf);
		cot_seterr(&eb, COT_ERR_INVALID,
		           "cannot train a tokenizer on dataset \"%s\": its shards hold %s token ids, not "
		           "text",
		           name, d.tokenizer);
		cot_sethint(&eb, "Train on the text dataset it was encoded from.");
		return admin_fail(&eb);
	}
	char *text = NULL;
	size_t len = 0;
	if (read_text(ctx, name, &d, &text, &len, &eb)) {
		free(special_buf);
		return admin_fail(&eb);
	}
	spm_train_opts o = { .type = strcmp(type, "bpe") == 0 ? SPM_BPE : SPM_UNIGRAM,
		             .vocab = (int)vocab,
		             .normalize = flags,
		             .special = sp,
		             .n_special = n_special };
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	unsigned char *model = NULL;
	size_t model_len = 0;
	cot_err rc = spm_train(text, len, &o, &model, &model_len, &eb);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	free(text);
	if (rc) {
		free(special_buf);
		if (!eb.hint[0])
			cot_sethint(&eb, "Nothing was recorded.");
		return admin_fail(&eb);
	}
	char sha[FS_SHA_HEX_LEN + 1];
	uint64_t size = 0;
	/* Record the options as given, normalised: the flags spelt in a fixed
	 * order, so one model has one description. */
	char norm[64];
	snprintf(norm, sizeof norm, "%s%s%s", (flags & SPM_NORM_NFKC) ? "nfkc" : "none",
	         (flags & SPM_NORM_LOWERCASE) ? ",lowercase" : "",
	         (flags & SPM_NORM_KEEP_ACCENTS) ? ",keep-accents" : "");
	rc = fs_put_buffer(ctx->store_dir, model, model_len, sha, &size, &eb);
	spm_model *m = NULL;
	if (!rc)
		rc = spm_load(model, model_len, &m, &eb);
	free(model);
	if (!rc)
		rc = record(ctx, &d, sha, size, type, (int)vocab, norm, special, &eb);
	if (rc) {
		spm_free(m);
		free(special_buf);
		return admin_fail(&eb);
	}
	printf("trained a %s tokenizer of %d pieces on dataset \"%s\" (%zu bytes of text) in %.1f s\n", type,
	       spm_vocab_size(m), name, len,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	printf("tokenizer %s\n", sha);
	for (int i = 0; i < n_special; i++)
		printf("%s%s %d", i ? ", " : "special: ", sp[i], spm_piece_id(m, sp[i]));
	if (n_special)
		printf("\n");
	spm_free(m);
	free(special_buf);
	return ADMIN_OK;
}

static int export_cmd(admin_ctx *ctx, int argc, char **argv)
{
	if (argc != 3)
		return admin_usage(usage, "dataset tokenizer export: give DATASET and DIR");
	const char *name = argv[1], *dir = argv[2];
	struct stat st;
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return admin_failf("folder \"%s\" does not exist", dir);
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	dataset_row d;
	if (!find_dataset(ctx, name, &d))
		return ADMIN_FAIL;
	const char *sha = d.tokenizer_sha[0] ? d.tokenizer_sha : d.trained_sha;
	if (!sha[0])
		return admin_failf("dataset \"%s\" has no subword tokenizer: train one with `cotrain-admin "
		                   "dataset "
		                   "tokenizer train %s`",
		                   name, name);
	cot_errbuf eb = { "", "" };
	spm_model *m = NULL;
	cot_err rc = admin_tokenizer_load(ctx, sha, &m, &eb);
	if (!rc)
		rc = hf_tokenizer_write(m, dir, 512, &eb);
	spm_free(m);
	if (rc)
		return admin_fail(&eb);
	printf("wrote tokenizer %s of dataset \"%s\" to %s: tokenizer.json, tokenizer_config.json, "
	       "spiece.model\n",
	       sha, name, dir);
	return ADMIN_OK;
}

int admin_tokenizer_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "dataset tokenizer: no command given");
	if (strcmp(argv[1], "train") == 0)
		return train_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(argv[1], "export") == 0)
		return export_cmd(ctx, argc - 1, argv + 1);
	return admin_usage(usage, "dataset tokenizer: unknown command \"%s\"", argv[1]);
}

cot_err admin_tokenizer_load(admin_ctx *ctx, const char *sha, spm_model **out, cot_errbuf *eb)
{
	unsigned char *bytes = NULL;
	size_t len = 0;
	*out = NULL;
	cot_err rc = fs_read_verified(ctx->store_dir, sha, SPM_MODEL_MAX, &bytes, &len, eb);
	if (!rc)
		rc = spm_load(bytes, len, out, eb);
	free(bytes);
	return rc;
}
