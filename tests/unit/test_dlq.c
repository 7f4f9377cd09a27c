/* Unit tests for lib/dlq.c that need no broker: the producer refuses configuration that would
 * weaken delivery, rejects bad arguments, and a send to a cluster that is not there fails with
 * an error (never success) once the delivery timeout has passed. The writes that land are
 * checked against a real broker in tests/integration/test_dlq.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "dlq_int.h"
#include "testenv.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"

static char closed_bootstrap[64];

static int setup(void **state)
{
    (void)state;
    /* A loopback port nothing listens on: connections are refused at once. */
    snprintf(closed_bootstrap, sizeof closed_bootstrap, "127.0.0.1:%d", wxg_test_free_port());
    return 0;
}

static void producer_refuses_settings_that_weaken_delivery(void **state)
{
    (void)state;
    char err[512];
    wxg_kafka_prop_t no_idem[] = {{"bootstrap.servers", closed_bootstrap},
                                  {"enable.idempotence", "false"}};
    assert_null(wxg_producer_new(no_idem, 2, err, sizeof err));
    assert_non_null(strstr(err, "enable.idempotence"));

    wxg_kafka_prop_t acks1[] = {{"bootstrap.servers", closed_bootstrap}, {"acks", "1"}};
    assert_null(wxg_producer_new(acks1, 2, err, sizeof err));
    assert_non_null(strstr(err, "acks"));

    /* The alias of acks cannot slip past the check either. */
    wxg_kafka_prop_t alias[] = {{"bootstrap.servers", closed_bootstrap},
                                {"request.required.acks", "0"}};
    assert_null(wxg_producer_new(alias, 2, err, sizeof err));
    assert_non_null(strstr(err, "acks"));

    wxg_kafka_prop_t forever[] = {{"bootstrap.servers", closed_bootstrap},
                                  {"delivery.timeout.ms", "0"}};
    assert_null(wxg_producer_new(forever, 2, err, sizeof err));
    assert_non_null(strstr(err, "message.timeout.ms"));

    wxg_kafka_prop_t unknown[] = {{"bootstrap.servers", closed_bootstrap},
                                  {"no.such.property", "1"}};
    assert_null(wxg_producer_new(unknown, 2, err, sizeof err));
    assert_non_null(strstr(err, "no.such.property"));

    wxg_producer_destroy(NULL, 0);
}

static void producer_reports_its_delivery_timeout(void **state)
{
    (void)state;
    char err[512];
    wxg_kafka_prop_t dflt[] = {{"bootstrap.servers", closed_bootstrap}};
    wxg_producer_t *p = wxg_producer_new(dflt, 1, err, sizeof err);
    assert_non_null(p);
    assert_int_equal(wxg_producer_delivery_timeout_ms(p), WXG_PRODUCER_DEFAULT_DELIVERY_TIMEOUT_MS);
    wxg_producer_destroy(p, 0);

    wxg_kafka_prop_t alias[] = {{"bootstrap.servers", closed_bootstrap},
                                {"delivery.timeout.ms", "1234"}};
    p = wxg_producer_new(alias, 2, err, sizeof err);
    assert_non_null(p);
    assert_int_equal(wxg_producer_delivery_timeout_ms(p), 1234);
    wxg_producer_destroy(p, 0);
}

static void a_producer_beside_a_consumer_takes_only_the_connection_settings(void **state)
{
    (void)state;
    static const char *const taken[] = {"bootstrap.servers",
                                        "metadata.broker.list",
                                        "security.protocol",
                                        "sasl.mechanisms",
                                        "sasl.username",
                                        "sasl.password",
                                        "sasl.oauthbearer.config",
                                        "ssl.ca.location",
                                        "ssl.certificate.location",
                                        "ssl.key.location",
                                        "ssl.key.password",
                                        "ssl.key.pem",
                                        "ssl.certificate.pem",
                                        "ssl.keystore.location",
                                        "ssl.keystore.password",
                                        "ssl.endpoint.identification.algorithm",
                                        "enable.ssl.certificate.verification",
                                        "broker.address.family",
                                        "socket.timeout.ms",
                                        "client.id",
                                        "message.timeout.ms"};
    static const char *const left[] = {"group.id",          "fetch.wait.max.ms",
                                       "auto.offset.reset", "session.timeout.ms",
                                       "linger.ms",         "log_cb"};
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        assert_true(wxg__producer_prop_wanted(WXG_PRODUCER_CONNECTION, taken[i]));
        assert_true(wxg__producer_prop_wanted(WXG_PRODUCER_ALL, taken[i]));
    }
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++)
        assert_false(wxg__producer_prop_wanted(WXG_PRODUCER_CONNECTION, left[i]));
    /* A producer-only program hands on everything but callbacks and the group. */
    assert_true(wxg__producer_prop_wanted(WXG_PRODUCER_ALL, "linger.ms"));
    assert_true(wxg__producer_prop_wanted(WXG_PRODUCER_ALL, "compression.codec"));
    assert_false(wxg__producer_prop_wanted(WXG_PRODUCER_ALL, "group.id"));
    assert_false(wxg__producer_prop_wanted(WXG_PRODUCER_ALL, "log_cb"));
    assert_false(wxg__producer_prop_wanted(WXG_PRODUCER_ALL, "error_cb"));
    assert_false(wxg__producer_prop_wanted(WXG_PRODUCER_ALL, "default_topic_conf"));
    assert_false(wxg__producer_prop_wanted(WXG_PRODUCER_ALL, "opaque"));
}

