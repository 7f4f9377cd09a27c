/* Integration tests of the database plugins against a real PostgreSQL (and, where a test says
 * so, the real Redis guard and the real Kafka broker of the services fixture):
 *   - pgsql writes a message once; the same fencing token again is a successful no-op; a newer
 *     token rewrites the row (a takeover after a crash);
 *   - fencing: a writer whose claim was taken over in Redis (its lease expired) is refused by
 *     PostgreSQL itself, and the row and the balance keep the newer writer's values;
 *   - billing charges a balance exactly once per key while several threads (with different
 *     and with equal tokens) race to charge the same keys;
 *   - plugin failures: with the chain autoreply,pgsql driven through the guard the way the
 *     consumer drives it, pgsql failing twice (its table locked: the statement times out) and
 *     then succeeding leaves ONE reply on the outbound topic (read back with a Kafka consumer)
 *     and ONE row.
 * Every test uses tables, key prefixes and topics of its own. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guardtest.h"
#include "testenv.h"
#include "testkafka.h"
#include "testpg.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"
#include "wxguard/plugin_registry.h"

/* ----- helpers ----- */

typedef struct tmsg {
    wxg_msg_view_t v;
    char key[128];
    char id[32];
    char content[128];
} tmsg;

static void tmsg_init(tmsg *m, const char *account, const char *id, const char *content)
{
    memset(m, 0, sizeof *m);
    snprintf(m->id, sizeof m->id, "%s", id);
    snprintf(m->key, sizeof m->key, "%s:n:%s", account, id);
    snprintf(m->content, sizeof m->content, "%s", content);
    m->v.format = WXG_FORMAT_GENERIC;
    m->v.account = account;
    m->v.conversation = "wxid_peer_0001";
    m->v.sender = "wxid_peer_0001";
    m->v.msg_id = m->id;
    m->v.create_time = 1700000000;
    m->v.type = "text";
    m->v.content = m->content;
    m->v.content_len = strlen(m->content);
    m->v.key = m->key;
    m->v.key_kind = WXG_KEY_SERVER_ID;
    for (int i = 0; i < 32; i++)
        m->v.payload_hash[i] = (unsigned char)(id[0] + i);
}

static wxg_plugin_chain_t *mk_chain(const char *spec, const wxg_plugin_kv_t *kv, size_t n)
{
    char err[512] = "";
    wxg_plugin_chain_t *c = NULL;
    int rc = wxg_plugin_chain_new(spec, kv, n, &c, err, sizeof err);
    if (rc != 0)
        fail_msg("chain '%s': %s (%s)", spec, err, wxg_err_name(rc));
    return c;
}

static wxg_plugin_thread_t *mk_thread(wxg_plugin_chain_t *c)
{
    char err[512] = "";
    wxg_plugin_thread_t *t = NULL;
    if (wxg_plugin_thread_new(c, &t, err, sizeof err) != 0)
        fail_msg("thread_new: %s", err);
    return t;
}

static wxg_plugin_result_t run(wxg_plugin_chain_t *c, wxg_plugin_thread_t *t, size_t i,
                               const tmsg *m, uint64_t fence, uint32_t attempt,
                               wxg_plugin_call_t *call)
{
    wxg_plugin_call_init(call);
    call->fence = fence;
    call->attempt = attempt;
    call->topic = "callbacks";
    call->partition = 0;
    call->offset = 42;
    return wxg_plugin_chain_handle(c, t, i, &m->v, call);
}

/* SELECT <what> FROM <table> WHERE <col> = '<value>' (one integer), or without a WHERE when
 * col is NULL. */
static int64_t q_int(PGconn *pg, const char *what, const char *table, const char *col,
                     const char *value)
{
    char sql[512];
    if (col)
        snprintf(sql, sizeof sql, "SELECT %s FROM %s WHERE %s = '%s'", what, table, col, value);
    else
        snprintf(sql, sizeof sql, "SELECT %s FROM %s", what, table);
    return wxg_test_pg_int(pg, sql);
}

/* The stored content of `key` as text. */
static char *q_content(PGconn *pg, const char *table, const char *key)
{
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT convert_from(content, 'UTF8') FROM %s WHERE idem_key = '%s'",
             table, key);
    PGresult *r = PQexec(pg, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    char *s = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return s;
}

