/* The Redis Cluster client (lib/rcluster.c) against private clusters on loopback (3 primaries
 * with a replica each, made by tests/support/testenv.c):
 *   - a pipeline over every one of the 16384 slots lands each key on the primary serving its
 *     slot and hands every reply back to its command;
 *   - a slot moved by hand (CLUSTER SETSLOT ... NODE) makes the next command MOVED, which is
 *     followed and counted, and the map is read again;
 *   - during a migration (MIGRATING / IMPORTING, keys moved with MIGRATE) ASK is followed with
 *     ASKING, reads of moved and not yet moved keys are both right, the map is not changed;
 *     a two-key command whose keys the migration split is refused with TRYAGAIN, waited out,
 *     and runs once the migration ends;
 *   - a primary killed (SIGKILL): its commands fail clearly (unknown outcome for what was in
 *     flight, never run for what was not sent), its replica is promoted and followed; a planned
 *     failover (CLUSTER FAILOVER) is followed too;
 *   - a node stopped (SIGSTOP) under a pipeline: its commands have an unknown outcome while the
 *     other nodes' commands succeed; a node down in a cluster without replicas: clear errors,
 *     then recovery when it returns;
 *   - a TLS cluster (tls-cluster, tls-replication) end to end. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "rcluster_int.h"
#include "testenv.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"

/* ---- Helpers: commands on one node (plain connections of the fixture) ---- */

static redisContext *node_conn(int port)
{
    struct timeval tv = {.tv_sec = 5};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err)
        fail_msg("connect to node %d: %s", port, c ? c->errstr : "oom");
    redisSetTimeout(c, tv);
    return c;
}

/* Runs a command (argv strings) on node `port`; the reply is the caller's. */
static redisReply *node_cmdv(int port, int argc, const char **argv)
{
    redisContext *c = node_conn(port);
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    if (!r)
        fail_msg("node %d: %s: %s", port, argv[0], c->errstr);
    redisFree(c);
    return r;
}

/* The same, expecting +OK (or any status). */
static void node_ok(int port, int argc, const char **argv)
{
    redisReply *r = node_cmdv(port, argc, argv);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("node %d: %s %s: %s", port, argv[0], argc > 1 ? argv[1] : "", r->str);
    freeReplyObject(r);
}

static void node_id(int port, char *out, size_t size)
{
    redisReply *r = node_cmdv(port, 2, (const char *[]){"CLUSTER", "MYID"});
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    snprintf(out, size, "%s", r->str);
    freeReplyObject(r);
}

static long long node_int(int port, int argc, const char **argv)
{
    redisReply *r = node_cmdv(port, argc, argv);
    if (r->type != REDIS_REPLY_INTEGER)
        fail_msg("node %d: %s: not an integer", port, argv[0]);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* "master" or "slave" */
static int node_is_primary(int port)
{
    redisReply *r = node_cmdv(port, 1, (const char *[]){"ROLE"});
    int p = r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
            strcmp(r->element[0]->str, "master") == 0;
    freeReplyObject(r);
    return p;
}

static void setslot(int port, int slot, const char *how, const char *id)
{
    char s[16];
    snprintf(s, sizeof s, "%d", slot);
    const char *argv[5] = {"CLUSTER", "SETSLOT", s, how, id};
    node_ok(port, id ? 5 : 4, argv);
}

/* Moves `key` from node `from` to node `to` (MIGRATE, which needs the slot to be importing
 * on `to`). */
static void migrate_key(int from, int to, const char *key)
{
    char p[16];
    snprintf(p, sizeof p, "%d", to);
    node_ok(from, 6, (const char *[]){"MIGRATE", "127.0.0.1", p, key, "0", "5000"});
}

/* A key of the form "<stem>{t<n>}" for each slot, found by trying tags. */
static char (*keys_per_slot(void))[24]
{
    char(*k)[24] = calloc(WXG__RC_SLOTS, sizeof *k);
    size_t found = 0;
    for (unsigned n = 0; found < WXG__RC_SLOTS; n++) {
        char tag[16];
        int len = snprintf(tag, sizeof tag, "t%u", n);
        unsigned s = wxg__rcluster_slot(tag, (size_t)len);
        if (k[s][0])
            continue;
        snprintf(k[s], sizeof k[s], "k{%s}", tag);
        found++;
    }
    return k;
}

/* A client on the cluster, with short timeouts. */
static wxg__rcluster_t *client(const char *seeds, const wxg__rtls_conf_t *tls)
{
    wxg__rcluster_conf_t conf = {.seeds = seeds,
                                 .tls = tls,
                                 .client_name = "wxguard-test",
                                 .connect_timeout_ms = 2000 * wxg_test_scale(),
                                 .command_timeout_ms = 5000 * wxg_test_scale(),
                                 .refresh_min_ms = 50,
                                 .reconnect_min_ms = 10,
                                 .reconnect_max_ms = 200};
    char err[512] = "";
    int rc = 0;
    wxg__rcluster_t *c = wxg__rcluster_new(&conf, &rc, err, sizeof err);
    if (!c)
        fail_msg("wxg__rcluster_new: %s (%s)", err, wxg_err_name(rc));
    return c;
}

/* A batch of string commands whose first key gives the slot. */
typedef struct batch {
    size_t n, cap;
    wxg__rccmd_t *cmds;
    redisReply **replies;
    int *codes;
    char **bufs; /* owned argument copies */
    size_t nbufs;
} batch;

static void batch_add(batch *b, int argc, const char *const *argv)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 64;
        b->cmds = realloc(b->cmds, b->cap * sizeof *b->cmds);
        b->replies = realloc(b->replies, b->cap * sizeof *b->replies);
        b->codes = realloc(b->codes, b->cap * sizeof *b->codes);
        b->bufs = realloc(b->bufs, b->cap * 8 * sizeof *b->bufs);
    }
    const char **av = malloc((size_t)argc * sizeof *av);
    size_t *lens = malloc((size_t)argc * sizeof *lens);
    for (int i = 0; i < argc; i++) {
        av[i] = strdup(argv[i]);
        lens[i] = strlen(argv[i]);
    }
    b->cmds[b->n] =
        (wxg__rccmd_t){argc, av, lens, argc > 1 ? (int)wxg__rcluster_slot(av[1], lens[1]) : -1};
    b->n++;
}

