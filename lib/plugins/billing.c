/*
 * DESIGN: the `billing` built-in plugin: charge a per-account balance once per message.
 *
 * Two tables (created when missing):
 *   <charges.table>  (charge_id bigserial, idem_key text UNIQUE, fence, account, msg_type,
 *                     amount, charged_at): the ledger; one row per charged message.
 *   <balances.table> (account text PRIMARY KEY, balance bigint, charges bigint, updated_at):
 *                     the running balance, in integer minor units (e.g. fen); it may go
 *                     negative, and an account without a row starts at 0.
 *
 * The charge is ONE statement, so ONE transaction: a data-modifying WITH query inserts the
 * ledger row (ON CONFLICT (idem_key) DO NOTHING) and, only when that insert produced a row,
 * subtracts the amount from the balance. Recording the charge under the idempotency key and
 * moving the money commit together or not at all, so a charge can never happen twice, whatever
 * the guard's marker says: a lost marker, a crash between commit and marker, a redelivery hours
 * later or two replicas racing each other all end at the unique key. Concurrent attempts for
 * one key serialise on the unique index: the second waits for the first to commit, then does
 * nothing.
 *
 * When the ledger already has the key, a second statement decides between "already charged"
 * and "stale writer" by the fencing token, like pgsql: UPDATE ... SET fence = ours WHERE
 * fence <= ours. A row means already charged (OK; the ledger's fence moves up to ours, so an
 * even older writer is refused from now on); no row means the stored fence is higher: we are a
 * stale writer, refused with WXG_PLUGIN_RETRY and a reason starting "lease lost" (see
 * lib/plugins/pgsql.c for why RETRY and not FAIL). The result recorded with the guard is
 * "charge <charge_id>".
 *
 * Prices: price.default (default 1) for every message type not listed in `prices`, a
 * comma-separated list of TYPE=AMOUNT (the view's type, e.g. "60001=2, text=1,
 * event:subscribe=0"). A price of 0 charges nothing and writes nothing (result "free").
 * skip.self (default false) leaves the bot's own messages uncharged.
 *
 * Configuration (plugin.billing.*): dsn (required), password, connect.timeout.s,
 * statement.timeout.ms, connect.at.start, create.tables (as for pgsql), charges.table
 * (wxg_charges), balances.table (wxg_balances), price.default, prices, skip.self.
 *
 * Threads: a connection per worker thread, opened lazily and replaced after a failure; the
 * shared state (prices, SQL text) is read-only after init.
 */
#include "plugin_int.h"

#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SQL_MAX 1536

typedef struct price {
    char *type;
    int64_t amount;
} price;

typedef struct billing_state {
    wxg__pg_conf_t pg;
    int64_t price_default;
    size_t nprices;
    price *prices;
    int skip_self;
    char sql_create_charges[SQL_MAX];
    char sql_create_balances[SQL_MAX];
    char sql_charge[SQL_MAX];
    char sql_refence[SQL_MAX];
    char sql_lookup[SQL_MAX];
    wxg__pg_schema_t schema; /* points into the SQL text above */
} billing_state;

#define STMT_CHARGE  "wxg_billing_charge"
#define STMT_REFENCE "wxg_billing_refence"
#define STMT_LOOKUP  "wxg_billing_lookup"

static void billing_destroy(void *state)
{
    billing_state *s = state;
    if (!s)
        return;
    for (size_t i = 0; i < s->nprices; i++)
        free(s->prices[i].type);
    free(s->prices);
    wxg__pg_conf_free(&s->pg);
    free(s);
}

static int parse_amount(const char *v, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < 0 || n > (long long)1000000000000LL)
        return -1;
    *out = n;
    return 0;
}

/* Trims blanks in place and returns the start. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

/* prices = TYPE=AMOUNT[, TYPE=AMOUNT...]. The LAST '=' of an item splits it. */
static int parse_prices(billing_state *s, const char *v, char *errstr, size_t errstr_size)
{
    int rc = 0;
    size_t cap = 1;
    for (const char *p = v; *p; p++)
        cap += *p == ',';
    char *copy = strdup(v);
    if (!copy || !(s->prices = calloc(cap, sizeof *s->prices))) {
        snprintf(errstr, errstr_size, "out of memory");
        free(copy);
        return WXG_ENOMEM;
    }
    char *item = copy;
    while (item) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        char *eq = strrchr(item, '=');
        char *type = NULL, *amount = NULL;
        if (eq) {
            *eq = '\0';
            type = trim(item);
            amount = trim(eq + 1);
        }
        if (!eq || !*type || !*amount) {
            if (eq)
                *eq = '=';
            snprintf(errstr, errstr_size,
                     "plugin.billing.prices: '%s' is not TYPE=AMOUNT (e.g. 60001=2, text=1)",
                     trim(item));
            rc = WXG_ECONFIG;
            break;
        }
        price *p = &s->prices[s->nprices];
        if (parse_amount(amount, &p->amount) != 0) {
            snprintf(errstr, errstr_size,
                     "plugin.billing.prices: amount '%s' for type '%s' is not an integer in [0, "
                     "1000000000000]",
                     amount, type);
            rc = WXG_ECONFIG;
            break;
        }
        if (!(p->type = strdup(type))) {
            snprintf(errstr, errstr_size, "out of memory");
            rc = WXG_ENOMEM;
            break;
        }
        s->nprices++;
        item = comma ? comma + 1 : NULL;
    }
    free(copy);
    return rc;
}

