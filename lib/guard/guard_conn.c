/*
 * DESIGN: the guard's Redis connection, shared by the Redis designs (native, Lua, naive).
 *
 * Purpose: one connection per handle to the Redis primary (lib/rconn.c: TCP or a Unix socket,
 * optionally TLS, deadlines on every step), or against a Redis Cluster one cluster client
 * (lib/rcluster.c: a connection per primary), made ready for the designs: connect, then in one
 * round trip AUTH, SELECT and CLIENT SETNAME, in Sentinel mode discovery of the primary and a
 * ROLE check, SCRIPT LOAD of every script, the check of the layout stamp (lib/guard/lua/layout.lua)
 * that keeps guards with different DONE-marker geometries off one prefix, and a TIME sample of
 * the server's clock. The stamp is refreshed now and then so that it outlives every marker.
 *
 * Threads: the handle's thread only; no locks. The state (wxg__guard_redis_t) belongs to one
 * handle.
 *
 * Failure modes. A connection is dead after any I/O error or timeout: it is freed at once and
 * the next call reconnects (immediately the first time, then with capped, jittered backoff;
 * calls made during the backoff fail fast with WXG_ECONN). A pipeline that fails part-way
 * reports how many replies arrived; the commands after those have an unknown outcome, which
 * the designs treat as a timeout, never as done. A connection the server closed while it was
 * idle (restart, idle timeout) is noticed before the next call is sent and replaced at once,
 * so that call does not fail. A reconnect reloads the scripts. A READONLY answer (the server
 * was demoted by a failover) drops the connection so that the next call connects again, in
 * Sentinel mode after asking the Sentinels again. The passwords are only ever sent in AUTH and
 * are wiped on destroy, with the TLS key's pass phrase; error texts carry Redis's reply, which
 * never contains them.
 */
#include "guard_conn_int.h"

#include "clock_int.h"
#include "err_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const script_src[WXG__S_COUNT] = {
    wxg__lua_claim, wxg__lua_renew,   wxg__lua_plugin_done, wxg__lua_complete,
    wxg__lua_fail,  wxg__lua_inspect, wxg__lua_release,     wxg__lua_layout,
    wxg__lua_rearm, wxg__lua_purge,   wxg__lua_peek,        wxg__lua_repair,
};

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void free_secret(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}
static int starts_with(const char *s, size_t len, const char *word)
{
    size_t w = strlen(word);
    return len >= w && memcmp(s, word, w) == 0;
}

int wxg__guard_classify_error(const char *str, size_t len)
{
    if (!str)
        return WXG_EREDIS;
    if (starts_with(str, len, "NOSCRIPT"))
        return 1;
    return wxg__rconn_refusal_code(str, len);
}

/* The code a call fails with for an error reply: WXG_EAUTH for authentication and ACL
 * refusals, WXG_EREDIS for the rest (NOSCRIPT included, where it is not retried). */
int wxg__guard_refusal_code(const redisReply *r)
{
    return wxg__rconn_refusal_code(r->str, r->len);
}

static void stats_add(wxg__rcluster_stats_t *a, const wxg__rcluster_stats_t *b)
{
    a->moved += b->moved;
    a->ask += b->ask;
    a->tryagain += b->tryagain;
    a->clusterdown += b->clusterdown;
    a->refreshes += b->refreshes;
    a->node_errors += b->node_errors;
}

/* Copies the cluster client's counters (and those of the clients before it) to the handle's. */
static void cluster_sync_stats(wxg__guard_redis_t *rg)
{
    wxg__rcluster_stats_t s = rg->cluster_base, now;
    if (rg->cluster) {
        wxg__rcluster_get_stats(rg->cluster, &now);
        stats_add(&s, &now);
    }
    if (!rg->stats)
        return;
    rg->stats->cluster_moved = s.moved;
    rg->stats->cluster_ask = s.ask;
    rg->stats->cluster_tryagain = s.tryagain;
    rg->stats->cluster_clusterdown = s.clusterdown;
    rg->stats->cluster_refreshes = s.refreshes;
    rg->stats->cluster_node_errors = s.node_errors;
}

