/* cotrain client: the daemon's configuration file.
 *
 * A text file of `key = value` lines; `#` starts a comment; blank lines are
 * ignored; values may be quoted with "..." (no escapes).  Lines are at most
 * 4095 bytes and the file at most 1 MiB.  Unknown keys are errors (a typo
 * must not silently fall back to a default).  Keys:
 *
 *   state_dir           the state folder (default /var/lib/cotrain-client)
 *   socket              control socket path (default <state_dir>/control.sock)
 *   socket_group        group allowed to control the daemon (default cotrain;
 *                       when the group does not exist only the owner may)
 *   log_level           debug | info | warn | error (default info)
 *   heartbeat_interval  seconds between progress reports (default 20; a round
 *                       that closes is noticed at the next one)
 *   retry_base          first retry delay in seconds (default 15)
 *   retry_max           longest retry delay in seconds (default 600)
 *   http_timeout        seconds for one API request (default 60)
 *   max_file_bytes      largest file accepted from a server (default 8G)
 *   benchmark_seconds   length of the benchmark (default 3)
 *   idle_detection      auto | logind | tty | none (default auto)
 *   idle_tty_glob       terminals whose access time counts as user activity
 *                       (default "/dev/tty[0-9]* /dev/pts/[0-9]*")
 *   power_supply_dir    default /sys/class/power_supply
 *   peer_listen         address the averaging listener binds (default 0.0.0.0)
 *   peer_port           its port (default 0: any free port, chosen at start)
 *   peer_address        the address peers are told to dial (default: the
 *                       address this host uses to reach the project server)
 *   peer_bandwidth      bytes/s this host can send and receive for averaging
 *                       (default 12500000, 100 Mbit/s)
 *   nat_service         ADDR:PORT of the project server's NAT service
 *                       (cotrain-server --relay-port; doc/nat.md): peers are
 *                       then reached through its ladder (direct, hole
 *                       punching, relay); default: dial peers directly
 *   port_mapping        true | false: with nat_service, ask the home router
 *                       to forward the listener's port (UPnP IGD, then
 *                       NAT-PMP), renewed while running, removed on exit
 *                       (default true)
 *   spot_interval       seconds between looks for spot checks to answer
 *                       (default 300)
 *   any preference key of prefs.h (max_threads, only_when_idle, ...), which
 *   overrides what the account pushes. */
#ifndef CL_CONFIG_H
#define CL_CONFIG_H

#include <limits.h>
#include <stdint.h>

#include "client/prefs.h"
#include "shared/peer/dialer.h"
#include "shared/common/error.h"

/* SYSCONFDIR comes from the build (Makefile.am: $(sysconfdir), /etc for the
 * Debian packages), so the default agrees with where make install puts it. */
#ifndef SYSCONFDIR
#define SYSCONFDIR "/etc"
#endif
#define CL_DEFAULT_CONFIG SYSCONFDIR "/cotrain/client.conf"
#define CL_DEFAULT_STATE "/var/lib/cotrain-client"

typedef enum { IDLE_AUTO, IDLE_LOGIND, IDLE_TTY, IDLE_NONE } cl_idle_mode;

typedef struct {
	char state_dir[PATH_MAX];
	char socket[PATH_MAX];
	char socket_group[64];
	int log_level;             /* cot_log_level */
	int heartbeat_interval;    /* seconds */
	int retry_base, retry_max; /* seconds */
	int http_timeout;          /* seconds */
	int64_t max_file_bytes;
	int benchmark_seconds;
	cl_idle_mode idle_mode;
	char idle_tty_glob[1024];
	char power_supply_dir[PATH_MAX];
	char peer_listen[DIALER_ADDR_MAX];
	int peer_port;
	char peer_address[DIALER_ADDR_MAX]; /* "" = auto */
	int64_t peer_bandwidth;
	int spot_interval;              /* seconds */
	char nat_addr[DIALER_ADDR_MAX]; /* "" = no NAT service */
	uint16_t nat_port;
	int port_mapping; /* ask the router for a port mapping (with nat_service) */
	cl_prefs prefs;   /* only the keys the file sets */
} cl_config;

/* Fill c with the defaults (socket empty: derived from state_dir by
 * cl_config_finish). */
void cl_config_defaults(cl_config *c);

/* Read the file at path over c.  COT_ERR_NOT_FOUND when it does not exist
 * (c untouched), COT_ERR_IO when it cannot be read, COT_ERR_INVALID with
 * "<path>:<line>: ..." for a bad line, COT_ERR_TOO_LARGE.  On error c may
 * be partly updated: callers stop. */
cot_err cl_config_load(cl_config *c, const char *path, cot_errbuf *eb);

/* Set one key from text (the file's keys; used by the loader and by
 * command-line overrides).  COT_ERR_INVALID for an unknown key or bad value. */
cot_err cl_config_set(cl_config *c, const char *key, const char *value, cot_errbuf *eb);

/* Derive what was left empty (socket).  COT_ERR_TOO_LARGE on long paths. */
cot_err cl_config_finish(cl_config *c, cot_errbuf *eb);

#endif
