/* Unit tests for lib/err.c: every code has a name, a message and a class, and lookups of
 * unknown codes stay safe. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "err_int.h"
#include "wxguard/err.h"

static void every_code_has_a_distinct_name_and_a_message(void **state)
{
    (void)state;
    static const int codes[] = {
#define X_(name, value, cls, msg) value,
        WXG_ERRNO_MAP(X_)
#undef X_
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        assert_true(codes[i] < 0);
        assert_string_not_equal(wxg_err_name(codes[i]), "EUNKNOWN");
        assert_string_not_equal(wxg_strerror(codes[i]), "unknown error");
        assert_int_not_equal(wxg_err_class(codes[i]), WXG_CLASS_NONE);
        for (size_t j = i + 1; j < n; j++) {
            assert_int_not_equal(codes[i], codes[j]);
            assert_string_not_equal(wxg_err_name(codes[i]), wxg_err_name(codes[j]));
        }
    }
}

static void names_and_classes_match_the_table(void **state)
{
    (void)state;
    assert_string_equal(wxg_err_name(WXG_ETIMEDOUT), "ETIMEDOUT");
    assert_string_equal(wxg_strerror(WXG_ENOMEM), "out of memory");
    assert_int_equal(wxg_err_class(WXG_ETIMEDOUT), WXG_CLASS_RETRIABLE);
    assert_int_equal(wxg_err_class(WXG_EPARSE), WXG_CLASS_POISON);
    assert_int_equal(wxg_err_class(WXG_ECONFIG), WXG_CLASS_FATAL);
    assert_string_equal(wxg_err_class_name(WXG_CLASS_POISON), "poison");
}

static void success_and_unknown_codes_are_safe(void **state)
{
    (void)state;
    assert_string_equal(wxg_err_name(0), "OK");
    assert_string_equal(wxg_strerror(0), "success");
    assert_int_equal(wxg_err_class(0), WXG_CLASS_NONE);
    assert_string_equal(wxg_err_name(-9999), "EUNKNOWN");
    assert_string_equal(wxg_strerror(12345), "unknown error");
    assert_int_equal(wxg_err_class(-9999), WXG_CLASS_FATAL);
}

static void errf_formats_truncates_and_ignores_a_missing_buffer(void **state)
{
    (void)state;
    char buf[8] = "unset";
    wxg__errf(buf, sizeof buf, "key %s: %d", "a.b", 42);
    assert_string_equal(buf, "key a.b");
    wxg__errf(buf, sizeof buf, "%d", 7);
    assert_string_equal(buf, "7");
    /* A size of 0 leaves the buffer alone; a NULL buffer is allowed. */
    wxg__errf(buf, 0, "ignored");
    assert_string_equal(buf, "7");
    wxg__errf(NULL, 16, "ignored");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_has_a_distinct_name_and_a_message),
        cmocka_unit_test(names_and_classes_match_the_table),
        cmocka_unit_test(success_and_unknown_codes_are_safe),
        cmocka_unit_test(errf_formats_truncates_and_ignores_a_missing_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
