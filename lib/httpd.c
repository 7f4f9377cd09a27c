/*
 * DESIGN: the operations HTTP server.
 *
 * Purpose: serve /metrics, /healthz and /readyz for both programs with libmicrohttpd, a small
 * HTTP library maintained for a long time and packaged by Debian, rather than hand-written HTTP
 * parsing on a port that may be reachable from a network.
 *
 * Threads: libmicrohttpd runs one internal polling thread that accepts connections and calls
 * handle() for each request. handle() only reads the registry (which locks itself) and calls the
 * readiness callback, whose thread-safety the caller guarantees; this module keeps no mutable
 * state after start-up, so it has no lock of its own.
 *
 * Limits: at most CONN_LIMIT connections at once and CONN_TIMEOUT_S seconds of idleness per
 * connection, so a slow or hostile client cannot pin the server. Request bodies are never read.
 *
 * Failure modes: a bad address or a failed bind returns NULL with the reason; a render that runs
 * out of memory answers 500; libmicrohttpd's own error messages go to the log.
 */
#include "wxguard/httpd.h"

#include <arpa/inet.h>
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

#include "wxguard/conf.h"
#include "wxguard/log.h"

#define CONN_LIMIT     64
#define CONN_TIMEOUT_S 10
#define REASON_MAX     256

struct wxg_httpd_s {
    struct MHD_Daemon *daemon;
    wxg_metrics_t *metrics;
    wxg_httpd_ready_fn ready;
    void *ready_opaque;
    int port;
    /* While MHD_start_daemon runs, messages logged on the starting thread are also kept here so
     * that the error string can say why the start failed. */
    pthread_t starter;
    atomic_int starting;
    char start_err[256];
};

static void errf(char *errstr, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void errf(char *errstr, size_t size, const char *fmt, ...)
{
    if (errstr == NULL || size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, size, fmt, ap);
    va_end(ap);
}

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

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
    wxg_httpd_t *h = cls;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)con_cls;

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
    char host[256];
    int port = 0;
    struct addrinfo hints, *res = NULL;
    struct sockaddr_storage addr;
    wxg_httpd_t *h = NULL;

    if (listen == NULL || wxg_conf_parse_addr(listen, host, sizeof host, &port) != 0) {
        errf(errstr, errstr_size, "invalid listen address \"%.64s\" (expected host:port)",
             listen != NULL ? listen : "");
        return NULL;
    }
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai != 0 || res == NULL) {
        errf(errstr, errstr_size, "cannot resolve %s: %s", host, gai_strerror(gai));
        goto fail;
    }
    memset(&addr, 0, sizeof addr);
    memcpy(&addr, res->ai_addr, res->ai_addrlen);
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (addr.ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)&addr)->sin6_port = htons((uint16_t)port);
        flags |= MHD_USE_IPv6;
    } else {
        ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)port);
    }

    h = calloc(1, sizeof *h);
    if (h == NULL) {
        errf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    h->metrics = metrics;
    h->ready = ready;
    h->ready_opaque = ready_opaque;
    h->starter = pthread_self();
    atomic_store(&h->starting, 1);
    /* With MHD_OPTION_SOCK_ADDR the port comes from `addr`; port 0 there lets the kernel pick. */
    h->daemon =
        MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER,
                         mhd_logger, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONN_LIMIT,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S, MHD_OPTION_END);
    if (h->daemon == NULL) {
        errf(errstr, errstr_size, "cannot listen on %s: %s", listen,
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
    free(h);
}
