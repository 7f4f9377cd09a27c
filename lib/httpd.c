/*
 * DESIGN: the operations HTTP server, with optional application routes.
 *
 * Purpose: serve /metrics, /healthz and /readyz for both programs with libmicrohttpd, a small
 * HTTP library maintained for a long time and packaged by Debian, rather than hand-written HTTP
 * parsing on a port that may be reachable from a network. A program may add its own routes under
 * a path prefix (the ingest program's callback endpoints): this module then reads the request
 * body, enforces the body cap and the concurrency limit, and hands a complete request to the
 * program's handler, which never sees libmicrohttpd.
 *
 * Threads: without application routes libmicrohttpd runs one internal polling thread that
 * accepts connections and calls handle() for each request. With them, every connection gets a
 * thread of its own, because a handler may block (waiting for Kafka) and must not stall the
 * other connections or a metrics scrape. handle() reads the registry (which locks itself) and
 * calls the readiness callback and the handler, whose thread-safety the caller guarantees. The
 * only mutable state after start-up is the in-flight counter, an atomic.
 *
 * Limits: a connection limit and an idle timeout, so a slow or hostile client cannot pin the
 * server. For application routes also: a body cap checked against Content-Length before any byte
 * is read and against the bytes received (a chunked upload), and at most max_inflight requests
 * between their first byte and their answer; the one over the limit is answered 503 at once.
 * A request holds its in-flight slot until libmicrohttpd reports it completed, so a slot cannot
 * leak when a client disconnects mid-body. Built-in paths never read a body.
 *
 * Failure modes: a bad address or a failed bind returns NULL with the reason; a render or a
 * body buffer that runs out of memory answers 500; libmicrohttpd's own error messages go to the
 * log.
 */
#include "wxguard/httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "err_int.h"
#include "wxguard/conf.h"
#include "wxguard/err.h"
#include "wxguard/log.h"

#define CONN_LIMIT     64
#define CONN_TIMEOUT_S 10
#define REASON_MAX     256

#define DEFAULT_MAX_BODY      ((size_t)1 << 20)
#define DEFAULT_MAX_INFLIGHT  64
#define DEFAULT_APP_TIMEOUT_S 30
/* Bytes a client may send past the cap (discarded) before its connection is closed: enough to
 * answer an honest chunked upload that is a little too large with 413. */
#define OVERSIZE_SLACK ((size_t)64 << 10)

struct wxg_httpd_s {
    struct MHD_Daemon *daemon;
    wxg_metrics_t *metrics;
    wxg_httpd_ready_fn ready;
    void *ready_opaque;
    int port;
    /* Application routes (handler NULL: none). */
    wxg_httpd_handler_fn handler;
    void *handler_opaque;
    char *prefix;
    size_t prefix_len;
    size_t max_body;
    unsigned max_inflight;
    atomic_uint inflight;
    wxg_metric_t *refused_busy;
    wxg_metric_t *refused_large;
    /* While MHD_start_daemon runs, messages logged on the starting thread are also kept here so
     * that the error string can say why the start failed. */
    pthread_t starter;
    atomic_int starting;
    char start_err[256];
};

static void mhd_logger(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    wxg_httpd_t *h = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    if (h->starting && pthread_equal(pthread_self(), h->starter))
        snprintf(h->start_err, sizeof h->start_err, "%s", msg);
    wxg_log(WXG_LOG_WARN, "httpd_error", WXG_LS("msg", msg));
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, mode);
    if (resp == NULL) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO; /* libmicrohttpd closes the connection */
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned status, const char *text)
{
    return reply(conn, status, "text/plain; charset=utf-8", (void *)(uintptr_t)text, strlen(text),
                 MHD_RESPMEM_PERSISTENT);
}

/* One application request between its first and its last call of handle(). */
typedef struct reqctx {
    int counted; /* holds an in-flight slot */
    int too_big; /* over the cap: the rest of the body is discarded, then 413 */
    char *body;
    size_t len;
    size_t cap;
    size_t received; /* every body byte, kept or discarded */
} reqctx;

struct wxg_httpd_req_s {
    struct MHD_Connection *conn;
    const char *method;
    const char *path;
    const char *body;
    size_t len;
};

const char *wxg_httpd_req_method(const wxg_httpd_req_t *req)
{
    return req->method;
}

