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
 * mutable state after start-up is the in-flight counter (an atomic), the log limiter (atomics)
 * and the connection records, which conns_lock guards: a connection's thread updates its own
 * record at each step of a request, the watchdog reads them all.
 *
 * Limits: a connection limit and an idle timeout, so a slow or hostile client cannot pin the
 * server. For application routes also: a body cap checked against Content-Length before any byte
 * is read and against the bytes received (a chunked upload), and at most max_inflight requests
 * between their first byte and their answer; the one over the limit is answered 503 at once.
 * A request holds its in-flight slot until libmicrohttpd reports it completed, so a slot cannot
 * leak when a client disconnects mid-body. Built-in paths never read a body. At the connection
 * limit libmicrohttpd itself accepts and closes every further connection at once.
 *
 * The request deadline: libmicrohttpd 0.9.75's idle timeout restarts at every byte received, so
 * a client sending one byte a second (headers or body) is never cut by it, and its header
 * buffer (MHD_OPTION_CONNECTION_MEMORY_LIMIT, 32 KiB) bounds the size of the headers, not their
 * duration. So this module keeps a record of every connection (MHD_OPTION_NOTIFY_CONNECTION) and
 * a watchdog thread that, a few times per deadline, looks at each one: a request's clock starts
 * when the kernel has received more bytes on the socket (TCP_INFO tcpi_bytes_received) than the
 * connection's earlier requests took, and a request still not received whole after
 * request_timeout_ms has its socket shut down; libmicrohttpd then sees the end of the stream
 * and closes the connection as a client abort. The clock stops when the request is in (the
 * handler's wait for Kafka is the program's budget, not the client's) and restarts with the
 * next request, so an idle keep-alive connection is left to the idle timeout. libmicrohttpd
 * reports a connection closed before it closes the descriptor, and the record is removed under
 * the same lock the watchdog holds, so a shut-down descriptor is never one reused by another
 * connection.
 *
 * Framing: the same byte count tells, when a request is answered, whether the client sent more
 * than the request (a body longer than its Content-Length, or pipelined requests). Such a
 * request is answered with Connection: close, so the rest is never read as a request of its own;
 * a chunked body's framing is not counted, so a chunked request's connection is closed after
 * its answer too. Two Content-Length values that differ, a Content-Length beside
 * Transfer-Encoding (request smuggling through a proxy that reads the other one) and a transfer
 * coding other than chunked are refused before the body is read.
 *
 * Logging: libmicrohttpd logs one line per refused or broken connection, which a flood turns
 * into a flood of lines; at most LOG_PER_SECOND lines a second are written, the next one says
 * how many were dropped.
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
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

/* struct tcp_info with tcpi_bytes_received; glibc's netinet/tcp.h lacks that field. */
#include <linux/tcp.h>
#include <microhttpd.h>

#include "clock_int.h"
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
/* The watchdog looks at every connection this many times per request deadline, within these
 * bounds (ms): a request is cut at most two looks after its deadline. */
#define WATCH_PER_DEADLINE 8
#define WATCH_MIN_MS       25
#define WATCH_MAX_MS       500
#define LOG_PER_SECOND     10

/* One connection, from its acceptance to its close (libmicrohttpd's socket context). The fields
 * after fd are guarded by the server's conns_lock. */
typedef struct connctx {
    struct connctx *prev, *next;
    int fd;
    uint64_t consumed;  /* bytes of the connection's earlier requests, head and body */
    uint64_t req_bytes; /* bytes of the current request so far: its head, then its body */
    int64_t first_ms;   /* when the current request's first byte was seen; 0: not yet */
    int answering;      /* the request is in: the clock is stopped until it completes */
    int unsized;        /* a chunked body, whose framing bytes are not counted */
    int cut;            /* shut down by the watchdog */
} connctx;

struct wxg_httpd_s {
    struct MHD_Daemon *daemon;
    wxg_metrics_t *metrics;
    wxg_httpd_ready_fn ready;
    void *ready_opaque;
    int port;
    /* Application routes (handler NULL: none). */
    wxg_httpd_handler_fn handler;
    void *handler_opaque;
    int no_builtin; /* the built-in paths are someone else's: route them like any path */
    char *prefix;
    size_t prefix_len;
    size_t max_body;
    unsigned max_inflight;
    atomic_uint inflight;
    wxg_metric_t *refused_busy;
    wxg_metric_t *refused_large;
    wxg_metric_t *refused_framing;
    wxg_metric_t *closed_deadline;
    wxg_metric_t *closed_extra;
    /* Connection records and the watchdog. */
    pthread_mutex_t conns_lock;
    pthread_cond_t wake;
    connctx *conns;
    int64_t deadline_ms;
    int stopping;
    int watching; /* the watchdog thread runs */
    pthread_t watchdog;
    /* The log limiter: the current second, lines written in it, lines dropped since the last
     * one written. */
    atomic_llong log_second;
    atomic_uint log_lines;
    atomic_uint log_dropped;
    /* While MHD_start_daemon runs, messages logged on the starting thread are also kept here so
     * that the error string can say why the start failed. */
    pthread_t starter;
    atomic_int starting;
    char start_err[256];
};

static void mhd_logger(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* 1 when one more line may be logged this second; *dropped is then the number of lines dropped
 * before it. Approximate under races, which only moves a line from one second to the next. */
static int log_allowed(wxg_httpd_t *h, unsigned *dropped)
{
    long long sec = (long long)(wxg__mono_ms() / 1000);
    long long seen = atomic_load(&h->log_second);
    if (seen != sec && atomic_compare_exchange_strong(&h->log_second, &seen, sec))
        atomic_store(&h->log_lines, 0);
    if (atomic_fetch_add(&h->log_lines, 1) >= LOG_PER_SECOND) {
        atomic_fetch_add(&h->log_dropped, 1);
        return 0;
    }
    *dropped = atomic_exchange(&h->log_dropped, 0);
    return 1;
}

static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    wxg_httpd_t *h = cls;
    char msg[512];
    unsigned dropped = 0;
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    if (h->starting && pthread_equal(pthread_self(), h->starter))
        snprintf(h->start_err, sizeof h->start_err, "%s", msg);
    if (!log_allowed(h, &dropped))
        return;
    if (dropped > 0)
        wxg_log(WXG_LOG_WARN, "httpd_error", WXG_LS("msg", msg), WXG_LU("dropped", dropped));
    else
        wxg_log(WXG_LOG_WARN, "httpd_error", WXG_LS("msg", msg));
}

/* ---- connection records and the request deadline ------------------------------------------ */

/* The bytes the kernel has received on socket fd since it was opened, read or not (a FIN
 * counts as one: it takes a sequence number). */
static int bytes_received(int fd, uint64_t *out)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return -1;
    *out = ti.tcpi_bytes_received;
    return 0;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    wxg_httpd_t *h = cls;
    connctx *cc = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        cc = calloc(1, sizeof *cc);
        *socket_context = cc;
        if (cc == NULL) /* untracked: only the idle timeout applies to it */
            return;
        cc->fd = ci != NULL ? ci->connect_fd : -1;
        pthread_mutex_lock(&h->conns_lock);
        cc->next = h->conns;
        if (h->conns != NULL)
            h->conns->prev = cc;
        h->conns = cc;
        pthread_mutex_unlock(&h->conns_lock);
        return;
    }
    if (cc == NULL)
        return;
    /* Called before libmicrohttpd closes the descriptor. */
    pthread_mutex_lock(&h->conns_lock);
    if (cc->prev != NULL)
        cc->prev->next = cc->next;
    else
        h->conns = cc->next;
    if (cc->next != NULL)
        cc->next->prev = cc->prev;
    pthread_mutex_unlock(&h->conns_lock);
    free(cc);
    *socket_context = NULL;
}

