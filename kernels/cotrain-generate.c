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
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/checkpoint.h"
#include "kernels/fill_mask.h"
#include "kernels/generate.h"
#include "kernels/hf_gpt2.h"
#include "kernels/model.h"
#include "kernels/spm.h"
#include "kernels/tokenizer.h"
#include "shared/common/options.h"

#define PROG "cotrain-generate"

typedef struct {
	const char *ckpt, *prompt, *tokenizer, *fill;
	gen_options o;
	int threads, predictions;
} gen_cli;

#define F(field) offsetof(gen_cli, field)
static const opt_spec gen_opts[] = {
	{ "checkpoint", 'c', OPT_STRING, F(ckpt), .metavar = "PATH",
	  .help = "the checkpoint (a .safetensors file), or a folder written by "
	          "cotrain-admin model export (config.json and model.safetensors, or --format "
	          "cotrain's checkpoint.safetensors; its spiece.model is the default --tokenizer)" },
	{ "prompt", 'p', OPT_STRING, F(prompt), .metavar = "TEXT",
	  .help = "text to continue (default: a newline)" },
	{ "tokenizer", 0, OPT_STRING, F(tokenizer), .metavar = "FILE",
	  .help = "the SentencePiece model of a dataset imported with a subword tokenizer "
	          "(spiece.model of cotrain-admin dataset tokenizer export); default: bytes" },
	{ "tokens", 'n', OPT_INT, F(o.n_tokens), 0, GEN_MAX_TOKENS, .def = "256", .metavar = "N",
	  .help = "tokens to generate" },
	{ "top-k", 'k', OPT_INT, F(o.top_k), 0, INT_MAX, .def = "40", .metavar = "K",
	  .help = "sample from the K most likely tokens; 1 is greedy, 0 the whole vocabulary" },
	{ "temperature", 't', OPT_FLOAT, F(o.temperature), .dmin = 0, .dmax = 1e6, .def = "1.0",
	  .metavar = "T", .help = "divide logits by T before sampling; 0 is greedy" },
	{ "seed", 's', OPT_U64, F(o.seed), .def = "1", .metavar = "S", .help = "seed of the sampler" },
	{ "fill-mask", 'm', OPT_STRING, F(fill), .metavar = "TEXT",
	  .help = "an encoder (albert, bert) checkpoint: print the most likely tokens for each [MASK] "
	          "in TEXT instead of generating (with --tokenizer, the pieces of a subword model)" },
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

/* Load the SentencePiece model in the file at path (at most SPM_MODEL_MAX
 * bytes) into *out.  COT_ERR_IO, COT_ERR_TOO_LARGE and spm_load's errors. */
static cot_err load_spm(const char *path, spm_model **out, cot_errbuf *eb)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return cot_seterr(eb, COT_ERR_IO, "could not open tokenizer \"%s\": %s", path,
		                  strerror(errno));
	unsigned char *buf = malloc(SPM_MODEL_MAX + 1);
	size_t n = buf ? fread(buf, 1, SPM_MODEL_MAX + 1, f) : 0;
	int err = ferror(f);
	fclose(f);
	cot_err rc = COT_OK;
	if (!buf)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	else if (err)
		rc = cot_seterr(eb, COT_ERR_IO, "could not read tokenizer \"%s\"", path);
	else if (n > SPM_MODEL_MAX)
		rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "tokenizer \"%s\" is larger than %u bytes", path,
		                SPM_MODEL_MAX);
	else
		rc = spm_load(buf, n, out, eb);
	free(buf);
	return rc;
}

/* The prompt's tokens: its bytes, or its subword ids (spm not NULL), in a
 * malloc'd *ids of *n (at least one token; the caller frees it). */
static cot_err encode_prompt(const spm_model *spm, const char *prompt, int32_t **ids, size_t *n,
                             cot_errbuf *eb)
{
	size_t plen = strlen(prompt);
	if (spm) {
		cot_err rc = spm_encode(spm, prompt, plen, ids, n, eb);
		if (!rc && *n == 0)
			rc = cot_seterr(eb, COT_ERR_INVALID, "the prompt encodes to no token");
		return rc;
	}
	if (!(*ids = malloc(plen * sizeof **ids)))
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	*n = tok_encode(prompt, plen, *ids);
	return COT_OK;
}

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

/* The subword form of print_fill: text encoded by spm (its "[MASK]" piece
 * the model's mask id; a lone "▁" piece before a mask dropped, as
 * transformers' tokenizers strip the space before [MASK]), the predictions
 * named by their pieces, and the text decoded with the first of each in
 * place. */
static cot_err print_fill_spm(kern_model *m, const spm_model *spm, const char *text, int k, cot_errbuf *eb)
{
	int32_t *ids = NULL;
	size_t n = 0, len = 0;
	char *filled = NULL;
	fill_result r = { 0 };
	cot_err rc = spm_encode(spm, text, strlen(text), &ids, &n, eb);
	if (rc)
		return rc;
	int space = spm_piece_id(spm, "\xe2\x96\x81"); /* U+2581, SentencePiece's space */
	size_t w = 0;
	for (size_t i = 0; i < n; i++)
		if (!(space >= 0 && ids[i] == space && i + 1 < n && ids[i + 1] == m->config.mask_id))
			ids[w++] = ids[i];
	n = w;
	rc = fill_mask_ids(m, ids, n, k, &r, eb);
	for (int i = 0; !rc && i < r.n_masks; i++) {
		printf("[MASK] %d of %d:", i + 1, r.n_masks);
		for (int j = 0; j < r.k; j++)
			printf(" \"%s\" %.3f", spm_piece(spm, r.token[(size_t)i * r.k + j]),
			       r.prob[(size_t)i * r.k + j]);
		putchar('\n');
		ids[r.position[i] - 1] = r.token[(size_t)i * r.k];
	}
	if (!rc)
		rc = spm_decode(spm, ids, n, &filled, &len, eb);
	if (!rc)
		printf("filled: %s\n", filled);
	free(filled);
	free(ids);
	fill_result_free(&r);
	if (!rc && fflush(stdout) == EOF)
		rc = cot_seterr(eb, COT_ERR_IO, "could not write to standard output: %s", strerror(errno));
	return rc;
}

