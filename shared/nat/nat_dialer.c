/* cotrain: the brokered ladder: ask the server to meet the peer, follow its
 * plan (direct, punch, relay), fall back to the relay (nat.h). */
#include "shared/nat/nat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/deadline.h"
#include "shared/common/log.h"

typedef struct {
	dialer base;
	const nat_config *c;
	const char *project;
	int64_t version;
	dialer *direct;
} nat_dialer;

static cot_err nat_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                           cot_errbuf *eb)
{
	nat_dialer *n = (nat_dialer *)d;
	nat_meeting m;
	cot_errbuf meb = { { 0 }, { 0 } }, deb = { { 0 }, { 0 } }, peb = { { 0 }, { 0 } };
	cot_err rc = nat_meet(n->c, n->project, n->version, t->host_id, true, deadline, NULL, &m, &meb);
	if (rc) {
		/* No broker: the peer may still be reachable as it is. */
		log_warn("nat: could not meet host %lld (%s); dialing it directly", (long long)t->host_id,
		         meb.msg);
		rc = dialer_connect(n->direct, t, deadline, res, &deb);
		res->rung = "direct";
		if (rc)
			return cot_seterr(eb, rc, "could not reach host %lld: meeting: %s; direct: %s",
			                  (long long)t->host_id, meb.msg, deb.msg);
		return COT_OK;
	}
	const char *plan = strcmp(m.plan, "lan") == 0      ? "lan"
	                   : strcmp(m.plan, "direct") == 0 ? "direct"
	                   : strcmp(m.plan, "punch") == 0  ? "punch"
	                                                   : "relay";
	if (strcmp(plan, "lan") == 0 || strcmp(plan, "direct") == 0) {
		dialer_target dt = *t;
		if (m.port && strcmp(m.addr, "-") != 0) {
			dt.addr = m.addr;
			dt.port = m.port;
		}
		/* lan: the peer is in our household (the server sees us both at
		 * one public address), its local endpoint answers at once or
		 * not at all.  direct: half the time at most; the relay needs the
		 * rest. */
		int64_t until = strcmp(plan, "lan") == 0
		                        ? deadline_now_ms() + NAT_LAN_WINDOW_MS
		                        : deadline_now_ms() + (deadline - deadline_now_ms()) / 2;
		if (until > deadline)
			until = deadline;
		rc = dialer_connect(n->direct, &dt, until, res, &deb);
		res->plan = plan;
		if (!rc) {
			res->rung = plan;
			return COT_OK;
		}
	} else if (strcmp(plan, "punch") == 0) {
		rc = nat_punch_connect(n->c, &m, deadline, &res->fd, &peb);
		if (!rc) {
			res->rung = "punch";
			res->plan = plan;
			return COT_OK;
		}
	}
	res->rung = "relay";
	res->plan = plan;
	cot_errbuf reb = { { 0 }, { 0 } };
	rc = nat_relay_join(n->c, n->project, n->version, t->host_id, true, deadline, NULL, &res->fd, &reb);
	if (rc)
		return cot_seterr(eb, rc, "could not reach host %lld (plan %s): %s%s%s%srelay: %s",
		                  (long long)t->host_id, m.plan, deb.msg, deb.msg[0] ? "; " : "", peb.msg,
		                  peb.msg[0] ? "; " : "", reb.msg);
	return COT_OK;
}

static void nat_free(dialer *d)
{
	nat_dialer *n = (nat_dialer *)d;
	dialer_free(n->direct);
	free(n);
}

static const dialer_ops nat_ops = { "nat", nat_connect, nat_free };

cot_err nat_dialer_new(const nat_config *c, const char *project, int64_t version, dialer **out,
                       cot_errbuf *eb)
{
	nat_dialer *n = calloc(1, sizeof *n);
	if (!n)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	cot_err rc = dialer_direct_new(&n->direct, eb);
	if (rc) {
		free(n);
		return rc;
	}
	n->base.ops = &nat_ops;
	n->c = c;
	n->project = project;
	n->version = version;
	*out = &n->base;
	return COT_OK;
}
