/* A randomized fault test of the guard, with a history checker (tests/support/histcheck.h).
 *
 * Several handles, each on a thread of its own and each behind a fault proxy of its own
 * (tests/support/testproxy.h), claim, run a fake effect that records its fence, renew, complete,
 * fail, release and purge over a small key space against the test's own persistent
 * redis-server, while a nemesis on a seeded schedule delays or cuts the handles' connections,
 * pauses handles past their leases (a cut armed for the exchange after such a pause: the
 * complete of an owner that woke up late), stalls a handle's commands across a time-bucket
 * boundary (sent 2.1-2.9 s before it, held until after it), replaces handles (a consumer
 * restarted), and restarts Redis with its data (appendonly, appendfsync always) or without it
 * (its append-only files removed first). Time
 * buckets are narrow (8 s, retention 16 s), so a run crosses several boundaries. The run is cut
 * into epochs; after each one the faults stop, the handles stop, every lease is waited out, and
 * every key is probed until it can be claimed or answers DUPLICATE. Every operation goes into one
 * history, in server time, which the checker reads at the end: it fails the test on two live
 * owners, a DONE message claimed again within its retention, a fence out of order, a message left
 * unclaimable after the faults, or a DUPLICATE for a message whose effect never ran, printing
 * the seed and the offending message's ops. Two deterministic cases before it make, step by
 * step, what the randomized run found on the native design (bench/nemesis.md, findings 1 and 2).
 *
 * Reproduce a run: WXG_NEMESIS_SEED=<the printed seed> (the schedule of faults and operations
 * follows from it; the threads' interleaving does not, so a seed brings a failure back only
 * sometimes: the deterministic cases are what pins one down). A long run, by hand (bench/nemesis.md
 * has figures): WXG_NEMESIS_SECONDS=3600 build/tests/integration/integration.test_guard_nemesis
 * with WXG_TEST_GUARD_DESIGN=lua for the Lua design. WXG_NEMESIS_SECONDS (default 30) is the
 * length of the faulty part of the run; WXG_NEMESIS_HANDLES (default 4, at most 8) and
 * WXG_NEMESIS_KEYS (default 16, at most 64: the keys in use at a time) size it.
 *
 * Clock steps of the server (libfaketime) are not part of this test: the checker reads server
 * time from this machine's clock, which the private redis-server shares.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "guardtest.h"
#include "histcheck.h"
#include "testenv.h"
#include "testproxy.h"
#include "wxguard/guard.h"

enum {
    MAX_HANDLES = 8,
    MAX_KEYS = 64,
    LEASE_MS = 1000,
    BUCKET_MS = 8000,
    RETENTION_MS = 16000,
    EPOCH_MS = 10000,
    /* Longer than the proxy's longest stall: a stalled call is answered late, not abandoned,
     * so that a native claim can reach Redis after its time bucket ended. */
    COMMAND_TIMEOUT_MS = 4000,
    /* The keys in use: WXG_NEMESIS_KEYS of them at a time, the window moving on by one every
     * KEY_SLIDE_MS, so that a run keeps claiming new messages while each key is claimed,
     * completed and met again as a DUPLICATE for seconds. */
    KEY_SLIDE_MS = 500,
};

/* splitmix64: a small seeded generator, one per thread, so that the schedule follows the seed. */
typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next_u64(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static int64_t between(rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(next_u64(r) % (uint64_t)(hi - lo + 1));
}

static int chance(rng *r, int percent)
{
    return (int)(next_u64(r) % 100) < percent;
}

/* Server time in µs: this machine's realtime clock plus the offset Redis TIME showed at the
 * start (the private server runs here, so it is about 0). */
static int64_t clock_offset_us;

static int64_t server_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 + clock_offset_us;
}

typedef struct run run;

typedef struct worker {
    run *r;
    int id;
    rng rng;
    wxg_test_proxy_t *proxy;
    wxg_guard_t *g;
    pthread_t th;
    pthread_mutex_t mu;    /* guards pause_ms, cut_after_pause and parked */
    int64_t pause_ms;      /* > 0: sleep this long at the next pause point */
    int cut_after_pause;   /* arm this cut (WXG_TEST_CUT_*) on the proxy when waking up */
    int new_handle;        /* replace the handle (a consumer restarted) before the next step */
    wxg_guard_conf_t conf; /* through the proxy */
    int parked;
    /* Aimed at a boundary stall: claim key hot_key while server time is in [hot_from, hot_to)
     * (µs), so that the stalled handle and the others meet on one fresh message. */
    int hot_key;
    int64_t hot_from_us, hot_to_us;
    int hot_stall_ms; /* > 0: hold this claim in the proxy that long (the stalled handle) */
    long ops;
} worker;

struct run {
    uint64_t seed;
    int handles, keys;
    int64_t start_ms; /* the keys in use slide with the time since then */
    int slide_keys;   /* the keys the sliding window can reach */
    int total_keys;   /* those and the boundary stalls' keys after them */
    int hot_next;     /* the next boundary stall's key */
    int hot_lo;       /* the first boundary stall key of the current epoch */
    hc_hist_t *hist;
    wxg_guard_conf_t conf;
    char prefix[64];
    wxg_test_redis_t redis;
    worker w[MAX_HANDLES];
    pthread_mutex_t mu; /* guards phase and the fault counts */
    int phase;          /* PH_RUN, PH_QUIET (park), PH_STOP */
    long faults[8];
    long stale_effects;     /* effects a fenced store would refuse (a higher fence came first) */
    uint64_t *store_fence;  /* per key */
    int epoch_lo, epoch_hi; /* the keys reachable in the current epoch */
};

