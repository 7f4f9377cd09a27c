/*
 * wxguard-bench guard --rate: Redis memory per compact DONE marker at the steady-state density
 * of a given rate, with the layout the guard chooses for that rate.
 *
 * A time bucket of the default layout is as wide as the retention (7 days), so at 10,000
 * messages/s one of them holds six billion markers: no benchmark can write that. What decides
 * the bytes per marker, though, is only how full each bucket hash is and how wide its fields
 * are, and both follow from the layout: a bucket holds on average rate x width / 2^selector_bits
 * markers of field_bytes bytes each. So for each rate this program opens a guard handle with
 * done_expected_rate = rate (what guard.done.expected.rate does in the consumer), reads the
 * geometry it chose from wxg_guard_describe_layout(), and writes `markers` markers into as many
 * buckets as hold them at that mean, spread at random (so each bucket's count varies as in
 * steady state), with the guard's names, field widths, values, sentinel field and expiry. It
 * reports used_memory growth per marker and how many buckets Redis keeps in the compact
 * listpack encoding.
 *
 * Threads: one, with its own connection. The database must be empty; it is flushed after each
 * rate.
 */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "wxguard/guard.h"

typedef struct geom {
    int shards, selector_bits, field_bytes;
    long long bucket_ms;
    double bucket_mean;
} geom;

static int layout_of(const struct wxg_conf_s *conf, double rate, geom *g, char *desc, size_t dsize)
{
    /* The guard as wxguard-consumer configures it from the keys, at this rate. */
    wxg_guard_conf_t c;
    char mapped_prefix[WXG_GUARD_PREFIX_MAX + 1];
    wxgb_conf_guard(conf, &c, mapped_prefix, sizeof mapped_prefix);
    c.prefix = "wxgbrate:";
    c.done_expected_rate = rate;
    char err[256] = "";
    wxg_guard_t *h = wxg_guard_new(&c, NULL, err, sizeof err);
    if (!h) {
        fprintf(stderr, "wxguard-bench guard --rate: %s\n", err);
        return -1;
    }
    int rc = wxg_guard_describe_layout(h, desc, dsize);
    wxg_guard_destroy(h);
    if (rc != 0 || sscanf(desc, "shards=%d selector_bits=%d field_bytes=%d bucket_ms=%lld",
                          &g->shards, &g->selector_bits, &g->field_bytes, &g->bucket_ms) != 4)
        return -1;
    const char *m = strstr(desc, "bucket_mean=");
    g->bucket_mean = m ? strtod(m + 12, NULL) : 0;
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

static void reply_ok(redisContext *c)
{
    void *r = NULL;
    if (redisGetReply(c, &r) != REDIS_OK || !r) {
        fprintf(stderr, "wxguard-bench guard --rate: %s\n", c->errstr);
        exit(1);
    }
    freeReplyObject(r);
}

static void flush(redisContext *c)
{
    redisReply *r = redisCommand(c, "FLUSHDB SYNC");
    if (r)
        freeReplyObject(r);
}

/* Writes `markers` markers at random into nb distinct buckets of the layout. */
static void fill(redisContext *c, const geom *g, uint64_t markers, uint64_t nb, uint64_t *seed)
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
    long long tb = 2950, expire_at = (tb + 1) * g->bucket_ms + g->bucket_ms;
    const uint64_t depth = 256;
    for (uint64_t done = 0; done < markers;) {
        uint64_t n = markers - done < depth ? markers - done : depth;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t b = rng(seed) % nb;
            unsigned shard = (unsigned)(ids[b] >> sub_bits);
            unsigned long long sub = ids[b] & ((1ULL << sub_bits) - 1);
            char key[128], field[16], tag[8];
            snprintf(key, sizeof key, "wxgbrate:{s%0*x}:d:%llu:%lld", hexw, shard, sub, tb);
            for (int k = 0; k < g->field_bytes; k++)
                field[k] = (char)rng(seed);
            snprintf(tag, sizeof tag, "%d", (int)(int16_t)rng(seed));
            redisAppendCommand(c, "HSET %s %b %s _ %s", key, field, (size_t)g->field_bytes, tag,
                               "");
            if (!created[b]) {
                created[b] = 1;
                redisAppendCommand(c, "PEXPIREAT %s %lld", key, expire_at);
                reply_ok(c);
            }
        }
        for (uint64_t i = 0; i < n; i++)
            reply_ok(c);
        done += n;
    }
    free(ids);
    free(created);
}

/* Counts buckets in each encoding with SCAN + OBJECT ENCODING. */
static void encodings(redisContext *c, long long *listpack, long long *other)
{
    char cursor[32] = "0";
    *listpack = *other = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        redisReply *r = redisCommand(c, "SCAN %s MATCH wxgbrate:{*}:d:* COUNT 1000", cursor);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
            break;
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *ks = r->element[1];
        for (size_t i = 0; i < ks->elements; i++)
            redisAppendCommand(c, "OBJECT ENCODING %b", ks->element[i]->str, ks->element[i]->len);
        for (size_t i = 0; i < ks->elements; i++) {
            void *e = NULL;
            if (redisGetReply(c, &e) != REDIS_OK || !e)
                break;
            redisReply *er = e;
            if (er->type == REDIS_REPLY_STRING && strcmp(er->str, "listpack") == 0)
                (*listpack)++;
            else
                (*other)++;
            freeReplyObject(er);
        }
        freeReplyObject(r);
        if (strcmp(cursor, "0") == 0)
            break;
    }
}

int wxgb_rate_run(struct redisContext *admin, const struct wxg_conf_s *conf, const char *rates,
                  uint64_t markers)
{
    printf("## wxguard-bench guard --rate\n\n");
    printf("- markers written per rate: %llu, spread at random over the buckets that hold "
           "them at the layout's mean\n\n",
           (unsigned long long)markers);
    printf("| rate (messages/s) | shards | selector bits | field bytes | mean markers per bucket "
           "| buckets written | used_memory per marker (bytes) | listpack buckets | other "
           "buckets |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
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
        geom g;
        char desc[512];
        if (layout_of(conf, rate, &g, desc, sizeof desc) != 0)
            return 1;
        flush(admin);
        double mean = g.bucket_mean > 0 ? g.bucket_mean : 1;
        uint64_t nb = (uint64_t)((double)markers / mean + 0.5);
        if (nb < 1)
            nb = 1;
        if (nb > (1ULL << g.selector_bits))
            nb = 1ULL << g.selector_bits;
        double m0 = wxgb_info_field(admin, "memory", "used_memory");
        fill(admin, &g, markers, nb, &seed);
        double m1 = wxgb_info_field(admin, "memory", "used_memory");
        long long lp = 0, other = 0;
        encodings(admin, &lp, &other);
        printf("| %g | %d | %d | %d | %.1f | %llu | %.1f | %lld | %lld |\n", rate, g.shards,
               g.selector_bits, g.field_bytes, mean, (unsigned long long)nb,
               (m1 - m0) / (double)markers, lp, other);
        fflush(stdout);
        flush(admin);
    }
    return 0;
}
