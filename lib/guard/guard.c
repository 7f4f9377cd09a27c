/*
 * DESIGN: the Redis idempotency guard -- its public API and the dispatch to a design.
 *
 * Purpose: an atomic per-message state machine in Redis (claim, renew, plugin_done, complete,
 * fail; for the admin tool inspect, release, rearm, purge and a SCAN walk), plus a renewal
 * watchdog. docs/guard.md explains the guarantees. This file holds what does not depend on how
 * the state machine is kept: the configuration defaults and checks, the handle (counters, last
 * error), the argument checks of every public call, and the dispatch through the handle's
 * operations table (guard_int.h). The designs behind the table:
 *
 *   - the native design (lib/guard/guard_native.c, the default): the common transitions as native
 *     commands on layout v4, pipelined per batch, the rare ones as Lua scripts;
 *   - the Lua design (lib/guard/guard_lua.c, conf.design = WXG_GUARD_DESIGN_LUA): every transition
 *     one Lua script handling a batch of messages, on the same layout; the native design's
 *     rare paths are its scripts;
 *   - the naive design (lib/guard/guard_naive.c, conf.naive, benchmark only): one plain command per
 *     message and step, so that benchmarks can run the real consumer on the design the Lua one
 *     replaces;
 *   - in the unit tests, an in-memory fake (tests/support/fakeguard.c).
 * The Redis designs connect through lib/guard/guard_conn.c (over lib/rconn.c, or lib/rcluster.c for
 * a Redis Cluster) and share the admin operations of lib/guard/guard_admin.c; the native and the
 * Lua design share layout v4 (lib/guard/guard_layout.c, and lib/guard/guard_geom.c for each time
 * bucket's layout). guard_int.h lists every file of the module.
 *
 * Threads: a wxg_guard_t is used by one thread at a time and has no lock; so are its counters
 * and its last error. The watchdog (lib/guard/guard_watchdog.c) has its own handle and thread.
 *
 * Failure modes: a call with bad arguments fails here with WXG_EINVAL before a design sees it;
 * an operation a design does not have fails with WXG_ESTATE. A claim that fails leaves every
 * result cleared, whatever the design filled in before it failed.
 */
#include "guard_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "err_int.h"
#include "guard_conn_int.h"

struct wxg_guard_s {
    const wxg__guard_ops_t *ops;
    void *impl;
    wxg_guard_conf_t conf; /* every string member NULL (wxg__guard_new_ops) */
    wxg_guard_stats_t stats;
    char last_error[256];
};

/* ---------------------------------------------------------------------------------------------
 * Shared helpers (guard_int.h)
 */

int wxg__guard_fill_random(void *buf, size_t len)
{
    unsigned char *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t r = getrandom(p + got, len - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        got += (size_t)r;
    }
    if (got == len)
        return 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return WXG_EIO;
    while (got < len) {
        ssize_t r = read(fd, p + got, len - got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            close(fd);
            return WXG_EIO;
        }
        got += (size_t)r;
    }
    close(fd);
    return 0;
}

void wxg__guard_count_error(wxg_guard_stats_t *s, int rc)
{
    if (rc == WXG_ECONN)
        s->conn_errors++;
    else if (rc == WXG_ETIMEDOUT)
        s->timeouts++;
    else if (rc == WXG_EREDIS)
        s->redis_errors++;
    else if (rc == WXG_EREPLICAS)
        s->replica_failures++;
}

int wxg__guard_ticket_valid(const wxg_guard_ticket_t *t)
{
    return t && t->key && t->key_len > 0 && t->fence > 0 && strlen(t->owner) == WXG_GUARD_OWNER_LEN;
}

int wxg__guard_plugin_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > WXG_GUARD_PLUGIN_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '.' || ch == '-';
        if (!ok)
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * The handle
 */

