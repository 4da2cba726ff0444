/* cotrain: the file store's garbage collector (see file_gc.h). */
#include "server/file_gc.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shared/common/filestore.h"
#include "shared/database/db.h"

/* A sorted set of names (65 bytes each). */
typedef struct {
	char (*v)[FS_SHA_HEX_LEN + 1];
	size_t n;
} name_set;

static int name_cmp(const void *a, const void *b) { return strcmp(a, b); }

static bool name_set_has(const name_set *s, const char *sha)
{
	return s->n && bsearch(sha, s->v, s->n, sizeof *s->v, name_cmp) != NULL;
}

static cot_err exec_ok(PGconn *db, const char *sql, int n, const char *const *params, PGresult **out,
                       cot_errbuf *eb)
{
	PGresult *r = PQexecParams(db, sql, n, NULL, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);
	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
		cot_err rc = r ? db_result_error(r, eb, "file store collection failed")
		               : cot_seterr(eb, COT_ERR_DB, "could not run query: %s", PQerrorMessage(db));
		PQclear(r);
		return rc;
	}
	if (out)
		*out = r;
	else
		PQclear(r);
	return COT_OK;
}

/* True when the file's time is within the grace period. */
static bool fresh(const struct stat *st, int grace_s)
{
	return (long long)st->st_mtime + grace_s > (long long)time(NULL);
}

/* Remove the file at path, unless it is (or, because a writer just stored
 * the same bytes again, becomes) younger than the grace period: it is
 * renamed aside first and put back when its time is fresh.  Sets *gone when
 * it was removed.  COT_ERR_IO when it could not be. */
static cot_err remove_aside(const char *store, const char *path, const char *name, int grace_s, bool *gone,
                            cot_errbuf *eb)
{
	char aside[1024];
	*gone = false;
	snprintf(aside, sizeof aside, "%s/tmp", store);
	if (mkdir(aside, 0755) != 0 && errno != EEXIST)
		return cot_seterr(eb, COT_ERR_IO, "could not create folder \"%s\": %s", aside,
		                  strerror(errno));
	if ((size_t)snprintf(aside, sizeof aside, "%s/tmp/gc-%ld-%s", store, (long)getpid(), name) >=
	    sizeof aside)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "store directory path is too long");
	if (rename(path, aside) != 0) {
		if (errno == ENOENT)
			return COT_OK; /* already gone (a crash after an earlier pass's rows) */
		return cot_seterr(eb, COT_ERR_IO, "could not move \"%s\" aside: %s", path, strerror(errno));
	}
	struct stat st;
	if (stat(aside, &st) == 0 && fresh(&st, grace_s)) {
		/* stored again meanwhile: the bytes are the same whoever wins */
		if (rename(aside, path) != 0)
			return cot_seterr(eb, COT_ERR_IO, "could not put \"%s\" back: %s", path,
			                  strerror(errno));
		return COT_OK;
	}
	if (unlink(aside) != 0)
		return cot_seterr(eb, COT_ERR_IO, "could not remove \"%s\": %s", aside, strerror(errno));
	*gone = true;
	return COT_OK;
}

/* The rows: collect (or list, dry) in one transaction; then remove the
 * files of the committed deletions. */
static cot_err collect_rows(PGconn *db, const char *store, const fgc_policy *pol, fgc_report report, void *ud,
                            fgc_totals *t, cot_errbuf *eb)
{
	char kl[16], ke[16], gr[16];
	snprintf(kl, sizeof kl, "%d", pol->keep_last);
	snprintf(ke, sizeof ke, "%d", pol->keep_every);
	snprintf(gr, sizeof gr, "%d", pol->grace_s);
	const char *params[4] = { kl, ke, gr, pol->dry_run ? "true" : "false" };
	PGresult *r = NULL;
	cot_err rc = exec_ok(db, "BEGIN", 0, NULL, NULL, eb);
	if (rc)
		return rc;
	rc = exec_ok(db, "SELECT sha256, size, kind, project, version FROM file_gc_collect($1, $2, $3, $4)",
	             4, params, &r, eb);
	if (!rc)
		rc = exec_ok(db, pol->dry_run ? "ROLLBACK" : "COMMIT", 0, NULL, NULL, eb);
	if (rc) {
		PQclear(PQexec(db, "ROLLBACK"));
		PQclear(r);
		return rc;
	}
	for (int i = 0; i < PQntuples(r); i++) {
		const char *sha = PQgetvalue(r, i, 0);
		uint64_t size = strtoull(PQgetvalue(r, i, 1), NULL, 10);
		const char *project = PQgetisnull(r, i, 3) ? NULL : PQgetvalue(r, i, 3);
		int version = PQgetisnull(r, i, 4) ? -1 : atoi(PQgetvalue(r, i, 4));
		if (!pol->dry_run) {
			char path[1024];
			bool gone;
			/* the row is gone already: whatever happens to the file now,
			 * the next pass's walk takes care of it */
			if (fs_path(store, sha, path, sizeof path, eb) ||
			    remove_aside(store, path, sha, pol->grace_s, &gone, eb)) {
				PQclear(r);
				return COT_ERR_IO;
			}
		}
		t->files++;
		t->bytes += size;
		if (report)
			report(ud, sha, size, PQgetvalue(r, i, 2), project, version);
	}
	PQclear(r);
	return COT_OK;
}

