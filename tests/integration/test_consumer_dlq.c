/* End to end: messages that cannot be processed are parked, never dropped, and never block the
 * partition for good; a plugin slower than the lease keeps its claim and runs once.
 *  - an undecodable record and a message whose plugin always fails each land in the dead-letter
 *    topic with the original bytes and the wxg-dlq-* headers; the messages after them are
 *    processed; the committed offset passes them only once their dead-letter record exists;
 *  - a plugin stalling for three leases: the watchdog renews the lease, a duplicate of the same
 *    message on another partition (another replica) sees BUSY, and the effect happens once. */
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

#define POISON_OFFSET  5
#define FAILING_OFFSET 11

static void commit_never_passes_a_parked_record_before_its_dead_letter(wxg_ct_t *t)
{
    int64_t c = wxg_ct_committed(t, 0);
    int need = c > FAILING_OFFSET ? 2 : c > POISON_OFFSET ? 1 : 0;
    if (need > 0)
        assert_int_equal(read_dlq(t, NULL, need, 5000), need);
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
    assert_true(wxg_ct_wait_all_committed(
        &t, 60000, commit_never_passes_a_parked_record_before_its_dead_letter));

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
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&t, &eff, NULL);
    assert_int_equal(n, 15);
    for (size_t i = 0; i < n; i++)
        assert_true(eff[i].id != ID_BASE + 100);
    free(eff);
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
    /* The same message on both partitions, so that (once both replicas have one partition
     * each) a second owner tries to claim it while the first is still stalled. */
    wxg_ct_msg_t m[4] = {
        {.partition = 0, .id = ID_BASE + 7, .conv = 3},
        {.partition = 1, .id = ID_BASE + 7, .conv = 4},
        {.partition = 0, .id = ID_BASE + 8, .conv = 3},
        {.partition = 1, .id = ID_BASE + 9, .conv = 4},
    };
    wxg_test_sleep_ms(3000); /* let both replicas join before the stalled message arrives */
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
    /* Nobody lost the lease while the plugin stalled for three lease periods. */
    assert_int_equal(wxg_ct_log_count(&t, 0, "lease_lost=0"), 1);
    assert_int_equal(wxg_ct_log_count(&t, 1, "lease_lost=0"), 1);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(poison_and_failing_messages_are_parked_and_the_partition_keeps_flowing),
        cmocka_unit_test(a_plugin_slower_than_the_lease_keeps_its_claim_and_runs_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
