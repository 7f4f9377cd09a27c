/* The guard's state machine against a real redis-server: claim/complete/duplicate, lease expiry
 * with fence ordering, refused stale transitions that change nothing, partial plugin failure,
 * batches that mix outcomes, release and inspect. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guardtest.h"
#include "testenv.h"
#include "wxguard/guard.h"
#include "wxguard/key.h"

typedef struct fixture {
    char prefix[64];
    wxg_guard_conf_t conf;
    wxg_guard_t *g;
    redisContext *raw;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    gt_conf(&f->conf, wxg_test_redis_host(), wxg_test_redis_port(), "states", f->prefix,
            sizeof f->prefix);
    f->g = gt_open(&f->conf);
    f->raw = gt_redis(wxg_test_redis_host(), wxg_test_redis_port(), NULL);
    gt_assert_server(f->raw);
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

static unsigned char hash_a[32] = {0x12, 0x34, 1};
static unsigned char hash_b[32] = {0x56, 0x78, 2};

/* The raw record of a message (one string), and whether its key still expires within the
 * in-flight TTL, as one comparable string. */
static char *record_dump(fixture *f, const char *key)
{
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), NULL, &rec), 0);
    const char *argv[2] = {"GET", rec->record_key};
    redisReply *r = gt_cmd(f->raw, 2, argv);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    size_t cap = 4096;
    char *s = calloc(1, cap);
    long long ttl = gt_pttl(f->raw, rec->record_key);
    snprintf(s, cap, "%s ttl-ok=%d", r->str, ttl > 0 && ttl <= f->conf.inflight_ttl_ms);
    freeReplyObject(r);
    wxg_guard_record_free(rec);
    return s;
}

static void claim_complete_then_every_claim_is_a_duplicate_with_mismatch_flag(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:1000001";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), hash_a, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    gt_assert_fence_is_now(c.ticket.fence);
    assert_int_equal(c.attempt, 1);
    assert_int_equal(c.n_finished, 0);
    assert_int_equal(strlen(c.ticket.owner), WXG_GUARD_OWNER_LEN);
    /* The ticket carries the key's fingerprint, so that complete need not hash it again. */
    unsigned char fp[32];
    assert_int_equal(wxg_sha256(key, strlen(key), fp), 0);
    assert_int_equal(c.ticket.fingerprint_set, 1);
    assert_memory_equal(c.ticket.fingerprint, fp, sizeof fp);
    int already = -1;
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, &already), 0);
    assert_int_equal(already, 0);

    wxg_guard_claim_t d;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), hash_a, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(d.payload_mismatch, 0);
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), hash_b, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(d.payload_mismatch, 1);

    /* The in-flight record is gone: DONE lives only in the compact marker. */
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), hash_a, &rec), 0);
    assert_int_equal(rec->state, WXG_GUARD_DONE);
    assert_int_equal(rec->has_record, 0);
    assert_non_null(rec->done_bucket);
    assert_int_equal(rec->done_payload_tag, rec->payload_tag);
    assert_true(rec->done_ttl_ms >= f->conf.done_retention_ms - 60000);
    wxg_guard_record_free(rec);

    wxg_guard_stats_t st;
    wxg_guard_get_stats(f->g, &st);
    assert_int_equal(st.claimed, 1);
    assert_int_equal(st.completed, 1);
    assert_int_equal(st.duplicates, 2);
    assert_int_equal(st.payload_mismatches, 1);
    wxg_guard_claim_clear(&c);
}

static void stale_holder_loses_to_a_higher_fence_and_its_writes_change_nothing(void **state)
{
    fixture *f = *state;
    wxg_guard_conf_t c2 = f->conf;
    c2.lease_ms = 200;
    wxg_guard_t *g = gt_open(&c2);
    const char *key = "bot1:n:1000002";
    wxg_guard_claim_t a, b, x;
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash_a, &a), 0);
    assert_int_equal(a.outcome, WXG_GUARD_CLAIMED);
    /* While the lease is live a second claimer is told BUSY with the time left. */
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash_a, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_BUSY);
    assert_true(x.lease_ms_left > 0 && x.lease_ms_left <= 200);
    wxg_test_sleep_ms(350);
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash_a, &b), 0);
    assert_int_equal(b.outcome, WXG_GUARD_CLAIMED);
    assert_true(b.ticket.fence > a.ticket.fence);
    assert_int_equal(b.attempt, 2);
    assert_string_not_equal(a.ticket.owner, b.ticket.owner);

    char *before = record_dump(f, key);
    wxg_guard_stats_t s0, s1;
    wxg_guard_get_stats(g, &s0);
    assert_int_equal(wxg_guard_plugin_done(g, &a.ticket, "billing", "r1", 2), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_renew(g, &a.ticket), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_fail(g, &a.ticket, "stale", 1), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_complete(g, &a.ticket, NULL), WXG_ELEASELOST);
    /* A ticket with the right owner but a forged fence is refused too. */
    wxg_guard_ticket_t forged = b.ticket;
    forged.fence = b.ticket.fence + 1;
    assert_int_equal(wxg_guard_complete(g, &forged, NULL), WXG_ELEASELOST);
    char *after = record_dump(f, key);
    assert_string_equal(before, after);
    wxg_guard_get_stats(g, &s1);
    assert_int_equal(s1.lease_lost - s0.lease_lost, 5);
    assert_int_equal(s1.completed, s0.completed);

    /* The new owner is unaffected. */
    assert_int_equal(wxg_guard_complete(g, &b.ticket, NULL), 0);
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash_a, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_DUPLICATE);
    free(before);
    free(after);
    wxg_guard_claim_clear(&a);
    wxg_guard_claim_clear(&b);
    wxg_guard_destroy(g);
}

