/*
 * DESIGN: the `pgsql` built-in plugin: one row per message in PostgreSQL, written once, and a
 * stale writer refused by the database itself.
 *
 * The table (created when missing) has a UNIQUE key on the idempotency key and a `fence`
 * column holding the fencing token of the claim that wrote the row. Every write is ONE
 * statement, an upsert that the database evaluates atomically against the stored row:
 *
 *   INSERT ... ON CONFLICT (idem_key) DO UPDATE SET ..., fence = EXCLUDED.fence
 *       WHERE <table>.fence < EXCLUDED.fence RETURNING id, writes
 *
 * so there are exactly three outcomes, told apart without trusting Redis at all:
 *   - a row comes back with writes = 1: the row is new (result "row <id> inserted");
 *   - a row comes back with writes > 1: a row written under an OLDER claim (a worker that
 *     crashed or lost its lease before the guard recorded this plugin as done) is rewritten
 *     with the same message and the newer fence (result "row <id> rewritten");
 *   - no row comes back: the stored fence is >= ours. A lookup then tells "the same fence"
 *     (this very claim wrote it before, e.g. the commit's acknowledgement was lost: OK, result
 *     "row <id> already written") from "a higher fence" (we are a stale writer).
 * A stale writer gets WXG_PLUGIN_RETRY with a reason that starts with "lease lost": the row is
 * untouched, and the message goes back to the guard, whose next claim answers DUPLICATE (the
 * newer owner finished) or BUSY (it is still working). It is not FAIL because nothing is wrong
 * with the message: the dead-letter topic would only collect messages that were processed.
 * If the retries run out (the guard's fencing counter went backwards, which only losing
 * Redis data can cause) the message lands in the dead-letter topic with that reason, which is
 * the signal an operator needs.
 *
 * Columns: id (bigserial), idem_key (UNIQUE), fence, account, conversation, sender, msg_id
 * (exact decimal text or NULL), msg_type, format, create_time, is_group, is_self, content
 * (bytea: the exact bytes, NULs included; convert_from(content, 'UTF8') reads it as text),
 * payload_hash (bytea, SHA-256), src_topic, src_partition, src_offset, attempt, writes,
 * written_at.
 *
 * Configuration (plugin.pgsql.*): dsn (required), password, connect.timeout.s (5),
 * statement.timeout.ms (10000), connect.at.start (true: init connects and creates the table,
 * so a wrong DSN stops start-up), create.tables (true), table (wxg_messages).
 *
 * Threads: one connection per worker thread (thread state), opened lazily and replaced after
 * a failure, with the two statements prepared on it. The shared state is read-only after init.
 * Failures are classified by lib/plugins/pg.c: connection loss, timeouts, deadlocks → RETRY;
 * bad data or permissions → FAIL.
 */
#include "plugin_int.h"

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SQL_MAX 2048

typedef struct pgsql_state {
    wxg__pg_conf_t pg;
    char table[64];
    char sql_create[SQL_MAX];
    char sql_upsert[SQL_MAX];
    char sql_lookup[256];
    wxg__pg_schema_t schema; /* points into the SQL text above */
} pgsql_state;

#define STMT_UPSERT "wxg_pgsql_upsert"
#define STMT_LOOKUP "wxg_pgsql_lookup"

/* The format's name as wxg_format_name() spells it; the plugin ABI gives plugins no library
 * function, so built-ins keep to the same rule as external plugins. */
static const char *format_name(wxg_format_t f)
{
    switch (f) {
    case WXG_FORMAT_WKTEAM:
        return "wkteam";
    case WXG_FORMAT_GEWE:
        return "gewe";
    case WXG_FORMAT_OA_XML:
        return "oa-xml";
    case WXG_FORMAT_OA_JSON:
        return "oa-json";
    case WXG_FORMAT_GENERIC:
        return "generic";
    case WXG_FORMAT_AUTO:
        break;
    }
    return "auto";
}

