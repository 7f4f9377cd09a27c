/* End to end: a broken dead-letter path stops progress on the poison record's partition and
 * never drops the record.
 *
 * The dead-letter topic refuses every write (its max.message.bytes is smaller than any
 * dead-letter record, so the broker answers MSG_SIZE_TOO_LARGE) while the main topic works. A
 * record that does not decode must wait: its partition's committed offset stays at it while the
 * other partition keeps flowing. Once the topic accepts writes (max.message.bytes raised), the
 * record lands in the dead-letter topic and the offset moves past it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumertest.h"
#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"

#define ID_BASE 7303234567000000000ULL
#define POISON  "{\"account\": broken"

/* Runs one admin request (CreateTopics or AlterConfigs) and waits for its result; fails the
 * test on any error. */
static void admin(const char *topic, int create, const char *max_bytes)
{
    char err[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, wxg_test_kafka_conf(), err, sizeof err);
    assert_non_null(rk);
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_ANY);
    rd_kafka_AdminOptions_set_request_timeout(opts, 10000 * wxg_test_scale(), err, sizeof err);
    rd_kafka_NewTopic_t *nt = NULL;
    rd_kafka_ConfigResource_t *cr = NULL;
    if (create) {
        nt = rd_kafka_NewTopic_new(topic, 1, 1, err, sizeof err);
        assert_non_null(nt);
        assert_int_equal(rd_kafka_NewTopic_set_config(nt, "max.message.bytes", max_bytes), 0);
        rd_kafka_CreateTopics(rk, &nt, 1, opts, q);
    } else {
        cr = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
        assert_int_equal(rd_kafka_ConfigResource_set_config(cr, "max.message.bytes", max_bytes), 0);
        rd_kafka_AlterConfigs(rk, &cr, 1, opts, q);
    }
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 15000 * wxg_test_scale());
    assert_non_null(ev);
    assert_int_equal(rd_kafka_event_error(ev), RD_KAFKA_RESP_ERR_NO_ERROR);
    if (create) {
        size_t n = 0;
        const rd_kafka_topic_result_t **res =
            rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
        assert_int_equal(n, 1);
        assert_int_equal(rd_kafka_topic_result_error(res[0]), RD_KAFKA_RESP_ERR_NO_ERROR);
    } else {
        size_t n = 0;
        const rd_kafka_ConfigResource_t **res =
            rd_kafka_AlterConfigs_result_resources(rd_kafka_event_AlterConfigs_result(ev), &n);
        assert_int_equal(n, 1);
        assert_int_equal(rd_kafka_ConfigResource_error(res[0]), RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    rd_kafka_event_destroy(ev);
    if (nt)
        rd_kafka_NewTopic_destroy(nt);
    if (cr)
        rd_kafka_ConfigResource_destroy(cr);
    rd_kafka_AdminOptions_destroy(opts);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
}

static double scrape(int port, const char *series)
{
    wxg_test_http_resp_t r;
    double v = -1;
    if (wxg_test_http(port, "GET", "/metrics", NULL, NULL, 0, &r) != 0)
        return -1;
    size_t n = strlen(series);
    for (const char *l = r.body; l && *l;) {
        if (strncmp(l, series, n) == 0 && l[n] == ' ') {
            v = strtod(l + n + 1, NULL);
            break;
        }
        l = strchr(l, '\n');
        if (l)
            l++;
    }
    wxg_test_http_free(&r);
    return v;
}

static void a_broken_dlq_stops_progress_on_that_partition_and_never_drops_the_record(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-dlqout", 2);
    char *dlq = wxg_test_kafka_name("ct-dlqout-refusing");
    admin(dlq, 1, "64");
    int port = wxg_test_free_port();
    char extra[512];
    snprintf(extra, sizeof extra,
             "dlq.topic = %s\n"
             "kafka.message.timeout.ms = 2000\n"
             "metrics.listen = 127.0.0.1:%d\n",
             dlq, port);
    wxg_ct_write_config(&t, extra);

    /* Partition 0: three messages, the poison record at offset 3, three more. Partition 1:
     * five messages. */
    wxg_ct_msg_t m[5];
    for (int i = 0; i < 3; i++)
        m[i] = (wxg_ct_msg_t){.partition = 0, .id = ID_BASE + (uint64_t)i, .conv = i};
    wxg_ct_produce(&t, m, 3);
    wxg_ct_produce_raw(&t, 0, POISON);
    for (int i = 0; i < 3; i++)
        m[i].id = ID_BASE + 10 + (uint64_t)i;
    wxg_ct_produce(&t, m, 3);
    for (int i = 0; i < 5; i++)
        m[i] = (wxg_ct_msg_t){.partition = 1, .id = ID_BASE + 20 + (uint64_t)i, .conv = 7};
    wxg_ct_produce(&t, m, 5);
    wxg_ct_spawn(&t, 0);

    /* Partition 1 completes; partition 0 commits up to the poison record and no further while
     * dead-letter writes keep failing. */
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (wxg_test_now_ms() < deadline &&
           (wxg_ct_committed(&t, 1) != 5 || wxg_ct_committed(&t, 0) != 3))
        wxg_test_sleep_ms(200);
    assert_int_equal(wxg_ct_committed(&t, 1), 5);
    assert_int_equal(wxg_ct_committed(&t, 0), 3);
    deadline = wxg_test_now_ms() + 30000 * wxg_test_scale();
    while (wxg_test_now_ms() < deadline && scrape(port, "wxg_dlq_write_errors_total") < 2)
        wxg_test_sleep_ms(200);
    assert_true(scrape(port, "wxg_dlq_write_errors_total") >= 2);
    assert_int_equal(wxg_ct_committed(&t, 0), 3);
    assert_int_equal(scrape(port, "wxg_dlq_writes_total"), 0);
    /* The messages behind the poison record were processed all the same. */
    wxg_ct_effect_t *eff;
    assert_int_equal(wxg_ct_read_ledger(&t, &eff, NULL), 11);
    free(eff);

    /* The topic accepts writes again: the record lands there and the offset moves on. */
    admin(dlq, 0, "1048588");
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    assert_int_equal(wxg_ct_committed(&t, 0), 7);
    wxg_test_kafka_msg_t *got = NULL;
    size_t n = wxg_test_kafka_read(dlq, 2, 3000, &got);
    assert_int_equal(n, 1);
    assert_string_equal(got[0].value, POISON);
    wxg_test_kafka_msgs_free(got, n);
    assert_int_equal(scrape(port, "wxg_dlq_writes_total"), 1);
    assert_int_equal(scrape(port, "wxg_decode_errors_total"), 1);

    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    free(dlq);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_broken_dlq_stops_progress_on_that_partition_and_never_drops_the_record),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
