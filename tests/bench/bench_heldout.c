/* bench_heldout: what held-out evaluation costs against the training it
 * evaluates, for one project file (never run by make check).
 *
 *   tests/bench/bench_heldout [PROJECT_FILE]   (default packaging/demo/project.json)
 *
 * Measures, in CPU seconds of the calling thread with the kernels on one
 * thread (as the server's evaluator runs them, kern_set_threads_here):
 *   - the evaluation of one version: a forward pass with the loss over
 *     eval_sequences sequences of seq_len tokens in batches of HEVAL_BATCH,
 *     plus loading the checkpoint (as heval_bpb does);
 *   - the training of one round: forward and backward over target_batch
 *     samples in microbatches of microbatch_size (the peers' part; the
 *     all-reduce and the step come on top);
 * and prints both and their ratio, the evaluation's share of the
 * collaboration's compute when every version is evaluated (eval_every 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/checkpoint.h"
#include "kernels/model.h"
#include "server/heldout_eval.h"
#include "server/project_file.h"

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "packaging/demo/project.json";
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "bench_heldout: cannot open \"%s\"\n", path);
		return 2;
	}
	static char text[1 << 20];
	size_t len = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	pf_project p;
	cot_errbuf eb = { "", "" };
	if (pf_parse(text, len, &p, NULL, &eb)) {
		fprintf(stderr, "bench_heldout: %s\n", eb.msg);
		return 2;
	}
	kern_set_threads_here(1);
	int T = p.model.seq_len, B = p.microbatch_size;
	int maxb = B > HEVAL_BATCH ? B : HEVAL_BATCH;
	kern_model *m = NULL;
	if (kern_model_create(&p.model, maxb, &m, &eb)) {
		fprintf(stderr, "bench_heldout: %s\n", eb.msg);
		return 2;
	}
	kern_model_init(m, 1);
	char ck[] = "/tmp/bench-heldout-XXXXXX";
	int fd = mkstemp(ck);
	close(fd);
	ckpt_save(m, ck, &eb);
	int32_t *in = malloc((size_t)maxb * T * sizeof *in), *tgt = malloc((size_t)maxb * T * sizeof *tgt);
	for (size_t i = 0; i < (size_t)maxb * T; i++) {
		in[i] = (int32_t)(rand() % p.model.vocab);
		tgt[i] = (int32_t)(rand() % p.model.vocab);
	}
	float loss;
	/* training: one round's samples */
	double t0 = cpu_now();
	for (int s = 0; s < p.target_batch; s += B) {
		kern_forward(m, in, tgt, B, &loss, &eb);
		kern_backward(m, &eb);
	}
	double train = cpu_now() - t0;
	/* evaluation: load the checkpoint, forward over the sample */
	int n_seq = p.eval_sequences;
	int32_t *tok = malloc(((size_t)n_seq * T + 1) * sizeof *tok);
	for (size_t i = 0; i < (size_t)n_seq * T + 1; i++)
		tok[i] = (int32_t)(rand() % p.model.vocab);
	double bpb = 0;
	t0 = cpu_now();
	if (heval_bpb(ck, tok, n_seq, T, &bpb, &eb))
		fprintf(stderr, "bench_heldout: %s\n", eb.msg);
	double ev = cpu_now() - t0;
	unlink(ck);
	printf("project %s: %d samples per round, eval on %d sequences of %d tokens (one kernel thread)\n",
	       p.name, p.target_batch, n_seq, T);
	printf("training forward+backward per round: %.3f CPU s\n", train);
	printf("held-out evaluation per version:    %.3f CPU s\n", ev);
	printf("evaluation / training: %.4f (%.2f%% with eval_every %d)\n", ev / train,
	       100.0 * ev / train / (p.eval_every > 0 ? p.eval_every : 1), p.eval_every);
	free(in);
	free(tgt);
	free(tok);
	kern_model_free(m);
	pf_free(&p);
	return 0;
}
