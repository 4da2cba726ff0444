/* cotrain-server: Prometheus metrics (text format 0.0.4) at /metrics.
 *
 * Request latencies are counted in process (a fixed-bucket histogram with
 * atomic counters, safe from every worker thread); rounds, samples, hosts
 * and credit are read from the database at scrape time. */
#ifndef COT_SERVER_METRICS_H
#define COT_SERVER_METRICS_H

/* Count one answered request that took ms milliseconds with this status.
 * Call from the HTTP layer's completion callback. */
void metrics_observe(int status, double ms);

#endif
