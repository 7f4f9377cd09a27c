/*
 * DESIGN: the DONE layout of each time bucket -- compact markers at the rate a deployment has.
 *
 * Purpose: a DONE bucket stays small and dense (about done_bucket_target markers, Redis's compact
 * encoding) only when the number of buckets of a time bucket fits the number of markers it will
 * hold. A rate pinned in the configuration fixes that number once (wxg__guard_geom_t's
 * selector_bits). In the adaptive layout (the default: no rate pinned) every time bucket gets
 * its own selector bits, chosen when it is first used from the markers the time bucket before it
 * holds, and stamped in Redis under <prefix>g:<time bucket> by the first handle that needs it
 * (SET NX: every handle on the prefix then reads the same value). The first time bucket of a
 * prefix, with nothing before it, is sized for WXG__ADAPTIVE_FIRST_RATE. The field width does
 * not change between time buckets (wxg__guard_geom_compute sizes it for every rate the layout
 * may meet), so a message's field is the same in every bucket a claim probes.
 *
 * Counting: the markers of the time bucket before are estimated from a sample of its buckets
 * (HLEN less the sentinel field, of SAMPLE random shard/sub pairs), scaled by its number of
 * buckets: a few dozen commands once per time bucket and handle that first reaches it.
 *
 * Safety: a time bucket's stamp exists before anything is written into the time bucket (every
 * write asks for the selector bits first), and it expires after every bucket of its time bucket,
 * so a time bucket without a stamp holds no marker, and reading it with any selector bits finds
 * nothing, as it should. A stamp is decided at most WXG__CLOCK_MARGIN_MS before its time bucket
 * starts (a step near a boundary needs the next one's names), from a time bucket then all but
 * complete.
 *
 * A stamp lives in Redis, so a Redis that lost it (restarted empty, failed over to a replica
 * that had not received it, restored from an older snapshot) may be stamped again with other
 * bits by the next handle that needs it. A handle that went on with the bits it remembered would
 * then look for a message in another field than that handle: two live owners, duplicates
 * missed. Every such loss of data ends the connections it happened behind, so the cache holds
 * only for the connections its entries were read over: a new connection (a new node connection,
 * or a new slot map, in a cluster) forgets every entry, and the next call reads the stamps anew
 * (SET NX GET: the first stamp after the loss is the one every handle then reads). A FLUSHALL of
 * a live server drops data without dropping connections: it is outside what the guard survives
 * (docs/guard.md §4); restart the consumers after one.
 *
 * Threads: the handle's thread; the cache is the handle's. Failure modes: those of the
 * connection; a stamp that cannot be read or written fails the call that needed it (retriable).
 */
#include "guard_conn_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLE 64

/* The handle's remembered selector bits of recent time buckets: 1 with *sel (and *stamped: 0
 * for a time bucket that ended without a stamp, read with the first time bucket's bits), or 0. */
static int cache_get(const wxg__guard_redis_t *rg, int64_t tb, int *sel, int *stamped)
{
    for (int i = 0; i < WXG__GEOM_CACHE; i++) {
        if (rg->gcache[i].sel != 0 && rg->gcache[i].tb == tb) {
            *sel = abs(rg->gcache[i].sel);
            *stamped = rg->gcache[i].sel > 0;
            return 1;
        }
    }
    return 0;
}

/* Remembers sel for tb; stamped 0 stores it negated. */
static void cache_put(wxg__guard_redis_t *rg, int64_t tb, int sel, int stamped)
{
    int slot = 0;
    for (int i = 1; i < WXG__GEOM_CACHE; i++) {
        if (rg->gcache[i].tb < rg->gcache[slot].tb || rg->gcache[i].sel == 0)
            slot = i; /* the oldest, or an empty one */
        if (rg->gcache[i].sel == 0)
            break;
    }
    rg->gcache[slot].tb = tb;
    rg->gcache[slot].sel = stamped ? sel : -sel;
}

static void stamp_key(const wxg__guard_redis_t *rg, int64_t tb, char *out, size_t size)
{
    snprintf(out, size, "%sg:%lld", rg->prefix, (long long)tb);
}

