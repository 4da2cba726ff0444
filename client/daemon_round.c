/* cotrain client: taking part in a collaborative round (see daemon.h,
 * cl_daemon_round; doc/design.md "The round"; doc/api.md "Rounds").
 *
 * The steps, each bounded in time:
 *   1. report every work unit of the version whose microbatches the
 *      gradient sums (the live one is returned to the pool past mb_done);
 *   2. wait for the plan (long poll), giving up when the round fails and
 *      opens again, or the server says we are not in it;
 *   3. all-reduce the gradient SUM within the group (shared/averaging/allreduce.h);
 *   4. upload the group's sum; the mean is sum / total with one group, or
 *      the server's mean over every group's sum, downloaded; or, when the
 *      plan says "cross_group": "peers", the aggregators already averaged
 *      across groups between themselves (shared/averaging/cross_group.h):
 *      we hold the mean and post only its hash;
 *   5. one optimizer step with the project's settings, the sha256 of the
 *      new parameters to the server; when the server's v+1 differs from
 *      ours, drop ours (the next work unit loads the server's checkpoint).
 *      Across groups between the peers the server has no v+1 of its own:
 *      it asks one peer of the majority for its checkpoint.
 * In local mode (doc/design.md "Local mode") the session has taken inner
 * steps on its own parameters: once planned, it turns them into its
 * contribution, samples x (theta_v - theta), with theta_v back in the model
 * (cl_compute_finish); steps 3-4 average that as they average a gradient
 * sum, and step 5 is the outer step on theta_v.
 * Any failure drops the gradient: the server hands the data out again, so
 * nothing is lost or counted twice. */
#include "client/daemon.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/api_round.h"
#include "client/cheat.h"
#include "client/round.h"
#include "client/round_seed2.h"
#include "client/shard_cache.h"
#include "kernels/backend.h"
#include "kernels/checkpoint.h"
#include "kernels/model.h"
#include "kernels/opt_json.h"
#include "shared/averaging/allreduce.h"
#include "shared/averaging/cross_group.h"
#include "shared/common/deadline.h"
#include "shared/common/fault.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"
#include "shared/common/log.h"
#include "shared/nat/nat.h"

#define PLAN_WAIT_S 30
#define PLAN_GIVE_UP_S 1800 /* a round that plans nothing for this long is dead to us */
#define OUTCOME_RETRY_S 2
#define REPORT_RETRY_S 30   /* how long the reports may retry a server that does not answer */
#define ROUND_RETRY_MAX_S 4 /* the longest wait between two tries of a round call */
/* Sketch values a report carries at most: about 2.4 MB of JSON, within the
 * server's 4 MiB for a report (API_REPORT_MAX_BYTES). */
#define SKETCH_REPORT_MAX_VALUES 100000

/* Everything one round needs outside the lock. */
typedef struct {
	cl_daemon *d;
	cl_project p; /* a copy */
	cl_api_opts o;
	cl_round_acc acc;
	cl_peer peer; /* taken from the runtime for the round */
	int64_t v, attempt;
	int64_t spread_ms; /* the round's "report_spread_ms" */
	int64_t live_wu;   /* the unit still live on the server, 0 when none */
	int reopened;      /* the round reopened for the rest: keep the gradient */
	cl_compute *s;
	kern_model *m;
	cl_plan plan;
	float *sum; /* the group sum, then the mean */
	allreduce_result res;
	char params_sha[65];
	char moments_sha[65];     /* hash_sha256_hex2 of m then v after the step */
	char ckpt_sha[65];        /* the server's checkpoint of v+1 when accepted ("" if unsaid) */
	char held_path[PATH_MAX]; /* our copy of that checkpoint in the cache ("" when none) */
	uint64_t held_size;
	double held_write_s;  /* what writing and hashing it took */
	cl_links links;       /* the connections we dialed */
	cl_seed2_kept kept;   /* for the check under the second seed */
	uint64_t seed2;       /* the second seed, once an outcome answer named it */
	float *hidden_upload; /* test hook: the group sum uploaded in place of j->sum (cheat.h) */
	int has_seed2;
} round_job;

static void activity(round_job *j, const char *what)
{
	pthread_mutex_lock(&j->d->lock);
	int i = cl_daemon_find(j->d, j->p.url);
	if (i >= 0)
		cl_daemon_activity(j->d, i, "round %lld: %s", (long long)j->v, what);
	pthread_mutex_unlock(&j->d->lock);
}

/* Round v's state and attempt from GET .../rounds?before=v+1&limit=1
 * ("" and 0 when unknown): round v however many rounds followed it. */
static void round_state_at(const cl_api_opts *o, const cl_project *p, int64_t v, char state[16],
                           int64_t *attempt)
{
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/projects/%s/rounds?before=%lld&limit=1", p->base, p->name,
	         (long long)v + 1);
	json_t *a = NULL;
	cot_errbuf eb = { "", "" };
	cl_http_req r = { .method = "GET", .url = url, .out = &a };
	state[0] = '\0';
	*attempt = 0;
	if (cl_api_http(o, &r, &eb) || !a)
		return;
	const json_t *rs = json_object_get(a, "rounds");
	for (size_t k = 0; json_is_array(rs) && k < json_array_size(rs); k++) {
		const json_t *x = json_array_get(rs, k);
		long long ver = -1, att = 0;
		const char *st = NULL;
		if (cot_json_int(x, "version", true, 0, 1LL << 31, &ver, NULL) || ver != v ||
		    cot_json_int(x, "attempt", true, 1, 1LL << 31, &att, NULL) ||
		    cot_json_str(x, "state", true, 1, 15, &st, NULL))
			continue;
		snprintf(state, 16, "%s", st);
		*attempt = att;
		break;
	}
	json_decref(a);
}

/* The round's state and attempt (round_state_at). */
static void round_state(round_job *j, char state[16], int64_t *attempt)
{
	round_state_at(&j->o, &j->p, j->v, state, attempt);
}

/* True when the round we hold gradients for failed and opened again. */
static int round_reopened(round_job *j)
{
	char st[16];
	int64_t att;
	round_state(j, st, &att);
	return strcmp(st, "open") == 0 || (att > j->attempt && j->attempt > 0);
}

/* Sleep s seconds in naps of at most 50 ms; 1 when the client stops
 * meanwhile (then at once), else 0. */
static int nap(round_job *j, double s)
{
	double until = cl_now_mono() + s;
	for (double left; (left = until - cl_now_mono()) > 0;) {
		if (j->d->stop)
			return 1;
		struct timespec ts = { 0, (long)(fmin(left, 0.05) * 1e9) };
		nanosleep(&ts, NULL);
	}
	return j->d->stop != 0;
}

