/*
 * DESIGN: the guard's pipelined script calls -- replies and the batch runner.
 *
 * Purpose: everything that turns a batch of messages into EVALSHA calls on layout v4 and back
 * (guard_conn_int.h, "Pipelined script calls"): the per-message answers of the scripts
 * (lib/guard/lua/), a batch's items and its time window (the buckets each message declares, from
 * the handle's estimate of the server's clock, lib/guard/guard_conn.c), its chunks (one shard per
 * chunk in cluster mode), and the runner that sends every chunk of an API call in one round trip.
 * The scripted transitions (lib/guard/guard_transitions.c) and the admin tool
 * (lib/guard/guard_admin.c) are built on it.
 *
 * Layout v4 (lib/guard/guard_record.def): every script declares every key it may touch (the
 * buckets of the message's time window, its record, its sub-marker hash), so that Redis Cluster
 * routes and migrates them correctly (docs/guard.md §2). A script whose window does not cover the
 * server's time refuses the call (WXGSKEW); the caller samples the clock again and rebuilds the
 * call once.
 *
 * Threads: the handle's thread only; no locks.
 *
 * Failure modes. NOSCRIPT (script cache flushed, restart, failover) reloads the scripts and
 * re-sends only the refused calls, which is safe because NOSCRIPT proves they did not run. A
 * WXGSKEW refusal proves the same. Any other failure leaves the outcome unknown and is reported
 * to the caller, never retried here. A reply of the wrong shape is WXG_EREDIS for the whole
 * call.
 */
#include "guard_conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
int wxg__guard_batch_results(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int *results)
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
