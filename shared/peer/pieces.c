/* cotrain: pieces of held files between peers (pieces.h). */
#include "shared/peer/pieces.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shared/common/deadline.h"
#include "shared/common/log.h"
#include "shared/peer/frame.h"
#include "shared/peer/hello.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static hello_msg files_hello(const char *project, int64_t host_id, uint32_t max_payload)
{
	hello_msg m = { .proto_min = PIECES_PROTO_MIN,
		        .proto_max = HELLO_PROTO_MAX,
		        .host_id = host_id,
		        .round = HELLO_ROUND_FILES,
		        .max_payload = max_payload };
	snprintf(m.project, sizeof m.project, "%s", project);
	return m;
}

/* Tell the peer why (eb's detail) and keep rc. */
static cot_err refuse(peer_conn *c, cot_err rc, int64_t deadline, cot_errbuf *eb)
{
	peer_send_error(c, frame_error_from_cot(rc), eb->msg, deadline);
	return rc;
}

/* ---- Serving ---- */

static cot_err decode_get(const unsigned char *p, size_t len, char sha[HASH_SHA256_HEX_LEN + 1],
                          uint32_t *index, cot_errbuf *eb)
{
	frame_reader r;
	frame_reader_init(&r, p, len);
	frame_get_str(&r, sha, HASH_SHA256_HEX_LEN + 1);
	frame_get_u32(&r, index);
	cot_err rc = frame_reader_end(&r, "PIECE_GET", eb);
	if (!rc && !hash_is_sha256_hex(sha))
		rc = cot_seterr(eb, COT_ERR_INVALID, "PIECE_GET names no sha256");
	return rc;
}

cot_err pieces_serve(peer_conn *c, const pieces_serve_opts *o, int64_t deadline, uint32_t *served,
                     cot_errbuf *eb)
{
	if (served)
		*served = 0;
	hello_msg ours = files_hello(o->project, o->host_id, FRAME_PAYLOAD_MIN_MAX), theirs;
	uint16_t version;
	cot_err rc = hello_exchange(c, &ours, &theirs, &version,
	                            min64(deadline, deadline_after_ms(PIECES_HANDSHAKE_MS)), eb);
	if (rc)
		return rc;
	unsigned char *buf = malloc(CKPT_PIECE_MAX);
	frame_writer w;
	frame_writer_init(&w, CKPT_PIECE_MAX + 64);
	if (!buf) {
		frame_writer_free(&w);
		return refuse(c, cot_seterr(eb, COT_ERR_NOMEM, "out of memory"), deadline, eb);
	}
	for (uint32_t n = 0;; n++) {
		frame_header h;
		unsigned char *p = NULL;
		int64_t idle = min64(deadline, deadline_after_ms(o->idle_ms));
		rc = peer_recv_frame(c, &h, &p, idle, eb);
		if (rc == COT_ERR_NETWORK) {
			rc = COT_OK; /* the peer left */
			break;
		}
		if (rc == COT_ERR_TIMEOUT) {
			rc = refuse(c,
			            cot_seterr(eb, COT_ERR_TIMEOUT, "no request for %lld ms",
			                       (long long)o->idle_ms),
			            deadline, eb);
			break;
		}
		if (rc)
			break;
		char sha[HASH_SHA256_HEX_LEN + 1] = "";
		uint32_t index = 0;
		int fd = -1;
		uint64_t size = 0;
		if (h.type != FRAME_PIECE_GET)
			rc = cot_seterr(eb, COT_ERR_INVALID, "expected PIECE_GET, got %s (type %u)",
			                frame_type_name(h.type), h.type);
		else if (!(rc = decode_get(p, h.length, sha, &index, eb)) && n >= o->max_requests)
			rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "more than %u requests on one connection",
			                o->max_requests);
		free(p);
		if (!rc)
			rc = o->open_file(o->arg, sha, &fd, &size, eb);
		if (rc) {
			rc = refuse(c, rc, deadline, eb);
			break;
		}
		ckpt_manifest m = { .size = size, .piece_size = ckpt_piece_size(size) };
		m.n = size ? (uint32_t)((size + m.piece_size - 1) / m.piece_size) : 0;
		uint32_t len = ckpt_piece_len(&m, index);
		ssize_t got = len ? pread(fd, buf, len, (off_t)index * m.piece_size) : 0;
		int err = errno;
		close(fd);
		if (len == 0)
			rc = cot_seterr(eb, COT_ERR_INVALID, "file %s has %u pieces: there is no piece %u",
			                sha, m.n, index);
		else if (got != (ssize_t)len)
			rc = cot_seterr(eb, COT_ERR_INTERNAL, "could not read piece %u of file %s: %s", index,
			                sha, got < 0 ? strerror(err) : "short read");
		if (rc) {
			rc = refuse(c, rc, deadline, eb);
			break;
		}
		if (o->before_send)
			o->before_send(o->arg, buf, len);
		w.len = 0;
		frame_put_u32(&w, index);
		frame_put_blob(&w, buf, len);
		if ((rc = frame_writer_error(&w))) {
			rc = refuse(c, cot_seterr(eb, rc, "could not encode piece %u", index), deadline, eb);
			break;
		}
		if ((rc = peer_send_frame(c, FRAME_PIECE, 0, w.buf, w.len, deadline, eb)))
			break;
		if (served)
			(*served)++;
	}
	frame_writer_free(&w);
	free(buf);
	return rc;
}

