/* cotrain-server: GET /v1/projects/{name}/checkpoints/{sha256}, where a
 * joining or forked peer learns how to fetch a checkpoint from its peers
 * (doc/design.md, "Checkpoints from peers"; doc/api.md, "Checkpoints").
 *
 * The answer is the checkpoint's piece manifest (shared/common/ckpt_pieces.h)
 * and the hosts that hold it (ckpt_sources in db/functions/ckpt_sources.sql):
 * a few kilobytes however large the model, which is the server's whole
 * egress for a joiner that its peers serve.  A manifest is built by reading
 * and hashing the file once; the last few are kept in memory, since joiners
 * ask for the same current checkpoint. */
#include "server/api.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"
#include "shared/common/ckpt_pieces.h"
#include "shared/common/filestore.h"
#include "shared/common/hash.h"
#include "shared/common/log.h"

#define SOURCES_MAX 16 /* peers named in one answer (pieces.h: PIECES_SOURCES_MAX) */
#define CACHED 4       /* manifests kept */

static struct {
	char sha[HASH_SHA256_HEX_LEN + 1];
	json_t *manifest;
	unsigned long used;
} cache[CACHED];
static unsigned long cache_clock;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

/* The manifest of file sha as JSON (a new reference), from the cache or
 * built from the store.  NULL with eb set when the file cannot be read. */
static json_t *manifest_json(const char *files_dir, const char *sha, cot_errbuf *eb)
{
	pthread_mutex_lock(&cache_mu);
	for (int i = 0; i < CACHED; i++)
		if (cache[i].manifest && strcmp(cache[i].sha, sha) == 0) {
			cache[i].used = ++cache_clock;
			json_t *j = json_incref(cache[i].manifest);
			pthread_mutex_unlock(&cache_mu);
			return j;
		}
	pthread_mutex_unlock(&cache_mu);
	char path[4200];
	ckpt_manifest m;
	if (fs_path(files_dir, sha, path, sizeof path, eb) || ckpt_manifest_build(path, sha, &m, eb))
		return NULL;
	json_t *j = ckpt_manifest_to_json(&m);
	ckpt_manifest_free(&m);
	if (!j) {
		cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	pthread_mutex_lock(&cache_mu);
	int victim = 0;
	for (int i = 1; i < CACHED; i++)
		if (cache[i].used < cache[victim].used)
			victim = i;
	json_decref(cache[victim].manifest);
	snprintf(cache[victim].sha, sizeof cache[victim].sha, "%s", sha);
	cache[victim].manifest = json_incref(j);
	cache[victim].used = ++cache_clock;
	pthread_mutex_unlock(&cache_mu);
	return j;
}

static const dbc_stmt st_sources = { "ckpt_sources",
	                             "SELECT status, body FROM ckpt_sources($1::bytea, $2, $3, $4)", 4 };

void api_checkpoint_sources(http_req *req)
{
	char hp[API_HASH_PARAM_LEN];
	const char *sha = req->params[1];
	if (!api_bearer(req, hp))
		return;
	if (!hash_is_sha256_hex(sha)) {
		http_reply_error(req, 400, "invalid", "checkpoint name is not a sha256",
		                 "Checkpoints are named by 64 lowercase hexadecimal digits.");
		return;
	}
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	char lim[8];
	snprintf(lim, sizeof lim, "%d", SOURCES_MAX);
	const char *params[] = { hp, req->params[0], sha, lim };
	PGresult *r = api_exec(req, &st_sources, params, NULL);
	if (!r)
		return;
	if (PQntuples(r) != 1 || atoi(PQgetvalue(r, 0, 0)) != 200) {
		api_relay_result(req, r);
		PQclear(r);
		return;
	}
	json_t *body = json_loads(PQgetvalue(r, 0, 1), 0, NULL);
	PQclear(r);
	cot_errbuf eb = { "", "" };
	json_t *m = body ? manifest_json(req->cfg->files_dir, sha, &eb) : NULL;
	if (!body || !m) {
		log_error("checkpoint %s: could not build its piece manifest: %s", sha,
		          body ? eb.msg : "bad answer from the database");
		json_decref(body);
		http_reply_error(req, 500, "internal", "could not build the checkpoint's piece manifest",
		                 NULL);
		return;
	}
	json_object_set(body, "piece_size", json_object_get(m, "piece_size"));
	json_object_set(body, "pieces", json_object_get(m, "pieces"));
	json_decref(m);
	http_reply_json(req, 200, body);
}
