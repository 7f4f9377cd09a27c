/* Redis faults against a private redis-server: restarted empty mid-run (also in the middle of a
 * batch), SCRIPT FLUSH, a SIGSTOP longer than the command timeout, a connection closed by the
 * server's idle timeout, the watchdog's probe through an outage, and the fixture's restart of a
 * persistent server, and a WAIT that falls short under a complete retried; and a connection closed
 * in the middle of a claim or complete batch, by a proxy between the guard and the server that
 * lets only part of the batch's commands, or of its replies, through. The guard must reconnect
 * and reload its scripts, never crash, never report success for a DONE it could not write, and
 * return retriable errors while Redis is away. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "guardtest.h"
#include "testenv.h"
#include "testproxy.h"
#include "wxguard/guard.h"

typedef struct fixture {
    wxg_test_redis_t redis;
    char prefix[64];
    wxg_guard_conf_t conf;
    wxg_guard_t *g;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (wxg_test_redis_start(&f->redis, NULL) != 0)
        fail_msg("cannot start a private redis-server");
    gt_conf(&f->conf, "127.0.0.1", f->redis.port, "faults", f->prefix, sizeof f->prefix);
    f->conf.command_timeout_ms = 300;
    f->conf.connect_timeout_ms = 300;
    f->g = gt_open(&f->conf);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_guard_destroy(f->g);
    wxg_test_redis_stop(&f->redis);
    free(f);
    return 0;
}

/* Retries a call for at most 10 s, counting its retriable failures. */
#define RETRY(rc, fails, call) GT_RETRY(rc, fails, 10000, call)

static void restart_empty_mid_run_refuses_the_lost_done_and_recovers(void **state)
{
    fixture *f = *state;
    const char *done_key = "bot:n:1", *key = "bot:n:2";
    wxg_guard_claim_t c0, c1, x;
    assert_int_equal(wxg_guard_claim(f->g, done_key, strlen(done_key), NULL, &c0), 0);
    assert_int_equal(wxg_guard_complete(f->g, &c0.ticket, NULL), 0);
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c1), 0);
    assert_int_equal(c1.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_plugin_done(f->g, &c1.ticket, "billing", "r1", 2), 0);

    assert_int_equal(wxg_test_redis_restart(&f->redis), 0);

    int rc, fails = 0, already = 0;
    RETRY(rc, fails, wxg_guard_complete(f->g, &c1.ticket, &already));
    if (f->conf.design == WXG_GUARD_DESIGN_LUA) {
        /* The state died with the server: the script cannot tell the ticket's owner from any
         * other, so completing is refused, not reported as done. */
        assert_int_equal(rc, WXG_ELEASELOST);
    } else {
        /* The native complete of a ticket whose lease this machine knows to be live writes the
         * marker into the empty field: every plugin ran, so DONE is the truth, and nothing
         * runs twice (docs/guard.md §4). */
        assert_int_equal(rc, 0);
        assert_int_equal(already, 0);
        assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &x), 0);
        assert_int_equal(x.outcome, WXG_GUARD_DUPLICATE);
    }
    /* The server closed the idle connection when it died: the guard saw that before sending
     * and reconnected, so the call did not fail with an unknown outcome. */
    assert_int_equal(fails, 0);
    wxg_guard_stats_t st;
    wxg_guard_get_stats(f->g, &st);
    assert_true(st.connects >= 2);
    /* The guard works again, on an empty server: the old DONE is gone (no persistence), so
     * the message is claimable again; docs/guard.md says why persistence matters. */
    assert_int_equal(wxg_guard_claim(f->g, done_key, strlen(done_key), NULL, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(f->g, &x.ticket, NULL), 0);
    assert_int_equal(wxg_guard_claim(f->g, done_key, strlen(done_key), NULL, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_DUPLICATE);
    wxg_guard_claim_clear(&c0);
    wxg_guard_claim_clear(&c1);
}

/* The wall clock in ms (the guard's time buckets follow the server's clock: the same machine's). */
static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Finding: a handle cached a time bucket's selector bits and never looked again, so after Redis
 * restarted empty a handle started afterwards stamped other bits, and the two looked for one
 * message in different fields: both claimed it. The first handle's time bucket is sized from a
 * (pre-stamped, empty) time bucket before it, the second's, after the restart, from nothing: two
 * different sizes, as a real restart between busy time buckets gives. */
static void selector_bits_remembered_from_before_a_restart_are_not_trusted_after_it(void **state)
{
    fixture *f = *state;
    wxg_guard_conf_t c = f->conf;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%sbits:", f->prefix); /* a layout of its own */
    c.prefix = prefix;
    c.shard_bits = 1;
    c.done_bucket_ms = 20000;
    c.done_retention_ms = 60000;
    c.failed_retention_ms = 60000;
    /* Stay clear of a time bucket's boundary for the few seconds the test needs. */
    int64_t width = c.done_bucket_ms, now = wall_ms();
    while (now % width < 1000 || now % width > width - 8000) {
        usleep(200000);
        now = wall_ms();
    }
    int64_t tb = now / width;
    redisContext *rc0 = gt_redis("127.0.0.1", f->redis.port, NULL);
    char stamp[128];
    snprintf(stamp, sizeof stamp, "%sg:%lld", prefix, (long long)(tb - 1));
    const char *set[] = {"SET", stamp, "1"};
    freeReplyObject(gt_cmd(rc0, 3, set));
    redisFree(rc0);

    wxg_guard_t *a = gt_open(&c);
    const char *m1 = "bot:n:1", *m2 = "bot:n:2";
    wxg_guard_claim_t x, y;
    assert_int_equal(wxg_guard_claim(a, m1, strlen(m1), NULL, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_CLAIMED);
    wxg_guard_claim_clear(&x);

    assert_int_equal(wxg_test_redis_restart(&f->redis), 0);
    wxg_guard_t *b = gt_open(&c);
    assert_int_equal(wxg_guard_claim(b, m2, strlen(m2), NULL, &y), 0);
    assert_int_equal(y.outcome, WXG_GUARD_CLAIMED);

    int rc, fails = 0;
    RETRY(rc, fails, wxg_guard_claim(a, m2, strlen(m2), NULL, &x));
    assert_int_equal(rc, 0);
    if (x.outcome == WXG_GUARD_CLAIMED)
        fail_msg("two live owners of %s: the handle from before the restart claimed it too", m2);
    assert_int_equal(x.outcome, WXG_GUARD_BUSY);
    wxg_guard_claim_clear(&x);
    assert_int_equal(wxg_guard_complete(b, &y.ticket, NULL), 0);
    RETRY(rc, fails, wxg_guard_claim(a, m2, strlen(m2), NULL, &x));
    assert_int_equal(x.outcome, WXG_GUARD_DUPLICATE);
    wxg_guard_claim_clear(&x);
    wxg_guard_claim_clear(&y);
    wxg_guard_destroy(a);
    wxg_guard_destroy(b);
}

static void
restart_in_the_middle_of_a_batch_completes_nothing_falsely_and_loses_nothing(void **state)
{
    fixture *f = *state;
    enum { N = 64 };
    static char keys[N][32];
    wxg_guard_msg_t msgs[N];
    wxg_guard_claim_t out[N];
    wxg_guard_ticket_t t[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "bot:n:9%04d", i);
        msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), NULL};
    }
    /* The first half completes before the restart, the second half is in flight. */
    gt_claim_all(f->g, msgs, N, out, t);
    assert_int_equal(wxg_guard_complete_batch(f->g, t, N / 2, res), 0);
    assert_int_equal(wxg_test_redis_restart(&f->redis), 0);
    int rc, fails = 0;
    for (int i = 0; i < N; i++)
        res[i] = -9;
    RETRY(rc, fails, wxg_guard_complete_batch(f->g, t + N / 2, N / 2, res + N / 2));
    assert_int_equal(rc, 0);
    assert_int_equal(fails, 0); /* the dead connection was replaced before the call */
    /* The Lua design refuses (never OK, never ALREADY_DONE); the native one writes the
     * markers of tickets it knows to be live (see above). */
    int lua = f->conf.design == WXG_GUARD_DESIGN_LUA;
    for (int i = N / 2; i < N; i++)
        assert_int_equal(res[i], lua ? WXG_GUARD_LEASE_LOST : WXG_GUARD_OK);
    /* Nothing in flight was lost: every in-flight message can be claimed and processed again,
     * or is DONE (and the server restarted empty, so the completed half is claimable too). */
    wxg_guard_claim_t again[N];
    assert_int_equal(wxg_guard_claim_batch(f->g, msgs, N, again), 0);
    for (int i = 0; i < N; i++) {
        if (!lua && i >= N / 2) {
            assert_int_equal(again[i].outcome, WXG_GUARD_DUPLICATE);
            wxg_guard_claim_clear(&out[i]);
            continue;
        }
        assert_int_equal(again[i].outcome, WXG_GUARD_CLAIMED);
        /* A fence from the server's clock: higher than before Redis forgot the message. */
        assert_true(again[i].ticket.fence > out[i].ticket.fence);
        wxg_guard_claim_clear(&again[i]);
        wxg_guard_claim_clear(&out[i]);
    }
}

