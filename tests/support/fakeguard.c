/* The in-memory guard of the unit tests (fakeguard.h): a design behind lib/guard/guard_int.h's
 * operations table. Every handle's design state is the shared fakeguard_t itself; its records
 * live in a small chained hash table under one mutex. Calls take the lock once per message, so
 * a hook (fakeguard_set_hook) can run between two messages of one batch. */
#include "fakeguard.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "guard_int.h"
#include "wxguard/err.h"

#define FG_BUCKETS 1024

typedef struct fg_plugin {
    char *name;
    unsigned char *result;
    size_t result_len;
} fg_plugin;

/* One message. DONE keeps the fence and attempt it had, for fakeguard_state(). */
typedef struct fg_rec {
    struct fg_rec *next;
    char *key;
    size_t key_len;
    wxg_guard_state_t st; /* PROCESSING, FAILED or DONE */
    char owner[WXG_GUARD_OWNER_LEN + 1];
    uint64_t fence;
    uint32_t attempt;
    int tag; /* payload tag of the claim; the DONE marker's once DONE */
    int64_t lease_until;
    int64_t claimed_at, failed_at, rearmed_at; /* Unix ms */
    uint32_t fails;
    char *reason;
    fg_plugin *plugins;
    size_t nplugins;
    int unreadable; /* fakeguard_set_unreadable: claims answer BUSY, unreadable, for ever */
} fg_rec;

struct fakeguard {
    pthread_mutex_t mu;
    fg_rec *buckets[FG_BUCKETS];
    int64_t offset_ms;
    uint64_t calls[FG_OP_N];
    int fail_rc[FG_OP_N];
    int fail_count[FG_OP_N];
    fakeguard_hook_fn hook;
    void *hook_arg;
};

/* ---------------------------------------------------------------------------------------------
 * Records (called with mu held)
 */

static int64_t clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The clock leases run on, and the one timestamps are written in. */
static int64_t lease_now(const fakeguard_t *f)
{
    return clock_ms(CLOCK_MONOTONIC) + f->offset_ms;
}

static int64_t unix_now(const fakeguard_t *f)
{
    return clock_ms(CLOCK_REALTIME) + f->offset_ms;
}

static size_t bucket_of(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)key[i]) * 1099511628211ULL;
    return (size_t)(h % FG_BUCKETS);
}

static fg_rec *rec_find(fakeguard_t *f, const char *key, size_t len)
{
    for (fg_rec *r = f->buckets[bucket_of(key, len)]; r; r = r->next) {
        if (r->key_len == len && memcmp(r->key, key, len) == 0)
            return r;
    }
    return NULL;
}

/* The record of `key`, made (as if absent: fence 0, attempt 0) when there is none. */
static fg_rec *rec_get(fakeguard_t *f, const char *key, size_t len)
{
    fg_rec *r = rec_find(f, key, len);
    if (r)
        return r;
    r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->key = malloc(len);
    if (!r->key) {
        free(r);
        return NULL;
    }
    memcpy(r->key, key, len);
    r->key_len = len;
    size_t b = bucket_of(key, len);
    r->next = f->buckets[b];
    f->buckets[b] = r;
    return r;
}

static void plugins_clear(fg_rec *r)
{
    for (size_t i = 0; i < r->nplugins; i++) {
        free(r->plugins[i].name);
        free(r->plugins[i].result);
    }
    free(r->plugins);
    r->plugins = NULL;
    r->nplugins = 0;
}

static void rec_free(fg_rec *r)
{
    plugins_clear(r);
    free(r->reason);
    free(r->key);
    free(r);
}

static void rec_remove(fakeguard_t *f, fg_rec *r)
{
    fg_rec **p = &f->buckets[bucket_of(r->key, r->key_len)];
    while (*p != r)
        p = &(*p)->next;
    *p = r->next;
    rec_free(r);
}

