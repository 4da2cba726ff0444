/* cotrain tests: the content-addressed file store. */
#include "shared/common/filestore.h"
#include "tests/tap.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

/* sha256("abc"), from FIPS 180-2. */
#define SHA_ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
/* sha256 of zero bytes. */
#define SHA_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static char root[64], store[128];

static void rm_rf(const char *path)
{
	char cmd[PATH_MAX + 16];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
	if (system(cmd) != 0)
		diag("could not remove %s", path);
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	if (!d)
		return -1;
	for (struct dirent *e; (e = readdir(d));)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

int main(void)
{
	cot_errbuf eb = { 0 };
	char sha[FS_SHA_HEX_LEN + 1], path[PATH_MAX];
	uint64_t size = 0;

	plan_lazy();
	snprintf(root, sizeof root, "/tmp/cot-fs-XXXXXX");
	if (!mkdtemp(root))
		bail_out("mkdtemp failed");
	snprintf(store, sizeof store, "%s/data/files", root);

	ok(fs_sha_valid(SHA_ABC), "a lowercase hex sha256 is a valid name");
	ok(!fs_sha_valid("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"),
	   "uppercase hex is not a valid name");
	ok(!fs_sha_valid("../../etc/passwd"), "a path is not a valid name");
	ok(!fs_sha_valid(SHA_ABC "0"), "65 digits are not a valid name");

	is_int(fs_path(store, SHA_ABC, path, sizeof path, &eb), COT_OK, "fs_path of a valid name");
	char want[PATH_MAX];
	snprintf(want, sizeof want, "%s/ba/%s", store, SHA_ABC);
	is_str(path, want, "layout is <store>/<aa>/<sha256>");
	is_int(fs_path(store, "nothex", path, sizeof path, &eb), COT_ERR_INVALID,
	       "fs_path rejects a bad name");
	char tiny[16];
	is_int(fs_path(store, SHA_ABC, tiny, sizeof tiny, &eb), COT_ERR_TOO_LARGE,
	       "fs_path reports a short buffer");

	/* Put a buffer: known hash, file in place, no temporary left. */
	is_int(fs_put_buffer(store, "abc", 3, sha, &size, &eb), COT_OK,
	       "fs_put_buffer creates the store and stores");
	is_str(sha, SHA_ABC, "the name is the sha256 of the bytes");
	is_int((long long)size, 3, "the size is reported");
	struct stat st;
	ok(stat(want, &st) == 0 && st.st_size == 3, "the file is at its path");
	ok((st.st_mode & 0777) == 0644, "stored files are mode 0644");
	char tmpdir[PATH_MAX];
	snprintf(tmpdir, sizeof tmpdir, "%s/tmp", store);
	is_int(count_entries(tmpdir), 0, "no temporary file is left behind");

	/* Idempotent. */
	is_int(fs_put_buffer(store, "abc", 3, sha, &size, &eb), COT_OK,
	       "putting the same bytes again succeeds");
	is_str(sha, SHA_ABC, "and gives the same name");
	is_int(count_entries(tmpdir), 0, "still no temporary file");

	is_int(fs_put_buffer(store, "", 0, sha, &size, &eb), COT_OK, "an empty file can be stored");
	is_str(sha, SHA_EMPTY, "the empty file's name");

	/* Streaming writer across many writes equals one buffer. */
	size_t big = 3u << 20;
	unsigned char *buf = malloc(big);
	if (!buf)
		bail_out("out of memory");
	for (size_t i = 0; i < big; i++)
		buf[i] = (unsigned char)(i * 2654435761u >> 13);
	char sha1[FS_SHA_HEX_LEN + 1], sha2[FS_SHA_HEX_LEN + 1];
	ok(fs_put_buffer(store, buf, big, sha1, &size, &eb) == COT_OK && size == big,
	   "a 3 MiB buffer is stored");
	fs_writer *w = NULL;
	cot_err rc = fs_writer_open(store, &w, &eb);
	for (size_t off = 0; !rc && off < big; off += 7777)
		rc = fs_writer_write(w, buf + off, off + 7777 <= big ? 7777 : big - off, &eb);
	if (!rc)
		rc = fs_writer_commit(w, sha2, &size, &eb);
	else
		fs_writer_abort(w);
	is_int(rc, COT_OK, "the same bytes written in 7777-byte pieces");
	is_str(sha2, sha1, "hash the same");

	/* fs_put_file copies a file. */
	char src[PATH_MAX];
	snprintf(src, sizeof src, "%s/src.bin", root);
	FILE *f = fopen(src, "wb");
	if (!f || fwrite(buf, 1, big, f) != big || fclose(f) != 0)
		bail_out("could not write %s", src);
	is_int(fs_put_file(store, src, sha2, &size, &eb), COT_OK, "fs_put_file stores a file");
	is_str(sha2, sha1, "with the hash of its bytes");
	is_int(fs_put_file(store, root, sha2, &size, &eb), COT_ERR_IO, "fs_put_file refuses a directory");
	ok(strstr(eb.msg, "not a regular file") != NULL, "with a clear message: %s", eb.msg);
	char missing[PATH_MAX];
	snprintf(missing, sizeof missing, "%s/missing", root);
	is_int(fs_put_file(store, missing, sha2, &size, &eb), COT_ERR_IO,
	       "fs_put_file of a missing file fails");
	ok(strstr(eb.msg, "could not open file") != NULL, "message: %s", eb.msg);

	/* Aborting leaves nothing. */
	rc = fs_writer_open(store, &w, &eb);
	if (!rc)
		rc = fs_writer_write(w, "zzz", 3, &eb);
	fs_writer_abort(w);
	is_int(count_entries(tmpdir), 0, "an aborted writer leaves no temporary file");

	/* Verify. */
	is_int(fs_verify(store, sha1, &size, &eb), COT_OK, "fs_verify accepts an intact file");
	is_int((long long)size, (long long)big, "and reports its size");
	is_int(fs_verify(store, SHA_ABC "", NULL, &eb), COT_OK, "fs_verify accepts abc");
	char zero[FS_SHA_HEX_LEN + 1];
	memset(zero, '0', FS_SHA_HEX_LEN);
	zero[FS_SHA_HEX_LEN] = '\0';
	is_int(fs_verify(store, zero, NULL, &eb), COT_ERR_NOT_FOUND, "fs_verify reports a missing file");
	is_int(fs_verify(store, "../x", NULL, &eb), COT_ERR_INVALID, "fs_verify rejects a bad name");
	/* Corrupt a stored file. */
	fs_path(store, SHA_ABC, path, sizeof path, &eb);
	chmod(path, 0644);
	f = fopen(path, "wb");
	if (f) {
		fputs("abd", f);
		fclose(f);
	}
	is_int(fs_verify(store, SHA_ABC, NULL, &eb), COT_ERR_CORRUPT, "fs_verify detects a corrupt file");
	ok(strstr(eb.msg, "corrupt") != NULL, "message: %s", eb.msg);

	/* An unwritable store fails cleanly. */
	if (geteuid() != 0) {
		char ro[PATH_MAX];
		snprintf(ro, sizeof ro, "%s/ro", root);
		mkdir(ro, 0555);
		char ro_store[PATH_MAX];
		snprintf(ro_store, sizeof ro_store, "%s/ro/files", root);
		is_int(fs_put_buffer(ro_store, "abc", 3, sha, &size, &eb), COT_ERR_IO,
		       "an unwritable store gives an I/O error");
		ok(strstr(eb.msg, "could not create directory") != NULL, "message: %s", eb.msg);
		chmod(ro, 0755);
	} else {
		skip(2, "running as root: permissions are not enforced");
	}

	free(buf);
	rm_rf(root);
	done_testing();
	return exit_status();
}
