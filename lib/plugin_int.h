/*
 * Internal to the plugin module: the descriptors of the built-in plugins in lib/plugins/. Each
 * built-in defines one of these functions; lib/plugin.c lists them in its registry table. To add
 * a built-in, declare its function here and add a line to that table.
 */
#ifndef WXG_PLUGIN_INT_H
#define WXG_PLUGIN_INT_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/plugin.h"

const wxg_plugin_desc_t *wxg__plugin_noop(void);
const wxg_plugin_desc_t *wxg__plugin_record(void);
const wxg_plugin_desc_t *wxg__plugin_fail(void);
const wxg_plugin_desc_t *wxg__plugin_autoreply(void);
const wxg_plugin_desc_t *wxg__plugin_pgsql(void);
const wxg_plugin_desc_t *wxg__plugin_billing(void);
const wxg_plugin_desc_t *wxg__plugin_http(void);

/* ----- autoreply's rules (lib/plugins/autoreply.c), pure, exposed for the unit tests ----- */

typedef struct wxg__ar_rules wxg__ar_rules_t;

/* Parses every rule.<n> entry of conf (see autoreply.c for the grammar). Returns 0 and sets
 * *out (possibly with no rules), or WXG_ECONFIG / WXG_ENOMEM with errstr naming the key. */
int wxg__ar_rules_parse(const wxg_plugin_conf_t *conf, wxg__ar_rules_t **out, char *errstr,
                        size_t errstr_size);

/* The number of parsed rules. */
size_t wxg__ar_rules_count(const wxg__ar_rules_t *rules);

/* The reply text of the first rule (in rule-number order) that matches msg, or NULL; *rule_no
 * (may be NULL) gets that rule's number. Thread-safe (regexec on a compiled pattern). */
const char *wxg__ar_rules_match(const wxg__ar_rules_t *rules, const wxg_msg_view_t *msg,
                                long *rule_no);

/* Accepts NULL. */
void wxg__ar_rules_free(wxg__ar_rules_t *rules);

/* The reply command: {"account","to","content","in_reply_to","key"} as a malloc'd string, or
 * NULL when out of memory. */
char *wxg__ar_reply_json(const wxg_msg_view_t *msg, const char *key, const char *content);

/* The amount billing charges for a message of `type`, given billing's init state (exposed for
 * the unit tests). */
int64_t wxg__billing_price(const void *state, const char *type);

/* The http plugin's outcome for an HTTP status (exposed for the unit tests). */
wxg_plugin_result_t wxg__http_classify(long status);

/* ----- shared by the database plugins (lib/plugins/pg.c) ----- */

struct pg_conn;   /* libpq's PGconn */
struct pg_result; /* libpq's PGresult */

typedef struct wxg__pg_conf {
    char *conninfo;               /* dsn: a libpq keyword string or URI */
    char *password;               /* or NULL: then libpq's own sources (PGPASSWORD, .pgpass) */
    int64_t connect_timeout_s;    /* 1..3600 */
    int64_t statement_timeout_ms; /* 0 = none */
    int connect_at_start;         /* init connects once and creates the tables */
    int create_tables;            /* CREATE TABLE IF NOT EXISTS on every new connection */
} wxg__pg_conf_t;

/* The configuration keys wxg__pg_conf_parse() reads, for wxg_plugin_conf_check_keys lists. */
#define WXG__PG_CONF_KEYS                                                               \
    "dsn", "password", "connect.timeout.s", "statement.timeout.ms", "connect.at.start", \
        "create.tables"

/* Reads the keys above. Returns 0 or WXG_ECONFIG/WXG_ENOMEM (errstr names the key). */
int wxg__pg_conf_parse(const wxg_plugin_conf_t *conf, wxg__pg_conf_t *out, char *errstr,
                       size_t errstr_size);
void wxg__pg_conf_free(wxg__pg_conf_t *pc);

/* 1 when `name` is a plain SQL identifier wxguard accepts for a table: [a-z_][a-z0-9_]{0,62}. */
int wxg__pg_ident_ok(const char *name);

/* Connects (blocking, at most the connect timeout) and applies the statement timeout. Returns
 * the connection, or NULL with the reason in why. */
