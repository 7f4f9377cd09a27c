/* Unit tests for lib/pool.c: per-conversation order under many workers, batch formation and its
 * delay bound, delayed re-queue that keeps order without parking a worker, cancel, drain
 * budget, a stop that gives up on a worker stuck in run, watermarks and start-up failure. Waits are
 * bounded and scaled, never measured. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool_int.h"
#include "testenv.h"
#include "wxguard/err.h"

#define MAX_LOG 65536

typedef struct item {
    int conv;
    int seq;
    int attempts;
    int delay_first_ms; /* re-queue after this on the first attempt (-1: never) */
    int block;          /* wait at the gate */
    int keep;           /* wxg__pool_cancel_delayed leaves it in place (ops.keep_delayed) */
} item;

typedef struct harness {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gate_open;
    int blocked; /* items waiting at the gate */
    /* run log */
    int log_conv[MAX_LOG];
    int log_seq[MAX_LOG];
    int nlog;
    size_t batch_sizes[MAX_LOG];
    int nbatches;
    int bad; /* failures detected off the main thread */
    int active[1024];
    int last_seq[1024];
    int pressure_calls[2];
    int last_pressure;
    int cancelled;
    int fail_init_worker;
    atomic_int inits, finis;
} harness;

static void h_init(harness *h)
{
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    for (int i = 0; i < 1024; i++)
        h->last_seq[i] = -1;
    h->last_pressure = -1;
    h->fail_init_worker = -1;
}

static void h_fini(harness *h)
{
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
}

static void h_open_gate(harness *h)
{
    pthread_mutex_lock(&h->mu);
    h->gate_open = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void h_wait_blocked(harness *h, int n)
{
    int64_t until = wxg_test_now_ms() + 10000 * wxg_test_scale();
    for (;;) {
        pthread_mutex_lock(&h->mu);
        int b = h->blocked;
        pthread_mutex_unlock(&h->mu);
        if (b >= n)
            return;
        assert_true(wxg_test_now_ms() < until);
        wxg_test_sleep_ms(1);
    }
}

static int h_thread_init(void *opaque, unsigned worker, void **wstate, char *errstr,
                         size_t errstr_size)
{
    harness *h = opaque;
    if ((int)worker == h->fail_init_worker) {
        snprintf(errstr, errstr_size, "refused on purpose");
        return WXG_ECONN;
    }
    atomic_fetch_add(&h->inits, 1);
    *wstate = h;
    return 0;
}

static void h_thread_fini(void *opaque, unsigned worker, void *wstate)
{
    harness *h = opaque;
    if (wstate == h)
        atomic_fetch_add(&h->finis, 1);
}

static void h_run(void *opaque, void *wstate, void *const *items, size_t n, int64_t *out)
{
    harness *h = opaque;
    pthread_mutex_lock(&h->mu);
    if (wstate != h)
        h->bad++;
    if (h->nbatches < MAX_LOG)
        h->batch_sizes[h->nbatches++] = n;
    for (size_t i = 0; i < n; i++) {
        item *it = items[i];
        if (h->active[it->conv])
            h->bad++; /* two jobs of one conversation at once */
        h->active[it->conv] = 1;
    }
    pthread_mutex_unlock(&h->mu);

    for (size_t i = 0; i < n; i++) {
        item *it = items[i];
        if (it->block) {
            pthread_mutex_lock(&h->mu);
            h->blocked++;
            while (!h->gate_open)
                pthread_cond_wait(&h->cv, &h->mu);
            pthread_mutex_unlock(&h->mu);
        }
    }

    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < n; i++) {
        item *it = items[i];
        it->attempts++;
        h->active[it->conv] = 0;
        if (h->nlog < MAX_LOG) {
            h->log_conv[h->nlog] = it->conv;
            h->log_seq[h->nlog] = it->seq;
            h->nlog++;
        }
        if (it->attempts == 1 && it->delay_first_ms >= 0) {
            out[i] = it->delay_first_ms;
            continue;
        }
        if (it->seq <= h->last_seq[it->conv])
            h->bad++; /* out of order */
        h->last_seq[it->conv] = it->seq;
        out[i] = WXG__POOL_FINISHED;
    }
    pthread_mutex_unlock(&h->mu);
}

