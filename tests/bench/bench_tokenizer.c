/* cotrain bench: the subword tokenizer through cotrain's shim (kernels/spm.h)
 * on a text file: training time, then encoding speed, line by line as
 * SentencePiece's spm_encode reads its input.  tests/bench/bench-tokenizer.sh
 * runs it beside spm_train and spm_encode on the same file and prints the
 * ratios.
 *
 *   bench_tokenizer CORPUS unigram|bpe VOCAB MODEL_OUT
 *
 * Prints "train_seconds S", "encode_seconds S", "tokens N", "bytes N" (wall
 * clock).  Exit status 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/spm.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: bench_tokenizer CORPUS unigram|bpe VOCAB MODEL_OUT\n");
		return 2;
	}
	FILE *f = fopen(argv[1], "rb");
	if (!f) {
		perror(argv[1]);
		return 1;
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	rewind(f);
	char *text = malloc((size_t)n + 1);
	if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "bench_tokenizer: cannot read %s\n", argv[1]);
		return 1;
	}
	fclose(f);
	text[n] = '\0';
	static const char *const special[] = { "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]" };
	spm_train_opts o = { .type = strcmp(argv[2], "bpe") == 0 ? SPM_BPE : SPM_UNIGRAM,
		             .vocab = atoi(argv[3]),
		             .normalize = SPM_NORM_NFKC,
		             .special = special,
		             .n_special = 5 };
	cot_errbuf eb = { "", "" };
	unsigned char *model = NULL;
	size_t mlen = 0;
	double t0 = now();
	if (spm_train(text, (size_t)n, &o, &model, &mlen, &eb)) {
		fprintf(stderr, "bench_tokenizer: %s\n", eb.msg);
		return 1;
	}
	double train = now() - t0;
	FILE *out = fopen(argv[4], "wb");
	if (!out || fwrite(model, 1, mlen, out) != mlen || fclose(out) != 0) {
		fprintf(stderr, "bench_tokenizer: cannot write %s\n", argv[4]);
		return 1;
	}
	spm_model *m = NULL;
	if (spm_load(model, mlen, &m, &eb)) {
		fprintf(stderr, "bench_tokenizer: %s\n", eb.msg);
		return 1;
	}
	size_t tokens = 0;
	t0 = now();
	for (char *p = text; p < text + n;) {
		char *nl = memchr(p, '\n', (size_t)(text + n - p));
		size_t len = nl ? (size_t)(nl - p) : (size_t)(text + n - p);
		int32_t *ids = NULL;
		size_t k = 0;
		if (spm_encode(m, p, len, &ids, &k, &eb)) {
			fprintf(stderr, "bench_tokenizer: %s\n", eb.msg);
			return 1;
		}
		tokens += k;
		free(ids);
		p += len + 1;
	}
	double enc = now() - t0;
	printf("train_seconds %.3f\nencode_seconds %.3f\ntokens %zu\nbytes %ld\n", train, enc, tokens, n);
	spm_free(m);
	free(model);
	free(text);
	return 0;
}
