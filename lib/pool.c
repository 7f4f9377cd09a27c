/*
 * DESIGN: the worker pool (lib/pool_int.h).
 *
 * Purpose: run jobs on N pthreads in batches, one conversation at a time and in order, with
 * bounded memory and delayed re-queue that never parks a worker.
 *
 * Data (all under one mutex, `mu`):
 *   - job nodes, preallocated (capacity of them) and kept on a free list, so a submit never
 *     allocates; every job is also on the age list (submission order) for the oldest-age
 *     statistic and for cancel;
 *   - lanes, one per conversation hash with jobs, also preallocated, found through a chained
 *     hash table. A lane is READY (on the FIFO ready list), RUNNING (its head job is in a batch)
 *     or DELAYED (in a min-heap by due time). Only a lane's head job ever runs;
 *   - per-tag job counts (open addressing, grows on a new tag) for wait_tag.
 *
 * Threads: workers take turns as the single "collector": it takes ready lanes into its batch and
 * waits on `collect_cv` for more until the batch is full, the first job's delay budget is
 * spent or the submitter says nothing more is coming (wxg__pool_submit_last); the other idle
 * workers wait on `follow_cv` for the collector role. A collector that already holds part of a
 * batch is woken only when the ready lanes can complete it (`want`), not once per submitted job.
 * Expired delays are moved to the ready list by whichever worker holds the lock next, and the
 * collector's wait is bounded by the earliest due time, so a delayed job needs no extra thread. The
 * run callback is called without the lock. `init_cv` is broadcast when a worker has initialised and
 * again when its thread ends, for wxg__pool_new and wxg__pool_stop to wait on.
 *
 * Failure modes: a full pool refuses submits (WXG_EBUSY) instead of blocking the poll thread; a
 * new tag that cannot be counted for lack of memory refuses the submit with WXG_ENOMEM. A
 * failing thread_init stops the pool from starting. Nothing here aborts.
 */
#include "pool_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>

#include "clock_int.h"
#include "err_int.h"
#include "wxguard/err.h"

enum { L_READY = 1, L_RUNNING, L_DELAYED };

typedef struct lane lane;

typedef struct job {
    void *item;
    uint64_t tag;
    lane *lane;
    struct job *lnext, *lprev; /* lane FIFO */
    struct job *anext, *aprev; /* age list; anext doubles as the free-list link */
    int64_t submitted_us;
    int running;
} job;

struct lane {
    uint64_t conv;
    job *head, *tail;
    int state;
    int64_t ready_us; /* when it last became ready */
    int64_t due_us;   /* when DELAYED: when it becomes ready */
    size_t heap_idx;
    lane *rnext, *rprev; /* ready list */
    lane *hnext;         /* hash chain; free-list link */
};

typedef struct tag_slot {
    uint64_t tag;
    size_t count;
    int used;
} tag_slot;

typedef struct worker {
    wxg__pool_t *pool;
    unsigned index;
    pthread_t thread;
    int started;
    job **batch;
    void **items;
    int64_t *delays;
} worker;

struct wxg__pool_s {
    pthread_mutex_t mu;
    pthread_cond_t collect_cv; /* the collector waits here for ready lanes */
    pthread_cond_t follow_cv;  /* idle workers wait here for the collector role */
    pthread_cond_t idle_cv;    /* broadcast when jobs leave; drain and wait_tag wait here */
    pthread_cond_t init_cv;
    wxg__pool_conf_t conf;
    wxg__pool_ops_t ops;
    void *opaque;

    job *jobs;
    job *free_jobs;
    job *age_head, *age_tail;
    lane *lanes;
    lane *free_lanes;
    lane **buckets;
    size_t nbuckets;
    lane *ready_head, *ready_tail;
    size_t nready;
    lane **heap;
    size_t nheap;
    tag_slot *tags;
    size_t ntags; /* slots, power of two */
    size_t tags_used;

    size_t count;
    size_t running;
    size_t nlanes;
    int above;
    int closed;
    int stop;
    int collecting;
    size_t want; /* ready lanes the waiting collector needs before a wake-up is worth its cost */
    int flush;   /* wxg__pool_submit_last: send partial batches now; the next submit ends it */
    unsigned inited;
    unsigned exited; /* workers whose thread has finished (init_cv is broadcast each time) */
    int init_rc;
    char init_err[256];

