/* cotrain benchmark: work assignments per second of cotrain-server.
 *
 *   bench_scheduler SERVER_BINARY [--hosts N] [--seconds S] [--warmup S]
 *                   [--threads N] [--servers K]
 *
 * With $COTRAIN_DB pointing at an empty database (tests/with-pgtmp gives
 * one), it applies the migrations, inserts a project (64 shards, checkpoint,
 * a round target out of reach so that work is never refused as full),
 * starts SERVER_BINARY on a free port, registers N hosts (default 32) through
 * the API, then runs N threads, each with its own keep-alive curl handle and
 * host token, asking for work as fast as they can: a warm-up, then the
 * measured window.  With --servers K (default 1) it starts K server
 * processes on the same database and spreads the hosts over them, host i
 * asking server i mod K (doc/design.md, "Several server processes").
 * Prints one line:
 *
 *   assignments_per_s=... p50_ms=... p99_ms=... max_ms=... requests=... errors=...
 *
 * and exits non-zero when any request failed.  The ceiling to compare with
 * (pgbench on the same cluster) is measured by tests/bench/bench-scheduler.sh. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "shared/database/db.h"

#define MAX_SAMPLES 4000000

#define MAX_SERVERS 8

static char base_url[MAX_SERVERS][128];
static atomic_int state; /* 0 warm-up, 1 measuring, 2 stop */
static pid_t server_pid[MAX_SERVERS];
static int n_servers = 1;
static char data_dir[64];

typedef struct {
	long long host_id;
	const char *base; /* the server this host asks */
	char token[64];
	pthread_t thread;
	float *lat_ms; /* latencies in the measured window */
	size_t n, cap;
	long errors;
} worker;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "bench_scheduler: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static void stop_server(void)
{
	for (int i = 0; i < n_servers; i++)
		if (server_pid[i] > 0)
			kill(server_pid[i], SIGTERM);
	for (int i = 0; i < n_servers; i++)
		if (server_pid[i] > 0) {
			waitpid(server_pid[i], NULL, 0);
			server_pid[i] = 0;
		}
	if (data_dir[0]) {
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", data_dir);
		if (system(cmd) != 0)
			fprintf(stderr, "bench_scheduler: could not remove %s\n", data_dir);
		data_dir[0] = '\0';
	}
}

static void exec_sql(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
		die("SQL failed: %s", PQerrorMessage(c));
	PQclear(r);
}

static size_t sink(char *p, size_t size, size_t n, void *arg)
{
	struct {
		char buf[8192];
		size_t len;
	} *m = arg;
	size_t k = size * n;
	size_t room = sizeof m->buf - 1 - m->len;
	size_t c = k < room ? k : room;
	memcpy(m->buf + m->len, p, c);
	m->len += c;
	m->buf[m->len] = '\0';
	return k;
}

/* POST to server base with curl handle c; returns the status, body in out
 * (truncated). */
static long post(CURL *c, const char *base, const char *path, const char *bearer, const char *body, char *out,
                 size_t outlen)
{
	struct {
		char buf[8192];
		size_t len;
	} m = { .len = 0 };
	char url[256], auth[128];
	snprintf(url, sizeof url, "%s%s", base, path);
	struct curl_slist *h = NULL;
	if (bearer) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
		h = curl_slist_append(h, auth);
	}
	h = curl_slist_append(h, "Content-Type: application/json");
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &m);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
	CURLcode rc = curl_easy_perform(c);
	curl_slist_free_all(h);
	long status = 0;
	if (rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	if (out)
		snprintf(out, outlen, "%s", m.buf);
	return status;
}

