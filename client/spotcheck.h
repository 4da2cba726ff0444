/* cotrain client: answering spot checks (doc/api.md "Spot checks";
 * doc/credit.md).
 *
 * The server picks, after a round committed, some of a host's work ranges
 * to check: the host and a second host (the checker) each recompute the
 * range's gradient on the round's checkpoint and send its fingerprint
 * (shared/common/fingerprint.h); the host's credit for the round waits until both
 * agree.  A client answers the checks of its own work and, now and then,
 * claims one check of another host's work.
 *
 * Recomputing needs the checkpoint named by the check and the dataset shards
 * that hold the range, found through the dataset's manifest; all of them go
 * through the download cache. */
#ifndef CL_SPOTCHECK_H
#define CL_SPOTCHECK_H

#include "client/api.h"
#include "client/shard_cache.h"
#include "client/state.h"

/* Answer every check of project p's own work that waits for us, then claim
 * and answer at most one check of another host's work.  *answered gets how
 * many fingerprints were sent.  Errors as the API's (the first one stops the
 * pass; the checks stay open on the server and are tried again later). */
cot_err cl_spotchecks_run(const cl_api_opts *o, const cl_project *p, const cl_fetch_env *env, int *answered,
                          cot_errbuf *eb);

#endif
