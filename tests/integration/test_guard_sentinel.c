/* The guard under Redis Sentinel, with real servers: a primary, its replica and one Sentinel,
 * all private to this test. The guard finds the primary through the Sentinels (skipping one
 * that is down), follows a failover to the promoted replica without losing a DONE marker or an
 * in-flight claim that WAIT had replicated, and leaves a server that turned replica at its
 * first READONLY answer. It runs as an ACL user with only the documented commands. A Sentinel
 * that refuses (no or a wrong password) or names a replica is a clear error. Bad Sentinel
 * settings and an unknown primary name are clear errors. */
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

#define MASTER   "wxgmain"
#define USER     "wxworker"
#define PASSWORD "s3ntinel-Pass-For-Tests"

typedef struct fixture {
    wxg_test_redis_t primary, replica, sentinel;
    char prefix[64], sentinels[96];
    wxg_guard_conf_t conf;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (wxg_test_redis_start(&f->primary, NULL) != 0 ||
        wxg_test_redis_start_replica(&f->replica, f->primary.port) != 0)
        fail_msg("cannot start a primary and its replica");
    if (wxg_test_redis_wait_link(&f->replica, 20000) != 0 ||
        wxg_test_sentinel_start(&f->sentinel, MASTER, f->primary.port, NULL) != 0)
        fail_msg("cannot start a Sentinel");
    /* A Sentinel that is down comes first: the guard must go on to the next. */
    snprintf(f->sentinels, sizeof f->sentinels, "127.0.0.1:%d, 127.0.0.1:%d", wxg_test_free_port(),
             f->sentinel.port);
    gt_conf(&f->conf, "127.0.0.1", 1, "sentinel", f->prefix, sizeof f->prefix);
    f->conf.sentinels = f->sentinels;
    f->conf.sentinel_master = MASTER;
    /* The guard runs as the ACL user docs/guard.md §7 describes for Sentinel mode, defined on
     * both servers (ACL rules are not replicated). */
    char keys[80];
    snprintf(keys, sizeof keys, "%s*", f->prefix);
    gt_acl_user("127.0.0.1", f->primary.port, USER, PASSWORD, keys, "+role");
    gt_acl_user("127.0.0.1", f->replica.port, USER, PASSWORD, keys, "+role");
    f->conf.user = USER;
    f->conf.password = PASSWORD;
    f->conf.connect_timeout_ms = 500;
    f->conf.command_timeout_ms = 1000;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_test_redis_stop(&f->sentinel);
    wxg_test_redis_stop(&f->replica);
    wxg_test_redis_stop(&f->primary);
    free(f);
    return 0;
}

/* Retries a call for at most 20 s (a failover may take that long to reach the guard). */
#define RETRY(rc, call)                            \
    do {                                           \
        int fails_ = 0;                            \
        GT_RETRY(rc, fails_, 20000, call);         \
        if (fails_ > 0)                            \
            print_message("%d retries\n", fails_); \
    } while (0)

static void the_guard_finds_the_primary_through_a_sentinel_and_follows_a_failover(void **state)
{
    fixture *f = *state;
    /* Every write is on the replica before it is acknowledged, so the failover loses none. */
    f->conf.wait_replicas = 1;
    f->conf.wait_timeout_ms = 2000;
    wxg_guard_t *g = gt_open(&f->conf);
    wxg_guard_stats_t st;
    wxg_guard_get_stats(g, &st);
    assert_int_equal(st.sentinel_lookups, 1);

    const char *done = "bot:n:1", *inflight = "bot:n:2";
    wxg_guard_claim_t c1, c2, x;
    assert_int_equal(wxg_guard_claim(g, done, strlen(done), NULL, &c1), 0);
    assert_int_equal(c1.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(g, &c1.ticket, NULL), 0);
    assert_int_equal(wxg_guard_claim(g, inflight, strlen(inflight), NULL, &c2), 0);
    assert_int_equal(c2.outcome, WXG_GUARD_CLAIMED);

    /* Fail over, and wait until the old primary has been turned into a replica too. */
    assert_int_equal(
        wxg_test_sentinel_failover(&f->sentinel, MASTER, f->replica.port, f->primary.port, 40000),
        0);

    /* The finished message is still a duplicate, and the claim in flight can still complete:
     * both were replicated before they were acknowledged. */
    int rc;
    RETRY(rc, wxg_guard_claim(g, done, strlen(done), NULL, &x));
    assert_int_equal(rc, 0);
    assert_int_equal(x.outcome, WXG_GUARD_DUPLICATE);
    int already = -1;
    RETRY(rc, wxg_guard_complete(g, &c2.ticket, &already));
    assert_int_equal(rc, 0);
    assert_int_equal(already, 0);
    assert_int_equal(wxg_guard_claim(g, inflight, strlen(inflight), NULL, &x), 0);
    assert_int_equal(x.outcome, WXG_GUARD_DUPLICATE);

    wxg_guard_get_stats(g, &st);
    assert_true(st.sentinel_lookups >= 2);
    assert_true(st.connects >= 2);
    /* The markers are on the new primary, where the guard now writes. */
    redisContext *np = gt_redis("127.0.0.1", f->replica.port, NULL);
    char pattern[96];
    snprintf(pattern, sizeof pattern, "%s*", f->prefix);
    assert_true(gt_count(np, pattern) > 0);
    redisFree(np);
    wxg_guard_claim_clear(&c1);
    wxg_guard_claim_clear(&c2);
    wxg_guard_destroy(g);
}

