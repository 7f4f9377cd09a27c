/* A rebalance storm, in one process, so that ThreadSanitizer sees every thread of every replica
 * (the TSan build runs it like any other test):
 *   - up to four consumers of one group, each with its own librdkafka handle, pool, watchdog,
 *     plugin chain and dead-letter producer, each running in a thread of this process; every
 *     STORM_STEP_MS one of them leaves (wxg_consumer_stop: drain, commit, close) or a stopped
 *     one joins again, for WXG_STORM_SECONDS (30 by default);
 *   - meanwhile a steady stream of callbacks over 6 partitions, a fifth of them late
 *     duplicates of messages sent at least two seconds before, one in 20 stalling 40 ms in the
 *     fail plugin with small pools (2 workers, 16 messages), so that partitions are paused
 *     while they are handed around;
 *   - the committed offsets, read every 100 ms by a client of their own: a committed offset
 *     never passes a message without its effect (I3) and never goes back;
 *   - at the end: every message committed, and the record plugin's ledger holds exactly one
 *     effect per message (I1, I2): a replica that leaves drains, so nothing runs twice. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "consumertest.h"
#include "testenv.h"
#include "wxguard/conf.h"
#include "wxguard/consumer.h"
#include "wxguard/dlq.h"
#include "wxguard/guard.h"
#include "wxguard/log.h"
#include "wxguard/plugin_registry.h"

#define PARTITIONS    6
#define CONVS         120
#define SLOTS         4
#define STORM_STEP_MS 2000
#define RATE          100 /* records a second */
#define MAX_MSGS      (RATE * 600)
#define ID_BASE       7302434567000000000ULL

/* One in-process replica. */
typedef struct replica {
    wxg_conf_t *conf;
    wxg_plugin_chain_t *chain;
    wxg_producer_t *producer;
    wxg_dlq_t *dlq;
    wxg_guard_conf_t gc;
    char prefix[WXG_GUARD_PREFIX_MAX + 1];
    wxg_consumer_t *c;
    pthread_t thread;
    int running;
    int rc;
    int starts;
} replica;

static wxg_ct_t t;
static replica slots[SLOTS];
static uint64_t *offset_ids[PARTITIONS];
static int64_t last_committed[PARTITIONS];

static void *run_replica(void *arg)
{
    replica *r = arg;
    r->rc = wxg_consumer_run(r->c);
    return NULL;
}

static void start_replica(replica *r)
{
    char err[512] = "";
    r->conf = wxg_conf_new(WXG_PROG_CONSUMER, err, sizeof err);
    assert_non_null(r->conf);
    if (wxg_conf_load_file(r->conf, t.config, err, sizeof err) != 0 ||
        wxg_conf_check(r->conf, err, sizeof err) != 0)
        fail_msg("configuration: %s", err);
    const char *fail_every = wxg_conf_get(r->conf, "plugin.fail.match.every");
    wxg_plugin_kv_t kv[] = {{"plugin.record.path", t.ledger},
                            {"plugin.fail.action", "stall"},
                            {"plugin.fail.stall.ms", "40"},
                            {"plugin.fail.match.every", fail_every ? fail_every : "20"}};
    if (wxg_plugin_chain_new("fail,record", kv, 4, &r->chain, err, sizeof err) != 0)
        fail_msg("chain: %s", err);
    rd_kafka_conf_t *kconf = wxg_conf_kafka(r->conf, err, sizeof err);
    assert_non_null(kconf);
    r->producer = wxg_producer_new_like(kconf, WXG_PRODUCER_CONNECTION, NULL, 0, err, sizeof err);
    assert_non_null(r->producer);
    wxg_plugin_chain_set_producer(r->chain, r->producer);
    r->dlq = wxg_dlq_new(r->producer, t.dlq, t.group, err, sizeof err);
    assert_non_null(r->dlq);
    wxg_consumer_conf_t cc;
    if (wxg_conf_guard(r->conf, &r->gc, r->prefix, sizeof r->prefix, err, sizeof err) != 0 ||
        wxg_conf_consumer(r->conf, &cc, err, sizeof err) != 0)
        fail_msg("mapping: %s", err);
    cc.kafka = kconf;
    cc.guard = &r->gc;
    cc.chain = r->chain;
    cc.dlq = r->dlq;
    r->c = wxg_consumer_new(&cc, err, sizeof err);
    if (!r->c)
        fail_msg("consumer: %s", err);
    assert_int_equal(pthread_create(&r->thread, NULL, run_replica, r), 0);
    r->running = 1;
    r->starts++;
}

static void stop_replica(replica *r)
{
    wxg_consumer_stop(r->c);
    assert_int_equal(pthread_join(r->thread, NULL), 0);
    assert_int_equal(r->rc, 0);
    assert_int_equal(wxg_consumer_abandoned(r->c), 0);
    wxg_consumer_destroy(r->c);
    wxg_dlq_destroy(r->dlq);
    wxg_producer_destroy(r->producer, 5000);
    wxg_plugin_chain_destroy(r->chain);
    wxg_conf_free(r->conf);
    r->c = NULL;
    r->running = 0;
}

