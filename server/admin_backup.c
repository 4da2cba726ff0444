/* cotrain-admin backup and restore (doc/backup.md).
 *
 * A backup folder holds db.dump (pg_dump's custom format, taken from one
 * snapshot of the running database), files/<aa>/<sha256> (every file that
 * snapshot names: hard links into the store when on the same file system,
 * else copies, each checked by sha256) and, written last, backup.json, whose
 * presence says the backup is whole.  While it runs the backup holds the file
 * store collector's lock (server/file_gc.h), so no file the snapshot names
 * is removed before it is copied; files stored after the snapshot are not
 * needed and not copied. */
#include "server/admin.h"
#include "server/file_gc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shared/common/filestore.h"
#include "shared/common/hash.h"
#include "shared/database/pgcluster.h"

static const char backup_usage[] =
        "usage: cotrain-admin backup DIR\n"
        "\n"
        "Writes a consistent backup of the server's database and of every file it names into\n"
        "DIR (a new or empty folder), while the server runs: DIR/db.dump (pg_dump, one\n"
        "snapshot), DIR/files/ (hard links into the store when on the same file system, else\n"
        "copies, each checked by sha256) and, last, DIR/backup.json.\n";

static const char restore_usage[] =
        "usage: cotrain-admin [--data-dir NEW] [--db CONNINFO] restore DIR\n"
        "\n"
        "Restores the backup in DIR into the data folder NEW, which must be new or empty: its\n"
        "files (each checked by sha256) and the database, into a fresh private cluster in\n"
        "NEW/pg, or with --db into an empty database.  Then start cotrain-server on NEW.\n";

/* The folder exists and is empty, or does not exist (then it is created). */
static int new_or_empty_dir(const char *dir, const char *what)
{
	DIR *d = opendir(dir);
	if (!d) {
		if (errno != ENOENT)
			return admin_failf("could not open folder \"%s\": %s", dir, strerror(errno));
		if (mkdir(dir, 0755) != 0)
			return admin_failf("could not create folder \"%s\": %s", dir, strerror(errno));
		return ADMIN_OK;
	}
	struct dirent *e;
	bool empty = true;
	while (empty && (e = readdir(d)))
		empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
	closedir(d);
	if (!empty) {
		fprintf(stderr,
		        "cotrain-admin: error: cannot %s into \"%s\": the folder is not empty\n"
		        "cotrain-admin: hint: Name a new folder, or empty this one first.\n",
		        what, dir);
		return ADMIN_FAIL;
	}
	return ADMIN_OK;
}

/* Run a program (argv[0] a full path) and wait for it.  ADMIN_OK when it
 * exits 0. */
static int run_prog(char *const *argv)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		return admin_failf("could not start %s: %s", argv[0], strerror(errno));
	if (pid == 0) {
		execv(argv[0], argv);
		fprintf(stderr, "cotrain-admin: error: could not run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return admin_failf("could not wait for %s: %s", argv[0], strerror(errno));
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return admin_failf("%s failed (%s %d)", argv[0], WIFEXITED(st) ? "exit status" : "signal",
		                   WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return ADMIN_OK;
}

/* Copy src to dst (a new file), synced.  COT_ERR_IO. */
static cot_err copy_bytes(const char *src, const char *dst, cot_errbuf *eb)
{
	int in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not open \"%s\": %s", src, strerror(errno));
	int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (out < 0) {
		close(in);
		return cot_seterr(eb, COT_ERR_IO, "could not create \"%s\": %s", dst, strerror(errno));
	}
	char buf[1 << 16];
	cot_err rc = COT_OK;
	for (;;) {
		ssize_t n = read(in, buf, sizeof buf);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = cot_seterr(eb, COT_ERR_IO, "could not read \"%s\": %s", src, strerror(errno));
			break;
		}
		if (n == 0)
			break;
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(out, buf + off, (size_t)(n - off));
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0) {
				rc = cot_seterr(eb, COT_ERR_IO, "could not write \"%s\": %s", dst,
				                strerror(errno));
				break;
			}
			off += w;
		}
		if (rc)
			break;
	}
	if (!rc && fsync(out) != 0)
		rc = cot_seterr(eb, COT_ERR_IO, "could not sync \"%s\": %s", dst, strerror(errno));
	close(in);
	close(out);
	if (rc)
		unlink(dst);
	return rc;
}

