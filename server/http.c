/* cotrain-server: the HTTP layer over libmicrohttpd. */
#include "server/http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "server/http_conns.h"
#include "server/metrics.h"
#include "server/router.h"
#include "shared/common/hash.h"
#include "shared/common/log.h"
#include "shared/common/text.h"

struct http_server {
	struct MHD_Daemon *daemon;
	const srv_config *cfg;
	int port;
	pthread_t timer; /* resumes held requests at their deadline */
	bool timer_started;
};

/* Per-request state, from the first call of the access handler to the
 * completion callback, which frees it. */
typedef struct conn_state {
	http_req req;
	struct MHD_Connection *conn;
	route_handler handler;
	char *body;
	size_t len, cap;
	size_t limit;              /* largest body of this route (router_body_limit) */
	bool queued;               /* answered already (e.g. 404 before the body) */
	size_t dropped;            /* body bytes past the limit, read and dropped */
	struct MHD_Response *resp; /* the answer, queued by finish() */
	int status;
	struct timespec start;
	double accept_ms;       /* a connection's first request: from the accept to its head, else -1 */
	bool held;              /* suspended by http_hold, not yet run again */
	bool resumed;           /* was held: its answer closes the connection (finish) */
	bool answering_at_stop; /* resumed by http_stop; its answer not yet sent */
	struct conn_state *next_held;
	char pathbuf[512];
} conn_state;

/* Held requests (long polls): a list of suspended connections, resumed by
 * http_wake_held, at their deadline by the timer thread, or when the server
 * stops.  Connections are suspended under hold_lock and resumed after it is
 * released, so MHD's own locks are never taken in the other order. */
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cond;
static pthread_once_t hold_once = PTHREAD_ONCE_INIT;
static conn_state *held_list;
static unsigned long hold_gen[HTTP_HOLD_KINDS];
static int held_pending;   /* resumed, not yet run again */
static int held_answering; /* run again by http_stop, answer not yet sent */
static bool hold_stopping, timer_stop;

const char *http_header(const http_req *req, const char *name)
{
	const conn_state *st = req->priv;
	return MHD_lookup_connection_value(st->conn, MHD_HEADER_KIND, name);
}

const char *http_cookie(const http_req *req, const char *name)
{
	const conn_state *st = req->priv;
	return MHD_lookup_connection_value(st->conn, MHD_COOKIE_KIND, name);
}

void http_client_ip(const http_req *req, char *out, size_t len)
{
	const conn_state *st = req->priv;
	const union MHD_ConnectionInfo *ci =
	        MHD_get_connection_info(st->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;
	out[0] = '\0';
	if (sa && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)len);
	else if (sa && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)len);
}

const char *http_query(const http_req *req, const char *name)
{
	const conn_state *st = req->priv;
	return MHD_lookup_connection_value(st->conn, MHD_GET_ARGUMENT_KIND, name);
}

static void hold_init(void)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&hold_cond, &ca);
	pthread_condattr_destroy(&ca);
}

double http_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* kind, HTTP_HOLD_PLAN when out of range. */
static int kind_index(int kind) { return kind > 0 && kind < HTTP_HOLD_KINDS ? kind : HTTP_HOLD_PLAN; }

/* The kind of a held request, HTTP_HOLD_PLAN when out of range. */
static int kind_of(const http_req *req) { return kind_index(req->hold_kind); }

unsigned long http_wake_gen_of(int kind)
{
	pthread_mutex_lock(&hold_lock);
	unsigned long g = hold_gen[kind_index(kind)];
	pthread_mutex_unlock(&hold_lock);
	return g;
}

unsigned long http_wake_gen(const http_req *req) { return http_wake_gen_of(kind_of(req)); }

bool http_hold(http_req *req, unsigned long gen)
{
	conn_state *st = req->priv;
	pthread_once(&hold_once, hold_init);
	pthread_mutex_lock(&hold_lock);
	if (hold_stopping || gen != hold_gen[kind_of(req)] || st->resp || http_now() >= req->hold_until) {
		pthread_mutex_unlock(&hold_lock);
		return false;
	}
	MHD_suspend_connection(st->conn);
	st->held = true;
	st->next_held = held_list;
	held_list = st;
	pthread_cond_signal(&hold_cond); /* maybe an earlier deadline */
	pthread_mutex_unlock(&hold_lock);
	return true;
}

/* Resume a detached chain of held requests (hold_lock not held). */
static void resume_chain(conn_state *c)
{
	while (c) {
		conn_state *next = c->next_held;
		c->next_held = NULL;
		MHD_resume_connection(c->conn);
		c = next;
	}
}