static void build_sql(pgsql_state *s)
{
    const char *t = s->table;
    snprintf(s->sql_create, sizeof s->sql_create,
             "CREATE TABLE IF NOT EXISTS %s ("
             "id bigserial PRIMARY KEY, "
             "idem_key text NOT NULL UNIQUE, "
             "fence bigint NOT NULL CHECK (fence > 0), "
             "account text NOT NULL, conversation text NOT NULL, sender text NOT NULL, "
             "msg_id text, msg_type text NOT NULL, format text NOT NULL, "
             "create_time bigint NOT NULL, is_group boolean NOT NULL, is_self boolean NOT NULL, "
             "content bytea NOT NULL, payload_hash bytea NOT NULL, "
             "src_topic text NOT NULL, src_partition integer NOT NULL, "
             "src_offset bigint NOT NULL, attempt integer NOT NULL, "
             "writes integer NOT NULL DEFAULT 1, "
             "written_at timestamptz NOT NULL DEFAULT now())",
             t);
    snprintf(s->sql_upsert, sizeof s->sql_upsert,
             "INSERT INTO %s AS t (idem_key, fence, account, conversation, sender, msg_id, "
             "msg_type, format, create_time, is_group, is_self, content, payload_hash, "
             "src_topic, src_partition, src_offset, attempt) VALUES ($1, $2::bigint, $3, $4, "
             "$5, $6, $7, $8, $9::bigint, $10::boolean, $11::boolean, $12::bytea, $13::bytea, "
             "$14, $15::integer, $16::bigint, $17::integer) "
             "ON CONFLICT (idem_key) DO UPDATE SET fence = EXCLUDED.fence, "
             "account = EXCLUDED.account, conversation = EXCLUDED.conversation, "
             "sender = EXCLUDED.sender, msg_id = EXCLUDED.msg_id, msg_type = EXCLUDED.msg_type, "
             "format = EXCLUDED.format, create_time = EXCLUDED.create_time, "
             "is_group = EXCLUDED.is_group, is_self = EXCLUDED.is_self, "
             "content = EXCLUDED.content, payload_hash = EXCLUDED.payload_hash, "
             "src_topic = EXCLUDED.src_topic, src_partition = EXCLUDED.src_partition, "
             "src_offset = EXCLUDED.src_offset, attempt = EXCLUDED.attempt, "
             "writes = t.writes + 1, written_at = now() "
             "WHERE t.fence < EXCLUDED.fence RETURNING id, writes",
             t);
    snprintf(s->sql_lookup, sizeof s->sql_lookup, "SELECT id, fence FROM %s WHERE idem_key = $1",
             t);
    s->schema = (wxg__pg_schema_t){
        .create = {s->sql_create},
        .ncreate = 1,
        .stmts = {{STMT_UPSERT, s->sql_upsert, 17}, {STMT_LOOKUP, s->sql_lookup, 1}},
        .nstmts = 2,
    };
}

static void pgsql_destroy(void *state)
{
    pgsql_state *s = state;
    if (!s)
        return;
    wxg__pg_conf_free(&s->pg);
    free(s);
}

static int pgsql_init(const wxg_plugin_conf_t *conf, void **state, char *errstr, size_t errstr_size)
{
    static const char *const known[] = {WXG__PG_CONF_KEYS, "table", NULL};
    int rc = wxg_plugin_conf_check_keys(conf, known, errstr, errstr_size);
    if (rc != 0)
        return rc;
    pgsql_state *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    if ((rc = wxg__pg_conf_parse(conf, &s->pg, errstr, errstr_size)) != 0)
        goto fail;
    const char *table = wxg_plugin_conf_get(conf, "table");
    if (!table)
        table = "wxg_messages";
    if (!wxg__pg_ident_ok(table)) {
        snprintf(errstr, errstr_size,
                 "plugin.pgsql.table: '%s' is not a plain table name ([a-z_][a-z0-9_]*, at most "
                 "63 characters)",
                 table);
        rc = WXG_ECONFIG;
        goto fail;
    }
    snprintf(s->table, sizeof s->table, "%s", table);
    build_sql(s);
    if ((rc = wxg__pg_check_at_start(&s->pg, &s->schema, "pgsql", errstr, errstr_size)) != 0)
        goto fail;
    *state = s;
    return 0;
fail:
    pgsql_destroy(s);
    return rc;
}

