/* Chaos: the group coordinator moves to another broker mid-run, three times (to brokers 1, 2
 * and 3, so at least two are real moves). The two replicas keep consuming, their commits land
 * on the new coordinator (every message ends up committed), and the invariants hold
 * throughout: no committed offset goes back or passes a missing effect, one effect each. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "chaos.h"
#include "testenv.h"

#define PARTITIONS 4
#define TOTAL      800
#define ID_BASE    7302100000000000000ULL

static chaos_t c;

static void moving_the_group_coordinator_keeps_consuming_and_commits_land(void **state)
{
    (void)state;
    chaos_setup(&c, "chaos-coord", PARTITIONS, TOTAL, ID_BASE, NULL);
    wxg_ct_spawn(&c.t, 0);
    wxg_ct_spawn(&c.t, 1);
    size_t step = TOTAL / 4;
    chaos_produce(&c, 0, step, NULL);
    chaos_wait_all_committed(&c, 60000);
    for (int broker = 1; broker <= 3; broker++) {
        /* Move while the next batch is on its way, so that in-flight commits meet the move. */
        chaos_produce(&c, (size_t)broker * step, (size_t)broker * step + step / 2, NULL);
        wxg_test_devbroker_cmd(&c.db, "coordinator group %s %d", c.t.group, broker);
        chaos_produce(&c, (size_t)broker * step + step / 2, (size_t)(broker + 1) * step, NULL);
        chaos_wait_all_committed(&c, 30000);
    }
    chaos_check_exactly_once(&c, TOTAL);
    assert_true(wxg_ct_alive(&c.t, 0) && wxg_ct_alive(&c.t, 1));
    chaos_stop_replica(&c, 0);
    chaos_stop_replica(&c, 1);
    print_message("offset samples %u, commit errors %llu + %llu, rebalances %llu + %llu\n",
                  c.samples, (unsigned long long)chaos_log_max(&c, 0, "commit_errors"),
                  (unsigned long long)chaos_log_max(&c, 1, "commit_errors"),
                  (unsigned long long)chaos_log_max(&c, 0, "rebalances"),
                  (unsigned long long)chaos_log_max(&c, 1, "rebalances"));
    chaos_check_exactly_once(&c, TOTAL);
    chaos_teardown(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(moving_the_group_coordinator_keeps_consuming_and_commits_land),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
