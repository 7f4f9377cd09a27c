/*
 * DESIGN: the consumer (include/wxguard/consumer.h).
 *
 * Purpose: turn Kafka's at-least-once delivery into exactly-once effects, committing an offset
 * only past messages that are DONE, duplicates, or durably dead-lettered.
 *
 * Threads:
 *   - The poll thread (the caller of wxg_consumer_run) owns the librdkafka handle: it polls,
 *     handles rebalances (inside rd_kafka_consumer_poll), decodes records, dispatches their
 *     messages to the pool, pauses and resumes partitions, stores and commits watermarks. It
 *     never blocks for long: a full pool leaves messages on a local backlog (the pending list)
 *     while polling goes on; a full backlog makes it wait for the workers for at most
 *     BACKLOG_WAIT_MS (see Backpressure); only a revoke waits, within its budget.
 *   - Worker threads (lib/pool.c) run batches of messages through the per-message pipeline
 *     (lib/pipeline.c: claim, plugins, complete, retry, dead letter, FAILED mark, one guard
 *     call per stage and batch); BUSY and RETRY go back to the pool with a delay instead of
 *     sleeping. The pipeline sees no librdkafka type: dispatch fills each record's view
 *     (rec_view: topic, partition, offset, timestamp, key, value, and its headers borrowed
 *     from the Kafka message and read only for a dead letter), dead letters go through
 *     dlq_sink, and a finished message comes back through job_finished. Each worker has its
 *     own guard connection and plugin thread state (worker_init); all of them share one near
 *     cache of DONE messages (lib/guard/donecache.c, its own striped locks), created before the
 *     workers and destroyed after them.
 *   - The guard's watchdog thread renews the leases of claimed messages while plugins run.
 *
 * Records and messages: one record decodes into one or more messages (batched sync callbacks);
 * each message is one pool job routed by (account, conversation). The record's offset is
 * finished in the offsets tracker when its last job finishes, unless a job was cancelled (its
 * partition was revoked): then the offset stays unfinished and the new owner redoes it.
 *
 * Partitions: one table (`parts`, grown by the poll thread only, entries never freed before
 * the consumer) holds everything about a partition: its Kafka state (assigned, paused, lag,
 * stall), its records in flight, its claim times waiting for a commit, and its finished
 * watermark (a wxg__offsets_t, lib/offsets_int.h, which takes no lock of its own: it
 * was a second table with a second lock per partition, and finishing a record took both).
 *
 * Locks: each partition has one small mutex (`cpart.mu`) over its list of records in flight (in
 * dispatch order), its ring of claim times and its watermark. The poll thread takes it to
 * dispatch and link a record, to read the watermark (store, commit, pause, lag, stalls), to
 * find the oldest record for the stall detector and to match commits; whoever drops a record's
 * last reference takes it once to unlink the record, note its claim time and finish its
 * offset, which is what lets the poll thread read the oldest record's offset and key safely. It
 * is held for a few pointer moves only and nothing else is taken inside it; pool callbacks may
 * take it (lock order: pool lock, then cpart.mu). `ready_mu` guards the stall reason text for
 * /readyz. `room_mu` carries the pool's low-watermark wake-up to a poll thread waiting for room;
 * the callback takes it inside the pool lock, and nothing is taken while it is held. Everything
 * else is atomics.
 *
 * Metrics: counters are metric handles (lib/metrics.c atomics) bumped where the event happens;
 * gauges are set by the poll thread (every GAUGE_EVERY_MS, lag every LAG_EVERY_MS from
 * librdkafka's cached watermarks, which never block); wxg_consumer_stats() reads the handles.
 * Claim-to-commit latency: a record's first claim time goes into its partition's ring when it
 * finishes, and the commit callback observes every entry below the committed offset.
 *
 * Backpressure: a pause costs more than it looks. librdkafka 2.0 drops every message it has
 * prefetched for a paused partition; on resume it fetches again from the stored offset, and
 * the fetcher only notices the resume at its next wake-up (a fetch reply, at most
 * fetch.wait.max.ms after a long poll, or its one-second tick). Pausing each time the pool
 * filled and resuming when it had almost drained left the workers idle for every refetch, and
 * even pausing only for a full backlog made librdkafka fetch much of its prefetch again (with
 * busy workers, a quarter of the replica's CPU). So the pool's fill level pauses nothing:
 * messages that find the pool full wait on the backlog; when the backlog reaches
 * queue_capacity messages the poll thread stops polling and waits for the workers (the pool's
 * low watermark wakes it), leaving what librdkafka prefetched where it is. Only a backlog that
 * stays that full for BACKLOG_WAIT_MS (the workers are stuck, not merely busy) pauses every
 * partition, so that rebalances and commits are served again; they are resumed when the
 * backlog is down to half, while the pool is still full, so the workers have a pool and half
 * a backlog of work to cover the refetch. The consumer also lowers librdkafka's default
 * fetch.wait.max.ms (500 ms) to FETCH_WAIT_MS unless it is configured. Memory stays bounded:
 * at most queue_capacity messages in the pool plus queue_capacity on the backlog (and the
 * messages of the one record that crossed the line), plus what librdkafka prefetches within
 * its queued.min.messages and queued.max.messages.kbytes. A partition assigned while the
 * backlog is full is paused at once (librdkafka keeps a pause across re-assignment).
 *
 * Batch delay: a worker waits up to batch_delay_us for a batch to fill, but the poll thread
 * submits the last message it has with wxg__pool_submit_last whenever nothing more is fetched, so
 * at light load a partial batch leaves at once and batching adds no latency; under load batches
 * fill.
 *
 * Failure modes, decided by the error's class (wxg_err_class, stop_if_fatal): Redis
 * unreachable -> whole-batch re-queue with capped backoff (nothing finishes, so nothing commits
 * past it); a fatal class (WXG_EAUTH, WXG_ECONFIG for a layout stamp that changed, from a
 * worker or from the watchdog; WXG_ENOMEM; librdkafka's fatal error as WXG_ESTATE) -> orderly
 * shutdown, whose drain stops once only delayed work is left, and wxg_consumer_run returns
 * the code (wxguard-consumer exits 1); DLQ unwritable
 * -> the message waits and retries, holding its partition's watermark; a record that does not
 * decode is parked only when its code is poison (the record is bad), while a decode that fails
 * for another reason (out of memory) parks nothing, leaves the offset unfinished and, being
 * fatal, stops the consumer (rec_jobs); stores for partitions no
 * longer ours (_STATE) and late completions are counted, not errors; a synchronous commit (at
 * a revoke, and the final one) that gets no answer within commit_timeout_ms is abandoned, and a
 * close that does not finish within session.timeout.ms (within commit_timeout_ms after such a
 * final commit) is abandoned (close_timeout), so that a stop stays bounded even when the group
 * coordinator cannot be reached: what was not committed is redelivered to the next owner and
 * skipped by the guard. A plugin call still running when the stop's drain budget is spent is
 * not waited for either (wxg__pool_stop): its worker is left running, nothing is committed past
 * its message, and the caller exits without destroying what the worker uses
 * (wxg_consumer_abandoned); the next owner takes the message over once its lease runs out.
 */
#include "wxguard/consumer.h"

#include <librdkafka/rdkafka.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock_int.h"
#include "donecache_int.h"
#include "err_int.h"
#include "offsets_int.h"
#include "pipeline_int.h"
#include "pool_int.h"
#include "recycle_int.h"
#include "wxguard/err.h"
#include "wxguard/ingest.h"
#include "wxguard/log.h"

#define STORE_EVERY_MS     20
#define PAUSE_EVERY_MS     10
#define BACKLOG_WAIT_MS    200
#define ROOM_WAIT_MS       10
#define FETCH_WAIT_MS      "100"
#define STATS_EVERY_MS     10000
#define GAUGE_EVERY_MS     100
#define LAG_EVERY_MS       1000
#define STALL_EVERY_MS     200
#define REDIS_DOWN_HOLD_MS 30000
#define STOP_GRACE_MS      1000
#define C2C_RING           2048
#define LAT_BUCKETS        128
#define KEY_LOG_MAX        160
#define CACHE_LINE         64
/* Memory the poll thread keeps for reuse instead of freeing (recycle_int.h): chunks of decoded
 * batches, and the bookkeeping of one-message records. */
#define DECODE_CACHE_BYTES ((size_t)4 << 20)
#define SPARE_REC_BYTES    ((size_t)2 << 20)

typedef struct cpart cpart;
typedef struct rec rec;

/* One message of a record: its pipeline item (first, so that the pool's item pointer is the
 * job's), and what the poll thread needs to route it. */
typedef struct job {
    wxg__pl_item_t it;
    rec *r;
    struct job *pnext; /* pending list */
    uint64_t conv;
} job;

struct rec {
    rd_kafka_message_t *rkm;
    wxg__pl_record_t view; /* what the pipeline sees of rkm */
    int64_t dispatched_us;
    wxg_batch_t *batch;
    cpart *part;
    wxg__offsets_ticket_t ticket;
    atomic_int refs;
    atomic_int cancelled;
    rec *lprev, *lnext; /* the partition's in-flight list, under part->mu */
    rec *fnext;         /* the released list (consumer.released) */
    int decode_err;
    char *decode_reason;
    size_t njobs;
    job jobs[];
};

typedef struct c2c_entry {
    int64_t offset;
    int64_t claimed_us;
    uint64_t epoch;
} c2c_entry;

/* Everything the consumer keeps about one partition, in one place under one lock: created by
 * the poll thread at its first assignment and kept until the consumer is destroyed, so that a
 * record's `part` never dangles. */
struct cpart {
    char *topic;
    int32_t partition;
    uint64_t tag;
    /* Poll thread only. */
    int assigned;
    int paused;
    int64_t paused_since_ms; /* when backpressure paused it */
    uint64_t epoch;          /* of the current assignment (the watermark's) */
    int stalled;             /* the stall detector's state */
    int64_t stalled_offset;
    wxg_metric_t *lag;
    int64_t next; /* offset after the last record dispatched, -1 when unknown */
    /* Under mu, from any thread. */
    pthread_mutex_t mu;
    rec *head, *tail; /* records in flight, oldest first */
    c2c_entry *c2c;   /* C2C_RING entries: finished records waiting for a commit */
    size_t c2c_head, c2c_len;
    wxg__offsets_t *wm; /* the finished watermark of the current assignment */
};

/* The consumer's metric handles (docs/metrics.md); those the pipeline bumps are in `pl`. */
typedef struct cmetrics {
    wxg_metrics_t *reg;
    wxg_metrics_t *own; /* a private registry when the caller gave none */
    wxg__pl_metrics_t pl;
    wxg_metric_t *records, *decode_errors, *commits;
    wxg_metric_t *commit_failures, *assigns, *revokes, *revoke_timeouts;
    wxg_metric_t *inflight, *queue, *assigned, *paused, *oldest, *stalled, *redis_up;
    wxg_metric_t *c2c_seconds;
    wxg_metric_t *cache_entries, *cache_evictions;
} cmetrics;

struct wxg_consumer_s {
    wxg_consumer_conf_t conf;
    wxg_guard_conf_t guard_conf;
    char **topics;
    char *group_id;
    rd_kafka_t *rk;
    rd_kafka_queue_t *rkq;         /* the consumer queue, for rd_kafka_queue_yield() */
    wxg__pipeline_conf_t pipeline; /* shared by the workers' pipelines */
    wxg__pool_t *pool;
    wxg_guard_watchdog_t *wd;
    /* The near cache the workers share (guard_conf.done_cache); owned when created here, and
     * destroyed only after every worker's guard handle. */
    wxg_donecache_t *done_cache;
    uint64_t cache_evictions_seen; /* poll thread only */
    size_t nplugins;

    cpart **parts;
    size_t nparts, capparts;
    cpart *last_part;
    job *pending_head, *pending_tail;
    size_t npending;
    /* Poll thread only (or the destroyer, once no worker runs), like the frees below: the decode
     * cache its batches come from and go back to, and freed one-message records. */
    wxg_decode_cache_t *decode_cache;
    wxg__recycle_t spare_recs;
    /* Records whose last reference was dropped, waiting for the poll thread to free them (see
     * rec_release). Pushed by any thread, taken whole by the poll thread. Every worker writes it
     * for every record, so it has a cache line to itself: beside the poll thread's fields above,
     * each push stalled the poll thread's next access to them (false sharing). */
    char pad_released_before[CACHE_LINE];
    _Atomic(rec *) released;
    char pad_released_after[CACHE_LINE];

    /* Set by wxg_consumer_stop from any thread or a signal handler: a lock-free atomic is both
     * async-signal-safe and free of data races (a volatile sig_atomic_t is only the former). */
    atomic_int stop_requested;
    atomic_int fatal;
    /* Set by the pool's low-watermark callback, cleared by the poll thread when it wakes. */
    pthread_mutex_t room_mu;
    pthread_cond_t room_cv;
    int room;
    int room_ready;        /* room_mu and room_cv were initialised */
    int backlog_full;      /* hysteresis state of the backlog (poll thread only) */
    int64_t over_since_ms; /* when the backlog reached backlog_high, 0 below it (poll thread) */
    size_t backlog_high, backlog_low;
    int stopping;
    int closing;
    int close_timed_out; /* the close did not finish: the handle is abandoned, not destroyed */
    unsigned abandoned;  /* workers the stop left inside a plugin: nothing may be freed */
    int ever_assigned;   /* the rebalance callback has assigned at least once */
    int close_released;  /* an assign during close made librdkafka release every partition */
    int coord_silent;    /* the final commit got no answer from the coordinator */
    /* A commit was refused with UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION: the group no longer
     * knows this member (its session timed out, or a rebalance went on without it). Poll
     * thread only. */
    int member_lost;
    int kafka_stuck;       /* a bounded librdkafka call got no answer (kcall_bounded) */
    int64_t stop_deadline; /* monotonic ms at which the stop's drain budget ends; 0: no stop */
    int protocol;          /* 0 not known yet, 1 eager, 2 cooperative */
    int ran;
    size_t window_limit;

