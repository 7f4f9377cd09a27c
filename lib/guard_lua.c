/*
 * DESIGN: the Lua design of the guard -- the real one.
 *
 * Purpose: the per-message state machine of docs/guard.md §1 on Redis, each transition one Lua
 * script (lib/lua/) that checks and changes the state atomically for a whole batch of messages:
 * claim, renew, plugin_done, complete, fail. This file builds those batches (the pipelined
 * script-call runner that lib/guard_admin.c uses too), packs each message's arguments, reads the
 * per-message answers, and keeps the near cache in front of claim and behind complete.
 *
 * A message in flight (PROCESSING or FAILED) has one string record (state, owner, fence,
 * payload tag, attempt, absolute expiry, lease, idempotency key, finished plugins;
 * lib/guard_record.def), so that the common transitions are single SET / GETDEL calls. On
 * complete the record is taken out and the message becomes a compact DONE marker
 * (lib/guard_layout.c). Redis CPU per message is counted in redis.call()s and in the Lua
 * strings a script makes, so the layout needs few calls and claim and complete send one packed
 * argument per message: docs/guard.md §9.
 *
 * Threads: the handle's thread only; no locks. The near cache (lib/donecache.c) is shared by
 * the handles of a process and locks itself.
 *
 * Failure modes. NOSCRIPT (script cache flushed, restart, failover) reloads the scripts and
 * re-sends only the refused calls, which is safe because NOSCRIPT proves they did not run. Any
 * other failure leaves the outcome unknown and is reported to the caller, never retried here.
 * A reply of the wrong shape is WXG_EREDIS for the whole call.
 *
 * Near cache (conf.done_cache, docs/guard.md §10): claim first answers DUPLICATE for what the
 * cache knows and sends only the rest to Redis; complete remembers the messages whose DONE
 * marker it wrote. The cache only ever holds a message for less than its marker's lifetime in
 * Redis, so it changes the cost of a duplicate, never its answer. Both hooks sit outside the
 * Redis paths (claim_redis, complete_redis).
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
        /* The common answers come as one integer (lib/lua/claim.lua): converting a nested reply
         * costs Redis more than the claim's own commands. */
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
        if (r->elements != 2 || reply_int(r->element[1], &a) || a < 0)
            return WXG_EREDIS;
        out->outcome = WXG_GUARD_BUSY;
        out->lease_ms_left = a;
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
    free(b->blobs);
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

/* Splits the items into chunks and builds each chunk's argv. */
/* Fills chunk c's EVALSHA argv: the sha slot, the declared keys, the header arguments, then
 * each message's arguments. */
