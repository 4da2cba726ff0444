/* cotrain client: port mapping with UPnP IGD and NAT-PMP (portmap.h). */
#include "client/portmap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <miniupnpc/miniupnpc.h>
#include <miniupnpc/upnpcommands.h>
#include <miniupnpc/upnperrors.h>
#define ENABLE_STRNATPMPERR 1 /* declares strnatpmperr(), which libnatpmp1 exports */
#include <natpmp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/common/deadline.h"
#include "shared/common/log.h"

#define UPNP_DISCOVER_MS 1200 /* per SSDP search type (two types) */
#define PORTMAP_TRIES 4       /* external ports tried when the first is taken */
#define PORTMAP_DESC "cotrain averaging"

typedef enum { PM_UPNP, PM_NATPMP } pm_method;

struct cl_portmap {
	pm_method method;
	uint16_t port; /* internal (our listener) */
	uint16_t ext_port;
	int lease_s;
	int64_t renew_at;
	char ext_addr[64];
	char lan_addr[64];    /* the inClient of the UPnP mapping */
	struct UPNPUrls urls; /* UPnP */
	struct IGDdatas igd;
	bool have_urls;
};

static bool any_addr(const char *a) { return a == NULL || a[0] == '\0' || strcmp(a, "0.0.0.0") == 0; }

/* ---- UPnP IGD ---- */

/* Add (or refresh) the mapping ext -> pm->lan_addr:pm->port.  Returns the
 * UPnP result (UPNPCOMMAND_SUCCESS or an error code such as 718). */
static int upnp_add(cl_portmap *pm, uint16_t ext)
{
	char e[8], i[8], lease[16];
	snprintf(e, sizeof e, "%u", ext);
	snprintf(i, sizeof i, "%u", pm->port);
	snprintf(lease, sizeof lease, "%d", pm->lease_s);
	return UPNP_AddPortMapping(pm->urls.controlURL, pm->igd.first.servicetype, e, i, pm->lan_addr,
	                           PORTMAP_DESC, "TCP", NULL, lease);
}

/* Discover an IGD (bounded by UPNP_DISCOVER_MS per search type), then map.
 * On failure eb says why, and COT_ERR_NOT_FOUND means no IGD answered. */
static cot_err upnp_open(cl_portmap *pm, const char *lan_addr, cot_errbuf *eb)
{
	static const char *const types[] = { "urn:schemas-upnp-org:device:InternetGatewayDevice:1",
		                             "urn:schemas-upnp-org:device:InternetGatewayDevice:2", NULL };
	int err = 0;
	struct UPNPDev *devs =
	        upnpDiscoverDevices(types, UPNP_DISCOVER_MS, any_addr(lan_addr) ? NULL : lan_addr, NULL,
	                            UPNP_LOCAL_PORT_ANY, 0, 2, &err, 0);
	if (!devs)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "no UPnP gateway answered within %d ms",
		                  UPNP_DISCOVER_MS * 2);
	char lan[64] = "";
	int r = UPNP_GetValidIGD(devs, &pm->urls, &pm->igd, lan, sizeof lan);
	freeUPNPDevlist(devs);
	if (r == 0)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "no UPnP internet gateway among the devices found");
	pm->have_urls = true;
	if (r != 1) {
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "the UPnP gateway at %s is not connected",
		                  pm->urls.controlURL ? pm->urls.controlURL : "?");
	}
	snprintf(pm->lan_addr, sizeof pm->lan_addr, "%s", any_addr(lan_addr) ? lan : lan_addr);
	int res = -1;
	for (int t = 0; t < PORTMAP_TRIES; t++) {
		/* The listener's own port first, then a few others above it. */
		uint16_t ext = (uint16_t)(pm->port + (t ? 1000 * t + (rand() % 1000) : 0));
		if (ext < 1024)
			ext = (uint16_t)(ext + 1024);
		res = upnp_add(pm, ext);
		if (res == UPNPCOMMAND_SUCCESS) {
			pm->ext_port = ext;
			break;
		}
		if (res != 718) /* ConflictInMappingEntry: another host holds it */
			break;
	}
	if (res != UPNPCOMMAND_SUCCESS)
		return cot_seterr(eb, COT_ERR_NETWORK,
		                  "the UPnP gateway refused the mapping of port %u: %d %s", pm->port, res,
		                  strupnperror(res) ? strupnperror(res) : "unknown error");
	char ext[40] = "";
	if (UPNP_GetExternalIPAddress(pm->urls.controlURL, pm->igd.first.servicetype, ext) ==
	    UPNPCOMMAND_SUCCESS)
		snprintf(pm->ext_addr, sizeof pm->ext_addr, "%s", ext);
	pm->method = PM_UPNP;
	return COT_OK;
}

