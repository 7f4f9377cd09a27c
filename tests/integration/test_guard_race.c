/* Races: 16 threads sharing 4 guard connections hammer the same 10,000 keys, each delivered
 * 3-5 times in random order, with random handler times, claiming in batches. Each key must be
 * claimed and completed exactly once; every other delivery sees BUSY or DUPLICATE; a BUSY
 * delivery is retried and never counted as done; a DUPLICATE is only ever seen after the one
 * owner had started to complete. With WXG_TEST_GUARD_TLS=1 (integration.test_guard_race_tls)
 * the same race runs against a private TLS-only server, and with WXG_TEST_GUARD_CLUSTER=1
 * (integration.test_guard_race_cluster) against a private Redis Cluster of 3 primaries. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guardtest.h"
#include "testenv.h"
#include "wxguard/guard.h"

enum { NKEYS = 10000, NTHREADS = 16, NCONN = 4, CHUNK = 8 };

typedef struct conn {
    pthread_mutex_t mu; /* a handle is used by one thread at a time */
    wxg_guard_t *g;
} conn;

static struct {
    conn conns[NCONN];
    char keys[NKEYS][40];
    int *deliveries;
    size_t ndeliveries;
    atomic_size_t next;
    atomic_int claims[NKEYS];
    atomic_int completes[NKEYS];
    atomic_int completing[NKEYS];
    atomic_long busy, duplicates, violations, errors;
    int64_t deadline;
} R;

static void violation(const char *what, int key)
{
    atomic_fetch_add(&R.violations, 1);
    fprintf(stderr, "violation: %s (key %d)\n", what, key);
}

/* Sends one delivery until it resolves to CLAIMED+complete or DUPLICATE. */
static void resolve(conn *c, int k, unsigned *seed, wxg_guard_claim_t *first)
{
    wxg_guard_claim_t cl;
    int have = first != NULL;
    if (have)
        cl = *first;
    for (;;) {
        if (!have) {
            pthread_mutex_lock(&c->mu);
            int rc = wxg_guard_claim(c->g, R.keys[k], strlen(R.keys[k]), NULL, &cl);
            pthread_mutex_unlock(&c->mu);
            if (rc != 0) {
                atomic_fetch_add(&R.errors, 1);
                return;
            }
        }
        have = 0;
        if (cl.outcome == WXG_GUARD_CLAIMED) {
            if (atomic_fetch_add(&R.claims[k], 1) != 0)
                violation("claimed twice", k);
            /* A first claim's fence is the server's clock in microseconds. */
            if (cl.ticket.fence < 1000000000000000ULL)
                violation("first claim without a clock fence", k);
            /* The handler: 0-2 ms of work. */
            wxg_test_sleep_ms(rand_r(seed) % 3);
            atomic_store(&R.completing[k], 1);
            int already = 0;
            pthread_mutex_lock(&c->mu);
            int rc = wxg_guard_complete(c->g, &cl.ticket, &already);
            pthread_mutex_unlock(&c->mu);
            if (rc != 0 || already)
                violation("complete by the owner refused", k);
            atomic_fetch_add(&R.completes[k], 1);
            wxg_guard_claim_clear(&cl);
            return;
        }
        if (cl.outcome == WXG_GUARD_DUPLICATE) {
            if (!atomic_load(&R.completing[k]))
                violation("DUPLICATE before the owner completed", k);
            atomic_fetch_add(&R.duplicates, 1);
            return;
        }
        /* BUSY: not done. Retry later, within the test's time bound. */
        atomic_fetch_add(&R.busy, 1);
        if (wxg_test_now_ms() > R.deadline) {
            atomic_fetch_add(&R.errors, 1);
            return;
        }
        wxg_test_sleep_ms(1);
    }
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    unsigned seed = 0x9e3779b9u * (unsigned)(id + 1);
    conn *c = &R.conns[id % NCONN];
    for (;;) {
        size_t start = atomic_fetch_add(&R.next, CHUNK);
        if (start >= R.ndeliveries)
            break;
        size_t n = R.ndeliveries - start < CHUNK ? R.ndeliveries - start : CHUNK;
        wxg_guard_msg_t msgs[CHUNK];
        wxg_guard_claim_t out[CHUNK];
        for (size_t i = 0; i < n; i++) {
            int k = R.deliveries[start + i];
            msgs[i] = (wxg_guard_msg_t){R.keys[k], strlen(R.keys[k]), NULL};
        }
        pthread_mutex_lock(&c->mu);
        int rc = wxg_guard_claim_batch(c->g, msgs, n, out);
        pthread_mutex_unlock(&c->mu);
        if (rc != 0) {
            atomic_fetch_add(&R.errors, 1);
            continue;
        }
        for (size_t i = 0; i < n; i++)
            resolve(c, R.deliveries[start + i], &seed, &out[i]);
    }
    return NULL;
}

