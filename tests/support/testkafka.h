/*
 * Test support for the shared Kafka broker started by the "services" fixture.
 *
 * Every function talks to the broker named by WXG_TEST_KAFKA_BOOTSTRAP (see testenv.h) and,
 * on any error, fails the current cmocka test with a message that names the step and the
 * librdkafka error; the functions therefore return only on success. Waits are bounded and
 * scaled by wxg_test_scale().
 *
 * Tests share one broker and may run at the same time: give every topic and group a name of
 * its own with wxg_test_kafka_name().
 *
 * Not thread-safe as a whole (cmocka's failure path is not): call these from the test's main
 * thread. Each call creates and destroys its own librdkafka handle.
 */
#ifndef WXG_TESTKAFKA_H
#define WXG_TESTKAFKA_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

/* A new configuration with bootstrap.servers set to the shared broker and settings that suit
 * tests (IPv4 loopback, warnings only). The caller owns it: hand it to rd_kafka_new() (which
 * takes it over on success) or rd_kafka_conf_destroy() it. */
rd_kafka_conf_t *wxg_test_kafka_conf(void);

/* Sets one property on `conf`, failing the test when librdkafka refuses it. */
void wxg_test_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value);

/* A topic or group name that no other test, process or run uses: "<tag>-<pid>-<ms>-<n>".
 * `tag` should be short and made of [A-Za-z0-9._-]. The caller frees the string. */
char *wxg_test_kafka_name(const char *tag);

/* Creates `topic` with `partitions` partitions (replication factor 1) and waits until every
 * partition has a leader. A topic that already exists with that many partitions is accepted. */
void wxg_test_kafka_create_topic(const char *topic, int partitions);

/* One record to produce. `partition` is a partition number or RD_KAFKA_PARTITION_UA (the
 * partitioner chooses by key). key may be NULL (no key); value may be NULL (a tombstone). */
typedef struct wxg_test_kafka_record {
    int32_t partition;
    const void *key;
    size_t key_len;
    const void *value;
    size_t value_len;
} wxg_test_kafka_record_t;

/* Produces the records in order and waits until the broker acknowledged each one (acks=all). */
void wxg_test_kafka_produce(const char *topic, const wxg_test_kafka_record_t *recs, size_t n);

/* Produces `n` records to `partition` with key "k<i>" and value "<value_prefix><i>" for
 * i = 0 .. n-1, and waits for every acknowledgement. */
void wxg_test_kafka_produce_n(const char *topic, int32_t partition, int n,
                              const char *value_prefix);

/* The offset that consumer group `group` committed for topic/partition, as the broker reports
 * it now; RD_KAFKA_OFFSET_INVALID (-1001) when the group committed nothing there. */
int64_t wxg_test_kafka_committed(const char *group, const char *topic, int32_t partition);

/* A client that reads the committed offsets of `group` and stays connected, so that a test can
 * sample them every few tens of milliseconds (one request per sample). It never joins the
 * group. Free with wxg_test_kafka_offsets_reader_free(). */
typedef struct wxg_test_kafka_offsets_reader wxg_test_kafka_offsets_reader_t;
wxg_test_kafka_offsets_reader_t *wxg_test_kafka_offsets_reader(const char *group);
void wxg_test_kafka_offsets_reader_free(wxg_test_kafka_offsets_reader_t *r);

/* Reads the committed offsets of partitions 0..n-1 of `topic` into out[] (-1001 where the
 * group committed nothing); fails the test when the broker does not answer within the helper
 * timeout. */
void wxg_test_kafka_offsets_read(wxg_test_kafka_offsets_reader_t *r, const char *topic, int n,
                                 int64_t *out);

/* One consumed record. key and value are NUL-terminated copies (NULL when absent); their
 * lengths exclude the terminator. */
typedef struct wxg_test_kafka_msg {
    int32_t partition;
    int64_t offset;
    char *key;
    size_t key_len;
    char *value;
    size_t value_len;
} wxg_test_kafka_msg_t;

/* Reads `topic` from the beginning of every partition, without a consumer group, until `want`
 * records arrived or `timeout_ms` (times the scale) passed. Returns how many arrived (which
 * may be fewer than `want`, never more) and sets *out to an array the caller frees with
 * wxg_test_kafka_msgs_free(). Records of one partition keep their order. */
size_t wxg_test_kafka_read(const char *topic, size_t want, int timeout_ms,
                           wxg_test_kafka_msg_t **out);

/* Frees an array from wxg_test_kafka_read(). NULL is allowed. */
void wxg_test_kafka_msgs_free(wxg_test_kafka_msg_t *msgs, size_t n);

#endif /* WXG_TESTKAFKA_H */
