/* Tests for kernels/tokenizer and kernels/generate: byte round trips of
 * any text, the sampler on fixed logits, and generation with a tiny
 * random-init model (determinism, seeds, lengths, the window). */
#include "kernels/generate.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/model.h"
#include "kernels/tokenizer.h"
#include "tests/tap.h"

static void round_trip(const char *text, size_t len, const char *what)
{
	int32_t tok[512];
	char back[513];
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	if (len > 512)
		bail_out("text too long");
	size_t n = tok_encode(text, len, tok);
	int in_range = 1, same = 1;
	for (size_t i = 0; i < n; i++) {
		in_range &= tok[i] >= 0 && tok[i] < TOK_VOCAB;
		same &= tok[i] == (unsigned char)text[i];
	}
	ok(n == len && in_range && same, "%s: %zu bytes give %zu byte tokens", what, len, n);
	memset(back, 'x', sizeof back);
	cot_err rc = tok_decode(tok, n, back, &eb);
	ok(rc == COT_OK && memcmp(back, text, len) == 0 && back[len] == '\0', "%s: decodes to the same bytes",
	   what);
}

static void test_tokenizer(void)
{
	const char *utf8 = "héllo, мир, 世界 🌍\n";
	round_trip(utf8, strlen(utf8), "UTF-8 with 2-, 3- and 4-byte sequences");
	is_int((long long)tok_encode("é", 2, (int32_t[2]){ 0 }), 2, "a 2-byte character is 2 tokens");
	static const char invalid[] = "a\xff\xfe\x80\xc3(\xed\xa0\x80\0z";
	round_trip(invalid, sizeof invalid - 1, "invalid UTF-8 and a NUL byte");
	round_trip("", 0, "empty text");
	char all[256];
	for (int i = 0; i < 256; i++)
		all[i] = (char)i;
	round_trip(all, 256, "every byte value");

	int32_t bad[3] = { 65, 256, 66 };
	char out[4];
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	is_int(tok_decode(bad, 3, out, &eb), COT_ERR_INVALID, "token 256 refused");
	ok(strstr(eb.msg, "position 1") != NULL, "detail names it: %s", eb.msg);
	bad[1] = -1;
	is_int(tok_decode(bad, 3, out, &eb), COT_ERR_INVALID, "token -1 refused");
	is_str(TOK_NAME, "byte", "tokenizer name");
}

static void test_rng(void)
{
	gen_rng a, b;
	gen_rng_seed(&a, 0);
	/* splitmix64's published first output for seed 0. */
	ok(gen_rng_next(&a) == 0xe220a8397b1dcdafull, "splitmix64 reference");
	gen_rng_seed(&a, 12345);
	gen_rng_seed(&b, 12345);
	int same = 1, in_unit = 1;
	for (int i = 0; i < 1000; i++) {
		double u = gen_rng_uniform(&a);
		same &= u == gen_rng_uniform(&b);
		in_unit &= u >= 0.0 && u < 1.0;
	}
	ok(same && in_unit, "same seed, same uniforms in [0, 1)");
}

