/* cotrain: a listening TCP socket for incoming peer connections. */
#include "shared/peer/listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shared/common/deadline.h"
#include "shared/peer/dialer.h"

struct listener {
	int fd;
	uint16_t port;
};

cot_err listener_open(const char *addr, uint16_t port, int backlog, listener **out, cot_errbuf *eb)
{
	char ps[8];
	struct addrinfo hints = {
		.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
	}, *ai = NULL;
	snprintf(ps, sizeof ps, "%u", port);
	int g = getaddrinfo(addr, ps, &hints, &ai);
	if (g != 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid listen address \"%s\": %s", addr ? addr : "",
		                  gai_strerror(g));
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		freeaddrinfo(ai);
		return cot_seterr(eb, COT_ERR_IO, "could not create socket: %s", strerror(errno));
	}
	int one = 1, zero = 0;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one,
	           sizeof one); /* NAT punches leave from this port (nat.h) */
	if (ai->ai_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
	if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, backlog > 0 ? backlog : 64) != 0) {
		int err = errno;
		close(fd);
		freeaddrinfo(ai);
		return cot_seterr(eb, COT_ERR_IO, "could not listen on %s port %u: %s", addr, port,
		                  strerror(err));
	}
	freeaddrinfo(ai);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
		int err = errno;
		close(fd);
		return cot_seterr(eb, COT_ERR_IO, "could not read the listening address: %s", strerror(err));
	}
	listener *l = malloc(sizeof *l);
	if (!l) {
		close(fd);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	l->fd = fd;
	l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
	                                         : ((struct sockaddr_in *)&ss)->sin_port);
	*out = l;
	return COT_OK;
}

uint16_t listener_port(const listener *l) { return l->port; }

int listener_fd(const listener *l) { return l->fd; }

static void format_peer(const struct sockaddr_storage *ss, char *out)
{
	char a[INET6_ADDRSTRLEN] = "?";
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof a);
		snprintf(out, LISTENER_ADDR_MAX, "[%s]:%u", a, ntohs(s6->sin6_port));
	} else {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &s4->sin_addr, a, sizeof a);
		snprintf(out, LISTENER_ADDR_MAX, "%s:%u", a, ntohs(s4->sin_port));
	}
}

cot_err listener_accept(listener *l, int64_t deadline, int *fd, char *peer, cot_errbuf *eb)
{
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int c = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (c >= 0) {
			cot_err rc = dialer_prepare_fd(c, eb);
			if (rc) {
				close(c);
				return rc;
			}
			if (peer)
				format_peer(&ss, peer);
			*fd = c;
			return COT_OK;
		}
		/* Errors that concern only the connection being accepted: try again. */
		if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return cot_seterr(eb, COT_ERR_IO, "could not accept a connection: %s",
			                  strerror(errno));
		struct pollfd p = { .fd = l->fd, .events = POLLIN };
		int left = deadline_left_ms(deadline);
		if (left == 0)
			return cot_seterr(eb, COT_ERR_TIMEOUT, "timed out waiting for a peer to connect");
		if (poll(&p, 1, left) < 0 && errno != EINTR)
			return cot_seterr(eb, COT_ERR_IO, "could not wait for a connection: %s",
			                  strerror(errno));
	}
}

void listener_close(listener *l)
{
	if (!l)
		return;
	close(l->fd);
	free(l);
}
