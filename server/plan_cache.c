/* cotrain-server: the plan cache (server/plan_cache.h). */
#include "server/plan_cache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dbconn.h"
#include "server/http.h"
#include "shared/common/log.h"

#define SLOTS 4 /* rounds cached at once: one per project planning now */
#define TOKEN_HEX 64
#define STAMP_HEX 32

typedef struct {
	long long host;
	char token[TOKEN_HEX + 1];
	size_t off, len; /* the body in the snapshot's text */
} plan_entry;

typedef struct {
	char project[65]; /* "" for an empty slot */
	long long version;
	unsigned long gen; /* the wake generation it is valid at */
	double fetched_at; /* http_now() before the fetch */
	bool busy;         /* a thread is fetching it or checking its stamp */
	bool has_gradient;
	char stamp[STAMP_HEX + 1];
	plan_entry *e; /* by host id; NULL: nothing held */
	size_t n;
	char *text; /* every body, one after another */
} plan_slot;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static plan_slot slots[SLOTS];

static const dbc_stmt st_all = { "round_plan_all",
	                         "SELECT host_id, token_sha256, has_gradient, stamp, body "
	                         "FROM round_plan_all($1, $2)",
	                         2 };
static const dbc_stmt st_stamp = { "round_plan_stamp", "SELECT round_plan_stamp($1, $2)", 2 };

static plan_slot *find(const char *project, long long version)
{
	for (int i = 0; i < SLOTS; i++)
		if (slots[i].version == version && strcmp(slots[i].project, project) == 0)
			return &slots[i];
	return NULL;
}

static bool young(const plan_slot *s) { return s->e && http_now() - s->fetched_at <= PLAN_CACHE_MAX_AGE_S; }

static void drop(plan_slot *s)
{
	free(s->e);
	free(s->text);
	s->e = NULL;
	s->text = NULL;
	s->n = 0;
}

/* Equal 64-character hex strings, in time that does not depend on where
 * they differ. */
static bool same_token(const char *a, const char *b)
{
	unsigned char d = 0;
	for (int i = 0; i < TOKEN_HEX; i++)
		d |= (unsigned char)(a[i] ^ b[i]);
	return d == 0;
}

/* Run st (parameters: project, version) on this thread's connection: its
 * result (the caller PQclear()s), or NULL with the error in *eb. */
static PGresult *round_query(const dbc_stmt *st, const char *project, long long version, cot_errbuf *eb)
{
	char sv[24];
	snprintf(sv, sizeof sv, "%lld", version);
	const char *params[] = { project, sv };
	PGresult *r = NULL;
	char sqlstate[6];
	return dbc_exec(st, params, &r, sqlstate, eb) == COT_OK ? r : NULL;
}

/* The round's stamp now, into out; false when the query fails or there is
 * no round. */
static bool read_stamp(const char *project, long long version, char out[STAMP_HEX + 1])
{
	cot_errbuf eb = { 0 };
	PGresult *r = round_query(&st_stamp, project, version, &eb);
	bool ok = r && PQntuples(r) == 1 && PQgetlength(r, 0, 0) == STAMP_HEX;
	if (ok)
		memcpy(out, PQgetvalue(r, 0, 0), STAMP_HEX + 1);
	PQclear(r);
	return ok;
}

/* Keep s (busy, ours) at the plan polls' wake generation now when the
 * round's stamp did not change since its fetch, else drop it.  Takes and
 * gives back the lock. */
static void recheck(plan_slot *s, const char *project, long long version)
{
	pthread_mutex_unlock(&lock);
	unsigned long gen = http_wake_gen_of(HTTP_HOLD_PLAN); /* before the look */
	char now[STAMP_HEX + 1];
	bool same = read_stamp(project, version, now);
	pthread_mutex_lock(&lock);
	if (same && strcmp(now, s->stamp) == 0)
		s->gen = gen;
	else
		drop(s);
	s->busy = false;
}

/* The slot of (project, version), NULL when none; its stamp checked first
 * when a wake-up of the plan polls came since its fetch or its last check
 * (lock held; given back during the check). */
static plan_slot *look_up(const char *project, long long version, unsigned long gen)
{
	plan_slot *s = find(project, version);
	if (s && !s->busy && young(s) && s->gen < gen) { /* woken since: still so? */
		s->busy = true;
		recheck(s, project, version);
	}
	return s;
}

