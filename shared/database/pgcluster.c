/* cotrain: private PostgreSQL clusters, kept by a guardian process. */
#include "config.h"
#include "shared/database/pgcluster.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#define PGC_USER "cotrain" /* the cluster's superuser */
#define START_TIMEOUT_S 60
#define STOP_TIMEOUT_S 30

struct pgc_cluster {
	pid_t guardian;
	int lifeline; /* write end; closing it stops the cluster */
	int port;
	char dir[256];
	char conninfo[512];
};

const char *pgc_bindir(void)
{
	const char *e = getenv("COTRAIN_PG_BINDIR");
	return e && *e ? e : PG_BINDIR;
}

const char *pgc_conninfo(const pgc_cluster *c) { return c->conninfo; }
const char *pgc_socket_dir(const pgc_cluster *c) { return c->dir; }
int pgc_port(const pgc_cluster *c) { return c->port; }

/* The unprivileged account to run initdb and postgres as when we are root;
 * NULL when we are not root (run as ourselves). */
static const struct passwd *run_user(void)
{
	if (geteuid() != 0)
		return NULL;
	const char *name = getenv("COTRAIN_PG_USER");
	struct passwd *pw = NULL;
	if (name && *name)
		pw = getpwnam(name);
	if (!pw)
		pw = getpwnam("postgres");
	if (!pw)
		pw = getpwnam("nobody");
	return pw;
}

/* In a forked child: become the run user.  Returns 0 or -1. */
static int drop_privileges(const struct passwd *pw)
{
	if (!pw)
		return 0;
	if (setgroups(0, NULL) < 0 || setgid(pw->pw_gid) < 0 || setuid(pw->pw_uid) < 0)
		return -1;
	return 0;
}

