/* End to end against private Redis Clusters through redis.cluster.nodes.
 *  - Two consumer replicas share a topic whose messages come 30 % twice; one replica is
 *    restarted mid-run (3 primaries, a replica each). Every message has exactly one effect, no
 *    committed offset ever passes a message without its effect, and the guard's keys sit on
 *    all three primaries. guard.wait.replicas = 1: every primary written to has a replica
 *    acknowledge it. Each message takes 20 ms in a plugin, so that the restart falls in the
 *    middle of the run.
 *  - The same stream while a primary is killed (SIGKILL) mid-run (3 primaries, two replicas
 *    each, so that the promoted one still has a replica for WAIT 1): one of its replicas takes
 *    over, the guard follows, and every message still has exactly one effect.
 *  - A primary that cannot be reached (a cluster without replicas: nothing takes over) turns
 *    /readyz false with a reason naming it, holds the messages back without committing past
 *    them, and everything goes on once it is back.
 *  - wxguardctl redrive with redis.cluster.nodes (3 primaries): messages whose plugin fails for
 *    good are dead-lettered, their FAILED records on all three primaries; redrive re-arms each
 *    on its primary and re-produces it; with the plugin passing again, each takes effect exactly
 *    once, and a second redrive finds them DONE and produces nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumertest.h"
#include "guardtest.h"
#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"
#include "wxguard/conf.h"
#include "wxguard/guard.h"

#define PARTITIONS 4
#define UNIQUE     1500
#define ID_BASE    7301234570000000000ULL

static uint64_t *offset_ids[PARTITIONS];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

/* 1,500 messages and 450 duplicates (30 %), each duplicate in its message's conversation (so
 * its partition), later in the stream. Fills msgs (TOTAL entries) and offset_ids; returns how
 * many messages. */
enum { TOTAL = UNIQUE + UNIQUE * 3 / 10 };
static size_t make_stream(wxg_ct_msg_t *msgs)
{
    size_t count[PARTITIONS] = {0}, n = 0;
    for (int p = 0; p < PARTITIONS; p++) {
        offset_ids[p] = calloc(TOTAL, sizeof **offset_ids);
        assert_non_null(offset_ids[p]);
    }
    unsigned seed = 4242;
    for (size_t i = 0; i < UNIQUE; i++) {
        int conv = (int)(i * 7 % 90);
        msgs[n++] = (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = ID_BASE + i, .conv = conv};
        if (i >= 10 && i % 10 < 3) {
            size_t j = i - 1 - (size_t)(rand_r(&seed) % 10);
            int cj = (int)(j * 7 % 90);
            msgs[n++] = (wxg_ct_msg_t){.partition = cj % PARTITIONS, .id = ID_BASE + j, .conv = cj};
        }
    }
    for (size_t i = 0; i < n; i++)
        offset_ids[msgs[i].partition][count[msgs[i].partition]++] = msgs[i].id;
    return n;
}

static void free_stream(void)
{
    for (int p = 0; p < PARTITIONS; p++) {
        free(offset_ids[p]);
        offset_ids[p] = NULL;
    }
}

/* The test's topics and a configuration for the cluster C: each message takes 20 ms in a
 * plugin, so that what a test does mid-run falls in the middle of the run; every write is
 * acknowledged by a replica (guard.wait.replicas = 1). */
static void setup_over(wxg_ct_t *t, const char *tag, const wxg_test_cluster_t *C)
{
    wxg_ct_setup(t, tag, PARTITIONS);
    /* Nothing listens at redis.host/port: only the cluster's nodes can be reached. */
    t->redis_host = "127.0.0.1";
    t->redis_port = wxg_test_free_port();
    char extra[1024];
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = 20\n"
             "plugin.fail.match.every = 1\n"
             "redis.cluster.nodes = %s\n"
             "guard.wait.replicas = 1\n"
             "guard.wait.timeout.ms = 2s\n"
             "guard.lease.ms = 5s\n"
             "redis.command.timeout.ms = 2s\n"
             "redis.connect.timeout.ms = 1s\n"
             "consumer.workers = 3\n",
             C->seeds);
    wxg_ct_write_config(t, extra);
}

