/* Unit tests for lib/ingest.c without a broker: the Official Account signature against the
 * documented vectors, the gateway HMAC against RFC 4231, and every answer the receiver gives
 * before or instead of storing (404, 405, 401, 400, 413, the URL-verification echo, and 503 with
 * /readyz not ready when Kafka cannot be reached), the checks on encrypted Official Account
 * pushes and the safe-mode settings, and /metrics, /healthz and /readyz served on the operations
 * port and not on the callback port unless asked for. Kafka is a closed loopback port here; storing
 * for real is tests/integration/test_ingest.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oacrypt_int.h"
#include "testenv.h"
#include "testhttp.h"
#include "wxguard/conf.h"
#include "wxguard/err.h"
#include "wxguard/ingest.h"
#include "wxguard/metrics.h"

static const char *const no_env[] = {NULL};

static const char o1_xml[] = "<xml>\n"
                             "  <ToUserName><![CDATA[gh_fake00000001]]></ToUserName>\n"
                             "  <FromUserName><![CDATA[oFAKE_openid_000000001]]></FromUserName>\n"
                             "  <CreateTime>1732329909</CreateTime>\n"
                             "  <MsgType><![CDATA[text]]></MsgType>\n"
                             "  <Content><![CDATA[hello]]></Content>\n"
                             "  <MsgId>24500000000000001</MsgId>\n"
                             "</xml>\n";

static const char generic_json[] =
    "{\"account\":\"wxid_fakebot000001\",\"msg_id\":\"9300000000000000001\","
    "\"conversation\":\"wxid_fakealice0001\",\"sender\":\"wxid_fakealice0001\","
    "\"create_time\":1705043418,\"type\":\"text\",\"content\":\"hi\"}";

typedef struct fixture {
    wxg_metrics_t *reg;
    wxg_ingest_t *in;
    int port;
    int ops_port; /* -1: no operations server */
} fixture;

/* A receiver whose Kafka is a closed port, with the extra settings given. */
static void start(fixture *f, const char *const *extra, size_t nextra)
{
    char err[512] = "";
    char boot[64];
    int dead = wxg_test_free_port();
    assert_true(dead > 0);
    snprintf(boot, sizeof boot, "kafka.bootstrap.servers=127.0.0.1:%d", dead);
    const char *sets[16] = {boot,
                            "ingest.listen=127.0.0.1:0",
                            "ingest.ops.listen=127.0.0.1:0",
                            "ingest.produce.timeout.ms=300",
                            "ingest.max.body.bytes=2KiB",
                            "kafka.log_level=0"};
    size_t n = 6;
    for (size_t i = 0; i < nextra && n < 16; i++)
        sets[n++] = extra[i];
    wxg_conf_t *conf = wxg_conf_load(WXG_PROG_INGEST, NULL, no_env, sets, n, err, sizeof err);
    if (conf == NULL)
        fail_msg("conf: %s", err);
    f->reg = wxg_metrics_new();
    f->in = wxg_ingest_new(conf, f->reg, err, sizeof err);
    wxg_conf_free(conf);
    if (f->in == NULL)
        fail_msg("wxg_ingest_new: %s", err);
    f->port = wxg_ingest_port(f->in);
    assert_true(f->port > 0);
    f->ops_port = wxg_ingest_ops_port(f->in);
}

static void stop(fixture *f)
{
    wxg_ingest_destroy(f->in);
    wxg_metrics_free(f->reg);
}

/* Sends a request and returns its status; the body is copied into `body` when not NULL. */
static int req(fixture *f, const char *method, const char *target, const char *headers,
               const char *payload, size_t len, char *body, size_t body_size, char *hdrs,
               size_t hdrs_size)
{
    wxg_test_http_resp_t r;
    if (wxg_test_http(f->port, method, target, headers, payload, len, &r) != 0)
        fail_msg("%s %s: no answer", method, target);
    int status = r.status;
    if (body != NULL)
        snprintf(body, body_size, "%s", r.body);
    if (hdrs != NULL)
        snprintf(hdrs, hdrs_size, "%s", r.headers);
    wxg_test_http_free(&r);
    return status;
}

/* GET `path` on `port`: its status, and its body in `body`. */
static int get_on(int port, const char *path, char *body, size_t body_size)
{
    wxg_test_http_resp_t r;
    if (wxg_test_http(port, "GET", path, NULL, NULL, 0, &r) != 0)
        fail_msg("GET %s on port %d: no answer", path, port);
    int status = r.status;
    snprintf(body, body_size, "%s", r.body);
    wxg_test_http_free(&r);
    return status;
}

static char *render(wxg_metrics_t *reg)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(wxg_metrics_render(reg, &text, &len), 0);
    return text;
}

static void oa_signature_matches_the_documented_vectors(void **state)
{
    (void)state;
    char sig[41];
    assert_int_equal(wxg_ingest_oa_signature("AAAAA", "1714036504", "1514711492", sig), 0);
    assert_string_equal(sig, "f464b24fc39322e44b38aa78f5edd27bd1441696");
    assert_int_equal(wxg_ingest_oa_signature("AAAAA", "1714037059", "486452656", sig), 0);
    assert_string_equal(sig, "899cf89e464efb63f54ddac96b0a0a235f53aa78");
    assert_int_equal(wxg_ingest_oa_verify("AAAAA", "1714037059", "486452656",
                                          "899CF89E464EFB63F54DDAC96B0A0A235F53AA78"),
                     0);
    assert_int_equal(wxg_ingest_oa_verify("AAAAA", "1714037059", "486452657",
                                          "899cf89e464efb63f54ddac96b0a0a235f53aa78"),
                     WXG_EAUTH);
    assert_int_equal(wxg_ingest_oa_verify("AAAAA", "1714037059", "486452656",
                                          "899cf89e464efb63f54ddac96b0a0a235f53aa7"),
                     WXG_EAUTH);
    assert_int_equal(wxg_ingest_oa_verify("AAAAA", NULL, "486452656",
                                          "899cf89e464efb63f54ddac96b0a0a235f53aa78"),
                     WXG_EAUTH);
    assert_int_equal(wxg_ingest_oa_verify("", "1714037059", "486452656",
                                          "899cf89e464efb63f54ddac96b0a0a235f53aa78"),
                     WXG_EAUTH);
    assert_int_equal(wxg_ingest_oa_signature("AAAAA", NULL, "1", sig), WXG_EINVAL);
}