    cmetrics m;
    /* Internal counters that have no metric of their own. The poll thread's (written per
     * record) and the workers' (written per batch) are a cache line apart, for the reason given
     * at `released`. */
    atomic_uint_fast64_t messages, offsets_stored, store_state, offsets_committed, stale_finishes;
    atomic_size_t pending_n;
    atomic_int_fast64_t lag;
    char pad_counters[CACHE_LINE];
    atomic_uint_fast64_t batches, batched_jobs;
    wxg__pl_health_t health; /* the workers' latest Redis contact and round trips */

    /* Readiness. */
    atomic_int joined; /* an assignment (possibly empty) arrived */
    atomic_size_t stalled_n;
    int redis_down_logged;    /* check_redis() logged an outage not yet over (poll thread) */
    pthread_mutex_t ready_mu; /* stall_reason */
    int ready_mu_init;
    int health_init; /* health.err_mu made */
    char stall_reason[512];
    /* Dispatch-to-finished latency: bucket i counts records that took about 2^(i/4) us. */
    atomic_uint_fast64_t latency[LAT_BUCKETS];
};

/* ---- small helpers ---- */

static void latency_observe(wxg_consumer_t *c, int64_t us)
{
    /* Quarter steps of log2: about 19% resolution, plenty for p50/p99. Bucket i holds
     * [2^(i/4), 2^((i+1)/4)) microseconds: the whole octave from the highest set bit, the
     * quarter from comparing the value with the octave's three quarter marks (2^(k/4) in
     * units of 2^-16, as integers), with no loop and no floating point per message. */
    static const uint64_t quarter[3] = {77936, 92682, 110218};
    uint64_t v = us > 1 ? (uint64_t)us : 1;
    int octave = 63 - __builtin_clzll(v);
    /* v scaled so that the octave's start is 2^16, keeping 16 bits below the top one. */
    uint64_t m = octave >= 16 ? v >> (octave - 16) : v << (16 - octave);
    int q = (m >= quarter[0]) + (m >= quarter[1]) + (m >= quarter[2]);
    int i = 4 * octave + q;
    if (i > LAT_BUCKETS - 1)
        i = LAT_BUCKETS - 1;
    atomic_fetch_add(&c->latency[i], 1);
}

static int64_t latency_quantile(wxg_consumer_t *c, double q)
{
    uint64_t total = 0, counts[LAT_BUCKETS];
    for (int i = 0; i < LAT_BUCKETS; i++) {
        counts[i] = atomic_load(&c->latency[i]);
        total += counts[i];
    }
    if (total == 0)
        return 0;
    uint64_t want = (uint64_t)(q * (double)total), seen = 0;
    double v = 1;
    for (int i = 0; i < LAT_BUCKETS; i++, v *= 1.189207115) {
        seen += counts[i];
        if (seen > want)
            return (int64_t)v;
    }
    return (int64_t)v;
}

void wxg_consumer_conf_init(wxg_consumer_conf_t *conf)
{
    if (!conf)
        return;
    memset(conf, 0, sizeof *conf);
    conf->workers = 4;
    conf->queue_capacity = 4096;
    conf->batch_max = 64;
    conf->batch_delay_us = 1000;
    conf->drain_timeout_ms = 30000;
    conf->commit_interval_ms = 1000;
    conf->commit_timeout_ms = 5000;
    conf->retry_max = 5;
    conf->backoff_initial_ms = 200;
    conf->backoff_max_ms = 30000;
    conf->max_message_bytes = 1 << 20;
    conf->format = WXG_FORMAT_AUTO;
    conf->stall_timeout_ms = 300000;
    conf->redis_probe_ms = 5000;
    conf->done_cache_entries = 65536;
}

/* ---- records and jobs ---- */

/* The size of a record with room for n jobs; records of one job are recycled (spare_recs). */
static size_t rec_size(size_t n)
{
    return sizeof(rec) + (n ? n : 1) * sizeof(job);
}

static void rec_free(wxg_consumer_t *c, rec *r)
{
    for (size_t i = 0; i < r->njobs; i++)
        wxg__pipeline_item_clear(&r->jobs[i].it);
    wxg_batch_free(r->batch);
    free(r->decode_reason);
    if (r->rkm)
        rd_kafka_message_destroy(r->rkm);
    if (r->njobs > 1 || !wxg__recycle_push(&c->spare_recs, r, rec_size(1)))
        free(r);
}

/* Frees the records released so far. Poll thread (or the destroyer, once no worker runs). */
static void free_released(wxg_consumer_t *c)
{
    rec *r = atomic_exchange(&c->released, NULL);
    while (r) {
        rec *next = r->fnext;
        rec_free(c, r);
        r = next;
    }
}

/* Drops one job's reference; the last one finishes the record's offset (unless a job of it was
 * cancelled) and hands the record to the poll thread to free. Any thread.
 *
 * The poll thread allocated the record and its decoded batch; freeing them on a worker made
 * glibc return each chunk to the poll thread's arena under that arena's lock, contended with
 * the poll thread's own allocations (about a tenth of the replica's CPU under load). Freed by
 * the thread that allocated them, the chunks go back to its caches uncontended. */
static void rec_release(wxg_consumer_t *c, rec *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    cpart *p = r->part;
    int cancelled = atomic_load(&r->cancelled);
    int64_t claimed = atomic_load(&r->view.claimed_us);
    pthread_mutex_lock(&p->mu);
    if (r->lprev)
        r->lprev->lnext = r->lnext;
    else
        p->head = r->lnext;
    if (r->lnext)
        r->lnext->lprev = r->lprev;
    else
        p->tail = r->lprev;
    /* The claim time goes in before the offset is finished, so that no commit can pass the
     * offset before its sample is there. A full ring drops the sample (the histogram is then
     * a sample of the records). */
    if (!cancelled && claimed > 0 && p->c2c && p->c2c_len < C2C_RING) {
        p->c2c[(p->c2c_head + p->c2c_len) % C2C_RING] =
            (c2c_entry){.offset = r->rkm->offset, .claimed_us = claimed, .epoch = r->ticket.epoch};
        p->c2c_len++;
    }
    int stale = !cancelled && wxg__offsets_finish(p->wm, &r->ticket) == WXG_ESTATE;
    pthread_mutex_unlock(&p->mu);
    if (stale)
        atomic_fetch_add(&c->stale_finishes, 1);
    else if (!cancelled)
        latency_observe(c, wxg__mono_us() - r->dispatched_us);
    rec *head = atomic_load(&c->released);
    do {
        r->fnext = head;
    } while (!atomic_compare_exchange_weak(&c->released, &head, r));
}

/* The pipeline finished a job (any worker thread): drop its reference on the record. */
static void job_finished(void *arg, wxg__pl_item_t *it)
{
    wxg_consumer_t *c = arg;
    rec_release(c, ((job *)it)->r);
}

/* The record's headers for a dead letter, borrowed from the Kafka message (pipeline_int.h). */
static size_t rec_headers(const wxg__pl_record_t *v, wxg_kafka_header_t *out, size_t cap)
{
    rd_kafka_headers_t *hdrs = NULL;
    rd_kafka_message_t *m = (rd_kafka_message_t *)v->headers_src;
    if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR || !hdrs)
        return 0;
    size_t cnt = rd_kafka_header_cnt(hdrs);
    if (!out)
        return cnt;
    size_t n = 0;
    for (size_t i = 0; i < cnt && n < cap; i++) {
        const char *name;
        const void *val;
        size_t size;
        if (rd_kafka_header_get_all(hdrs, i, &name, &val, &size) != RD_KAFKA_RESP_ERR_NO_ERROR)
            break;
        out[n++] = (wxg_kafka_header_t){.name = name, .value = val, .value_len = size};
    }
    return n;
}

/* The pipeline's dead-letter sink: the configured dead-letter topic. */
static int dlq_sink(void *arg, const wxg_dlq_record_t *dr, char *errstr, size_t errstr_size)
{
    wxg_consumer_t *c = arg;
    return wxg_dlq_write(c->conf.dlq, dr, NULL, errstr, errstr_size);
}

/* ---- workers ---- */

/* Decides by the error's class (include/wxguard/err.h) whether the consumer can go on: a fatal
 * one stops it (the first such code is what wxg_consumer_run returns). Returns 1 when it was
 * fatal. Any thread. */
static int stop_if_fatal(wxg_consumer_t *c, int rc)
{
    if (wxg_err_class(rc) != WXG_CLASS_FATAL)
        return 0;
    int expected = 0;
    atomic_compare_exchange_strong(&c->fatal, &expected, rc);
    return 1;
}

static void worker_run(void *opaque, void *wstate, void *const *items, size_t n, int64_t *out)
{
    stop_if_fatal(opaque, wxg__pipeline_run(wstate, items, n, out));
}

static void worker_cancelled(void *opaque, void *item)
{
    wxg_consumer_t *c = opaque;
    job *j = item;
    wxg__pipeline_item_drop(&c->pipeline, &j->it);
    atomic_store(&j->r->cancelled, 1);
    rec_release(c, j->r);
}

/* A revoke keeps work whose effects already ran and that waits out the backoff of its DONE
 * marker (or dead letter, or fail mark), typically because Redis did not answer: the revoke's
 * drain lets it retry within the budget, so the marker lands as soon as Redis is back and the
 * watermark can be committed past it. Cancelled, it would go to the next owner, which would
 * run the effects again. @locks pool lock held */
static int worker_keep_delayed(void *opaque, void *item)
{
    (void)opaque;
    return wxg__pipeline_item_past_plugins(&((job *)item)->it);
}

static void worker_pressure(void *opaque, int high)
{
    wxg_consumer_t *c = opaque;
    if (high)
        return;
    /* Wake the poll thread: it may be waiting for room with a full backlog, or blocked in
     * rd_kafka_consumer_poll() with every partition paused, and must move the backlog in (and
     * resume) as soon as the pool has drained. */
    pthread_mutex_lock(&c->room_mu);
    c->room = 1;
    pthread_cond_signal(&c->room_cv);
    pthread_mutex_unlock(&c->room_mu);
    if (c->rkq)
        rd_kafka_queue_yield(c->rkq);
}

/* The poll thread, with a full backlog: waits until the pool has drained to its low watermark,
 * at most `ms`. */
static void wait_for_room(wxg_consumer_t *c, int64_t ms)
{
    struct timespec ts = wxg__mono_after(ms);
    pthread_mutex_lock(&c->room_mu);
    if (!c->room)
        pthread_cond_timedwait(&c->room_cv, &c->room_mu, &ts);
    c->room = 0;
    pthread_mutex_unlock(&c->room_mu);
}

/* A worker's pipeline, with its own guard connection and plugin thread state. */
static int worker_init(void *opaque, unsigned worker, void **out, char *errstr, size_t errstr_size)
{
    wxg_consumer_t *c = opaque;
    int gerr = 0;
    wxg_guard_t *g = wxg_guard_new(&c->guard_conf, &gerr, errstr, errstr_size);
    if (!g)
        return gerr ? gerr : WXG_ECONN;
    wxg_plugin_thread_t *pt = NULL;
    int rc = wxg_plugin_thread_new(c->conf.chain, &pt, errstr, errstr_size);
    if (rc != 0) {
        wxg_guard_destroy(g);
        return rc;
    }
    wxg__pl_worker_t *w =
        wxg__pipeline_worker_new(&c->pipeline, worker, g, pt, errstr, errstr_size);
    if (!w)
        return WXG_ENOMEM;
    *out = w;
    return 0;
}

static void worker_fini(void *opaque, unsigned worker, void *wstate)
{
    wxg__pipeline_worker_destroy(wstate);
}

/* ---- partitions (poll thread) ---- */

static cpart *part_find(wxg_consumer_t *c, const char *topic, int32_t partition)
{
    cpart *l = c->last_part;
    if (l && l->partition == partition && strcmp(l->topic, topic) == 0)
        return l;
    for (size_t i = 0; i < c->nparts; i++) {
        cpart *p = c->parts[i];
        if (p->partition == partition && strcmp(p->topic, topic) == 0) {
            c->last_part = p;
            return p;
        }
    }
    return NULL;
}

static cpart *part_get(wxg_consumer_t *c, const char *topic, int32_t partition)
{
    cpart *p = part_find(c, topic, partition);
    if (p)
        return p;
    if (c->nparts == c->capparts) {
        size_t n = c->capparts ? c->capparts * 2 : 16;
        cpart **v = realloc(c->parts, n * sizeof *v);
        if (!v)
            return NULL;
        c->parts = v;
        c->capparts = n;
    }
    p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->topic = strdup(topic);
    p->c2c = calloc(C2C_RING, sizeof *p->c2c);
    p->wm = wxg__offsets_new(NULL, 0);
    if (!p->topic || !p->c2c || !p->wm || pthread_mutex_init(&p->mu, NULL) != 0) {
        wxg__offsets_destroy(p->wm);
        free(p->c2c);
        free(p->topic);
        free(p);
        return NULL;
    }
    p->partition = partition;
    p->tag = (uint64_t)c->nparts + 1;
    c->parts[c->nparts++] = p;
    return p;
}

/* The watermark's queries and its assignment, under the partition's lock. */
static int part_committable(cpart *p, int64_t *offset)
{
    pthread_mutex_lock(&p->mu);
    int rc = wxg__offsets_committable(p->wm, offset);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static size_t part_window(cpart *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = wxg__offsets_window(p->wm);
    pthread_mutex_unlock(&p->mu);
    return n;
}

static int part_assign(cpart *p, uint64_t *epoch)
{
    pthread_mutex_lock(&p->mu);
    int rc = wxg__offsets_assign(p->wm, epoch);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static void count_parts(wxg_consumer_t *c)
{
    size_t a = 0, pz = 0;
    for (size_t i = 0; i < c->nparts; i++) {
        a += c->parts[i]->assigned;
        pz += c->parts[i]->assigned && c->parts[i]->paused;
    }
    wxg_gauge_set(c->m.assigned, (double)a);
    wxg_gauge_set(c->m.paused, (double)pz);
}

/* Pauses (want=1) or resumes (want=0) the listed partitions and records which ones we paused,
 * so that we only ever resume what we paused ourselves. */
static void set_paused(wxg_consumer_t *c, cpart **v, size_t n, int want)
{
    if (n == 0)
        return;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    if (!l)
        return;
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, v[i]->topic, v[i]->partition);
    rd_kafka_resp_err_t err =
        want ? rd_kafka_pause_partitions(c->rk, l) : rd_kafka_resume_partitions(c->rk, l);
    int64_t now = wxg__mono_ms();
    for (int i = 0; i < l->cnt; i++) {
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR && l->elems[i].err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (want && !v[i]->paused)
                v[i]->paused_since_ms = now;
            v[i]->paused = want;
        }
    }
    const char *why = !want             ? "drained"
                      : c->stopping     ? "shutdown"
                      : c->backlog_full ? "backlog"
                                        : "window";
    wxg_log(WXG_LOG_INFO, want ? "pause" : "resume", WXG_LU("partitions", n),
            WXG_LS("reason", why));
    rd_kafka_topic_partition_list_destroy(l);
    count_parts(c);
}