/* Waits, checking the commit invariant, until a quarter of the messages have had their
 * effect, and asserts that half of them have not: the middle of the run. */
static void wait_for_a_quarter(wxg_ct_t *t)
{
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (wxg_ct_ledger_lines(t) < UNIQUE / 4 && wxg_test_now_ms() < deadline) {
        check_invariant(t);
        wxg_test_sleep_ms(20);
    }
    assert_true(wxg_ct_ledger_lines(t) >= UNIQUE / 4);
    assert_true(wxg_ct_ledger_lines(t) < UNIQUE / 2);
}

/* Keys under the test's prefix on the node at `port`, when it is a primary (else 0). */
static size_t primary_keys(int port, const char *prefix)
{
    struct timeval tv = {.tv_sec = 5};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    assert_true(c && !c->err);
    redisReply *r = redisCommand(c, "ROLE");
    int primary = r && r->type == REDIS_REPLY_ARRAY && strcmp(r->element[0]->str, "master") == 0;
    if (r)
        freeReplyObject(r);
    size_t n = 0;
    char cursor[32] = "0";
    do {
        r = redisCommand(c, "SCAN %s MATCH %s* COUNT 1000", cursor, prefix);
        assert_true(r && r->type == REDIS_REPLY_ARRAY);
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        n += r->element[1]->elements;
        freeReplyObject(r);
    } while (primary && strcmp(cursor, "0") != 0);
    redisFree(c);
    return primary ? n : 0;
}

static void two_replicas_over_a_cluster_give_one_effect_per_message_across_a_restart(void **state)
{
    (void)state;
    wxg_test_cluster_t C;
    if (wxg_test_cluster_start(&C, 3, 1) != 0)
        fail_msg("cannot start the cluster");
    wxg_ct_t t;
    setup_over(&t, "ct-cluster", &C);

    static wxg_ct_msg_t msgs[TOTAL];
    size_t n = make_stream(msgs);

    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    wxg_ct_produce(&t, msgs, n);
    wait_for_a_quarter(&t);
    /* Replica 1 restarts mid-run: its partitions go to replica 0 and come back. */
    int st = wxg_ct_signal(&t, 1, SIGTERM, 60000);
    wxg_ct_assert_exit(&t, 1, st, 0);
    wxg_ct_spawn(&t, 1);

    assert_true(wxg_ct_wait_all_committed(&t, 180000, check_invariant));
    check_invariant(&t);
    wxg_ct_assert_each_once(&t, ID_BASE, UNIQUE);
    for (int r = 0; r < 2; r++) {
        st = wxg_ct_signal(&t, r, SIGTERM, 60000);
        wxg_ct_assert_exit(&t, r, st, 0);
    }
    /* The keys spread over the three primaries. */
    size_t total = 0, on[WXG_TEST_CLUSTER_MAX] = {0};
    int holding = 0;
    for (int i = 0; i < C.n; i++) {
        on[i] = primary_keys(C.node[i].port, t.prefix);
        total += on[i];
        holding += on[i] > 0;
    }
    assert_int_equal(holding, 3);
    for (int i = 0; i < C.n; i++) {
        if (on[i] == 0)
            continue;
        double share = (double)on[i] / (double)total;
        printf("primary %d: %zu of %zu keys (%.1f %%)\n", C.node[i].port, on[i], total,
               100 * share);
        assert_true(share >= 0.25 && share <= 0.42);
    }
    free_stream();
    wxg_ct_teardown(&t);
    wxg_test_cluster_stop(&C);
}

