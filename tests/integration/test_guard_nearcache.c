/* The guard's near cache (conf.done_cache) against a real redis-server: a message completed
 * through one handle is a DUPLICATE for every handle sharing the cache without any Redis call,
 * with the payload check; a handle without the cache still asks Redis; only completions that
 * wrote the DONE marker fill the cache (not ALREADY_DONE, not a DUPLICATE from Redis, not naive
 * mode); an expired entry falls through to Redis; handles of another prefix never see it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "donecache_int.h"
#include "guardtest.h"

/* What a claim answered by Redis costs in each design: the Lua design one script call in one
 * round trip; the native one no script, and for a duplicate two round trips (its HSETNX finds
 * the field taken, then reads it). */
#define SCRIPTS(n) (gt_design() == WXG_GUARD_DESIGN_LUA ? (n) : 0)
#define DUP_TRIPS  (gt_design() == WXG_GUARD_DESIGN_LUA ? 1u : 2u)
#include "testenv.h"
#include "wxguard/guard.h"

typedef struct fixture {
    char prefix[64];
    wxg_guard_conf_t conf; /* with the cache */
    wxg_donecache_t *cache;
    wxg_guard_t *g1, *g2; /* both with the cache */
    wxg_guard_t *plain;   /* same prefix, no cache */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    char err[128] = "";
    f->cache = wxg__donecache_new(1024, err, sizeof err);
    assert_non_null(f->cache);
    gt_conf(&f->conf, wxg_test_redis_host(), wxg_test_redis_port(), "near", f->prefix,
            sizeof f->prefix);
    wxg_guard_conf_t plain = f->conf;
    f->conf.done_cache = f->cache;
    f->g1 = gt_open(&f->conf);
    f->g2 = gt_open(&f->conf);
    f->plain = gt_open(&plain);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_guard_destroy(f->g1);
    wxg_guard_destroy(f->g2);
    wxg_guard_destroy(f->plain);
    wxg__donecache_destroy(f->cache); /* after every handle that uses it */
    free(f);
    return 0;
}

static unsigned char hash_a[32] = {0x12, 0x34, 1};
static unsigned char hash_b[32] = {0x56, 0x78, 2};

static wxg_guard_stats_t stats(wxg_guard_t *g)
{
    wxg_guard_stats_t s;
    wxg_guard_get_stats(g, &s);
    return s;
}

static void claim_and_complete(wxg_guard_t *g, const char *key, const unsigned char *hash)
{
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(c.ticket.payload_tag_set, 1);
    int already = -1;
    assert_int_equal(wxg_guard_complete(g, &c.ticket, &already), 0);
    assert_int_equal(already, 0);
    wxg_guard_claim_clear(&c);
}

