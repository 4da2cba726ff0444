/* cotrain: the accepting side of brokered connections (nat.h): meet each
 * peer that will dial us, do our half of a punch, and bridge a punched or
 * relayed connection to our own listener. */
#include "shared/nat.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shared/deadline.h"
#include "shared/log.h"

#define ACCEPT_MAX 256
/* How long after the moment a relay fallback waits for the dialer: it gives
 * up on a punch after NAT_PUNCH_WINDOW_MS, on a direct dial later. */
#define FALLBACK_PUNCH_MS (NAT_PUNCH_WINDOW_MS + 3000)
#define FALLBACK_DIRECT_MS 10000

typedef struct {
	struct nat_acceptor *a;
	int64_t peer;
	pthread_t th;
	bool started;
	char plan[8];
} slot;

struct nat_acceptor {
	const nat_config *c;
	const char *project;
	int64_t version;
	int64_t deadline;
	volatile int stop;
	pthread_mutex_t mu;
	size_t n;
	slot s[];
};

/* Connect to our own listener (its wildcard address as loopback). */
static int own_listener(const nat_config *c, int64_t deadline, cot_errbuf *eb)
{
	const char *la = c->listen_addr && *c->listen_addr ? c->listen_addr : "0.0.0.0";
	if (strcmp(la, "0.0.0.0") == 0)
		la = "127.0.0.1";
	else if (strcmp(la, "::") == 0)
		la = "::1";
	int fd = nat_plain_connect(la, c->listen_port, eb);
	if (fd >= 0 && nat_connect_wait(fd, la, c->listen_port, deadline, eb)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static void *slot_main(void *arg)
{
	slot *sl = arg;
	nat_acceptor *a = sl->a;
	const nat_config *c = a->c;
	cot_errbuf eb = { { 0 }, { 0 } };
	nat_meeting m;
	if (nat_meet(c, a->project, a->version, sl->peer, false, a->deadline, &a->stop, &m, &eb)) {
		log_warn("nat: could not meet host %lld: %s", (long long)sl->peer, eb.msg);
		return NULL;
	}
	pthread_mutex_lock(&a->mu);
	snprintf(sl->plan, sizeof sl->plan, "%s", m.plan);
	pthread_mutex_unlock(&a->mu);
	int64_t until = a->deadline;
	int rfd = -1;
	if (strcmp(m.plan, "punch") == 0) {
		/* Our half of the simultaneous open; the connection it makes is
		 * handed to our listener like a relayed one. */
		if (nat_punch_connect(c, &m, a->deadline, &rfd, &eb) != COT_OK) {
			log_info("nat: punch toward host %lld failed: %s", (long long)sl->peer, eb.msg);
			rfd = -1;
		}
		if (m.moment + FALLBACK_PUNCH_MS < until)
			until = m.moment + FALLBACK_PUNCH_MS;
	} else if (strcmp(m.plan, "direct") == 0) {
		if (m.moment + FALLBACK_DIRECT_MS < until)
			until = m.moment + FALLBACK_DIRECT_MS;
	}
	if (a->stop) {
		if (rfd >= 0)
			close(rfd);
		return NULL;
	}
	/* The relay: the plan, or the fallback the dialer takes when its
	 * direct attempt or punch fails.  The server holds our half until the
	 * dialer comes or its wait ends (a 408 then: nothing to do). */
	if (rfd < 0) {
		cot_err rc = nat_relay_join(c, a->project, a->version, sl->peer, false, until, &a->stop, &rfd, &eb);
		if (rc) {
			if (strcmp(m.plan, "relay") == 0)
				log_warn("nat: could not relay host %lld: %s", (long long)sl->peer, eb.msg);
			return NULL;
		}
	}
	int lfd = own_listener(c, a->deadline, &eb);
	if (lfd < 0) {
		log_warn("nat: could not hand the connection of host %lld to our listener: %s",
		         (long long)sl->peer, eb.msg);
		close(rfd);
		return NULL;
	}
	nat_bridge(rfd, lfd, a->deadline, &a->stop);
	close(rfd);
	close(lfd);
	return NULL;
}

cot_err nat_acceptor_start(const nat_config *c, const char *project, int64_t version,
                           const int64_t *peers, size_t n, int64_t deadline, nat_acceptor **out,
                           cot_errbuf *eb)
{
	if (n > ACCEPT_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "at most %d peers, not %zu", ACCEPT_MAX, n);
	nat_acceptor *a = calloc(1, sizeof *a + n * sizeof(slot));
	if (!a)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	a->c = c;
	a->project = project;
	a->version = version;
	a->deadline = deadline;
	a->n = n;
	pthread_mutex_init(&a->mu, NULL);
	for (size_t i = 0; i < n; i++) {
		a->s[i].a = a;
		a->s[i].peer = peers[i];
		a->s[i].started = pthread_create(&a->s[i].th, NULL, slot_main, &a->s[i]) == 0;
		if (!a->s[i].started) {
			nat_acceptor_stop(a);
			return cot_seterr(eb, COT_ERR_IO, "could not start a thread");
		}
	}
	*out = a;
	return COT_OK;
}

const char *nat_acceptor_plan(nat_acceptor *a, size_t i)
{
	if (i >= a->n)
		return "";
	pthread_mutex_lock(&a->mu);
	const char *p = a->s[i].plan;
	pthread_mutex_unlock(&a->mu);
	return p;
}

void nat_acceptor_stop(nat_acceptor *a)
{
	if (!a)
		return;
	a->stop = 1;
	for (size_t i = 0; i < a->n; i++)
		if (a->s[i].started)
			pthread_join(a->s[i].th, NULL);
	pthread_mutex_destroy(&a->mu);
	free(a);
}
