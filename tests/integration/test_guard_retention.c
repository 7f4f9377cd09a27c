/* DONE retention and TTLs: a message completed in one time bucket is still a duplicate near the
 * end of the retention and not after it; every DONE bucket has a TTL of at least the retention;
 * no key the guard writes is ever persistent; DONE buckets stay in Redis's compact encoding; a
 * second layout on the same prefix is refused; and the adaptive layout sizes each time bucket
 * from the one before without losing a marker. */
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
    c.done_expected_rate = 1000; /* a pinned layout */
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
    /* The adaptive layout is another layout too. */
    wxg_guard_conf_t c3 = c;
    c3.done_expected_rate = 0;
    assert_null(wxg_guard_new(&c3, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONFIG);
    assert_non_null(strstr(err, "sel=auto"));
    wxg_guard_destroy(g);
}

/* The server's clock in ms (the guard's time buckets count from it). */
static int64_t server_ms(redisContext *raw)
{
    const char *argv[1] = {"TIME"};
    redisReply *r = gt_cmd(raw, 1, argv);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    int64_t ms =
        strtoll(r->element[0]->str, NULL, 10) * 1000 + strtoll(r->element[1]->str, NULL, 10) / 1000;
    freeReplyObject(r);
    return ms;
}

/* Sleeps until the next time bucket of width w has just begun; returns it. */
static int64_t next_time_bucket(redisContext *raw, int64_t w)
{
    int64_t now = server_ms(raw);
    int64_t tb = now / w + 1;
    wxg_test_sleep_ms(tb * w - now + 50);
    assert_int_equal(server_ms(raw) / w, tb);
    return tb;
}

/* The selector bits stamped for time bucket tb (0 when there is no stamp). */
static int stamped_sel(redisContext *raw, const char *prefix, int64_t tb)
{
    char key[128];
    snprintf(key, sizeof key, "%sg:%lld", prefix, (long long)tb);
    const char *argv[2] = {"GET", key};
    redisReply *r = gt_cmd(raw, 2, argv);
    int sel = r->type == REDIS_REPLY_STRING ? atoi(r->str) : 0;
    freeReplyObject(r);
    return sel;
}

/* Claims and completes keys bot:a:<from> .. bot:a:<from + n - 1>, in batches. */
static void complete_range(wxg_guard_t *g, int from, int n)
{
    enum { B = 250 };
    for (int base = 0; base < n; base += B) {
        int m = n - base < B ? n - base : B;
        static char keys[B][32];
        wxg_guard_msg_t msgs[B];
        wxg_guard_claim_t out[B];
        wxg_guard_ticket_t t[B];
        int res[B];
        for (int i = 0; i < m; i++) {
            snprintf(keys[i], sizeof keys[i], "bot:a:%d", from + base + i);
            msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), NULL};
        }
        gt_claim_all(g, msgs, (size_t)m, out, t);
        assert_int_equal(wxg_guard_complete_batch(g, t, (size_t)m, res), 0);
        for (int i = 0; i < m; i++) {
            assert_int_equal(res[i], WXG_GUARD_OK);
            wxg_guard_claim_clear(&out[i]);
        }
    }
}

/* The sub-bucket number of a message's DONE bucket <prefix>{s..}:d:<sub>:<tb>, and its tb. */
static void done_bucket_of(wxg_guard_t *g, int i, long long *sub, long long *tb)
{
    char key[32];
    snprintf(key, sizeof key, "bot:a:%d", i);
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(g, key, strlen(key), NULL, &rec), 0);
    assert_non_null(rec->done_bucket);
    const char *d = strstr(rec->done_bucket, ":d:");
    assert_non_null(d);
    assert_int_equal(sscanf(d, ":d:%lld:%lld", sub, tb), 2);
    wxg_guard_record_free(rec);
}

