/* cotrain client: a checkpoint from its holders, piece by piece
 * (peer_fetch.h). */
#include "client/peer_fetch.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/backoff.h"
#include "client/round.h"
#include "shared/common/ckpt_pieces.h"
#include "shared/common/deadline.h"
#include "shared/common/hash.h"
#include "shared/common/json.h"
#include "shared/common/log.h"
#include "shared/peer/pieces.h"

#define FETCH_FROM_PEERS_MS (30 * 60 * 1000) /* the most the peers get for a whole file */

/* The holders the server named, but for us, as sources. */
static size_t parse_sources(const json_t *a, int64_t self, pieces_source *src)
{
	size_t n = 0;
	const json_t *peers = json_object_get(a, "peers");
	for (size_t k = 0; json_is_array(peers) && k < json_array_size(peers) && n < PIECES_SOURCES_MAX;
	     k++) {
		const json_t *x = json_array_get(peers, k);
		long long host = 0;
		const char *ep = NULL;
		cot_errbuf e2 = { "", "" };
		if (cot_json_int(x, "host_id", true, 1, 1LL << 62, &host, &e2) ||
		    cot_json_str(x, "endpoint", true, 3, 79, &ep, &e2) || host == self ||
		    cl_parse_endpoint(ep, src[n].addr, &src[n].port, &e2)) {
			log_debug("pieces: holder %zu of the server's list skipped: %s", k,
			          e2.msg[0] ? e2.msg : "ourselves");
			continue;
		}
		src[n++].host_id = host;
	}
	return n;
}

typedef struct {
	unsigned char *buf;
	size_t len, cap;
	int overflow;
} range_body;

static size_t on_range_body(char *p, size_t size, size_t nmemb, void *arg)
{
	range_body *b = arg;
	size_t n = size * nmemb;
	if (n > b->cap - b->len) {
		b->overflow = 1;
		return 0; /* more than the piece: cut */
	}
	memcpy(b->buf + b->len, p, n);
	b->len += n;
	return n;
}

/* Piece i of m from <base>/files/<sha> by HTTP range into buf (its
 * ckpt_piece_len bytes), checked against the manifest. */
static cot_err server_piece(const cl_fetch_env *env, const cl_project *p, const ckpt_manifest *m, uint32_t i,
                            unsigned char *buf, cot_errbuf *eb)
{
	uint32_t len = ckpt_piece_len(m, i);
	uint64_t off = (uint64_t)i * m->piece_size;
	char url[CL_URL_MAX + 128], range[64], auth[CL_TOKEN_MAX + 32], err[CURL_ERROR_SIZE] = "";
	snprintf(url, sizeof url, "%s/files/%s", p->base, m->sha256);
	snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)off,
	         (unsigned long long)(off + len - 1));
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", p->host_token);
	CURL *c = curl_easy_init();
	struct curl_slist *h = curl_slist_append(NULL, auth);
	if (!c || !h) {
		curl_easy_cleanup(c);
		curl_slist_free_all(h);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	range_body b = { .buf = buf, .cap = len };
	curl_easy_setopt(c, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_RANGE, range);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_range_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)(env->timeout_s > 0 ? env->timeout_s : 60));
	if (env->rate_limit > 0)
		curl_easy_setopt(c, CURLOPT_MAX_RECV_SPEED_LARGE, (curl_off_t)env->rate_limit);
	CURLcode cc = curl_easy_perform(c);
	long status = 0;
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(c);
	curl_slist_free_all(h);
	if (b.overflow)
		return cot_seterr(eb, COT_ERR_NETWORK, "the server sent more than piece %u of %s", i,
		                  m->sha256);
	if (cc != CURLE_OK)
		return cot_seterr(eb, COT_ERR_NETWORK, "could not fetch piece %u of %s from the server: %s",
		                  i, m->sha256, err[0] ? err : curl_easy_strerror(cc));
	if (status == 404)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "the server no longer has file %s", m->sha256);
	if (status != 206 && !(status == 200 && off == 0 && len == m->size))
		return cot_seterr(eb, COT_ERR_NETWORK, "the server answered %ld to a range of file %s",
		                  status, m->sha256);
	if (!ckpt_piece_ok(m, i, buf, b.len))
		return cot_seterr(eb, COT_ERR_NETWORK,
		                  "piece %u of %s from the server does not match its manifest", i, m->sha256);
	return COT_OK;
}

