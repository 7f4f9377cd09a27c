/*
 * The plugin ABI: what a business plugin implements and what it may call.
 *
 * A plugin is a descriptor (wxg_plugin_desc_t) of a name, an ABI version and five functions. The
 * consumer runs every message through an ordered chain of plugins (configuration key `plugins`);
 * each plugin returns OK, RETRY (transient: the message is retried with backoff) or FAIL
 * (permanent: the message goes to the dead-letter topic). Built-in plugins are compiled into
 * libwxguard; external plugins are shared objects loaded by path that export
 *
 *     WXG_PLUGIN_EXPORT const wxg_plugin_desc_t *wxg_plugin_entry(void);
 *
 * A plugin links against nothing of wxguard. Everything it may call reaches it through function
 * pointers (the context's table) or is a static inline helper defined in this header, so the
 * host's symbols never need to be visible to a loaded object. The only other wxguard headers a
 * plugin sees are wxguard/msg.h (the message view) and wxguard/err.h (the WXG_E* codes, an enum).
 *
 * Versioning. WXG_PLUGIN_ABI_VERSION changes whenever a struct in this header or wxg_msg_view_t
 * changes in a way other than appending a field at the end, or when a documented rule changes.
 * The host refuses, at start-up, a descriptor whose abi_version differs from its own. Functions
 * added to the context table later are appended; WXG_PLUGIN_CTX_HAS() tells a plugin whether the
 * host that loaded it provides one.
 *
 * Lifecycle and threads (the host guarantees all of this; plugins may rely on it):
 *   1. init(conf, &state) once, on the main thread, in chain order, before any other call.
 *      `conf` and the strings it points to are valid only during init: copy what you keep.
 *   2. thread_init(state, &thread_state) once per worker thread, on that worker thread, before its
 *      first handle; thread_destroy(state, thread_state) on the same thread after its last handle.
 *      Use it for per-thread resources such as a database connection.
 *   3. handle(state, thread_state, msg, ctx) is called concurrently from several worker threads,
 *      each with its own thread_state; `state` is shared, so anything in it that changes after
 *      init needs the plugin's own lock or atomics. handle runs at most once at a time per
 *      thread_state. `msg` and `ctx` are valid only during the call and only on that thread.
 *      handle may block (the host renews the message's lease meanwhile) but must return within
 *      a bounded time of its own choosing; the consumer cannot interrupt it.
 *   4. destroy(state) once, on the main thread, after every thread_destroy, in reverse chain
 *      order. After it the host may unload the shared object.
 * thread_init, thread_destroy and destroy may be NULL when a plugin has nothing to do there.
 *
 * Exactly once in effect. The host runs a plugin's handle for a message until it returns OK
 * once; after that the guard's per-plugin marker makes later deliveries and retries skip it. A
 * crash between the plugin's effect and that marker makes the next attempt run handle again, so
 * an effect outside the host must be idempotent on its own: key it by the idempotency key
 * (wxg_plugin_ctx_key) and refuse writers whose fencing token (wxg_plugin_ctx_fence) is lower
 * than the one already stored. docs/plugins.md shows how.
 */
#ifndef WXGUARD_PLUGIN_H
#define WXGUARD_PLUGIN_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wxguard/common.h"
#include "wxguard/err.h"
#include "wxguard/msg.h"

#define WXG_PLUGIN_ABI_VERSION 1u

/* The symbol an external plugin exports, and the macro that exports it (the project builds
 * with hidden visibility). */
#define WXG_PLUGIN_ENTRY_SYMBOL "wxg_plugin_entry"
#if defined(__GNUC__) || defined(__clang__)
#define WXG_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define WXG_PLUGIN_EXPORT
#endif

/* Limits the host enforces. A name is 1..WXG_PLUGIN_NAME_MAX characters of [a-z0-9_-]; it names
 * the plugin's configuration prefix (plugin.<name>.*) and its marker in the guard. A result is
 * at most WXG_PLUGIN_RESULT_MAX bytes of text (it is stored in Redis with every message); a
 * reason is cut to WXG_PLUGIN_REASON_MAX - 1 bytes. */
#define WXG_PLUGIN_NAME_MAX   32
#define WXG_PLUGIN_RESULT_MAX 256
#define WXG_PLUGIN_REASON_MAX 512

