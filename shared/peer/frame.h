/* cotrain: the framed, versioned binary protocol between peers.
 *
 * Every message is one frame: a 16-byte header in network byte order and a
 * payload of at most a per-connection limit (never above FRAME_PAYLOAD_HARD_MAX):
 *
 *   offset size field
 *        0    4 magic       "COTP" (0x434f5450)
 *        4    1 version     frame layout version, FRAME_VERSION (1)
 *        5    1 type        enum frame_type
 *        6    2 flags       none defined in version 1: must be 0
 *        8    4 length      payload bytes that follow
 *       12    4 request_id  chosen by the sender, echoed in replies (0 = none)
 *
 * The header is checked before anything is allocated for the payload: a bad
 * magic, an unknown layout version, unknown flags or a length above the limit
 * are refused from the 16 header bytes alone.  Payload fields are big-endian
 * integers, IEEE-754 floats, blobs (u32 length + bytes) and strings (u16
 * length + UTF-8 bytes, no NUL), read with a bounds-checked frame_reader.
 * doc/peer-protocol.md describes the messages. */
#ifndef COT_FRAME_H
#define COT_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

#define FRAME_MAGIC 0x434f5450u /* "COTP" */
#define FRAME_VERSION 1
#define FRAME_HEADER_LEN 16
#define FRAME_PAYLOAD_HARD_MAX (64u << 20)    /* 64 MiB, whatever a peer says */
#define FRAME_PAYLOAD_DEFAULT_MAX (16u << 20) /* per connection, until changed */
#define FRAME_PAYLOAD_MIN_MAX (64u << 10)     /* smallest limit a peer may announce */
#define FRAME_REASON_MAX 512                  /* bytes of an ERROR reason */

enum frame_type {
	FRAME_HELLO = 0x01, /* versions, project, host, round: see hello.h */
	FRAME_READY = 0x02, /* HELLO accepted; empty payload */
	FRAME_ERROR = 0x03, /* u16 code (enum frame_error), str reason; then close */
	/* 0x10..0x1f: the all-reduce's messages, read by shared/averaging/ itself
	 * (allreduce_msg.h: also ACCEPTED 0x13, STREAM 0x14, RESULT_PART 0x15,
	 * STREAM_END 0x16); frame_type_known() answers for this layer's own. */
	FRAME_SLICE = 0x10,  /* a peer's slice of the gradient to an aggregator */
	FRAME_RESULT = 0x11, /* an aggregator's summed slice */
	FRAME_ABORT = 0x12,  /* leave the round */
	/* 0x20..0x2f: unassigned (the NAT service speaks a line protocol, not
	 * frames).  0x30..0x3f: pieces of held files (protocol version 3,
	 * pieces.h): */
	FRAME_PIECE_GET = 0x30, /* str sha256, u32 index: ask for a piece */
	FRAME_PIECE = 0x31,     /* u32 index, blob bytes: the piece asked for */
	                        /* 0x40..0xff: unassigned */
};

/* Codes carried by FRAME_ERROR: stable on the wire, unlike cot_err values. */
enum frame_error {
	FRAME_ERR_PROTOCOL = 1,  /* malformed or unexpected message */
	FRAME_ERR_VERSION = 2,   /* no common protocol version */
	FRAME_ERR_PROJECT = 3,   /* another project */
	FRAME_ERR_IDENTITY = 4,  /* host id does not match the certificate, or not expected */
	FRAME_ERR_ROUND = 5,     /* not in the same round */
	FRAME_ERR_LIMIT = 6,     /* a size limit was exceeded */
	FRAME_ERR_INTERNAL = 7,  /* the sender failed */
	FRAME_ERR_NOT_FOUND = 8, /* the file asked for is not held (pieces.h) */
};

typedef struct {
	uint8_t version;
	uint8_t type;
	uint16_t flags;
	uint32_t length;
	uint32_t request_id;
} frame_header;

/* True for the types this build defines (not the reserved ones). */
bool frame_type_known(uint8_t type);

/* "HELLO", "ERROR"..., or "unknown" for any other value; never NULL. */
const char *frame_type_name(uint8_t type);

/* Write h (its version field is ignored: FRAME_VERSION is written) into out. */
void frame_header_encode(const frame_header *h, unsigned char out[FRAME_HEADER_LEN]);

