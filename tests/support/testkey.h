/*
 * Test support: checks on idempotency keys shared by the key and message tests.
 *
 * Thread-safe (no state), but the assertions fail the current cmocka test, so call them from the
 * test's own thread.
 */
#ifndef WXG_TESTKEY_H
#define WXG_TESTKEY_H

/* Fails the current test unless every byte of k is one that cannot matter to Redis patterns, logs
 * or the hash tag ([A-Za-z0-9_@.~:-]) and wxg_key_check() accepts k. *kind (may be NULL) gets the
 * key's kind as wxg_key_check() reports it. */
void wxg_test_assert_key_safe(const char *k, char *kind);

#endif /* WXG_TESTKEY_H */