static void script_flush_is_repaired_transparently_by_reloading(void **state)
{
    fixture *f = *state;
    redisContext *raw = gt_redis("127.0.0.1", f->redis.port, NULL);
    const char *argv[2] = {"SCRIPT", "FLUSH"};
    freeReplyObject(gt_cmd(raw, 2, argv));
    wxg_guard_stats_t s0, s1;
    wxg_guard_get_stats(f->g, &s0);
    const char *key = "bot:n:3";
    wxg_guard_claim_t c, d;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(c.attempt, 1); /* ran exactly once (after the reload: the Lua design) */
    /* Renew and fail are scripts in both designs. */
    freeReplyObject(gt_cmd(raw, 2, argv));
    assert_int_equal(wxg_guard_renew(f->g, &c.ticket), 0);
    freeReplyObject(gt_cmd(raw, 2, argv));
    assert_int_equal(wxg_guard_fail(f->g, &c.ticket, "again", 1), 0);
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(d.attempt, 2);
    assert_int_equal(wxg_guard_complete(f->g, &d.ticket, NULL), 0);
    wxg_guard_get_stats(f->g, &s1);
    assert_int_equal(s1.noscript_reloads - s0.noscript_reloads,
                     f->conf.design == WXG_GUARD_DESIGN_LUA ? 3 : 2);
    assert_int_equal(s1.connects, s0.connects); /* same connection throughout */
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_DUPLICATE);
    redisFree(raw);
}

static void paused_redis_gives_retriable_timeouts_and_the_guard_recovers(void **state)
{
    fixture *f = *state;
    const char *key = "bot:n:4", *later = "bot:n:5";
    wxg_guard_claim_t c;
    assert_int_equal(kill(f->redis.pid, SIGSTOP), 0);
    int64_t t0 = wxg_test_now_ms();
    int rc = wxg_guard_claim(f->g, key, strlen(key), NULL, &c);
    int64_t took = wxg_test_now_ms() - t0;
    assert_int_equal(rc, WXG_ETIMEDOUT);
    assert_true(took >= 250 && took < 3000);
    assert_int_equal(wxg_err_class(rc), WXG_CLASS_RETRIABLE);
    /* While paused every call fails fast or times out; none pretends to succeed. */
    for (int i = 0; i < 3; i++) {
        rc = wxg_guard_claim(f->g, later, strlen(later), NULL, &c);
        assert_true(rc == WXG_ETIMEDOUT || rc == WXG_ECONN);
    }
    wxg_test_sleep_ms(700);
    assert_int_equal(kill(f->redis.pid, SIGCONT), 0);
    int fails = 0;
    RETRY(rc, fails, wxg_guard_claim(f->g, later, strlen(later), NULL, &c));
    assert_int_equal(rc, 0);
    /* A claim sent while paused may have run once Redis resumed (its outcome was unknown), so
     * a later claim of that key is CLAIMED, or BUSY under that lost claim's lease. */
    assert_true(c.outcome == WXG_GUARD_CLAIMED || c.outcome == WXG_GUARD_BUSY);
    wxg_guard_claim_t d;
    const char *fresh = "bot:n:6";
    assert_int_equal(wxg_guard_claim(f->g, fresh, strlen(fresh), NULL, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(f->g, &d.ticket, NULL), 0);
    wxg_guard_stats_t st;
    wxg_guard_get_stats(f->g, &st);
    assert_true(st.timeouts >= 1);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&d);
}

static void watchdog_flags_unsure_when_redis_stays_away_past_the_lease(void **state)
{
    fixture *f = *state;
    wxg_guard_conf_t conf = f->conf;
    conf.lease_ms = 300;
    conf.command_timeout_ms = 100;
    char err[256];
    wxg_guard_watchdog_t *wd = wxg_guard_watchdog_new(&conf, 0, 0, NULL, err, sizeof err);
    assert_non_null(wd);
    const char *key = "bot:n:7";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    wxg_guard_watch_t *w = wxg_guard_watchdog_add(wd, &c.ticket);
    assert_int_equal(kill(f->redis.pid, SIGSTOP), 0);
    int64_t end = wxg_test_now_ms() + 3000;
    while (wxg_guard_watch_status(w) == WXG_GUARD_WATCH_LIVE && wxg_test_now_ms() < end)
        wxg_test_sleep_ms(20);
    assert_int_equal(kill(f->redis.pid, SIGCONT), 0);
    assert_int_equal(wxg_guard_watch_status(w), WXG_GUARD_WATCH_UNSURE);
    wxg_guard_watchdog_remove(wd, w);
    wxg_guard_watchdog_destroy(wd);
    wxg_guard_claim_clear(&c);
}

/* The number of PING commands the server has answered so far (INFO commandstats). */
static long long pings_answered(int port)
{
    redisContext *rc = gt_redis("127.0.0.1", port, NULL);
    const char *argv[] = {"INFO", "commandstats"};
    redisReply *r = gt_cmd(rc, 2, argv);
    long long calls = 0;
    const char *at = r->type == REDIS_REPLY_STRING ? strstr(r->str, "cmdstat_ping:calls=") : NULL;
    if (at)
        calls = strtoll(at + strlen("cmdstat_ping:calls="), NULL, 10);
    freeReplyObject(r);
    redisFree(rc);
    return calls;
}

static void ping_answers_while_redis_is_up_and_reconnects_after_a_restart(void **state)
{
    fixture *f = *state;
    long long before = pings_answered(f->redis.port);
    assert_int_equal(wxg_guard_ping(f->g), 0);
    assert_true(pings_answered(f->redis.port) > before);
    wxg_test_redis_kill(&f->redis);
    int rc = wxg_guard_ping(f->g);
    assert_true(rc == WXG_ECONN || rc == WXG_ETIMEDOUT);
    assert_non_null(strstr(wxg_guard_last_error(f->g), "127.0.0.1"));
    assert_int_equal(wxg_guard_ping(NULL), WXG_EINVAL);
    assert_int_equal(wxg_test_redis_restart(&f->redis), 0);
    int fails = 0;
    RETRY(rc, fails, wxg_guard_ping(f->g));
    assert_int_equal(rc, 0);
}