static void gateway_hmac_matches_rfc4231_and_refuses_anything_else(void **state)
{
    (void)state;
    static const char data[] = "what do ya want for nothing?";
    char h[72];
    assert_int_equal(wxg_ingest_hmac_sign("Jefe", data, sizeof data - 1, h), 0);
    assert_string_equal(h,
                        "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    assert_int_equal(wxg_ingest_hmac_verify("Jefe", data, sizeof data - 1, h), 0);
    assert_int_equal(wxg_ingest_hmac_verify(
                         "Jefe", data, sizeof data - 1,
                         "SHA256=5BDCC146BF60754E6A042426089575C75A003F089D2739839DEC58B964EC3843"),
                     0);
    assert_int_equal(wxg_ingest_hmac_verify("Jefe", data, sizeof data - 2, h), WXG_EAUTH);
    assert_int_equal(wxg_ingest_hmac_verify("jefe", data, sizeof data - 1, h), WXG_EAUTH);
    assert_int_equal(wxg_ingest_hmac_verify("Jefe", data, sizeof data - 1, h + 7), WXG_EAUTH);
    assert_int_equal(wxg_ingest_hmac_verify("Jefe", data, sizeof data - 1, NULL), WXG_EAUTH);
    assert_int_equal(wxg_ingest_hmac_verify("Jefe", data, sizeof data - 1, "sha256="), WXG_EAUTH);
}

static void unknown_paths_and_methods_get_404_and_405(void **state)
{
    (void)state;
    fixture f;
    char body[1024], hdrs[2048];
    start(&f, NULL, 0);
    assert_int_equal(req(&f, "POST", "/v1/callback/nope", NULL, "{}", 2, NULL, 0, NULL, 0), 404);
    assert_int_equal(req(&f, "POST", "/v1/callback/", NULL, "{}", 2, NULL, 0, NULL, 0), 404);
    assert_int_equal(req(&f, "POST", "/elsewhere", NULL, "{}", 2, NULL, 0, NULL, 0), 404);
    assert_int_equal(
        req(&f, "POST", "/v1/callback/wkteam/bad%20acct", NULL, "{}", 2, NULL, 0, NULL, 0), 404);
    assert_int_equal(
        req(&f, "GET", "/v1/callback/wkteam", NULL, NULL, 0, body, sizeof body, hdrs, sizeof hdrs),
        405);
    assert_non_null(strstr(hdrs, "Allow: POST\r\n"));
    assert_int_equal(req(&f, "PUT", "/v1/callback/oa", NULL, "x", 1, NULL, 0, hdrs, sizeof hdrs),
                     405);
    assert_non_null(strstr(hdrs, "Allow: GET, POST\r\n"));
    /* Without a token the Official Account endpoint does not exist. */
    assert_int_equal(req(&f, "POST", "/v1/callback/oa", NULL, o1_xml, sizeof o1_xml - 1, body,
                         sizeof body, NULL, 0),
                     404);
    assert_non_null(strstr(body, "ingest.oa.token"));
    /* The built-in paths are served on the operations port. */
    assert_int_equal(req(&f, "GET", "/healthz", NULL, NULL, 0, NULL, 0, NULL, 0), 404);
    char ok[64];
    assert_int_equal(get_on(f.ops_port, "/healthz", ok, sizeof ok), 200);
    stop(&f);
}

static void oa_signature_is_checked_and_the_url_verification_echoes(void **state)
{
    (void)state;
    fixture f;
    char body[1024], target[512], sig[41];
    /* The documented vectors carry fixed, old timestamps: the replay window is off here and
     * tested on its own below. */
    const char *extra[] = {"ingest.oa.token=AAAAA", "ingest.signature.tolerance.ms=0"};
    start(&f, extra, 2);
    snprintf(target, sizeof target,
             "/v1/callback/oa?signature=f464b24fc39322e44b38aa78f5edd27bd1441696"
             "&timestamp=1714036504&nonce=1514711492&echostr=8412345678901234567");
    assert_int_equal(req(&f, "GET", target, NULL, NULL, 0, body, sizeof body, NULL, 0), 200);
    assert_string_equal(body, "8412345678901234567");
    /* One digit of the nonce changed: refused, nothing echoed. */
    snprintf(target, sizeof target,
             "/v1/callback/oa?signature=f464b24fc39322e44b38aa78f5edd27bd1441696"
             "&timestamp=1714036504&nonce=1514711493&echostr=8412345678901234567");
    assert_int_equal(req(&f, "GET", target, NULL, NULL, 0, body, sizeof body, NULL, 0), 401);
    assert_null(strstr(body, "8412345678901234567"));
    assert_int_equal(req(&f, "GET", "/v1/callback/oa?echostr=1", NULL, NULL, 0, NULL, 0, NULL, 0),
                     401);
    /* A POST with a bad signature never reaches Kafka (the answer is 401, not 503). */
    assert_int_equal(req(&f, "POST",
                         "/v1/callback/oa?signature=0000000000000000000000000000000000000000"
                         "&timestamp=1714036504&nonce=1514711492",
                         NULL, o1_xml, sizeof o1_xml - 1, body, sizeof body, NULL, 0),
                     401);
    assert_non_null(strstr(body, "EAUTH"));
    /* A good one does, and Kafka is down here: 503. */
    assert_int_equal(wxg_ingest_oa_signature("AAAAA", "1732329909", "77", sig), 0);
    snprintf(target, sizeof target, "/v1/callback/oa?signature=%s&timestamp=1732329909&nonce=77",
             sig);
    assert_int_equal(
        req(&f, "POST", target, NULL, o1_xml, sizeof o1_xml - 1, body, sizeof body, NULL, 0), 503);
    /* An Official Account push through another endpoint would skip the check: refused. */
    assert_int_equal(req(&f, "POST", "/v1/callback/auto", NULL, o1_xml, sizeof o1_xml - 1, body,
                         sizeof body, NULL, 0),
                     400);
    assert_non_null(strstr(body, "/v1/callback/oa"));
    char *m = render(f.reg);
    assert_non_null(strstr(m, "wxg_ingest_requests_total{endpoint=\"oa\",status=\"401\"} 3\n"));
    assert_non_null(strstr(m, "wxg_ingest_requests_total{endpoint=\"oa\",status=\"200\"} 1\n"));
    free(m);
    stop(&f);
}

static void undecodable_and_oversized_bodies_get_400_and_413_with_a_reason(void **state)
{
    (void)state;
    fixture f;
    char body[1024];
    start(&f, NULL, 0);
    static const char bad[] = "{\"wcId\":\"wxid_fakebot000001\",\"data\":";
    assert_int_equal(req(&f, "POST", "/v1/callback/wkteam", NULL, bad, sizeof bad - 1, body,
                         sizeof body, NULL, 0),
                     400);
    assert_non_null(strstr(body, "EPARSE: malformed input"));
    assert_int_equal(req(&f, "POST", "/v1/callback/generic", NULL, "{\"msg_id\":\"1\"}", 14, body,
                         sizeof body, NULL, 0),
                     400);
    assert_non_null(strstr(body, "ENOACCOUNT"));
    char *big = malloc(4096);
    assert_non_null(big);
    memset(big, ' ', 4096);
    memcpy(big, generic_json, sizeof generic_json - 1);
    assert_int_equal(
        req(&f, "POST", "/v1/callback/generic", NULL, big, 2049, body, sizeof body, NULL, 0), 413);
    free(big);
    /* The account in the path must be the message's. */
    assert_int_equal(req(&f, "POST", "/v1/callback/generic/wxid_otherbot", NULL, generic_json,
                         sizeof generic_json - 1, body, sizeof body, NULL, 0),
                     400);
    assert_non_null(strstr(body, "another account"));
    stop(&f);
}

static void kafka_down_gives_503_with_retry_after_and_not_ready(void **state)
{
    (void)state;
    fixture f;
    char body[1024], hdrs[2048];
    start(&f, NULL, 0);
    assert_int_equal(req(&f, "POST", "/v1/callback/generic/wxid_fakebot000001",
                         "X-Request-Id: gw-retry-0001\r\n", generic_json, sizeof generic_json - 1,
                         body, sizeof body, hdrs, sizeof hdrs),
                     503);
    assert_non_null(strstr(hdrs, "Retry-After: 1\r\n"));
    assert_non_null(strstr(hdrs, "X-Request-Id: gw-retry-0001\r\n"));
    assert_non_null(strstr(body, "ETIMEDOUT"));
    assert_int_equal(get_on(f.ops_port, "/readyz", body, sizeof body), 503);
    assert_non_null(strstr(body, "not ready: kafka"));
    char reason[128];
    assert_int_equal(wxg_ingest_ready(f.in, reason, sizeof reason), 0);
    /* A client's request id that is not sane is replaced by a generated one. */
    assert_int_equal(req(&f, "POST", "/v1/callback/generic", "X-Request-Id: a b\r\n", "{", 1, NULL,
                         0, hdrs, sizeof hdrs),
                     400);
    assert_null(strstr(hdrs, "X-Request-Id: a b"));
    assert_non_null(strstr(hdrs, "X-Request-Id: "));
    stop(&f);
}

static void the_gateway_hmac_is_required_when_a_secret_is_set(void **state)
{
    (void)state;
    fixture f;
    char body[1024], hv[72], hdr[128];
    /* With the replay window off, an HMAC over the body alone is still taken. */
    const char *extra[] = {"ingest.hmac.secret=s3cret", "ingest.signature.tolerance.ms=0"};
    start(&f, extra, 2);
    assert_int_equal(req(&f, "POST", "/v1/callback/generic", NULL, generic_json,
                         sizeof generic_json - 1, body, sizeof body, NULL, 0),
                     401);
    assert_non_null(strstr(body, "X-Wxg-Signature"));
    assert_int_equal(wxg_ingest_hmac_sign("wrong", generic_json, sizeof generic_json - 1, hv), 0);
    snprintf(hdr, sizeof hdr, "X-Wxg-Signature: %s\r\n", hv);
    assert_int_equal(req(&f, "POST", "/v1/callback/generic", hdr, generic_json,
                         sizeof generic_json - 1, NULL, 0, NULL, 0),
                     401);
    /* The right one passes the check and reaches Kafka, which is down: 503. */
    assert_int_equal(wxg_ingest_hmac_sign("s3cret", generic_json, sizeof generic_json - 1, hv), 0);
    snprintf(hdr, sizeof hdr, "X-Wxg-Signature: %s\r\n", hv);
    assert_int_equal(req(&f, "POST", "/v1/callback/generic", hdr, generic_json,
                         sizeof generic_json - 1, NULL, 0, NULL, 0),
                     503);
    char *m = render(f.reg);
    assert_non_null(
        strstr(m, "wxg_ingest_requests_total{endpoint=\"generic\",status=\"401\"} 2\n"));
    assert_non_null(
        strstr(m, "wxg_ingest_requests_total{endpoint=\"generic\",status=\"503\"} 1\n"));
    free(m);
    stop(&f);
}

/* An OA request signed at `ts` (decimal Unix seconds) for the o1 push; returns the status. */
static int post_oa_at(fixture *f, const char *ts, char *body, size_t body_size)
{
    char sig[41], target[256];
    assert_int_equal(wxg_ingest_oa_signature("AAAAA", ts, "31", sig), 0);
    snprintf(target, sizeof target, "/v1/callback/oa?signature=%s&timestamp=%s&nonce=31", sig, ts);
    return req(f, "POST", target, NULL, o1_xml, sizeof o1_xml - 1, body, body_size, NULL, 0);
}

/* A gateway request: X-Wxg-Timestamp `hdr_ts` (NULL: none) and an HMAC made over `signed_ts`
 * (NULL: over the body alone). Returns the status. */
static int post_gateway_at(fixture *f, const char *hdr_ts, const char *signed_ts, char *body,
                           size_t body_size)
{
    char hv[72], hdr[256];
    assert_int_equal(
        wxg_ingest_hmac_sign_ts("s3cret", signed_ts, generic_json, sizeof generic_json - 1, hv), 0);
    if (hdr_ts != NULL)
        snprintf(hdr, sizeof hdr, "X-Wxg-Signature: %s\r\nX-Wxg-Timestamp: %s\r\n", hv, hdr_ts);
    else
        snprintf(hdr, sizeof hdr, "X-Wxg-Signature: %s\r\n", hv);
    return req(f, "POST", "/v1/callback/generic", hdr, generic_json, sizeof generic_json - 1, body,
               body_size, NULL, 0);
}

static void signed_requests_outside_the_replay_window_are_refused_and_counted(void **state)
{
    (void)state;
    fixture f;
    char body[1024], now[24], old[24], ahead[24], edge[24];
    const char *extra[] = {"ingest.oa.token=AAAAA", "ingest.hmac.secret=s3cret",
                           "ingest.signature.tolerance.ms=5m"};
    start(&f, extra, 3);
    long long t = (long long)time(NULL);
    snprintf(now, sizeof now, "%lld", t);
    snprintf(old, sizeof old, "%lld", t - 310);
    snprintf(ahead, sizeof ahead, "%lld", t + 320);
    snprintf(edge, sizeof edge, "%lld", t - 290);

    /* Official Account: a fresh or slightly old signature passes the checks (Kafka is down:
     * 503); one signed 310 s ago or 320 s ahead (each 503 takes 0.3 s of the clock) is refused
     * although the signature is right. */
    assert_int_equal(post_oa_at(&f, now, body, sizeof body), 503);
    assert_int_equal(post_oa_at(&f, edge, body, sizeof body), 503);
    assert_int_equal(post_oa_at(&f, old, body, sizeof body), 401);
    assert_non_null(strstr(body, "too old"));
    assert_non_null(strstr(body, "ingest.signature.tolerance.ms"));
    assert_int_equal(post_oa_at(&f, ahead, body, sizeof body), 401);
    assert_non_null(strstr(body, "future"));
    assert_int_equal(post_oa_at(&f, "17e8", body, sizeof body), 401);

    /* Gateway: the HMAC must cover a fresh X-Wxg-Timestamp. */
    assert_int_equal(post_gateway_at(&f, now, now, body, sizeof body), 503);
    assert_int_equal(post_gateway_at(&f, NULL, NULL, body, sizeof body), 401);
    assert_non_null(strstr(body, "no signed timestamp"));
    assert_int_equal(post_gateway_at(&f, old, old, body, sizeof body), 401);
    assert_non_null(strstr(body, "too old"));
    /* A captured request with its timestamp header refreshed no longer verifies. */
    assert_int_equal(post_gateway_at(&f, now, old, body, sizeof body), 401);
    assert_non_null(strstr(body, "X-Wxg-Signature"));
    /* Nor does a body-only HMAC with a timestamp header added. */
    assert_int_equal(post_gateway_at(&f, now, NULL, body, sizeof body), 401);

    char *m = render(f.reg);
    static const char *const want[] = {
        "wxg_ingest_auth_refused_total{endpoint=\"oa\",reason=\"expired\"} 1\n",
        "wxg_ingest_auth_refused_total{endpoint=\"oa\",reason=\"future\"} 1\n",
        "wxg_ingest_auth_refused_total{endpoint=\"oa\",reason=\"bad_timestamp\"} 1\n",
        "wxg_ingest_auth_refused_total{endpoint=\"generic\",reason=\"missing_timestamp\"} 1\n",
        "wxg_ingest_auth_refused_total{endpoint=\"generic\",reason=\"expired\"} 1\n",
        "wxg_ingest_auth_refused_total{endpoint=\"generic\",reason=\"bad_hmac\"} 2\n",
        "wxg_ingest_requests_total{endpoint=\"oa\",status=\"401\"} 3\n",
        "wxg_ingest_requests_total{endpoint=\"generic\",status=\"401\"} 4\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (strstr(m, want[i]) == NULL)
            fail_msg("missing %s in\n%s", want[i], m);
    }
    free(m);
    stop(&f);
}

static void the_timestamp_check_takes_plain_seconds_within_the_tolerance(void **state)
{
    (void)state;
    const char *why = NULL;
    int64_t now = 1700000000000;
    assert_int_equal(wxg_ingest_timestamp_check("1700000000", 300000, now, &why), 0);
    assert_int_equal(wxg_ingest_timestamp_check("1699999700", 300000, now, &why), 0);
    assert_int_equal(wxg_ingest_timestamp_check("1699999699", 300000, now, &why), WXG_EAUTH);
    assert_string_equal(why, "expired");
    assert_int_equal(wxg_ingest_timestamp_check("1700000301", 300000, now, &why), WXG_EAUTH);
    assert_string_equal(why, "future");
    assert_int_equal(wxg_ingest_timestamp_check(NULL, 300000, now, &why), WXG_EAUTH);
    assert_string_equal(why, "missing_timestamp");
    static const char *const bad[] = {"",   "+1700000000",  " 1700000000", "1700000000.5",
                                      "-1", "1700000000000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(wxg_ingest_timestamp_check(bad[i], 300000, now, &why), WXG_EAUTH);
        assert_string_equal(why, bad[i][0] == '\0' ? "missing_timestamp" : "bad_timestamp");
    }
    /* Tolerance 0: no check at all. */
    assert_int_equal(wxg_ingest_timestamp_check(NULL, 0, now, &why), 0);
    assert_null(why);
    /* The timestamped HMAC is the HMAC of "<timestamp>." and the body. */
    char a[72], b[72];
    assert_int_equal(wxg_ingest_hmac_sign_ts("k", "1700000000", "body", 4, a), 0);
    assert_int_equal(wxg_ingest_hmac_sign("k", "1700000000.body", 15, b), 0);
    assert_string_equal(a, b);
    assert_int_equal(wxg_ingest_hmac_verify_ts("k", "1700000000", "body", 4, a), 0);
    assert_int_equal(wxg_ingest_hmac_verify_ts("k", "1700000001", "body", 4, a), WXG_EAUTH);
}

#define EAK "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"

/* Posts an encrypted push whose envelope is `head`, Encrypt text `enc`, then `tail` to the oa
 * endpoint, signed right unless `bad_sig`; returns the status and the body in `body`. */
static int post_encrypted(fixture *f, const char *head, const char *enc, const char *tail,
                          int bad_sig, char *body, size_t body_size)
{
    char sig[41], msig[41], target[512], payload[2048];
    assert_int_equal(wxg_ingest_oa_signature("AAAAA", "1732330200", "9", sig), 0);
    assert_int_equal(wxg__oa_msg_signature("AAAAA", "1732330200", "9", enc, strlen(enc), msig), 0);
    if (bad_sig)
        msig[0] = msig[0] == 'a' ? 'b' : 'a';
    snprintf(target, sizeof target,
             "/v1/callback/oa?signature=%s&timestamp=1732330200&nonce=9&encrypt_type=aes"
             "&msg_signature=%s",
             sig, msig);
    int n = snprintf(payload, sizeof payload, "%s%s%s", head, enc, tail);
    assert_true(n > 0 && (size_t)n < sizeof payload);
    return req(f, "POST", target, NULL, payload, (size_t)n, body, body_size, NULL, 0);
}

static void encrypted_pushes_that_fail_a_check_are_refused_before_kafka(void **state)
{
    (void)state;
    static const char head[] = "<xml><ToUserName><![CDATA[gh_fake00000001]]></ToUserName>"
                               "<Encrypt><![CDATA[";
    static const char tail[] = "]]></Encrypt></xml>";
    fixture f;
    char body[1024];
    const char *extra[] = {"ingest.oa.token=AAAAA", "ingest.oa.aes.key=" EAK,
                           "ingest.oa.appid=wx_FAKEAPPID_0001", "ingest.signature.tolerance.ms=0"};
    start(&f, extra, 4);
    unsigned char key[WXG__OA_AES_KEY_BYTES];
    char *enc = NULL;
    assert_int_equal(wxg__oa_aes_key(EAK, key), 0);
    assert_int_equal(wxg__oa_encrypt(key, "wx_FAKEAPPID_0001",
                                     (const unsigned char *)"0123456789abcdef", o1_xml,
                                     sizeof o1_xml - 1, &enc),
                     0);
    /* No Encrypt in the envelope: 400 with the reader's reason. */
    assert_int_equal(
        post_encrypted(&f, "<xml><ToUserName>gh", "", "</ToUserName></xml>", 0, body, sizeof body),
        400);
    assert_non_null(strstr(body, "EFORMAT"));
    assert_non_null(strstr(body, "Encrypt"));
    /* A wrong msg_signature: 401. */
    assert_int_equal(post_encrypted(&f, head, enc, tail, 1, body, sizeof body), 401);
    assert_non_null(strstr(body, "msg_signature"));
    /* Right signature over text that is not a sealed push: 400 naming why. */
    assert_int_equal(post_encrypted(&f, head, "QUJDRA==", tail, 0, body, sizeof body), 400);
    assert_non_null(strstr(body, "AES blocks"));
    /* Everything right: it gets as far as Kafka, which is down here (503). */
    assert_int_equal(post_encrypted(&f, head, enc, tail, 0, body, sizeof body), 503);
    free(enc);
    stop(&f);
}

/* A safe-mode key that could not work, or could accept another account's pushes, stops the
 * start with the setting's name. */
static void unusable_safe_mode_settings_fail_start_with_a_reason(void **state)
{
    (void)state;
    static const struct {
        const char *sets[3];
        const char *why;
    } cases[] = {
        {{"ingest.oa.aes.key.previous=" EAK, NULL, NULL}, "ingest.oa.aes.key is empty"},
        {{"ingest.oa.aes.key=" EAK, "ingest.oa.appid=wx_A", NULL}, "needs ingest.oa.token"},
        {{"ingest.oa.aes.key=abcdefghijklmnopqrstuvwxyz0123456789ABCDEF!", "ingest.oa.token=T",
          "ingest.oa.appid=wx_A"},
         "not an EncodingAESKey"},
        {{"ingest.oa.aes.key=" EAK, "ingest.oa.token=T", "ingest.oa.appid=wx_A"}, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[512] = "";
        const char *sets[8] = {"kafka.bootstrap.servers=127.0.0.1:1", "ingest.listen=127.0.0.1:0",
                               "ingest.ops.listen=127.0.0.1:0"};
        size_t n = 3;
        for (size_t k = 0; k < 3 && cases[i].sets[k]; k++)
            sets[n++] = cases[i].sets[k];
        wxg_conf_t *conf = wxg_conf_load(WXG_PROG_INGEST, NULL, no_env, sets, n, err, sizeof err);
        if (conf == NULL)
            fail_msg("case %zu: conf: %s", i, err);
        wxg_ingest_t *in = wxg_ingest_new(conf, NULL, err, sizeof err);
        wxg_conf_free(conf);
        if (cases[i].why == NULL) {
            assert_non_null(in); /* the last case is the working one */
            wxg_ingest_destroy(in);
            continue;
        }
        assert_null(in);
        if (strstr(err, cases[i].why) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, err, cases[i].why);
    }
}

/* Who can post callbacks is not who may read the metrics or probe readiness: by default the
 * built-in paths answer on ingest.ops.listen only and are 404 on the callback port (the
 * receiver's own "not found", like any unknown path); ingest.ops.on.callback.port brings them
 * back there for a setup with one port; an empty ingest.ops.listen serves them nowhere. */
static void operations_paths_are_404_on_the_callback_port_unless_asked_for(void **state)
{
    (void)state;
    static const char *const paths[] = {"/metrics", "/healthz", "/readyz"};
    static const int served[] = {200, 200, 503}; /* /readyz: Kafka is down here */
    char body[8192];
    fixture f;
    start(&f, NULL, 0);
    assert_true(f.ops_port > 0);
    assert_int_not_equal(f.ops_port, f.port);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(get_on(f.port, paths[i], body, sizeof body), 404);
        assert_non_null(strstr(body, "not found: callbacks go to"));
        assert_int_equal(get_on(f.ops_port, paths[i], body, sizeof body), served[i]);
    }
    assert_int_equal(get_on(f.ops_port, "/metrics", body, sizeof body), 200);
    assert_non_null(strstr(body, "wxg_ingest_stored_bytes_total"));
    assert_int_equal(get_on(f.ops_port, "/readyz", body, sizeof body), 503);
    assert_non_null(strstr(body, "not ready: kafka"));
    /* The callback port's 404s are counted with the other unknown paths. */
    char *text = render(f.reg);
    assert_non_null(
        strstr(text, "wxg_ingest_requests_total{endpoint=\"other\",status=\"404\"} 3\n"));
    free(text);
    stop(&f);

    const char *both[] = {"ingest.ops.on.callback.port=true"};
    start(&f, both, 1);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(get_on(f.port, paths[i], body, sizeof body), served[i]);
        assert_int_equal(get_on(f.ops_port, paths[i], body, sizeof body), served[i]);
    }
    assert_int_equal(get_on(f.port, "/metrics", body, sizeof body), 200);
    assert_non_null(strstr(body, "wxg_ingest_stored_bytes_total"));
    stop(&f);

    const char *none[] = {"ingest.ops.listen="};
    start(&f, none, 1);
    assert_int_equal(f.ops_port, -1);
    assert_int_equal(get_on(f.port, "/healthz", body, sizeof body), 404);
    stop(&f);
}

