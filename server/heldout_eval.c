/* cotrain-server: held-out evaluation (see heldout_eval.h). */
#include "server/heldout_eval.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/checkpoint.h"
#include "kernels/encoder.h"
#include "kernels/masking.h"
#include "kernels/model.h"
#include "server/dbconn.h"
#include "server/duty.h"
#include "shared/common/filestore.h"
#include "shared/common/log.h"
#include "shared/common/microbatch.h"
#include "shared/common/shard.h"

#define IOPRIO_CLASS_SHIFT 13
#define IOPRIO_CLASS_IDLE 3
#define IOPRIO_WHO_PROCESS 1

/* The bits per token of the GPT m (seq_len T, created for HEVAL_BATCH). */
static cot_err gpt_bpb(kern_model *m, const int32_t *tokens, int64_t n_seq, int T, double *bpb,
                       cot_errbuf *eb)
{
	cot_err rc = COT_OK;
	int32_t *in = malloc((size_t)HEVAL_BATCH * (size_t)T * sizeof *in);
	int32_t *tgt = malloc((size_t)HEVAL_BATCH * (size_t)T * sizeof *tgt);
	if (!in || !tgt)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the held-out batch");
	double sum = 0;
	for (int64_t s0 = 0; !rc && s0 < n_seq; s0 += HEVAL_BATCH) {
		int B = n_seq - s0 < HEVAL_BATCH ? (int)(n_seq - s0) : HEVAL_BATCH;
		/* [B, T] inputs and their next tokens, sample-major */
		for (int b = 0; b < B; b++)
			for (int t = 0; t < T; t++) {
				size_t at = (size_t)(s0 + b) * (size_t)T + (size_t)t;
				in[(size_t)b * T + t] = tokens[at];
				tgt[(size_t)b * T + t] = tokens[at + 1];
			}
		float loss = 0;
		if ((rc = kern_forward(m, in, tgt, B, &loss, eb)))
			break;
		if (!isfinite(loss))
			rc = cot_seterr(eb, COT_ERR_INVALID, "the held-out loss is not finite");
		sum += (double)loss * (double)B * (double)T;
	}
	if (!rc)
		*bpb = sum / ((double)n_seq * (double)T) / log(2.0);
	free(in);
	free(tgt);
	return rc;
}

/* The masked-LM figures of the encoder m (seq_len T, created for
 * HEVAL_BATCH) into r. */
static cot_err enc_mlm(kern_model *m, const int32_t *tokens, int64_t n_seq, int T, heval_result *r,
                       cot_errbuf *eb)
{
	cot_err rc = COT_OK;
	size_t n = (size_t)HEVAL_BATCH * (size_t)T;
	int32_t *ids = malloc(n * sizeof *ids), *seg = malloc(n * sizeof *seg);
	int32_t *lab = malloc(n * sizeof *lab), sop[HEVAL_BATCH];
	if (!ids || !seg || !lab)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the held-out batch");
	double sum = 0;
	int64_t predicted = 0, correct = 0;
	for (int64_t s0 = 0; !rc && s0 < n_seq; s0 += HEVAL_BATCH) {
		int B = n_seq - s0 < HEVAL_BATCH ? (int)(n_seq - s0) : HEVAL_BATCH;
		/* each sequence its own key, so the masks do not depend on B */
		for (int b = 0; !rc && b < B; b++) {
			size_t o = (size_t)b * T;
			rc = kern_mask_build(&m->config, HEVAL_MASK_SEED, 0, s0 + b, 1,
			                     tokens + (size_t)(s0 + b) * (size_t)T, (size_t)T, ids + o,
			                     seg + o, lab + o, sop + b, eb);
		}
		kern_enc_batch batch = { ids, seg, lab, sop, NULL };
		kern_enc_result res;
		if (rc || (rc = kern_enc_forward(m, &batch, B, &res, eb)))
			break;
		if (!isfinite(res.mlm_loss))
			rc = cot_seterr(eb, COT_ERR_INVALID, "the held-out masked-LM loss is not finite");
		sum += res.mlm_loss * (double)res.n_predicted;
		predicted += res.n_predicted;
		correct += res.mlm_correct;
	}
	if (!rc && predicted < 1)
		rc = cot_seterr(eb, COT_ERR_INVALID, "the held-out sample has no token to predict");
	if (!rc) {
		r->mlm_loss = sum / (double)predicted;
		r->mlm_accuracy = (double)correct / (double)predicted;
		r->counted = predicted;
	}
	free(ids);
	free(seg);
	free(lab);
	return rc;
}

