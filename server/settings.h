/* cotrain-server: settings from the command line, shared read-only by every
 * module once the server has started. */
#ifndef COT_SERVER_SETTINGS_H
#define COT_SERVER_SETTINGS_H

#include <stddef.h>

typedef struct {
	const char *data_dir;      /* holds files/ (the store) and pg/ (embedded db) */
	const char *stats_dir;     /* the statistics export, served under /stats/; NULL: none */
	char files_dir[4096];      /* <data_dir>/files */
	const char *conninfo;      /* libpq conninfo, resolved before start */
	const char *listen;        /* address to bind, "127.0.0.1" by default */
	int port;                  /* 0 picks a free one */
	int threads;               /* MHD thread pool size = database connections */
	int reap_interval;         /* seconds between reaper passes */
	int kdf_iterations;        /* PBKDF2 iterations for new passwords */
	size_t body_limit;         /* largest request body accepted, bytes */
	int conn_timeout;          /* idle connection timeout, seconds */
	int per_ip_connections;    /* open connections from one address at most; 0: no cap */
	int auth_per_minute;       /* log-ins and sign-ups per address and minute (and burst); 0: no cap */
	long long wu_max;          /* most microbatches in one work unit */
	long long pool_chunk;      /* microbatches carved off the frontier at once */
	int cert_lifetime;         /* host certificates, seconds */
	int round_interval;        /* seconds between the round coordinator's passes */
	int round_report_timeout;  /* seconds after closing before non-reporters are dropped */
	int round_average_timeout; /* seconds from the plan to the outcomes' deadline */
	int round_max_group;       /* most peers in one averaging group */
	/* Where a round averages across its groups (doc/averaging.md, "Across
	 * groups"): between the peers (no gradient reaches the server) in every
	 * round with round_cross_peers, through the server in every round with
	 * round_server_mean, else between the peers when the plan has three
	 * peers or more and through the server when it has one or two (the
	 * server then sketches a lone peer's bytes itself, and its own v+1
	 * tells which of two disagreeing peers is right). */
	int round_cross_peers;
	int round_server_mean;
	double round_close_fraction; /* straggler rule: close from this share of the target... */
	int round_straggler_budget;  /* ...when filling the rest would take longer (s) */
} srv_config;

#endif
