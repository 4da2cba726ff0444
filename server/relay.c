/* cotrain-server: the NAT service: registration, meetings and the relay
 * (relay.h; the protocol is in doc/nat.md). */
#include "server/relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/dbconn.h"
#include "server/reachability.h"
#include "server/rendezvous.h"
#include "shared/common/deadline.h"
#include "shared/common/log.h"
#include "shared/nat/nat.h"
#include "shared/nat/nat_line.h"

#define LINE_TIMEOUT_MS 3000 /* for the request line, from the accept on */
#define WORKERS 8
#define QUEUE_MAX 1024
#define PENDING_MAX 1024 /* connections whose request line is not in yet */
#define SPLICE_BUF 65536
#define PROJECT_MAX 64

/* A connection with its whole request line, for a worker. */
typedef struct {
	int fd;
	int which; /* 0: first port, 1: second */
	char line[NAT_LINE_MAX];
} queued;

/* A connection accepted whose request line is still coming: the acceptor
 * reads it as it arrives, so a slow or silent client never holds a worker. */
typedef struct {
	int fd;
	int which;
	int64_t deadline; /* LINE_TIMEOUT_MS after the accept: not pushed on by bytes */
	size_t len;
	char line[NAT_LINE_MAX];
} pending;

struct relay_service {
	relay_config cfg;
	int lfd[2];
	int wake[2];
	int port;
	pthread_t acceptor;
	pthread_t workers[WORKERS];
	int n_workers;
	bool acceptor_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_cond_t sessions_cv;
	queued queue[QUEUE_MAX];
	size_t q_head, q_len;
	int sessions;
	atomic_bool stop;
};

/* Write one line (printf-style, "\n" added) to fd, which is blocking with a
 * send timeout; best effort.  Cut to NAT_LINE_MAX - 1 bytes before the "\n",
 * the most the client reads (nat_line.h). */
static void say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int fd, const char *fmt, ...)
{
	char buf[NAT_LINE_MAX + 1];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	for (int off = 0; off < n;) {
		ssize_t w = send(fd, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		off += (int)w;
	}
}

/* Answer an error line: ERR <http status> <code> <message>. */
static void refuse(int fd, cot_err e, const cot_errbuf *eb)
{
	int status = e == COT_ERR_AUTH                           ? 401
	             : e == COT_ERR_FORBIDDEN                    ? 403
	             : e == COT_ERR_NOT_FOUND                    ? 404
	             : e == COT_ERR_CONFLICT                     ? 409
	             : e == COT_ERR_TIMEOUT                      ? 408
	             : e == COT_ERR_INVALID                      ? 400
	             : e == COT_ERR_TOO_LARGE || e == COT_ERR_DB ? 503
	                                                         : 500;
	say(fd, "ERR %d %s %s", status, cot_strerror(e), eb->msg);
}

/* A decimal integer field in [min, max]. */
static bool num(const char *s, long long min, long long max, long long *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '+' || *s == '-' || *s == ' ')
		return false;
	long long v = strtoll(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return false;
	*out = v;
	return true;
}

static bool project_name_ok(const char *s)
{
	size_t n = strlen(s);
	if (n < 1 || n > PROJECT_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
			return false;
	return true;
}

/* The peer's numeric address (IPv4-mapped IPv6 shown as IPv4) and port. */
static void peer_of(int fd, char *addr, uint16_t *port)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	strcpy(addr, "?");
	*port = 0;
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
		return;
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &s4->sin_addr, addr, REACH_ADDR_MAX);
		*port = ntohs(s4->sin_port);
	} else if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
		if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
			inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], addr, REACH_ADDR_MAX);
		else
			inet_ntop(AF_INET6, &s6->sin6_addr, addr, REACH_ADDR_MAX);
		*port = ntohs(s6->sin6_port);
	}
}

/* ---- OBSERVE <host> <token> <local addr> <local port> <advertised port> ---- */