void wxg__guard_conn_drop(wxg__guard_redis_t *rg)
{
    wxg__rconn_free(rg->conn);
    rg->conn = NULL;
    if (rg->cluster) {
        wxg__rcluster_stats_t now;
        wxg__rcluster_get_stats(rg->cluster, &now);
        stats_add(&rg->cluster_base, &now);
        wxg__rcluster_free(rg->cluster);
        rg->cluster = NULL;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Redis Cluster: routing by key
 */

static int word_is(const char *s, size_t len, const char *word)
{
    return len == strlen(word) && strncasecmp(s, word, len) == 0;
}

/* The slot a command goes to (wxg__guard_cmd_t says how), or -1 for a command without a key. */
static int cmd_slot(const wxg__guard_cmd_t *c)
{
    if (c->argc >= 4 &&
        (word_is(c->argv[0], c->lens[0], "EVALSHA") || word_is(c->argv[0], c->lens[0], "EVAL") ||
         word_is(c->argv[0], c->lens[0], "EVALSHA_RO") ||
         word_is(c->argv[0], c->lens[0], "EVAL_RO") || word_is(c->argv[0], c->lens[0], "FCALL") ||
         word_is(c->argv[0], c->lens[0], "FCALL_RO"))) {
        char nk[16];
        size_t l = c->lens[2] < sizeof nk ? c->lens[2] : sizeof nk - 1;
        memcpy(nk, c->argv[2], l);
        nk[l] = '\0';
        if (strtol(nk, NULL, 10) > 0)
            return (int)wxg__rcluster_slot(c->argv[3], c->lens[3]);
        return -1;
    }
    if (c->argc >= 2)
        return (int)wxg__rcluster_slot(c->argv[1], c->lens[1]);
    return -1;
}

/* A WAIT numreplicas timeout: *replicas and *timeout_ms set. */
static int is_wait(const wxg__guard_cmd_t *c, int *replicas, int *timeout_ms)
{
    if (c->argc != 3 || !word_is(c->argv[0], c->lens[0], "WAIT") || c->lens[1] > 10 ||
        c->lens[2] > 10)
        return 0;
    char a[12], b[12];
    memcpy(a, c->argv[1], c->lens[1]);
    a[c->lens[1]] = '\0';
    memcpy(b, c->argv[2], c->lens[2]);
    b[c->lens[2]] = '\0';
    *replicas = (int)strtol(a, NULL, 10);
    *timeout_ms = (int)strtol(b, NULL, 10);
    return 1;
}

/* The pipeline in cluster mode: each command to its slot's primary; a trailing WAIT becomes the
 * cluster client's WAIT on every primary written to, answered with the fewest acknowledgements.
 * The replies that form an unbroken prefix are kept (*got); those after the first command
 * without a reply are dropped, as a single connection's failure would leave them unknown. */
static int cluster_exchange(wxg__guard_redis_t *rg, const wxg__guard_cmd_t *cmds, size_t n,
                            int extra_ms, redisReply **replies, size_t *got, char *errstr,
                            size_t errstr_size)
{
    *got = 0;
    if (!rg->cluster) {
        wxg__errf(errstr, errstr_size, "Redis Cluster: not connected");
        return WXG_ECONN;
    }
    int wait = 0, wait_ms = 0;
    size_t m = n > 0 && is_wait(&cmds[n - 1], &wait, &wait_ms) ? n - 1 : n;
    wxg__rccmd_t *rc = malloc((m ? m : 1) * sizeof *rc);
    int *codes = malloc((m ? m : 1) * sizeof *codes);
    if (!rc || !codes) {
        free(rc);
        free(codes);
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    for (size_t i = 0; i < m; i++)
        rc[i] = (wxg__rccmd_t){cmds[i].argc, cmds[i].argv, cmds[i].lens, cmd_slot(&cmds[i])};
    long long acks = 0;
    int code =
        wxg__rcluster_run(rg->cluster, rc, m, rg->conf.command_timeout_ms + (m < n ? 0 : extra_ms),
                          wait, wait_ms, replies, codes, &acks, errstr, errstr_size);
    size_t k = 0;
    while (k < m && (codes[k] == 0 || codes[k] == WXG_EREPLICAS))
        k++;
    if (k == m) {
        code = 0;
        if (m < n) {
            /* The WAIT's answer, as one server would give it. */
            redisReply *w = calloc(1, sizeof *w);
            if (!w) {
                code = WXG_ENOMEM;
                wxg__errf(errstr, errstr_size, "out of memory");
            } else {
                w->type = REDIS_REPLY_INTEGER;
                w->integer = acks;
                replies[k++] = w;
            }
        }
    } else {
        for (size_t i = k; i < m; i++) {
            if (replies[i])
                freeReplyObject(replies[i]);
            replies[i] = NULL;
        }
        /* Never run because the deadline came during redirections: for the caller a timeout. */
        if (code == WXG_EBUSY || code == 0 || code == WXG_EREPLICAS)
            code = WXG_ETIMEDOUT;
    }
    *got = k;
    free(rc);
    free(codes);
    cluster_sync_stats(rg);
    return code;
}

/* Sends one command and reads its reply on the fresh connection (connect time only). On an I/O
 * error the connection is dropped. In cluster mode the command goes to its key's primary. */
int wxg__guard_conn_command(wxg__guard_redis_t *rg, int argc, const char **argv, const size_t *lens,
                            redisReply **out, char *errstr, size_t errstr_size)
{
    if (rg->cluster_nodes) {
        wxg__guard_cmd_t cmd = {argc, argv, lens};
        size_t got = 0;
        return cluster_exchange(rg, &cmd, 1, 0, out, &got, errstr, errstr_size);
    }
    int rc = wxg__rconn_command(rg->conn, rg->conf.command_timeout_ms, argc, argv, lens, out,
                                errstr, errstr_size);
    if (rc)
        wxg__guard_conn_drop(rg);
    return rc;
}

int wxg__guard_conn_pipeline(wxg__guard_redis_t *rg, const wxg__guard_cmd_t *cmds, size_t n,
                             int extra_ms, redisReply **replies, size_t *got)
{
    size_t k = 0;
    int rc = 0;
    if (rg->cluster_nodes) {
        rc = cluster_exchange(rg, cmds, n, extra_ms, replies, &k, rg->last_error,
                              rg->last_error_size);
        if (rc == 0)
            rg->stats->round_trips++;
        if (got)
            *got = k;
        return rc;
    }
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = wxg__rconn_append(rg->conn, cmds[i].argc, cmds[i].argv, cmds[i].lens);
    if (rc)
        wxg__guard_set_error(rg->handle, "Redis: out of memory formatting a command");
    else
        rc = wxg__rconn_exchange(rg->conn, rg->conf.command_timeout_ms + extra_ms, replies, &k,
                                 rg->last_error, rg->last_error_size);
    if (rc)
        wxg__guard_conn_drop(rg);
    else
        rg->stats->round_trips++;
    if (got)
        *got = k;
    return rc;
}

/* What SCRIPT LOAD answered on the primaries of a cluster. */
typedef struct script_load {
    char sha[41];
    int refused;
    char why[200];
} script_load;

static int script_loaded(void *arg, int node, const char *addr, const redisReply *r)
{
    (void)node;
    script_load *sl = arg;
    if (r->type == REDIS_REPLY_STRING && r->len == 40) {
        memcpy(sl->sha, r->str, 40);
        sl->sha[40] = '\0';
    } else if (!sl->refused) {
        sl->refused = r->type == REDIS_REPLY_ERROR ? wxg__guard_refusal_code(r) : WXG_EREDIS;
        snprintf(sl->why, sizeof sl->why, "SCRIPT LOAD refused by %s: %.*s", addr,
                 r->type == REDIS_REPLY_ERROR ? (int)(r->len > 120 ? 120 : r->len) : 0,
                 r->type == REDIS_REPLY_ERROR ? r->str : "");
    }
    return 0;
}

/* Loads every script on every primary of the cluster (a promoted replica starts with an empty
 * script cache). A primary that cannot be reached now is skipped: a NOSCRIPT from it later
 * loads the scripts again. Fails when a primary refuses, or when none answered. */
static int cluster_load_scripts(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size)
{
    for (int i = 0; i < WXG__S_COUNT; i++) {
        const char *argv[3] = {"SCRIPT", "LOAD", script_src[i]};
        size_t lens[3] = {6, 4, strlen(script_src[i])};
        script_load sl = {.sha = ""};
        char why[512] = "";
        int rc = wxg__rcluster_each_primary(rg->cluster, 3, argv, lens, script_loaded, &sl, why,
                                            sizeof why);
        cluster_sync_stats(rg);
        if (sl.refused) {
            wxg__errf(errstr, errstr_size, "%s", sl.why);
            return sl.refused;
        }
        if (!sl.sha[0]) {
            wxg__errf(errstr, errstr_size, "%s", why);
            return rc ? rc : WXG_EREDIS;
        }
        memcpy(rg->sha[i], sl.sha, sizeof sl.sha);
    }
    return 0;
}

int wxg__guard_conn_load_scripts(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size)
{
    if (rg->cluster_nodes)
        return cluster_load_scripts(rg, errstr, errstr_size);
    for (int i = 0; i < WXG__S_COUNT; i++) {
        const char *argv[3] = {"SCRIPT", "LOAD", script_src[i]};
        size_t lens[3] = {6, 4, strlen(script_src[i])};
        redisReply *r = NULL;
        int rc = wxg__guard_conn_command(rg, 3, argv, lens, &r, errstr, errstr_size);
        if (rc)
            return rc;
        if (r->type != REDIS_REPLY_STRING || r->len != 40) {
            rc = r->type == REDIS_REPLY_ERROR ? wxg__guard_refusal_code(r) : WXG_EREDIS;
            wxg__errf(errstr, errstr_size, "SCRIPT LOAD refused: %.*s",
                      r->type == REDIS_REPLY_ERROR ? (int)r->len : 0,
                      r->type == REDIS_REPLY_ERROR ? r->str : "");
            freeReplyObject(r);
            return rc;
        }
        memcpy(rg->sha[i], r->str, 40);
        rg->sha[i][40] = '\0';
        freeReplyObject(r);
    }
    return 0;
}

/* Stamps or checks the compact-marker layout (see lib/guard/lua/layout.lua). */
static int check_stamp(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size)
{
    char ttl[32];
    snprintf(ttl, sizeof ttl, "%lld", (long long)(rg->geom.retention_ms + 2 * rg->geom.bucket_ms));
    const char *argv[] = {"EVALSHA", rg->sha[WXG__S_LAYOUT], "1", rg->layout_key, rg->stamp, ttl};
    size_t lens[] = {7, 40, 1, strlen(rg->layout_key), strlen(rg->stamp), strlen(ttl)};
    redisReply *r = NULL;
    int rc = wxg__guard_conn_command(rg, 6, argv, lens, &r, errstr, errstr_size);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = wxg__guard_refusal_code(r);
        wxg__errf(errstr, errstr_size, "layout check refused: %.*s", (int)r->len, r->str);
    } else if (r->type != REDIS_REPLY_STRING) {
        rc = WXG_EREDIS;
        wxg__errf(errstr, errstr_size, "layout check: unexpected reply");
    } else if (r->len < sizeof WXG__LAYOUT_VERSION ||
               memcmp(r->str, WXG__LAYOUT_VERSION " ", sizeof WXG__LAYOUT_VERSION) != 0) {
        /* Another layout version wrote this prefix: its records and markers have another shape,
         * so this version can neither read them nor safely write beside them. */
        rc = WXG_ECONFIG;
        wxg__errf(
            errstr, errstr_size,
            "the keys under prefix %s were written with DONE-marker layout \"%.*s\"; this "
            "version uses layout %s and cannot read them. Stop every guard on that prefix and "
            "start this version with a new prefix (messages completed under the old prefix are "
            "then not recognised as duplicates), or delete %s once every old key has expired",
            rg->prefix, (int)(r->len > 100 ? 100 : r->len), r->str, WXG__LAYOUT_VERSION,
            rg->layout_key);
    } else if (r->len != strlen(rg->stamp) || memcmp(r->str, rg->stamp, r->len) != 0) {
        rc = WXG_ECONFIG;
        /* The stored selector part says which setting gives it back. */
        int stored_auto = strstr(r->str, "sel=auto") != NULL; /* hiredis ends it with NUL */
        wxg__errf(errstr, errstr_size,
                  "the DONE-marker layout stored under %s is \"%.*s\" but this configuration "
                  "gives \"%s\"; markers would not be found. Keep the stored geometry (%s, "
                  "and the same shard_bits and done_bucket_ms) or use a new prefix",
                  rg->layout_key, (int)(r->len > 100 ? 100 : r->len), r->str, rg->stamp,
                  stored_auto ? "guard.done.expected.rate = auto, done_selector_bits 0"
                              : "pin done_selector_bits to the stored sel");
    } else {
        rg->stamp_checked_ms = wxg__mono_ms();
    }
    freeReplyObject(r);
    return rc;
}

/* Reads a {host, port} answer into host (size bytes) and *port; 0 when it is not one. */
static int primary_addr(const redisReply *r, char *host, size_t size, int *port)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[0]->len == 0 || r->element[0]->len >= size)
        return 0;
    char *end = NULL;
    long p = strtol(r->element[1]->str, &end, 10);
    if (end == r->element[1]->str || *end != '\0' || p < 1 || p > 65535)
        return 0;
    memcpy(host, r->element[0]->str, r->element[0]->len);
    host[r->element[0]->len] = '\0';
    *port = (int)p;
    return 1;
}