static void batch_clear(batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        for (int a = 0; a < b->cmds[i].argc; a++)
            free((char *)b->cmds[i].argv[a]);
        free(b->cmds[i].argv);
        free((size_t *)b->cmds[i].lens);
        if (b->replies[i])
            freeReplyObject(b->replies[i]);
        b->replies[i] = NULL;
    }
    b->n = 0;
}

static void batch_free(batch *b)
{
    batch_clear(b);
    free(b->cmds);
    free(b->replies);
    free(b->codes);
    free(b->bufs);
    memset(b, 0, sizeof *b);
}

static int batch_run(wxg__rcluster_t *c, batch *b, int timeout_ms, int wait, char *err,
                     size_t errsize)
{
    return wxg__rcluster_run(c, b->cmds, b->n, timeout_ms, wait, 2000, b->replies, b->codes, NULL,
                             err, errsize);
}

static void assert_reply_str(const redisReply *r, const char *want)
{
    if (!r || r->type != REDIS_REPLY_STRING || strcmp(r->str, want) != 0)
        fail_msg("reply %s, want \"%s\"",
                 !r                           ? "(none)"
                 : r->type == REDIS_REPLY_NIL ? "nil"
                 : r->str                     ? r->str
                                              : "(not a string)",
                 want);
}

static wxg__rcluster_stats_t stats(const wxg__rcluster_t *c)
{
    wxg__rcluster_stats_t s;
    wxg__rcluster_get_stats(c, &s);
    return s;
}

/* The port of the primary serving `slot`, asked of node `via`. */
static int owner_port(const wxg_test_cluster_t *C, int via, int slot)
{
    int i = wxg_test_cluster_owner(C, via, slot);
    if (i < 0)
        fail_msg("no owner for slot %d", slot);
    return C->node[i].port;
}

/* A primary other than the one at `port`. */
static int other_primary(const wxg_test_cluster_t *C, int port)
{
    for (int i = 0; i < C->n; i++)
        if (C->node[i].pid > 0 && C->node[i].port != port && node_is_primary(C->node[i].port))
            return C->node[i].port;
    fail_msg("no other primary");
    return -1;
}

/* ---- The shared cluster for the tests that leave it whole ---- */

static wxg_test_cluster_t shared;

static int shared_up(void **state)
{
    (void)state;
    if (wxg_test_cluster_start(&shared, 3, 1) != 0) {
        fprintf(stderr, "cannot start the cluster\n");
        return -1;
    }
    return 0;
}

static int shared_down(void **state)
{
    (void)state;
    wxg_test_cluster_stop(&shared);
    return 0;
}

