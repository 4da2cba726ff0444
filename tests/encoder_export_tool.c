/* cotrain tests: the encoder side of tests/test_encoder_export.sh.
 *
 *   encoder_export_tool albert|bert[:POSITION] DIR DATA
 * builds a small encoder of that arch (and position, kern_position_name's
 * names; absolute when not given) from a fixed seed, moves every
 * parameter off its initial value (so that a swapped bias or LayerNorm
 * shows), saves it as a checkpoint DIR.ckpt and reads it back (it must be
 * bit-identical, config included), exports it to the existing folder DIR
 * (hf_write, which hands encoders to hf_encoder_write), and writes to DATA
 * a batch and cotrain's MLM logits at every position for it:
 *   int32 B, T, V, int32 ids[B*T], int32 segments[B*T], float32 logits[B*T*V]
 *
 *   encoder_export_tool logits CKPT DATA
 * writes DATA the same way for the encoder checkpoint CKPT (a project's
 * stored version, for the cotrain-admin export in test_model_export.sh).
 * Exit status 0 on success, 1 with a message on stderr otherwise. */
#include "kernels/checkpoint.h"
#include "kernels/encoder.h"
#include "kernels/hf_gpt2.h"
#include "kernels/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const char *msg)
{
	fprintf(stderr, "encoder_export_tool: %s: %s\n", what, msg);
	return 1;
}

/* A batch of B samples (random ordinary ids of the vocabulary, a [SEP] at 9 and
 * at the end, [MASK] at 3 and 15, segments 0 then 1 from position 10) and
 * m's MLM logits for it into the file path (the DATA layout above). */
static int write_data(kern_model *m, int B, kern_rng *r, const char *path)
{
	const kern_config *c = &m->config;
	int T = c->seq_len, V = c->vocab;
	cot_errbuf eb;
	if (T < 16)
		return fail(path, "the model's seq_len is below 16");
	int32_t *ids = calloc((size_t)B * T, 4), *seg = calloc((size_t)B * T, 4);
	if (!ids || !seg)
		return fail(path, "out of memory");
	for (int i = 0; i < B * T; i++) {
		int32_t t;
		do
			t = (int32_t)(kern_rng_next(r) % (uint64_t)V);
		while (t == c->cls_id || t == c->sep_id || t == c->mask_id || t == c->pad_id ||
		       t == c->unk_id);
		ids[i] = t;
		seg[i] = i % T >= 10;
	}
	for (int b = 0; b < B; b++) {
		ids[b * T] = c->cls_id;
		ids[b * T + 9] = ids[b * T + T - 1] = c->sep_id;
		ids[b * T + 3] = ids[b * T + 15] = c->mask_id;
	}
	kern_enc_batch batch = { ids, seg, NULL, NULL, NULL };
	if (kern_enc_forward(m, &batch, B, NULL, &eb))
		return fail("forward", eb.msg);
	int rows;
	const float *lg = kern_enc_mlm_logits(m, &rows, NULL);
	FILE *f = fopen(path, "wb");
	int32_t hdr[3] = { B, T, V };
	int bad = !f || fwrite(hdr, 4, 3, f) != 3 || fwrite(ids, 4, (size_t)B * T, f) != (size_t)B * T ||
	          fwrite(seg, 4, (size_t)B * T, f) != (size_t)B * T ||
	          fwrite(lg, 4, (size_t)rows * V, f) != (size_t)rows * V;
	if (f && fclose(f) != 0)
		bad = 1;
	free(ids);
	free(seg);
	return bad ? fail(path, "could not write") : 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "logits") == 0) {
		kern_model *m;
		cot_errbuf eb;
		kern_rng r;
		kern_rng_seed(&r, 5);
		if (ckpt_load_new(argv[2], 2, &m, &eb))
			return fail(argv[2], eb.msg);
		int rc = m->config.arch == KERN_ARCH_GPT ? fail(argv[2], "not an encoder")
		                                         : write_data(m, 2, &r, argv[3]);
		kern_model_free(m);
		return rc;
	}
	char an[16];
	const char *colon = argc == 4 ? strchr(argv[1], ':') : NULL;
	snprintf(an, sizeof an, "%.*s", colon ? (int)(colon - argv[1]) : 15, argc == 4 ? argv[1] : "");
	int arch = kern_arch_parse(an), position = colon ? kern_position_parse(colon + 1) : 0;
	if (argc != 4 || arch < KERN_ARCH_ALBERT || position < 0)
		return fail("usage", "encoder_export_tool albert|bert[:POSITION] DIR DATA");
	kern_config c = { .n_layer = 4,
		          .n_shared = arch == KERN_ARCH_ALBERT ? 2 : 4,
		          .n_head = 4,
		          .d_model = 32,
		          .seq_len = 24,
		          .vocab = 100,
		          .d_ff = 64,
		          .arch = arch,
		          .d_embed = arch == KERN_ARCH_ALBERT ? 16 : 32,
		          .type_vocab = 2,
		          .cls_id = 96,
		          .sep_id = 97,
		          .mask_id = 98,
		          .pad_id = 99,
		          .unk_id = -1,
		          .position = position };
	enum { B = 3 };
	kern_model *m, *back;
	cot_errbuf eb;
	if (kern_model_create(&c, B, &m, &eb))
		return fail("kern_model_create", eb.msg);
	kern_model_init(m, 2024);
	kern_rng r;
	kern_rng_seed(&r, 5);
	for (size_t i = 0; i < m->n_params; i++)
		m->params[i] += (float)(0.1 * kern_rng_normal(&r));
	char ck[4096];
	snprintf(ck, sizeof ck, "%s.ckpt", argv[2]);
	if (ckpt_save(m, ck, &eb) || ckpt_load_new(ck, 0, &back, &eb))
		return fail(ck, eb.msg);
	int same = !memcmp(&back->config, &m->config, sizeof c) && back->n_params == m->n_params &&
	           !memcmp(back->params, m->params, m->n_params * sizeof(float));
	kern_model_free(back);
	if (!same)
		return fail(ck, "the checkpoint does not read back to the model");
	if (hf_write(m, argv[2], &eb))
		return fail(argv[2], eb.msg);
	if (write_data(m, B, &r, argv[3]))
		return 1;
	kern_model_free(m);
	return 0;
}
