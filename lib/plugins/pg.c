/*
 * DESIGN: PostgreSQL helpers shared by the database plugins (pgsql, billing).
 *
 * Purpose. Both plugins read the same connection settings, open one connection per worker
 * thread the same way, and must agree on which failures are transient (RETRY: the message comes
 * back later) and which are permanent (FAIL: it goes to the dead-letter topic). Keeping that in
 * one place keeps the two plugins' behaviour identical.
 *
 * The plugins also share their per-thread state (wxg__pg_thread_t, with the thread_init and
 * thread_destroy that the descriptors use directly), opening a connection with the tables and
 * prepared statements a plugin describes in a wxg__pg_schema_t, and turning a failed statement
 * into the plugin's answer.
 *
 * Threads. Nothing here has state of its own: a connection belongs to the worker thread that
 * opened it (libpq connections must not be shared between threads without a lock, and wxguard
 * gives each worker its own through the plugin's thread_init), so none of these functions takes
 * a lock.
 *
 * Failure modes. Connecting blocks for at most connect.timeout.s; a statement runs for at most
 * statement.timeout.ms (the server cancels it: SQLSTATE 57014, which counts as transient). A
 * connection that broke (PQstatus is CONNECTION_BAD) is never reused: the caller replaces it on
 * the next message. The classification follows the SQLSTATE classes of the PostgreSQL manual:
 * 08 (connection), 40 (rollback: serialization, deadlock), 53 (resources), 57 (operator
 * intervention: shutdown, cancel), 58 (system error) and 55P03 (lock not available) are
 * transient; anything else, such as 22 (bad data), 23 (a constraint the plugin did not expect)
 * or 42 (syntax, permissions), is permanent.
 */
