/* cotrain client: the server's v1 API over libcurl (see api.h). */
#include "client/api.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>

#include "kernels/model_json.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"
#include "shared/common/sketch.h"
#include "shared/nat/nat.h"

typedef struct {
	char *buf;
	size_t len;
	int overflow;
	time_t date; /* the server's Date header, 0 when absent */
} answer_buf;

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
	answer_buf *a = arg;
	size_t len = size * n;
	if (a->len + len > CL_API_MAX_ANSWER) {
		a->overflow = 1;
		return 0;
	}
	char *nb = realloc(a->buf, a->len + len + 1);
	if (!nb)
		return 0;
	a->buf = nb;
	memcpy(a->buf + a->len, data, len);
	a->len += len;
	a->buf[a->len] = '\0';
	return len;
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
	answer_buf *a = arg;
	size_t len = size * n;
	char line[128];
	if (len > 5 && len < sizeof line && strncasecmp(data, "Date:", 5) == 0) {
		memcpy(line, data + 5, len - 5);
		line[len - 5] = '\0';
		time_t t = curl_getdate(line, NULL);
		if (t > 0)
			a->date = t;
	}
	return len;
}

static cot_err status_err(long code)
{
	switch (code) {
	case 400:
		return COT_ERR_INVALID;
	case 401:
		return COT_ERR_AUTH;
	case 403:
		return COT_ERR_FORBIDDEN;
	case 404:
		return COT_ERR_NOT_FOUND;
	case 409:
		return COT_ERR_CONFLICT;
	case 413:
		return COT_ERR_TOO_LARGE;
	default:
		return COT_ERR_NETWORK;
	}
}

/* CURLOPT_XFERINFOFUNCTION: abort when the request's cancel flag is set. */
static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	(void)dt, (void)dn, (void)ut, (void)un;
	const volatile int *cancel = arg;
	return *cancel != 0;
}

