/* Integration tests for the webhook receiver against the real Kafka broker of the services
 * fixture: every reference sample POSTed over HTTP is stored byte for byte with the expected key
 * and headers (or refused with 400 and the decoder's reason); refused requests (bad signature,
 * oversized, undecodable) store nothing; the Official Account URL verification echoes; and with
 * Kafka unreachable a callback gets 503 within its budget while the gateway's retry, once Kafka
 * is there, stores it exactly once. /readyz and /metrics are read on the operations port; the
 * callback port answers /readyz with 404.
 *
 * The "one effect" half of the retry story (the consumer's guard running the stored message
 * once) belongs to the consumer's end-to-end test; here the record count in Kafka is checked. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/time.h>

#include "oacrypt_int.h"
#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"
#include "wxguard/conf.h"
#include "wxguard/err.h"
#include "wxguard/ingest.h"
#include "wxguard/metrics.h"
#include "wxguard/msg.h"

#define OA_TOKEN "AAAAA"
#define MAX_RECS 128

static const char *const no_env[] = {NULL};

/* ---- helpers ---- */

typedef struct rec {
    int32_t partition;
    char *key;
    size_t key_len;
    char *value;
    size_t value_len;
    char hdr[4][128]; /* format, account, received-ms, request-id ("" when absent) */
} rec;

static const char *const hdr_names[4] = {WXG_INGEST_HDR_FORMAT, WXG_INGEST_HDR_ACCOUNT,
                                         WXG_INGEST_HDR_RECEIVED, WXG_INGEST_HDR_REQUEST_ID};

