/* cotrain tests: the single-process replay trainer of the equivalence test
 * ("4 clients training collaboratively for several rounds match a
 * single process that trains on the same global batches in the same
 * order").
 *
 *   replay_rounds --project FILE --rounds FILE
 *                 (--store DIR --manifest SHA|PATH | --shard PATH ...)
 *                 [--mb-per-epoch N] [--checkpoint PATH] [--out DIR]
 *   replay_rounds --compare A.safetensors B.safetensors [--tolerance X]
 *
 * Replay: the project file is read as `cotrain-admin project create` reads
 * it (server/project_file.c), the optimizer from its normalized form as the
 * server's step and the clients read it (kernels/opt_json.h), for each round
 * the settings in force at its version (the file's "changes",
 * kernels/config_changes.h).  The
 * dataset's tokens come from the shards listed by a manifest in a file
 * store (the server's <data dir>/files) or from shard files given one by
 * one; mb_per_epoch is the manifest's (doc/project-file.md), or
 * --mb-per-epoch (required with bare shards, which do not tell the stream's
 * length).  The model starts
 * from --checkpoint (version v0 = its step), or from the project's seed as
 * `project create` makes version 0.
 *
 * The rounds file holds one range a line, "V LO HI [HOST]": stream
 * microbatches [LO, HI) count in the round that trains version V into V+1
 * (for a real run: each work unit of version V reported in the committed
 * round, LO = its lo, HI = lo + mb_done), computed by host HOST.  '#' starts
 * a comment.  The versions must be v0, v0+1, ... without a gap; ranges of
 * one round must not overlap.  Sync mode (the project's default): for each
 * round, in order of version and then LO: the gradient SUM over every
 * sample of its ranges as the client computes it (shared/common/microbatch.h, then
 * kern_forward and kern_backward_scaled(B), microbatch by microbatch),
 * divided by the round's samples (mean[i] = (float)((double)sum[i]/total),
 * as the all-reduce rounds its double sum once), one kern_opt_step; HOST is
 * optional and ignored.
 *
 * Local mode ("mode": "local"; doc/design.md "Local mode") needs HOST on
 * every line, and a host's ranges of a round in the order it computed them
 * (for a real run: its work units in the order it got them).  For each
 * round, host by host in ascending order: from theta_v, the host's inner
 * steps over its ranges in file order (kernels/local.h, as its session
 * takes them: one every inner_batch microbatches, counted across its
 * ranges, a partial one at the end), its contribution S x (theta_v -
 * theta) summed in double; the sum rounded once to fp32 (the all-reduce of
 * one group), the mean (float)((double)sum[i]/total), one
 * kern_opt_outer_step on theta_v.  It prints one line a round
 *
 *   round V samples S loss L params HEX
 *
 * with L the sample-weighted mean of the microbatch losses (%.9g) and HEX
 * the sha256 of the raw fp32 parameters, as the server's params_sha256; with
 * --out it writes DIR/vV+1.safetensors after each round.  Exit 0, or 2 with
 * a message on stderr.
 *
 * Compare: loads two checkpoints and, element by element over the
 * parameters and both optimizer moments (a mean gradient off by a factor
 * shows in the moments even where AdamW's step hides it), prints
 *
 *   max relative difference R (max abs difference D, max abs value M)
 *
 * for the parameters, then one line per buffer ("params R", "m R", "v R").
 * R = max over elements of |a - b| / max(|a|, |b|, F), where the absolute
 * floor F of a buffer is the RMS of its values in A: an element larger than
 * its buffer's typical size is held to tol of itself, a smaller one (a bias
 * near zero, a gradient that cancels, whose fp32 sum in another order
 * differs relatively much and, through AdamW's m / sqrt(v), moves its
 * parameter by up to lr x that) to tol x the RMS, far below the largest
 * value (LayerNorm gains near 1) that a max |a - b| / max |value| would
 * measure every element against.  D and M are the largest |a - b| and
 * |value| over all three buffers (diagnostics).  Exit 1 when the
 * parameters' R exceeds the tolerance (default 1e-5), a moment's R exceeds 10x it (the
 * moments are near the last gradients themselves, whose fp32 sums in
 * another order differ by about 1e-5 of their RMS; a gradient off by a
 * factor moves them by that factor), or the files' models or steps differ;
 * 2 on an error. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "kernels/backend.h"
#include "kernels/checkpoint.h"
#include "kernels/local.h"
#include "kernels/model.h"
#include "kernels/opt_json.h"
#include "kernels/optimizer.h"
#include "kernels/stream_step.h"
#include "server/project_file.h"
#include "shared/common/filestore.h"
#include "shared/common/hash.h"
#include "shared/common/microbatch.h"
#include "shared/common/shard.h"

#define MAX_SHARDS 65536
#define MAX_RANGES 1000000
#define MAX_RANGE_MB ((int64_t)1 << 40)
#define MANIFEST_MAX (64u << 20)

static const char *prog = "replay_rounds";

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: %s --project FILE --rounds FILE\n"
	        "           (--store DIR --manifest SHA|PATH | --shard PATH ...)\n"
	        "           [--mb-per-epoch N] [--checkpoint PATH] [--out DIR]\n"
	        "       %s --compare A.safetensors B.safetensors [--tolerance X]\n",
	        prog, prog);
}

static int fail(const cot_errbuf *eb)
{
	fprintf(stderr, "%s: error: %s\n", prog, eb->msg);
	if (eb->hint[0])
		fprintf(stderr, "%s: hint: %s\n", prog, eb->hint);
	return 2;
}

/* Read a whole file of at most max bytes into a malloc'd NUL-terminated
 * buffer (*out, length *len); the caller frees it. */