/* Resume the held requests of the kinds in mask, only those tagged tag
 * when tag > 0. */
static void wake(unsigned mask, long long tag)
{
	pthread_once(&hold_once, hold_init);
	pthread_mutex_lock(&hold_lock);
	for (int k = 0; k < HTTP_HOLD_KINDS; k++)
		if (mask & HTTP_WAKE(k))
			hold_gen[k]++;
	conn_state *c = NULL, **pp = &held_list;
	int n = 0, left = 0;
	while (*pp) {
		conn_state *x = *pp;
		if ((mask & HTTP_WAKE(kind_of(&x->req))) && (tag <= 0 || x->req.hold_tag == tag)) {
			*pp = x->next_held;
			x->next_held = c;
			c = x;
			held_pending++;
			n++;
		} else {
			pp = &x->next_held;
			left++;
		}
	}
	pthread_mutex_unlock(&hold_lock);
	if (n && tag > 0)
		log_debug("woke %d held requests (kinds %#x) of %lld, %d left held", n, mask, tag, left);
	else if (n)
		log_debug("woke %d held requests (kinds %#x), %d left held", n, mask, left);
	resume_chain(c);
}

void http_wake(unsigned mask) { wake(mask, 0); }
void http_wake_tag(unsigned mask, long long tag)
{
	if (tag > 0)
		wake(mask, tag);
}
void http_wake_held(void) { wake(HTTP_WAKE_ALL, 0); }

/* The timer thread: resume each held request at its deadline. */
static void *hold_timer(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&hold_lock);
	while (!timer_stop) {
		double now = http_now(), next = now + 3600;
		conn_state *due = NULL, **pp = &held_list;
		while (*pp) {
			conn_state *c = *pp;
			if (c->req.hold_until <= now) {
				*pp = c->next_held;
				c->next_held = due;
				due = c;
				held_pending++;
			} else {
				if (c->req.hold_until < next)
					next = c->req.hold_until;
				pp = &c->next_held;
			}
		}
		if (due) {
			pthread_mutex_unlock(&hold_lock);
			resume_chain(due);
			pthread_mutex_lock(&hold_lock);
			continue;
		}
		struct timespec until;
		until.tv_sec = (time_t)next;
		until.tv_nsec = (long)((next - (double)until.tv_sec) * 1e9);
		pthread_cond_timedwait(&hold_cond, &hold_lock, &until);
	}
	pthread_mutex_unlock(&hold_lock);
	return NULL;
}

void http_reply_response(http_req *req, int status, void *response)
{
	conn_state *st = req->priv;
	if (st->resp) { /* a handler answered twice: keep the first */
		log_error("handler for %s %s answered twice", req->method, req->path);
		MHD_destroy_response(response);
		return;
	}
	st->resp = response;
	st->status = status;
}

void http_add_header(http_req *req, const char *name, const char *value)
{
	conn_state *st = req->priv;
	if (st->resp)
		MHD_add_response_header(st->resp, name, value);
}

void http_reply_raw(http_req *req, int status, const char *json, size_t len)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)json, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return; /* out of memory: finish() answers with an empty 500 */
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	http_reply_response(req, status, r);
}

/* libmicrohttpd's unescaping of the path and of the query's keys and
 * values (in place, returning the new length), less "%00": a NUL would cut
 * the string the handlers see, so that "/v1/hosts/1%00" would act on host
 * 1.  It stays the three characters "%00", which no id, name or number
 * accepts. */
static size_t unescape_keep_nul(void *cls, struct MHD_Connection *c, char *s)
{
	(void)cls;
	(void)c;
	char *w = s;
	for (const char *r = s; *r;) {
		int hi = r[0] == '%' ? hash_hex_digit(r[1]) : -1, lo = hi >= 0 ? hash_hex_digit(r[2]) : -1;
		if (lo >= 0 && (hi | lo)) {
			*w++ = (char)(hi * 16 + lo);
			r += 3;
		} else {
			*w++ = *r++;
		}
	}
	*w = '\0';
	return (size_t)(w - s);
}

void http_reply_json(http_req *req, int status, json_t *body)
{
	char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	if (!s)
		return;
	http_reply_raw(req, status, s, strlen(s));
	free(s);
}

