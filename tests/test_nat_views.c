/* cotrain tests: the rungs hosts report with their round outcome ("links",
 * db/functions/nat.sql) and the views of a host's network
 * position, through the real cotrain-server and PostgreSQL.
 *
 * Round 0 of a project is put in 'averaging' with hosts A, B and C as its
 * peers (D is registered but not in the round).  Checked: an outcome with
 * links is stored (a peer outside the round ignored); every malformed links
 * field is answered 400 and changes nothing, the rest of the outcome
 * included; a repeated outcome upserts the links, a conflicting one stores
 * none; a 'failed' outcome keeps its links although the round loses its
 * members; the owner's GET /v1/hosts/{id} and the public GET
 * /api/v1/hosts/{id}/network show "reachability" (the public endpoint to the
 * owner only) and "links" (the latest round's connections both ways, rung
 * counts over the latest 20 rounds); GET /v1/hosts/{id}/nat answers from the
 * host row when this server has not classified the host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/tap.h"
#include "tests/test_server_harness.h"

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static th_host A, B, C, D;
static long long pid;

/* round_link as text, for before/after comparisons. */
static char *links_fingerprint(void)
{
	PGresult *r = PQexec(th_db(), "SELECT count(*) || ':' || coalesce(md5(string_agg("
	                              "t::text, ',' ORDER BY t::text)), '') FROM round_link t");
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		bail_out("round_link fingerprint: %s", PQerrorMessage(th_db()));
	char *s = strdup(PQgetvalue(r, 0, 0));
	PQclear(r);
	return s;
}

static char *outcome_body(const th_host *h, const char *status, const char *links)
{
	char *b = NULL;
	if (asprintf(&b,
	             "{\"host_id\": %lld, \"status\": \"%s\", \"params_sha256\": \"%s\","
	             " \"included_hosts\": [%lld, %lld, %lld]%s%s}",
	             h->id, status, SHA, A.id, B.id, C.id, links ? ", \"links\": " : "",
	             links ? links : "") < 0)
		bail_out("out of memory");
	return b;
}

/* A refused outcome of h: 400 invalid, nothing changed (rounds, hosts and
 * round_link). */
static void refused_links(const th_host *h, const char *links, const char *what)
{
	char *body = outcome_body(h, "ok", links);
	char *before = links_fingerprint();
	th_refused("POST", "/v1/projects/nv/rounds/0/outcome", h->token, body, 400, "invalid", what);
	char *after = links_fingerprint();
	ok(strcmp(before, after) == 0, "  and no link was stored");
	free(before);
	free(after);
	free(body);
}

static void setup(void)
{
	th_start(NULL);
	pid = th_seed_project("nv", 60, 1e6, 4, 16, 4, 100000);
	th_host_new(&A, "nv-a", 1e9);
	th_host_new(&B, "nv-b", 1e9);
	th_host_new(&C, "nv-c", 1e9);
	th_host_new(&D, "nv-d", 1e9);
	th_sql("UPDATE round SET state = 'averaging', plan_deadline = now() + interval '1 hour'"
	       " WHERE project_id = %lld AND version = 0",
	       pid);
	const th_host *m[] = { &A, &B, &C };
	for (int i = 0; i < 3; i++)
		th_sql("INSERT INTO round_member (project_id, version, host_id, group_id, samples, endpoint,"
		       " bandwidth, can_aggregate, lo, hi, included)"
		       " VALUES (%lld, 0, %lld, 0, 4, '192.0.2.%d:7070', 1e6, true, 0, 0, true)",
		       pid, m[i]->id, i + 1);
}

static long long link_count(const th_host *h)
{
	return th_sql_int("SELECT count(*) FROM round_link WHERE host_id = %lld", h->id);
}