cot_err cl_api_http(const cl_api_opts *o, const cl_http_req *r, cot_errbuf *eb)
{
	if (r->out)
		*r->out = NULL;
	if (r->err_body)
		*r->err_body = NULL;
	if (r->status)
		*r->status = 0;
	CURL *c = curl_easy_init();
	if (!c)
		return cot_seterr(eb, COT_ERR_NOMEM, "could not start a request");
	const char *method = r->method, *url = r->url;
	answer_buf a = { 0 };
	char *payload = r->json ? json_dumps(r->json, JSON_COMPACT) : NULL;
	struct curl_slist *h = NULL;
	char auth[CL_TOKEN_MAX + 32], ctype[128];
	h = curl_slist_append(h, "Accept: application/json");
	if (payload)
		h = curl_slist_append(h, "Content-Type: application/json");
	if (r->raw) {
		snprintf(ctype, sizeof ctype, "Content-Type: %s",
		         r->ctype ? r->ctype : "application/octet-stream");
		h = curl_slist_append(h, ctype);
	}
	if (r->bearer && r->bearer[0]) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", r->bearer);
		h = curl_slist_append(h, auth);
	}
	char errbuf[CURL_ERROR_SIZE] = "";
	curl_easy_setopt(c, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	if (payload) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(payload));
	} else if (r->raw) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->raw);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->rawlen);
	} else if (strcmp(method, "POST") == 0) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{}");
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &a);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &a);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
	/* A long poll (the round plan waits up to 30 s) idles: TCP keepalive
	 * keeps home routers and CGNATs from forgetting the connection
	 * (doc/nat.md, "Keepalives"; the NAT service's connections do the same). */
	curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(c, CURLOPT_TCP_KEEPIDLE, (long)NAT_KEEPALIVE_IDLE_S);
	curl_easy_setopt(c, CURLOPT_TCP_KEEPINTVL, (long)NAT_KEEPALIVE_INTVL_S);
	long timeout = o && o->timeout_s > 0 ? o->timeout_s : 60;
	curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout + (long)r->extra_timeout_s);
	if (o && o->upload_limit > 0)
		curl_easy_setopt(c, CURLOPT_MAX_SEND_SPEED_LARGE, (curl_off_t)o->upload_limit);
	if (r->cancel) {
		curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
		curl_easy_setopt(c, CURLOPT_XFERINFODATA, (void *)r->cancel);
		curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
	}
	CURLcode cc = curl_easy_perform(c);
	long code = 0;
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	if (r->local_ip && r->local_ip_len) {
		char *ip = NULL;
		r->local_ip[0] = '\0';
		if (curl_easy_getinfo(c, CURLINFO_LOCAL_IP, &ip) == CURLE_OK && ip)
			snprintf(r->local_ip, r->local_ip_len, "%s", ip);
	}
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	free(payload);
	if (r->date)
		*r->date = a.date;
	if (r->status)
		*r->status = code;

	cot_err rc = COT_OK;
	if (a.overflow) {
		rc = cot_seterr(eb, COT_ERR_NETWORK, "answer from %s is larger than %d bytes", url,
		                CL_API_MAX_ANSWER);
		goto out;
	}
	if (cc == CURLE_ABORTED_BY_CALLBACK) {
		rc = cot_seterr(eb, COT_ERR_TIMEOUT, "%s %s was cancelled", method, url);
		goto out;
	}
	if (cc != CURLE_OK) {
		rc = cot_seterr(eb, COT_ERR_NETWORK, "could not reach %s: %s", url,
		                errbuf[0] ? errbuf : curl_easy_strerror(cc));
		goto out;
	}
	if (code == 204)
		goto out; /* no content: *out stays NULL */
	json_t *j = NULL;
	cot_errbuf jeb = { "", "" };
	cot_err prc = a.buf ? cot_json_parse_object(a.buf, a.len, &j, &jeb)
	                    : cot_seterr(&jeb, COT_ERR_INVALID, "empty answer");
	if (code >= 200 && code < 300) {
		if (prc) {
			rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid answer to %s %s: %s",
			                method, url, jeb.msg);
			goto out;
		}
		if (r->out)
			*r->out = j;
		else
			json_decref(j);
		goto out;
	}
	rc = status_err(code);
	const json_t *e = j ? json_object_get(j, "error") : NULL;
	const char *msg = NULL, *hint = NULL;
	if (json_is_object(e)) {
		cot_json_str(e, "message", false, 1, 1000, &msg, NULL);
		cot_json_str(e, "hint", false, 1, 1000, &hint, NULL);
	}
	if (msg)
		cot_seterr(eb, rc, "server: %s (HTTP %ld from %s %s)", msg, code, method, url);
	else
		cot_seterr(eb, rc, "server answered HTTP %ld to %s %s", code, method, url);
	if (hint)
		cot_sethint(eb, "%s", hint);
	if (r->err_body && j)
		*r->err_body = j;
	else
		json_decref(j);
out:
	free(a.buf);
	return rc;
}

/* One JSON request (see cl_api_http); a 204 is refused here, as no caller of
 * this form expects one. */
static cot_err request(const cl_api_opts *o, const char *method, const char *url, const char *bearer,
                       const json_t *body, json_t **out, time_t *date, cot_errbuf *eb)
{
	cl_http_req r = {
		.method = method, .url = url, .bearer = bearer, .json = body, .out = out, .date = date
	};
	cot_err rc = cl_api_http(o, &r, eb);
	if (!rc && !*out)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no answer to %s %s", method, url);
	return rc;
}

cot_err cl_api_parse_project_url(const char *url, char *base, size_t baselen, char *name, size_t namelen,
                                 cot_errbuf *eb)
{
	const char *scheme_end = strstr(url, "://");
	const char *p = strstr(url, "/projects/");
	if (!scheme_end || (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) || !p ||
	    p < scheme_end + 3) {
		cot_seterr(eb, COT_ERR_INVALID, "\"%.200s\" is not a project URL", url);
		cot_sethint(eb, "Use the URL shown on the project's page, such as "
		                "https://example.org/projects/demo.");
		return COT_ERR_INVALID;
	}
	const char *n = p + strlen("/projects/");
	size_t nlen = strcspn(n, "/?#");
	if (nlen == 0 || nlen > CL_NAME_MAX || nlen >= namelen || (n[nlen] == '/' && n[nlen + 1] != '\0') ||
	    n[nlen] == '?' || n[nlen] == '#') {
		cot_seterr(eb, COT_ERR_INVALID,
		           "\"%.200s\" is not a project URL: no project name after /projects/", url);
		return COT_ERR_INVALID;
	}
	for (size_t i = 0; i < nlen; i++)
		if (!((n[i] >= 'a' && n[i] <= 'z') || (n[i] >= '0' && n[i] <= '9') || n[i] == '-'))
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "\"%.200s\" is not a project URL: bad project name", url);
	size_t blen = (size_t)(p - url);
	if (blen >= 3 && strncmp(p - 3, "/v1", 3) == 0)
		blen -= 3;
	if (blen >= baselen)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "project URL is too long");
	memcpy(base, url, blen);
	base[blen] = '\0';
	memcpy(name, n, nlen);
	name[nlen] = '\0';
	return COT_OK;
}

