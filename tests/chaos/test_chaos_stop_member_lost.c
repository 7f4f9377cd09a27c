/* Chaos: SIGTERM a replica whose group membership is lost during its stop. The replica has a
 * batch inside its plugins when the signal comes; the broker then refuses its commits with
 * UNKNOWN_MEMBER_ID, as a coordinator does once the member's session has timed out or a
 * rebalance went on without it. The stop ends within its budget (drain, commit and close
 * budgets), nothing is committed past a missing effect, and a new replica finishes the work
 * with one effect per message.
 *   - lost: the refused commits only.
 *   - stuck: the same, and the release of the revoked partitions (rd_kafka_assign(NULL)) is
 *     never answered, as librdkafka 2.0.2 leaves it when its terminating group purges the
 *     request (tests/chaos/stuck_release.c, preloaded into the replica). The replica gives the
 *     release the commit budget, abandons the handle and exits; before, it hung in the revoke
 *     until it was killed.
 * And a revoke outside a stop whose resume is never answered (the partitions were paused for
 * backpressure; stuck_release.c makes the resume block once the test says so): the replica gives
 * the resume the commit budget, then stops with a failure status, so that its supervisor starts
 * it again, instead of hanging inside the rebalance for good; a new replica finishes the work. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chaos.h"
#include "testenv.h"

#define PARTITIONS 2
#define FIRST      20 /* processed and committed before the fault */
#define TOTAL      40
#define STALL_MS   1500
#define DRAIN_MS   4000
#define COMMIT_MS  1000
#define SESSION_MS 6000

static chaos_t c;

static void stop_after_a_lost_membership(const char *tag, uint64_t id_base, int stuck)
{
    char extra[1024];
    /* The first message of each partition in the second batch stalls in the fail plugin, so
     * that the SIGTERM finds work in flight. */
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = %d\n"
             "plugin.fail.match.msg_ids = %llu,%llu\n"
             "consumer.drain.timeout.ms = %dms\n"
             "consumer.commit.timeout.ms = %dms\n"
             "kafka.session.timeout.ms = %d\n",
             STALL_MS, (unsigned long long)(id_base + FIRST),
             (unsigned long long)(id_base + FIRST + 1), DRAIN_MS, COMMIT_MS, SESSION_MS);
    chaos_setup(&c, tag, PARTITIONS, TOTAL, id_base, extra);
    if (stuck) {
        /* For this replica only: the preload library, and ASan (in a sanitizer build) told
         * that its runtime need not be the first library loaded. */
        const char *asan = getenv("ASAN_OPTIONS");
        char opts[512];
        snprintf(opts, sizeof opts, "%s%sverify_asan_link_order=0", asan ? asan : "",
                 asan && asan[0] ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
        setenv("LD_PRELOAD", WXG_STUCK_RELEASE_LIB, 1);
        setenv("STUCK_RELEASE", "1", 1);
    }
    wxg_ct_spawn(&c.t, 0);
    if (stuck) {
        unsetenv("STUCK_RELEASE");
        unsetenv("LD_PRELOAD");
    }
    chaos_produce(&c, 0, FIRST, NULL);
    chaos_wait_all_committed(&c, 60000);
    chaos_produce(&c, FIRST, TOTAL, NULL);
    wxg_test_sleep_ms(STALL_MS / 3);
    /* The group no longer knows the member: every commit from now on is refused. */
    wxg_test_devbroker_cmd(&c.db, "errors OffsetCommit 8 UNKNOWN_MEMBER_ID");

    int64_t t0 = wxg_test_now_ms();
    int st = wxg_ct_signal(&c.t, 0, SIGTERM, 30000);
    int64_t stop_ms = wxg_test_now_ms() - t0;
    print_message(
        "stopped %lld ms after SIGTERM; revoke commits refused: %d, revokes ended: "
        "%d, releases abandoned: %d\n",
        (long long)stop_ms,
        wxg_ct_log_count(&c.t, 0, "event=revoke_commit_failed kafka_err=UNKNOWN_MEMBER_ID"),
        wxg_ct_log_count(&c.t, 0, "event=revoked"),
        wxg_ct_log_count(&c.t, 0, "event=release_timeout"));
    wxg_ct_assert_exit(&c.t, 0, st, 0);
    assert_true(wxg_ct_log_count(&c.t, 0, "kafka_err=UNKNOWN_MEMBER_ID") >= 1);
    if (stuck)
        assert_int_equal(wxg_ct_log_count(&c.t, 0, "event=release_timeout"), 1);
    /* The drain (the stalled batch ends well within it), then at most a commit budget for the
     * final commit, one for the release and one for the close that a lost membership leaves:
     * far below the session timeout that bounded the close before, and below for ever. */
    assert_true(stop_ms < (STALL_MS + 3 * COMMIT_MS + 2000) * wxg_test_scale());

    /* Nothing was committed past a missing effect; a new replica finishes the work. */
    wxg_test_devbroker_cmd(&c.db, "clear-errors OffsetCommit");
    chaos_check(&c);
    wxg_ct_spawn(&c.t, 1);
    chaos_wait_all_committed(&c, 60000);
    chaos_check_exactly_once(&c, TOTAL);
    chaos_stop_replica(&c, 1);
    chaos_teardown(&c);
}