static void an_operations_address_that_cannot_serve_fails_start_naming_the_key(void **state)
{
    (void)state;
    char err[512] = "";
    char cb[64], same[64];
    int port = wxg_test_free_port();
    assert_true(port > 0);
    snprintf(cb, sizeof cb, "ingest.listen=127.0.0.1:%d", port);
    snprintf(same, sizeof same, "ingest.ops.listen=127.0.0.1:%d", port);
    const char *sets[][3] = {
        {"kafka.bootstrap.servers=127.0.0.1:1", "ingest.listen=127.0.0.1:0",
         "ingest.ops.listen=10.255.255.1:1"},
        {"kafka.bootstrap.servers=127.0.0.1:1", cb, same},
    };
    static const char *const why[] = {"ingest.ops.listen: cannot listen on 10.255.255.1:1",
                                      "set ingest.ops.on.callback.port = true"};
    for (size_t i = 0; i < 2; i++) {
        wxg_conf_t *conf =
            wxg_conf_load(WXG_PROG_INGEST, NULL, no_env, sets[i], 3, err, sizeof err);
        assert_non_null(conf);
        assert_null(wxg_ingest_new(conf, NULL, err, sizeof err));
        if (strstr(err, why[i]) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, err, why[i]);
        wxg_conf_free(conf);
    }
}

