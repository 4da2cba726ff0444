/* cotrain client: gradients over microbatches (see compute.h). */
#include "client/compute.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client/cheat.h"
#include "client/shard_cache.h"
#include "kernels/checkpoint.h"
#include "kernels/gpu.h"
#include "kernels/local.h"
#include "kernels/model.h"
#include "kernels/opt_json.h"
#include "kernels/stream_step.h"
#include "shared/common/fault.h"
#include "shared/common/filestore.h"
#include "shared/common/log.h"
#include "shared/common/microbatch.h"
#include "shared/common/shard.h"
#include "shared/common/sketch.h"

/* Microbatches whose gradient the GPU holds at most before it comes home. */
#define CL_HELD_MAX 64

struct cl_compute {
	kern_model *m;
	int64_t lo, hi; /* stream microbatches allowed */
	int64_t mb_per_epoch, B, T;
	uint64_t seed; /* the project's: an encoder's masks are drawn from it */
	mb_shape shape;
	int nspans;
	mb_span spans[CL_MAX_FILES];
	char span_sha[CL_MAX_FILES][65]; /* the shard each span was read from */
	int32_t *in, *tgt;               /* B*T each */
	kern_local *local;               /* local mode's inner steps; NULL in sync mode */
	kern_opt_config inner;           /* local mode: the inner optimizer in use */
	/* Local mode: the round's microbatches so far (round_g[round_n]), and
	 * the spans of its earlier work units (past[npast], one per shard),
	 * which the session computes again on the CPU from theta_v when a GPU
	 * fails with the round's inner state on it (gpu_failed_now). */
	int64_t *round_g;
	size_t round_n, round_cap;
	mb_span *past;
	char (*past_sha)[65];
	int npast, past_cap;
	bool inner_cpu_logged; /* kern_local_gpu_off was logged */
	bool round_lost;       /* cl_compute_round_lost */
	/* Sketches of this version's microbatches (cl_compute_sketch_on). */
	uint64_t sk_seed;
	int sk_k;        /* 0: not sketching */
	double *sk_sum;  /* sk_k: the sketch of the gradient sum so far */
	int64_t *sk_g;   /* the stream microbatch of each logged sketch */
	double *sk_vals; /* sk_n rows of sk_k */
	size_t sk_n, sk_cap;
	/* Blocks of bk_b consecutive sketched microbatches, each the gradient
	 * sum's change over it, kept for the check under a second seed
	 * (cl_compute_blocks_on).  bk_start: the sum at the open block's
	 * start, which holds bk_count microbatches from bk_first. */
	int bk_b; /* 0: none kept */
	float *bk_start;
	int64_t bk_first, bk_count;
	cl_block *bk;
	size_t bk_n, bk_cap;
	/* The GPU the model is bound to (-1: the CPU), the project's product
	 * precision there, and whether a GPU failed this session (it then
	 * stays on the CPU). */
	int gpu, precision;
	bool gpu_failed;
	/* On a GPU the gradient sums there between the points (in local mode
	 * until the inner step, kernels/local.h).  In sync mode
	 * that read it (kern_gpu_keep_grads; grads_home brings it into
	 * m->grads): held_g[held_n] are the microbatches it holds, which a GPU
	 * failure makes the session compute again on the CPU, and held_sk the
	 * sketch of the held gradient at the last logged row. */
	int64_t held_g[CL_HELD_MAX];
	size_t held_n;
	double held_sk[SKETCH_K_MAX];
	/* COTRAIN_CHEAT=skip-half (client/cheat.h): the last computed
	 * microbatch's change of the gradient sum, which a faked one adds
	 * again, so that the bytes sent match the copied sketches and only a
	 * spot check of a faked microbatch can tell (fake_have: one was
	 * computed since the sketching began). */
	float *fake_delta;
	bool fake_have;
};

/* The GPU sessions should compute on (cl_compute_use_gpu), and the line
 * that says what computes now (cl_compute_device_text). */
static int want_gpu = -1;
static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;
static char device_text[200] = "CPU";

void cl_compute_use_gpu(int device) { __atomic_store_n(&want_gpu, device, __ATOMIC_RELAXED); }

void cl_compute_device_text(char *buf, size_t n)
{
	pthread_mutex_lock(&device_lock);
	snprintf(buf, n, "%s", device_text);
	pthread_mutex_unlock(&device_lock);
}

