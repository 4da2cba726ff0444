/* cotrain-server: PostgreSQL notifications as wake-ups.
 *
 * A thread of its own, on a connection of its own, LISTENs on one channel
 * and calls a function whenever notifications arrive, so that a change
 * another server process made to the database (a round moved; doc/scale.md,
 * "Several server processes") is seen within milliseconds rather than at
 * the next poll.  Notifications sent while the connection is down are lost:
 * the function is called once after every (re)connection as well, and the
 * caller keeps a slower poll as the floor. */
#ifndef COT_SERVER_DB_LISTEN_H
#define COT_SERVER_DB_LISTEN_H

#include "shared/common/error.h"

typedef struct db_listen db_listen;

/* Start listening on channel (an SQL identifier, not copied) with conninfo
 * (not copied; both must outlive the handle); on_notify(arg) runs on the
 * listener's thread, so it must be quick (set a flag, signal).  The first
 * connection is made by the thread: a database that is down is retried
 * every second.  COT_ERR_INTERNAL when the thread cannot start. */
cot_err db_listen_start(const char *conninfo, const char *channel, void (*on_notify)(void *arg), void *arg,
                        db_listen **out, cot_errbuf *eb);

/* Stop the thread, close its connection, free l (NULL is a no-op). */
void db_listen_stop(db_listen *l);

#endif
