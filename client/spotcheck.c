/* cotrain client: answering spot checks (see spotcheck.h). */
#include "client/spotcheck.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/compute.h"
#include "client/shard_cache.h"
#include "client/throttle.h"
#include "kernels/model.h"
#include "shared/common/fingerprint.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"
#include "shared/common/sketch.h"
#include "shared/common/microbatch.h"

#define MAX_CHECKS_A_PASS 8
#define MANIFEST_MAX (16 << 20)

#define CHECK_MB_MAX 64 /* microbatches a check may name (spot_policy.microbatches) */

typedef struct {
	int64_t id, version, lo, hi;
	uint64_t seed;
	int k;
	char checkpoint[65];
	int nmb; /* 0: a check of the whole range; else of these microbatches */
	int64_t mb[CHECK_MB_MAX];
	/* A check of one block (consecutive microbatches): the round's second
	 * seed, under which the sketch of their gradient sum is answered too. */
	int has_seed2;
	uint64_t seed2;
} spot_check;

/* Check a check as the server sent it. */
static cot_err parse_check(const json_t *c, const cl_project *p, spot_check *out, cot_errbuf *eb)
{
	long long id = 0, v = 0, lo = 0, hi = 0, k = 0;
	const char *seed = NULL, *ck = NULL, *proj = NULL;
	cot_errbuf e = { "", "" };
	if (!json_is_object(c) || cot_json_int(c, "id", true, 1, 1LL << 62, &id, &e) ||
	    cot_json_str(c, "project", true, 1, CL_NAME_MAX, &proj, &e) ||
	    cot_json_int(c, "version", true, 0, 1LL << 31, &v, &e) ||
	    cot_json_int(c, "lo", true, 0, 1LL << 60, &lo, &e) ||
	    cot_json_int(c, "hi", true, lo + 1, lo + p->mb_per_epoch, &hi, &e) ||
	    cot_json_int(c, "k", true, 1, SPOT_K_MAX, &k, &e) ||
	    cot_json_str(c, "seed", true, 1, 24, &seed, &e) ||
	    cot_json_str(c, "checkpoint_sha256", true, 64, 64, &ck, &e) || !hash_is_sha256_hex(ck))
		return cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid spot check: %s",
		                  e.msg[0] ? e.msg : "bad field");
	if (strcmp(proj, p->name) != 0)
		return cot_seterr(eb, COT_ERR_NETWORK, "server sent a spot check of another project");
	char *end;
	errno = 0;
	long long s = strtoll(seed, &end, 10);
	if (*end || errno)
		return cot_seterr(eb, COT_ERR_NETWORK, "server sent a spot check with a bad seed");
	*out = (spot_check){ .id = id, .version = v, .lo = lo, .hi = hi, .seed = (uint64_t)s, .k = (int)k };
	memcpy(out->checkpoint, ck, 65);
	/* A check of some microbatches of the range: ascending, within it. */
	const json_t *mbs = json_object_get(c, "microbatches");
	if (mbs && !json_is_null(mbs)) {
		size_t n = json_array_size(mbs);
		if (!json_is_array(mbs) || n == 0 || n > CHECK_MB_MAX)
			return cot_seterr(eb, COT_ERR_NETWORK,
			                  "server sent a spot check whose "
			                  "\"microbatches\" is not 1 to %d numbers",
			                  CHECK_MB_MAX);
		for (size_t i = 0; i < n; i++) {
			const json_t *g = json_array_get(mbs, i);
			json_int_t x = json_is_integer(g) ? json_integer_value(g) : -1;
			if (x < lo || x >= hi || (i > 0 && x <= out->mb[i - 1]))
				return cot_seterr(eb, COT_ERR_NETWORK,
				                  "server sent a spot check naming "
				                  "microbatches out of order or outside its range");
			out->mb[i] = (int64_t)x;
		}
		out->nmb = (int)n;
	}
	const char *s2 = NULL;
	if (out->nmb && !cot_json_str(c, "seed2", true, 1, 24, &s2, NULL)) {
		errno = 0;
		long long v2 = strtoll(s2, &end, 10);
		if (*end || errno)
			return cot_seterr(eb, COT_ERR_NETWORK, "server sent a spot check with a bad seed2");
		out->seed2 = (uint64_t)v2;
		out->has_seed2 = 1;
	}
	return COT_OK;
}

