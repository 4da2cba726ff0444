/* cotrain tests: the project CA, host certificates and their verification. */
#include "shared/peer/pki.h"
#include "tests/tap.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

static char dir[64];

static void path_in(char *out, size_t len, const char *name) { snprintf(out, len, "%s/%s", dir, name); }

/* Sign pub for host id with ca; bails out on failure (setup, not a check). */
static char *issue(const pki_ca *ca, const char *pub, int64_t id, int64_t nb, int64_t life)
{
	cot_errbuf eb = { 0 };
	char *cert = NULL;
	if (pki_ca_sign_host(ca, pub, strlen(pub), id, nb, life, &cert, &eb))
		bail_out("could not issue a certificate: %s", eb.msg);
	return cert;
}

/* Verify cert_pem with t at now; returns the code, the detail in eb. */
static cot_err verify(const pki_trust *t, const char *cert, int64_t now, int64_t *id, cot_errbuf *eb)
{
	memset(eb, 0, sizeof *eb);
	return pki_trust_verify_pem(t, cert, strlen(cert), now, id, eb);
}

/* A certificate for a subordinate CA (CA:TRUE) signed by the project CA key,
 * made by hand as an attacker holding such a certificate would present it. */
static char *make_sub_ca(const char *ca_cert_pem, const char *ca_key_pem, const char *project)
{
	BIO *b = BIO_new_mem_buf(ca_cert_pem, -1);
	X509 *cacert = PEM_read_bio_X509(b, NULL, NULL, NULL);
	BIO_free(b);
	b = BIO_new_mem_buf(ca_key_pem, -1);
	EVP_PKEY *cakey = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
	BIO_free(b);
	EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	X509 *x = X509_new();
	X509_set_version(x, X509_VERSION_3);
	ASN1_INTEGER_set(X509_get_serialNumber(x), 12345);
	X509_gmtime_adj(X509_getm_notBefore(x), -60);
	X509_gmtime_adj(X509_getm_notAfter(x), 3600);
	X509_NAME *n = X509_get_subject_name(x);
	X509_NAME_add_entry_by_NID(n, NID_commonName, MBSTRING_ASC, (const unsigned char *)"host:9", -1, -1,
	                           0);
	X509_NAME_add_entry_by_NID(n, NID_organizationName, MBSTRING_ASC, (const unsigned char *)project, -1,
	                           -1, 0);
	X509_set_issuer_name(x, X509_get_subject_name(cacert));
	X509_set_pubkey(x, k);
	X509V3_CTX ctx;
	X509V3_set_ctx(&ctx, cacert, x, NULL, NULL, 0);
	X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, NID_basic_constraints, "critical,CA:TRUE");
	X509_add_ext(x, e, -1);
	X509_EXTENSION_free(e);
	e = X509V3_EXT_conf_nid(NULL, &ctx, NID_ext_key_usage, "clientAuth,serverAuth");
	X509_add_ext(x, e, -1);
	X509_EXTENSION_free(e);
	if (!cacert || !cakey || X509_sign(x, cakey, NULL) <= 0)
		bail_out("could not make a subordinate CA certificate");
	b = BIO_new(BIO_s_mem());
	PEM_write_bio_X509(b, x);
	char *data;
	long len = BIO_get_mem_data(b, &data);
	char *out = strndup(data, (size_t)len);
	BIO_free(b);
	X509_free(x);
	X509_free(cacert);
	EVP_PKEY_free(cakey);
	EVP_PKEY_free(k);
	return out;
}

