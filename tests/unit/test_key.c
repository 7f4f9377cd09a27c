/* Unit tests for lib/key.c: the id grammar, safe key parts, length-prefixed hashing, the key
 * grammar checker and Redis names. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "testkey.h"
#include "wxguard/err.h"
#include "wxguard/key.h"

static wxg_id_verdict_t idc(const char *s)
{
    return wxg_id_check(s, strlen(s));
}

static void id_grammar_accepts_exact_unsigned_64_bit_integers(void **state)
{
    (void)state;
    assert_int_equal(idc("1"), WXG_ID_OK);
    assert_int_equal(idc("1968000003"), WXG_ID_OK);
    assert_int_equal(idc("7301234567890123457"), WXG_ID_OK);
    assert_int_equal(idc("9007199254740993"), WXG_ID_OK); /* 2^53 + 1 */
    assert_int_equal(idc("18446744073709551615"), WXG_ID_OK);
    assert_int_equal(idc("14000000000000000001"), WXG_ID_OK); /* above INT64_MAX */
}

static void id_grammar_rejects_everything_else_with_a_reason(void **state)
{
    (void)state;
    assert_int_equal(wxg_id_check(NULL, 0), WXG_ID_EMPTY);
    assert_int_equal(idc(""), WXG_ID_EMPTY);
    assert_int_equal(idc("0"), WXG_ID_ZERO);
    assert_int_equal(idc("-4812345678901234567"), WXG_ID_NEGATIVE);
    assert_int_equal(idc("-0"), WXG_ID_NEGATIVE);
    assert_int_equal(idc("7301234567890123457.0"), WXG_ID_REAL);
    assert_int_equal(idc("1e5"), WXG_ID_REAL);
    assert_int_equal(idc("1E+5"), WXG_ID_REAL);
    assert_int_equal(idc("01"), WXG_ID_LEADING_ZERO);
    assert_int_equal(idc("18446744073709551616"), WXG_ID_OUT_OF_RANGE);
    assert_int_equal(idc("99999999999999999999"), WXG_ID_OUT_OF_RANGE);
    assert_int_equal(idc("123456789012345678901"), WXG_ID_OUT_OF_RANGE);
    assert_int_equal(idc(" 1"), WXG_ID_NOT_DIGITS);
    assert_int_equal(idc("1 "), WXG_ID_NOT_DIGITS);
    assert_int_equal(idc("+1"), WXG_ID_NOT_DIGITS);
    assert_int_equal(idc("1-2"), WXG_ID_NOT_DIGITS);
    assert_int_equal(idc("12ab"), WXG_ID_NOT_DIGITS);
    assert_int_equal(idc("1\r\n"), WXG_ID_NOT_DIGITS);
    assert_int_equal(idc("1*"), WXG_ID_NOT_DIGITS);
    assert_int_equal(wxg_id_check("1\0002", 3), WXG_ID_NOT_DIGITS);
    assert_string_equal(wxg_id_verdict_str(WXG_ID_NEGATIVE), "a negative number");
}

static void ids_that_differ_only_beyond_2_pow_53_give_different_keys(void **state)
{
    (void)state;
    char a[WXG_KEY_MAX], b[WXG_KEY_MAX];
    const char *acct = "wxid_fakebot000001";
    /* Both ids are the same IEEE double (7301234567890123456). */
    assert_int_equal(wxg_key_server(a, sizeof a, acct, strlen(acct), "7301234567890123457", 19), 0);
    assert_int_equal(wxg_key_server(b, sizeof b, acct, strlen(acct), "7301234567890123458", 19), 0);
    assert_string_equal(a, "wxid_fakebot000001:n:7301234567890123457");
    assert_string_equal(b, "wxid_fakebot000001:n:7301234567890123458");
}

static void the_same_server_id_under_two_accounts_gives_two_keys(void **state)
{
    (void)state;
    char a[WXG_KEY_MAX], b[WXG_KEY_MAX];
    assert_int_equal(
        wxg_key_server(a, sizeof a, "wxid_fakebot000001", 18, "5512345678901234567", 19), 0);
    assert_int_equal(
        wxg_key_server(b, sizeof b, "wxid_fakebot000002", 18, "5512345678901234567", 19), 0);
    assert_string_not_equal(a, b);
}