static void after_plugin_a_done_and_b_failing_the_next_claim_reports_a_finished(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:1000003";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), hash_a, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    static const unsigned char rowid[] = {'r', 'o', 'w', 0, '7'}; /* results may hold NUL */
    assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "billing", rowid, sizeof rowid), 0);
    assert_int_equal(wxg_guard_fail(f->g, &c.ticket, "auto-reply: upstream 503", 1), 0);

    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), NULL, &rec), 0);
    assert_int_equal(rec->state, WXG_GUARD_FAILED);
    assert_string_equal(rec->fail_reason, "auto-reply: upstream 503");
    assert_int_equal(rec->fail_attempts, 1);
    assert_string_equal(rec->owner, "");
    assert_int_equal(rec->fence, c.ticket.fence);
    assert_true(rec->record_ttl_ms > 0 && rec->record_ttl_ms <= f->conf.failed_retention_ms);
    wxg_guard_record_free(rec);

    wxg_guard_claim_t r;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), hash_a, &r), 0);
    assert_int_equal(r.outcome, WXG_GUARD_CLAIMED);
    assert_true(r.ticket.fence > c.ticket.fence);
    gt_assert_fence_is_now(r.ticket.fence);
    assert_int_equal(r.attempt, 2);
    assert_int_equal(r.n_finished, 1);
    assert_string_equal(r.finished[0].name, "billing");
    assert_int_equal(r.finished[0].result_len, sizeof rowid);
    assert_memory_equal(r.finished[0].result, rowid, sizeof rowid);
    /* The retry runs only auto-reply, then completes. */
    assert_int_equal(wxg_guard_plugin_done(f->g, &r.ticket, "auto-reply", "m9", 2), 0);
    assert_int_equal(wxg_guard_complete(f->g, &r.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&r);
}

static void batch_mixing_claimed_duplicate_and_busy_routes_each_message(void **state)
{
    fixture *f = *state;
    const char *done_key = "bot2:n:1", *busy_key = "bot2:n:2", *new_key = "bot2:n:3";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, done_key, strlen(done_key), hash_a, &c), 0);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_t *other = gt_open(&f->conf);
    wxg_guard_claim_t held;
    assert_int_equal(wxg_guard_claim(other, busy_key, strlen(busy_key), hash_a, &held), 0);
    assert_int_equal(held.outcome, WXG_GUARD_CLAIMED);

    wxg_guard_msg_t msgs[5] = {
        {busy_key, strlen(busy_key), hash_a}, {new_key, strlen(new_key), hash_a},
        {done_key, strlen(done_key), hash_b}, {new_key, strlen(new_key), hash_a},
        {done_key, strlen(done_key), hash_a},
    };
    wxg_guard_claim_t out[5];
    assert_int_equal(wxg_guard_claim_batch(f->g, msgs, 5, out), 0);
    assert_int_equal(out[0].outcome, WXG_GUARD_BUSY);
    assert_true(out[0].lease_ms_left > 0);
    assert_int_equal(out[1].outcome, WXG_GUARD_CLAIMED);
    assert_ptr_equal(out[1].ticket.key, new_key);
    assert_int_equal(out[2].outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(out[2].payload_mismatch, 1);
    /* The same key twice in one batch: the second copy sees the first one's claim. */
    assert_int_equal(out[3].outcome, WXG_GUARD_BUSY);
    assert_int_equal(out[4].outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(out[4].payload_mismatch, 0);

    /* Completing in a batch: one valid ticket and one stale one get separate results. */
    wxg_guard_ticket_t tickets[2] = {out[1].ticket, held.ticket};
    tickets[1].owner[0] = tickets[1].owner[0] == 'a' ? 'b' : 'a';
    int res[2] = {-9, -9};
    assert_int_equal(wxg_guard_complete_batch(f->g, tickets, 2, res), 0);
    assert_int_equal(res[0], WXG_GUARD_OK);
    assert_int_equal(res[1], WXG_GUARD_LEASE_LOST);
    assert_int_equal(wxg_guard_complete(other, &held.ticket, NULL), 0);
    for (int i = 0; i < 5; i++)
        wxg_guard_claim_clear(&out[i]);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&held);
    wxg_guard_destroy(other);
}