const char *wxg_httpd_req_path(const wxg_httpd_req_t *req)
{
    return req->path;
}

const char *wxg_httpd_req_query(const wxg_httpd_req_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *wxg_httpd_req_header(const wxg_httpd_req_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const void *wxg_httpd_req_body(const wxg_httpd_req_t *req, size_t *len)
{
    if (len != NULL)
        *len = req->len;
    return req->body;
}

int wxg_httpd_resp_set(wxg_httpd_resp_t *resp, unsigned status, const char *content_type,
                       const void *body, size_t len)
{
    resp->status = status;
    resp->content_type = content_type;
    free(resp->body);
    resp->body = NULL;
    resp->body_len = 0;
    if (len == 0)
        return 0;
    resp->body = malloc(len);
    if (resp->body == NULL)
        return WXG_ENOMEM;
    memcpy(resp->body, body, len);
    resp->body_len = len;
    return 0;
}

int wxg_httpd_resp_header(wxg_httpd_resp_t *resp, const char *name, const char *value)
{
    if (resp->header_count >= WXG_HTTPD_RESP_MAX_HEADERS || strpbrk(name, "\r\n:") != NULL ||
        strpbrk(value, "\r\n") != NULL)
        return WXG_EINVAL;
    snprintf(resp->headers[resp->header_count].name, sizeof resp->headers[0].name, "%s", name);
    snprintf(resp->headers[resp->header_count].value, sizeof resp->headers[0].value, "%s", value);
    resp->header_count++;
    return 0;
}

static enum MHD_Result refuse(wxg_httpd_t *h, struct MHD_Connection *conn, unsigned status)
{
    struct MHD_Response *resp;
    const char *text =
        status == MHD_HTTP_CONTENT_TOO_LARGE ? "request body too large\n" : "busy, retry later\n";
    wxg_counter_inc(status == MHD_HTTP_CONTENT_TOO_LARGE ? h->refused_large : h->refused_busy);
    resp = MHD_create_response_from_buffer(strlen(text), (void *)(uintptr_t)text,
                                           MHD_RESPMEM_PERSISTENT);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    /* The body was not (fully) read, so the connection cannot carry another request. */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* The first call of an application request: admission (in-flight slot, declared size). */
static enum MHD_Result app_begin(wxg_httpd_t *h, struct MHD_Connection *conn, void **con_cls)
{
    reqctx *rc = calloc(1, sizeof *rc);
    if (rc == NULL)
        return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    *con_cls = rc; /* freed by completed(), whatever happens next */
    unsigned n = atomic_fetch_add(&h->inflight, 1) + 1;
    rc->counted = 1;
    if (n > h->max_inflight)
        return refuse(h, conn, MHD_HTTP_SERVICE_UNAVAILABLE);
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl != NULL) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        /* libmicrohttpd has already refused a malformed Content-Length. */
        if (end != cl && errno == 0 && v > h->max_body)
            return refuse(h, conn, MHD_HTTP_CONTENT_TOO_LARGE);
        if (end != cl && errno == 0 && v > 0) {
            rc->body = malloc((size_t)v + 1);
            if (rc->body == NULL)
                return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
            rc->cap = (size_t)v + 1;
        }
    }
    return MHD_YES;
}

/* A piece of the body. */
static enum MHD_Result app_data(wxg_httpd_t *h, reqctx *rc, const char *data, size_t n)
{
    rc->received += n;
    if (rc->too_big || rc->received > h->max_body) {
        if (!rc->too_big) {
            rc->too_big = 1;
            free(rc->body);
            rc->body = NULL;
            rc->len = rc->cap = 0;
        }
        /* Far beyond the cap: close rather than read on. */
        return rc->received - h->max_body > OVERSIZE_SLACK ? MHD_NO : MHD_YES;
    }
    if (rc->len + n + 1 > rc->cap) {
        size_t cap = rc->cap ? rc->cap : 4096;
        while (cap < rc->len + n + 1)
            cap *= 2;
        if (cap > h->max_body + 1)
            cap = h->max_body + 1;
        char *nb = realloc(rc->body, cap);
        if (nb == NULL)
            return MHD_NO;
        rc->body = nb;
        rc->cap = cap;
    }
    memcpy(rc->body + rc->len, data, n);
    rc->len += n;
    return MHD_YES;
}

/* The whole request is in: run the handler and send its answer. */
static enum MHD_Result app_end(wxg_httpd_t *h, struct MHD_Connection *conn, reqctx *rc,
                               const char *url, const char *method)
{
    if (rc->too_big)
        return refuse(h, conn, MHD_HTTP_CONTENT_TOO_LARGE);
    static char empty[1] = "";
    if (rc->body != NULL)
        rc->body[rc->len] = '\0';
    wxg_httpd_req_t req = {.conn = conn,
                           .method = method,
                           .path = url,
                           .body = rc->body != NULL ? rc->body : empty,
                           .len = rc->len};
    wxg_httpd_resp_t out;
    memset(&out, 0, sizeof out);
    out.status = MHD_HTTP_INTERNAL_SERVER_ERROR;
    h->handler(h->handler_opaque, &req, &out);
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        out.body_len, out.body != NULL ? out.body : empty,
        out.body != NULL ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) {
        free(out.body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            out.content_type != NULL ? out.content_type
                                                     : "text/plain; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    for (size_t i = 0; i < out.header_count && i < WXG_HTTPD_RESP_MAX_HEADERS; i++)
        MHD_add_response_header(resp, out.headers[i].name, out.headers[i].value);
    enum MHD_Result ret = MHD_queue_response(conn, out.status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Called by libmicrohttpd when a request is over (answered, failed or abandoned). */
static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    wxg_httpd_t *h = cls;
    (void)conn;
    (void)toe;
    reqctx *rc = *con_cls;
    if (rc == NULL)
        return;
    if (rc->counted)
        atomic_fetch_sub(&h->inflight, 1);
    free(rc->body);
    free(rc);
    *con_cls = NULL;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
    wxg_httpd_t *h = cls;
    (void)version;

    int builtin =
        strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0 || strcmp(url, "/metrics") == 0;
    if (!builtin && h->handler != NULL && strncmp(url, h->prefix, h->prefix_len) == 0) {
        reqctx *rc = *con_cls;
        if (rc == NULL)
            return app_begin(h, conn, con_cls);
        if (*upload_data_size > 0) {
            size_t n = *upload_data_size;
            *upload_data_size = 0;
            return app_data(h, rc, upload_data, n);
        }
        return app_end(h, conn, rc, url, method);
    }

    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n");

    if (strcmp(url, "/healthz") == 0)
        return reply_text(conn, MHD_HTTP_OK, "ok\n");

    if (strcmp(url, "/readyz") == 0) {
        char reason[REASON_MAX] = "";
        char body[REASON_MAX + 32];
        int ok = h->ready != NULL ? h->ready(h->ready_opaque, reason, sizeof reason) : 1;
        reason[sizeof reason - 1] = '\0';
        for (char *p = reason; *p; p++) {
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = ' '; /* one line, whatever the callback wrote */
        }
        if (ok)
            snprintf(body, sizeof body, reason[0] ? "ready: %s\n" : "ready\n", reason);
        else
            snprintf(body, sizeof body, "not ready: %s\n", reason[0] ? reason : "unspecified");
        return reply(conn, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                     "text/plain; charset=utf-8", body, strlen(body), MHD_RESPMEM_MUST_COPY);
    }

    if (strcmp(url, "/metrics") == 0) {
        char *text = NULL;
        size_t len = 0;
        if (h->metrics == NULL)
            return reply(conn, MHD_HTTP_OK, WXG_METRICS_CONTENT_TYPE, (void *)(uintptr_t) "", 0,
                         MHD_RESPMEM_PERSISTENT);
        if (wxg_metrics_render(h->metrics, &text, &len) != 0)
            return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
        return reply(conn, MHD_HTTP_OK, WXG_METRICS_CONTENT_TYPE, text, len, MHD_RESPMEM_MUST_FREE);
    }

    return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found\n");
}

wxg_httpd_t *wxg_httpd_start(const char *listen, wxg_metrics_t *metrics, wxg_httpd_ready_fn ready,
                             void *ready_opaque, char *errstr, size_t errstr_size)
{
    wxg_httpd_opts_t o = {.listen = listen,
                          .metrics = metrics,
                          .ready = ready,
                          .ready_opaque = ready_opaque,
                          .max_connections = CONN_LIMIT,
                          .conn_timeout_s = CONN_TIMEOUT_S};
    return wxg_httpd_start_opts(&o, errstr, errstr_size);
}

wxg_httpd_t *wxg_httpd_start_opts(const wxg_httpd_opts_t *o, char *errstr, size_t errstr_size)
{
    char host[256];
    int port = 0;
    struct addrinfo hints, *res = NULL;
    struct sockaddr_storage addr;
    wxg_httpd_t *h = NULL;
    const char *listen = o != NULL ? o->listen : NULL;

    if (o == NULL ||
        (o->handler != NULL && (o->handler_prefix == NULL || o->handler_prefix[0] != '/'))) {
        wxg__errf(errstr, errstr_size,
                  "invalid options: a handler needs a path prefix starting with /");
        return NULL;
    }
    if (listen == NULL || wxg_conf_parse_addr(listen, host, sizeof host, &port) != 0) {
        wxg__errf(errstr, errstr_size, "invalid listen address \"%.64s\" (expected host:port)",
                  listen != NULL ? listen : "");
        return NULL;
    }
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai != 0 || res == NULL) {
        wxg__errf(errstr, errstr_size, "cannot resolve %s: %s", host, gai_strerror(gai));
        goto fail;
    }
    memset(&addr, 0, sizeof addr);
    memcpy(&addr, res->ai_addr, res->ai_addrlen);
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (o->handler != NULL)
        flags |= MHD_USE_THREAD_PER_CONNECTION;
    if (addr.ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)&addr)->sin6_port = htons((uint16_t)port);
        flags |= MHD_USE_IPv6;
    } else {
        ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)port);
    }

    h = calloc(1, sizeof *h);
    if (h == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    h->metrics = o->metrics;
    h->ready = o->ready;
    h->ready_opaque = o->ready_opaque;
    h->handler = o->handler;
    h->handler_opaque = o->handler_opaque;
    h->max_body = o->max_body ? o->max_body : DEFAULT_MAX_BODY;
    h->max_inflight = o->max_inflight ? o->max_inflight : DEFAULT_MAX_INFLIGHT;
    atomic_init(&h->inflight, 0);
    unsigned conns = o->max_connections;
    unsigned timeout_s = o->conn_timeout_s;
    if (h->handler != NULL) {
        h->prefix = strdup(o->handler_prefix);
        if (h->prefix == NULL) {
            wxg__errf(errstr, errstr_size, "out of memory");
            goto fail;
        }
        h->prefix_len = strlen(h->prefix);
        if (conns == 0)
            conns = 2 * h->max_inflight + 16;
        if (timeout_s == 0)
            timeout_s = DEFAULT_APP_TIMEOUT_S;
        h->refused_busy = wxg_metrics_counter(
            h->metrics, "wxg_httpd_refused_total",
            "Requests refused before their handler ran, by reason.", "reason", "busy", NULL);
        h->refused_large = wxg_metrics_counter(
            h->metrics, "wxg_httpd_refused_total",
            "Requests refused before their handler ran, by reason.", "reason", "too_large", NULL);
    } else {
        if (conns == 0)
            conns = CONN_LIMIT;
        if (timeout_s == 0)
            timeout_s = CONN_TIMEOUT_S;
    }
    h->starter = pthread_self();
    atomic_store(&h->starting, 1);
    /* With MHD_OPTION_SOCK_ADDR the port comes from `addr`; port 0 there lets the kernel pick. */
    h->daemon =
        MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER,
                         mhd_logger, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                         MHD_OPTION_CONNECTION_LIMIT, conns, MHD_OPTION_CONNECTION_TIMEOUT,
                         timeout_s, MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_END);
    if (h->daemon == NULL) {
        wxg__errf(errstr, errstr_size, "cannot listen on %s: %s", listen,
                  h->start_err[0] ? h->start_err : "address in use or not available");
        goto fail;
    }
    atomic_store(&h->starting, 0); /* later messages are logged only */
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info != NULL ? (int)info->port : port;
    freeaddrinfo(res);
    return h;
fail:
    if (res != NULL)
        freeaddrinfo(res);
    if (h != NULL && h->daemon != NULL)
        MHD_stop_daemon(h->daemon);
    if (h != NULL)
        free(h->prefix);
    free(h);
    return NULL;
}

int wxg_httpd_port(const wxg_httpd_t *h)
{
    return h != NULL ? h->port : -1;
}

void wxg_httpd_stop(wxg_httpd_t *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->daemon);
    free(h->prefix);
    free(h);
}