    uint64_t submitted, finished, requeued, cancelled, rejected, batches, batched_jobs;
    worker *workers;
};

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_us)
{
    struct timespec ts = wxg__mono_timespec(until_us);
    pthread_cond_timedwait(cv, mu, &ts);
}

uint64_t wxg__pool_hash(const void *data, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *s = data;
    for (size_t i = 0; i < len; i++) {
        h ^= s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static size_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)h;
}

/* ---- tags (@locks mu held) ---- */

static tag_slot *tag_find(wxg__pool_t *p, uint64_t tag)
{
    size_t mask = p->ntags - 1;
    for (size_t i = mix(tag) & mask;; i = (i + 1) & mask) {
        if (!p->tags[i].used || p->tags[i].tag == tag)
            return &p->tags[i];
    }
}

static int tag_add(wxg__pool_t *p, uint64_t tag)
{
    tag_slot *s = tag_find(p, tag);
    if (!s->used) {
        if ((p->tags_used + 1) * 2 > p->ntags) {
            size_t n = p->ntags * 2;
            tag_slot *t = calloc(n, sizeof *t);
            if (!t)
                return WXG_ENOMEM;
            tag_slot *old = p->tags;
            size_t oldn = p->ntags;
            p->tags = t;
            p->ntags = n;
            for (size_t i = 0; i < oldn; i++) {
                if (old[i].used)
                    *tag_find(p, old[i].tag) = old[i];
            }
            free(old);
            s = tag_find(p, tag);
        }
        s->used = 1;
        s->tag = tag;
        s->count = 0;
        p->tags_used++;
    }
    s->count++;
    return 0;
}

/* ---- heap of delayed lanes by due time (@locks mu held) ---- */

static void heap_swap(wxg__pool_t *p, size_t a, size_t b)
{
    lane *t = p->heap[a];
    p->heap[a] = p->heap[b];
    p->heap[b] = t;
    p->heap[a]->heap_idx = a;
    p->heap[b]->heap_idx = b;
}