static void drop(PGconn *pg, const char *table)
{
    char sql[128];
    snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS %s", table);
    wxg_test_pg_exec(pg, sql);
}

/* ----- pgsql: once, same fence, newer fence ----- */

static void test_pgsql_inserts_once_and_same_fence_is_a_noop(void **st)
{
    (void)st;
    PGconn *pg = wxg_test_pg_connect();
    char *table = wxg_test_pg_name("msgs");
    wxg_plugin_kv_t kv[] = {{"plugin.pgsql.dsn", wxg_test_pg_dsn()}, {"plugin.pgsql.table", table}};
    wxg_plugin_chain_t *c = mk_chain("pgsql", kv, 2);
    wxg_plugin_thread_t *t = mk_thread(c);
    tmsg m;
    tmsg_init(&m, "wxid_bot1", "7301234567890123457", "你好, 世界");
    wxg_plugin_call_t call;

    assert_int_equal(run(c, t, 0, &m, 5, 1, &call), WXG_PLUGIN_OK);
    assert_non_null(strstr(call.result, "inserted"));
    assert_int_equal(q_int(pg, "count(*)", table, "idem_key", m.key), 1);

    /* The same claim again (e.g. its commit's acknowledgement was lost): nothing changes. */
    assert_int_equal(run(c, t, 0, &m, 5, 1, &call), WXG_PLUGIN_OK);
    assert_non_null(strstr(call.result, "already written"));
    assert_int_equal(q_int(pg, "count(*)", table, NULL, NULL), 1);
    assert_int_equal(q_int(pg, "writes", table, "idem_key", m.key), 1);

    /* A newer claim after a crash rewrites the one row and raises its fence. */
    assert_int_equal(run(c, t, 0, &m, 6, 2, &call), WXG_PLUGIN_OK);
    assert_non_null(strstr(call.result, "rewritten"));
    assert_int_equal(q_int(pg, "count(*)", table, NULL, NULL), 1);
    assert_int_equal(q_int(pg, "fence", table, "idem_key", m.key), 6);
    assert_int_equal(q_int(pg, "writes", table, "idem_key", m.key), 2);
    /* Exact id digits and exact content bytes. */
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE msg_id = '7301234567890123457'",
             table);
    assert_int_equal(wxg_test_pg_int(pg, sql), 1);
    char *content = q_content(pg, table, m.key);
    assert_string_equal(content, "你好, 世界");
    free(content);

    wxg_plugin_thread_destroy(t);
    wxg_plugin_chain_destroy(c);
    drop(pg, table);
    free(table);
    PQfinish(pg);
}

/* The server ends the plugin's connection (a restart, an idle-connection reaper): the next
 * message is a RETRY naming the lost connection, and the one after that reconnects and
 * writes. */
static void test_pgsql_reconnects_after_its_connection_is_killed(void **st)
{
    (void)st;
    PGconn *pg = wxg_test_pg_connect();
    char *table = wxg_test_pg_name("recon");
    char dsn[512];
    /* An application name of its own, so that only this test's connections are ended. */
    snprintf(dsn, sizeof dsn, "%s%capplication_name=%s", wxg_test_pg_dsn(),
             strchr(wxg_test_pg_dsn(), '?') ? '&' : '?', table);
    wxg_plugin_kv_t kv[] = {{"plugin.pgsql.dsn", dsn}, {"plugin.pgsql.table", table}};
    wxg_plugin_chain_t *c = mk_chain("pgsql", kv, 2);
    wxg_plugin_thread_t *t = mk_thread(c);
    tmsg m1, m2;
    tmsg_init(&m1, "wxid_bot1", "7301234567890100101", "one");
    tmsg_init(&m2, "wxid_bot1", "7301234567890100102", "two");
    wxg_plugin_call_t call;
    assert_int_equal(run(c, t, 0, &m1, 1, 1, &call), WXG_PLUGIN_OK);

    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
             "application_name = '%s'",
             table);
    assert_int_equal(wxg_test_pg_int(pg, sql), 1);
    /* The backend is gone once pg_stat_activity no longer lists it (bounded wait). */
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'",
             table);
    for (int i = 0; i < 100 && wxg_test_pg_int(pg, sql) > 0; i++)
        wxg_test_sleep_ms(20);

    assert_int_equal(run(c, t, 0, &m2, 1, 1, &call), WXG_PLUGIN_RETRY);
    print_message("after the kill: %s\n", call.reason);
    assert_int_equal(run(c, t, 0, &m2, 1, 2, &call), WXG_PLUGIN_OK);
    assert_non_null(strstr(call.result, "inserted"));
    assert_int_equal(q_int(pg, "count(*)", table, NULL, NULL), 2);

    wxg_plugin_thread_destroy(t);
    wxg_plugin_chain_destroy(c);
    drop(pg, table);
    free(table);
    PQfinish(pg);
}

