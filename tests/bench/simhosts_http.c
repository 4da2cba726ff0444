/* simhosts: the HTTP calls of one simulated host (see simhosts_http.h). */
#include "tests/bench/simhosts_http.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ANSWER_MAX (4u << 20)

static pthread_mutex_t lat_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
	char *buf;
	size_t len;
	int keep; /* 0: count and drop (a file download) */
} sink;

static size_t collect(char *p, size_t sz, size_t n, void *ud)
{
	sink *s = ud;
	size_t add = sz * n;
	if (!s->keep)
		return add;
	if (s->len + add > ANSWER_MAX)
		return 0;
	char *nb = realloc(s->buf, s->len + add + 1);
	if (!nb)
		return 0;
	memcpy(nb + s->len, p, add);
	s->buf = nb;
	s->len += add;
	s->buf[s->len] = '\0';
	return add;
}

double sim_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

long sim_http_call(sim_http *h, const char *method, const char *path, json_t *json, const void *raw,
                   size_t rawlen, long timeout_s, sim_call_kind kind, json_t **answer)
{
	char auth[320];
	size_t ulen = strlen(h->base) + strlen(path) + 1;
	char *url = malloc(ulen);
	if (!url)
		return 0;
	snprintf(url, ulen, "%s%s", h->base, path);
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", h->bearer);
	struct curl_slist *hd = curl_slist_append(NULL, auth);
	char *body = json ? json_dumps(json, JSON_COMPACT) : NULL;
	hd = curl_slist_append(hd, json ? "Content-Type: application/json"
	                                : "Content-Type: application/octet-stream");
	hd = curl_slist_append(hd, "Expect:");
	sink s = { NULL, 0, answer != NULL };
	CURL *c = h->curl;
	curl_easy_reset(c);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_FORBID_REUSE, h->fresh ? 1L : 0L);
	if (body || raw) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : (const char *)raw);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? strlen(body) : rawlen));
	} else if (strcmp(method, "POST") == 0) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{}");
	}
	double t0 = sim_now();
	CURLcode cc = curl_easy_perform(c);
	double ms = (sim_now() - t0) * 1000.0;
	long status = 0;
	if (cc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_off_t up = 0, down = 0;
	long hsize = 0, rsize = 0;
	curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &up);
	curl_easy_getinfo(c, CURLINFO_SIZE_DOWNLOAD_T, &down);
	curl_easy_getinfo(c, CURLINFO_HEADER_SIZE, &hsize);
	curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &rsize);
	h->bytes += (double)up + (double)down + (double)hsize + (double)rsize;
	if (h->lat) {
		const char *q = strchr(path, '?');
		int plen = q ? (int)(q - path) : (int)strlen(path);
		pthread_mutex_lock(&lat_mu);
		fprintf(h->lat, "%.3f %.2f %s %ld %s %.*s\n", t0, ms,
		        kind == SIM_CALL_LONGPOLL ? "poll" : "api", status, method, plen, path);
		pthread_mutex_unlock(&lat_mu);
	}
	if (answer) {
		*answer = s.len ? json_loadb(s.buf, s.len, 0, NULL) : NULL;
	}
	free(s.buf);
	free(body);
	free(url);
	curl_slist_free_all(hd);
	return status;
}