static void a_producer_like_a_configuration_takes_its_changed_settings_over_defaults(void **state)
{
    (void)state;
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    assert_int_equal(rd_kafka_conf_set(kc, "bootstrap.servers", closed_bootstrap, err, sizeof err),
                     RD_KAFKA_CONF_OK);
    const wxg_kafka_prop_t dflt = {"message.timeout.ms", "777"};
    /* Not set in the configuration: the caller's default applies. */
    wxg_producer_t *p =
        wxg_producer_new_like(kc, WXG_PRODUCER_CONNECTION, &dflt, 1, err, sizeof err);
    assert_non_null(p);
    assert_int_equal(wxg_producer_delivery_timeout_ms(p), 777);
    wxg_producer_destroy(p, 0);
    /* Set in the configuration: it wins over the default, in both scopes. */
    assert_int_equal(rd_kafka_conf_set(kc, "message.timeout.ms", "1234", err, sizeof err),
                     RD_KAFKA_CONF_OK);
    assert_int_equal(rd_kafka_conf_set(kc, "fetch.wait.max.ms", "100", err, sizeof err),
                     RD_KAFKA_CONF_OK);
    for (int scope = WXG_PRODUCER_CONNECTION; scope <= WXG_PRODUCER_ALL; scope++) {
        p = wxg_producer_new_like(kc, (wxg_producer_scope_t)scope, &dflt, 1, err, sizeof err);
        if (!p)
            fail_msg("scope %d: %s", scope, err);
        assert_int_equal(wxg_producer_delivery_timeout_ms(p), 1234);
        wxg_producer_destroy(p, 0);
    }
    /* A setting that weakens delivery is refused as by wxg_producer_new. */
    assert_int_equal(rd_kafka_conf_set(kc, "acks", "1", err, sizeof err), RD_KAFKA_CONF_OK);
    assert_null(wxg_producer_new_like(kc, WXG_PRODUCER_ALL, NULL, 0, err, sizeof err));
    assert_non_null(strstr(err, "acks"));
    assert_null(wxg_producer_new_like(NULL, WXG_PRODUCER_ALL, NULL, 0, err, sizeof err));
    assert_null(wxg_producer_new_like(kc, WXG_PRODUCER_ALL, NULL, 1, err, sizeof err));
    rd_kafka_conf_destroy(kc);
}

