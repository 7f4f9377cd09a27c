/* End to end, with a private Redis server (persistent, so that a restart keeps every
 * acknowledged write): a replica is SIGTERMed while Redis is down and its workers are inside
 * the plugins of a batch. The plugins' effects happen, their DONE markers cannot be written
 * (connection refused), and Redis comes back a few seconds later, well within the drain
 * budget. The draining replica retries the completes with backoff until Redis answers, writes
 * every DONE marker, commits past them and exits 0 long before its budget is spent; whoever
 * owns the partitions next has nothing to redo, so every effect in the ledger happened once.
 *   - alone: nothing but the drain.
 *   - rebalance: another member joins the group during the drain, so the replica serves a revoke
 *     while its completes wait out their backoff. The revoke used to cancel them with the
 *     work that waits for a lease or a retry, and the next owner ran their effects again once
 *     the leases ran out; now it keeps them for its drain, and commits after they land. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "consumertest.h"
#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"

#define PARTITIONS 2
#define FIRST      20 /* processed and committed before the fault */
#define STALLED    8  /* in the plugins when Redis goes and the SIGTERM comes */
#define TOTAL      (FIRST + STALLED)
#define STALL_MS   1200
#define DRAIN_MS   15000
#define LEASE_MS   10000

/* A member of the replicas' group that is no replica (a replica cannot start while Redis is
 * down): its joining makes the group rebalance. It commits nothing. */
static rd_kafka_t *join_group(const wxg_ct_t *t)
{
    char errstr[512];
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    wxg_test_kafka_conf_set(conf, "group.id", t->group);
    wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
    wxg_test_kafka_conf_set(conf, "enable.auto.offset.store", "false");
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        fail_msg("joiner: %s", errstr);
    }
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, t->topic, RD_KAFKA_PARTITION_UA);
    assert_int_equal(rd_kafka_subscribe(rk, l), 0);
    rd_kafka_topic_partition_list_destroy(l);
    return rk;
}

/* Serves the joiner's group protocol (and drops what it fetches) for ms. */
static void serve_joiner(rd_kafka_t *rk, int64_t ms)
{
    int64_t until = wxg_test_now_ms() + ms;
    while (wxg_test_now_ms() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 50);
        if (m)
            rd_kafka_message_destroy(m);
    }
}