/* One sample of the committed offsets: I3, and no offset goes back. */
static void check_sample(wxg_ct_t *ct)
{
    int64_t committed[PARTITIONS];
    wxg_ct_committed_all(ct, committed);
    for (int p = 0; p < PARTITIONS; p++) {
        if (committed[p] < last_committed[p])
            fail_msg("partition %d: committed offset went back from %lld to %lld", p,
                     (long long)last_committed[p], (long long)committed[p]);
        last_committed[p] = committed[p];
    }
    wxg_ct_check_commit_invariant(ct, offset_ids);
}

static int running_count(void)
{
    int n = 0;
    for (int i = 0; i < SLOTS; i++)
        n += slots[i].running;
    return n;
}

static void a_rebalance_storm_loses_nothing_repeats_nothing_and_commits_safely(void **state)
{
    (void)state;
    const char *env = getenv("WXG_STORM_SECONDS");
    long seconds = env ? strtol(env, NULL, 10) : 30;
    if (seconds < 10)
        seconds = 10;
    if (seconds > 600)
        seconds = 600;
    char logp[600];
    wxg_ct_setup(&t, "ct-storm", PARTITIONS);
    snprintf(logp, sizeof logp, "%s/replicas.log", t.dir);
    FILE *logf = fopen(logp, "a");
    assert_non_null(logf);
    wxg_log_set_sink(wxg_log_sink_file, logf);
    wxg_ct_write_config(&t, "plugins = fail,record\n"
                            "plugin.fail.match.every = 20\n"
                            "consumer.workers = 2\n"
                            "consumer.queue.capacity = 16\n"
                            "consumer.batch.max = 4\n"
                            "consumer.drain.timeout.ms = 5s\n"
                            "guard.lease.ms = 3s\n"
                            "kafka.partition.assignment.strategy = cooperative-sticky\n");

    /* The plan: RATE records a second, a fifth of them late duplicates. */
    size_t total = (size_t)seconds * RATE;
    static wxg_ct_msg_t msgs[MAX_MSGS];
    size_t unique = 0;
    unsigned seed = 5;
    for (size_t i = 0; i < total; i++) {
        if (i > 2 * RATE && rand_r(&seed) % 5 == 0) {
            msgs[i] = msgs[(size_t)rand_r(&seed) % (i - 2 * RATE)];
        } else {
            int conv = rand_r(&seed) % CONVS;
            msgs[i] = (wxg_ct_msg_t){
                .partition = conv % PARTITIONS, .id = ID_BASE + unique, .conv = conv};
            unique++;
        }
    }
    wxg_ct_index_offsets(&t, msgs, total, offset_ids);
    for (int p = 0; p < PARTITIONS; p++)
        last_committed[p] = -1001;

    start_replica(&slots[0]);
    start_replica(&slots[1]);
    /* Every 100 ms: RATE / 10 records and a sample; every STORM_STEP_MS a replica leaves or
     * joins, cycling through the slots, with one to four running. */
    size_t sent = 0;
    unsigned steps = 0, leaves = 0, joins = 0, rng = 9;
    int64_t next_step = wxg_test_now_ms() + STORM_STEP_MS;
    while (sent < total) {
        size_t n = total - sent < RATE / 10 ? total - sent : RATE / 10;
        wxg_ct_produce(&t, msgs + sent, n);
        sent += n;
        check_sample(&t);
        if (wxg_test_now_ms() >= next_step) {
            int running = running_count();
            int join = running == 1 || (running < SLOTS && rand_r(&rng) % 2 == 0);
            int pick = rand_r(&rng) % SLOTS;
            for (int k = 0; k < SLOTS; k++) {
                replica *r = &slots[(pick + k) % SLOTS];
                if (r->running != join) {
                    if (join)
                        start_replica(r);
                    else
                        stop_replica(r);
                    break;
                }
            }
            joins += join;
            leaves += !join;
            steps++;
            next_step = wxg_test_now_ms() + STORM_STEP_MS;
        }
        wxg_test_sleep_ms(100);
    }
    assert_true(wxg_ct_wait_all_committed_every(&t, 180000, check_sample, 100));
    check_sample(&t);
    wxg_ct_assert_each_once(&t, ID_BASE, unique);
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i].running)
            stop_replica(&slots[i]);
    }
    wxg_log_set_sink(NULL, NULL);
    fclose(logf);
    int pauses = 0, assigned = 0, revoked = 0;
    {
        FILE *f = fopen(logp, "r");
        assert_non_null(f);
        char line[16384];
        while (fgets(line, sizeof line, f)) {
            pauses += strstr(line, "event=pause ") != NULL;
            assigned += strstr(line, "event=assigned ") != NULL;
            revoked += strstr(line, "event=revoked ") != NULL;
        }
        fclose(f);
    }
    print_message("%ld s: %zu records, %zu unique; %u storm steps (%u joins, %u leaves); "
                  "assignments %d, revokes %d, pauses %d\n",
                  seconds, total, unique, steps, joins, leaves, assigned, revoked, pauses);
    /* The storm really happened: replicas came and went, and the group rebalanced again and
     * again. Not one assignment per step: under a sanitizer a rebalance can outlast a step, and
     * the group then settles several steps in one (an ASan run saw 17 steps, 10 assignments, 7
     * revokes). */
    assert_true(joins >= 2 && leaves >= 2);
    assert_true(assigned >= 4 && revoked >= 2);
    wxg_ct_free_offsets(&t, offset_ids);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_rebalance_storm_loses_nothing_repeats_nothing_and_commits_safely),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