static void close_fds_from(int lowfd, int keep1, int keep2)
{
	long max = sysconf(_SC_OPEN_MAX);
	if (max < 0 || max > 65536)
		max = 65536;
	for (int fd = lowfd; fd < max; fd++)
		if (fd != keep1 && fd != keep2)
			close(fd);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void remove_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Last `max` bytes of a log file, for error reports. */
static void log_tail(const char *path, char *buf, size_t max)
{
	buf[0] = '\0';
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	if (sz > (long)max - 1)
		fseek(f, sz - (long)(max - 1), SEEK_SET);
	else
		fseek(f, 0, SEEK_SET);
	size_t n = fread(buf, 1, max - 1, f);
	buf[n] = '\0';
	fclose(f);
	/* What says why: the last FATAL (else PANIC) line when there is one,
	 * else the tail from its first whole line. */
	char *why = NULL, *p;
	for (p = buf; (p = strstr(p, "FATAL:")); p++)
		why = p;
	for (p = buf; !why && (p = strstr(p, "PANIC:")); p++)
		why = p;
	if (why) {
		char *end = strchr(why, '\n');
		if (end)
			*end = '\0';
		memmove(buf, why, strlen(why) + 1);
	} else if (sz > (long)max - 1 && (p = strchr(buf, '\n'))) {
		memmove(buf, p + 1, strlen(p + 1) + 1);
	}
	for (p = buf; *p; p++)
		if (*p == '\n' && p[1])
			*p = ' ';
	n = strlen(buf);
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = '\0';
}

/* Run argv (as the run user) with output to logpath; returns its exit status
 * or -1. */
static int run_logged(char *const argv[], const char *logpath, const struct passwd *pw)
{
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd >= 0) {
			if (pw && fchown(fd, pw->pw_uid, pw->pw_gid) < 0) { /* best effort */
			}
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		if (drop_privileges(pw) < 0)
			_exit(126);
		execv(argv[0], argv);
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Guardian, step 1: initdb when needed and start postgres.  Returns the
 * postmaster's pid, or -1 with a message in err. */
static pid_t guardian_start_server(const char *dir, int port, unsigned flags, const struct passwd *pw,
                                   char *err, size_t errlen)
{
	char path[512], logpath[512], bin[512];
	snprintf(path, sizeof path, "%s/PG_VERSION", dir);

	if (access(path, F_OK) != 0) {
		/* initdb wants the directory empty or absent, owned by the run user. */
		if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
			snprintf(err, errlen, "could not create directory \"%s\": %s", dir, strerror(errno));
			return -1;
		}
		if (pw && chown(dir, pw->pw_uid, pw->pw_gid) < 0) {
			snprintf(err, errlen, "could not change owner of \"%s\": %s", dir, strerror(errno));
			return -1;
		}
		chmod(dir, 0700);
		char initlog[512];
		snprintf(initlog, sizeof initlog, "%s.initdb.log", dir);
		snprintf(bin, sizeof bin, "%s/initdb", pgc_bindir());
		char *argv[16];
		int n = 0;
		argv[n++] = bin;
		argv[n++] = "-D";
		argv[n++] = (char *)dir;
		argv[n++] = "-U";
		argv[n++] = PGC_USER;
		argv[n++] = "-A";
		argv[n++] = "trust";
		argv[n++] = "-E";
		argv[n++] = "UTF8";
		argv[n++] = "--locale=C";
		if (flags & PGC_EPHEMERAL)
			argv[n++] = "--no-sync";
		argv[n] = NULL;
		int rc = run_logged(argv, initlog, pw);
		if (rc != 0) {
			char tail[300];
			log_tail(initlog, tail, sizeof tail);
			snprintf(err, errlen, "initdb failed in \"%s\" (exit %d): %s", dir, rc, tail);
			return -1;
		}
		unlink(initlog);
	}

	snprintf(logpath, sizeof logpath, "%s/postgres.log", dir);
	snprintf(bin, sizeof bin, "%s/postgres", pgc_bindir());
	char portstr[16];
	snprintf(portstr, sizeof portstr, "%d", port);
	pid_t pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "could not fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (fd >= 0) {
			if (pw && fchown(fd, pw->pw_uid, pw->pw_gid) < 0) { /* best effort */
			}
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		if (drop_privileges(pw) < 0)
			_exit(126);
		/* If the guardian dies, the postmaster shuts down immediately. */
		prctl(PR_SET_PDEATHSIG, SIGQUIT);
		char *argv[32];
		int n = 0;
		argv[n++] = bin;
		argv[n++] = "-D";
		argv[n++] = (char *)dir;
		argv[n++] = "-k";
		argv[n++] = (char *)dir;
		argv[n++] = "-p";
		argv[n++] = portstr;
		argv[n++] = "-c";
		argv[n++] = "listen_addresses=";
		argv[n++] = "-c";
		argv[n++] = "unix_socket_permissions=0700";
		argv[n++] = "-c";
		argv[n++] = "max_connections=300";
		if (flags & PGC_EPHEMERAL) {
			argv[n++] = "-c";
			argv[n++] = "fsync=off";
			argv[n++] = "-c";
			argv[n++] = "synchronous_commit=off";
			argv[n++] = "-c";
			argv[n++] = "full_page_writes=off";
		}
		argv[n] = NULL;
		execv(bin, argv);
		_exit(127);
	}
	return pid;
}

static void make_conninfo(char *buf, size_t len, const char *dir, int port, const char *dbname)
{
	snprintf(buf, len, "host=%s port=%d dbname=%s user=" PGC_USER " connect_timeout=10", dir, port,
	         dbname);
}

/* Guardian, step 2: wait until the server answers, then create the
 * database.  Returns 0 or -1 with err. */