static void *worker_main(void *arg)
{
	worker *w = arg;
	CURL *c = curl_easy_init();
	char body[64];
	snprintf(body, sizeof body, "{\"host_id\": %lld}", w->host_id);
	int st;
	while ((st = atomic_load(&state)) != 2) {
		double t0 = now_s();
		long status = post(c, w->base, "/v1/projects/bench/work", w->token, body, NULL, 0);
		double ms = (now_s() - t0) * 1e3;
		if (st != 1)
			continue;
		if (status != 200)
			w->errors++;
		if (w->n < w->cap)
			w->lat_ms[w->n++] = (float)ms;
	}
	curl_easy_cleanup(c);
	return NULL;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* Start server k (of the same database, the same data folder) and read its
 * address from the ready line; dies on failure. */
static void start_server(int k, const char *bin, const char *conninfo, const char *threads)
{
	int out[2];
	if (pipe(out))
		die("pipe: %s", strerror(errno));
	server_pid[k] = fork();
	if (server_pid[k] == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		dup2(out[1], STDOUT_FILENO);
		close(out[0]);
		close(out[1]);
		if (threads)
			execl(bin, bin, "--port", "0", "--db", conninfo, "--data-dir", data_dir,
			      "--kdf-iterations", "1000", "--auth-per-minute", "0", "--log-level", "warn",
			      "--threads", threads, (char *)NULL);
		else
			execl(bin, bin, "--port", "0", "--db", conninfo, "--data-dir", data_dir,
			      "--kdf-iterations", "1000", "--auth-per-minute", "0", "--log-level", "warn",
			      (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	FILE *f = fdopen(out[0], "r");
	char line[256];
	if (!f || !fgets(line, sizeof line, f) || !strstr(line, "listening on "))
		die("server %d did not start", k + 1);
	line[strcspn(line, "\n")] = '\0';
	snprintf(base_url[k], sizeof base_url[k], "%s", strstr(line, "listening on ") + 13);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		die("usage: bench_scheduler SERVER_BINARY [--hosts N] [--seconds S] [--warmup S] [--threads "
		    "N] [--servers K]");
	const char *bin = argv[1];
	int nhosts = 32, seconds = 10, warmup = 2;
	const char *threads = NULL; /* the server's default */
	for (int i = 2; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--hosts") == 0)
			nhosts = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--seconds") == 0)
			seconds = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--warmup") == 0)
			warmup = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--threads") == 0)
			threads = argv[i + 1];
		else if (strcmp(argv[i], "--servers") == 0)
			n_servers = atoi(argv[i + 1]);
		else
			die("unknown option %s", argv[i]);
	}
	if (nhosts < 1 || nhosts > 1024 || seconds < 1 || n_servers < 1 || n_servers > MAX_SERVERS)
		die("bad --hosts, --seconds or --servers");
	const char *conninfo = getenv("COTRAIN_DB");
	if (!conninfo)
		die("COTRAIN_DB is not set (run under tests/with-pgtmp)");

	PGconn *db;
	cot_errbuf eb = { "", "" };
	if (db_connect(conninfo, &db, &eb) || db_migrate(db, NULL, NULL, &eb))
		die("%s", eb.msg);
	exec_sql(db, "INSERT INTO file (sha256, size, kind) VALUES"
	             " (encode(sha256('bench-manifest'), 'hex'), 4096, 'manifest'),"
	             " (encode(sha256('bench-ckpt'), 'hex'), 80000000, 'checkpoint');"
	             "INSERT INTO file (sha256, size, kind) SELECT encode(sha256(convert_to('bench-shard-' "
	             "|| i, 'UTF8')), 'hex'),"
	             "  1000000, 'shard' FROM generate_series(0, 63) i;"
	             "INSERT INTO dataset (name, n_tokens, manifest_sha256) VALUES"
	             " ('bench-data', 64 * 1048576, encode(sha256('bench-manifest'), 'hex'));"
	             "INSERT INTO shard SELECT d.id, i, i * 1048576::bigint, 1048576,"
	             "  encode(sha256(convert_to('bench-shard-' || i, 'UTF8')), 'hex')"
	             "  FROM generate_series(0, 63) i, dataset d WHERE d.name = 'bench-data';"
	             "INSERT INTO project (name, title, config, dataset_id, seq_len, microbatch_size, "
	             "target_batch,"
	             "  mb_per_epoch, flops_per_sample, wu_seconds)"
	             " SELECT 'bench', 'Benchmark', '{}', id, 256, 8, 2000000000, (64 * 1048576 - 1) / 2048, "
	             "1.2e10, 180"
	             "  FROM dataset WHERE name = 'bench-data';"
	             "INSERT INTO model_version SELECT id, 0, encode(sha256('bench-ckpt'), 'hex') FROM "
	             "project WHERE name = 'bench';");

	snprintf(data_dir, sizeof data_dir, "/tmp/cotrain-bench-XXXXXX");
	if (!mkdtemp(data_dir))
		die("mkdtemp: %s", strerror(errno));
	atexit(stop_server);
	for (int k = 0; k < n_servers; k++)
		start_server(k, bin, conninfo, threads);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	worker *ws = calloc((size_t)nhosts, sizeof *ws);
	CURL *c = curl_easy_init();
	for (int i = 0; i < nhosts; i++) {
		char body[256], resp[8192];
		ws[i].base = base_url[i % n_servers];
		snprintf(body, sizeof body,
		         "{\"email\": \"bench%d@example.org\", \"name\": \"bench %d\", \"password\": "
		         "\"benchmark!\"}",
		         i, i);
		if (post(c, ws[i].base, "/v1/accounts", NULL, body, resp, sizeof resp) != 201)
			die("could not create an account: %s", resp);
		json_t *j = json_loads(resp, 0, NULL);
		char key[64];
		snprintf(key, sizeof key, "%s", json_string_value(json_object_get(j, "account_key")));
		json_decref(j);
		/* 1e12 FLOPS: n = 1e12 * 180 / (1.2e10 * 8) = 1875 microbatches. */
		if (post(c, ws[i].base, "/v1/hosts", key, "{\"flops\": 1e12, \"cores\": 16}", resp,
		         sizeof resp) != 201)
			die("could not register a host: %s", resp);
		j = json_loads(resp, 0, NULL);
		ws[i].host_id = json_integer_value(json_object_get(j, "host_id"));
		snprintf(ws[i].token, sizeof ws[i].token, "%s",
		         json_string_value(json_object_get(j, "host_token")));
		json_decref(j);
		ws[i].cap = MAX_SAMPLES / (size_t)nhosts;
		ws[i].lat_ms = malloc(ws[i].cap * sizeof(float));
	}
	curl_easy_cleanup(c);

	for (int i = 0; i < nhosts; i++)
		pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]);
	sleep((unsigned)warmup);
	atomic_store(&state, 1);
	double t0 = now_s();
	sleep((unsigned)seconds);
	atomic_store(&state, 2);
	double elapsed = now_s() - t0;
	size_t total = 0;
	long errors = 0;
	for (int i = 0; i < nhosts; i++) {
		pthread_join(ws[i].thread, NULL);
		total += ws[i].n;
		errors += ws[i].errors;
	}
	float *all = malloc((total ? total : 1) * sizeof(float));
	size_t k = 0;
	for (int i = 0; i < nhosts; i++) {
		memcpy(all + k, ws[i].lat_ms, ws[i].n * sizeof(float));
		k += ws[i].n;
		free(ws[i].lat_ms);
	}
	qsort(all, total, sizeof(float), cmp_float);
	double p50 = total ? all[total / 2] : 0;
	double p99 = total ? all[(size_t)((double)total * 0.99)] : 0;
	double mx = total ? all[total - 1] : 0;
	/* Cross-check with the database: work units really created. */
	PGresult *r = PQexec(db, "SELECT count(*) FROM work_unit");
	long long wus = PQresultStatus(r) == PGRES_TUPLES_OK ? atoll(PQgetvalue(r, 0, 0)) : -1;
	PQclear(r);
	printf("assignments_per_s=%.0f p50_ms=%.2f p99_ms=%.2f max_ms=%.2f requests=%zu errors=%ld "
	       "work_units=%lld hosts=%d server_threads=%s servers=%d\n",
	       (double)total / elapsed, p50, p99, mx, total, errors, wus, nhosts,
	       threads ? threads : "default", n_servers);
	free(all);
	free(ws);
	PQfinish(db);
	stop_server();
	return errors ? 1 : 0;
}
