/* End to end: nothing wxguard-consumer writes names a person or holds a secret.
 *
 * The inputs' accounts, conversations, senders and openids are known, and so is every secret the
 * consumer's configuration holds (the Redis password, a SASL password, the log salt). Two
 * replica runs, with log.level = debug and kafka.debug = all, go through every kind of failure
 * the consumer logs: undecodable records, a plugin that fails for good (a generic message and
 * an Official Account push, both dead-lettered), Redis going away and coming back, a message
 * that stalls past consumer.stall.timeout.ms, and a lease lost (the stalled message's claim is
 * released by the operator meanwhile). Then every line of every replica's output is searched:
 * none of those ids and none of those secrets appears. The test also asserts that each failure
 * really happened (its log event is there), so that it cannot pass by logging nothing.
 *
 * The receiver (wxguard-ingest) gets the same search with its own secrets (the Official
 * Account token and AES keys, the gateway HMAC secret), accepting and refusing callbacks.
 *
 * Then every secret is used for real, with log.level = debug and kafka.debug = all: the
 * consumer and its dead-letter producer over SASL_SSL with a client certificate whose key is
 * encrypted (sasl.password, ssl.key.password), Redis found through a Sentinel that wants a
 * password, the log salt; then a wrong SASL password and a wrong Sentinel password (start-up
 * errors); then `wxguardctl redrive` with the same secrets. Nothing any of them wrote holds a
 * password, the salt or a line of the private key. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "consumertest.h"
#include "oacrypt_int.h"
#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"
#include "wxguard/ingest.h"
#include "wxguard/msg.h"

#define ACCT    "wxid_prvbotA1x"
#define CONV    "prvroomB2x@chatroom"
#define SENDER  "wxid_prvsenderC3x"
#define OA_ACCT "gh_prvoaD4x0001"
#define OPENID  "oPRVopenidE5xQw"

#define REDIS_PW "redisPwF6-never-logged"
#define SASL_PW  "saslPwG7-never-logged"
#define SALT     "saltH8-never-logged"
#define OA_TOKEN "oaTokenJ9neverlogged"
#define HMAC_SEC "hmacSecretK1-never-logged"
/* EncodingAESKeys are 43 base64 characters. */
#define AES_KEY  "PrvAesKeyL2neverlogged0123456789abcdefghijk"
#define AES_PREV "PrvAesKeyM3neverlogged0123456789abcdefghijk"
#define APPID    "wx_prvappN4x0001"

#define ID_BASE  7401234567000000000ULL
#define ID_FAIL  (ID_BASE + 900)
#define ID_STALL (ID_BASE + 901)
#define OA_MSGID "24600000000000777"

/* Everything that must never appear in the output. */
static const char *const forbidden[] = {ACCT,         CONV,     SENDER,  OA_ACCT, OPENID,
                                        "prvroomB2x", REDIS_PW, SASL_PW, SALT,    OA_TOKEN,
                                        HMAC_SEC,     AES_KEY,  AES_PREV};

static char *generic(uint64_t id)
{
    char *s = malloc(512);
    assert_non_null(s);
    snprintf(s, 512,
             "{\"account\":\"" ACCT "\",\"msg_id\":\"%llu\",\"conversation\":\"" CONV
             "\",\"sender\":\"" SENDER "\",\"create_time\":1700000000,\"type\":\"text\","
             "\"is_group\":true,\"content\":\"privacy probe %llu\"}",
             (unsigned long long)id, (unsigned long long)id);
    return s;
}

static const char oa_push[] = "<xml><ToUserName><![CDATA[" OA_ACCT "]]></ToUserName>"
                              "<FromUserName><![CDATA[" OPENID "]]></FromUserName>"
                              "<CreateTime>1732329909</CreateTime>"
                              "<MsgType><![CDATA[text]]></MsgType>"
                              "<Content><![CDATA[hello]]></Content>"
                              "<MsgId>" OA_MSGID "</MsgId></xml>";

/* Records that do not decode, each still carrying the ids as text. */
static const char *const poison[] = {
    "{\"account\":\"" ACCT "\",\"conversation\":\"" CONV "\",\"sender\":\"" SENDER "\",\"msg_id\":",
    "<xml><ToUserName><![CDATA[" OA_ACCT "]]></ToUserName><FromUserName><![CDATA[" OPENID
    "]]></FromUserName><MsgType>",
};