static void a_pipeline_over_every_slot_lands_on_the_owners_and_replies_match(void **state)
{
    (void)state;
    wxg__rcluster_t *c = client(shared.seeds, NULL);
    assert_int_equal(wxg__rcluster_primaries(c), 3);
    char(*keys)[24] = keys_per_slot();
    batch b = {0};
    /* SET then GET of one key per slot, in one run: 32,768 commands over three nodes. */
    for (int s = 0; s < WXG__RC_SLOTS; s++) {
        char v[32];
        snprintf(v, sizeof v, "v%d", s);
        batch_add(&b, 3, (const char *[]){"SET", keys[s], v});
        batch_add(&b, 2, (const char *[]){"GET", keys[s]});
    }
    char err[512] = "";
    int rc = batch_run(c, &b, 20000 * wxg_test_scale(), 0, err, sizeof err);
    if (rc)
        fail_msg("run: %s", err);
    for (int s = 0; s < WXG__RC_SLOTS; s++) {
        char v[32];
        snprintf(v, sizeof v, "v%d", s);
        assert_int_equal(b.codes[2 * s], 0);
        assert_int_equal(b.codes[2 * s + 1], 0);
        assert_int_equal(b.replies[2 * s]->type, REDIS_REPLY_STATUS);
        assert_reply_str(b.replies[2 * s + 1], v);
    }
    /* Each primary holds exactly one key per slot it serves: every key went to its owner. */
    long long total = 0;
    for (int p = 0; p < wxg__rcluster_primaries(c); p++) {
        const char *addr = wxg__rcluster_primary_addr(c, p);
        int port = atoi(strchr(addr, ':') + 1);
        long long dbsize = node_int(port, 1, (const char *[]){"DBSIZE"});
        long long served = 0;
        for (int s = 0; s < WXG__RC_SLOTS; s++)
            served += owner_port(&shared, 0, s) == port;
        assert_int_equal(dbsize, served);
        total += dbsize;
    }
    assert_int_equal(total, WXG__RC_SLOTS);
    wxg__rcluster_stats_t st = stats(c);
    assert_int_equal(st.moved, 0);
    assert_int_equal(st.ask, 0);
    assert_int_equal(st.node_errors, 0);
    batch_free(&b);
    free(keys);
    wxg__rcluster_free(c);
}

/* Picks a slot served by `from` whose tag is free for this test: "<tag>{m<n>}" keys. */
static int slot_on(const wxg_test_cluster_t *C, int from, const char *stem, char *tag, size_t size)
{
    for (unsigned n = 0;; n++) {
        int len = snprintf(tag, size, "%s%u", stem, n);
        int s = (int)wxg__rcluster_slot(tag, (size_t)len);
        if (owner_port(C, 0, s) == from)
            return s;
    }
}

/* Ends a migration: the remaining keys move, then every primary learns the new owner. */
static void finish_migration(const wxg_test_cluster_t *C, int slot, int from, int to)
{
    char to_id[64], s[16];
    node_id(to, to_id, sizeof to_id);
    snprintf(s, sizeof s, "%d", slot);
    for (;;) {
        redisReply *r = node_cmdv(from, 4, (const char *[]){"CLUSTER", "GETKEYSINSLOT", s, "100"});
        size_t n = r->elements;
        for (size_t i = 0; i < n; i++)
            migrate_key(from, to, r->element[i]->str);
        freeReplyObject(r);
        if (n == 0)
            break;
    }
    setslot(to, slot, "NODE", to_id);
    setslot(from, slot, "NODE", to_id);
    for (int i = 0; i < C->n; i++)
        if (C->node[i].pid > 0 && C->node[i].port != from && C->node[i].port != to &&
            node_is_primary(C->node[i].port))
            setslot(C->node[i].port, slot, "NODE", to_id);
}

