/* Unit tests for the pure parts of the guard (lib/guard/guard_layout.c, lib/guard/guard_lua.c): the
 * false-duplicate arithmetic, the compact-marker geometry, Redis key building from hostile keys,
 * parsing of script replies (built from raw RESP bytes with hiredis's own reader, so no server
 * is involved), and the record definition every script is built with. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "guard_conn_int.h"

static redisReply *resp(const char *bytes)
{
    redisReader *rd = redisReaderCreate();
    assert_non_null(rd);
    assert_int_equal(redisReaderFeed(rd, bytes, strlen(bytes)), REDIS_OK);
    void *r = NULL;
    assert_int_equal(redisReaderGetReply(rd, &r), REDIS_OK);
    assert_non_null(r);
    redisReaderFree(rd);
    return r;
}

static void birthday_bound_needs_88_bits_for_600_million_markers(void **state)
{
    (void)state;
    int b = wxg__guard_required_bits(600e6, 1e-9);
    assert_int_equal(b, 88);
    double n = 600e6, pairs = n * (n - 1) / 2;
    assert_true(pairs / ldexp(1.0, b) < 1e-9);
    assert_true(pairs / ldexp(1.0, b - 1) >= 1e-9);
}

static void default_geometry_keeps_false_duplicates_below_1e9_and_buckets_compact(void **state)
{
    (void)state;
    wxg_guard_conf_t c;
    wxg_guard_conf_init(&c);
    wxg__guard_geom_t g;
    char err[256];
    /* The default is the adaptive layout: the first time bucket sized for 1000/s, one field
     * width for every rate up to 1e5/s (docs/guard.md §3.6). */
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
    assert_true(g.adaptive);
    assert_int_equal(g.selector_bits, 24);
    assert_int_equal(g.field_bytes, 10); /* 88 bits at the floor, with the 10 shard bits alone */
    /* Pinned at the same rate. */
    c.done_expected_rate = 1000;
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
    assert_false(g.adaptive);
    /* One bucket per retention: a claim probes 2 buckets, a marker lives 7 to 14 days. */
    assert_int_equal(g.bucket_ms, 7LL * 24 * 3600 * 1000);
    assert_int_equal(g.shard_bits, 10);    /* 1024 shards: spread over a Redis Cluster */
    assert_int_equal(g.selector_bits, 24); /* 6.05e8 markers a week / 2^24 = 36 per bucket */
    assert_int_equal(g.required_bits, 90); /* 1.21e9 markers live over 14 days */
    assert_int_equal(g.field_bytes, 9);    /* 90 - 24 = 66 bits -> 9 bytes */
    assert_true(g.selector_bits + 8 * g.field_bytes >= g.required_bits);
    assert_true(g.false_dup < 1e-9);
    assert_true(g.bucket_mean <= c.done_bucket_target);
    assert_true(g.bucket_mean > c.done_bucket_target / 2.0);
}

static void geometry_meets_the_bound_for_any_rate(void **state)
{
    (void)state;
    static const double rates[] = {0.01, 1, 12, 1000, 50000, 1e6};
    static const int64_t retentions[] = {2000, 3600000, 7LL * 86400000, 30LL * 86400000};
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        for (size_t j = 0; j < sizeof retentions / sizeof retentions[0]; j++) {
            wxg_guard_conf_t c;
            wxg_guard_conf_init(&c);
            c.done_expected_rate = rates[i];
            c.done_retention_ms = retentions[j];
            wxg__guard_geom_t g;
            char err[256];
            int rc = wxg__guard_geom_compute(&c, &g, err, sizeof err);
            if (rc != 0) {
                /* Only absurd combinations may be refused, and with a reason. */
                assert_int_equal(rc, WXG_ECONFIG);
                assert_true(rates[i] >= 1e6);
                assert_true(strlen(err) > 0);
                continue;
            }
            assert_true(g.false_dup < 1e-9);
            assert_true(g.window_markers >= 600e6);
            assert_true(g.bucket_mean <= 64.0);
            assert_true(g.field_bytes >= WXG__FIELD_BYTES_MIN &&
                        g.field_bytes <= WXG__FIELD_BYTES_MAX);
        }
    }
}

