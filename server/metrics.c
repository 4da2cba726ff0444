/* cotrain-server: /metrics (see metrics.h). */
#include "server/metrics.h"
#include "server/credit.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "server/apiutil.h"

/* Upper bounds of the latency buckets, seconds (+Inf implied). */
static const double bounds[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 };
#define NB (sizeof bounds / sizeof bounds[0])
static atomic_ullong bucket[NB + 1];
static atomic_ullong sum_us;
static atomic_ullong by_class[6]; /* 1xx..5xx, [0] other */
static atomic_ullong gradient_bytes, checkpoint_bytes;

void metrics_gradient_bytes(unsigned long long n) { atomic_fetch_add(&gradient_bytes, n); }

void metrics_checkpoint_bytes(unsigned long long n) { atomic_fetch_add(&checkpoint_bytes, n); }

static atomic_ullong plan_answers[2]; /* from the database, from the plan cache */

void metrics_plan_answer(bool cached) { atomic_fetch_add(&plan_answers[cached], 1); }

void metrics_observe(int status, double ms)
{
	double s = ms / 1e3;
	size_t i = 0;
	while (i < NB && s > bounds[i])
		i++;
	atomic_fetch_add(&bucket[i], 1);
	atomic_fetch_add(&sum_us, (unsigned long long)(ms * 1e3 + 0.5));
	int c = status / 100;
	atomic_fetch_add(&by_class[c >= 1 && c <= 5 ? c : 0], 1);
}

/* One row per project: name, committed rounds, version, samples of the
 * committed rounds, active hosts, granted credit, open spot checks, speed,
 * the latest held-out bits per byte and its version (NULL before the first
 * evaluation: the gauge is left out), the evaluations' CPU seconds and
 * their count. */
static const dbc_stmt st_metrics = {
	"metrics_projects",
	"SELECT p.name,"
	"       (SELECT count(*) FROM round r WHERE r.project_id = p.id AND r.state = 'committed'),"
	"       p.current_version,"
	"       (SELECT coalesce(sum(r.samples), 0) FROM round r"
	"         WHERE r.project_id = p.id AND r.state = 'committed'),"
	"       (SELECT hosts FROM project_speed(p.id)),"
	"       (SELECT coalesce(sum(g.credit), 0) FROM credit_grant g"
	"         WHERE g.project_id = p.id AND g.status = 'granted'),"
	"       (SELECT count(*) FROM spot_check s WHERE s.project_id = p.id AND s.state = 'open'),"
	"       (SELECT samples_per_sec FROM project_speed(p.id)),"
	"       (SELECT h.heldout_bpb FROM heldout_latest(p.id) h),"
	"       (SELECT h.version FROM heldout_latest(p.id) h),"
	"       (SELECT coalesce(sum(v.heldout_cpu_seconds), 0) FROM model_version v"
	"         WHERE v.project_id = p.id AND v.heldout_at IS NOT NULL),"
	"       (SELECT count(*) FROM model_version v"
	"         WHERE v.project_id = p.id"
	"           AND (v.heldout_bpb IS NOT NULL OR v.heldout_mlm_loss IS NOT NULL)),"
	"       (SELECT h.heldout_mlm_loss FROM heldout_mlm_latest(p.id) h),"
	"       (SELECT h.heldout_mlm_accuracy FROM heldout_mlm_latest(p.id) h),"
	"       (SELECT h.version FROM heldout_mlm_latest(p.id) h)"
	"  FROM project p ORDER BY p.name",
	0
};

typedef struct {
	char *buf;
	size_t len, cap;
	bool oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
	if (b->oom)
		return;
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if (b->len + (size_t)n < b->cap) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = (b->cap + (size_t)n) * 2;
		char *nb = realloc(b->buf, cap);
		if (!nb) {
			b->oom = true;
			return;
		}
		b->buf = nb;
		b->cap = cap;
	}
}

