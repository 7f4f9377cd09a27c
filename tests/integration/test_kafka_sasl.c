/*
 * Every Kafka client of wxguard through an authenticated broker: the consumer (with its
 * dead-letter producer), `wxguardctl redrive` and wxguard-ingest, each over SASL_PLAINTEXT and
 * over SASL_SSL (the broker's certificate checked against the fixture's CA). Only kafka.*
 * settings change: they pass straight to librdkafka. A wrong password is a start-up error of
 * each program, exit status 3, whose output names the refusal and never the password.
 *
 * The fixture's broker (scripts/services.sh) takes one user by PLAIN and by SCRAM-SHA-256. The
 * tests log in with PLAIN: librdkafka before 2.6.1 repeats the client nonce in its final SCRAM
 * message, which Kafka 4 refuses as invalid credentials; the SCRAM test runs where the linked
 * librdkafka is new enough and is skipped, saying why, where it is not.
 *
 * Topics are created and read back through the plain listener (test support); what is under
 * test talks only to the authenticated ones.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "consumertest.h"
#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"

#define ID_BASE           7302000000000000000ULL
#define BAD_SECRET        "not-The-Pa55word-4711"
#define MAX_ARGS          48
#define EXIT_START_FAILED 3 /* the programs' exit status for a start-up failure */

/* One authenticated listener of the fixture's broker. */
typedef struct listener {
    const char *name;      /* for messages */
    const char *protocol;  /* security.protocol */
    const char *bootstrap; /* its address */
    int tls;               /* 1: hand the CA to the client */
} listener;

static listener listener_of(int tls)
{
    listener l = {
        .name = tls ? "SASL_SSL" : "SASL_PLAINTEXT",
        .protocol = tls ? "SASL_SSL" : "SASL_PLAINTEXT",
        .bootstrap = wxg_test_env_required(tls ? "WXG_TEST_KAFKA_SSL_BOOTSTRAP"
                                               : "WXG_TEST_KAFKA_SASL_BOOTSTRAP"),
        .tls = tls,
    };
    return l;
}

/* The kafka.* settings for listener `l` as "key=value" strings into kv[] (at most 6), with
 * `password` (NULL: the fixture's) and `mechanism` (NULL: the fixture's). Returns how many. */
static int kafka_settings(const listener *l, const char *password, const char *mechanism,
                          char kv[6][512])
{
    int n = 0;
    snprintf(kv[n++], 512, "kafka.bootstrap.servers=%s", l->bootstrap);
    snprintf(kv[n++], 512, "kafka.security.protocol=%s", l->protocol);
    snprintf(kv[n++], 512, "kafka.sasl.mechanisms=%s",
             mechanism ? mechanism : wxg_test_env_required("WXG_TEST_KAFKA_SASL_MECHANISM"));
    snprintf(kv[n++], 512, "kafka.sasl.username=%s",
             wxg_test_env_required("WXG_TEST_KAFKA_SASL_USER"));
    snprintf(kv[n++], 512, "kafka.sasl.password=%s",
             password ? password : wxg_test_env_required("WXG_TEST_KAFKA_SASL_PASSWORD"));
    if (l->tls)
        snprintf(kv[n++], 512, "kafka.ssl.ca.location=%s",
                 wxg_test_env_required("WXG_TEST_KAFKA_CA"));
    return n;
}

/* The same settings as configuration-file lines ("key = value\n"). */
static void kafka_lines(const listener *l, const char *password, char *out, size_t size)
{
    char kv[6][512];
    int n = kafka_settings(l, password, NULL, kv);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        char *eq = strchr(kv[i], '=');
        size_t len = strlen(out);
        snprintf(out + len, size - len, "%.*s = %s\n", (int)(eq - kv[i]), kv[i], eq + 1);
    }
}

/* ---- child processes ---------------------------------------------------------------------- */

/* Starts `argv[0]` with its output (stdout and stderr) to `logp`. */
static pid_t spawn(const char *const *argv, const char *logp)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0)
            _exit(120);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    return pid;
}

/* The whole file at `path` (NUL-terminated; caller frees), "" when unreadable. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        buf = malloc(n > 0 ? (size_t)n + 1 : 1);
        assert_non_null(buf);
        len = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
        fclose(f);
    } else {
        buf = malloc(1);
        assert_non_null(buf);
    }
    buf[len] = '\0';
    return buf;
}

/* Asserts that the output at `logp` says `needle` and never shows BAD_SECRET. */
static void assert_refusal_reported(const char *logp, const char *needle)
{
    char *out = slurp(logp);
    if (!strstr(out, needle))
        fail_msg("no '%s' in the output:\n%s", needle, out);
    if (strstr(out, BAD_SECRET))
        fail_msg("the output repeats the password:\n%s", out);
    free(out);
}

