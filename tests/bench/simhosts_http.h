/* simhosts: one simulated host's HTTP calls to cotrain-server, with the
 * latency and bytes of each call kept for the benchmark's figures. */
#ifndef COTRAIN_SIMHOSTS_HTTP_H
#define COTRAIN_SIMHOSTS_HTTP_H

#include <stddef.h>
#include <stdio.h>

#include <curl/curl.h>
#include <jansson.h>

/* What each call is, for the latency log: a long poll is held by design and
 * is not an API latency. */
typedef enum { SIM_CALL_PLAIN, SIM_CALL_LONGPOLL } sim_call_kind;

typedef struct {
	CURL *curl;         /* one keep-alive handle per host */
	const char *base;   /* "http://127.0.0.1:PORT" */
	const char *bearer; /* account key or host token */
	FILE *lat;          /* shared latency log (locked per line), or NULL */
	double bytes;       /* request and answer bytes, headers included */
	int fresh;          /* a new connection for each call, as cotrain-client makes */
} sim_http;

/* One request: METHOD base+path with a JSON body (json, may be NULL) or raw
 * bytes (raw/rawlen), held at most timeout_s.  Returns the HTTP status (0
 * when the transport failed); *answer gets the parsed JSON answer (at most
 * 4 MiB), owned by the caller, or NULL when there was none; without answer
 * the body is counted and dropped.  Appends
 * "start_epoch ms kind status path" to h->lat. */
long sim_http_call(sim_http *h, const char *method, const char *path, json_t *json, const void *raw,
                   size_t rawlen, long timeout_s, sim_call_kind kind, json_t **answer);

/* Wall-clock seconds since the epoch (the server's timestamps compare). */
double sim_now(void);

#endif