/* Whether a round call that failed with rc goes again: only a network
 * error (no connection, a reset, a timeout, a 5xx: a server process that
 * died behind a balancer, a proxy restarting), only while the client runs
 * and until `until` (unix seconds: REPORT_RETRY_S after the reports began,
 * the round's averaging deadline once planned, a minute past it for the
 * outcome and our checkpoint).  Waits as the client's other retries do
 * (cl_backoff *b: from 1 s, doubling up to ROUND_RETRY_MAX_S, with
 * jitter), never past `until`, and logs the retry.  Every round call is
 * safe to send again: the server answers the same group sum, mean hash,
 * outcome or checkpoint again as it answered it first (doc/api.md,
 * "Rounds"); a call that gives up fails the round for this host, whose
 * samples go back to the pool. */
static int round_call_again(round_job *j, cot_err rc, cl_backoff *b, int64_t until, const char *what,
                            const cot_errbuf *eb)
{
	int64_t left = until - (int64_t)time(NULL);
	if (rc != COT_ERR_NETWORK || j->d->stop || left <= 0)
		return 0;
	double wait = fmin(cl_backoff_fail(b, cl_now_mono(), cl_random01()), (double)left);
	log_warn("project %s: round %lld: %s: %s; trying again in %.1f s", j->p.name, (long long)j->v, what,
	         eb->msg, wait);
	return !nap(j, wait);
}

/* A backoff for one round call (round_call_again). */
static cl_backoff round_backoff(void)
{
	cl_backoff b;
	cl_backoff_init(&b, 1, ROUND_RETRY_MAX_S);
	return b;
}

/* 1. Report the units. */
static cot_err report_units(round_job *j, cot_errbuf *eb)
{
	cl_daemon *d = j->d;
	int64_t until = (int64_t)time(NULL) + REPORT_RETRY_S;
	cot_err rc;
	cl_backoff bo = round_backoff();
	do
		rc = cl_peer_ready(&j->peer, &j->o, &j->p, &d->cfg, eb);
	while (round_call_again(j, rc, &bo, until, "getting ready to average", eb));
	if (rc)
		return rc;
	char net[200];
	cl_peer_network(&j->peer, net, sizeof net);
	pthread_mutex_lock(&d->lock);
	int i = cl_daemon_find(d, j->p.url);
	if (i >= 0)
		snprintf(d->rt[i].network, sizeof d->rt[i].network, "%s", net);
	pthread_mutex_unlock(&d->lock);
	json_t *rtt = cl_peer_rtt_json(&j->peer);
	for (int k = 0; k < j->acc.n; k++) {
		if (j->acc.u[k].reported)
			continue; /* the server kept it when the round reopened */
		cl_round_report r = { .mb_done = j->acc.u[k].mb,
			              .samples = j->acc.u[k].mb * j->p.microbatch_size,
			              .bandwidth = (double)d->cfg.peer_bandwidth,
			              .can_aggregate = cl_peer_can_aggregate(&j->peer),
			              .has_loss = j->acc.u[k].mb > 0,
			              .loss = j->acc.u[k].mb > 0
			                              ? j->acc.u[k].loss_sum / (double)j->acc.u[k].mb
			                              : 0,
			              .rtt = rtt };
		/* A unit with nothing done is reported too: the server returns it
		 * at once instead of waiting for it until the report timeout. */
		snprintf(r.endpoint, sizeof r.endpoint, "%s", j->peer.endpoint);
		/* With the sketch of each of its microbatches, which spot checks
		 * compare with (doc/credit.md), unless they would make the report
		 * too large for the server (then the unit is checked whole). */
		double *sk = NULL;
		int sk_k = cl_compute_sketch_k(j->s);
		if (sk_k > 0 && r.mb_done > 0 && r.mb_done * sk_k <= SKETCH_REPORT_MAX_VALUES) {
			sk = malloc((size_t)r.mb_done * (size_t)sk_k * sizeof *sk);
			if (!sk) {
				rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
				break;
			}
			cot_errbuf e2 = { "", "" };
			if (cl_compute_sketches(j->s, j->acc.u[k].lo, r.mb_done, sk, &e2)) {
				free(sk); /* not all sketched (a restart): report without */
				sk = NULL;
			}
			r.sketches = sk;
			r.sketch_k = sk_k;
		}
		do
			rc = cl_api_round_report(&j->o, &j->p, j->acc.u[k].id, &r, NULL, eb);
		while (round_call_again(j, rc, &bo, until, "reporting a work unit", eb));
		free(sk);
		if (rc)
			break;
	}
	json_decref(rtt);
	return rc;
}

/* 2. Wait for our plan. */
static cot_err wait_plan(round_job *j, int after_gradient, cot_errbuf *eb)
{
	double start = cl_now_mono(), last_check = start;
	for (;;) {
		if (j->d->stop)
			return cot_seterr(eb, COT_ERR_TIMEOUT, "the client is stopping");
		json_t *a = NULL;
		double t0 = cl_now_mono();
		cot_err rc = cl_api_round_plan(&j->o, &j->p, j->v, PLAN_WAIT_S, after_gradient, &a,
		                               &j->reopened, eb);
		if (rc == COT_OK && a) {
			cl_plan_free(&j->plan);
			rc = cl_plan_parse(a, j->p.host_id, j->v, (int64_t)j->m->n_params, &j->plan, eb);
			json_decref(a);
			if (rc)
				return rc;
			if (!after_gradient || j->plan.has_gradient)
				return COT_OK;
		} else if (rc && rc != COT_ERR_NETWORK) {
			return rc; /* 409: not in the plan; 404: no such round */
		}
		double now = cl_now_mono();
		if (now - start > PLAN_GIVE_UP_S)
			return cot_seterr(eb, COT_ERR_TIMEOUT, "no averaging plan came in %d s",
			                  PLAN_GIVE_UP_S);
		if (now - last_check >= PLAN_WAIT_S && !after_gradient) {
			last_check = now;
			if (round_reopened(j))
				return cot_seterr(eb, COT_ERR_CONFLICT, "the round failed and opened again");
		}
		if (now - t0 < 1)
			sleep(1); /* a server that does not hold the request */
	}
}

/* The hosts that dial us in the round: our group's other members, then
 * every other holder of our slices across groups, each once; *n of them
 * (malloc'd, the caller frees; NULL with *n 0 when out of memory). */
static int64_t *dialing_us(const cl_plan *pl, int64_t self, size_t *n)
{
	size_t cap = pl->n;
	for (size_t s = 0; s < pl->n_cross; s++)
		cap += pl->cross[s].n;
	int64_t *o = malloc((cap ? cap : 1) * sizeof *o);
	*n = 0;
	for (size_t k = 0; o && k < pl->n; k++)
		if (pl->members[k].host_id != self)
			o[(*n)++] = pl->members[k].host_id;
	for (size_t s = 0; o && s < pl->n_cross; s++)
		for (size_t k = 0; k < pl->cross[s].n; k++) {
			int64_t id = pl->cross[s].holders[k].host_id;
			size_t i = 0;
			while (i < *n && o[i] != id)
				i++;
			if (id != self && i == *n)
				o[(*n)++] = id;
		}
	return o;
}

