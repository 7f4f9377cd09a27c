/*
 * DESIGN: Official Account safe mode (lib/oacrypt_int.h).
 *
 * Purpose: verify the msg_signature of an encrypted push and turn its Encrypt text back into
 * the plaintext push, so that wxguard-ingest can key and store it like a plaintext one.
 *
 * Decryption is checked, not trusted: the ciphertext must be whole AES blocks, the padding must
 * be 1..32 bytes all holding their count (the scheme pads to 32, not to the 16-byte AES block),
 * the length field must fit in what is left after the 16 random bytes, and the AppId after the
 * message must be the configured one. A push sealed with another key (a rotated
 * EncodingAESKey) fails these checks, which is what lets the caller try the previous key.
 *
 * AES and SHA-1 come from libcrypto (EVP), which the key module already uses. Padding is removed
 * here, with EVP's own padding off, because EVP's PKCS#7 check assumes 16-byte blocks.
 *
 * Threads: no state; any number of threads may call at once. Memory: the plaintext is decrypted
 * into one buffer that is wiped before it is freed; only the message itself is handed out.
 */
#include "oacrypt_int.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "err_int.h"
#include "key_int.h"
#include "wxguard/err.h"

#define BLOCK      32          /* the scheme's padding block */
#define FRAME_HEAD 20          /* 16 random bytes + 4 length bytes */
#define B64_MAX    (16u << 20) /* longest Encrypt text accepted */
#define SORT_PARTS 4

int wxg__hex_equal(const char *want, const char *got, size_t n)
{
    char low[129];
    if (got == NULL || n >= sizeof low || strlen(got) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        low[i] = (char)tolower((unsigned char)got[i]);
    return CRYPTO_memcmp(want, low, n) == 0;
}

static int cmp_bytes(const char *a, size_t al, const char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c != 0)
        return c;
    return al < bl ? -1 : al > bl;
}

int wxg__sha1_sorted(const char *const *parts, const size_t *lens, size_t n, char out[41])
{
    size_t order[SORT_PARTS];
    if (n > SORT_PARTS)
        return WXG_EINVAL;
    /* Insertion sort of at most four indexes. */
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (j > 0 && cmp_bytes(parts[order[j - 1]], lens[order[j - 1]], parts[i], lens[i]) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int ok = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) == 1;
    for (size_t i = 0; ok && i < n; i++)
        ok = EVP_DigestUpdate(ctx, parts[order[i]], lens[order[i]]) == 1;
    ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == 20;
    EVP_MD_CTX_free(ctx);
    if (!ok)
        return WXG_ENOMEM;
    wxg__to_hex(md, 20, out);
    return 0;
}

static int b64_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '/';
}

int wxg__oa_aes_key(const char *encoding_aes_key, unsigned char key[WXG__OA_AES_KEY_BYTES])
{
    if (encoding_aes_key == NULL || key == NULL ||
        strlen(encoding_aes_key) != WXG__OA_AES_KEY_CHARS)
        return WXG_EINVAL;
    /* EVP_DecodeBlock takes '=' anywhere at the end, so the alphabet is checked here. */
    for (size_t i = 0; i < WXG__OA_AES_KEY_CHARS; i++) {
        if (!b64_char(encoding_aes_key[i]))
            return WXG_EINVAL;
    }
    char in[WXG__OA_AES_KEY_CHARS + 2];
    unsigned char raw[36];
    memcpy(in, encoding_aes_key, WXG__OA_AES_KEY_CHARS);
    in[WXG__OA_AES_KEY_CHARS] = '=';
    in[WXG__OA_AES_KEY_CHARS + 1] = '\0';
    /* 44 characters with one '=' decode to 33 bytes, the last of them the padding's zero. */
    int n = EVP_DecodeBlock(raw, (const unsigned char *)in, WXG__OA_AES_KEY_CHARS + 1);
    int rc = n == 33 ? 0 : WXG_EINVAL;
    if (rc == 0)
        memcpy(key, raw, WXG__OA_AES_KEY_BYTES);
    OPENSSL_cleanse(in, sizeof in);
    OPENSSL_cleanse(raw, sizeof raw);
    return rc;
}

