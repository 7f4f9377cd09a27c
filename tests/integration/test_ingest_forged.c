/* Forged callbacks against a real wxguard-ingest, Kafka and wxguard-consumer configured as an
 * operator would: a gateway secret, a second secret bound to one account, the Official Account's
 * token, EncodingAESKey and AppId.
 *
 * An attacker who can reach the receiver, who may know one gateway's secret or have seen one
 * request URL in a log, tries on every endpoint (/wkteam, /gewe, /generic, /auto, with and
 * without an account in the path) bodies that carry another format's discriminating fields, OA
 * fields, a URL-verification probe with OA fields, and a path account other than the body's;
 * on the gateways, missing, wrong, stale, future and other-body signatures, and a bound secret
 * used for another account; on /oa, every way to downgrade safe mode (no encrypt_type, its case
 * and spelling variants), empty and wrong msg_signature, Encrypt sealed for another AppId or
 * with another key, a captured query replayed with another body, and stale and future
 * timestamps. A record written straight to the topic whose wxg-format header does not hold is
 * the consumer's half: it is dead-lettered.
 *
 * Each forged request must get its documented status and be counted; legitimate callbacks of
 * the same run, each POSTed twice, take effect exactly once; and the record plugin's ledger
 * holds exactly the legitimate keys: no forged message took effect. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "consumertest.h"
#include "oacrypt_int.h"
#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"
#include "wxguard/conf.h"
#include "wxguard/err.h"
#include "wxguard/ingest.h"
#include "wxguard/metrics.h"
#include "wxguard/msg.h"

#define SECRET    "gw-s3cret"
#define BOUND     "bound-s3cret" /* bound to acct_bound only */
#define TOKEN     "AAAAA"
#define EAK       "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
#define EAK_OTHER "ZYXWVUTSRQPONMLKJIHGFEDCBA9876543210zyxwvut"
#define APPID     "wx_FAKEAPPID_0001"
#define OA_ACCT   "gh_fake00000001"

static const char *const no_env[] = {NULL};

enum sign { S_OK, S_NONE, S_WRONG, S_STALE, S_FUTURE, S_OTHER_BODY, S_BOUND };

typedef struct ingest {
    wxg_metrics_t *reg;
    wxg_ingest_t *in;
    int port;
} ingest;

static int64_t now_s(void)
{
    return (int64_t)time(NULL);
}

/* POSTs `body` to `path` with the gateway signature `how`; returns the status. */
static int post_gateway(const ingest *g, const char *path, const char *body, enum sign how)
{
    char hv[72], hdr[256] = "", ts[24];
    int64_t t = now_s();
    if (how == S_STALE)
        t -= 3600;
    if (how == S_FUTURE)
        t += 3600;
    snprintf(ts, sizeof ts, "%lld", (long long)t);
    const char *secret = how == S_WRONG ? "not-the-secret" : how == S_BOUND ? BOUND : SECRET;
    const char *signed_body = how == S_OTHER_BODY ? "{\"another\":\"body\"}" : body;
    assert_int_equal(wxg_ingest_hmac_sign_ts(secret, ts, signed_body, strlen(signed_body), hv), 0);
    if (how != S_NONE)
        snprintf(hdr, sizeof hdr, "X-Wxg-Signature: %s\r\nX-Wxg-Timestamp: %s\r\n", hv, ts);
    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(g->port, "POST", path, hdr, body, strlen(body), &r), 0);
    int st = r.status;
    wxg_test_http_free(&r);
    return st;
}

/* Seals `plain` as an Encrypt value with key `eak` for `appid`; the caller frees it. */
static char *seal(const char *eak, const char *appid, const char *plain)
{
    unsigned char key[WXG__OA_AES_KEY_BYTES];
    assert_int_equal(wxg__oa_aes_key(eak, key), 0);
    char *enc = NULL;
    assert_int_equal(wxg__oa_encrypt(key, appid, (const unsigned char *)"FAKERANDOMBYTES!", plain,
                                     strlen(plain), &enc),
                     0);
    return enc;
}