/* The amount to charge for a message of `type` (exposed for the unit tests). */
int64_t wxg__billing_price(const void *state, const char *type)
{
    const billing_state *s = state;
    for (size_t i = s->nprices; type && i-- > 0;) { /* the last listing of a type wins */
        if (strcmp(s->prices[i].type, type) == 0)
            return s->prices[i].amount;
    }
    return s->price_default;
}

static int table_name(const wxg_plugin_conf_t *conf, const char *key, const char *def,
                      const char **out, char *errstr, size_t errstr_size)
{
    const char *v = wxg_plugin_conf_get(conf, key);
    if (!v)
        v = def;
    if (!wxg__pg_ident_ok(v)) {
        snprintf(errstr, errstr_size,
                 "plugin.billing.%s: '%s' is not a plain table name ([a-z_][a-z0-9_]*, at most 63 "
                 "characters)",
                 key, v);
        return WXG_ECONFIG;
    }
    *out = v;
    return 0;
}

static void build_sql(billing_state *s, const char *charges, const char *balances)
{
    snprintf(s->sql_create_charges, sizeof s->sql_create_charges,
             "CREATE TABLE IF NOT EXISTS %s (charge_id bigserial PRIMARY KEY, "
             "idem_key text NOT NULL UNIQUE, fence bigint NOT NULL CHECK (fence > 0), "
             "account text NOT NULL, msg_type text NOT NULL, amount bigint NOT NULL, "
             "charged_at timestamptz NOT NULL DEFAULT now())",
             charges);
    snprintf(s->sql_create_balances, sizeof s->sql_create_balances,
             "CREATE TABLE IF NOT EXISTS %s (account text PRIMARY KEY, "
             "balance bigint NOT NULL DEFAULT 0, charges bigint NOT NULL DEFAULT 0, "
             "updated_at timestamptz NOT NULL DEFAULT now())",
             balances);
    snprintf(s->sql_charge, sizeof s->sql_charge,
             "WITH c AS (INSERT INTO %s (idem_key, fence, account, msg_type, amount) "
             "VALUES ($1, $2::bigint, $3, $4, $5::bigint) ON CONFLICT (idem_key) DO NOTHING "
             "RETURNING charge_id, account, amount), "
             "b AS (INSERT INTO %s AS b (account, balance, charges) "
             "SELECT account, -amount, 1 FROM c ON CONFLICT (account) DO UPDATE SET "
             "balance = b.balance + EXCLUDED.balance, charges = b.charges + 1, "
             "updated_at = now() RETURNING balance) "
             "SELECT c.charge_id, (SELECT balance FROM b) FROM c",
             charges, balances);
    snprintf(s->sql_refence, sizeof s->sql_refence,
             "UPDATE %s SET fence = $2::bigint WHERE idem_key = $1 AND fence <= $2::bigint "
             "RETURNING charge_id",
             charges);
    snprintf(s->sql_lookup, sizeof s->sql_lookup, "SELECT fence FROM %s WHERE idem_key = $1",
             charges);
    s->schema = (wxg__pg_schema_t){
        .create = {s->sql_create_charges, s->sql_create_balances},
        .ncreate = 2,
        .stmts = {{STMT_CHARGE, s->sql_charge, 5},
                  {STMT_REFENCE, s->sql_refence, 2},
                  {STMT_LOOKUP, s->sql_lookup, 1}},
        .nstmts = 3,
    };
}