void http_reply_error(http_req *req, int status, const char *code, const char *message, const char *hint)
{
	/* A message may quote the request (a path id, a field): bytes that are
	 * not UTF-8, which JSON cannot carry, are sent escaped. */
	char msg[2048], hnt[2048];
	text_escape(message, msg, sizeof msg);
	json_t *err = json_pack("{s:s, s:s}", "code", code, "message", msg);
	if (err && hint && *hint) {
		text_escape(hint, hnt, sizeof hnt);
		json_object_set_new(err, "hint", json_string(hnt));
	}
	if (status >= 500)
		log_warn("%s %s: %d %s: %s", req->method, req->path, status, code, message);
	http_reply_json(req, status, err ? json_pack("{s:o}", "error", err) : NULL);
}

int http_status_for(cot_err e)
{
	switch (e) {
	case COT_OK:
		return MHD_HTTP_OK;
	case COT_ERR_INVALID:
		return MHD_HTTP_BAD_REQUEST;
	case COT_ERR_AUTH:
		return MHD_HTTP_UNAUTHORIZED;
	case COT_ERR_FORBIDDEN:
		return MHD_HTTP_FORBIDDEN;
	case COT_ERR_NOT_FOUND:
		return MHD_HTTP_NOT_FOUND;
	case COT_ERR_EXISTS:
	case COT_ERR_CONFLICT:
		return MHD_HTTP_CONFLICT;
	case COT_ERR_TOO_LARGE:
		return MHD_HTTP_CONTENT_TOO_LARGE;
	case COT_ERR_DB:
	case COT_ERR_SCHEMA:
	case COT_ERR_TIMEOUT:
		return MHD_HTTP_SERVICE_UNAVAILABLE;
	default:
		return MHD_HTTP_INTERNAL_SERVER_ERROR;
	}
}

void http_reply_cot(http_req *req, cot_err e, const cot_errbuf *eb)
{
	http_reply_error(req, http_status_for(e), cot_strerror(e),
	                 eb && eb->msg[0] ? eb->msg : cot_strerror(e), eb ? eb->hint : NULL);
}

/* Queue the answer the handler (or the layer) prepared; a request left
 * without one gets a bare 500. */
static enum MHD_Result finish(conn_state *st)
{
	if (!st->resp) {
		http_reply_error(&st->req, 500, "internal_error", "could not build the response", NULL);
		if (!st->resp) {
			st->resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
			st->status = 500;
			if (!st->resp)
				return MHD_NO;
		}
	}
	/* The answer to a long poll that was suspended and resumed closes its
	 * connection: with libmicrohttpd 0.9.75 (epoll thread pool) the next
	 * request on such a keep-alive connection sat at times unread until the
	 * client gave up (30 s for 1% of 1,000 simulated hosts' calls,
	 * doc/scale.md).  A client pays one new connection per long poll. */
	if (st->resumed)
		MHD_add_response_header(st->resp, MHD_HTTP_HEADER_CONNECTION, "close");
	enum MHD_Result r = MHD_queue_response(st->conn, (unsigned)st->status, st->resp);
	MHD_destroy_response(st->resp);
	st->resp = NULL;
	st->queued = true;
	return r;
}

/* A body must arrive at BODY_MIN_RATE bytes/s on average after a grace of
 * BODY_GRACE_S: a sender that trickles bytes (each one pushes libmicrohttpd's
 * idle timeout on) is cut instead of holding its connection for good. */
#define BODY_GRACE_S 10.0
#define BODY_MIN_RATE 1024.0
#define DROP_MAX ((size_t)1 << 20) /* bytes past the limit read before closing */

static bool body_too_slow(const conn_state *st)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	double t = (double)(now.tv_sec - st->start.tv_sec) + (double)(now.tv_nsec - st->start.tv_nsec) / 1e9;
	return t > BODY_GRACE_S && (double)st->len < (t - BODY_GRACE_S) * BODY_MIN_RATE;
}

