/* The history checker of the guard's nemesis test (tests/support/histcheck.h), on hand-built
 * histories: one that breaks no rule, one per rule that breaks it, and those that a restart
 * which lost Redis's data excuses. Times are server microseconds; the lease is 1 s, the
 * retention 10 s. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "histcheck.h"

enum { MS = 1000, LEASE = 1000 * MS, RETENTION = 10000 * MS };

static const hc_conf_t conf = {
    .seed = 42, .lease_us = LEASE, .retention_us = RETENTION, .slack_us = 20 * MS};

/* Appends an op taking 1 ms from `at` ms. A CLAIMED claim gets its earliest lease end. */
static long op(hc_hist_t *h, int handle, int key, hc_kind_t kind, hc_result_t res, int64_t at,
               uint64_t fence, long ticket)
{
    hc_op_t o = {.handle = handle,
                 .key = key,
                 .kind = kind,
                 .result = res,
                 .inv_us = at * MS,
                 .comp_us = at * MS + MS,
                 .fence = fence,
                 .ticket = ticket};
    if ((kind == HC_CLAIM && res == HC_R_CLAIMED) || (kind == HC_RENEW && res == HC_R_OK))
        o.lease_end_us = o.inv_us + LEASE;
    long i = hc_add(h, &o);
    assert_true(i >= 0);
    return i;
}

/* One message claimed, run and completed; the ticket's index. */
static long run_once(hc_hist_t *h, int handle, int key, int64_t at, uint64_t fence)
{
    long t = op(h, handle, key, HC_CLAIM, HC_R_CLAIMED, at, fence, -1);
    op(h, handle, key, HC_EFFECT, HC_R_OK, at + 2, fence, t);
    op(h, handle, key, HC_COMPLETE, HC_R_OK, at + 4, fence, t);
    return t;
}

/* A probe of message `key` half a second after a lease from `at` ms. */
static void probe(hc_hist_t *h, int key, int64_t at, hc_result_t res)
{
    hc_op_t p = {.handle = 0,
                 .key = key,
                 .kind = HC_CLAIM,
                 .result = res,
                 .inv_us = (at + LEASE / MS + 500) * MS,
                 .comp_us = (at + LEASE / MS + 501) * MS,
                 .ticket = -1,
                 .probe = 1};
    assert_true(hc_add(h, &p) >= 0);
}

/* Every fault stopped at `at` ms; a probe of `key` follows. */
static void quiet_and_probe(hc_hist_t *h, int key, int64_t at, hc_result_t res)
{
    op(h, -1, -1, HC_QUIET, HC_R_OK, at, 0, -1);
    probe(h, key, at, res);
}

static int check(hc_hist_t *h, hc_counts_t *c)
{
    int n = hc_check(h, &conf, stdout, c);
    hc_free(h);
    return n;
}

static void a_correct_history_with_every_kind_of_op_breaks_no_rule(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    /* Message 0: claimed, BUSY for another while live, renewed, run, completed, then DUPLICATE. */
    long t = op(h, 0, 0, HC_CLAIM, HC_R_CLAIMED, 1000, 100, -1);
    op(h, 1, 0, HC_CLAIM, HC_R_BUSY, 1100, 0, -1);
    op(h, 0, 0, HC_RENEW, HC_R_OK, 1500, 100, t);
    op(h, 0, 0, HC_EFFECT, HC_R_OK, 1600, 100, t);
    op(h, 0, 0, HC_COMPLETE, HC_R_OK, 1700, 100, t);
    op(h, 1, 0, HC_CLAIM, HC_R_DUPLICATE, 1800, 0, -1);
    /* Message 1: failed and claimed again at once with a higher fence; a stale owner's lease
     * expires and another takes over; a release frees a live claim for a third owner. */
    t = op(h, 0, 1, HC_CLAIM, HC_R_CLAIMED, 1000, 200, -1);
    op(h, 0, 1, HC_FAIL, HC_R_OK, 1010, 200, t);
    t = op(h, 1, 1, HC_CLAIM, HC_R_CLAIMED, 1020, 300, -1);
    op(h, 2, 1, HC_CLAIM, HC_R_CLAIMED, 2100, 400, -1); /* t's lease ended at 2020 */
    op(h, 1, 1, HC_EFFECT, HC_R_OK, 2200, 300, t);      /* stale: a fenced store refuses it */
    op(h, 1, 1, HC_COMPLETE, HC_R_LEASE_LOST, 2210, 300, t);
    op(h, 3, 1, HC_RELEASE, HC_R_DONE, 2300, 0, -1);
    long u = op(h, 3, 1, HC_CLAIM, HC_R_CLAIMED, 2310, 500, -1);
    op(h, 3, 1, HC_EFFECT, HC_R_OK, 2320, 500, u);
    op(h, 3, 1, HC_COMPLETE, HC_R_OK, 2330, 500, u);
    /* Message 2: an expired claim purged and claimed again; DONE claimed again only after the
     * retention; a restart that kept the data changes nothing. */
    op(h, 0, 2, HC_CLAIM, HC_R_CLAIMED, 1000, 600, -1);
    op(h, 1, 2, HC_PURGE, HC_R_DONE, 2100, 0, -1);
    run_once(h, 1, 2, 2200, 700);
    op(h, -1, -1, HC_RESTART, HC_R_KEPT, 3000, 0, -1);
    op(h, 0, 2, HC_CLAIM, HC_R_DUPLICATE, 3100, 0, -1);
    run_once(h, 0, 2, 2200 + RETENTION / MS + 100, 800);
    quiet_and_probe(h, 0, 20000, HC_R_DUPLICATE);
    probe(h, 1, 20000, HC_R_DUPLICATE);
    probe(h, 2, 20000, HC_R_DUPLICATE);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 0);
    assert_int_equal(c.keys, 3);
}