static void h_cancelled(void *opaque, void *item_)
{
    harness *h = opaque;
    (void)item_;
    h->cancelled++; /* the tests cancel (and destroy) from the main thread only */
}

static void h_pressure(void *opaque, int high)
{
    harness *h = opaque;
    pthread_mutex_lock(&h->mu);
    if (h->last_pressure == high)
        h->bad++; /* calls must alternate */
    h->last_pressure = high;
    h->pressure_calls[high]++;
    pthread_mutex_unlock(&h->mu);
}

static int h_keep(void *opaque, void *it)
{
    (void)opaque;
    return ((item *)it)->keep;
}

static const wxg__pool_ops_t h_ops = {
    .thread_init = h_thread_init,
    .thread_fini = h_thread_fini,
    .run = h_run,
    .cancelled = h_cancelled,
    .pressure = h_pressure,
    .keep_delayed = h_keep,
};

static wxg__pool_t *h_pool(harness *h, unsigned workers, size_t cap, size_t bmax, int64_t delay_us)
{
    wxg__pool_conf_t c = {.workers = workers,
                          .capacity = cap,
                          .batch_max = bmax,
                          .batch_delay_us = delay_us,
                          .high_watermark = 0,
                          .low_watermark = 0};
    char err[256];
    wxg__pool_t *p = wxg__pool_new(&c, &h_ops, h, err, sizeof err);
    assert_non_null(p);
    return p;
}

static int64_t budget_ms(int64_t ms)
{
    return ms * wxg_test_scale();
}

static void jobs_of_one_conversation_run_one_at_a_time_in_order(void **state)
{
    (void)state;
    enum { CONVS = 200, PER = 60 };
    static harness h;
    h_init(&h);
    wxg__pool_t *p = h_pool(&h, 8, CONVS * PER, 16, 200);
    static item items[CONVS * PER];
    int k = 0;
    for (int s = 0; s < PER; s++) {
        for (int c = 0; c < CONVS; c++, k++) {
            items[k] = (item){.conv = c, .seq = s, .delay_first_ms = -1};
            /* Every fifth job asks once for a short re-queue. */
            if (k % 5 == 0)
                items[k].delay_first_ms = k % 3;
            char id[16];
            int len = snprintf(id, sizeof id, "conv-%d", c);
            assert_int_equal(wxg__pool_submit(p, wxg__pool_hash(id, (size_t)len), 7, &items[k]), 0);
        }
    }
    assert_int_equal(wxg__pool_drain(p, budget_ms(30000)), 0);
    assert_int_equal(wxg__pool_submit(p, 1, 7, &items[0]), WXG_ECLOSED);
    wxg__pool_stats_t st;
    wxg__pool_stats(p, &st);
    wxg__pool_destroy(p);
    assert_int_equal(h.bad, 0);
    for (int c = 0; c < CONVS; c++)
        assert_int_equal(h.last_seq[c], PER - 1);
    assert_int_equal(st.submitted, CONVS * PER);
    assert_int_equal(st.finished, CONVS * PER);
    assert_int_equal(st.requeued, (CONVS * PER + 4) / 5);
    assert_int_equal(st.jobs, 0);
    assert_int_equal(st.lanes, 0);
    assert_int_equal(atomic_load(&h.inits), 8);
    assert_int_equal(atomic_load(&h.finis), 8);
    h_fini(&h);
}

