/*
 * wxguard-bench guard: what the idempotency guard costs Redis, beside a naive design.
 *
 * The wxguard guard in its two designs on the same layout (compact time-bucketed DONE markers,
 * a message's state in its bucket's field): "native" (the default: claim and complete as
 * pipelined native commands) and "lua" (every transition a batched Lua script call). Naive design:
 * two round trips per message, SET key owner NX PX <lease> to claim and SET key D EX <retention> to
 * mark DONE, one key per marker. Seed design: the Node.js middleware wxguard replaced, four plain
 * round trips per message (GET processed:<key>; SET lock:<key> NX PX; the handler; SET
 * processed:<key> EX 7d; DEL lock:<key>) with 64 messages in flight, in two models: "seed", one
 * connection per thread with each step of 64 messages in one round trip (0.063 round trips per
 * message: the messages share them), and "seed-rt", every command its own round trip (send,
 * await the reply, send the next: four per new message) on 64 connections in all, one message
 * in flight on each, a thread polling its share of them.
 * --dup R makes a share R of the native, lua, seed and seed-rt designs' deliveries repeat a
 * message completed one or two batches earlier; without it, each of the native and lua rows is
 * followed by a row of duplicate claims only (the keys it just completed). --rate (bench_rate.c)
 * measures memory per marker at a rate.
 *
 * For each thread count it measures claim+complete pairs per second, Redis CPU per message (the
 * server's used_cpu_sys + used_cpu_user before and after), this process's CPU per message (the
 * client side: a replica's cost) and round trips per message, and runs
 * redis-benchmark with EVALSHA of a comparable one-message claim script at the same client
 * count, in the same run, for the ratio. Then it writes --markers DONE markers with each design
 * and reports Redis's used_memory growth per marker.
 *
 * The database it uses must be empty at start (it is flushed at the end), so it can never eat
 * someone else's data. Point it at a private redis-server.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bench_redis.h"
#include "wxguard/conf.h"
#include "wxguard/guard.h"

/* DESIGN_DUP and DESIGN_NDUP: the lua and native designs claiming again what the row before
 * completed (duplicate claims only). */
enum {
    DESIGN_REAL = 1,
    DESIGN_NAIVE = 2,
    DESIGN_DUP = 4,
    DESIGN_SEED = 8,
    DESIGN_NATIVE = 16,
    DESIGN_NDUP = 32,
    DESIGN_SEED_RT = 64
};

/* The seed's messages in flight (seed and seed-rt): per connection in the seed design, across
 * all the benchmark's threads in the seed-rt design. */
#define SEED_IN_FLIGHT 64

typedef struct opts {
    const char *host;
    int port;
    int db;
    int threads[16];
    int nthreads;
    uint64_t messages;
    int batch;
    int designs;
    uint64_t markers;
    uint64_t rb_requests;
    int memory_threads;
    int64_t bucket_ms;               /* 0 = the guard's default (one bucket per retention) */
    double dup;                      /* share of repeated deliveries in the lua and seed rows */
    int rounds;                      /* rounds of the whole table, designs alternating */
    const char *sets[WXGB_SETS_MAX]; /* --set KEY=VALUE */
    size_t nsets;
    struct wxg_conf_s *conf; /* the keys: the options above, then the --set ones */
    const char *cluster;     /* --cluster: seed nodes of a Redis Cluster, or NULL */
    /* The keys mapped once, for the benchmark's own connections (bench_redis.h): the server,
     * TLS and credentials the guard gets. */
    wxg_guard_conf_t redis;
    char redis_prefix[WXG_GUARD_PREFIX_MAX + 1];
} opts;

typedef struct job {
    const opts *o;
    int design;
    int tid;
    uint64_t count;
    unsigned run;
    const wxg_guard_conf_t *conf;
    int pipelined; /* naive memory phase only: depth o->batch */
    int conns;     /* seed-rt: connections, one message in flight on each */
    uint64_t round_trips;
    uint64_t failures;
    char err[256];
} job;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "wxguard-bench guard: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* A connection to the server the guard is configured for (TLS, AUTH and SELECT included). */
static wxgb_redis_t *connect_admin(const opts *o)
{
    char err[512] = "";
    wxgb_redis_t *c = wxgb_redis_connect(&o->redis, NULL, 0, err, sizeof err);
    if (!c)
        die("cannot connect: %s", err);
    return c;
}