static void server_keys_refuse_non_ids_and_empty_accounts(void **state)
{
    (void)state;
    char k[WXG_KEY_MAX];
    assert_int_equal(wxg_key_server(k, sizeof k, "bot", 3, "-1", 2), WXG_EINVAL);
    assert_int_equal(wxg_key_server(k, sizeof k, "bot", 3, "0", 1), WXG_EINVAL);
    assert_int_equal(wxg_key_server(k, sizeof k, "bot", 3, "1.0", 3), WXG_EINVAL);
    assert_int_equal(wxg_key_server(k, sizeof k, "", 0, "1", 1), WXG_EINVAL);
    assert_int_equal(wxg_key_server(k, sizeof k, NULL, 0, "1", 1), WXG_EINVAL);
    assert_int_equal(wxg_key_server(k, 8, "bot", 3, "123456789", 9), WXG_EINVAL);
}

/* No character that could matter to Redis patterns, logs or the hash tag, and within the size
 * limit. */
static void assert_key_is_safe(const char *k)
{
    assert_true(strlen(k) < WXG_KEY_MAX);
    wxg_test_assert_key_safe(k, NULL);
}

static void hostile_accounts_are_hashed_never_copied(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n;
    } hostile[] = {
        {"wxid with spaces", 16},
        {"bot\r\nFLUSHALL", 14},
        {"bot*", 4},
        {"b?t", 3},
        {"[bot]", 5},
        {"a\0b", 3},
        {"{tag}", 5},
        {"a:n:1", 5},
        {"\xff\xfe", 2},
    };
    char k[WXG_KEY_MAX], raw_part[80];
    for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
        assert_int_equal(wxg_key_server(k, sizeof k, hostile[i].s, hostile[i].n, "42", 2), 0);
        assert_key_is_safe(k);
        assert_int_equal(k[0], 'x');
        assert_int_equal(strlen(k), 65 + strlen(":n:42"));
        assert_int_equal(wxg_key_part(hostile[i].s, hostile[i].n, raw_part, sizeof raw_part), 65);
    }
    /* 100 KB of text. */
    size_t big = 100 * 1024;
    char *s = malloc(big);
    assert_non_null(s);
    memset(s, 'a', big);
    assert_int_equal(wxg_key_server(k, sizeof k, s, big, "42", 2), 0);
    assert_key_is_safe(k);
    assert_int_equal(k[0], 'x');
    free(s);
}

static void raw_parts_stop_at_64_characters_so_the_hashed_form_is_unique(void **state)
{
    (void)state;
    char p64[65], p65[66], out[80];
    memset(p64, 'a', 64);
    p64[64] = '\0';
    memset(p65, 'a', 65);
    p65[65] = '\0';
    assert_int_equal(wxg_key_part(p64, 64, out, sizeof out), 64);
    assert_string_equal(out, p64);
    assert_int_equal(wxg_key_part(p65, 65, out, sizeof out), 65);
    assert_int_equal(out[0], 'x');
    assert_string_not_equal(out, p65);
    /* A raw value that looks like a hashed part is 65 characters: it is hashed too. */
    char looks[66];
    looks[0] = 'x';
    memset(looks + 1, '0', 64);
    looks[65] = '\0';
    assert_int_equal(wxg_key_part(looks, 65, out, sizeof out), 65);
    assert_string_not_equal(out, looks);
    assert_int_equal(wxg_key_part("", 0, out, sizeof out), WXG_EINVAL);
    assert_int_equal(wxg_key_part("a", 1, out, 10), WXG_EINVAL);
}

static void oa_message_keys_follow_the_reference_shape(void **state)
{
    (void)state;
    char k[WXG_KEY_MAX];
    assert_int_equal(wxg_key_oa_msg(k, sizeof k, "gh_fake00000001", 15, "24500000000000001", 17,
                                    "oFAKE_openid_000000001", 22, 1732329909),
                     0);
    assert_string_equal(k, "gh_fake00000001:m:24500000000000001:oFAKE_openid_000000001:1732329909");
    char kind = 0;
    assert_int_equal(wxg_key_check(k, &kind), 0);
    assert_int_equal(kind, 'm');
    /* A hostile sender is hashed, so it can neither inject ':' nor glob characters. */
    assert_int_equal(wxg_key_oa_msg(k, sizeof k, "gh_x", 4, "1", 1, "o:m:*", 5, 0), 0);
    assert_key_is_safe(k);
    assert_non_null(strstr(k, ":m:1:x"));
    assert_int_equal(wxg_key_oa_msg(k, sizeof k, "gh_x", 4, "1", 1, "", 0, 0), WXG_EINVAL);
    assert_int_equal(wxg_key_oa_msg(k, sizeof k, "gh_x", 4, "x", 1, "o", 1, 0), WXG_EINVAL);
    assert_int_equal(wxg_key_oa_msg(k, sizeof k, "gh_x", 4, "1", 1, "o", 1, -1), WXG_EINVAL);
}

