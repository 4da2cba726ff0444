/* cotrain-admin dataset: import text into shards, list datasets.
 *
 * The import writes every shard and the manifest into the file store first
 * (server/dataset_import.c), then records the dataset, its shards and their
 * files in ONE transaction: a failed import leaves no row behind, only
 * unreferenced store files. */
#include "server/admin.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "kernels/spm.h"
#include "server/dataset_import.h"

static const char usage[] = "usage: cotrain-admin dataset import [--shard-tokens N] [--heldout-fraction F]\n"
                            "                                     [--tokenizer DATASET] NAME PATH...\n"
                            "       cotrain-admin dataset list\n"
                            "       cotrain-admin dataset tokenizer train|export ... (see --help there)\n"
                            "\n"
                            "import reads UTF-8 text files, folders (every regular file below, in sorted\n"
                            "path order, hidden names skipped) and archives (.tar, .tar.gz, .tgz, .tar.bz2,\n"
                            ".tar.xz, .tar.zst, .zip; entries in archive order), joins the documents with\n"
                            "a blank line, tokenizes them byte by byte and writes shards of N tokens\n"
                            "(default 1048576) to the file store.  NAME: 1 to 64 letters, digits, '.',\n"
                            "'_' or '-'.  A file that is not UTF-8 or a damaged archive stops the import\n"
                            "and nothing is recorded.  The last F of the tokens (default 0.02, at least\n"
                            "4104 tokens; 0 for none, at most 0.5) are held out: never handed out as work,\n"
                            "they measure each model version's held-out bits per byte.  With\n"
                            "--tokenizer DATASET the documents are encoded with the subword tokenizer\n"
                            "trained on DATASET (`dataset tokenizer train`) into shards of token ids.\n"
                            "See doc/dataset.md.\n";

static cot_err record(admin_ctx *ctx, const char *name, const ds_result *r, const ds_tokenizer *tok,
                      cot_errbuf *eb)
{
	char size[32], id[32], idx[16], first[32], ntok[32];
	PGresult *res;
	cot_err rc = admin_begin(ctx, eb);
	if (rc)
		return rc;
	static const char file_sql[] =
	        "INSERT INTO file (sha256, size, kind) VALUES ($1, $2, $3) ON CONFLICT (sha256) DO NOTHING";
	snprintf(size, sizeof size, "%" PRIu64, r->manifest_size);
	const char *fp[3] = { r->manifest_sha256, size, "manifest" };
	if (!(res = admin_exec(ctx, file_sql, 3, fp, eb)))
		goto fail;
	PQclear(res);
	for (size_t i = 0; i < r->n_shards; i++) {
		snprintf(size, sizeof size, "%" PRIu64, r->shards[i].size);
		const char *sp[3] = { r->shards[i].sha256, size, "shard" };
		if (!(res = admin_exec(ctx, file_sql, 3, sp, eb)))
			goto fail;
		PQclear(res);
	}
	char held[32], vocab[16];
	snprintf(ntok, sizeof ntok, "%" PRIu64, r->n_tokens);
	snprintf(held, sizeof held, "%" PRIu64, r->heldout_tokens);
	snprintf(vocab, sizeof vocab, "%d", tok ? spm_vocab_size(tok->model) : 256);
	const char *dp[7] = {
		name, ntok, r->manifest_sha256, held, tok ? tok->type : "byte", tok ? tok->sha256 : NULL,
		vocab
	};
	res = admin_exec(ctx,
	                 "INSERT INTO dataset (name, tokenizer, n_tokens, manifest_sha256, heldout_tokens,"
	                 "                     tokenizer_sha256, vocab)"
	                 " VALUES ($1, $5, $2, $3, $4, $6, $7) RETURNING id",
	                 7, dp, eb);
	if (!res)
		goto fail;
	snprintf(id, sizeof id, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	for (size_t i = 0; i < r->n_shards; i++) {
		snprintf(idx, sizeof idx, "%" PRId32, r->shards[i].idx);
		snprintf(first, sizeof first, "%" PRIu64, r->shards[i].first_token);
		snprintf(ntok, sizeof ntok, "%" PRIu64, r->shards[i].n_tokens);
		const char *hp[5] = { id, idx, first, ntok, r->shards[i].sha256 };
		res = admin_exec(ctx,
		                 "INSERT INTO shard (dataset_id, idx, first_token, n_tokens, sha256)"
		                 " VALUES ($1, $2, $3, $4, $5)",
		                 5, hp, eb);
		if (!res)
			goto fail;
		PQclear(res);
	}
	if ((rc = admin_commit(ctx, eb)) == COT_OK)
		return COT_OK;
fail:
	admin_rollback(ctx);
	return COT_ERR_DB;
}

static bool dataset_exists(admin_ctx *ctx, const char *name, cot_errbuf *eb, bool *exists)
{
	const char *p[1] = { name };
	PGresult *r = admin_exec(ctx, "SELECT 1 FROM dataset WHERE name = $1", 1, p, eb);
	if (!r)
		return false;
	*exists = PQntuples(r) > 0;
	PQclear(r);
	return true;
}

/* A decimal fraction from 0 to DS_HELDOUT_FRACTION_MAX ("0.02", "2e-2");
 * false for anything else (empty, leading blanks or sign, trailing text,
 * NaN, infinities). */
static bool parse_fraction(const char *s, double *out)
{
	if (!isdigit((unsigned char)s[0]) && s[0] != '.')
		return false;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < 0 || v > DS_HELDOUT_FRACTION_MAX)
		return false;
	*out = v;
	return true;
}