static void bad_geometry_is_refused_with_a_reason(void **state)
{
    (void)state;
    wxg_guard_conf_t c;
    wxg__guard_geom_t g;
    char err[256];
    wxg_guard_conf_init(&c);
    c.done_bucket_target = 200;
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "128"));
    wxg_guard_conf_init(&c);
    c.done_bucket_ms = 1000; /* 604800 live buckets to probe per claim */
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "done_bucket_ms"));
    wxg_guard_conf_init(&c);
    c.done_retention_ms = 0;
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), WXG_ECONFIG);
}

static void pinned_selector_bits_override_the_rate(void **state)
{
    (void)state;
    wxg_guard_conf_t c;
    wxg_guard_conf_init(&c);
    c.done_selector_bits = 14;
    wxg__guard_geom_t g;
    char err[256], s1[160], s2[160];
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
    assert_int_equal(g.selector_bits, 14);
    assert_int_equal(g.field_bytes, 10); /* 88 - 14 = 74 bits */
    assert_int_equal(wxg__guard_geom_stamp(&g, s1, sizeof s1), 0);
    c.done_expected_rate = 5; /* the stamp depends on the pinned geometry, not on the rate */
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
    assert_int_equal(wxg__guard_geom_stamp(&g, s2, sizeof s2), 0);
    assert_string_equal(s1, s2);
    assert_string_equal(s1, "v4 shard=10 sel=14 field=10 width=604800000");
}

static int name_is_safe(const char *s, size_t n, const char *prefix)
{
    if (strncmp(s, prefix, strlen(prefix)) != 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == ':' || ch == '{' ||
                 ch == '}';
        if (!ok)
            return 0;
    }
    return 1;
}

static void hostile_keys_map_to_fixed_safe_names_under_the_prefix(void **state)
{
    (void)state;
    wxg_guard_conf_t c;
    wxg_guard_conf_init(&c);
    wxg__guard_geom_t g;
    char err[256];
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
    size_t big_len = 100 * 1024;
    char *big = malloc(big_len);
    assert_non_null(big);
    memset(big, '*', big_len);
    struct {
        const char *k;
        size_t n;
    } keys[] = {
        {"acct:n:1 2", 10},
        {"acct:n:1\r\n*1\r\n$8\r\nFLUSHALL\r\n", 28},
        {"acct:n:*?[a-z]{x}", 17},
        {"a\0b", 3},
        {big, big_len},
    };
    size_t rlen = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        unsigned char fp[32];
        wxg__guard_keys_t k;
        assert_int_equal(wxg__guard_fingerprint(keys[i].k, keys[i].n, fp), 0);
        assert_int_equal(wxg__guard_keys_build("wxg:", &g, fp, &k), 0);
        assert_true(name_is_safe(k.record, k.record_len, "wxg:"));
        assert_true(name_is_safe(k.stem, k.stem_len, "wxg:"));
        if (i == 0)
            rlen = k.record_len;
        assert_int_equal(k.record_len, rlen); /* fixed width, whatever the input size */
        assert_int_equal(k.field_len, (size_t)g.field_bytes);
        assert_true(k.shard < (1u << g.shard_bits));
        assert_true(k.sub < (1ULL << (g.selector_bits - g.shard_bits)));
    }
    free(big);
}

