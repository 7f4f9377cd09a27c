/*
 * DESIGN: the guard's scripted transitions on layout v4, and the Lua design made of them.
 *
 * Purpose: the per-message state machine of docs/guard.md §1 on Redis as Lua scripts
 * (lib/guard/lua/) that check and change a message's state atomically, for a whole batch of
 * messages per script call: claim, renew, plugin_done, complete, fail. This file builds those
 * batches (the pipelined script-call runner that lib/guard/guard_admin.c uses too), reads the
 * per-message answers, and keeps the near cache in front of claim and behind complete. The Lua
 * design ("lua") runs every transition through these scripts; the native design
 * (lib/guard/guard_native.c, the default) runs the common transitions as native commands and calls
 * the scripts here for the rest.
 *
 * Layout v4 (lib/guard/guard_record.def): a message's state is its field in the DONE bucket of its
 * claim -- an in-flight value, a pointer to its record, or its DONE marker -- plus a record
 * after a takeover, a failure or a release, and a hash of sub-markers. Every script declares
 * every key it may touch (the buckets of the message's time window, its record, its sub-marker
 * hash), so that Redis Cluster routes and migrates them correctly (docs/guard.md §2). The time
 * window comes from the handle's estimate of the server's clock (lib/guard/guard_conn.c); a script
 * whose window does not cover the server's time refuses the call (WXGSKEW), the clock is sampled
 * again and the call rebuilt once.
 *
 * Threads: the handle's thread only; no locks. The near cache (lib/guard/donecache.c) is shared by
 * the handles of a process and locks itself.
 *
 * Failure modes. NOSCRIPT (script cache flushed, restart, failover) reloads the scripts and
 * re-sends only the refused calls, which is safe because NOSCRIPT proves they did not run. A
 * WXGSKEW refusal proves the same. Any other failure leaves the outcome unknown and is reported
 * to the caller, never retried here. A reply of the wrong shape is WXG_EREDIS for the whole
 * call.
 *
 * Near cache (conf.done_cache, docs/guard.md §10): claim first answers DUPLICATE for what the
 * cache knows and sends only the rest to Redis; complete remembers the messages whose DONE
 * marker it wrote. The cache only ever holds a message for less than its marker's lifetime in
 * Redis, so it changes the cost of a duplicate, never its answer.
 */
#include "guard_conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock_int.h"
#include "key_int.h"

/* ---------------------------------------------------------------------------------------------
 * Replies
 */

static int reply_int(const redisReply *r, long long *v)
{
    if (!r || r->type != REDIS_REPLY_INTEGER)
        return WXG_EREDIS;
    *v = r->integer;
    return 0;
}

/* Copies a claim reply's finished plugins {name, result, ...} into one allocation (the result
 * array, then each name and result NUL-terminated); *out is NULL when there are none.
 * Returns 0, WXG_EREDIS or WXG_ENOMEM. */
static int parse_finished(const redisReply *d, wxg_guard_plugin_result_t **out, size_t *n)
{
    if (!d || d->type != REDIS_REPLY_ARRAY || d->elements % 2 != 0)
        return WXG_EREDIS;
    size_t np = d->elements / 2, bytes = np * sizeof(wxg_guard_plugin_result_t);
    for (size_t i = 0; i < d->elements; i++) {
        if (!d->element[i] || d->element[i]->type != REDIS_REPLY_STRING)
            return WXG_EREDIS;
        bytes += d->element[i]->len + 1;
    }
    if (np == 0) {
        *out = NULL;
        *n = 0;
        return 0;
    }
    wxg_guard_plugin_result_t *pr = malloc(bytes);
    if (!pr)
        return WXG_ENOMEM;
    char *p = (char *)(pr + np);
    for (size_t i = 0; i < np; i++) {
        const redisReply *nm = d->element[2 * i], *rs = d->element[2 * i + 1];
        memcpy(p, nm->str, nm->len);
        p[nm->len] = '\0';
        pr[i].name = p;
        p += nm->len + 1;
        memcpy(p, rs->str, rs->len);
        p[rs->len] = '\0';
        pr[i].result = (const unsigned char *)p;
        pr[i].result_len = rs->len;
        p += rs->len + 1;
    }
    *out = pr;
    *n = np;
    return 0;
}

int wxg__guard_parse_claim(const redisReply *r, wxg_guard_claim_t *out)
{
    long long code, a, b;
    if (r && r->type == REDIS_REPLY_INTEGER) {
        /* The common answers come as one integer (lib/guard/lua/claim.lua): converting a nested
         * reply costs Redis more than the claim's own commands. */
        if (r->integer < 0) {
            /* A new record: the answer is its fence, negated. */
            out->outcome = WXG_GUARD_CLAIMED;
            out->ticket.fence = (uint64_t)-r->integer;
            out->attempt = 1;
            return 0;
        }
        switch (r->integer) {
        case 2:
        case 3:
            out->outcome = WXG_GUARD_DUPLICATE;
            out->payload_mismatch = r->integer == 3;
            return 0;
        default:
            return WXG_EREDIS;
        }
    }
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2 || reply_int(r->element[0], &code))
        return WXG_EREDIS;
    switch (code) {
    case 1: {
        if (r->elements != 4 || reply_int(r->element[1], &a) || reply_int(r->element[2], &b) ||
            a < 1 || b < 1 || b > UINT32_MAX)
            return WXG_EREDIS;
        int rc = parse_finished(r->element[3], &out->finished, &out->n_finished);
        if (rc)
            return rc;
        out->outcome = WXG_GUARD_CLAIMED;
        out->ticket.fence = (uint64_t)a;
        out->attempt = (uint32_t)b;
        return 0;
    }
    case 2:
        if (r->elements != 2 || reply_int(r->element[1], &a) || (a != 0 && a != 1))
            return WXG_EREDIS;
        out->outcome = WXG_GUARD_DUPLICATE;
        out->payload_mismatch = (int)a;
        return 0;
    case 3:
    case 4:
        if (r->elements != 2 || reply_int(r->element[1], &a) || a < 0)
            return WXG_EREDIS;
        out->outcome = WXG_GUARD_BUSY;
        out->lease_ms_left = a;
        out->unreadable = code == 4;
        return 0;
    default:
        return WXG_EREDIS;
    }
}

