/* cotrain tests: the real cotrain-server beside a throwaway PostgreSQL. */
#include "tests/test_server_harness.h"

#include <errno.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shared/database/db.h"
#include "tests/pgtmp.h"
#include "tests/tap.h"

static pid_t server_pid;
static char url[128];
static char data_dir[64];
static PGconn *db;
static int acct_seq;

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

static void teardown(void)
{
	th_stop_server();
	PQfinish(db);
	db = NULL;
	if (data_dir[0])
		nftw(data_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	data_dir[0] = '\0';
	pgtmp_stop();
}

bool th_stop_server(void)
{
	if (server_pid <= 0)
		return false;
	kill(server_pid, SIGTERM);
	int status = 0;
	bool clean = false;
	for (int i = 0; i < 200; i++) { /* up to 10 s */
		pid_t w = waitpid(server_pid, &status, WNOHANG);
		if (w == server_pid) {
			clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
			server_pid = 0;
			return clean;
		}
		usleep(50000);
	}
	kill(server_pid, SIGKILL);
	waitpid(server_pid, &status, 0);
	server_pid = 0;
	return false;
}

void th_start(const char *const *extra_args)
{
	const char *conninfo = pgtmp_start();
	atexit(teardown); /* runs before pgtmp's own atexit (LIFO) */
	cot_errbuf eb = { "", "" };
	if (db_connect(conninfo, &db, &eb))
		bail_out("%s", eb.msg);
	if (db_migrate(db, NULL, NULL, &eb))
		bail_out("could not migrate: %s", eb.msg);

	snprintf(data_dir, sizeof data_dir, "/tmp/cotrain-srvtest-XXXXXX");
	if (!mkdtemp(data_dir))
		bail_out("could not create a data directory: %s", strerror(errno));

	const char *top = getenv("top_builddir");
	char bin[1024];
	snprintf(bin, sizeof bin, "%s/server/cotrain-server", top ? top : ".");
	const char *argv[64];
	int n = 0;
	argv[n++] = bin;
	argv[n++] = "--port";
	argv[n++] = "0";
	argv[n++] = "--db";
	argv[n++] = conninfo;
	argv[n++] = "--data-dir";
	argv[n++] = data_dir;
	argv[n++] = "--kdf-iterations";
	argv[n++] = "1000";
	/* Tests sign up many accounts from one address; the limit itself is
	 * tested with its own setting (test_server_api). */
	argv[n++] = "--auth-per-minute";
	argv[n++] = "0";
	for (int i = 0; extra_args && extra_args[i] && n < 62; i++)
		argv[n++] = extra_args[i];
	argv[n] = NULL;

	int out[2];
	if (pipe(out))
		bail_out("pipe: %s", strerror(errno));
	fflush(stdout);
	pid_t parent = getpid();
	server_pid = fork();
	if (server_pid < 0)
		bail_out("fork: %s", strerror(errno));
	if (server_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(1);
		dup2(out[1], STDOUT_FILENO);
		close(out[0]);
		close(out[1]);
		execv(bin, (char *const *)argv);
		fprintf(stderr, "could not run %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	close(out[1]);

	/* Wait (at most 30 s) for "cotrain-server: listening on http://...". */
	char line[512];
	size_t len = 0;
	struct pollfd pfd = { .fd = out[0], .events = POLLIN };
	for (int waited = 0; waited < 300;) {
		if (poll(&pfd, 1, 100) == 0) {
			waited++;
			continue;
		}
		ssize_t r = read(out[0], line + len, sizeof line - 1 - len);
		if (r <= 0)
			bail_out("cotrain-server exited before it listened");
		len += (size_t)r;
		line[len] = '\0';
		char *nl = strchr(line, '\n');
		if (nl) {
			*nl = '\0';
			const char *p = strstr(line, "listening on ");
			if (!p)
				bail_out("unexpected first line from cotrain-server: %s", line);
			snprintf(url, sizeof url, "%s", p + strlen("listening on "));
			close(out[0]);
			curl_global_init(CURL_GLOBAL_DEFAULT);
			return;
		}
		if (len == sizeof line - 1)
			break;
	}
	bail_out("cotrain-server did not say it was listening within 30 s");
}

const char *th_url(void) { return url; }
const char *th_data_dir(void) { return data_dir; }
PGconn *th_db(void) { return db; }

typedef struct {
	char *buf;
	size_t len, cap;
} membuf;

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
	membuf *m = arg;
	size_t k = size * n;
	if (m->len + k + 1 > m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 4096;
		while (cap < m->len + k + 1)
			cap *= 2;
		char *b = realloc(m->buf, cap);
		if (!b)
			return 0;
		m->buf = b;
		m->cap = cap;
	}
	memcpy(m->buf + m->len, p, k);
	m->len += k;
	m->buf[m->len] = '\0';
	return k;
}

static void header_value(const char *line, size_t n, const char *name, char *out, size_t outlen)
{
	size_t nl = strlen(name);
	if (n <= nl + 1 || strncasecmp(line, name, nl) != 0 || line[nl] != ':')
		return;
	const char *v = line + nl + 1;
	size_t vl = n - nl - 1;
	while (vl && (*v == ' ' || *v == '\t'))
		v++, vl--;
	while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n'))
		vl--;
	if (vl >= outlen)
		vl = outlen - 1;
	memcpy(out, v, vl);
	out[vl] = '\0';
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
	th_resp *r = arg;
	size_t k = size * n;
	char cl[32] = "";
	header_value(p, k, "ETag", r->etag, sizeof r->etag);
	header_value(p, k, "Content-Range", r->content_range, sizeof r->content_range);
	header_value(p, k, "Content-Type", r->content_type, sizeof r->content_type);
	header_value(p, k, "Allow", r->allow, sizeof r->allow);
	header_value(p, k, "Retry-After", r->retry_after, sizeof r->retry_after);
	header_value(p, k, "Content-Length", cl, sizeof cl);
	if (cl[0])
		r->content_length = atoll(cl);
	return k;
}

static __thread CURL *thread_curl;

bool th_http(CURL *curl, const char *method, const char *path, const char *bearer, const char *body,
             const char *const *headers, th_resp *out)
{
	memset(out, 0, sizeof *out);
	out->content_length = -1;
	if (!curl) {
		if (!thread_curl)
			thread_curl = curl_easy_init();
		curl = thread_curl;
	}
	curl_easy_reset(curl);
	char full[1024];
	snprintf(full, sizeof full, "%s%s", url, path);
	membuf m = { 0 };
	struct curl_slist *hl = NULL;
	char auth[400];
	if (bearer) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
		hl = curl_slist_append(hl, auth);
	}
	if (body)
		hl = curl_slist_append(hl, "Content-Type: application/json");
	hl = curl_slist_append(hl, "Expect:");
	for (int i = 0; headers && headers[i]; i++)
		hl = curl_slist_append(hl, headers[i]);
	curl_easy_setopt(curl, CURLOPT_URL, full);
	curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
	if (strcmp(method, "HEAD") == 0)
		curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
	if (body) {
		curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
	}
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &m);
	curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(curl, CURLOPT_HEADERDATA, out);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT, 90L);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CURLcode rc = curl_easy_perform(curl);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	out->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	curl_slist_free_all(hl);
	if (rc != CURLE_OK) {
		diag("%s %s: %s", method, path, curl_easy_strerror(rc));
		free(m.buf);
		return false;
	}
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &out->status);
	out->body = m.buf ? m.buf : strdup("");
	out->len = m.len;
	if (m.len)
		out->json = json_loadb(out->body, out->len, 0, NULL);
	return true;
}