static void ready_jobs_that_queued_up_behind_a_busy_worker_form_one_full_batch(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    wxg__pool_t *p = h_pool(&h, 1, 64, 8, 0);
    static item blocker = {.conv = 0, .seq = 0, .delay_first_ms = -1, .block = 1};
    static item rest[12];
    assert_int_equal(wxg__pool_submit(p, 100, 1, &blocker), 0);
    h_wait_blocked(&h, 1);
    for (int i = 0; i < 12; i++) {
        rest[i] = (item){.conv = 1 + i, .seq = 0, .delay_first_ms = -1};
        assert_int_equal(wxg__pool_submit(p, 200 + (uint64_t)i, 1, &rest[i]), 0);
    }
    /* Two jobs of one conversation never share a batch. */
    static item same = {.conv = 1, .seq = 1, .delay_first_ms = -1};
    assert_int_equal(wxg__pool_submit(p, 200, 1, &same), 0);
    h_open_gate(&h);
    assert_int_equal(wxg__pool_drain(p, budget_ms(10000)), 0);
    wxg__pool_stats_t st;
    wxg__pool_stats(p, &st);
    wxg__pool_destroy(p);
    assert_int_equal(h.bad, 0);
    assert_int_equal(h.batch_sizes[0], 1);
    assert_int_equal(h.batch_sizes[1], 8);
    /* The four left over, plus conversation 1's second job, which became ready behind them. */
    assert_int_equal(h.batch_sizes[2], 5);
    assert_int_equal(st.batches, 3);
    assert_int_equal(st.batched_jobs, 14);
    h_fini(&h);
}

static void a_lone_job_runs_after_the_batch_delay_without_company(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    /* A 20 ms delay budget and a batch of 64: a single job must still run (bounded wait). */
    wxg__pool_t *p = h_pool(&h, 2, 16, 64, 20000);
    static item one = {.conv = 3, .seq = 0, .delay_first_ms = -1};
    assert_int_equal(wxg__pool_submit(p, 3, 9, &one), 0);
    assert_int_equal(wxg__pool_wait_tag(p, 9, budget_ms(10000)), 0);
    assert_int_equal(one.attempts, 1);
    assert_int_equal(h.nbatches, 1);
    assert_int_equal(h.batch_sizes[0], 1);
    wxg__pool_destroy(p);
    h_fini(&h);
}

static void submit_last_sends_a_partial_batch_without_waiting_out_the_delay(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    /* An hour of batch delay: only the hint can let these jobs run within the budget. */
    wxg__pool_t *p = h_pool(&h, 1, 16, 64, 3600LL * 1000000);
    static item three[3];
    for (int i = 0; i < 3; i++) {
        three[i] = (item){.conv = 10 + i, .seq = 0, .delay_first_ms = -1};
        int rc = i < 2 ? wxg__pool_submit(p, 10 + (uint64_t)i, 4, &three[i])
                       : wxg__pool_submit_last(p, 10 + (uint64_t)i, 4, &three[i]);
        assert_int_equal(rc, 0);
    }
    assert_int_equal(wxg__pool_wait_tag(p, 4, budget_ms(10000)), 0);
    assert_int_equal(h.nbatches, 1);
    assert_int_equal(h.batch_sizes[0], 3);
    /* The hint ended with the next submit: a new job waits for company again... */
    static item later = {.conv = 20, .seq = 0, .delay_first_ms = -1};
    assert_int_equal(wxg__pool_submit(p, 20, 5, &later), 0);
    assert_int_equal(wxg__pool_wait_tag(p, 5, 50), WXG_ETIMEDOUT);
    assert_int_equal(later.attempts, 0);
    /* ...until the next last one, a job of the same conversation queued behind it. */
    static item last = {.conv = 20, .seq = 1, .delay_first_ms = -1};
    assert_int_equal(wxg__pool_submit_last(p, 20, 5, &last), 0);
    assert_int_equal(wxg__pool_wait_tag(p, 5, budget_ms(10000)), 0);
    assert_int_equal(later.attempts, 1);
    assert_int_equal(last.attempts, 1);
    assert_int_equal(wxg__pool_submit_last(NULL, 1, 1, &last), WXG_EINVAL);
    wxg__pool_destroy(p);
    assert_int_equal(h.bad, 0);
    h_fini(&h);
}