static void moved_after_a_slot_moves_is_followed_and_counted(void **state)
{
    (void)state;
    wxg__rcluster_t *c = client(shared.seeds, NULL);
    int from = shared.node[0].port;
    if (!node_is_primary(from))
        from = other_primary(&shared, -1);
    int to = other_primary(&shared, from);
    char tag[32], key[64], to_id[64];
    int slot = slot_on(&shared, from, "mv", tag, sizeof tag);
    snprintf(key, sizeof key, "x{%s}", tag);
    node_ok(from, 3, (const char *[]){"SET", key, "before"});
    /* The client's map says `from`. Move the slot (with its key) to `to`, the way redis-cli
     * --cluster reshard does. */
    char from_id[64];
    node_id(from, from_id, sizeof from_id);
    node_id(to, to_id, sizeof to_id);
    setslot(to, slot, "IMPORTING", from_id);
    setslot(from, slot, "MIGRATING", to_id);
    finish_migration(&shared, slot, from, to);
    wxg__rcluster_stats_t before = stats(c);
    batch b = {0};
    batch_add(&b, 2, (const char *[]){"GET", key});
    batch_add(&b, 3, (const char *[]){"SET", key, "after"});
    batch_add(&b, 2, (const char *[]){"GET", key});
    char err[512] = "";
    int rc = batch_run(c, &b, 5000, 0, err, sizeof err);
    if (rc)
        fail_msg("run: %s", err);
    assert_reply_str(b.replies[0], "before");
    assert_reply_str(b.replies[2], "after");
    wxg__rcluster_stats_t after = stats(c);
    assert_true(after.moved >= before.moved + 1);
    /* The map was corrected: the slot is `to`'s now, and the next run goes there directly. */
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%d", to);
    assert_string_equal(wxg__rcluster_slot_addr(c, slot), want);
    batch_clear(&b);
    batch_add(&b, 2, (const char *[]){"GET", key});
    assert_int_equal(batch_run(c, &b, 5000, 0, err, sizeof err), 0);
    assert_reply_str(b.replies[0], "after");
    assert_int_equal(stats(c).moved, after.moved);
    /* Redis agrees on where the key is. */
    redisReply *r = node_cmdv(to, 2, (const char *[]){"GET", key});
    assert_reply_str(r, "after");
    freeReplyObject(r);
    batch_free(&b);
    wxg__rcluster_free(c);
}

typedef struct finisher {
    const wxg_test_cluster_t *C;
    int slot, from, to;
    int64_t after_ms;
} finisher;

static void *finish_later(void *arg)
{
    finisher *f = arg;
    wxg_test_sleep_ms(f->after_ms);
    finish_migration(f->C, f->slot, f->from, f->to);
    return NULL;
}

static void
ask_during_a_migration_reads_moved_and_unmoved_keys_and_tryagain_is_waited_out(void **state)
{
    (void)state;
    wxg__rcluster_t *c = client(shared.seeds, NULL);
    int from = other_primary(&shared, -1);
    int to = other_primary(&shared, from);
    char tag[32], from_id[64], to_id[64];
    int slot = slot_on(&shared, from, "ask", tag, sizeof tag);
    node_id(from, from_id, sizeof from_id);
    node_id(to, to_id, sizeof to_id);
    enum { NK = 20 };
    char keys[NK][64];
    for (int i = 0; i < NK; i++) {
        char v[16];
        snprintf(keys[i], sizeof keys[i], "a%d{%s}", i, tag);
        snprintf(v, sizeof v, "v%d", i);
        node_ok(from, 3, (const char *[]){"SET", keys[i], v});
    }
    setslot(to, slot, "IMPORTING", from_id);
    setslot(from, slot, "MIGRATING", to_id);
    /* Half the keys move now (the even ones). */
    for (int i = 0; i < NK; i += 2)
        migrate_key(from, to, keys[i]);
    wxg__rcluster_stats_t before = stats(c);
    batch b = {0};
    for (int i = 0; i < NK; i++)
        batch_add(&b, 2, (const char *[]){"GET", keys[i]});
    /* A new key of the slot is created on the target (the source does not have it: ASK). */
    char fresh[64];
    snprintf(fresh, sizeof fresh, "new{%s}", tag);
    batch_add(&b, 3, (const char *[]){"SET", fresh, "n"});
    char err[512] = "";
    int rc = batch_run(c, &b, 5000, 0, err, sizeof err);
    if (rc)
        fail_msg("run: %s", err);
    for (int i = 0; i < NK; i++) {
        char v[16];
        snprintf(v, sizeof v, "v%d", i);
        assert_reply_str(b.replies[i], v);
    }
    assert_int_equal(b.replies[NK]->type, REDIS_REPLY_STATUS);
    wxg__rcluster_stats_t mid = stats(c);
    /* Each moved key and the new one were asked for on the target. */
    assert_int_equal(mid.ask - before.ask, NK / 2 + 1);
    assert_int_equal(mid.moved, before.moved);
    /* ASK does not change the map. */
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%d", from);
    assert_string_equal(wxg__rcluster_slot_addr(c, slot), want);
    /* The new key is on the target (asked with ASKING: the slot is still the source's). */
    redisContext *tc = node_conn(to);
    redisReply *r = redisCommand(tc, "ASKING");
    assert_non_null(r);
    freeReplyObject(r);
    r = redisCommand(tc, "EXISTS %s", fresh);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    redisFree(tc);

    /* A two-key command over a moved and an unmoved key: TRYAGAIN until the migration ends,
     * which a thread does after 300 ms; the command then runs (through MOVED). */
    batch_clear(&b);
    batch_add(&b, 3, (const char *[]){"MGET", keys[0], keys[1]});
    rc = batch_run(c, &b, 200, 0, err, sizeof err);
    assert_int_equal(rc, WXG_EBUSY);
    assert_int_equal(b.codes[0], WXG_EBUSY);
    assert_null(b.replies[0]);
    assert_true(stats(c).tryagain > mid.tryagain);
    batch_clear(&b);
    batch_add(&b, 3, (const char *[]){"MGET", keys[0], keys[1]});
    finisher fin = {&shared, slot, from, to, 300};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, finish_later, &fin), 0);
    uint64_t tryagain_before = stats(c).tryagain;
    rc = batch_run(c, &b, 10000 * wxg_test_scale(), 0, err, sizeof err);
    pthread_join(th, NULL);
    if (rc)
        fail_msg("run: %s", err);
    assert_int_equal(b.replies[0]->type, REDIS_REPLY_ARRAY);
    assert_int_equal(b.replies[0]->elements, 2);
    assert_reply_str(b.replies[0]->element[0], "v0");
    assert_reply_str(b.replies[0]->element[1], "v1");
    assert_true(stats(c).tryagain > tryagain_before);
    batch_free(&b);
    wxg__rcluster_free(c);
}

