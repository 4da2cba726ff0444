/* cotrain tests: a small driver of the NAT ladder for the namespace test
 * and benchmark (tests/test_nat_netns.sh, tests/bench/bench-nat.sh).
 *
 *   nat_driver mkca DIR PROJECT        a test project CA in DIR/ca.pem, ca.key
 *   nat_driver line OPTS WORDS...      send one raw request line, print the answer
 *   nat_driver observe OPTS            register; prints "SEEN class mapping addr port port2"
 *   nat_driver accept OPTS --peer ID   open the listener, register, help the
 *                                      peer in (nat_acceptor), accept one TLS
 *                                      connection from it, receive --bytes,
 *                                      answer; prints "ACCEPTED plan=P bytes=N"
 *   nat_driver map OPTS --map LEASE    open the listener, map its port on the
 *                                      router (client/portmap.h), renew once,
 *                                      remove; prints "MAPPED method addr port
 *                                      ms=T", "RENEWED port", or on failure
 *                                      "NOMAP ms=T error" (exit 1)
 *   nat_driver dial OPTS --peer ID     open the listener, register, dial the
 *                                      peer through the ladder (--rung nat,
 *                                      punch, relay or direct), TLS, send
 *                                      --bytes; prints "RUNG r connect_ms=T
 *                                      mbit_s=R"
 * OPTS: --server ADDR --nat-port P --host ID --token T --listen-port L
 *       [--listen-addr A] [--mapped-port M] --project NAME --version V
 *       --ca-dir DIR [--target ADDR:PORT] [--seconds S] [--bytes N]
 *       [--map LEASE]: with observe, accept and dial, map the listener's port
 *       first (printing the MAPPED line), register with it as mapped_port,
 *       and remove the mapping at the end
 * Exit status 0 on success, 1 on failure (the reason on stderr). */
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/portmap.h"
#include "shared/common/deadline.h"
#include "shared/peer/frame.h"
#include "shared/peer/listener.h"
#include "shared/common/log.h"
#include "shared/nat/nat.h"
#include "shared/peer/peer.h"
#include "shared/peer/pki.h"

#define CHUNK (1u << 20)

static nat_config cfg = { .listen_addr = "0.0.0.0" };
static const char *project = "nattest", *ca_dir = NULL, *target = NULL, *rung = "nat";
static int64_t version = 0, peer_id = 0;
static int seconds = 30, map_lease = 0;
static long long nbytes = 1 << 20;

static int fail(const char *what, const cot_errbuf *eb)
{
	fprintf(stderr, "nat_driver: %s: %s\n", what, eb->msg);
	return 1;
}

static int mkca(const char *dir, const char *proj)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	pki_ca *ca = NULL;
	char c[4096], k[4096];
	snprintf(c, sizeof c, "%s/ca.pem", dir);
	snprintf(k, sizeof k, "%s/ca.key", dir);
	if (pki_ca_create(proj, 0, &ca, &eb) || pki_ca_save(ca, c, k, &eb))
		return fail("could not make the CA", &eb);
	pki_ca_free(ca);
	return 0;
}

/* This host's TLS identity, signed here by the test CA. */
static peer_ctx *identity(void)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	pki_ca *ca = NULL;
	char c[4096], k[4096], *key = NULL, *pub = NULL, *cert = NULL, *ca_pem = NULL;
	snprintf(c, sizeof c, "%s/ca.pem", ca_dir);
	snprintf(k, sizeof k, "%s/ca.key", ca_dir);
	peer_ctx *ctx = NULL;
	if (pki_ca_load(c, k, &ca, &eb) || pki_ca_cert_pem(ca, &ca_pem, &eb) ||
	    pki_host_key_generate(&key, &pub, &eb) ||
	    pki_ca_sign_host(ca, pub, strlen(pub), cfg.host_id, 0, 0, &cert, &eb)) {
		fail("could not make the identity", &eb);
	} else {
		peer_identity pi = { pki_ca_project(ca), ca_pem, strlen(ca_pem), cert,
			             strlen(cert),       key,    strlen(key) };
		if (peer_ctx_new(&pi, &ctx, &eb))
			fail("could not make the TLS context", &eb);
	}
	free(key);
	free(pub);
	free(cert);
	free(ca_pem);
	pki_ca_free(ca);
	return ctx;
}

