/* cotrain-server: duties that must run in one server process at a time.
 *
 * Several cotrain-server processes may serve one database (doc/design.md,
 * "Several server processes").  The round coordinator, the reaper, the
 * held-out evaluation, the statistics export and the file store's collector
 * must each run in exactly one of them: each is a duty, held through a
 * session-level PostgreSQL advisory lock (pg_try_advisory_lock(DUTY_CLASS,
 * kind)) on a connection of its own.  The lock goes with the session: a
 * process that dies, or loses that connection, loses the duty at once, and
 * the next duty_held() of another process (each duty's thread asks before
 * each pass, every few seconds) takes it over. */
#ifndef COT_SERVER_DUTY_H
#define COT_SERVER_DUTY_H

#include <stdbool.h>

#include "shared/common/error.h"

/* The advisory lock's first key: 'cotr', so that a maintainer's own
 * advisory locks on the database do not meet ours. */
#define DUTY_CLASS 0x636f7472

typedef enum {
	DUTY_ROUNDS = 1, /* round coordinator, spot-check expiry */
	DUTY_REAPER = 2,
	DUTY_HELDOUT = 3,
	DUTY_STATS = 4,
	DUTY_GC = 5,
} duty_kind;

typedef struct duty duty;

/* A handle for duty kind, connecting with conninfo (not copied; it must
 * outlive the handle).  Connects lazily: nothing is held until duty_held().
 * *out is freed by duty_close. */
cot_err duty_open(const char *conninfo, duty_kind kind, duty **out, cot_errbuf *eb);

/* Whether this process holds the duty now: takes it when free (connecting
 * first when needed), and, when already held, confirms that the lock's
 * connection is alive (a lost connection means a lost lock, and false).
 * Logs each change.  Blocks for at most one round trip or connection
 * attempt; never fails otherwise.  Call from one thread at a time. */
bool duty_held(duty *d);

/* Release the duty (its connection closes, which frees the lock) and free d.
 * NULL is a no-op. */
void duty_close(duty *d);

#endif
