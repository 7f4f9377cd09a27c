/* Chaos: partition 0 has no leader for ten seconds while records wait in it, then broker 2
 * leads it. The replica is stopped (SIGSTOP, well within the session timeout) while the second
 * batch is produced, so partition 0's part of it is in the broker but not fetched when the
 * leader goes. While the partition is leaderless the other partitions' records are processed
 * and committed and partition 0's are not (its fetch stalls, and its committed offset stays
 * where the first batch ended); once it has a leader again they are processed with no gap,
 * each exactly once, and no committed offset goes back or passes a missing effect.
 *
 * The test itself ends the leaderless period, after its last look at the ledger, so that what
 * it sees while the partition has no leader cannot depend on how fast the replica, the broker
 * or the test run (a sanitizer build is several times slower). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "chaos.h"
#include "testenv.h"

#define PARTITIONS    4
#define TOTAL         600
#define ID_BASE       7302200000000000000ULL
#define LEADERLESS_MS 10000
#define OTHERS_MS     60000 /* bound (scaled) for the other partitions to catch up */

static chaos_t c;

/* Stops replica idx and waits until the kernel reports it stopped: from then on none of its
 * threads runs, so no Fetch request of its reaches a broker after records produced later
 * (the broker answers a Fetch from what it holds when it reads the request). */
static void stop_replica(int idx)
{
    int st = 0;
    assert_int_equal(kill(c.t.pids[idx], SIGSTOP), 0);
    assert_int_equal(waitpid(c.t.pids[idx], &st, WUNTRACED), c.t.pids[idx]);
    assert_true(WIFSTOPPED(st));
}

/* Checks one look at the ledger taken while partition 0 has no leader: none of partition 0's
 * second-batch records has an effect. Returns 1 when every other second-batch record has
 * exactly one. */
static int check_while_leaderless(const int *counts)
{
    size_t others_done = 0, others = 0;
    for (size_t i = TOTAL / 2; i < TOTAL; i++) {
        if (c.msgs[i].partition == 0) {
            if (counts[i] != 0)
                fail_msg("partition 0, offset %lld (message %llu) was processed while the "
                         "partition had no leader",
                         (long long)c.offset_of[i], (unsigned long long)c.msgs[i].id);
        } else {
            if (counts[i] > 1)
                fail_msg("message %llu has a second effect (I2)", (unsigned long long)c.msgs[i].id);
            others++;
            others_done += counts[i] == 1;
        }
    }
    return others_done == others;
}

/* Asserts that every effect names the partition and offset its message was produced at: with
 * exactly one effect per message, every offset of every partition was processed (no gap). */
static void check_effects_at_their_offsets(void)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&c.t, &eff, NULL);
    for (size_t j = 0; j < n; j++) {
        size_t i = (size_t)(eff[j].id - ID_BASE);
        assert_true(eff[j].id >= ID_BASE && i < TOTAL);
        if (eff[j].partition != c.msgs[i].partition || eff[j].offset != c.offset_of[i])
            fail_msg("message %llu was produced at %d/%lld but processed at %d/%lld",
                     (unsigned long long)eff[j].id, c.msgs[i].partition, (long long)c.offset_of[i],
                     eff[j].partition, (long long)eff[j].offset);
    }
    free(eff);
}

static void a_leaderless_partition_stalls_then_resumes_with_no_gap(void **state)
{
    (void)state;
    chaos_setup(&c, "chaos-leader", PARTITIONS, TOTAL, ID_BASE, NULL);
    wxg_ct_spawn(&c.t, 0);
    chaos_produce(&c, 0, TOTAL / 2, NULL);
    chaos_wait_all_committed(&c, 60000);
    int64_t first_end = c.t.produced[0];

    stop_replica(0);
    chaos_produce(&c, TOTAL / 2, TOTAL, NULL);
    assert_true(c.t.produced[0] > first_end);
    wxg_test_devbroker_cmd(&c.db, "leader %s 0 -1", c.t.topic);
    int64_t gone = wxg_test_now_ms();
    assert_int_equal(kill(c.t.pids[0], SIGCONT), 0);

    /* Partition 0 stalls while the others are processed and committed; the period lasts at
     * least LEADERLESS_MS, and longer if the others need it. Every look is checked. */
    int *counts = calloc(TOTAL, sizeof *counts);
    assert_non_null(counts);
    for (;;) {
        chaos_check(&c);
        int others_committed = 1;
        for (int p = 1; p < PARTITIONS; p++)
            others_committed &= c.last_committed[p] == c.t.produced[p];
        chaos_effect_counts(&c, counts);
        int others_done = check_while_leaderless(counts) && others_committed;
        int64_t elapsed = wxg_test_now_ms() - gone;
        if (others_done && elapsed >= LEADERLESS_MS)
            break;
        if (elapsed >= (int64_t)OTHERS_MS * wxg_test_scale())
            fail_msg("the other partitions were not processed and committed within %d ms of "
                     "partition 0 losing its leader (log in %s)",
                     OTHERS_MS, c.t.dir);
        assert_true(wxg_ct_alive(&c.t, 0));
        wxg_test_sleep_ms(250);
    }
    free(counts);
    assert_int_equal(c.last_committed[0], first_end);
    print_message("leaderless for %lld ms: %lld partition-0 records waited, offset samples %u\n",
                  (long long)(wxg_test_now_ms() - gone), (long long)(c.t.produced[0] - first_end),
                  c.samples);

    wxg_test_devbroker_cmd(&c.db, "leader %s 0 2", c.t.topic);
    chaos_wait_all_committed(&c, 60000);
    chaos_check_exactly_once(&c, TOTAL);
    check_effects_at_their_offsets();
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