enum { PH_RUN, PH_QUIET, PH_STOP };
enum {
    F_DELAY,
    F_CUT,
    F_DROP,
    F_PAUSE,
    F_RESTART_KEPT,
    F_RESTART_LOST,
    F_STALL,
    F_NEW_HANDLE,
    F_N
};
static const char *fault_name[F_N] = {"delay",          "cut",          "drop",
                                      "pause",          "restart-kept", "restart-lost",
                                      "boundary-stall", "new-handle"};

static void key_name(const run *r, int k, char *buf, size_t size)
{
    snprintf(buf, size, "nem:%016" PRIx64 ":%d", r->seed, k);
}

/* The lowest key in use now. */
static int first_key(run *r)
{
    int k = (int)((wxg_test_now_ms() - r->start_ms) / KEY_SLIDE_MS);
    return k + r->keys < r->slide_keys ? k : r->slide_keys - r->keys;
}

static int get_phase(run *r)
{
    pthread_mutex_lock(&r->mu);
    int p = r->phase;
    pthread_mutex_unlock(&r->mu);
    return p;
}

static hc_result_t claim_result(int rc, const wxg_guard_claim_t *c)
{
    if (rc != 0)
        return HC_R_ERROR;
    switch (c->outcome) {
    case WXG_GUARD_CLAIMED:
        return HC_R_CLAIMED;
    case WXG_GUARD_DUPLICATE:
        return HC_R_DUPLICATE;
    case WXG_GUARD_BUSY:
        return HC_R_BUSY;
    }
    return HC_R_ERROR;
}

/* Claims key k (a probe when `probe`), recording it; returns the history index of a CLAIMED
 * claim (the ticket in *out), else -1. */
static long do_claim(run *r, wxg_guard_t *g, int handle, int k, int probe, wxg_guard_claim_t *out)
{
    hc_op_t o = {.handle = handle, .key = k, .kind = HC_CLAIM, .ticket = -1, .probe = probe};
    o.inv_us = server_us();
    char name[48];
    key_name(r, k, name, sizeof name);
    int rc = wxg_guard_claim(g, name, strlen(name), NULL, out);
    o.comp_us = server_us();
    o.result = claim_result(rc, out);
    if (o.result == HC_R_CLAIMED) {
        o.fence = out->ticket.fence;
        o.lease_end_us = o.inv_us + (int64_t)LEASE_MS * 1000;
    }
    long i = hc_add(r->hist, &o);
    return o.result == HC_R_CLAIMED ? i : -1;
}

static void record_ticket_op(run *r, int handle, int k, hc_kind_t kind, hc_result_t res,
                             int64_t inv, long ticket, uint64_t fence)
{
    hc_op_t o = {.handle = handle,
                 .key = k,
                 .kind = kind,
                 .result = res,
                 .inv_us = inv,
                 .comp_us = server_us(),
                 .ticket = ticket,
                 .fence = fence};
    if (kind == HC_RENEW && res == HC_R_OK)
        o.lease_end_us = inv + (int64_t)LEASE_MS * 1000;
    hc_add(r->hist, &o);
}

/* The fake effect: a store fenced per message, which counts the writes it would refuse. */
static void effect(run *r, int handle, int k, long ticket, uint64_t fence)
{
    int64_t t = server_us();
    pthread_mutex_lock(&r->mu);
    if (fence <= r->store_fence[k])
        r->stale_effects++;
    else
        r->store_fence[k] = fence;
    pthread_mutex_unlock(&r->mu);
    record_ticket_op(r, handle, k, HC_EFFECT, HC_R_OK, t, ticket, fence);
}

static void complete(run *r, wxg_guard_t *g, int handle, int k, long ticket,
                     const wxg_guard_ticket_t *t)
{
    int64_t inv = server_us();
    int res = -1;
    int rc = wxg_guard_complete_batch(g, t, 1, &res);
    hc_result_t hr = rc != 0                         ? HC_R_ERROR
                     : res == WXG_GUARD_OK           ? HC_R_OK
                     : res == WXG_GUARD_ALREADY_DONE ? HC_R_ALREADY_DONE
                                                     : HC_R_LEASE_LOST;
    record_ticket_op(r, handle, k, HC_COMPLETE, hr, inv, ticket, t->fence);
}

/* A pause point: sleeps past the lease when the nemesis asked for it, then arms the cut it
 * chose for the next exchange (the call the owner makes on waking up). */
static void pause_point(worker *w)
{
    pthread_mutex_lock(&w->mu);
    int64_t ms = w->pause_ms;
    int cut = w->cut_after_pause;
    w->pause_ms = 0;
    w->cut_after_pause = WXG_TEST_CUT_NONE;
    pthread_mutex_unlock(&w->mu);
    if (ms <= 0)
        return;
    wxg_test_sleep_ms(ms);
    if (cut != WXG_TEST_CUT_NONE)
        wxg_test_proxy_arm(w->proxy, cut);
}

/* What an owner does with a claim: maybe renew, maybe pause, the effect (maybe slow), then
 * complete (retried once when its answer was lost), fail, or walk away. */