/* Asks the Sentinel on `c` (a, for the error texts) for the primary's address and keeps it in
 * cur_host/cur_port. */
static int sentinel_query(wxg__guard_redis_t *rg, wxg__rconn_t *c, const wxg__guard_sentinel_t *a,
                          char *errstr, size_t errstr_size)
{
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", rg->sentinel_master};
    size_t lens[3] = {8, 23, strlen(rg->sentinel_master)};
    redisReply *r = NULL;
    char why[256];
    int rc = wxg__rconn_command(c, rg->conf.command_timeout_ms, 3, argv, lens, &r, why, sizeof why);
    if (rc) {
        wxg__errf(errstr, errstr_size, "asking for the primary: %s", why);
        return rc;
    }
    if (r->type == REDIS_REPLY_NIL) {
        rc = WXG_ECONN; /* it may learn of the primary later; another Sentinel may know it */
        wxg__errf(errstr, errstr_size, "Sentinel %s:%d knows no primary named '%s'", a->host,
                  a->port, rg->sentinel_master);
    } else if (r->type == REDIS_REPLY_ERROR) {
        rc = wxg__guard_refusal_code(r);
        wxg__errf(errstr, errstr_size,
                  "Sentinel %s:%d refused SENTINEL get-master-addr-by-name: %.*s", a->host, a->port,
                  (int)(r->len > 160 ? 160 : r->len), r->str);
    } else if (!primary_addr(r, rg->cur_host, sizeof rg->cur_host, &rg->cur_port)) {
        rc = WXG_EREDIS;
        wxg__errf(errstr, errstr_size, "Sentinel %s:%d gave a malformed primary address", a->host,
                  a->port);
    }
    freeReplyObject(r);
    return rc;
}