int wxg__oa_msg_signature(const char *token, const char *timestamp, const char *nonce,
                          const char *encrypt, size_t encrypt_len, char out[41])
{
    if (token == NULL || timestamp == NULL || nonce == NULL || encrypt == NULL || out == NULL)
        return WXG_EINVAL;
    const char *parts[4] = {token, timestamp, nonce, encrypt};
    size_t lens[4] = {strlen(token), strlen(timestamp), strlen(nonce), encrypt_len};
    return wxg__sha1_sorted(parts, lens, 4, out);
}

int wxg__oa_msg_verify(const char *token, const char *timestamp, const char *nonce,
                       const char *encrypt, size_t encrypt_len, const char *signature)
{
    char want[41];
    if (token == NULL || token[0] == '\0' || timestamp == NULL || timestamp[0] == '\0' ||
        nonce == NULL || nonce[0] == '\0' || signature == NULL)
        return WXG_EAUTH;
    if (wxg__oa_msg_signature(token, timestamp, nonce, encrypt, encrypt_len, want) != 0)
        return WXG_EAUTH;
    return wxg__hex_equal(want, signature, 40) ? 0 : WXG_EAUTH;
}

/* Strict base64 (with '=' padding, no whitespace) into a malloc'd buffer; returns the number of
 * bytes, -1 when the text is not base64, -2 when out of memory. EVP_DecodeBlock counts the bytes
 * the '=' stand for, so they are taken off again. */
static long b64_decode(const char *b64, size_t len, unsigned char **out)
{
    *out = NULL;
    if (len == 0 || len % 4 != 0)
        return -1;
    size_t pads = 0;
    while (pads < 2 && b64[len - 1 - pads] == '=')
        pads++;
    for (size_t i = 0; i < len - pads; i++) {
        if (!b64_char(b64[i]))
            return -1;
    }
    unsigned char *buf = malloc(len / 4 * 3 + 1);
    if (buf == NULL)
        return -2;
    int n = EVP_DecodeBlock(buf, (const unsigned char *)b64, (int)len);
    if (n < 0) {
        free(buf);
        return -1;
    }
    *out = buf;
    return n - (long)pads;
}

static int cipher(int enc, const unsigned char key[WXG__OA_AES_KEY_BYTES], const unsigned char *in,
                  size_t len, unsigned char *out)
{
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int n1 = 0, n2 = 0;
    int ok = ctx != NULL && len <= INT32_MAX &&
             EVP_CipherInit_ex(ctx, EVP_aes_256_cbc(), NULL, key, key, enc) == 1 &&
             EVP_CIPHER_CTX_set_padding(ctx, 0) == 1 &&
             EVP_CipherUpdate(ctx, out, &n1, in, (int)len) == 1 &&
             EVP_CipherFinal_ex(ctx, out + n1, &n2) == 1 && (size_t)(n1 + n2) == len;
    EVP_CIPHER_CTX_free(ctx);
    return ok ? 0 : WXG_ENOMEM;
}