char *plan_cache_get(const char *project, long long version, long long host, const char *token_param,
                     unsigned long gen, size_t *len, bool *has_gradient)
{
	if (!token_param || strlen(token_param) != 2 + TOKEN_HEX)
		return NULL;
	char *out = NULL;
	pthread_mutex_lock(&lock);
	plan_slot *s = look_up(project, version, gen);
	if (s && young(s) && s->gen == gen) {
		size_t lo = 0, hi = s->n;
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;
			if (s->e[mid].host < host)
				lo = mid + 1;
			else
				hi = mid;
		}
		const plan_entry *e = lo < s->n && s->e[lo].host == host ? &s->e[lo] : NULL;
		if (e && same_token(e->token, token_param + 2) && (out = malloc(e->len + 1))) {
			memcpy(out, s->text + e->off, e->len);
			out[e->len] = '\0';
			*len = e->len;
			*has_gradient = s->has_gradient;
		}
	}
	pthread_mutex_unlock(&lock);
	return out;
}

/* The slot to fill for (project, version), marked busy; NULL when a valid
 * snapshot is there, or a thread is busy with it, or with every slot. */
static plan_slot *claim(const char *project, long long version, unsigned long gen)
{
	plan_slot *s = look_up(project, version, gen); /* a stamp check costs less than a fetch */
	if (s && (s->busy || (young(s) && s->gen == gen)))
		return NULL;
	if (!s) { /* the empty slot, or else the one fetched longest ago */
		for (int i = 0; i < SLOTS; i++)
			if (!slots[i].busy && (!s || slots[i].fetched_at < s->fetched_at))
				s = &slots[i];
		if (!s)
			return NULL;
	}
	drop(s);
	memset(s, 0, sizeof *s);
	snprintf(s->project, sizeof s->project, "%s", project);
	s->version = version;
	s->busy = true;
	return s;
}

static int by_host(const void *a, const void *b)
{
	long long x = ((const plan_entry *)a)->host, y = ((const plan_entry *)b)->host;
	return (x > y) - (x < y);
}

/* Build the entries of r (round_plan_all's rows) into s; false when out of
 * memory or a row is not as expected. */
static bool load(plan_slot *s, const PGresult *r)
{
	size_t n = (size_t)PQntuples(r), total = 0;
	if (n == 0 || PQnfields(r) != 5 || PQgetlength(r, 0, 3) != STAMP_HEX)
		return false;
	for (size_t i = 0; i < n; i++)
		total += (size_t)PQgetlength(r, (int)i, 4);
	s->e = calloc(n, sizeof *s->e);
	s->text = malloc(total ? total : 1);
	if (!s->e || !s->text)
		return false;
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		plan_entry *e = &s->e[i];
		const char *tok = PQgetvalue(r, (int)i, 1);
		if (strlen(tok) != TOKEN_HEX)
			return false;
		e->host = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
		memcpy(e->token, tok, TOKEN_HEX + 1);
		e->off = off;
		e->len = (size_t)PQgetlength(r, (int)i, 4);
		memcpy(s->text + off, PQgetvalue(r, (int)i, 4), e->len);
		off += e->len;
	}
	qsort(s->e, n, sizeof *s->e, by_host);
	s->n = n;
	s->has_gradient = PQgetvalue(r, 0, 2)[0] == 't';
	memcpy(s->stamp, PQgetvalue(r, 0, 3), STAMP_HEX + 1);
	return true;
}

void plan_cache_fill(const char *project, long long version, unsigned long gen)
{
	if (strlen(project) >= sizeof slots[0].project)
		return;
	pthread_mutex_lock(&lock);
	plan_slot *s = claim(project, version, gen);
	pthread_mutex_unlock(&lock);
	if (!s)
		return;
	double t0 = http_now();
	cot_errbuf eb = { 0 };
	PGresult *r = round_query(&st_all, project, version, &eb);
	bool ok = r != NULL;
	if (!ok)
		log_warn("plan cache: could not fetch the plans of round %lld of project %s: %s", version,
		         project, eb.msg);
	pthread_mutex_lock(&lock);
	/* The slot is ours while busy: nobody else frees or claims it. */
	if (ok && load(s, r)) {
		s->gen = gen;
		s->fetched_at = t0;
		log_debug("plan cache: the plans of round %lld of project %s for %zu hosts fetched in %.0f "
		          "ms",
		          version, project, s->n, (http_now() - t0) * 1e3);
	} else {
		drop(s);
	}
	s->busy = false;
	pthread_mutex_unlock(&lock);
	PQclear(r);
}
