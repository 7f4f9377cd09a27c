/* Chaos: the broker fails the next five OffsetCommit requests (REBALANCE_IN_PROGRESS,
 * REQUEST_TIMED_OUT, NOT_COORDINATOR, ...) in the middle of a run of two replicas. The
 * failures are counted by the replicas, which keep running and commit again later; no
 * committed offset ever goes back or passes a message without its effect, and in the end every
 * message is committed with exactly one effect. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "chaos.h"
#include "testenv.h"

#define PARTITIONS 4
#define TOTAL      600
#define ID_BASE    7302000000000000000ULL

static chaos_t c;

static void offset_commit_errors_are_counted_retried_and_never_regress(void **state)
{
    (void)state;
    chaos_setup(&c, "chaos-commit", PARTITIONS, TOTAL, ID_BASE, NULL);
    wxg_ct_spawn(&c.t, 0);
    wxg_ct_spawn(&c.t, 1);
    chaos_produce(&c, 0, TOTAL / 3, NULL);
    chaos_wait_all_committed(&c, 60000);

    /* Five failures: with a 200 ms commit interval and two replicas they hit the next few
     * commit rounds, while the second batch is being processed. */
    wxg_test_devbroker_cmd(&c.db, "errors OffsetCommit 5 REBALANCE_IN_PROGRESS REQUEST_TIMED_OUT "
                                  "NOT_COORDINATOR REBALANCE_IN_PROGRESS REQUEST_TIMED_OUT");
    chaos_produce(&c, TOTAL / 3, 2 * TOTAL / 3, NULL);
    for (int i = 0; i < 8; i++) {
        chaos_check(&c);
        wxg_test_sleep_ms(250);
    }
    chaos_produce(&c, 2 * TOTAL / 3, TOTAL, NULL);
    chaos_wait_all_committed(&c, 60000);
    chaos_check_exactly_once(&c, TOTAL);
    assert_true(wxg_ct_alive(&c.t, 0) && wxg_ct_alive(&c.t, 1));

    chaos_stop_replica(&c, 0);
    chaos_stop_replica(&c, 1);
    /* The final stats line of each replica carries its commit_errors counter. */
    uint64_t errors = chaos_log_max(&c, 0, "commit_errors") + chaos_log_max(&c, 1, "commit_errors");
    int logged = 0;
    for (int i = 0; i < 2; i++)
        logged += wxg_ct_log_count(&c.t, i, "event=commit_failed") +
                  wxg_ct_log_count(&c.t, i, "event=revoke_commit_failed");
    int rebalance_errors = wxg_ct_log_count(&c.t, 0, "kafka_err=REBALANCE_IN_PROGRESS") +
                           wxg_ct_log_count(&c.t, 1, "kafka_err=REBALANCE_IN_PROGRESS");
    print_message("commit failures counted %llu, logged %d (REBALANCE_IN_PROGRESS %d), offset "
                  "samples %u\n",
                  (unsigned long long)errors, logged, rebalance_errors, c.samples);
    /* librdkafka retries REQUEST_TIMED_OUT and NOT_COORDINATOR itself (after looking the
     * coordinator up again); REBALANCE_IN_PROGRESS reaches the commit callback. Every failure
     * that reaches it is counted and logged once. */
    assert_true(errors >= 1);
    assert_true(rebalance_errors >= 1);
    assert_int_equal((int)errors, logged);
    chaos_check_exactly_once(&c, TOTAL);
    chaos_teardown(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(offset_commit_errors_are_counted_retried_and_never_regress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
