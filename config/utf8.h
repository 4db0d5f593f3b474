/* utf8 -- well-formed UTF-8 (RFC 3629), as jansson accepts it: the config scanner refuses
 * anything else in a string, and error messages escape it so that they stay valid JSON. */
#ifndef RETRYPROXY_CONFIG_UTF8_H
#define RETRYPROXY_CONFIG_UTF8_H

#include <stddef.h>

/* The length (1 to 4) of the well-formed UTF-8 character at s[0..n), n > 0; 0 if there is
 * none there: a stray continuation byte, an overlong form, a surrogate, a code point above
 * U+10FFFF, or a character cut short by the end at n. */
size_t utf8_len(const unsigned char *s, size_t n);

/* The value of the hex digit 'c' (either case), -1 for any other character: the config's
 * "\uXXXX" escapes (jsonpos.c) and the store's key file (keyfile.c). */
int utf8_hex_digit(int c);

#endif
