/* cotrain tests: the whole v1 API of cotrain-server through real HTTP
 * against real PostgreSQL: every route's happy path, and every kind of bad
 * input (404, 405, 400, 413, 401, 403, 409), each answered with the JSON
 * error body and leaving the database exactly as it was. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/tap.h"
#include "tests/test_server_harness.h"
#include "tests/pgtmp.h"

/* Send a request that must be refused with status/code and change nothing. */
static void refused(const char *method, const char *path, const char *bearer, const char *body, long status,
                    const char *code, const char *what)
{
	char *before = th_db_fingerprint();
	th_resp r;
	if (!th_http(NULL, method, path, bearer, body, NULL, &r)) {
		ok(false, "%s: request failed", what);
		ok(false, "%s: database unchanged", what);
		free(before);
		return;
	}
	th_is_error(&r, status, code, what);
	char *after = th_db_fingerprint();
	is_str(after, before, "%s: database unchanged", what);
	free(after);
	free(before);
	th_resp_free(&r);
}

/* A request that must succeed with status; returns the answer (caller frees). */
static th_resp call(const char *method, const char *path, const char *bearer, const char *body, long status,
                    const char *what)
{
	th_resp r;
	if (!th_http(NULL, method, path, bearer, body, NULL, &r))
		bail_out("%s: request failed", what);
	if (!is_int(r.status, status, "%s: %ld", what, status))
		diag("  body: %s", r.body);
	return r;
}

/* Send raw bytes to the server and return the status of its answer (0 when
 * none came). */
static int raw_status(const char *request)
{
	const char *u = th_url(), *colon = strrchr(u, ':');
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	int fd = socket(AF_INET, SOCK_STREAM, 0), status = 0;
	char buf[256] = "";
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	    write(fd, request, strlen(request)) == (ssize_t)strlen(request)) {
		ssize_t n = read(fd, buf, sizeof buf - 1);
		if (n > 0) {
			buf[n] = '\0';
			sscanf(buf, "HTTP/1.%*d %d", &status);
		}
	}
	if (fd >= 0)
		close(fd);
	return status;
}

