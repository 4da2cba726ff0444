/* cotrain tests: run a command beside a throwaway PostgreSQL.
 *
 *   with-pgtmp COMMAND [ARG...]
 *
 * Starts a throwaway cluster (see tests/pgtmp.h), runs COMMAND with
 * COTRAIN_DB (a libpq conninfo) and PGHOST, PGPORT, PGDATABASE, PGUSER set,
 * then stops the cluster and removes it.  Exits with COMMAND's status. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shared/database/pgcluster.h"

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "--help") == 0) {
		fprintf(stderr, "usage: with-pgtmp COMMAND [ARG...]\n");
		return 2;
	}
	char dir[] = "/tmp/cotrain-pg-XXXXXX";
	if (!mkdtemp(dir)) {
		perror("with-pgtmp: could not create a temporary directory");
		return 1;
	}
	pgc_cluster *c;
	cot_errbuf eb = { "", "" };
	if (pgc_start(dir, 0, PGC_EPHEMERAL, "cotrain", &c, &eb)) {
		fprintf(stderr, "with-pgtmp: %s\n", eb.msg);
		rmdir(dir);
		return 1;
	}
	char port[16];
	snprintf(port, sizeof port, "%d", pgc_port(c));
	setenv("COTRAIN_DB", pgc_conninfo(c), 1);
	setenv("PGHOST", pgc_socket_dir(c), 1);
	setenv("PGPORT", port, 1);
	setenv("PGDATABASE", "cotrain", 1);
	setenv("PGUSER", "cotrain", 1);

	signal(SIGINT, SIG_IGN); /* let the child handle ^C; we clean up after */
	signal(SIGTERM, SIG_IGN);
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		execvp(argv[1], argv + 1);
		fprintf(stderr, "with-pgtmp: could not run \"%s\": %m\n", argv[1]);
		_exit(127);
	}
	int st = 0;
	if (pid > 0)
		waitpid(pid, &st, 0);
	pgc_stop(c);
	if (pid < 0)
		return 1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
