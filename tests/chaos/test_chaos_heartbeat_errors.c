/* Chaos: every Heartbeat is answered NOT_COORDINATOR for a while, so no heartbeat of either
 * replica succeeds (librdkafka looks the coordinator up again, finds the same broker, and its
 * next heartbeat fails too). After the session timeout each replica revokes its partitions as
 * lost, without committing for them (wxguard never commits in a lost revoke: another member
 * may own them already); the broker has dropped the members meanwhile, so a periodic commit
 * that still goes out fails (UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION), and so do the commits
 * that meet the rejoin's rebalance (REBALANCE_IN_PROGRESS): at least one commit fails, and
 * every failure is counted and logged once, nothing more. Once heartbeats are answered again
 * the replicas rejoin and get partitions back; the invariants hold throughout, and in the end
 * every message is committed with exactly one effect. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "chaos.h"
#include "testenv.h"

#define PARTITIONS 4
#define TOTAL      600
#define ID_BASE    7302600000000000000ULL
/* Heartbeats go every 500 ms from each replica: enough errors for far longer than the 6 s
 * session timeout; the rest are cleared once both replicas have lost their assignment. */
#define HB_ERRORS 200

static chaos_t c;

static int commit_failures_logged(int idx)
{
    return wxg_ct_log_count(&c.t, idx, "event=commit_failed") +
           wxg_ct_log_count(&c.t, idx, "event=revoke_commit_failed");
}

static void failing_heartbeats_time_the_session_out_then_the_replicas_rejoin(void **state)
{
    (void)state;
    chaos_setup(&c, "chaos-hb", PARTITIONS, TOTAL, ID_BASE, NULL);
    wxg_ct_spawn(&c.t, 0);
    wxg_ct_spawn(&c.t, 1);
    size_t third = TOTAL / 3;
    chaos_produce(&c, 0, third, NULL);
    chaos_wait_all_committed(&c, 60000);
    int assigned0 = wxg_ct_log_count(&c.t, 0, "event=assigned");
    int assigned1 = wxg_ct_log_count(&c.t, 1, "event=assigned");

    wxg_test_devbroker_cmd(&c.db, "errors Heartbeat %d NOT_COORDINATOR", HB_ERRORS);
    int64_t from = wxg_test_now_ms();
    chaos_produce(&c, third, 2 * third, NULL);
    /* Commits still land while the sessions last: check as they go. */
    for (int i = 0; i < 8; i++) {
        chaos_check(&c);
        wxg_test_sleep_ms(250);
    }
    chaos_wait_log(&c, 0, "lost=true", 1, 20000);
    chaos_wait_log(&c, 1, "lost=true", 1, 20000);
    int64_t lost_after = wxg_test_now_ms() - from;
    wxg_test_devbroker_cmd(&c.db, "clear-errors Heartbeat");
    int timeouts = wxg_ct_log_count(&c.t, 0, "SESSTMOUT") + wxg_ct_log_count(&c.t, 1, "SESSTMOUT");

    chaos_produce(&c, 2 * third, TOTAL, NULL);
    chaos_wait_all_committed(&c, 60000);
    chaos_check_exactly_once(&c, TOTAL);
    assert_true(wxg_ct_alive(&c.t, 0) && wxg_ct_alive(&c.t, 1));
    /* Rejoined: each got an assignment again after the lost one (not necessarily before the
     * other had committed everything; see test_chaos_coordinator_down.c). */
    chaos_wait_log(&c, 0, "event=assigned", assigned0 + 1, 30000);
    chaos_wait_log(&c, 1, "event=assigned", assigned1 + 1, 30000);

    chaos_stop_replica(&c, 0);
    chaos_stop_replica(&c, 1);
    uint64_t errors = chaos_log_max(&c, 0, "commit_errors") + chaos_log_max(&c, 1, "commit_errors");
    int logged = commit_failures_logged(0) + commit_failures_logged(1);
    int member_gone = 0;
    for (int i = 0; i < 2; i++)
        member_gone += wxg_ct_log_count(&c.t, i, "commit_failed kafka_err=UNKNOWN_MEMBER_ID") +
                       wxg_ct_log_count(&c.t, i, "commit_failed kafka_err=ILLEGAL_GENERATION");
    print_message("assignments lost %lld ms after heartbeats began to fail (session timeouts "
                  "logged: %d); commit failures counted %llu, logged %d, of which for a member "
                  "the broker had dropped: %d; offset samples %u\n",
                  (long long)lost_after, timeouts, (unsigned long long)errors, logged, member_gone,
                  c.samples);
    /* The session ran out on the replicas' side (not only on the broker's). */
    assert_true(timeouts >= 2);
    /* Commits did fail (the rejoin's rebalance refuses them at least: REBALANCE_IN_PROGRESS),
     * and every failure was seen by the consumer, counted and logged once. */
    assert_true(errors >= 1);
    assert_int_equal((int)errors, logged);
    chaos_check_exactly_once(&c, TOTAL);
    chaos_teardown(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(failing_heartbeats_time_the_session_out_then_the_replicas_rejoin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