static void set_device_text(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_device_text(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	pthread_mutex_lock(&device_lock);
	vsnprintf(device_text, sizeof device_text, fmt, ap);
	pthread_mutex_unlock(&device_lock);
	va_end(ap);
}

/* Microbatch g's tokens into c->in and c->tgt: from the work unit's spans,
 * or (local mode) an earlier unit's of the round. */
static cot_err fill(cl_compute *c, int64_t g, cot_errbuf *eb)
{
	if (g >= c->lo && g < c->hi)
		return mb_fill(&c->shape, c->spans, c->nspans, g, c->in, c->tgt, eb);
	return mb_fill(&c->shape, c->past, c->npast, g, c->in, c->tgt, eb);
}

/* Microbatch g on the CPU, added into the gradient. */
static cot_err cpu_microbatch(cl_compute *c, int64_t g, float *loss, cot_errbuf *eb)
{
	cot_err rc = fill(c, g, eb);
	return rc ? rc
	          : kern_stream_step(c->m, c->in, c->tgt, (int)c->B, c->seed, g, c->mb_per_epoch, (float)c->B,
	                             loss, eb);
}

/* Local mode: room in the round's list for one more microbatch, made
 * before its step so that noting it cannot fail. */
static cot_err round_reserve(cl_compute *c, cot_errbuf *eb)
{
	if (c->round_n < c->round_cap)
		return COT_OK;
	size_t cap = c->round_cap ? 2 * c->round_cap : 256;
	int64_t *r = realloc(c->round_g, cap * sizeof *r);
	if (!r)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the round's microbatch list");
	c->round_g = r;
	c->round_cap = cap;
	return COT_OK;
}

/* Local mode: the microbatch whose gradient was just added, counted by the
 * inner steps (which may take one). */
static cot_err local_step(cl_compute *c, cot_errbuf *eb)
{
	cot_err rc = kern_local_microbatch(c->local, c->m, c->B, eb);
	if (!rc && kern_local_gpu_off(c->local) && !c->inner_cpu_logged) {
		log_warn("GPU %d has no room for the inner optimizer's moments: "
		         "the inner steps run on the CPU",
		         c->gpu);
		c->inner_cpu_logged = true;
	}
	return rc;
}

/* The GPU failed (why): the session computes on the CPU from now on.  In
 * sync mode the microbatches whose gradient the GPU held, lost with it
 * (m->grads never had them), are computed again there; their sketches
 * stay the ones logged: the next row, the sum's change from the CPU's
 * view, takes up the difference.  In local mode the GPU may have held the
 * round's parameters and inner moments too: the round starts over from
 * theta_v and its microbatches so far are computed again on the CPU. */
static cot_err gpu_failed_now(cl_compute *c, const char *why, cot_errbuf *eb)
{
	if (c->local) {
		size_t n = c->round_n;
		log_warn("GPU %d held local mode's round: computing its %zu microbatches again on the CPU",
		         c->gpu, n);
		kern_gpu_unbind(c->m);
		c->gpu = -1;
		c->gpu_failed = true;
		c->held_n = 0;
		set_device_text("CPU (GPU failed: %s)", why);
		kern_local_restart(c->local, c->m);
		c->round_lost = true; /* until every microbatch is in again */
		for (size_t i = 0; i < n; i++) {
			float l;
			cot_err rc = cpu_microbatch(c, c->round_g[i], &l, eb);
			if (!rc)
				rc = local_step(c, eb);
			if (rc)
				return rc;
		}
		c->round_lost = false;
		return COT_OK;
	}
	size_t n = c->held_n;
	if (n)
		log_warn("GPU %d held the gradient of %zu microbatches, lost with it: computing them "
		         "again on the CPU",
		         c->gpu, n);
	kern_gpu_unbind(c->m);
	c->gpu = -1;
	c->gpu_failed = true;
	c->held_n = 0;
	memset(c->held_sk, 0, sizeof c->held_sk);
	set_device_text("CPU (GPU failed: %s)", why);
	for (size_t i = 0; i < n; i++) {
		float l;
		cot_err rc = cpu_microbatch(c, c->held_g[i], &l, eb);
		if (rc)
			return rc;
	}
	return COT_OK;
}

/* The GPU failed `what` (msg says how; it may be eb's own message): one
 * log line, then gpu_failed_now, whose errors eb then holds. */
static cot_err gpu_fault(cl_compute *c, const char *what, const char *msg, cot_errbuf *eb)
{
	char why[sizeof eb->msg];
	snprintf(why, sizeof why, "%s", msg);
	log_warn("GPU %d failed %s: %s; computing on the CPU from now on", c->gpu, what, why);
	eb->msg[0] = eb->hint[0] = '\0';
	return gpu_failed_now(c, why, eb);
}

/* Bring the gradient the GPU holds into m->grads, before anything reads
 * it there. */
static cot_err grads_home(cl_compute *c, cot_errbuf *eb)
{
	if (!c->held_n)
		return COT_OK;
	cot_errbuf e2 = { "", "" };
	if (kern_gpu_grads_home(c->m, &e2))
		return gpu_fault(c, "bringing the gradient home", e2.msg, eb);
	c->held_n = 0;
	memset(c->held_sk, 0, sizeof c->held_sk);
	return COT_OK;
}

/* Bind the session's model to the GPU the daemon wants, or back to the
 * CPU, before a microbatch.  A model the GPU cannot take (an encoder, too
 * large for its memory, no device) stays on the CPU with one log line.
 * The GPU keeps the gradient (kern_gpu_keep_grads; local mode's inner steps
 * run there too, kernels/local.h), but for the cheat hook, which reads it
 * after every microbatch. */
static cot_err gpu_follow(cl_compute *c, cot_errbuf *eb)
{
	int want = __atomic_load_n(&want_gpu, __ATOMIC_RELAXED);
	if (c->gpu_failed)
		want = -1;
	if (want == c->gpu)
		return COT_OK;
	cot_err rc = grads_home(c, eb);
	if (rc || c->gpu_failed)
		return rc;
	cot_errbuf e2 = { "", "" };
	if (c->gpu >= 0 && c->local && kern_local_home(c->local, c->m, &e2))
		return gpu_fault(c, "bringing the round's state home", e2.msg, eb);
	kern_gpu_unbind(c->m);
	c->gpu = -1;
	if (want < 0) {
		set_device_text("CPU");
		return COT_OK;
	}
	if (kern_gpu_bind(c->m, want, c->precision, &e2) ||
	    kern_gpu_keep_grads(c->m, !cl_cheat_skips(), &e2)) {
		log_warn("cannot compute on GPU %d: %s; computing on the CPU", want, e2.msg);
		set_device_text("CPU (GPU %d: %s)", want, e2.msg);
		kern_gpu_unbind(c->m);
		c->gpu_failed = true;
		return COT_OK;
	}
	c->gpu = want;
	char why[200] = "";
	const kern_gpu_api *api = kern_gpu_api_get(why, sizeof why);
	kern_gpu_info info = { .name = "?" };
	if (api)
		api->device_info(want, &info, why, sizeof why);
	log_info("computing on GPU %d (%s), products in %s", want, info.name,
	         kern_precision_name(c->precision));
	set_device_text("GPU %d (%s, %s)", want, info.name, kern_precision_name(c->precision));
	return COT_OK;
}

static void to_config(const cl_project *p, kern_config *c) { *c = p->model; }

int64_t cl_compute_memory_estimate(const cl_project *p)
{
	kern_config c;
	to_config(p, &c);
	if (kern_config_validate(&c, NULL))
		return 0;
	double n = (double)kern_param_count(&c);
	double bt = (double)p->microbatch_size * c.seq_len;
	/* params, grads, two moments; activations: about 16 C and 2 heads*T
	 * floats per token per layer, plus the logits. */
	double acts = bt * (c.n_layer * (16.0 * c.d_model + 2.0 * c.n_head * c.seq_len + 2.0 * c.d_ff) +
	                    2.0 * c.vocab);
	/* local mode: theta_v and the inner moments */
	double local = p->mode.known && strstr(p->mode.json, "\"mode\":\"local\"") ? 3 * n : 0;
	return (int64_t)(4 * (4 * n + local + acts));
}

static void free_spans(cl_compute *c)
{
	for (int i = 0; i < c->nspans; i++)
		free((void *)c->spans[i].tokens);
	c->nspans = 0;
}

static void free_past(cl_compute *c)
{
	for (int i = 0; i < c->npast; i++)
		free((void *)c->past[i].tokens);
	c->npast = 0;
}

/* Local mode, before the next work unit's spans: the current ones join the
 * round's past spans (a shard already there is freed).  Out of memory they
 * are freed: a GPU failure's recomputation of the round then stops at
 * their first microbatch with an error (the unit is handed back). */
static void keep_spans(cl_compute *c)
{
	for (int i = 0; i < c->nspans; i++) {
		bool have = false;
		for (int k = 0; k < c->npast && !have; k++)
			have = strcmp(c->past_sha[k], c->span_sha[i]) == 0;
		if (!have && c->npast == c->past_cap) {
			int cap = c->past_cap ? 2 * c->past_cap : 16;
			mb_span *np = realloc(c->past, (size_t)cap * sizeof *np);
			if (np)
				c->past = np;
			char(*ns)[65] = np ? realloc(c->past_sha, (size_t)cap * sizeof *ns) : NULL;
			if (ns) {
				c->past_sha = ns;
				c->past_cap = cap;
			}
		}
		if (have || c->npast == c->past_cap) {
			free((void *)c->spans[i].tokens);
			continue;
		}
		c->past[c->npast] = c->spans[i];
		memcpy(c->past_sha[c->npast], c->span_sha[i], sizeof c->past_sha[0]);
		c->npast++;
	}
	c->nspans = 0;
}

/* Free the kept blocks and stop keeping them. */
static void blocks_drop(cl_compute *c)
{
	for (size_t i = 0; i < c->bk_n; i++)
		free(c->bk[i].grad);
	free(c->bk);
	free(c->bk_start);
	c->bk = NULL;
	c->bk_start = NULL;
	c->bk_n = c->bk_cap = 0;
	c->bk_b = 0;
	c->bk_count = 0;
}

/* Close the open block (when it holds microbatches): its gradient, the sum
 * now minus the sum at its start, joins the kept ones, and the next block
 * starts here.  Out of memory, the version keeps no blocks (logged; the
 * check under the second seed then finds them missing and denies the
 * round): the training goes on. */
static cot_err block_close(cl_compute *c, cot_errbuf *eb)
{
	if (!c->bk_b || !c->bk_count)
		return COT_OK;
	cot_err rc = grads_home(c, eb);
	if (rc)
		return rc;
	size_t n = c->m->n_params;
	if (c->bk_n == c->bk_cap) {
		size_t cap = c->bk_cap ? 2 * c->bk_cap : 16;
		cl_block *nb = realloc(c->bk, cap * sizeof *nb);
		if (!nb)
			goto nomem;
		c->bk = nb;
		c->bk_cap = cap;
	}
	float *g = malloc((n ? n : 1) * sizeof *g);
	if (!g)
		goto nomem;
	const float *now = c->m->grads;
	for (size_t i = 0; i < n; i++) {
		g[i] = now[i] - c->bk_start[i];
		c->bk_start[i] = now[i];
	}
	c->bk[c->bk_n++] = (cl_block){ .first = c->bk_first, .count = c->bk_count, .grad = g };
	c->bk_count = 0;
	return COT_OK;
nomem:
	log_warn("out of memory for the gradient blocks kept for the check under a second seed: this "
	         "version keeps none");
	blocks_drop(c);
	return COT_OK;
}

/* Before microbatch g joins the gradient sum: a block holds consecutive
 * microbatches only, so the open block closes when g does not follow it. */
static cot_err block_before(cl_compute *c, int64_t g, cot_errbuf *eb)
{
	if (c->bk_b && c->bk_count && g != c->bk_first + c->bk_count)
		return block_close(c, eb);
	return COT_OK;
}

/* Microbatch g joined the gradient sum: count it in the open block, which
 * closes when it holds bk_b. */
static cot_err block_after(cl_compute *c, int64_t g, cot_errbuf *eb)
{
	if (!c->bk_b)
		return COT_OK;
	if (!c->bk_count)
		c->bk_first = g;
	if (++c->bk_count >= c->bk_b)
		return block_close(c, eb);
	return COT_OK;
}

void cl_compute_close(cl_compute *c)
{
	if (!c)
		return;
	free_spans(c);
	free_past(c);
	free(c->past);
	free(c->past_sha);
	free(c->round_g);
	kern_local_free(c->local);
	kern_model_free(c->m);
	free(c->in);
	free(c->tgt);
	free(c->sk_sum);
	free(c->sk_g);
	free(c->sk_vals);
	free(c->fake_delta);
	blocks_drop(c);
	free(c);
}

/* Load the shards of work unit w into c's spans (replacing any) and check
 * that they hold every token of its range [lo, keep_hi). */
static cot_err load_range(cl_compute *c, const cl_work *w, const char *cache_dir, cot_errbuf *eb)
{
	if (c->local)
		keep_spans(c);
	else
		free_spans(c);
	c->lo = w->lo;
	c->hi = w->keep_hi;
	cot_errbuf e2 = { "", "" };
	cot_err rc;
	for (int i = 0; i < w->nfiles; i++) {
		const cl_file *f = &w->files[i];
		if (strcmp(f->kind, "shard") != 0 && f->kind[0] != '\0')
			continue;
		char path[PATH_MAX];
		rc = fs_path(cache_dir, f->sha256, path, sizeof path, eb);
		if (rc)
			return rc;
		shard_meta meta;
		mb_span *s = &c->spans[c->nspans];
		unsigned char *tokens = NULL;
		rc = shard_read(path, SHARD_TOKENS_MAX, &meta, &tokens, &e2);
		if (rc)
			return cot_seterr(eb, rc == COT_ERR_NOMEM ? rc : COT_ERR_CORRUPT,
			                  "could not read shard %s: %s", f->sha256, e2.msg);
		s->tokens = tokens;
		s->first = meta.first_token;
		s->n = meta.n_tokens;
		s->width = meta.width;
		snprintf(c->span_sha[c->nspans], sizeof c->span_sha[0], "%s", f->sha256);
		c->nspans++;
	}
	/* Every token the range needs must be there: an impossible work unit
	 * is refused before any compute. */
	int64_t n = c->hi - c->lo;
	for (int64_t k = 0; k < n && k < c->mb_per_epoch; k++)
		if (mb_fill(&c->shape, c->spans, c->nspans, c->lo + k, NULL, NULL, &e2))
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "the shards of work unit %lld do not hold the tokens of microbatch "
			                  "%lld",
			                  (long long)w->id, (long long)(c->lo + k));
	return COT_OK;
}