static void repeated_complete_reports_already_done_instead_of_lease_lost(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:1000004";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    int already = -1;
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, &already), 0);
    assert_int_equal(already, 0);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, &already), 0);
    assert_int_equal(already, 1);
    /* but plugin_done and renew on a DONE message are refused */
    assert_int_equal(wxg_guard_renew(f->g, &c.ticket), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "x", NULL, 0), WXG_ELEASELOST);
    wxg_guard_claim_clear(&c);
}

static void release_clears_a_claim_keeps_the_fence_and_refuses_the_old_owner(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:1000005";
    wxg_guard_claim_t c, d;
    int released = -1;
    assert_int_equal(wxg_guard_release(f->g, key, strlen(key), &released), 0);
    assert_int_equal(released, 0);
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(wxg_guard_release(f->g, key, strlen(key), &released), 0);
    assert_int_equal(released, 1);
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_CLAIMED);
    assert_true(d.ticket.fence > c.ticket.fence);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_complete(f->g, &d.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&d);
}

static void inspect_reports_lease_fence_and_ttl_of_a_processing_message(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:1000006";
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), NULL, &rec), 0);
    assert_int_equal(rec->state, WXG_GUARD_ABSENT);
    wxg_guard_record_free(rec);
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    assert_int_equal(wxg_guard_renew(f->g, &c.ticket), 0);
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), NULL, &rec), 0);
    assert_int_equal(rec->state, WXG_GUARD_PROCESSING);
    assert_string_equal(rec->owner, c.ticket.owner);
    assert_int_equal(rec->fence, c.ticket.fence);
    assert_int_equal(rec->attempt, 1);
    assert_true(rec->lease_ms_left > 0 && rec->lease_ms_left <= f->conf.lease_ms);
    assert_true(rec->record_ttl_ms > f->conf.lease_ms);
    assert_true(rec->record_ttl_ms <= f->conf.inflight_ttl_ms);
    assert_true(rec->claimed_at_ms > 1600000000000LL);
    assert_non_null(strstr(rec->record_key, f->prefix));
    wxg_guard_record_free(rec);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
}

static void large_batches_split_into_pipelined_script_calls(void **state)
{
    fixture *f = *state;
    enum { N = 150 };
    static char keys[N][32];
    wxg_guard_msg_t msgs[N];
    wxg_guard_claim_t out[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "bot3:n:%d", i);
        msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), hash_a};
    }
    wxg_guard_stats_t s0, s1;
    wxg_guard_get_stats(f->g, &s0);
    assert_int_equal(wxg_guard_claim_batch(f->g, msgs, N, out), 0);
    wxg_guard_get_stats(f->g, &s1);
    /* The Lua design: 64 + 64 + 22 in three script calls; the native one: native commands. */
    assert_int_equal(s1.script_calls - s0.script_calls,
                     f->conf.design == WXG_GUARD_DESIGN_LUA ? 3 : 0);
    assert_int_equal(s1.round_trips - s0.round_trips, 1);
    wxg_guard_ticket_t t[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        assert_int_equal(out[i].outcome, WXG_GUARD_CLAIMED);
        t[i] = out[i].ticket;
    }
    assert_int_equal(wxg_guard_complete_batch(f->g, t, N, res), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(res[i], WXG_GUARD_OK);
        wxg_guard_claim_clear(&out[i]);
    }

    /* Cluster mode: one script call per shard, results still in the caller's order. */
    wxg_guard_conf_t cc = f->conf;
    cc.cluster = 1;
    cc.shard_bits = 4; /* 16 shards: the call count below; another layout, another prefix */
    char cprefix[64];
    snprintf(cprefix, sizeof cprefix, "%scl:", f->conf.prefix);
    cc.prefix = cprefix;
    wxg_guard_t *g = gt_open(&cc);
    for (int i = 0; i < N; i++)
        snprintf(keys[i], sizeof keys[i], "bot4:n:%d", i);
    wxg_guard_get_stats(g, &s0);
    assert_int_equal(wxg_guard_claim_batch(g, msgs, N, out), 0);
    wxg_guard_get_stats(g, &s1);
    uint64_t calls = s1.script_calls - s0.script_calls;
    if (cc.design == WXG_GUARD_DESIGN_LUA)
        assert_true(calls >= 16 && calls <= 16 + N / 64 + 16);
    else
        assert_int_equal(calls, 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(out[i].outcome, WXG_GUARD_CLAIMED);
        assert_ptr_equal(out[i].ticket.key, keys[i]);
        t[i] = out[i].ticket;
    }
    assert_int_equal(wxg_guard_complete_batch(g, t, N, res), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(res[i], WXG_GUARD_OK);
        wxg_guard_claim_clear(&out[i]);
    }
    assert_int_equal(wxg_guard_claim_batch(g, msgs, N, out), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(out[i].outcome, WXG_GUARD_DUPLICATE);
    wxg_guard_destroy(g);
}

