/* Unit tests for lib/conf.c: the key table, the four sources and their precedence, refusal of
 * unknown keys and bad values with the key named, units and ranges, secrets kept out of output,
 * the environment mapping, kafka.* validation by librdkafka, and plugin sub-maps; and for
 * lib/conf_map.c: every redis.*, guard.* and consumer.* key reaches the guard's or the
 * consumer's configuration. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "wxguard/conf.h"
#include "wxguard/consumer.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"
#include "wxguard/msg.h"
#include "testenv.h"

#define ERRSZ 512

static wxg_conf_t *new_conf(unsigned prog)
{
    char err[ERRSZ] = "";
    wxg_conf_t *c = wxg_conf_new(prog, err, sizeof err);
    if (c == NULL)
        fail_msg("wxg_conf_new: %s", err);
    return c;
}

static int load(wxg_conf_t *c, const char *text, char *err)
{
    return wxg_conf_load_string(c, text, strlen(text), "test.conf", err, ERRSZ);
}

/* Captures what wxg_conf_print writes. */
static char *print_to_string(const wxg_conf_t *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(wxg_conf_print(c, f), 0);
    fclose(f);
    return buf;
}

static void every_default_in_the_table_is_valid_and_described(void **state)
{
    (void)state;
    assert_true(wxg_conf_keydef_count() > 30);
    for (size_t i = 0; i < wxg_conf_keydef_count(); i++) {
        const wxg_conf_keydef_t *d = wxg_conf_keydef_at(i);
        assert_non_null(d->name);
        assert_non_null(d->def);
        assert_true(strlen(d->desc) > 10);
        assert_true(d->programs != 0);
        assert_ptr_equal(wxg_conf_keydef_find(d->name), d);
        for (size_t j = i + 1; j < wxg_conf_keydef_count(); j++)
            assert_string_not_equal(d->name, wxg_conf_keydef_at(j)->name);
    }
    assert_null(wxg_conf_keydef_at(wxg_conf_keydef_count()));
    /* Every program gets a conf from the defaults alone (wxg_conf_new parses each default). */
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(wxg_conf_int(c, "consumer.workers"), 4);
    assert_int_equal(wxg_conf_int(c, "guard.done.retention"), 7LL * 24 * 3600 * 1000);
    assert_int_equal(wxg_conf_int(c, "consumer.max.message.bytes"), 1024 * 1024);
    assert_string_equal(wxg_conf_get(c, "log.format"), "kv");
    assert_string_equal(wxg_conf_origin(c, "log.format"), "default");
    wxg_conf_free(c);
}

static void later_sources_win_whatever_the_call_order(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    /* --set first, then env, then file: precedence still default < file < env < --set. */
    assert_int_equal(wxg_conf_set_arg(c, "consumer.workers=9", err, sizeof err), 0);
    const char *env[] = {"WXG_CONSUMER_WORKERS=7", "WXG_REDIS_PORT=6400", NULL};
    assert_int_equal(wxg_conf_load_env(c, env, err, sizeof err), 0);
    assert_int_equal(load(c,
                          "# comment\n! also a comment\n  consumer.workers = 5  \n"
                          "redis.port=6390\nredis.db = 3\n",
                          err),
                     0);
    assert_int_equal(wxg_conf_int(c, "consumer.workers"), 9);
    assert_string_equal(wxg_conf_origin(c, "consumer.workers"), "--set");
    assert_int_equal(wxg_conf_int(c, "redis.port"), 6400);
    assert_string_equal(wxg_conf_origin(c, "redis.port"), "env WXG_REDIS_PORT");
    assert_int_equal(wxg_conf_int(c, "redis.db"), 3);
    assert_string_equal(wxg_conf_origin(c, "redis.db"), "file test.conf:5");
    assert_int_equal(wxg_conf_int(c, "redis.connect.timeout.ms"), 2000);
    wxg_conf_free(c);
}

