/* cotrain-generate: continue a prompt with a model checkpoint, or a model
 * exported in the GPT-2 layout (kernels/hf_gpt2.h), to see what the model
 * has learned; with --fill-mask, show an encoder's top predictions for each
 * [MASK] of a text (kernels/fill_mask.h).
 *
 * Exit status: 0 on success, 1 when the checkpoint cannot be used or
 * generation fails, 2 on a usage error. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/checkpoint.h"
#include "kernels/fill_mask.h"
#include "kernels/generate.h"
#include "kernels/hf_gpt2.h"
#include "kernels/model.h"
#include "kernels/tokenizer.h"
#include "shared/common/options.h"

#define PROG "cotrain-generate"

typedef struct {
	const char *ckpt, *prompt, *fill;
	gen_options o;
	int threads, predictions;
} gen_cli;

#define F(field) offsetof(gen_cli, field)
static const opt_spec gen_opts[] = {
	{ "checkpoint", 'c', OPT_STRING, F(ckpt), .metavar = "PATH",
	  .help = "the checkpoint (a .safetensors file), or a folder written by "
	          "cotrain-admin model export (config.json and model.safetensors)" },
	{ "prompt", 'p', OPT_STRING, F(prompt), .metavar = "TEXT",
	  .help = "text to continue (default: a newline)" },
	{ "tokens", 'n', OPT_INT, F(o.n_tokens), 0, GEN_MAX_TOKENS, .def = "256", .metavar = "N",
	  .help = "tokens to generate" },
	{ "top-k", 'k', OPT_INT, F(o.top_k), 0, INT_MAX, .def = "40", .metavar = "K",
	  .help = "sample from the K most likely tokens; 1 is greedy, 0 the whole vocabulary" },
	{ "temperature", 't', OPT_FLOAT, F(o.temperature), .dmin = 0, .dmax = 1e6, .def = "1.0",
	  .metavar = "T", .help = "divide logits by T before sampling; 0 is greedy" },
	{ "seed", 's', OPT_U64, F(o.seed), .def = "1", .metavar = "S", .help = "seed of the sampler" },
	{ "fill-mask", 'm', OPT_STRING, F(fill), .metavar = "TEXT",
	  .help = "an encoder (albert, bert) checkpoint: print the most likely tokens for each [MASK] "
	          "in TEXT instead of generating" },
	{ "predictions", 'P', OPT_INT, F(predictions), 1, 100, .def = "5", .metavar = "N",
	  .help = "with --fill-mask: the N most likely tokens of each [MASK]" },
	{ "threads", 'j', OPT_INT, F(threads), 1, 4096, .metavar = "N",
	  .help = "CPU threads (default: all)" },
	{ "help", 'h', OPT_HELP, .help = "show this help and exit" },
	{ "version", 0, OPT_VERSION, .help = "show the version and exit" },
	{ NULL }
};
#undef F

static const opt_program gen_prog = {
	.prog = PROG,
	.synopsis = "--checkpoint PATH [OPTION]...",
	.intro = "Continue a prompt with a cotrain model checkpoint, or an exported GPT-2\n"
	         "folder, and print the prompt and its continuation.\n",
	.outro = "The same checkpoint, prompt, options and thread count give the same text.\n"
	         "Exit status: 0 on success, 1 on a runtime error, 2 on a usage error.\n",
	.opts = gen_opts,
};

/* Print the predictions for each [MASK] of text, then the text with the
 * most likely token of each in its place. */
