/* End to end: messages that cannot be processed are parked, never dropped, and never block the
 * partition for good; a plugin slower than the lease keeps its claim and runs once.
 *  - an undecodable record and a message whose plugin always fails each land in the dead-letter
 *    topic with the original bytes and the wxg-dlq-* headers; the messages after them are
 *    processed; the committed offset, sampled every 50 ms, passes them only once their
 *    dead-letter record exists;
 *  - a plugin stalling for three leases: the watchdog renews the lease, a duplicate of the same
 *    message on another partition (another replica) sees BUSY, then DUPLICATE, and the effect
 *    happens once; no lease is lost (each replica's final counts);
 *  - a message whose plugin asks for a retry every time: after consumer.retry.max attempts it
 *    goes to the dead-letter topic with its attempts, the partition moves on past it (the
 *    offset, sampled every 50 ms, only once it is parked) and nothing else is dropped. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumertest.h"
#include "testenv.h"
#include "testkafka.h"

#define ID_BASE 7301234567000000000ULL

typedef struct dlq_rec {
    char *value;
    char hdr_topic[256], hdr_offset[32], hdr_error[64], hdr_attempts[16];
} dlq_rec;

static const char *hdr(rd_kafka_headers_t *h, const char *name, char *buf, size_t size)
{
    const void *v;
    size_t len;
    buf[0] = '\0';
    if (h && rd_kafka_header_get_last(h, name, &v, &len) == RD_KAFKA_RESP_ERR_NO_ERROR && v) {
        if (len >= size)
            len = size - 1;
        memcpy(buf, v, len);
        buf[len] = '\0';
    }
    return buf;
}

/* Reads up to `want` records of the dead-letter topic (partition 0) from the beginning. */
static int read_dlq(const wxg_ct_t *t, dlq_rec *out, int want, int timeout_ms)
{
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    char *group = wxg_test_kafka_name("ct-dlq-reader");
    wxg_test_kafka_conf_set(conf, "group.id", group); /* assign() needs one; nothing commits */
    wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
    free(group);
    char err[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, t->dlq, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    assert_int_equal(rd_kafka_assign(rk, l), 0);
    rd_kafka_topic_partition_list_destroy(l);
    int got = 0;
    int64_t deadline = wxg_test_now_ms() + (int64_t)timeout_ms * wxg_test_scale();
    while (got < want && wxg_test_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (!m->err && out) {
            rd_kafka_headers_t *h = NULL;
            rd_kafka_message_headers(m, &h);
            /* The payload is not NUL-terminated: copy exactly m->len bytes (strndup would
             * look for a NUL past the end, which ASan's strict string checks report). */
            out[got].value = malloc(m->len + 1);
            assert_non_null(out[got].value);
            if (m->len > 0)
                memcpy(out[got].value, m->payload, m->len);
            out[got].value[m->len] = '\0';
            hdr(h, "wxg-dlq-original-topic", out[got].hdr_topic, sizeof out[got].hdr_topic);
            hdr(h, "wxg-dlq-original-offset", out[got].hdr_offset, sizeof out[got].hdr_offset);
            hdr(h, "wxg-dlq-error", out[got].hdr_error, sizeof out[got].hdr_error);
            hdr(h, "wxg-dlq-attempts", out[got].hdr_attempts, sizeof out[got].hdr_attempts);
        }
        if (!m->err)
            got++;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return got;
}

/* Asserts that the ledger holds `want` effects, none of them of message `id`. */
static void assert_effects_without(const wxg_ct_t *t, size_t want, uint64_t id)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    assert_int_equal(n, want);
    for (size_t i = 0; i < n; i++)
        assert_true(eff[i].id != id);
    free(eff);
}

#define POISON_OFFSET  5
#define FAILING_OFFSET 11

/* Dead letters seen so far: once there, a record stays, so the topic is read again only when
 * the committed offset asks for more than were seen. */
static int dlq_seen;

static void commit_never_passes_a_parked_record_before_its_dead_letter(wxg_ct_t *t)
{
    /* The offset first, then the topic: a dead letter written before the commit is there. */
    int64_t c = wxg_ct_committed(t, 0);
    int need = c > FAILING_OFFSET ? 2 : c > POISON_OFFSET ? 1 : 0;
    if (need > dlq_seen) {
        dlq_seen = read_dlq(t, NULL, need, 2000);
        if (dlq_seen < need)
            fail_msg("committed offset %lld passes %d parked record(s), the dead-letter topic "
                     "holds %d",
                     (long long)c, need, dlq_seen);
    }
}

static void poison_and_failing_messages_are_parked_and_the_partition_keeps_flowing(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-dlq", 1);
    char extra[512];
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = fail\n"
             "plugin.fail.reason = refused by the test\n"
             "plugin.fail.match.msg_ids = %llu\n",
             (unsigned long long)(ID_BASE + 100));
    wxg_ct_write_config(&t, extra);

    wxg_ct_msg_t good[5];
    for (int i = 0; i < 5; i++)
        good[i] = (wxg_ct_msg_t){.partition = 0, .id = ID_BASE + (uint64_t)i, .conv = 1};
    wxg_ct_produce(&t, good, 5);                     /* offsets 0..4 */
    wxg_ct_produce_raw(&t, 0, "{\"account\": oops"); /* offset 5: does not decode */
    for (int i = 0; i < 5; i++)
        good[i].id = ID_BASE + 10 + (uint64_t)i;
    wxg_ct_produce(&t, good, 5); /* offsets 6..10 */
    wxg_ct_msg_t failing = {.partition = 0, .id = ID_BASE + 100, .conv = 2};
    wxg_ct_produce(&t, &failing, 1); /* offset 11: its plugin always fails */
    for (int i = 0; i < 5; i++)
        good[i].id = ID_BASE + 20 + (uint64_t)i;
    wxg_ct_produce(&t, good, 5); /* offsets 12..16 */

    wxg_ct_spawn(&t, 0);
    /* The committed offset is sampled every 50 ms: each time it moves past a parked record,
     * the dead-letter topic already holds it. */
    dlq_seen = 0;
    assert_true(wxg_ct_wait_all_committed_every(
        &t, 60000, commit_never_passes_a_parked_record_before_its_dead_letter, 50));

    dlq_rec recs[3];
    memset(recs, 0, sizeof recs);
    assert_int_equal(read_dlq(&t, recs, 3, 3000), 2);
    /* The two are parked by different workers (different conversations), in either order. */
    if (strcmp(recs[0].hdr_offset, "5") != 0) {
        dlq_rec tmp = recs[0];
        recs[0] = recs[1];
        recs[1] = tmp;
    }
    assert_string_equal(recs[0].value, "{\"account\": oops");
    assert_string_equal(recs[0].hdr_topic, t.topic);
    assert_string_equal(recs[0].hdr_offset, "5");
    assert_string_equal(recs[0].hdr_error, "EPARSE");
    assert_non_null(strstr(recs[1].value, "7301234567000000100"));
    assert_string_equal(recs[1].hdr_offset, "11");
    assert_string_equal(recs[1].hdr_error, "EPLUGIN");
    assert_string_equal(recs[1].hdr_attempts, "1");
    for (int i = 0; i < 2; i++)
        free(recs[i].value);

    /* Every good message had its effect; the failing one none. */
    assert_effects_without(&t, 15, ID_BASE + 100);
    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    wxg_ct_assert_exit(&t, 0, st, 0);
    wxg_ct_teardown(&t);
}

