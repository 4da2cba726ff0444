/* The encoders' configuration, inputs, masking and determinism
 * (kernels/encoder.h, kernels/masking.h):
 *  - configs and batches that are wrong are refused with a detail and
 *    change nothing;
 *  - masking builds [CLS] A [SEP] B [SEP] from exactly seq_len - 3 stream
 *    tokens, the original slice recoverable from ids, labels and the SOP
 *    label; 15% predicted, split 80/10/10; SOP swapped half the time;
 *  - masks are a pure function of (seed, epoch, microbatch, sample): equal
 *    across calls and when built from several threads at once, different
 *    for another key;
 *  - a replay of several microbatches (masking, forward, backward, AdamW
 *    step) gives the same bits with 1, 2 and 3 threads, for ALBERT (shared
 *    set, tanh GELU) and BERT (exact GELU), with products large enough for
 *    the backend's tiled paths;
 *  - a small ALBERT learns: its MLM loss falls below what a model blind to
 *    the context can reach;
 *  - sample lengths hide the padding after them; fill-mask (kernels/
 *    fill_mask.h) on a trained byte-level ALBERT predicts the right byte. */
#include "kernels/backend.h"
#include "kernels/encoder.h"
#include "kernels/fill_mask.h"
#include "kernels/masking.h"
#include "kernels/model.h"
#include "kernels/model_json.h"
#include "kernels/optimizer.h"
#include "kernels/rng.h"
#include "kernels/stream_step.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	if (!p)
		bail_out("out of memory");
	return p;
}

static kern_config small_albert(void)
{
	kern_config c = { .n_layer = 2,
		          .n_shared = 1,
		          .n_head = 2,
		          .d_model = 32,
		          .seq_len = 40,
		          .vocab = 64,
		          .d_ff = 64,
		          .arch = KERN_ARCH_ALBERT,
		          .d_embed = 16,
		          .type_vocab = 2,
		          .cls_id = 60,
		          .sep_id = 61,
		          .mask_id = 62,
		          .pad_id = 63,
		          .unk_id = -1 };
	return c;
}

static void test_config(void)
{
	kern_config good = small_albert();
	cot_errbuf eb;
	is_int(kern_config_validate(&good, &eb), COT_OK, "a small ALBERT config is valid");
	int nv = kern_param_views(&good, NULL, 0);
	is_int(nv, 7 + 12 + 9, "ALBERT views: 7 embedding, 12 per set, 9 of the heads");
	kern_view *v = xcalloc((size_t)nv, sizeof *v);
	kern_param_views(&good, v, nv);
	size_t sum = 0;
	int contiguous = 1;
	for (int i = 0; i < nv; i++) {
		contiguous &= v[i].offset == sum;
		sum += v[i].numel;
	}
	ok(contiguous && sum == kern_param_count(&good), "views tile the %zu parameters", sum);
	free(v);
	struct {
		const char *what;
		kern_config c;
	} bad[10];
	for (int i = 0; i < 10; i++)
		bad[i].c = good;
	bad[0].what = "equal special ids";
	bad[0].c.mask_id = bad[0].c.cls_id;
	bad[1].what = "a special id outside the vocabulary";
	bad[1].c.pad_id = 64;
	bad[2].what = "BERT with d_embed != d_model";
	bad[2].c.arch = KERN_ARCH_BERT;
	bad[3].what = "ALBERT with n_layer not a multiple of n_shared";
	bad[3].c.n_layer = 3;
	bad[3].c.n_shared = 2;
	bad[4].what = "seq_len 4";
	bad[4].c.seq_len = 4;
	bad[5].what = "type_vocab 1";
	bad[5].c.type_vocab = 1;
	bad[6].what = "an unknown arch";
	bad[6].c.arch = 7;
	bad[7].what = "a gpt with encoder fields";
	bad[7].c.arch = KERN_ARCH_GPT;
	bad[8].what = "an unknown position";
	bad[8].c.position = 3;
	bad[9].what = "a gpt with relative positions";
	memset(&bad[9].c, 0, sizeof bad[9].c);
	kern_config_default(&bad[9].c);
	bad[9].c.position = KERN_POS_RELATIVE_KEY;
	for (int i = 0; i < 10; i++) {
		eb.msg[0] = 0;
		cot_err rc = kern_config_validate(&bad[i].c, &eb);
		ok(rc == COT_ERR_INVALID && eb.msg[0], "rejects %s: %s", bad[i].what, eb.msg);
	}
	ok(kern_arch_parse("albert") == KERN_ARCH_ALBERT && kern_arch_parse("bert") == KERN_ARCH_BERT &&
	           kern_arch_parse("gpt") == KERN_ARCH_GPT && kern_arch_parse("roberta") == -1,
	   "arch names parse");
	ok(kern_position_parse("absolute") == KERN_POS_ABSOLUTE &&
	           kern_position_parse("relative_key") == KERN_POS_RELATIVE_KEY &&
	           kern_position_parse("relative_key_query") == KERN_POS_RELATIVE_KEY_QUERY &&
	           kern_position_parse("relative") == -1 && kern_position_parse(NULL) == -1,
	   "position names parse");
	kern_config rel = good;
	rel.position = KERN_POS_RELATIVE_KEY;
	int T = rel.seq_len, hd = rel.d_model / rel.n_head;
	is_int(kern_param_views(&rel, NULL, 0), 7 + 13 * rel.n_shared + 9,
	       "relative ALBERT views: a distance embedding per set");
	ok(kern_param_count(&rel) == kern_param_count(&good) + (size_t)rel.n_shared * (2 * T - 1) * hd,
	   "of 2T-1 rows by the head width");
}