/* The inner optimizer of work unit w of project p into *inner: the one in
 * force at the unit's version, which the server sends with the unit (a
 * project update may change it from a version on, doc/project-file.md),
 * else the project's own. */
static cot_err unit_inner(const cl_project *p, const cl_work *w, kern_opt_config *inner, cot_errbuf *eb)
{
	char unit_opt[CL_WORK_OPT_MAX + 32];
	snprintf(unit_opt, sizeof unit_opt, "{\"optimizer\": %s}", w->optimizer);
	return kern_opt_config_from_json(w->optimizer[0] ? unit_opt : p->mode.json, inner, eb);
}

/* Field by field (a struct's padding is not compared). */
static bool same_opt(const kern_opt_config *a, const kern_opt_config *b)
{
	return a->kind == b->kind && a->lr == b->lr && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
	       a->eps == b->eps && a->weight_decay == b->weight_decay && a->clip_norm == b->clip_norm &&
	       a->warmup_steps == b->warmup_steps && a->total_steps == b->total_steps &&
	       a->decay == b->decay && a->min_lr_ratio == b->min_lr_ratio;
}

/* Local mode's inner state for c's model, when the project trains so, with
 * the inner optimizer of unit w (unit_inner). */

static cot_err open_local(cl_compute *c, const cl_project *p, const cl_work *w, cot_errbuf *eb)
{
	if (!p->mode.known)
		return cot_seterr(eb, COT_ERR_INVALID, "the training mode of project \"%s\" is not known yet",
		                  p->name);
	kern_mode_config mc;
	kern_opt_config inner;
	cot_errbuf e2 = { "", "" };
	if (kern_mode_config_from_json(p->mode.json, &mc, &e2) || unit_inner(p, w, &inner, &e2))
		return cot_seterr(eb, COT_ERR_INVALID, "project \"%s\" has unusable training settings: %s",
		                  p->name, e2.msg);
	if (mc.mode != KERN_MODE_LOCAL)
		return COT_OK;
	cot_err rc = kern_local_new(c->m, &inner, mc.inner_batch, &c->local, eb);
	if (rc)
		return rc;
	c->inner = inner;
	kern_local_begin(c->local, c->m);
	return COT_OK;
}

