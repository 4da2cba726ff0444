/* cotrain: the HELLO exchange that opens every peer connection. */
#include "shared/peer/hello.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cot_err hello_encode(const hello_msg *m, frame_writer *w)
{
	frame_put_u16(w, m->proto_min);
	frame_put_u16(w, m->proto_max);
	frame_put_str(w, m->project);
	frame_put_i64(w, m->host_id);
	frame_put_i64(w, m->round);
	frame_put_u32(w, m->max_payload);
	return frame_writer_error(w);
}

cot_err hello_decode(const void *payload, size_t len, hello_msg *m, cot_errbuf *eb)
{
	frame_reader r;
	memset(m, 0, sizeof *m);
	frame_reader_init(&r, payload, len);
	frame_get_u16(&r, &m->proto_min);
	frame_get_u16(&r, &m->proto_max);
	frame_get_str(&r, m->project, sizeof m->project);
	frame_get_i64(&r, &m->host_id);
	frame_get_i64(&r, &m->round);
	frame_get_u32(&r, &m->max_payload);
	cot_err rc = frame_reader_end(&r, "HELLO", eb);
	if (rc)
		return rc;
	if (m->proto_min == 0 || m->proto_min > m->proto_max)
		return cot_seterr(eb, COT_ERR_INVALID, "HELLO has an invalid version range %u..%u",
		                  m->proto_min, m->proto_max);
	if (!pki_project_name_valid(m->project))
		return cot_seterr(eb, COT_ERR_INVALID, "HELLO has an invalid project name");
	if (m->host_id <= 0 || m->round < 0)
		return cot_seterr(eb, COT_ERR_INVALID, "HELLO has an invalid host id or round");
	if (m->max_payload < FRAME_PAYLOAD_MIN_MAX)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "HELLO announces a payload limit of %u bytes, below %u", m->max_payload,
		                  FRAME_PAYLOAD_MIN_MAX);
	return COT_OK;
}

cot_err hello_check(const hello_msg *ours, const hello_msg *theirs, int64_t cert_host_id, uint16_t *version,
                    cot_errbuf *eb)
{
	if (strcmp(ours->project, theirs->project) != 0)
		return cot_seterr(eb, COT_ERR_FORBIDDEN, "peer is in project \"%s\", not \"%s\"",
		                  theirs->project, ours->project);
	if (theirs->host_id != cert_host_id)
		return cot_seterr(eb, COT_ERR_AUTH,
		                  "peer says it is host %lld, but its certificate names host %lld",
		                  (long long)theirs->host_id, (long long)cert_host_id);
	uint16_t lo = ours->proto_min > theirs->proto_min ? ours->proto_min : theirs->proto_min;
	uint16_t hi = ours->proto_max < theirs->proto_max ? ours->proto_max : theirs->proto_max;
	if (lo > hi)
		return cot_seterr(eb, COT_ERR_UNSUPPORTED,
		                  "no common protocol version: we speak %u..%u, the peer %u..%u",
		                  ours->proto_min, ours->proto_max, theirs->proto_min, theirs->proto_max);
	if (theirs->round != ours->round && theirs->round == HELLO_ROUND_FILES)
		return cot_seterr(eb, COT_ERR_CONFLICT, "peer asks for pieces of files, we are in round %lld",
		                  (long long)ours->round);
	if (theirs->round != ours->round && ours->round == HELLO_ROUND_FILES)
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "peer is in round %lld, we serve only pieces of files",
		                  (long long)theirs->round);
	if (theirs->round != ours->round)
		return cot_seterr(eb, COT_ERR_CONFLICT, "peer is in round %lld, we are in round %lld",
		                  (long long)theirs->round, (long long)ours->round);
	*version = hi;
	return COT_OK;
}

/* The peer's answer was an ERROR frame: its reason as our error. */
static cot_err peer_refused(const unsigned char *p, size_t len, cot_errbuf *eb)
{
	uint16_t code;
	char reason[FRAME_REASON_MAX + 1];
	cot_errbuf tmp;
	if (frame_error_decode(p, len, &code, reason, &tmp))
		return cot_seterr(eb, COT_ERR_INVALID, "peer refused with a malformed ERROR: %s", tmp.msg);
	return cot_seterr(eb, frame_error_to_cot(code), "peer refused: %s", reason);
}

/* Refuse the peer: tell it why (the detail in eb), keep rc. */
static cot_err refuse(peer_conn *c, cot_err rc, int64_t deadline, cot_errbuf *eb)
{
	peer_send_error(c, frame_error_from_cot(rc), eb ? eb->msg : "refused", deadline);
	return rc;
}

cot_err hello_exchange(peer_conn *c, const hello_msg *ours, hello_msg *theirs, uint16_t *version,
                       int64_t deadline, cot_errbuf *eb)
{
	frame_writer w;
	frame_header h;
	unsigned char *p = NULL;
	cot_errbuf local;
	if (!eb)
		eb = &local;
	frame_writer_init(&w, 256);
	cot_err rc = hello_encode(ours, &w);
	if (!rc)
		rc = peer_send_frame(c, FRAME_HELLO, 0, w.buf, w.len, deadline, eb);
	frame_writer_free(&w);
	if (rc)
		return rc;

	/* The peer's first frame is its HELLO or an ERROR, both well under the
	 * smallest limit anyone may announce: hold it to that, so a peer that
	 * has not said hello cannot make us allocate more. */
	peer_set_max_payload(c, FRAME_PAYLOAD_MIN_MAX);
	rc = peer_recv_frame(c, &h, &p, deadline, eb);
	if (rc)
		return rc;
	if (h.type == FRAME_ERROR)
		rc = peer_refused(p, h.length, eb);
	else if (h.type != FRAME_HELLO)
		rc = refuse(c,
		            cot_seterr(eb, COT_ERR_INVALID, "expected HELLO from peer, got %s (type %u)",
		                       frame_type_name(h.type), h.type),
		            deadline, eb);
	else if ((rc = hello_decode(p, h.length, theirs, eb)) ||
	         (rc = hello_check(ours, theirs, peer_host_id(c), version, eb)))
		rc = refuse(c, rc, deadline, eb);
	free(p);
	p = NULL;
	if (rc)
		return rc;

	peer_set_send_max(c, theirs->max_payload);
	peer_set_max_payload(c, ours->max_payload);
	rc = peer_send_frame(c, FRAME_READY, 0, NULL, 0, deadline, eb);
	if (rc)
		return rc;
	rc = peer_recv_frame(c, &h, &p, deadline, eb);
	if (rc)
		return rc;
	if (h.type == FRAME_ERROR)
		rc = peer_refused(p, h.length, eb);
	else if (h.type != FRAME_READY || h.length != 0)
		rc = refuse(c,
		            cot_seterr(eb, COT_ERR_INVALID, "expected READY from peer, got %s (type %u)",
		                       frame_type_name(h.type), h.type),
		            deadline, eb);
	free(p);
	return rc;
}