/* A numeric field from INFO <section>. */
double wxgb_info_field(wxgb_redis_t *c, const char *section, const char *field)
{
    redisReply *r = wxgb_redis_cmd(c, "INFO", section, NULL);
    if (!r || r->type != REDIS_REPLY_STRING)
        die("INFO %s failed", section);
    size_t fl = strlen(field);
    double v = -1;
    for (const char *p = r->str; p && *p;) {
        if (strncmp(p, field, fl) == 0 && p[fl] == ':') {
            v = strtod(p + fl + 1, NULL);
            break;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    freeReplyObject(r);
    if (v < 0)
        die("INFO %s has no %s", section, field);
    return v;
}

double wxgb_redis_cpu_s(wxgb_redis_t *c)
{
    return wxgb_info_field(c, "cpu", "used_cpu_sys") + wxgb_info_field(c, "cpu", "used_cpu_user");
}

static void info_string(wxgb_redis_t *c, const char *section, const char *field, char *out,
                        size_t size)
{
    redisReply *r = wxgb_redis_cmd(c, "INFO", section, NULL);
    snprintf(out, size, "?");
    if (r && r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, field);
        if (p) {
            p += strlen(field) + 1;
            size_t n = strcspn(p, "\r\n");
            snprintf(out, size, "%.*s", (int)n, p);
        }
    }
    if (r)
        freeReplyObject(r);
}

static long long dbsize(wxgb_redis_t *c)
{
    redisReply *r = wxgb_redis_cmd(c, "DBSIZE", NULL);
    if (!r || r->type != REDIS_REPLY_INTEGER)
        die("DBSIZE failed%s%s", r ? "" : ": ", r ? "" : wxgb_redis_errstr(c));
    long long n = r->integer;
    freeReplyObject(r);
    return n;
}

static void flushdb(wxgb_redis_t *c)
{
    redisReply *r = wxgb_redis_cmd(c, "FLUSHDB", "SYNC", NULL);
    if (!r || r->type == REDIS_REPLY_ERROR)
        die("FLUSHDB failed");
    freeReplyObject(r);
}

/* A realistic idempotency key: "<account>:n:<server id>". */
static int make_key(char *buf, size_t size, unsigned run, int tid, uint64_t i)
{
    return snprintf(buf, size, "wxid_fakebot%06d:n:%llu", tid,
                    7300000000000000000ULL + (unsigned long long)run * 1000000000ULL + i);
}

/* The key of delivery i of a thread's stream: a share o->dup of deliveries repeat a message that
 * was delivered one or two batches of 64 earlier (so it is DONE by then), the others are new.
 * *unique counts the new ones. Deterministic, so that every design sees the same stream. */
static int delivery_key(const opts *o, char *buf, size_t size, unsigned run, int tid, uint64_t i,
                        uint64_t *unique)
{
    uint64_t h = (i + 1) * 0x9e3779b97f4a7c15ULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    double u01 = (double)(h >> 11) / 9007199254740992.0;
    if (o->dup > 0 && *unique >= 128 && u01 < o->dup)
        return make_key(buf, size, run, tid, *unique - 64 - (h % 64));
    return make_key(buf, size, run, tid, (*unique)++);
}

/* The wxguard design. DESIGN_REAL (DESIGN_NATIVE) claims fresh keys and completes the ones it
 * claimed; DESIGN_DUP (DESIGN_NDUP) claims keys that an earlier run (same run number) completed,
 * so every claim must answer DUPLICATE. */
static void *guard_worker(void *arg)
{
    job *j = arg;
    int dup = j->design == DESIGN_DUP || j->design == DESIGN_NDUP;
    int rc = 0;
    wxg_guard_t *g = wxg_guard_new(j->conf, &rc, j->err, sizeof j->err);
    if (!g) {
        j->failures = j->count;
        return NULL;
    }
    int B = j->o->batch;
    char(*keys)[64] = calloc((size_t)B, sizeof *keys);
    wxg_guard_msg_t *msgs = calloc((size_t)B, sizeof *msgs);
    wxg_guard_claim_t *out = calloc((size_t)B, sizeof *out);
    wxg_guard_ticket_t *t = calloc((size_t)B, sizeof *t);
    int *res = calloc((size_t)B, sizeof *res);
    if (!keys || !msgs || !out || !t || !res)
        die("out of memory");
    unsigned char hash[32] = {1, 2, 3};
    uint64_t unique = 0;
    for (uint64_t done = 0; done < j->count;) {
        size_t n = j->count - done < (uint64_t)B ? (size_t)(j->count - done) : (size_t)B;
        for (size_t i = 0; i < n; i++) {
            int kl = dup ? make_key(keys[i], sizeof keys[i], j->run, j->tid, done + i)
                         : delivery_key(j->o, keys[i], sizeof keys[i], j->run, j->tid, done + i,
                                        &unique);
            msgs[i] = (wxg_guard_msg_t){keys[i], (size_t)kl, hash};
        }
        rc = wxg_guard_claim_batch(g, msgs, n, out);
        if (rc) {
            snprintf(j->err, sizeof j->err, "claim: %s", wxg_guard_last_error(g));
            j->failures += n;
            break;
        }
        size_t nt = 0;
        for (size_t i = 0; i < n; i++) {
            if (dup)
                j->failures += out[i].outcome != WXG_GUARD_DUPLICATE;
            else if (out[i].outcome == WXG_GUARD_CLAIMED)
                t[nt++] = out[i].ticket;
            else if (out[i].outcome != WXG_GUARD_DUPLICATE || j->o->dup <= 0)
                j->failures++;
        }
        if (!dup) {
            rc = wxg_guard_complete_batch(g, t, nt, res);
            if (rc) {
                snprintf(j->err, sizeof j->err, "complete: %s", wxg_guard_last_error(g));
                j->failures += nt;
                break;
            }
            for (size_t i = 0; i < nt; i++)
                j->failures += res[i] != WXG_GUARD_OK;
        }
        for (size_t i = 0; i < n; i++)
            wxg_guard_claim_clear(&out[i]);
        done += n;
    }
    wxg_guard_stats_t st;
    wxg_guard_get_stats(g, &st);
    j->round_trips = st.round_trips;
    free(keys);
    free(msgs);
    free(out);
    free(t);
    free(res);
    wxg_guard_destroy(g);
    return NULL;
}

static void *naive_worker(void *arg)
{
    job *j = arg;
    wxgb_redis_t *c = connect_admin(j->o);
    char key[96], owner[40];
    const char *cl[6] = {"SET", key, owner, "NX", "PX", "30000"};
    const char *dn[5] = {"SET", key, "D", "EX", "604800"};
    size_t cll[6] = {3, 0, 32, 2, 2, 5}, dnl[5] = {3, 0, 1, 2, 6};
    uint64_t depth = j->pipelined ? (uint64_t)j->o->batch : 1;
    for (uint64_t done = 0; done < j->count;) {
        uint64_t n = j->count - done < depth ? j->count - done : depth;
        /* Claim round trip(s), then DONE round trip(s): the pipelined form (memory phase
         * only) sends n of each per round trip. */
        for (int phase = 0; phase < 2; phase++) {
            for (uint64_t i = 0; i < n; i++) {
                char idk[64];
                make_key(idk, sizeof idk, j->run, j->tid, done + i);
                int kl = snprintf(key, sizeof key, "wxgn:%s", idk);
                snprintf(owner, sizeof owner, "%016llx%016llx",
                         (unsigned long long)(done + i) * 0x9e3779b97f4a7c15ULL,
                         (unsigned long long)j->tid);
                cll[1] = dnl[1] = (size_t)kl;
                if (phase == 0)
                    wxgb_redis_append_argv(c, 6, cl, cll);
                else
                    wxgb_redis_append_argv(c, 5, dn, dnl);
            }
            size_t got = 0;
            redisReply **rr = wxgb_redis_replies(c, &got);
            if (!rr)
                die("naive: %s", wxgb_redis_errstr(c));
            for (size_t i = 0; i < got; i++)
                j->failures += rr[i]->type != REDIS_REPLY_STATUS;
            j->round_trips++;
        }
        done += n;
    }
    wxgb_redis_free(c);
    return NULL;
}

/* Reads n replies; counts those of the wrong type (want: a REDIS_REPLY_* type, or -1 for any
 * non-error reply) and stores in ok[i] whether reply i was a nil (nil_ok) or a non-nil. */
static void seed_replies(wxgb_redis_t *c, size_t n, int nil_ok, unsigned char *ok, job *j)
{
    size_t got = 0;
    redisReply **rr = wxgb_redis_replies(c, &got);
    if (!rr || got != n)
        die("seed: %s", wxgb_redis_errstr(c));
    for (size_t i = 0; i < n; i++) {
        if (rr[i]->type == REDIS_REPLY_ERROR)
            j->failures++;
        if (ok)
            ok[i] = nil_ok ? rr[i]->type == REDIS_REPLY_NIL : rr[i]->type != REDIS_REPLY_NIL;
    }
    j->round_trips++;
}

/* The seed's two keys of delivery i of the thread's stream (delivery_key): processed:<key> and
 * lock:<key>, each of 96 bytes. */
static void seed_keys(const job *j, uint64_t i, uint64_t *unique, char *pk, char *lk)
{
    char key[64];
    delivery_key(j->o, key, sizeof key, j->run, j->tid, i, unique);
    snprintf(pk, 96, "seed:processed:%.63s", key);
    snprintf(lk, 96, "seed:lock:%.63s", key);
}

/* The seed's design with 64 messages in flight: each of its four steps for a batch of 64
 * deliveries in one round trip (GET processed; SET lock NX PX for the unprocessed; the handler,
 * which does nothing; SET processed EX 7d and DEL lock for the locked ones). */
static void *seed_worker(void *arg)
{
    job *j = arg;
    wxgb_redis_t *c = connect_admin(j->o);
    enum { D = SEED_IN_FLIGHT };
    char pk[D][96], lk[D][96], owner[40];
    unsigned char fresh[D], locked[D];
    uint64_t unique = 0;
    for (uint64_t done = 0; done < j->count;) {
        size_t n = j->count - done < D ? (size_t)(j->count - done) : D;
        for (size_t i = 0; i < n; i++) {
            seed_keys(j, done + i, &unique, pk[i], lk[i]);
            wxgb_redis_append(c, "GET", pk[i], NULL);
        }
        seed_replies(c, n, 1, fresh, j);
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            if (!fresh[i])
                continue;
            snprintf(owner, sizeof owner, "%016llx", (unsigned long long)(done + i));
            wxgb_redis_append(c, "SET", lk[i], owner, "NX", "PX", "30000", NULL);
            m++;
        }
        if (m > 0) {
            seed_replies(c, m, 0, locked, j);
            size_t k = 0, w = 0;
            for (size_t i = 0; i < n; i++) {
                if (fresh[i] && locked[k++]) {
                    wxgb_redis_append(c, "SET", pk[i], "1", "EX", "604800", NULL);
                    w++;
                }
            }
            seed_replies(c, w, 0, NULL, j);
            for (size_t i = 0, q = 0; i < n; i++) {
                if (fresh[i] && locked[q++])
                    wxgb_redis_append(c, "DEL", lk[i], NULL);
            }
            seed_replies(c, w, 0, NULL, j);
            j->failures += m - w;
        }
        done += n;
    }
    wxgb_redis_free(c);
    return NULL;
}

