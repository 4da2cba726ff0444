/* cotrain: the project's public-key infrastructure for the peer transport.
 *
 * Every failure path clears OpenSSL's per-thread error queue, so that a stale
 * entry never confuses a later SSL_get_error() on the same thread. */
#include "shared/peer/pki.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

struct pki_ca {
	X509 *cert;
	EVP_PKEY *key;
	char project[PKI_PROJECT_MAX + 1];
};

struct pki_trust {
	X509_STORE *store; /* holds only the CA certificate */
	X509 *ca;
	char project[PKI_PROJECT_MAX + 1];
};

/* The first OpenSSL error as text (or "unknown error"), and clear the queue. */
static const char *ssl_reason(char *buf, size_t len)
{
	unsigned long e = ERR_peek_last_error();
	if (e)
		ERR_error_string_n(e, buf, len);
	else
		snprintf(buf, len, "unknown error");
	ERR_clear_error();
	return buf;
}

static cot_err ssl_fail(cot_errbuf *eb, cot_err e, const char *what)
{
	char r[256];
	return cot_seterr(eb, e, "%s: %s", what, ssl_reason(r, sizeof r));
}

bool pki_project_name_valid(const char *s)
{
	size_t n = 0;
	if (!s || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= '0' && s[0] <= '9')))
		return false;
	for (; s[n]; n++) {
		char c = s[n];
		if (n >= PKI_PROJECT_MAX)
			return false;
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
			return false;
	}
	return true;
}

/* ---- Names, times and small helpers ---- */

/* The single entry nid of name, copied NUL-terminated into out (outlen bytes).
 * False when it is absent, repeated, too long or holds a NUL. */
static bool name_get(const X509_NAME *name, int nid, char *out, size_t outlen)
{
	int i = X509_NAME_get_index_by_NID(name, nid, -1);
	if (i < 0 || X509_NAME_get_index_by_NID(name, nid, i) >= 0)
		return false;
	const ASN1_STRING *s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
	int n = ASN1_STRING_length(s);
	const unsigned char *d = ASN1_STRING_get0_data(s);
	if (n < 0 || (size_t)n >= outlen || memchr(d, '\0', (size_t)n))
		return false;
	memcpy(out, d, (size_t)n);
	out[n] = '\0';
	return true;
}

static void time_str(const ASN1_TIME *t, char *out, size_t len)
{
	struct tm tm;
	if (!ASN1_TIME_to_tm(t, &tm) || !strftime(out, len, "%Y-%m-%d %H:%M:%S UTC", &tm))
		snprintf(out, len, "(unreadable time)");
}

/* A certificate serial of 128 random bits with the top bit clear (positive,
 * at most 16 bytes as RFC 5280 allows 20). */
static cot_err set_random_serial(X509 *x, cot_errbuf *eb)
{
	unsigned char r[16];
	if (RAND_bytes(r, sizeof r) != 1)
		return ssl_fail(eb, COT_ERR_INTERNAL, "could not draw a certificate serial");
	r[0] &= 0x7f;
	r[0] |= 0x01 << 6; /* never a short serial */
	BIGNUM *bn = BN_bin2bn(r, sizeof r, NULL);
	int okay = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
	BN_free(bn);
	if (!okay)
		return ssl_fail(eb, COT_ERR_NOMEM, "could not set a certificate serial");
	return COT_OK;
}

static bool add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
	X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	if (!ext)
		return false;
	int r = X509_add_ext(x, ext, -1);
	X509_EXTENSION_free(ext);
	return r == 1;
}

static bool set_name(X509_NAME *n, const char *cn, const char *org)
{
	return X509_NAME_add_entry_by_NID(n, NID_commonName, MBSTRING_ASC, (const unsigned char *)cn, -1, -1,
	                                  0) == 1 &&
	       X509_NAME_add_entry_by_NID(n, NID_organizationName, MBSTRING_ASC, (const unsigned char *)org,
	                                  -1, -1, 0) == 1;
}

