/* cotrain tests: GET/HEAD /files/<sha256> of cotrain-server: whole files,
 * single byte ranges (206, 416), ETag and If-None-Match (304), HEAD, 404 for
 * unknown names and 400 for names that are not 64 lowercase hex digits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/filestore.h"
#include "tests/tap.h"
#include "tests/test_server_harness.h"

int main(void)
{
	plan_lazy();
	th_start(NULL);

	/* A 100 000-byte file in the store, bytes i % 251. */
	size_t size = 100000;
	unsigned char *data = malloc(size);
	for (size_t i = 0; i < size; i++)
		data[i] = (unsigned char)(i % 251);
	char store[512], sha[FS_SHA_HEX_LEN + 1];
	snprintf(store, sizeof store, "%s/files", th_data_dir());
	cot_errbuf eb = { "", "" };
	if (fs_put_buffer(store, data, size, sha, NULL, &eb))
		bail_out("could not store a file: %s", eb.msg);
	char path[128], etag[80];
	snprintf(path, sizeof path, "/files/%s", sha);
	snprintf(etag, sizeof etag, "\"%s\"", sha);

	th_resp r;
	th_http(NULL, "GET", path, NULL, NULL, NULL, &r);
	is_int(r.status, 200, "GET whole file");
	ok(r.len == size && memcmp(r.body, data, size) == 0, "whole file bytes");
	is_str(r.etag, etag, "ETag is the quoted sha256");
	is_str(r.content_type, "application/octet-stream", "content type");
	th_resp_free(&r);

	const char *range1[] = { "Range: bytes=1000-1999", NULL };
	th_http(NULL, "GET", path, NULL, NULL, range1, &r);
	is_int(r.status, 206, "range a-b: 206");
	ok(r.len == 1000 && memcmp(r.body, data + 1000, 1000) == 0, "range a-b bytes");
	is_str(r.content_range, "bytes 1000-1999/100000", "Content-Range");
	th_resp_free(&r);

	const char *range2[] = { "Range: bytes=99990-", NULL };
	th_http(NULL, "GET", path, NULL, NULL, range2, &r);
	is_int(r.status, 206, "open range: 206");
	ok(r.len == 10 && memcmp(r.body, data + 99990, 10) == 0, "open range bytes");
	is_str(r.content_range, "bytes 99990-99999/100000", "open range Content-Range");
	th_resp_free(&r);

	const char *range3[] = { "Range: bytes=-7", NULL };
	th_http(NULL, "GET", path, NULL, NULL, range3, &r);
	is_int(r.status, 206, "suffix range: 206");
	ok(r.len == 7 && memcmp(r.body, data + size - 7, 7) == 0, "suffix range bytes");
	th_resp_free(&r);

	const char *range4[] = { "Range: bytes=99000-200000", NULL };
	th_http(NULL, "GET", path, NULL, NULL, range4, &r);
	is_int(r.status, 206, "range past the end is clipped");
	is_int((long long)r.len, 1000, "clipped length");
	th_resp_free(&r);

	const char *range5[] = { "Range: bytes=100000-", NULL };
	th_http(NULL, "GET", path, NULL, NULL, range5, &r);
	th_is_error(&r, 416, "range_not_satisfiable", "range starting at the end");
	is_str(r.content_range, "bytes */100000", "416 Content-Range names the size");
	th_resp_free(&r);

	const char *range6[] = { "Range: bytes=0-1,5-6", NULL };
	th_http(NULL, "GET", path, NULL, NULL, range6, &r);
	is_int(r.status, 200, "several ranges: the whole file");
	is_int((long long)r.len, (long long)size, "several ranges: all bytes");
	th_resp_free(&r);

	char inm[120];
	snprintf(inm, sizeof inm, "If-None-Match: %s", etag);
	const char *cond[] = { inm, NULL };
	th_http(NULL, "GET", path, NULL, NULL, cond, &r);
	is_int(r.status, 304, "If-None-Match with the ETag: 304");
	is_int((long long)r.len, 0, "304 has no body");
	is_str(r.etag, etag, "304 carries the ETag");
	th_resp_free(&r);
	const char *cond2[] = { "If-None-Match: \"0000\"", NULL };
	th_http(NULL, "GET", path, NULL, NULL, cond2, &r);
	is_int(r.status, 200, "If-None-Match with another tag: 200");
	th_resp_free(&r);

	th_http(NULL, "HEAD", path, NULL, NULL, NULL, &r);
	is_int(r.status, 200, "HEAD");
	is_int(r.content_length, (long long)size, "HEAD Content-Length");
	is_int((long long)r.len, 0, "HEAD has no body");
	is_str(r.etag, etag, "HEAD ETag");
	th_resp_free(&r);

	char unknown[128];
	snprintf(unknown, sizeof unknown, "/files/%064d", 0);
	th_http(NULL, "GET", unknown, NULL, NULL, NULL, &r);
	th_is_error(&r, 404, "not_found", "unknown file");
	th_resp_free(&r);
	th_http(NULL, "GET", "/files/xyz", NULL, NULL, NULL, &r);
	th_is_error(&r, 400, "invalid", "non-hex name");
	th_resp_free(&r);
	char upper[128];
	snprintf(upper, sizeof upper, "/files/%s", sha);
	for (char *p = upper + 7; *p; p++)
		if (*p >= 'a' && *p <= 'f')
			*p = (char)(*p - 'a' + 'A');
	th_http(NULL, "GET", upper, NULL, NULL, NULL, &r);
	th_is_error(&r, 400, "invalid", "uppercase hex name");
	th_resp_free(&r);
	th_http(NULL, "GET", "/files/..%2f..%2fetc%2fpasswd", NULL, NULL, NULL, &r);
	th_is_error(&r, 404, "not_found", "path traversal attempt (decoded into more segments)");
	th_resp_free(&r);
	th_http(NULL, "POST", path, NULL, "{}", NULL, &r);
	th_is_error(&r, 405, "method_not_allowed", "POST a file");
	th_resp_free(&r);

	free(data);
	ok(th_stop_server(), "server exits 0 on SIGTERM");
	return exit_status();
}