static int observe(int64_t deadline)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	nat_observation o;
	if (nat_observe(&cfg, deadline, &o, &eb))
		return fail("could not register with the NAT service", &eb);
	printf("SEEN %s %s %s %u %u\n", o.klass, o.mapping, o.addr, o.port, o.port2);
	fflush(stdout);
	return 0;
}

/* --rung relay on the accepting side: join the relay at once and bridge it
 * to our listener (what nat_acceptor does when the plan is relay). */
static volatile int relay_stop;
static pthread_t relay_th;
static void *relay_main(void *arg)
{
	(void)arg;
	cot_errbuf eb = { { 0 }, { 0 } };
	int64_t deadline = deadline_after_ms(seconds * 1000LL);
	int rfd = -1, lfd;
	if (nat_relay_join(&cfg, project, version, peer_id, false, deadline, &relay_stop, &rfd, &eb)) {
		fail("could not join the relay", &eb);
		return NULL;
	}
	lfd = nat_plain_connect("127.0.0.1", cfg.listen_port, &eb);
	if (lfd >= 0 && !nat_connect_wait(lfd, "127.0.0.1", cfg.listen_port, deadline, &eb))
		nat_bridge(rfd, lfd, deadline, &relay_stop);
	if (lfd >= 0)
		close(lfd);
	close(rfd);
	return NULL;
}

static int do_accept(listener *l, peer_ctx *ctx, int64_t deadline)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	nat_acceptor *a = NULL;
	bool relay_only = strcmp(rung, "relay") == 0;
	if (relay_only ? pthread_create(&relay_th, NULL, relay_main, NULL) != 0
	               : nat_acceptor_start(&cfg, project, version, &peer_id, 1, deadline, &a, &eb) != 0)
		return fail("could not start the acceptor", &eb);
	int rc = 1;
	peer_conn *pc = NULL;
	for (;;) {
		int fd;
		char from[LISTENER_ADDR_MAX];
		if (listener_accept(l, deadline, &fd, from, &eb)) {
			fail("no connection from the peer", &eb);
			break;
		}
		/* Anything else (the server's dial-back) fails the handshake. */
		if (peer_handshake(ctx, fd, PEER_SERVER, peer_id, deadline, &pc, &eb) == COT_OK)
			break;
		fprintf(stderr, "nat_driver: refused a connection from %s: %s\n", from, eb.msg);
	}
	if (pc) {
		long long got = 0;
		while (got < nbytes) {
			frame_header h;
			unsigned char *p = NULL;
			if (peer_recv_frame(pc, &h, &p, deadline, &eb)) {
				fail("could not receive", &eb);
				break;
			}
			got += h.length;
			free(p);
		}
		if (got >= nbytes && !peer_send_frame(pc, FRAME_READY, 0, NULL, 0, deadline, &eb)) {
			printf("ACCEPTED plan=%s bytes=%lld rung=%s\n", a ? nat_acceptor_plan(a, 0) : "relay",
			       got, a ? nat_acceptor_rung(a, 0) : "relay");
			rc = 0;
		}
		peer_close(pc);
	}
	if (relay_only) {
		relay_stop = 1;
		pthread_join(relay_th, NULL);
	}
	nat_acceptor_stop(a);
	return rc;
}