cot_err cl_api_login(const cl_api_opts *o, const char *base, const char *email, const char *password,
                     char key[CL_TOKEN_MAX], cot_errbuf *eb)
{
	char url[CL_URL_MAX + 64];
	snprintf(url, sizeof url, "%s/v1/accounts/login", base);
	json_t *body = json_pack("{s:s, s:s}", "email", email, "password", password);
	json_t *a;
	cot_err rc = body ? request(o, "POST", url, NULL, body, &a, NULL, eb) : COT_ERR_NOMEM;
	json_decref(body);
	if (rc)
		return rc;
	const char *k = NULL;
	cot_errbuf e2 = { "", "" };
	if (cot_json_str(a, "account_key", true, 8, CL_TOKEN_MAX - 1, &k, &e2))
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid login answer: %s", e2.msg);
	else
		memcpy(key, k, strlen(k) + 1);
	json_decref(a);
	return rc;
}

cot_err cl_api_account(const cl_api_opts *o, const char *base, const char *key, cl_prefs *prefs,
                       cot_errbuf *eb)
{
	char url[CL_URL_MAX + 64];
	snprintf(url, sizeof url, "%s/v1/account", base);
	json_t *a;
	cot_err rc = request(o, "GET", url, key, NULL, &a, NULL, eb);
	if (rc)
		return rc;
	const json_t *pj = json_object_get(a, "prefs");
	if (pj && !json_is_null(pj) && prefs) {
		cot_errbuf e2 = { "", "" };
		cl_prefs tmp = { .set = 0 };
		if (cl_prefs_from_json(&tmp, pj, &e2))
			rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent invalid account preferences: %s",
			                e2.msg);
		else
			*prefs = tmp;
	}
	json_decref(a);
	return rc;
}

cot_err cl_api_register_host(const cl_api_opts *o, const char *base, const char *key, const cl_hostinfo *h,
                             int64_t *host_id, char token[CL_TOKEN_MAX], cot_errbuf *eb)
{
	char url[CL_URL_MAX + 64];
	snprintf(url, sizeof url, "%s/v1/hosts", base);
	json_t *body = json_pack("{s:s, s:i, s:I, s:s, s:f, s:s, s:s, s:s}", "cpu_model", h->cpu_model,
	                         "cores", h->cores, "memory_bytes", (json_int_t)h->memory_bytes, "gpu",
	                         h->gpu, "flops", h->flops, "client_version", h->client_version, "os_name",
	                         h->os_name, "os_version", h->os_version);
	if (body && h->machine_id[0] && json_object_set_new(body, "machine_id", json_string(h->machine_id))) {
		json_decref(body);
		body = NULL;
	}
	json_t *a;
	cot_err rc = body ? request(o, "POST", url, key, body, &a, NULL, eb) : COT_ERR_NOMEM;
	json_decref(body);
	if (rc)
		return rc;
	long long id = 0;
	const char *t = NULL;
	cot_errbuf e2 = { "", "" };
	if (cot_json_int(a, "host_id", true, 1, 1LL << 62, &id, &e2) ||
	    cot_json_str(a, "host_token", true, 8, CL_TOKEN_MAX - 1, &t, &e2)) {
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid host registration answer: %s",
		                e2.msg);
	} else {
		*host_id = id;
		memcpy(token, t, strlen(t) + 1);
	}
	json_decref(a);
	return rc;
}