/* Connects to Sentinel `i` (over TLS and with AUTH when configured) and asks it for the
 * primary's address, kept in cur_host/cur_port. */
static int sentinel_ask(wxg__guard_redis_t *rg, int i, char *errstr, size_t errstr_size)
{
    const wxg__guard_sentinel_t *a = &rg->sent[i];
    wxg__rtls_conf_t tls = rg->tls;
    tls.server_name = NULL; /* each Sentinel is verified under its own name */
    wxg__rconn_opts_t o = {.host = a->host,
                           .port = a->port,
                           .connect_timeout_ms = rg->conf.connect_timeout_ms,
                           .tls = rg->conf.sentinel_tls ? &tls : NULL,
                           .role = "Sentinel"};
    int rc = 0;
    char who[300];
    snprintf(who, sizeof who, "Sentinel %s:%d", a->host, a->port);
    wxg__rconn_t *c = wxg__rconn_connect(&o, &rc, errstr, errstr_size);
    if (!c)
        return rc;
    rc = wxg__rconn_hello(c, rg->conf.command_timeout_ms, who, rg->sentinel_user,
                          rg->sentinel_password, 0, NULL, errstr, errstr_size);
    if (rc == 0)
        rc = sentinel_query(rg, c, a, errstr, errstr_size);
    wxg__rconn_free(c);
    return rc;
}

