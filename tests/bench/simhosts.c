/* cotrain benchmark: N simulated hosts in one process against a real
 * cotrain-server (doc/scale.md).
 *
 *   simhosts --url http://127.0.0.1:PORT[,http://...] --project NAME --key ACCOUNT_KEY
 *            [--hosts N] [--rounds R] [--seconds S] [--speed MB_PER_S]
 *            [--speed-spread SIGMA] [--ramp S] [--join N] [--leave P]
 *            [--die P] [--seed X] [--out DIR] [--no-close-watch] [--no-report-spread]
 *
 * Each host is one thread with one keep-alive connection, to the addresses
 * of --url in turn (several server processes on one database).  It registers
 * with the account key (POST /v1/hosts), asks for work (long poll), fakes
 * the compute at its own speed (microbatches per second: SPEED times
 * exp(SIGMA * a normal draw), fixed per host by the seed), heartbeats, and
 * when its round closes reports its units (after a random part of the
 * round's "report_spread_ms", as cotrain-client), long-polls its plan, and runs an
 * averaging stand-in consistent with the plan.  Through the server (a
 * plan of one or two peers, or cotrain-server --round-server-mean), as
 * cotrain-client does it: every member uploads its group's sum
 * (of deterministic fake gradients: the same bytes from every member), waits
 * for the server's mean (after=gradient), downloads it when there are
 * several groups, and reports "ok" with the server's params_sha256, which is
 * what a real peer computes bit-identically.  When the plan says
 * "cross_group": "peers" (the server's default for three peers or more), as
 * cotrain-client does then: every member posts the mean's hash without a
 * body and reports its v+1 (a real optimizer step on a stand-in mean,
 * simhosts_step.h), and the peer the server asks uploads that checkpoint.
 *
 * While computing, a host long-polls its unit's close notice (GET
 * /v1/workunits/{id}/round?wait=S) on a new connection each time, as
 * cotrain-client's watcher thread does (it makes a new connection for every
 * call), so it hears of the close at once; with --no-close-watch it is an older client
 * that hears of it only in its next heartbeat or finish answer.  With
 * --no-report-spread it reports the moment it hears of the close, ignoring
 * the round's "report_spread_ms" (a client from before it).
 *
 * Churn: --ramp spreads the first hosts' starts over S seconds; --join N
 * more hosts join during the run; at each new work unit that is its first
 * of the version a host leaves (hands the unit back and stops) with
 * probability --leave, or dies (stops without a word: the reaper expires the
 * unit) with probability --die.  Hosts never leave holding finished units
 * (the round would wait --round-report-timeout for them).
 *
 * It stops once a work unit of version R is handed out (R rounds after a
 * fresh project's version 0 committed), or after S seconds.  With --out it
 * writes DIR/lat.tsv (one line per call: start epoch, ms, api|poll, status,
 * method, path) and DIR/plans.tsv (version, epoch the host got its plan,
 * host id).  Prints "hosts= assignments= errors= left= died= expired= bytes=
 * seconds=" (expired: units the server had expired or taken back when the
 * host heartbeat or finished them, dropped as a client drops them) and exits
 * non-zero when a host hit an unexpected answer. */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shared/averaging/cross_group.h"
#include "tests/bench/simhosts_http.h"
#include "tests/bench/simhosts_step.h"

#define MAX_UNITS 64
#define POLL_S 30

typedef struct {
	long long id, lo, hi, mb_done;
	int finished;
} sim_unit;

typedef struct {
	int idx;
	long long host_id;
	char token[256];
	double speed; /* microbatches per second */
	uint64_t rng;
	sim_http http;
	sim_http notice;     /* the close notice's own connections (cotrain-client's watcher thread) */
	long long version;   /* of the held units */
	long long spread_ms; /* the closing round's "report_spread_ms" */
	sim_unit units[MAX_UNITS];
	int n_units;
	int mb_size;
	char ckpt_sha[65]; /* checkpoint of the held units' version ("" when none) */
	int watch;         /* long-polls the close notice while computing */
	pthread_t thread;
} sim_host;