static int guardian_wait_ready(pid_t pm, const char *dir, int port, const char *dbname, char *err,
                               size_t errlen)
{
	char ci[512], logpath[512];
	make_conninfo(ci, sizeof ci, dir, port, "postgres");
	snprintf(logpath, sizeof logpath, "%s/postgres.log", dir);
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		int st;
		if (waitpid(pm, &st, WNOHANG) == pm) {
			char tail[300];
			log_tail(logpath, tail, sizeof tail);
			snprintf(err, errlen, "postgres exited during start-up: %s", tail);
			return -1;
		}
		if (PQping(ci) == PQPING_OK)
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec > START_TIMEOUT_S) {
			snprintf(err, errlen, "postgres did not accept connections within %d s",
			         START_TIMEOUT_S);
			return -1;
		}
		usleep(20000);
	}

	PGconn *c = PQconnectdb(ci);
	if (PQstatus(c) != CONNECTION_OK) {
		snprintf(err, errlen, "could not connect to the new cluster: %s", PQerrorMessage(c));
		PQfinish(c);
		return -1;
	}
	const char *params[1] = { dbname };
	PGresult *r = PQexecParams(c, "SELECT 1 FROM pg_database WHERE datname = $1", 1, NULL, params, NULL,
	                           NULL, 0);
	int exists = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
	PQclear(r);
	int rc = 0;
	if (!exists) {
		char *ident = PQescapeIdentifier(c, dbname, strlen(dbname));
		char sql[512];
		snprintf(sql, sizeof sql, "CREATE DATABASE %s", ident ? ident : "\"?\"");
		PQfreemem(ident);
		r = PQexec(c, sql);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			snprintf(err, errlen, "could not create database \"%s\": %s", dbname,
			         PQresultErrorMessage(r));
			rc = -1;
		}
		PQclear(r);
	}
	PQfinish(c);
	return rc;
}

static void guardian_stop_server(pid_t pm)
{
	int st;
	kill(pm, SIGINT); /* fast shutdown */
	for (int i = 0; i < STOP_TIMEOUT_S * 50; i++) {
		if (waitpid(pm, &st, WNOHANG) == pm)
			return;
		usleep(20000);
	}
	kill(pm, SIGQUIT); /* immediate shutdown */
	for (int i = 0; i < 5 * 50; i++) {
		if (waitpid(pm, &st, WNOHANG) == pm)
			return;
		usleep(20000);
	}
	kill(pm, SIGKILL);
	waitpid(pm, &st, 0);
}

/* The guardian process: never returns. */
static _Noreturn void guardian(const char *dir, int port, unsigned flags, const char *dbname, int lifeline,
                               int status)
{
	setsid();
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	signal(SIGPIPE, SIG_IGN);
	int devnull = open("/dev/null", O_RDWR);
	if (devnull >= 0) {
		dup2(devnull, 0);
		dup2(devnull, 1);
		if (devnull > 2)
			close(devnull);
	}
	close_fds_from(3, lifeline, status);

	const struct passwd *pw = run_user();
	char err[512] = "";
	pid_t pm = guardian_start_server(dir, port, flags, pw, err, sizeof err);
	if (pm < 0 || guardian_wait_ready(pm, dir, port, dbname, err, sizeof err) < 0) {
		if (pm > 0)
			guardian_stop_server(pm);
		if (flags & PGC_EPHEMERAL)
			remove_tree(dir);
		ssize_t w = write(status, err, strlen(err));
		(void)w;
		_exit(1);
	}
	ssize_t w = write(status, "OK", 2);
	(void)w;
	close(status);

	/* Wait for the starter to go away (EOF) or the server to die. */
	for (;;) {
		struct pollfd p = { .fd = lifeline, .events = POLLIN };
		int n = poll(&p, 1, 500);
		if (n > 0) {
			char b[16];
			if (read(lifeline, b, sizeof b) <= 0)
				break;
		}
		int st;
		if (waitpid(pm, &st, WNOHANG) == pm) {
			pm = -1;
			break;
		}
	}
	if (pm > 0)
		guardian_stop_server(pm);
	if (flags & PGC_EPHEMERAL)
		remove_tree(dir);
	_exit(0);
}