/* PEM text of what write() puts into a memory BIO, malloc'd and NUL-terminated. */
static cot_err bio_to_string(BIO *b, char **out, cot_errbuf *eb)
{
	char *data;
	long n = BIO_get_mem_data(b, &data);
	if (n <= 0)
		return ssl_fail(eb, COT_ERR_INTERNAL, "could not write PEM");
	char *s = malloc((size_t)n + 1);
	if (!s)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	memcpy(s, data, (size_t)n);
	s[n] = '\0';
	*out = s;
	return COT_OK;
}

static cot_err check_pem_input(const char *pem, size_t len, const char *what, cot_errbuf *eb)
{
	if (!pem || len == 0)
		return cot_seterr(eb, COT_ERR_INVALID, "empty %s", what);
	if (len > PKI_PEM_MAX)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "%s of %zu bytes exceeds the limit of %d bytes",
		                  what, len, PKI_PEM_MAX);
	return COT_OK;
}

cot_err pki_parse_cert(const char *pem, size_t len, X509 **out, cot_errbuf *eb)
{
	cot_err rc = check_pem_input(pem, len, "certificate", eb);
	if (rc)
		return rc;
	BIO *b = BIO_new_mem_buf(pem, (int)len);
	if (!b)
		return ssl_fail(eb, COT_ERR_NOMEM, "could not read certificate");
	X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
	BIO_free(b);
	if (!x)
		return ssl_fail(eb, COT_ERR_INVALID, "malformed certificate PEM");
	ERR_clear_error();
	*out = x;
	return COT_OK;
}

/* The passphrase callback refuses: keys are stored unencrypted (0600), and an
 * encrypted one must not make OpenSSL prompt on a terminal. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
	(void)buf, (void)size, (void)rwflag, (void)u;
	return -1;
}

cot_err pki_parse_key(const char *pem, size_t len, EVP_PKEY **out, cot_errbuf *eb)
{
	cot_err rc = check_pem_input(pem, len, "private key", eb);
	if (rc)
		return rc;
	BIO *b = BIO_new_mem_buf(pem, (int)len);
	if (!b)
		return ssl_fail(eb, COT_ERR_NOMEM, "could not read private key");
	EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL);
	BIO_free(b);
	if (!k)
		return ssl_fail(eb, COT_ERR_INVALID, "malformed private key PEM");
	ERR_clear_error();
	*out = k;
	return COT_OK;
}

/* True for the key types we sign and accept: Ed25519, ECDSA P-256. */
static bool key_type_allowed(EVP_PKEY *k)
{
	if (EVP_PKEY_is_a(k, "ED25519"))
		return true;
	if (EVP_PKEY_is_a(k, "EC")) {
		char g[64];
		size_t gl = 0;
		return EVP_PKEY_get_group_name(k, g, sizeof g, &gl) == 1 && strcmp(g, "prime256v1") == 0;
	}
	return false;
}

/* ---- Files ---- */

