/* cotrain-server: each host's public endpoint, reachability class and relay
 * accounting (reachability.h). */
#include "server/reachability.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/apiutil.h"
#include "server/dbconn.h"
#include "shared/common/deadline.h"
#include "shared/common/log.h"

#define BUCKETS 1024
#define MAX_HOSTS 1000000

#define FLUSH_BATCH 256

typedef struct entry {
	struct entry *next;
	reach_info info;
	double tokens;                             /* relay token bucket, bytes */
	int64_t tokens_ms;                         /* when it was last filled */
	uint64_t pend_in, pend_out, pend_sessions; /* accounted, not yet in the row */
	bool dirty;                                /* on the dirty list */
	struct entry *dirty_next;
} entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t flush_cv = PTHREAD_COND_INITIALIZER;
static entry **table;
static size_t n_entries;
static entry *dirty; /* entries with pending relay counts */
static pthread_t flusher;
static bool flusher_running, flusher_stop;

static const dbc_stmt st_relay_add = { "reach_relay_add",
	                               "UPDATE host SET relay_bytes_in = relay_bytes_in + $2::bigint,"
	                               "                relay_bytes_out = relay_bytes_out + $3::bigint,"
	                               "                relay_sessions = relay_sessions + $4::bigint"
	                               " WHERE id = $1::bigint",
	                               4 };

typedef struct {
	int64_t host;
	uint64_t in, out, sessions;
} pending;

/* Put counts back on host's entry after a failed write.  Call with mu held. */
static void repend(const pending *p);

int reach_flush(void)
{
	int written = 0;
	pending batch[FLUSH_BATCH];
	for (;;) {
		size_t n = 0;
		pthread_mutex_lock(&mu);
		while (dirty && n < FLUSH_BATCH) {
			entry *e = dirty;
			dirty = e->dirty_next;
			e->dirty = false;
			e->dirty_next = NULL;
			batch[n++] = (pending){ e->info.host_id, e->pend_in, e->pend_out, e->pend_sessions };
			e->pend_in = e->pend_out = e->pend_sessions = 0;
		}
		pthread_mutex_unlock(&mu);
		if (n == 0)
			return written;
		size_t i = 0;
		for (; i < n; i++) {
			char h[24], in[24], out[24], ses[24];
			snprintf(h, sizeof h, "%lld", (long long)batch[i].host);
			snprintf(in, sizeof in, "%llu", (unsigned long long)batch[i].in);
			snprintf(out, sizeof out, "%llu", (unsigned long long)batch[i].out);
			snprintf(ses, sizeof ses, "%llu", (unsigned long long)batch[i].sessions);
			const char *params[] = { h, in, out, ses };
			PGresult *r = NULL;
			char state[6];
			cot_errbuf eb = { "", "" };
			if (dbc_exec(&st_relay_add, params, &r, state, &eb)) {
				log_warn("could not write the relay counts of host %lld: %s",
				         (long long)batch[i].host, eb.msg);
				break;
			}
			PQclear(r);
			written++;
		}
		if (i < n) {
			/* The database is away: keep the rest for the next flush. */
			pthread_mutex_lock(&mu);
			for (; i < n; i++)
				repend(&batch[i]);
			pthread_mutex_unlock(&mu);
			return written;
		}
	}
}

/* The flush thread: writes pending relay counts every REACH_FLUSH_MS, and
 * once more when told to stop. */
static void *flush_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	while (!flusher_stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += REACH_FLUSH_MS / 1000;
		ts.tv_nsec += (long)(REACH_FLUSH_MS % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&flush_cv, &mu, &ts);
		pthread_mutex_unlock(&mu);
		reach_flush();
		pthread_mutex_lock(&mu);
	}
	pthread_mutex_unlock(&mu);
	reach_flush();
	dbc_close_thread();
	return NULL;
}

int reach_init(void)
{
	pthread_mutex_lock(&mu);
	if (!table)
		table = calloc(BUCKETS, sizeof *table);
	int ok = table != NULL;
	if (ok && !flusher_running) {
		flusher_stop = false;
		flusher_running = pthread_create(&flusher, NULL, flush_main, NULL) == 0;
		ok = flusher_running;
	}
	pthread_mutex_unlock(&mu);
	return ok ? 0 : -1;
}

