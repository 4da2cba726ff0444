/* cotrain client: cheating on purpose, a test hook (doc/client.md, "Test
 * hooks").
 *
 * Off unless the environment variable COTRAIN_CHEAT is set when the client
 * starts (cl_cheat_init):
 *
 *     COTRAIN_CHEAT=skip-half   counts every odd stream microbatch of the
 *         host's own work units as done without computing it, and reports
 *         a made-up sketch for it (a copy of the previous one), adding the
 *         previous microbatch's gradient again, so that the bytes it sends
 *         match its sketches (client/compute.h,
 *         cl_compute_fake_microbatch): only a spot check that recomputes a
 *         skipped microbatch catches it;
 *     COTRAIN_CHEAT=poison      sends -5 times its gradient into the
 *         all-reduce (the direction that raises the loss, with a norm
 *         below the aggregators' outlier limit of 10 times the median).
 *     COTRAIN_CHEAT=random-bytes  sends random values with its gradient's
 *         norm in every block of 4096 values, so in every aggregator's
 *         slice (a new draw each round);
 *     COTRAIN_CHEAT=scale-100     sends 100 times its gradient (above
 *         the outlier limit: with 3 or more contributions the aggregators
 *         refuse it before any sketch is compared);
 *     COTRAIN_CHEAT=replay        sends the gradient of its previous
 *         round (its own gradient in its first);
 *     COTRAIN_CHEAT=mismatch      sends a quarter of its gradient: bytes that
 *         differ from the sketches it committed, within every norm limit;
 *     COTRAIN_CHEAT=orthogonal    sends g + p, p orthogonal to every one of
 *         the k vectors of the work unit's sketch seed (in each block of 64
 *         values, r(i) times +-a, a the rms of its gradient's 4096-value
 *         block: each block's signed sum, which all k projections share,
 *         is 0), and commits honest sketches: every check under that seed
 *         passes; the check under the second seed catches it;
 *     COTRAIN_CHEAT=orthogonal-claim  sends what orthogonal sends, and
 *         claims, under the second seed, blocks that add up to it (p
 *         spread evenly over its blocks, cl_cheat_claim): the check of the
 *         bytes under the second seed passes; a spot check of any of its
 *         blocks catches it;
 *     COTRAIN_CHEAT=orthogonal-hidden  sends what orthogonal sends, but
 *         alone in its group (allreduce_alone on the server's path) it
 *         sketches, and keeps for the second seed, its honest gradient as
 *         what it sent and received (cl_cheat_hidden), so that its own
 *         sketches agree under both seeds: only the server's sketch of the
 *         sum it uploaded, under the second seed, catches it;
 *     COTRAIN_CHEAT=bad-moments   uploads, when the server asks it for the
 *         round's checkpoint of v+1 (across groups between the peers), one
 *         whose first moment is off by 1 in its first value
 *         (cl_cheat_bad_moments): the check against the peers' moments
 *         hash refuses it and another peer is asked;
 *     COTRAIN_CHEAT=agg-noise     as an aggregator, adds noise the size of
 *         each value to the sum it returns
 *         (allreduce_params.test_result_noise);
 *     COTRAIN_CHEAT=corrupt-pieces  serves pieces of the checkpoints it
 *         holds with one bit changed (client/piece_server.h): the joiner's
 *         check against the manifest refuses them.
 * The sketch checks of the averaged bytes catch random-bytes, replay,
 * mismatch and agg-noise, the outlier refusal scale-100 (doc/credit.md,
 * "Tied to the bytes"), the check under the second seed orthogonal, a
 * spot check of a block orthogonal-claim, the server's own sketch under
 * the second seed orthogonal-hidden.
 *
 * The vectors sent apply alone in a group too (allreduce_alone: the group's
 * sum the server steps on), where the host still reports the sketches of
 * what it sent.
 *
 * Spot checks the host answers for other hosts are computed honestly.  A
 * warning is logged at start, so that a test sees it is on.
 *
 * It lets the tests show that spot checks catch such a host.  It gives a
 * volunteer nothing a modified client would not have. */
#ifndef CL_CHEAT_H
#define CL_CHEAT_H

#include <stddef.h>
#include <stdint.h>

#include "shared/common/error.h"

/* Read COTRAIN_CHEAT once (before any thread starts).  COT_OK when it is
 * unset or names a known cheat; COT_ERR_INVALID with the reason else. */
cot_err cl_cheat_init(cot_errbuf *eb);

/* 1 when stream microbatch g of the host's own work is to be skipped. */
int cl_cheat_skip(int64_t g);

/* 1 with skip-half: the session keeps each computed microbatch's gradient
 * for the faked one after it (cl_compute_fake_microbatch). */
int cl_cheat_skips(void);

/* With a cheat that sends other bytes (poison, random-bytes, scale-100,
 * replay, mismatch, orthogonal), a malloc'd vector of n values the host
 * sends instead of grad[0..n) (the caller frees it); else NULL (send
 * grad).  sketch_seed: the work unit's (orthogonal's p vanishes under it).
 * Called once a round (replay keeps grad for the next). */
float *cl_cheat_poison(const float *grad, size_t n, uint64_t sketch_seed);

/* With orthogonal-claim, add to each of the nb kept blocks[b][0..n) its
 * share of what it sends beyond grad (the false claim about its
 * microbatches); else nothing. */
void cl_cheat_claim(float *const *blocks, size_t nb, const float *grad, size_t n, uint64_t sketch_seed);

/* With agg-noise, the relative noise our aggregator adds to its sums; 0. */
double cl_cheat_result_noise(void);

/* orthogonal-hidden: true when a peer alone in its group sketches its
 * honest gradient and uploads cl_cheat_poison's vector as its group sum. */
int cl_cheat_hidden(void);

/* bad-moments: true when the checkpoint of v+1 this host uploads is to
 * carry altered moments. */
int cl_cheat_bad_moments(void);

/* With corrupt-pieces, flip one bit of a piece about to be served. */
void cl_cheat_piece(unsigned char *data, size_t len);

#endif