cot_err pgc_start(const char *dir, int port, unsigned flags, const char *dbname, pgc_cluster **out,
                  cot_errbuf *eb)
{
	*out = NULL;
	/* postgres runs in its data directory: a relative path (its socket
	 * and lock files are made from it) would point elsewhere. */
	char absdir[4096];
	if (dir[0] != '/') {
		char cwd[4096];
		if (!getcwd(cwd, sizeof cwd) ||
		    (size_t)snprintf(absdir, sizeof absdir, "%s/%s", cwd, dir) >= sizeof absdir)
			return cot_seterr(eb, COT_ERR_INVALID, "database directory path \"%s\" is too long",
			                  dir);
		dir = absdir;
	}
	/* The socket path ("<dir>/.s.PGSQL.<port>") must fit sun_path. */
	if (strlen(dir) + 16 >= 108 || strlen(dir) >= sizeof(((pgc_cluster *)0)->dir)) {
		cot_err e =
		        cot_seterr(eb, COT_ERR_INVALID, "database directory path \"%s\" is too long", dir);
		cot_sethint(eb, "Unix socket paths are limited to 107 bytes; use a shorter data directory.");
		return e;
	}
	if (!dbname || !*dbname || strlen(dbname) > 63)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid database name");
	char bin[512];
	snprintf(bin, sizeof bin, "%s/postgres", pgc_bindir());
	if (access(bin, X_OK) != 0) {
		cot_err e =
		        cot_seterr(eb, COT_ERR_NOT_FOUND, "could not find the PostgreSQL server \"%s\"", bin);
		cot_sethint(eb, "Install the Debian package postgresql, or set COTRAIN_PG_BINDIR.");
		return e;
	}
	if (port == 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		port = 20000 + (int)((ts.tv_nsec / 1000 + getpid() * 7919L) % 40000);
	}

	pgc_cluster *c = calloc(1, sizeof *c);
	if (!c)
		return COT_ERR_NOMEM;
	snprintf(c->dir, sizeof c->dir, "%s", dir);
	c->port = port;
	make_conninfo(c->conninfo, sizeof c->conninfo, dir, port, dbname);

	int lifeline[2], status[2];
	if (pipe2(lifeline, O_CLOEXEC) < 0) {
		free(c);
		return cot_seterr(eb, COT_ERR_IO, "could not create pipe: %s", strerror(errno));
	}
	if (pipe2(status, O_CLOEXEC) < 0) {
		close(lifeline[0]);
		close(lifeline[1]);
		free(c);
		return cot_seterr(eb, COT_ERR_IO, "could not create pipe: %s", strerror(errno));
	}
	fflush(NULL);
	pid_t g = fork();
	if (g < 0) {
		close(lifeline[0]);
		close(lifeline[1]);
		close(status[0]);
		close(status[1]);
		free(c);
		return cot_seterr(eb, COT_ERR_IO, "could not fork: %s", strerror(errno));
	}
	if (g == 0) {
		close(lifeline[1]);
		close(status[0]);
		guardian(dir, port, flags, dbname, lifeline[0], status[1]);
	}
	close(lifeline[0]);
	close(status[1]);
	c->guardian = g;
	c->lifeline = lifeline[1];

	char msg[600];
	size_t got = 0;
	for (;;) {
		ssize_t n = read(status[0], msg + got, sizeof msg - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
		if (got >= sizeof msg - 1)
			break;
	}
	msg[got] = '\0';
	close(status[0]);
	if (strcmp(msg, "OK") != 0) {
		close(c->lifeline);
		int st;
		waitpid(g, &st, 0);
		free(c);
		return cot_seterr(eb, COT_ERR_DB, "could not start PostgreSQL in \"%s\": %s", dir,
		                  got ? msg : "the guardian process died");
	}
	*out = c;
	return COT_OK;
}

void pgc_stop(pgc_cluster *c)
{
	if (!c)
		return;
	close(c->lifeline);
	int st;
	while (waitpid(c->guardian, &st, 0) < 0 && errno == EINTR)
		;
	free(c);
}

bool pgc_running(const char *dir, const char *dbname, char *buf, size_t len)
{
	char path[512];
	snprintf(path, sizeof path, "%s/postmaster.pid", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	/* Lines: pid, data dir, start time, port, socket dir, ... */
	char line[200];
	int port = 0;
	char sockdir[256] = "";
	for (int i = 1; i <= 5 && fgets(line, sizeof line, f); i++) {
		line[strcspn(line, "\n")] = '\0';
		if (i == 4)
			port = atoi(line);
		else if (i == 5)
			snprintf(sockdir, sizeof sockdir, "%s", line);
	}
	fclose(f);
	if (port <= 0 || !sockdir[0])
		return false;
	make_conninfo(buf, len, sockdir, port, dbname);
	return PQping(buf) == PQPING_OK;
}
