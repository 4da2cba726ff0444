/* cotrain tests: TLS 1.3 peer connections over loopback, between threads.
 *
 * Every case runs a server thread that accepts one connection on a shared
 * listener and a client in the main thread; each network call has a
 * deadline, and alarm() bounds the whole test, so a hang fails instead of
 * waiting forever.  Sockets get small kernel buffers, so that "the sender
 * blocks until the receiver reads" does not depend on timing. */
#include "shared/common/deadline.h"
#include "shared/peer/dialer.h"
#include "shared/peer/frame.h"
#include "shared/peer/hello.h"
#include "shared/peer/listener.h"
#include "shared/peer/peer.h"
#include "shared/peer/pki.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#define SMALL_BUF (64 * 1024)
#define BIG (32u << 20)

typedef struct {
	char *cert, *key;
} ident;

static char *ca_pem, *other_ca_pem;
static ident host1, host2, expired3, foreign4;
static peer_ctx *srv_ctx, *cli_ctx, *expired_ctx;
static listener *lst;
static uint16_t port;

/* ---- Setup ---- */

static ident make_ident(pki_ca *ca, int64_t id, int64_t nb, int64_t life)
{
	cot_errbuf eb = { 0 };
	ident r = { 0 };
	char *pub = NULL;
	if (pki_host_key_generate(&r.key, &pub, &eb) ||
	    pki_ca_sign_host(ca, pub, strlen(pub), id, nb, life, &r.cert, &eb))
		bail_out("could not make host %lld: %s", (long long)id, eb.msg);
	free(pub);
	return r;
}

static peer_ctx *make_ctx(const char *project, const char *ca, const ident *id)
{
	cot_errbuf eb = { 0 };
	peer_ctx *ctx = NULL;
	peer_identity pi = { project, ca, strlen(ca), id->cert, strlen(id->cert), id->key, strlen(id->key) };
	if (peer_ctx_new(&pi, &ctx, &eb))
		bail_out("could not make a peer context: %s", eb.msg);
	return ctx;
}

static hello_msg make_hello(const peer_ctx *ctx, int64_t round)
{
	hello_msg m = { .proto_min = HELLO_PROTO_MIN,
		        .proto_max = HELLO_PROTO_MAX,
		        .host_id = peer_ctx_host_id(ctx),
		        .round = round,
		        .max_payload = FRAME_PAYLOAD_HARD_MAX };
	snprintf(m.project, sizeof m.project, "%s", peer_ctx_project(ctx));
	return m;
}

static void small_buffers(int fd)
{
	int n = SMALL_BUF;
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &n, sizeof n);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &n, sizeof n);
}

/* ---- The server thread ---- */

typedef struct job job;
struct job {
	void (*body)(job *j, peer_conn *c); /* after a successful handshake */
	cot_err rc;                         /* of the handshake */
	cot_errbuf eb;
	int64_t peer_id;
	/* for bodies */
	cot_err rc2, rc3;
	cot_errbuf eb2, eb3;
	int64_t elapsed_ms;
	uint16_t version;
	hello_msg theirs;
	int64_t round;
	sem_t go, done;
	atomic_int reader_started;
	pthread_t th;
};

static void *server_main(void *arg)
{
	job *j = arg;
	int fd = -1;
	peer_conn *c = NULL;
	j->rc = listener_accept(lst, deadline_after_ms(10000), &fd, NULL, &j->eb);
	if (j->rc == COT_OK)
		j->rc = peer_handshake(srv_ctx, fd, PEER_SERVER, 0, deadline_after_ms(10000), &c, &j->eb);
	if (j->rc == COT_OK) {
		j->peer_id = peer_host_id(c);
		if (j->body)
			j->body(j, c);
		peer_close(c);
	}
	return NULL;
}

static job *serve(void (*body)(job *, peer_conn *))
{
	job *j = calloc(1, sizeof *j);
	j->body = body;
	j->round = 17;
	sem_init(&j->go, 0, 0);
	sem_init(&j->done, 0, 0);
	if (pthread_create(&j->th, NULL, server_main, j))
		bail_out("could not start the server thread");
	return j;
}

