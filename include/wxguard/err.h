/*
 * Error codes.
 *
 * Every fallible wxguard function returns an int: 0 on success, or one of the negative WXG_E*
 * codes below. The list is an X-macro so that the enum, wxg_strerror() and wxg_err_name()
 * can never drift apart. Codes are only ever appended, never renumbered: they appear in logs,
 * metrics and dead-letter headers.
 *
 * Each code also carries its default class, which the worker uses to decide what happens to
 * the message: back off and retry, park it in the dead-letter topic, or shut down cleanly.
 *
 * Thread safety: every function here is pure and may be called from any thread.
 */
#ifndef WXGUARD_ERR_H
#define WXGUARD_ERR_H

#include "wxguard/common.h"

/* The class of an error: what the worker does when it meets it. */
typedef enum wxg_err_class {
    WXG_CLASS_NONE = 0,  /* not an error */
    WXG_CLASS_RETRIABLE, /* transient: back off and try again, never finish the offset */
    WXG_CLASS_POISON,    /* the message itself is bad: park it in the DLQ, finish the offset */
    WXG_CLASS_FATAL      /* the process cannot go on: drain, commit what is safe, exit */
} wxg_err_class_t;

/* X(name, value, class, message) */
#define WXG_ERRNO_MAP(X)                                                            \
    X(ENOMEM, -1, FATAL, "out of memory")                                           \
    X(EINVAL, -2, FATAL, "invalid argument")                                        \
    X(ETOOBIG, -3, POISON, "input exceeds the size limit")                          \
    X(EDEPTH, -4, POISON, "input nested too deeply")                                \
    X(EPARSE, -5, POISON, "malformed input (invalid JSON or XML)")                  \
    X(EFORMAT, -6, POISON, "unrecognised callback format")                          \
    X(ENOACCOUNT, -7, POISON, "callback carries no bot account")                    \
    X(EIDCONFLICT, -8, POISON, "duplicate id fields disagree")                      \
    X(EIO, -9, RETRIABLE, "input/output error")                                     \
    X(ETIMEDOUT, -10, RETRIABLE, "operation timed out")                             \
    X(ECONN, -11, RETRIABLE, "connection failed or lost")                           \
    X(EAUTH, -12, FATAL, "authentication or authorisation failed")                  \
    X(EREDIS, -13, RETRIABLE, "Redis returned an error")                            \
    X(ELEASELOST, -14, RETRIABLE, "lease lost: another owner holds the message")    \
    X(EBUSY, -15, RETRIABLE, "resource busy")                                       \
    X(ENOTFOUND, -16, FATAL, "not found")                                           \
    X(ECONFIG, -17, FATAL, "invalid configuration")                                 \
    X(EKAFKA, -18, RETRIABLE, "Kafka error")                                        \
    X(ESTATE, -19, FATAL, "operation not valid in the current state")               \
    X(EPLUGIN, -20, POISON, "plugin failed permanently")                            \
    X(EABI, -21, FATAL, "plugin ABI mismatch")                                      \
    X(EREPLICAS, -22, RETRIABLE, "write not acknowledged by enough Redis replicas") \
    X(ECLOSED, -23, FATAL, "shutting down")                                         \
    X(EUTF8, -24, POISON, "invalid UTF-8 in a field that must be text")             \
    X(EOVERFLOW, -25, POISON, "value out of range")

typedef enum wxg_errno {
    WXG_OK = 0,
#define WXG_ERR_ENUM_(name, value, cls, msg) WXG_##name = value,
    WXG_ERRNO_MAP(WXG_ERR_ENUM_)
#undef WXG_ERR_ENUM_
} wxg_errno_t;

/* A human-readable message for `err` (a static string; never NULL, also for unknown codes). */
WXG_EXPORT const char *wxg_strerror(int err);

/* The symbolic name of `err` without the WXG_ prefix, e.g. "ETIMEDOUT" (static; never NULL). */
WXG_EXPORT const char *wxg_err_name(int err);

/* The default class of `err`; WXG_CLASS_NONE for 0, WXG_CLASS_FATAL for unknown codes. */
WXG_EXPORT wxg_err_class_t wxg_err_class(int err);

/* "retriable", "poison", "fatal" or "none". */
WXG_EXPORT const char *wxg_err_class_name(wxg_err_class_t cls);

#endif /* WXGUARD_ERR_H */
