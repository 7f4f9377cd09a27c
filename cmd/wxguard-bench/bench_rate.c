/*
 * wxguard-bench guard --rate: Redis memory per compact DONE marker at the steady-state density
 * of a given rate, in the layouts a deployment can have at that rate.
 *
 * A time bucket of the default layout is as wide as the retention (7 days), so at 10,000
 * messages/s one of them holds six billion markers: no benchmark can write that. What decides
 * the bytes per marker, though, is only how full each bucket hash is and how wide its fields
 * are, and both follow from the layout: a bucket holds on average rate x width / 2^selector_bits
 * markers of field_bytes bytes each. So for each rate this program opens guard handles as
 * wxguard-consumer configures them from the keys and reads the geometry each chose from
 * wxg_guard_describe_layout(), in three layouts:
 *   - auto: guard.done.expected.rate = auto (the default). Every time bucket is sized from the
 *     markers of the one before (docs/guard.md §3.6), so from the second time bucket on it has
 *     the selector bits of rate x width markers at bucket_target each, with the field width the
 *     adaptive layout keeps for every rate;
 *   - stated: the rate pinned in the configuration (guard.done.expected.rate = rate);
 *   - pinned 1000: the layout of a deployment that pinned 1000/s whatever its real rate.
 * It writes `markers` markers into as many buckets as hold them at the layout's mean, spread at
 * random (so each bucket's count varies as in steady state), with the guard's names, field
 * widths, values and expiry, and reports used_memory growth per marker and how many buckets Redis
 * keeps in the compact listpack encoding.
 *
 * Threads: one, with its own connection. The database must be empty; it is flushed after each
 * row.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bench_redis.h"
#include "wxguard/guard.h"

typedef struct geom {
    int shards, selector_bits, field_bytes;
    long long bucket_ms;
    double bucket_mean;
} geom;

/* The geometry of a handle configured as wxguard-consumer does, with guard.done.expected.rate
 * = layout_rate (0: auto), for traffic at `rate`. */
static int layout_of(const struct wxg_conf_s *conf, double layout_rate, double rate, geom *g,
                     char *desc, size_t dsize)
{
    wxg_guard_conf_t c;
    char mapped_prefix[WXG_GUARD_PREFIX_MAX + 1];
    wxgb_conf_guard(conf, &c, mapped_prefix, sizeof mapped_prefix);
    c.prefix = "wxgbrate:";
    c.done_expected_rate = layout_rate;
    c.done_selector_bits = 0;
    char err[256] = "";
    wxg_guard_t *h = wxg_guard_new(&c, NULL, err, sizeof err);
    if (!h) {
        fprintf(stderr, "wxguard-bench guard --rate: %s\n", err);
        return -1;
    }
    int rc = wxg_guard_describe_layout(h, desc, dsize);
    wxg_guard_destroy(h);
    int target = 0;
    const char *t = strstr(desc, "bucket_target=");
    const char *fb = strstr(desc, "field_bytes=");
    if (rc != 0 || !t || !fb || sscanf(desc, "shards=%d", &g->shards) != 1 ||
        sscanf(fb, "field_bytes=%d bucket_ms=%lld", &g->field_bytes, &g->bucket_ms) != 2 ||
        sscanf(t, "bucket_target=%d", &target) != 1 || target < 1)
        return -1;
    int shard_bits = __builtin_ctz((unsigned)g->shards);
    double per_time_bucket = rate * (double)g->bucket_ms / 1000.0;
    if (layout_rate > 0) {
        if (sscanf(desc, "shards=%*d selector_bits=%d", &g->selector_bits) != 1)
            return -1;
    } else {
        /* What the stamp of a time bucket after one at this rate says: the smallest selector
         * bits with at most `target` markers per bucket, and never fewer than the shards. */
        g->selector_bits = shard_bits;
        while (g->selector_bits < 40 && per_time_bucket / ldexp(1.0, g->selector_bits) > target)
            g->selector_bits++;
    }
    g->bucket_mean = per_time_bucket / ldexp(1.0, g->selector_bits);
    return 0;
}

