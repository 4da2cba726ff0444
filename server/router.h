/* cotrain-server: the route table of the v1 API.
 *
 * Routes are a method plus a path pattern of '/'-separated segments where
 * "{}" matches one non-empty segment (an id or a name).  router_match finds
 * the handler for a request and fills req->params; it tells apart an unknown
 * path (404) from a known path with another method (405, with the methods
 * that are allowed). */
#ifndef COT_SERVER_ROUTER_H
#define COT_SERVER_ROUTER_H

#include "server/http.h"

typedef void (*route_handler)(http_req *req);

typedef enum { ROUTE_FOUND, ROUTE_NO_PATH, ROUTE_NO_METHOD } route_result;

/* Match req->method and req->path.  On ROUTE_FOUND *h is the handler and
 * req->params/nparams point into a copy of the path kept in pathbuf
 * (pathlen bytes, must outlive the request).  On ROUTE_NO_METHOD, allow
 * (allowlen bytes) receives the allowed methods, comma-separated.  Paths
 * longer than pathlen-1 are ROUTE_NO_PATH. */
route_result router_match(http_req *req, char *pathbuf, size_t pathlen, route_handler *h, char *allow,
                          size_t allowlen);

/* The largest request body accepted for handler h: dflt (--body-limit)
 * except for routes that take bulk bytes (a round's gradient,
 * API_GRADIENT_MAX_BYTES), whose handlers check the exact length, and a
 * work unit's report with its sketches (API_REPORT_MAX_BYTES). */
size_t router_body_limit(route_handler h, size_t dflt);

#endif