static void own(worker *w, int k, long ticket, wxg_guard_claim_t *c)
{
    run *r = w->r;
    const wxg_guard_ticket_t *t = &c->ticket;
    if (chance(&w->rng, 50))
        pause_point(w);
    if (chance(&w->rng, 20)) {
        int64_t inv = server_us();
        int res = -1;
        int rc = wxg_guard_renew_batch(w->g, t, 1, &res);
        record_ticket_op(r, w->id, k, HC_RENEW,
                         rc != 0               ? HC_R_ERROR
                         : res == WXG_GUARD_OK ? HC_R_OK
                                               : HC_R_LEASE_LOST,
                         inv, ticket, t->fence);
    }
    if (chance(&w->rng, 25))
        wxg_test_sleep_ms(between(&w->rng, 10, 400)); /* a slow effect */
    effect(r, w->id, k, ticket, t->fence);
    pause_point(w);
    int what = (int)between(&w->rng, 0, 99);
    if (what < 75) {
        complete(r, w->g, w->id, k, ticket, t);
        if (chance(&w->rng, 50))
            complete(r, w->g, w->id, k, ticket, t); /* a retry, whatever the first said */
    } else if (what < 90) {
        int64_t inv = server_us();
        wxg_guard_failure_t f = {.ticket = t, .reason = "nemesis", .attempts = c->attempt};
        int res = -1;
        int rc = wxg_guard_fail_batch(w->g, &f, 1, &res);
        record_ticket_op(r, w->id, k, HC_FAIL,
                         rc != 0               ? HC_R_ERROR
                         : res == WXG_GUARD_OK ? HC_R_OK
                                               : HC_R_LEASE_LOST,
                         inv, ticket, t->fence);
    } /* else: walk away; the lease ends by itself */
}

static void admin(worker *w, int k, int purge)
{
    int64_t inv = server_us();
    int done = 0;
    char name[48];
    key_name(w->r, k, name, sizeof name);
    int rc = purge ? wxg_guard_purge(w->g, name, strlen(name), &done)
                   : wxg_guard_release(w->g, name, strlen(name), &done);
    hc_op_t o = {.handle = w->id,
                 .key = k,
                 .kind = purge ? HC_PURGE : HC_RELEASE,
                 .result = rc != 0 ? HC_R_ERROR
                           : done  ? HC_R_DONE
                                   : HC_R_NOOP,
                 .inv_us = inv,
                 .comp_us = server_us(),
                 .ticket = -1};
    hc_add(w->r->hist, &o);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    run *r = w->r;
    for (;;) {
        int ph = get_phase(r);
        if (ph == PH_STOP)
            break;
        if (ph == PH_QUIET) {
            pthread_mutex_lock(&w->mu);
            w->parked = 1;
            pthread_mutex_unlock(&w->mu);
            wxg_test_sleep_ms(10);
            continue;
        }
        pthread_mutex_lock(&w->mu);
        w->parked = 0;
        int renew = w->new_handle;
        w->new_handle = 0;
        pthread_mutex_unlock(&w->mu);
        if (renew || !w->g) {
            /* A new handle knows nothing of the old one's connection or remembered layout, as
             * a consumer restarted after Redis did. Redis may be away: try again later. */
            wxg_guard_destroy(w->g);
            char err[256];
            w->g = wxg_guard_new(&w->conf, NULL, err, sizeof err);
            if (!w->g) {
                wxg_test_sleep_ms(50);
                continue;
            }
        }
        w->ops++;
        int k = first_key(r) + (int)between(&w->rng, 0, r->keys - 1);
        int pick = (int)between(&w->rng, 0, 99);
        pthread_mutex_lock(&w->mu);
        int64_t now_us = server_us();
        int stall = 0;
        if (w->hot_key >= 0 && now_us >= w->hot_from_us && now_us < w->hot_to_us) {
            k = w->hot_key;
            pick = 99; /* a claim */
            /* The stalled handle's claim, while a native one is still sized for the ending
             * time bucket (outside the 2 s clock margin), once. */
            if (w->hot_stall_ms > 0 && now_us < w->hot_to_us - 2050000)
                stall = w->hot_stall_ms;
            w->hot_stall_ms = 0;
        }
        pthread_mutex_unlock(&w->mu);
        if (stall)
            wxg_test_proxy_set_delay(w->proxy, stall);
        if (pick < 3) {
            admin(w, k, 0);
            continue;
        }
        if (pick < 6) {
            admin(w, k, 1);
            continue;
        }
        wxg_guard_claim_t c;
        long ticket = do_claim(r, w->g, w->id, k, 0, &c);
        if (stall)
            wxg_test_proxy_set_delay(w->proxy, 0);
        if (ticket < 0 && c.outcome == WXG_GUARD_BUSY && chance(&w->rng, 30) &&
            c.lease_ms_left < 3 * LEASE_MS) {
            /* An operator who sees a claim about to expire waits it out, purges the expired
             * record and claims again: a purge between an owner's lease end and its late
             * complete. */
            wxg_test_sleep_ms(c.lease_ms_left + between(&w->rng, 5, 60));
            admin(w, k, 1);
            wxg_guard_claim_clear(&c);
            ticket = do_claim(r, w->g, w->id, k, 0, &c);
        }
        if (ticket >= 0)
            own(w, k, ticket, &c);
        else if (c.outcome == 0)
            wxg_test_sleep_ms(between(&w->rng, 5, 30)); /* a call-level error: back off */
        wxg_guard_claim_clear(&c);
        wxg_test_sleep_ms(between(&w->rng, 0, 10));
    }
    return NULL;
}