/* 3. The all-reduce within our group, and with "cross_group": "peers" the
 * stage across groups inside it (our aggregator's range becomes the
 * round's mean before it is returned). */
static cot_err average(round_job *j, cot_errbuf *eb)
{
	const cl_plan *pl = &j->plan;
	int cross = pl->cross_peers && pl->n_groups > 1;
	if (pl->n == 1 && !cross) {
		/* Alone in the group: the group sum is what we send, exactly,
		 * sketched as by the aggregator of all of it that received its
		 * own result, so that the checks of the averaged bytes and the
		 * one under the second seed apply to us as to any member. */
		allreduce_member me = { .host_id = pl->members[0].host_id,
			                .start = 0,
			                .end = j->m->n_params,
			                .samples = (uint64_t)pl->members[0].samples };
		/* Test hook: a poisoner sends another vector than its gradient
		 * (orthogonal-hidden: sketched as its gradient, uploaded by
		 * round_mean). */
		float *poison = cl_cheat_poison(j->m->grads, j->m->n_params, cl_compute_sketch_seed(j->s));
		if (poison && cl_cheat_hidden()) {
			j->hidden_upload = poison;
			poison = NULL;
		}
		allreduce_params ap = {
			.members = &me,
			.n = 1,
			.round = j->v,
			.grad = poison ? poison : j->m->grads,
			.len = j->m->n_params,
			.sketch_seed = cl_compute_sketch_seed(j->s),
			.sketch_k = cl_compute_is_local(j->s) ? 0 : cl_compute_sketch_k(j->s),
			.keep_slices = 1,
		};
		cot_err rc = allreduce_alone(&ap, j->sum, &j->res, eb);
		free(poison);
		return rc;
	}
	allreduce_member mem[CL_PLAN_MAX_MEMBERS];
	for (size_t k = 0; k < pl->n; k++)
		mem[k] = (allreduce_member){ .host_id = pl->members[k].host_id,
			                     .addr = pl->members[k].addr,
			                     .port = pl->members[k].port,
			                     .start = pl->members[k].lo,
			                     .end = pl->members[k].hi,
			                     .samples = (uint64_t)pl->members[k].samples };
	/* Through the NAT service's ladder when there is one (doc/nat.md):
	 * our dialer meets each aggregator, and as an aggregator we help the
	 * others' connections in; without one, peers are dialed directly. */
	nat_config nc;
	bool nat = cl_peer_nat_config(&j->peer, &j->p, &j->d->cfg, &nc);
	dialer *dl = NULL;
	nat_acceptor *acc = NULL;
	int64_t left_ms = (pl->deadline - (int64_t)time(NULL)) * 1000;
	if (left_ms < 5000)
		left_ms = 5000;
	int64_t deadline = deadline_after_ms(left_ms);
	cot_err rc = nat ? nat_dialer_new(&nc, j->p.name, j->v, &dl, eb) : dialer_direct_new(&dl, eb);
	if (rc || (rc = cl_links_dialer_new(dl, &j->links, &dl, eb)))
		return rc;
	const cl_plan_member *me = &pl->members[pl->self];
	if (nat && me->hi > me->lo) {
		size_t n = 0;
		int64_t *others = dialing_us(pl, j->p.host_id, &n);
		rc = others ? nat_acceptor_start(&nc, j->p.name, j->v, others, n, deadline, &acc, eb)
		            : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		free(others);
		if (rc) {
			dialer_free(dl);
			return rc;
		}
	}
	/* Across groups: the slices of our range, reduced between their
	 * holders after our group's slices are in and before our result goes
	 * back (a quarter of the time left, then an eighth for the results). */
	cross_group_params cp = { .slices = pl->cross,
		                  .n_slices = pl->n_cross,
		                  .round = j->v,
		                  .comp = pl->comp,
		                  .ctx = j->peer.ctx,
		                  .dialer = dl,
		                  .lst = j->peer.lst,
		                  .collect_deadline = deadline_after_ms(left_ms * 3 / 4),
		                  .deadline = deadline_after_ms(left_ms * 7 / 8) };
	if (pl->n == 1) {
		/* Alone in our group: what we send is the group's sum, and our
		 * range (all of it) goes straight to the stage across groups;
		 * sketched as its own aggregator's (allreduce_alone). */
		allreduce_member one = { .host_id = me->host_id,
			                 .start = 0,
			                 .end = j->m->n_params,
			                 .samples = (uint64_t)me->samples };
		float *poison = cl_cheat_poison(j->m->grads, j->m->n_params, cl_compute_sketch_seed(j->s));
		allreduce_params ap = {
			.members = &one,
			.n = 1,
			.round = j->v,
			.grad = poison ? poison : j->m->grads,
			.len = j->m->n_params,
			.sketch_seed = cl_compute_sketch_seed(j->s),
			.sketch_k = cl_compute_is_local(j->s) ? 0 : cl_compute_sketch_k(j->s),
			.keep_slices = 1,
			.cross = cross_group_reduce,
			.cross_arg = &cp,
		};
		rc = allreduce_alone(&ap, j->sum, &j->res, eb);
		free(poison);
		nat_acceptor_stop(acc);
		dialer_free(dl);
		return rc;
	}
	/* Test hook: a poisoner sends another vector than its gradient. */
	float *poison = cl_cheat_poison(j->m->grads, j->m->n_params, cl_compute_sketch_seed(j->s));
	allreduce_params ap = { .members = mem,
		                .n = pl->n,
		                .self = pl->self,
		                .round = j->v,
		                .grad = poison ? poison : j->m->grads,
		                .len = j->m->n_params,
		                .send_comp = pl->comp,
		                /* Across groups the mean comes encoded once by the
		                 * stage; passed on in 8-bit it would be encoded again
		                 * in other blocks in each group, and the groups would
		                 * differ (fp16 of fp16 values is exact). */
		                .result_comp = cross && pl->comp == COMP_BLOCK8 ? COMP_NONE : pl->comp,
		                .aggregation = pl->centered_clip ? ALLREDUCE_CENTERED_CLIP : ALLREDUCE_SUM,
		                .clip_tau = pl->clip_tau,
		                .clip_iters = pl->clip_iters,
		                .ctx = j->peer.ctx,
		                .dialer = dl,
		                .lst = j->peer.lst,
		                .collect_deadline = deadline_after_ms(left_ms / 2),
		                .deadline = deadline,
		                /* Under the round's seed, as our committed sketches. */
		                .sketch_seed = cl_compute_sketch_seed(j->s),
		                .sketch_k = cl_compute_is_local(j->s) ? 0 : cl_compute_sketch_k(j->s),
		                /* kept for the second seed (across groups
		                 * between the peers with our range's group sum
		                 * before that stage: our result is the mean) */
		                .keep_slices = 1,
		                .test_result_noise = cl_cheat_result_noise(),
		                /* across groups: our range becomes the round's mean */
		                .cross = cross && me->hi > me->lo ? cross_group_reduce : NULL,
		                .cross_arg = &cp,
		                .no_stream = cross };
	rc = allreduce_run(&ap, j->sum, &j->res, eb);
	free(poison);
	size_t i = 0;
	for (size_t k = 0; acc && k < pl->n; k++) {
		if (k == pl->self)
			continue;
		/* The rung that carried the connection, not the plan: a failed
		 * punch that the relay saved reads "relay" here as it does in the
		 * dialer's log and in round_link. */
		const char *how = nat_acceptor_rung(acc, i);
		const char *plan = nat_acceptor_plan(acc, i++);
		if (how[0])
			log_info("project %s: round %lld: host %lld reached us by %s (planned %s)", j->p.name,
			         (long long)j->v, (long long)pl->members[k].host_id, how, plan);
	}
	nat_acceptor_stop(acc);
	dialer_free(dl);
	pthread_mutex_lock(&j->links.mu);
	for (size_t k = 0; k < j->links.n; k++) {
		const cl_link *l = &j->links.l[k];
		log_info("project %s: round %lld: reached host %lld by %s in %.0f ms (rtt %.2f ms, %d "
		         "connections, planned %s)",
		         j->p.name, (long long)j->v, (long long)l->peer, l->rung, l->connect_ms, l->rtt_ms,
		         l->conns, l->plan[0] ? l->plan : "-");
	}
	pthread_mutex_unlock(&j->links.mu);
	cl_peer_note_links(&j->peer, &j->links);
	return rc;
}