void th_resp_free(th_resp *r)
{
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}

static json_t *lookup(const th_resp *r, const char *key)
{
	char buf[128];
	snprintf(buf, sizeof buf, "%s", key);
	json_t *v = r->json;
	char *save = NULL;
	for (char *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
		v = json_object_get(v, k);
	return v;
}

long long th_json_int(const th_resp *r, const char *key)
{
	json_t *v = lookup(r, key);
	return json_is_integer(v) ? json_integer_value(v) : -1;
}

const char *th_json_str(const th_resp *r, const char *key) { return json_string_value(lookup(r, key)); }

bool th_is_error(const th_resp *r, long status, const char *code, const char *what)
{
	const char *c = th_json_str(r, "error.code");
	const char *m = th_json_str(r, "error.message");
	bool good = r->status == status && c && strcmp(c, code) == 0 && m && *m &&
	            strncmp(r->content_type, "application/json", 16) == 0;
	ok(good, "%s: %ld %s", what, status, code);
	if (!good)
		diag("  got %ld: %s", r->status, r->body ? r->body : "(no body)");
	return good;
}

static PGresult *run(const char *fmt, va_list ap)
{
	char sql[8192];
	vsnprintf(sql, sizeof sql, fmt, ap);
	PGresult *r = PQexec(db, sql);
	ExecStatusType st = PQresultStatus(r);
	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)
		bail_out("SQL failed: %s\n%s", PQerrorMessage(db), sql);
	return r;
}

