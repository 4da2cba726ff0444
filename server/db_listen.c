/* cotrain-server: PostgreSQL notifications as wake-ups (db_listen.h). */
#include "server/db_listen.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "shared/common/log.h"

struct db_listen {
	pthread_t thread;
	int stop_fd[2]; /* a byte written to [1] stops the thread */
	const char *conninfo, *channel;
	void (*on_notify)(void *arg);
	void *arg;
};

/* Wait until fd is readable, the stop pipe is, or ms pass (-1: forever).
 * True when the thread is to stop. */
static bool wait_for(db_listen *l, int fd, int ms, bool *readable)
{
	struct pollfd p[2] = { { .fd = l->stop_fd[0], .events = POLLIN }, { .fd = fd, .events = POLLIN } };
	int n = poll(p, fd >= 0 ? 2 : 1, ms);
	if (readable)
		*readable = n > 0 && fd >= 0 && (p[1].revents & (POLLIN | POLLERR | POLLHUP));
	return n > 0 && (p[0].revents & (POLLIN | POLLERR | POLLHUP));
}

/* A connection listening on the channel, or NULL (logged once per outage). */
static PGconn *connect_listen(db_listen *l, bool *logged)
{
	PGconn *c = PQconnectdb(l->conninfo);
	if (PQstatus(c) == CONNECTION_OK) {
		char *id = PQescapeIdentifier(c, l->channel, strlen(l->channel));
		char sql[200];
		snprintf(sql, sizeof sql, "LISTEN %s", id ? id : "");
		PQfreemem(id);
		PGresult *r = PQexec(c, sql);
		bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
		PQclear(r);
		if (ok) {
			if (*logged)
				log_info("listening for %s notifications again", l->channel);
			*logged = false;
			return c;
		}
	}
	if (!*logged)
		log_warn("could not listen for %s notifications (retrying every second): %s", l->channel,
		         PQerrorMessage(c));
	*logged = true;
	PQfinish(c);
	return NULL;
}

static void *run(void *arg)
{
	db_listen *l = arg;
	PGconn *c = NULL;
	bool logged = false;
	for (;;) {
		if (!c) {
			if (!(c = connect_listen(l, &logged))) {
				if (wait_for(l, -1, 1000, NULL))
					break;
				continue;
			}
			l->on_notify(l->arg); /* what was sent while we were away */
		}
		int fd = PQsocket(c);
		if (fd < 0 || PQstatus(c) != CONNECTION_OK) {
			PQfinish(c);
			c = NULL;
			continue;
		}
		bool readable = false;
		if (wait_for(l, fd, -1, &readable))
			break;
		if (!readable)
			continue;
		if (!PQconsumeInput(c)) {
			PQfinish(c);
			c = NULL;
			continue;
		}
		int n = 0;
		PGnotify *nf;
		while ((nf = PQnotifies(c))) {
			PQfreemem(nf);
			n++;
		}
		if (n)
			l->on_notify(l->arg);
	}
	PQfinish(c);
	return NULL;
}

cot_err db_listen_start(const char *conninfo, const char *channel, void (*on_notify)(void *arg), void *arg,
                        db_listen **out, cot_errbuf *eb)
{
	db_listen *l = calloc(1, sizeof *l);
	if (!l)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	*l = (db_listen){ .conninfo = conninfo, .channel = channel, .on_notify = on_notify, .arg = arg };
	if (pipe2(l->stop_fd, O_CLOEXEC) != 0) {
		free(l);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not make the listener's pipe");
	}
	if (pthread_create(&l->thread, NULL, run, l) != 0) {
		close(l->stop_fd[0]);
		close(l->stop_fd[1]);
		free(l);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not start the %s listener thread", channel);
	}
	*out = l;
	return COT_OK;
}

void db_listen_stop(db_listen *l)
{
	if (!l)
		return;
	ssize_t w = write(l->stop_fd[1], "", 1);
	(void)w;
	pthread_join(l->thread, NULL);
	close(l->stop_fd[0]);
	close(l->stop_fd[1]);
	free(l);
}
