/* Leases and the renewal watchdog against a real redis-server: work lasting five leases keeps its
 * claim while renewed (and loses it when not), and the watchdog stops renewing when the lease is
 * lost, when its total bound is reached, or when the owner stops touching the registration. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guardtest.h"
#include "testenv.h"
#include "wxguard/guard.h"

#define LEASE 300

typedef struct fixture {
    char prefix[64];
    wxg_guard_conf_t conf;
    wxg_guard_t *g, *rival;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    gt_conf(&f->conf, wxg_test_redis_host(), wxg_test_redis_port(), "lease", f->prefix,
            sizeof f->prefix);
    f->conf.lease_ms = LEASE * wxg_test_scale();
    f->g = gt_open(&f->conf);
    f->rival = gt_open(&f->conf);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_guard_destroy(f->g);
    wxg_guard_destroy(f->rival);
    free(f);
    return 0;
}

static wxg_guard_watchdog_t *watchdog(fixture *f, int64_t max_ext, int64_t owner_timeout)
{
    char err[256];
    int rc = 0;
    wxg_guard_watchdog_t *wd =
        wxg_guard_watchdog_new(&f->conf, max_ext, owner_timeout, &rc, err, sizeof err);
    if (!wd)
        fail_msg("watchdog: %s", err);
    return wd;
}

/* Polls the registration until it leaves LIVE or the bound passes; returns the status. */
static int wait_status(wxg_guard_watch_t *w, int64_t bound_ms)
{
    int64_t end = wxg_test_now_ms() + bound_ms;
    while (wxg_guard_watch_status(w) == WXG_GUARD_WATCH_LIVE && wxg_test_now_ms() < end)
        wxg_test_sleep_ms(10);
    return wxg_guard_watch_status(w);
}

static void work_lasting_five_leases_keeps_its_claim_while_the_watchdog_renews(void **state)
{
    fixture *f = *state;
    int64_t lease = f->conf.lease_ms;
    wxg_guard_watchdog_t *wd = watchdog(f, 20 * lease, 0);
    const char *key = "bot:n:501";
    wxg_guard_claim_t c, x;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    wxg_guard_watch_t *w = wxg_guard_watchdog_add(wd, &c.ticket);
    assert_non_null(w);
    int64_t end = wxg_test_now_ms() + 5 * lease;
    int rivals = 0;
    while (wxg_test_now_ms() < end) {
        assert_int_equal(wxg_guard_claim(f->rival, key, strlen(key), NULL, &x), 0);
        assert_int_equal(x.outcome, WXG_GUARD_BUSY);
        assert_int_equal(wxg_guard_watch_status(w), WXG_GUARD_WATCH_LIVE);
        rivals++;
        wxg_test_sleep_ms(lease / 4);
    }
    assert_true(rivals >= 15);
    uint64_t batches = 0, renewals = 0;
    wxg_guard_watchdog_counts(wd, &batches, &renewals);
    assert_true(renewals >= 10); /* every lease/3 over five leases: about 15 */
    wxg_guard_watchdog_remove(wd, w);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
    wxg_guard_watchdog_destroy(wd);
}

static void the_same_work_without_renewal_loses_its_claim_to_a_higher_fence(void **state)
{
    fixture *f = *state;
    int64_t lease = f->conf.lease_ms;
    const char *key = "bot:n:502";
    wxg_guard_claim_t c, x;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    wxg_test_sleep_ms(lease + lease / 2);
    assert_int_equal(wxg_guard_claim(f->rival, key, strlen(key), NULL, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_CLAIMED);
    assert_true(x.ticket.fence > c.ticket.fence);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_complete(f->rival, &x.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&x);
}

static void watchdog_reports_lost_lease_when_another_owner_took_over(void **state)
{
    fixture *f = *state;
    int64_t lease = f->conf.lease_ms;
    wxg_guard_watchdog_t *wd = watchdog(f, 20 * lease, 0);
    const char *key = "bot:n:503";
    wxg_guard_claim_t c, x;
    int released = 0;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    wxg_guard_watch_t *w = wxg_guard_watchdog_add(wd, &c.ticket);
    assert_int_equal(wxg_guard_release(f->rival, key, strlen(key), &released), 0);
    assert_int_equal(released, 1);
    assert_int_equal(wxg_guard_claim(f->rival, key, strlen(key), NULL, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wait_status(w, 4 * lease), WXG_GUARD_WATCH_LOST);
    /* The watchdog never renewed the new owner's lease on the old owner's behalf. */
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), NULL, &rec), 0);
    assert_string_equal(rec->owner, x.ticket.owner);
    wxg_guard_record_free(rec);
    wxg_guard_watchdog_remove(wd, w);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&x);
    wxg_guard_watchdog_destroy(wd);
}

