/* cotrain: the project-wide error codes.
 *
 * Library code returns a cot_err (curl's CURLcode idiom: `rc = f(); if (rc)
 * return rc;`).  Where a human-readable detail helps, the callee writes it
 * into a caller-provided cot_errbuf with cot_seterr(); messages follow
 * PostgreSQL's style: lowercase, no final period, name the object. */
#ifndef COT_ERROR_H
#define COT_ERROR_H

#include <stddef.h>

typedef enum {
	COT_OK = 0,
	COT_ERR_NOMEM,       /* out of memory */
	COT_ERR_INVALID,     /* bad argument or malformed input */
	COT_ERR_IO,          /* a system call on a file or socket failed */
	COT_ERR_NOT_FOUND,   /* the named object does not exist */
	COT_ERR_EXISTS,      /* the object already exists */
	COT_ERR_TOO_LARGE,   /* input exceeds a bound */
	COT_ERR_CORRUPT,     /* stored data failed validation (hash, layout) */
	COT_ERR_DB,          /* the database refused or failed */
	COT_ERR_SCHEMA,      /* database schema version mismatch */
	COT_ERR_AUTH,        /* wrong credentials or key */
	COT_ERR_FORBIDDEN,   /* authenticated, but not allowed */
	COT_ERR_CONFLICT,    /* state does not allow the operation */
	COT_ERR_UNSUPPORTED, /* valid, but not handled by this build */
	COT_ERR_TIMEOUT,     /* an operation ran past its time limit */
	COT_ERR_NETWORK,     /* a remote peer or server failed */
	COT_ERR_INTERNAL     /* a bug: cannot happen */
} cot_err;

/* A buffer for the human-readable detail of the last error, and an optional
 * hint (a full sentence telling the user what to do). */
typedef struct {
	char msg[512];
	char hint[256];
} cot_errbuf;

/* Short stable name of an error code ("invalid", "not_found"...), used as the
 * "code" of JSON API errors.  Never NULL. */
const char *cot_strerror(cot_err e);

/* printf-style: write a detail into eb (when eb is not NULL) and return e, so
 * that callers can `return cot_seterr(eb, COT_ERR_IO, "could not ...")`. */
cot_err cot_seterr(cot_errbuf *eb, cot_err e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* printf-style: set the hint of eb (when eb is not NULL). */
void cot_sethint(cot_errbuf *eb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