cot_err cl_compute_open(const cl_project *p, const cl_work *w, const char *cache_dir, cl_compute **out,
                        cot_errbuf *eb)
{
	*out = NULL;
	kern_config kc;
	to_config(p, &kc);
	cot_errbuf e2 = { "", "" };
	if (kern_config_validate(&kc, &e2))
		return cot_seterr(eb, COT_ERR_INVALID, "project \"%s\" has an unusable model: %s", p->name,
		                  e2.msg);
	if (kc.seq_len != p->seq_len || p->microbatch_size < 1 || p->microbatch_size > 65536 ||
	    p->mb_per_epoch < 1)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "work unit %lld does not fit project \"%s\": seq_len %lld, microbatch size "
		                  "%lld",
		                  (long long)w->id, p->name, (long long)p->seq_len,
		                  (long long)p->microbatch_size);
	cl_compute *c = calloc(1, sizeof *c);
	if (!c)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	c->gpu = -1;
	kern_mode_config mc;
	c->precision = kern_mode_config_from_json(p->mode.json, &mc, &e2) ? KERN_PREC_FP32 : mc.precision;
	c->mb_per_epoch = p->mb_per_epoch;
	c->B = p->microbatch_size;
	c->T = p->seq_len;
	c->seed = (uint64_t)p->seed;
	c->shape = (mb_shape){ .mb_per_epoch = c->mb_per_epoch, .B = c->B, .T = c->T };
	cot_err rc = mb_shape_check(&c->shape, eb);
	if (rc) {
		free(c);
		return rc;
	}
	c->in = malloc(sizeof *c->in * (size_t)(c->B * c->T));
	c->tgt = malloc(sizeof *c->tgt * (size_t)(c->B * c->T));
	if (!c->in || !c->tgt) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the batch");
		goto fail;
	}
	const cl_file *ckpt = NULL;
	for (int i = 0; i < w->nfiles; i++) {
		const cl_file *f = &w->files[i];
		if (strcmp(f->kind, "checkpoint") != 0)
			continue;
		char path[PATH_MAX];
		rc = fs_path(cache_dir, f->sha256, path, sizeof path, eb);
		if (rc)
			goto fail;
		ckpt = f;
		rc = ckpt_load_new(path, (int)c->B, &c->m, &e2);
		if (rc) {
			rc = cot_seterr(eb, rc == COT_ERR_NOMEM ? rc : COT_ERR_CORRUPT,
			                "could not load checkpoint %s: %s", f->sha256, e2.msg);
			goto fail;
		}
		kern_config got = c->m->config;
		if (memcmp(&got, &kc, sizeof kc) != 0) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "checkpoint %s does not hold the project's model", f->sha256);
			goto fail;
		}
		if (c->m->step != w->version) {
			rc = cot_seterr(eb, COT_ERR_INVALID,
			                "checkpoint %s has taken %ld steps, not %lld (the work unit's "
			                "version)",
			                f->sha256, c->m->step, (long long)w->version);
			goto fail;
		}
		break;
	}
	if (!ckpt) {
		rc = kern_model_create(&kc, (int)c->B, &c->m, &e2);
		if (rc) {
			rc = cot_seterr(eb, rc, "could not create the model: %s", e2.msg);
			goto fail;
		}
		kern_model_init(c->m, (uint64_t)p->seed);
	}
	rc = load_range(c, w, cache_dir, eb);
	if (rc)
		goto fail;
	kern_zero_grad(c->m);
	rc = open_local(c, p, w, eb);
	if (rc)
		goto fail;
	*out = c;
	return COT_OK;
