/* cotrain-server: the project server.  Parses the command line, finds the
 * database (or starts the embedded one), refuses a schema mismatch, starts
 * the HTTP thread pool and the reaper, and on SIGINT/SIGTERM stops them in
 * reverse order. */
#include "config.h"

#include <errno.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/export_stats.h"
#include "server/heldout_eval.h"
#include "server/settings.h"
#include "server/dbconn.h"
#include "server/http.h"
#include "server/reaper.h"
#include "server/gc_timer.h"
#include "server/round_coord.h"
#include "server/relay.h"
#include "kernels/backend.h"
#include "shared/peer/pki.h"
#include "shared/database/db.h"
#include "shared/common/log.h"
#include "shared/common/options.h"
#include "shared/database/password.h"

/* Everything the command line sets: the settings the modules share, and
 * the few main keeps. */
typedef struct {
	srv_config cfg;
	relay_config relay;
	const char *data_dir, *db, *stats_dir;
	int stats_interval;
	int gc_interval;
	fgc_policy gc;
} server_cli;

static cot_err set_log_level(void *settings, const opt_spec *o, const char *arg, cot_errbuf *eb)
{
	(void)settings, (void)o, (void)eb;
	int lvl = cot_log_parse_level(arg);
	if (lvl < 0)
		return COT_ERR_INVALID;
	cot_log_set_level((cot_log_level)lvl);
	return COT_OK;
}

_Static_assert(PKI_HOST_LIFETIME_DEFAULT_S == 21600, "--cert-lifetime's default in the table below");