static void
a_primary_killed_mid_run_gives_way_to_its_replica_with_one_effect_per_message(void **state)
{
    (void)state;
    wxg_test_cluster_t C;
    if (wxg_test_cluster_start(&C, 3, 2) != 0)
        fail_msg("cannot start the cluster");
    wxg_ct_t t;
    setup_over(&t, "ct-cluster-kill", &C);
    static wxg_ct_msg_t msgs[TOTAL];
    size_t n = make_stream(msgs);
    int ports[2] = {wxg_ct_spawn_metrics(&t, 0), wxg_ct_spawn_metrics(&t, 1)};
    wxg_ct_produce(&t, msgs, n);

    wait_for_a_quarter(&t);
    /* The primary of slot 0 dies; one of its two replicas is promoted once the others have
     * marked it failed (node timeout 2 s), the other follows the new primary. */
    int victim = wxg_test_cluster_owner(&C, 0, 0);
    assert_true(victim >= 0);
    int heirs[2];
    assert_int_equal(wxg_test_cluster_replicas_of(&C, victim, heirs, 2), 2);
    int64_t killed = wxg_test_now_ms();
    size_t at_kill = wxg_ct_ledger_lines(&t);
    wxg_test_redis_kill(&C.node[victim]);
    int via = victim == 0 ? 1 : 0;

    assert_true(wxg_ct_wait_all_committed(&t, 180000, check_invariant));
    check_invariant(&t);
    wxg_ct_assert_each_once(&t, ID_BASE, UNIQUE);
    int owner = wxg_test_cluster_owner(&C, via, 0);
    printf("primary %d killed at %zu of %d effects; slot 0 now on %d; the run ended %lld ms "
           "later\n",
           C.node[victim].port, at_kill, UNIQUE, owner >= 0 ? C.node[owner].port : -1,
           (long long)(wxg_test_now_ms() - killed));
    /* One of the victim's replicas serves its slots now. */
    assert_true(owner == heirs[0] || owner == heirs[1]);
    double node_errors = wxg_ct_metric_sum(ports, 2, "wxg_guard_cluster_node_errors_total");
    double refreshes = wxg_ct_metric_sum(ports, 2, "wxg_guard_cluster_map_refreshes_total");
    double guard_errors = 0;
    for (int op = 0; op < 2; op++)
        guard_errors += wxg_ct_metric_sum(ports, 2,
                                          op ? "wxg_guard_errors_total{op=\"complete\"}"
                                             : "wxg_guard_errors_total{op=\"claim\"}");
    printf("node errors %.0f, map refreshes %.0f, failed claim/complete calls %.0f\n", node_errors,
           refreshes, guard_errors);
    assert_true(node_errors > 0);
    assert_true(refreshes > 0);
    for (int r = 0; r < 2; r++) {
        int st = wxg_ct_signal(&t, r, SIGTERM, 60000);
        wxg_ct_assert_exit(&t, r, st, 0);
    }
    free_stream();
    wxg_ct_teardown(&t);
    wxg_test_cluster_stop(&C);
}

