/* simhosts: the simulated peers' side of averaging across groups between
 * the peers (cotrain-server --round-cross-peers; doc/averaging.md, "Across
 * groups").  The round's mean is a stand-in, the same for every simulated
 * host of a round; v+1 is real: the optimizer step of the project's config
 * on checkpoint v with that mean, so that every host reports the same
 * params_sha256 and the peer the server asks uploads a checkpoint it loads
 * and checks. */
#ifndef COTRAIN_SIMHOSTS_STEP_H
#define COTRAIN_SIMHOSTS_STEP_H

#include <stddef.h>

typedef struct sim_step {
	long long version, attempt;
	char mean_sha[65];   /* sha256 of the stand-in mean (param_count fp32) */
	char params_sha[65]; /* sha256 of v+1's parameters */
	void *ckpt;          /* the checkpoint file of v+1 */
	size_t ckpt_len;
	struct sim_step *next;
} sim_step;

/* The step of round (version, attempt) of project `project`, computed on
 * first use (one at a time for the whole process) and kept until
 * sim_step_free_all: checkpoint ckpt_sha (version's, from the work unit) and
 * the project's config are fetched from base with bearer on a connection
 * of their own, whose bytes are not counted as a host's (a real peer holds
 * them already).  Returns NULL (and prints why) when it cannot, or when the
 * checkpoint does not have param_count parameters. */
const sim_step *sim_step_get(const char *base, const char *bearer, const char *project, long long version,
                             long long attempt, const char *ckpt_sha, long long param_count);

void sim_step_free_all(void);

#endif
