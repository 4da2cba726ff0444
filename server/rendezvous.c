/* cotrain-server: authentication, pair checks and the pairing of meeting
 * halves for the NAT broker (rendezvous.h). */
#include "server/rendezvous.h"

#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/dbconn.h"
#include "shared/common/hash.h"

#define PAIR_IDLE_MS (3600 * 1000)

static const dbc_stmt st_auth = { "nat_host_auth",
	                          "SELECT id FROM host_auth($1::bytea) AS id WHERE id IS NOT NULL", 1 };

cot_err rdv_auth(int64_t host, const char *token, cot_errbuf *eb)
{
	size_t n = strnlen(token, 257);
	bool good = n >= 16 && n <= 256;
	for (size_t i = 0; good && i < n; i++)
		good = (token[i] >= 'A' && token[i] <= 'Z') || (token[i] >= 'a' && token[i] <= 'z') ||
		       (token[i] >= '0' && token[i] <= '9') || token[i] == '-' || token[i] == '_';
	if (!good)
		return cot_seterr(eb, COT_ERR_AUTH, "malformed host token");
	unsigned char md[HASH_SHA256_LEN];
	char hp[3 + 2 * HASH_SHA256_LEN] = "\\x";
	if (hash_sha256(token, n, md))
		return cot_seterr(eb, COT_ERR_INTERNAL, "could not hash the host token");
	hash_hex(md, sizeof md, hp + 2);
	const char *params[] = { hp };
	PGresult *r = NULL;
	char state[6];
	cot_err rc = dbc_exec(&st_auth, params, &r, state, eb);
	if (rc)
		return rc;
	long long id = PQntuples(r) == 1 ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
	PQclear(r);
	if (id == 0)
		return cot_seterr(eb, COT_ERR_AUTH, "host token is not valid");
	if (id != host)
		return cot_seterr(eb, COT_ERR_FORBIDDEN, "the host token is not host %lld's",
		                  (long long)host);
	return COT_OK;
}

static const dbc_stmt st_pair = {
	"nat_pair_check",
	"SELECT p.id, r.state, a.group_id, b.group_id,"
	/* holders of a common slice across groups (db/functions/round_cross.sql) */
	"       coalesce(r.cross_peers AND a.hi > a.lo AND b.hi > b.lo AND a.lo < b.hi AND b.lo < a.hi,"
	"                false)"
	"  FROM project p JOIN round r ON r.project_id = p.id AND r.version = $2::integer"
	"  LEFT JOIN round_member a ON a.project_id = p.id AND a.version = r.version"
	"                          AND a.host_id = $3::bigint"
	"  LEFT JOIN round_member b ON b.project_id = p.id AND b.version = r.version"
	"                          AND b.host_id = $4::bigint"
	" WHERE p.name = $1",
	4
};

cot_err rdv_pair_check(const char *project, int64_t version, int64_t a, int64_t b, int64_t *project_id,
                       cot_errbuf *eb)
{
	if (a == b)
		return cot_seterr(eb, COT_ERR_FORBIDDEN, "a host cannot meet itself");
	char vs[24], as[24], bs[24];
	snprintf(vs, sizeof vs, "%lld", (long long)version);
	snprintf(as, sizeof as, "%lld", (long long)a);
	snprintf(bs, sizeof bs, "%lld", (long long)b);
	const char *params[] = { project, vs, as, bs };
	PGresult *r = NULL;
	char state[6];
	cot_err rc = dbc_exec(&st_pair, params, &r, state, eb);
	if (rc)
		return rc;
	if (PQntuples(r) != 1) {
		PQclear(r);
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "round %lld of project \"%s\" does not exist",
		                  (long long)version, project);
	}
	*project_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	if (strcmp(PQgetvalue(r, 0, 1), "averaging") != 0) {
		rc = cot_seterr(eb, COT_ERR_CONFLICT, "round %lld of project \"%s\" is %s, not averaging",
		                (long long)version, project, PQgetvalue(r, 0, 1));
	} else if (PQgetisnull(r, 0, 2)) {
		rc = cot_seterr(eb, COT_ERR_FORBIDDEN, "host %lld is not a peer of round %lld", (long long)a,
		                (long long)version);
	} else if ((PQgetisnull(r, 0, 3) || strcmp(PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3)) != 0) &&
	           strcmp(PQgetvalue(r, 0, 4), "t") != 0) {
		rc = cot_seterr(eb, COT_ERR_FORBIDDEN,
		                "host %lld is not in host %lld's group of round %lld, nor holds a slice with "
		                "it",
		                (long long)b, (long long)a, (long long)version);
	}
	PQclear(r);
	return rc;
}

/* ---- Parked halves ---- */