static const char *bin_path(char *buf, size_t size, const char *rel)
{
    const char *bin = getenv("WXG_BINARY_DIR");
    assert_non_null(bin);
    snprintf(buf, size, "%s/%s", bin, rel);
    return buf;
}

/* ---- wxguardctl redrive ------------------------------------------------------------------- */

/* Runs `wxguardctl redrive --all` from t's dead-letter topic to `to_topic` over listener `l`
 * with `password` (NULL: the fixture's); output to `logp`. Returns the exit status. */
static int redrive(const wxg_ct_t *t, const listener *l, const char *password, const char *to_topic,
                   const char *logp)
{
    char ctl[512], redis[64], dlq[300], prefix[128], kv[6][512];
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = bin_path(ctl, sizeof ctl, "cmd/wxguardctl/wxguardctl");
    argv[n++] = "redrive";
    argv[n++] = "--all";
    argv[n++] = "--to-topic";
    argv[n++] = to_topic;
    argv[n++] = "--quiet";
    snprintf(redis, sizeof redis, "%s:%d", t->redis_host, t->redis_port);
    argv[n++] = "--redis";
    argv[n++] = redis;
    snprintf(dlq, sizeof dlq, "dlq.topic=%s", t->dlq);
    snprintf(prefix, sizeof prefix, "redis.key.prefix=%s", t->prefix);
    argv[n++] = "--set";
    argv[n++] = dlq;
    argv[n++] = "--set";
    argv[n++] = prefix;
    argv[n++] = "--set";
    argv[n++] = "kafka.broker.address.family=v4";
    int nk = kafka_settings(l, password, NULL, kv);
    for (int i = 0; i < nk; i++) {
        argv[n++] = "--set";
        argv[n++] = kv[i];
    }
    argv[n] = NULL;
    return wxg_test_wait_child(spawn(argv, logp), 90000);
}

/* ---- the consumer, its dead-letter producer and redrive ------------------------------------ */

static void consumer_dead_letters_and_redrive_run_over(int tls)
{
    listener l = listener_of(tls);
    wxg_ct_t t;
    wxg_ct_setup(&t, tls ? "sasl-ssl" : "sasl", 1);
    char extra[4096];
    kafka_lines(&l, NULL, extra, sizeof extra);
    wxg_ct_write_config(&t, extra);

    wxg_ct_msg_t msgs[5];
    for (int i = 0; i < 5; i++)
        msgs[i] = (wxg_ct_msg_t){.partition = 0, .id = ID_BASE + (uint64_t)i, .conv = 1};
    wxg_ct_produce(&t, msgs, 5);                     /* offsets 0..4 */
    wxg_ct_produce_raw(&t, 0, "{\"account\": oops"); /* offset 5: to the dead-letter topic */
    wxg_ct_spawn(&t, 0);
    if (!wxg_ct_wait_all_committed(&t, 60000, NULL)) {
        int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
        wxg_ct_assert_exit(&t, 0, st, 0);
        fail_msg("%s: the consumer did not commit every offset", l.name);
    }
    wxg_ct_assert_each_once(&t, ID_BASE, 5);
    wxg_test_kafka_msg_t *parked = NULL;
    size_t n = wxg_test_kafka_read(t.dlq, 1, 30000, &parked);
    assert_int_equal(n, 1);
    assert_string_equal(parked[0].value, "{\"account\": oops");
    wxg_test_kafka_msgs_free(parked, n);
    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    wxg_ct_assert_exit(&t, 0, st, 0);

    /* The parked record back out, to a topic of its own so that the count is exact. */
    char *back = wxg_test_kafka_name(tls ? "sasl-ssl-back" : "sasl-back");
    wxg_test_kafka_create_topic(back, 1);
    char logp[600];
    snprintf(logp, sizeof logp, "%s/redrive.log", t.dir);
    int rc = redrive(&t, &l, NULL, back, logp);
    if (rc != 0) {
        char *out = slurp(logp);
        fail_msg("%s: redrive exited %d:\n%s", l.name, rc, out);
    }
    wxg_test_kafka_msg_t *again = NULL;
    n = wxg_test_kafka_read(back, 1, 30000, &again);
    assert_int_equal(n, 1);
    assert_string_equal(again[0].value, "{\"account\": oops");
    wxg_test_kafka_msgs_free(again, n);
    free(back);
    wxg_ct_teardown(&t);
}