/* A fresh owner token (32 hex digits). */
static void new_owner(char out[WXG_GUARD_OWNER_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char rnd[WXG_GUARD_OWNER_LEN / 2];
    if (wxg__guard_fill_random(rnd, sizeof rnd) != 0)
        memset(rnd, 0x5a, sizeof rnd);
    for (size_t i = 0; i < sizeof rnd; i++) {
        out[2 * i] = hex[rnd[i] >> 4];
        out[2 * i + 1] = hex[rnd[i] & 15];
    }
    out[WXG_GUARD_OWNER_LEN] = '\0';
}

/* A new owner claims r now: fence + 1, attempt + 1. */
static void take(fakeguard_t *f, fg_rec *r, int64_t lease_ms, int tag)
{
    new_owner(r->owner);
    r->st = WXG_GUARD_PROCESSING;
    r->fence++;
    r->attempt++;
    r->tag = tag;
    r->lease_until = lease_now(f) + lease_ms;
    r->claimed_at = unix_now(f);
}

/* Whether `t` is the current owner's ticket of a PROCESSING message. */
static fg_rec *owned(fakeguard_t *f, const wxg_guard_ticket_t *t)
{
    fg_rec *r = rec_find(f, t->key, t->key_len);
    if (r && r->st == WXG_GUARD_PROCESSING && r->fence == t->fence &&
        strcmp(r->owner, t->owner) == 0)
        return r;
    return NULL;
}

/* The finished plugins of r as one allocation (wxg_guard_plugin_result_t array, then the
 * names and results, each NUL-terminated); *out NULL when there are none. 0 or WXG_ENOMEM. */
static int plugins_copy(const fg_rec *r, wxg_guard_plugin_result_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (r->nplugins == 0)
        return 0;
    size_t bytes = r->nplugins * sizeof **out;
    for (size_t i = 0; i < r->nplugins; i++)
        bytes += strlen(r->plugins[i].name) + 1 + r->plugins[i].result_len + 1;
    wxg_guard_plugin_result_t *pr = malloc(bytes);
    if (!pr)
        return WXG_ENOMEM;
    char *p = (char *)(pr + r->nplugins);
    for (size_t i = 0; i < r->nplugins; i++) {
        size_t nl = strlen(r->plugins[i].name), rl = r->plugins[i].result_len;
        memcpy(p, r->plugins[i].name, nl + 1);
        pr[i].name = p;
        p += nl + 1;
        if (rl)
            memcpy(p, r->plugins[i].result, rl);
        p[rl] = '\0';
        pr[i].result = (const unsigned char *)p;
        pr[i].result_len = rl;
        p += rl + 1;
    }
    *out = pr;
    *n = r->nplugins;
    return 0;
}

/* Sets plugin `name` of r to `result` (replaced when already there). 0 or WXG_ENOMEM. */
static int plugins_put(fg_rec *r, const char *name, const void *result, size_t len)
{
    unsigned char *copy = malloc(len + 1);
    if (!copy)
        return WXG_ENOMEM;
    if (len)
        memcpy(copy, result, len);
    for (size_t i = 0; i < r->nplugins; i++) {
        if (strcmp(r->plugins[i].name, name) == 0) {
            free(r->plugins[i].result);
            r->plugins[i].result = copy;
            r->plugins[i].result_len = len;
            return 0;
        }
    }
    fg_plugin *np = realloc(r->plugins, (r->nplugins + 1) * sizeof *np);
    char *nm = strdup(name);
    if (np)
        r->plugins = np;
    if (!np || !nm) {
        free(copy);
        free(nm);
        return WXG_ENOMEM;
    }
    r->plugins[r->nplugins++] = (fg_plugin){.name = nm, .result = copy, .result_len = len};
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Call plumbing
 */

/* Counts a call of `op` and answers whether it was made to fail (the code, with the handle's
 * last error set and the failure counted) or may go on (0). */
static int call_begin(wxg_guard_t *g, fakeguard_op op)
{
    fakeguard_t *f = wxg__guard_impl(g);
    int rc = 0;
    pthread_mutex_lock(&f->mu);
    f->calls[op]++;
    if (f->fail_count[op] > 0) {
        f->fail_count[op]--;
        rc = f->fail_rc[op];
    }
    pthread_mutex_unlock(&f->mu);
    if (rc) {
        wxg__guard_set_error(g, "fake guard: injected %s", wxg_err_name(rc));
        wxg__guard_count_error(wxg__guard_stats(g), rc);
    }
    return rc;
}

/* Runs the hook, if any, for one message, then takes the lock for its transition. */
static void message_begin(fakeguard_t *f, fakeguard_op op, const char *key, size_t key_len)
{
    pthread_mutex_lock(&f->mu);
    fakeguard_hook_fn fn = f->hook;
    void *arg = f->hook_arg;
    pthread_mutex_unlock(&f->mu);
    if (fn)
        fn(f, op, key, key_len, arg);
    pthread_mutex_lock(&f->mu);
}

/* Counts one per-message result the way the Lua design counts it. */
static void count_result(wxg_guard_stats_t *s, int res, uint64_t *ok)
{
    if (res == WXG_GUARD_OK)
        (*ok)++;
    else if (res == WXG_GUARD_LEASE_LOST)
        s->lease_lost++;
    else if (res == WXG_GUARD_ALREADY_DONE)
        s->already_done++;
}

/* ---------------------------------------------------------------------------------------------
 * Transitions
 */

/* One message of a claim, with mu held. */
static int claim_one(fakeguard_t *f, const wxg_guard_conf_t *conf, const wxg_guard_msg_t *m,
                     wxg_guard_claim_t *o)
{
    int tag = wxg__guard_payload_tag(m->payload_hash);
    fg_rec *r = rec_find(f, m->key, m->key_len);
    if (r && r->st == WXG_GUARD_DONE) {
        o->outcome = WXG_GUARD_DUPLICATE;
        o->payload_mismatch = r->tag != tag;
        return 0;
    }
    if (r && r->unreadable) {
        o->outcome = WXG_GUARD_BUSY;
        o->lease_ms_left = 1000;
        o->unreadable = 1;
        return 0;
    }
    int64_t now = lease_now(f);
    if (r && r->st == WXG_GUARD_PROCESSING && r->lease_until > now) {
        o->outcome = WXG_GUARD_BUSY;
        o->lease_ms_left = r->lease_until - now;
        return 0;
    }
    if (!r && !(r = rec_get(f, m->key, m->key_len)))
        return WXG_ENOMEM;
    int rc = plugins_copy(r, &o->finished, &o->n_finished);
    if (rc)
        return rc;
    take(f, r, conf->lease_ms, tag);
    o->outcome = WXG_GUARD_CLAIMED;
    o->attempt = r->attempt;
    o->ticket.key = m->key;
    o->ticket.key_len = m->key_len;
    o->ticket.fence = r->fence;
    memcpy(o->ticket.owner, r->owner, sizeof o->ticket.owner);
    return 0;
}

static int fg_claim(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n, wxg_guard_claim_t *out)
{
    fakeguard_t *f = wxg__guard_impl(g);
    wxg_guard_stats_t *s = wxg__guard_stats(g);
    int rc = call_begin(g, FG_CLAIM);
    for (size_t i = 0; i < n && rc == 0; i++) {
        message_begin(f, FG_CLAIM, msgs[i].key, msgs[i].key_len);
        rc = claim_one(f, wxg__guard_conf(g), &msgs[i], &out[i]);
        pthread_mutex_unlock(&f->mu);
    }
    if (rc)
        return rc;
    s->round_trips++;
    for (size_t i = 0; i < n; i++) {
        s->claimed += out[i].outcome == WXG_GUARD_CLAIMED;
        s->duplicates += out[i].outcome == WXG_GUARD_DUPLICATE;
        s->payload_mismatches += out[i].outcome == WXG_GUARD_DUPLICATE && out[i].payload_mismatch;
        s->busy += out[i].outcome == WXG_GUARD_BUSY;
    }
    return 0;
}

/* After a transition's n results: one round trip, and each result counted. */
static void count_results(wxg_guard_t *g, const int *results, size_t n, uint64_t *ok)
{
    wxg_guard_stats_t *s = wxg__guard_stats(g);
    s->round_trips++;
    for (size_t i = 0; i < n; i++)
        count_result(s, results[i], ok);
}

static int fg_renew(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    fakeguard_t *f = wxg__guard_impl(g);
    int rc = call_begin(g, FG_RENEW);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        message_begin(f, FG_RENEW, t[i].key, t[i].key_len);
        fg_rec *r = owned(f, &t[i]);
        if (r)
            r->lease_until = lease_now(f) + wxg__guard_conf(g)->lease_ms;
        results[i] = r ? WXG_GUARD_OK : WXG_GUARD_LEASE_LOST;
        pthread_mutex_unlock(&f->mu);
    }
    count_results(g, results, n, &wxg__guard_stats(g)->renewed);
    return 0;
}

static int fg_plugin_done(wxg_guard_t *g, const wxg_guard_plugin_done_t *items, size_t n,
                          int *results)
{
    fakeguard_t *f = wxg__guard_impl(g);
    int rc = call_begin(g, FG_PLUGIN_DONE);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const wxg_guard_ticket_t *t = items[i].ticket;
        message_begin(f, FG_PLUGIN_DONE, t->key, t->key_len);
        fg_rec *r = owned(f, t);
        if (r)
            rc = plugins_put(r, items[i].plugin, items[i].result, items[i].result_len);
        results[i] = r ? WXG_GUARD_OK : WXG_GUARD_LEASE_LOST;
        pthread_mutex_unlock(&f->mu);
    }
    if (rc == 0)
        count_results(g, results, n, &wxg__guard_stats(g)->plugins_done);
    return rc;
}

