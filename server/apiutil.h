/* cotrain-server: what every API handler needs: the JSON body, path ids,
 * bearer credentials, and turning database outcomes into answers.
 *
 * Each helper that can fail has already answered the request when it
 * returns false (or a non-zero cot_err): the handler just returns. */
#ifndef COT_SERVER_APIUTIL_H
#define COT_SERVER_APIUTIL_H

#include <pthread.h>
#include <stdbool.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "server/dbconn.h"
#include "server/http.h"

/* Text form of a bytea parameter holding a sha256: "\\x" + 64 hex + NUL. */
#define API_HASH_PARAM_LEN 67

/* Parse the body as a JSON object into *out (caller json_decref's).  When
 * optional and the body is empty, *out is an empty object.  On failure
 * answers 400 and returns false. */
bool api_body(http_req *req, bool optional, json_t **out);

/* Path parameter i as a positive integer id; otherwise answers 400 naming
 * `what` ("work unit") and returns false. */
bool api_path_id(http_req *req, int i, const char *what, long long *out);

/* The bearer secret of the Authorization header, hashed: writes the bytea
 * parameter text of its sha256 into hash_param.  Answers 401 and returns
 * false when the header is missing or malformed. */
bool api_bearer(http_req *req, char hash_param[API_HASH_PARAM_LEN]);

/* Authenticate an account key (bearer): *account_id on success.  Answers 401
 * (wrong, revoked, disabled) or 503 and returns false otherwise. */
bool api_account(http_req *req, long long *account_id);

/* Run stmt; on failure answer (409 with message on_conflict for a unique
 * violation, 400 for another constraint, 503 otherwise) and return NULL.  The
 * caller PQclear()s. */
PGresult *api_exec(http_req *req, const dbc_stmt *stmt, const char *const *params, const char *on_conflict);

/* Run a statement returning one row (status integer, body text) and answer
 * with them as they are: the scheduler functions decide status and body. */
void api_relay(http_req *req, const dbc_stmt *stmt, const char *const *params);

/* Answer with the (status, body) row of r as it is (500 when r is not one
 * such row); returns the status answered. */
int api_relay_result(http_req *req, const PGresult *r);

/* Round news that wakes held requests once, not at each of the thousand
 * answers that carry it: api_is_news(n, key) is true the first time n sees
 * key (a round's project, version, attempt and news) since another key. */
typedef struct {
	pthread_mutex_t mu;
	char last[160];
} api_news;
#define API_NEWS_INIT \
	{ \
		PTHREAD_MUTEX_INITIALIZER, "" \
	}
bool api_is_news(api_news *n, const char *key);

/* A long poll's turn once a look (begun after gen = http_wake_gen(req))
 * found nothing to answer yet: API_POLL_HELD when the request is now held
 * (return without answering; the handler runs again on a wake-up or at
 * req->hold_until), API_POLL_AGAIN when something moved meanwhile (look
 * again now), API_POLL_ANSWER when the wait is over (deadline, or 8 looks
 * already): answer with what the look found. */
typedef enum { API_POLL_ANSWER, API_POLL_HELD, API_POLL_AGAIN } api_poll;
api_poll api_long_poll(http_req *req, unsigned long gen, int look);

/* An optional integer query argument in [lo, hi]: *out keeps its default
 * when absent; false (answered 400) when present and not such an integer. */
bool api_query_int(http_req *req, const char *name, long long lo, long long hi, long long *out);

/* Run a statement returning one JSON text in one row, or no row: answer 200
 * with that text, or 404 "not_found" with message missing. */
void api_reply_row(http_req *req, const dbc_stmt *stmt, const char *const *params, const char *missing);

/* Whether text a user typed (a name, a description, a host's model) can be
 * carried by the XML of the stats export: no U+FFFE or U+FFFF, no control
 * character other than tab and newline (s is valid UTF-8: Jansson checked
 * it).  Answers 400 naming field and returns false otherwise. */
bool api_text_ok(http_req *req, const char *field, const char *s);
/* The same check without answering: false with the error in eb. */
bool api_text_check(const char *field, const char *s, cot_errbuf *eb);

/* Answer 400 for a shape error described in eb; returns false. */
bool api_bad_request(http_req *req, const cot_errbuf *eb);

/* A member's post to its round (group_sum, mean_hash) begins alike
 * (api_rounds.c): stmt takes (token hash hp, project name, version, host, samples, included),
 * the three numbers written as text into a for the statements that
 * follow.  Its one row when the post goes on; NULL when it has answered
 * (an unknown project, the database's refusal or error). */
typedef struct {
	char version[24], host[24], samples[24];
} rounds_member_args;
PGresult *rounds_member_begin(http_req *req, const dbc_stmt *stmt, const char *hp, long long version,
                              long long host, long long samples, const char *included, rounds_member_args *a);

/* The float8[] literal "{v,v,...}" of v[0..n) into buf (cap bytes; at
 * least API_FLOAT8_LEN(n)): %.17g keeps every bit of each value. */
#define API_FLOAT8_LEN(n) ((size_t)(n)*26 + 3)
void api_float8_literal(const double *v, size_t n, char *buf, size_t cap);

#endif
