/* seal -- the sensitive fields of a stored request, sealed with AES-256-GCM (docs/delivery.md,
 * "Secrets at rest").
 *
 * A field whose name is Authorization, Cookie, Proxy-Authorization or one of
 * store.sensitive_fields never reaches the file in clear: with a key, its value is sealed (a
 * random 96-bit nonce per value, the delivery's id as additional data, so a sealed value moved
 * to another row does not open) and opened again when the delivery is read back; without a key
 * the field is not stored at all. What a sealed value looks like in the file: SEAL_MARK, then
 * base64 of nonce | ciphertext | tag. A field value never holds SEAL_MARK (a control character
 * HTTP does not allow in a value), so a sealed value is never taken for a clear one.
 *
 * Called by the store thread only (sqlite_sql.c); OpenSSL's libcrypto is called from here.
 */
#ifndef RETRYPROXY_PROXY_STORE_SEAL_H
#define RETRYPROXY_PROXY_STORE_SEAL_H

#include <stdbool.h>
#include <stddef.h>

#define SEAL_KEY_BYTES 32
#define SEAL_MARK      '\x01'
/* What the admin API, the CLI and the log show in place of a sensitive field's value. */
#define SEAL_REDACTED "[redacted]"

/* Whether field 'name' is sensitive: the three credential fields, or one of 'extra' (n of
 * them), compared without case. */
bool seal_sensitive(const char *name, const char *const *extra, size_t n);

/* Reads a 256-bit key from 'path': 32 bytes, or 64 hex digits and an optional newline (what
 * config/schema_values.c accepts at load). 0, or -1 with why in 'err'. */
int seal_key_load(const char *path, unsigned char key[SEAL_KEY_BYTES], char *err, size_t cap);

/* 'value' sealed under 'key' with 'id' as additional data: a malloc'd NUL-terminated string,
 * or NULL (out of memory, or the cipher failed). */
char *seal_value(const unsigned char key[SEAL_KEY_BYTES], const char *id, const char *value);

/* Whether 'value' is a sealed one. */
bool seal_is_sealed(const char *value);

/* A sealed value opened: a malloc'd string, or NULL (a wrong key or id, a damaged value, out
 * of memory). */
char *seal_open(const unsigned char key[SEAL_KEY_BYTES], const char *id, const char *sealed);

#endif
