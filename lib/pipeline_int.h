/*
 * Internal to libwxguard: the per-message pipeline (lib/pipeline.c), run by the consumer's
 * workers on batches of messages:
 *
 *   claim -> DUPLICATE: finished | BUSY: re-queued after the owner's lease | CLAIMED:
 *   the plugins not finished on an earlier attempt, in order, each recording its sub-marker ->
 *   complete (finished) | RETRY: FAILED mark, re-queued after a backoff |
 *   FAIL or retries exhausted: dead letter -> FAILED mark -> finished.
 *
 * The pipeline knows nothing of Kafka: it works on items (one message each) that point at a
 * record view (wxg__pl_record_t) the caller filled when it dispatched the record, and it writes
 * dead letters through a sink it is given. Everything else it uses -- the guard handle and
 * plugin thread state of its worker, the lease watchdog, the plugin chain, the metric handles,
 * the retry settings -- comes from the caller too, so a test can drive it with a fake guard and
 * a sink that records what it is given.
 *
 * Errors: every failure of a guard call or a dead-letter write is decided by its class
 * (wxg_err_class): retriable -> the items are re-queued with a capped backoff and nothing
 * finishes; fatal -> the same, and the code is returned by wxg__pipeline_run so that the caller
 * stops. A plugin's FAIL, or RETRY past retry_max, is a dead letter (WXG_EPLUGIN, poison).
 *
 * Threads: a wxg__pipeline_conf_t is shared by every worker and only read. A
 * wxg__pl_worker_t belongs to one worker thread. An item is run by one worker at a time (the
 * pool guarantees it); the caller may read an item's `msg` and `done` from another thread.
 */
#ifndef WXG_PIPELINE_INT_H
#define WXG_PIPELINE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "wxguard/dlq.h"
#include "wxguard/guard.h"
#include "wxguard/metrics.h"
#include "wxguard/msg.h"
#include "wxguard/plugin_registry.h"

/* The stage an item enters at its next run. */
enum { WXG__PL_CLAIM = 0, WXG__PL_COMPLETE, WXG__PL_DEAD_LETTER, WXG__PL_FAIL_MARK };

/* Guard operations, for wxg_guard_errors_total{op} (docs/metrics.md). */
enum {
    WXG__PL_OP_CLAIM = 0,
    WXG__PL_OP_COMPLETE,
    WXG__PL_OP_FAIL,
    WXG__PL_OP_PLUGIN_DONE,
    WXG__PL_OP_N
};
/* Claim outcomes, for wxg_guard_claims_total{outcome}. */
enum { WXG__PL_CLAIMED = 0, WXG__PL_DUPLICATE, WXG__PL_BUSY, WXG__PL_CLAIM_N };
/* Plugin results, for wxg_plugin_results_total{result}: index plugin * WXG__PL_RESULT_N + r. */
enum { WXG__PL_OK = 0, WXG__PL_RETRY, WXG__PL_FAIL, WXG__PL_RESULT_N };
/* The guard's Redis Cluster counters (wxg_guard_stats_t.cluster_*), in that order, for
 * wxg_guard_cluster_redirects_total{type}, wxg_guard_cluster_retries_total{reason},
 * wxg_guard_cluster_map_refreshes_total and wxg_guard_cluster_node_errors_total. */
enum {
    WXG__PL_CL_MOVED = 0,
    WXG__PL_CL_ASK,
    WXG__PL_CL_TRYAGAIN,
    WXG__PL_CL_CLUSTERDOWN,
    WXG__PL_CL_REFRESHES,
    WXG__PL_CL_NODE_ERRORS,
    WXG__PL_CL_N
};

typedef struct wxg__pl_record wxg__pl_record_t;

/* Fills out[0..cap) with the record's headers and returns how many it has (call with cap 0 to
 * count them). The names and values are borrowed from the record and stay valid as long as
 * the record does. */
typedef size_t (*wxg__pl_headers_fn)(const wxg__pl_record_t *rec, wxg_kafka_header_t *out,
                                     size_t cap);