wxg_guard_t *wxg__guard_new_ops(const wxg__guard_ops_t *ops, void *impl,
                                const wxg_guard_conf_t *conf, char *errstr, size_t errstr_size)
{
    wxg_guard_t *g = calloc(1, sizeof *g);
    if (!g) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    g->ops = ops;
    g->impl = impl;
    if (conf)
        g->conf = *conf;
    else
        wxg_guard_conf_init(&g->conf);
    /* The caller's strings are borrowed only for the constructor's duration. */
    g->conf.host = NULL;
    g->conf.unix_path = NULL;
    g->conf.user = NULL;
    g->conf.password = NULL;
    g->conf.prefix = NULL;
    g->conf.sentinels = NULL;
    g->conf.sentinel_master = NULL;
    g->conf.sentinel_user = NULL;
    g->conf.sentinel_password = NULL;
    g->conf.tls_ca_file = NULL;
    g->conf.tls_ca_path = NULL;
    g->conf.tls_cert_file = NULL;
    g->conf.tls_key_file = NULL;
    g->conf.tls_key_password = NULL;
    g->conf.tls_server_name = NULL;
    g->conf.client_name = NULL;
    g->conf.cluster_nodes = NULL;
    return g;
}

void *wxg__guard_impl(const wxg_guard_t *g)
{
    return g->impl;
}

const wxg_guard_conf_t *wxg__guard_conf(const wxg_guard_t *g)
{
    return &g->conf;
}

wxg_guard_stats_t *wxg__guard_stats(wxg_guard_t *g)
{
    return &g->stats;
}

void wxg__guard_set_error(wxg_guard_t *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->last_error, sizeof g->last_error, fmt, ap);
    va_end(ap);
}

char *wxg__guard_error_buf(wxg_guard_t *g, size_t *size)
{
    *size = sizeof g->last_error;
    return g->last_error;
}

void wxg_guard_conf_init(wxg_guard_conf_t *c)
{
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 6379;
    c->connect_timeout_ms = 2000;
    c->command_timeout_ms = 2000;
    c->prefix = "wxg:";
    c->lease_ms = 30000;
    c->inflight_ttl_ms = 24LL * 3600 * 1000;
    c->done_retention_ms = 7LL * 24 * 3600 * 1000;
    c->failed_retention_ms = 7LL * 24 * 3600 * 1000;
    c->wait_timeout_ms = 100;
    c->done_expected_rate = 0; /* adaptive */
    c->done_bucket_target = 64;
    c->shard_bits = 10;
    c->batch_max = 64;
    c->reconnect_min_ms = 50;
    c->reconnect_max_ms = 2000;
    c->tls_verify = 1;
    c->client_name = "wxguard";
}

/* 1 when `name` can be a CLIENT SETNAME argument: 1..64 printable bytes, no spaces. */
static int client_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (name[i] <= ' ' || name[i] > '~')
            return 0;
    return 1;
}

/* The TLS and client-name checks; 0 or WXG_ECONFIG with errstr. */
static int conf_check_tls(const wxg_guard_conf_t *conf, char *errstr, size_t errstr_size)
{
    if (conf->client_name && !client_name_valid(conf->client_name)) {
        wxg__errf(errstr, errstr_size,
                  "client name must be at most 64 printable bytes without spaces");
        return WXG_ECONFIG;
    }
    if ((conf->tls || conf->sentinel_tls) && conf->tls_key_file && !conf->tls_cert_file) {
        wxg__errf(errstr, errstr_size, "a TLS client key needs its certificate (tls_cert_file)");
        return WXG_ECONFIG;
    }
    if (conf->tls && conf->unix_path && !conf->sentinels && !conf->cluster_nodes) {
        wxg__errf(errstr, errstr_size, "TLS over a Unix socket is not supported");
        return WXG_ECONFIG;
    }
    return 0;
}

