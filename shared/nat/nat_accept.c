/* cotrain: the accepting side of brokered connections (nat.h): meet each
 * peer that will dial us once per connection it opens, do our half of a
 * punch, and bridge a punched or relayed connection to our own listener;
 * note the rung that carried each connection. */
#include "shared/nat/nat.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shared/common/deadline.h"
#include "shared/common/log.h"

#define ACCEPT_MAX 256
/* How long after the moment a relay fallback waits for the dialer: it gives
 * up on a punch after NAT_PUNCH_WINDOW_MS, on a direct dial later. */
#define FALLBACK_PUNCH_MS (NAT_PUNCH_WINDOW_MS + 3000)
#define FALLBACK_DIRECT_MS 10000
#define FALLBACK_LAN_MS (NAT_LAN_WINDOW_MS + 3000)

#define CONNS_PER_PEER 16 /* connections helped in per peer (the broker's bound too) */
#define RETRY_MS 500

typedef struct slot slot;

/* One connection being helped in: its meeting and its thread. */
typedef struct {
	slot *sl;
	nat_meeting m;
	pthread_t th;
	char rung[8]; /* what carried it, once known (under the acceptor's mu) */
} conn;

struct slot {
	struct nat_acceptor *a;
	int64_t peer;
	pthread_t th;
	bool started;
	size_t n_conns; /* conns[0..n_conns) started (written under the acceptor's mu) */
	conn conns[CONNS_PER_PEER];
};

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

/* Note what carried cn. */
static void set_rung(conn *cn, const char *rung)
{
	pthread_mutex_lock(&cn->sl->a->mu);
	snprintf(cn->rung, sizeof cn->rung, "%s", rung);
	pthread_mutex_unlock(&cn->sl->a->mu);
}

/* Help one connection in, following its meeting's plan: our half of a
 * punch, or the relay (the plan, or the dialer's fallback when its direct
 * dial or punch fails); what connects is bridged to our listener. */
static void *conn_main(void *arg)
{
	conn *cn = arg;
	slot *sl = cn->sl;
	nat_acceptor *a = sl->a;
	const nat_config *c = a->c;
	const nat_meeting *m = &cn->m;
	cot_errbuf eb = { { 0 }, { 0 } };
	int64_t until = a->deadline;
	int rfd = -1;
	if (strcmp(m->plan, "punch") == 0) {
		if (nat_punch_connect(c, m, a->deadline, &rfd, &eb) != COT_OK) {
			log_info("nat: punch toward host %lld failed: %s", (long long)sl->peer, eb.msg);
			rfd = -1;
		} else {
			set_rung(cn, "punch");
		}
		if (m->moment + FALLBACK_PUNCH_MS < until)
			until = m->moment + FALLBACK_PUNCH_MS;
	} else if (strcmp(m->plan, "direct") == 0) {
		if (m->moment + FALLBACK_DIRECT_MS < until)
			until = m->moment + FALLBACK_DIRECT_MS;
	} else if (strcmp(m->plan, "lan") == 0) {
		if (m->moment + FALLBACK_LAN_MS < until)
			until = m->moment + FALLBACK_LAN_MS;
	}
	if (a->stop) {
		if (rfd >= 0)
			close(rfd);
		return NULL;
	}
	/* The server holds our relay half until the dialer comes or our wait
	 * ends (nothing to do then: it connected some other way). */
	if (rfd < 0) {
		cot_err rc = nat_relay_join(c, a->project, a->version, sl->peer, false, until, &a->stop, &rfd,
		                            &eb);
		if (rc) {
			if (strcmp(m->plan, "relay") == 0)
				log_warn("nat: could not relay host %lld: %s", (long long)sl->peer, eb.msg);
			else if (strcmp(m->plan, "punch") != 0)
				set_rung(cn, m->plan); /* the dialer connected as planned */
			return NULL;
		}
		set_rung(cn, "relay");
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

/* Meet the peer once for each connection it opens, until the round is over
 * for us (deadline, stop) or the broker refuses for good. */
static void *slot_main(void *arg)
{
	slot *sl = arg;
	nat_acceptor *a = sl->a;
	while (!a->stop && deadline_left_ms(a->deadline) > 0 && sl->n_conns < CONNS_PER_PEER) {
		cot_errbuf eb = { { 0 }, { 0 } };
		conn *cn = &sl->conns[sl->n_conns];
		cn->sl = sl;
		cot_err rc = nat_meet(a->c, a->project, a->version, sl->peer, false, a->deadline, &a->stop,
		                      &cn->m, &eb);
		if (rc == COT_ERR_TIMEOUT)
			continue; /* the peer opened nothing more while we waited */
		if (rc == COT_ERR_FORBIDDEN || rc == COT_ERR_CONFLICT || rc == COT_ERR_NOT_FOUND ||
		    rc == COT_ERR_AUTH || rc == COT_ERR_INVALID) {
			if (!a->stop)
				log_info("nat: no more meetings with host %lld: %s", (long long)sl->peer,
				         eb.msg);
			break;
		}
		if (rc) {
			log_warn("nat: could not meet host %lld: %s", (long long)sl->peer, eb.msg);
			int64_t t = deadline_now_ms() + RETRY_MS;
			while (!a->stop && deadline_now_ms() < t)
				usleep(100 * 1000);
			continue;
		}
		cn->rung[0] = 0;
		if (pthread_create(&cn->th, NULL, conn_main, cn) != 0) {
			log_warn("nat: could not start a thread for host %lld", (long long)sl->peer);
			break;
		}
		pthread_mutex_lock(&a->mu);
		sl->n_conns++;
		pthread_mutex_unlock(&a->mu);
	}
	for (size_t i = 0; i < sl->n_conns; i++)
		pthread_join(sl->conns[i].th, NULL);
	return NULL;
}

cot_err nat_acceptor_start(const nat_config *c, const char *project, int64_t version, const int64_t *peers,
                           size_t n, int64_t deadline, nat_acceptor **out, cot_errbuf *eb)
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

/* The first connection of peer i whose rung is known: decided by its
 * thread, or, for a direct or lan plan whose relay fallback did not join
 * (yet), the plan: once the dialer has used the connection it would have
 * joined.  With plan, its plan instead.  Call with a->mu held. */
static const char *first_rung(nat_acceptor *a, size_t i, bool plan)
{
	slot *sl = &a->s[i];
	for (size_t k = 0; k < sl->n_conns; k++) {
		const conn *cn = &sl->conns[k];
		if (cn->rung[0])
			return plan ? cn->m.plan : cn->rung;
		if (strcmp(cn->m.plan, "direct") == 0 || strcmp(cn->m.plan, "lan") == 0)
			return cn->m.plan;
	}
	return "";
}

const char *nat_acceptor_rung(nat_acceptor *a, size_t i)
{
	if (i >= a->n)
		return "";
	pthread_mutex_lock(&a->mu);
	const char *r = first_rung(a, i, false);
	pthread_mutex_unlock(&a->mu);
	return r;
}

const char *nat_acceptor_plan(nat_acceptor *a, size_t i)
{
	if (i >= a->n)
		return "";
	pthread_mutex_lock(&a->mu);
	const char *r = first_rung(a, i, true);
	pthread_mutex_unlock(&a->mu);
	return r;
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