static void a_server_turned_replica_is_left_at_its_first_readonly_answer(void **state)
{
    fixture *f = *state;
    /* Without Sentinel: the guard talks to the primary's address directly, and that server is
     * then made a replica of another one (a demotion that keeps its clients connected). */
    wxg_test_redis_t other;
    assert_int_equal(wxg_test_redis_start(&other, NULL), 0);
    wxg_guard_conf_t conf;
    char prefix[64];
    gt_conf(&conf, "127.0.0.1", f->primary.port, "demoted", prefix, sizeof prefix);
    conf.command_timeout_ms = 1000;
    wxg_guard_t *g = gt_open(&conf);
    wxg_guard_claim_t c;
    const char *key = "bot:n:3";
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &c), 0);

    redisContext *p = gt_redis("127.0.0.1", f->primary.port, NULL);
    char port[16];
    snprintf(port, sizeof port, "%d", other.port);
    const char *demote[3] = {"REPLICAOF", "127.0.0.1", port};
    freeReplyObject(gt_cmd(p, 3, demote));
    wxg_guard_stats_t s0, s1;
    wxg_guard_get_stats(g, &s0);
    int already = -1;
    assert_int_equal(wxg_guard_complete(g, &c.ticket, &already), WXG_EREDIS);
    assert_non_null(strstr(wxg_guard_last_error(g), "READONLY"));
    wxg_guard_get_stats(g, &s1);
    assert_int_equal(s1.demotions, s0.demotions + 1);

    /* Promoted again: the next call connects anew and works. */
    const char *promote[3] = {"REPLICAOF", "NO", "ONE"};
    freeReplyObject(gt_cmd(p, 3, promote));
    redisFree(p);
    wxg_guard_claim_t again;
    int rc;
    RETRY(rc, wxg_guard_claim(g, "bot:n:4", 7, NULL, &again));
    assert_int_equal(rc, 0);
    assert_int_equal(again.outcome, WXG_GUARD_CLAIMED);
    wxg_guard_get_stats(g, &s1);
    assert_true(s1.connects > s0.connects);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&again);
    wxg_guard_destroy(g);
    wxg_test_redis_stop(&other);
}

static void bad_sentinel_settings_and_an_unknown_primary_are_clear_errors(void **state)
{
    fixture *f = *state;
    static const char *const bad[] = {"nohost",       "127.0.0.1:", ":26379", "127.0.0.1:70000",
                                      "127.0.0.1:1x", "[::1]",      "::1:5",  "a b:1",
                                      "h:1,,h:2",     "h:1,"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wxg_guard_conf_t c = f->conf;
        c.sentinels = bad[i];
        char err[256] = "";
        int rc = 0;
        assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
        assert_int_equal(rc, WXG_ECONFIG);
        assert_non_null(strstr(err, "Sentinel"));
    }
    wxg_guard_conf_t c = f->conf;
    c.sentinel_master = NULL;
    int rc = 0;
    char err[256] = "";
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONFIG);

    c = f->conf;
    c.sentinel_master = "nosuch";
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONN);
    assert_non_null(strstr(err, "knows no primary named 'nosuch'"));

    /* Brackets (the IPv6 form) parse; an address inside them is used as it is. The tests stay
     * on 127.0.0.0/8, so the bracketed address here is an IPv4 one where nothing listens: a
     * connection error, not a configuration one. */
    c = f->conf;
    char bracketed[64];
    snprintf(bracketed, sizeof bracketed, "[127.0.0.1]:%d", wxg_test_free_port());
    c.sentinels = bracketed;
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONN);
    assert_non_null(strstr(err, "connecting to Sentinel 127.0.0.1:"));
}

static void a_sentinel_that_refuses_or_names_a_replica_is_a_clear_error(void **state)
{
    fixture *f = *state;
    /* A Sentinel with a password of its own, watching the replica as if it were a primary. */
    wxg_test_redis_t s;
    assert_int_equal(wxg_test_sentinel_start(&s, "wrong", f->replica.port, "s3nt-Pass"), 0);
    wxg_guard_conf_t c = f->conf;
    char list[64];
    snprintf(list, sizeof list, "127.0.0.1:%d", s.port);
    c.sentinels = list;
    c.sentinel_master = "wrong";
    int rc = 0;
    char err[256] = "";

    /* No Sentinel password: the Sentinel refuses the question. */
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_EAUTH);
    assert_non_null(strstr(err, "refused SENTINEL get-master-addr-by-name: NOAUTH"));

    /* A wrong one: AUTH fails, and the text does not repeat it. */
    c.sentinel_password = "not-the-one";
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_EAUTH);
    assert_non_null(strstr(err, "AUTH as user 'default' failed"));
    assert_null(strstr(err, "not-the-one"));

    /* The right one: the Sentinel answers with the replica's address, which ROLE exposes. */
    c.sentinel_password = "s3nt-Pass";
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONN);
    assert_non_null(strstr(err, "is not a primary"));
    wxg_test_redis_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            the_guard_finds_the_primary_through_a_sentinel_and_follows_a_failover, setup, teardown),
        cmocka_unit_test_setup_teardown(
            a_server_turned_replica_is_left_at_its_first_readonly_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(
            bad_sentinel_settings_and_an_unknown_primary_are_clear_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(a_sentinel_that_refuses_or_names_a_replica_is_a_clear_error,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
