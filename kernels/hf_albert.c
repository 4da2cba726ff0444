/* cotrain kernels: the encoders in Hugging Face's layout (hf_albert.h). */
#include "kernels/hf_albert.h"

#include "kernels/encoder.h"
#include "kernels/hf_gpt2.h"
#include "kernels/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tensors being written: names and shapes, and a scratch buffer for the
 * transposed weights (st_writer borrows the data until it writes). */
typedef struct {
	const kern_model *m;
	st_writer *w;
	float *scratch; /* n_params floats: every transposed weight fits */
	size_t used;
	cot_errbuf *eb;
	cot_err rc;
} export_ctx;

static const kern_view *view(const kern_model *m, const char *name)
{
	for (int i = 0; i < m->n_views; i++)
		if (strcmp(m->views[i].name, name) == 0)
			return &m->views[i];
	return NULL;
}

/* Add a tensor of ndim (1 or 2) dims d0 [x d1] at data. */
static void add(export_ctx *x, const char *name, const float *data, int ndim, int d0, int d1)
{
	if (x->rc)
		return;
	int64_t shape[2] = { d0, d1 };
	x->rc = st_writer_add(x->w, name, ST_F32, ndim, shape, data, x->eb);
}

/* Add view vname as is. */
static void add_same(export_ctx *x, const char *name, const char *vname)
{
	const kern_view *v = view(x->m, vname);
	if (!v) {
		if (!x->rc)
			x->rc = cot_seterr(x->eb, COT_ERR_INTERNAL, "the model has no tensor %s", vname);
		return;
	}
	add(x, name, x->m->params + v->offset, v->ndim, v->shape[0], v->shape[1]);
}

/* Add columns [c0, c0 + n) of the [K, N] weight at w, transposed to
 * [n, K] (torch.nn.Linear's [out, in]). */
static void add_t(export_ctx *x, const char *name, const float *w, int K, int N, int c0, int n)
{
	float *t = x->scratch + x->used;
	x->used += (size_t)n * K;
	for (int j = 0; j < n; j++)
		for (int k = 0; k < K; k++)
			t[(size_t)j * K + k] = w[(size_t)k * N + c0 + j];
	add(x, name, t, 2, n, K);
}

/* A linear layer: view "<vname>.weight" [K, N] transposed and
 * "<vname>.bias" [N], as "<name>.weight" and "<name>.bias"; with thirds,
 * only columns [c0, c0 + n) of each. */
static void add_linear(export_ctx *x, const char *name, const char *vname, int c0, int n)
{
	char vn[64], nm[ST_NAME_MAX + 1];
	snprintf(vn, sizeof vn, "%s.weight", vname);
	const kern_view *w = view(x->m, vn);
	snprintf(vn, sizeof vn, "%s.bias", vname);
	const kern_view *b = view(x->m, vn);
	if (!w || !b) {
		if (!x->rc)
			x->rc = cot_seterr(x->eb, COT_ERR_INTERNAL, "the model has no linear layer %s",
			                   vname);
		return;
	}
	if (n == 0)
		n = w->shape[1];
	snprintf(nm, sizeof nm, "%s.weight", name);
	add_t(x, nm, x->m->params + w->offset, w->shape[0], w->shape[1], c0, n);
	snprintf(nm, sizeof nm, "%s.bias", name);
	add(x, nm, x->m->params + b->offset + c0, 1, n, 0);
}

/* A LayerNorm: "<vname>.weight|bias" as "<name>.weight|bias". */
static void add_ln(export_ctx *x, const char *name, const char *vname)
{
	char vn[64], nm[ST_NAME_MAX + 1];
	snprintf(vn, sizeof vn, "%s.weight", vname);
	snprintf(nm, sizeof nm, "%s.weight", name);
	add_same(x, nm, vn);
	snprintf(vn, sizeof vn, "%s.bias", vname);
	snprintf(nm, sizeof nm, "%s.bias", name);
	add_same(x, nm, vn);
}