static void wait_replicas_counts_acknowledgements_per_node(void **state)
{
    (void)state;
    wxg__rcluster_t *c = client(shared.seeds, NULL);
    char(*keys)[24] = keys_per_slot();
    batch b = {0};
    for (int s = 0; s < WXG__RC_SLOTS; s += 97)
        batch_add(&b, 3, (const char *[]){"SET", keys[s], "w"});
    long long acks = -5;
    char err[512] = "";
    int rc = wxg__rcluster_run(c, b.cmds, b.n, 5000, 1, 2000 * wxg_test_scale(), b.replies, b.codes,
                               &acks, err, sizeof err);
    if (rc)
        fail_msg("run with WAIT 1: %s", err);
    assert_int_equal(acks, 1);
    batch_clear(&b);
    /* Two replicas are more than any primary has: every command keeps its reply and is marked. */
    for (int s = 0; s < WXG__RC_SLOTS; s += 997)
        batch_add(&b, 3, (const char *[]){"SET", keys[s], "w2"});
    rc =
        wxg__rcluster_run(c, b.cmds, b.n, 5000, 2, 100, b.replies, b.codes, &acks, err, sizeof err);
    assert_int_equal(rc, WXG_EREPLICAS);
    assert_true(acks <= 1);
    for (size_t i = 0; i < b.n; i++) {
        assert_int_equal(b.codes[i], WXG_EREPLICAS);
        assert_non_null(b.replies[i]);
    }
    batch_free(&b);
    free(keys);
    wxg__rcluster_free(c);
}

/* ---- Failures, each on a cluster of its own ---- */

/* Index of the node at `port`. */
static int node_index(const wxg_test_cluster_t *C, int port)
{
    for (int i = 0; i < C->n; i++)
        if (C->node[i].port == port)
            return i;
    fail_msg("no node on port %d", port);
    return -1;
}

/* Runs GET/SET on one key per slot of `every`-th slots, retrying the whole batch until it
 * succeeds or timeout_ms (scaled) passes; returns the failures seen. */
static int until_ok(wxg__rcluster_t *c, char (*keys)[24], int every, int64_t timeout_ms)
{
    int fails = 0;
    int64_t end = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    for (;;) {
        batch b = {0};
        for (int s = 0; s < WXG__RC_SLOTS; s += every)
            batch_add(&b, 2, (const char *[]){"GET", keys[s]});
        char err[512] = "";
        int rc = batch_run(c, &b, 2000, 0, err, sizeof err);
        batch_free(&b);
        if (rc == 0)
            return fails;
        fails++;
        if (wxg_test_now_ms() > end)
            fail_msg("the cluster client did not recover: %s", err);
        wxg_test_sleep_ms(100);
    }
}