static void an_unreachable_primary_turns_readyz_false_naming_it_until_it_returns(void **state)
{
    (void)state;
    /* No replicas: nothing takes over, the node's slots wait for it. */
    wxg_test_cluster_t C;
    if (wxg_test_cluster_start(&C, 3, 0) != 0)
        fail_msg("cannot start the cluster");
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-cluster-down", PARTITIONS);
    t.redis_host = "127.0.0.1";
    t.redis_port = wxg_test_free_port();
    char extra[1024];
    snprintf(extra, sizeof extra,
             "redis.cluster.nodes = %s\n"
             "redis.probe.interval.ms = 200ms\n"
             "redis.command.timeout.ms = 500ms\n"
             "redis.connect.timeout.ms = 500ms\n"
             "guard.lease.ms = 2s\n"
             "consumer.workers = 2\n",
             C.seeds);
    wxg_ct_write_config(&t, extra);
    enum { FIRST = 200, LATER = 200 };
    static wxg_ct_msg_t msgs[FIRST + LATER];
    for (int p = 0; p < PARTITIONS; p++) {
        offset_ids[p] = calloc(FIRST + LATER, sizeof **offset_ids);
        assert_non_null(offset_ids[p]);
    }
    size_t count[PARTITIONS] = {0};
    for (size_t i = 0; i < FIRST + LATER; i++) {
        int conv = (int)(i % 40);
        msgs[i] = (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = ID_BASE + i, .conv = conv};
        offset_ids[msgs[i].partition][count[msgs[i].partition]++] = msgs[i].id;
    }
    int port = wxg_ct_spawn_metrics(&t, 0);
    assert_true(wxg_test_http_wait_status(port, "/readyz", 200, 30000, NULL));
    wxg_ct_produce(&t, msgs, FIRST);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, check_invariant));

    /* The primary of slot 0 goes away. The idle replica's probe asks every primary. */
    int victim = wxg_test_cluster_owner(&C, 0, 0);
    assert_true(victim >= 0);
    char node[32];
    snprintf(node, sizeof node, "127.0.0.1:%d", C.node[victim].port);
    wxg_test_redis_kill(&C.node[victim]);
    char *body = NULL;
    assert_true(wxg_test_http_wait_status(port, "/readyz", 503, 10000, &body));
    printf("/readyz: %s\n", body);
    assert_non_null(strstr(body, "redis: "));
    assert_non_null(strstr(body, node));
    free(body);
    assert_true(wxg_test_metric_wait(port, "wxg_redis_reachable", 0, 5000));

    /* Messages keep coming; the ones the node's shards hold (and, once the cluster marks it
     * failed, all of them) wait, and nothing is committed past them. */
    wxg_ct_produce(&t, msgs + FIRST, LATER);
    for (int i = 0; i < 10; i++) {
        check_invariant(&t);
        wxg_test_sleep_ms(300);
    }
    assert_true(wxg_test_http_get(port, "/readyz", NULL) == 503);
    assert_true(wxg_ct_ledger_lines(&t) < FIRST + LATER);

    /* It comes back (empty: no persistence) with its slots, from its nodes.conf. */
    assert_int_equal(wxg_test_redis_restart(&C.node[victim]), 0);
    assert_int_equal(wxg_test_cluster_wait_ok(&C, 30000), 0);
    assert_true(wxg_test_http_wait_status(port, "/readyz", 200, 30000, NULL));
    assert_true(wxg_ct_wait_all_committed(&t, 60000, check_invariant));
    check_invariant(&t);
    wxg_ct_assert_each_once(&t, ID_BASE, FIRST + LATER);
    assert_true(wxg_test_metric_wait(port, "wxg_redis_reachable", 1, 5000));
    double node_errors = wxg_test_metric_scrape(port, "wxg_guard_cluster_node_errors_total");
    printf("node errors %.0f\n", node_errors);
    assert_true(node_errors > 0);

    int st = wxg_ct_signal(&t, 0, SIGTERM, 60000);
    wxg_ct_assert_exit(&t, 0, st, 0);
    /* The log names the node too, and says when Redis was reachable again (the node may
     * answer PING a moment before the cluster serves its slots again: the outage may be
     * logged more than once). */
    assert_true(wxg_ct_log_count(&t, 0, node) >= 1);
    assert_true(wxg_ct_log_count(&t, 0, "event=redis_unreachable") >= 1);
    assert_true(wxg_ct_log_count(&t, 0, "event=redis_reachable") >= 1);
    free_stream();
    wxg_ct_teardown(&t);
    wxg_test_cluster_stop(&C);
}

/* ---- wxguardctl redrive over a cluster ---------------------------------------------------- */

enum { RD_MSGS = 12, RD_FAILING = 6 };
#define RD_BASE (ID_BASE + 100000)

/* Message i of the redrive test fails for good while its plugin refuses it: the odd ones. */
static int rd_failing(int i)
{
    return i % 2 == 1;
}

/* The consumer's configuration for the redrive test: the fail plugin refuses the messages
 * listed in `refused` (a comma-separated list of message ids), the record plugin notes the
 * effect of every other one. */