/* ---- the nemesis ---- */

static void count_fault(run *r, int f)
{
    pthread_mutex_lock(&r->mu);
    r->faults[f]++;
    pthread_mutex_unlock(&r->mu);
}

static int redis_restart(run *r, int keep)
{
    hc_op_t o = {.key = -1,
                 .kind = HC_RESTART,
                 .result = keep ? HC_R_KEPT : HC_R_LOST,
                 .handle = -1,
                 .ticket = -1};
    o.inv_us = server_us();
    wxg_test_redis_kill(&r->redis);
    if (!keep) {
        char path[1024];
        snprintf(path, sizeof path, "%s/appendonlydir", r->redis.dir);
        wxg_test_rmtree(path);
        snprintf(path, sizeof path, "%s/dump.rdb", r->redis.dir);
        unlink(path);
    }
    int rc = wxg_test_redis_restart(&r->redis);
    o.comp_us = server_us();
    hc_add(r->hist, &o);
    return rc;
}

/* One fault, chosen by the nemesis's generator. Delays are undone by the caller at *undo_at. */
static void one_fault(run *r, rng *n, int64_t *undo_at)
{
    int w = (int)between(n, 0, r->handles - 1);
    int pick = (int)between(n, 0, 99);
    if (pick < 25) {
        wxg_test_proxy_set_delay(r->w[w].proxy, chance(n, 20) ? (int)between(n, 2100, 3500)
                                                              : (int)between(n, 30, 1800));
        undo_at[w] = wxg_test_now_ms() + between(n, 100, 1500);
        count_fault(r, F_DELAY);
    } else if (pick < 45) {
        wxg_test_proxy_arm(r->w[w].proxy,
                           chance(n, 50) ? WXG_TEST_CUT_REPLIES : WXG_TEST_CUT_REQUESTS);
        count_fault(r, F_CUT);
    } else if (pick < 50) {
        wxg_test_proxy_drop(r->w[w].proxy);
        count_fault(r, F_DROP);
    } else if (pick < 55) {
        pthread_mutex_lock(&r->w[w].mu);
        r->w[w].new_handle = 1;
        pthread_mutex_unlock(&r->w[w].mu);
        count_fault(r, F_NEW_HANDLE);
    } else if (pick < 90) {
        pthread_mutex_lock(&r->w[w].mu);
        r->w[w].pause_ms = LEASE_MS + between(n, 50, 1500);
        int pick_cut = (int)between(n, 0, 99);
        r->w[w].cut_after_pause = pick_cut < 40   ? WXG_TEST_CUT_REPLIES
                                  : pick_cut < 55 ? WXG_TEST_CUT_REQUESTS
                                                  : WXG_TEST_CUT_NONE;
        pthread_mutex_unlock(&r->w[w].mu);
        count_fault(r, F_PAUSE);
    } else {
        int keep = chance(n, 50);
        if (redis_restart(r, keep) != 0)
            fail_msg("seed %" PRIu64 ": the private redis-server did not come back", r->seed);
        count_fault(r, keep ? F_RESTART_KEPT : F_RESTART_LOST);
        /* Some consumer restarts with Redis: its new handle lays out what the old ones
         * remembered anew. */
        if (chance(n, 60)) {
            int v = (int)between(n, 0, r->handles - 1);
            pthread_mutex_lock(&r->w[v].mu);
            r->w[v].new_handle = 1;
            pthread_mutex_unlock(&r->w[v].mu);
            count_fault(r, F_NEW_HANDLE);
        }
    }
}

/* Stops every fault and parks every worker (bounded); 0, or -1 when one did not park. */
static int quiesce(run *r)
{
    pthread_mutex_lock(&r->mu);
    r->phase = PH_QUIET;
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->handles; i++) {
        wxg_test_proxy_set_delay(r->w[i].proxy, 0);
        wxg_test_proxy_arm(r->w[i].proxy, WXG_TEST_CUT_NONE);
        pthread_mutex_lock(&r->w[i].mu);
        r->w[i].pause_ms = 0;
        r->w[i].cut_after_pause = WXG_TEST_CUT_NONE;
        r->w[i].hot_key = -1; /* this epoch's probe round checks the messages it aimed at */
        r->w[i].hot_stall_ms = 0;
        pthread_mutex_unlock(&r->w[i].mu);
    }
    /* A worker finishes what it holds: at most a pause, a slow effect and a few calls. */
    int64_t end = wxg_test_now_ms() + 20000LL * wxg_test_scale();
    for (;;) {
        int parked = 0;
        for (int i = 0; i < r->handles; i++) {
            pthread_mutex_lock(&r->w[i].mu);
            parked += r->w[i].parked;
            pthread_mutex_unlock(&r->w[i].mu);
        }
        if (parked == r->handles)
            return 0;
        if (wxg_test_now_ms() > end)
            return -1;
        wxg_test_sleep_ms(20);
    }
}