/* Whether *ckpt is a folder.  A folder written by cotrain-admin model
 * export --format cotrain holds EXPORT_CKPT; *ckpt becomes that file's path
 * in buf then.  When no tokenizer is given and the folder (of either
 * format) holds spiece.model, *tokenizer becomes its path in tbuf. */
#define EXPORT_CKPT "checkpoint.safetensors"
static bool resolve_folder(const char **ckpt, char *buf, size_t size, const char **tokenizer, char *tbuf,
                           size_t tsize)
{
	struct stat st;
	if (stat(*ckpt, &st) != 0 || !S_ISDIR(st.st_mode))
		return false;
	const char *dir = *ckpt;
	if (!*tokenizer && (size_t)snprintf(tbuf, tsize, "%s/spiece.model", dir) < tsize &&
	    access(tbuf, R_OK) == 0)
		*tokenizer = tbuf;
	if ((size_t)snprintf(buf, size, "%s/" EXPORT_CKPT, dir) < size && access(buf, R_OK) == 0)
		*ckpt = buf;
	return true;
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
	char ckpt_buf[PATH_MAX], tok_buf[PATH_MAX];
	bool folder =
	        resolve_folder(&ckpt, ckpt_buf, sizeof ckpt_buf, &cli.tokenizer, tok_buf, sizeof tok_buf);
	gen_options o = cli.o;
	int threads = cli.threads;

	if (threads > 0)
		kern_set_threads((int)threads);

	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	kern_model *m;
	cot_err rc = hf_or_ckpt_load_new(ckpt, 1, &m, &eb);
	if (rc == COT_ERR_UNSUPPORTED && cli.fill && folder && ckpt != ckpt_buf)
		cot_sethint(&eb, "An encoder in Hugging Face's layout is read by transformers; "
		                 "fill-mask reads the folder of `cotrain-admin model export --format "
		                 "cotrain`, or a checkpoint.");
	if (rc)
		return fail(rc, &eb);
	if (!cli.fill && m->config.arch != KERN_ARCH_GPT) {
		kern_model_free(m);
		fprintf(stderr,
		        PROG ": %s is an encoder (%s): it fills masks (--fill-mask TEXT), it does not "
		             "generate\n",
		        ckpt, kern_arch_name(m->config.arch));
		return 2;
	}

	spm_model *spm = NULL;
	if (cli.tokenizer && (rc = load_spm(cli.tokenizer, &spm, &eb))) {
		kern_model_free(m);
		return fail(rc, &eb);
	}
	if (spm && spm_vocab_size(spm) != m->config.vocab) {
		rc = cot_seterr(&eb, COT_ERR_INVALID,
		                "tokenizer \"%s\" has %d pieces, the model a vocabulary of %d", cli.tokenizer,
		                spm_vocab_size(spm), m->config.vocab);
		spm_free(spm);
		kern_model_free(m);
		return fail(rc, &eb);
	}
	if (cli.fill) {
		rc = spm ? print_fill_spm(m, spm, cli.fill, cli.predictions, &eb)
		         : print_fill(m, cli.fill, cli.predictions, &eb);
		spm_free(spm);
		kern_model_free(m);
		return rc ? fail(rc, &eb) : 0;
	}
	if (prompt[0] == '\0')
		prompt = "\n";
	size_t plen = strlen(prompt), np = 0, tlen = 0;
	if (plen > GEN_MAX_TOKENS) {
		spm_free(spm);
		kern_model_free(m);
		fprintf(stderr, PROG ": prompt of %zu bytes is longer than %d\n", plen, GEN_MAX_TOKENS);
		return 2;
	}
	int32_t *ptok = NULL;
	int32_t *gen = malloc(((size_t)o.n_tokens + 1) * sizeof *gen);
	char *text = spm ? NULL : malloc((size_t)o.n_tokens + 1);
	if (!gen || (!spm && !text)) {
		rc = cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((rc = encode_prompt(spm, prompt, &ptok, &np, &eb)))
		goto out;
	rc = gen_generate(m, ptok, (int)np, &o, gen, &eb);
	if (rc)
		goto out;
	tlen = (size_t)o.n_tokens;
	if (spm) {
		/* The prompt's ids and the continuation's, decoded together, so
		 * that a piece's leading space is kept between them. */
		int32_t *all = malloc((np + tlen) * sizeof *all);
		if (!all) {
			rc = cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
			goto out;
		}
		memcpy(all, ptok, np * sizeof *all);
		memcpy(all + np, gen, tlen * sizeof *all);
		rc = spm_decode(spm, all, np + tlen, &text, &tlen, &eb);
		free(all);
		plen = 0; /* the decoded text holds the prompt */
	} else {
		rc = tok_decode(gen, tlen, text, &eb);
	}
	if (rc)
		goto out;
	if (fwrite(prompt, 1, plen, stdout) != plen || fwrite(text, 1, tlen, stdout) != tlen ||
	    putchar('\n') == EOF || fflush(stdout) == EOF)
		rc = cot_seterr(&eb, COT_ERR_IO,
		                "could not write to standard "
		                "output: %s",
		                strerror(errno));
out:
	free(ptok);
	free(gen);
	free(text);
	spm_free(spm);
	kern_model_free(m);
	return rc ? fail(rc, &eb) : 0;
}
