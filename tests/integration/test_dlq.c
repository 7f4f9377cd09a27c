/* Integration tests for the dead-letter writer and the plugin produce path against a real Kafka
 * broker (WXG_TEST_KAFKA_BOOTSTRAP): a dead-letter record lands with the original bytes, key and
 * every header; concurrent writers each get their own delivery; a plugin's produce waits for
 * the delivery report; and a broken dead-letter topic (unreachable cluster, missing topic with
 * auto-creation off) is an error within the bound, never success. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testenv.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"
#include "wxguard/plugin_registry.h"

/* ----- helpers: topics and a reader ----- */

static void unique_topic(char *buf, size_t size, const char *tag)
{
    static int seq;
    snprintf(buf, size, "wxg-test-%s-%ld-%" PRId64 "-%d", tag, (long)getpid(), wxg_test_now_ms(),
             seq++);
}

static rd_kafka_t *admin_handle(void)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(
        rd_kafka_conf_set(conf, "bootstrap.servers", wxg_test_kafka_bootstrap(), err, sizeof err),
        RD_KAFKA_CONF_OK);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk)
        fail_msg("admin handle: %s", err);
    return rk;
}

static void create_topic(const char *topic, int partitions)
{
    char err[512];
    rd_kafka_t *rk = admin_handle();
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, partitions, 1, err, sizeof err);
    assert_non_null(nt);
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000 * wxg_test_scale());
    assert_non_null(ev);
    const rd_kafka_CreateTopics_result_t *res = rd_kafka_event_CreateTopics_result(ev);
    assert_non_null(res);
    size_t n = 0;
    const rd_kafka_topic_result_t **tr = rd_kafka_CreateTopics_result_topics(res, &n);
    assert_int_equal(n, 1);
    rd_kafka_resp_err_t e = rd_kafka_topic_result_error(tr[0]);
    if (e && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
        fail_msg("create topic %s: %s", topic, rd_kafka_err2str(e));
    rd_kafka_event_destroy(ev);
    rd_kafka_queue_destroy(q);
    rd_kafka_NewTopic_destroy(nt);
    rd_kafka_destroy(rk);
}

/* 1 when the cluster's metadata lists `topic`. */
static int topic_exists(const char *topic)
{
    rd_kafka_t *rk = admin_handle();
    const struct rd_kafka_metadata *md = NULL;
    int found = 0;
    if (rd_kafka_metadata(rk, 1, NULL, &md, 10000 * wxg_test_scale()) == 0) {
        for (int i = 0; i < md->topic_cnt; i++)
            found |= strcmp(md->topics[i].topic, topic) == 0 && md->topics[i].err == 0;
        rd_kafka_metadata_destroy(md);
    } else {
        fail_msg("metadata request failed");
    }
    rd_kafka_destroy(rk);
    return found;
}

/* A consumed record, copied out of librdkafka: a consumer handle cannot be destroyed while
 * any of its messages is alive, so the reader copies and destroys them before closing. */
typedef struct consumed {
    int64_t offset;
    void *payload; /* NULL for a null value */
    size_t len;
    void *key; /* NULL for a null key */
    size_t key_len;
    rd_kafka_headers_t *headers; /* NULL when the record had none */
} consumed;

static void *dup_bytes(const void *p, size_t n)
{
    if (!p)
        return NULL;
    void *d = malloc(n ? n : 1);
    assert_non_null(d);
    memcpy(d, p, n);
    return d;
}

static void rec_free(consumed *r)
{
    free(r->payload);
    free(r->key);
    if (r->headers)
        rd_kafka_headers_destroy(r->headers);
}

/* Reads up to max records of one partition of topic from the beginning into out (the caller
 * frees them with rec_free). Bounded by count and time. */