/* One /oa request. `enc` is the Encrypt text of the envelope (NULL: `body` is posted as it
 * is); `sig_enc` is what msg_signature is made over (NULL: enc; "" gives an empty
 * msg_signature; "-" a wrong one). `et` is the encrypt_type parameter (NULL: none). */
typedef struct oa_req {
    const char *path;
    const char *et;
    const char *enc;
    const char *sig_enc;
    const char *body;
    int64_t ts_shift_s;
} oa_req;

static int post_oa(const ingest *g, const oa_req *q)
{
    char ts[24], sig[41], msig[41] = "", target[1024], body[8192];
    snprintf(ts, sizeof ts, "%lld", (long long)(now_s() + q->ts_shift_s));
    assert_int_equal(wxg_ingest_oa_signature(TOKEN, ts, "77", sig), 0);
    const char *over = q->sig_enc != NULL ? q->sig_enc : q->enc;
    if (over != NULL && strcmp(over, "") != 0) {
        const char *text = strcmp(over, "-") == 0 ? "something else" : over;
        assert_int_equal(wxg__oa_msg_signature(TOKEN, ts, "77", text, strlen(text), msig), 0);
    }
    int n =
        snprintf(target, sizeof target, "%s?signature=%s&timestamp=%s&nonce=77", q->path, sig, ts);
    if (q->et != NULL)
        n += snprintf(target + n, sizeof target - (size_t)n, "&encrypt_type=%s", q->et);
    if (over != NULL)
        snprintf(target + n, sizeof target - (size_t)n, "&msg_signature=%s", msig);
    const char *payload = q->body;
    if (q->enc != NULL) {
        snprintf(body, sizeof body,
                 "<xml><ToUserName><![CDATA[" OA_ACCT "]]></ToUserName><Encrypt><![CDATA[%s]]>"
                 "</Encrypt></xml>",
                 q->enc);
        payload = body;
    }
    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(g->port, "POST", target, NULL, payload, strlen(payload), &r), 0);
    int st = r.status;
    wxg_test_http_free(&r);
    return st;
}

static void ingest_start(ingest *g, const char *topic)
{
    char err[512] = "", boot[256], top[256];
    snprintf(boot, sizeof boot, "kafka.bootstrap.servers=%s", wxg_test_kafka_bootstrap());
    snprintf(top, sizeof top, "ingest.topic=%s", topic);
    const char *sets[] = {boot,
                          top,
                          "ingest.listen=127.0.0.1:0",
                          "kafka.broker.address.family=v4",
                          "ingest.hmac.secret=" SECRET,
                          "ingest.hmac.gateways=acct_bound=" BOUND,
                          "ingest.oa.token=" TOKEN,
                          "ingest.oa.aes.key=" EAK,
                          "ingest.oa.appid=" APPID};
    wxg_conf_t *conf = wxg_conf_load(WXG_PROG_INGEST, NULL, no_env, sets,
                                     sizeof sets / sizeof sets[0], err, sizeof err);
    if (conf == NULL)
        fail_msg("conf: %s", err);
    g->reg = wxg_metrics_new();
    g->in = wxg_ingest_new(conf, g->reg, err, sizeof err);
    wxg_conf_free(conf);
    if (g->in == NULL)
        fail_msg("ingest: %s", err);
    g->port = wxg_ingest_port(g->in);
}

static double metric(const ingest *g, const char *series)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(wxg_metrics_render(g->reg, &text, &len), 0);
    double v = 0;
    size_t n = strlen(series);
    for (const char *p = text; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            v = strtod(p + n + 1, NULL);
    }
    free(text);
    return v;
}