/* A TCP connection to the server from source address src (loopback). */
static int connect_from(const char *src)
{
	const char *u = th_url(), *colon = strrchr(u, ':');
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
	struct sockaddr_in from = { .sin_family = AF_INET };
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	inet_pton(AF_INET, src, &from.sin_addr);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd >= 0 && (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 ||
	                connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* How many of the n connections fds the server has closed since the last
 * look (closed[i] marks those seen closed before; updated). */
static int newly_closed(const int *fds, bool *closed, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++) {
		struct pollfd p = { .fd = fds[i], .events = POLLIN };
		char c;
		if (!closed[i] && poll(&p, 1, 0) == 1 && read(fds[i], &c, 1) <= 0) {
			closed[i] = true;
			k++;
		}
	}
	return k;
}

/* One address may hold --per-ip-connections (64 here) connections; others are
 * served meanwhile.  A body trickled in is cut after the grace (closed:
 * libmicrohttpd cannot answer in the middle of a body). */
static void test_slow_clients(void)
{
	int fds[80], n = 0, refused = 0;
	bool closed[80] = { false };
	for (int i = 0; i < 80; i++) {
		fds[n] = connect_from("127.0.0.2");
		if (fds[n] >= 0)
			n++;
	}
	/* The server closes those past the cap as it accepts them, later in a
	 * slow build (the sanitizers'): look until 16 are closed, for at most
	 * 5 s (the 64 it holds are cut only HTTP_HEAD_TIMEOUT_S, 10 s, after
	 * they came), then once more for any beyond the 16. */
	for (int t = 0; t < 100 && refused < 16; t++) {
		if (t > 0)
			usleep(50000);
		refused += newly_closed(fds, closed, n);
	}
	refused += newly_closed(fds, closed, n);
	ok(n == 80 && refused == 16,
	   "80 idle connections from one address: the 16 past the cap are closed (%d of %d)", refused, n);
	is_int(raw_status("GET /v1/projects HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 200,
	       "another address is served meanwhile");
	for (int i = 0; i < n; i++)
		close(fds[i]);

	int fd = connect_from("127.0.0.3");
	const char *head = "POST /v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	                   "Content-Length: 200\r\n\r\n";
	ok(fd >= 0 && write(fd, head, strlen(head)) == (ssize_t)strlen(head), "a body sent a byte at a time");
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int status = 0;
	char buf[256];
	for (int i = 0; i < 200 && fd >= 0; i++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 500) == 1) {
			ssize_t k = read(fd, buf, sizeof buf - 1);
			if (k > 0) {
				buf[k] = '\0';
				sscanf(buf, "HTTP/1.%*d %d", &status);
			}
			break;
		}
		if (write(fd, "{", 1) != 1)
			break;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	ok(status == 0 && secs > 9 && secs < 15,
	   "is cut (the connection closed) once it falls behind 1 KiB/s after 10 s (after %.1f s)", secs);
	if (fd >= 0)
		close(fd);
}

/* A request head trickled a byte every half second (each byte used to push
 * libmicrohttpd's idle timeout on, holding the connection for good) is cut
 * HTTP_HEAD_TIMEOUT_S (10 s) after the accept (server/http_conns.h); other
 * addresses are answered meanwhile. */
static void test_slow_head(void)
{
	int fd = connect_from("127.0.0.6");
	const char *head = "GET /v1/projects HTTP/1.1\r\nHost: x\r\nX-Slow: ";
	ok(fd >= 0 && write(fd, head, strlen(head)) == (ssize_t)strlen(head),
	   "a request head sent a byte at a time");
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	bool closed = false, served = false;
	char buf[256];
	for (int i = 0; i < 60 && fd >= 0; i++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 500) == 1) {
			closed = read(fd, buf, sizeof buf) <= 0;
			break;
		}
		if (i == 4)
			served = raw_status("GET /v1/projects HTTP/1.1\r\nHost: x\r\nConnection: "
			                    "close\r\n\r\n") == 200;
		if (write(fd, "a", 1) != 1) {
			closed = true;
			break;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	ok(served, "another address is served while the head trickles in");
	ok(closed && secs > 9 && secs < 14,
	   "the connection is closed about 10 s after the accept (after %.1f s)", secs);
	if (fd >= 0)
		close(fd);
}

/* Failed log-ins from one address: past the burst, 429 at once; another
 * address is still answered. */
static void test_login_flood(void)
{
	const char *body = "{\"email\": \"nobody@example.org\", \"password\": \"wrong password\"}";
	char req[512];
	snprintf(req, sizeof req,
	         "POST /v1/accounts/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	         "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
	         strlen(body), body);
	int n401 = 0, n429 = 0, other = 0;
	for (int i = 0; i < 30 + 10; i++) {
		int fd = connect_from("127.0.0.5"), status = 0;
		char buf[256];
		if (fd >= 0 && write(fd, req, strlen(req)) == (ssize_t)strlen(req)) {
			ssize_t k = read(fd, buf, sizeof buf - 1);
			if (k > 0) {
				buf[k] = '\0';
				sscanf(buf, "HTTP/1.%*d %d", &status);
			}
		}
		if (fd >= 0)
			close(fd);
		n401 += status == 401;
		n429 += status == 429;
		other += status != 401 && status != 429;
	}
	ok(n401 >= 30 && n401 <= 30 + 2 && n429 >= 8 && other == 0,
	   "%d failed log-ins from one address: %d answered 401, then %d refused 429 (%d other)", 30 + 10,
	   n401, n429, other);
	th_resp r;
	th_http(NULL, "POST", "/v1/accounts/login", NULL, body, NULL, &r);
	is_int(r.status, 401, "another address still gets its answer");
	th_resp_free(&r);
}

static void test_routing(void)
{
	is_int(raw_status("GET /v1/projects HTTP/1.1\r\nConnection: close\r\n\r\n"), 400,
	       "an HTTP/1.1 request without Host: 400");
	is_int(raw_status("GET /v1/projects HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 200,
	       "the same with Host: 200");
	is_int(raw_status("GET /v1/projects HTTP/1.0\r\n\r\n"), 200, "an HTTP/1.0 request needs no Host");
	th_resp r0;
	th_http(NULL, "DELETE", "/", NULL, NULL, NULL, &r0);
	th_is_error(&r0, 405, "method_not_allowed", "DELETE on the project page");
	is_str(r0.allow, "GET", "405 names GET");
	th_resp_free(&r0);
	refused("GET", "/nope", NULL, NULL, 404, "not_found", "unknown route");
	refused("GET", "/v1/accounts/", NULL, NULL, 404, "not_found", "trailing slash");
	refused("GET", "/v1//account", NULL, NULL, 404, "not_found", "empty segment");
	th_resp r;
	th_http(NULL, "GET", "/v1/accounts", NULL, NULL, NULL, &r);
	th_is_error(&r, 405, "method_not_allowed", "GET on a POST route");
	is_str(r.allow, "POST", "405 names the allowed method");
	th_resp_free(&r);
	refused("DELETE", "/v1/projects", NULL, NULL, 405, "method_not_allowed", "DELETE projects");
	refused("PUT", "/v1/hosts/1", NULL, "{}", 405, "method_not_allowed", "PUT host");
}

static char alice_key[64], bob_key[64];
static long long alice_id;

static void test_accounts(void)
{
	th_resp r = call("POST", "/v1/accounts", NULL,
	                 "{\"email\": \"alice@example.org\", \"name\": \"Alice\", \"password\": \"alice's "
	                 "secret\"}",
	                 201, "create account");
	alice_id = th_json_int(&r, "account_id");
	ok(alice_id > 0, "account id %lld", alice_id);
	const char *k = th_json_str(&r, "account_key");
	ok(k && strlen(k) == 43, "account key is 32 random bytes in base64url");
	snprintf(alice_key, sizeof alice_key, "%s", k ? k : "");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM account_key WHERE account_id = %lld AND key_hash = "
	                  "sha256('%s')",
	                  alice_id, alice_key),
	       1, "only the key's sha256 is stored");
	ok(th_sql_int("SELECT count(*) FROM account WHERE password_hash LIKE 'pbkdf2-sha256$1000$%%' AND id "
	              "= %lld",
	              alice_id) == 1,
	   "password stored as PBKDF2 with the configured iterations");

	r = call("POST", "/v1/accounts", NULL,
	         "{\"email\": \"bob@example.org\", \"name\": \"Bob\", \"password\": \"bob's secret\"}", 201,
	         "create second account");
	snprintf(bob_key, sizeof bob_key, "%s", th_json_str(&r, "account_key"));
	th_resp_free(&r);

	refused("POST", "/v1/accounts", NULL,
	        "{\"email\": \"ALICE@example.org\", \"name\": \"A2\", \"password\": \"whatever123\"}", 409,
	        "already_exists", "email taken (case-insensitive)");
	refused("POST", "/v1/accounts", NULL, "{\"email\": \"c@example.org\", \"name\": \"C\"}", 400,
	        "invalid", "missing password");
	refused("POST", "/v1/accounts", NULL,
	        "{\"email\": \"c@example.org\", \"name\": \"C\", \"password\": \"short\"}", 400, "invalid",
	        "password too short");
	refused("POST", "/v1/accounts", NULL,
	        "{\"email\": 42, \"name\": \"C\", \"password\": \"whatever123\"}", 400, "invalid",
	        "email of the wrong type");
	refused("POST", "/v1/accounts", NULL,
	        "{\"email\": \"no-at-sign\", \"name\": \"C\", \"password\": \"whatever123\"}", 400, "invalid",
	        "email without @");
	refused("POST", "/v1/accounts", NULL,
	        "{\"email\": \"c@example.org\", \"email\": \"d@example.org\", \"name\": \"C\", \"password\": "
	        "\"whatever123\"}",
	        400, "invalid", "duplicate keys");
	refused("POST", "/v1/accounts", NULL, "{\"email\": ", 400, "invalid", "malformed JSON");
	refused("POST", "/v1/accounts", NULL, "[1, 2]", 400, "invalid", "array instead of object");
	refused("POST", "/v1/accounts", NULL, "", 400, "invalid", "empty body");
	size_t big = 100 * 1024;
	/* Head (37 bytes), big x's, tail (30 bytes) and the NUL. */
	char *huge = malloc(big + 128);
	snprintf(huge, big + 128, "{\"email\": \"c@example.org\", \"name\": \"");
	size_t n = strlen(huge);
	memset(huge + n, 'x', big);
	strcpy(huge + n + big, "\", \"password\": \"whatever123\"}");
	refused("POST", "/v1/accounts", NULL, huge, 413, "too_large", "oversized body");
	{
		/* Without Content-Length the limit is enforced while reading. */
		char *before = th_db_fingerprint();
		const char *chunked[] = { "Transfer-Encoding: chunked", NULL };
		th_resp cr;
		th_http(NULL, "POST", "/v1/accounts", NULL, huge, chunked, &cr);
		th_is_error(&cr, 413, "too_large", "oversized chunked body");
		char *after = th_db_fingerprint();
		is_str(after, before, "oversized chunked body: database unchanged");
		free(after);
		free(before);
		th_resp_free(&cr);
	}
	free(huge);

	/* Log in. */
	r = call("POST", "/v1/accounts/login", NULL,
	         "{\"email\": \"Alice@Example.org\", \"password\": \"alice's secret\"}", 200, "log in");
	is_int(th_json_int(&r, "account_id"), alice_id, "log-in names the account");
	char login_key[64];
	snprintf(login_key, sizeof login_key, "%s", th_json_str(&r, "account_key"));
	ok(strcmp(login_key, alice_key) != 0, "each log-in gets a new key");
	th_resp_free(&r);
	refused("POST", "/v1/accounts/login", NULL,
	        "{\"email\": \"alice@example.org\", \"password\": \"wrong password\"}", 401, "unauthorized",
	        "wrong password");
	refused("POST", "/v1/accounts/login", NULL,
	        "{\"email\": \"nobody@example.org\", \"password\": \"alice's secret\"}", 401, "unauthorized",
	        "unknown email");
	refused("POST", "/v1/accounts/login", NULL, "{\"email\": \"alice@example.org\"}", 400, "invalid",
	        "log-in without password");

	r = call("GET", "/v1/account", login_key, NULL, 200, "who am I");
	is_str(th_json_str(&r, "email"), "alice@example.org", "who am I: email");
	ok(r.json && json_is_object(json_object_get(r.json, "prefs")),
	   "who am I: the account's preferences, pushed to its clients");
	th_resp_free(&r);
	refused("GET", "/v1/account", NULL, NULL, 401, "unauthorized", "no Authorization header");
	refused("GET", "/v1/account", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", NULL, 401,
	        "unauthorized", "unknown key");
	refused("GET", "/v1/account", "not a token!", NULL, 401, "unauthorized", "malformed key");

	r = call("POST", "/v1/account/logout", login_key, NULL, 200, "log out");
	th_resp_free(&r);
	refused("GET", "/v1/account", login_key, NULL, 401, "unauthorized", "revoked key");
	refused("POST", "/v1/account/logout", login_key, NULL, 401, "unauthorized", "log out twice");
	r = call("GET", "/v1/account", alice_key, NULL, 200, "other keys still work");
	th_resp_free(&r);

	th_sql("UPDATE account SET disabled = true WHERE id = %lld", alice_id);
	refused("GET", "/v1/account", alice_key, NULL, 401, "unauthorized", "disabled account");
	th_sql("UPDATE account SET disabled = false WHERE id = %lld", alice_id);
}