static void consumer_dead_letters_and_redrive_run_over_sasl_plaintext(void **state)
{
    (void)state;
    consumer_dead_letters_and_redrive_run_over(0);
}

static void consumer_dead_letters_and_redrive_run_over_sasl_ssl(void **state)
{
    (void)state;
    consumer_dead_letters_and_redrive_run_over(1);
}

/* ---- wxguard-ingest ----------------------------------------------------------------------- */

/* Starts wxguard-ingest on a port of its choosing for `topic` over listener `l` with `password`
 * (NULL: the fixture's), output to `logp`. */
static pid_t spawn_ingest(const listener *l, const char *password, const char *topic,
                          const char *logp)
{
    char bin[512], top[300], kv[6][512];
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = bin_path(bin, sizeof bin, "cmd/wxguard-ingest/wxguard-ingest");
    snprintf(top, sizeof top, "ingest.topic=%s", topic);
    const char *sets[] = {top, "ingest.listen=127.0.0.1:0", "ingest.ops.listen=127.0.0.1:0",
                          "kafka.broker.address.family=v4"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        argv[n++] = "--set";
        argv[n++] = sets[i];
    }
    int nk = kafka_settings(l, password, NULL, kv);
    for (int i = 0; i < nk; i++) {
        argv[n++] = "--set";
        argv[n++] = kv[i];
    }
    argv[n] = NULL;
    return spawn(argv, logp);
}

/* The port that the ingest writing to `logp` listens on, once it said so and /readyz on the
 * operations port it wrote just before answers 200 (a broker connection is up); fails the test
 * after 30 s (scaled) or when it exits. */
static int ingest_ready(pid_t pid, const char *logp)
{
    int64_t deadline = wxg_test_now_ms() + 30000 * wxg_test_scale();
    for (;;) {
        char *out = slurp(logp);
        const char *at = strstr(out, "wxguard-ingest listening on port ");
        int port = at ? (int)strtol(at + strlen("wxguard-ingest listening on port "), NULL, 10) : 0;
        const char *oat = strstr(out, "wxguard-ingest operations on port ");
        int ops =
            oat ? (int)strtol(oat + strlen("wxguard-ingest operations on port "), NULL, 10) : 0;
        free(out);
        wxg_test_http_resp_t r;
        if (port > 0 && ops > 0 && wxg_test_http(ops, "GET", "/readyz", NULL, NULL, 0, &r) == 0) {
            int status = r.status;
            wxg_test_http_free(&r);
            if (status == 200)
                return port;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            fail_msg("wxguard-ingest exited at start-up (see %s)", logp);
        if (wxg_test_now_ms() > deadline)
            fail_msg("wxguard-ingest not ready in time (see %s)", logp);
        wxg_test_sleep_ms(100);
    }
}

static void ingest_runs_over(int tls)
{
    listener l = listener_of(tls);
    char *dir = wxg_test_mkdtemp("wxg-sasl-ingest");
    assert_non_null(dir);
    char *topic = wxg_test_kafka_name(tls ? "sasl-ssl-ingest" : "sasl-ingest");
    wxg_test_kafka_create_topic(topic, 1);
    char logp[600];
    snprintf(logp, sizeof logp, "%s/ingest.log", dir);
    pid_t pid = spawn_ingest(&l, NULL, topic, logp);
    int port = ingest_ready(pid, logp);

    const char *body = "{\"account\":\"wxid_saslbot01\",\"msg_id\":\"7302000000000000099\","
                       "\"conversation\":\"conv0001@chatroom\",\"sender\":\"wxid_sender0001\","
                       "\"create_time\":1700000000,\"type\":\"text\",\"is_group\":true,"
                       "\"content\":\"over an authenticated listener\"}";
    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(port, "POST", "/v1/callback/generic",
                                   "Content-Type: application/json\r\n", body, strlen(body), &r),
                     0);
    if (r.status != 200)
        fail_msg("%s: POST answered %d: %s", l.name, r.status, r.body ? r.body : "");
    wxg_test_http_free(&r);
    wxg_test_kafka_msg_t *got = NULL;
    size_t n = wxg_test_kafka_read(topic, 1, 30000, &got);
    assert_int_equal(n, 1);
    assert_non_null(strstr(got[0].value, "over an authenticated listener"));
    wxg_test_kafka_msgs_free(got, n);

    kill(pid, SIGTERM);
    assert_int_equal(wxg_test_wait_child(pid, 30000), 0);
    free(topic);
    wxg_test_rmtree(dir);
    free(dir);
}

static void ingest_runs_over_sasl_plaintext(void **state)
{
    (void)state;
    ingest_runs_over(0);
}