/* Parse and check a header.  max_payload is the receiver's limit (clamped to
 * FRAME_PAYLOAD_HARD_MAX).  COT_ERR_INVALID for a bad magic or flags,
 * COT_ERR_UNSUPPORTED for another layout version, COT_ERR_TOO_LARGE for a
 * length above the limit; each with a detail in eb. */
cot_err frame_header_decode(const unsigned char in[FRAME_HEADER_LEN], size_t max_payload, frame_header *h,
                            cot_errbuf *eb);

/* Parse one whole frame at the start of buf (len bytes): *h, *payload (points
 * into buf) and *frame_len (header + payload).  COT_ERR_INVALID "truncated"
 * when buf holds less than the header says; header errors as above.  Nothing
 * is allocated. */
cot_err frame_decode(const void *buf, size_t len, size_t max_payload, frame_header *h,
                     const unsigned char **payload, size_t *frame_len, cot_errbuf *eb);

/* ---- Writing payloads ---- */

/* A growable payload buffer that refuses to grow past max bytes.  Errors are
 * sticky: after one, further puts do nothing and frame_writer_error() says why
 * (COT_ERR_NOMEM or COT_ERR_TOO_LARGE). */
typedef struct {
	unsigned char *buf; /* malloc'd; freed by frame_writer_free */
	size_t len, cap, max;
	cot_err err;
} frame_writer;

void frame_writer_init(frame_writer *w, size_t max);
void frame_writer_free(frame_writer *w);
cot_err frame_writer_error(const frame_writer *w);
void frame_put_u8(frame_writer *w, uint8_t v);
void frame_put_u16(frame_writer *w, uint16_t v);
void frame_put_u32(frame_writer *w, uint32_t v);
void frame_put_u64(frame_writer *w, uint64_t v);
void frame_put_i64(frame_writer *w, int64_t v);
void frame_put_f32(frame_writer *w, float v);
void frame_put_f64(frame_writer *w, double v);
void frame_put_raw(frame_writer *w, const void *p, size_t n);
/* u32 length, then n bytes. */
void frame_put_blob(frame_writer *w, const void *p, size_t n);
/* u16 length, then the bytes of s (at most UINT16_MAX; longer is TOO_LARGE). */
void frame_put_str(frame_writer *w, const char *s);

/* ---- Reading payloads ---- */

/* A bounds-checked cursor over a payload it does not own.  Every get returns
 * COT_OK or COT_ERR_INVALID (not enough bytes, a bound exceeded, a NUL in a
 * string); errors are sticky, so a sequence of gets may be checked once with
 * frame_reader_end(). */
typedef struct {
	const unsigned char *p;
	size_t len, pos;
	bool failed;
} frame_reader;

void frame_reader_init(frame_reader *r, const void *p, size_t len);
cot_err frame_get_u8(frame_reader *r, uint8_t *v);
cot_err frame_get_u16(frame_reader *r, uint16_t *v);
cot_err frame_get_u32(frame_reader *r, uint32_t *v);
cot_err frame_get_u64(frame_reader *r, uint64_t *v);
cot_err frame_get_i64(frame_reader *r, int64_t *v);
cot_err frame_get_f32(frame_reader *r, float *v);
cot_err frame_get_f64(frame_reader *r, double *v);
/* A u32-prefixed blob of at most max bytes; *p points into the payload. */
cot_err frame_get_blob(frame_reader *r, const unsigned char **p, size_t *n, size_t max);
/* A u16-prefixed string copied NUL-terminated into out (outlen bytes); it must
 * fit and hold no NUL. */
cot_err frame_get_str(frame_reader *r, char *out, size_t outlen);
/* COT_OK when every get succeeded and the payload is consumed exactly; else
 * COT_ERR_INVALID naming what (e.g. "HELLO") in eb. */
cot_err frame_reader_end(const frame_reader *r, const char *what, cot_errbuf *eb);

/* ---- ERROR messages ---- */

/* Payload of an ERROR frame: code, and reason cut to FRAME_REASON_MAX bytes. */
cot_err frame_error_encode(frame_writer *w, uint16_t code, const char *reason);
/* Parse an ERROR payload; reason must hold FRAME_REASON_MAX + 1 bytes. */
cot_err frame_error_decode(const void *payload, size_t len, uint16_t *code, char reason[FRAME_REASON_MAX + 1],
                           cot_errbuf *eb);
/* The cot_err a received error code stands for (COT_ERR_NETWORK for unknown
 * codes), and the code to send for a local cot_err. */
cot_err frame_error_to_cot(uint16_t code);
uint16_t frame_error_from_cot(cot_err e);

#endif
