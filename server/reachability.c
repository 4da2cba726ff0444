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
#include <unistd.h>

#include "server/apiutil.h"
#include "shared/deadline.h"
#include "shared/log.h"

#define BUCKETS 1024
#define MAX_HOSTS 1000000

typedef struct entry {
	struct entry *next;
	reach_info info;
	double tokens;              /* relay token bucket, bytes */
	int64_t tokens_ms;          /* when it was last filled */
} entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry **table;
static size_t n_entries;

int reach_init(void)
{
	pthread_mutex_lock(&mu);
	if (!table)
		table = calloc(BUCKETS, sizeof *table);
	int ok = table != NULL;
	pthread_mutex_unlock(&mu);
	return ok ? 0 : -1;
}

void reach_free(void)
{
	pthread_mutex_lock(&mu);
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

void reach_observe(int64_t host, const char *addr, uint16_t port, int which,
                   const char *local_addr, uint16_t local_port, uint16_t adv_port)
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
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
	                          .ai_socktype = SOCK_STREAM }, *ai = NULL;
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
	e = find(host, false);
	if (e && strcmp(e->info.addr, addr) == 0) {
		reach_info *i = &e->info;
		if (i->port_a && i->port_b)
			i->mapping = i->port_a == i->port_b ? "independent" : "dependent";
		if (reached)
			i->klass = strcmp(addr, local) == 0 ? "public" : "mapped";
		else
			i->klass = "nat";
		k = i->klass;
		log_info("host %lld at %s port %u (advertised %u): %s, mapping %s", (long long)host, addr,
		         i->port_a, i->adv_port, i->klass, i->mapping);
	}
	pthread_mutex_unlock(&mu);
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
		got = want;    /* table full: never stall a relay on bookkeeping */
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
	}
	pthread_mutex_unlock(&mu);
}

static const dbc_stmt st_owner = {
	"nat_host_owner", "SELECT account_id FROM host WHERE id = $1", 1
};

void api_host_nat(http_req *req)
{
	long long id, account;
	if (!api_path_id(req, 0, "host", &id) || !api_account(req, &account))
		return;
	const char *params[] = { req->params[0] };
	PGresult *r = api_exec(req, &st_owner, params, NULL);
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
		reach_info i;
		if (!reach_get(id, &i)) {
			memset(&i, 0, sizeof i);
			i.klass = "unknown";
			i.mapping = "unknown";
		}
		json_t *o = json_pack("{s:I, s:s, s:s, s:s?, s:i, s:i, s:i, s:I, s:I, s:I}",
		                      "host_id", (json_int_t)id, "reachability", i.klass,
		                      "mapping", i.mapping, "public_addr", i.addr[0] ? i.addr : NULL,
		                      "public_port", i.port_a, "public_port_2", i.port_b,
		                      "advertised_port", i.adv_port,
		                      "relay_bytes_in", (json_int_t)i.relay_bytes_in,
		                      "relay_bytes_out", (json_int_t)i.relay_bytes_out,
		                      "relay_sessions", (json_int_t)i.relay_sessions);
		http_reply_json(req, 200, o);
	}
	PQclear(r);
}