static void test_sampler(void)
{
	float lg[8] = { 0, 5, 5, 1, -2, 3, 4, -1 };
	gen_options o = { .top_k = 1, .temperature = 1.0f };
	gen_rng r;
	gen_rng_seed(&r, 1);
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	int32_t t = -1;
	is_int(gen_sample(lg, 8, &o, &r, &t, &eb), COT_OK, "greedy sample");
	is_int(t, 1, "greedy takes the largest logit, lower index on ties");
	o.top_k = 0;
	o.temperature = 0;
	gen_sample(lg, 8, &o, &r, &t, &eb);
	is_int(t, 1, "temperature 0 is greedy too");

	/* top-k 3 of {5, 5, 4, ...}: only 1, 2, 6, with softmax odds. */
	o.top_k = 3;
	o.temperature = 1.0f;
	int count[8] = { 0 };
	const int N = 20000;
	for (int i = 0; i < N; i++) {
		if (gen_sample(lg, 8, &o, &r, &t, &eb) || t < 0 || t >= 8)
			bail_out("sampling failed: %s", eb.msg);
		count[t]++;
	}
	ok(count[0] + count[3] + count[4] + count[5] + count[7] == 0, "top-3 never draws outside the top 3");
	double z = 2 * exp(5.0) + exp(4.0), p1 = exp(5.0) / z, p6 = exp(4.0) / z;
	ok(fabs(count[1] / (double)N - p1) < 0.02 && fabs(count[2] / (double)N - p1) < 0.02 &&
	           fabs(count[6] / (double)N - p6) < 0.02,
	   "frequencies follow softmax: %d %d %d of %d (p %.3f %.3f)", count[1], count[2], count[6], N, p1,
	   p6);

	/* A high temperature flattens the odds; a low one sharpens them. */
	o.top_k = 0;
	o.temperature = 100.0f;
	memset(count, 0, sizeof count);
	for (int i = 0; i < N; i++) {
		gen_sample(lg, 8, &o, &r, &t, &eb);
		count[t]++;
	}
	int all_seen = 1;
	for (int i = 0; i < 8; i++)
		all_seen &= count[i] > N / 8 / 2;
	ok(all_seen, "temperature 100 draws every token often");
	o.temperature = 0.01f;
	memset(count, 0, sizeof count);
	for (int i = 0; i < 1000; i++) {
		gen_sample(lg, 8, &o, &r, &t, &eb);
		count[t]++;
	}
	ok(count[1] + count[2] == 1000, "temperature 0.01 keeps the top logits");

	float nan_lg[3] = { 0, NAN, 1 };
	is_int(gen_sample(nan_lg, 3, &o, &r, &t, &eb), COT_ERR_INVALID, "NaN logits refused");
	ok(strstr(eb.msg, "diverged") != NULL, "detail: %s", eb.msg);
	float ninf[3] = { -INFINITY, -INFINITY, -INFINITY };
	is_int(gen_sample(ninf, 3, &o, &r, &t, &eb), COT_OK, "all -Inf logits still give a token");
	o.top_k = -1;
	is_int(gen_sample(lg, 8, &o, &r, &t, &eb), COT_ERR_INVALID, "negative top-k refused");
	o.top_k = 2;
	o.temperature = -1;
	is_int(gen_sample(lg, 8, &o, &r, &t, &eb), COT_ERR_INVALID, "negative temperature refused");
}