static void a_connection_closed_by_the_idle_timeout_is_replaced_before_the_next_call(void **state)
{
    fixture *f = *state;
    const char *key = "bot:n:idle";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    wxg_guard_stats_t s0, s1;
    wxg_guard_get_stats(f->g, &s0);

    /* Redis closes clients idle for a second; wait until it has closed the guard's. */
    redisContext *admin = gt_redis("127.0.0.1", f->redis.port, NULL);
    const char *set[] = {"CONFIG", "SET", "timeout", "1"};
    freeReplyObject(gt_cmd(admin, 4, set));
    const char *list[] = {"CLIENT", "LIST"};
    int64_t end = wxg_test_now_ms() + 10000LL * wxg_test_scale();
    for (;;) {
        redisReply *r = gt_cmd(admin, 2, list);
        int clients = 0; /* one line each, ours included */
        for (const char *l = strstr(r->str, "id="); l; l = strstr(l + 1, "\nid="))
            clients++;
        int others = clients - 1;
        if (others != 0 && wxg_test_now_ms() >= end)
            print_message("%s\n", r->str);
        freeReplyObject(r);
        if (others == 0)
            break;
        assert_true(wxg_test_now_ms() < end);
        wxg_test_sleep_ms(100);
    }
    const char *unset[] = {"CONFIG", "SET", "timeout", "0"};
    freeReplyObject(gt_cmd(admin, 4, unset));
    redisFree(admin);

    /* The next call neither fails nor is ambiguous: the guard reconnects first. */
    int already = -1;
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, &already), 0);
    assert_int_equal(already, 0);
    wxg_guard_get_stats(f->g, &s1);
    assert_int_equal(s1.connects, s0.connects + 1);
    assert_int_equal(s1.conn_errors, s0.conn_errors);
    wxg_guard_claim_clear(&c);
}

/* Waits until fn(wd) holds, polling every 10 ms for at most 10 s (scaled). */
static int wait_health(wxg_guard_watchdog_t *wd, int (*fn)(wxg_guard_watchdog_t *, int64_t),
                       int64_t since)
{
    int64_t end = wxg_test_now_ms() + 10000LL * wxg_test_scale();
    while (!fn(wd, since)) {
        if (wxg_test_now_ms() > end)
            return 0;
        wxg_test_sleep_ms(10);
    }
    return 1;
}

static int answered_after(wxg_guard_watchdog_t *wd, int64_t since)
{
    int64_t ok = 0, bad = 0;
    wxg_guard_watchdog_health(wd, &ok, &bad);
    return ok > since && ok > bad;
}

static int failed_after(wxg_guard_watchdog_t *wd, int64_t since)
{
    int64_t ok = 0, bad = 0;
    wxg_guard_watchdog_health(wd, &ok, &bad);
    return bad > since && bad > ok;
}

static void an_idle_watchdog_probes_redis_and_reports_an_outage_and_its_end(void **state)
{
    fixture *f = *state;
    char err[256];
    wxg_guard_watchdog_t *wd = wxg_guard_watchdog_new(&f->conf, 0, 0, NULL, err, sizeof err);
    assert_non_null(wd);
    int64_t created = 0, bad = -1;
    assert_int_equal(wxg_guard_watchdog_health(wd, &created, &bad), 0);
    assert_true(created > 0);
    assert_int_equal(bad, 0);
    char why[256] = "x";
    wxg_guard_watchdog_last_error(wd, why, sizeof why);
    assert_string_equal(why, "");

    /* Off by default: nothing is sent while nothing is renewed. */
    long long pings = pings_answered(f->redis.port);
    wxg_test_sleep_ms(300);
    assert_int_equal(pings_answered(f->redis.port), pings);
    assert_false(answered_after(wd, created));

    wxg_guard_watchdog_probe(wd, 50);
    assert_true(wait_health(wd, answered_after, created));
    assert_true(pings_answered(f->redis.port) > pings);

    int64_t up_until = 0;
    wxg_guard_watchdog_health(wd, &up_until, NULL);
    wxg_test_redis_kill(&f->redis);
    assert_true(wait_health(wd, failed_after, up_until));
    int code = wxg_guard_watchdog_health(wd, NULL, &bad);
    assert_true(code == WXG_ECONN || code == WXG_ETIMEDOUT);
    /* With the handle's own words for it. */
    wxg_guard_watchdog_last_error(wd, why, sizeof why);
    assert_true(strlen(why) > 0);
    /* Still down a while later: the failure is refreshed, not answered by a stale success. */
    wxg_test_sleep_ms(300);
    int64_t bad_later = 0;
    wxg_guard_watchdog_health(wd, NULL, &bad_later);
    assert_true(bad_later > bad);
    assert_true(failed_after(wd, 0));

    assert_int_equal(wxg_test_redis_restart(&f->redis), 0);
    assert_true(wait_health(wd, answered_after, bad_later));
    wxg_guard_watchdog_destroy(wd);
}

static void unreachable_redis_at_start_is_a_retriable_connection_error(void **state)
{
    fixture *f = *state;
    wxg_guard_conf_t conf = f->conf;
    conf.port = wxg_test_free_port();
    char err[256] = "";
    int rc = 0;
    assert_null(wxg_guard_new(&conf, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONN);
    assert_non_null(strstr(err, "127.0.0.1"));
}

/* The fixture's own promise, which the soak relies on: once wxg_test_redis_restart() returns, a
 * persistent server serves every key it had, although loading a large append-only file takes a
 * while during which INFO already answers and every data command gets -LOADING. */
static void a_restarted_persistent_redis_serves_its_keys_once_the_restart_returns(void **state)
{
    (void)state;
    enum { KEYS = 400000 };
    wxg_test_redis_t r;
    assert_int_equal(wxg_test_redis_start_persistent(&r), 0);
    struct timeval tv = {.tv_sec = 30};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r.port, tv);
    assert_true(c != NULL && !c->err);
    redisSetTimeout(c, tv);
    redisReply *rep =
        redisCommand(c, "EVAL %s 0 %d",
                     "for i = 1, tonumber(ARGV[1]) do redis.call('SET', 'k' .. i, i) end", KEYS);
    assert_true(rep != NULL && rep->type != REDIS_REPLY_ERROR);
    freeReplyObject(rep);
    redisFree(c);

    assert_int_equal(wxg_test_redis_restart(&r), 0);
    c = redisConnectWithTimeout("127.0.0.1", r.port, tv);
    assert_true(c != NULL && !c->err);
    rep = redisCommand(c, "DBSIZE");
    assert_non_null(rep);
    if (rep->type != REDIS_REPLY_INTEGER)
        fail_msg("DBSIZE right after the restart: %s", rep->str ? rep->str : "(not an integer)");
    assert_int_equal(rep->integer, KEYS);
    freeReplyObject(rep);
    redisFree(c);
    wxg_test_redis_stop(&r);
}

/* WAIT falling short (a replica stopped) fails complete with WXG_EREPLICAS although the
 * primary made the write. Retried while the replica is still away and again after it is back,
 * complete must find its own marker every time: ALREADY_DONE (or OK), never a field changed
 * twice, and every message a DUPLICATE afterwards. */