/* ---- NAT-PMP ---- */

/* Send a request already queued on n and wait for its answer until
 * deadline (libnatpmp's own retries run far longer). */
static int natpmp_wait(natpmp_t *n, natpmpresp_t *resp, int64_t deadline)
{
	for (;;) {
		int r = readnatpmpresponseorretry(n, resp);
		if (r != NATPMP_TRYAGAIN)
			return r;
		int left = deadline_left_ms(deadline);
		if (left <= 0)
			return NATPMP_TRYAGAIN;
		struct timeval tv;
		int wait = 100;
		if (getnatpmprequesttimeout(n, &tv) == 0)
			wait = (int)(tv.tv_sec * 1000 + tv.tv_usec / 1000) + 1;
		struct pollfd p = { n->s, POLLIN, 0 };
		(void)poll(&p, 1, wait < left ? wait : left);
	}
}

/* One NAT-PMP mapping request (lifetime 0 removes it).  On success
 * *ext is the public port. */
static cot_err natpmp_map(uint16_t port, uint16_t want, int lifetime, uint16_t *ext, char *ext_addr,
                          int64_t deadline, cot_errbuf *eb)
{
	natpmp_t n;
	natpmpresp_t resp;
	int r = initnatpmp(&n, 0, 0);
	if (r < 0)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "no NAT-PMP gateway: %s", strnatpmperr(r));
	cot_err e = COT_OK;
	struct in_addr gw = { n.gateway };
	char gws[INET_ADDRSTRLEN] = "?";
	inet_ntop(AF_INET, &gw, gws, sizeof gws);
	if (ext_addr) {
		if ((r = sendpublicaddressrequest(&n)) < 0 || (r = natpmp_wait(&n, &resp, deadline)) < 0)
			goto fail;
		inet_ntop(AF_INET, &resp.pnu.publicaddress.addr, ext_addr, 64);
	}
	if ((r = sendnewportmappingrequest(&n, NATPMP_PROTOCOL_TCP, port, want, (uint32_t)lifetime)) < 0 ||
	    (r = natpmp_wait(&n, &resp, deadline)) < 0)
		goto fail;
	if (ext)
		*ext = resp.pnu.newportmapping.mappedpublicport;
	closenatpmp(&n);
	return COT_OK;
fail:
	if (r == NATPMP_TRYAGAIN)
		e = cot_seterr(eb, COT_ERR_NOT_FOUND, "no NAT-PMP answer from the gateway %s in time", gws);
	else if (r == NATPMP_ERR_RECVFROM || r == NATPMP_ERR_NOGATEWAYSUPPORT || r == NATPMP_ERR_CONNECTERR ||
	         r == NATPMP_ERR_SENDERR || r == NATPMP_ERR_UNSUPPORTEDVERSION)
		e = cot_seterr(eb, COT_ERR_NOT_FOUND, "the gateway %s does not speak NAT-PMP: %s", gws,
		               strnatpmperr(r));
	else
		e = cot_seterr(eb, COT_ERR_NETWORK,
		               "the NAT-PMP gateway %s refused the mapping of port %u: %s", gws, port,
		               strnatpmperr(r));
	closenatpmp(&n);
	return e;
}

/* ---- API ---- */