/* ---- The seed with its own round trips (seed-rt) ----
 *
 * The seed's design as the Node.js middleware runs it: every command its own round trip (sent
 * alone, its reply awaited before the next), four per new message, and SEED_IN_FLIGHT messages
 * in flight in all. Each thread holds j->conns connections (run_design_on divides
 * SEED_IN_FLIGHT among the threads: 16 each at 4 threads; at least one each, so above 64
 * threads there are as many in flight as threads). A connection carries one message at a time
 * through its steps, and the thread polls the sockets of the connections waiting for a reply.
 * The steps and counters are the seed design's: a duplicate ends at its GET; a refused lock
 * or an error reply is a failure and ends the message. Any I/O failure, or no reply within the
 * command timeout, ends the benchmark. */

enum { SEED_IDLE, SEED_GET, SEED_LOCK, SEED_MARK, SEED_UNLOCK };

typedef struct seed_conn {
    wxgb_redis_t *c;
    int step;   /* the command awaiting its reply, or SEED_IDLE */
    short wait; /* poll events it waits for; 0: it has news to read */
    uint64_t msg;
    char pk[96], lk[96];
} seed_conn;

/* Starts the thread's next delivery on s (its GET), or leaves s idle when none is left.
 * Returns 1 when s carries a message. */
static int seed_rt_next(job *j, seed_conn *s, uint64_t *next, uint64_t *unique)
{
    if (*next >= j->count) {
        s->step = SEED_IDLE;
        return 0;
    }
    s->msg = (*next)++;
    seed_keys(j, s->msg, unique, s->pk, s->lk);
    s->step = SEED_GET;
    wxgb_redis_append(s->c, "GET", s->pk, NULL);
    return 1;
}

/* The reply r to s's command: appends the message's next command, or ends the message and
 * starts the next. Returns 1 when s still carries a message. */
static int seed_rt_reply(job *j, seed_conn *s, const redisReply *r, uint64_t *next,
                         uint64_t *unique)
{
    j->round_trips++;
    int end = r->type == REDIS_REPLY_ERROR;
    j->failures += (uint64_t)end;
    if (!end && s->step == SEED_GET) {
        end = r->type != REDIS_REPLY_NIL; /* processed already: a duplicate */
        if (!end) {
            char owner[40];
            snprintf(owner, sizeof owner, "%016llx", (unsigned long long)s->msg);
            wxgb_redis_append(s->c, "SET", s->lk, owner, "NX", "PX", "30000", NULL);
        }
    } else if (!end && s->step == SEED_LOCK) {
        end = r->type == REDIS_REPLY_NIL; /* locked by another: a failure */
        j->failures += (uint64_t)end;
        if (!end) /* the handler, which does nothing, then the DONE mark */
            wxgb_redis_append(s->c, "SET", s->pk, "1", "EX", "604800", NULL);
    } else if (!end && s->step == SEED_MARK) {
        wxgb_redis_append(s->c, "DEL", s->lk, NULL);
    } else {
        end = 1;
    }
    if (end)
        return seed_rt_next(j, s, next, unique);
    s->step++;
    return 1;
}