/* The project parameters shared by project info and work units. */
static cot_err project_params(const json_t *j, cl_project *p, cot_errbuf *eb)
{
	long long seq = 0, mbs = 0, mpe = 0;
	double fps = p->flops_per_sample;
	cot_err rc;
	if ((rc = cot_json_int(j, "seq_len", true, 1, 1 << 20, &seq, eb)) ||
	    (rc = cot_json_int(j, "microbatch_size", true, 1, 1 << 20, &mbs, eb)) ||
	    (rc = cot_json_int(j, "mb_per_epoch", true, 1, 1LL << 50, &mpe, eb)) ||
	    (rc = cot_json_num(j, "flops_per_sample", false, 1, 1e21, &fps, eb)))
		return rc;
	p->seq_len = seq;
	p->microbatch_size = mbs;
	p->mb_per_epoch = mpe;
	p->flops_per_sample = fps;
	return COT_OK;
}

cot_err cl_api_project(const cl_api_opts *o, cl_project *p, json_t **info, cot_errbuf *eb)
{
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/projects/%s", p->base, p->name);
	json_t *a;
	cot_err rc = request(o, "GET", url, NULL, NULL, &a, NULL, eb);
	if (rc)
		return rc;
	rc = cl_api_parse_project(a, p, eb);
	if (!rc && info)
		*info = a;
	else
		json_decref(a);
	return rc;
}

cot_err cl_api_parse_project(const json_t *a, cl_project *p, cot_errbuf *eb)
{
	cot_errbuf e2 = { "", "" };
	cl_project tmp = *p;
	if (project_params(a, &tmp, &e2) || !json_is_object(json_object_get(a, "config"))) {
		if (!e2.msg[0])
			cot_seterr(&e2, COT_ERR_INVALID, "field \"config\" must be an object");
		return cot_seterr(eb, COT_ERR_NETWORK,
		                  "server sent invalid information on project \"%s\": %s", p->name, e2.msg);
	}
	const json_t *model = json_object_get(json_object_get(a, "config"), "model");
	long long seed = 0;
	if (kern_model_config_from_json(model, "config.model", 0, &tmp.model, &e2))
		return cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid model for project \"%s\": %s",
		                  p->name, e2.msg);
	if (cot_json_int(a, "seed", false, -(1LL << 62), 1LL << 62, &seed, &e2))
		return cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid seed: %s", e2.msg);
	cot_err rc2 = cl_train_mode_from_config(&tmp.mode, json_object_get(a, "config"), &e2);
	if (rc2)
		return cot_seterr(eb, rc2 == COT_ERR_NOMEM ? rc2 : COT_ERR_NETWORK,
		                  "server sent an invalid training mode for project \"%s\": %s", p->name,
		                  e2.msg);

	p->seq_len = tmp.seq_len;
	p->microbatch_size = tmp.microbatch_size;
	p->mb_per_epoch = tmp.mb_per_epoch;
	p->flops_per_sample = tmp.flops_per_sample;
	p->model = tmp.model;
	p->mode = tmp.mode;
	p->seed = seed;
	return COT_OK;
}

int64_t cl_api_parse_timestamp(const char *s)
{
	int y, mo, d, h, mi, sec, n = 0;
	if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6)
		return -1;
	if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60 || y < 1970 || y > 9999)
		return -1;
	const char *p = s + n;
	if (*p == '.')
		for (p++; *p >= '0' && *p <= '9'; p++)
			;
	long off = 0;
	if (*p == '+' || *p == '-') {
		int oh = 0, om = 0;
		if (sscanf(p + 1, "%2d:%2d", &oh, &om) < 1)
			return -1;
		off = (oh * 3600L + om * 60L) * (*p == '-' ? -1 : 1);
	} else if (*p != 'Z' && *p != '\0') {
		return -1;
	}
	struct tm tm = {
		.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi, .tm_sec = sec
	};
	return (int64_t)timegm(&tm) - off;
}

