/* seal -- AES-256-GCM of the sensitive fields (seal.h). */
#include "proxy/store/seal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "config/keyfile.h"

#define NONCE_BYTES 12
#define TAG_BYTES   16

_Static_assert(SEAL_KEY_BYTES == CFG_KEY_BYTES, "the key file holds the cipher's key");

static const char *const credential_fields[] = { "authorization", "cookie", "proxy-authorization" };

bool seal_sensitive(const char *name, const char *const *extra, size_t n)
{
    for (size_t i = 0; i < sizeof(credential_fields) / sizeof(credential_fields[0]); i++)
        if (strcasecmp(name, credential_fields[i]) == 0)
            return true;
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(name, extra[i]) == 0)
            return true;
    return false;
}

int seal_key_load(const char *path, unsigned char key[SEAL_KEY_BYTES], char *err, size_t cap)
{
    int r = cfg_key_file_read(path, key);
    if (r == -1)
        snprintf(err, cap, "%s: cannot be read", path);
    else if (r < 0)
        snprintf(err, cap, "%s: must hold a 256-bit key: 32 bytes, or 64 hex digits", path);
    return r < 0 ? -1 : 0;
}

/* One AES-256-GCM pass: encrypt (tag out) or decrypt (tag checked). 0 or -1. */
static int gcm(bool enc, const unsigned char *key, const unsigned char *nonce, const char *id,
               const unsigned char *in, int len, unsigned char *out, unsigned char *tag)
{
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int n, r = -1;
    if (!ctx || EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, NONCE_BYTES, NULL) != 1 ||
        EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, enc) != 1 ||
        EVP_CipherUpdate(ctx, NULL, &n, (const unsigned char *)id, (int)strlen(id)) != 1 ||
        (len > 0 && EVP_CipherUpdate(ctx, out, &n, in, len) != 1))
        goto out;
    if (!enc && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG_BYTES, tag) != 1)
        goto out;
    if (EVP_CipherFinal_ex(ctx, out + (len > 0 ? len : 0), &n) != 1)
        goto out;
    if (enc && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_BYTES, tag) != 1)
        goto out;
    r = 0;
out:
    EVP_CIPHER_CTX_free(ctx);
    return r;
}

char *seal_value(const unsigned char key[SEAL_KEY_BYTES], const char *id, const char *value)
{
    size_t len = strlen(value), raw_len = NONCE_BYTES + len + TAG_BYTES;
    unsigned char *raw = malloc(raw_len);
    char *out = malloc(2 + 4 * ((raw_len + 2) / 3));
    if (!raw || !out || len > INT32_MAX || RAND_bytes(raw, NONCE_BYTES) != 1 ||
        gcm(true, key, raw, id, (const unsigned char *)value, (int)len, raw + NONCE_BYTES,
            raw + NONCE_BYTES + len) < 0) {
        free(out);
        out = NULL;
        goto done;
    }
    out[0] = SEAL_MARK;
    EVP_EncodeBlock((unsigned char *)out + 1, raw, (int)raw_len);
done:
    if (raw)
        OPENSSL_cleanse(raw, raw_len);
    free(raw);
    return out;
}

bool seal_is_sealed(const char *value)
{
    return value[0] == SEAL_MARK;
}

char *seal_open(const unsigned char key[SEAL_KEY_BYTES], const char *id, const char *sealed)
{
    if (!seal_is_sealed(sealed))
        return NULL;
    size_t b64 = strlen(sealed + 1);
    if (b64 % 4 || b64 > INT32_MAX)
        return NULL;
    unsigned char *raw = malloc(b64 / 4 * 3 + 1);
    char *out = NULL;
    int n = raw ? EVP_DecodeBlock(raw, (const unsigned char *)sealed + 1, (int)b64) : -1;
    /* EVP_DecodeBlock counts the padding's zero bytes in */
    if (n > 0 && b64 >= 1 && sealed[b64] == '=')
        n--;
    if (n > 0 && b64 >= 2 && sealed[b64 - 1] == '=')
        n--;
    if (n < NONCE_BYTES + TAG_BYTES)
        goto done;
    int len = n - NONCE_BYTES - TAG_BYTES;
    out = malloc((size_t)len + 1);
    if (!out || gcm(false, key, raw, id, raw + NONCE_BYTES, len, (unsigned char *)out,
                    raw + NONCE_BYTES + len) < 0) {
        free(out);
        out = NULL;
        goto done;
    }
    out[len] = '\0';
done:
    free(raw);
    return out;
}