static job *jobs[32];
static size_t njobs;

/* Wait for the server thread; j stays readable until free_jobs(). */
static void finish(job *j)
{
	pthread_join(j->th, NULL);
	sem_destroy(&j->go);
	sem_destroy(&j->done);
	if (njobs < sizeof jobs / sizeof *jobs)
		jobs[njobs++] = j;
}

static void free_jobs(void)
{
	for (size_t i = 0; i < njobs; i++)
		free(jobs[i]);
}

/* Dial the listener directly and run the client handshake. */
static cot_err dial(peer_ctx *ctx, int64_t expect, peer_conn **c, cot_errbuf *eb)
{
	dialer *d = NULL;
	dialer_result res;
	dialer_target t = { "127.0.0.1", port, expect };
	memset(eb, 0, sizeof *eb);
	cot_err rc = dialer_direct_new(&d, eb);
	if (!rc)
		rc = dialer_connect(d, &t, deadline_after_ms(5000), &res, eb);
	dialer_free(d);
	if (rc)
		return rc;
	small_buffers(res.fd);
	return peer_handshake(ctx, res.fd, PEER_CLIENT, expect, deadline_after_ms(10000), c, eb);
}

/* ---- A raw OpenSSL client, for what our own API would never do ---- */

typedef struct {
	SSL_CTX *ctx;
	SSL *ssl;
	int fd;
	int hs; /* SSL_connect's result */
} raw;

static raw raw_connect(const ident *id, int max_version)
{
	raw r = { 0 };
	r.fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct timeval tv = { 10, 0 };
	setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(r.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(r.fd, (struct sockaddr *)&sa, sizeof sa) != 0)
		bail_out("raw client could not connect");
	r.ctx = SSL_CTX_new(TLS_client_method());
	SSL_CTX_set_max_proto_version(r.ctx, max_version);
	SSL_CTX_set_verify(r.ctx, SSL_VERIFY_NONE, NULL);
	if (id) {
		BIO *b = BIO_new_mem_buf(id->cert, -1);
		X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
		BIO_free(b);
		b = BIO_new_mem_buf(id->key, -1);
		EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
		BIO_free(b);
		if (SSL_CTX_use_certificate(r.ctx, x) != 1 || SSL_CTX_use_PrivateKey(r.ctx, k) != 1)
			bail_out("raw client could not use its certificate");
		X509_free(x);
		EVP_PKEY_free(k);
	}
	r.ssl = SSL_new(r.ctx);
	SSL_set_fd(r.ssl, r.fd);
	r.hs = SSL_connect(r.ssl);
	ERR_clear_error();
	return r;
}

/* Write all of p, or false. */
static bool raw_write(raw *r, const void *p, size_t n) { return SSL_write(r->ssl, p, (int)n) == (int)n; }

/* After a handshake the server may refuse: true when reading shows it did
 * (an alert or a closed connection, not data). */
static bool raw_refused(raw *r)
{
	char b[64];
	int n = SSL_read(r->ssl, b, sizeof b);
	ERR_clear_error();
	return n <= 0;
}

static void raw_close(raw *r, bool notify)
{
	if (notify)
		SSL_shutdown(r->ssl);
	SSL_free(r->ssl);
	SSL_CTX_free(r->ctx);
	close(r->fd);
	ERR_clear_error();
}

/* ---- Server bodies ---- */

/* HELLO, then echo one frame back as RESULT. */
static void body_hello_echo(job *j, peer_conn *c)
{
	hello_msg ours = make_hello(srv_ctx, j->round);
	j->rc2 = hello_exchange(c, &ours, &j->theirs, &j->version, deadline_after_ms(10000), &j->eb2);
	if (j->rc2)
		return;
	frame_header h;
	unsigned char *p = NULL;
	j->rc3 = peer_recv_frame(c, &h, &p, deadline_after_ms(10000), &j->eb3);
	if (!j->rc3)
		j->rc3 = peer_send_frame(c, FRAME_RESULT, h.request_id, p, h.length, deadline_after_ms(10000),
		                         &j->eb3);
	free(p);
}