static void redrive_config(wxg_ct_t *t, const wxg_test_cluster_t *C, const char *refused)
{
    char extra[2048];
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = fail\n"
             "plugin.fail.reason = refused until redriven\n"
             "plugin.fail.match.msg_ids = %s\n"
             "redis.cluster.nodes = %s\n"
             "redis.command.timeout.ms = 2s\n"
             "redis.connect.timeout.ms = 1s\n"
             "consumer.workers = 2\n",
             refused, C->seeds);
    wxg_ct_write_config(t, extra);
}

/* Runs `wxguardctl redrive --all --json` from t's dead-letter topic with the cluster's nodes;
 * returns its exit status, with the parsed JSON in *doc. */
static int redrive_over(const wxg_ct_t *t, const wxg_test_cluster_t *C, cJSON **doc)
{
    char dlq[300], prefix[128], nodes[600];
    snprintf(dlq, sizeof dlq, "dlq.topic=%s", t->dlq);
    snprintf(prefix, sizeof prefix, "redis.key.prefix=%s", t->prefix);
    snprintf(nodes, sizeof nodes, "redis.cluster.nodes=%s", C->seeds);
    char *out = NULL;
    const char *args[] = {"redrive",   "--all",
                          "--json",    "--quiet",
                          "--brokers", wxg_test_kafka_bootstrap(),
                          "--set",     "kafka.broker.address.family=v4",
                          "--set",     dlq,
                          "--set",     prefix,
                          "--set",     nodes,
                          NULL};
    int status = wxg_ct_run_ctl(t, args, 90000, &out);
    *doc = cJSON_Parse(out);
    if (!*doc)
        fail_msg("redrive printed no JSON: %s", out);
    free(out);
    return status;
}

static double json_count(const cJSON *doc, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, name);
    if (!cJSON_IsNumber(v))
        fail_msg("no count %s in redrive's output", name);
    return v->valuedouble;
}

/* Asserts that redrive's output lists each refused message once with `action`, and nothing
 * else. */
static void assert_redrive_records(const cJSON *doc, const char keys[RD_MSGS][64],
                                   const char *action, const char *topic)
{
    const cJSON *recs = cJSON_GetObjectItemCaseSensitive(doc, "records");
    assert_int_equal(cJSON_GetArraySize(recs), RD_FAILING);
    int listed[RD_MSGS] = {0};
    const cJSON *r;
    cJSON_ArrayForEach(r, recs)
    {
        const cJSON *key = cJSON_GetObjectItemCaseSensitive(r, "key");
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "action");
        const cJSON *target = cJSON_GetObjectItemCaseSensitive(r, "target_topic");
        assert_true(cJSON_IsString(key) && cJSON_IsString(act) && cJSON_IsString(target));
        int i = 0;
        while (i < RD_MSGS && strcmp(keys[i], key->valuestring) != 0)
            i++;
        if (i == RD_MSGS || !rd_failing(i))
            fail_msg("redrive listed %s, which was never dead-lettered", key->valuestring);
        assert_int_equal(listed[i]++, 0);
        assert_string_equal(act->valuestring, action);
        assert_string_equal(target->valuestring, topic);
    }
}

/* The guard's record of `key`, which must exist. */
static wxg_guard_record_t *record_of(wxg_guard_t *g, const char *key)
{
    wxg_guard_record_t *rec = NULL;
    if (wxg_guard_inspect(g, key, strlen(key), NULL, &rec) != 0)
        fail_msg("inspect %s: %s", key, wxg_guard_last_error(g));
    return rec;
}

/* The FAILED record of `key`, as the fail plugin left it: re-armed by redrive (attempt 0 and a
 * re-arm time) or not (attempt 1, none). */
static wxg_guard_record_t *failed_record(wxg_guard_t *g, const char *key, int rearmed)
{
    wxg_guard_record_t *rec = record_of(g, key);
    assert_int_equal(rec->state, WXG_GUARD_FAILED);
    assert_int_equal(rec->attempt, rearmed ? 0 : 1);
    assert_int_equal(rec->rearmed_at_ms > 0, rearmed);
    assert_non_null(rec->fail_reason);
    assert_non_null(strstr(rec->fail_reason, "refused until redriven"));
    return rec;
}

