/* cotrain client: cheating on purpose, a test hook (see cheat.h). */
#include "client/cheat.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/log.h"
#include "shared/common/sketch.h"

typedef enum {
	NONE,
	SKIP_HALF,
	POISON,
	RANDOM_BYTES,
	SCALE_100,
	REPLAY,
	MISMATCH,
	ORTHOGONAL,
	ORTHOGONAL_CLAIM,
	ORTHOGONAL_HIDDEN,
	AGG_NOISE,
	CORRUPT_PIECES,
	BAD_MOMENTS
} cheat;

static const struct {
	const char *name, *what;
} cheats[] = {
	[SKIP_HALF] = { "skip-half", "skips half of its microbatches" },
	[POISON] = { "poison", "sends -5 times its gradient" },
	[RANDOM_BYTES] = { "random-bytes", "sends random values with its gradient's norm in every block" },
	[SCALE_100] = { "scale-100", "sends 100 times its gradient" },
	[REPLAY] = { "replay", "sends the gradient of its previous round again" },
	[MISMATCH] = { "mismatch", "sends a quarter of its gradient, not what its sketches commit" },
	[ORTHOGONAL] = { "orthogonal",
	                 "sends its gradient plus a vector orthogonal to the sketch seed's vectors, "
	                 "committing honest sketches" },
	[ORTHOGONAL_CLAIM] = { "orthogonal-claim",
	                       "sends its gradient plus a vector orthogonal to the sketch seed's vectors, "
	                       "and claims blocks that add up to what it sent" },
	[ORTHOGONAL_HIDDEN] = { "orthogonal-hidden",
	                        "sends its gradient plus a vector orthogonal to the sketch seed's vectors, "
	                        "and, alone in its group, sketches its honest gradient as what it sent" },
	[AGG_NOISE] = { "agg-noise",
	                "adds noise the size of each value to the sums it returns as an aggregator" },
	[CORRUPT_PIECES] = { "corrupt-pieces", "serves checkpoint pieces with one bit changed" },
	[BAD_MOMENTS] = { "bad-moments", "uploads checkpoints of v+1 with altered optimizer moments" },
};

/* RANDOM_BYTES keeps the norm of each block of this many values, so of
 * every aggregator's slice but for its two edge blocks: the outlier
 * refusal, which compares slices' norms, cannot tell it from an honest host. */
#define RANDOM_BLOCK 4096

static cheat mode;
static float *last; /* REPLAY: the gradient of the previous round */
static size_t last_n;
static uint64_t draws; /* RANDOM_BYTES: rounds drawn so far */

cot_err cl_cheat_init(cot_errbuf *eb)
{
	const char *v = getenv("COTRAIN_CHEAT");
	if (!v || !*v)
		return COT_OK;
	for (size_t i = 1; i < sizeof cheats / sizeof cheats[0]; i++)
		if (strcmp(v, cheats[i].name) == 0)
			mode = (cheat)i;
	if (mode == NONE)
		return cot_seterr(eb, COT_ERR_INVALID, "unknown cheat \"%s\" in COTRAIN_CHEAT", v);
	log_warn("test hook COTRAIN_CHEAT=%s: this client %s", v, cheats[mode].what);
	return COT_OK;
}

int cl_cheat_skip(int64_t g) { return mode == SKIP_HALF && (g & 1); }

int cl_cheat_skips(void) { return mode == SKIP_HALF; }

double cl_cheat_result_noise(void) { return mode == AGG_NOISE ? 1.0 : 0; }

int cl_cheat_hidden(void) { return mode == ORTHOGONAL_HIDDEN; }

int cl_cheat_bad_moments(void) { return mode == BAD_MOMENTS; }

void cl_cheat_piece(unsigned char *data, size_t len)
{
	if (mode == CORRUPT_PIECES && len > 0)
		data[len / 2] ^= 0x01;
}

/* r(i) of shared/common/sketch.h under seed: the sign every one of the k
 * vectors gives coordinate i, up to its block's sign a_j(i / 64). */
static double sketch_sign(uint64_t seed, size_t i)
{
	uint64_t w = sketch_mix64(seed + 0x9E3779B97F4A7C15ULL * (uint64_t)(i / 64 + 1));
	return (w >> (i % 64)) & 1 ? -1.0 : 1.0;
}

float *cl_cheat_poison(const float *grad, size_t n, uint64_t sketch_seed)
{
	if (mode != POISON && mode != RANDOM_BYTES && mode != SCALE_100 && mode != REPLAY &&
	    mode != MISMATCH && mode != ORTHOGONAL && mode != ORTHOGONAL_CLAIM && mode != ORTHOGONAL_HIDDEN)
		return NULL;
	float *out = malloc(n * sizeof *out);
	if (!out)
		return NULL;
	double rms = 0; /* RANDOM_BYTES: of grad's block of RANDOM_BLOCK values */
	for (size_t i = 0; i < n; i++) {
		if ((mode == RANDOM_BYTES || mode == ORTHOGONAL || mode == ORTHOGONAL_CLAIM ||
		     mode == ORTHOGONAL_HIDDEN) &&
		    i % RANDOM_BLOCK == 0) {
			size_t m = n - i < RANDOM_BLOCK ? n - i : RANDOM_BLOCK;
			rms = 0;
			for (size_t b = i; b < i + m; b++)
				rms += (double)grad[b] * grad[b];
			rms = sqrt(rms / (double)m);
		}
		double g = grad[i];
		switch (mode) {
		case POISON:
			g *= -5;
			break;
		case SCALE_100:
			g *= 100;
			break;
		case MISMATCH:
			g *= 0.5;
			break;
		case ORTHOGONAL:
		case ORTHOGONAL_CLAIM:
		case ORTHOGONAL_HIDDEN: /* r(i) (+a, -a) on each pair (2t, 2t + 1), which never
		                  * straddles two blocks of 64: r(i) p[i] sums to 0 in each */
			if ((i | 1) < n)
				g += sketch_sign(sketch_seed, i) * ((i & 1) ? -rms : rms);
			break;
		case RANDOM_BYTES: /* random signs, each block's norm: no norm check sees it */
			g = ((sketch_mix64(i + (draws << 40)) & 1) ? -1 : 1) * rms;
			break;
		default:
			g = last && last_n == n ? last[i] : g;
			break;
		}
		out[i] = (float)g;
	}
	draws++;
	if (mode == REPLAY) {
		free(last);
		last = malloc(n * sizeof *last);
		if (last)
			memcpy(last, grad, n * sizeof *last);
		last_n = n;
	}
	return out;
}

void cl_cheat_claim(float *const *blocks, size_t nb, const float *grad, size_t n, uint64_t sketch_seed)
{
	if (mode != ORTHOGONAL_CLAIM || nb == 0)
		return;
	float *sent = cl_cheat_poison(grad, n, sketch_seed);
	for (size_t i = 0; sent && i < n; i++) {
		float share = (sent[i] - grad[i]) / (float)nb;
		for (size_t b = 0; b < nb; b++)
			blocks[b][i] += share;
	}
	free(sent);
}