static void test_teams(void)
{
	th_resp r = call("POST", "/v1/teams", alice_key,
	                 "{\"name\": \"Red Team\", \"description\": \"We compute.\"}", 201, "create team");
	long long team = th_json_int(&r, "team_id");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT team_id FROM account WHERE id = %lld", alice_id), team,
	       "the founder is in the team");
	refused("POST", "/v1/teams", bob_key, "{\"name\": \"red team\"}", 409, "already_exists",
	        "team name taken");
	refused("POST", "/v1/teams", bob_key, "{\"description\": \"x\"}", 400, "invalid",
	        "team without a name");
	refused("POST", "/v1/teams", bob_key, "{\"name\": 7}", 400, "invalid", "team name not a string");
	refused("POST", "/v1/teams", NULL, "{\"name\": \"Blue\"}", 401, "unauthorized",
	        "create team without key");

	char path[64];
	snprintf(path, sizeof path, "/v1/teams/%lld/join", team);
	r = call("POST", path, bob_key, NULL, 200, "join team");
	th_resp_free(&r);
	snprintf(path, sizeof path, "/v1/teams/%lld", team);
	r = call("GET", path, NULL, NULL, 200, "show team");
	is_int(th_json_int(&r, "members"), 2, "team has two members");
	is_str(th_json_str(&r, "name"), "Red Team", "team name");
	th_resp_free(&r);
	refused("GET", "/v1/teams/999999", NULL, NULL, 404, "not_found", "unknown team");
	refused("POST", "/v1/teams/999999/join", bob_key, NULL, 404, "not_found", "join unknown team");
	refused("POST", "/v1/teams/abc/join", bob_key, NULL, 400, "invalid", "join non-numeric team");
	snprintf(path, sizeof path, "/v1/teams/%lld/leave", team);
	r = call("POST", path, bob_key, NULL, 200, "leave team");
	th_resp_free(&r);
	refused("POST", path, bob_key, NULL, 409, "conflict", "leave a team one is not in");
	refused("POST", "/v1/teams/999999/leave", bob_key, NULL, 404, "not_found", "leave unknown team");
}

