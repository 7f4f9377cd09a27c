/*
 * Internal to libwxguard: the helper every module uses to fill a caller's errstr buffer. Lives
 * with the error table (lib/err.c) because every module already depends on it, so sharing it
 * adds no dependency between modules.
 */
#ifndef WXG_ERR_INT_H
#define WXG_ERR_INT_H

#include <stddef.h>

/* Formats into errstr (size bytes, truncated and always NUL-terminated). Does nothing when
 * errstr is NULL or size is 0, so callers may pass the buffers their own callers gave them
 * without checking. Thread-safe (no state). */
void wxg__errf(char *errstr, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* WXG_ERR_INT_H */