/* Finding: a FAILED record that expired before its pointer (a FAILED retention shorter than the
 * lease, which the limits allow) was claimed again with the server's time as its fence, below
 * the first claim's fence (the end of its lease). Fences must rise with every claim. */
static void a_claim_after_a_failed_record_expired_gets_a_higher_fence(void **state)
{
    fixture *f = *state;
    wxg_guard_conf_t c = f->conf;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%sfence:", f->prefix);
    c.prefix = prefix;
    c.lease_ms = 10000;
    c.failed_retention_ms = 200;
    wxg_guard_t *g = gt_open(&c);
    const char *key = "bot:n:77";
    wxg_guard_claim_t a, b;
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &a), 0);
    assert_int_equal(a.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_fail(g, &a.ticket, "boom", 1), 0);
    usleep(500000); /* the FAILED record expires; its pointer in the bucket stays */
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &b), 0);
    assert_int_equal(b.outcome, WXG_GUARD_CLAIMED);
    if (b.ticket.fence <= a.ticket.fence)
        fail_msg("fence went backwards: %llu after %llu", (unsigned long long)b.ticket.fence,
                 (unsigned long long)a.ticket.fence);
    wxg_guard_claim_clear(&a);
    wxg_guard_claim_clear(&b);
    wxg_guard_destroy(g);
}

static void invalid_arguments_are_refused_before_reaching_redis(void **state)
{
    fixture *f = *state;
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, "", 0, NULL, &c), WXG_EINVAL);
    const char *key = "bot1:n:1000007";
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, &c), 0);
    char big[WXG_GUARD_RESULT_MAX + 1];
    memset(big, 'x', sizeof big);
    assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "ok", big, sizeof big), WXG_EINVAL);
    assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "bad name", "r", 1), WXG_EINVAL);
    assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "p:x", "r", 1), WXG_EINVAL);
    wxg_guard_ticket_t t = c.ticket;
    t.owner[3] = '\0';
    assert_int_equal(wxg_guard_complete(f->g, &t, NULL), WXG_EINVAL);
    t = c.ticket;
    t.fence = 0;
    assert_int_equal(wxg_guard_renew(f->g, &t), WXG_EINVAL);
    /* A long reason is truncated, not refused. */
    char reason[WXG_GUARD_REASON_MAX * 2];
    memset(reason, 'r', sizeof reason - 1);
    reason[sizeof reason - 1] = '\0';
    assert_int_equal(wxg_guard_fail(f->g, &c.ticket, reason, 3), 0);
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), NULL, &rec), 0);
    assert_int_equal(strlen(rec->fail_reason), WXG_GUARD_REASON_MAX);
    wxg_guard_record_free(rec);
    wxg_guard_claim_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            claim_complete_then_every_claim_is_a_duplicate_with_mismatch_flag, setup, teardown),
        cmocka_unit_test_setup_teardown(
            stale_holder_loses_to_a_higher_fence_and_its_writes_change_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(
            after_plugin_a_done_and_b_failing_the_next_claim_reports_a_finished, setup, teardown),
        cmocka_unit_test_setup_teardown(batch_mixing_claimed_duplicate_and_busy_routes_each_message,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            repeated_complete_reports_already_done_instead_of_lease_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(
            release_clears_a_claim_keeps_the_fence_and_refuses_the_old_owner, setup, teardown),
        cmocka_unit_test_setup_teardown(inspect_reports_lease_fence_and_ttl_of_a_processing_message,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(large_batches_split_into_pipelined_script_calls, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(invalid_arguments_are_refused_before_reaching_redis, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(a_claim_after_a_failed_record_expired_gets_a_higher_fence,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
