/* cotrain-server: the HTTP API's connections, policed (see http_conns.h). */
#include "server/http_conns.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "shared/common/log.h"

typedef struct conn_entry {
	int fd;
	double since; /* when the current head began */
	bool in_head; /* no head of the current request yet */
	bool first;   /* the connection's first request */
	bool shut;    /* shut down already */
	struct conn_entry *prev, *next;
} conn_entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static conn_entry *head, *tail; /* accept order */
static int n_open;
static double idle_timeout;
static bool stopping, started;
static pthread_t thread;
static unsigned long n_timed_out, n_shed;

static double now_mono(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void http_conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode code)
{
	(void)cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
		        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		conn_entry *e = ci ? calloc(1, sizeof *e) : NULL;
		*socket_context = e;
		if (!e)
			return; /* not policed; libmicrohttpd's own limits still hold */
		e->fd = ci->connect_fd;
		e->since = now_mono();
		e->in_head = e->first = true;
		pthread_mutex_lock(&lock);
		e->prev = tail;
		if (tail)
			tail->next = e;
		else
			head = e;
		tail = e;
		n_open++;
		pthread_mutex_unlock(&lock);
		return;
	}
	conn_entry *e = *socket_context;
	if (!e)
		return;
	pthread_mutex_lock(&lock);
	if (e->prev)
		e->prev->next = e->next;
	else
		head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		tail = e->prev;
	n_open--;
	pthread_mutex_unlock(&lock);
	free(e);
	*socket_context = NULL;
}

static conn_entry *entry_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
	        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return ci ? ci->socket_context : NULL;
}

double http_conns_head_done(struct MHD_Connection *conn)
{
	conn_entry *e = entry_of(conn);
	if (!e)
		return -1;
	pthread_mutex_lock(&lock);
	double waited = e->first && e->in_head ? now_mono() - e->since : -1;
	e->in_head = false;
	pthread_mutex_unlock(&lock);
	return waited;
}

void http_conns_request_done(struct MHD_Connection *conn)
{
	conn_entry *e = entry_of(conn);
	if (!e)
		return;
	pthread_mutex_lock(&lock);
	e->in_head = true;
	e->first = false;
	e->since = now_mono();
	pthread_mutex_unlock(&lock);
}

/* Shut e down (lock held). */
static void shut(conn_entry *e)
{
	shutdown(e->fd, SHUT_RDWR);
	e->shut = true;
}

/* One pass (lock held): the deadlines, then the shedding. */
static void sweep(double now)
{
	for (conn_entry *e = head; e; e = e->next)
		if (e->in_head && !e->shut &&
		    now - e->since > (e->first ? HTTP_HEAD_TIMEOUT_S : idle_timeout)) {
			shut(e);
			n_timed_out++;
		}
	int open = n_open;
	for (conn_entry *e = head; e && open > HTTP_SHED_AT; e = e->next)
		if (e->shut) {
			open--; /* going already */
		} else if (e->in_head && now - e->since > HTTP_SHED_AGE_S) {
			shut(e);
			n_shed++;
			open--;
		}
}

static void *police(void *arg)
{
	(void)arg;
	unsigned long logged_t = 0, logged_s = 0;
	pthread_mutex_lock(&lock);
	while (!stopping) {
		sweep(now_mono());
		if (n_timed_out != logged_t || n_shed != logged_s) {
			log_info("http: %lu connections cut for a request head slower than %.0f s, %lu shed "
			         "with more than %d open (so far)",
			         n_timed_out, HTTP_HEAD_TIMEOUT_S, n_shed, HTTP_SHED_AT);
			logged_t = n_timed_out;
			logged_s = n_shed;
		}
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 1;
		pthread_cond_timedwait(&cond, &lock, &until);
	}
	pthread_mutex_unlock(&lock);
	return NULL;
}

cot_err http_conns_start(double idle_timeout_s, cot_errbuf *eb)
{
	pthread_mutex_lock(&lock);
	idle_timeout = idle_timeout_s;
	stopping = false;
	pthread_mutex_unlock(&lock);
	if (pthread_create(&thread, NULL, police, NULL) != 0)
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not start the connection watch thread");
	started = true;
	return COT_OK;
}

void http_conns_stop(void)
{
	if (!started)
		return;
	pthread_mutex_lock(&lock);
	stopping = true;
	pthread_cond_signal(&cond);
	pthread_mutex_unlock(&lock);
	pthread_join(thread, NULL);
	started = false;
}

void http_conns_counts(unsigned long *timed_out, unsigned long *shed)
{
	pthread_mutex_lock(&lock);
	*timed_out = n_timed_out;
	*shed = n_shed;
	pthread_mutex_unlock(&lock);
}
