/*
 * The consumer: Kafka -> worker pool -> idempotency guard -> plugin chain, committing an offset
 * only when every message before it is DONE, a duplicate, or durably dead-lettered.
 *
 * One wxg_consumer_t is one member of a consumer group. wxg_consumer_run() is its poll thread:
 * it polls with rd_kafka_consumer_poll() and never stops doing so (so the group never sees a
 * missed max.poll.interval.ms), decodes each record, dispatches its messages to the worker pool
 * by conversation, pauses partitions when the pool is near full and resumes them when it
 * drains, stores the contiguous finished watermark of each partition and commits it
 * periodically, on revoke (after draining that partition within a budget) and on shutdown.
 *
 * Per message (on a worker, in batches): claim -> DUPLICATE: finished; BUSY: re-queued after the
 * owner's remaining lease, never finished early; CLAIMED: the plugins not yet recorded as done
 * run in order while a watchdog renews the lease, then complete. A plugin's RETRY backs off
 * exponentially with jitter up to retry_max attempts; FAIL or exhausted retries write the
 * original record to the dead-letter topic, wait for its delivery report, mark the message
 * FAILED and only then finish the offset. While the DLQ cannot be written the message stays
 * unfinished and its partition's watermark stops there: nothing is ever dropped.
 *
 * Logging goes through wxguard/log.h (events: started, assigned, revoked, pause, resume,
 * decode_error, dead_lettered, guard_error, stats every 10 s with every counter, lag per
 * partition, stalled and stall_cleared, pipeline_fatal and fatal when an error of the fatal
 * class stops it, draining, drain_stopped, workers_abandoned, stopped).
 *
 * Metrics (docs/metrics.md) live in a wxg_metrics_t registry: counters are updated where the
 * event happens, gauges by the poll thread (at most every 100 ms; lag every second), and
 * wxg_consumer_stats() reads the same handles, so the log line, the stats and /metrics never
 * disagree. wxg_consumer_ready() answers /readyz.
 *
 * Threads: new, run and destroy are called from one thread (run blocks). wxg_consumer_stop()
 * may be called from any thread and from a signal handler. wxg_consumer_stats() and
 * wxg_consumer_ready() from any thread.
 */
#ifndef WXGUARD_CONSUMER_H
#define WXGUARD_CONSUMER_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"
#include "wxguard/dlq.h"
#include "wxguard/guard.h"
#include "wxguard/metrics.h"
#include "wxguard/msg.h"
#include "wxguard/plugin_registry.h"

struct rd_kafka_conf_s;

typedef struct wxg_consumer_conf {
    /* librdkafka configuration with bootstrap.servers, group.id and any tuning. Taken over by
     * wxg_consumer_new() (also on failure). The consumer sets enable.auto.offset.store=false,
     * enable.auto.commit=false, its rebalance and commit callbacks. */
    struct rd_kafka_conf_s *kafka;
    const char *const *topics; /* ntopics topic names, copied */
    size_t ntopics;
    const char *group_id; /* written into dead-letter headers; copied */

    unsigned workers;         /* worker threads, each with its own Redis connection */
    size_t queue_capacity;    /* messages in the pool at most */
    size_t batch_max;         /* messages per guard call (one Redis exchange) */
    int64_t batch_delay_us;   /* longest wait to fill a batch at light load */
    int64_t drain_timeout_ms; /* shutdown and revoke drain budget */
    int64_t commit_interval_ms;
    /* Longest wait for the answer to a synchronous commit (at a revoke, and the final one on
     * shutdown); a commit not answered by then is abandoned and its offsets are redelivered.
     * 0 or less: 5 s. */
    int64_t commit_timeout_ms;
    uint32_t retry_max; /* attempts before a retried message is dead-lettered */
    int64_t backoff_initial_ms;
    int64_t backoff_max_ms;
    size_t max_message_bytes; /* decode size cap */
    wxg_format_t format;      /* WXG_FORMAT_AUTO detects per record */
    /* A partition stalls when its oldest message in flight, or its backpressure pause, is older
     * than this: /readyz turns false and one log line names the partition, offset and key. */
    int64_t stall_timeout_ms;
    /* An idle replica's guard calls cannot tell it that Redis went away, so the lease watchdog
     * sends PING after this long without any Redis contact of its own; the answer feeds
     * /readyz and wxg_redis_reachable. 0 turns the probe off (readiness then rests on the
     * workers' calls alone). Default 5 s. */
    int64_t redis_probe_ms;

    const wxg_guard_conf_t *guard; /* copied fields are used by each worker's wxg_guard_new() */
    /* Entries of the near cache of DONE messages (docs/guard.md §10) that the consumer creates
     * and shares among its workers, so that a redelivery of a message this replica completed
     * costs no Redis call; 0 turns it off. Default 65536 (about 2 MiB). When guard->done_cache
     * is set, that cache is used instead (borrowed) and this is ignored; naive mode never uses
     * one. */
    size_t done_cache_entries;
    wxg_plugin_chain_t *chain; /* borrowed; must outlive the consumer */
    wxg_dlq_t *dlq;            /* borrowed; must outlive the consumer */
    /* Registry for the consumer's metrics (borrowed; must outlive the consumer); NULL: the
     * consumer keeps a private one, so wxg_consumer_stats() works either way. */
    wxg_metrics_t *metrics;
} wxg_consumer_conf_t;