static cot_err slurp(const char *path, size_t max, char **out, size_t *len, cot_errbuf *eb)
{
	*out = NULL;
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	if (!f)
		return cot_seterr(eb, errno == ENOENT ? COT_ERR_NOT_FOUND : COT_ERR_IO,
		                  "could not open \"%s\": %s", path, strerror(errno));
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	cot_err rc = COT_OK;
	while (buf) {
		if (n + 1 >= cap) {
			if (cap > max) {
				rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "file \"%s\" is over %zu bytes", path,
				                max);
				break;
			}
			char *b = realloc(buf, cap * 2);
			if (!b)
				break;
			buf = b;
			cap *= 2;
		}
		size_t got = fread(buf + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0) {
			if (ferror(f))
				rc = cot_seterr(eb, COT_ERR_IO, "could not read \"%s\": %s", path,
				                strerror(errno));
			break;
		}
	}
	if (f != stdin)
		fclose(f);
	if (!buf)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory reading \"%s\"", path);
	if (!rc && n > max)
		rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "file \"%s\" is over %zu bytes", path, max);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return COT_OK;
}

/* ---- the dataset ---- */

typedef struct {
	int n;
	mb_span spans[MAX_SHARDS];
	unsigned char *owned[MAX_SHARDS];
	uint64_t n_tokens; /* the manifest's training part (n_tokens - heldout_tokens); 0 with bare shards */
} dataset;

static void dataset_free(dataset *d)
{
	for (int i = 0; i < d->n; i++)
		free(d->owned[i]);
	d->n = 0;
}

static cot_err add_shard(dataset *d, const char *path, cot_errbuf *eb)
{
	if (d->n >= MAX_SHARDS)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "more than %d shards", MAX_SHARDS);
	shard_meta meta;
	unsigned char *tok = NULL;
	cot_errbuf e2 = { "", "" };
	cot_err rc = shard_read(path, SHARD_TOKENS_MAX, &meta, &tok, &e2);
	if (rc)
		return cot_seterr(eb, rc, "could not read shard \"%s\": %s", path, e2.msg);
	for (int i = 0; i < d->n; i++)
		if (meta.first_token < d->spans[i].first + d->spans[i].n &&
		    d->spans[i].first < meta.first_token + meta.n_tokens) {
			free(tok);
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "shard \"%s\" overlaps another shard (tokens %" PRIu64 "...)", path,
			                  meta.first_token);
		}
	d->spans[d->n] = (mb_span){ meta.first_token, meta.n_tokens, tok, meta.width };
	d->owned[d->n] = tok;
	d->n++;
	return COT_OK;
}