static void a_plugin_slower_than_the_lease_keeps_its_claim_and_runs_once(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-lease", 2);
    char extra[512];
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = stall\n"
             "plugin.fail.stall.ms = 3000\n"
             "plugin.fail.match.msg_ids = %llu\n"
             "guard.lease.ms = 1000\n",
             (unsigned long long)(ID_BASE + 7));
    wxg_ct_write_config(&t, extra);
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    /* Both replicas hold one partition each before the stalled message arrives, so that the
     * second copy is claimed by the other replica while the first is still stalled. */
    assert_true(wxg_ct_wait_log(&t, 0, "event=assigned partitions=1 ", 1, 30000));
    assert_true(wxg_ct_wait_log(&t, 1, "event=assigned partitions=1 ", 1, 30000));
    /* The same message on both partitions. */
    wxg_ct_msg_t m[4] = {
        {.partition = 0, .id = ID_BASE + 7, .conv = 3},
        {.partition = 1, .id = ID_BASE + 7, .conv = 4},
        {.partition = 0, .id = ID_BASE + 8, .conv = 3},
        {.partition = 1, .id = ID_BASE + 9, .conv = 4},
    };
    wxg_ct_produce(&t, m, 4);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&t, &eff, NULL);
    int slow = 0;
    for (size_t i = 0; i < n; i++)
        slow += eff[i].id == ID_BASE + 7;
    assert_int_equal(slow, 1);
    assert_int_equal(n, 3);
    free(eff);
    for (int i = 0; i < 2; i++) {
        int st = wxg_ct_signal(&t, i, SIGTERM, 30000);
        wxg_ct_assert_exit(&t, i, st, 0);
    }
    /* From each replica's final counts: the second copy found the first owner's live lease
     * (BUSY) and waited, and then found it DONE; nobody lost the lease while the plugin
     * stalled for three lease periods. */
    int64_t busy = 0, dups = 0;
    for (int i = 0; i < 2; i++) {
        int64_t b = wxg_ct_log_last(&t, i, "event=stats", "busy_retries");
        int64_t d = wxg_ct_log_last(&t, i, "event=stats", "duplicates");
        assert_true(b >= 0 && d >= 0);
        busy += b;
        dups += d;
        assert_int_equal(wxg_ct_log_last(&t, i, "event=stats", "lease_lost"), 0);
    }
    assert_true(busy >= 1);
    assert_int_equal(dups, 1);
    wxg_ct_teardown(&t);
}

