/* Security against a private redis-server: an ACL user restricted to the key prefix can run the
 * whole state machine (and nothing outside the prefix); a wrong password fails at start-up with a
 * clear message that never contains the password; keys built from hostile ids (spaces, CR/LF,
 * glob characters, braces, 100 KB, NUL) never leave the prefix. */
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

#define USER     "wxworker"
#define PASSWORD "s3cret-Pass-For-Tests"

typedef struct fixture {
    wxg_test_redis_t redis;
    redisContext *raw;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (wxg_test_redis_start(&f->redis, NULL) != 0)
        fail_msg("cannot start a private redis-server");
    f->raw = gt_redis("127.0.0.1", f->redis.port, NULL);
    gt_acl_user("127.0.0.1", f->redis.port, USER, PASSWORD, "sec:*", NULL);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    redisFree(f->raw);
    wxg_test_redis_stop(&f->redis);
    free(f);
    return 0;
}

static void acl_conf(fixture *f, wxg_guard_conf_t *c, const char *prefix, const char *password)
{
    wxg_guard_conf_init(c);
    c->design = gt_design();
    c->port = f->redis.port;
    c->prefix = prefix;
    c->user = USER;
    c->password = password;
    c->lease_ms = 5000;
}

static void acl_user_restricted_to_the_prefix_runs_every_transition(void **state)
{
    fixture *f = *state;
    wxg_guard_conf_t c;
    acl_conf(f, &c, "sec:", PASSWORD);
    c.wait_replicas = 0;
    c.client_name = "wxguard-acl-test";
    wxg_guard_t *g = gt_open(&c);
    /* The connection named itself (CLIENT SETNAME, allowed by the documented ACL). */
    redisReply *list = redisCommand(f->raw, "CLIENT LIST");
    assert_non_null(list);
    assert_non_null(strstr(list->str, "name=wxguard-acl-test"));
    freeReplyObject(list);
    const char *key = "bot:n:42";
    wxg_guard_claim_t cl, again;
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &cl), 0);
    assert_int_equal(cl.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_renew(g, &cl.ticket), 0);
    assert_int_equal(wxg_guard_plugin_done(g, &cl.ticket, "billing", "1", 1), 0);
    assert_int_equal(wxg_guard_fail(g, &cl.ticket, "boom", 1), 0);
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &again), 0);
    assert_int_equal(again.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(again.n_finished, 1);
    int released = 0;
    assert_int_equal(wxg_guard_release(g, key, strlen(key), &released), 0);
    assert_int_equal(released, 1);
    wxg_guard_claim_clear(&again);
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &again), 0);
    assert_int_equal(wxg_guard_complete(g, &again.ticket, NULL), 0);
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(g, key, strlen(key), NULL, &rec), 0);
    assert_int_equal(rec->state, WXG_GUARD_DONE);
    wxg_guard_record_free(rec);
    wxg_guard_claim_clear(&cl);
    wxg_guard_claim_clear(&again);
    wxg_guard_destroy(g);

    /* The same user cannot use keys outside its pattern: refused at start-up, as fatal. */
    acl_conf(f, &c, "other:", PASSWORD);
    char err[256] = "";
    int rc = 0;
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_EAUTH);
    assert_non_null(strstr(err, "NOPERM"));
}

static void wrong_password_fails_at_startup_without_revealing_it(void **state)
{
    fixture *f = *state;
    const char *wrong = "Wrong-Secret-9f8e7d";
    wxg_guard_conf_t c;
    acl_conf(f, &c, "sec:", wrong);
    char err[512] = "";
    int rc = 0;
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_EAUTH);
    assert_int_equal(wxg_err_class(rc), WXG_CLASS_FATAL);
    assert_non_null(strstr(err, "AUTH"));
    assert_non_null(strstr(err, USER));
    assert_null(strstr(err, wrong));
    assert_null(strstr(err, "9f8e7d"));
    /* Without credentials the default user (no password, allowed) would work, but with a user
     * that does not exist the message names the user and hides the password again. */
    c.user = "nobody";
    c.password = PASSWORD;
    assert_null(wxg_guard_new(&c, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_EAUTH);
    assert_null(strstr(err, PASSWORD));
}

static void hostile_ids_never_leave_the_prefix(void **state)
{
    fixture *f = *state;
    const char *sargv[3] = {"SET", "sentinel", "1"};
    freeReplyObject(gt_cmd(f->raw, 3, sargv));
    wxg_guard_conf_t c;
    acl_conf(f, &c, "sec:", PASSWORD);
    wxg_guard_t *g = gt_open(&c);
    size_t big_len = 100 * 1024;
    char *big = malloc(big_len);
    assert_non_null(big);
    for (size_t i = 0; i < big_len; i++)
        big[i] = "*?[]{} \r\n\0x"[i % 11];
    struct {
        const char *k;
        size_t n;
    } ids[] = {
        {"bot:n:1 2 3", 11},
        {"bot:n:1\r\n*1\r\n$8\r\nFLUSHALL\r\n", 28},
        {"bot:n:*", 7},
        {"bot:n:?[a-z]", 12},
        {"bot:n:{s0}:r:x", 14},
        {"bot:n:\0tail", 11},
        {"\0", 1},
        {big, big_len},
    };
    size_t n = sizeof ids / sizeof ids[0];
    for (size_t i = 0; i < n; i++) {
        wxg_guard_claim_t cl;
        assert_int_equal(wxg_guard_claim(g, ids[i].k, ids[i].n, NULL, &cl), 0);
        assert_int_equal(cl.outcome, WXG_GUARD_CLAIMED);
        assert_int_equal(
            wxg_guard_plugin_done(g, &cl.ticket, "p", ids[i].k, ids[i].n > 256 ? 256 : ids[i].n),
            0);
        if (i % 2) {
            assert_int_equal(wxg_guard_fail(g, &cl.ticket, ids[i].k, 1), 0);
        } else {
            assert_int_equal(wxg_guard_complete(g, &cl.ticket, NULL), 0);
            wxg_guard_claim_t d;
            assert_int_equal(wxg_guard_claim(g, ids[i].k, ids[i].n, NULL, &d), 0);
            assert_int_equal(d.outcome, WXG_GUARD_DUPLICATE);
        }
        wxg_guard_claim_clear(&cl);
    }
    /* Keys that differ only after a NUL byte are different messages. */
    wxg_guard_claim_t a;
    assert_int_equal(wxg_guard_claim(g, "bot:n:", 6, NULL, &a), 0);
    assert_int_equal(a.outcome, WXG_GUARD_CLAIMED);
    wxg_guard_claim_clear(&a);

    char **keys = NULL;
    size_t nk = gt_scan(f->raw, "*", &keys);
    size_t prefixed = 0;
    int sentinel = 0;
    for (size_t i = 0; i < nk; i++) {
        if (strcmp(keys[i], "sentinel") == 0) {
            sentinel = 1;
            continue;
        }
        assert_memory_equal(keys[i], "sec:", 4);
        assert_true(strlen(keys[i]) < 80);
        assert_null(strpbrk(keys[i], " \r\n*?["));
        prefixed++;
    }
    assert_true(sentinel);                  /* the FLUSHALL in an id never ran */
    assert_true(prefixed >= 1 + n / 2 + 2); /* layout + FAILED records + buckets + "bot:n:" */
    gt_free_keys(keys);
    free(big);
    wxg_guard_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(acl_user_restricted_to_the_prefix_runs_every_transition,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(wrong_password_fails_at_startup_without_revealing_it, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(hostile_ids_never_leave_the_prefix, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
