/* cotrain client: this host's peer identity (see peer_id.h). */
#include "client/peer_id.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/api_round.h"
#include "shared/common/deadline.h"
#include "shared/common/log.h"
#include "shared/peer/pki.h"

#define PEER_PATH_MAX (PATH_MAX + 128)

static void peer_path(char *out, size_t len, const char *state_dir, const cl_project *p, const char *ext)
{
	snprintf(out, len, "%s/peer/%s.%s", state_dir, p->name, ext);
}

static cot_err ensure_dir(const char *state_dir, cot_errbuf *eb)
{
	char dir[PEER_PATH_MAX];
	snprintf(dir, sizeof dir, "%s/peer", state_dir);
	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
		return cot_seterr(eb, COT_ERR_IO, "could not create directory \"%s\": %s", dir,
		                  strerror(errno));
	return COT_OK;
}

cot_err cl_peer_pin_ca(const cl_api_opts *o, const cl_project *p, const char *state_dir, char *local_ip,
                       size_t iplen, cot_errbuf *eb)
{
	char path[PEER_PATH_MAX], *got = NULL, *pinned = NULL;
	size_t plen = 0;
	cot_err rc = ensure_dir(state_dir, eb);
	if (rc || (rc = cl_api_project_ca(o, p, &got, local_ip, iplen, eb)))
		return rc;
	peer_path(path, sizeof path, state_dir, p, "ca.pem");
	cot_errbuf e2 = { "", "" };
	pki_trust *t = NULL;
	if (access(path, F_OK) == 0) {
		rc = pki_read_file(path, &pinned, &plen, eb);
		if (rc)
			goto out;
		if (strcmp(pinned, got) != 0) {
			rc = cot_seterr(eb, COT_ERR_AUTH,
			                "project \"%s\" now shows another CA certificate than the one pinned "
			                "at attach",
			                p->name);
			cot_sethint(eb,
			            "If the project really changed its CA, detach and attach again; "
			            "otherwise someone else answers at %s.",
			            p->base);
		}
		goto out;
	}
	/* The first sight: it must at least be this project's CA. */
	rc = pki_trust_new(got, strlen(got), p->name, &t, &e2);
	if (rc) {
		rc = cot_seterr(eb, COT_ERR_AUTH, "project \"%s\" sent an unusable CA certificate: %s",
		                p->name, e2.msg);
		goto out;
	}
	rc = pki_write_file(path, got, strlen(got), 0644, eb);
	if (!rc)
		log_info("project %s: pinned its CA certificate in %s", p->name, path);
out:
	pki_trust_free(t);
	free(got);
	free(pinned);
	return rc;
}

/* Our key pair, made on first use. */
static cot_err load_key(const cl_project *p, const char *state_dir, char **key, size_t *klen, char **pub,
                        size_t *publen, cot_errbuf *eb)
{
	char kpath[PEER_PATH_MAX], ppath[PEER_PATH_MAX];
	peer_path(kpath, sizeof kpath, state_dir, p, "key.pem");
	peer_path(ppath, sizeof ppath, state_dir, p, "pub.pem");
	if (access(kpath, F_OK) == 0 && access(ppath, F_OK) == 0) {
		cot_err rc = pki_read_file(kpath, key, klen, eb);
		if (!rc && (rc = pki_read_file(ppath, pub, publen, eb))) {
			free(*key);
			*key = NULL;
		}
		return rc;
	}
	cot_err rc = pki_host_key_generate(key, pub, eb);
	if (rc)
		return rc;
	*klen = strlen(*key);
	*publen = strlen(*pub);
	if ((rc = pki_write_file(kpath, *key, *klen, 0600, eb)) ||
	    (rc = pki_write_file(ppath, *pub, *publen, 0644, eb))) {
		free(*key);
		free(*pub);
		*key = *pub = NULL;
	}
	return rc;
}

static cot_err open_listener(cl_peer *pe, const cl_config *cfg, const char *local_ip, cot_errbuf *eb)
{
	if (!pe->lst) {
		cot_err rc = listener_open(cfg->peer_listen, (uint16_t)cfg->peer_port, 64, &pe->lst, eb);
		if (rc)
			return rc;
	}
	const char *addr = cfg->peer_address[0] ? cfg->peer_address : local_ip;
	if (!addr || !addr[0])
		return cot_seterr(eb, COT_ERR_NETWORK,
		                  "could not tell which address peers can reach this host at");
	if (strchr(addr, ':'))
		snprintf(pe->endpoint, sizeof pe->endpoint, "[%s]:%u", addr,
		         (unsigned)listener_port(pe->lst));
	else
		snprintf(pe->endpoint, sizeof pe->endpoint, "%s:%u", addr, (unsigned)listener_port(pe->lst));
	return COT_OK;
}