static void produce_generic(wxg_ct_t *t, uint64_t from, int n)
{
    for (int i = 0; i < n; i++) {
        char *v = generic(from + (uint64_t)i);
        wxg_ct_produce_raw(t, i % t->partitions, v);
        free(v);
    }
}

/* The idempotency key of message `id`, as the consumer computes it. */
static void key_of(uint64_t id, char *out, size_t size)
{
    char *v = generic(id);
    wxg_batch_t *b = NULL;
    char reason[256];
    wxg_decode_opts_t opts = {0};
    assert_int_equal(wxg_decode(v, strlen(v), &opts, &b, reason, sizeof reason), 0);
    assert_int_equal(wxg_batch_count(b), 1);
    snprintf(out, size, "%s", wxg_batch_msg(b, 0)->key);
    wxg_batch_free(b);
    free(v);
}

/* Starts argv[0] (found on PATH when it has no slash) with stdout and stderr appended to
 * `out`. Returns its pid. */
static pid_t spawn_to(const char *const *argv, const char *out)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd < 0)
            _exit(120);
        dup2(fd, 1);
        dup2(fd, 2);
        execvp(argv[0], (char *const *)argv);
        _exit(121);
    }
    return pid;
}

/* Runs wxguardctl with the test's configuration; its own output goes to <dir>/ctl.out (an
 * operator asked for it by key, so it is not searched). Returns the exit status. */
static int run_ctl(wxg_ct_t *t, const char *cmd, const char *key)
{
    const char *bin_dir = getenv("WXG_BINARY_DIR");
    assert_non_null(bin_dir);
    char bin[1024], out[1024];
    snprintf(bin, sizeof bin, "%s/cmd/wxguardctl/wxguardctl", bin_dir);
    snprintf(out, sizeof out, "%s/ctl.out", t->dir);
    const char *argv[] = {bin, cmd, "--config", t->config, "--yes", key, NULL};
    int rc = wxg_test_wait_child(spawn_to(argv, out), 60000);
    if (rc < 0)
        fail_msg("wxguardctl %s did not finish in time", cmd);
    return rc;
}

/* Fails the test when the file at `path` holds any of the n strings; returns its lines. */
static size_t assert_none_in(const char *path, const char *const *secrets, size_t n)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0, lines = 0;
    while (getline(&line, &cap, f) > 0) {
        lines++;
        for (size_t i = 0; i < n; i++) {
            if (strstr(line, secrets[i]) != NULL) {
                fclose(f);
                fail_msg("%s holds '%s' in: %s", path, secrets[i], line);
            }
        }
    }
    free(line);
    fclose(f);
    return lines;
}

/* Fails the test when any forbidden string is in the file at `path`; returns its line count. */
static size_t assert_clean_file(const char *path)
{
    return assert_none_in(path, forbidden, sizeof forbidden / sizeof forbidden[0]);
}

static size_t assert_clean(const wxg_ct_t *t, int idx)
{
    char path[512];
    snprintf(path, sizeof path, "%s/replica-%d.log", t->dir, idx);
    return assert_clean_file(path);
}

static void wait_log(wxg_ct_t *t, int idx, const char *needle, int64_t timeout_ms)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    while (wxg_ct_log_count(t, idx, needle) == 0) {
        if (wxg_test_now_ms() > deadline)
            fail_msg("replica %d never logged '%s'", idx, needle);
        wxg_test_sleep_ms(50);
    }
}

