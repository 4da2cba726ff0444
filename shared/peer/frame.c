/* cotrain: the framed, versioned binary protocol between peers. */
#include "shared/peer/frame.h"

#include <stdlib.h>
#include <string.h>

bool frame_type_known(uint8_t type)
{
	switch (type) {
	case FRAME_HELLO:
	case FRAME_READY:
	case FRAME_ERROR:
		return true;
	}
	return false;
}

const char *frame_type_name(uint8_t type)
{
	switch (type) {
	case FRAME_HELLO:
		return "HELLO";
	case FRAME_READY:
		return "READY";
	case FRAME_ERROR:
		return "ERROR";
	case FRAME_SLICE:
		return "SLICE";
	case FRAME_RESULT:
		return "RESULT";
	case FRAME_ABORT:
		return "ABORT";
	case FRAME_PIECE_GET:
		return "PIECE_GET";
	case FRAME_PIECE:
		return "PIECE";
	}
	return "unknown";
}

static void be16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)(v >> 8);
	p[1] = (unsigned char)v;
}

static void be32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void frame_header_encode(const frame_header *h, unsigned char out[FRAME_HEADER_LEN])
{
	be32(out, FRAME_MAGIC);
	out[4] = FRAME_VERSION;
	out[5] = h->type;
	be16(out + 6, h->flags);
	be32(out + 8, h->length);
	be32(out + 12, h->request_id);
}

cot_err frame_header_decode(const unsigned char in[FRAME_HEADER_LEN], size_t max_payload, frame_header *h,
                            cot_errbuf *eb)
{
	if (max_payload > FRAME_PAYLOAD_HARD_MAX)
		max_payload = FRAME_PAYLOAD_HARD_MAX;
	uint32_t magic = rd32(in);
	if (magic != FRAME_MAGIC)
		return cot_seterr(eb, COT_ERR_INVALID, "bad frame magic 0x%08x (expected 0x%08x)", magic,
		                  FRAME_MAGIC);
	if (in[4] != FRAME_VERSION)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED,
		                  "unsupported frame version %u (this build speaks %u)", in[4],
		                  FRAME_VERSION);
	h->version = in[4];
	h->type = in[5];
	h->flags = rd16(in + 6);
	h->length = rd32(in + 8);
	h->request_id = rd32(in + 12);
	if (h->flags != 0)
		return cot_seterr(eb, COT_ERR_INVALID, "frame of type %s has unknown flags 0x%04x",
		                  frame_type_name(h->type), h->flags);
	if (h->length > max_payload)
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "frame of type %s with %u payload bytes exceeds the limit of %zu bytes",
		                  frame_type_name(h->type), h->length, max_payload);
	return COT_OK;
}

cot_err frame_decode(const void *buf, size_t len, size_t max_payload, frame_header *h,
                     const unsigned char **payload, size_t *frame_len, cot_errbuf *eb)
{
	const unsigned char *p = buf;
	if (len < FRAME_HEADER_LEN)
		return cot_seterr(eb, COT_ERR_INVALID, "truncated frame header: %zu of %d bytes", len,
		                  FRAME_HEADER_LEN);
	cot_err rc = frame_header_decode(p, max_payload, h, eb);
	if (rc)
		return rc;
	if (len - FRAME_HEADER_LEN < h->length)
		return cot_seterr(eb, COT_ERR_INVALID, "truncated frame: %zu of %u payload bytes",
		                  len - FRAME_HEADER_LEN, h->length);
	*payload = p + FRAME_HEADER_LEN;
	*frame_len = FRAME_HEADER_LEN + (size_t)h->length;
	return COT_OK;
}

/* ---- Writing ---- */

void frame_writer_init(frame_writer *w, size_t max)
{
	memset(w, 0, sizeof *w);
	w->max = max;
}

void frame_writer_free(frame_writer *w)
{
	free(w->buf);
	memset(w, 0, sizeof *w);
}

cot_err frame_writer_error(const frame_writer *w) { return w->err; }

