/* Unit tests for lib/offsets.c, one partition's watermark: the committable offset is the lowest
 * unfinished dispatched offset (or highest + 1), whatever order work finishes in and whatever
 * gaps the offsets have, and completions from an earlier assignment never move it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offsets_int.h"
#include "wxguard/err.h"

static wxg__offsets_t *new_tracker(void)
{
    char err[128];
    wxg__offsets_t *o = wxg__offsets_new(err, sizeof err);
    assert_non_null(o);
    return o;
}

static int64_t committable(const wxg__offsets_t *o)
{
    int64_t off = -42;
    assert_int_equal(wxg__offsets_committable(o, &off), 0);
    return off;
}

static void nothing_dispatched_has_no_position(void **state)
{
    (void)state;
    wxg__offsets_t *o = new_tracker();
    int64_t off;
    assert_int_equal(wxg__offsets_committable(o, &off), WXG_ENOTFOUND);
    assert_int_equal(wxg__offsets_assign(o, NULL), 0);
    assert_int_equal(wxg__offsets_committable(o, &off), WXG_ESTATE);
    wxg__offsets_destroy(o);
    wxg__offsets_destroy(NULL);
}

static void out_of_order_finishes_hold_the_watermark_at_the_lowest_unfinished(void **state)
{
    (void)state;
    wxg__offsets_t *o = new_tracker();
    assert_int_equal(wxg__offsets_assign(o, NULL), 0);
    wxg__offsets_ticket_t tk[5];
    for (int i = 0; i < 5; i++)
        assert_int_equal(wxg__offsets_dispatch(o, 10 + i, &tk[i]), 0);
    assert_int_equal(committable(o), 10);
    assert_int_equal(wxg__offsets_finish(o, &tk[4]), 0);
    assert_int_equal(wxg__offsets_finish(o, &tk[2]), 0);
    assert_int_equal(wxg__offsets_finish(o, &tk[1]), 0);
    assert_int_equal(committable(o), 10);
    assert_int_equal(wxg__offsets_unfinished(o), 2);
    assert_int_equal(wxg__offsets_finish(o, &tk[0]), 0);
    assert_int_equal(committable(o), 13);
    assert_int_equal(wxg__offsets_window(o), 2);
    assert_int_equal(wxg__offsets_finish(o, &tk[3]), 0);
    assert_int_equal(committable(o), 15);
    assert_int_equal(wxg__offsets_window(o), 0);
    /* Finishing twice is refused and changes nothing. */
    assert_int_equal(wxg__offsets_finish(o, &tk[3]), WXG_EINVAL);
    assert_int_equal(committable(o), 15);
    wxg__offsets_destroy(o);
}

static void gaps_in_offsets_never_hold_the_watermark_back(void **state)
{
    (void)state;
    wxg__offsets_t *o = new_tracker();
    assert_int_equal(wxg__offsets_assign(o, NULL), 0);
    wxg__offsets_ticket_t a, b, c;
    assert_int_equal(wxg__offsets_dispatch(o, 5, &a), 0);
    assert_int_equal(wxg__offsets_dispatch(o, 9, &b), 0); /* 6..8 compacted away */
    assert_int_equal(wxg__offsets_dispatch(o, 1000000, &c), 0);
    assert_int_equal(wxg__offsets_finish(o, &a), 0);
    assert_int_equal(committable(o), 9);
    assert_int_equal(wxg__offsets_finish(o, &c), 0);
    assert_int_equal(committable(o), 9);
    assert_int_equal(wxg__offsets_finish(o, &b), 0);
    assert_int_equal(committable(o), 1000001);
    /* A re-fetch of an offset already in hand is refused, not tracked twice. */
    wxg__offsets_ticket_t d;
    assert_int_equal(wxg__offsets_dispatch(o, 9, &d), WXG_ESTATE);
    assert_int_equal(committable(o), 1000001);
    wxg__offsets_destroy(o);
}

