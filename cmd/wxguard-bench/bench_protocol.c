/*
 * wxguard-bench protocol: what candidate command sequences for the guard's common path cost
 * Redis, beside the shipped Lua design, in one run with the variants alternating.
 *
 * Only the shipped design ("lua v3") is the guard itself (wxg_guard_claim_batch and
 * wxg_guard_complete_batch). The others are the Redis commands a design would send for a new
 * message -- its claim and its completion, nothing of its rare paths -- so that a design can
 * be judged by its cost before it is built:
 *
 *   native, record    the shipped layout on native commands: round 1 probes both live DONE
 *                     buckets (HGET x2), round 2 creates the in-flight record (SET NX GET PXAT,
 *                     after TIME); complete writes the marker (HSET with the sentinel field),
 *                     the bucket's expiry (PEXPIREAT) and a short tombstone over the record that
 *                     a racing claim reads as DONE (SET XX GET PX).
 *   native, bucket    the in-flight state as a field of the current DONE bucket: claim is
 *                     HSETNX of the in-flight value, PEXPIREAT of the bucket (a claim may create
 *                     it) and HGET in the previous bucket; complete overwrites the field with the
 *                     payload tag (HSET). No key is created or deleted per message.
 *   lua, bucket       the same layout as "native, bucket", each step one script call per batch
 *                     (one packed argument per message, as the shipped scripts do).
 *
 * Per variant and round: messages/s and Redis CPU per new message (used_cpu_sys + used_cpu_user
 * from INFO, so everything the server spent in the interval), 4 threads, batches of 64.
 * Threads: one connection each. The database must be empty; it is flushed after every row.
 * Every connection, the guard's and the variants' own, is made from the configuration keys
 * (--host, --port and --set KEY=VALUE, mapped as wxguard-consumer maps them), so a TLS-only or
 * ACL-protected server is measured as the guard would reach it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_redis.h"
#include "wxguard/conf.h"
#include "wxguard/guard.h"

enum { V_NATIVE_BUCKET, V_NATIVE_RECORD, V_LUA_BUCKET, V_LUA_V3, V_COUNT };
static const char *const vname[V_COUNT] = {"native, bucket", "native, record", "lua, bucket",
                                           "lua v3 (the shipped design)"};

typedef struct pctx {
    const char *host;
    int port;
    wxg_guard_conf_t redis; /* the keys mapped: server, TLS, credentials */
    char redis_prefix[WXG_GUARD_PREFIX_MAX + 1];
    int per_thread;
    unsigned run;
    char sha_claim[41], sha_complete[41];
} pctx;

typedef struct pjob {
    const pctx *p;
    int variant, tid;
    long failures;
} pjob;

static const char lua_claim[] =
    "redis.call('TIME')\n"
    "local out = {}\n"
    "for i = 1, #ARGV do\n"
    "  local a = ARGV[i]\n"
    "  local sl = string.byte(a, 1)\n"
    "  local stem = string.sub(a, 2, 1 + sl)\n"
    "  local f = string.sub(a, 2 + sl, 10 + sl)\n"
    "  local v = string.sub(a, 11 + sl)\n"
    "  if redis.call('HGET', stem .. '0', f) then out[i] = 2\n"
    "  elseif redis.call('HSETNX', stem .. '1', f, v) == 1 then\n"
    "    redis.call('PEXPIREAT', stem .. '1', 99999999999999); out[i] = 1\n"
    "  else out[i] = 3 end\n"
    "end\n"
    "return out\n";
static const char lua_complete[] =
    "local out = {}\n"
    "for i = 1, #ARGV do\n"
    "  local a = ARGV[i]\n"
    "  local sl = string.byte(a, 1)\n"
    "  local bk = string.sub(a, 2, 1 + sl) .. '1'\n"
    "  local f = string.sub(a, 2 + sl, 10 + sl)\n"
    "  local o = string.sub(a, 11 + sl)\n"
    "  local v = redis.call('HGET', bk, f)\n"
    "  if v and string.sub(v, 1, #o) == o then redis.call('HSET', bk, f, 5); out[i] = 0\n"
    "  else out[i] = -1 end\n"
    "end\n"
    "return out\n";

