/* cotrain-server: the project server.  Parses the command line, finds the
 * database (or starts the embedded one), refuses a schema mismatch, starts
 * the HTTP thread pool and the reaper, and on SIGINT/SIGTERM stops them in
 * reverse order. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/export_stats.h"
#include "server/settings.h"
#include "server/dbconn.h"
#include "server/http.h"
#include "server/reaper.h"
#include "server/round_coord.h"
#include "server/relay.h"
#include "kernels/backend.h"
#include "shared/peer/pki.h"
#include "shared/database/db.h"
#include "shared/common/log.h"
#include "shared/database/password.h"

static void usage(FILE *f)
{
	fprintf(f,
"Usage: cotrain-server [OPTION]...\n"
"The cotrain project server: the v1 JSON API, the work-unit scheduler, the\n"
"round coordinator, the project CA and the file store, over PostgreSQL.\n"
"\n"
"  --data-dir DIR        data directory: files/ (the store) and pg/ (the embedded\n"
"                        database); default $COTRAIN_DATA_DIR or /var/lib/cotrain\n"
"  --db CONNINFO         libpq connection string (default $COTRAIN_DB; without\n"
"                        either, a private PostgreSQL cluster in DIR/pg is started\n"
"                        and stopped on exit)\n"
"  --listen ADDR         address to listen on (default 127.0.0.1)\n"
"  --port N              TCP port (default 8080; 0 picks a free one)\n"
"  --threads N           HTTP worker threads = database connections (default\n"
"                        twice the CPUs, at least 4)\n"
"  --reap-interval S     seconds between passes expiring overdue work units\n"
"                        (default 10)\n"
"  --kdf-iterations N    PBKDF2 iterations for new passwords (default %d)\n"
"  --wu-max N            most microbatches in one work unit (default 100000)\n"
"  --pool-chunk N        microbatches carved off the frontier at once\n"
"                        (default 65536)\n"
"  --body-limit BYTES    largest request body (default 65536)\n"
"  --cert-lifetime S     lifetime of host certificates (default 21600)\n"
"  --round-interval S    seconds between the round coordinator's passes\n"
"                        (default 2)\n"
"  --round-report-timeout S  seconds after a round closes before hosts that\n"
"                        have not reported are dropped (default 120)\n"
"  --round-average-timeout S  seconds from the plan to the outcomes' deadline\n"
"                        (default 600)\n"
"  --round-max-group N   most peers in one averaging group (default 16)\n"
"  --round-close-fraction F  close a round early from this fraction of its\n"
"                        target (default 0.9)...\n"
"  --round-straggler-budget S  ...when filling the rest would take longer\n"
"                        than S seconds at the live units' speed (default 60)\n"
"  --relay-port N        the NAT service (rendezvous and relay, doc/nat.md) on\n"
"                        TCP ports N and N+1 (default 0: off)\n"
"  --relay-listen ADDR   its address (default: the --listen address)\n"
"  --relay-bandwidth B   relay cap per host, bytes/s each way (default 0: none)\n"
"  --relay-idle S        close a relay session idle for S seconds (default 60)\n"
"  --stats-dir DIR       write the BOINC-style statistics export there\n"
"                        (doc/credit.md), at start and every --stats-interval\n"
"  --stats-interval S    seconds between exports (default 86400)\n"
"  --timeout S           idle connection timeout (default 60)\n"
"  --log-level L         debug, info, warn or error (default info)\n"
"  --help                show this help and exit\n"
"\n"
"Prints \"cotrain-server: listening on http://ADDR:PORT\" once it serves (on\n"
"stdout and on stderr).\n"
"Stops cleanly on SIGINT or SIGTERM.\n", PASSWORD_DEFAULT_ITERATIONS);
}

/* Parse a decimal integer option in [min, max]; exits with a message. */
static long long int_opt(const char *name, const char *s, long long min, long long max)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max) {
		fprintf(stderr, "cotrain-server: invalid value \"%s\" for --%s (want %lld to %lld)\n",
		        s, name, min, max);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv);  /* first: may re-exec with a faster BLAS core */
	srv_config cfg = {
		.listen = "127.0.0.1", .port = 8080, .threads = 0, .reap_interval = 10,
		.kdf_iterations = PASSWORD_DEFAULT_ITERATIONS, .body_limit = 65536,
		.conn_timeout = 60, .wu_max = 100000, .pool_chunk = 65536,
		.cert_lifetime = PKI_HOST_LIFETIME_DEFAULT_S, .round_interval = 2,
		.round_report_timeout = 120, .round_average_timeout = 600, .round_max_group = 16,
		.round_close_fraction = 0.9, .round_straggler_budget = 60,
	};
	const char *data_dir = getenv("COTRAIN_DATA_DIR");
	const char *db = getenv("COTRAIN_DB");
	enum { O_DATA = 256, O_DB, O_LISTEN, O_PORT, O_THREADS, O_REAP, O_KDF, O_WUMAX, O_CHUNK,
	       O_BODY, O_TIMEOUT, O_LOG, O_HELP, O_CERT, O_RINT, O_RREP, O_RAVG, O_RGRP, O_RFRAC,
	       O_RBUDGET, O_RELAY_PORT, O_RELAY_LISTEN, O_RELAY_BW, O_RELAY_IDLE, O_STATS_DIR, O_STATS_INT };
	const char *stats_dir = NULL;
	int stats_interval = 86400;
	relay_config relay_cfg = { .listen = NULL, .port = 0, .bandwidth = 0, .idle_s = 60,
	                           .wait_s = 15, .max_sessions = 1024, .meet_lead_ms = 300,
	                           .dialback_ms = 1500 };
	static const struct option opts[] = {
		{ "data-dir", required_argument, NULL, O_DATA },
		{ "db", required_argument, NULL, O_DB },
		{ "listen", required_argument, NULL, O_LISTEN },
		{ "port", required_argument, NULL, O_PORT },
		{ "threads", required_argument, NULL, O_THREADS },
		{ "reap-interval", required_argument, NULL, O_REAP },
		{ "kdf-iterations", required_argument, NULL, O_KDF },
		{ "wu-max", required_argument, NULL, O_WUMAX },
		{ "pool-chunk", required_argument, NULL, O_CHUNK },
		{ "body-limit", required_argument, NULL, O_BODY },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "log-level", required_argument, NULL, O_LOG },
		{ "help", no_argument, NULL, O_HELP },
		{ "cert-lifetime", required_argument, NULL, O_CERT },
		{ "round-interval", required_argument, NULL, O_RINT },
		{ "round-report-timeout", required_argument, NULL, O_RREP },
		{ "round-average-timeout", required_argument, NULL, O_RAVG },
		{ "round-max-group", required_argument, NULL, O_RGRP },
		{ "round-close-fraction", required_argument, NULL, O_RFRAC },
		{ "round-straggler-budget", required_argument, NULL, O_RBUDGET },
		{ "relay-port", required_argument, NULL, O_RELAY_PORT },
		{ "relay-listen", required_argument, NULL, O_RELAY_LISTEN },
		{ "relay-bandwidth", required_argument, NULL, O_RELAY_BW },
		{ "relay-idle", required_argument, NULL, O_RELAY_IDLE },
		{ "stats-dir", required_argument, NULL, O_STATS_DIR },
		{ "stats-interval", required_argument, NULL, O_STATS_INT },
		{ NULL, 0, NULL, 0 }
	};
	cot_log_set_ident("cotrain-server");
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case O_DATA: data_dir = optarg; break;
		case O_DB: db = optarg; break;
		case O_LISTEN: cfg.listen = optarg; break;
		case O_PORT: cfg.port = (int)int_opt("port", optarg, 0, 65535); break;
		case O_THREADS: cfg.threads = (int)int_opt("threads", optarg, 1, 256); break;
		case O_REAP: cfg.reap_interval = (int)int_opt("reap-interval", optarg, 1, 86400); break;
		case O_KDF:
			cfg.kdf_iterations = (int)int_opt("kdf-iterations", optarg, PASSWORD_MIN_ITERATIONS,
			                                  PASSWORD_MAX_ITERATIONS);
			break;
		case O_WUMAX: cfg.wu_max = int_opt("wu-max", optarg, 1, 1LL << 40); break;
		case O_CHUNK: cfg.pool_chunk = int_opt("pool-chunk", optarg, 1, 1LL << 40); break;
		case O_BODY: cfg.body_limit = (size_t)int_opt("body-limit", optarg, 1024, 64 << 20); break;
		case O_TIMEOUT: cfg.conn_timeout = (int)int_opt("timeout", optarg, 1, 86400); break;
		case O_LOG: {
			int lvl = cot_log_parse_level(optarg);
			if (lvl < 0) {
				fprintf(stderr, "cotrain-server: invalid log level \"%s\"\n", optarg);
				return 2;
			}
			cot_log_set_level((cot_log_level)lvl);
			break;
		}
		case O_CERT:
			cfg.cert_lifetime = (int)int_opt("cert-lifetime", optarg, PKI_HOST_LIFETIME_MIN_S,
			                                 PKI_HOST_LIFETIME_MAX_S);
			break;
		case O_RINT: cfg.round_interval = (int)int_opt("round-interval", optarg, 1, 3600); break;
		case O_RREP:
			cfg.round_report_timeout = (int)int_opt("round-report-timeout", optarg, 1, 86400);
			break;
		case O_RAVG:
			cfg.round_average_timeout = (int)int_opt("round-average-timeout", optarg, 1, 86400);
			break;
		case O_RGRP: cfg.round_max_group = (int)int_opt("round-max-group", optarg, 2, 1024); break;
		case O_RFRAC: {
			char *end;
			errno = 0;
			double f = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(f > 0 && f <= 1)) {
				fprintf(stderr, "cotrain-server: invalid value \"%s\" for --round-close-fraction"
				        " (want more than 0, at most 1)\n", optarg);
				return 2;
			}
			cfg.round_close_fraction = f;
			break;
		}
		case O_RBUDGET:
			cfg.round_straggler_budget = (int)int_opt("round-straggler-budget", optarg, 0, 86400);
			break;
		case O_RELAY_PORT: relay_cfg.port = (int)int_opt("relay-port", optarg, 0, 65534); break;
		case O_RELAY_LISTEN: relay_cfg.listen = optarg; break;
		case O_RELAY_BW:
			relay_cfg.bandwidth = (uint64_t)int_opt("relay-bandwidth", optarg, 0, 1LL << 40);
			break;
		case O_RELAY_IDLE: relay_cfg.idle_s = (int)int_opt("relay-idle", optarg, 1, 86400); break;
		case O_STATS_DIR: stats_dir = optarg; break;
		case O_STATS_INT: stats_interval = (int)int_opt("stats-interval", optarg, 60, 86400 * 30); break;
		case O_HELP: usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "cotrain-server: unexpected argument \"%s\"\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (db && !*db)
		db = NULL;
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
	relay_service *relay = NULL;
	stats_timer *stats = NULL;
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
	    reaper_start(cfg.reap_interval, &rp, &eb) || round_coord_start(&cfg, &coord, &eb) ||
	    (relay_cfg.port && (relay_cfg.listen = relay_cfg.listen ? relay_cfg.listen : cfg.listen,
	                        relay_start(&relay_cfg, &relay, &eb))) ||
	    (stats_dir && stats_timer_start(cfg.conninfo, stats_dir, stats_interval, &stats, &eb))) {
		log_error("%s", eb.msg);
		goto out;
	}
	int port = http_port(http);
	bool v6 = strchr(cfg.listen, ':') != NULL;
	/* The ready line, for scripts and tests to wait on: on stdout, and the
	 * same on stderr (whatever the log level), for those that only keep
	 * the log. */
	char ready[300];
	snprintf(ready, sizeof ready, "cotrain-server: listening on http://%s%s%s:%d\n",
	         v6 ? "[" : "", cfg.listen, v6 ? "]" : "", port);
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
	stats_timer_stop(stats);
	http_stop(http);
	relay_stop(relay);
	round_coord_stop(coord);
	reaper_stop(rp);
	db_target_close(&target);
	return rc;
}