static void watchdog_stops_renewing_at_its_total_bound(void **state)
{
    fixture *f = *state;
    int64_t lease = f->conf.lease_ms;
    wxg_guard_watchdog_t *wd = watchdog(f, 2 * lease, 0);
    const char *key = "bot:n:504";
    wxg_guard_claim_t c, x;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    int64_t t0 = wxg_test_now_ms();
    wxg_guard_watch_t *w = wxg_guard_watchdog_add(wd, &c.ticket);
    assert_int_equal(wait_status(w, 10 * lease), WXG_GUARD_WATCH_EXHAUSTED);
    assert_true(wxg_test_now_ms() - t0 >= 2 * lease);
    /* Once the last renewal runs out, the message is free for someone else. */
    int64_t end = wxg_test_now_ms() + 4 * lease;
    int claimed = 0;
    while (!claimed && wxg_test_now_ms() < end) {
        assert_int_equal(wxg_guard_claim(f->rival, key, strlen(key), NULL, &x), 0);
        claimed = x.outcome == WXG_GUARD_CLAIMED;
        if (!claimed)
            wxg_test_sleep_ms(lease / 6);
    }
    assert_true(claimed);
    wxg_guard_watchdog_remove(wd, w);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&x);
    wxg_guard_watchdog_destroy(wd);
}

static void watchdog_abandons_work_whose_owner_stopped_touching_it(void **state)
{
    fixture *f = *state;
    int64_t lease = f->conf.lease_ms;
    wxg_guard_watchdog_t *wd = watchdog(f, 50 * lease, 2 * lease);
    const char *k1 = "bot:n:505", *k2 = "bot:n:506";
    wxg_guard_claim_t c1, c2;
    assert_int_equal(wxg_guard_claim(f->g, k1, strlen(k1), NULL, &c1), 0);
    assert_int_equal(wxg_guard_claim(f->g, k2, strlen(k2), NULL, &c2), 0);
    wxg_guard_watch_t *w1 = wxg_guard_watchdog_add(wd, &c1.ticket);
    wxg_guard_watch_t *w2 = wxg_guard_watchdog_add(wd, &c2.ticket);
    int64_t end = wxg_test_now_ms() + 5 * lease;
    while (wxg_test_now_ms() < end) {
        wxg_guard_watch_touch(w2); /* only the second owner is alive */
        wxg_test_sleep_ms(lease / 5);
    }
    assert_int_equal(wxg_guard_watch_status(w1), WXG_GUARD_WATCH_ABANDONED);
    assert_int_equal(wxg_guard_watch_status(w2), WXG_GUARD_WATCH_LIVE);
    assert_int_equal(wxg_guard_complete(f->g, &c2.ticket, NULL), 0);
    wxg_guard_watchdog_remove(wd, w1);
    wxg_guard_watchdog_remove(wd, w2);
    wxg_guard_claim_clear(&c1);
    wxg_guard_claim_clear(&c2);
    wxg_guard_watchdog_destroy(wd);
}

static void registrations_removed_while_renewing_are_freed_safely(void **state)
{
    fixture *f = *state;
    int64_t lease = f->conf.lease_ms;
    wxg_guard_watchdog_t *wd = watchdog(f, 20 * lease, 0);
    enum { N = 200 };
    static char keys[N][32];
    wxg_guard_msg_t msgs[N];
    wxg_guard_claim_t out[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "bot:n:6%05d", i);
        msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), NULL};
    }
    assert_int_equal(wxg_guard_claim_batch(f->g, msgs, N, out), 0);
    wxg_guard_watch_t *w[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++)
            w[i] = wxg_guard_watchdog_add(wd, &out[i].ticket);
        wxg_test_sleep_ms(lease / 2);
        for (int i = 0; i < N; i++)
            wxg_guard_watchdog_remove(wd, w[i]);
    }
    uint64_t renewals = 0;
    wxg_guard_watchdog_counts(wd, NULL, &renewals);
    assert_true(renewals > 0);
    for (int i = 0; i < N; i++)
        wxg_guard_claim_clear(&out[i]);
    wxg_guard_watchdog_destroy(wd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            work_lasting_five_leases_keeps_its_claim_while_the_watchdog_renews, setup, teardown),
        cmocka_unit_test_setup_teardown(
            the_same_work_without_renewal_loses_its_claim_to_a_higher_fence, setup, teardown),
        cmocka_unit_test_setup_teardown(watchdog_reports_lost_lease_when_another_owner_took_over,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(watchdog_stops_renewing_at_its_total_bound, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(watchdog_abandons_work_whose_owner_stopped_touching_it,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(registrations_removed_while_renewing_are_freed_safely,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