static long long host_a, host_b;
static char token_a[64], token_b[64];

#define MACHINE \
	"\"machine_id\": \"" \
	"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\""

/* One host per machine and account: registering again with the same
 * machine id (a detach and attach) gives the same host and a new token. */
static void test_host_identity(void)
{
	th_resp r = call("POST", "/v1/hosts", alice_key, "{\"flops\": 1e6, " MACHINE "}", 201,
	                 "register a host with a machine id");
	long long first = th_json_int(&r, "host_id");
	char old_token[64];
	snprintf(old_token, sizeof old_token, "%s", th_json_str(&r, "host_token"));
	ok(json_is_false(json_object_get(r.json, "reused")), "  a new host");
	th_resp_free(&r);
	r = call("POST", "/v1/hosts", alice_key, "{\"flops\": 3e6, \"cores\": 4, " MACHINE "}", 200,
	         "register the same machine again");
	is_int(th_json_int(&r, "host_id"), first, "  the same host comes back");
	ok(json_is_true(json_object_get(r.json, "reused")), "  marked reused");
	ok(strcmp(th_json_str(&r, "host_token"), old_token) != 0, "  with a new token");
	is_int(th_sql_int("SELECT count(*) FROM host WHERE id = %lld AND cores = 4 AND token_hash = "
	                  "sha256('%s')",
	                  first, th_json_str(&r, "host_token")),
	       1, "  the new token and hardware are stored");
	is_int(th_sql_int("SELECT count(*) FROM host WHERE token_hash = sha256('%s')", old_token), 0,
	       "  the old token no longer names a host");
	th_resp_free(&r);
	r = call("POST", "/v1/hosts", bob_key, "{\"flops\": 1e6, " MACHINE "}", 201,
	         "the same machine id under another account");
	ok(th_json_int(&r, "host_id") != first, "  is another host");
	th_resp_free(&r);
	r = call("POST", "/v1/hosts", alice_key, "{\"flops\": 1e6}", 201, "no machine id");
	ok(th_json_int(&r, "host_id") != first, "  is a new host");
	th_resp_free(&r);
	refused("POST", "/v1/hosts", alice_key, "{\"flops\": 1e6, \"machine_id\": \"ABC\"}", 400, "invalid",
	        "a machine id that is not 64 hex digits");
	refused("POST", "/v1/hosts", alice_key, "{\"flops\": 1e6, \"machine_id\": 7}", 400, "invalid",
	        "a machine id that is not a string");
}