static void no_personal_id_or_secret_in_anything_the_consumer_writes(void **state)
{
    (void)state;
    wxg_test_redis_t redis = {0};
    assert_int_equal(wxg_test_redis_start(&redis, REDIS_PW), 0);
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-privacy", 2);
    t.redis_host = "127.0.0.1";
    t.redis_port = redis.port;
    char extra[2048];
    const char *common = "redis.password = " REDIS_PW "\n"
                         "kafka.sasl.password = " SASL_PW "\n"
                         "log.id.salt = " SALT "\n"
                         "log.level = debug\n"
                         "kafka.debug = all\n"
                         "plugins = fail,record\n"
                         "consumer.retry.max = 2\n"
                         "redis.probe.interval.ms = 200ms\n";

    /* Run 1: poison records, a generic message and an OA push that fail for good, and Redis
     * down for a while in the middle of the stream. */
    snprintf(extra, sizeof extra,
             "%splugin.fail.action = fail\n"
             "plugin.fail.reason = refused for good\n"
             "plugin.fail.match.msg_ids = %llu," OA_MSGID "\n",
             common, (unsigned long long)ID_FAIL);
    wxg_ct_write_config(&t, extra);
    produce_generic(&t, ID_BASE, 20);
    char *v = generic(ID_FAIL);
    wxg_ct_produce_raw(&t, 0, v);
    free(v);
    wxg_ct_produce_raw(&t, 1, oa_push);
    for (size_t i = 0; i < sizeof poison / sizeof poison[0]; i++)
        wxg_ct_produce_raw(&t, (int32_t)i % 2, poison[i]);
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    wxg_test_redis_kill(&redis);
    produce_generic(&t, ID_BASE + 100, 10);
    wait_log(&t, 0, "redis_unreachable", 20000);
    assert_int_equal(wxg_test_redis_restart(&redis), 0);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    wxg_ct_assert_exit(&t, 0, wxg_ct_signal(&t, 0, SIGTERM, 30000), 0);
    assert_true(wxg_ct_log_count(&t, 0, "event=dead_lettered") >= 4);
    assert_true(wxg_ct_log_count(&t, 0, "event=guard_error") +
                    wxg_ct_log_count(&t, 0, "event=redis_unreachable") >
                0);

    /* Run 2: a message that stalls past consumer.stall.timeout.ms, whose claim the operator
     * releases meanwhile, so that its completion finds the lease lost. */
    snprintf(extra, sizeof extra,
             "%splugin.fail.action = stall\n"
             "plugin.fail.stall.ms = 4000\n"
             "plugin.fail.match.msg_ids = %llu\n"
             "consumer.stall.timeout.ms = 1s\n"
             "guard.lease.ms = 1000\n",
             common, (unsigned long long)ID_STALL);
    wxg_ct_write_config(&t, extra);
    wxg_ct_spawn(&t, 1);
    v = generic(ID_STALL);
    wxg_ct_produce_raw(&t, 0, v);
    free(v);
    wait_log(&t, 1, "event=stalled", 20000);
    char key[256];
    key_of(ID_STALL, key, sizeof key);
    assert_int_equal(run_ctl(&t, "release", key), 0);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    wxg_ct_assert_exit(&t, 1, wxg_ct_signal(&t, 1, SIGTERM, 30000), 0);
    assert_true(wxg_ct_log_count(&t, 1, "lease_lost=1") > 0);

    size_t lines = assert_clean(&t, 0) + assert_clean(&t, 1);
    print_message("searched %zu lines of output\n", lines);
    assert_true(lines > 100); /* kafka.debug = all was on: the search had something to read */
    wxg_ct_teardown(&t);
    wxg_test_redis_stop(&redis);
}

/* POSTs to the receiver and returns the status. */
static int post(int port, const char *target, const char *headers, const char *body)
{
    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(port, "POST", target, headers, body, strlen(body), &r), 0);
    int st = r.status;
    wxg_test_http_free(&r);
    return st;
}

/* The OA query string signed at `ts` (and, for an encrypted push, its msg_signature). */
static void oa_target(char *out, size_t size, const char *ts, const char *enc)
{
    char sig[41], msig[41];
    assert_int_equal(wxg_ingest_oa_signature(OA_TOKEN, ts, "55", sig), 0);
    if (enc == NULL) {
        snprintf(out, size, "/v1/callback/oa?signature=%s&timestamp=%s&nonce=55&openid=" OPENID,
                 sig, ts);
        return;
    }
    assert_int_equal(wxg__oa_msg_signature(OA_TOKEN, ts, "55", enc, strlen(enc), msig), 0);
    snprintf(out, size,
             "/v1/callback/oa?signature=%s&timestamp=%s&nonce=55&openid=" OPENID
             "&encrypt_type=aes&msg_signature=%s",
             sig, ts, msig);
}

