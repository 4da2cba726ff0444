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

#include "client/conf.h"

/* Seconds since the last user activity (a large number when idle for good,
 * 0 when active now), by the configured source.  *source (when not NULL)
 * receives the name of the source used.  Never fails: with no usable source
 * the host counts as idle. */
double cl_idle_seconds(const cl_config *c, const char **source);

#endif