static void stale_completion_after_revoke_and_reassign_is_ignored_and_counted(void **state)
{
    (void)state;
    wxg__offsets_t *o = new_tracker();
    uint64_t e1 = 0, e2 = 0;
    assert_int_equal(wxg__offsets_assign(o, &e1), 0);
    wxg__offsets_ticket_t old0, old1;
    assert_int_equal(wxg__offsets_dispatch(o, 0, &old0), 0);
    assert_int_equal(wxg__offsets_dispatch(o, 1, &old1), 0);
    assert_int_equal(wxg__offsets_revoke(o), 0);
    assert_int_equal(wxg__offsets_is_assigned(o), 0);
    /* Finished after the revoke: ignored. */
    assert_int_equal(wxg__offsets_finish(o, &old0), WXG_ESTATE);
    assert_int_equal(wxg__offsets_revoke(o), WXG_ENOTFOUND);

    assert_int_equal(wxg__offsets_assign(o, &e2), 0);
    assert_true(e2 > e1);
    wxg__offsets_ticket_t n1;
    assert_int_equal(wxg__offsets_dispatch(o, 1, &n1), 0);
    /* The old ticket for offset 1 has the same position as the new one; the epoch tells them
     * apart, so it cannot finish the new assignment's offset 1. */
    assert_int_equal(n1.seq, 0);
    assert_int_equal(wxg__offsets_finish(o, &old1), WXG_ESTATE);
    assert_int_equal(committable(o), 1);
    assert_int_equal(wxg__offsets_finish(o, &n1), 0);
    assert_int_equal(committable(o), 2);

    wxg__offsets_stats_t st;
    wxg__offsets_stats(o, &st);
    assert_int_equal(st.stale_finishes, 2);
    assert_int_equal(st.finished, 1);
    assert_int_equal(st.assigns, 2);
    assert_int_equal(st.revokes, 1);
    assert_int_equal(st.assigned, 1);
    assert_int_equal(st.unfinished, 0);
    wxg__offsets_destroy(o);
}

static void dispatch_to_an_unassigned_partition_is_refused(void **state)
{
    (void)state;
    wxg__offsets_t *o = new_tracker();
    wxg__offsets_ticket_t t;
    assert_int_equal(wxg__offsets_dispatch(o, 0, &t), WXG_ENOTFOUND);
    assert_int_equal(wxg__offsets_assign(o, NULL), 0);
    assert_int_equal(wxg__offsets_revoke(o), 0);
    assert_int_equal(wxg__offsets_dispatch(o, 0, &t), WXG_ENOTFOUND);
    assert_int_equal(wxg__offsets_assign(NULL, NULL), WXG_EINVAL);
    assert_int_equal(wxg__offsets_finish(NULL, NULL), WXG_EINVAL);
    wxg__offsets_destroy(o);
}

static void a_large_window_behind_a_stuck_head_grows_and_then_collapses(void **state)
{
    (void)state;
    enum { N = 200000 };
    wxg__offsets_t *o = new_tracker();
    assert_int_equal(wxg__offsets_assign(o, NULL), 0);
    wxg__offsets_ticket_t *tk = calloc(N, sizeof *tk);
    assert_non_null(tk);
    for (int i = 0; i < N; i++)
        assert_int_equal(wxg__offsets_dispatch(o, 2 * (int64_t)i, &tk[i]), 0);
    for (int i = N - 1; i >= 1; i--)
        assert_int_equal(wxg__offsets_finish(o, &tk[i]), 0);
    assert_int_equal(committable(o), 0);
    assert_int_equal(wxg__offsets_window(o), N);
    assert_int_equal(wxg__offsets_unfinished(o), 1);
    assert_int_equal(wxg__offsets_finish(o, &tk[0]), 0);
    assert_int_equal(committable(o), 2 * (int64_t)(N - 1) + 1);
    assert_int_equal(wxg__offsets_window(o), 0);
    free(tk);
    wxg__offsets_destroy(o);
}

