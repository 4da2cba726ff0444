/* cotrain client: the calls of a collaborative round (see api_round.h). */
#include "client/api_round.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/json.h"

#define PEM_MAX (64 * 1024)

static void round_url(char *url, size_t len, const cl_project *p, int64_t version, const char *what)
{
	snprintf(url, len, "%s/v1/projects/%s/rounds/%lld/%s", p->base, p->name, (long long)version, what);
}

/* A PEM string field of a into *out (malloc'd). */
static cot_err pem_field(const json_t *a, const char *key, char **out, cot_errbuf *eb)
{
	const char *s = NULL;
	cot_errbuf e2 = { "", "" };
	if (cot_json_str(a, key, true, 20, PEM_MAX, &s, &e2) || strncmp(s, "-----BEGIN ", 11) != 0)
		return cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid certificate: %s",
		                  e2.msg[0] ? e2.msg : "not PEM");
	if (!(*out = strdup(s)))
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	return COT_OK;
}

cot_err cl_api_project_ca(const cl_api_opts *o, const cl_project *p, char **pem, char *local_ip, size_t iplen,
                          cot_errbuf *eb)
{
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/projects/%s/ca", p->base, p->name);
	json_t *a = NULL;
	cl_http_req r = {
		.method = "GET", .url = url, .out = &a, .local_ip = local_ip, .local_ip_len = iplen
	};
	cot_err rc = cl_api_http(o, &r, eb);
	if (!rc && !a)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no CA certificate");
	if (!rc)
		rc = pem_field(a, "certificate", pem, eb);
	json_decref(a);
	return rc;
}

cot_err cl_api_host_certificate(const cl_api_opts *o, const cl_project *p, const char *pub_pem,
                                char **cert_pem, int64_t *lifetime, cot_errbuf *eb)
{
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/hosts/%lld/certificate", p->base, (long long)p->host_id);
	json_t *body = json_pack("{s:s, s:s}", "public_key", pub_pem, "project", p->name);
	json_t *a = NULL;
	cl_http_req r = { .method = "POST", .url = url, .bearer = p->host_token, .json = body, .out = &a };
	cot_err rc = body ? cl_api_http(o, &r, eb) : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	json_decref(body);
	if (!rc && !a)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no certificate");
	long long life = 0;
	cot_errbuf e2 = { "", "" };
	if (!rc && cot_json_int(a, "lifetime", true, 60, 1LL << 32, &life, &e2))
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent an invalid certificate answer: %s", e2.msg);
	if (!rc)
		rc = pem_field(a, "certificate", cert_pem, eb);
	if (!rc)
		*lifetime = life;
	json_decref(a);
	return rc;
}

cot_err cl_api_round_report(const cl_api_opts *o, const cl_project *p, int64_t wu, const cl_round_report *rep,
                            json_t **answer, cot_errbuf *eb)
{
	char url[CL_URL_MAX + 128];
	snprintf(url, sizeof url, "%s/v1/workunits/%lld/report", p->base, (long long)wu);
	json_t *body = json_pack("{s:I, s:I, s:s, s:f, s:b}", "mb_done", (json_int_t)rep->mb_done, "samples",
	                         (json_int_t)rep->samples, "endpoint", rep->endpoint, "bandwidth",
	                         rep->bandwidth, "can_aggregate", rep->can_aggregate);
	if (body && rep->has_loss)
		json_object_set_new(body, "loss", json_real(rep->loss));
	if (body && rep->rtt)
		json_object_set(body, "rtt", (json_t *)rep->rtt);
	if (body && rep->sketches && rep->sketch_k > 0) {
		json_t *rows = json_array();
		for (int64_t i = 0; rows && i < rep->mb_done; i++) {
			json_t *row = json_array();
			for (int j = 0; row && j < rep->sketch_k; j++)
				json_array_append_new(row, json_real(rep->sketches[i * rep->sketch_k + j]));
			if (!row || json_array_append_new(rows, row)) {
				json_decref(rows);
				rows = NULL;
			}
		}
		if (!rows || json_object_set_new(body, "sketches", rows)) {
			json_decref(body);
			body = NULL;
		}
	}
	json_t *a = NULL;
	cl_http_req r = { .method = "POST", .url = url, .bearer = p->host_token, .json = body, .out = &a };
	cot_err rc = body ? cl_api_http(o, &r, eb) : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	json_decref(body);
	if (!rc && !a)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no answer to the report");
	if (rc || !answer)
		json_decref(a);
	else
		*answer = a;
	return rc;
}

