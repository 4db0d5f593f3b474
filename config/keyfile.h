/* keyfile -- the store's key file (store.key_file, docs/delivery.md "Secrets at rest"): read
 * once by the config's check at load and again by the store when it opens, with the one rule
 * here so that the two never disagree. */
#ifndef RETRYPROXY_CONFIG_KEYFILE_H
#define RETRYPROXY_CONFIG_KEYFILE_H

#define CFG_KEY_BYTES 32
/* The longest key file: 64 hex digits and line ends after them. */
#define CFG_KEY_FILE_MAX 80

/* Reads the 256-bit key in 'path': exactly 32 bytes, or 64 hex digits (either case) followed
 * by nothing but '\n' and '\r', the whole file at most CFG_KEY_FILE_MAX bytes. 0 with the key
 * in 'key'; -1 when the file cannot be read; -2 when it holds no such key ('key' may have been
 * written). */
int cfg_key_file_read(const char *path, unsigned char key[CFG_KEY_BYTES]);

#endif