bool cl_peer_nat_config(const cl_peer *pe, const cl_project *p, const cl_config *cfg, nat_config *nc)
{
	if (!cfg->nat_addr[0] || !pe->lst)
		return false;
	uint16_t mapped = 0;
	if (pe->pm) {
		char ext[64];
		cl_portmap_external(pe->pm, ext, &mapped);
	}
	*nc = (nat_config){ .server_addr = cfg->nat_addr,
		            .server_port = cfg->nat_port,
		            .host_id = p->host_id,
		            .token = p->host_token,
		            .listen_addr = cfg->peer_listen,
		            .listen_port = listener_port(pe->lst),
		            .mapped_port = mapped };
	return true;
}

#define NAT_REGISTER_EVERY_S 300
#define PORTMAP_LEASE_S 1800
#define PORTMAP_RETRY_S 600

/* Keep a port mapping on the home router for our listener: open one when
 * none is held (at most every PORTMAP_RETRY_S), renew it at half its
 * lease.  A router that does not answer is not an error: the ladder goes
 * on without a mapping. */
static void keep_port_mapping(cl_peer *pe, const cl_project *p, const cl_config *cfg)
{
	int64_t now = (int64_t)time(NULL);
	cot_errbuf e2 = { "", "" };
	if (pe->pm && deadline_now_ms() >= cl_portmap_renew_at(pe->pm) && cl_portmap_renew(pe->pm, &e2)) {
		log_warn("project %s: could not renew the port mapping: %s", p->name, e2.msg);
		cl_portmap_close(pe->pm);
		pe->pm = NULL;
		pe->pm_retry_at = 0;
	}
	if (pe->pm || now < pe->pm_retry_at)
		return;
	if (cl_portmap_open(cfg->peer_listen, listener_port(pe->lst), PORTMAP_LEASE_S, &pe->pm, &e2)) {
		log_info("project %s: no port mapping on the router (%s); peers reach us through the NAT "
		         "service",
		         p->name, e2.msg);
		pe->pm = NULL;
		pe->pm_retry_at = now + PORTMAP_RETRY_S;
		return;
	}
	char ext[64];
	uint16_t port;
	cl_portmap_external(pe->pm, ext, &port);
	log_info("project %s: the router maps %s port %u to our port %u (%s)", p->name, ext, (unsigned)port,
	         (unsigned)listener_port(pe->lst), cl_portmap_method(pe->pm));
	pe->nat_observed_at = 0; /* tell the NAT service at once */
}

int cl_peer_can_aggregate(const cl_peer *pe)
{
	return !pe->nat_class[0] || strcmp(pe->nat_class, "public") == 0 ||
	       strcmp(pe->nat_class, "mapped") == 0 ||
	       (strcmp(pe->nat_class, "nat") == 0 && strcmp(pe->nat_mapping, "independent") == 0);
}

/* Register with the NAT service (again when the last registration is
 * NAT_REGISTER_EVERY_S old): our class and public endpoint. */
static cot_err nat_register(cl_peer *pe, const cl_project *p, const cl_config *cfg, cot_errbuf *eb)
{
	if (!cfg->nat_addr[0] || !pe->lst)
		return COT_OK;
	if (cfg->port_mapping)
		keep_port_mapping(pe, p, cfg);
	int64_t now = (int64_t)time(NULL);
	if (pe->nat_class[0] && now - pe->nat_observed_at < NAT_REGISTER_EVERY_S)
		return COT_OK;
	nat_config nc;
	cl_peer_nat_config(pe, p, cfg, &nc);
	nat_observation ob;
	cot_errbuf e2 = { "", "" };
	cot_err rc = nat_observe(&nc, deadline_after_ms(10000), &ob, &e2);
	if (rc)
		return cot_seterr(eb, rc, "could not register with the NAT service at %s:%u: %s",
		                  cfg->nat_addr, (unsigned)cfg->nat_port, e2.msg);
	/* What peers dial: the public address, at the mapped port when the
	 * router forwards one. */
	unsigned port = nc.mapped_port ? nc.mapped_port : ob.port;
	if (strchr(ob.addr, ':'))
		snprintf(pe->nat_endpoint, sizeof pe->nat_endpoint, "[%s]:%u", ob.addr, port);
	else
		snprintf(pe->nat_endpoint, sizeof pe->nat_endpoint, "%s:%u", ob.addr, port);
	if (strcmp(pe->nat_class, ob.klass) != 0 || strcmp(pe->nat_mapping, ob.mapping) != 0)
		log_info("project %s: the NAT service sees this host at %s: %s, mapping %s", p->name,
		         pe->nat_endpoint, ob.klass, ob.mapping);
	snprintf(pe->nat_class, sizeof pe->nat_class, "%s", ob.klass);
	snprintf(pe->nat_mapping, sizeof pe->nat_mapping, "%s", ob.mapping);
	pe->nat_observed_at = now;
	return COT_OK;
}