/* ----- fencing with the real guard ----- */

/* The tables of a pgsql,billing chain (names of their own, dropped by fenced_free). */
typedef struct fenced {
    PGconn *pg;
    char *msgs, *charges, *balances;
    wxg_plugin_chain_t *chain;
} fenced;

static void fenced_init(fenced *f, const char *tag)
{
    char name[32];
    f->pg = wxg_test_pg_connect();
    snprintf(name, sizeof name, "%smsgs", tag);
    f->msgs = wxg_test_pg_name(name);
    snprintf(name, sizeof name, "%scharges", tag);
    f->charges = wxg_test_pg_name(name);
    snprintf(name, sizeof name, "%sbal", tag);
    f->balances = wxg_test_pg_name(name);
    wxg_plugin_kv_t kv[] = {{"plugin.pgsql.dsn", wxg_test_pg_dsn()},
                            {"plugin.pgsql.table", f->msgs},
                            {"plugin.billing.dsn", wxg_test_pg_dsn()},
                            {"plugin.billing.charges.table", f->charges},
                            {"plugin.billing.balances.table", f->balances},
                            {"plugin.billing.price.default", "10"}};
    f->chain = mk_chain("pgsql,billing", kv, 6);
}

static void fenced_free(fenced *f)
{
    wxg_plugin_chain_destroy(f->chain);
    drop(f->pg, f->msgs);
    drop(f->pg, f->charges);
    drop(f->pg, f->balances);
    free(f->msgs);
    free(f->charges);
    free(f->balances);
    PQfinish(f->pg);
}