/* One block's tensors from set s under prefix p, in ALBERT's or BERT's
 * names. */
static void add_block(export_ctx *x, int albert, const char *p, int s)
{
	static const char *const albert_names[] = { "attention.query",     "attention.key",
		                                    "attention.value",     "attention.dense",
		                                    "attention.LayerNorm", "ffn",
		                                    "ffn_output",          "full_layer_layer_norm" };
	static const char *const bert_names[] = { "attention.self.query",
		                                  "attention.self.key",
		                                  "attention.self.value",
		                                  "attention.output.dense",
		                                  "attention.output.LayerNorm",
		                                  "intermediate.dense",
		                                  "output.dense",
		                                  "output.LayerNorm" };
	const char *const *n = albert ? albert_names : bert_names;
	int H = x->m->config.d_model;
	char nm[ST_NAME_MAX + 1], vn[64];
	for (int third = 0; third < 3; third++) {
		snprintf(nm, sizeof nm, "%s.%s", p, n[third]);
		snprintf(vn, sizeof vn, "layer.%d.attn.qkv", s);
		add_linear(x, nm, vn, third * H, H);
	}
	static const char *const rest[5] = { "attn.out", "attn.ln", "ffn", "ffn_out", "ln" };
	for (int i = 0; i < 5; i++) {
		snprintf(nm, sizeof nm, "%s.%s", p, n[3 + i]);
		snprintf(vn, sizeof vn, "layer.%d.%s", s, rest[i]);
		if (i == 1 || i == 4)
			add_ln(x, nm, vn);
		else
			add_linear(x, nm, vn, 0, 0);
	}
	if (x->m->config.position != KERN_POS_ABSOLUTE) { /* the distance embedding, as it is */
		snprintf(nm, sizeof nm, "%s.%s.distance_embedding.weight", p,
		         albert ? "attention" : "attention.self");
		snprintf(vn, sizeof vn, "layer.%d.attn.distance.weight", s);
		add_same(x, nm, vn);
	}
}

static json_t *config_json(const kern_config *c)
{
	int albert = c->arch == KERN_ARCH_ALBERT;
	json_t *j =
	        json_pack("{s:s, s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:i, s:i, s:f, s:f, "
	                  "s:s, s:i, s:i, "
	                  "s:i, s:s, s:i, s:i, s:i, s:i}",
	                  "model_type", albert ? "albert" : "bert", "architectures",
	                  albert ? "AlbertForPreTraining" : "BertForPreTraining", "vocab_size", c->vocab,
	                  "hidden_size", c->d_model, "num_hidden_layers", c->n_layer, "num_attention_heads",
	                  c->n_head, "intermediate_size", c->d_ff, "max_position_embeddings", c->seq_len,
	                  "hidden_act", albert ? "gelu_new" : "gelu", "hidden_dropout_prob", 0.0,
	                  "attention_probs_dropout_prob", 0.0, "type_vocab_size", c->type_vocab,
	                  "pad_token_id", c->pad_id, "initializer_range", 0.02, "layer_norm_eps", 1e-12,
	                  "position_embedding_type",
	                  kern_position_name(c->position) ? kern_position_name(c->position) : "absolute",
	                  "cotrain_cls_token_id", c->cls_id, "cotrain_sep_token_id", c->sep_id,
	                  "cotrain_mask_token_id", c->mask_id, "torch_dtype", "float32", "cotrain_n_shared",
	                  c->n_shared, "cotrain_d_embed", c->d_embed, "bos_token_id", c->cls_id,
	                  "eos_token_id", c->sep_id);
	if (j && albert) {
		json_object_set_new(j, "embedding_size", json_integer(c->d_embed));
		json_object_set_new(j, "num_hidden_groups", json_integer(c->n_shared));
		json_object_set_new(j, "inner_group_num", json_integer(1));
		json_object_set_new(j, "classifier_dropout_prob", json_real(0.0));
	}
	return j;
}

