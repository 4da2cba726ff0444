/* cotrain: authenticated peer connections: TLS 1.3 over a dialed socket.
 *
 * The socket stays non-blocking; each OpenSSL call that wants to read or
 * write is retried after poll() says the socket is ready, with poll's timeout
 * taken from the deadline.  Peer certificates are checked by our own callback
 * (pki_trust_verify) instead of OpenSSL's default chain check, so that the
 * rules (direct issue by the pinned CA, clock skew, project, host id) live in
 * one place, pki.c. */
#include "shared/peer/peer.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "shared/common/deadline.h"
#include "shared/peer/pki.h"

#define WRITE_CHUNK (256 * 1024) /* bytes per SSL_write call */

struct peer_ctx {
	SSL_CTX *ssl;
	pki_trust *trust;
	int64_t host_id;
	atomic_int refs; /* peer_ctx_ref */
};

struct peer_conn {
	peer_ctx *ctx;
	SSL *ssl;
	int fd;
	int64_t host_id; /* the peer's, once verified */
	int64_t expect_host_id;
	size_t recv_max, send_max;
	bool broken;
	cot_errbuf verify_eb; /* why the peer's certificate was refused */
	bool verify_failed;
};

/* ---- SIGPIPE: blocked in this thread while we write, as libpq does ---- */

typedef struct {
	sigset_t old;
	bool was_pending;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g)
{
	sigset_t s, pend;
	sigemptyset(&s);
	sigaddset(&s, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &s, &g->old);
	sigpending(&pend);
	g->was_pending = sigismember(&pend, SIGPIPE) == 1;
}