/* Raw stream tokens, ordinary ones only (below 60). */
static int32_t *raw_stream(size_t n, uint64_t seed)
{
	int32_t *r = xcalloc(n, sizeof *r);
	kern_rng g;
	kern_rng_seed(&g, seed);
	for (size_t i = 0; i < n; i++)
		r[i] = (int32_t)(kern_rng_next(&g) % 60);
	return r;
}

typedef struct {
	int32_t *ids, *seg, *lab, *sop;
} sample_buf;

static sample_buf sbuf(int B, int T)
{
	sample_buf s = { xcalloc((size_t)B * T, 4), xcalloc((size_t)B * T, 4), xcalloc((size_t)B * T, 4),
		         xcalloc((size_t)B, 4) };
	return s;
}

static void sfree(sample_buf *s)
{
	free(s->ids);
	free(s->seg);
	free(s->lab);
	free(s->sop);
}

static int same(const sample_buf *a, const sample_buf *b, int B, int T)
{
	size_t n = (size_t)B * T * 4;
	return !memcmp(a->ids, b->ids, n) && !memcmp(a->seg, b->seg, n) && !memcmp(a->lab, b->lab, n) &&
	       !memcmp(a->sop, b->sop, (size_t)B * 4);
}

static void test_masking(void)
{
	kern_config c = small_albert();
	int T = c.seq_len, n = kern_mask_raw_per_sample(&c), B = 500;
	cot_errbuf eb;
	is_int(n, T - 3, "a sample consumes seq_len - 3 = %d stream tokens", T - 3);
	int32_t *raw = raw_stream((size_t)B * n, 1);
	sample_buf s = sbuf(B, T);
	if (kern_mask_build(&c, 42, 3, 7, B, raw, (size_t)n, s.ids, s.seg, s.lab, s.sop, &eb))
		bail_out("kern_mask_build: %s", eb.msg);
	int layout_ok = 1, recover_ok = 1, count_ok = 1, swapped = 0, masked = 0, random = 0, kept = 0,
	    npred = 0;
	int want_pred = kern_enc_predicted_per_sample(&c);
	for (int b = 0; b < B; b++) {
		const int32_t *id = s.ids + b * T, *sg = s.seg + b * T, *lb = s.lab + b * T;
		int mid = -1;
		for (int t = 1; t < T - 1; t++)
			if (id[t] == c.sep_id)
				mid = t;
		layout_ok &= id[0] == c.cls_id && id[T - 1] == c.sep_id && mid > 1 && mid < T - 2;
		for (int t = 0; t < T && mid > 0; t++)
			layout_ok &= sg[t] == (t > mid);
		int32_t orig[64];
		int k = 0, pred = 0;
		for (int t = 0; t < T; t++) {
			if (lb[t] != KERN_ENC_IGNORE) {
				pred++;
				masked += id[t] == c.mask_id;
				kept += id[t] == lb[t];
				random += id[t] != c.mask_id && id[t] != lb[t];
			}
			if (t != 0 && t != mid && t != T - 1)
				orig[k++] = lb[t] != KERN_ENC_IGNORE ? lb[t] : id[t];
		}
		npred += pred;
		count_ok &= pred == want_pred;
		/* the original slice: first then second, or swapped back */
		const int32_t *r = raw + (size_t)b * n;
		int n1 = mid - 1;
		if (s.sop[b]) {
			swapped++;
			recover_ok &= !memcmp(orig, r + (n - n1), (size_t)n1 * 4) &&
			              !memcmp(orig + n1, r, (size_t)(n - n1) * 4);
		} else {
			recover_ok &= !memcmp(orig, r, (size_t)n * 4);
		}
	}
	ok(layout_ok, "every sample is [CLS] A [SEP] B [SEP], segments 0 then 1");
	ok(recover_ok, "ids, labels and the SOP label give back the stream slice");
	ok(count_ok, "each sample predicts round(15%% of %d) = %d positions", n, want_pred);
	ok(swapped > B * 0.4 && swapped < B * 0.6, "%d of %d pairs swapped", swapped, B);
	double fm = (double)masked / npred, fr = (double)random / npred, fk = (double)kept / npred;
	ok(fabs(fm - 0.8) < 0.03 && fabs(fr - 0.1) < 0.03 && fabs(fk - 0.1) < 0.03,
	   "of %d predicted: %.3f [MASK], %.3f random, %.3f kept", npred, fm, fr, fk);

	/* pure function of the key */
	sample_buf s2 = sbuf(B, T), s3 = sbuf(B, T);
	kern_mask_build(&c, 42, 3, 7, B, raw, (size_t)n, s2.ids, s2.seg, s2.lab, s2.sop, &eb);
	ok(same(&s, &s2, B, T), "the same key builds the same samples");
	kern_mask_build(&c, 42, 3, 8, B, raw, (size_t)n, s3.ids, s3.seg, s3.lab, s3.sop, &eb);
	ok(!same(&s, &s3, B, T), "another microbatch index builds other masks");
	kern_mask_build(&c, 43, 3, 7, B, raw, (size_t)n, s3.ids, s3.seg, s3.lab, s3.sop, &eb);
	ok(!same(&s, &s3, B, T), "another seed builds other masks");
	kern_mask_build(&c, 42, 4, 7, B, raw, (size_t)n, s3.ids, s3.seg, s3.lab, s3.sop, &eb);
	ok(!same(&s, &s3, B, T), "another epoch builds other masks");
	/* the same slices read with the GPT's stride T: the same samples */
	int32_t *wide = xcalloc((size_t)B * T, 4);
	for (int b = 0; b < B; b++) {
		memcpy(wide + (size_t)b * T, raw + (size_t)b * n, (size_t)n * 4);
		for (int i = n; i < T; i++)
			wide[(size_t)b * T + i] = 1000; /* outside the vocabulary: must not be read */
	}
	cot_err rcw = kern_mask_build(&c, 42, 3, 7, B, wide, (size_t)T, s3.ids, s3.seg, s3.lab, s3.sop, &eb);
	ok(rcw == COT_OK && same(&s, &s3, B, T),
	   "read with stride seq_len, the slices give the same samples, the 3 tokens after each unread");
	ok(kern_mask_build(&c, 42, 3, 7, B, wide, (size_t)n - 1, s3.ids, s3.seg, s3.lab, s3.sop, &eb) ==
	           COT_ERR_INVALID,
	   "a stride below seq_len - 3 is refused: %s", eb.msg);
	free(wide);
	/* built from 4 threads at once, one sample each at a time */
	int diff = 0;
#pragma omp parallel for num_threads(4) schedule(dynamic, 1) reduction(+ : diff)
	for (int b = 0; b < B; b++) {
		cot_errbuf e2;
		/* the microbatch's first b+1 samples; sample b must match */
		sample_buf all = sbuf(b + 1, T);
		kern_mask_build(&c, 42, 3, 7, b + 1, raw, (size_t)n, all.ids, all.seg, all.lab, all.sop, &e2);
		diff += memcmp(all.ids + (size_t)b * T, s.ids + (size_t)b * T, (size_t)T * 4) != 0 ||
		        memcmp(all.lab + (size_t)b * T, s.lab + (size_t)b * T, (size_t)T * 4) != 0 ||
		        all.sop[b] != s.sop[b];
		sfree(&all);
	}
	ok(diff == 0, "built on 4 threads at once, every sample is the same");

	/* hostile input */
	raw[5] = 64;
	memset(s3.ids, 0x55, (size_t)B * T * 4);
	cot_err rc = kern_mask_build(&c, 42, 3, 7, B, raw, (size_t)n, s3.ids, s3.seg, s3.lab, s3.sop, &eb);
	int untouched = 1;
	for (size_t i = 0; i < (size_t)B * T; i++)
		untouched &= s3.ids[i] == 0x55555555;
	ok(rc == COT_ERR_INVALID && untouched, "a raw token outside the vocabulary is refused: %s", eb.msg);
	sfree(&s);
	sfree(&s2);
	sfree(&s3);
	free(raw);
}