int main(void)
{
	cot_errbuf eb = { 0 };
	char certp[PATH_MAX], keyp[PATH_MAX];
	int64_t now = (int64_t)time(NULL), id = 0;

	plan_lazy();
	snprintf(dir, sizeof dir, "/tmp/cot-pki-XXXXXX");
	if (!mkdtemp(dir))
		bail_out("mkdtemp failed");
	path_in(certp, sizeof certp, "ca.pem");
	path_in(keyp, sizeof keyp, "ca.key");

	/* Names. */
	ok(pki_project_name_valid("demo-1"), "demo-1 is a valid project name");
	ok(!pki_project_name_valid("Demo"), "uppercase is not a valid project name");
	ok(!pki_project_name_valid("-demo"), "a leading dash is not a valid project name");
	ok(!pki_project_name_valid(""), "the empty name is not valid");

	/* CA create, save, load. */
	pki_ca *ca = NULL, *ca2 = NULL;
	is_int(pki_ca_create("Bad Name", 0, &ca, &eb), COT_ERR_INVALID,
	       "a CA for a bad project name is refused");
	memset(&eb, 0, sizeof eb);
	if (pki_ca_create("demo", 0, &ca, &eb))
		bail_out("could not create a CA: %s", eb.msg);
	is_str(pki_ca_project(ca), "demo", "the CA names its project");
	is_int(pki_ca_save(ca, certp, keyp, &eb), COT_OK, "the CA is saved");
	struct stat st = { 0 };
	int src = stat(keyp, &st);
	ok(src == 0 && (st.st_mode & 0777) == 0600, "the CA key file has mode 0600 (got %o)",
	   (unsigned)(st.st_mode & 0777));
	is_int(pki_ca_load(certp, keyp, &ca2, &eb), COT_OK, "the CA loads back: %s", eb.msg);
	char *pem1 = NULL, *pem2 = NULL;
	pki_ca_cert_pem(ca, &pem1, &eb);
	if (ca2)
		pki_ca_cert_pem(ca2, &pem2, &eb);
	ok(pem1 && pem2 && strcmp(pem1, pem2) == 0, "the loaded CA has the same certificate");
	is_str(ca2 ? pki_ca_project(ca2) : "", "demo", "the loaded CA names its project");
	chmod(keyp, 0644);
	pki_ca *ca3 = NULL;
	memset(&eb, 0, sizeof eb);
	is_int(pki_ca_load(certp, keyp, &ca3, &eb), COT_ERR_FORBIDDEN, "a CA key others can read is refused");
	ok(strstr(eb.msg, "accessible by other users") != NULL && eb.hint[0], "with a detail and a hint: %s",
	   eb.msg);
	chmod(keyp, 0600);

	/* A key that does not match. */
	pki_ca *other = NULL;
	char ocert[PATH_MAX], okey[PATH_MAX];
	path_in(ocert, sizeof ocert, "other.pem");
	path_in(okey, sizeof okey, "other.key");
	if (pki_ca_create("demo", 0, &other, &eb) || pki_ca_save(other, ocert, okey, &eb))
		bail_out("could not make a second CA: %s", eb.msg);
	memset(&eb, 0, sizeof eb);
	is_int(pki_ca_load(certp, okey, &ca3, &eb), COT_ERR_INVALID, "a CA key of another CA is refused: %s",
	       eb.msg);

	/* Trust. */
	pki_trust *trust = NULL, *tother = NULL;
	is_int(pki_trust_new(pem1, strlen(pem1), "demo", &trust, &eb), COT_OK, "the CA is pinned");
	memset(&eb, 0, sizeof eb);
	pki_trust *tx = NULL;
	is_int(pki_trust_new(pem1, strlen(pem1), "other", &tx, &eb), COT_ERR_AUTH,
	       "pinning a CA for another project name is refused: %s", eb.msg);

	/* A host key, certificate and verification. */
	char *hkey = NULL, *hpub = NULL;
	is_int(pki_host_key_generate(&hkey, &hpub, &eb), COT_OK, "a host key pair is generated");
	ok(hkey && strstr(hkey, "PRIVATE KEY") && hpub && strstr(hpub, "PUBLIC KEY"), "as PEM");
	char hkeyp[PATH_MAX];
	path_in(hkeyp, sizeof hkeyp, "host.key");
	is_int(pki_write_file(hkeyp, hkey, strlen(hkey), 0600, &eb), COT_OK, "the host key is stored");
	char *back = NULL;
	size_t blen = 0;
	is_int(pki_read_file(hkeyp, &back, &blen, &eb), COT_OK, "and read back");
	ok(back && blen == strlen(hkey) && memcmp(back, hkey, blen) == 0, "unchanged");
	free(back);

	char *cert = issue(ca, hpub, 42, 0, 0);
	is_int(verify(trust, cert, now, &id, &eb), COT_OK, "a fresh host certificate verifies: %s", eb.msg);
	is_int(id, 42, "and names host 42");
	X509 *x = NULL;
	pki_parse_cert(cert, strlen(cert), &x, &eb);
	ok(x && X509_get0_notAfter(x) &&
	           ASN1_TIME_cmp_time_t(X509_get0_notAfter(x),
	                                (time_t)(now + PKI_HOST_LIFETIME_DEFAULT_S + 5)) <= 0 &&
	           ASN1_TIME_cmp_time_t(X509_get0_notAfter(x),
	                                (time_t)(now + PKI_HOST_LIFETIME_DEFAULT_S - 5)) >= 0,
	   "the default lifetime is %d seconds", PKI_HOST_LIFETIME_DEFAULT_S);
	ok(x && X509_check_ca(x) == 0, "a host certificate is not a CA");
	ok(x && (X509_get_extended_key_usage(x) & (XKU_SSL_CLIENT | XKU_SSL_SERVER)) ==
	                   (XKU_SSL_CLIENT | XKU_SSL_SERVER),
	   "it allows clientAuth and serverAuth");
	ok(x && (X509_get_key_usage(x) & KU_DIGITAL_SIGNATURE), "its key usage is digitalSignature");
	X509_free(x);
	char *cert2 = issue(ca, hpub, 42, 0, 0);
	ok(strcmp(cert, cert2) != 0, "two certificates for one key differ (random serials)");
	free(cert2);

	/* The loaded CA issues certificates the original's pin accepts. */
	char *c3 = issue(ca2, hpub, 7, 0, 0);
	is_int(verify(trust, c3, now, &id, &eb), COT_OK, "a certificate from the reloaded CA verifies");
	is_int(id, 7, "and names host 7");
	free(c3);

	/* Times. */
	char *expired = issue(ca, hpub, 42, now - 10 * 3600, 3600);
	is_int(verify(trust, expired, now, &id, &eb), COT_ERR_AUTH, "an expired certificate is refused");
	ok(strstr(eb.msg, "expired at") != NULL, "saying it expired: %s", eb.msg);
	char *future = issue(ca, hpub, 42, now + 3600, 3600);
	is_int(verify(trust, future, now, &id, &eb), COT_ERR_AUTH, "a not yet valid certificate is refused");
	ok(strstr(eb.msg, "not valid before") != NULL && eb.hint[0], "saying when, with a hint: %s", eb.msg);
	char *skewed = issue(ca, hpub, 42, now + 60, 3600);
	is_int(verify(trust, skewed, now, &id, &eb), COT_OK,
	       "a certificate starting a minute ahead is within the clock skew");
	char *just = issue(ca, hpub, 42, now - 3600 - 60, 3600);
	is_int(verify(trust, just, now, &id, &eb), COT_OK,
	       "a certificate expired a minute ago is within the clock skew");
	is_int(verify(trust, just, now + PKI_CLOCK_SKEW_S, &id, &eb), COT_ERR_AUTH, "but not beyond it");
	free(expired);
	free(future);
	free(skewed);
	free(just);

	/* Wrong CA, wrong project. */
	char *foreign = issue(other, hpub, 42, 0, 0);
	is_int(verify(trust, foreign, now, &id, &eb), COT_ERR_AUTH,
	       "a certificate from another CA of the same name is refused");
	ok(strstr(eb.msg, "is not from the CA of project \"demo\"") != NULL, "naming the project: %s",
	   eb.msg);
	free(foreign);
	pki_ca *pca = NULL;
	if (pki_ca_create("elsewhere", 0, &pca, &eb))
		bail_out("could not create a CA: %s", eb.msg);
	char *ppem = NULL;
	pki_ca_cert_pem(pca, &ppem, &eb);
	if (pki_trust_new(ppem, strlen(ppem), "elsewhere", &tother, &eb))
		bail_out("could not pin: %s", eb.msg);
	char *pcert = issue(pca, hpub, 42, 0, 0);
	is_int(verify(tother, pcert, now, &id, &eb), COT_OK,
	       "the other project's certificate verifies against its own CA");
	is_int(verify(trust, pcert, now, &id, &eb), COT_ERR_AUTH, "but not against this project's");
	is_int(verify(tother, cert, now, &id, &eb), COT_ERR_AUTH, "nor ours against theirs");
	free(pcert);

	/* CA certificates are not host certificates. */
	is_int(verify(trust, pem1, now, &id, &eb), COT_ERR_AUTH,
	       "the CA certificate itself is refused as a host certificate");
	ok(strstr(eb.msg, "is a CA certificate") != NULL, "saying it is a CA: %s", eb.msg);
	char *cakey = NULL;
	size_t cakeylen = 0;
	pki_read_file(keyp, &cakey, &cakeylen, &eb);
	char *sub = make_sub_ca(pem1, cakey, "demo");
	is_int(verify(trust, sub, now, &id, &eb), COT_ERR_AUTH,
	       "a subordinate CA signed by the project CA is refused");
	ok(strstr(eb.msg, "is a CA certificate") != NULL, "saying it is a CA: %s", eb.msg);
	free(sub);
	free(cakey);

	/* Hostile input. */
	is_int(verify(trust, "garbage", now, &id, &eb), COT_ERR_INVALID,
	       "garbage is refused as malformed: %s", eb.msg);
	size_t clen = strlen(cert);
	char *trunc = strndup(cert, clen / 2);
	is_int(verify(trust, trunc, now, &id, &eb), COT_ERR_INVALID, "a truncated PEM is refused: %s",
	       eb.msg);
	free(trunc);
	/* One letter of the base64 body changed into another: still valid
	 * base64, so the damage reaches the DER or the signature. */
	char *flipped = strdup(cert);
	size_t at = clen / 2;
	while (!(flipped[at] >= 'a' && flipped[at] <= 'z'))
		at++;
	flipped[at] = flipped[at] == 'z' ? 'y' : (char)(flipped[at] + 1);
	cot_err frc = verify(trust, flipped, now, &id, &eb);
	ok(frc == COT_ERR_INVALID || frc == COT_ERR_AUTH,
	   "a certificate with one changed character is refused (%s): %s", cot_strerror(frc), eb.msg);
	free(flipped);
	size_t big = PKI_PEM_MAX + 1;
	char *huge = malloc(big + 1);
	memset(huge, 'A', big);
	huge[big] = '\0';
	memset(&eb, 0, sizeof eb);
	is_int(pki_trust_verify_pem(trust, huge, big, now, &id, &eb), COT_ERR_TOO_LARGE,
	       "an oversized PEM is refused: %s", eb.msg);
	is_int(pki_trust_new("", 0, "demo", &tx, &eb), COT_ERR_INVALID, "an empty CA certificate is refused");
	is_int(pki_trust_new(cert, clen, "demo", &tx, &eb), COT_ERR_AUTH,
	       "a host certificate cannot be pinned as the CA");
	char *sc = NULL;
	is_int(pki_ca_sign_host(ca, "garbage", 7, 42, 0, 0, &sc, &eb), COT_ERR_INVALID,
	       "signing a garbage public key is refused");
	is_int(pki_ca_sign_host(ca, hpub, strlen(hpub), 0, 0, 0, &sc, &eb), COT_ERR_INVALID,
	       "signing for host id 0 is refused");
	is_int(pki_ca_sign_host(ca, hpub, strlen(hpub), 42, 0, 10, &sc, &eb), COT_ERR_INVALID,
	       "a 10-second lifetime is refused");
	EVP_PKEY *rsa = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
	BIO *b = BIO_new(BIO_s_mem());
	PEM_write_bio_PUBKEY(b, rsa);
	char *rp;
	long rl = BIO_get_mem_data(b, &rp);
	memset(&eb, 0, sizeof eb);
	is_int(pki_ca_sign_host(ca, rp, (size_t)rl, 42, 0, 0, &sc, &eb), COT_ERR_INVALID,
	       "an RSA public key is refused: %s", eb.msg);
	BIO_free(b);
	EVP_PKEY_free(rsa);
	memset(&eb, 0, sizeof eb);
	is_int(pki_read_file(dir, &back, &blen, &eb), COT_ERR_INVALID,
	       "reading a directory as PEM is refused");
	FILE *f = fopen(certp, "w");
	fwrite(huge, 1, big, f);
	fclose(f);
	is_int(pki_ca_load(certp, keyp, &ca3, &eb), COT_ERR_TOO_LARGE,
	       "an oversized CA certificate file is refused: %s", eb.msg);
	free(huge);

	free(pem1);
	free(pem2);
	free(ppem);
	free(cert);
	free(hkey);
	free(hpub);
	pki_trust_free(trust);
	pki_trust_free(tother);
	pki_ca_free(ca);
	pki_ca_free(ca2);
	pki_ca_free(other);
	pki_ca_free(pca);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		diag("could not remove %s", dir);
	done_testing();
	return exit_status();
}