static void test_outcome_links(void)
{
	const char *op = "/v1/projects/nv/rounds/0/outcome";
	char links[512];
	snprintf(links, sizeof links,
	         "[{\"peer\": %lld, \"rung\": \"direct\", \"connect_ms\": 12.5},"
	         " {\"peer\": %lld, \"rung\": \"relay\", \"connect_ms\": 830},"
	         " {\"peer\": %lld, \"rung\": \"punch\", \"connect_ms\": 5}]",
	         B.id, C.id, D.id);
	char *body = outcome_body(&A, "ok", links);
	th_resp r = th_call("POST", op, A.token, body, 200, "an outcome with links");
	th_resp_free(&r);
	is_int(link_count(&A), 2, "two links stored: the peer outside the round is ignored");
	is_int(th_sql_int("SELECT count(*) FROM round_link WHERE host_id = %lld AND peer_id = %lld"
	                  " AND rung = 'direct' AND connect_ms = 12.5 AND project_id = %lld AND version = 0",
	                  A.id, B.id, pid),
	       1, "the link to B: direct, 12.5 ms");
	is_int(th_sql_int("SELECT count(*) FROM round_link WHERE host_id = %lld AND peer_id = %lld"
	                  " AND rung = 'relay' AND connect_ms = 830",
	                  A.id, C.id),
	       1, "the link to C: relay, 830 ms");
	is_int(th_sql_int("SELECT count(*) FROM round_link WHERE peer_id = %lld", D.id), 0,
	       "nothing about D, which is not in the round");

	/* Malformed links: 400, and B's outcome is not applied either. */
	char big[256 * 64 + 64];
	size_t n = (size_t)snprintf(big, sizeof big, "[");
	for (int i = 0; i < 257; i++)
		n += (size_t)snprintf(big + n, sizeof big - n,
		                      "%s{\"peer\": %d, \"rung\": \"relay\", \"connect_ms\": 1}",
		                      i ? "," : "", i + 1);
	snprintf(big + n, sizeof big - n, "]");
	char bad[512];
	refused_links(&B, "{}", "links that are not an array");
	refused_links(&B, big, "257 links");
	refused_links(&B, "[5]", "a link that is not an object");
	snprintf(bad, sizeof bad, "[{\"rung\": \"direct\", \"connect_ms\": 1}]");
	refused_links(&B, bad, "a link without its peer");
	refused_links(&B, "[{\"peer\": 0, \"rung\": \"direct\", \"connect_ms\": 1}]", "a link to peer 0");
	snprintf(bad, sizeof bad, "[{\"peer\": \"%lld\", \"rung\": \"direct\", \"connect_ms\": 1}]", A.id);
	refused_links(&B, bad, "a peer given as a string");
	snprintf(bad, sizeof bad, "[{\"peer\": %lld, \"rung\": \"tcp\", \"connect_ms\": 1}]", A.id);
	refused_links(&B, bad, "an unknown rung");
	snprintf(bad, sizeof bad, "[{\"peer\": %lld, \"connect_ms\": 1}]", A.id);
	refused_links(&B, bad, "a link without its rung");
	snprintf(bad, sizeof bad, "[{\"peer\": %lld, \"rung\": \"punch\", \"connect_ms\": -1}]", A.id);
	refused_links(&B, bad, "a negative connect_ms");
	snprintf(bad, sizeof bad, "[{\"peer\": %lld, \"rung\": \"punch\", \"connect_ms\": 600001}]", A.id);
	refused_links(&B, bad, "a connect_ms over 600000");
	snprintf(bad, sizeof bad, "[{\"peer\": %lld, \"rung\": \"punch\"}]", A.id);
	refused_links(&B, bad, "a link without connect_ms");
	snprintf(bad, sizeof bad,
	         "[{\"peer\": %lld, \"rung\": \"punch\", \"connect_ms\": 3},"
	         " {\"peer\": %lld, \"rung\": \"relay\", \"connect_ms\": 4}]",
	         A.id, A.id);
	refused_links(&B, bad, "the same peer twice");
	th_http(NULL, "POST", op, B.token, "{}", NULL, &r);
	th_resp_free(&r);
	ok(th_sql_int("SELECT count(*) FROM round_member WHERE host_id = %lld AND outcome IS NULL", B.id) ==
	           1,
	   "B's outcome was not applied by any of them");
	char *m = NULL;
	{
		char *bb = outcome_body(&B, "ok", "7");
		th_http(NULL, "POST", op, B.token, bb, NULL, &r);
		m = strdup(th_json_str(&r, "error.message") ? th_json_str(&r, "error.message") : "");
		th_resp_free(&r);
		free(bb);
	}
	is_str(m, "field \"links\" must be an array of at most 256 connections",
	       "the message names the field and its bounds");
	free(m);
	snprintf(bad, sizeof bad,
	         "[{\"peer\": %lld, \"rung\": \"direct\", \"connect_ms\": 1},"
	         " {\"peer\": %lld, \"rung\": \"tcp\", \"connect_ms\": 1}]",
	         A.id, C.id);
	char *bb = outcome_body(&B, "ok", bad);
	th_http(NULL, "POST", op, B.token, bb, NULL, &r);
	is_str(th_json_str(&r, "error.message"),
	       "links[1]: field \"rung\" must be \"lan\", \"direct\", \"punch\" or \"relay\"",
	       "the message names the entry");
	th_resp_free(&r);
	free(bb);

	/* A repeated outcome upserts; null links leave them as they are. */
	snprintf(links, sizeof links, "[{\"peer\": %lld, \"rung\": \"punch\", \"connect_ms\": 20}]", B.id);
	free(body);
	body = outcome_body(&A, "ok", links);
	r = th_call("POST", op, A.token, body, 200, "the same outcome again, with another rung to B");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM round_link WHERE host_id = %lld AND peer_id = %lld"
	                  " AND rung = 'punch' AND connect_ms = 20",
	                  A.id, B.id),
	       1, "the link to B was replaced (punch, 20 ms)");
	is_int(link_count(&A), 2, "the link to C stays");
	free(body);
	body = outcome_body(&A, "ok", "null");
	r = th_call("POST", op, A.token, body, 200, "the same outcome with links null");
	th_resp_free(&r);
	is_int(link_count(&A), 2, "null links change nothing");
	free(body);

	/* A conflicting outcome stores no links. */
	snprintf(links, sizeof links, "[{\"peer\": %lld, \"rung\": \"relay\", \"connect_ms\": 99}]", B.id);
	body = outcome_body(&A, "failed", links);
	char *before = links_fingerprint();
	th_refused("POST", op, A.token, body, 409, "conflict", "a different outcome with links");
	char *after = links_fingerprint();
	is_str(after, before, "  and its links were not stored");
	free(before);
	free(after);
	free(body);

	/* B reports that it dialed A by punching, and C is not a peer of D's
	 * round: D's outcome is refused and stores nothing. */
	snprintf(links, sizeof links, "[{\"peer\": %lld, \"rung\": \"punch\", \"connect_ms\": 40.25}]", A.id);
	body = outcome_body(&B, "ok", links);
	r = th_call("POST", op, B.token, body, 200, "B's outcome with its link to A");
	th_resp_free(&r);
	free(body);
	snprintf(links, sizeof links, "[{\"peer\": %lld, \"rung\": \"direct\", \"connect_ms\": 1}]", A.id);
	body = outcome_body(&D, "ok", links);
	r = th_call("POST", op, D.token, body, 409, "an outcome with links from a host not in the round");
	th_resp_free(&r);
	free(body);
	is_int(link_count(&D), 0, "  stores no link");
}