static void test_stale_writer_is_refused_by_postgres_even_when_redis_lost_its_claim(void **st)
{
    (void)st;
    fenced fx;
    fenced_init(&fx, "f");
    PGconn *pg = fx.pg;
    const char *msgs = fx.msgs, *charges = fx.charges, *balances = fx.balances;
    wxg_plugin_chain_t *c = fx.chain;
    wxg_plugin_thread_t *ta = mk_thread(c); /* replica A's worker */
    wxg_plugin_thread_t *tb = mk_thread(c); /* replica B's worker */

    wxg_guard_conf_t gc;
    char prefix[64];
    gt_conf(&gc, wxg_test_redis_host(), wxg_test_redis_port(), "fence", prefix, sizeof prefix);
    gc.lease_ms = 300 * wxg_test_scale();
    wxg_guard_t *ga = gt_open(&gc);
    wxg_guard_t *gb = gt_open(&gc);

    tmsg ma, mb; /* the same message; the content tells whose write survived */
    tmsg_init(&ma, "wxid_bot1", "7301234567890123999", "written by A");
    tmsg_init(&mb, "wxid_bot1", "7301234567890123999", "written by B");
    wxg_guard_claim_t ca = {0}, cb = {0};
    assert_int_equal(wxg_guard_claim(ga, ma.key, strlen(ma.key), ma.v.payload_hash, &ca), 0);
    assert_int_equal(ca.outcome, WXG_GUARD_CLAIMED);
    ca.ticket.key = ma.key;

    /* A stalls (a GC pause, a SIGSTOP, a network partition) and its lease runs out; B claims
     * the message with a higher fencing token. */
    wxg_test_sleep_ms(gc.lease_ms + 200 * wxg_test_scale());
    assert_int_equal(wxg_guard_claim(gb, mb.key, strlen(mb.key), mb.v.payload_hash, &cb), 0);
    assert_int_equal(cb.outcome, WXG_GUARD_CLAIMED);
    cb.ticket.key = mb.key;
    assert_true(cb.ticket.fence > ca.ticket.fence);

    wxg_plugin_call_t call;
    /* A writes first, before it notices anything: allowed, its fence is the highest seen. */
    assert_int_equal(run(c, ta, 0, &ma, ca.ticket.fence, 1, &call), WXG_PLUGIN_OK);
    /* B writes: the database lets the newer token take the row over. */
    assert_int_equal(run(c, tb, 0, &mb, cb.ticket.fence, 2, &call), WXG_PLUGIN_OK);
    assert_non_null(strstr(call.result, "rewritten"));
    assert_int_equal(run(c, tb, 1, &mb, cb.ticket.fence, 2, &call), WXG_PLUGIN_OK);
    assert_non_null(strstr(call.result, "charge "));
    assert_int_equal(wxg_guard_plugin_done(gb, &cb.ticket, "pgsql", "x", 1), 0);

    /* A, still believing it owns the message, writes again (say its retry loop) and charges:
     * PostgreSQL refuses both, and nothing of B's changes. */
    assert_int_equal(run(c, ta, 0, &ma, ca.ticket.fence, 1, &call), WXG_PLUGIN_RETRY);
    assert_non_null(strstr(call.reason, "lease lost"));
    assert_int_equal(run(c, ta, 1, &ma, ca.ticket.fence, 1, &call), WXG_PLUGIN_RETRY);
    assert_non_null(strstr(call.reason, "lease lost"));
    char *content = q_content(pg, msgs, mb.key);
    assert_string_equal(content, "written by B");
    free(content);
    assert_int_equal(q_int(pg, "fence", msgs, "idem_key", mb.key), (int64_t)cb.ticket.fence);
    assert_int_equal(q_int(pg, "count(*)", msgs, "idem_key", mb.key), 1);
    assert_int_equal(q_int(pg, "count(*)", charges, "idem_key", mb.key), 1);
    assert_int_equal(q_int(pg, "fence", charges, "idem_key", mb.key), (int64_t)cb.ticket.fence);
    assert_int_equal(q_int(pg, "balance", balances, "account", "wxid_bot1"), -10);

    /* The guard agrees: A's transitions are refused, B completes. */
    assert_int_equal(wxg_guard_plugin_done(ga, &ca.ticket, "pgsql", "x", 1), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_complete(ga, &ca.ticket, NULL), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_complete(gb, &cb.ticket, NULL), 0);

    wxg_guard_claim_clear(&ca);
    wxg_guard_claim_clear(&cb);
    wxg_guard_destroy(ga);
    wxg_guard_destroy(gb);
    wxg_plugin_thread_destroy(ta);
    wxg_plugin_thread_destroy(tb);
    fenced_free(&fx);
}

/* ----- fencing after Redis forgot the message ----- */

/* Deletes every key under `prefix` (what a restart without persistence, or a failover that lost
 * the writes, leaves of a message). */
static void forget_prefix(const char *prefix)
{
    redisContext *r = gt_redis(wxg_test_redis_host(), wxg_test_redis_port(), NULL);
    char pattern[80];
    snprintf(pattern, sizeof pattern, "%s*", prefix);
    char **keys = NULL;
    size_t n = gt_scan(r, pattern, &keys);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++) {
        const char *argv[2] = {"DEL", keys[i]};
        freeReplyObject(gt_cmd(r, 2, argv));
    }
    gt_free_keys(keys);
    assert_int_equal(gt_count(r, pattern), 0);
    redisFree(r);
}