cot_err cl_api_round_plan(const cl_api_opts *o, const cl_project *p, int64_t version, int wait_s,
                          int after_gradient, json_t **plan, int *reopened, cot_errbuf *eb)
{
	json_t *err = NULL;
	if (reopened)
		*reopened = 0;
	char url[CL_URL_MAX + 256], what[128];
	snprintf(what, sizeof what, "plan?host_id=%lld&wait=%d%s", (long long)p->host_id, wait_s,
	         after_gradient ? "&after=gradient" : "");
	round_url(url, sizeof url, p, version, what);
	cl_http_req r = { .method = "GET",
		          .url = url,
		          .bearer = p->host_token,
		          .out = plan,
		          .err_body = &err,
		          .extra_timeout_s = wait_s };
	cot_err rc = cl_api_http(o, &r, eb);
	if (rc == COT_ERR_CONFLICT && reopened)
		*reopened = json_is_true(json_object_get(json_object_get(err, "round"), "reopened"));
	json_decref(err);
	return rc;
}

/* "7,9,12" into buf; COT_ERR_TOO_LARGE when it does not fit. */
static cot_err id_list(const int64_t *ids, size_t n, char *buf, size_t len, cot_errbuf *eb)
{
	size_t used = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		int w = snprintf(buf + used, len - used, "%s%lld", i ? "," : "", (long long)ids[i]);
		if (w < 0 || (size_t)w >= len - used)
			return cot_seterr(eb, COT_ERR_TOO_LARGE, "too many included hosts");
		used += (size_t)w;
	}
	return COT_OK;
}

cot_err cl_api_group_sum(const cl_api_opts *o, const cl_project *p, int64_t version, const int64_t *included,
                         size_t n, int64_t samples, const float *sum, size_t len, json_t **answer,
                         cot_errbuf *eb)
{
	size_t cap = 64 + n * 21;
	char *what = malloc(cap), *url = malloc(cap + CL_URL_MAX + 128);
	cot_err rc = COT_OK;
	if (!what || !url) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	int w = snprintf(what, cap, "group_sum?host_id=%lld&samples=%lld&included=", (long long)p->host_id,
	                 (long long)samples);
	rc = id_list(included, n, what + w, cap - (size_t)w, eb);
	if (rc)
		goto out;
	round_url(url, cap + CL_URL_MAX + 128, p, version, what);
	/* The body is param_count * 4 bytes; give it time beyond one request's. */
	json_t *a = NULL;
	cl_http_req r = { .method = "POST",
		          .url = url,
		          .bearer = p->host_token,
		          .raw = sum,
		          .rawlen = len * sizeof *sum,
		          .out = &a,
		          .extra_timeout_s = 600 };
	rc = cl_api_http(o, &r, eb);
	if (!rc && !a)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no answer to the group sum");
	if (rc || !answer)
		json_decref(a);
	else
		*answer = a;
out:
	free(what);
	free(url);
	return rc;
}

