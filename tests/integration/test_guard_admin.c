/* The guard's administration calls used by wxguardctl, against a real redis-server: the SCAN walk
 * reports every in-flight record with its key and state across pages, rearm restarts only a
 * FAILED message's attempts (fence and finished plugins kept), and purge deletes FAILED and
 * expired records but never a live claim or a DONE marker, and the key stored in the string record
 * survives every transition. */
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
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    gt_conf(&f->conf, wxg_test_redis_host(), wxg_test_redis_port(), "admin", f->prefix,
            sizeof f->prefix);
    f->g = gt_open(&f->conf);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_guard_destroy(f->g);
    free(f);
    return 0;
}

static wxg_guard_state_t state_of(fixture *f, const char *key, wxg_guard_record_t **keep)
{
    wxg_guard_record_t *r = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), NULL, &r), 0);
    wxg_guard_state_t s = r->state;
    if (keep)
        *keep = r;
    else
        wxg_guard_record_free(r);
    return s;
}

typedef struct seen {
    int processing, failed, other, total;
    int keys_ok;
} seen;

static int count_cb(const wxg_guard_record_t *r, void *arg)
{
    seen *s = arg;
    s->total++;
    if (r->state == WXG_GUARD_PROCESSING)
        s->processing++;
    else if (r->state == WXG_GUARD_FAILED)
        s->failed++;
    else
        s->other++;
    if (r->msg_key && strncmp(r->msg_key, "scan:n:", 7) == 0 && r->record_key)
        s->keys_ok++;
    return 0;
}

/* Records exist for the messages whose state left their DONE bucket's field: FAILED ones, and
 * PROCESSING ones after a renewal (or a takeover, or a release). A claim that is simply in
 * flight is a field of its bucket and has no record to list (docs/guard.md §2). */
static void scan_reports_every_in_flight_record_with_its_key_across_pages(void **state)
{
    fixture *f = *state;
    char key[64];
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof key, "scan:n:%d", 1000 + i);
        wxg_guard_claim_t c;
        assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
        if (i % 5 == 0)
            assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0); /* no record */
        else if (i % 2 == 0)
            assert_int_equal(wxg_guard_fail(f->g, &c.ticket, "r", 1), 0);
        else if (i % 3 == 0)
            assert_int_equal(wxg_guard_renew(f->g, &c.ticket), 0);
        wxg_guard_claim_clear(&c);
    }
    seen s = {0};
    uint64_t cursor = 0;
    int pages = 0;
    do {
        /* Pages of 10: this test's own fifty-odd keys take several whatever else the shared
         * server holds. (Pages of 100 took one page when the test ran before most others, on
         * a nearly empty server.) */
        assert_int_equal(wxg_guard_scan(f->g, &cursor, 10, count_cb, &s), 0);
        assert_true(++pages < 100000);
    } while (cursor != 0);
    /* 30 messages: 6 DONE (never reported), 12 FAILED (even i not divisible by 5), 4 renewed
     * and PROCESSING (odd i divisible by 3, not by 5: 3 9 21 27), 8 simply in flight (no
     * record). */
    assert_int_equal(s.total, 16);
    assert_int_equal(s.failed, 12);
    assert_int_equal(s.processing, 4);
    assert_int_equal(s.other, 0);
    assert_int_equal(s.keys_ok, 16);
    assert_true(pages > 1);
}

static int stop_cb(const wxg_guard_record_t *r, void *arg)
{
    (void)r;
    (*(int *)arg)++;
    return 7;
}

static void scan_stops_when_the_callback_asks_and_returns_its_value(void **state)
{
    fixture *f = *state;
    wxg_guard_claim_t c;
    for (int i = 1; i <= 2; i++) {
        char key[16];
        snprintf(key, sizeof key, "stop:n:%d", i);
        assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
        assert_int_equal(wxg_guard_fail(f->g, &c.ticket, "r", 1), 0); /* a record */
        wxg_guard_claim_clear(&c);
    }
    int calls = 0, rc = 0;
    uint64_t cursor = 0;
    for (int i = 0; i < 10000 && rc == 0; i++) {
        rc = wxg_guard_scan(f->g, &cursor, 100, stop_cb, &calls);
        if (rc == 0 && cursor == 0)
            break;
    }
    assert_int_equal(rc, 7);
    assert_int_equal(calls, 1);
    assert_int_equal(wxg_guard_scan(f->g, NULL, 1, stop_cb, &calls), WXG_EINVAL);
}