static void trackers_of_many_partitions_are_independent(void **state)
{
    (void)state;
    enum { N = 300 };
    wxg__offsets_t *o[N];
    for (int p = 0; p < N; p++) {
        o[p] = new_tracker();
        assert_int_equal(wxg__offsets_assign(o[p], NULL), 0);
        wxg__offsets_ticket_t t;
        assert_int_equal(wxg__offsets_dispatch(o[p], p, &t), 0);
        if (p % 2 == 0)
            assert_int_equal(wxg__offsets_finish(o[p], &t), 0);
    }
    size_t unfinished = 0;
    for (int p = 0; p < N; p++) {
        assert_int_equal(committable(o[p]), p % 2 == 0 ? p + 1 : p);
        wxg__offsets_stats_t st;
        wxg__offsets_stats(o[p], &st);
        assert_int_equal(st.assigned, 1);
        unfinished += st.unfinished;
        wxg__offsets_destroy(o[p]);
    }
    assert_int_equal(unfinished, N / 2);
}

static void advanced_watermarks_are_reported_once_until_they_move(void **state)
{
    (void)state;
    wxg__offsets_t *o = new_tracker();
    int64_t off = -1;
    assert_int_equal(wxg__offsets_advanced(o, &off), 0); /* not assigned */
    assert_int_equal(wxg__offsets_assign(o, NULL), 0);
    assert_int_equal(wxg__offsets_advanced(o, &off), 0); /* no position yet */
    wxg__offsets_ticket_t a, b;
    assert_int_equal(wxg__offsets_dispatch(o, 0, &a), 0);
    assert_int_equal(wxg__offsets_dispatch(o, 1, &b), 0);
    /* Offset 0 is unfinished: committable 0 is reported once (the position is known). */
    assert_int_equal(wxg__offsets_advanced(o, &off), 1);
    assert_int_equal(off, 0);
    assert_int_equal(wxg__offsets_advanced(o, &off), 0);
    assert_int_equal(wxg__offsets_finish(o, &a), 0);
    assert_int_equal(wxg__offsets_advanced(o, &off), 1);
    assert_int_equal(off, 1);
    assert_int_equal(wxg__offsets_advanced(o, &off), 0);
    /* A new assignment reports again from its own first position. */
    assert_int_equal(wxg__offsets_assign(o, NULL), 0);
    assert_int_equal(wxg__offsets_dispatch(o, 0, &a), 0);
    assert_int_equal(wxg__offsets_advanced(o, &off), 1);
    assert_int_equal(off, 0);
    wxg__offsets_destroy(o);
}

/* Concurrency: workers finish tickets in arbitrary order while the poll thread dispatches,
 * reads the watermark and revokes/reassigns one partition, every call under the partition's
 * lock as the consumer makes them. The watermark must never go backwards within an epoch and
 * must end exactly past the last offset. Run under TSan too. */
enum { CW_THREADS = 4, CW_PER_THREAD = 20000 };

typedef struct cw_part {
    pthread_mutex_t mu; /* the owner's lock: serialises every call on wm */
    wxg__offsets_t *wm;
} cw_part;

typedef struct cw_item {
    cw_part *part;
    wxg__offsets_ticket_t t;
} cw_item;

typedef struct cw_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cw_item *items;
    size_t n, taken, cap;
    int closed;
    int bad;
} cw_queue;

static void *cw_worker(void *arg)
{
    cw_queue *q = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (q->taken == q->n && !q->closed)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->taken == q->n && q->closed) {
            pthread_mutex_unlock(&q->mu);
            return NULL;
        }
        /* Take a random not-yet-taken item by swapping it to the front. */
        size_t avail = q->n - q->taken;
        size_t pick = q->taken + (size_t)rand_r(&seed) % avail;
        cw_item it = q->items[pick];
        q->items[pick] = q->items[q->taken];
        q->taken++;
        pthread_mutex_unlock(&q->mu);
        pthread_mutex_lock(&it.part->mu);
        int rc = wxg__offsets_finish(it.part->wm, &it.t);
        pthread_mutex_unlock(&it.part->mu);
        if (rc != 0 && rc != WXG_ESTATE) {
            /* cmocka asserts may not run off the main thread: count and check there. */
            pthread_mutex_lock(&q->mu);
            q->bad++;
            pthread_mutex_unlock(&q->mu);
        }
    }
}