static void test_hosts(void)
{
	th_resp r =
	        call("POST", "/v1/hosts", alice_key,
	             "{\"flops\": 1e6, \"cpu_model\": \"Zen 5\", \"cores\": 2, \"memory_bytes\": 8589934592,"
	             " \"gpu\": \"\", \"client_version\": \"0.1.0\", \"os_name\": \"Linux\", \"os_version\": "
	             "\"6.1\"}",
	             201, "register host");
	host_a = th_json_int(&r, "host_id");
	snprintf(token_a, sizeof token_a, "%s", th_json_str(&r, "host_token"));
	ok(host_a > 0 && strlen(token_a) == 43, "host id and token");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM host WHERE id = %lld AND token_hash = sha256('%s')", host_a,
	                  token_a),
	       1, "only the token's sha256 is stored");
	r = call("POST", "/v1/hosts", bob_key, "{\"flops\": 2000000}", 201, "register bob's host");
	host_b = th_json_int(&r, "host_id");
	snprintf(token_b, sizeof token_b, "%s", th_json_str(&r, "host_token"));
	th_resp_free(&r);

	refused("POST", "/v1/hosts", alice_key, "{\"cores\": 2}", 400, "invalid", "host without flops");
	refused("POST", "/v1/hosts", alice_key, "{\"flops\": \"fast\"}", 400, "invalid",
	        "flops not a number");
	refused("POST", "/v1/hosts", alice_key, "{\"flops\": 0}", 400, "invalid", "zero flops");
	refused("POST", "/v1/hosts", alice_key, "{\"flops\": 1e6, \"cores\": 0}", 400, "invalid",
	        "zero cores");
	refused("POST", "/v1/hosts", alice_key, "{\"flops\": 1e6, \"cores\": 1.5}", 400, "invalid",
	        "fractional cores");
	refused("POST", "/v1/hosts", NULL, "{\"flops\": 1e6}", 401, "unauthorized",
	        "host without account key");
	refused("POST", "/v1/hosts", token_a, "{\"flops\": 1e6}", 401, "unauthorized",
	        "host token is not an account key");

	char path[64];
	snprintf(path, sizeof path, "/v1/hosts/%lld", host_a);
	r = call("GET", path, alice_key, NULL, 200, "show own host");
	is_int(th_json_int(&r, "cores"), 2, "host cores");
	is_str(th_json_str(&r, "cpu_model"), "Zen 5", "host cpu model");
	ok(!json_object_get(r.json, "token_hash"), "the token hash is not shown");
	th_resp_free(&r);
	refused("GET", path, bob_key, NULL, 403, "forbidden", "show another account's host");
	refused("DELETE", path, bob_key, NULL, 403, "forbidden", "revoke another account's host");
	refused("GET", "/v1/hosts/999999", alice_key, NULL, 404, "not_found", "unknown host");
	test_host_identity();
}

static void test_projects(void)
{
	th_resp r = call("GET", "/v1/projects", NULL, NULL, 200, "list projects");
	json_t *list = json_object_get(r.json, "projects");
	ok(json_array_size(list) == 2, "two projects listed");
	is_str(json_string_value(json_object_get(json_array_get(list, 0), "name")), "alpha",
	       "first is alpha");
	th_resp_free(&r);

	r = call("GET", "/v1/projects/alpha", NULL, NULL, 200, "project info");
	is_str(th_json_str(&r, "title"), "Project alpha", "title");
	is_int(th_json_int(&r, "target_batch"), 4096, "target batch");
	is_int(th_json_int(&r, "current_version"), 0, "current version");
	is_int(th_json_int(&r, "accumulated_samples"), 0, "nothing accumulated yet");
	const char *man = th_json_str(&r, "dataset.manifest.sha256");
	ok(man && strlen(man) == 64, "dataset manifest sha256");
	const char *murl = th_json_str(&r, "dataset.manifest.url");
	ok(murl && man && strncmp(murl, "/files/", 7) == 0 && strcmp(murl + 7, man) == 0,
	   "manifest URL is /files/<sha256>");
	const char *ck = th_json_str(&r, "checkpoint.sha256");
	ok(ck && strlen(ck) == 64, "current checkpoint sha256");
	is_int(th_json_int(&r, "checkpoint.size"), 99999, "checkpoint size");
	is_str(th_json_str(&r, "config.model"), "test", "project config");
	th_resp_free(&r);
	refused("GET", "/v1/projects/nope", NULL, NULL, 404, "not_found", "unknown project");
}

/* Wait (at most timeout_s) until the SQL scalar equals want. */
static bool wait_for(long long want, int timeout_s, const char *sql)
{
	for (int i = 0; i < timeout_s * 10; i++) {
		if (th_sql_int("%s", sql) == want)
			return true;
		usleep(100000);
	}
	return false;
}