cot_err pki_write_file(const char *path, const char *data, size_t len, int mode, cot_errbuf *eb)
{
	char tmp[4096];
	if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
		return cot_seterr(eb, COT_ERR_INVALID, "path \"%s\" is too long", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not create file \"%s\": %s", tmp, strerror(errno));
	/* open() applies the umask; make the mode exact. */
	if (fchmod(fd, (mode_t)mode) != 0)
		goto fail;
	for (size_t off = 0; off < len;) {
		ssize_t w = write(fd, data + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			goto fail;
		off += (size_t)w;
	}
	if (fsync(fd) != 0)
		goto fail;
	if (close(fd) != 0) {
		fd = -1;
		goto fail;
	}
	if (rename(tmp, path) != 0) {
		fd = -1;
		goto fail;
	}
	return COT_OK;
fail:;
	int err = errno;
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	return cot_seterr(eb, COT_ERR_IO, "could not write file \"%s\": %s", path, strerror(err));
}

/* Read path into a NUL-terminated buffer; with private, refuse a file that
 * group or others may access. */
static cot_err read_file(const char *path, bool private, char **data, size_t *len, cot_errbuf *eb)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cot_seterr(eb, errno == ENOENT ? COT_ERR_NOT_FOUND : COT_ERR_IO,
		                  "could not open file \"%s\": %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int err = errno;
		close(fd);
		return cot_seterr(eb, COT_ERR_IO, "could not stat file \"%s\": %s", path, strerror(err));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return cot_seterr(eb, COT_ERR_INVALID, "\"%s\" is not a regular file", path);
	}
	if (private && (st.st_mode & 077)) {
		close(fd);
		cot_seterr(eb, COT_ERR_FORBIDDEN, "private key file \"%s\" is accessible by other users",
		           path);
		cot_sethint(eb, "Run chmod 600 on the file.");
		return COT_ERR_FORBIDDEN;
	}
	if (st.st_size > PKI_PEM_MAX) {
		close(fd);
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "file \"%s\" of %lld bytes exceeds the limit of %d bytes", path,
		                  (long long)st.st_size, PKI_PEM_MAX);
	}
	char *buf = malloc(PKI_PEM_MAX + 2);
	if (!buf) {
		close(fd);
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	}
	size_t n = 0;
	/* Read one byte past the limit, in case the file grew since fstat. */
	while (n < PKI_PEM_MAX + 1) {
		ssize_t r = read(fd, buf + n, PKI_PEM_MAX + 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int err = errno;
			close(fd);
			free(buf);
			return cot_seterr(eb, COT_ERR_IO, "could not read file \"%s\": %s", path,
			                  strerror(err));
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	if (n > PKI_PEM_MAX) {
		free(buf);
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "file \"%s\" exceeds the limit of %d bytes", path,
		                  PKI_PEM_MAX);
	}
	buf[n] = '\0';
	*data = buf;
	*len = n;
	return COT_OK;
}

cot_err pki_read_file(const char *path, char **data, size_t *len, cot_errbuf *eb)
{
	return read_file(path, false, data, len, eb);
}

/* ---- The CA ---- */

void pki_ca_free(pki_ca *ca)
{
	if (!ca)
		return;
	X509_free(ca->cert);
	EVP_PKEY_free(ca->key);
	free(ca);
}

const char *pki_ca_project(const pki_ca *ca) { return ca->project; }

cot_err pki_ca_create(const char *project, int lifetime_days, pki_ca **out, cot_errbuf *eb)
{
	if (!pki_project_name_valid(project))
		return cot_seterr(eb, COT_ERR_INVALID, "invalid project name \"%.80s\"",
		                  project ? project : "");
	if (lifetime_days == 0)
		lifetime_days = PKI_CA_LIFETIME_DEFAULT_DAYS;
	if (lifetime_days < 1 || lifetime_days > PKI_CA_LIFETIME_MAX_DAYS)
		return cot_seterr(eb, COT_ERR_INVALID, "CA lifetime of %d days is out of range 1..%d",
		                  lifetime_days, PKI_CA_LIFETIME_MAX_DAYS);
	pki_ca *ca = calloc(1, sizeof *ca);
	if (!ca)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	snprintf(ca->project, sizeof ca->project, "%s", project);
	cot_err rc;
	ca->key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	if (!ca->key) {
		rc = ssl_fail(eb, COT_ERR_INTERNAL, "could not generate the CA key");
		goto fail;
	}
	X509 *x = ca->cert = X509_new();
	if (!x || !X509_set_version(x, X509_VERSION_3)) {
		rc = ssl_fail(eb, COT_ERR_NOMEM, "could not make the CA certificate");
		goto fail;
	}
	rc = set_random_serial(x, eb);
	if (rc)
		goto fail;
	if (!X509_gmtime_adj(X509_getm_notBefore(x), -PKI_CLOCK_SKEW_S) ||
	    !X509_time_adj_ex(X509_getm_notAfter(x), lifetime_days, 0, NULL) ||
	    !set_name(X509_get_subject_name(x), project, project) ||
	    !X509_set_issuer_name(x, X509_get_subject_name(x)) || !X509_set_pubkey(x, ca->key) ||
	    !add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") ||
	    !add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") ||
	    !add_ext(x, x, NID_subject_key_identifier, "hash") || X509_sign(x, ca->key, NULL) <= 0) {
		rc = ssl_fail(eb, COT_ERR_INTERNAL, "could not make the CA certificate");
		goto fail;
	}
	*out = ca;
	return COT_OK;
fail:
	pki_ca_free(ca);
	return rc;
}