/* The index in C->node of the primary serving the Redis key `name`, which must be there: asked
 * of that node itself, never through a redirection. */
static int primary_holding(const wxg_test_cluster_t *C, redisContext *any, const char *name)
{
    redisReply *r = gt_cmd(any, 3, (const char *[]){"CLUSTER", "KEYSLOT", name});
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    int owner = wxg_test_cluster_owner(C, 0, (int)r->integer);
    freeReplyObject(r);
    assert_true(owner >= 0);
    redisContext *there = gt_redis("127.0.0.1", C->node[owner].port, NULL);
    r = gt_cmd(there, 2, (const char *[]){"EXISTS", name});
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    if (r->integer != 1)
        fail_msg("%s is not on primary %d, which serves its slot", name, C->node[owner].port);
    freeReplyObject(r);
    redisFree(there);
    return owner;
}

/* A guard handle on the consumer's records: its configuration file mapped as the consumer maps
 * it (the same nodes, prefix and DONE layout). `conf` (freed by the caller after the handle)
 * and `prefix` hold what the handle's configuration points to. */
static wxg_guard_t *consumers_guard(const wxg_ct_t *t, char *prefix, size_t size, wxg_conf_t **conf)
{
    char err[512] = "";
    wxg_guard_conf_t gc;
    *conf = wxg_conf_new(WXG_PROG_CONSUMER, err, sizeof err);
    if (!*conf || wxg_conf_load_file(*conf, t->config, err, sizeof err) != 0 ||
        wxg_conf_guard(*conf, &gc, prefix, size, err, sizeof err) != 0)
        fail_msg("the consumer's configuration: %s", err);
    gc.command_timeout_ms = 5000 * wxg_test_scale();
    return gt_open(&gc);
}