static void a_stop_after_a_lost_membership_ends_within_its_budget(void **state)
{
    (void)state;
    stop_after_a_lost_membership("chaos-stoplost", 7303100000000000000ULL, 0);
}

static void a_release_never_answered_does_not_hold_the_stop(void **state)
{
    (void)state;
    stop_after_a_lost_membership("chaos-stopstuck", 7303200000000000000ULL, 1);
}

static void a_resume_never_answered_ends_the_replica_with_a_failure(void **state)
{
    (void)state;
    const uint64_t id_base = 7303300000000000000ULL;
    enum { STALLED = 10 };
    char ids[512], extra[1024];
    size_t at = 0;
    for (int k = 0; k < STALLED; k++)
        at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%llu", k ? "," : "",
                               (unsigned long long)(id_base + FIRST + (uint64_t)k));
    /* One worker, a small queue and messages that stall 3 s each: the backlog fills and the
     * replica pauses its partitions for several seconds. */
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = 3000\n"
             "plugin.fail.match.msg_ids = %s\n"
             "consumer.workers = 1\n"
             "consumer.queue.capacity = 4\n"
             "consumer.batch.max = 1\n"
             "consumer.drain.timeout.ms = 2000ms\n"
             "consumer.commit.timeout.ms = %dms\n"
             "guard.lease.ms = 3s\n"
             "kafka.session.timeout.ms = %d\n"
             "kafka.heartbeat.interval.ms = 300\n",
             ids, COMMIT_MS, SESSION_MS);
    chaos_setup(&c, "chaos-stuckresume", PARTITIONS, FIRST + STALLED, id_base, extra);
    char flag[600];
    snprintf(flag, sizeof flag, "%s/resume-stuck", c.t.dir);
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof opts, "%s%sverify_asan_link_order=0", asan ? asan : "",
             asan && asan[0] ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    setenv("LD_PRELOAD", WXG_STUCK_RELEASE_LIB, 1);
    setenv("STUCK_RESUME", flag, 1);
    wxg_ct_spawn(&c.t, 0);
    unsetenv("STUCK_RESUME");
    unsetenv("LD_PRELOAD");
    chaos_produce(&c, 0, FIRST, NULL);
    chaos_wait_all_committed(&c, 60000);
    chaos_produce(&c, FIRST, FIRST + STALLED, NULL);
    chaos_wait_log(&c, 0, "reason=backlog", 1, 20000);

    /* From now on a resume is never answered; a new member makes the group rebalance while
     * the partitions are paused. The new replica's plugin does not stall. */
    FILE *f = fopen(flag, "w");
    assert_non_null(f);
    fclose(f);
    int64_t t0 = wxg_test_now_ms();
    wxg_ct_spawn_set(&c.t, 1, (const char *const[]){"plugin.fail.stall.ms=1", NULL});
    int st = wxg_ct_wait_exit(&c.t, 0, 30000);
    int64_t end_ms = wxg_test_now_ms() - t0;
    print_message("replica ended %lld ms after the new member started; resumes abandoned: %d\n",
                  (long long)end_ms, wxg_ct_log_count(&c.t, 0, "event=resume_timeout"));
    wxg_ct_assert_exit(&c.t, 0, st, 1);
    assert_int_equal(wxg_ct_log_count(&c.t, 0, "event=resume_timeout"), 1);
    assert_int_equal(wxg_ct_log_count(&c.t, 0, "action=restart"), 1);

    chaos_check(&c);
    chaos_wait_all_committed(&c, 60000);
    chaos_check_exactly_once(&c, FIRST + STALLED);
    chaos_stop_replica(&c, 1);
    chaos_teardown(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_stop_after_a_lost_membership_ends_within_its_budget),
        cmocka_unit_test(a_release_never_answered_does_not_hold_the_stop),
        cmocka_unit_test(a_resume_never_answered_ends_the_replica_with_a_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