static int do_dial(peer_ctx *ctx, int64_t deadline)
{
	cot_errbuf eb = { { 0 }, { 0 } };
	dialer *d = NULL;
	cot_err e = strcmp(rung, "punch") == 0    ? dialer_punch_new(&cfg, project, version, &d, &eb)
	            : strcmp(rung, "relay") == 0  ? dialer_relay_new(&cfg, project, version, &d, &eb)
	            : strcmp(rung, "direct") == 0 ? dialer_direct_new(&d, &eb)
	                                          : nat_dialer_new(&cfg, project, version, &d, &eb);
	if (e)
		return fail("could not make the dialer", &eb);
	char addr[64] = "0.0.0.0";
	unsigned port = 1;
	if (target && sscanf(target, "%63[^:]:%u", addr, &port) != 2)
		return fprintf(stderr, "nat_driver: bad --target\n"), 1;
	dialer_target t = { addr, (uint16_t)port, peer_id };
	dialer_result res;
	int64_t t0 = deadline_now_ms();
	if (dialer_connect(d, &t, deadline, &res, &eb)) {
		dialer_free(d);
		return fail("could not connect", &eb);
	}
	int64_t t1 = deadline_now_ms();
	peer_conn *pc = NULL;
	int rc = 1;
	unsigned char *buf = calloc(1, CHUNK);
	if (peer_handshake(ctx, res.fd, PEER_CLIENT, peer_id, deadline, &pc, &eb)) {
		fail("TLS handshake failed", &eb);
	} else if (buf) {
		int64_t t2 = deadline_now_ms();
		long long sent = 0;
		while (sent < nbytes) {
			size_t n = nbytes - sent < CHUNK ? (size_t)(nbytes - sent) : CHUNK;
			if (peer_send_frame(pc, FRAME_SLICE, 0, buf, n, deadline, &eb))
				break;
			sent += (long long)n;
		}
		frame_header h;
		unsigned char *p = NULL;
		if (sent < nbytes) {
			fail("could not send", &eb);
		} else if (peer_recv_frame(pc, &h, &p, deadline, &eb) || h.type != FRAME_READY) {
			fail("no acknowledgement", &eb);
		} else {
			double s = (double)(deadline_now_ms() - t2) / 1000.0;
			printf("RUNG %s connect_ms=%lld mbit_s=%.1f plan=%s\n", res.rung,
			       (long long)(t1 - t0), s > 0 ? (double)sent * 8 / 1e6 / s : 0.0,
			       res.plan ? res.plan : "-");
			rc = 0;
		}
		free(p);
	}
	free(buf);
	peer_close(pc);
	dialer_free(d);
	return rc;
}