/* ---- Fetching ---- */

enum { PIECE_WANTED, PIECE_IN_FLIGHT, PIECE_DONE };

typedef struct {
	const pieces_fetch_params *p;
	pthread_mutex_t mu;
	pthread_cond_t settled; /* a piece changed state */
	unsigned char *state;   /* per piece */
	size_t n_src;
	cot_err io_rc;
	cot_errbuf io_eb;
} fetch_run;

typedef struct {
	fetch_run *r;
	size_t k;
	pieces_source_stats *st;
	pthread_t th;
} worker;

/* The next piece for source k: its own (i mod n_src == k) first, then any
 * left.  While none is wanted but some are in flight from other sources,
 * it waits: a piece another source fails (a lie, a timeout) is wanted
 * again, and this source must still be there to take it.  -1 when every
 * piece is done, on a write error, at the deadline or on cancel. */
static int64_t take(fetch_run *r, size_t k)
{
	const pieces_fetch_params *p = r->p;
	uint32_t n = p->m->n;
	int64_t got = -1;
	pthread_mutex_lock(&r->mu);
	for (;;) {
		bool in_flight = false;
		for (uint32_t i = (uint32_t)k; got < 0 && i < n; i += (uint32_t)r->n_src)
			if (r->state[i] == PIECE_WANTED)
				got = i;
		for (uint32_t i = 0; i < n; i++) {
			if (got < 0 && r->state[i] == PIECE_WANTED)
				got = i;
			in_flight |= r->state[i] == PIECE_IN_FLIGHT;
		}
		if (got >= 0 || !in_flight || r->io_rc != COT_OK || (p->cancel && *p->cancel) ||
		    deadline_left_ms(p->deadline) == 0)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 200 * 1000 * 1000; /* to look at cancel and the deadline */
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&r->settled, &r->mu, &ts);
	}
	if (got >= 0 && r->io_rc == COT_OK)
		r->state[got] = PIECE_IN_FLIGHT;
	else
		got = -1;
	pthread_mutex_unlock(&r->mu);
	return got;
}

static void settle(fetch_run *r, uint32_t i, int ok)
{
	pthread_mutex_lock(&r->mu);
	r->state[i] = ok ? PIECE_DONE : PIECE_WANTED;
	if (ok)
		r->p->have[i] = 1;
	pthread_cond_broadcast(&r->settled);
	pthread_mutex_unlock(&r->mu);
}

/* One piece from c into the file: COT_OK when written, COT_ERR_CORRUPT for
 * a piece that does not match the manifest, another error else. */
static cot_err fetch_one(fetch_run *r, peer_conn *c, uint32_t i, frame_writer *w, cot_errbuf *eb)
{
	const pieces_fetch_params *p = r->p;
	w->len = 0;
	frame_put_str(w, p->m->sha256);
	frame_put_u32(w, i);
	int64_t dl = min64(p->deadline, deadline_after_ms(p->piece_timeout_ms));
	cot_err rc = frame_writer_error(w);
	if (rc || (rc = peer_send_frame(c, FRAME_PIECE_GET, 0, w->buf, w->len, dl, eb)))
		return rc;
	frame_header h;
	unsigned char *pl = NULL;
	if ((rc = peer_recv_frame(c, &h, &pl, dl, eb)))
		return rc;
	if (h.type == FRAME_ERROR) {
		uint16_t code;
		char reason[FRAME_REASON_MAX + 1];
		rc = frame_error_decode(pl, h.length, &code, reason, eb)
		             ? cot_seterr(eb, COT_ERR_NETWORK, "malformed ERROR")
		             : cot_seterr(eb, frame_error_to_cot(code), "peer refused: %s", reason);
		free(pl);
		return rc;
	}
	frame_reader rd;
	uint32_t idx = 0;
	const unsigned char *data = NULL;
	size_t len = 0;
	frame_reader_init(&rd, pl, h.length);
	frame_get_u32(&rd, &idx);
	frame_get_blob(&rd, &data, &len, CKPT_PIECE_MAX);
	if (h.type != FRAME_PIECE)
		rc = cot_seterr(eb, COT_ERR_INVALID, "expected PIECE, got %s (type %u)",
		                frame_type_name(h.type), h.type);
	else if (!(rc = frame_reader_end(&rd, "PIECE", eb)) && idx != i)
		rc = cot_seterr(eb, COT_ERR_INVALID, "asked for piece %u, got piece %u", i, idx);
	else if (!rc && !ckpt_piece_ok(p->m, i, data, len))
		rc = cot_seterr(eb, COT_ERR_CORRUPT,
		                "piece %u of %s (%zu bytes) does not match the manifest: refused", i,
		                p->m->sha256, len);
	else if (!rc) {
		ssize_t put = pwrite(p->fd, data, len, (off_t)i * p->m->piece_size);
		if (put != (ssize_t)len) {
			pthread_mutex_lock(&r->mu);
			if (!r->io_rc)
				r->io_rc = cot_seterr(&r->io_eb, COT_ERR_IO, "could not write piece %u: %s",
				                      i, put < 0 ? strerror(errno) : "short write");
			pthread_mutex_unlock(&r->mu);
			rc = COT_ERR_IO;
			cot_seterr(eb, rc, "%s", r->io_eb.msg);
		}
	}
	free(pl);
	return rc;
}