long long th_sql_int(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	PGresult *r = run(fmt, ap);
	va_end(ap);
	long long v = PQntuples(r) > 0 ? atoll(PQgetvalue(r, 0, 0)) : 0;
	PQclear(r);
	return v;
}

void th_sql(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	PQclear(run(fmt, ap));
	va_end(ap);
}

char *th_db_fingerprint(void)
{
	static const char *tables[] = { "account",   "account_key",      "team", "host", "project", "mb_pool",
		                        "work_unit", "version_progress", NULL };
	size_t cap = 4096, len = 0;
	char *out = calloc(1, cap);
	for (int i = 0; tables[i]; i++) {
		char sql[256];
		snprintf(sql, sizeof sql,
		         "SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), "
		         "'') FROM %s t",
		         tables[i]);
		PGresult *r = PQexec(db, sql);
		if (PQresultStatus(r) != PGRES_TUPLES_OK)
			bail_out("fingerprint: %s", PQerrorMessage(db));
		len += (size_t)snprintf(out + len, cap - len, "%s=%s ", tables[i], PQgetvalue(r, 0, 0));
		PQclear(r);
	}
	return out;
}

long long th_seed_project(const char *name, int wu_seconds, double flops_per_sample, int microbatch_size,
                          int seq_len, int n_shards, long long shard_tokens)
{
	/* Fake but well-formed sha256 names, distinct per project. */
	long long n_tokens = (long long)n_shards * shard_tokens;
	long long mb_per_epoch = (n_tokens - 1) / ((long long)microbatch_size * seq_len);
	th_sql("INSERT INTO file (sha256, size, kind) VALUES (encode(sha256('%s-manifest'), 'hex'), 1234, "
	       "'manifest')",
	       name);
	th_sql("INSERT INTO file (sha256, size, kind) VALUES (encode(sha256('%s-ckpt'), 'hex'), 99999, "
	       "'checkpoint')",
	       name);
	th_sql("INSERT INTO dataset (name, n_tokens, manifest_sha256) VALUES ('%s-data', %lld, "
	       "encode(sha256('%s-manifest'), 'hex'))",
	       name, n_tokens, name);
	long long ds = th_sql_int("SELECT id FROM dataset WHERE name = '%s-data'", name);
	th_sql("INSERT INTO file (sha256, size, kind) SELECT encode(sha256(convert_to('%s-shard-' || i, "
	       "'UTF8')), 'hex'), 1000 + i, 'shard' FROM generate_series(0, %d) i",
	       name, n_shards - 1);
	th_sql("INSERT INTO shard (dataset_id, idx, first_token, n_tokens, sha256) SELECT %lld, i, i * %lld, "
	       "%lld, encode(sha256(convert_to('%s-shard-' || i, 'UTF8')), 'hex') FROM generate_series(0, "
	       "%d) i",
	       ds, shard_tokens, shard_tokens, name, n_shards - 1);
	th_sql("INSERT INTO project (name, title, config, dataset_id, seq_len, microbatch_size, "
	       "target_batch, mb_per_epoch, flops_per_sample, wu_seconds) "
	       "VALUES ('%s', 'Project %s', '{\"model\": \"test\"}', %lld, %d, %d, 4096, %lld, %.17g, %d)",
	       name, name, ds, seq_len, microbatch_size, mb_per_epoch, flops_per_sample, wu_seconds);
	long long id = th_sql_int("SELECT id FROM project WHERE name = '%s'", name);
	th_sql("INSERT INTO model_version (project_id, version, checkpoint_sha256) VALUES (%lld, 0, "
	       "encode(sha256('%s-ckpt'), 'hex'))",
	       id, name);
	return id;
}

void th_new_host(const char *tag, double flops, char *account_key, long long *host_id, char *host_token)
{
	char body[512];
	th_resp r;
	int seq = __atomic_add_fetch(&acct_seq, 1, __ATOMIC_SEQ_CST);
	snprintf(body, sizeof body,
	         "{\"email\": \"%s-%d@example.org\", \"name\": \"%s\", \"password\": \"correct horse\"}", tag,
	         seq, tag);
	if (!th_http(NULL, "POST", "/v1/accounts", NULL, body, NULL, &r) || r.status != 201)
		bail_out("could not create an account: %ld %s", r.status, r.body ? r.body : "");
	snprintf(account_key, 64, "%s", th_json_str(&r, "account_key"));
	th_resp_free(&r);
	snprintf(body, sizeof body,
	         "{\"flops\": %.17g, \"cpu_model\": \"Test CPU\", \"cores\": 2, \"memory_bytes\": "
	         "8589934592, "
	         "\"client_version\": \"0.1.0\", \"os_name\": \"Linux\", \"os_version\": \"6.1\"}",
	         flops);
	if (!th_http(NULL, "POST", "/v1/hosts", account_key, body, NULL, &r) || r.status != 201)
		bail_out("could not register a host: %ld %s", r.status, r.body ? r.body : "");
	*host_id = th_json_int(&r, "host_id");
	snprintf(host_token, 64, "%s", th_json_str(&r, "host_token"));
	th_resp_free(&r);
}