static void do_observe(relay_service *s, int fd, int which, char **f, int nf)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	long long host, lport, aport;
	unsigned char buf[16];
	if (nf != 6 || !num(f[1], 1, INT64_MAX, &host) || !num(f[4], 1, 65535, &lport) ||
	    !num(f[5], 0, 65535, &aport) || strlen(f[3]) >= REACH_ADDR_MAX ||
	    (inet_pton(AF_INET, f[3], buf) != 1 && inet_pton(AF_INET6, f[3], buf) != 1)) {
		cot_seterr(&eb, COT_ERR_INVALID, "malformed OBSERVE line");
		refuse(fd, COT_ERR_INVALID, &eb);
		return;
	}
	cot_err rc = rdv_auth(host, f[2], &eb);
	if (rc) {
		log_warn("nat: refused OBSERVE for host %lld: %s", host, eb.msg);
		refuse(fd, rc, &eb);
		return;
	}
	char addr[REACH_ADDR_MAX];
	uint16_t port;
	peer_of(fd, addr, &port);
	reach_observe(host, addr, port, which, f[3], (uint16_t)lport, (uint16_t)aport);
	const char *k = which == 0 ? reach_classify(host, s->cfg.dialback_ms) : NULL;
	reach_info i;
	if (!reach_get(host, &i))
		i.mapping = "unknown";
	say(fd, "SEEN %s %u %s %s", addr, port, k ? k : i.klass, i.mapping);
}

/* The endpoint a host can be met at for a plan: its advertised one for
 * "direct"; its own local address and listening port for "lan"; for
 * "punch", the public endpoint of the very connection it met on (fd): the
 * host punches from that connection's local port, so each meeting, and
 * each connection of a pair, has a port of its own. */
static void endpoint_for(const reach_info *i, int fd, const char *plan, char *addr, uint16_t *port)
{
	if (strcmp(plan, "punch") == 0) {
		peer_of(fd, addr, port);
		return;
	}
	if (strcmp(plan, "lan") == 0) {
		strcpy(addr, i->local_addr);
		*port = i->local_port;
		return;
	}
	if (strcmp(plan, "relay") == 0 || !i->addr[0]) {
		strcpy(addr, "-");
		*port = 0;
		return;
	}
	strcpy(addr, i->addr);
	*port = i->adv_port;
}

static bool connectable(const reach_info *i)
{
	return strcmp(i->klass, "public") == 0 || strcmp(i->klass, "mapped") == 0;
}

/* A host whose outgoing connections keep their public port whatever the
 * destination: the port the server saw is the one its peer will see. */
static bool punchable(const reach_info *i)
{
	return strcmp(i->klass, "public") == 0 || strcmp(i->mapping, "independent") == 0;
}

/* Two hosts of one household: the server sees both at one public address
 * from behind a NAT (the acceptor's own address is not the public one),
 * and the acceptor named its local endpoint.  Their router need not
 * hairpin: the dialer tries the acceptor's local endpoint first. */
static bool same_household(const reach_info *d, const reach_info *a)
{
	return d->addr[0] && strcmp(d->addr, a->addr) == 0 && a->local_addr[0] && a->local_port &&
	       strcmp(a->local_addr, a->addr) != 0 && strcmp(a->local_addr, "0.0.0.0") != 0 &&
	       strcmp(a->local_addr, "::") != 0;
}

/* How dialer d reaches acceptor a by their classes: lan in one household;
 * direct when a can be dialed; punch when a sits behind a NAT that keeps
 * one public port per local port and d does too (or has no NAT);
 * otherwise the relay.  With no_lan, what comes after lan. */
static const char *plan_by_class(const reach_info *d, const reach_info *a, bool no_lan)
{
	if (!no_lan && same_household(d, a))
		return "lan";
	if (connectable(a))
		return "direct";
	if (strcmp(a->klass, "nat") == 0 && punchable(a) && punchable(d))
		return "punch";
	return "relay";
}