static void *seed_rt_worker(void *arg)
{
    job *j = arg;
    int n = j->conns;
    int timeout_ms = j->o->redis.command_timeout_ms > 0 ? j->o->redis.command_timeout_ms : 30000;
    seed_conn *sc = calloc((size_t)n, sizeof *sc);
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    int *who = calloc((size_t)n, sizeof *who);
    if (!sc || !pf || !who)
        die("out of memory");
    uint64_t next = 0, unique = 0;
    int busy = 0;
    for (int i = 0; i < n; i++) {
        sc[i].c = connect_admin(j->o);
        busy += seed_rt_next(j, &sc[i], &next, &unique);
    }
    while (busy > 0) {
        /* Send what was appended and read what has come on every connection with news; the
         * others keep waiting. */
        int np = 0;
        for (int i = 0; i < n; i++) {
            seed_conn *s = &sc[i];
            while (s->step != SEED_IDLE && s->wait == 0) {
                size_t got = 0;
                redisReply **rr = wxgb_redis_replies_some(s->c, &got, &s->wait);
                if (!rr && s->wait == 0)
                    die("seed-rt: %s", wxgb_redis_errstr(s->c));
                if (rr && got == 1)
                    busy -= !seed_rt_reply(j, s, rr[0], &next, &unique);
                else if (rr)
                    die("seed-rt: %zu replies to one command", got);
            }
            if (s->step != SEED_IDLE) {
                pf[np] = (struct pollfd){.fd = wxgb_redis_fd(s->c), .events = s->wait};
                who[np++] = i;
            }
        }
        if (np == 0)
            continue;
        int pr = poll(pf, (nfds_t)np, timeout_ms);
        if (pr < 0 && errno != EINTR)
            die("seed-rt: poll: %s", strerror(errno));
        if (pr == 0)
            die("seed-rt: no reply within %d ms", timeout_ms);
        for (int k = 0; pr > 0 && k < np; k++)
            if (pf[k].revents)
                sc[who[k]].wait = 0;
    }
    for (int i = 0; i < n; i++)
        wxgb_redis_free(sc[i].c);
    free(sc);
    free(pf);
    free(who);
    return NULL;
}

static wxg_guard_conf_t real_conf(const opts *o, char *prefix, size_t psize, unsigned run,
                                  uint64_t markers)
{
    /* Everything the keys say, mapped as wxguard-consumer maps them; then what has no key: a
     * prefix of the run's own, and the bucket sizing below. */
    wxg_guard_conf_t c;
    char mapped_prefix[WXG_GUARD_PREFIX_MAX + 1];
    wxgb_conf_guard(o->conf, &c, mapped_prefix, sizeof mapped_prefix);
    snprintf(prefix, psize, "wxgb%u:", run);
    if (o->cluster)
        c.cluster_nodes = o->cluster;
    c.prefix = prefix;
    /* The run compresses a time bucket's worth of markers into seconds: size the buckets for
     * the density one time bucket has in steady state when it holds `markers` markers. */
    c.done_bucket_ms = o->bucket_ms;
    /* The guard's default width is the retention (docs/guard.md §3.3). */
    double width_s = (o->bucket_ms > 0 ? (double)o->bucket_ms : (double)c.done_retention_ms) / 1000;
    c.done_expected_rate = (double)markers / width_s;
    return c;
}

typedef struct run_result {
    double pairs_per_s;
    double cpu_us_per_msg;
    double round_trips_per_msg;
    double calls_per_msg; /* data commands Redis ran (INFO commandstats), scripts' included */
    double client_cpu_us_per_msg; /* this process's CPU (user + system) over the run */
    uint64_t failures;
} run_result;

/* This process's CPU time so far, in µs (every thread: during a run, the workers). */
static double process_cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* The number of data commands Redis has run so far, from INFO commandstats: every command
 * counted there except the script calls themselves and the benchmark's own administration, so
 * the commands a script makes with redis.call() are what is counted for the guard. */
double wxgb_data_calls(wxgb_redis_t *c)
{
    static const char *const skip[] = {"evalsha", "eval", "info",   "script", "ping",
                                       "select",  "wait", "config", "dbsize", "flushdb",
                                       "hello",   "auth", "client", "command"};
    redisReply *r = wxgb_redis_cmd(c, "INFO", "commandstats", NULL);
    if (!r || r->type != REDIS_REPLY_STRING)
        die("INFO commandstats failed");
    double total = 0;
    for (const char *p = strstr(r->str, "cmdstat_"); p; p = strstr(p + 1, "cmdstat_")) {
        const char *name = p + 8, *colon = strchr(name, ':');
        const char *calls = colon ? strstr(colon, "calls=") : NULL;
        if (!calls)
            break;
        size_t nl = (size_t)(colon - name);
        int skipped = 0;
        for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
            skipped |= strlen(skip[i]) == nl && strncmp(skip[i], name, nl) == 0;
        if (!skipped)
            total += strtod(calls + 6, NULL);
    }
    freeReplyObject(r);
    return total;
}

/* Redis CPU seconds and data calls, summed over the servers (one, or every primary of a
 * cluster); node_cpu (may be NULL) receives each server's CPU. */
static double cpu_sum(wxgb_redis_t **admins, int n, double *node_cpu)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double v = wxgb_redis_cpu_s(admins[i]);
        if (node_cpu)
            node_cpu[i] = v;
        sum += v;
    }
    return sum;
}

static double calls_sum(wxgb_redis_t **admins, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += wxgb_data_calls(admins[i]);
    return sum;
}

static run_result run_design_on(const opts *o, wxgb_redis_t **admins, int nadmin, int design,
                                int threads, uint64_t messages, unsigned run, int pipelined,
                                double *node_cpu_us);

static run_result run_design(const opts *o, wxgb_redis_t *admin, int design, int threads,
                             uint64_t messages, unsigned run, int pipelined)
{
    return run_design_on(o, &admin, 1, design, threads, messages, run, pipelined, NULL);
}

/* run_design over nadmin servers; node_cpu_us (may be NULL) receives each one's Redis CPU per
 * message. */
