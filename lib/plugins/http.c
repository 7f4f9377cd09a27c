/*
 * DESIGN: the `http` built-in plugin: POST each message to a downstream URL (a CRM, a ticket
 * system, an analytics collector) with libcurl.
 *
 * The request body is the JSON of the message view plus the delivery context:
 *   {"key", "fence", "attempt", "format", "account", "conversation", "sender",
 *    "msg_id" (string or null), "create_time", "type", "is_group", "is_self",
 *    "content" (text; a NUL byte becomes U+FFFD), "payload_hash" (hex SHA-256)}
 * with Content-Type: application/json and the headers
 *   Idempotency-Key: <idempotency key>   the downstream's dedup key (same on every retry)
 *   X-Wxg-Fence: <fencing token>         a downstream that stores it can refuse stale writers
 *   X-Wxg-Attempt: <attempt>
 *
 * Outcome by response:
 *   2xx                                 OK; result "http <status>" plus " id=<id>" when the
 *                                       body is a JSON object with an "id" (string or number)
 *   408, 429, 5xx                       RETRY (the server says: try again later)
 *   other 4xx, 1xx, 3xx                 FAIL with the status in the reason (redirects are not
 *                                       followed: a POST must not silently change target)
 *   timeout, refused or lost connection,
 *   DNS or TLS handshake failure        RETRY with curl's error text
 * 408 and 429 are the two 4xx codes whose meaning is "later", so they retry rather than park.
 *
 * Exactly once in effect depends on the downstream: a crash after its 2xx but before the
 * guard's marker makes the next claim POST again with the same Idempotency-Key, so the
 * downstream must honour that header (most payment-style APIs do).
 *
 * Configuration (plugin.http.*): url (required; http:// or https://), timeout.ms (5000: the
 * whole request), connect.timeout.ms (2000), include.content (true), max.response.bytes (4096:
 * the response body is read up to this size, the rest is discarded), verify.tls (true).
 *
 * Threads: one CURL easy handle per worker thread (thread state), reused so that keep-alive
 * connections survive between messages; CURLOPT_NOSIGNAL because several threads time out
 * at once. curl_global_init runs in init, on the main thread, before any thread starts.
 */
#include "plugin_int.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct http_state {
    char *url;
    int64_t timeout_ms;
    int64_t connect_timeout_ms;
    int64_t max_response;
    int include_content;
    int verify_tls;
    int curl_inited;
} http_state;

typedef struct http_thread {
    CURL *h;
    char *buf; /* response body, max_response + 1 bytes */
    size_t len;
    size_t cap;
} http_thread;

/* The outcome of an HTTP status (exposed for the unit tests). */
wxg_plugin_result_t wxg__http_classify(long status)
{
    if (status >= 200 && status < 300)
        return WXG_PLUGIN_OK;
    if (status == 408 || status == 429 || (status >= 500 && status < 600))
        return WXG_PLUGIN_RETRY;
    return WXG_PLUGIN_FAIL;
}

static void http_destroy(void *state)
{
    http_state *s = state;
    if (!s)
        return;
    if (s->curl_inited)
        curl_global_cleanup();
    free(s->url);
    free(s);
}