static void ingest_runs_over_sasl_ssl(void **state)
{
    (void)state;
    ingest_runs_over(1);
}

/* ---- a wrong password --------------------------------------------------------------------- */

/* Each program, given a wrong password, stops at start-up with exit status 3 and says that
 * Kafka refused the credentials, without the password. */
static void a_wrong_password_is_a_start_up_error_over(int tls)
{
    listener l = listener_of(tls);
    wxg_ct_t t;
    wxg_ct_setup(&t, tls ? "sasl-ssl-bad" : "sasl-bad", 1);
    char extra[4096], logp[600];
    kafka_lines(&l, BAD_SECRET, extra, sizeof extra);
    wxg_ct_write_config(&t, extra);

    /* The consumer: waits until it reported, then reaps it (SIGTERM, had it not exited). */
    wxg_ct_spawn(&t, 0);
    int64_t deadline = wxg_test_now_ms() + 30000 * wxg_test_scale();
    while (wxg_ct_log_count(&t, 0, "kafka_auth_failed") == 0 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    wxg_test_sleep_ms(200);
    int st = wxg_ct_signal(&t, 0, SIGTERM, 30000);
    wxg_ct_assert_exit(&t, 0, st, EXIT_START_FAILED);
    snprintf(logp, sizeof logp, "%s/replica-0.log", t.dir);
    assert_refusal_reported(logp, "event=kafka_auth_failed err=EAUTH");
    assert_refusal_reported(logp, "Kafka refused the credentials");

    /* wxguard-ingest. */
    snprintf(logp, sizeof logp, "%s/ingest.log", t.dir);
    assert_int_equal(wxg_test_wait_child(spawn_ingest(&l, BAD_SECRET, t.topic, logp), 30000),
                     EXIT_START_FAILED);
    assert_refusal_reported(logp, "event=kafka_auth_failed err=EAUTH");

    /* wxguardctl redrive. */
    snprintf(logp, sizeof logp, "%s/redrive.log", t.dir);
    assert_int_equal(redrive(&t, &l, BAD_SECRET, t.topic, logp), EXIT_START_FAILED);
    assert_refusal_reported(logp, "wxguardctl redrive: Kafka refused the credentials");
    wxg_ct_teardown(&t);
}

static void a_wrong_password_is_a_start_up_error_over_sasl_plaintext(void **state)
{
    (void)state;
    a_wrong_password_is_a_start_up_error_over(0);
}

static void a_wrong_password_is_a_start_up_error_over_sasl_ssl(void **state)
{
    (void)state;
    a_wrong_password_is_a_start_up_error_over(1);
}

/* ---- SCRAM -------------------------------------------------------------------------------- */

static void scram_sha_256_logs_in_where_the_client_library_can(void **state)
{
    (void)state;
    /* librdkafka 2.6.1 is the first whose final SCRAM message Kafka 4 accepts. */
    if (rd_kafka_version() < 0x020601ff) {
        print_message("skipped: librdkafka %s predates 2.6.1, whose SCRAM Kafka 4 accepts\n",
                      rd_kafka_version_str());
        skip();
    }
    listener l = listener_of(1);
    char kv[6][512];
    int n = kafka_settings(&l, NULL, "SCRAM-SHA-256", kv);
    wxg_kafka_prop_t props[7];
    for (int i = 0; i < n; i++) {
        char *eq = strchr(kv[i], '=');
        *eq = '\0';
        props[i] = (wxg_kafka_prop_t){kv[i] + strlen("kafka."), eq + 1};
    }
    props[n++] = (wxg_kafka_prop_t){"broker.address.family", "v4"};
    char err[512];
    wxg_producer_t *p = wxg_producer_new(props, (size_t)n, err, sizeof err);
    assert_non_null(p);
    int rc = wxg_producer_check(p, 20000 * wxg_test_scale(), err, sizeof err);
    if (rc != 0)
        fail_msg("SCRAM-SHA-256 over SASL_SSL: %s (%s)", wxg_err_name(rc), err);
    wxg_producer_destroy(p, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(consumer_dead_letters_and_redrive_run_over_sasl_plaintext),
        cmocka_unit_test(consumer_dead_letters_and_redrive_run_over_sasl_ssl),
        cmocka_unit_test(ingest_runs_over_sasl_plaintext),
        cmocka_unit_test(ingest_runs_over_sasl_ssl),
        cmocka_unit_test(a_wrong_password_is_a_start_up_error_over_sasl_plaintext),
        cmocka_unit_test(a_wrong_password_is_a_start_up_error_over_sasl_ssl),
        cmocka_unit_test(scram_sha_256_logs_in_where_the_client_library_can),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
