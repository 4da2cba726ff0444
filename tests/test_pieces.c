/* cotrain tests: piece manifests and pieces of held files between peers
 * (shared/common/ckpt_pieces.h, shared/peer/pieces.h), over loopback with
 * real TLS 1.3 and project certificates.
 *
 * Two holders serve one file, one of them lying (it flips a bit of every
 * piece it sends); a fetch from both refuses the liar's piece, takes every
 * piece from the honest one and writes exactly the file.  Hostile requests
 * (an averaging HELLO, a file not held, a piece past the end, another
 * message, too many requests, an idle connection) get an ERROR with the
 * reason and change nothing.  alarm() bounds the whole test. */
#include "shared/common/ckpt_pieces.h"
#include "shared/common/deadline.h"
#include "shared/common/hash.h"
#include "shared/peer/dialer.h"
#include "shared/peer/frame.h"
#include "shared/peer/hello.h"
#include "shared/peer/listener.h"
#include "shared/peer/peer.h"
#include "shared/peer/pieces.h"
#include "shared/peer/pki.h"
#include "tests/tap.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_SIZE (300 * 1024 + 123) /* 5 pieces of 64 KiB, the last one short */

static char dir[64], path[128], sha[HASH_SHA256_HEX_LEN + 1];
static char *ca_pem;

typedef struct {
	peer_ctx *ctx;
	listener *lst;
	uint16_t port;
	int lie;
	atomic_int wait_for_liar; /* send nothing until the liar has a piece in hand */
	atomic_uint max_requests; /* changed by the main thread between connections */
	atomic_llong idle_ms;
	atomic_int stop;
	atomic_int served;
	pthread_t th;
} holder;

static peer_ctx *make_ctx(pki_ca *ca, int64_t id)
{
	cot_errbuf eb = { 0 };
	char *key = NULL, *pub = NULL, *cert = NULL;
	peer_ctx *ctx = NULL;
	if (pki_host_key_generate(&key, &pub, &eb) ||
	    pki_ca_sign_host(ca, pub, strlen(pub), id, time(NULL) - 60, 3600, &cert, &eb))
		bail_out("could not make host %lld: %s", (long long)id, eb.msg);
	peer_identity pi = { "demo", ca_pem, strlen(ca_pem), cert, strlen(cert), key, strlen(key) };
	if (peer_ctx_new(&pi, &ctx, &eb))
		bail_out("could not make a peer context: %s", eb.msg);
	free(key);
	free(pub);
	free(cert);
	return ctx;
}

static cot_err open_file(void *arg, const char *want, int *fd, uint64_t *size, cot_errbuf *eb)
{
	(void)arg;
	if (strcmp(want, sha) != 0)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "file %s is not held here", want);
	*fd = open(path, O_RDONLY);
	*size = FILE_SIZE;
	return *fd < 0 ? cot_seterr(eb, COT_ERR_IO, "could not open") : COT_OK;
}

static atomic_int liar_sending;

/* The liar's piece comes late (300 ms), when the honest holder has sent
 * every other piece: the fetch must still take it from the honest one.
 * The honest holder waits (up to 15 s) until the liar has a piece in hand,
 * so that however slowly the liar's handshake goes under load, the liar is
 * asked for exactly one piece. */
static void flip(void *arg, unsigned char *data, size_t len)
{
	holder *h = arg;
	struct timespec tick = { 0, 5 * 1000 * 1000 }, late = { 0, 300 * 1000 * 1000 };
	if (!h->lie) {
		for (int i = 0; i < 3000 && atomic_load(&h->wait_for_liar) && !atomic_load(&liar_sending);
		     i++)
			nanosleep(&tick, NULL);
		return;
	}
	atomic_store(&liar_sending, 1);
	nanosleep(&late, NULL);
	data[len / 3] ^= 0x10;
}