#include "plugin_int.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int wxg__pg_ident_ok(const char *name)
{
    if (!name || !*name || strlen(name) > 63)
        return 0;
    for (const char *p = name; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || c == '_' || (p != name && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

void wxg__pg_conf_free(wxg__pg_conf_t *pc)
{
    if (!pc)
        return;
    free(pc->conninfo);
    free(pc->password);
    memset(pc, 0, sizeof *pc);
}

int wxg__pg_conf_parse(const wxg_plugin_conf_t *conf, wxg__pg_conf_t *out, char *errstr,
                       size_t errstr_size)
{
    wxg__pg_conf_t pc = {0};
    int rc;
    const char *dsn = wxg_plugin_conf_get(conf, "dsn");
    const char *password = wxg_plugin_conf_get(conf, "password");
    if (!dsn || !*dsn) {
        snprintf(errstr, errstr_size,
                 "plugin.%s.dsn: required (a libpq connection string, e.g. "
                 "postgresql://wxguard@127.0.0.1:5432/wxguard)",
                 conf->plugin_name);
        return WXG_ECONFIG;
    }
    /* Parse now so that a typo stops start-up rather than every message. */
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(dsn, &perr);
    if (!opts) {
        snprintf(errstr, errstr_size, "plugin.%s.dsn: not a valid connection string: %s",
                 conf->plugin_name, perr ? perr : "out of memory");
        PQfreemem(perr);
        return WXG_ECONFIG;
    }
    PQconninfoFree(opts);
    if ((rc = wxg_plugin_conf_get_int64(conf, "connect.timeout.s", 5, 1, 3600,
                                        &pc.connect_timeout_s, errstr, errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_int64(conf, "statement.timeout.ms", 10000, 0, 3600000,
                                        &pc.statement_timeout_ms, errstr, errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_bool(conf, "connect.at.start", 1, &pc.connect_at_start, errstr,
                                       errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_bool(conf, "create.tables", 1, &pc.create_tables, errstr,
                                       errstr_size)) != 0)
        return rc;
    pc.conninfo = strdup(dsn);
    pc.password = password ? strdup(password) : NULL;
    if (!pc.conninfo || (password && !pc.password)) {
        wxg__pg_conf_free(&pc);
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    *out = pc;
    return 0;
}

/* Copies a server message into why without its trailing newline. */
static void put_why(char *why, size_t why_size, const char *prefix, const char *msg)
{
    size_t len = msg ? strlen(msg) : 0;
    while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == '\r'))
        len--;
    snprintf(why, why_size, "%s%.*s", prefix, (int)len, msg ? msg : "");
}

struct pg_conn *wxg__pg_connect(const wxg__pg_conf_t *pc, char *why, size_t why_size)
{
    char timeout[32];
    char options[96];
    snprintf(timeout, sizeof timeout, "%lld", (long long)pc->connect_timeout_s);
    snprintf(options, sizeof options, "-c statement_timeout=%lld -c client_min_messages=warning",
             (long long)pc->statement_timeout_ms);
    /* With expand_dbname=1 the dsn's own settings are expanded where dbname stands, and a
     * later keyword overrides an earlier one: application_name comes before (a dsn may name
     * its own), the timeouts after (the plugin's settings win). */
    const char *keys[6];
    const char *vals[6];
    int n = 0;
    keys[n] = "application_name";
    vals[n++] = "wxguard";
    keys[n] = "dbname";
    vals[n++] = pc->conninfo;
    keys[n] = "connect_timeout";
    vals[n++] = timeout;
    keys[n] = "options";
    vals[n++] = options;
    if (pc->password) {
        keys[n] = "password";
        vals[n++] = pc->password;
    }
    keys[n] = NULL;
    vals[n] = NULL;
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c) {
        snprintf(why, why_size, "cannot connect to PostgreSQL: out of memory");
        return NULL;
    }
    if (PQstatus(c) != CONNECTION_OK) {
        put_why(why, why_size, "cannot connect to PostgreSQL: ", PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    return c;
}

int wxg__pg_exec_all(struct pg_conn *c, const char *const *sql, size_t n, char *why,
                     size_t why_size)
{
    for (size_t i = 0; i < n; i++) {
        PGresult *r = PQexec(c, sql[i]);
        ExecStatusType st = PQresultStatus(r);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
            const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
            /* Two connections running CREATE TABLE IF NOT EXISTS at once can collide on the
             * catalog's unique index (23505) or on the type (42P07, 42710): the table is there
             * either way. */
            if (state && (strcmp(state, "23505") == 0 || strcmp(state, "42P07") == 0 ||
                          strcmp(state, "42710") == 0)) {
                PQclear(r);
                continue;
            }
            put_why(why, why_size, "creating the tables failed: ",
                    r ? PQresultErrorMessage(r) : PQerrorMessage(c));
            PQclear(r);
            return -1;
        }
        PQclear(r);
    }
    return 0;
}

int wxg__pg_prepare(struct pg_conn *c, const char *name, const char *sql, int nparams, char *why,
                    size_t why_size)
{
    PGresult *r = PQprepare(c, name, sql, nparams, NULL);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        put_why(why, why_size,
                "preparing a statement failed: ", r ? PQresultErrorMessage(r) : PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

int wxg__pg_classify(struct pg_conn *c, const struct pg_result *res, int *reconnect, int *recreate,
                     char *why, size_t why_size)
{
    *reconnect = 0;
    *recreate = 0;
    if (!c || PQstatus(c) != CONNECTION_OK) {
        *reconnect = 1;
        put_why(why, why_size,
                "PostgreSQL connection lost: ", c ? PQerrorMessage(c) : "no connection");
        return WXG_PLUGIN_RETRY;
    }
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorMessage(res) : PQerrorMessage(c);
    char prefix[48];
    snprintf(prefix, sizeof prefix, "PostgreSQL error %s: ", state ? state : "(none)");
    put_why(why, why_size, prefix, msg);
    if (!state) {
        /* No SQLSTATE means the client side failed (out of memory, a protocol error): do not
         * trust the connection any further. */
        *reconnect = 1;
        return WXG_PLUGIN_RETRY;
    }
    if (strcmp(state, "42P01") == 0) {
        *recreate = 1;
        return WXG_PLUGIN_RETRY;
    }
    if (strcmp(state, "26000") == 0) {
        /* A prepared statement is gone (e.g. DISCARD ALL by a pooler): prepare again. */
        *reconnect = 1;
        return WXG_PLUGIN_RETRY;
    }
    if (strncmp(state, "08", 2) == 0 || strncmp(state, "57", 2) == 0) {
        *reconnect = strcmp(state, "57014") != 0; /* a cancelled statement leaves it usable */
        return WXG_PLUGIN_RETRY;
    }
    if (strncmp(state, "40", 2) == 0 || strncmp(state, "53", 2) == 0 ||
        strncmp(state, "58", 2) == 0 || strcmp(state, "55P03") == 0)
        return WXG_PLUGIN_RETRY;
    return WXG_PLUGIN_FAIL;
}

struct pg_conn *wxg__pg_open(const wxg__pg_conf_t *pc, const wxg__pg_schema_t *sc, char *why,
                             size_t why_size)
{
    PGconn *c = wxg__pg_connect(pc, why, why_size);
    if (!c)
        return NULL;
    if (pc->create_tables && wxg__pg_exec_all(c, sc->create, sc->ncreate, why, why_size) != 0)
        goto fail;
    for (size_t i = 0; i < sc->nstmts; i++) {
        const wxg__pg_stmt_t *st = &sc->stmts[i];
        if (wxg__pg_prepare(c, st->name, st->sql, st->nparams, why, why_size) != 0)
            goto fail;
    }
    return c;
fail:
    PQfinish(c);
    return NULL;
}

int wxg__pg_check_at_start(const wxg__pg_conf_t *pc, const wxg__pg_schema_t *sc,
                           const char *plugin_name, char *errstr, size_t errstr_size)
{
    if (!pc->connect_at_start)
        return 0;
    char why[512];
    PGconn *c = wxg__pg_open(pc, sc, why, sizeof why);
    if (!c) {
        snprintf(errstr, errstr_size, "plugin.%s.dsn: %s", plugin_name, why);
        return WXG_ECONN;
    }
    PQfinish(c);
    return 0;
}

int wxg__pg_thread_init(void *state, void **thread_state, char *errstr, size_t errstr_size)
{
    (void)state;
    wxg__pg_thread_t *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    *thread_state = t; /* the connection opens on the first message */
    return 0;
}

void wxg__pg_thread_destroy(void *state, void *thread_state)
{
    (void)state;
    wxg__pg_thread_t *t = thread_state;
    if (!t)
        return;
    PQfinish(t->c);
    free(t);
}

int wxg__pg_thread_ready(wxg__pg_thread_t *t, const wxg__pg_conf_t *pc, const wxg__pg_schema_t *sc,
                         char *why, size_t why_size)
{
    if (t->c && PQstatus(t->c) == CONNECTION_OK)
        return 0;
    PQfinish(t->c);
    t->c = wxg__pg_open(pc, sc, why, why_size);
    return t->c ? 0 : -1;
}

wxg_plugin_result_t wxg__pg_failed(wxg__pg_thread_t *t, struct pg_result *res,
                                   wxg_plugin_ctx_t *ctx, const char *plugin_name, const char *what)
{
    char why[400];
    int reconnect, recreate;
    int rc = wxg__pg_classify(t->c, res, &reconnect, &recreate, why, sizeof why);
    PQclear(res);
    if (reconnect || recreate) {
        /* A missing table is created again by the next connection (create.tables). */
        PQfinish(t->c);
        t->c = NULL;
    }
    wxg_plugin_ctx_set_reason(ctx, "%s: %s: %s", plugin_name, what, why);
    return (wxg_plugin_result_t)rc;
}
