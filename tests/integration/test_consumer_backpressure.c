/* End to end: the pool is full (a small queue, stalling messages) while replicas leave and join
 * (cooperative-sticky, so the remaining replica is assigned more partitions while its pool is
 * full). Partitions assigned while the pool is above its high watermark are paused at once;
 * none stays paused for ever (every committed offset reaches the end); a committed offset,
 * sampled every 100 ms throughout, never passes a message without its effect; a replica
 * resumes only partitions it paused itself; the poll thread never misses
 * max.poll.interval.ms; each message has exactly one effect. And workers that are busy
 * but keep finishing hold the backlog full without a single pause: a pause would make
 * librdkafka drop and refetch everything it had prefetched. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumertest.h"
#include "testenv.h"

#define PARTITIONS 4
#define TOTAL      200
#define ID_BASE    7301234570000000000ULL

static uint64_t *offset_ids[PARTITIONS];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

/* Waits `ms` while sampling the committed offsets every 100 ms: none may pass a message
 * without its effect. */
static void wait_checking(wxg_ct_t *t, int64_t ms)
{
    int64_t until = wxg_test_now_ms() + ms;
    do {
        check_invariant(t);
        wxg_test_sleep_ms(100);
    } while (wxg_test_now_ms() < until);
}

/* Replays the pause and resume lines of replica idx's log: a resume never covers more
 * partitions than the replica has paused itself and not yet resumed (librdkafka would resume
 * a partition that someone else paused, or one never paused). Returns the partitions paused
 * over the run. */
static int assert_resumes_only_what_it_paused(const wxg_ct_t *t, int idx)
{
    char logp[512];
    snprintf(logp, sizeof logp, "%s/replica-%d.log", t->dir, idx);
    FILE *f = fopen(logp, "r");
    assert_non_null(f);
    char line[16384];
    long paused = 0, total = 0, n;
    while (fgets(line, sizeof line, f)) {
        const char *at;
        if ((at = strstr(line, "event=pause partitions=")) != NULL) {
            n = strtol(at + strlen("event=pause partitions="), NULL, 10);
            paused += n;
            total += n;
        } else if ((at = strstr(line, "event=resume partitions=")) != NULL) {
            n = strtol(at + strlen("event=resume partitions="), NULL, 10);
            if (n > paused) {
                fclose(f);
                fail_msg("replica %d resumes %ld partitions with only %ld paused: %s", idx, n,
                         paused, line);
            }
            paused -= n;
        }
    }
    fclose(f);
    return (int)total;
}

/* The partitions replica idx holds now, from its log: with the cooperative protocol each
 * assigned line adds its partitions and each revoked line takes its partitions away. */
static int held(const wxg_ct_t *t, int idx)
{
    return (int)(wxg_ct_log_sum(t, idx, "event=assigned partitions=") -
                 wxg_ct_log_sum(t, idx, "event=revoked partitions="));
}

/* Assignments of one or more partitions in replica idx's log, and those that started paused. */
static int assigned_some(const wxg_ct_t *t, int idx)
{
    return wxg_ct_log_count(t, idx, "event=assigned ") -
           wxg_ct_log_count(t, idx, "event=assigned partitions=0 ");
}

static int assigned_paused(const wxg_ct_t *t, int idx)
{
    return wxg_ct_log_count(t, idx, "paused=true") -
           wxg_ct_log_count(t, idx, "event=assigned partitions=0 protocol=COOPERATIVE paused=true");
}