static int fg_complete(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    fakeguard_t *f = wxg__guard_impl(g);
    int rc = call_begin(g, FG_COMPLETE);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        message_begin(f, FG_COMPLETE, t[i].key, t[i].key_len);
        fg_rec *r = owned(f, &t[i]);
        if (r) {
            /* The in-flight record goes; the marker keeps the claim's payload tag. */
            r->st = WXG_GUARD_DONE;
            r->owner[0] = '\0';
            plugins_clear(r);
            results[i] = WXG_GUARD_OK;
        } else {
            r = rec_find(f, t[i].key, t[i].key_len);
            results[i] =
                r && r->st == WXG_GUARD_DONE ? WXG_GUARD_ALREADY_DONE : WXG_GUARD_LEASE_LOST;
        }
        pthread_mutex_unlock(&f->mu);
    }
    count_results(g, results, n, &wxg__guard_stats(g)->completed);
    return 0;
}

/* Makes r FAILED now with `reason` (truncated as the guard truncates it). 0 or WXG_ENOMEM. */
static int set_failed(fakeguard_t *f, fg_rec *r, const char *reason, uint32_t attempts)
{
    size_t rl = reason ? strlen(reason) : 0;
    if (rl > WXG_GUARD_REASON_MAX)
        rl = WXG_GUARD_REASON_MAX;
    char *copy = malloc(rl + 1);
    if (!copy)
        return WXG_ENOMEM;
    if (rl)
        memcpy(copy, reason, rl);
    copy[rl] = '\0';
    free(r->reason);
    r->reason = copy;
    r->st = WXG_GUARD_FAILED;
    r->owner[0] = '\0';
    r->lease_until = 0;
    r->fails = attempts;
    r->failed_at = unix_now(f);
    return 0;
}