static json_t *jget(json_t *o, const char *a, const char *b)
{
	json_t *v = json_object_get(o, a);
	return b ? json_object_get(v, b) : v;
}

/* The entry of list whose "peer" is peer, or NULL. */
static json_t *peer_entry(json_t *list, long long peer)
{
	size_t i;
	json_t *e;
	json_array_foreach(list, i, e) if (json_integer_value(json_object_get(e, "peer")) == peer) return e;
	return NULL;
}

static void test_views(void)
{
	char path[128];
	th_sql("UPDATE host SET nat_class = 'nat', nat_mapping = 'independent',"
	       " nat_public_addr = '198.51.100.7', nat_public_port = 40000,"
	       " nat_observed_at = '2030-01-01 00:00:00+00', relay_bytes_in = 1234,"
	       " relay_bytes_out = 5678, relay_sessions = 3 WHERE id = %lld",
	       A.id);
	snprintf(path, sizeof path, "/api/v1/hosts/%lld", A.id);
	th_resp r = th_call("GET", path, A.key, NULL, 200, "the owner's host view");
	json_t *re = jget(r.json, "reachability", NULL), *li = jget(r.json, "links", NULL);
	ok(json_is_object(re) && json_is_object(li), "it has \"reachability\" and \"links\"");
	is_str(json_string_value(jget(re, "class", NULL)), "nat", "reachability.class");
	is_str(json_string_value(jget(re, "mapping", NULL)), "independent", "reachability.mapping");
	is_str(json_string_value(jget(re, "public_endpoint", NULL)), "198.51.100.7:40000",
	       "reachability.public_endpoint, for the owner");
	ok(json_string_value(jget(re, "observed_at", NULL)) &&
	           strncmp(json_string_value(jget(re, "observed_at", NULL)), "2030-01-01", 10) == 0,
	   "reachability.observed_at");
	ok(json_integer_value(jget(re, "relay_bytes_in", NULL)) == 1234 &&
	           json_integer_value(jget(re, "relay_bytes_out", NULL)) == 5678 &&
	           json_integer_value(jget(re, "relay_sessions", NULL)) == 3,
	   "reachability.relay_bytes_in, relay_bytes_out, relay_sessions");
	is_str(json_string_value(jget(li, "project", NULL)), "nv", "links.project");
	ok(json_integer_value(jget(li, "version", NULL)) == 0 && json_is_integer(jget(li, "version", NULL)),
	   "links.version: round 0");
	json_t *dialed = jget(li, "dialed", NULL), *acc = jget(li, "accepted", NULL);
	json_t *eb = peer_entry(dialed, B.id), *ec = peer_entry(dialed, C.id), *ea = peer_entry(acc, B.id);
	ok(json_array_size(dialed) == 2 && eb && ec &&
	           strcmp(json_string_value(json_object_get(eb, "rung")) ?: "", "punch") == 0 &&
	           json_number_value(json_object_get(eb, "connect_ms")) == 20 &&
	           strcmp(json_string_value(json_object_get(ec, "rung")) ?: "", "relay") == 0 &&
	           json_number_value(json_object_get(ec, "connect_ms")) == 830,
	   "links.dialed: B punch 20 ms, C relay 830 ms");
	ok(json_array_size(acc) == 1 && ea &&
	           strcmp(json_string_value(json_object_get(ea, "rung")) ?: "", "punch") == 0 &&
	           json_number_value(json_object_get(ea, "connect_ms")) == 40.25,
	   "links.accepted: B dialed A by punching, 40.25 ms");
	json_t *last = jget(li, "last_20_rounds", NULL);
	ok(json_integer_value(json_object_get(last, "rounds")) == 1 &&
	           json_integer_value(json_object_get(last, "direct")) == 0 &&
	           json_integer_value(json_object_get(last, "punch")) == 1 &&
	           json_integer_value(json_object_get(last, "relay")) == 1,
	   "links.last_20_rounds: 1 round, 1 punch, 1 relay");
	th_resp_free(&r);
	snprintf(path, sizeof path, "/v1/hosts/%lld", A.id);
	th_refused("GET", path, B.key, NULL, 403, "forbidden", "another account's host view");
	th_refused("GET", path, NULL, NULL, 401, "unauthorized", "the host view without a key");

	/* The public view: the same, less the address. */
	snprintf(path, sizeof path, "/api/v1/hosts/%lld/network", A.id);
	r = th_call("GET", path, NULL, NULL, 200, "the public network view");
	re = jget(r.json, "reachability", NULL);
	li = jget(r.json, "links", NULL);
	ok(th_json_int(&r, "host_id") == A.id && json_is_object(re) && !jget(re, "public_endpoint", NULL) &&
	           !strstr(r.body, "198.51.100.7"),
	   "it has reachability without the public endpoint");
	is_str(json_string_value(jget(re, "class", NULL)), "nat", "  and the class");
	ok(json_array_size(jget(li, "dialed", NULL)) == 2 && json_array_size(jget(li, "accepted", NULL)) == 1,
	   "  and the links");
	th_resp_free(&r);
	th_refused("GET", "/api/v1/hosts/999999/network", NULL, NULL, 404, "not_found",
	           "the network view of an unknown host");
	th_refused("GET", "/api/v1/hosts/x1/network", NULL, NULL, 400, "invalid",
	           "the network view of a malformed id");

	/* A host never classified. */
	snprintf(path, sizeof path, "/v1/hosts/%lld", D.id);
	r = th_call("GET", path, D.key, NULL, 200, "a host the NAT service never saw");
	is_str(th_json_str(&r, "reachability.class"), "unknown", "its class is unknown");
	ok(json_is_null(jget(jget(r.json, "reachability", NULL), "public_endpoint", NULL)) &&
	           json_is_null(jget(jget(r.json, "links", NULL), "version", NULL)) &&
	           json_array_size(jget(jget(r.json, "links", NULL), "dialed", NULL)) == 0,
	   "  no endpoint, no round, no links");
	th_resp_free(&r);

	/* /nat without the NAT service: the host row. */
	snprintf(path, sizeof path, "/v1/hosts/%lld/nat", A.id);
	r = th_call("GET", path, A.key, NULL, 200, "GET /v1/hosts/{id}/nat");
	ok(strcmp(th_json_str(&r, "source") ?: "", "database") == 0 &&
	           strcmp(th_json_str(&r, "reachability") ?: "", "nat") == 0 &&
	           strcmp(th_json_str(&r, "public_addr") ?: "", "198.51.100.7") == 0 &&
	           th_json_int(&r, "public_port") == 40000 && th_json_int(&r, "relay_bytes_in") == 1234,
	   "  answers from the host row when this server never classified the host");
	th_resp_free(&r);
}

