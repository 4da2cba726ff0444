/* cotrain tests: the encoder side of tests/test_encoder_export.sh.
 *
 *   encoder_export_tool albert|bert DIR DATA
 * builds a small encoder of that arch from a fixed seed, moves every
 * parameter off its initial value (so that a swapped bias or LayerNorm
 * shows), saves it as a checkpoint DIR.ckpt and reads it back (it must be
 * bit-identical, config included), exports it to the existing folder DIR
 * (hf_write, which hands encoders to hf_encoder_write), and writes to DATA
 * a batch and cotrain's MLM logits at every position for it:
 *   int32 B, T, V, int32 ids[B*T], int32 segments[B*T], float32 logits[B*T*V]
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

int main(int argc, char **argv)
{
	if (argc != 4 || kern_arch_parse(argv[1]) < KERN_ARCH_ALBERT)
		return fail("usage", "encoder_export_tool albert|bert DIR DATA");
	int arch = kern_arch_parse(argv[1]);
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
		          .pad_id = 99 };
	enum { B = 3 };
	int T = c.seq_len, V = c.vocab;
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
	int32_t ids[B * 24], seg[B * 24];
	for (int i = 0; i < B * T; i++) {
		ids[i] = (int32_t)(kern_rng_next(&r) % 96);
		seg[i] = i % T >= 10;
	}
	for (int b = 0; b < B; b++) {
		ids[b * T] = c.cls_id;
		ids[b * T + 9] = ids[b * T + T - 1] = c.sep_id;
		ids[b * T + 3] = ids[b * T + 15] = c.mask_id;
	}
	kern_enc_batch batch = { ids, seg, NULL, NULL, NULL };
	if (kern_enc_forward(m, &batch, B, NULL, &eb))
		return fail("forward", eb.msg);
	int rows;
	const float *lg = kern_enc_mlm_logits(m, &rows, NULL);
	FILE *f = fopen(argv[3], "wb");
	int32_t hdr[3] = { B, T, V };
	if (!f || fwrite(hdr, 4, 3, f) != 3 || fwrite(ids, 4, (size_t)B * T, f) != (size_t)B * T ||
	    fwrite(seg, 4, (size_t)B * T, f) != (size_t)B * T ||
	    fwrite(lg, 4, (size_t)rows * V, f) != (size_t)rows * V || fclose(f) != 0)
		return fail(argv[3], "could not write");
	kern_model_free(m);
	return 0;
}