static void no_personal_id_or_secret_in_anything_the_receiver_writes(void **state)
{
    (void)state;
    char *dir = wxg_test_mkdtemp("privacy-ingest");
    char out[512], topic[128];
    snprintf(out, sizeof out, "%s/ingest.log", dir);
    char *tname = wxg_test_kafka_name("privacy-ingest");
    snprintf(topic, sizeof topic, "%s", tname);
    free(tname);
    wxg_test_kafka_create_topic(topic, 1);
    const char *bin_dir = getenv("WXG_BINARY_DIR");
    assert_non_null(bin_dir);
    char bin[1024], boot[256], tset[192];
    snprintf(bin, sizeof bin, "%s/cmd/wxguard-ingest/wxguard-ingest", bin_dir);
    snprintf(boot, sizeof boot, "kafka.bootstrap.servers=%s", wxg_test_kafka_bootstrap());
    snprintf(tset, sizeof tset, "ingest.topic=%s", topic);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0)
            _exit(120);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(bin, bin, "--set", boot, "--set", tset, "--set", "ingest.listen=127.0.0.1:0", "--set",
              "ingest.ops.listen=127.0.0.1:0", "--set", "kafka.broker.address.family=v4", "--set",
              "log.level=debug", "--set", "kafka.debug=all", "--set", "log.id.salt=" SALT, "--set",
              "kafka.sasl.password=" SASL_PW, "--set", "ingest.oa.token=" OA_TOKEN, "--set",
              "ingest.oa.aes.key=" AES_KEY, "--set", "ingest.oa.aes.key.previous=" AES_PREV,
              "--set", "ingest.oa.plaintext.accept=true", "--set", "ingest.oa.appid=" APPID,
              "--set", "ingest.hmac.secret=" HMAC_SEC, (char *)NULL);
        _exit(121);
    }
    /* The port, from the receiver's own line on stdout. */
    int port = 0;
    int64_t deadline = wxg_test_now_ms() + 20000LL * wxg_test_scale();
    while (port == 0 && wxg_test_now_ms() < deadline) {
        FILE *f = fopen(out, "r");
        char line[4096];
        while (f != NULL && fgets(line, sizeof line, f) != NULL)
            sscanf(line, "wxguard-ingest listening on port %d", &port);
        if (f != NULL)
            fclose(f);
        if (port == 0)
            wxg_test_sleep_ms(50);
    }
    if (port == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("wxguard-ingest did not start");
    }

    char ts[24], old[24], target[1024], hv[72], hdr[256];
    long long now = (long long)time(NULL);
    snprintf(ts, sizeof ts, "%lld", now);
    snprintf(old, sizeof old, "%lld", now - 3600);
    /* Accepted: a plain OA push (plaintext beside the key is opted into above, so that its
     * path is logged too), an encrypted one, a gateway callback. */
    oa_target(target, sizeof target, ts, NULL);
    assert_int_equal(post(port, target, NULL, oa_push), 200);
    unsigned char key[WXG__OA_AES_KEY_BYTES];
    assert_int_equal(wxg__oa_aes_key(AES_KEY, key), 0);
    char *enc = NULL;
    assert_int_equal(wxg__oa_encrypt(key, APPID, (const unsigned char *)"PRVRANDOMBYTES16", oa_push,
                                     strlen(oa_push), &enc),
                     0);
    char env[4096];
    snprintf(env, sizeof env,
             "<xml><ToUserName><![CDATA[" OA_ACCT "]]></ToUserName><Encrypt><![CDATA[%s]]>"
             "</Encrypt></xml>",
             enc);
    oa_target(target, sizeof target, ts, enc);
    assert_int_equal(post(port, target, NULL, env), 200);
    char *g = generic(ID_BASE + 1);
    assert_int_equal(wxg_ingest_hmac_sign_ts(HMAC_SEC, ts, g, strlen(g), hv), 0);
    snprintf(hdr, sizeof hdr, "X-Wxg-Signature: %s\r\nX-Wxg-Timestamp: %s\r\n", hv, ts);
    assert_int_equal(post(port, "/v1/callback/generic", hdr, g), 200);
    /* Refused: a stale OA signature, a bad one, a bad HMAC, a body that does not decode, an
     * encrypted push sealed with an unknown key, a push for another account. */
    oa_target(target, sizeof target, old, NULL);
    assert_int_equal(post(port, target, NULL, oa_push), 401);
    assert_int_equal(post(port, "/v1/callback/oa?signature=00&timestamp=1&nonce=2", NULL, oa_push),
                     401);
    snprintf(hdr, sizeof hdr, "X-Wxg-Signature: sha256=00\r\nX-Wxg-Timestamp: %s\r\n", ts);
    assert_int_equal(post(port, "/v1/callback/generic", hdr, g), 401);
    assert_int_equal(wxg_ingest_hmac_sign_ts(HMAC_SEC, ts, poison[0], strlen(poison[0]), hv), 0);
    snprintf(hdr, sizeof hdr, "X-Wxg-Signature: %s\r\nX-Wxg-Timestamp: %s\r\n", hv, ts);
    assert_int_equal(post(port, "/v1/callback/generic", hdr, poison[0]), 400);
    assert_int_equal(post(port, "/v1/callback/generic/wxid_someoneelse", hdr, poison[0]), 400);
    free(enc);
    assert_int_equal(wxg__oa_aes_key("ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ", key), 0);
    assert_int_equal(wxg__oa_encrypt(key, APPID, (const unsigned char *)"PRVRANDOMBYTES16", oa_push,
                                     strlen(oa_push), &enc),
                     0);
    snprintf(env, sizeof env,
             "<xml><ToUserName><![CDATA[" OA_ACCT "]]></ToUserName><Encrypt><![CDATA[%s]]>"
             "</Encrypt></xml>",
             enc);
    oa_target(target, sizeof target, ts, enc);
    assert_int_equal(post(port, target, NULL, env), 400);
    free(enc);
    free(g);

    kill(pid, SIGTERM);
    int rc = wxg_test_wait_child(pid, 20000);
    if (rc != 0)
        fail_msg("wxguard-ingest ended with %d after SIGTERM (-1: it did not stop)", rc);
    size_t lines = assert_clean_file(out);
    print_message("searched %zu lines of output\n", lines);
    assert_true(lines > 100);
    wxg_test_rmtree(dir);
    free(dir);
}