static connctx *conn_record(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

/* A request's head is in (the first handler call); `answering`: it is answered at once. */
static void track_head(wxg_httpd_t *h, struct MHD_Connection *conn, int answering)
{
    connctx *cc = conn_record(conn);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (cc == NULL)
        return;
    pthread_mutex_lock(&h->conns_lock);
    cc->req_bytes = ci != NULL ? ci->header_size : 0;
    cc->answering = answering;
    pthread_mutex_unlock(&h->conns_lock);
}

static void track_body(wxg_httpd_t *h, struct MHD_Connection *conn, size_t n, int unsized)
{
    connctx *cc = conn_record(conn);
    if (cc == NULL)
        return;
    pthread_mutex_lock(&h->conns_lock);
    cc->req_bytes += n;
    cc->unsized |= unsized;
    pthread_mutex_unlock(&h->conns_lock);
}

/* The request is in and about to be answered: stops its clock. Returns 1 when the connection
 * must close after the answer, because the client sent more than this request or the request's
 * size on the wire is not known (chunked); `extra` says which. */
static int track_answer(wxg_httpd_t *h, struct MHD_Connection *conn, int *extra)
{
    connctx *cc = conn_record(conn);
    uint64_t rx = 0;
    int close_after = 0;
    *extra = 0;
    if (cc == NULL)
        return 0;
    int known = bytes_received(cc->fd, &rx) == 0;
    pthread_mutex_lock(&h->conns_lock);
    cc->answering = 1;
    /* One more is the client's FIN (it takes a sequence number): a client that closes while
     * waiting is no reason to count, and one byte is no request. */
    *extra = known && rx > cc->consumed + cc->req_bytes + 1 && !cc->unsized;
    close_after = *extra || cc->unsized;
    pthread_mutex_unlock(&h->conns_lock);
    return close_after;
}

/* The request is over: the next one's clock starts at its first byte. */
static void track_done(wxg_httpd_t *h, struct MHD_Connection *conn)
{
    connctx *cc = conn != NULL ? conn_record(conn) : NULL;
    if (cc == NULL)
        return;
    pthread_mutex_lock(&h->conns_lock);
    cc->consumed += cc->req_bytes;
    cc->req_bytes = 0;
    cc->first_ms = 0;
    cc->answering = 0;
    cc->unsized = 0;
    pthread_mutex_unlock(&h->conns_lock);
}

/* One look at every connection, under conns_lock. */
static void watch_once(wxg_httpd_t *h, int64_t now)
{
    unsigned cut = 0;
    for (connctx *cc = h->conns; cc != NULL; cc = cc->next) {
        uint64_t rx = 0;
        if (cc->answering || cc->cut)
            continue;
        if (cc->first_ms == 0) {
            /* Without the byte count the clock starts now: stricter, never looser. */
            if (bytes_received(cc->fd, &rx) != 0 || rx > cc->consumed)
                cc->first_ms = now;
            continue;
        }
        if (now - cc->first_ms >= h->deadline_ms) {
            shutdown(cc->fd, SHUT_RDWR);
            cc->cut = 1;
            cut++;
        }
    }
    if (cut > 0) {
        unsigned dropped = 0;
        wxg_counter_add(h->closed_deadline, cut);
        if (!log_allowed(h, &dropped))
            return;
        if (dropped > 0)
            wxg_log(WXG_LOG_WARN, "httpd_deadline", WXG_LU("connections", cut),
                    WXG_LI("deadline_ms", h->deadline_ms), WXG_LU("dropped", dropped));
        else
            wxg_log(WXG_LOG_WARN, "httpd_deadline", WXG_LU("connections", cut),
                    WXG_LI("deadline_ms", h->deadline_ms));
    }
}

static void *watchdog_main(void *arg)
{
    wxg_httpd_t *h = arg;
    int64_t tick = h->deadline_ms / WATCH_PER_DEADLINE;
    if (tick < WATCH_MIN_MS)
        tick = WATCH_MIN_MS;
    if (tick > WATCH_MAX_MS)
        tick = WATCH_MAX_MS;
    pthread_mutex_lock(&h->conns_lock);
    while (!h->stopping) {
        watch_once(h, wxg__mono_ms());
        struct timespec ts = wxg__mono_after(tick);
        pthread_cond_timedwait(&h->wake, &h->conns_lock, &ts);
    }
    pthread_mutex_unlock(&h->conns_lock);
    return NULL;
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
    const char *text = "busy, retry later\n";
    wxg_metric_t *counter = h->refused_busy;
    if (status == MHD_HTTP_CONTENT_TOO_LARGE) {
        text = "request body too large\n";
        counter = h->refused_large;
    } else if (status == MHD_HTTP_BAD_REQUEST) {
        text = "ambiguous body length (Content-Length and Transfer-Encoding)\n";
        counter = h->refused_framing;
    } else if (status == MHD_HTTP_NOT_IMPLEMENTED) {
        text = "transfer coding not supported (only chunked)\n";
        counter = h->refused_framing;
    }
    wxg_counter_inc(counter);
    int extra = 0;
    (void)track_answer(h, conn, &extra);
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

/* Content-Length and Transfer-Encoding headers of a request, every copy. */
typedef struct framing {
    unsigned lengths, codings;
    const char *length;
    int lengths_differ;
} framing;

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    framing *f = cls;
    (void)kind;
    if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0)
        f->codings++;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) != 0 || value == NULL)
        return MHD_YES;
    if (f->lengths++ == 0)
        f->length = value;
    else if (strcmp(value, f->length) != 0)
        f->lengths_differ = 1;
    return MHD_YES;
}