static int http_init(const wxg_plugin_conf_t *conf, void **state, char *errstr, size_t errstr_size)
{
    static const char *const known[] = {
        "url",        "timeout.ms", "connect.timeout.ms", "include.content", "max.response.bytes",
        "verify.tls", NULL};
    int rc = wxg_plugin_conf_check_keys(conf, known, errstr, errstr_size);
    if (rc != 0)
        return rc;
    http_state *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    const char *url = wxg_plugin_conf_get(conf, "url");
    if (!url || (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)) {
        snprintf(errstr, errstr_size, "plugin.http.url: required, an http:// or https:// URL%s%s",
                 url ? ", not " : "", url ? url : "");
        rc = WXG_ECONFIG;
        goto fail;
    }
    if ((rc = wxg_plugin_conf_get_int64(conf, "timeout.ms", 5000, 1, 600000, &s->timeout_ms, errstr,
                                        errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_int64(conf, "connect.timeout.ms", 2000, 1, 600000,
                                        &s->connect_timeout_ms, errstr, errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_int64(conf, "max.response.bytes", 4096, 0, 1048576,
                                        &s->max_response, errstr, errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_bool(conf, "include.content", 1, &s->include_content, errstr,
                                       errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_bool(conf, "verify.tls", 1, &s->verify_tls, errstr,
                                       errstr_size)) != 0)
        goto fail;
    CURLU *u = curl_url();
    CURLUcode uc = u ? curl_url_set(u, CURLUPART_URL, url, 0) : CURLUE_OUT_OF_MEMORY;
    curl_url_cleanup(u);
    if (uc != CURLUE_OK) {
        snprintf(errstr, errstr_size, "plugin.http.url: '%s' is not a valid URL (%s)", url,
                 curl_url_strerror(uc));
        rc = WXG_ECONFIG;
        goto fail;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(errstr, errstr_size, "curl_global_init failed");
        rc = WXG_ENOMEM;
        goto fail;
    }
    s->curl_inited = 1;
    if (!(s->url = strdup(url))) {
        snprintf(errstr, errstr_size, "out of memory");
        rc = WXG_ENOMEM;
        goto fail;
    }
    *state = s;
    return 0;
fail:
    http_destroy(s);
    return rc;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *opaque)
{
    http_thread *t = opaque;
    size_t n = size * nmemb;
    size_t room = t->cap > t->len ? t->cap - t->len : 0;
    size_t take = n < room ? n : room;
    memcpy(t->buf + t->len, data, take);
    t->len += take;
    return n; /* the rest is discarded, not an error */
}

static int http_thread_init(void *state, void **thread_state, char *errstr, size_t errstr_size)
{
    const http_state *s = state;
    http_thread *t = calloc(1, sizeof *t);
    if (!t || !(t->buf = malloc((size_t)s->max_response + 1)) || !(t->h = curl_easy_init())) {
        if (t)
            free(t->buf);
        free(t);
        snprintf(errstr, errstr_size, "out of memory (curl_easy_init)");
        return WXG_ENOMEM;
    }
    t->cap = (size_t)s->max_response;
    *thread_state = t;
    return 0;
}

static void http_thread_destroy(void *state, void *thread_state)
{
    (void)state;
    http_thread *t = thread_state;
    if (!t)
        return;
    curl_easy_cleanup(t->h);
    free(t->buf);
    free(t);
}

static int add_num(cJSON *o, const char *name, const char *fmt_value)
{
    return cJSON_AddRawToObject(o, name, fmt_value) != NULL;
}

/* The request body; NULL when out of memory. */
static char *body_json(const http_state *s, const wxg_msg_view_t *msg, wxg_plugin_ctx_t *ctx)
{
    char num[32], hash[65];
    char *out = NULL, *content = NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    for (int i = 0; i < 32; i++)
        snprintf(hash + 2 * i, 3, "%02x", msg->payload_hash[i]);
    int ok = cJSON_AddStringToObject(o, "key", wxg_plugin_ctx_key(ctx)) != NULL;
    snprintf(num, sizeof num, "%" PRIu64, wxg_plugin_ctx_fence(ctx));
    ok = ok && add_num(o, "fence", num);
    snprintf(num, sizeof num, "%" PRIu32, wxg_plugin_ctx_attempt(ctx));
    ok = ok && add_num(o, "attempt", num);
    static const char *const formats[] = {"auto", "wkteam", "gewe", "oa-xml", "oa-json", "generic"};
    unsigned f = (unsigned)msg->format;
    ok = ok && cJSON_AddStringToObject(o, "format", f < 6 ? formats[f] : "auto") &&
         cJSON_AddStringToObject(o, "account", msg->account ? msg->account : "") &&
         cJSON_AddStringToObject(o, "conversation", msg->conversation ? msg->conversation : "") &&
         cJSON_AddStringToObject(o, "sender", msg->sender ? msg->sender : "") &&
         (msg->msg_id ? cJSON_AddStringToObject(o, "msg_id", msg->msg_id) != NULL
                      : cJSON_AddNullToObject(o, "msg_id") != NULL);
    snprintf(num, sizeof num, "%" PRId64, msg->create_time);
    ok = ok && add_num(o, "create_time", num) &&
         cJSON_AddStringToObject(o, "type", msg->type ? msg->type : "") &&
         cJSON_AddBoolToObject(o, "is_group", msg->is_group != 0) &&
         cJSON_AddBoolToObject(o, "is_self", msg->is_self != 0) &&
         cJSON_AddStringToObject(o, "payload_hash", hash);
    if (ok && s->include_content) {
        /* JSON strings cannot hold a raw NUL: write U+FFFD (3 bytes) in its place. */
        size_t len = msg->content ? msg->content_len : 0, nuls = 0;
        for (size_t i = 0; i < len; i++)
            nuls += msg->content[i] == '\0';
        content = malloc(len + 2 * nuls + 1);
        if (!content) {
            ok = 0;
        } else {
            size_t j = 0;
            for (size_t i = 0; i < len; i++) {
                if (msg->content[i] == '\0') {
                    memcpy(content + j, "\xEF\xBF\xBD", 3);
                    j += 3;
                } else {
                    content[j++] = msg->content[i];
                }
            }
            content[j] = '\0';
            ok = cJSON_AddStringToObject(o, "content", content) != NULL;
        }
    }
    if (ok)
        out = cJSON_PrintUnformatted(o);
    free(content);
    cJSON_Delete(o);
    return out;
}

/* " id=<id>" from a JSON object body with an "id", printable ASCII only, or "". */
static void response_id(const http_thread *t, char *out, size_t size)
{
    out[0] = '\0';
    if (t->len == 0)
        return;
    cJSON *o = cJSON_ParseWithLength(t->buf, t->len);
    const cJSON *id = o ? cJSON_GetObjectItemCaseSensitive(o, "id") : NULL;
    char val[128] = "";
    if (cJSON_IsString(id) && id->valuestring)
        snprintf(val, sizeof val, "%s", id->valuestring);
    else if (cJSON_IsNumber(id))
        snprintf(val, sizeof val, "%.17g", id->valuedouble);
    cJSON_Delete(o);
    for (char *p = val; *p; p++) {
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
            *p = '_';
    }
    if (val[0])
        snprintf(out, size, " id=%s", val);
}

static wxg_plugin_result_t http_handle(void *state, void *thread_state, const wxg_msg_view_t *msg,
                                       wxg_plugin_ctx_t *ctx)
{
    const http_state *s = state;
    http_thread *t = thread_state;
    wxg_plugin_result_t res = WXG_PLUGIN_RETRY;
    struct curl_slist *hdrs = NULL, *tmp;
    char line[WXG_PLUGIN_RESULT_MAX + 64];
    char *body = body_json(s, msg, ctx);
    if (!body) {
        wxg_plugin_ctx_set_reason(ctx, "http: out of memory building the request");
        return WXG_PLUGIN_RETRY;
    }
    const char *key = wxg_plugin_ctx_key(ctx);
    int ok = 1;
#define ADD_HDR(...)                                     \
    do {                                                 \
        snprintf(line, sizeof line, __VA_ARGS__);        \
        tmp = ok ? curl_slist_append(hdrs, line) : NULL; \
        ok = tmp != NULL;                                \
        if (ok)                                          \
            hdrs = tmp;                                  \
    } while (0)
    ADD_HDR("Content-Type: application/json");
    ADD_HDR("Idempotency-Key: %s", key);
    ADD_HDR("X-Wxg-Fence: %" PRIu64, wxg_plugin_ctx_fence(ctx));
    ADD_HDR("X-Wxg-Attempt: %" PRIu32, wxg_plugin_ctx_attempt(ctx));
    ADD_HDR("Expect:"); /* no 100-continue round trip */
#undef ADD_HDR
    if (!ok) {
        wxg_plugin_ctx_set_reason(ctx, "http: out of memory building the headers");
        goto out;
    }
    char cerr[CURL_ERROR_SIZE] = "";
    CURL *h = t->h;
    curl_easy_reset(h); /* keeps the connection cache, clears the previous call's options */
    t->len = 0;
    curl_easy_setopt(h, CURLOPT_URL, s->url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)s->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)s->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, s->verify_tls ? 1L : 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, s->verify_tls ? 2L : 0L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "wxguard");
    CURLcode cc = curl_easy_perform(h);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL); /* cerr lives on this stack frame */
    if (cc != CURLE_OK) {
        /* Timeouts, refused or reset connections, DNS and TLS failures: all transient from
         * here; a wrong URL shows up as the same reason on every attempt. */
        wxg_plugin_ctx_set_reason(ctx, "http: POST failed: %s (%s)", curl_easy_strerror(cc),
                                  cerr[0] ? cerr : "no detail");
        res = WXG_PLUGIN_RETRY;
        goto out;
    }
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    res = wxg__http_classify(status);
    if (res == WXG_PLUGIN_OK) {
        char id[160];
        response_id(t, id, sizeof id);
        snprintf(line, sizeof line, "http %ld%s", status, id);
        line[WXG_PLUGIN_RESULT_MAX] = '\0';
        wxg_plugin_ctx_set_result(ctx, line);
    } else {
        wxg_plugin_ctx_set_reason(ctx, "http: downstream answered %ld (%s)", status,
                                  res == WXG_PLUGIN_RETRY ? "retry later" : "refused");
    }
out:
    curl_slist_free_all(hdrs);
    free(body);
    return res;
}

static const wxg_plugin_desc_t http_desc = {
    .abi_version = WXG_PLUGIN_ABI_VERSION,
    .name = "http",
    .init = http_init,
    .thread_init = http_thread_init,
    .thread_destroy = http_thread_destroy,
    .handle = http_handle,
    .destroy = http_destroy,
};

const wxg_plugin_desc_t *wxg__plugin_http(void)
{
    return &http_desc;
}