/* The hash of O2 (reference sample) computed here by building the length-prefixed byte string
 * by hand and hashing it with EVP directly, independently of wxg_key_hash_fields(). */
static void event_keys_hash_length_prefixed_fields_as_documented(void **state)
{
    (void)state;
    static const char *const fields[] = {"wxg.e.v1", "oFAKE_openid_000000003", "1732330000",
                                         "subscribe", "qrscene_123123"};
    unsigned char buf[512];
    size_t n = 0;
    for (size_t i = 0; i < 5; i++) {
        size_t l = strlen(fields[i]);
        buf[n++] = 1;
        for (int b = 7; b >= 0; b--)
            buf[n++] = (unsigned char)((uint64_t)l >> (8 * b));
        memcpy(buf + n, fields[i], l);
        n += l;
    }
    memset(buf + n, 0, 9); /* MsgID absent */
    n += 9;
    unsigned char md[32];
    unsigned int mdlen = 0;
    assert_int_equal(EVP_Digest(buf, n, md, &mdlen, EVP_sha256(), NULL), 1);
    char expect[WXG_KEY_MAX] = "gh_fake00000001:e:";
    size_t off = strlen(expect);
    for (int i = 0; i < 32; i++) {
        expect[off + 2 * i] = "0123456789abcdef"[md[i] >> 4];
        expect[off + 2 * i + 1] = "0123456789abcdef"[md[i] & 15];
    }
    expect[off + 64] = '\0';

    wxg_key_event_t ev = {{"oFAKE_openid_000000003", 22},
                          {"1732330000", 10},
                          {"subscribe", 9},
                          {"qrscene_123123", 14},
                          {NULL, 0}};
    char k[WXG_KEY_MAX];
    assert_int_equal(wxg_key_oa_event(k, sizeof k, "gh_fake00000001", 15, &ev), 0);
    assert_string_equal(k, expect);
    assert_string_equal(k, "gh_fake00000001:e:"
                           "787beffa36f95a7407c694056da0272cc64c4eaffc9c85cc0639755546e7df8b");
}

static void length_prefixes_keep_field_boundaries_and_absence_apart(void **state)
{
    (void)state;
    unsigned char a[32], b[32], c[32], d[32];
    wxg_key_field_t f1[] = {{"ab", 2}, {"c", 1}};
    wxg_key_field_t f2[] = {{"a", 1}, {"bc", 2}};
    wxg_key_field_t f3[] = {{"", 0}, {"abc", 3}};
    wxg_key_field_t f4[] = {{NULL, 0}, {"abc", 3}};
    assert_int_equal(wxg_key_hash_fields(f1, 2, a), 0);
    assert_int_equal(wxg_key_hash_fields(f2, 2, b), 0);
    assert_int_equal(wxg_key_hash_fields(f3, 2, c), 0);
    assert_int_equal(wxg_key_hash_fields(f4, 2, d), 0);
    assert_memory_not_equal(a, b, 32);
    assert_memory_not_equal(c, d, 32);
}

static void fingerprints_cover_content_bytes_past_a_nul(void **state)
{
    (void)state;
    char k1[WXG_KEY_MAX], k2[WXG_KEY_MAX], k3[WXG_KEY_MAX];
    wxg_key_fingerprint_t fp = {{"wkteam", 6}, {"60001", 5}, {NULL, 0},  {NULL, 0},
                                {NULL, 0},     {NULL, 0},    {"a\0b", 3}};
    assert_int_equal(wxg_key_fingerprint(k1, sizeof k1, "bot", 3, &fp), 0);
    fp.content.ptr = "a\0c";
    assert_int_equal(wxg_key_fingerprint(k2, sizeof k2, "bot", 3, &fp), 0);
    assert_string_not_equal(k1, k2);
    assert_int_equal(wxg_key_fingerprint(k3, sizeof k3, NULL, 0, &fp), 0);
    assert_memory_equal(k3, "~:h:", 4);
    assert_key_is_safe(k3);
    assert_int_equal(wxg_key_fingerprint(k3, sizeof k3, "", 0, &fp), WXG_EINVAL);
}

