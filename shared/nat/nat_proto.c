/* cotrain: the client side of the NAT service's line protocol, and sockets
 * bound to the listening port (nat.h, doc/nat.md). */
#include "shared/nat/nat.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shared/common/deadline.h"

/* Fill *ss with addr:port (numeric); false when addr is not numeric. */
static bool sockaddr_of(const char *addr, uint16_t port, struct sockaddr_storage *ss, socklen_t *sl)
{
	memset(ss, 0, sizeof *ss);
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, addr, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		*sl = sizeof *s4;
		return true;
	}
	if (inet_pton(AF_INET6, addr, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
		*sl = sizeof *s6;
		return true;
	}
	return false;
}

/* Connect (non-blocking) a fresh socket to addr:port.  With local_port
 * >= 0 the socket is first bound to local_addr (NULL or "": the wildcard)
 * and that port (0: one the kernel picks, for this socket alone) with
 * SO_REUSEADDR and SO_REUSEPORT, so that later sockets can connect from the
 * same port (a punch from the port of its meeting, registrations from the
 * listening port).  -1 with eb set on failure. */
static int start_connect(const char *local_addr, int local_port, const char *addr, uint16_t port, int ttl,
                         cot_errbuf *eb)
{
	struct sockaddr_storage to, from;
	socklen_t tl, fl;
	if (!sockaddr_of(addr, port, &to, &tl)) {
		cot_seterr(eb, COT_ERR_INVALID, "invalid address \"%s\"", addr);
		return -1;
	}
	int fd = socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		cot_seterr(eb, COT_ERR_IO, "could not create socket: %s", strerror(errno));
		return -1;
	}
	int one = 1;
	if (local_port >= 0) {
		const char *la = local_addr && *local_addr ? local_addr : "0.0.0.0";
		/* An IPv4 target from a "::" listener: bind the IPv4 wildcard. */
		if (to.ss_family == AF_INET && strchr(la, ':'))
			la = "0.0.0.0";
		if (to.ss_family == AF_INET6 && strcmp(la, "0.0.0.0") == 0)
			la = "::";
		if (!sockaddr_of(la, (uint16_t)local_port, &from, &fl) || from.ss_family != to.ss_family) {
			close(fd);
			cot_seterr(eb, COT_ERR_INVALID, "cannot reach %s from address %s", addr, la);
			return -1;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (local_port > 0)
			setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
		if (bind(fd, (struct sockaddr *)&from, fl) != 0) {
			cot_seterr(eb, COT_ERR_IO, "could not bind to port %d: %s", local_port,
			           strerror(errno));
			if (local_port > 0)
				cot_sethint(eb, "A listener on that port must set SO_REUSEPORT.");
			close(fd);
			return -1;
		}
	}
	if (ttl > 0) {
		if (to.ss_family == AF_INET)
			setsockopt(fd, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl);
		else
			setsockopt(fd, IPPROTO_IPV6, IPV6_UNICAST_HOPS, &ttl, sizeof ttl);
	}
	if (connect(fd, (struct sockaddr *)&to, tl) != 0 && errno != EINPROGRESS) {
		cot_seterr(eb, COT_ERR_NETWORK, "could not connect to %s port %u: %s", addr, port,
		           strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

int nat_bound_connect(const nat_config *c, const char *addr, uint16_t port, int ttl, cot_errbuf *eb)
{
	return start_connect(c->listen_addr, c->listen_port, addr, port, ttl, eb);
}

int nat_port_connect(const nat_config *c, uint16_t local_port, const char *addr, uint16_t port,
                     cot_errbuf *eb)
{
	return start_connect(c->listen_addr, local_port, addr, port, 0, eb);
}

int nat_plain_connect(const char *addr, uint16_t port, cot_errbuf *eb)
{
	return start_connect(NULL, -1, addr, port, 0, eb);
}

/* The local port of socket fd (0 when unknown). */
static uint16_t local_port_of(int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
		return 0;
	if (ss.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return 0;
}

cot_err nat_connect_wait(int fd, const char *addr, uint16_t port, int64_t deadline, cot_errbuf *eb)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int left = deadline_left_ms(deadline);
		if (left == 0)
			return cot_seterr(eb, COT_ERR_TIMEOUT, "timed out connecting to %s port %u", addr,
			                  port);
		int r = poll(&p, 1, left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return cot_seterr(eb, COT_ERR_IO, "could not wait for a connection: %s",
			                  strerror(errno));
		if (r == 0)
			continue;
		int err = 0;
		socklen_t len = sizeof err;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
			err = errno;
		if (err)
			return cot_seterr(eb, COT_ERR_NETWORK, "could not connect to %s port %u: %s", addr,
			                  port, strerror(err));
		return COT_OK;
	}
}

/* Read the NAT service's answer line: nat_line_read, its message naming the
 * service. */
static cot_err read_answer(int fd, char out[NAT_LINE_MAX], int64_t deadline, const volatile int *cancel,
                           cot_errbuf *eb)
{
	cot_err rc = nat_line_read(fd, out, deadline, cancel, eb);
	if (!rc)
		return COT_OK;
	if (rc == COT_ERR_TOO_LARGE)
		rc = COT_ERR_INVALID; /* an answer the protocol does not allow */
	if (eb) {
		char detail[sizeof eb->msg];
		snprintf(detail, sizeof detail, "%s", eb->msg);
		cot_seterr(eb, rc, "could not read the NAT service's answer: %s", detail);
	}
	return rc;
}

static cot_err send_all(int fd, const char *buf, size_t len, int64_t deadline, cot_errbuf *eb)
{
	size_t off = 0;
	while (off < len) {
		ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL);
		if (w > 0) {
			off += (size_t)w;
			continue;
		}
		if (w < 0 && errno != EAGAIN && errno != EINTR)
			return cot_seterr(eb, COT_ERR_NETWORK, "could not write to the NAT service: %s",
			                  strerror(errno));
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int left = deadline_left_ms(deadline);
		if (left == 0)
			return cot_seterr(eb, COT_ERR_TIMEOUT, "timed out writing to the NAT service");
		poll(&p, 1, left);
	}
	return COT_OK;
}

void nat_keepalive(int fd)
{
	int one = 1, idle = NAT_KEEPALIVE_IDLE_S, intvl = NAT_KEEPALIVE_INTVL_S, cnt = NAT_KEEPALIVE_CNT;
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

cot_err nat_request(const nat_config *c, int which, uint16_t *local_port, const char *line, int64_t deadline,
                    const volatile int *cancel, char *reply, int *fd, cot_errbuf *eb)
{
	uint16_t port = (uint16_t)(c->server_port + which);
	int s = start_connect(c->listen_addr, local_port ? 0 : -1, c->server_addr, port, 0, eb);
	if (s < 0)
		return COT_ERR_NETWORK;
	/* A meeting may wait 15 s for the peer, and a relayed session idle
	 * longer: keep the routers on the way from forgetting it. */
	nat_keepalive(s);
	if (local_port && !(*local_port = local_port_of(s))) {
		close(s);
		return cot_seterr(eb, COT_ERR_IO, "could not learn the local port of a connection");
	}
	cot_err rc = nat_connect_wait(s, c->server_addr, port, deadline, eb);
	/* The line goes out as given, in one send with its "\n": the service,
	 * not the client, judges its length (nat_line.h). */
	size_t len = strlen(line);
	char *buf = rc ? NULL : malloc(len + 2);
	if (!rc && !buf)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (!rc) {
		memcpy(buf, line, len);
		buf[len] = '\n';
		rc = send_all(s, buf, len + 1, deadline, eb);
	}
	free(buf);
	if (!rc)
		rc = read_answer(s, reply, deadline, cancel, eb);
	if (!rc && strncmp(reply, "ERR ", 4) == 0) {
		int status = atoi(reply + 4);
		const char *msg = strchr(reply + 4, ' ');
		msg = msg ? strchr(msg + 1, ' ') : NULL;
		rc = status == 401   ? COT_ERR_AUTH
		     : status == 403 ? COT_ERR_FORBIDDEN
		     : status == 404 ? COT_ERR_NOT_FOUND
		     : status == 408 ? COT_ERR_TIMEOUT
		     : status == 409 ? COT_ERR_CONFLICT
		     : status == 400 ? COT_ERR_INVALID
		                     : COT_ERR_NETWORK;
		cot_seterr(eb, rc, "the NAT service refused: %s", msg ? msg + 1 : reply);
	}
	if (rc || !fd)
		close(s);
	else
		*fd = s;
	return rc;
}

cot_err nat_meet(const nat_config *c, const char *project, int64_t version, int64_t peer, bool dial,
                 int64_t deadline, const volatile int *cancel, nat_meeting *m, cot_errbuf *eb)
{
	char line[NAT_LINE_MAX], reply[NAT_LINE_MAX];
	snprintf(line, sizeof line, "MEET %s %lld %lld %lld %s %s", project, (long long)version,
	         (long long)c->host_id, (long long)peer, c->token, dial ? "DIAL" : "ACCEPT");
	cot_err rc = nat_request(c, 0, &m->local_port, line, deadline, cancel, reply, NULL, eb);
	if (rc)
		return rc;
	int64_t now = deadline_now_ms();
	unsigned port = 0;
	int lead = 0;
	if (sscanf(reply, "GO %7s %63s %u %d", m->plan, m->addr, &port, &lead) != 4 || port > 65535 ||
	    lead < 0 || lead > 60000 ||
	    (strcmp(m->plan, "lan") && strcmp(m->plan, "direct") && strcmp(m->plan, "punch") &&
	     strcmp(m->plan, "relay")))
		return cot_seterr(eb, COT_ERR_NETWORK, "malformed answer from the NAT service: \"%.80s\"",
		                  reply);
	m->port = (uint16_t)port;
	m->moment = now + lead;
	return COT_OK;
}

cot_err nat_relay_join(const nat_config *c, const char *project, int64_t version, int64_t peer, bool dial,
                       int64_t deadline, const volatile int *cancel, int *fd, cot_errbuf *eb)
{
	char line[NAT_LINE_MAX], reply[NAT_LINE_MAX];
	snprintf(line, sizeof line, "RELAY %s %lld %lld %lld %s %s", project, (long long)version,
	         (long long)c->host_id, (long long)peer, c->token, dial ? "DIAL" : "ACCEPT");
	cot_err rc = nat_request(c, 0, NULL, line, deadline, cancel, reply, fd, eb);
	if (rc)
		return rc;
	if (strcmp(reply, "OK relay") != 0) {
		close(*fd);
		*fd = -1;
		return cot_seterr(eb, COT_ERR_NETWORK, "malformed answer from the relay: \"%.80s\"", reply);
	}
	return dialer_prepare_fd(*fd, eb);
}

cot_err nat_observe(const nat_config *c, int64_t deadline, nat_observation *out, cot_errbuf *eb)
{
	memset(out, 0, sizeof *out);
	/* The second port first, so that the first port's answer (which
	 * classifies us) already knows both. */
	for (int which = 1; which >= 0; which--) {
		char line[NAT_LINE_MAX], reply[NAT_LINE_MAX], local[64] = "0.0.0.0";
		uint16_t port = (uint16_t)(c->server_port + which);
		int s = nat_bound_connect(c, c->server_addr, port, 0, eb);
		if (s < 0)
			return COT_ERR_NETWORK;
		cot_err rc = nat_connect_wait(s, c->server_addr, port, deadline, eb);
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		if (!rc && getsockname(s, (struct sockaddr *)&ss, &sl) == 0) {
			if (ss.ss_family == AF_INET)
				inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, local,
				          sizeof local);
			else
				inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, local,
				          sizeof local);
		}
		int n = snprintf(line, sizeof line, "OBSERVE %lld %s %s %u %u\n", (long long)c->host_id,
		                 c->token, local, c->listen_port, c->mapped_port);
		if (!rc && (n < 0 || (size_t)n >= sizeof line))
			rc = cot_seterr(eb, COT_ERR_INVALID, "NAT request too long");
		if (!rc)
			rc = send_all(s, line, (size_t)n, deadline, eb);
		if (!rc)
			rc = read_answer(s, reply, deadline, NULL, eb);
		close(s);
		if (rc)
			return rc;
		unsigned p = 0;
		char k[16] = "", mp[16] = "";
		if (strncmp(reply, "ERR ", 4) == 0) {
			int status = atoi(reply + 4);
			return cot_seterr(eb,
			                  status == 401   ? COT_ERR_AUTH
			                  : status == 403 ? COT_ERR_FORBIDDEN
			                                  : COT_ERR_NETWORK,
			                  "the NAT service refused: %.200s", reply + 4);
		}
		if (sscanf(reply, "SEEN %63s %u %15s %15s", out->addr, &p, k, mp) != 4 || p > 65535)
			return cot_seterr(eb, COT_ERR_NETWORK,
			                  "malformed answer from the NAT service: \"%.80s\"", reply);
		if (which)
			out->port2 = (uint16_t)p;
		else
			out->port = (uint16_t)p;
		snprintf(out->klass, sizeof out->klass, "%s", k);
		snprintf(out->mapping, sizeof out->mapping, "%s", mp);
	}
	return COT_OK;
}