static void a_delayed_job_keeps_its_place_and_does_not_park_a_worker(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    wxg__pool_t *p = h_pool(&h, 1, 16, 4, 0);
    /* Conversation 1: its head asks for a long delay; its second job must wait behind it. */
    static item a1 = {.conv = 1, .seq = 0, .delay_first_ms = 600000};
    static item a2 = {.conv = 1, .seq = 1, .delay_first_ms = -1};
    static item b1 = {.conv = 2, .seq = 0, .delay_first_ms = -1};
    assert_int_equal(wxg__pool_submit(p, 1, 1, &a1), 0);
    assert_int_equal(wxg__pool_submit(p, 1, 1, &a2), 0);
    assert_int_equal(wxg__pool_submit(p, 2, 2, &b1), 0);
    /* The only worker is free to run conversation 2 while 1 waits out its delay. */
    assert_int_equal(wxg__pool_wait_tag(p, 2, budget_ms(10000)), 0);
    assert_int_equal(b1.attempts, 1);
    assert_int_equal(a1.attempts, 1);
    assert_int_equal(a2.attempts, 0);
    wxg__pool_stats_t st;
    wxg__pool_stats(p, &st);
    assert_int_equal(st.delayed, 1);
    assert_int_equal(st.jobs, 2);
    assert_int_equal(st.running, 0);
    assert_true(st.oldest_age_us > 0);

    /* A short delay: the retry runs before the job queued behind it. */
    static item c1 = {.conv = 3, .seq = 0, .delay_first_ms = 5};
    static item c2 = {.conv = 3, .seq = 1, .delay_first_ms = -1};
    assert_int_equal(wxg__pool_submit(p, 3, 3, &c1), 0);
    assert_int_equal(wxg__pool_submit(p, 3, 3, &c2), 0);
    assert_int_equal(wxg__pool_wait_tag(p, 3, budget_ms(10000)), 0);
    pthread_mutex_lock(&h.mu);
    int order[3], n = 0;
    for (int i = 0; i < h.nlog; i++) {
        if (h.log_conv[i] == 3 && n < 3)
            order[n++] = h.log_seq[i];
    }
    pthread_mutex_unlock(&h.mu);
    assert_int_equal(n, 3);
    assert_int_equal(order[0], 0);
    assert_int_equal(order[1], 0);
    assert_int_equal(order[2], 1);

    /* Cancelling tag 1 removes the delayed head and the job behind it. */
    assert_int_equal(wxg__pool_cancel(p, 1), 2);
    assert_int_equal(h.cancelled, 2);
    wxg__pool_stats(p, &st);
    assert_int_equal(st.jobs, 0);
    assert_int_equal(st.delayed, 0);
    assert_int_equal(st.lanes, 0);
    assert_int_equal(wxg__pool_drain(p, budget_ms(1000)), 0);
    wxg__pool_destroy(p);
    assert_int_equal(h.bad, 0);
    h_fini(&h);
}

