/* The guard's benchmark-only naive mode against a real redis-server: one plain command per
 * message and step (SET NX GET PX to claim, SET EX to complete, PEXPIRE to renew), one key per
 * DONE marker, and a refusal of what it does not implement. The benchmarks compare the real
 * design against it, so it has to behave like the design it stands for. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guardtest.h"
#include "testenv.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"

typedef struct fixture {
    char prefix[64];
    wxg_guard_conf_t conf;
    wxg_guard_t *g;
    redisContext *raw;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    gt_conf(&f->conf, wxg_test_redis_host(), wxg_test_redis_port(), "naive", f->prefix,
            sizeof f->prefix);
    f->conf.naive = 1;
    f->g = gt_open(&f->conf);
    f->raw = gt_redis(wxg_test_redis_host(), wxg_test_redis_port(), NULL);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_guard_destroy(f->g);
    redisFree(f->raw);
    free(f);
    return 0;
}

/* Number of keys under the fixture's naive namespace. */
static long long naive_keys(fixture *f)
{
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%sn:*", f->prefix);
    return (long long)gt_count(f->raw, pattern);
}

static void
a_claim_then_complete_leaves_one_marker_key_and_later_claims_are_duplicates(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:9000001";
    wxg_guard_stats_t s0, s1;
    wxg_guard_get_stats(f->g, &s0);
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(c.ticket.fence, 1);
    assert_int_equal(c.attempt, 1);
    assert_int_equal(strlen(c.ticket.owner), WXG_GUARD_OWNER_LEN);
    int already = -1;
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, &already), 0);
    assert_int_equal(already, 0);
    wxg_guard_get_stats(f->g, &s1);
    /* Two separate round trips: one per step. */
    assert_int_equal(s1.round_trips - s0.round_trips, 2);
    assert_int_equal(naive_keys(f), 1);

    wxg_guard_claim_t d;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&d);
}

static void a_message_held_by_another_owner_is_busy_and_its_lease_can_be_renewed(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:9000002";
    wxg_guard_claim_t c, b;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &b), 0);
    assert_int_equal(b.outcome, WXG_GUARD_BUSY);
    assert_true(b.lease_ms_left > 0 && b.lease_ms_left <= f->conf.lease_ms);
    assert_int_equal(wxg_guard_renew(f->g, &c.ticket), 0);

    /* A message nobody claimed has no lease to renew. */
    wxg_guard_ticket_t ghost = {.key = "bot1:n:9000003", .key_len = 14, .fence = 1};
    memset(ghost.owner, 'a', WXG_GUARD_OWNER_LEN);
    assert_int_equal(wxg_guard_renew(f->g, &ghost), WXG_ELEASELOST);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&b);
}

static void a_batch_gets_one_result_per_message(void **state)
{
    fixture *f = *state;
    const char *done_key = "bot2:n:1", *new_key = "bot2:n:2";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, done_key, strlen(done_key), NULL, &c), 0);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_msg_t msgs[2] = {{.key = done_key, .key_len = strlen(done_key)},
                               {.key = new_key, .key_len = strlen(new_key)}};
    wxg_guard_claim_t out[2];
    assert_int_equal(wxg_guard_claim_batch(f->g, msgs, 2, out), 0);
    assert_int_equal(out[0].outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(out[1].outcome, WXG_GUARD_CLAIMED);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&out[0]);
    wxg_guard_claim_clear(&out[1]);
}

static void plugin_done_and_fail_are_refused_in_naive_mode(void **state)
{
    fixture *f = *state;
    const char *key = "bot3:n:1";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "noop", NULL, 0), WXG_ESTATE);
    assert_int_equal(wxg_guard_fail(f->g, &c.ticket, "reason", 1), WXG_ESTATE);
    assert_non_null(strstr(wxg_guard_last_error(f->g), "naive"));
    wxg_guard_claim_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            a_claim_then_complete_leaves_one_marker_key_and_later_claims_are_duplicates, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            a_message_held_by_another_owner_is_busy_and_its_lease_can_be_renewed, setup, teardown),
        cmocka_unit_test_setup_teardown(a_batch_gets_one_result_per_message, setup, teardown),
        cmocka_unit_test_setup_teardown(plugin_done_and_fail_are_refused_in_naive_mode, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