static void record_and_buckets_of_a_message_share_one_hash_tag(void **state)
{
    (void)state;
    wxg_guard_conf_t c;
    wxg_guard_conf_init(&c);
    c.done_selector_bits = 21;
    c.shard_bits = 4;
    wxg__guard_geom_t g;
    char err[256];
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
    unsigned char fp[32];
    memset(fp, 0, sizeof fp);
    fp[0] = 0xA5; /* shard = first 4 bits = 0xA */
    fp[1] = 0xFF;
    fp[8] = 0x11;
    wxg__guard_keys_t k;
    assert_int_equal(wxg__guard_keys_build("wxg:", &g, fp, &k), 0);
    assert_int_equal(k.shard, 10u);
    /* sub = the next 17 bits: 0101 1111 1111 0000 0 */
    assert_int_equal(k.sub, 0x5FF0 << 1);
    assert_string_equal(k.record, "wxg:{sa}:r:a5ff0000000000001100000000000000");
    char want_stem[64];
    snprintf(want_stem, sizeof want_stem, "wxg:{sa}:d:%llu:", (unsigned long long)k.sub);
    assert_string_equal(k.stem, want_stem);
    assert_memory_equal(k.field, fp + WXG__FIELD_OFFSET, (size_t)g.field_bytes);
}