/* After a resume for backpressure: librdkafka 2.0 would refetch from the stored offset, and its
 * fetcher notices a resume only at its next wake-up (up to a second later). A seek to where
 * dispatching stopped skips the refetch and wakes the fetcher; zero timeout: nobody waits for
 * it. Only for partitions that stay assigned: seeking one that is being revoked can hang its
 * release, so the revoke path never comes here. */
static void seek_resumed(wxg_consumer_t *c, cpart **v, size_t n)
{
    rd_kafka_topic_partition_list_t *s = rd_kafka_topic_partition_list_new((int)n + 1);
    if (!s)
        return;
    for (size_t i = 0; i < n; i++) {
        if (v[i]->assigned && !v[i]->paused && v[i]->next >= 0)
            rd_kafka_topic_partition_list_add(s, v[i]->topic, v[i]->partition)->offset = v[i]->next;
    }
    if (s->cnt > 0) {
        rd_kafka_error_t *e = rd_kafka_seek_partitions(c->rk, s, 0);
        if (e)
            rd_kafka_error_destroy(e);
    }
    rd_kafka_topic_partition_list_destroy(s);
}

/* Updates the backlog's hysteresis state; returns nonzero when it changed. The backlog counts
 * as full (and pauses) once it has stayed at its high mark for BACKLOG_WAIT_MS, and until it
 * is down to its low mark. */
static int backlog_update(wxg_consumer_t *c)
{
    int over = c->npending >= c->backlog_high;
    int64_t now = wxg__mono_ms();
    if (!over)
        c->over_since_ms = 0;
    else if (!c->over_since_ms)
        c->over_since_ms = now;
    int full = c->backlog_full ? c->npending > c->backlog_low
                               : over && now - c->over_since_ms >= BACKLOG_WAIT_MS;
    if (full == c->backlog_full)
        return 0;
    c->backlog_full = full;
    return 1;
}

/* Brings the pause state of every assigned partition in line with what it should be: paused
 * while the backlog is full (see the top of this file), while stopping, or while the
 * partition's own window behind a stuck message is too large. */
static void apply_pause(wxg_consumer_t *c)
{
    if (c->nparts == 0)
        return;
    backlog_update(c);
    int global = c->stopping || c->backlog_full;
    cpart **pause = calloc(c->nparts, sizeof *pause);
    cpart **resume = calloc(c->nparts, sizeof *resume);
    size_t np = 0, nr = 0;
    if (!pause || !resume)
        goto out;
    for (size_t i = 0; i < c->nparts; i++) {
        cpart *p = c->parts[i];
        if (!p->assigned)
            continue;
        int want = global || part_window(p) > c->window_limit;
        if (want && !p->paused)
            pause[np++] = p;
        else if (!want && p->paused)
            resume[nr++] = p;
    }
    set_paused(c, pause, np, 1);
    set_paused(c, resume, nr, 0);
    if (!c->stopping && !c->closing)
        seek_resumed(c, resume, nr);
out:
    free(pause);
    free(resume);
}

/* ---- offsets (poll thread) ---- */

static void store_offsets(wxg_consumer_t *c)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(16);
    if (!l)
        return;
    for (size_t i = 0; i < c->nparts; i++) {
        cpart *p = c->parts[i];
        int64_t off;
        if (!p->assigned)
            continue;
        pthread_mutex_lock(&p->mu);
        int advanced = wxg__offsets_advanced(p->wm, &off);
        pthread_mutex_unlock(&p->mu);
        if (advanced)
            rd_kafka_topic_partition_list_add(l, p->topic, p->partition)->offset = off;
    }
    if (l->cnt > 0) {
        rd_kafka_resp_err_t err = rd_kafka_offsets_store(c->rk, l);
        for (int i = 0; i < l->cnt; i++) {
            if (l->elems[i].err == RD_KAFKA_RESP_ERR__STATE)
                atomic_fetch_add(&c->store_state, 1);
            else if (l->elems[i].err == RD_KAFKA_RESP_ERR_NO_ERROR)
                atomic_fetch_add(&c->offsets_stored, 1);
        }
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR__STATE)
            wxg_log(WXG_LOG_WARN, "store_failed", WXG_LS("kafka_err", rd_kafka_err2name(err)));
    }
    rd_kafka_topic_partition_list_destroy(l);
}

static cpart *part_find(wxg_consumer_t *c, const char *topic, int32_t partition);

/* Observes the claim-to-commit latency of every finished record below `committed`. */
static void c2c_committed(wxg_consumer_t *c, cpart *p, int64_t committed)
{
    int64_t now = wxg__mono_us();
    pthread_mutex_lock(&p->mu);
    while (p->c2c_len > 0) {
        c2c_entry *e = &p->c2c[p->c2c_head];
        if (e->epoch == p->epoch && e->offset >= committed)
            break;
        if (e->epoch == p->epoch)
            wxg_histogram_observe(c->m.c2c_seconds, (double)(now - e->claimed_us) / 1e6);
        p->c2c_head = (p->c2c_head + 1) % C2C_RING;
        p->c2c_len--;
    }
    pthread_mutex_unlock(&p->mu);
}

static void commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    wxg_consumer_t *c = opaque;
    if (err == RD_KAFKA_RESP_ERR__NO_OFFSET)
        return; /* nothing new to commit */
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        wxg_counter_inc(c->m.commit_failures);
        wxg_log(WXG_LOG_WARN, "commit_failed", WXG_LS("kafka_err", rd_kafka_err2name(err)));
        return;
    }
    wxg_counter_inc(c->m.commits);
    for (int i = 0; offsets && i < offsets->cnt; i++) {
        rd_kafka_topic_partition_t *tp = &offsets->elems[i];
        if (tp->err != RD_KAFKA_RESP_ERR_NO_ERROR || tp->offset < 0)
            continue;
        atomic_fetch_add(&c->offsets_committed, 1);
        cpart *p = part_find(c, tp->topic, tp->partition);
        if (p && p->assigned)
            c2c_committed(c, p, tp->offset);
    }
}

/* ---- synchronous commits with a bound (poll thread) ---- */

/* Commits `offsets` (NULL: the stored offsets of the whole assignment) and waits at most
 * conf.commit_timeout_ms for the answer. rd_kafka_commit(.., 0) would wait without a limit:
 * librdkafka 2.0.2 keeps a commit for an unreachable coordinator until the session times out,
 * and one sent to a coordinator that accepted it but does not answer until the request
 * times out (socket.timeout.ms) and is retried. So the commit is sent asynchronously with its
 * answer routed to a queue of its own, and that queue is waited on within the budget. Returns
 * the commit's result, or RD_KAFKA_RESP_ERR__TIMED_OUT when no answer came in time: the commit
 * then stays queued in librdkafka and may still land (its offsets are finished watermarks, so
 * that is safe, and the broker refuses it once the group has moved to a new generation); its
 * answer is dropped with the queue. The configured commit callback sees the answer too, when
 * it comes, as it does for every commit. */
static rd_kafka_resp_err_t commit_bounded(wxg_consumer_t *c,
                                          const rd_kafka_topic_partition_list_t *offsets)
{
    rd_kafka_queue_t *q = rd_kafka_queue_new(c->rk);
    if (!q)
        return RD_KAFKA_RESP_ERR__CRIT_SYS_RESOURCE;
    rd_kafka_resp_err_t err = rd_kafka_commit_queue(c->rk, offsets, q, NULL, NULL);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        err = RD_KAFKA_RESP_ERR__TIMED_OUT;
        int64_t deadline = wxg__mono_ms() + c->conf.commit_timeout_ms;
        for (;;) {
            int64_t left = deadline - wxg__mono_ms();
            if (left <= 0)
                break;
            rd_kafka_event_t *ev = rd_kafka_queue_poll(q, (int)left);
            if (!ev)
                continue;
            int mine = rd_kafka_event_type(ev) == RD_KAFKA_EVENT_OFFSET_COMMIT;
            if (mine)
                err = rd_kafka_event_error(ev);
            rd_kafka_event_destroy(ev);
            if (mine)
                break;
        }
    }
    rd_kafka_queue_destroy(q);
    return err;
}

/* ---- rebalances (poll thread, inside rd_kafka_consumer_poll) ---- */

/* The protocol is fixed by the configured assignor, so it is asked once and remembered: in
 * librdkafka 2.0.2 rd_kafka_rebalance_protocol() is a request to the group thread, and one sent
 * while the group terminates during close is dropped unanswered and waits for ever. */
static int is_cooperative(wxg_consumer_t *c)
{
    if (c->protocol == 0) {
        const char *proto = rd_kafka_rebalance_protocol(c->rk);
        if (proto && strcmp(proto, "COOPERATIVE") == 0)
            c->protocol = 2;
        else if (proto && strcmp(proto, "EAGER") == 0)
            c->protocol = 1;
    }
    return c->protocol == 2;
}

static void drop_pending_of(wxg_consumer_t *c, const cpart *p)
{
    job **pp = &c->pending_head;
    job *prev = NULL;
    while (*pp) {
        job *j = *pp;
        if (p == NULL || j->r->part == p) {
            *pp = j->pnext;
            c->npending--;
            worker_cancelled(c, j);
            continue;
        }
        prev = j;
        pp = &j->pnext;
    }
    c->pending_tail = prev;
    atomic_store(&c->pending_n, c->npending);
}

static void on_assign(wxg_consumer_t *c, rd_kafka_topic_partition_list_t *parts)
{
    c->ever_assigned = 1;
    c->member_lost = 0; /* a member of the group again */
    cpart **v = calloc((size_t)parts->cnt + 1, sizeof *v);
    size_t nv = 0;
    for (int i = 0; i < parts->cnt; i++) {
        rd_kafka_topic_partition_t *tp = &parts->elems[i];
        cpart *p = part_get(c, tp->topic, tp->partition);
        uint64_t epoch = 0;
        if (!p || part_assign(p, &epoch) != 0) {
            wxg_log(WXG_LOG_ERROR, "assign_failed", WXG_LERR(WXG_ENOMEM));
            stop_if_fatal(c, WXG_ENOMEM);
            continue;
        }
        p->assigned = 1;
        p->paused = 0;
        p->epoch = epoch; /* c2c entries of earlier assignments are dropped, never observed */
        if (!p->lag) {
            char pnum[16];
            snprintf(pnum, sizeof pnum, "%d", (int)tp->partition);
            p->lag = wxg_metrics_gauge(c->m.reg, "wxg_consumer_lag",
                                       "High watermark minus the finished watermark, per "
                                       "assigned partition.",
                                       "topic", tp->topic, "partition", pnum, NULL);
        }
        p->next = -1;
        if (v)
            v[nv++] = p;
    }
    rd_kafka_error_t *e = NULL;
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    /* librdkafka 2.0.2 treats any assign made while the consumer closes as a full unassign: it
     * releases every partition and may finish terminating the group before a revoke that is
     * still queued reaches on_revoke, which must then leave librdkafka alone. */
    if (c->closing)
        c->close_released = 1;
    if (is_cooperative(c))
        e = rd_kafka_incremental_assign(c->rk, parts);
    else
        err = rd_kafka_assign(c->rk, parts);
    if (e) {
        wxg_log(WXG_LOG_ERROR, "assign_error", WXG_LS("kafka_err", rd_kafka_error_name(e)));
        rd_kafka_error_destroy(e);
    } else if (err) {
        wxg_log(WXG_LOG_ERROR, "assign_error", WXG_LS("kafka_err", rd_kafka_err2name(err)));
    }
    /* librdkafka keeps an application pause across re-assignment, and a fresh assignment must
     * honour the pool's state at once: decide for the new partitions now. */
    backlog_update(c);
    int global = c->stopping || c->backlog_full;
    /* Not while closing: librdkafka 2.0.2 turns an assign during close into a full unassign,
     * and pausing a partition it has already dropped waits for ever (see on_revoke). */
    if (global && v && !c->closing)
        set_paused(c, v, nv, 1);
    free(v);
    count_parts(c);
    atomic_store(&c->joined, 1);
    wxg_log(WXG_LOG_INFO, "assigned", WXG_LI("partitions", parts->cnt),
            WXG_LS("protocol", rd_kafka_rebalance_protocol(c->rk)), WXG_LB("paused", global));
}

/* Revoke, step 2: lets running and queued work of the partitions finish within the budget
 * (not when the assignment is already lost: someone else owns it), then cancels the rest.
 * Returns 1 when the budget ran out. */
static int revoke_drain(wxg_consumer_t *c, cpart *const *v, size_t nv, int lost)
{
    int64_t deadline = wxg__mono_ms() + c->conf.drain_timeout_ms;
    /* A revoke served while the consumer stops gets what is left of the stop's budget, not a
     * budget of its own: the stop as a whole ends within consumer.drain.timeout.ms. */
    if (c->stop_deadline && c->stop_deadline < deadline)
        deadline = c->stop_deadline;
    int timed_out = 0;
    for (size_t i = 0; c->pool && !lost && !c->closing && i < nv; i++) {
        int64_t left = deadline - wxg__mono_ms();
        if (left < 0)
            left = 0;
        if (wxg__pool_wait_tag(c->pool, v[i]->tag, left) != 0)
            timed_out = 1;
    }
    for (size_t i = 0; c->pool && i < nv; i++)
        wxg__pool_cancel(c->pool, v[i]->tag);
    if (timed_out)
        wxg_counter_inc(c->m.revoke_timeouts);
    return timed_out;
}

/* Revoke, step 3: commits the partitions' watermarks synchronously while they are still ours,
 * within the commit budget. */