/* Finds the primary through the Sentinels, starting with the one that answered last; the error
 * of the last one asked when none could tell. */
static int sentinel_locate(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size)
{
    int rc = WXG_ECONN;
    for (int k = 0; k < rg->nsent; k++) {
        int i = (rg->sent_next + k) % rg->nsent;
        rc = sentinel_ask(rg, i, errstr, errstr_size);
        if (rc == 0) {
            rg->sent_next = i;
            rg->stats->sentinel_lookups++;
            return 0;
        }
    }
    return rc;
}

/* In Sentinel mode, checks that the server the Sentinels named still is the primary: during a
 * failover they may name one that has not been promoted yet, or one already demoted. */
static int check_role(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size)
{
    const char *argv[1] = {"ROLE"};
    size_t lens[1] = {4};
    redisReply *r = NULL;
    int rc = wxg__guard_conn_command(rg, 1, argv, lens, &r, errstr, errstr_size);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = wxg__guard_refusal_code(r);
        wxg__errf(errstr, errstr_size, "ROLE on %s:%d failed: %.*s", rg->cur_host, rg->cur_port,
                  (int)(r->len > 160 ? 160 : r->len), r->str);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
               r->element[0]->type != REDIS_REPLY_STRING ||
               strcmp(r->element[0]->str, "master") != 0) {
        rc = WXG_ECONN;
        wxg__errf(errstr, errstr_size,
                  "%s:%d, named primary '%s' by the Sentinels, is not a primary (a failover in "
                  "progress?)",
                  rg->cur_host, rg->cur_port, rg->sentinel_master);
    }
    freeReplyObject(r);
    return rc;
}

/* Samples the server's clock: TIME, sent after the monotonic time is read. */
static int clock_sample(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size)
{
    const char *argv[1] = {"TIME"};
    size_t lens[1] = {4};
    redisReply *r = NULL;
    int64_t mono = wxg__mono_us();
    int rc = wxg__guard_conn_command(rg, 1, argv, lens, &r, errstr, errstr_size);
    if (rc)
        return rc;
    long long s = 0, us = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[1]->type == REDIS_REPLY_STRING) {
        s = strtoll(r->element[0]->str, NULL, 10);
        us = strtoll(r->element[1]->str, NULL, 10);
    }
    if (s <= 0 || us < 0 || us >= 1000000) {
        rc = r->type == REDIS_REPLY_ERROR ? wxg__guard_refusal_code(r) : WXG_EREDIS;
        wxg__errf(errstr, errstr_size, "TIME: unexpected reply");
    } else {
        rg->clock_srv_us = (int64_t)s * 1000000 + us;
        rg->clock_mono_us = mono;
    }
    freeReplyObject(r);
    return rc;
}

int wxg__guard_clock_sample(wxg__guard_redis_t *rg)
{
    return clock_sample(rg, rg->last_error, rg->last_error_size);
}

int64_t wxg__guard_clock_us(const wxg__guard_redis_t *rg)
{
    return rg->clock_srv_us + (wxg__mono_us() - rg->clock_mono_us);
}

/* Opens the connection (TCP or Unix, TLS when configured) to `host`:`port` or the Unix path,
 * then AUTH, SELECT and CLIENT SETNAME in one round trip. */
static int open_conn(wxg__guard_redis_t *rg, const char *host, int port, char *errstr,
                     size_t errstr_size)
{
    wxg__rconn_opts_t o = {.host = host,
                           .port = port,
                           .unix_path = rg->unix_path,
                           .connect_timeout_ms = rg->conf.connect_timeout_ms,
                           .tls = rg->conf.tls ? &rg->tls : NULL};
    int rc = 0;
    rg->conn = wxg__rconn_connect(&o, &rc, errstr, errstr_size);
    if (!rg->conn)
        return rc;
    char who[300];
    if (rg->unix_path)
        snprintf(who, sizeof who, "Redis %s", rg->unix_path);
    else
        snprintf(who, sizeof who, "Redis %s:%d", host, port);
    return wxg__rconn_hello(rg->conn, rg->conf.command_timeout_ms, who, rg->user, rg->password,
                            rg->conf.db, rg->client_name, errstr, errstr_size);
}

/* Cluster mode: reads the slot map from one of the configured nodes; the nodes' connections
 * (TLS, AUTH, CLIENT SETNAME on each) are made as commands need them. */
static int cluster_open(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size)
{
    wxg__rcluster_conf_t cc = {.seeds = rg->cluster_nodes,
                               .tls = rg->conf.tls ? &rg->tls : NULL,
                               .user = rg->user,
                               .password = rg->password,
                               .client_name = rg->client_name,
                               .connect_timeout_ms = rg->conf.connect_timeout_ms,
                               .command_timeout_ms = rg->conf.command_timeout_ms,
                               .reconnect_min_ms = rg->conf.reconnect_min_ms,
                               .reconnect_max_ms = rg->conf.reconnect_max_ms};
    int rc = 0;
    rg->cluster = wxg__rcluster_new(&cc, &rc, errstr, errstr_size);
    return rg->cluster ? 0 : rc;
}