/* True when host is in the ascending list. */
static int included(const allreduce_result *r, int64_t host)
{
	for (size_t k = 0; k < r->n_included; k++)
		if (r->included[k] == host)
			return 1;
	return 0;
}

/* 4, across groups between the peers: j->sum holds the round's mean
 * already (several groups), or our group's sum (one); post its hash when
 * we are one of the group's posters (cross_posts_mean_hash). */
static cot_err round_mean_peers(round_job *j, cot_errbuf *eb)
{
	if (j->plan.n_groups == 1)
		cl_round_mean(j->sum, j->m->n_params, j->res.total_samples, j->sum);
	if (!cross_posts_mean_hash(j->res.included, j->res.n_included, j->p.host_id))
		return COT_OK;
	char sha[65];
	if (hash_sha256_hex(j->sum, j->m->n_params * sizeof *j->sum, sha))
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the mean");
	cot_err rc;
	cl_backoff bo = round_backoff();
	do
		rc = cl_api_mean_hash(&j->o, &j->p, j->v, j->res.included, j->res.n_included,
		                      (int64_t)j->res.total_samples, sha, eb);
	while (round_call_again(j, rc, &bo, j->plan.deadline, "posting the mean's hash", eb));
	return rc;
}

/* Our checkpoint of v+1 to the server, which asked for it (round_cross.sql:
 * we are the lowest host id of the majority). */
static cot_err upload_checkpoint(round_job *j, cot_errbuf *eb)
{
	char path[PATH_MAX + 32];
	snprintf(path, sizeof path, "%s/ckpt-XXXXXX", j->d->downloads_dir);
	int fd = mkstemp(path);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not create a file in \"%s\": %s",
		                  j->d->downloads_dir, strerror(errno));
	close(fd);
	/* Test hook: an uploader that lies about the moments. */
	int lie = cl_cheat_bad_moments() && j->m->n_params;
	float m0 = lie ? j->m->m[0] : 0;
	if (lie)
		j->m->m[0] += 1.0f;
	cot_err rc = ckpt_save(j->m, path, eb);
	if (lie)
		j->m->m[0] = m0;
	FILE *f = rc ? NULL : fopen(path, "rb");
	void *buf = NULL;
	long len = -1;
	if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)len)) && fread(buf, 1, (size_t)len, f) != (size_t)len) {
		free(buf);
		buf = NULL;
	}
	if (f)
		fclose(f);
	unlink(path);
	if (!rc && !buf)
		rc = cot_seterr(eb, COT_ERR_IO, "could not read our checkpoint of version %lld",
		                (long long)j->v + 1);
	if (!rc) {
		cl_backoff bo = round_backoff();
		do
			rc = cl_api_round_checkpoint(&j->o, &j->p, j->v, buf, (size_t)len, NULL, eb);
		while (round_call_again(j, rc, &bo, j->plan.deadline + 60, "sending our checkpoint", eb));
		if (!rc)
			log_info("project %s: round %lld: our checkpoint of version %lld sent (%ld bytes)",
			         j->p.name, (long long)j->v, (long long)j->v + 1, len);
	}
	free(buf);
	return rc;
}

/* 4. The round's mean into j->sum. */
static cot_err round_mean(round_job *j, cot_errbuf *eb)
{
	if (j->plan.cross_peers)
		return round_mean_peers(j, eb);
	if (j->hidden_upload) /* test hook (average) */
		memcpy(j->sum, j->hidden_upload, j->m->n_params * sizeof *j->sum);
	cot_err rc;
	cl_backoff bo = round_backoff();
	do
		rc = cl_api_group_sum(&j->o, &j->p, j->v, j->res.included, j->res.n_included,
		                      (int64_t)j->res.total_samples, j->sum, j->m->n_params, NULL, eb);
	while (round_call_again(j, rc, &bo, j->plan.deadline, "sending our group's sum", eb));
	if (rc)
		return rc;
	if (j->plan.n_groups == 1) {
		cl_round_mean(j->sum, j->m->n_params, j->res.total_samples, j->sum);
		return COT_OK;
	}
	activity(j, "waiting for the other groups");
	rc = wait_plan(j, 1, eb);
	if (rc)
		return rc;
	cl_daemon *d = j->d;
	cl_fetch_env env = { .cache_dir = d->cache_dir,
		             .downloads_dir = d->downloads_dir,
		             .max_file_bytes = d->cfg.max_file_bytes,
		             .timeout_s = d->cfg.http_timeout,
		             .cancel = &d->stop };
	char dest[PATH_MAX];
	if ((rc = cl_cache_fetch(&env, j->p.base, j->p.host_token, j->plan.gradient_sha256,
	                         (int64_t)j->m->n_params * 4, dest, sizeof dest, NULL, eb)))
		return rc;
	FILE *f = fopen(dest, "rb");
	size_t got = f ? fread(j->sum, sizeof *j->sum, j->m->n_params, f) : 0;
	if (f)
		fclose(f);
	unlink(dest);
	if (got != j->m->n_params)
		return cot_seterr(eb, COT_ERR_IO, "could not read the round's gradient %s",
		                  j->plan.gradient_sha256);
	return COT_OK;
}

