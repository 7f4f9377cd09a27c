/*
 * DESIGN: the `fail` built-in plugin, injected failures for tests and drills.
 *
 * For messages matching a predicate it fails permanently, fails transiently a number of times,
 * or stalls; every other message passes with OK. The predicate depends only on the message and
 * the attempt number, never on process-local counters, so every replica and every retry agrees
 * on what happens to a message, and a test can compute the expected outcome in advance.
 *
 * Configuration (plugin.fail.*):
 *   action         fail (default) | retry | stall
 *                    fail:  return FAIL (the message goes to the dead-letter topic)
 *                    retry: return RETRY while the attempt number is <= retry.times, then OK
 *                    stall: sleep stall.ms, then return OK (e.g. to outlast a lease)
 *   retry.times    0..1000000, default 1; 0 = RETRY on every attempt (exhausts the retries)
 *   stall.ms       0..600000, default 1000
 *   reason         the reason given with FAIL/RETRY (default "injected failure")
 *   Predicate (a message matches when ANY configured one matches; with none, every message
 *   matches):
 *   match.keys     comma-separated idempotency keys
 *   match.msg_ids  comma-separated message ids (the decimal msg_id of the view)
 *   match.content  a substring of the message content (bytes, case-sensitive)
 *   match.every    N >= 1: messages whose key hashes to 0 modulo N, with the hash FNV-1a 64
 *                  (offset basis 14695981039346656037, prime 1099511628211) over the key's
 *                  bytes; about one message in N, the same ones everywhere
 *
 * Threads: the state is read-only after init; handle may run on every worker at once.
 */
#include "plugin_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock_int.h"

enum fail_action { ACTION_FAIL, ACTION_RETRY, ACTION_STALL };

typedef struct list {
    size_t n;
    char **items;
} list;

typedef struct fail_state {
    enum fail_action action;
    int64_t retry_times;
    int64_t stall_ms;
    char *reason;
    list keys;
    list msg_ids;
    char *content;
    int64_t every;
    int any_predicate;
} fail_state;