static void a_key_twice_in_one_file_is_refused_naming_both_lines(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(load(c, "redis.port = 1\n\nredis.port = 2\n", err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.port is set twice"));
    assert_non_null(strstr(err, "test.conf:1"));
    assert_non_null(strstr(err, "test.conf:3"));
    wxg_conf_free(c);

    /* A --set given twice: the last wins, with a warning. */
    c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(wxg_conf_set_arg(c, "redis.port=1", err, sizeof err), 0);
    assert_int_equal(wxg_conf_set_arg(c, "redis.port=2", err, sizeof err), 0);
    assert_int_equal(wxg_conf_int(c, "redis.port"), 2);
    assert_int_equal(wxg_conf_warning_count(c), 1);
    assert_non_null(strstr(wxg_conf_warning(c, 0), "redis.port is set more than once"));
    wxg_conf_free(c);
}

static void unknown_keys_are_refused_with_the_key_named(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(load(c, "redis.port = 6379\nconsumer.worker = 3\n", err), WXG_ECONFIG);
    assert_non_null(strstr(err, "unknown configuration key \"consumer.worker\""));
    assert_non_null(strstr(err, "test.conf:2"));
    assert_non_null(strstr(err, "did you mean \"consumer.workers\""));
    assert_int_equal(wxg_conf_set_arg(c, "bogus=1", err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "\"bogus\""));
    assert_int_equal(wxg_conf_set_arg(c, "no equals sign", err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "expected key=value"));
    assert_int_equal(load(c, "just words\n", err), WXG_ECONFIG);
    assert_non_null(strstr(err, "test.conf:1: expected key = value"));
    assert_int_equal(wxg_conf_set(c, "bad key", "1", err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "invalid configuration key"));
    wxg_conf_free(c);
}

static void bad_values_are_refused_with_key_and_origin(void **state)
{
    (void)state;
    static const struct {
        const char *arg;
        const char *needle;
    } cases[] = {
        {"consumer.workers=abc", "consumer.workers: \"abc\" is not an integer"},
        {"consumer.workers=0", "consumer.workers: \"0\" is out of range (1 .. 256)"},
        {"consumer.workers=257", "out of range (1 .. 256)"},
        {"consumer.workers= 4x", "is not an integer"},
        {"consumer.workers=99999999999999999999", "is not an integer"},
        {"redis.port=65536", "redis.port: \"65536\" is out of range (1 .. 65535)"},
        {"log.personal.ids=maybe", "log.personal.ids: \"maybe\" is not a boolean"},
        {"log.format=xml", "log.format: \"xml\" is not one of kv | json"},
        {"guard.done.retention=604800", "guard.done.retention: \"604800\" is not a duration"},
        {"guard.done.retention=10s", "is out of range (1m .. 365d)"},
        {"guard.lease.ms=5w", "guard.lease.ms: \"5w\" is not a duration"},
        {"guard.lease.ms=-5s", "is not a duration"},
        {"consumer.max.message.bytes=1MB", "is not a size"},
        {"consumer.max.message.bytes=100", "is out of range (1KiB .. 64MiB)"},
        {"consumer.topics=a,,b", "consumer.topics: \"a,,b\" has an empty item"},
        {"consumer.topics=a,b,a", "names \"a\" twice"},
        {"consumer.topics=a/b", "a topic name may hold only"},
        {"plugins=record,record", "names \"record\" twice"},
        {"metrics.listen=localhost", "metrics.listen: \"localhost\" is not host:port"},
        {"metrics.listen=::1:80", "is not host:port"},
        {"metrics.listen=127.0.0.1:70000", "is not host:port"},
        {"redis.key.prefix=wx{g}", "redis.key.prefix: \"wx{g}\": may hold only"},
        {"kafka.group.id=", "kafka.group.id: must not be empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERRSZ] = "";
        wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
        int rc = wxg_conf_set_arg(c, cases[i].arg, err, sizeof err);
        if (rc != WXG_ECONFIG || strstr(err, cases[i].needle) == NULL)
            fail_msg("--set %s: rc %d, err \"%s\", expected \"%s\"", cases[i].arg, rc, err,
                     cases[i].needle);
        assert_non_null(strstr(err, "(--set)"));
        wxg_conf_free(c);
    }
    /* A control character in a value is refused wherever it comes from. */
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(wxg_conf_set(c, "redis.host", "a\x1b[31mb", err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.host: the value holds a control character"));
    wxg_conf_free(c);
}

static void units_and_bounds_parse_exactly(void **state)
{
    (void)state;
    int64_t v = 0;
    int b = -1;
    assert_int_equal(wxg_conf_parse_duration_ms("250ms", 0, &v), 0);
    assert_int_equal(v, 250);
    assert_int_equal(wxg_conf_parse_duration_ms("3s", 0, &v), 0);
    assert_int_equal(v, 3000);
    assert_int_equal(wxg_conf_parse_duration_ms("2m", 0, &v), 0);
    assert_int_equal(v, 120000);
    assert_int_equal(wxg_conf_parse_duration_ms("1h", 0, &v), 0);
    assert_int_equal(v, 3600000);
    assert_int_equal(wxg_conf_parse_duration_ms("7d", 0, &v), 0);
    assert_int_equal(v, 604800000);
    assert_int_equal(wxg_conf_parse_duration_ms("42", 1, &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(wxg_conf_parse_duration_ms("42", 0, &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_duration_ms("1.5s", 0, &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_duration_ms("9223372036854775807d", 0, &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_duration_ms(" 5s", 0, &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_duration_ms("", 1, &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_size("512", &v), 0);
    assert_int_equal(v, 512);
    assert_int_equal(wxg_conf_parse_size("4K", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(wxg_conf_parse_size("3MiB", &v), 0);
    assert_int_equal(v, 3 * 1024 * 1024);
    assert_int_equal(wxg_conf_parse_size("2G", &v), 0);
    assert_int_equal(v, 2LL * 1024 * 1024 * 1024);
    assert_int_equal(wxg_conf_parse_size("10kb", &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_size("-1", &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_size("9007199254740993G", &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_int("-12", &v), 0);
    assert_int_equal(v, -12);
    assert_int_equal(wxg_conf_parse_int("9223372036854775808", &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_int("0x10", &v), WXG_ECONFIG);
    assert_int_equal(wxg_conf_parse_bool("YES", &b), 0);
    assert_int_equal(b, 1);
    assert_int_equal(wxg_conf_parse_bool("off", &b), 0);
    assert_int_equal(b, 0);

    char host[64];
    int port = -1;
    assert_int_equal(wxg_conf_parse_addr("127.0.0.1:0", host, sizeof host, &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 0);
    assert_int_equal(wxg_conf_parse_addr("[::1]:9090", host, sizeof host, &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 9090);
    assert_int_equal(wxg_conf_parse_addr(":80", host, sizeof host, &port), WXG_ECONFIG);

    /* Values set through the conf come back in ms and bytes. */
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(wxg_conf_set_arg(c, "guard.done.retention=36h", err, sizeof err), 0);
    assert_int_equal(wxg_conf_set_arg(c, "consumer.drain.timeout.ms=1500", err, sizeof err), 0);
    assert_int_equal(wxg_conf_set_arg(c, "log.field.max.bytes=1K", err, sizeof err), 0);
    assert_int_equal(wxg_conf_set_arg(c, "log.content=on", err, sizeof err), 0);
    assert_int_equal(wxg_conf_int(c, "guard.done.retention"), 36LL * 3600 * 1000);
    assert_int_equal(wxg_conf_int(c, "consumer.drain.timeout.ms"), 1500);
    assert_int_equal(wxg_conf_int(c, "log.field.max.bytes"), 1024);
    assert_int_equal(wxg_conf_bool(c, "log.content"), 1);
    assert_string_equal(wxg_conf_get(c, "guard.done.retention"), "36h");
    /* The checked getter tells an unknown key from a key of another type. */
    int64_t out = 0;
    assert_int_equal(wxg_conf_get_int(c, "no.such.key", &out), WXG_ENOTFOUND);
    assert_int_equal(wxg_conf_get_int(c, "redis.host", &out), WXG_EINVAL);
    wxg_conf_free(c);
}

static void lists_split_and_trim(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    const char *const *items = NULL;
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(load(c, "plugins = record , noop,fail\nconsumer.topics = t1, t2\n", err), 0);
    assert_int_equal(wxg_conf_list(c, "plugins", &items), 3);
    assert_string_equal(items[0], "record");
    assert_string_equal(items[1], "noop");
    assert_string_equal(items[2], "fail");
    assert_int_equal(wxg_conf_list(c, "consumer.topics", &items), 2);
    assert_string_equal(items[1], "t2");
    assert_int_equal(wxg_conf_list(c, "redis.host", &items), 0);
    wxg_conf_free(c);
}

static void check_refuses_missing_required_keys_and_inconsistent_pairs(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(wxg_conf_check(c, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "kafka.bootstrap.servers: required but not set"));
    assert_non_null(strstr(err, "WXG_KAFKA_BOOTSTRAP_SERVERS"));
    assert_int_equal(wxg_conf_set_arg(c, "kafka.bootstrap.servers=127.0.0.1:9092", err, ERRSZ), 0);
    assert_int_equal(wxg_conf_check(c, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugins: required but not set"));
    assert_int_equal(wxg_conf_set_arg(c, "plugins=noop", err, sizeof err), 0);
    assert_int_equal(wxg_conf_check(c, err, sizeof err), 0);
    assert_int_equal(wxg_conf_set_arg(c, "consumer.retry.backoff.initial.ms=1m", err, ERRSZ), 0);
    assert_int_equal(wxg_conf_check(c, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "consumer.retry.backoff.initial.ms (1m) is larger than"));
    wxg_conf_free(c);

    /* The ingest program does not need plugins, and warns about a consumer-only key. */
    c = new_conf(WXG_PROG_INGEST);
    assert_int_equal(wxg_conf_set_arg(c, "kafka.bootstrap.servers=127.0.0.1:9092", err, ERRSZ), 0);
    assert_int_equal(wxg_conf_set_arg(c, "consumer.workers=2", err, sizeof err), 0);
    assert_int_equal(wxg_conf_check(c, err, sizeof err), 0);
    assert_int_equal(wxg_conf_warning_count(c), 1);
    assert_non_null(strstr(wxg_conf_warning(c, 0), "consumer.workers is not used by this program"));
    wxg_conf_free(c);
}

static void secrets_never_appear_in_print_or_errors(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(load(c,
                          "redis.password = s3cr3t-redis\nkafka.sasl.password = s3cr3t-sasl\n"
                          "kafka.sasl.username = alice-user\nplugin.pg.db.password = s3cr3t-pg\n"
                          "plugin.pg.table = effects\nlog.id.salt = s3cr3t-salt\n",
                          err),
                     0);
    char *out = print_to_string(c);
    assert_null(strstr(out, "s3cr3t"));
    assert_null(strstr(out, "alice-user"));
    assert_non_null(strstr(out, "redis.password = ***\n"));
    assert_non_null(strstr(out, "kafka.sasl.password = ***\n"));
    assert_non_null(strstr(out, "kafka.sasl.username = ***\n"));
    assert_non_null(strstr(out, "plugin.pg.db.password = ***\n"));
    assert_non_null(strstr(out, "plugin.pg.table = effects\n"));
    assert_non_null(strstr(out, "# from file test.conf:1\nredis.password = ***\n"));
    assert_non_null(strstr(out, "consumer.workers = 4\n"));
    assert_null(strstr(out, "ingest.listen")); /* not a consumer key */
    free(out);
    /* The value still reaches the code that needs it. */
    assert_string_equal(wxg_conf_get(c, "redis.password"), "s3cr3t-redis");
    /* A secret that is too long is refused without being echoed. */
    char longpw[600];
    memset(longpw, 'p', sizeof longpw - 1);
    longpw[sizeof longpw - 1] = '\0';
    assert_int_equal(wxg_conf_set(c, "redis.password", longpw, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.password: the value is longer than 512 bytes"));
    assert_null(strstr(err, "ppp"));
    /* librdkafka's message for a refused secret (which may quote it) is not passed on. */
    assert_true(wxg_conf_key_is_secret("kafka.ssl.key.password"));
    assert_true(wxg_conf_key_is_secret("kafka.sasl.oauthbearer.client.secret"));
    assert_true(wxg_conf_key_is_secret("plugin.x.api.token"));
    assert_true(wxg_conf_key_is_secret("plugin.pg.dsn"));
    assert_false(wxg_conf_key_is_secret("redis.host"));
    assert_false(wxg_conf_key_is_secret("kafka.bootstrap.servers"));
    wxg_conf_free(c);
}

static void environment_names_map_to_keys(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    const char *env[] = {
        "PATH=/usr/bin",
        "WXG_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092",
        "WXG_CONSUMER_RETRY_BACKOFF_MAX_MS=1m",
        "WXG_PLUGIN_RECORD_PATH=/tmp/effects.jsonl",
        "WXG_KAFKA__SESSION_TIMEOUT_MS=12000",
        "WXG_KAFKA__LOG_LEVEL=3",
        "WXG_PLUGIN__MY_PG__DB_TABLE=effects",
        "WXG_TEST_SOMETHING_ELSE=1",
        "WXG_NOVALUE",
        NULL,
    };
    assert_int_equal(wxg_conf_load_env(c, env, err, sizeof err), 0);
    assert_string_equal(wxg_conf_get(c, "kafka.bootstrap.servers"), "127.0.0.1:19092");
    assert_int_equal(wxg_conf_int(c, "consumer.retry.backoff.max.ms"), 60000);
    assert_string_equal(wxg_conf_get(c, "plugin.record.path"), "/tmp/effects.jsonl");
    assert_string_equal(wxg_conf_get(c, "kafka.session.timeout.ms"), "12000");
    /* librdkafka's log_level holds '_' itself; the mapping finds it. */
    assert_string_equal(wxg_conf_get(c, "kafka.log_level"), "3");
    assert_string_equal(wxg_conf_get(c, "plugin.my_pg.db.table"), "effects");
    assert_string_equal(wxg_conf_origin(c, "plugin.my_pg.db.table"),
                        "env WXG_PLUGIN__MY_PG__DB_TABLE");
    assert_int_equal(wxg_conf_warning_count(c), 1);
    assert_non_null(strstr(wxg_conf_warning(c, 0), "WXG_TEST_SOMETHING_ELSE"));

    const char *bad[] = {"WXG_REDIS_PORT=notaport", NULL};
    assert_int_equal(wxg_conf_load_env(c, bad, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.port: \"notaport\" is not an integer (env WXG_REDIS_PORT)"));
    wxg_conf_free(c);
}

static void kafka_keys_are_validated_by_librdkafka_and_passed_on(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(wxg_conf_set_arg(c, "kafka.no.such.property=1", err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "kafka.no.such.property: librdkafka has no property"));
    assert_int_equal(wxg_conf_set_arg(c, "kafka.fetch.wait.max.ms=soon", err, sizeof err),
                     WXG_ECONFIG);
    assert_non_null(strstr(err, "kafka.fetch.wait.max.ms: librdkafka refused the value"));
    assert_int_equal(wxg_conf_set_arg(c, "kafka.enable.auto.offset.store=true", err, ERRSZ),
                     WXG_ECONFIG);
    assert_non_null(strstr(err, "kafka.enable.auto.offset.store: cannot be set"));
    assert_int_equal(wxg_conf_set_arg(c, "kafka.security.protocol=pigeon", err, ERRSZ),
                     WXG_ECONFIG);
    assert_non_null(strstr(err, "kafka.security.protocol: librdkafka refused the value"));
    /* A topic-level property goes through too (librdkafka keeps it in the default topic conf). */
    assert_int_equal(wxg_conf_set_arg(c, "kafka.auto.offset.reset=earliest", err, ERRSZ), 0);
    assert_int_equal(wxg_conf_set_arg(c, "kafka.client.id=wxg-test", err, sizeof err), 0);
    assert_int_equal(wxg_conf_set_arg(c, "kafka.bootstrap.servers=127.0.0.1:1", err, ERRSZ), 0);
    /* Every setting an authenticated, encrypted connection needs passes on as written. */
    static const char *const tls[][2] = {
        {"security.protocol", "sasl_ssl"},
        {"sasl.mechanisms", "SCRAM-SHA-256"},
        {"sasl.username", "wxg-user"},
        {"sasl.password", "pw"},
        {"ssl.ca.location", "/etc/wxg/ca.pem"},
        {"ssl.certificate.location", "/etc/wxg/client.pem"},
        {"ssl.key.location", "/etc/wxg/client.key"},
        {"ssl.key.password", "keypw"},
        {"enable.ssl.certificate.verification", "false"},
        {"ssl.endpoint.identification.algorithm", "none"},
    };
    char arg[256];
    for (size_t i = 0; i < sizeof tls / sizeof tls[0]; i++) {
        snprintf(arg, sizeof arg, "kafka.%s=%s", tls[i][0], tls[i][1]);
        if (wxg_conf_set_arg(c, arg, err, sizeof err) != 0)
            fail_msg("%s: %s", arg, err);
    }

    rd_kafka_conf_t *rk = wxg_conf_kafka(c, err, sizeof err);
    assert_non_null(rk);
    char buf[256];
    size_t sz;
    for (size_t i = 0; i < sizeof tls / sizeof tls[0]; i++) {
        sz = sizeof buf;
        assert_int_equal(rd_kafka_conf_get(rk, tls[i][0], buf, &sz), RD_KAFKA_CONF_OK);
        assert_string_equal(buf, tls[i][1]);
    }
    sz = sizeof buf;
    assert_int_equal(rd_kafka_conf_get(rk, "client.id", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "wxg-test");
    sz = sizeof buf;
    assert_int_equal(rd_kafka_conf_get(rk, "bootstrap.servers", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "127.0.0.1:1");
    sz = sizeof buf;
    assert_int_equal(rd_kafka_conf_get(rk, "group.id", buf, &sz), RD_KAFKA_CONF_OK);
    assert_string_equal(buf, "wxguard");
    rd_kafka_conf_destroy(rk);
    wxg_conf_free(c);
}

static void plugin_keys_form_a_sub_map_per_plugin(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(load(c,
                          "plugin.record.path = /var/lib/wxg/effects.jsonl\n"
                          "plugin.fail.mode = every\nplugin.fail.every = 3\n"
                          "plugin.failx.y = z\n",
                          err),
                     0);
    /* record declares its keys in the table: an undeclared one is refused. */
    assert_int_equal(wxg_conf_set_arg(c, "plugin.record.pth=/x", err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "unknown configuration key \"plugin.record.pth\""));
    assert_non_null(strstr(err, "did you mean \"plugin.record.path\""));
    assert_int_equal(wxg_conf_set_arg(c, "plugin.nodot=1", err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.<name>.<property>"));

    wxg_conf_map_t *m = wxg_conf_plugin_map(c, "fail");
    assert_non_null(m);
    assert_int_equal(m->count, 2);
    assert_string_equal(m->items[0].key, "every");
    assert_string_equal(m->items[0].value, "3");
    assert_string_equal(wxg_conf_map_get(m, "mode"), "every");
    assert_null(wxg_conf_map_get(m, "y"));
    wxg_conf_map_free(m);

    m = wxg_conf_plugin_map(c, "record");
    assert_non_null(m);
    assert_int_equal(m->count, 1);
    assert_string_equal(wxg_conf_map_get(m, "path"), "/var/lib/wxg/effects.jsonl");
    wxg_conf_map_free(m);

    m = wxg_conf_plugin_map(c, "none");
    assert_non_null(m);
    assert_int_equal(m->count, 0);
    wxg_conf_map_free(m);
    wxg_conf_map_free(NULL);
    wxg_conf_free(c);
}

static void plugin_settings_keep_every_plugin_key_whole_for_the_registry(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    /* "example" is no built-in: its keys are accepted as they are, since only the loaded
     * object knows its name and keys. */
    assert_int_equal(load(c,
                          "plugins = /opt/wxg/example.so\n"
                          "plugin.example.prefix = hello\n"
                          "plugin.example.db.dsn = postgresql://u:pw@db/x\n",
                          err),
                     0);
    assert_int_equal(wxg_conf_set_arg(c, "plugin.example.topic=replies", err, sizeof err), 0);
    wxg_conf_map_t *m = wxg_conf_plugin_settings(c);
    assert_non_null(m);
    assert_string_equal(wxg_conf_map_get(m, "plugin.example.prefix"), "hello");
    assert_string_equal(wxg_conf_map_get(m, "plugin.example.topic"), "replies");
    assert_string_equal(wxg_conf_map_get(m, "plugin.example.db.dsn"), "postgresql://u:pw@db/x");
    /* The declared keys of the built-ins come with their defaults. */
    assert_string_equal(wxg_conf_map_get(m, "plugin.record.path"), "");
    for (size_t i = 0; i < m->count; i++) {
        assert_true(strncmp(m->items[i].key, "plugin.", 7) == 0);
        if (i > 0)
            assert_true(strcmp(m->items[i - 1].key, m->items[i].key) < 0);
    }
    assert_null(wxg_conf_map_get(m, "plugins"));
    wxg_conf_map_free(m);
    assert_null(wxg_conf_plugin_settings(NULL));
    wxg_conf_free(c);
}

static void load_reads_a_file_and_runs_every_source(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    char *dir = wxg_test_mkdtemp("wxg-conf");
    assert_non_null(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/wxguard.conf", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("\xEF\xBB\xBFkafka.bootstrap.servers = 127.0.0.1:9092\r\nplugins = record\r\n"
          "plugin.record.path = /tmp/x # not a comment\r\nconsumer.workers = 2\r\n",
          f);
    fclose(f);
    const char *env[] = {"WXG_CONSUMER_WORKERS=3", NULL};
    const char *sets[] = {"consumer.batch.max=8"};
    wxg_conf_t *c = wxg_conf_load(WXG_PROG_CONSUMER, path, env, sets, 1, err, sizeof err);
    if (c == NULL)
        fail_msg("wxg_conf_load: %s", err);
    assert_int_equal(wxg_conf_int(c, "consumer.workers"), 3);
    assert_int_equal(wxg_conf_int(c, "consumer.batch.max"), 8);
    assert_string_equal(wxg_conf_get(c, "plugin.record.path"), "/tmp/x # not a comment");
    wxg_conf_free(c);

    snprintf(path, sizeof path, "%s/missing.conf", dir);
    assert_null(wxg_conf_load(WXG_PROG_CONSUMER, path, env, NULL, 0, err, sizeof err));
    assert_non_null(strstr(err, "missing.conf: cannot open"));
    wxg_test_rmtree(dir);
    free(dir);
}

static void reference_ranges_read_like_the_docs(void **state)
{
    (void)state;
    char buf[128];
    wxg_conf_describe_range(wxg_conf_keydef_find("guard.lease.ms"), buf, sizeof buf);
    assert_string_equal(buf, "100ms .. 1h");
    wxg_conf_describe_range(wxg_conf_keydef_find("log.format"), buf, sizeof buf);
    assert_string_equal(buf, "kv | json");
    wxg_conf_describe_range(wxg_conf_keydef_find("ingest.max.body.bytes"), buf, sizeof buf);
    assert_string_equal(buf, "1KiB .. 64MiB");
    wxg_conf_describe_range(wxg_conf_keydef_find("plugins"), buf, sizeof buf);
    assert_string_equal(buf, "1 .. 32 items");
    assert_string_equal(wxg_conf_type_name(WXG_CONF_DURATION), "duration");
}

/* ---- the mapping to the guard's and the consumer's configuration (lib/conf_map.c) ---------- */

/* Keys under redis.* or guard.* that configure the consumer rather than the guard handle. */
static const char *const consumer_side_keys[] = {"redis.probe.interval.ms",
                                                 "guard.done.cache.entries"};

static int is_consumer_side(const char *key)
{
    for (size_t i = 0; i < sizeof consumer_side_keys / sizeof consumer_side_keys[0]; i++) {
        if (strcmp(key, consumer_side_keys[i]) == 0)
            return 1;
    }
    return 0;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int str_differs(const char *a, const char *b)
{
    if (a == NULL || b == NULL)
        return a != b;
    return strcmp(a, b) != 0;
}

/* Every field of wxg_guard_conf_t: a field added there must be added here, or a key mapped to
 * it would not be seen by the tests below. */
static int guard_conf_differs(const wxg_guard_conf_t *a, const wxg_guard_conf_t *b)
{
    return str_differs(a->host, b->host) || a->port != b->port ||
           str_differs(a->unix_path, b->unix_path) || a->db != b->db ||
           str_differs(a->user, b->user) || str_differs(a->password, b->password) ||
           a->connect_timeout_ms != b->connect_timeout_ms ||
           a->command_timeout_ms != b->command_timeout_ms || str_differs(a->prefix, b->prefix) ||
           str_differs(a->sentinels, b->sentinels) ||
           str_differs(a->sentinel_master, b->sentinel_master) ||
           str_differs(a->sentinel_user, b->sentinel_user) ||
           str_differs(a->sentinel_password, b->sentinel_password) || a->tls != b->tls ||
           str_differs(a->tls_ca_file, b->tls_ca_file) ||
           str_differs(a->tls_ca_path, b->tls_ca_path) ||
           str_differs(a->tls_cert_file, b->tls_cert_file) ||
           str_differs(a->tls_key_file, b->tls_key_file) ||
           str_differs(a->tls_key_password, b->tls_key_password) ||
           str_differs(a->tls_server_name, b->tls_server_name) || a->tls_verify != b->tls_verify ||
           a->sentinel_tls != b->sentinel_tls || str_differs(a->client_name, b->client_name) ||
           a->design != b->design || a->lease_ms != b->lease_ms ||
           a->inflight_ttl_ms != b->inflight_ttl_ms ||
           a->done_retention_ms != b->done_retention_ms ||
           a->failed_retention_ms != b->failed_retention_ms ||
           a->wait_replicas != b->wait_replicas || a->wait_timeout_ms != b->wait_timeout_ms ||
           a->done_bucket_ms != b->done_bucket_ms ||
           a->done_expected_rate != b->done_expected_rate ||
           a->done_bucket_target != b->done_bucket_target ||
           a->done_selector_bits != b->done_selector_bits || a->shard_bits != b->shard_bits ||
           a->cluster != b->cluster || a->batch_max != b->batch_max ||
           a->reconnect_min_ms != b->reconnect_min_ms ||
           a->reconnect_max_ms != b->reconnect_max_ms || a->naive != b->naive ||
           a->done_cache != b->done_cache || str_differs(a->cluster_nodes, b->cluster_nodes);
}

/* Every field of wxg_consumer_conf_t that a key can fill (the handles are the caller's). */
static int consumer_conf_differs(const wxg_consumer_conf_t *a, const wxg_consumer_conf_t *b)
{
    int topics = a->ntopics != b->ntopics;
    for (size_t i = 0; !topics && i < a->ntopics; i++)
        topics = str_differs(a->topics[i], b->topics[i]);
    return topics || str_differs(a->group_id, b->group_id) || a->workers != b->workers ||
           a->queue_capacity != b->queue_capacity || a->batch_max != b->batch_max ||
           a->batch_delay_us != b->batch_delay_us || a->drain_timeout_ms != b->drain_timeout_ms ||
           a->commit_interval_ms != b->commit_interval_ms ||
           a->commit_timeout_ms != b->commit_timeout_ms || a->retry_max != b->retry_max ||
           a->backoff_initial_ms != b->backoff_initial_ms ||
           a->backoff_max_ms != b->backoff_max_ms || a->max_message_bytes != b->max_message_bytes ||
           a->format != b->format || a->stall_timeout_ms != b->stall_timeout_ms ||
           a->redis_probe_ms != b->redis_probe_ms || a->done_cache_entries != b->done_cache_entries;
}

/* A value for `def` that is not its default and that the table accepts. */
static void other_value(const wxg_conf_keydef_t *def, int64_t dflt, char *buf, size_t size)
{
    long long n = (long long)(dflt != def->min ? def->min : def->max);
    switch (def->type) {
    case WXG_CONF_INT:
    case WXG_CONF_SIZE:
        snprintf(buf, size, "%lld", n);
        break;
    case WXG_CONF_DURATION:
        snprintf(buf, size, "%lldms", n);
        break;
    case WXG_CONF_BOOL:
        snprintf(buf, size, "%s", dflt ? "false" : "true");
        break;
    case WXG_CONF_ENUM: {
        const char *p = def->allowed;
        size_t len = strcspn(p, "|");
        if (strlen(def->def) == len && strncmp(p, def->def, len) == 0) {
            p += len + 1;
            len = strcspn(p, "|");
        }
        snprintf(buf, size, "%.*s", (int)len, p);
        break;
    }
    case WXG_CONF_ADDR:
        snprintf(buf, size, "127.0.0.2:7");
        break;
    default: /* strings and lists */
        if (strstr(def->name, ".nodes"))
            snprintf(buf, size, "127.0.0.2:7");
        else if (strstr(def->name, ".rate"))
            snprintf(buf, size, "%s", strcmp(def->def, "2.5") != 0 ? "2.5" : "3.5");
        else
            snprintf(buf, size, "%s", strcmp(def->def, "t1") != 0 ? "t1" : "t2");
        break;
    }
}

typedef struct mapped {
    wxg_guard_conf_t guard;
    wxg_consumer_conf_t consumer;
    char prefix[WXG_GUARD_PREFIX_MAX + 1];
} mapped;

static void map_both(const wxg_conf_t *c, mapped *m)
{
    char err[ERRSZ] = "";
    if (wxg_conf_guard(c, &m->guard, m->prefix, sizeof m->prefix, err, sizeof err) != 0)
        fail_msg("wxg_conf_guard: %s", err);
    if (wxg_conf_consumer(c, &m->consumer, err, sizeof err) != 0)
        fail_msg("wxg_conf_consumer: %s", err);
}

/* The next key added under redis.*, guard.* or consumer.* without a line in lib/conf_map.c
 * fails here: each one is set to a value other than its default, alone, and what the mapping
 * fills must change. A redis.* or guard.* key must change the guard's configuration (except
 * the two the consumer itself reads), and one the guard reads must be declared for wxguardctl,
 * which opens the guard through the same mapping (else it would warn "not used"). */
static void every_redis_guard_and_consumer_key_lands_in_the_mapped_conf(void **state)
{
    (void)state;
    wxg_conf_t *base = new_conf(WXG_PROG_CONSUMER);
    mapped m0;
    map_both(base, &m0);
    size_t checked = 0;
    for (size_t i = 0; i < wxg_conf_keydef_count(); i++) {
        const wxg_conf_keydef_t *d = wxg_conf_keydef_at(i);
        int guard_family = starts_with(d->name, "redis.") || starts_with(d->name, "guard.");
        if (!guard_family && !starts_with(d->name, "consumer.") &&
            strcmp(d->name, "kafka.group.id") != 0)
            continue;
        char value[64], err[ERRSZ] = "";
        other_value(d, wxg_conf_int(base, d->name), value, sizeof value);
        wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
        if (wxg_conf_set(c, d->name, value, err, sizeof err) != 0)
            fail_msg("%s = %s: %s", d->name, value, err);
        mapped m;
        map_both(c, &m);
        int in_guard = guard_conf_differs(&m.guard, &m0.guard);
        int in_consumer = consumer_conf_differs(&m.consumer, &m0.consumer);
        if (guard_family && !is_consumer_side(d->name) && !in_guard)
            fail_msg("%s = %s does not reach the guard's configuration", d->name, value);
        if (!in_guard && !in_consumer)
            fail_msg("%s = %s reaches neither the guard's nor the consumer's configuration",
                     d->name, value);
        if (in_guard && !(d->programs & WXG_PROG_CTL))
            fail_msg("%s configures the guard but is not declared for wxguardctl", d->name);
        wxg_conf_free(c);
        checked++;
    }
    assert_true(checked >= 35);
    wxg_conf_free(base);
}

/* Each key reaches its own field, with its unit converted, and the empty optional strings reach
 * the guard as "not set". */
static void guard_and_consumer_confs_carry_each_key_to_its_field(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    mapped m;
    map_both(c, &m);
    assert_null(m.guard.unix_path);
    assert_null(m.guard.user);
    assert_null(m.guard.password);
    assert_null(m.guard.sentinels);
    assert_null(m.guard.sentinel_master);
    assert_false(m.guard.tls);
    assert_null(m.guard.tls_ca_file);
    assert_null(m.guard.tls_key_password);
    assert_true(m.guard.tls_verify);
    assert_string_equal(m.guard.client_name, "wxguard");
    assert_string_equal(m.guard.prefix, "wxg:");
    assert_int_equal(m.guard.wait_timeout_ms, 500);
    assert_int_equal(m.consumer.format, WXG_FORMAT_AUTO);

    const char *text = "redis.host = redis.test\n"
                       "redis.port = 6400\n"
                       "redis.unix.socket = /run/r.sock\n"
                       "redis.db = 3\n"
                       "redis.user = u1\n"
                       "redis.password = p1\n"
                       "redis.sentinels = 127.0.0.1:26379,127.0.0.1:26380\n"
                       "redis.sentinel.master = m1\n"
                       "redis.sentinel.user = su\n"
                       "redis.sentinel.password = sp\n"
                       "redis.tls = true\n"
                       "redis.tls.ca.file = /etc/ca.pem\n"
                       "redis.tls.ca.path = /etc/cas\n"
                       "redis.tls.cert.file = /etc/client.pem\n"
                       "redis.tls.key.file = /etc/client.key\n"
                       "redis.tls.key.password = kp\n"
                       "redis.tls.server.name = redis.internal\n"
                       "redis.tls.verify = false\n"
                       "redis.sentinel.tls = true\n"
                       "redis.client.name = billing-1\n"
                       "redis.connect.timeout.ms = 1500\n"
                       "redis.command.timeout.ms = 3s\n"
                       "redis.probe.interval.ms = 0\n"
                       "redis.key.prefix = app:one:\n"
                       "guard.design = lua\n"
                       "guard.lease.ms = 10s\n"
                       "guard.done.retention = 2d\n"
                       "guard.failed.retention = 3d\n"
                       "guard.wait.replicas = 2\n"
                       "guard.wait.timeout.ms = 250\n"
                       "guard.done.cache.entries = 0\n"
                       "kafka.group.id = g1\n"
                       "consumer.topics = a, b\n"
                       "consumer.format = gewe\n"
                       "consumer.workers = 7\n"
                       "consumer.queue.capacity = 99\n"
                       "consumer.batch.max = 16\n"
                       "consumer.batch.delay.ms = 5\n"
                       "consumer.drain.timeout.ms = 4s\n"
                       "consumer.commit.interval.ms = 2s\n"
                       "consumer.commit.timeout.ms = 6s\n"
                       "consumer.retry.max = 9\n"
                       "consumer.retry.backoff.initial.ms = 300\n"
                       "consumer.retry.backoff.max.ms = 1m\n"
                       "consumer.max.message.bytes = 2MiB\n"
                       "consumer.stall.timeout.ms = 90s\n";
    assert_int_equal(load(c, text, err), 0);
    map_both(c, &m);
    assert_string_equal(m.guard.host, "redis.test");
    assert_int_equal(m.guard.port, 6400);
    assert_string_equal(m.guard.unix_path, "/run/r.sock");
    assert_int_equal(m.guard.db, 3);
    assert_string_equal(m.guard.user, "u1");
    assert_string_equal(m.guard.password, "p1");
    assert_string_equal(m.guard.sentinels, "127.0.0.1:26379,127.0.0.1:26380");
    assert_string_equal(m.guard.sentinel_master, "m1");
    assert_string_equal(m.guard.sentinel_user, "su");
    assert_string_equal(m.guard.sentinel_password, "sp");
    assert_true(m.guard.tls);
    assert_string_equal(m.guard.tls_ca_file, "/etc/ca.pem");
    assert_string_equal(m.guard.tls_ca_path, "/etc/cas");
    assert_string_equal(m.guard.tls_cert_file, "/etc/client.pem");
    assert_string_equal(m.guard.tls_key_file, "/etc/client.key");
    assert_string_equal(m.guard.tls_key_password, "kp");
    assert_string_equal(m.guard.tls_server_name, "redis.internal");
    assert_false(m.guard.tls_verify);
    assert_true(m.guard.sentinel_tls);
    assert_string_equal(m.guard.client_name, "billing-1");
    assert_int_equal(m.guard.connect_timeout_ms, 1500);
    assert_int_equal(m.guard.command_timeout_ms, 3000);
    assert_string_equal(m.guard.prefix, "app:one:");
    assert_int_equal(m.guard.design, WXG_GUARD_DESIGN_LUA);
    assert_int_equal(m.guard.lease_ms, 10000);
    assert_int_equal(m.guard.done_retention_ms, 2LL * 24 * 3600 * 1000);
    assert_int_equal(m.guard.failed_retention_ms, 3LL * 24 * 3600 * 1000);
    assert_int_equal(m.guard.wait_replicas, 2);
    assert_int_equal(m.guard.wait_timeout_ms, 250);
    assert_int_equal(m.guard.batch_max, 16);

    assert_int_equal(m.consumer.ntopics, 2);
    assert_string_equal(m.consumer.topics[0], "a");
    assert_string_equal(m.consumer.topics[1], "b");
    assert_string_equal(m.consumer.group_id, "g1");
    assert_int_equal(m.consumer.format, WXG_FORMAT_GEWE);
    assert_int_equal(m.consumer.workers, 7);
    assert_int_equal(m.consumer.queue_capacity, 99);
    assert_int_equal(m.consumer.batch_max, 16);
    assert_int_equal(m.consumer.batch_delay_us, 5000);
    assert_int_equal(m.consumer.drain_timeout_ms, 4000);
    assert_int_equal(m.consumer.commit_interval_ms, 2000);
    assert_int_equal(m.consumer.commit_timeout_ms, 6000);
    assert_int_equal(m.consumer.retry_max, 9);
    assert_int_equal(m.consumer.backoff_initial_ms, 300);
    assert_int_equal(m.consumer.backoff_max_ms, 60000);
    assert_int_equal(m.consumer.max_message_bytes, 2 * 1024 * 1024);
    assert_int_equal(m.consumer.stall_timeout_ms, 90000);
    assert_int_equal(m.consumer.redis_probe_ms, 0);
    assert_int_equal(m.consumer.done_cache_entries, 0);
    /* The handles stay the caller's. */
    assert_null(m.consumer.kafka);
    assert_null(m.consumer.guard);
    assert_null(m.consumer.chain);
    assert_null(m.consumer.dlq);
    assert_null(m.consumer.metrics);
    wxg_conf_free(c);
}

/* redis.cluster.nodes reaches the guard as cluster_nodes and implies cluster (one shard per
 * script call); a seed list the guard could not parse, or one combined with Sentinel or a
 * database other than 0, is refused with the keys named. */
static void cluster_nodes_reach_the_guard_and_conflicts_are_refused(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    mapped m;
    map_both(c, &m);
    assert_null(m.guard.cluster_nodes);
    assert_false(m.guard.cluster);
    assert_int_equal(load(c, "redis.cluster.nodes = 10.0.0.1:7000, [::1]:7001,r3.test:7002\n", err),
                     0);
    map_both(c, &m);
    assert_string_equal(m.guard.cluster_nodes, "10.0.0.1:7000, [::1]:7001,r3.test:7002");
    assert_true(m.guard.cluster);
    wxg_conf_free(c);

    static const char *const bad[] = {"10.0.0.1", "10.0.0.1:0", "::1:7000",
                                      "a:1,,b:2", "a:1,",       "a b:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = new_conf(WXG_PROG_CONSUMER);
        if (wxg_conf_set(c, "redis.cluster.nodes", bad[i], err, sizeof err) != WXG_ECONFIG)
            fail_msg("redis.cluster.nodes = %s was accepted", bad[i]);
        assert_non_null(strstr(err, "redis.cluster.nodes"));
        wxg_conf_free(c);
    }

    c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(load(c,
                          "redis.cluster.nodes = 127.0.0.1:7000\n"
                          "redis.sentinels = 127.0.0.1:26379\nredis.sentinel.master = m\n",
                          err),
                     0);
    char prefix[WXG_GUARD_PREFIX_MAX + 1];
    wxg_guard_conf_t gc;
    assert_int_equal(wxg_conf_guard(c, &gc, prefix, sizeof prefix, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.cluster.nodes and redis.sentinels"));
    wxg_conf_free(c);

    c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(load(c, "redis.cluster.nodes = 127.0.0.1:7000\nredis.db = 2\n", err), 0);
    assert_int_equal(wxg_conf_guard(c, &gc, prefix, sizeof prefix, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.db"));
    wxg_conf_free(c);
}

/* Every format word the table allows is one the decoder knows. */
static void every_consumer_format_maps_to_a_decoder_format(void **state)
{
    (void)state;
    const wxg_conf_keydef_t *d = wxg_conf_keydef_find("consumer.format");
    assert_non_null(d);
    for (const char *p = d->allowed; *p;) {
        size_t len = strcspn(p, "|");
        char word[32], err[ERRSZ] = "";
        snprintf(word, sizeof word, "%.*s", (int)len, p);
        wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
        assert_int_equal(wxg_conf_set(c, "consumer.format", word, err, sizeof err), 0);
        wxg_consumer_conf_t cc;
        if (wxg_conf_consumer(c, &cc, err, sizeof err) != 0)
            fail_msg("consumer.format = %s: %s", word, err);
        wxg_conf_free(c);
        p += len;
        if (*p == '|')
            p++;
    }
}

/* The guard takes at most WXG_GUARD_PREFIX_MAX bytes of prefix including the ':' the mapping
 * adds: a 64-byte prefix without one is refused when it is set, not when the guard starts. */
static void the_key_prefix_fits_the_guard_with_its_colon(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    const wxg_conf_keydef_t *d = wxg_conf_keydef_find("redis.key.prefix");
    assert_int_equal(d->max, WXG_GUARD_PREFIX_MAX);
    char p63[64], p64[65];
    memset(p63, 'a', 63);
    p63[63] = '\0';
    memset(p64, 'a', 64);
    p64[64] = '\0';
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    assert_int_equal(wxg_conf_set(c, "redis.key.prefix", p64, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.key.prefix"));
    assert_int_equal(wxg_conf_set(c, "redis.key.prefix", p63, err, sizeof err), 0);
    mapped m;
    map_both(c, &m);
    assert_int_equal(strlen(m.guard.prefix), 64);
    assert_int_equal(m.guard.prefix[63], ':');
    p64[63] = ':';
    assert_int_equal(wxg_conf_set(c, "redis.key.prefix", p64, err, sizeof err), 0);
    map_both(c, &m);
    assert_string_equal(m.guard.prefix, p64);
    /* A buffer without room is refused, not overrun. */
    char small[8];
    wxg_guard_conf_t gc;
    assert_int_equal(wxg_conf_guard(c, &gc, small, sizeof small, err, sizeof err), WXG_EINVAL);
    assert_int_equal(wxg_conf_guard(NULL, &gc, small, sizeof small, err, sizeof err), WXG_EINVAL);
    wxg_conf_free(c);
}

/* ---- secrets from files -------------------------------------------------------------------- */

/* Writes `text` to dir/name with `mode`; returns the path (static buffer per call site). */
static void write_file(const char *dir, const char *name, const char *text, mode_t mode, char *path,
                       size_t size)
{
    snprintf(path, size, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static int has_warning(const wxg_conf_t *c, const char *a, const char *b)
{
    for (size_t i = 0; i < wxg_conf_warning_count(c); i++) {
        const char *w = wxg_conf_warning(c, i);
        if (strstr(w, a) != NULL && (b == NULL || strstr(w, b) != NULL))
            return 1;
    }
    return 0;
}

static void secret_files_give_secrets_with_one_newline_trimmed(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    char *dir = wxg_test_mkdtemp("wxg-conf-secret");
    assert_non_null(dir);
    char hmac[512], crlf[512], twice[512], envvar[600], setarg[600], line[700];
    /* Mounted secrets are commonly 0644: that draws no warning. */
    write_file(dir, "hmac", "s3cr3t-hmac\n", 0644, hmac, sizeof hmac);
    write_file(dir, "crlf", "s3cr3t-crlf\r\n", 0444, crlf, sizeof crlf);
    write_file(dir, "twice", "s3cr3t-two\n\n", 0600, twice, sizeof twice);

    wxg_conf_t *c = new_conf(WXG_PROG_INGEST | WXG_PROG_CONSUMER);
    snprintf(envvar, sizeof envvar, "WXG_INGEST_HMAC_SECRET__FILE=%s", hmac);
    const char *env[] = {envvar, NULL};
    assert_int_equal(wxg_conf_load_env(c, env, err, sizeof err), 0);
    assert_string_equal(wxg_conf_get(c, "ingest.hmac.secret"), "s3cr3t-hmac");
    char want[700];
    snprintf(want, sizeof want, "env WXG_INGEST_HMAC_SECRET__FILE (%s)", hmac);
    assert_string_equal(wxg_conf_origin(c, "ingest.hmac.secret"), want);
    /* In a properties file and with --set: <key>@file; "\r\n" is one newline. */
    snprintf(line, sizeof line, "redis.password@file = %s\n", crlf);
    assert_int_equal(load(c, line, err), 0);
    assert_string_equal(wxg_conf_get(c, "redis.password"), "s3cr3t-crlf");
    snprintf(want, sizeof want, "file test.conf:1 (%s)", crlf);
    assert_string_equal(wxg_conf_origin(c, "redis.password"), want);
    /* Only one newline goes: a second one is part of the value, which refuses it. */
    snprintf(setarg, sizeof setarg, "log.id.salt@file=%s", twice);
    assert_int_equal(wxg_conf_set_arg(c, setarg, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "log.id.salt: the value holds a control character"));
    assert_null(strstr(err, "s3cr3t"));
    /* A kafka.* secret too. */
    snprintf(setarg, sizeof setarg, "kafka.sasl.password@file=%s", hmac);
    assert_int_equal(wxg_conf_set_arg(c, setarg, err, sizeof err), 0);
    assert_string_equal(wxg_conf_get(c, "kafka.sasl.password"), "s3cr3t-hmac");
    /* Neither the file form nor a 0644 secret file draws a warning, and nothing prints the
     * values. */
    assert_int_equal(wxg_conf_warning_count(c), 0);
    char *out = print_to_string(c);
    assert_null(strstr(out, "s3cr3t"));
    assert_non_null(strstr(out, "# from env WXG_INGEST_HMAC_SECRET__FILE ("));
    free(out);
    wxg_conf_free(c);
    wxg_test_rmtree(dir);
    free(dir);
}

static void secret_files_are_refused_for_other_keys_and_when_unreadable(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    char *dir = wxg_test_mkdtemp("wxg-conf-secret");
    assert_non_null(dir);
    char host[512], envvar[600], missing[600];
    write_file(dir, "host", "redis.example\n", 0600, host, sizeof host);

    /* A key that is not a secret: refused, naming it. */
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    snprintf(envvar, sizeof envvar, "WXG_REDIS_HOST__FILE=%s", host);
    const char *env1[] = {envvar, NULL};
    assert_int_equal(wxg_conf_load_env(c, env1, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.host is not a secret key"));
    assert_non_null(strstr(err, "WXG_REDIS_HOST__FILE"));
    char line[700];
    snprintf(line, sizeof line, "consumer.workers@file = %s\n", host);
    assert_int_equal(load(c, line, err), WXG_ECONFIG);
    assert_non_null(strstr(err, "consumer.workers is not a secret key"));
    snprintf(line, sizeof line, "no.such.key@file = %s\n", host);
    assert_int_equal(load(c, line, err), WXG_ECONFIG);
    assert_non_null(strstr(err, "unknown configuration key \"no.such.key\""));
    wxg_conf_free(c);

    /* A missing file: the key and the path are named. */
    c = new_conf(WXG_PROG_INGEST);
    snprintf(missing, sizeof missing, "WXG_INGEST_OA_TOKEN__FILE=%s/absent", dir);
    const char *env2[] = {missing, NULL};
    assert_int_equal(wxg_conf_load_env(c, env2, err, sizeof err), WXG_EIO);
    assert_non_null(strstr(err, "ingest.oa.token: cannot read the secret file"));
    assert_non_null(strstr(err, "/absent"));
    wxg_conf_free(c);

    /* The key whose own name ends in .file keeps its variable: WXG_REDIS_TLS_KEY_FILE is
     * redis.tls.key.file (a path, not a secret file to read). */
    c = new_conf(WXG_PROG_CONSUMER);
    snprintf(envvar, sizeof envvar, "WXG_REDIS_TLS_KEY_FILE=%s", host);
    const char *env3[] = {envvar, NULL};
    assert_int_equal(wxg_conf_load_env(c, env3, err, sizeof err), 0);
    assert_string_equal(wxg_conf_get(c, "redis.tls.key.file"), host);
    assert_string_equal(wxg_conf_origin(c, "redis.tls.key.file"), "env WXG_REDIS_TLS_KEY_FILE");
    /* ... and its __FILE form is refused: it is not a secret. */
    snprintf(envvar, sizeof envvar, "WXG_REDIS_TLS_KEY_FILE__FILE=%s", host);
    assert_int_equal(wxg_conf_load_env(c, env3, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.tls.key.file is not a secret key"));
    wxg_conf_free(c);
    wxg_test_rmtree(dir);
    free(dir);
}

static void secret_files_follow_the_precedence_of_their_source(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    char *dir = wxg_test_mkdtemp("wxg-conf-secret");
    assert_non_null(dir);
    char fromfile[512], envvar[600], line[700];
    write_file(dir, "pw", "from-secret-file\n", 0600, fromfile, sizeof fromfile);

    /* file < env (__FILE counts as env) < --set, whatever the order of the calls. */
    wxg_conf_t *c = new_conf(WXG_PROG_CONSUMER);
    snprintf(envvar, sizeof envvar, "WXG_REDIS_PASSWORD__FILE=%s", fromfile);
    const char *env[] = {envvar, NULL};
    assert_int_equal(wxg_conf_load_env(c, env, err, sizeof err), 0);
    assert_int_equal(load(c, "redis.password = from-properties\n", err), 0);
    assert_string_equal(wxg_conf_get(c, "redis.password"), "from-secret-file");
    assert_int_equal(wxg_conf_set(c, "redis.password", "from-set", err, sizeof err), 0);
    assert_string_equal(wxg_conf_get(c, "redis.password"), "from-set");
    wxg_conf_free(c);

    /* A properties file's @file loses to the environment's plain value. */
    c = new_conf(WXG_PROG_CONSUMER);
    snprintf(line, sizeof line, "redis.password@file = %s\n", fromfile);
    assert_int_equal(load(c, line, err), 0);
    const char *env2[] = {"WXG_REDIS_PASSWORD=from-env", NULL};
    assert_int_equal(wxg_conf_load_env(c, env2, err, sizeof err), 0);
    assert_string_equal(wxg_conf_get(c, "redis.password"), "from-env");
    wxg_conf_free(c);

    /* The variable itself and its __FILE form together: refused, naming both. */
    c = new_conf(WXG_PROG_CONSUMER);
    const char *env3[] = {"WXG_REDIS_PASSWORD=from-env", envvar, NULL};
    assert_int_equal(wxg_conf_load_env(c, env3, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.password is set twice"));
    assert_non_null(strstr(err, "env WXG_REDIS_PASSWORD and env WXG_REDIS_PASSWORD__FILE"));
    assert_null(strstr(err, "from-"));
    wxg_conf_free(c);

    /* The key and its @file form in one properties file: set twice. */
    c = new_conf(WXG_PROG_CONSUMER);
    snprintf(line, sizeof line, "redis.password = x\nredis.password@file = %s\n", fromfile);
    assert_int_equal(load(c, line, err), WXG_ECONFIG);
    assert_non_null(strstr(err, "redis.password is set twice"));
    wxg_conf_free(c);
    wxg_test_rmtree(dir);
    free(dir);
}

static void secrets_on_the_command_line_and_in_open_files_draw_warnings(void **state)
{
    (void)state;
    char err[ERRSZ] = "";
    char *dir = wxg_test_mkdtemp("wxg-conf-secret");
    assert_non_null(dir);
    char open_conf[512], closed_conf[512], plain_conf[512];
    const char *text = "kafka.bootstrap.servers = 127.0.0.1:9092\n"
                       "ingest.hmac.secret = s3cr3t-hmac\nkafka.sasl.password = s3cr3t-sasl\n";
    write_file(dir, "open.conf", text, 0640, open_conf, sizeof open_conf);
    write_file(dir, "closed.conf", text, 0600, closed_conf, sizeof closed_conf);
    /* A connection string is a secret by name; one without a password holds none. */
    write_file(dir, "plain.conf",
               "kafka.bootstrap.servers = 127.0.0.1:9092\n"
               "plugin.pgsql.dsn = host=db dbname=wxguard user=wxguard\n",
               0644, plain_conf, sizeof plain_conf);

    /* --set of a secret: a warning naming the key and the other ways to give it. */
    wxg_conf_t *c = new_conf(WXG_PROG_INGEST);
    assert_int_equal(wxg_conf_set_arg(c, "ingest.hmac.secret=s3cr3t", err, sizeof err), 0);
    assert_true(has_warning(c, "ingest.hmac.secret is a secret given with --set",
                            "WXG_INGEST_HMAC_SECRET__FILE"));
    assert_false(has_warning(c, "s3cr3t", NULL));
    /* Not for a key that is not a secret, nor for an empty secret. */
    assert_int_equal(wxg_conf_set_arg(c, "ingest.topic=t", err, sizeof err), 0);
    assert_int_equal(wxg_conf_set_arg(c, "ingest.oa.token=", err, sizeof err), 0);
    assert_int_equal(wxg_conf_warning_count(c), 1);
    wxg_conf_free(c);

    /* A file readable by its group that holds secrets: one warning naming file and keys. */
    c = new_conf(WXG_PROG_INGEST);
    assert_int_equal(wxg_conf_load_file(c, open_conf, err, sizeof err), 0);
    assert_int_equal(wxg_conf_warning_count(c), 1);
    assert_true(has_warning(c, open_conf, "ingest.hmac.secret, kafka.sasl.password"));
    assert_true(has_warning(c, "readable by group or others (mode 0640)", NULL));
    assert_false(has_warning(c, "s3cr3t", NULL));
    wxg_conf_free(c);
    c = new_conf(WXG_PROG_CONSUMER);
    char dsn_conf[512];
    write_file(dir, "dsn.conf", "plugin.pgsql.dsn = postgresql://wxguard:pw@db/wxguard\n", 0644,
               dsn_conf, sizeof dsn_conf);
    assert_int_equal(wxg_conf_load_file(c, dsn_conf, err, sizeof err), 0);
    assert_true(has_warning(c, dsn_conf, "plugin.pgsql.dsn"));
    wxg_conf_free(c);
    /* The same file readable by its owner only, and an open file without secrets: silent. */
    c = new_conf(WXG_PROG_INGEST);
    assert_int_equal(wxg_conf_load_file(c, closed_conf, err, sizeof err), 0);
    assert_int_equal(wxg_conf_warning_count(c), 0);
    wxg_conf_free(c);
    c = new_conf(WXG_PROG_INGEST);
    assert_int_equal(wxg_conf_load_file(c, plain_conf, err, sizeof err), 0);
    assert_int_equal(wxg_conf_warning_count(c), 0);
    wxg_conf_free(c);
    wxg_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_default_in_the_table_is_valid_and_described),
        cmocka_unit_test(later_sources_win_whatever_the_call_order),
        cmocka_unit_test(a_key_twice_in_one_file_is_refused_naming_both_lines),
        cmocka_unit_test(unknown_keys_are_refused_with_the_key_named),
        cmocka_unit_test(bad_values_are_refused_with_key_and_origin),
        cmocka_unit_test(units_and_bounds_parse_exactly),
        cmocka_unit_test(lists_split_and_trim),
        cmocka_unit_test(check_refuses_missing_required_keys_and_inconsistent_pairs),
        cmocka_unit_test(secrets_never_appear_in_print_or_errors),
        cmocka_unit_test(environment_names_map_to_keys),
        cmocka_unit_test(kafka_keys_are_validated_by_librdkafka_and_passed_on),
        cmocka_unit_test(plugin_keys_form_a_sub_map_per_plugin),
        cmocka_unit_test(plugin_settings_keep_every_plugin_key_whole_for_the_registry),
        cmocka_unit_test(load_reads_a_file_and_runs_every_source),
        cmocka_unit_test(reference_ranges_read_like_the_docs),
        cmocka_unit_test(every_redis_guard_and_consumer_key_lands_in_the_mapped_conf),
        cmocka_unit_test(guard_and_consumer_confs_carry_each_key_to_its_field),
        cmocka_unit_test(cluster_nodes_reach_the_guard_and_conflicts_are_refused),
        cmocka_unit_test(every_consumer_format_maps_to_a_decoder_format),
        cmocka_unit_test(the_key_prefix_fits_the_guard_with_its_colon),
        cmocka_unit_test(secret_files_give_secrets_with_one_newline_trimmed),
        cmocka_unit_test(secret_files_are_refused_for_other_keys_and_when_unreadable),
        cmocka_unit_test(secret_files_follow_the_precedence_of_their_source),
        cmocka_unit_test(secrets_on_the_command_line_and_in_open_files_draw_warnings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
