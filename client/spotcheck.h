/* cotrain client: answering spot checks (doc/api.md "Spot checks";
 * doc/credit.md).
 *
 * The server picks, after a round committed, some of a host's work ranges
 * to check.  When the host committed the sketch of each microbatch with its
 * report, the check names a few of them: a checker (and, on a dispute, a
 * third host) recomputes only those on the round's checkpoint and sends
 * their sketches (shared/common/sketch.h).  Otherwise (local mode) the host
 * and the checker each recompute the whole range's gradient and send its
 * fingerprint (shared/common/fingerprint.h).  The host's credit for the
 * round waits until the check agrees.  A client answers the checks of its
 * own work and, now and then, claims one check of another host's work.
 *
 * Recomputing needs the checkpoint named by the check and the dataset shards
 * that hold the range, found through the dataset's manifest; all of them go
 * through the download cache. */
#ifndef CL_SPOTCHECK_H
#define CL_SPOTCHECK_H

#include "client/api.h"
#include "client/backoff.h"
#include "client/shard_cache.h"
#include "client/state.h"

/* A check being recomputed: its session and how far it got.  Kept by the
 * caller between passes, so a check larger than one pass's budget goes on
 * where the last pass stopped. */
typedef struct cl_spot_job cl_spot_job;

void cl_spot_job_free(cl_spot_job *j);

/* Answer project p's spot checks for at most budget_s seconds of wall
 * time, stopping early when *cancel is set: go on with *job (when not
 * NULL), then the checks of our own work that wait for us, then claim
 * checks of other hosts' work, one at a time.  Computing stops between
 * microbatches; an unfinished check stays in *job for the next pass.  The
 * caller runs passes only while it holds no work unit and no gradient a
 * round waits for, so a check never delays its own work (doc/client.md).
 * *answered gets how many fingerprints were sent.  Errors as the API's
 * (the first one stops the pass; the check stays open on the server and is
 * tried again later, from its start).  Each microbatch is followed by the
 * rest of the time_percent duty cycle (client/throttle.h). */
cot_err cl_spotchecks_run(const cl_api_opts *o, const cl_project *p, const cl_fetch_env *env,
                          cl_spot_job **job, double budget_s, int time_percent, volatile int *cancel,
                          int *answered, cot_errbuf *eb);

/* Check one spot check c (borrowed) of project p as the server sent it,
 * as a pass does before acting on it.  COT_ERR_NETWORK with the detail
 * when it is malformed or names another project.  Exposed for the fuzz
 * harness (tests/fuzz/fuzz_spotcheck.c). */
cot_err cl_spot_check_parse(const json_t *c, const cl_project *p, cot_errbuf *eb);

/* The stream positions of the tokens that microbatches [lo, hi) of project
 * p read (shared/common/microbatch.h), as runs [first[i], last[i]], last
 * inclusive (the last target token): one run, or two when the range passes
 * an epoch's end and wraps to its start.  Returns the number of runs, or -1
 * with COT_ERR_NETWORK in eb when p's stream geometry does not pass
 * mb_shape_check (so every position fits in 2^62) or the range is empty or
 * longer than an epoch.  The spot check picks the shards it downloads by
 * these runs. */
int cl_spot_token_runs(const cl_project *p, int64_t lo, int64_t hi, uint64_t first[2], uint64_t last[2],
                       cot_errbuf *eb);

#endif