static int64_t cw_committable(cw_part *p)
{
    pthread_mutex_lock(&p->mu);
    int64_t off = committable(p->wm);
    pthread_mutex_unlock(&p->mu);
    return off;
}

static void concurrent_finishes_keep_the_watermark_monotonic(void **state)
{
    (void)state;
    cw_part parts[2];
    for (int i = 0; i < 2; i++) {
        pthread_mutex_init(&parts[i].mu, NULL);
        parts[i].wm = new_tracker();
        assert_int_equal(wxg__offsets_assign(parts[i].wm, NULL), 0);
    }
    cw_queue q = {.cap = CW_THREADS * CW_PER_THREAD};
    pthread_mutex_init(&q.mu, NULL);
    pthread_cond_init(&q.cv, NULL);
    q.items = calloc(q.cap, sizeof *q.items);
    assert_non_null(q.items);
    pthread_t th[CW_THREADS];
    for (int i = 0; i < CW_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, cw_worker, &q), 0);
    int64_t last_seen = -1;
    int64_t next1 = 0;
    for (size_t i = 0; i < q.cap; i++) {
        cw_part *p = &parts[i % 2];
        int64_t off;
        pthread_mutex_lock(&p->mu);
        if (p == &parts[0]) {
            off = (int64_t)(i / 2) * 3; /* gaps of two */
        } else {
            off = next1++;
            if (i == q.cap / 2 + 1) {
                /* Revoke and reassign partition 1 while its work is in flight. */
                assert_int_equal(wxg__offsets_revoke(p->wm), 0);
                assert_int_equal(wxg__offsets_assign(p->wm, NULL), 0);
            }
        }
        cw_item it = {.part = p};
        int rc = wxg__offsets_dispatch(p->wm, off, &it.t);
        pthread_mutex_unlock(&p->mu);
        assert_int_equal(rc, 0);
        pthread_mutex_lock(&q.mu);
        q.items[q.n++] = it;
        pthread_cond_signal(&q.cv);
        pthread_mutex_unlock(&q.mu);
        if (i % 97 == 0) {
            int64_t w = cw_committable(&parts[0]);
            assert_true(w >= last_seen);
            last_seen = w;
        }
    }
    pthread_mutex_lock(&q.mu);
    q.closed = 1;
    pthread_cond_broadcast(&q.cv);
    pthread_mutex_unlock(&q.mu);
    for (int i = 0; i < CW_THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(q.bad, 0);
    assert_int_equal(cw_committable(&parts[0]), (int64_t)(q.cap / 2 - 1) * 3 + 1);
    assert_int_equal(cw_committable(&parts[1]), next1);
    uint64_t finished = 0, stale = 0;
    for (int i = 0; i < 2; i++) {
        wxg__offsets_stats_t st;
        wxg__offsets_stats(parts[i].wm, &st);
        finished += st.finished;
        stale += st.stale_finishes;
        assert_int_equal(st.unfinished, 0);
        wxg__offsets_destroy(parts[i].wm);
        pthread_mutex_destroy(&parts[i].mu);
    }
    assert_int_equal(finished + stale, q.cap);
    assert_true(stale <= q.cap / 2);
    free(q.items);
    pthread_cond_destroy(&q.cv);
    pthread_mutex_destroy(&q.mu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nothing_dispatched_has_no_position),
        cmocka_unit_test(out_of_order_finishes_hold_the_watermark_at_the_lowest_unfinished),
        cmocka_unit_test(gaps_in_offsets_never_hold_the_watermark_back),
        cmocka_unit_test(stale_completion_after_revoke_and_reassign_is_ignored_and_counted),
        cmocka_unit_test(dispatch_to_an_unassigned_partition_is_refused),
        cmocka_unit_test(a_large_window_behind_a_stuck_head_grows_and_then_collapses),
        cmocka_unit_test(trackers_of_many_partitions_are_independent),
        cmocka_unit_test(advanced_watermarks_are_reported_once_until_they_move),
        cmocka_unit_test(concurrent_finishes_keep_the_watermark_monotonic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
