/* cotrain: the "relay" rung: both peers connect out to the project server,
 * which splices the two connections (nat.h, doc/nat.md); and the bridge the
 * accepting side uses to hand a relayed connection to its own listener. */
#include "shared/nat/nat.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shared/common/deadline.h"

#define BRIDGE_BUF 65536

void nat_bridge(int a, int b, int64_t deadline, const volatile int *stop)
{
	int fd[2] = { a, b };
	unsigned char *buf[2] = { malloc(BRIDGE_BUF), malloc(BRIDGE_BUF) };
	size_t len[2] = { 0, 0 }, off[2] = { 0, 0 };
	int eof[2] = { 0, 0 }, shut[2] = { 0, 0 };
	int64_t grace = 0;
	while (buf[0] && buf[1] && deadline_left_ms(deadline) > 0) {
		/* Asked to stop: still deliver what is in flight (the last
		 * result frames of an all-reduce), for a few seconds at most. */
		if (*stop && grace == 0)
			grace = deadline_after_ms(NAT_BRIDGE_GRACE_MS);
		if (grace && deadline_left_ms(grace) == 0)
			break;
		if (eof[0] && eof[1] && len[0] == off[0] && len[1] == off[1])
			break;
		struct pollfd p[2] = { { fd[0], 0, 0 }, { fd[1], 0, 0 } };
		for (int i = 0; i < 2; i++) {
			if (len[i] > off[i])
				p[1 - i].events |= POLLOUT;
			else if (!eof[i])
				p[i].events |= POLLIN;
		}
		int r = poll(p, 2, 200);
		if (r < 0 && errno != EINTR)
			break;
		int failed = 0;
		for (int i = 0; i < 2 && r > 0; i++) {
			if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) && len[i] == off[i] && !eof[i]) {
				ssize_t got = recv(fd[i], buf[i], BRIDGE_BUF, MSG_DONTWAIT);
				if (got > 0) {
					len[i] = (size_t)got;
					off[i] = 0;
				} else if (got == 0) {
					eof[i] = 1;
				} else if (errno != EAGAIN && errno != EINTR) {
					failed = 1;
				}
			}
		}
		for (int i = 0; i < 2; i++) {
			if (len[i] > off[i]) {
				ssize_t w = send(fd[1 - i], buf[i] + off[i], len[i] - off[i],
				                 MSG_NOSIGNAL | MSG_DONTWAIT);
				if (w > 0)
					off[i] += (size_t)w;
				else if (w < 0 && errno != EAGAIN && errno != EINTR)
					failed = 1;
			}
			if (eof[i] && len[i] == off[i] && !shut[i]) {
				shutdown(fd[1 - i], SHUT_WR);
				shut[i] = 1;
			}
		}
		if (failed)
			break;
	}
	free(buf[0]);
	free(buf[1]);
}

typedef struct {
	dialer base;
	const nat_config *c;
	const char *project;
	int64_t version;
} relay;

static cot_err relay_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                             cot_errbuf *eb)
{
	relay *r = (relay *)d;
	return nat_relay_join(r->c, r->project, r->version, t->host_id, true, deadline, NULL, &res->fd, eb);
}

static void relay_free(dialer *d) { free(d); }

static const dialer_ops relay_ops = { "relay", relay_connect, relay_free };

cot_err dialer_relay_new(const nat_config *c, const char *project, int64_t version, dialer **out,
                         cot_errbuf *eb)
{
	relay *r = calloc(1, sizeof *r);
	if (!r)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	r->base.ops = &relay_ops;
	r->c = c;
	r->project = project;
	r->version = version;
	*out = &r->base;
	return COT_OK;
}
