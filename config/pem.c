#include "config/pem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A PEM file larger than this is not one (a chain of ten certificates is some 20 KiB). */
#define PEM_MAX (1 << 20)

/* The file's text, NUL-terminated; NULL with 'why' set when it cannot be read. */
static char *slurp(const char *path, const char **why)
{
    struct stat st;
    FILE *f = NULL;
    /* a FIFO or a device would hold the load up (opening a FIFO waits for a writer) */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        *why = "is not a regular file";
        return NULL;
    }
    if (!(f = fopen(path, "r"))) {
        *why = "cannot be read (no such file, or no permission)";
        return NULL;
    }
    char *buf = malloc(PEM_MAX + 1);
    size_t n = buf ? fread(buf, 1, PEM_MAX + 1, f) : 0;
    bool err = ferror(f);
    fclose(f);
    if (!buf || err || n > PEM_MAX) {
        *why = !buf  ? "cannot be read (out of memory)"
               : err ? "cannot be read (an I/O error, or a directory)"
                     : "is larger than 1 MiB: not a PEM file";
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* Whether 'text' has a "-----BEGIN <label>-----" line whose label ends with 'tail' (and is
 * not "ENCRYPTED <tail>" unless 'encrypted'). */
static bool has_block(const char *text, const char *tail, bool encrypted)
{
    size_t tl = strlen(tail);
    for (const char *p = text; (p = strstr(p, "-----BEGIN ")) != NULL; p++) {
        const char *label = p + 11, *end = strstr(label, "-----");
        if (!end || memchr(label, '\n', (size_t)(end - label)))
            continue;
        size_t ll = (size_t)(end - label);
        if (ll < tl || memcmp(end - tl, tail, tl) != 0)
            continue;
        bool enc = ll >= 10 + tl && memcmp(label, "ENCRYPTED ", 10) == 0;
        if (enc == encrypted)
            return true;
    }
    return false;
}

const char *pem_check_certs(const char *path)
{
    const char *why = NULL;
    char *text = slurp(path, &why);
    if (text && !has_block(text, "CERTIFICATE", false))
        why = "holds no PEM certificate (-----BEGIN CERTIFICATE-----)";
    free(text);
    return why;
}

const char *pem_check_key(const char *path)
{
    const char *why = NULL;
    char *text = slurp(path, &why);
    if (text && !has_block(text, "PRIVATE KEY", false))
        why = has_block(text, "PRIVATE KEY", true)
                  ? "holds an encrypted private key: the proxy takes no passphrase"
                  : "holds no PEM private key (-----BEGIN PRIVATE KEY-----)";
    free(text);
    return why;
}

bool pem_has_key(const char *path)
{
    return pem_check_key(path) == NULL;
}