cot_err cl_spot_check_parse(const json_t *c, const cl_project *p, cot_errbuf *eb)
{
	spot_check sc;
	return parse_check(c, p, &sc, eb);
}

int cl_spot_token_runs(const cl_project *p, int64_t lo, int64_t hi, uint64_t first[2], uint64_t last[2],
                       cot_errbuf *eb)
{
	/* The shape check bounds mb_per_epoch * B * T + 1 by 2^62, so no
	 * position below overflows (the product of the server's numbers alone
	 * could reach 2^90). */
	mb_shape shape = { .mb_per_epoch = p->mb_per_epoch, .B = p->microbatch_size, .T = p->seq_len };
	cot_errbuf e = { "", "" };
	if (mb_shape_check(&shape, &e)) {
		cot_seterr(eb, COT_ERR_NETWORK, "server sent a project whose stream does not fit: %s", e.msg);
		return -1;
	}
	if (lo < 0 || hi <= lo || hi - lo > shape.mb_per_epoch) {
		cot_seterr(eb, COT_ERR_NETWORK,
		           "server sent a spot check of microbatches [%lld, %lld), not 1 to %lld of them",
		           (long long)lo, (long long)hi, (long long)shape.mb_per_epoch);
		return -1;
	}
	uint64_t per_mb = (uint64_t)shape.B * (uint64_t)shape.T;
	uint64_t elo = (uint64_t)(lo % shape.mb_per_epoch), n = (uint64_t)(hi - lo);
	uint64_t epoch = (uint64_t)shape.mb_per_epoch;
	first[0] = elo * per_mb;
	if (elo + n <= epoch) {
		last[0] = (elo + n) * per_mb; /* inclusive: the last target token */
		return 1;
	}
	last[0] = epoch * per_mb;
	first[1] = 0;
	last[1] = (elo + n - epoch) * per_mb;
	return 2;
}

/* Fetch file sha of the server into the cache as a work unit file f of
 * kind; size < 0: ask the server first. */
static cot_err fetch(const cl_project *p, const cl_fetch_env *env, const char *sha, int64_t size, cl_file *f,
                     const char *kind, cot_errbuf *eb)
{
	char dest[PATH_MAX];
	snprintf(f->url, sizeof f->url, "/files/%s", sha);
	snprintf(f->sha256, sizeof f->sha256, "%s", sha);
	snprintf(f->kind, sizeof f->kind, "%s", kind);
	return cl_cache_fetch(env, p->base, p->host_token, sha, size, dest, sizeof dest, &f->size, eb);
}

/* The checkpoint and the shards that hold the check's range, as a work
 * unit's files, from the dataset's manifest. */
static cot_err gather(const cl_api_opts *o, const cl_project *p, const cl_fetch_env *env, const spot_check *c,
                      cl_work *w, cot_errbuf *eb)
{
	json_t *info = NULL, *man = NULL;
	cl_project tmp = *p;
	cot_err rc = cl_api_project(o, &tmp, &info, eb);
	if (rc)
		return rc;
	const json_t *mref = json_object_get(json_object_get(info, "dataset"), "manifest");
	const char *msha = NULL;
	long long msize = 0;
	cot_errbuf e = { "", "" };
	memset(w, 0, sizeof *w);
	if (cot_json_str(mref, "sha256", true, 64, 64, &msha, &e) || !hash_is_sha256_hex(msha) ||
	    cot_json_int(mref, "size", true, 1, MANIFEST_MAX, &msize, &e)) {
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no usable dataset manifest: %s", e.msg);
		goto out;
	}
	char path[PATH_MAX];
	rc = cl_cache_fetch(env, p->base, p->host_token, msha, msize, path, sizeof path, NULL, eb);
	if (rc)
		goto out;
	json_error_t je;
	if (!(man = json_load_file(path, 0, &je)) || !json_is_array(json_object_get(man, "shards"))) {
		rc = cot_seterr(eb, COT_ERR_CORRUPT, "dataset manifest %s is not readable", msha);
		goto out;
	}
	rc = fetch(p, env, c->checkpoint, -1, &w->files[0], "checkpoint", eb);
	if (rc)
		goto out;
	w->nfiles = 1;
	uint64_t first[2], last[2];
	int runs = cl_spot_token_runs(p, c->lo, c->hi, first, last, eb);
	if (runs < 0) {
		rc = COT_ERR_NETWORK;
		goto out;
	}
	const json_t *shards = json_object_get(man, "shards");
	for (size_t i = 0; i < json_array_size(shards); i++) {
		const json_t *s = json_array_get(shards, i);
		long long ft = 0, nt = 0, size = 0;
		const char *sha = NULL;
		if (cot_json_int(s, "first_token", true, 0, 1LL << 60, &ft, &e) ||
		    cot_json_int(s, "n_tokens", true, 1, 1LL << 40, &nt, &e) ||
		    cot_json_int(s, "size", true, 1, 1LL << 40, &size, &e) ||
		    cot_json_str(s, "sha256", true, 64, 64, &sha, &e) || !hash_is_sha256_hex(sha)) {
			rc = cot_seterr(eb, COT_ERR_CORRUPT, "dataset manifest %s has a bad shard: %s", msha,
			                e.msg);
			goto out;
		}
		bool needed = false;
		for (int r = 0; r < runs; r++)
			needed = needed || ((uint64_t)(ft + nt) > first[r] && (uint64_t)ft <= last[r]);
		if (!needed)
			continue;
		if (w->nfiles == CL_MAX_FILES) {
			rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "spot check %lld needs more than %d files",
			                (long long)c->id, CL_MAX_FILES);
			goto out;
		}
		rc = fetch(p, env, sha, size, &w->files[w->nfiles], "shard", eb);
		if (rc)
			goto out;
		w->nfiles++;
	}
	w->version = c->version;
	w->lo = c->lo;
	w->hi = w->keep_hi = c->hi;
