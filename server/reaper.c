/* cotrain-server: the reaper thread. */
#include "server/reaper.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "server/dbconn.h"
#include "server/duty.h"
#include "server/http.h"
#include "shared/common/log.h"

#define REAP_BATCH 1000
#define REAP_BATCH_S "1000"

struct reaper {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stop;
	int interval_s;
	duty *duty; /* DUTY_REAPER: only its holder reaps */
};

static const dbc_stmt st_reap = { "sched_reap", "SELECT sched_reap($1)", 1 };

/* One pass: expire in batches until a batch comes back short. */
static void reap_once(void)
{
	static const char *params[] = { REAP_BATCH_S };
	long total = 0;
	for (;;) {
		PGresult *r;
		char state[6];
		cot_errbuf eb = { 0 };
		if (dbc_exec(&st_reap, params, &r, state, &eb)) {
			log_warn("reaper: %s", eb.msg);
			return;
		}
		long n = atol(PQgetvalue(r, 0, 0));
		PQclear(r);
		total += n;
		if (n < REAP_BATCH)
			break;
	}
	if (total) {
		log_info("reaper: %ld work units expired, their ranges back in the pool", total);
		http_wake_held(); /* work requests waiting for a round's target to free up */
	}
}

static void *run(void *arg)
{
	reaper *rp = arg;
	pthread_mutex_lock(&rp->lock);
	while (!rp->stop) {
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += rp->interval_s;
		while (!rp->stop && pthread_cond_timedwait(&rp->wake, &rp->lock, &until) == 0)
			;
		if (rp->stop)
			break;
		pthread_mutex_unlock(&rp->lock);
		if (duty_held(rp->duty))
			reap_once();
		pthread_mutex_lock(&rp->lock);
	}
	pthread_mutex_unlock(&rp->lock);
	dbc_close_thread();
	return NULL;
}

cot_err reaper_start(const char *conninfo, int interval_s, reaper **out, cot_errbuf *eb)
{
	reaper *rp = calloc(1, sizeof *rp);
	if (!rp)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	cot_err rc = duty_open(conninfo, DUTY_REAPER, &rp->duty, eb);
	if (rc) {
		free(rp);
		return rc;
	}
	rp->interval_s = interval_s < 1 ? 1 : interval_s;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&rp->wake, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&rp->lock, NULL);
	if (pthread_create(&rp->thread, NULL, run, rp)) {
		pthread_cond_destroy(&rp->wake);
		pthread_mutex_destroy(&rp->lock);
		duty_close(rp->duty);
		free(rp);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not start the reaper thread");
	}
	*out = rp;
	return COT_OK;
}

void reaper_stop(reaper *rp)
{
	if (!rp)
		return;
	pthread_mutex_lock(&rp->lock);
	rp->stop = true;
	pthread_cond_signal(&rp->wake);
	pthread_mutex_unlock(&rp->lock);
	pthread_join(rp->thread, NULL);
	pthread_cond_destroy(&rp->wake);
	pthread_mutex_destroy(&rp->lock);
	duty_close(rp->duty);
	free(rp);
}
