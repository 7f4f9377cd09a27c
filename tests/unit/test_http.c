/* Unit tests for lib/plugins/http.c without a downstream server: how HTTP statuses map to
 * OK/RETRY/FAIL, configuration errors that name the key, and a refused connection being a
 * RETRY. Requests against a real in-test HTTP server (headers, bodies, timeouts) are in
 * tests/integration/test_plugin_http.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "plugin_int.h"
#include "testenv.h"
#include "wxguard/err.h"
#include "wxguard/plugin_registry.h"

static void test_status_codes_map_to_ok_retry_fail(void **st)
{
    (void)st;
    static const struct {
        long status;
        wxg_plugin_result_t want;
    } cases[] = {{200, WXG_PLUGIN_OK},    {201, WXG_PLUGIN_OK},    {204, WXG_PLUGIN_OK},
                 {299, WXG_PLUGIN_OK},    {500, WXG_PLUGIN_RETRY}, {502, WXG_PLUGIN_RETRY},
                 {503, WXG_PLUGIN_RETRY}, {599, WXG_PLUGIN_RETRY}, {408, WXG_PLUGIN_RETRY},
                 {429, WXG_PLUGIN_RETRY}, {400, WXG_PLUGIN_FAIL},  {401, WXG_PLUGIN_FAIL},
                 {404, WXG_PLUGIN_FAIL},  {409, WXG_PLUGIN_FAIL},  {422, WXG_PLUGIN_FAIL},
                 {301, WXG_PLUGIN_FAIL},  {302, WXG_PLUGIN_FAIL},  {100, WXG_PLUGIN_FAIL},
                 {0, WXG_PLUGIN_FAIL},    {600, WXG_PLUGIN_FAIL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (wxg__http_classify(cases[i].status) != cases[i].want)
            fail_msg("status %ld: got %d, want %d", cases[i].status,
                     (int)wxg__http_classify(cases[i].status), (int)cases[i].want);
    }
}

static void test_config_errors_name_the_key(void **st)
{
    (void)st;
    static const struct {
        wxg_plugin_kv_t kv[2];
        size_t n;
        const char *key;
    } cases[] = {
        {{{"plugin.http.timeout.ms", "100"}}, 1, "plugin.http.url"},
        {{{"plugin.http.url", "ftp://127.0.0.1/x"}}, 1, "plugin.http.url"},
        {{{"plugin.http.url", "http://"}}, 1, "plugin.http.url"},
        {{{"plugin.http.url", "http://127.0.0.1/x"}, {"plugin.http.timeout.ms", "0"}},
         2,
         "plugin.http.timeout.ms"},
        {{{"plugin.http.url", "http://127.0.0.1/x"}, {"plugin.http.header", "a"}},
         2,
         "plugin.http.header"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "";
        wxg_plugin_chain_t *c = NULL;
        assert_int_equal(wxg_plugin_chain_new("http", cases[i].kv, cases[i].n, &c, err, sizeof err),
                         WXG_ECONFIG);
        if (!strstr(err, cases[i].key))
            fail_msg("case %zu: '%s' does not name %s", i, err, cases[i].key);
    }
}

static void test_refused_connection_is_a_retry(void **st)
{
    (void)st;
    int port = wxg_test_free_port();
    assert_true(port > 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/hook", port);
    wxg_plugin_kv_t kv[] = {{"plugin.http.url", url}};
    char err[512];
    wxg_plugin_chain_t *c = NULL;
    assert_int_equal(wxg_plugin_chain_new("http", kv, 1, &c, err, sizeof err), 0);
    wxg_plugin_thread_t *thr = NULL;
    assert_int_equal(wxg_plugin_thread_new(c, &thr, err, sizeof err), 0);
    wxg_msg_view_t v = {.account = "a",
                        .conversation = "c",
                        .sender = "s",
                        .type = "text",
                        .content = "x",
                        .content_len = 1,
                        .key = "a:n:1"};
    wxg_plugin_call_t call;
    wxg_plugin_call_init(&call);
    call.fence = 3;
    call.attempt = 1;
    assert_int_equal(wxg_plugin_chain_handle(c, thr, 0, &v, &call), WXG_PLUGIN_RETRY);
    assert_non_null(strstr(call.reason, "POST failed"));
    wxg_plugin_thread_destroy(thr);
    wxg_plugin_chain_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_codes_map_to_ok_retry_fail),
        cmocka_unit_test(test_config_errors_name_the_key),
        cmocka_unit_test(test_refused_connection_is_a_retry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
