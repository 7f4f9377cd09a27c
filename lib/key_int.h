/*
 * Internal to libwxguard: the hex encoding that the key module uses for fingerprints and that
 * the guard (record names, owner tokens), the Official Account signatures and the gateway HMAC
 * share. Pure and thread-safe.
 */
#ifndef WXG_KEY_INT_H
#define WXG_KEY_INT_H

#include <stddef.h>

/* Writes the n bytes of `in` as 2n lower-case hex digits and a NUL to `out`. */
void wxg__to_hex(const unsigned char *in, size_t n, char *out);

#endif /* WXG_KEY_INT_H */
