/*
 * Internal to libwxguard: the worker pool (lib/pool.c), with per-conversation ordering,
 * batching and delayed re-queue. Only the consumer (lib/consumer.c) runs one, and the
 * pipeline returns its WXG__POOL_FINISHED; no program uses it, so it is not public.
 *
 * The consumer's poll thread submits one job per message with a conversation hash and a tag
 * (the consumer uses the partition). Jobs of one conversation form a lane: only the lane's
 * oldest job is ever handed to a worker, and the next one only after it finished, so messages
 * of one conversation are processed one at a time, in submission order. Lanes are independent:
 * a slow or delayed conversation holds back nothing but itself.
 *
 * Batching: a worker takes up to `batch_max` ready lanes' head jobs at once (so that the guard
 * can claim them in one Redis call). When fewer are ready it waits for more, but never longer
 * than `batch_delay_us` after the first of them became ready. Only one worker gathers a batch at
 * a time; the others wait their turn, so light traffic forms batches instead of one-job slices.
 *
 * The run callback returns, per job, either WXG__POOL_FINISHED (the job leaves the pool) or a
 * delay in milliseconds >= 0: the job stays at the head of its lane and becomes ready again
 * after the delay, without occupying a worker meanwhile and without letting later jobs of its
 * conversation overtake it (a BUSY claim or a retry with backoff).
 *
 * Capacity: at most `capacity` jobs (queued, running and delayed) are in the pool; a submit
 * beyond it is refused with WXG_EBUSY. The pressure callback reports crossing the high
 * watermark (depth reached `high_watermark`) and falling back to the low watermark, so the poll
 * thread can pause and resume partitions before the pool is full.
 *
 * Threads: submit, cancel, wait, drain and stats may be called from any thread (the consumer
 * calls them from its poll thread). Callbacks: thread_init/thread_fini and run are called on the
 * worker threads; cancelled and pressure are called with the pool's lock held, from whichever
 * thread caused them, and must not call back into the pool.
 */
#ifndef WXG_POOL_INT_H
#define WXG_POOL_INT_H

#include <stddef.h>
#include <stdint.h>

typedef struct wxg__pool_s wxg__pool_t;

/* A job's result: it leaves the pool. Any value >= 0 re-queues it after that many ms. */
#define WXG__POOL_FINISHED (-1)

typedef struct wxg__pool_ops {
    /* Optional. Creates per-worker state on the worker's own thread (e.g. a Redis connection).
     * Returns 0, or a negative WXG_E* code with errstr filled: the pool then fails to start. */
    int (*thread_init)(void *opaque, unsigned worker, void **wstate, char *errstr,
                       size_t errstr_size);
    /* Optional. Frees what thread_init made, on the same thread. */
    void (*thread_fini)(void *opaque, unsigned worker, void *wstate);
    /* Required. Processes n (1..batch_max) jobs; never two of one conversation. Fills
     * out_delay_ms[i] with WXG__POOL_FINISHED or a re-queue delay for items[i]. */
    void (*run)(void *opaque, void *wstate, void *const *items, size_t n, int64_t *out_delay_ms);
    /* Optional. Called for a job removed without running to completion (wxg__pool_cancel, or
     * left over at destroy). @locks pool lock held */
    void (*cancelled)(void *opaque, void *item);
    /* Optional. high=1 when the depth reached high_watermark, high=0 when it fell back to
     * low_watermark afterwards. Calls alternate, starting with high=1. @locks pool lock held */
    void (*pressure)(void *opaque, int high);
    /* Optional. Nonzero for a delayed job that wxg__pool_cancel_delayed must leave in place
     * (with the jobs behind it in its conversation): the consumer keeps work whose effects
     * already ran and that only waits to retry its marker. @locks pool lock held */
    int (*keep_delayed)(void *opaque, void *item);
} wxg__pool_ops_t;

typedef struct wxg__pool_conf {
    unsigned workers;       /* >= 1 */
    size_t capacity;        /* max jobs in the pool, >= 1 */
    size_t batch_max;       /* max jobs per run call, >= 1 */
    int64_t batch_delay_us; /* max wait for a fuller batch, >= 0 (0: take what is ready) */
    size_t high_watermark;  /* 1..capacity; 0 means capacity */
    size_t low_watermark;   /* < high_watermark; 0 allowed */
} wxg__pool_conf_t;

