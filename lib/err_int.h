/*
 * Internal to libwxguard: the helper every module uses to fill a caller's errstr buffer, so that
 * errstr is filled one way everywhere (NULL or size 0 accepted, always terminated). Lives with
 * the error table (lib/err.c) because every module already depends on it, so sharing it adds
 * no dependency between modules. The built-in plugins (lib/plugins/) are written against the
 * plugin ABI like any plugin and fill their errstr as it does (snprintf into the host's buffer).
 */
#ifndef WXG_ERR_INT_H
#define WXG_ERR_INT_H

#include <stdarg.h>
#include <stddef.h>

/* Formats into errstr (size bytes, truncated and always NUL-terminated). Does nothing when
 * errstr is NULL or size is 0, so callers may pass the buffers their own callers gave them
 * without checking. Thread-safe (no state). */
void wxg__errf(char *errstr, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The same with a va_list, for a module's own formatter that does more than fill the buffer
 * (e.g. the decoder keeps only its first error). */
void wxg__verrf(char *errstr, size_t size, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

#endif /* WXG_ERR_INT_H */
