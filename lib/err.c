/*
 * DESIGN: the error table.
 *
 * Purpose: map the negative WXG_E* codes of include/wxguard/err.h to their names, messages and
 * default classes. Everything comes from the one X-macro list, so a code cannot exist without a
 * message. It also holds wxg__errf() (lib/err_int.h), the errstr formatter every module shares.
 * There is no state, no lock and no allocation: every function is safe from any thread.
 */
#include "wxguard/err.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "err_int.h"

typedef struct err_entry {
    int code;
    const char *name;
    const char *msg;
    wxg_err_class_t cls;
} err_entry;

static const err_entry err_table[] = {
#define X_(name, value, cls, msg) {value, #name, msg, WXG_CLASS_##cls},
    WXG_ERRNO_MAP(X_)
#undef X_
};

static const err_entry *err_lookup(int err)
{
    for (size_t i = 0; i < sizeof(err_table) / sizeof(err_table[0]); i++) {
        if (err_table[i].code == err)
            return &err_table[i];
    }
    return NULL;
}

const char *wxg_strerror(int err)
{
    if (err == 0)
        return "success";
    const err_entry *e = err_lookup(err);
    return e ? e->msg : "unknown error";
}

const char *wxg_err_name(int err)
{
    if (err == 0)
        return "OK";
    const err_entry *e = err_lookup(err);
    return e ? e->name : "EUNKNOWN";
}

wxg_err_class_t wxg_err_class(int err)
{
    if (err == 0)
        return WXG_CLASS_NONE;
    const err_entry *e = err_lookup(err);
    return e ? e->cls : WXG_CLASS_FATAL;
}

const char *wxg_err_class_name(wxg_err_class_t cls)
{
    switch (cls) {
    case WXG_CLASS_NONE:
        return "none";
    case WXG_CLASS_RETRIABLE:
        return "retriable";
    case WXG_CLASS_POISON:
        return "poison";
    case WXG_CLASS_FATAL:
        return "fatal";
    }
    return "fatal";
}

void wxg__verrf(char *errstr, size_t size, const char *fmt, va_list ap)
{
    if (errstr == NULL || size == 0)
        return;
    vsnprintf(errstr, size, fmt, ap);
}

void wxg__errf(char *errstr, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wxg__verrf(errstr, size, fmt, ap);
    va_end(ap);
}