/* A subword tokenizer's unknown piece (unk_id) is never a prediction
 * target nor a random replacement, as [CLS], [SEP], [MASK], [PAD] are not:
 * a stream where it is frequent (every tenth token) masks around it. */
static void test_masking_unk(void)
{
	kern_config c = small_albert();
	c.unk_id = 0; /* SentencePiece's [UNK] */
	int T = c.seq_len, n = kern_mask_raw_per_sample(&c), B = 400;
	int32_t *raw = raw_stream((size_t)B * n, 3);
	for (size_t i = 0; i < (size_t)B * n; i += 10)
		raw[i] = 0;
	sample_buf s = sbuf(B, T);
	cot_errbuf eb;
	if (kern_mask_build(&c, 42, 3, 7, B, raw, (size_t)n, s.ids, s.seg, s.lab, s.sop, &eb))
		bail_out("kern_mask_build: %s", eb.msg);
	int unk_target = 0, unk_random = 0, unk_kept = 0, random = 0;
	for (int i = 0; i < B * T; i++) {
		unk_target += s.lab[i] == 0;
		if (s.lab[i] != KERN_ENC_IGNORE && s.ids[i] != c.mask_id && s.ids[i] != s.lab[i]) {
			random++;
			unk_random += s.ids[i] == 0;
		}
		unk_kept += s.ids[i] == 0 && s.lab[i] == KERN_ENC_IGNORE;
	}
	ok(unk_target == 0 && unk_random == 0 && random > 100 && unk_kept >= B * n / 10,
	   "[UNK] (id 0) is never a target nor a random replacement (%d targets, %d of %d random "
	   "replacements), and stays in the input (%d times)",
	   unk_target, unk_random, random, unk_kept);
	c.unk_id = 64;
	ok(kern_config_validate(&c, &eb) == COT_ERR_INVALID && strstr(eb.msg, "unk_id"),
	   "an unk_id outside the vocabulary is refused: %s", eb.msg);
	free(raw);
	free(s.ids);
	free(s.seg);
	free(s.lab);
	free(s.sop);
}

