/* bench_mlm_plateau: how many training steps a small ALBERT needs to leave
 * the unigram plateau of masked language modelling on real text, in one
 * process (no server, no rounds), to choose the ALBERT demo's settings
 * (packaging/demo/albert.json, doc/model.md "The ALBERT demo").
 *
 *   bench_mlm_plateau --text FILE [--vocab N] [--seq T] [--d-model H]
 *       [--d-embed E] [--layers L] [--heads NH] [--d-ff F] [--opt adamw|lamb]
 *       [--lr X] [--warmup W] [--steps N] [--batch B] [--clients C]
 *       [--inner K] [--outer-lr X] [--outer-momentum M] [--eval-every N]
 *       [--threads N] [--pos-init normal|sin] [--unigram-bias 0|1]
 *       [--position absolute|relative_key|relative_key_query] [--dump-ids FILE]
 *
 * Trains a lowercasing Unigram tokenizer of N pieces on FILE's lines (as
 * `cotrain-admin dataset tokenizer train --normalize nfkc,lowercase`),
 * encodes the text, keeps the last 2% of the ids for evaluation, and trains
 * an ALBERT (one parameter set shared by every layer) on the rest in stream
 * order with MLM + SOP (kern_enc_train_stream), AdamW or LAMB, warm-up then
 * cosine decay to 0.1 over the steps.  With --clients C > 1 it takes local
 * mode's rounds through the clients' own code (kernels/local.h): each of C
 * clients takes K inner steps of B samples from the round's parameters with
 * moments that start at zero, at the round's learning rate, and the round
 * takes the outer step (kern_opt_outer_step) on their mean pseudo-gradient:
 * outer lr X (1), momentum M (0: plain averaging; Nesterov when above 0);
 * --steps counts rounds then.  Two initial values that the model's own
 * initialisation does not take, to measure them before changing it:
 * --pos-init sin overwrites the position embeddings with sinusoids (the
 * Transformer's, base 10000) scaled to root mean square 0.02, and
 * --unigram-bias 1 sets the MLM output bias to the training ids' log
 * frequencies (add-one, centred), so the model starts at the unigram.
 * --position sets the model's position signal (the project file's
 * model.position; kernels/encoder.h).
 * --dump-ids FILE writes the encoded ids (int32, host order) and exits, for
 * bench_mlm_plateau_torch.py.  Every --eval-every steps (rounds) it prints one line
 *
 *   step S samples N loss L heldout_acc A heldout_loss X unigram_acc U mask_acc M
 *
 * A: arg-max accuracy on the masked positions of 128 held-out samples
 * (fixed masks), X their mean MLM loss, U the accuracy of always predicting
 * the training text's most frequent non-special id on the same positions
 * (the plateau), M the accuracy on those of the positions whose input is
 * [MASK] (80% of them): A also counts the 10% whose input is the answer
 * itself, which a model learns to copy long before it reads the context,
 * so A rises above U while M still equals it (doc/model.md). */
#include "kernels/backend.h"
#include "kernels/encoder.h"
#include "kernels/local.h"
#include "kernels/masking.h"
#include "kernels/model.h"
#include "kernels/optimizer.h"
#include "kernels/spm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_SAMPLES 128

/* The view of m named name; the bench's own layout is fixed, so a missing
 * name is a programming error. */
static const kern_view *view_named(const kern_model *m, const char *name)
{
	for (int i = 0; i < m->n_views; i++)
		if (!strcmp(m->views[i].name, name))
			return &m->views[i];
	fprintf(stderr, "bench_mlm_plateau: no view %s\n", name);
	exit(1);
}

static void die(const char *what, const cot_errbuf *eb)
{
	fprintf(stderr, "bench_mlm_plateau: %s: %s\n", what, eb ? eb->msg : "failed");
	exit(1);
}

/* The whole of a file, NUL-terminated, or NULL. */
static char *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
		free(s);
		s = NULL;
	}
	fclose(f);
	if (s) {
		s[n] = 0;
		*len = (size_t)n;
	}
	return s;
}

/* Held-out accuracy and loss on EVAL_SAMPLES samples of the held-out ids,
 * and the accuracy of always answering `top`. */