static rd_kafka_resp_err_t revoke_commit(wxg_consumer_t *c, cpart *const *v, size_t nv)
{
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)nv);
    for (size_t i = 0; l && i < nv; i++) {
        int64_t off;
        if (part_committable(v[i], &off) == 0)
            rd_kafka_topic_partition_list_add(l, v[i]->topic, v[i]->partition)->offset = off;
    }
    if (l && l->cnt > 0) {
        err = commit_bounded(c, l);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
            wxg_counter_inc(c->m.commit_failures);
            wxg_log(WXG_LOG_WARN, "revoke_commit_failed",
                    WXG_LS("kafka_err", rd_kafka_err2name(err)));
        }
    }
    rd_kafka_topic_partition_list_destroy(l);
    return err;
}

/* The group has dropped this member: a commit in its name can never succeed, and librdkafka
 * (2.0.2) answers such a commit by treating the assignment as lost and rejoining, while the
 * partitions may no longer be served. */
static int member_gone(rd_kafka_resp_err_t err)
{
    return err == RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID ||
           err == RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION;
}

/* ---- librdkafka calls with a bound (poll thread) ----
 *
 * rd_kafka_assign(), rd_kafka_incremental_unassign() and rd_kafka_resume_partitions() are
 * requests to librdkafka's own threads that wait for the answer without a limit, and
 * librdkafka 2.0.2 can leave such a request unanswered: a group that terminates (during the
 * close, after a commit refused with UNKNOWN_MEMBER_ID made it treat the assignment as lost)
 * purges the requests still queued for it, and a resume of a partition nobody serves any more
 * waits for a reply that never comes. A replica whose revoke made such a call never got past
 * it, and its stop never ended. So the revoke makes these calls on a thread of its own and
 * waits for it at most the commit budget (abandon_kafka() says what happens when no answer came).
 */
enum { KCALL_UNASSIGN, KCALL_INCR_UNASSIGN, KCALL_RESUME };

typedef struct kcall {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the poll thread's and the call thread's */
    int done;
    int kind;
    rd_kafka_t *rk;
    rd_kafka_topic_partition_list_t *parts; /* a copy (NULL for KCALL_UNASSIGN); owned */
    char err[64];                           /* the call's error name, "" when none */
} kcall;

static void kcall_unref(kcall *k)
{
    pthread_mutex_lock(&k->mu);
    int last = --k->refs == 0;
    pthread_mutex_unlock(&k->mu);
    if (!last)
        return;
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    if (k->parts)
        rd_kafka_topic_partition_list_destroy(k->parts);
    free(k);
}

static void *kcall_main(void *arg)
{
    kcall *k = arg;
    const char *name = NULL;
    rd_kafka_error_t *e = NULL;
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    if (k->kind == KCALL_INCR_UNASSIGN) {
        e = rd_kafka_incremental_unassign(k->rk, k->parts);
        if (e)
            name = rd_kafka_error_name(e);
    } else if (k->kind == KCALL_RESUME) {
        err = rd_kafka_resume_partitions(k->rk, k->parts);
    } else {
        err = rd_kafka_assign(k->rk, NULL);
    }
    if (err)
        name = rd_kafka_err2name(err);
    pthread_mutex_lock(&k->mu);
    if (name)
        snprintf(k->err, sizeof k->err, "%s", name);
    k->done = 1;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    if (e)
        rd_kafka_error_destroy(e);
    kcall_unref(k);
    return NULL;
}

/* Makes the call on its own thread and waits at most budget_ms. `parts` is copied (NULL for
 * KCALL_UNASSIGN). Returns 0 when the call returned (its error, if any, by name in err), -1
 * when it did not: it is left running, and the handle must then never be destroyed. */
static int kcall_bounded(wxg_consumer_t *c, int kind, const rd_kafka_topic_partition_list_t *parts,
                         int64_t budget_ms, char *err, size_t err_size)
{
    err[0] = '\0';
    kcall *k = calloc(1, sizeof *k);
    if (!k)
        return -1;
    pthread_condattr_t ca;
    int ok = pthread_condattr_init(&ca) == 0;
    if (ok) {
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
             pthread_cond_init(&k->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (!ok || pthread_mutex_init(&k->mu, NULL) != 0) {
        if (ok)
            pthread_cond_destroy(&k->cv);
        free(k);
        return -1;
    }
    k->rk = c->rk;
    k->kind = kind;
    k->refs = 2;
    k->parts = parts ? rd_kafka_topic_partition_list_copy(parts) : NULL;
    pthread_t th;
    pthread_attr_t attr;
    int started = pthread_attr_init(&attr) == 0;
    if (started) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&th, &attr, kcall_main, k) == 0;
        pthread_attr_destroy(&attr);
    }
    if (!started) {
        /* No thread: make the call here, unbounded, as before. */
        k->refs = 2;
        kcall_main(k);
    } else {
        struct timespec ts = wxg__mono_after(budget_ms);
        pthread_mutex_lock(&k->mu);
        while (!k->done) {
            if (pthread_cond_timedwait(&k->cv, &k->mu, &ts) == ETIMEDOUT)
                break;
        }
        pthread_mutex_unlock(&k->mu);
    }
    pthread_mutex_lock(&k->mu);
    int done = k->done;
    snprintf(err, err_size, "%s", k->err);
    pthread_mutex_unlock(&k->mu);
    kcall_unref(k); /* a call still running frees it when it returns, if ever */
    return done ? 0 : -1;
}

/* A bounded call got no answer: librdkafka's state is no longer known, so the handle is
 * abandoned as after a close timeout (close_bounded, wxg_consumer_destroy) and the replica
 * stops. The watermarks were committed or not before this step, never past unfinished work,
 * and the process exits instead of waiting for ever. Outside a stop that is a failure (the
 * exit status says so, and a supervisor restarts the replica); during a stop it is only the
 * stop ending within its budget. */
static void abandon_kafka(wxg_consumer_t *c, const char *event)
{
    c->kafka_stuck = 1;
    c->close_timed_out = 1; /* the handle is abandoned, never destroyed */
    int asked = c->stopping || c->closing || atomic_load(&c->stop_requested);
    if (!asked) {
        int expected = 0;
        atomic_compare_exchange_strong(&c->fatal, &expected, WXG_EKAFKA);
    }
    wxg_log(asked ? WXG_LOG_WARN : WXG_LOG_ERROR, event,
            WXG_LI("budget_ms", c->conf.commit_timeout_ms), WXG_LB("member_lost", c->member_lost),
            WXG_LS("action", asked ? "stopping" : "restart"));
}

/* Revoke, step 4: resumes what we paused (so a later assignment starts clean), then fences:
 * completions arriving from now on are stale. Not while stopping or closing: any later
 * assignment is paused at once anyway, and librdkafka 2.0.2 may already have dropped these
 * partitions (an assign served during close becomes a full unassign, and a revoke during the
 * drain can follow a lost membership: UNKNOWN_MEMBER_ID on its commit);
 * rd_kafka_resume_partitions() then waits without limit for a reply from a partition nobody
 * serves any more, and the stop never returns. A stop asked while this revoke ran counts too:
 * the poll thread is still inside the rebalance callback when the signal comes, and only sets
 * `stopping` once it is back in wxg_consumer_run. Otherwise the resume is bounded by the commit
 * budget (kcall_bounded). */
static void revoke_fence(wxg_consumer_t *c, cpart *const *v, size_t nv)
{
    int skip = c->closing || c->stopping || atomic_load(&c->stop_requested);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)nv + 1);
    for (size_t i = 0; l && !skip && i < nv; i++) {
        if (v[i]->paused)
            rd_kafka_topic_partition_list_add(l, v[i]->topic, v[i]->partition);
    }
    /* Also after a lost membership (member_lost): such a resume usually returns, and one
     * skipped would leave the partitions paused inside librdkafka for a later assignment. */
    if (l && l->cnt > 0) {
        char err[64];
        if (kcall_bounded(c, KCALL_RESUME, l, c->conf.commit_timeout_ms, err, sizeof err) != 0)
            abandon_kafka(c, "resume_timeout");
        else
            wxg_log(WXG_LOG_INFO, "resume", WXG_LI("partitions", l->cnt),
                    WXG_LS("reason", "revoked"), WXG_LS("kafka_err", err[0] ? err : NULL));
    }
    if (l)
        rd_kafka_topic_partition_list_destroy(l);
    for (size_t i = 0; i < nv; i++) {
        v[i]->assigned = 0;
        v[i]->paused = 0;
        wxg_gauge_clear(v[i]->lag);
        pthread_mutex_lock(&v[i]->mu);
        wxg__offsets_revoke(v[i]->wm);
        v[i]->c2c_head = v[i]->c2c_len = 0;
        pthread_mutex_unlock(&v[i]->mu);
    }
}

/* Revoke, step 5: hands the partitions back to librdkafka, within the commit budget (see
 * kcall_bounded). */
static void revoke_release(wxg_consumer_t *c, rd_kafka_topic_partition_list_t *parts)
{
    char err[64];
    int coop = is_cooperative(c);
    if (kcall_bounded(c, coop ? KCALL_INCR_UNASSIGN : KCALL_UNASSIGN, coop ? parts : NULL,
                      c->conf.commit_timeout_ms, err, sizeof err) != 0)
        abandon_kafka(c, "release_timeout");
    else if (err[0])
        wxg_log(WXG_LOG_WARN, "unassign_error", WXG_LS("kafka_err", err));
}

/* A revoke drains first, then fences, in five steps. */
static void on_revoke(wxg_consumer_t *c, rd_kafka_topic_partition_list_t *parts)
{
    int lost = rd_kafka_assignment_lost(c->rk);
    /* Already released by an assign during close (see on_assign): only our own bookkeeping is
     * left. A commit, resume or unassign now would be a request to a group that may have
     * terminated, and such a request is never answered. The watermarks were committed just
     * before the close, after the pool had stopped. */
    int released = c->closing && c->close_released;
    /* A revoke's drain can take its whole budget: one line says when it began. */
    wxg_log(WXG_LOG_INFO, "revoking", WXG_LI("partitions", parts->cnt), WXG_LB("lost", lost),
            WXG_LB("stopping", c->stopping || atomic_load(&c->stop_requested)));
    size_t n = (size_t)parts->cnt;
    cpart **v = calloc(n + 1, sizeof *v);
    size_t nv = 0;
    for (size_t i = 0; v && i < n; i++) {
        cpart *p = part_find(c, parts->elems[i].topic, parts->elems[i].partition);
        if (p && p->assigned)
            v[nv++] = p;
    }
    /* 1. Stop dispatching: drop what never reached the pool, and work that waits for a lease
     *    or a retry backoff before its plugins (it cannot finish within the budget). Work
     *    whose plugins ran and that only waits to retry its marker stays for the drain
     *    (worker_keep_delayed). */
    for (size_t i = 0; i < nv; i++) {
        drop_pending_of(c, v[i]);
        if (c->pool)
            wxg__pool_cancel_delayed(c->pool, v[i]->tag);
    }
    /* 2. Drain. */
    int timed_out = revoke_drain(c, v, nv, lost);
    /* 3. Commit. Not when the final commit found the coordinator silent: this revoke is the
     *    close's, the watermarks are the ones that commit already carried, and waiting again
     *    would only lengthen the stop. */
    if (!lost && !released && !c->coord_silent && nv > 0 && member_gone(revoke_commit(c, v, nv)))
        c->member_lost = 1;
    /* 4. Resume and fence. */
    revoke_fence(c, v, nv);
    free(v);
    /* 5. Release them, unless librdkafka has released them already. */
    if (!released)
        revoke_release(c, parts);
    count_parts(c);
    wxg_log(WXG_LOG_INFO, "revoked", WXG_LI("partitions", parts->cnt), WXG_LB("lost", lost),
            WXG_LB("drain_timed_out", timed_out), WXG_LB("released", released));
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    wxg_consumer_t *c = opaque;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        wxg_counter_inc(c->m.assigns);
        on_assign(c, parts);
    } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        wxg_counter_inc(c->m.revokes);
        on_revoke(c, parts);
    } else {
        wxg_log(WXG_LOG_ERROR, "rebalance_error", WXG_LS("kafka_err", rd_kafka_err2name(err)));
        rd_kafka_assign(rk, NULL);
    }
}

/* ---- dispatch (poll thread) ---- */

static uint64_t conv_hash(const wxg_msg_view_t *m)
{
    uint64_t h = wxg__pool_hash(m->account, strlen(m->account));
    const char *conv = m->conversation && m->conversation[0] ? m->conversation : m->key;
    return h ^ (wxg__pool_hash(conv, strlen(conv)) * 0x9e3779b97f4a7c15ULL);
}

static void flush_pending(wxg_consumer_t *c)
{
    /* Nothing more fetched: the last message in hand tells the pool to send partial batches
     * now rather than after the batch delay, so batching adds latency only when more work is
     * coming. */
    int idle = c->pending_head && rd_kafka_queue_length(c->rkq) == 0;
    while (c->pending_head) {
        job *j = c->pending_head;
        /* Once submitted, a worker may finish the job and free its record at any moment:
         * read what we need from it first. */
        job *next = j->pnext;
        int rc = idle && !next ? wxg__pool_submit_last(c->pool, j->conv, j->r->part->tag, &j->it)
                               : wxg__pool_submit(c->pool, j->conv, j->r->part->tag, &j->it);
        if (rc == WXG_EBUSY)
            break;
        c->pending_head = next;
        if (!c->pending_head)
            c->pending_tail = NULL;
        c->npending--;
        if (rc != 0) {
            /* Closed or out of memory: the record stays unfinished (never committed past). */
            worker_cancelled(c, j);
        }
    }
    atomic_store(&c->pending_n, c->npending);
}

/* Fills what the pipeline sees of the record's Kafka message (pipeline_int.h). */
static void rec_view(rec *r, const cpart *p)
{
    rd_kafka_message_t *m = r->rkm;
    rd_kafka_timestamp_type_t tst;
    r->view = (wxg__pl_record_t){.topic = p->topic,
                                 .partition = p->partition,
                                 .offset = m->offset,
                                 .timestamp_ms = rd_kafka_message_timestamp(m, &tst),
                                 .key = m->key,
                                 .key_len = m->key_len,
                                 .value = m->payload,
                                 .value_len = m->len,
                                 .headers = rec_headers,
                                 .headers_src = m};
}