/* 0 when the body's length is unambiguous, else the status to refuse the request with.
 * libmicrohttpd 0.9.75 reads the first Content-Length and lets Transfer-Encoding win over it,
 * silently; a proxy in front may read the other one, so neither is trusted. *chunked is set. */
static unsigned framing_error(struct MHD_Connection *conn, int *chunked)
{
    framing f = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_header, &f);
    const char *te =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    *chunked = 0;
    if (f.lengths_differ || f.codings > 1 || (f.codings > 0 && f.lengths > 0))
        return MHD_HTTP_BAD_REQUEST;
    if (f.codings > 0 && (te == NULL || strcasecmp(te, "chunked") != 0))
        return MHD_HTTP_NOT_IMPLEMENTED;
    *chunked = f.codings > 0;
    return 0;
}

/* The first call of an application request: framing, admission (in-flight slot, declared
 * size). */
static enum MHD_Result app_begin(wxg_httpd_t *h, struct MHD_Connection *conn, void **con_cls)
{
    int chunked = 0;
    reqctx *rc = calloc(1, sizeof *rc);
    if (rc == NULL)
        return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    *con_cls = rc; /* freed by completed(), whatever happens next */
    track_head(h, conn, 0);
    unsigned bad = framing_error(conn, &chunked);
    if (bad != 0)
        return refuse(h, conn, bad);
    track_body(h, conn, 0, chunked);
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
static enum MHD_Result app_data(wxg_httpd_t *h, struct MHD_Connection *conn, reqctx *rc,
                                const char *data, size_t n)
{
    track_body(h, conn, n, 0);
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
    /* Looked at after the handler, so that bytes sent while it waited count too: they were
     * sent before the answer, so they are not the next request of a client that waits for it. */
    int extra = 0;
    int close_after = track_answer(h, conn, &extra);
    if (extra)
        wxg_counter_inc(h->closed_extra);
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
    if (close_after)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(conn, out.status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Called by libmicrohttpd when a request is over (answered, failed or abandoned). */
static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    wxg_httpd_t *h = cls;
    (void)toe;
    track_done(h, conn);
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

    int builtin = !h->no_builtin && (strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0 ||
                                     strcmp(url, "/metrics") == 0);
    if (!builtin && h->handler != NULL && strncmp(url, h->prefix, h->prefix_len) == 0) {
        reqctx *rc = *con_cls;
        if (rc == NULL)
            return app_begin(h, conn, con_cls);
        if (*upload_data_size > 0) {
            size_t n = *upload_data_size;
            *upload_data_size = 0;
            return app_data(h, conn, rc, upload_data, n);
        }
        return app_end(h, conn, rc, url, method);
    }
    track_head(h, conn, 1); /* built-in paths answer at once */

    if (h->no_builtin) /* outside the prefix, and the built-in paths are not served here */
        return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found\n");
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

/* The counters of a server with application routes. The registry of a server without them is
 * the program's own list of figures (a deadline cut there is logged only). */
static void register_counters(wxg_httpd_t *h)
{
    static const char refused[] = "Requests refused before their handler ran, by reason.";
    static const char closed[] = "Connections closed by the server, by reason: a request not "
                                 "received whole within the deadline, or more bytes than the "
                                 "request.";
    h->refused_busy =
        wxg_metrics_counter(h->metrics, "wxg_httpd_refused_total", refused, "reason", "busy", NULL);
    h->refused_large = wxg_metrics_counter(h->metrics, "wxg_httpd_refused_total", refused, "reason",
                                           "too_large", NULL);
    h->refused_framing = wxg_metrics_counter(h->metrics, "wxg_httpd_refused_total", refused,
                                             "reason", "bad_framing", NULL);
    h->closed_deadline = wxg_metrics_counter(h->metrics, "wxg_httpd_closed_total", closed, "reason",
                                             "deadline", NULL);
    h->closed_extra = wxg_metrics_counter(h->metrics, "wxg_httpd_closed_total", closed, "reason",
                                          "extra_bytes", NULL);
}

/* The lock and the condition variable (on the monotonic clock) of the watchdog. */
static int lock_init(wxg_httpd_t *h)
{
    pthread_condattr_t ca;
    if (pthread_mutex_init(&h->conns_lock, NULL) != 0)
        return WXG_ENOMEM;
    if (pthread_condattr_init(&ca) != 0)
        goto fail_attr;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&h->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        goto fail_attr;
    return 0;
fail_attr:
    pthread_mutex_destroy(&h->conns_lock);
    return WXG_ENOMEM;
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

/* Resolves o->listen into *addr (with its port in it too) and the daemon flags it needs. 0, or
 * -1 with errstr filled. */
static int listen_addr(const wxg_httpd_opts_t *o, struct sockaddr_storage *addr, int *port,
                       unsigned *flags, char *errstr, size_t errstr_size)
{
    char host[256];
    if (o->listen == NULL || wxg_conf_parse_addr(o->listen, host, sizeof host, port) != 0) {
        wxg__errf(errstr, errstr_size, "invalid listen address \"%.64s\" (expected host:port)",
                  o->listen != NULL ? o->listen : "");
        return -1;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai != 0 || res == NULL) {
        wxg__errf(errstr, errstr_size, "cannot resolve %s: %s", host, gai_strerror(gai));
        if (res != NULL)
            freeaddrinfo(res);
        return -1;
    }
    memset(addr, 0, sizeof *addr);
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    *flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (o->handler != NULL)
        *flags |= MHD_USE_THREAD_PER_CONNECTION;
    if (addr->ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)addr)->sin6_port = htons((uint16_t)*port);
        *flags |= MHD_USE_IPv6;
    } else {
        ((struct sockaddr_in *)addr)->sin_port = htons((uint16_t)*port);
    }
    return 0;
}

/* A handle with the options' settings and its lock; NULL when out of memory. */
static wxg_httpd_t *httpd_alloc(const wxg_httpd_opts_t *o)
{
    wxg_httpd_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    h->metrics = o->metrics;
    h->ready = o->ready;
    h->ready_opaque = o->ready_opaque;
    h->handler = o->handler;
    h->handler_opaque = o->handler_opaque;
    h->no_builtin = o->no_builtin_paths != 0;
    h->max_body = o->max_body ? o->max_body : DEFAULT_MAX_BODY;
    h->max_inflight = o->max_inflight ? o->max_inflight : DEFAULT_MAX_INFLIGHT;
    atomic_init(&h->inflight, 0);
    atomic_init(&h->log_second, 0);
    atomic_init(&h->log_lines, 0);
    atomic_init(&h->log_dropped, 0);
    if (lock_init(h) != 0) {
        free(h);
        return NULL;
    }
    return h;
}

/* The connection limit and timeout, defaults filled in, and the request deadline: an
 * application server (one with a handler) scales them with max_inflight and registers its
 * counters; the operations server keeps small ones. 0, or WXG_ENOMEM. */
static int serve_limits(wxg_httpd_t *h, const wxg_httpd_opts_t *o, unsigned *conns,
                        unsigned *timeout_s)
{
    *conns = o->max_connections;
    *timeout_s = o->conn_timeout_s;
    if (h->handler != NULL) {
        h->prefix = strdup(o->handler_prefix);
        if (h->prefix == NULL)
            return WXG_ENOMEM;
        h->prefix_len = strlen(h->prefix);
        if (*conns == 0)
            *conns = 2 * h->max_inflight + 16;
        if (*timeout_s == 0)
            *timeout_s = DEFAULT_APP_TIMEOUT_S;
        register_counters(h);
    } else {
        if (*conns == 0)
            *conns = CONN_LIMIT;
        if (*timeout_s == 0)
            *timeout_s = CONN_TIMEOUT_S;
    }
    h->deadline_ms =
        o->request_timeout_ms ? (int64_t)o->request_timeout_ms : (int64_t)*timeout_s * 1000;
    return 0;
}

wxg_httpd_t *wxg_httpd_start_opts(const wxg_httpd_opts_t *o, char *errstr, size_t errstr_size)
{
    if (o == NULL ||
        (o->handler != NULL && (o->handler_prefix == NULL || o->handler_prefix[0] != '/'))) {
        wxg__errf(errstr, errstr_size,
                  "invalid options: a handler needs a path prefix starting with /");
        return NULL;
    }
    struct sockaddr_storage addr;
    int port = 0;
    unsigned flags = 0, conns = 0, timeout_s = 0;
    if (listen_addr(o, &addr, &port, &flags, errstr, errstr_size) != 0)
        return NULL;
    wxg_httpd_t *h = httpd_alloc(o);
    if (h == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    if (serve_limits(h, o, &conns, &timeout_s) != 0) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    h->starter = pthread_self();
    atomic_store(&h->starting, 1);
    /* With MHD_OPTION_SOCK_ADDR the port comes from `addr`; port 0 there lets the kernel pick. */
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, h,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT, conns,
        MHD_OPTION_CONNECTION_TIMEOUT, timeout_s, MHD_OPTION_NOTIFY_COMPLETED, completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
    if (h->daemon == NULL) {
        wxg__errf(errstr, errstr_size, "cannot listen on %s: %s", o->listen,
                  h->start_err[0] ? h->start_err : "address in use or not available");
        goto fail;
    }
    atomic_store(&h->starting, 0); /* later messages are logged only */
    if (pthread_create(&h->watchdog, NULL, watchdog_main, h) != 0) {
        wxg__errf(errstr, errstr_size, "cannot start the request deadline's thread");
        goto fail;
    }
    h->watching = 1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info != NULL ? (int)info->port : port;
    return h;
fail:
    if (h->daemon != NULL)
        MHD_stop_daemon(h->daemon);
    free(h->prefix);
    pthread_cond_destroy(&h->wake);
    pthread_mutex_destroy(&h->conns_lock);
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
    /* The daemon first: it closes every connection, and each record with it. */
    MHD_stop_daemon(h->daemon);
    if (h->watching) {
        pthread_mutex_lock(&h->conns_lock);
        h->stopping = 1;
        pthread_cond_signal(&h->wake);
        pthread_mutex_unlock(&h->conns_lock);
        pthread_join(h->watchdog, NULL);
    }
    pthread_cond_destroy(&h->wake);
    pthread_mutex_destroy(&h->conns_lock);
    free(h->prefix);
    free(h);
}
