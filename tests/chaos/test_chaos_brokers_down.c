/* Chaos: every broker is down when the replica starts. The replica stays up without a busy
 * loop (little CPU, a bounded number of log lines) and processes nothing; when the brokers
 * come up it joins the group and processes every waiting message exactly once, and commits
 * them all. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chaos.h"
#include "testenv.h"
#include "wxguard/metrics.h"

#define PARTITIONS 2
#define TOTAL      300
#define ID_BASE    7302300000000000000ULL
#define DOWN_MS    6000

static chaos_t c;

/* CPU time (user + system) that process `pid` used so far, in milliseconds; -1 if unknown. */
static int64_t cpu_ms(pid_t pid)
{
    wxg_process_stats_t ps;
    return wxg_process_stats((long)pid, &ps) == 0 ? (int64_t)(ps.cpu_seconds * 1000) : -1;
}

static int log_lines(int idx)
{
    return wxg_ct_log_count(&c.t, idx, ""); /* every line: its own and librdkafka's */
}

static void replica_waits_without_busy_loop_until_brokers_come_up(void **state)
{
    (void)state;
    chaos_setup(&c, "chaos-down", PARTITIONS, TOTAL, ID_BASE, NULL);
    chaos_produce(&c, 0, TOTAL, NULL);
    wxg_test_devbroker_cmd(&c.db, "broker down -1");
    pid_t pid = wxg_ct_spawn(&c.t, 0);
    wxg_test_sleep_ms(1000); /* past start-up (configuration, Redis, plugins) */
    int64_t cpu0 = cpu_ms(pid), lines0 = log_lines(0);
    wxg_test_sleep_ms(DOWN_MS);
    int64_t cpu1 = cpu_ms(pid), lines1 = log_lines(0);
    assert_true(wxg_ct_alive(&c.t, 0));
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&c.t, &eff, NULL);
    free(eff);
    print_message("brokers down %d ms: replica used %lld ms CPU, wrote %lld log lines, %zu "
                  "effects\n",
                  DOWN_MS, (long long)(cpu1 - cpu0), (long long)(lines1 - lines0), n);
    assert_int_equal(n, 0);
    assert_true(cpu0 >= 0 && cpu1 >= cpu0);
    /* A busy loop would burn most of a core; polling with back-off uses a few percent. */
    assert_true(cpu1 - cpu0 < DOWN_MS / 5);
    assert_true(lines1 - lines0 < 200);

    wxg_test_devbroker_cmd(&c.db, "broker up -1");
    chaos_wait_all_committed(&c, 60000);
    chaos_check_exactly_once(&c, TOTAL);
    chaos_stop_replica(&c, 0);
    chaos_teardown(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(replica_waits_without_busy_loop_until_brokers_come_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