static size_t read_partition(const char *topic, int32_t partition, consumed *out, size_t max)
{
    char err[512], group[128];
    snprintf(group, sizeof group, "wxg-test-reader-%ld-%" PRId64, (long)getpid(),
             wxg_test_now_ms());
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", wxg_test_kafka_bootstrap(), err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", group, err, sizeof err);
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_conf_set(conf, "enable.partition.eof", "true", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    assert_non_null(rk);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *tp = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(tp, topic, partition)->offset = RD_KAFKA_OFFSET_BEGINNING;
    assert_int_equal(rd_kafka_assign(rk, tp), 0);
    rd_kafka_topic_partition_list_destroy(tp);
    size_t n = 0;
    int64_t deadline = wxg_test_now_ms() + 30000 * wxg_test_scale();
    while (n < max && wxg_test_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            rd_kafka_message_destroy(m);
            if (n > 0)
                break; /* everything written so far has been read */
            continue;
        }
        if (m->err) {
            rd_kafka_message_destroy(m);
            continue; /* transient (e.g. leader not yet known) */
        }
        rd_kafka_headers_t *h = NULL;
        out[n] = (consumed){.offset = m->offset,
                            .payload = dup_bytes(m->payload, m->len),
                            .len = m->len,
                            .key = dup_bytes(m->key, m->key_len),
                            .key_len = m->key_len};
        if (rd_kafka_message_headers(m, &h) == 0)
            out[n].headers = rd_kafka_headers_copy(h);
        n++;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

/* The value of header `name`, asserting it occurs exactly once. */
static const char *header(const consumed *m, const char *name, size_t *len)
{
    rd_kafka_headers_t *h = m->headers;
    assert_non_null(h);
    const void *v = NULL;
    size_t sz = 0;
    if (rd_kafka_header_get(h, 1, name, &v, &sz) == 0)
        fail_msg("header %s occurs more than once", name);
    if (rd_kafka_header_get_last(h, name, &v, &sz) != 0)
        fail_msg("header %s is missing", name);
    if (len)
        *len = sz;
    return v;
}

static void assert_header(const consumed *m, const char *name, const char *want)
{
    size_t len = 0;
    const char *v = header(m, name, &len);
    assert_non_null(v);
    if (len != strlen(want) || memcmp(v, want, len) != 0)
        fail_msg("header %s is '%.*s', want '%s'", name, (int)len, v, want);
}

static wxg_producer_t *producer_for(const char *bootstrap, const char *timeout_ms,
                                    const char *extra_name, const char *extra_value)
{
    char err[512];
    wxg_kafka_prop_t props[3] = {{"bootstrap.servers", bootstrap},
                                 {"message.timeout.ms", timeout_ms}};
    size_t n = 2;
    if (extra_name)
        props[n++] = (wxg_kafka_prop_t){extra_name, extra_value};
    wxg_producer_t *p = wxg_producer_new(props, n, err, sizeof err);
    if (!p)
        fail_msg("producer: %s", err);
    return p;
}

/* ----- tests ----- */

static void dlq_record_lands_with_original_bytes_key_and_all_headers(void **state)
{
    (void)state;
    char topic[160], err[1024] = "";
    unique_topic(topic, sizeof topic, "dlq");
    create_topic(topic, 1);
    wxg_producer_t *p = producer_for(wxg_test_kafka_bootstrap(), "30000", NULL, NULL);
    wxg_dlq_t *d = wxg_dlq_new(p, topic, "wxg-consumers", err, sizeof err);
    assert_non_null(d);

    /* Original bytes that no text round trip would keep: NUL, 0xFF, a huge id. */
    static const unsigned char value[] = "{\"msgId\":7301234567890123457,\"x\":\"\0\xff\"}";
    const size_t value_len = sizeof value - 1;
    char reason[3000] = "";
    for (size_t i = 0; i + 2 < sizeof reason; i += 2)
        memcpy(reason + i, "\xc3\xa9", 2); /* "é" repeated: the cut must not split one */
    reason[sizeof reason - 2] = '\0';
    wxg_kafka_header_t orig[] = {{"format", "wkteam", 6},
                                 {WXG_DLQ_HDR_REASON, "from an earlier parking", 23}};
    wxg_dlq_record_t rec = {.topic = "callbacks",
                            .partition = 4,
                            .offset = 9876543210,
                            .key = "wxid_bot:room_1",
                            .key_len = 15,
                            .value = value,
                            .value_len = value_len,
                            .headers = orig,
                            .header_count = 2,
                            .timestamp_ms = 1700000000123,
                            .error = WXG_EPLUGIN,
                            .reason = reason,
                            .attempts = 5,
                            .first_failure_ms = 1700000001000,
                            .last_failure_ms = 1700000009000,
                            .idempotency_key = "wxid_bot:n:7301234567890123457",
                            .plugin = "billing"};
    wxg_delivery_t dr = {.partition = -1, .offset = -1};
    int rc = wxg_dlq_write(d, &rec, &dr, err, sizeof err);
    if (rc != 0)
        fail_msg("dlq write: %s (%s)", err, wxg_err_name(rc));
    assert_int_equal(dr.partition, 0);
    assert_int_equal(dr.offset, 0);

    /* A record without key and value (a tombstone-like original) is parked too. */
    wxg_dlq_record_t bare = {.topic = "callbacks",
                             .partition = 0,
                             .offset = 1,
                             .timestamp_ms = -1,
                             .error = WXG_EPARSE,
                             .attempts = 1};
    assert_int_equal(wxg_dlq_write(d, &bare, &dr, err, sizeof err), 0);
    assert_int_equal(dr.offset, 1);

    consumed got[4];
    size_t n = read_partition(topic, 0, got, 4);
    assert_int_equal(n, 2);
    consumed *m = &got[0];
    assert_int_equal(m->len, value_len);
    assert_memory_equal(m->payload, value, value_len);
    assert_int_equal(m->key_len, 15);
    assert_memory_equal(m->key, "wxid_bot:room_1", 15);
    assert_header(m, "format", "wkteam");
    assert_header(m, WXG_DLQ_HDR_TOPIC, "callbacks");
    assert_header(m, WXG_DLQ_HDR_PARTITION, "4");
    assert_header(m, WXG_DLQ_HDR_OFFSET, "9876543210");
    assert_header(m, WXG_DLQ_HDR_KEY, "wxid_bot:room_1");
    assert_header(m, WXG_DLQ_HDR_TIMESTAMP, "1700000000123");
    assert_header(m, WXG_DLQ_HDR_ERROR, "EPLUGIN");
    assert_header(m, WXG_DLQ_HDR_ATTEMPTS, "5");
    assert_header(m, WXG_DLQ_HDR_FIRST_FAILURE, "1700000001000");
    assert_header(m, WXG_DLQ_HDR_LAST_FAILURE, "1700000009000");
    assert_header(m, WXG_DLQ_HDR_GROUP, "wxg-consumers");
    assert_header(m, WXG_DLQ_HDR_IDEMPOTENCY, "wxid_bot:n:7301234567890123457");
    assert_header(m, WXG_DLQ_HDR_PLUGIN, "billing");
    size_t rlen = 0;
    const char *r = header(m, WXG_DLQ_HDR_REASON, &rlen); /* the stale one was replaced */
    assert_true(rlen < WXG_DLQ_REASON_MAX);
    assert_true(rlen > WXG_DLQ_REASON_MAX - 8);
    assert_memory_equal(r + rlen - 5, "\xc3\xa9...", 5); /* cut between characters */

    m = &got[1];
    assert_null(m->payload);
    assert_null(m->key);
    size_t klen = 99;
    assert_null(header(m, WXG_DLQ_HDR_KEY, &klen)); /* a null header: "there was no key" */
    assert_int_equal(klen, 0);
    assert_header(m, WXG_DLQ_HDR_ERROR, "EPARSE");
    assert_header(m, WXG_DLQ_HDR_REASON, wxg_strerror(WXG_EPARSE));
    rd_kafka_headers_t *hs = m->headers;
    const void *v;
    size_t sz;
    assert_int_not_equal(rd_kafka_header_get_last(hs, WXG_DLQ_HDR_TIMESTAMP, &v, &sz), 0);
    assert_int_not_equal(rd_kafka_header_get_last(hs, WXG_DLQ_HDR_PLUGIN, &v, &sz), 0);

    for (size_t i = 0; i < n; i++)
        rec_free(&got[i]);
    wxg_dlq_destroy(d);
    wxg_producer_destroy(p, -1);
}

#define WRITERS     4
#define PER_WRITER  25
#define TOTAL_WRITE (WRITERS * PER_WRITER)

typedef struct writer {
    wxg_dlq_t *dlq;
    int id;
    int failures;
    int64_t offsets[PER_WRITER];
} writer;

static void *writer_main(void *arg)
{
    writer *w = arg;
    for (int i = 0; i < PER_WRITER; i++) {
        char value[64], err[512];
        snprintf(value, sizeof value, "writer-%d-record-%d", w->id, i);
        wxg_dlq_record_t rec = {.topic = "callbacks",
                                .partition = w->id,
                                .offset = i,
                                .value = value,
                                .value_len = strlen(value),
                                .timestamp_ms = -1,
                                .error = WXG_EPLUGIN,
                                .attempts = 3};
        wxg_delivery_t dr = {.offset = -1};
        if (wxg_dlq_write(w->dlq, &rec, &dr, err, sizeof err) != 0)
            w->failures++;
        w->offsets[i] = dr.offset;
    }
    return NULL;
}

static void concurrent_writers_each_get_their_own_delivery(void **state)
{
    (void)state;
    char topic[160], err[512];
    unique_topic(topic, sizeof topic, "dlq-mt");
    create_topic(topic, 1);
    wxg_producer_t *p = producer_for(wxg_test_kafka_bootstrap(), "30000", NULL, NULL);
    wxg_dlq_t *d = wxg_dlq_new(p, topic, "g", err, sizeof err);
    pthread_t t[WRITERS];
    writer w[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        w[i] = (writer){.dlq = d, .id = i};
        assert_int_equal(pthread_create(&t[i], NULL, writer_main, &w[i]), 0);
    }
    static unsigned char seen[TOTAL_WRITE];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < WRITERS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
        /* Each call reported the offset of its own record: all distinct, all in range. */
        for (int j = 0; j < PER_WRITER; j++) {
            assert_true(w[i].offsets[j] >= 0 && w[i].offsets[j] < TOTAL_WRITE);
            assert_int_equal(seen[w[i].offsets[j]], 0);
            seen[w[i].offsets[j]] = 1;
        }
    }
    static consumed got[TOTAL_WRITE + 1];
    size_t n = read_partition(topic, 0, got, TOTAL_WRITE + 1);
    assert_int_equal(n, TOTAL_WRITE);
    /* The record at the offset a writer was told holds exactly that writer's value. */
    for (int i = 0; i < WRITERS; i++) {
        for (int j = 0; j < PER_WRITER; j++) {
            char value[64];
            snprintf(value, sizeof value, "writer-%d-record-%d", i, j);
            consumed *m = &got[w[i].offsets[j]];
            assert_int_equal(m->offset, w[i].offsets[j]);
            assert_int_equal(m->len, strlen(value));
            assert_memory_equal(m->payload, value, m->len);
        }
    }
    for (size_t i = 0; i < n; i++)
        rec_free(&got[i]);
    wxg_dlq_destroy(d);
    wxg_producer_destroy(p, -1);
}

