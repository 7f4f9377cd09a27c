/* Chaos: SIGTERM a replica while its group coordinator cannot be reached. Broker 1 leads every
 * partition and broker 2 is the coordinator; the replica has processed a batch it cannot
 * commit when the signal comes. Its shutdown stays bounded: the final commit waits at most
 * consumer.commit.timeout.ms, and the close, which could not leave the group anyway, as long
 * again; it exits 0 within about two commit budgets, where before the commit alone could take
 * a session timeout (coordinator down) or a request timeout and more (coordinator silent).
 * Nothing is committed past a missing effect, and a new replica finishes the work with one
 * effect per message.
 *   - down: broker 2 refuses connections. Nothing was committed past the batch committed
 *     before the fault, and the new replica skips the uncommitted batch as duplicates.
 *   - silent: broker 2 is up, but its answer to the next OffsetCommit is held for 60 s, and
 *     every later answer on that connection waits behind it (the final commit's too). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>

#include "chaos.h"
#include "testenv.h"

#define PARTITIONS 2
#define TOTAL      300
#define COORD      2
#define SESSION_MS 10000
#define COMMIT_MS  1000

static chaos_t c;

static void stop_while_unreachable(const char *tag, uint64_t id_base, int silent)
{
    char extra[256];
    snprintf(extra, sizeof extra,
             "kafka.session.timeout.ms = %d\n"
             "consumer.commit.timeout.ms = %dms\n",
             SESSION_MS, COMMIT_MS);
    chaos_setup(&c, tag, PARTITIONS, TOTAL, id_base, extra);
    chaos_isolate_coordinator(&c, COORD);
    wxg_ct_spawn(&c.t, 0);
    size_t half = TOTAL / 2;
    chaos_produce(&c, 0, half, NULL);
    chaos_wait_all_committed(&c, 60000);
    int64_t before[PARTITIONS];
    for (int p = 0; p < PARTITIONS; p++)
        before[p] = c.last_committed[p];

    if (silent)
        wxg_test_devbroker_cmd(&c.db, "broker-errors %d OffsetCommit NO_ERROR:60000", COORD);
    else
        wxg_test_devbroker_cmd(&c.db, "broker down %d", COORD);
    int64_t down_at = wxg_test_now_ms();
    chaos_produce(&c, half, TOTAL, NULL);
    /* Wait until the batch is processed, well within the session. */
    int64_t deadline = wxg_test_now_ms() + 5000 * wxg_test_scale();
    size_t done = 0;
    static int counts[CHAOS_MAX_MSGS];
    while (done < TOTAL - half && wxg_test_now_ms() < deadline) {
        wxg_test_sleep_ms(100);
        /* One ledger read per round, not one per message (slow in a sanitizer build). */
        chaos_effect_counts(&c, counts);
        done = 0;
        for (size_t i = half; i < TOTAL; i++)
            done += counts[i] == 1;
    }
    assert_int_equal(done, TOTAL - half);
    assert_int_equal(wxg_ct_log_count(&c.t, 0, "lost=true"), 0);

    int64_t t0 = wxg_test_now_ms();
    int st = wxg_ct_signal(&c.t, 0, SIGTERM, 60000);
    int64_t stop_ms = wxg_test_now_ms() - t0;
    wxg_ct_assert_exit(&c.t, 0, st, 0);
    print_message("stopped %lld ms after SIGTERM (%lld ms into the fault); final commit abandoned: "
                  "%d, close timed out: %d\n",
                  (long long)stop_ms, (long long)(t0 - down_at),
                  wxg_ct_log_count(&c.t, 0, "event=final_commit_failed kafka_err=_TIMED_OUT"),
                  wxg_ct_log_count(&c.t, 0, "event=close_timeout"));
    /* Drain (nothing in flight), the final commit's budget, then the close's (the same once
     * the final commit went unanswered): far less than the session timeout, which bounded
     * each of the commit and the close before. */
    assert_int_equal(wxg_ct_log_count(&c.t, 0, "event=final_commit_failed kafka_err=_TIMED_OUT"),
                     1);
    assert_true(stop_ms < (2 * COMMIT_MS + 3000) * wxg_test_scale());

    if (silent) {
        /* The mock applies a commit when it arrives and only holds the answer, so offsets may
         * have moved: never past a missing effect. */
        chaos_check(&c);
    } else {
        /* With the coordinator back: nothing was committed past what was before the fault. */
        wxg_test_devbroker_cmd(&c.db, "broker up %d", COORD);
        chaos_check(&c);
        for (int p = 0; p < PARTITIONS; p++)
            assert_int_equal(c.last_committed[p], before[p]);
    }

    /* A new replica takes over: what was not committed is skipped as duplicates. */
    wxg_ct_spawn(&c.t, 1);
    /* The stopped replica could not leave the group: the broker drops it at its session
     * timeout, and only then does the new one get the partitions. */
    chaos_wait_log(&c, 1, "event=assigned", 1, 30000);
    chaos_wait_all_committed(&c, 60000);
    chaos_check_exactly_once(&c, TOTAL);
    chaos_stop_replica(&c, 1);
    if (!silent)
        assert_true(chaos_log_max(&c, 1, "duplicates") >= TOTAL - half);
    chaos_teardown(&c);
}

static void sigterm_with_the_coordinator_down_exits_within_the_bound(void **state)
{
    (void)state;
    stop_while_unreachable("chaos-stopdown", 7302700000000000000ULL, 0);
}

static void sigterm_with_a_silent_coordinator_exits_within_the_bound(void **state)
{
    (void)state;
    stop_while_unreachable("chaos-stopsilent", 7302800000000000000ULL, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sigterm_with_the_coordinator_down_exits_within_the_bound),
        cmocka_unit_test(sigterm_with_a_silent_coordinator_exits_within_the_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