static void two_owners_with_overlapping_leases_break_rule_1(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    op(h, 0, 5, HC_CLAIM, HC_R_CLAIMED, 1000, 100, -1);
    op(h, 1, 5, HC_CLAIM, HC_R_CLAIMED, 1500, 200, -1);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[1], 1);
}

static void a_renewal_extends_the_lease_rule_1_checks(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    long t = op(h, 0, 5, HC_CLAIM, HC_R_CLAIMED, 1000, 100, -1);
    op(h, 0, 5, HC_RENEW, HC_R_OK, 1800, 100, t);
    op(h, 1, 5, HC_CLAIM, HC_R_CLAIMED, 2200, 200,
       -1); /* after the claim's lease, not the renewal's */
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[1], 1);
}

static void a_purge_of_a_live_claim_does_not_excuse_a_second_owner(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    op(h, 0, 5, HC_CLAIM, HC_R_CLAIMED, 1000, 100, -1);
    op(h, 1, 5, HC_PURGE, HC_R_DONE, 1200, 0, -1);
    op(h, 1, 5, HC_CLAIM, HC_R_CLAIMED, 1300, 200, -1);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[1], 1);
}

static void a_restart_that_lost_the_data_excuses_two_owners(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    op(h, 0, 5, HC_CLAIM, HC_R_CLAIMED, 1000, 100, -1);
    op(h, -1, -1, HC_RESTART, HC_R_LOST, 1200, 0, -1);
    op(h, 1, 5, HC_CLAIM, HC_R_CLAIMED, 1500, 200, -1);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 0);
    assert_int_equal(c.excused[1], 1);
}

static void a_restart_that_kept_the_data_excuses_nothing(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    op(h, 0, 5, HC_CLAIM, HC_R_CLAIMED, 1000, 100, -1);
    op(h, -1, -1, HC_RESTART, HC_R_KEPT, 1200, 0, -1);
    op(h, 1, 5, HC_CLAIM, HC_R_CLAIMED, 1500, 200, -1);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[1], 1);
}

static void a_done_message_claimed_within_its_retention_breaks_rule_2(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    run_once(h, 0, 7, 1000, 100);
    op(h, 1, 7, HC_PURGE, HC_R_NOOP, 2000, 0, -1); /* a purge keeps DONE markers */
    op(h, 1, 7, HC_CLAIM, HC_R_CLAIMED, 5000, 200, -1);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[2], 1);
}

static void a_restart_that_lost_the_data_excuses_a_done_claimed_again(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    run_once(h, 0, 7, 1000, 100);
    op(h, -1, -1, HC_RESTART, HC_R_LOST, 3000, 0, -1);
    run_once(h, 1, 7, 5000, 200);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 0);
    assert_int_equal(c.excused[2], 1);
}

