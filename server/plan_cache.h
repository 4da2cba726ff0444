/* cotrain-server: the plan cache.  When a round is planned, a thousand held
 * plan polls wake at once (doc/scale.md, runs N), and each would run
 * round_plan_get, one query per host.  Instead every member's answer is
 * fetched in one query (round_plan_all): by the coordinator as it stores
 * the plan, before it wakes the polls, and in another server process by the
 * first look that finds the plan; the others are answered from memory.
 *
 * A snapshot serves at the wake generation of the plan polls (http_wake_gen)
 * it was fetched or last checked at: every change to a plan's answer wakes
 * them, in this process at once and from another process through the
 * coordinator's watch.  After a wake-up the first look checks the round's
 * stamp (round_plan_stamp, one small query) and keeps the snapshot when it
 * did not change.  A snapshot serves for at most PLAN_CACHE_MAX_AGE_S
 * seconds after its fetch, and holds only hosts whose token was valid then;
 * the caller uses it only for requests whose token the database accepted on
 * an earlier look (a held poll woken again), so a revocation takes at most
 * that long to refuse a held poll.  Thread-safe. */
#ifndef COT_SERVER_PLAN_CACHE_H
#define COT_SERVER_PLAN_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#define PLAN_CACHE_MAX_AGE_S 2.0

/* Host's answer (round_plan_get's 200 body) in round version of project,
 * from a snapshot valid at wake generation gen (read before this call;
 * checking the round's stamp may take one query on this thread's database
 * connection): a malloc'd copy of *len bytes (the caller frees it),
 * *has_gradient telling whether the mean gradient was in.  NULL when there
 * is none, or when token_param (the request's bearer hash, "\\x" + 64 hex
 * as api_bearer writes it) is not the host's. */
char *plan_cache_get(const char *project, long long version, long long host, const char *token_param,
                     unsigned long gen, size_t *len, bool *has_gradient);

/* Fetch round version of project's answers for every member into the
 * cache, valid at wake generation gen (read before the look that found the
 * plan), on this thread's database connection.  Does nothing when a valid
 * snapshot is there or another thread is busy with one; a failed fetch is
 * logged and leaves the looks to the database. */
void plan_cache_fill(const char *project, long long version, unsigned long gen);

#endif
