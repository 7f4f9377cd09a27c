/* Unit tests for lib/guard/donecache.c: the near cache remembers a fingerprint with its payload tag
 * until the expiry it was given and not a millisecond longer, replaces the entry that expires
 * first when a set is full, is a no-op when its capacity is 0, and gives every thread the same
 * answers when many use it at once. Times are passed explicitly, so nothing here waits. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "donecache_int.h"

/* A deterministic, well-spread 16-byte fingerprint for (space, i). */
static void make_fp(uint64_t space, uint64_t i, unsigned char fp[16])
{
    uint64_t x = space * 0x100000001b3ULL + i;
    for (int half = 0; half < 2; half++) {
        x += 0x9e3779b97f4a7c15ULL;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        memcpy(fp + 8 * half, &z, 8);
    }
}

static wxg_donecache_t *new_cache(size_t entries)
{
    char err[128] = "";
    wxg_donecache_t *c = wxg__donecache_new(entries, err, sizeof err);
    assert_non_null(c);
    return c;
}

static void an_inserted_fingerprint_is_found_with_its_tag_and_others_miss(void **state)
{
    (void)state;
    wxg_donecache_t *c = new_cache(1024);
    unsigned char a[16], b[16];
    make_fp(1, 1, a);
    make_fp(1, 2, b);
    int tag = 12345;
    assert_int_equal(wxg__donecache_lookup(c, a, 100, &tag), 0);
    assert_int_equal(tag, 12345); /* untouched on a miss */
    wxg__donecache_insert(c, a, -2, 10100, 100);
    assert_int_equal(wxg__donecache_lookup(c, a, 200, &tag), 1);
    assert_int_equal(tag, -2); /* negative 16-bit tags survive */
    assert_int_equal(wxg__donecache_lookup(c, a, 200, NULL), 1);
    assert_int_equal(wxg__donecache_lookup(c, b, 200, &tag), 0);
    /* A fingerprint that differs only in its last byte is another message. */
    unsigned char a2[16];
    memcpy(a2, a, 16);
    a2[15] ^= 1;
    assert_int_equal(wxg__donecache_lookup(c, a2, 200, &tag), 0);
    wxg__donecache_stats_t st;
    wxg__donecache_stats(c, &st);
    assert_int_equal(st.capacity, 1024);
    assert_int_equal(st.used, 1);
    assert_int_equal(st.inserts, 1);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 3);
    assert_int_equal(st.evictions, 0);
    assert_true(st.memory_bytes >= 1024 * 32);
    wxg__donecache_destroy(c);
}

static void the_stored_tag_is_what_a_payload_check_compares_against(void **state)
{
    (void)state;
    wxg_donecache_t *c = new_cache(64);
    unsigned char a[16];
    make_fp(2, 7, a);
    wxg__donecache_insert(c, a, 0x1234, 5000, 0);
    int tag = 0;
    assert_int_equal(wxg__donecache_lookup(c, a, 1, &tag), 1);
    assert_int_equal(tag, 0x1234);
    assert_true(tag != 0x1235); /* a caller with another payload sees a mismatch */
    /* Completing again (e.g. after its retention) overwrites tag and expiry in place. */
    wxg__donecache_insert(c, a, 0x0042, 9000, 4000);
    assert_int_equal(wxg__donecache_lookup(c, a, 8999, &tag), 1);
    assert_int_equal(tag, 0x42);
    wxg__donecache_stats_t st;
    wxg__donecache_stats(c, &st);
    assert_int_equal(st.used, 1);
    assert_int_equal(st.inserts, 2);
    wxg__donecache_destroy(c);
}