static const char *opt_url, *opt_project, *opt_key, *opt_out;
#define MAX_URLS 16
static char *urls[MAX_URLS]; /* --url split at commas: host i speaks to urls[i % n_urls] */
static int n_urls;
static int opt_hosts = 10, opt_join, opt_rounds = -1;
static int opt_no_watch;
static int opt_no_spread;
static double opt_seconds = 600, opt_speed = 4, opt_spread = 0.5, opt_ramp = 2, opt_leave, opt_die;
static unsigned long long opt_seed = 1;
static FILE *lat_file, *plan_file;
static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int stopping;
static atomic_long n_assign, n_errors, n_left, n_died, n_dropped;
static double t_start;

static uint64_t rng_next(uint64_t *s)
{ /* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0; }

static void error_at(sim_host *h, const char *what, long status, json_t *a)
{
	char *s = a ? json_dumps(a, JSON_COMPACT) : NULL;
	fprintf(stderr, "simhosts: host %d (%lld): %s: HTTP %ld %s\n", h->idx, h->host_id, what, status,
	        s ? s : "");
	free(s);
	atomic_fetch_add(&n_errors, 1);
}

static void pause_s(double s)
{
	if (s > 0)
		usleep((useconds_t)(s * 1e6));
}

static int should_stop(void) { return atomic_load(&stopping) || sim_now() - t_start > opt_seconds; }

static int register_host(sim_host *h)
{
	char mid[65];
	uint64_t s = opt_seed * 1000003ULL + (uint64_t)h->idx;
	for (int i = 0; i < 4; i++)
		snprintf(mid + 16 * i, 17, "%016llx", (unsigned long long)rng_next(&s));
	/* flops 1: the first unit is one microbatch; the server sizes the next
	 * ones from the speed the host measured. */
	json_t *b = json_pack("{s:f, s:i, s:s, s:s}", "flops", 1.0, "cores", 1, "client_version", "simhosts",
	                      "machine_id", mid);
	h->http.bearer = opt_key;
	for (int tries = 0; tries < 30 && !should_stop(); tries++) {
		json_t *a = NULL;
		long st = sim_http_call(&h->http, "POST", "/v1/hosts", b, NULL, 0, 30, SIM_CALL_PLAIN, &a);
		const char *tok = json_string_value(json_object_get(a, "host_token"));
		if ((st == 200 || st == 201) && tok && strlen(tok) < sizeof h->token) {
			h->host_id = json_integer_value(json_object_get(a, "host_id"));
			snprintf(h->token, sizeof h->token, "%s", tok);
			h->http.bearer = h->token;
			json_decref(a);
			json_decref(b);
			return 0;
		}
		if (st != 0 && st != 429 && st != 503) { /* else busy or timed out: again */
			error_at(h, "register", st, a);
			json_decref(a);
			json_decref(b);
			return -1;
		}
		json_decref(a);
		pause_s(1 + 2 * rng_unit(&h->rng));
	}
	if (!should_stop())
		error_at(h, "register", 0, NULL);
	json_decref(b);
	return -1;
}

/* The state named in an answer's "round" object, or "" when it has none. */
static const char *round_state(json_t *a)
{
	const char *s = json_string_value(json_object_get(json_object_get(a, "round"), "state"));
	return s ? s : "";
}

/* True when answer a names its round, which it does once the round is no
 * longer open; the round's report window ("report_spread_ms") into h. */
static int round_named(sim_host *h, json_t *a)
{
	json_t *ms = json_object_get(json_object_get(a, "round"), "report_spread_ms");
	if (json_is_integer(ms) && json_integer_value(ms) >= 0 && json_integer_value(ms) <= 60000)
		h->spread_ms = json_integer_value(ms);
	return strcmp(round_state(a), "") != 0;
}

/* The deterministic fake gradient of host `host` at element i. */
static float fake_grad(long long host, long long i)
{
	uint64_t x = (uint64_t)host * 2654435761ULL + (uint64_t)i * 40503ULL;
	return (float)((long long)(x % 2001) - 1000) * 1e-6f;
}

