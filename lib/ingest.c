/*
 * DESIGN: the webhook receiver (wxguard-ingest's engine).
 *
 * Purpose: take a gateway's callback over HTTP and make it durable in Kafka before saying so.
 * The HTTP side is lib/httpd.c (libmicrohttpd): it reads the body under the size cap and keeps
 * the number of requests in progress under ingest.concurrency, then calls handle() with the whole
 * request. handle() authenticates (Official Account signature or gateway HMAC), decodes the body
 * with wxg_decode() only to learn the account and conversation (the key) and to refuse what the
 * consumer could never use, then produces the ORIGINAL bytes and waits for the delivery report.
 * Decoding at the edge is cheap (the decoder is pure) and turns a malformed callback into a 400
 * the gateway can see, instead of a dead-letter record nobody reads.
 *
 * Answering only after the delivery report is what lets a gateway treat 200 as "stored": a 503
 * (budget exceeded, broker down, record refused) makes it retry. A record whose report came after
 * the budget may still land, so a retry can store a message twice; both copies share the key and
 * so the partition, and the consumer's idempotency guard lets one of them take effect.
 *
 * Threads: every request runs on its connection's thread (httpd's thread-per-connection mode),
 * up to ingest.concurrency at once. This module's state after start-up is read-only except the
 * metrics (atomics), the request-id counter (an atomic) and the lazily registered per-status
 * counters (atomic pointers; registering twice returns the same series, so a race is harmless).
 * The producer is shared and thread-safe; its own thread serves delivery reports.
 *
 * Failure modes: Kafka down or slow -> 503 within the budget, /readyz not ready; an allocation
 * failure -> 500; configuration refused by librdkafka -> wxg_ingest_new fails naming it. No log
 * line at info or above carries message content or personal ids (accounts are hashed by the log
 * module unless the operator asks for them).
 */
#include "wxguard/ingest.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <librdkafka/rdkafka.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>

#include "clock_int.h"
#include "err_int.h"
#include "key_int.h"
#include "oacrypt_int.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"
#include "wxguard/httpd.h"
#include "wxguard/log.h"
#include "wxguard/msg.h"

#define SIG_PART_MAX   256 /* bytes of token, timestamp or nonce */
#define ACCOUNT_MAX    128 /* bytes of the {account} path segment */
#define REQUEST_ID_MAX 64
#define ECHOSTR_MAX    512

/* Endpoints, also the label values of the request counter. */
enum endpoint {
    EP_WKTEAM = WXG_INGEST_EP_WKTEAM,
    EP_GEWE = WXG_INGEST_EP_GEWE,
    EP_OA = WXG_INGEST_EP_OA,
    EP_GENERIC = WXG_INGEST_EP_GENERIC,
    EP_AUTO = WXG_INGEST_EP_AUTO,
    EP_OTHER,
    EP_COUNT
};
static const char *const ep_names[EP_COUNT] = {"wkteam", "gewe", "oa", "generic", "auto", "other"};

/* Why a request was refused 401, also the label values of the refusal counter. */
static const char *const refusal_names[] = {"bad_signature",    "bad_hmac", "missing_timestamp",
                                            "bad_timestamp",    "expired",  "future",
                                            "plaintext_refused"};
#define NREFUSAL (sizeof refusal_names / sizeof refusal_names[0])

/* Why a body was refused (400, or 403 for account_not_allowed): the `why` names of
 * wxg_ingest_accept(), also the label values of the body refusal counter. */
static const char *const body_refusal_names[] = {"undecodable",    "format_mismatch",
                                                 "oa_elsewhere",   "account_mismatch",
                                                 "mixed_accounts", "account_not_allowed"};
#define NBODYREFUSAL (sizeof body_refusal_names / sizeof body_refusal_names[0])

/* Statuses counted per endpoint. */
static const unsigned statuses[] = {200, 400, 401, 403, 404, 405, 413, 500, 503};
#define NSTATUS (sizeof statuses / sizeof statuses[0])

/* One gateway secret and the accounts it may post for (none: any account). */
typedef struct hmac_secret {
    char *secret;
    char **accounts;
    size_t naccounts;
    int previous; /* ingest.hmac.secret.previous: logged when it is the one that verified */
} hmac_secret;

struct wxg_ingest_s {
    wxg_httpd_t *httpd; /* the callback port (ingest.listen) */
    wxg_httpd_t *ops;   /* /metrics, /healthz, /readyz (ingest.ops.listen); NULL: off */
    wxg_producer_t *producer;
    wxg_metrics_t *metrics;
    char *topic;
    char *oa_token;          /* NULL: the oa endpoint is off */
    hmac_secret *secrets;    /* the gateway secrets, in the order they are tried */
    size_t nsecrets;         /* 0: no gateway HMAC */
    int oa_plaintext_accept; /* plaintext pushes beside a key (a migration's opt-in) */
    int64_t tolerance_ms;    /* replay window of signed timestamps, 0: off */
    /* Safe mode: the EncodingAESKey (and the one before it, during a rotation) as AES keys, and
     * the AppId the plaintext must end with. has_key 0: encrypted pushes are refused. */
    unsigned char oa_key[WXG__OA_AES_KEY_BYTES], oa_key_prev[WXG__OA_AES_KEY_BYTES];
    int has_key, has_key_prev;
    char *oa_appid;
    size_t max_body;
    int budget_ms;
    uint64_t rid_base; /* random, so request ids of two processes differ */
    atomic_uint_fast64_t rid_next;
    _Atomic(wxg_metric_t *) requests[EP_COUNT][NSTATUS];
    _Atomic(wxg_metric_t *) refusals[EP_COUNT][NREFUSAL];
    _Atomic(wxg_metric_t *) body_refusals[EP_COUNT][NBODYREFUSAL];
    wxg_metric_t *produce_seconds;
    wxg_metric_t *bytes;
};

/* ---- signatures ---------------------------------------------------------------------------- */

int wxg_ingest_oa_signature(const char *token, const char *timestamp, const char *nonce,
                            char out[41])
{
    const char *parts[3] = {token, timestamp, nonce};
    size_t lens[3];
    if (out == NULL)
        return WXG_EINVAL;
    for (int i = 0; i < 3; i++) {
        if (parts[i] == NULL || (lens[i] = strlen(parts[i])) > SIG_PART_MAX)
            return WXG_EINVAL;
    }
    return wxg__sha1_sorted(parts, lens, 3, out);
}

