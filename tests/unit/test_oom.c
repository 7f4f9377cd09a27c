/* Out of memory, forced: this binary is linked with malloc, calloc and realloc wrapped
 * (tests/CMakeLists.txt), and OpenSSL's allocations are routed through the same wrappers, so
 * that a test can make exactly the n-th allocation from now fail. Each sweep fails every
 * allocation point of an operation in turn, from the first until the operation no longer
 * reaches the failure: the operation must report WXG_ENOMEM (or NULL), leave nothing behind
 * (valgrind and LeakSanitizer check the leaks) and work again once memory is back.
 *
 * Covered: the decode cache (wxg_decode_cache_new), decoding every JSON reference sample with
 * and without a cache (libxml2's own allocations are not wrapped, so XML samples fail only where
 * the decoder itself allocates), and the per-thread SHA-256 context of lib/key.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wxguard/err.h"
#include "wxguard/key.h"
#include "wxguard/msg.h"

/* How many allocations may still succeed before one fails; -1: none fails. Only the test's own
 * thread arms it, and only around the operation under test. */
static _Atomic long fail_in = -1;
static _Atomic long refused;

/* The linker's names for the C library's allocators, and for the wrappers it calls instead. */
void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);

static int refuse_now(void)
{
    long left = fail_in;
    if (left < 0)
        return 0;
    fail_in = left - 1;
    if (left != 0)
        return 0;
    refused++;
    return 1;
}

void *__wrap_malloc(size_t size)
{
    return refuse_now() ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return refuse_now() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size)
{
    return refuse_now() ? NULL : __real_realloc(p, size);
}

static void *ossl_malloc(size_t size, const char *file, int line)
{
    (void)file;
    (void)line;
    return __wrap_malloc(size);
}

static void *ossl_realloc(void *p, size_t size, const char *file, int line)
{
    (void)file;
    (void)line;
    return __wrap_realloc(p, size);
}

static void ossl_free(void *p, const char *file, int line)
{
    (void)file;
    (void)line;
    free(p);
}

/* Arms the n-th allocation from now to fail; returns how many were refused so far. */
static long arm(long n)
{
    fail_in = n;
    return refused;
}

/* Disarms; returns whether the armed failure happened since arm() returned `before`. */
static int disarm(long before)
{
    fail_in = -1;
    return refused != before;
}

#define SWEEP_MAX 20000

static void decode_cache_new_fails_cleanly_at_every_allocation(void **state)
{
    (void)state;
    long n = 0;
    for (; n < SWEEP_MAX; n++) {
        long before = arm(n);
        wxg_decode_cache_t *c = wxg_decode_cache_new(1 << 20);
        int hit = disarm(before);
        if (!hit) {
            assert_non_null(c);
            wxg_decode_cache_free(c);
            break;
        }
        assert_null(c);
    }
    assert_true(n >= 1); /* the cache does allocate, so the sweep really failed something */
    assert_true(n < SWEEP_MAX);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = __real_malloc((size_t)size + 1);
    assert_non_null(buf);
    *len = fread(buf, 1, (size_t)size, f);
    fclose(f);
    return buf;
}

/* Decodes one record (through `c` when not NULL) with the n-th allocation failing, for every
 * n; returns how many failure points there were. */
static long sweep_decode(const char *buf, size_t len, wxg_decode_cache_t *c, size_t *messages)
{
    wxg_decode_opts_t opts = {.cache = c};
    long n = 0;
    for (; n < SWEEP_MAX; n++) {
        wxg_batch_t *b = NULL;
        char err[256];
        long before = arm(n);
        int rc = wxg_decode(buf, len, &opts, &b, err, sizeof err);
        int hit = disarm(before);
        if (!hit) {
            assert_int_equal(rc, 0);
            *messages = wxg_batch_count(b);
            wxg_batch_free(b);
            return n;
        }
        /* The failure may hit the hashing of a key too, which also reports ENOMEM. */
        assert_int_equal(rc, WXG_ENOMEM);
        assert_null(b);
    }
    fail_msg("no end to the allocations after %d failures", SWEEP_MAX);
    return n;
}

static void decoding_every_json_sample_fails_cleanly_at_every_allocation(void **state)
{
    (void)state;
    const char *src = getenv("WXG_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/samples", src ? src : ".");
    DIR *d = opendir(dir);
    assert_non_null(d);
    wxg_decode_cache_t *c = wxg_decode_cache_new(1 << 20);
    assert_non_null(c);
    size_t samples = 0;
    long points = 0;
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        size_t nl = strlen(e->d_name);
        if (nl < 6 || strcmp(e->d_name + nl - 5, ".json") != 0)
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = 0;
        char *buf = read_file(path, &len);
        /* Samples that do not decode (refused on purpose) are not for this test. */
        wxg_batch_t *b = NULL;
        if (wxg_decode(buf, len, NULL, &b, NULL, 0) != 0) {
            free(buf);
            continue;
        }
        size_t want = wxg_batch_count(b), got = 0;
        wxg_batch_free(b);
        points += sweep_decode(buf, len, c, &got);
        assert_int_equal(got, want);
        got = 0;
        points += sweep_decode(buf, len, NULL, &got); /* the same without a cache */
        assert_int_equal(got, want);
        samples++;
        free(buf);
    }
    closedir(d);
    wxg_decode_cache_free(c);
    print_message("%zu JSON samples, %ld allocation points failed one at a time\n", samples,
                  points);
    assert_true(samples >= 5);
    assert_true(points >= (long)samples); /* every decode allocates */
}

/* On a thread of its own, whose first hash must create the thread's digest context. */
static void *hash_on_a_new_thread(void *arg)
{
    long *points = arg;
    static const char data[] = "wxguard";
    unsigned char out[32], want[32];
    long n = 0;
    for (; n < SWEEP_MAX; n++) {
        long before = arm(n);
        int rc = wxg_sha256(data, sizeof data - 1, out);
        int hit = disarm(before);
        if (!hit) {
            assert_int_equal(rc, 0);
            break;
        }
        assert_int_equal(rc, WXG_ENOMEM);
    }
    /* Memory is back: the same thread hashes correctly (its context was kept or made now). */
    assert_int_equal(wxg_sha256(data, sizeof data - 1, want), 0);
    assert_memory_equal(out, want, 32);
    *points = n;
    return NULL;
}

static void the_per_thread_digest_context_fails_cleanly(void **state)
{
    (void)state;
    unsigned char warm[32];
    /* Let OpenSSL load its SHA-256 implementation before anything is made to fail. */
    assert_int_equal(wxg_sha256("x", 1, warm), 0);
    long points = -1;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hash_on_a_new_thread, &points), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(points >= 1); /* the context's allocation really was failed */
}

int main(void)
{
    /* Before OpenSSL allocates anything: its memory goes through the wrappers too. */
    if (CRYPTO_set_mem_functions(ossl_malloc, ossl_realloc, ossl_free) != 1) {
        fprintf(stderr, "CRYPTO_set_mem_functions refused\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decode_cache_new_fails_cleanly_at_every_allocation),
        cmocka_unit_test(decoding_every_json_sample_fails_cleanly_at_every_allocation),
        cmocka_unit_test(the_per_thread_digest_context_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
