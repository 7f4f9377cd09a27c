/*
 * The webhook receiver: WeChat gateway callbacks over HTTP in, Kafka records out.
 *
 * Endpoints on ingest.listen, the callback port:
 *   POST /v1/callback/{format}            format: wkteam, gewe, oa, generic, auto
 *   POST /v1/callback/{format}/{account}  the same, and every message must belong to {account}
 *   GET  /v1/callback/oa[/{account}]      the Official Account URL verification: answers echostr
 *
 * A callback is answered 200 (body "success" for the Official Account, "ok" otherwise) only after
 * Kafka acknowledged the record (idempotent producer, acks=all), within ingest.produce.timeout.ms.
 * The record's value is the request body, byte for byte: never re-serialised, so ids keep every
 * digit. Its key is "<account>:<conversation>" of the first message the body decodes to (a batched
 * sync callback carries several; all of one batch come from one bot, and a gateway batches per
 * push, so the first conversation keeps a retried batch on one partition). Its headers are
 * WXG_INGEST_HDR_*. Other answers:
 *   400  the body does not decode (the body says why: the WXG_E* name and a reason), an Official
 *        Account push sent to another endpoint than oa, or a message of another account than the
 *        one in the path;
 *   401  a bad Official Account signature, or a missing or bad X-Wxg-Signature when
 *        ingest.hmac.secret is set (every endpoint except oa), or a signed timestamp outside
 *        ingest.signature.tolerance.ms (a replayed or badly clocked request; also a gateway
 *        request without X-Wxg-Timestamp while the tolerance is on);
 *   404  an unknown path or format, or the oa endpoint while ingest.oa.token is empty;
 *   405  another method (Allow names the right ones);
 *   413  a body over ingest.max.body.bytes (declared or streamed), or larger than Kafka accepts;
 *   503  Kafka did not acknowledge within the budget or refused the record, or
 *        ingest.concurrency requests are already in progress (Retry-After: 1). The gateway
 *        retries; a record that reached Kafka after all is a duplicate the consumer's guard drops.
 * Every answer carries X-Request-Id (the client's, when it sent a sane one, else a new one), which
 * is also the record's request-id header and appears in the log lines of the request.
 *
 * Operations endpoints: GET /metrics, /healthz and /readyz (lib/httpd.c) are served on
 * ingest.ops.listen (default 127.0.0.1:9465; empty: nowhere), not on the callback port, which
 * faces the gateways and whoever else can reach it: there they are 404 like any unknown path,
 * unless ingest.ops.on.callback.port = true serves them on both (for a setup with one port).
 * Readiness (/readyz): ready when the producer has a connection up to at least one broker.
 *
 * Threads: wxg_ingest_new() and wxg_ingest_destroy() on one thread (the main thread). Requests are
 * served on connection threads; every other function may be called from any thread.
 */
#ifndef WXGUARD_INGEST_H
#define WXGUARD_INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"
#include "wxguard/conf.h"
#include "wxguard/metrics.h"
#include "wxguard/msg.h"

/* Record header names. Values are text. */
#define WXG_INGEST_HDR_FORMAT     "wxg-format"  /* the decoded format, e.g. "oa-xml" */
#define WXG_INGEST_HDR_ACCOUNT    "wxg-account" /* the first message's account ("" for a probe) */
#define WXG_INGEST_HDR_RECEIVED   "wxg-received-ms" /* wall clock, ms since the epoch (UTC) */
#define WXG_INGEST_HDR_REQUEST_ID "wxg-request-id"

/* Every callback path starts with this. */
#define WXG_INGEST_PATH_PREFIX "/v1/callback/"

/* The gateway HMAC header: "sha256=" followed by 64 hex digits. */
#define WXG_INGEST_HMAC_HEADER "X-Wxg-Signature"
/* The gateway's signing time, Unix seconds in decimal; covered by the HMAC (see
 * wxg_ingest_hmac_sign_ts) and checked against ingest.signature.tolerance.ms. */
#define WXG_INGEST_TIMESTAMP_HEADER "X-Wxg-Timestamp"

typedef struct wxg_ingest_s wxg_ingest_t;