static run_result run_design_on(const opts *o, wxgb_redis_t **admins, int nadmin, int design,
                                int threads, uint64_t messages, unsigned run, int pipelined,
                                double *node_cpu_us)
{
    char prefix[32];
    wxg_guard_conf_t conf = real_conf(o, prefix, sizeof prefix, run, messages);
    conf.design = design == DESIGN_NATIVE || design == DESIGN_NDUP ? WXG_GUARD_DESIGN_NATIVE
                                                                   : WXG_GUARD_DESIGN_LUA;
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!jobs || !th)
        die("out of memory");
    for (int i = 0; i < threads; i++) {
        jobs[i] = (job){.o = o,
                        .design = design,
                        .tid = i,
                        .count = messages / (uint64_t)threads +
                                 ((uint64_t)i < messages % (uint64_t)threads),
                        .run = run,
                        .conf = &conf,
                        .pipelined = pipelined,
                        .conns = SEED_IN_FLIGHT / threads + (i < SEED_IN_FLIGHT % threads)};
        if (jobs[i].conns == 0)
            jobs[i].conns = 1;
    }
    double node0[64], node1[64];
    double calls0 = calls_sum(admins, nadmin);
    double cpu0 = cpu_sum(admins, nadmin, node0);
    double pcpu0 = process_cpu_us();
    int64_t t0 = prog_mono_us();
    for (int i = 0; i < threads; i++) {
        void *(*fn)(void *) = design == DESIGN_NAIVE     ? naive_worker
                              : design == DESIGN_SEED    ? seed_worker
                              : design == DESIGN_SEED_RT ? seed_rt_worker
                                                         : guard_worker;
        if (pthread_create(&th[i], NULL, fn, &jobs[i]) != 0)
            die("pthread_create failed");
    }
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    int64_t t1 = prog_mono_us();
    double pcpu1 = process_cpu_us();
    double cpu1 = cpu_sum(admins, nadmin, node1);
    double calls1 = calls_sum(admins, nadmin);
    for (int i = 0; node_cpu_us && i < nadmin; i++)
        node_cpu_us[i] = (node1[i] - node0[i]) * 1e6 / (double)messages;
    run_result r = {0};
    uint64_t rt = 0;
    for (int i = 0; i < threads; i++) {
        r.failures += jobs[i].failures;
        rt += jobs[i].round_trips;
        if (jobs[i].err[0])
            fprintf(stderr, "thread %d: %s\n", i, jobs[i].err);
    }
    r.pairs_per_s = (double)messages / ((double)(t1 - t0) / 1e6);
    r.cpu_us_per_msg = (cpu1 - cpu0) * 1e6 / (double)messages;
    r.round_trips_per_msg = (double)rt / (double)messages;
    r.calls_per_msg = (calls1 - calls0) / (double)messages;
    r.client_cpu_us_per_msg = (pcpu1 - pcpu0) / (double)messages;
    free(jobs);
    free(th);
    return r;
}

/* The one-message script redis-benchmark runs: the core of a claim of a new message (read the
 * clock, probe two DONE buckets, create the record with its TTL). */
static const char rb_script[] =
    "local t = redis.call('TIME')\n"
    "if redis.call('HGET', 'rb:{x}:d:1', KEYS[1]) then return 2 end\n"
    "if redis.call('HGET', 'rb:{x}:d:0', KEYS[1]) then return 2 end\n"
    "local old = redis.call('SET', KEYS[1], 'P|' .. ARGV[1] .. '|1|0|1|' .. t[1], 'NX', 'GET',\n"
    "                       'PX', 30000)\n"
    "if old then return 3 end\n"
    "return 1\n";

/* Runs redis-benchmark as a child process and returns its requests per second, or -1. It
 * reaches the server the guard is configured for, over TLS with the same files when redis.tls
 * is set; a password is never put on a command line, so against a server that wants one it
 * fails and the row says n/a. */
static double redis_benchmark(const opts *o, const char *sha, int clients)
{
    const wxg_guard_conf_t *rc = &o->redis;
    char port[16], c[16], n[32], db[16];
    snprintf(port, sizeof port, "%d", rc->port);
    snprintf(c, sizeof c, "%d", clients);
    snprintf(n, sizeof n, "%llu", (unsigned long long)o->rb_requests);
    snprintf(db, sizeof db, "%d", rc->db);
    const char *argv[40];
    int k = 0;
    argv[k++] = "redis-benchmark";
    if (rc->unix_path) {
        argv[k++] = "-s";
        argv[k++] = rc->unix_path;
    } else {
        argv[k++] = "-h";
        argv[k++] = rc->host;
        argv[k++] = "-p";
        argv[k++] = port;
    }
    if (rc->tls) {
        static const char *const flag[] = {"--cacert", "--cacertdir", "--cert", "--key", "--sni"};
        const char *val[] = {rc->tls_ca_file, rc->tls_ca_path, rc->tls_cert_file, rc->tls_key_file,
                             rc->tls_server_name};
        argv[k++] = "--tls";
        for (size_t i = 0; i < sizeof flag / sizeof flag[0]; i++) {
            if (val[i]) {
                argv[k++] = flag[i];
                argv[k++] = val[i];
            }
        }
        if (!rc->tls_verify)
            argv[k++] = "--insecure";
    }
    const char *tail[] = {"--dbnum",
                          db,
                          "-c",
                          c,
                          "-n",
                          n,
                          "-r",
                          "100000000",
                          "-q",
                          "EVALSHA",
                          sha,
                          "1",
                          "rb:{x}:__rand_int__",
                          "0123456789abcdef0123456789abcdef"};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++)
        argv[k++] = tail[i];
    argv[k] = NULL;
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execvp("redis-benchmark", (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    char buf[8192];
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fds[0], buf + len, sizeof buf - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == sizeof buf - 1) {
            /* keep the tail: the final line is what matters */
            memmove(buf, buf + len / 2, len - len / 2);
            len -= len / 2;
        }
    }
    buf[len] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    /* "-q" prints "EVALSHA ...: 41152.26 requests per second, p50=..." (after \r updates). */
    char *last = NULL;
    for (char *p = strstr(buf, "requests per second"); p; p = strstr(p + 1, "requests per second"))
        last = p;
    if (!last)
        return -1;
    char *q = last;
    while (q > buf && q[-1] == ' ')
        q--;
    while (q > buf && ((q[-1] >= '0' && q[-1] <= '9') || q[-1] == '.'))
        q--;
    return strtod(q, NULL);
}

static void memory_phase(const opts *o, wxgb_redis_t *admin, int design, unsigned run,
                         double *bytes_per_marker, double *seconds, uint64_t *failures)
{
    flushdb(admin);
    double m0 = wxgb_info_field(admin, "memory", "used_memory");
    int64_t t0 = prog_mono_us();
    run_result r = run_design(o, admin, design, o->memory_threads, o->markers, run, 1);
    *seconds = (double)(prog_mono_us() - t0) / 1e6;
    double m1 = wxgb_info_field(admin, "memory", "used_memory");
    *bytes_per_marker = (m1 - m0) / (double)o->markers;
    *failures = r.failures;
}

