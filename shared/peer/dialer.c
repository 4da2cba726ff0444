/* cotrain: the dialer interface and the ladder of rungs. */
#include "shared/peer/dialer.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "shared/common/deadline.h"

#define LADDER_MAX 8

cot_err dialer_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                       cot_errbuf *eb)
{
	if (!t || !t->addr)
		return cot_seterr(eb, COT_ERR_INVALID, "dial target has no address");
	res->fd = -1;
	res->rung = d->ops->rung;
	res->plan = NULL;
	return d->ops->connect(d, t, deadline, res, eb);
}

const char *dialer_rung(const dialer *d) { return d->ops->rung; }

void dialer_free(dialer *d)
{
	if (d)
		d->ops->free(d);
}

cot_err dialer_prepare_fd(int fd, cot_errbuf *eb)
{
	int one = 1;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not make socket non-blocking: %s", strerror(errno));
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not set TCP_NODELAY: %s", strerror(errno));
	return COT_OK;
}

/* ---- The ladder ---- */

typedef struct {
	dialer base;
	dialer *rungs[LADDER_MAX];
	size_t n;
} ladder;

static cot_err ladder_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                              cot_errbuf *eb)
{
	ladder *l = (ladder *)d;
	char trail[sizeof eb->msg] = "";
	size_t used = 0;
	cot_err rc = COT_ERR_NETWORK;
	for (size_t i = 0; i < l->n; i++) {
		int64_t now = deadline_now_ms();
		if (now >= deadline) {
			rc = COT_ERR_TIMEOUT;
			break;
		}
		int64_t share = (deadline - now) / (int64_t)(l->n - i);
		cot_errbuf reb = { { 0 }, { 0 } };
		rc = dialer_connect(l->rungs[i], t, now + share, res, &reb);
		if (rc == COT_OK)
			return COT_OK;
		int w = snprintf(trail + used, sizeof trail - used, "%s%s: %s", used ? "; " : "",
		                 dialer_rung(l->rungs[i]), reb.msg);
		if (w > 0)
			used = used + (size_t)w < sizeof trail ? used + (size_t)w : sizeof trail - 1;
	}
	return cot_seterr(eb, rc, "could not reach host %lld at %s port %u: %s", (long long)t->host_id,
	                  t->addr, t->port, used ? trail : "deadline passed");
}

static void ladder_free(dialer *d)
{
	ladder *l = (ladder *)d;
	for (size_t i = 0; i < l->n; i++)
		dialer_free(l->rungs[i]);
	free(l);
}

static const dialer_ops ladder_ops = { "ladder", ladder_connect, ladder_free };

cot_err dialer_ladder_new(dialer **rungs, size_t n, dialer **out, cot_errbuf *eb)
{
	ladder *l = NULL;
	if (n < 1 || n > LADDER_MAX || !(l = calloc(1, sizeof *l))) {
		for (size_t i = 0; i < n; i++)
			dialer_free(rungs[i]);
		if (n < 1 || n > LADDER_MAX)
			return cot_seterr(eb, COT_ERR_INVALID, "a ladder has 1 to %d rungs, not %zu",
			                  LADDER_MAX, n);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	l->base.ops = &ladder_ops;
	memcpy(l->rungs, rungs, n * sizeof *rungs);
	l->n = n;
	*out = &l->base;
	return COT_OK;
}