static char *dup_bytes(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    assert_non_null(s);
    if (n > 0)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* Reads `topic` (partitions 0..nparts-1) from the beginning until `want` records or the scaled
 * timeout. Returns how many came. */
static size_t read_topic(const char *topic, int nparts, size_t want, int timeout_ms, rec *out)
{
    size_t got = 0;
    char *group = wxg_test_kafka_name("ingest-reader");
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    wxg_test_kafka_conf_set(conf, "group.id", group);
    wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
    char errstr[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(nparts);
    for (int i = 0; i < nparts; i++)
        rd_kafka_topic_partition_list_add(parts, topic, i)->offset = RD_KAFKA_OFFSET_BEGINNING;
    assert_int_equal(rd_kafka_assign(rk, parts), 0);
    rd_kafka_topic_partition_list_destroy(parts);
    int64_t deadline = wxg_test_now_ms() + (int64_t)timeout_ms * wxg_test_scale();
    while (got < want && got < MAX_RECS && wxg_test_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (m == NULL)
            continue;
        if (m->err == 0) {
            rec *r = &out[got++];
            memset(r, 0, sizeof *r);
            r->partition = m->partition;
            r->key = dup_bytes(m->key, m->key_len);
            r->key_len = m->key_len;
            r->value = dup_bytes(m->payload, m->len);
            r->value_len = m->len;
            rd_kafka_headers_t *h = NULL;
            if (rd_kafka_message_headers(m, &h) == 0) {
                for (int i = 0; i < 4; i++) {
                    const void *v = NULL;
                    size_t vl = 0;
                    if (rd_kafka_header_get_last(h, hdr_names[i], &v, &vl) == 0 && v != NULL &&
                        vl < sizeof r->hdr[i]) {
                        memcpy(r->hdr[i], v, vl);
                        r->hdr[i][vl] = '\0';
                    }
                }
            }
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    free(group);
    return got;
}

static void free_recs(rec *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(r[i].key);
        free(r[i].value);
    }
}

typedef struct server {
    wxg_metrics_t *reg;
    wxg_ingest_t *in;
    int port;
    int ops_port; /* /metrics, /healthz, /readyz */
} server;

/* A receiver for `topic` on `bootstrap` (NULL: the fixture's broker), with up to three more
 * settings (NULL-terminated `extra`, may be NULL). */
static void server_start_with(server *s, const char *bootstrap, const char *topic, int budget_ms,
                              const char *const *extra)
{
    char err[512] = "";
    char boot[256], top[256], budget[64];
    snprintf(boot, sizeof boot, "kafka.bootstrap.servers=%s",
             bootstrap ? bootstrap : wxg_test_kafka_bootstrap());
    snprintf(top, sizeof top, "ingest.topic=%s", topic);
    snprintf(budget, sizeof budget, "ingest.produce.timeout.ms=%d", budget_ms);
    const char *sets[12] = {boot,
                            top,
                            budget,
                            "ingest.listen=127.0.0.1:0",
                            "ingest.ops.listen=127.0.0.1:0",
                            "ingest.max.body.bytes=64KiB",
                            "ingest.oa.token=" OA_TOKEN,
                            "kafka.broker.address.family=v4",
                            "kafka.log_level=0"};
    size_t n = 9;
    for (size_t i = 0; extra != NULL && extra[i] != NULL && n < sizeof sets / sizeof sets[0]; i++)
        sets[n++] = extra[i];
    wxg_conf_t *conf = wxg_conf_load(WXG_PROG_INGEST, NULL, no_env, sets, n, err, sizeof err);
    if (conf == NULL)
        fail_msg("conf: %s", err);
    s->reg = wxg_metrics_new();
    s->in = wxg_ingest_new(conf, s->reg, err, sizeof err);
    wxg_conf_free(conf);
    if (s->in == NULL)
        fail_msg("wxg_ingest_new: %s", err);
    s->port = wxg_ingest_port(s->in);
    s->ops_port = wxg_ingest_ops_port(s->in);
    assert_true(s->ops_port > 0);
}

static void server_start(server *s, const char *bootstrap, const char *topic, int budget_ms)
{
    server_start_with(s, bootstrap, topic, budget_ms, NULL);
}

static void server_wait_ready(server *s)
{
    int64_t deadline = wxg_test_now_ms() + 30000LL * wxg_test_scale();
    while (!wxg_ingest_ready(s->in, NULL, 0) && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(s->ops_port, "GET", "/readyz", NULL, NULL, 0, &r), 0);
    assert_int_equal(r.status, 200);
    wxg_test_http_free(&r);
    /* Ready or not, the callback port does not say so: it is the gateways', not the operator's. */
    assert_int_equal(wxg_test_http(s->port, "GET", "/readyz", NULL, NULL, 0, &r), 0);
    assert_int_equal(r.status, 404);
    wxg_test_http_free(&r);
}

static void server_stop(server *s)
{
    wxg_ingest_destroy(s->in);
    wxg_metrics_free(s->reg);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    char *buf = malloc(1 << 20);
    assert_non_null(buf);
    *len = fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    buf[*len] = '\0';
    return buf;
}

/* The current time as the decimal Unix seconds a signer sends: signed requests must fall
 * within ingest.signature.tolerance.ms of the receiver's clock. */
static void now_ts(char out[24])
{
    snprintf(out, 24, "%lld", (long long)time(NULL));
}

/* The OA query string for a fresh timestamp/nonce. */
static void oa_target(char *out, size_t size, const char *nonce)
{
    char sig[41], ts[24];
    now_ts(ts);
    assert_int_equal(wxg_ingest_oa_signature(OA_TOKEN, ts, nonce, sig), 0);
    snprintf(out, size, "/v1/callback/oa?signature=%s&timestamp=%s&nonce=%s", sig, ts, nonce);
}

static int is_oa_sample(const char *file)
{
    return file[0] == 'O';
}

/* ---- tests ---- */

typedef struct sample {
    char file[64];
    char expect[160];
    char *body;
    size_t len;
    char rid[80];
    int status;
    char answer[512];
} sample;

static void every_reference_sample_is_stored_byte_identical_with_key_and_headers(void **state)
{
    (void)state;
    const char *src = getenv("WXG_SOURCE_DIR");
    assert_non_null(src);
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/samples/expected.tsv", src);
    size_t tl = 0;
    char *tsv = read_file(path, &tl);
    sample *s = calloc(64, sizeof *s);
    assert_non_null(s);
    size_t ns = 0;
    /* One POST per file whose row says "auto" and message 0. */
    for (char *line = tsv; line != NULL && *line != '\0';) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        char file[64], fmt[32], expect[160];
        int idx = -1;
        if (line[0] != '#' && sscanf(line, "%63s %31s %d %159s", file, fmt, &idx, expect) == 4 &&
            strcmp(fmt, "auto") == 0 && idx == 0 && ns < 64) {
            snprintf(s[ns].file, sizeof s[ns].file, "%s", file);
            snprintf(s[ns].expect, sizeof s[ns].expect, "%s", expect);
            ns++;
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    free(tsv);
    assert_true(ns >= 40);

    char *topic = wxg_test_kafka_name("ingest-samples");
    wxg_test_kafka_create_topic(topic, 4);
    server srv;
    server_start(&srv, NULL, topic, 10000);
    server_wait_ready(&srv);

    int64_t t_before = 0;
    {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        t_before = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
    }
    size_t stored = 0;
    for (size_t i = 0; i < ns; i++) {
        snprintf(path, sizeof path, "%s/tests/fixtures/samples/%s", src, s[i].file);
        s[i].body = read_file(path, &s[i].len);
        snprintf(s[i].rid, sizeof s[i].rid, "sample-%s", s[i].file);
        char target[512];
        if (is_oa_sample(s[i].file))
            oa_target(target, sizeof target, "4242");
        else
            snprintf(target, sizeof target, "/v1/callback/auto");
        char hdr[128];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", s[i].rid);
        wxg_test_http_resp_t r;
        assert_int_equal(wxg_test_http(srv.port, "POST", target, hdr, s[i].body, s[i].len, &r), 0);
        s[i].status = r.status;
        snprintf(s[i].answer, sizeof s[i].answer, "%s", r.body);
        wxg_test_http_free(&r);
        if (strncmp(s[i].expect, "error:", 6) == 0) {
            if (s[i].status != 400 || strstr(s[i].answer, s[i].expect + 6) == NULL)
                fail_msg("%s: want 400 %s, got %d %s", s[i].file, s[i].expect + 6, s[i].status,
                         s[i].answer);
        } else {
            if (s[i].status != 200)
                fail_msg("%s: want 200, got %d %s", s[i].file, s[i].status, s[i].answer);
            assert_string_equal(s[i].answer, is_oa_sample(s[i].file) ? "success" : "ok");
            stored++;
        }
    }

    rec *recs = calloc(MAX_RECS, sizeof *recs);
    assert_non_null(recs);
    size_t got = read_topic(topic, 4, stored + 1, 5000, recs);
    assert_int_equal(got, stored); /* and not one more within the wait */
    for (size_t i = 0; i < ns; i++) {
        if (s[i].status != 200)
            continue;
        rec *r = NULL;
        for (size_t j = 0; j < got; j++) {
            if (strcmp(recs[j].hdr[3], s[i].rid) == 0)
                r = &recs[j];
        }
        if (r == NULL)
            fail_msg("%s: no record with request id %s", s[i].file, s[i].rid);
        /* The raw body, byte for byte. */
        assert_int_equal(r->value_len, s[i].len);
        assert_memory_equal(r->value, s[i].body, s[i].len);
        /* Key: account ':' conversation of the first message; the account is the one the
         * reference key starts with ("~" stands for the probe's empty account). */
        wxg_batch_t *b = NULL;
        char why[256];
        assert_int_equal(wxg_decode(s[i].body, s[i].len, NULL, &b, why, sizeof why), 0);
        const wxg_msg_view_t *m = wxg_batch_msg(b, 0);
        char want_key[512];
        snprintf(want_key, sizeof want_key, "%s:%s", m->account, m->conversation);
        assert_string_equal(r->key, want_key);
        size_t acct_len = strcspn(s[i].expect, ":");
        if (strncmp(s[i].expect, "~:", 2) == 0)
            assert_string_equal(r->hdr[1], "");
        else {
            assert_int_equal(strlen(r->hdr[1]), acct_len);
            assert_memory_equal(r->hdr[1], s[i].expect, acct_len);
            assert_memory_equal(r->key, s[i].expect, acct_len + 1);
        }
        assert_string_equal(r->hdr[0], wxg_format_name(m->format));
        wxg_batch_free(b);
        long long rt = strtoll(r->hdr[2], NULL, 10);
        assert_true(rt >= t_before && rt <= t_before + 600000);
    }
    /* Every record of one account and conversation went to one partition. */
    for (size_t i = 0; i < got; i++) {
        for (size_t j = 0; j < got; j++) {
            if (strcmp(recs[i].key, recs[j].key) == 0)
                assert_int_equal(recs[i].partition, recs[j].partition);
        }
    }
    print_message("%zu samples: %zu stored, %zu refused with 400\n", ns, stored, ns - stored);

    /* The metrics count what happened. */
    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(srv.ops_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    assert_non_null(strstr(r.body, "wxg_ingest_requests_total{endpoint=\"auto\",status=\"200\"}"));
    assert_non_null(strstr(r.body, "wxg_ingest_produce_seconds_count"));
    assert_non_null(strstr(r.body, "wxg_ingest_kafka_brokers_up 1\n"));
    wxg_test_http_free(&r);

    free_recs(recs, got);
    free(recs);
    for (size_t i = 0; i < ns; i++)
        free(s[i].body);
    free(s);
    server_stop(&srv);
    free(topic);
}

static void refused_requests_store_nothing_and_the_url_verification_echoes(void **state)
{
    (void)state;
    char *topic = wxg_test_kafka_name("ingest-refused");
    wxg_test_kafka_create_topic(topic, 1);
    server srv;
    server_start(&srv, NULL, topic, 10000);
    server_wait_ready(&srv);
    static const char o1[] = "<xml><ToUserName><![CDATA[gh_fake00000001]]></ToUserName>"
                             "<FromUserName><![CDATA[oFAKE_openid_000000001]]></FromUserName>"
                             "<CreateTime>1732329909</CreateTime><MsgType><![CDATA[text]]>"
                             "</MsgType><Content><![CDATA[x]]></Content>"
                             "<MsgId>24500000000000001</MsgId></xml>";
    wxg_test_http_resp_t r;

    /* The URL verification. */
    char target[512];
    oa_target(target, sizeof target, "99");
    strncat(target, "&echostr=5566778899", sizeof target - strlen(target) - 1);
    assert_int_equal(wxg_test_http(srv.port, "GET", target, NULL, NULL, 0, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "5566778899");
    wxg_test_http_free(&r);

    /* Bad signature. */
    assert_int_equal(
        wxg_test_http(srv.port, "POST",
                      "/v1/callback/oa?signature=da39a3ee5e6b4b0d3255bfef95601890afd80709"
                      "&timestamp=1732329909&nonce=99",
                      NULL, o1, sizeof o1 - 1, &r),
        0);
    assert_int_equal(r.status, 401);
    wxg_test_http_free(&r);
    /* Oversized (64 KiB cap). */
    size_t big_len = 65 * 1024;
    char *big = malloc(big_len);
    assert_non_null(big);
    memset(big, ' ', big_len);
    memcpy(big, o1, sizeof o1 - 1);
    oa_target(target, sizeof target, "100");
    assert_int_equal(wxg_test_http(srv.port, "POST", target, NULL, big, big_len, &r), 0);
    assert_int_equal(r.status, 413);
    wxg_test_http_free(&r);
    free(big);
    /* Undecodable. */
    assert_int_equal(
        wxg_test_http(srv.port, "POST", "/v1/callback/wkteam", NULL, "{\"wcId\":", 8, &r), 0);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "EPARSE"));
    wxg_test_http_free(&r);

    /* A good callback afterwards is the only record of the (single-partition) topic. */
    oa_target(target, sizeof target, "101");
    assert_int_equal(
        wxg_test_http(srv.port, "POST", target, "X-Request-Id: marker\r\n", o1, sizeof o1 - 1, &r),
        0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "success");
    wxg_test_http_free(&r);
    rec recs[4];
    size_t got = read_topic(topic, 1, 2, 3000, recs);
    assert_int_equal(got, 1);
    assert_string_equal(recs[0].hdr[3], "marker");
    assert_string_equal(recs[0].hdr[0], "oa-xml");
    assert_string_equal(recs[0].key, "gh_fake00000001:oFAKE_openid_000000001");
    free_recs(recs, got);
    server_stop(&srv);
    free(topic);
}

/* ---- safe mode ---- */

#define OA_EAK      "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
#define OA_EAK_PREV "ZYXWVUTSRQPONMLKJIHGFEDCBA9876543210zyxwvut"
#define OA_EAK_GONE "0000000000000000000000000000000000000000000"
#define OA_APPID    "wx_FAKEAPPID_0001"

/* POSTs `msg` sealed with EncodingAESKey `eak` for `appid` as a safe-mode push (the envelope
 * only), with a right msg_signature unless `bad_sig`; returns the status. */
static unsigned post_sealed(int port, const char *eak, const char *appid, const char *msg,
                            int bad_sig, const char *nonce)
{
    unsigned char key[WXG__OA_AES_KEY_BYTES];
    assert_int_equal(wxg__oa_aes_key(eak, key), 0);
    char *enc = NULL;
    assert_int_equal(wxg__oa_encrypt(key, appid, (const unsigned char *)"FAKERANDOMBYTES!", msg,
                                     strlen(msg), &enc),
                     0);
    char msig[41], target[512], body[4096], ts[24];
    now_ts(ts);
    assert_int_equal(wxg__oa_msg_signature(OA_TOKEN, ts, nonce, enc, strlen(enc), msig), 0);
    if (bad_sig)
        msig[0] = msig[0] == '0' ? '1' : '0';
    char sig[41];
    assert_int_equal(wxg_ingest_oa_signature(OA_TOKEN, ts, nonce, sig), 0);
    snprintf(target, sizeof target,
             "/v1/callback/oa?signature=%s&timestamp=%s&nonce=%s&openid=oFAKE"
             "&encrypt_type=aes&msg_signature=%s",
             sig, ts, nonce, msig);
    int bl = snprintf(body, sizeof body,
                      "<xml><ToUserName><![CDATA[gh_fake00000001]]></ToUserName>"
                      "<Encrypt><![CDATA[%s]]></Encrypt></xml>",
                      enc);
    assert_true(bl > 0 && (size_t)bl < sizeof body);
    free(enc);
    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(port, "POST", target, NULL, body, (size_t)bl, &r), 0);
    unsigned status = r.status;
    if (status != 200)
        print_message("status %u: %s\n", status, r.body);
    wxg_test_http_free(&r);
    return status;
}

static void safe_mode_pushes_are_verified_decrypted_and_stored_as_plaintext(void **state)
{
    (void)state;
    char *topic = wxg_test_kafka_name("ingest-safe");
    wxg_test_kafka_create_topic(topic, 1);
    static const char m1[] = "<xml><ToUserName><![CDATA[gh_fake00000001]]></ToUserName>"
                             "<FromUserName><![CDATA[oFAKE_openid_000000001]]></FromUserName>"
                             "<CreateTime>1732329909</CreateTime><MsgType><![CDATA[text]]>"
                             "</MsgType><Content><![CDATA[safe]]></Content>"
                             "<MsgId>24500000000000009</MsgId></xml>";
    static const char m2[] = "{\"ToUserName\":\"gh_fake00000001\",\"FromUserName\":"
                             "\"oFAKE_openid_000000002\",\"CreateTime\":1732329910,"
                             "\"MsgType\":\"text\",\"Content\":\"old key\","
                             "\"MsgId\":24500000000000010}";
    const char *extra[] = {"ingest.oa.aes.key=" OA_EAK, "ingest.oa.aes.key.previous=" OA_EAK_PREV,
                           "ingest.oa.appid=" OA_APPID, NULL};
    server srv;
    server_start_with(&srv, NULL, topic, 5000, extra);
    server_wait_ready(&srv);

    /* Refused, storing nothing: a wrong msg_signature (401); a push sealed with a key that is
     * neither the current nor the previous one, or for another AppId (400). */
    assert_int_equal(post_sealed(srv.port, OA_EAK, OA_APPID, m1, 1, "1"), 401);
    assert_int_equal(post_sealed(srv.port, OA_EAK_GONE, OA_APPID, m1, 0, "2"), 400);
    assert_int_equal(post_sealed(srv.port, OA_EAK, "wx_OTHER", m1, 0, "3"), 400);
    /* Stored as plaintext: one sealed with the current key (XML inside), one with the previous
     * key (the JSON push format inside). */
    assert_int_equal(post_sealed(srv.port, OA_EAK, OA_APPID, m1, 0, "4"), 200);
    assert_int_equal(post_sealed(srv.port, OA_EAK_PREV, OA_APPID, m2, 0, "5"), 200);

    rec recs[4];
    size_t got = read_topic(topic, 1, 3, 3000, recs);
    assert_int_equal(got, 2);
    assert_int_equal(recs[0].value_len, sizeof m1 - 1);
    assert_memory_equal(recs[0].value, m1, sizeof m1 - 1);
    assert_string_equal(recs[0].key, "gh_fake00000001:oFAKE_openid_000000001");
    assert_string_equal(recs[0].hdr[0], "oa-xml");
    assert_memory_equal(recs[1].value, m2, sizeof m2 - 1);
    assert_string_equal(recs[1].key, "gh_fake00000001:oFAKE_openid_000000002");
    assert_string_equal(recs[1].hdr[0], "oa-json");
    free_recs(recs, got);
    server_stop(&srv);

    /* A key without the AppId it must be checked against is a configuration error. */
    char err[256] = "";
    const char *sets[] = {"ingest.topic=x", "ingest.oa.token=" OA_TOKEN,
                          "ingest.oa.aes.key=" OA_EAK, "ingest.listen=127.0.0.1:0",
                          "kafka.bootstrap.servers=127.0.0.1:1"};
    wxg_conf_t *conf = wxg_conf_load(WXG_PROG_INGEST, NULL, no_env, sets,
                                     sizeof sets / sizeof sets[0], err, sizeof err);
    if (conf == NULL)
        fail_msg("conf: %s", err);
    assert_non_null(conf);
    wxg_ingest_t *in = wxg_ingest_new(conf, NULL, err, sizeof err);
    assert_null(in);
    assert_non_null(strstr(err, "ingest.oa.appid"));
    wxg_conf_free(conf);
    free(topic);
}

static void kafka_down_gives_503_within_the_budget_and_the_retry_stores_once(void **state)
{
    (void)state;
    char *topic = wxg_test_kafka_name("ingest-retry");
    wxg_test_kafka_create_topic(topic, 1);
    static const char w1[] =
        "{\"wcId\":\"wxid_fakebot000001\",\"account\":\"13800000000\",\"messageType\":\"60001\","
        "\"data\":{\"fromUser\":\"wxid_fakealice0001\",\"toUser\":\"wxid_fakebot000001\","
        "\"msgId\":1680000001,\"newMsgId\":7301234567890123457,\"timestamp\":1705043418,"
        "\"content\":\"hi\",\"self\":false}}";
    const int budget = 1500;
    char dead[64];
    snprintf(dead, sizeof dead, "127.0.0.1:%d", wxg_test_free_port());

    /* Kafka unreachable: 503 with Retry-After, within the budget (plus scheduling slack). */
    server a;
    server_start(&a, dead, topic, budget);
    wxg_test_http_resp_t r;
    int64_t t0 = wxg_test_now_ms();
    assert_int_equal(wxg_test_http(a.port, "POST", "/v1/callback/wkteam",
                                   "X-Request-Id: gw-7301\r\n", w1, sizeof w1 - 1, &r),
                     0);
    int64_t took = wxg_test_now_ms() - t0;
    assert_int_equal(r.status, 503);
    char v[32];
    assert_string_equal(wxg_test_http_header(&r, "Retry-After", v, sizeof v), "1");
    wxg_test_http_free(&r);
    print_message("503 after %lld ms (budget %d ms)\n", (long long)took, budget);
    assert_true(took >= budget - 50);
    assert_true(took <= budget + 1000LL * wxg_test_scale());
    assert_int_equal(wxg_test_http(a.ops_port, "GET", "/readyz", NULL, NULL, 0, &r), 0);
    assert_int_equal(r.status, 503);
    wxg_test_http_free(&r);
    server_stop(&a);

    /* Kafka back (the receiver now reaches the broker): the gateway's retry succeeds. */
    server b;
    server_start(&b, NULL, topic, budget * 4);
    server_wait_ready(&b);
    assert_int_equal(wxg_test_http(b.port, "POST", "/v1/callback/wkteam",
                                   "X-Request-Id: gw-7301\r\n", w1, sizeof w1 - 1, &r),
                     0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ok");
    wxg_test_http_free(&r);

    /* Stored once: the failed attempt left nothing behind. */
    rec recs[4];
    size_t got = read_topic(topic, 1, 2, 3000, recs);
    assert_int_equal(got, 1);
    assert_int_equal(recs[0].value_len, sizeof w1 - 1);
    assert_memory_equal(recs[0].value, w1, sizeof w1 - 1);
    assert_string_equal(recs[0].key, "wxid_fakebot000001:wxid_fakealice0001");
    assert_string_equal(recs[0].hdr[3], "gw-7301");
    free_recs(recs, got);
    server_stop(&b);
    free(topic);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_reference_sample_is_stored_byte_identical_with_key_and_headers),
        cmocka_unit_test(refused_requests_store_nothing_and_the_url_verification_echoes),
        cmocka_unit_test(safe_mode_pushes_are_verified_decrypted_and_stored_as_plaintext),
        cmocka_unit_test(kafka_down_gives_503_within_the_budget_and_the_retry_stores_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
