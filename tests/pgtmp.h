/* cotrain tests: a throwaway PostgreSQL.
 *
 * pgtmp_start() initdb's a cluster in a fresh temporary directory (as an
 * unprivileged user when run as root), starts it on a Unix socket in that
 * directory with its own port, and returns its libpq conninfo.  The cluster
 * is stopped and the directory removed on every exit path: normal exit
 * (atexit), pgtmp_stop(), or a crash or kill of the test (the cluster's
 * guardian process notices its starter is gone).  Bails out (TAP) when it
 * cannot start. */
#ifndef COT_TESTS_PGTMP_H
#define COT_TESTS_PGTMP_H

const char *pgtmp_start(void);
const char *pgtmp_conninfo(void);
const char *pgtmp_socket_dir(void);
int pgtmp_port(void);
void pgtmp_stop(void);

#endif