static void a_complete_retried_after_wait_fell_short_finds_its_marker(void **state)
{
    (void)state;
    enum { N = 40 };
    wxg_test_redis_t primary, replica;
    assert_int_equal(wxg_test_redis_start(&primary, NULL), 0);
    assert_int_equal(wxg_test_redis_start_replica(&replica, primary.port), 0);
    assert_int_equal(wxg_test_redis_wait_link(&replica, 20000), 0);
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, "127.0.0.1", primary.port, "waitshort", prefix, sizeof prefix);
    c.wait_replicas = 1;
    c.wait_timeout_ms = 200;
    wxg_guard_t *g = gt_open(&c);
    static char keys[N][32];
    static const unsigned char hash[32] = {0x5a, 0xc3, 0x11}; /* a payload tag other than 0 */
    wxg_guard_msg_t msgs[N];
    wxg_guard_claim_t out[N];
    wxg_guard_ticket_t t[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "bot:n:%d", 8100 + i);
        msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), i % 2 ? hash : NULL};
    }
    gt_claim_all(g, msgs, N, out, t);
    assert_int_equal(kill(replica.pid, SIGSTOP), 0);
    for (int attempt = 0; attempt < 3; attempt++)
        assert_int_equal(wxg_guard_complete_batch(g, t, N, res), WXG_EREPLICAS);
    assert_int_equal(kill(replica.pid, SIGCONT), 0);
    int rc = WXG_EREPLICAS;
    for (int attempt = 0; attempt < 50 && rc == WXG_EREPLICAS; attempt++)
        rc = wxg_guard_complete_batch(g, t, N, res);
    assert_int_equal(rc, 0);
    for (int i = 0; i < N; i++) {
        if (res[i] != WXG_GUARD_ALREADY_DONE && res[i] != WXG_GUARD_OK)
            fail_msg("message %d: complete answered %d after the retries", i, res[i]);
    }
    for (int i = 0; i < N; i++) {
        wxg_guard_claim_t d;
        assert_int_equal(wxg_guard_claim(g, keys[i], strlen(keys[i]), msgs[i].payload_hash, &d), 0);
        assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
        assert_false(d.payload_mismatch);
        wxg_guard_claim_clear(&d);
        wxg_guard_claim_clear(&out[i]);
    }
    wxg_guard_destroy(g);
    wxg_test_redis_stop(&replica);
    wxg_test_redis_stop(&primary);
}

/* A second handle on the fixture's server, with its own WAIT settings. */
static wxg_guard_t *other_handle(const fixture *f, int wait_replicas)
{
    wxg_guard_conf_t c = f->conf;
    c.wait_replicas = wait_replicas;
    c.wait_timeout_ms = 20;
    return gt_open(&c);
}

/* Completes t through g while the server is stopped, so that the complete runs only after g
 * gave up on it (WXG_ETIMEDOUT: an unknown outcome), then lets the server run it and has g
 * connected again. */
static void complete_with_its_answer_lost(fixture *f, wxg_guard_t *g, const wxg_guard_ticket_t *t)
{
    int rc, fails = 0;
    RETRY(rc, fails, wxg_guard_ping(g));
    assert_int_equal(rc, 0);
    assert_int_equal(kill(f->redis.pid, SIGSTOP), 0);
    assert_int_equal(wxg_guard_complete(g, t, NULL), WXG_ETIMEDOUT);
    assert_int_equal(kill(f->redis.pid, SIGCONT), 0);
    wxg_test_sleep_ms(200);
    RETRY(rc, fails, wxg_guard_ping(g));
    assert_int_equal(rc, 0);
}

/* The message's state once its complete has been retried to an answer: DUPLICATE, and so no
 * claim that waits for ever on a field nobody will repair. */
static void assert_done(fixture *f, const char *key)
{
    wxg_guard_claim_t x;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_DUPLICATE);
    wxg_guard_claim_clear(&x);
}

static void a_complete_retried_after_wait_fell_short_ends_done(void **state)
{
    fixture *f = *state;
    const char *key = "bot:n:20";
    /* This server has no replica: WAIT 1 always falls short, after the writes ran. */
    wxg_guard_t *w = other_handle(f, 1);
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    for (int i = 0; i < 3; i++)
        assert_int_equal(wxg_guard_complete(w, &c.ticket, NULL), WXG_EREPLICAS);
    int already = -1;
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, &already), 0);
    assert_int_equal(already, 1);
    assert_done(f, key);
    wxg_guard_claim_clear(&c);
    wxg_guard_destroy(w);
}

static void a_complete_run_twice_after_its_answers_were_lost_ends_done(void **state)
{
    fixture *f = *state;
    const char *key = "bot:n:21";
    wxg_guard_t *w = other_handle(f, 0);
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    complete_with_its_answer_lost(f, w, &c.ticket);
    complete_with_its_answer_lost(f, w, &c.ticket);
    int already = -1;
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, &already), 0);
    assert_int_equal(already, 1);
    assert_done(f, key);
    wxg_guard_claim_clear(&c);
    wxg_guard_destroy(w);
}

static void a_complete_of_a_forgotten_claim_run_after_its_answer_was_lost_ends_done(void **state)
{
    fixture *f = *state;
    const char *key = "bot:n:22";
    wxg_guard_t *w = other_handle(f, 0);
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    /* Redis forgets the claim (a restart without persistence), then a complete runs on the
     * empty field without its answer arriving. */
    assert_int_equal(wxg_test_redis_restart(&f->redis), 0);
    complete_with_its_answer_lost(f, w, &c.ticket);
    int rc, fails = 0, already = -1;
    RETRY(rc, fails, wxg_guard_complete(f->g, &c.ticket, &already));
    if (f->conf.design == WXG_GUARD_DESIGN_LUA) {
        /* The script refuses a ticket whose state is gone (see the restart test above). */
        assert_int_equal(rc, WXG_ELEASELOST);
        wxg_guard_claim_clear(&c);
        wxg_guard_destroy(w);
        return;
    }
    /* The native design writes the marker, as for an empty field. */
    assert_int_equal(rc, 0);
    assert_int_equal(already, 1);
    assert_done(f, key);
    /* Every bucket has its expiry, also one that the lost complete created. */
    redisContext *x = gt_redis("127.0.0.1", f->redis.port, NULL);
    char pattern[96], **keys = NULL;
    snprintf(pattern, sizeof pattern, "%s*", f->prefix);
    size_t n = gt_scan(x, pattern, &keys);
    assert_true(n >= 1);
    for (size_t i = 0; i < n; i++)
        assert_true(gt_pttl(x, keys[i]) > 0);
    gt_free_keys(keys);
    redisFree(x);
    wxg_guard_claim_clear(&c);
    wxg_guard_destroy(w);
}

/* Where a native complete's increments leave a field when its completer dies before their
 * repair: `times` increments of tag - value onto the claim's in-flight value (empty: onto a
 * field Redis lost), done here by hand as the dead completer's commands were. */
/* The fixture's one DONE bucket (its name in *keys, free with gt_free_keys) and its one field
 * with the value, as HGETALL answers them (free the reply). */
static redisReply *the_only_field(const fixture *f, redisContext *x, char ***keys)
{
    char pattern[96];
    snprintf(pattern, sizeof pattern, "%s*:d:*", f->prefix);
    assert_int_equal(gt_scan(x, pattern, keys), 1);
    const char *argv[2] = {"HGETALL", (*keys)[0]};
    redisReply *r = gt_cmd(x, 2, argv);
    assert_int_equal(r->elements, 2);
    return r;
}

