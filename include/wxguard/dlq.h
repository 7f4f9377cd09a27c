/*
 * The Kafka producer with waited delivery reports, and the dead-letter writer built on it.
 *
 * wxg_producer_t is one librdkafka producer handle shared by every worker thread. Its send
 * function produces one record and BLOCKS until librdkafka's delivery report for that record
 * arrives (or a bound passes), so that "the record is in Kafka" is a fact the caller can act on:
 * the consumer finishes an offset only after a dead-letter record is durable, and a plugin
 * reports OK only after its reply is in the outbound topic. The producer is idempotent
 * (enable.idempotence=true, acks=all); configuration that weakens either is refused.
 *
 * wxg_dlq_t writes a message that could not be processed to the dead-letter topic: the ORIGINAL
 * record bytes as the value, the original key as the key, the original headers, and wxguard's
 * headers (WXG_DLQ_HDR_*) saying where it came from and why it failed.
 *
 * Threads: wxg_producer_send() and wxg_dlq_write() may be called concurrently from any number
 * of threads. Each call waits on its own completion; a background thread owned by the producer
 * serves librdkafka's delivery reports (rd_kafka_poll), so callers never poll. new/destroy are
 * called from one thread (normally the main thread) while no send is in progress.
 *
 * Shutdown order (the consumer's): stop the workers (so no send is in progress), then
 * wxg_dlq_destroy, then wxg_producer_destroy (which flushes within a bound), and only then
 * destroy the consumer handle.
 */
#ifndef WXGUARD_DLQ_H
#define WXGUARD_DLQ_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"

typedef struct wxg_producer_s wxg_producer_t;
typedef struct wxg_dlq_s wxg_dlq_t;

/* A librdkafka configuration property (name as librdkafka spells it, without any "kafka."
 * prefix of wxguard's configuration file). */
typedef struct wxg_kafka_prop {
    const char *name;
    const char *value;
} wxg_kafka_prop_t;

/* A record header: name and value_len bytes of value (value NULL = a null header). */
typedef struct wxg_kafka_header {
    const char *name;
    const void *value;
    size_t value_len;
} wxg_kafka_header_t;

/* Where a record landed (filled by wxg_producer_send on success). */
typedef struct wxg_delivery {
    int32_t partition;
    int64_t offset;
} wxg_delivery_t;

/* Any partition: let the partitioner choose from the key. */
#define WXG_PARTITION_ANY (-1)

/* The delivery timeout used when the properties do not set message.timeout.ms (or its alias
 * delivery.timeout.ms): how long librdkafka keeps trying before it reports a failure. */
#define WXG_PRODUCER_DEFAULT_DELIVERY_TIMEOUT_MS 30000

/* How much longer than the delivery timeout a send waits for a delivery report before giving up
 * with WXG_ETIMEDOUT (librdkafka reports a failure itself after the delivery timeout; the margin
 * only matters when its threads are starved). */
#define WXG_PRODUCER_REPORT_GRACE_MS 5000

/* Creates the producer. props (n entries, may be NULL when n is 0) are applied in order on top of
 * wxguard's defaults (enable.idempotence=true, acks=all, message.timeout.ms=30000,
 * statistics.interval.ms=1000 for wxg_producer_brokers_up); setting enable.idempotence to false or
 * acks to anything but all/-1 is refused. bootstrap.servers must be among props. Starts the
 * delivery-report thread. Returns NULL with a reason in errstr on failure (bad property, thread
 * creation). Nothing is sent to the broker until the first send. Main thread. */
WXG_EXPORT wxg_producer_t *wxg_producer_new(const wxg_kafka_prop_t *props, size_t n, char *errstr,
                                            size_t errstr_size);

struct rd_kafka_conf_s;

/* Which settings of a librdkafka configuration a producer takes over (wxg_producer_new_like). */
typedef enum wxg_producer_scope {
    /* Where the brokers are and how to reach them: bootstrap.servers, security.protocol, sasl.*,
     * ssl.*, client.id, broker.address.family, socket and message timeouts. For a producer
     * beside a consumer (the dead-letter writer, the admin tool's redrive), whose group, fetch
     * and offset settings are the consumer's alone. */
    WXG_PRODUCER_CONNECTION = 1,
    /* Every setting but callbacks and group.id: for a program whose kafka.* settings all belong
     * to its producer (wxguard-ingest: linger.ms, compression, batch sizes ...). */
    WXG_PRODUCER_ALL = 2
} wxg_producer_scope_t;