/* Room for n more bytes, or a sticky error. */
static unsigned char *reserve(frame_writer *w, size_t n)
{
	if (w->err)
		return NULL;
	if (n > w->max || w->len > w->max - n) {
		w->err = COT_ERR_TOO_LARGE;
		return NULL;
	}
	if (w->len + n > w->cap) {
		size_t cap = w->cap ? w->cap : 256;
		while (cap < w->len + n)
			cap = cap > w->max / 2 ? w->max : cap * 2;
		unsigned char *b = realloc(w->buf, cap);
		if (!b) {
			w->err = COT_ERR_NOMEM;
			return NULL;
		}
		w->buf = b;
		w->cap = cap;
	}
	unsigned char *p = w->buf + w->len;
	w->len += n;
	return p;
}

void frame_put_u8(frame_writer *w, uint8_t v)
{
	unsigned char *p = reserve(w, 1);
	if (p)
		*p = v;
}

void frame_put_u16(frame_writer *w, uint16_t v)
{
	unsigned char *p = reserve(w, 2);
	if (p)
		be16(p, v);
}

void frame_put_u32(frame_writer *w, uint32_t v)
{
	unsigned char *p = reserve(w, 4);
	if (p)
		be32(p, v);
}

void frame_put_u64(frame_writer *w, uint64_t v)
{
	unsigned char *p = reserve(w, 8);
	if (p) {
		be32(p, (uint32_t)(v >> 32));
		be32(p + 4, (uint32_t)v);
	}
}

void frame_put_i64(frame_writer *w, int64_t v) { frame_put_u64(w, (uint64_t)v); }

void frame_put_f32(frame_writer *w, float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	frame_put_u32(w, u);
}

void frame_put_f64(frame_writer *w, double v)
{
	uint64_t u;
	memcpy(&u, &v, 8);
	frame_put_u64(w, u);
}

void frame_put_raw(frame_writer *w, const void *p, size_t n)
{
	unsigned char *d = reserve(w, n);
	if (d && n)
		memcpy(d, p, n);
}

void frame_put_blob(frame_writer *w, const void *p, size_t n)
{
	if (n > UINT32_MAX) {
		if (!w->err)
			w->err = COT_ERR_TOO_LARGE;
		return;
	}
	frame_put_u32(w, (uint32_t)n);
	frame_put_raw(w, p, n);
}

void frame_put_str(frame_writer *w, const char *s)
{
	size_t n = strlen(s);
	if (n > UINT16_MAX) {
		if (!w->err)
			w->err = COT_ERR_TOO_LARGE;
		return;
	}
	frame_put_u16(w, (uint16_t)n);
	frame_put_raw(w, s, n);
}

/* ---- Reading ---- */

void frame_reader_init(frame_reader *r, const void *p, size_t len)
{
	r->p = p;
	r->len = len;
	r->pos = 0;
	r->failed = false;
}

/* The next n bytes, or NULL (and failed) when they are not all there. */
static const unsigned char *take(frame_reader *r, size_t n)
{
	if (r->failed || r->len - r->pos < n) {
		r->failed = true;
		return NULL;
	}
	const unsigned char *p = r->p + r->pos;
	r->pos += n;
	return p;
}

cot_err frame_get_u8(frame_reader *r, uint8_t *v)
{
	const unsigned char *p = take(r, 1);
	if (!p)
		return COT_ERR_INVALID;
	*v = p[0];
	return COT_OK;
}

cot_err frame_get_u16(frame_reader *r, uint16_t *v)
{
	const unsigned char *p = take(r, 2);
	if (!p)
		return COT_ERR_INVALID;
	*v = rd16(p);
	return COT_OK;
}

cot_err frame_get_u32(frame_reader *r, uint32_t *v)
{
	const unsigned char *p = take(r, 4);
	if (!p)
		return COT_ERR_INVALID;
	*v = rd32(p);
	return COT_OK;
}

cot_err frame_get_u64(frame_reader *r, uint64_t *v)
{
	const unsigned char *p = take(r, 8);
	if (!p)
		return COT_ERR_INVALID;
	*v = (uint64_t)rd32(p) << 32 | rd32(p + 4);
	return COT_OK;
}

cot_err frame_get_i64(frame_reader *r, int64_t *v)
{
	uint64_t u;
	cot_err rc = frame_get_u64(r, &u);
	if (!rc)
		*v = (int64_t)u;
	return rc;
}