static void a_bad_listen_address_fails_start_with_a_reason(void **state)
{
    (void)state;
    char err[512] = "";
    const char *sets[] = {"kafka.bootstrap.servers=127.0.0.1:1", "ingest.listen=10.255.255.1:1",
                          "ingest.hmac.secret=s3cret"};
    wxg_conf_t *conf = wxg_conf_load(WXG_PROG_INGEST, NULL, no_env, sets, 3, err, sizeof err);
    assert_non_null(conf);
    assert_null(wxg_ingest_new(conf, NULL, err, sizeof err));
    assert_non_null(strstr(err, "cannot listen on 10.255.255.1:1"));
    wxg_conf_free(conf);
    wxg_ingest_destroy(NULL);
}

/* The reference samples' folder (tests/fixtures/samples of the source tree). */
static const char *samples_dir(void)
{
    const char *src = getenv("WXG_SOURCE_DIR");
    static char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/samples", src ? src : ".");
    return path;
}

static char *read_sample(const char *name, size_t *len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", samples_dir(), name);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    char *buf = malloc(1 << 20);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

/* The differential check: whatever ingest accepts on an endpoint, the consumer decodes from the
 * record ingest writes (its headers) to the same format, accounts and keys, whether its
 * consumer.format is auto or pinned to the stated format. Over every reference sample, on every
 * endpoint, with and without the account in the path. */
static void what_ingest_accepts_the_consumer_decodes_alike(void **state)
{
    (void)state;
    DIR *dir = opendir(samples_dir());
    assert_non_null(dir);
    size_t files = 0, accepted = 0, unaccepted_files = 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        size_t nl = strlen(de->d_name);
        if (nl < 5 ||
            (strcmp(de->d_name + nl - 5, ".json") != 0 && strcmp(de->d_name + nl - 4, ".xml") != 0))
            continue;
        files++;
        size_t len = 0;
        char *body = read_sample(de->d_name, &len);
        size_t took = 0;
        for (int ep = WXG_INGEST_EP_WKTEAM; ep <= WXG_INGEST_EP_AUTO; ep++) {
            for (int with_path = 0; with_path <= 1; with_path++) {
                wxg_ingest_accept_opts_t o = {0};
                wxg_batch_t *b = NULL;
                char account[256] = "";
                if (with_path) {
                    /* The path names the account the endpoint reads, when it reads one. */
                    if (wxg_ingest_accept((wxg_ingest_endpoint_t)ep, body, len, NULL, &b, NULL,
                                          NULL, 0) != 0 ||
                        wxg_batch_count(b) == 0) {
                        wxg_batch_free(b);
                        continue;
                    }
                    snprintf(account, sizeof account, "%s", wxg_batch_msg(b, 0)->account);
                    wxg_batch_free(b);
                    b = NULL;
                    if (account[0] == '\0')
                        continue;
                    o.path_account = account;
                }
                if (wxg_ingest_accept((wxg_ingest_endpoint_t)ep, body, len, &o, &b, NULL, NULL,
                                      0) != 0)
                    continue;
                took++;
                accepted++;
                size_t n = wxg_batch_count(b);
                const char *fn = n > 0 ? wxg_format_name(wxg_batch_msg(b, 0)->format) : "generic";
                const char *acct = n > 0 ? wxg_batch_msg(b, 0)->account : "";
                for (int pin = 0; pin <= 1 && n > 0; pin++) {
                    wxg_decode_opts_t d = {.format = WXG_FORMAT_AUTO};
                    if (pin)
                        assert_int_equal(wxg_format_parse(fn, &d.format), 0);
                    wxg_batch_t *c = NULL;
                    char err[256];
                    int rc = wxg_ingest_record_decode(body, len, fn, strlen(fn), acct, strlen(acct),
                                                      &d, &c, err, sizeof err);
                    if (rc != 0)
                        fail_msg("%s on endpoint %d: the consumer refuses it: %s", de->d_name, ep,
                                 err);
                    assert_int_equal(wxg_batch_count(c), n);
                    for (size_t i = 0; i < n; i++) {
                        const wxg_msg_view_t *x = wxg_batch_msg(b, i), *y = wxg_batch_msg(c, i);
                        assert_int_equal(x->format, y->format);
                        assert_string_equal(x->account, y->account);
                        assert_string_equal(x->key, y->key);
                    }
                    wxg_batch_free(c);
                }
                wxg_batch_free(b);
            }
        }
        if (took == 0)
            unaccepted_files++;
        free(body);
    }
    closedir(dir);
    /* Not vacuous: most samples are accepted somewhere (the E* ones are the decoder's refusals). */
    assert_true(files >= 30);
    assert_true(accepted >= files);
    assert_true(unaccepted_files * 3 < files);
}

