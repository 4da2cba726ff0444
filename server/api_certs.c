/* cotrain-server: the project CA and host certificates for the peer
 * transport (shared/peer/pki.h).
 *
 * Each project's CA lives in <data dir>/ca/<project>.crt and .key (0600),
 * created the first time anyone asks for it.  Creation is serialised by a
 * mutex between threads and by flock(2) on <data dir>/ca/.lock between
 * server processes sharing the data directory, so there is only ever one CA
 * per project.  The CA is read from disk on every use: the files are small,
 * and an operator may replace them without a restart. */
#include "server/api.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/apiutil.h"
#include "shared/common/json.h"
#include "shared/common/log.h"
#include "shared/peer/pki.h"

static pthread_mutex_t ca_lock = PTHREAD_MUTEX_INITIALIZER;

/* Load the CA of project (a valid project name that exists), creating it on
 * first use.  *out is the caller's (pki_ca_free). */
static cot_err ca_get(const srv_config *cfg, const char *project, pki_ca **out, cot_errbuf *eb)
{
	char dir[4200], crt[4300], key[4300], lockp[4300];
	snprintf(dir, sizeof dir, "%s/ca", cfg->data_dir);
	snprintf(crt, sizeof crt, "%s/%s.crt", dir, project);
	snprintf(key, sizeof key, "%s/%s.key", dir, project);
	snprintf(lockp, sizeof lockp, "%s/.lock", dir);
	/* pki_ca_save writes the key last: when it exists, both do. */
	if (access(key, F_OK) == 0)
		return pki_ca_load(crt, key, out, eb);

	pthread_mutex_lock(&ca_lock);
	cot_err rc = COT_OK;
	int fd = -1;
	if (mkdir(dir, 0700) && errno != EEXIST) {
		rc = cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", dir,
		                strerror(errno));
		goto out;
	}
	fd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_EX)) {
		rc = cot_seterr(eb, COT_ERR_IO, "could not lock \"%s\": %s", lockp, strerror(errno));
		goto out;
	}
	if (access(key, F_OK) == 0) { /* another process made it meanwhile */
		rc = pki_ca_load(crt, key, out, eb);
		goto out;
	}
	pki_ca *ca = NULL;
	rc = pki_ca_create(project, 0, &ca, eb);
	if (!rc)
		rc = pki_ca_save(ca, crt, key, eb);
	if (rc) {
		pki_ca_free(ca);
		unlink(key);
		unlink(crt);
		goto out;
	}
	log_info("created the certificate authority of project \"%s\" in %s", project, dir);
	*out = ca;
out:
	if (fd >= 0)
		close(fd); /* releases the flock */
	pthread_mutex_unlock(&ca_lock);
	return rc;
}

static const dbc_stmt st_project_exists = { "cert_project_exists", "SELECT 1 FROM project WHERE name = $1",
	                                    1 };

/* True when the project exists; otherwise answers 404 (or 503). */
static bool project_exists(http_req *req, const char *name)
{
	if (!pki_project_name_valid(name)) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return false;
	}
	const char *params[] = { name };
	PGresult *r = api_exec(req, &st_project_exists, params, NULL);
	if (!r)
		return false;
	bool found = PQntuples(r) == 1;
	PQclear(r);
	if (!found) {
		char msg[128];
		snprintf(msg, sizeof msg, "project \"%s\" does not exist", name);
		http_reply_error(req, 404, "not_found", msg, NULL);
	}
	return found;
}

void api_project_ca(http_req *req)
{
	const char *name = req->params[0];
	if (!project_exists(req, name))
		return;
	pki_ca *ca = NULL;
	char *pem = NULL;
	cot_errbuf eb = { 0 };
	cot_err rc = ca_get(req->cfg, name, &ca, &eb);
	if (!rc)
		rc = pki_ca_cert_pem(ca, &pem, &eb);
	if (rc) {
		log_error("project \"%s\": %s", name, eb.msg);
		http_reply_error(req, 500, "internal_error",
		                 "could not read the project's certificate authority", NULL);
	} else {
		http_reply_json(req, 200, json_pack("{s:s, s:s}", "project", name, "certificate", pem));
	}
	free(pem);
	pki_ca_free(ca);
}

static const dbc_stmt st_host_auth = { "cert_host_auth",
	                               "SELECT h.id, (SELECT 1 FROM project WHERE name = $2)"
	                               "  FROM host_auth($1::bytea) AS h(id) WHERE h.id IS NOT NULL",
	                               2 };

void api_host_certificate(http_req *req)
{
	long long host;
	char hp[API_HASH_PARAM_LEN];
	if (!api_path_id(req, 0, "host", &host) || !api_bearer(req, hp))
		return;
	json_t *body;
	if (!api_body(req, false, &body))
		return;
	const char *pub = NULL, *project = NULL;
	cot_errbuf eb = { 0 };
	if (cot_json_str(body, "public_key", true, 1, PKI_PEM_MAX, &pub, &eb) ||
	    cot_json_str(body, "project", true, 1, PKI_PROJECT_MAX, &project, &eb)) {
		api_bad_request(req, &eb);
		goto out;
	}
	const char *params[] = { hp, project };
	PGresult *r = api_exec(req, &st_host_auth, params, NULL);
	if (!r)
		goto out;
	bool authed = PQntuples(r) == 1;
	long long token_host = authed ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
	bool known = authed && !PQgetisnull(r, 0, 1);
	PQclear(r);
	char msg[400];
	if (!authed) {
		http_reply_error(req, 401, "unauthorized", "host token is not valid",
		                 "Register the host again to get a new token.");
		goto out;
	}
	if (token_host != host) {
		snprintf(msg, sizeof msg, "this token belongs to host %lld, not to host %lld", token_host,
		         host);
		http_reply_error(req, 403, "forbidden", msg, NULL);
		goto out;
	}
	if (!known) {
		snprintf(msg, sizeof msg, "project \"%.64s\" does not exist", project);
		http_reply_error(req, 404, "not_found", msg, NULL);
		goto out;
	}
	pki_ca *ca = NULL;
	char *cert = NULL, *ca_pem = NULL;
	cot_err rc = ca_get(req->cfg, project, &ca, &eb);
	if (rc) {
		log_error("project \"%s\": %s", project, eb.msg);
		http_reply_error(req, 500, "internal_error",
		                 "could not read the project's certificate authority", NULL);
		goto out;
	}
	rc = pki_ca_sign_host(ca, pub, strlen(pub), host, 0, req->cfg->cert_lifetime, &cert, &eb);
	if (!rc)
		rc = pki_ca_cert_pem(ca, &ca_pem, &eb);
	if (rc == COT_ERR_INVALID || rc == COT_ERR_TOO_LARGE) {
		snprintf(msg, sizeof msg, "field \"public_key\" is not a usable public key: %.200s", eb.msg);
		http_reply_error(req, 400, "invalid", msg,
		                 "Send an Ed25519 or ECDSA P-256 public key as PEM (\"-----BEGIN PUBLIC "
		                 "KEY-----\").");
	} else if (rc) {
		log_error("could not sign a certificate for host %lld: %s", host, eb.msg);
		http_reply_error(req, 500, "internal_error", "could not sign the certificate", NULL);
	} else {
		http_reply_json(req, 200,
		                json_pack("{s:I, s:s, s:s, s:s, s:I}", "host_id", (json_int_t)host, "project",
		                          project, "certificate", cert, "ca_certificate", ca_pem, "lifetime",
		                          (json_int_t)req->cfg->cert_lifetime));
	}
	free(cert);
	free(ca_pem);
	pki_ca_free(ca);
out:
	json_decref(body);
}