static void too_large(conn_state *st)
{
	char msg[128];
	snprintf(msg, sizeof msg, "request body is larger than %zu bytes", st->limit);
	http_reply_error(&st->req, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", msg, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
	http_server *srv = cls;
	conn_state *st = *con_cls;

	if (!st) {
		/* Headers are in: route now, so 404, 405 and 413 by Content-Length
		 * are answered without reading the body. */
		double accept_wait = http_conns_head_done(conn);
		st = calloc(1, sizeof *st);
		if (!st)
			return MHD_NO;
		st->accept_ms = accept_wait >= 0 ? accept_wait * 1e3 : -1;
		*con_cls = st;
		st->conn = conn;
		st->req.method = method;
		st->req.path = url;
		st->req.cfg = srv->cfg;
		st->req.priv = st;
		st->req.body = "";
		clock_gettime(CLOCK_MONOTONIC, &st->start);

		/* HTTP/1.1 requires Host (RFC 9112, section 3.2): a request without
		 * one is refused before anything else. */
		if (strcmp(version, MHD_HTTP_VERSION_1_1) == 0 &&
		    !MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)) {
			http_reply_error(&st->req, MHD_HTTP_BAD_REQUEST, "invalid",
			                 "an HTTP/1.1 request must carry a Host header", NULL);
			return finish(st);
		}
		char allow[128];
		route_result rr = router_match(&st->req, st->pathbuf, sizeof st->pathbuf, &st->handler, allow,
		                               sizeof allow);
		if (rr == ROUTE_NO_PATH) {
			http_reply_error(&st->req, MHD_HTTP_NOT_FOUND, "not_found", "no such route",
			                 "See doc/api.md for the routes of the v1 API.");
			return finish(st);
		}
		if (rr == ROUTE_NO_METHOD) {
			char msg[200];
			snprintf(msg, sizeof msg, "method %s is not allowed here", method);
			http_reply_error(&st->req, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", msg,
			                 NULL);
			http_add_header(&st->req, MHD_HTTP_HEADER_ALLOW, allow);
			return finish(st);
		}
		st->limit = router_body_limit(st->handler, srv->cfg->body_limit);
		const char *cl =
		        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (cl && strtoull(cl, NULL, 10) > st->limit) {
			too_large(st);
			return finish(st);
		}
		if (st->limit > srv->cfg->body_limit) {
			/* A large body: the handler may refuse it before it is read. */
			st->req.early = true;
			st->handler(&st->req);
			st->req.early = false;
			if (st->resp)
				return finish(st);
			if (st->req.body_max && st->req.body_max < st->limit)
				st->limit = st->req.body_max;
		}
		return MHD_YES;
	}

	if (st->queued) { /* answered early: drop whatever still comes */
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (*upload_data_size) {
		size_t n = *upload_data_size;
		*upload_data_size = 0;
		if (body_too_slow(st)) {
			/* libmicrohttpd cannot answer in the middle of a body: close. */
			log_info("http: %s %s: closed, its body arrives slower than %.0f bytes/s",
			         st->req.method, st->req.path, BODY_MIN_RATE);
			return MHD_NO;
		}
		if (st->dropped || st->len + n > st->limit) {
			/* Past the limit (a chunked body has no Content-Length to
			 * refuse by): keep nothing more, answer 413 at its end, and
			 * close when it goes on past DROP_MAX. */
			st->dropped += n;
			return st->dropped > DROP_MAX ? MHD_NO : MHD_YES;
		}
		if (st->len + n + 1 > st->cap) {
			size_t cap = st->cap ? st->cap : 1024;
			while (cap < st->len + n + 1)
				cap *= 2;
			char *b = realloc(st->body, cap);
			if (!b)
				return MHD_NO;
			st->body = b;
			st->cap = cap;
		}
		memcpy(st->body + st->len, upload_data, n);
		st->len += n;
		st->body[st->len] = '\0';
		return MHD_YES;
	}

	if (st->held) { /* resumed: the handler looks again */
		pthread_mutex_lock(&hold_lock);
		st->held = false;
		st->resumed = true;
		held_pending--;
		if (hold_stopping) {
			st->answering_at_stop = true;
			held_answering++;
		}
		pthread_mutex_unlock(&hold_lock);
	}
	if (st->dropped) {
		too_large(st);
	} else {
		if (st->body) {
			st->req.body = st->body;
			st->req.body_len = st->len;
		}
		st->req.early = false;
		double t0 = st->resumed ? http_now() : 0;
		st->handler(&st->req);
		if (st->resumed)
			log_debug("%s %s held, looked again in %.2f ms", st->req.method, st->req.path,
			          (http_now() - t0) * 1e3);
		if (st->held && !st->resp)
			return MHD_YES; /* suspended until a wake-up or the deadline */
	}
	return finish(st);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
	conn_state *st = *con_cls;
	http_conns_request_done(conn); /* a next head is timed from now */
	if (!st)
		return;
	struct timespec end;
	clock_gettime(CLOCK_MONOTONIC, &end);
	double ms = (double)(end.tv_sec - st->start.tv_sec) * 1e3 +
	            (double)(end.tv_nsec - st->start.tv_nsec) / 1e6;
	metrics_observe(st->status, ms);
	char waited[48] = "";
	if (st->accept_ms >= 0)
		snprintf(waited, sizeof waited, ", %.2f ms from the accept", st->accept_ms);
	log_debug("%s %s %d %.2f ms, %zu bytes in%s%s", st->req.method, st->req.path, st->status, ms,
	          st->req.body_len, waited, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (aborted)");
	if (st->held) {
		/* Closed while held or resumed before it ran again (a client gone,
		 * the daemon stopping): forget it. */
		pthread_mutex_lock(&hold_lock);
		bool listed = false;
		for (conn_state **pp = &held_list; *pp; pp = &(*pp)->next_held)
			if (*pp == st) {
				*pp = st->next_held;
				listed = true;
				break;
			}
		if (!listed)
			held_pending--;
		pthread_mutex_unlock(&hold_lock);
	}
	if (st->answering_at_stop) {
		pthread_mutex_lock(&hold_lock);
		held_answering--;
		pthread_mutex_unlock(&hold_lock);
	}
	if (st->resp)
		MHD_destroy_response(st->resp);
	free(st->body);
	free(st);
	*con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char buf[512];
	vsnprintf(buf, sizeof buf, fmt, ap);
	size_t n = strlen(buf);
	while (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	log_debug("libmicrohttpd: %s", buf);
}

cot_err http_start(const srv_config *cfg, http_server **out, cot_errbuf *eb)
{
	char portstr[16];
	snprintf(portstr, sizeof portstr, "%d", cfg->port);
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
		                  .ai_socktype = SOCK_STREAM,
		                  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *ai = NULL;
	int gai = getaddrinfo(cfg->listen, portstr, &hints, &ai);
	if (gai)
		return cot_seterr(eb, COT_ERR_INVALID, "cannot resolve listen address \"%s\": %s",
		                  cfg->listen, gai_strerror(gai));

	http_server *s = calloc(1, sizeof *s);
	if (!s) {
		freeaddrinfo(ai);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	s->cfg = cfg;
	unsigned flags =
	        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_TURBO;
	if (ai->ai_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	/* The listen backlog is the connection limit (the kernel caps it at
	 * net.core.somaxconn): when a round's plans go out, a thousand hosts
	 * whose long poll was just answered (and closed, finish) connect again
	 * at once, and a connection past a full backlog waits for the kernel's
	 * SYN retransmission, a second and then three (doc/scale.md, runs J). */
	s->daemon =
	        MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
	                         ai->ai_addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads,
	                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->conn_timeout,
	                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
	                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096,
	                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->per_ip_connections,
	                         MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)4096, MHD_OPTION_NOTIFY_COMPLETED,
	                         on_completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, http_conns_notify, NULL,
	                         MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, MHD_OPTION_UNESCAPE_CALLBACK,
	                         unescape_keep_nul, NULL, MHD_OPTION_END);
	freeaddrinfo(ai);
	if (!s->daemon) {
		free(s);
		return cot_seterr(eb, COT_ERR_IO, "could not listen on %s port %d", cfg->listen, cfg->port);
	}
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
	s->port = info ? info->port : cfg->port;
	pthread_once(&hold_once, hold_init);
	pthread_mutex_lock(&hold_lock);
	hold_stopping = timer_stop = false;
	held_answering = 0;
	pthread_mutex_unlock(&hold_lock);
	if (pthread_create(&s->timer, NULL, hold_timer, NULL) != 0) {
		MHD_stop_daemon(s->daemon);
		free(s);
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not start the long-poll timer thread");
	}
	s->timer_started = true;
	cot_err rc = http_conns_start((double)cfg->conn_timeout, eb);
	if (rc) {
		http_stop(s);
		return rc;
	}
	*out = s;
	return COT_OK;
}

int http_port(const http_server *s) { return s->port; }

void http_stop(http_server *s)
{
	if (!s)
		return;
	/* MHD must not be stopped with a suspended connection: resume every
	 * held request (each answers at once, seeing hold_stopping) and give
	 * the workers a moment to run them. */
	pthread_mutex_lock(&hold_lock);
	hold_stopping = true;
	timer_stop = true;
	conn_state *c = held_list;
	held_list = NULL;
	for (conn_state *x = c; x; x = x->next_held)
		held_pending++;
	pthread_cond_signal(&hold_cond);
	pthread_mutex_unlock(&hold_lock);
	resume_chain(c);
	if (s->timer_started)
		pthread_join(s->timer, NULL);
	for (int i = 0; i < 200; i++) { /* up to 2 s: run again and answered */
		pthread_mutex_lock(&hold_lock);
		int pending = held_pending + held_answering;
		pthread_mutex_unlock(&hold_lock);
		if (pending <= 0)
			break;
		struct timespec ms10 = { 0, 10 * 1000 * 1000 };
		nanosleep(&ms10, NULL);
	}
	MHD_stop_daemon(s->daemon);
	http_conns_stop();
	free(s);
}