/* Probes key k until it is claimable or DUPLICATE: at most 2 leases + 1 s. */
static void probe_key(run *r, wxg_guard_t *g, int k)
{
    int64_t end = wxg_test_now_ms() + 2LL * LEASE_MS + 1000;
    for (int round = 0; round < 200; round++) {
        wxg_guard_claim_t c;
        long t = do_claim(r, g, r->handles, k, 1, &c);
        if (t >= 0) {
            effect(r, r->handles, k, t, c.ticket.fence);
            complete(r, g, r->handles, k, t, &c.ticket);
        }
        int outcome = c.outcome;
        wxg_guard_claim_clear(&c);
        if (outcome == WXG_GUARD_CLAIMED || outcome == WXG_GUARD_DUPLICATE ||
            wxg_test_now_ms() > end)
            break;
        wxg_test_sleep_ms(100);
    }
}

/* After the faults: every lease ends, then each key must become claimable or DUPLICATE. A key
 * claimed by a probe is run and completed. Bounded: 1 s + 2 leases per key at most. */
static void probe_round(run *r, wxg_guard_t *g)
{
    hc_op_t q = {.key = -1, .kind = HC_QUIET, .result = HC_R_OK, .handle = -1, .ticket = -1};
    q.inv_us = q.comp_us = server_us();
    hc_add(r->hist, &q);
    wxg_test_sleep_ms(LEASE_MS + 300);
    for (int k = r->epoch_lo; k <= r->epoch_hi; k++)
        probe_key(r, g, k);
    for (int k = r->hot_lo; k < r->hot_next; k++)
        probe_key(r, g, k); /* the messages of this epoch's boundary stalls */
}

static int64_t env_int(const char *name, int64_t def, int64_t lo, int64_t hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *e;
    long long v = strtoll(s, &e, 10);
    if (*e || v < lo || v > hi)
        fail_msg("%s=%s: want an integer in %lld..%lld", name, s, (long long)lo, (long long)hi);
    return v;
}

static uint64_t pick_seed(void)
{
    const char *s = getenv("WXG_NEMESIS_SEED");
    uint64_t seed = 0;
    if (s && *s) {
        char *e;
        seed = strtoull(s, &e, 0);
        if (*e)
            fail_msg("WXG_NEMESIS_SEED=%s: want an unsigned integer", s);
        return seed;
    }
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    return seed;
}

/* Redis TIME minus this machine's clock, in µs (about 0: the server runs here). */
static int64_t measure_offset(int port)
{
    redisContext *x = gt_redis("127.0.0.1", port, NULL);
    const char *argv[1] = {"TIME"};
    int64_t before = server_us();
    redisReply *rep = gt_cmd(x, 1, argv);
    int64_t after = server_us();
    assert_true(rep->type == REDIS_REPLY_ARRAY && rep->elements == 2);
    int64_t t =
        strtoll(rep->element[0]->str, NULL, 10) * 1000000 + strtoll(rep->element[1]->str, NULL, 10);
    freeReplyObject(rep);
    redisFree(x);
    return t - (before + after) / 2;
}