struct pg_conn *wxg__pg_connect(const wxg__pg_conf_t *pc, char *why, size_t why_size);

/* Runs each of the n statements in order (no parameters). Returns 0, or -1 with the reason in
 * why. A concurrent creation of the same table by another connection is not an error. */
int wxg__pg_exec_all(struct pg_conn *c, const char *const *sql, size_t n, char *why,
                     size_t why_size);

/* Prepares `sql` as statement `name` with n parameters of unspecified types. 0 or -1 (why). */
int wxg__pg_prepare(struct pg_conn *c, const char *name, const char *sql, int nparams, char *why,
                    size_t why_size);

/* How a failed statement (res may be NULL) should be treated: WXG_PLUGIN_RETRY for a lost
 * connection, a timeout, a serialization failure or a deadlock, lack of resources, a server
 * shutting down; WXG_PLUGIN_FAIL for everything else (bad data, permissions, a broken schema).
 * *reconnect is set to 1 when the connection is unusable and must be replaced, and *recreate to
 * 1 when a table went missing (undefined_table: the next connection creates it again). why gets
 * the SQLSTATE and the server's message. */
int wxg__pg_classify(struct pg_conn *c, const struct pg_result *res, int *reconnect, int *recreate,
                     char *why, size_t why_size);

/* The tables a database plugin creates and the statements it prepares on each connection. The
 * strings belong to the plugin's state and live as long as it. */
#define WXG__PG_MAX_CREATE 4
#define WXG__PG_MAX_STMTS  4

typedef struct wxg__pg_stmt {
    const char *name; /* the prepared statement's name */
    const char *sql;
    int nparams;
} wxg__pg_stmt_t;

typedef struct wxg__pg_schema {
    const char *create[WXG__PG_MAX_CREATE]; /* CREATE TABLE IF NOT EXISTS statements */
    size_t ncreate;
    wxg__pg_stmt_t stmts[WXG__PG_MAX_STMTS];
    size_t nstmts;
} wxg__pg_schema_t;

/* A database plugin's per-worker-thread state: its own connection (libpq connections are not
 * shared between threads), NULL until the first message and after a failure dropped it. */
typedef struct wxg__pg_thread {
    struct pg_conn *c;
} wxg__pg_thread_t;

/* A new connection with the tables created (when create.tables) and every statement of sc
 * prepared, or NULL with the reason in why. */
struct pg_conn *wxg__pg_open(const wxg__pg_conf_t *pc, const wxg__pg_schema_t *sc, char *why,
                             size_t why_size);

/* With connect.at.start, opens one connection as wxg__pg_open() does and closes it again, so a
 * wrong DSN or schema stops start-up. Returns 0, or WXG_ECONN with errstr naming
 * plugin.<plugin_name>.dsn. */
int wxg__pg_check_at_start(const wxg__pg_conf_t *pc, const wxg__pg_schema_t *sc,
                           const char *plugin_name, char *errstr, size_t errstr_size);

/* The plugin ABI's thread_init/thread_destroy for a wxg__pg_thread_t (state is unused):
 * database plugins put these straight into their descriptors. */
int wxg__pg_thread_init(void *state, void **thread_state, char *errstr, size_t errstr_size);
void wxg__pg_thread_destroy(void *state, void *thread_state);

/* Makes sure t holds a usable connection, replacing a missing or broken one with a new one from
 * wxg__pg_open(). Returns 0, or -1 with the reason in why (the caller answers RETRY). */
int wxg__pg_thread_ready(wxg__pg_thread_t *t, const wxg__pg_conf_t *pc, const wxg__pg_schema_t *sc,
                         char *why, size_t why_size);

/* Turns a failed statement into RETRY or FAIL with wxg__pg_classify(), frees res, drops t's
 * connection when it is unusable or a table went missing, and sets the reason
 * "<plugin_name>: <what>: <SQLSTATE and message>" on ctx. */
wxg_plugin_result_t wxg__pg_failed(wxg__pg_thread_t *t, struct pg_result *res,
                                   wxg_plugin_ctx_t *ctx, const char *plugin_name,
                                   const char *what);

#endif /* WXG_PLUGIN_INT_H */