static void cancel_delayed_removes_a_waiting_head_with_everything_behind_it(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    wxg__pool_t *p =
        h_pool(&h, 1, 16, 1, 0); /* one job per run: a1 and b1 are delayed before c1 blocks */
    static item a1 = {.conv = 1, .seq = 0, .delay_first_ms = 600000};
    static item a2 = {.conv = 1, .seq = 1, .delay_first_ms = -1};
    static item b1 = {.conv = 2, .seq = 0, .delay_first_ms = 600000};
    static item c1 = {.conv = 3, .seq = 0, .delay_first_ms = -1, .block = 1};
    static item c2 = {.conv = 3, .seq = 1, .delay_first_ms = -1};
    assert_int_equal(wxg__pool_submit(p, 1, 1, &a1), 0);
    assert_int_equal(wxg__pool_submit(p, 2, 2, &b1), 0);
    assert_int_equal(wxg__pool_submit(p, 3, 1, &c1), 0);
    h_wait_blocked(&h, 1);
    assert_int_equal(wxg__pool_submit(p, 1, 1, &a2), 0);
    assert_int_equal(wxg__pool_submit(p, 3, 1, &c2), 0);
    wxg__pool_stats_t st;
    wxg__pool_stats(p, &st);
    assert_int_equal(st.delayed, 2);
    /* a1 (delayed) and a2 behind it go; b1 has another tag; c1 runs, c2 is merely queued. */
    assert_int_equal(wxg__pool_cancel_delayed(p, 1), 2);
    wxg__pool_stats(p, &st);
    assert_int_equal(st.delayed, 1);
    assert_int_equal(st.jobs, 3);
    h_open_gate(&h);
    assert_int_equal(wxg__pool_wait_tag(p, 1, budget_ms(10000)), 0);
    assert_int_equal(c2.attempts, 1);
    assert_int_equal(a2.attempts, 0);
    assert_int_equal(h.cancelled, 2);
    wxg__pool_destroy(p);
    assert_int_equal(h.cancelled, 3);
    assert_int_equal(h.bad, 0);
    h_fini(&h);
}

static void cancel_delayed_leaves_what_keep_delayed_keeps(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    wxg__pool_t *p = h_pool(&h, 1, 16, 1, 0);
    /* a1 waits to retry its marker (kept, with a2 behind it); b1 waits out a lease (goes). */
    static item a1 = {.conv = 1, .seq = 0, .delay_first_ms = 600000, .keep = 1};
    static item a2 = {.conv = 1, .seq = 1, .delay_first_ms = -1};
    static item b1 = {.conv = 2, .seq = 0, .delay_first_ms = 600000};
    assert_int_equal(wxg__pool_submit(p, 1, 1, &a1), 0);
    assert_int_equal(wxg__pool_submit(p, 2, 1, &b1), 0);
    wxg__pool_stats_t st;
    int64_t until = wxg_test_now_ms() + budget_ms(10000);
    do {
        wxg__pool_stats(p, &st);
    } while (st.delayed < 2 && wxg_test_now_ms() < until);
    assert_int_equal(st.delayed, 2);
    assert_int_equal(wxg__pool_submit(p, 1, 1, &a2), 0);
    assert_int_equal(wxg__pool_cancel_delayed(p, 1), 1);
    assert_int_equal(h.cancelled, 1);
    wxg__pool_stats(p, &st);
    assert_int_equal(st.delayed, 1);
    assert_int_equal(st.jobs, 2);
    assert_int_equal(wxg__pool_count_tag(p, 1), 2);
    /* A plain cancel still takes everything that does not run. */
    assert_int_equal(wxg__pool_cancel(p, 1), 2);
    assert_int_equal(a2.attempts, 0);
    wxg__pool_destroy(p);
    assert_int_equal(h.cancelled, 3);
    assert_int_equal(h.bad, 0);
    h_fini(&h);
}

static void cancel_skips_running_jobs_and_keeps_the_order_of_the_rest(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    wxg__pool_t *p = h_pool(&h, 1, 16, 1, 0);
    static item run = {.conv = 1, .seq = 0, .delay_first_ms = -1, .block = 1};
    static item x1 = {.conv = 1, .seq = 1, .delay_first_ms = -1};
    static item y1 = {.conv = 1, .seq = 2, .delay_first_ms = -1};
    static item x2 = {.conv = 1, .seq = 3, .delay_first_ms = -1};
    assert_int_equal(wxg__pool_submit(p, 1, 10, &run), 0);
    h_wait_blocked(&h, 1);
    assert_int_equal(wxg__pool_submit(p, 1, 10, &x1), 0);
    assert_int_equal(wxg__pool_submit(p, 1, 20, &y1), 0);
    assert_int_equal(wxg__pool_submit(p, 1, 10, &x2), 0);
    assert_int_equal(wxg__pool_count_tag(p, 10), 3);
    assert_int_equal(wxg__pool_cancel(p, 10), 2); /* x1, x2; the running one stays */
    assert_int_equal(wxg__pool_count_tag(p, 10), 1);
    assert_int_equal(wxg__pool_wait_tag(p, 10, 20), WXG_ETIMEDOUT);
    h_open_gate(&h);
    assert_int_equal(wxg__pool_wait_tag(p, 10, budget_ms(10000)), 0);
    assert_int_equal(wxg__pool_drain(p, budget_ms(10000)), 0);
    wxg__pool_destroy(p);
    assert_int_equal(h.bad, 0);
    assert_int_equal(run.attempts, 1);
    assert_int_equal(y1.attempts, 1);
    assert_int_equal(x1.attempts, 0);
    assert_int_equal(x2.attempts, 0);
    assert_int_equal(h.cancelled, 2);
    h_fini(&h);
}