char *th_round_fingerprint(void)
{
	char *base = th_db_fingerprint();
	PGresult *r = PQexec(db, "SELECT (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), "
	                         "'') FROM round t)"
	                         " || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') "
	                         "FROM round_report t)"
	                         " || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') "
	                         "FROM round_member t)"
	                         " || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') "
	                         "FROM round_group_sum t)"
	                         " || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') "
	                         "FROM model_version t)"
	                         " || (SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') "
	                         "FROM file t)");
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		bail_out("fingerprint: %s", PQerrorMessage(db));
	size_t n = strlen(base) + (size_t)PQgetlength(r, 0, 0) + 2;
	char *out = malloc(n);
	if (!out)
		bail_out("out of memory");
	snprintf(out, n, "%s%s", base, PQgetvalue(r, 0, 0));
	PQclear(r);
	free(base);
	return out;
}

th_resp th_call(const char *method, const char *path, const char *bearer, const char *body, long status,
                const char *what)
{
	th_resp r;
	if (!th_http(NULL, method, path, bearer, body, NULL, &r))
		bail_out("%s: request failed", what);
	if (!is_int(r.status, status, "%s: %ld", what, status))
		diag("  body: %s", r.body);
	return r;
}

void th_refused(const char *method, const char *path, const char *bearer, const char *body, long status,
                const char *code, const char *what)
{
	char *before = th_round_fingerprint();
	th_resp r;
	if (!th_http(NULL, method, path, bearer, body, NULL, &r))
		bail_out("%s: request failed", what);
	th_is_error(&r, status, code, what);
	char *after = th_round_fingerprint();
	is_str(after, before, "%s: database unchanged", what);
	free(after);
	free(before);
	th_resp_free(&r);
}

static size_t raw_body(char *p, size_t size, size_t n, void *arg)
{
	th_resp *r = arg;
	char *b = realloc(r->body, r->len + size * n + 1);
	if (!b)
		return 0;
	memcpy(b + r->len, p, size * n);
	r->body = b;
	r->len += size * n;
	r->body[r->len] = '\0';
	return size * n;
}

th_resp th_post_raw(const char *path, const char *token, const void *data, size_t len)
{
	th_resp r;
	memset(&r, 0, sizeof r);
	r.content_length = -1;
	CURL *c = curl_easy_init();
	char full[1024], auth[128];
	snprintf(full, sizeof full, "%s%s", url, path);
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
	struct curl_slist *h = curl_slist_append(NULL, auth);
	h = curl_slist_append(h, "Content-Type: application/octet-stream");
	h = curl_slist_append(h, "Expect:");
	curl_easy_setopt(c, CURLOPT_URL, full);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_POST, 1L);
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
	curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, raw_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	CURLcode rc = curl_easy_perform(c);
	if (rc != CURLE_OK)
		bail_out("POST %s failed: %s", path, curl_easy_strerror(rc));
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
	char *ct = NULL;
	curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
	snprintf(r.content_type, sizeof r.content_type, "%s", ct ? ct : "");
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	if (!r.body)
		r.body = strdup("");
	r.json = json_loadb(r.body, r.len, 0, NULL);
	return r;
}

void th_raw_refused(const char *path, const char *token, const void *data, size_t len, long status,
                    const char *code, const char *what)
{
	char *before = th_round_fingerprint();
	th_resp r = th_post_raw(path, token, data, len);
	th_is_error(&r, status, code, what);
	char *after = th_round_fingerprint();
	is_str(after, before, "%s: database unchanged", what);
	free(after);
	free(before);
	th_resp_free(&r);
}

void th_host_new(th_host *h, const char *tag, double flops)
{
	memset(h, 0, sizeof *h);
	th_new_host(tag, flops, h->key, &h->id, h->token);
}

