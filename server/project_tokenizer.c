/* cotrain server: an encoder project's special tokens from its subword
 * tokenizer.  See project_tokenizer.h. */
#include "server/project_tokenizer.h"

#include "kernels/spm_proto.h"

#include <string.h>

static const char *const pieces[PF_SPECIAL_N - 1] = { "[CLS]", "[SEP]", "[MASK]", "[PAD]" };

static int *field(kern_config *m, int i)
{
	int *f[PF_SPECIAL_N] = { &m->cls_id, &m->sep_id, &m->mask_id, &m->pad_id, &m->unk_id };
	return f[i];
}

/* A piece that is special by its type yet ordinary text to masking: the
 * newline, tab and carriage return pieces cotrain's training adds
 * (kernels/spm_shim.cc). */
static bool is_text_control(const spm_proto_piece *pc)
{
	return pc->type == SPM_T_USER && pc->len == 1 &&
	       (pc->piece[0] == '\n' || pc->piece[0] == '\t' || pc->piece[0] == '\r');
}

cot_err ptok_special_ids(pf_project *p, const spm_model *tok, cot_errbuf *eb)
{
	if (p->model.arch == KERN_ARCH_GPT)
		return COT_OK;
	size_t len = 0;
	const unsigned char *bytes = spm_bytes(tok, &len);
	spm_proto pr;
	cot_err rc = spm_proto_parse(bytes, len, &pr, eb);
	if (rc)
		return rc;
	int ids[PF_SPECIAL_N];
	for (int i = 0; i < PF_SPECIAL_N - 1; i++)
		ids[i] = spm_piece_id(tok, pieces[i]);
	ids[PF_SPECIAL_UNK] = -1;
	for (int i = 0; i < pr.n_pieces; i++)
		if (pr.pieces[i].type == SPM_T_UNKNOWN)
			ids[PF_SPECIAL_UNK] = i;

	for (int i = 0; i < PF_SPECIAL_N - 1; i++)
		if (ids[i] < 0) {
			spm_proto_free(&pr);
			cot_seterr(eb, COT_ERR_INVALID,
			           "the tokenizer of dataset \"%s\" has no piece \"%s\", which field "
			           "\"model.%s\" of an encoder needs",
			           p->dataset, pieces[i], pf_special_keys[i]);
			cot_sethint(eb, "Train it again with --special \"[CLS],[SEP],[MASK],[PAD],[UNK]\" "
			                "(cotrain-admin dataset tokenizer train) and import the dataset "
			                "through it.");
			return COT_ERR_INVALID;
		}
	for (int i = 0; i < PF_SPECIAL_N; i++) {
		int given = *field(&p->model, i);
		if ((p->special_given >> i & 1u) && given != ids[i]) {
			spm_proto_free(&pr);
			cot_seterr(eb, COT_ERR_INVALID,
			           "field \"model.%s\" is %d, but the tokenizer of dataset \"%s\" gives %s "
			           "the id %d",
			           pf_special_keys[i], given, p->dataset,
			           i == PF_SPECIAL_UNK ? "its unknown piece" : pieces[i], ids[i]);
			cot_sethint(eb,
			            "Leave \"model.%s\" out: a subword encoder takes it from the "
			            "tokenizer.",
			            pf_special_keys[i]);
			return COT_ERR_INVALID;
		}
	}
	for (int i = 0; i < pr.n_pieces; i++) {
		const spm_proto_piece *pc = &pr.pieces[i];
		bool known = false;
		for (int k = 0; k < PF_SPECIAL_N; k++)
			known |= ids[k] == i;
		if (known || pc->type == SPM_T_NORMAL || pc->type == SPM_T_UNUSED || pc->type == SPM_T_BYTE ||
		    is_text_control(pc))
			continue;
		int n = pc->len > 32 ? 32 : (int)pc->len;
		cot_seterr(eb, COT_ERR_INVALID,
		           "the tokenizer of dataset \"%s\" has the special piece \"%.*s\" (id %d), which an "
		           "encoder cannot use",
		           p->dataset, n, pc->piece, i);
		cot_sethint(eb, "Masking knows only [CLS], [SEP], [MASK], [PAD] and the unknown piece; "
		                "train the tokenizer with --special \"[CLS],[SEP],[MASK],[PAD],[UNK]\".");
		spm_proto_free(&pr);
		return COT_ERR_INVALID;
	}
	spm_proto_free(&pr);
	kern_config m = p->model;
	for (int i = 0; i < PF_SPECIAL_N; i++)
		*field(&m, i) = ids[i];
	cot_errbuf d = { "", "" };
	if (kern_config_validate(&m, &d)) {
		cot_seterr(eb, COT_ERR_INVALID,
		           "the special pieces of the tokenizer of dataset \"%s\" do "
		           "not fit field \"model\"",
		           p->dataset);
		cot_sethint(eb, "The %s.", d.msg);
		return COT_ERR_INVALID;
	}
	p->model = m;
	return COT_OK;
}
