/* End to end: a replica stopped while one offset is held by a slow plugin, and a replica left
 * idle for longer than max.poll.interval.ms. One partition; offset 3 stalls in the fail plugin
 * while offsets 4..19 (other conversations) take effect behind it.
 *  - SIGTERM with the held message still running past consumer.drain.timeout.ms: the replica
 *    exits 0 within the drain budget (plus the final commit and the close), without waiting
 *    for the plugin; the committed offset, sampled every 100 ms before and after, never
 *    passes offset 3; the next owner processes the held message once, and finds 4..19 DONE;
 *  - SIGKILL while offset 3 is held: the committed offset, sampled every 100 ms, never passes
 *    it; after the kill the message runs once more (a new claim, whose fence is past the old
 *    lease's end) and takes effect once;
 *    4..19 are duplicates for the next owner;
 *  - a replica whose topic stays empty for twice max.poll.interval.ms stays in the group (no
 *    revoke, no new assignment, nothing about the poll interval in its log) and processes a
 *    message produced afterwards at once. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "consumertest.h"
#include "testenv.h"

#define ID_BASE 7302334567000000000ULL
#define N       20
#define HELD    3 /* the offset whose plugin stalls */

static uint64_t *offset_ids[1];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

/* The configuration: the held message stalls stall_ms in the fail plugin (under the
 * watchdog's renewal bound of ten leases, so that its claim stays live meanwhile); one message
 * per batch, so that the messages behind it are not in its batch but on the other workers. */
static void write_config(wxg_ct_t *t, int stall_ms, const char *more)
{
    char extra[1024];
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = %d\n"
             "plugin.fail.match.msg_ids = %llu\n"
             "guard.lease.ms = 5s\n"
             "consumer.batch.max = 1\n"
             "%s",
             stall_ms, (unsigned long long)(ID_BASE + HELD), more ? more : "");
    wxg_ct_write_config(t, extra);
}

/* Produces N messages on partition 0, offset i holding message ID_BASE + i, each of its own
 * conversation, so that only the held one waits. */
static void produce_all(wxg_ct_t *t)
{
    wxg_ct_msg_t m[N];
    offset_ids[0] = calloc(N, sizeof **offset_ids);
    assert_non_null(offset_ids[0]);
    for (int i = 0; i < N; i++) {
        m[i] = (wxg_ct_msg_t){.partition = 0, .id = ID_BASE + (uint64_t)i, .conv = 10 + i};
        offset_ids[0][i] = m[i].id;
    }
    wxg_ct_produce(t, m, N);
}

/* Effects of message id in the ledger; *fence gets the last one's fencing token. */
static int effects_of(const wxg_ct_t *t, uint64_t id, uint64_t *fence)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        if (eff[i].id == id) {
            k++;
            if (fence)
                *fence = eff[i].fence;
        }
    }
    free(eff);
    return k;
}

/* Samples the committed offset every 100 ms until every message but the held one took
 * effect (the held one stalls meanwhile); fails when the committed offset passes HELD. */
static void wait_held(wxg_ct_t *t)
{
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    for (;;) {
        int64_t c = wxg_ct_committed(t, 0);
        if (c > HELD)
            fail_msg("committed offset %lld passes the held message at offset %d", (long long)c,
                     HELD);
        check_invariant(t);
        wxg_ct_effect_t *eff;
        size_t n = wxg_ct_read_ledger(t, &eff, NULL);
        free(eff);
        if (n == N - 1)
            break;
        assert_true(wxg_test_now_ms() < deadline);
        wxg_test_sleep_ms(100);
    }
    /* Everything but the held message is done; let a commit or two go out. */
    for (int i = 0; i < 5; i++) {
        assert_true(wxg_ct_committed(t, 0) <= HELD);
        wxg_test_sleep_ms(100);
    }
    assert_int_equal(effects_of(t, ID_BASE + HELD, NULL), 0);
    assert_int_equal(wxg_ct_committed(t, 0), HELD);
}

/* The wall clock in µs: a fence is the end of a lease in the Redis server's µs
 * (docs/guard.md §3.4), and the server runs on this machine. */
static uint64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The next owner, replica idx: sampled every 100 ms until everything is committed (the
 * invariant checked each time), the held message takes effect once, with a new claim once the
 * old lease ran out; the messages behind it are duplicates for the new owner; it stops cleanly.
 * stopped_us: the wall clock when the first owner was stopped. Its lease (renewed while the
 * plugin stalled) ended after that, and the new claim came after that end, so the new fence
 * (the end of the new 5 s lease) is more than a lease past the stop. */
static void next_owner_runs_the_held_message_once(wxg_ct_t *t, int idx, uint64_t stopped_us)
{
    assert_true(wxg_ct_wait_all_committed_every(t, 120000, check_invariant, 100));
    check_invariant(t);
    wxg_ct_assert_each_once(t, ID_BASE, N);
    uint64_t fence = 0;
    assert_int_equal(effects_of(t, ID_BASE + HELD, &fence), 1);
    if (fence <= stopped_us + 5000000u)
        fail_msg("the held message took effect at fence %llu, not a new claim's after the stop "
                 "at %llu us",
                 (unsigned long long)fence, (unsigned long long)stopped_us);
    wxg_ct_assert_exit(t, idx, wxg_ct_signal(t, idx, SIGTERM, 30000), 0);
    assert_int_equal(wxg_ct_log_last(t, idx, "event=stats", "processed"), 1);
    assert_int_equal(wxg_ct_log_last(t, idx, "event=stats", "duplicates"), N - 1 - HELD);
}

