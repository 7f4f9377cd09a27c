/* DONE retention and TTLs: a message completed in one time bucket is still a duplicate near the
 * end of the retention and not after it; every DONE bucket has a TTL of at least the retention;
 * no key the guard writes is ever persistent; DONE buckets stay in Redis's compact encoding; and a
 * second layout on the same prefix is refused. */
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

static void done_is_a_duplicate_near_the_end_of_retention_and_not_after(void **state)
{
    (void)state;
    int s = wxg_test_scale();
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, wxg_test_redis_host(), wxg_test_redis_port(), "ret", prefix, sizeof prefix);
    c.done_retention_ms = 2000 * s;
    c.done_bucket_ms = 500 * s;
    c.lease_ms = 1000;
    wxg_guard_t *g = gt_open(&c);
    const char *key = "bot:n:77";
    wxg_guard_claim_t cl, d;
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &cl), 0);
    int64_t sent = wxg_test_now_ms();
    assert_int_equal(wxg_guard_complete(g, &cl.ticket, NULL), 0);
    int64_t done = wxg_test_now_ms();
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(g, key, strlen(key), NULL, &rec), 0);
    char *bucket = strdup(rec->done_bucket);
    wxg_guard_record_free(rec);

    /* Near the end of the retention (counted from before the complete was sent). */
    wxg_test_sleep_ms(sent + c.done_retention_ms - 250 * s - wxg_test_now_ms());
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(wxg_guard_inspect(g, key, strlen(key), NULL, &rec), 0);
    assert_string_equal(rec->done_bucket, bucket); /* the same bucket holds it all along */
    wxg_guard_record_free(rec);

    /* After the retention plus one bucket width (the documented precision) it is gone. */
    wxg_test_sleep_ms(done + c.done_retention_ms + c.done_bucket_ms + 100 - wxg_test_now_ms());
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &d), 0);
    assert_int_equal(d.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(g, &d.ticket, NULL), 0);
    free(bucket);
    wxg_guard_claim_clear(&cl);
    wxg_guard_claim_clear(&d);
    wxg_guard_destroy(g);
}

static void every_done_bucket_outlives_the_retention_and_no_key_is_persistent(void **state)
{
    (void)state;
    wxg_test_redis_t r;
    if (wxg_test_redis_start(&r, NULL) != 0)
        fail_msg("cannot start a private redis-server");
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, "127.0.0.1", r.port, "ttl", prefix, sizeof prefix);
    c.lease_ms = 200;
    wxg_guard_t *g = gt_open(&c);
    enum { N = 300 };
    static char keys[N][32];
    wxg_guard_msg_t msgs[N];
    wxg_guard_claim_t out[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "bot:n:%d", 1000 + i);
        msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), NULL};
    }
    int64_t t0 = wxg_test_now_ms();
    assert_int_equal(wxg_guard_claim_batch(g, msgs, N, out), 0);
    /* Every kind of state: DONE, FAILED, plugin results, released, expired leases, live. */
    for (int i = 0; i < N; i++) {
        assert_int_equal(out[i].outcome, WXG_GUARD_CLAIMED);
        switch (i % 5) {
        case 0:
            assert_int_equal(wxg_guard_complete(g, &out[i].ticket, NULL), 0);
            break;
        case 1:
            assert_int_equal(wxg_guard_plugin_done(g, &out[i].ticket, "a", "x", 1), 0);
            assert_int_equal(wxg_guard_fail(g, &out[i].ticket, "r", 1), 0);
            break;
        case 2: {
            int rel = 0;
            assert_int_equal(wxg_guard_release(g, keys[i], strlen(keys[i]), &rel), 0);
            break;
        }
        case 3:
            assert_int_equal(wxg_guard_renew(g, &out[i].ticket), 0);
            break;
        default:
            break; /* left to expire */
        }
    }
    redisContext *raw = gt_redis("127.0.0.1", r.port, NULL);
    char **all = NULL;
    size_t n = gt_scan(raw, "*", &all);
    size_t buckets = 0;
    for (size_t i = 0; i < n; i++) {
        long long ttl = gt_pttl(raw, all[i]);
        int64_t elapsed = wxg_test_now_ms() - t0; /* every write happened after t0 */
        assert_true(ttl > 0);                     /* -1 would be a persistent key */
        if (strstr(all[i], ":d:")) {
            buckets++;
            assert_true(ttl >= c.done_retention_ms - elapsed);
        }
    }
    assert_true(buckets >= 1);
    assert_true(n >= buckets + N / 5 * 4);
    gt_free_keys(all);
    for (int i = 0; i < N; i++)
        wxg_guard_claim_clear(&out[i]);
    redisFree(raw);
    wxg_guard_destroy(g);
    wxg_test_redis_stop(&r);
}

