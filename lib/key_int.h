/*
 * Internal to libwxguard: the hex encoding that the key module uses for fingerprints and that
 * the guard (record names, owner tokens), the Official Account signatures and the gateway HMAC
 * share, and the decimal writer that the guard's key names and the decoder's creation times
 * share (both built for every message, where snprintf cost more than the rest). Pure and
 * thread-safe.
 */
#ifndef WXG_KEY_INT_H
#define WXG_KEY_INT_H

#include <stddef.h>
#include <stdint.h>

/* Writes the n bytes of `in` as 2n lower-case hex digits and a NUL to `out`. */
void wxg__to_hex(const unsigned char *in, size_t n, char *out);

/* Writes v in decimal to out (room for 20 digits), without a terminator; returns the length. */
size_t wxg__put_dec(char *out, uint64_t v);

#endif /* WXG_KEY_INT_H */