static int chunk_argv(const wxg__guard_batch_t *b, wxg__guard_chunk_t *c)
{
    /* A packed chunk declares only its first record: every key a script touches is in that
     * record's slot (one shard per chunk in cluster mode), and each argument Redis converts
     * for a script costs about as much CPU as a command, so one argument per message halves
     * what a claim or a complete costs Redis outside its commands. */
    int nkeys = b->packed ? 1 : (int)c->count;
    int per = b->packed ? 1 : b->nargs;
    c->argc = 3 + nkeys + b->nhdr + (int)c->count * per;
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
    for (size_t j = 0; j < (size_t)nkeys; j++) {
        const wxg__guard_item_t *it = &b->items[b->order[c->first + j]];
        c->argv[a] = it->k.record;
        c->lens[a++] = it->k.record_len;
    }
    for (int h = 0; h < b->nhdr; h++) {
        c->argv[a] = b->hdr[h];
        c->lens[a++] = b->hdrlen[h];
    }
    for (size_t j = 0; j < c->count; j++) {
        const wxg__guard_item_t *it = &b->items[b->order[c->first + j]];
        if (b->packed) {
            c->argv[a] = it->blob;
            c->lens[a++] = it->blob_len;
            continue;
        }
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

/* Runs a built batch (per_message: each reply must be an array with one element per message):
 * at most two rounds (the second only for chunks refused with NOSCRIPT after
 * reloading the scripts). On success every chunk has a non-error reply. */
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
 * drops the connection); per_message replies must have one element per message. */
static int check_replies(wxg__guard_redis_t *rg, const wxg__guard_batch_t *b, int per_message)
{
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

/* Packed arguments: lengths first (one byte each, so names stay below 256 bytes: the prefix is
 * at most WXG_GUARD_PREFIX_MAX), then the names a script needs for every message. The length
 * bytes are lib/guard_record.def's WXG__ARG_LEN: a claim has all of them, a complete the first
 * three. */
#define BLOB_NAMES_MAX    (3 * WXG__KEY_MAX + WXG__FIELD_BYTES_MAX)
#define CLAIM_BLOB_FIXED  (WXG__L_COUNT + BLOB_NAMES_MAX + 5 + WXG_GUARD_OWNER_LEN + 8 + 24)
#define COMPLETE_BLOB_LEN (WXG__L_FIELD + 1)
#define COMPLETE_BLOB_MAX (COMPLETE_BLOB_LEN + BLOB_NAMES_MAX + 64)
_Static_assert(WXG__KEY_MAX < 256 && WXG__FIELD_BYTES_MAX < 256, "lengths travel as one byte");
/* The scripts read the length bytes with one string.byte call each, in this order. */
_Static_assert(WXG__L_STEM == 0 && WXG__L_RECORD == 1 && WXG__L_FIELD == 2 && WXG__L_TAG == 3 &&
                   WXG__L_COUNT == 4,
               "claim.lua and complete.lua read stem, record, field, tag lengths in this order");
/* What the client writes of a record (ticket_items, claim_pack) relies on the field order. */
_Static_assert(WXG__F_ST == 0 && WXG__F_OWNER == 1 && WXG__F_FENCE == 2,
               "the ownership prefix 'P|owner|fence|' is the record's first three fields");
_Static_assert(WXG__F_TAG == 3, "a new record's head 'P|owner|1|tag' is its first four fields");
_Static_assert(WXG__F_KLEN == WXG__F_COUNT - 1,
               "the client's 'klen|key' closes a new record's fields");
_Static_assert(WXG__REC_OWNER_LEN == WXG_GUARD_OWNER_LEN, "the scripts' OWNER_LEN");

/* Writes the length bytes of stem, record and field (the caller writes the others), then the
 * three names after the nlen length bytes; returns the end. */
static char *blob_names(char *out, const wxg__guard_keys_t *k, int nlen)
{
    out[WXG__L_STEM] = (char)k->stem_len;
    out[WXG__L_RECORD] = (char)k->record_len;
    out[WXG__L_FIELD] = (char)k->field_len;
    char *p = out + nlen;
    memcpy(p, k->stem, k->stem_len);
    p += k->stem_len;
    memcpy(p, k->record, k->record_len);
    p += k->record_len;
    memcpy(p, k->field, k->field_len);
    return p + k->field_len;
}

/* Common set-up of a transition batch on tickets: names and the ownership argument. */
static int ticket_items(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, size_t i,
                        const wxg_guard_ticket_t *t)
{
    wxg__guard_item_t *it = &b->items[i];
    int rc = wxg__guard_item_keys(rg, it, t->key, t->key_len,
                                  t->fingerprint_set ? t->fingerprint : NULL);
    if (rc)
        return rc;
    /* The scripts compare this with the start of the record: its fields ST, OWNER and FENCE
     * (lib/guard_record.def) in one string comparison. Written by hand, as the names are. */
    char fence[20];
    size_t fl = wxg__put_dec(fence, t->fence);
    size_t n = 2 + WXG_GUARD_OWNER_LEN + 1 + fl + 1;
    if (n >= sizeof it->pfx)
        return WXG_EINVAL;
    char *p = it->pfx;
    memcpy(p, "P|", 2);
    memcpy(p + 2, t->owner, WXG_GUARD_OWNER_LEN);
    p += 2 + WXG_GUARD_OWNER_LEN;
    *p++ = '|';
    memcpy(p, fence, fl);
    p += fl;
    *p++ = '|';
    *p = '\0';
    it->arg[0] = it->pfx;
    it->len[0] = n;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Near cache (conf.done_cache; docs/guard.md §10)
 *
 * Kept apart from the Redis paths on purpose: claim filters the messages the cache knows before
 * the Redis path sees the rest, and complete remembers what it wrote after the Redis path
 * returned, so neither depends on how a script call is packed or answered.
 */

static int claim_redis(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                       wxg_guard_claim_t *out, const unsigned char (*fps)[32]);

/* The cache key of `key`: the first 16 bytes of its fingerprint, mixed with this handle's
 * server/database/prefix identity so that handles of different deployments never see each
 * other's entries in a shared cache. */
static void near_fp(const wxg__guard_redis_t *rg, const unsigned char fp[32],
                    unsigned char out[WXG__DONECACHE_FP_LEN])
{
    for (size_t i = 0; i < WXG__DONECACHE_FP_LEN; i++)
        out[i] = fp[i] ^ rg->cache_ns[i];
}

static int near_ns(wxg__guard_redis_t *rg)
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
    int64_t now = wxg__guard_mono_ms();
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
                             size_t m, wxg_guard_claim_t *out, unsigned char (*fps)[32])
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
static int near_claim(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                      wxg_guard_claim_t *out)
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
            rc = near_claim_misses(rg, msgs, n, n - (size_t)hits, out, fps);
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
static void near_remember(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                          const int *results, const unsigned char (*fps)[32], int64_t sent_ms)
{
    int64_t now = wxg__guard_mono_ms();
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
 * Transitions
 */

/* Packs each message's one claim argument into b->blobs (lib/lua/claim.lua): the length bytes,
 * then the bucket stem, the record name, the marker field, the head of a new record
 * 'P|owner|1|tag' (its fields ST .. TAG, lib/guard_record.def), and the idempotency key as
 * 'klen|key' (KLEN and the key), which the script copies into a new record unchanged. Owners
 * are fresh random tokens. */
static int claim_pack(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, const wxg_guard_msg_t *msgs,
                      const unsigned char (*fps)[32])
{
    size_t n = b->n, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].key_len > SIZE_MAX / 2 - bytes - CLAIM_BLOB_FIXED)
            return WXG_EINVAL;
        bytes += msgs[i].key_len + CLAIM_BLOB_FIXED;
    }
    b->blobs = malloc(bytes);
    unsigned char *rnd = malloc(n * 16);
    int rc = 0;
    if (!rnd || !b->blobs) {
        rc = WXG_ENOMEM;
        goto out;
    }
    rc = wxg__guard_fill_random(rnd, n * 16);
    char *kp = b->blobs;
    for (size_t i = 0; i < n && rc == 0; i++) {
        wxg__guard_item_t *it = &b->items[i];
        rc = wxg__guard_item_keys(rg, it, msgs[i].key, msgs[i].key_len, fps ? fps[i] : NULL);
        if (rc)
            break;
        wxg__to_hex(rnd + 16 * i, 16, it->owner);
        int tl =
            snprintf(it->tag, sizeof it->tag, "%d", wxg__guard_payload_tag(msgs[i].payload_hash));
        char *p = blob_names(kp, &it->k, WXG__L_COUNT);
        kp[WXG__L_TAG] = (char)tl;
        memcpy(p, "P|", 2);
        memcpy(p + 2, it->owner, WXG_GUARD_OWNER_LEN);
        memcpy(p + 2 + WXG_GUARD_OWNER_LEN, "|1|", 3);
        memcpy(p + 5 + WXG_GUARD_OWNER_LEN, it->tag, (size_t)tl);
        p += 5 + WXG_GUARD_OWNER_LEN + tl;
        int kl = snprintf(p, 24, "%zu|", msgs[i].key_len);
        memcpy(p + kl, msgs[i].key, msgs[i].key_len);
        p += kl + msgs[i].key_len;
        it->blob = kp;
        it->blob_len = (size_t)(p - kp);
        kp = p;
    }
out:
    free(rnd);
    return rc;
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
                memcpy(o->ticket.owner, b->items[idx].owner, WXG_GUARD_OWNER_LEN + 1);
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
                break;
            }
        }
    }
    return 0;
}