/* "native,lua,naive,seed,seed-rt" -> design bits; exits on an unknown name. */
static int parse_designs(const char *list)
{
    int d = 0;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n == 3 && strncmp(p, "lua", 3) == 0)
            d |= DESIGN_REAL;
        else if (n == 6 && strncmp(p, "native", 6) == 0)
            d |= DESIGN_NATIVE;
        else if (n == 5 && strncmp(p, "naive", 5) == 0)
            d |= DESIGN_NAIVE;
        else if (n == 4 && strncmp(p, "seed", 4) == 0)
            d |= DESIGN_SEED;
        else if (n == 7 && strncmp(p, "seed-rt", 7) == 0)
            d |= DESIGN_SEED_RT;
        else
            die("unknown design '%.*s' (native, lua, naive, seed, seed-rt)", (int)n, p);
        p += n;
        if (*p == ',')
            p++;
    }
    return d;
}

/* A design's row label in the table. */
static const char *design_label(int d)
{
    static const struct {
        int design;
        const char *label;
    } labels[] = {{DESIGN_REAL, "lua (batched, compact)"},
                  {DESIGN_NATIVE, "native (pipelined, compact)"},
                  {DESIGN_DUP, "lua, duplicate claims only"},
                  {DESIGN_NDUP, "native, duplicate claims only"},
                  {DESIGN_SEED, "seed (4 round trips, 64 in flight)"},
                  {DESIGN_SEED_RT, "seed (4 round trips per message, 64 in flight)"}};
    for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++)
        if (labels[i].design == d)
            return labels[i].label;
    return "naive (SET NX + SET EX)";
}

static void usage(FILE *f)
{
    fprintf(f, "usage: wxguard-bench guard [--naive|--real] [--host H] [--port P] [--db N]\n"
               "          [--threads 1,4,8,16] [--messages N] [--batch B] [--markers M]\n"
               "          [--rb-requests N] [--set KEY=VALUE ...] [--cluster HOST:PORT,...]\n\n"
               "Runs both designs unless --naive or --real picks one. The database must be empty;\n"
               "it is flushed when the run ends. Use a private redis-server.\n"
               "  --messages N     claim+complete pairs per thread count (default 40000)\n"
               "  --batch B        messages per guard script call (default 64)\n"
               "  --markers M      DONE markers written for the memory figure (default 1000000,\n"
               "                   0 skips the memory phase)\n"
               "  --bucket-ms W    DONE time-bucket width (default: the retention, 7 days);\n"
               "                   claim probes retention / W + 1 buckets\n"
               "  --rb-requests N  redis-benchmark EVALSHA requests per client count (default "
               "50000; 0 skips it)\n"
               "  --design LIST    designs to run, alternating: native, lua, naive, seed, seed-rt\n"
               "                   (default native,lua,naive); seed = GET, SET NX PX, SET EX, DEL\n"
               "                   per message, each step of 64 messages in one round trip;\n"
               "                   seed-rt = the same four commands, each its own round trip,\n"
               "                   on 64 connections in all (64 / threads per thread), one\n"
               "                   message in flight on each\n"
               "  --dup R          share of deliveries (native, lua, seed, seed-rt) that repeat a\n"
               "                   finished message\n"
               "  --rounds N       run the whole table N times (default 1)\n"
               "  --rate LIST      instead of the above: memory per DONE marker at steady state\n"
               "                   for each rate (messages/s), e.g. 10,100,1000,10000,100000\n"
               "  --rate-markers M markers written per rate (default 300000)\n"
               "  --set KEY=VALUE  any redis.*, guard.* or consumer.* key of wxguard-consumer\n"
               "                   (docs/configuration.md), mapped as the consumer maps it; wins\n"
               "                   over the options above. redis.key.prefix is replaced by a\n"
               "                   prefix per run; redis.command.timeout.ms defaults to 30s here\n"
               "  --cluster NODES  a Redis Cluster (seed nodes) instead of one server: the native\n"
               "                   and lua designs over every primary, with each primary's Redis\n"
               "                   CPU\n");
}

/* ---- Against a Redis Cluster (--cluster) ----
 *
 * The native and lua designs only (the naive and seed designs and redis-benchmark talk to one
 * server), over every primary: the table adds each primary's Redis CPU per message beside their
 * sum, which stays flat as primaries are added when the work is spread rather than repeated.
 * The probes of each primary use the guard's TLS settings and credentials, as its nodes'
 * connections do. */

#define CLUSTER_PRIMARIES_MAX 64

int wxgb_cluster_primaries(const char *seeds, const wxg_guard_conf_t *gc, wxgb_redis_t **out,
                           char (*names)[300], int max)
{
    char host[256];
    int port = 0;
    size_t len = strcspn(seeds, ",");
    char first[300];
    snprintf(first, sizeof first, "%.*s", (int)len, seeds);
    if (wxg_conf_parse_addr(first, host, sizeof host, &port) != 0)
        die("--cluster: \"%s\" is not host:port", first);
    char err[512] = "";
    wxgb_redis_t *c = wxgb_redis_connect(gc, host, port, err, sizeof err);
    if (!c)
        die("cannot connect to %s: %s", first, err);
    redisReply *r = wxgb_redis_cmd(c, "CLUSTER", "SLOTS", NULL);
    if (!r || r->type != REDIS_REPLY_ARRAY)
        die("CLUSTER SLOTS failed on %s", first);
    int n = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i]->element[2];
        char name[300];
        snprintf(name, sizeof name, "%.256s:%lld", e->element[0]->len ? e->element[0]->str : host,
                 e->element[1]->integer);
        int seen = 0;
        for (int k = 0; k < n; k++)
            seen |= strcmp(names[k], name) == 0;
        if (seen || n == max)
            continue;
        snprintf(names[n], 300, "%s", name);
        out[n] = wxgb_redis_connect(gc, e->element[0]->len ? e->element[0]->str : host,
                                    (int)e->element[1]->integer, err, sizeof err);
        if (!out[n])
            die("cannot connect to primary %s: %s", name, err);
        n++;
    }
    freeReplyObject(r);
    wxgb_redis_free(c);
    return n;
}