/* Creates a producer (as wxg_producer_new) from the settings of `kc` that differ from
 * librdkafka's defaults, limited to `scope`; `defaults` (n_defaults entries, may be NULL when 0)
 * come first, so a setting of `kc` overrides them. librdkafka dumps bootstrap.servers under its
 * older name metadata.broker.list; it is handed on as bootstrap.servers. `kc` is only read and
 * stays the caller's. NULL with errstr on failure. Main thread. */
WXG_EXPORT wxg_producer_t *wxg_producer_new_like(const struct rd_kafka_conf_s *kc,
                                                 wxg_producer_scope_t scope,
                                                 const wxg_kafka_prop_t *defaults,
                                                 size_t n_defaults, char *errstr,
                                                 size_t errstr_size);

/* Produces one record and waits for its delivery report, at most the delivery timeout plus
 * WXG_PRODUCER_REPORT_GRACE_MS. topic is required; partition is WXG_PARTITION_ANY or a
 * partition number; key/value may be NULL with length 0; headers may be NULL when
 * header_count is 0. All buffers are copied before the call returns and stay owned by the
 * caller. On success returns 0 and fills *dr when dr is not NULL.
 * Errors (a reason in errstr, which may be NULL):
 *   WXG_ETIMEDOUT  no delivery within the bound (the record may still be delivered later)
 *   WXG_EKAFKA     the broker or librdkafka refused or failed the record (unknown topic, ...)
 *   WXG_EAUTH      not authorised to write the topic
 *   WXG_ETOOBIG    larger than the producer or broker allows
 *   WXG_ESTATE     the producer hit a fatal error (e.g. fenced) and can no longer send
 *   WXG_ECLOSED    the producer is being destroyed
 *   WXG_EINVAL     bad arguments
 * Any thread; concurrent calls are fine. */
WXG_EXPORT int wxg_producer_send(wxg_producer_t *p, const char *topic, int32_t partition,
                                 const void *key, size_t key_len, const void *value,
                                 size_t value_len, const wxg_kafka_header_t *headers,
                                 size_t header_count, wxg_delivery_t *dr, char *errstr,
                                 size_t errstr_size);

/* The same as wxg_producer_send(), but waits at most wait_ms (when > 0 and shorter than the usual
 * bound) for the delivery report before giving up with WXG_ETIMEDOUT. For callers that must answer
 * within a budget of their own (an HTTP request): the record may still be delivered after the
 * call gave up, so such a caller must tolerate a duplicate when its client retries. wait_ms 0
 * means the usual bound. Any thread. */
WXG_EXPORT int wxg_producer_send_within(wxg_producer_t *p, int wait_ms, const char *topic,
                                        int32_t partition, const void *key, size_t key_len,
                                        const void *value, size_t value_len,
                                        const wxg_kafka_header_t *headers, size_t header_count,
                                        wxg_delivery_t *dr, char *errstr, size_t errstr_size);

/* How many brokers the producer had an open connection to (state UP) in librdkafka's latest
 * statistics (emitted every statistics.interval.ms, default here 1000), or -1 before the first
 * statistics arrived or when statistics are switched off (statistics.interval.ms=0). Lock-free;
 * any thread. */
WXG_EXPORT int wxg_producer_brokers_up(const wxg_producer_t *p);

/* For a program's start-up, right after wxg_producer_new*(): waits at most timeout_ms until a
 * broker answered a metadata request over the configured security protocol. Returns 0 then;
 * WXG_EAUTH when a broker refused the SASL credentials; WXG_ECONN when every broker was down
 * (refused connections, a failed TLS handshake); WXG_ETIMEDOUT when nothing was decided within
 * the bound. On failure errstr holds librdkafka's last error (it never contains a password). A
 * caller that can wait for Kafka to come up treats only WXG_EAUTH as fatal. Main thread. */
WXG_EXPORT int wxg_producer_check(wxg_producer_t *p, int timeout_ms, char *errstr,
                                  size_t errstr_size);

/* The producer's delivery timeout in milliseconds (message.timeout.ms as configured). */
WXG_EXPORT int wxg_producer_delivery_timeout_ms(const wxg_producer_t *p);

/* Flushes what is still queued for at most flush_timeout_ms (negative: the delivery timeout),
 * purges the rest, stops the delivery-report thread and destroys the handle. No send may be in
 * progress or start. Accepts NULL. Main thread. */
WXG_EXPORT void wxg_producer_destroy(wxg_producer_t *p, int flush_timeout_ms);