typedef struct pair {
	struct pair *next;
	rdv_kind kind;
	int64_t project_id, version, lo, hi;
	int meetings; /* completed this round */
	int64_t last_ms;
	size_t n; /* parked halves, oldest first, all of one role */
	rdv_half q[RDV_QUEUE_MAX];
} pair;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pair *pairs;
static size_t n_parked, n_pairs;

/* A parked half whose host has gone (closed, or sent anything after its
 * line, which the protocol does not allow) is dead. */
static bool half_dead(const rdv_half *h)
{
	struct pollfd p = { .fd = h->fd, .events = POLLIN };
	return poll(&p, 1, 0) != 0;
}

static pair *pair_find(rdv_kind kind, int64_t project_id, int64_t version, int64_t lo, int64_t hi)
{
	for (pair *p = pairs; p; p = p->next)
		if (p->kind == kind && p->project_id == project_id && p->version == version && p->lo == lo &&
		    p->hi == hi)
			return p;
	return NULL;
}

/* Take the i-th parked half out of p's queue. */
static rdv_half unqueue(pair *p, size_t i)
{
	rdv_half h = p->q[i];
	memmove(&p->q[i], &p->q[i + 1], (p->n - i - 1) * sizeof p->q[0]);
	p->n--;
	n_parked--;
	return h;
}

cot_err rdv_park(rdv_kind kind, int64_t project_id, int64_t version, int64_t peer, const rdv_half *h,
                 rdv_half *partner, cot_errbuf *eb)
{
	/* One queue per direction: in an all-reduce two aggregators each dial
	 * the other, and those are different connections. */
	int64_t lo = h->dial ? h->host : peer, hi = h->dial ? peer : h->host;
	cot_err rc = COT_OK;
	partner->fd = -1;
	pthread_mutex_lock(&mu);
	pair *p = pair_find(kind, project_id, version, lo, hi);
	if (!p) {
		if (n_pairs >= 16 * RDV_PENDING_MAX) {
			rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "too many pairs are meeting; try again later");
			goto out;
		}
		if (!(p = calloc(1, sizeof *p))) {
			rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
			goto out;
		}
		*p = (pair){ .next = pairs,
			     .kind = kind,
			     .project_id = project_id,
			     .version = version,
			     .lo = lo,
			     .hi = hi };
		pairs = p;
		n_pairs++;
	}
	p->last_ms = h->expires_ms;
	for (size_t i = p->n; i-- > 0;)
		if (half_dead(&p->q[i]))
			close(unqueue(p, i).fd);
	if (p->n > 0 && p->q[0].dial != h->dial) {
		/* The other role waits: the oldest half completes this one. */
		if (p->meetings >= RDV_ATTEMPTS_MAX) {
			rc = cot_seterr(eb, COT_ERR_CONFLICT,
			                "hosts %lld and %lld already met %d times in round %lld",
			                (long long)lo, (long long)hi, RDV_ATTEMPTS_MAX, (long long)version);
			goto out;
		}
		p->meetings++;
		*partner = unqueue(p, 0);
		goto out;
	}
	/* The same role: one more connection of this pair waits its turn. */
	if (p->n >= RDV_QUEUE_MAX || p->meetings + (int)p->n >= RDV_ATTEMPTS_MAX) {
		rc = cot_seterr(eb, COT_ERR_CONFLICT,
		                "host %lld already has %zu halves waiting for host %lld%s",
		                (long long)h->host, p->n, (long long)peer,
		                p->n < RDV_QUEUE_MAX ? " and no meetings left this round" : "");
		goto out;
	}
	if (n_parked >= RDV_PENDING_MAX) {
		rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "too many hosts are waiting; try again later");
		goto out;
	}
	p->q[p->n++] = *h;
	n_parked++;
out:
	pthread_mutex_unlock(&mu);
	return rc;
}

void rdv_expire(int64_t now_ms, void (*expired)(int fd, int64_t host))
{
	rdv_half gone[64];
	size_t n = 0;
	pthread_mutex_lock(&mu);
	for (pair **pp = &pairs; *pp;) {
		pair *p = *pp;
		for (size_t i = p->n; i-- > 0 && n < 64;)
			if (p->q[i].expires_ms <= now_ms)
				gone[n++] = unqueue(p, i);
		if (p->n == 0 && now_ms - p->last_ms > PAIR_IDLE_MS) {
			*pp = p->next;
			free(p);
			n_pairs--;
			continue;
		}
		pp = &p->next;
	}
	pthread_mutex_unlock(&mu);
	for (size_t i = 0; i < n; i++)
		expired(gone[i].fd, gone[i].host);
}

void rdv_clear(void)
{
	pthread_mutex_lock(&mu);
	while (pairs) {
		pair *p = pairs;
		pairs = p->next;
		for (size_t i = 0; i < p->n; i++)
			close(p->q[i].fd);
		free(p);
	}
	n_parked = n_pairs = 0;
	pthread_mutex_unlock(&mu);
}