static wxg_plugin_result_t pgsql_handle(void *state, void *thread_state, const wxg_msg_view_t *msg,
                                        wxg_plugin_ctx_t *ctx)
{
    pgsql_state *s = state;
    wxg__pg_thread_t *t = thread_state;
    uint64_t fence = wxg_plugin_ctx_fence(ctx);
    if (fence == 0 || fence > (uint64_t)INT64_MAX) {
        wxg_plugin_ctx_set_reason(ctx, "pgsql: fencing token %" PRIu64 " is out of range", fence);
        return WXG_PLUGIN_FAIL;
    }
    char why[400];
    if (wxg__pg_thread_ready(t, &s->pg, &s->schema, why, sizeof why) != 0) {
        wxg_plugin_ctx_set_reason(ctx, "pgsql: %s", why);
        return WXG_PLUGIN_RETRY;
    }

    char fence_s[24], ctime_s[24], part_s[16], off_s[24], attempt_s[16];
    snprintf(fence_s, sizeof fence_s, "%" PRIu64, fence);
    snprintf(ctime_s, sizeof ctime_s, "%" PRId64, msg->create_time);
    snprintf(part_s, sizeof part_s, "%" PRId32, wxg_plugin_ctx_partition(ctx));
    snprintf(off_s, sizeof off_s, "%" PRId64, wxg_plugin_ctx_offset(ctx));
    snprintf(attempt_s, sizeof attempt_s, "%" PRIu32, wxg_plugin_ctx_attempt(ctx));
    const char *key = wxg_plugin_ctx_key(ctx);
    const char *vals[17] = {key,
                            fence_s,
                            msg->account ? msg->account : "",
                            msg->conversation ? msg->conversation : "",
                            msg->sender ? msg->sender : "",
                            msg->msg_id, /* NULL → SQL NULL */
                            msg->type ? msg->type : "",
                            format_name(msg->format),
                            ctime_s,
                            msg->is_group ? "true" : "false",
                            msg->is_self ? "true" : "false",
                            msg->content ? msg->content : "",
                            (const char *)msg->payload_hash,
                            wxg_plugin_ctx_topic(ctx),
                            part_s,
                            off_s,
                            attempt_s};
    int lens[17] = {0};
    int fmts[17] = {0};
    lens[11] = (int)msg->content_len;
    fmts[11] = 1; /* bytea, binary: the exact bytes */
    lens[12] = 32;
    fmts[12] = 1;
    if (msg->content_len > (size_t)INT32_MAX) {
        wxg_plugin_ctx_set_reason(ctx, "pgsql: content too large for one row");
        return WXG_PLUGIN_FAIL;
    }

    PGresult *r = PQexecPrepared(t->c, STMT_UPSERT, 17, vals, lens, fmts, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return wxg__pg_failed(t, r, ctx, "pgsql", "upsert");
    char result[WXG_PLUGIN_RESULT_MAX];
    if (PQntuples(r) == 1) {
        int fresh = strcmp(PQgetvalue(r, 0, 1), "1") == 0;
        snprintf(result, sizeof result, "row %s %s (fence %s)", PQgetvalue(r, 0, 0),
                 fresh ? "inserted" : "rewritten", fence_s);
        PQclear(r);
        wxg_plugin_ctx_set_result(ctx, result);
        return WXG_PLUGIN_OK;
    }
    PQclear(r);

    /* Nothing applied: the stored fence is >= ours. Which one? */
    const char *lv[1] = {key};
    r = PQexecPrepared(t->c, STMT_LOOKUP, 1, lv, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return wxg__pg_failed(t, r, ctx, "pgsql", "fence lookup");
    if (PQntuples(r) != 1) {
        PQclear(r);
        wxg_plugin_ctx_set_reason(ctx, "pgsql: the row vanished between upsert and lookup");
        return WXG_PLUGIN_RETRY;
    }
    char *end = NULL;
    unsigned long long stored = strtoull(PQgetvalue(r, 0, 1), &end, 10);
    if (stored == fence) {
        snprintf(result, sizeof result, "row %s already written (fence %s)", PQgetvalue(r, 0, 0),
                 fence_s);
        PQclear(r);
        wxg_plugin_ctx_set_result(ctx, result);
        return WXG_PLUGIN_OK;
    }
    PQclear(r);
    wxg_plugin_ctx_set_reason(ctx,
                              "pgsql: lease lost: the database refused a stale writer (fence "
                              "%" PRIu64 ", stored fence %llu)",
                              fence, stored);
    return WXG_PLUGIN_RETRY;
}

static const wxg_plugin_desc_t pgsql_desc = {
    .abi_version = WXG_PLUGIN_ABI_VERSION,
    .name = "pgsql",
    .init = pgsql_init,
    .thread_init = wxg__pg_thread_init,
    .thread_destroy = wxg__pg_thread_destroy,
    .handle = pgsql_handle,
    .destroy = pgsql_destroy,
};

const wxg_plugin_desc_t *wxg__plugin_pgsql(void)
{
    return &pgsql_desc;
}