static void random_faults_never_break_the_guards_guarantees(void **state)
{
    (void)state;
    run *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->seed = pick_seed();
    int64_t seconds = env_int("WXG_NEMESIS_SECONDS", 30, 1, 7 * 24 * 3600);
    r->handles = (int)env_int("WXG_NEMESIS_HANDLES", 4, 1, MAX_HANDLES);
    r->keys = (int)env_int("WXG_NEMESIS_KEYS", 16, 1, MAX_KEYS);
    const char *design = gt_design() == WXG_GUARD_DESIGN_LUA ? "lua" : "native";
    print_message("nemesis seed=%" PRIu64 " design=%s seconds=%lld handles=%d keys=%d "
                  "(reproduce: WXG_NEMESIS_SEED=%" PRIu64 ")\n",
                  r->seed, design, (long long)seconds, r->handles, r->keys, r->seed);
    pthread_mutex_init(&r->mu, NULL);
    r->hist = hc_new();
    assert_non_null(r->hist);
    if (wxg_test_redis_start_persistent(&r->redis) != 0)
        fail_msg("cannot start a private redis-server");
    clock_offset_us = 0;
    clock_offset_us = measure_offset(r->redis.port);
    print_message("server clock offset %lld us\n", (long long)clock_offset_us);

    gt_conf(&r->conf, "127.0.0.1", r->redis.port, "nemesis", r->prefix, sizeof r->prefix);
    r->conf.lease_ms = LEASE_MS;
    r->conf.done_bucket_ms = BUCKET_MS;
    r->conf.done_retention_ms = RETENTION_MS;
    r->conf.failed_retention_ms = RETENTION_MS;
    r->conf.inflight_ttl_ms = 4 * RETENTION_MS;
    r->conf.command_timeout_ms = COMMAND_TIMEOUT_MS;
    r->conf.connect_timeout_ms = COMMAND_TIMEOUT_MS;
    r->slide_keys = (int)(seconds * 1000 / KEY_SLIDE_MS) + r->keys + 2;
    r->hot_next = r->hot_lo = r->slide_keys;
    r->total_keys = r->slide_keys + (int)(seconds * 1000 / BUCKET_MS) + 2;
    r->store_fence = calloc((size_t)r->total_keys, sizeof *r->store_fence);
    assert_non_null(r->store_fence);
    for (int i = 0; i < r->handles; i++) {
        worker *w = &r->w[i];
        w->r = r;
        w->id = i;
        w->hot_key = -1;
        w->rng.s = r->seed ^ (0x1000003ULL * (uint64_t)(i + 1));
        pthread_mutex_init(&w->mu, NULL);
        w->proxy = wxg_test_proxy_start(r->redis.port);
        assert_non_null(w->proxy);
        w->conf = r->conf;
        w->conf.port = wxg_test_proxy_port(w->proxy);
        w->g = gt_open(&w->conf);
    }
    wxg_guard_t *probe = gt_open(&r->conf);
    r->start_ms = wxg_test_now_ms();
    for (int i = 0; i < r->handles; i++)
        assert_int_equal(pthread_create(&r->w[i].th, NULL, worker_main, &r->w[i]), 0);

    rng nem = {.s = r->seed};
    int64_t stop = r->start_ms + seconds * 1000;
    int64_t undo_at[MAX_HANDLES] = {0}, stalled = 0;
    int epochs = 0;
    while (wxg_test_now_ms() < stop) {
        int64_t epoch_end = wxg_test_now_ms() + EPOCH_MS;
        if (epoch_end > stop)
            epoch_end = stop;
        r->epoch_lo = first_key(r);
        r->hot_lo = r->hot_next;
        pthread_mutex_lock(&r->mu);
        r->phase = PH_RUN;
        pthread_mutex_unlock(&r->mu);
        int64_t next_fault = wxg_test_now_ms() + between(&nem, 100, 800);
        while (wxg_test_now_ms() < epoch_end) {
            int64_t now = wxg_test_now_ms();
            for (int i = 0; i < r->handles; i++)
                if (undo_at[i] && now >= undo_at[i]) {
                    wxg_test_proxy_set_delay(r->w[i].proxy, 0);
                    undo_at[i] = 0;
                }
            /* A stall across a time-bucket boundary: a handle's commands sent between 2.9 and
             * 2.1 s before it (outside the clock margin, so a native claim is sized for the
             * ending time bucket) are held until after it. */
            int64_t srv_ms = server_us() / 1000, to_boundary = BUCKET_MS - srv_ms % BUCKET_MS;
            int64_t boundary = srv_ms + to_boundary;
            if (to_boundary < 2900 && to_boundary > 2100 && boundary != stalled) {
                stalled = boundary;
                if (chance(&nem, 70) && r->hot_next < r->total_keys) {
                    int w = (int)between(&nem, 0, r->handles - 1);
                    int64_t b_us = boundary * 1000;
                    int hot = r->hot_next++;
                    /* The stalled handle claims a fresh message now; the others claim it in
                     * the second after the boundary, while the stalled claim is still held. */
                    for (int i = 0; i < r->handles; i++) {
                        pthread_mutex_lock(&r->w[i].mu);
                        r->w[i].hot_key = hot;
                        r->w[i].hot_from_us = i == w ? server_us() : b_us;
                        r->w[i].hot_to_us = i == w ? b_us : b_us + 1000000;
                        r->w[i].hot_stall_ms =
                            i == w ? (int)(to_boundary + between(&nem, 200, 800)) : 0;
                        pthread_mutex_unlock(&r->w[i].mu);
                    }
                    count_fault(r, F_STALL);
                }
            }
            if (now >= next_fault) {
                one_fault(r, &nem, undo_at);
                next_fault = wxg_test_now_ms() + between(&nem, 100, 800);
            }
            wxg_test_sleep_ms(20);
        }
        for (int i = 0; i < r->handles; i++)
            undo_at[i] = 0;
        r->epoch_hi = first_key(r) + r->keys - 1;
        if (quiesce(r) != 0)
            fail_msg("seed %" PRIu64 ": a worker did not stop within 20 s", r->seed);
        probe_round(r, probe);
        epochs++;
    }
    pthread_mutex_lock(&r->mu);
    r->phase = PH_STOP;
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->handles; i++)
        pthread_join(r->w[i].th, NULL);

    long ops = 0;
    for (int i = 0; i < r->handles; i++)
        ops += r->w[i].ops;
    char faults[256] = "";
    size_t at = 0;
    for (int f = 0; f < F_N; f++)
        at += (size_t)snprintf(faults + at, sizeof faults - at, "%s%s=%ld", f ? " " : "",
                               fault_name[f], r->faults[f]);
    /* What the history holds, by kind and answer, for the figures in bench/nemesis.md. */
    long by[HC_QUIET + 1][HC_R_LOST + 1] = {{0}};
    for (size_t i = 0; i < hc_len(r->hist); i++) {
        const hc_op_t *o = hc_get(r->hist, i);
        by[o->kind][o->result]++;
    }
    print_message(
        "claims: %ld CLAIMED, %ld DUPLICATE, %ld BUSY, %ld failed; completes: %ld OK, "
        "%ld ALREADY_DONE, %ld LEASE_LOST, %ld failed; renews %ld, fails %ld, "
        "releases %ld (%ld released), purges %ld (%ld purged)\n",
        by[HC_CLAIM][HC_R_CLAIMED], by[HC_CLAIM][HC_R_DUPLICATE], by[HC_CLAIM][HC_R_BUSY],
        by[HC_CLAIM][HC_R_ERROR], by[HC_COMPLETE][HC_R_OK], by[HC_COMPLETE][HC_R_ALREADY_DONE],
        by[HC_COMPLETE][HC_R_LEASE_LOST], by[HC_COMPLETE][HC_R_ERROR],
        by[HC_RENEW][HC_R_OK] + by[HC_RENEW][HC_R_LEASE_LOST] + by[HC_RENEW][HC_R_ERROR],
        by[HC_FAIL][HC_R_OK] + by[HC_FAIL][HC_R_LEASE_LOST] + by[HC_FAIL][HC_R_ERROR],
        by[HC_RELEASE][HC_R_DONE] + by[HC_RELEASE][HC_R_NOOP] + by[HC_RELEASE][HC_R_ERROR],
        by[HC_RELEASE][HC_R_DONE],
        by[HC_PURGE][HC_R_DONE] + by[HC_PURGE][HC_R_NOOP] + by[HC_PURGE][HC_R_ERROR],
        by[HC_PURGE][HC_R_DONE]);
    hc_conf_t hc = {.seed = r->seed,
                    .lease_us = (int64_t)LEASE_MS * 1000,
                    .retention_us = (int64_t)RETENTION_MS * 1000,
                    .slack_us = 20000};
    hc_counts_t counts;
    int bad = hc_check(r->hist, &hc, stdout, &counts);
    print_message("nemesis seed=%" PRIu64 " design=%s: %zu ops in the history (%ld worker "
                  "steps), %d epochs, faults: %s; %ld stale effects a fenced store refused; "
                  "excused by lost data: rule 1 %d, rule 2 %d; violations: %d "
                  "(1:%d 2:%d 3:%d 4:%d 5:%d)\n",
                  r->seed, design, hc_len(r->hist), ops, epochs, faults, r->stale_effects,
                  counts.excused[1], counts.excused[2], bad, counts.violations[1],
                  counts.violations[2], counts.violations[3], counts.violations[4],
                  counts.violations[5]);
    /* A failed run leaves its whole history behind, for a closer look than the minimal one. */
    if (bad != 0 || getenv("WXG_NEMESIS_HISTORY")) {
        char path[512];
        const char *p = getenv("WXG_NEMESIS_HISTORY");
        if (!p || !*p) {
            snprintf(path, sizeof path, "%s/nemesis-%" PRIu64 "-%s.history",
                     getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", r->seed, design);
            p = path;
        }
        FILE *f = fopen(p, "w");
        if (f) {
            hc_dump(r->hist, f);
            fclose(f);
            print_message("the whole history: %s\n", p);
        }
    }
    wxg_guard_destroy(probe);
    for (int i = 0; i < r->handles; i++) {
        wxg_guard_destroy(r->w[i].g);
        wxg_test_proxy_stop(r->w[i].proxy);
        pthread_mutex_destroy(&r->w[i].mu);
    }
    wxg_test_redis_stop(&r->redis);
    hc_free(r->hist);
    free(r->store_fence);
    pthread_mutex_destroy(&r->mu);
    uint64_t seed = r->seed;
    free(r);
    if (bad != 0)
        fail_msg("seed %" PRIu64 " (%s): the history breaks the guard's guarantees %d times "
                 "(reproduce with WXG_NEMESIS_SEED=%" PRIu64 ")",
                 seed, design, bad, seed);
}