fail:
	cl_compute_close(c);
	return rc;
}

cot_err cl_compute_retarget(cl_compute *c, const cl_project *p, const cl_work *w, const char *cache_dir,
                            cot_errbuf *eb)
{
	/* A block never spans two units: a spot check recomputes one block of
	 * one unit (doc/credit.md).  (First the gradient home: a GPU failing
	 * then computes its microbatches again from this unit's tokens.) */
	cot_err rc = grads_home(c, eb);
	if (!rc)
		rc = block_close(c, eb);
	if (rc)
		return rc;
	/* A session goes on across versions: the unit of a later version may
	 * bring another inner optimizer (a project update). */
	if (c->local) {
		kern_opt_config inner;
		cot_errbuf e2 = { "", "" };
		if (unit_inner(p, w, &inner, &e2))
			return cot_seterr(eb, COT_ERR_INVALID, "work unit %lld has an unusable optimizer: %s",
			                  (long long)w->id, e2.msg);
		if (!same_opt(&inner, &c->inner)) {
			rc = kern_local_set_inner(c->local, &inner, eb);
			if (rc)
				return rc;
			c->inner = inner;
		}
	}
	rc = load_range(c, w, cache_dir, eb);
	if (rc)
		c->hi = c->lo; /* nothing may be computed from a half-loaded range */
	return rc;
}