static void a_completed_message_is_a_duplicate_for_every_sharing_handle_without_redis(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:2000001";
    claim_and_complete(f->g1, key, hash_a);

    wxg_guard_t *handles[2] = {f->g1, f->g2};
    for (int h = 0; h < 2; h++) {
        wxg_guard_stats_t before = stats(handles[h]);
        wxg_guard_claim_t d;
        assert_int_equal(wxg_guard_claim(handles[h], key, strlen(key), hash_a, &d), 0);
        assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
        assert_int_equal(d.cached, 1);
        assert_int_equal(d.payload_mismatch, 0);
        wxg_guard_stats_t after = stats(handles[h]);
        assert_int_equal(after.script_calls, before.script_calls);
        assert_int_equal(after.round_trips, before.round_trips);
        assert_int_equal(after.duplicates, before.duplicates + 1);
        assert_int_equal(after.local_duplicates, before.local_duplicates + 1);
        wxg_guard_claim_clear(&d);
    }

    /* A batch of known messages only: no Redis call at all. */
    const char *key2 = "bot1:n:2000002";
    claim_and_complete(f->g2, key2, hash_b);
    wxg_guard_msg_t known[3] = {
        {key, strlen(key), hash_a}, {key2, strlen(key2), hash_b}, {key, strlen(key), hash_a}};
    wxg_guard_claim_t out[3];
    wxg_guard_stats_t before = stats(f->g1);
    assert_int_equal(wxg_guard_claim_batch(f->g1, known, 3, out), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(out[i].outcome, WXG_GUARD_DUPLICATE);
        assert_int_equal(out[i].cached, 1);
        assert_int_equal(out[i].payload_mismatch, 0);
        wxg_guard_claim_clear(&out[i]);
    }
    assert_int_equal(stats(f->g1).round_trips, before.round_trips);

    /* A mixed batch: only the new message travels, in one call, and each result lands at its
     * own index. */
    const char *fresh = "bot1:n:2000003";
    wxg_guard_msg_t mixed[3] = {
        {key2, strlen(key2), hash_b}, {fresh, strlen(fresh), hash_a}, {key, strlen(key), hash_b}};
    before = stats(f->g1);
    assert_int_equal(wxg_guard_claim_batch(f->g1, mixed, 3, out), 0);
    wxg_guard_stats_t after = stats(f->g1);
    assert_int_equal(after.round_trips, before.round_trips + 1);
    assert_int_equal(after.script_calls, before.script_calls + SCRIPTS(1));
    assert_int_equal(after.local_duplicates, before.local_duplicates + 2);
    assert_int_equal(out[0].outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(out[0].cached, 1);
    assert_int_equal(out[1].outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(out[1].cached, 0);
    gt_assert_fence_is_now(out[1].ticket.fence);
    assert_ptr_equal(out[1].ticket.key, fresh);
    assert_int_equal(out[2].outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(out[2].cached, 1);
    assert_int_equal(out[2].payload_mismatch, 1);
    int res = -1;
    assert_int_equal(wxg_guard_complete_batch(f->g1, &out[1].ticket, 1, &res), 0);
    assert_int_equal(res, WXG_GUARD_OK);
    for (int i = 0; i < 3; i++)
        wxg_guard_claim_clear(&out[i]);
}

static void a_changed_payload_is_reported_by_the_cache_as_redis_would(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:2100001";
    claim_and_complete(f->g1, key, hash_a);
    wxg_guard_claim_t d, r;
    assert_int_equal(wxg_guard_claim(f->g2, key, strlen(key), hash_b, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(d.cached, 1);
    assert_int_equal(d.payload_mismatch, 1);
    assert_int_equal(stats(f->g2).payload_mismatches, 1);
    /* Redis gives the same verdict for both payloads. */
    assert_int_equal(wxg_guard_claim(f->plain, key, strlen(key), hash_b, &r), 0);
    assert_int_equal(r.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(r.cached, 0);
    assert_int_equal(r.payload_mismatch, 1);
    assert_int_equal(wxg_guard_claim(f->plain, key, strlen(key), hash_a, &r), 0);
    assert_int_equal(r.payload_mismatch, 0);
    /* No payload hash at all is a tag of its own (0), as in Redis. */
    assert_int_equal(wxg_guard_claim(f->g2, key, strlen(key), NULL, &d), 0);
    assert_int_equal(d.cached, 1);
    assert_int_equal(d.payload_mismatch, 1);
    assert_int_equal(wxg_guard_claim(f->plain, key, strlen(key), NULL, &r), 0);
    assert_int_equal(r.payload_mismatch, 1);
}

static void a_handle_without_the_cache_still_gets_duplicate_from_redis(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:2200001";
    claim_and_complete(f->g1, key, hash_a);
    wxg_guard_stats_t before = stats(f->plain);
    wxg_guard_claim_t d;
    assert_int_equal(wxg_guard_claim(f->plain, key, strlen(key), hash_a, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(d.cached, 0);
    wxg_guard_stats_t after = stats(f->plain);
    assert_int_equal(after.script_calls, before.script_calls + SCRIPTS(1));
    assert_int_equal(after.round_trips, before.round_trips + DUP_TRIPS);
    assert_int_equal(after.local_duplicates, 0);
}

static void only_a_complete_that_wrote_the_marker_fills_the_cache(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:2300001";
    /* Completed through the handle without the cache: the cache knows nothing. */
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->plain, key, strlen(key), hash_a, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(f->plain, &c.ticket, NULL), 0);
    wxg__donecache_stats_t cs0;
    wxg__donecache_stats(f->cache, &cs0);

    /* The same completion retried through a cached handle: ALREADY_DONE, not remembered (the
     * marker's age is unknown). */
    int already = -1;
    assert_int_equal(wxg_guard_complete(f->g1, &c.ticket, &already), 0);
    assert_int_equal(already, 1);
    /* A DUPLICATE answered by Redis is not remembered either. */
    for (int round = 0; round < 2; round++) {
        wxg_guard_stats_t before = stats(f->g1);
        wxg_guard_claim_t d;
        assert_int_equal(wxg_guard_claim(f->g1, key, strlen(key), hash_a, &d), 0);
        assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
        assert_int_equal(d.cached, 0);
        assert_int_equal(stats(f->g1).round_trips, before.round_trips + DUP_TRIPS);
    }
    /* A stale owner's complete (LEASE_LOST) is not remembered. */
    const char *key2 = "bot1:n:2300002";
    wxg_guard_claim_t c2;
    assert_int_equal(wxg_guard_claim(f->g1, key2, strlen(key2), hash_a, &c2), 0);
    wxg_guard_ticket_t forged = c2.ticket;
    forged.owner[0] = forged.owner[0] == 'a' ? 'b' : 'a';
    assert_int_equal(wxg_guard_complete(f->g1, &forged, NULL), WXG_ELEASELOST);
    /* A ticket built by hand carries no payload tag: its completion is not remembered. */
    wxg_guard_ticket_t by_hand = c2.ticket;
    by_hand.payload_tag = 0;
    by_hand.payload_tag_set = 0;
    assert_int_equal(wxg_guard_complete(f->g1, &by_hand, NULL), 0);
    wxg_guard_claim_t d2;
    assert_int_equal(wxg_guard_claim(f->g1, key2, strlen(key2), hash_a, &d2), 0);
    assert_int_equal(d2.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(d2.cached, 0);

    wxg__donecache_stats_t cs;
    wxg__donecache_stats(f->cache, &cs);
    assert_int_equal(cs.inserts, cs0.inserts);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&c2);
}

static void an_expired_entry_falls_through_to_redis(void **state)
{
    fixture *f = *state;
    int s = wxg_test_scale();
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, wxg_test_redis_host(), wxg_test_redis_port(), "nearexp", prefix, sizeof prefix);
    /* A short retention with wide buckets: the marker outlives the retention by up to a minute,
     * the cache entry does not. */
    c.done_retention_ms = 1000 * s;
    c.done_bucket_ms = 60000 * s;
    c.lease_ms = 1000;
    c.done_cache = f->cache;
    wxg_guard_t *g = gt_open(&c);
    const char *key = "bot1:n:2400001";
    claim_and_complete(g, key, hash_a);
    /* The entry expires one retention after the complete was sent, so before this + retention. */
    int64_t completed = wxg_test_now_ms();
    wxg_guard_claim_t d;
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash_a, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(d.cached, 1);

    wxg_test_sleep_ms(completed + c.done_retention_ms + 20 - wxg_test_now_ms());
    wxg_guard_stats_t before = stats(g);
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash_a, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(d.cached, 0);
    assert_true(stats(g).round_trips > before.round_trips); /* Redis answered */
    wxg_guard_destroy(g);
}

static void handles_of_another_prefix_never_see_the_entries(void **state)
{
    fixture *f = *state;
    const char *key = "bot1:n:2500001";
    claim_and_complete(f->g1, key, hash_a);
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, wxg_test_redis_host(), wxg_test_redis_port(), "nearother", prefix, sizeof prefix);
    c.done_cache = f->cache;
    wxg_guard_t *g = gt_open(&c);
    wxg_guard_claim_t d;
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash_a, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(d.cached, 0);
    wxg_guard_claim_clear(&d);
    wxg_guard_destroy(g);
}

static void naive_mode_never_uses_the_cache(void **state)
{
    fixture *f = *state;
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, wxg_test_redis_host(), wxg_test_redis_port(), "nearnaive", prefix, sizeof prefix);
    c.naive = 1;
    c.done_cache = f->cache;
    wxg_guard_t *g = gt_open(&c);
    wxg__donecache_stats_t cs0, cs;
    wxg__donecache_stats(f->cache, &cs0);
    const char *key = "bot1:n:2600001";
    claim_and_complete(g, key, hash_a);
    wxg_guard_stats_t before = stats(g);
    wxg_guard_claim_t d;
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), hash_a, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(d.cached, 0);
    assert_int_equal(stats(g).round_trips, before.round_trips + 1);
    wxg__donecache_stats(f->cache, &cs);
    assert_int_equal(cs.inserts, cs0.inserts);
    assert_int_equal(cs.hits + cs.misses, cs0.hits + cs0.misses);
    wxg_guard_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            a_completed_message_is_a_duplicate_for_every_sharing_handle_without_redis, setup,
            teardown),
        cmocka_unit_test_setup_teardown(a_changed_payload_is_reported_by_the_cache_as_redis_would,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(a_handle_without_the_cache_still_gets_duplicate_from_redis,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(only_a_complete_that_wrote_the_marker_fills_the_cache,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(an_expired_entry_falls_through_to_redis, setup, teardown),
        cmocka_unit_test_setup_teardown(handles_of_another_prefix_never_see_the_entries, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(naive_mode_never_uses_the_cache, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
