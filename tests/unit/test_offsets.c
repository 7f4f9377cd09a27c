/* Unit tests for lib/offsets.c: the committable offset is the lowest unfinished dispatched
 * offset (or highest + 1), whatever order work finishes in and whatever gaps the offsets have,
 * and completions from an earlier assignment never move it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wxguard/err.h"
#include "wxguard/offsets.h"

static wxg_offsets_t *new_tracker(void)
{
    char err[128];
    wxg_offsets_t *o = wxg_offsets_new(err, sizeof err);
    assert_non_null(o);
    return o;
}

static int64_t committable(wxg_offsets_t *o, const char *t, int32_t p)
{
    int64_t off = -42;
    assert_int_equal(wxg_offsets_committable(o, t, p, &off), 0);
    return off;
}

static void nothing_dispatched_has_no_position(void **state)
{
    (void)state;
    wxg_offsets_t *o = new_tracker();
    int64_t off;
    assert_int_equal(wxg_offsets_committable(o, "t", 0, &off), WXG_ENOTFOUND);
    assert_int_equal(wxg_offsets_assign(o, "t", 0, NULL), 0);
    assert_int_equal(wxg_offsets_committable(o, "t", 0, &off), WXG_ESTATE);
    wxg_offsets_destroy(o);
    wxg_offsets_destroy(NULL);
}

static void out_of_order_finishes_hold_the_watermark_at_the_lowest_unfinished(void **state)
{
    (void)state;
    wxg_offsets_t *o = new_tracker();
    assert_int_equal(wxg_offsets_assign(o, "t", 3, NULL), 0);
    wxg_offsets_ticket_t tk[5];
    for (int i = 0; i < 5; i++)
        assert_int_equal(wxg_offsets_dispatch(o, "t", 3, 10 + i, &tk[i]), 0);
    assert_int_equal(committable(o, "t", 3), 10);
    assert_int_equal(wxg_offsets_finish(&tk[4]), 0);
    assert_int_equal(wxg_offsets_finish(&tk[2]), 0);
    assert_int_equal(wxg_offsets_finish(&tk[1]), 0);
    assert_int_equal(committable(o, "t", 3), 10);
    assert_int_equal(wxg_offsets_unfinished(o, "t", 3), 2);
    assert_int_equal(wxg_offsets_finish(&tk[0]), 0);
    assert_int_equal(committable(o, "t", 3), 13);
    assert_int_equal(wxg_offsets_window(o, "t", 3), 2);
    assert_int_equal(wxg_offsets_finish(&tk[3]), 0);
    assert_int_equal(committable(o, "t", 3), 15);
    assert_int_equal(wxg_offsets_window(o, "t", 3), 0);
    /* Finishing twice is refused and changes nothing. */
    assert_int_equal(wxg_offsets_finish(&tk[3]), WXG_EINVAL);
    assert_int_equal(committable(o, "t", 3), 15);
    wxg_offsets_destroy(o);
}

static void gaps_in_offsets_never_hold_the_watermark_back(void **state)
{
    (void)state;
    wxg_offsets_t *o = new_tracker();
    assert_int_equal(wxg_offsets_assign(o, "t", 0, NULL), 0);
    wxg_offsets_ticket_t a, b, c;
    assert_int_equal(wxg_offsets_dispatch(o, "t", 0, 5, &a), 0);
    assert_int_equal(wxg_offsets_dispatch(o, "t", 0, 9, &b), 0); /* 6..8 compacted away */
    assert_int_equal(wxg_offsets_dispatch(o, "t", 0, 1000000, &c), 0);
    assert_int_equal(wxg_offsets_finish(&a), 0);
    assert_int_equal(committable(o, "t", 0), 9);
    assert_int_equal(wxg_offsets_finish(&c), 0);
    assert_int_equal(committable(o, "t", 0), 9);
    assert_int_equal(wxg_offsets_finish(&b), 0);
    assert_int_equal(committable(o, "t", 0), 1000001);
    /* A re-fetch of an offset already in hand is refused, not tracked twice. */
    wxg_offsets_ticket_t d;
    assert_int_equal(wxg_offsets_dispatch(o, "t", 0, 9, &d), WXG_ESTATE);
    assert_int_equal(committable(o, "t", 0), 1000001);
    wxg_offsets_destroy(o);
}

