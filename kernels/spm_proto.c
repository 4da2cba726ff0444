/* cotrain kernels: reading a SentencePiece model's settings from its bytes
 * (see spm_proto.h). */
#include "kernels/spm_proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
	const unsigned char *p, *end;
} reader;

static bool varint(reader *r, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (r->p >= r->end)
			return false;
		unsigned char c = *r->p++;
		*v |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80))
			return true;
	}
	return false;
}

/* The next field: its number, wire type, and for a length-delimited field
 * its bytes (*sub), for a varint its value (*v), for a fixed32 its bits. */
static bool field(reader *r, uint32_t *num, int *wt, reader *sub, uint64_t *v)
{
	uint64_t key;
	if (!varint(r, &key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX)
		return false;
	*num = (uint32_t)(key >> 3);
	*wt = (int)(key & 7);
	switch (*wt) {
	case 0:
		return varint(r, v);
	case 1:
		if (r->end - r->p < 8)
			return false;
		r->p += 8;
		return true;
	case 2: {
		uint64_t n;
		if (!varint(r, &n) || n > (uint64_t)(r->end - r->p))
			return false;
		sub->p = r->p;
		sub->end = r->p + n;
		r->p += n;
		return true;
	}
	case 5:
		if (r->end - r->p < 4)
			return false;
		*v = (uint64_t)r->p[0] | (uint64_t)r->p[1] << 8 | (uint64_t)r->p[2] << 16 |
		     (uint64_t)r->p[3] << 24;
		r->p += 4;
		return true;
	default:
		return false;
	}
}

static bool piece(reader r, spm_proto_piece *out)
{
	out->type = SPM_T_NORMAL;
	uint32_t num;
	int wt;
	reader sub;
	uint64_t v;
	while (r.p < r.end) {
		if (!field(&r, &num, &wt, &sub, &v))
			return false;
		if (num == 1 && wt == 2) {
			out->piece = (const char *)sub.p;
			out->len = (size_t)(sub.end - sub.p);
		} else if (num == 2 && wt == 5) {
			uint32_t bits = (uint32_t)v;
			memcpy(&out->score, &bits, sizeof bits);
		} else if (num == 3 && wt == 0) {
			out->type = (int)v;
		}
	}
	return out->piece != NULL;
}

static bool trainer(reader r, spm_proto *out)
{
	uint32_t num;
	int wt;
	reader sub;
	uint64_t v;
	while (r.p < r.end) {
		if (!field(&r, &num, &wt, &sub, &v))
			return false;
		if (wt != 0)
			continue;
		if (num == 3)
			out->model_type = (int)v;
		else if (num == 35)
			out->byte_fallback = v != 0;
		else if (num == 40)
			out->unk_id = (int)(int32_t)v;
	}
	return true;
}

static bool normalizer(reader r, spm_proto *out)
{
	uint32_t num;
	int wt;
	reader sub;
	uint64_t v;
	while (r.p < r.end) {
		if (!field(&r, &num, &wt, &sub, &v))
			return false;
		if (num == 1 && wt == 2) {
			out->norm_name = (const char *)sub.p;
			out->norm_name_len = (size_t)(sub.end - sub.p);
		} else if (num == 2 && wt == 2) {
			out->charsmap = sub.p;
			out->charsmap_len = (size_t)(sub.end - sub.p);
		} else if (num == 3 && wt == 0) {
			out->add_dummy_prefix = v != 0;
		} else if (num == 4 && wt == 0) {
			out->remove_extra_whitespaces = v != 0;
		} else if (num == 5 && wt == 0) {
			out->escape_whitespaces = v != 0;
		}
	}
	return true;
}

cot_err spm_proto_parse(const unsigned char *b, size_t len, spm_proto *out, cot_errbuf *eb)
{
	memset(out, 0, sizeof *out);
	/* proto2 defaults of the fields read */
	out->model_type = SPM_M_UNIGRAM;
	out->add_dummy_prefix = out->remove_extra_whitespaces = out->escape_whitespaces = true;
	reader r = { b, b + len };
	uint32_t num;
	int wt;
	reader sub;
	uint64_t v;
	size_t cap = 0;
	bool have_trainer = false, have_normalizer = false;
	while (r.p < r.end) {
		if (!field(&r, &num, &wt, &sub, &v))
			goto corrupt;
		if (num == 1 && wt == 2) {
			if ((size_t)out->n_pieces == cap) {
				if (cap >= (1u << 24))
					goto corrupt;
				cap = cap ? 2 * cap : 1024;
				spm_proto_piece *p = realloc(out->pieces, cap * sizeof *p);
				if (!p) {
					spm_proto_free(out);
					return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
				}
				out->pieces = p;
			}
			spm_proto_piece *pc = &out->pieces[out->n_pieces];
			memset(pc, 0, sizeof *pc);
			if (!piece(sub, pc))
				goto corrupt;
			out->n_pieces++;
		} else if (num == 2 && wt == 2) {
			if (!trainer(sub, out))
				goto corrupt;
			have_trainer = true;
		} else if (num == 3 && wt == 2) {
			if (!normalizer(sub, out))
				goto corrupt;
			have_normalizer = true;
		}
	}
	/* Every model SentencePiece writes has pieces, then its trainer and
	 * normalizer specs: a file cut short ends among the pieces, which a
	 * field-by-field read alone would take for a smaller model. */
	if (out->n_pieces == 0 || !have_trainer || !have_normalizer)
		goto corrupt;
	return COT_OK;
corrupt:
	spm_proto_free(out);
	return cot_seterr(eb, COT_ERR_CORRUPT, "tokenizer model is not a well-formed SentencePiece model");
}

void spm_proto_free(spm_proto *p)
{
	free(p->pieces);
	memset(p, 0, sizeof *p);
}