/* Put the stored file named sha from store `from` into store `to`: a hard
 * link, else (another file system, or links refused) a copy; then check its
 * bytes hash to sha.  *linked says which; *size gets its bytes.
 * COT_ERR_NOT_FOUND when from has no such file. */
static cot_err transfer(const char *from, const char *to, const char *sha, bool *linked, uint64_t *size,
                        cot_errbuf *eb)
{
	char src[1024], dst[1024], dir[1024];
	cot_err rc;
	if ((rc = fs_path(from, sha, src, sizeof src, eb)) || (rc = fs_path(to, sha, dst, sizeof dst, eb)))
		return rc;
	snprintf(dir, sizeof dir, "%s/%.2s", to, sha);
	if (mkdir(to, 0755) != 0 && errno != EEXIST)
		return cot_seterr(eb, COT_ERR_IO, "could not create folder \"%s\": %s", to, strerror(errno));
	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		return cot_seterr(eb, COT_ERR_IO, "could not create folder \"%s\": %s", dir, strerror(errno));
	if (access(src, F_OK) != 0)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "file %s is missing from \"%s\"", sha, from);
	*linked = link(src, dst) == 0;
	if (!*linked && errno == EEXIST)
		*linked = true; /* named twice: already here */
	else if (!*linked && (rc = copy_bytes(src, dst, eb)))
		return rc;
	rc = fs_verify(to, sha, size, eb);
	if (rc == COT_ERR_CORRUPT)
		cot_sethint(eb, "The store's copy in \"%s\" is damaged.", from);
	return rc;
}

static int backup_cmd(admin_ctx *ctx, int argc, char **argv)
{
	if (argc != 2)
		return admin_usage(backup_usage, "backup: give one DIR");
	const char *dir = argv[1];
	if (strlen(dir) > 300)
		return admin_failf("backup folder path is too long");
	if (admin_connect(ctx, true) || new_or_empty_dir(dir, "back up"))
		return ADMIN_FAIL;
	char files[400], dump[400], meta[400], tmp[420];
	snprintf(files, sizeof files, "%s/files", dir);
	snprintf(dump, sizeof dump, "%s/db.dump", dir);
	snprintf(meta, sizeof meta, "%s/backup.json", dir);
	snprintf(tmp, sizeof tmp, "%s/.backup.json.tmp", dir);

	cot_errbuf eb = { "", "" };
	static const char *const key[1] = { FGC_LOCK_KEY };
	PGresult *r = admin_exec(ctx, "SELECT pg_advisory_lock($1::bigint)", 1, key, &eb);
	if (!r)
		return admin_fail(&eb);
	PQclear(r);
	int ret = ADMIN_FAIL;
	bool in_tx = false;
	PGresult *list = NULL;
	if (!(r = admin_exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL, &eb)))
		goto fail;
	PQclear(r);
	in_tx = true;
	if (!(r = admin_exec(ctx, "SELECT pg_export_snapshot(), current_setting('server_version_num')", 0,
	                     NULL, &eb)))
		goto fail;
	char snapshot[128];
	snprintf(snapshot, sizeof snapshot, "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	/* every file the snapshot names: the indexed ones must be there, the
	 * group sums and gradients of rounds in flight are taken when present */
	if (!(list = admin_exec(ctx,
	                        "SELECT s, EXISTS (SELECT 1 FROM file f WHERE f.sha256 = s)"
	                        "  FROM file_gc_referenced() s ORDER BY 1",
	                        0, NULL, &eb)))
		goto fail;

	char bin[600], snaparg[160], filearg[420];
	snprintf(bin, sizeof bin, "%s/pg_dump", pgc_bindir());
	snprintf(snaparg, sizeof snaparg, "--snapshot=%s", snapshot);
	snprintf(filearg, sizeof filearg, "--file=%s", dump);
	char *dargv[] = { bin,     "--format=custom", "--no-owner", "--no-privileges",
		          snaparg, filearg,           "--dbname",   (char *)ctx->target.conninfo,
		          NULL };
	if (run_prog(dargv))
		goto out;

	long n = 0, nlinked = 0;
	uint64_t bytes = 0;
	for (int i = 0; i < PQntuples(list); i++) {
		const char *sha = PQgetvalue(list, i, 0);
		bool indexed = PQgetvalue(list, i, 1)[0] == 't', linked = false;
		uint64_t size = 0;
		cot_err rc = transfer(ctx->store_dir, files, sha, &linked, &size, &eb);
		if (rc == COT_ERR_NOT_FOUND && !indexed)
			continue;
		if (rc)
			goto fail;
		n++;
		nlinked += linked;
		bytes += size;
	}
	char dsha[HASH_SHA256_HEX_LEN + 1];
	long long dsize = 0;
	if (hash_file_sha256_hex(dump, dsha, &dsize, &eb))
		goto fail;
	FILE *f = fopen(tmp, "w");
	if (!f) {
		admin_failf("could not create \"%s\": %s", tmp, strerror(errno));
		goto out;
	}
	fprintf(f,
	        "{\"format\": 1, \"schema_version\": %d, \"created_at\": %lld, \"dump\": \"db.dump\",\n"
	        " \"dump_sha256\": \"%s\", \"dump_bytes\": %lld, \"files\": %ld, \"file_bytes\": %" PRIu64
	        "}\n",
	        db_schema_version(ctx->db, &eb), (long long)time(NULL), dsha, dsize, n, bytes);
	if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0 || rename(tmp, meta) != 0) {
		admin_failf("could not write \"%s\": %s", meta, strerror(errno));
		goto out;
	}
	printf("backed up the database (%lld bytes) and %ld files (%" PRIu64
	       " bytes, %ld hard-linked) to \"%s\"\n",
	       dsize, n, bytes, nlinked, dir);
	ret = ADMIN_OK;
	goto out;