static void drain_gives_up_after_its_budget_and_destroy_cancels_what_is_left(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    wxg__pool_t *p = h_pool(&h, 1, 16, 1, 0);
    static item stuck = {.conv = 1, .seq = 0, .delay_first_ms = -1, .block = 1};
    static item later = {.conv = 2, .seq = 0, .delay_first_ms = 600000};
    assert_int_equal(wxg__pool_submit(p, 2, 1, &later), 0);
    assert_int_equal(wxg__pool_submit(p, 1, 2, &stuck), 0);
    h_wait_blocked(&h, 1);
    assert_int_equal(wxg__pool_drain(p, 30), WXG_ETIMEDOUT);
    h_open_gate(&h);
    assert_int_equal(wxg__pool_wait_tag(p, 2, budget_ms(10000)), 0);
    /* The stuck job finished; the delayed one would wait ten minutes: still a timeout. */
    assert_int_equal(wxg__pool_drain(p, 30), WXG_ETIMEDOUT);
    assert_int_equal(wxg__pool_count_tag(p, 1), 1);
    wxg__pool_destroy(p);
    assert_int_equal(stuck.attempts, 1);
    assert_int_equal(later.attempts, 1);
    assert_int_equal(h.cancelled, 1);
    h_fini(&h);
}

static void stop_gives_up_on_a_worker_stuck_in_run_and_leaves_the_rest_waiting(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    wxg__pool_t *p = h_pool(&h, 2, 16, 1, 0);
    static item stuck = {.conv = 1, .seq = 0, .delay_first_ms = -1, .block = 1};
    static item later = {.conv = 2, .seq = 0, .delay_first_ms = 600000};
    assert_int_equal(wxg__pool_submit(p, 2, 1, &later), 0);
    assert_int_equal(wxg__pool_submit(p, 1, 2, &stuck), 0);
    h_wait_blocked(&h, 1);
    /* One worker is inside run: the stop gives up on it after its budget, saying so. */
    unsigned running = 99;
    assert_int_equal(wxg__pool_stop(p, 30, &running), WXG_ETIMEDOUT);
    /* The idle worker may take a moment to leave (under valgrind, say); the stuck one stays. */
    int64_t until = wxg_test_now_ms() + budget_ms(10000);
    while (running > 1 && wxg_test_now_ms() < until)
        assert_int_equal(wxg__pool_stop(p, 50, &running), WXG_ETIMEDOUT);
    assert_int_equal(running, 1);
    assert_int_equal(atomic_load(&h.finis), 1); /* the idle worker has exited */
    assert_int_equal(wxg__pool_submit(p, 3, 1, &later), WXG_ECLOSED);
    /* Once run returns, the stuck worker exits too; the delayed job is never run again. */
    h_open_gate(&h);
    assert_int_equal(wxg__pool_stop(p, budget_ms(10000), &running), 0);
    assert_int_equal(running, 0);
    assert_int_equal(atomic_load(&h.finis), 2);
    assert_int_equal(stuck.attempts, 1);
    wxg__pool_destroy(p);
    assert_int_equal(later.attempts, 1);
    assert_int_equal(h.cancelled, 1);
    h_fini(&h);
}

