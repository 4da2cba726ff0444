/* cotrain tests: frame headers, payload codecs, ERROR and HELLO messages. */
#include "shared/peer/frame.h"
#include "shared/peer/hello.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cot_errbuf eb;

static cot_err decode(const unsigned char *buf, size_t len, size_t max, frame_header *h,
                      const unsigned char **p, size_t *flen)
{
	memset(&eb, 0, sizeof eb);
	return frame_decode(buf, len, max, h, p, flen, &eb);
}

static hello_msg hello(const char *project, int64_t host, int64_t round, uint16_t lo, uint16_t hi)
{
	hello_msg m = { .proto_min = lo,
		        .proto_max = hi,
		        .host_id = host,
		        .round = round,
		        .max_payload = FRAME_PAYLOAD_DEFAULT_MAX };
	snprintf(m.project, sizeof m.project, "%s", project);
	return m;
}

int main(void)
{
	unsigned char buf[64 + FRAME_HEADER_LEN];
	frame_header h = { 0 }, g;
	const unsigned char *p = NULL;
	size_t flen = 0;

	plan_lazy();

	/* The header's bytes, exactly as doc/peer-protocol.md states them. */
	h.type = FRAME_HELLO;
	h.length = 3;
	h.request_id = 0x01020304;
	frame_header_encode(&h, buf);
	static const unsigned char want[FRAME_HEADER_LEN] = { 'C', 'O', 'T', 'P', 1, 1, 0, 0,
		                                              0,   0,   0,   3,   1, 2, 3, 4 };
	ok(memcmp(buf, want, sizeof want) == 0,
	   "the header is magic, version, type, flags, length, request id in network order");
	memcpy(buf + FRAME_HEADER_LEN, "abc", 3);
	is_int(decode(buf, FRAME_HEADER_LEN + 3, 1024, &g, &p, &flen), COT_OK, "a frame decodes");
	ok(g.version == 1 && g.type == FRAME_HELLO && g.flags == 0 && g.length == 3 &&
	           g.request_id == 0x01020304,
	   "with the same header fields");
	ok(p == buf + FRAME_HEADER_LEN && flen == FRAME_HEADER_LEN + 3 && memcmp(p, "abc", 3) == 0,
	   "and payload");
	is_int(decode(buf, FRAME_HEADER_LEN + 3 + 5, 1024, &g, &p, &flen), COT_OK,
	       "bytes after the frame are not part of it");
	is_int((long long)flen, FRAME_HEADER_LEN + 3, "its length is header plus payload");

	/* Refusals from the header alone. */
	unsigned char bad[FRAME_HEADER_LEN + 3];
	memcpy(bad, buf, sizeof bad);
	bad[0] = 'X';
	is_int(decode(bad, sizeof bad, 1024, &g, &p, &flen), COT_ERR_INVALID, "a bad magic is refused");
	ok(strstr(eb.msg, "bad frame magic") != NULL, "%s", eb.msg);
	memcpy(bad, buf, sizeof bad);
	bad[4] = 2;
	is_int(decode(bad, sizeof bad, 1024, &g, &p, &flen), COT_ERR_UNSUPPORTED,
	       "another frame version is refused");
	ok(strstr(eb.msg, "unsupported frame version 2") != NULL, "%s", eb.msg);
	memcpy(bad, buf, sizeof bad);
	bad[7] = 0x80;
	is_int(decode(bad, sizeof bad, 1024, &g, &p, &flen), COT_ERR_INVALID, "unknown flags are refused");
	/* A length of 4 GiB - 1 with only a header present: refused as too large,
	 * before anyone could think of reading (or allocating) the payload. */
	h.length = 0xffffffffu;
	frame_header_encode(&h, bad);
	is_int(decode(bad, FRAME_HEADER_LEN, SIZE_MAX, &g, &p, &flen), COT_ERR_TOO_LARGE,
	       "a 4 GiB length is refused even with an unlimited receiver (hard cap)");
	ok(strstr(eb.msg, "exceeds the limit of 67108864 bytes") != NULL, "%s", eb.msg);
	h.length = 1025;
	frame_header_encode(&h, bad);
	is_int(decode(bad, FRAME_HEADER_LEN, 1024, &g, &p, &flen), COT_ERR_TOO_LARGE,
	       "a length one above the receiver's limit is refused");
	h.length = 1024;
	frame_header_encode(&h, bad);
	is_int(decode(bad, FRAME_HEADER_LEN, 1024, &g, &p, &flen), COT_ERR_INVALID,
	       "a length at the limit passes the header check, then the missing payload is truncation");
	ok(strstr(eb.msg, "truncated frame: 0 of 1024") != NULL, "%s", eb.msg);

	/* Truncations. */
	for (size_t n = 0; n < FRAME_HEADER_LEN + 3; n++)
		if (decode(buf, n, 1024, &g, &p, &flen) != COT_ERR_INVALID) {
			ok(false, "a frame cut to %zu bytes is refused", n);
			break;
		} else if (n == FRAME_HEADER_LEN + 2) {
			ok(true, "a frame cut anywhere is refused as truncated");
		}

	/* Payload codecs. */
	frame_writer w;
	frame_writer_init(&w, 1024);
	frame_put_u8(&w, 0xab);
	frame_put_u16(&w, 0xbeef);
	frame_put_u32(&w, 0xdeadbeef);
	frame_put_u64(&w, 0x0102030405060708ull);
	frame_put_i64(&w, -5);
	frame_put_f32(&w, 1.5f);
	frame_put_f64(&w, -0.25);
	frame_put_f32(&w, NAN);
	frame_put_blob(&w, "blob", 4);
	frame_put_str(&w, "héllo");
	is_int(frame_writer_error(&w), COT_OK, "a payload is written");
	ok(w.len == 1 + 2 + 4 + 8 + 8 + 4 + 8 + 4 + 4 + 4 + 2 + 6, "of the expected %zu bytes", w.len);
	ok(w.buf[1] == 0xbe && w.buf[2] == 0xef && w.buf[3] == 0xde, "integers are big-endian");
	frame_reader r;
	uint8_t u8;
	uint16_t u16;
	uint32_t u32;
	uint64_t u64;
	int64_t i64;
	float f, fn;
	double d;
	const unsigned char *bp;
	size_t bn;
	char s[16];
	frame_reader_init(&r, w.buf, w.len);
	frame_get_u8(&r, &u8);
	frame_get_u16(&r, &u16);
	frame_get_u32(&r, &u32);
	frame_get_u64(&r, &u64);
	frame_get_i64(&r, &i64);
	frame_get_f32(&r, &f);
	frame_get_f64(&r, &d);
	frame_get_f32(&r, &fn);
	frame_get_blob(&r, &bp, &bn, 16);
	frame_get_str(&r, s, sizeof s);
	is_int(frame_reader_end(&r, "test", &eb), COT_OK, "it reads back completely");
	ok(u8 == 0xab && u16 == 0xbeef && u32 == 0xdeadbeef && u64 == 0x0102030405060708ull && i64 == -5,
	   "integers round-trip");
	ok(f == 1.5f && d == -0.25 && isnan(fn), "floats round-trip, NaN included");
	ok(bn == 4 && memcmp(bp, "blob", 4) == 0, "blobs round-trip");
	is_str(s, "héllo", "strings round-trip");

	/* Reader bounds. */
	for (size_t n = 0; n < w.len; n++) {
		frame_reader_init(&r, w.buf, n);
		frame_get_u8(&r, &u8);
		frame_get_u16(&r, &u16);
		frame_get_u32(&r, &u32);
		frame_get_u64(&r, &u64);
		frame_get_i64(&r, &i64);
		frame_get_f32(&r, &f);
		frame_get_f64(&r, &d);
		frame_get_f32(&r, &fn);
		frame_get_blob(&r, &bp, &bn, 16);
		frame_get_str(&r, s, sizeof s);
		if (frame_reader_end(&r, "test", &eb) != COT_ERR_INVALID) {
			ok(false, "a payload cut to %zu bytes is refused", n);
			break;
		}
		if (n == w.len - 1)
			ok(true, "a payload cut anywhere is refused");
	}
	frame_reader_init(&r, w.buf, w.len);
	frame_get_u8(&r, &u8);
	is_int(frame_reader_end(&r, "test", &eb), COT_ERR_INVALID, "trailing bytes are refused");
	ok(strstr(eb.msg, "trailing bytes") != NULL, "%s", eb.msg);
	unsigned char lie[8] = { 0xff, 0xff, 0xff, 0xf0, 1, 2, 3, 4 };
	frame_reader_init(&r, lie, sizeof lie);
	is_int(frame_get_blob(&r, &bp, &bn, SIZE_MAX), COT_ERR_INVALID,
	       "a blob claiming 4 GiB in 8 bytes is refused");
	unsigned char lie2[8] = { 0, 0, 0, 4, 1, 2, 3, 4 };
	frame_reader_init(&r, lie2, sizeof lie2);
	is_int(frame_get_blob(&r, &bp, &bn, 3), COT_ERR_INVALID,
	       "a blob above the caller's bound is refused");
	unsigned char nul[5] = { 0, 3, 'a', 0, 'b' };
	frame_reader_init(&r, nul, sizeof nul);
	is_int(frame_get_str(&r, s, sizeof s), COT_ERR_INVALID, "a string holding a NUL is refused");
	unsigned char longs[20] = { 0, 16 };
	memset(longs + 2, 'x', 16);
	frame_reader_init(&r, longs, 18);
	is_int(frame_get_str(&r, s, sizeof s), COT_ERR_INVALID,
	       "a string that does not fit with its NUL is refused");
	frame_writer_free(&w);

	/* Writer bounds. */
	frame_writer_init(&w, 8);
	frame_put_u64(&w, 1);
	is_int(frame_writer_error(&w), COT_OK, "a writer fills up to its bound");
	frame_put_u8(&w, 1);
	is_int(frame_writer_error(&w), COT_ERR_TOO_LARGE, "and refuses one byte more");
	is_int((long long)w.len, 8, "without writing it");
	frame_writer_free(&w);

	/* ERROR. */
	frame_writer_init(&w, 1024);
	char longreason[FRAME_REASON_MAX + 100];
	memset(longreason, 'r', sizeof longreason - 1);
	longreason[sizeof longreason - 1] = '\0';
	is_int(frame_error_encode(&w, FRAME_ERR_ROUND, longreason), COT_OK,
	       "an ERROR with a long reason is written");
	uint16_t code;
	char reason[FRAME_REASON_MAX + 1];
	is_int(frame_error_decode(w.buf, w.len, &code, reason, &eb), COT_OK, "and read back");
	ok(code == FRAME_ERR_ROUND && strlen(reason) == FRAME_REASON_MAX, "with its reason cut to %d bytes",
	   FRAME_REASON_MAX);
	is_int(frame_error_to_cot(code), COT_ERR_CONFLICT, "a round error means a conflict");
	is_int(frame_error_to_cot(999), COT_ERR_NETWORK, "an unknown code is a network error");
	is_int(frame_error_from_cot(COT_ERR_UNSUPPORTED), FRAME_ERR_VERSION,
	       "unsupported is sent as a version error");
	frame_writer_free(&w);

	/* HELLO. */
	hello_msg a = hello("demo", 5, 17, 1, 3), b, c;
	frame_writer_init(&w, 256);
	is_int(hello_encode(&a, &w), COT_OK, "a HELLO is written");
	is_int(hello_decode(w.buf, w.len, &b, &eb), COT_OK, "and read back");
	ok(b.proto_min == 1 && b.proto_max == 3 && !strcmp(b.project, "demo") && b.host_id == 5 &&
	           b.round == 17 && b.max_payload == FRAME_PAYLOAD_DEFAULT_MAX,
	   "unchanged");
	is_int(hello_decode(w.buf, w.len - 1, &b, &eb), COT_ERR_INVALID, "a truncated HELLO is refused");
	frame_writer_free(&w);
	c = hello("Not A Project", 5, 17, 1, 1);
	frame_writer_init(&w, 256);
	hello_encode(&c, &w);
	is_int(hello_decode(w.buf, w.len, &b, &eb), COT_ERR_INVALID,
	       "a HELLO with an invalid project name is refused");
	frame_writer_free(&w);
	c = hello("demo", 5, 17, 2, 1);
	frame_writer_init(&w, 256);
	hello_encode(&c, &w);
	is_int(hello_decode(w.buf, w.len, &b, &eb), COT_ERR_INVALID,
	       "a HELLO with an empty version range is refused");
	frame_writer_free(&w);

	uint16_t v = 0;
	hello_msg ours = hello("demo", 1, 17, 1, 2);
	b = hello("demo", 5, 17, 2, 4);
	is_int(hello_check(&ours, &b, 5, &v, &eb), COT_OK, "overlapping version ranges agree");
	is_int(v, 2, "on the highest common version");
	b = hello("demo", 5, 17, 3, 4);
	memset(&eb, 0, sizeof eb);
	is_int(hello_check(&ours, &b, 5, &v, &eb), COT_ERR_UNSUPPORTED,
	       "disjoint version ranges are refused");
	ok(strstr(eb.msg, "no common protocol version: we speak 1..2, the peer 3..4") != NULL, "%s", eb.msg);
	b = hello("other", 5, 17, 1, 1);
	is_int(hello_check(&ours, &b, 5, &v, &eb), COT_ERR_FORBIDDEN, "another project is refused");
	b = hello("demo", 6, 17, 1, 1);
	is_int(hello_check(&ours, &b, 5, &v, &eb), COT_ERR_AUTH,
	       "a host id other than the certificate's is refused");
	b = hello("demo", 5, 18, 1, 1);
	is_int(hello_check(&ours, &b, 5, &v, &eb), COT_ERR_CONFLICT, "another round is refused");
	ok(strstr(eb.msg, "round 18") != NULL, "%s", eb.msg);

	ok(frame_type_known(FRAME_HELLO) && !frame_type_known(FRAME_SLICE) && !frame_type_known(0x7f),
	   "SLICE belongs to the all-reduce's messages, not the frame layer's own types");
	done_testing();
	return exit_status();
}