static void an_entry_is_live_until_just_before_its_expiry_and_never_after(void **state)
{
    (void)state;
    wxg_donecache_t *c = new_cache(64);
    unsigned char a[16], b[16];
    make_fp(3, 1, a);
    make_fp(3, 2, b);
    wxg__donecache_insert(c, a, 5, 1000, 0);
    assert_int_equal(wxg__donecache_lookup(c, a, 999, NULL), 1);
    assert_int_equal(wxg__donecache_lookup(c, a, 1000, NULL), 0);
    assert_int_equal(wxg__donecache_lookup(c, a, 5000, NULL), 0);
    /* An expiry that is not in the future is not stored at all. */
    wxg__donecache_insert(c, b, 5, 2000, 2000);
    assert_int_equal(wxg__donecache_lookup(c, b, 1999, NULL), 0);
    wxg__donecache_insert(c, b, 5, 0, -10);
    assert_int_equal(wxg__donecache_lookup(c, b, -5, NULL), 0);
    wxg__donecache_stats_t st;
    wxg__donecache_stats(c, &st);
    assert_int_equal(st.inserts, 1);
    wxg__donecache_destroy(c);
}

static void a_full_set_gives_up_an_expired_entry_first_then_the_one_expiring_first(void **state)
{
    (void)state;
    /* Eight entries are one set: every fingerprint competes for the same eight ways. */
    wxg_donecache_t *c = new_cache(WXG__DONECACHE_WAYS);
    unsigned char fp[WXG__DONECACHE_WAYS + 2][16];
    for (int i = 0; i < WXG__DONECACHE_WAYS + 2; i++)
        make_fp(4, (uint64_t)i, fp[i]);
    /* Way i expires at 1000 + i, except entry 3, which expires at 500. */
    for (int i = 0; i < WXG__DONECACHE_WAYS; i++)
        wxg__donecache_insert(c, fp[i], i, i == 3 ? 500 : 1000 + i, 10);
    for (int i = 0; i < WXG__DONECACHE_WAYS; i++)
        assert_int_equal(wxg__donecache_lookup(c, fp[i], 100, NULL), 1);
    /* At 600 entry 3 has expired: the newcomer takes its slot and no live entry is lost. */
    wxg__donecache_insert(c, fp[WXG__DONECACHE_WAYS], 77, 5000, 600);
    wxg__donecache_stats_t st;
    wxg__donecache_stats(c, &st);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.used, WXG__DONECACHE_WAYS);
    for (int i = 0; i < WXG__DONECACHE_WAYS; i++)
        assert_int_equal(wxg__donecache_lookup(c, fp[i], 600, NULL), i != 3);
    assert_int_equal(wxg__donecache_lookup(c, fp[WXG__DONECACHE_WAYS], 600, NULL), 1);
    /* Full of live entries: the one that expires first (entry 0, at 1000) is evicted. */
    wxg__donecache_insert(c, fp[WXG__DONECACHE_WAYS + 1], 78, 6000, 700);
    wxg__donecache_stats(c, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.used, WXG__DONECACHE_WAYS);
    assert_int_equal(wxg__donecache_lookup(c, fp[0], 700, NULL), 0);
    for (int i = 1; i < WXG__DONECACHE_WAYS; i++)
        assert_int_equal(wxg__donecache_lookup(c, fp[i], 700, NULL), i != 3);
    int tag = 0;
    assert_int_equal(wxg__donecache_lookup(c, fp[WXG__DONECACHE_WAYS + 1], 700, &tag), 1);
    assert_int_equal(tag, 78);
    wxg__donecache_destroy(c);
}

static void capacity_zero_remembers_nothing_and_null_is_harmless(void **state)
{
    (void)state;
    wxg_donecache_t *c = new_cache(0);
    unsigned char a[16];
    make_fp(5, 1, a);
    wxg__donecache_insert(c, a, 1, 1000, 0);
    assert_int_equal(wxg__donecache_lookup(c, a, 1, NULL), 0);
    wxg__donecache_stats_t st;
    wxg__donecache_stats(c, &st);
    assert_int_equal(st.capacity, 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.inserts, 0);
    wxg__donecache_destroy(c);

    wxg__donecache_insert(NULL, a, 1, 1000, 0);
    assert_int_equal(wxg__donecache_lookup(NULL, a, 1, NULL), 0);
    memset(&st, 0xff, sizeof st);
    wxg__donecache_stats(NULL, &st);
    assert_int_equal(st.capacity, 0);
    assert_int_equal(st.hits, 0);
    wxg__donecache_destroy(NULL);
}

