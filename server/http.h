/* cotrain-server: the HTTP layer over libmicrohttpd.
 *
 * A thread pool of epoll event loops (MHD_USE_EPOLL_INTERNAL_THREAD |
 * MHD_ALLOW_SUSPEND_RESUME); each worker thread handles its connections start
 * to end, so a handler may block on the database (its thread's own
 * connection, server/dbconn.h).  The layer reads the request body up to
 * config->body_limit (413 beyond), matches the route (404, 405), then calls
 * the route's handler once with the whole request.  A handler answers with
 * exactly one http_reply_* call; one that answers nothing gets a 500. */
#ifndef COT_SERVER_HTTP_H
#define COT_SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "server/settings.h"
#include "shared/common/error.h"

#define HTTP_MAX_PARAMS 4

typedef struct http_req http_req;
typedef struct http_server http_server;

/* One request as handlers see it.  Every pointer stays valid until the
 * handler returns; nothing here is owned by the handler. */
struct http_req {
	const char *method;                  /* "GET", "POST", ... */
	const char *path;                    /* without the query string */
	const char *params[HTTP_MAX_PARAMS]; /* the route's {} segments, in order */
	int nparams;
	const char *body; /* NUL-terminated; "" when none */
	size_t body_len;
	const srv_config *cfg;
	void *priv; /* the layer's connection state */
	/* Set while the handler is called before the body is read (routes whose
	 * body limit exceeds --body-limit, router_body_limit): it may refuse by
	 * answering, or answer nothing to have the body read and be called again
	 * with early false. */
	bool early;
	/* A handler called early may set the exact (or largest) size the body
	 * may have when it knows it better than the route's limit: a larger
	 * body, chunked or not, is refused as soon as it passes that size,
	 * without being held in memory. */
	size_t body_max;
	double hold_until;  /* long polls (http_hold); 0 until set */
	int hold_kind;      /* what a long poll waits on (HTTP_HOLD_*); HTTP_HOLD_PLAN unless set */
	long long hold_tag; /* whom it waits for (a host id) for http_wake_tag; 0: nobody */
};

/* Value of a request header (case-insensitive name), or NULL. */
const char *http_header(const http_req *req, const char *name);

/* Value of a cookie the request carries, or NULL. */
const char *http_cookie(const http_req *req, const char *name);

/* The client's address as text ("" when unknown). */
void http_client_ip(const http_req *req, char *out, size_t len);

/* Value of a query-string argument (?name=value, decoded), or NULL. */
const char *http_query(const http_req *req, const char *name);

/* Answer with a JSON value; takes ownership of body (json_decref'd here). */
void http_reply_json(http_req *req, int status, json_t *body);
/* Answer with len bytes of already serialised JSON (copied). */
void http_reply_raw(http_req *req, int status, const char *json, size_t len);
/* Answer with {"error": {"code", "message", "hint"}}; hint may be NULL. */
void http_reply_error(http_req *req, int status, const char *code, const char *message, const char *hint);
/* The same for a cot_err: the status and code follow the error (400 for
 * invalid, 401 auth, 403 forbidden, 404 not found, 409 conflict/exists, 413
 * too large, 503 database, 500 otherwise); the message and hint come from eb. */
void http_reply_cot(http_req *req, cot_err e, const cot_errbuf *eb);
/* Answer with a prepared MHD_Response (struct MHD_Response *, passed as void *
 * so this header needs no microhttpd.h); the reference is taken over. */
void http_reply_response(http_req *req, int status, void *response);

/* Add a header to the answer already given (no-op when there is none). */
void http_add_header(http_req *req, const char *name, const char *value);

/* Long polls.  A handler with nothing to answer yet may hold the request
 * instead: set req->hold_kind, read gen = http_wake_gen(req)
 * before looking at the state, set req->hold_until (CLOCK_MONOTONIC seconds,
 * http_now()) on the first call, then call http_hold(req, gen).  When it
 * returns true the connection is suspended (no thread waits) and the
 * handler must return without answering; the layer calls it again with the
 * same req after the next wake-up of its kind (http_wake, from any thread)
 * or at hold_until, whichever comes first.  It returns false (answer now,
 * after looking again) when a wake-up of its kind came since gen was read,
 * hold_until has passed, or the server is stopping.
 *
 * The kinds: a wake-up resumes only the held requests of the kinds it
 * names, so that a change one kind waits on does not make the thousands of
 * others look again (each look is a query; at 1,000 hosts the looks of
 * held requests that had nothing new to see took more of the server's
 * threads than every other call together, doc/scale.md). */
enum {
	HTTP_HOLD_PLAN,    /* plan polls and close notices: a round closed, planned, its mean in */
	HTTP_HOLD_OUTCOME, /* outcome polls: the round's v+1 in, its uploader named, a commit */
	HTTP_HOLD_WORK,    /* work requests: a round opened, reran, or its target freed up */
	HTTP_HOLD_KINDS
};
#define HTTP_WAKE(kind) (1u << (kind))
#define HTTP_WAKE_ALL ((1u << HTTP_HOLD_KINDS) - 1)
double http_now(void);
unsigned long http_wake_gen(const http_req *req);
/* The wake generation of the held requests of kind (HTTP_HOLD_*), as
 * http_wake_gen gives a request of that kind. */
unsigned long http_wake_gen_of(int kind);
bool http_hold(http_req *req, unsigned long gen);
/* Resume every held request of the kinds in mask (HTTP_WAKE bits): they
 * look at the state again.  Thread-safe; a no-op when none is held. */
void http_wake(unsigned mask);
/* Resume the held requests of the kinds in mask whose hold_tag is tag (tag
 * > 0): news for one host, such as the peer asked for a round's v+1, wakes
 * its poll and not the thousand others of its kind.  The kinds' generations
 * move as in http_wake, so a request of those kinds between its look and
 * its hold looks again. */
void http_wake_tag(unsigned mask, long long tag);
/* http_wake(HTTP_WAKE_ALL): a change every kind may wait on (a commit, a
 * failure, a round opened). */
void http_wake_held(void);

/* HTTP status for a cot_err, as above. */
int http_status_for(cot_err e);

/* Start the daemon on cfg->listen:cfg->port.  On success *out owns it and
 * http_port() tells the bound port.  COT_ERR_INVALID for a bad address,
 * COT_ERR_IO when it cannot bind. */
cot_err http_start(const srv_config *cfg, http_server **out, cot_errbuf *eb);
int http_port(const http_server *s);
/* Stop accepting, finish or drop every connection, join the workers, free s. */
void http_stop(http_server *s);

#endif