/* Finding of this test (native design; seeds in bench/nemesis.md): a native claim of a message
 * that is DONE in the time bucket before writes its in-flight value into the newest bucket, finds
 * the marker in the older one, and leaves taking the value back to its second round trip. When
 * the connection fails between the two (here the replies of the first are cut), the value stays;
 * once its lease ended, the next claim's script takes it over and answers CLAIMED for a message
 * DONE well within its retention. The Lua design claims in one script and passes. */
/* The deterministic cases' set-up: a private redis-server, a handle straight to it (direct)
 * and one through a proxy (cut), with the randomized run's lease and narrow time buckets, and
 * the server's clock between lo_ms and hi_ms into a time bucket. */
typedef struct cut_pair {
    wxg_test_redis_t redis;
    char prefix[64];
    wxg_test_proxy_t *p;
    wxg_guard_t *direct, *cut;
} cut_pair;

static void cut_pair_start(cut_pair *cp, const char *tag, int64_t lo_ms, int64_t hi_ms)
{
    memset(cp, 0, sizeof *cp);
    if (wxg_test_redis_start(&cp->redis, NULL) != 0)
        fail_msg("cannot start a private redis-server");
    wxg_guard_conf_t c;
    gt_conf(&c, "127.0.0.1", cp->redis.port, tag, cp->prefix, sizeof cp->prefix);
    c.lease_ms = LEASE_MS;
    c.done_bucket_ms = BUCKET_MS;
    c.done_retention_ms = RETENTION_MS;
    c.failed_retention_ms = RETENTION_MS;
    cp->p = wxg_test_proxy_start(cp->redis.port);
    assert_non_null(cp->p);
    wxg_guard_conf_t cc = c;
    cc.port = wxg_test_proxy_port(cp->p);
    cp->direct = gt_open(&c);
    cp->cut = gt_open(&cc);
    int64_t end = wxg_test_now_ms() + 2LL * BUCKET_MS;
    while (server_us() / 1000 % BUCKET_MS < lo_ms || server_us() / 1000 % BUCKET_MS > hi_ms) {
        if (wxg_test_now_ms() > end)
            fail_msg("the clock did not reach %lld ms into a time bucket", (long long)lo_ms);
        wxg_test_sleep_ms(20);
    }
}