/* Upload the group sum of the plan's members (all included). */
static int upload_sum(sim_host *h, json_t *plan, long long version)
{
	json_t *members = json_object_get(plan, "members");
	long long pc = json_integer_value(json_object_get(plan, "param_count"));
	if (pc <= 0 || pc > (1LL << 26))
		return -1;
	size_t n = json_array_size(members);
	char *what = malloc(256 + n * 24);
	float *sum = calloc((size_t)pc, sizeof *sum);
	if (!what || !sum) {
		free(what);
		free(sum);
		return -1;
	}
	long long samples = 0;
	int w = 0;
	for (size_t m = 0; m < n; m++)
		samples += json_integer_value(json_object_get(json_array_get(members, m), "samples"));
	w = sprintf(what,
	            "/v1/projects/%s/rounds/%lld/group_sum?host_id=%lld&samples=%lld&included=", opt_project,
	            version, h->host_id, samples);
	for (size_t m = 0; m < n; m++) {
		json_t *mo = json_array_get(members, m);
		long long id = json_integer_value(json_object_get(mo, "host_id"));
		double sm = (double)json_integer_value(json_object_get(mo, "samples"));
		w += sprintf(what + w, "%s%lld", m ? "," : "", id);
		for (long long i = 0; i < pc; i++)
			sum[i] += (float)(sm * fake_grad(id, i));
	}
	json_t *a = NULL;
	long st = sim_http_call(&h->http, "POST", what, NULL, sum, (size_t)pc * sizeof *sum, 120,
	                        SIM_CALL_PLAIN, &a);
	if (st != 200)
		error_at(h, "group_sum", st, a);
	json_decref(a);
	free(what);
	free(sum);
	return st == 200 ? 0 : -1;
}

static void average_through_server(sim_host *h, json_t *plan, long long v);

/* The included hosts of the plan's group as "7,9,12" into out (ascending,
 * as the plan lists them) and their samples; -1 when they do not fit. */
static int included_list(json_t *plan, char *out, size_t len, long long *samples)
{
	json_t *members = json_object_get(plan, "members");
	size_t w = 0;
	*samples = 0;
	out[0] = '\0';
	for (size_t m = 0; m < json_array_size(members); m++) {
		json_t *mo = json_array_get(members, m);
		*samples += json_integer_value(json_object_get(mo, "samples"));
		int k = snprintf(out + w, len - w, "%s%lld", m ? "," : "",
		                 (long long)json_integer_value(json_object_get(mo, "host_id")));
		if (k < 0 || (size_t)k >= len - w)
			return -1;
		w += (size_t)k;
	}
	return 0;
}

/* Averaging across groups between the peers (the plan says "cross_group":
 * "peers"), as cotrain-client does it: the aggregators' exchange is not
 * simulated (it never reaches the server); the group's posters
 * (cross_posts_mean_hash: its lowest host ids, every member being included
 * here) post the hash of the round's mean they hold (no body); every member
 * steps, reports its outcome until the server decides, and the one the
 * server asks uploads its checkpoint of v+1 (simhosts_step.h computes it
 * once for every simulated host). */
static void average_peers(sim_host *h, json_t *plan, long long v)
{
	char path[1024], inc[512];
	long long samples, attempt = json_integer_value(json_object_get(plan, "attempt"));
	long long pc = json_integer_value(json_object_get(plan, "param_count"));
	const sim_step *s = sim_step_get(h->http.base, h->token, opt_project, v, attempt, h->ckpt_sha, pc);
	if (!s || included_list(plan, inc, sizeof inc, &samples)) {
		error_at(h, s ? "mean_hash: the group is too large for the simulator" : "step", 0, NULL);
		return;
	}
	json_t *a = NULL;
	json_t *ids = json_array();
	json_t *members = json_object_get(plan, "members");
	int64_t first[CROSS_MEAN_HASH_POSTERS];
	size_t n_first = 0;
	for (size_t m = 0; m < json_array_size(members); m++) {
		json_t *id = json_object_get(json_array_get(members, m), "host_id");
		json_array_append(ids, id);
		if (n_first < CROSS_MEAN_HASH_POSTERS)
			first[n_first++] = json_integer_value(id);
	}
	long st = 200;
	if (cross_posts_mean_hash(first, n_first, h->host_id)) {
		snprintf(path, sizeof path,
		         "/v1/projects/%s/rounds/%lld/"
		         "mean_hash?host_id=%lld&samples=%lld&sha256=%s&included=%s",
		         opt_project, v, h->host_id, samples, s->mean_sha, inc);
		st = sim_http_call(&h->http, "POST", path, NULL, "", 0, 30, SIM_CALL_PLAIN, &a); /* no body */
		if (st != 200)
			error_at(h, "mean_hash", st, a);
		json_decref(a);
	}
	if (st != 200) {
		json_decref(ids);
		return;
	}
	json_t *b = json_pack("{s:I, s:s, s:o, s:s}", "host_id", (json_int_t)h->host_id, "status", "ok",
	                      "included_hosts", ids, "params_sha256", s->params_sha);
	int uploaded = 0;
	for (int tries = 0; tries < 40 && !atomic_load(&stopping); tries++) {
		snprintf(path, sizeof path, "/v1/projects/%s/rounds/%lld/outcome?wait=%d", opt_project, v,
		         POLL_S);
		a = NULL;
		st = sim_http_call(&h->http, "POST", path, b, NULL, 0, POLL_S + 30, SIM_CALL_LONGPOLL, &a);
		int decided = json_is_boolean(json_object_get(a, "accepted"));
		int upload = json_is_true(json_object_get(a, "checkpoint_upload"));
		int reopened = strcmp(round_state(a), "open") == 0;
		if (st != 200)
			error_at(h, "outcome", st, a);
		json_decref(a);
		if (st != 200)
			break;
		if (decided || reopened)
			break;
		if (upload && !uploaded) {
			uploaded = 1;
			snprintf(path, sizeof path, "/v1/projects/%s/rounds/%lld/checkpoint?host_id=%lld",
			         opt_project, v, h->host_id);
			a = NULL;
			st = sim_http_call(&h->http, "POST", path, NULL, s->ckpt, s->ckpt_len, 120,
			                   SIM_CALL_PLAIN, &a);
			if (st != 200)
				error_at(h, "checkpoint", st, a);
			json_decref(a);
		}
	}
	json_decref(b);
}