/* 5. The optimizer step on the mean, and the hash of the result. */
static cot_err step(round_job *j, cot_errbuf *eb)
{
	json_t *info = NULL;
	cl_project tmp = j->p;
	cot_err rc;
	cl_backoff bo = round_backoff();
	do
		rc = cl_api_project(&j->o, &tmp, &info, eb);
	while (round_call_again(j, rc, &bo, j->plan.deadline, "reading the project's settings", eb));
	if (rc)
		return rc;
	char *cfg = json_dumps(json_object_get(info, "config"), JSON_COMPACT);
	json_decref(info);
	kern_opt_config oc;
	kern_mode_config mc;
	rc = cfg ? kern_opt_config_at(cfg, j->v, &oc, eb) : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (!rc)
		rc = kern_mode_config_from_json(cfg, &mc, eb);
	free(cfg);
	if (rc)
		return rc;
	if (j->m->step != j->v)
		return cot_seterr(eb, COT_ERR_CONFLICT, "our model has taken %ld steps, not %lld", j->m->step,
		                  (long long)j->v);
	if ((mc.mode == KERN_MODE_LOCAL) != cl_compute_is_local(j->s))
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "our session trained in %s mode, the project is in %s mode",
		                  cl_compute_is_local(j->s) ? "local" : "sync",
		                  mc.mode == KERN_MODE_LOCAL ? "local" : "sync");
	memcpy(j->m->grads, j->sum, j->m->n_params * sizeof *j->sum);
	rc = mc.mode == KERN_MODE_LOCAL ? kern_opt_outer_step(j->m, &mc.outer, eb)
	                                : kern_opt_step(j->m, &oc, NULL, eb);
	if (rc)
		return rc;
	if (hash_sha256_hex(j->m->params, j->m->n_params * sizeof *j->m->params, j->params_sha) ||
	    hash_sha256_hex2(j->m->m, j->m->n_params * sizeof *j->m->m, j->m->v,
	                     j->m->n_params * sizeof *j->m->v, j->moments_sha))
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the parameters or the moments");
	return COT_OK;
}

/* The second seed from an outcome answer a, once the round committed
 * (round_outcome_body): into *seed2, with *has set. */
static void parse_seed2(const json_t *a, uint64_t *seed2, int *has)
{
	const char *s = NULL;
	if (cot_json_str(a, "seed2", true, 1, 21, &s, NULL))
		return;
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (!*end && !errno) {
		*seed2 = (uint64_t)v;
		*has = 1;
	}
}

/* After the all-reduce, before the mean overwrites the group's sum: keep
 * what the check under the second seed needs (client/round_seed2.h), when
 * the round sketched what it averaged (in a group of one too:
 * allreduce_alone; across groups between the peers, where the result is
 * the round's mean, with our range's group sum before that stage).  Out of
 * memory, nothing is kept (logged). */
static void keep_for_seed2(round_job *j)
{
	const cl_plan *pl = &j->plan;
	cl_seed2_kept *kp = &j->kept;
	if (j->res.sketch_k <= 0)
		return;
	size_t n = j->m->n_params;
	kp->k = j->res.sketch_k;
	kp->n = n;
	kp->received = malloc((n ? n : 1) * sizeof *kp->received);
	kp->included = malloc((j->res.n_included + 1) * sizeof *kp->included);
	if (!kp->received || !kp->included)
		goto nomem;
	memcpy(kp->received, j->sum, n * sizeof *kp->received);
	memcpy(kp->included, j->res.included, j->res.n_included * sizeof *kp->included);
	kp->n_included = j->res.n_included;
	for (size_t a = 0; a < pl->n; a++)
		if (pl->members[a].hi > pl->members[a].lo) {
			kp->agg_id[kp->n_aggs] = pl->members[a].host_id;
			kp->agg_lo[kp->n_aggs] = pl->members[a].lo;
			kp->agg_hi[kp->n_aggs++] = pl->members[a].hi;
		}
	kp->lo = pl->members[pl->self].lo;
	kp->hi = pl->members[pl->self].hi;
	if (j->res.agg_slices) {
		size_t ni = j->res.n_included;
		kp->slice_host = malloc((ni + 1) * sizeof *kp->slice_host);
		kp->slice_err = malloc((ni + 1) * sizeof *kp->slice_err);
		if (!kp->slice_host || !kp->slice_err)
			goto nomem;
		memcpy(kp->slice_host, j->res.included, ni * sizeof *kp->slice_host);
		memcpy(kp->slice_err, j->res.agg_errs, ni * sizeof *kp->slice_err);
		kp->result_err = j->res.agg_result_err;
		kp->slices = j->res.agg_slices; /* ours now */
		kp->n_slices = ni;
		j->res.agg_slices = NULL;
		kp->group_sum = j->res.agg_group_sum_values; /* across groups: ours now */
		kp->group_sum_err = j->res.agg_group_sum_err;
		j->res.agg_group_sum_values = NULL;
		if (pl->cross_peers && pl->n_groups > 1 && !kp->group_sum) {
			/* not kept (out of memory): our range's checks are skipped */
			for (size_t i = 0; i < kp->n_slices; i++)
				free(kp->slices[i]);
			free(kp->slices);
			kp->slices = NULL;
			kp->n_slices = 0;
		}
	}
	cl_compute_take_blocks(j->s, &kp->blocks, &kp->n_blocks);
	int64_t in_blocks = 0, reported = 0;
	for (size_t b = 0; b < kp->n_blocks; b++)
		in_blocks += kp->blocks[b].count;
	for (int u = 0; u < j->acc.n; u++)
		reported += j->acc.u[u].mb;
	kp->blocks_ok = kp->n_blocks > 0 && in_blocks == reported;
	float **bg = kp->n_blocks ? malloc(kp->n_blocks * sizeof *bg) : NULL;
	for (size_t b = 0; bg && b < kp->n_blocks; b++)
		bg[b] = kp->blocks[b].grad;
	if (bg) /* test hook: claim blocks that add up to what we sent */
		cl_cheat_claim(bg, kp->n_blocks, j->m->grads, n, cl_compute_sketch_seed(j->s));
	free(bg);
	return;
nomem:
	log_warn("project %s: round %lld: out of memory for what the check under the second seed needs",
	         j->p.name, (long long)j->v);
	cl_seed2_kept_free(kp);
}

/* What the thread that sends the sketches under the second seed needs,
 * its own (seed2_main). */
typedef struct {
	cl_daemon *d;
	cl_api_opts o;
	cl_project p;
	int64_t v, attempt;
	char params_sha[65];
	uint64_t seed2;
	int has_seed2;
	cl_seed2_kept kept;
} seed2_job;

#define SEED2_WAIT_S 60 /* for the commit, after our step was accepted */

/* Once our step is accepted, off the round's critical path (its own
 * thread; the next version's work goes on): once the round committed in
 * our attempt (GET .../rounds), ask the outcome again for the second seed,
 * then send the sketches under it of what we kept.  Our outcome is sent
 * again only then: a committed round is final, while one sent as the round
 * reran would be taken as our outcome of the next attempt (without its
 * sketches).  Gives up when the round moves to another attempt, the server
 * refuses, SEED2_WAIT_S pass or the client stops.  Failures are logged;
 * the server denies a member whose blocks never come. */