cot_err cl_compute_model(cl_compute *c, kern_model **out, cot_errbuf *eb)
{
	cot_err rc = grads_home(c, eb);
	*out = rc ? NULL : c->m;
	return rc;
}

/* Log row for microbatch g: its sketch, out of the new gradient sum's
 * sketch minus the previous one (or, fake, a copy of the last row, which
 * cl_compute_fake_microbatch added to the sum). */
static cot_err sketch_log(cl_compute *c, int64_t g, int fake, cot_errbuf *eb)
{
	if (c->sk_n == c->sk_cap) {
		size_t cap = c->sk_cap ? 2 * c->sk_cap : 64;
		int64_t *ng = realloc(c->sk_g, cap * sizeof *ng);
		if (ng)
			c->sk_g = ng;
		double *nv = ng ? realloc(c->sk_vals, cap * (size_t)c->sk_k * sizeof *nv) : NULL;
		if (!nv)
			return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the microbatch sketches");
		c->sk_vals = nv;
		c->sk_cap = cap;
	}
	int k = c->sk_k;
	double *row = c->sk_vals + c->sk_n * (size_t)k;
	if (fake) {
		for (int j = 0; j < k; j++) {
			row[j] = c->sk_n ? row[j - k] : 0;
			c->sk_sum[j] += row[j];
		}
	} else {
		double now[SKETCH_K_MAX] = { 0 };
		cot_errbuf e2 = { "", "" };
		if (c->held_n && !kern_gpu_sketch_held(c->m, c->sk_seed, k, now, &e2)) {
			/* m->grads did not change: the sum's change is the held
			 * gradient's, sketched on the GPU */
			for (int j = 0; j < k; j++) {
				row[j] = now[j] - c->held_sk[j];
				c->held_sk[j] = now[j];
				c->sk_sum[j] += row[j];
			}
		} else {
			cot_err rc = c->held_n ? gpu_fault(c, "sketching the gradient", e2.msg, eb) : COT_OK;
			if (rc)
				return rc;
			sketch_add(c->m->grads, c->m->n_params, 0, c->sk_seed, k, now);
			for (int j = 0; j < k; j++) {
				row[j] = now[j] - c->sk_sum[j];
				c->sk_sum[j] = now[j];
			}
		}
	}
	c->sk_g[c->sk_n++] = g;
	return COT_OK;
}