int wxg_ingest_oa_verify(const char *token, const char *timestamp, const char *nonce,
                         const char *signature)
{
    char want[41];
    if (signature == NULL || token == NULL || token[0] == '\0' || timestamp == NULL ||
        timestamp[0] == '\0' || nonce == NULL || nonce[0] == '\0')
        return WXG_EAUTH;
    if (wxg_ingest_oa_signature(token, timestamp, nonce, want) != 0)
        return WXG_EAUTH;
    return wxg__hex_equal(want, signature, 40) ? 0 : WXG_EAUTH;
}

/* HMAC-SHA256 under `secret` of "<timestamp>." and the body (of the body alone when timestamp
 * is NULL), as "sha256=<hex>". */
int wxg_ingest_hmac_sign_ts(const char *secret, const char *timestamp, const void *body, size_t len,
                            char out[72])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    static const unsigned char nothing[1];
    if (secret == NULL || out == NULL || (body == NULL && len > 0) ||
        (timestamp != NULL && strlen(timestamp) > SIG_PART_MAX))
        return WXG_EINVAL;
    /* EVP_MAC rather than HMAC_CTX, which OpenSSL 3 deprecates: the timestamp and the body are
     * fed in turn, so the body is never copied to prefix it. */
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *h = mac != NULL ? EVP_MAC_CTX_new(mac) : NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    size_t mdlen = 0;
    int ok =
        h != NULL && EVP_MAC_init(h, (const unsigned char *)secret, strlen(secret), params) == 1;
    if (ok && timestamp != NULL)
        ok = EVP_MAC_update(h, (const unsigned char *)timestamp, strlen(timestamp)) == 1 &&
             EVP_MAC_update(h, (const unsigned char *)".", 1) == 1;
    ok = ok && EVP_MAC_update(h, body != NULL ? body : nothing, len) == 1 &&
         EVP_MAC_final(h, md, &mdlen, sizeof md) == 1 && mdlen == 32;
    EVP_MAC_CTX_free(h);
    EVP_MAC_free(mac);
    if (!ok)
        return WXG_ENOMEM;
    memcpy(out, "sha256=", 7);
    wxg__to_hex(md, 32, out + 7);
    return 0;
}

int wxg_ingest_hmac_sign(const char *secret, const void *body, size_t len, char out[72])
{
    return wxg_ingest_hmac_sign_ts(secret, NULL, body, len, out);
}

int wxg_ingest_hmac_verify_ts(const char *secret, const char *timestamp, const void *body,
                              size_t len, const char *header)
{
    char want[72];
    if (header == NULL || strncasecmp(header, "sha256=", 7) != 0)
        return WXG_EAUTH;
    if (wxg_ingest_hmac_sign_ts(secret, timestamp, body, len, want) != 0)
        return WXG_EAUTH;
    return wxg__hex_equal(want + 7, header + 7, 64) ? 0 : WXG_EAUTH;
}

int wxg_ingest_hmac_verify(const char *secret, const void *body, size_t len, const char *header)
{
    return wxg_ingest_hmac_verify_ts(secret, NULL, body, len, header);
}

int wxg_ingest_timestamp_check(const char *timestamp, int64_t tolerance_ms, int64_t now_ms,
                               const char **why)
{
    const char *dummy;
    if (why == NULL)
        why = &dummy;
    *why = NULL;
    if (tolerance_ms <= 0)
        return 0;
    if (timestamp == NULL || timestamp[0] == '\0') {
        *why = "missing_timestamp";
        return WXG_EAUTH;
    }
    /* Plain decimal seconds, nothing else: a sign, spaces or a fraction would be a second way to
     * write one signed value. Twelve digits reach the year 33658. */
    int64_t secs = 0;
    size_t n = 0;
    for (; timestamp[n] != '\0'; n++) {
        if (n >= 12 || timestamp[n] < '0' || timestamp[n] > '9') {
            *why = "bad_timestamp";
            return WXG_EAUTH;
        }
        secs = secs * 10 + (timestamp[n] - '0');
    }
    int64_t age_ms = now_ms - secs * 1000;
    if (age_ms > tolerance_ms) {
        *why = "expired";
        return WXG_EAUTH;
    }
    if (-age_ms > tolerance_ms) {
        *why = "future";
        return WXG_EAUTH;
    }
    return 0;
}

/* ---- metrics ------------------------------------------------------------------------------- */

static void count(wxg_ingest_t *in, enum endpoint ep, unsigned status)
{
    size_t si = NSTATUS;
    for (size_t i = 0; i < NSTATUS; i++) {
        if (statuses[i] == status)
            si = i;
    }
    if (in->metrics == NULL || si == NSTATUS)
        return;
    wxg_metric_t *m = atomic_load(&in->requests[ep][si]);
    if (m == NULL) {
        char st[8];
        snprintf(st, sizeof st, "%u", status);
        m = wxg_metrics_counter(in->metrics, "wxg_ingest_requests_total",
                                "Callback requests answered, by endpoint and HTTP status.",
                                "endpoint", ep_names[ep], "status", st, NULL);
        atomic_store(&in->requests[ep][si], m);
    }
    wxg_counter_inc(m);
}

/* Counts a 401 by its reason (one of refusal_names). */
static void count_refusal(wxg_ingest_t *in, enum endpoint ep, const char *why)
{
    size_t ri = 0;
    while (ri < NREFUSAL && strcmp(refusal_names[ri], why) != 0)
        ri++;
    if (in->metrics == NULL || ri == NREFUSAL)
        return;
    wxg_metric_t *m = atomic_load(&in->refusals[ep][ri]);
    if (m == NULL) {
        m = wxg_metrics_counter(in->metrics, "wxg_ingest_auth_refused_total",
                                "Callback requests refused with 401, by endpoint and reason.",
                                "endpoint", ep_names[ep], "reason", refusal_names[ri], NULL);
        atomic_store(&in->refusals[ep][ri], m);
    }
    wxg_counter_inc(m);
}