/* Shard digits are fixed-width hex at every shard count, the sub-bucket plain decimal. */
static void shard_tags_have_one_width_per_geometry(void **state)
{
    (void)state;
    static const struct {
        int bits;
        unsigned char b0, b1;
        const char *record;
    } cases[] = {
        {0, 0xFF, 0xFF, "p:{s0}:r:ffff0000000000000000000000000000"},
        {1, 0x80, 0x00, "p:{s1}:r:80000000000000000000000000000000"},
        {8, 0x0A, 0x00, "p:{s0a}:r:0a000000000000000000000000000000"},
        {10, 0xFF, 0xC0, "p:{s3ff}:r:ffc00000000000000000000000000000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wxg_guard_conf_t c;
        wxg_guard_conf_init(&c);
        c.shard_bits = cases[i].bits;
        c.done_selector_bits = 24;
        wxg__guard_geom_t g;
        char err[256];
        assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
        unsigned char fp[32] = {0};
        fp[0] = cases[i].b0;
        fp[1] = cases[i].b1;
        wxg__guard_keys_t k;
        assert_int_equal(wxg__guard_keys_build("p:", &g, fp, &k), 0);
        assert_string_equal(k.record, cases[i].record);
        assert_int_equal(k.record_len, strlen(cases[i].record));
        char want[64];
        size_t tag_end = strchr(cases[i].record, '}') - cases[i].record + 1;
        snprintf(want, sizeof want, "%.*s:d:%llu:", (int)tag_end, cases[i].record,
                 (unsigned long long)k.sub);
        assert_string_equal(k.stem, want);
        assert_int_equal(k.stem_len, strlen(want));
    }
    /* A prefix that leaves no room for the names is refused, not cut. */
    wxg_guard_conf_t c;
    wxg_guard_conf_init(&c);
    wxg__guard_geom_t g;
    char err[256];
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
    char prefix[WXG__KEY_MAX];
    memset(prefix, 'x', sizeof prefix - 1);
    prefix[sizeof prefix - 1] = '\0';
    unsigned char fp[32] = {0};
    wxg__guard_keys_t k;
    assert_int_equal(wxg__guard_keys_build(prefix, &g, fp, &k), WXG_EINVAL);
}

static void distinct_keys_get_distinct_records_and_equal_keys_equal_names(void **state)
{
    (void)state;
    wxg_guard_conf_t c;
    wxg_guard_conf_init(&c);
    wxg__guard_geom_t g;
    char err[256];
    assert_int_equal(wxg__guard_geom_compute(&c, &g, err, sizeof err), 0);
    unsigned char f1[32], f2[32], f3[32];
    wxg__guard_keys_t k1, k2, k3;
    assert_int_equal(wxg__guard_fingerprint("bot:n:1", 7, f1), 0);
    assert_int_equal(wxg__guard_fingerprint("bot:n:2", 7, f2), 0);
    assert_int_equal(wxg__guard_fingerprint("bot:n:1", 7, f3), 0);
    wxg__guard_keys_build("p:", &g, f1, &k1);
    wxg__guard_keys_build("p:", &g, f2, &k2);
    wxg__guard_keys_build("p:", &g, f3, &k3);
    assert_string_not_equal(k1.record, k2.record);
    assert_string_equal(k1.record, k3.record);
    assert_string_equal(k1.stem, k3.stem);
    assert_memory_equal(k1.field, k3.field, k1.field_len);
}

static void payload_tag_is_a_signed_16_bit_number(void **state)
{
    (void)state;
    unsigned char h[32] = {0};
    assert_int_equal(wxg__guard_payload_tag(NULL), 1);
    unsigned char zero[32] = {0};
    assert_int_equal(wxg__guard_payload_tag(zero), 1); /* never 0: lib/guard/guard_native.c */
    h[0] = 0x7f;
    h[1] = 0xff;
    assert_int_equal(wxg__guard_payload_tag(h), 32767);
    h[0] = 0x80;
    h[1] = 0x00;
    assert_int_equal(wxg__guard_payload_tag(h), -32768);
    h[0] = 0xff;
    h[1] = 0xfe;
    assert_int_equal(wxg__guard_payload_tag(h), -2);
}

static void prefixes_and_plugin_names_are_checked(void **state)
{
    (void)state;
    assert_true(wxg__guard_prefix_valid("wxg:"));
    assert_true(wxg__guard_prefix_valid("prod.wxg-1:"));
    assert_false(wxg__guard_prefix_valid(""));
    assert_false(wxg__guard_prefix_valid("wxg:{x}"));
    assert_false(wxg__guard_prefix_valid("wxg *"));
    assert_false(wxg__guard_prefix_valid(
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    assert_true(wxg__guard_plugin_name_valid("billing"));
    assert_true(wxg__guard_plugin_name_valid("auto-reply.v2"));
    assert_false(wxg__guard_plugin_name_valid(""));
    assert_false(wxg__guard_plugin_name_valid("a b"));
    assert_false(wxg__guard_plugin_name_valid("a:b"));
}

static void error_replies_are_classified(void **state)
{
    (void)state;
    const char *s = "NOSCRIPT No matching script. Please use EVAL.";
    assert_int_equal(wxg__guard_classify_error(s, strlen(s)), 1);
    s = "WRONGPASS invalid username-password pair or user is disabled.";
    assert_int_equal(wxg__guard_classify_error(s, strlen(s)), WXG_EAUTH);
    s = "NOPERM this user has no permissions to access one of the keys";
    assert_int_equal(wxg__guard_classify_error(s, strlen(s)), WXG_EAUTH);
    s = "NOAUTH Authentication required.";
    assert_int_equal(wxg__guard_classify_error(s, strlen(s)), WXG_EAUTH);
    s = "OOM command not allowed when used memory > 'maxmemory'.";
    assert_int_equal(wxg__guard_classify_error(s, strlen(s)), WXG_EREDIS);
}

static void claim_replies_parse_into_outcomes(void **state)
{
    (void)state;
    wxg_guard_claim_t c;
    memset(&c, 0, sizeof c);
    redisReply *r = resp("*4\r\n:1\r\n:7\r\n:3\r\n*4\r\n$7\r\nbilling\r\n$5\r\nrow42\r\n"
                         "$3\r\nlog\r\n$0\r\n\r\n");
    assert_int_equal(wxg__guard_parse_claim(r, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(c.ticket.fence, 7);
    assert_int_equal(c.attempt, 3);
    assert_int_equal(c.n_finished, 2);
    assert_string_equal(c.finished[0].name, "billing");
    assert_int_equal(c.finished[0].result_len, 5);
    assert_memory_equal(c.finished[0].result, "row42", 5);
    assert_string_equal(c.finished[1].name, "log");
    assert_int_equal(c.finished[1].result_len, 0);
    wxg_guard_claim_clear(&c);
    assert_null(c.finished);
    freeReplyObject(r);

    r = resp("*2\r\n:2\r\n:1\r\n");
    assert_int_equal(wxg__guard_parse_claim(r, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_DUPLICATE);
    assert_int_equal(c.payload_mismatch, 1);
    freeReplyObject(r);

    /* The common answers travel as one integer. */
    static const struct {
        const char *resp;
        wxg_guard_outcome_t outcome;
        int mismatch;
    } compact[] = {{":-1765000000123456\r\n", WXG_GUARD_CLAIMED, 0},
                   {":2\r\n", WXG_GUARD_DUPLICATE, 0},
                   {":3\r\n", WXG_GUARD_DUPLICATE, 1}};
    for (size_t i = 0; i < sizeof compact / sizeof compact[0]; i++) {
        memset(&c, 0, sizeof c);
        r = resp(compact[i].resp);
        assert_int_equal(wxg__guard_parse_claim(r, &c), 0);
        assert_int_equal(c.outcome, compact[i].outcome);
        assert_int_equal(c.payload_mismatch, compact[i].mismatch);
        if (c.outcome == WXG_GUARD_CLAIMED) {
            assert_int_equal(c.ticket.fence, 1765000000123456ULL); /* the fence, negated */
            assert_int_equal(c.attempt, 1);
            assert_int_equal(c.n_finished, 0);
            assert_null(c.finished);
        }
        freeReplyObject(r);
    }

    memset(&c, 0, sizeof c);
    r = resp("*2\r\n:3\r\n:2500\r\n");
    assert_int_equal(wxg__guard_parse_claim(r, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_BUSY);
    assert_int_equal(c.lease_ms_left, 2500);
    freeReplyObject(r);
}

static void malformed_claim_replies_are_refused(void **state)
{
    (void)state;
    static const char *bad[] = {
        ":0\r\n",                                    /* integer answer out of range */
        ":1\r\n",                                    /* integer answer out of range */
        ":4\r\n",                                    /* integer answer out of range */
        "$1\r\n1\r\n",                               /* a string */
        "*2\r\n:9\r\n:1\r\n",                        /* unknown code */
        "*4\r\n:1\r\n:0\r\n:1\r\n*0\r\n",            /* fence 0 */
        "*4\r\n:1\r\n:1\r\n:1\r\n*1\r\n$1\r\na\r\n", /* odd plugin list */
        "*2\r\n:2\r\n:5\r\n",                        /* mismatch flag not 0/1 */
        "*2\r\n:3\r\n:-4\r\n",                       /* negative lease */
        "*2\r\n:3\r\n$2\r\n10\r\n",                  /* string where an integer belongs */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wxg_guard_claim_t c;
        memset(&c, 0, sizeof c);
        redisReply *r = resp(bad[i]);
        assert_int_equal(wxg__guard_parse_claim(r, &c), WXG_EREDIS);
        assert_null(c.finished);
        freeReplyObject(r);
    }
}

static void transition_results_parse(void **state)
{
    (void)state;
    int res = -7;
    redisReply *r = resp(":0\r\n");
    assert_int_equal(wxg__guard_parse_result(r, &res), 0);
    assert_int_equal(res, WXG_GUARD_OK);
    freeReplyObject(r);
    r = resp(":-1\r\n");
    assert_int_equal(wxg__guard_parse_result(r, &res), 0);
    assert_int_equal(res, WXG_GUARD_LEASE_LOST);
    freeReplyObject(r);
    r = resp(":1\r\n");
    assert_int_equal(wxg__guard_parse_result(r, &res), 0);
    assert_int_equal(res, WXG_GUARD_ALREADY_DONE);
    freeReplyObject(r);
    r = resp(":2\r\n");
    assert_int_equal(wxg__guard_parse_result(r, &res), WXG_EREDIS);
    freeReplyObject(r);
    r = resp("+OK\r\n");
    assert_int_equal(wxg__guard_parse_result(r, &res), WXG_EREDIS);
    freeReplyObject(r);
}

/* The value list of a "local A, B, C = 1, 2, 3" line of a script that names `first`. */
static int lua_locals(const char *script, const char *first, long *vals, int cap)
{
    const char *p = strstr(script, first);
    assert_non_null(p);
    const char *eq = strstr(p, " = "), *nl = strchr(p, '\n');
    assert_true(eq && nl && eq < nl);
    int n = 0;
    for (const char *q = eq + 3; q < nl && n < cap;) {
        char *end = NULL;
        vals[n++] = strtol(q, &end, 10);
        q = end;
        while (q < nl && (*q == ',' || *q == ' '))
            q++;
    }
    return n;
}

static void every_script_is_built_with_the_record_fields_c_uses(void **state)
{
    (void)state;
    const char *scripts[] = {
        wxg__lua_claim,   wxg__lua_renew,   wxg__lua_plugin_done, wxg__lua_complete, wxg__lua_fail,
        wxg__lua_inspect, wxg__lua_release, wxg__lua_rearm,       wxg__lua_purge,    wxg__lua_peek};
    for (size_t i = 0; i < sizeof scripts / sizeof scripts[0]; i++) {
        long v[32];
        /* F_ST .. F_KLEN are 1-based: one more than the C index of the same field. */
        int n = lua_locals(scripts[i], "local F_ST, F_OWNER, F_FENCE, F_TAG,", v, 32);
        assert_int_equal(n, WXG__F_COUNT);
        for (int k = 0; k < n; k++)
            assert_int_equal(v[k], k + 1);
        assert_non_null(strstr(scripts[i], "F_KLEN = "));
        /* The in-flight value's shape, which lib/guard/guard_native.c writes too. */
        n = lua_locals(scripts[i], "local OWNER_LEN, OWNER_DIGITS, FENCE_MIN_DIGITS", v, 32);
        assert_int_equal(n, 3);
        assert_int_equal(v[0], WXG_GUARD_OWNER_LEN);
        assert_int_equal(v[1], WXG__REC_OWNER_DIGITS);
        assert_int_equal(v[2], WXG__REC_FENCE_MIN_DIGITS);
        /* No script indexes a record by number any more. */
        assert_null(strstr(scripts[i], "f[1]"));
        assert_null(strstr(scripts[i], "f[6]"));
    }
}

static void constructor_refuses_bad_configuration_without_connecting(void **state)
{
    (void)state;
    wxg_guard_conf_t c;
    char err[256];
    int rc = 0;
    wxg_guard_conf_init(&c);
    c.prefix = "bad{prefix}";
    c.port = 1; /* nothing is contacted: validation comes first */
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONFIG);
    assert_non_null(strstr(err, "prefix"));
    wxg_guard_conf_init(&c);
    c.lease_ms = 1000;
    c.inflight_ttl_ms = 10;
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONFIG);
    assert_null(wxg_guard_new(NULL, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_EINVAL);
    wxg_guard_destroy(NULL);
    wxg_guard_claim_clear(NULL);
    wxg_guard_record_free(NULL);
    wxg_guard_watchdog_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(birthday_bound_needs_88_bits_for_600_million_markers),
        cmocka_unit_test(default_geometry_keeps_false_duplicates_below_1e9_and_buckets_compact),
        cmocka_unit_test(geometry_meets_the_bound_for_any_rate),
        cmocka_unit_test(bad_geometry_is_refused_with_a_reason),
        cmocka_unit_test(pinned_selector_bits_override_the_rate),
        cmocka_unit_test(hostile_keys_map_to_fixed_safe_names_under_the_prefix),
        cmocka_unit_test(record_and_buckets_of_a_message_share_one_hash_tag),
        cmocka_unit_test(shard_tags_have_one_width_per_geometry),
        cmocka_unit_test(distinct_keys_get_distinct_records_and_equal_keys_equal_names),
        cmocka_unit_test(payload_tag_is_a_signed_16_bit_number),
        cmocka_unit_test(prefixes_and_plugin_names_are_checked),
        cmocka_unit_test(error_replies_are_classified),
        cmocka_unit_test(claim_replies_parse_into_outcomes),
        cmocka_unit_test(malformed_claim_replies_are_refused),
        cmocka_unit_test(transition_results_parse),
        cmocka_unit_test(every_script_is_built_with_the_record_fields_c_uses),
        cmocka_unit_test(constructor_refuses_bad_configuration_without_connecting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