static void capacity_is_rounded_up_to_whole_sets_and_bounded(void **state)
{
    (void)state;
    wxg_donecache_t *c = new_cache(10);
    wxg__donecache_stats_t st;
    wxg__donecache_stats(c, &st);
    assert_int_equal(st.capacity, 16);
    wxg__donecache_destroy(c);

    char err[128] = "";
    assert_null(wxg__donecache_new(WXG__DONECACHE_MAX_ENTRIES + 1, err, sizeof err));
    assert_non_null(strstr(err, "limit"));
}

/* ---- many threads ---- */

#define THREADS     4
#define PER_THREAD  600
#define SHARED_KEYS 64
#define ROUNDS      20

typedef struct worker_arg {
    wxg_donecache_t *c;
    unsigned id;
    size_t own_hits, own_right_tag, shared_hits, foreign_misses;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    unsigned char fp[16];
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        make_fp(100 + a->id, i, fp);
        wxg__donecache_insert(a->c, fp, (int)(a->id * 1000 + i), 1000000, 1);
        /* Everyone also completes the same shared messages, with the same tag. */
        if (i < SHARED_KEYS) {
            make_fp(99, i, fp);
            wxg__donecache_insert(a->c, fp, 7, 1000000, 1);
        }
    }
    for (int r = 0; r < ROUNDS; r++) {
        for (uint64_t i = 0; i < PER_THREAD; i++) {
            int tag = -1;
            make_fp(100 + a->id, i, fp);
            if (wxg__donecache_lookup(a->c, fp, 2, &tag)) {
                a->own_hits++;
                a->own_right_tag += tag == (int)(a->id * 1000 + i);
            }
            if (i < SHARED_KEYS) {
                make_fp(99, i, fp);
                a->shared_hits += (size_t)wxg__donecache_lookup(a->c, fp, 2, &tag);
            }
            /* Never inserted by anyone. */
            make_fp(500 + a->id, i, fp);
            a->foreign_misses += (size_t)!wxg__donecache_lookup(a->c, fp, 2, NULL);
        }
    }
    return NULL;
}

static void threads_sharing_a_cache_all_find_what_each_of_them_inserted(void **state)
{
    (void)state;
    /* Large enough that no set overflows for these keys (mean 0.3 entries per set; an
     * overflowing set would show up as an eviction below). */
    wxg_donecache_t *c = new_cache(1u << 16);
    pthread_t th[THREADS];
    worker_arg args[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){.c = c, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (unsigned i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (unsigned i = 0; i < THREADS; i++) {
        assert_int_equal(args[i].own_hits, PER_THREAD * ROUNDS);
        assert_int_equal(args[i].own_right_tag, PER_THREAD * ROUNDS);
        assert_int_equal(args[i].shared_hits, SHARED_KEYS * ROUNDS);
        assert_int_equal(args[i].foreign_misses, PER_THREAD * ROUNDS);
    }
    /* Every thread's keys are visible to every other thread afterwards. */
    unsigned char fp[16];
    for (unsigned t = 0; t < THREADS; t++) {
        for (uint64_t i = 0; i < PER_THREAD; i += 37) {
            int tag = -1;
            make_fp(100 + t, i, fp);
            assert_int_equal(wxg__donecache_lookup(c, fp, 3, &tag), 1);
            assert_int_equal(tag, (int)(t * 1000 + i));
        }
    }
    wxg__donecache_stats_t st;
    wxg__donecache_stats(c, &st);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.used, THREADS * PER_THREAD + SHARED_KEYS);
    assert_int_equal(st.inserts, THREADS * (PER_THREAD + SHARED_KEYS));
    wxg__donecache_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(an_inserted_fingerprint_is_found_with_its_tag_and_others_miss),
        cmocka_unit_test(the_stored_tag_is_what_a_payload_check_compares_against),
        cmocka_unit_test(an_entry_is_live_until_just_before_its_expiry_and_never_after),
        cmocka_unit_test(a_full_set_gives_up_an_expired_entry_first_then_the_one_expiring_first),
        cmocka_unit_test(capacity_zero_remembers_nothing_and_null_is_harmless),
        cmocka_unit_test(capacity_is_rounded_up_to_whole_sets_and_bounded),
        cmocka_unit_test(threads_sharing_a_cache_all_find_what_each_of_them_inserted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