/* The key the consumer would give `body` read as format `f`. */
static char *key_of(const char *body, wxg_format_t f)
{
    wxg_decode_opts_t o = {.format = f};
    wxg_batch_t *b = NULL;
    char err[256];
    if (wxg_decode(body, strlen(body), &o, &b, err, sizeof err) != 0)
        fail_msg("legit body does not decode: %s", err);
    char *k = strdup(wxg_batch_msg(b, 0)->key);
    wxg_batch_free(b);
    return k;
}

/* Produces one record with a lying wxg-format header straight to the topic. */
static void produce_with_header(const char *topic, const char *value, const char *format,
                                const char *account)
{
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    char errstr[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    assert_non_null(rk);
    assert_int_equal(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0),
                                       RD_KAFKA_V_VALUE((void *)value, strlen(value)),
                                       RD_KAFKA_V_HEADER(WXG_INGEST_HDR_FORMAT, format, -1),
                                       RD_KAFKA_V_HEADER(WXG_INGEST_HDR_ACCOUNT, account, -1),
                                       RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
                     0);
    assert_int_equal(rd_kafka_flush(rk, 10000 * (int)wxg_test_scale()), 0);
    rd_kafka_destroy(rk);
}

#define FORGED_ID "8880000000000000001"

static void no_forged_callback_takes_effect_and_legit_ones_once(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "forged", 2);
    wxg_ct_write_config(&t, NULL);
    ingest g;
    ingest_start(&g, t.topic);

    /* ---- legitimate callbacks, each POSTed twice ---- */
    static const char legit_wk[] =
        "{\"wcId\":\"wxid_bot1\",\"messageType\":\"60001\",\"data\":{\"fromUser\":\"wxid_alice\","
        "\"toUser\":\"wxid_bot1\",\"msgId\":1,\"newMsgId\":7000000000000000001,\"timestamp\":"
        "1748140000,\"self\":false,\"content\":\"hi\"}}";
    static const char legit_gewe[] =
        "{\"TypeName\":\"AddMsg\",\"Appid\":\"wx_app\",\"Wxid\":\"wxid_bot1\",\"Data\":{\"MsgId\":"
        "2,\"FromUserName\":{\"string\":\"wxid_alice\"},\"ToUserName\":{\"string\":\"wxid_bot1\"},"
        "\"MsgType\":1,\"Content\":{\"string\":\"hi\"},\"CreateTime\":1705043418,\"NewMsgId\":"
        "7000000000000000002}}";
    static const char legit_bound[] =
        "{\"account\":\"acct_bound\",\"msg_id\":\"7000000000000000003\",\"conversation\":"
        "\"wxid_alice\",\"type\":\"text\",\"content\":\"hi\"}";
    static const char legit_auto[] =
        "{\"account\":\"acctA\",\"msg_id\":\"7000000000000000004\",\"conversation\":"
        "\"wxid_alice\",\"type\":\"text\",\"content\":\"hi\"}";
    static const char legit_oa[] = "<xml><ToUserName><![CDATA[" OA_ACCT "]]></ToUserName>"
                                   "<FromUserName><![CDATA[oFAKE_openid_000000001]]></FromUserName>"
                                   "<CreateTime>1732329909</CreateTime><MsgType><![CDATA[text]]>"
                                   "</MsgType><Content><![CDATA[hi]]></Content>"
                                   "<MsgId>7000000000000000005</MsgId></xml>";
    char *legit_enc = seal(EAK, APPID, legit_oa);
    char *want[6] = {key_of(legit_wk, WXG_FORMAT_WKTEAM),     key_of(legit_gewe, WXG_FORMAT_GEWE),
                     key_of(legit_bound, WXG_FORMAT_GENERIC), key_of(legit_auto, WXG_FORMAT_AUTO),
                     key_of(legit_oa, WXG_FORMAT_OA_XML),     NULL};
    for (int round = 0; round < 2; round++) {
        assert_int_equal(post_gateway(&g, "/v1/callback/wkteam/wxid_bot1", legit_wk, S_OK), 200);
        assert_int_equal(post_gateway(&g, "/v1/callback/gewe", legit_gewe, S_OK), 200);
        assert_int_equal(post_gateway(&g, "/v1/callback/generic/acct_bound", legit_bound, S_BOUND),
                         200);
        assert_int_equal(post_gateway(&g, "/v1/callback/auto/acctA", legit_auto, S_OK), 200);
        oa_req q = {.path = "/v1/callback/oa", .et = "aes", .enc = legit_enc};
        assert_int_equal(post_oa(&g, &q), 200);
    }

    /* ---- forged callbacks on the gateway endpoints, validly signed ---- */
    static const char oa_json[] =
        "{\"ToUserName\":\"gh_victim\",\"FromUserName\":\"o_user\",\"CreateTime\":1,\"MsgType\":"
        "\"text\",\"Content\":\"pay 100\",\"MsgId\":\"" FORGED_ID "\"}";
    static const char generic_with_oa[] =
        "{\"account\":\"acctA\",\"msg_id\":\"" FORGED_ID "\",\"ToUserName\":\"gh_victim\","
        "\"FromUserName\":\"o_user\",\"MsgType\":\"text\",\"Content\":\"pay 100\",\"MsgId\":"
        "\"" FORGED_ID "\"}";
    static const char wkteam_with_gewe[] =
        "{\"wcId\":\"wxid_bot1\",\"messageType\":\"60001\",\"TypeName\":\"AddMsg\","
        "\"data\":{\"fromUser\":\"wxid_alice\",\"toUser\":\"wxid_bot1\","
        "\"newMsgId\":" FORGED_ID ",\"content\":\"x\"}}";
    static const char gewe_with_oa[] =
        "{\"TypeName\":\"AddMsg\",\"Wxid\":\"wxid_bot1\",\"ToUserName\":\"gh_victim\","
        "\"FromUserName\":\"o_user\",\"MsgType\":\"text\",\"Content\":\"x\",\"MsgId\":\"" FORGED_ID
        "\",\"Data\":{}}";
    static const char probe_with_oa[] =
        "{\"testMsg\":\"x\",\"ToUserName\":\"gh_victim\",\"FromUserName\":\"o_user\",\"MsgType\":"
        "\"text\",\"Content\":\"x\",\"MsgId\":\"" FORGED_ID "\"}";
    static const char generic_with_wkteam[] =
        "{\"account\":\"acctA\",\"msg_id\":\"" FORGED_ID "\",\"wcId\":\"wxid_victim\","
        "\"messageType\":\"60001\",\"data\":{\"newMsgId\":" FORGED_ID ",\"fromUser\":\"x\"}}";
    static const char *const bodies[] = {oa_json, generic_with_oa, wkteam_with_gewe, probe_with_oa};
    static const char *const endpoints[] = {"wkteam", "gewe", "generic", "auto"};
    size_t forged = 0, refused400 = 0;
    for (size_t e = 0; e < 4; e++) {
        for (size_t b = 0; b < sizeof bodies / sizeof bodies[0]; b++) {
            for (int with_acct = 0; with_acct <= 1; with_acct++) {
                char path[128];
                snprintf(path, sizeof path, "/v1/callback/%s%s", endpoints[e],
                         with_acct ? "/acctA" : "");
                /* Refused, or (a gewe callback that carries no message) stored nothing. */
                double stored = metric(&g, "wxg_ingest_stored_bytes_total");
                int st = post_gateway(&g, path, bodies[b], S_OK);
                if (st != 400 &&
                    !(st == 200 && metric(&g, "wxg_ingest_stored_bytes_total") == stored))
                    fail_msg("forged body %zu on %s: %d, want 400", b, path, st);
                forged++;
                refused400 += st == 400;
            }
        }
    }
    /* A GeWe callback with OA fields is a GeWe callback to detection: accepted on /gewe and
     * /auto, where it runs as the GeWe message it is for the account it names (once, though
     * posted twice), never as an OA push; refused everywhere else. */
    assert_int_equal(post_gateway(&g, "/v1/callback/gewe", gewe_with_oa, S_OK), 200);
    assert_int_equal(post_gateway(&g, "/v1/callback/auto", gewe_with_oa, S_OK), 200);
    want[5] = key_of(gewe_with_oa, WXG_FORMAT_GEWE);
    assert_null(strstr(want[5], "gh_victim"));
    static const char *const not_gewe[] = {"/v1/callback/wkteam", "/v1/callback/generic",
                                           "/v1/callback/gewe/acctA", "/v1/callback/oa"};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(post_gateway(&g, not_gewe[i], gewe_with_oa, S_OK), 400);
        refused400++;
        forged++;
    }
    /* A generic body with wkteam's fields is a wkteam callback to detection (and accepted as
     * one on /wkteam, for the account its wcId names): never a generic message. */
    assert_int_equal(post_gateway(&g, "/v1/callback/generic", generic_with_wkteam, S_OK), 400);
    assert_int_equal(post_gateway(&g, "/v1/callback/generic/acctA", generic_with_wkteam, S_OK),
                     400);
    assert_int_equal(post_gateway(&g, "/v1/callback/gewe", generic_with_wkteam, S_OK), 400);
    assert_int_equal(post_gateway(&g, "/v1/callback/wkteam/acctA", generic_with_wkteam, S_OK), 400);
    refused400 += 4;
    forged += 4;
    /* The path names another account than the body (a legit body, replayed for another). */
    assert_int_equal(post_gateway(&g, "/v1/callback/wkteam/wxid_other", legit_wk, S_OK), 400);
    assert_int_equal(post_gateway(&g, "/v1/callback/auto/wxid_other", legit_auto, S_OK), 400);
    refused400 += 2;
    forged += 2;
    /* A secret bound to one account, used for another (in the body, then in the path). */
    assert_int_equal(post_gateway(&g, "/v1/callback/generic", legit_auto, S_BOUND), 403);
    assert_int_equal(post_gateway(&g, "/v1/callback/generic/acctA", legit_auto, S_BOUND), 403);
    forged += 2;
    /* Signatures that do not hold. */
    static const enum sign bad[] = {S_NONE, S_WRONG, S_STALE, S_FUTURE, S_OTHER_BODY};
    size_t refused401 = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        static const char forged_generic[] =
            "{\"account\":\"acctA\",\"msg_id\":\"" FORGED_ID "\",\"type\":\"text\"}";
        for (size_t e = 0; e < 4; e++) {
            char path[128];
            snprintf(path, sizeof path, "/v1/callback/%s", endpoints[e]);
            assert_int_equal(post_gateway(&g, path, forged_generic, bad[i]), 401);
            refused401++;
            forged++;
        }
    }

    /* ---- forged pushes on /oa ---- */
    static const char forged_oa[] = "<xml><ToUserName><![CDATA[" OA_ACCT "]]></ToUserName>"
                                    "<FromUserName><![CDATA[o_user]]></FromUserName>"
                                    "<CreateTime>1732329909</CreateTime><MsgType><![CDATA[text]]>"
                                    "</MsgType><Content><![CDATA[pay 100]]></Content>"
                                    "<MsgId>" FORGED_ID "</MsgId></xml>";
    static const char forged_oa_gewe[] =
        "{\"ToUserName\":\"" OA_ACCT "\",\"FromUserName\":\"o\",\"CreateTime\":1,\"MsgType\":"
        "\"text\",\"Content\":\"x\",\"MsgId\":\"" FORGED_ID "\",\"TypeName\":\"AddMsg\"}";
    char *enc_forged = seal(EAK, APPID, forged_oa);
    char *enc_other_app = seal(EAK, "wx_OTHERAPPID", forged_oa);
    char *enc_other_key = seal(EAK_OTHER, APPID, forged_oa);
    char *enc_gewe = seal(EAK, APPID, forged_oa_gewe);
    const struct {
        oa_req q;
        int status;
    } oa_cases[] = {
        /* Downgrades to plaintext: refused whatever the query says. */
        {{.path = "/v1/callback/oa", .body = forged_oa}, 401},
        {{.path = "/v1/callback/oa", .et = "raw", .body = forged_oa}, 401},
        {{.path = "/v1/callback/oa", .et = "", .body = forged_oa}, 401},
        {{.path = "/v1/callback/oa", .et = "aes%20", .body = forged_oa}, 401},
        /* A repeated parameter (the first counts) and a NUL that cuts the value to "aes" both
         * lead to the strict path, where a plaintext body has no Encrypt. */
        {{.path = "/v1/callback/oa", .et = "aes&encrypt_type=raw", .body = forged_oa}, 400},
        {{.path = "/v1/callback/oa", .et = "aes%00x", .body = forged_oa}, 400},
        {{.path = "/v1/callback/oa/" OA_ACCT, .et = "none", .body = forged_oa}, 401},
        /* The encrypted path in any case: a plaintext body holds no Encrypt. */
        {{.path = "/v1/callback/oa", .et = "AES", .body = forged_oa}, 400},
        {{.path = "/v1/callback/oa", .et = "Aes", .body = forged_oa, .sig_enc = "-"}, 400},
        /* Signatures over Encrypt: empty, wrong, or a captured query with another body. */
        {{.path = "/v1/callback/oa", .et = "aes", .enc = enc_forged, .sig_enc = ""}, 401},
        {{.path = "/v1/callback/oa", .et = "aes", .enc = enc_forged, .sig_enc = "-"}, 401},
        {{.path = "/v1/callback/oa", .et = "aes", .enc = enc_forged, .sig_enc = legit_enc}, 401},
        /* Sealed for another AppId, or with another key. */
        {{.path = "/v1/callback/oa", .et = "aes", .enc = enc_other_app}, 400},
        {{.path = "/v1/callback/oa", .et = "aes", .enc = enc_other_key}, 400},
        /* Stale and future timestamps, validly signed. */
        {{.path = "/v1/callback/oa", .et = "aes", .enc = enc_forged, .ts_shift_s = -3600}, 401},
        {{.path = "/v1/callback/oa", .et = "aes", .enc = enc_forged, .ts_shift_s = 3600}, 401},
        /* A push for another account than the path's; an OA push with gewe's discriminator. */
        {{.path = "/v1/callback/oa/gh_other", .et = "aes", .enc = enc_forged}, 400},
        {{.path = "/v1/callback/oa", .et = "aes", .enc = enc_gewe}, 400},
    };
    size_t oa401 = 0;
    for (size_t i = 0; i < sizeof oa_cases / sizeof oa_cases[0]; i++) {
        int st = post_oa(&g, &oa_cases[i].q);
        if (st != oa_cases[i].status)
            fail_msg("forged OA case %zu: %d, want %d", i, st, oa_cases[i].status);
        oa401 += st == 401;
        forged++;
    }

    /* Every refusal is counted by its reason. */
    assert_true(metric(&g, "wxg_ingest_body_refused_total{endpoint=\"auto\",reason="
                           "\"oa_elsewhere\"}") >= 1);
    assert_true(metric(&g, "wxg_ingest_body_refused_total{endpoint=\"generic\",reason="
                           "\"format_mismatch\"}") >= 1);
    assert_int_equal(metric(&g, "wxg_ingest_body_refused_total{endpoint=\"generic\",reason="
                                "\"account_not_allowed\"}"),
                     2);
    assert_int_equal(metric(&g, "wxg_ingest_auth_refused_total{endpoint=\"oa\",reason="
                                "\"plaintext_refused\"}"),
                     5);
    double gw401 = 0, gw400 = 0, oa_401 = 0;
    for (size_t e = 0; e < 4; e++) {
        char s[128];
        snprintf(s, sizeof s, "wxg_ingest_requests_total{endpoint=\"%s\",status=\"401\"}",
                 endpoints[e]);
        gw401 += metric(&g, s);
        snprintf(s, sizeof s, "wxg_ingest_requests_total{endpoint=\"%s\",status=\"400\"}",
                 endpoints[e]);
        gw400 += metric(&g, s);
    }
    oa_401 = metric(&g, "wxg_ingest_requests_total{endpoint=\"oa\",status=\"401\"}");
    assert_int_equal((size_t)gw401, refused401);
    assert_int_equal((size_t)gw400, refused400);
    assert_int_equal((size_t)oa_401, oa401);

    /* ---- the consumer's half: a record whose stated decision does not hold ---- */
    produce_with_header(t.topic, legit_auto, "oa-xml", "acctA");
    produce_with_header(t.topic, generic_with_oa, "generic", "someone_else");
    produce_with_header(t.topic, oa_json, "auto", "");

    /* Run the consumer until everything on the topic is finished: its committed offsets reach
     * the end offsets, so that a forged record anywhere would have taken effect by then. */
    rd_kafka_conf_t *kc = wxg_test_kafka_conf();
    char errstr[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, errstr, sizeof errstr);
    assert_non_null(rk);
    for (int p = 0; p < t.partitions; p++) {
        int64_t lo = 0, hi = 0;
        assert_int_equal(rd_kafka_query_watermark_offsets(rk, t.topic, p, &lo, &hi,
                                                          10000 * (int)wxg_test_scale()),
                         0);
        t.produced[p] = hi;
    }
    rd_kafka_destroy(rk);
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    wxg_test_kafka_msg_t *dl = NULL;
    size_t ndl = wxg_test_kafka_read(t.dlq, 3, 10000, &dl);
    assert_int_equal(ndl, 3);
    wxg_test_kafka_msgs_free(dl, ndl);
    assert_true(wxg_ct_wait_log(&t, 0, "event=decode_error", 3, 10000));
    assert_int_equal(wxg_ct_log_count(&t, 0, "event=decode_error"), 3);
    assert_true(wxg_ct_log_count(&t, 0, "header states (oa-xml)") >= 1);
    assert_true(wxg_ct_log_count(&t, 0, "than the record's wxg-account header") >= 1);
    assert_true(wxg_ct_log_count(&t, 0, "wxg-format header names no format") >= 1);
    wxg_ct_stop_all(&t);

    /* The ledger: exactly the legitimate keys, each once, and nothing of a forged id. */
    FILE *f = fopen(t.ledger, "r");
    assert_non_null(f);
    char line[8192];
    size_t seen[6] = {0}, lines = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(o, "key"));
        assert_non_null(key);
        assert_null(strstr(line, FORGED_ID));
        assert_null(strstr(line, "gh_victim"));
        int hit = 0;
        for (int i = 0; i < 6; i++) {
            if (strcmp(key, want[i]) == 0) {
                seen[i]++;
                hit = 1;
            }
        }
        if (!hit)
            fail_msg("an effect nobody legitimate asked for: %s", line);
        cJSON_Delete(o);
        lines++;
    }
    fclose(f);
    for (int i = 0; i < 6; i++) {
        if (seen[i] != 1)
            fail_msg("legit key %s took effect %zu times", want[i], seen[i]);
        free(want[i]);
    }
    assert_int_equal(lines, 6);
    print_message("forged requests refused: %zu (none took effect); legitimate: 6 of 6 once\n",
                  forged);

    free(legit_enc);
    free(enc_forged);
    free(enc_other_app);
    free(enc_other_key);
    free(enc_gewe);
    wxg_ingest_destroy(g.in);
    wxg_metrics_free(g.reg);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_forged_callback_takes_effect_and_legit_ones_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