/* Report every held unit, then take the round through its plan and the
 * averaging stand-in.  Returns 1 when the round reopened for the rest of
 * its batch (keep the units, compute more of the version), else 0 with the
 * units dropped. */
static int take_round(sim_host *h)
{
	char path[512];
	long long v = h->version;
	/* First a random part of the round's report window, as cotrain-client
	 * waits (the reports of a large round spread out). */
	if (!opt_no_spread)
		pause_s(rng_unit(&h->rng) * (double)h->spread_ms / 1000);
	h->spread_ms = 0;
	for (int i = 0; i < h->n_units; i++) {
		sim_unit *u = &h->units[i];
		json_t *a = NULL, *b;
		long st;
		if (u->mb_done == 0) { /* nothing to show: hand it back */
			snprintf(path, sizeof path, "/v1/workunits/%lld/handback", u->id);
			b = json_pack("{s:I}", "mb_done", (json_int_t)0);
		} else {
			snprintf(path, sizeof path, "/v1/workunits/%lld/report", u->id);
			b = json_pack("{s:I, s:I, s:s, s:f, s:b}", "mb_done", (json_int_t)u->mb_done,
			              "samples", (json_int_t)(u->mb_done * h->mb_size), "endpoint",
			              "127.0.0.1:7070", "bandwidth", 1e8, "can_aggregate", 1);
			json_object_set_new(b, "loss", json_real(2.0));
		}
		st = sim_http_call(&h->http, "POST", path, b, NULL, 0, 30, SIM_CALL_PLAIN, &a);
		if (st != 200 && st != 409)
			error_at(h, "report", st, a);
		json_decref(a);
		json_decref(b);
	}
	json_t *plan = NULL;
	while (!plan && !atomic_load(&stopping)) {
		json_t *a = NULL;
		snprintf(path, sizeof path, "/v1/projects/%s/rounds/%lld/plan?host_id=%lld&wait=%d",
		         opt_project, v, h->host_id, POLL_S);
		long st = sim_http_call(&h->http, "GET", path, NULL, NULL, 0, POLL_S + 30, SIM_CALL_LONGPOLL,
		                        &a);
		if (st == 200) {
			plan = a;
			break;
		}
		int reopened =
		        st == 409 && json_is_true(json_object_get(json_object_get(a, "round"), "reopened"));
		json_decref(a);
		if (reopened)
			return 1;
		if (st == 409 || st == 404)
			break; /* not in the plan: drop the units */
		if (st != 204) {
			error_at(h, "plan", st, NULL);
			pause_s(1);
		}
	}
	h->n_units = 0;
	if (!plan)
		return 0;
	pthread_mutex_lock(&plan_mu);
	if (plan_file)
		fprintf(plan_file, "%lld %.3f %lld\n", v, sim_now(), h->host_id);
	pthread_mutex_unlock(&plan_mu);

	const char *cross = json_string_value(json_object_get(plan, "cross_group"));
	if (cross && strcmp(cross, "peers") == 0)
		average_peers(h, plan, v);
	else
		average_through_server(h, plan, v);
	json_decref(plan);
	return 0;
}