/* The subword tokenizer of dataset `from` (the one its shards are encoded
 * with, else the last one trained on it): its sha256 and type, and the
 * model loaded from the store, checked against its sha256 (*model: the
 * caller frees it with spm_free).  COT_ERR_NOT_FOUND when there is none. */
static cot_err load_tokenizer(admin_ctx *ctx, const char *from, char sha[FS_SHA_HEX_LEN + 1], char type[16],
                              spm_model **model, cot_errbuf *eb)
{
	const char *p[1] = { from };
	PGresult *r = admin_exec(ctx,
	                         "SELECT coalesce(t.sha256, ''), coalesce(t.type, '') FROM dataset d"
	                         "  LEFT JOIN tokenizer t ON t.sha256 = coalesce(d.tokenizer_sha256, "
	                         "d.trained_tokenizer)"
	                         " WHERE d.name = $1",
	                         1, p, eb);
	if (!r)
		return COT_ERR_DB;
	if (PQntuples(r) == 0) {
		PQclear(r);
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "dataset \"%.80s\" does not exist", from);
	}
	if (PQgetvalue(r, 0, 0)[0] == '\0') {
		PQclear(r);
		cot_seterr(eb, COT_ERR_NOT_FOUND, "dataset \"%.80s\" has no subword tokenizer", from);
		cot_sethint(eb,
		            "Train one with `cotrain-admin dataset tokenizer train %.80s --type unigram "
		            "--vocab N`, "
		            "or give --tokenizer byte.",
		            from);
		return COT_ERR_NOT_FOUND;
	}
	snprintf(sha, FS_SHA_HEX_LEN + 1, "%s", PQgetvalue(r, 0, 0));
	snprintf(type, 16, "%s", PQgetvalue(r, 0, 1));
	PQclear(r);
	return admin_tokenizer_load(ctx, sha, model, eb);
}