static void watermarks_signal_pressure_once_each_way_and_capacity_is_a_hard_bound(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    wxg__pool_conf_t c = {.workers = 1,
                          .capacity = 10,
                          .batch_max = 1,
                          .batch_delay_us = 0,
                          .high_watermark = 8,
                          .low_watermark = 2};
    char err[256];
    wxg__pool_t *p = wxg__pool_new(&c, &h_ops, &h, err, sizeof err);
    assert_non_null(p);
    static item it[11];
    for (int i = 0; i < 11; i++)
        it[i] = (item){.conv = 1, .seq = i, .delay_first_ms = -1, .block = 1};
    for (int i = 0; i < 10; i++) {
        assert_int_equal(wxg__pool_submit(p, 1, 1, &it[i]), 0);
        pthread_mutex_lock(&h.mu);
        int highs = h.pressure_calls[1];
        pthread_mutex_unlock(&h.mu);
        assert_int_equal(highs, i >= 7 ? 1 : 0);
    }
    assert_int_equal(wxg__pool_submit(p, 1, 1, &it[10]), WXG_EBUSY);
    wxg__pool_stats_t st;
    wxg__pool_stats(p, &st);
    assert_int_equal(st.rejected, 1);
    assert_int_equal(st.above_high, 1);
    assert_int_equal(h.pressure_calls[0], 0);
    h_open_gate(&h);
    assert_int_equal(wxg__pool_drain(p, budget_ms(10000)), 0);
    wxg__pool_stats(p, &st);
    assert_int_equal(st.above_high, 0);
    wxg__pool_destroy(p);
    assert_int_equal(h.pressure_calls[1], 1);
    assert_int_equal(h.pressure_calls[0], 1);
    assert_int_equal(h.bad, 0);
    h_fini(&h);
}

static void a_failing_thread_init_stops_the_pool_from_starting(void **state)
{
    (void)state;
    static harness h;
    h_init(&h);
    h.fail_init_worker = 2;
    wxg__pool_conf_t c = {.workers = 4, .capacity = 4, .batch_max = 1};
    char err[256] = "";
    assert_null(wxg__pool_new(&c, &h_ops, &h, err, sizeof err));
    assert_non_null(strstr(err, "refused on purpose"));
    assert_int_equal(atomic_load(&h.inits), atomic_load(&h.finis));
    c.workers = 0;
    assert_null(wxg__pool_new(&c, &h_ops, &h, err, sizeof err));
    c.workers = 1;
    c.high_watermark = 2;
    c.low_watermark = 2;
    assert_null(wxg__pool_new(&c, &h_ops, &h, err, sizeof err));
    wxg__pool_destroy(NULL);
    h_fini(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(jobs_of_one_conversation_run_one_at_a_time_in_order),
        cmocka_unit_test(ready_jobs_that_queued_up_behind_a_busy_worker_form_one_full_batch),
        cmocka_unit_test(a_lone_job_runs_after_the_batch_delay_without_company),
        cmocka_unit_test(submit_last_sends_a_partial_batch_without_waiting_out_the_delay),
        cmocka_unit_test(a_delayed_job_keeps_its_place_and_does_not_park_a_worker),
        cmocka_unit_test(cancel_delayed_removes_a_waiting_head_with_everything_behind_it),
        cmocka_unit_test(cancel_delayed_leaves_what_keep_delayed_keeps),
        cmocka_unit_test(cancel_skips_running_jobs_and_keeps_the_order_of_the_rest),
        cmocka_unit_test(drain_gives_up_after_its_budget_and_destroy_cancels_what_is_left),
        cmocka_unit_test(stop_gives_up_on_a_worker_stuck_in_run_and_leaves_the_rest_waiting),
        cmocka_unit_test(watermarks_signal_pressure_once_each_way_and_capacity_is_a_hard_bound),
        cmocka_unit_test(a_failing_thread_init_stops_the_pool_from_starting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
