/* cotrain client: a port mapping on the home router for the averaging
 * listener (doc/nat.md, "Port mapping").
 *
 * cl_portmap_open() asks the router to forward a TCP port to our listener:
 * first with UPnP IGD (miniupnpc: SSDP discovery, then AddPortMapping), then
 * with NAT-PMP (libnatpmp, to the default gateway).  Both are bounded: the
 * whole attempt takes at most about PORTMAP_TIMEOUT_MS, so a site with no
 * gateway that speaks either (carrier-grade NAT, a plain router) costs a
 * few seconds once and then the NAT ladder moves on without a mapping.
 *
 * The mapping is leased: call cl_portmap_renew() at or after
 * cl_portmap_renew_at() (half the lease), and cl_portmap_close() on exit to
 * remove it.  Put the external port into nat_config.mapped_port: the server
 * dials it back and classifies the host "mapped".  The external address the
 * router reports is informational (a router behind another NAT reports its
 * own, unreachable, address); the server's observation is authoritative.
 *
 * One cl_portmap is used by one thread at a time. */
#ifndef CL_PORTMAP_H
#define CL_PORTMAP_H

#include <stdint.h>

#include "shared/common/error.h"

#define PORTMAP_TIMEOUT_MS 6000 /* bound on one open or renew, both protocols */
#define PORTMAP_LEASE_MIN 30    /* seconds */
#define PORTMAP_LEASE_MAX 86400

typedef struct cl_portmap cl_portmap;

/* Map TCP port `port` of our listener (on lan_addr; NULL or "0.0.0.0": the
 * address the gateway is reached from) on the router for lease_s seconds
 * (PORTMAP_LEASE_MIN..MAX).  The external port is `port` when free, else
 * another the router gives.  Errors: COT_ERR_INVALID (arguments),
 * COT_ERR_NOT_FOUND (no UPnP IGD and no NAT-PMP gateway answered: eb says
 * what each said), COT_ERR_NETWORK (a gateway refused the mapping),
 * COT_ERR_NOMEM. */
cot_err cl_portmap_open(const char *lan_addr, uint16_t port, int lease_s, cl_portmap **out, cot_errbuf *eb);

/* The external address (as the router reports it; NUL-terminated, at most
 * 63 characters) and port of the mapping. */
void cl_portmap_external(const cl_portmap *pm, char addr[64], uint16_t *port);

/* "upnp" or "natpmp". */
const char *cl_portmap_method(const cl_portmap *pm);

/* The moment (deadline_now_ms() clock) to renew: half the lease after the
 * last successful open or renew. */
int64_t cl_portmap_renew_at(const cl_portmap *pm);

/* Renew the lease with the same gateway and ports.  On error the mapping
 * may be gone (a rebooted router): the caller may close and open again.
 * The external port does not change on success. */
cot_err cl_portmap_renew(cl_portmap *pm, cot_errbuf *eb);

/* Remove the mapping (best effort, bounded) and free pm.  NULL is a no-op. */
void cl_portmap_close(cl_portmap *pm);

#endif