static void test_a_message_redelivered_after_redis_forgot_it_is_not_refused_as_stale(void **st)
{
    (void)st;
    fenced fx;
    fenced_init(&fx, "l");
    wxg_plugin_chain_t *c = fx.chain;
    wxg_plugin_thread_t *t = mk_thread(c);
    wxg_guard_conf_t gc;
    char prefix[64];
    gt_conf(&gc, wxg_test_redis_host(), wxg_test_redis_port(), "forgot", prefix, sizeof prefix);
    wxg_guard_t *g = gt_open(&gc);
    tmsg m;
    tmsg_init(&m, "wxid_bot1", "7301234567890124555", "hello");

    /* The first attempt fails (say the network to the database), the second claim runs both
     * plugins with a higher fence and completes. */
    wxg_guard_claim_t c1 = {0}, c2 = {0}, c3 = {0};
    assert_int_equal(wxg_guard_claim(g, m.key, strlen(m.key), m.v.payload_hash, &c1), 0);
    assert_int_equal(c1.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_fail(g, &c1.ticket, "transient", 1), 0);
    assert_int_equal(wxg_guard_claim(g, m.key, strlen(m.key), m.v.payload_hash, &c2), 0);
    assert_int_equal(c2.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(c2.attempt, 2);
    assert_true(c2.ticket.fence > c1.ticket.fence && c2.ticket.fence >= 2);
    wxg_plugin_call_t call;
    assert_int_equal(run(c, t, 0, &m, c2.ticket.fence, c2.attempt, &call), WXG_PLUGIN_OK);
    assert_int_equal(
        wxg_guard_plugin_done(g, &c2.ticket, "pgsql", call.result, strlen(call.result)), 0);
    assert_int_equal(run(c, t, 1, &m, c2.ticket.fence, c2.attempt, &call), WXG_PLUGIN_OK);
    assert_int_equal(wxg_guard_complete(g, &c2.ticket, NULL), 0);

    /* Redis forgets the message; the message arrives again. Its new claim must carry a fence
     * above the one the database holds, or both plugins refuse it as a stale writer and the
     * message is retried until it is dead-lettered, although its effect exists. */
    forget_prefix(prefix);
    assert_int_equal(wxg_guard_claim(g, m.key, strlen(m.key), m.v.payload_hash, &c3), 0);
    assert_int_equal(c3.outcome, WXG_GUARD_CLAIMED);
    assert_true(c3.ticket.fence > c2.ticket.fence);
    assert_int_equal(run(c, t, 0, &m, c3.ticket.fence, c3.attempt, &call), WXG_PLUGIN_OK);
    assert_int_equal(run(c, t, 1, &m, c3.ticket.fence, c3.attempt, &call), WXG_PLUGIN_OK);
    assert_int_equal(wxg_guard_complete(g, &c3.ticket, NULL), 0);

    /* One row, one charge. */
    assert_int_equal(q_int(fx.pg, "count(*)", fx.msgs, "idem_key", m.key), 1);
    assert_int_equal(q_int(fx.pg, "count(*)", fx.charges, "idem_key", m.key), 1);
    assert_int_equal(q_int(fx.pg, "balance", fx.balances, "account", "wxid_bot1"), -10);

    wxg_guard_claim_clear(&c1);
    wxg_guard_claim_clear(&c2);
    wxg_guard_claim_clear(&c3);
    wxg_guard_destroy(g);
    wxg_plugin_thread_destroy(t);
    fenced_free(&fx);
}

/* ----- billing under concurrent duplicates ----- */

#define BILL_THREADS 6
#define BILL_KEYS    24
#define BILL_PRICE   3

typedef struct bill_arg {
    wxg_plugin_chain_t *chain;
    tmsg *msgs;
    int index;
    int same_fence; /* 1: every thread holds the same claim (fence 1) */
    int ok, stale, other;
    char first_other[600];
    char results[BILL_KEYS][WXG_PLUGIN_RESULT_MAX + 1];
} bill_arg;

static void *bill_thread(void *p)
{
    bill_arg *a = p;
    wxg_plugin_thread_t *t = NULL;
    char err[512];
    if (wxg_plugin_thread_new(a->chain, &t, err, sizeof err) != 0) {
        a->other = BILL_KEYS;
        snprintf(a->first_other, sizeof a->first_other, "thread_new: %s", err);
        return NULL;
    }
    for (int k = 0; k < BILL_KEYS; k++) {
        /* Each thread walks the keys from a different starting point, so that every pair of
         * threads collides on some key at some moment. */
        int key = (k + a->index * 5) % BILL_KEYS;
        uint64_t fence = a->same_fence ? 1 : (uint64_t)a->index + 1;
        wxg_plugin_call_t call;
        wxg_plugin_call_init(&call);
        call.fence = fence;
        call.attempt = 1;
        call.topic = "callbacks";
        wxg_plugin_result_t r = wxg_plugin_chain_handle(a->chain, t, 0, &a->msgs[key].v, &call);
        if (r == WXG_PLUGIN_OK) {
            a->ok++;
            snprintf(a->results[key], sizeof a->results[key], "%s", call.result);
        } else if (r == WXG_PLUGIN_RETRY && strstr(call.reason, "lease lost")) {
            a->stale++;
        } else {
            if (a->other++ == 0)
                snprintf(a->first_other, sizeof a->first_other, "%s", call.reason);
        }
    }
    wxg_plugin_thread_destroy(t);
    return NULL;
}

static void billing_race(int same_fence)
{
    PGconn *pg = wxg_test_pg_connect();
    char *charges = wxg_test_pg_name("rcharges");
    char *balances = wxg_test_pg_name("rbal");
    char price[16];
    snprintf(price, sizeof price, "%d", BILL_PRICE);
    wxg_plugin_kv_t kv[] = {{"plugin.billing.dsn", wxg_test_pg_dsn()},
                            {"plugin.billing.charges.table", charges},
                            {"plugin.billing.balances.table", balances},
                            {"plugin.billing.price.default", price}};
    wxg_plugin_chain_t *c = mk_chain("billing", kv, 4);
    /* Two accounts with a starting balance. */
    char sql[256];
    snprintf(
        sql, sizeof sql,
        "INSERT INTO %s (account, balance) VALUES ('wxid_acct_0', 1000), ('wxid_acct_1', 1000)",
        balances);
    wxg_test_pg_exec(pg, sql);
    tmsg msgs[BILL_KEYS];
    int per_account[2] = {0, 0};
    for (int k = 0; k < BILL_KEYS; k++) {
        char id[32];
        snprintf(id, sizeof id, "73000000000000%05d", k);
        tmsg_init(&msgs[k], k % 3 == 0 ? "wxid_acct_1" : "wxid_acct_0", id, "charge me");
        per_account[k % 3 == 0]++;
    }
    bill_arg args[BILL_THREADS];
    pthread_t th[BILL_THREADS];
    for (int i = 0; i < BILL_THREADS; i++) {
        memset(&args[i], 0, sizeof args[i]);
        args[i].chain = c;
        args[i].msgs = msgs;
        args[i].index = i;
        args[i].same_fence = same_fence;
        assert_int_equal(pthread_create(&th[i], NULL, bill_thread, &args[i]), 0);
    }
    int ok = 0, stale = 0;
    for (int i = 0; i < BILL_THREADS; i++) {
        pthread_join(th[i], NULL);
        if (args[i].other)
            fail_msg("thread %d: %d unexpected outcomes, first: %s", i, args[i].other,
                     args[i].first_other);
        ok += args[i].ok;
        stale += args[i].stale;
    }
    assert_int_equal(ok + stale, BILL_THREADS * BILL_KEYS);
    if (same_fence) {
        /* One claim everywhere: every attempt is OK and all report the same charge. */
        assert_int_equal(stale, 0);
        for (int k = 0; k < BILL_KEYS; k++) {
            for (int i = 1; i < BILL_THREADS; i++)
                assert_string_equal(args[i].results[k], args[0].results[k]);
        }
    } else {
        /* The highest token always wins its key. */
        for (int k = 0; k < BILL_KEYS; k++)
            assert_non_null(strstr(args[BILL_THREADS - 1].results[k], "charge "));
    }
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", charges);
    assert_int_equal(wxg_test_pg_int(pg, sql), BILL_KEYS);
    snprintf(sql, sizeof sql, "SELECT count(DISTINCT idem_key) FROM %s", charges);
    assert_int_equal(wxg_test_pg_int(pg, sql), BILL_KEYS);
    assert_int_equal(q_int(pg, "balance", balances, "account", "wxid_acct_0"),
                     1000 - BILL_PRICE * per_account[0]);
    assert_int_equal(q_int(pg, "balance", balances, "account", "wxid_acct_1"),
                     1000 - BILL_PRICE * per_account[1]);
    assert_int_equal(q_int(pg, "charges", balances, "account", "wxid_acct_0"), per_account[0]);
    print_message("billing race (%s fences): %d OK, %d refused as stale, %d charges\n",
                  same_fence ? "equal" : "different", ok, stale, BILL_KEYS);
    wxg_plugin_chain_destroy(c);
    drop(pg, charges);
    drop(pg, balances);
    free(charges);
    free(balances);
    PQfinish(pg);
}

static void test_billing_charges_once_under_concurrent_duplicates_with_different_fences(void **st)
{
    (void)st;
    billing_race(0);
}

static void test_billing_charges_once_under_concurrent_duplicates_with_the_same_fence(void **st)
{
    (void)st;
    billing_race(1);
}

/* ----- plugin failures: autoreply OK, pgsql fails twice, then succeeds ----- */

static const char *finished_result(const wxg_guard_claim_t *cl, const char *name)
{
    for (size_t i = 0; i < cl->n_finished; i++) {
        if (strcmp(cl->finished[i].name, name) == 0)
            return (const char *)cl->finished[i].result;
    }
    return NULL;
}

static void test_autoreply_ok_pgsql_fails_twice_then_succeeds_gives_one_reply_one_row(void **st)
{
    (void)st;
    PGconn *pg = wxg_test_pg_connect();
    PGconn *locker = wxg_test_pg_connect();
    char *table = wxg_test_pg_name("chain");
    char *topic = wxg_test_kafka_name("replies");
    wxg_test_kafka_create_topic(topic, 1);
    wxg_plugin_kv_t kv[] = {{"plugin.autoreply.topic", topic},
                            {"plugin.autoreply.rule.1", "keyword:你好 -> 你好！有什么可以帮您？"},
                            {"plugin.pgsql.dsn", wxg_test_pg_dsn()},
                            {"plugin.pgsql.table", table},
                            {"plugin.pgsql.statement.timeout.ms", "300"}};
    wxg_plugin_chain_t *c = mk_chain("autoreply,pgsql", kv, 5);
    char err[512];
    wxg_kafka_prop_t props[] = {{"bootstrap.servers", wxg_test_kafka_bootstrap()},
                                {"broker.address.family", "v4"}};
    wxg_producer_t *prod = wxg_producer_new(props, 2, err, sizeof err);
    if (!prod)
        fail_msg("producer: %s", err);
    wxg_plugin_chain_set_producer(c, prod);
    wxg_plugin_thread_t *t = mk_thread(c);

    wxg_guard_conf_t gc;
    char prefix[64];
    gt_conf(&gc, wxg_test_redis_host(), wxg_test_redis_port(), "chain", prefix, sizeof prefix);
    wxg_guard_t *g = gt_open(&gc);

    /* The fault: the table is locked, so pgsql's statement times out (a transient error). */
    char sql[256];
    wxg_test_pg_exec(locker, "BEGIN");
    snprintf(sql, sizeof sql, "LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", table);
    wxg_test_pg_exec(locker, sql);

    tmsg m;
    tmsg_init(&m, "wxid_bot1", "7301234567890100001", "你好");
    const size_t np = wxg_plugin_chain_count(c);
    int calls[2] = {0, 0}, pgsql_failures = 0, done = 0;
    char reply_result[WXG_PLUGIN_RESULT_MAX + 1] = "";
    /* The consumer's loop for one message, bounded: claim, run the unfinished plugins, mark
     * each one done, complete; on RETRY mark FAILED and claim again. */
    for (int attempt = 0; attempt < 8 && !done; attempt++) {
        wxg_guard_claim_t cl = {0};
        assert_int_equal(wxg_guard_claim(g, m.key, strlen(m.key), m.v.payload_hash, &cl), 0);
        assert_int_equal(cl.outcome, WXG_GUARD_CLAIMED);
        cl.ticket.key = m.key;
        int failed = 0;
        for (size_t i = 0; i < np && !failed; i++) {
            const char *name = wxg_plugin_chain_name(c, i);
            if (finished_result(&cl, name))
                continue;
            wxg_plugin_call_t call;
            wxg_plugin_call_init(&call);
            call.fence = cl.ticket.fence;
            call.attempt = cl.attempt;
            call.topic = "callbacks";
            call.offset = attempt;
            calls[i]++;
            wxg_plugin_result_t r = wxg_plugin_chain_handle(c, t, i, &m.v, &call);
            if (r == WXG_PLUGIN_OK) {
                if (i == 0)
                    snprintf(reply_result, sizeof reply_result, "%s", call.result);
                if (i + 1 < np)
                    assert_int_equal(wxg_guard_plugin_done(g, &cl.ticket, name, call.result,
                                                           strlen(call.result)),
                                     0);
                continue;
            }
            assert_int_equal(r, WXG_PLUGIN_RETRY);
            assert_string_equal(name, "pgsql");
            print_message("attempt %u: pgsql: %s\n", (unsigned)cl.attempt, call.reason);
            assert_int_equal(wxg_guard_fail(g, &cl.ticket, call.reason, cl.attempt), 0);
            failed = 1;
            if (++pgsql_failures == 2)
                wxg_test_pg_exec(locker, "ROLLBACK"); /* the fault clears */
        }
        if (!failed) {
            assert_int_equal(wxg_guard_complete(g, &cl.ticket, NULL), 0);
            done = 1;
        }
        wxg_guard_claim_clear(&cl);
    }
    assert_true(done);
    assert_int_equal(pgsql_failures, 2);
    assert_int_equal(calls[0], 1); /* autoreply ran once: its marker skipped it on retries */
    assert_int_equal(calls[1], 3);

    /* A redelivery now is a duplicate: nothing runs. */
    wxg_guard_claim_t again = {0};
    assert_int_equal(wxg_guard_claim(g, m.key, strlen(m.key), m.v.payload_hash, &again), 0);
    assert_int_equal(again.outcome, WXG_GUARD_DUPLICATE);
    wxg_guard_claim_clear(&again);

    /* One row. */
    assert_int_equal(q_int(pg, "count(*)", table, NULL, NULL), 1);
    /* One reply: ask for two and get one. */
    wxg_test_kafka_msg_t *recs = NULL;
    size_t n = wxg_test_kafka_read(topic, 2, 3000, &recs);
    assert_int_equal(n, 1);
    assert_string_equal(recs[0].key, m.key);
    char want_result[300];
    snprintf(want_result, sizeof want_result, "%s/0/%" PRId64, topic, recs[0].offset);
    assert_string_equal(reply_result, want_result);
    cJSON *o = cJSON_Parse(recs[0].value);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "account")->valuestring, "wxid_bot1");
    assert_string_equal(cJSON_GetObjectItem(o, "to")->valuestring, "wxid_peer_0001");
    assert_string_equal(cJSON_GetObjectItem(o, "content")->valuestring, "你好！有什么可以帮您？");
    assert_string_equal(cJSON_GetObjectItem(o, "in_reply_to")->valuestring, m.id);
    assert_string_equal(cJSON_GetObjectItem(o, "key")->valuestring, m.key);
    cJSON_Delete(o);
    wxg_test_kafka_msgs_free(recs, n);

    wxg_guard_destroy(g);
    wxg_plugin_thread_destroy(t);
    wxg_plugin_chain_destroy(c);
    wxg_producer_destroy(prod, 5000);
    drop(pg, table);
    free(table);
    free(topic);
    PQfinish(locker);
    PQfinish(pg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pgsql_inserts_once_and_same_fence_is_a_noop),
        cmocka_unit_test(test_pgsql_reconnects_after_its_connection_is_killed),
        cmocka_unit_test(test_stale_writer_is_refused_by_postgres_even_when_redis_lost_its_claim),
        cmocka_unit_test(test_a_message_redelivered_after_redis_forgot_it_is_not_refused_as_stale),
        cmocka_unit_test(
            test_billing_charges_once_under_concurrent_duplicates_with_different_fences),
        cmocka_unit_test(test_billing_charges_once_under_concurrent_duplicates_with_the_same_fence),
        cmocka_unit_test(test_autoreply_ok_pgsql_fails_twice_then_succeeds_gives_one_reply_one_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