/* The latest 20 rounds: rounds 1..25 with one link each (A to B), the rung
 * cycling direct, punch, relay; a failed outcome keeps its links. */
static void test_last_rounds(void)
{
	th_sql("INSERT INTO round (project_id, version, state) SELECT %lld, v, 'committed'"
	       " FROM generate_series(1, 25) v ON CONFLICT DO NOTHING",
	       pid);
	th_sql("INSERT INTO round_link (project_id, version, host_id, peer_id, rung, connect_ms, reported_at)"
	       " SELECT %lld, v, %lld, %lld, (ARRAY['direct', 'punch', 'relay'])[v %% 3 + 1], v,"
	       "        now() + make_interval(secs => v)"
	       " FROM generate_series(1, 25) v",
	       pid, A.id, B.id);
	char path[128];
	snprintf(path, sizeof path, "/v1/hosts/%lld", A.id);
	th_resp r = th_call("GET", path, A.key, NULL, 200, "the host view after 26 rounds");
	json_t *li = jget(r.json, "links", NULL), *last = jget(li, "last_20_rounds", NULL);
	/* Rounds 6..25: v % 3 == 0 -> direct (6..24: 7 of them), 1 -> punch
	 * (7..25: 7), 2 -> relay (8..23: 6). */
	ok(json_integer_value(json_object_get(last, "rounds")) == 20 &&
	           json_integer_value(json_object_get(last, "direct")) == 7 &&
	           json_integer_value(json_object_get(last, "punch")) == 7 &&
	           json_integer_value(json_object_get(last, "relay")) == 6,
	   "last_20_rounds counts the latest 20 rounds only (7 direct, 7 punch, 6 relay)");
	ok(json_integer_value(jget(li, "version", NULL)) == 25 &&
	           json_array_size(jget(li, "dialed", NULL)) == 1 &&
	           json_number_value(
	                   json_object_get(json_array_get(jget(li, "dialed", NULL), 0), "connect_ms")) == 25,
	   "links shows the latest round (25)");
	th_resp_free(&r);

	/* C fails round 0: the round loses its members, C's links stay. */
	char links[256];
	snprintf(links, sizeof links, "[{\"peer\": %lld, \"rung\": \"relay\", \"connect_ms\": 7}]", A.id);
	char *body = outcome_body(&C, "failed", links);
	r = th_call("POST", "/v1/projects/nv/rounds/0/outcome", C.token, body, 200, "C's failed outcome");
	th_resp_free(&r);
	free(body);
	ok(th_sql_int("SELECT count(*) FROM round_member WHERE project_id = %lld AND version = 0", pid) ==
	                   0 &&
	           link_count(&C) == 1,
	   "the round failed and lost its members; C's link is kept");
}