/* The checks every design's configuration passes; 0 or WXG_EINVAL / WXG_ECONFIG with errstr. */
static int conf_check(const wxg_guard_conf_t *conf, char *errstr, size_t errstr_size)
{
    if (!conf) {
        wxg__errf(errstr, errstr_size, "no configuration");
        return WXG_EINVAL;
    }
    if (!wxg__guard_prefix_valid(conf->prefix ? conf->prefix : "wxg:")) {
        wxg__errf(errstr, errstr_size,
                  "key prefix must be 1..%d bytes of [A-Za-z0-9:_.-] (no hash-tag braces)",
                  WXG_GUARD_PREFIX_MAX);
        return WXG_ECONFIG;
    }
    if (conf->lease_ms < 10 || conf->inflight_ttl_ms < conf->lease_ms ||
        conf->failed_retention_ms <= 0 || conf->connect_timeout_ms <= 0 ||
        conf->command_timeout_ms <= 0 || conf->batch_max < 1 || conf->batch_max > 1024 ||
        conf->wait_replicas < 0 || (conf->wait_replicas > 0 && conf->wait_timeout_ms <= 0) ||
        conf->reconnect_min_ms < 1 || conf->reconnect_max_ms < conf->reconnect_min_ms ||
        (!conf->unix_path && (conf->port <= 0 || conf->port > 65535)) || conf->db < 0) {
        wxg__errf(errstr, errstr_size,
                  "invalid guard configuration: need lease_ms >= 10, inflight_ttl_ms >= lease_ms, "
                  "positive timeouts and retentions, batch_max 1..1024, a valid port and db");
        return WXG_ECONFIG;
    }
    if (conf->cluster_nodes && *conf->cluster_nodes && conf->sentinels && *conf->sentinels) {
        wxg__errf(errstr, errstr_size,
                  "Redis Cluster (cluster_nodes) and Sentinel (sentinels) cannot be used "
                  "together: a cluster fails over by itself");
        return WXG_ECONFIG;
    }
    if (conf->cluster_nodes && *conf->cluster_nodes && conf->db != 0) {
        wxg__errf(errstr, errstr_size, "Redis Cluster has only database 0 (db must be 0)");
        return WXG_ECONFIG;
    }
    if (conf->password && strlen(conf->password) == 0) {
        wxg__errf(errstr, errstr_size, "empty Redis password (leave it unset for no AUTH)");
        return WXG_ECONFIG;
    }
    if (conf->design != WXG_GUARD_DESIGN_NATIVE && conf->design != WXG_GUARD_DESIGN_LUA) {
        wxg__errf(errstr, errstr_size, "unknown guard design %d", conf->design);
        return WXG_ECONFIG;
    }
    return conf_check_tls(conf, errstr, errstr_size);
}

wxg_guard_t *wxg_guard_new(const wxg_guard_conf_t *conf, int *err, char *errstr, size_t errstr_size)
{
    int rc = conf_check(conf, errstr, errstr_size);
    if (rc) {
        if (err)
            *err = rc;
        return NULL;
    }
    if (conf->naive)
        return wxg__guard_naive_new(conf, err, errstr, errstr_size);
    if (conf->design == WXG_GUARD_DESIGN_LUA)
        return wxg__guard_lua_new(conf, err, errstr, errstr_size);
    return wxg__guard_native_new(conf, err, errstr, errstr_size);
}

void wxg_guard_destroy(wxg_guard_t *g)
{
    if (!g)
        return;
    g->ops->destroy(g);
    free(g);
}

void wxg_guard_get_stats(const wxg_guard_t *g, wxg_guard_stats_t *out)
{
    *out = g->stats;
}

const char *wxg_guard_last_error(const wxg_guard_t *g)
{
    return g->last_error;
}

/* The answer to an operation the design does not have. */
static int not_available(wxg_guard_t *g, const char *what)
{
    wxg__guard_set_error(g, "%s is not available in %s mode", what, g->ops->name);
    return WXG_ESTATE;
}

/* ---------------------------------------------------------------------------------------------
 * Transitions: checks, then dispatch
 */

void wxg_guard_claim_clear(wxg_guard_claim_t *c)
{
    if (!c)
        return;
    free(c->finished);
    memset(c, 0, sizeof *c);
}