static void sigpipe_restore(sigpipe_guard *g)
{
	if (!g->was_pending) {
		/* Swallow a SIGPIPE our writes raised, before unblocking it. */
		sigset_t s;
		struct timespec zero = { 0, 0 };
		sigemptyset(&s);
		sigaddset(&s, SIGPIPE);
		while (sigtimedwait(&s, NULL, &zero) == SIGPIPE)
			;
	}
	pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- The context ---- */

static int verify_peer(X509_STORE_CTX *sctx, void *arg)
{
	peer_ctx *ctx = arg;
	SSL *ssl = X509_STORE_CTX_get_ex_data(sctx, SSL_get_ex_data_X509_STORE_CTX_idx());
	peer_conn *c = ssl ? SSL_get_app_data(ssl) : NULL;
	if (!c) {
		X509_STORE_CTX_set_error(sctx, X509_V_ERR_APPLICATION_VERIFICATION);
		return 0;
	}
	int64_t id = 0;
	cot_err rc = pki_trust_verify(ctx->trust, X509_STORE_CTX_get0_cert(sctx), (int64_t)time(NULL), &id,
	                              &c->verify_eb);
	if (rc == COT_OK && c->expect_host_id > 0 && id != c->expect_host_id) {
		cot_seterr(&c->verify_eb, COT_ERR_AUTH, "peer is host %lld, not the expected host %lld",
		           (long long)id, (long long)c->expect_host_id);
		rc = COT_ERR_AUTH;
	}
	if (rc) {
		c->verify_failed = true;
		X509_STORE_CTX_set_error(sctx, X509_V_ERR_CERT_REJECTED);
		return 0;
	}
	c->host_id = id;
	return 1;
}

peer_ctx *peer_ctx_ref(peer_ctx *ctx)
{
	if (ctx)
		atomic_fetch_add(&ctx->refs, 1);
	return ctx;
}

void peer_ctx_free(peer_ctx *ctx)
{
	if (!ctx || atomic_fetch_sub(&ctx->refs, 1) > 1)
		return;
	SSL_CTX_free(ctx->ssl);
	pki_trust_free(ctx->trust);
	free(ctx);
}

int64_t peer_ctx_host_id(const peer_ctx *ctx) { return ctx->host_id; }

const char *peer_ctx_project(const peer_ctx *ctx) { return pki_trust_project(ctx->trust); }

static cot_err ssl_fail(cot_errbuf *eb, cot_err e, const char *what)
{
	char r[256] = "unknown error";
	unsigned long code = ERR_peek_last_error();
	if (code)
		ERR_error_string_n(code, r, sizeof r);
	ERR_clear_error();
	return cot_seterr(eb, e, "%s: %s", what, r);
}

cot_err peer_ctx_new(const peer_identity *id, peer_ctx **out, cot_errbuf *eb)
{
	X509 *cert = NULL;
	EVP_PKEY *key = NULL;
	cot_err rc;
	peer_ctx *ctx = calloc(1, sizeof *ctx);
	if (ctx)
		atomic_init(&ctx->refs, 1);
	if (!ctx)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if ((rc = pki_trust_new(id->ca_pem, id->ca_len, id->project, &ctx->trust, eb)) ||
	    (rc = pki_parse_cert(id->cert_pem, id->cert_len, &cert, eb)) ||
	    (rc = pki_parse_key(id->key_pem, id->key_len, &key, eb)))
		goto fail;
	/* Our own certificate must pass the checks peers will make, except the
	 * validity window (see peer.h). */
	rc = pki_trust_verify(ctx->trust, cert, PKI_NO_TIME_CHECK, &ctx->host_id, eb);
	if (rc) {
		cot_sethint(eb, "The host certificate must come from this project's server.");
		goto fail;
	}
	SSL_CTX *s = ctx->ssl = SSL_CTX_new(TLS_method());
	if (!s) {
		rc = ssl_fail(eb, COT_ERR_NOMEM, "could not create a TLS context");
		goto fail;
	}
	if (!SSL_CTX_set_min_proto_version(s, TLS1_3_VERSION) ||
	    !SSL_CTX_set_max_proto_version(s, TLS1_3_VERSION) || SSL_CTX_use_certificate(s, cert) != 1 ||
	    SSL_CTX_use_PrivateKey(s, key) != 1) {
		rc = ssl_fail(eb, COT_ERR_INVALID, "could not set up TLS with the host certificate");
		goto fail;
	}
	if (SSL_CTX_check_private_key(s) != 1) {
		ERR_clear_error();
		rc = cot_seterr(eb, COT_ERR_INVALID, "host key does not match the host certificate");
		goto fail;
	}
	SSL_CTX_set_verify(s, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	SSL_CTX_set_cert_verify_callback(s, verify_peer, ctx);
	/* Every connection authenticates afresh: no tickets, no resumption. */
	SSL_CTX_set_session_cache_mode(s, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_num_tickets(s, 0);
	SSL_CTX_set_options(s, SSL_OP_NO_TICKET);
	SSL_CTX_set_mode(s, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	X509_free(cert);
	EVP_PKEY_free(key);
	ERR_clear_error();
	*out = ctx;
	return COT_OK;
fail:
	X509_free(cert);
	EVP_PKEY_free(key);
	peer_ctx_free(ctx);
	return rc;
}

/* ---- Waiting on the socket ---- */

/* Wait until the socket is ready for what OpenSSL asked (SSL_ERROR_WANT_READ
 * or _WRITE), or the deadline passes. */
static cot_err wait_ready(peer_conn *c, int ssl_err, int64_t deadline, const char *doing, cot_errbuf *eb)
{
	struct pollfd p = { .fd = c->fd, .events = ssl_err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN };
	for (;;) {
		int left = deadline_left_ms(deadline);
		if (left == 0)
			return cot_seterr(eb, COT_ERR_TIMEOUT, "timed out %s host %lld", doing,
			                  (long long)c->host_id);
		int r = poll(&p, 1, left);
		if (r > 0)
			return COT_OK; /* ready, or an error the next OpenSSL call reports */
		if (r < 0 && errno != EINTR)
			return cot_seterr(eb, COT_ERR_IO, "could not wait on the connection: %s",
			                  strerror(errno));
	}
}

/* True when an OpenSSL reason code says the peer sent an alert refusing our
 * certificate. */
static bool cert_alert(int reason)
{
	switch (reason) {
	case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
	case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
	case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
	case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
	case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
		return true;
	}
	return false;
}

/* The error for a failed OpenSSL I/O call with SSL_get_error() = e. */
static cot_err io_error(peer_conn *c, int e, const char *doing, cot_errbuf *eb)
{
	char r[256] = "";
	unsigned long code = ERR_peek_last_error();
	if (code)
		ERR_error_string_n(code, r, sizeof r);
	int err = errno;
	ERR_clear_error();
	c->broken = true;
	if (e == SSL_ERROR_SSL && code && ERR_GET_LIB(code) == ERR_LIB_SSL &&
	    cert_alert(ERR_GET_REASON(code))) {
		/* TLS 1.3: a server refuses a client's certificate after the
		 * client finished its handshake, so the client learns it here. */
		cot_seterr(eb, COT_ERR_AUTH, "peer refused our certificate: %s", r);
		cot_sethint(eb, "Renew the host certificate from the project server, and check the clock.");
		return COT_ERR_AUTH;
	}
	if (e == SSL_ERROR_ZERO_RETURN)
		return cot_seterr(eb, COT_ERR_NETWORK, "peer closed the connection while %s", doing);
	if (e == SSL_ERROR_SYSCALL)
		return cot_seterr(eb, COT_ERR_NETWORK, "connection lost while %s: %s", doing,
		                  code  ? r
		                  : err ? strerror(err)
		                        : "unexpected end of stream");
	return cot_seterr(eb, COT_ERR_NETWORK, "TLS failure while %s: %s", doing, code ? r : "unknown");
}

/* ---- The handshake ---- */

cot_err peer_handshake(peer_ctx *ctx, int fd, peer_role role, int64_t expect_host_id, int64_t deadline,
                       peer_conn **out, cot_errbuf *eb)
{
	peer_conn *c = calloc(1, sizeof *c);
	if (!c) {
		close(fd);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	c->ctx = ctx;
	c->fd = fd;
	c->expect_host_id = expect_host_id;
	c->recv_max = FRAME_PAYLOAD_DEFAULT_MAX;
	c->send_max = FRAME_PAYLOAD_DEFAULT_MAX;
	cot_err rc = COT_OK;
	sigpipe_guard g;
	sigpipe_block(&g);
	ERR_clear_error();
	c->ssl = SSL_new(ctx->ssl);
	if (!c->ssl || !SSL_set_fd(c->ssl, fd)) {
		rc = ssl_fail(eb, COT_ERR_NOMEM, "could not start TLS");
		goto done;
	}
	SSL_set_app_data(c->ssl, c);
	if (role == PEER_CLIENT)
		SSL_set_connect_state(c->ssl);
	else
		SSL_set_accept_state(c->ssl);
	for (;;) {
		ERR_clear_error();
		int r = SSL_do_handshake(c->ssl);
		if (r == 1)
			break;
		int e = SSL_get_error(c->ssl, r);
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			rc = wait_ready(c, e, deadline, "in the TLS handshake with", eb);
			if (rc)
				goto done;
			continue;
		}
		unsigned long code = ERR_peek_last_error();
		int reason = ERR_GET_REASON(code);
		if (c->verify_failed) {
			ERR_clear_error();
			rc = cot_seterr(eb, COT_ERR_AUTH, "refused peer certificate: %s", c->verify_eb.msg);
			if (c->verify_eb.hint[0])
				cot_sethint(eb, "%s", c->verify_eb.hint);
		} else if (reason == SSL_R_UNSUPPORTED_PROTOCOL || reason == SSL_R_NO_PROTOCOLS_AVAILABLE ||
		           reason == SSL_R_TLSV1_ALERT_PROTOCOL_VERSION ||
		           reason == SSL_R_WRONG_VERSION_NUMBER) {
			rc = ssl_fail(eb, COT_ERR_UNSUPPORTED, "peer does not speak TLS 1.3");
		} else if (e == SSL_ERROR_SSL && (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE ||
		                                  reason == SSL_R_CERTIFICATE_VERIFY_FAILED)) {
			rc = ssl_fail(eb, COT_ERR_AUTH, "refused peer without a valid certificate");
		} else if (e == SSL_ERROR_SSL && code && ERR_GET_LIB(code) == ERR_LIB_SSL &&
		           cert_alert(reason)) {
			rc = ssl_fail(eb, COT_ERR_AUTH, "peer refused our certificate");
		} else if (e == SSL_ERROR_SSL && code) {
			rc = ssl_fail(eb, COT_ERR_NETWORK, "TLS handshake failed");
		} else {
			ERR_clear_error();
			rc = cot_seterr(eb, COT_ERR_NETWORK, "connection closed during the TLS handshake");
		}
		goto done;
	}
	if (SSL_version(c->ssl) != TLS1_3_VERSION || c->host_id <= 0) {
		/* Cannot happen with the context's settings; refuse all the same. */
		rc = cot_seterr(eb, COT_ERR_INTERNAL, "TLS handshake ended without an authenticated peer");
		goto done;
	}
done:
	sigpipe_restore(&g);
	if (rc) {
		c->broken = true;
		peer_close(c);
		return rc;
	}
	*out = c;
	return COT_OK;
}

int64_t peer_host_id(const peer_conn *c) { return c->host_id; }

static size_t clamp_max(size_t max)
{
	if (max < FRAME_PAYLOAD_MIN_MAX)
		return FRAME_PAYLOAD_MIN_MAX;
	if (max > FRAME_PAYLOAD_HARD_MAX)
		return FRAME_PAYLOAD_HARD_MAX;
	return max;
}

void peer_set_max_payload(peer_conn *c, size_t max) { c->recv_max = clamp_max(max); }

size_t peer_max_payload(const peer_conn *c) { return c->recv_max; }

void peer_set_send_max(peer_conn *c, size_t max) { c->send_max = clamp_max(max); }

/* ---- Frames ---- */

static cot_err check_usable(const peer_conn *c, cot_errbuf *eb)
{
	if (c->broken)
		return cot_seterr(eb, COT_ERR_CONFLICT,
		                  "connection to host %lld is broken by an earlier error",
		                  (long long)c->host_id);
	return COT_OK;
}

/* A write failed because the peer closed the connection.  In TLS 1.3 a
 * server refuses a client's certificate only after the client's handshake
 * has finished, so the reason may be an alert waiting, unread, in the
 * receive buffer: read it (without waiting) to say why. */
static void explain_reset(peer_conn *c, cot_err *rc, cot_errbuf *eb)
{
	unsigned char b[1];
	ERR_clear_error();
	int r = SSL_read(c->ssl, b, 1);
	if (r <= 0 && SSL_get_error(c->ssl, r) == SSL_ERROR_SSL) {
		unsigned long code = ERR_peek_last_error();
		if (code && ERR_GET_LIB(code) == ERR_LIB_SSL && cert_alert(ERR_GET_REASON(code)))
			*rc = io_error(c, SSL_ERROR_SSL, "sending", eb);
	}
	ERR_clear_error();
}

/* Write n bytes; *done counts what went out (for deciding whether a failure
 * broke a frame in the middle). */
static cot_err write_all(peer_conn *c, const unsigned char *p, size_t n, int64_t deadline, size_t *done,
                         cot_errbuf *eb)
{
	size_t off = 0;
	while (off < n) {
		size_t chunk = n - off < WRITE_CHUNK ? n - off : WRITE_CHUNK;
		ERR_clear_error();
		int r = SSL_write(c->ssl, p + off, (int)chunk);
		if (r > 0) {
			off += (size_t)r;
			*done += (size_t)r;
			continue;
		}
		int e = SSL_get_error(c->ssl, r);
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			cot_err rc = wait_ready(c, e, deadline, "sending to", eb);
			if (rc)
				return rc;
			continue;
		}
		cot_err rc = io_error(c, e, "sending", eb);
		if (e == SSL_ERROR_SYSCALL)
			explain_reset(c, &rc, eb);
		return rc;
	}
	return COT_OK;
}

cot_err peer_send_frame(peer_conn *c, uint8_t type, uint32_t request_id, const void *payload, size_t len,
                        int64_t deadline, cot_errbuf *eb)
{
	cot_err rc = check_usable(c, eb);
	if (rc)
		return rc;
	if (len > c->send_max || len > FRAME_PAYLOAD_HARD_MAX)
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "frame of type %s with %zu payload bytes exceeds the peer's limit of %zu "
		                  "bytes",
		                  frame_type_name(type), len, c->send_max);
	/* The header and the start of the payload go out in one TLS record. */
	unsigned char first[16384];
	frame_header h = { FRAME_VERSION, type, 0, (uint32_t)len, request_id };
	frame_header_encode(&h, first);
	size_t head = len < sizeof first - FRAME_HEADER_LEN ? len : sizeof first - FRAME_HEADER_LEN;
	if (head)
		memcpy(first + FRAME_HEADER_LEN, payload, head);
	size_t done = 0;
	sigpipe_guard g;
	sigpipe_block(&g);
	rc = write_all(c, first, FRAME_HEADER_LEN + head, deadline, &done, eb);
	if (!rc && len > head)
		rc = write_all(c, (const unsigned char *)payload + head, len - head, deadline, &done, eb);
	sigpipe_restore(&g);
	/* A frame cut short corrupts the stream; one not started does not, but
	 * OpenSSL requires a retried write to repeat the same bytes, so a write
	 * that timed out is not retried either. */
	if (rc)
		c->broken = true;
	return rc;
}

/* Read exactly n bytes into p; *got counts what arrived. */
static cot_err read_all(peer_conn *c, unsigned char *p, size_t n, int64_t deadline, size_t *got,
                        const char *doing, cot_errbuf *eb)
{
	size_t off = 0;
	while (off < n) {
		size_t chunk = n - off < INT_MAX ? n - off : INT_MAX;
		ERR_clear_error();
		int r = SSL_read(c->ssl, p + off, (int)chunk);
		if (r > 0) {
			off += (size_t)r;
			*got += (size_t)r;
			continue;
		}
		int e = SSL_get_error(c->ssl, r);
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			cot_err rc = wait_ready(c, e, deadline, "receiving from", eb);
			if (rc)
				return rc;
			continue;
		}
		return io_error(c, e, doing, eb);
	}
	return COT_OK;
}

cot_err peer_recv_frame(peer_conn *c, frame_header *h, unsigned char **payload, int64_t deadline,
                        cot_errbuf *eb)
{
	*payload = NULL;
	cot_err rc = check_usable(c, eb);
	if (rc)
		return rc;
	unsigned char hb[FRAME_HEADER_LEN];
	size_t got = 0;
	unsigned char *buf = NULL;
	sigpipe_guard g;
	sigpipe_block(&g);
	rc = read_all(c, hb, sizeof hb, deadline, &got, "waiting for a frame", eb);
	if (rc) {
		if (got > 0 && rc == COT_ERR_NETWORK)
			cot_seterr(eb, rc,
			           "connection to host %lld closed mid-frame, after %zu of %d header bytes",
			           (long long)c->host_id, got, FRAME_HEADER_LEN);
		/* A timeout before the first byte leaves the stream intact. */
		if (!(rc == COT_ERR_TIMEOUT && got == 0))
			c->broken = true;
		goto done;
	}
	rc = frame_header_decode(hb, c->recv_max, h, eb);
	if (rc) {
		c->broken = true;
		goto done;
	}
	if (h->length) {
		buf = malloc(h->length);
		if (!buf) {
			c->broken = true;
			rc = cot_seterr(eb, COT_ERR_NOMEM, "out of memory for a frame of %u bytes",
			                h->length);
			goto done;
		}
		got = 0;
		rc = read_all(c, buf, h->length, deadline, &got, "receiving a frame", eb);
		if (rc) {
			c->broken = true;
			if (rc == COT_ERR_NETWORK)
				cot_seterr(eb, rc,
				           "connection to host %lld closed mid-frame, after %zu of %u "
				           "payload bytes",
				           (long long)c->host_id, got, h->length);
			free(buf);
			buf = NULL;
			goto done;
		}
	}
	*payload = buf;
done:
	sigpipe_restore(&g);
	return rc;
}

void peer_send_error(peer_conn *c, uint16_t code, const char *reason, int64_t deadline)
{
	frame_writer w;
	frame_writer_init(&w, FRAME_REASON_MAX + 16);
	if (!c->broken && frame_error_encode(&w, code, reason) == COT_OK)
		peer_send_frame(c, FRAME_ERROR, 0, w.buf, w.len, deadline, NULL);
	frame_writer_free(&w);
	c->broken = true;
}

void peer_close(peer_conn *c)
{
	if (!c)
		return;
	if (c->ssl) {
		sigpipe_guard g;
		sigpipe_block(&g);
		/* After a TLS failure OpenSSL must not send close_notify. */
		if (c->broken)
			SSL_set_quiet_shutdown(c->ssl, 1);
		else
			SSL_shutdown(c->ssl); /* one attempt; a non-blocking socket never waits */
		ERR_clear_error();
		sigpipe_restore(&g);
		SSL_free(c->ssl);
	}
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}
