/* cotrain client: recording the round's connections (links.h). */
#include "client/links.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "shared/common/deadline.h"

void cl_links_init(cl_links *ls)
{
	memset(ls, 0, sizeof *ls);
	pthread_mutex_init(&ls->mu, NULL);
}

void cl_links_destroy(cl_links *ls) { pthread_mutex_destroy(&ls->mu); }

typedef struct {
	dialer base;
	dialer *inner;
	cl_links *ls;
} rec_dialer;

/* The kernel's smoothed round-trip time on fd, in ms; -1 when unknown. */
static double tcp_rtt_ms(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof ti;
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 || ti.tcpi_rtt == 0)
		return -1;
	return ti.tcpi_rtt / 1000.0;
}

static cot_err rec_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                           cot_errbuf *eb)
{
	rec_dialer *r = (rec_dialer *)d;
	int64_t t0 = deadline_now_ms();
	cot_err rc = dialer_connect(r->inner, t, deadline, res, eb);
	if (rc)
		return rc;
	double ms = (double)(deadline_now_ms() - t0);
	const char *rung = res->rung ? res->rung : dialer_rung(r->inner);
	double rtt = strcmp(rung, "relay") == 0 ? -1 : tcp_rtt_ms(res->fd);
	pthread_mutex_lock(&r->ls->mu);
	cl_link *l = NULL;
	for (size_t i = 0; i < r->ls->n && !l; i++)
		if (r->ls->l[i].peer == t->host_id)
			l = &r->ls->l[i];
	if (!l && r->ls->n < CL_LINKS_MAX) {
		l = &r->ls->l[r->ls->n++];
		*l = (cl_link){ .peer = t->host_id, .connect_ms = ms, .rtt_ms = rtt };
		snprintf(l->rung, sizeof l->rung, "%s", rung);
		snprintf(l->plan, sizeof l->plan, "%s", res->plan ? res->plan : "");
	}
	if (l) {
		l->conns++;
		if (rtt >= 0 && (l->rtt_ms < 0 || rtt < l->rtt_ms))
			l->rtt_ms = rtt;
	}
	pthread_mutex_unlock(&r->ls->mu);
	return COT_OK;
}

static void rec_free(dialer *d)
{
	rec_dialer *r = (rec_dialer *)d;
	dialer_free(r->inner);
	free(r);
}

static const dialer_ops rec_ops = { "recording", rec_connect, rec_free };

cot_err cl_links_dialer_new(dialer *inner, cl_links *ls, dialer **out, cot_errbuf *eb)
{
	rec_dialer *r = calloc(1, sizeof *r);
	if (!r) {
		dialer_free(inner);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	r->base.ops = &rec_ops;
	r->inner = inner;
	r->ls = ls;
	*out = &r->base;
	return COT_OK;
}

void cl_links_summary(cl_links *ls, char *out, size_t len)
{
	size_t o = 0;
	out[0] = '\0';
	pthread_mutex_lock(&ls->mu);
	for (size_t i = 0; i < ls->n && o < len; i++) {
		const cl_link *l = &ls->l[i];
		int w = l->rtt_ms >= 0 ? snprintf(out + o, len - o, "%shost %lld %s %.1f ms", i ? ", " : "",
		                                  (long long)l->peer, l->rung, l->rtt_ms)
		                       : snprintf(out + o, len - o, "%shost %lld %s", i ? ", " : "",
		                                  (long long)l->peer, l->rung);
		if (w < 0)
			break;
		o += (size_t)w;
	}
	pthread_mutex_unlock(&ls->mu);
}
