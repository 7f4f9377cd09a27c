/* End to end against a private Redis Cluster (3 primaries, a replica each) through
 * redis.cluster.nodes: two consumer replicas share a topic whose messages come 30 % twice; one
 * replica is restarted mid-run. Every message has exactly one effect, no committed offset ever
 * passes a message without its effect, and the guard's keys sit on all three primaries.
 * guard.wait.replicas = 1: every primary written to has a replica acknowledge it. Each message
 * takes 20 ms in a plugin, so that the restart falls in the middle of the run. */
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

#define PARTITIONS 4
#define UNIQUE     1500
#define ID_BASE    7301234570000000000ULL

static uint64_t *offset_ids[PARTITIONS];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

static size_t ledger_lines(const wxg_ct_t *t)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    free(eff);
    return n;
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
    wxg_ct_setup(&t, "ct-cluster", PARTITIONS);
    /* Nothing listens at redis.host/port: only the cluster's nodes can be reached. */
    t.redis_host = "127.0.0.1";
    t.redis_port = wxg_test_free_port();
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
             "consumer.workers = 3\n",
             C.seeds);
    wxg_ct_write_config(&t, extra);

    /* 1,500 messages and 450 duplicates (30 %), each duplicate in its message's conversation
     * (so its partition), later in the stream. */
    enum { TOTAL = UNIQUE + UNIQUE * 3 / 10 };
    static wxg_ct_msg_t msgs[TOTAL];
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

    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    wxg_ct_produce(&t, msgs, n);
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (ledger_lines(&t) < UNIQUE / 4 && wxg_test_now_ms() < deadline) {
        check_invariant(&t);
        wxg_test_sleep_ms(20);
    }
    /* Replica 1 restarts mid-run: its partitions go to replica 0 and come back. */
    assert_true(ledger_lines(&t) < UNIQUE / 2);
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
    for (int p = 0; p < PARTITIONS; p++)
        free(offset_ids[p]);
    wxg_ct_teardown(&t);
    wxg_test_cluster_stop(&C);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_replicas_over_a_cluster_give_one_effect_per_message_across_a_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