static void plugin_produce_waits_for_the_delivery_and_lands(void **state)
{
    (void)state;
    char topic[160], err[1024];
    unique_topic(topic, sizeof topic, "replies");
    create_topic(topic, 1);
    wxg_plugin_kv_t conf[] = {{"plugin.example.topic", topic}};
    wxg_plugin_chain_t *chain = NULL;
    int rc = wxg_plugin_chain_new(WXG_EXAMPLE_PLUGIN, conf, 1, &chain, err, sizeof err);
    if (rc != 0)
        fail_msg("chain: %s", err);
    wxg_producer_t *p = producer_for(wxg_test_kafka_bootstrap(), "30000", NULL, NULL);
    wxg_plugin_chain_set_producer(chain, p);
    wxg_plugin_thread_t *thr = NULL;
    assert_int_equal(wxg_plugin_thread_new(chain, &thr, err, sizeof err), 0);

    wxg_msg_view_t msg = {.format = WXG_FORMAT_GENERIC,
                          .account = "wxid_bot",
                          .conversation = "wxid_peer",
                          .sender = "wxid_peer",
                          .msg_id = "7301234567890123457",
                          .type = "text",
                          .content = "hello there",
                          .content_len = 11,
                          .key = "wxid_bot:n:7301234567890123457",
                          .key_kind = WXG_KEY_SERVER_ID};
    wxg_plugin_call_t call;
    wxg_plugin_call_init(&call);
    call.fence = 12;
    call.attempt = 1;
    call.topic = "callbacks";
    assert_int_equal(wxg_plugin_chain_handle(chain, thr, 0, &msg, &call), WXG_PLUGIN_OK);
    assert_int_equal(call.produce_count, 1);
    assert_int_equal(call.produce_error, 0);
    assert_true(call.has_result);
    wxg_plugin_thread_destroy(thr);
    wxg_plugin_chain_destroy(chain);
    wxg_producer_destroy(p, -1);

    /* The call returned only after the delivery report, so the record is there. */
    consumed got[2];
    size_t n = read_partition(topic, 0, got, 2);
    assert_int_equal(n, 1);
    assert_int_equal(got[0].len, 11);
    assert_memory_equal(got[0].payload, "hello there", 11);
    assert_int_equal(got[0].key_len, strlen(msg.key));
    assert_memory_equal(got[0].key, msg.key, got[0].key_len);
    assert_header(&got[0], "fence", "12");
    assert_header(&got[0], "idempotency-key", msg.key);
    rec_free(&got[0]);
}