static int cluster_main(const opts *o)
{
    if (o->designs & ~(DESIGN_NATIVE | DESIGN_REAL | DESIGN_DUP))
        fprintf(stderr, "wxguard-bench guard: --cluster runs the native and lua designs only\n");
    wxgb_redis_t *admins[CLUSTER_PRIMARIES_MAX];
    char names[CLUSTER_PRIMARIES_MAX][300];
    int n = wxgb_cluster_primaries(o->cluster, &o->redis, admins, names, CLUSTER_PRIMARIES_MAX);
    for (int i = 0; i < n; i++)
        if (dbsize(admins[i]) != 0)
            die("primary %s is not empty; this benchmark flushes the primaries, so it only runs "
                "on an empty cluster",
                names[i]);
    printf("## wxguard-bench guard --cluster\n\n- %d primaries:", n);
    for (int i = 0; i < n; i++)
        printf(" %s", names[i]);
    printf("\n- messages per row: %llu, guard batch: %d, duplicates: %.0f %%\n\n",
           (unsigned long long)o->messages, o->batch, o->dup * 100);
    printf(
        "| design | threads | messages/s | Redis round trips/msg | Redis commands/msg | Redis "
        "CPU µs/msg (sum) | per primary | failures |\n|---|---:|---:|---:|---:|---:|---|---:|\n");
    fflush(stdout);
    unsigned run = 1;
    static const int designs[2] = {DESIGN_NATIVE, DESIGN_REAL};
    for (int round = 0; round < o->rounds; round++) {
        for (int ti = 0; ti < o->nthreads; ti++) {
            for (int k = 0; k < 2; k++) {
                int d = designs[k];
                if (!(o->designs & d))
                    continue;
                double per[CLUSTER_PRIMARIES_MAX];
                run_result rr =
                    run_design_on(o, admins, n, d, o->threads[ti], o->messages, run++, 0, per);
                char list[512] = "";
                for (int i = 0; i < n; i++) {
                    size_t l = strlen(list);
                    snprintf(list + l, sizeof list - l, "%s%.2f", i ? " / " : "", per[i]);
                }
                printf("| %s | %d | %.0f | %.3f | %.2f | %.2f | %s | %llu |\n",
                       d == DESIGN_REAL ? "lua (batched, compact)" : "native (pipelined, compact)",
                       o->threads[ti], rr.pairs_per_s, rr.round_trips_per_msg, rr.calls_per_msg,
                       rr.cpu_us_per_msg, list, (unsigned long long)rr.failures);
                fflush(stdout);
            }
        }
    }
    for (int i = 0; i < n; i++) {
        flushdb(admins[i]);
        wxgb_redis_free(admins[i]);
    }
    return 0;
}