/* Starts ingest with `sets` (no Kafka reachable); returns the receiver or NULL with err set. */
static wxg_ingest_t *try_start(const char *const *sets, size_t n, char *err, size_t err_size)
{
    wxg_conf_t *conf = wxg_conf_load(WXG_PROG_INGEST, NULL, no_env, sets, n, err, err_size);
    if (conf == NULL)
        fail_msg("conf: %s", err);
    wxg_ingest_t *in = wxg_ingest_new(conf, NULL, err, err_size);
    wxg_conf_free(conf);
    return in;
}

/* Off loopback, an unsigned gateway endpoint is refused at start-up, before anything is bound,
 * unless the operator says so explicitly; then the start gets as far as binding the address. */
static void a_non_loopback_listen_needs_a_gateway_secret(void **state)
{
    (void)state;
    char err[512] = "";
    const char *sets[] = {"kafka.bootstrap.servers=127.0.0.1:1", "ingest.listen=10.255.255.1:1",
                          NULL};
    assert_null(try_start(sets, 2, err, sizeof err));
    assert_non_null(strstr(err, "not a loopback address and no gateway secret is set"));
    assert_non_null(strstr(err, "ingest.hmac.required"));
    sets[2] = "ingest.hmac.required=false";
    assert_null(try_start(sets, 3, err, sizeof err));
    assert_non_null(strstr(err, "cannot listen on 10.255.255.1:1"));
    sets[2] = "ingest.hmac.gateways=acctA=s3cret";
    assert_null(try_start(sets, 3, err, sizeof err));
    assert_non_null(strstr(err, "cannot listen on 10.255.255.1:1"));
    /* Malformed bindings stop the start naming the entry, never the secret. */
    static const char *const bad[] = {
        "ingest.hmac.gateways=acctA", "ingest.hmac.gateways==s",
        "ingest.hmac.gateways=acctA=", "ingest.hmac.gateways=a/b=topsecret"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sets[2] = bad[i];
        assert_null(try_start(sets, 3, err, sizeof err));
        assert_non_null(strstr(err, "ingest.hmac.gateways: entry 1"));
        assert_null(strstr(err, "topsecret"));
    }
    const char *prev[] = {"kafka.bootstrap.servers=127.0.0.1:1", "ingest.listen=127.0.0.1:0",
                          "ingest.hmac.secret.previous=old"};
    assert_null(try_start(prev, 3, err, sizeof err));
    assert_non_null(strstr(err, "ingest.hmac.secret is empty"));
}