static const dbc_stmt st_skip = { "nat_history_skip", "SELECT nat_history_skip($1::bigint, $2::bigint, $3)",
	                          3 };

/* NULL when the pair's links (round_link) do not argue against trying rung
 * (nat_history_skip, db/functions/nat.sql), else why, in why[len].  A
 * database error is logged and the rung tried. */
static const char *history_skip(int64_t d, int64_t a, const char *rung, char *why, size_t len)
{
	char ds[24], as[24];
	snprintf(ds, sizeof ds, "%lld", (long long)d);
	snprintf(as, sizeof as, "%lld", (long long)a);
	const char *params[] = { ds, as, rung };
	PGresult *r = NULL;
	char state[6];
	cot_errbuf eb = { "", "" };
	if (dbc_exec(&st_skip, params, &r, state, &eb)) {
		log_warn("nat: could not read the history of hosts %lld and %lld: %s", (long long)d,
		         (long long)a, eb.msg);
		return NULL;
	}
	const char *out = NULL;
	if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
		snprintf(why, len, "%s", PQgetvalue(r, 0, 0));
		out = why;
	}
	PQclear(r);
	return out;
}

/* The plan for dialer d and acceptor a: by their classes, then from
 * history: a lan dial or a punch that failed for the pair lately (or a
 * punch that failed for either host with everyone) is skipped for the next
 * rung down, and tried again now and then (nat_history_skip).  why[len]
 * says what history changed ("" when nothing). */
static const char *plan_for(const reach_info *d, const reach_info *a, char *why, size_t len)
{
	why[0] = 0;
	const char *plan = plan_by_class(d, a, false);
	if (strcmp(plan, "lan") == 0 && history_skip(d->host_id, a->host_id, "lan", why, len))
		plan = plan_by_class(d, a, true);
	if (strcmp(plan, "punch") == 0) {
		char w[200];
		if (history_skip(d->host_id, a->host_id, "punch", w, sizeof w)) {
			snprintf(why + strlen(why), len - strlen(why), "%s%s", why[0] ? "; " : "", w);
			plan = "relay";
		}
	}
	return plan;
}

static void expired(int fd, int64_t host)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	cot_seterr(&eb, COT_ERR_TIMEOUT, "the peer did not come");
	log_info("nat: host %lld waited for its peer in vain", (long long)host);
	refuse(fd, COT_ERR_TIMEOUT, &eb);
	close(fd);
}

/* Parse and check a MEET or RELAY line (<project> <version> <host> <peer>
 * <token> <DIAL|ACCEPT>) and park its half *h.  Returns 1 when the other
 * half was waiting (*other, now the caller's), 0 when *h is parked (the
 * table keeps fd), -1 when refused (the connection has been answered). */
static int park_request(relay_service *s, rdv_kind kind, int fd, char **f, int nf, rdv_half *h,
                        rdv_half *other, long long *version, long long *peer)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	long long host;
	int64_t project_id;
	if (nf != 7 || (strcmp(f[6], "DIAL") != 0 && strcmp(f[6], "ACCEPT") != 0) || !project_name_ok(f[1]) ||
	    !num(f[2], 0, INT32_MAX, version) || !num(f[3], 1, INT64_MAX, &host) ||
	    !num(f[4], 1, INT64_MAX, peer)) {
		cot_seterr(&eb, COT_ERR_INVALID, "malformed %s line", f[0]);
		refuse(fd, COT_ERR_INVALID, &eb);
		return -1;
	}
	cot_err rc = rdv_auth(host, f[5], &eb);
	if (!rc)
		rc = rdv_pair_check(f[1], *version, host, *peer, &project_id, &eb);
	*h = (rdv_half){ fd, host, strcmp(f[6], "DIAL") == 0, deadline_after_ms(s->cfg.wait_s * 1000LL) };
	if (!rc)
		rc = rdv_park(kind, project_id, *version, *peer, h, other, &eb);
	if (rc) {
		log_warn("nat: refused %s of host %lld for host %lld: %s", f[0], host, *peer, eb.msg);
		refuse(fd, rc, &eb);
		return -1;
	}
	return other->fd >= 0;
}

