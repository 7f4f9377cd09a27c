/*
 * Internal to libwxguard: Official Account safe mode (lib/oacrypt.c), the message signature and
 * AES decryption of encrypted pushes, which wxguard-ingest's engine (lib/ingest.c) applies
 * before it decodes; no program uses it, so it is not public. It also holds the signature
 * helpers lib/oacrypt.c and lib/ingest.c share (the Official Account's plain signature, its
 * message signature and the gateway HMAC); hex encoding is the key module's (key_int.h).
 *
 * With "safe mode" (or "compatible mode") switched on for an Official Account, the platform
 * POSTs `<xml><ToUserName>..</ToUserName><Encrypt>..</Encrypt></xml>` (or the JSON equivalent)
 * to `...?signature=&timestamp=&nonce=&encrypt_type=aes&msg_signature=`. The scheme:
 *
 *   msg_signature  SHA-1 hex of the four strings token, timestamp, nonce and Encrypt, sorted
 *                  bytewise and concatenated.
 *   key            Base64 of the 43-character EncodingAESKey plus "=": 32 bytes.
 *   Encrypt        Base64 of AES-256-CBC(key, IV = the key's first 16 bytes) over
 *                  random(16) | msg_len (4 bytes, big-endian) | msg | appid,
 *                  padded PKCS#7-style to a multiple of 32 bytes (pad bytes 1..32).
 *
 * The idempotency fields (MsgId, FromUserName, ...) exist only inside `msg`, so wxguard-ingest
 * decrypts before it decodes, and stores the plaintext.
 *
 * Every function is pure and thread-safe; pointers are borrowed for the duration of the call.
 * Results that are allocated say so; the caller frees them with free(). Key material passed in
 * is never copied into anything that outlives the call (stack copies are wiped).
 */
#ifndef WXG_OACRYPT_INT_H
#define WXG_OACRYPT_INT_H

#include <stddef.h>

/* Length of an EncodingAESKey as the platform shows it. */
#define WXG__OA_AES_KEY_CHARS 43
/* Bytes of the AES-256 key it encodes. */
#define WXG__OA_AES_KEY_BYTES 32

/* Decodes an EncodingAESKey (exactly 43 base64 characters) into the 32-byte AES key.
 * Returns 0, or WXG_EINVAL when `encoding_aes_key` is NULL, not 43 characters long, or not
 * base64. */
int wxg__oa_aes_key(const char *encoding_aes_key, unsigned char key[WXG__OA_AES_KEY_BYTES]);

/* The msg_signature of an encrypted push: lower-case SHA-1 hex of token, timestamp, nonce and
 * the Encrypt text (encrypt_len bytes), sorted bytewise and concatenated. `out` gets 40 digits
 * and a NUL. Returns 0, WXG_EINVAL for NULL arguments, or WXG_ENOMEM. */
int wxg__oa_msg_signature(const char *token, const char *timestamp, const char *nonce,
                          const char *encrypt, size_t encrypt_len, char out[41]);

/* Checks `signature` (40 hex digits, either case) against wxg__oa_msg_signature() in constant
 * time. Returns 0 when it matches, WXG_EAUTH otherwise (also for missing parts or an empty
 * token). */
int wxg__oa_msg_verify(const char *token, const char *timestamp, const char *nonce,
                       const char *encrypt, size_t encrypt_len, const char *signature);

/* Decrypts the Encrypt text of a push (`b64`, b64_len bytes of base64).
 *
 * `appid` (may be NULL or "": not checked) must equal the AppId that ends the plaintext.
 * On success returns 0 and sets *out to a malloc'd copy of `msg` with a NUL after it (the NUL is
 * not counted in *out_len); the caller frees it. On failure *out is NULL and errstr (may be
 * NULL) says why:
 *   WXG_EPARSE   not base64, or not a whole number of AES blocks;
 *   WXG_EFORMAT  the plaintext is not a push sealed with this key: bad padding, a length field
 *                beyond the data (what a wrong key almost always gives), or another AppId;
 *   WXG_ETOOBIG  b64_len above 16 MiB;
 *   WXG_EINVAL / WXG_ENOMEM.
 * A wrong key passes the padding and length checks with probability about 2^-8 times
 * (message length / 2^32), below 1e-9 for a push of a kilobyte; the AppId check then refuses it
 * whenever an AppId is configured. */
int wxg__oa_decrypt(const unsigned char key[WXG__OA_AES_KEY_BYTES], const char *appid,
                    const char *b64, size_t b64_len, char **out, size_t *out_len, char *errstr,
                    size_t errstr_size);

/* The inverse, for tests and tools that play the platform: seals `msg` (len bytes) with
 * `random16` (16 bytes; the platform uses random letters) and `appid`, and returns 0 with a
 * malloc'd NUL-terminated base64 string in *out (the caller frees it), or WXG_EINVAL /
 * WXG_ENOMEM / WXG_ETOOBIG (msg above 16 MiB). */
int wxg__oa_encrypt(const unsigned char key[WXG__OA_AES_KEY_BYTES], const char *appid,
                    const unsigned char random16[16], const char *msg, size_t len, char **out);

/* Constant-time comparison of `want` (lower-case hex, n digits, n <= 128) with `got` in any
 * case; `got` must be exactly n characters. Returns 1 when equal. */
int wxg__hex_equal(const char *want, const char *got, size_t n);

/* SHA-1 hex (40 digits and a NUL into out) of the n byte strings parts[i] (lens[i] bytes each),
 * sorted bytewise and concatenated, as the Official Account signatures are made. Returns 0 or
 * WXG_ENOMEM. */
int wxg__sha1_sorted(const char *const *parts, const size_t *lens, size_t n, char out[41]);

#endif /* WXG_OACRYPT_INT_H */