/* Load every shard a manifest lists (doc/dataset.md) from store.  manifest
 * is a file name in the store (64 hex digits) or a path. */
static cot_err load_manifest(dataset *d, const char *store, const char *manifest, cot_errbuf *eb)
{
	char path[PATH_MAX];
	cot_err rc;
	if (fs_sha_valid(manifest)) {
		rc = fs_path(store, manifest, path, sizeof path, eb);
		if (rc)
			return rc;
	} else if (snprintf(path, sizeof path, "%s", manifest) >= (int)sizeof path) {
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "manifest path is too long");
	}
	char *text;
	size_t len;
	rc = slurp(path, MANIFEST_MAX, &text, &len, eb);
	if (rc)
		return rc;
	json_error_t je;
	json_t *m = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	free(text);
	if (!json_is_object(m)) {
		json_decref(m);
		return cot_seterr(eb, COT_ERR_CORRUPT, "manifest \"%s\" is not a JSON object", path);
	}
	json_t *fmt = json_object_get(m, "format"), *nt = json_object_get(m, "n_tokens");
	json_t *shards = json_object_get(m, "shards");
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "cotrain-dataset") != 0 ||
	    !json_is_integer(nt) || json_integer_value(nt) < 1 || !json_is_array(shards) ||
	    json_array_size(shards) > MAX_SHARDS) {
		json_decref(m);
		return cot_seterr(eb, COT_ERR_CORRUPT, "manifest \"%s\" is not a cotrain-dataset manifest",
		                  path);
	}
	/* The epoch is cut from the training part only (doc/dataset.md). */
	json_t *ht = json_object_get(m, "heldout_tokens");
	json_int_t held = json_is_integer(ht) ? json_integer_value(ht) : 0;
	if (held < 0 || held >= json_integer_value(nt)) {
		json_decref(m);
		return cot_seterr(eb, COT_ERR_CORRUPT, "manifest \"%s\" holds out %lld of its tokens", path,
		                  (long long)held);
	}
	d->n_tokens = (uint64_t)(json_integer_value(nt) - held);
	size_t i;
	json_t *s;
	json_array_foreach(shards, i, s)
	{
		json_t *sha = json_object_get(s, "sha256"), *first = json_object_get(s, "first_token");
		json_t *n = json_object_get(s, "n_tokens");
		if (!json_is_string(sha) || !fs_sha_valid(json_string_value(sha)) ||
		    !json_is_integer(first) || !json_is_integer(n)) {
			rc = cot_seterr(eb, COT_ERR_CORRUPT,
			                "shard %zu of manifest \"%s\" lacks sha256, first_token or n_tokens",
			                i, path);
			break;
		}
		char sp[PATH_MAX];
		if ((rc = fs_path(store, json_string_value(sha), sp, sizeof sp, eb)) ||
		    (rc = add_shard(d, sp, eb)))
			break;
		const mb_span *got = &d->spans[d->n - 1];
		if ((json_int_t)got->first != json_integer_value(first) ||
		    (json_int_t)got->n != json_integer_value(n)) {
			rc = cot_seterr(eb, COT_ERR_CORRUPT,
			                "shard %s does not hold the tokens manifest \"%s\" says",
			                json_string_value(sha), path);
			break;
		}
	}
	json_decref(m);
	return rc;
}

/* ---- the rounds file ---- */

typedef struct {
	int64_t v, lo, hi;
	int64_t host; /* -1: not given */
	size_t line;  /* order in the file */
} range;