/* What the pipeline knows of the record a message came from: everything a dead letter carries.
 * Filled by the caller at dispatch; every pointer is borrowed and valid while an item of the
 * record is in the pipeline.
 *
 * Headers are borrowed and read on demand, only for a dead letter: the ingest service puts
 * headers on every record, and copying them at dispatch would cost a parse and allocations per
 * message for the rare record that is parked. `headers` may be NULL (no headers). */
struct wxg__pl_record {
    const char *topic;
    int32_t partition;
    int64_t offset;
    int64_t timestamp_ms; /* -1 when unknown */
    const void *key;      /* NULL when the record has none */
    size_t key_len;
    const void *value;
    size_t value_len;
    wxg__pl_headers_fn headers;
    const void *headers_src; /* for `headers`: the caller's handle on the original record */
    /* Set by the pipeline at the first claim answer of any of the record's messages (monotonic
     * microseconds), 0 before: where the caller's claim-to-commit clock starts. */
    atomic_int_fast64_t claimed_us;
};

/* One message in the pipeline. Initialise with wxg__pipeline_item_init() or
 * wxg__pipeline_item_park(); release what it owns with wxg__pipeline_item_clear(). The fields
 * are the pipeline's; the caller reads only `msg`, `rec` and `done`. */
typedef struct wxg__pl_item {
    wxg__pl_record_t *rec;
    const wxg_msg_view_t *msg; /* NULL: the record did not decode (parked at once) */
    atomic_int done;           /* finished or dropped: set before the finished callback */
    int phase;
    int outcome;
    int has_claim;
    size_t slot; /* index in the current run's items */
    wxg_guard_claim_t claim;
    wxg_guard_watch_t *watch;
    uint32_t errors; /* consecutive infrastructure errors, for the backoff */
    uint32_t attempts;
    int fail_code;
    const char *fail_plugin;
    char *fail_reason;
    int64_t first_failure_ms, last_failure_ms;
    int64_t unreadable_logged_ms; /* when guard_state_unreadable was last logged; 0: never */
} wxg__pl_item_t;

/* The metric handles the pipeline bumps (registered by the caller; docs/metrics.md). */
typedef struct wxg__pl_metrics {
    wxg_metric_t *claims[WXG__PL_CLAIM_N];
    wxg_metric_t *mismatches, *cache_hits;
    wxg_metric_t *guard_errors[WXG__PL_OP_N];
    wxg_metric_t *processed, *retries, *dlq_writes, *dlq_errors, *lease_lost;
    wxg_metric_t *unreadable; /* claims BUSY on a guard state the consumer cannot act on */
    wxg_metric_t *claim_seconds;
    wxg_metric_t **plugin_results;       /* nplugins * WXG__PL_RESULT_N */
    wxg_metric_t **plugin_seconds;       /* nplugins */
    wxg_metric_t *cluster[WXG__PL_CL_N]; /* what the workers' guard handles saw of a cluster */
} wxg__pl_metrics_t;

/* What the workers tell the caller about Redis, for readiness (written by every worker). */
typedef struct wxg__pl_health {
    atomic_int_fast64_t ok_ms;        /* monotonic ms of the latest guard call that reached Redis */
    atomic_int_fast64_t err_ms;       /* ... and of the latest that failed as a whole */
    atomic_int err;                   /* the WXG_E* code of that failure */
    atomic_int err_op;                /* and its WXG__PL_OP_* (claim, complete, ...) */
    atomic_uint_fast64_t round_trips; /* guard round trips, over every worker */
    /* The guard's text for that failure (wxg_guard_last_error(); in cluster mode it names the
     * node), under err_mu: written only when a call fails. */
    pthread_mutex_t err_mu;
    char err_text[256];
} wxg__pl_health_t;

/* Initialises the mutex of a zeroed health record; 0 or -1. Destroy with
 * wxg__pipeline_health_destroy(). */
int wxg__pipeline_health_init(wxg__pl_health_t *h);
void wxg__pipeline_health_destroy(wxg__pl_health_t *h);

/* Copies the text of the workers' latest failed guard call into buf ("" when none). */
void wxg__pipeline_health_error(wxg__pl_health_t *h, char *buf, size_t size);