static uint64_t rng(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ULL;
}

/* Sends the appended commands and reads their replies; ends the program when that fails. */
static void replies_ok(wxgb_redis_t *c)
{
    size_t n = 0;
    if (!wxgb_redis_replies(c, &n)) {
        fprintf(stderr, "wxguard-bench guard --rate: %s\n", wxgb_redis_errstr(c));
        exit(1);
    }
}

static void flush(wxgb_redis_t *c)
{
    redisReply *r = wxgb_redis_cmd(c, "FLUSHDB", "SYNC", NULL);
    if (r)
        freeReplyObject(r);
}

/* Writes `markers` markers at random into nb distinct buckets of the layout. */
static void fill(wxgb_redis_t *c, const geom *g, uint64_t markers, uint64_t nb, uint64_t *seed)
{
    /* The bucket names the guard uses: <prefix>{s<shard, fixed-width hex>}:d:<sub>:<tb>. */
    int sub_bits = g->selector_bits - __builtin_ctz((unsigned)g->shards);
    int hexw = g->shards > 1 ? (__builtin_ctz((unsigned)g->shards) + 3) / 4 : 1;
    uint64_t *ids = malloc(nb * sizeof *ids);
    unsigned char *created = calloc(nb, 1);
    if (!ids || !created) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    /* Distinct selectors scattered over the layout (an odd multiplier is a bijection modulo a
     * power of two). */
    uint64_t off = rng(seed);
    for (uint64_t b = 0; b < nb; b++)
        ids[b] = (b * 0x9e3779b97f4a7c15ULL + off) & ((1ULL << g->selector_bits) - 1);
    /* The current time bucket, expiring when the guard's would (one in the past would make
     * Redis delete each bucket as it is created). */
    long long tb = (long long)time(NULL) * 1000 / g->bucket_ms;
    long long expire_at = (tb + 1) * g->bucket_ms + g->bucket_ms;
    const uint64_t depth = 256;
    char expire[32];
    snprintf(expire, sizeof expire, "%lld", expire_at);
    for (uint64_t done = 0; done < markers;) {
        uint64_t n = markers - done < depth ? markers - done : depth;
        for (uint64_t i = 0; i < n; i++) {
            /* As many buckets as markers: a layout far too wide for the rate, one marker in
             * each (two in one of 2^selector_bits buckets are rare). */
            uint64_t b = nb == markers ? done + i : rng(seed) % nb;
            unsigned shard = (unsigned)(ids[b] >> sub_bits);
            unsigned long long sub = ids[b] & ((1ULL << sub_bits) - 1);
            char key[128], field[16], tag[8];
            snprintf(key, sizeof key, "wxgbrate:{s%0*x}:d:%llu:%lld", hexw, shard, sub, tb);
            for (int k = 0; k < g->field_bytes; k++)
                field[k] = (char)rng(seed);
            snprintf(tag, sizeof tag, "%d", (int)(int16_t)rng(seed));
            /* The native design's marker (the Lua design's buckets hold one sentinel field
             * more each). */
            const char *hset[4] = {"HSET", key, field, tag};
            const size_t lens[4] = {4, strlen(key), (size_t)g->field_bytes, strlen(tag)};
            wxgb_redis_append_argv(c, 4, hset, lens);
            if (!created[b]) {
                created[b] = 1;
                wxgb_redis_append(c, "PEXPIREAT", key, expire, NULL);
            }
        }
        replies_ok(c);
        done += n;
    }
    free(ids);
    free(created);
}