/* Counts a body refused by wxg_ingest_accept() by its reason (one of body_refusal_names). */
static void count_body_refusal(wxg_ingest_t *in, enum endpoint ep, const char *why)
{
    size_t ri = 0;
    while (ri < NBODYREFUSAL && strcmp(body_refusal_names[ri], why) != 0)
        ri++;
    if (in->metrics == NULL || ri == NBODYREFUSAL)
        return;
    wxg_metric_t *m = atomic_load(&in->body_refusals[ep][ri]);
    if (m == NULL) {
        m = wxg_metrics_counter(in->metrics, "wxg_ingest_body_refused_total",
                                "Callback bodies refused (400, or 403 for an account the signing "
                                "secret is not bound to), by endpoint and reason.",
                                "endpoint", ep_names[ep], "reason", body_refusal_names[ri], NULL);
        atomic_store(&in->body_refusals[ep][ri], m);
    }
    wxg_counter_inc(m);
}

static void collect(void *opaque, wxg_metrics_t *reg)
{
    wxg_ingest_t *in = opaque;
    wxg_gauge_set(wxg_metrics_gauge(reg, "wxg_ingest_kafka_brokers_up",
                                    "Kafka brokers the producer is connected to (-1: unknown yet).",
                                    NULL),
                  wxg_producer_brokers_up(in->producer));
}

/* ---- requests ------------------------------------------------------------------------------ */

/* One request's facts, for the answer and the log line. */
typedef struct reqinfo {
    enum endpoint ep;
    char request_id[REQUEST_ID_MAX + 1];
    const char *outcome; /* a short word for the log */
} reqinfo;

static int sane_id(const char *s, size_t max)
{
    size_t n = 0;
    for (; s[n] != '\0'; n++) {
        unsigned char c = (unsigned char)s[n];
        if (n >= max || !(isalnum(c) || c == '-' || c == '_' || c == '.' || c == '@'))
            return 0;
    }
    return n > 0;
}

/* Sets the answer to exactly `len` bytes of text; every answer carries the request id. */
static void answer_raw(wxg_ingest_t *in, reqinfo *ri, wxg_httpd_resp_t *resp, unsigned status,
                       const char *text, size_t len)
{
    if (wxg_httpd_resp_set(resp, status, "text/plain; charset=utf-8", text, len) != 0)
        status = resp->status = 500;
    wxg_httpd_resp_header(resp, "X-Request-Id", ri->request_id);
    if (status == 503)
        wxg_httpd_resp_header(resp, "Retry-After", "1");
    count(in, ri->ep, status);
}

/* Sets a text answer "<text>\n" (cut at 1 KiB). */
static void answer(wxg_ingest_t *in, reqinfo *ri, wxg_httpd_resp_t *resp, unsigned status,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void answer(wxg_ingest_t *in, reqinfo *ri, wxg_httpd_resp_t *resp, unsigned status,
                   const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof text - 2)
        n = (int)sizeof text - 2;
    text[n++] = '\n';
    answer_raw(in, ri, resp, status, text, (size_t)n);
}

/* The success answer: exactly "success" for the Official Account (its servers compare the body),
 * "ok" otherwise. */
static void answer_ok(wxg_ingest_t *in, reqinfo *ri, wxg_httpd_resp_t *resp)
{
    const char *t = ri->ep == EP_OA ? "success" : "ok";
    answer_raw(in, ri, resp, 200, t, strlen(t));
}

/* Splits "{format}[/{account}]" after the prefix. Returns 0, or -1 for an unknown shape. */
static int parse_route(const char *rest, enum endpoint *ep, char *account, size_t account_size)
{
    char name[32];
    const char *slash = strchr(rest, '/');
    size_t nl = slash != NULL ? (size_t)(slash - rest) : strlen(rest);
    if (nl == 0 || nl >= sizeof name)
        return -1;
    memcpy(name, rest, nl);
    name[nl] = '\0';
    account[0] = '\0';
    if (slash != NULL) {
        const char *a = slash + 1;
        if (strlen(a) >= account_size || !sane_id(a, ACCOUNT_MAX))
            return -1;
        snprintf(account, account_size, "%s", a);
    }
    for (int i = 0; i < EP_OTHER; i++) {
        if (strcmp(name, ep_names[i]) == 0) {
            *ep = (enum endpoint)i;
            return 0;
        }
    }
    return -1;
}

