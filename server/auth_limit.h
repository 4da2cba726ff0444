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

/* Take a hashing slot for req: true when it may hash now (call
 * auth_limit_leave() after), false when it was answered (429 or 503). */
bool auth_limit_enter(http_req *req);
void auth_limit_leave(void);

#endif
