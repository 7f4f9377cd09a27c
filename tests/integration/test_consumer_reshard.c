/* End to end against a private Redis Cluster (3 primaries, a replica each) that is resharded
 * under the running consumers: a third of one primary's slots move to another, keys and all,
 * while new messages and late duplicates of finished ones flow. Two consumer replicas, each
 * with /metrics of its own.
 *
 * The slots move `redis-cli --cluster reshard` style (IMPORTING / MIGRATING, MIGRATE key by
 * key, SETSLOT NODE), a group of them at a time, with a pause while a group's keys are split
 * between the two primaries and another once they are all on the target, so that the guard's
 * calls meet ASK (and, for scripts over keys on both sides, TRYAGAIN) as well as MOVED.
 *
 * What it proves, for the native design and for the Lua one: no message is lost, every message
 * has exactly one effect (a late duplicate whose DONE marker moved, or is moving, is still a
 * duplicate), no committed offset ever passes a message without its effect (sampled during the
 * run), and the workers really were redirected (wxg_guard_cluster_redirects_total). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumertest.h"
#include "testenv.h"
#include "testhttp.h"

#define PARTITIONS 4
#define BEFORE     1000 /* messages finished before the resharding starts */
#define DURING     1500 /* messages produced while it runs */
#define AFTER      500  /* messages produced after it ended */
#define UNIQUE     (BEFORE + DURING + AFTER)
#define CHUNKS     30 /* produce calls while resharding */
/* Every message once; each message of BEFORE again while resharding; a third of DURING's and a
 * fifth of BEFORE's again afterwards. */
#define TOTAL   (UNIQUE + BEFORE + DURING / 3 + BEFORE / 5)
#define ID_BASE 7301234580000000000ULL

static uint64_t *offset_ids[PARTITIONS];
static size_t offsets[PARTITIONS];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

/* Message i (0-based), in the conversation that decides its partition. */
static wxg_ct_msg_t msg(size_t i)
{
    int conv = (int)(i * 7 % 90);
    return (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = ID_BASE + i, .conv = conv};
}

/* Produces msgs and records which id sits at which offset. */
static void produce(wxg_ct_t *t, const wxg_ct_msg_t *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_true(offsets[m[i].partition] < TOTAL);
        offset_ids[m[i].partition][offsets[m[i].partition]++] = m[i].id;
    }
    wxg_ct_produce(t, m, n);
}

typedef struct mover {
    const wxg_test_cluster_t *C;
    int from, to, count;
    int moved;
    long keys;
    atomic_int done;
} mover;

static void *move_slots(void *arg)
{
    mover *mv = arg;
    mv->moved =
        wxg_test_cluster_move_slots(mv->C, mv->from, mv->to, mv->count, 128, 400, &mv->keys);
    atomic_store(&mv->done, 1);
    return NULL;
}