/* What the server knows of host (from its row after a restart), or the
 * class "unknown". */
static void reach_or_unknown(int64_t host, reach_info *i)
{
	if (!reach_get_or_reload(host, i)) {
		memset(i, 0, sizeof *i);
		i->klass = i->mapping = "unknown";
	}
}

/* ---- MEET <project> <version> <host> <peer> <token> <DIAL|ACCEPT> ---- */

/* Returns true when the table kept fd. */
static bool do_meet(relay_service *s, int fd, char **f, int nf)
{
	long long version, peer;
	rdv_half h, other;
	int got = park_request(s, RDV_MEET, fd, f, nf, &h, &other, &version, &peer);
	if (got <= 0)
		return got == 0;
	/* Both halves are here: tell each how to reach the other, and when. */
	reach_info hi, oi;
	reach_or_unknown(h.host, &hi);
	reach_or_unknown(peer, &oi);
	hi.host_id = h.host;
	oi.host_id = peer;
	char why[400];
	const char *plan = h.dial ? plan_for(&hi, &oi, why, sizeof why) : plan_for(&oi, &hi, why, sizeof why);
	char a1[REACH_ADDR_MAX], a2[REACH_ADDR_MAX];
	uint16_t p1, p2;
	endpoint_for(&oi, other.fd, plan, a1, &p1);
	endpoint_for(&hi, fd, plan, a2, &p2);
	say(fd, "GO %s %s %u %d", plan, a1, p1, s->cfg.meet_lead_ms);
	say(other.fd, "GO %s %s %u %d", plan, a2, p2, s->cfg.meet_lead_ms);
	close(other.fd);
	log_info("nat: hosts %lld (%s) and %lld meet in round %lld: %s%s%s%s", (long long)h.host,
	         h.dial ? "dials" : "accepts", peer, version, plan, why[0] ? " (history: " : "", why,
	         why[0] ? ")" : "");
	return false;
}

/* ---- RELAY <project> <version> <host> <peer> <token> <DIAL|ACCEPT> ---- */

typedef struct {
	relay_service *s;
	int fd[2];
	int64_t host[2];
} session;

/* Copy both ways between the two sockets until both directions have ended,
 * one fails, the session idles out or the service stops. */