/* ---- every secret, used for real, over SASL_SSL ------------------------------------------- */

#define TLS_KEY_PW  "tlsKeyPwP5-never-logged"
#define SENTINEL_PW "sentinelPwQ6-never-logged"
#define BAD_SASL_PW "badSaslPwR7-never-logged"
#define BAD_SENT_PW "badSentinelPwS8-never-logged"
#define SECRET_SALT "saltT9-never-logged"

/* Runs argv (a short tool such as openssl) with its output to <dir>/tool.out; fails the test
 * unless it exits 0 within 60 s (scaled). */
static void run_tool(const char *dir, const char *const *argv)
{
    char out[600];
    snprintf(out, sizeof out, "%s/tool.out", dir);
    int rc = wxg_test_wait_child(spawn_to(argv, out), 60000);
    if (rc != 0)
        fail_msg("%s failed with %d (see %s)", argv[0], rc, out);
}

/* A line from the middle of the encrypted client key's PEM body: the key itself must never be
 * printed either. */
static void key_line(const char *path, char *out, size_t size)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    int n = 0;
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        if (++n == 3) {
            size_t len = strcspn(line, "\n");
            if (len >= size)
                len = size - 1;
            memcpy(out, line, len);
            out[len] = '\0';
        }
    }
    fclose(f);
    assert_true(strlen(out) >= 40);
}

/* The consumer's configuration over SASL_SSL with a client certificate whose key is
 * encrypted, Redis found through a Sentinel that wants a password, everything logged. */
static void write_secret_config(wxg_ct_t *t, const char *dir, int sentinel_port,
                                const char *sasl_pw, const char *sentinel_pw)
{
    char extra[4096];
    snprintf(extra, sizeof extra,
             "kafka.bootstrap.servers = %s\n"
             "kafka.security.protocol = SASL_SSL\n"
             "kafka.sasl.mechanisms = %s\n"
             "kafka.sasl.username = %s\n"
             "kafka.sasl.password = %s\n"
             "kafka.ssl.ca.location = %s\n"
             "kafka.ssl.certificate.location = %s/client.pem\n"
             "kafka.ssl.key.location = %s/client.key\n"
             "kafka.ssl.key.password = " TLS_KEY_PW "\n"
             "redis.sentinels = 127.0.0.1:%d\n"
             "redis.sentinel.master = wxgprv\n"
             "redis.sentinel.password = %s\n"
             "redis.connect.timeout.ms = 1s\n"
             "log.id.salt = " SECRET_SALT "\n"
             "log.level = debug\n"
             "kafka.debug = all\n",
             wxg_test_env_required("WXG_TEST_KAFKA_SSL_BOOTSTRAP"),
             wxg_test_env_required("WXG_TEST_KAFKA_SASL_MECHANISM"),
             wxg_test_env_required("WXG_TEST_KAFKA_SASL_USER"), sasl_pw,
             wxg_test_env_required("WXG_TEST_KAFKA_CA"), dir, dir, sentinel_port, sentinel_pw);
    wxg_ct_write_config(t, extra);
}