static void increments_left_by_a_dead_completer(fixture *f, int times, int empty)
{
    redisContext *x = gt_redis("127.0.0.1", f->redis.port, NULL);
    char **keys = NULL;
    redisReply *r = the_only_field(f, x, &keys);
    long long value = strtoll(r->element[1]->str, NULL, 10), tag = 1; /* no payload: tag 1 */
    char field[64], delta[32];
    size_t fl = r->element[0]->len;
    memcpy(field, r->element[0]->str, fl);
    freeReplyObject(r);
    snprintf(delta, sizeof delta, "%lld", tag - value);
    if (empty) {
        const char *dargv[3] = {"HDEL", keys[0], field};
        size_t dlens[3] = {4, strlen(keys[0]), fl};
        r = redisCommandArgv(x, 3, dargv, dlens);
        assert_non_null(r);
        freeReplyObject(r);
    }
    for (int i = 0; i < times; i++) {
        const char *iargv[4] = {"HINCRBY", keys[0], field, delta};
        size_t ilens[4] = {7, strlen(keys[0]), fl, strlen(delta)};
        r = redisCommandArgv(x, 4, iargv, ilens);
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        /* The first onto the value is the marker itself; any other leaves the field spent:
         * below every marker. */
        assert_true(r->integer == tag ? !empty && i == 0 : r->integer < -32768);
        freeReplyObject(r);
    }
    gt_free_keys(keys);
    redisFree(x);
}

/* The message was completed (only a complete writes those increments): a claim from another
 * handle answers DUPLICATE without a payload mismatch rather than BUSY for the bucket's life,
 * inspect says DONE, and the dead completer's ticket finds it done. */
static void a_field_left_spent_by_a_dead_completer_reads_as_done(void **state)
{
    fixture *f = *state;
    static const struct {
        int times, empty;
    } cases[] = {{2, 0}, {1, 1}, {3, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char key[32];
        snprintf(key, sizeof key, "bot:n:%zu", 30 + k);
        wxg_guard_claim_t c, d;
        assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
        assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
        increments_left_by_a_dead_completer(f, cases[k].times, cases[k].empty);
        wxg_guard_t *other = other_handle(f, 0);
        assert_int_equal(wxg_guard_claim(other, key, strlen(key), NULL, &d), 0);
        assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
        assert_false(d.payload_mismatch);
        wxg_guard_record_t *rec = NULL;
        assert_int_equal(wxg_guard_inspect(other, key, strlen(key), NULL, &rec), 0);
        assert_int_equal(rec->state, WXG_GUARD_DONE);
        wxg_guard_record_free(rec);
        int already = -1;
        assert_int_equal(wxg_guard_complete(f->g, &c.ticket, &already), 0);
        assert_int_equal(already, 1);
        assert_done(f, key);
        wxg_guard_claim_clear(&c);
        wxg_guard_claim_clear(&d);
        wxg_guard_destroy(other);
        /* The next case finds its own bucket alone. */
        redisContext *x = gt_redis("127.0.0.1", f->redis.port, NULL);
        const char *fargv[1] = {"FLUSHALL"};
        freeReplyObject(gt_cmd(x, 1, fargv));
        redisFree(x);
    }
}

/* ---------------------------------------------------------------------------------------------
 * A connection closed in the middle of a batch
 *
 * A TCP proxy (tests/support/testproxy.h) forwards between the guard and the fixture's server.
 * Armed, it cuts the next exchange short: CUT_REQUESTS lets the first half of the pipeline's
 * bytes through (the server runs those commands and never sees the rest); CUT_REPLIES lets every
 * command through and the first half of the replies' bytes back; then it closes the connection.
 */

enum {
    CUT_NONE = WXG_TEST_CUT_NONE,
    CUT_REQUESTS = WXG_TEST_CUT_REQUESTS,
    CUT_REPLIES = WXG_TEST_CUT_REPLIES
};

typedef wxg_test_proxy_t proxy;

static proxy *proxy_start(int upstream)
{
    proxy *p = wxg_test_proxy_start(upstream);
    assert_non_null(p);
    return p;
}

/* A guard on the fixture's prefix with a command timeout well above the proxy's pauses: through
 * the proxy (its port) or straight to the server. Small script calls, so that the Lua
 * design pipelines several per batch and a cut can fall between them. */
static wxg_guard_t *cut_handle(const fixture *f, int port)
{
    wxg_guard_conf_t c = f->conf;
    c.port = port;
    c.command_timeout_ms = 3000 * wxg_test_scale();
    c.connect_timeout_ms = 3000 * wxg_test_scale();
    c.batch_max = 8;
    c.lease_ms = 1500;
    return gt_open(&c);
}

enum { CUT_N = 64 };

typedef struct cut_batch {
    char keys[CUT_N][32];
    wxg_guard_msg_t msgs[CUT_N];
    wxg_guard_claim_t out[CUT_N];
    wxg_guard_ticket_t t[CUT_N];
} cut_batch;

/* Starts the proxy to the fixture's server and two handles, *g through it and *direct, and
 * names CUT_N messages "bot:<tag>:NNNN" (the batch, freed by cut_stop). */
static cut_batch *cut_start(const fixture *f, proxy **p, wxg_guard_t **g, wxg_guard_t **direct,
                            const char *tag)
{
    *p = proxy_start(f->redis.port);
    *g = cut_handle(f, wxg_test_proxy_port(*p));
    *direct = cut_handle(f, f->redis.port);
    cut_batch *b = calloc(1, sizeof *b);
    assert_non_null(b);
    for (int i = 0; i < CUT_N; i++) {
        snprintf(b->keys[i], sizeof b->keys[i], "bot:%s:%04d", tag, i);
        b->msgs[i] = (wxg_guard_msg_t){b->keys[i], strlen(b->keys[i]), NULL};
    }
    return b;
}

static void cut_stop(proxy *p, wxg_guard_t *g, wxg_guard_t *direct, cut_batch *b)
{
    free(b);
    wxg_guard_destroy(direct);
    wxg_guard_destroy(g);
    wxg_test_proxy_stop(p);
}

/* The proxied call failed with the connection: a retriable error whose text says so, the cut
 * happened where it was meant to, and the handle connects again (through the proxy) after. */
static void assert_cut(proxy *p, wxg_guard_t *g, int rc, int how)
{
    const char *why = wxg_guard_last_error(g);
    wxg_test_proxy_cut_t c;
    wxg_test_proxy_last_cut(p, &c);
    print_message("cut %s: %zu of %zu request bytes, %zu of %zu reply bytes through; %s: %s\n",
                  how == CUT_REQUESTS ? "requests" : "replies", c.req_sent, c.req_total, c.rep_sent,
                  c.rep_total, wxg_err_name(rc), why);
    assert_int_equal(c.cuts, 1);
    assert_true(c.req_total > 0 && c.req_sent < c.req_total + (how == CUT_REPLIES));
    assert_true(how == CUT_REQUESTS || c.rep_sent < c.rep_total);
    assert_int_equal(rc, WXG_ECONN);
    assert_int_equal(wxg_err_class(rc), WXG_CLASS_RETRIABLE);
    assert_non_null(strstr(why, "closed the connection"));
    int fails = 0;
    RETRY(rc, fails, wxg_guard_ping(g));
    assert_int_equal(rc, 0);
}

/* Completes a claimed batch through a proxy that cuts the exchange (`how`); then the same
 * tickets, straight to the server, find the truth: a complete that reached Redis reads as
 * ALREADY_DONE, one that did not completes now (OK), and every message ends a DUPLICATE. Returns
 * how many read ALREADY_DONE. */
static int complete_cut_then_retried(void **state, int how, const char *tag)
{
    fixture *f = *state;
    proxy *p;
    wxg_guard_t *g, *direct;
    cut_batch *b = cut_start(f, &p, &g, &direct, tag);
    assert_int_equal(wxg_guard_claim_batch(g, b->msgs, CUT_N, b->out), 0);
    for (int i = 0; i < CUT_N; i++) {
        assert_int_equal(b->out[i].outcome, WXG_GUARD_CLAIMED);
        b->t[i] = b->out[i].ticket;
    }

    int res[CUT_N];
    for (int i = 0; i < CUT_N; i++)
        res[i] = -1;
    wxg_test_proxy_arm(p, how);
    int rc = wxg_guard_complete_batch(g, b->t, CUT_N, res);
    assert_cut(p, g, rc, how);
    /* No message is reported done, nor anything else, while its outcome is unknown. */
    for (int i = 0; i < CUT_N; i++)
        assert_int_equal(res[i], -1);

    assert_int_equal(wxg_guard_complete_batch(direct, b->t, CUT_N, res), 0);
    int already = 0, ok = 0;
    for (int i = 0; i < CUT_N; i++) {
        if (res[i] != WXG_GUARD_ALREADY_DONE && res[i] != WXG_GUARD_OK)
            fail_msg("message %d: the retried complete answered %d", i, res[i]);
        already += res[i] == WXG_GUARD_ALREADY_DONE;
        ok += res[i] == WXG_GUARD_OK;
    }
    print_message("retried: %d already done, %d completed now\n", already, ok);
    wxg_guard_claim_t again[CUT_N];
    assert_int_equal(wxg_guard_claim_batch(direct, b->msgs, CUT_N, again), 0);
    for (int i = 0; i < CUT_N; i++) {
        assert_int_equal(again[i].outcome, WXG_GUARD_DUPLICATE);
        wxg_guard_claim_clear(&again[i]);
        wxg_guard_claim_clear(&b->out[i]);
    }
    cut_stop(p, g, direct, b);
    return already;
}

static void a_complete_batch_cut_mid_request_leaves_part_done_and_a_retry_finishes_it(void **state)
{
    int already = complete_cut_then_retried(state, CUT_REQUESTS, "cutreq");
    /* The cut fell inside the batch: some completes ran, the others did not. */
    assert_true(already > 0 && already < CUT_N);
}

static void a_complete_batch_whose_replies_are_cut_is_done_and_a_retry_says_so(void **state)
{
    /* Every complete ran; only answers were lost. */
    assert_int_equal(complete_cut_then_retried(state, CUT_REPLIES, "cutrep"), CUT_N);
}

/* A claim batch cut in the middle of its commands: the call fails with every result cleared;
 * a fresh claim finds the claims that ran BUSY under their lost lease and claims the others;
 * once the lost leases end, those are claimed too, and every message completes exactly once. */
typedef struct late_claim {
    wxg_guard_t *g;
    const char *key;
    wxg_guard_claim_t out;
    int rc;
} late_claim;

static void *late_claim_main(void *arg)
{
    late_claim *l = arg;
    l->rc = wxg_guard_claim(l->g, l->key, strlen(l->key), NULL, &l->out);
    return NULL;
}

/* Finding: a native claim sized for one time bucket whose commands reach Redis after that time
 * bucket ended (a stalled network, a paused client; here a proxy holds them 4 s, within a
 * 10 s command timeout) wrote into the old time bucket and probed only older ones, while a
 * claim made after the boundary had written into the new one: both answered CLAIMED. The late
 * claim must not be CLAIMED. */
static void a_claim_that_reaches_redis_after_its_time_bucket_ended_is_not_claimed(void **state)
{
    fixture *f = *state;
    proxy *p = proxy_start(f->redis.port);
    wxg_guard_conf_t c = f->conf;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%slate:", f->prefix);
    c.prefix = prefix;
    c.done_bucket_ms = 10000;
    c.done_retention_ms = 30000;
    c.failed_retention_ms = 30000;
    c.command_timeout_ms = 10000;
    c.connect_timeout_ms = 3000;
    c.lease_ms = 60000; /* outlives every delay below: the owner's complete must still hold */
    wxg_guard_conf_t cp = c;
    cp.port = wxg_test_proxy_port(p);
    wxg_guard_t *late = gt_open(&cp), *direct = gt_open(&c);
    /* Start 2.8 s before a boundary: outside the 2 s margin, so the native claim is sized for
     * the time bucket that is about to end. */
    int64_t width = c.done_bucket_ms, now = wall_ms();
    while (now % width < width - 2900 || now % width > width - 2700) {
        usleep(20000);
        now = wall_ms();
    }
    int64_t boundary = (now / width + 1) * width;
    wxg_test_proxy_set_delay(p, 4000);
    late_claim l = {.g = late, .key = "bot:n:late"};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, late_claim_main, &l), 0);
    while (wall_ms() < boundary + 200)
        usleep(10000);
    wxg_guard_claim_t d;
    assert_int_equal(wxg_guard_claim(direct, l.key, strlen(l.key), NULL, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_CLAIMED);
    /* Only the late claim's first commands are held: whatever it sends next goes straight on. */
    wxg_test_proxy_set_delay(p, 0);
    pthread_join(th, NULL);
    if (l.rc == 0 && l.out.outcome == WXG_GUARD_CLAIMED)
        fail_msg("two live owners: the claim that reached Redis about a second after the "
                 "boundary was CLAIMED too");
    if (l.rc != 0) {
        assert_true(gt_retriable(l.rc));
        print_message("the late claim: %s\n", wxg_guard_last_error(late));
    } else {
        assert_int_equal(l.out.outcome, WXG_GUARD_BUSY);
    }
    /* The owner after the boundary finishes; the late handle then sees a duplicate. */
    assert_int_equal(wxg_guard_complete(direct, &d.ticket, NULL), 0);
    wxg_guard_claim_t x;
    int rc, fails = 0;
    RETRY(rc, fails, wxg_guard_claim(late, l.key, strlen(l.key), NULL, &x));
    assert_int_equal(x.outcome, WXG_GUARD_DUPLICATE);
    wxg_guard_claim_clear(&x);
    wxg_guard_claim_clear(&d);
    wxg_guard_claim_clear(&l.out);
    wxg_guard_destroy(late);
    wxg_guard_destroy(direct);
    wxg_test_proxy_stop(p);
}