/* Reads a selector-bits stamp reply: 1 with *sel, 0 for nil, WXG_EREDIS for anything else. */
static int stamp_value(const redisReply *r, int *sel)
{
    if (r->type == REDIS_REPLY_NIL)
        return 0;
    if (r->type != REDIS_REPLY_STRING)
        return WXG_EREDIS;
    int v = atoi(r->str);
    if (v < 1 || v > WXG__SELECTOR_BITS_MAX)
        return WXG_EREDIS;
    *sel = v;
    return 1;
}

/* Sends one command whose answer is a stamp (GET, or SET ... GET) for time bucket tb: 1 with
 * *sel, 0 when Redis had none, or an error code with the last error set. */
static int stamp_command(wxg__guard_redis_t *rg, int64_t tb, int argc, const char **argv,
                         const size_t *lens, int *sel)
{
    wxg__guard_cmd_t cmd = {argc, argv, lens};
    redisReply *r = NULL;
    int rc = wxg__guard_conn_pipeline(rg, &cmd, 1, 0, &r, NULL);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        wxg__guard_set_error(rg->handle, "Redis refused the layout stamp of time bucket %lld: %.*s",
                             (long long)tb, (int)(r->len > 200 ? 200 : r->len), r->str);
        rc = wxg__guard_refusal_code(r);
    } else {
        rc = stamp_value(r, sel);
        if (rc < 0)
            wxg__guard_set_error(rg->handle, "unreadable layout stamp of time bucket %lld",
                                 (long long)tb);
    }
    freeReplyObject(r);
    return rc;
}

/* The stamp of time bucket tb as Redis has it: 1 with *sel, 0 when there is none. */
static int stamp_read(wxg__guard_redis_t *rg, int64_t tb, int *sel)
{
    char key[WXG__KEY_MAX + 24];
    stamp_key(rg, tb, key, sizeof key);
    const char *argv[2] = {"GET", key};
    size_t lens[2] = {3, strlen(key)};
    return stamp_command(rg, tb, 2, argv, lens, sel);
}

/* Estimates the markers of time bucket tb, laid out with `sel` selector bits: the mean of a
 * sample of its buckets (HLEN, less the sentinel field '_' a script's write leaves) times their
 * number. */
static int count_markers(wxg__guard_redis_t *rg, int64_t tb, int sel, double *markers)
{
    char names[SAMPLE][WXG__KEY_MAX];
    const char *argv[2 * SAMPLE][3];
    size_t lens[2 * SAMPLE][3];
    wxg__guard_cmd_t cmds[2 * SAMPLE];
    redisReply *rep[2 * SAMPLE];
    uint64_t rnd[SAMPLE];
    int rc = wxg__guard_fill_random(rnd, sizeof rnd);
    if (rc)
        return rc;
    int g = rg->geom.shard_bits, subs = sel - g;
    for (int i = 0; i < SAMPLE; i++) {
        unsigned shard = g > 0 ? (unsigned)(rnd[i] >> (64 - g)) : 0;
        uint64_t sub = subs > 0 ? rnd[i] & ((1ULL << subs) - 1) : 0;
        rc = wxg__guard_bucket_name(rg->prefix, g, shard, sub, tb, names[i], sizeof names[i]);
        if (rc)
            return rc;
        size_t nl = strlen(names[i]);
        argv[2 * i][0] = "HLEN", lens[2 * i][0] = 4;
        argv[2 * i][1] = names[i], lens[2 * i][1] = nl;
        cmds[2 * i] = (wxg__guard_cmd_t){2, argv[2 * i], lens[2 * i]};
        argv[2 * i + 1][0] = "HEXISTS", lens[2 * i + 1][0] = 7;
        argv[2 * i + 1][1] = names[i], lens[2 * i + 1][1] = nl;
        argv[2 * i + 1][2] = "_", lens[2 * i + 1][2] = 1;
        cmds[2 * i + 1] = (wxg__guard_cmd_t){3, argv[2 * i + 1], lens[2 * i + 1]};
    }
    size_t got = 0;
    rc = wxg__guard_conn_pipeline(rg, cmds, 2 * SAMPLE, 0, rep, &got);
    long long total = 0;
    for (size_t i = 0; i < got; i++) {
        if (rc == 0 && rep[i]->type != REDIS_REPLY_INTEGER) {
            wxg__guard_set_error(rg->handle, "unexpected reply counting time bucket %lld",
                                 (long long)tb);
            rc = rep[i]->type == REDIS_REPLY_ERROR ? wxg__guard_refusal_code(rep[i]) : WXG_EREDIS;
        }
        if (rc == 0)
            total += i % 2 == 0 ? rep[i]->integer : -rep[i]->integer;
        freeReplyObject(rep[i]);
    }
    if (rc == 0)
        *markers = (double)total / SAMPLE * ldexp(1.0, sel);
    return rc;
}

