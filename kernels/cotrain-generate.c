/* cotrain-generate: continue a prompt with a model checkpoint, to see what
 * the model has learned.
 *
 * Exit status: 0 on success, 1 when the checkpoint cannot be used or
 * generation fails, 2 on a usage error. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/checkpoint.h"
#include "kernels/generate.h"
#include "kernels/model.h"
#include "kernels/tokenizer.h"

#define PROG "cotrain-generate"

static void usage(FILE *fp)
{
	fprintf(fp,
	        "Usage: " PROG " --checkpoint FILE [OPTION]...\n"
	        "Continue a prompt with a cotrain model checkpoint and print the "
	        "prompt and\nits continuation.\n\n"
	        "  -c, --checkpoint FILE   the checkpoint (a .safetensors file)\n"
	        "  -p, --prompt TEXT       text to continue (default: a newline)\n"
	        "  -n, --tokens N          tokens to generate (default: 256)\n"
	        "  -k, --top-k K           sample from the K most likely tokens; "
	        "1 is greedy,\n"
	        "                          0 the whole vocabulary (default: 40)\n"
	        "  -t, --temperature T     divide logits by T before sampling; "
	        "0 is greedy\n"
	        "                          (default: 1.0)\n"
	        "  -s, --seed S            seed of the sampler (default: 1)\n"
	        "  -j, --threads N         CPU threads (default: all)\n"
	        "  -h, --help              show this help and exit\n\n"
	        "The same checkpoint, prompt, options and thread count give the "
	        "same text.\nExit status: 0 on success, 1 on a runtime error, "
	        "2 on a usage error.\n");
}

static _Noreturn void bad_usage(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
static _Noreturn void bad_usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, PROG ": ");
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry \"" PROG " --help\" for more information.\n");
	exit(2);
}

static long parse_long(const char *s, const char *opt, long lo, long hi)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, PROG ": invalid value \"%s\" for %s: expected an "
		        "integer from %ld to %ld\n", s, opt, lo, hi);
		fprintf(stderr, "Try \"" PROG " --help\" for more information.\n");
		exit(2);
	}
	return v;
}

static int fail(cot_err rc, const cot_errbuf *eb)
{
	fprintf(stderr, PROG ": error: %s\n", eb->msg[0] ? eb->msg :
	        cot_strerror(rc));
	if (eb->hint[0])
		fprintf(stderr, PROG ": hint: %s\n", eb->hint);
	return 1;
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);  /* first: may re-exec with a faster BLAS core */
	static const struct option opts[] = {
		{"checkpoint", required_argument, NULL, 'c'},
		{"prompt", required_argument, NULL, 'p'},
		{"tokens", required_argument, NULL, 'n'},
		{"top-k", required_argument, NULL, 'k'},
		{"temperature", required_argument, NULL, 't'},
		{"seed", required_argument, NULL, 's'},
		{"threads", required_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *ckpt = NULL, *prompt = "\n";
	gen_options o = {.n_tokens = 256, .top_k = 40, .temperature = 1.0f,
	                 .seed = 1};
	long threads = 0;
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":c:p:n:k:t:s:j:h", opts, NULL)) !=
	       -1) {
		switch (c) {
		case 'c': ckpt = optarg; break;
		case 'p': prompt = optarg; break;
		case 'n':
			o.n_tokens = (int)parse_long(optarg, "--tokens", 0,
			                             GEN_MAX_TOKENS);
			break;
		case 'k':
			o.top_k = (int)parse_long(optarg, "--top-k", 0, INT_MAX);
			break;
		case 't': {
			char *end;
			errno = 0;
			double t = strtod(optarg, &end);
			if (errno || end == optarg || *end || !isfinite(t) || t < 0 ||
			    t > 1e6)
				bad_usage("invalid value \"%s\" for --temperature: "
				          "expected a number from 0 to 1e6", optarg);
			o.temperature = (float)t;
			break;
		}
		case 's': {
			char *end;
			errno = 0;
			unsigned long long s = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-')
				bad_usage("invalid value \"%s\" for --seed: expected "
				          "an unsigned 64-bit integer", optarg);
			o.seed = s;
			break;
		}
		case 'j':
			threads = parse_long(optarg, "--threads", 1, 4096);
			break;
		case 'h':
			usage(stdout);
			return 0;
		case ':':
			bad_usage("option \"%s\" needs a value", argv[optind - 1]);
		default:
			bad_usage("unknown option \"%s\"", argv[optind - 1]);
		}
	}
	if (optind < argc)
		bad_usage("unexpected argument \"%s\"", argv[optind]);
	if (!ckpt)
		bad_usage("no checkpoint given; use --checkpoint FILE");

	if (threads > 0)
		kern_set_threads((int)threads);

	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	kern_model *m;
	cot_err rc = ckpt_load_new(ckpt, 1, &m, &eb);
	if (rc)
		return fail(rc, &eb);

	size_t plen = strlen(prompt);
	if (plen == 0) {
		prompt = "\n";
		plen = 1;
	}
	if (plen > GEN_MAX_TOKENS) {
		kern_model_free(m);
		fprintf(stderr, PROG ": prompt of %zu bytes is longer than %d\n",
		        plen, GEN_MAX_TOKENS);
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
	    fwrite(text, 1, (size_t)o.n_tokens, stdout) != (size_t)o.n_tokens ||
	    putchar('\n') == EOF || fflush(stdout) == EOF)
		rc = cot_seterr(&eb, COT_ERR_IO, "could not write to standard "
		                "output: %s", strerror(errno));
out:
	free(ptok);
	free(gen);
	free(text);
	kern_model_free(m);
	return rc ? fail(rc, &eb) : 0;
}