cot_err cl_api_mean_hash(const cl_api_opts *o, const cl_project *p, int64_t version, const int64_t *included,
                         size_t n, int64_t samples, const char *sha256, cot_errbuf *eb)
{
	size_t cap = 160 + n * 21;
	char *what = malloc(cap), *url = malloc(cap + CL_URL_MAX + 128);
	cot_err rc = COT_OK;
	if (!what || !url) {
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	int w = snprintf(what, cap,
	                 "mean_hash?host_id=%lld&samples=%lld&sha256=%.64s&included=", (long long)p->host_id,
	                 (long long)samples, sha256);
	rc = id_list(included, n, what + w, cap - (size_t)w, eb);
	if (rc)
		goto out;
	round_url(url, cap + CL_URL_MAX + 128, p, version, what);
	json_t *a = NULL;
	cl_http_req r = {
		.method = "POST", .url = url, .bearer = p->host_token, .raw = "", .rawlen = 0, .out = &a
	};
	rc = cl_api_http(o, &r, eb);
	if (!rc && !a)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no answer to the mean's hash");
	json_decref(a);
out:
	free(what);
	free(url);
	return rc;
}

cot_err cl_api_round_checkpoint(const cl_api_opts *o, const cl_project *p, int64_t version, const void *bytes,
                                size_t len, json_t **answer, cot_errbuf *eb)
{
	char url[CL_URL_MAX + 192], what[48];
	snprintf(what, sizeof what, "checkpoint?host_id=%lld", (long long)p->host_id);
	round_url(url, sizeof url, p, version, what);
	json_t *a = NULL;
	cl_http_req r = { .method = "POST",
		          .url = url,
		          .bearer = p->host_token,
		          .raw = bytes,
		          .rawlen = len,
		          .out = &a,
		          .extra_timeout_s = 600 };
	cot_err rc = cl_api_http(o, &r, eb);
	if (!rc && !a)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no answer to the checkpoint");
	if (rc || !answer)
		json_decref(a);
	else
		*answer = a;
	return rc;
}

cot_err cl_api_round_outcome(const cl_api_opts *o, const cl_project *p, int64_t version, int ok, int wait_s,
                             const int64_t *included, size_t n, const char *params_sha256,
                             const char *moments_sha256, cl_links *links, const json_t *sketches,
                             json_t **answer, cot_errbuf *eb)
{
	char url[CL_URL_MAX + 128], what[32];
	snprintf(what, sizeof what, "outcome?wait=%d", wait_s);
	round_url(url, sizeof url, p, version, what);
	json_t *body = json_pack("{s:I, s:s}", "host_id", (json_int_t)p->host_id, "status",
	                         ok > 0   ? "ok"
	                         : ok < 0 ? "dropped"
	                                  : "failed");
	json_t *inc = json_array();
	for (size_t i = 0; inc && i < n; i++)
		json_array_append_new(inc, json_integer((json_int_t)included[i]));
	if (body && inc)
		json_object_set(body, "included_hosts", inc);
	if (body && ok > 0 && params_sha256)
		json_object_set_new(body, "params_sha256", json_string(params_sha256));
	if (body && ok > 0 && moments_sha256)
		json_object_set_new(body, "moments_sha256", json_string(moments_sha256));
	json_decref(inc);
	if (body && ok && sketches)
		json_object_set(body, "sketches", (json_t *)sketches);
	if (body && links) {
		json_t *ls = json_array();
		pthread_mutex_lock(&links->mu);
		for (size_t i = 0; ls && i < links->n; i++) {
			const cl_link *l = &links->l[i];
			if (strcmp(l->rung, "lan") != 0 && strcmp(l->rung, "direct") != 0 &&
			    strcmp(l->rung, "punch") != 0 && strcmp(l->rung, "relay") != 0)
				continue; /* the server knows these rungs */
			json_t *lo = json_pack("{s:I, s:s, s:f}", "peer", (json_int_t)l->peer, "rung",
			                       l->rung, "connect_ms", l->connect_ms);
			if (lo && l->plan[0]) /* what the broker planned: its history (doc/nat.md) */
				json_object_set_new(lo, "plan", json_string(l->plan));
			json_array_append_new(ls, lo);
		}
		pthread_mutex_unlock(&links->mu);
		if (ls)
			json_object_set_new(body, "links", ls);
	}
	json_t *a = NULL;
	cl_http_req r = { .method = "POST",
		          .url = url,
		          .bearer = p->host_token,
		          .json = body,
		          .out = &a,
		          .extra_timeout_s = wait_s };
	cot_err rc = body && inc ? cl_api_http(o, &r, eb) : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	json_decref(body);
	if (!rc && !a)
		rc = cot_seterr(eb, COT_ERR_NETWORK, "server sent no answer to the outcome");
	if (rc || !answer)
		json_decref(a);
	else
		*answer = a;
	return rc;
}

cot_err cl_api_round_seed2(const cl_api_opts *o, const cl_project *p, int64_t version, const json_t *sketches,
                           cot_errbuf *eb)
{
	char url[CL_URL_MAX + 128];
	round_url(url, sizeof url, p, version, "seed2");
	json_t *body =
	        json_pack("{s:I, s:O}", "host_id", (json_int_t)p->host_id, "sketches", (json_t *)sketches);
	json_t *a = NULL;
	cl_http_req r = { .method = "POST", .url = url, .bearer = p->host_token, .json = body, .out = &a };
	cot_err rc = body ? cl_api_http(o, &r, eb) : cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	json_decref(body);
	json_decref(a);
	return rc;
}