static void reshard_under_running_consumers(const char *design)
{
    wxg_test_cluster_t C;
    if (wxg_test_cluster_start(&C, 3, 1) != 0)
        fail_msg("cannot start the cluster");
    /* The slots of the primary serving slot 0 go to the one serving the last slot. */
    int from = wxg_test_cluster_owner(&C, 0, 0), to = wxg_test_cluster_owner(&C, 0, 16383);
    assert_true(from >= 0 && to >= 0 && from != to);

    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-reshard", PARTITIONS);
    /* Nothing listens at redis.host/port: only the cluster's nodes can be reached. */
    t.redis_host = "127.0.0.1";
    t.redis_port = wxg_test_free_port();
    char extra[1024];
    snprintf(extra, sizeof extra,
             "redis.cluster.nodes = %s\n"
             "guard.design = %s\n"
             "guard.lease.ms = 5s\n"
             "redis.command.timeout.ms = 2s\n"
             "consumer.workers = 3\n"
             /* Every duplicate asks Redis: the near cache would answer the late ones, since a
              * duplicate comes to the replica that finished its message. */
             "guard.done.cache.entries = 0\n",
             C.seeds, design);
    wxg_ct_write_config(&t, extra);
    for (int p = 0; p < PARTITIONS; p++) {
        offset_ids[p] = calloc(TOTAL, sizeof **offset_ids);
        assert_non_null(offset_ids[p]);
        offsets[p] = 0;
    }
    int ports[2] = {wxg_ct_spawn_metrics(&t, 0), wxg_ct_spawn_metrics(&t, 1)};

    /* Both replicas hold their share before anything is produced: no rebalance in the run. */
    int64_t joined = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (!(wxg_test_metric_scrape(ports[0], "wxg_assigned_partitions") == PARTITIONS / 2 &&
             wxg_test_metric_scrape(ports[1], "wxg_assigned_partitions") == PARTITIONS / 2) &&
           wxg_test_now_ms() < joined)
        wxg_test_sleep_ms(100);
    assert_int_equal(wxg_test_metric_scrape(ports[0], "wxg_assigned_partitions"), PARTITIONS / 2);

    /* Before: messages whose DONE markers the resharding will move. */
    static wxg_ct_msg_t m[TOTAL];
    size_t n = 0;
    for (size_t i = 0; i < BEFORE; i++)
        m[n++] = msg(i);
    produce(&t, m, n);
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (wxg_ct_ledger_lines(&t) < BEFORE && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    assert_int_equal(wxg_ct_ledger_lines(&t), BEFORE);

    /* During: a third of the source's slots move while new messages and a late duplicate of
     * every earlier one arrive, in chunks. */
    mover mv = {.C = &C, .from = from, .to = to, .count = 16384 / 3 / 3};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, move_slots, &mv), 0);
    int64_t started = wxg_test_now_ms(), ended = 0;
    size_t chunks_during = 0;
    for (int c = 0; c < CHUNKS; c++) {
        n = 0;
        for (size_t i = BEFORE + (size_t)c * DURING / CHUNKS;
             i < BEFORE + (size_t)(c + 1) * DURING / CHUNKS; i++)
            m[n++] = msg(i);
        for (size_t j = (size_t)c * BEFORE / CHUNKS; j < (size_t)(c + 1) * BEFORE / CHUNKS; j++)
            m[n++] = msg(j);
        produce(&t, m, n);
        if (!atomic_load(&mv.done))
            chunks_during++;
        if (c % 10 == 9)
            check_invariant(&t);
        if (!atomic_load(&mv.done))
            wxg_test_sleep_ms(100);
    }
    /* Bounded: every command of the mover has a timeout, and it moves a fixed set of slots. */
    while (!atomic_load(&mv.done) && wxg_test_now_ms() < started + 120000 * wxg_test_scale()) {
        check_invariant(&t);
        wxg_test_sleep_ms(200);
    }
    assert_true(atomic_load(&mv.done));
    ended = wxg_test_now_ms();
    pthread_join(th, NULL);
    printf("%s: %d slots (%ld keys) moved in %lld ms; %zu of %d chunks produced meanwhile\n",
           design, mv.moved, mv.keys, (long long)(ended - started), chunks_during, CHUNKS);
    assert_int_equal(mv.moved, mv.count);
    assert_true(mv.keys > 0);
    assert_true(chunks_during >= CHUNKS / 3);
    assert_int_equal(wxg_test_cluster_owner(&C, to, 0), to);

    /* After: more new messages, and late duplicates of both earlier groups. */
    n = 0;
    for (size_t i = BEFORE + DURING; i < UNIQUE; i++)
        m[n++] = msg(i);
    for (size_t i = BEFORE; i < BEFORE + DURING; i += 3)
        m[n++] = msg(i);
    for (size_t j = 0; j < BEFORE; j += 5)
        m[n++] = msg(j);
    produce(&t, m, n);

    assert_true(wxg_ct_wait_all_committed(&t, 120000, check_invariant));
    check_invariant(&t);
    wxg_ct_assert_each_once(&t, ID_BASE, UNIQUE);

    double moved = wxg_ct_metric_sum(ports, 2, "wxg_guard_cluster_redirects_total{type=\"moved\"}");
    double ask = wxg_ct_metric_sum(ports, 2, "wxg_guard_cluster_redirects_total{type=\"ask\"}");
    double tryagain =
        wxg_ct_metric_sum(ports, 2, "wxg_guard_cluster_retries_total{reason=\"tryagain\"}");
    double dup = wxg_ct_metric_sum(ports, 2, "wxg_guard_claims_total{outcome=\"duplicate\"}");
    printf("%s: redirects moved %.0f, ask %.0f; tryagain %.0f; duplicates %.0f of %d\n", design,
           moved, ask, tryagain, dup, TOTAL - UNIQUE);
    assert_true(moved > 0);
    assert_true(ask > 0);
    /* Every duplicate came after its message's effect (same conversation, later offset): each
     * was answered DUPLICATE, none was run or parked. */
    assert_true(dup >= TOTAL - UNIQUE);
    assert_int_equal(wxg_ct_metric_sum(ports, 2, "wxg_dlq_writes_total"), 0);

    for (int r = 0; r < 2; r++) {
        int st = wxg_ct_signal(&t, r, SIGTERM, 60000);
        wxg_ct_assert_exit(&t, r, st, 0);
    }
    for (int p = 0; p < PARTITIONS; p++)
        free(offset_ids[p]);
    wxg_ct_teardown(&t);
    wxg_test_cluster_stop(&C);
}

static void native_design_stays_exact_while_a_third_of_a_primarys_slots_move(void **state)
{
    (void)state;
    reshard_under_running_consumers("native");
}

static void lua_design_stays_exact_while_a_third_of_a_primarys_slots_move(void **state)
{
    (void)state;
    reshard_under_running_consumers("lua");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(native_design_stays_exact_while_a_third_of_a_primarys_slots_move),
        cmocka_unit_test(lua_design_stays_exact_while_a_third_of_a_primarys_slots_move),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