/* Averaging through the server (its default), as cotrain-client does it:
 * every member uploads its group's sum (the same bytes), and with several
 * groups downloads the mean; then the outcome. */
static void average_through_server(sim_host *h, json_t *plan, long long v)
{
	char path[512];
	json_t *members = json_object_get(plan, "members");
	upload_sum(h, plan, v);
	const char *params = NULL;
	json_t *full = NULL;
	for (int polls = 0; !params && !atomic_load(&stopping) && polls < 40; polls++) {
		snprintf(path, sizeof path,
		         "/v1/projects/%s/rounds/%lld/plan?host_id=%lld&wait=%d&after=gradient", opt_project,
		         v, h->host_id, POLL_S);
		long st = sim_http_call(&h->http, "GET", path, NULL, NULL, 0, POLL_S + 30, SIM_CALL_LONGPOLL,
		                        &full);
		if (st == 200)
			params = json_string_value(json_object_get(full, "params_sha256"));
		else if (st != 204)
			break;
		if (!params) {
			json_decref(full);
			full = NULL;
		}
	}
	const char *url = json_string_value(json_object_get(json_object_get(full, "gradient"), "url"));
	if (params && url && json_integer_value(json_object_get(plan, "n_groups")) > 1 && strlen(url) < 200 &&
	    strncmp(url, "/files/", 7) == 0) {
		long st = sim_http_call(&h->http, "GET", url, NULL, NULL, 0, 120, SIM_CALL_PLAIN, NULL);
		if (st != 200)
			error_at(h, "mean gradient", st, NULL);
	}
	if (params) {
		json_t *inc = json_array();
		for (size_t m = 0; m < json_array_size(members); m++)
			json_array_append(inc, json_object_get(json_array_get(members, m), "host_id"));
		json_t *b = json_pack("{s:I, s:s, s:o, s:s}", "host_id", (json_int_t)h->host_id, "status",
		                      "ok", "included_hosts", inc, "params_sha256", params);
		json_t *a = NULL;
		snprintf(path, sizeof path, "/v1/projects/%s/rounds/%lld/outcome?wait=%d", opt_project, v,
		         POLL_S);
		long st =
		        sim_http_call(&h->http, "POST", path, b, NULL, 0, POLL_S + 30, SIM_CALL_LONGPOLL, &a);
		if (st != 200)
			error_at(h, "outcome", st, a);
		json_decref(a);
		json_decref(b);
	}
	json_decref(full);
}

/* Fake the compute of unit u, heartbeating.  Returns 1 when the answers
 * say the round is closing (stop and report), 0 when the unit is done,
 * -1 when it is gone (expired, refused). */