#define F(field) offsetof(server_cli, field)
static const opt_spec server_opts[] = {
	{ "data-dir", 0, OPT_STRING, F(data_dir), .metavar = "DIR",
	  .help = "data directory: files/ (the store) and pg/ (the embedded database); "
	          "default $COTRAIN_DATA_DIR or /var/lib/cotrain" },
	{ "db", 0, OPT_STRING, F(db), .metavar = "CONNINFO",
	  .help = "libpq connection string (default $COTRAIN_DB; without either, a private PostgreSQL "
	          "cluster in DIR/pg is started and stopped on exit)" },
	{ "listen", 0, OPT_STRING, F(cfg.listen), .def = "127.0.0.1", .metavar = "ADDR",
	  .help = "address to listen on" },
	{ "port", 0, OPT_INT, F(cfg.port), 0, 65535, .def = "8080", .metavar = "N",
	  .help = "TCP port; 0 picks a free one" },
	{ "threads", 0, OPT_INT, F(cfg.threads), 1, 256, .metavar = "N",
	  .help = "HTTP worker threads = database connections (default twice the CPUs, at least 4)" },
	{ "reap-interval", 0, OPT_INT, F(cfg.reap_interval), 1, 86400, .def = "10", .metavar = "S",
	  .help = "seconds between passes expiring overdue work units" },
	{ "kdf-iterations", 0, OPT_INT, F(cfg.kdf_iterations), PASSWORD_MIN_ITERATIONS,
	  PASSWORD_MAX_ITERATIONS, .def = OPT_STR(PASSWORD_DEFAULT_ITERATIONS), .metavar = "N",
	  .help = "PBKDF2 iterations for new passwords" },
	{ "wu-max", 0, OPT_LLONG, F(cfg.wu_max), 1, 1LL << 40, .def = "100000", .metavar = "N",
	  .help = "most microbatches in one work unit" },
	{ "pool-chunk", 0, OPT_LLONG, F(cfg.pool_chunk), 1, 1LL << 40, .def = "65536", .metavar = "N",
	  .help = "microbatches carved off the frontier at once" },
	{ "body-limit", 0, OPT_SIZE, F(cfg.body_limit), 1024, 64 << 20, .def = "65536", .metavar = "BYTES",
	  .help = "largest request body" },
	{ "cert-lifetime", 0, OPT_INT, F(cfg.cert_lifetime), PKI_HOST_LIFETIME_MIN_S, PKI_HOST_LIFETIME_MAX_S,
	  .def = "21600", .metavar = "S", .help = "lifetime of host certificates" },
	{ "round-interval", 0, OPT_INT, F(cfg.round_interval), 1, 3600, .def = "2", .metavar = "S",
	  .help = "seconds between the round coordinator's passes" },
	{ "round-report-timeout", 0, OPT_INT, F(cfg.round_report_timeout), 1, 86400, .def = "120",
	  .metavar = "S",
	  .help = "seconds after a round closes before hosts that have not reported are dropped" },
	{ "round-average-timeout", 0, OPT_INT, F(cfg.round_average_timeout), 1, 86400, .def = "600",
	  .metavar = "S", .help = "seconds from the plan to the outcomes' deadline" },
	{ "round-max-group", 0, OPT_INT, F(cfg.round_max_group), 2, 1024, .def = "16", .metavar = "N",
	  .help = "most peers in one averaging group" },
	{ "round-cross-peers", 0, OPT_FLAG, F(cfg.round_cross_peers),
	  .help = "average between the peers in every round, one or two peers' too: the server takes "
	          "the hash of the round's mean and one peer's checkpoint of v+1, never a gradient (by "
	          "default, every round of three peers or more does; doc/averaging.md)" },
	{ "round-server-mean", 0, OPT_FLAG, F(cfg.round_server_mean),
	  .help = "average through the server in every round, several groups' too: each group's members "
	          "upload its sum and download the server's mean (by default, a round of one or two peers "
	          "does)" },
	{ "round-close-fraction", 0, OPT_DOUBLE, F(cfg.round_close_fraction), .dmin = 0, .dmax = 1,
	  .min_open = true, .def = "0.9", .metavar = "F",
	  .help = "close a round early from this fraction of its target..." },
	{ "round-straggler-budget", 0, OPT_INT, F(cfg.round_straggler_budget), 0, 86400, .def = "60",
	  .metavar = "S",
	  .help = "...when filling the rest would take longer than S seconds at the live units' speed" },
	{ "relay-port", 0, OPT_INT, F(relay.port), 0, 65534, .def = "0", .metavar = "N",
	  .help = "the NAT service (rendezvous and relay, doc/nat.md) on TCP ports N and N+1; 0 is off" },
	{ "relay-listen", 0, OPT_STRING, F(relay.listen), .metavar = "ADDR",
	  .help = "its address (default: the --listen address)" },
	{ "relay-bandwidth", 0, OPT_U64, F(relay.bandwidth), 0, 1LL << 40, .def = "0", .metavar = "B",
	  .help = "relay cap per host, bytes/s each way; 0 is none" },
	{ "relay-idle", 0, OPT_INT, F(relay.idle_s), 1, 86400, .def = "60", .metavar = "S",
	  .help = "close a relay session idle for S seconds" },
	{ "stats-dir", 0, OPT_STRING, F(stats_dir), .metavar = "DIR",
	  .help = "write the BOINC-style statistics export there (doc/credit.md), at start and every "
	          "--stats-interval, and serve it under /stats/" },
	{ "stats-interval", 0, OPT_INT, F(stats_interval), 60, 86400 * 30, .def = "86400", .metavar = "S",
	  .help = "seconds between exports" },
	{ "gc-interval", 0, OPT_INT, F(gc_interval), 0, 86400 * 30, .def = "3600", .metavar = "S",
	  .help = "seconds between passes of the file store's collector (doc/design.md, \"Retention "
	          "and backup\"); 0 is off" },
	{ "gc-keep-last", 0, OPT_INT, F(gc.keep_last), 1, 1000000, .def = OPT_STR(FGC_KEEP_LAST_DEFAULT),
	  .metavar = "N", .help = "keep the checkpoints of each project's last N versions..." },
	{ "gc-keep-every", 0, OPT_INT, F(gc.keep_every), 0, 1000000, .def = OPT_STR(FGC_KEEP_EVERY_DEFAULT),
	  .metavar = "K",
	  .help = "...and of every Kth version (0: none), besides pinned ones and any a client or an "
	          "open spot check still needs" },
	{ "gc-grace", 0, OPT_INT, F(gc.grace_s), 0, 86400 * 30, .def = OPT_STR(FGC_GRACE_DEFAULT),
	  .metavar = "S", .help = "never collect a file stored less than S seconds ago" },
	{ "timeout", 0, OPT_INT, F(cfg.conn_timeout), 1, 86400, .def = "60", .metavar = "S",
	  .help = "idle connection timeout" },
	{ "per-ip-connections", 0, OPT_INT, F(cfg.per_ip_connections), 0, 4096, .def = "512", .metavar = "N",
	  .help = "open connections one address may hold at once; 0 is no cap (behind a reverse proxy, "
	          "which the server sees as one address)" },
	{ "auth-per-minute", 0, OPT_INT, F(cfg.auth_per_minute), 0, 100000, .def = "30", .metavar = "N",
	  .help = "log-ins and sign-ups one address may start a minute (each costs a password hash; 0 is "
	          "no cap)" },
	{ "log-level", 0, OPT_CALL, 0, .metavar = "L", .set = set_log_level,
	  .expect = "debug, info, warn or error", .help = "debug, info, warn or error (default info)" },
	{ "help", 0, OPT_HELP, .help = "show this help and exit" },
	{ "version", 0, OPT_VERSION, .help = "show the version and exit" },
	{ NULL }
};
#undef F