/* Makes the record's jobs and puts them on the pending list: one per decoded message, or one
 * that parks a record that did not decode (`err` says why). A decode failure that is not the
 * record's fault (its class is not poison: out of memory) parks nothing: the record is
 * cancelled, so its offset stays unfinished, and a fatal class stops the consumer. */
static void rec_jobs(wxg_consumer_t *c, rec *r, const char *err)
{
    const wxg__pl_record_t *v = &r->view;
    if (r->decode_err != 0) {
        job *j = &r->jobs[0];
        j->r = r;
        j->conv = wxg__pool_hash(v->topic, strlen(v->topic)) ^ (uint64_t)v->partition;
        if (wxg__pipeline_item_park(&j->it, &r->view, r->decode_err, err) != 0) {
            wxg_log(WXG_LOG_ERROR, "decode_failed", WXG_LS("topic", v->topic),
                    WXG_LI("partition", v->partition), WXG_LI("offset", v->offset),
                    WXG_LERR(r->decode_err),
                    WXG_LS("class", wxg_err_class_name(wxg_err_class(r->decode_err))),
                    WXG_LS("reason", err));
            stop_if_fatal(c, r->decode_err);
            worker_cancelled(c, j);
            return;
        }
        wxg_counter_inc(c->m.decode_errors);
        r->decode_reason = strdup(err);
        wxg_log(WXG_LOG_WARN, "decode_error", WXG_LS("topic", v->topic),
                WXG_LI("partition", v->partition), WXG_LI("offset", v->offset),
                WXG_LERR(r->decode_err), WXG_LS("reason", err));
    } else {
        atomic_fetch_add(&c->messages, r->njobs);
        for (size_t i = 0; i < r->njobs; i++) {
            job *j = &r->jobs[i];
            j->r = r;
            wxg__pipeline_item_init(&j->it, &r->view, wxg_batch_msg(r->batch, i));
            j->conv = conv_hash(j->it.msg);
        }
    }
    for (size_t i = 0; i < r->njobs; i++) {
        job *j = &r->jobs[i];
        if (c->pending_tail)
            c->pending_tail->pnext = j;
        else
            c->pending_head = j;
        c->pending_tail = j;
        c->npending++;
    }
}

static void dispatch(wxg_consumer_t *c, rd_kafka_message_t *m)
{
    const char *topic = rd_kafka_topic_name(m->rkt);
    cpart *p = part_find(c, topic, m->partition);
    if (!p || !p->assigned || c->stopping) {
        rd_kafka_message_destroy(m);
        return;
    }
    if (m->offset + 1 > p->next)
        p->next = m->offset + 1;
    wxg__offsets_ticket_t ticket;
    pthread_mutex_lock(&p->mu);
    int rc = wxg__offsets_dispatch(p->wm, m->offset, &ticket);
    pthread_mutex_unlock(&p->mu);
    if (rc != 0) {
        /* A re-fetch of something already in hand, or not ours: nothing to do. */
        rd_kafka_message_destroy(m);
        return;
    }
    wxg_decode_opts_t opts = {.format = c->conf.format,
                              .max_bytes = c->conf.max_message_bytes,
                              .max_depth = 0,
                              .cache = c->decode_cache};
    char err[256] = "";
    wxg_batch_t *batch = NULL;
    /* A record ingest wrote states how it decoded and for which account: decode it so, never by
     * detecting again, or a body ingest checked as one format would run here as another. */
    const void *sf = NULL, *sa = NULL;
    size_t sf_len = 0, sa_len = 0;
    rd_kafka_headers_t *hdrs = NULL;
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR && hdrs != NULL) {
        /* A header with a null value is present all the same: as an empty text. */
        if (rd_kafka_header_get_last(hdrs, WXG_INGEST_HDR_FORMAT, &sf, &sf_len) ==
                RD_KAFKA_RESP_ERR_NO_ERROR &&
            sf == NULL)
            sf = "";
        if (rd_kafka_header_get_last(hdrs, WXG_INGEST_HDR_ACCOUNT, &sa, &sa_len) ==
                RD_KAFKA_RESP_ERR_NO_ERROR &&
            sa == NULL)
            sa = "";
    }
    int derr = wxg_ingest_record_decode(m->payload, m->len, sf, sf_len, sa, sa_len, &opts, &batch,
                                        err, sizeof err);
    size_t nmsg = derr == 0 ? wxg_batch_count(batch) : 1;
    rec *r = nmsg <= 1 ? wxg__recycle_pop(&c->spare_recs, rec_size(1)) : NULL;
    if (r)
        memset(r, 0, rec_size(1));
    else
        r = calloc(1, rec_size(nmsg));
    if (!r) {
        /* Leave the offset unfinished: the watermark stops here and nothing is lost. */
        stop_if_fatal(c, WXG_ENOMEM);
        wxg_batch_free(batch);
        rd_kafka_message_destroy(m);
        return;
    }
    r->rkm = m;
    rec_view(r, p);
    r->dispatched_us = wxg__mono_us();
    r->batch = batch;
    r->part = p;
    r->ticket = ticket;
    r->decode_err = derr;
    r->njobs = nmsg;
    atomic_store(&r->refs, (int)nmsg + 1);
    pthread_mutex_lock(&p->mu);
    r->lprev = p->tail;
    if (p->tail)
        p->tail->lnext = r;
    else
        p->head = r;
    p->tail = r;
    pthread_mutex_unlock(&p->mu);
    rec_jobs(c, r, err);
    /* The poll thread's own reference: an empty batch finishes here. */
    rec_release(c, r);
    flush_pending(c);
}

static void handle_message(wxg_consumer_t *c, rd_kafka_message_t *m)
{
    if (m->err) {
        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            wxg_log(WXG_LOG_WARN, "consume_error", WXG_LS("kafka_err", rd_kafka_err2name(m->err)),
                    WXG_LS("reason", rd_kafka_message_errstr(m)));
            char fe[256];
            if (m->err == RD_KAFKA_RESP_ERR__FATAL &&
                rd_kafka_fatal_error(c->rk, fe, sizeof fe) != RD_KAFKA_RESP_ERR_NO_ERROR)
                stop_if_fatal(c, WXG_ESTATE); /* as lib/dlq.c maps librdkafka's fatal */
        }
        rd_kafka_message_destroy(m);
        return;
    }
    wxg_counter_inc(c->m.records);
    dispatch(c, m);
}

/* ---- periodic work ---- */

/* The position of a partition with nothing dispatched in this assignment: librdkafka's local
 * fetch position (no broker round trip), or -1 when it has none yet. */
static int64_t local_position(wxg_consumer_t *c, const cpart *p)
{
    int64_t pos = -1;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    if (!l)
        return -1;
    rd_kafka_topic_partition_list_add(l, p->topic, p->partition);
    if (rd_kafka_position(c->rk, l) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        l->elems[0].err == RD_KAFKA_RESP_ERR_NO_ERROR && l->elems[0].offset >= 0)
        pos = l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    return pos;
}

/* Lag per assigned partition from the high watermark librdkafka cached from its last fetch
 * response (rd_kafka_get_watermark_offsets never asks the broker, so the poll thread never
 * waits): high watermark minus the finished watermark. */
static void update_lag(wxg_consumer_t *c, int log_it)
{
    int64_t total = 0;
    for (size_t i = 0; i < c->nparts; i++) {
        cpart *p = c->parts[i];
        if (!p->assigned)
            continue;
        int64_t lo = 0, hi = 0, w = 0;
        if (rd_kafka_get_watermark_offsets(c->rk, p->topic, p->partition, &lo, &hi) !=
                RD_KAFKA_RESP_ERR_NO_ERROR ||
            hi < 0)
            continue;
        if (part_committable(p, &w) != 0) {
            w = local_position(c, p);
            if (w < 0)
                continue;
        }
        int64_t lag = hi > w ? hi - w : 0;
        total += lag;
        wxg_gauge_set(p->lag, (double)lag);
        if (log_it)
            wxg_log(WXG_LOG_INFO, "lag", WXG_LS("topic", p->topic),
                    WXG_LI("partition", p->partition), WXG_LI("watermark", w), WXG_LI("high", hi),
                    WXG_LI("lag", lag));
    }
    atomic_store(&c->lag, total);
}

static void log_stats(wxg_consumer_t *c)
{
    wxg_consumer_stats_t s;
    wxg_consumer_stats(c, &s);
    wxg_log(WXG_LOG_INFO, "stats", WXG_LU("received", s.received), WXG_LU("messages", s.messages),
            WXG_LU("duplicates", s.duplicates), WXG_LU("busy_retries", s.busy),
            WXG_LU("processed", s.processed), WXG_LU("retried", s.retried),
            WXG_LU("dead_lettered", s.dead_lettered), WXG_LU("decode_errors", s.decode_errors),
            WXG_LU("lease_lost", s.lease_lost), WXG_LU("offsets_committed", s.offsets_committed),
            WXG_LU("commit_errors", s.commit_errors), WXG_LU("rebalances", s.rebalances),
            WXG_LU("paused_partitions", s.paused), WXG_LU("assigned", s.assigned),
            WXG_LU("in_flight", s.in_flight), WXG_LI("oldest_ms", s.oldest_age_ms),
            WXG_LI("lag", s.lag), WXG_LU("stale_finishes", s.stale_finishes),
            WXG_LU("store_state", s.store_state), WXG_LU("guard_errors", s.guard_errors),
            WXG_LU("dlq_errors", s.dlq_errors), WXG_LU("stalled", s.stalled),
            WXG_LU("done_cache_hits", s.done_cache_hits));
}

/* The pool's gauges, read here on the poll thread so that neither a scrape nor
 * wxg_consumer_stats() ever touches the pool (which shutdown destroys). */
static void refresh_gauges(wxg_consumer_t *c)
{
    wxg__pool_stats_t ps;
    memset(&ps, 0, sizeof ps);
    if (c->pool)
        wxg__pool_stats(c->pool, &ps);
    wxg_gauge_set(c->m.inflight, (double)(ps.jobs + c->npending));
    wxg_gauge_set(c->m.queue, (double)(ps.jobs - ps.running));
    if (c->guard_conf.done_cache && !c->guard_conf.naive) {
        wxg__donecache_stats_t cs;
        wxg__donecache_stats(c->guard_conf.done_cache, &cs);
        wxg_gauge_set(c->m.cache_entries, (double)cs.used);
        wxg_counter_add(c->m.cache_evictions, cs.evictions - c->cache_evictions_seen);
        c->cache_evictions_seen = cs.evictions;
    }
    wxg_gauge_set(c->m.oldest, (double)ps.oldest_age_us / 1e6);
    atomic_store(&c->batches, ps.batches);
    atomic_store(&c->batched_jobs, ps.batched_jobs);
}

/* Whether Redis counts as unreachable, for /readyz and wxg_redis_reachable: the latest contact
 * decides, whichever came last of a worker's guard call and the watchdog's renewal or probe.
 * Returns 0 when reachable, else the WXG_E* code of the latest failure, with *probe set when
 * the watchdog saw it. A failure older than REDIS_DOWN_HOLD_MS with nothing since no longer
 * counts; with the probe on, an outage refreshes its failure every probe interval, so this
 * only lets an idle replica with the probe off become ready again after a blip. Any thread. */
static int redis_down(wxg_consumer_t *c, int *probe)
{
    int64_t ok = atomic_load(&c->health.ok_ms), bad = atomic_load(&c->health.err_ms);
    int code = atomic_load(&c->health.err);
    int64_t wok = 0, wbad = 0;
    int wcode = wxg_guard_watchdog_health(c->wd, &wok, &wbad);
    *probe = 0;
    if (wok > ok)
        ok = wok;
    if (wbad > bad) {
        bad = wbad;
        code = wcode;
        *probe = 1;
    }
    if (bad > ok && wxg__mono_ms() - bad < REDIS_DOWN_HOLD_MS)
        return code ? code : WXG_ECONN;
    return 0;
}

/* The guard's text for the failure redis_down() reported (it names the node in cluster mode). */
static void redis_down_text(wxg_consumer_t *c, int probe, char *buf, size_t size)
{
    if (probe)
        wxg_guard_watchdog_last_error(c->wd, buf, size);
    else
        wxg__pipeline_health_error(&c->health, buf, size);
}

/* Why Redis counts as down, in words, into buf: which guard call failed and how; for a
 * failed complete, that effects which already ran wait for their DONE marker (and their
 * offsets for it). Returns the error code, 0 (and "") while Redis answers. */
static int redis_why(wxg_consumer_t *c, char *buf, size_t size)
{
    static const char *const ops[WXG__PL_OP_N] = {"claim", "complete", "fail", "plugin_done"};
    int probe = 0, down = redis_down(c, &probe);
    buf[0] = '\0';
    if (!down)
        return 0;
    /* A failed complete that is still current is named even when the watchdog failed later:
     * it is what holds messages (and their offsets) back. */
    int64_t ok = atomic_load(&c->health.ok_ms), bad = atomic_load(&c->health.err_ms);
    if (probe && atomic_load(&c->health.err_op) == WXG__PL_OP_COMPLETE && bad > ok &&
        wxg__mono_ms() - bad < REDIS_DOWN_HOLD_MS) {
        probe = 0;
        down = atomic_load(&c->health.err) ? atomic_load(&c->health.err) : WXG_ECONN;
    }
    char why[256];
    redis_down_text(c, probe, why, sizeof why);
    int op = atomic_load(&c->health.err_op);
    const char *what = probe                          ? "probe or lease renewal"
                       : op >= 0 && op < WXG__PL_OP_N ? ops[op]
                                                      : "guard call";
    snprintf(buf, size, "the latest %s failed (%s%s%s)%s", what, wxg_strerror(down),
             why[0] ? ": " : "", why,
             !probe && op == WXG__PL_OP_COMPLETE
                 ? "; effects that already ran wait for their DONE marker, retried until "
                   "Redis answers"
                 : "");
    return down;
}

/* Keeps wxg_redis_reachable current and logs each change, so that an outage seen only by the
 * probe of an idle replica leaves a trace too (poll thread). A fatal error seen by the watchdog
 * (its reconnect found the layout stamp changed, or its credentials refused) stops the consumer
 * as a worker's would: an idle replica would otherwise stay up, unable to process anything. */
