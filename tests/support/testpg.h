/*
 * Test support for the PostgreSQL cluster started by the "services" fixture
 * (scripts/services.sh), published as WXG_TEST_PG_DSN (a libpq connection URI) in the env file
 * that testenv.h reads.
 *
 * Tests share one cluster and may run at the same time: give every table a name of its own
 * with wxg_test_pg_name(). Not thread-safe where it fails a test (cmocka's failure path is not):
 * call wxg_test_pg_* from the test's main thread unless a comment says otherwise.
 */
#ifndef WXG_TESTPG_H
#define WXG_TESTPG_H

#include <libpq-fe.h>
#include <stdint.h>

/* The connection string of the shared cluster; fails the current test when it is not set. */
const char *wxg_test_pg_dsn(void);

/* A new connection to the shared cluster; fails the test when it cannot connect. */
PGconn *wxg_test_pg_connect(void);

/* A table name no other test, process or run uses: "<tag>_<pid>_<ms>_<n>", lower case, at most
 * 63 bytes. `tag` must be made of [a-z0-9_]. The caller frees the string. */
char *wxg_test_pg_name(const char *tag);

/* Runs `sql` (no parameters) and fails the test unless it succeeded. */
void wxg_test_pg_exec(PGconn *c, const char *sql);

/* Runs a query that returns one row of one integer column (e.g. SELECT count(*)) and returns
 * it; fails the test on an error, on another shape, or on NULL. */
int64_t wxg_test_pg_int(PGconn *c, const char *sql);

#endif /* WXG_TESTPG_H */