static int import_cmd(admin_ctx *ctx, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "shard-tokens", required_argument, NULL, 's' },
		{ "heldout-fraction", required_argument, NULL, 'h' },
		{ "tokenizer", required_argument, NULL, 't' },
		{ NULL, 0, NULL, 0 },
	};
	const char *tokenizer_from = NULL;
	long long shard_tokens = DS_SHARD_TOKENS_DEFAULT;
	double heldout = DS_HELDOUT_FRACTION_DEFAULT;
	int c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'h') {
			if (!parse_fraction(optarg, &heldout))
				return admin_usage(usage,
				                   "dataset import: --heldout-fraction must be a number from "
				                   "0 "
				                   "to %g, not \"%.40s\"",
				                   DS_HELDOUT_FRACTION_MAX, optarg);
		} else if (c == 't') {
			tokenizer_from = optarg;
		} else if (c == 's') {
			if (!admin_parse_ll(optarg, DS_SHARD_TOKENS_MIN, DS_SHARD_TOKENS_MAX, &shard_tokens))
				return admin_usage(usage,
				                   "dataset import: --shard-tokens must be an integer from "
				                   "%u to %u",
				                   DS_SHARD_TOKENS_MIN, DS_SHARD_TOKENS_MAX);
		} else {
			return admin_usage(usage, "dataset import: bad option");
		}
	}
	if (argc - optind < 2)
		return admin_usage(usage, "dataset import: give a NAME and at least one PATH");
	const char *name = argv[optind];
	cot_errbuf eb = { "", "" };
	if (!shard_name_valid(name))
		return admin_failf("invalid dataset name \"%.80s\": use 1 to 64 letters, digits, '.', '_' or "
		                   "'-', starting with a letter or digit",
		                   name);
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	bool exists = false;
	if (!dataset_exists(ctx, name, &eb, &exists))
		return admin_fail(&eb);
	if (exists)
		return admin_failf("dataset \"%s\" already exists", name);

	ds_tokenizer tok;
	char tok_sha[FS_SHA_HEX_LEN + 1], tok_type[16];
	spm_model *model = NULL;
	if (tokenizer_from && strcmp(tokenizer_from, "byte") != 0) {
		if (load_tokenizer(ctx, tokenizer_from, tok_sha, tok_type, &model, &eb))
			return admin_fail(&eb);
		tok = (ds_tokenizer){ .model = model, .sha256 = tok_sha, .type = tok_type };
		tok.separator[0] = tok.separator[1] = spm_piece_id(model, "\n");
	}
	ds_result r;
	cot_err rc = ds_import_tokenized(ctx->store_dir, name, (uint64_t)shard_tokens, heldout,
	                                 model ? &tok : NULL, (const char *const *)argv + optind + 1,
	                                 (size_t)(argc - optind - 1), &r, &eb);
	if (!rc && (rc = record(ctx, name, &r, model ? &tok : NULL, &eb)))
		ds_result_free(&r);
	spm_free(model);
	if (rc)
		return admin_fail(&eb);
	printf("imported dataset \"%s\": %" PRIu64 " tokens from %" PRIu64 " document%s in %zu shard%s\n",
	       name, r.n_tokens, r.n_documents, r.n_documents == 1 ? "" : "s", r.n_shards,
	       r.n_shards == 1 ? "" : "s");
	if (r.width > 1)
		printf("tokenizer %s (%s, from dataset \"%s\"): %d-bit token ids\n", tok_sha, tok_type,
		       tokenizer_from, 8 * r.width);
	if (r.heldout_tokens)
		printf("held out: the last %" PRIu64 " tokens (from token %" PRIu64 "), never handed out as "
		       "work\n",
		       r.heldout_tokens, r.n_tokens - r.heldout_tokens);
	else
		printf("no held-out part\n");
	printf("manifest %s\n", r.manifest_sha256);
	if (r.n_skipped)
		printf("skipped %" PRIu64 " hidden or non-regular entr%s\n", r.n_skipped,
		       r.n_skipped == 1 ? "y" : "ies");
	ds_result_free(&r);
	return ADMIN_OK;
}

static int list_cmd(admin_ctx *ctx, int argc, char **argv)
{
	if (argc > 1)
		return admin_usage(usage, "dataset list: unexpected argument \"%s\"", argv[1]);
	cot_errbuf eb = { "", "" };
	if (admin_connect(ctx, true))
		return ADMIN_FAIL;
	PGresult *r = admin_exec(ctx,
	                         "SELECT d.name, d.tokenizer, d.n_tokens, count(s.idx), d.manifest_sha256,"
	                         "       d.heldout_tokens,"
	                         "       to_char(d.created_at, 'YYYY-MM-DD HH24:MI')"
	                         "  FROM dataset d LEFT JOIN shard s ON s.dataset_id = d.id"
	                         " GROUP BY d.id ORDER BY d.name",
	                         0, NULL, &eb);
	if (!r)
		return admin_fail(&eb);
	printf("%-24s %-9s %14s %12s %7s %-16s %s\n", "NAME", "TOKENIZER", "TOKENS", "HELDOUT", "SHARDS",
	       "CREATED", "MANIFEST");
	for (int i = 0; i < PQntuples(r); i++)
		printf("%-24s %-9s %14s %12s %7s %-16s %s\n", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
		       PQgetvalue(r, i, 2), PQgetvalue(r, i, 5), PQgetvalue(r, i, 3), PQgetvalue(r, i, 6),
		       PQgetvalue(r, i, 4));
	PQclear(r);
	return ADMIN_OK;
}

int admin_dataset_main(admin_ctx *ctx, int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "tokenizer") == 0)
		return admin_tokenizer_main(ctx, argc - 1, argv + 1);
	if (admin_wants_help(argc, argv)) {
		fputs(usage, stdout);
		return ADMIN_OK;
	}
	if (argc < 2)
		return admin_usage(usage, "dataset: no command given");
	if (strcmp(argv[1], "import") == 0)
		return import_cmd(ctx, argc - 1, argv + 1);
	if (strcmp(argv[1], "list") == 0)
		return list_cmd(ctx, argc - 1, argv + 1);
	return admin_usage(usage, "dataset: unknown command \"%s\"", argv[1]);
}