/* The checkpoint at ckpt_path, checked against T and n_seq, into *out. */
static cot_err load_for_eval(const char *ckpt_path, int64_t n_seq, int T, kern_model **out, cot_errbuf *eb)
{
	if (n_seq < 1 || T < 1)
		return cot_seterr(eb, COT_ERR_INVALID, "no held-out sequence to evaluate");
	kern_model *m = NULL;
	cot_err rc = ckpt_load_new(ckpt_path, HEVAL_BATCH, &m, eb);
	if (rc)
		return rc;
	if (m->config.seq_len != T) {
		rc = cot_seterr(eb, COT_ERR_INVALID, "checkpoint \"%s\" has seq_len %d, the project %d",
		                ckpt_path, m->config.seq_len, T);
		kern_model_free(m);
		return rc;
	}
	*out = m;
	return COT_OK;
}

cot_err heval_bpb(const char *ckpt_path, const int32_t *tokens, int64_t n_seq, int T, double *bpb,
                  cot_errbuf *eb)
{
	kern_model *m = NULL;
	cot_err rc = load_for_eval(ckpt_path, n_seq, T, &m, eb);
	if (rc)
		return rc;
	if (m->config.arch != KERN_ARCH_GPT)
		rc = cot_seterr(eb, COT_ERR_UNSUPPORTED,
		                "bits per token is a next-token measure, not one of a %s model",
		                kern_arch_name(m->config.arch));
	else
		rc = gpt_bpb(m, tokens, n_seq, T, bpb, eb);
	kern_model_free(m);
	return rc;
}

cot_err heval_checkpoint(const char *ckpt_path, const int32_t *tokens, int64_t n_seq, int T,
                         heval_result *out, cot_errbuf *eb)
{
	kern_model *m = NULL;
	cot_err rc = load_for_eval(ckpt_path, n_seq, T, &m, eb);
	if (rc)
		return rc;
	memset(out, 0, sizeof *out);
	out->arch = m->config.arch;
	if (m->config.arch == KERN_ARCH_GPT) {
		rc = gpt_bpb(m, tokens, n_seq, T, &out->bpb, eb);
		out->counted = n_seq * T;
	} else {
		rc = enc_mlm(m, tokens, n_seq, T, out, eb);
	}
	kern_model_free(m);
	return rc;
}

/* ---- the thread -------------------------------------------------------- */

struct heval {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stop;
	const srv_config *cfg;
	duty *duty; /* DUTY_HELDOUT: only its holder evaluates */
	/* The last sample read: its dataset, first token and length. */
	long long cache_dataset;
	uint64_t cache_first, cache_len;
	int32_t *cache;     /* cache_len tokens */
	bool cache_subword; /* its dataset's tokenizer is not the byte one */
};

static const dbc_stmt st_next = { "heldout_next", "SELECT * FROM heldout_next()", 0 };
static const dbc_stmt st_store = { "heldout_store", "SELECT heldout_store($1, $2, $3, $4, $5, $6)", 6 };
static const dbc_stmt st_store_mlm = { "heldout_store_mlm",
	                               "SELECT heldout_store_mlm($1, $2, $3, $4, $5, $6, $7)", 7 };
static const dbc_stmt st_shards = { "heldout_shards",
	                            "SELECT first_token, n_tokens, sha256 FROM shard"
	                            " WHERE dataset_id = $1 AND first_token < $3 AND first_token + n_tokens "
	                            "> $2"
	                            " ORDER BY first_token",
	                            3 };

/* SCHED_IDLE, nice 19 and the idle I/O class for the calling thread; what
 * the system refuses (an unprivileged container and the I/O class) is
 * logged at debug and left. */
