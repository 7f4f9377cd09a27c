/* The parts of lib/rconn.c that need no server: the reconnect backoff (doubling, capped,
 * jittered within its bounds, reset by a success), the classification of error replies, and
 * connection failures that happen before any server is involved (a name that does not
 * resolve, a Unix path that is too long, nothing listening). The rest runs against real
 * servers in tests/integration/test_rconn.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "rconn_int.h"
#include "wxguard/err.h"

static void backoff_doubles_up_to_its_cap_with_jitter_and_resets(void **state)
{
    (void)state;
    wxg__rbackoff_t b;
    wxg__rbackoff_init(&b, 50, 400);
    assert_int_equal(wxg__rbackoff_wait(&b, 1000), 0);
    int64_t steps[] = {50, 100, 200, 400, 400, 400};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        wxg__rbackoff_failed(&b, 1000);
        int64_t wait = wxg__rbackoff_wait(&b, 1000);
        /* Between half and all of the step. */
        assert_true(wait >= steps[i] / 2 && wait <= steps[i]);
        assert_int_equal(wxg__rbackoff_wait(&b, 1000 + steps[i]), 0);
    }
    wxg__rbackoff_reset(&b);
    assert_int_equal(wxg__rbackoff_wait(&b, 1000), 0);
    wxg__rbackoff_failed(&b, 1000);
    assert_true(wxg__rbackoff_wait(&b, 1000) <= 50);
}

static void jitter_spreads_the_waits(void **state)
{
    (void)state;
    wxg__rbackoff_t b;
    wxg__rbackoff_init(&b, 1000, 1000);
    int seen_low = 0, seen_high = 0;
    for (int i = 0; i < 200; i++) {
        wxg__rbackoff_failed(&b, 0);
        int64_t w = wxg__rbackoff_wait(&b, 0);
        seen_low |= w < 700;
        seen_high |= w > 800;
    }
    assert_true(seen_low && seen_high);
}

static void refusals_are_classified(void **state)
{
    (void)state;
    const char *auth[] = {"NOAUTH Authentication required.", "WRONGPASS invalid username-password",
                          "NOPERM this user has no permissions"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(wxg__rconn_refusal_code(auth[i], strlen(auth[i])), WXG_EAUTH);
    const char *other = "ERR unknown command";
    assert_int_equal(wxg__rconn_refusal_code(other, strlen(other)), WXG_EREDIS);
    assert_int_equal(wxg__rconn_refusal_code("NOAUTH", 3), WXG_EREDIS); /* a cut "NOA" */
}

static void connect_failures_without_a_server_are_clear(void **state)
{
    (void)state;
    char err[512] = "";
    int rc = 0;
    wxg__rconn_opts_t o = {.host = "name.invalid", .port = 6379, .connect_timeout_ms = 2000};
    assert_null(wxg__rconn_connect(&o, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONN);
    assert_non_null(strstr(err, "cannot resolve the name"));

    char path[200];
    memset(path, 'p', sizeof path - 1);
    path[0] = '/';
    path[sizeof path - 1] = '\0';
    wxg__rconn_opts_t u = {.unix_path = path, .connect_timeout_ms = 100};
    assert_null(wxg__rconn_connect(&u, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONFIG);
    assert_non_null(strstr(err, "too long"));

    wxg__rconn_opts_t none = {
        .unix_path = "/nonexistent/redis.sock", .connect_timeout_ms = 100, .role = "Sentinel"};
    assert_null(wxg__rconn_connect(&none, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONN);
    assert_non_null(strstr(err, "connecting to Sentinel /nonexistent/redis.sock"));
    wxg__rconn_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(backoff_doubles_up_to_its_cap_with_jitter_and_resets),
        cmocka_unit_test(jitter_spreads_the_waits),
        cmocka_unit_test(refusals_are_classified),
        cmocka_unit_test(connect_failures_without_a_server_are_clear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