static void a_killed_primary_is_replaced_by_its_replica_and_followed(void **state)
{
    (void)state;
    wxg_test_cluster_t C;
    if (wxg_test_cluster_start(&C, 3, 1) != 0)
        fail_msg("cannot start the cluster");
    wxg__rcluster_t *c = client(C.seeds, NULL);
    char(*keys)[24] = keys_per_slot();
    /* Writes acknowledged by a replica (WAIT 1) survive the failover. */
    batch b = {0};
    for (int s = 0; s < WXG__RC_SLOTS; s += 7)
        batch_add(&b, 3, (const char *[]){"SET", keys[s], "kept"});
    char err[512] = "";
    long long acks = 0;
    int rc = wxg__rcluster_run(c, b.cmds, b.n, 5000, 1, 2000 * wxg_test_scale(), b.replies, b.codes,
                               &acks, err, sizeof err);
    if (rc)
        fail_msg("run: %s", err);
    batch_free(&b);
    int victim = owner_port(&C, 0, 0);
    int vi = node_index(&C, victim);
    kill(C.node[vi].pid, SIGKILL);
    waitpid(C.node[vi].pid, NULL, 0);
    C.node[vi].pid = 0;
    /* At once: slot 0's commands fail with a clear error and are never reported done; the
     * other nodes' commands succeed in the same run. */
    batch_add(&b, 2, (const char *[]){"GET", keys[0]});
    int other = -1;
    for (int s = 0; s < WXG__RC_SLOTS && other < 0; s++)
        if (owner_port(&C, node_index(&C, other_primary(&C, victim)), s) != victim)
            other = s;
    batch_add(&b, 2, (const char *[]){"GET", keys[other]});
    rc = batch_run(c, &b, 2000, 0, err, sizeof err);
    assert_int_not_equal(rc, 0);
    assert_int_not_equal(b.codes[0], 0);
    assert_null(b.replies[0]);
    char port[16];
    snprintf(port, sizeof port, ":%d", victim);
    if (!strstr(err, port))
        fail_msg("the error does not name the node: %s", err);
    assert_int_equal(b.codes[1], 0);
    batch_free(&b);
    assert_true(stats(c).node_errors >= 1);
    /* The cluster promotes the replica; the client follows it. */
    int fails = until_ok(c, keys, 7, 30000);
    printf("calls failed during the failover: %d\n", fails);
    int promoted = owner_port(&C, node_index(&C, other_primary(&C, victim)), 0);
    assert_int_not_equal(promoted, victim);
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%d", promoted);
    assert_string_equal(wxg__rcluster_slot_addr(c, 0), want);
    for (int s = 0; s < WXG__RC_SLOTS; s += 7)
        batch_add(&b, 2, (const char *[]){"GET", keys[s]});
    rc = batch_run(c, &b, 5000, 0, err, sizeof err);
    if (rc)
        fail_msg("run: %s", err);
    for (size_t i = 0; i < b.n; i++)
        assert_reply_str(b.replies[i], "kept");
    batch_free(&b);

    /* A planned failover: a replica of another primary takes over; the old primary, now a
     * replica, answers MOVED, which the client follows. */
    int old = owner_port(&C, node_index(&C, promoted), WXG__RC_SLOTS - 1);
    int replica = -1;
    for (int i = 0; i < C.n && replica < 0; i++) {
        if (C.node[i].pid <= 0 || node_is_primary(C.node[i].port))
            continue;
        redisReply *r = node_cmdv(C.node[i].port, 2, (const char *[]){"INFO", "replication"});
        char want_port[32];
        snprintf(want_port, sizeof want_port, "master_port:%d", old);
        if (strstr(r->str, want_port))
            replica = C.node[i].port;
        freeReplyObject(r);
    }
    assert_true(replica > 0);
    uint64_t moved = stats(c).moved, refreshes = stats(c).refreshes;
    node_ok(replica, 2, (const char *[]){"CLUSTER", "FAILOVER"});
    int64_t end = wxg_test_now_ms() + 20000 * wxg_test_scale();
    while (!node_is_primary(replica) || node_is_primary(old)) {
        if (wxg_test_now_ms() > end)
            fail_msg("CLUSTER FAILOVER did not finish");
        wxg_test_sleep_ms(50);
    }
    (void)until_ok(c, keys, 7, 10000);
    assert_true(stats(c).moved > moved || stats(c).refreshes > refreshes);
    snprintf(want, sizeof want, "127.0.0.1:%d", replica);
    assert_string_equal(wxg__rcluster_slot_addr(c, WXG__RC_SLOTS - 1), want);
    free(keys);
    wxg__rcluster_free(c);
    wxg_test_cluster_stop(&C);
}