/* A gateway request for `target` with `body`, signed by `secret` now. Returns the status. */
static int post_signed(fixture *f, const char *secret, const char *target, const char *body,
                       char *out, size_t out_size)
{
    char hv[72], hdr[256], ts[24];
    snprintf(ts, sizeof ts, "%lld", (long long)time(NULL));
    assert_int_equal(wxg_ingest_hmac_sign_ts(secret, ts, body, strlen(body), hv), 0);
    snprintf(hdr, sizeof hdr, "X-Wxg-Signature: %s\r\nX-Wxg-Timestamp: %s\r\n", hv, ts);
    return req(f, "POST", target, hdr, body, strlen(body), out, out_size, NULL, 0);
}

/* The previous secret is taken beside the current one; a secret bound to accounts is taken for
 * those accounts only (403), in the body and in the path. 503 means every check passed (Kafka is
 * down here). */
static void gateway_secrets_rotate_and_bind_to_accounts(void **state)
{
    (void)state;
    fixture f;
    char body[1024];
    const char *extra[] = {"ingest.hmac.secret=current", "ingest.hmac.secret.previous=previous",
                           "ingest.hmac.gateways=wxid_fakebot000001|wxid_other=gwA, other=gwB"};
    start(&f, extra, 3);
    assert_int_equal(post_signed(&f, "current", "/v1/callback/generic", generic_json, NULL, 0),
                     503);
    assert_int_equal(post_signed(&f, "previous", "/v1/callback/generic", generic_json, NULL, 0),
                     503);
    assert_int_equal(post_signed(&f, "gwA", "/v1/callback/generic", generic_json, NULL, 0), 503);
    assert_int_equal(
        post_signed(&f, "gwA", "/v1/callback/generic/wxid_fakebot000001", generic_json, NULL, 0),
        503);
    assert_int_equal(
        post_signed(&f, "gwB", "/v1/callback/generic", generic_json, body, sizeof body), 403);
    assert_non_null(strstr(body, "not bound to this callback's account"));
    assert_int_equal(post_signed(&f, "gwB", "/v1/callback/generic/other", generic_json, NULL, 0),
                     400);
    assert_int_equal(post_signed(&f, "nope", "/v1/callback/generic", generic_json, NULL, 0), 401);
    char *m = render(f.reg);
    assert_non_null(strstr(m, "wxg_ingest_body_refused_total{endpoint=\"generic\",reason="
                              "\"account_not_allowed\"} 1\n"));
    assert_non_null(strstr(m, "wxg_ingest_body_refused_total{endpoint=\"generic\",reason="
                              "\"account_mismatch\"} 1\n"));
    free(m);
    stop(&f);
}