static int fg_fail(wxg_guard_t *g, const wxg_guard_failure_t *items, size_t n, int *results)
{
    fakeguard_t *f = wxg__guard_impl(g);
    int rc = call_begin(g, FG_FAIL);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const wxg_guard_ticket_t *t = items[i].ticket;
        message_begin(f, FG_FAIL, t->key, t->key_len);
        fg_rec *r = owned(f, t);
        if (r)
            rc = set_failed(f, r, items[i].reason, items[i].attempts);
        results[i] = r ? WXG_GUARD_OK : WXG_GUARD_LEASE_LOST;
        pthread_mutex_unlock(&f->mu);
    }
    if (rc == 0)
        count_results(g, results, n, &wxg__guard_stats(g)->failed);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Administration
 */

static char *dup_bytes(const char *p, size_t len)
{
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, p, len);
        s[len] = '\0';
    }
    return s;
}

/* Fills rec from r (mu held), as inspect and the peek of a scan describe a message. */
static int describe(const fakeguard_t *f, const wxg_guard_conf_t *conf, const fg_rec *r,
                    wxg_guard_record_t *rec)
{
    rec->state = r->st;
    if (r->st == WXG_GUARD_DONE) {
        /* The record is gone; only the marker is left. */
        rec->done_payload_tag = r->tag;
        rec->done_ttl_ms = conf->done_retention_ms;
        rec->done_bucket = strdup("fake:done");
        return rec->done_bucket ? 0 : WXG_ENOMEM;
    }
    rec->has_record = 1;
    if (r->st == WXG_GUARD_PROCESSING) {
        memcpy(rec->owner, r->owner, sizeof rec->owner);
        rec->lease_ms_left = r->lease_until - lease_now(f);
        rec->record_ttl_ms = conf->inflight_ttl_ms;
    } else {
        rec->record_ttl_ms = conf->failed_retention_ms;
    }
    rec->fence = r->fence;
    rec->attempt = r->attempt;
    rec->claimed_at_ms = r->claimed_at;
    rec->failed_at_ms = r->failed_at;
    rec->rearmed_at_ms = r->rearmed_at;
    if (r->failed_at) {
        rec->fail_attempts = r->fails;
        rec->fail_reason = strdup(r->reason ? r->reason : "");
        if (!rec->fail_reason)
            return WXG_ENOMEM;
    }
    rec->msg_key = dup_bytes(r->key, r->key_len);
    if (!rec->msg_key)
        return WXG_ENOMEM;
    rec->msg_key_len = r->key_len;
    return plugins_copy(r, &rec->finished, &rec->n_finished);
}