static void list_free(list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

/* Splits a comma-separated value into trimmed, non-empty items. */
static int list_parse(list *l, const char *v)
{
    size_t cap = 1;
    for (const char *p = v; *p; p++)
        cap += *p == ',';
    l->items = calloc(cap, sizeof *l->items);
    if (!l->items)
        return WXG_ENOMEM;
    const char *s = v;
    while (s) {
        const char *comma = strchr(s, ',');
        const char *end = comma ? comma : s + strlen(s);
        while (s < end && (*s == ' ' || *s == '\t'))
            s++;
        while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if (end > s) {
            size_t len = (size_t)(end - s);
            char *item = malloc(len + 1);
            if (!item)
                return WXG_ENOMEM;
            memcpy(item, s, len);
            item[len] = '\0';
            l->items[l->n++] = item;
        }
        s = comma ? comma + 1 : NULL;
    }
    return 0;
}

static int list_has(const list *l, const char *s)
{
    for (size_t i = 0; s && i < l->n; i++) {
        if (strcmp(l->items[i], s) == 0)
            return 1;
    }
    return 0;
}

static void fail_destroy(void *state)
{
    fail_state *s = state;
    if (!s)
        return;
    list_free(&s->keys);
    list_free(&s->msg_ids);
    free(s->content);
    free(s->reason);
    free(s);
}

static int fail_init(const wxg_plugin_conf_t *conf, void **state, char *errstr, size_t errstr_size)
{
    static const char *const known[] = {"action",        "retry.times", "stall.ms",
                                        "reason",        "match.keys",  "match.msg_ids",
                                        "match.content", "match.every", NULL};
    int rc = wxg_plugin_conf_check_keys(conf, known, errstr, errstr_size);
    if (rc != 0)
        return rc;
    fail_state *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    const char *action = wxg_plugin_conf_get(conf, "action");
    if (!action || strcmp(action, "fail") == 0) {
        s->action = ACTION_FAIL;
    } else if (strcmp(action, "retry") == 0) {
        s->action = ACTION_RETRY;
    } else if (strcmp(action, "stall") == 0) {
        s->action = ACTION_STALL;
    } else {
        snprintf(errstr, errstr_size, "plugin.fail.action: '%s' is not one of fail, retry, stall",
                 action);
        rc = WXG_ECONFIG;
        goto fail;
    }
    if ((rc = wxg_plugin_conf_get_int64(conf, "retry.times", 1, 0, 1000000, &s->retry_times, errstr,
                                        errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_int64(conf, "stall.ms", 1000, 0, 600000, &s->stall_ms, errstr,
                                        errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_int64(conf, "match.every", 0, 1, INT64_MAX, &s->every, errstr,
                                        errstr_size)) != 0)
        goto fail;
    const char *reason = wxg_plugin_conf_get(conf, "reason");
    const char *keys = wxg_plugin_conf_get(conf, "match.keys");
    const char *ids = wxg_plugin_conf_get(conf, "match.msg_ids");
    const char *content = wxg_plugin_conf_get(conf, "match.content");
    rc = WXG_ENOMEM;
    if (!(s->reason = strdup(reason ? reason : "injected failure")))
        goto fail_oom;
    if (keys && list_parse(&s->keys, keys) != 0)
        goto fail_oom;
    if (ids && list_parse(&s->msg_ids, ids) != 0)
        goto fail_oom;
    if (content && *content && !(s->content = strdup(content)))
        goto fail_oom;
    s->any_predicate = keys || ids || (content && *content) || s->every > 0;
    *state = s;
    return 0;

fail_oom:
    snprintf(errstr, errstr_size, "out of memory");
fail:
    fail_destroy(s);
    return rc;
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

/* memmem is a GNU extension; this is the plain bounded search. */
static int contains(const char *hay, size_t hay_len, const char *needle)
{
    size_t n = strlen(needle);
    if (!hay || n == 0 || n > hay_len)
        return 0;
    for (size_t i = 0; i + n <= hay_len; i++) {
        if (hay[i] == needle[0] && memcmp(hay + i, needle, n) == 0)
            return 1;
    }
    return 0;
}

static int matches(const fail_state *s, const wxg_msg_view_t *msg, const char *key)
{
    if (!s->any_predicate)
        return 1;
    if (list_has(&s->keys, key) || list_has(&s->msg_ids, msg->msg_id))
        return 1;
    if (s->content && contains(msg->content, msg->content_len, s->content))
        return 1;
    return s->every > 0 && fnv1a64(key) % (uint64_t)s->every == 0;
}

static wxg_plugin_result_t fail_handle(void *state, void *thread_state, const wxg_msg_view_t *msg,
                                       wxg_plugin_ctx_t *ctx)
{
    (void)thread_state;
    const fail_state *s = state;
    if (!matches(s, msg, wxg_plugin_ctx_key(ctx)))
        return WXG_PLUGIN_OK;
    switch (s->action) {
    case ACTION_FAIL:
        wxg_plugin_ctx_set_reason(ctx, "fail: %s", s->reason);
        return WXG_PLUGIN_FAIL;
    case ACTION_RETRY: {
        uint32_t attempt = wxg_plugin_ctx_attempt(ctx);
        if (s->retry_times == 0 || attempt <= (uint64_t)s->retry_times) {
            wxg_plugin_ctx_set_reason(ctx, "fail: %s (attempt %u)", s->reason, (unsigned)attempt);
            return WXG_PLUGIN_RETRY;
        }
        return WXG_PLUGIN_OK;
    }
    case ACTION_STALL:
        wxg__sleep_ms(s->stall_ms);
        return WXG_PLUGIN_OK;
    }
    return WXG_PLUGIN_FAIL;
}

static const wxg_plugin_desc_t fail_desc = {
    .abi_version = WXG_PLUGIN_ABI_VERSION,
    .name = "fail",
    .init = fail_init,
    .handle = fail_handle,
    .destroy = fail_destroy,
};

const wxg_plugin_desc_t *wxg__plugin_fail(void)
{
    return &fail_desc;
}
