/* End to end, with replicas that crash, join and leave while messages are in flight:
 *  - SIGKILL one of two replicas while hundreds of messages are in flight, then start it again:
 *    every message has an effect; a message has a second effect only when the killed replica
 *    ran it and died before completing it (a new claim, a higher fencing token, which a fenced
 *    downstream keeps as the one effect); a committed offset sampled during the run never
 *    passes a message without its effect;
 *  - with cooperative-sticky assignment, a third replica joins mid-run and one leaves with
 *    SIGTERM (exit 0): exactly one effect per message. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumertest.h"
#include "testenv.h"

#define PARTITIONS 6
#define CONVS      120
#define ID_BASE    7301234568000000000ULL

static uint64_t *offset_ids[PARTITIONS];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

/* Builds `total` records with ~20% duplicates; returns the number of unique ids. */
static size_t make_msgs(wxg_ct_msg_t *msgs, size_t total, unsigned seed)
{
    size_t unique = 0;
    for (size_t i = 0; i < total; i++) {
        if (i > 0 && rand_r(&seed) % 100 < 20) {
            msgs[i] = msgs[(size_t)rand_r(&seed) % i];
        } else {
            int conv = rand_r(&seed) % CONVS;
            msgs[i] = (wxg_ct_msg_t){
                .partition = conv % PARTITIONS, .id = ID_BASE + unique, .conv = conv};
            unique++;
        }
    }
    size_t count[PARTITIONS] = {0};
    for (int p = 0; p < PARTITIONS; p++) {
        offset_ids[p] = calloc(total, sizeof **offset_ids);
        assert_non_null(offset_ids[p]);
    }
    for (size_t i = 0; i < total; i++)
        offset_ids[msgs[i].partition][count[msgs[i].partition]++] = msgs[i].id;
    return unique;
}

static void free_ids(void)
{
    for (int p = 0; p < PARTITIONS; p++) {
        free(offset_ids[p]);
        offset_ids[p] = NULL;
    }
}

static size_t ledger_lines(const wxg_ct_t *t)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    free(eff);
    return n;
}

static int cmp_effect(const void *a, const void *b)
{
    const wxg_ct_effect_t *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->fence < y->fence ? -1 : x->fence > y->fence;
}

/* Checks the ledger: every unique id has an effect; repeated effects of one id come only from
 * `killed_pid` (0: none allowed) and carry distinct fencing tokens. Returns the repeats. */
static size_t check_effects(const wxg_ct_t *t, size_t unique, long killed_pid)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    qsort(eff, n, sizeof *eff, cmp_effect);
    size_t distinct = 0, repeats = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(eff[i].id >= ID_BASE && eff[i].id < ID_BASE + unique);
        if (i > 0 && eff[i].id == eff[i - 1].id) {
            repeats++;
            /* The earlier effect is the dead replica's; the later one has a higher fence. */
            if (killed_pid == 0)
                fail_msg("message %llu has two effects", (unsigned long long)eff[i].id);
            assert_int_equal(eff[i - 1].pid, killed_pid);
            assert_true(eff[i].fence > eff[i - 1].fence);
            continue;
        }
        distinct++;
    }
    assert_int_equal(distinct, unique);
    free(eff);
    return repeats;
}

static void sigkill_mid_run_loses_nothing_and_never_commits_past_a_missing_effect(void **state)
{
    (void)state;
    enum { TOTAL = 3000 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-kill", PARTITIONS);
    /* Every message stalls 10 ms in the fail plugin: hundreds stay in flight per replica. */
    wxg_ct_write_config(&t, "plugins = fail,record\n"
                            "plugin.fail.action = stall\n"
                            "plugin.fail.stall.ms = 10\n"
                            "plugin.fail.match.every = 1\n"
                            "guard.lease.ms = 2s\n"
                            "consumer.workers = 4\n");
    static wxg_ct_msg_t msgs[TOTAL];
    size_t unique = make_msgs(msgs, TOTAL, 7);
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    wxg_ct_produce(&t, msgs, TOTAL);

    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (ledger_lines(&t) < 400 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    check_invariant(&t);
    pid_t killed = t.pids[0];
    assert_true(wxg_ct_signal(&t, 0, SIGKILL, 10000) != -1);
    check_invariant(&t);
    wxg_test_sleep_ms(1000);
    wxg_ct_spawn(&t, 0);

    assert_true(wxg_ct_wait_all_committed(&t, 180000, check_invariant));
    check_invariant(&t);
    size_t repeats = check_effects(&t, unique, (long)killed);
    print_message("%d records, %zu unique, %zu re-executed after the SIGKILL (higher fence)\n",
                  TOTAL, unique, repeats);
    for (int i = 0; i < 2; i++) {
        int st = wxg_ct_signal(&t, i, SIGTERM, 60000);
        wxg_ct_assert_exit(&t, i, st, 0);
    }
    free_ids();
    wxg_ct_teardown(&t);
}

static void a_replica_joins_and_one_leaves_with_sigterm_without_double_effects(void **state)
{
    (void)state;
    enum { TOTAL = 3000 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-join", PARTITIONS);
    wxg_ct_write_config(&t, "plugins = fail,record\n"
                            "plugin.fail.action = stall\n"
                            "plugin.fail.stall.ms = 5\n"
                            "plugin.fail.match.every = 1\n"
                            "kafka.partition.assignment.strategy = cooperative-sticky\n");
    static wxg_ct_msg_t msgs[TOTAL];
    size_t unique = make_msgs(msgs, TOTAL, 11);
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    wxg_ct_produce(&t, msgs, TOTAL / 3);
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (ledger_lines(&t) < 300 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    wxg_ct_spawn(&t, 2); /* joins mid-run */
    wxg_ct_produce(&t, msgs + TOTAL / 3, TOTAL / 3);
    check_invariant(&t);
    while (ledger_lines(&t) < 1200 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    int st = wxg_ct_signal(&t, 1, SIGTERM, 60000); /* leaves */
    wxg_ct_assert_exit(&t, 1, st, 0);
    wxg_ct_produce(&t, msgs + 2 * (TOTAL / 3), TOTAL - 2 * (TOTAL / 3));

    assert_true(wxg_ct_wait_all_committed(&t, 180000, check_invariant));
    check_invariant(&t);
    assert_int_equal(check_effects(&t, unique, 0), 0);
    assert_true(wxg_ct_log_count(&t, 2, "event=assigned") >= 1);
    for (int i = 0; i < 3; i += 2) {
        st = wxg_ct_signal(&t, i, SIGTERM, 60000);
        wxg_ct_assert_exit(&t, i, st, 0);
    }
    free_ids();
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sigkill_mid_run_loses_nothing_and_never_commits_past_a_missing_effect),
        cmocka_unit_test(a_replica_joins_and_one_leaves_with_sigterm_without_double_effects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