/* Writes one dead letter and returns 0 once it is durable, else a negative WXG_E* code with
 * errstr filled. Called on a worker thread; may block for the write. */
typedef int (*wxg__pl_sink_fn)(void *arg, const wxg_dlq_record_t *rec, char *errstr,
                               size_t errstr_size);

/* Called once per item that finished (DONE, DUPLICATE or dead-lettered), after the pipeline
 * is done with it: the item may be freed from here on. Any worker thread. */
typedef void (*wxg__pl_finished_fn)(void *arg, wxg__pl_item_t *it);

/* The pipeline's shared settings. Everything is borrowed and must outlive every worker. */
typedef struct wxg__pipeline_conf {
    wxg_plugin_chain_t *chain;
    wxg_guard_watchdog_t *wd; /* renews the leases of claimed items while plugins run */
    size_t batch_max;         /* most items per run */
    uint32_t retry_max;       /* attempts before a retried message is dead-lettered, >= 1 */
    int64_t backoff_initial_ms, backoff_max_ms;
    const wxg__pl_metrics_t *metrics;
    wxg__pl_health_t *health;
    wxg__pl_sink_fn dead_letter;
    void *dead_letter_arg;
    wxg__pl_finished_fn finished;
    void *finished_arg;
} wxg__pipeline_conf_t;

typedef struct wxg__pl_worker wxg__pl_worker_t;

/* Creates one worker's pipeline state. Takes ownership of `g` and `pt` (also on failure);
 * `conf` is borrowed. NULL with errstr filled on allocation failure. */
wxg__pl_worker_t *wxg__pipeline_worker_new(const wxg__pipeline_conf_t *conf, unsigned index,
                                           wxg_guard_t *g, wxg_plugin_thread_t *pt, char *errstr,
                                           size_t errstr_size);

/* Frees the state, its guard handle and plugin thread state. NULL is accepted. On the thread
 * that used it. */
void wxg__pipeline_worker_destroy(wxg__pl_worker_t *w);

/* Runs n (1..batch_max) items, each a wxg__pl_item_t *, through their next stages. out[i]
 * receives WXG__POOL_FINISHED (-1) for an item that finished (the finished callback has run)
 * or the delay in ms after which items[i] must run again. Returns 0, or the code of the first
 * fatal error met (the items it touched are re-queued, unfinished): the caller must stop.
 * @locality the worker's own thread */
int wxg__pipeline_run(wxg__pl_worker_t *w, void *const *items, size_t n, int64_t *out);

/* Makes `it` a message of `rec` that starts at its claim. */
void wxg__pipeline_item_init(wxg__pl_item_t *it, wxg__pl_record_t *rec, const wxg_msg_view_t *msg);

/* Makes `it` stand for a record that cannot be processed (it did not decode): it goes straight
 * to the dead letter with `code` and `reason` (copied; may be NULL), one attempt, and returns 0.
 * Only a poison code parks (the record itself is bad). Any other class -- out of memory while
 * decoding, a decoder refusing its own configuration -- is not the record's fault: a dead letter
 * would lose a good message, so nothing is parked, `it` is left as it was, and `code` is
 * returned; the caller leaves the record unfinished and stops when the class is fatal. */
int wxg__pipeline_item_park(wxg__pl_item_t *it, wxg__pl_record_t *rec, int code,
                            const char *reason);

/* Takes an item out of the pipeline without finishing it (its partition was revoked, or the
 * pool is shutting down): marks it done and drops its claim and lease registration. Any
 * thread, while no worker runs the item. */
void wxg__pipeline_item_drop(const wxg__pipeline_conf_t *conf, wxg__pl_item_t *it);

/* Nonzero when the item waits to be re-run after its plugins: for its DONE marker (complete),
 * its dead letter or its fail mark. Cancelling it would hand effects that already ran to the
 * next owner, which runs them again. Only for an item that is not running (e.g. one the pool
 * holds for a re-queue delay). */
int wxg__pipeline_item_past_plugins(const wxg__pl_item_t *it);

/* Frees what the item owns (its failure reason). */
void wxg__pipeline_item_clear(wxg__pl_item_t *it);

#endif /* WXG_PIPELINE_INT_H */