/* Fills the numeric fields with the documented defaults (4 workers, capacity 4096, batch 64,
 * 1 ms batch delay, 30 s drain, 1 s commit interval, 5 s commit timeout, 5 attempts,
 * 200 ms..30 s backoff, 1 MiB, 5 min stall, a near cache of 65536 entries); pointers are
 * zeroed. */
WXG_EXPORT void wxg_consumer_conf_init(wxg_consumer_conf_t *conf);

/* Counters since creation (monotonic) and gauges (now; refreshed by the poll thread at most
 * 100 ms ago). */
typedef struct wxg_consumer_stats {
    uint64_t received;          /* records polled */
    uint64_t messages;          /* messages decoded from them */
    uint64_t decode_errors;     /* records parked because they did not decode */
    uint64_t duplicates;        /* claims that found the message DONE */
    uint64_t busy;              /* claims that found a live owner (re-queued) */
    uint64_t processed;         /* messages completed after running their plugins */
    uint64_t retried;           /* plugin RETRY results that were retried */
    uint64_t dead_lettered;     /* messages (or records) written to the DLQ */
    uint64_t dlq_errors;        /* DLQ writes that failed (re-tried later) */
    uint64_t lease_lost;        /* transitions refused because another owner took over */
    uint64_t guard_errors;      /* guard calls that failed as a whole (Redis unreachable ...) */
    uint64_t offsets_stored;    /* partition watermarks stored */
    uint64_t store_state;       /* stores refused with _STATE: partition no longer ours */
    uint64_t commits;           /* successful commits (of one or more partitions) */
    uint64_t offsets_committed; /* partition offsets committed successfully */
    uint64_t commit_errors;
    uint64_t stale_finishes;     /* work finished for a partition no longer (or newly) assigned */
    uint64_t rebalances;         /* assign + revoke events */
    uint64_t revoke_timeouts;    /* revokes whose drain ran out of budget */
    size_t assigned;             /* partitions assigned now */
    size_t paused;               /* partitions paused by backpressure now */
    size_t in_flight;            /* messages in the pool or waiting to enter it */
    int64_t oldest_age_ms;       /* age of the oldest message in the pool */
    int64_t lag;                 /* sum over assigned partitions of high watermark - watermark */
    uint64_t redis_round_trips;  /* guard calls that reached Redis, over every worker */
    uint64_t batches;            /* worker batches run */
    uint64_t batched_jobs;       /* jobs over those batches (mean batch = batched_jobs/batches) */
    int64_t latency_p50_us;      /* dispatch to finished (committable), median of the records */
    int64_t latency_p99_us;      /* ... and 99th percentile; 0 before the first record */
    uint64_t claimed;            /* claims that made this replica the owner */
    uint64_t payload_mismatches; /* duplicates whose payload differs from the finished one */
    size_t stalled;              /* partitions the stall detector holds stalled now */
    uint64_t done_cache_hits;    /* duplicates answered by the near cache, without Redis (also
                                    counted in duplicates) */
    /* Redis Cluster mode only (0 otherwise), over every worker's guard handle: the counters of
     * wxg_guard_stats_t of the same names (docs/guard.md §11). */
    uint64_t cluster_moved, cluster_ask, cluster_tryagain, cluster_clusterdown;
    uint64_t cluster_refreshes, cluster_node_errors;
} wxg_consumer_stats_t;

