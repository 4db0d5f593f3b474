/* keyfile -- the store's key file (keyfile.h). */
#include "config/keyfile.h"

#include <stdio.h>
#include <string.h>

#include "config/utf8.h"

int cfg_key_file_read(const char *path, unsigned char key[CFG_KEY_BYTES])
{
    /* One byte more than a key file may hold: a longer file is refused, where reading only
     * its first bytes took a key followed by anything at all. */
    unsigned char buf[CFG_KEY_FILE_MAX + 1];
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf), f);
    int failed = ferror(f);
    fclose(f);
    int r = -2;
    if (failed) {
        r = -1;
    } else if (n == CFG_KEY_BYTES) {
        memcpy(key, buf, CFG_KEY_BYTES);
        r = 0;
    } else if (n <= CFG_KEY_FILE_MAX) {
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
            n--;
        r = n == 2 * CFG_KEY_BYTES ? 0 : -2;
        for (size_t i = 0; i < CFG_KEY_BYTES && r == 0; i++) {
            int hi = utf8_hex_digit(buf[2 * i]), lo = utf8_hex_digit(buf[2 * i + 1]);
            if (hi < 0 || lo < 0)
                r = -2;
            else
                key[i] = (unsigned char)(hi << 4 | lo);
        }
    }
    memset(buf, 0, sizeof(buf));
    __asm__ __volatile__("" : : "r"(buf) : "memory"); /* the clearing is not optimised away */
    return r;
}
