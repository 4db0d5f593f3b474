/* version -- what `retryproxy --version` prints and retryproxy_build_info{version} shows. */
#ifndef RETRYPROXY_PROXY_VERSION_H
#define RETRYPROXY_PROXY_VERSION_H

#define RETRYPROXY_VERSION "0.1.0"

#endif
