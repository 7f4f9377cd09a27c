/* Test support: checks on idempotency keys (see testkey.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "testkey.h"
#include "wxguard/key.h"

void wxg_test_assert_key_safe(const char *k, char *kind)
{
    for (const char *p = k; *p; p++) {
        unsigned char c = (unsigned char)*p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '@' || c == '.' || c == '-' || c == ':' || c == '~';
        if (!ok)
            fail_msg("key '%s' holds the unsafe byte 0x%02x", k, c);
    }
    assert_int_equal(wxg_key_check(k, kind), 0);
}