static void *worker_main(void *arg)
{
	worker *wk = arg;
	fetch_run *r = wk->r;
	const pieces_fetch_params *p = r->p;
	const pieces_source *s = &p->src[wk->k];
	cot_errbuf eb = { "", "" };
	dialer_target t = { .addr = s->addr, .port = s->port, .host_id = s->host_id };
	dialer_result res = { .fd = -1 };
	peer_conn *c = NULL;
	int64_t hd = min64(p->deadline, deadline_after_ms(PIECES_CONNECT_MS));
	cot_err rc = dialer_connect(p->dialer, &t, hd, &res, &eb);
	hd = min64(p->deadline, deadline_after_ms(PIECES_HANDSHAKE_MS));
	if (!rc)
		rc = peer_handshake(p->ctx, res.fd, PEER_CLIENT, s->host_id, hd, &c, &eb);
	uint32_t max =
	        p->m->piece_size + 64 > FRAME_PAYLOAD_MIN_MAX ? p->m->piece_size + 64 : FRAME_PAYLOAD_MIN_MAX;
	hello_msg ours = files_hello(peer_ctx_project(p->ctx), peer_ctx_host_id(p->ctx), max), theirs;
	uint16_t version;
	if (!rc)
		rc = hello_exchange(c, &ours, &theirs, &version, hd, &eb);
	frame_writer w;
	frame_writer_init(&w, 256);
	while (!rc && !(p->cancel && *p->cancel)) {
		int64_t i = take(r, wk->k);
		if (i < 0)
			break;
		rc = fetch_one(r, c, (uint32_t)i, &w, &eb);
		settle(r, (uint32_t)i, rc == COT_OK);
		if (!rc)
			wk->st->pieces++;
		else if (rc == COT_ERR_CORRUPT) {
			wk->st->refused++;
			log_warn("pieces: host %lld (%s:%u) sent %s; it is not asked again",
			         (long long)s->host_id, s->addr, (unsigned)s->port, eb.msg);
		}
	}
	frame_writer_free(&w);
	peer_close(c);
	if (rc)
		snprintf(wk->st->error, sizeof wk->st->error, "%s", eb.msg);
	return NULL;
}

cot_err pieces_fetch(const pieces_fetch_params *p, pieces_source_stats *st, cot_errbuf *eb)
{
	size_t n_src = p->n_src < PIECES_SOURCES_MAX ? p->n_src : PIECES_SOURCES_MAX;
	pieces_source_stats local[PIECES_SOURCES_MAX];
	if (!st)
		st = local;
	for (size_t k = 0; k < n_src; k++)
		st[k] = (pieces_source_stats){ .host_id = p->src[k].host_id };
	if (n_src == 0)
		return COT_OK;
	fetch_run r = { .p = p, .n_src = n_src };
	worker wk[PIECES_SOURCES_MAX];
	pthread_t th[PIECES_SOURCES_MAX];
	if (!(r.state = malloc(p->m->n ? p->m->n : 1)))
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	for (uint32_t i = 0; i < p->m->n; i++)
		r.state[i] = p->have[i] ? PIECE_DONE : PIECE_WANTED;
	pthread_mutex_init(&r.mu, NULL);
	pthread_cond_init(&r.settled, NULL);
	size_t started = 0;
	for (size_t k = 0; k < n_src; k++) {
		wk[k] = (worker){ .r = &r, .k = k, .st = &st[k] };
		if (pthread_create(&wk[k].th, NULL, worker_main, &wk[k])) {
			snprintf(st[k].error, sizeof st[k].error, "could not start a thread");
			continue;
		}
		th[started++] = wk[k].th;
	}
	for (size_t k = 0; k < started; k++)
		pthread_join(th[k], NULL);
	pthread_mutex_destroy(&r.mu);
	pthread_cond_destroy(&r.settled);
	free(r.state);
	if (r.io_rc)
		return cot_seterr(eb, r.io_rc, "%s", r.io_eb.msg);
	return COT_OK;
}