static void *holder_main(void *arg)
{
	holder *h = arg;
	while (!atomic_load(&h->stop)) {
		int fd = -1;
		peer_conn *c = NULL;
		cot_errbuf eb = { 0 };
		if (listener_accept(h->lst, deadline_after_ms(100), &fd, NULL, &eb))
			continue;
		if (peer_handshake(h->ctx, fd, PEER_SERVER, 0, deadline_after_ms(5000), &c, &eb))
			continue;
		pieces_serve_opts o = { .project = "demo",
			                .host_id = peer_ctx_host_id(h->ctx),
			                .open_file = open_file,
			                .before_send = flip,
			                .arg = h,
			                .idle_ms = atomic_load(&h->idle_ms),
			                .max_requests = atomic_load(&h->max_requests) };
		uint32_t n = 0;
		pieces_serve(c, &o, deadline_after_ms(20000), &n, &eb);
		atomic_fetch_add(&h->served, (int)n);
		peer_close(c);
	}
	return NULL;
}

static void holder_start(holder *h, peer_ctx *ctx, int lie)
{
	cot_errbuf eb = { 0 };
	*h = (holder){ .ctx = ctx, .lie = lie };
	atomic_init(&h->max_requests, 4096);
	atomic_init(&h->idle_ms, 5000);
	if (listener_open("127.0.0.1", 0, 16, &h->lst, &eb))
		bail_out("could not listen: %s", eb.msg);
	h->port = listener_port(h->lst);
	pthread_create(&h->th, NULL, holder_main, h);
}

static void holder_stop(holder *h)
{
	atomic_store(&h->stop, 1);
	pthread_join(h->th, NULL);
	listener_close(h->lst);
}

/* A connection to h with our own HELLO (round given): COT_OK and *c, or the
 * HELLO's refusal in eb. */
static cot_err dial(holder *h, peer_ctx *ctx, int64_t round, peer_conn **c, cot_errbuf *eb)
{
	dialer *d = NULL;
	dialer_result res = { .fd = -1 };
	dialer_target t = { "127.0.0.1", h->port, peer_ctx_host_id(h->ctx) };
	cot_err rc = dialer_direct_new(&d, eb);
	if (!rc)
		rc = dialer_connect(d, &t, deadline_after_ms(5000), &res, eb);
	dialer_free(d);
	if (!rc)
		rc = peer_handshake(ctx, res.fd, PEER_CLIENT, t.host_id, deadline_after_ms(5000), c, eb);
	hello_msg ours = { .proto_min = 3,
		           .proto_max = HELLO_PROTO_MAX,
		           .host_id = peer_ctx_host_id(ctx),
		           .round = round,
		           .max_payload = 1u << 20 },
	          theirs;
	snprintf(ours.project, sizeof ours.project, "demo");
	uint16_t v;
	if (!rc)
		rc = hello_exchange(*c, &ours, &theirs, &v, deadline_after_ms(5000), eb);
	return rc;
}

/* Send one frame and read the answer; the ERROR's reason into eb. */
static cot_err ask(peer_conn *c, uint8_t type, const char *name, uint32_t index, frame_header *h,
                   cot_errbuf *eb)
{
	frame_writer w;
	frame_writer_init(&w, 256);
	frame_put_str(&w, name);
	frame_put_u32(&w, index);
	cot_err rc = peer_send_frame(c, type, 0, w.buf, w.len, deadline_after_ms(5000), eb);
	frame_writer_free(&w);
	unsigned char *p = NULL;
	if (!rc)
		rc = peer_recv_frame(c, h, &p, deadline_after_ms(10000), eb);
	if (!rc && h->type == FRAME_ERROR) {
		uint16_t code;
		char reason[FRAME_REASON_MAX + 1];
		frame_error_decode(p, h->length, &code, reason, eb);
		rc = cot_seterr(eb, frame_error_to_cot(code), "%s", reason);
	}
	free(p);
	return rc;
}