static void check_redis(wxg_consumer_t *c)
{
    int probe = 0, down = redis_down(c, &probe);
    if (down && probe && stop_if_fatal(c, down))
        wxg_log(WXG_LOG_ERROR, "pipeline_fatal", WXG_LS("op", "watchdog"), WXG_LERR(down),
                WXG_LS("class", wxg_err_class_name(WXG_CLASS_FATAL)),
                WXG_LS("reason", wxg_strerror(down)));
    if (down && !c->redis_down_logged) {
        char why[256];
        redis_down_text(c, probe, why, sizeof why);
        wxg_log(WXG_LOG_WARN, "redis_unreachable", WXG_LS("error", wxg_strerror(down)),
                WXG_LS("seen_by", probe ? "watchdog" : "worker"), WXG_LS("reason", why));
    } else if (!down && c->redis_down_logged)
        wxg_log(WXG_LOG_INFO, "redis_reachable");
    c->redis_down_logged = down != 0;
    wxg_gauge_set(c->m.redis_up, down ? 0 : 1);
}

/* The stall detector (poll thread). A partition is stalled while its oldest record in flight,
 * or its backpressure pause, is older than stall_timeout_ms. Entering a stall (or a stall
 * moving on to another record) logs one line with the partition, offset and key; leaving it
 * logs one more. /readyz reports the first stalled partition. */
static void check_stalls(wxg_consumer_t *c)
{
    int64_t limit = c->conf.stall_timeout_ms;
    int64_t now_us = wxg__mono_us(), now = now_us / 1000;
    size_t nstalled = 0;
    char reason[sizeof c->stall_reason] = "";
    int redis_checked = 0, redis_down_now = 0;
    char redis_reason[384];
    for (size_t i = 0; i < c->nparts; i++) {
        cpart *p = c->parts[i];
        int stalled = 0;
        int64_t age_ms = 0, paused_ms = 0, offset = -1;
        char key[KEY_LOG_MAX] = "";
        if (p->assigned && limit > 0) {
            pthread_mutex_lock(&p->mu);
            rec *h = p->head;
            if (h) {
                age_ms = (now_us - h->dispatched_us) / 1000;
                offset = h->rkm->offset;
                for (size_t k = 0; k < h->njobs; k++) {
                    const wxg__pl_item_t *it = &h->jobs[k].it;
                    if (it->msg && !atomic_load(&it->done)) {
                        snprintf(key, sizeof key, "%s", it->msg->key);
                        break;
                    }
                }
            }
            pthread_mutex_unlock(&p->mu);
            paused_ms = p->paused ? now - p->paused_since_ms : 0;
            stalled = age_ms > limit || paused_ms > limit;
            if (stalled && offset < 0 && part_committable(p, &offset) != 0)
                offset = local_position(c, p);
        }
        if (stalled) {
            /* Say why when Redis is the cause: the message cannot complete, whatever its
             * plugins did. */
            if (!redis_checked) {
                redis_checked = 1;
                redis_down_now = redis_why(c, redis_reason, sizeof redis_reason);
            }
            if (!p->stalled || p->stalled_offset != offset)
                wxg_log(WXG_LOG_WARN, "stalled", WXG_LS("topic", p->topic),
                        WXG_LI("partition", p->partition), WXG_LI("offset", offset),
                        WXG_LID("key", key[0] ? key : NULL), WXG_LI("in_flight_ms", age_ms),
                        WXG_LI("paused_ms", paused_ms), WXG_LI("limit_ms", limit),
                        WXG_LS("cause", redis_down_now   ? "redis_unreachable"
                                        : age_ms > limit ? "in_flight"
                                                         : "paused"));
            if (nstalled == 0)
                snprintf(reason, sizeof reason,
                         "stalled: %s partition %d offset %lld (%s for %lld ms, limit %lld ms)%s%s",
                         p->topic, (int)p->partition, (long long)offset,
                         age_ms > limit ? "in flight" : "paused",
                         (long long)(age_ms > limit ? age_ms : paused_ms), (long long)limit,
                         redis_down_now ? "; redis: " : "", redis_down_now ? redis_reason : "");
            nstalled++;
            p->stalled = 1;
            p->stalled_offset = offset;
        } else if (p->stalled) {
            wxg_log(WXG_LOG_INFO, "stall_cleared", WXG_LS("topic", p->topic),
                    WXG_LI("partition", p->partition), WXG_LI("offset", p->stalled_offset),
                    WXG_LB("assigned", p->assigned));
            p->stalled = 0;
        }
    }
    if (nstalled > 1) {
        size_t len = strlen(reason);
        snprintf(reason + len, sizeof reason - len, " and %zu more", nstalled - 1);
    }
    pthread_mutex_lock(&c->ready_mu);
    memcpy(c->stall_reason, reason, sizeof reason);
    atomic_store(&c->stalled_n, nstalled);
    pthread_mutex_unlock(&c->ready_mu);
    wxg_gauge_set(c->m.stalled, nstalled > 0 ? 1 : 0);
}

int wxg_consumer_ready(wxg_consumer_t *c, char *reason, size_t reason_size)
{
    char tmp[8];
    if (!reason || reason_size == 0) {
        reason = tmp;
        reason_size = sizeof tmp;
    }
    if (!c) {
        snprintf(reason, reason_size, "no consumer");
        return 0;
    }
    if (atomic_load(&c->stop_requested) || atomic_load(&c->fatal)) {
        snprintf(reason, reason_size, "stopping");
        return 0;
    }
    if (atomic_load(&c->stalled_n) > 0) {
        pthread_mutex_lock(&c->ready_mu);
        snprintf(reason, reason_size, "%s", c->stall_reason);
        pthread_mutex_unlock(&c->ready_mu);
        return 0;
    }
    if (!atomic_load(&c->joined)) {
        snprintf(reason, reason_size, "waiting for a partition assignment");
        return 0;
    }
    int up = wxg_producer_brokers_up(wxg_dlq_producer(c->conf.dlq));
    if (up <= 0) {
        snprintf(reason, reason_size, "%s",
                 up < 0 ? "kafka: no connection state yet" : "kafka: no broker reachable");
        return 0;
    }
    char why[384];
    if (redis_why(c, why, sizeof why)) {
        snprintf(reason, reason_size, "redis: %s", why);
        return 0;
    }
    size_t n = (size_t)wxg_gauge_value(c->m.assigned);
    if (n == 0)
        snprintf(reason, reason_size, "ready: no partition assigned (a spare replica)");
    else
        snprintf(reason, reason_size, "ready: %zu partition%s assigned", n, n == 1 ? "" : "s");
    return 1;
}

/* ---- life cycle ---- */

/* The workers' Redis Cluster counters (0 outside cluster mode). 0, or -1 as below. */
static int metrics_cluster(wxg__pl_metrics_t *pm, wxg_metrics_t *r)
{
    static const char *const redirects = "Redis Cluster redirections the workers' guard calls "
                                         "followed, by type (MOVED, ASK).";
    static const char *const retries = "Commands a Redis Cluster node refused for now and the "
                                       "guard sent again after a pause, by reason.";
    pm->cluster[WXG__PL_CL_MOVED] = wxg_metrics_counter(r, "wxg_guard_cluster_redirects_total",
                                                        redirects, "type", "moved", NULL);
    pm->cluster[WXG__PL_CL_ASK] =
        wxg_metrics_counter(r, "wxg_guard_cluster_redirects_total", redirects, "type", "ask", NULL);
    pm->cluster[WXG__PL_CL_TRYAGAIN] = wxg_metrics_counter(r, "wxg_guard_cluster_retries_total",
                                                           retries, "reason", "tryagain", NULL);
    pm->cluster[WXG__PL_CL_CLUSTERDOWN] = wxg_metrics_counter(
        r, "wxg_guard_cluster_retries_total", retries, "reason", "clusterdown", NULL);
    pm->cluster[WXG__PL_CL_REFRESHES] =
        wxg_metrics_counter(r, "wxg_guard_cluster_map_refreshes_total",
                            "Slot maps the workers' guard handles read from the cluster.", NULL);
    pm->cluster[WXG__PL_CL_NODE_ERRORS] = wxg_metrics_counter(
        r, "wxg_guard_cluster_node_errors_total",
        "Connections of the workers' guard handles to cluster nodes that failed or could not be "
        "made.",
        NULL);
    for (int i = 0; i < WXG__PL_CL_N; i++)
        if (!pm->cluster[i])
            return -1;
    return 0;
}

/* The counters of docs/metrics.md, the pipeline's among them. 0, or -1 when one could not be
 * registered. */
static int metrics_counters(cmetrics *m, wxg_metrics_t *r)
{
    static const char *const outcomes[WXG__PL_CLAIM_N] = {"claimed", "duplicate", "busy"};
    static const char *const ops[WXG__PL_OP_N] = {"claim", "complete", "fail", "plugin_done"};
    m->records =
        wxg_metrics_counter(r, "wxg_consumer_records_total", "Records polled from Kafka.", NULL);
    m->decode_errors =
        wxg_metrics_counter(r, "wxg_decode_errors_total",
                            "Records that did not decode (parked in the dead-letter topic).", NULL);
    for (int i = 0; i < WXG__PL_CLAIM_N; i++) {
        m->pl.claims[i] = wxg_metrics_counter(r, "wxg_guard_claims_total",
                                              "Claim results per message, by outcome.", "outcome",
                                              outcomes[i], NULL);
        if (!m->pl.claims[i])
            return -1;
    }
    m->pl.mismatches =
        wxg_metrics_counter(r, "wxg_guard_payload_mismatches_total",
                            "Duplicates whose payload differs from the one that finished.", NULL);
    for (int i = 0; i < WXG__PL_OP_N; i++) {
        m->pl.guard_errors[i] = wxg_metrics_counter(
            r, "wxg_guard_errors_total",
            "Guard calls that failed as a whole (Redis unreachable, timeout), by operation.", "op",
            ops[i], NULL);
        if (!m->pl.guard_errors[i])
            return -1;
    }
    m->pl.processed =
        wxg_metrics_counter(r, "wxg_messages_processed_total",
                            "Messages completed (DONE written) after their plugins.", NULL);
    m->pl.retries = wxg_metrics_counter(r, "wxg_retries_total",
                                        "Plugin RETRY results that were retried.", NULL);
    m->pl.dlq_writes = wxg_metrics_counter(r, "wxg_dlq_writes_total",
                                           "Records written to the dead-letter topic.", NULL);
    m->pl.dlq_errors = wxg_metrics_counter(r, "wxg_dlq_write_errors_total",
                                           "Dead-letter writes that failed (retried later).", NULL);
    m->pl.lease_lost = wxg_metrics_counter(
        r, "wxg_lease_lost_total",
        "Transitions refused because another owner took the message over.", NULL);
    m->pl.unreadable = wxg_metrics_counter(
        r, "wxg_guard_unreadable_total",
        "Claims answered BUSY because the message's guard state holds a value the layout does "
        "not write; the message waits until an operator clears it (log guard_state_unreadable).",
        NULL);
    m->commits = wxg_metrics_counter(r, "wxg_commits_total", "Successful offset commits.", NULL);
    m->commit_failures =
        wxg_metrics_counter(r, "wxg_commit_failures_total", "Offset commits that failed.", NULL);
    m->assigns = wxg_metrics_counter(r, "wxg_rebalances_total", "Rebalance events, by type.",
                                     "type", "assign", NULL);
    m->revokes = wxg_metrics_counter(r, "wxg_rebalances_total", "Rebalance events, by type.",
                                     "type", "revoke", NULL);
    m->revoke_timeouts = wxg_metrics_counter(r, "wxg_revoke_timeouts_total",
                                             "Revokes whose drain ran out of budget.", NULL);
    if (metrics_cluster(&m->pl, r) != 0)
        return -1;
    return m->records && m->decode_errors && m->pl.mismatches && m->pl.processed && m->pl.retries &&
                   m->pl.dlq_writes && m->pl.dlq_errors && m->pl.lease_lost && m->pl.unreadable &&
                   m->commits && m->commit_failures && m->assigns && m->revokes &&
                   m->revoke_timeouts
               ? 0
               : -1;
}

/* The gauges and histograms, and the near cache's series. 0, or -1 as above. */
static int metrics_gauges(cmetrics *m, wxg_metrics_t *r)
{
    m->inflight = wxg_metrics_gauge(r, "wxg_inflight_messages",
                                    "Messages in the worker pool or waiting to enter it.", NULL);
    m->queue = wxg_metrics_gauge(
        r, "wxg_queue_depth", "Messages in the worker pool that no worker is running now.", NULL);
    m->assigned = wxg_metrics_gauge(r, "wxg_assigned_partitions",
                                    "Partitions assigned to this replica.", NULL);
    m->paused =
        wxg_metrics_gauge(r, "wxg_paused_partitions", "Partitions paused by backpressure.", NULL);
    m->oldest = wxg_metrics_gauge(r, "wxg_oldest_inflight_age_seconds",
                                  "Age of the oldest message in the worker pool.", NULL);
    m->stalled = wxg_metrics_gauge(r, "wxg_stalled",
                                   "1 while the stall detector holds /readyz false.", NULL);
    m->redis_up = wxg_metrics_gauge(r, "wxg_redis_reachable",
                                    "0 while the latest Redis contact (a guard call, or the "
                                    "watchdog's lease renewal or probe) failed, 1 otherwise.",
                                    NULL);
    m->pl.claim_seconds =
        wxg_metrics_histogram(r, "wxg_claim_duration_seconds",
                              "One claim call of the guard (a batch of messages).", NULL, 0, NULL);
    m->c2c_seconds = wxg_metrics_histogram(
        r, "wxg_claim_to_commit_seconds",
        "From a record's first claim to the commit of its offset.", NULL, 0, NULL);
    m->pl.cache_hits = wxg_metrics_counter(
        r, "wxg_guard_done_cache_hits_total",
        "Duplicates answered by the near cache of DONE messages, without a Redis call.", NULL);
    m->cache_entries = wxg_metrics_gauge(
        r, "wxg_guard_done_cache_entries",
        "Slots of the near cache holding an entry (some may have expired).", NULL);
    m->cache_evictions = wxg_metrics_counter(
        r, "wxg_guard_done_cache_evictions_total",
        "Near-cache entries displaced by newer ones before their expiry.", NULL);
    return m->inflight && m->queue && m->assigned && m->paused && m->oldest && m->stalled &&
                   m->redis_up && m->pl.claim_seconds && m->c2c_seconds && m->pl.cache_hits &&
                   m->cache_entries && m->cache_evictions
               ? 0
               : -1;
}