/* A field value the layout never writes (another program's write into the prefix, a newer
 * version's state): every claim answers BUSY flagged unreadable, on both designs, counted in
 * the handle's stats, so that the consumer can say so instead of waiting silently; inspect
 * does not take it for DONE, and purge clears it, after which the message is claimed. */
static void a_field_value_the_layout_does_not_write_is_busy_unreadable_until_purged(void **state)
{
    fixture *f = *state;
    const char *key = "bot:n:unreadable";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    redisContext *x = gt_redis("127.0.0.1", f->redis.port, NULL);
    char **keys = NULL;
    redisReply *r = the_only_field(f, x, &keys);
    const char *sargv[4] = {"HSET", keys[0], r->element[0]->str, "X-not-ours"};
    size_t slens[4] = {4, strlen(keys[0]), r->element[0]->len, 10};
    redisReply *w = redisCommandArgv(x, 4, sargv, slens);
    assert_non_null(w);
    freeReplyObject(w);
    freeReplyObject(r);
    gt_free_keys(keys);
    redisFree(x);

    wxg_guard_t *other = gt_open(&f->conf);
    wxg_guard_stats_t before, after;
    wxg_guard_get_stats(other, &before);
    for (int i = 0; i < 2; i++) {
        wxg_guard_claim_t d;
        assert_int_equal(wxg_guard_claim(other, key, strlen(key), NULL, &d), 0);
        assert_int_equal(d.outcome, WXG_GUARD_BUSY);
        assert_true(d.unreadable);
        assert_true(d.lease_ms_left > 0);
        wxg_guard_claim_clear(&d);
    }
    wxg_guard_get_stats(other, &after);
    assert_int_equal(after.unreadable - before.unreadable, 2);
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(other, key, strlen(key), NULL, &rec), 0);
    assert_int_not_equal(rec->state, WXG_GUARD_DONE);
    wxg_guard_record_free(rec);
    int purged = 0;
    assert_int_equal(wxg_guard_purge(other, key, strlen(key), &purged), 0);
    assert_int_equal(purged, 1);
    wxg_guard_claim_t e;
    assert_int_equal(wxg_guard_claim(other, key, strlen(key), NULL, &e), 0);
    assert_int_equal(e.outcome, WXG_GUARD_CLAIMED);
    assert_false(e.unreadable);
    assert_int_equal(wxg_guard_complete(other, &e.ticket, NULL), 0);
    wxg_guard_claim_clear(&e);
    wxg_guard_claim_clear(&c);
    wxg_guard_destroy(other);
}