static void drain_while_redis_is_down(const char *tag, uint64_t id_base, int rebalance)
{
    wxg_test_redis_t redis;
    assert_int_equal(wxg_test_redis_start_persistent(&redis), 0);
    wxg_ct_t t;
    wxg_ct_setup(&t, tag, PARTITIONS);
    t.redis_host = "127.0.0.1";
    t.redis_port = redis.port;
    char ids[512], extra[1024];
    size_t at = 0;
    for (int k = 0; k < STALLED; k++)
        at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%llu", k ? "," : "",
                               (unsigned long long)(id_base + FIRST + (uint64_t)k));
    /* A lease that outlives the outage: the markers are written by their own claim. */
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = %d\n"
             "plugin.fail.match.msg_ids = %s\n"
             "consumer.workers = %d\n"
             "consumer.drain.timeout.ms = %dms\n"
             "guard.lease.ms = %dms\n"
             "redis.command.timeout.ms = 500ms\n"
             "redis.connect.timeout.ms = 500ms\n"
             "consumer.batch.max = 1\n"
             "kafka.heartbeat.interval.ms = 300\n",
             STALL_MS, ids, STALLED, DRAIN_MS, LEASE_MS);
    wxg_ct_write_config(&t, extra);
    static wxg_ct_msg_t msgs[TOTAL];
    for (size_t i = 0; i < TOTAL; i++) {
        int conv = (int)i; /* one conversation each: the stalled ones run side by side */
        msgs[i] = (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = id_base + i, .conv = conv};
    }
    int port = wxg_ct_spawn_metrics(&t, 0);
    wxg_ct_produce(&t, msgs, FIRST);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));

    /* The stalled batch: claimed (so Redis holds their leases) and inside the fail plugin. */
    wxg_ct_produce(&t, msgs + FIRST, STALLED);
    wxg_test_sleep_ms(STALL_MS / 2);
    assert_int_equal((int)wxg_ct_ledger_lines(&t), FIRST);
    wxg_test_redis_kill(&redis);
    int64_t t0 = wxg_test_now_ms();
    if (rebalance)
        assert_int_equal(kill(t.pids[0], SIGTERM), 0);
    /* The effects happen while Redis is gone; their completes fail and wait out a backoff. */
    int64_t deadline = wxg_test_now_ms() + 10000 * wxg_test_scale();
    while (wxg_ct_ledger_lines(&t) < TOTAL && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(20);
    assert_int_equal((int)wxg_ct_ledger_lines(&t), TOTAL);
    if (!rebalance) {
        /* Before the stop: /readyz says why the messages cannot finish. */
        char *body = NULL;
        int said = 0;
        deadline = wxg_test_now_ms() + 5000 * wxg_test_scale();
        while (!said && wxg_test_now_ms() < deadline) {
            free(body);
            body = NULL;
            said = wxg_test_http_get(port, "/readyz", &body) == 503 && body &&
                   strstr(body, "redis: the latest complete failed (") &&
                   strstr(body, "wait for their DONE marker");
            if (!said)
                wxg_test_sleep_ms(50);
        }
        print_message("/readyz: %s\n", body ? body : "(no answer)");
        free(body);
        assert_true(said);
        assert_int_equal(kill(t.pids[0], SIGTERM), 0);
    }
    rd_kafka_t *joiner = NULL;
    if (rebalance) {
        /* A new member: the stopping replica serves a revoke while Redis is still down. */
        joiner = join_group(&t);
        deadline = wxg_test_now_ms() + 20000 * wxg_test_scale();
        while (wxg_ct_log_count(&t, 0, "event=revoking") == 0 && wxg_test_now_ms() < deadline)
            serve_joiner(joiner, 50);
        assert_int_equal(wxg_ct_log_count(&t, 0, "event=revoking"), 1);
        serve_joiner(joiner, 300);
    }
    int64_t back = 2000 - (wxg_test_now_ms() - t0);
    if (back > 0)
        wxg_test_sleep_ms(back);
    assert_int_equal(wxg_test_redis_restart(&redis), 0);
    int64_t back_at = wxg_test_now_ms();
    if (joiner) {
        /* Until the stopping replica has served the revoke, then leave: the partitions go back
         * to the replica, which the rest of its stop hands on. */
        deadline = wxg_test_now_ms() + (DRAIN_MS + 5000) * wxg_test_scale();
        while (wxg_ct_log_count(&t, 0, "event=revoked") == 0 && wxg_test_now_ms() < deadline)
            serve_joiner(joiner, 50);
        rd_kafka_consumer_close(joiner);
        rd_kafka_destroy(joiner);
    }

    int st = wxg_ct_wait_exit(&t, 0, DRAIN_MS + 20000);
    int64_t exit_ms = wxg_test_now_ms() - back_at;
    wxg_ct_assert_exit(&t, 0, st, 0);
    print_message("exited %lld ms after Redis came back (%lld ms after SIGTERM); drain timeouts "
                  "%d, revokes %d (drain timed out: %d)\n",
                  (long long)exit_ms, (long long)(wxg_test_now_ms() - t0),
                  wxg_ct_log_count(&t, 0, "event=drain_timeout"),
                  wxg_ct_log_count(&t, 0, "event=revoked"),
                  wxg_ct_log_count(&t, 0, "drain_timed_out=true"));
    /* Not the whole budget: the markers landed soon after Redis answered again. */
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=drain_timeout"), 0);
    assert_int_equal(wxg_ct_log_count(&t, 0, "drain_timed_out=true"), 0);
    assert_true(exit_ms < (DRAIN_MS - 5000) * wxg_test_scale());
    /* The stopping replica itself committed past the markers (the joiner commits nothing). */
    for (int p = 0; p < PARTITIONS; p++)
        assert_int_equal(wxg_ct_committed(&t, p), t.produced[p]);
    wxg_ct_spawn(&t, 1);

    /* The next owner: nothing to redo (a replay is a duplicate), so each effect happened once,
     * also after the leases the stopped replica held have run out. */
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    wxg_test_sleep_ms(LEASE_MS / 2);
    wxg_ct_stop_all(&t);
    wxg_ct_assert_each_once(&t, id_base, TOTAL);
    wxg_ct_teardown(&t);
    wxg_test_redis_stop(&redis);
}

static void a_drain_writes_the_done_markers_once_redis_is_back(void **state)
{
    (void)state;
    drain_while_redis_is_down("ct-drainredis", 7301234571000000000ULL, 0);
}

static void a_revoke_during_the_drain_keeps_effects_waiting_for_their_marker(void **state)
{
    (void)state;
    drain_while_redis_is_down("ct-drainrebal", 7301234572000000000ULL, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_drain_writes_the_done_markers_once_redis_is_back),
        cmocka_unit_test(a_revoke_during_the_drain_keeps_effects_waiting_for_their_marker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