void reach_free(void)
{
	pthread_mutex_lock(&mu);
	bool join = flusher_running;
	flusher_stop = true;
	flusher_running = false;
	pthread_cond_broadcast(&flush_cv);
	pthread_mutex_unlock(&mu);
	if (join)
		pthread_join(flusher, NULL);
	pthread_mutex_lock(&mu);
	dirty = NULL;
	for (size_t i = 0; table && i < BUCKETS; i++) {
		for (entry *e = table[i], *n; e; e = n) {
			n = e->next;
			free(e);
		}
	}
	free(table);
	table = NULL;
	n_entries = 0;
	pthread_mutex_unlock(&mu);
}

/* The entry of host; with create, made when absent.  Call with mu held. */
static entry *find(int64_t host, bool create)
{
	if (!table)
		return NULL;
	size_t b = (size_t)((uint64_t)host * 11400714819323198485ull >> 54) % BUCKETS;
	for (entry *e = table[b]; e; e = e->next)
		if (e->info.host_id == host)
			return e;
	if (!create || n_entries >= MAX_HOSTS)
		return NULL;
	entry *e = calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->info.host_id = host;
	e->info.klass = "unknown";
	e->info.mapping = "unknown";
	e->next = table[b];
	table[b] = e;
	n_entries++;
	return e;
}

static void mark_dirty(entry *e)
{
	if (!e->dirty) {
		e->dirty = true;
		e->dirty_next = dirty;
		dirty = e;
	}
}

static void repend(const pending *p)
{
	entry *e = find(p->host, true);
	if (!e) {
		log_warn("dropped relay counts of host %lld: the table is full", (long long)p->host);
		return;
	}
	e->pend_in += p->in;
	e->pend_out += p->out;
	e->pend_sessions += p->sessions;
	mark_dirty(e);
}

void reach_observe(int64_t host, const char *addr, uint16_t port, int which, const char *local_addr,
                   uint16_t local_port, uint16_t adv_port)
{
	pthread_mutex_lock(&mu);
	entry *e = find(host, true);
	if (e) {
		reach_info *i = &e->info;
		if (strcmp(i->addr, addr) != 0) {
			snprintf(i->addr, sizeof i->addr, "%s", addr);
			i->port_a = i->port_b = 0;
			i->klass = "unknown";
			i->mapping = "unknown";
		}
		if (which == 0)
			i->port_a = port;
		else
			i->port_b = port;
		snprintf(i->local_addr, sizeof i->local_addr, "%s", local_addr);
		i->local_port = local_port;
		i->adv_port = adv_port ? adv_port : local_port;
		i->observed_ms = deadline_now_ms();
	}
	pthread_mutex_unlock(&mu);
}

/* Try a TCP connection to addr:port for at most timeout_ms; true when it
 * connected.  The connection is closed at once: it only proves that
 * something accepts there. */
static bool dial_back(const char *addr, uint16_t port, int timeout_ms)
{
	char ps[8];
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM },
	                *ai = NULL;
	snprintf(ps, sizeof ps, "%u", port);
	if (port == 0 || getaddrinfo(addr, ps, &hints, &ai) != 0)
		return false;
	bool ok = false;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd >= 0) {
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
			ok = true;
		} else if (errno == EINPROGRESS) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int64_t deadline = deadline_after_ms(timeout_ms);
			int r;
			do
				r = poll(&p, 1, deadline_left_ms(deadline));
			while (r < 0 && errno == EINTR);
			int err = 0;
			socklen_t len = sizeof err;
			ok = r > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
		}
		close(fd);
	}
	freeaddrinfo(ai);
	return ok;
}

static const dbc_stmt st_class = { "reach_class",
	                           "UPDATE host SET nat_class = $2, nat_mapping = $3, nat_public_addr = $4,"
	                           "                nat_public_port = $5::integer, nat_observed_at = now(),"
	                           "                nat_advertised_port = $6::integer, nat_local_addr = $7,"
	                           "                nat_local_port = $8::integer"
	                           " WHERE id = $1::bigint",
	                           8 };