/* Claims `key` with g, expecting `outcome`; returns the claim (clear it). */
static wxg_guard_claim_t claim_expect(wxg_guard_t *g, const char *key, wxg_guard_outcome_t outcome)
{
    wxg_guard_claim_t c;
    int rc, fails = 0;
    RETRY(rc, fails, wxg_guard_claim(g, key, strlen(key), NULL, &c));
    assert_int_equal(rc, 0);
    if (c.outcome != outcome)
        fail_msg("%s: claim answered %d (lease left %lld ms), expected %d", key, c.outcome,
                 (long long)c.lease_ms_left, outcome);
    return c;
}

/* A stale owner S (through a proxy) and a new owner N (straight to the server) of one message:
 * S claimed it, its lease ended, an operator purged it, and N claimed it again. */
typedef struct stale_owner {
    proxy *p;
    wxg_guard_conf_t c;
    wxg_guard_t *stale, *direct;
    wxg_guard_claim_t s, n;
} stale_owner;

static void stale_owner_start(const fixture *f, stale_owner *so, int command_timeout_ms)
{
    so->p = proxy_start(f->redis.port);
    so->c = f->conf;
    so->c.command_timeout_ms = command_timeout_ms;
    so->c.connect_timeout_ms = 3000 * wxg_test_scale();
    /* Outlives a cut (the proxy waits 100 ms, scaled, for each side to be quiet) and the claim
     * after it, which in the Lua design must still find the new owner's lease live. */
    so->c.lease_ms = 1000 * wxg_test_scale();
    wxg_guard_conf_t cp = so->c;
    cp.port = wxg_test_proxy_port(so->p);
    so->stale = gt_open(&cp);
    so->direct = gt_open(&so->c);
}

static void stale_owner_purged_and_reclaimed(stale_owner *so, const char *key)
{
    so->s = claim_expect(so->stale, key, WXG_GUARD_CLAIMED);
    usleep((useconds_t)(so->c.lease_ms + 100) * 1000);
    int purged = 0;
    assert_int_equal(wxg_guard_purge(so->direct, key, strlen(key), &purged), 0);
    assert_int_equal(purged, 1);
    so->n = claim_expect(so->direct, key, WXG_GUARD_CLAIMED);
}

static void stale_owner_stop(stale_owner *so)
{
    wxg_guard_destroy(so->stale);
    wxg_guard_destroy(so->direct);
    wxg_test_proxy_stop(so->p);
}

/* Finding: a purge of an expired claim, a new owner N, and the old owner S, still alive,
 * completing late. Natively S's increment lands on N's value; its connection is cut before the
 * repair. The field then held the sum of two claims' values, which nothing recognised: every
 * claim answered BUSY until the time bucket expired (days), N's complete was LEASE_LOST, inspect
 * said ABSENT and a second purge deleted nothing. Now what S's increment leaves reads as DONE
 * (S ran every plugin before completing): a claim is a duplicate, N's complete ends done, and
 * the message stays DONE whether N finishes or dies. The Lua design's complete is one script
 * that refuses S and leaves nothing to repair: N holds the message until it completes or its
 * lease ends, and then it is claimed again. Either way no message is left unclaimable. */
static void a_stale_owners_complete_cut_after_a_purge_leaves_no_message_stuck(void **state)
{
    fixture *f = *state;
    int native = f->conf.design != WXG_GUARD_DESIGN_LUA;
    stale_owner so;
    stale_owner_start(f, &so, 3000 * wxg_test_scale());
    const char *keys[2] = {"bot:n:purged-finished", "bot:n:purged-abandoned"};
    for (int k = 0; k < 2; k++) {
        const char *key = keys[k];
        stale_owner_purged_and_reclaimed(&so, key);
        wxg_test_proxy_arm(so.p, CUT_REPLIES);
        int rc = wxg_guard_complete(so.stale, &so.s.ticket, NULL);
        wxg_test_proxy_cut_t cut;
        wxg_test_proxy_last_cut(so.p, &cut);
        assert_int_equal(cut.cuts, k + 1);
        assert_int_equal(rc, WXG_ECONN);

        /* While N lives, nobody else runs the message. */
        wxg_guard_claim_t x =
            claim_expect(so.direct, key, native ? WXG_GUARD_DUPLICATE : WXG_GUARD_BUSY);
        wxg_guard_claim_clear(&x);
        if (k == 0) {
            int already = -1;
            rc = wxg_guard_complete(so.direct, &so.n.ticket, &already);
            if (rc != 0)
                fail_msg("the new owner's complete: %s", wxg_err_name(rc));
            assert_int_equal(already, native);
        } else {
            /* N died: once its lease ended the message is DONE (natively: S completed it) or
             * claimable again, never BUSY. */
            usleep((useconds_t)(so.c.lease_ms + 100) * 1000);
            x = claim_expect(so.direct, key, native ? WXG_GUARD_DUPLICATE : WXG_GUARD_CLAIMED);
            if (!native)
                assert_int_equal(wxg_guard_complete(so.direct, &x.ticket, NULL), 0);
            wxg_guard_claim_clear(&x);
        }
        wxg_guard_record_t *rec = NULL;
        assert_int_equal(wxg_guard_inspect(so.direct, key, strlen(key), NULL, &rec), 0);
        assert_int_equal(rec->state, WXG_GUARD_DONE);
        wxg_guard_record_free(rec);
        /* S, retried, finds the message done, and leaves it so. */
        int already = -1, fails = 0;
        RETRY(rc, fails, wxg_guard_complete(so.stale, &so.s.ticket, &already));
        assert_int_equal(rc, 0);
        assert_int_equal(already, 1);
        x = claim_expect(so.direct, key, WXG_GUARD_DUPLICATE);
        wxg_guard_claim_clear(&x);
        wxg_guard_claim_clear(&so.s);
        wxg_guard_claim_clear(&so.n);
    }
    stale_owner_stop(&so);
}

typedef struct late_complete {
    wxg_guard_t *g;
    const wxg_guard_ticket_t *t;
    int rc, already;
} late_complete;

static void *late_complete_main(void *arg)
{
    late_complete *l = arg;
    l->rc = wxg_guard_complete(l->g, l->t, &l->already);
    return NULL;
}

/* The same purge and stale owner S, without a cut: each of S's commands is held by the proxy,
 * and the new owner N completes between S's increment and S's repair. N's complete found the
 * sum of two values and was refused (LEASE_LOST), and S's repair, undoing blindly, could then
 * land on whatever N's complete had left. Now N's complete ends done, S's repair changes
 * nothing it did not leave, and the message is a duplicate after both. */