int main(int argc, char **argv)
{
	cot_log_set_ident("nat_driver");
	if (argc >= 4 && strcmp(argv[1], "mkca") == 0)
		return mkca(argv[2], argv[3]);
	if (argc < 2) {
		fprintf(stderr, "usage: nat_driver mkca|observe|accept|dial OPTS\n");
		return 2;
	}
	const char *cmd = argv[1];
	static const struct option opts[] = { { "server", 1, NULL, 's' },
		                              { "nat-port", 1, NULL, 'P' },
		                              { "host", 1, NULL, 'h' },
		                              { "token", 1, NULL, 't' },
		                              { "listen-port", 1, NULL, 'l' },
		                              { "listen-addr", 1, NULL, 'L' },
		                              { "mapped-port", 1, NULL, 'm' },
		                              { "project", 1, NULL, 'p' },
		                              { "version", 1, NULL, 'v' },
		                              { "peer", 1, NULL, 'r' },
		                              { "ca-dir", 1, NULL, 'c' },
		                              { "target", 1, NULL, 'T' },
		                              { "seconds", 1, NULL, 'S' },
		                              { "bytes", 1, NULL, 'b' },
		                              { "rung", 1, NULL, 'R' },
		                              { "map", 1, NULL, 'M' },
		                              { NULL, 0, NULL, 0 } };
	int c;
	optind = 2;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			cfg.server_addr = optarg;
			break;
		case 'P':
			cfg.server_port = (uint16_t)atoi(optarg);
			break;
		case 'h':
			cfg.host_id = atoll(optarg);
			break;
		case 't':
			cfg.token = optarg;
			break;
		case 'l':
			cfg.listen_port = (uint16_t)atoi(optarg);
			break;
		case 'L':
			cfg.listen_addr = optarg;
			break;
		case 'm':
			cfg.mapped_port = (uint16_t)atoi(optarg);
			break;
		case 'p':
			project = optarg;
			break;
		case 'v':
			version = atoll(optarg);
			break;
		case 'r':
			peer_id = atoll(optarg);
			break;
		case 'c':
			ca_dir = optarg;
			break;
		case 'T':
			target = optarg;
			break;
		case 'S':
			seconds = atoi(optarg);
			break;
		case 'b':
			nbytes = atoll(optarg);
			break;
		case 'R':
			rung = optarg;
			break;
		case 'M':
			map_lease = atoi(optarg);
			break;
		default:
			return 2;
		}
	}
	if (!cfg.server_addr || !cfg.server_port || !cfg.host_id || !cfg.token) {
		fprintf(stderr, "nat_driver: --server, --nat-port, --host and --token are needed\n");
		return 2;
	}
	int64_t deadline = deadline_after_ms(seconds * 1000LL);
	cot_errbuf eb = { { 0 }, { 0 } };
	if (strcmp(cmd, "line") == 0) {
		/* One raw request line (the rest of the arguments); prints the answer. */
		char line[NAT_LINE_MAX * 4] = "", reply[NAT_LINE_MAX] = "";
		for (int i = optind; i < argc; i++)
			snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s",
			         i > optind ? " " : "", argv[i]);
		(void)nat_request(&cfg, 0, NULL, line, deadline, NULL, reply, NULL, &eb);
		printf("%s\n", reply[0] ? reply : eb.msg);
		return 0;
	}
	listener *l = NULL;
	if (listener_open(cfg.listen_addr, cfg.listen_port, 0, &l, &eb))
		return fail("could not listen", &eb);
	cfg.listen_port = listener_port(l);
	cl_portmap *pm = NULL;
	if (map_lease > 0 || strcmp(cmd, "map") == 0) {
		int64_t t0 = deadline_now_ms();
		if (cl_portmap_open(strcmp(cfg.listen_addr, "0.0.0.0") ? cfg.listen_addr : NULL,
		                    cfg.listen_port, map_lease > 0 ? map_lease : 60, &pm, &eb)) {
			printf("NOMAP ms=%lld %s\n", (long long)(deadline_now_ms() - t0), eb.msg);
			fprintf(stderr, "nat_driver: hint: %s\n", eb.hint);
			listener_close(l);
			return 1;
		}
		char ea[64];
		uint16_t ep;
		cl_portmap_external(pm, ea, &ep);
		printf("MAPPED %s %s %u ms=%lld\n", cl_portmap_method(pm), ea[0] ? ea : "-", ep,
		       (long long)(deadline_now_ms() - t0));
		fflush(stdout);
		cfg.mapped_port = ep;
		if (strcmp(cmd, "map") == 0) {
			int rc = 0;
			if (cl_portmap_renew(pm, &eb))
				rc = fail("could not renew", &eb);
			else
				printf("RENEWED %u\n", ep);
			cl_portmap_close(pm);
			listener_close(l);
			return rc;
		}
	}
	int rc = observe(deadline);
	if (rc == 0 && strcmp(cmd, "observe") != 0) {
		if (!ca_dir || !peer_id) {
			fprintf(stderr, "nat_driver: --ca-dir and --peer are needed\n");
			rc = 2;
		} else {
			peer_ctx *ctx = identity();
			if (!ctx)
				rc = 1;
			else if (strcmp(cmd, "accept") == 0)
				rc = do_accept(l, ctx, deadline);
			else if (strcmp(cmd, "dial") == 0)
				rc = do_dial(ctx, deadline);
			else
				rc = 2;
			peer_ctx_free(ctx);
		}
	}
	cl_portmap_close(pm);
	listener_close(l);
	return rc;
}
