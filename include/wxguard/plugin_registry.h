/*
 * The host side of the plugin ABI: the registry of built-in plugins, loading external plugins
 * by path, and the ordered chain the consumer runs every message through.
 *
 * A chain is built once at start-up from the `plugins` setting, a comma-separated list in which
 * an entry containing '/' is the absolute path of a shared object (loaded with dlopen, RTLD_NOW |
 * RTLD_LOCAL, symbol wxg_plugin_entry) and any other entry is the name of a built-in plugin. A
 * relative path is refused, and so is a file or a directory holding it that is not owned by root
 * or the effective user or that its group or others may write; the file is checked and loaded
 * through one open descriptor, which stays open while the object is loaded:
 *
 *     plugins = autoreply,pgsql,/opt/wxguard/plugins/crm.so
 *
 * Each plugin's init receives the `plugin.<name>.*` entries of the configuration (prefix
 * removed), where <name> is the name in the plugin's descriptor. Entries for plugins that are
 * not in the chain are ignored, so one file can serve chains of different lengths; a plugin
 * refuses keys of its own it does not know.
 *
 * Threads and lifetimes:
 *   - wxg_plugin_chain_new / wxg_plugin_chain_destroy: main thread, once each. The chain is
 *     read-only in between, so wxg_plugin_chain_handle may run concurrently on many threads.
 *   - wxg_plugin_thread_new / wxg_plugin_thread_destroy: on the worker thread that will use the
 *     returned object, before its first and after its last handle. Every thread object must be
 *     destroyed before the chain.
 *   - wxg_plugin_chain_set_producer: main thread, before the workers start.
 */
#ifndef WXGUARD_PLUGIN_REGISTRY_H
#define WXGUARD_PLUGIN_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"
#include "wxguard/dlq.h"
#include "wxguard/msg.h"
#include "wxguard/plugin.h"

typedef struct wxg_plugin_chain_s wxg_plugin_chain_t;
typedef struct wxg_plugin_thread_s wxg_plugin_thread_t;

/* One configuration entry, with its full key, e.g. {"plugin.record.path", "/var/lib/x"}. */
typedef struct wxg_plugin_kv {
    const char *key;
    const char *value;
} wxg_plugin_kv_t;

/* The descriptor of the built-in plugin `name`, or NULL when there is none. Any thread. */
WXG_EXPORT const wxg_plugin_desc_t *wxg_plugin_builtin(const char *name);

/* The names of the built-in plugins, comma-separated (static string), for messages and help. */
WXG_EXPORT const char *wxg_plugin_builtin_names(void);

/* Builds the chain described by `spec` (see above): loads external plugins, checks every
 * descriptor (ABI version, name, required functions), refuses a name that appears twice, and
 * calls each plugin's init in order with its configuration taken from conf[0..conf_count) (the
 * strings are only read during this call). On failure, plugins already initialised are
 * destroyed in reverse order, loaded objects are unloaded, *out stays untouched and errstr
 * names the entry (its path and the dlerror text for a load failure). Returns
 *   0             *out is the chain
 *   WXG_ECONFIG   empty or malformed spec, unknown built-in, duplicate name, a file that cannot
 *                 be loaded, or a plugin's init refused its configuration
 *   WXG_EABI      a loaded object without wxg_plugin_entry, an entry that returned NULL, a
 *                 descriptor of another ABI version or without init/handle, an invalid name
 *   WXG_ENOMEM    or whatever negative code a plugin's init returned. */
WXG_EXPORT int wxg_plugin_chain_new(const char *spec, const wxg_plugin_kv_t *conf,
                                    size_t conf_count, wxg_plugin_chain_t **out, char *errstr,
                                    size_t errstr_size);

/* The producer behind wxg_plugin_ctx_produce() (borrowed; it must outlive the chain's use).
 * Without one, produce fails with WXG_ESTATE. */
WXG_EXPORT void wxg_plugin_chain_set_producer(wxg_plugin_chain_t *chain, wxg_producer_t *producer);

/* Number of plugins, and the name / path (NULL for a built-in) of plugin i (strings owned by the
 * chain, valid until it is destroyed). */
WXG_EXPORT size_t wxg_plugin_chain_count(const wxg_plugin_chain_t *chain);
WXG_EXPORT const char *wxg_plugin_chain_name(const wxg_plugin_chain_t *chain, size_t i);
WXG_EXPORT const char *wxg_plugin_chain_path(const wxg_plugin_chain_t *chain, size_t i);

/* Calls every plugin's destroy in reverse order, then unloads external objects. Accepts NULL. */
WXG_EXPORT void wxg_plugin_chain_destroy(wxg_plugin_chain_t *chain);

/* Per worker thread: calls every plugin's thread_init in chain order. On failure the ones
 * already done get thread_destroy in reverse order and the plugin's code is returned (errstr
 * names the plugin). Returns 0 and sets *out, or a negative WXG_E* code. */
WXG_EXPORT int wxg_plugin_thread_new(wxg_plugin_chain_t *chain, wxg_plugin_thread_t **out,
                                     char *errstr, size_t errstr_size);

/* Calls thread_destroy in reverse chain order on the calling thread. Accepts NULL. */
WXG_EXPORT void wxg_plugin_thread_destroy(wxg_plugin_thread_t *thr);

/* The inputs and outputs of one plugin call. The host fills the inputs (all borrowed for the
 * call) and calls wxg_plugin_call_init() first, which clears the outputs. */
typedef struct wxg_plugin_call {
    /* inputs */
    const char *key;         /* idempotency key; NULL = the message view's key */
    uint64_t fence;          /* fencing token of the current claim */
    uint32_t attempt;        /* 1 for the first attempt */
    const char *topic;       /* source record's topic ("" when NULL) */
    int32_t partition;       /* source record's partition */
    int64_t offset;          /* source record's offset */
    const char *prev_result; /* what this plugin recorded on an earlier attempt, or NULL */
    /* outputs */
    int has_result;                         /* the plugin called set_result with a string */
    char result[WXG_PLUGIN_RESULT_MAX + 1]; /* valid when has_result */
    char reason[WXG_PLUGIN_REASON_MAX];     /* "" when none was given */
    int produce_error;                      /* the last failed produce's WXG_E* code, or 0 */
    int produce_count;                      /* records produced successfully */
} wxg_plugin_call_t;

/* Zeroes *call (inputs included); the host then sets the inputs. */
WXG_EXPORT void wxg_plugin_call_init(wxg_plugin_call_t *call);

/* Runs plugin i's handle for `msg` on the calling worker thread with `thr` (made by
 * wxg_plugin_thread_new on this thread for this chain). Returns the plugin's result. A RETRY or
 * FAIL without a reason gets one (the last produce error, or a generic text); a result value
 * outside the enum counts as FAIL with a reason saying so. Any thread, concurrently. */
WXG_EXPORT wxg_plugin_result_t wxg_plugin_chain_handle(const wxg_plugin_chain_t *chain,
                                                       wxg_plugin_thread_t *thr, size_t i,
                                                       const wxg_msg_view_t *msg,
                                                       wxg_plugin_call_t *call);

/* "ok", "retry" or "fail" (static; "fail" for unknown values). */
WXG_EXPORT const char *wxg_plugin_result_name(wxg_plugin_result_t r);

#endif /* WXGUARD_PLUGIN_REGISTRY_H */