/* The adaptive layout of the current time bucket, read (or stamped) now rather than by the first
 * call: once per time bucket and handle (lib/guard/guard_geom.c). A failure is left for that call.
 */
static void layout_prefetch(wxg__guard_redis_t *rg)
{
    if (!rg->geom.adaptive)
        return;
    int64_t now = wxg__guard_clock_us(rg) / 1000, width = rg->geom.bucket_ms;
    int64_t tb = now / width;
    int sel = 0;
    if (wxg__guard_sel(rg, tb, 1, &sel) == 0)
        wxg__guard_sel(rg, tb - 1, 0, &sel);
}

/* Connects, authenticates, selects the database, checks the role (Sentinel mode), loads the
 * scripts and checks the stamp. On failure nothing stays connected. */
static int guard_connect(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size)
{
    if (rg->cluster_nodes) {
        int rc = cluster_open(rg, errstr, errstr_size);
        if (rc == 0)
            rc = wxg__guard_conn_load_scripts(rg, errstr, errstr_size);
        if (rc == 0)
            rc = check_stamp(rg, errstr, errstr_size);
        /* One primary's clock for all: the primaries' clocks agree within the margin a time
         * window keeps (NTP, docs/guard.md §4). */
        if (rc == 0)
            rc = clock_sample(rg, errstr, errstr_size);
        if (rc) {
            wxg__guard_conn_drop(rg);
            cluster_sync_stats(rg);
            return rc;
        }
        rg->stats->connects++;
        layout_prefetch(rg);
        return 0;
    }
    const char *host = rg->host;
    int port = rg->conf.port;
    if (rg->nsent > 0) {
        int rc = sentinel_locate(rg, errstr, errstr_size);
        if (rc)
            return rc;
        host = rg->cur_host;
        port = rg->cur_port;
    }
    int rc = open_conn(rg, host, port, errstr, errstr_size);
    if (rc == 0 && rg->nsent > 0)
        rc = check_role(rg, errstr, errstr_size);
    if (rc == 0)
        rc = wxg__guard_conn_load_scripts(rg, errstr, errstr_size);
    if (rc == 0)
        rc = check_stamp(rg, errstr, errstr_size);
    if (rc == 0)
        rc = clock_sample(rg, errstr, errstr_size);
    if (rc) {
        wxg__guard_conn_drop(rg);
        return rc;
    }
    rg->stats->connects++;
    layout_prefetch(rg);
    return 0;
}

/* Makes sure there is a live connection: reconnects when the backoff allows, else fails fast. */
int wxg__guard_conn_ensure(wxg__guard_redis_t *rg)
{
    int64_t now = wxg__mono_ms();
    /* Reconnecting now, before anything is sent, turns what would be a failed call with an
     * unknown outcome into a normal one. */
    if (rg->conn && wxg__rconn_idle_closed(rg->conn)) {
        wxg__guard_conn_drop(rg);
        wxg__rbackoff_reset(&rg->backoff);
    }
    /* A cluster client replaces each node's closed connection itself; its failures are per
     * node, so it stays. */
    if (rg->cluster)
        wxg__rcluster_check_idle(rg->cluster);
    if (rg->conn || rg->cluster) {
        /* Refresh the layout stamp now and then so that it outlives every marker. */
        int rc = 0;
        if ((wxg__mono_us() - rg->clock_mono_us) / 1000 >= WXG__CLOCK_RESAMPLE_MS)
            rc = clock_sample(rg, rg->last_error, rg->last_error_size);
        int64_t every = rg->geom.bucket_ms < 3600000 ? rg->geom.bucket_ms : 3600000;
        if (rc == 0 && now - rg->stamp_checked_ms >= every)
            rc = check_stamp(rg, rg->last_error, rg->last_error_size);
        return rc;
    }
    int64_t wait = wxg__rbackoff_wait(&rg->backoff, now);
    if (wait > 0) {
        wxg__guard_set_error(rg->handle, "Redis unreachable; next reconnect attempt in %lld ms",
                             (long long)wait);
        return WXG_ECONN;
    }
    int rc = guard_connect(rg, rg->last_error, rg->last_error_size);
    if (rc == 0)
        wxg__rbackoff_reset(&rg->backoff);
    else
        wxg__rbackoff_failed(&rg->backoff, wxg__mono_ms());
    return rc;
}