/* HELLO alone, timed. */
static void body_hello_timed(job *j, peer_conn *c)
{
	hello_msg ours = make_hello(srv_ctx, j->round);
	int64_t t0 = deadline_now_ms();
	j->rc2 = hello_exchange(c, &ours, &j->theirs, &j->version, t0 + 10000, &j->eb2);
	j->elapsed_ms = deadline_now_ms() - t0;
}

/* HELLO, then a receive that must time out while the client stalls; then
 * the connection must still carry the client's next frame. */
static void body_timeout(job *j, peer_conn *c)
{
	hello_msg ours = make_hello(srv_ctx, j->round);
	if ((j->rc2 = hello_exchange(c, &ours, &j->theirs, &j->version, deadline_after_ms(10000), &j->eb2)))
		return;
	frame_header h;
	unsigned char *p = NULL;
	int64_t t0 = deadline_now_ms();
	j->rc2 = peer_recv_frame(c, &h, &p, t0 + 300, &j->eb2);
	j->elapsed_ms = deadline_now_ms() - t0;
	free(p);
	sem_post(&j->go);
	p = NULL;
	j->rc3 = peer_recv_frame(c, &h, &p, deadline_after_ms(10000), &j->eb3);
	if (!j->rc3 && !(h.type == FRAME_SLICE && h.length == 2 && memcmp(p, "hi", 2) == 0))
		j->rc3 = COT_ERR_CORRUPT;
	free(p);
}

/* HELLO, then read one 32 MiB frame only after the client has started to
 * send it; check every byte. */
static void body_slow_reader(job *j, peer_conn *c)
{
	hello_msg ours = make_hello(srv_ctx, j->round);
	if ((j->rc2 = hello_exchange(c, &ours, &j->theirs, &j->version, deadline_after_ms(10000), &j->eb2)))
		return;
	sem_wait(&j->go); /* the client is inside peer_send_frame */
	struct timespec ts = { 0, 200 * 1000000 };
	nanosleep(&ts, NULL); /* let it fill the buffers; correctness does not depend on it */
	atomic_store(&j->reader_started, 1);
	frame_header h;
	unsigned char *p = NULL;
	j->rc3 = peer_recv_frame(c, &h, &p, deadline_after_ms(30000), &j->eb3);
	if (!j->rc3) {
		bool same = h.length == BIG;
		for (size_t i = 0; same && i < BIG; i++)
			same = p[i] == (unsigned char)(i * 31 % 251);
		if (!same)
			j->rc3 = cot_seterr(&j->eb3, COT_ERR_CORRUPT, "the 32 MiB payload arrived changed");
	}
	free(p);
}

/* HELLO, wait until the client gave up its send, then read the cut frame. */
static void body_stalled_reader(job *j, peer_conn *c)
{
	hello_msg ours = make_hello(srv_ctx, j->round);
	if ((j->rc2 = hello_exchange(c, &ours, &j->theirs, &j->version, deadline_after_ms(10000), &j->eb2)))
		return;
	peer_set_max_payload(c, FRAME_PAYLOAD_HARD_MAX);
	sem_wait(&j->go);
	frame_header h;
	unsigned char *p = NULL;
	j->rc3 = peer_recv_frame(c, &h, &p, deadline_after_ms(10000), &j->eb3);
	free(p);
}

/* One receive, no HELLO (the raw client sends frames by hand). */
static void body_recv(job *j, peer_conn *c)
{
	frame_header h;
	unsigned char *p = NULL;
	int64_t t0 = deadline_now_ms();
	j->rc2 = peer_recv_frame(c, &h, &p, t0 + 5000, &j->eb2);
	j->elapsed_ms = deadline_now_ms() - t0;
	free(p);
	/* And the connection is now unusable. */
	j->rc3 = peer_recv_frame(c, &h, &p, deadline_after_ms(100), &j->eb3);
	free(p);
}

