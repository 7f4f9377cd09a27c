/*
 * DESIGN: test support for PostgreSQL (see testpg.h). Thin checked wrappers around libpq for
 * test code: every failure fails the current cmocka test with the server's message.
 */
#include "testpg.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testenv.h"

const char *wxg_test_pg_dsn(void)
{
    return wxg_test_env_required("WXG_TEST_PG_DSN");
}

PGconn *wxg_test_pg_connect(void)
{
    PGconn *c = PQconnectdb(wxg_test_pg_dsn());
    if (!c || PQstatus(c) != CONNECTION_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", c ? PQerrorMessage(c) : "out of memory");
        PQfinish(c);
        fail_msg("cannot connect to the test PostgreSQL: %s", why);
    }
    return c;
}

char *wxg_test_pg_name(const char *tag)
{
    static unsigned counter;
    char buf[64];
    snprintf(buf, sizeof buf, "%.20s_%ld_%" PRId64 "_%u", tag, (long)getpid(),
             wxg_test_now_ms() % 1000000000, counter++);
    char *s = strdup(buf);
    assert_non_null(s);
    return s;
}

void wxg_test_pg_exec(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", PQresultErrorMessage(r));
        PQclear(r);
        fail_msg("SQL failed: %s: %s", sql, why);
    }
    PQclear(r);
}

int64_t wxg_test_pg_int(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 || PQnfields(r) != 1 ||
        PQgetisnull(r, 0, 0)) {
        char why[512];
        snprintf(why, sizeof why, "%s (status %s, %d rows)", PQresultErrorMessage(r),
                 PQresStatus(PQresultStatus(r)), PQntuples(r));
        PQclear(r);
        fail_msg("query did not return one integer: %s: %s", sql, why);
    }
    char *end = NULL;
    long long v = strtoll(PQgetvalue(r, 0, 0), &end, 10);
    int ok = end && *end == '\0';
    PQclear(r);
    if (!ok)
        fail_msg("query did not return an integer: %s", sql);
    return (int64_t)v;
}