static const opt_program server_prog = {
	.prog = "cotrain-server",
	.synopsis = "[OPTION]...",
	.intro = "The cotrain project server: the v1 JSON API, the work-unit scheduler, the\n"
	         "round coordinator, the project CA and the file store, over PostgreSQL.\n",
	.outro = "Prints \"cotrain-server: listening on http://ADDR:PORT\" once it serves (on\n"
	         "stdout and on stderr).\n"
	         "Stops cleanly on SIGINT or SIGTERM.\n",
	.opts = server_opts,
};

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv); /* first: may re-exec with a faster BLAS core */
	cot_log_set_ident("cotrain-server");
	server_cli cli = {
		.cfg = { .threads = 0 },
		.relay = { .wait_s = 15, .max_sessions = 1024, .meet_lead_ms = 300, .dialback_ms = 1500 },
		.data_dir = getenv("COTRAIN_DATA_DIR"),
		.db = getenv("COTRAIN_DB"),
	};
	opt_result orc = opt_parse(&server_prog, argc, argv, &cli, NULL);
	if (orc)
		return orc == OPT_EXIT ? 0 : 2;
	srv_config cfg = cli.cfg;
	relay_config relay_cfg = cli.relay;
	if (cfg.round_cross_peers && cfg.round_server_mean) {
		fprintf(stderr, "cotrain-server: --round-cross-peers and --round-server-mean conflict\n");
		return 2;
	}
	const char *data_dir = cli.data_dir, *db = cli.db, *stats_dir = cli.stats_dir;
	int stats_interval = cli.stats_interval;
	if (db && !*db)
		db = NULL;
	cfg.stats_dir = stats_dir && *stats_dir ? stats_dir : NULL;
	if (cfg.threads == 0) {
		/* Workers block on their database round trip; with the database on
		 * the same machine more of them only add context switches (measured
		 * by tests/bench/bench-scheduler.sh). */
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		cfg.threads = ncpu > 2 ? (int)(2 * ncpu) : 4;
		if (cfg.threads > 64)
			cfg.threads = 64;
	}
	cfg.data_dir = data_dir && *data_dir ? data_dir : "/var/lib/cotrain";
	if (mkdir(cfg.data_dir, 0755) && errno != EEXIST) {
		log_error("could not create data directory \"%s\": %s", cfg.data_dir, strerror(errno));
		return 1;
	}
	int n = snprintf(cfg.files_dir, sizeof cfg.files_dir, "%s/files", cfg.data_dir);
	if (n < 0 || (size_t)n >= sizeof cfg.files_dir) {
		log_error("data directory path is too long");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);

	/* The database first: it may fork the embedded cluster, which must
	 * happen before any thread starts. */
	cot_errbuf eb = { 0 };
	db_target target = { 0 };
	if (db_resolve(cfg.data_dir, db, &target, &eb)) {
		log_error("%s", eb.msg);
		if (eb.hint[0])
			log_error("HINT: %s", eb.hint);
		return 1;
	}
	int rc = 1;
	http_server *http = NULL;
	reaper *rp = NULL;
	round_coord *coord = NULL;
	heval *evaluator = NULL;
	relay_service *relay = NULL;
	stats_timer *stats = NULL;
	gc_timer *gct = NULL;
	cfg.conninfo = target.conninfo;
	PGconn *conn = NULL;
	if (db_connect(cfg.conninfo, &conn, &eb) || db_schema_check(conn, &eb)) {
		log_error("%s", eb.msg);
		if (eb.hint[0])
			log_error("HINT: %s", eb.hint);
		PQfinish(conn);
		goto out;
	}
	PQfinish(conn);

	/* SIGINT and SIGTERM are taken by sigwait below; block them before any
	 * thread starts so that every thread inherits the mask. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);

	if (dbc_init(cfg.conninfo, &eb) || http_start(&cfg, &http, &eb) ||
	    reaper_start(cfg.conninfo, cfg.reap_interval, &rp, &eb) || round_coord_start(&cfg, &coord, &eb) ||
	    heval_start(&cfg, &evaluator, &eb) ||
	    (relay_cfg.port && (relay_cfg.listen = relay_cfg.listen ? relay_cfg.listen : cfg.listen,
	                        relay_start(&relay_cfg, &relay, &eb))) ||
	    (stats_dir && stats_timer_start(cfg.conninfo, stats_dir, stats_interval, &stats, &eb)) ||
	    (cli.gc_interval &&
	     gc_timer_start(cfg.conninfo, cfg.files_dir, &cli.gc, cli.gc_interval, &gct, &eb))) {
		log_error("%s", eb.msg);
		goto out;
	}
	int port = http_port(http);
	bool v6 = strchr(cfg.listen, ':') != NULL;
	/* The ready line, for scripts and tests to wait on: on stdout, and the
	 * same on stderr (whatever the log level), for those that only keep
	 * the log. */
	char ready[300];
	snprintf(ready, sizeof ready, "cotrain-server: listening on http://%s%s%s:%d\n", v6 ? "[" : "",
	         cfg.listen, v6 ? "]" : "", port);
	fputs(ready, stdout);
	fflush(stdout);
	fputs(ready, stderr);
	log_info("serving with %d threads; database %s", cfg.threads,
	         target.cluster ? "embedded" : "external");

	int sig = 0;
	sigwait(&sigs, &sig);
	log_info("received %s; stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
	rc = 0;
out:
	gc_timer_stop(gct);
	stats_timer_stop(stats);
	http_stop(http);
	relay_stop(relay);
	heval_stop(evaluator);
	round_coord_stop(coord);
	reaper_stop(rp);
	db_target_close(&target);
	return rc;
}