typedef struct wxg__pool_stats {
    size_t jobs;           /* in the pool now: queued + running + delayed */
    size_t running;        /* handed to a worker now */
    size_t delayed;        /* lanes waiting for a re-queue delay */
    size_t lanes;          /* conversations with jobs */
    int64_t oldest_age_us; /* age of the oldest job in the pool, 0 when empty */
    int above_high;        /* 1 between a high and the following low watermark crossing */
    uint64_t submitted;
    uint64_t finished;
    uint64_t requeued; /* re-queue results */
    uint64_t cancelled;
    uint64_t rejected;     /* submits refused because the pool was full */
    uint64_t batches;      /* run calls */
    uint64_t batched_jobs; /* jobs over all run calls (batched_jobs / batches = mean size) */
} wxg__pool_stats_t;

/* Starts the workers (each runs thread_init before the call returns). `conf` and `ops` are
 * copied; `opaque` is passed to every callback and must outlive the pool. Returns NULL with
 * errstr filled on a bad configuration, allocation failure or a failed thread_init. */
wxg__pool_t *wxg__pool_new(const wxg__pool_conf_t *conf, const wxg__pool_ops_t *ops, void *opaque,
                           char *errstr, size_t errstr_size);

/* Adds a job. `item` is the caller's; the pool hands it back to run or cancelled. Returns 0,
 * WXG_EBUSY when the pool holds `capacity` jobs, WXG_ECLOSED after close/drain, WXG_ENOMEM.
 * @locality any thread */
int wxg__pool_submit(wxg__pool_t *p, uint64_t conversation, uint64_t tag, void *item);

/* Like wxg__pool_submit, and tells the pool that no more jobs are coming for now: a worker
 * collecting a batch sends what it has (this job included) at once instead of waiting out
 * batch_delay_us for company. The hint ends with the next submit, and is ignored while the pool
 * holds batch_max jobs or more (batches fill anyway). The consumer submits this way the last
 * message it has when its intake is drained, so that batching adds no delay at light load and
 * full batches still form under load.
 * @locality any thread */
int wxg__pool_submit_last(wxg__pool_t *p, uint64_t conversation, uint64_t tag, void *item);

/* Removes every job with `tag` that is not running now (queued or delayed), calling cancelled
 * for each, keeping the order of what remains. Returns how many were removed. */
size_t wxg__pool_cancel(wxg__pool_t *p, uint64_t tag);

/* Removes only the jobs with `tag` that wait out a re-queue delay, together with every later
 * job with `tag` in the same conversation (so nothing behind a removed job can overtake it),
 * except a delayed job for which ops.keep_delayed says to keep it. The consumer calls it first
 * on revoke: a message waiting for another owner's lease or for a retry backoff is not going to
 * finish within a drain budget, while one that waits to retry the marker of effects that already
 * ran finishes as soon as Redis answers again. Returns how many were removed. */
size_t wxg__pool_cancel_delayed(wxg__pool_t *p, uint64_t tag);

/* Number of jobs with `tag` in the pool. */
size_t wxg__pool_count_tag(wxg__pool_t *p, uint64_t tag);

/* Waits until no job with `tag` is in the pool. 0, or WXG_ETIMEDOUT after timeout_ms. */
int wxg__pool_wait_tag(wxg__pool_t *p, uint64_t tag, int64_t timeout_ms);

/* Refuses further submits (WXG_ECLOSED). Jobs already in the pool still run. */
void wxg__pool_close(wxg__pool_t *p);

/* Closes the pool and waits until it is empty. 0, or WXG_ETIMEDOUT after timeout_ms (the jobs
 * left keep running; destroy cancels the rest). */
int wxg__pool_drain(wxg__pool_t *p, int64_t timeout_ms);

/* Tells the workers to stop: they take no more jobs, and each exits (after thread_fini) once
 * its current batch returns and its results are applied. Waits at most timeout_ms (>= 0) for
 * that. Returns 0 when every worker has exited, so that wxg__pool_destroy does not wait; or
 * WXG_ETIMEDOUT, with the number of workers still inside the run callback in *running (may be
 * NULL): they may return at any time, so the pool, the opaque and everything the run callback
 * uses must stay alive while they can, and a stopping process exits rather than destroy them.
 * Jobs that are not running stay in the pool (wxg__pool_destroy cancels them). Call from one
 * thread.
 * @locality not from a pool callback */
int wxg__pool_stop(wxg__pool_t *p, int64_t timeout_ms, unsigned *running);

/* Stops the workers after their current batch (its results are applied), runs thread_fini,
 * calls cancelled for every job left, frees the pool. NULL is accepted.
 * @locality not from a pool callback */
void wxg__pool_destroy(wxg__pool_t *p);

void wxg__pool_stats(wxg__pool_t *p, wxg__pool_stats_t *out);

/* A 64-bit hash of a conversation id for wxg__pool_submit (FNV-1a). */
uint64_t wxg__pool_hash(const void *data, size_t len);

#endif /* WXG_POOL_INT_H */