static void *splice_main(void *arg)
{
	session *ss = arg;
	relay_service *s = ss->s;
	unsigned char *buf[2] = { malloc(SPLICE_BUF), malloc(SPLICE_BUF) };
	size_t len[2] = { 0, 0 }, off[2] = { 0, 0 };
	bool eof[2] = { false, false }, shut[2] = { false, false };
	uint64_t moved[2] = { 0, 0 }, acct[2] = { 0, 0 };
	int64_t last = deadline_now_ms(), last_acct = last;
	const char *why = "done";
	for (int i = 0; i < 2; i++) {
		int fl = 1;
		ioctl(ss->fd[i], FIONBIO, &fl);
		setsockopt(ss->fd[i], IPPROTO_TCP, TCP_NODELAY, &fl, sizeof fl);
	}
	if (!buf[0] || !buf[1]) {
		why = "out of memory";
		goto out;
	}
	while (!atomic_load(&s->stop)) {
		struct pollfd p[2] = { { ss->fd[0], 0, 0 }, { ss->fd[1], 0, 0 } };
		int timeout = 200;
		/* Direction i: from fd[i] to fd[1 - i], buffered in buf[i]. */
		size_t allow[2] = { 0, 0 };
		for (int i = 0; i < 2; i++) {
			if (len[i] > off[i]) {
				p[1 - i].events |= POLLOUT;
			} else if (!eof[i]) {
				int wait = 0;
				allow[i] = reach_relay_take(ss->host[i], SPLICE_BUF, s->cfg.bandwidth, &wait);
				if (allow[i])
					p[i].events |= POLLIN;
				else if (wait < timeout)
					timeout = wait;
			}
		}
		if ((eof[0] && len[0] == off[0] && eof[1] && len[1] == off[1]))
			break;
		int r = poll(p, 2, timeout);
		if (r < 0 && errno != EINTR) {
			why = "poll failed";
			break;
		}
		int64_t now = deadline_now_ms();
		bool active = false, failed = false;
		for (int i = 0; i < 2; i++)
			if (allow[i] && !(r > 0 && (p[i].revents & (POLLIN | POLLHUP | POLLERR)))) {
				reach_relay_refund(ss->host[i], allow[i], s->cfg.bandwidth);
				allow[i] = 0;
			}
		for (int i = 0; i < 2 && r > 0; i++) {
			if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) && allow[i] && len[i] == off[i] &&
			    !eof[i]) {
				/* Take only what the cap allows; unread bytes keep their
				 * tokens for later (what is read here was paid for). */
				int avail = 0;
				size_t want = allow[i];
				if (ioctl(ss->fd[i], FIONREAD, &avail) == 0 && avail > 0 &&
				    (size_t)avail < want)
					want = (size_t)avail;
				ssize_t got = recv(ss->fd[i], buf[i], want, 0);
				if (got > 0) {
					len[i] = (size_t)got;
					off[i] = 0;
					moved[i] += (uint64_t)got;
					active = true;
				} else if (got == 0) {
					eof[i] = true;
				} else if (errno != EAGAIN && errno != EINTR) {
					failed = true;
				}
				size_t used = got > 0 ? (size_t)got : 0;
				if (allow[i] > used)
					reach_relay_refund(ss->host[i], allow[i] - used, s->cfg.bandwidth);
				allow[i] = 0;
			}
		}
		for (int i = 0; i < 2; i++) {
			if (len[i] > off[i]) {
				ssize_t w =
				        send(ss->fd[1 - i], buf[i] + off[i], len[i] - off[i], MSG_NOSIGNAL);
				if (w > 0) {
					off[i] += (size_t)w;
					active = true;
				} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
					failed = true;
				}
			}
			if (eof[i] && len[i] == off[i] && !shut[i]) {
				shutdown(ss->fd[1 - i], SHUT_WR);
				shut[i] = true;
			}
		}
		if (failed) {
			why = "a peer failed";
			break;
		}
		if (active)
			last = now;
		else if (now - last > (int64_t)s->cfg.idle_s * 1000) {
			why = "idle";
			break;
		}
		if (now - last_acct >= 1000) {
			reach_relay_account(ss->host[0], moved[0] - acct[0], moved[1] - acct[1], false);
			reach_relay_account(ss->host[1], moved[1] - acct[1], moved[0] - acct[0], false);
			acct[0] = moved[0];
			acct[1] = moved[1];
			last_acct = now;
		}
	}
	if (atomic_load(&s->stop))
		why = "server stopping";
out:
	reach_relay_account(ss->host[0], moved[0] - acct[0], moved[1] - acct[1], false);
	reach_relay_account(ss->host[1], moved[1] - acct[1], moved[0] - acct[0], false);
	log_info("nat: relay between hosts %lld and %lld ended (%s): %llu and %llu bytes",
	         (long long)ss->host[0], (long long)ss->host[1], why, (unsigned long long)moved[0],
	         (unsigned long long)moved[1]);
	close(ss->fd[0]);
	close(ss->fd[1]);
	free(buf[0]);
	free(buf[1]);
	pthread_mutex_lock(&s->mu);
	s->sessions--;
	pthread_cond_broadcast(&s->sessions_cv);
	pthread_mutex_unlock(&s->mu);
	free(ss);
	return NULL;
}

