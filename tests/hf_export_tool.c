/* cotrain tests: a helper for tests/test_model_export.sh.
 *
 *   hf_export_tool logits MODEL TEXT OUT
 *       cotrain's forward on the first seq_len bytes of TEXT, batch 1; the
 *       [seq_len, vocab] logits go to OUT as little-endian float32.  MODEL is
 *       a checkpoint or an exported folder.
 *   hf_export_tool perturb IN OUT SEED
 *       checkpoint IN with every parameter moved by N(0, 0.1) noise (so that
 *       biases and LayerNorm weights differ from their seed values of 0 and
 *       1, and a mapping that swaps two of them shows), written to OUT.
 *   hf_export_tool same A B
 *       exit 0 when models A and B (checkpoints or folders) have the same
 *       config and bit-identical parameters, 1 otherwise.
 *
 * Exit status 0, 1 on a failed comparison or error, 2 on bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/checkpoint.h"
#include "kernels/hf_gpt2.h"
#include "kernels/model.h"
#include "kernels/rng.h"

static int fail(const cot_errbuf *eb)
{
	fprintf(stderr, "hf_export_tool: %s\n", eb->msg);
	return 1;
}

static int logits(const char *model, const char *text, const char *out)
{
	cot_errbuf eb = { "", "" };
	kern_model *m;
	if (hf_or_ckpt_load_new(model, 1, &m, &eb))
		return fail(&eb);
	int T = m->config.seq_len, V = m->config.vocab;
	int32_t *tok = calloc((size_t)T, sizeof *tok);
	FILE *f = fopen(text, "rb");
	int n = 0, ch;
	while (tok && f && n < T && (ch = getc(f)) != EOF)
		tok[n++] = ch;
	if (f)
		fclose(f);
	if (n < T) {
		fprintf(stderr, "hf_export_tool: \"%s\" has fewer than %d bytes\n", text, T);
		free(tok);
		kern_model_free(m);
		return 1;
	}
	int rc = 0;
	if (kern_forward(m, tok, NULL, 1, NULL, &eb)) {
		rc = fail(&eb);
	} else {
		FILE *o = fopen(out, "wb");
		if (!o || fwrite(kern_logits(m), sizeof(float), (size_t)T * V, o) != (size_t)T * V ||
		    fclose(o) != 0) {
			fprintf(stderr, "hf_export_tool: could not write \"%s\"\n", out);
			rc = 1;
		}
	}
	free(tok);
	kern_model_free(m);
	return rc;
}

static int perturb(const char *in, const char *out, const char *seed)
{
	cot_errbuf eb = { "", "" };
	kern_model *m;
	if (ckpt_load_new(in, 0, &m, &eb))
		return fail(&eb);
	kern_rng r;
	kern_rng_seed(&r, strtoull(seed, NULL, 10));
	for (size_t i = 0; i < m->n_params; i++)
		m->params[i] += (float)(0.1 * kern_rng_normal(&r));
	int rc = ckpt_save(m, out, &eb) ? fail(&eb) : 0;
	kern_model_free(m);
	return rc;
}

static int same(const char *a, const char *b)
{
	cot_errbuf eb = { "", "" };
	kern_model *x, *y;
	if (hf_or_ckpt_load_new(a, 0, &x, &eb))
		return fail(&eb);
	if (hf_or_ckpt_load_new(b, 0, &y, &eb)) {
		kern_model_free(x);
		return fail(&eb);
	}
	int eq = memcmp(&x->config, &y->config, sizeof x->config) == 0 &&
	         memcmp(x->params, y->params, x->n_params * sizeof(float)) == 0;
	if (!eq)
		fprintf(stderr, "hf_export_tool: \"%s\" and \"%s\" differ\n", a, b);
	kern_model_free(x);
	kern_model_free(y);
	return eq ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "logits") == 0)
		return logits(argv[2], argv[3], argv[4]);
	if (argc == 5 && strcmp(argv[1], "perturb") == 0)
		return perturb(argv[2], argv[3], argv[4]);
	if (argc == 4 && strcmp(argv[1], "same") == 0)
		return same(argv[2], argv[3]);
	fprintf(stderr, "usage: hf_export_tool logits MODEL TEXT OUT | perturb IN OUT SEED | same A B\n");
	return 2;
}