static int compute(sim_host *h, sim_unit *u, int hb_interval)
{
	char path[256];
	long long n = u->hi - u->lo;
	double t0 = sim_now(), last_hb = t0;
	while (u->mb_done < n) {
		if (atomic_load(&stopping))
			return -1;
		/* Until the next heartbeat or the unit's end: hear of the close at
		 * once (the close notice, a long poll), or only at the heartbeat. */
		double wait = fmin(t0 + (double)n / h->speed - sim_now(), last_hb + hb_interval - sim_now());
		if (h->watch && wait >= 1) {
			json_t *a = NULL;
			snprintf(path, sizeof path, "/v1/workunits/%lld/round?wait=%d", u->id, (int)wait);
			long st = sim_http_call(&h->notice, "GET", path, NULL, NULL, 0, (long)wait + 30,
			                        SIM_CALL_LONGPOLL, &a);
			const char *ust = json_string_value(json_object_get(a, "state"));
			int closing = st == 200 && round_named(h, a);
			int gone = st == 200 && ust && strcmp(ust, "live") != 0;
			json_decref(a);
			if (st == 404)
				h->watch = 0; /* a server without the close notice */
			else if (st != 200 && st != 0)
				error_at(h, "round notice", st, NULL);
			long long d = (long long)((sim_now() - t0) * h->speed);
			u->mb_done = d < n ? d : n;
			if (gone) {
				atomic_fetch_add(&n_dropped, 1);
				return -1;
			}
			if (closing && u->mb_done < n)
				return 1;
			continue; /* the heartbeat, when due, at the next turn */
		}
		pause_s(fmin(0.25, (double)(n - u->mb_done) / h->speed));
		long long d = (long long)((sim_now() - t0) * h->speed);
		u->mb_done = d < n ? d : n;
		if (u->mb_done < n && sim_now() - last_hb >= hb_interval) {
			json_t *b = json_pack("{s:I, s:f}", "mb_done", (json_int_t)u->mb_done,
			                      "samples_per_sec", h->speed * h->mb_size);
			json_t *a = NULL;
			snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", u->id);
			long st = sim_http_call(&h->http, "POST", path, b, NULL, 0, 30, SIM_CALL_PLAIN, &a);
			json_decref(b);
			last_hb = sim_now();
			int closing = st == 200 && round_named(h, a);
			json_decref(a);
			if (st == 409) {
				atomic_fetch_add(&n_dropped, 1);
				return -1;
			}
			if (closing)
				return 1;
		}
	}
	json_t *b = json_pack("{s:f}", "samples_per_sec", h->speed * h->mb_size);
	json_t *a = NULL;
	snprintf(path, sizeof path, "/v1/workunits/%lld/finish", u->id);
	long st = sim_http_call(&h->http, "POST", path, b, NULL, 0, 30, SIM_CALL_PLAIN, &a);
	json_decref(b);
	u->finished = st == 200;
	int closing = st == 200 && round_named(h, a);
	if (st == 409) /* expired or handed back: drop it, as a client does */
		atomic_fetch_add(&n_dropped, 1);
	else if (st != 200)
		error_at(h, "finish", st, a);
	json_decref(a);
	return st != 200 ? -1 : closing;
}

static void *host_main(void *arg)
{
	sim_host *h = arg;
	char path[256];
	if (!(h->http.curl = curl_easy_init()) || !(h->notice.curl = curl_easy_init()) || register_host(h))
		goto out;
	h->notice.bearer = h->token;
	json_t *wb = json_pack("{s:I}", "host_id", (json_int_t)h->host_id);
	snprintf(path, sizeof path, "/v1/projects/%s/work?wait=%d", opt_project, POLL_S);
	while (!should_stop()) {
		json_t *a = NULL;
		long st = sim_http_call(&h->http, "POST", path, wb, NULL, 0, POLL_S + 30, SIM_CALL_LONGPOLL,
		                        &a);
		if (st == 200) {
			atomic_fetch_add(&n_assign, 1);
			sim_unit u = { json_integer_value(json_object_get(a, "work_unit_id")),
				       json_integer_value(json_object_get(a, "lo")),
				       json_integer_value(json_object_get(a, "hi")), 0, 0 };
			long long v = json_integer_value(json_object_get(a, "version"));
			int hb = (int)json_integer_value(json_object_get(a, "heartbeat_interval"));
			h->mb_size = (int)json_integer_value(json_object_get(a, "microbatch_size"));
			json_t *files = json_object_get(a, "files");
			for (size_t f = 0; f < json_array_size(files); f++) {
				json_t *fo = json_array_get(files, f);
				const char *sha = json_string_value(json_object_get(fo, "sha256"));
				const char *kind = json_string_value(json_object_get(fo, "kind"));
				if (kind && sha && strcmp(kind, "checkpoint") == 0 && strlen(sha) == 64)
					snprintf(h->ckpt_sha, sizeof h->ckpt_sha, "%s", sha);
			}
			json_decref(a);
			if (opt_rounds >= 0 && v >= opt_rounds) {
				atomic_store(&stopping, 1);
				break;
			}
			if (v != h->version)
				h->n_units = 0; /* an older version's units are settled */
			h->version = v;
			if (h->n_units == 0 && rng_unit(&h->rng) < opt_die) {
				atomic_fetch_add(&n_died, 1);
				break; /* dies: the unit expires */
			}
			if (h->n_units == 0 && rng_unit(&h->rng) < opt_leave) {
				json_t *b = json_pack("{s:I}", "mb_done", (json_int_t)0);
				snprintf(path, sizeof path, "/v1/workunits/%lld/handback", u.id);
				sim_http_call(&h->http, "POST", path, b, NULL, 0, 30, SIM_CALL_PLAIN, NULL);
				json_decref(b);
				atomic_fetch_add(&n_left, 1);
				break;
			}
			if (h->n_units == MAX_UNITS)
				h->n_units--; /* cannot happen with wu sizing; keep bounded */
			int r = compute(h, &u, hb > 0 ? hb : 5);
			if (r >= 0) /* else expired or stopped: nothing to report */
				h->units[h->n_units++] = u;
			if (r == 1)
				take_round(h); /* a reopened round keeps the units */
			continue;
		}
		if (st == 409) {
			json_t *ro = json_object_get(a, "round");
			char state[16];
			round_named(h, a);
			snprintf(state, sizeof state, "%s", round_state(a)); /* a is freed below */
			long long rv = json_integer_value(json_object_get(ro, "version"));
			int full = json_is_true(json_object_get(ro, "full"));
			long long retry = json_integer_value(json_object_get(a, "retry_after"));
			json_decref(a);
			if (h->n_units > 0 && rv == h->version && strcmp(state, "open") != 0) {
				take_round(h);
				continue;
			}
			if (h->n_units > 0 && rv != h->version)
				h->n_units = 0;
			if (full || h->n_units > 0 || strcmp(state, "averaging") == 0)
				pause_s(retry > 0 && retry < 2 ? (double)retry : 1);
			continue;
		}
		error_at(h, "work", st, a);
		json_decref(a);
		pause_s(1 + rng_unit(&h->rng));
	}
	json_decref(wb);
out:
	return NULL;
}

