/*
 * DESIGN: the naive design of the guard (conf.naive, benchmark only).
 *
 * Purpose: the design the benchmarks measure the Lua design against, behind the same API, so
 * that `wxguard-bench e2e --naive` can run the real consumer pipeline on it: one round trip per
 * message and step, one key per DONE marker. claim is `SET <prefix>n:<sha256> <owner> NX GET PX
 * <lease>` (the old value tells DUPLICATE 'D' from BUSY), complete is `SET ... D EX
 * <retention>`, renew is PEXPIRE. There is no batching and no fencing (every fence is 1);
 * plugin_done and fail are not in its operations table, so they fail with WXG_ESTATE. It
 * shares the connection (lib/guard/guard_conn.c) and the admin operations (lib/guard/guard_admin.c)
 * with the Lua design, and nothing else; the admin operations do not see its keys.
 *
 * Threads: the handle's thread only; no locks. Failure modes: those of the connection; an error
 * reply to any command is WXG_EREDIS for the whole call, and the messages before it in the
 * batch have already changed (each is its own round trip).
 */
#include "guard_conn_int.h"

#include <stdio.h>
#include <string.h>

#include "key_int.h"

#define NAIVE_KEY_MAX (64 + 3 + 64 + 1)

static void naive_key(const wxg__guard_redis_t *rg, const char *key, size_t key_len,
                      char out[NAIVE_KEY_MAX])
{
    unsigned char fp[32];
    char hex[65];
    wxg__guard_fingerprint(key, key_len, fp);
    wxg__to_hex(fp, 32, hex);
    snprintf(out, NAIVE_KEY_MAX, "%sn:%s", rg->prefix, hex);
}

/* One command, one round trip. The reply is the caller's to free. */
static int naive_cmd(wxg__guard_redis_t *rg, int argc, const char **argv, const size_t *lens,
                     redisReply **out)
{
    int rc = wxg__guard_conn_ensure(rg);
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    wxg__guard_cmd_t cmd = {argc, argv, lens};
    redisReply *r = NULL;
    rc = wxg__guard_conn_pipeline(rg, &cmd, 1, 0, &r, NULL);
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        wxg__guard_set_error(rg->handle, "%s: %.*s", argv[0], (int)r->len, r->str);
        freeReplyObject(r);
        wxg__guard_count_error(rg->stats, WXG_EREDIS);
        return WXG_EREDIS;
    }
    *out = r;
    return 0;
}

static int naive_claim(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n,
                       wxg_guard_claim_t *out)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    char lease[24];
    snprintf(lease, sizeof lease, "%lld", (long long)rg->conf.lease_ms);
    for (size_t i = 0; i < n; i++) {
        char key[NAIVE_KEY_MAX];
        unsigned char rnd[16];
        char owner[WXG_GUARD_OWNER_LEN + 1];
        naive_key(rg, msgs[i].key, msgs[i].key_len, key);
        int rc = wxg__guard_fill_random(rnd, sizeof rnd);
        if (rc)
            return rc;
        wxg__to_hex(rnd, sizeof rnd, owner);
        const char *argv[7] = {"SET", key, owner, "NX", "GET", "PX", lease};
        size_t lens[7] = {3, strlen(key), WXG_GUARD_OWNER_LEN, 2, 3, 2, strlen(lease)};
        redisReply *r = NULL;
        rc = naive_cmd(rg, 7, argv, lens, &r);
        if (rc)
            return rc;
        wxg_guard_claim_t *o = &out[i];
        if (r->type == REDIS_REPLY_NIL) {
            o->outcome = WXG_GUARD_CLAIMED;
            o->attempt = 1;
            o->ticket.key = msgs[i].key;
            o->ticket.key_len = msgs[i].key_len;
            o->ticket.fence = 1;
            memcpy(o->ticket.owner, owner, sizeof owner);
            rg->stats->claimed++;
        } else if (r->type == REDIS_REPLY_STRING && r->len == 1 && r->str[0] == 'D') {
            o->outcome = WXG_GUARD_DUPLICATE;
            rg->stats->duplicates++;
        } else {
            /* Another owner holds it; its lease is at most a whole lease long. */
            o->outcome = WXG_GUARD_BUSY;
            o->lease_ms_left = rg->conf.lease_ms;
            rg->stats->busy++;
        }
        freeReplyObject(r);
    }
    return 0;
}

static int naive_complete(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    char ex[24];
    snprintf(ex, sizeof ex, "%lld", (long long)(rg->conf.done_retention_ms / 1000));
    for (size_t i = 0; i < n; i++) {
        char key[NAIVE_KEY_MAX];
        naive_key(rg, t[i].key, t[i].key_len, key);
        const char *argv[5] = {"SET", key, "D", "EX", ex};
        size_t lens[5] = {3, strlen(key), 1, 2, strlen(ex)};
        redisReply *r = NULL;
        int rc = naive_cmd(rg, 5, argv, lens, &r);
        if (rc)
            return rc;
        freeReplyObject(r);
        results[i] = WXG_GUARD_OK;
        rg->stats->completed++;
    }
    return 0;
}

static int naive_renew(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    char lease[24];
    snprintf(lease, sizeof lease, "%lld", (long long)rg->conf.lease_ms);
    for (size_t i = 0; i < n; i++) {
        char key[NAIVE_KEY_MAX];
        naive_key(rg, t[i].key, t[i].key_len, key);
        const char *argv[3] = {"PEXPIRE", key, lease};
        size_t lens[3] = {7, strlen(key), strlen(lease)};
        redisReply *r = NULL;
        int rc = naive_cmd(rg, 3, argv, lens, &r);
        if (rc)
            return rc;
        results[i] =
            r->type == REDIS_REPLY_INTEGER && r->integer == 1 ? WXG_GUARD_OK : WXG_GUARD_LEASE_LOST;
        freeReplyObject(r);
        if (results[i] == WXG_GUARD_OK)
            rg->stats->renewed++;
    }
    return 0;
}

/* plugin_done and fail stay NULL: the public functions refuse them with WXG_ESTATE. */
static const wxg__guard_ops_t naive_ops = {
    .name = "naive",
    .claim_batch = naive_claim,
    .renew_batch = naive_renew,
    .complete_batch = naive_complete,
    WXG__GUARD_REDIS_OPS,
};

wxg_guard_t *wxg__guard_naive_new(const wxg_guard_conf_t *conf, int *err, char *errstr,
                                  size_t errstr_size)
{
    wxg__guard_redis_t *rg = NULL;
    int rc = wxg__guard_redis_init(conf, &rg, errstr, errstr_size);
    if (rc) {
        if (err)
            *err = rc;
        return NULL;
    }
    return wxg__guard_redis_attach(rg, &naive_ops, err, errstr, errstr_size);
}
