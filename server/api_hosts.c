/* cotrain-server: hosts: register under an account (receiving a host id and
 * a host token; the same host again for the same machine id,
 * db/functions/hosts.sql), show (with what the NAT service learned of it and
 * the rungs of its latest round's connections, db/functions/nat.sql), revoke.  Only the owning account may see or revoke a
 * host (403 for any other).  Host tokens are 32 random bytes in base64url; the
 * database keeps their sha256 only. */
#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"

/* db/functions/hosts.sql: a machine id gives back the account's host of
 * that machine (same id, new token). */
static const dbc_stmt st_register = { "host_register",
	                              "SELECT host_id, reused FROM host_register($1, $2::bytea,"
	                              " nullif($3, ''), $4, $5, $6, $7, $8, $9, $10, $11)",
	                              11 };

/* A machine id is 64 lowercase hex digits (client/hostinfo.h). */
static bool machine_id_ok(const char *s)
{
	size_t n = 0;
	for (; s[n]; n++)
		if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
			return false;
	return n == 0 || n == 64;
}

void api_host_register(http_req *req)
{
	long long account;
	if (!api_account(req, &account))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	const char *cpu = "", *gpu = "", *version = "", *os_name = "", *os_version = "", *machine = "";
	long long cores = 1, memory = 0;
	double flops = 0;
	cot_errbuf eb = { 0 };
	if (cot_json_num(body, "flops", true, 1.0, 1e21, &flops, &eb) ||
	    cot_json_str(body, "cpu_model", false, 0, 256, &cpu, &eb) ||
	    cot_json_int(body, "cores", false, 1, 4096, &cores, &eb) ||
	    cot_json_int(body, "memory_bytes", false, 0, 1LL << 52, &memory, &eb) ||
	    cot_json_str(body, "gpu", false, 0, 256, &gpu, &eb) ||
	    cot_json_str(body, "client_version", false, 0, 64, &version, &eb) ||
	    cot_json_str(body, "os_name", false, 0, 64, &os_name, &eb) ||
	    cot_json_str(body, "os_version", false, 0, 128, &os_version, &eb) ||
	    cot_json_str(body, "machine_id", false, 0, 64, &machine, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	if (!api_text_ok(req, "cpu_model", cpu) || !api_text_ok(req, "gpu", gpu) ||
	    !api_text_ok(req, "client_version", version) || !api_text_ok(req, "os_name", os_name) ||
	    !api_text_ok(req, "os_version", os_version))
		goto out;
	if (!machine_id_ok(machine)) {
		http_reply_error(req, 400, "invalid", "\"machine_id\" must be 64 lowercase hex digits",
		                 "The client derives it from its state folder; leave it out to register "
		                 "a new host.");
		goto out;
	}
	char token[48], hp[API_HASH_PARAM_LEN];
	unsigned char md[HASH_SHA256_LEN];
	if (hash_random_token(32, token, sizeof token) || hash_sha256(token, strlen(token), md)) {
		http_reply_error(req, 500, "internal_error", "could not draw a random token", NULL);
		goto out;
	}
	hp[0] = '\\';
	hp[1] = 'x';
	hash_hex(md, sizeof md, hp + 2);
	char acc[24], scores[24], smem[24], sflops[40];
	snprintf(acc, sizeof acc, "%lld", account);
	snprintf(scores, sizeof scores, "%lld", cores);
	snprintf(smem, sizeof smem, "%lld", memory);
	snprintf(sflops, sizeof sflops, "%.17g", flops);
	const char *params[] = { acc, hp,     machine, cpu,     scores,    smem,
		                 gpu, sflops, version, os_name, os_version };
	PGresult *r = api_exec(req, &st_register, params, NULL);
	if (!r)
		goto out;
	bool reused = PQgetvalue(r, 0, 1)[0] == 't';
	http_reply_json(req, reused ? 200 : 201,
	                json_pack("{s:I, s:s, s:b}", "host_id",
	                          (json_int_t)strtoll(PQgetvalue(r, 0, 0), NULL, 10), "host_token", token,
	                          "reused", reused));
	PQclear(r);
out:
	json_decref(body);
}

/* 404 when the host does not exist, 403 when it is another account's. */
static bool owned(http_req *req, PGresult *r, long long account)
{
	char msg[80];
	if (PQntuples(r) != 1) {
		snprintf(msg, sizeof msg, "host %s does not exist", req->params[0]);
		http_reply_error(req, 404, "not_found", msg, NULL);
		return false;
	}
	if (strtoll(PQgetvalue(r, 0, 0), NULL, 10) != account) {
		snprintf(msg, sizeof msg, "host %s belongs to another account", req->params[0]);
		http_reply_error(req, 403, "forbidden", msg, NULL);
		return false;
	}
	return true;
}

static const dbc_stmt st_get = {
	"host_get",
	"SELECT h.account_id, json_build_object('id', h.id, 'account_id', h.account_id,"
	"       'cpu_model', h.cpu_model, 'cores', h.cores, 'memory_bytes', h.memory_bytes,"
	"       'gpu', h.gpu, 'flops', h.flops, 'client_version', h.client_version,"
	"       'os_name', h.os_name, 'os_version', h.os_version, 'revoked', h.revoked,"
	"       'created_at', h.created_at, 'last_seen', h.last_seen, 'merged_into', h.merged_into,"
	"       'reachability', host_reachability_json(h, true),"
	"       'links', host_links_json(h.id))::text"
	"  FROM host h WHERE h.id = $1",
	1
};

void api_host_get(http_req *req)
{
	long long id, account;
	if (!api_path_id(req, 0, "host", &id) || !api_account(req, &account))
		return;
	const char *params[] = { req->params[0] };
	PGresult *r = api_exec(req, &st_get, params, NULL);
	if (!r)
		return;
	if (owned(req, r, account))
		http_reply_raw(req, 200, PQgetvalue(r, 0, 1), (size_t)PQgetlength(r, 0, 1));
	PQclear(r);
}

static const dbc_stmt st_revoke = { "host_revoke",
	                            "WITH h AS (SELECT account_id FROM host WHERE id = $1),"
	                            "     u AS (UPDATE host SET revoked = true WHERE id = $1 AND account_id "
	                            "= $2 RETURNING id)"
	                            " SELECT h.account_id, (SELECT count(*) FROM u) FROM h",
	                            2 };

void api_host_revoke(http_req *req)
{
	long long id, account;
	if (!api_path_id(req, 0, "host", &id) || !api_account(req, &account))
		return;
	char acc[24];
	snprintf(acc, sizeof acc, "%lld", account);
	const char *params[] = { req->params[0], acc };
	PGresult *r = api_exec(req, &st_revoke, params, NULL);
	if (!r)
		return;
	if (owned(req, r, account))
		http_reply_json(req, 200, json_pack("{s:I, s:b}", "host_id", (json_int_t)id, "revoked", 1));
	PQclear(r);
}