cot_err hf_encoder_write(const kern_model *m, const char *dir, cot_errbuf *eb)
{
	const kern_config *c = &m->config;
	if (c->arch != KERN_ARCH_ALBERT && c->arch != KERN_ARCH_BERT)
		return cot_seterr(eb, COT_ERR_INVALID, "cannot write a %s model as an encoder",
		                  kern_arch_name(c->arch) ? kern_arch_name(c->arch) : "unknown");
	int albert = c->arch == KERN_ARCH_ALBERT;
	const char *base = albert ? "albert" : "bert";
	export_ctx x = { m, NULL, NULL, 0, eb, COT_OK };
	x.scratch = malloc(m->n_params * sizeof(float));
	if (!x.scratch)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory for the export");
	x.rc = st_writer_new(&x.w, eb);
	if (!x.rc)
		x.rc = st_writer_meta(x.w, "format", "pt", eb);
	char nm[ST_NAME_MAX + 1];
	static const char *const emb[3][2] = { { "word_embeddings", "emb.word" },
		                               { "position_embeddings", "emb.position" },
		                               { "token_type_embeddings", "emb.token_type" } };
	for (int i = 0; i < 3; i++) {
		snprintf(nm, sizeof nm, "%s.embeddings.%s.weight", base, emb[i][0]);
		add_same(&x, nm, emb[i][1]);
	}
	snprintf(nm, sizeof nm, "%s.embeddings.LayerNorm", base);
	add_ln(&x, nm, "emb.ln");
	if (albert) {
		add_linear(&x, "albert.encoder.embedding_hidden_mapping_in", "emb.proj", 0, 0);
		for (int s = 0; s < c->n_shared; s++) {
			snprintf(nm, sizeof nm, "albert.encoder.albert_layer_groups.%d.albert_layers.0", s);
			add_block(&x, 1, nm, s);
		}
		add_linear(&x, "albert.pooler", "pooler", 0, 0);
		add_linear(&x, "sop_classifier.classifier", "sop", 0, 0);
		add_linear(&x, "predictions.dense", "mlm.dense", 0, 0);
		add_ln(&x, "predictions.LayerNorm", "mlm.ln");
		add_same(&x, "predictions.bias", "mlm.bias");
		add_same(&x, "predictions.decoder.bias", "mlm.bias");
		add_same(&x, "predictions.decoder.weight", "emb.word");
	} else {
		for (int l = 0; l < c->n_layer; l++) {
			snprintf(nm, sizeof nm, "bert.encoder.layer.%d", l);
			add_block(&x, 0, nm, kern_layer_set(c, l));
		}
		add_linear(&x, "bert.pooler.dense", "pooler", 0, 0);
		add_linear(&x, "cls.seq_relationship", "sop", 0, 0);
		add_linear(&x, "cls.predictions.transform.dense", "mlm.dense", 0, 0);
		add_ln(&x, "cls.predictions.transform.LayerNorm", "mlm.ln");
		add_same(&x, "cls.predictions.bias", "mlm.bias");
		add_same(&x, "cls.predictions.decoder.bias", "mlm.bias");
		add_same(&x, "cls.predictions.decoder.weight", "emb.word");
	}
	char path[4096];
	if (!x.rc && snprintf(path, sizeof path, "%s/" HF_WEIGHTS_FILE, dir) >= (int)sizeof path)
		x.rc = cot_seterr(eb, COT_ERR_INVALID, "folder name \"%s\" is too long", dir);
	if (!x.rc)
		x.rc = st_writer_write(x.w, path, eb);
	st_writer_free(x.w);
	free(x.scratch);
	if (!x.rc)
		x.rc = hf_write_json(dir, HF_CONFIG_FILE, config_json(c), eb);
	if (!x.rc)
		x.rc = hf_sync_dir(dir, eb);
	return x.rc;
}