/* Plans from history (nat_history_skip, doc/nat.md): rounds 101.. with
 * links of B and D that carry their plan. */
static void history_link(int v, const th_host *d, const th_host *a, const char *plan, const char *rung)
{
	th_sql("INSERT INTO round (project_id, version, state) VALUES (%lld, %d, 'committed')"
	       " ON CONFLICT DO NOTHING",
	       pid, v);
	th_sql("INSERT INTO round_link (project_id, version, host_id, peer_id, rung, connect_ms, plan, "
	       "reported_at)"
	       " VALUES (%lld, %d, %lld, %lld, '%s', 1, '%s', now() + make_interval(secs => %d))",
	       pid, v, d->id, a->id, rung, plan, v);
}

static int skips(const th_host *d, const th_host *a, const char *rung)
{
	return th_sql_int("SELECT (nat_history_skip(%lld, %lld, '%s') IS NOT NULL)::int", d->id, a->id, rung);
}

static void test_history(void)
{
	/* A link's plan is stored; an unknown plan is refused. */
	char links[256];
	snprintf(links, sizeof links,
	         "[{\"peer\": %lld, \"rung\": \"relay\", \"connect_ms\": 5, \"plan\": \"punch\"}]", A.id);
	char *body = outcome_body(&B, "ok", links);
	th_resp r = th_call("POST", "/v1/projects/nv/rounds/0/outcome", B.token, body, 200,
	                    "an outcome whose link names its plan");
	th_resp_free(&r);
	free(body);
	is_int(th_sql_int("SELECT count(*) FROM round_link WHERE host_id = %lld AND peer_id = %lld"
	                  " AND plan = 'punch' AND rung = 'relay'",
	                  B.id, A.id),
	       1, "  the plan is stored beside the rung");
	snprintf(links, sizeof links,
	         "[{\"peer\": %lld, \"rung\": \"relay\", \"connect_ms\": 5, \"plan\": \"ice\"}]", A.id);
	body = outcome_body(&B, "ok", links);
	th_refused("POST", "/v1/projects/nv/rounds/0/outcome", B.token, body, 400, "invalid",
	           "a link with an unknown plan");
	free(body);

	is_int(skips(&B, &D, "punch"), 0, "a pair with no history is punched");
	history_link(101, &B, &D, "punch", "relay");
	is_int(skips(&B, &D, "punch"), 0, "one failed punch is not enough to skip it");
	history_link(101, &D, &B, "punch", "relay");
	is_int(skips(&B, &D, "punch"), 1, "two failed punches of the pair in a row: relay at once");
	is_int(skips(&D, &B, "punch"), 1, "  in both directions");
	history_link(102, &B, &D, "relay", "relay");
	history_link(103, &B, &D, "relay", "relay");
	is_int(skips(&B, &D, "punch"), 1, "  still after 2 rounds relayed");
	history_link(104, &B, &D, "relay", "relay");
	is_int(skips(&B, &D, "punch"), 0, "after 3 rounds relayed the punch is tried again");
	history_link(105, &B, &D, "punch", "punch");
	is_int(skips(&B, &D, "punch"), 0, "a punch that connects clears the streak");
	history_link(106, &B, &D, "lan", "relay");
	history_link(106, &D, &B, "lan", "relay");
	is_int(skips(&B, &D, "lan"), 1, "two failed lan dials: the lan rung is skipped");
	char path[128];
	snprintf(path, sizeof path, "/v1/hosts/%lld", B.id);
	r = th_call("GET", path, B.key, NULL, 200, "the host view with history");
	json_t *h = jget(jget(r.json, "links", NULL), "history", NULL);
	json_t *p0 = NULL, *e;
	size_t k;
	json_array_foreach(jget(h, "pairs", NULL), k, e)
	{
		if (json_integer_value(json_object_get(e, "peer")) == D.id)
			p0 = e;
	}
	ok(h && json_integer_value(json_object_get(h, "failed_punches")) == 0 && p0 &&
	           json_integer_value(json_object_get(p0, "peer")) == D.id &&
	           strcmp(json_string_value(json_object_get(p0, "rung")) ?: "", "lan") == 0 &&
	           json_is_true(json_object_get(p0, "skipped")),
	   "links.history names the pair whose lan dial is skipped");
	th_resp_free(&r);
}

int main(void)
{
	plan_lazy();
	setup();
	test_outcome_links();
	test_views();
	test_history();
	test_last_rounds();
	done_testing();
	return exit_status();
}
