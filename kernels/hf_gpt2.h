/* cotrain kernels: the model in Hugging Face's GPT-2 layout.
 *
 * cotrain's model is GPT-2 (doc/model.md): pre-LN blocks, tanh GELU
 * ("gelu_new"), LayerNorm eps 1e-5, [in, out] (Conv1D) weights, q|k|v in
 * the columns of c_attn with head h on channels [h*hd, (h+1)*hd) of each,
 * scores scaled by 1/sqrt(hd), a head tied to wte without bias.  So the
 * export renames, and nothing else:
 *
 *   cotrain view          GPT-2 tensor
 *   wte                   wte.weight
 *   wpe                   wpe.weight
 *   h.<set>.<rest>        h.<layer>.<rest>, for every layer using the set
 *   ln_f.weight, .bias    ln_f.weight, ln_f.bias
 *
 * An exported folder holds config.json (GPT2Config keys, plus
 * "cotrain_n_shared"), model.safetensors (F32, metadata {"format": "pt"},
 * the parameters only), tokenizer.json and tokenizer_config.json (a byte
 * tokenizer: token = byte, in Hugging Face tokenizers' ByteLevel form) and
 * whatever the caller adds (cotrain-admin adds README.md).
 * GPT2LMHeadModel.from_pretrained(folder) loads it. */
#ifndef KERN_HF_GPT2_H
#define KERN_HF_GPT2_H

#include "kernels/model.h"
#include "shared/common/error.h"

#include <jansson.h>

#define HF_CONFIG_FILE "config.json"
#define HF_WEIGHTS_FILE "model.safetensors"
#define HF_CONFIG_MAX (1u << 20) /* bytes of config.json we read */
#define HF_EOS_TOKEN 10          /* bos and eos: "\n", the byte between documents */

/* Write config.json, model.safetensors, tokenizer.json and
 * tokenizer_config.json of m (its parameters; step and moments are not
 * exported) into the existing folder dir, each file written to a temporary
 * name, fsynced and renamed, then the folder fsynced.  m is not changed.
 * COT_ERR_IO (the detail names the file), COT_ERR_NOMEM; files written
 * before an error stay: write into a fresh folder and rename it into place
 * when the whole export must appear at once. */
cot_err hf_write(const kern_model *m, const char *dir, cot_errbuf *eb);
/* (An encoder, arch albert or bert, is written by hf_encoder_write,
 * kernels/hf_albert.h, which hf_write calls for it.) */

/* Write len bytes to dir/name through a temporary file in dir: write,
 * fsync, rename (the folder itself is not fsynced).  COT_ERR_IO naming the
 * file, COT_ERR_INVALID for a path over 4095 bytes. */
cot_err hf_write_file(const char *dir, const char *name, const void *buf, size_t len, cot_errbuf *eb);

/* json_dumps of obj (stolen; NULL is out of memory), indented, with a final
 * newline, into dir/name as hf_write_file. */
cot_err hf_write_json(const char *dir, const char *name, json_t *obj, cot_errbuf *eb);

/* fsync the folder dir.  COT_ERR_IO. */
cot_err hf_sync_dir(const char *dir, cot_errbuf *eb);

/* Read a folder in this layout (ours, or a GPT-2 saved by transformers,
 * whose names may carry the "transformer." prefix) into a new model made
 * for batches of up to max_batch samples; step and moments are zero.
 * Trusts nothing: the config must be a GPT-2 this model computes exactly
 * (gelu_new, eps 1e-5, tied head, no attention variants), every tensor
 * present, F32, of its shape and finite; layers that share a parameter set
 * ("cotrain_n_shared") must hold equal tensors, and an lm_head.weight must
 * equal wte.weight.  On success the caller owns *out; on error it is NULL.
 * COT_ERR_NOT_FOUND, COT_ERR_IO, COT_ERR_CORRUPT, COT_ERR_UNSUPPORTED, and
 * the errors of kern_model_create. */
cot_err hf_load_new(const char *dir, int max_batch, kern_model **out, cot_errbuf *eb);

/* A model from path: an exported folder (hf_load_new) when path is a
 * folder, else a checkpoint file (ckpt_load_new).  As those. */
cot_err hf_or_ckpt_load_new(const char *path, int max_batch, kern_model **out, cot_errbuf *eb);

#endif
