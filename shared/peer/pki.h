/* cotrain: the project's public-key infrastructure for the peer transport.
 *
 * Every project has one certificate authority (CA): an Ed25519 key and a
 * self-signed certificate whose subject is CN=<project>, O=<project>.  The
 * project server keeps the key and signs, for each registered host, a
 * short-lived certificate over a public key that the host generated itself:
 *
 *   subject          CN=host:<id>, O=<project>
 *   serial           128 random bits
 *   validity         a few hours (PKI_HOST_LIFETIME_DEFAULT_S)
 *   basicConstraints critical, CA:FALSE
 *   keyUsage         critical, digitalSignature
 *   extendedKeyUsage clientAuth, serverAuth
 *
 * Clients pin the CA certificate when they attach (a pki_trust); a peer is
 * accepted only with a certificate issued directly by that CA, for that
 * project, inside its validity window (give or take PKI_CLOCK_SKEW_S), that is
 * not itself a CA.  The host id comes from the certificate, never from what
 * the peer says.
 *
 * Every PEM input is bounded (PKI_PEM_MAX) and parsed defensively: hostile
 * input gets COT_ERR_INVALID or COT_ERR_TOO_LARGE with a detail, never a crash.
 * Certificates that parse but must be refused get COT_ERR_AUTH.  Functions are
 * thread-safe; a pki_ca or pki_trust may be shared by threads once made. */
#ifndef COT_PKI_H
#define COT_PKI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/types.h>

#include "shared/common/error.h"

#define PKI_PEM_MAX (16 * 1024)                /* any PEM input, in bytes */
#define PKI_PROJECT_MAX 64                     /* project name, in bytes */
#define PKI_HOST_LIFETIME_DEFAULT_S (6 * 3600) /* host certificates */
#define PKI_HOST_LIFETIME_MIN_S 60
#define PKI_HOST_LIFETIME_MAX_S (30 * 24 * 3600)
#define PKI_CA_LIFETIME_DEFAULT_DAYS 3650
#define PKI_CA_LIFETIME_MAX_DAYS (30 * 366)
#define PKI_CLOCK_SKEW_S 300        /* tolerated either way */
#define PKI_NO_TIME_CHECK INT64_MIN /* see pki_trust_verify */

/* True when s is a project name as the database allows it:
 * ^[a-z0-9][a-z0-9-]{0,63}$. */
bool pki_project_name_valid(const char *s);

/* ---- The project CA (server side) ---- */

typedef struct pki_ca pki_ca;

/* A new CA for project (a valid project name), valid from a few minutes ago
 * for lifetime_days (0 = PKI_CA_LIFETIME_DEFAULT_DAYS).  *out is freed with
 * pki_ca_free.  COT_ERR_INVALID for a bad name or lifetime. */
cot_err pki_ca_create(const char *project, int lifetime_days, pki_ca **out, cot_errbuf *eb);

/* Write the CA certificate (mode 0644) and key (mode 0600) as PEM, each
 * atomically (a temporary file renamed into place). */
cot_err pki_ca_save(const pki_ca *ca, const char *cert_path, const char *key_path, cot_errbuf *eb);

/* Read a CA saved by pki_ca_save.  Refuses (COT_ERR_FORBIDDEN) a key file
 * that others may read, a certificate that is not a self-signed CA, and a key
 * that does not match the certificate. */
cot_err pki_ca_load(const char *cert_path, const char *key_path, pki_ca **out, cot_errbuf *eb);

void pki_ca_free(pki_ca *ca);

/* The project name of the CA; owned by ca. */
const char *pki_ca_project(const pki_ca *ca);

/* The CA certificate as a NUL-terminated PEM string in *pem (malloc'd; the
 * caller frees): what clients pin at attach. */
cot_err pki_ca_cert_pem(const pki_ca *ca, char **pem, cot_errbuf *eb);

/* Sign a host's public key (PEM "PUBLIC KEY", Ed25519 or ECDSA P-256, len
 * bytes at pubkey_pem) into a certificate for host_id (> 0), valid from
 * not_before (Unix time; 0 = now) for lifetime_s seconds (0 = the default;
 * else PKI_HOST_LIFETIME_MIN_S..PKI_HOST_LIFETIME_MAX_S).  A not_before in the
 * past or future is allowed, so that tests can make expired and not yet valid
 * certificates.  *cert_pem (malloc'd, NUL-terminated) is the caller's. */
cot_err pki_ca_sign_host(const pki_ca *ca, const char *pubkey_pem, size_t len, int64_t host_id,
                         int64_t not_before, int64_t lifetime_s, char **cert_pem, cot_errbuf *eb);

/* ---- The host side ---- */

/* A fresh Ed25519 key pair: *key_pem is the private key (PKCS#8 PEM), to be
 * kept with pki_write_file(..., 0600); *pub_pem is the public key to send to
 * the server for signing.  Both malloc'd and NUL-terminated. */
cot_err pki_host_key_generate(char **key_pem, char **pub_pem, cot_errbuf *eb);

/* Write len bytes to path atomically with the given mode (0600 for keys):
 * a temporary file beside it, fsync'd, renamed into place. */
cot_err pki_write_file(const char *path, const char *data, size_t len, int mode, cot_errbuf *eb);

/* Read a PEM file of at most PKI_PEM_MAX bytes into *data (malloc'd,
 * NUL-terminated; *len excludes the NUL).  COT_ERR_TOO_LARGE beyond. */
cot_err pki_read_file(const char *path, char **data, size_t *len, cot_errbuf *eb);

/* Parse the first certificate / private key of a bounded PEM buffer.  The
 * caller frees *out with X509_free / EVP_PKEY_free. */
cot_err pki_parse_cert(const char *pem, size_t len, X509 **out, cot_errbuf *eb);
cot_err pki_parse_key(const char *pem, size_t len, EVP_PKEY **out, cot_errbuf *eb);

/* ---- Verifying peers against the pinned CA ---- */

typedef struct pki_trust pki_trust;

/* Pin ca_pem (len bytes) as the only trust anchor for project.  Refuses a
 * certificate that is not a self-signed CA or names another project. */
cot_err pki_trust_new(const char *ca_pem, size_t len, const char *project, pki_trust **out, cot_errbuf *eb);
void pki_trust_free(pki_trust *t);
const char *pki_trust_project(const pki_trust *t);

/* Check that cert was issued directly by the pinned CA, is inside its validity
 * window at now (Unix time, PKI_CLOCK_SKEW_S either way; PKI_NO_TIME_CHECK
 * skips that, for checking one's own certificate), is a host
 * certificate (not a CA; clientAuth and serverAuth) of this project, and
 * return its host id in *host_id.  COT_ERR_AUTH with a detail when refused. */
cot_err pki_trust_verify(const pki_trust *t, X509 *cert, int64_t now, int64_t *host_id, cot_errbuf *eb);

/* The same for a PEM certificate of len bytes. */
cot_err pki_trust_verify_pem(const pki_trust *t, const char *cert_pem, size_t len, int64_t now,
                             int64_t *host_id, cot_errbuf *eb);

#endif
