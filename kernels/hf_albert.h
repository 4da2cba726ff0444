/* cotrain kernels: the encoders in Hugging Face's layout,
 * AlbertForPreTraining (arch albert) and BertForPreTraining (arch bert).
 *
 * cotrain's encoder computes those models exactly (kernels/encoder.h); the
 * export renames, transposes the linear weights (cotrain [in, out],
 * torch.nn.Linear [out, in]) and splits the fused q|k|v columns:
 *
 *   cotrain view            ALBERT tensor (BERT tensor)
 *   emb.word                albert.embeddings.word_embeddings.weight
 *                           (bert.embeddings.word_embeddings.weight), also
 *                           predictions.decoder.weight (cls.predictions.decoder.weight)
 *   emb.position            ...embeddings.position_embeddings.weight
 *   emb.token_type          ...embeddings.token_type_embeddings.weight
 *   emb.ln.{weight,bias}    ...embeddings.LayerNorm.{weight,bias}
 *   emb.proj.*  (ALBERT)    albert.encoder.embedding_hidden_mapping_in.*   ^T
 *   layer.s.attn.qkv.*      G.attention.{query,key,value}.*  ^T, thirds
 *                           (B.attention.self.{query,key,value}.*)
 *   layer.s.attn.out.*      G.attention.dense.*  ^T  (B.attention.output.dense.*)
 *   layer.s.attn.ln.*       G.attention.LayerNorm.*  (B.attention.output.LayerNorm.*)
 *   layer.s.ffn.*           G.ffn.*  ^T  (B.intermediate.dense.*)
 *   layer.s.ffn_out.*       G.ffn_output.*  ^T  (B.output.dense.*)
 *   layer.s.ln.*            G.full_layer_layer_norm.*  (B.output.LayerNorm.*)
 *   pooler.*                albert.pooler.*  ^T  (bert.pooler.dense.*)
 *   sop.*                   sop_classifier.classifier.*  ^T  (cls.seq_relationship.*)
 *   mlm.dense.*             predictions.dense.*  ^T  (cls.predictions.transform.dense.*)
 *   mlm.ln.*                predictions.LayerNorm.*  (cls.predictions.transform.LayerNorm.*)
 *   mlm.bias                predictions.bias and predictions.decoder.bias
 *                           (cls.predictions.bias, cls.predictions.decoder.bias)
 * with G = albert.encoder.albert_layer_groups.s.albert_layers.0 (one group
 * per parameter set, num_hidden_groups = n_shared, inner_group_num 1) and
 * B = bert.encoder.layer.l for every layer l (BERT has no sharing); ^T
 * marks a transposed weight.  BERT's NSP head takes cotrain's SOP labels
 * (0 in order, 1 swapped) in the same two-way shape. */
#ifndef KERN_HF_ALBERT_H
#define KERN_HF_ALBERT_H

#include "kernels/model.h"
#include "shared/common/error.h"

/* Write config.json (AlbertConfig or BertConfig keys: hidden_act gelu_new
 * or gelu, layer_norm_eps 1e-12, no dropout, the special token ids, and
 * cotrain_* keys for what the config has no key for) and model.safetensors
 * (F32, metadata {"format": "pt"}) of the encoder m into the existing
 * folder dir, each through a temporary file, then fsync the folder.  The
 * tokenizer files are not written here.  COT_ERR_INVALID for a GPT model,
 * COT_ERR_IO, COT_ERR_NOMEM. */
cot_err hf_encoder_write(const kern_model *m, const char *dir, cot_errbuf *eb);

#endif