static void no_secret_in_anything_written_while_every_secret_is_used(void **state)
{
    (void)state;
    const char *sasl_pw = wxg_test_env_required("WXG_TEST_KAFKA_SASL_PASSWORD");
    wxg_test_redis_t primary, sentinel;
    assert_int_equal(wxg_test_redis_start(&primary, NULL), 0);
    assert_int_equal(wxg_test_sentinel_start(&sentinel, "wxgprv", primary.port, SENTINEL_PW), 0);
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-secrets", 1);
    /* Nothing listens at redis.host/port: only the Sentinel leads to the primary. */
    t.redis_host = "127.0.0.1";
    t.redis_port = wxg_test_free_port();

    /* A client certificate whose key is encrypted with TLS_KEY_PW. */
    char key[600], cert[600], keybody[128];
    snprintf(key, sizeof key, "%s/client.key", t.dir);
    snprintf(cert, sizeof cert, "%s/client.pem", t.dir);
    const char *req[] = {"openssl",
                         "req",
                         "-x509",
                         "-newkey",
                         "ec",
                         "-pkeyopt",
                         "ec_paramgen_curve:prime256v1",
                         "-keyout",
                         key,
                         "-out",
                         cert,
                         "-days",
                         "1",
                         "-subj",
                         "/CN=wxg-test-client",
                         "-passout",
                         "pass:" TLS_KEY_PW,
                         NULL};
    run_tool(t.dir, req);
    key_line(key, keybody, sizeof keybody);
    const char *secrets[] = {sasl_pw,     BAD_SASL_PW, TLS_KEY_PW, SENTINEL_PW,
                             BAD_SENT_PW, SECRET_SALT, keybody};
    const size_t nsecrets = sizeof secrets / sizeof secrets[0];

    /* 1. Everything right: three messages and a record that does not decode, parked in the
     *    dead-letter topic through the producer over the same listener. */
    write_secret_config(&t, t.dir, sentinel.port, sasl_pw, SENTINEL_PW);
    for (uint64_t i = 0; i < 3; i++) {
        char *v = generic(ID_BASE + 500 + i);
        wxg_ct_produce_raw(&t, 0, v);
        free(v);
    }
    wxg_ct_produce_raw(&t, 0, "{\"account\": oops");
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_ct_wait_all_committed(&t, 90000, NULL));
    wxg_ct_assert_exit(&t, 0, wxg_ct_signal(&t, 0, SIGTERM, 30000), 0);
    assert_int_equal(wxg_ct_log_last(&t, 0, "event=stats", "processed"), 3);
    assert_int_equal(wxg_ct_log_last(&t, 0, "event=stats", "dead_lettered"), 1);

    /* 2. A wrong SASL password: a start-up error (exit 3) that names the refusal. */
    write_secret_config(&t, t.dir, sentinel.port, BAD_SASL_PW, SENTINEL_PW);
    wxg_ct_spawn(&t, 1);
    int64_t deadline = wxg_test_now_ms() + 30000 * wxg_test_scale();
    while (wxg_ct_log_count(&t, 1, "kafka_auth_failed") == 0 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    wxg_test_sleep_ms(200);
    wxg_ct_assert_exit(&t, 1, wxg_ct_signal(&t, 1, SIGTERM, 30000), 3);
    assert_true(wxg_ct_log_count(&t, 1, "event=kafka_auth_failed") > 0);

    /* 3. A wrong Sentinel password: the guard cannot find Redis, a start-up error. */
    write_secret_config(&t, t.dir, sentinel.port, sasl_pw, BAD_SENT_PW);
    wxg_ct_spawn(&t, 2);
    wxg_ct_assert_exit(&t, 2, wxg_ct_wait_exit(&t, 2, 60000), 3);

    /* 4. wxguardctl redrive over the same listener, the key's password and the Sentinel's on
     *    its command line, every librdkafka debug context on. */
    char *back = wxg_test_kafka_name("ct-secrets-back");
    wxg_test_kafka_create_topic(back, 1);
    const char *bin_dir = getenv("WXG_BINARY_DIR");
    assert_non_null(bin_dir);
    char ctl[600], sets[20][700], ctl_out[600];
    snprintf(ctl, sizeof ctl, "%s/cmd/wxguardctl/wxguardctl", bin_dir);
    snprintf(ctl_out, sizeof ctl_out, "%s/redrive.log", t.dir);
    int ns = 0;
    snprintf(sets[ns++], 700, "kafka.bootstrap.servers=%s",
             wxg_test_env_required("WXG_TEST_KAFKA_SSL_BOOTSTRAP"));
    snprintf(sets[ns++], 700, "kafka.security.protocol=SASL_SSL");
    snprintf(sets[ns++], 700, "kafka.sasl.mechanisms=%s",
             wxg_test_env_required("WXG_TEST_KAFKA_SASL_MECHANISM"));
    snprintf(sets[ns++], 700, "kafka.sasl.username=%s",
             wxg_test_env_required("WXG_TEST_KAFKA_SASL_USER"));
    snprintf(sets[ns++], 700, "kafka.sasl.password=%s", sasl_pw);
    snprintf(sets[ns++], 700, "kafka.ssl.ca.location=%s",
             wxg_test_env_required("WXG_TEST_KAFKA_CA"));
    snprintf(sets[ns++], 700, "kafka.ssl.certificate.location=%s", cert);
    snprintf(sets[ns++], 700, "kafka.ssl.key.location=%s", key);
    snprintf(sets[ns++], 700, "kafka.ssl.key.password=%s", TLS_KEY_PW);
    snprintf(sets[ns++], 700, "kafka.debug=all");
    snprintf(sets[ns++], 700, "log.level=debug");
    snprintf(sets[ns++], 700, "log.id.salt=%s", SECRET_SALT);
    snprintf(sets[ns++], 700, "kafka.broker.address.family=v4");
    snprintf(sets[ns++], 700, "redis.sentinels=127.0.0.1:%d", sentinel.port);
    snprintf(sets[ns++], 700, "redis.sentinel.master=wxgprv");
    snprintf(sets[ns++], 700, "redis.sentinel.password=%s", SENTINEL_PW);
    snprintf(sets[ns++], 700, "redis.key.prefix=%s", t.prefix);
    snprintf(sets[ns++], 700, "dlq.topic=%s", t.dlq);
    const char *argv[48];
    int na = 0;
    argv[na++] = ctl;
    argv[na++] = "redrive";
    argv[na++] = "--all";
    argv[na++] = "--to-topic";
    argv[na++] = back;
    argv[na++] = "--quiet";
    for (int i = 0; i < ns; i++) {
        argv[na++] = "--set";
        argv[na++] = sets[i];
    }
    argv[na] = NULL;
    int rc = wxg_test_wait_child(spawn_to(argv, ctl_out), 90000);
    if (rc != 0)
        fail_msg("wxguardctl redrive exited %d (see %s)", rc, ctl_out);
    wxg_test_kafka_msg_t *again = NULL;
    size_t n = wxg_test_kafka_read(back, 1, 30000, &again);
    assert_int_equal(n, 1);
    wxg_test_kafka_msgs_free(again, n);
    free(back);

    size_t lines = 0;
    for (int i = 0; i < 3; i++) {
        char logp[600];
        snprintf(logp, sizeof logp, "%s/replica-%d.log", t.dir, i);
        lines += assert_none_in(logp, secrets, nsecrets);
    }
    size_t ctl_lines = assert_none_in(ctl_out, secrets, nsecrets);
    assert_true(ctl_lines > 100); /* its librdkafka lines at debug level too */
    lines += ctl_lines;
    print_message("searched %zu lines of output\n", lines);
    assert_true(lines > 300); /* kafka.debug = all was on everywhere */
    wxg_ct_teardown(&t);
    wxg_test_redis_stop(&sentinel);
    wxg_test_redis_stop(&primary);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_personal_id_or_secret_in_anything_the_consumer_writes),
        cmocka_unit_test(no_personal_id_or_secret_in_anything_the_receiver_writes),
        cmocka_unit_test(no_secret_in_anything_written_while_every_secret_is_used),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