static void test_generate(void)
{
	kern_config c = { .n_layer = 2,
		          .n_shared = 2,
		          .n_head = 2,
		          .d_model = 16,
		          .seq_len = 8,
		          .vocab = TOK_VOCAB,
		          .d_ff = 64 };
	kern_model *m;
	cot_errbuf eb;
	memset(&eb, 0, sizeof eb);
	if (kern_model_create(&c, 1, &m, &eb))
		bail_out("kern_model_create: %s", eb.msg);
	kern_model_init(m, 42);

	const char *prompt = "Hello";
	int32_t ptok[64], out1[40], out2[40], out3[40];
	int np = (int)tok_encode(prompt, strlen(prompt), ptok);

	gen_options o = { .n_tokens = 40, .top_k = 1, .temperature = 1.0f, .seed = 1 };
	eb.msg[0] = '\0';
	is_int(gen_generate(m, ptok, np, &o, out1, &eb), COT_OK, "greedy: %s", eb.msg);
	o.seed = 99; /* greedy ignores the seed */
	is_int(gen_generate(m, ptok, np, &o, out2, &eb), COT_OK, "greedy again");
	ok(memcmp(out1, out2, sizeof out1) == 0, "greedy is deterministic");
	int in_range = 1;
	for (int i = 0; i < 40; i++)
		in_range &= out1[i] >= 0 && out1[i] < TOK_VOCAB;
	ok(in_range, "greedy tokens are bytes");

	/* Greedy's first token is the argmax of one forward pass. */
	int32_t win[8] = { 0 };
	memcpy(win, ptok, (size_t)np * sizeof *win);
	float loss;
	if (kern_forward(m, win, NULL, 1, &loss, &eb))
		bail_out("kern_forward: %s", eb.msg);
	const float *lg = kern_logits(m) + (size_t)(np - 1) * TOK_VOCAB;
	int best = 0;
	for (int i = 1; i < TOK_VOCAB; i++)
		if (lg[i] > lg[best])
			best = i;
	is_int(out1[0], best, "first greedy token is the argmax of the logits");

	/* What follows the prompt cannot see the padding after it. */
	float saved[TOK_VOCAB];
	memcpy(saved, lg, sizeof saved);
	for (int i = np; i < 8; i++)
		win[i] = 200 + i;
	kern_forward(m, win, NULL, 1, &loss, &eb);
	ok(memcmp(saved, kern_logits(m) + (size_t)(np - 1) * TOK_VOCAB, sizeof saved) == 0,
	   "padding after the prompt is not seen");

	o.top_k = 40;
	o.seed = 7;
	memset(out1, 0xff, sizeof out1);
	is_int(gen_generate(m, ptok, np, &o, out1, &eb), COT_OK, "top-k 40");
	is_int(gen_generate(m, ptok, np, &o, out2, &eb), COT_OK, "top-k 40 again, same seed");
	ok(memcmp(out1, out2, sizeof out1) == 0, "same seed repeats");
	o.seed = 8;
	is_int(gen_generate(m, ptok, np, &o, out3, &eb), COT_OK, "another seed");
	ok(memcmp(out1, out3, sizeof out1) != 0, "different seeds differ");
	in_range = 1;
	for (int i = 0; i < 40; i++)
		in_range &= out1[i] >= 0 && out1[i] < TOK_VOCAB;
	ok(in_range, "all 40 sampled tokens are bytes (none left unwritten)");

	/* Exactly n_tokens are written. */
	int32_t out4[11];
	out4[10] = -7;
	o.n_tokens = 10;
	is_int(gen_generate(m, ptok, np, &o, out4, &eb), COT_OK, "10 tokens");
	ok(out4[10] == -7 && memcmp(out4, out3, 10 * sizeof *out4) == 0,
	   "10 tokens written, the same as the first 10 of 40");
	o.n_tokens = 0;
	is_int(gen_generate(m, ptok, np, &o, out4, &eb), COT_OK, "zero tokens");

	/* Only the last seq_len tokens of a long prompt are seen. */
	const char *longp = "The quick brown fox jumps over the lazy dog";
	const char *otherp = "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXlazy dog";
	int32_t lt[64], ot[64];
	int nl = (int)tok_encode(longp, strlen(longp), lt);
	int no = (int)tok_encode(otherp, strlen(otherp), ot);
	o.n_tokens = 20;
	o.top_k = 1;
	gen_generate(m, lt, nl, &o, out1, &eb);
	gen_generate(m, ot, no, &o, out2, &eb);
	ok(memcmp(out1, out2, 20 * sizeof *out1) == 0,
	   "a long prompt is seen through a window of seq_len tokens");

	int32_t empty[1] = { 0 };
	o.n_tokens = 5;
	is_int(gen_generate(m, empty, 0, &o, out1, &eb), COT_ERR_INVALID, "empty prompt refused");
	int32_t badp[2] = { 65, 256 };
	is_int(gen_generate(m, badp, 2, &o, out1, &eb), COT_ERR_INVALID, "out-of-vocabulary prompt refused");
	ok(strstr(eb.msg, "position 1") != NULL, "detail: %s", eb.msg);
	o.n_tokens = -1;
	is_int(gen_generate(m, ptok, np, &o, out1, &eb), COT_ERR_INVALID, "negative token count refused");
	kern_model_free(m);
}

int main(void)
{
	plan_lazy();
	test_tokenizer();
	test_rng();
	test_sampler();
	test_generate();
	done_testing();
	return exit_status();
}