static void a_new_owners_complete_between_a_stale_owners_two_round_trips_ends_done(void **state)
{
    fixture *f = *state;
    int native = f->conf.design != WXG_GUARD_DESIGN_LUA;
    int hold = 500 * wxg_test_scale();
    stale_owner so;
    stale_owner_start(f, &so, 4 * hold + 3000);
    const char *key = "bot:n:purged-raced";
    stale_owner_purged_and_reclaimed(&so, key);
    /* The connection is open already: nothing but S's complete passes the proxy from here. */
    assert_int_equal(wxg_guard_ping(so.stale), 0);
    wxg_test_proxy_set_delay(so.p, hold);
    late_complete l = {.g = so.stale, .t = &so.s.ticket, .already = -1};
    pthread_t th;
    int64_t start = wxg_test_now_ms();
    assert_int_equal(pthread_create(&th, NULL, late_complete_main, &l), 0);
    /* S's increment reaches Redis after one hold, its repair (natively) after two. */
    while (wxg_test_now_ms() < start + hold + hold / 2)
        usleep(10000);
    int already = -1;
    int rc = wxg_guard_complete(so.direct, &so.n.ticket, &already);
    if (rc != 0)
        fail_msg("the new owner's complete: %s", wxg_err_name(rc));
    assert_int_equal(already, native);
    pthread_join(th, NULL);
    wxg_test_proxy_set_delay(so.p, 0);
    if (native) {
        assert_int_equal(l.rc, 0);
        assert_int_equal(l.already, 1);
    } else {
        assert_int_equal(l.rc, WXG_ELEASELOST);
    }
    wxg_guard_claim_t x = claim_expect(so.direct, key, WXG_GUARD_DUPLICATE);
    wxg_guard_claim_clear(&x);
    wxg_guard_claim_clear(&so.s);
    wxg_guard_claim_clear(&so.n);
    stale_owner_stop(&so);
}

static void a_claim_batch_cut_mid_request_claims_nothing_falsely_and_loses_nothing(void **state)
{
    fixture *f = *state;
    proxy *p;
    wxg_guard_t *g, *direct;
    cut_batch *b = cut_start(f, &p, &g, &direct, "cutclaim");
    wxg_test_proxy_arm(p, CUT_REQUESTS);
    int rc = wxg_guard_claim_batch(g, b->msgs, CUT_N, b->out);
    assert_cut(p, g, rc, CUT_REQUESTS);
    for (int i = 0; i < CUT_N; i++)
        assert_int_equal(b->out[i].outcome, 0);

    /* The truth, straight from the server. */
    assert_int_equal(wxg_guard_claim_batch(direct, b->msgs, CUT_N, b->out), 0);
    int busy = 0, claimed = 0, res[CUT_N];
    for (int i = 0; i < CUT_N; i++) {
        if (b->out[i].outcome != WXG_GUARD_BUSY && b->out[i].outcome != WXG_GUARD_CLAIMED)
            fail_msg("message %d: claim answered %d after the cut", i, b->out[i].outcome);
        busy += b->out[i].outcome == WXG_GUARD_BUSY;
        claimed += b->out[i].outcome == WXG_GUARD_CLAIMED;
    }
    print_message("after the cut: %d busy under a lost lease, %d claimed\n", busy, claimed);
    assert_true(busy > 0 && claimed > 0);
    /* The lost leases end; every message is claimed at last, each completed once. */
    int64_t end = wxg_test_now_ms() + 10000LL * wxg_test_scale();
    for (int round = 0; round < 1000; round++) {
        int left = 0;
        for (int i = 0; i < CUT_N; i++) {
            if (b->out[i].outcome == WXG_GUARD_CLAIMED) {
                assert_int_equal(wxg_guard_complete_batch(direct, &b->out[i].ticket, 1, res), 0);
                assert_int_equal(res[0], WXG_GUARD_OK);
                b->out[i].outcome = WXG_GUARD_DUPLICATE; /* done: not claimed again below */
            }
            if (b->out[i].outcome != WXG_GUARD_BUSY)
                continue;
            wxg_guard_claim_clear(&b->out[i]);
            assert_int_equal(
                wxg_guard_claim(direct, b->keys[i], strlen(b->keys[i]), NULL, &b->out[i]), 0);
            assert_int_not_equal(b->out[i].outcome, WXG_GUARD_DUPLICATE);
            left += b->out[i].outcome == WXG_GUARD_BUSY;
        }
        if (left == 0 || wxg_test_now_ms() > end)
            break;
        wxg_test_sleep_ms(100);
    }
    for (int i = 0; i < CUT_N; i++) {
        if (b->out[i].outcome == WXG_GUARD_CLAIMED) {
            assert_int_equal(wxg_guard_complete_batch(direct, &b->out[i].ticket, 1, res), 0);
            assert_int_equal(res[0], WXG_GUARD_OK);
            b->out[i].outcome = WXG_GUARD_DUPLICATE;
        }
        if (b->out[i].outcome == WXG_GUARD_BUSY)
            fail_msg("message %d is still BUSY after its lost lease", i);
        wxg_guard_claim_clear(&b->out[i]);
    }
    wxg_guard_claim_t again[CUT_N];
    assert_int_equal(wxg_guard_claim_batch(direct, b->msgs, CUT_N, again), 0);
    for (int i = 0; i < CUT_N; i++) {
        assert_int_equal(again[i].outcome, WXG_GUARD_DUPLICATE);
        wxg_guard_claim_clear(&again[i]);
    }
    cut_stop(p, g, direct, b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            selector_bits_remembered_from_before_a_restart_are_not_trusted_after_it, setup,
            teardown),
        cmocka_unit_test_setup_teardown(restart_empty_mid_run_refuses_the_lost_done_and_recovers,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            restart_in_the_middle_of_a_batch_completes_nothing_falsely_and_loses_nothing, setup,
            teardown),
        cmocka_unit_test_setup_teardown(script_flush_is_repaired_transparently_by_reloading, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            paused_redis_gives_retriable_timeouts_and_the_guard_recovers, setup, teardown),
        cmocka_unit_test_setup_teardown(watchdog_flags_unsure_when_redis_stays_away_past_the_lease,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            ping_answers_while_redis_is_up_and_reconnects_after_a_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(
            a_connection_closed_by_the_idle_timeout_is_replaced_before_the_next_call, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            an_idle_watchdog_probes_redis_and_reports_an_outage_and_its_end, setup, teardown),
        cmocka_unit_test_setup_teardown(unreachable_redis_at_start_is_a_retriable_connection_error,
                                        setup, teardown),
        cmocka_unit_test(a_restarted_persistent_redis_serves_its_keys_once_the_restart_returns),
        cmocka_unit_test(a_complete_retried_after_wait_fell_short_finds_its_marker),
        cmocka_unit_test_setup_teardown(a_complete_retried_after_wait_fell_short_ends_done, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_complete_run_twice_after_its_answers_were_lost_ends_done,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            a_complete_of_a_forgotten_claim_run_after_its_answer_was_lost_ends_done, setup,
            teardown),
        cmocka_unit_test_setup_teardown(a_field_left_spent_by_a_dead_completer_reads_as_done, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            a_complete_batch_cut_mid_request_leaves_part_done_and_a_retry_finishes_it, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            a_complete_batch_whose_replies_are_cut_is_done_and_a_retry_says_so, setup, teardown),
        cmocka_unit_test_setup_teardown(
            a_claim_batch_cut_mid_request_claims_nothing_falsely_and_loses_nothing, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            a_claim_that_reaches_redis_after_its_time_bucket_ended_is_not_claimed, setup, teardown),
        cmocka_unit_test_setup_teardown(
            a_stale_owners_complete_cut_after_a_purge_leaves_no_message_stuck, setup, teardown),
        cmocka_unit_test_setup_teardown(
            a_new_owners_complete_between_a_stale_owners_two_round_trips_ends_done, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            a_field_value_the_layout_does_not_write_is_busy_unreadable_until_purged, setup,
            teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
