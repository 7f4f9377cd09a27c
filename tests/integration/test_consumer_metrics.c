/* End to end: wxguard-consumer's /metrics, /healthz and /readyz on metrics.listen.
 *  - after a stream with duplicates, the counters say exactly what happened: records polled,
 *    claims by outcome, messages processed, plugin results; /healthz is 200 and /readyz is 200
 *    once the replica holds its partitions;
 *  - a message whose plugin stalls longer than consumer.stall.timeout.ms (its lease renewed
 *    meanwhile) turns /readyz to 503 with a reason naming the partition and offset, logs one
 *    "stalled" line naming partition, offset and key, and readiness comes back when it ends;
 *    meanwhile the messages behind it take effect but the committed offset, sampled every
 *    100 ms, never passes it;
 *  - an idle replica notices a Redis outage through its watchdog's probe: /readyz turns 503
 *    naming Redis, wxg_redis_reachable drops to 0 with one log line, and both come back when
 *    Redis does. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumertest.h"
#include "wxguard/common.h"
#include "testenv.h"
#include "testhttp.h"

#define ID_BASE 7302234567000000000ULL

/* Scrapes /metrics until `series` reaches at least `want` (counters settle a moment after the
 * broker shows a commit), for at most timeout_ms. Returns the last value seen. */
static double wait_sample(int port, const char *series, double want, int64_t timeout_ms)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    double v = -1;
    for (;;) {
        char *b = NULL;
        if (wxg_test_http_get(port, "/metrics", &b) == 200)
            v = wxg_test_metric_sample(b, series);
        free(b);
        if (v >= want || wxg_test_now_ms() >= deadline)
            return v;
        wxg_test_sleep_ms(100);
    }
}

/* Every family of the replica's own (`wxg_` names) that a scrape shows is listed in
 * docs/metrics.md, the contract with the files in deploy/. */
static void every_family_is_documented(const char *body)
{
    const char *src = getenv("WXG_SOURCE_DIR");
    assert_non_null(src);
    char path[512];
    snprintf(path, sizeof path, "%s/docs/metrics.md", src);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char doc[256 * 1024];
    size_t len = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[len] = '\0';
    int families = 0;
    for (const char *l = strstr(body, "# TYPE wxg_"); l; l = strstr(l + 1, "# TYPE wxg_")) {
        char name[160], listed[170];
        if (sscanf(l, "# TYPE %159s", name) != 1)
            continue;
        snprintf(listed, sizeof listed, "| `%s` |", name);
        if (!strstr(doc, listed))
            fail_msg("%s is registered but not listed in docs/metrics.md", name);
        families++;
    }
    assert_true(families >= 30);
}