static void dlq_write_to_an_unreachable_cluster_fails_within_the_bound(void **state)
{
    (void)state;
    char bootstrap[64], err[1024] = "";
    snprintf(bootstrap, sizeof bootstrap, "127.0.0.1:%d", wxg_test_free_port());
    wxg_producer_t *p = producer_for(bootstrap, "2000", "log_level", "0");
    wxg_dlq_t *d = wxg_dlq_new(p, "dead-letters", "g", err, sizeof err);
    wxg_dlq_record_t rec = {.topic = "callbacks",
                            .value = "x",
                            .value_len = 1,
                            .timestamp_ms = -1,
                            .error = WXG_EPARSE};
    int64_t t0 = wxg_test_now_ms();
    int rc = wxg_dlq_write(d, &rec, NULL, err, sizeof err);
    int64_t took = wxg_test_now_ms() - t0;
    print_message("unreachable: rc=%s after %" PRId64 " ms: %s\n", wxg_err_name(rc), took, err);
    assert_int_equal(rc, WXG_ETIMEDOUT);
    assert_true(took <= (2000 + WXG_PRODUCER_REPORT_GRACE_MS) * (int64_t)wxg_test_scale() + 1000);
    wxg_dlq_destroy(d);
    wxg_producer_destroy(p, 0);
}