/* Decides, produces, and answers. */
static void ingest_body(wxg_ingest_t *in, reqinfo *ri, const wxg_ingest_accept_opts_t *ao,
                        const char *body, size_t len, int64_t t0, wxg_httpd_resp_t *resp)
{
    wxg_batch_t *batch = NULL;
    char reason[512] = "";
    char *key = NULL;
    const char *why = NULL;
    int rc = wxg_ingest_accept((wxg_ingest_endpoint_t)ri->ep, body, len, ao, &batch, &why, reason,
                               sizeof reason);
    if (rc == WXG_ENOMEM) {
        ri->outcome = "nomem";
        answer(in, ri, resp, 500, "out of memory");
        goto out;
    }
    if (rc != 0) {
        ri->outcome = why;
        count_body_refusal(in, ri->ep, why);
        if (strcmp(why, "undecodable") != 0)
            wxg_log(WXG_LOG_WARN, "callback_refused", WXG_LS("request_id", ri->request_id),
                    WXG_LS("endpoint", ep_names[ri->ep]), WXG_LS("reason", why),
                    WXG_LS("detail", reason));
        answer(in, ri, resp, rc == WXG_EAUTH ? 403 : 400, "%s: %s: %s", wxg_err_name(rc),
               wxg_strerror(rc), reason);
        goto out;
    }
    size_t n = wxg_batch_count(batch);
    if (n == 0) {
        /* A batched callback with no messages: nothing to store, and nothing to retry. */
        ri->outcome = "empty";
        answer_ok(in, ri, resp);
        goto out;
    }
    const wxg_msg_view_t *first = wxg_batch_msg(batch, 0);
    size_t al = strlen(first->account), cl = strlen(first->conversation);
    key = malloc(al + cl + 2);
    if (key == NULL) {
        ri->outcome = "nomem";
        answer(in, ri, resp, 500, "out of memory");
        goto out;
    }
    memcpy(key, first->account, al);
    key[al] = ':';
    memcpy(key + al + 1, first->conversation, cl + 1);

    char received[24];
    snprintf(received, sizeof received, "%" PRId64, wxg__wall_ms());
    const char *fname = wxg_format_name(first->format);
    wxg_kafka_header_t hdrs[] = {
        {WXG_INGEST_HDR_FORMAT, fname, strlen(fname)},
        {WXG_INGEST_HDR_ACCOUNT, first->account, al},
        {WXG_INGEST_HDR_RECEIVED, received, strlen(received)},
        {WXG_INGEST_HDR_REQUEST_ID, ri->request_id, strlen(ri->request_id)},
    };
    int64_t left = in->budget_ms - (wxg__mono_ms() - t0);
    if (left < 1)
        left = 1;
    int64_t p0 = wxg__mono_ms();
    wxg_delivery_t dr = {0};
    rc = wxg_producer_send_within(in->producer, (int)left, in->topic, WXG_PARTITION_ANY, key,
                                  al + cl + 1, body, len, hdrs, sizeof hdrs / sizeof hdrs[0], &dr,
                                  reason, sizeof reason);
    wxg_histogram_observe(in->produce_seconds, (double)(wxg__mono_ms() - p0) / 1000.0);
    if (rc == 0) {
        ri->outcome = "stored";
        wxg_counter_add(in->bytes, len);
        answer_ok(in, ri, resp);
        wxg_log(WXG_LOG_DEBUG, "callback_stored", WXG_LS("request_id", ri->request_id),
                WXG_LS("endpoint", ep_names[ri->ep]), WXG_LS("format", fname),
                WXG_LID("account", first->account), WXG_LU("messages", n), WXG_LU("bytes", len),
                WXG_LI("partition", dr.partition), WXG_LI("offset", dr.offset));
    } else if (rc == WXG_ETOOBIG) {
        ri->outcome = "kafka_too_big";
        answer(in, ri, resp, 413, "ETOOBIG: Kafka refused a record of %zu bytes", len);
    } else {
        ri->outcome = "kafka_unavailable";
        wxg_log(WXG_LOG_WARN, "produce_failed", WXG_LS("request_id", ri->request_id), WXG_LERR(rc),
                WXG_LS("reason", reason));
        answer(in, ri, resp, 503, "%s: Kafka did not store the callback in time; retry later",
               wxg_err_name(rc));
    }
out:
    free(key);
    wxg_batch_free(batch);
}

/* An encrypted Official Account push (encrypt_type=aes) when a key is configured: check
 * msg_signature over the Encrypt text, decrypt it (with the previous key when the current one
 * does not fit), and store the plaintext push. Compatible mode carries the plaintext fields too,
 * but they are covered by no signature, so the decrypted copy is what counts there as well. */
/* Answers 401 for `why` (one of refusal_names), logs it and counts it. `what` names the
 * signature for the log line (NULL: none). */
static void refuse(wxg_ingest_t *in, reqinfo *ri, wxg_httpd_resp_t *resp, const char *why,
                   const char *what, const char *text)
{
    ri->outcome = why;
    count_refusal(in, ri->ep, why);
    wxg_log(WXG_LOG_WARN, "signature_refused", WXG_LS("request_id", ri->request_id),
            WXG_LS("endpoint", ep_names[ri->ep]), WXG_LS("signature", what), WXG_LS("reason", why));
    answer(in, ri, resp, 401, "EAUTH: %s", text);
}

/* The replay window: a signed timestamp outside ingest.signature.tolerance.ms is refused. It is
 * checked only after the signature proved who set the timestamp. Returns 0 when the request may
 * go on; otherwise it has been answered. */
static int check_age(wxg_ingest_t *in, reqinfo *ri, wxg_httpd_resp_t *resp, const char *timestamp,
                     const char *what)
{
    const char *why = NULL;
    if (wxg_ingest_timestamp_check(timestamp, in->tolerance_ms, wxg__wall_ms(), &why) == 0)
        return 0;
    char text[160];
    snprintf(text, sizeof text, "%s %s (ingest.signature.tolerance.ms is %" PRId64 ")",
             strcmp(why, "missing_timestamp") == 0 ? "no signed timestamp on the"
             : strcmp(why, "bad_timestamp") == 0   ? "malformed signed timestamp on the"
             : strcmp(why, "expired") == 0         ? "signed timestamp too old on the"
                                                   : "signed timestamp in the future on the",
             what, in->tolerance_ms);
    refuse(in, ri, resp, why, what, text);
    return -1;
}

/* The gateway HMAC (every endpoint but oa, when any gateway secret is set). With the replay
 * window on, the HMAC must cover X-Wxg-Timestamp; with it off, a body-only HMAC is still taken.
 * The secrets are tried in turn: the current and the previous ingest.hmac.secret (any account),
 * then each of ingest.hmac.gateways; the one that verifies sets ao->allowed to the accounts it is
 * bound to (NULL: any). Returns 0 when the request may go on; otherwise it has been answered. */
static int check_hmac(wxg_ingest_t *in, reqinfo *ri, const wxg_httpd_req_t *req, const char *body,
                      size_t len, wxg_ingest_accept_opts_t *ao, wxg_httpd_resp_t *resp)
{
    if (in->nsecrets == 0)
        return 0;
    const char *ts = wxg_httpd_req_header(req, WXG_INGEST_TIMESTAMP_HEADER);
    if (ts == NULL && in->tolerance_ms > 0)
        return check_age(in, ri, resp, NULL, WXG_INGEST_HMAC_HEADER);
    const char *sig = wxg_httpd_req_header(req, WXG_INGEST_HMAC_HEADER);
    const hmac_secret *hit = NULL;
    for (size_t i = 0; i < in->nsecrets && hit == NULL; i++) {
        if (wxg_ingest_hmac_verify_ts(in->secrets[i].secret, ts, body, len, sig) == 0)
            hit = &in->secrets[i];
    }
    if (hit == NULL) {
        refuse(in, ri, resp, "bad_hmac", WXG_INGEST_HMAC_HEADER,
               "bad or missing " WXG_INGEST_HMAC_HEADER);
        return -1;
    }
    if (hit->previous)
        wxg_log(WXG_LOG_INFO, "hmac_previous_secret", WXG_LS("request_id", ri->request_id));
    ao->allowed = hit->naccounts > 0 ? (const char *const *)hit->accounts : NULL;
    ao->nallowed = hit->naccounts;
    return ts != NULL ? check_age(in, ri, resp, ts, WXG_INGEST_HMAC_HEADER) : 0;
}