static void bad_arguments_are_refused_before_anything_is_sent(void **state)
{
    (void)state;
    char err[512];
    wxg_kafka_prop_t props[] = {{"bootstrap.servers", closed_bootstrap}};
    wxg_producer_t *p = wxg_producer_new(props, 1, err, sizeof err);
    assert_non_null(p);
    assert_int_equal(wxg_producer_send(p, NULL, WXG_PARTITION_ANY, NULL, 0, "v", 1, NULL, 0, NULL,
                                       err, sizeof err),
                     WXG_EINVAL);
    assert_int_equal(wxg_producer_send(p, "t", WXG_PARTITION_ANY, NULL, 3, "v", 1, NULL, 0, NULL,
                                       err, sizeof err),
                     WXG_EINVAL);
    assert_int_equal(wxg_producer_send(p, "t", -7, NULL, 0, "v", 1, NULL, 0, NULL, err, sizeof err),
                     WXG_EINVAL);
    assert_int_equal(wxg_producer_send(p, "t", WXG_PARTITION_ANY, NULL, 0, "v", 1, NULL, 2, NULL,
                                       err, sizeof err),
                     WXG_EINVAL);

    wxg_kafka_header_t unnamed[] = {{NULL, "v", 1}};
    assert_int_equal(wxg_producer_send(p, "t", WXG_PARTITION_ANY, NULL, 0, "v", 1, unnamed, 1, NULL,
                                       err, sizeof err),
                     WXG_EINVAL);

    assert_null(wxg_dlq_new(NULL, "dlq", "g", err, sizeof err));
    assert_null(wxg_dlq_new(p, "", "g", err, sizeof err));
    wxg_dlq_t *d = wxg_dlq_new(p, "dlq", "group-1", err, sizeof err);
    assert_non_null(d);
    assert_string_equal(wxg_dlq_topic(d), "dlq");
    wxg_dlq_record_t rec = {.topic = NULL, .value = "x", .value_len = 1};
    assert_int_equal(wxg_dlq_write(d, &rec, NULL, err, sizeof err), WXG_EINVAL);
    rec.topic = "callbacks";
    rec.header_count = 1; /* headers NULL */
    assert_int_equal(wxg_dlq_write(d, &rec, NULL, err, sizeof err), WXG_EINVAL);
    wxg_dlq_destroy(d);
    wxg_dlq_destroy(NULL);
    wxg_producer_destroy(p, 0);
}

static void a_write_to_an_unreachable_cluster_is_an_error_never_success(void **state)
{
    (void)state;
    char err[512] = "";
    wxg_kafka_prop_t props[] = {
        {"bootstrap.servers", closed_bootstrap}, {"message.timeout.ms", "300"}, {"log_level", "0"}};
    wxg_producer_t *p = wxg_producer_new(props, 3, err, sizeof err);
    assert_non_null(p);
    wxg_dlq_t *d = wxg_dlq_new(p, "dead-letters", "group-1", err, sizeof err);
    assert_non_null(d);
    wxg_dlq_record_t rec = {.topic = "callbacks",
                            .partition = 2,
                            .offset = 77,
                            .value = "{\"bad\":",
                            .value_len = 7,
                            .timestamp_ms = -1,
                            .error = WXG_EPARSE,
                            .attempts = 1};
    wxg_delivery_t dr = {.partition = -5, .offset = -5};
    int rc = wxg_dlq_write(d, &rec, &dr, err, sizeof err);
    assert_int_equal(rc, WXG_ETIMEDOUT);
    assert_non_null(strstr(err, "'dead-letters'"));
    print_message("reason: %s\n", err);
    assert_non_null(strstr(err, "last client error"));
    assert_int_equal(dr.offset, -5); /* not filled on failure */

    /* The plain send path fails the same way. */
    rc = wxg_producer_send(p, "replies", WXG_PARTITION_ANY, "k", 1, "v", 1, NULL, 0, NULL, err,
                           sizeof err);
    assert_int_equal(rc, WXG_ETIMEDOUT);
    wxg_dlq_destroy(d);
    wxg_producer_destroy(p, 0);
}

/* A send with a wait bound shorter than the delivery timeout gives up at that bound (the record
 * stays queued until librdkafka's own timeout), and a producer that never reached a broker
 * reports no broker up. */
static void a_bounded_send_gives_up_at_its_bound_and_no_broker_is_up(void **state)
{
    (void)state;
    char err[512] = "";
    wxg_kafka_prop_t props[] = {{"bootstrap.servers", closed_bootstrap},
                                {"message.timeout.ms", "60000"},
                                {"statistics.interval.ms", "100"},
                                {"log_level", "0"}};
    wxg_producer_t *p = wxg_producer_new(props, 4, err, sizeof err);
    assert_non_null(p);
    int rc = wxg_producer_send_within(p, 200, "callbacks", WXG_PARTITION_ANY, "k", 1, "v", 1, NULL,
                                      0, NULL, err, sizeof err);
    assert_int_equal(rc, WXG_ETIMEDOUT);
    assert_non_null(strstr(err, "no delivery report within the bound"));
    assert_int_equal(wxg_producer_send_within(p, -1, "callbacks", WXG_PARTITION_ANY, "k", 1, "v", 1,
                                              NULL, 0, NULL, err, sizeof err),
                     WXG_EINVAL);
    /* Statistics come every 100 ms; none of them can show a broker up. */
    for (int i = 0; i < 300 && wxg_producer_brokers_up(p) < 0; i++)
        usleep(10000);
    assert_int_equal(wxg_producer_brokers_up(p), 0);
    assert_int_equal(wxg_producer_brokers_up(NULL), -1);
    wxg_producer_destroy(p, 0);
}