cot_err pki_ca_cert_pem(const pki_ca *ca, char **pem, cot_errbuf *eb)
{
	BIO *b = BIO_new(BIO_s_mem());
	if (!b || !PEM_write_bio_X509(b, ca->cert)) {
		BIO_free(b);
		return ssl_fail(eb, COT_ERR_NOMEM, "could not write the CA certificate");
	}
	cot_err rc = bio_to_string(b, pem, eb);
	BIO_free(b);
	return rc;
}

cot_err pki_ca_save(const pki_ca *ca, const char *cert_path, const char *key_path, cot_errbuf *eb)
{
	char *pem = NULL;
	cot_err rc = pki_ca_cert_pem(ca, &pem, eb);
	if (rc)
		return rc;
	rc = pki_write_file(cert_path, pem, strlen(pem), 0644, eb);
	free(pem);
	if (rc)
		return rc;
	BIO *b = BIO_new(BIO_s_mem());
	if (!b || !PEM_write_bio_PrivateKey(b, ca->key, NULL, NULL, 0, NULL, NULL)) {
		BIO_free(b);
		return ssl_fail(eb, COT_ERR_NOMEM, "could not write the CA key");
	}
	rc = bio_to_string(b, &pem, eb);
	BIO_free(b);
	if (rc)
		return rc;
	rc = pki_write_file(key_path, pem, strlen(pem), 0600, eb);
	OPENSSL_cleanse(pem, strlen(pem));
	free(pem);
	return rc;
}

/* Check that x is a self-signed CA certificate and copy its project (the O
 * of its subject, equal to its CN) into project. */
static cot_err check_ca_cert(X509 *x, char project[PKI_PROJECT_MAX + 1], cot_errbuf *eb)
{
	char cn[PKI_PROJECT_MAX + 1];
	if (X509_check_ca(x) < 1)
		return cot_seterr(eb, COT_ERR_AUTH, "certificate is not a CA certificate");
	if (X509_self_signed(x, 1) != 1) {
		ERR_clear_error();
		return cot_seterr(eb, COT_ERR_AUTH, "CA certificate is not self-signed");
	}
	if (!name_get(X509_get_subject_name(x), NID_organizationName, project, PKI_PROJECT_MAX + 1) ||
	    !name_get(X509_get_subject_name(x), NID_commonName, cn, sizeof cn) || strcmp(cn, project) != 0 ||
	    !pki_project_name_valid(project))
		return cot_seterr(eb, COT_ERR_AUTH, "CA certificate does not name a cotrain project");
	return COT_OK;
}

cot_err pki_ca_load(const char *cert_path, const char *key_path, pki_ca **out, cot_errbuf *eb)
{
	char *pem = NULL;
	size_t len = 0;
	cot_err rc;
	pki_ca *ca = calloc(1, sizeof *ca);
	if (!ca)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	rc = read_file(cert_path, false, &pem, &len, eb);
	if (rc)
		goto fail;
	rc = pki_parse_cert(pem, len, &ca->cert, eb);
	free(pem);
	pem = NULL;
	if (rc || (rc = check_ca_cert(ca->cert, ca->project, eb)))
		goto fail;
	rc = read_file(key_path, true, &pem, &len, eb);
	if (rc)
		goto fail;
	rc = pki_parse_key(pem, len, &ca->key, eb);
	OPENSSL_cleanse(pem, len);
	free(pem);
	if (rc)
		goto fail;
	if (X509_check_private_key(ca->cert, ca->key) != 1) {
		ERR_clear_error();
		rc = cot_seterr(eb, COT_ERR_INVALID, "CA key \"%s\" does not match certificate \"%s\"",
		                key_path, cert_path);
		goto fail;
	}
	*out = ca;
	return COT_OK;
fail:
	pki_ca_free(ca);
	return rc;
}

