/* cotrain bench: one member of a butterfly all-reduce (shared/averaging/allreduce.h),
 * run as its own process, for benchmarks and tests in network namespaces
 * (tests/bench/bench-allreduce.sh, tests/test_allreduce_netns.sh).
 *
 *   allreduce_peer --make-certs DIR N
 *       a project CA and N host identities in DIR: ca.pem, host<I>.crt and
 *       host<I>.key for host ids 1..N (project "arbench")
 *   allreduce_peer --plan FILE --self I --certs DIR
 *       run member I (0-based) of the plan; prints one line
 *       "member I host H wall_ms W checksum C total_samples T included K verify V"
 *       (V: ok, FAILED or skipped) and exits 0 on success, 1 on failure; on
 *       success first "cpu I host H user_ms U sys_ms S": the process's CPU
 *       time in allreduce_run
 *   allreduce_peer --shares LEN MBIT...
 *       DeDLOC's shares for peers of these bandwidths (server/load_balance.h,
 *       every peer can aggregate): one line "peer I mbit B share W start S end E"
 *       each, then "bound_s T": the slowest peer's transfer time for LEN fp32
 *       values (lb_shares' time per value x LEN x 32 bits over Mbit/s)
 *   allreduce_peer --tcp-sink PORT
 *   allreduce_peer --tcp-source ADDR PORT MBYTES
 *       a plain TCP transfer (no TLS): the sink prints "tcp_mbit R" once the
 *       source has closed, R measured from the first to the last byte
 *
 * The plan file (whitespace-separated, '#' comments):
 *   len V            values in the gradient (1 .. 64 Mi)
 *   seed S           gradients are pseudo-random from (S, host id): every
 *                    process can recompute every member's gradient
 *   comp none|fp16|8bit       slice and result encoding (default none)
 *   start_ms T       wall-clock start (Unix ms, CLOCK_REALTIME): all members
 *                    call allreduce_run at T, after their listeners are open
 *   timeout_s S      collect deadline S after start, whole deadline 1.5 S
 *   sketch K         the sketches of what was averaged, K values each
 *                    (allreduce_params.sketch_k; default 0: none); the
 *                    member line ends "sketch_ms X", the time they took
 *   verify 0|1       recompute every member's gradient and compare the result
 *                    with allreduce_sum in ascending host id order (comp none:
 *                    bit-exact; otherwise within the encodings' error)
 *   member HOST ADDR PORT START END SAMPLES    one line per member, in order
 *
 * The checksum is FNV-1a 64 over the result's bytes: identical bytes at every
 * member give the same checksum.  Wall time is from T to allreduce_run's
 * return, so the slowest member's wall time is the group's. */
#include "shared/averaging/allreduce.h"
#include "shared/averaging/compress.h"
#include "shared/common/deadline.h"
#include "shared/peer/dialer.h"
#include "shared/peer/listener.h"
#include "shared/peer/peer.h"
#include "shared/peer/pki.h"
#include "server/load_balance.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROJECT "arbench"
#define MAX_LEN (64u << 20)

static int usage(void)
{
	fprintf(stderr, "usage: allreduce_peer --make-certs DIR N\n"
	                "       allreduce_peer --plan FILE --self I --certs DIR\n"
	                "       allreduce_peer --shares LEN MBIT...\n"
	                "       allreduce_peer --tcp-sink PORT\n"
	                "       allreduce_peer --tcp-source ADDR PORT MBYTES\n");
	return 2;
}

static int64_t realtime_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- Certificates ---- */

