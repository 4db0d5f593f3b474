/* escape -- writes text with some characters replaced, for the formats the proxy prints (a
 * Prometheus label value, SVG text). */
#ifndef RETRYPROXY_PROXY_ESCAPE_H
#define RETRYPROXY_PROXY_ESCAPE_H

#include <stdio.h>
#include <string.h>

/* Writes 's' to 'f', each character found in 'chars' replaced by the string at the same index
 * of 'with'. */
static inline void escape_fputs(FILE *f, const char *s, const char *chars, const char *const *with)
{
    for (; *s; s++) {
        const char *c = strchr(chars, *s);
        if (c)
            fputs(with[c - chars], f);
        else
            fputc(*s, f);
    }
}

#endif