cot_err pki_ca_sign_host(const pki_ca *ca, const char *pubkey_pem, size_t len, int64_t host_id,
                         int64_t not_before, int64_t lifetime_s, char **cert_pem, cot_errbuf *eb)
{
	if (host_id <= 0)
		return cot_seterr(eb, COT_ERR_INVALID, "invalid host id %lld", (long long)host_id);
	if (lifetime_s == 0)
		lifetime_s = PKI_HOST_LIFETIME_DEFAULT_S;
	if (lifetime_s < PKI_HOST_LIFETIME_MIN_S || lifetime_s > PKI_HOST_LIFETIME_MAX_S)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "certificate lifetime of %lld seconds is out of range %d..%d",
		                  (long long)lifetime_s, PKI_HOST_LIFETIME_MIN_S, PKI_HOST_LIFETIME_MAX_S);
	if (not_before == 0)
		not_before = (int64_t)time(NULL);
	if (not_before < 0 || not_before > INT64_C(253402300799) - lifetime_s)
		return cot_seterr(eb, COT_ERR_INVALID, "certificate start time %lld is out of range",
		                  (long long)not_before);
	cot_err rc = check_pem_input(pubkey_pem, len, "public key", eb);
	if (rc)
		return rc;
	BIO *b = BIO_new_mem_buf(pubkey_pem, (int)len);
	EVP_PKEY *pub = b ? PEM_read_bio_PUBKEY(b, NULL, NULL, NULL) : NULL;
	BIO_free(b);
	if (!pub)
		return ssl_fail(eb, COT_ERR_INVALID, "malformed public key PEM");
	if (!key_type_allowed(pub)) {
		const char *type = EVP_PKEY_get0_type_name(pub);
		cot_seterr(eb, COT_ERR_INVALID, "cannot sign a %s public key", type ? type : "unknown");
		cot_sethint(eb, "Host keys must be Ed25519 or ECDSA P-256.");
		EVP_PKEY_free(pub);
		return COT_ERR_INVALID;
	}
	char cn[32];
	snprintf(cn, sizeof cn, "host:%lld", (long long)host_id);
	X509 *x = X509_new();
	if (!x || !X509_set_version(x, X509_VERSION_3)) {
		rc = ssl_fail(eb, COT_ERR_NOMEM, "could not make a host certificate");
		goto done;
	}
	rc = set_random_serial(x, eb);
	if (rc)
		goto done;
	if (!ASN1_TIME_set(X509_getm_notBefore(x), (time_t)not_before) ||
	    !ASN1_TIME_set(X509_getm_notAfter(x), (time_t)(not_before + lifetime_s)) ||
	    !set_name(X509_get_subject_name(x), cn, ca->project) ||
	    !X509_set_issuer_name(x, X509_get_subject_name(ca->cert)) || !X509_set_pubkey(x, pub) ||
	    !add_ext(x, ca->cert, NID_basic_constraints, "critical,CA:FALSE") ||
	    !add_ext(x, ca->cert, NID_key_usage, "critical,digitalSignature") ||
	    !add_ext(x, ca->cert, NID_ext_key_usage, "clientAuth,serverAuth") ||
	    !add_ext(x, ca->cert, NID_subject_key_identifier, "hash") ||
	    !add_ext(x, ca->cert, NID_authority_key_identifier, "keyid:always") ||
	    X509_sign(x, ca->key, NULL) <= 0) {
		rc = ssl_fail(eb, COT_ERR_INTERNAL, "could not make a host certificate");
		goto done;
	}
	b = BIO_new(BIO_s_mem());
	if (!b || !PEM_write_bio_X509(b, x)) {
		BIO_free(b);
		rc = ssl_fail(eb, COT_ERR_NOMEM, "could not write a host certificate");
		goto done;
	}
	rc = bio_to_string(b, cert_pem, eb);
	BIO_free(b);
done:
	X509_free(x);
	EVP_PKEY_free(pub);
	return rc;
}

/* ---- The host side ---- */