static void send_seed2(seed2_job *s2)
{
	if (!s2->kept.received)
		return;
	double start = cl_now_mono();
	cot_errbuf eb = { "", "" };
	while (!s2->has_seed2 && !s2->d->stop && cl_now_mono() - start < SEED2_WAIT_S) {
		char state[16];
		int64_t at;
		round_state_at(&s2->o, &s2->p, s2->v, state, &at);
		if (state[0] && (at != s2->attempt ||
		                 (strcmp(state, "committed") != 0 && strcmp(state, "averaging") != 0))) {
			log_info("project %s: round %lld: no second seed for us: the round is %s in attempt "
			         "%lld",
			         s2->p.name, (long long)s2->v, state, (long long)at);
			return; /* another attempt: nothing of ours was stepped on */
		}
		if (strcmp(state, "committed") != 0) {
			sleep(1); /* not yet (or the server did not answer) */
			continue;
		}
		json_t *a = NULL;
		cot_err rc =
		        cl_api_round_outcome(&s2->o, &s2->p, s2->v, 1, 0, s2->kept.included,
		                             s2->kept.n_included, s2->params_sha, NULL, NULL, NULL, &a, &eb);
		if (rc && rc != COT_ERR_NETWORK) {
			log_info("project %s: round %lld: no second seed for us: %s", s2->p.name,
			         (long long)s2->v, eb.msg);
			return; /* not in the plan any more: another attempt ran */
		}
		long long att = 0;
		if (!rc) {
			parse_seed2(a, &s2->seed2, &s2->has_seed2);
			const json_t *ro = json_object_get(a, "round");
			const char *st = NULL;
			cot_json_str(ro, "state", false, 1, 15, &st, NULL);
			cot_json_int(ro, "attempt", false, 1, 1LL << 31, &att, NULL);
			int over = (st && strcmp(st, "committed") != 0 && strcmp(st, "averaging") != 0) ||
			           (att && att != s2->attempt);
			json_decref(a);
			if (over)
				return; /* another attempt: nothing of ours was stepped on */
		}
		if (!s2->has_seed2)
			sleep(1);
	}
	if (!s2->has_seed2) {
		log_warn("project %s: round %lld: no second seed came: %s", s2->p.name, (long long)s2->v,
		         eb.msg[0] ? eb.msg : "the round did not commit in time");
		return;
	}
	double t0 = cl_now_mono();
	json_t *sk = cl_seed2_sketches_json(&s2->kept, s2->seed2);
	double t1 = cl_now_mono();
	cot_err rc = sk ? cl_api_round_seed2(&s2->o, &s2->p, s2->v, sk, &eb)
	                : cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
	json_decref(sk);
	if (rc)
		log_warn("project %s: round %lld: could not send the sketches under the second seed: %s",
		         s2->p.name, (long long)s2->v, eb.msg);
	else
		log_info("project %s: round %lld: sketches under the second seed sent (%zu blocks%s, "
		         "sketched in %.3f s)",
		         s2->p.name, (long long)s2->v, s2->kept.blocks_ok ? s2->kept.n_blocks : 0,
		         s2->kept.slices ? ", our range's slices" : "", t1 - t0);
}

/* The sketches-under-the-second-seed thread: counted in rounds_running, so
 * that the daemon waits for it when it stops. */