static void
redrive_over_a_cluster_rearms_failed_records_on_their_primaries_and_each_runs_once(void **state)
{
    (void)state;
    wxg_test_cluster_t C;
    if (wxg_test_cluster_start(&C, 3, 0) != 0)
        fail_msg("cannot start the cluster");
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-cluster-redrive", 1);
    /* Nothing listens at redis.host/port: only the cluster's nodes can be reached. */
    t.redis_host = "127.0.0.1";
    t.redis_port = wxg_test_free_port();
    wxg_ct_msg_t msgs[RD_MSGS];
    char keys[RD_MSGS][64], refused[RD_FAILING * 24] = "";
    for (int i = 0; i < RD_MSGS; i++) {
        msgs[i] = (wxg_ct_msg_t){.partition = 0, .id = RD_BASE + (uint64_t)i, .conv = i % 4};
        snprintf(keys[i], sizeof keys[i], "wxid_ctbot0001:n:%llu", (unsigned long long)msgs[i].id);
        if (rd_failing(i)) {
            size_t len = strlen(refused);
            snprintf(refused + len, sizeof refused - len, "%s%llu", len ? "," : "",
                     (unsigned long long)msgs[i].id);
        }
    }

    /* The refused messages are dead-lettered; the others take effect. */
    redrive_config(&t, &C, refused);
    wxg_ct_produce(&t, msgs, RD_MSGS);
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    wxg_test_kafka_msg_t *parked = NULL;
    size_t n = wxg_test_kafka_read(t.dlq, RD_FAILING, 30000, &parked);
    assert_int_equal(n, RD_FAILING);
    wxg_test_kafka_msgs_free(parked, n);
    assert_int_equal(wxg_ct_ledger_lines(&t), RD_MSGS - RD_FAILING);
    wxg_ct_assert_exit(&t, 0, wxg_ct_signal(&t, 0, SIGTERM, 60000), 0);

    /* Their FAILED records, each on the primary serving its slot: all three hold some. A
     * record's slot follows from its key alone, so these ids spread alike on every run. */
    char prefix[WXG_GUARD_PREFIX_MAX + 1];
    wxg_conf_t *conf = NULL;
    wxg_guard_t *g = consumers_guard(&t, prefix, sizeof prefix, &conf);
    redisContext *any = gt_redis("127.0.0.1", C.node[0].port, NULL);
    int owner[RD_MSGS] = {0}, on[WXG_TEST_CLUSTER_MAX] = {0}, holding = 0;
    uint64_t fence[RD_MSGS] = {0};
    for (int i = 0; i < RD_MSGS; i++) {
        if (!rd_failing(i))
            continue;
        wxg_guard_record_t *rec = failed_record(g, keys[i], 0);
        owner[i] = primary_holding(&C, any, rec->record_key);
        if (on[owner[i]]++ == 0)
            holding++;
        fence[i] = rec->fence;
        wxg_guard_record_free(rec);
    }
    for (int i = 0; i < C.n; i++)
        printf("primary %d holds %d of the %d FAILED records\n", C.node[i].port, on[i], RD_FAILING);
    assert_int_equal(holding, 3);

    /* redrive re-arms each on its primary and re-produces it to the topic it came from. */
    cJSON *doc = NULL;
    assert_int_equal(redrive_over(&t, &C, &doc), 0);
    assert_int_equal((int)json_count(doc, "matched"), RD_FAILING);
    assert_int_equal((int)json_count(doc, "redriven"), RD_FAILING);
    assert_int_equal((int)json_count(doc, "skipped"), 0);
    assert_int_equal((int)json_count(doc, "failed"), 0);
    assert_redrive_records(doc, (const char(*)[64])keys, "redriven", t.topic);
    cJSON_Delete(doc);
    t.produced[0] += RD_FAILING;
    for (int i = 0; i < RD_MSGS; i++) {
        if (!rd_failing(i))
            continue;
        wxg_guard_record_t *rec = failed_record(g, keys[i], 1);
        assert_true(rec->fence == fence[i]);
        assert_int_equal(primary_holding(&C, any, rec->record_key), owner[i]);
        wxg_guard_record_free(rec);
    }

    /* The plugin passes again (it refuses only a message never sent): each redriven message
     * takes effect once, and every message has exactly one effect. */
    redrive_config(&t, &C, "1");
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    wxg_ct_assert_each_once(&t, RD_BASE, RD_MSGS);
    wxg_ct_assert_exit(&t, 0, wxg_ct_signal(&t, 0, SIGTERM, 60000), 0);
    for (int i = 0; i < RD_MSGS; i++) {
        wxg_guard_record_t *rec = record_of(g, keys[i]);
        assert_int_equal(rec->state, WXG_GUARD_DONE);
        wxg_guard_record_free(rec);
    }

    /* A second redrive finds every one DONE and produces nothing. */
    assert_int_equal(redrive_over(&t, &C, &doc), 0);
    assert_int_equal((int)json_count(doc, "matched"), RD_FAILING);
    assert_int_equal((int)json_count(doc, "redriven"), 0);
    assert_int_equal((int)json_count(doc, "skipped"), RD_FAILING);
    assert_redrive_records(doc, (const char(*)[64])keys, "skipped_done", t.topic);
    cJSON_Delete(doc);
    wxg_test_kafka_msg_t *all = NULL;
    n = wxg_test_kafka_read(t.topic, RD_MSGS + RD_FAILING + 1, 3000, &all);
    assert_int_equal(n, RD_MSGS + RD_FAILING);
    wxg_test_kafka_msgs_free(all, n);

    redisFree(any);
    wxg_guard_destroy(g);
    wxg_conf_free(conf);
    wxg_ct_teardown(&t);
    wxg_test_cluster_stop(&C);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_replicas_over_a_cluster_give_one_effect_per_message_across_a_restart),
        cmocka_unit_test(
            a_primary_killed_mid_run_gives_way_to_its_replica_with_one_effect_per_message),
        cmocka_unit_test(an_unreachable_primary_turns_readyz_false_naming_it_until_it_returns),
        cmocka_unit_test(
            redrive_over_a_cluster_rearms_failed_records_on_their_primaries_and_each_runs_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