cot_err pki_host_key_generate(char **key_pem, char **pub_pem, cot_errbuf *eb)
{
	EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	if (!k)
		return ssl_fail(eb, COT_ERR_INTERNAL, "could not generate a host key");
	cot_err rc;
	char *priv = NULL;
	BIO *b = BIO_new(BIO_s_mem());
	if (!b || !PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL)) {
		rc = ssl_fail(eb, COT_ERR_NOMEM, "could not write a host key");
		goto done;
	}
	rc = bio_to_string(b, &priv, eb);
	if (rc)
		goto done;
	BIO_free(b);
	b = BIO_new(BIO_s_mem());
	if (!b || !PEM_write_bio_PUBKEY(b, k)) {
		rc = ssl_fail(eb, COT_ERR_NOMEM, "could not write a host public key");
		goto done;
	}
	rc = bio_to_string(b, pub_pem, eb);
	if (rc)
		goto done;
	*key_pem = priv;
	priv = NULL;
done:
	if (priv) {
		OPENSSL_cleanse(priv, strlen(priv));
		free(priv);
	}
	BIO_free(b);
	EVP_PKEY_free(k);
	return rc;
}

/* ---- Trust ---- */

void pki_trust_free(pki_trust *t)
{
	if (!t)
		return;
	X509_STORE_free(t->store);
	X509_free(t->ca);
	free(t);
}

const char *pki_trust_project(const pki_trust *t) { return t->project; }

cot_err pki_trust_new(const char *ca_pem, size_t len, const char *project, pki_trust **out, cot_errbuf *eb)
{
	if (!pki_project_name_valid(project))
		return cot_seterr(eb, COT_ERR_INVALID, "invalid project name \"%.80s\"",
		                  project ? project : "");
	pki_trust *t = calloc(1, sizeof *t);
	if (!t)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	cot_err rc = pki_parse_cert(ca_pem, len, &t->ca, eb);
	if (rc)
		goto fail;
	rc = check_ca_cert(t->ca, t->project, eb);
	if (rc)
		goto fail;
	if (strcmp(t->project, project) != 0) {
		rc = cot_seterr(eb, COT_ERR_AUTH, "CA certificate is for project \"%s\", not \"%s\"",
		                t->project, project);
		goto fail;
	}
	t->store = X509_STORE_new();
	if (!t->store || !X509_STORE_add_cert(t->store, t->ca)) {
		rc = ssl_fail(eb, COT_ERR_NOMEM, "could not pin the CA certificate");
		goto fail;
	}
	*out = t;
	return COT_OK;
fail:
	pki_trust_free(t);
	return rc;
}

/* Parse "host:<id>" with id a decimal in 1..INT64_MAX without leading zeros. */
static bool parse_host_cn(const char *cn, int64_t *id)
{
	if (strncmp(cn, "host:", 5) != 0)
		return false;
	const char *p = cn + 5;
	if (*p < '1' || *p > '9')
		return false;
	int64_t v = 0;
	for (; *p; p++) {
		if (*p < '0' || *p > '9' || v > (INT64_MAX - (*p - '0')) / 10)
			return false;
		v = v * 10 + (*p - '0');
	}
	*id = v;
	return true;
}

/* Refuse cert (of whom, for messages) outside [notBefore - skew, notAfter + skew]. */
static cot_err check_validity(X509 *cert, const char *whom, int64_t now, cot_errbuf *eb)
{
	char ts[64];
	time_t early = (time_t)(now + PKI_CLOCK_SKEW_S), late = (time_t)(now - PKI_CLOCK_SKEW_S);
	int c = X509_cmp_time(X509_get0_notBefore(cert), &early);
	if (c == 0)
		goto bad;
	if (c > 0) {
		time_str(X509_get0_notBefore(cert), ts, sizeof ts);
		cot_seterr(eb, COT_ERR_AUTH, "%s is not valid before %s", whom, ts);
		cot_sethint(eb, "Check that this computer's clock is right.");
		return COT_ERR_AUTH;
	}
	c = X509_cmp_time(X509_get0_notAfter(cert), &late);
	if (c == 0)
		goto bad;
	if (c < 0) {
		time_str(X509_get0_notAfter(cert), ts, sizeof ts);
		cot_seterr(eb, COT_ERR_AUTH, "%s expired at %s", whom, ts);
		cot_sethint(eb, "Host certificates are short-lived; the client renews them from the project "
		                "server.");
		return COT_ERR_AUTH;
	}
	return COT_OK;
bad:
	ERR_clear_error();
	return cot_seterr(eb, COT_ERR_AUTH, "%s has an unreadable validity period", whom);
}