/* Counts buckets in each encoding with SCAN + OBJECT ENCODING. */
static void encodings(wxgb_redis_t *c, long long *listpack, long long *other)
{
    char cursor[32] = "0";
    *listpack = *other = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        redisReply *r =
            wxgb_redis_cmd(c, "SCAN", cursor, "MATCH", "wxgbrate:{*}:d:*", "COUNT", "1000", NULL);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
            break;
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *ks = r->element[1];
        for (size_t i = 0; i < ks->elements; i++) {
            const char *argv[3] = {"OBJECT", "ENCODING", ks->element[i]->str};
            const size_t lens[3] = {6, 8, ks->element[i]->len};
            wxgb_redis_append_argv(c, 3, argv, lens);
        }
        size_t got = 0;
        redisReply **er = wxgb_redis_replies(c, &got);
        for (size_t i = 0; er && i < got; i++) {
            if (er[i]->type == REDIS_REPLY_STRING && strcmp(er[i]->str, "listpack") == 0)
                (*listpack)++;
            else
                (*other)++;
        }
        freeReplyObject(r);
        if (strcmp(cursor, "0") == 0)
            break;
    }
}

/* One row: `markers` markers in the layout g; 0 or -1. */
static int row(wxgb_redis_t *admin, const char *name, double rate, const geom *g, uint64_t markers,
               uint64_t *seed)
{
    flush(admin);
    double mean = g->bucket_mean > 1 ? g->bucket_mean : 1;
    uint64_t nb = (uint64_t)((double)markers / mean + 0.5);
    if (nb < 1)
        nb = 1;
    if (nb > (1ULL << g->selector_bits))
        nb = 1ULL << g->selector_bits;
    double m0 = wxgb_info_field(admin, "memory", "used_memory");
    fill(admin, g, markers, nb, seed);
    double m1 = wxgb_info_field(admin, "memory", "used_memory");
    long long lp = 0, other = 0;
    encodings(admin, &lp, &other);
    printf("| %g | %s | %d | %d | %d | %.3g | %llu | %.1f | %lld | %lld |\n", rate, name, g->shards,
           g->selector_bits, g->field_bytes, g->bucket_mean, (unsigned long long)nb,
           (m1 - m0) / (double)markers, lp, other);
    fflush(stdout);
    flush(admin);
    return 0;
}

int wxgb_rate_run(wxgb_redis_t *admin, const struct wxg_conf_s *conf, const char *rates,
                  uint64_t markers)
{
    printf("## wxguard-bench guard --rate\n\n");
    printf("- markers written per row: %llu, spread at random over the buckets that hold "
           "them at the layout's mean (a mean below 1 writes one marker per bucket)\n",
           (unsigned long long)markers);
    printf("- layouts: auto = guard.done.expected.rate auto, from the second time bucket on; "
           "stated = the rate pinned; pinned 1000 = 1000/s pinned whatever the rate\n\n");
    printf("| rate (messages/s) | layout | shards | selector bits | field bytes | mean markers "
           "per bucket | buckets written | used_memory per marker (bytes) | listpack buckets | "
           "other buckets |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    fflush(stdout);
    uint64_t seed = 0x2545F4914F6CDD1DULL;
    for (const char *p = rates; *p;) {
        char *end = NULL;
        double rate = strtod(p, &end);
        if (end == p || rate <= 0) {
            fprintf(stderr, "wxguard-bench guard --rate: bad rate list '%s'\n", rates);
            return 2;
        }
        p = *end == ',' ? end + 1 : end;
        static const struct {
            const char *name;
            double layout_rate; /* 0: auto; -1: the rate itself */
        } layouts[] = {{"auto", 0}, {"stated", -1}, {"pinned 1000", 1000}};
        for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
            if (layouts[i].layout_rate == 1000 && rate == 1000)
                continue; /* the same as stated */
            geom g;
            char desc[512];
            double lr = layouts[i].layout_rate < 0 ? rate : layouts[i].layout_rate;
            if (layout_of(conf, lr, rate, &g, desc, sizeof desc) != 0 ||
                row(admin, layouts[i].name, rate, &g, markers, &seed) != 0)
                return 1;
        }
    }
    return 0;
}
