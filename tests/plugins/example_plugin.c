/*
 * An example external plugin, built as a shared object and loaded by path in the tests.
 *
 * It shows every part of the ABI: configuration, shared state with atomics, per-thread state,
 * the context (key, fence, attempt, previous result), producing to Kafka with the idempotency
 * key as the record key and the fencing token as a header, and a small recorded result.
 *
 * Configuration (plugin.<name>.*, <name> = "example" unless built otherwise):
 *   topic   when set, produce the message content there (RETRY when that fails)
 *   prefix  first word of the recorded result (default "seen")
 *   trace   when set, a file to which init/thread_init/thread_destroy/destroy append a line each
 *           (the tests read it to check the order of calls)
 *
 * Build-time variants, used by the tests to check how the host refuses broken plugins:
 *   EXAMPLE_NAME="..."   the descriptor's name (default "example")
 *   EXAMPLE_BAD_ABI      the descriptor claims another ABI version
 *   EXAMPLE_NO_ENTRY     the entry symbol is missing (exported under another name)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wxguard/plugin.h"

#ifndef EXAMPLE_NAME
#define EXAMPLE_NAME "example"
#endif

typedef struct example_state {
    char *topic;
    char *prefix;
    char *trace;
    atomic_ulong calls; /* handle runs on many threads at once */
} example_state;

typedef struct example_thread {
    unsigned long calls; /* only ever touched by its own thread */
} example_thread;

static void trace(const example_state *s, const char *event)
{
    if (!s->trace)
        return;
    FILE *f = fopen(s->trace, "a");
    if (!f)
        return;
    fprintf(f, "%s %s\n", event, EXAMPLE_NAME);
    fclose(f);
}

static char *dup_or_null(const char *v)
{
    return v ? strdup(v) : NULL;
}

static void example_destroy(void *state)
{
    example_state *s = state;
    if (!s)
        return;
    trace(s, "destroy");
    free(s->topic);
    free(s->prefix);
    free(s->trace);
    free(s);
}

static int example_init(const wxg_plugin_conf_t *conf, void **state, char *errstr,
                        size_t errstr_size)
{
    static const char *const known[] = {"topic", "prefix", "trace", NULL};
    int rc = wxg_plugin_conf_check_keys(conf, known, errstr, errstr_size);
    if (rc != 0)
        return rc;
    example_state *s = calloc(1, sizeof *s);
    if (!s)
        return WXG_ENOMEM;
    const char *prefix = wxg_plugin_conf_get(conf, "prefix");
    s->topic = dup_or_null(wxg_plugin_conf_get(conf, "topic"));
    s->trace = dup_or_null(wxg_plugin_conf_get(conf, "trace"));
    s->prefix = strdup(prefix ? prefix : "seen");
    if (!s->prefix) {
        example_destroy(s);
        return WXG_ENOMEM;
    }
    trace(s, "init");
    *state = s;
    return 0;
}

static int example_thread_init(void *state, void **thread_state, char *errstr, size_t errstr_size)
{
    example_thread *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    trace(state, "thread_init");
    *thread_state = t;
    return 0;
}

static void example_thread_destroy(void *state, void *thread_state)
{
    trace(state, "thread_destroy");
    free(thread_state);
}

static wxg_plugin_result_t example_handle(void *state, void *thread_state,
                                          const wxg_msg_view_t *msg, wxg_plugin_ctx_t *ctx)
{
    example_state *s = state;
    example_thread *t = thread_state;
    const char *key = wxg_plugin_ctx_key(ctx);
    t->calls++;
    atomic_fetch_add(&s->calls, 1);

    if (s->topic) {
        /* The key makes the record's partition stable and lets readers drop duplicates; the
         * fence lets them ignore a stale writer's copy. */
        char fence[24];
        snprintf(fence, sizeof fence, "%llu", (unsigned long long)wxg_plugin_ctx_fence(ctx));
        wxg_plugin_header_t h[] = {{"idempotency-key", key, strlen(key)},
                                   {"fence", fence, strlen(fence)}};
        int rc = wxg_plugin_ctx_produce(ctx, s->topic, key, strlen(key), msg->content,
                                        msg->content_len, h, 2);
        if (rc != 0) {
            wxg_plugin_ctx_set_reason(ctx, "example: produce to %s failed: %s", s->topic,
                                      wxg_plugin_ctx_err_name(ctx, rc));
            return WXG_PLUGIN_RETRY;
        }
    }

    char result[WXG_PLUGIN_RESULT_MAX + 1];
    snprintf(result, sizeof result, "%s:%s:fence=%llu:attempt=%u%s", s->prefix, key,
             (unsigned long long)wxg_plugin_ctx_fence(ctx), (unsigned)wxg_plugin_ctx_attempt(ctx),
             wxg_plugin_ctx_prev_result(ctx) ? ":again" : "");
    wxg_plugin_ctx_set_result(ctx, result);
    return WXG_PLUGIN_OK;
}

static const wxg_plugin_desc_t example_desc = {
#ifdef EXAMPLE_BAD_ABI
    .abi_version = WXG_PLUGIN_ABI_VERSION + 1,
#else
    .abi_version = WXG_PLUGIN_ABI_VERSION,
#endif
    .name = EXAMPLE_NAME,
    .init = example_init,
    .thread_init = example_thread_init,
    .thread_destroy = example_thread_destroy,
    .handle = example_handle,
    .destroy = example_destroy,
};

#ifdef EXAMPLE_NO_ENTRY
/* Exported, but under a name the host does not look for. */
WXG_PLUGIN_EXPORT const wxg_plugin_desc_t *wxg_plugin_entry_misspelt(void);
WXG_PLUGIN_EXPORT const wxg_plugin_desc_t *wxg_plugin_entry_misspelt(void)
#else
WXG_PLUGIN_EXPORT const wxg_plugin_desc_t *wxg_plugin_entry(void);
WXG_PLUGIN_EXPORT const wxg_plugin_desc_t *wxg_plugin_entry(void)
#endif
{
    return &example_desc;
}