static void evaluate(kern_model *m, const int32_t *ids, size_t n_ids, int B, int32_t top, double *acc,
                     double *loss, double *uni, double *macc)
{
	const kern_config *c = &m->config;
	int T = c->seq_len, n = kern_mask_raw_per_sample(c);
	int32_t *tok = malloc((size_t)B * T * 4), *seg = malloc((size_t)B * T * 4),
	        *lab = malloc((size_t)B * T * 4), *sop = malloc((size_t)B * 4);
	long correct = 0, total = 0, ucorrect = 0, mcorrect = 0, mtotal = 0;
	double lsum = 0;
	cot_errbuf eb;
	for (int s0 = 0; s0 < EVAL_SAMPLES; s0 += B) {
		if ((size_t)(s0 + B) * n > n_ids)
			break;
		if (kern_mask_build(c, 0x686f6c646f7574ULL, 0, s0, B, ids + (size_t)s0 * n, (size_t)n, tok,
		                    seg, lab, sop, &eb))
			die("masking the held-out samples", &eb);
		kern_enc_batch b = { tok, seg, lab, sop, NULL };
		kern_enc_result r;
		if (kern_enc_forward(m, &b, B, &r, &eb))
			die("evaluating", &eb);
		correct += r.mlm_correct;
		total += r.n_predicted;
		lsum += r.mlm_loss * r.n_predicted;
		for (int i = 0; i < B * T; i++)
			ucorrect += lab[i] == top;
		/* the rows whose input is [MASK]: only the context tells */
		int rows;
		const int32_t *pos;
		const float *lg = kern_enc_mlm_logits(m, &rows, &pos);
		for (int row = 0; row < rows; row++) {
			if (tok[pos[row]] != c->mask_id)
				continue;
			const float *x = lg + (size_t)row * c->vocab;
			int best = 0;
			for (int v = 1; v < c->vocab; v++)
				if (x[v] > x[best])
					best = v;
			mcorrect += best == lab[pos[row]];
			mtotal++;
		}
	}
	*acc = total ? (double)correct / total : 0;
	*loss = total ? lsum / total : 0;
	*uni = total ? (double)ucorrect / total : 0;
	*macc = mtotal ? (double)mcorrect / mtotal : 0;
	free(tok);
	free(seg);
	free(lab);
	free(sop);
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);
	const char *text_path = NULL, *opt = "adamw", *pos_init = "normal", *dump = NULL,
	           *position = "absolute";
	int unigram_bias = 0;
	int vocab = 4000, T = 64, H = 128, E = 64, L = 4, NH = 4, F = 512, steps = 500, B = 16, every = 50;
	int threads = 1, clients = 1, inner = 1, warmup = 1;
	double lr = 2e-3, outer_lr = 1, outer_mom = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v) {
			fprintf(stderr, "bench_mlm_plateau: %s needs a value\n", a);
			return 2;
		}
		i++;
		if (!strcmp(a, "--text"))
			text_path = v;
		else if (!strcmp(a, "--opt"))
			opt = v;
		else if (!strcmp(a, "--vocab"))
			vocab = atoi(v);
		else if (!strcmp(a, "--seq"))
			T = atoi(v);
		else if (!strcmp(a, "--d-model"))
			H = atoi(v);
		else if (!strcmp(a, "--d-embed"))
			E = atoi(v);
		else if (!strcmp(a, "--layers"))
			L = atoi(v);
		else if (!strcmp(a, "--heads"))
			NH = atoi(v);
		else if (!strcmp(a, "--d-ff"))
			F = atoi(v);
		else if (!strcmp(a, "--lr"))
			lr = atof(v);
		else if (!strcmp(a, "--warmup"))
			warmup = atoi(v);
		else if (!strcmp(a, "--steps"))
			steps = atoi(v);
		else if (!strcmp(a, "--batch"))
			B = atoi(v);
		else if (!strcmp(a, "--clients"))
			clients = atoi(v);
		else if (!strcmp(a, "--inner"))
			inner = atoi(v);
		else if (!strcmp(a, "--outer-lr"))
			outer_lr = atof(v);
		else if (!strcmp(a, "--outer-momentum"))
			outer_mom = atof(v);
		else if (!strcmp(a, "--eval-every"))
			every = atoi(v);
		else if (!strcmp(a, "--threads"))
			threads = atoi(v);
		else if (!strcmp(a, "--pos-init"))
			pos_init = v;
		else if (!strcmp(a, "--unigram-bias"))
			unigram_bias = atoi(v);
		else if (!strcmp(a, "--dump-ids"))
			dump = v;
		else if (!strcmp(a, "--position"))
			position = v;
		else {
			fprintf(stderr, "bench_mlm_plateau: unknown option %s (see the file's comment)\n", a);
			return 2;
		}
	}
	if (kern_position_parse(position) < 0) {
		fprintf(stderr,
		        "bench_mlm_plateau: --position is absolute, relative_key or relative_key_query\n");
		return 2;
	}
	if (!text_path || steps < 1 || B < 1 || every < 1 || clients < 1 || inner < 1 || warmup < 1) {
		fprintf(stderr, "bench_mlm_plateau: --text is required; steps, batch, clients, inner, "
		                "warmup and eval-every must be positive\n");
		return 2;
	}
	kern_set_threads(threads);
	cot_errbuf eb;
	size_t len;
	char *text = read_all(text_path, &len);
	if (!text)
		die("reading the text", NULL);

	static const char *const special[] = { "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]" };
	spm_train_opts so = { SPM_UNIGRAM, vocab, SPM_NORM_NFKC | SPM_NORM_LOWERCASE, special, 5 };
	unsigned char *bytes;
	size_t blen;
	spm_model *sp;
	if (spm_train(text, len, &so, &bytes, &blen, &eb) || spm_load(bytes, blen, &sp, &eb))
		die("training the tokenizer", &eb);
	int32_t *ids;
	size_t n_ids;
	if (spm_encode(sp, text, len, &ids, &n_ids, &eb))
		die("encoding the text", &eb);
	size_t n_eval = n_ids / 50, n_train = n_ids - n_eval;
	if (dump) {
		FILE *df = fopen(dump, "wb");
		if (!df || fwrite(ids, sizeof *ids, n_ids, df) != n_ids || fclose(df))
			die("writing the ids", NULL);
		printf("# ids %zu mask %d cls %d sep %d pad %d unk %d\n", n_ids, spm_piece_id(sp, "[MASK]"),
		       spm_piece_id(sp, "[CLS]"), spm_piece_id(sp, "[SEP]"), spm_piece_id(sp, "[PAD]"),
		       spm_piece_id(sp, "[UNK]"));
		return 0;
	}

	kern_config c;
	kern_config_default(&c);
	c.arch = KERN_ARCH_ALBERT;
	c.n_layer = L;
	c.n_shared = 1;
	c.n_head = NH;
	c.d_model = H;
	c.d_embed = E;
	c.d_ff = F;
	c.seq_len = T;
	c.vocab = vocab;
	c.type_vocab = 2;
	c.cls_id = spm_piece_id(sp, "[CLS]");
	c.sep_id = spm_piece_id(sp, "[SEP]");
	c.mask_id = spm_piece_id(sp, "[MASK]");
	c.pad_id = spm_piece_id(sp, "[PAD]");
	c.unk_id = spm_piece_id(sp, "[UNK]");
	c.position = kern_position_parse(position);
	int eB = B < EVAL_SAMPLES ? B : EVAL_SAMPLES;
	kern_model *m;
	if (kern_model_create(&c, B, &m, &eb))
		die("creating the model", &eb);
	kern_model_init(m, 42);

	/* the plateau's answer: the most frequent id that masking may pick */
	long *freq = calloc((size_t)vocab, sizeof *freq);
	for (size_t i = 0; i < n_train; i++)
		freq[ids[i]]++;
	int32_t top = -1;
	for (int32_t t = 0; t < vocab; t++)
		if (t != c.cls_id && t != c.sep_id && t != c.mask_id && t != c.pad_id && t != c.unk_id &&
		    (top < 0 || freq[t] > freq[top]))
			top = t;
	if (!strcmp(pos_init, "sin")) {
		/* pairs (sin, cos) of p / 10000^(2i/E), scaled to root mean square 0.02 */
		float *P = m->params + view_named(m, "emb.position")->offset;
		double ss = 0;
		for (int p = 0; p < T; p++)
			for (int i = 0; i < E; i++) {
				double ang = p / pow(10000.0, (double)(i / 2 * 2) / E);
				P[(size_t)p * E + i] = (float)(i % 2 ? cos(ang) : sin(ang));
				ss += (double)P[(size_t)p * E + i] * P[(size_t)p * E + i];
			}
		float scale = (float)(0.02 / sqrt(ss / ((double)T * E)));
		for (size_t i = 0; i < (size_t)T * E; i++)
			P[i] *= scale;
	} else if (strcmp(pos_init, "normal")) {
		fprintf(stderr, "bench_mlm_plateau: --pos-init is normal or sin\n");
		return 2;
	}
	if (unigram_bias) {
		float *b = m->params + view_named(m, "mlm.bias")->offset;
		double mean = 0;
		for (int t = 0; t < vocab; t++)
			mean += log((double)(freq[t] + 1) / (double)(n_train + (size_t)vocab)) / vocab;
		for (int t = 0; t < vocab; t++)
			b[t] = (float)(log((double)(freq[t] + 1) / (double)(n_train + (size_t)vocab)) - mean);
	}

	kern_opt_config o;
	kern_opt_default(&o, strcmp(opt, "lamb") ? KERN_OPT_ADAMW : KERN_OPT_LAMB);
	o.lr = (float)lr;
	o.beta2 = 0.98f;
	o.eps = 1e-6f;
	o.weight_decay = 0.01f;
	o.warmup_steps = warmup;
	o.total_steps = steps;
	o.decay = KERN_DECAY_COSINE;
	size_t np = m->n_params, per_sample = (size_t)kern_mask_raw_per_sample(&c);
	/* the stream's samples in order, wrapping around the training ids */
	long n_samples = (long)(n_train / per_sample), next = 0;
	kern_outer_config outer = { (float)outer_lr, (float)outer_mom, outer_mom > 0 };
	kern_local *loc = NULL;
	float *sum = clients > 1 ? calloc(np, sizeof *sum) : NULL;
	if (clients > 1 && (!sum || kern_local_new(m, &o, 1, &loc, &eb) || kern_outer_validate(&outer, &eb)))
		die("setting up local mode", &eb);
	printf("# params %zu ids %zu (train %zu) vocab %d top '%s' samples/epoch %ld\n", np, n_ids, n_train,
	       vocab, spm_piece(sp, top), n_samples);
	double lsum = 0;
	long lcount = 0, done = 0;
	for (int s = 0; s < steps; s++) {
		if (clients == 1) {
			kern_zero_grad(m);
			kern_enc_result r;
			long mb = next % (n_samples / B);
			next++;
			if (kern_enc_train_stream(m, ids + (size_t)mb * B * per_sample, per_sample, B, 42, 0,
			                          mb, 1, &r, &eb))
				die("training", &eb);
			lsum += r.loss;
			lcount++;
			kern_opt_stats st;
			if (kern_opt_step(m, &o, &st, &eb))
				die("the optimizer step", &eb);
			done += B;
		} else {
			/* each client from the round's parameters (m->step is the
			 * round), its contribution (theta_v - theta) S summed */
			memset(sum, 0, np * sizeof *sum);
			for (int k = 0; k < clients; k++) {
				kern_local_begin(loc, m);
				for (int t = 1; t <= inner; t++) {
					kern_enc_result r;
					long mb = next % (n_samples / B);
					next++;
					if (kern_enc_train_stream(m, ids + (size_t)mb * B * per_sample,
					                          per_sample, B, 42, 0, mb, (float)B, &r,
					                          &eb) ||
					    kern_local_microbatch(loc, m, B, &eb))
						die("the inner step", &eb);
					lsum += r.loss;
					lcount++;
					done += B;
				}
				if (kern_local_finish(loc, m, NULL, &eb))
					die("the end of the round", &eb);
				for (size_t i = 0; i < np; i++)
					sum[i] += m->grads[i];
			}
			/* the all-reduce's sample-weighted mean, then the outer step */
			double S = (double)clients * inner * B;
			for (size_t i = 0; i < np; i++)
				m->grads[i] = (float)((double)sum[i] / S);
			if (kern_opt_outer_step(m, &outer, &eb))
				die("the outer step", &eb);
		}
		if ((s + 1) % every == 0 || s + 1 == steps) {
			double acc, loss, uni, macc;
			evaluate(m, ids + n_train, n_eval, eB, top, &acc, &loss, &uni, &macc);
			printf("step %d samples %ld loss %.4f heldout_acc %.4f heldout_loss %.4f unigram_acc "
			       "%.4f mask_acc "
			       "%.4f\n",
			       s + 1, done, lsum / lcount, acc, loss, uni, macc);
			fflush(stdout);
			lsum = 0;
			lcount = 0;
		}
	}
	kern_model_free(m);
	spm_free(sp);
	free(bytes);
	free(ids);
	free(text);
	free(freq);
	free(sum);
	kern_local_free(loc);
	return 0;
}