/* ---- the accept decision ---------------------------------------------------------------------
 *
 * What ingest authenticated is what the consumer runs: ingest decides once how a body decodes
 * (wxg_ingest_accept), writes the decision into the record's headers (WXG_INGEST_HDR_FORMAT and
 * WXG_INGEST_HDR_ACCOUNT), and the consumer decodes the record as stated (wxg_ingest_record_decode)
 * instead of detecting the format again. Both are pure functions, so that a test or a fuzz harness
 * can check that whatever one accepts, the other decodes to the same format, accounts and keys. */

/* The callback endpoints, /v1/callback/{name}. */
typedef enum wxg_ingest_endpoint {
    WXG_INGEST_EP_WKTEAM = 0,
    WXG_INGEST_EP_GEWE,
    WXG_INGEST_EP_OA, /* the body is the plaintext push (decrypted first in safe mode) */
    WXG_INGEST_EP_GENERIC,
    WXG_INGEST_EP_AUTO
} wxg_ingest_endpoint_t;

typedef struct wxg_ingest_accept_opts {
    const char *path_account; /* the {account} path segment; NULL or "" when the path has none */
    /* The accounts the authenticated sender may post for (a gateway secret bound to accounts);
     * NULL: any account. Borrowed for the call. */
    const char *const *allowed;
    size_t nallowed;
    size_t max_bytes; /* the decoder's size cap (0: its default) */
} wxg_ingest_accept_opts_t;

/* Decides whether ingest stores `body` received on endpoint `ep`, and as what. Accepted when:
 *   - it decodes with the endpoint's format (on auto, with detection; on oa, as XML when its
 *     first non-blank byte is '<', else as JSON);
 *   - detection decides the same format as the endpoint (a body that carries another format's
 *     discriminating fields is refused, whatever the endpoint would make of it), except that two
 *     readings of one URL-verification probe (no account) may differ;
 *   - an Official Account push arrives on the oa endpoint only;
 *   - every message names the path's account when the path has one, and else the first
 *     message's account (one body, one bot);
 *   - every account is one of `allowed` when that is set (a probe, which names none, passes).
 * On success returns 0 and *out owns the batch as the consumer will decode it (possibly empty:
 * nothing to store); free it with wxg_batch_free(). Otherwise *out is NULL, *why names the
 * refusal (the label of wxg_ingest_refused_total: "undecodable", "format_mismatch",
 * "oa_elsewhere", "account_mismatch", "mixed_accounts", "account_not_allowed"), `reason` (may be
 * NULL) says it in a sentence, and the return value is the decoder's error, WXG_EFORMAT,
 * WXG_ENOACCOUNT, WXG_EAUTH (account_not_allowed) or WXG_ENOMEM. Pure; any thread. */
WXG_EXPORT int wxg_ingest_accept(wxg_ingest_endpoint_t ep, const void *body, size_t len,
                                 const wxg_ingest_accept_opts_t *opts, wxg_batch_t **out,
                                 const char **why, char *reason, size_t reason_size);

/* Decodes a record as its producer stated. `format` and `account` are the values of the
 * WXG_INGEST_HDR_FORMAT and WXG_INGEST_HDR_ACCOUNT headers (not NUL-terminated: their lengths
 * follow; NULL when the record has no such header). opts->format is the consumer's pinned
 * format (WXG_FORMAT_AUTO: not pinned). A record without a format header (another producer)
 * decodes with opts as wxg_decode() does. A record with one decodes with the stated format, and
 * fails with WXG_EFORMAT when the header names no format (or "auto"), names another format than
 * a pinned one, or when a message names another account than the account header; a record that
 * does not decode as stated fails with the decoder's error. The reason says which. Same return
 * values, ownership and thread rules as wxg_decode(). */
WXG_EXPORT int wxg_ingest_record_decode(const void *buf, size_t len, const char *format,
                                        size_t format_len, const char *account, size_t account_len,
                                        const wxg_decode_opts_t *opts, wxg_batch_t **out,
                                        char *errstr, size_t errstr_size);

/* Starts the receiver from the ingest.* and kafka.* keys of `conf` (read during the call only):
 * creates the producer and starts serving on ingest.listen and ingest.ops.listen. Kafka need not be
 * reachable yet (requests get 503 and /readyz says not ready until it is). `metrics` (may be NULL)
 * receives the wxg_ingest_* series and a collect hook: it must outlive the receiver and must not be
 * rendered any more once wxg_ingest_destroy() has begun (stop other servers of it first). Returns
 * NULL with the reason in errstr when an address cannot be bound (the operations one is named
 * "ingest.ops.listen: ...") or the Kafka settings are refused. Main thread. */