static void dlq_write_to_a_missing_topic_fails_within_the_bound(void **state)
{
    (void)state;
    char topic[160], err[1024] = "";
    unique_topic(topic, sizeof topic, "missing");
    /* The client must not ask the broker to create the topic (the broker may allow it). */
    wxg_producer_t *p =
        producer_for(wxg_test_kafka_bootstrap(), "5000", "allow.auto.create.topics", "false");
    wxg_dlq_t *d = wxg_dlq_new(p, topic, "g", err, sizeof err);
    wxg_dlq_record_t rec = {.topic = "callbacks",
                            .value = "x",
                            .value_len = 1,
                            .timestamp_ms = -1,
                            .error = WXG_EPARSE};
    int64_t t0 = wxg_test_now_ms();
    int rc = wxg_dlq_write(d, &rec, NULL, err, sizeof err);
    int64_t took = wxg_test_now_ms() - t0;
    print_message("missing topic: rc=%s after %" PRId64 " ms: %s\n", wxg_err_name(rc), took, err);
    assert_int_not_equal(rc, 0);
    assert_true(rc == WXG_ETIMEDOUT || rc == WXG_EKAFKA);
    assert_true(took <= (5000 + WXG_PRODUCER_REPORT_GRACE_MS) * (int64_t)wxg_test_scale() + 1000);
    assert_false(topic_exists(topic));
    wxg_dlq_destroy(d);
    wxg_producer_destroy(p, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dlq_record_lands_with_original_bytes_key_and_all_headers),
        cmocka_unit_test(concurrent_writers_each_get_their_own_delivery),
        cmocka_unit_test(plugin_produce_waits_for_the_delivery_and_lands),
        cmocka_unit_test(dlq_write_to_an_unreachable_cluster_fails_within_the_bound),
        cmocka_unit_test(dlq_write_to_a_missing_topic_fails_within_the_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