typedef struct wxg_consumer_s wxg_consumer_t;

/* Creates the Kafka consumer and starts the workers (each connects to Redis). Returns NULL with
 * errstr on a bad configuration, a librdkafka error or a failed worker start (Redis down). */
WXG_EXPORT wxg_consumer_t *wxg_consumer_new(const wxg_consumer_conf_t *conf, char *errstr,
                                            size_t errstr_size);

/* Subscribes and runs the poll loop until wxg_consumer_stop(), then shuts down in order: stop
 * fetching, drain within the budget, final synchronous commit of the watermarks, close. A
 * plugin call still running when the drain budget is spent is not waited for (see
 * wxg_consumer_abandoned).
 * Returns 0 after a clean stop, or the first error whose class is fatal (wxg_err_class) after
 * the same orderly shutdown, whose drain then stops waiting once only delayed work is left:
 * e.g. WXG_EAUTH or WXG_ECONFIG (the layout stamp no longer matches) from a guard call or the
 * watchdog, WXG_ESTATE for a fatal Kafka error, WXG_ENOMEM. Call once. */
WXG_EXPORT int wxg_consumer_run(wxg_consumer_t *c);

/* Asks run to stop. Async-signal-safe; any thread. */
WXG_EXPORT void wxg_consumer_stop(wxg_consumer_t *c);

WXG_EXPORT void wxg_consumer_stats(wxg_consumer_t *c, wxg_consumer_stats_t *out);

/* Readiness for /readyz: returns 1 when ready, 0 when not, with a one-line reason (no
 * secrets, no message content) in `reason` (may be NULL). Ready means all of:
 *   - the replica has joined its group: it received an assignment, possibly empty (a replica
 *     beyond the partition count is a ready spare, so that a rolling update can proceed);
 *   - Kafka is reachable: the dead-letter producer, which talks to the same cluster, has a
 *     broker up;
 *   - Redis is reachable: the latest Redis contact did not fail, whichever came last of the
 *     workers' guard calls (failed as a whole) and the watchdog's renewals and probes (see
 *     redis_probe_ms). With the probe off, a failure older than 30 s with no guard call since
 *     no longer counts: an idle replica would have nothing to prove Redis by;
 *   - nothing is stalled (see stall_timeout_ms), and the consumer is not stopping.
 * Never blocks; any thread, concurrently with run. */
WXG_EXPORT int wxg_consumer_ready(wxg_consumer_t *c, char *reason, size_t reason_size);

/* After run returned: how many workers its stop left running inside a plugin, because the
 * drain budget was spent and a plugin call had not returned (0 normally; logged as
 * workers_abandoned). Their messages are not finished, so nothing was committed past them. While
 * it is not 0, those workers may still use the plugin chain, the dead-letter sink and the
 * consumer: destroy then frees nothing, and the caller should exit the process without freeing
 * them either (flush its output and _exit). NULL gives 0. */
WXG_EXPORT unsigned wxg_consumer_abandoned(const wxg_consumer_t *c);

/* Frees everything (after run returned, or instead of it), except after a stop that abandoned
 * workers (wxg_consumer_abandoned): then it frees nothing. NULL is accepted. */
WXG_EXPORT void wxg_consumer_destroy(wxg_consumer_t *c);

#endif /* WXGUARD_CONSUMER_H */