/* Each plugin's results and durations. 0, or -1 as above. */
static int metrics_plugins(wxg_consumer_t *c, wxg_metrics_t *r)
{
    static const char *const results[WXG__PL_RESULT_N] = {"ok", "retry", "fail"};
    wxg__pl_metrics_t *pm = &c->m.pl;
    size_t np = c->nplugins;
    pm->plugin_results = calloc(np * WXG__PL_RESULT_N + 1, sizeof *pm->plugin_results);
    pm->plugin_seconds = calloc(np + 1, sizeof *pm->plugin_seconds);
    if (!pm->plugin_results || !pm->plugin_seconds)
        return -1;
    for (size_t s = 0; s < np; s++) {
        const char *name = wxg_plugin_chain_name(c->conf.chain, s);
        for (int k = 0; k < WXG__PL_RESULT_N; k++) {
            wxg_metric_t **h = &pm->plugin_results[s * WXG__PL_RESULT_N + (size_t)k];
            *h = wxg_metrics_counter(r, "wxg_plugin_results_total",
                                     "Plugin outcomes, by plugin and result.", "plugin", name,
                                     "result", results[k], NULL);
            if (!*h)
                return -1;
        }
        pm->plugin_seconds[s] = wxg_metrics_histogram(r, "wxg_plugin_duration_seconds",
                                                      "One plugin's handling of one message.", NULL,
                                                      0, "plugin", name, NULL);
        if (!pm->plugin_seconds[s])
            return -1;
    }
    return 0;
}

/* Registers every metric of docs/metrics.md. 0, or WXG_ENOMEM with errstr (no memory, or a
 * family of the same name already registered with other labels). */
static int metrics_init(wxg_consumer_t *c, char *errstr, size_t errstr_size)
{
    cmetrics *m = &c->m;
    wxg_metrics_t *r = c->conf.metrics;
    if (!r)
        r = m->own = wxg_metrics_new();
    m->reg = r;
    if (!r || metrics_counters(m, r) != 0 || metrics_gauges(m, r) != 0 ||
        metrics_plugins(c, r) != 0) {
        wxg__errf(errstr, errstr_size,
                  "consumer: cannot register its metrics (out of memory, or a name already "
                  "registered with other labels)");
        return WXG_ENOMEM;
    }
    /* Series that should show 0 from the start rather than appear later. */
    wxg_gauge_set(m->stalled, 0);
    wxg_gauge_set(m->redis_up, 1); /* the workers' and the watchdog's guards just connected */
    return 0;
}

/* The steps of wxg_consumer_new(), in order. Each returns 0, or -1 with errstr filled; on
 * failure wxg_consumer_destroy() frees whatever the steps before it made. */

static int conf_complete(const wxg_consumer_conf_t *conf, char *errstr, size_t errstr_size)
{
    if (!conf || !conf->kafka || !conf->topics || conf->ntopics == 0 || !conf->guard ||
        !conf->chain || !conf->dlq || conf->workers == 0 || conf->queue_capacity == 0 ||
        conf->batch_max == 0 || conf->retry_max == 0) {
        wxg__errf(errstr, errstr_size, "consumer: incomplete configuration");
        return -1;
    }
    return 0;
}

/* Copies the configuration, its names and the guard's, and derives the fixed limits. */
static int copy_conf(wxg_consumer_t *c, const wxg_consumer_conf_t *conf, char *errstr,
                     size_t errstr_size)
{
    c->conf = *conf;
    c->conf.kafka = NULL;
    /* A configuration filled field by field rather than from wxg_consumer_conf_init() may
     * leave this new field 0, which would abandon every synchronous commit at once. */
    if (c->conf.commit_timeout_ms <= 0)
        c->conf.commit_timeout_ms = 5000;
    c->guard_conf = *conf->guard;
    c->nplugins = wxg_plugin_chain_count(conf->chain);
    c->window_limit = conf->queue_capacity * 4 < 10000 ? 10000 : conf->queue_capacity * 4;
    c->backlog_high = conf->queue_capacity;
    c->backlog_low = conf->queue_capacity / 2;
    c->topics = calloc(conf->ntopics, sizeof *c->topics);
    c->group_id = strdup(conf->group_id ? conf->group_id : "");
    if (!c->topics || !c->group_id)
        goto nomem;
    for (size_t i = 0; i < conf->ntopics; i++) {
        c->topics[i] = strdup(conf->topics[i]);
        if (!c->topics[i])
            goto nomem;
    }
    c->conf.topics = NULL;
    c->conf.group_id = c->group_id;
    return 0;
nomem:
    wxg__errf(errstr, errstr_size, "consumer: out of memory");
    return -1;
}

/* The near cache of DONE messages the workers share, the decode cache and the spare records. */
static int make_caches(wxg_consumer_t *c, size_t done_entries, char *errstr, size_t errstr_size)
{
    if (!c->guard_conf.done_cache && !c->guard_conf.naive && done_entries > 0) {
        c->done_cache = wxg__donecache_new(done_entries, errstr, errstr_size);
        if (!c->done_cache)
            return -1;
        c->guard_conf.done_cache = c->done_cache;
    }
    c->decode_cache = wxg_decode_cache_new(DECODE_CACHE_BYTES);
    if (!c->decode_cache) {
        wxg__errf(errstr, errstr_size, "consumer: out of memory");
        return -1;
    }
    c->spare_recs.max = SPARE_REC_BYTES / rec_size(1);
    return 0;
}

static int make_locks(wxg_consumer_t *c, char *errstr, size_t errstr_size)
{
    if (pthread_mutex_init(&c->ready_mu, NULL) != 0)
        goto fail_mutex;
    c->ready_mu_init = 1;
    if (wxg__pipeline_health_init(&c->health) != 0)
        goto fail_mutex;
    c->health_init = 1;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        goto fail_cond;
    /* wait_for_room() measures its timeout on the monotonic clock. */
    int crc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (crc == 0)
        crc = pthread_cond_init(&c->room_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (crc != 0)
        goto fail_cond;
    if (pthread_mutex_init(&c->room_mu, NULL) != 0) {
        pthread_cond_destroy(&c->room_cv);
        goto fail_mutex;
    }
    c->room_ready = 1;
    return 0;
fail_cond:
    wxg__errf(errstr, errstr_size, "consumer: cannot create a condition variable");
    return -1;
fail_mutex:
    wxg__errf(errstr, errstr_size, "consumer: cannot create a mutex");
    return -1;
}

/* What the consumer needs of librdkafka's configuration: its callbacks, offsets stored and
 * committed by hand, and a shorter long poll than librdkafka's 500 ms default unless
 * configured (see the top of this file). */
static int tune_kafka_conf(wxg_consumer_t *c, rd_kafka_conf_t *kconf, char *errstr,
                           size_t errstr_size)
{
    char fwm[32];
    size_t fwm_size = sizeof fwm;
    if (rd_kafka_conf_get(kconf, "fetch.wait.max.ms", fwm, &fwm_size) == RD_KAFKA_CONF_OK &&
        strcmp(fwm, "500") == 0 &&
        rd_kafka_conf_set(kconf, "fetch.wait.max.ms", FETCH_WAIT_MS, errstr, errstr_size) !=
            RD_KAFKA_CONF_OK)
        return -1;
    static const char *const forced[][2] = {
        {"enable.auto.offset.store", "false"},
        {"enable.auto.commit", "false"},
        {"enable.partition.eof", "false"},
    };
    for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++) {
        if (rd_kafka_conf_set(kconf, forced[i][0], forced[i][1], errstr, errstr_size) !=
            RD_KAFKA_CONF_OK)
            return -1;
    }
    rd_kafka_conf_set_rebalance_cb(kconf, rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(kconf, commit_cb);
    rd_kafka_conf_set_opaque(kconf, c);
    return 0;
}

/* The lease watchdog, and the pipeline configuration every worker shares. */
static int start_watchdog(wxg_consumer_t *c, char *errstr, size_t errstr_size)
{
    int gerr = 0;
    c->wd = wxg_guard_watchdog_new(&c->guard_conf, 0, 0, &gerr, errstr, errstr_size);
    if (!c->wd)
        return -1;
    wxg_guard_watchdog_probe(c->wd, c->conf.redis_probe_ms);
    c->pipeline = (wxg__pipeline_conf_t){.chain = c->conf.chain,
                                         .wd = c->wd,
                                         .batch_max = c->conf.batch_max,
                                         .retry_max = c->conf.retry_max,
                                         .backoff_initial_ms = c->conf.backoff_initial_ms,
                                         .backoff_max_ms = c->conf.backoff_max_ms,
                                         .metrics = &c->m.pl,
                                         .health = &c->health,
                                         .dead_letter = dlq_sink,
                                         .dead_letter_arg = c,
                                         .finished = job_finished,
                                         .finished_arg = c};
    return 0;
}

/* The worker pool; each worker connects to Redis before this returns. */
static int start_pool(wxg_consumer_t *c, char *errstr, size_t errstr_size)
{
    size_t cap = c->conf.queue_capacity;
    wxg__pool_conf_t pc = {
        .workers = c->conf.workers,
        .capacity = cap,
        .batch_max = c->conf.batch_max,
        .batch_delay_us = c->conf.batch_delay_us,
        /* The pool's watermarks pause nothing; crossing the low one on the way down wakes the
         * poll thread to move the backlog in while the pool is still 3/4 full. */
        .high_watermark = cap,
        .low_watermark = cap - cap / 4,
    };
    if (pc.low_watermark >= pc.high_watermark)
        pc.low_watermark = pc.high_watermark - 1;
    wxg__pool_ops_t ops = {.thread_init = worker_init,
                           .thread_fini = worker_fini,
                           .run = worker_run,
                           .cancelled = worker_cancelled,
                           .pressure = worker_pressure,
                           .keep_delayed = worker_keep_delayed};
    c->pool = wxg__pool_new(&pc, &ops, c, errstr, errstr_size);
    return c->pool ? 0 : -1;
}

wxg_consumer_t *wxg_consumer_new(const wxg_consumer_conf_t *conf, char *errstr, size_t errstr_size)
{
    char dummy[1];
    if (!errstr || errstr_size == 0) {
        errstr = dummy;
        errstr_size = sizeof dummy;
    }
    rd_kafka_conf_t *kconf = conf ? conf->kafka : NULL;
    wxg_consumer_t *c = NULL;
    if (conf_complete(conf, errstr, errstr_size) != 0)
        goto fail;
    c = calloc(1, sizeof *c);
    if (!c) {
        wxg__errf(errstr, errstr_size, "consumer: out of memory");
        goto fail;
    }
    atomic_store(&c->health.ok_ms, wxg__mono_ms());
    if (copy_conf(c, conf, errstr, errstr_size) != 0 ||
        make_caches(c, conf->done_cache_entries, errstr, errstr_size) != 0 ||
        make_locks(c, errstr, errstr_size) != 0 || metrics_init(c, errstr, errstr_size) != 0 ||
        tune_kafka_conf(c, kconf, errstr, errstr_size) != 0 ||
        start_watchdog(c, errstr, errstr_size) != 0)
        goto fail;
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kconf, errstr, errstr_size);
    if (!c->rk)
        goto fail;
    kconf = NULL; /* owned by c->rk now */
    rd_kafka_poll_set_consumer(c->rk);
    c->rkq = rd_kafka_queue_get_consumer(c->rk);
    if (start_pool(c, errstr, errstr_size) != 0)
        goto fail;
    return c;

fail:
    if (kconf)
        rd_kafka_conf_destroy(kconf);
    wxg_consumer_destroy(c);
    return NULL;
}

/* wxg_consumer_stop runs in signal handlers too, where only a lock-free atomic may be used. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "wxg_consumer_stop needs a lock-free atomic_int");

void wxg_consumer_stop(wxg_consumer_t *c)
{
    if (c)
        atomic_store(&c->stop_requested, 1);
}

/* The close budget: librdkafka bounds a healthy close by about session.timeout.ms. */
static int64_t close_budget_ms(wxg_consumer_t *c)
{
    char buf[32];
    size_t len = sizeof buf;
    int64_t ms = 0;
    if (rd_kafka_conf_get(rd_kafka_conf(c->rk), "session.timeout.ms", buf, &len) ==
        RD_KAFKA_CONF_OK) {
        char *end = NULL;
        long long v = strtoll(buf, &end, 10);
        if (end != buf && v > 0)
            ms = v;
    }
    return ms > 0 ? ms : 45000;
}

/* Leaves the group (revoking through rebalance_cb, which commits the finished watermarks) and
 * stops within the close budget. rd_kafka_consumer_close() waits without limit, and close
 * hangs exist in librdkafka 2.0.2, so the close runs on the consumer queue, served here until
 * rd_kafka_consumer_closed() or the deadline. After a timeout the handle is abandoned (see
 * wxg_consumer_destroy): nothing was committed past unfinished work, so the new owners redo
 * it, and a stopping replica still exits instead of waiting for a SIGKILL. */
static void close_bounded(wxg_consumer_t *c)
{
    c->closing = 1;
    /* A release that never returned holds librdkafka's group in the rebalance: the close
     * would wait for it too. The handle is abandoned already (revoke_release). */
    if (c->kafka_stuck) {
        wxg_log(WXG_LOG_WARN, "close_skipped", WXG_LS("reason", "kafka_call_timeout"));
        return;
    }
    /* When the final commit got no answer the coordinator cannot be reached: the close would
     * wait for that commit (librdkafka keeps it for up to session.timeout.ms) and could not
     * deliver the LeaveGroup anyway, so it gets the commit budget instead. The group then
     * notices the member gone at its session timeout, as after a crash. */
    /* The same once the group has dropped this member (a commit refused with
     * UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION): there is no membership left to leave, and what
     * the close would still wait for may never be answered (see revoke_release). */
    int64_t budget =
        c->coord_silent || c->member_lost ? c->conf.commit_timeout_ms : close_budget_ms(c);
    int64_t deadline = wxg__mono_ms() + budget;
    rd_kafka_error_t *e = rd_kafka_consumer_close_queue(c->rk, c->rkq);
    if (e) {
        wxg_log(WXG_LOG_WARN, "close_failed", WXG_LS("kafka_err", rd_kafka_error_name(e)));
        rd_kafka_error_destroy(e);
        return;
    }
    while (!rd_kafka_consumer_closed(c->rk)) {
        /* A revoke served by the close whose release got no answer: the close cannot finish
         * either, and the handle is abandoned already (revoke_release). */
        if (c->kafka_stuck) {
            wxg_log(WXG_LOG_WARN, "close_abandoned", WXG_LS("reason", "kafka_call_timeout"));
            return;
        }
        int64_t left = deadline - wxg__mono_ms();
        if (left <= 0) {
            c->close_timed_out = 1;
            wxg_log(WXG_LOG_WARN, "close_timeout", WXG_LI("budget_ms", budget));
            return;
        }
        rd_kafka_message_t *m = rd_kafka_consume_queue(c->rkq, left < 100 ? (int)left : 100);
        if (m)
            rd_kafka_message_destroy(m);
    }
}

