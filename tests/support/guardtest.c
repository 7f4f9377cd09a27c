/*
 * DESIGN: helpers for the guard's integration tests (see guardtest.h). Single-threaded use by the
 * test's main thread; every failure is a cmocka failure with a message.
 */
#include "guardtest.h"

#include <stdarg.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void gt_conf(wxg_guard_conf_t *c, const char *host, int port, const char *tag, char *buf,
             size_t bufsize)
{
    unsigned r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
        r = (unsigned)getpid();
    snprintf(buf, bufsize, "t%d-%s-%08x:", (int)getpid(), tag, r);
    wxg_guard_conf_init(c);
    c->host = host;
    c->port = port;
    c->prefix = buf;
    c->connect_timeout_ms = 2000;
    c->command_timeout_ms = 2000;
    c->lease_ms = 10000;
    c->reconnect_min_ms = 10;
    c->reconnect_max_ms = 200;
    c->design = gt_design();
}

int gt_design(void)
{
    const char *d = getenv("WXG_TEST_GUARD_DESIGN");
    return d && strcmp(d, "lua") == 0 ? WXG_GUARD_DESIGN_LUA : WXG_GUARD_DESIGN_NATIVE;
}

wxg_guard_t *gt_open(const wxg_guard_conf_t *c)
{
    char err[256] = "";
    int rc = 0;
    wxg_guard_t *g = wxg_guard_new(c, &rc, err, sizeof err);
    if (!g)
        fail_msg("wxg_guard_new: %s (%s)", err, wxg_err_name(rc));
    return g;
}