static int range_cmp(const void *a, const void *b)
{
	const range *x = a, *y = b;
	if (x->v != y->v)
		return x->v < y->v ? -1 : 1;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Local mode's order: version, host, then as in the file. */
static int range_cmp_host(const void *a, const void *b)
{
	const range *x = a, *y = b;
	if (x->v != y->v)
		return x->v < y->v ? -1 : 1;
	if (x->host != y->host)
		return x->host < y->host ? -1 : 1;
	return x->line < y->line ? -1 : x->line > y->line;
}

/* Parse the rounds file (format above) into a malloc'd array sorted by
 * version then lo, or with by_host by version, host and file order (every
 * line must then name its host); checks versions start at v0 without gaps
 * and no two ranges of one round overlap. */
static cot_err read_rounds(const char *path, int64_t v0, int by_host, range **out, size_t *n_out,
                           cot_errbuf *eb)
{
	*out = NULL;
	*n_out = 0;
	char *text;
	size_t len;
	cot_err rc = slurp(path, 64u << 20, &text, &len, eb);
	if (rc)
		return rc;
	size_t n = 0, cap = 0;
	range *r = NULL;
	int line = 0;
	if (strlen(text) != len) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "rounds file \"%s\" holds a NUL byte", path);
		goto out;
	}
	for (char *l = text, *next; l; l = next) {
		next = strchr(l, '\n');
		if (next)
			*next++ = '\0';
		line++;
		char *hash = strchr(l, '#');
		if (hash)
			*hash = '\0';
		if (strspn(l, " \t\r") == strlen(l))
			continue;
		long long v, lo, hi, host = -1;
		int used = 0, used4 = 0;
		if (sscanf(l, " %lld %lld %lld %n", &v, &lo, &hi, &used) != 3 ||
		    (l[used] != '\0' && (sscanf(l + used, "%lld %n", &host, &used4) != 1 ||
		                         l[used + used4] != '\0' || host < 0))) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "line %d of rounds file \"%s\" is not \"VERSION LO HI [HOST]\"", line,
			                path);
			goto out;
		}
		if (by_host && host < 0) {
			rc = cot_seterr(eb, COT_ERR_INVALID, "line %d of rounds file \"%s\" names no host",
			                line, path);
			cot_sethint(eb, "A project in local mode replays each host's inner steps: give "
			                "\"VERSION LO HI HOST\".");
			goto out;
		}
		if (v < v0 || lo < 0 || hi <= lo || hi - lo > MAX_RANGE_MB) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "line %d of rounds file \"%s\": range [%lld, %lld) of version %lld "
			                "is out of bounds",
			                line, path, lo, hi, v);
			cot_sethint(eb, "Versions start at the checkpoint's step (%lld); 0 <= LO < HI.",
			            (long long)v0);
			goto out;
		}
		if (n == cap) {
			if (cap >= MAX_RANGES) {
				rc = cot_seterr(eb, COT_ERR_TOO_LARGE,
				                "rounds file \"%s\" has over %d ranges", path, MAX_RANGES);
				goto out;
			}
			cap = cap ? cap * 2 : 64;
			range *nr = realloc(r, cap * sizeof *r);
			if (!nr) {
				rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
				goto out;
			}
			r = nr;
		}
		r[n] = (range){ v, lo, hi, host, n };
		n++;
	}
	if (n == 0) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "rounds file \"%s\" has no range", path);
		goto out;
	}
	qsort(r, n, sizeof *r, range_cmp);
	if (r[0].v != v0) {
		rc = cot_seterr(eb, COT_ERR_INVALID,
		                "rounds file \"%s\" starts at version %lld, the checkpoint is version %lld",
		                path, (long long)r[0].v, (long long)v0);
		goto out;
	}
	for (size_t i = 1; i < n; i++) {
		if (r[i].v > r[i - 1].v + 1) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "rounds file \"%s\" has no range for version %lld", path,
			                (long long)r[i - 1].v + 1);
			goto out;
		}
		if (r[i].v == r[i - 1].v && r[i].lo < r[i - 1].hi) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "ranges [%lld, %lld) and [%lld, %lld) of version %lld overlap",
			                (long long)r[i - 1].lo, (long long)r[i - 1].hi, (long long)r[i].lo,
			                (long long)r[i].hi, (long long)r[i].v);
			goto out;
		}
	}
	if (by_host)
		qsort(r, n, sizeof *r, range_cmp_host);