static void rearm_restarts_attempts_of_failed_only_and_keeps_fence_and_plugins(void **state)
{
    fixture *f = *state;
    const char *key = "rearm:n:1";
    wxg_guard_claim_t c;
    uint64_t last_fence = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
        assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
        assert_true(c.ticket.fence > last_fence);
        last_fence = c.ticket.fence;
        if (i == 0)
            assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "billing", "ok", 2), 0);
        assert_int_equal(wxg_guard_fail(f->g, &c.ticket, "down", c.attempt), 0);
        wxg_guard_claim_clear(&c);
    }
    int rearmed = -1;
    assert_int_equal(wxg_guard_rearm(f->g, key, strlen(key), &rearmed), 0);
    assert_int_equal(rearmed, 1);
    wxg_guard_record_t *r = NULL;
    assert_int_equal(state_of(f, key, &r), WXG_GUARD_FAILED);
    assert_int_equal(r->attempt, 0);
    assert_int_equal(r->fence, last_fence);
    assert_true(r->rearmed_at_ms > 0);
    wxg_guard_record_free(r);
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(c.attempt, 1);
    assert_true(c.ticket.fence > last_fence);
    assert_int_equal(c.n_finished, 1);
    assert_string_equal(c.finished[0].name, "billing");
    /* PROCESSING: not re-armed. */
    assert_int_equal(wxg_guard_rearm(f->g, key, strlen(key), &rearmed), 0);
    assert_int_equal(rearmed, 0);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
    /* DONE and absent: not re-armed, nothing created. */
    assert_int_equal(wxg_guard_rearm(f->g, key, strlen(key), &rearmed), 0);
    assert_int_equal(rearmed, 0);
    assert_int_equal(state_of(f, key, NULL), WXG_GUARD_DONE);
    assert_int_equal(wxg_guard_rearm(f->g, "rearm:n:2", 9, &rearmed), 0);
    assert_int_equal(rearmed, 0);
    assert_int_equal(state_of(f, "rearm:n:2", NULL), WXG_GUARD_ABSENT);
}