static cot_err load_referenced(PGconn *db, name_set *s, cot_errbuf *eb)
{
	PGresult *r;
	cot_err rc = exec_ok(db, "SELECT DISTINCT s FROM file_gc_referenced() s ORDER BY 1", 0, NULL, &r, eb);
	if (rc)
		return rc;
	size_t n = (size_t)PQntuples(r);
	s->v = calloc(n ? n : 1, sizeof *s->v);
	if (!s->v) {
		PQclear(r);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	for (size_t i = 0; i < n; i++)
		snprintf(s->v[i], sizeof s->v[i], "%s", PQgetvalue(r, (int)i, 0));
	s->n = n;
	PQclear(r);
	/* the database's order is its collation's; bsearch needs strcmp's */
	qsort(s->v, s->n, sizeof *s->v, name_cmp);
	return COT_OK;
}

/* Walk one folder of the store (<store>/<aa>, or <store>/tmp when tmp is
 * set) and remove what nothing references and the grace period no longer
 * protects. */
static cot_err walk_dir(const char *store, const char *sub, bool tmp, const name_set *keep,
                        const fgc_policy *pol, fgc_report report, void *ud, fgc_totals *t, cot_errbuf *eb)
{
	char dir[1024], path[1300];
	snprintf(dir, sizeof dir, "%s/%s", store, sub);
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? COT_OK
		                       : cot_seterr(eb, COT_ERR_IO, "could not open folder \"%s\": %s", dir,
		                                    strerror(errno));
	struct dirent *e;
	cot_err rc = COT_OK;
	while (!rc && (e = readdir(d))) {
		const char *name = e->d_name;
		if (name[0] == '.')
			continue;
		if (!tmp && (!fs_sha_valid(name) || strncmp(name, sub, 2) != 0 || name_set_has(keep, name)))
			continue; /* not a stored file, or one still needed */
		snprintf(path, sizeof path, "%s/%s", dir, name);
		struct stat st;
		if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || fresh(&st, pol->grace_s))
			continue;
		if (tmp && strncmp(name, "gc-", 3) != 0 && st.st_mtime + 86400 > time(NULL))
			continue; /* a writer's file: give it a day whatever the grace */
		bool gone = pol->dry_run;
		if (!pol->dry_run) {
			if (tmp) {
				gone = unlink(path) == 0;
			} else {
				rc = remove_aside(store, path, name, pol->grace_s, &gone, eb);
			}
		}
		if (gone) {
			t->files++;
			t->bytes += (uint64_t)st.st_size;
			if (report)
				report(ud, name, (uint64_t)st.st_size, tmp ? "temporary" : "unindexed", NULL,
				       -1);
		}
	}
	closedir(d);
	return rc;
}

static cot_err walk_store(PGconn *db, const char *store, const fgc_policy *pol, fgc_report report, void *ud,
                          fgc_totals *t, cot_errbuf *eb)
{
	name_set keep = { 0 };
	cot_err rc = load_referenced(db, &keep, eb);
	if (rc)
		return rc;
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; !rc && i < 256; i++) {
		char sub[3] = { hex[i >> 4], hex[i & 15], 0 };
		rc = walk_dir(store, sub, false, &keep, pol, report, ud, t, eb);
	}
	if (!rc)
		rc = walk_dir(store, "tmp", true, &keep, pol, report, ud, t, eb);
	free(keep.v);
	return rc;
}

cot_err fgc_run(PGconn *db, const char *store_dir, const fgc_policy *pol, fgc_report report, void *ud,
                fgc_totals *out, cot_errbuf *eb)
{
	fgc_totals t = { 0, 0 };
	if (out)
		*out = t;
	if (pol->keep_last < 1 || pol->keep_every < 0 || pol->grace_s < 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid retention policy");
	static const char *const key[1] = { FGC_LOCK_KEY };
	PGresult *r;
	cot_err rc = exec_ok(db, "SELECT pg_try_advisory_lock($1::bigint)", 1, key, &r, eb);
	if (rc)
		return rc;
	bool got = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	PQclear(r);
	if (!got) {
		cot_seterr(eb, COT_ERR_CONFLICT,
		           "a backup or another collection of the file store is running");
		cot_sethint(eb, "Try again when it is done.");
		return COT_ERR_CONFLICT;
	}
	rc = collect_rows(db, store_dir, pol, report, ud, &t, eb);
	if (!rc)
		rc = walk_store(db, store_dir, pol, report, ud, &t, eb);
	PQclear(PQexecParams(db, "SELECT pg_advisory_unlock($1::bigint)", 1, NULL, key, NULL, NULL, 0));
	if (out)
		*out = t;
	return rc;
}