redisContext *gt_redis(const char *host, int port, const char *password)
{
    struct timeval tv = {.tv_sec = 5, .tv_usec = 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (!c || c->err)
        fail_msg("connect %s:%d: %s", host, port, c ? c->errstr : "oom");
    redisSetTimeout(c, tv);
    if (password) {
        const char *argv[2] = {"AUTH", password};
        redisReply *r = gt_cmd(c, 2, argv);
        freeReplyObject(r);
    }
    return c;
}

redisReply *gt_cmd(redisContext *c, int argc, const char **argv)
{
    size_t lens[16];
    assert_true(argc <= 16);
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (!r)
        fail_msg("%s: %s", argv[0], c->errstr);
    return r;
}

size_t gt_scan(redisContext *c, const char *pattern, char ***keys)
{
    size_t n = 0, cap = 64;
    char **out = calloc(cap + 1, sizeof *out);
    assert_non_null(out);
    char cursor[32] = "0";
    for (int rounds = 0; rounds < 100000; rounds++) {
        const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
        redisReply *r = gt_cmd(c, 6, argv);
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *ks = r->element[1];
        for (size_t i = 0; i < ks->elements; i++) {
            if (n == cap) {
                cap *= 2;
                out = realloc(out, (cap + 1) * sizeof *out);
                assert_non_null(out);
            }
            out[n] = malloc(ks->element[i]->len + 1);
            assert_non_null(out[n]);
            memcpy(out[n], ks->element[i]->str, ks->element[i]->len);
            out[n][ks->element[i]->len] = '\0';
            n++;
        }
        freeReplyObject(r);
        if (strcmp(cursor, "0") == 0)
            break;
    }
    out[n] = NULL;
    *keys = out;
    return n;
}

void gt_free_keys(char **keys)
{
    if (!keys)
        return;
    for (size_t i = 0; keys[i]; i++)
        free(keys[i]);
    free(keys);
}

long long gt_pttl(redisContext *c, const char *key)
{
    const char *argv[2] = {"PTTL", key};
    redisReply *r = gt_cmd(c, 2, argv);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

size_t gt_count(redisContext *c, const char *pattern)
{
    char **keys = NULL;
    size_t n = gt_scan(c, pattern, &keys);
    gt_free_keys(keys);
    return n;
}

void gt_assert_fence_is_now(uint64_t fence)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    uint64_t diff = fence > now ? fence - now : now - fence;
    if (diff > 60000000u)
        fail_msg("fence %llu is not the server time in microseconds (now %llu)",
                 (unsigned long long)fence, (unsigned long long)now);
}

int gt_retriable(int rc)
{
    return rc == WXG_ECONN || rc == WXG_ETIMEDOUT || rc == WXG_EREDIS || rc == WXG_EREPLICAS;
}

void gt_acl_user(const char *host, int port, const char *user, const char *password,
                 const char *keys, const char *extra)
{
    /* The commands the guard needs: the same set as docs/guard.md §7. */
    static const char *const rules[] = {
        "+evalsha", "+script|load", "+ping", "+wait",           "+time",    "+hget",      "+hset",
        "+hsetnx",  "+hincrby",     "+hdel", "+hgetall",        "+pexpire", "+pexpireat", "+pttl",
        "+get",     "+set",         "+del",  "+client|setname", "+hlen",    "+hexists",
    };
    char pass[600], keyrule[300];
    snprintf(pass, sizeof pass, ">%s", password);
    snprintf(keyrule, sizeof keyrule, "~%s", keys);
    const char *argv[40] = {"ACL",   "SETUSER",       user,   "reset", "on", pass,
                            keyrule, "resetchannels", "-@all"};
    int argc = 9;
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        argv[argc++] = rules[i];
    if (extra)
        argv[argc++] = extra;
    size_t lens[40];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    redisContext *c = gt_redis(host, port, NULL);
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (!r)
        fail_msg("ACL SETUSER %s: %s", user, c->errstr);
    if (r->type != REDIS_REPLY_STATUS)
        fail_msg("ACL SETUSER %s: %s", user, r->str ? r->str : "unexpected reply");
    freeReplyObject(r);
    redisFree(c);
}

char *gt_tls_target(wxg_test_redis_t *srv, wxg_guard_conf_t *c)
{
    static char ca[600];
    const char *on = getenv("WXG_TEST_GUARD_TLS");
    if (!on || strcmp(on, "1") != 0)
        return NULL;
    char *pki = wxg_test_pki_make();
    if (!pki)
        fail_msg("cannot make the test certificates");
    if (wxg_test_redis_start_tls(srv, pki, "server", 0) != 0)
        fail_msg("cannot start a TLS redis-server");
    snprintf(ca, sizeof ca, "%s/ca.crt", pki);
    c->host = "127.0.0.1";
    c->port = srv->port;
    c->tls = 1;
    c->tls_ca_file = ca;
    return pki;
}

void gt_tls_target_stop(wxg_test_redis_t *srv, char *pki)
{
    if (!pki)
        return;
    wxg_test_redis_stop(srv);
    wxg_test_rmtree(pki);
    free(pki);
}

int gt_cluster_target(wxg_test_cluster_t *cl, wxg_guard_conf_t *c)
{
    const char *on = getenv("WXG_TEST_GUARD_CLUSTER");
    if (!on || strcmp(on, "1") != 0)
        return 0;
    if (wxg_test_cluster_start(cl, 3, 1) != 0)
        fail_msg("cannot start a Redis Cluster");
    c->cluster_nodes = cl->seeds;
    return 1;
}

void gt_cluster_target_stop(wxg_test_cluster_t *cl, int started)
{
    if (started)
        wxg_test_cluster_stop(cl);
}

void gt_claim_all(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n, wxg_guard_claim_t *out,
                  wxg_guard_ticket_t *t)
{
    assert_int_equal(wxg_guard_claim_batch(g, msgs, n, out), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(out[i].outcome, WXG_GUARD_CLAIMED);
        t[i] = out[i].ticket;
    }
}

void gt_assert_server(redisContext *c)
{
    const char *argv[2] = {"INFO", "server"};
    redisReply *r = gt_cmd(c, 2, argv);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    const char *bin = wxg_test_redis_server_bin();
    int want_valkey = strstr(bin, "valkey") != NULL;
    const char *v = strstr(r->str, "valkey_version:");
    const char *rv = strstr(r->str, "redis_version:");
    char line[64] = "";
    if (v || rv)
        sscanf(v ? v : rv, "%63[^\r\n]", line);
    print_message("server: %s (%s)\n", line, bin);
    if (want_valkey != (v != NULL))
        fail_msg("the run asked for %s, the server says %s", bin, line);
    freeReplyObject(r);
}