static void
sigterm_past_the_drain_budget_exits_in_time_and_commits_nothing_past_the_held_offset(void **state)
{
    (void)state;
    enum { DRAIN_MS = 2000, STALL_MS = 45000 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-term-held", 1);
    write_config(&t, STALL_MS, "consumer.drain.timeout.ms = 2s\n");
    produce_all(&t);
    wxg_ct_spawn(&t, 0);
    wait_held(&t);

    wxg_ct_stop_t stop;
    uint64_t stopped_us = wall_us();
    int st = wxg_ct_stop(&t, 0, SIGTERM, 30000, &stop);
    int64_t took = stop.exited_ms - stop.sent_ms;
    print_message("SIGTERM to exit: %lld ms (drain budget %d ms, the plugin stalls %d ms)\n",
                  (long long)took, DRAIN_MS, STALL_MS);
    wxg_ct_assert_exit(&t, 0, st, 0);
    /* Within the drain budget plus the final commit and the close (a few seconds at most),
     * far from the plugin's stall. */
    assert_true(took < DRAIN_MS + 5000 * wxg_test_scale());
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=drain_timeout"), 1);
    assert_int_equal(wxg_ct_committed(&t, 0), HELD);
    assert_int_equal(effects_of(&t, ID_BASE + HELD, NULL), 0);

    /* The next owner, without the stall: the held message once (a new claim once the old
     * lease ran out), the others are duplicates. */
    write_config(&t, 0, NULL);
    wxg_ct_spawn(&t, 1);
    next_owner_runs_the_held_message_once(&t, 1, stopped_us);
    free(offset_ids[0]);
    wxg_ct_teardown(&t);
}

static void
sigkill_while_an_offset_is_held_never_commits_past_it_and_it_runs_once_more(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-kill-held", 1);
    write_config(&t, 45000, NULL);
    produce_all(&t);
    wxg_ct_spawn(&t, 0);
    wait_held(&t);

    wxg_ct_stop_t stop;
    uint64_t stopped_us = wall_us();
    assert_true(wxg_ct_stop(&t, 0, SIGKILL, 10000, &stop) != -1);
    assert_int_equal(wxg_ct_committed(&t, 0), HELD);
    /* The next owner runs the held message once more (its plugin now stalls one second). */
    write_config(&t, 1000, NULL);
    wxg_ct_spawn(&t, 1);
    next_owner_runs_the_held_message_once(&t, 1, stopped_us);
    wxg_ct_repeats_t r;
    wxg_ct_classify_repeats(&t, &stop, 1, &r);
    assert_int_equal(r.total, 0);
    assert_int_equal(r.taken_over[0], 1);
    free(offset_ids[0]);
    wxg_ct_teardown(&t);
}

static void an_idle_topic_past_max_poll_interval_keeps_the_replica_in_the_group(void **state)
{
    (void)state;
    enum { POLL_MS = 6000 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-idle", 1);
    char extra[256];
    snprintf(extra, sizeof extra, "kafka.max.poll.interval.ms = %d\n", POLL_MS);
    wxg_ct_write_config(&t, extra);
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_ct_wait_log(&t, 0, "event=assigned partitions=1 ", 1, 30000));
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=assigned partitions=1 "), 1);

    /* Nothing to read for twice the poll interval. */
    wxg_test_sleep_ms(2 * POLL_MS + 1000);
    assert_true(wxg_ct_alive(&t, 0));
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=revoked"), 0);
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=assigned"), 1);

    /* A message now is processed at once: no rejoin first. */
    wxg_ct_msg_t m = {.partition = 0, .id = ID_BASE + 100, .conv = 1};
    int64_t t0 = wxg_test_now_ms();
    wxg_ct_produce(&t, &m, 1);
    int64_t deadline = t0 + 10000 * wxg_test_scale();
    uint64_t fence = 0;
    while (effects_of(&t, m.id, &fence) == 0 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(10);
    int64_t took = wxg_test_now_ms() - t0;
    print_message("after %d ms idle, a new message took effect %lld ms after it was produced\n",
                  2 * POLL_MS + 1000, (long long)took);
    assert_int_equal(effects_of(&t, m.id, NULL), 1);
    assert_true(took < 2000 * wxg_test_scale());
    assert_true(wxg_ct_wait_all_committed(&t, 10000, NULL));

    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    wxg_ct_assert_exit(&t, 0, st, 0);
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=assigned"), 1);
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=revoked"), 1); /* the one at the stop */
    assert_int_equal(wxg_ct_log_count(&t, 0, "MAX_POLL"), 0);
    assert_int_equal(wxg_ct_log_count(&t, 0, "maximum poll interval"), 0);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            sigterm_past_the_drain_budget_exits_in_time_and_commits_nothing_past_the_held_offset),
        cmocka_unit_test(
            sigkill_while_an_offset_is_held_never_commits_past_it_and_it_runs_once_more),
        cmocka_unit_test(an_idle_topic_past_max_poll_interval_keeps_the_replica_in_the_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
