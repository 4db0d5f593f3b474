/* tlsfix -- the TLS fixtures of the suites that speak TLS to an upstream (test_upstream_tls,
 * test_h2_tls): certificates and keys made for the test in a temporary directory of its own,
 * files made of them, and the members of a route's "tls" object that name them.
 */
#ifndef RETRYPROXY_TESTS_SUPPORT_TLSFIX_H
#define RETRYPROXY_TESTS_SUPPORT_TLSFIX_H

/* A certificate's file and its key's. */
struct tls_pair {
    char pem[128], key[128];
};

/* A self-signed certificate whose subjectAltName is 'san' ("IP:127.0.0.1",
 * "DNS:upstream.test") in DIR/NAME.pem, its key in DIR/NAME.key; DIR, the test's directory, is
 * made on first use. */
struct tls_pair tlsfix_cert(const char *name, const char *san);

/* DIR/NAME.EXT (the last four results stay valid). */
const char *tlsfix_path(const char *name, const char *ext);

/* DIR/NAME written with the files 'a' then 'b': a certificate and its key in one file, or two
 * certificates to trust. The path (the last four results stay valid). */
const char *tlsfix_cat(const char *name, const char *a, const char *b);

/* The "tls" members that trust 'pem': "ca_file": "PEM" (the last four results stay valid). */
const char *tlsfix_trust(const char *pem);

/* The "tls" members that present the certificate 'pem' with the key 'key': "cert_file": "PEM",
 * "key_file": "KEY", or "cert_file" alone when 'key' is NULL (the key in the certificate's file)
 * (the last four results stay valid). */
const char *tlsfix_present(const char *pem, const char *key);

/* The suites' .fini: every h2u upstream and the proxy stopped, the directory removed. */
void tlsfix_stop(void);

#endif