void metrics_get(http_req *req)
{
	PGresult *r = api_exec(req, &st_metrics, NULL, NULL);
	if (!r)
		return;
	sbuf b = { malloc(4096), 0, 4096, false };
	if (!b.buf)
		b.oom = true;
	static const struct {
		const char *name, *type, *help;
		int col;
	} gauges[] = {
		{ "cotrain_rounds_committed_total", "counter", "Rounds committed.", 1 },
		{ "cotrain_model_version", "gauge", "Current model version.", 2 },
		{ "cotrain_samples_committed_total", "counter", "Samples in committed rounds.", 3 },
		{ "cotrain_active_hosts", "gauge", "Hosts with live work units heard from lately.", 4 },
		{ "cotrain_credit_granted_total", "counter", "Credit granted (1 = 4.32e11 FLOPs).", 5 },
		{ "cotrain_spot_checks_open", "gauge", "Spot checks waiting for fingerprints.", 6 },
		{ "cotrain_samples_per_second", "gauge",
		  "Summed speed of the hosts computing now (project_speed).", 7 },
		{ "cotrain_heldout_bits_per_byte", "gauge",
		  "Held-out bits per byte of the newest evaluated model version.", 8 },
		{ "cotrain_heldout_version", "gauge", "Model version of cotrain_heldout_bits_per_byte.", 9 },
		{ "cotrain_heldout_eval_cpu_seconds_total", "counter",
		  "CPU seconds the server spent on held-out evaluations.", 10 },
		{ "cotrain_heldout_evaluations_total", "counter",
		  "Model versions evaluated on held-out data.", 11 },
		{ "cotrain_heldout_mlm_loss", "gauge",
		  "Held-out masked-LM loss (nats) of the newest evaluated version of an encoder.", 12 },
		{ "cotrain_heldout_mlm_accuracy", "gauge",
		  "Held-out masked-LM accuracy (0..1) of the newest evaluated version of an encoder.", 13 },
		{ "cotrain_heldout_mlm_version", "gauge", "Model version of cotrain_heldout_mlm_loss.", 14 },
	};
	for (size_t g = 0; g < sizeof gauges / sizeof gauges[0]; g++) {
		put(&b, "# HELP %s %s\n# TYPE %s %s\n", gauges[g].name, gauges[g].help, gauges[g].name,
		    gauges[g].type);
		for (int i = 0; i < PQntuples(r); i++)
			/* Project names match ^[a-z0-9][a-z0-9-]*$: no label escaping needed.
			 * NULL (no evaluation yet) leaves the sample out. */
			if (!PQgetisnull(r, i, gauges[g].col))
				put(&b, "%s{project=\"%s\"} %s\n", gauges[g].name, PQgetvalue(r, i, 0),
				    PQgetvalue(r, i, gauges[g].col));
	}
	PQclear(r);
	put(&b, "# HELP cotrain_http_request_duration_seconds Time to answer HTTP requests.\n"
	        "# TYPE cotrain_http_request_duration_seconds histogram\n");
	unsigned long long cum = 0;
	for (size_t i = 0; i <= NB; i++) {
		cum += atomic_load(&bucket[i]);
		if (i < NB)
			put(&b, "cotrain_http_request_duration_seconds_bucket{le=\"%g\"} %llu\n", bounds[i],
			    cum);
		else
			put(&b, "cotrain_http_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n", cum);
	}
	put(&b,
	    "cotrain_http_request_duration_seconds_sum %.6f\n"
	    "cotrain_http_request_duration_seconds_count %llu\n",
	    (double)atomic_load(&sum_us) / 1e6, cum);
	put(&b,
	    "# HELP cotrain_gradient_bytes_received_total Bytes of group sums (gradients) received.\n"
	    "# TYPE cotrain_gradient_bytes_received_total counter\n"
	    "cotrain_gradient_bytes_received_total %llu\n"
	    "# HELP cotrain_checkpoint_bytes_received_total Bytes of peers' checkpoints of v+1 "
	    "received.\n"
	    "# TYPE cotrain_checkpoint_bytes_received_total counter\n"
	    "cotrain_checkpoint_bytes_received_total %llu\n",
	    atomic_load(&gradient_bytes), atomic_load(&checkpoint_bytes));
	put(&b,
	    "# HELP cotrain_plan_answers_total Round plans answered (200), by where the answer came "
	    "from.\n"
	    "# TYPE cotrain_plan_answers_total counter\n"
	    "cotrain_plan_answers_total{from=\"database\"} %llu\n"
	    "cotrain_plan_answers_total{from=\"cache\"} %llu\n",
	    atomic_load(&plan_answers[0]), atomic_load(&plan_answers[1]));
	put(&b, "# HELP cotrain_http_requests_total HTTP requests answered, by status class.\n"
	        "# TYPE cotrain_http_requests_total counter\n");
	static const char *const cls[6] = { "other", "1xx", "2xx", "3xx", "4xx", "5xx" };
	for (int i = 0; i < 6; i++)
		put(&b, "cotrain_http_requests_total{code=\"%s\"} %llu\n", cls[i], atomic_load(&by_class[i]));
	if (b.oom) {
		free(b.buf);
		http_reply_error(req, 500, "out_of_memory", "out of memory", NULL);
		return;
	}
	struct MHD_Response *resp = MHD_create_response_from_buffer(b.len, b.buf, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(b.buf);
		return;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	http_reply_response(req, 200, resp);
}