static void test_manifest(void)
{
	ok(ckpt_piece_size(1) == CKPT_PIECE_MIN && ckpt_piece_size(64ull << 20) == (1u << 20) &&
	           ckpt_piece_size(231000000ull) == CKPT_PIECE_MAX &&
	           ckpt_piece_size(CKPT_FILE_MAX) == CKPT_PIECE_MAX,
	   "piece sizes: 64 KiB for small files, 1 MiB for 64 MiB, 4 MiB at most");
	cot_errbuf eb = { 0 };
	ckpt_manifest m, back;
	cot_err rc = ckpt_manifest_build(path, sha, &m, &eb);
	ok(rc == COT_OK && m.n == 5 && m.piece_size == 65536 &&
	           ckpt_piece_len(&m, 4) == FILE_SIZE - 4 * 65536,
	   "the manifest of a %d-byte file: %u pieces of %u bytes (%s)", FILE_SIZE, m.n, m.piece_size,
	   eb.msg);
	json_t *j = ckpt_manifest_to_json(&m);
	rc = ckpt_manifest_from_json(j, sha, FILE_SIZE, &back, &eb);
	ok(rc == COT_OK && back.n == m.n && memcmp(back.hash, m.hash, m.n * sizeof *m.hash) == 0,
	   "a manifest reads back from its JSON");
	ckpt_manifest_free(&back);

	/* Hostile manifests. */
	json_t *bad = json_deep_copy(j);
	json_object_set_new(bad, "piece_size", json_integer(131072));
	cot_err r1 = ckpt_manifest_from_json(bad, sha, FILE_SIZE, &back, &eb);
	json_decref(bad);
	bad = json_deep_copy(j);
	json_array_remove(json_object_get(bad, "pieces"), 0);
	cot_err r2 = ckpt_manifest_from_json(bad, sha, FILE_SIZE, &back, &eb);
	json_decref(bad);
	bad = json_deep_copy(j);
	json_array_set_new(json_object_get(bad, "pieces"), 1, json_string("zz"));
	cot_err r3 = ckpt_manifest_from_json(bad, sha, FILE_SIZE, &back, &eb);
	json_decref(bad);
	cot_err r4 = ckpt_manifest_from_json(j, sha, FILE_SIZE + 1, &back, &eb);
	ok(r1 == COT_ERR_INVALID && r2 == COT_ERR_INVALID && r3 == COT_ERR_INVALID && r4 == COT_ERR_INVALID,
	   "manifests with another piece size, a piece missing, a bad hash or another size are refused (%s)",
	   eb.msg);
	json_decref(j);

	unsigned char *buf = malloc(65536);
	int fd = open(path, O_RDONLY);
	ssize_t got = pread(fd, buf, 65536, 65536);
	close(fd);
	bool good = got == 65536 && ckpt_piece_ok(&m, 1, buf, 65536);
	bool shorter = ckpt_piece_ok(&m, 1, buf, 65535);
	bool other = ckpt_piece_ok(&m, 2, buf, 65536);
	buf[100] ^= 1;
	bool changed = ckpt_piece_ok(&m, 1, buf, 65536);
	ok(good && !shorter && !other && !changed,
	   "a piece matches its entry; shorter, at another index or with one bit changed it does not");
	free(buf);
	ckpt_manifest_free(&m);

	char wrong[HASH_SHA256_HEX_LEN + 1];
	memset(wrong, 'a', HASH_SHA256_HEX_LEN);
	wrong[HASH_SHA256_HEX_LEN] = '\0';
	ok(ckpt_manifest_build(path, wrong, &m, &eb) == COT_ERR_CORRUPT,
	   "a file that does not hash to its name has no manifest (%s)", eb.msg);
}