cot_err frame_get_f32(frame_reader *r, float *v)
{
	uint32_t u;
	cot_err rc = frame_get_u32(r, &u);
	if (!rc)
		memcpy(v, &u, 4);
	return rc;
}

cot_err frame_get_f64(frame_reader *r, double *v)
{
	uint64_t u;
	cot_err rc = frame_get_u64(r, &u);
	if (!rc)
		memcpy(v, &u, 8);
	return rc;
}

cot_err frame_get_blob(frame_reader *r, const unsigned char **p, size_t *n, size_t max)
{
	uint32_t len;
	if (frame_get_u32(r, &len))
		return COT_ERR_INVALID;
	if (len > max) {
		r->failed = true;
		return COT_ERR_INVALID;
	}
	const unsigned char *d = take(r, len);
	if (!d)
		return COT_ERR_INVALID;
	*p = d;
	*n = len;
	return COT_OK;
}

cot_err frame_get_str(frame_reader *r, char *out, size_t outlen)
{
	uint16_t len;
	if (frame_get_u16(r, &len))
		return COT_ERR_INVALID;
	if ((size_t)len >= outlen) {
		r->failed = true;
		return COT_ERR_INVALID;
	}
	const unsigned char *d = take(r, len);
	if (!d || memchr(d, '\0', len)) {
		r->failed = true;
		return COT_ERR_INVALID;
	}
	memcpy(out, d, len);
	out[len] = '\0';
	return COT_OK;
}

cot_err frame_reader_end(const frame_reader *r, const char *what, cot_errbuf *eb)
{
	if (r->failed)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "malformed %s payload: a field is truncated or out of bounds", what);
	if (r->pos != r->len)
		return cot_seterr(eb, COT_ERR_INVALID, "malformed %s payload: %zu trailing bytes", what,
		                  r->len - r->pos);
	return COT_OK;
}

/* ---- ERROR messages ---- */

cot_err frame_error_encode(frame_writer *w, uint16_t code, const char *reason)
{
	char cut[FRAME_REASON_MAX + 1];
	size_t n = strnlen(reason, FRAME_REASON_MAX);
	memcpy(cut, reason, n);
	cut[n] = '\0';
	frame_put_u16(w, code);
	frame_put_str(w, cut);
	return frame_writer_error(w);
}

cot_err frame_error_decode(const void *payload, size_t len, uint16_t *code, char reason[FRAME_REASON_MAX + 1],
                           cot_errbuf *eb)
{
	frame_reader r;
	frame_reader_init(&r, payload, len);
	frame_get_u16(&r, code);
	frame_get_str(&r, reason, FRAME_REASON_MAX + 1);
	return frame_reader_end(&r, "ERROR", eb);
}

cot_err frame_error_to_cot(uint16_t code)
{
	switch (code) {
	case FRAME_ERR_PROTOCOL:
		return COT_ERR_INVALID;
	case FRAME_ERR_VERSION:
		return COT_ERR_UNSUPPORTED;
	case FRAME_ERR_PROJECT:
		return COT_ERR_FORBIDDEN;
	case FRAME_ERR_IDENTITY:
		return COT_ERR_AUTH;
	case FRAME_ERR_ROUND:
		return COT_ERR_CONFLICT;
	case FRAME_ERR_LIMIT:
		return COT_ERR_TOO_LARGE;
	case FRAME_ERR_NOT_FOUND:
		return COT_ERR_NOT_FOUND;
	}
	return COT_ERR_NETWORK;
}

uint16_t frame_error_from_cot(cot_err e)
{
	switch (e) {
	case COT_ERR_INVALID:
		return FRAME_ERR_PROTOCOL;
	case COT_ERR_UNSUPPORTED:
		return FRAME_ERR_VERSION;
	case COT_ERR_FORBIDDEN:
		return FRAME_ERR_PROJECT;
	case COT_ERR_AUTH:
		return FRAME_ERR_IDENTITY;
	case COT_ERR_CONFLICT:
		return FRAME_ERR_ROUND;
	case COT_ERR_TOO_LARGE:
		return FRAME_ERR_LIMIT;
	case COT_ERR_NOT_FOUND:
		return FRAME_ERR_NOT_FOUND;
	default:
		return FRAME_ERR_INTERNAL;
	}
}
