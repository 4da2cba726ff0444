/* cotrain-server: the file store's collector on a timer (see gc_timer.h). */
#include "server/gc_timer.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include <libpq-fe.h>

#include "server/duty.h"
#include "shared/common/log.h"

struct gc_timer {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	const char *conninfo, *store;
	fgc_policy pol;
	int interval_s;
	duty *duty; /* DUTY_GC: only its holder runs */
};

static void one_pass(gc_timer *t)
{
	PGconn *c = PQconnectdb(t->conninfo);
	cot_errbuf eb = { 0 };
	fgc_totals tot;
	if (PQstatus(c) != CONNECTION_OK)
		log_warn("file store collection: could not connect: %s", PQerrorMessage(c));
	else if (fgc_run(c, t->store, &t->pol, NULL, NULL, &tot, &eb))
		log_warn("file store collection: %s", eb.msg);
	else if (tot.files)
		log_info("file store collection: removed %ld files, %llu bytes", tot.files,
		         (unsigned long long)tot.bytes);
	PQfinish(c);
}

static void *timer_main(void *arg)
{
	gc_timer *t = arg;
	pthread_mutex_lock(&t->mu);
	while (!t->stop) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += t->interval_s;
		while (!t->stop && pthread_cond_timedwait(&t->cv, &t->mu, &until) != ETIMEDOUT)
			;
		if (t->stop)
			break;
		pthread_mutex_unlock(&t->mu);
		if (duty_held(t->duty))
			one_pass(t);
		pthread_mutex_lock(&t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

cot_err gc_timer_start(const char *conninfo, const char *store_dir, const fgc_policy *pol, int interval_s,
                       gc_timer **out, cot_errbuf *eb)
{
	gc_timer *t = calloc(1, sizeof *t);
	if (!t)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	t->conninfo = conninfo;
	t->store = store_dir;
	t->pol = *pol;
	t->pol.dry_run = false;
	t->interval_s = interval_s > 0 ? interval_s : 3600;
	cot_err rc = duty_open(conninfo, DUTY_GC, &t->duty, eb);
	if (rc) {
		free(t);
		return rc;
	}
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	if (pthread_create(&t->thread, NULL, timer_main, t)) {
		pthread_mutex_destroy(&t->mu);
		pthread_cond_destroy(&t->cv);
		duty_close(t->duty);
		free(t);
		return cot_seterr(eb, COT_ERR_IO, "could not start the file store collection thread");
	}
	*out = t;
	return COT_OK;
}

void gc_timer_stop(gc_timer *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	t->stop = true;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
	pthread_join(t->thread, NULL);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
	duty_close(t->duty);
	free(t);
}