WXG_EXPORT wxg_ingest_t *wxg_ingest_new(const wxg_conf_t *conf, wxg_metrics_t *metrics,
                                        char *errstr, size_t errstr_size);

/* The TCP port served (useful with port 0 in ingest.listen). */
WXG_EXPORT int wxg_ingest_port(const wxg_ingest_t *in);

/* The TCP port of the operations server (useful with port 0 in ingest.ops.listen), or -1 when
 * there is none (ingest.ops.listen is empty). */
WXG_EXPORT int wxg_ingest_ops_port(const wxg_ingest_t *in);

/* 1 when ready (a broker connection is up), 0 otherwise; a one-line reason goes to `reason`
 * (may be NULL). Lock-free, never blocks; any thread. */
WXG_EXPORT int wxg_ingest_ready(const wxg_ingest_t *in, char *reason, size_t reason_size);

/* Waits at most timeout_ms for a first answer from Kafka through the receiver's producer (see
 * wxg_producer_check): 0, WXG_EAUTH (the brokers refuse the SASL credentials), WXG_ECONN or
 * WXG_ETIMEDOUT, with librdkafka's reason in errstr (never the password). For start-up, where
 * only WXG_EAUTH is worth giving up for. Main thread. */
WXG_EXPORT int wxg_ingest_check_kafka(wxg_ingest_t *in, int timeout_ms, char *errstr,
                                      size_t errstr_size);

/* Stops serving (requests in progress are finished first, each within its budget), flushes the
 * producer within the produce timeout and frees everything. Accepts NULL. Main thread. */
WXG_EXPORT void wxg_ingest_destroy(wxg_ingest_t *in);

/* The Official Account signature: the lower-case hex SHA-1 of the concatenation of token,
 * timestamp and nonce sorted as byte strings. `out` receives 40 hex digits and a NUL. Returns 0,
 * or WXG_EINVAL for a NULL argument or a part longer than 256 bytes. Pure; any thread. */
WXG_EXPORT int wxg_ingest_oa_signature(const char *token, const char *timestamp, const char *nonce,
                                       char out[41]);

/* Checks `signature` (hex, any case) against the expected one in constant time. 0 when it
 * matches, WXG_EAUTH when it does not or a part is missing or malformed. Pure; any thread. */
WXG_EXPORT int wxg_ingest_oa_verify(const char *token, const char *timestamp, const char *nonce,
                                    const char *signature);

/* The gateway HMAC header value for `body`: "sha256=" and the lower-case hex HMAC-SHA256 of the
 * body under `secret` (71 bytes with the NUL). 0 or WXG_EINVAL. Pure; any thread. */
WXG_EXPORT int wxg_ingest_hmac_sign(const char *secret, const void *body, size_t len, char out[72]);

/* Checks a header value of the form above in constant time (the hex digits in any case). 0 when
 * it matches, WXG_EAUTH otherwise (also when `header` is NULL or malformed). */
WXG_EXPORT int wxg_ingest_hmac_verify(const char *secret, const void *body, size_t len,
                                      const char *header);

/* The same with a signing time: the HMAC covers `timestamp` (the X-Wxg-Timestamp value, at most
 * 256 bytes), a '.', then the body, so that a replay with a fresh timestamp does not verify. A
 * NULL timestamp gives the body-only forms above. Pure; any thread. */
WXG_EXPORT int wxg_ingest_hmac_sign_ts(const char *secret, const char *timestamp, const void *body,
                                       size_t len, char out[72]);
WXG_EXPORT int wxg_ingest_hmac_verify_ts(const char *secret, const char *timestamp,
                                         const void *body, size_t len, const char *header);

/* Checks a signed timestamp (decimal Unix seconds) against the clock `now_ms` (Unix ms): 0 when
 * it is within `tolerance_ms` either way (or tolerance_ms is 0), WXG_EAUTH otherwise. *why (may
 * be NULL) names the refusal: "missing_timestamp", "bad_timestamp", "expired" or "future".
 * Pure; any thread. */
WXG_EXPORT int wxg_ingest_timestamp_check(const char *timestamp, int64_t tolerance_ms,
                                          int64_t now_ms, const char **why);

#endif /* WXGUARD_INGEST_H */