/* The Official Account's signature over token, timestamp and nonce, then its timestamp's age.
 * Returns 0 when the request may go on; otherwise it has been answered. */
static int check_oa(wxg_ingest_t *in, reqinfo *ri, const wxg_httpd_req_t *req,
                    wxg_httpd_resp_t *resp)
{
    const char *ts = wxg_httpd_req_query(req, "timestamp");
    if (wxg_ingest_oa_verify(in->oa_token, ts, wxg_httpd_req_query(req, "nonce"),
                             wxg_httpd_req_query(req, "signature")) != 0) {
        refuse(in, ri, resp, "bad_signature", "signature",
               "bad or missing Official Account signature");
        return -1;
    }
    return check_age(in, ri, resp, ts, "signature");
}

static void ingest_encrypted(wxg_ingest_t *in, reqinfo *ri, const wxg_httpd_req_t *req,
                             const wxg_ingest_accept_opts_t *ao, const char *body, size_t len,
                             int64_t t0, wxg_httpd_resp_t *resp)
{
    char reason[256] = "";
    char *enc = NULL, *plain = NULL;
    size_t enc_len = 0, plain_len = 0;
    wxg_decode_opts_t opts = {.max_bytes = in->max_body};
    int rc = wxg_decode_oa_encrypt(body, len, &opts, &enc, &enc_len, reason, sizeof reason);
    if (rc != 0) {
        ri->outcome = "undecodable";
        answer(in, ri, resp, 400, "%s: %s: %s", wxg_err_name(rc), wxg_strerror(rc), reason);
        goto out;
    }
    if (wxg__oa_msg_verify(in->oa_token, wxg_httpd_req_query(req, "timestamp"),
                           wxg_httpd_req_query(req, "nonce"), enc, enc_len,
                           wxg_httpd_req_query(req, "msg_signature")) != 0) {
        refuse(in, ri, resp, "bad_signature", "msg_signature",
               "bad or missing msg_signature of an encrypted push");
        goto out;
    }
    rc = wxg__oa_decrypt(in->oa_key, in->oa_appid, enc, enc_len, &plain, &plain_len, reason,
                         sizeof reason);
    if (rc == WXG_EFORMAT && in->has_key_prev) {
        char again[256];
        rc = wxg__oa_decrypt(in->oa_key_prev, in->oa_appid, enc, enc_len, &plain, &plain_len, again,
                             sizeof again);
        if (rc == 0)
            wxg_log(WXG_LOG_INFO, "oa_previous_key", WXG_LS("request_id", ri->request_id));
    }
    if (rc != 0) {
        ri->outcome = "undecryptable";
        wxg_log(WXG_LOG_WARN, "oa_decrypt_failed", WXG_LS("request_id", ri->request_id),
                WXG_LERR(rc), WXG_LS("reason", reason));
        answer(in, ri, resp, 400, "%s: %s", wxg_err_name(rc), reason);
        goto out;
    }
    ingest_body(in, ri, ao, plain, plain_len, t0, resp);
out:
    free(enc);
    if (plain != NULL) {
        OPENSSL_cleanse(plain, plain_len);
        free(plain);
    }
}

static void handle(void *opaque, const wxg_httpd_req_t *req, wxg_httpd_resp_t *resp)
{
    wxg_ingest_t *in = opaque;
    int64_t t0 = wxg__mono_ms();
    reqinfo ri = {.ep = EP_OTHER, .outcome = "refused"};
    char account[ACCOUNT_MAX + 1];
    const char *method = wxg_httpd_req_method(req);
    const char *path = wxg_httpd_req_path(req);
    size_t len = 0;
    const char *body = wxg_httpd_req_body(req, &len);

    const char *rid = wxg_httpd_req_header(req, "X-Request-Id");
    if (rid != NULL && sane_id(rid, REQUEST_ID_MAX))
        snprintf(ri.request_id, sizeof ri.request_id, "%s", rid);
    else
        snprintf(ri.request_id, sizeof ri.request_id, "%016" PRIx64 "-%" PRIx64, in->rid_base,
                 (uint64_t)atomic_fetch_add(&in->rid_next, 1));

    if (strncmp(path, WXG_INGEST_PATH_PREFIX, strlen(WXG_INGEST_PATH_PREFIX)) != 0 ||
        parse_route(path + strlen(WXG_INGEST_PATH_PREFIX), &ri.ep, account, sizeof account) != 0) {
        ri.ep = EP_OTHER;
        answer(in, &ri, resp, 404,
               "not found: callbacks go to " WXG_INGEST_PATH_PREFIX
               "{wkteam,gewe,oa,generic,auto}[/{account}]");
        goto out;
    }
    wxg_ingest_accept_opts_t ao = {.path_account = account, .max_bytes = in->max_body};
    int is_get = strcmp(method, "GET") == 0;
    if (strcmp(method, "POST") != 0 && !(is_get && ri.ep == EP_OA)) {
        answer(in, &ri, resp, 405, "method not allowed");
        wxg_httpd_resp_header(resp, "Allow", ri.ep == EP_OA ? "GET, POST" : "POST");
        goto out;
    }

    if (ri.ep == EP_OA) {
        if (in->oa_token == NULL) {
            answer(in, &ri, resp, 404,
                   "Official Account callbacks are off (ingest.oa.token is empty)");
            goto out;
        }
        if (check_oa(in, &ri, req, resp) != 0)
            goto out;
        if (is_get) {
            /* URL verification: echo echostr, exactly, once the signature proved the sender. */
            const char *echo = wxg_httpd_req_query(req, "echostr");
            if (echo == NULL || strlen(echo) > ECHOSTR_MAX) {
                answer(in, &ri, resp, 400, "EINVAL: echostr missing or too long");
                goto out;
            }
            ri.outcome = "verified";
            answer_raw(in, &ri, resp, 200, echo, strlen(echo));
            goto out;
        }
        /* Safe mode is strict: with a key, only an encrypted push counts, whatever the query
         * claims, since the URL signature of a plaintext push covers no byte of its body. */
        const char *et = wxg_httpd_req_query(req, "encrypt_type");
        int encrypted = et != NULL && strcasecmp(et, "aes") == 0;
        if (in->has_key && encrypted) {
            ingest_encrypted(in, &ri, req, &ao, body, len, t0, resp);
            goto out;
        }
        if (in->has_key && !in->oa_plaintext_accept) {
            refuse(in, &ri, resp, "plaintext_refused", "msg_signature",
                   "ingest.oa.aes.key is set: only encrypted pushes (encrypt_type=aes, "
                   "msg_signature) are accepted");
            goto out;
        }
    } else if (check_hmac(in, &ri, req, body, len, &ao, resp) != 0) {
        goto out;
    }
    ingest_body(in, &ri, &ao, body, len, t0, resp);
out:
    wxg_log(WXG_LOG_DEBUG, "callback", WXG_LS("request_id", ri.request_id),
            WXG_LS("endpoint", ep_names[ri.ep]), WXG_LU("status", resp->status),
            WXG_LS("outcome", ri.outcome), WXG_LU("bytes", len), WXG_LI("ms", wxg__mono_ms() - t0));
}

