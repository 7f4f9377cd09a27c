/* Chaos: every broker answers 2 s late (round-trip latency of 2000 ms on all brokers, longer
 * than a third of the session timeout) for longer than a session timeout. The two replicas get
 * slower (a batch takes seconds to be fetched and committed instead of a fraction of one) but
 * stay in the group: heartbeats that come back late are still heartbeats, so no session times
 * out and no rebalance happens, and no committed offset goes back or passes a missing effect.
 * With the latency gone, everything is committed with exactly one effect. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "chaos.h"
#include "testenv.h"

#define PARTITIONS 4
#define TOTAL      600
#define ID_BASE    7302500000000000000ULL
#define RTT_MS     2000
#define SLOW_MS    8000 /* longer than kafka.session.timeout.ms (6 s) */

static chaos_t c;

/* Rebalance events in replica idx's log so far. */
static int rebalances(int idx)
{
    return wxg_ct_log_count(&c.t, idx, "event=assigned") +
           wxg_ct_log_count(&c.t, idx, "event=revoked");
}

static void slow_brokers_lower_throughput_without_rebalance_or_regression(void **state)
{
    (void)state;
    chaos_setup(&c, "chaos-slow", PARTITIONS, TOTAL, ID_BASE, NULL);
    wxg_ct_spawn(&c.t, 0);
    wxg_ct_spawn(&c.t, 1);
    size_t a = TOTAL / 3, b = TOTAL / 2, s = 5 * TOTAL / 6;
    chaos_produce(&c, 0, a, NULL);
    chaos_wait_all_committed(&c, 60000);

    /* Baseline: a batch from produced to committed with prompt brokers. */
    chaos_produce(&c, a, b, NULL);
    int64_t t0 = wxg_test_now_ms();
    chaos_wait_all_committed(&c, 30000);
    int64_t fast_ms = wxg_test_now_ms() - t0;

    int reb0 = rebalances(0), reb1 = rebalances(1);
    wxg_test_devbroker_cmd(&c.db, "rtt -1 %d", RTT_MS);
    int64_t slow_from = wxg_test_now_ms();
    chaos_produce(&c, b, s, NULL); /* itself slow: each request waits RTT_MS */
    t0 = wxg_test_now_ms();
    chaos_wait_all_committed(&c, 60000);
    int64_t slow_ms = wxg_test_now_ms() - t0;
    /* Keep the latency for longer than a session timeout in all, checking meanwhile. */
    while (wxg_test_now_ms() - slow_from < SLOW_MS) {
        chaos_check(&c); /* at least one round trip each */
        wxg_test_sleep_ms(200);
    }
    int64_t slow_total = wxg_test_now_ms() - slow_from;
    int reb0_after = rebalances(0), reb1_after = rebalances(1);
    int timeouts = wxg_ct_log_count(&c.t, 0, "SESSTMOUT") + wxg_ct_log_count(&c.t, 1, "SESSTMOUT");
    wxg_test_devbroker_cmd(&c.db, "rtt -1 0");

    chaos_produce(&c, s, TOTAL, NULL);
    chaos_wait_all_committed(&c, 30000);
    chaos_check_exactly_once(&c, TOTAL);
    assert_true(wxg_ct_alive(&c.t, 0) && wxg_ct_alive(&c.t, 1));
    chaos_stop_replica(&c, 0);
    chaos_stop_replica(&c, 1);
    print_message("%zu messages produced-to-committed in %lld ms with prompt brokers, %zu in %lld "
                  "ms with %d ms RTT (held %lld ms); rebalance events during it: %d + %d, "
                  "session timeouts %d, offset samples %u\n",
                  b - a, (long long)fast_ms, s - b, (long long)slow_ms, RTT_MS,
                  (long long)slow_total, reb0_after - reb0, reb1_after - reb1, timeouts, c.samples);
    /* Slower: a fetch and a commit each cost at least one round trip, and the sample another. */
    assert_true(slow_ms >= 2 * RTT_MS);
    assert_true(slow_ms > fast_ms);
    /* No spurious rebalance. */
    assert_int_equal(reb0_after, reb0);
    assert_int_equal(reb1_after, reb1);
    assert_int_equal(timeouts, 0);
    /* The rebalance counter (wxg_rebalances_total, in the final stats line) tells the same. */
    assert_int_equal(chaos_log_max(&c, 0, "rebalances"), rebalances(0));
    assert_int_equal(chaos_log_max(&c, 1, "rebalances"), rebalances(1));
    chaos_check_exactly_once(&c, TOTAL);
    chaos_teardown(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slow_brokers_lower_throughput_without_rebalance_or_regression),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