cot_err cl_api_request_work(const cl_api_opts *o, cl_project *p, cl_work *w, int wait_s, volatile int *cancel,
                            json_t **refusal, cot_errbuf *eb)
{
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/projects/%s/work?wait=%d", p->base, p->name, wait_s);
	json_t *body = json_pack("{s:I}", "host_id", (json_int_t)p->host_id);
	json_t *a = NULL;
	time_t date = 0;
	cl_http_req r = { .method = "POST",
		          .url = url,
		          .bearer = p->host_token,
		          .json = body,
		          .out = &a,
		          .err_body = refusal,
		          .date = &date,
		          .extra_timeout_s = wait_s,
		          .cancel = cancel };
	cot_err rc = body ? cl_api_http(o, &r, eb) : COT_ERR_NOMEM;
	json_decref(body);
	if (rc)
		return rc;
	if (!a)
		return cot_seterr(eb, COT_ERR_NETWORK, "server sent no work unit");
	rc = cl_api_parse_work(a, date, p, w, eb);
	json_decref(a);
	return rc;
}

cot_err cl_api_parse_work(const json_t *a, time_t date, cl_project *p, cl_work *w, cot_errbuf *eb)
{
	cot_errbuf e2 = { "", "" };
	cot_err rc;
	long long id = 0, ver = 0, lo = 0, hi = 0;
	const char *deadline = NULL;
	cl_project tmp = *p;
	const json_t *files = json_object_get(a, "files");
	memset(w, 0, sizeof *w);
	if ((rc = cot_json_int(a, "work_unit_id", true, 1, 1LL << 62, &id, &e2)) ||
	    (rc = cot_json_int(a, "version", true, 0, 1LL << 31, &ver, &e2)) ||
	    (rc = cot_json_int(a, "lo", true, 0, 1LL << 60, &lo, &e2)) ||
	    (rc = cot_json_int(a, "hi", true, lo + 1, lo + (1LL << 40), &hi, &e2)) ||
	    (rc = cot_json_str(a, "deadline", true, 10, 64, &deadline, &e2)) ||
	    (rc = project_params(a, &tmp, &e2)))
		goto bad;
	/* The scheduler never carves a work unit across an epoch's end. */
	if (hi - lo > tmp.mb_per_epoch) {
		cot_seterr(&e2, COT_ERR_INVALID,
		           "range [%lld, %lld) is longer than an epoch (%lld microbatches)", lo, hi,
		           (long long)tmp.mb_per_epoch);
		goto bad;
	}
	int64_t dl = cl_api_parse_timestamp(deadline);
	if (dl < 0) {
		cot_seterr(&e2, COT_ERR_INVALID, "field \"deadline\" is not a timestamp");
		goto bad;
	}
	if (!json_is_array(files) || json_array_size(files) > CL_MAX_FILES) {
		cot_seterr(&e2, COT_ERR_INVALID, "field \"files\" must be an array of at most %d files",
		           CL_MAX_FILES);
		goto bad;
	}
	for (size_t i = 0; i < json_array_size(files); i++) {
		const json_t *f = json_array_get(files, i);
		const char *furl = NULL, *sha = NULL, *kind = "";
		long long size = 0;
		if (!json_is_object(f)) {
			cot_seterr(&e2, COT_ERR_INVALID, "files[%zu] is not an object", i);
			goto bad;
		}
		if (cot_json_str(f, "url", true, 1, CL_FILE_URL_MAX - 1, &furl, &e2) ||
		    cot_json_str(f, "sha256", true, 64, 64, &sha, &e2) ||
		    cot_json_str(f, "kind", false, 0, 15, &kind, &e2) ||
		    cot_json_int(f, "size", true, 0, 1LL << 50, &size, &e2))
			goto bad;
		if (!hash_is_sha256_hex(sha)) {
			cot_seterr(&e2, COT_ERR_INVALID, "files[%zu] has a malformed sha256", i);
			goto bad;
		}
		cl_file *cf = &w->files[w->nfiles++];
		snprintf(cf->url, sizeof cf->url, "%s", furl);
		snprintf(cf->sha256, sizeof cf->sha256, "%s", sha);
		snprintf(cf->kind, sizeof cf->kind, "%s", kind);
		cf->size = size;
	}
	const json_t *sk = json_object_get(a, "sketch");
	if (sk && !json_is_null(sk)) {
		const char *seed = NULL;
		long long k = 0;
		char *end;
		if (cot_json_str(sk, "seed", true, 1, 21, &seed, &e2) ||
		    cot_json_int(sk, "k", true, 1, SKETCH_K_MAX, &k, &e2))
			goto bad;
		errno = 0;
		long long v = strtoll(seed, &end, 10);
		if (*end || errno) {
			cot_seterr(&e2, COT_ERR_INVALID, "field \"sketch\" has a bad seed");
			goto bad;
		}
		w->sketch_seed = (uint64_t)v;
		w->sketch_k = (int)k;
		long long b = 0; /* absent (an older server): no blocks kept */
		if (cot_json_int(sk, "block", false, 1, CL_BLOCK_MAX, &b, &e2))
			goto bad;
		w->sketch_block = (int)b;
	}
	const json_t *opt = json_object_get(a, "optimizer");
	if (opt && !json_is_null(opt)) {
		char *text = json_is_object(opt) ? json_dumps(opt, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
		bool fits = text && strlen(text) < sizeof w->optimizer;
		if (fits)
			snprintf(w->optimizer, sizeof w->optimizer, "%s", text);
		free(text);
		if (!fits) {
			cot_seterr(&e2, COT_ERR_INVALID,
			           "field \"optimizer\" must be an object of at most %d bytes",
			           CL_WORK_OPT_MAX - 1);
			goto bad;
		}
	}
	w->id = id;
	w->version = ver;
	w->lo = lo;
	w->hi = hi;
	w->keep_hi = hi;
	/* The server's clock decides the deadline; translate it to ours. */
	time_t now = time(NULL);
	w->deadline = date > 0 ? (int64_t)now + (dl - (int64_t)date) : dl;
	p->seq_len = tmp.seq_len;
	p->microbatch_size = tmp.microbatch_size;
	p->mb_per_epoch = tmp.mb_per_epoch;
	return COT_OK;
bad:
	memset(w, 0, sizeof *w);
	return cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid work unit: %s", e2.msg);
}

cot_err cl_api_report(const cl_api_opts *o, const cl_project *p, cl_report_op op, int64_t wu, int64_t mb_done,
                      double samples_per_sec, json_t **answer, time_t *date, cot_errbuf *eb)
{
	static const char *paths[] = { "", "heartbeat", "finish", "handback" };
	if (op == CL_REPORT_NONE)
		return cot_seterr(eb, COT_ERR_INTERNAL, "no report to send");
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/workunits/%lld/%s", p->base, (long long)wu, paths[op]);
	json_t *body =
	        json_pack("{s:I, s:f}", "mb_done", (json_int_t)mb_done, "samples_per_sec", samples_per_sec);
	json_t *a;
	cot_err rc = body ? request(o, "POST", url, p->host_token, body, &a, date, eb) : COT_ERR_NOMEM;
	json_decref(body);
	if (rc)
		return rc;
	if (answer)
		*answer = a;
	else
		json_decref(a);
	return COT_OK;
}

cot_err cl_api_host_credit(const cl_api_opts *o, const char *base, int64_t host_id, double *granted,
                           double *pending, cot_errbuf *eb)
{
	char url[CL_URL_MAX + 64];
	snprintf(url, sizeof url, "%s/v1/credit/hosts/%lld", base, (long long)host_id);
	json_t *a;
	cot_err rc = request(o, "GET", url, NULL, NULL, &a, NULL, eb);
	if (rc)
		return rc;
	double g = 0, pend = 0;
	cot_errbuf e2 = { "", "" };
	if (cot_json_num(a, "total_credit", true, 0, 1e300, &g, &e2)) {
		json_decref(a);
		return cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid credit answer: %s", e2.msg);
	}
	if (cot_json_num(a, "pending_credit", true, 0, 1e300, &pend, NULL)) {
		pend = 0;
		size_t k;
		const json_t *row;
		json_array_foreach(json_object_get(a, "grants"), k, row)
		{
			const char *st = json_string_value(json_object_get(row, "status"));
			double c = json_number_value(json_object_get(row, "credit"));
			if (st && strcmp(st, "pending") == 0 && c > 0 && c < 1e300)
				pend += c;
		}
	}
	json_decref(a);
	*granted = g;
	*pending = pend;
	return COT_OK;
}