static int ready_cb(void *opaque, char *reason, size_t size)
{
    return wxg_ingest_ready(opaque, reason, size);
}

int wxg_ingest_ready(const wxg_ingest_t *in, char *reason, size_t reason_size)
{
    int up = in != NULL ? wxg_producer_brokers_up(in->producer) : -1;
    char tmp[8];
    if (reason == NULL || reason_size == 0) {
        reason = tmp;
        reason_size = sizeof tmp;
    }
    if (up > 0) {
        snprintf(reason, reason_size, "kafka: %d broker%s up", up, up == 1 ? "" : "s");
        return 1;
    }
    snprintf(reason, reason_size, "%s",
             up < 0 ? "kafka: no connection state yet" : "kafka: no broker reachable");
    return 0;
}

/* ---- set-up -------------------------------------------------------------------------------- */

/* Reads the safe-mode keys. A key is useless without the token (msg_signature is made with it)
 * and unsafe without the AppId (a push sealed for another account would be accepted), so both
 * are required with it, and a key that is not 43 base64 characters stops the start. */
static int oa_keys(wxg_ingest_t *in, const wxg_conf_t *conf, char *errstr, size_t errstr_size)
{
    const char *cur = wxg_conf_get(conf, "ingest.oa.aes.key");
    const char *prev = wxg_conf_get(conf, "ingest.oa.aes.key.previous");
    int want = cur != NULL && cur[0] != '\0';
    if (!want && prev != NULL && prev[0] != '\0') {
        wxg__errf(errstr, errstr_size,
                  "ingest.oa.aes.key.previous is set but ingest.oa.aes.key is empty");
        return WXG_ECONFIG;
    }
    if (!want)
        return 0;
    if (in->oa_token == NULL || in->oa_appid == NULL) {
        wxg__errf(errstr, errstr_size,
                  "ingest.oa.aes.key needs ingest.oa.token and ingest.oa.appid");
        return WXG_ECONFIG;
    }
    if (wxg__oa_aes_key(cur, in->oa_key) != 0) {
        wxg__errf(errstr, errstr_size,
                  "ingest.oa.aes.key is not an EncodingAESKey (43 base64 characters)");
        return WXG_ECONFIG;
    }
    in->has_key = 1;
    if (prev != NULL && prev[0] != '\0') {
        if (wxg__oa_aes_key(prev, in->oa_key_prev) != 0) {
            wxg__errf(errstr, errstr_size,
                      "ingest.oa.aes.key.previous is not an EncodingAESKey (43 base64 characters)");
            return WXG_ECONFIG;
        }
        in->has_key_prev = 1;
    }
    return 0;
}

/* Whether a host of ingest.listen reaches only this machine. */
static int loopback_host(const char *host)
{
    return strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0 ||
           strncmp(host, "127.", 4) == 0;
}

static void free_secrets(wxg_ingest_t *in)
{
    for (size_t i = 0; i < in->nsecrets; i++) {
        hmac_secret *h = &in->secrets[i];
        if (h->secret != NULL) {
            OPENSSL_cleanse(h->secret, strlen(h->secret));
            free(h->secret);
        }
        for (size_t k = 0; k < h->naccounts; k++)
            free(h->accounts[k]);
        free(h->accounts);
    }
    free(in->secrets);
    in->secrets = NULL;
    in->nsecrets = 0;
}

/* Appends a secret (len bytes of s) bound to the '|'-separated accounts in accts (alen bytes;
 * none: any account). 0, or WXG_ECONFIG / WXG_ENOMEM with errstr set (never to the secret). */
static int add_secret(wxg_ingest_t *in, const char *s, size_t len, const char *accts, size_t alen,
                      int previous, size_t entry, char *errstr, size_t errstr_size)
{
    hmac_secret *grown = realloc(in->secrets, (in->nsecrets + 1) * sizeof *grown);
    if (grown == NULL)
        goto oom;
    in->secrets = grown;
    hmac_secret *h = &in->secrets[in->nsecrets++];
    *h = (hmac_secret){.previous = previous};
    if ((h->secret = strndup(s, len)) == NULL)
        goto oom;
    for (size_t i = 0; i < alen;) {
        const char *bar = memchr(accts + i, '|', alen - i);
        size_t n = bar != NULL ? (size_t)(bar - (accts + i)) : alen - i;
        char *a = strndup(accts + i, n);
        char **more = realloc(h->accounts, (h->naccounts + 1) * sizeof *more);
        if (a == NULL || more == NULL) {
            free(a);
            if (more != NULL)
                h->accounts = more;
            goto oom;
        }
        h->accounts = more;
        h->accounts[h->naccounts++] = a;
        if (!sane_id(a, ACCOUNT_MAX)) {
            wxg__errf(errstr, errstr_size,
                      "ingest.hmac.gateways: entry %zu names an account that is not a sane id "
                      "(letters, digits, '-', '_', '.', '@', at most %d bytes)",
                      entry + 1, ACCOUNT_MAX);
            return WXG_ECONFIG;
        }
        i += n + 1;
    }
    return 0;
oom:
    wxg__errf(errstr, errstr_size, "out of memory");
    return WXG_ENOMEM;
}