static void make_idle(void)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);
	struct sched_param sp = { .sched_priority = 0 };
	if (sched_setscheduler(tid, SCHED_IDLE, &sp) < 0)
		log_debug("held-out evaluation: could not set SCHED_IDLE: %s", strerror(errno));
	if (setpriority(PRIO_PROCESS, (id_t)tid, 19) < 0)
		log_debug("held-out evaluation: could not set nice 19: %s", strerror(errno));
	if (syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) < 0)
		log_debug("held-out evaluation: could not set the idle I/O class: %s", strerror(errno));
}

/* Tokens [first, first + len) of dataset `dataset` into h->cache, from the
 * shards in the store (each checked by shard_read).  Kept for the next
 * version of the same project. */
static cot_err load_sample(heval *h, long long dataset, uint64_t first, uint64_t len, cot_errbuf *eb)
{
	if (h->cache && h->cache_dataset == dataset && h->cache_first == first && h->cache_len == len)
		return COT_OK;
	free(h->cache);
	h->cache = malloc(len * sizeof *h->cache);
	h->cache_len = 0;
	if (!h->cache)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the held-out sample");
	char ds[24], a[24], b[24];
	snprintf(ds, sizeof ds, "%lld", dataset);
	snprintf(a, sizeof a, "%" PRIu64, first);
	snprintf(b, sizeof b, "%" PRIu64, first + len);
	const char *params[] = { ds, a, b };
	PGresult *r;
	char state[6];
	cot_err rc = dbc_exec(&st_shards, params, &r, state, eb);
	if (rc)
		return rc;
	uint64_t got = 0;
	for (int i = 0; !rc && i < PQntuples(r); i++) {
		char path[4300];
		shard_meta meta;
		unsigned char *tok = NULL;
		if ((rc = fs_path(h->cfg->files_dir, PQgetvalue(r, i, 2), path, sizeof path, eb)) ||
		    (rc = shard_read(path, SHARD_TOKENS_MAX, &meta, &tok, eb)))
			break;
		/* the part of [meta.first, +n) inside [first, first + len) */
		uint64_t lo = meta.first_token > first ? meta.first_token : first;
		uint64_t hi = meta.first_token + meta.n_tokens < first + len
		                      ? meta.first_token + meta.n_tokens
		                      : first + len;
		if (lo < hi) {
			mb_span sp = { meta.first_token, meta.n_tokens, tok, meta.width };
			for (uint64_t pos = lo; pos < hi; pos++)
				h->cache[pos - first] = mb_token_at(&sp, 1, pos);
			got += hi - lo;
			h->cache_subword = meta.width > 1;
		}
		free(tok);
	}
	PQclear(r);
	if (!rc && got != len)
		rc = cot_seterr(eb, COT_ERR_CORRUPT,
		                "the shards of dataset %lld hold %" PRIu64 " of the %" PRIu64
		                " held-out tokens from token %" PRIu64,
		                dataset, got, len, first);
	if (rc)
		return rc;
	h->cache_dataset = dataset;
	h->cache_first = first;
	h->cache_len = len;
	return COT_OK;
}

static double thread_cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Evaluate one version when one waits; false when there was none (or the
 * database could not be asked). */
