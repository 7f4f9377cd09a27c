/* Unit tests for lib/plugins/pgsql.c and the shared PostgreSQL helpers (lib/plugins/pg.c),
 * without a database: configuration is validated at init with the key named, table names are
 * plain identifiers, an unreachable database stops start-up (connect.at.start) or makes a
 * message RETRY (connection opened lazily), and failures are classified by SQLSTATE. Writes
 * against a real PostgreSQL are in tests/integration/test_plugins_pg.c. */
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

static int chain(const char *spec, const wxg_plugin_kv_t *kv, size_t n, wxg_plugin_chain_t **out,
                 char *err, size_t errsz)
{
    err[0] = '\0';
    return wxg_plugin_chain_new(spec, kv, n, out, err, errsz);
}

static void test_table_names_must_be_plain_identifiers(void **st)
{
    (void)st;
    assert_true(wxg__pg_ident_ok("wxg_messages"));
    assert_true(wxg__pg_ident_ok("_t1"));
    assert_false(wxg__pg_ident_ok(""));
    assert_false(wxg__pg_ident_ok("1abc"));
    assert_false(wxg__pg_ident_ok("Messages"));
    assert_false(wxg__pg_ident_ok("t; DROP TABLE x"));
    assert_false(wxg__pg_ident_ok("public.t"));
    char long_name[80];
    memset(long_name, 'a', 64);
    long_name[64] = '\0';
    assert_false(wxg__pg_ident_ok(long_name));
    long_name[63] = '\0';
    assert_true(wxg__pg_ident_ok(long_name));
}

static void test_config_errors_name_the_key(void **st)
{
    (void)st;
    static const struct {
        wxg_plugin_kv_t kv[3];
        size_t n;
        const char *key;
    } cases[] = {
        {{{"plugin.pgsql.table", "t"}}, 1, "plugin.pgsql.dsn"},
        {{{"plugin.pgsql.dsn", "host=127.0.0.1 port"}, {"plugin.pgsql.connect.at.start", "no"}},
         2,
         "plugin.pgsql.dsn"},
        {{{"plugin.pgsql.dsn", "postgresql://x@127.0.0.1/db"}, {"plugin.pgsql.table", "Bad-Name"}},
         2,
         "plugin.pgsql.table"},
        {{{"plugin.pgsql.dsn", "postgresql://x@127.0.0.1/db"}, {"plugin.pgsql.tabel", "t"}},
         2,
         "plugin.pgsql.tabel"},
        {{{"plugin.pgsql.dsn", "postgresql://x@127.0.0.1/db"},
          {"plugin.pgsql.statement.timeout.ms", "-1"}},
         2,
         "plugin.pgsql.statement.timeout.ms"},
        {{{"plugin.pgsql.dsn", "postgresql://x@127.0.0.1/db"},
          {"plugin.pgsql.connect.at.start", "maybe"}},
         2,
         "plugin.pgsql.connect.at.start"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512];
        wxg_plugin_chain_t *c = NULL;
        assert_int_equal(chain("pgsql", cases[i].kv, cases[i].n, &c, err, sizeof err), WXG_ECONFIG);
        assert_null(c);
        if (!strstr(err, cases[i].key))
            fail_msg("case %zu: '%s' does not name %s", i, err, cases[i].key);
    }
}

/* Nothing listens on the port: with connect.at.start the chain refuses to start (ECONN, the
 * reason names the dsn key); without it the chain starts and a message is a RETRY whose reason
 * says the connection failed. */
static void test_unreachable_database_stops_start_or_retries(void **st)
{
    (void)st;
    int port = wxg_test_free_port();
    assert_true(port > 0);
    char dsn[128];
    snprintf(dsn, sizeof dsn, "postgresql://nobody@127.0.0.1:%d/none", port);
    char err[512];
    wxg_plugin_chain_t *c = NULL;
    wxg_plugin_kv_t at_start[] = {{"plugin.pgsql.dsn", dsn},
                                  {"plugin.pgsql.connect.timeout.s", "2"}};
    assert_int_equal(chain("pgsql", at_start, 2, &c, err, sizeof err), WXG_ECONN);
    assert_non_null(strstr(err, "plugin.pgsql.dsn"));
    assert_non_null(strstr(err, "cannot connect"));

    wxg_plugin_kv_t lazy[] = {{"plugin.pgsql.dsn", dsn},
                              {"plugin.pgsql.connect.at.start", "false"},
                              {"plugin.pgsql.connect.timeout.s", "2"}};
    assert_int_equal(chain("pgsql", lazy, 3, &c, err, sizeof err), 0);
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
    call.fence = 1;
    call.attempt = 1;
    assert_int_equal(wxg_plugin_chain_handle(c, thr, 0, &v, &call), WXG_PLUGIN_RETRY);
    assert_non_null(strstr(call.reason, "cannot connect"));
    /* A fencing token of 0 is never handed out by the guard: refused outright. */
    wxg_plugin_call_init(&call);
    call.fence = 0;
    assert_int_equal(wxg_plugin_chain_handle(c, thr, 0, &v, &call), WXG_PLUGIN_FAIL);
    wxg_plugin_thread_destroy(thr);
    wxg_plugin_chain_destroy(c);
}

static void test_no_connection_is_classified_as_retry_with_reconnect(void **st)
{
    (void)st;
    int reconnect = 0, recreate = 1;
    char why[128];
    assert_int_equal(wxg__pg_classify(NULL, NULL, &reconnect, &recreate, why, sizeof why),
                     WXG_PLUGIN_RETRY);
    assert_int_equal(reconnect, 1);
    assert_int_equal(recreate, 0);
    assert_non_null(strstr(why, "connection lost"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_names_must_be_plain_identifiers),
        cmocka_unit_test(test_config_errors_name_the_key),
        cmocka_unit_test(test_unreachable_database_stops_start_or_retries),
        cmocka_unit_test(test_no_connection_is_classified_as_retry_with_reconnect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