static cot_err print_fill(kern_model *m, const char *text, int k, cot_errbuf *eb)
{
	fill_result r;
	cot_err rc = fill_mask(m, text, strlen(text), k, &r, eb);
	if (rc)
		return rc;
	char name[8];
	for (int i = 0; i < r.n_masks; i++) {
		printf("[MASK] %d of %d:", i + 1, r.n_masks);
		for (int j = 0; j < r.k; j++) {
			fill_token_name(&m->config, r.token[(size_t)i * r.k + j], name);
			printf(" \"%s\" %.3f", name, r.prob[(size_t)i * r.k + j]);
		}
		putchar('\n');
	}
	printf("filled: ");
	const char *p = text;
	for (int i = 0; i < r.n_masks; i++) {
		const char *at = strstr(p, FILL_MASK_TEXT);
		fill_token_name(&m->config, r.token[(size_t)i * r.k], name);
		printf("%.*s%s", (int)(at - p), p, name);
		p = at + strlen(FILL_MASK_TEXT);
	}
	printf("%s\n", p);
	fill_result_free(&r);
	if (fflush(stdout) == EOF)
		return cot_seterr(eb, COT_ERR_IO, "could not write to standard output: %s", strerror(errno));
	return COT_OK;
}

static int fail(cot_err rc, const cot_errbuf *eb)
{
	fprintf(stderr, PROG ": error: %s\n", eb->msg[0] ? eb->msg : cot_strerror(rc));
	if (eb->hint[0])
		fprintf(stderr, PROG ": hint: %s\n", eb->hint);
	return 1;
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv); /* first: may re-exec with a faster BLAS core */
	gen_cli cli = { .prompt = "\n", .predictions = 5 };
	opt_result orc = opt_parse(&gen_prog, argc, argv, &cli, NULL);
	if (orc)
		return orc == OPT_EXIT ? 0 : 2;
	if (!cli.ckpt) {
		fprintf(stderr, PROG ": no checkpoint given; use --checkpoint PATH\n"
		                     "Try \"" PROG " --help\" for more information.\n");
		return 2;
	}
	const char *ckpt = cli.ckpt, *prompt = cli.prompt;
	gen_options o = cli.o;
	int threads = cli.threads;

	if (threads > 0)
		kern_set_threads((int)threads);

	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	kern_model *m;
	cot_err rc = hf_or_ckpt_load_new(ckpt, 1, &m, &eb);
	if (rc)
		return fail(rc, &eb);
	if (cli.fill) {
		rc = print_fill(m, cli.fill, cli.predictions, &eb);
		kern_model_free(m);
		return rc ? fail(rc, &eb) : 0;
	}
	if (m->config.arch != KERN_ARCH_GPT) {
		kern_model_free(m);
		fprintf(stderr,
		        PROG ": %s is an encoder (%s): it fills masks (--fill-mask TEXT), it does not "
		             "generate\n",
		        ckpt, kern_arch_name(m->config.arch));
		return 2;
	}

	size_t plen = strlen(prompt);
	if (plen == 0) {
		prompt = "\n";
		plen = 1;
	}
	if (plen > GEN_MAX_TOKENS) {
		kern_model_free(m);
		fprintf(stderr, PROG ": prompt of %zu bytes is longer than %d\n", plen, GEN_MAX_TOKENS);
		return 2;
	}
	int32_t *ptok = malloc(plen * sizeof *ptok);
	int32_t *gen = malloc(((size_t)o.n_tokens + 1) * sizeof *gen);
	char *text = malloc((size_t)o.n_tokens + 1);
	if (!ptok || !gen || !text) {
		rc = cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	tok_encode(prompt, plen, ptok);
	rc = gen_generate(m, ptok, (int)plen, &o, gen, &eb);
	if (rc)
		goto out;
	rc = tok_decode(gen, (size_t)o.n_tokens, text, &eb);
	if (rc)
		goto out;
	if (fwrite(prompt, 1, plen, stdout) != plen ||
	    fwrite(text, 1, (size_t)o.n_tokens, stdout) != (size_t)o.n_tokens || putchar('\n') == EOF ||
	    fflush(stdout) == EOF)
		rc = cot_seterr(&eb, COT_ERR_IO,
		                "could not write to standard "
		                "output: %s",
		                strerror(errno));
out:
	free(ptok);
	free(gen);
	free(text);
	kern_model_free(m);
	return rc ? fail(rc, &eb) : 0;
}