/* Reads the gateway secrets and applies ingest.hmac.required. */
static int gateway_secrets(wxg_ingest_t *in, const wxg_conf_t *conf, char *errstr,
                           size_t errstr_size)
{
    const char *cur = wxg_conf_get(conf, "ingest.hmac.secret");
    const char *prev = wxg_conf_get(conf, "ingest.hmac.secret.previous");
    const char *gw = wxg_conf_get(conf, "ingest.hmac.gateways");
    int rc;
    if ((cur == NULL || cur[0] == '\0') && prev != NULL && prev[0] != '\0') {
        wxg__errf(errstr, errstr_size,
                  "ingest.hmac.secret.previous is set but ingest.hmac.secret is empty");
        return WXG_ECONFIG;
    }
    if (cur != NULL && cur[0] != '\0' &&
        (rc = add_secret(in, cur, strlen(cur), "", 0, 0, 0, errstr, errstr_size)) != 0)
        return rc;
    if (prev != NULL && prev[0] != '\0' &&
        (rc = add_secret(in, prev, strlen(prev), "", 0, 1, 0, errstr, errstr_size)) != 0)
        return rc;
    for (size_t entry = 0; gw != NULL && *gw != '\0'; entry++) {
        while (*gw == ' ' || *gw == '\t')
            gw++;
        const char *comma = strchr(gw, ',');
        size_t n = comma != NULL ? (size_t)(comma - gw) : strlen(gw);
        while (n > 0 && (gw[n - 1] == ' ' || gw[n - 1] == '\t'))
            n--;
        const char *eq = memchr(gw, '=', n);
        if (eq == NULL || eq == gw || eq + 1 == gw + n) {
            wxg__errf(errstr, errstr_size,
                      "ingest.hmac.gateways: entry %zu is not <account>[|<account>...]=<secret>",
                      entry + 1);
            return WXG_ECONFIG;
        }
        rc = add_secret(in, eq + 1, (size_t)(gw + n - (eq + 1)), gw, (size_t)(eq - gw), 0, entry,
                        errstr, errstr_size);
        if (rc != 0)
            return rc;
        gw = comma != NULL ? comma + 1 : "";
    }

    char host[256] = "";
    int port = 0;
    const char *listen = wxg_conf_get(conf, "ingest.listen");
    int local = listen != NULL && wxg_conf_parse_addr(listen, host, sizeof host, &port) == 0 &&
                loopback_host(host);
    if (in->nsecrets == 0 && !local) {
        if (wxg_conf_bool(conf, "ingest.hmac.required")) {
            wxg__errf(errstr, errstr_size,
                      "ingest.listen (%s) is not a loopback address and no gateway secret is set "
                      "(ingest.hmac.secret or ingest.hmac.gateways): anyone who reaches it could "
                      "post callbacks for any account; set a secret, or ingest.hmac.required = "
                      "false when something in front of ingest authenticates the gateways",
                      listen != NULL ? listen : "");
            return WXG_ECONFIG;
        }
        wxg_log(WXG_LOG_WARN, "hmac_not_required",
                WXG_LS("detail", "ingest.hmac.required is false and no gateway secret is set: "
                                 "every gateway callback that reaches ingest.listen is accepted"));
    } else if (in->nsecrets == 0) {
        wxg_log(WXG_LOG_WARN, "hmac_off",
                WXG_LS("detail", "no gateway secret is set: every gateway callback that reaches "
                                 "the loopback ingest.listen is accepted"));
    }
    return 0;
}

static char *dup_nonempty(const char *s, int *oom)
{
    if (s == NULL || s[0] == '\0')
        return NULL;
    char *d = strdup(s);
    if (d == NULL)
        *oom = 1;
    return d;
}

/* The operations server on ingest.ops.listen (none when it is empty). Refused with a hint when it
 * names the callback port's own address: the operator who wants one port asks for that with
 * ingest.ops.on.callback.port. 0, or WXG_ECONFIG / WXG_ECONN with errstr naming the key. */
static int ops_start(wxg_ingest_t *in, const wxg_conf_t *conf, wxg_metrics_t *metrics, char *errstr,
                     size_t errstr_size)
{
    const char *ops = wxg_conf_get(conf, "ingest.ops.listen");
    if (ops == NULL || ops[0] == '\0')
        return 0;
    char host[256], cb_host[256], err[384] = "";
    int port = 0, cb_port = 0;
    if (wxg_conf_parse_addr(ops, host, sizeof host, &port) == 0 &&
        wxg_conf_parse_addr(wxg_conf_get(conf, "ingest.listen"), cb_host, sizeof cb_host,
                            &cb_port) == 0 &&
        port != 0 && port == cb_port && strcmp(host, cb_host) == 0) {
        wxg__errf(errstr, errstr_size,
                  "ingest.ops.listen is ingest.listen's address; to serve /metrics, /healthz "
                  "and /readyz on the callback port, set ingest.ops.on.callback.port = true and "
                  "ingest.ops.listen empty");
        return WXG_ECONFIG;
    }
    in->ops = wxg_httpd_start(ops, metrics, ready_cb, in, err, sizeof err);
    if (in->ops == NULL) {
        wxg__errf(errstr, errstr_size, "ingest.ops.listen: %s", err);
        return WXG_ECONN;
    }
    return 0;
}

static void wipe_free(char *s)
{
    if (s == NULL)
        return;
    OPENSSL_cleanse(s, strlen(s));
    free(s);
}