static int billing_init(const wxg_plugin_conf_t *conf, void **state, char *errstr,
                        size_t errstr_size)
{
    static const char *const known[] = {WXG__PG_CONF_KEYS,
                                        "charges.table",
                                        "balances.table",
                                        "price.default",
                                        "prices",
                                        "skip.self",
                                        NULL};
    int rc = wxg_plugin_conf_check_keys(conf, known, errstr, errstr_size);
    if (rc != 0)
        return rc;
    billing_state *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    const char *charges = NULL, *balances = NULL;
    const char *prices = wxg_plugin_conf_get(conf, "prices");
    if ((rc = wxg__pg_conf_parse(conf, &s->pg, errstr, errstr_size)) != 0 ||
        (rc = table_name(conf, "charges.table", "wxg_charges", &charges, errstr, errstr_size)) !=
            0 ||
        (rc = table_name(conf, "balances.table", "wxg_balances", &balances, errstr, errstr_size)) !=
            0 ||
        (rc = wxg_plugin_conf_get_int64(conf, "price.default", 1, 0, 1000000000000LL,
                                        &s->price_default, errstr, errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_bool(conf, "skip.self", 0, &s->skip_self, errstr, errstr_size)) !=
            0 ||
        (prices && *prices && (rc = parse_prices(s, prices, errstr, errstr_size)) != 0))
        goto fail;
    if (strcmp(charges, balances) == 0) {
        snprintf(errstr, errstr_size,
                 "plugin.billing.balances.table: must differ from charges.table ('%s')", charges);
        rc = WXG_ECONFIG;
        goto fail;
    }
    build_sql(s, charges, balances);
    if ((rc = wxg__pg_check_at_start(&s->pg, &s->schema, "billing", errstr, errstr_size)) != 0)
        goto fail;
    *state = s;
    return 0;
fail:
    billing_destroy(s);
    return rc;
}

/* OK with the result "charge <charge_id>" from the first column of r's only row; frees r. */
static wxg_plugin_result_t charged(PGresult *r, wxg_plugin_ctx_t *ctx)
{
    char result[WXG_PLUGIN_RESULT_MAX];
    snprintf(result, sizeof result, "charge %s", PQgetvalue(r, 0, 0));
    PQclear(r);
    wxg_plugin_ctx_set_result(ctx, result);
    return WXG_PLUGIN_OK;
}

static wxg_plugin_result_t billing_handle(void *state, void *thread_state,
                                          const wxg_msg_view_t *msg, wxg_plugin_ctx_t *ctx)
{
    billing_state *s = state;
    wxg__pg_thread_t *t = thread_state;
    uint64_t fence = wxg_plugin_ctx_fence(ctx);
    int64_t amount = wxg__billing_price(s, msg->type);
    if (amount == 0 || (s->skip_self && msg->is_self)) {
        wxg_plugin_ctx_set_result(ctx, "free");
        return WXG_PLUGIN_OK;
    }
    if (fence == 0 || fence > (uint64_t)INT64_MAX) {
        wxg_plugin_ctx_set_reason(ctx, "billing: fencing token %" PRIu64 " is out of range", fence);
        return WXG_PLUGIN_FAIL;
    }
    char why[400];
    if (wxg__pg_thread_ready(t, &s->pg, &s->schema, why, sizeof why) != 0) {
        wxg_plugin_ctx_set_reason(ctx, "billing: %s", why);
        return WXG_PLUGIN_RETRY;
    }
    char fence_s[24], amount_s[24];
    snprintf(fence_s, sizeof fence_s, "%" PRIu64, fence);
    snprintf(amount_s, sizeof amount_s, "%" PRId64, amount);
    const char *key = wxg_plugin_ctx_key(ctx);
    const char *vals[5] = {key, fence_s, msg->account ? msg->account : "",
                           msg->type ? msg->type : "", amount_s};

    PGresult *r = PQexecPrepared(t->c, STMT_CHARGE, 5, vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return wxg__pg_failed(t, r, ctx, "billing", "charge");
    if (PQntuples(r) == 1)
        return charged(r, ctx);
    PQclear(r);

    /* The ledger has the key: already charged, or we are stale. */
    r = PQexecPrepared(t->c, STMT_REFENCE, 2, vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return wxg__pg_failed(t, r, ctx, "billing", "fence check");
    if (PQntuples(r) == 1)
        return charged(r, ctx);
    PQclear(r);
    char stored[24] = "?";
    r = PQexecPrepared(t->c, STMT_LOOKUP, 1, vals, NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
        snprintf(stored, sizeof stored, "%s", PQgetvalue(r, 0, 0));
    else if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return wxg__pg_failed(t, r, ctx, "billing", "fence lookup");
    PQclear(r);
    wxg_plugin_ctx_set_reason(ctx,
                              "billing: lease lost: the database refused a stale writer (fence "
                              "%" PRIu64 ", stored fence %s)",
                              fence, stored);
    return WXG_PLUGIN_RETRY;
}

static const wxg_plugin_desc_t billing_desc = {
    .abi_version = WXG_PLUGIN_ABI_VERSION,
    .name = "billing",
    .init = billing_init,
    .thread_init = wxg__pg_thread_init,
    .thread_destroy = wxg__pg_thread_destroy,
    .handle = billing_handle,
    .destroy = billing_destroy,
};

const wxg_plugin_desc_t *wxg__plugin_billing(void)
{
    return &billing_desc;
}
