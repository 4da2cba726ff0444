/* cotrain: the all-reduce's messages and their payloads (doc/averaging.md).
 *
 * Slice connection, member -> aggregator, then back:
 *
 *   SLICE     i64 round, i64 member, u64 samples, u8 comp, u64 start, u64 end, blob data
 *   ACCEPTED  i64 round, i64 aggregator, u32 n, n x i64 host id (ascending)
 *   RESULT    i64 round, i64 aggregator, u64 start, u64 end, u8 comp, u64 total samples,
 *             u32 n, n x i64 host id (ascending), blob data (empty: "as sent in parts")
 *   ABORT     an ERROR payload (frame_error_encode)
 *
 * Stream connection: member -> aggregator STREAM (i64 round, i64 member)
 * asks for the result parts; aggregator -> member RESULT_PART (i64 round,
 * i64 aggregator, u64 start, u64 end, blob data), in order, then STREAM_END
 * (u8 1 when every part was sent, 0 when the aggregator stopped
 * speculating).  RESULT_PARTs also travel on the slice connection, right
 * before a RESULT whose data is empty.
 *
 * The encoders append to a frame_writer (the caller's, like hello_encode) and
 * return its error; the decoders check shape only (bounded, no trailing
 * bytes), so the caller compares the fields with what it expects.  Blobs
 * decoded point into the payload, which must outlive the message. */
#ifndef COT_ALLREDUCE_MSG_H
#define COT_ALLREDUCE_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"
#include "shared/peer/frame.h"

/* Stream connections (frame.h's averaging range, after allreduce.h's). */
#define FRAME_STREAM 0x14
#define FRAME_RESULT_PART 0x15
#define FRAME_STREAM_END 0x16

typedef struct {
	int64_t round, from;
	uint64_t samples;
	uint8_t comp;
	uint64_t start, end;
	const unsigned char *data; /* into the payload when decoded */
	size_t dlen;
} ar_slice_msg;

typedef struct {
	int64_t round, agg;
	int64_t *ids; /* malloc'd when decoded: the caller frees */
	size_t n_ids;
} ar_accepted_msg;

typedef struct {
	int64_t round, agg;
	uint64_t start, end;
	uint8_t comp;
	uint64_t total;
	int64_t *ids; /* malloc'd when decoded: the caller frees */
	size_t n_ids;
	const unsigned char *data; /* into the payload when decoded */
	size_t dlen;
} ar_result_msg;

typedef struct {
	int64_t round, agg;
	uint64_t start, end;
	const unsigned char *data; /* into the payload when decoded */
	size_t dlen;
} ar_part_msg;

typedef struct {
	int64_t round, member;
} ar_stream_msg;

cot_err ar_slice_encode(frame_writer *w, const ar_slice_msg *m);
cot_err ar_accepted_encode(frame_writer *w, const ar_accepted_msg *m);
cot_err ar_result_encode(frame_writer *w, const ar_result_msg *m);
cot_err ar_part_encode(frame_writer *w, const ar_part_msg *m);
cot_err ar_stream_encode(frame_writer *w, const ar_stream_msg *m);

/* Each: parse payload pl (len bytes) into *m.  COT_ERR_INVALID with the
 * reason in eb when it is truncated, too long, or (lists) holds more than
 * max_ids ids or ids not strictly ascending; then *m holds nothing to free. */
cot_err ar_slice_decode(const void *pl, size_t len, ar_slice_msg *m, cot_errbuf *eb);
cot_err ar_accepted_decode(const void *pl, size_t len, size_t max_ids, ar_accepted_msg *m, cot_errbuf *eb);
cot_err ar_result_decode(const void *pl, size_t len, size_t max_ids, ar_result_msg *m, cot_errbuf *eb);
cot_err ar_part_decode(const void *pl, size_t len, ar_part_msg *m, cot_errbuf *eb);
cot_err ar_stream_decode(const void *pl, size_t len, ar_stream_msg *m, cot_errbuf *eb);

#endif
