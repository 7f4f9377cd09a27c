/* Unit tests for lib/consumer.c that need no servers: defaults, refusal of an incomplete
 * configuration (naming the problem, taking over the librdkafka configuration also on
 * failure), refusal of a metrics registry that conflicts with the consumer's metric names, and
 * NULL safety. The consumer's behaviour against real Kafka and Redis is proven
 * by tests/integration/test_consumer_*.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <string.h>

#include "wxguard/consumer.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"
#include "wxguard/metrics.h"
#include "wxguard/plugin_registry.h"

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
    assert_int_equal(c.commit_timeout_ms, 5000);
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
    assert_null(c.metrics);
    assert_int_equal(c.stall_timeout_ms, 300000);
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

static void a_registry_with_a_conflicting_metric_name_is_refused(void **state)
{
    (void)state;
    /* A registry where wxg_guard_claims_total already has other labels: the consumer could not
     * count claims, so it refuses to start (before it connects to anything). */
    wxg_metrics_t *reg = wxg_metrics_new();
    assert_non_null(reg);
    assert_non_null(wxg_metrics_counter(reg, "wxg_guard_claims_total", "other", "kind", "x", NULL));
    wxg_plugin_chain_t *chain = NULL;
    char err[256] = "";
    assert_int_equal(wxg_plugin_chain_new("noop", NULL, 0, &chain, err, sizeof err), 0);
    const wxg_kafka_prop_t props[] = {{"bootstrap.servers", "127.0.0.1:1"}};
    wxg_producer_t *producer = wxg_producer_new(props, 1, err, sizeof err);
    assert_non_null(producer);
    wxg_dlq_t *dlq = wxg_dlq_new(producer, "dlq", "group", err, sizeof err);
    assert_non_null(dlq);
    assert_ptr_equal(wxg_dlq_producer(dlq), producer);
    wxg_guard_conf_t gc;
    wxg_guard_conf_init(&gc);
    const char *topics[] = {"t"};
    wxg_consumer_conf_t c;
    wxg_consumer_conf_init(&c);
    c.kafka = rd_kafka_conf_new();
    c.topics = topics;
    c.ntopics = 1;
    c.guard = &gc;
    c.chain = chain;
    c.dlq = dlq;
    c.metrics = reg;
    err[0] = '\0';
    assert_null(wxg_consumer_new(&c, err, sizeof err));
    assert_non_null(strstr(err, "metrics"));
    wxg_dlq_destroy(dlq);
    wxg_producer_destroy(producer, 0);
    wxg_plugin_chain_destroy(chain);
    wxg_metrics_free(reg);
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
    char reason[64] = "";
    assert_int_equal(wxg_consumer_ready(NULL, reason, sizeof reason), 0);
    assert_string_equal(reason, "no consumer");
    assert_int_equal(wxg_consumer_ready(NULL, NULL, 0), 0);
    assert_null(wxg_dlq_producer(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_match_the_documented_values),
        cmocka_unit_test(an_incomplete_configuration_is_refused_and_the_kafka_conf_is_taken),
        cmocka_unit_test(a_registry_with_a_conflicting_metric_name_is_refused),
        cmocka_unit_test(null_handles_are_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
