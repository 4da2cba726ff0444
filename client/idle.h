/* cotrain client: is the user away?
 *
 * Sources, in the order "auto" tries them:
 *   logind   systemd-logind's IdleHint and IdleSinceHint of the whole seat
 *            manager (org.freedesktop.login1.Manager), read with
 *            `loginctl show`; desktops (GNOME and KDE on Wayland or X11)
 *            set the hint of their session, and a server with no sessions is
 *            idle.  Works under systemd's sandboxing, needs no X display.
 *   tty      the newest access time of the terminals matched by
 *            idle_tty_glob (/dev/tty[0-9]* /dev/pts/[0-9]*): typing on a
 *            console or over ssh counts as activity.  The fallback where
 *            logind is absent (containers, non-systemd systems).
 *   none     always idle.
 * cl_idle_seconds() says how long the user has been away. */
#ifndef CL_IDLE_H
#define CL_IDLE_H

#include <time.h>

#include "client/conf.h"

/* What "a large number" is: idle for good. */
#define CL_IDLE_FOREVER 1e9

/* Seconds since the last user activity (a large number when idle for good,
 * 0 when active now), by the configured source.  *source (when not NULL)
 * receives the name of the source used.  Never fails: with no usable source
 * the host counts as idle. */
double cl_idle_seconds(const cl_config *c, const char **source);

/* The decision from `loginctl show` output (IdleHint=yes|no and
 * IdleSinceHint=<unix microseconds>, one per line) at wall time now_us:
 * returns 1 and sets *secs (0 when active, CL_IDLE_FOREVER when idle with no
 * or a future "since"), or 0 when the output has no IdleHint (logind did not
 * answer). */
int cl_idle_parse_loginctl(const char *out, double now_us, double *secs);

/* Seconds since the newest access time among the files matched by the
 * space-separated glob patterns, at time now; CL_IDLE_FOREVER when none
 * matches.  Never negative. */
double cl_idle_tty_seconds(const char *globs, time_t now);

#endif