static void stale_completion_after_revoke_and_reassign_is_ignored_and_counted(void **state)
{
    (void)state;
    wxg_offsets_t *o = new_tracker();
    uint64_t e1 = 0, e2 = 0;
    assert_int_equal(wxg_offsets_assign(o, "t", 1, &e1), 0);
    wxg_offsets_ticket_t old0, old1;
    assert_int_equal(wxg_offsets_dispatch(o, "t", 1, 0, &old0), 0);
    assert_int_equal(wxg_offsets_dispatch(o, "t", 1, 1, &old1), 0);
    assert_int_equal(wxg_offsets_revoke(o, "t", 1), 0);
    assert_int_equal(wxg_offsets_is_assigned(o, "t", 1), 0);
    /* Finished after the revoke: ignored. */
    assert_int_equal(wxg_offsets_finish(&old0), WXG_ESTATE);
    assert_int_equal(wxg_offsets_revoke(o, "t", 1), WXG_ENOTFOUND);

    assert_int_equal(wxg_offsets_assign(o, "t", 1, &e2), 0);
    assert_true(e2 > e1);
    wxg_offsets_ticket_t n1;
    assert_int_equal(wxg_offsets_dispatch(o, "t", 1, 1, &n1), 0);
    /* The old ticket for offset 1 has the same position as the new one; the epoch tells them
     * apart, so it cannot finish the new assignment's offset 1. */
    assert_int_equal(n1.seq, 0);
    assert_int_equal(wxg_offsets_finish(&old1), WXG_ESTATE);
    assert_int_equal(committable(o, "t", 1), 1);
    assert_int_equal(wxg_offsets_finish(&n1), 0);
    assert_int_equal(committable(o, "t", 1), 2);

    wxg_offsets_stats_t st;
    wxg_offsets_stats(o, &st);
    assert_int_equal(st.stale_finishes, 2);
    assert_int_equal(st.finished, 1);
    assert_int_equal(st.assigns, 2);
    assert_int_equal(st.revokes, 1);
    assert_int_equal(st.assigned, 1);
    assert_int_equal(st.unfinished, 0);
    wxg_offsets_destroy(o);
}

static void dispatch_to_an_unassigned_partition_is_refused(void **state)
{
    (void)state;
    wxg_offsets_t *o = new_tracker();
    wxg_offsets_ticket_t t;
    assert_int_equal(wxg_offsets_dispatch(o, "t", 0, 0, &t), WXG_ENOTFOUND);
    assert_int_equal(wxg_offsets_assign(o, "t", 0, NULL), 0);
    assert_int_equal(wxg_offsets_revoke(o, "t", 0), 0);
    assert_int_equal(wxg_offsets_dispatch(o, "t", 0, 0, &t), WXG_ENOTFOUND);
    assert_int_equal(wxg_offsets_assign(NULL, "t", 0, NULL), WXG_EINVAL);
    assert_int_equal(wxg_offsets_finish(NULL), WXG_EINVAL);
    wxg_offsets_destroy(o);
}

static void a_large_window_behind_a_stuck_head_grows_and_then_collapses(void **state)
{
    (void)state;
    enum { N = 200000 };
    wxg_offsets_t *o = new_tracker();
    assert_int_equal(wxg_offsets_assign(o, "big", 0, NULL), 0);
    wxg_offsets_ticket_t *tk = calloc(N, sizeof *tk);
    assert_non_null(tk);
    for (int i = 0; i < N; i++)
        assert_int_equal(wxg_offsets_dispatch(o, "big", 0, 2 * (int64_t)i, &tk[i]), 0);
    for (int i = N - 1; i >= 1; i--)
        assert_int_equal(wxg_offsets_finish(&tk[i]), 0);
    assert_int_equal(committable(o, "big", 0), 0);
    assert_int_equal(wxg_offsets_window(o, "big", 0), N);
    assert_int_equal(wxg_offsets_unfinished(o, "big", 0), 1);
    assert_int_equal(wxg_offsets_finish(&tk[0]), 0);
    assert_int_equal(committable(o, "big", 0), 2 * (int64_t)(N - 1) + 1);
    assert_int_equal(wxg_offsets_window(o, "big", 0), 0);
    free(tk);
    wxg_offsets_destroy(o);
}

static void many_partitions_are_tracked_independently(void **state)
{
    (void)state;
    wxg_offsets_t *o = new_tracker();
    char topic[32];
    for (int p = 0; p < 300; p++) {
        snprintf(topic, sizeof topic, "topic-%d", p % 7);
        assert_int_equal(wxg_offsets_assign(o, topic, p, NULL), 0);
        wxg_offsets_ticket_t t;
        assert_int_equal(wxg_offsets_dispatch(o, topic, p, p, &t), 0);
        if (p % 2 == 0)
            assert_int_equal(wxg_offsets_finish(&t), 0);
    }
    for (int p = 0; p < 300; p++) {
        snprintf(topic, sizeof topic, "topic-%d", p % 7);
        assert_int_equal(committable(o, topic, p), p % 2 == 0 ? p + 1 : p);
    }
    wxg_offsets_stats_t st;
    wxg_offsets_stats(o, &st);
    assert_int_equal(st.assigned, 300);
    assert_int_equal(st.unfinished, 150);
    wxg_offsets_destroy(o);
}

typedef struct seen {
    int calls;
    int64_t last;
    int refuse;
} seen;

static int record_advanced(void *opaque, const char *topic, int32_t partition, int64_t offset,
                           uint64_t epoch)
{
    (void)topic;
    (void)partition;
    (void)epoch;
    seen *s = opaque;
    s->calls++;
    s->last = offset;
    return s->refuse;
}