/* Claim results carry the payload tag their DONE marker will get, for the near cache. */
static void ticket_tags(const wxg_guard_msg_t *msgs, size_t n, wxg_guard_claim_t *out)
{
    for (size_t i = 0; i < n; i++) {
        if (out[i].outcome == WXG_GUARD_CLAIMED) {
            out[i].ticket.payload_tag = wxg__guard_payload_tag(msgs[i].payload_hash);
            out[i].ticket.payload_tag_set = 1;
        }
    }
}

int wxg_guard_claim_batch(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n,
                          wxg_guard_claim_t *out)
{
    if (!g || (n > 0 && (!msgs || !out)))
        return WXG_EINVAL;
    for (size_t i = 0; i < n; i++)
        memset(&out[i], 0, sizeof out[i]);
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].key || msgs[i].key_len == 0)
            return WXG_EINVAL;
    }
    if (!g->ops->claim_batch)
        return not_available(g, "claim");
    int rc = g->ops->claim_batch(g, msgs, n, out);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            wxg_guard_claim_clear(&out[i]);
        return rc;
    }
    ticket_tags(msgs, n, out);
    return 0;
}

int wxg_guard_claim(wxg_guard_t *g, const char *key, size_t key_len,
                    const unsigned char *payload_hash, wxg_guard_claim_t *out)
{
    wxg_guard_msg_t m = {.key = key, .key_len = key_len, .payload_hash = payload_hash};
    return wxg_guard_claim_batch(g, &m, 1, out);
}

/* The single form's answer for one per-message result. */
static int single_result(int rc, int result)
{
    if (rc)
        return rc;
    return result == WXG_GUARD_LEASE_LOST ? WXG_ELEASELOST : 0;
}

typedef int (*ticket_op)(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results);

/* renew and complete: tickets in, one result per ticket out. */
static int ticket_batch(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results,
                        ticket_op op, const char *what)
{
    if (!g || (n > 0 && (!t || !results)))
        return WXG_EINVAL;
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!wxg__guard_ticket_valid(&t[i]))
            return WXG_EINVAL;
    }
    if (!op)
        return not_available(g, what);
    return op(g, t, n, results);
}

int wxg_guard_renew_batch(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    return ticket_batch(g, t, n, results, g ? g->ops->renew_batch : NULL, "renew");
}

int wxg_guard_renew(wxg_guard_t *g, const wxg_guard_ticket_t *t)
{
    int res = 0;
    int rc = wxg_guard_renew_batch(g, t, 1, &res);
    return single_result(rc, res);
}

int wxg_guard_plugin_done_batch(wxg_guard_t *g, const wxg_guard_plugin_done_t *items, size_t n,
                                int *results)
{
    if (!g || (n > 0 && (!items || !results)))
        return WXG_EINVAL;
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!wxg__guard_plugin_name_valid(items[i].plugin) ||
            items[i].result_len > WXG_GUARD_RESULT_MAX ||
            (items[i].result_len > 0 && !items[i].result))
            return WXG_EINVAL;
    }
    if (!g->ops->plugin_done_batch)
        return not_available(g, "plugin_done");
    for (size_t i = 0; i < n; i++) {
        if (!wxg__guard_ticket_valid(items[i].ticket))
            return WXG_EINVAL;
    }
    return g->ops->plugin_done_batch(g, items, n, results);
}

int wxg_guard_plugin_done(wxg_guard_t *g, const wxg_guard_ticket_t *t, const char *plugin,
                          const void *result, size_t result_len)
{
    wxg_guard_plugin_done_t it = {
        .ticket = t, .plugin = plugin, .result = result, .result_len = result_len};
    int res = 0;
    int rc = wxg_guard_plugin_done_batch(g, &it, 1, &res);
    return single_result(rc, res);
}

int wxg_guard_complete_batch(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    return ticket_batch(g, t, n, results, g ? g->ops->complete_batch : NULL, "complete");
}