fail:
	admin_fail(&eb);
out:
	PQclear(list);
	if (in_tx)
		admin_rollback(ctx);
	PQclear(admin_exec(ctx, "SELECT pg_advisory_unlock($1::bigint)", 1, key, &eb));
	if (ret != ADMIN_OK)
		fprintf(stderr, "cotrain-admin: hint: \"%s\" holds an incomplete backup (no backup.json).\n",
		        dir);
	return ret;
}

/* Walk the backup's files/ and put each into the new store, checked. */
static int restore_files(const char *from, const char *to, long *n, uint64_t *bytes)
{
	cot_errbuf eb = { "", "" };
	DIR *top = opendir(from);
	if (!top)
		return errno == ENOENT ? ADMIN_OK
		                       : admin_failf("could not open \"%s\": %s", from, strerror(errno));
	struct dirent *e;
	int ret = ADMIN_OK;
	while (ret == ADMIN_OK && (e = readdir(top))) {
		if (e->d_name[0] == '.')
			continue;
		char sub[700];
		snprintf(sub, sizeof sub, "%s/%s", from, e->d_name);
		DIR *d = opendir(sub);
		if (!d || strlen(e->d_name) != 2) {
			if (d)
				closedir(d);
			ret = admin_failf("unexpected entry \"%s\" in the backup", sub);
			break;
		}
		struct dirent *f;
		while (ret == ADMIN_OK && (f = readdir(d))) {
			if (f->d_name[0] == '.')
				continue;
			bool linked;
			uint64_t size;
			if (!fs_sha_valid(f->d_name) || strncmp(f->d_name, e->d_name, 2) != 0)
				ret = admin_failf("unexpected file \"%s/%s\" in the backup", sub, f->d_name);
			else if (transfer(from, to, f->d_name, &linked, &size, &eb))
				ret = admin_fail(&eb);
			else
				(*n)++, *bytes += size;
		}
		closedir(d);
	}
	closedir(top);
	return ret;
}

