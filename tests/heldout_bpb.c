/* cotrain tests: the held-out bits per byte of checkpoints, computed apart
 * from the server (a check program of tests/test_heldout_e2e.sh).
 *
 *   heldout_bpb STREAM HELDOUT_TOKENS N_SEQ CHECKPOINT...
 *
 * STREAM is a file holding the dataset's whole token stream (with the byte
 * tokenizer and one document, the document's bytes); the held-out part is
 * its last HELDOUT_TOKENS bytes.  For each checkpoint it prints
 * "PATH BPB": the mean next-token cross-entropy, in bits, over sequences
 * i = 0 .. N_SEQ-1 of T + 1 tokens starting at held-out token i*T (T the
 * checkpoint's seq_len), each through kern_forward alone (one sequence a
 * batch, where the server takes eight), summed in double.  For an
 * encoder's checkpoint it prints "PATH MLM_LOSS MLM_ACCURACY": each
 * sequence's first T - 3 tokens masked alone by kern_mask_build under the
 * key the server's evaluation states (seed 0x686f6c646f7574, "holdout";
 * epoch 0; microbatch i; sample 0), the masked-LM loss in nats and the
 * accuracy over all predicted positions.  It reads
 * neither shards nor the database, so a server that evaluates the wrong
 * tokens, model or formula disagrees with it.  Exit 0 when every
 * checkpoint was evaluated, 1 otherwise. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/checkpoint.h"
#include "kernels/encoder.h"
#include "kernels/masking.h"
#include "kernels/model.h"

/* The masked-LM loss and accuracy of encoder m on sequences 0..n_seq-1 of
 * h, one a batch; 0, or 1 with a message. */
static int encoder_figures(kern_model *m, const char *path, const unsigned char *h, long n_seq)
{
	int T = m->config.seq_len;
	int32_t *raw = malloc((size_t)T * sizeof *raw), *ids = malloc((size_t)T * sizeof *ids);
	int32_t *seg = malloc((size_t)T * sizeof *seg), *lab = malloc((size_t)T * sizeof *lab), sop;
	double sum = 0;
	long predicted = 0, correct = 0;
	int rc = !(raw && ids && seg && lab);
	cot_errbuf eb = { "out of memory", "" };
	for (long i = 0; i < n_seq && !rc; i++) {
		for (int t = 0; t < T; t++)
			raw[t] = h[i * T + t];
		kern_enc_batch b = { ids, seg, lab, &sop, NULL };
		kern_enc_result res = { 0 };
		rc = kern_mask_build(&m->config, UINT64_C(0x686f6c646f7574), 0, i, 1, raw, (size_t)T, ids,
		                     seg, lab, &sop, &eb) ||
		     kern_enc_forward(m, &b, 1, &res, &eb);
		sum += res.mlm_loss * res.n_predicted;
		predicted += res.n_predicted;
		correct += res.mlm_correct;
	}
	if (!rc && predicted < 1)
		rc = snprintf(eb.msg, sizeof eb.msg, "nothing predicted") > 0;
	if (rc)
		fprintf(stderr, "heldout_bpb: %s: %s\n", path, eb.msg);
	else
		printf("%s %.10f %.10f\n", path, sum / (double)predicted,
		       (double)correct / (double)predicted);
	free(raw);
	free(ids);
	free(seg);
	free(lab);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: %s STREAM HELDOUT_TOKENS N_SEQ CHECKPOINT...\n", argv[0]);
		return 2;
	}
	FILE *f = fopen(argv[1], "rb");
	if (!f) {
		fprintf(stderr, "heldout_bpb: could not open \"%s\": %s\n", argv[1], strerror(errno));
		return 1;
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	long held = atol(argv[2]), n_seq = atol(argv[3]);
	if (n < 1 || held < 2 || held > n || n_seq < 1) {
		fprintf(stderr, "heldout_bpb: bad sizes (stream %ld, held out %ld, sequences %ld)\n", n, held,
		        n_seq);
		return 2;
	}
	unsigned char *stream = malloc((size_t)n);
	if (!stream || fread(stream, 1, (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "heldout_bpb: could not read \"%s\"\n", argv[1]);
		return 1;
	}
	fclose(f);
	const unsigned char *h = stream + (n - held);
	int rc = 0;
	for (int a = 4; a < argc; a++) {
		cot_errbuf eb = { "", "" };
		kern_model *m = NULL;
		if (ckpt_load_new(argv[a], 1, &m, &eb)) {
			fprintf(stderr, "heldout_bpb: %s: %s\n", argv[a], eb.msg);
			rc = 1;
			continue;
		}
		int T = m->config.seq_len;
		if (n_seq * T + 1 > held) {
			fprintf(stderr, "heldout_bpb: %ld sequences of %d tokens need more than %ld tokens\n",
			        n_seq, T, held);
			return 2;
		}
		if (m->config.arch != KERN_ARCH_GPT) {
			rc |= encoder_figures(m, argv[a], h, n_seq);
			kern_model_free(m);
			continue;
		}
		int32_t *in = malloc((size_t)T * sizeof *in), *tgt = malloc((size_t)T * sizeof *tgt);
		double sum = 0;
		for (long i = 0; i < n_seq && in && tgt; i++) {
			for (int t = 0; t < T; t++) {
				in[t] = h[i * T + t];
				tgt[t] = h[i * T + t + 1];
			}
			float loss;
			if (kern_forward(m, in, tgt, 1, &loss, &eb)) {
				fprintf(stderr, "heldout_bpb: %s\n", eb.msg);
				return 1;
			}
			sum += (double)loss * T;
		}
		printf("%s %.10f\n", argv[a], sum / ((double)n_seq * T) / log(2.0));
		free(in);
		free(tgt);
		kern_model_free(m);
	}
	free(stream);
	return rc;
}