int wxgb_guard_main(int argc, char **argv)
{
    opts o = {.host = "127.0.0.1",
              .port = 6379,
              .threads = {1, 4, 8, 16},
              .nthreads = 4,
              .messages = 40000,
              .batch = 64,
              .designs = DESIGN_NATIVE | DESIGN_REAL | DESIGN_NAIVE,
              .markers = 1000000,
              .rb_requests = 50000,
              .memory_threads = 4,
              .rounds = 1};
    const char *rates = NULL;
    uint64_t rate_markers = 300000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u = 0;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--naive") == 0) {
            o.designs = DESIGN_NAIVE;
        } else if (strcmp(a, "--real") == 0) {
            o.designs = DESIGN_NATIVE | DESIGN_REAL;
        } else if (strcmp(a, "--design") == 0 && v) {
            o.designs = parse_designs(v);
            i++;
        } else if (strcmp(a, "--dup") == 0 && v) {
            char *end = NULL;
            o.dup = strtod(v, &end);
            if (*end || o.dup < 0 || o.dup > 0.9)
                die("bad --dup");
            i++;
        } else if (strcmp(a, "--rounds") == 0 && v && wxgb_parse_u64(v, &u) == 0 && u > 0 &&
                   u < 100) {
            o.rounds = (int)u;
            i++;
        } else if (strcmp(a, "--rate") == 0 && v) {
            rates = v;
            i++;
        } else if (strcmp(a, "--rate-markers") == 0 && v && wxgb_parse_u64(v, &u) == 0 && u > 0) {
            rate_markers = u;
            i++;
        } else if (strcmp(a, "--host") == 0 && v) {
            o.host = v;
            i++;
        } else if (strcmp(a, "--port") == 0 && v && wxgb_parse_u64(v, &u) == 0 && u < 65536) {
            o.port = (int)u;
            i++;
        } else if (strcmp(a, "--db") == 0 && v) {
            if (strcmp(v, "0") == 0)
                o.db = 0;
            else if (wxgb_parse_u64(v, &u) == 0 && u < 16)
                o.db = (int)u;
            else
                die("bad --db");
            i++;
        } else if (strcmp(a, "--threads") == 0 && v) {
            o.nthreads = wxgb_parse_list(v, o.threads, 16);
            if (o.nthreads < 0)
                die("bad --threads list '%s'", v);
            i++;
        } else if (strcmp(a, "--messages") == 0 && v && wxgb_parse_u64(v, &u) == 0) {
            o.messages = u;
            i++;
        } else if (strcmp(a, "--batch") == 0 && v && wxgb_parse_u64(v, &u) == 0 && u <= 1024) {
            o.batch = (int)u;
            i++;
        } else if (strcmp(a, "--markers") == 0 && v) {
            if (strcmp(v, "0") == 0)
                o.markers = 0;
            else if (wxgb_parse_u64(v, &u) == 0)
                o.markers = u;
            else
                die("bad --markers");
            i++;
        } else if (strcmp(a, "--bucket-ms") == 0 && v && wxgb_parse_u64(v, &u) == 0) {
            o.bucket_ms = (int64_t)u;
            i++;
        } else if (strcmp(a, "--rb-requests") == 0 && v &&
                   (strcmp(v, "0") == 0 || wxgb_parse_u64(v, &u) == 0)) {
            u = strcmp(v, "0") == 0 ? 0 : u;
            o.rb_requests = u;
            i++;
        } else if (strcmp(a, "--cluster") == 0 && v) {
            o.cluster = v;
            i++;
        } else if (strcmp(a, "--set") == 0 && v && o.nsets < WXGB_SETS_MAX) {
            o.sets[o.nsets++] = v;
            i++;
        } else {
            usage(stderr);
            return 2;
        }
    }
    char *props = wxgb_props("redis.host = %s\nredis.port = %d\nredis.db = %d\n"
                             "consumer.batch.max = %d\nredis.command.timeout.ms = 30s\n",
                             o.host, o.port, o.db, o.batch);
    o.conf = wxgb_conf_new(props, o.sets, o.nsets);
    free(props);
    wxgb_conf_guard(o.conf, &o.redis, o.redis_prefix, sizeof o.redis_prefix);
    signal(SIGPIPE, SIG_IGN);
    if (o.cluster) {
        int rc = cluster_main(&o);
        wxg_conf_free(o.conf);
        return rc;
    }
    wxgb_redis_t *admin = connect_admin(&o);
    if (dbsize(admin) != 0)
        die("database %d on %s:%d is not empty; this benchmark flushes its database, so it "
            "only runs on an empty one",
            o.redis.db, o.redis.host, o.redis.port);
    if (rates) {
        int rc = wxgb_rate_run(admin, o.conf, rates, rate_markers);
        flushdb(admin);
        wxgb_redis_free(admin);
        wxg_conf_free(o.conf);
        return rc;
    }
    /* Valkey answers redis_version with the Redis version it is compatible with; its own is
     * valkey_version. */
    char version[64], cpu[128] = "?";
    const char *server = "valkey-server";
    info_string(admin, "server", "valkey_version", version, sizeof version);
    if (strcmp(version, "?") == 0) {
        server = "redis-server";
        info_string(admin, "server", "redis_version", version, sizeof version);
    }
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[256];
        while (fgets(line, sizeof line, ci)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *p = strchr(line, ':');
                if (p)
                    snprintf(cpu, sizeof cpu, "%.*s", (int)strcspn(p + 2, "\n"), p + 2);
                break;
            }
        }
        fclose(ci);
    }
    redisReply *r = wxgb_redis_cmd(admin, "SCRIPT", "LOAD", rb_script, NULL);
    if (!r || r->type != REDIS_REPLY_STRING)
        die("SCRIPT LOAD failed");
    char sha[41];
    snprintf(sha, sizeof sha, "%s", r->str);
    freeReplyObject(r);

    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("## wxguard-bench guard\n\n");
    printf("- date: %s\n- machine: %ld CPUs, %s\n- %s %s at %s:%d db %d\n", date,
           sysconf(_SC_NPROCESSORS_ONLN), cpu, server, version, o.redis.host, o.redis.port,
           o.redis.db);
    printf("- messages per row: %llu, guard batch: %d, DONE bucket width: %lld ms, duplicates "
           "(native, lua, seed%s): %.0f %%\n\n",
           (unsigned long long)o.messages, o.batch,
           (long long)(o.bucket_ms > 0 ? o.bucket_ms : 7LL * 86400000),
           o.designs & DESIGN_SEED_RT ? ", seed-rt" : "", o.dup * 100);
    printf("| design | threads | messages/s (claim+complete pairs without duplicates) | "
           "redis-benchmark EVALSHA/s (same "
           "clients) | ratio | Redis round trips/msg | Redis commands/msg | Redis CPU µs/msg | "
           "client CPU µs/msg | failures |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    fflush(stdout);
    unsigned run = 1, real_run = 0, native_run = 0;
    for (int round = 0; round < o.rounds; round++) {
        for (int ti = 0; ti < o.nthreads; ti++) {
            int t = o.threads[ti];
            double rb = o.rb_requests > 0 ? redis_benchmark(&o, sha, t) : -1;
            for (int d = DESIGN_REAL; d <= DESIGN_SEED_RT; d *= 2) {
                int of = d == DESIGN_DUP ? DESIGN_REAL : d == DESIGN_NDUP ? DESIGN_NATIVE : d;
                if (!(o.designs & of))
                    continue;
                if ((d == DESIGN_DUP || d == DESIGN_NDUP) && o.dup > 0)
                    continue; /* the design's row already mixes duplicates in */
                /* A duplicate row claims again the keys its design's row just completed (same
                 * run number, so the same prefix and keys): claims only, every one DUPLICATE. */
                unsigned use = d == DESIGN_DUP ? real_run : d == DESIGN_NDUP ? native_run : run++;
                if (d == DESIGN_REAL)
                    real_run = use;
                if (d == DESIGN_NATIVE)
                    native_run = use;
                run_result rr = run_design(&o, admin, d, t, o.messages, use, 0);
                char rbs[32] = "n/a", ratio[32] = "n/a";
                if (rb > 0) {
                    snprintf(rbs, sizeof rbs, "%.0f", rb);
                    snprintf(ratio, sizeof ratio, "%.2f", rr.pairs_per_s / rb);
                }
                printf("| %s | %d | %.0f | %s | %s | %.3f | %.2f | %.2f | %.2f | %llu |\n",
                       design_label(d), t, rr.pairs_per_s, rbs, ratio, rr.round_trips_per_msg,
                       rr.calls_per_msg, rr.cpu_us_per_msg, rr.client_cpu_us_per_msg,
                       (unsigned long long)rr.failures);
                fflush(stdout);
            }
        }
    }
    if (o.markers > 0) {
        printf("\n| design | DONE markers | used_memory growth per marker (bytes) | write time "
               "(s) | failures |\n|---|---:|---:|---:|---:|\n");
        fflush(stdout);
        static const int mem_designs[3] = {DESIGN_NATIVE, DESIGN_REAL, DESIGN_NAIVE};
        for (int k = 0; k < 3; k++) {
            int d = mem_designs[k];
            if (!(o.designs & d))
                continue;
            double bpm = 0, secs = 0;
            uint64_t fails = 0;
            memory_phase(&o, admin, d, run++, &bpm, &secs, &fails);
            if (d != DESIGN_NAIVE) {
                /* Say which geometry the figure belongs to. */
                char prefix[32], layout[256] = "";
                wxg_guard_conf_t c = real_conf(&o, prefix, sizeof prefix, run - 1, o.markers);
                wxg_guard_t *g = wxg_guard_new(&c, NULL, NULL, 0);
                if (g) {
                    wxg_guard_describe_layout(g, layout, sizeof layout);
                    wxg_guard_destroy(g);
                }
                fprintf(stderr, "real-design layout: %s\n", layout);
            }
            printf("| %s | %llu | %.1f | %.1f | %llu |\n",
                   d == DESIGN_REAL     ? "wxguard compact marker (lua)"
                   : d == DESIGN_NATIVE ? "wxguard compact marker (native)"
                                        : "naive key per marker",
                   (unsigned long long)o.markers, bpm, secs, (unsigned long long)fails);
            fflush(stdout);
        }
    }
    flushdb(admin);
    wxgb_redis_free(admin);
    wxg_conf_free(o.conf);
    return 0;
}