/* The Redis path of a claim. fps: the keys' fingerprints when the near cache computed them,
 * else NULL. On failure out[] is cleared. */
static int claim_redis(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                       wxg_guard_claim_t *out, const unsigned char (*fps)[32])
{
    wxg__guard_batch_t b;
    int rc = wxg__guard_batch_init(&b, WXG__S_CLAIM, n, 0);
    if (rc)
        return rc;
    b.packed = 1;
    wxg__guard_batch_hdr_num(&b, rg->conf.lease_ms);
    wxg__guard_batch_hdr_num(&b, rg->conf.inflight_ttl_ms);
    wxg__guard_batch_hdr_num(&b, rg->geom.retention_ms);
    wxg__guard_batch_hdr_num(&b, rg->geom.bucket_ms);
    rc = claim_pack(rg, &b, msgs, fps);
    if (rc == 0)
        rc = wxg__guard_batch_build(rg, &b);
    if (rc == 0)
        rc = wxg__guard_batch_run(rg, &b, 1, 1);
    if (rc == 0)
        rc = claim_results(rg, &b, msgs, out);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            wxg_guard_claim_clear(&out[i]);
    }
    wxg__guard_batch_free(&b);
    return rc;
}

/* Runs a ticket transition whose items are already filled; counts per-message results. */
static int run_transition(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int *results,
                          uint64_t *ok_counter)
{
    int rc = wxg__guard_batch_build(rg, b);
    if (rc)
        return rc;
    rc = wxg__guard_batch_run(rg, b, 1, 1);
    if (rc)
        return rc;
    rc = batch_results(rg, b, results);
    if (rc)
        return rc;
    for (size_t i = 0; i < b->n; i++) {
        if (results[i] == WXG_GUARD_OK)
            (*ok_counter)++;
        else if (results[i] == WXG_GUARD_LEASE_LOST)
            rg->stats->lease_lost++;
        else if (results[i] == WXG_GUARD_ALREADY_DONE)
            rg->stats->already_done++;
    }
    return 0;
}

