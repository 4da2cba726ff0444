/* cotrain kernels: the model's shape as JSON, in one place.
 *
 * The "model" object of a project config ({"n_layer", "n_shared",
 * "n_head", "d_model", "d_ff", "seq_len", "vocab"}, and for an encoder
 * "arch" ("albert" or "bert"), "d_embed", "type_vocab", "cls_id",
 * "sep_id", "mask_id", "pad_id", "unk_id" (-1: none), and "position"
 * ("absolute", absent when it is, "relative_key" or "relative_key_query");
 * doc/project-file.md) is
 * written by the server's project files and read by the round coordinator,
 * the client's API calls and the client's state file; all of them go
 * through these two functions, as the optimizer settings go through
 * opt_json.h. */
#ifndef KERN_MODEL_JSON_H
#define KERN_MODEL_JSON_H

#include <jansson.h>

#include "kernels/model.h"
#include "shared/common/error.h"

/* The keys of the object, NULL-terminated, in the order they are written. */
extern const char *const kern_model_json_keys[];

enum {
	/* n_shared, d_ff and vocab may be absent: then n_layer, 4 * d_model
	 * and 256 (a project file's defaults); for an encoder vocab 260 and
	 * the encoder fields as encoder_fields in model_json.c says (d_embed
	 * min(128, d_model) for ALBERT, type_vocab 2, special ids the last
	 * four of the vocabulary). */
	KERN_MODEL_JSON_DEFAULTS = 1 << 0,
	/* The client's own saved copy (its state file): every GPT key
	 * present (and every encoder key when arch is an encoder), each
	 * 0..2^20 (0: not known yet), no check across fields; the shape is
	 * checked again before anything computes with it. */
	KERN_MODEL_JSON_STORED = 1 << 1,
};

/* The object {"n_layer": ..., "vocab": ...} of c, keys in
 * kern_model_json_keys' order, the encoder keys only for an encoder (a
 * GPT's object is as before they existed); a new reference, NULL when out
 * of memory. */
json_t *kern_model_config_to_json(const kern_config *c);

/* Read model (an object; path names it in messages, as "model") into *c.
 * Each field must be an integer in its range (1..KERN_MAX_LAYERS layers and
 * sets, 1..256 heads, 1..KERN_MAX_DIM d_model and d_ff, 2..KERN_MAX_SEQ seq_len,
 * 2..KERN_MAX_VOCAB vocab), n_shared at most n_layer, d_model a multiple of
 * n_head; an encoder's config valid as a whole (kern_config_validate), a
 * GPT's without encoder keys ("arch": "gpt" aside).  Keys not in the list
 * are left to the caller.  COT_ERR_INVALID
 * with a message naming the field ("field \"model.n_head\" must be an
 * integer between 1 and 256", hint "It is 0."); *c is then unchanged. */
cot_err kern_model_config_from_json(const json_t *model, const char *path, unsigned flags, kern_config *c,
                                    cot_errbuf *eb);

#endif