static void usage(void)
{
	fprintf(stderr,
	        "usage: simhosts --url URL[,URL...] --project NAME --key ACCOUNT_KEY [--hosts N] [--rounds "
	        "V]\n"
	        "       [--seconds S] [--speed MB_PER_S] [--speed-spread SIGMA] [--ramp S] [--join N]\n"
	        "       [--leave P] [--die P] [--seed X] [--out DIR] [--no-close-watch]\n"
	        "       [--no-report-spread]\n");
	exit(2);
}

static double num_arg(const char *name, const char *s, double lo, double hi)
{
	char *end;
	double x = strtod(s, &end);
	if (*s == '\0' || *end != '\0' || !(x >= lo && x <= hi)) {
		fprintf(stderr, "simhosts: invalid value for --%s: \"%s\" (must be from %g to %g)\n", name, s,
		        lo, hi);
		exit(2);
	}
	return x;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = { { "url", 1, 0, 'u' },
		                              { "project", 1, 0, 'p' },
		                              { "key", 1, 0, 'k' },
		                              { "hosts", 1, 0, 'n' },
		                              { "rounds", 1, 0, 'r' },
		                              { "seconds", 1, 0, 's' },
		                              { "speed", 1, 0, 'v' },
		                              { "speed-spread", 1, 0, 'S' },
		                              { "ramp", 1, 0, 'R' },
		                              { "join", 1, 0, 'j' },
		                              { "leave", 1, 0, 'l' },
		                              { "die", 1, 0, 'd' },
		                              { "seed", 1, 0, 'x' },
		                              { "out", 1, 0, 'o' },
		                              { "no-close-watch", 0, 0, 'W' },
		                              { "no-report-spread", 0, 0, 'N' },
		                              { 0, 0, 0, 0 } };
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'u':
			opt_url = optarg;
			break;
		case 'p':
			opt_project = optarg;
			break;
		case 'k':
			opt_key = optarg;
			break;
		case 'n':
			opt_hosts = (int)num_arg("hosts", optarg, 1, 100000);
			break;
		case 'r':
			opt_rounds = (int)num_arg("rounds", optarg, 0, 1e9);
			break;
		case 's':
			opt_seconds = num_arg("seconds", optarg, 1, 1e6);
			break;
		case 'v':
			opt_speed = num_arg("speed", optarg, 0.01, 1e6);
			break;
		case 'S':
			opt_spread = num_arg("speed-spread", optarg, 0, 5);
			break;
		case 'R':
			opt_ramp = num_arg("ramp", optarg, 0, 3600);
			break;
		case 'j':
			opt_join = (int)num_arg("join", optarg, 0, 100000);
			break;
		case 'l':
			opt_leave = num_arg("leave", optarg, 0, 1);
			break;
		case 'd':
			opt_die = num_arg("die", optarg, 0, 1);
			break;
		case 'x':
			opt_seed = (unsigned long long)num_arg("seed", optarg, 0, 1e15);
			break;
		case 'o':
			opt_out = optarg;
			break;
		case 'W':
			opt_no_watch = 1;
			break;
		case 'N':
			opt_no_spread = 1;
			break;
		default:
			usage();
		}
	}
	if (!opt_url || !opt_project || !opt_key || optind != argc)
		usage();
	if (strlen(opt_key) > 200 || strlen(opt_url) > 200) {
		fprintf(stderr, "simhosts: --key and --url must be at most 200 bytes\n");
		return 2;
	}
	char *list = strdup(opt_url), *save = NULL;
	for (char *u = list ? strtok_r(list, ",", &save) : NULL; u; u = strtok_r(NULL, ",", &save)) {
		if (n_urls == MAX_URLS || strncmp(u, "http://", 7) != 0) {
			fprintf(stderr,
			        "simhosts: --url must be at most %d http:// addresses separated by commas\n",
			        MAX_URLS);
			return 2;
		}
		urls[n_urls++] = u;
	}
	if (n_urls == 0)
		usage();
	if (strlen(opt_project) > 64 ||
	    strspn(opt_project, "abcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(opt_project)) {
		fprintf(stderr, "simhosts: invalid project name \"%s\"\n", opt_project);
		return 2;
	}
	if (opt_out) {
		char p[4096];
		snprintf(p, sizeof p, "%s/lat.tsv", opt_out);
		lat_file = fopen(p, "w");
		snprintf(p, sizeof p, "%s/plans.tsv", opt_out);
		plan_file = fopen(p, "w");
		if (!lat_file || !plan_file) {
			fprintf(stderr, "simhosts: could not open the logs in \"%s\"\n", opt_out);
			return 1;
		}
	}
	curl_global_init(CURL_GLOBAL_DEFAULT);
	int total = opt_hosts + opt_join;
	sim_host *hosts = calloc((size_t)total, sizeof *hosts);
	if (!hosts)
		return 1;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	t_start = sim_now();
	uint64_t rs = opt_seed;
	int started = 0;
	for (int i = 0; i < total; i++) {
		sim_host *h = &hosts[i];
		h->idx = i;
		h->rng = opt_seed * 7919ULL + (uint64_t)i;
		double g = sqrt(-2 * log(rng_unit(&rs))) * cos(2 * M_PI * rng_unit(&rs));
		h->speed = opt_speed * exp(opt_spread * g);
		h->version = -1;
		h->watch = !opt_no_watch;
		h->http.base = h->notice.base = urls[i % n_urls];
		h->http.lat = h->notice.lat = lat_file;
		h->notice.fresh = 1;
		/* The first hosts over --ramp, the joiners over the run's middle. */
		double at = i < opt_hosts ? opt_ramp * i / opt_hosts
		                          : opt_ramp + (opt_seconds / 2) * (i - opt_hosts) /
		                                               (opt_join ? opt_join : 1);
		while (sim_now() - t_start < at && !should_stop())
			pause_s(0.01);
		if (should_stop())
			break;
		if (pthread_create(&h->thread, &attr, host_main, h) != 0) {
			fprintf(stderr, "simhosts: could not start host %d (the machine's thread limit)\n",
			        i);
			atomic_store(&stopping, 1);
			break;
		}
		started++;
	}
	for (int i = 0; i < started; i++)
		pthread_join(hosts[i].thread, NULL);
	double bytes = 0;
	for (int i = 0; i < started; i++) {
		bytes += hosts[i].http.bytes + hosts[i].notice.bytes;
		if (hosts[i].http.curl)
			curl_easy_cleanup(hosts[i].http.curl);
		if (hosts[i].notice.curl)
			curl_easy_cleanup(hosts[i].notice.curl);
	}
	printf("hosts=%d assignments=%ld errors=%ld left=%ld died=%ld bytes=%.0f seconds=%.1f\n", started,
	       atomic_load(&n_assign), atomic_load(&n_errors), atomic_load(&n_left), atomic_load(&n_died),
	       bytes, sim_now() - t_start);
	if (lat_file)
		fclose(lat_file);
	if (plan_file)
		fclose(plan_file);
	free(hosts);
	free(list);
	sim_step_free_all();
	curl_global_cleanup();
	return atomic_load(&n_errors) ? 1 : 0;
}