static void *seed2_main(void *arg)
{
	seed2_job *s2 = arg;
	cl_daemon *d = s2->d;
	send_seed2(s2);
	cl_seed2_kept_free(&s2->kept);
	free(s2);
	pthread_mutex_lock(&d->lock);
	d->rounds_running--;
	pthread_cond_broadcast(&d->wake);
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

/* Hand what j kept to a thread of its own that sends its sketches under
 * the second seed (lock held; inline, unlocked, when no thread starts). */
static void seed2_start(round_job *j)
{
	cl_daemon *d = j->d;
	seed2_job *s2 = j->kept.received ? malloc(sizeof *s2) : NULL;
	if (!s2) {
		cl_seed2_kept_free(&j->kept);
		return;
	}
	*s2 = (seed2_job){ .d = d,
		           .o = j->o,
		           .p = j->p,
		           .v = j->v,
		           .attempt = j->plan.attempt,
		           .seed2 = j->seed2,
		           .has_seed2 = j->has_seed2,
		           .kept = j->kept };
	snprintf(s2->params_sha, sizeof s2->params_sha, "%s", j->params_sha);
	memset(&j->kept, 0, sizeof j->kept);
	pthread_t th;
	pthread_attr_t at;
	int started = 0;
	d->rounds_running++;
	if (pthread_attr_init(&at) == 0) {
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		started = pthread_create(&th, &at, seed2_main, s2) == 0;
		pthread_attr_destroy(&at);
	}
	if (!started) {
		d->rounds_running--;
		pthread_mutex_unlock(&d->lock);
		send_seed2(s2);
		pthread_mutex_lock(&d->lock);
		cl_seed2_kept_free(&s2->kept);
		free(s2);
	}
}

/* 6. The outcome, until the server tells whether our v+1 is its v+1:
 * 1 accepted, 0 not (reload), or an error. */
static cot_err outcome(round_job *j, int ok, int *accepted, cot_errbuf *eb)
{
	*accepted = 0;
	json_t *sk = ok ? cl_round_sketches_json(&j->res) : NULL;
	cot_err rc;
	int uploaded = 0;
	cl_backoff bo = round_backoff();
	for (;;) {
		json_t *a = NULL;
		double t0 = cl_now_mono();
		rc = cl_api_round_outcome(&j->o, &j->p, j->v, ok, ok ? PLAN_WAIT_S : 0, j->res.included,
		                          j->res.n_included, ok ? j->params_sha : NULL,
		                          ok ? j->moments_sha : NULL, &j->links, sk, &a, eb);
		if (round_call_again(j, rc, &bo, j->plan.deadline + 60, "sending our outcome", eb))
			continue;
		if (rc || !ok) {
			json_decref(a);
			break;
		}
		const json_t *acc = json_object_get(a, "accepted");
		const char *st = NULL;
		cot_json_str(json_object_get(a, "round"), "state", false, 1, 15, &st, NULL);
		int reopened = st && strcmp(st, "open") == 0;
		int decided = json_is_boolean(acc);
		int upload = !decided && json_is_true(json_object_get(a, "checkpoint_upload"));
		if (decided)
			*accepted = json_is_true(acc);
		parse_seed2(a, &j->seed2, &j->has_seed2);
		const char *ck = NULL;
		if (*accepted && !cot_json_str(a, "checkpoint_sha256", true, 64, 64, &ck, NULL) &&
		    hash_is_sha256_hex(ck))
			snprintf(j->ckpt_sha, sizeof j->ckpt_sha, "%s", ck);
		json_decref(a); /* acc with it */
		if (decided)
			break;
		if (upload && !uploaded) {
			uploaded = 1; /* once: when refused, the server asks the next peer */
			cot_errbuf e2 = { "", "" };
			if (upload_checkpoint(j, &e2))
				log_warn("project %s: round %lld: could not send our checkpoint: %s",
				         j->p.name, (long long)j->v, e2.msg);
			continue;
		}
		if (reopened) {
			rc = cot_seterr(eb, COT_ERR_CONFLICT, "the round failed and opened again");
			break;
		}
		if (j->d->stop || (int64_t)time(NULL) > j->plan.deadline + 60) {
			rc = cot_seterr(eb, COT_ERR_TIMEOUT,
			                "the server did not compute version %lld in time",
			                (long long)j->v + 1);
			break;
		}
		if (cl_now_mono() - t0 < 1)
			sleep(OUTCOME_RETRY_S); /* a server that does not hold the request */
	}
	json_decref(sk);
	return rc;
}

/* After an accepted step our model is the server's v+1: write it as the
 * checkpoint file the server wrote, so that joiners may fetch its pieces
 * from us (client/piece_server.h).  Kept in the cache only when it hashes
 * to the server's checkpoint; j->held_path then names it. */
static void keep_checkpoint(round_job *j)
{
	char tmp[PATH_MAX + 80], sha[65];
	long long size = 0;
	cot_errbuf eb = { "", "" };
	double t0 = cl_now_mono();
	snprintf(tmp, sizeof tmp, "%s/%s.own", j->d->downloads_dir, j->ckpt_sha);
	mkdir(j->d->downloads_dir, 0700);
	if (ckpt_save(j->m, tmp, &eb) || hash_file_sha256_hex(tmp, sha, &size, &eb)) {
		log_warn("project %s: could not write our checkpoint of version %lld: %s", j->p.name,
		         (long long)j->v + 1, eb.msg);
	} else if (strcmp(sha, j->ckpt_sha) != 0) {
		log_warn("project %s: our checkpoint of version %lld hashes to %s, the server's to %s: we do "
		         "not serve it",
		         j->p.name, (long long)j->v + 1, sha, j->ckpt_sha);
	} else if (cl_cache_path(j->d->cache_dir, sha, j->held_path, sizeof j->held_path, &eb) ||
	           rename(tmp, j->held_path)) {
		log_warn("project %s: could not keep our checkpoint of version %lld: %s", j->p.name,
		         (long long)j->v + 1, eb.msg[0] ? eb.msg : strerror(errno));
		j->held_path[0] = '\0';
	} else {
		j->held_size = (uint64_t)size;
		j->held_write_s = cl_now_mono() - t0;
		return;
	}
	unlink(tmp);
}

/* Wait a uniform random part of the round's report window
 * ("report_spread_ms", at most 60 s), so that the hosts of a large round do
 * not all report at the instant it closes (doc/api.md, "Rounds"); 1 when the
 * client stops meanwhile. */
static int spread_wait(round_job *j) { return nap(j, (double)j->spread_ms / 1000 * cl_random01()); }

/* The steps 1-6 outside the lock; *accepted as for outcome(). */
static cot_err run(round_job *j, int *accepted, cot_errbuf *eb)
{
	fault_point("before-report", j->v);
	activity(j, "reporting");
	if (j->spread_ms > 0 && spread_wait(j))
		return cot_seterr(eb, COT_ERR_TIMEOUT, "the client is stopping");
	cot_err rc = report_units(j, eb);
	if (rc)
		return rc;
	/* The live unit is now returned on the server: drop it here too. */
	pthread_mutex_lock(&j->d->lock);
	int i = cl_daemon_find(j->d, j->p.url);
	if (i >= 0) {
		cl_project *p = &j->d->st.projects[i];
		if (p->has_work && p->work.id == j->live_wu) {
			cl_project_mark_done(p, p->work.id);
			p->mb_total += p->work.mb_done;
			p->has_work = 0;
			memset(&p->work, 0, sizeof p->work);
			cl_daemon_save(j->d);
		}
	}
	pthread_mutex_unlock(&j->d->lock);
	activity(j, "waiting for the averaging plan");
	rc = wait_plan(j, 0, eb);
	if (rc)
		return rc;
	const cl_plan_member *me = &j->plan.members[j->plan.self];
	log_info("project %s: round %lld: attempt %lld planned: group %lld of %lld, %zu peers, we aggregate "
	         "[%lld, %lld)",
	         j->p.name, (long long)j->v, (long long)j->plan.attempt, (long long)j->plan.group,
	         (long long)j->plan.n_groups, j->plan.n, (long long)me->lo, (long long)me->hi);
	if (cl_compute_is_local(j->s)) {
		int64_t samples = 0;
		rc = cl_compute_finish(j->s, &samples, eb);
		if (rc)
			return rc;
		if (samples != me->samples)
			log_warn("project %s: round %lld: our contribution weighs %lld samples, the plan "
			         "says "
			         "%lld",
			         j->p.name, (long long)j->v, (long long)samples, (long long)me->samples);
	}
	fault_point("before-slices", j->v);
	if (!(j->sum = malloc(j->m->n_params * sizeof *j->sum)))
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the averaged gradient");
	char what[96];
	snprintf(what, sizeof what, "averaging in group %lld of %lld with %zu peers",
	         (long long)j->plan.group, (long long)j->plan.n_groups, j->plan.n);
	activity(j, what);
	double t0 = cl_now_mono();
	rc = average(j, eb);
	if (rc) {
		cot_errbuf e2 = { "", "" };
		outcome(j, 0, accepted, &e2); /* the server reruns the round */
		return rc;
	}
	double t1 = cl_now_mono();
	if (!included(&j->res, j->p.host_id)) {
		/* The checks of the others' slices need our aggregator's
		 * sketches (doc/credit.md, "Tied to the bytes"). */
		json_t *sk = j->res.agg_partials ? cl_round_sketches_json(&j->res) : NULL;
		cot_errbuf e2 = { "", "" };
		if (sk)
			cl_api_round_outcome(&j->o, &j->p, j->v, -1, 0, j->res.included, j->res.n_included,
			                     NULL, NULL, &j->links, sk, NULL, &e2);
		json_decref(sk);
		return cot_seterr(eb, COT_ERR_CONFLICT, "our group averaged without us");
	}
	keep_for_seed2(j);
	rc = round_mean(j, eb);
	if (rc)
		return rc;
	activity(j, "optimizer step");
	rc = step(j, eb);
	if (rc)
		return rc;
	fault_point("before-outcome", j->v);
	activity(j, "reporting the outcome");
	rc = outcome(j, 1, accepted, eb);
	if (rc)
		return rc;
	if (*accepted && j->ckpt_sha[0])
		keep_checkpoint(j);
	log_info("project %s: round %lld: averaged %llu samples of %zu peers (%zu dropped) in %.2f s; "
	         "parameters %s%s",
	         j->p.name, (long long)j->v, (unsigned long long)j->res.total_samples, j->res.n_included,
	         j->res.n_dropped, t1 - t0, j->params_sha,
	         *accepted ? "" : " differ from the server's: loading its checkpoint");
	return COT_OK;
}

void cl_daemon_round(cl_daemon *d, int i)
{
	cl_runtime *rt = &d->rt[i];
	round_job j = { .d = d,
		        .p = d->st.projects[i],
		        .v = rt->round_version,
		        .attempt = rt->round_attempt,
		        .spread_ms = rt->round_spread_ms,
		        .acc = rt->acc,
		        .s = rt->session };
	rt->round_due = 0;
	j.peer = rt->peer; /* ours for the round; given back at the end */
	memset(&rt->peer, 0, sizeof rt->peer);
	if (!j.s || rt->session_version != j.v || j.acc.n == 0) {
		rt->peer = j.peer;
		return;
	}
	cot_errbuf e2 = { "", "" };
	if (cl_compute_model(j.s, &j.m, &e2)) {
		rt->peer = j.peer;
		cl_daemon_drop_gradient(d, i, e2.msg);
		return;
	}
	const cl_work *w = &d->st.projects[i].work;
	if (d->st.projects[i].has_work && w->version == j.v) {
		/* A unit reported while live must not be below its last heartbeat;
		 * after a restart the gradient may be (see cl_round_acc). */
		for (int k = 0; k < j.acc.n; k++)
			if (j.acc.u[k].id == w->id && j.acc.u[k].mb < w->mb_reported) {
				rt->peer = j.peer;
				cl_daemon_drop_gradient(d, i,
				                        "its gradient lacks microbatches already reported");
				return;
			}
		j.live_wu = w->id;
	}
	/* The all-reduce accepts on our listener: the piece server stops. */
	cl_piece_server_detach(rt->pieces);
	cl_daemon_api_opts(d, &j.o);
	kern_set_threads(d->threads);
	pthread_mutex_unlock(&d->lock);

	cot_errbuf eb = { "", "" };
	int accepted = 0;
	cl_links_init(&j.links);
	cot_err rc = run(&j, &accepted, &eb);
	cl_plan_free(&j.plan);
	free(j.sum);
	free(j.hidden_upload);
	allreduce_result_free(&j.res);
	char links[560];
	cl_links_summary(&j.links, links, sizeof links);
	cl_links_destroy(&j.links);

	pthread_mutex_lock(&d->lock);
	i = cl_daemon_find(d, j.p.url); /* a detach may have moved or removed it */
	if (i < 0 || d->rt[i].session != j.s) {
		int held = 0;
		for (int k = 0; k < d->st.nprojects; k++)
			held |= d->rt[k].session == j.s;
		if (!held)
			cl_compute_close(j.s);
		cl_peer_free(&j.peer);
		cl_seed2_kept_free(&j.kept);
		return;
	}
	rt = &d->rt[i];
	rt->peer = j.peer;
	cl_daemon_pieces_lend(d, i);
	if (j.held_path[0] && rt->pieces) {
		cl_piece_server_hold(rt->pieces, j.ckpt_sha, j.held_path, j.held_size);
		log_info("project %s: serving pieces of checkpoint %s (version %lld, %llu bytes written in "
		         "%.3f s) to peers",
		         j.p.name, j.ckpt_sha, (long long)j.v + 1, (unsigned long long)j.held_size,
		         j.held_write_s);
	}
	if (links[0])
		snprintf(rt->links, sizeof rt->links, "round %lld: %s", (long long)j.v, links);
	if (j.reopened) {
		/* The server keeps our reports and wants more of this version:
		 * compute on into the same gradient. */
		for (int k = 0; k < rt->acc.n; k++)
			rt->acc.u[k].reported = 1;
		log_info("project %s: round %lld reopened for the rest of its batch; computing on", j.p.name,
		         (long long)j.v);
		cl_daemon_activity(d, i, "round %lld reopened for the rest", (long long)j.v);
		cl_seed2_kept_free(&j.kept);
		return;
	}
	if (rc || !accepted) {
		if (rc)
			log_warn("project %s: round %lld: %s%s%s; its samples go back to the server's pool",
			         j.p.name, (long long)j.v, eb.msg, eb.hint[0] ? ". " : "", eb.hint);
		cl_daemon_drop_gradient(d, i,
		                        rc ? "the round failed for this host" : "our parameters differ");
		cl_seed2_kept_free(&j.kept);
		return;
	}
	/* The session now holds v+1, exactly the server's of the attempt it
	 * took part in: its work units must name that attempt's checkpoint
	 * (another attempt may still commit instead). */
	rt->session_version = j.v + 1;
	snprintf(rt->session_ckpt, sizeof rt->session_ckpt, "%s", j.ckpt_sha);
	rt->session_wu = 0;
	memset(&rt->acc, 0, sizeof rt->acc);
	cl_compute_next_version(j.s);
	cl_daemon_activity(d, i, "round %lld committed", (long long)j.v);
	/* The next version's work goes on: the sketches under the second
	 * seed go out meanwhile, from a thread of their own. */
	seed2_start(&j);
}

typedef struct {
	cl_daemon *d;
	char url[CL_URL_MAX];
} round_arg;

static void *round_main(void *arg)
{
	round_arg *a = arg;
	cl_daemon *d = a->d;
	pthread_mutex_lock(&d->lock);
	int i = cl_daemon_find(d, a->url);
	if (i >= 0)
		cl_daemon_round(d, i);
	i = cl_daemon_find(d, a->url);
	if (i >= 0)
		d->rt[i].round_running = 0;
	d->rounds_running--;
	d->idle_since = (int64_t)time(NULL);
	pthread_cond_broadcast(&d->wake);
	pthread_mutex_unlock(&d->lock);
	free(a);
	return NULL;
}

void cl_daemon_round_start(cl_daemon *d, int i)
{
	round_arg *a = malloc(sizeof *a);
	pthread_t th;
	pthread_attr_t at;
	if (!a || pthread_attr_init(&at)) {
		free(a);
		cl_daemon_round(d, i); /* no thread: take part inline */
		return;
	}
	a->d = d;
	snprintf(a->url, sizeof a->url, "%s", d->st.projects[i].url);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	d->rt[i].round_running = 1;
	d->rounds_running++;
	if (pthread_create(&th, &at, round_main, a)) {
		d->rt[i].round_running = 0;
		d->rounds_running--;
		free(a);
		cl_daemon_round(d, i);
	}
	pthread_attr_destroy(&at);
}

void cl_daemon_rounds_wait(cl_daemon *d, double timeout_s)
{
	double end = cl_now_mono() + timeout_s;
	pthread_mutex_lock(&d->lock);
	while (d->rounds_running > 0 && cl_now_mono() < end) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 200 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&d->wake, &d->lock, &ts);
	}
	pthread_mutex_unlock(&d->lock);
}
