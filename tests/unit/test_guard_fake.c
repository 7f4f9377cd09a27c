/* Unit tests of the guard's design interface (lib/guard/guard_int.h) and of the in-memory fake
 * behind it (tests/support/fakeguard.c): every row of the state-machine table in docs/guard.md §1
 * is asserted on the fake, through the public API, so that tests written against the fake test what
 * the Lua design does. Also: the argument checks made before any design is called, the fake's fault
 * injection and hook, several handles over one fake, and the watchdog running over a fake handle.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakeguard.h"
#include "guard_int.h"

typedef struct fixture {
    fakeguard_t *f;
    wxg_guard_conf_t conf;
    wxg_guard_t *g;
} fixture;

static int setup(void **state)
{
    fixture *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->f = fakeguard_new();
    assert_non_null(x->f);
    wxg_guard_conf_init(&x->conf);
    x->conf.lease_ms = 1000;
    x->g = fakeguard_handle(x->f, &x->conf);
    assert_non_null(x->g);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    fixture *x = *state;
    wxg_guard_destroy(x->g);
    fakeguard_destroy(x->f);
    free(x);
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Claims `key` and asserts the outcome. */
static wxg_guard_claim_t claim(fixture *x, const char *key, const unsigned char *hash,
                               wxg_guard_outcome_t want)
{
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(x->g, key, strlen(key), hash, &c), 0);
    assert_int_equal(c.outcome, want);
    return c;
}

static void claim_of_an_absent_message_starts_at_fence_1_attempt_1(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:1", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(c.ticket.fence, 1);
    assert_int_equal(c.attempt, 1);
    assert_int_equal(c.n_finished, 0);
    assert_int_equal(strlen(c.ticket.owner), WXG_GUARD_OWNER_LEN);
    assert_true(c.ticket.payload_tag_set);
    uint64_t fence = 0;
    uint32_t attempt = 0;
    assert_int_equal(fakeguard_state(x->f, "a:n:1", &fence, &attempt), WXG_GUARD_PROCESSING);
    assert_int_equal(fence, 1);
    assert_int_equal(attempt, 1);
    wxg_guard_stats_t s;
    wxg_guard_get_stats(x->g, &s);
    assert_int_equal(s.claimed, 1);
    wxg_guard_claim_clear(&c);
}

static void claim_of_a_live_claim_is_busy_with_the_lease_left(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:2", NULL, WXG_GUARD_CLAIMED);
    wxg_guard_claim_t b = claim(x, "a:n:2", NULL, WXG_GUARD_BUSY);
    assert_true(b.lease_ms_left > 0 && b.lease_ms_left <= x->conf.lease_ms);
    fakeguard_set_busy(x->f, "a:n:3", 5000);
    wxg_guard_claim_t b2 = claim(x, "a:n:3", NULL, WXG_GUARD_BUSY);
    assert_true(b2.lease_ms_left > 1000 && b2.lease_ms_left <= 5000);
    wxg_guard_stats_t s;
    wxg_guard_get_stats(x->g, &s);
    assert_int_equal(s.busy, 2);
    wxg_guard_claim_clear(&c);
}