/* With a key, a plaintext push is refused however the query spells (or omits) encrypt_type:
 * the URL signature covers no byte of a plaintext body. An operator's opt-in lets it through. */
static void safe_mode_cannot_be_downgraded_to_plaintext(void **state)
{
    (void)state;
    static const char *const variants[] = {
        "", "&encrypt_type=raw", "&encrypt_type=", "&encrypt_type=aes2", "&encrypt_type=%20aes"};
    const char *extra[] = {"ingest.oa.token=AAAAA", "ingest.oa.aes.key=" EAK,
                           "ingest.oa.appid=wx_FAKEAPPID_0001", "ingest.signature.tolerance.ms=0",
                           "ingest.oa.plaintext.accept=true"};
    for (int accept = 0; accept <= 1; accept++) {
        fixture f;
        char sig[41], target[256], body[1024];
        start(&f, extra, accept ? 5 : 4);
        assert_int_equal(wxg_ingest_oa_signature("AAAAA", "1732330200", "9", sig), 0);
        for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
            snprintf(target, sizeof target,
                     "/v1/callback/oa?signature=%s&timestamp=1732330200&nonce=9%s", sig,
                     variants[i]);
            int st = req(&f, "POST", target, NULL, o1_xml, sizeof o1_xml - 1, body, sizeof body,
                         NULL, 0);
            if (st != (accept ? 503 : 401))
                fail_msg("accept=%d variant '%s': %d %s", accept, variants[i], st, body);
        }
        /* Any case of "aes" takes the encrypted path: a plaintext body has no Encrypt (400). */
        snprintf(target, sizeof target,
                 "/v1/callback/oa?signature=%s&timestamp=1732330200&nonce=9&encrypt_type=AeS", sig);
        assert_int_equal(
            req(&f, "POST", target, NULL, o1_xml, sizeof o1_xml - 1, body, sizeof body, NULL, 0),
            400);
        assert_non_null(strstr(body, "Encrypt"));
        if (!accept) {
            char *m = render(f.reg);
            assert_non_null(strstr(m, "wxg_ingest_auth_refused_total{endpoint=\"oa\",reason="
                                      "\"plaintext_refused\"} 5\n"));
            free(m);
        }
        stop(&f);
    }
}

