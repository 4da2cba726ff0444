/* cotrain: the "direct" rung of the dialer ladder: a plain TCP connect. */
#include "shared/peer/dialer.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shared/common/deadline.h"

/* Connect one socket to ai before deadline. */
static cot_err connect_one(const struct addrinfo *ai, const dialer_target *t, int64_t deadline, int *out,
                           cot_errbuf *eb)
{
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not create socket: %s", strerror(errno));
	int err = 0;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
		if (errno != EINPROGRESS) {
			err = errno;
			goto fail;
		}
		for (;;) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int left = deadline_left_ms(deadline);
			if (left == 0) {
				close(fd);
				return cot_seterr(eb, COT_ERR_TIMEOUT, "timed out connecting to %s port %u",
				                  t->addr, t->port);
			}
			int r = poll(&p, 1, left);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				err = errno;
				goto fail;
			}
			if (r > 0)
				break;
		}
		socklen_t len = sizeof err;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
			err = errno;
		if (err)
			goto fail;
	}
	cot_err rc = dialer_prepare_fd(fd, eb);
	if (rc) {
		close(fd);
		return rc;
	}
	*out = fd;
	return COT_OK;
fail:
	close(fd);
	return cot_seterr(eb, COT_ERR_NETWORK, "could not connect to %s port %u: %s", t->addr, t->port,
	                  strerror(err));
}

static cot_err direct_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                              cot_errbuf *eb)
{
	(void)d;
	char port[8];
	struct addrinfo hints = {
		.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
		.ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
	}, *ai = NULL;
	if (strnlen(t->addr, DIALER_ADDR_MAX) >= DIALER_ADDR_MAX || t->port == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid dial target");
	snprintf(port, sizeof port, "%u", t->port);
	int g = getaddrinfo(t->addr, port, &hints, &ai);
	if (g != 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid peer address \"%s\": %s", t->addr,
		                  gai_strerror(g));
	/* A numeric host gives one address. */
	cot_err rc = connect_one(ai, t, deadline, &res->fd, eb);
	freeaddrinfo(ai);
	return rc;
}

static void direct_free(dialer *d) { free(d); }

static const dialer_ops direct_ops = { "direct", direct_connect, direct_free };

cot_err dialer_direct_new(dialer **out, cot_errbuf *eb)
{
	dialer *d = calloc(1, sizeof *d);
	if (!d)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	d->ops = &direct_ops;
	*out = d;
	return COT_OK;
}