static void cut_pair_stop(cut_pair *cp)
{
    wxg_guard_destroy(cp->direct);
    wxg_guard_destroy(cp->cut);
    wxg_test_proxy_stop(cp->p);
    wxg_test_redis_stop(&cp->redis);
}

static void a_claim_cut_after_its_first_round_trip_does_not_reopen_a_done_message(void **state)
{
    (void)state;
    /* DONE in the middle of a time bucket, outside the clock margin: native steps. */
    cut_pair cp;
    cut_pair_start(&cp, "nemcut", 3000, 4000);
    wxg_guard_t *direct = cp.direct, *cut = cp.cut;
    wxg_test_proxy_t *p = cp.p;
    int64_t end = wxg_test_now_ms() + 2LL * BUCKET_MS;
    const char *key = "nem:done-then-cut";
    wxg_guard_claim_t a, b, warm, d;
    assert_int_equal(wxg_guard_claim(direct, key, strlen(key), NULL, &a), 0);
    assert_int_equal(a.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(direct, &a.ticket, NULL), 0);
    int64_t done_ms = server_us() / 1000;
    /* The middle of the next time bucket: a native claim writes there and probes the older. */
    int64_t next = (done_ms / BUCKET_MS + 1) * BUCKET_MS + 3000;
    while (server_us() / 1000 < next && wxg_test_now_ms() < end + BUCKET_MS)
        wxg_test_sleep_ms(20);
    /* The cut handle reads the new time bucket's layout first, so that the cut falls on the
     * claim's own commands. */
    assert_int_equal(wxg_guard_claim(cut, "nem:warm-up", 11, NULL, &warm), 0);
    wxg_guard_claim_clear(&warm);
    wxg_test_proxy_arm(p, WXG_TEST_CUT_REPLIES);
    int rc = wxg_guard_claim(cut, key, strlen(key), NULL, &b);
    assert_true(gt_retriable(rc));
    wxg_test_sleep_ms(LEASE_MS + 300);
    assert_int_equal(wxg_guard_claim(direct, key, strlen(key), NULL, &d), 0);
    int64_t age = server_us() / 1000 - done_ms;
    int outcome = d.outcome;
    wxg_guard_claim_clear(&a);
    wxg_guard_claim_clear(&b);
    wxg_guard_claim_clear(&d);
    cut_pair_stop(&cp);
    if (outcome != WXG_GUARD_DUPLICATE)
        fail_msg("a message DONE %lld ms ago (retention %d ms) was answered %s after a claim "
                 "whose replies were cut",
                 (long long)age, RETENTION_MS, outcome == WXG_GUARD_CLAIMED ? "CLAIMED" : "BUSY");
}

/* Finding 1 of bench/nemesis.md (native design), as the randomized run found it (rule 4): an
 * owner S paused past its lease; the expired claim is purged and a new owner N claims (its
 * in-flight value in the field S's claim had); S wakes up and completes, its increment lands on
 * N's value, and its connection is cut before the round trip that undoes it; N walks away. Once
 * every lease ended the message must be claimable again (or DUPLICATE), never BUSY for good. */
static void a_stale_complete_cut_after_a_purge_leaves_the_message_claimable(void **state)
{
    (void)state;
    /* Every step below falls in the middle of one time bucket, outside the clock margin. */
    cut_pair cp;
    cut_pair_start(&cp, "nempurge", 2200, 2500);
    wxg_guard_t *n = cp.direct, *s = cp.cut;
    wxg_test_proxy_t *p = cp.p;
    const char *key = "nem:purged-under-a-stale-owner";
    wxg_guard_claim_t sc, nc, x;
    assert_int_equal(wxg_guard_claim(s, key, strlen(key), NULL, &sc), 0);
    assert_int_equal(sc.outcome, WXG_GUARD_CLAIMED);
    wxg_test_sleep_ms(LEASE_MS + 100); /* S is paused past its lease */
    int purged = 0;
    assert_int_equal(wxg_guard_purge(n, key, strlen(key), &purged), 0);
    assert_int_equal(purged, 1);
    assert_int_equal(wxg_guard_claim(n, key, strlen(key), NULL, &nc), 0);
    assert_int_equal(nc.outcome, WXG_GUARD_CLAIMED);
    wxg_test_proxy_arm(p, WXG_TEST_CUT_REPLIES);
    int rc = wxg_guard_complete(s, &sc.ticket, NULL);
    assert_true(gt_retriable(rc));
    /* N walks away; once its lease ended, the message must come free within a second. */
    wxg_test_sleep_ms(LEASE_MS + 100);
    int outcome = 0, tries = 0;
    for (; tries < 20; tries++) {
        assert_int_equal(wxg_guard_claim(n, key, strlen(key), NULL, &x), 0);
        outcome = x.outcome;
        wxg_guard_claim_clear(&x);
        if (outcome != WXG_GUARD_BUSY)
            break;
        wxg_test_sleep_ms(50);
    }
    wxg_guard_claim_clear(&sc);
    wxg_guard_claim_clear(&nc);
    cut_pair_stop(&cp);
    if (outcome == WXG_GUARD_BUSY)
        fail_msg("still BUSY %d claims (a second) after every lease ended", tries);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_claim_cut_after_its_first_round_trip_does_not_reopen_a_done_message),
        cmocka_unit_test(a_stale_complete_cut_after_a_purge_leaves_the_message_claimable),
        cmocka_unit_test(random_faults_never_break_the_guards_guarantees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
