/*
 * Internal to libwxguard: the signature helpers that lib/oacrypt.c and lib/ingest.c share (the
 * Official Account's plain signature, its message signature and the gateway HMAC). Hex
 * encoding is the key module's (key_int.h). All pure and thread-safe.
 */
#ifndef WXG_OACRYPT_INT_H
#define WXG_OACRYPT_INT_H

#include <stddef.h>

/* Constant-time comparison of `want` (lower-case hex, n digits, n <= 128) with `got` in any
 * case; `got` must be exactly n characters. Returns 1 when equal. */
int wxg__hex_equal(const char *want, const char *got, size_t n);

/* SHA-1 hex (40 digits and a NUL into out) of the n byte strings parts[i] (lens[i] bytes each),
 * sorted bytewise and concatenated, as the Official Account signatures are made. Returns 0 or
 * WXG_ENOMEM. */
int wxg__sha1_sorted(const char *const *parts, const size_t *lens, size_t n, char out[41]);

#endif /* WXG_OACRYPT_INT_H */