int wxg_guard_complete(wxg_guard_t *g, const wxg_guard_ticket_t *t, int *already_done)
{
    int res = 0;
    int rc = wxg_guard_complete_batch(g, t, 1, &res);
    rc = single_result(rc, res);
    if (rc == 0 && already_done)
        *already_done = res == WXG_GUARD_ALREADY_DONE;
    return rc;
}

int wxg_guard_fail_batch(wxg_guard_t *g, const wxg_guard_failure_t *items, size_t n, int *results)
{
    if (!g || (n > 0 && (!items || !results)))
        return WXG_EINVAL;
    if (n == 0)
        return 0;
    if (!g->ops->fail_batch)
        return not_available(g, "fail");
    for (size_t i = 0; i < n; i++) {
        if (!wxg__guard_ticket_valid(items[i].ticket))
            return WXG_EINVAL;
    }
    return g->ops->fail_batch(g, items, n, results);
}

int wxg_guard_fail(wxg_guard_t *g, const wxg_guard_ticket_t *t, const char *reason,
                   uint32_t attempts)
{
    wxg_guard_failure_t it = {.ticket = t, .reason = reason, .attempts = attempts};
    int res = 0;
    int rc = wxg_guard_fail_batch(g, &it, 1, &res);
    return single_result(rc, res);
}

/* ---------------------------------------------------------------------------------------------
 * Administration: checks, then dispatch
 */

void wxg_guard_record_free(wxg_guard_record_t *r)
{
    if (!r)
        return;
    free(r->fail_reason);
    free(r->finished);
    free(r->done_bucket);
    free(r->record_key);
    free(r->msg_key);
    free(r);
}

int wxg_guard_inspect(wxg_guard_t *g, const char *key, size_t key_len,
                      const unsigned char *payload_hash, wxg_guard_record_t **out)
{
    if (!g || !out || !key || key_len == 0)
        return WXG_EINVAL;
    if (!g->ops->inspect)
        return not_available(g, "inspect");
    return g->ops->inspect(g, key, key_len, payload_hash, out);
}

/* release, rearm and purge: one key in, one flag out (`flag` may be NULL). */
static int admin_flag(wxg_guard_t *g, const char *key, size_t key_len, int *flag,
                      int (*op)(wxg_guard_t *, const char *, size_t, int *), const char *what)
{
    if (!g || !key || key_len == 0)
        return WXG_EINVAL;
    if (!op)
        return not_available(g, what);
    int v = 0;
    int rc = op(g, key, key_len, &v);
    if (rc == 0 && flag)
        *flag = v;
    return rc;
}

int wxg_guard_release(wxg_guard_t *g, const char *key, size_t key_len, int *released)
{
    return admin_flag(g, key, key_len, released, g ? g->ops->release : NULL, "release");
}

int wxg_guard_rearm(wxg_guard_t *g, const char *key, size_t key_len, int *rearmed)
{
    return admin_flag(g, key, key_len, rearmed, g ? g->ops->rearm : NULL, "rearm");
}

int wxg_guard_purge(wxg_guard_t *g, const char *key, size_t key_len, int *purged)
{
    return admin_flag(g, key, key_len, purged, g ? g->ops->purge : NULL, "purge");
}

int wxg_guard_scan(wxg_guard_t *g, uint64_t *cursor, int count, wxg_guard_scan_fn fn, void *arg)
{
    if (!g || !cursor || !fn)
        return WXG_EINVAL;
    if (!g->ops->scan)
        return not_available(g, "scan");
    return g->ops->scan(g, cursor, count, fn, arg);
}

int wxg_guard_ping(wxg_guard_t *g)
{
    if (!g)
        return WXG_EINVAL;
    if (!g->ops->ping)
        return not_available(g, "ping");
    return g->ops->ping(g);
}

int wxg_guard_describe_layout(const wxg_guard_t *g, char *buf, size_t size)
{
    if (!g || !buf || size == 0)
        return WXG_EINVAL;
    if (!g->ops->describe_layout)
        return WXG_ESTATE;
    return g->ops->describe_layout(g, buf, size);
}