static void test_fetch(holder *honest, holder *liar, peer_ctx *me)
{
	cot_errbuf eb = { 0 };
	ckpt_manifest m;
	if (ckpt_manifest_build(path, sha, &m, &eb))
		bail_out("no manifest: %s", eb.msg);
	char out[160];
	snprintf(out, sizeof out, "%s/out", dir);
	int fd = open(out, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || ftruncate(fd, FILE_SIZE))
		bail_out("could not create %s", out);
	unsigned char have[5] = { 0 };
	pieces_source src[2] = {
		{ .host_id = peer_ctx_host_id(liar->ctx), .addr = "127.0.0.1", .port = liar->port },
		{ .host_id = peer_ctx_host_id(honest->ctx), .addr = "127.0.0.1", .port = honest->port }
	};
	dialer *d = NULL;
	dialer_direct_new(&d, &eb);
	atomic_store(&honest->wait_for_liar, 1);
	pieces_fetch_params p = { .m = &m,
		                  .fd = fd,
		                  .ctx = me,
		                  .dialer = d,
		                  .src = src,
		                  .n_src = 2,
		                  .deadline = deadline_after_ms(20000),
		                  .piece_timeout_ms = 5000,
		                  .have = have };
	pieces_source_stats st[2];
	cot_err rc = pieces_fetch(&p, st, &eb);
	atomic_store(&honest->wait_for_liar, 0);
	dialer_free(d);
	close(fd);
	ok(rc == COT_OK && st[0].refused == 1 && st[0].pieces == 0 && st[1].pieces == 5 && st[1].refused == 0,
	   "the liar's piece is refused and it is not asked again (%u refused, %u taken: %s); the honest "
	   "holder gives all %u pieces",
	   st[0].refused, st[0].pieces, st[0].error, st[1].pieces);
	char got[HASH_SHA256_HEX_LEN + 1] = "";
	hash_file_sha256_hex(out, got, NULL, &eb);
	ok(have[0] && have[1] && have[2] && have[3] && have[4] && strcmp(got, sha) == 0,
	   "the pieces make up exactly the file");
	/* The liar's holder thread counts its pieces once its connection ends,
	 * a moment after the fetch has returned. */
	struct timespec tick = { 0, 10 * 1000 * 1000 };
	for (int i = 0; i < 1000 && atomic_load(&liar->served) == 0; i++)
		nanosleep(&tick, NULL);
	ok(atomic_load(&liar->served) == 1, "the liar sent one piece (%d)", atomic_load(&liar->served));

	/* A source that is gone: nothing from it, the pieces stay to get. */
	memset(have, 0, sizeof have);
	fd = open(out, O_RDWR);
	pieces_source gone = { .host_id = 99, .addr = "127.0.0.1", .port = 1 };
	dialer_direct_new(&d, &eb);
	p.fd = fd;
	p.dialer = d;
	p.src = &gone;
	p.n_src = 1;
	rc = pieces_fetch(&p, st, &eb);
	dialer_free(d);
	close(fd);
	ok(rc == COT_OK && st[0].pieces == 0 && st[0].error[0] && !have[0] && !have[4],
	   "an unreachable holder gives nothing and says why (%s)", st[0].error);
	ckpt_manifest_free(&m);
}

