/* cotrain: the file store's garbage collector (doc/design.md, "Retention and
 * backup").
 *
 * One pass: under the advisory lock FGC_LOCK_KEY (which a backup holds too,
 * so a pass never removes a file a backup in progress still copies),
 * file_gc_collect (db/functions/retention.sql) clears the references to the
 * files the retention policy lets go and deletes their `file` rows in one
 * transaction; once that is committed the files themselves are removed.  A
 * crash in between leaves files without rows, which are harmless (no client
 * is ever sent one) and which the next pass finds: it then walks the store
 * and removes every file that file_gc_referenced does not name (old group
 * sums and mean gradients, leftovers of failed attempts and crashes), and
 * temporary files of crashed writers.
 *
 * Nothing younger than the grace period goes: a writer stores a file before
 * the row that names it, and re-storing bytes already present refreshes the
 * file's time (fs_writer_commit), so a file that is about to be named is
 * never taken.  A file is first renamed aside and put back if its time turns
 * out to be fresh, so a writer racing with the removal keeps its file. */
#ifndef COT_SERVER_FILE_GC_H
#define COT_SERVER_FILE_GC_H

#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "shared/common/error.h"

/* pg_advisory_lock key of a collection pass and of a backup ("cotgc"). */
#define FGC_LOCK_KEY "426969662499"

#define FGC_KEEP_LAST_DEFAULT 5
#define FGC_KEEP_EVERY_DEFAULT 50
#define FGC_GRACE_DEFAULT 3600

typedef struct {
	int keep_last;  /* the last N versions of each project (>= 1, the current one included) */
	int keep_every; /* and every Kth version (0: none) */
	int grace_s;    /* rows and files younger than this many seconds stay */
	bool dry_run;   /* report what would go; change nothing */
} fgc_policy;

typedef struct {
	long files;     /* files removed (or that would be) */
	uint64_t bytes; /* their bytes */
} fgc_totals;

/* Told of each file removed (or that would be): its sha256, its size, its
 * kind ("checkpoint", "shard", "manifest", "unindexed" for a file no row
 * indexed, "temporary" for a crashed writer's file), and the project and
 * version that named it (NULL and -1 when none). */
typedef void (*fgc_report)(void *ud, const char *sha, uint64_t size, const char *kind, const char *project,
                           int version);

/* Run one pass over the store store_dir with database connection db (no
 * transaction open; the pass runs its own).  report may be NULL.  *out gets
 * the totals (may be NULL).  Errors: COT_ERR_CONFLICT when a backup or
 * another pass holds the lock (nothing done), COT_ERR_INVALID for a bad
 * policy, COT_ERR_DB, COT_ERR_IO (the store cannot be read; rows already
 * deleted stay deleted and their files are found by a later pass),
 * COT_ERR_NOMEM. */
cot_err fgc_run(PGconn *db, const char *store_dir, const fgc_policy *pol, fgc_report report, void *ud,
                fgc_totals *out, cot_errbuf *eb);

#endif
