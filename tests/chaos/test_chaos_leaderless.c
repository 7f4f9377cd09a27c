/* Chaos: partition 0 loses its leader for five seconds while records wait in it. The replica
 * was stopped (SIGSTOP, well within the session timeout) while the batch was produced, so the
 * records of partition 0 are in the broker but not yet fetched when the leader goes. While it
 * is leaderless the other partitions' records are processed and partition 0's are not (fetch
 * stalls); once broker 2 leads it, they are processed with no gap, each exactly once, and no
 * committed offset goes back or passes a missing effect. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>

#include "chaos.h"
#include "testenv.h"

#define PARTITIONS    4
#define TOTAL         600
#define ID_BASE       7302200000000000000ULL
#define LEADERLESS_MS 5000

static chaos_t c;

static void a_leaderless_partition_stalls_then_resumes_with_no_gap(void **state)
{
    (void)state;
    chaos_setup(&c, "chaos-leader", PARTITIONS, TOTAL, ID_BASE, NULL);
    wxg_ct_spawn(&c.t, 0);
    chaos_produce(&c, 0, TOTAL / 2, NULL);
    chaos_wait_all_committed(&c, 60000);

    assert_int_equal(kill(c.t.pids[0], SIGSTOP), 0);
    chaos_produce(&c, TOTAL / 2, TOTAL, NULL);
    wxg_test_devbroker_cmd(&c.db, "leader %s 0 -1", c.t.topic);
    wxg_test_devbroker_cmd(&c.db, "after %d leader %s 0 2", LEADERLESS_MS, c.t.topic);
    int64_t gone = wxg_test_now_ms();
    assert_int_equal(kill(c.t.pids[0], SIGCONT), 0);

    /* Until shortly before the leader returns: partition 0 stalls, the others go on. */
    while (wxg_test_now_ms() - gone < LEADERLESS_MS - 1000) {
        chaos_check(&c);
        wxg_test_sleep_ms(250);
    }
    size_t stalled = 0, others_missing = 0;
    for (size_t i = TOTAL / 2; i < TOTAL; i++) {
        int k = chaos_effects_of(&c, i);
        if (c.msgs[i].partition == 0)
            stalled += k == 0;
        else
            others_missing += k == 0;
    }
    size_t p0 = 0;
    for (size_t i = TOTAL / 2; i < TOTAL; i++)
        p0 += c.msgs[i].partition == 0;
    print_message("while leaderless: %zu of %zu partition-0 records waiting, %zu others "
                  "unprocessed\n",
                  stalled, p0, others_missing);
    assert_true(p0 > 0);
    assert_int_equal(stalled, p0);
    assert_int_equal(others_missing, 0);

    chaos_wait_all_committed(&c, 60000);
    chaos_check_exactly_once(&c, TOTAL);
    chaos_stop_replica(&c, 0);
    print_message("resumed after the leader came back; offset samples %u\n", c.samples);
    chaos_teardown(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_leaderless_partition_stalls_then_resumes_with_no_gap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