static void every_kind_sits_after_the_first_colon_so_kinds_never_collide(void **state)
{
    (void)state;
    char n[WXG_KEY_MAX], m[WXG_KEY_MAX], e[WXG_KEY_MAX], h[WXG_KEY_MAX];
    wxg_key_event_t ev = {{"o", 1}, {"1", 1}, {"CLICK", 5}, {NULL, 0}, {NULL, 0}};
    wxg_key_fingerprint_t fp = {{"generic", 7}, {NULL, 0}, {NULL, 0}, {NULL, 0},
                                {NULL, 0},      {NULL, 0}, {"1", 1}};
    assert_int_equal(wxg_key_server(n, sizeof n, "acct", 4, "1", 1), 0);
    assert_int_equal(wxg_key_oa_msg(m, sizeof m, "acct", 4, "1", 1, "o", 1, 1), 0);
    assert_int_equal(wxg_key_oa_event(e, sizeof e, "acct", 4, &ev), 0);
    assert_int_equal(wxg_key_fingerprint(h, sizeof h, "acct", 4, &fp), 0);
    const char *keys[] = {n, m, e, h};
    const char kinds[] = {'n', 'm', 'e', 'h'};
    for (int i = 0; i < 4; i++) {
        char kind = 0;
        assert_int_equal(wxg_key_check(keys[i], &kind), 0);
        assert_int_equal(kind, kinds[i]);
        assert_int_equal(keys[i][strchr(keys[i], ':') - keys[i] + 1], kinds[i]);
        for (int j = i + 1; j < 4; j++)
            assert_string_not_equal(keys[i], keys[j]);
    }
}

static void key_check_refuses_malformed_keys(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "acct",
        "acct:n",
        "acct:n:",
        "acct:n:0",
        "acct:n:01",
        "acct:n:18446744073709551616",
        "acct:x:1",
        "acct:nn:1",
        "a cct:n:1",
        "acct:n:1 ",
        "{acct}:n:1",
        "acct:n:1*",
        "~:n:1",
        "acct:m:1:o",
        "acct:m:1:o:01",
        "acct:m:x:o:1",
        "acct:h:abc",
        "acct:h:787BEFFA36F95A7407C694056DA0272CC64C4EAFFC9C85CC0639755546E7DF8B",
        "acct:e:787beffa36f95a7407c694056da0272cc64c4eaffc9c85cc0639755546e7df8b0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (wxg_key_check(bad[i], NULL) != WXG_EINVAL)
            fail_msg("'%s' passed the key check", bad[i]);
    }
    assert_int_equal(wxg_key_check(NULL, NULL), WXG_EINVAL);
    assert_int_equal(wxg_key_check("acct:m:1:o:0", NULL), 0);
}

static void redis_names_wrap_the_key_in_one_hash_tag(void **state)
{
    (void)state;
    char out[256];
    const char *k = "wxid_fakebot000001:n:7301234567890123457";
    int n = wxg_key_redis_name(out, sizeof out, "wxg:", k, ":lease");
    assert_int_equal(n, (int)strlen("wxg:{wxid_fakebot000001:n:7301234567890123457}:lease"));
    assert_string_equal(out, "wxg:{wxid_fakebot000001:n:7301234567890123457}:lease");
    assert_int_equal(wxg_key_redis_name(out, sizeof out, NULL, k, NULL), (int)strlen(k) + 2);
    assert_int_equal(wxg_key_redis_name(out, sizeof out, "a{", k, NULL), WXG_EINVAL);
    assert_int_equal(wxg_key_redis_name(out, sizeof out, NULL, "not a key", NULL), WXG_EINVAL);
    assert_int_equal(wxg_key_redis_name(out, 10, "wxg:", k, NULL), WXG_EOVERFLOW);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(id_grammar_accepts_exact_unsigned_64_bit_integers),
        cmocka_unit_test(id_grammar_rejects_everything_else_with_a_reason),
        cmocka_unit_test(ids_that_differ_only_beyond_2_pow_53_give_different_keys),
        cmocka_unit_test(the_same_server_id_under_two_accounts_gives_two_keys),
        cmocka_unit_test(server_keys_refuse_non_ids_and_empty_accounts),
        cmocka_unit_test(hostile_accounts_are_hashed_never_copied),
        cmocka_unit_test(raw_parts_stop_at_64_characters_so_the_hashed_form_is_unique),
        cmocka_unit_test(oa_message_keys_follow_the_reference_shape),
        cmocka_unit_test(event_keys_hash_length_prefixed_fields_as_documented),
        cmocka_unit_test(length_prefixes_keep_field_boundaries_and_absence_apart),
        cmocka_unit_test(fingerprints_cover_content_bytes_past_a_nul),
        cmocka_unit_test(every_kind_sits_after_the_first_colon_so_kinds_never_collide),
        cmocka_unit_test(key_check_refuses_malformed_keys),
        cmocka_unit_test(redis_names_wrap_the_key_in_one_hash_tag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