/* Write a host's class and endpoints (i's) to its row; errors are logged
 * (the class in memory stands, and the next registration writes again). */
static void store_class(const reach_info *i, uint16_t public_port)
{
	char h[24], p[8], ap[8], lp[8];
	snprintf(h, sizeof h, "%lld", (long long)i->host_id);
	snprintf(p, sizeof p, "%u", public_port);
	snprintf(ap, sizeof ap, "%u", i->adv_port);
	snprintf(lp, sizeof lp, "%u", i->local_port);
	const char *params[] = { h,
		                 i->klass,
		                 i->mapping,
		                 i->addr[0] ? i->addr : NULL,
		                 p,
		                 ap,
		                 i->local_addr[0] ? i->local_addr : NULL,
		                 lp };
	PGresult *r = NULL;
	char state[6];
	cot_errbuf eb = { "", "" };
	if (dbc_exec(&st_class, params, &r, state, &eb))
		log_warn("could not store the class of host %lld: %s", (long long)i->host_id, eb.msg);
	else
		PQclear(r);
}

const char *reach_classify(int64_t host, int timeout_ms)
{
	char addr[REACH_ADDR_MAX], local[REACH_ADDR_MAX];
	uint16_t port;
	pthread_mutex_lock(&mu);
	entry *e = find(host, false);
	if (!e) {
		pthread_mutex_unlock(&mu);
		return "unknown";
	}
	memcpy(addr, e->info.addr, sizeof addr);
	memcpy(local, e->info.local_addr, sizeof local);
	port = e->info.adv_port;
	pthread_mutex_unlock(&mu);

	bool reached = dial_back(addr, port, timeout_ms);

	pthread_mutex_lock(&mu);
	const char *k = "unknown";
	uint16_t public_port = 0;
	reach_info seen;
	e = find(host, false);
	bool decided = e && strcmp(e->info.addr, addr) == 0;
	if (decided) {
		reach_info *i = &e->info;
		if (i->port_a && i->port_b)
			i->mapping = i->port_a == i->port_b ? "independent" : "dependent";
		if (reached)
			i->klass = strcmp(addr, local) == 0 ? "public" : "mapped";
		else
			i->klass = "nat";
		k = i->klass;
		seen = *i;
		public_port = i->port_a ? i->port_a : i->port_b;
		log_info("host %lld at %s port %u (advertised %u): %s, mapping %s", (long long)host, addr,
		         i->port_a, i->adv_port, i->klass, i->mapping);
	}
	pthread_mutex_unlock(&mu);
	if (decided)
		store_class(&seen, public_port);
	return k;
}

bool reach_get(int64_t host, reach_info *out)
{
	pthread_mutex_lock(&mu);
	entry *e = find(host, false);
	if (e)
		*out = e->info;
	pthread_mutex_unlock(&mu);
	return e != NULL;
}

static const dbc_stmt st_reload = {
	"reach_reload",
	"SELECT nat_class, nat_mapping, nat_public_addr, nat_public_port, nat_advertised_port,"
	"       nat_local_addr, nat_local_port,"
	"       (extract(epoch FROM now() - nat_observed_at) * 1000)::bigint"
	"  FROM host WHERE id = $1::bigint AND NOT revoked AND nat_class IS NOT NULL"
	"   AND nat_advertised_port IS NOT NULL"
	"   AND nat_observed_at > now() - make_interval(secs => $2::integer)",
	2
};

/* The static string of the set (NULL-terminated) that s names, or the set's
 * last one ("unknown"). */
static const char *one_of(const char *s, const char *const *set)
{
	int k = 0;
	for (; set[k + 1]; k++)
		if (strcmp(s, set[k]) == 0)
			break;
	return set[k];
}

