/* retry_after -- parse HTTP Retry-After (RFC 9110 §10.2.3) into a delay in milliseconds.
 *
 * Accepts delta-seconds (1*DIGIT) and the three HTTP-date forms: IMF-fixdate
 * ("Sun, 06 Nov 1994 08:49:37 GMT"), RFC 850 ("Sunday, 06-Nov-94 08:49:37 GMT") and asctime
 * ("Sun Nov  6 08:49:37 1994"). Optional whitespace around the value is ignored. Pure: the
 * caller passes "now" as Unix time in milliseconds.
 */
#ifndef RETRYPROXY_POLICY_RETRY_AFTER_H
#define RETRYPROXY_POLICY_RETRY_AFTER_H

#include <stddef.h>
#include <stdint.h>

/* Parses one field value of 'len' bytes (need not be NUL-terminated). On success stores the
 * delay in *delay_ms and returns 0. A date at or before 'now_unix_ms' gives 0 (retry now).
 * Returns -EINVAL for anything malformed (a sign, a fraction, a list, trailing bytes, an
 * impossible date such as 31 Feb), -ERANGE for a value too large to represent in
 * milliseconds. Never wraps. *delay_ms is untouched on error. */
int retry_after_parse(const char *value, size_t len, int64_t now_unix_ms, uint64_t *delay_ms);

/* Same, given every Retry-After field line of a response: exactly one must be present.
 * Returns -ENOENT for none and -EINVAL for more than one (duplicates are ambiguous, even when
 * equal), otherwise as retry_after_parse(). */
int retry_after_parse_fields(const char *const *values, const size_t *lens, size_t n,
                             int64_t now_unix_ms, uint64_t *delay_ms);

#endif