static void heap_up(wxg__pool_t *p, size_t i)
{
    while (i > 0 && p->heap[(i - 1) / 2]->due_us > p->heap[i]->due_us) {
        heap_swap(p, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(wxg__pool_t *p, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < p->nheap && p->heap[l]->due_us < p->heap[m]->due_us)
            m = l;
        if (r < p->nheap && p->heap[r]->due_us < p->heap[m]->due_us)
            m = r;
        if (m == i)
            return;
        heap_swap(p, i, m);
        i = m;
    }
}

static void heap_push(wxg__pool_t *p, lane *l)
{
    l->heap_idx = p->nheap;
    p->heap[p->nheap++] = l;
    heap_up(p, l->heap_idx);
}

static void heap_remove(wxg__pool_t *p, lane *l)
{
    size_t i = l->heap_idx;
    p->nheap--;
    if (i != p->nheap) {
        heap_swap(p, i, p->nheap);
        heap_down(p, i);
        heap_up(p, i);
    }
}

/* ---- lanes (@locks mu held) ---- */

static lane *lane_find(wxg__pool_t *p, uint64_t conv)
{
    for (lane *l = p->buckets[mix(conv) & (p->nbuckets - 1)]; l; l = l->hnext) {
        if (l->conv == conv)
            return l;
    }
    return NULL;
}

static void ready_push(wxg__pool_t *p, lane *l, int64_t now)
{
    l->state = L_READY;
    l->ready_us = now;
    l->rnext = NULL;
    l->rprev = p->ready_tail;
    if (p->ready_tail)
        p->ready_tail->rnext = l;
    else
        p->ready_head = l;
    p->ready_tail = l;
    p->nready++;
    /* One wake-up per message would cost the collector a context switch for each job it adds to a
     * batch that is still filling; it only needs waking once the batch can be completed (its
     * deadline is a timed wait of its own). */
    if (p->nready >= p->want)
        pthread_cond_signal(&p->collect_cv);
}

static void ready_unlink(wxg__pool_t *p, lane *l)
{
    if (l->rprev)
        l->rprev->rnext = l->rnext;
    else
        p->ready_head = l->rnext;
    if (l->rnext)
        l->rnext->rprev = l->rprev;
    else
        p->ready_tail = l->rprev;
    l->rnext = l->rprev = NULL;
    p->nready--;
}

static void lane_free(wxg__pool_t *p, lane *l)
{
    lane **pp = &p->buckets[mix(l->conv) & (p->nbuckets - 1)];
    while (*pp != l)
        pp = &(*pp)->hnext;
    *pp = l->hnext;
    memset(l, 0, sizeof *l);
    l->hnext = p->free_lanes;
    p->free_lanes = l;
    p->nlanes--;
}

/* Unlinks a job that is not running from its lane and from the pool, fixing the lane's state:
 * a lane left empty is freed; a delayed lane that lost its head becomes ready (the new head
 * never asked for the delay). */
static void job_remove(wxg__pool_t *p, job *j, int64_t now)
{
    lane *l = j->lane;
    int was_head = l->head == j;
    if (j->lprev)
        j->lprev->lnext = j->lnext;
    else
        l->head = j->lnext;
    if (j->lnext)
        j->lnext->lprev = j->lprev;
    else
        l->tail = j->lprev;

    if (j->aprev)
        j->aprev->anext = j->anext;
    else
        p->age_head = j->anext;
    if (j->anext)
        j->anext->aprev = j->aprev;
    else
        p->age_tail = j->aprev;

    tag_find(p, j->tag)->count--;
    memset(j, 0, sizeof *j);
    j->anext = p->free_jobs;
    p->free_jobs = j;
    p->count--;

    if (was_head) {
        if (l->state == L_DELAYED)
            heap_remove(p, l);
        else if (l->state == L_READY)
            ready_unlink(p, l);
        if (l->head)
            ready_push(p, l, now);
        else
            lane_free(p, l);
    }
    if (p->above && p->count <= p->conf.low_watermark) {
        p->above = 0;
        if (p->ops.pressure)
            p->ops.pressure(p->opaque, 0);
    }
    pthread_cond_broadcast(&p->idle_cv);
}

static void expire_delays(wxg__pool_t *p, int64_t now)
{
    while (p->nheap > 0 && p->heap[0]->due_us <= now) {
        lane *l = p->heap[0];
        heap_remove(p, l);
        ready_push(p, l, now);
    }
}

/* ---- workers ---- */

/* Gathers a batch into w->batch. Returns its size, 0 when the pool stops. @locks mu held */
static size_t collect(wxg__pool_t *p, worker *w)
{
    while (p->collecting && !p->stop)
        pthread_cond_wait(&p->follow_cv, &p->mu);
    if (p->stop)
        return 0;
    p->collecting = 1;
    size_t n = 0;
    int64_t deadline = 0;
    for (;;) {
        int64_t now = wxg__mono_us();
        expire_delays(p, now);
        while (n < p->conf.batch_max && p->ready_head) {
            lane *l = p->ready_head;
            ready_unlink(p, l);
            if (n == 0)
                deadline = l->ready_us + p->conf.batch_delay_us;
            l->state = L_RUNNING;
            l->head->running = 1;
            w->batch[n++] = l->head;
        }
        if (n == p->conf.batch_max || p->stop || (n > 0 && (now >= deadline || p->flush)))
            break;
        int64_t until = n > 0 ? deadline : now + 1000000;
        p->want = n > 0 ? p->conf.batch_max - n : 1;
        if (p->nheap > 0 && p->heap[0]->due_us < until)
            until = p->heap[0]->due_us;
        timed_wait(&p->collect_cv, &p->mu, until);
    }
    p->collecting = 0;
    p->want = 1;
    pthread_cond_signal(&p->follow_cv);
    p->running += n;
    return n;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    wxg__pool_t *p = w->pool;
    void *wstate = NULL;
    char err[256] = "";
    /* A name per thread, so that `top -H` and debuggers show which thread is busy. */
    char name[16];
    snprintf(name, sizeof name, "wxg-worker-%u", w->index);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    int rc =
        p->ops.thread_init ? p->ops.thread_init(p->opaque, w->index, &wstate, err, sizeof err) : 0;
    pthread_mutex_lock(&p->mu);
    if (rc != 0 && p->init_rc == 0) {
        p->init_rc = rc;
        snprintf(p->init_err, sizeof p->init_err, "worker %u: %s", w->index, err);
    }
    p->inited++;
    pthread_cond_broadcast(&p->init_cv);
    if (rc != 0) {
        p->exited++;
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    for (;;) {
        size_t n = collect(p, w);
        if (n == 0)
            break;
        p->batches++;
        p->batched_jobs += n;
        pthread_mutex_unlock(&p->mu);

        for (size_t i = 0; i < n; i++) {
            w->items[i] = w->batch[i]->item;
            w->delays[i] = WXG__POOL_FINISHED;
        }
        p->ops.run(p->opaque, wstate, w->items, n, w->delays);

        pthread_mutex_lock(&p->mu);
        int64_t now = wxg__mono_us();
        p->running -= n;
        for (size_t i = 0; i < n; i++) {
            job *j = w->batch[i];
            lane *l = j->lane;
            j->running = 0;
            if (w->delays[i] < 0) {
                p->finished++;
                l->state = 0; /* neither ready nor delayed: job_remove only relinks it */
                job_remove(p, j, now);
            } else {
                p->requeued++;
                l->state = L_DELAYED;
                l->due_us = now + w->delays[i] * 1000;
                heap_push(p, l);
                pthread_cond_signal(&p->collect_cv);
            }
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (p->ops.thread_fini)
        p->ops.thread_fini(p->opaque, w->index, wstate);
    pthread_mutex_lock(&p->mu);
    p->exited++;
    pthread_cond_broadcast(&p->init_cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pool_free(wxg__pool_t *p)
{
    if (p->workers) {
        for (unsigned i = 0; i < p->conf.workers; i++) {
            free(p->workers[i].batch);
            free(p->workers[i].items);
            free(p->workers[i].delays);
        }
    }
    free(p->workers);
    free(p->jobs);
    free(p->lanes);
    free(p->buckets);
    free(p->heap);
    free(p->tags);
    free(p);
}

static void stop_workers(wxg__pool_t *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    p->closed = 1;
    pthread_cond_broadcast(&p->collect_cv);
    pthread_cond_broadcast(&p->follow_cv);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->conf.workers; i++) {
        if (p->workers[i].started)
            pthread_join(p->workers[i].thread, NULL);
    }
}

static int init_cond(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

wxg__pool_t *wxg__pool_new(const wxg__pool_conf_t *conf, const wxg__pool_ops_t *ops, void *opaque,
                           char *errstr, size_t errstr_size)
{
    char dummy[1];
    if (!errstr || errstr_size == 0) {
        errstr = dummy;
        errstr_size = sizeof dummy;
    }
    if (!conf || !ops || !ops->run || conf->workers == 0 || conf->capacity == 0 ||
        conf->batch_max == 0 || conf->batch_delay_us < 0 || conf->high_watermark > conf->capacity) {
        wxg__errf(errstr, errstr_size, "pool: invalid configuration");
        return NULL;
    }
    wxg__pool_t *p = calloc(1, sizeof *p);
    if (!p)
        goto fail_alloc;
    p->conf = *conf;
    p->want = 1;
    if (p->conf.high_watermark == 0)
        p->conf.high_watermark = p->conf.capacity;
    if (p->conf.low_watermark >= p->conf.high_watermark) {
        wxg__errf(errstr, errstr_size, "pool: low_watermark must be below high_watermark");
        free(p);
        return NULL;
    }
    p->ops = *ops;
    p->opaque = opaque;
    size_t cap = conf->capacity;
    p->nbuckets = 16;
    while (p->nbuckets < cap)
        p->nbuckets *= 2;
    p->ntags = 16;
    p->jobs = calloc(cap, sizeof *p->jobs);
    p->lanes = calloc(cap, sizeof *p->lanes);
    p->buckets = calloc(p->nbuckets, sizeof *p->buckets);
    p->heap = calloc(cap, sizeof *p->heap);
    p->tags = calloc(p->ntags, sizeof *p->tags);
    p->workers = calloc(conf->workers, sizeof *p->workers);
    if (!p->jobs || !p->lanes || !p->buckets || !p->heap || !p->tags || !p->workers)
        goto fail_mem;
    for (unsigned i = 0; i < conf->workers; i++) {
        worker *w = &p->workers[i];
        w->pool = p;
        w->index = i;
        w->batch = calloc(conf->batch_max, sizeof *w->batch);
        w->items = calloc(conf->batch_max, sizeof *w->items);
        w->delays = calloc(conf->batch_max, sizeof *w->delays);
        if (!w->batch || !w->items || !w->delays)
            goto fail_mem;
    }
    for (size_t i = cap; i-- > 0;) {
        p->jobs[i].anext = p->free_jobs;
        p->free_jobs = &p->jobs[i];
        p->lanes[i].hnext = p->free_lanes;
        p->free_lanes = &p->lanes[i];
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        goto fail_mem;
    if (init_cond(&p->collect_cv) != 0)
        goto fail_collect;
    if (init_cond(&p->follow_cv) != 0)
        goto fail_follow;
    if (init_cond(&p->idle_cv) != 0)
        goto fail_idle;
    if (init_cond(&p->init_cv) != 0)
        goto fail_init;

    unsigned started = 0;
    for (unsigned i = 0; i < conf->workers; i++) {
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0)
            break;
        p->workers[i].started = 1;
        started++;
    }
    pthread_mutex_lock(&p->mu);
    while (p->inited < started)
        pthread_cond_wait(&p->init_cv, &p->mu);
    int rc = p->init_rc;
    pthread_mutex_unlock(&p->mu);
    if (started < conf->workers || rc != 0) {
        if (rc != 0)
            wxg__errf(errstr, errstr_size, "pool: %s", p->init_err);
        else
            wxg__errf(errstr, errstr_size, "pool: cannot start worker threads");
        stop_workers(p);
        goto fail_threads;
    }
    return p;

fail_threads:
    pthread_cond_destroy(&p->init_cv);
fail_init:
    pthread_cond_destroy(&p->idle_cv);
fail_idle:
    pthread_cond_destroy(&p->follow_cv);
fail_follow:
    pthread_cond_destroy(&p->collect_cv);
fail_collect:
    pthread_mutex_destroy(&p->mu);
    pool_free(p);
    return NULL;
fail_mem:
    pool_free(p);
fail_alloc:
    wxg__errf(errstr, errstr_size, "pool: out of memory");
    return NULL;
}

static int submit(wxg__pool_t *p, uint64_t conversation, uint64_t tag, void *item, int last)
{
    if (!p)
        return WXG_EINVAL;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (p->closed) {
        rc = WXG_ECLOSED;
        goto out;
    }
    if (p->count >= p->conf.capacity) {
        p->rejected++;
        rc = WXG_EBUSY;
        goto out;
    }
    rc = tag_add(p, tag);
    if (rc != 0)
        goto out;
    int64_t now = wxg__mono_us();
    job *j = p->free_jobs;
    p->free_jobs = j->anext;
    j->item = item;
    j->tag = tag;
    j->submitted_us = now;
    j->anext = NULL;
    j->aprev = p->age_tail;
    if (p->age_tail)
        p->age_tail->anext = j;
    else
        p->age_head = j;
    p->age_tail = j;

    lane *l = lane_find(p, conversation);
    int fresh = !l;
    if (fresh) {
        l = p->free_lanes;
        p->free_lanes = l->hnext;
        l->conv = conversation;
        size_t b = mix(conversation) & (p->nbuckets - 1);
        l->hnext = p->buckets[b];
        p->buckets[b] = l;
        p->nlanes++;
    }
    j->lane = l;
    j->lprev = l->tail;
    if (l->tail)
        l->tail->lnext = j;
    else
        l->head = j;
    l->tail = j;
    p->count++;
    p->submitted++;
    if (fresh)
        ready_push(p, l, now);
    /* With a batch's worth of jobs in the pool, batches fill without waiting anyway. */
    p->flush = last && p->count < p->conf.batch_max;
    if (p->flush)
        pthread_cond_signal(&p->collect_cv);
    if (!p->above && p->count >= p->conf.high_watermark) {
        p->above = 1;
        if (p->ops.pressure)
            p->ops.pressure(p->opaque, 1);
    }
out:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

size_t wxg__pool_cancel(wxg__pool_t *p, uint64_t tag)
{
    if (!p)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    int64_t now = wxg__mono_us();
    job *j = p->age_head;
    while (j) {
        job *next = j->anext;
        if (j->tag == tag && !j->running) {
            void *item = j->item;
            job_remove(p, j, now);
            p->cancelled++;
            n++;
            if (p->ops.cancelled)
                p->ops.cancelled(p->opaque, item);
        }
        j = next;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

size_t wxg__pool_cancel_delayed(wxg__pool_t *p, uint64_t tag)
{
    if (!p)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    int64_t now = wxg__mono_us();
    /* Removing a delayed head reshapes the heap, so restart the scan after every removal. */
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < p->nheap; i++) {
            lane *l = p->heap[i];
            if (l->head->tag != tag)
                continue;
            if (p->ops.keep_delayed && p->ops.keep_delayed(p->opaque, l->head->item))
                continue;
            /* Collect the lane's jobs with the tag first: the lane may be freed on the way. */
            job *j = l->head;
            while (j) {
                job *next = j->lnext;
                if (j->tag == tag) {
                    void *item = j->item;
                    int last = next == NULL;
                    job_remove(p, j, now);
                    p->cancelled++;
                    n++;
                    if (p->ops.cancelled)
                        p->ops.cancelled(p->opaque, item);
                    if (last)
                        break;
                }
                j = next;
            }
            again = 1;
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

size_t wxg__pool_count_tag(wxg__pool_t *p, uint64_t tag)
{
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    tag_slot *s = tag_find(p, tag);
    size_t n = s->used ? s->count : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int wxg__pool_wait_tag(wxg__pool_t *p, uint64_t tag, int64_t timeout_ms)
{
    if (!p)
        return WXG_EINVAL;
    int64_t until = wxg__mono_us() + timeout_ms * 1000;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        tag_slot *s = tag_find(p, tag);
        if (!s->used || s->count == 0)
            break;
        if (wxg__mono_us() >= until) {
            rc = WXG_ETIMEDOUT;
            break;
        }
        timed_wait(&p->idle_cv, &p->mu, until);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int wxg__pool_submit(wxg__pool_t *p, uint64_t conversation, uint64_t tag, void *item)
{
    return submit(p, conversation, tag, item, 0);
}

int wxg__pool_submit_last(wxg__pool_t *p, uint64_t conversation, uint64_t tag, void *item)
{
    return submit(p, conversation, tag, item, 1);
}

void wxg__pool_close(wxg__pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    pthread_mutex_unlock(&p->mu);
}

int wxg__pool_drain(wxg__pool_t *p, int64_t timeout_ms)
{
    if (!p)
        return WXG_EINVAL;
    int64_t until = wxg__mono_us() + timeout_ms * 1000;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    while (p->count > 0) {
        if (wxg__mono_us() >= until) {
            rc = WXG_ETIMEDOUT;
            break;
        }
        timed_wait(&p->idle_cv, &p->mu, until);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int wxg__pool_stop(wxg__pool_t *p, int64_t timeout_ms, unsigned *running)
{
    if (!p || timeout_ms < 0)
        return WXG_EINVAL;
    int64_t until = wxg__mono_us() + timeout_ms * 1000;
    unsigned started = 0;
    for (unsigned i = 0; i < p->conf.workers; i++)
        started += p->workers[i].started != 0;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    p->closed = 1;
    pthread_cond_broadcast(&p->collect_cv);
    pthread_cond_broadcast(&p->follow_cv);
    while (p->exited < started) {
        if (wxg__mono_us() >= until) {
            rc = WXG_ETIMEDOUT;
            break;
        }
        timed_wait(&p->init_cv, &p->mu, until);
    }
    if (running)
        *running = started - p->exited;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void wxg__pool_destroy(wxg__pool_t *p)
{
    if (!p)
        return;
    stop_workers(p);
    pthread_mutex_lock(&p->mu);
    int64_t now = wxg__mono_us();
    while (p->age_head) {
        void *item = p->age_head->item;
        job_remove(p, p->age_head, now);
        p->cancelled++;
        if (p->ops.cancelled)
            p->ops.cancelled(p->opaque, item);
    }
    pthread_mutex_unlock(&p->mu);
    pthread_cond_destroy(&p->init_cv);
    pthread_cond_destroy(&p->idle_cv);
    pthread_cond_destroy(&p->follow_cv);
    pthread_cond_destroy(&p->collect_cv);
    pthread_mutex_destroy(&p->mu);
    pool_free(p);
}

void wxg__pool_stats(wxg__pool_t *p, wxg__pool_stats_t *out)
{
    if (!p || !out)
        return;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&p->mu);
    out->jobs = p->count;
    out->running = p->running;
    out->delayed = p->nheap;
    out->lanes = p->nlanes;
    out->oldest_age_us = p->age_head ? wxg__mono_us() - p->age_head->submitted_us : 0;
    out->above_high = p->above;
    out->submitted = p->submitted;
    out->finished = p->finished;
    out->requeued = p->requeued;
    out->cancelled = p->cancelled;
    out->rejected = p->rejected;
    out->batches = p->batches;
    out->batched_jobs = p->batched_jobs;
    pthread_mutex_unlock(&p->mu);
}