static void counters_match_what_was_processed_and_readyz_turns_ready_once_assigned(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-metrics", 3);
    int port = wxg_test_free_port();
    char extra[256];
    snprintf(extra, sizeof extra, "metrics.listen = 127.0.0.1:%d\n", port);
    wxg_ct_write_config(&t, extra);
    wxg_ct_spawn(&t, 0);

    assert_true(wxg_test_http_wait_status(port, "/healthz", 200, 20000, NULL));
    char *body = NULL;
    assert_true(wxg_test_http_wait_status(port, "/readyz", 200, 30000, &body));
    assert_non_null(strstr(body, "3 partitions assigned"));
    free(body);

    /* 30 unique messages over three partitions, then 10 of them again, each duplicate on the
     * partition and conversation of its original, so that it is claimed only after the
     * original is DONE: 10 DUPLICATE outcomes and no BUSY. */
    wxg_ct_msg_t m[40];
    for (int i = 0; i < 30; i++)
        m[i] = (wxg_ct_msg_t){.partition = i % 3, .id = ID_BASE + (uint64_t)i, .conv = i % 3};
    for (int i = 0; i < 10; i++)
        m[30 + i] = m[i * 3];
    wxg_ct_produce(&t, m, 40);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));

    assert_true(wait_sample(port, "wxg_claim_to_commit_seconds_count", 1, 5000) >= 1);
    assert_int_equal(wait_sample(port, "wxg_guard_done_cache_entries", 30, 5000), 30);
    assert_int_equal(wxg_test_http_get(port, "/metrics", &body), 200);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_consumer_records_total"), 40);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_guard_claims_total{outcome=\"claimed\"}"),
                     30);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_guard_claims_total{outcome=\"duplicate\"}"),
                     10);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_guard_claims_total{outcome=\"busy\"}"), 0);
    /* This replica completed every original itself, so the near cache answered every
     * duplicate, and it holds the 30 completed messages. */
    assert_int_equal(wxg_test_metric_sample(body, "wxg_guard_done_cache_hits_total"), 10);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_guard_done_cache_evictions_total"), 0);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_messages_processed_total"), 30);
    assert_int_equal(
        wxg_test_metric_sample(body, "wxg_plugin_results_total{plugin=\"record\",result=\"ok\"}"),
        30);
    assert_int_equal(
        wxg_test_metric_sample(body, "wxg_plugin_results_total{plugin=\"record\",result=\"fail\"}"),
        0);
    assert_int_equal(
        wxg_test_metric_sample(body, "wxg_plugin_duration_seconds_count{plugin=\"record\"}"), 30);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_decode_errors_total"), 0);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_dlq_writes_total"), 0);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_lease_lost_total"), 0);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_assigned_partitions"), 3);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_stalled"), 0);
    /* Not a cluster: its series are there, at 0. */
    assert_int_equal(
        wxg_test_metric_sample(body, "wxg_guard_cluster_redirects_total{type=\"moved\"}"), 0);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_guard_cluster_node_errors_total"), 0);
    assert_true(wxg_test_metric_sample(body, "wxg_rebalances_total{type=\"assign\"}") >= 1);
    assert_true(wxg_test_metric_sample(body, "wxg_commits_total") >= 1);
    assert_true(wxg_test_metric_sample(body, "wxg_claim_duration_seconds_count") >= 1);
    assert_true(wxg_test_metric_sample(body, "wxg_claim_to_commit_seconds_count") >= 1);
    assert_true(wxg_test_metric_sample(body, "wxg_claim_to_commit_seconds_count") <= 40);
    every_family_is_documented(body);
    free(body);

    /* Lag per partition: every record is finished, so each partition's lag settles at 0. */
    for (int p = 0; p < 3; p++) {
        char series[256];
        snprintf(series, sizeof series, "wxg_consumer_lag{topic=\"%s\",partition=\"%d\"}", t.topic,
                 p);
        int64_t deadline = wxg_test_now_ms() + 10000 * wxg_test_scale();
        double v = -1;
        while (wxg_test_now_ms() < deadline) {
            char *b = NULL;
            if (wxg_test_http_get(port, "/metrics", &b) == 200)
                v = wxg_test_metric_sample(b, series);
            free(b);
            if (v == 0)
                break;
            wxg_test_sleep_ms(200);
        }
        assert_true(v == 0);
    }

    /* The ledger agrees: one effect per unique message. */
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&t, &eff, NULL);
    assert_int_equal(n, 30);
    free(eff);

    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    wxg_ct_teardown(&t);
}

static void a_stalled_message_turns_readyz_false_with_one_log_line_until_it_ends(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-stall", 1);
    int port = wxg_test_free_port();
    char extra[512];
    snprintf(extra, sizeof extra,
             "metrics.listen = 127.0.0.1:%d\n"
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = %d\n"
             "plugin.fail.match.msg_ids = %llu\n"
             "guard.lease.ms = 1000\n"
             "consumer.stall.timeout.ms = 1s\n"
             "consumer.batch.max = 1\n",
             port, 6000, (unsigned long long)(ID_BASE + 500));
    wxg_ct_write_config(&t, extra);
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_test_http_wait_status(port, "/readyz", 200, 30000, NULL));

    /* Offset 0 stalls; the two behind it (other conversations, other batches: one message a
     * batch, or they would wait in the stalled one's) finish but cannot move the watermark
     * past it. */
    wxg_ct_msg_t m[3] = {
        {.partition = 0, .id = ID_BASE + 500, .conv = 1},
        {.partition = 0, .id = ID_BASE + 501, .conv = 2},
        {.partition = 0, .id = ID_BASE + 502, .conv = 3},
    };
    wxg_ct_produce(&t, m, 3);

    char *body = NULL;
    assert_true(wxg_test_http_wait_status(port, "/readyz", 503, 10000, &body));
    char want[512];
    snprintf(want, sizeof want, "stalled: %s partition 0 offset 0", t.topic);
    assert_non_null(strstr(body, want));
    free(body);
    assert_true(wait_sample(port, "wxg_stalled", 1, 2000) == 1);

    /* During the stall, sampled every 100 ms: the two messages behind it take effect, and
     * the committed offset never passes offset 0 (nothing is committed at all), until the
     * stalled message's own effect is there. */
    int64_t deadline = wxg_test_now_ms() + 20000 * wxg_test_scale();
    int samples = 0, behind_done = 0;
    for (;;) {
        int64_t c = wxg_ct_committed(&t, 0);
        wxg_ct_effect_t *eff;
        size_t n = wxg_ct_read_ledger(&t, &eff, NULL);
        int stalled_done = 0, behind = 0;
        for (size_t i = 0; i < n; i++) {
            stalled_done |= eff[i].id == ID_BASE + 500;
            behind += eff[i].id != ID_BASE + 500;
        }
        free(eff);
        if (stalled_done)
            break;
        if (c > 0)
            fail_msg("committed offset %lld passes the stalled message at offset 0", (long long)c);
        behind_done |= behind == 2;
        samples++;
        assert_true(wxg_test_now_ms() < deadline);
        wxg_test_sleep_ms(100);
    }
    print_message("%d samples of the committed offset during the stall\n", samples);
    assert_true(behind_done);
    assert_true(samples >= 10);

    /* Readiness comes back once the plugin returns and the record is finished. */
    assert_true(wxg_test_http_wait_status(port, "/readyz", 200, 20000, NULL));
    assert_true(wxg_ct_wait_all_committed(&t, 20000, NULL));
    assert_int_equal(wxg_test_http_get(port, "/metrics", &body), 200);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_stalled"), 0);
    assert_int_equal(wxg_test_metric_sample(body, "wxg_lease_lost_total"), 0);
    assert_int_equal(
        wxg_test_metric_sample(body, "wxg_plugin_results_total{plugin=\"fail\",result=\"ok\"}"), 3);
    free(body);

    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* One line for the whole stall, naming partition, offset and the message's key (hashed);
     * one line when it cleared. */
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=stalled"), 1);
    char id[32];
    snprintf(id, sizeof id, "%llu", (unsigned long long)(ID_BASE + 500));
    char line[1024] = "";
    {
        char logp[600];
        snprintf(logp, sizeof logp, "%s/replica-0.log", t.dir);
        FILE *f = fopen(logp, "r");
        assert_non_null(f);
        while (fgets(line, sizeof line, f)) {
            if (strstr(line, "event=stalled"))
                break;
        }
        fclose(f);
    }
    assert_non_null(strstr(line, "partition=0"));
    assert_non_null(strstr(line, "offset=0"));
    /* The key is a personal id: hashed unless log.personal.ids asks for it. */
    assert_non_null(strstr(line, "key=h:"));
    assert_null(strstr(line, id));
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=stall_cleared"), 1);
    wxg_ct_teardown(&t);
}

