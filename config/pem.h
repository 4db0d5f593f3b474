/* pem -- what the files routes[].tls names hold, checked when the config is loaded: readable,
 * with PEM blocks of the right kind. Nothing is decoded here (OpenSSL is called from
 * proxy/upstream/tls.c alone); the proxy reads the files again for each new upstream connection. */
#ifndef RETRYPROXY_CONFIG_PEM_H
#define RETRYPROXY_CONFIG_PEM_H

#include <stdbool.h>

/* NULL when 'path' holds a certificate, else why not ("cannot be read ..."). */
const char *pem_check_certs(const char *path);
/* NULL when 'path' holds an unencrypted private key, else why not. */
const char *pem_check_key(const char *path);
/* Whether 'path' holds a private key (a certificate file may hold its key too). */
bool pem_has_key(const char *path);

#endif
