/* Unit tests for lib/plugins/billing.c without a database: prices per message type (default,
 * listed types, free types), configuration errors that name the key, and the refusal of one
 * table for both ledger and balances. Charging against a real PostgreSQL, also under
 * concurrent duplicates and stale writers, is in tests/integration/test_plugins_pg.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "plugin_int.h"
#include "wxguard/err.h"

static int init(const char *const *kv, size_t n, void **state, char *err, size_t errsz)
{
    const char *keys[16], *vals[16];
    size_t m = 0;
    keys[m] = "dsn";
    vals[m++] = "postgresql://x@127.0.0.1/db";
    keys[m] = "connect.at.start";
    vals[m++] = "false";
    for (size_t i = 0; i < n; i++) {
        keys[m] = kv[2 * i];
        vals[m++] = kv[2 * i + 1];
    }
    wxg_plugin_conf_t conf = {.abi_version = WXG_PLUGIN_ABI_VERSION,
                              .plugin_name = "billing",
                              .count = m,
                              .keys = keys,
                              .values = vals};
    err[0] = '\0';
    *state = NULL;
    return wxg__plugin_billing()->init(&conf, state, err, errsz);
}

static void test_prices_by_type_with_default_and_free_types(void **st)
{
    (void)st;
    const char *kv[] = {"price.default", "5", "prices",
                        " 60001 = 2, AddMsg:1=3 ,event:subscribe=0, 60001=7"};
    void *s = NULL;
    char err[256];
    assert_int_equal(init(kv, 2, &s, err, sizeof err), 0);
    assert_int_equal(wxg__billing_price(s, "60001"), 7); /* the last listing wins */
    assert_int_equal(wxg__billing_price(s, "AddMsg:1"), 3);
    assert_int_equal(wxg__billing_price(s, "event:subscribe"), 0);
    assert_int_equal(wxg__billing_price(s, "text"), 5);
    assert_int_equal(wxg__billing_price(s, NULL), 5);
    wxg__plugin_billing()->destroy(s);

    assert_int_equal(init(NULL, 0, &s, err, sizeof err), 0);
    assert_int_equal(wxg__billing_price(s, "text"), 1); /* price.default's default */
    wxg__plugin_billing()->destroy(s);
}

static void test_config_errors_name_the_key(void **st)
{
    (void)st;
    static const struct {
        const char *kv[4];
        size_t n;
        const char *key;
    } cases[] = {
        {{"prices", "text"}, 1, "plugin.billing.prices"},
        {{"prices", "text=abc"}, 1, "plugin.billing.prices"},
        {{"prices", "=3"}, 1, "plugin.billing.prices"},
        {{"prices", "text=-1"}, 1, "plugin.billing.prices"},
        {{"price.default", "-2"}, 1, "plugin.billing.price.default"},
        {{"charges.table", "x y"}, 1, "plugin.billing.charges.table"},
        {{"charges.table", "t", "balances.table", "t"}, 2, "plugin.billing.balances.table"},
        {{"price", "1"}, 1, "plugin.billing.price"},
        {{"skip.self", "perhaps"}, 1, "plugin.billing.skip.self"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *s = NULL;
        char err[256];
        assert_int_equal(init(cases[i].kv, cases[i].n, &s, err, sizeof err), WXG_ECONFIG);
        assert_null(s);
        if (!strstr(err, cases[i].key))
            fail_msg("case %zu: '%s' does not name %s", i, err, cases[i].key);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prices_by_type_with_default_and_free_types),
        cmocka_unit_test(test_config_errors_name_the_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