static void a_full_pool_during_a_rebalance_pauses_and_always_resumes(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-full", PARTITIONS);
    /* The first three messages of every partition stall 3 s in the fail plugin; with one
     * worker and a queue of 8 that keeps the pool full for several seconds at a time. */
    char extra[1024], ids[512];
    size_t at = 0;
    for (int k = 0; k < 12; k++)
        at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%llu", k ? "," : "",
                               (unsigned long long)(ID_BASE + (uint64_t)k));
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = 3000\n"
             "plugin.fail.match.msg_ids = %s\n"
             "consumer.workers = 1\n"
             "consumer.queue.capacity = 8\n"
             "consumer.batch.max = 1\n"
             "consumer.drain.timeout.ms = 5s\n"
             "kafka.max.poll.interval.ms = 10000\n"
             "kafka.partition.assignment.strategy = cooperative-sticky\n",
             ids);
    wxg_ct_write_config(&t, extra);
    static wxg_ct_msg_t msgs[TOTAL];
    for (size_t i = 0; i < TOTAL; i++) {
        int conv = (int)(i % 200);
        msgs[i] = (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = ID_BASE + i, .conv = conv};
    }
    wxg_ct_index_offsets(&t, msgs, TOTAL, offset_ids);
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    /* Either replica may first get all four partitions and hand two over: wait until each
     * holds two. */
    while ((held(&t, 0) != 2 || held(&t, 1) != 2) && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(20);
    assert_int_equal(held(&t, 0), 2);
    assert_int_equal(held(&t, 1), 2);
    wxg_ct_produce(&t, msgs, TOTAL);
    deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (wxg_ct_log_count(&t, 0, "event=pause ") == 0 && wxg_test_now_ms() < deadline)
        wait_checking(&t, 100);
    assert_true(wxg_ct_log_count(&t, 0, "event=pause ") > 0);
    /* Replica 1 leaves while replica 0's pool is full, so replica 0 takes its partitions over,
     * and joins again. Repeat (at most three times) until replica 0 has been handed partitions
     * while its pool was above the high watermark. */
    int st;
    deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    for (int round = 0; round < 3; round++) {
        int before = assigned_some(&t, 0);
        st = wxg_ct_signal(&t, 1, SIGTERM, 60000);
        wxg_ct_assert_exit(&t, 1, st, 0);
        while (assigned_some(&t, 0) == before && wxg_test_now_ms() < deadline)
            wait_checking(&t, 100);
        wxg_ct_spawn(&t, 1);
        if (assigned_paused(&t, 0) > 0)
            break;
        wait_checking(&t, 2000);
    }
    assert_true(assigned_paused(&t, 0) > 0);

    /* Sampled every 100 ms until the end: no committed offset passes a missing effect while
     * partitions are paused and handed around. */
    assert_true(wxg_ct_wait_all_committed_every(&t, 180000, check_invariant, 100));
    check_invariant(&t);
    wxg_ct_assert_each_once(&t, ID_BASE, TOTAL);
    /* Once the load is gone nothing is paused any more; a third replica joins, so the others
     * give partitions up that they never paused: a revoke must not resume those. */
    int revokes0 = wxg_ct_log_count(&t, 0, "event=revoked "),
        revokes1 = wxg_ct_log_count(&t, 1, "event=revoked ");
    wxg_ct_spawn(&t, 2);
    assert_true(wxg_ct_wait_log(&t, 2, "event=assigned partitions=1 ", 1, 60000));
    assert_true(wxg_ct_log_count(&t, 0, "event=revoked ") > revokes0 ||
                wxg_ct_log_count(&t, 1, "event=revoked ") > revokes1);
    for (int i = 0; i < 3; i++) {
        st = wxg_ct_signal(&t, i, SIGTERM, 60000);
        wxg_ct_assert_exit(&t, i, st, 0);
        assert_int_equal(wxg_ct_log_count(&t, i, "MAX_POLL"), 0);
        assert_int_equal(wxg_ct_log_count(&t, i, "maximum poll interval"), 0);
    }
    /* Replica 0 paused (for the backlog, and on assignment), and every resume of any replica
     * covered only partitions it had paused itself. */
    assert_true(assert_resumes_only_what_it_paused(&t, 0) > 0);
    assert_resumes_only_what_it_paused(&t, 1);
    assert_resumes_only_what_it_paused(&t, 2);
    wxg_ct_free_offsets(&t, offset_ids);
    wxg_ct_teardown(&t);
}

static void busy_workers_fill_the_backlog_without_a_pause(void **state)
{
    (void)state;
    enum { N = 300 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-busy", 2);
    /* Every message takes 2 ms in the fail plugin, with one worker and a queue of 8: the
     * backlog fills at once and stays full for the whole run, but the pool drains to its low
     * watermark every few milliseconds, far inside the wait that would pause. */
    wxg_ct_write_config(&t, "plugins = fail,record\n"
                            "plugin.fail.action = stall\n"
                            "plugin.fail.stall.ms = 2\n"
                            "consumer.workers = 1\n"
                            "consumer.queue.capacity = 8\n"
                            "consumer.batch.max = 1\n");
    static wxg_ct_msg_t msgs[N];
    for (size_t i = 0; i < N; i++)
        msgs[i] = (wxg_ct_msg_t){
            .partition = (int)(i % 2), .id = ID_BASE + 1000 + i, .conv = (int)(i % 50)};
    wxg_ct_produce(&t, msgs, N);
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_ct_wait_all_committed(&t, 120000, NULL));
    wxg_ct_assert_each_once(&t, ID_BASE + 1000, N);
    int st = wxg_ct_signal(&t, 0, SIGTERM, 60000);
    wxg_ct_assert_exit(&t, 0, st, 0);
    assert_int_equal(wxg_ct_log_count(&t, 0, "reason=backlog"), 0);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_full_pool_during_a_rebalance_pauses_and_always_resumes),
        cmocka_unit_test(busy_workers_fill_the_backlog_without_a_pause),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