bool reach_get_or_reload(int64_t host, reach_info *out)
{
	if (reach_get(host, out) && out->observed_ms != 0)
		return true;
	char h[24], age[24];
	snprintf(h, sizeof h, "%lld", (long long)host);
	snprintf(age, sizeof age, "%d", REACH_RELOAD_S);
	const char *params[] = { h, age };
	PGresult *r = NULL;
	char state[6];
	cot_errbuf eb = { "", "" };
	if (dbc_exec(&st_reload, params, &r, state, &eb)) {
		log_warn("could not read the class of host %lld: %s", (long long)host, eb.msg);
		return false;
	}
	bool found = PQntuples(r) == 1;
	if (found) {
		static const char *const classes[] = { "public", "mapped", "nat", "unknown", NULL };
		static const char *const mappings[] = { "independent", "dependent", "unknown", NULL };
		reach_info i = { .host_id = host };
		i.klass = one_of(PQgetvalue(r, 0, 0), classes);
		i.mapping = PQgetisnull(r, 0, 1) ? "unknown" : one_of(PQgetvalue(r, 0, 1), mappings);
		snprintf(i.addr, sizeof i.addr, "%s", PQgetvalue(r, 0, 2));
		i.port_a = (uint16_t)atoi(PQgetvalue(r, 0, 3));
		i.adv_port = (uint16_t)atoi(PQgetvalue(r, 0, 4));
		snprintf(i.local_addr, sizeof i.local_addr, "%s", PQgetvalue(r, 0, 5));
		i.local_port = (uint16_t)atoi(PQgetvalue(r, 0, 6));
		long long age_ms = strtoll(PQgetvalue(r, 0, 7), NULL, 10);
		i.observed_ms = deadline_now_ms() - age_ms;
		pthread_mutex_lock(&mu);
		entry *e = find(host, true);
		if (e && e->info.observed_ms == 0) { /* an OBSERVE meanwhile wins; relay counts stay */
			reach_info *t = &e->info;
			t->klass = i.klass;
			t->mapping = i.mapping;
			memcpy(t->addr, i.addr, sizeof t->addr);
			memcpy(t->local_addr, i.local_addr, sizeof t->local_addr);
			t->port_a = i.port_a;
			t->adv_port = i.adv_port;
			t->local_port = i.local_port;
			t->observed_ms = i.observed_ms;
		}
		*out = e ? e->info : i;
		pthread_mutex_unlock(&mu);
		log_info("host %lld: %s, mapping %s, as its row had it %.0f s ago (no registration since the "
		         "server started)",
		         (long long)host, i.klass, i.mapping, (double)age_ms / 1000);
	}
	PQclear(r);
	return found;
}

size_t reach_relay_take(int64_t host, size_t want, uint64_t cap, int *wait_ms)
{
	*wait_ms = 0;
	if (cap == 0)
		return want;
	pthread_mutex_lock(&mu);
	entry *e = find(host, true);
	size_t got = 0;
	if (e) {
		int64_t now = deadline_now_ms();
		double max = (double)cap / 4;
		if (max < 16384)
			max = 16384;
		if (e->tokens_ms == 0)
			e->tokens = max;
		else
			e->tokens += (double)(now - e->tokens_ms) * (double)cap / 1000.0;
		if (e->tokens > max)
			e->tokens = max;
		e->tokens_ms = now;
		if (e->tokens >= 1) {
			got = e->tokens < (double)want ? (size_t)e->tokens : want;
			e->tokens -= (double)got;
		} else {
			*wait_ms = (int)((1 - e->tokens) * 1000.0 / (double)cap) + 1;
		}
	} else {
		got = want; /* table full: never stall a relay on bookkeeping */
	}
	pthread_mutex_unlock(&mu);
	return got;
}

void reach_relay_refund(int64_t host, size_t n, uint64_t cap)
{
	if (cap == 0 || n == 0)
		return;
	pthread_mutex_lock(&mu);
	entry *e = find(host, false);
	if (e)
		e->tokens += (double)n;
	pthread_mutex_unlock(&mu);
}