/* The Redis path of a complete. fps (n entries, may be NULL) receives each ticket's key
 * fingerprint, for the near cache. */
static int complete_redis(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                          int *results, unsigned char (*fps)[32])
{
    wxg__guard_batch_t b;
    int rc = wxg__guard_batch_init(&b, WXG__S_COMPLETE, n, 0);
    if (rc)
        return rc;
    /* One argument per message (lib/lua/complete.lua): three length bytes, then the bucket
     * stem, the record name, the marker field and the ownership prefix 'P|owner|fence|'. */
    b.packed = 1;
    b.blobs = malloc(n * COMPLETE_BLOB_MAX);
    if (!b.blobs)
        rc = WXG_ENOMEM;
    wxg__guard_batch_hdr_num(&b, rg->geom.retention_ms);
    wxg__guard_batch_hdr_num(&b, rg->geom.bucket_ms);
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = ticket_items(rg, &b, i, &t[i]);
        if (rc)
            break;
        wxg__guard_item_t *it = &b.items[i];
        if (fps)
            memcpy(fps[i], it->fp, sizeof fps[i]);
        char *kp = b.blobs + i * COMPLETE_BLOB_MAX;
        char *p = blob_names(kp, &it->k, COMPLETE_BLOB_LEN);
        memcpy(p, it->arg[0], it->len[0]);
        it->blob = kp;
        it->blob_len = (size_t)(p - kp) + it->len[0];
    }
    if (rc == 0)
        rc = run_transition(rg, &b, results, &rg->stats->completed);
    wxg__guard_batch_free(&b);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The operations table of the Lua design
 */