out:
	json_decref(man);
	json_decref(info);
	return rc;
}

struct cl_spot_job {
	spot_check c;
	cl_work w;
	cl_compute *s;
	int64_t next; /* the next microbatch of the range to compute, or the
	               * index of the next one in c.mb */
};

void cl_spot_job_free(cl_spot_job *j)
{
	if (!j)
		return;
	cl_compute_close(j->s);
	free(j);
}

/* Start check c: its files, a session on its checkpoint. */
static cot_err job_start(const cl_api_opts *o, const cl_project *p, const cl_fetch_env *env,
                         const spot_check *c, cl_spot_job **out, cot_errbuf *eb)
{
	cl_spot_job *j = calloc(1, sizeof *j);
	if (!j)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	j->c = *c;
	j->next = c->nmb ? 0 : c->lo;
	cot_err rc = gather(o, p, env, c, &j->w, eb);
	/* A spot check fingerprints the plain gradient sum of its range, in
	 * local mode too: the session takes no inner step. */
	cl_project *sync = rc ? NULL : malloc(sizeof *sync);
	if (!rc && !sync)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (!rc) {
		*sync = *p;
		sync->mode = (cl_train_mode){ .known = 1, .json = "{}" };
		rc = cl_compute_open(sync, &j->w, env->cache_dir, &j->s, eb);
	}
	/* A check of microbatches compares their sketches under the round's
	 * seed with the ones the host committed. */
	if (!rc && c->nmb)
		rc = cl_compute_sketch_on(j->s, c->seed, c->k, eb);
	free(sync);
	if (rc) {
		cl_spot_job_free(j);
		return rc;
	}
	*out = j;
	return COT_OK;
}

/* Send the finished job's answer: the fingerprint of the range's gradient,
 * or the sketches of the check's microbatches in its order, then, for a
 * block with a second seed, the sketch under it of their gradient sum (the
 * session started from a zero gradient: it holds just that sum). */