static bool eval_one(heval *h)
{
	PGresult *r;
	char state[6];
	cot_errbuf eb = { 0 };
	if (dbc_exec(&st_next, NULL, &r, state, &eb)) {
		log_warn("held-out evaluation: %s", eb.msg);
		return false;
	}
	if (PQntuples(r) == 0) {
		PQclear(r);
		return false;
	}
	char project_id[24], project[80], version[16], sha[FS_SHA_HEX_LEN + 1];
	snprintf(project_id, sizeof project_id, "%s", PQgetvalue(r, 0, 0));
	snprintf(project, sizeof project, "%s", PQgetvalue(r, 0, 1));
	snprintf(version, sizeof version, "%s", PQgetvalue(r, 0, 2));
	snprintf(sha, sizeof sha, "%s", PQgetvalue(r, 0, 3));
	long long dataset = atoll(PQgetvalue(r, 0, 4));
	uint64_t first = strtoull(PQgetvalue(r, 0, 5), NULL, 10);
	int T = atoi(PQgetvalue(r, 0, 6));
	int64_t n_seq = atoll(PQgetvalue(r, 0, 7));
	PQclear(r);

	double cpu0 = thread_cpu_seconds();
	heval_result res = { 0 };
	char path[4300];
	cot_err rc = n_seq < 1 ? cot_seterr(&eb, COT_ERR_INVALID, "no held-out sequence to evaluate")
	                       : fs_path(h->cfg->files_dir, sha, path, sizeof path, &eb);
	if (!rc)
		rc = load_sample(h, dataset, first, (uint64_t)n_seq * (uint64_t)T + 1, &eb);
	if (!rc)
		rc = heval_checkpoint(path, h->cache, n_seq, T, &res, &eb);
	double cpu = thread_cpu_seconds() - cpu0;
	if (rc == COT_ERR_DB) /* a database hiccup: try again at the next pass */
		return false;
	/* an error before the checkpoint told its arch goes to the GPT's column,
	 * which holds heldout_error either way */
	bool enc = res.arch != KERN_ARCH_GPT;
	char bs[40], as[40], ts[24], cs[40];
	snprintf(bs, sizeof bs, "%.17g", enc ? res.mlm_loss : res.bpb);
	snprintf(as, sizeof as, "%.17g", res.mlm_accuracy);
	snprintf(ts, sizeof ts, "%" PRId64, rc ? n_seq * T : res.counted);
	snprintf(cs, sizeof cs, "%.6f", cpu);
	const char *params[] = { project_id, version, rc ? NULL : bs, ts, cs, rc ? eb.msg : NULL };
	const char *mparams[] = { project_id, version, rc ? NULL : bs,    rc ? NULL : as,
		                  ts,         cs,      rc ? eb.msg : NULL };
	if (rc)
		log_warn("held-out evaluation: project \"%s\" version %s: %s", project, version, eb.msg);
	else if (enc)
		log_info("held-out evaluation: project \"%s\" version %s: masked-LM loss %.6f, accuracy "
		         "%.4f on %s predicted tokens, %.3f CPU s",
		         project, version, res.mlm_loss, res.mlm_accuracy, ts, cpu);
	else
		log_info("held-out evaluation: project \"%s\" version %s: %.6f bits per %s on %s tokens, "
		         "%.3f CPU s",
		         project, version, res.bpb, h->cache_subword ? "token" : "byte", ts, cpu);
	cot_errbuf eb2 = { 0 };
	if (dbc_exec(enc ? &st_store_mlm : &st_store, enc ? mparams : params, &r, state, &eb2)) {
		log_warn("held-out evaluation: %s", eb2.msg);
		return false;
	}
	PQclear(r);
	return true;
}

static void *run(void *arg)
{
	heval *h = arg;
	make_idle();
	kern_set_threads_here(1);
	pthread_mutex_lock(&h->lock);
	while (!h->stop) {
		pthread_mutex_unlock(&h->lock);
		bool more = duty_held(h->duty) && eval_one(h);
		pthread_mutex_lock(&h->lock);
		if (more)
			continue; /* a backlog: go on at once (stop is checked above) */
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += h->cfg->round_interval > 0 ? h->cfg->round_interval : 2;
		while (!h->stop && pthread_cond_timedwait(&h->wake, &h->lock, &until) == 0)
			;
	}
	pthread_mutex_unlock(&h->lock);
	dbc_close_thread();
	return NULL;
}

cot_err heval_start(const srv_config *cfg, heval **out, cot_errbuf *eb)
{
	heval *h = calloc(1, sizeof *h);
	if (!h)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	h->cfg = cfg;
	cot_err rc = duty_open(cfg->conninfo, DUTY_HELDOUT, &h->duty, eb);
	if (rc) {
		free(h);
		return rc;
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->wake, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&h->lock, NULL);
	if (pthread_create(&h->thread, NULL, run, h)) {
		pthread_cond_destroy(&h->wake);
		pthread_mutex_destroy(&h->lock);
		duty_close(h->duty);
		free(h);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not start the held-out evaluation thread");
	}
	*out = h;
	return COT_OK;
}

void heval_stop(heval *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	h->stop = true;
	pthread_cond_signal(&h->wake);
	pthread_mutex_unlock(&h->lock);
	pthread_join(h->thread, NULL);
	pthread_cond_destroy(&h->wake);
	pthread_mutex_destroy(&h->lock);
	duty_close(h->duty);
	free(h->cache);
	free(h);
}