void cl_peer_note_links(cl_peer *pe, cl_links *links)
{
	pthread_mutex_lock(&links->mu);
	for (size_t i = 0; i < links->n; i++) {
		const cl_link *l = &links->l[i];
		if (l->rtt_ms < 0)
			continue;
		size_t k = 0;
		while (k < pe->n_rtt && pe->rtt[k].host != l->peer)
			k++;
		if (k == pe->n_rtt && pe->n_rtt < CL_LINKS_MAX)
			pe->n_rtt++;
		if (k == CL_LINKS_MAX)
			k--; /* full: the oldest goes */
		memmove(&pe->rtt[1], &pe->rtt[0], k * sizeof pe->rtt[0]);
		pe->rtt[0].host = l->peer;
		pe->rtt[0].ms = l->rtt_ms;
	}
	pthread_mutex_unlock(&links->mu);
}

json_t *cl_peer_rtt_json(const cl_peer *pe)
{
	if (pe->n_rtt == 0)
		return NULL;
	json_t *o = json_object();
	for (size_t i = 0; o && i < pe->n_rtt; i++) {
		char k[24];
		snprintf(k, sizeof k, "%lld", (long long)pe->rtt[i].host);
		json_object_set_new(o, k, json_real(pe->rtt[i].ms));
	}
	return o;
}

void cl_peer_network(const cl_peer *pe, char *out, size_t len)
{
	out[0] = '\0';
	if (!pe->nat_class[0])
		return;
	char ext[64] = "";
	uint16_t port = 0;
	if (pe->pm)
		cl_portmap_external(pe->pm, ext, &port);
	snprintf(out, len, "%s (mapping %s) at %s%s%s%s", pe->nat_class, pe->nat_mapping, pe->endpoint,
	         pe->pm ? ", port mapped by " : "", pe->pm ? cl_portmap_method(pe->pm) : "",
	         cl_peer_can_aggregate(pe) ? "" : ", relay only: aggregates nothing");
}

cot_err cl_peer_ready(cl_peer *pe, const cl_api_opts *o, const cl_project *p, const cl_config *cfg,
                      cot_errbuf *eb)
{
	char local_ip[DIALER_ADDR_MAX] = "";
	cot_err rc = cl_peer_pin_ca(o, p, cfg->state_dir, local_ip, sizeof local_ip, eb);
	if (rc || (rc = open_listener(pe, cfg, local_ip, eb)) || (rc = nat_register(pe, p, cfg, eb)))
		return rc;
	if (pe->nat_class[0])
		snprintf(pe->endpoint, sizeof pe->endpoint, "%s", pe->nat_endpoint);
	int64_t now = (int64_t)time(NULL);
	if (pe->ctx && now < pe->cert_renew_at)
		return COT_OK;
	char *key = NULL, *pub = NULL, *ca = NULL, *cert = NULL;
	size_t klen = 0, publen = 0, calen = 0;
	int64_t lifetime = 0;
	char capath[PEER_PATH_MAX];
	peer_path(capath, sizeof capath, cfg->state_dir, p, "ca.pem");
	if ((rc = load_key(p, cfg->state_dir, &key, &klen, &pub, &publen, eb)) ||
	    (rc = pki_read_file(capath, &ca, &calen, eb)) ||
	    (rc = cl_api_host_certificate(o, p, pub, &cert, &lifetime, eb)))
		goto out;
	peer_identity id = { .project = p->name,
		             .ca_pem = ca,
		             .ca_len = calen,
		             .cert_pem = cert,
		             .cert_len = strlen(cert),
		             .key_pem = key,
		             .key_len = klen };
	peer_ctx *ctx = NULL;
	cot_errbuf e2 = { "", "" };
	rc = peer_ctx_new(&id, &ctx, &e2);
	if (rc) {
		rc = cot_seterr(eb, rc, "the certificate from project \"%s\" is not usable: %s", p->name,
		                e2.msg);
		goto out;
	}
	peer_ctx_free(pe->ctx);
	pe->ctx = ctx;
	pe->cert_expires = now + lifetime;
	int64_t margin = lifetime / 10 > 600 ? lifetime / 10 : 600;
	pe->cert_renew_at = now + (lifetime > margin ? lifetime - margin : 0);
out:
	free(key);
	free(pub);
	free(ca);
	free(cert);
	return rc;
}

void cl_peer_forget(const cl_project *p, const char *state_dir)
{
	const char *ext[] = { "ca.pem", "key.pem", "pub.pem" };
	for (int i = 0; i < 3; i++) {
		char path[PEER_PATH_MAX];
		peer_path(path, sizeof path, state_dir, p, ext[i]);
		unlink(path);
	}
}

void cl_peer_free(cl_peer *pe)
{
	peer_ctx_free(pe->ctx);
	listener_close(pe->lst);
	cl_portmap_close(pe->pm);
	memset(pe, 0, sizeof *pe);
}
