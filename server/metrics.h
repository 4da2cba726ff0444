/* cotrain-server: Prometheus metrics (text format 0.0.4) at /metrics.
 *
 * Request latencies are counted in process (a fixed-bucket histogram with
 * atomic counters, safe from every worker thread); rounds, samples, hosts
 * and credit are read from the database at scrape time. */
#ifndef COT_SERVER_METRICS_H
#define COT_SERVER_METRICS_H

#include <stdbool.h>

/* Count one answered request that took ms milliseconds with this status.
 * Call from the HTTP layer's completion callback. */
void metrics_observe(int status, double ms);

/* Count bytes of gradients (group sums) and of peers' checkpoints of v+1
 * the server kept: with averaging across groups between the peers the
 * first stays 0. */
void metrics_gradient_bytes(unsigned long long n);
void metrics_checkpoint_bytes(unsigned long long n);

/* Count one round plan answered (200), from the plan cache or the database
 * (server/plan_cache.h). */
void metrics_plan_answer(bool cached);

#endif