static void test_hostile(holder *h, peer_ctx *me)
{
	cot_errbuf eb = { 0 };
	peer_conn *c = NULL;
	frame_header fh = { 0 };

	/* An averaging HELLO: refused at HELLO. */
	cot_err rc = dial(h, me, 5, &c, &eb);
	ok(rc == COT_ERR_CONFLICT && strstr(eb.msg, "pieces of files"),
	   "an averaging peer and a holder refuse each other at HELLO: %s", eb.msg);
	peer_close(c);
	c = NULL;

	char zero[HASH_SHA256_HEX_LEN + 1];
	memset(zero, '0', HASH_SHA256_HEX_LEN);
	zero[HASH_SHA256_HEX_LEN] = '\0';
	rc = dial(h, me, HELLO_ROUND_FILES, &c, &eb);
	if (!rc)
		rc = ask(c, FRAME_PIECE_GET, zero, 0, &fh, &eb);
	ok(rc == COT_ERR_NOT_FOUND && strstr(eb.msg, "is not held here"), "a file not held: %s", eb.msg);
	peer_close(c);
	c = NULL;

	rc = dial(h, me, HELLO_ROUND_FILES, &c, &eb);
	if (!rc)
		rc = ask(c, FRAME_PIECE_GET, sha, 0, &fh, &eb);
	uint8_t first = fh.type;
	cot_err rc2 = rc ? rc : ask(c, FRAME_PIECE_GET, sha, 5, &fh, &eb);
	ok(rc == COT_OK && first == FRAME_PIECE && rc2 == COT_ERR_INVALID &&
	           strstr(eb.msg, "has 5 pieces: there is no piece 5"),
	   "a piece past the end, after a good one: %s", eb.msg);
	peer_close(c);
	c = NULL;

	rc = dial(h, me, HELLO_ROUND_FILES, &c, &eb);
	if (!rc)
		rc = ask(c, FRAME_SLICE, sha, 0, &fh, &eb);
	ok(rc == COT_ERR_INVALID && strstr(eb.msg, "expected PIECE_GET"), "another message: %s", eb.msg);
	peer_close(c);
	c = NULL;

	rc = dial(h, me, HELLO_ROUND_FILES, &c, &eb);
	if (!rc)
		rc = ask(c, FRAME_PIECE_GET, "not a sha", 0, &fh, &eb);
	ok(rc == COT_ERR_INVALID && strstr(eb.msg, "names no sha256"), "a name that is no sha256: %s",
	   eb.msg);
	peer_close(c);
	c = NULL;

	h->max_requests = 2;
	rc = dial(h, me, HELLO_ROUND_FILES, &c, &eb);
	for (uint32_t i = 0; !rc && i < 3; i++)
		rc = ask(c, FRAME_PIECE_GET, sha, i, &fh, &eb);
	ok(rc == COT_ERR_TOO_LARGE && strstr(eb.msg, "more than 2 requests"), "too many requests: %s",
	   eb.msg);
	peer_close(c);
	c = NULL;
	h->max_requests = 4096;

	h->idle_ms = 300;
	rc = dial(h, me, HELLO_ROUND_FILES, &c, &eb);
	unsigned char *p = NULL;
	if (!rc)
		rc = peer_recv_frame(c, &fh, &p, deadline_after_ms(5000), &eb);
	ok(rc == COT_OK && fh.type == FRAME_ERROR, "an idle connection is told so and closed");
	free(p);
	peer_close(c);
	h->idle_ms = 5000;

	char got[HASH_SHA256_HEX_LEN + 1] = "";
	hash_file_sha256_hex(path, got, NULL, &eb);
	is_str(got, sha, "the held file is unchanged after the hostile requests");
}

int main(void)
{
	alarm(120);
	plan(19);
	snprintf(dir, sizeof dir, "/tmp/cotrain-pieces-XXXXXX");
	if (!mkdtemp(dir))
		bail_out("no temporary folder");
	snprintf(path, sizeof path, "%s/file", dir);
	unsigned char *data = malloc(FILE_SIZE);
	for (size_t i = 0; i < FILE_SIZE; i++)
		data[i] = (unsigned char)(i * 2654435761u >> 13);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, FILE_SIZE, f) != FILE_SIZE || fclose(f))
		bail_out("could not write %s", path);
	hash_sha256_hex(data, FILE_SIZE, sha);
	free(data);

	cot_errbuf eb = { 0 };
	pki_ca *ca = NULL;
	if (pki_ca_create("demo", 0, &ca, &eb) || pki_ca_cert_pem(ca, &ca_pem, &eb))
		bail_out("no CA: %s", eb.msg);
	peer_ctx *c1 = make_ctx(ca, 1), *c2 = make_ctx(ca, 2), *c3 = make_ctx(ca, 3);

	test_manifest();
	holder honest, liar;
	holder_start(&honest, c1, 0);
	holder_start(&liar, c2, 1);
	test_fetch(&honest, &liar, c3);
	test_hostile(&honest, c3);
	holder_stop(&honest);
	holder_stop(&liar);

	peer_ctx *r = peer_ctx_ref(c1);
	peer_ctx_free(c1);
	ok(peer_ctx_host_id(r) == 1, "a context lives on while a reference is held");
	peer_ctx_free(r);
	peer_ctx_free(c2);
	peer_ctx_free(c3);
	pki_ca_free(ca);
	free(ca_pem);
	unlink(path);
	char out[160];
	snprintf(out, sizeof out, "%s/out", dir);
	unlink(out);
	rmdir(dir);
	return exit_status();
}