cot_err cl_peer_fetch(const cl_fetch_env *env, const cl_api_opts *o, const cl_project *p, peer_ctx *ctx,
                      dialer *dl, const char *sha, int64_t size, char *dest, size_t destlen,
                      cl_peer_fetch_info *info, cot_errbuf *eb)
{
	cl_peer_fetch_info local;
	if (!info)
		info = &local;
	memset(info, 0, sizeof *info);
	if (!hash_is_sha256_hex(sha) || size <= 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid checkpoint name or size");
	if (env->max_file_bytes > 0 && size > env->max_file_bytes)
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "checkpoint %s has %lld bytes, more than max_file_bytes", sha,
		                  (long long)size);
	char url[CL_URL_MAX + 192];
	snprintf(url, sizeof url, "%s/v1/projects/%s/checkpoints/%s", p->base, p->name, sha);
	json_t *a = NULL;
	cl_http_req r = { .method = "GET", .url = url, .bearer = p->host_token, .out = &a };
	cot_err rc = cl_api_http(o, &r, eb);
	if (rc)
		return rc;
	ckpt_manifest m;
	pieces_source src[PIECES_SOURCES_MAX];
	rc = ckpt_manifest_from_json(a, sha, (uint64_t)size, &m, eb);
	size_t n_src = rc ? 0 : parse_sources(a, p->host_id, src);
	json_decref(a);
	if (rc)
		return rc;
	info->pieces = m.n;
	info->sources = n_src;
	if (n_src == 0 || !ctx || !dl) {
		/* Nobody to ask (version 0, or no holder left): the caller's
		 * whole download, resumable, beats one range request a piece. */
		ckpt_manifest_free(&m);
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "no peer holds checkpoint %s", sha);
	}

	char part[PATH_MAX + 80];
	snprintf(part, sizeof part, "%s/%s.pieces", env->downloads_dir, sha);
	mkdir(env->downloads_dir, 0700);
	unsigned char *have = calloc(m.n, 1), *buf = malloc(m.piece_size);
	int fd = open(part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (!have || !buf)
		rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	else if (fd < 0 || ftruncate(fd, (off_t)size))
		rc = cot_seterr(eb, COT_ERR_IO, "could not create \"%s\": %s", part, strerror(errno));
	double t0 = cl_now_mono();
	pieces_source_stats st[PIECES_SOURCES_MAX];
	if (!rc) {
		pieces_fetch_params fp = { .m = &m,
			                   .fd = fd,
			                   .ctx = ctx,
			                   .dialer = dl,
			                   .src = src,
			                   .n_src = n_src,
			                   .deadline = deadline_after_ms(FETCH_FROM_PEERS_MS),
			                   .piece_timeout_ms =
			                           (int64_t)(env->timeout_s > 0 ? env->timeout_s : 60) * 1000,
			                   .cancel = env->cancel,
			                   .have = have };
		rc = pieces_fetch(&fp, st, eb);
		for (size_t k = 0; k < n_src; k++) {
			info->from_peers += st[k].pieces;
			info->refused += st[k].refused;
			log_info("project %s: checkpoint %s: %u pieces from host %lld (%s:%u)%s%s", p->name,
			         sha, st[k].pieces, (long long)st[k].host_id, src[k].addr,
			         (unsigned)src[k].port, st[k].error[0] ? "; left it: " : "", st[k].error);
		}
	}
	double t1 = cl_now_mono();
	/* The server, for what no peer delivered. */
	for (uint32_t i = 0; !rc && i < m.n; i++) {
		if (have[i])
			continue;
		if (env->cancel && *env->cancel)
			rc = cot_seterr(eb, COT_ERR_TIMEOUT, "the client is stopping");
		else if (!(rc = server_piece(env, p, &m, i, buf, eb))) {
			uint32_t len = ckpt_piece_len(&m, i);
			if (pwrite(fd, buf, len, (off_t)i * m.piece_size) != (ssize_t)len)
				rc = cot_seterr(eb, COT_ERR_IO, "could not write \"%s\": %s", part,
				                strerror(errno));
			have[i] = 1;
			info->from_server++;
			info->server_file_bytes += len;
		}
	}
	char got[HASH_SHA256_HEX_LEN + 1];
	if (!rc && fsync(fd))
		rc = cot_seterr(eb, COT_ERR_IO, "could not write \"%s\": %s", part, strerror(errno));
	if (fd >= 0)
		close(fd);
	if (!rc && !(rc = hash_file_sha256_hex(part, got, NULL, eb)) && strcmp(got, sha) != 0)
		rc = cot_seterr(eb, COT_ERR_CORRUPT, "checkpoint assembled from pieces hashes to %s, not %s",
		                got, sha);
	if (!rc && !(rc = cl_cache_path(env->cache_dir, sha, dest, destlen, eb)) && rename(part, dest))
		rc = cot_seterr(eb, COT_ERR_IO, "could not move \"%s\" into the cache: %s", part,
		                strerror(errno));
	if (rc)
		unlink(part);
	else
		log_info("project %s: checkpoint %s (%lld bytes, %u pieces of %u bytes): %u from %zu peers "
		         "in "
		         "%.2f s (%u refused), %u from the server (%lld bytes)",
		         p->name, sha, (long long)size, m.n, m.piece_size, info->from_peers, n_src, t1 - t0,
		         info->refused, info->from_server, (long long)info->server_file_bytes);
	free(have);
	free(buf);
	ckpt_manifest_free(&m);
	return rc;
}