static void done_buckets_stay_in_the_compact_listpack_encoding(void **state)
{
    (void)state;
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, wxg_test_redis_host(), wxg_test_redis_port(), "enc", prefix, sizeof prefix);
    c.shard_bits = 4;
    c.done_selector_bits = 5; /* 32 buckets for 2,000 markers: about 62 each */
    wxg_guard_t *g = gt_open(&c);
    enum { N = 2000, B = 100 };
    static char keys[N][32];
    for (int base = 0; base < N; base += B) {
        wxg_guard_msg_t msgs[B];
        wxg_guard_claim_t out[B];
        wxg_guard_ticket_t t[B];
        int res[B];
        for (int i = 0; i < B; i++) {
            snprintf(keys[base + i], sizeof keys[0], "bot:n:%d", 500000 + base + i);
            msgs[i] = (wxg_guard_msg_t){keys[base + i], strlen(keys[base + i]), NULL};
        }
        assert_int_equal(wxg_guard_claim_batch(g, msgs, B, out), 0);
        for (int i = 0; i < B; i++)
            t[i] = out[i].ticket;
        assert_int_equal(wxg_guard_complete_batch(g, t, B, res), 0);
        for (int i = 0; i < B; i++) {
            assert_int_equal(res[i], WXG_GUARD_OK);
            wxg_guard_claim_clear(&out[i]);
        }
    }
    redisContext *raw = gt_redis(wxg_test_redis_host(), wxg_test_redis_port(), NULL);
    char pattern[96];
    snprintf(pattern, sizeof pattern, "%s*:d:*", prefix);
    char **bk = NULL;
    size_t n = gt_scan(raw, pattern, &bk);
    assert_true(n >= 32 && n <= 64); /* 32 per time bucket; a boundary may split the run */
    long long total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *eargv[3] = {"OBJECT", "ENCODING", bk[i]};
        redisReply *r = gt_cmd(raw, 3, eargv);
        assert_string_equal(r->str, "listpack");
        freeReplyObject(r);
        const char *largv[2] = {"HLEN", bk[i]};
        r = gt_cmd(raw, 2, largv);
        total += r->integer;
        freeReplyObject(r);
        /* A bucket a script's complete created also holds the sentinel field '_'. */
        const char *xargv[3] = {"HEXISTS", bk[i], "_"};
        r = gt_cmd(raw, 3, xargv);
        total -= r->integer;
        freeReplyObject(r);
    }
    assert_int_equal(total, N);
    gt_free_keys(bk);
    redisFree(raw);
    wxg_guard_destroy(g);
}

static void a_second_layout_on_the_same_prefix_is_refused_at_startup(void **state)
{
    (void)state;
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, wxg_test_redis_host(), wxg_test_redis_port(), "layout", prefix, sizeof prefix);
    wxg_guard_t *g = gt_open(&c);
    char layout[256];
    assert_int_equal(wxg_guard_describe_layout(g, layout, sizeof layout), 0);
    const char *sel = strstr(layout, "selector_bits=");
    assert_non_null(sel);
    int stored_bits = (int)strtol(sel + strlen("selector_bits="), NULL, 10);
    wxg_guard_conf_t c2 = c;
    c2.done_expected_rate = c.done_expected_rate * 4; /* two more selector bits */
    char err[512] = "";
    int rc = 0;
    assert_null(wxg_guard_new(&c2, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONFIG);
    assert_non_null(strstr(err, "layout"));
    /* Pinning the stored geometry makes the new rate acceptable. */
    c2.done_selector_bits = stored_bits;
    wxg_guard_t *g2 = gt_open(&c2);
    wxg_guard_destroy(g2);
    wxg_guard_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(done_is_a_duplicate_near_the_end_of_retention_and_not_after),
        cmocka_unit_test(every_done_bucket_outlives_the_retention_and_no_key_is_persistent),
        cmocka_unit_test(done_buckets_stay_in_the_compact_listpack_encoding),
        cmocka_unit_test(a_second_layout_on_the_same_prefix_is_refused_at_startup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