static int restore_cmd(admin_ctx *ctx, int argc, char **argv)
{
	if (argc != 2)
		return admin_usage(restore_usage, "restore: give one DIR");
	const char *dir = argv[1];
	if (strlen(dir) > 300)
		return admin_failf("backup folder path is too long");
	char files[400], dump[400], meta[400];
	snprintf(files, sizeof files, "%s/files", dir);
	snprintf(dump, sizeof dump, "%s/db.dump", dir);
	snprintf(meta, sizeof meta, "%s/backup.json", dir);
	struct stat st;
	if (stat(meta, &st) != 0 || stat(dump, &st) != 0) {
		fprintf(stderr,
		        "cotrain-admin: error: \"%s\" is not a complete backup: %s is missing\n"
		        "cotrain-admin: hint: A backup is whole only once backup.json is written.\n",
		        dir, stat(meta, &st) != 0 ? "backup.json" : "db.dump");
		return ADMIN_FAIL;
	}
	if (new_or_empty_dir(ctx->data_dir, "restore"))
		return ADMIN_FAIL;
	long n = 0;
	uint64_t bytes = 0;
	if (restore_files(files, ctx->store_dir, &n, &bytes) || admin_connect(ctx, false))
		return ADMIN_FAIL;
	cot_errbuf eb = { "", "" };
	PGresult *r =
	        admin_exec(ctx,
	                   "SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace"
	                   " WHERE s.nspname = 'public'",
	                   0, NULL, &eb);
	if (!r)
		return admin_fail(&eb);
	bool empty = strcmp(PQgetvalue(r, 0, 0), "0") == 0;
	PQclear(r);
	if (!empty) {
		fprintf(stderr, "cotrain-admin: error: cannot restore into a database that is not empty\n"
		                "cotrain-admin: hint: Create a new database and name it with --db.\n");
		return ADMIN_FAIL;
	}
	char bin[600];
	snprintf(bin, sizeof bin, "%s/pg_restore", pgc_bindir());
	char *rargv[] = { bin,
		          "--no-owner",
		          "--no-privileges",
		          "--exit-on-error",
		          "--single-transaction",
		          "--dbname",
		          (char *)ctx->target.conninfo,
		          dump,
		          NULL };
	if (run_prog(rargv))
		return ADMIN_FAIL;
	/* every file the restored database indexes must now be in the store */
	if (!(r = admin_exec(ctx, "SELECT sha256, size FROM file ORDER BY 1", 0, NULL, &eb)))
		return admin_fail(&eb);
	for (int i = 0; i < PQntuples(r); i++) {
		uint64_t size;
		if (fs_verify(ctx->store_dir, PQgetvalue(r, i, 0), &size, &eb) ||
		    (size != strtoull(PQgetvalue(r, i, 1), NULL, 10) &&
		     cot_seterr(&eb, COT_ERR_CORRUPT, "file %s has the wrong size", PQgetvalue(r, i, 0)))) {
			PQclear(r);
			cot_sethint(&eb, "The backup is incomplete or damaged; the restored folder is not "
			                 "usable.");
			return admin_fail(&eb);
		}
	}
	PQclear(r);
	int v = db_schema_version(ctx->db, &eb);
	printf("restored the database (schema version %d) and %ld files (%" PRIu64 " bytes) into \"%s\"\n", v,
	       n, bytes, ctx->data_dir);
	if (db_schema_check(ctx->db, &eb))
		printf("%s\nrun cotrain-admin db migrate before starting the server\n", eb.msg);
	return ADMIN_OK;
}

int admin_backup_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(backup_usage, stdout);
		return ADMIN_OK;
	}
	return backup_cmd(ctx, argc, argv);
}

int admin_restore_main(admin_ctx *ctx, int argc, char **argv)
{
	if (admin_wants_help(argc, argv)) {
		fputs(restore_usage, stdout);
		return ADMIN_OK;
	}
	return restore_cmd(ctx, argc, argv);
}