int wxg__oa_decrypt(const unsigned char key[WXG__OA_AES_KEY_BYTES], const char *appid,
                    const char *b64, size_t b64_len, char **out, size_t *out_len, char *errstr,
                    size_t errstr_size)
{
    if (out != NULL)
        *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (key == NULL || b64 == NULL || out == NULL || out_len == NULL) {
        wxg__errf(errstr, errstr_size, "invalid arguments");
        return WXG_EINVAL;
    }
    if (b64_len > B64_MAX) {
        wxg__errf(errstr, errstr_size, "Encrypt is %zu bytes; the limit is %u", b64_len, B64_MAX);
        return WXG_ETOOBIG;
    }
    unsigned char *ct = NULL;
    long n = b64_decode(b64, b64_len, &ct);
    if (n == -2) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    if (n < 0) {
        wxg__errf(errstr, errstr_size, "Encrypt is not base64");
        return WXG_EPARSE;
    }
    if (n == 0 || n % 16 != 0) {
        free(ct);
        wxg__errf(errstr, errstr_size, "Encrypt does not decode to whole AES blocks (%ld bytes)",
                  n);
        return WXG_EPARSE;
    }
    unsigned char *pt = malloc((size_t)n);
    int rc = pt != NULL ? cipher(0, key, ct, (size_t)n, pt) : WXG_ENOMEM;
    free(ct);
    if (rc != 0) {
        free(pt);
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    size_t len = (size_t)n;
    unsigned pad = pt[len - 1];
    const char *why = NULL;
    size_t msg_len = 0;
    if (pad < 1 || pad > BLOCK || pad > len) {
        why = "bad padding";
    } else {
        for (size_t i = len - pad; i < len; i++) {
            if (pt[i] != pad)
                why = "bad padding";
        }
    }
    if (why == NULL) {
        len -= pad;
        if (len < FRAME_HEAD) {
            why = "plaintext shorter than its header";
        } else {
            msg_len = (size_t)pt[16] << 24 | (size_t)pt[17] << 16 | (size_t)pt[18] << 8 | pt[19];
            if (msg_len > len - FRAME_HEAD)
                why = "message length beyond the plaintext";
        }
    }
    if (why == NULL && appid != NULL && appid[0] != '\0') {
        size_t have = len - FRAME_HEAD - msg_len;
        if (have != strlen(appid) || memcmp(pt + FRAME_HEAD + msg_len, appid, have) != 0)
            why = "sealed for another AppId";
    }
    if (why != NULL) {
        OPENSSL_cleanse(pt, (size_t)n);
        free(pt);
        wxg__errf(errstr, errstr_size, "cannot decrypt Encrypt: %s (wrong EncodingAESKey?)", why);
        return WXG_EFORMAT;
    }
    char *msg = malloc(msg_len + 1);
    if (msg != NULL) {
        memcpy(msg, pt + FRAME_HEAD, msg_len);
        msg[msg_len] = '\0';
    }
    OPENSSL_cleanse(pt, (size_t)n);
    free(pt);
    if (msg == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    *out = msg;
    *out_len = msg_len;
    return 0;
}

int wxg__oa_encrypt(const unsigned char key[WXG__OA_AES_KEY_BYTES], const char *appid,
                    const unsigned char random16[16], const char *msg, size_t len, char **out)
{
    if (out != NULL)
        *out = NULL;
    if (key == NULL || appid == NULL || random16 == NULL || (msg == NULL && len > 0) || out == NULL)
        return WXG_EINVAL;
    if (len > B64_MAX / 2)
        return WXG_ETOOBIG;
    size_t al = strlen(appid);
    size_t plain = FRAME_HEAD + len + al;
    size_t pad = BLOCK - plain % BLOCK; /* 1..32: a whole block when already aligned */
    size_t total = plain + pad;
    unsigned char *pt = malloc(total), *ct = malloc(total);
    char *b64 = malloc(total / 3 * 4 + 8);
    int rc = WXG_ENOMEM;
    if (pt != NULL && ct != NULL && b64 != NULL) {
        memcpy(pt, random16, 16);
        pt[16] = (unsigned char)(len >> 24);
        pt[17] = (unsigned char)(len >> 16);
        pt[18] = (unsigned char)(len >> 8);
        pt[19] = (unsigned char)len;
        if (len > 0)
            memcpy(pt + FRAME_HEAD, msg, len);
        memcpy(pt + FRAME_HEAD + len, appid, al);
        memset(pt + plain, (int)pad, pad);
        rc = cipher(1, key, pt, total, ct);
        if (rc == 0) {
            EVP_EncodeBlock((unsigned char *)b64, ct, (int)total);
            *out = b64;
            b64 = NULL;
        }
    }
    if (pt != NULL)
        OPENSSL_cleanse(pt, total);
    free(pt);
    free(ct);
    free(b64);
    return rc;
}