static void an_idle_replica_notices_a_redis_outage_through_its_probe(void **state)
{
    (void)state;
    wxg_test_redis_t redis;
    assert_int_equal(wxg_test_redis_start(&redis, NULL), 0);
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-probe", 1);
    t.redis_host = "127.0.0.1";
    t.redis_port = redis.port;
    int port = wxg_test_free_port();
    char extra[512];
    snprintf(extra, sizeof extra,
             "metrics.listen = 127.0.0.1:%d\n"
             "redis.probe.interval.ms = 200ms\n"
             "redis.command.timeout.ms = 500ms\n"
             "redis.connect.timeout.ms = 500ms\n",
             port);
    wxg_ct_write_config(&t, extra);
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_test_http_wait_status(port, "/readyz", 200, 30000, NULL));
    assert_true(wxg_test_metric_wait(port, "wxg_redis_reachable", 1, 2000));
    char *metrics = NULL;
    assert_int_equal(wxg_test_http_get(port, "/metrics", &metrics), 200);
    assert_true(wxg_test_metric_sample(metrics, "process_resident_memory_bytes") > 0);
    assert_true(wxg_test_metric_sample(metrics, "process_open_fds") > 0);
    char info[128];
    snprintf(info, sizeof info, "wxg_build_info{program=\"wxguard-consumer\",version=\"%s\"}",
             WXG_VERSION_STRING);
    assert_true(wxg_test_metric_sample(metrics, info) == 1);
    free(metrics);

    /* No message is in flight, so only the probe can see this. */
    wxg_test_redis_kill(&redis);
    char *body = NULL;
    assert_true(wxg_test_http_wait_status(port, "/readyz", 503, 10000, &body));
    assert_non_null(strstr(body, "redis: the latest probe or lease renewal failed"));
    free(body);
    assert_true(wxg_test_metric_wait(port, "wxg_redis_reachable", 0, 5000));
    /* It stays unready while Redis stays away: each probe refreshes the failure. */
    wxg_test_sleep_ms(1000);
    assert_int_equal(wxg_test_http_get(port, "/readyz", NULL), 503);

    assert_int_equal(wxg_test_redis_restart(&redis), 0);
    assert_true(wxg_test_http_wait_status(port, "/readyz", 200, 15000, NULL));
    assert_true(wxg_test_metric_wait(port, "wxg_redis_reachable", 1, 5000));

    /* And it works: a message produced now is processed. */
    wxg_ct_msg_t m = {.partition = 0, .id = ID_BASE + 900, .conv = 1};
    wxg_ct_produce(&t, &m, 1);
    assert_true(wxg_ct_wait_all_committed(&t, 30000, NULL));
    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=redis_unreachable"), 1);
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=redis_reachable"), 1);
    wxg_ct_teardown(&t);
    wxg_test_redis_stop(&redis);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(counters_match_what_was_processed_and_readyz_turns_ready_once_assigned),
        cmocka_unit_test(a_stalled_message_turns_readyz_false_with_one_log_line_until_it_ends),
        cmocka_unit_test(an_idle_replica_notices_a_redis_outage_through_its_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