cot_err cl_compute_microbatch(cl_compute *c, int64_t g, float *loss, cot_errbuf *eb)
{
	if (g < c->lo || g >= c->hi)
		return cot_seterr(eb, COT_ERR_INVALID, "microbatch %lld is outside [%lld, %lld)",
		                  (long long)g, (long long)c->lo, (long long)c->hi);
	cot_err rc = c->sk_k ? block_before(c, g, eb) : COT_OK;
	if (!rc)
		rc = gpu_follow(c, eb);
	if (!rc)
		rc = mb_fill(&c->shape, c->spans, c->nspans, g, c->in, c->tgt, eb);
	if (rc)
		return rc;
	size_t n = c->m->n_params;
	if (c->sk_k && cl_cheat_skips() && !c->fake_delta &&
	    !(c->fake_delta = malloc((n ? n : 1) * sizeof *c->fake_delta)))
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (c->fake_delta)
		memcpy(c->fake_delta, c->m->grads, n * sizeof *c->fake_delta);
	if (c->local && (rc = round_reserve(c, eb)))
		return rc;
	float l = 0;
	rc = kern_stream_step(c->m, c->in, c->tgt, (int)c->B, c->seed, g, c->mb_per_epoch, (float)c->B, &l,
	                      eb);
	bool stepped = !rc;
	if (stepped && c->local)
		c->round_g[c->round_n++] = g;
	else if (stepped && kern_gpu_holds_grads(c->m))
		c->held_g[c->held_n++] = g;
	if (stepped && c->gpu >= 0 && fault_point("gpu-step", (int64_t)c->m->step))
		rc = cot_seterr(eb, COT_ERR_IO, "a device fault injected by the fault point gpu-step");
	if (!rc && c->local)
		rc = local_step(c, eb);
	if (rc && c->gpu >= 0 && (rc == COT_ERR_NOMEM || rc == COT_ERR_IO)) {
		/* The GPU failed (out of its memory, a device fault), in the
		 * step or in an inner step.  A failed step added nothing to
		 * m->grads, and what the GPU held is lost with it: the held
		 * microbatches (local mode: the round's), and this one when its
		 * step failed, are computed again on the CPU, and the session
		 * stays there.  (A step that succeeded is in m->grads, held, or
		 * in the round's list.) */
		char what[64];
		snprintf(what, sizeof what, "on microbatch %lld", (long long)g);
		rc = gpu_fault(c, what, eb->msg, eb);
		if (!rc && !stepped)
			rc = cpu_microbatch(c, g, &l, eb);
		if (!rc && !stepped && c->local) {
			c->round_g[c->round_n++] = g; /* room reserved above */
			rc = local_step(c, eb);
		}
	}
	if (!rc && c->fake_delta) {
		for (size_t i = 0; i < n; i++)
			c->fake_delta[i] = c->m->grads[i] - c->fake_delta[i];
		c->fake_have = true;
	}
	if (!rc && c->sk_k)
		rc = sketch_log(c, g, 0, eb);
	if (!rc && c->sk_k)
		rc = block_after(c, g, eb);
	/* bounds what a GPU failure makes the CPU compute again */
	if (!rc && c->held_n == CL_HELD_MAX)
		rc = grads_home(c, eb);
	if (loss)
		*loss = l;
	return rc;
}

cot_err cl_compute_fake_microbatch(cl_compute *c, int64_t g, cot_errbuf *eb)
{
	if (g < c->lo || g >= c->hi)
		return cot_seterr(eb, COT_ERR_INVALID, "microbatch %lld is outside [%lld, %lld)",
		                  (long long)g, (long long)c->lo, (long long)c->hi);
	if (!c->sk_k)
		return COT_OK;
	cot_err rc = block_before(c, g, eb);
	if (rc)
		return rc;
	if (c->sk_n && c->fake_have)
		for (size_t i = 0; i < c->m->n_params; i++)
			c->m->grads[i] += c->fake_delta[i];
	rc = sketch_log(c, g, 1, eb);
	if (!rc)
		rc = block_after(c, g, eb);
	return rc;
}

cot_err cl_compute_blocks_on(cl_compute *c, int b, cot_errbuf *eb)
{
	if (c->local || !c->sk_k || b <= 0 || c->bk_b == b)
		return COT_OK;
	if (b > CL_BLOCK_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "a block has at most %d microbatches, not %d",
		                  CL_BLOCK_MAX, b);
	if (c->bk_b) {
		/* The project's target or check size changed mid-version: blocks
		 * are named by their first microbatch and count, so the next ones
		 * take the new size (the open block closes once it holds b). */
		c->bk_b = b;
		return COT_OK;
	}
	cot_err rc = grads_home(c, eb);
	if (rc)
		return rc;
	size_t n = c->m->n_params;
	if (!(c->bk_start = malloc((n ? n : 1) * sizeof *c->bk_start)))
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the kept blocks");
	/* The gradient may hold microbatches already: blocks start from here
	 * (and then do not add up to it; the caller compares the counts). */
	memcpy(c->bk_start, c->m->grads, n * sizeof *c->bk_start);
	c->bk_b = b;
	c->bk_count = 0;
	return COT_OK;
}