wxg_ingest_t *wxg_ingest_new(const wxg_conf_t *conf, wxg_metrics_t *metrics, char *errstr,
                             size_t errstr_size)
{
    int oom = 0;
    rd_kafka_conf_t *kc = NULL;
    if (conf == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return NULL;
    }
    wxg_ingest_t *in = calloc(1, sizeof *in);
    if (in == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    in->metrics = metrics;
    in->max_body = (size_t)wxg_conf_int(conf, "ingest.max.body.bytes");
    in->budget_ms = (int)wxg_conf_int(conf, "ingest.produce.timeout.ms");
    in->topic = dup_nonempty(wxg_conf_get(conf, "ingest.topic"), &oom);
    in->oa_token = dup_nonempty(wxg_conf_get(conf, "ingest.oa.token"), &oom);
    in->tolerance_ms = wxg_conf_int(conf, "ingest.signature.tolerance.ms");
    in->oa_appid = dup_nonempty(wxg_conf_get(conf, "ingest.oa.appid"), &oom);
    if (oom || in->topic == NULL) {
        wxg__errf(errstr, errstr_size, oom ? "out of memory" : "ingest.topic is empty");
        goto fail;
    }
    if (oa_keys(in, conf, errstr, errstr_size) != 0 ||
        gateway_secrets(in, conf, errstr, errstr_size) != 0)
        goto fail;
    in->oa_plaintext_accept = wxg_conf_bool(conf, "ingest.oa.plaintext.accept");
    if (in->has_key && in->oa_plaintext_accept)
        wxg_log(WXG_LOG_WARN, "oa_plaintext_accepted",
                WXG_LS("detail", "ingest.oa.plaintext.accept is set beside ingest.oa.aes.key: a "
                                 "plaintext push's signature covers no byte of its body, so "
                                 "anyone who saw one request URL can post forged pushes under it "
                                 "until its timestamp expires"));
    if (getrandom(&in->rid_base, sizeof in->rid_base, GRND_NONBLOCK) != sizeof in->rid_base)
        in->rid_base = (uint64_t)wxg__wall_ms() ^ ((uint64_t)wxg__mono_ms() << 32);
    atomic_init(&in->rid_next, 1);

    /* The producer: the record must be acknowledged by Kafka within the request's budget, so
     * librdkafka's own message timeout is the budget too (the operator may still override it):
     * a record that missed its answer does not linger and land long after the 503. */
    kc = wxg_conf_kafka(conf, errstr, errstr_size);
    if (kc == NULL)
        goto fail;
    char tmo[24];
    snprintf(tmo, sizeof tmo, "%d", in->budget_ms);
    const wxg_kafka_prop_t budget = {"message.timeout.ms", tmo};
    /* Every kafka.* setting is the producer's here: this program consumes nothing. */
    in->producer = wxg_producer_new_like(kc, WXG_PRODUCER_ALL, &budget, 1, errstr, errstr_size);
    rd_kafka_conf_destroy(kc);
    kc = NULL;
    if (in->producer == NULL)
        goto fail;

    in->produce_seconds = wxg_metrics_histogram(
        metrics, "wxg_ingest_produce_seconds",
        "Time from producing a callback to Kafka's acknowledgement (or giving up).", NULL, 0, NULL);
    in->bytes = wxg_metrics_counter(metrics, "wxg_ingest_stored_bytes_total",
                                    "Body bytes of the callbacks stored in Kafka.", NULL);
    if (metrics != NULL && wxg_metrics_on_collect(metrics, collect, in) != 0) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto fail;
    }

    /* One setting for both clocks: a connection idle that long is closed, and so is one whose
     * request has not arrived whole that long after its first byte (a client trickling bytes
     * restarts the idle clock at every byte, never the request's). */
    int64_t tmo_ms = wxg_conf_int(conf, "ingest.connection.timeout.ms");
    /* The built-in paths stay off the callback port unless asked for: that port faces the
     * gateways (and whoever else reaches it), the metrics and readiness are the operator's. */
    int ops_here = wxg_conf_bool(conf, "ingest.ops.on.callback.port");
    wxg_httpd_opts_t ho = {.listen = wxg_conf_get(conf, "ingest.listen"),
                           .metrics = metrics,
                           .ready = ready_cb,
                           .ready_opaque = in,
                           .handler = handle,
                           .handler_opaque = in,
                           .handler_prefix = "/",
                           .max_body = in->max_body,
                           .max_inflight = (unsigned)wxg_conf_int(conf, "ingest.concurrency"),
                           .conn_timeout_s = (unsigned)((tmo_ms + 999) / 1000),
                           .request_timeout_ms = (unsigned)tmo_ms,
                           .no_builtin_paths = !ops_here};
    in->httpd = wxg_httpd_start_opts(&ho, errstr, errstr_size);
    if (in->httpd == NULL)
        goto fail;
    if (ops_start(in, conf, metrics, errstr, errstr_size) != 0)
        goto fail;
    wxg_log(WXG_LOG_INFO, "ingest_started", WXG_LS("listen", ho.listen),
            WXG_LI("port", wxg_httpd_port(in->httpd)), WXG_LS("topic", in->topic),
            WXG_LI("budget_ms", in->budget_ms), WXG_LU("max_body", in->max_body),
            WXG_LU("concurrency", ho.max_inflight), WXG_LB("oa", in->oa_token != NULL),
            WXG_LB("oa_safe_mode", in->has_key), WXG_LB("hmac", in->nsecrets > 0),
            WXG_LU("hmac_secrets", in->nsecrets),
            WXG_LI("signature_tolerance_ms", in->tolerance_ms),
            WXG_LS("ops_listen", wxg_conf_get(conf, "ingest.ops.listen")),
            WXG_LI("ops_port", wxg_httpd_port(in->ops)), WXG_LB("ops_on_callback_port", ops_here));
    return in;
fail:
    wxg_ingest_destroy(in);
    return NULL;
}

int wxg_ingest_check_kafka(wxg_ingest_t *in, int timeout_ms, char *errstr, size_t errstr_size)
{
    return wxg_producer_check(in->producer, timeout_ms, errstr, errstr_size);
}

int wxg_ingest_port(const wxg_ingest_t *in)
{
    return in != NULL ? wxg_httpd_port(in->httpd) : -1;
}

int wxg_ingest_ops_port(const wxg_ingest_t *in)
{
    return in != NULL ? wxg_httpd_port(in->ops) : -1;
}

void wxg_ingest_destroy(wxg_ingest_t *in)
{
    if (in == NULL)
        return;
    wxg_httpd_stop(in->ops); /* first: it renders the registry and asks ready_cb about `in` */
    wxg_httpd_stop(in->httpd);
    wxg_producer_destroy(in->producer, in->budget_ms);
    free(in->topic);
    wipe_free(in->oa_token);
    free_secrets(in);
    free(in->oa_appid);
    OPENSSL_cleanse(in->oa_key, sizeof in->oa_key);
    OPENSSL_cleanse(in->oa_key_prev, sizeof in->oa_key_prev);
    free(in);
}
