/* cotrain-server: settings from the command line, shared read-only by every
 * module once the server has started. */
#ifndef COT_SERVER_SETTINGS_H
#define COT_SERVER_SETTINGS_H

#include <stddef.h>

typedef struct {
	const char *data_dir;      /* holds files/ (the store) and pg/ (embedded db) */
	char files_dir[4096];      /* <data_dir>/files */
	const char *conninfo;      /* libpq conninfo, resolved before start */
	const char *listen;        /* address to bind, "127.0.0.1" by default */
	int port;                  /* 0 picks a free one */
	int threads;               /* MHD thread pool size = database connections */
	int reap_interval;         /* seconds between reaper passes */
	int kdf_iterations;        /* PBKDF2 iterations for new passwords */
	size_t body_limit;         /* largest request body accepted, bytes */
	int conn_timeout;          /* idle connection timeout, seconds */
	long long wu_max;          /* most microbatches in one work unit */
	long long pool_chunk;      /* microbatches carved off the frontier at once */
} srv_config;

#endif