void cl_compute_take_blocks(cl_compute *c, cl_block **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	if (!c->bk_b)
		return;
	cot_errbuf eb = { "", "" };
	if (block_close(c, &eb)) {
		/* cl_compute_model brought the gradient home first: only a GPU
		 * failing, its microbatches then failing on the CPU, lands here */
		log_warn("the gradient blocks kept for the check under a second seed are lost: %s", eb.msg);
		blocks_drop(c);
	}
	if (!c->bk_b)
		return; /* out of memory: none kept */
	*out = c->bk;
	*n = c->bk_n;
	c->bk = NULL;
	c->bk_n = c->bk_cap = 0;
	blocks_drop(c);
}

void cl_blocks_free(cl_block *b, size_t n)
{
	for (size_t i = 0; b && i < n; i++)
		free(b[i].grad);
	free(b);
}

cot_err cl_compute_sketch_on(cl_compute *c, uint64_t seed, int k, cot_errbuf *eb)
{
	if (c->local || k <= 0)
		return COT_OK;
	if (c->sk_k == k && c->sk_seed == seed)
		return COT_OK;
	if (k > SKETCH_K_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "a sketch has at most %d values, not %d", SKETCH_K_MAX,
		                  k);
	if (c->sk_n)
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "this version's microbatches are sketched under another seed already");
	cot_err rc = grads_home(c, eb);
	if (rc)
		return rc;
	double *sum = calloc((size_t)k, sizeof *sum);
	if (!sum)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	free(c->sk_sum);
	free(c->sk_vals);
	c->sk_vals = NULL;
	c->sk_cap = 0;
	c->sk_sum = sum;
	c->sk_seed = seed;
	c->sk_k = k;
	/* The gradient may hold microbatches already: start from its sketch. */
	sketch_add(c->m->grads, c->m->n_params, 0, seed, k, c->sk_sum);
	return COT_OK;
}

cot_err cl_compute_sketches(const cl_compute *c, int64_t g, int64_t n, double *out, cot_errbuf *eb)
{
	for (int64_t i = 0; i < n; i++) {
		size_t r = c->sk_n;
		while (r > 0 && c->sk_g[r - 1] != g + i)
			r--;
		if (!r)
			return cot_seterr(eb, COT_ERR_NOT_FOUND, "microbatch %lld was not sketched",
			                  (long long)(g + i));
		memcpy(out + i * c->sk_k, c->sk_vals + (r - 1) * (size_t)c->sk_k,
		       (size_t)c->sk_k * sizeof *out);
	}
	return COT_OK;
}

int cl_compute_sketch_k(const cl_compute *c) { return c ? c->sk_k : 0; }

uint64_t cl_compute_sketch_seed(const cl_compute *c) { return c ? c->sk_seed : 0; }

int cl_compute_is_local(const cl_compute *c) { return c && c->local; }

int cl_compute_round_lost(const cl_compute *c) { return c && c->round_lost; }

cot_err cl_compute_finish(cl_compute *c, int64_t *samples, cot_errbuf *eb)
{
	if (samples)
		*samples = 0;
	if (!c->local)
		return COT_OK;
	if (c->round_lost)
		return cot_seterr(eb, COT_ERR_IO, "this round's inner state was lost with a failed GPU");
	cot_err rc = kern_local_finish(c->local, c->m, samples, eb);
	if (rc && c->gpu >= 0 && (rc == COT_ERR_NOMEM || rc == COT_ERR_IO)) {
		rc = gpu_fault(c, "ending the round", eb->msg, eb);
		if (!rc)
			rc = kern_local_finish(c->local, c->m, samples, eb);
	}
	return rc;
}

void cl_compute_next_version(cl_compute *c)
{
	/* The next version's microbatches are sketched under its own seed. */
	c->sk_k = 0;
	c->sk_n = 0;
	blocks_drop(c); /* what cl_compute_take_blocks did not take */
	/* the held gradient is the last version's: taken off the GPU and
	 * zeroed with the rest */
	c->held_n = 0;
	memset(c->held_sk, 0, sizeof c->held_sk);
	/* nor is the last round's to be computed again */
	c->round_n = 0;
	cot_errbuf eb = { "", "" };
	if (kern_gpu_grads_home(c->m, &eb))
		gpu_fault(c, "bringing the gradient home", eb.msg, &eb);
	if (c->local) {
		kern_local_begin(c->local, c->m); /* zeroes the gradient too */
		c->round_lost = false;
		free_past(c);
	} else
		kern_zero_grad(c->m);
}