cot_err pki_trust_verify(const pki_trust *t, X509 *cert, int64_t now, int64_t *host_id, cot_errbuf *eb)
{
	char cn[64], org[PKI_PROJECT_MAX + 1];
	int64_t id = 0;
	if (!cert)
		return cot_seterr(eb, COT_ERR_AUTH, "peer presented no certificate");
	if (!name_get(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn))
		return cot_seterr(eb, COT_ERR_AUTH, "certificate has no single common name");
	if (X509_check_ca(cert) != 0)
		return cot_seterr(eb, COT_ERR_AUTH,
		                  "certificate \"%s\" is a CA certificate, not a host certificate", cn);
	if (!parse_host_cn(cn, &id))
		return cot_seterr(eb, COT_ERR_AUTH, "certificate \"%.63s\" does not name a host", cn);

	/* The chain: cert must be issued directly by the pinned CA.  Times are
	 * checked below, with the tolerated clock skew; no untrusted
	 * intermediates are offered, so nothing the peer sends can extend it. */
	X509_STORE_CTX *ctx = X509_STORE_CTX_new();
	if (!ctx || !X509_STORE_CTX_init(ctx, t->store, cert, NULL)) {
		X509_STORE_CTX_free(ctx);
		return ssl_fail(eb, COT_ERR_NOMEM, "could not verify a certificate");
	}
	X509_VERIFY_PARAM *param = X509_STORE_CTX_get0_param(ctx);
	X509_VERIFY_PARAM_set_flags(param, X509_V_FLAG_NO_CHECK_TIME | X509_V_FLAG_X509_STRICT);
	X509_VERIFY_PARAM_set_depth(param, 0);
	int v = X509_verify_cert(ctx);
	int verr = X509_STORE_CTX_get_error(ctx);
	X509_STORE_CTX_free(ctx);
	ERR_clear_error();
	if (v != 1) {
		cot_seterr(eb, COT_ERR_AUTH, "certificate \"%s\" is not from the CA of project \"%s\": %s",
		           cn, t->project, X509_verify_cert_error_string(verr));
		cot_sethint(eb, "Only hosts registered with this project may join its groups.");
		return COT_ERR_AUTH;
	}
	cot_err rc;
	char whom[96];
	snprintf(whom, sizeof whom, "certificate \"%s\"", cn);
	if (now != PKI_NO_TIME_CHECK &&
	    ((rc = check_validity(t->ca, "the project CA certificate", now, eb)) ||
	     (rc = check_validity(cert, whom, now, eb))))
		return rc;
	if (!name_get(X509_get_subject_name(cert), NID_organizationName, org, sizeof org) ||
	    strcmp(org, t->project) != 0)
		return cot_seterr(eb, COT_ERR_AUTH, "certificate \"%s\" is not for project \"%s\"", cn,
		                  t->project);
	if (X509_check_purpose(cert, X509_PURPOSE_SSL_CLIENT, 0) != 1 ||
	    X509_check_purpose(cert, X509_PURPOSE_SSL_SERVER, 0) != 1) {
		ERR_clear_error();
		return cot_seterr(eb, COT_ERR_AUTH, "certificate \"%s\" is not for peer connections", cn);
	}
	ERR_clear_error();
	*host_id = id;
	return COT_OK;
}

cot_err pki_trust_verify_pem(const pki_trust *t, const char *cert_pem, size_t len, int64_t now,
                             int64_t *host_id, cot_errbuf *eb)
{
	X509 *x = NULL;
	cot_err rc = pki_parse_cert(cert_pem, len, &x, eb);
	if (rc)
		return rc;
	rc = pki_trust_verify(t, x, now, host_id, eb);
	X509_free(x);
	return rc;
}