static void a_node_down_without_a_replica_gives_clear_errors_then_recovers(void **state)
{
    (void)state;
    wxg_test_cluster_t C;
    if (wxg_test_cluster_start(&C, 3, 0) != 0)
        fail_msg("cannot start the cluster");
    wxg__rcluster_t *c = client(C.seeds, NULL);
    char(*keys)[24] = keys_per_slot();
    (void)until_ok(c, keys, 13, 5000);
    int victim = owner_port(&C, 0, 0), vi = node_index(&C, victim);

    /* Stopped (SIGSTOP) with commands in flight: they have an unknown outcome (sent, no
     * answer); the other nodes' commands succeed in the same run. */
    batch b = {0};
    for (int s = 0; s < WXG__RC_SLOTS; s += 13)
        batch_add(&b, 3, (const char *[]){"SET", keys[s], "x"});
    kill(C.node[vi].pid, SIGSTOP);
    char err[512] = "";
    int rc = batch_run(c, &b, 300, 0, err, sizeof err);
    kill(C.node[vi].pid, SIGCONT);
    assert_int_equal(rc, WXG_ETIMEDOUT);
    size_t unknown = 0, ok = 0;
    for (size_t i = 0; i < b.n; i++) {
        int s = b.cmds[i].slot;
        if (owner_port(&C, node_index(&C, other_primary(&C, victim)), s) == victim) {
            assert_int_equal(b.codes[i], WXG_ETIMEDOUT);
            assert_null(b.replies[i]);
            unknown++;
        } else {
            assert_int_equal(b.codes[i], 0);
            ok++;
        }
    }
    assert_true(unknown > 0 && ok > 0);
    batch_free(&b);
    assert_int_equal(wxg_test_cluster_wait_ok(&C, 20000), 0);
    (void)until_ok(c, keys, 13, 10000);

    /* Down (SIGTERM): a clear error naming the node, the commands never ran; then it comes
     * back (same port, same node id) and the client recovers. */
    wxg_test_redis_kill(&C.node[vi]);
    batch_add(&b, 2, (const char *[]){"GET", keys[0]});
    rc = batch_run(c, &b, 1000, 0, err, sizeof err);
    assert_int_equal(rc, WXG_ECONN);
    assert_int_equal(b.codes[0], WXG_EBUSY);
    char port[16];
    snprintf(port, sizeof port, ":%d", victim);
    if (!strstr(err, port))
        fail_msg("the error does not name the node: %s", err);
    batch_free(&b);
    /* Calls while it is down fail fast. */
    int64_t t0 = wxg_test_now_ms();
    batch_add(&b, 2, (const char *[]){"GET", keys[0]});
    rc = batch_run(c, &b, 2000, 0, err, sizeof err);
    assert_int_not_equal(rc, 0);
    assert_true(wxg_test_now_ms() - t0 < 1000);
    batch_free(&b);
    assert_int_equal(wxg_test_redis_restart(&C.node[vi]), 0);
    assert_int_equal(wxg_test_cluster_wait_ok(&C, 20000), 0);
    (void)until_ok(c, keys, 13, 10000);
    free(keys);
    wxg__rcluster_free(c);
    wxg_test_cluster_stop(&C);
}