/* Sends the appended commands (n of them) and counts the error replies. */
static void replies(wxgb_redis_t *c, size_t n, pjob *j)
{
    size_t got = 0;
    redisReply **r = wxgb_redis_replies(c, &got);
    if (!r || got != n) {
        fprintf(stderr, "wxguard-bench protocol: %s\n", wxgb_redis_errstr(c));
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        j->failures += r[i]->type == REDIS_REPLY_ERROR;
}

/* Appends `cmd key field rest...`: a hash command on a field of 9 binary bytes, as the
 * guard's, then nrest (at most 4) string arguments. */
static void append_field(wxgb_redis_t *c, const char *cmd, const char *key, const unsigned char *f,
                         const char *const *rest, int nrest)
{
    const char *argv[7] = {cmd, key, (const char *)f};
    size_t lens[7] = {strlen(cmd), strlen(key), 9};
    for (int i = 0; i < nrest; i++) {
        argv[3 + i] = rest[i];
        lens[3 + i] = strlen(rest[i]);
    }
    wxgb_redis_append_argv(c, 3 + nrest, argv, lens);
}

/* A message's fingerprint stand-in: 32 pseudo-random bytes from (run, thread, index). */
static void fp_of(unsigned run, int tid, unsigned i, unsigned char fp[32])
{
    uint64_t x = ((uint64_t)run << 40) ^ ((uint64_t)tid << 32) ^ i ^ 0x9e3779b97f4a7c15ULL;
    for (int k = 0; k < 32; k++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        fp[k] = (unsigned char)((x * 2685821657736338717ULL) >> 56);
    }
}

enum { PB = 64 };

typedef struct names {
    char b1[PB][64], b0[PB][64], stem[PB][64], rec[PB][64], val[PB][80];
    size_t sl[PB];
    unsigned char fp[PB][32];
} names;

/* Names shaped like the guard's: 16 shards x 256 sub-buckets, 9-byte fields. */
static void make_names(names *nm, unsigned run, int tid, int base, int n)
{
    for (int i = 0; i < n; i++) {
        fp_of(run, tid, (unsigned)(base + i), nm->fp[i]);
        unsigned shard = nm->fp[i][0] >> 4, sub = nm->fp[i][1];
        nm->sl[i] =
            (size_t)snprintf(nm->stem[i], sizeof nm->stem[i], "p%u:{s%x}:d:%u:", run, shard, sub);
        snprintf(nm->b1[i], sizeof nm->b1[i], "%s1", nm->stem[i]);
        snprintf(nm->b0[i], sizeof nm->b0[i], "%s0", nm->stem[i]);
        char hex[33];
        for (int k = 0; k < 16; k++)
            snprintf(hex + 2 * k, 3, "%02x", nm->fp[i][16 + k]);
        snprintf(nm->rec[i], sizeof nm->rec[i], "p%u:{s%x}:r:%s", run, shard, hex);
        snprintf(nm->val[i], sizeof nm->val[i],
                 "P0123456789abcdef0123456789abcdef|17650000000%05d|1765000030000", base + i);
    }
}

static void native_bucket(wxgb_redis_t *c, names *nm, int n, pjob *j)
{
    static const char *const five[] = {"5"};
    for (int i = 0; i < n; i++) {
        const char *val[] = {nm->val[i]};
        append_field(c, "HSETNX", nm->b1[i], nm->fp[i] + 8, val, 1);
        wxgb_redis_append(c, "PEXPIREAT", nm->b1[i], "99999999999999", NULL);
        append_field(c, "HGET", nm->b0[i], nm->fp[i] + 8, NULL, 0);
    }
    replies(c, 3 * (size_t)n, j);
    for (int i = 0; i < n; i++)
        append_field(c, "HSET", nm->b1[i], nm->fp[i] + 8, five, 1);
    replies(c, (size_t)n, j);
}

static void native_record(wxgb_redis_t *c, names *nm, int n, pjob *j)
{
    /* The marker with the sentinel field (an empty value). */
    static const char *const marker[] = {"5", "_", ""};
    for (int i = 0; i < n; i++) {
        append_field(c, "HGET", nm->b1[i], nm->fp[i] + 8, NULL, 0);
        append_field(c, "HGET", nm->b0[i], nm->fp[i] + 8, NULL, 0);
    }
    replies(c, 2 * (size_t)n, j);
    wxgb_redis_append(c, "TIME", NULL);
    for (int i = 0; i < n; i++)
        wxgb_redis_append(c, "SET", nm->rec[i], nm->val[i], "NX", "GET", "PXAT", "99999999999999",
                          NULL);
    replies(c, (size_t)n + 1, j);
    for (int i = 0; i < n; i++) {
        append_field(c, "HSET", nm->b1[i], nm->fp[i] + 8, marker, 3);
        wxgb_redis_append(c, "PEXPIREAT", nm->b1[i], "99999999999999", NULL);
        wxgb_redis_append(c, "SET", nm->rec[i], "D", "XX", "GET", "PX", "20000", NULL);
    }
    replies(c, 3 * (size_t)n, j);
}

static void lua_bucket(wxgb_redis_t *c, names *nm, int n, pjob *j)
{
    char blob[PB][160];
    const char *argv[3 + PB];
    size_t lens[3 + PB];
    argv[0] = "EVALSHA";
    lens[0] = 7;
    argv[2] = "0";
    lens[2] = 1;
    for (int i = 0; i < n; i++) {
        size_t vl = strlen(nm->val[i]);
        blob[i][0] = (char)nm->sl[i];
        memcpy(blob[i] + 1, nm->stem[i], nm->sl[i]);
        memcpy(blob[i] + 1 + nm->sl[i], nm->fp[i] + 8, 9);
        memcpy(blob[i] + 10 + nm->sl[i], nm->val[i], vl);
        argv[3 + i] = blob[i];
        lens[3 + i] = 10 + nm->sl[i] + vl;
    }
    for (int step = 0; step < 2; step++) {
        argv[1] = step == 0 ? j->p->sha_claim : j->p->sha_complete;
        lens[1] = 40;
        if (step == 1) {
            for (int i = 0; i < n; i++)
                lens[3 + i] = 10 + nm->sl[i] + 33; /* the owner prefix */
        }
        redisReply *r = wxgb_redis_cmd_argv(c, 3 + n, argv, lens);
        if (!r || r->type != REDIS_REPLY_ARRAY)
            j->failures += n;
        if (r)
            freeReplyObject(r);
    }
}

static void *protocol_worker(void *arg)
{
    pjob *j = arg;
    const pctx *p = j->p;
    if (j->variant == V_LUA_V3) {
        wxg_guard_conf_t gc = p->redis;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "p%u:", p->run);
        gc.prefix = prefix;
        gc.shard_bits = 4;
        gc.done_selector_bits = 12; /* 16 x 256 buckets, as the others */
        wxg_guard_t *g = wxg_guard_new(&gc, NULL, NULL, 0);
        if (!g) {
            j->failures = p->per_thread;
            return NULL;
        }
        char keys[PB][48];
        wxg_guard_msg_t msgs[PB];
        wxg_guard_claim_t out[PB];
        wxg_guard_ticket_t t[PB];
        int res[PB];
        for (int base = 0; base < p->per_thread; base += PB) {
            int n = p->per_thread - base < PB ? p->per_thread - base : PB;
            for (int i = 0; i < n; i++) {
                int kl = snprintf(keys[i], sizeof keys[i], "wxid_p%02d:n:%d", j->tid, base + i);
                msgs[i] = (wxg_guard_msg_t){keys[i], (size_t)kl, NULL};
            }
            if (wxg_guard_claim_batch(g, msgs, (size_t)n, out) != 0) {
                j->failures += n;
                break;
            }
            for (int i = 0; i < n; i++)
                t[i] = out[i].ticket;
            if (wxg_guard_complete_batch(g, t, (size_t)n, res) != 0)
                j->failures += n;
            for (int i = 0; i < n; i++)
                wxg_guard_claim_clear(&out[i]);
        }
        wxg_guard_destroy(g);
        return NULL;
    }
    char err[512] = "";
    wxgb_redis_t *c = wxgb_redis_connect(&p->redis, NULL, 0, err, sizeof err);
    if (!c) {
        j->failures = p->per_thread;
        return NULL;
    }
    names *nm = malloc(sizeof *nm);
    for (int base = 0; nm && base < p->per_thread; base += PB) {
        int n = p->per_thread - base < PB ? p->per_thread - base : PB;
        make_names(nm, p->run, j->tid, base, n);
        if (j->variant == V_NATIVE_BUCKET)
            native_bucket(c, nm, n, j);
        else if (j->variant == V_NATIVE_RECORD)
            native_record(c, nm, n, j);
        else
            lua_bucket(c, nm, n, j);
    }
    free(nm);
    wxgb_redis_free(c);
    return NULL;
}