static cot_err job_answer(const cl_api_opts *o, const cl_project *p, const cl_spot_job *j, cot_errbuf *eb)
{
	int n = j->c.nmb ? (j->c.nmb + j->c.has_seed2) * j->c.k : j->c.k;
	double *fp = malloc((size_t)n * sizeof *fp);
	if (!fp)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (j->c.nmb) {
		for (int i = 0; i < j->c.nmb; i++) {
			cot_err rc = cl_compute_sketches(j->s, j->c.mb[i], 1, fp + i * j->c.k, eb);
			if (rc) {
				free(fp);
				return rc;
			}
		}
		if (j->c.has_seed2) {
			kern_model *m;
			cot_err rc = cl_compute_model(j->s, &m, eb);
			if (rc) {
				free(fp);
				return rc;
			}
			double *s2 = fp + j->c.nmb * j->c.k;
			memset(s2, 0, (size_t)j->c.k * sizeof *s2);
			sketch_add(m->grads, m->n_params, 0, j->c.seed2, j->c.k, s2);
		}
	} else {
		kern_model *m;
		cot_err rc = cl_compute_model(j->s, &m, eb);
		if (rc) {
			free(fp);
			return rc;
		}
		spot_fingerprint_compute(m->grads, m->n_params, j->c.seed, j->c.k, fp);
	}
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/spotchecks/%lld/fingerprint", p->base, (long long)j->c.id);
	json_t *vals = json_array();
	for (int k = 0; vals && k < n; k++)
		json_array_append_new(vals, json_real(fp[k]));
	free(fp);
	json_t *body = vals ? json_pack("{s:o}", "values", vals) : NULL;
	cl_http_req r = { .method = "POST", .url = url, .bearer = p->host_token, .json = body };
	cot_err rc = body ? cl_api_http(o, &r, eb) : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	json_decref(body);
	return rc;
}

/* The next check to answer: one of our own work, or one we claimed; else
 * claim one of another host's work.  *c unset (id 0) when there is none. */
static cot_err next_check(const cl_api_opts *o, const cl_project *p, spot_check *c, cot_errbuf *eb)
{
	memset(c, 0, sizeof *c);
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/hosts/%lld/spotchecks", p->base, (long long)p->host_id);
	json_t *a = NULL;
	cl_http_req r = { .method = "GET", .url = url, .bearer = p->host_token, .out = &a };
	cot_err rc = cl_api_http(o, &r, eb);
	if (rc)
		return rc;
	const json_t *x = NULL;
	const char *lists[] = { "own", "checking" };
	for (int l = 0; a && !x && l < 2; l++) {
		const json_t *list = json_object_get(a, lists[l]);
		if (json_is_array(list) && json_array_size(list) > 0)
			x = json_array_get(list, 0);
	}
	if (x) {
		rc = parse_check(x, p, c, eb);
		json_decref(a);
		return rc;
	}
	json_decref(a);
	/* Nothing of ours: check someone else's work. */
	snprintf(url, sizeof url, "%s/v1/projects/%s/spotchecks/claim", p->base, p->name);
	json_t *cl = NULL;
	cl_http_req cr = { .method = "POST", .url = url, .bearer = p->host_token, .out = &cl };
	rc = cl_api_http(o, &cr, eb);
	if (rc)
		return rc == COT_ERR_NOT_FOUND ? COT_OK : rc; /* a server without spot checks */
	if (cl)
		rc = parse_check(cl, p, c, eb);
	json_decref(cl);
	return rc;
}

cot_err cl_spotchecks_run(const cl_api_opts *o, const cl_project *p, const cl_fetch_env *env,
                          cl_spot_job **job, double budget_s, int time_percent, volatile int *cancel,
                          int *answered, cot_errbuf *eb)
{
	*answered = 0;
	double end = cl_now_mono() + budget_s;
	cot_err rc = COT_OK;
	for (int n = 0; n < MAX_CHECKS_A_PASS && !rc && !*cancel && cl_now_mono() < end; n++) {
		if (!*job) {
			spot_check c;
			if ((rc = next_check(o, p, &c, eb)) || c.id == 0)
				break;
			if ((rc = job_start(o, p, env, &c, job, eb)))
				break;
		}
		cl_spot_job *j = *job;
		int64_t last = j->c.nmb ? j->c.nmb : j->c.hi;
		while (!rc && j->next < last && !*cancel && cl_now_mono() < end) {
			double t = cl_now_mono();
			if (!(rc = cl_compute_microbatch(j->s, j->c.nmb ? j->c.mb[j->next] : j->next, NULL,
			                                 eb)))
				j->next++;
			cl_throttle_rest(cl_now_mono() - t, time_percent, NULL, cancel);
		}
		if (!rc && j->next == last) {
			rc = job_answer(o, p, j, eb);
			if (!rc)
				(*answered)++;
		}
		if (rc || j->next == last) {
			/* Answered, or failed: a failed check stays open on the
			 * server and is tried again from its start later. */
			cl_spot_job_free(j);
			*job = NULL;
		}
	}
	return rc;
}