/* ------------------------------------------------------------------------------------------ */
/* Dead-letter writer                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Header names on a dead-letter record. Numbers are decimal text; times are milliseconds since
 * the epoch (UTC). */
#define WXG_DLQ_HDR_PREFIX        "wxg-dlq-"
#define WXG_DLQ_HDR_TOPIC         "wxg-dlq-original-topic"
#define WXG_DLQ_HDR_PARTITION     "wxg-dlq-original-partition"
#define WXG_DLQ_HDR_OFFSET        "wxg-dlq-original-offset"
#define WXG_DLQ_HDR_KEY           "wxg-dlq-original-key" /* null header when the record had none */
#define WXG_DLQ_HDR_TIMESTAMP     "wxg-dlq-original-timestamp" /* only when known */
#define WXG_DLQ_HDR_ERROR         "wxg-dlq-error"              /* WXG_E* name, e.g. "EPLUGIN" */
#define WXG_DLQ_HDR_REASON        "wxg-dlq-reason"
#define WXG_DLQ_HDR_ATTEMPTS      "wxg-dlq-attempts"
#define WXG_DLQ_HDR_FIRST_FAILURE "wxg-dlq-first-failure-ms"
#define WXG_DLQ_HDR_LAST_FAILURE  "wxg-dlq-last-failure-ms"
#define WXG_DLQ_HDR_GROUP         "wxg-dlq-consumer-group"
#define WXG_DLQ_HDR_IDEMPOTENCY   "wxg-dlq-idempotency-key" /* only when the message decoded */
#define WXG_DLQ_HDR_PLUGIN        "wxg-dlq-plugin"          /* only when a plugin failed */

/* The longest reason written; longer ones are cut (at a UTF-8 boundary) and end in "...". */
#define WXG_DLQ_REASON_MAX 1024

/* One record to park. Every pointer is borrowed for the duration of wxg_dlq_write(). */
typedef struct wxg_dlq_record {
    const char *topic; /* original topic (required) */
    int32_t partition; /* original partition */
    int64_t offset;    /* original offset */
    const void *key;   /* original key, NULL when the record had none */
    size_t key_len;
    const void *value; /* original value bytes, exactly as consumed (NULL = null value) */
    size_t value_len;
    const wxg_kafka_header_t *headers; /* original headers (NULL when header_count is 0) */
    size_t header_count;
    int64_t timestamp_ms;     /* original record timestamp, or -1 when unknown */
    int error;                /* the WXG_E* code that parked it (its name goes into the header) */
    const char *reason;       /* human-readable reason; NULL = the error's message */
    uint32_t attempts;        /* how many attempts were made */
    int64_t first_failure_ms; /* wall-clock time of the first failure (ms since the epoch) */
    int64_t last_failure_ms;  /* wall-clock time of the last failure */
    const char *idempotency_key; /* NULL when the record did not decode */
    const char *plugin;          /* the plugin that failed, or NULL */
} wxg_dlq_record_t;

/* Creates a writer for `topic` through `producer` (borrowed: it must outlive the writer).
 * group_id is the consumer group written into every record (copied). Returns NULL with errstr
 * on bad arguments or allocation failure. Main thread. */
WXG_EXPORT wxg_dlq_t *wxg_dlq_new(wxg_producer_t *producer, const char *topic, const char *group_id,
                                  char *errstr, size_t errstr_size);

/* Writes one dead-letter record and waits for its delivery report (bounded as for
 * wxg_producer_send). Returns 0 only when the broker acknowledged the record (and fills *dr with
 * where it landed when dr is not NULL); otherwise a
 * negative WXG_E* code (see wxg_producer_send) with errstr: the caller must NOT finish the
 * original offset then, but retry later. Original headers whose names start with
 * WXG_DLQ_HDR_PREFIX (left by an earlier parking) are replaced, not repeated. Any thread. */
WXG_EXPORT int wxg_dlq_write(wxg_dlq_t *dlq, const wxg_dlq_record_t *rec, wxg_delivery_t *dr,
                             char *errstr, size_t errstr_size);

/* The topic this writer writes to. */
WXG_EXPORT const char *wxg_dlq_topic(const wxg_dlq_t *dlq);

/* The producer this writer sends through (for its broker state, wxg_producer_brokers_up). */
WXG_EXPORT const wxg_producer_t *wxg_dlq_producer(const wxg_dlq_t *dlq);

/* Accepts NULL. Does not touch the producer. */
WXG_EXPORT void wxg_dlq_destroy(wxg_dlq_t *dlq);

#endif /* WXGUARD_DLQ_H */
