/* version -- what `retryproxy --version` prints and retryproxy_build_info{version} shows (a
 * constant of telemetry/, which the metrics read, below the command line that prints it too). */
#ifndef RETRYPROXY_PROXY_VERSION_H
#define RETRYPROXY_PROXY_VERSION_H

#define RETRYPROXY_VERSION "0.1.0"

#endif