static void an_effect_with_a_fence_below_an_earlier_one_breaks_rule_3(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    run_once(h, 0, 3, 1000, 500);
    op(h, -1, -1, HC_RESTART, HC_R_LOST, 1100, 0, -1); /* fences survive lost data */
    run_once(h, 1, 3, 1200, 400);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[3], 1);
}

static void a_message_busy_after_the_faults_and_every_lease_breaks_rule_4(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    long t = op(h, 0, 9, HC_CLAIM, HC_R_CLAIMED, 1000, 100, -1);
    op(h, 0, 9, HC_EFFECT, HC_R_OK, 1002, 100, t);
    op(h, 0, 9, HC_COMPLETE, HC_R_ERROR, 1004, 100, t);
    quiet_and_probe(h, 9, 3000, HC_R_BUSY);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[4], 1);
}

static void a_probe_round_shorter_than_a_lease_breaks_rule_4_too(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    op(h, 0, 9, HC_CLAIM, HC_R_ERROR, 2900, 0, -1); /* may hold a lease to 3901 */
    op(h, -1, -1, HC_QUIET, HC_R_OK, 3000, 0, -1);
    hc_op_t p = {.key = 9,
                 .kind = HC_CLAIM,
                 .result = HC_R_BUSY,
                 .inv_us = 3100 * MS,
                 .comp_us = 3101 * MS,
                 .ticket = -1,
                 .probe = 1};
    assert_true(hc_add(h, &p) >= 0);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[4], 1);
}

static void a_duplicate_of_a_message_never_run_breaks_rule_5(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    long t = op(h, 0, 4, HC_CLAIM, HC_R_CLAIMED, 1000, 100, -1);
    op(h, 0, 4, HC_COMPLETE, HC_R_ALREADY_DONE, 1010, 100, t);
    op(h, 1, 4, HC_CLAIM, HC_R_DUPLICATE, 1100, 0, -1);
    op(h, 0, 4, HC_EFFECT, HC_R_OK, 1200, 100, t); /* too late for both */
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1); /* one report per message */
    assert_int_equal(c.violations[5], 1);
}

static void each_probe_round_checks_the_messages_of_its_epoch_only(void **state)
{
    (void)state;
    hc_hist_t *h = hc_new();
    /* Epoch 1: messages 1 and 2 run; both are probed, 1 is claimable, 2 stuck. */
    run_once(h, 0, 1, 1000, 100);
    long t = op(h, 0, 2, HC_CLAIM, HC_R_CLAIMED, 1000, 200, -1);
    op(h, 0, 2, HC_EFFECT, HC_R_OK, 1002, 200, t);
    op(h, 0, 2, HC_COMPLETE, HC_R_ERROR, 1004, 200, t);
    quiet_and_probe(h, 1, 3000, HC_R_DUPLICATE);
    probe(h, 2, 3000, HC_R_BUSY);
    /* Epoch 2: only message 3 runs and is probed; 1 and 2 need no probe in this round. */
    run_once(h, 1, 3, 6000, 300);
    quiet_and_probe(h, 3, 8000, HC_R_DUPLICATE);
    hc_counts_t c;
    assert_int_equal(check(h, &c), 1);
    assert_int_equal(c.violations[4], 1); /* message 2, in the first round */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_correct_history_with_every_kind_of_op_breaks_no_rule),
        cmocka_unit_test(two_owners_with_overlapping_leases_break_rule_1),
        cmocka_unit_test(a_renewal_extends_the_lease_rule_1_checks),
        cmocka_unit_test(a_purge_of_a_live_claim_does_not_excuse_a_second_owner),
        cmocka_unit_test(a_restart_that_lost_the_data_excuses_two_owners),
        cmocka_unit_test(a_restart_that_kept_the_data_excuses_nothing),
        cmocka_unit_test(a_done_message_claimed_within_its_retention_breaks_rule_2),
        cmocka_unit_test(a_restart_that_lost_the_data_excuses_a_done_claimed_again),
        cmocka_unit_test(an_effect_with_a_fence_below_an_earlier_one_breaks_rule_3),
        cmocka_unit_test(a_message_busy_after_the_faults_and_every_lease_breaks_rule_4),
        cmocka_unit_test(a_probe_round_shorter_than_a_lease_breaks_rule_4_too),
        cmocka_unit_test(each_probe_round_checks_the_messages_of_its_epoch_only),
        cmocka_unit_test(a_duplicate_of_a_message_never_run_breaks_rule_5),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
