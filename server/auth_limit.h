/* cotrain-server: the price of a password.  Creating an account and
 * logging in each cost a password hash (PBKDF2, --kdf-iterations): on
 * purpose slow.  Without a bound, anyone could keep every worker thread
 * hashing and slow every other request.  So:
 *
 *   - each client address may start --auth-per-minute (N) such requests
 *     at once, then one every 60 / N seconds (a token bucket; 429 with
 *     Retry-After beyond that; N = 0 is no cap);
 *   - at most threads - 1 hashes run at once (at least one worker stays
 *     free for everything else); a request that finds no slot within
 *     AUTH_WAIT_MS gets 503 with Retry-After.
 *
 * A reverse proxy in front makes every client one address: give the
 * server a larger pool of threads there, or rate-limit at the proxy. */
#ifndef COT_SERVER_AUTH_LIMIT_H
#define COT_SERVER_AUTH_LIMIT_H

#include <stdbool.h>

#include "server/http.h"

#define AUTH_WAIT_MS 2000

typedef enum {
	AUTH_LIMIT_OK,   /* may hash now: call auth_limit_leave() after */
	AUTH_LIMIT_RATE, /* the address is over its rate (429) */
	AUTH_LIMIT_BUSY  /* no hashing slot came free in time (503) */
} auth_limit_verdict;

/* Take a hashing slot for req without answering it; *retry_after gets the
 * seconds to wait when the verdict is not AUTH_LIMIT_OK. */
auth_limit_verdict auth_limit_take(http_req *req, int *retry_after);

/* The same, answering the request (JSON 429 or 503 with Retry-After) when
 * it may not hash: true when it may (call auth_limit_leave() after). */
bool auth_limit_enter(http_req *req);
void auth_limit_leave(void);

#endif