/* What handle returns. */
typedef enum wxg_plugin_result {
    WXG_PLUGIN_OK = 0,    /* the effect happened (or had happened before): never run again */
    WXG_PLUGIN_RETRY = 1, /* transient failure: the message is retried later with backoff */
    WXG_PLUGIN_FAIL = 2   /* permanent failure: the message goes to the dead-letter topic */
} wxg_plugin_result_t;

/* ------------------------------------------------------------------------------------------ */
/* Configuration view                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* This plugin's configuration: every `plugin.<name>.<k> = v` entry, handed over as k (prefix
 * removed) and v, in the order the configuration gave them. Read-only; valid during init only.
 * The helpers below are the supported way to read it. */
typedef struct wxg_plugin_conf {
    uint32_t abi_version;    /* the host's WXG_PLUGIN_ABI_VERSION */
    const char *plugin_name; /* the descriptor's name */
    size_t count;
    const char *const *keys;   /* count keys without the "plugin.<name>." prefix */
    const char *const *values; /* count values */
} wxg_plugin_conf_t;

/* The value of `key`, or NULL when absent. A key given twice yields its last value. */
static inline const char *wxg_plugin_conf_get(const wxg_plugin_conf_t *conf, const char *key)
{
    const char *found = NULL;
    for (size_t i = 0; conf && i < conf->count; i++) {
        if (strcmp(conf->keys[i], key) == 0)
            found = conf->values[i];
    }
    return found;
}

/* Parses `key` as a decimal integer in [min, max]; *out = def when the key is absent.
 * Returns 0, or WXG_ECONFIG with a message naming the key in errstr. */
static inline int wxg_plugin_conf_get_int64(const wxg_plugin_conf_t *conf, const char *key,
                                            int64_t def, int64_t min, int64_t max, int64_t *out,
                                            char *errstr, size_t errstr_size)
{
    const char *v = wxg_plugin_conf_get(conf, key);
    if (!v) {
        *out = def;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < min || n > max) {
        snprintf(errstr, errstr_size, "plugin.%s.%s: '%s' is not an integer in [%lld, %lld]",
                 conf->plugin_name, key, v, (long long)min, (long long)max);
        return WXG_ECONFIG;
    }
    *out = (int64_t)n;
    return 0;
}

/* Parses `key` as a boolean (true/false, yes/no, on/off, 1/0); *out = def when absent.
 * Returns 0 or WXG_ECONFIG. */