static void test_scheduler(void)
{
	char body[128], path[64];
	snprintf(body, sizeof body, "{\"host_id\": %lld}", host_a);
	/* alpha: wu_seconds 60, flops_per_sample 1e6, microbatch 4: a host of
	 * 1e6 FLOPS gets round(1e6 * 60 / (1e6 * 4)) = 15 microbatches. */
	th_resp r = call("POST", "/v1/projects/alpha/work", token_a, body, 200, "ask for work");
	long long wu1 = th_json_int(&r, "work_unit_id");
	is_int(th_json_int(&r, "lo"), 0, "first range starts at 0");
	is_int(th_json_int(&r, "hi"), 15, "range sized to the host's speed");
	is_int(th_json_int(&r, "version"), 0, "model version");
	ok(th_json_str(&r, "deadline") != NULL, "has a deadline");
	json_t *files = json_object_get(r.json, "files");
	ok(json_array_size(files) == 2, "files: checkpoint and one shard");
	is_str(json_string_value(json_object_get(json_array_get(files, 0), "kind")), "checkpoint",
	       "first file is the checkpoint");
	json_t *sh = json_array_get(files, 1);
	is_str(json_string_value(json_object_get(sh, "kind")), "shard", "second file is a shard");
	is_int(json_integer_value(json_object_get(sh, "idx")), 0, "tokens [0, 961) are in shard 0");
	is_int(json_integer_value(json_object_get(sh, "size")), 1000, "shard size");
	th_resp_free(&r);

	/* The chunk's rest [15, end) went to the pool, where end is the chunk
	 * size cut at the end of epoch 0; the next work unit is its top (the
	 * pool row's hi shrinks: a HOT update). */
	long long chunk_end =
	        th_sql_int("SELECT least(65536, mb_per_epoch) FROM project WHERE name = 'alpha'");
	ok(chunk_end > 30 && chunk_end < 65536, "epoch 0 (%lld microbatches) is shorter than a chunk",
	   chunk_end);
	r = call("POST", "/v1/projects/alpha/work", token_a, body, 200, "ask for more work");
	long long wu2 = th_json_int(&r, "work_unit_id");
	is_int(th_json_int(&r, "lo"), chunk_end - 15, "next range: top of the pool range");
	is_int(th_json_int(&r, "hi"), chunk_end, "next range ends at the chunk's end");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT frontier FROM project WHERE name = 'alpha'"), chunk_end,
	       "the frontier moved by one chunk only, stopping at the end of the epoch");

	snprintf(body, sizeof body, "{\"host_id\": %lld}", host_a);
	refused("POST", "/v1/projects/alpha/work", token_b, body, 403, "forbidden",
	        "work asked with another host's id");
	refused("POST", "/v1/projects/alpha/work", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", body, 401,
	        "unauthorized", "work with an unknown token");
	refused("POST", "/v1/projects/alpha/work", alice_key, body, 401, "unauthorized",
	        "work with an account key");
	refused("POST", "/v1/projects/alpha/work", NULL, body, 401, "unauthorized", "work without a token");
	refused("POST", "/v1/projects/alpha/work", token_a, "{}", 400, "invalid", "work without host_id");
	refused("POST", "/v1/projects/alpha/work", token_a, "{\"host_id\": \"1\"}", 400, "invalid",
	        "host_id as a string");
	refused("POST", "/v1/projects/nope/work", token_a, body, 404, "not_found", "work on unknown project");
	th_sql("UPDATE project SET active = false WHERE name = 'alpha'");
	refused("POST", "/v1/projects/alpha/work", token_a, body, 409, "conflict",
	        "work on inactive project");
	th_sql("UPDATE project SET active = true WHERE name = 'alpha'");

	/* Heartbeats. */
	snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", wu1);
	r = call("POST", path, token_a, "{\"mb_done\": 5, \"samples_per_sec\": 12.5}", 200, "heartbeat");
	is_int(th_json_int(&r, "mb_done"), 5, "heartbeat echoes mb_done");
	is_int(th_json_int(&r, "accumulated_samples"), 20, "accumulated samples = 5 microbatches x 4");
	is_int(th_json_int(&r, "target_batch"), 4096, "heartbeat shows the target");
	th_resp_free(&r);
	/* A heartbeat keeps its unit alive: a deadline a second away moves to
	 * at least wu_seconds (60 s) ahead. */
	th_sql("UPDATE work_unit SET deadline = now() + interval '1 second' WHERE id = %lld", wu1);
	r = call("POST", path, token_a, "{\"mb_done\": 5}", 200, "heartbeat a second before the deadline");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM work_unit WHERE id = %lld"
	                  " AND deadline > now() + interval '50 seconds'",
	                  wu1),
	       1, "the heartbeat pushed the deadline to wu_seconds ahead");
	refused("POST", path, token_b, "{\"mb_done\": 6}", 403, "forbidden",
	        "heartbeat on another host's work unit");
	refused("POST", path, token_a, "{\"mb_done\": 16}", 400, "invalid", "mb_done past the range");
	refused("POST", path, token_a, "{\"mb_done\": 3}", 400, "invalid", "mb_done decreasing");
	refused("POST", path, token_a, "{\"mb_done\": -1}", 400, "invalid", "negative mb_done");
	refused("POST", path, token_a, "{\"mb_done\": \"6\"}", 400, "invalid", "mb_done as a string");
	refused("POST", path, token_a, "{\"samples_per_sec\": 1}", 400, "invalid",
	        "heartbeat without mb_done");
	refused("POST", path, token_a, "{\"mb_done\": 6, \"samples_per_sec\": -2}", 400, "invalid",
	        "negative speed");
	refused("POST", path, NULL, "{\"mb_done\": 6}", 401, "unauthorized", "heartbeat without token");
	refused("POST", "/v1/workunits/999999/heartbeat", token_a, "{\"mb_done\": 1}", 404, "not_found",
	        "heartbeat on unknown work unit");
	refused("POST", "/v1/workunits/x1/heartbeat", token_a, "{\"mb_done\": 1}", 400, "invalid",
	        "non-numeric work unit id");
	refused("GET", path, token_a, NULL, 405, "method_not_allowed", "GET heartbeat");

	/* Hand back the rest of wu1. */
	snprintf(path, sizeof path, "/v1/workunits/%lld/handback", wu1);
	refused("POST", path, token_b, "{\"mb_done\": 7}", 403, "forbidden",
	        "hand back another host's work unit");
	r = call("POST", path, token_a, "{\"mb_done\": 7}", 200, "hand back");
	is_str(th_json_str(&r, "state"), "returned", "state returned");
	is_int(th_json_int(&r, "returned_lo"), 7, "returned from 7");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM mb_pool WHERE lo = 7 AND hi = 15"), 1,
	       "rest [7, 15) is in the pool");
	/* The same hand-back again (a client that died before it journaled our
	 * answer): 200, the same body, nothing pooled twice.  Another mb_done
	 * conflicts. */
	r = call("POST", path, token_a, "{\"mb_done\": 7}", 200, "the same hand-back again is idempotent");
	is_str(th_json_str(&r, "state"), "returned", "repeat: state returned");
	is_int(th_json_int(&r, "returned_lo"), 7, "repeat: returned from 7");
	is_int(th_json_int(&r, "mb_done"), 7, "repeat: mb_done 7");
	th_resp_free(&r);
	is_int(th_sql_int("SELECT count(*) FROM mb_pool WHERE lo = 7 AND hi = 15"), 1,
	       "the rest is pooled once");
	refused("POST", path, token_a, "{\"mb_done\": 8}", 409, "conflict",
	        "hand back again with another mb_done");
	refused("POST", path, token_b, "{\"mb_done\": 7}", 403, "forbidden",
	        "another host repeating the hand-back");
	snprintf(path, sizeof path, "/v1/workunits/%lld/finish", wu1);
	refused("POST", path, token_a, NULL, 409, "conflict", "finish a returned work unit");
	snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", wu1);
	refused("POST", path, token_a, "{\"mb_done\": 7}", 409, "conflict",
	        "heartbeat on a returned work unit");

	/* Finish wu2. */
	snprintf(path, sizeof path, "/v1/workunits/%lld/finish", wu2);
	refused("POST", path, token_b, NULL, 403, "forbidden", "finish another host's work unit");
	refused("POST", path, token_a, "{not json", 400, "invalid", "finish with malformed body");
	r = call("POST", path, token_a, NULL, 200, "finish");
	is_str(th_json_str(&r, "state"), "done", "state done");
	is_int(th_json_int(&r, "mb_done"), 15, "whole range done");
	is_int(th_json_int(&r, "accumulated_samples"), (7 + 15) * 4, "accumulated (7 + 15) x 4 samples");
	th_resp_free(&r);
	r = call("POST", path, token_a, NULL, 200, "finish twice is idempotent");
	is_str(th_json_str(&r, "state"), "done", "repeat: state done");
	is_int(th_json_int(&r, "mb_done"), 15, "repeat: whole range done");
	is_int(th_json_int(&r, "accumulated_samples"), (7 + 15) * 4, "repeat: nothing counted twice");
	th_resp_free(&r);
	snprintf(path, sizeof path, "/v1/workunits/%lld/handback", wu2);
	refused("POST", path, token_a, "{\"mb_done\": 15}", 409, "conflict",
	        "hand back a finished work unit");
	snprintf(path, sizeof path, "/v1/workunits/%lld/finish", wu2);
	is_int(th_sql_int("SELECT sum(mb_done) * 4 FROM work_unit w JOIN project p ON p.id = w.project_id"
	                  " WHERE p.name = 'alpha' AND w.version = 0"),
	       88, "SQL sum agrees");
	r = call("GET", "/v1/projects/alpha", NULL, NULL, 200, "project info after work");
	is_int(th_json_int(&r, "accumulated_samples"), 88, "project info shows accumulated samples");
	th_resp_free(&r);

	/* The returned rest is handed out again, before new microbatches. */
	r = call("POST", "/v1/projects/alpha/work", token_a, body, 200, "work after hand-back");
	is_int(th_json_int(&r, "lo"), 7, "returned rest reissued: lo");
	is_int(th_json_int(&r, "hi"), 15, "returned rest reissued: hi");
	th_resp_free(&r);

	/* A revoked host can no longer work. */
	snprintf(path, sizeof path, "/v1/hosts/%lld", host_a);
	r = call("DELETE", path, alice_key, NULL, 200, "revoke host");
	th_resp_free(&r);
	refused("POST", "/v1/projects/alpha/work", token_a, body, 401, "unauthorized",
	        "work with a revoked host");

	/* Deadlines: beta has wu_seconds 1, so a silent work unit is overdue
	 * after 2 s and the reaper (every second) puts its rest back. */
	snprintf(body, sizeof body, "{\"host_id\": %lld}", host_b);
	r = call("POST", "/v1/projects/beta/work", token_b, body, 200, "work on beta");
	long long wu3 = th_json_int(&r, "work_unit_id");
	long long lo3 = th_json_int(&r, "lo"), hi3 = th_json_int(&r, "hi");
	th_resp_free(&r);
	snprintf(path, sizeof path, "/v1/workunits/%lld/heartbeat", wu3);
	r = call("POST", path, token_b, "{\"mb_done\": 1}", 200, "one heartbeat, then silence");
	th_resp_free(&r);
	char sql[200];
	snprintf(sql, sizeof sql, "SELECT count(*) FROM work_unit WHERE id = %lld AND state = 'expired'",
	         wu3);
	ok(wait_for(1, 20, sql), "silent work unit expired by the reaper");
	/* Its finished microbatch is in no gradient the host can still report
	 * (it drops the gradient when it hears of the expiry): all of the
	 * range goes back, and the version's progress forgets it. */
	is_int(th_sql_int("SELECT count(*) FROM mb_pool p JOIN project j ON j.id = p.project_id"
	                  " WHERE j.name = 'beta' AND p.lo = %lld AND p.hi = %lld",
	                  lo3, hi3),
	       1, "its whole range is back in the pool");
	is_int(th_sql_int("SELECT mb_done FROM work_unit WHERE id = %lld", wu3), 0,
	       "the expired unit counts no microbatch");
	refused("POST", path, token_b, "{\"mb_done\": 2}", 409, "conflict", "heartbeat after expiry");
	r = call("POST", "/v1/projects/beta/work", token_b, body, 200, "work on beta again");
	is_int(th_json_int(&r, "lo"), lo3, "expired range reissued");
	th_resp_free(&r);
}