static void advanced_watermarks_are_reported_once_until_they_move(void **state)
{
    (void)state;
    wxg_offsets_t *o = new_tracker();
    assert_int_equal(wxg_offsets_assign(o, "t", 0, NULL), 0);
    seen s = {0, -1, 0};
    assert_int_equal(wxg_offsets_foreach_advanced(o, record_advanced, &s), 0);
    wxg_offsets_ticket_t a, b;
    assert_int_equal(wxg_offsets_dispatch(o, "t", 0, 0, &a), 0);
    assert_int_equal(wxg_offsets_dispatch(o, "t", 0, 1, &b), 0);
    /* Offset 0 is unfinished: committable 0 is reported once (the position is known). */
    assert_int_equal(wxg_offsets_foreach_advanced(o, record_advanced, &s), 1);
    assert_int_equal(s.last, 0);
    assert_int_equal(wxg_offsets_foreach_advanced(o, record_advanced, &s), 0);
    assert_int_equal(wxg_offsets_finish(&a), 0);
    s.refuse = 1;
    assert_int_equal(wxg_offsets_foreach_advanced(o, record_advanced, &s), 1);
    assert_int_equal(s.last, 1);
    s.refuse = 0;
    /* A refused report comes again. */
    assert_int_equal(wxg_offsets_foreach_advanced(o, record_advanced, &s), 1);
    assert_int_equal(wxg_offsets_foreach_advanced(o, record_advanced, &s), 0);
    assert_int_equal(wxg_offsets_foreach_committable(o, record_advanced, &s), 1);
    assert_int_equal(s.last, 1);
    wxg_offsets_destroy(o);
}

/* Concurrency: workers finish tickets in arbitrary order while the poll thread dispatches,
 * reads the watermark and revokes/reassigns one partition. The watermark must never go
 * backwards within an epoch and must end exactly past the last offset. Run under TSan too. */
enum { CW_THREADS = 4, CW_PER_THREAD = 20000 };

typedef struct cw_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    wxg_offsets_ticket_t *items;
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
        wxg_offsets_ticket_t t = q->items[pick];
        q->items[pick] = q->items[q->taken];
        q->taken++;
        pthread_mutex_unlock(&q->mu);
        int rc = wxg_offsets_finish(&t);
        if (rc != 0 && rc != WXG_ESTATE) {
            /* cmocka asserts may not run off the main thread: count and check there. */
            pthread_mutex_lock(&q->mu);
            q->bad++;
            pthread_mutex_unlock(&q->mu);
        }
    }
}

static void concurrent_finishes_keep_the_watermark_monotonic(void **state)
{
    (void)state;
    wxg_offsets_t *o = new_tracker();
    cw_queue q = {.cap = CW_THREADS * CW_PER_THREAD};
    pthread_mutex_init(&q.mu, NULL);
    pthread_cond_init(&q.cv, NULL);
    q.items = calloc(q.cap, sizeof *q.items);
    assert_non_null(q.items);
    assert_int_equal(wxg_offsets_assign(o, "c", 0, NULL), 0);
    assert_int_equal(wxg_offsets_assign(o, "c", 1, NULL), 0);
    pthread_t th[CW_THREADS];
    for (int i = 0; i < CW_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, cw_worker, &q), 0);
    int64_t last_seen = -1;
    int64_t next1 = 0;
    for (size_t i = 0; i < q.cap; i++) {
        wxg_offsets_ticket_t t;
        int32_t part = (int32_t)(i % 2);
        int64_t off;
        if (part == 0) {
            off = (int64_t)(i / 2) * 3; /* gaps of two */
        } else {
            off = next1++;
            if (i == q.cap / 2) {
                /* Revoke and reassign partition 1 while its work is in flight. */
                assert_int_equal(wxg_offsets_revoke(o, "c", 1), 0);
                assert_int_equal(wxg_offsets_assign(o, "c", 1, NULL), 0);
            }
        }
        assert_int_equal(wxg_offsets_dispatch(o, "c", part, off, &t), 0);
        pthread_mutex_lock(&q.mu);
        q.items[q.n++] = t;
        pthread_cond_signal(&q.cv);
        pthread_mutex_unlock(&q.mu);
        if (i % 97 == 0) {
            int64_t w;
            assert_int_equal(wxg_offsets_committable(o, "c", 0, &w), 0);
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
    assert_int_equal(committable(o, "c", 0), (int64_t)(q.cap / 2 - 1) * 3 + 1);
    assert_int_equal(committable(o, "c", 1), next1);
    wxg_offsets_stats_t st;
    wxg_offsets_stats(o, &st);
    assert_int_equal(st.finished + st.stale_finishes, q.cap);
    assert_true(st.stale_finishes <= q.cap / 2);
    assert_int_equal(st.unfinished, 0);
    free(q.items);
    pthread_cond_destroy(&q.cv);
    pthread_mutex_destroy(&q.mu);
    wxg_offsets_destroy(o);
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
        cmocka_unit_test(many_partitions_are_tracked_independently),
        cmocka_unit_test(advanced_watermarks_are_reported_once_until_they_move),
        cmocka_unit_test(concurrent_finishes_keep_the_watermark_monotonic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
