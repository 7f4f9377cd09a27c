/* Unit tests for lib/consumer.c that need no servers: defaults, refusal of an incomplete
 * configuration (naming the problem, taking over the librdkafka configuration also on
 * failure), and NULL safety. The consumer's behaviour against real Kafka and Redis is proven
 * by tests/integration/test_consumer_*.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <string.h>

#include "wxguard/consumer.h"
#include "wxguard/err.h"

static void defaults_match_the_documented_values(void **state)
{
    (void)state;
    wxg_consumer_conf_t c;
    memset(&c, 0xab, sizeof c);
    wxg_consumer_conf_init(&c);
    assert_int_equal(c.workers, 4);
    assert_int_equal(c.queue_capacity, 4096);
    assert_int_equal(c.batch_max, 64);
    assert_int_equal(c.batch_delay_us, 1000);
    assert_int_equal(c.drain_timeout_ms, 30000);
    assert_int_equal(c.commit_interval_ms, 1000);
    assert_int_equal(c.retry_max, 5);
    assert_int_equal(c.backoff_initial_ms, 200);
    assert_int_equal(c.backoff_max_ms, 30000);
    assert_int_equal(c.max_message_bytes, 1 << 20);
    assert_int_equal(c.format, WXG_FORMAT_AUTO);
    assert_null(c.kafka);
    assert_null(c.topics);
    assert_null(c.chain);
    assert_null(c.dlq);
    assert_null(c.guard);
    wxg_consumer_conf_init(NULL);
}

static void an_incomplete_configuration_is_refused_and_the_kafka_conf_is_taken(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(wxg_consumer_new(NULL, err, sizeof err));
    assert_non_null(strstr(err, "incomplete configuration"));

    /* No topics, no guard, no chain, no DLQ: refused. The librdkafka configuration is taken
     * over even so (ASan/valgrind runs would report it otherwise). */
    wxg_consumer_conf_t c;
    wxg_consumer_conf_init(&c);
    c.kafka = rd_kafka_conf_new();
    err[0] = '\0';
    assert_null(wxg_consumer_new(&c, err, sizeof err));
    assert_non_null(strstr(err, "incomplete configuration"));
    /* errstr may be NULL. */
    c.kafka = rd_kafka_conf_new();
    assert_null(wxg_consumer_new(&c, NULL, 0));
}

static void null_handles_are_safe(void **state)
{
    (void)state;
    wxg_consumer_stats_t st;
    memset(&st, 0x5a, sizeof st);
    wxg_consumer_stats(NULL, &st);
    assert_int_equal(st.received, 0x5a5a5a5a5a5a5a5aULL); /* untouched */
    wxg_consumer_stop(NULL);
    wxg_consumer_destroy(NULL);
    assert_int_equal(wxg_consumer_run(NULL), WXG_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_match_the_documented_values),
        cmocka_unit_test(an_incomplete_configuration_is_refused_and_the_kafka_conf_is_taken),
        cmocka_unit_test(null_handles_are_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