static int make_certs(const char *dir, int n)
{
	cot_errbuf eb = { 0 };
	pki_ca *ca = NULL;
	char path[4096], *ca_pem = NULL;
	if (n < 1 || n > ALLREDUCE_MAX_MEMBERS) {
		fprintf(stderr, "allreduce_peer: cannot make %d hosts (1..%d)\n", n, ALLREDUCE_MAX_MEMBERS);
		return 1;
	}
	if (mkdir(dir, 0700) && errno != EEXIST) {
		fprintf(stderr, "allreduce_peer: could not create \"%s\": %s\n", dir, strerror(errno));
		return 1;
	}
	if (pki_ca_create(PROJECT, 0, &ca, &eb) || pki_ca_cert_pem(ca, &ca_pem, &eb))
		goto fail;
	snprintf(path, sizeof path, "%s/ca.pem", dir);
	if (pki_write_file(path, ca_pem, strlen(ca_pem), 0644, &eb))
		goto fail;
	for (int i = 1; i <= n; i++) {
		char *key = NULL, *pub = NULL, *cert = NULL;
		cot_err rc = pki_host_key_generate(&key, &pub, &eb);
		if (!rc)
			rc = pki_ca_sign_host(ca, pub, strlen(pub), i, 0, 0, &cert, &eb);
		if (!rc) {
			snprintf(path, sizeof path, "%s/host%d.crt", dir, i);
			rc = pki_write_file(path, cert, strlen(cert), 0644, &eb);
		}
		if (!rc) {
			snprintf(path, sizeof path, "%s/host%d.key", dir, i);
			rc = pki_write_file(path, key, strlen(key), 0600, &eb);
		}
		free(key);
		free(pub);
		free(cert);
		if (rc)
			goto fail;
	}
	free(ca_pem);
	pki_ca_free(ca);
	return 0;
fail:
	fprintf(stderr, "allreduce_peer: could not make certificates: %s\n", eb.msg);
	free(ca_pem);
	pki_ca_free(ca);
	return 1;
}

static peer_ctx *load_ctx(const char *dir, int64_t host)
{
	cot_errbuf eb = { 0 };
	char path[4096];
	char *ca = NULL, *cert = NULL, *key = NULL;
	size_t ca_len = 0, cert_len = 0, key_len = 0;
	peer_ctx *ctx = NULL;
	snprintf(path, sizeof path, "%s/ca.pem", dir);
	cot_err rc = pki_read_file(path, &ca, &ca_len, &eb);
	if (!rc) {
		snprintf(path, sizeof path, "%s/host%lld.crt", dir, (long long)host);
		rc = pki_read_file(path, &cert, &cert_len, &eb);
	}
	if (!rc) {
		snprintf(path, sizeof path, "%s/host%lld.key", dir, (long long)host);
		rc = pki_read_file(path, &key, &key_len, &eb);
	}
	if (!rc) {
		peer_identity id = { PROJECT, ca, ca_len, cert, cert_len, key, key_len };
		rc = peer_ctx_new(&id, &ctx, &eb);
	}
	if (rc)
		fprintf(stderr, "allreduce_peer: could not load the identity of host %lld: %s\n",
		        (long long)host, eb.msg);
	free(ca);
	free(cert);
	free(key);
	return ctx;
}

/* ---- The plan ---- */

typedef struct {
	uint64_t len, seed;
	int comp;
	int64_t start_ms;
	int timeout_s;
	int verify;
	int sketch_k;
	allreduce_member m[ALLREDUCE_MAX_MEMBERS];
	char addr[ALLREDUCE_MAX_MEMBERS][DIALER_ADDR_MAX];
	size_t n;
} plan;

/* Read plan file path into *pl; 0 on success, else a message on stderr. */
static int read_plan(const char *path, plan *pl)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "allreduce_peer: could not open plan \"%s\": %s\n", path, strerror(errno));
		return 1;
	}
	memset(pl, 0, sizeof *pl);
	pl->timeout_s = 120;
	char line[512];
	int lineno = 0, bad = 0;
	while (!bad && fgets(line, sizeof line, f)) {
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		char key[32], a[128];
		unsigned long long u = 0;
		long long host = 0;
		unsigned port = 0;
		unsigned long long s = 0, e = 0, samples = 0;
		if (sscanf(line, "%31s", key) != 1)
			continue;
		if (!strcmp(key, "len") && sscanf(line, "%*s %llu", &u) == 1 && u >= 1 && u <= MAX_LEN)
			pl->len = u;
		else if (!strcmp(key, "seed") && sscanf(line, "%*s %llu", &u) == 1)
			pl->seed = u;
		else if (!strcmp(key, "start_ms") && sscanf(line, "%*s %llu", &u) == 1)
			pl->start_ms = (int64_t)u;
		else if (!strcmp(key, "timeout_s") && sscanf(line, "%*s %llu", &u) == 1 && u >= 1 &&
		         u <= 3600)
			pl->timeout_s = (int)u;
		else if (!strcmp(key, "verify") && sscanf(line, "%*s %llu", &u) == 1 && u <= 1)
			pl->verify = (int)u;
		else if (!strcmp(key, "sketch") && sscanf(line, "%*s %llu", &u) == 1 && u <= SKETCH_K_MAX)
			pl->sketch_k = (int)u;
		else if (!strcmp(key, "comp") && sscanf(line, "%*s %127s", a) == 1 &&
		         (!strcmp(a, "none") || !strcmp(a, "fp16") || !strcmp(a, "8bit")))
			pl->comp = !strcmp(a, "none")   ? COMP_NONE
			           : !strcmp(a, "fp16") ? COMP_FP16
			                                : COMP_BLOCK8;
		else if (!strcmp(key, "member") && pl->n < ALLREDUCE_MAX_MEMBERS &&
		         sscanf(line, "%*s %lld %63s %u %llu %llu %llu", &host, a, &port, &s, &e, &samples) ==
		                 6 &&
		         host > 0 && port > 0 && port < 65536) {
			snprintf(pl->addr[pl->n], sizeof pl->addr[pl->n], "%.63s", a);
			pl->m[pl->n] =
			        (allreduce_member){ host, pl->addr[pl->n], (uint16_t)port, s, e, samples };
			pl->n++;
		} else
			bad = 1;
	}
	fclose(f);
	if (bad) {
		fprintf(stderr, "allreduce_peer: plan \"%s\", line %d: not understood\n", path, lineno);
		return 1;
	}
	if (!pl->len || !pl->n) {
		fprintf(stderr, "allreduce_peer: plan \"%s\" has no len or no members\n", path);
		return 1;
	}
	return 0;
}