/* The accept decision and the consumer's decode of what it accepted, as pure functions. */
static void accept_refuses_what_detection_reads_otherwise(void **state)
{
    (void)state;
    static const struct {
        wxg_ingest_endpoint_t ep;
        const char *path_account;
        const char *body;
        const char *why; /* NULL: accepted */
    } cases[] = {
        /* The forgery: generic on the path, an OA push to detection. */
        {WXG_INGEST_EP_GENERIC, "acctA",
         "{\"account\":\"acctA\",\"msg_id\":\"123\",\"ToUserName\":\"gh_victim\","
         "\"FromUserName\":\"o_user\",\"MsgType\":\"text\",\"Content\":\"pay 100\","
         "\"MsgId\":\"7301234567890123457\"}",
         "format_mismatch"},
        {WXG_INGEST_EP_GENERIC, NULL, generic_json, NULL},
        {WXG_INGEST_EP_GENERIC, "someone_else", generic_json, "account_mismatch"},
        /* A wkteam body with gewe fields. */
        {WXG_INGEST_EP_WKTEAM, NULL,
         "{\"wcId\":\"wxid_a\",\"messageType\":\"60001\",\"TypeName\":\"AddMsg\","
         "\"data\":{\"newMsgId\":1,\"fromUser\":\"wxid_b\",\"content\":\"x\"}}",
         "format_mismatch"},
        /* A probe is a probe whichever gateway reads it; with OA fields it is an OA push. */
        {WXG_INGEST_EP_WKTEAM, NULL, "{\"testMsg\":\"x\",\"token\":\"t\"}", NULL},
        {WXG_INGEST_EP_GEWE, NULL, "{\"testMsg\":\"x\",\"ToUserName\":\"gh_victim\"}",
         "format_mismatch"},
        {WXG_INGEST_EP_AUTO, NULL,
         "{\"ToUserName\":\"gh_victim\",\"FromUserName\":\"o\",\"MsgType\":\"text\","
         "\"Content\":\"x\",\"MsgId\":\"1\",\"CreateTime\":1}",
         "oa_elsewhere"},
        /* An OA JSON push carrying gewe's discriminator. */
        {WXG_INGEST_EP_OA, NULL,
         "{\"ToUserName\":\"gh_victim\",\"FromUserName\":\"o\",\"MsgType\":\"text\","
         "\"Content\":\"x\",\"MsgId\":\"1\",\"CreateTime\":1,\"TypeName\":\"AddMsg\"}",
         "format_mismatch"},
        {WXG_INGEST_EP_OA, "gh_fake00000001", o1_xml, NULL},
        {WXG_INGEST_EP_OA, "gh_other", o1_xml, "account_mismatch"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wxg_ingest_accept_opts_t o = {.path_account = cases[i].path_account};
        wxg_batch_t *b = NULL;
        const char *why = NULL;
        char reason[512];
        int rc = wxg_ingest_accept(cases[i].ep, cases[i].body, strlen(cases[i].body), &o, &b, &why,
                                   reason, sizeof reason);
        if (cases[i].why == NULL) {
            if (rc != 0)
                fail_msg("case %zu refused: %s: %s", i, why, reason);
            /* What the consumer makes of the record ingest writes: the same messages. */
            const wxg_msg_view_t *m = wxg_batch_msg(b, 0);
            const char *fn = wxg_format_name(m->format);
            wxg_batch_t *c = NULL;
            wxg_decode_opts_t auto_opts = {.format = WXG_FORMAT_AUTO};
            assert_int_equal(wxg_ingest_record_decode(cases[i].body, strlen(cases[i].body), fn,
                                                      strlen(fn), m->account, strlen(m->account),
                                                      &auto_opts, &c, reason, sizeof reason),
                             0);
            assert_int_equal(wxg_batch_count(c), wxg_batch_count(b));
            assert_int_equal(wxg_batch_msg(c, 0)->format, m->format);
            assert_string_equal(wxg_batch_msg(c, 0)->key, m->key);
            wxg_batch_free(c);
            wxg_batch_free(b);
        } else {
            assert_null(b);
            if (rc == 0 || why == NULL || strcmp(why, cases[i].why) != 0)
                fail_msg("case %zu: rc %d why %s, want %s", i, rc, why ? why : "-", cases[i].why);
            assert_true(reason[0] != '\0');
        }
    }
    /* A sync batch: every message of it is the path's account's, or the batch is refused. */
    size_t blen = 0;
    char *batch = read_sample("sync_batch.json", &blen);
    wxg_ingest_accept_opts_t o = {.path_account = "wxid_other"};
    wxg_batch_t *b = NULL;
    const char *why = NULL;
    assert_int_equal(wxg_ingest_accept(WXG_INGEST_EP_GEWE, batch, blen, &o, &b, &why, NULL, 0),
                     WXG_ENOACCOUNT);
    assert_string_equal(why, "account_mismatch");
    o.path_account = "wxid_fakebot000001";
    assert_int_equal(wxg_ingest_accept(WXG_INGEST_EP_GEWE, batch, blen, &o, &b, &why, NULL, 0), 0);
    assert_int_equal(wxg_batch_count(b), 2);
    wxg_batch_free(b);
    free(batch);
}

/* A record that states its decision is decoded so, or dead-letters with a reason. */
static void record_decode_honours_the_stated_decision(void **state)
{
    (void)state;
    static const char forged[] =
        "{\"account\":\"acctA\",\"msg_id\":\"123\",\"ToUserName\":\"gh_victim\","
        "\"FromUserName\":\"o_user\",\"MsgType\":\"text\",\"Content\":\"pay 100\","
        "\"MsgId\":\"7301234567890123457\"}";
    char err[256];
    wxg_batch_t *b = NULL;
    wxg_decode_opts_t any = {.format = WXG_FORMAT_AUTO};
    /* Stated generic: generic, whatever detection would say. */
    assert_int_equal(wxg_ingest_record_decode(forged, sizeof forged - 1, "generic", 7, "acctA", 5,
                                              &any, &b, err, sizeof err),
                     0);
    assert_int_equal(wxg_batch_msg(b, 0)->format, WXG_FORMAT_GENERIC);
    assert_string_equal(wxg_batch_msg(b, 0)->account, "acctA");
    wxg_batch_free(b);
    /* No header: detection, as for any other producer's record. */
    assert_int_equal(
        wxg_ingest_record_decode(forged, sizeof forged - 1, NULL, 0, NULL, 0, &any, &b, err, 256),
        0);
    assert_int_equal(wxg_batch_msg(b, 0)->format, WXG_FORMAT_OA_JSON);
    wxg_batch_free(b);
    /* A decision that does not hold: a parked record, with the reason. */
    wxg_decode_opts_t pinned = {.format = WXG_FORMAT_WKTEAM};
    assert_int_equal(wxg_ingest_record_decode(forged, sizeof forged - 1, "generic", 7, "acctA", 5,
                                              &pinned, &b, err, sizeof err),
                     WXG_EFORMAT);
    assert_null(b);
    assert_non_null(strstr(err, "consumer.format is wkteam"));
    assert_int_equal(wxg_ingest_record_decode(forged, sizeof forged - 1, "generic", 7, "acctB", 5,
                                              &any, &b, err, sizeof err),
                     WXG_EFORMAT);
    assert_non_null(strstr(err, "wxg-account"));
    assert_int_equal(wxg_ingest_record_decode(forged, sizeof forged - 1, "auto", 4, "acctA", 5,
                                              &any, &b, err, sizeof err),
                     WXG_EFORMAT);
    assert_int_equal(wxg_ingest_record_decode(forged, sizeof forged - 1, "oa-xml", 6, "acctA", 5,
                                              &any, &b, err, sizeof err),
                     WXG_EPARSE);
    assert_non_null(strstr(err, "as its wxg-format header states (oa-xml)"));
    assert_int_equal(wxg_ingest_record_decode(forged, sizeof forged - 1, "generic-and-more", 16,
                                              "acctA", 5, &any, &b, err, sizeof err),
                     WXG_EFORMAT);
    assert_null(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(oa_signature_matches_the_documented_vectors),
        cmocka_unit_test(gateway_hmac_matches_rfc4231_and_refuses_anything_else),
        cmocka_unit_test(unknown_paths_and_methods_get_404_and_405),
        cmocka_unit_test(oa_signature_is_checked_and_the_url_verification_echoes),
        cmocka_unit_test(undecodable_and_oversized_bodies_get_400_and_413_with_a_reason),
        cmocka_unit_test(kafka_down_gives_503_with_retry_after_and_not_ready),
        cmocka_unit_test(the_gateway_hmac_is_required_when_a_secret_is_set),
        cmocka_unit_test(signed_requests_outside_the_replay_window_are_refused_and_counted),
        cmocka_unit_test(the_timestamp_check_takes_plain_seconds_within_the_tolerance),
        cmocka_unit_test(encrypted_pushes_that_fail_a_check_are_refused_before_kafka),
        cmocka_unit_test(unusable_safe_mode_settings_fail_start_with_a_reason),
        cmocka_unit_test(operations_paths_are_404_on_the_callback_port_unless_asked_for),
        cmocka_unit_test(an_operations_address_that_cannot_serve_fails_start_naming_the_key),
        cmocka_unit_test(a_bad_listen_address_fails_start_with_a_reason),
        cmocka_unit_test(a_non_loopback_listen_needs_a_gateway_secret),
        cmocka_unit_test(gateway_secrets_rotate_and_bind_to_accounts),
        cmocka_unit_test(safe_mode_cannot_be_downgraded_to_plaintext),
        cmocka_unit_test(accept_refuses_what_detection_reads_otherwise),
        cmocka_unit_test(record_decode_honours_the_stated_decision),
        cmocka_unit_test(what_ingest_accepts_the_consumer_decodes_alike),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
