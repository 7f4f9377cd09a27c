/* The parts of lib/rcluster.c that need no server: the slot of a key (CRC16-XMODEM modulo 16384,
 * with hash tags), checked against what redis-server 7.0's CLUSTER KEYSLOT answered for the same
 * keys, and the seed list, whose errors are refused before anything is connected. The client's
 * behaviour against a real cluster is tests/integration/test_rcluster.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "rcluster_int.h"
#include "wxguard/err.h"

static unsigned slot_of(const char *key)
{
    return wxg__rcluster_slot(key, strlen(key));
}

static void slots_match_what_redis_computes(void **state)
{
    (void)state;
    /* Each value as CLUSTER KEYSLOT of redis-server 7.0.15 gave it. */
    static const struct {
        const char *key;
        unsigned slot;
    } known[] = {
        {"123456789", 12739}, /* CRC16-XMODEM("123456789") = 0x31C3 */
        {"", 0},
        {"a", 15495},
        {"bar", 5061},
        {"wxg:{s3ff}:r:abc", 10416},
        {"}{", 12793},
        {"foo{", 7673},
        {"{}", 15257},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (slot_of(known[i].key) != known[i].slot)
            fail_msg("slot of \"%s\": %u, want %u", known[i].key, slot_of(known[i].key),
                     known[i].slot);
    }
}

static void a_hash_tag_puts_keys_in_one_slot(void **state)
{
    (void)state;
    assert_int_equal(slot_of("{user1000}.following"), 3443);
    assert_int_equal(slot_of("{user1000}.followers"), 3443);
    /* Only the first tag counts. */
    assert_int_equal(slot_of("foo{bar}{zap}"), slot_of("bar"));
    assert_int_equal(slot_of("wxg:{s3ff}:d:1:2"), slot_of("s3ff"));
}

static void an_empty_or_unclosed_tag_hashes_the_whole_key(void **state)
{
    (void)state;
    /* "{}" is empty: the whole key is hashed, not "bar". */
    assert_int_equal(slot_of("foo{}{bar}"), 8363);
    assert_int_not_equal(slot_of("foo{}{bar}"), slot_of("bar"));
    /* The tag runs from the first '{' to the first '}' after it: "{bar". */
    assert_int_equal(slot_of("foo{{bar}}zap"), 4015);
    assert_int_equal(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    /* An opening brace without a closing one. */
    assert_int_equal(slot_of("foo{"), 7673);
}

static void slots_are_binary_safe_and_in_range(void **state)
{
    (void)state;
    const char k1[] = {'a', '\0', 'b'}, k2[] = {'a', '\0', 'c'};
    unsigned s1 = wxg__rcluster_slot(k1, sizeof k1), s2 = wxg__rcluster_slot(k2, sizeof k2);
    assert_int_not_equal(s1, s2);
    assert_int_not_equal(s1, slot_of("a"));
    unsigned seen[WXG__RC_SLOTS / 8] = {0};
    size_t distinct = 0;
    for (int i = 0; i < 100000; i++) {
        char key[32];
        int n = snprintf(key, sizeof key, "key:%d", i);
        unsigned s = wxg__rcluster_slot(key, (size_t)n);
        assert_true(s < WXG__RC_SLOTS);
        if (!(seen[s / 32] & (1u << (s % 32)))) {
            seen[s / 32] |= 1u << (s % 32);
            distinct++;
        }
    }
    /* 100,000 keys reach almost every one of the 16384 slots (CRC16 of such regular keys
     * reaches 16152 of them). */
    if (distinct <= 16000)
        fail_msg("%zu distinct slots", distinct);
}

/* A seed list that wxg__rcluster_new refuses with WXG_ECONFIG before connecting anywhere. */
static void refused(const char *seeds)
{
    wxg__rcluster_conf_t conf = {.seeds = seeds, .connect_timeout_ms = 200};
    char err[256] = "";
    int rc = 0;
    wxg__rcluster_t *c = wxg__rcluster_new(&conf, &rc, err, sizeof err);
    if (c || rc != WXG_ECONFIG)
        fail_msg("seed list \"%s\" was not refused (rc %d: %s)", seeds ? seeds : "(null)", rc, err);
    assert_non_null(strstr(err, "seed list"));
}

static void bad_seed_lists_are_refused_before_connecting(void **state)
{
    (void)state;
    refused(NULL);
    refused("");
    refused("127.0.0.1");       /* no port */
    refused("127.0.0.1:");      /* empty port */
    refused(":6379");           /* no host */
    refused("127.0.0.1:0");     /* port out of range */
    refused("127.0.0.1:65536"); /* port out of range */
    refused("127.0.0.1:63x9");  /* not a number */
    refused("::1:6379");        /* IPv6 needs brackets */
    refused("[::1]6379");       /* no ':' after the bracket */
    refused("[::1:6379");       /* unclosed bracket */
    refused("[]:6379");         /* empty address */
    refused("a:1,,b:2");        /* an empty entry */
    refused("a:1,");            /* a trailing comma */
    refused("my host:6379");    /* a space in the name */
}

static void good_seed_lists_reach_the_connect_step(void **state)
{
    (void)state;
    /* Valid lists with nothing listening: the parse passes and the connect fails. Port 1 on
     * loopback refuses at once. */
    const char *ok[] = {"127.0.0.1:1", " 127.0.0.1:1 , [::1]:1 ", "localhost:1,127.0.0.1:1"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        wxg__rcluster_conf_t conf = {.seeds = ok[i], .connect_timeout_ms = 500};
        char err[512] = "";
        int rc = 0;
        wxg__rcluster_t *c = wxg__rcluster_new(&conf, &rc, err, sizeof err);
        assert_null(c);
        if (rc != WXG_ECONN)
            fail_msg("\"%s\": rc %d (%s), want WXG_ECONN", ok[i], rc, err);
        assert_non_null(strstr(err, "slot map"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slots_match_what_redis_computes),
        cmocka_unit_test(a_hash_tag_puts_keys_in_one_slot),
        cmocka_unit_test(an_empty_or_unclosed_tag_hashes_the_whole_key),
        cmocka_unit_test(slots_are_binary_safe_and_in_range),
        cmocka_unit_test(bad_seed_lists_are_refused_before_connecting),
        cmocka_unit_test(good_seed_lists_reach_the_connect_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