static int fg_inspect(wxg_guard_t *g, const char *key, size_t key_len,
                      const unsigned char *payload_hash, wxg_guard_record_t **out)
{
    fakeguard_t *f = wxg__guard_impl(g);
    wxg_guard_record_t *rec = calloc(1, sizeof *rec);
    if (!rec)
        return WXG_ENOMEM;
    int rc = 0;
    rec->payload_tag = wxg__guard_payload_tag(payload_hash);
    rec->record_key = strdup("fake:record");
    if (!rec->record_key)
        rc = WXG_ENOMEM;
    pthread_mutex_lock(&f->mu);
    const fg_rec *r = rec_find(f, key, key_len);
    if (r && rc == 0)
        rc = describe(f, wxg__guard_conf(g), r, rec);
    pthread_mutex_unlock(&f->mu);
    if (rc) {
        wxg_guard_record_free(rec);
        return rc;
    }
    wxg__guard_stats(g)->round_trips++;
    *out = rec;
    return 0;
}

static int fg_release(wxg_guard_t *g, const char *key, size_t key_len, int *released)
{
    fakeguard_t *f = wxg__guard_impl(g);
    int rc = 0;
    pthread_mutex_lock(&f->mu);
    fg_rec *r = rec_find(f, key, key_len);
    *released = r && r->st == WXG_GUARD_PROCESSING;
    if (*released)
        rc = set_failed(f, r, "released", r->fails);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int fg_rearm(wxg_guard_t *g, const char *key, size_t key_len, int *rearmed)
{
    fakeguard_t *f = wxg__guard_impl(g);
    pthread_mutex_lock(&f->mu);
    fg_rec *r = rec_find(f, key, key_len);
    *rearmed = r && r->st == WXG_GUARD_FAILED;
    if (*rearmed) {
        r->attempt = 0;
        r->rearmed_at = unix_now(f);
    }
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static int fg_purge(wxg_guard_t *g, const char *key, size_t key_len, int *purged)
{
    fakeguard_t *f = wxg__guard_impl(g);
    pthread_mutex_lock(&f->mu);
    fg_rec *r = rec_find(f, key, key_len);
    /* A live claim and a DONE marker are never touched. */
    *purged = r && (r->st == WXG_GUARD_FAILED ||
                    (r->st == WXG_GUARD_PROCESSING && r->lease_until <= lease_now(f)));
    if (*purged)
        rec_remove(f, r);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

/* Copies every in-flight record (mu held) into a new array of *n records. */
static int scan_snapshot(fakeguard_t *f, const wxg_guard_conf_t *conf, wxg_guard_record_t ***out,
                         size_t *n)
{
    size_t cap = 0, k = 0;
    for (size_t b = 0; b < FG_BUCKETS; b++) {
        for (const fg_rec *r = f->buckets[b]; r; r = r->next)
            cap += r->st != WXG_GUARD_DONE;
    }
    wxg_guard_record_t **recs = calloc(cap ? cap : 1, sizeof *recs);
    if (!recs)
        return WXG_ENOMEM;
    int rc = 0;
    for (size_t b = 0; b < FG_BUCKETS && rc == 0; b++) {
        for (const fg_rec *r = f->buckets[b]; r && rc == 0; r = r->next) {
            if (r->st == WXG_GUARD_DONE)
                continue;
            recs[k] = calloc(1, sizeof *recs[k]);
            rc = recs[k] ? describe(f, conf, r, recs[k]) : WXG_ENOMEM;
            k++;
        }
    }
    *out = recs;
    *n = k;
    return rc;
}

static int fg_scan(wxg_guard_t *g, uint64_t *cursor, int count, wxg_guard_scan_fn fn, void *arg)
{
    fakeguard_t *f = wxg__guard_impl(g);
    wxg_guard_record_t **recs = NULL;
    size_t n = 0;
    pthread_mutex_lock(&f->mu);
    int rc = scan_snapshot(f, wxg__guard_conf(g), &recs, &n);
    pthread_mutex_unlock(&f->mu);
    /* The callback runs without the lock: it may call the guard. */
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = fn(recs[i], arg);
    for (size_t i = 0; i < n; i++)
        wxg_guard_record_free(recs[i]);
    free(recs);
    if (rc == 0)
        *cursor = 0;
    return rc;
}

static int fg_ping(wxg_guard_t *g)
{
    fakeguard_t *f = wxg__guard_impl(g);
    int rc = call_begin(g, FG_PING);
    if (rc)
        return rc;
    message_begin(f, FG_PING, NULL, 0);
    pthread_mutex_unlock(&f->mu);
    wxg__guard_stats(g)->round_trips++;
    return 0;
}

static int fg_describe_layout(const wxg_guard_t *g, char *buf, size_t size)
{
    int n = snprintf(buf, size, "in-memory fake guard (no DONE-marker layout)");
    return n > 0 && (size_t)n < size ? 0 : WXG_EINVAL;
}

static void fg_destroy(wxg_guard_t *g)
{
    (void)g; /* the fakeguard_t is shared and outlives its handles */
}

static const wxg__guard_ops_t fake_ops = {
    .name = "fake",
    .claim_batch = fg_claim,
    .renew_batch = fg_renew,
    .plugin_done_batch = fg_plugin_done,
    .complete_batch = fg_complete,
    .fail_batch = fg_fail,
    .inspect = fg_inspect,
    .release = fg_release,
    .rearm = fg_rearm,
    .purge = fg_purge,
    .scan = fg_scan,
    .ping = fg_ping,
    .describe_layout = fg_describe_layout,
    .destroy = fg_destroy,
};

/* ---------------------------------------------------------------------------------------------
 * The test-facing API (fakeguard.h)
 */

fakeguard_t *fakeguard_new(void)
{
    fakeguard_t *f = calloc(1, sizeof *f);
    if (f && pthread_mutex_init(&f->mu, NULL) != 0) {
        free(f);
        f = NULL;
    }
    return f;
}

void fakeguard_destroy(fakeguard_t *f)
{
    if (!f)
        return;
    for (size_t b = 0; b < FG_BUCKETS; b++) {
        while (f->buckets[b]) {
            fg_rec *r = f->buckets[b];
            f->buckets[b] = r->next;
            rec_free(r);
        }
    }
    pthread_mutex_destroy(&f->mu);
    free(f);
}

wxg_guard_t *fakeguard_handle(fakeguard_t *f, const wxg_guard_conf_t *conf)
{
    return wxg__guard_new_ops(&fake_ops, f, conf, NULL, 0);
}

void fakeguard_fail_next(fakeguard_t *f, fakeguard_op op, int rc, int count)
{
    pthread_mutex_lock(&f->mu);
    f->fail_rc[op] = rc;
    f->fail_count[op] = count > 0 ? count : 0;
    pthread_mutex_unlock(&f->mu);
}

void fakeguard_set_done(fakeguard_t *f, const char *key)
{
    pthread_mutex_lock(&f->mu);
    fg_rec *r = rec_get(f, key, strlen(key));
    if (r) {
        r->st = WXG_GUARD_DONE;
        r->owner[0] = '\0';
        r->tag = wxg__guard_payload_tag(NULL); /* what a claim without a payload carries */
        plugins_clear(r);
    }
    pthread_mutex_unlock(&f->mu);
}

void fakeguard_set_busy(fakeguard_t *f, const char *key, int64_t lease_ms)
{
    pthread_mutex_lock(&f->mu);
    fg_rec *r = rec_get(f, key, strlen(key));
    if (r)
        take(f, r, lease_ms, 0);
    pthread_mutex_unlock(&f->mu);
}

void fakeguard_set_unreadable(fakeguard_t *f, const char *key)
{
    pthread_mutex_lock(&f->mu);
    fg_rec *r = rec_get(f, key, strlen(key));
    if (r)
        r->unreadable = 1;
    pthread_mutex_unlock(&f->mu);
}

void fakeguard_steal(fakeguard_t *f, const char *key)
{
    fakeguard_set_busy(f, key, 30000);
}

void fakeguard_advance(fakeguard_t *f, int64_t ms)
{
    pthread_mutex_lock(&f->mu);
    f->offset_ms += ms;
    pthread_mutex_unlock(&f->mu);
}

wxg_guard_state_t fakeguard_state(fakeguard_t *f, const char *key, uint64_t *fence,
                                  uint32_t *attempt)
{
    pthread_mutex_lock(&f->mu);
    const fg_rec *r = rec_find(f, key, strlen(key));
    wxg_guard_state_t st = r ? r->st : WXG_GUARD_ABSENT;
    if (fence)
        *fence = r ? r->fence : 0;
    if (attempt)
        *attempt = r ? r->attempt : 0;
    pthread_mutex_unlock(&f->mu);
    return st;
}

uint64_t fakeguard_calls(fakeguard_t *f, fakeguard_op op)
{
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->calls[op];
    pthread_mutex_unlock(&f->mu);
    return n;
}

size_t fakeguard_finished(fakeguard_t *f, const char *key, const char **names, size_t cap)
{
    pthread_mutex_lock(&f->mu);
    const fg_rec *r = rec_find(f, key, strlen(key));
    size_t n = r ? r->nplugins : 0;
    for (size_t i = 0; i < n && i < cap; i++)
        names[i] = r->plugins[i].name;
    pthread_mutex_unlock(&f->mu);
    return n;
}

void fakeguard_set_hook(fakeguard_t *f, fakeguard_hook_fn fn, void *arg)
{
    pthread_mutex_lock(&f->mu);
    f->hook = fn;
    f->hook_arg = arg;
    pthread_mutex_unlock(&f->mu);
}