static void every_key_is_claimed_and_completed_exactly_once_under_16_threads(void **state)
{
    (void)state;
    char prefix[64];
    wxg_guard_conf_t conf;
    gt_conf(&conf, wxg_test_redis_host(), wxg_test_redis_port(), "race", prefix, sizeof prefix);
    /* integration.test_guard_race_tls: the same race against a private TLS-only server. */
    wxg_test_redis_t tls_server = {0};
    char *pki = gt_tls_target(&tls_server, &conf);
    /* integration.test_guard_race_cluster: the same race against a private Redis Cluster. */
    static wxg_test_cluster_t cluster;
    int in_cluster = gt_cluster_target(&cluster, &conf);
    conf.lease_ms = 60000; /* no lease may expire here: exclusivity alone is under test */
    conf.command_timeout_ms = 10000 * wxg_test_scale();
    for (int i = 0; i < NCONN; i++) {
        pthread_mutex_init(&R.conns[i].mu, NULL);
        R.conns[i].g = gt_open(&conf);
    }
    unsigned seed = 12345;
    R.deliveries = malloc(sizeof(int) * NKEYS * 5);
    assert_non_null(R.deliveries);
    for (int k = 0; k < NKEYS; k++) {
        snprintf(R.keys[k], sizeof R.keys[k], "wxid_racebot:n:%lld", 7300000000LL + k);
        int copies = 3 + rand_r(&seed) % 3;
        for (int j = 0; j < copies; j++)
            R.deliveries[R.ndeliveries++] = k;
    }
    for (size_t i = R.ndeliveries - 1; i > 0; i--) {
        size_t j = (size_t)rand_r(&seed) % (i + 1);
        int t = R.deliveries[i];
        R.deliveries[i] = R.deliveries[j];
        R.deliveries[j] = t;
    }
    R.deadline = wxg_test_now_ms() + 100000LL * wxg_test_scale();

    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);

    assert_int_equal(atomic_load(&R.errors), 0);
    assert_int_equal(atomic_load(&R.violations), 0);
    for (int k = 0; k < NKEYS; k++) {
        assert_int_equal(atomic_load(&R.claims[k]), 1);
        assert_int_equal(atomic_load(&R.completes[k]), 1);
    }
    /* Every delivery resolved: one claim per key, DUPLICATE for all the others. */
    assert_int_equal((size_t)atomic_load(&R.duplicates), R.ndeliveries - NKEYS);
    uint64_t claimed = 0, lost = 0;
    for (int i = 0; i < NCONN; i++) {
        wxg_guard_stats_t st;
        wxg_guard_get_stats(R.conns[i].g, &st);
        claimed += st.claimed;
        lost += st.lease_lost;
    }
    assert_int_equal(claimed, NKEYS);
    assert_int_equal(lost, 0);
    /* Copies of one key inside one claim batch guarantee that BUSY paths ran. */
    assert_true(atomic_load(&R.busy) > 0);
    printf("deliveries=%zu busy=%ld duplicates=%ld\n", R.ndeliveries, atomic_load(&R.busy),
           atomic_load(&R.duplicates));
    for (int i = 0; i < NCONN; i++) {
        wxg_guard_destroy(R.conns[i].g);
        pthread_mutex_destroy(&R.conns[i].mu);
    }
    free(R.deliveries);
    gt_tls_target_stop(&tls_server, pki);
    gt_cluster_target_stop(&cluster, in_cluster);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_key_is_claimed_and_completed_exactly_once_under_16_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