static void shutdown_consumer(wxg_consumer_t *c)
{
    c->stopping = 1;
    int64_t deadline = wxg__mono_ms() + c->conf.drain_timeout_ms;
    c->stop_deadline = deadline;
    apply_pause(c);
    wxg_log(WXG_LOG_INFO, "draining", WXG_LI("budget_ms", c->conf.drain_timeout_ms));
    for (;;) {
        free_released(c);
        flush_pending(c);
        wxg__pool_stats_t ps;
        wxg__pool_stats(c->pool, &ps);
        if (ps.jobs == 0 && !c->pending_head)
            break;
        if (wxg__mono_ms() >= deadline) {
            wxg_log(WXG_LOG_WARN, "drain_timeout", WXG_LU("left", ps.jobs + c->npending));
            break;
        }
        /* After a fatal error, work that waits out a backoff can only fail again: stop waiting
         * once nothing runs and every conversation left waits for its delay. */
        int fatal = atomic_load(&c->fatal);
        if (fatal && ps.running == 0 && ps.delayed == ps.lanes && !c->pending_head) {
            wxg_log(WXG_LOG_WARN, "drain_stopped", WXG_LU("left", ps.jobs), WXG_LERR(fatal));
            break;
        }
        /* Keep serving the group (and any rebalance) while draining. */
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, 20);
        if (m)
            rd_kafka_message_destroy(m);
        store_offsets(c);
    }
    /* Workers stop after their current batch; whatever is left is cancelled, unfinished. A
     * worker still inside a plugin once the budget is spent (or STOP_GRACE_MS, for a batch that
     * was about to end) is left running: waiting for it would stretch the stop without limit,
     * and its message is not finished, so the commit below stays behind it and the next owner
     * takes it over once its lease runs out. The caller then exits instead of destroying the
     * consumer (wxg_consumer_abandoned). */
    refresh_gauges(c);
    int64_t left = deadline - wxg__mono_ms();
    unsigned running = 0;
    if (wxg__pool_stop(c->pool, left > STOP_GRACE_MS ? left : STOP_GRACE_MS, &running) != 0) {
        c->abandoned = running;
        wxg_log(WXG_LOG_WARN, "workers_abandoned", WXG_LU("workers", running));
    } else {
        wxg__pool_destroy(c->pool);
        c->pool = NULL;
    }
    drop_pending_of(c, NULL);
    free_released(c); /* their Kafka messages go back before the close */
    refresh_gauges(c);
    store_offsets(c);
    /* Bounded: with the coordinator unreachable an unbounded commit alone could outlast the
     * platform's stop timeout. What it could not commit is redelivered and skipped. */
    rd_kafka_resp_err_t err = commit_bounded(c, NULL);
    if (err == RD_KAFKA_RESP_ERR__TIMED_OUT || err == RD_KAFKA_RESP_ERR__WAIT_COORD) {
        c->coord_silent = 1;
        wxg_log(WXG_LOG_WARN, "final_commit_failed", WXG_LS("kafka_err", rd_kafka_err2name(err)),
                WXG_LI("budget_ms", c->conf.commit_timeout_ms));
    } else if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
        if (member_gone(err))
            c->member_lost = 1;
        wxg_log(WXG_LOG_WARN, "final_commit_failed", WXG_LS("kafka_err", rd_kafka_err2name(err)));
    }
    close_bounded(c);
    log_stats(c);
    wxg_log(WXG_LOG_INFO, "stopped");
}

int wxg_consumer_run(wxg_consumer_t *c)
{
    if (!c || c->ran)
        return WXG_EINVAL;
    c->ran = 1;
    rd_kafka_topic_partition_list_t *subs = rd_kafka_topic_partition_list_new((int)c->conf.ntopics);
    if (!subs)
        return WXG_ENOMEM;
    for (size_t i = 0; i < c->conf.ntopics; i++)
        rd_kafka_topic_partition_list_add(subs, c->topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(c->rk, subs);
    rd_kafka_topic_partition_list_destroy(subs);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        wxg_log(WXG_LOG_ERROR, "subscribe_failed", WXG_LS("kafka_err", rd_kafka_err2name(err)));
        return WXG_EKAFKA;
    }
    wxg_log(WXG_LOG_INFO, "started", WXG_LU("workers", c->conf.workers),
            WXG_LU("capacity", c->conf.queue_capacity), WXG_LU("batch_max", c->conf.batch_max));
    int64_t now = wxg__mono_ms();
    int64_t last_store = now, last_commit = now, last_pause = 0, last_stats = now;
    int64_t last_gauges = 0, last_lag = now, last_stall = now;
    while (!atomic_load(&c->stop_requested) && !atomic_load(&c->fatal)) {
        free_released(c);
        flush_pending(c);
        now = wxg__mono_ms();
        if (now - last_pause >= PAUSE_EVERY_MS || backlog_update(c)) {
            apply_pause(c);
            last_pause = now;
        }
        rd_kafka_message_t *m = NULL;
        if (!c->backlog_full && c->npending >= c->backlog_high)
            wait_for_room(c, ROOM_WAIT_MS); /* not polling: see Backpressure at the top */
        else
            m = rd_kafka_consumer_poll(c->rk, c->pending_head ? 5 : 50);
        if (m) {
            handle_message(c, m);
            /* Pause as soon as the backlog is full, not at the next periodic check. */
            if (backlog_update(c)) {
                apply_pause(c);
                last_pause = now;
            }
        }
        now = wxg__mono_ms();
        if (now - last_store >= STORE_EVERY_MS) {
            store_offsets(c);
            last_store = now;
        }
        if (now - last_commit >= c->conf.commit_interval_ms) {
            store_offsets(c);
            err = rd_kafka_commit(c->rk, NULL, 1);
            if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
                wxg_log(WXG_LOG_DEBUG, "commit_skipped",
                        WXG_LS("kafka_err", rd_kafka_err2name(err)));
            last_commit = now;
        }
        if (now - last_gauges >= GAUGE_EVERY_MS) {
            refresh_gauges(c);
            last_gauges = now;
        }
        if (now - last_stall >= STALL_EVERY_MS) {
            check_stalls(c);
            check_redis(c);
            last_stall = now;
        }
        if (now - last_stats >= STATS_EVERY_MS) {
            update_lag(c, 1);
            log_stats(c);
            last_stats = now;
            last_lag = now;
        } else if (now - last_lag >= LAG_EVERY_MS) {
            update_lag(c, 0);
            last_lag = now;
        }
    }
    int fatal = atomic_load(&c->fatal);
    if (fatal)
        wxg_log(WXG_LOG_ERROR, "fatal", WXG_LERR(fatal), WXG_LS("reason", wxg_strerror(fatal)),
                WXG_LS("action", "stopping"));
    shutdown_consumer(c);
    return fatal;
}

void wxg_consumer_stats(wxg_consumer_t *c, wxg_consumer_stats_t *out)
{
    if (!c || !out)
        return;
    const cmetrics *m = &c->m;
    memset(out, 0, sizeof *out);
    out->received = wxg_counter_value(m->records);
    out->messages = atomic_load(&c->messages);
    out->decode_errors = wxg_counter_value(m->decode_errors);
    out->claimed = wxg_counter_value(m->pl.claims[WXG__PL_CLAIMED]);
    out->duplicates = wxg_counter_value(m->pl.claims[WXG__PL_DUPLICATE]);
    out->busy = wxg_counter_value(m->pl.claims[WXG__PL_BUSY]);
    out->payload_mismatches = wxg_counter_value(m->pl.mismatches);
    out->processed = wxg_counter_value(m->pl.processed);
    out->retried = wxg_counter_value(m->pl.retries);
    out->dead_lettered = wxg_counter_value(m->pl.dlq_writes);
    out->dlq_errors = wxg_counter_value(m->pl.dlq_errors);
    out->lease_lost = wxg_counter_value(m->pl.lease_lost);
    for (int i = 0; i < WXG__PL_OP_N; i++)
        out->guard_errors += wxg_counter_value(m->pl.guard_errors[i]);
    out->offsets_stored = atomic_load(&c->offsets_stored);
    out->store_state = atomic_load(&c->store_state);
    out->commits = wxg_counter_value(m->commits);
    out->offsets_committed = atomic_load(&c->offsets_committed);
    out->commit_errors = wxg_counter_value(m->commit_failures);
    out->rebalances = wxg_counter_value(m->assigns) + wxg_counter_value(m->revokes);
    out->revoke_timeouts = wxg_counter_value(m->revoke_timeouts);
    out->stale_finishes = atomic_load(&c->stale_finishes);
    out->assigned = (size_t)wxg_gauge_value(m->assigned);
    out->paused = (size_t)wxg_gauge_value(m->paused);
    out->in_flight = (size_t)wxg_gauge_value(m->inflight);
    out->oldest_age_ms = (int64_t)(wxg_gauge_value(m->oldest) * 1000.0);
    out->stalled = atomic_load(&c->stalled_n);
    out->lag = atomic_load(&c->lag);
    out->redis_round_trips = atomic_load(&c->health.round_trips);
    out->batches = atomic_load(&c->batches);
    out->batched_jobs = atomic_load(&c->batched_jobs);
    out->latency_p50_us = latency_quantile(c, 0.50);
    out->latency_p99_us = latency_quantile(c, 0.99);
    out->done_cache_hits = wxg_counter_value(m->pl.cache_hits);
    out->cluster_moved = wxg_counter_value(m->pl.cluster[WXG__PL_CL_MOVED]);
    out->cluster_ask = wxg_counter_value(m->pl.cluster[WXG__PL_CL_ASK]);
    out->cluster_tryagain = wxg_counter_value(m->pl.cluster[WXG__PL_CL_TRYAGAIN]);
    out->cluster_clusterdown = wxg_counter_value(m->pl.cluster[WXG__PL_CL_CLUSTERDOWN]);
    out->cluster_refreshes = wxg_counter_value(m->pl.cluster[WXG__PL_CL_REFRESHES]);
    out->cluster_node_errors = wxg_counter_value(m->pl.cluster[WXG__PL_CL_NODE_ERRORS]);
}

/* librdkafka before 2.3.0 asserts in rd_kafka_destroy() when a member of a cooperative-sticky
 * group is destroyed before its first assignment: the assignor's state is made with that
 * assignment but destroyed unconditionally (confluentinc/librdkafka#4312, fixed in 2.3.0 by
 * #4381). A replica stopped while it joins a rebalancing group hit it (the rebalance storm test,
 * tests/integration/test_consumer_storm.c). Such a handle is left to the process's exit, as
 * after a close timeout: it is closed, nothing is committed through it any more. */
static int destroy_would_assert(wxg_consumer_t *c)
{
    if (c->ever_assigned || rd_kafka_version() >= 0x020300ff)
        return 0;
    char buf[256];
    size_t len = sizeof buf;
    return rd_kafka_conf_get(rd_kafka_conf(c->rk), "partition.assignment.strategy", buf, &len) ==
               RD_KAFKA_CONF_OK &&
           strstr(buf, "cooperative-sticky") != NULL;
}

unsigned wxg_consumer_abandoned(const wxg_consumer_t *c)
{
    return c ? c->abandoned : 0;
}

void wxg_consumer_destroy(wxg_consumer_t *c)
{
    if (!c)
        return;
    /* Workers still inside plugins use the pool, the partitions, the watchdog and the caller's
     * plugin chain: nothing is freed, the process exits next. */
    if (c->abandoned)
        return;
    wxg__pool_destroy(c->pool);
    c->pool = NULL;
    drop_pending_of(c, NULL);
    free_released(c);
    if (c->rkq) {
        rd_kafka_queue_destroy(c->rkq);
        c->rkq = NULL;
    }
    if (c->rk && !c->close_timed_out) {
        if (!c->closing) {
            c->closing = 1;
            rd_kafka_consumer_close(c->rk);
        }
        if (!destroy_would_assert(c))
            rd_kafka_destroy(c->rk);
    }
    /* After a close timeout rd_kafka_destroy() would block on the same stuck group state (its
     * main thread ends only once the group has terminated), so the handle and its threads are
     * left to the process's exit; so is a handle whose destroy would assert (see
     * destroy_would_assert). */
    wxg_guard_watchdog_destroy(c->wd);
    wxg__donecache_destroy(c->done_cache); /* every worker's guard handle is gone */
    for (size_t i = 0; i < c->nparts; i++) {
        pthread_mutex_destroy(&c->parts[i]->mu);
        wxg__offsets_destroy(c->parts[i]->wm);
        free(c->parts[i]->c2c);
        free(c->parts[i]->topic);
        free(c->parts[i]);
    }
    free(c->m.pl.plugin_results);
    free(c->m.pl.plugin_seconds);
    wxg_metrics_free(c->m.own);
    if (c->ready_mu_init)
        pthread_mutex_destroy(&c->ready_mu);
    if (c->health_init)
        wxg__pipeline_health_destroy(&c->health);
    if (c->room_ready) {
        pthread_mutex_destroy(&c->room_mu);
        pthread_cond_destroy(&c->room_cv);
    }
    free(c->parts);
    for (size_t i = 0; c->topics && i < c->conf.ntopics; i++)
        free(c->topics[i]);
    free(c->topics);
    free(c->group_id);
    free_released(c); /* anything the close gave back; the records hold cache memory */
    wxg__recycle_drain(&c->spare_recs);
    wxg_decode_cache_free(c->decode_cache);
    free(c);
}
