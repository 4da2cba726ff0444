/* cotrain: private PostgreSQL clusters.
 *
 * The server's embedded default and the tests' throwaway databases both run a
 * PostgreSQL server of their own in a directory: initdb'd on first use,
 * listening only on a Unix socket inside that directory (no TCP), trust
 * authentication (only the directory's owner can reach the socket).
 *
 * A guardian process owns the postgres server.  It stops the server when
 * pgc_stop() is called *or* when the process that started it exits in any way
 * (exit, crash, SIGKILL): the guardian watches a pipe whose only writer is the
 * starting process.  For PGC_EPHEMERAL clusters the guardian also removes the
 * directory.  When run as root, initdb and postgres run as an unprivileged
 * user: $COTRAIN_PG_USER, else "postgres" when that user exists, else
 * "nobody"; the directory is chowned to that user.
 *
 * Call pgc_start() before starting threads (it forks). */
#ifndef COT_PGCLUSTER_H
#define COT_PGCLUSTER_H

#include <stdbool.h>
#include <stddef.h>

#include "shared/common/error.h"

typedef struct pgc_cluster pgc_cluster;

enum {
	PGC_EPHEMERAL = 1 << 0, /* no fsync; directory removed when stopped */
};

/* Start a cluster in `dir` (created and initdb'd when it holds no cluster
 * yet), on Unix-socket port `port` (0 picks one), and create database
 * `dbname` when missing.  Waits until the server accepts connections (at most
 * 60 s).  On success *out owns the running cluster; free it with pgc_stop().
 * On error nothing is left running and eb says why. */
cot_err pgc_start(const char *dir, int port, unsigned flags, const char *dbname, pgc_cluster **out,
                  cot_errbuf *eb);

/* libpq connection string of the cluster's database ("host=... port=...
 * dbname=... user=cotrain"); valid until pgc_stop(). */
const char *pgc_conninfo(const pgc_cluster *c);
const char *pgc_socket_dir(const pgc_cluster *c);
int pgc_port(const pgc_cluster *c);

/* Stop the server (fast shutdown), wait for it, remove the directory when
 * ephemeral, and free c.  NULL is a no-op. */
void pgc_stop(pgc_cluster *c);

/* When a cluster in `dir` is running and answering (for instance the running
 * server's embedded one), write a conninfo for database `dbname` into buf
 * and return true. */
bool pgc_running(const char *dir, const char *dbname, char *buf, size_t len);

/* Directory of initdb, postgres and pgbench: $COTRAIN_PG_BINDIR, else the
 * one configure found. */
const char *pgc_bindir(void);

#endif