/* Returns true when fd was kept (parked or relayed). */
static bool do_relay(relay_service *s, int fd, char **f, int nf)
{
	long long version, peer;
	rdv_half h, other;
	int got = park_request(s, RDV_RELAY, fd, f, nf, &h, &other, &version, &peer);
	if (got <= 0)
		return got == 0;
	int64_t host = h.host;
	pthread_mutex_lock(&s->mu);
	bool room = s->sessions < s->cfg.max_sessions && !atomic_load(&s->stop);
	if (room)
		s->sessions++;
	pthread_mutex_unlock(&s->mu);
	session *ss = room ? malloc(sizeof *ss) : NULL;
	pthread_t t;
	pthread_attr_t at;
	if (ss) {
		*ss = (session){ s, { fd, other.fd }, { host, other.host } };
		say(fd, "OK relay");
		say(other.fd, "OK relay");
		reach_relay_account(host, 0, 0, true);
		reach_relay_account(other.host, 0, 0, true);
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &at, splice_main, ss) == 0) {
			pthread_attr_destroy(&at);
			log_info("nat: relaying hosts %lld and %lld of round %lld", (long long)host, peer,
			         version);
			return true;
		}
		pthread_attr_destroy(&at);
		free(ss);
	}
	if (room) {
		pthread_mutex_lock(&s->mu);
		s->sessions--;
		pthread_mutex_unlock(&s->mu);
	}
	cot_errbuf eb = { { 0 }, { 0 } };
	cot_seterr(&eb, COT_ERR_TOO_LARGE, "the relay is full");
	refuse(fd, COT_ERR_TOO_LARGE, &eb);
	refuse(other.fd, COT_ERR_TOO_LARGE, &eb);
	close(other.fd);
	return false;
}

/* Handle one accepted connection and its request line; closes it unless
 * it was kept. */
static void handle(relay_service *s, int fd, int which, char *line)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	char *f[8], *save = NULL;
	int nf = 0;
	for (char *t = strtok_r(line, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
		if (nf == 8) {
			nf = 9;
			break;
		}
		f[nf++] = t;
	}
	bool kept = false;
	if (nf == 0 || nf > 8) {
		cot_seterr(&eb, COT_ERR_INVALID, "malformed request line");
		refuse(fd, COT_ERR_INVALID, &eb);
	} else if (strcmp(f[0], "OBSERVE") == 0) {
		do_observe(s, fd, which, f, nf);
	} else if (strcmp(f[0], "MEET") == 0 && nf >= 6) {
		kept = do_meet(s, fd, f, nf);
	} else if (strcmp(f[0], "RELAY") == 0 && nf >= 6) {
		kept = do_relay(s, fd, f, nf);
	} else {
		cot_seterr(&eb, COT_ERR_INVALID, "unknown request \"%.16s\"", f[0]);
		refuse(fd, COT_ERR_INVALID, &eb);
	}
	if (!kept)
		close(fd);
}

static void *worker_main(void *arg)
{
	relay_service *s = arg;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (s->q_len == 0 && !atomic_load(&s->stop))
			pthread_cond_wait(&s->cv, &s->mu);
		if (atomic_load(&s->stop)) {
			pthread_mutex_unlock(&s->mu);
			break;
		}
		queued q = s->queue[s->q_head];
		s->q_head = (s->q_head + 1) % QUEUE_MAX;
		s->q_len--;
		pthread_mutex_unlock(&s->mu);
		handle(s, q.fd, q.which, q.line);
	}
	dbc_close_thread();
	return NULL;
}

/* Read what has arrived of pe's request line: 1 when it is complete (the
 * "\n" and a "\r" before it dropped), 0 when more must come, -1 when the
 * connection failed or closed, -2 when the line is too long.  Reads byte
 * by byte: nothing after the line is taken from the socket. */