cot_err cl_portmap_open(const char *lan_addr, uint16_t port, int lease_s, cl_portmap **out, cot_errbuf *eb)
{
	*out = NULL;
	if (port == 0 || lease_s < PORTMAP_LEASE_MIN || lease_s > PORTMAP_LEASE_MAX)
		return cot_seterr(eb, COT_ERR_INVALID, "bad port mapping request (port %u, lease %d s)", port,
		                  lease_s);
	if (!any_addr(lan_addr)) {
		struct in_addr a;
		if (strlen(lan_addr) >= 64 || inet_pton(AF_INET, lan_addr, &a) != 1)
			return cot_seterr(eb, COT_ERR_INVALID, "bad local address for the port mapping");
	}
	cl_portmap *pm = calloc(1, sizeof *pm);
	if (!pm)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	pm->port = port;
	pm->lease_s = lease_s;
	int64_t t0 = deadline_now_ms();
	cot_errbuf e1 = { { 0 }, { 0 } }, e2 = { { 0 }, { 0 } };
	cot_err r1 = upnp_open(pm, lan_addr, &e1), r2 = COT_OK;
	if (r1 != COT_OK) {
		if (pm->have_urls)
			FreeUPNPUrls(&pm->urls);
		pm->have_urls = false;
		int64_t deadline = t0 + PORTMAP_TIMEOUT_MS;
		if (deadline - deadline_now_ms() < 1000)
			deadline = deadline_now_ms() + 1000;
		r2 = natpmp_map(port, port, lease_s, &pm->ext_port, pm->ext_addr, deadline, &e2);
		if (r2 == COT_OK)
			pm->method = PM_NATPMP;
	}
	if (r1 != COT_OK && r2 != COT_OK) {
		/* NOT_FOUND only when neither protocol found a gateway. */
		cot_err e = r1 == COT_ERR_NOT_FOUND && r2 == COT_ERR_NOT_FOUND ? COT_ERR_NOT_FOUND
		                                                               : COT_ERR_NETWORK;
		cot_seterr(eb, e, "could not map port %u on the router (UPnP: %s; NAT-PMP: %s)", port, e1.msg,
		           e2.msg);
		cot_sethint(eb, "the router may not offer UPnP IGD or NAT-PMP, or sit behind another NAT; "
		                "connections go through hole punching or the relay");
		free(pm);
		return e;
	}
	pm->renew_at = deadline_now_ms() + (int64_t)lease_s * 500;
	log_info("mapped port %u to %s:%u with %s for %d s (%lld ms)", port,
	         pm->ext_addr[0] ? pm->ext_addr : "?", pm->ext_port, cl_portmap_method(pm), lease_s,
	         (long long)(deadline_now_ms() - t0));
	*out = pm;
	return COT_OK;
}

void cl_portmap_external(const cl_portmap *pm, char addr[64], uint16_t *port)
{
	snprintf(addr, 64, "%s", pm->ext_addr);
	*port = pm->ext_port;
}

const char *cl_portmap_method(const cl_portmap *pm) { return pm->method == PM_UPNP ? "upnp" : "natpmp"; }

int64_t cl_portmap_renew_at(const cl_portmap *pm) { return pm->renew_at; }

cot_err cl_portmap_renew(cl_portmap *pm, cot_errbuf *eb)
{
	if (pm->method == PM_UPNP) {
		int r = upnp_add(pm, pm->ext_port);
		if (r != UPNPCOMMAND_SUCCESS)
			return cot_seterr(eb, COT_ERR_NETWORK,
			                  "could not renew the UPnP mapping of port %u: %d %s", pm->ext_port,
			                  r, strupnperror(r) ? strupnperror(r) : "unknown error");
	} else {
		uint16_t got = 0;
		cot_err e = natpmp_map(pm->port, pm->ext_port, pm->lease_s, &got, NULL,
		                       deadline_after_ms(PORTMAP_TIMEOUT_MS), eb);
		if (e)
			return e;
		if (got != pm->ext_port)
			return cot_seterr(eb, COT_ERR_CONFLICT,
			                  "the NAT-PMP gateway moved the mapping from port %u to %u",
			                  pm->ext_port, got);
	}
	pm->renew_at = deadline_now_ms() + (int64_t)pm->lease_s * 500;
	log_debug("renewed the %s mapping of port %u", cl_portmap_method(pm), pm->ext_port);
	return COT_OK;
}

void cl_portmap_close(cl_portmap *pm)
{
	if (!pm)
		return;
	cot_errbuf eb = { { 0 }, { 0 } };
	if (pm->method == PM_UPNP) {
		char e[8];
		snprintf(e, sizeof e, "%u", pm->ext_port);
		int r = UPNP_DeletePortMapping(pm->urls.controlURL, pm->igd.first.servicetype, e, "TCP",
		                               NULL);
		if (r != UPNPCOMMAND_SUCCESS)
			log_warn("could not remove the UPnP mapping of port %u: %d", pm->ext_port, r);
	} else if (natpmp_map(pm->port, pm->ext_port, 0, NULL, NULL, deadline_after_ms(2000), &eb)) {
		log_warn("could not remove the NAT-PMP mapping of port %u: %s", pm->ext_port, eb.msg);
	}
	if (pm->have_urls)
		FreeUPNPUrls(&pm->urls);
	free(pm);
}