static void purge_deletes_failed_and_expired_but_never_live_claims_or_done(void **state)
{
    fixture *f = *state;
    wxg_guard_claim_t c;
    int purged = -1;
    /* FAILED: deleted. */
    assert_int_equal(wxg_guard_claim(f->g, "purge:n:1", 9, NULL, &c), 0);
    assert_int_equal(wxg_guard_fail(f->g, &c.ticket, "x", 1), 0);
    wxg_guard_claim_clear(&c);
    assert_int_equal(wxg_guard_purge(f->g, "purge:n:1", 9, &purged), 0);
    assert_int_equal(purged, 1);
    assert_int_equal(state_of(f, "purge:n:1", NULL), WXG_GUARD_ABSENT);
    /* Live claim: kept. */
    assert_int_equal(wxg_guard_claim(f->g, "purge:n:2", 9, NULL, &c), 0);
    assert_int_equal(wxg_guard_purge(f->g, "purge:n:2", 9, &purged), 0);
    assert_int_equal(purged, 0);
    assert_int_equal(state_of(f, "purge:n:2", NULL), WXG_GUARD_PROCESSING);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
    /* DONE: the marker stays. */
    assert_int_equal(wxg_guard_purge(f->g, "purge:n:2", 9, &purged), 0);
    assert_int_equal(purged, 0);
    assert_int_equal(state_of(f, "purge:n:2", NULL), WXG_GUARD_DONE);
    /* Expired lease: deleted (a handle with a short lease). */
    wxg_guard_conf_t sc = f->conf;
    sc.lease_ms = 100;
    wxg_guard_t *g2 = gt_open(&sc);
    assert_int_equal(wxg_guard_claim(g2, "purge:n:3", 9, NULL, &c), 0);
    uint64_t purged_fence = c.ticket.fence;
    wxg_guard_claim_clear(&c);
    int64_t deadline = wxg_test_now_ms() + 5000LL * wxg_test_scale();
    wxg_guard_record_t *r = NULL;
    do {
        wxg_test_sleep_ms(50);
        wxg_guard_record_free(r);
        r = NULL;
        state_of(f, "purge:n:3", &r);
    } while (r->lease_ms_left > 0 && wxg_test_now_ms() < deadline);
    assert_true(r->lease_ms_left <= 0);
    wxg_guard_record_free(r);
    assert_int_equal(wxg_guard_purge(f->g, "purge:n:3", 9, &purged), 0);
    assert_int_equal(purged, 1);
    /* A purge forgets the record, not the order of fences: they come from the server's clock,
     * so the next claim's is still higher (docs/guard.md §3.4). */
    assert_int_equal(wxg_guard_claim(f->g, "purge:n:3", 9, NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_true(c.ticket.fence > purged_fence);
    wxg_guard_claim_clear(&c);
    wxg_guard_destroy(g2);
}

/* The key sits in the string record between the failure reason and the plugin results, all of
 * them length-prefixed: a key, a reason and a result full of '|' and binary bytes must come back
 * intact after every transition that rewrites the record, and rearm keeps the record's expiry. */
static void key_reason_and_results_survive_every_rewrite_of_the_record(void **state)
{
    fixture *f = *state;
    static const char key[] = "odd:|k|\x01\x00|2|";
    const size_t klen = sizeof key - 1;
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, klen, NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "p1", "a|3|b", 5), 0);
    assert_int_equal(wxg_guard_renew(f->g, &c.ticket), 0);
    assert_int_equal(wxg_guard_fail(f->g, &c.ticket, "x|9|y", 1), 0);
    wxg_guard_claim_clear(&c);
    int rearmed = 0;
    assert_int_equal(wxg_guard_rearm(f->g, key, klen, &rearmed), 0);
    assert_int_equal(rearmed, 1);
    wxg_guard_record_t *r = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, klen, NULL, &r), 0);
    assert_int_equal(r->state, WXG_GUARD_FAILED);
    assert_non_null(r->msg_key);
    assert_int_equal(r->msg_key_len, klen);
    assert_memory_equal(r->msg_key, key, klen);
    assert_string_equal(r->fail_reason, "x|9|y");
    assert_int_equal(r->n_finished, 1);
    assert_int_equal(r->finished[0].result_len, 5);
    assert_memory_equal(r->finished[0].result, "a|3|b", 5);
    /* Rearm wrote the record with the expiry the failure gave it, not a new one. */
    assert_true(r->record_ttl_ms > 0 && r->record_ttl_ms <= f->conf.failed_retention_ms);
    assert_true(r->rearmed_at_ms > 0 && r->failed_at_ms > 0);
    wxg_guard_record_free(r);
    /* A re-claim keeps the key (only the claim that creates a record writes it). */
    assert_int_equal(wxg_guard_claim(f->g, key, klen, NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(c.attempt, 1);
    assert_int_equal(wxg_guard_inspect(f->g, key, klen, NULL, &r), 0);
    assert_int_equal(r->state, WXG_GUARD_PROCESSING);
    assert_int_equal(r->msg_key_len, klen);
    assert_memory_equal(r->msg_key, key, klen);
    wxg_guard_record_free(r);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            scan_reports_every_in_flight_record_with_its_key_across_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(scan_stops_when_the_callback_asks_and_returns_its_value,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            rearm_restarts_attempts_of_failed_only_and_keeps_fence_and_plugins, setup, teardown),
        cmocka_unit_test_setup_teardown(
            purge_deletes_failed_and_expired_but_never_live_claims_or_done, setup, teardown),
        cmocka_unit_test_setup_teardown(key_reason_and_results_survive_every_rewrite_of_the_record,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
