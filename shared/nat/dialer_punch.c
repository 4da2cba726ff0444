/* cotrain: the "punch" rung: TCP simultaneous open timed by the project
 * server (nat.h, doc/nat.md). */
#include "shared/nat/nat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shared/common/deadline.h"

#define PUNCH_DIAL_DELAY_MS 50 /* after the moment: both sides start together */
#define PUNCH_RETRY_MS 200

static void sleep_until(int64_t when)
{
	for (;;) {
		int left = deadline_left_ms(when);
		if (left == 0)
			return;
		struct timespec ts = { left / 1000, (long)(left % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
}

cot_err nat_punch_connect(const nat_config *c, const nat_meeting *m, int64_t deadline, int *fd,
                          cot_errbuf *eb)
{
	int64_t start = m->moment + PUNCH_DIAL_DELAY_MS;
	int64_t end = m->moment + NAT_PUNCH_WINDOW_MS;
	if (end > deadline)
		end = deadline;
	if (start >= end)
		return cot_seterr(eb, COT_ERR_TIMEOUT, "no time left to punch through to %s port %u", m->addr,
		                  m->port);
	sleep_until(start);
	cot_err rc = COT_ERR_TIMEOUT;
	int tries = 0;
	while (deadline_left_ms(end) > 0) {
		tries++;
		int s = nat_port_connect(c, m->local_port, m->addr, m->port, eb);
		if (s < 0)
			return COT_ERR_NETWORK;
		rc = nat_connect_wait(s, m->addr, m->port, end, eb);
		if (rc == COT_OK) {
			rc = dialer_prepare_fd(s, eb);
			if (rc) {
				close(s);
				return rc;
			}
			*fd = s;
			return COT_OK;
		}
		close(s);
		if (rc != COT_ERR_NETWORK)
			break;
		/* Refused or unreachable (a NAT that answers with RST or ICMP
		 * before the other side's mapping is open): try again. */
		sleep_until(deadline_now_ms() + PUNCH_RETRY_MS < end ? deadline_now_ms() + PUNCH_RETRY_MS
		                                                     : end);
	}
	return cot_seterr(eb, rc ? rc : COT_ERR_TIMEOUT, "could not punch through to %s port %u (%d tries)",
	                  m->addr, m->port, tries);
}

/* ---- The rung alone ---- */

typedef struct {
	dialer base;
	const nat_config *c;
	const char *project;
	int64_t version;
} punch;

static cot_err punch_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                             cot_errbuf *eb)
{
	punch *p = (punch *)d;
	nat_meeting m;
	cot_err rc = nat_meet(p->c, p->project, p->version, t->host_id, true, deadline, NULL, &m, eb);
	if (rc)
		return rc;
	if (strcmp(m.plan, "punch") != 0)
		return cot_seterr(eb, COT_ERR_NETWORK, "the server planned %s, not punch, for host %lld",
		                  m.plan, (long long)t->host_id);
	return nat_punch_connect(p->c, &m, deadline, &res->fd, eb);
}

static void punch_free(dialer *d) { free(d); }

static const dialer_ops punch_ops = { "punch", punch_connect, punch_free };

cot_err dialer_punch_new(const nat_config *c, const char *project, int64_t version, dialer **out,
                         cot_errbuf *eb)
{
	punch *p = calloc(1, sizeof *p);
	if (!p)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	p->base.ops = &punch_ops;
	p->c = c;
	p->project = project;
	p->version = version;
	*out = &p->base;
	return COT_OK;
}