/* The start-up check tells brokers that are down from credentials that are refused: with
 * nothing listening it ends long before its bound, with WXG_ECONN and librdkafka's reason. */
static void the_start_up_check_returns_at_once_when_every_broker_is_down(void **state)
{
    (void)state;
    char err[512] = "";
    wxg_kafka_prop_t props[] = {{"bootstrap.servers", closed_bootstrap}, {"log_level", "0"}};
    wxg_producer_t *p = wxg_producer_new(props, 2, err, sizeof err);
    assert_non_null(p);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = wxg_producer_check(p, 20000, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    print_message("%s after %ld ms: %s\n", wxg_err_name(rc), ms, err);
    assert_int_equal(rc, WXG_ECONN);
    assert_non_null(strstr(err, "no Kafka broker reachable"));
    assert_true(ms < 10000);
    wxg_producer_destroy(p, 0);
}

static void a_producer_like_a_consumer_takes_every_sasl_and_ssl_setting(void **state)
{
    (void)state;
    /* What an authenticated, encrypted cluster needs, set on a consumer's configuration. With
     * SASL_PLAINTEXT no TLS context is made, so the files need not exist; the settings must
     * still reach the producer, or its first connection over SASL_SSL would fail. */
    static const char *const wanted[][2] = {
        {"security.protocol", "sasl_plaintext"},
        {"sasl.mechanisms", "SCRAM-SHA-256"},
        {"sasl.username", "wxg-user"},
        {"sasl.password", "s3cr3t-sasl"},
        {"ssl.ca.location", "/etc/wxg/ca.pem"},
        {"ssl.certificate.location", "/etc/wxg/client.pem"},
        {"ssl.key.location", "/etc/wxg/client.key"},
        {"ssl.key.password", "s3cr3t-key"},
        {"enable.ssl.certificate.verification", "false"},
        {"ssl.endpoint.identification.algorithm", "none"},
    };
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    assert_int_equal(rd_kafka_conf_set(kc, "bootstrap.servers", closed_bootstrap, err, sizeof err),
                     RD_KAFKA_CONF_OK);
    assert_int_equal(rd_kafka_conf_set(kc, "group.id", "wxg-test-group", err, sizeof err),
                     RD_KAFKA_CONF_OK);
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        if (rd_kafka_conf_set(kc, wanted[i][0], wanted[i][1], err, sizeof err) != RD_KAFKA_CONF_OK)
            fail_msg("%s: %s", wanted[i][0], err);
    }
    for (int scope = WXG_PRODUCER_CONNECTION; scope <= WXG_PRODUCER_ALL; scope++) {
        wxg_producer_t *p =
            wxg_producer_new_like(kc, (wxg_producer_scope_t)scope, NULL, 0, err, sizeof err);
        if (!p)
            fail_msg("scope %d: %s", scope, err);
        char buf[256];
        for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
            assert_int_equal(wxg__producer_conf_get(p, wanted[i][0], buf, sizeof buf), 0);
            if (strcmp(buf, wanted[i][1]) != 0)
                fail_msg("scope %d: %s is '%s', not '%s'", scope, wanted[i][0], buf, wanted[i][1]);
        }
        wxg_producer_destroy(p, 0);
    }
    rd_kafka_conf_destroy(kc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(producer_refuses_settings_that_weaken_delivery),
        cmocka_unit_test(producer_reports_its_delivery_timeout),
        cmocka_unit_test(a_producer_beside_a_consumer_takes_only_the_connection_settings),
        cmocka_unit_test(a_producer_like_a_consumer_takes_every_sasl_and_ssl_setting),
        cmocka_unit_test(a_producer_like_a_configuration_takes_its_changed_settings_over_defaults),
        cmocka_unit_test(bad_arguments_are_refused_before_anything_is_sent),
        cmocka_unit_test(a_write_to_an_unreachable_cluster_is_an_error_never_success),
        cmocka_unit_test(a_bounded_send_gives_up_at_its_bound_and_no_broker_is_up),
        cmocka_unit_test(the_start_up_check_returns_at_once_when_every_broker_is_down),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