/* Parses one "host:port" or "[v6 address]:port" of `len` bytes into `a`. 0 or -1. */
static int parse_one_sentinel(const char *p, size_t len, wxg__guard_sentinel_t *a)
{
    const char *h = p, *port_at;
    size_t hl;
    if (len > 0 && p[0] == '[') {
        const char *close = memchr(p, ']', len);
        if (!close || (size_t)(close - p) + 1 >= len || close[1] != ':')
            return -1;
        h = p + 1;
        hl = (size_t)(close - h);
        port_at = close + 2;
    } else {
        const char *colon = memchr(p, ':', len);
        if (!colon || memchr(colon + 1, ':', len - (size_t)(colon - p) - 1))
            return -1; /* an IPv6 address needs brackets */
        hl = (size_t)(colon - p);
        port_at = colon + 1;
    }
    size_t pl = len - (size_t)(port_at - p);
    char digits[8];
    if (hl == 0 || hl >= sizeof a->host || memchr(h, ' ', hl) || pl == 0 || pl >= sizeof digits)
        return -1;
    memcpy(digits, port_at, pl);
    digits[pl] = '\0';
    char *e = NULL;
    long port = strtol(digits, &e, 10);
    if (*e != '\0' || port < 1 || port > 65535)
        return -1;
    memcpy(a->host, h, hl);
    a->host[hl] = '\0';
    a->port = (int)port;
    return 0;
}

/* Parses "host:port[,host:port...]" (blanks around entries allowed) into rg->sent. 0 or -1. */
static int parse_sentinels(wxg__guard_redis_t *rg, const char *list)
{
    for (const char *p = list;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && *p == ' ') {
            p++;
            len--;
        }
        while (len > 0 && p[len - 1] == ' ')
            len--;
        if (rg->nsent == WXG_GUARD_SENTINELS_MAX ||
            parse_one_sentinel(p, len, &rg->sent[rg->nsent]))
            return -1;
        rg->nsent++;
        if (!end)
            return 0;
        p = end + 1;
    }
}
/* Copies the connection's strings; the configuration's own pointers are only borrowed. */
static int copy_strings(wxg__guard_redis_t *rg, const wxg_guard_conf_t *conf)
{
    rg->host = dup_or_null(conf->host ? conf->host : "127.0.0.1");
    rg->unix_path = dup_or_null(conf->unix_path);
    rg->user = dup_or_null(conf->user);
    rg->password = dup_or_null(conf->password);
    rg->prefix = dup_or_null(conf->prefix ? conf->prefix : "wxg:");
    rg->client_name = conf->client_name && *conf->client_name ? strdup(conf->client_name) : NULL;
    rg->cluster_nodes =
        conf->cluster_nodes && *conf->cluster_nodes ? strdup(conf->cluster_nodes) : NULL;
    if ((conf->cluster_nodes && *conf->cluster_nodes && !rg->cluster_nodes))
        return WXG_ENOMEM;
    if (!rg->host || (conf->unix_path && !rg->unix_path) || (conf->user && !rg->user) ||
        (conf->password && !rg->password) || !rg->prefix ||
        (conf->client_name && *conf->client_name && !rg->client_name))
        return WXG_ENOMEM;
    return 0;
}

/* Copies the TLS settings into rg->tls (the strings owned by rg). */
static int copy_tls(wxg__guard_redis_t *rg, const wxg_guard_conf_t *conf)
{
    wxg__rtls_conf_t *t = &rg->tls;
    t->verify = conf->tls_verify;
    t->ca_file = dup_or_null(conf->tls_ca_file);
    t->ca_path = dup_or_null(conf->tls_ca_path);
    t->cert_file = dup_or_null(conf->tls_cert_file);
    t->key_file = dup_or_null(conf->tls_key_file);
    t->key_password = dup_or_null(conf->tls_key_password);
    t->server_name = dup_or_null(conf->tls_server_name);
    if ((conf->tls_ca_file && !t->ca_file) || (conf->tls_ca_path && !t->ca_path) ||
        (conf->tls_cert_file && !t->cert_file) || (conf->tls_key_file && !t->key_file) ||
        (conf->tls_key_password && !t->key_password) || (conf->tls_server_name && !t->server_name))
        return WXG_ENOMEM;
    return 0;
}

/* Parses and copies the Sentinel settings (none: nothing to do). */
static int copy_sentinels(wxg__guard_redis_t *rg, const wxg_guard_conf_t *conf, char *errstr,
                          size_t errstr_size)
{
    if (!conf->sentinels || !*conf->sentinels)
        return 0;
    if (parse_sentinels(rg, conf->sentinels) != 0 || !conf->sentinel_master ||
        !*conf->sentinel_master || strlen(conf->sentinel_master) > 128) {
        wxg__errf(errstr, errstr_size,
                  "invalid Sentinel configuration: need 1..%d host:port entries and the "
                  "primary's name (at most 128 bytes)",
                  WXG_GUARD_SENTINELS_MAX);
        return WXG_ECONFIG;
    }
    rg->sentinel_master = strdup(conf->sentinel_master);
    rg->sentinel_user = dup_or_null(conf->sentinel_user);
    rg->sentinel_password = dup_or_null(conf->sentinel_password);
    if (!rg->sentinel_master || (conf->sentinel_user && !rg->sentinel_user) ||
        (conf->sentinel_password && !rg->sentinel_password)) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    free(rg->unix_path); /* the Sentinels name a TCP address */
    rg->unix_path = NULL;
    return 0;
}