out:
	free(text);
	if (rc) {
		free(r);
		return rc;
	}
	*out = r;
	*n_out = n;
	return COT_OK;
}

/* ---- replay ---- */

typedef struct {
	const char *project, *rounds, *store, *manifest, *checkpoint, *out;
	const char **shards;
	int nshards;
	int64_t mb_per_epoch; /* 0: from the manifest */
} replay_args;

static void to_config(const pf_model *p, kern_config *c) { *c = *p; }

/* Train one round of ranges r[0..n) (all of version m->step) on m: sum,
 * mean, step.  *samples and *loss get the round's totals. */
static cot_err train_round(kern_model *m, const kern_opt_config *o, const mb_shape *shape, uint64_t seed,
                           const dataset *d, const range *r, size_t n, int32_t *in, int32_t *tgt,
                           int64_t *samples, double *loss, cot_errbuf *eb)
{
	kern_zero_grad(m);
	double lsum = 0;
	int64_t total = 0;
	cot_err rc;
	for (size_t i = 0; i < n; i++)
		for (int64_t g = r[i].lo; g < r[i].hi; g++) {
			float l = 0;
			if ((rc = mb_fill(shape, d->spans, d->n, g, in, tgt, eb)) ||
			    (rc = kern_stream_step(m, in, tgt, (int)shape->B, seed, g, shape->mb_per_epoch,
			                           (float)shape->B, &l, eb)))
				return rc;
			lsum += (double)l * (double)shape->B;
			total += shape->B;
		}
	for (size_t i = 0; i < m->n_params; i++)
		m->grads[i] = (float)((double)m->grads[i] / (double)total);
	rc = kern_opt_step(m, o, NULL, eb);
	if (rc)
		return rc;
	*samples = total;
	*loss = lsum / (double)total;
	return COT_OK;
}

/* Train one round of local mode: ranges r[0..n) (all of version m->step,
 * sorted by host and file order) with the inner state l and acc (n_params
 * doubles) for the sum; see the top of the file.  *samples and *loss as
 * train_round. */
static cot_err train_round_local(kern_model *m, kern_local *l, const kern_mode_config *mc,
                                 const mb_shape *shape, uint64_t seed, const dataset *d, const range *r,
                                 size_t n, int32_t *in, int32_t *tgt, double *acc, int64_t *samples,
                                 double *loss, cot_errbuf *eb)
{
	double lsum = 0;
	int64_t total = 0;
	cot_err rc;
	memset(acc, 0, m->n_params * sizeof *acc);
	for (size_t i = 0; i < n;) {
		/* one host: r[i..j) */
		size_t j = i;
		while (j < n && r[j].host == r[i].host)
			j++;
		kern_local_begin(l, m); /* theta_v: every host's contribution leaves it in place */
		for (size_t k = i; k < j; k++)
			for (int64_t g = r[k].lo; g < r[k].hi; g++) {
				float lo = 0;
				if ((rc = mb_fill(shape, d->spans, d->n, g, in, tgt, eb)) ||
				    (rc = kern_stream_step(m, in, tgt, (int)shape->B, seed, g,
				                           shape->mb_per_epoch, (float)shape->B, &lo, eb)) ||
				    (rc = kern_local_microbatch(l, m, shape->B, eb)))
					return rc;
				lsum += (double)lo * (double)shape->B;
			}
		int64_t s = 0;
		if ((rc = kern_local_finish(l, m, &s, eb)))
			return rc;
		for (size_t e = 0; e < m->n_params; e++)
			acc[e] += (double)m->grads[e];
		total += s;
		i = j;
	}
	for (size_t e = 0; e < m->n_params; e++) {
		float sum = (float)acc[e];
		m->grads[e] = (float)((double)sum / (double)total);
	}
	rc = kern_opt_outer_step(m, &mc->outer, eb);
	if (rc)
		return rc;
	*samples = total;
	*loss = lsum / (double)total;
	return COT_OK;
}