static int lua_claim(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n, wxg_guard_claim_t *out)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    if (rg->conf.done_cache)
        return near_claim(rg, msgs, n, out);
    return claim_redis(rg, msgs, n, out, NULL);
}

static int lua_renew(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    wxg__guard_batch_t b;
    int rc = wxg__guard_batch_init(&b, WXG__S_RENEW, n, 1);
    if (rc)
        return rc;
    wxg__guard_batch_hdr_num(&b, rg->conf.lease_ms);
    wxg__guard_batch_hdr_num(&b, rg->conf.inflight_ttl_ms);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = ticket_items(rg, &b, i, &t[i]);
    if (rc == 0)
        rc = run_transition(rg, &b, results, &rg->stats->renewed);
    wxg__guard_batch_free(&b);
    return rc;
}

static int lua_plugin_done(wxg_guard_t *g, const wxg_guard_plugin_done_t *items, size_t n,
                           int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    wxg__guard_batch_t b;
    int rc = wxg__guard_batch_init(&b, WXG__S_PLUGIN_DONE, n, 3);
    if (rc)
        return rc;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = ticket_items(rg, &b, i, items[i].ticket);
        if (rc)
            break;
        b.items[i].arg[1] = items[i].plugin;
        b.items[i].len[1] = strlen(items[i].plugin);
        b.items[i].arg[2] = items[i].result_len ? items[i].result : "";
        b.items[i].len[2] = items[i].result_len;
    }
    if (rc == 0)
        rc = run_transition(rg, &b, results, &rg->stats->plugins_done);
    wxg__guard_batch_free(&b);
    return rc;
}

static int lua_complete(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    /* Taken before the call: the marker is written after this instant (server time), so an
     * expiry counted from here never outlasts it (near_remember). */
    int64_t sent_ms = wxg__guard_mono_ms();
    unsigned char(*fps)[32] = NULL;
    if (rg->conf.done_cache) {
        fps = malloc(n * sizeof *fps);
        if (!fps)
            return WXG_ENOMEM;
    }
    int rc = complete_redis(rg, t, n, results, fps);
    if (rc == 0 && fps)
        near_remember(rg, t, n, results, (const unsigned char(*)[32])fps, sent_ms);
    free(fps);
    return rc;
}

static int lua_fail(wxg_guard_t *g, const wxg_guard_failure_t *items, size_t n, int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    wxg__guard_batch_t b;
    int rc = wxg__guard_batch_init(&b, WXG__S_FAIL, n, 3);
    if (rc)
        return rc;
    wxg__guard_batch_hdr_num(&b, rg->conf.failed_retention_ms);
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = ticket_items(rg, &b, i, items[i].ticket);
        if (rc)
            break;
        wxg__guard_item_t *it = &b.items[i];
        const char *reason = items[i].reason ? items[i].reason : "";
        size_t rl = strlen(reason);
        it->arg[1] = reason;
        it->len[1] = rl > WXG_GUARD_REASON_MAX ? WXG_GUARD_REASON_MAX : rl;
        snprintf(it->extra, sizeof it->extra, "%u", (unsigned)items[i].attempts);
        it->arg[2] = it->extra;
        it->len[2] = strlen(it->extra);
    }
    if (rc == 0)
        rc = run_transition(rg, &b, results, &rg->stats->failed);
    wxg__guard_batch_free(&b);
    return rc;
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
    wxg__guard_redis_t *rg = NULL;
    int rc = wxg__guard_redis_init(conf, &rg, errstr, errstr_size);
    if (rc == 0 && (rc = near_ns(rg)) != 0) {
        wxg__guard_errf(errstr, errstr_size, "out of memory");
        wxg__guard_redis_free(rg);
    }
    if (rc) {
        if (err)
            *err = rc;
        return NULL;
    }
    return wxg__guard_redis_attach(rg, &lua_ops, err, errstr, errstr_size);
}
