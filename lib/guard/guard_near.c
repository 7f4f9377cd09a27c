/*
 * DESIGN: the near cache in front of claim and behind complete (conf.done_cache; docs/guard.md
 * §10).
 *
 * Purpose: claim first answers DUPLICATE for what the cache (lib/guard/donecache.c) knows and
 * sends only the rest to the design's Redis path; complete remembers the messages whose DONE
 * marker it wrote. The cache only ever holds a message for less than its marker's lifetime in
 * Redis, so it changes the cost of a duplicate, never its answer. Both Redis designs use it.
 *
 * Threads: the handle's thread; the cache is shared by the handles of a process and locks
 * itself.
 */
#include "guard_conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock_int.h"

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
