/* cotrain: the all-reduce's messages (see allreduce_msg.h). */
#include "shared/averaging/allreduce_msg.h"

#include <stdlib.h>
#include <string.h>

static void put_ids(frame_writer *w, const int64_t *ids, size_t n)
{
	frame_put_u32(w, (uint32_t)n);
	for (size_t i = 0; i < n; i++)
		frame_put_i64(w, ids[i]);
}

/* Read a list of at most max ids, strictly ascending, into a malloc'd
 * array (the caller's on COT_OK; nothing allocated otherwise). */
static cot_err get_ids(frame_reader *rd, size_t max, int64_t **ids, size_t *n, const char *what,
                       cot_errbuf *eb)
{
	uint32_t k = 0;
	*ids = NULL;
	*n = 0;
	if (frame_get_u32(rd, &k) || k > max)
		return cot_seterr(eb, COT_ERR_INVALID, "%s lists more hosts than the group has", what);
	int64_t *v = malloc((k ? k : 1) * sizeof *v);
	if (!v)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	for (uint32_t i = 0; i < k; i++)
		if (frame_get_i64(rd, &v[i]) || (i && v[i] <= v[i - 1])) {
			free(v);
			return cot_seterr(eb, COT_ERR_INVALID, "%s has a malformed list of hosts", what);
		}
	*ids = v;
	*n = k;
	return COT_OK;
}

cot_err ar_slice_encode(frame_writer *w, const ar_slice_msg *m)
{
	frame_put_i64(w, m->round);
	frame_put_i64(w, m->from);
	frame_put_u64(w, m->samples);
	frame_put_u8(w, m->comp);
	frame_put_u64(w, m->start);
	frame_put_u64(w, m->end);
	frame_put_blob(w, m->data, m->dlen);
	return frame_writer_error(w);
}

cot_err ar_slice_decode(const void *pl, size_t len, ar_slice_msg *m, cot_errbuf *eb)
{
	frame_reader rd;
	memset(m, 0, sizeof *m);
	frame_reader_init(&rd, pl, len);
	frame_get_i64(&rd, &m->round);
	frame_get_i64(&rd, &m->from);
	frame_get_u64(&rd, &m->samples);
	frame_get_u8(&rd, &m->comp);
	frame_get_u64(&rd, &m->start);
	frame_get_u64(&rd, &m->end);
	frame_get_blob(&rd, &m->data, &m->dlen, FRAME_PAYLOAD_HARD_MAX);
	return frame_reader_end(&rd, "SLICE", eb);
}

cot_err ar_accepted_encode(frame_writer *w, const ar_accepted_msg *m)
{
	frame_put_i64(w, m->round);
	frame_put_i64(w, m->agg);
	put_ids(w, m->ids, m->n_ids);
	return frame_writer_error(w);
}

cot_err ar_accepted_decode(const void *pl, size_t len, size_t max_ids, ar_accepted_msg *m, cot_errbuf *eb)
{
	frame_reader rd;
	memset(m, 0, sizeof *m);
	frame_reader_init(&rd, pl, len);
	frame_get_i64(&rd, &m->round);
	frame_get_i64(&rd, &m->agg);
	cot_err rc = get_ids(&rd, max_ids, &m->ids, &m->n_ids, "ACCEPTED", eb);
	if (!rc)
		rc = frame_reader_end(&rd, "ACCEPTED", eb);
	if (rc) {
		free(m->ids);
		memset(m, 0, sizeof *m);
	}
	return rc;
}

cot_err ar_result_encode(frame_writer *w, const ar_result_msg *m)
{
	frame_put_i64(w, m->round);
	frame_put_i64(w, m->agg);
	frame_put_u64(w, m->start);
	frame_put_u64(w, m->end);
	frame_put_u8(w, m->comp);
	frame_put_u64(w, m->total);
	put_ids(w, m->ids, m->n_ids);
	frame_put_blob(w, m->data, m->dlen);
	return frame_writer_error(w);
}

cot_err ar_result_decode(const void *pl, size_t len, size_t max_ids, ar_result_msg *m, cot_errbuf *eb)
{
	frame_reader rd;
	memset(m, 0, sizeof *m);
	frame_reader_init(&rd, pl, len);
	frame_get_i64(&rd, &m->round);
	frame_get_i64(&rd, &m->agg);
	frame_get_u64(&rd, &m->start);
	frame_get_u64(&rd, &m->end);
	frame_get_u8(&rd, &m->comp);
	frame_get_u64(&rd, &m->total);
	cot_err rc = get_ids(&rd, max_ids, &m->ids, &m->n_ids, "RESULT", eb);
	if (!rc) {
		frame_get_blob(&rd, &m->data, &m->dlen, FRAME_PAYLOAD_HARD_MAX);
		rc = frame_reader_end(&rd, "RESULT", eb);
	}
	if (rc) {
		free(m->ids);
		memset(m, 0, sizeof *m);
	}
	return rc;
}

cot_err ar_part_encode(frame_writer *w, const ar_part_msg *m)
{
	frame_put_i64(w, m->round);
	frame_put_i64(w, m->agg);
	frame_put_u64(w, m->start);
	frame_put_u64(w, m->end);
	frame_put_blob(w, m->data, m->dlen);
	return frame_writer_error(w);
}

cot_err ar_part_decode(const void *pl, size_t len, ar_part_msg *m, cot_errbuf *eb)
{
	frame_reader rd;
	memset(m, 0, sizeof *m);
	frame_reader_init(&rd, pl, len);
	frame_get_i64(&rd, &m->round);
	frame_get_i64(&rd, &m->agg);
	frame_get_u64(&rd, &m->start);
	frame_get_u64(&rd, &m->end);
	frame_get_blob(&rd, &m->data, &m->dlen, FRAME_PAYLOAD_HARD_MAX);
	return frame_reader_end(&rd, "RESULT_PART", eb);
}

cot_err ar_stream_encode(frame_writer *w, const ar_stream_msg *m)
{
	frame_put_i64(w, m->round);
	frame_put_i64(w, m->member);
	return frame_writer_error(w);
}

cot_err ar_stream_decode(const void *pl, size_t len, ar_stream_msg *m, cot_errbuf *eb)
{
	frame_reader rd;
	memset(m, 0, sizeof *m);
	frame_reader_init(&rd, pl, len);
	frame_get_i64(&rd, &m->round);
	frame_get_i64(&rd, &m->member);
	return frame_reader_end(&rd, "STREAM", eb);
}