static void a_tls_cluster_works_end_to_end_for_the_client_and_the_guard(void **state)
{
    (void)state;
    char *pki = wxg_test_pki_make();
    if (!pki)
        fail_msg("cannot make the test certificates");
    wxg_test_cluster_t C;
    if (wxg_test_cluster_start_tls(&C, 3, 1, pki) != 0)
        fail_msg("cannot start the TLS cluster");
    char ca[600];
    snprintf(ca, sizeof ca, "%s/ca.crt", pki);
    /* The server certificate names 127.0.0.1: each node is verified under its own address. */
    wxg__rtls_conf_t tls = {.ca_file = ca, .verify = 1};
    wxg__rcluster_t *c = client(C.seeds, &tls);
    assert_int_equal(wxg__rcluster_primaries(c), 3);
    char(*keys)[24] = keys_per_slot();
    batch b = {0};
    for (int s = 0; s < WXG__RC_SLOTS; s += 3) {
        batch_add(&b, 3, (const char *[]){"SET", keys[s], keys[s]});
        batch_add(&b, 2, (const char *[]){"GET", keys[s]});
    }
    long long acks = 0;
    char err[512] = "";
    /* WAIT 1: the replicas follow over TLS (tls-replication). */
    int rc = wxg__rcluster_run(c, b.cmds, b.n, 10000 * wxg_test_scale(), 1, 2000 * wxg_test_scale(),
                               b.replies, b.codes, &acks, err, sizeof err);
    if (rc)
        fail_msg("run over TLS: %s", err);
    assert_int_equal(acks, 1);
    for (size_t i = 1; i < b.n; i += 2)
        assert_reply_str(b.replies[i], b.cmds[i].argv[1]);
    batch_free(&b);
    wxg__rcluster_free(c);

    /* A client that does not trust the CA is refused with the reason. */
    char other[600];
    snprintf(other, sizeof other, "%s/other-ca.crt", pki);
    wxg__rtls_conf_t bad = {.ca_file = other, .verify = 1};
    wxg__rcluster_conf_t conf = {.seeds = C.seeds, .tls = &bad, .connect_timeout_ms = 2000};
    rc = 0;
    assert_null(wxg__rcluster_new(&conf, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONN);
    if (!strstr(err, "not signed by a trusted CA"))
        fail_msg("unexpected error: %s", err);

    /* The guard over the same TLS cluster. */
    wxg_guard_conf_t gc;
    wxg_guard_conf_init(&gc);
    gc.cluster_nodes = C.seeds;
    gc.tls = 1;
    gc.tls_ca_file = ca;
    gc.prefix = "tlscl:";
    gc.wait_replicas = 1;
    gc.wait_timeout_ms = 2000 * wxg_test_scale();
    gc.command_timeout_ms = 5000 * wxg_test_scale();
    int gerr = 0;
    wxg_guard_t *g = wxg_guard_new(&gc, &gerr, err, sizeof err);
    if (!g)
        fail_msg("wxg_guard_new over TLS: %s", err);
    for (int i = 0; i < 200; i++) {
        char key[32];
        snprintf(key, sizeof key, "tlsbot:n:%d", 4000 + i);
        wxg_guard_claim_t cl;
        assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &cl), 0);
        assert_int_equal(cl.outcome, WXG_GUARD_CLAIMED);
        int already = 0;
        assert_int_equal(wxg_guard_complete(g, &cl.ticket, &already), 0);
        wxg_guard_claim_clear(&cl);
        assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &cl), 0);
        assert_int_equal(cl.outcome, WXG_GUARD_DUPLICATE);
    }
    assert_int_equal(wxg_guard_ping(g), 0);
    wxg_guard_destroy(g);
    free(keys);
    wxg_test_cluster_stop(&C);
    wxg_test_rmtree(pki);
    free(pki);
}

/* A cluster node listens on its port and 10000 above it (the cluster bus). The fixture picks
 * ports that leave room for both: before it did, about one node in five was spawned on a port
 * above 55535 and exited at once, and a cluster of six started only through retries, which a
 * loaded machine sometimes ran out of (the TLS cluster failed to start so in a full run). */
static void every_cluster_node_starts_on_the_first_port_the_fixture_picks(void **state)
{
    (void)state;
    for (int i = 0; i < 24; i++) {
        wxg_test_redis_t r;
        assert_int_equal(wxg_test_cluster_node_start(&r), 0);
        assert_true(r.port + 10000 <= 65535);
        int starts = r.starts;
        wxg_test_redis_stop(&r);
        assert_int_equal(starts, 1);
    }
}

int main(void)
{
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(a_pipeline_over_every_slot_lands_on_the_owners_and_replies_match),
        cmocka_unit_test(moved_after_a_slot_moves_is_followed_and_counted),
        cmocka_unit_test(
            ask_during_a_migration_reads_moved_and_unmoved_keys_and_tryagain_is_waited_out),
        cmocka_unit_test(wait_replicas_counts_acknowledgements_per_node),
    };
    const struct CMUnitTest own_tests[] = {
        cmocka_unit_test(every_cluster_node_starts_on_the_first_port_the_fixture_picks),
        cmocka_unit_test(a_killed_primary_is_replaced_by_its_replica_and_followed),
        cmocka_unit_test(a_node_down_without_a_replica_gives_clear_errors_then_recovers),
        cmocka_unit_test(a_tls_cluster_works_end_to_end_for_the_client_and_the_guard),
    };
    int failed =
        cmocka_run_group_tests_name("shared cluster", shared_tests, shared_up, shared_down);
    failed += cmocka_run_group_tests_name("own clusters", own_tests, NULL, NULL);
    return failed;
}