static void claim_after_an_expired_lease_takes_over_with_fence_plus_1(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c1 = claim(x, "a:n:4", NULL, WXG_GUARD_CLAIMED);
    fakeguard_advance(x->f, x->conf.lease_ms + 1);
    wxg_guard_claim_t c2 = claim(x, "a:n:4", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(c2.ticket.fence, 2);
    assert_int_equal(c2.attempt, 2);
    assert_string_not_equal(c1.ticket.owner, c2.ticket.owner);
    /* The first owner is refused everywhere and changes nothing. */
    assert_int_equal(wxg_guard_renew(x->g, &c1.ticket), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_plugin_done(x->g, &c1.ticket, "p1", "r", 1), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_complete(x->g, &c1.ticket, NULL), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_fail(x->g, &c1.ticket, "late", 1), WXG_ELEASELOST);
    assert_int_equal(fakeguard_finished(x->f, "a:n:4", NULL, 0), 0);
    assert_int_equal(fakeguard_state(x->f, "a:n:4", NULL, NULL), WXG_GUARD_PROCESSING);
    wxg_guard_stats_t s;
    wxg_guard_get_stats(x->g, &s);
    assert_int_equal(s.lease_lost, 4);
    wxg_guard_claim_clear(&c1);
    wxg_guard_claim_clear(&c2);
}

static void renew_by_the_owner_extends_the_lease_even_after_it_expired(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:5", NULL, WXG_GUARD_CLAIMED);
    fakeguard_advance(x->f, x->conf.lease_ms * 3 / 4);
    assert_int_equal(wxg_guard_renew(x->g, &c.ticket), 0);
    fakeguard_advance(x->f, x->conf.lease_ms * 3 / 4);
    claim(x, "a:n:5", NULL, WXG_GUARD_BUSY); /* 1.5 leases after the claim, still live */
    /* Expired but not taken over: the owner may still renew, nobody else has run it. */
    fakeguard_advance(x->f, x->conf.lease_ms * 2);
    assert_int_equal(wxg_guard_renew(x->g, &c.ticket), 0);
    claim(x, "a:n:5", NULL, WXG_GUARD_BUSY);
    wxg_guard_stats_t s;
    wxg_guard_get_stats(x->g, &s);
    assert_int_equal(s.renewed, 2);
    wxg_guard_claim_clear(&c);
}

static void complete_makes_a_duplicate_and_reports_the_payload_mismatch(void **state)
{
    fixture *x = *state;
    unsigned char h1[32] = {1, 2}, h2[32] = {3, 4};
    wxg_guard_claim_t c = claim(x, "a:n:6", h1, WXG_GUARD_CLAIMED);
    int already = -1;
    assert_int_equal(wxg_guard_complete(x->g, &c.ticket, &already), 0);
    assert_int_equal(already, 0);
    assert_int_equal(fakeguard_state(x->f, "a:n:6", NULL, NULL), WXG_GUARD_DONE);
    wxg_guard_claim_t d1 = claim(x, "a:n:6", h1, WXG_GUARD_DUPLICATE);
    assert_false(d1.payload_mismatch);
    wxg_guard_claim_t d2 = claim(x, "a:n:6", h2, WXG_GUARD_DUPLICATE);
    assert_true(d2.payload_mismatch);
    fakeguard_set_done(x->f, "a:n:7");
    claim(x, "a:n:7", NULL, WXG_GUARD_DUPLICATE);
    wxg_guard_stats_t s;
    wxg_guard_get_stats(x->g, &s);
    assert_int_equal(s.completed, 1);
    assert_int_equal(s.duplicates, 3);
    assert_int_equal(s.payload_mismatches, 1);
    wxg_guard_claim_clear(&c);
}

static void complete_without_a_record_of_a_done_message_is_already_done(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:8", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(x->g, &c.ticket, NULL), 0);
    /* A retried complete whose first attempt ran. */
    int already = 0;
    assert_int_equal(wxg_guard_complete(x->g, &c.ticket, &already), 0);
    assert_int_equal(already, 1);
    /* With no DONE marker, a ticket without a record is lease lost. */
    wxg_guard_ticket_t ghost = c.ticket;
    ghost.key = "a:n:9";
    ghost.key_len = 5;
    int res = -1;
    assert_int_equal(wxg_guard_complete_batch(x->g, &ghost, 1, &res), 0);
    assert_int_equal(res, WXG_GUARD_LEASE_LOST);
    wxg_guard_stats_t s;
    wxg_guard_get_stats(x->g, &s);
    assert_int_equal(s.already_done, 1);
    wxg_guard_claim_clear(&c);
}

static void fail_keeps_the_fence_and_the_finished_plugins_for_the_next_claim(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:10", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_plugin_done(x->g, &c.ticket, "billing", "ok:42", 5), 0);
    assert_int_equal(wxg_guard_plugin_done(x->g, &c.ticket, "billing", "ok:43", 5), 0);
    const char *names[4];
    assert_int_equal(fakeguard_finished(x->f, "a:n:10", names, 4), 1);
    assert_string_equal(names[0], "billing");
    assert_int_equal(wxg_guard_fail(x->g, &c.ticket, "autoreply down", 1), 0);

    wxg_guard_record_t *r = NULL;
    assert_int_equal(wxg_guard_inspect(x->g, "a:n:10", 6, NULL, &r), 0);
    assert_int_equal(r->state, WXG_GUARD_FAILED);
    assert_true(r->has_record);
    assert_string_equal(r->owner, "");
    assert_int_equal(r->fence, 1);
    assert_int_equal(r->fail_attempts, 1);
    assert_string_equal(r->fail_reason, "autoreply down");
    assert_int_equal(r->n_finished, 1);
    assert_true(r->failed_at_ms > 0);
    assert_int_equal(r->msg_key_len, 6);
    wxg_guard_record_free(r);

    /* FAILED is claimed at once, with the plugin that already ran. */
    wxg_guard_claim_t c2 = claim(x, "a:n:10", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(c2.ticket.fence, 2);
    assert_int_equal(c2.attempt, 2);
    assert_int_equal(c2.n_finished, 1);
    assert_string_equal(c2.finished[0].name, "billing");
    assert_int_equal(c2.finished[0].result_len, 5);
    assert_memory_equal(c2.finished[0].result, "ok:43", 5);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&c2);
}

static void release_clears_a_claim_and_refuses_its_owner(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:11", NULL, WXG_GUARD_CLAIMED);
    int released = -1;
    assert_int_equal(wxg_guard_release(x->g, "a:n:11", 6, &released), 0);
    assert_int_equal(released, 1);
    wxg_guard_record_t *r = NULL;
    assert_int_equal(wxg_guard_inspect(x->g, "a:n:11", 6, NULL, &r), 0);
    assert_int_equal(r->state, WXG_GUARD_FAILED);
    assert_string_equal(r->fail_reason, "released");
    assert_int_equal(r->fence, 1);
    wxg_guard_record_free(r);
    assert_int_equal(wxg_guard_complete(x->g, &c.ticket, NULL), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_release(x->g, "a:n:11", 6, &released), 0);
    assert_int_equal(released, 0); /* no longer PROCESSING */
    wxg_guard_claim_t c2 = claim(x, "a:n:11", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(c2.ticket.fence, 2);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&c2);
}

static void rearm_restarts_the_attempts_of_a_failed_message_only(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:12", NULL, WXG_GUARD_CLAIMED);
    int rearmed = -1;
    assert_int_equal(wxg_guard_rearm(x->g, "a:n:12", 6, &rearmed), 0);
    assert_int_equal(rearmed, 0); /* PROCESSING */
    assert_int_equal(wxg_guard_fail(x->g, &c.ticket, "x", 5), 0);
    assert_int_equal(wxg_guard_rearm(x->g, "a:n:12", 6, &rearmed), 0);
    assert_int_equal(rearmed, 1);
    wxg_guard_claim_t c2 = claim(x, "a:n:12", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(c2.attempt, 1);
    assert_int_equal(c2.ticket.fence, 2);
    assert_int_equal(wxg_guard_complete(x->g, &c2.ticket, NULL), 0);
    assert_int_equal(wxg_guard_rearm(x->g, "a:n:12", 6, &rearmed), 0);
    assert_int_equal(rearmed, 0); /* DONE */
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&c2);
}

static void purge_deletes_failed_and_expired_records_never_live_or_done_ones(void **state)
{
    fixture *x = *state;
    int purged = -1;
    wxg_guard_claim_t c = claim(x, "a:n:13", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_purge(x->g, "a:n:13", 6, &purged), 0);
    assert_int_equal(purged, 0); /* live claim */
    fakeguard_advance(x->f, x->conf.lease_ms + 1);
    assert_int_equal(wxg_guard_purge(x->g, "a:n:13", 6, &purged), 0);
    assert_int_equal(purged, 1);
    assert_int_equal(fakeguard_state(x->f, "a:n:13", NULL, NULL), WXG_GUARD_ABSENT);
    /* The fencing counter went with the record. */
    wxg_guard_claim_t c2 = claim(x, "a:n:13", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(c2.ticket.fence, 1);
    assert_int_equal(wxg_guard_fail(x->g, &c2.ticket, "x", 1), 0);
    assert_int_equal(wxg_guard_purge(x->g, "a:n:13", 6, &purged), 0);
    assert_int_equal(purged, 1);
    fakeguard_set_done(x->f, "a:n:14");
    assert_int_equal(wxg_guard_purge(x->g, "a:n:14", 6, &purged), 0);
    assert_int_equal(purged, 0);
    assert_int_equal(fakeguard_state(x->f, "a:n:14", NULL, NULL), WXG_GUARD_DONE);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&c2);
}

static int count_records(const wxg_guard_record_t *rec, void *arg)
{
    int *n = arg;
    assert_true(rec->state == WXG_GUARD_PROCESSING || rec->state == WXG_GUARD_FAILED);
    (*n)++;
    return 0;
}

static void scan_reports_in_flight_records_and_inspect_sees_done(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t a = claim(x, "a:n:15", NULL, WXG_GUARD_CLAIMED);
    wxg_guard_claim_t b = claim(x, "a:n:16", NULL, WXG_GUARD_CLAIMED);
    wxg_guard_claim_t d = claim(x, "a:n:17", NULL, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_fail(x->g, &b.ticket, "x", 1), 0);
    assert_int_equal(wxg_guard_complete(x->g, &d.ticket, NULL), 0);
    uint64_t cursor = 0;
    int n = 0;
    assert_int_equal(wxg_guard_scan(x->g, &cursor, 10, count_records, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(cursor, 0);
    wxg_guard_record_t *r = NULL;
    assert_int_equal(wxg_guard_inspect(x->g, "a:n:17", 6, NULL, &r), 0);
    assert_int_equal(r->state, WXG_GUARD_DONE);
    assert_false(r->has_record);
    assert_non_null(r->done_bucket);
    wxg_guard_record_free(r);
    assert_int_equal(wxg_guard_inspect(x->g, "a:n:99", 6, NULL, &r), 0);
    assert_int_equal(r->state, WXG_GUARD_ABSENT);
    wxg_guard_record_free(r);
    wxg_guard_claim_clear(&a);
    wxg_guard_claim_clear(&b);
    wxg_guard_claim_clear(&d);
}

static void steal_makes_the_owners_next_transitions_lease_lost(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:18", NULL, WXG_GUARD_CLAIMED);
    fakeguard_steal(x->f, "a:n:18");
    uint64_t fence = 0;
    assert_int_equal(fakeguard_state(x->f, "a:n:18", &fence, NULL), WXG_GUARD_PROCESSING);
    assert_int_equal(fence, 2);
    assert_int_equal(wxg_guard_renew(x->g, &c.ticket), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_complete(x->g, &c.ticket, NULL), WXG_ELEASELOST);
    claim(x, "a:n:18", NULL, WXG_GUARD_BUSY);
    wxg_guard_claim_clear(&c);
}

static void an_injected_failure_changes_nothing_and_is_counted(void **state)
{
    fixture *x = *state;
    fakeguard_fail_next(x->f, FG_CLAIM, WXG_ECONN, 2);
    wxg_guard_claim_t c;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(wxg_guard_claim(x->g, "a:n:19", 6, NULL, &c), WXG_ECONN);
        assert_int_equal(c.outcome, 0); /* cleared */
    }
    assert_int_equal(fakeguard_state(x->f, "a:n:19", NULL, NULL), WXG_GUARD_ABSENT);
    assert_non_null(strstr(wxg_guard_last_error(x->g), "ECONN"));
    c = claim(x, "a:n:19", NULL, WXG_GUARD_CLAIMED);
    fakeguard_fail_next(x->f, FG_COMPLETE, WXG_ETIMEDOUT, 1);
    assert_int_equal(wxg_guard_complete(x->g, &c.ticket, NULL), WXG_ETIMEDOUT);
    assert_int_equal(fakeguard_state(x->f, "a:n:19", NULL, NULL), WXG_GUARD_PROCESSING);
    fakeguard_fail_next(x->f, FG_PING, WXG_EAUTH, 1);
    assert_int_equal(wxg_guard_ping(x->g), WXG_EAUTH);
    assert_int_equal(wxg_guard_ping(x->g), 0);
    assert_int_equal(wxg_guard_complete(x->g, &c.ticket, NULL), 0);
    assert_int_equal(fakeguard_calls(x->f, FG_CLAIM), 3);
    assert_int_equal(fakeguard_calls(x->f, FG_COMPLETE), 2);
    assert_int_equal(fakeguard_calls(x->f, FG_PING), 2);
    wxg_guard_stats_t s;
    wxg_guard_get_stats(x->g, &s);
    assert_int_equal(s.conn_errors, 2);
    assert_int_equal(s.timeouts, 1);
    wxg_guard_claim_clear(&c);
}

static void steal_in(fakeguard_t *f, fakeguard_op op, const char *key, size_t key_len, void *arg)
{
    int *seen = arg;
    if (op == FG_COMPLETE && key_len == 6 && memcmp(key, "a:n:21", 6) == 0) {
        fakeguard_steal(f, "a:n:21");
        (*seen)++;
    }
}

static void a_hook_runs_between_the_messages_of_a_batch(void **state)
{
    fixture *x = *state;
    wxg_guard_msg_t msgs[2] = {{.key = "a:n:20", .key_len = 6}, {.key = "a:n:21", .key_len = 6}};
    wxg_guard_claim_t out[2];
    assert_int_equal(wxg_guard_claim_batch(x->g, msgs, 2, out), 0);
    int seen = 0;
    fakeguard_set_hook(x->f, steal_in, &seen);
    wxg_guard_ticket_t t[2] = {out[0].ticket, out[1].ticket};
    int res[2] = {-1, -1};
    assert_int_equal(wxg_guard_complete_batch(x->g, t, 2, res), 0);
    fakeguard_set_hook(x->f, NULL, NULL);
    assert_int_equal(seen, 1);
    assert_int_equal(res[0], WXG_GUARD_OK);
    assert_int_equal(res[1], WXG_GUARD_LEASE_LOST);
    wxg_guard_claim_clear(&out[0]);
    wxg_guard_claim_clear(&out[1]);
}

static void bad_arguments_never_reach_the_design(void **state)
{
    fixture *x = *state;
    wxg_guard_claim_t c = claim(x, "a:n:22", NULL, WXG_GUARD_CLAIMED);
    wxg_guard_ticket_t bad = c.ticket;
    bad.fence = 0;
    assert_int_equal(wxg_guard_renew(x->g, &bad), WXG_EINVAL);
    bad = c.ticket;
    bad.owner[3] = '\0';
    assert_int_equal(wxg_guard_complete(x->g, &bad, NULL), WXG_EINVAL);
    assert_int_equal(wxg_guard_plugin_done(x->g, &c.ticket, "bad name", NULL, 0), WXG_EINVAL);
    char big[WXG_GUARD_RESULT_MAX + 1] = {0};
    assert_int_equal(wxg_guard_plugin_done(x->g, &c.ticket, "p", big, sizeof big), WXG_EINVAL);
    assert_int_equal(wxg_guard_claim(x->g, "", 0, NULL, &c), WXG_EINVAL);
    assert_int_equal(wxg_guard_claim_batch(x->g, NULL, 1, &c), WXG_EINVAL);
    assert_int_equal(fakeguard_calls(x->f, FG_RENEW), 0);
    assert_int_equal(fakeguard_calls(x->f, FG_COMPLETE), 0);
    assert_int_equal(fakeguard_calls(x->f, FG_PLUGIN_DONE), 0);
    assert_int_equal(fakeguard_calls(x->f, FG_CLAIM), 1);
    assert_int_equal(wxg_guard_renew_batch(x->g, NULL, 0, NULL), 0); /* nothing to do */
    assert_int_equal(fakeguard_calls(x->f, FG_RENEW), 0);
}

static void nothing_destroy(wxg_guard_t *g)
{
    (void)g;
}

static void an_operation_a_design_lacks_is_refused_with_estate(void **state)
{
    (void)state;
    static const wxg__guard_ops_t none = {.name = "empty", .destroy = nothing_destroy};
    char err[128];
    wxg_guard_t *g = wxg__guard_new_ops(&none, NULL, NULL, err, sizeof err);
    assert_non_null(g);
    /* NULL conf: the defaults. */
    assert_int_equal(wxg__guard_conf(g)->lease_ms, 30000);
    assert_null(wxg__guard_conf(g)->prefix);
    wxg_guard_ticket_t t = {.key = "k", .key_len = 1, .fence = 1};
    memset(t.owner, 'a', WXG_GUARD_OWNER_LEN);
    assert_int_equal(wxg_guard_fail(g, &t, "x", 1), WXG_ESTATE);
    assert_string_equal(wxg_guard_last_error(g), "fail is not available in empty mode");
    assert_int_equal(wxg_guard_ping(g), WXG_ESTATE);
    int flag = 7;
    assert_int_equal(wxg_guard_purge(g, "k", 1, &flag), WXG_ESTATE);
    assert_int_equal(flag, 7);
    wxg_guard_destroy(g);
}

/* ---- several handles over one fake ---- */

typedef struct racer {
    fakeguard_t *f;
    int claimed;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    wxg_guard_t *g = fakeguard_handle(r->f, NULL);
    for (int i = 0; i < 200; i++) {
        char key[16];
        snprintf(key, sizeof key, "r:n:%d", i);
        wxg_guard_claim_t c;
        if (wxg_guard_claim(g, key, strlen(key), NULL, &c) == 0 && c.outcome == WXG_GUARD_CLAIMED)
            r->claimed++;
        wxg_guard_claim_clear(&c);
    }
    wxg_guard_destroy(g);
    return NULL;
}

static void handles_on_several_threads_share_one_state(void **state)
{
    fixture *x = *state;
    pthread_t th[4];
    racer r[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (racer){.f = x->f};
        assert_int_equal(pthread_create(&th[i], NULL, race, &r[i]), 0);
    }
    int total = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        total += r[i].claimed;
    }
    assert_int_equal(total, 200); /* every message claimed exactly once */
    assert_int_equal(fakeguard_calls(x->f, FG_CLAIM), 800);
}

/* ---- the watchdog over a fake handle ---- */

static void the_watchdog_renews_through_any_handle_and_sees_a_stolen_lease(void **state)
{
    fixture *x = *state;
    wxg_guard_conf_t c;
    wxg_guard_conf_init(&c);
    c.lease_ms = 60; /* renewed every 20 ms */
    char err[128];
    wxg_guard_watchdog_t *wd =
        wxg__guard_watchdog_new_on(fakeguard_handle(x->f, &c), 0, 0, err, sizeof err);
    assert_non_null(wd);
    wxg_guard_claim_t cl = claim(x, "w:n:1", NULL, WXG_GUARD_CLAIMED);
    wxg_guard_watch_t *w = wxg_guard_watchdog_add(wd, &cl.ticket);
    assert_non_null(w);
    uint64_t renewals = 0;
    for (int i = 0; i < 200 && renewals < 3; i++) {
        sleep_ms(10);
        wxg_guard_watchdog_counts(wd, NULL, &renewals);
    }
    assert_true(renewals >= 3);
    assert_int_equal(wxg_guard_watch_status(w), WXG_GUARD_WATCH_LIVE);
    assert_true(fakeguard_calls(x->f, FG_RENEW) >= 3);
    fakeguard_steal(x->f, "w:n:1");
    for (int i = 0; i < 200 && wxg_guard_watch_status(w) == WXG_GUARD_WATCH_LIVE; i++)
        sleep_ms(10);
    assert_int_equal(wxg_guard_watch_status(w), WXG_GUARD_WATCH_LOST);
    wxg_guard_watchdog_remove(wd, w);
    /* Probing pings through the same handle. */
    wxg_guard_watchdog_probe(wd, 20);
    for (int i = 0; i < 200 && fakeguard_calls(x->f, FG_PING) < 2; i++)
        sleep_ms(10);
    assert_true(fakeguard_calls(x->f, FG_PING) >= 2);
    wxg_guard_watchdog_destroy(wd);
    wxg_guard_claim_clear(&cl);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(claim_of_an_absent_message_starts_at_fence_1_attempt_1),
        T(claim_of_a_live_claim_is_busy_with_the_lease_left),
        T(claim_after_an_expired_lease_takes_over_with_fence_plus_1),
        T(renew_by_the_owner_extends_the_lease_even_after_it_expired),
        T(complete_makes_a_duplicate_and_reports_the_payload_mismatch),
        T(complete_without_a_record_of_a_done_message_is_already_done),
        T(fail_keeps_the_fence_and_the_finished_plugins_for_the_next_claim),
        T(release_clears_a_claim_and_refuses_its_owner),
        T(rearm_restarts_the_attempts_of_a_failed_message_only),
        T(purge_deletes_failed_and_expired_records_never_live_or_done_ones),
        T(scan_reports_in_flight_records_and_inspect_sees_done),
        T(steal_makes_the_owners_next_transitions_lease_lost),
        T(an_injected_failure_changes_nothing_and_is_counted),
        T(a_hook_runs_between_the_messages_of_a_batch),
        T(bad_arguments_never_reach_the_design),
        cmocka_unit_test(an_operation_a_design_lacks_is_refused_with_estate),
        T(handles_on_several_threads_share_one_state),
        T(the_watchdog_renews_through_any_handle_and_sees_a_stolen_lease),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