static int replay(const replay_args *a)
{
	cot_errbuf eb = { "", "" };
	char *text = NULL, *normalized = NULL;
	size_t len;
	pf_project pf;
	int have_pf = 0, ret = 2;
	dataset *d = calloc(1, sizeof *d);
	kern_model *m = NULL;
	range *r = NULL;
	size_t nr = 0;
	int32_t *in = NULL, *tgt = NULL;
	kern_local *lstate = NULL;
	double *acc = NULL;
	cot_err rc;
	if (!d) {
		cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	rc = slurp(a->project, PF_MAX_BYTES, &text, &len, &eb);
	if (rc)
		goto out;
	rc = pf_parse(text, len, &pf, &normalized, &eb);
	if (rc)
		goto out;
	have_pf = 1;
	kern_opt_config o;
	kern_mode_config mc;
	rc = kern_opt_config_from_json(normalized, &o, &eb);
	if (!rc)
		rc = kern_mode_config_from_json(normalized, &mc, &eb);
	if (rc)
		goto out;
	int local = mc.mode == KERN_MODE_LOCAL;

	/* The dataset. */
	if (a->manifest) {
		rc = load_manifest(d, a->store ? a->store : ".", a->manifest, &eb);
		if (rc)
			goto out;
	}
	for (int i = 0; i < a->nshards; i++)
		if ((rc = add_shard(d, a->shards[i], &eb)))
			goto out;
	mb_shape shape = { a->mb_per_epoch, pf.microbatch_size, pf.model.seq_len };
	if (d->n_tokens) {
		int64_t got = mb_per_epoch(d->n_tokens, shape.T, shape.B);
		if (a->mb_per_epoch && a->mb_per_epoch != got) {
			cot_seterr(&eb, COT_ERR_INVALID,
			           "--mb-per-epoch %lld disagrees with the manifest's %lld",
			           (long long)a->mb_per_epoch, (long long)got);
			goto out;
		}
		shape.mb_per_epoch = got;
	}
	rc = mb_shape_check(&shape, &eb);
	if (rc)
		goto out;

	/* The model of version v0. */
	kern_config kc;
	to_config(&pf.model, &kc);
	if (a->checkpoint) {
		rc = ckpt_load_new(a->checkpoint, (int)shape.B, &m, &eb);
		if (rc)
			goto out;
		if (memcmp(&m->config, &kc, sizeof kc) != 0) {
			cot_seterr(&eb, COT_ERR_INVALID,
			           "checkpoint \"%s\" does not hold the model of project \"%s\"",
			           a->checkpoint, pf.name);
			goto out;
		}
	} else {
		rc = kern_model_create(&kc, (int)shape.B, &m, &eb);
		if (rc)
			goto out;
		kern_model_init(m, (uint64_t)pf.seed);
	}
	rc = read_rounds(a->rounds, m->step, local, &r, &nr, &eb);
	if (rc)
		goto out;
	if (local) {
		rc = kern_local_new(m, &o, mc.inner_batch, &lstate, &eb);
		if (rc)
			goto out;
		if (!(acc = malloc(m->n_params * sizeof *acc))) {
			cot_seterr(&eb, COT_ERR_NOMEM, "out of memory for the round's sum");
			goto out;
		}
	}
	in = malloc(sizeof *in * (size_t)(shape.B * shape.T));
	tgt = malloc(sizeof *tgt * (size_t)(shape.B * shape.T));
	if (!in || !tgt) {
		cot_seterr(&eb, COT_ERR_NOMEM, "out of memory for the batch");
		goto out;
	}
	if (a->out && mkdir(a->out, 0755) != 0 && errno != EEXIST) {
		cot_seterr(&eb, COT_ERR_IO, "could not create directory \"%s\": %s", a->out, strerror(errno));
		goto out;
	}
	for (size_t i = 0; i < nr;) {
		size_t j = i;
		while (j < nr && r[j].v == r[i].v)
			j++;
		long v = m->step;
		int64_t samples;
		double loss;
		/* The optimizer in force at v (the project's "changes"): the
		 * step's in sync mode, the inner steps' in local mode. */
		if ((rc = kern_opt_config_at(normalized, v, &o, &eb)) ||
		    (local && (rc = kern_local_set_inner(lstate, &o, &eb))))
			goto out;
		rc = local ? train_round_local(m, lstate, &mc, &shape, (uint64_t)pf.seed, d, r + i, j - i, in,
		                               tgt, acc, &samples, &loss, &eb)
		           : train_round(m, &o, &shape, (uint64_t)pf.seed, d, r + i, j - i, in, tgt, &samples,
		                         &loss, &eb);
		if (rc)
			goto out;
		char hex[HASH_SHA256_HEX_LEN + 1];
		if (hash_sha256_hex(m->params, m->n_params * sizeof *m->params, hex)) {
			cot_seterr(&eb, COT_ERR_INTERNAL, "could not hash the parameters");
			goto out;
		}
		if (a->out) {
			char path[PATH_MAX];
			snprintf(path, sizeof path, "%s/v%ld.safetensors", a->out, m->step);
			rc = ckpt_save(m, path, &eb);
			if (rc)
				goto out;
		}
		printf("round %ld samples %lld loss %.9g params %s\n", v, (long long)samples, loss, hex);
		fflush(stdout);
		i = j;
	}
	ret = 0;
out:
	if (ret)
		fail(&eb);
	free(in);
	free(tgt);
	free(r);
	free(acc);
	kern_local_free(lstate);
	kern_model_free(m);
	if (d)
		dataset_free(d);
	free(d);
	if (have_pf)
		pf_free(&pf);
	free(normalized);
	free(text);
	return ret;
}

/* ---- compare ---- */

static int compare(const char *pa, const char *pb, double tol)
{
	cot_errbuf eb = { "", "" };
	kern_model *a = NULL, *b = NULL;
	int ret = 2;
	if (ckpt_load_new(pa, 0, &a, &eb) || ckpt_load_new(pb, 0, &b, &eb)) {
		fail(&eb);
		goto out;
	}
	if (memcmp(&a->config, &b->config, sizeof a->config) != 0) {
		printf("the checkpoints hold different models\n");
		ret = 1;
		goto out;
	}
	const float *bufs[3][2] = { { a->params, b->params }, { a->m, b->m }, { a->v, b->v } };
	static const char *const names[3] = { "params", "m", "v" };
	double dmax = 0, vmax = 0, brel[3];
	int over = 0;
	for (int k = 0; k < 3; k++) {
		const float *x = bufs[k][0], *y = bufs[k][1];
		double ss = 0;
		for (size_t i = 0; i < a->n_params; i++)
			ss += (double)x[i] * x[i];
		double floor = sqrt(ss / (double)(a->n_params ? a->n_params : 1));
		brel[k] = 0;
		for (size_t i = 0; i < a->n_params; i++) {
			double xi = x[i], yi = y[i], dd = fabs(xi - yi);
			double scale = fmax(fmax(fabs(xi), fabs(yi)), floor);
			double r = dd == 0 ? 0 : scale > 0 ? dd / scale : INFINITY;
			if (!(r <= brel[k]))
				brel[k] = r; /* NaN too */
			dmax = fmax(dmax, dd);
			vmax = fmax(vmax, fmax(fabs(xi), fabs(yi)));
		}
		if (!(brel[k] <= (k == 0 ? tol : 10 * tol)))
			over = 1;
	}
	printf("max relative difference %.6g (max abs difference %.6g, max abs value %.6g)\n", brel[0], dmax,
	       vmax);
	for (int k = 0; k < 3; k++)
		printf("%s %.6g\n", names[k], brel[k]);
	ret = over;
	if (a->step != b->step) {
		printf("the checkpoints differ in step: %ld and %ld\n", a->step, b->step);
		ret = 1;
	}
out:
	kern_model_free(a);
	kern_model_free(b);
	return ret;
}

int main(int argc, char **argv)
{
	/* First: the BLAS core the client and the server run with (backend.h),
	 * so the replay's forward and backward round as theirs do. */
	kern_blas_reexec_if_needed(argc, argv);
	replay_args a;
	memset(&a, 0, sizeof a);
	static const char *shards[MAX_SHARDS];
	a.shards = shards;
	int do_compare = 0;
	double tol = 1e-5;
	enum {
		O_PROJECT = 1,
		O_ROUNDS,
		O_STORE,
		O_MANIFEST,
		O_SHARD,
		O_MPE,
		O_CKPT,
		O_OUT,
		O_COMPARE,
		O_TOL,
		O_HELP
	};
	static const struct option opts[] = { { "project", required_argument, NULL, O_PROJECT },
		                              { "rounds", required_argument, NULL, O_ROUNDS },
		                              { "store", required_argument, NULL, O_STORE },
		                              { "manifest", required_argument, NULL, O_MANIFEST },
		                              { "shard", required_argument, NULL, O_SHARD },
		                              { "mb-per-epoch", required_argument, NULL, O_MPE },
		                              { "checkpoint", required_argument, NULL, O_CKPT },
		                              { "out", required_argument, NULL, O_OUT },
		                              { "compare", no_argument, NULL, O_COMPARE },
		                              { "tolerance", required_argument, NULL, O_TOL },
		                              { "help", no_argument, NULL, O_HELP },
		                              { NULL, 0, NULL, 0 } };
	int c;
	char *end;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case O_PROJECT:
			a.project = optarg;
			break;
		case O_ROUNDS:
			a.rounds = optarg;
			break;
		case O_STORE:
			a.store = optarg;
			break;
		case O_MANIFEST:
			a.manifest = optarg;
			break;
		case O_SHARD:
			if (a.nshards >= MAX_SHARDS) {
				fprintf(stderr, "%s: error: more than %d --shard\n", prog, MAX_SHARDS);
				return 2;
			}
			a.shards[a.nshards++] = optarg;
			break;
		case O_MPE:
			errno = 0;
			a.mb_per_epoch = strtoll(optarg, &end, 10);
			if (errno || *end || a.mb_per_epoch < 1) {
				fprintf(stderr, "%s: error: --mb-per-epoch must be a positive integer\n",
				        prog);
				return 2;
			}
			break;
		case O_CKPT:
			a.checkpoint = optarg;
			break;
		case O_OUT:
			a.out = optarg;
			break;
		case O_COMPARE:
			do_compare = 1;
			break;
		case O_TOL:
			errno = 0;
			tol = strtod(optarg, &end);
			if (errno || *end || !(tol >= 0)) {
				fprintf(stderr, "%s: error: --tolerance must be a number >= 0\n", prog);
				return 2;
			}
			break;
		case O_HELP:
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (do_compare) {
		if (argc - optind != 2) {
			usage(stderr);
			return 2;
		}
		return compare(argv[optind], argv[optind + 1], tol);
	}
	if (optind != argc || !a.project || !a.rounds || (!a.manifest && a.nshards == 0)) {
		usage(stderr);
		return 2;
	}
	if (!a.manifest && a.mb_per_epoch == 0) {
		fprintf(stderr, "%s: error: --mb-per-epoch is required without --manifest\n", prog);
		fprintf(stderr,
		        "%s: hint: Bare shards do not tell the length of the token stream; take it from the "
		        "project's mb_per_epoch.\n",
		        prog);
		return 2;
	}
	return replay(&a);
}
