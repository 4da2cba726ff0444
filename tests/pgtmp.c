/* cotrain tests: the throwaway PostgreSQL. */
#include "tests/pgtmp.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shared/database/pgcluster.h"
#include "tests/tap.h"

static pgc_cluster *cluster;

void pgtmp_stop(void)
{
	pgc_stop(cluster);
	cluster = NULL;
}

const char *pgtmp_start(void)
{
	if (cluster)
		return pgc_conninfo(cluster);
	char dir[] = "/tmp/cotrain-pg-XXXXXX";
	if (!mkdtemp(dir))
		bail_out("could not create a temporary directory: %m");
	cot_errbuf eb = { "", "" };
	cot_err e = pgc_start(dir, 0, PGC_EPHEMERAL, "cotrain", &cluster, &eb);
	if (e) {
		rmdir(dir);
		bail_out("could not start a throwaway PostgreSQL: %s %s", eb.msg, eb.hint);
	}
	atexit(pgtmp_stop);
	return pgc_conninfo(cluster);
}

const char *pgtmp_conninfo(void) { return cluster ? pgc_conninfo(cluster) : NULL; }
const char *pgtmp_socket_dir(void) { return cluster ? pgc_socket_dir(cluster) : NULL; }
int pgtmp_port(void) { return cluster ? pgc_port(cluster) : 0; }
