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
 *    them, and everything goes on once it is back. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumertest.h"
#include "testenv.h"
#include "testhttp.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_replicas_over_a_cluster_give_one_effect_per_message_across_a_restart),
        cmocka_unit_test(
            a_primary_killed_mid_run_gives_way_to_its_replica_with_one_effect_per_message),
        cmocka_unit_test(an_unreachable_primary_turns_readyz_false_naming_it_until_it_returns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