void th_ask_work(th_host *h, const char *project, long long version)
{
	char path[128], body[64];
	snprintf(path, sizeof path, "/v1/projects/%s/work", project);
	snprintf(body, sizeof body, "{\"host_id\": %lld}", h->id);
	th_resp r = th_call("POST", path, h->token, body, 200, "work");
	h->wu = th_json_int(&r, "work_unit_id");
	h->lo = th_json_int(&r, "lo");
	h->hi = th_json_int(&r, "hi");
	is_int(th_json_int(&r, "version"), version, "work unit %lld is for version %lld", h->wu, version);
	th_resp_free(&r);
}

th_resp th_heartbeat(th_host *h, long long mb_done, double sps)
{
	char path[64], body[128];
	snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", h->wu);
	snprintf(body, sizeof body, "{\"mb_done\": %lld, \"samples_per_sec\": %g}", mb_done, sps);
	return th_call("POST", path, h->token, body, 200, "heartbeat");
}

/* Every stream microbatch below the frontier is in exactly one place: a pool
 * range, a live unit, or the finished part of another unit. */
void th_coverage_exact(long long project, const char *what)
{
	char sql[1024];
	snprintf(sql, sizeof sql,
	         "SELECT lo, hi FROM ("
	         " SELECT lo, hi FROM mb_pool WHERE project_id = %lld"
	         " UNION ALL SELECT lo, hi FROM work_unit WHERE project_id = %lld AND state = 'live'"
	         " UNION ALL SELECT lo, lo + mb_done FROM work_unit WHERE project_id = %lld"
	         "   AND state <> 'live' AND mb_done > 0) t ORDER BY lo, hi",
	         project, project, project);
	PGresult *r = PQexec(db, sql);
	long long at = 0;
	bool good = PQresultStatus(r) == PGRES_TUPLES_OK;
	for (int i = 0; good && i < PQntuples(r); i++) {
		long long lo = atoll(PQgetvalue(r, i, 0)), hi = atoll(PQgetvalue(r, i, 1));
		if (lo != at || hi <= lo) {
			diag("  range %d: [%lld, %lld) where %lld was expected", i, lo, hi, at);
			good = false;
		}
		at = hi;
	}
	PQclear(r);
	long long frontier = th_sql_int("SELECT frontier FROM project WHERE id = %lld", project);
	ok(good && at == frontier, "%s: pool + live + done tile [0, %lld) exactly", what, frontier);
}

struct th_bg {
	char url[1024], auth[128];
	pthread_t thread;
	th_resp r;
	int sent, done;
};

static int bg_debug(CURL *c, curl_infotype type, char *data, size_t size, void *arg)
{
	(void)c, (void)data, (void)size;
	if (type == CURLINFO_HEADER_OUT)
		__atomic_store_n(&((th_bg *)arg)->sent, 1, __ATOMIC_SEQ_CST);
	return 0;
}

static void *bg_main(void *arg)
{
	th_bg *b = arg;
	CURL *c = curl_easy_init();
	struct curl_slist *hl = curl_slist_append(NULL, b->auth);
	curl_easy_setopt(c, CURLOPT_URL, b->url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(c, CURLOPT_VERBOSE, 1L);
	curl_easy_setopt(c, CURLOPT_DEBUGFUNCTION, bg_debug);
	curl_easy_setopt(c, CURLOPT_DEBUGDATA, b);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, raw_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &b->r);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &b->r);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 90L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (curl_easy_perform(c) == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &b->r.status);
	else
		b->r.status = -1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	b->r.seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (!b->r.body)
		b->r.body = strdup("");
	b->r.json = json_loadb(b->r.body, b->r.len, 0, NULL);
	curl_slist_free_all(hl);
	curl_easy_cleanup(c);
	__atomic_store_n(&b->sent, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&b->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

th_bg *th_bg_get(const char *path, const char *token)
{
	th_bg *b = calloc(1, sizeof *b);
	if (!b)
		bail_out("out of memory");
	b->r.content_length = -1;
	snprintf(b->url, sizeof b->url, "%s%s", url, path);
	snprintf(b->auth, sizeof b->auth, "Authorization: Bearer %s", token ? token : "");
	if (pthread_create(&b->thread, NULL, bg_main, b))
		bail_out("pthread_create: %s", strerror(errno));
	for (int i = 0; i < 1000 && !__atomic_load_n(&b->sent, __ATOMIC_SEQ_CST); i++)
		usleep(10000);
	if (!__atomic_load_n(&b->sent, __ATOMIC_SEQ_CST))
		bail_out("GET %s was not sent within 10 s", path);
	return b;
}

bool th_bg_done(th_bg *b) { return __atomic_load_n(&b->done, __ATOMIC_SEQ_CST); }

th_resp th_bg_join(th_bg *b)
{
	pthread_join(b->thread, NULL);
	th_resp r = b->r;
	free(b);
	return r;
}