static int pending_read(pending *pe)
{
	for (;;) {
		char c;
		ssize_t got = recv(pe->fd, &c, 1, MSG_DONTWAIT);
		if (got == 1) {
			if (c == '\n') {
				if (pe->len && pe->line[pe->len - 1] == '\r')
					pe->len--;
				pe->line[pe->len] = '\0';
				return 1;
			}
			if (pe->len == NAT_LINE_MAX - 1)
				return -2;
			pe->line[pe->len++] = c;
			continue;
		}
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		return -1;
	}
}

/* Queue a connection with its request line for the workers; closes it when
 * they are overloaded (the client retries). */
static void dispatch(relay_service *s, const pending *pe)
{
	pthread_mutex_lock(&s->mu);
	bool queued_ok = s->q_len < QUEUE_MAX;
	if (queued_ok) {
		queued *q = &s->queue[(s->q_head + s->q_len) % QUEUE_MAX];
		q->fd = pe->fd;
		q->which = pe->which;
		memcpy(q->line, pe->line, pe->len + 1);
		s->q_len++;
		pthread_cond_signal(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	if (!queued_ok)
		close(pe->fd);
}

/* Accept on both ports and read each connection's request line as it
 * arrives (all of them in one poll set, each within LINE_TIMEOUT_MS of its
 * accept), then hand it to a worker: idle or slow connections cost a slot
 * of the pending set, never a worker's time. */
static void *acceptor_main(void *arg)
{
	relay_service *s = arg;
	pending *pend = calloc(PENDING_MAX, sizeof *pend);
	struct pollfd *p = calloc(PENDING_MAX + 3, sizeof *p);
	size_t np = 0;
	while (pend && p && !atomic_load(&s->stop)) {
		p[0] = (struct pollfd){ s->lfd[0], POLLIN, 0 };
		p[1] = (struct pollfd){ s->lfd[1], POLLIN, 0 };
		p[2] = (struct pollfd){ s->wake[0], POLLIN, 0 };
		int timeout = 200;
		for (size_t k = 0; k < np; k++) {
			p[3 + k] = (struct pollfd){ pend[k].fd, POLLIN, 0 };
			int left = deadline_left_ms(pend[k].deadline);
			if (left < timeout)
				timeout = left;
		}
		int r = poll(p, 3 + np, timeout);
		rdv_expire(deadline_now_ms(), expired);
		/* The pending connections first (p[3..] matches pend[] as polled). */
		size_t kept = 0;
		for (size_t k = 0; k < np; k++) {
			pending *pe = &pend[k];
			int st = r > 0 && (p[3 + k].revents & (POLLIN | POLLHUP | POLLERR)) ? pending_read(pe)
			                                                                    : 0;
			if (st == 1) {
				dispatch(s, pe);
				continue;
			}
			if (st == 0 && deadline_left_ms(pe->deadline) > 0) {
				pend[kept++] = *pe;
				continue;
			}
			if (st != -1) {
				cot_errbuf eb = { { 0 }, { 0 } };
				if (st == -2)
					cot_seterr(&eb, COT_ERR_INVALID, "line longer than %d bytes",
					           NAT_LINE_MAX - 1);
				else
					cot_seterr(&eb, COT_ERR_TIMEOUT,
					           "no complete request line within %d ms", LINE_TIMEOUT_MS);
				refuse(pe->fd, st == -2 ? COT_ERR_INVALID : COT_ERR_TIMEOUT, &eb);
			}
			close(pe->fd);
		}
		np = kept;
		if (r <= 0)
			continue;
		for (int i = 0; i < 2; i++) {
			if (!(p[i].revents & POLLIN))
				continue;
			int fd = accept4(s->lfd[i], NULL, NULL, SOCK_CLOEXEC);
			if (fd < 0)
				continue;
			if (np == PENDING_MAX) {
				close(fd); /* overloaded: the client retries */
				continue;
			}
			struct timeval tv = { 2, 0 };
			setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
			nat_keepalive(fd); /* a parked half or a relay session may idle */
			pend[np++] = (pending){ .fd = fd,
				                .which = i,
				                .deadline = deadline_after_ms(LINE_TIMEOUT_MS) };
		}
	}
	for (size_t k = 0; k < np; k++)
		close(pend[k].fd);
	free(pend);
	free(p);
	return NULL;
}

static int listen_on(const char *addr, int port, cot_errbuf *eb)
{
	struct sockaddr_storage ss = { 0 };
	socklen_t sl;
	struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
	if (inet_pton(AF_INET, addr, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		sl = sizeof *s4;
	} else if (inet_pton(AF_INET6, addr, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		sl = sizeof *s6;
	} else {
		cot_seterr(eb, COT_ERR_INVALID, "invalid relay listen address \"%s\"", addr);
		return -1;
	}
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int one = 1, zero = 0;
	if (fd >= 0) {
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (ss.ss_family == AF_INET6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
	}
	if (fd < 0 || bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 256) != 0) {
		cot_seterr(eb, COT_ERR_IO, "could not listen on %s port %d: %s", addr, port, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

cot_err relay_start(const relay_config *cfg, relay_service **out, cot_errbuf *eb)
{
	if (cfg->port < 1 || cfg->port > 65534)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "relay port must be 1 to 65534 (it uses the next one too)");
	relay_service *s = calloc(1, sizeof *s);
	if (!s)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	s->cfg = *cfg;
	s->lfd[0] = s->lfd[1] = s->wake[0] = s->wake[1] = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_cond_init(&s->sessions_cv, NULL);
	atomic_init(&s->stop, false);
	s->port = cfg->port;
	if (reach_init() != 0) {
		relay_stop(s);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	if ((s->lfd[0] = listen_on(cfg->listen, cfg->port, eb)) < 0 ||
	    (s->lfd[1] = listen_on(cfg->listen, cfg->port + 1, eb)) < 0) {
		relay_stop(s);
		return COT_ERR_IO;
	}
	if (pipe(s->wake) != 0) {
		relay_stop(s);
		return cot_seterr(eb, COT_ERR_IO, "could not create a pipe: %s", strerror(errno));
	}
	for (int i = 0; i < WORKERS; i++) {
		if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0)
			break;
		s->n_workers++;
	}
	if (s->n_workers < WORKERS || pthread_create(&s->acceptor, NULL, acceptor_main, s) != 0) {
		relay_stop(s);
		return cot_seterr(eb, COT_ERR_IO, "could not start the NAT service threads");
	}
	s->acceptor_started = true;
	log_info("nat: service on %s ports %d and %d", cfg->listen, cfg->port, cfg->port + 1);
	*out = s;
	return COT_OK;
}

int relay_port(const relay_service *s) { return s->port; }

void relay_stop(relay_service *s)
{
	if (!s)
		return;
	atomic_store(&s->stop, true);
	if (s->wake[1] >= 0 && write(s->wake[1], "x", 1) < 0)
		(void)0;
	pthread_mutex_lock(&s->mu);
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (s->acceptor_started)
		pthread_join(s->acceptor, NULL);
	for (int i = 0; i < s->n_workers; i++)
		pthread_join(s->workers[i], NULL);
	pthread_mutex_lock(&s->mu);
	while (s->sessions > 0)
		pthread_cond_wait(&s->sessions_cv, &s->mu);
	for (size_t i = 0; i < s->q_len; i++)
		close(s->queue[(s->q_head + i) % QUEUE_MAX].fd);
	pthread_mutex_unlock(&s->mu);
	rdv_clear();
	for (int i = 0; i < 2; i++) {
		if (s->lfd[i] >= 0)
			close(s->lfd[i]);
		if (s->wake[i] >= 0)
			close(s->wake[i]);
	}
	pthread_cond_destroy(&s->cv);
	pthread_cond_destroy(&s->sessions_cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
	reach_free();
}