static void
retries_exhausting_retry_max_go_to_the_dead_letter_topic_with_their_attempts(void **state)
{
    (void)state;
    enum { RETRY_MAX = 3, FAILING = 4 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-retry", 1);
    char extra[512];
    snprintf(extra, sizeof extra,
             "plugins = fail,record\n"
             "plugin.fail.action = retry\n"
             "plugin.fail.retry.times = 0\n"
             "plugin.fail.reason = downstream keeps refusing\n"
             "plugin.fail.match.msg_ids = %llu\n"
             "consumer.retry.max = %d\n",
             (unsigned long long)(ID_BASE + 200), RETRY_MAX);
    wxg_ct_write_config(&t, extra);
    /* Offsets 0..3 good, 4 retried until retry.max, 5..9 good (another conversation). */
    wxg_ct_msg_t m[10];
    for (int i = 0; i < 10; i++)
        m[i] = (wxg_ct_msg_t){.partition = 0, .id = ID_BASE + 210 + (uint64_t)i, .conv = 5 + i % 2};
    m[FAILING] = (wxg_ct_msg_t){.partition = 0, .id = ID_BASE + 200, .conv = 9};
    wxg_ct_produce(&t, m, 10);
    wxg_ct_spawn(&t, 0);
    /* Sampled every 50 ms: the offset passes the retried message only once it is parked. */
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    int parked = 0;
    for (;;) {
        int64_t c = wxg_ct_committed(&t, 0);
        if (c > FAILING && !parked) {
            parked = read_dlq(&t, NULL, 1, 2000);
            if (!parked)
                fail_msg("committed offset %lld passes the retried message before its dead "
                         "letter",
                         (long long)c);
        }
        if (c == 10)
            break;
        assert_true(wxg_test_now_ms() < deadline);
        assert_true(wxg_ct_alive(&t, 0));
        wxg_test_sleep_ms(50);
    }
    dlq_rec rec[2];
    memset(rec, 0, sizeof rec);
    assert_int_equal(read_dlq(&t, rec, 2, 3000), 1);
    assert_non_null(strstr(rec[0].value, "7301234567000000200"));
    assert_string_equal(rec[0].hdr_topic, t.topic);
    assert_string_equal(rec[0].hdr_offset, "4");
    assert_string_equal(rec[0].hdr_error, "EPLUGIN");
    char attempts[16];
    snprintf(attempts, sizeof attempts, "%d", RETRY_MAX);
    assert_string_equal(rec[0].hdr_attempts, attempts);
    free(rec[0].value);
    /* Nothing dropped: the nine others took effect once each, the retried one never. */
    assert_effects_without(&t, 9, ID_BASE + 200);
    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    wxg_ct_assert_exit(&t, 0, st, 0);
    /* RETRY_MAX attempts: RETRY_MAX - 1 retries with a backoff, then the dead letter. */
    assert_int_equal(wxg_ct_log_last(&t, 0, "event=stats", "retried"), RETRY_MAX - 1);
    assert_int_equal(wxg_ct_log_last(&t, 0, "event=stats", "dead_lettered"), 1);
    assert_int_equal(wxg_ct_log_last(&t, 0, "event=stats", "processed"), 9);
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=dead_lettered"), 1);
    char want[64];
    snprintf(want, sizeof want, "attempts=%d", RETRY_MAX);
    assert_int_equal(wxg_ct_log_count(&t, 0, want), 1);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(poison_and_failing_messages_are_parked_and_the_partition_keeps_flowing),
        cmocka_unit_test(a_plugin_slower_than_the_lease_keeps_its_claim_and_runs_once),
        cmocka_unit_test(
            retries_exhausting_retry_max_go_to_the_dead_letter_topic_with_their_attempts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
