/* cotrain server: an encoder project's special tokens from its subword
 * tokenizer.
 *
 * A project with "tokenizer": "dataset" trains on the ids of the dataset's
 * SentencePiece model, so its encoder's [CLS], [SEP], [MASK], [PAD] and
 * unknown piece are that model's pieces, not the last four ids of the
 * vocabulary that a project file defaults to.  cotrain-admin project create
 * settles them here, before the normalized config (which every client,
 * replay and spot check reads) is written. */
#ifndef SERVER_PROJECT_TOKENIZER_H
#define SERVER_PROJECT_TOKENIZER_H

#include "kernels/spm.h"
#include "server/project_file.h"

/* Give p's encoder model the ids of tok's pieces "[CLS]", "[SEP]", "[MASK]",
 * "[PAD]" and its unknown piece: the ids the file does not give
 * (p->special_given) are set, those it gives must agree.  The tokenizer may
 * hold no other special piece (control, unknown or user-defined, newline,
 * tab and carriage return aside), since masking knows only these five and
 * must never pick one.  A GPT is left as it is.  COT_ERR_INVALID (p
 * unchanged) naming the missing piece, the disagreeing field or the extra
 * special piece; COT_ERR_CORRUPT for model bytes spm_proto cannot read;
 * COT_ERR_NOMEM. */
cot_err ptok_special_ids(pf_project *p, const spm_model *tok, cot_errbuf *eb);

#endif
