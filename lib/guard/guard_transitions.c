/*
 * DESIGN: the guard's scripted transitions on layout v4.
 *
 * Purpose: the per-message state machine of docs/guard.md §1 as Lua scripts (lib/guard/lua/)
 * that check and change a message's state atomically, for a whole batch of messages per script
 * call: claim, renew, plugin_done, complete, fail, and the native complete's repair. Each fills
 * the per-message arguments of a batch (lib/guard/guard_batch.c runs it) and reads and counts
 * the answers. The Lua design (lib/guard/guard_lua.c) runs every transition through them; the
 * native design (lib/guard/guard_native.c, the default) runs the common transitions as native
 * commands and calls these for the rest.
 *
 * Threads: the handle's thread only; no locks. Failure modes: those of the batch runner.
 */
#include "guard_conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "key_int.h"

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
    rc = wxg__guard_batch_results(rg, &b, results);
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