static void the_adaptive_layout_follows_the_rate_and_keeps_older_markers_found(void **state)
{
    (void)state;
    int s = wxg_test_scale();
    /* Wide enough that each phase below ends more than the clock margin (2 s) before its time
     * bucket does: a stamp may be decided that long before its time bucket starts. */
    int64_t w = 6000LL * s;
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, wxg_test_redis_host(), wxg_test_redis_port(), "adapt", prefix, sizeof prefix);
    c.done_retention_ms = 120000LL * s;
    c.done_bucket_ms = w;
    c.shard_bits = 2;
    c.done_expected_rate = 0; /* adaptive */
    c.done_selector_bits = 0;
    wxg_guard_t *g = gt_open(&c);
    redisContext *raw = gt_redis(wxg_test_redis_host(), wxg_test_redis_port(), NULL);

    /* The first time bucket has nothing before it: sized for 1000/s, ceil(log2(1000 * 6 s / 64)).
     * It gets 200 markers. */
    int first_sel = 0;
    for (double want = 1000.0 * (double)w / 1000.0 / 64.0; want > 1.0; want /= 2.0)
        first_sel++;
    int64_t t = next_time_bucket(raw, w);
    complete_range(g, 0, 200);
    assert_int_equal(stamped_sel(raw, prefix, t), first_sel);
    assert_int_equal(stamped_sel(raw, prefix, t + 1), 0); /* not decided yet */

    /* The next one is sized from those 200: about three buckets' worth, fewer than the shards,
     * so the shards alone (2 bits). The count is an estimate from 64 sampled buckets of the
     * first time bucket, though, whose 2^first_sel buckets hold under two markers each: it
     * passes 256 markers (one more bit) about one time in fourteen at a timeout scale of 3, one
     * in three hundred at 1. A bit more is a bucket layout twice as wide, never a wrong answer;
     * the sample is exact enough where buckets hold the dozens they are sized for. It gets
     * 3,000. */
    assert_int_equal(next_time_bucket(raw, w), t + 1);
    complete_range(g, 1000, 3000);
    int sel1 = stamped_sel(raw, prefix, t + 1);
    if (sel1 != 2 && sel1 != 3)
        fail_msg("time bucket t + 1 stamped with %d selector bits, not 2 (or 3)", sel1);

    /* Nothing is written in the one after. The next one written is sized from the latest with
     * a stamp, the 3,000: 3000 / 64 = 47 buckets, 2^6 (not the first time bucket's size). */
    assert_int_equal(next_time_bucket(raw, w), t + 2);
    assert_int_equal(next_time_bucket(raw, w), t + 3);
    complete_range(g, 10000, 1);
    assert_int_equal(stamped_sel(raw, prefix, t + 2), 0);
    assert_int_equal(stamped_sel(raw, prefix, t + 3), 6);

    /* Every marker is still found, each in the bucket its time bucket's layout gives it, by a
     * second handle that knows the layouts only from their stamps. */
    wxg_guard_t *g2 = gt_open(&c);
    const struct {
        int from, n, sel;
        int64_t dt;
    } phase[] = {{0, 200, 0, 0}, {1000, 3000, sel1, 1}, {10000, 1, 6, 3}};
    for (size_t p = 0; p < sizeof phase / sizeof phase[0]; p++) {
        int sel = phase[p].sel ? phase[p].sel : first_sel;
        for (int i = phase[p].from; i < phase[p].from + phase[p].n; i += 37) {
            char key[32];
            snprintf(key, sizeof key, "bot:a:%d", i);
            wxg_guard_claim_t d;
            assert_int_equal(wxg_guard_claim(g2, key, strlen(key), NULL, &d), 0);
            assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
            wxg_guard_claim_clear(&d);
            long long sub = 0, tb = 0;
            done_bucket_of(g2, i, &sub, &tb);
            assert_int_equal(tb, t + phase[p].dt);
            assert_true(sub < (1LL << (sel - c.shard_bits)));
        }
    }
    /* The 3,000 fill every one of their buckets; the sampled count that sized the next time
     * bucket saw them. */
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s*:d:*:%lld", prefix, (long long)(t + 1));
    char **bk = NULL;
    assert_int_equal(gt_scan(raw, pattern, &bk), 1 << sel1);
    gt_free_keys(bk);
    wxg_guard_destroy(g2);
    redisFree(raw);
    wxg_guard_destroy(g);
}

/* The narrowest widths the layout allows (retention / width = 64) with a short retention: a
 * claim's window then also spans the clock margin's worth of time buckets on either side, 130
 * here, each with its own layout. Every step still works, and a marker is found. */
static void a_window_of_many_narrow_time_buckets_works(void **state)
{
    (void)state;
    char prefix[64];
    wxg_guard_conf_t c;
    gt_conf(&c, wxg_test_redis_host(), wxg_test_redis_port(), "narrow", prefix, sizeof prefix);
    c.done_retention_ms = 4000;
    c.done_bucket_ms = 4000 / 64;
    wxg_guard_t *g = gt_open(&c);
    enum { N = 20 };
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "bot:narrow:%d", i);
        wxg_guard_claim_t cl, d;
        assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &cl), 0);
        assert_int_equal(cl.outcome, WXG_GUARD_CLAIMED);
        assert_int_equal(wxg_guard_complete(g, &cl.ticket, NULL), 0);
        wxg_test_sleep_ms(30); /* a few time buckets apart */
        assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &d), 0);
        assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
        wxg_guard_claim_clear(&cl);
        wxg_guard_claim_clear(&d);
    }
    wxg_guard_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(done_is_a_duplicate_near_the_end_of_retention_and_not_after),
        cmocka_unit_test(every_done_bucket_outlives_the_retention_and_no_key_is_persistent),
        cmocka_unit_test(done_buckets_stay_in_the_compact_listpack_encoding),
        cmocka_unit_test(a_second_layout_on_the_same_prefix_is_refused_at_startup),
        cmocka_unit_test(the_adaptive_layout_follows_the_rate_and_keeps_older_markers_found),
        cmocka_unit_test(a_window_of_many_narrow_time_buckets_works),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
