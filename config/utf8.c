#include "config/utf8.h"

/* The well-formed byte sequences, by first byte (the Unicode Standard's table 3-7): the first
 * byte gives the length and the range of the second byte; any further byte is 80..BF. The
 * narrower second-byte ranges are what rule out overlong forms (E0, F0), surrogates (ED) and
 * code points above U+10FFFF (F4). */
static const struct {
    unsigned char first_lo, first_hi;
    unsigned char second_lo, second_hi;
    unsigned char len;
} forms[] = {
    { 0x00, 0x7f, 0x00, 0x00, 1 }, { 0xc2, 0xdf, 0x80, 0xbf, 2 }, { 0xe0, 0xe0, 0xa0, 0xbf, 3 },
    { 0xe1, 0xec, 0x80, 0xbf, 3 }, { 0xed, 0xed, 0x80, 0x9f, 3 }, { 0xee, 0xef, 0x80, 0xbf, 3 },
    { 0xf0, 0xf0, 0x90, 0xbf, 4 }, { 0xf1, 0xf3, 0x80, 0xbf, 4 }, { 0xf4, 0xf4, 0x80, 0x8f, 4 },
};

size_t utf8_len(const unsigned char *s, size_t n)
{
    for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
        if (s[0] < forms[f].first_lo || s[0] > forms[f].first_hi)
            continue;
        size_t len = forms[f].len;
        if (len == 1)
            return 1;
        if (n < len || s[1] < forms[f].second_lo || s[1] > forms[f].second_hi)
            return 0;
        for (size_t i = 2; i < len; i++)
            if ((s[i] & 0xc0) != 0x80)
                return 0;
        return len;
    }
    return 0;
}

int utf8_hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}