/* The database drops every server connection: each worker reconnects on
 * its next request, which still succeeds. */
static void test_reconnect(void)
{
	th_resp r = call("GET", "/v1/projects/alpha", NULL, NULL, 200, "before the connections drop");
	th_resp_free(&r);
	long long killed = th_sql_int("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
	                              " WHERE pid <> pg_backend_pid() AND datname = current_database()"
	                              "   AND backend_type = 'client backend'");
	ok(killed >= 1, "terminated %lld server connections", killed);
	int good = 0;
	for (int i = 0; i < 12; i++) {
		th_http(NULL, "GET", "/v1/projects/alpha", NULL, NULL, NULL, &r);
		good += r.status == 200;
		th_resp_free(&r);
	}
	is_int(good, 12, "every request after the drop succeeded");
}

static void test_schema_refusal(void)
{
	th_sql("CREATE DATABASE empty");
	char cmd[2048];
	const char *top = getenv("top_builddir");
	snprintf(cmd, sizeof cmd,
	         "%s/server/cotrain-server --port 0 --data-dir %s --db '%s dbname=empty' 2>&1",
	         top ? top : ".", th_data_dir(), pgtmp_conninfo());
	FILE *p = popen(cmd, "r");
	char out[4096] = "";
	size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
	out[n] = '\0';
	int st = p ? pclose(p) : -1;
	ok(st != 0, "server refuses an unmigrated database");
	ok(strstr(out, "cotrain-admin db migrate") != NULL, "with the hint to migrate");
	if (!strstr(out, "cotrain-admin db migrate"))
		diag("output: %s", out);
}

int main(void)
{
	plan_lazy();
	const char *args[] = { "--reap-interval",   "1",  "--threads", "4", "--per-ip-connections", "64",
		               "--auth-per-minute", "30", NULL };
	th_start(args);
	th_seed_project("alpha", 60, 1e6, 4, 16, 8, 1000);
	th_seed_project("beta", 1, 1e5, 4, 16, 8, 1000); /* bob's host: 5 microbatches */

	test_routing();
	test_slow_clients();
	test_slow_head();
	test_login_flood();
	test_accounts();
	test_teams();
	test_hosts();
	test_projects();
	test_scheduler();
	test_reconnect();
	test_schema_refusal();
	ok(th_stop_server(), "server exits 0 on SIGTERM");
	return exit_status();
}