void reach_relay_account(int64_t host, uint64_t in, uint64_t out, bool new_session)
{
	pthread_mutex_lock(&mu);
	entry *e = find(host, true);
	if (e) {
		e->info.relay_bytes_in += in;
		e->info.relay_bytes_out += out;
		e->info.relay_sessions += new_session;
		e->pend_in += in;
		e->pend_out += out;
		e->pend_sessions += new_session;
		if (in || out || new_session)
			mark_dirty(e);
	}
	pthread_mutex_unlock(&mu);
}

void reach_relay_pending(int64_t host, uint64_t *in, uint64_t *out, uint64_t *sessions)
{
	*in = *out = *sessions = 0;
	pthread_mutex_lock(&mu);
	entry *e = find(host, false);
	if (e) {
		*in = e->pend_in;
		*out = e->pend_out;
		*sessions = e->pend_sessions;
	}
	pthread_mutex_unlock(&mu);
}

static const dbc_stmt st_host_nat = {
	"nat_host_row",
	"SELECT account_id, nat_class, nat_mapping, nat_public_addr, nat_public_port,"
	"       to_jsonb(nat_observed_at) #>> '{}', relay_bytes_in, relay_bytes_out, relay_sessions,"
	"       nat_advertised_port"
	"  FROM host WHERE id = $1",
	1
};

static json_int_t col_int(PGresult *r, int c)
{
	return PQgetisnull(r, 0, c) ? 0 : (json_int_t)strtoll(PQgetvalue(r, 0, c), NULL, 10);
}

static const char *col_str(PGresult *r, int c, const char *dflt)
{
	return PQgetisnull(r, 0, c) ? dflt : PQgetvalue(r, 0, c);
}

void api_host_nat(http_req *req)
{
	long long id, account;
	if (!api_path_id(req, 0, "host", &id) || !api_account(req, &account))
		return;
	const char *params[] = { req->params[0] };
	PGresult *r = api_exec(req, &st_host_nat, params, NULL);
	if (!r)
		return;
	char msg[128];
	if (PQntuples(r) != 1) {
		snprintf(msg, sizeof msg, "host %lld does not exist", id);
		http_reply_error(req, 404, "not_found", msg, NULL);
	} else if (strtoll(PQgetvalue(r, 0, 0), NULL, 10) != account) {
		snprintf(msg, sizeof msg, "host %lld belongs to another account", id);
		http_reply_error(req, 403, "forbidden", msg, NULL);
	} else {
		/* Relay totals: the row's plus what is accounted and not yet written. */
		uint64_t pin, pout, pses;
		reach_relay_pending(id, &pin, &pout, &pses);
		json_int_t rin = col_int(r, 6) + (json_int_t)pin, rout = col_int(r, 7) + (json_int_t)pout;
		json_int_t rses = col_int(r, 8) + (json_int_t)pses;
		const char *observed = col_str(r, 5, NULL);
		reach_info i;
		json_t *o;
		if (reach_get(id, &i) && i.observed_ms != 0) {
			o = json_pack("{s:I, s:s, s:s, s:s?, s:i, s:i, s:i, s:s?, s:s}", "host_id",
			              (json_int_t)id, "reachability", i.klass, "mapping", i.mapping,
			              "public_addr", i.addr[0] ? i.addr : NULL, "public_port", i.port_a,
			              "public_port_2", i.port_b, "advertised_port", i.adv_port, "observed_at",
			              observed, "source", "memory");
		} else {
			o = json_pack("{s:I, s:s, s:s, s:s?, s:i, s:i, s:i, s:s?, s:s}", "host_id",
			              (json_int_t)id, "reachability", col_str(r, 1, "unknown"), "mapping",
			              col_str(r, 2, "unknown"), "public_addr", col_str(r, 3, NULL),
			              "public_port", (int)col_int(r, 4), "public_port_2", 0,
			              "advertised_port", (int)col_int(r, 9), "observed_at", observed,
			              "source", "database");
		}
		if (o) {
			json_object_set_new(o, "relay_bytes_in", json_integer(rin));
			json_object_set_new(o, "relay_bytes_out", json_integer(rout));
			json_object_set_new(o, "relay_sessions", json_integer(rses));
		}
		http_reply_json(req, 200, o);
	}
	PQclear(r);
}
