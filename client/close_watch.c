/* cotrain client: the close notice (see close_watch.h). */
#include "client/close_watch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shared/common/log.h"

#define WATCH_WAIT_S 30
#define WATCH_RETRY_S 5 /* after a transport error */

struct cl_close_watch {
	cl_daemon *d;
	pthread_t thread;
};

/* Sleep up to s seconds on d->wake (lock held). */
static void pause_locked(cl_daemon *d, int s)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += s;
	pthread_cond_timedwait(&d->wake, &d->lock, &ts);
}

/* The project whose unit the worker computes now, or -1 (lock held). */
static int computing_project(cl_daemon *d)
{
	int64_t wu = d->computing_wu;
	for (int i = 0; wu != 0 && i < d->st.nprojects; i++)
		if (d->st.projects[i].has_work && d->st.projects[i].work.id == wu &&
		    !d->rt[i].close_watch_off)
			return i;
	return -1;
}

static void *watch_main(void *arg)
{
	cl_close_watch *w = arg;
	cl_daemon *d = w->d;
	pthread_mutex_lock(&d->lock);
	while (!d->stop) {
		int i = computing_project(d);
		if (i < 0) {
			pause_locked(d, 1);
			continue;
		}
		cl_project p = d->st.projects[i];
		cl_api_opts o;
		cl_daemon_api_opts(d, &o);
		pthread_mutex_unlock(&d->lock);

		char url[CL_URL_MAX + 96];
		snprintf(url, sizeof url, "%s/v1/workunits/%lld/round?wait=%d", p.base, (long long)p.work.id,
		         WATCH_WAIT_S);
		json_t *a = NULL;
		long status = 0;
		cot_errbuf eb = { "", "" };
		cl_http_req r = { .method = "GET",
			          .url = url,
			          .bearer = p.host_token,
			          .out = &a,
			          .status = &status,
			          .extra_timeout_s = WATCH_WAIT_S,
			          .cancel = &d->stop };
		double t0 = cl_now_mono();
		cot_err rc = cl_api_http(&o, &r, &eb);

		pthread_mutex_lock(&d->lock);
		int j = cl_daemon_find(d, p.url);
		int same = j >= 0 && d->st.projects[j].has_work && d->st.projects[j].work.id == p.work.id;
		if (!rc && same) {
			cl_daemon_note_round(d, j, a);
		} else if (status == 404 && same) {
			/* Our own live unit unknown: a server without the notice. */
			log_info("project %s: the server has no close notice; the round's close comes with "
			         "heartbeats",
			         p.name);
			d->rt[j].close_watch_off = 1;
		}
		json_decref(a);
		if (rc && status != 404 && !d->stop)
			pause_locked(d, WATCH_RETRY_S);
		else if (!rc && cl_now_mono() - t0 < 1 && !d->stop)
			pause_locked(d, 1); /* answered at once and nothing closed: not a busy loop */
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

cot_err cl_close_watch_start(cl_daemon *d, cl_close_watch **out, cot_errbuf *eb)
{
	cl_close_watch *w = calloc(1, sizeof *w);
	if (!w)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	w->d = d;
	if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
		free(w);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not start the close notice thread");
	}
	*out = w;
	return COT_OK;
}

void cl_close_watch_stop(cl_close_watch *w)
{
	if (!w)
		return;
	pthread_join(w->thread, NULL);
	free(w);
}
