/* End to end, with private Redis servers so that the shared one is never disturbed:
 *  - Redis stops answering (SIGSTOP) for five seconds in the middle of a run. While it is gone
 *    no committed offset passes a message whose effect is missing; when it answers again
 *    processing resumes, every committed offset reaches the end and each message has exactly
 *    one effect.
 *  - A replica found through Redis Sentinel, with guard.wait.replicas = 1: a failover in the
 *    middle of a run loses nothing and repeats no effect. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumertest.h"
#include "testenv.h"

#define PARTITIONS 3
#define TOTAL      1500
#define ID_BASE    7301234569000000000ULL

static uint64_t *offset_ids[PARTITIONS];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

static size_t ledger_lines(const wxg_ct_t *t)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    free(eff);
    return n;
}

/* Produces n messages with ids from ID_BASE over 90 conversations (recording which id sits at
 * each offset), starts one replica, and waits until `effects` of them took effect. */
static void start_run(wxg_ct_t *t, wxg_ct_msg_t *msgs, size_t n, size_t effects)
{
    size_t count[PARTITIONS] = {0};
    for (int p = 0; p < PARTITIONS; p++) {
        offset_ids[p] = calloc(n, sizeof **offset_ids);
        assert_non_null(offset_ids[p]);
    }
    for (size_t i = 0; i < n; i++) {
        int conv = (int)(i * 7 % 90);
        msgs[i] = (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = ID_BASE + i, .conv = conv};
        offset_ids[msgs[i].partition][count[msgs[i].partition]++] = msgs[i].id;
    }
    wxg_ct_spawn(t, 0);
    wxg_ct_produce(t, msgs, n);
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (ledger_lines(t) < effects && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(20);
    /* The fault comes mid-run: the replica is working, with most of the stream still to do. */
    size_t done = ledger_lines(t);
    if (done < effects || done >= n / 2)
        fail_msg("%zu of %zu messages took effect before the fault (want %zu to %zu)", done, n,
                 effects, n / 2 - 1);
}

static void redis_stopped_for_five_seconds_holds_offsets_and_processing_resumes(void **state)
{
    (void)state;
    wxg_test_redis_t redis;
    assert_int_equal(wxg_test_redis_start(&redis, NULL), 0);
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-redis", PARTITIONS);
    t.redis_host = "127.0.0.1";
    t.redis_port = redis.port;
    wxg_ct_write_config(&t, "plugins = fail,record\n"
                            "plugin.fail.action = stall\n"
                            "plugin.fail.stall.ms = 5\n"
                            "plugin.fail.match.every = 1\n"
                            "guard.lease.ms = 3s\n"
                            "redis.command.timeout.ms = 500ms\n"
                            "redis.connect.timeout.ms = 500ms\n");
    static wxg_ct_msg_t msgs[TOTAL];
    start_run(&t, msgs, TOTAL, 200);

    assert_int_equal(kill(redis.pid, SIGSTOP), 0);
    size_t at_stop = ledger_lines(&t);
    int64_t until = wxg_test_now_ms() + 5000;
    while (wxg_test_now_ms() < until) {
        check_invariant(&t);
        wxg_test_sleep_ms(100);
    }
    size_t during = ledger_lines(&t);
    assert_int_equal(kill(redis.pid, SIGCONT), 0);
    /* The outage really held work back: at most the batches in hand when Redis stopped took
     * effect meanwhile (their plugins ran; their DONE waited), and no more. */
    print_message("effects when Redis stopped: %zu, five seconds later: %zu of %d\n", at_stop,
                  during, TOTAL);
    assert_true(during < TOTAL / 2);
    assert_true(during - at_stop <= 4 * 64);

    assert_true(wxg_ct_wait_all_committed(&t, 120000, check_invariant));
    check_invariant(&t);
    wxg_ct_assert_each_once(&t, ID_BASE, TOTAL);
    int st = wxg_ct_signal(&t, 0, SIGTERM, 60000);
    wxg_ct_assert_exit(&t, 0, st, 0);
    assert_true(wxg_ct_log_count(&t, 0, "event=guard_error") > 0);
    for (int p = 0; p < PARTITIONS; p++)
        free(offset_ids[p]);
    wxg_ct_teardown(&t);
    wxg_test_redis_stop(&redis);
}

static void a_sentinel_failover_mid_run_loses_nothing_and_repeats_no_effect(void **state)
{
    (void)state;
    enum { N = 900 };
    wxg_test_redis_t primary, replica, sentinel;
    assert_int_equal(wxg_test_redis_start(&primary, NULL), 0);
    assert_int_equal(wxg_test_redis_start_replica(&replica, primary.port), 0);
    assert_int_equal(wxg_test_redis_wait_link(&replica, 20000), 0);
    assert_int_equal(wxg_test_sentinel_start(&sentinel, "wxgmain", primary.port, NULL), 0);

    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-sentinel", PARTITIONS);
    /* Nothing listens at redis.host/port: only the Sentinel can lead to the primary. */
    t.redis_host = "127.0.0.1";
    t.redis_port = wxg_test_free_port();
    char extra[512];
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = 5\n"
             "plugin.fail.match.every = 1\n"
             "redis.sentinels = 127.0.0.1:%d\n"
             "redis.sentinel.master = wxgmain\n"
             "guard.wait.replicas = 1\n"
             "guard.wait.timeout.ms = 1s\n"
             "guard.lease.ms = 3s\n"
             "redis.command.timeout.ms = 1s\n"
             "redis.connect.timeout.ms = 500ms\n",
             sentinel.port);
    wxg_ct_write_config(&t, extra);
    static wxg_ct_msg_t msgs[N];
    start_run(&t, msgs, N, 150);

    assert_int_equal(
        wxg_test_sentinel_failover(&sentinel, "wxgmain", replica.port, primary.port, 40000), 0);
    assert_true(ledger_lines(&t) < N); /* the failover happened mid-run */

    assert_true(wxg_ct_wait_all_committed(&t, 120000, check_invariant));
    check_invariant(&t);
    wxg_ct_assert_each_once(&t, ID_BASE, N);
    int st = wxg_ct_signal(&t, 0, SIGTERM, 60000);
    wxg_ct_assert_exit(&t, 0, st, 0);
    for (int p = 0; p < PARTITIONS; p++)
        free(offset_ids[p]);
    wxg_ct_teardown(&t);
    wxg_test_redis_stop(&sentinel);
    wxg_test_redis_stop(&replica);
    wxg_test_redis_stop(&primary);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(redis_stopped_for_five_seconds_holds_offsets_and_processing_resumes),
        cmocka_unit_test(a_sentinel_failover_mid_run_loses_nothing_and_repeats_no_effect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