int wxg__guard_redis_init(const wxg_guard_conf_t *conf, wxg__guard_redis_t **out, char *errstr,
                          size_t errstr_size)
{
    wxg__guard_redis_t *rg = calloc(1, sizeof *rg);
    if (!rg) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    rg->conf = *conf;
    int rc = wxg__guard_geom_compute(conf, &rg->geom, errstr, errstr_size);
    if (rc)
        goto fail;
    rc = copy_strings(rg, conf);
    if (rc == 0)
        rc = copy_tls(rg, conf);
    if (rc) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    rc = copy_sentinels(rg, conf, errstr, errstr_size);
    if (rc)
        goto fail;
    /* Only the parsed and copied forms are used after this call. */
    rg->conf.sentinels = NULL;
    rg->conf.sentinel_master = rg->sentinel_master;
    rg->conf.sentinel_user = rg->sentinel_user;
    rg->conf.sentinel_password = NULL;
    rg->conf.host = rg->host;
    rg->conf.unix_path = rg->unix_path;
    rg->conf.user = rg->user;
    rg->conf.password = NULL; /* only rg->password holds it */
    rg->conf.prefix = rg->prefix;
    rg->conf.client_name = rg->client_name;
    rg->conf.cluster_nodes = rg->cluster_nodes;
    if (rg->cluster_nodes)
        rg->conf.cluster = 1; /* one shard per script call: every call then has one slot */
    rg->conf.tls_ca_file = rg->tls.ca_file;
    rg->conf.tls_ca_path = rg->tls.ca_path;
    rg->conf.tls_cert_file = rg->tls.cert_file;
    rg->conf.tls_key_file = rg->tls.key_file;
    rg->conf.tls_key_password = NULL; /* only rg->tls holds it */
    rg->conf.tls_server_name = rg->tls.server_name;
    wxg__guard_geom_stamp(&rg->geom, rg->stamp, sizeof rg->stamp);
    snprintf(rg->layout_key, sizeof rg->layout_key, "%slayout", rg->prefix);
    wxg__rbackoff_init(&rg->backoff, rg->conf.reconnect_min_ms, rg->conf.reconnect_max_ms);
    *out = rg;
    return 0;

fail:
    wxg__guard_redis_free(rg);
    return rc;
}

wxg_guard_t *wxg__guard_redis_attach(wxg__guard_redis_t *rg, const wxg__guard_ops_t *ops, int *err,
                                     char *errstr, size_t errstr_size)
{
    int rc = 0;
    wxg_guard_t *g = wxg__guard_new_ops(ops, rg, &rg->conf, errstr, errstr_size);
    if (!g) {
        rc = WXG_ENOMEM;
        wxg__guard_redis_free(rg);
        goto out;
    }
    rg->handle = g;
    rg->stats = wxg__guard_stats(g);
    rg->last_error = wxg__guard_error_buf(g, &rg->last_error_size);
    rc = guard_connect(rg, errstr, errstr_size);
    if (rc) {
        wxg_guard_destroy(g); /* frees rg through ops->destroy */
        g = NULL;
    }
out:
    if (err)
        *err = rc;
    return g;
}

wxg_guard_t *wxg__guard_redis_new(const wxg_guard_conf_t *conf, const wxg__guard_ops_t *ops,
                                  int *err, char *errstr, size_t errstr_size)
{
    wxg__guard_redis_t *rg = NULL;
    int rc = wxg__guard_redis_init(conf, &rg, errstr, errstr_size);
    if (rc == 0 && (rc = wxg__guard_near_ns(rg)) != 0) {
        wxg__errf(errstr, errstr_size, "out of memory");
        wxg__guard_redis_free(rg);
    }
    if (rc) {
        if (err)
            *err = rc;
        return NULL;
    }
    return wxg__guard_redis_attach(rg, ops, err, errstr, errstr_size);
}

void wxg__guard_redis_free(wxg__guard_redis_t *rg)
{
    if (!rg)
        return;
    wxg__guard_conn_drop(rg);
    free(rg->host);
    free(rg->unix_path);
    free(rg->user);
    free_secret(rg->password);
    free(rg->prefix);
    free(rg->sentinel_master);
    free(rg->sentinel_user);
    free_secret(rg->sentinel_password);
    free(rg->client_name);
    free(rg->cluster_nodes);
    free((char *)rg->tls.ca_file);
    free((char *)rg->tls.ca_path);
    free((char *)rg->tls.cert_file);
    free((char *)rg->tls.key_file);
    free_secret((char *)rg->tls.key_password);
    free((char *)rg->tls.server_name);
    free(rg);
}

void wxg__guard_redis_destroy(wxg_guard_t *g)
{
    wxg__guard_redis_free(wxg__guard_impl(g));
}

/* An error reply saying the server is a read-only replica now (demoted by a failover, or a
 * host name that points elsewhere since): drop the connection, so that the next call connects
 * again (in Sentinel mode: asks the Sentinels again) instead of writing to it in vain. */
void wxg__guard_conn_note_refusal(wxg__guard_redis_t *rg, const redisReply *r)
{
    /* A script's error carries the command's own code first: "READONLY You can't write...". */
    if (r->type == REDIS_REPLY_ERROR && starts_with(r->str, r->len, "READONLY")) {
        rg->stats->demotions++;
        wxg__guard_conn_drop(rg);
    }
}