static void load(wxgb_redis_t *c, const char *src, char *sha)
{
    redisReply *r = wxgb_redis_cmd(c, "SCRIPT", "LOAD", src, NULL);
    if (!r || r->type != REDIS_REPLY_STRING) {
        fprintf(stderr, "wxguard-bench protocol: SCRIPT LOAD failed\n");
        exit(1);
    }
    snprintf(sha, 41, "%s", r->str);
    freeReplyObject(r);
}

int wxgb_protocol_main(int argc, char **argv)
{
    pctx p = {.host = "127.0.0.1", .port = 6379, .per_thread = 10000};
    int rounds = 3, threads = 4;
    const char *sets[WXGB_SETS_MAX];
    size_t nsets = 0;
    for (int i = 1; i < argc; i++) {
        uint64_t u = 0;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--port") == 0 && v && wxgb_parse_u64(v, &u) == 0 && u < 65536)
            p.port = (int)u;
        else if (strcmp(argv[i], "--host") == 0 && v)
            p.host = v;
        else if (strcmp(argv[i], "--messages") == 0 && v && wxgb_parse_u64(v, &u) == 0 && u >= 64 &&
                 u < 100000000)
            p.per_thread = (int)(u / 4);
        else if (strcmp(argv[i], "--rounds") == 0 && v && wxgb_parse_u64(v, &u) == 0 && u > 0 &&
                 u < 100)
            rounds = (int)u;
        else if (strcmp(argv[i], "--set") == 0 && v && nsets < WXGB_SETS_MAX)
            sets[nsets++] = v;
        else {
            fprintf(stderr, "usage: wxguard-bench protocol [--host H] [--port P] [--messages N] "
                            "[--rounds R] [--set KEY=VALUE ...]\n(4 threads; the database must "
                            "be empty; --set: the redis.* keys of wxguard-consumer, e.g. "
                            "redis.tls)\n");
            return 2;
        }
        i++;
    }
    /* The connections' settings from the keys, as wxguard-bench guard maps them. */
    char *props = wxgb_props("redis.host = %s\nredis.port = %d\nredis.command.timeout.ms = 30s\n",
                             p.host, p.port);
    struct wxg_conf_s *conf = wxgb_conf_new(props, sets, nsets);
    free(props);
    wxgb_conf_guard(conf, &p.redis, p.redis_prefix, sizeof p.redis_prefix);
    char err[512] = "";
    wxgb_redis_t *a = wxgb_redis_connect(&p.redis, NULL, 0, err, sizeof err);
    if (!a) {
        fprintf(stderr, "wxguard-bench protocol: cannot connect: %s\n", err);
        wxg_conf_free(conf);
        return 1;
    }
    redisReply *r = wxgb_redis_cmd(a, "DBSIZE", NULL);
    if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 0) {
        fprintf(stderr, "wxguard-bench protocol: the database is not empty\n");
        return 1;
    }
    freeReplyObject(r);
    load(a, lua_claim, p.sha_claim);
    load(a, lua_complete, p.sha_complete);
    printf("| round | variant | new messages/s | Redis CPU µs per new message | failures |\n"
           "|---:|---|---:|---:|---:|\n");
    for (int round = 1; round <= rounds; round++) {
        for (int v = 0; v < V_COUNT; v++) {
            p.run++;
            pjob jobs[16];
            pthread_t th[16];
            double c0 = wxgb_redis_cpu_s(a);
            int64_t t0 = prog_mono_us();
            for (int t = 0; t < threads; t++) {
                jobs[t] = (pjob){.p = &p, .variant = v, .tid = t};
                pthread_create(&th[t], NULL, protocol_worker, &jobs[t]);
            }
            long fails = 0;
            for (int t = 0; t < threads; t++) {
                pthread_join(th[t], NULL);
                fails += jobs[t].failures;
            }
            double secs = (double)(prog_mono_us() - t0) / 1e6;
            double cpu = wxgb_redis_cpu_s(a) - c0;
            double n = (double)p.per_thread * threads;
            printf("| %d | %s | %.0f | %.2f | %ld |\n", round, vname[v], n / secs, cpu * 1e6 / n,
                   fails);
            fflush(stdout);
            r = wxgb_redis_cmd(a, "FLUSHDB", "SYNC", NULL);
            if (r)
                freeReplyObject(r);
        }
    }
    r = wxgb_redis_cmd(a, "SCRIPT", "FLUSH", NULL);
    if (r)
        freeReplyObject(r);
    wxgb_redis_free(a);
    wxg_conf_free(conf);
    return 0;
}