/* A rung that always fails, standing in for a later "punch". */
static cot_err failing_connect(dialer *d, const dialer_target *t, int64_t deadline, dialer_result *res,
                               cot_errbuf *eb)
{
	(void)d, (void)t, (void)deadline, (void)res;
	return cot_seterr(eb, COT_ERR_NETWORK, "no hole today");
}
static void failing_free(dialer *d) { free(d); }
static const dialer_ops failing_ops = { "punch", failing_connect, failing_free };

int main(void)
{
	cot_errbuf eb = { 0 };
	int64_t now = (int64_t)time(NULL);
	alarm(120);
	plan_lazy();

	/* PKI: project "demo" with hosts 1, 2 and an expired 3; host 4 of
	 * another CA ("elsewhere"). */
	pki_ca *ca = NULL, *oca = NULL;
	if (pki_ca_create("demo", 0, &ca, &eb) || pki_ca_cert_pem(ca, &ca_pem, &eb) ||
	    pki_ca_create("elsewhere", 0, &oca, &eb) || pki_ca_cert_pem(oca, &other_ca_pem, &eb))
		bail_out("could not make CAs: %s", eb.msg);
	host1 = make_ident(ca, 1, 0, 0);
	host2 = make_ident(ca, 2, 0, 0);
	expired3 = make_ident(ca, 3, now - 10 * 3600, 3600);
	foreign4 = make_ident(oca, 4, 0, 0);
	srv_ctx = make_ctx("demo", ca_pem, &host1);
	cli_ctx = make_ctx("demo", ca_pem, &host2);
	expired_ctx = make_ctx("demo", ca_pem, &expired3);
	is_int(peer_ctx_host_id(cli_ctx), 2, "a context knows its own host id");

	/* Contexts refuse identities that peers would refuse. */
	peer_ctx *bad = NULL;
	peer_identity pi = { "demo",
		             ca_pem,
		             strlen(ca_pem),
		             foreign4.cert,
		             strlen(foreign4.cert),
		             foreign4.key,
		             strlen(foreign4.key) };
	is_int(peer_ctx_new(&pi, &bad, &eb), COT_ERR_AUTH,
	       "a context with another CA's certificate is refused: %s", eb.msg);
	pi = (peer_identity){ "demo",    ca_pem,           strlen(ca_pem), host1.cert, strlen(host1.cert),
		              host2.key, strlen(host2.key) };
	memset(&eb, 0, sizeof eb);
	is_int(peer_ctx_new(&pi, &bad, &eb), COT_ERR_INVALID,
	       "a context whose key does not match its certificate is refused: %s", eb.msg);

	if (listener_open("127.0.0.1", 0, 16, &lst, &eb))
		bail_out("could not listen: %s", eb.msg);
	port = listener_port(lst);
	small_buffers(listener_fd(lst)); /* inherited by accepted sockets */
	ok(port > 0, "listening on port %u", port);

	/* 1. Mutual TLS 1.3, HELLO, a frame each way. */
	job *j = serve(body_hello_echo);
	peer_conn *c = NULL;
	cot_err rc = dial(cli_ctx, 1, &c, &eb);
	is_int(rc, COT_OK, "the client completes the handshake: %s", eb.msg);
	hello_msg ours = make_hello(cli_ctx, 17), theirs;
	uint16_t version = 0;
	if (!rc) {
		is_int(peer_host_id(c), 1, "the client learns the server is host 1");
		is_int(hello_exchange(c, &ours, &theirs, &version, deadline_after_ms(10000), &eb), COT_OK,
		       "the HELLO exchange succeeds: %s", eb.msg);
		ok(version == HELLO_PROTO_MAX && theirs.host_id == 1 && theirs.round == 17 &&
		           !strcmp(theirs.project, "demo"),
		   "the client learns the server's HELLO");
		is_int(peer_send_frame(c, FRAME_SLICE, 77, "payload", 7, deadline_after_ms(5000), &eb),
		       COT_OK, "a frame is sent");
		frame_header h;
		unsigned char *p = NULL;
		is_int(peer_recv_frame(c, &h, &p, deadline_after_ms(5000), &eb), COT_OK, "its echo arrives");
		ok(h.type == FRAME_RESULT && h.request_id == 77 && h.length == 7 && p &&
		           !memcmp(p, "payload", 7),
		   "with type, request id and payload");
		free(p);
		peer_close(c);
	}
	finish(j);
	is_int(j->rc, COT_OK, "the server completes the handshake");
	is_int(j->peer_id, 2, "the server learns the client is host 2");
	ok(j->rc2 == COT_OK && j->version == HELLO_PROTO_MAX && j->theirs.host_id == 2,
	   "the server agrees on the newest version with host 2");
	is_int(j->rc3, COT_OK, "the server echoes: %s", j->eb3.msg);

	/* 2. The client expects another host. */
	j = serve(body_hello_echo);
	rc = dial(cli_ctx, 99, &c, &eb);
	is_int(rc, COT_ERR_AUTH, "a client expecting host 99 refuses host 1");
	ok(strstr(eb.msg, "peer is host 1, not the expected host 99") != NULL, "%s", eb.msg);
	finish(j);
	ok(j->rc != COT_OK, "and the server sees the handshake fail: %s", j->eb.msg);

	/* 3. A client without a certificate. */
	j = serve(NULL);
	raw r = raw_connect(NULL, TLS1_3_VERSION);
	ok(r.hs != 1 || raw_refused(&r), "a client without a certificate is refused");
	raw_close(&r, false);
	finish(j);
	is_int(j->rc, COT_ERR_AUTH, "the server refuses a client without a certificate: %s", j->eb.msg);

	/* 4. A client with an expired certificate. */
	j = serve(body_hello_echo);
	rc = dial(expired_ctx, 1, &c, &eb);
	if (!rc) {
		/* TLS 1.3: the refusal reaches the client on its first read. */
		rc = hello_exchange(c, &ours, &theirs, &version, deadline_after_ms(10000), &eb);
		peer_close(c);
	}
	is_int(rc, COT_ERR_AUTH, "a client with an expired certificate learns it was refused: %s", eb.msg);
	finish(j);
	is_int(j->rc, COT_ERR_AUTH, "the server refuses the expired certificate");
	ok(strstr(j->eb.msg, "expired at") != NULL, "saying so: %s", j->eb.msg);

	/* 5. A client with a certificate from another project's CA. */
	j = serve(NULL);
	r = raw_connect(&foreign4, TLS1_3_VERSION);
	ok(r.hs != 1 || raw_refused(&r), "a client of another project's CA is refused");
	raw_close(&r, false);
	finish(j);
	is_int(j->rc, COT_ERR_AUTH, "the server refuses a certificate of another CA");
	ok(strstr(j->eb.msg, "is not from the CA of project \"demo\"") != NULL, "saying so: %s", j->eb.msg);

	/* 6. TLS 1.2. */
	j = serve(NULL);
	r = raw_connect(&host2, TLS1_2_VERSION);
	is_int(r.hs == 1, 0, "a TLS 1.2 client cannot complete a handshake");
	raw_close(&r, false);
	finish(j);
	is_int(j->rc, COT_ERR_UNSUPPORTED, "the server refuses TLS 1.2: %s", j->eb.msg);

	/* 7. The server keeps serving after all that. */
	j = serve(body_hello_echo);
	rc = dial(cli_ctx, 1, &c, &eb);
	if (!rc) {
		rc = hello_exchange(c, &ours, &theirs, &version, deadline_after_ms(10000), &eb);
		if (!rc)
			rc = peer_send_frame(c, FRAME_SLICE, 1, "x", 1, deadline_after_ms(5000), &eb);
		frame_header h;
		unsigned char *p = NULL;
		if (!rc)
			rc = peer_recv_frame(c, &h, &p, deadline_after_ms(5000), &eb);
		free(p);
		peer_close(c);
	}
	finish(j);
	ok(rc == COT_OK && j->rc == COT_OK && j->rc3 == COT_OK,
	   "after refusing bad clients the server still serves a good one");

	/* 8. HELLO refusals travel both ways. */
	j = serve(body_hello_echo);
	j->round = 18;
	rc = dial(cli_ctx, 1, &c, &eb);
	if (!rc) {
		rc = hello_exchange(c, &ours, &theirs, &version, deadline_after_ms(10000), &eb);
		peer_close(c);
	}
	finish(j);
	is_int(rc, COT_ERR_CONFLICT, "a client in round 17 refuses a server in round 18: %s", eb.msg);
	is_int(j->rc2, COT_ERR_CONFLICT, "and the server refuses the client: %s", j->eb2.msg);

	j = serve(body_hello_echo);
	rc = dial(cli_ctx, 1, &c, &eb);
	if (!rc) {
		hello_msg liar = ours;
		liar.host_id = 1;
		rc = hello_exchange(c, &liar, &theirs, &version, deadline_after_ms(10000), &eb);
		peer_close(c);
	}
	finish(j);
	is_int(j->rc2, COT_ERR_AUTH, "a HELLO claiming another host than the certificate is refused: %s",
	       j->eb2.msg);
	is_int(rc, COT_ERR_AUTH, "and the liar hears why: %s", eb.msg);
	ok(strstr(eb.msg, "peer refused:") != NULL, "as the peer's refusal");

	j = serve(body_hello_echo);
	rc = dial(cli_ctx, 1, &c, &eb);
	if (!rc) {
		hello_msg future = ours;
		future.proto_min = future.proto_max = HELLO_PROTO_MAX + 1;
		rc = hello_exchange(c, &future, &theirs, &version, deadline_after_ms(10000), &eb);
		peer_close(c);
	}
	finish(j);
	is_int(j->rc2, COT_ERR_UNSUPPORTED, "a peer speaking only a later version is refused: %s",
	       j->eb2.msg);

	/* 9. A receive times out within its deadline; the connection survives. */
	j = serve(body_timeout);
	rc = dial(cli_ctx, 1, &c, &eb);
	if (!rc && !(rc = hello_exchange(c, &ours, &theirs, &version, deadline_after_ms(10000), &eb))) {
		sem_wait(&j->go); /* the server's receive has returned */
		rc = peer_send_frame(c, FRAME_SLICE, 0, "hi", 2, deadline_after_ms(5000), &eb);
	}
	is_int(rc, COT_OK, "the stalling client connects and later sends: %s", eb.msg);
	finish(j);
	peer_close(c);
	is_int(j->rc2, COT_ERR_TIMEOUT, "a receive from a stalled peer times out: %s", j->eb2.msg);
	ok(j->elapsed_ms >= 290 && j->elapsed_ms < 5000, "at its 300 ms deadline (took %lld ms)",
	   (long long)j->elapsed_ms);
	is_int(j->rc3, COT_OK, "a timeout between frames leaves the connection usable");

	/* 10. 32 MiB through small buffers to a slow reader: the send blocks
	 * until the reader reads, and every byte arrives. */
	unsigned char *big = malloc(BIG);
	for (size_t i = 0; i < BIG; i++)
		big[i] = (unsigned char)(i * 31 % 251);
	j = serve(body_slow_reader);
	rc = dial(cli_ctx, 1, &c, &eb);
	if (!rc && !(rc = hello_exchange(c, &ours, &theirs, &version, deadline_after_ms(10000), &eb))) {
		sem_post(&j->go);
		rc = peer_send_frame(c, FRAME_SLICE, 0, big, BIG, deadline_after_ms(30000), &eb);
		ok(atomic_load(&j->reader_started),
		   "the 32 MiB send returned only after the reader started reading");
	}
	is_int(rc, COT_OK, "32 MiB are sent: %s", eb.msg);
	finish(j);
	peer_close(c);
	is_int(j->rc3, COT_OK, "32 MiB arrive intact: %s", j->eb3.msg);

	/* 11. A reader that never reads: the send times out, it does not queue;
	 * the reader then gets a clean mid-frame error. */
	j = serve(body_stalled_reader);
	rc = dial(cli_ctx, 1, &c, &eb);
	if (!rc && !(rc = hello_exchange(c, &ours, &theirs, &version, deadline_after_ms(10000), &eb))) {
		int64_t t0 = deadline_now_ms();
		rc = peer_send_frame(c, FRAME_SLICE, 0, big, BIG, t0 + 500, &eb);
		int64_t took = deadline_now_ms() - t0;
		is_int(rc, COT_ERR_TIMEOUT, "a 32 MiB send to a reader that does not read times out: %s",
		       eb.msg);
		ok(took >= 490 && took < 5000, "at its 500 ms deadline (took %lld ms)", (long long)took);
		is_int(peer_send_frame(c, FRAME_SLICE, 0, "x", 1, deadline_after_ms(1000), &eb),
		       COT_ERR_CONFLICT, "the connection is then broken: %s", eb.msg);
		peer_close(c);
		sem_post(&j->go);
	} else {
		ok(false, "the stalled-reader case could not start: %s", eb.msg);
		sem_post(&j->go);
	}
	finish(j);
	is_int(j->rc3, COT_ERR_NETWORK, "the reader sees the connection cut mid-frame: %s", j->eb3.msg);
	ok(strstr(j->eb3.msg, "mid-frame") != NULL, "and says so");
	free(big);

	/* 12. Frames a peer should never send, written by hand. */
	unsigned char hb[FRAME_HEADER_LEN];
	frame_header fh = { FRAME_VERSION, FRAME_SLICE, 0, 48u << 20, 0 };
	frame_header_encode(&fh, hb);
	j = serve(body_recv);
	r = raw_connect(&host2, TLS1_3_VERSION);
	ok(r.hs == 1 && raw_write(&r, hb, sizeof hb),
	   "a raw client announces a 48 MiB frame and sends nothing more");
	finish(j);
	raw_close(&r, false);
	is_int(j->rc2, COT_ERR_TOO_LARGE,
	       "the frame is refused from its header, without waiting for (or allocating) its payload: %s",
	       j->eb2.msg);
	ok(j->elapsed_ms < 4000, "at once (%lld ms)", (long long)j->elapsed_ms);
	is_int(j->rc3, COT_ERR_CONFLICT, "and the connection is broken");

	fh.length = 1000;
	frame_header_encode(&fh, hb);
	j = serve(body_recv);
	r = raw_connect(&host2, TLS1_3_VERSION);
	ok(r.hs == 1 && raw_write(&r, hb, sizeof hb) && raw_write(&r, "0123456789", 10),
	   "a raw client sends a header for 1000 bytes and 10 of them");
	raw_close(&r, true);
	finish(j);
	is_int(j->rc2, COT_ERR_NETWORK, "the peer closing mid-frame is a network error: %s", j->eb2.msg);
	ok(strstr(j->eb2.msg, "closed mid-frame, after 10 of 1000 payload bytes") != NULL,
	   "naming how far it got");

	/* Before HELLO only a HELLO or an ERROR may come: 64 KiB at most. */
	fh = (frame_header){ FRAME_VERSION, FRAME_HELLO, 0, 1u << 20, 0 };
	frame_header_encode(&fh, hb);
	j = serve(body_hello_timed);
	r = raw_connect(&host2, TLS1_3_VERSION);
	ok(r.hs == 1 && raw_write(&r, hb, sizeof hb),
	   "a raw client announces a 1 MiB HELLO (under the 16 MiB default limit) and sends nothing more");
	finish(j);
	raw_close(&r, false);
	is_int(j->rc2, COT_ERR_TOO_LARGE, "it is refused from its header, before any allocation: %s",
	       j->eb2.msg);
	ok(j->elapsed_ms < 4000, "at once (%lld ms)", (long long)j->elapsed_ms);

	fh = (frame_header){ FRAME_VERSION, FRAME_SLICE, 0, 1000, 0 };
	frame_header_encode(&fh, hb);
	memcpy(hb, "HTTP", 4);
	j = serve(body_recv);
	r = raw_connect(&host2, TLS1_3_VERSION);
	ok(r.hs == 1 && raw_write(&r, hb, sizeof hb), "a raw client sends a bad magic");
	finish(j);
	raw_close(&r, false);
	is_int(j->rc2, COT_ERR_INVALID, "a bad magic is refused: %s", j->eb2.msg);

	/* 13. Dialers and the listener. */
	int fd = -1;
	int64_t t0 = deadline_now_ms();
	is_int(listener_accept(lst, t0 + 100, &fd, NULL, &eb), COT_ERR_TIMEOUT,
	       "accept with nobody calling times out");
	ok(deadline_now_ms() - t0 < 3000, "within its deadline");
	listener *closed = NULL;
	listener_open("127.0.0.1", 0, 1, &closed, &eb);
	uint16_t dead_port = closed ? listener_port(closed) : 1;
	listener_close(closed);
	dialer *d = NULL, *rungs[2];
	dialer_result res;
	dialer_direct_new(&d, &eb);
	dialer_target t = { "127.0.0.1", dead_port, 5 };
	memset(&eb, 0, sizeof eb);
	is_int(dialer_connect(d, &t, deadline_after_ms(3000), &res, &eb), COT_ERR_NETWORK,
	       "dialing a closed port fails: %s", eb.msg);
	t.addr = "peer.example.org";
	is_int(dialer_connect(d, &t, deadline_after_ms(3000), &res, &eb), COT_ERR_INVALID,
	       "a name instead of an address is refused (no DNS lookups)");
	is_str(dialer_rung(d), "direct", "the direct dialer reports its rung");
	dialer_free(d);

	rungs[0] = calloc(1, sizeof(dialer));
	rungs[0]->ops = &failing_ops;
	dialer_direct_new(&rungs[1], &eb);
	dialer *ladder = NULL;
	is_int(dialer_ladder_new(rungs, 2, &ladder, &eb), COT_OK, "a ladder of punch and direct is made");
	t.addr = "::1";
	t.port = port;
	listener *l6 = NULL;
	if (listener_open("::", 0, 4, &l6, &eb) == COT_OK) {
		t.port = listener_port(l6);
		memset(&eb, 0, sizeof eb);
		rc = dialer_connect(ladder, &t, deadline_after_ms(5000), &res, &eb);
		is_int(rc, COT_OK, "the ladder reaches an IPv6 listener: %s", eb.msg);
		is_str(rc ? "" : res.rung, "direct", "on its direct rung, after punch failed");
		int afd = -1;
		char from[LISTENER_ADDR_MAX];
		is_int(listener_accept(l6, deadline_after_ms(3000), &afd, from, &eb), COT_OK,
		       "the listener accepts it");
		ok(strncmp(from, "[::1]:", 6) == 0, "from %s", from);
		if (!rc)
			close(res.fd);
		if (afd >= 0)
			close(afd);
		listener_close(l6);
	} else {
		skip(4, "no IPv6 on loopback");
	}
	t.addr = "127.0.0.1";
	t.port = dead_port;
	memset(&eb, 0, sizeof eb);
	is_int(dialer_connect(ladder, &t, deadline_after_ms(3000), &res, &eb), COT_ERR_NETWORK,
	       "a ladder whose rungs all fail fails");
	ok(strstr(eb.msg, "punch: no hole today; direct: could not connect") != NULL,
	   "naming each rung's failure: %s", eb.msg);
	dialer_free(ladder);

	listener_close(lst);
	peer_ctx_free(srv_ctx);
	peer_ctx_free(cli_ctx);
	peer_ctx_free(expired_ctx);
	pki_ca_free(ca);
	pki_ca_free(oca);
	ident all[] = { host1, host2, expired3, foreign4 };
	for (size_t i = 0; i < 4; i++) {
		free(all[i].cert);
		free(all[i].key);
	}
	free(ca_pem);
	free(other_ca_pem);
	free_jobs();
	done_testing();
	return exit_status();
}