/* The selector bits time bucket tb should have: from the markers of the latest time bucket
 * before it that has a stamp (normally tb - 1; an older one after time buckets nobody wrote
 * into, as long as its markers can still live), or the first time bucket's when there is none;
 * the same as that one's when it holds nothing (an idle week tells nothing about the next). */
static int decide(wxg__guard_redis_t *rg, int64_t tb, int *sel)
{
    int64_t back = rg->geom.retention_ms / rg->geom.bucket_ms + 1;
    for (int64_t k = 1; k <= back; k++) {
        int prev = 0, stamped = 1;
        int rc = cache_get(rg, tb - k, &prev, &stamped) ? stamped : stamp_read(rg, tb - k, &prev);
        if (rc < 0)
            return rc;
        if (rc == 0)
            continue;
        double markers = 0;
        rc = count_markers(rg, tb - k, prev, &markers);
        if (rc)
            return rc;
        *sel = markers > 0 ? wxg__guard_sel_for_count(&rg->geom, markers) : prev;
        return 0;
    }
    *sel = rg->geom.selector_bits;
    return 0;
}

/* Stamps time bucket tb with `want` unless a stamp exists; *sel is the one that holds. Every
 * bucket of tb expires at (tb + 1) * width + retention: the stamp one width later. */
static int stamp_write(wxg__guard_redis_t *rg, int64_t tb, int want, int *sel)
{
    char key[WXG__KEY_MAX + 24], val[8], at[24];
    stamp_key(rg, tb, key, sizeof key);
    snprintf(val, sizeof val, "%d", want);
    snprintf(at, sizeof at, "%lld",
             (long long)((tb + 2) * rg->geom.bucket_ms + rg->geom.retention_ms));
    const char *argv[7] = {"SET", key, val, "NX", "GET", "PXAT", at};
    size_t lens[7] = {3, strlen(key), strlen(val), 2, 3, 4, strlen(at)};
    int rc = stamp_command(rg, tb, 7, argv, lens, sel);
    if (rc == 0)
        *sel = want; /* there was none: ours is the stamp */
    return rc < 0 ? rc : 0;
}

uint64_t wxg__guard_conn_epoch(const wxg__guard_redis_t *rg)
{
    uint64_t e = rg->stats->connects;
    if (rg->cluster != NULL) {
        wxg__rcluster_stats_t cs;
        wxg__rcluster_get_stats(rg->cluster, &cs);
        e += cs.refreshes + cs.node_errors;
    }
    return e;
}

int wxg__guard_sel(wxg__guard_redis_t *rg, int64_t tb, int create, int *sel)
{
    if (!rg->geom.adaptive) {
        *sel = rg->geom.selector_bits;
        return 0;
    }
    uint64_t epoch = wxg__guard_conn_epoch(rg);
    if (epoch != rg->gcache_epoch) {
        memset(rg->gcache, 0, sizeof rg->gcache);
        rg->gcache_epoch = epoch;
    }
    int stamped = 0;
    if (cache_get(rg, tb, sel, &stamped))
        return 0;
    int rc = wxg__guard_conn_ensure(rg);
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    rc = stamp_read(rg, tb, sel);
    if (rc == 0 && !create) {
        /* Nothing was written into tb: any selector bits find what is there, nothing. Once tb
         * ended longer ago than the clocks may disagree, nobody stamps it any more, and the
         * answer is kept; before, it is asked again. */
        *sel = rg->geom.selector_bits;
        int64_t now = wxg__guard_clock_us(rg) / 1000;
        if ((tb + 1) * rg->geom.bucket_ms + WXG__CLOCK_MARGIN_MS < now)
            cache_put(rg, tb, *sel, 0);
        return 0;
    }
    if (rc == 0) {
        int want = 0;
        rc = decide(rg, tb, &want);
        if (rc == 0)
            rc = stamp_write(rg, tb, want, sel);
    } else if (rc == 1) {
        rc = 0;
    }
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    cache_put(rg, tb, *sel, 1);
    return 0;
}