static void test_inputs(void)
{
	kern_config c = small_albert();
	int T = c.seq_len, B = 2;
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&c, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 1);
	int32_t *raw = raw_stream((size_t)B * (T - 3), 2);
	sample_buf s = sbuf(B, T);
	kern_mask_build(&c, 1, 0, 0, B, raw, (size_t)(T - 3), s.ids, s.seg, s.lab, s.sop, &eb);
	kern_enc_batch good = { s.ids, s.seg, s.lab, s.sop, NULL };
	kern_enc_result res;
	cot_err rc0 = kern_enc_forward(m, &good, B, &res, &eb);
	is_int(rc0, COT_OK, "a masked batch runs: loss %.4f", res.loss);
	int rows;
	const float *lg = kern_enc_mlm_logits(m, &rows, NULL);
	size_t nl = (size_t)rows * c.vocab;
	float *before = xcalloc(nl, sizeof *before);
	memcpy(before, lg, nl * sizeof *before);
	ok(res.loss > 0 && isfinite(res.loss) && res.n_predicted == B * kern_enc_predicted_per_sample(&c),
	   "its loss is finite and it predicts %d positions", res.n_predicted);
	struct {
		const char *what;
		int32_t *arr;
		int idx, val;
	} bad[] = {
		{ "a token outside the vocabulary", s.ids, 3, 64 },
		{ "a negative token", s.ids, 3, -1 },
		{ "segment 2", s.seg, 4, 2 },
		{ "a label outside the vocabulary", s.lab, 5, 64 },
		{ "label -1", s.lab, 5, -1 },
		{ "SOP label 2", s.sop, 1, 2 },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		int32_t old = bad[i].arr[bad[i].idx];
		bad[i].arr[bad[i].idx] = bad[i].val;
		eb.msg[0] = 0;
		cot_err rc = kern_enc_forward(m, &good, B, &res, &eb);
		ok(rc == COT_ERR_INVALID && eb.msg[0], "refuses %s: %s", bad[i].what, eb.msg);
		bad[i].arr[bad[i].idx] = old;
	}
	lg = kern_enc_mlm_logits(m, &rows, NULL);
	ok(lg && (size_t)rows * c.vocab == nl && !memcmp(lg, before, nl * sizeof *before) &&
	           kern_enc_backward_scaled(m, 1, &eb) == COT_OK,
	   "the refused batches changed nothing: the first one's logits stand and its backward runs");
	free(before);
	/* lengths: what follows a sample's length is not seen */
	int32_t lens[2] = { T / 2, T }, bad_len[2] = { 0, T };
	kern_enc_batch nolab = { s.ids, s.seg, NULL, NULL, lens };
	kern_enc_forward(m, &nolab, B, NULL, &eb);
	lg = kern_enc_mlm_logits(m, &rows, NULL);
	size_t nh = (size_t)(T / 2) * c.vocab;
	float *first = xcalloc(nh, sizeof *first);
	memcpy(first, lg, nh * sizeof *first);
	for (int t = T / 2; t < T; t++)
		s.ids[t] = (s.ids[t] + 7) % 60;
	kern_enc_forward(m, &nolab, B, NULL, &eb);
	lg = kern_enc_mlm_logits(m, &rows, NULL);
	ok(!memcmp(lg, first, nh * sizeof *first),
	   "tokens after a sample's length change none of its logits");
	free(first);
	nolab.lengths = bad_len;
	ok(kern_enc_forward(m, &nolab, B, NULL, &eb) == COT_ERR_INVALID, "refuses a sample length of 0: %s",
	   eb.msg);
	bad_len[0] = T + 1;
	ok(kern_enc_forward(m, &nolab, B, NULL, &eb) == COT_ERR_INVALID,
	   "refuses a sample length above seq_len: %s", eb.msg);
	kern_enc_batch half = { s.ids, s.seg, s.lab, NULL, NULL };
	ok(kern_enc_forward(m, &half, B, &res, &eb) == COT_ERR_INVALID,
	   "refuses labels without SOP labels: %s", eb.msg);
	ok(kern_enc_forward(m, &good, B + 1, &res, &eb) == COT_ERR_INVALID,
	   "refuses a batch above max_batch: %s", eb.msg);
	ok(kern_forward(m, s.ids, s.ids, B, NULL, &eb) == COT_ERR_CONFLICT,
	   "the gpt pass refuses an encoder: %s", eb.msg);
	kern_model_free(m);
	kern_config g;
	kern_config_default(&g);
	g.seq_len = T;
	if (kern_model_create(&g, 1, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	ok(kern_enc_forward(m, &good, 1, &res, &eb) == COT_ERR_CONFLICT, "the encoder pass refuses a gpt: %s",
	   eb.msg);
	kern_model_free(m);
	sfree(&s);
	free(raw);
}

typedef struct {
	double loss[4];
	float *params, *grads;
} replay;

/* Four microbatches of masking, forward, backward and an AdamW step on nt
 * threads. */
static replay run_replay(const kern_config *c, int B, int nt)
{
	kern_set_threads(nt);
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(c, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 7);
	kern_opt_config o;
	kern_opt_default(&o, KERN_OPT_ADAMW);
	int T = c->seq_len, n = kern_mask_raw_per_sample(c);
	int32_t *raw = raw_stream((size_t)4 * B * n, 3);
	for (size_t i = 0; i < (size_t)4 * B * n; i++)
		raw[i] %= c->vocab - 4;
	sample_buf s = sbuf(B, T);
	replay r = { { 0 }, NULL, NULL };
	for (int j = 0; j < 4; j++) {
		kern_enc_result res;
		kern_opt_stats st;
		kern_zero_grad(m);
		if (kern_mask_build(c, 11, 0, j, B, raw + (size_t)j * B * n, (size_t)n, s.ids, s.seg, s.lab,
		                    s.sop, &eb))
			bail_out("kern_mask_build: %s", eb.msg);
		kern_enc_batch b = { s.ids, s.seg, s.lab, s.sop, NULL };
		if (kern_enc_forward(m, &b, B, &res, &eb) || kern_enc_backward_scaled(m, 1, &eb) ||
		    kern_opt_step(m, &o, &st, &eb))
			bail_out("replay step: %s", eb.msg);
		r.loss[j] = res.loss;
	}
	r.params = xcalloc(m->n_params, sizeof(float));
	r.grads = xcalloc(m->n_params, sizeof(float));
	memcpy(r.params, m->params, m->n_params * sizeof(float));
	memcpy(r.grads, m->grads, m->n_params * sizeof(float));
	sfree(&s);
	free(raw);
	kern_model_free(m);
	return r;
}

static void test_replay(const char *label, const kern_config *c, int B)
{
	size_t n = kern_param_count(c);
	replay one = run_replay(c, B, 1);
	int all_same = 1;
	for (int nt = 2; nt <= 3; nt++) {
		replay r = run_replay(c, B, nt);
		int same_bits = !memcmp(one.loss, r.loss, sizeof one.loss) &&
		                !memcmp(one.params, r.params, n * sizeof(float)) &&
		                !memcmp(one.grads, r.grads, n * sizeof(float));
		ok(same_bits,
		   "%s: 4 microbatches on %d threads give the bits of 1 thread (losses, gradients, "
		   "parameters)",
		   label, nt);
		all_same &= same_bits;
		free(r.params);
		free(r.grads);
	}
	diag("%s: losses %.5f %.5f %.5f %.5f", label, one.loss[0], one.loss[1], one.loss[2], one.loss[3]);
	free(one.params);
	free(one.grads);
	(void)all_same;
}

/* A small ALBERT on a stream where each sample repeats one token (drawn
 * per sample among 56): only the context tells a masked token, the
 * unigram entropy being ln 56 = 4.03; the MLM loss must fall below 2.5
 * within STEPS steps (post-LN encoders leave the unigram plateau slowly:
 * 1.7 at 300 steps). */
#define STEPS 300
static void test_learns(void)
{
	kern_config c = small_albert();
	int B = 8, T = c.seq_len, n = kern_mask_raw_per_sample(&c);
	kern_model *m;
	cot_errbuf eb;
	kern_set_threads(2);
	if (kern_model_create(&c, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 5);
	kern_opt_config o;
	kern_opt_default(&o, KERN_OPT_ADAMW);
	o.lr = 3e-3f;
	o.warmup_steps = 0;
	int32_t *raw = xcalloc((size_t)B * n, 4);
	sample_buf s = sbuf(B, T);
	double first = 0, last = 0;
	for (int step = 0; step < STEPS; step++) {
		for (int i = 0; i < B * n; i++)
			raw[i] = (int32_t)(((size_t)step * B + i / n) * 37 % 56);
		kern_mask_build(&c, 9, 0, step, B, raw, (size_t)n, s.ids, s.seg, s.lab, s.sop, &eb);
		kern_enc_batch b = { s.ids, s.seg, s.lab, s.sop, NULL };
		kern_enc_result res;
		kern_opt_stats st;
		kern_zero_grad(m);
		if (kern_enc_forward(m, &b, B, &res, &eb) || kern_enc_backward_scaled(m, 1, &eb) ||
		    kern_opt_step(m, &o, &st, &eb))
			bail_out("training step: %s", eb.msg);
		if (step == 0)
			first = res.mlm_loss;
		last = res.mlm_loss;
	}
	ok(last < 2.5, "a small ALBERT learns from the context: MLM loss %.3f -> %.3f (unigram ln 56 = 4.03)",
	   first, last);
	sfree(&s);
	free(raw);
	kern_model_free(m);
}

/* An ALBERT on bytes (vocab 260, specials 256..259) trained on samples
 * that each repeat one lowercase letter fills "[MASK]" in a run of one
 * letter with that letter; fill_mask refuses what it cannot do. */
static void test_fill_mask(void)
{
	kern_config c = small_albert();
	c.vocab = 260;
	c.seq_len = 24;
	c.cls_id = 256;
	c.sep_id = 257;
	c.mask_id = 258;
	c.pad_id = 259;
	int B = 8, n = kern_mask_raw_per_sample(&c);
	kern_model *m;
	cot_errbuf eb;
	if (kern_model_create(&c, B, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 6);
	kern_opt_config o;
	kern_opt_default(&o, KERN_OPT_ADAMW);
	o.lr = 3e-3f;
	int32_t *raw = xcalloc((size_t)B * n, 4);
	for (int step = 0; step < 300; step++) {
		for (int i = 0; i < B * n; i++)
			raw[i] = 'a' + (int32_t)(((size_t)step * B + i / n) * 7 % 26);
		kern_enc_result res;
		kern_opt_stats st;
		kern_zero_grad(m);
		if (kern_enc_train_stream(m, raw, (size_t)n, B, 4, 0, step, 1, &res, &eb) ||
		    kern_opt_step(m, &o, &st, &eb))
			bail_out("training step: %s", eb.msg);
	}
	fill_result r;
	const char *text = "qqqqqq[MASK]qqqq[MASK]q";
	cot_err rc = fill_mask(m, text, strlen(text), 3, &r, &eb);
	char a[8] = "", b[8] = "";
	if (!rc) {
		fill_token_name(&m->config, r.token[0], a);
		fill_token_name(&m->config, r.token[3], b);
	}
	ok(!rc && r.n_masks == 2 && r.k == 3 && r.position[0] == 7 && r.token[0] == 'q' &&
	           r.token[3] == 'q' && r.prob[0] >= r.prob[1] && r.prob[1] >= r.prob[2],
	   "fill-mask on \"%s\": \"%s\" %.2f and \"%s\" %.2f", text, a, rc ? 0 : r.prob[0], b,
	   rc ? 0 : r.prob[3]);
	if (!rc)
		fill_result_free(&r);
	ok(fill_mask(m, "no mask", 7, 3, &r, &eb) == COT_ERR_INVALID, "a text without [MASK] is refused: %s",
	   eb.msg);
	ok(fill_mask(m, "[MASK] this text is far too long", 33, 3, &r, &eb) == COT_ERR_INVALID,
	   "a text longer than the model is refused: %s", eb.msg);
	ok(fill_mask(m, "a[MASK]", 7, 0, &r, &eb) == COT_ERR_INVALID, "0 predictions are refused: %s",
	   eb.msg);
	char nm[8];
	fill_token_name(&m->config, 258, nm);
	char nm2[8];
	fill_token_name(&m->config, 10, nm2);
	ok(!strcmp(nm, "[MASK]") && !strcmp(nm2, "\\x0a"), "token names: %s, %s", nm, nm2);
	free(raw);
	kern_model_free(m);
}

/* kern_stream_step on an encoder is the masking of the GPT's samples
 * (stride seq_len, keyed by epoch g / mb_per_epoch and microbatch
 * g % mb_per_epoch) and the encoder's passes, bit for bit. */
static void test_stream_step(void)
{
	kern_config c = small_albert();
	int B = 3, T = c.seq_len;
	int64_t g = 17, mpe = 5; /* epoch 3, microbatch 2 */
	kern_model *a, *b;
	cot_errbuf eb;
	if (kern_model_create(&c, B, &a, &eb) || kern_model_create(&c, B, &b, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(a, 3);
	kern_model_init(b, 3);
	int32_t *in = raw_stream((size_t)B * T, 8), *tgt = raw_stream((size_t)B * T, 9);
	float loss = -1;
	cot_err rc = kern_stream_step(a, in, tgt, B, 42, g, mpe, 2.0f, &loss, &eb);
	sample_buf s = sbuf(B, T);
	kern_enc_result res;
	if (kern_mask_build(&c, 42, 3, 2, B, in, (size_t)T, s.ids, s.seg, s.lab, s.sop, &eb))
		bail_out("kern_mask_build: %s", eb.msg);
	kern_enc_batch batch = { s.ids, s.seg, s.lab, s.sop, NULL };
	if (kern_enc_forward(b, &batch, B, &res, &eb) || kern_enc_backward_scaled(b, 2.0f, &eb))
		bail_out("encoder pass: %s", eb.msg);
	ok(rc == COT_OK && loss == (float)res.loss &&
	           !memcmp(a->grads, b->grads, a->n_params * sizeof(float)),
	   "a stream step of an encoder is its masking and passes, bit for bit (loss %.4f)", loss);
	ok(kern_stream_step(a, in, tgt, B, 42, -1, mpe, 1, &loss, &eb) == COT_ERR_INVALID && loss == 0,
	   "a negative microbatch is refused: %s", eb.msg);
	sfree(&s);
	free(in);
	free(tgt);
	kern_model_free(a);
	kern_model_free(b);
}

/* The client's saved copy of a model (its state file) reads back to a
 * config that validates: a GPT's has no encoder fields (unk_id 0), an
 * encoder's its own (a daemon restarted with a GPT project once refused its
 * own model as "a gpt with encoder fields"). */
static void test_stored_round_trip(void)
{
	kern_config cs[3];
	kern_config_default(&cs[0]);
	cs[1] = small_albert();
	cs[2] = small_albert();
	cs[2].position = KERN_POS_RELATIVE_KEY_QUERY;
	for (int i = 0; i < 3; i++) {
		json_t *j = kern_model_config_to_json(&cs[i]);
		kern_config back;
		cot_errbuf eb = { "", "" };
		cot_err rc = j ? kern_model_config_from_json(j, "model", KERN_MODEL_JSON_STORED, &back, &eb)
		               : COT_ERR_NOMEM;
		if (!rc)
			rc = kern_config_validate(&back, &eb);
		ok(!rc && !memcmp(&back, &cs[i], sizeof back),
		   "a %s (%s positions)'s saved model config reads back valid and equal%s%s",
		   kern_arch_name(cs[i].arch), kern_position_name(cs[i].position), rc ? ": " : "",
		   rc ? eb.msg : "");
		json_decref(j);
	}
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);
	plan_lazy();
	diag("%s", kern_backend_get()->describe());
	test_config();
	test_masking();
	test_masking_unk();
	test_inputs();
	test_stored_round_trip();
	/* products above the backend's tiling threshold (1e6 multiply-adds):
	 * B*T = 512 rows x 64 x 256 */
	kern_config a = { .n_layer = 2,
		          .n_shared = 1,
		          .n_head = 4,
		          .d_model = 64,
		          .seq_len = 128,
		          .vocab = 300,
		          .d_ff = 256,
		          .arch = KERN_ARCH_ALBERT,
		          .d_embed = 32,
		          .type_vocab = 2,
		          .cls_id = 296,
		          .sep_id = 297,
		          .mask_id = 298,
		          .pad_id = 299,
		          .unk_id = -1 };
	test_replay("albert", &a, 4);
	kern_config b = a;
	b.arch = KERN_ARCH_BERT;
	b.d_embed = 64;
	b.n_shared = 2;
	test_replay("bert", &b, 4);
	kern_config ar = a, br = b;
	ar.position = KERN_POS_RELATIVE_KEY;
	br.position = KERN_POS_RELATIVE_KEY_QUERY;
	test_replay("albert relative_key", &ar, 4);
	test_replay("bert relative_key_query", &br, 4);
	test_learns();
	test_fill_mask();
	test_stream_step();
	done_testing();
	return exit_status();
}