static inline int wxg_plugin_conf_get_bool(const wxg_plugin_conf_t *conf, const char *key, int def,
                                           int *out, char *errstr, size_t errstr_size)
{
    const char *v = wxg_plugin_conf_get(conf, key);
    if (!v) {
        *out = def;
        return 0;
    }
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcmp(v, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcmp(v, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    snprintf(errstr, errstr_size, "plugin.%s.%s: '%s' is not a boolean (true or false)",
             conf->plugin_name, key, v);
    return WXG_ECONFIG;
}

/* Refuses keys not in `known` (a NULL-terminated list), naming the first unknown one, so that a
 * misspelt setting stops start-up instead of being ignored. Returns 0 or WXG_ECONFIG. */
static inline int wxg_plugin_conf_check_keys(const wxg_plugin_conf_t *conf,
                                             const char *const *known, char *errstr,
                                             size_t errstr_size)
{
    for (size_t i = 0; conf && i < conf->count; i++) {
        int ok = 0;
        for (size_t j = 0; known && known[j]; j++) {
            if (strcmp(conf->keys[i], known[j]) == 0) {
                ok = 1;
                break;
            }
        }
        if (!ok) {
            snprintf(errstr, errstr_size, "plugin.%s.%s: unknown setting for plugin '%s'",
                     conf->plugin_name, conf->keys[i], conf->plugin_name);
            return WXG_ECONFIG;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Per-call context                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* One Kafka record header for wxg_plugin_ctx_produce(): a name and value_len bytes of value
 * (value may be NULL for a null header). */
typedef struct wxg_plugin_header {
    const char *name;
    const void *value;
    size_t value_len;
} wxg_plugin_header_t;

typedef struct wxg_plugin_ctx wxg_plugin_ctx_t;

/* The host's function table. Plugins call it through the wxg_plugin_ctx_* wrappers below,
 * never directly. Functions are only ever appended; struct_size says how many this host has. */
typedef struct wxg_plugin_ctx_api {
    size_t struct_size;
    const char *(*key)(const wxg_plugin_ctx_t *ctx);
    uint64_t (*fence)(const wxg_plugin_ctx_t *ctx);
    uint32_t (*attempt)(const wxg_plugin_ctx_t *ctx);
    const char *(*topic)(const wxg_plugin_ctx_t *ctx);
    int32_t (*partition)(const wxg_plugin_ctx_t *ctx);
    int64_t (*offset)(const wxg_plugin_ctx_t *ctx);
    const char *(*prev_result)(const wxg_plugin_ctx_t *ctx);
    int (*produce)(wxg_plugin_ctx_t *ctx, const char *topic, const void *key, size_t key_len,
                   const void *value, size_t value_len, const wxg_plugin_header_t *headers,
                   size_t header_count);
    int (*set_result)(wxg_plugin_ctx_t *ctx, const char *result);
    void (*set_reason)(wxg_plugin_ctx_t *ctx, const char *reason);
    const char *(*err_name)(int err);
    /* Appended: produce with the delivery's partition and offset (see below). */
    int (*produce_delivery)(wxg_plugin_ctx_t *ctx, const char *topic, const void *key,
                            size_t key_len, const void *value, size_t value_len,
                            const wxg_plugin_header_t *headers, size_t header_count,
                            int32_t *partition, int64_t *offset);
} wxg_plugin_ctx_api_t;

/* The context of one handle call. Opaque beyond its first member; valid during the call only,
 * on the calling thread only. */
struct wxg_plugin_ctx {
    const wxg_plugin_ctx_api_t *api;
};

/* True when the host that loaded the plugin provides table entry `fn`. */
#define WXG_PLUGIN_CTX_HAS(ctx, fn) \
    ((ctx)->api->struct_size >=     \
     offsetof(wxg_plugin_ctx_api_t, fn) + sizeof(((wxg_plugin_ctx_api_t *)0)->fn))

/* The message's idempotency key ("<account>:<kind>:<id>"): the same for every delivery and every
 * attempt of one message, different for different messages. Use it as the unique key of the
 * effect downstream (a primary key, an Idempotency-Key header, a Kafka key). Never NULL. */
static inline const char *wxg_plugin_ctx_key(const wxg_plugin_ctx_t *ctx)
{
    return ctx->api->key(ctx);
}

/* The fencing token of this claim: strictly greater for every later claim of the same message.
 * Store it beside the effect and refuse a write whose token is lower than the stored one; that
 * stops a stale worker whose lease expired (a pause, a Redis failover) from overwriting a newer
 * one. */
static inline uint64_t wxg_plugin_ctx_fence(const wxg_plugin_ctx_t *ctx)
{
    return ctx->api->fence(ctx);
}

/* 1 for the first attempt of this message, 2 for the first retry, and so on. */
static inline uint32_t wxg_plugin_ctx_attempt(const wxg_plugin_ctx_t *ctx)
{
    return ctx->api->attempt(ctx);
}

/* Where the message came from: topic (never NULL), partition and offset of the Kafka record. */
static inline const char *wxg_plugin_ctx_topic(const wxg_plugin_ctx_t *ctx)
{
    return ctx->api->topic(ctx);
}

static inline int32_t wxg_plugin_ctx_partition(const wxg_plugin_ctx_t *ctx)
{
    return ctx->api->partition(ctx);
}

static inline int64_t wxg_plugin_ctx_offset(const wxg_plugin_ctx_t *ctx)
{
    return ctx->api->offset(ctx);
}

/* The result this plugin recorded with wxg_plugin_ctx_set_result() on an earlier attempt of this
 * message and that the host stored, or NULL when there is none. */
static inline const char *wxg_plugin_ctx_prev_result(const wxg_plugin_ctx_t *ctx)
{
    return ctx->api->prev_result(ctx);
}

/* Produces one record to Kafka through the host's idempotent producer (acks=all) and WAITS for
 * its delivery report. key may be NULL (key_len 0); headers may be NULL (header_count 0).
 * Returns 0 once the broker has the record, or a negative WXG_E* code (WXG_ETIMEDOUT when no
 * delivery report came within the producer's delivery timeout; the record may still arrive
 * later, so a retry can produce it twice: consumers of the topic dedupe by key). A plugin
 * normally returns WXG_PLUGIN_RETRY when this fails. Blocks the calling worker. */
static inline int wxg_plugin_ctx_produce(wxg_plugin_ctx_t *ctx, const char *topic, const void *key,
                                         size_t key_len, const void *value, size_t value_len,
                                         const wxg_plugin_header_t *headers, size_t header_count)
{
    return ctx->api->produce(ctx, topic, key, key_len, value, value_len, headers, header_count);
}

/* Like wxg_plugin_ctx_produce(), and on success also tells where the record landed: its
 * partition and offset (either pointer may be NULL). Hosts older than this function lack it:
 * check WXG_PLUGIN_CTX_HAS(ctx, produce_delivery) first, or call this wrapper, which then falls
 * back to wxg_plugin_ctx_produce() and reports partition -1 and offset -1. */
static inline int wxg_plugin_ctx_produce_delivery(wxg_plugin_ctx_t *ctx, const char *topic,
                                                  const void *key, size_t key_len,
                                                  const void *value, size_t value_len,
                                                  const wxg_plugin_header_t *headers,
                                                  size_t header_count, int32_t *partition,
                                                  int64_t *offset)
{
    if (!WXG_PLUGIN_CTX_HAS(ctx, produce_delivery)) {
        if (partition)
            *partition = -1;
        if (offset)
            *offset = -1;
        return ctx->api->produce(ctx, topic, key, key_len, value, value_len, headers, header_count);
    }
    return ctx->api->produce_delivery(ctx, topic, key, key_len, value, value_len, headers,
                                      header_count, partition, offset);
}

/* Records this plugin's small result (text, at most WXG_PLUGIN_RESULT_MAX bytes; NULL clears
 * it). When handle returns OK the host stores it with the plugin's done-marker in the guard, and
 * a later attempt sees it through wxg_plugin_ctx_prev_result(). Returns 0, WXG_ETOOBIG or
 * WXG_EINVAL (the result contains a control character). The string is copied. */
static inline int wxg_plugin_ctx_set_result(wxg_plugin_ctx_t *ctx, const char *result)
{
    return ctx->api->set_result(ctx, result);
}

/* Says why handle returned RETRY or FAIL, printf-style; the text goes to the log and to the
 * dead-letter record's reason header. The last call wins. Keep personal data out of it. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void
wxg_plugin_ctx_set_reason(wxg_plugin_ctx_t *ctx, const char *fmt, ...)
{
    char buf[WXG_PLUGIN_REASON_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ctx->api->set_reason(ctx, buf);
}

/* The symbolic name of a WXG_E* code, e.g. "ETIMEDOUT" (static string, never NULL). */
static inline const char *wxg_plugin_ctx_err_name(const wxg_plugin_ctx_t *ctx, int err)
{
    return ctx->api->err_name(err);
}

/* ------------------------------------------------------------------------------------------ */
/* The descriptor                                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct wxg_plugin_desc {
    /* WXG_PLUGIN_ABI_VERSION as the plugin was compiled; must equal the host's. First member so
     * that a host can read it from a descriptor of any layout. */
    uint32_t abi_version;
    /* 1..WXG_PLUGIN_NAME_MAX characters of [a-z0-9_-]; unique within a chain. Static string. */
    const char *name;
    /* Required. Reads conf, allocates the shared state (may leave *state NULL). Returns 0, or a
     * negative WXG_E* code (normally WXG_ECONFIG) with a message in errstr: start-up stops. */
    int (*init)(const wxg_plugin_conf_t *conf, void **state, char *errstr, size_t errstr_size);
    /* Optional. Per worker thread; returns 0 or a negative WXG_E* code with errstr. */
    int (*thread_init)(void *state, void **thread_state, char *errstr, size_t errstr_size);
    /* Optional. Releases what thread_init made. */
    void (*thread_destroy)(void *state, void *thread_state);
    /* Required. Runs the effect for one message; see the thread rules above. */
    wxg_plugin_result_t (*handle)(void *state, void *thread_state, const wxg_msg_view_t *msg,
                                  wxg_plugin_ctx_t *ctx);
    /* Optional. Releases the state. */
    void (*destroy)(void *state);
} wxg_plugin_desc_t;

/* What an external plugin exports (see the top of this file). Returns a descriptor with static
 * storage duration; it is called once, on the main thread, right after loading. */
typedef const wxg_plugin_desc_t *(*wxg_plugin_entry_fn)(void);

#endif /* WXGUARD_PLUGIN_H */
