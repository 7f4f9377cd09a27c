/* Integration smoke test: the servers of the "services" fixture are real. A record goes
 * through the Kafka broker to a consumer-group member whose committed offset the broker then
 * reports back, and a value with a TTL makes a round trip through redis-server. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testenv.h"
#include "testkafka.h"

#define RECORDS   3
#define PARTITION 1

/* Polls the subscribed consumer until `want` records arrived or the scaled budget is spent;
 * returns how many arrived and copies their values. Errors that librdkafka reports as events
 * (e.g. the coordinator still loading) are transient here and only printed. */
static int poll_records(rd_kafka_t *rk, int want, char values[][64], int64_t offsets[],
                        int32_t partitions[])
{
    int got = 0;
    int64_t deadline = wxg_test_now_ms() + 60000LL * wxg_test_scale();
    while (got < want && wxg_test_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m)
            continue;
        if (m->err) {
            print_message("consumer event: %s\n", rd_kafka_message_errstr(m));
        } else {
            assert_true(m->len < 64);
            memcpy(values[got], m->payload, m->len);
            values[got][m->len] = '\0';
            offsets[got] = m->offset;
            partitions[got] = m->partition;
            got++;
        }
        rd_kafka_message_destroy(m);
    }
    return got;
}

static void kafka_group_consumes_produced_records_and_commits_their_offset(void **state)
{
    (void)state;
    char *topic = wxg_test_kafka_name("smoke");
    char *group = wxg_test_kafka_name("smoke-group");
    char errstr[512];

    /* Two partitions, records on the second: the group must be assigned and fetch the right one. */
    wxg_test_kafka_create_topic(topic, 2);
    wxg_test_kafka_produce_n(topic, PARTITION, RECORDS, "hello-");

    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    wxg_test_kafka_conf_set(conf, "group.id", group);
    wxg_test_kafka_conf_set(conf, "auto.offset.reset", "earliest");
    wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
    wxg_test_kafka_conf_set(conf, "session.timeout.ms", "6000");
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    assert_non_null(rk);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
    assert_int_equal(rd_kafka_subscribe(rk, sub), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_destroy(sub);

    char values[RECORDS][64];
    int64_t offsets[RECORDS];
    int32_t partitions[RECORDS];
    int got = poll_records(rk, RECORDS, values, offsets, partitions);
    assert_int_equal(got, RECORDS);
    for (int i = 0; i < RECORDS; i++) {
        char want[64];
        snprintf(want, sizeof want, "hello-%d", i);
        assert_string_equal(values[i], want);
        assert_int_equal(offsets[i], i);
        assert_int_equal(partitions[i], PARTITION);
    }

    /* A synchronous commit of the consumed position: the next offset to read, i.e. RECORDS. */
    assert_int_equal(rd_kafka_commit(rk, NULL, 0), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, PARTITION);
    assert_int_equal(rd_kafka_committed(rk, parts, 10000 * wxg_test_scale()),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
    assert_int_equal(parts->elems[0].err, RD_KAFKA_RESP_ERR_NO_ERROR);
    assert_int_equal(parts->elems[0].offset, RECORDS);
    rd_kafka_topic_partition_list_destroy(parts);

    assert_int_equal(rd_kafka_consumer_close(rk), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_destroy(rk);

    /* A different client, after the member left, reads the same offset from the broker, and
     * nothing for the partition the group never consumed. */
    assert_int_equal(wxg_test_kafka_committed(group, topic, PARTITION), RECORDS);
    assert_int_equal(wxg_test_kafka_committed(group, topic, 0), RD_KAFKA_OFFSET_INVALID);

    free(group);
    free(topic);
}

static void kafka_read_helper_returns_records_in_partition_order(void **state)
{
    (void)state;
    char *topic = wxg_test_kafka_name("smoke-read");
    wxg_test_kafka_create_topic(topic, 1);
    static const char binary[] = {'a', '\0', 'b'};
    const wxg_test_kafka_record_t recs[] = {
        {.partition = 0, .key = "first", .key_len = 5, .value = "one", .value_len = 3},
        {.partition = 0, .key = NULL, .key_len = 0, .value = binary, .value_len = sizeof binary},
    };
    wxg_test_kafka_produce(topic, recs, 2);

    wxg_test_kafka_msg_t *msgs = NULL;
    size_t n = wxg_test_kafka_read(topic, 2, 30000, &msgs);
    assert_int_equal(n, 2);
    assert_int_equal(msgs[0].offset, 0);
    assert_string_equal(msgs[0].key, "first");
    assert_string_equal(msgs[0].value, "one");
    assert_int_equal(msgs[1].offset, 1);
    assert_null(msgs[1].key);
    /* Values are byte strings: an embedded NUL survives the trip. */
    assert_int_equal(msgs[1].value_len, sizeof binary);
    assert_memory_equal(msgs[1].value, binary, sizeof binary);
    wxg_test_kafka_msgs_free(msgs, n);
    free(topic);
}

static void redis_value_with_ttl_round_trips(void **state)
{
    (void)state;
    struct timeval tv = {.tv_sec = 5 * wxg_test_scale(), .tv_usec = 0};
    redisContext *c = redisConnectWithTimeout(wxg_test_redis_host(), wxg_test_redis_port(), tv);
    assert_non_null(c);
    if (c->err)
        fail_msg("connecting to redis-server: %s", c->errstr);

    char key[128];
    snprintf(key, sizeof key, "wxg:test:smoke:%ld:%lld", (long)getpid(),
             (long long)wxg_test_now_ms());
    static const char value[] = {'v', '\0', 'x', '\r', '\n'};

    redisReply *r = redisCommand(c, "SET %s %b EX %d", key, value, sizeof value, 60);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    assert_string_equal(r->str, "OK");
    freeReplyObject(r);

    r = redisCommand(c, "GET %s", key);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_int_equal(r->len, sizeof value);
    assert_memory_equal(r->str, value, sizeof value);
    freeReplyObject(r);

    r = redisCommand(c, "TTL %s", key);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_in_range(r->integer, 1, 60);
    freeReplyObject(r);

    r = redisCommand(c, "DEL %s", key);
    assert_non_null(r);
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);

    r = redisCommand(c, "GET %s", key);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    redisFree(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kafka_group_consumes_produced_records_and_commits_their_offset),
        cmocka_unit_test(kafka_read_helper_returns_records_in_partition_order),
        cmocka_unit_test(redis_value_with_ttl_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