int wxg__guard_parse_result(const redisReply *r, int *result)
{
    long long v;
    if (reply_int(r, &v))
        return WXG_EREDIS;
    switch (v) {
    case 0:
        *result = WXG_GUARD_OK;
        return 0;
    case -1:
        *result = WXG_GUARD_LEASE_LOST;
        return 0;
    case 1:
        *result = WXG_GUARD_ALREADY_DONE;
        return 0;
    default:
        return WXG_EREDIS;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Batches (guard_conn_int.h)
 */

void wxg__guard_batch_free(wxg__guard_batch_t *b)
{
    if (b->chunks) {
        for (size_t i = 0; i < b->nchunks; i++) {
            free(b->chunks[i].argv);
            free(b->chunks[i].lens);
            if (b->chunks[i].reply)
                freeReplyObject(b->chunks[i].reply);
        }
    }
    free(b->chunks);
    free(b->names);
    free(b->order);
    free(b->items);
    memset(b, 0, sizeof *b);
}

int wxg__guard_batch_init(wxg__guard_batch_t *b, int script, size_t n, int nargs)
{
    memset(b, 0, sizeof *b);
    b->script = script;
    b->n = n;
    b->nargs = nargs;
    b->items = calloc(n, sizeof *b->items);
    b->order = calloc(n, sizeof *b->order);
    if (!b->items || !b->order) {
        wxg__guard_batch_free(b);
        return WXG_ENOMEM;
    }
    return 0;
}

void wxg__guard_batch_hdr_num(wxg__guard_batch_t *b, long long v)
{
    int i = b->nhdr++;
    snprintf(b->hdrbuf[i], sizeof b->hdrbuf[i], "%lld", v);
    b->hdr[i] = b->hdrbuf[i];
    b->hdrlen[i] = strlen(b->hdrbuf[i]);
}

/* Floor division of a possibly negative time by a positive width. */
static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

int wxg__guard_batch_window(wxg__guard_redis_t *rg, wxg__guard_batch_t *b)
{
    int64_t now = wxg__guard_clock_us(rg) / 1000, width = rg->geom.bucket_ms;
    int64_t hi = floor_div(now + WXG__CLOCK_MARGIN_MS, width);
    int64_t lo = floor_div(now - WXG__CLOCK_MARGIN_MS - rg->geom.retention_ms, width);
    int64_t cur = floor_div(now, width);
    b->tb_hi = hi;
    b->nb = (int)(hi - lo + 1);
    b->names = malloc(b->n * (size_t)b->nb * WXG__KEY_MAX);
    if (!b->names)
        return WXG_ENOMEM;
    /* The layout of each time bucket first (lib/guard/guard_geom.c: it may ask Redis, once per time
     * bucket and handle); a script may write into the current one or, near a boundary, the
     * next one, whose layouts must therefore be stamped before it runs. */
    int *sel = calloc((size_t)b->nb, sizeof *sel);
    int rc = sel ? 0 : WXG_ENOMEM;
    /* Over the connection the script will run on: a reconnect after the layout was read could
     * meet a Redis that lost its stamps (lib/guard/guard_geom.c). */
    if (rc == 0)
        rc = wxg__guard_conn_ensure(rg);
    b->epoch = wxg__guard_conn_epoch(rg);
    for (int j = 0; j < b->nb && rc == 0; j++)
        rc = wxg__guard_sel(rg, hi - j, hi - j >= cur, &sel[j]);
    for (size_t i = 0; i < b->n && rc == 0; i++) {
        for (int j = 0; j < b->nb && rc == 0; j++) {
            char *name = b->names + (i * (size_t)b->nb + (size_t)j) * WXG__KEY_MAX;
            rc = wxg__guard_bucket_of(rg->prefix, &rg->geom, sel[j], b->items[i].fp, hi - j, name,
                                      WXG__KEY_MAX);
        }
    }
    free(sel);
    if (rc)
        return rc;
    wxg__guard_batch_hdr_num(b, b->nb);
    wxg__guard_batch_hdr_num(b, (long long)hi);
    wxg__guard_batch_hdr_num(b, (long long)width);
    wxg__guard_batch_hdr_num(b, (long long)rg->geom.retention_ms);
    return 0;
}

/* Computes names for item i from its key. fp: the key's fingerprint when the caller already
 * has it (the near cache hashed the key), else NULL. */
int wxg__guard_item_keys(const wxg__guard_redis_t *rg, wxg__guard_item_t *it, const char *key,
                         size_t key_len, const unsigned char *fp)
{
    if (!key || key_len == 0)
        return WXG_EINVAL;
    if (fp) {
        memcpy(it->fp, fp, sizeof it->fp);
    } else {
        int rc = wxg__guard_fingerprint(key, key_len, it->fp);
        if (rc)
            return rc;
    }
    return wxg__guard_keys_build(rg->prefix, &rg->geom, it->fp, &it->k);
}

int wxg__guard_item_who(wxg__guard_item_t *it, const wxg_guard_ticket_t *t)
{
    size_t fl = wxg__put_dec(it->fence, t->fence);
    it->fence[fl] = '\0';
    if (WXG_GUARD_OWNER_LEN + 1 + fl >= sizeof it->who)
        return WXG_EINVAL;
    memcpy(it->who, t->owner, WXG_GUARD_OWNER_LEN);
    it->who[WXG_GUARD_OWNER_LEN] = '|';
    memcpy(it->who + WXG_GUARD_OWNER_LEN + 1, it->fence, fl + 1);
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : (x > y);
}

/* Orders items by shard, keeping the caller's order within a shard (cluster mode). */
static int order_by_shard(wxg__guard_batch_t *b)
{
    uint64_t *tmp = malloc(b->n * sizeof *tmp);
    if (!tmp)
        return WXG_ENOMEM;
    for (size_t i = 0; i < b->n; i++)
        tmp[i] = ((uint64_t)b->items[i].k.shard << 40) | (uint64_t)i;
    qsort(tmp, b->n, sizeof *tmp, cmp_u64);
    for (size_t i = 0; i < b->n; i++)
        b->order[i] = (size_t)(tmp[i] & ((1ULL << 40) - 1));
    free(tmp);
    return 0;
}

/* Fills chunk c's EVALSHA argv: the sha slot, every message's declared keys (its time window's
 * buckets, its record, its sub-marker hash; without a window the record and the hash only),
 * the header arguments, then each message's arguments. */
static int chunk_argv(const wxg__guard_batch_t *b, wxg__guard_chunk_t *c)
{
    int kpm = b->nb + 2;
    int nkeys = (int)c->count * kpm;
    c->argc = 3 + nkeys + b->nhdr + (int)c->count * b->nargs;
    c->argv = calloc((size_t)c->argc, sizeof *c->argv);
    c->lens = calloc((size_t)c->argc, sizeof *c->lens);
    if (!c->argv || !c->lens)
        return WXG_ENOMEM;
    snprintf(c->numkeys, sizeof c->numkeys, "%d", nkeys);
    int a = 0;
    c->argv[a] = "EVALSHA";
    c->lens[a++] = 7;
    c->argv[a] = NULL; /* the sha, filled when sending (it changes after a reload) */
    c->lens[a++] = 40;
    c->argv[a] = c->numkeys;
    c->lens[a++] = strlen(c->numkeys);
    for (size_t j = 0; j < c->count; j++) {
        size_t idx = b->order[c->first + j];
        const wxg__guard_item_t *it = &b->items[idx];
        for (int t = 0; t < b->nb; t++) {
            c->argv[a] = b->names + (idx * (size_t)b->nb + (size_t)t) * WXG__KEY_MAX;
            c->lens[a] = strlen(c->argv[a]);
            a++;
        }
        c->argv[a] = it->k.record;
        c->lens[a++] = it->k.record_len;
        c->argv[a] = it->k.plugins;
        c->lens[a++] = it->k.plugins_len;
    }
    for (int h = 0; h < b->nhdr; h++) {
        c->argv[a] = b->hdr[h];
        c->lens[a++] = b->hdrlen[h];
    }
    for (size_t j = 0; j < c->count; j++) {
        const wxg__guard_item_t *it = &b->items[b->order[c->first + j]];
        for (int x = 0; x < b->nargs; x++) {
            c->argv[a] = it->arg[x];
            c->lens[a++] = it->len[x];
        }
    }
    return 0;
}

int wxg__guard_batch_build(const wxg__guard_redis_t *rg, wxg__guard_batch_t *b)
{
    for (size_t i = 0; i < b->n; i++)
        b->order[i] = i;
    if (rg->conf.cluster && b->n > 1) {
        int rc = order_by_shard(b);
        if (rc)
            return rc;
    }
    size_t max = (size_t)rg->conf.batch_max, cap = b->n; /* at most one chunk per item */
    b->chunks = calloc(cap, sizeof *b->chunks);
    if (!b->chunks)
        return WXG_ENOMEM;
    size_t i = 0;
    while (i < b->n) {
        wxg__guard_chunk_t *c = &b->chunks[b->nchunks++];
        c->first = i;
        c->count = 1;
        unsigned shard = b->items[b->order[i]].k.shard;
        while (i + c->count < b->n && c->count < max &&
               (!rg->conf.cluster || b->items[b->order[i + c->count]].k.shard == shard))
            c->count++;
        i += c->count;
        int rc = chunk_argv(b, c);
        if (rc)
            return rc;
    }
    return 0;
}

/* Sends every chunk that has no reply yet (plus WAIT when configured) in one pipeline and reads
 * the replies. Returns 0, or a call-level error; NOSCRIPT replies are left for the caller. */
static int send_round(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int with_wait, long long *acks)
{
    wxg__guard_cmd_t *cmds = calloc(b->nchunks + 1, sizeof *cmds);
    redisReply **replies = calloc(b->nchunks + 1, sizeof *replies);
    size_t n = 0, got = 0;
    int rc = WXG_ENOMEM;
    if (!cmds || !replies) {
        wxg__guard_set_error(rg->handle, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < b->nchunks; i++) {
        wxg__guard_chunk_t *c = &b->chunks[i];
        if (c->reply)
            continue;
        c->argv[1] = rg->sha[b->script];
        cmds[n++] = (wxg__guard_cmd_t){c->argc, c->argv, c->lens};
        rg->stats->script_calls++;
    }
    size_t nscripts = n;
    char wn[16], wt[16];
    const char *wargv[3] = {"WAIT", wn, wt};
    size_t wlens[3];
    if (with_wait) {
        wlens[0] = 4;
        wlens[1] = (size_t)snprintf(wn, sizeof wn, "%d", rg->conf.wait_replicas);
        wlens[2] = (size_t)snprintf(wt, sizeof wt, "%d", rg->conf.wait_timeout_ms);
        cmds[n++] = (wxg__guard_cmd_t){3, wargv, wlens};
    }
    rc = wxg__guard_conn_pipeline(rg, cmds, n, with_wait ? rg->conf.wait_timeout_ms : 0, replies,
                                  &got);
    /* The chunks whose replies arrived keep them, also when a later one failed: they are freed
     * with the batch. A chunk without a reply has an unknown outcome; the call fails. */
    size_t k = 0;
    for (size_t i = 0; i < b->nchunks && k < nscripts; i++) {
        if (b->chunks[i].reply)
            continue;
        if (k < got)
            b->chunks[i].reply = replies[k];
        k++;
    }
    if (rc == 0 && with_wait) {
        *acks = replies[nscripts]->type == REDIS_REPLY_INTEGER ? replies[nscripts]->integer : -1;
        freeReplyObject(replies[nscripts]);
    }
out:
    free(cmds);
    free(replies);
    return rc;
}

static int is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && wxg__guard_classify_error(r->str, r->len) == 1;
}

static int is_skew(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->len >= 7 && memcmp(r->str, "WXGSKEW", 7) == 0;
}

/* Frees the replies refused with NOSCRIPT (so that the next round re-sends those chunks);
 * returns whether there were any. */
static int drop_noscript(wxg__guard_batch_t *b)
{
    int noscript = 0;
    for (size_t i = 0; i < b->nchunks; i++) {
        wxg__guard_chunk_t *c = &b->chunks[i];
        if (is_noscript(c->reply)) {
            freeReplyObject(c->reply);
            c->reply = NULL;
            noscript = 1;
        }
    }
    return noscript;
}

/* Checks the final replies: an error reply fails the call with its code (and a READONLY one
 * drops the connection); per_message replies must have one element per message. A refused
 * time window is WXG__GUARD_SKEW. */
static int check_replies(wxg__guard_redis_t *rg, const wxg__guard_batch_t *b, int per_message)
{
    for (size_t i = 0; i < b->nchunks; i++) {
        if (is_skew(b->chunks[i].reply))
            return WXG__GUARD_SKEW;
    }
    for (size_t i = 0; i < b->nchunks; i++) {
        const redisReply *r = b->chunks[i].reply;
        if (r->type == REDIS_REPLY_ERROR) {
            wxg__guard_set_error(rg->handle, "Redis refused the script: %.*s",
                                 (int)(r->len > 200 ? 200 : r->len), r->str);
            int rc = wxg__guard_refusal_code(r);
            wxg__guard_conn_note_refusal(rg, r);
            return rc;
        }
        if (per_message && (r->type != REDIS_REPLY_ARRAY || r->elements != b->chunks[i].count)) {
            wxg__guard_set_error(rg->handle, "unexpected script reply shape");
            return WXG_EREDIS;
        }
    }
    return 0;
}

int wxg__guard_batch_run(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int writes, int per_message)
{
    int rc = wxg__guard_conn_ensure(rg);
    if (rc)
        goto out;
    if (b->nb > 0 && rg->geom.adaptive && wxg__guard_conn_epoch(rg) != b->epoch) {
        /* Laid out over connections that are gone: nothing was sent, so retrying is safe. */
        rc = WXG_ECONN;
        wxg__guard_set_error(rg->handle,
                             "the connection to Redis changed while the call was prepared; retry");
        goto out;
    }
    int with_wait = writes && rg->conf.wait_replicas > 0;
    for (int round = 0; round < 2; round++) {
        long long acks = 0;
        rc = send_round(rg, b, with_wait, &acks);
        if (rc)
            goto out;
        if (with_wait && acks < rg->conf.wait_replicas) {
            rc = WXG_EREPLICAS;
            wxg__guard_set_error(rg->handle, "WAIT: %lld of %d replicas acknowledged within %d ms",
                                 acks, rg->conf.wait_replicas, rg->conf.wait_timeout_ms);
            goto out;
        }
        if (!drop_noscript(b))
            break;
        if (round == 1) {
            rc = WXG_EREDIS;
            wxg__guard_set_error(rg->handle, "NOSCRIPT again after reloading");
            goto out;
        }
        rg->stats->noscript_reloads++;
        rc = wxg__guard_conn_load_scripts(rg, rg->last_error, rg->last_error_size);
        if (rc)
            goto out;
    }
    rc = check_replies(rg, b, per_message);
    if (rc == WXG__GUARD_SKEW) {
        int src = wxg__guard_clock_sample(rg);
        if (src)
            rc = src;
        return rc;
    }
out:
    if (rc)
        wxg__guard_count_error(rg->stats, rc);
    return rc;
}

const redisReply *wxg__guard_batch_elem(const wxg__guard_batch_t *b, size_t c, size_t j)
{
    return b->chunks[c].reply->element[j];
}

/* Fills the per-message results of a renew/plugin_done/complete/fail batch. */
static int batch_results(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int *results)
{
    for (size_t c = 0; c < b->nchunks; c++) {
        for (size_t j = 0; j < b->chunks[c].count; j++) {
            size_t idx = b->order[b->chunks[c].first + j];
            int res;
            if (wxg__guard_parse_result(wxg__guard_batch_elem(b, c, j), &res)) {
                wxg__guard_set_error(rg->handle, "unexpected script result");
                rg->stats->redis_errors++;
                return WXG_EREDIS;
            }
            results[idx] = res;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Near cache (conf.done_cache; docs/guard.md §10)
 *
 * Kept apart from the Redis paths on purpose: claim filters the messages the cache knows before
 * the Redis path sees the rest, and complete remembers what it wrote after the Redis path
 * returned, so neither depends on how a design talks to Redis (both designs use them).
 */

/* The cache key of `key`: the first 16 bytes of its fingerprint, mixed with this handle's
 * server/database/prefix identity so that handles of different deployments never see each
 * other's entries in a shared cache. */
static void near_fp(const wxg__guard_redis_t *rg, const unsigned char fp[32],
                    unsigned char out[WXG__DONECACHE_FP_LEN])
{
    for (size_t i = 0; i < WXG__DONECACHE_FP_LEN; i++)
        out[i] = fp[i] ^ rg->cache_ns[i];
}

int wxg__guard_near_ns(wxg__guard_redis_t *rg)
{
    char id[1024];
    /* Under Sentinel the deployment is the named primary, wherever it runs now: its markers
     * move with it through a failover, and so may the cache's entries. */
    int len = rg->nsent > 0 ? snprintf(id, sizeof id, "wxg-donecache\nsentinel\n%s\n%d\n%s",
                                       rg->sentinel_master, rg->conf.db, rg->prefix)
                            : snprintf(id, sizeof id, "wxg-donecache\n%s\n%d\n%d\n%s",
                                       rg->unix_path ? rg->unix_path : rg->host,
                                       rg->unix_path ? 0 : rg->conf.port, rg->conf.db, rg->prefix);
    if (len < 0)
        return WXG_EINVAL;
    unsigned char fp[32];
    int rc = wxg__guard_fingerprint(id, (size_t)len < sizeof id ? (size_t)len : sizeof id - 1, fp);
    if (rc == 0)
        memcpy(rg->cache_ns, fp, sizeof rg->cache_ns);
    return rc;
}

/* Looks every message up in the cache: a hit is answered DUPLICATE in out[i] (cached = 1).
 * fps[i] receives each key's fingerprint, so that a key is hashed once. Returns the number of
 * hits, or WXG_ENOMEM. */
static long near_lookup(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                        wxg_guard_claim_t *out, unsigned char (*fps)[32], size_t *mismatches)
{
    int64_t now = wxg__mono_ms();
    long hits = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char nfp[WXG__DONECACHE_FP_LEN];
        int tag = 0;
        if (wxg__guard_fingerprint(msgs[i].key, msgs[i].key_len, fps[i]) != 0)
            return WXG_ENOMEM;
        near_fp(rg, fps[i], nfp);
        if (!wxg__donecache_lookup(rg->conf.done_cache, nfp, now, &tag))
            continue;
        out[i].outcome = WXG_GUARD_DUPLICATE;
        out[i].cached = 1;
        out[i].payload_mismatch = tag != wxg__guard_payload_tag(msgs[i].payload_hash);
        *mismatches += (size_t)out[i].payload_mismatch;
        hits++;
    }
    return hits;
}

/* Claims in Redis the m messages the cache did not know (out[i].cached == 0), packing them and
 * their fingerprints to the front, and puts their results back in place. */
static int near_claim_misses(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                             size_t m, wxg_guard_claim_t *out, unsigned char (*fps)[32],
                             wxg__guard_claim_fn claim_redis)
{
    int rc = 0;
    wxg_guard_msg_t *sub = malloc(m * sizeof *sub);
    wxg_guard_claim_t *subout = calloc(m, sizeof *subout);
    size_t *idx = malloc(m * sizeof *idx);
    if (!sub || !subout || !idx) {
        rc = WXG_ENOMEM;
        goto out;
    }
    for (size_t i = 0, k = 0; i < n; i++) {
        if (!out[i].cached) {
            sub[k] = msgs[i];
            /* The misses' fingerprints, packed to the front in the same order. */
            if (k != i)
                memcpy(fps[k], fps[i], sizeof fps[k]);
            idx[k++] = i;
        }
    }
    rc = claim_redis(rg, sub, m, subout, (const unsigned char(*)[32])fps);
    if (rc)
        goto out;
    for (size_t k = 0; k < m; k++)
        out[idx[k]] = subout[k]; /* takes over what the result owns */
out:
    free(sub);
    free(subout);
    free(idx);
    return rc;
}

/* Answers from the cache what it knows and sends only the rest to Redis (none: no call). */
int wxg__guard_near_claim(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                          wxg_guard_claim_t *out, wxg__guard_claim_fn claim_redis)
{
    size_t mismatches = 0;
    unsigned char(*fps)[32] = calloc(n, sizeof *fps);
    if (!fps)
        return WXG_ENOMEM;
    int rc = 0;
    long hits = near_lookup(rg, msgs, n, out, fps, &mismatches);
    if (hits < 0) {
        rc = (int)hits;
    } else if (hits == 0) {
        rc = claim_redis(rg, msgs, n, out, (const unsigned char(*)[32])fps);
    } else {
        if ((size_t)hits < n)
            rc = near_claim_misses(rg, msgs, n, n - (size_t)hits, out, fps, claim_redis);
        if (rc == 0) {
            rg->stats->duplicates += (uint64_t)hits;
            rg->stats->local_duplicates += (uint64_t)hits;
            rg->stats->payload_mismatches += mismatches;
        }
    }
    free(fps);
    return rc;
}

/* Remembers the messages whose DONE marker this call wrote (result OK), until sent_ms + the
 * retention. The server wrote each marker after sent_ms, and a marker is a duplicate for at
 * least the retention after it was written, so the cache never says DUPLICATE where Redis
 * would not. ALREADY_DONE is not remembered: the marker was written at an unknown earlier time
 * and may expire at any moment. */
void wxg__guard_near_remember(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                              const int *results, const unsigned char (*fps)[32], int64_t sent_ms)
{
    int64_t now = wxg__mono_ms();
    int64_t expires = sent_ms + rg->geom.retention_ms;
    for (size_t i = 0; i < n; i++) {
        unsigned char nfp[WXG__DONECACHE_FP_LEN];
        if (results[i] != WXG_GUARD_OK || !t[i].payload_tag_set)
            continue;
        near_fp(rg, fps[i], nfp);
        wxg__donecache_insert(rg->conf.done_cache, nfp, t[i].payload_tag, expires, now);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Script transitions (guard_conn_int.h): every transition as one script call per chunk
 */

/* Fills item i of a transition batch: its names and its per-message arguments. */
typedef int (*fill_fn)(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, size_t i, const void *ctx);

/* Builds and runs a batch of n messages for `script` (writes: WAIT after it when configured):
 * fills each item, sets the time window, the header arguments hdr[0..nhdr), and runs it,
 * rebuilt once when a script refused the window (the clock was sampled again meanwhile). On
 * success the caller reads b's replies and frees b; on failure b is freed. */
static int script_run(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int script, size_t n,
                      int nargs, fill_fn fill, const void *ctx, const long long *hdr, int nhdr,
                      int writes)
{
    int rc = 0;
    for (int round = 0; round < 2; round++) {
        rc = wxg__guard_batch_init(b, script, n, nargs);
        for (size_t i = 0; i < n && rc == 0; i++)
            rc = fill(rg, b, i, ctx);
        if (rc == 0)
            rc = wxg__guard_batch_window(rg, b);
        for (int h = 0; h < nhdr && rc == 0; h++)
            wxg__guard_batch_hdr_num(b, hdr[h]);
        if (rc == 0)
            rc = wxg__guard_batch_build(rg, b);
        if (rc == 0)
            rc = wxg__guard_batch_run(rg, b, writes, 1);
        if (rc != WXG__GUARD_SKEW)
            break;
        wxg__guard_batch_free(b);
    }
    if (rc == WXG__GUARD_SKEW) {
        rc = WXG_EREDIS;
        wxg__guard_set_error(rg->handle, "the server's clock moved twice under one call");
        wxg__guard_count_error(rg->stats, rc);
    }
    if (rc)
        wxg__guard_batch_free(b);
    return rc;
}

/* Counts the per-message results of a ticket transition. */
static void count_results(wxg__guard_redis_t *rg, const int *results, size_t n,
                          uint64_t *ok_counter)
{
    for (size_t i = 0; i < n; i++) {
        if (results[i] == WXG_GUARD_OK)
            (*ok_counter)++;
        else if (results[i] == WXG_GUARD_LEASE_LOST)
            rg->stats->lease_lost++;
        else if (results[i] == WXG_GUARD_ALREADY_DONE)
            rg->stats->already_done++;
    }
}

/* A ticket transition's batch through `fill`, its results in results[] and counted. */
static int ticket_transition(wxg__guard_redis_t *rg, int script, size_t n, int nargs, fill_fn fill,
                             const void *ctx, const long long *hdr, int nhdr, int *results,
                             uint64_t *ok_counter)
{
    wxg__guard_batch_t b;
    int rc = script_run(rg, &b, script, n, nargs, fill, ctx, hdr, nhdr, 1);
    if (rc)
        return rc;
    rc = batch_results(rg, &b, results);
    if (rc == 0)
        count_results(rg, results, n, ok_counter);
    wxg__guard_batch_free(&b);
    return rc;
}

/* The names of the ticket's message and its 'owner|fence'. */
static int ticket_item(wxg__guard_redis_t *rg, wxg__guard_item_t *it, const wxg_guard_ticket_t *t)
{
    int rc = wxg__guard_item_keys(rg, it, t->key, t->key_len,
                                  t->fingerprint_set ? t->fingerprint : NULL);
    return rc ? rc : wxg__guard_item_who(it, t);
}

static void item_arg(wxg__guard_item_t *it, int i, const void *p, size_t len)
{
    it->arg[i] = len ? p : "";
    it->len[i] = len;
}

/* claim (lib/guard/lua/claim.lua) */

typedef struct claim_ctx {
    const wxg_guard_msg_t *msgs;
    const unsigned char (*fps)[32];
    const char (*owners)[WXG_GUARD_OWNER_LEN + 1]; /* NULL: fresh tokens (in the items) */
    const char *const *mine;                       /* NULL: none */
    const unsigned char *rnd;                      /* 16 random bytes per message */
} claim_ctx;

static int fill_claim(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, size_t i, const void *ctx)
{
    const claim_ctx *c = ctx;
    wxg__guard_item_t *it = &b->items[i];
    int rc =
        wxg__guard_item_keys(rg, it, c->msgs[i].key, c->msgs[i].key_len, c->fps ? c->fps[i] : NULL);
    if (rc)
        return rc;
    if (c->owners)
        memcpy(it->owner, c->owners[i], WXG_GUARD_OWNER_LEN + 1);
    else
        wxg__to_hex(c->rnd + 16 * i, 16, it->owner);
    int tl =
        snprintf(it->tag, sizeof it->tag, "%d", wxg__guard_payload_tag(c->msgs[i].payload_hash));
    item_arg(it, 0, it->k.field, it->k.field_len);
    item_arg(it, 1, it->owner, WXG_GUARD_OWNER_LEN);
    item_arg(it, 2, it->tag, (size_t)tl);
    item_arg(it, 3, c->msgs[i].key, c->msgs[i].key_len);
    const char *mine = c->mine ? c->mine[i] : NULL;
    item_arg(it, 4, mine ? mine : "", mine ? strlen(mine) : 0);
    return 0;
}

/* Fills out[] from the claim replies, with the tickets of the CLAIMED ones, and counts them. */
static int claim_results(wxg__guard_redis_t *rg, const wxg__guard_batch_t *b,
                         const wxg_guard_msg_t *msgs, wxg_guard_claim_t *out)
{
    for (size_t c = 0; c < b->nchunks; c++) {
        for (size_t j = 0; j < b->chunks[c].count; j++) {
            size_t idx = b->order[b->chunks[c].first + j];
            wxg_guard_claim_t *o = &out[idx];
            int rc = wxg__guard_parse_claim(wxg__guard_batch_elem(b, c, j), o);
            if (rc) {
                wxg__guard_set_error(rg->handle, "unexpected claim reply");
                rg->stats->redis_errors++;
                return rc;
            }
            switch (o->outcome) {
            case WXG_GUARD_CLAIMED:
                o->ticket.key = msgs[idx].key;
                o->ticket.key_len = msgs[idx].key_len;
                /* A claim answered as one integer holds an in-flight value, whose owner token
                 * its fence gives; a re-claim holds a record with the token sent. */
                if (wxg__guard_batch_elem(b, c, j)->type == REDIS_REPLY_INTEGER)
                    rc = wxg__guard_inflight_owner(o->ticket.fence, o->ticket.owner);
                else
                    memcpy(o->ticket.owner, b->items[idx].owner, WXG_GUARD_OWNER_LEN + 1);
                if (rc)
                    return rc;
                memcpy(o->ticket.fingerprint, b->items[idx].fp, 32);
                o->ticket.fingerprint_set = 1;
                rg->stats->claimed++;
                break;
            case WXG_GUARD_DUPLICATE:
                rg->stats->duplicates++;
                if (o->payload_mismatch)
                    rg->stats->payload_mismatches++;
                break;
            case WXG_GUARD_BUSY:
                rg->stats->busy++;
                rg->stats->unreadable += (uint64_t)o->unreadable;
                break;
            }
        }
    }
    return 0;
}

int wxg__guard_script_claim(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                            wxg_guard_claim_t *out, const unsigned char (*fps)[32],
                            const char (*owners)[WXG_GUARD_OWNER_LEN + 1], const char *const *mine)
{
    unsigned char *rnd = NULL;
    int rc = 0;
    if (!owners) {
        rnd = malloc(n * 16);
        if (!rnd)
            return WXG_ENOMEM;
        rc = wxg__guard_fill_random(rnd, n * 16);
    }
    claim_ctx ctx = {msgs, fps, owners, mine, rnd};
    long long hdr[2] = {rg->conf.lease_ms, rg->conf.inflight_ttl_ms};
    wxg__guard_batch_t b;
    if (rc == 0)
        rc = script_run(rg, &b, WXG__S_CLAIM, n, 5, fill_claim, &ctx, hdr, 2, 1);
    if (rc == 0) {
        rc = claim_results(rg, &b, msgs, out);
        wxg__guard_batch_free(&b);
    }
    if (rc) {
        for (size_t i = 0; i < n; i++)
            wxg_guard_claim_clear(&out[i]);
    }
    free(rnd);
    return rc;
}

/* complete (lib/guard/lua/complete.lua) */

typedef struct ticket_ctx {
    const wxg_guard_ticket_t *t;
    unsigned char (*fps)[32]; /* may be NULL */
} ticket_ctx;

static int fill_complete(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, size_t i, const void *ctx)
{
    const ticket_ctx *c = ctx;
    wxg__guard_item_t *it = &b->items[i];
    const wxg_guard_ticket_t *t = &c->t[i];
    int rc = ticket_item(rg, it, t);
    if (rc)
        return rc;
    if (c->fps)
        memcpy(c->fps[i], it->fp, sizeof c->fps[i]);
    int tl = t->payload_tag_set ? snprintf(it->tag, sizeof it->tag, "%d", t->payload_tag) : 0;
    item_arg(it, 0, it->k.field, it->k.field_len);
    item_arg(it, 1, t->owner, WXG_GUARD_OWNER_LEN);
    item_arg(it, 2, it->fence, strlen(it->fence));
    item_arg(it, 3, it->tag, (size_t)tl);
    return 0;
}

int wxg__guard_script_complete(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                               int *results, unsigned char (*fps)[32])
{
    ticket_ctx ctx = {t, fps};
    return ticket_transition(rg, WXG__S_COMPLETE, n, 4, fill_complete, &ctx, NULL, 0, results,
                             &rg->stats->completed);
}

/* renew (lib/guard/lua/renew.lua) */

static int fill_renew(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, size_t i, const void *ctx)
{
    const wxg_guard_ticket_t *t = &((const wxg_guard_ticket_t *)ctx)[i];
    wxg__guard_item_t *it = &b->items[i];
    int rc = ticket_item(rg, it, t);
    if (rc)
        return rc;
    item_arg(it, 0, it->k.field, it->k.field_len);
    item_arg(it, 1, it->who, strlen(it->who));
    item_arg(it, 2, t->key, t->key_len);
    return 0;
}

int wxg__guard_script_renew(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                            int *results)
{
    long long hdr[2] = {rg->conf.lease_ms, rg->conf.inflight_ttl_ms};
    return ticket_transition(rg, WXG__S_RENEW, n, 3, fill_renew, t, hdr, 2, results,
                             &rg->stats->renewed);
}

/* plugin_done (lib/guard/lua/plugin_done.lua) */

static int fill_plugin_done(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, size_t i,
                            const void *ctx)
{
    const wxg_guard_plugin_done_t *d = &((const wxg_guard_plugin_done_t *)ctx)[i];
    wxg__guard_item_t *it = &b->items[i];
    int rc = ticket_item(rg, it, d->ticket);
    if (rc)
        return rc;
    item_arg(it, 0, it->k.field, it->k.field_len);
    item_arg(it, 1, it->who, strlen(it->who));
    item_arg(it, 2, d->plugin, strlen(d->plugin));
    item_arg(it, 3, d->result, d->result_len);
    return 0;
}

int wxg__guard_script_plugin_done(wxg__guard_redis_t *rg, const wxg_guard_plugin_done_t *items,
                                  size_t n, int *results)
{
    long long hdr[1] = {rg->conf.inflight_ttl_ms};
    return ticket_transition(rg, WXG__S_PLUGIN_DONE, n, 4, fill_plugin_done, items, hdr, 1, results,
                             &rg->stats->plugins_done);
}

/* fail (lib/guard/lua/fail.lua) */

static int fill_fail(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, size_t i, const void *ctx)
{
    const wxg_guard_failure_t *f = &((const wxg_guard_failure_t *)ctx)[i];
    wxg__guard_item_t *it = &b->items[i];
    const wxg_guard_ticket_t *t = f->ticket;
    int rc = ticket_item(rg, it, t);
    if (rc)
        return rc;
    const char *reason = f->reason ? f->reason : "";
    size_t rl = strlen(reason);
    int tl = snprintf(it->tag, sizeof it->tag, "%d", t->payload_tag_set ? t->payload_tag : 0);
    int xl = snprintf(it->extra, sizeof it->extra, "%u", (unsigned)f->attempts);
    item_arg(it, 0, it->k.field, it->k.field_len);
    item_arg(it, 1, it->who, strlen(it->who));
    item_arg(it, 2, it->tag, (size_t)tl);
    item_arg(it, 3, t->key, t->key_len);
    item_arg(it, 4, reason, rl > WXG_GUARD_REASON_MAX ? WXG_GUARD_REASON_MAX : rl);
    item_arg(it, 5, it->extra, (size_t)xl);
    return 0;
}

int wxg__guard_script_fail(wxg__guard_redis_t *rg, const wxg_guard_failure_t *items, size_t n,
                           int *results)
{
    long long hdr[1] = {rg->conf.failed_retention_ms};
    return ticket_transition(rg, WXG__S_FAIL, n, 6, fill_fail, items, hdr, 1, results,
                             &rg->stats->failed);
}

/* repair (lib/guard/lua/repair.lua) */

static int fill_repair(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, size_t i, const void *ctx)
{
    const wxg__guard_repair_t *r = &((const wxg__guard_repair_t *)ctx)[i];
    wxg__guard_item_t *it = &b->items[i];
    int rc = ticket_item(rg, it, r->t);
    if (rc)
        return rc;
    int tl = snprintf(it->tag, sizeof it->tag, "%d", r->t->payload_tag);
    item_arg(it, 0, it->k.field, it->k.field_len);
    item_arg(it, 1, r->tb, strlen(r->tb));
    item_arg(it, 2, r->left, strlen(r->left));
    item_arg(it, 3, r->before, strlen(r->before));
    item_arg(it, 4, it->tag, (size_t)tl);
    return 0;
}

int wxg__guard_script_repair(wxg__guard_redis_t *rg, const wxg__guard_repair_t *r, size_t n,
                             int *results)
{
    return ticket_transition(rg, WXG__S_REPAIR, n, 5, fill_repair, r, NULL, 0, results,
                             &rg->stats->completed);
}

/* ---------------------------------------------------------------------------------------------
 * The operations table of the Lua design: every transition a script
 */

static int lua_claim_redis(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                           wxg_guard_claim_t *out, const unsigned char (*fps)[32])
{
    return wxg__guard_script_claim(rg, msgs, n, out, fps, NULL, NULL);
}

static int lua_claim(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n, wxg_guard_claim_t *out)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    if (rg->conf.done_cache)
        return wxg__guard_near_claim(rg, msgs, n, out, lua_claim_redis);
    return lua_claim_redis(rg, msgs, n, out, NULL);
}

static int lua_renew(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    return wxg__guard_script_renew(wxg__guard_impl(g), t, n, results);
}

static int lua_plugin_done(wxg_guard_t *g, const wxg_guard_plugin_done_t *items, size_t n,
                           int *results)
{
    return wxg__guard_script_plugin_done(wxg__guard_impl(g), items, n, results);
}

static int lua_complete(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    /* Taken before the call: the marker is written after this instant (server time), so an
     * expiry counted from here never outlasts it (wxg__guard_near_remember). */
    int64_t sent_ms = wxg__mono_ms();
    unsigned char(*fps)[32] = NULL;
    if (rg->conf.done_cache) {
        fps = malloc(n * sizeof *fps);
        if (!fps)
            return WXG_ENOMEM;
    }
    int rc = wxg__guard_script_complete(rg, t, n, results, fps);
    if (rc == 0 && fps)
        wxg__guard_near_remember(rg, t, n, results, (const unsigned char(*)[32])fps, sent_ms);
    free(fps);
    return rc;
}

static int lua_fail(wxg_guard_t *g, const wxg_guard_failure_t *items, size_t n, int *results)
{
    return wxg__guard_script_fail(wxg__guard_impl(g), items, n, results);
}

static const wxg__guard_ops_t lua_ops = {
    .name = "lua",
    .claim_batch = lua_claim,
    .renew_batch = lua_renew,
    .plugin_done_batch = lua_plugin_done,
    .complete_batch = lua_complete,
    .fail_batch = lua_fail,
    WXG__GUARD_REDIS_OPS,
};

wxg_guard_t *wxg__guard_lua_new(const wxg_guard_conf_t *conf, int *err, char *errstr,
                                size_t errstr_size)
{
    return wxg__guard_redis_new(conf, &lua_ops, err, errstr, errstr_size);
}