/* The gradient sum of host over len values: deterministic from (seed, host),
 * magnitudes about samples / 1000 so that no member is a norm outlier. */
static void fill_grad(float *g, size_t len, uint64_t seed, int64_t host, uint64_t samples)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)host * 0xD1B54A32D192ED03ull;
	if (!x)
		x = 1;
	double scale = (double)(samples ? samples : 1) * 1e-3;
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		g[i] = (float)(((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale);
	}
	if (!samples)
		memset(g, 0, len * sizeof *g);
}

static uint64_t fnv1a(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static int cmp_host(const void *a, const void *b)
{
	int64_t x = ((const allreduce_member *)a)->host_id, y = ((const allreduce_member *)b)->host_id;
	return x < y ? -1 : x > y;
}

/* Compare out with the sum of every member's gradient (ascending host id,
 * double, one rounding).  comp none: bit-exact; otherwise within a tolerance
 * of the wire encodings (relative to the largest magnitude).  Returns "ok",
 * "FAILED" or "skipped" (out of memory). */
static const char *verify(const plan *pl, const float *out)
{
	size_t len = (size_t)pl->len;
	allreduce_member *ms = malloc(pl->n * sizeof *ms);
	float **g = calloc(pl->n, sizeof *g), *sum = malloc(len * sizeof *sum);
	const char *verdict = "skipped";
	if (!ms || !g || !sum)
		goto out;
	memcpy(ms, pl->m, pl->n * sizeof *ms);
	qsort(ms, pl->n, sizeof *ms, cmp_host);
	for (size_t i = 0; i < pl->n; i++) {
		if (!(g[i] = malloc(len * sizeof(float))))
			goto out;
		fill_grad(g[i], len, pl->seed, ms[i].host_id, ms[i].samples);
	}
	allreduce_sum((const float *const *)g, pl->n, len, sum);
	verdict = "ok";
	if (pl->comp == COMP_NONE) {
		if (memcmp(sum, out, len * sizeof *sum))
			verdict = "FAILED";
	} else {
		double mx = 0;
		for (size_t i = 0; i < len; i++)
			mx = fmax(mx, fabs(sum[i]));
		double tol = (pl->comp == COMP_FP16 ? 2e-3 : 3e-2) * mx * (double)pl->n;
		for (size_t i = 0; i < len; i++)
			if (!(fabs((double)out[i] - sum[i]) <= tol)) {
				verdict = "FAILED";
				break;
			}
	}
out:
	for (size_t i = 0; g && i < pl->n; i++)
		free(g[i]);
	free(g);
	free(sum);
	free(ms);
	return verdict;
}

/* Milliseconds from a to b. */
static long long ms_between(const struct timeval *a, const struct timeval *b)
{
	return ((long long)b->tv_sec - a->tv_sec) * 1000 + ((long long)b->tv_usec - a->tv_usec) / 1000;
}

static int run_member(const char *plan_path, long self, const char *certs)
{
	static plan pl;
	if (read_plan(plan_path, &pl))
		return 1;
	if (self < 0 || (size_t)self >= pl.n) {
		fprintf(stderr, "allreduce_peer: --self %ld is not a member (0..%zu)\n", self, pl.n - 1);
		return 1;
	}
	const allreduce_member *me = &pl.m[self];
	peer_ctx *ctx = load_ctx(certs, me->host_id);
	if (!ctx)
		return 1;
	cot_errbuf eb = { 0 };
	listener *lst = NULL;
	dialer *d = NULL;
	size_t len = (size_t)pl.len;
	float *grad = malloc(len * sizeof *grad), *out = calloc(len, sizeof *out);
	int status = 1;
	if (!grad || !out) {
		fprintf(stderr, "allreduce_peer: out of memory for %zu values\n", len);
		goto done;
	}
	if (me->end > me->start && listener_open(me->addr, me->port, 0, &lst, &eb)) {
		fprintf(stderr, "allreduce_peer: could not listen on %s:%u: %s\n", me->addr,
		        (unsigned)me->port, eb.msg);
		goto done;
	}
	if (dialer_direct_new(&d, &eb)) {
		fprintf(stderr, "allreduce_peer: %s\n", eb.msg);
		goto done;
	}
	fill_grad(grad, len, pl.seed, me->host_id, me->samples);

	int64_t wait = pl.start_ms - realtime_ms();
	if (wait > 0) {
		struct timespec ts = { wait / 1000, (long)(wait % 1000) * 1000000L };
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	int64_t t0 = deadline_now_ms();
	allreduce_params p = {
		.members = pl.m,
		.n = pl.n,
		.self = (size_t)self,
		.round = 1,
		.grad = grad,
		.len = len,
		.send_comp = pl.comp,
		.result_comp = pl.comp,
		.ctx = ctx,
		.dialer = d,
		.lst = lst,
		.collect_deadline = t0 + (int64_t)pl.timeout_s * 1000,
		.deadline = t0 + (int64_t)pl.timeout_s * 1500,
		.sketch_seed = pl.seed,
		.sketch_k = pl.sketch_k,
	};
	allreduce_result res;
	struct rusage ru0, ru;
	getrusage(RUSAGE_SELF, &ru0);
	cot_err rc = allreduce_run(&p, out, &res, &eb);
	int64_t wall = deadline_now_ms() - t0;
	if (wait < 0)
		fprintf(stderr, "allreduce_peer: member %ld started %lld ms late\n", self, (long long)-wait);
	if (rc) {
		printf("member %ld host %lld wall_ms %lld FAILED %s\n", self, (long long)me->host_id,
		       (long long)wall, eb.msg);
		goto done;
	}
	getrusage(RUSAGE_SELF, &ru);
	printf("cpu %ld host %lld user_ms %lld sys_ms %lld\n", self, (long long)me->host_id,
	       ms_between(&ru0.ru_utime, &ru.ru_utime), ms_between(&ru0.ru_stime, &ru.ru_stime));
	const char *v = pl.verify ? verify(&pl, out) : "skipped";
	printf("member %ld host %lld wall_ms %lld checksum %016llx total_samples %llu included %zu "
	       "verify %s sketch_ms %.3f\n",
	       self, (long long)me->host_id, (long long)wall,
	       (unsigned long long)fnv1a(out, len * sizeof *out), (unsigned long long)res.total_samples,
	       res.n_included, v, res.sketch_s * 1000);
	allreduce_result_free(&res);
	status = strcmp(v, "FAILED") == 0;
done:
	fflush(stdout);
	dialer_free(d);
	listener_close(lst);
	peer_ctx_free(ctx);
	free(grad);
	free(out);
	return status;
}

/* ---- Shares ---- */

static int shares(int argc, char **argv)
{
	char *end;
	unsigned long long len = strtoull(argv[0], &end, 10);
	int n = argc - 1;
	if (*end || !len || len > MAX_LEN || n < 1 || n > ALLREDUCE_MAX_MEMBERS)
		return usage();
	lb_peer *peers = calloc((size_t)n, sizeof *peers);
	double *w = calloc((size_t)n, sizeof *w), tpv = 0;
	uint64_t *start = calloc((size_t)n + 1, sizeof *start);
	cot_errbuf eb = { 0 };
	int status = 1;
	if (!peers || !w || !start)
		goto out;
	for (int i = 0; i < n; i++) {
		peers[i].bandwidth = strtod(argv[i + 1], &end) * 1e6 / 8; /* bytes per second */
		peers[i].can_aggregate = true;
		if (*end) {
			fprintf(stderr, "allreduce_peer: bad bandwidth \"%s\"\n", argv[i + 1]);
			goto out;
		}
	}
	if (lb_shares(peers, n, w, &tpv, &eb)) {
		fprintf(stderr, "allreduce_peer: %s\n", eb.msg);
		goto out;
	}
	lb_split(w, n, len, start);
	for (int i = 0; i < n; i++)
		printf("peer %d mbit %s share %.6f start %llu end %llu\n", i, argv[i + 1], w[i],
		       (unsigned long long)start[i], (unsigned long long)start[i + 1]);
	printf("bound_s %.4f\n", tpv * (double)len * sizeof(float));
	status = 0;
out:
	free(peers);
	free(w);
	free(start);
	return status;
}

/* ---- Plain TCP, to check the shaping ---- */

static int tcp_sink(const char *port_s)
{
	int port = atoi(port_s);
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (s < 0 || port <= 0 || port > 65535 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1)) {
		fprintf(stderr, "allreduce_peer: could not listen on port %s: %s\n", port_s, strerror(errno));
		return 1;
	}
	int c = accept(s, NULL, NULL);
	if (c < 0) {
		fprintf(stderr, "allreduce_peer: accept: %s\n", strerror(errno));
		return 1;
	}
	static char buf[1 << 16];
	uint64_t total = 0;
	int64_t t0 = 0, t1 = 0;
	for (;;) {
		ssize_t k = read(c, buf, sizeof buf);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		t1 = deadline_now_ms();
		if (!total)
			t0 = t1;
		total += (uint64_t)k;
	}
	close(c);
	close(s);
	double secs = (double)(t1 - t0) / 1000.0;
	printf("tcp_bytes %llu tcp_s %.3f tcp_mbit %.2f\n", (unsigned long long)total, secs,
	       secs > 0 ? (double)total * 8 / secs / 1e6 : 0.0);
	return 0;
}

static int tcp_source(const char *addr, const char *port, const char *mbytes)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
		                  .ai_socktype = SOCK_STREAM,
		                  .ai_flags = AI_NUMERICHOST },
	                *ai = NULL;
	long mb = atol(mbytes);
	if (mb <= 0 || mb > 65536 || getaddrinfo(addr, port, &hints, &ai)) {
		fprintf(stderr, "allreduce_peer: bad target %s:%s or size %s\n", addr, port, mbytes);
		return 1;
	}
	int s = -1;
	for (int tries = 0; tries < 50; tries++) { /* the sink may not listen yet */
		s = socket(ai->ai_family, SOCK_STREAM, 0);
		if (s >= 0 && !connect(s, ai->ai_addr, ai->ai_addrlen))
			break;
		close(s);
		s = -1;
		usleep(100000);
	}
	freeaddrinfo(ai);
	if (s < 0) {
		fprintf(stderr, "allreduce_peer: could not connect to %s:%s\n", addr, port);
		return 1;
	}
	static char buf[1 << 16];
	memset(buf, 0x5a, sizeof buf);
	for (long i = 0; i < mb * 16; i++) {
		size_t off = 0;
		while (off < sizeof buf) {
			ssize_t k = write(s, buf + off, sizeof buf - off);
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0) {
				fprintf(stderr, "allreduce_peer: write: %s\n", strerror(errno));
				close(s);
				return 1;
			}
			off += (size_t)k;
		}
	}
	close(s);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "--make-certs"))
		return make_certs(argv[2], atoi(argv[3]));
	if (argc >= 4 && !strcmp(argv[1], "--shares"))
		return shares(argc - 2, argv + 2);
	if (argc == 3 && !strcmp(argv[1], "--tcp-sink"))
		return tcp_sink(argv[2]);
	if (argc == 5 && !strcmp(argv[1], "--tcp-source"))
		return tcp_source(argv[2], argv[3], argv[4]);
	if (argc == 7 && !strcmp(argv[1], "--plan") && !strcmp(argv[3], "--self") &&
	    !strcmp(argv[5], "--certs")) {
		char *end;
		long self = strtol(argv[4], &end, 10);
		if (*end)
			return usage();
		return run_member(argv[2], self, argv[6]);
	}
	return usage();
}
