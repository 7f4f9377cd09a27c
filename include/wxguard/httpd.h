/*
 * The operations HTTP server: /metrics, /healthz and /readyz.
 *
 *   GET /metrics  200, the registry in the Prometheus text format 0.0.4
 *   GET /healthz  200 "ok" whenever the process can answer at all
 *   GET /readyz   200 "ready" or 503 "not ready: <reason>" from the readiness callback
 * Other paths get 404, other methods 405 (HEAD is answered like GET, without the body).
 *
 * The server runs on its own thread (libmicrohttpd's internal polling thread), so a scrape
 * never waits for a worker and a stuck worker never hides the metrics. A program may add routes
 * of its own (wxg_httpd_start_opts), which then share the port with the built-in paths, or
 * take the whole port (no_builtin_paths) when the built-in paths are served by another server.
 */
#ifndef WXGUARD_HTTPD_H
#define WXGUARD_HTTPD_H

#include <stddef.h>

#include "wxguard/common.h"
#include "wxguard/metrics.h"

typedef struct wxg_httpd_s wxg_httpd_t;

/* Decides readiness: returns 1 when ready, 0 when not, and may write a short reason (one line,
 * no secrets) to `reason`. Called on the server thread for every /readyz request, concurrently
 * with everything else in the program: it must be thread-safe, quick, and must not block. */
typedef int (*wxg_httpd_ready_fn)(void *opaque, char *reason, size_t reason_size);

/* Starts serving on `listen` ("host:port", "[v6]:port"; port 0 picks a free port, see
 * wxg_httpd_port). `metrics` (may be NULL: /metrics then serves an empty body) and `ready` (may be
 * NULL: always ready) must stay valid until wxg_httpd_stop() returns. Returns NULL with the reason
 * in errstr when the address is invalid or cannot be bound. */
WXG_EXPORT wxg_httpd_t *wxg_httpd_start(const char *listen, wxg_metrics_t *metrics,
                                        wxg_httpd_ready_fn ready, void *ready_opaque, char *errstr,
                                        size_t errstr_size);

/* ------------------------------------------------------------------------------------------ */
/* Application routes                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* A program may serve its own requests beside the built-in paths: every other path that starts
 * with `handler_prefix` (which may be "/") goes to `handler`, with the request body read in full
 * first. The server keeps the limits a public endpoint needs, before the handler runs:
 *   - a body larger than max_body is refused with 413, from Content-Length when the client sends
 *     one (nothing is read) and from the bytes actually received otherwise (chunked uploads); a
 *     client that keeps sending far beyond the cap has its connection closed;
 *   - at most max_inflight requests are inside the handler (or reading their body) at once; one
 *     more is answered 503 with Retry-After at once, so a gateway backs off and retries;
 *   - at most max_connections connections are open; connections idle for conn_timeout_s are
 *     closed;
 *   - the body's length must be unambiguous: two Content-Length headers that disagree, or a
 *     Content-Length beside Transfer-Encoding, are refused with 400, a transfer coding other
 *     than chunked with 501;
 *   - a request whose connection holds more bytes than the request when it is answered (a
 *     body longer than announced, or pipelined requests) is answered, then its connection is
 *     closed, so the extra bytes are never read as another request.
 * Every server, with or without application routes, also closes a connection whose request
 * (line, headers and body) has not arrived whole request_timeout_ms after its first byte: a
 * client that trickles a byte at a time resets the idle timeout at every byte and would
 * otherwise hold its connection for ever.
 * Refusals are counted in wxg_httpd_refused_total{reason} of `metrics`, connections closed for
 * the deadline or for extra bytes in wxg_httpd_closed_total{reason}. */

/* One request, as the handler sees it. Valid only during the handler call; read-only. */
typedef struct wxg_httpd_req_s wxg_httpd_req_t;

/* "GET", "POST", ... */
WXG_EXPORT const char *wxg_httpd_req_method(const wxg_httpd_req_t *req);
/* The path, without the query string, as sent (not percent-decoded). */
WXG_EXPORT const char *wxg_httpd_req_path(const wxg_httpd_req_t *req);
/* The percent-decoded value of query parameter `name`, or NULL when absent. */
WXG_EXPORT const char *wxg_httpd_req_query(const wxg_httpd_req_t *req, const char *name);
/* The value of request header `name` (case-insensitive), or NULL when absent. */
WXG_EXPORT const char *wxg_httpd_req_header(const wxg_httpd_req_t *req, const char *name);
/* The body and its length (never more than max_body). The pointer is non-NULL even for an empty
 * body; the bytes are followed by a NUL that is not counted. */
WXG_EXPORT const void *wxg_httpd_req_body(const wxg_httpd_req_t *req, size_t *len);

#define WXG_HTTPD_RESP_MAX_HEADERS 4

/* The answer the handler fills in. The server initialises it to status 500, no body. */
typedef struct wxg_httpd_resp {
    unsigned status;
    const char *content_type; /* a static string; NULL = "text/plain; charset=utf-8" */
    char *body;               /* malloc()ed; the server frees it. Set it with wxg_httpd_resp_set */
    size_t body_len;
    size_t header_count; /* extra headers, copied by the server */
    struct {
        char name[48];
        char value[208];
    } headers[WXG_HTTPD_RESP_MAX_HEADERS];
} wxg_httpd_resp_t;

/* Sets status, content type (static string or NULL) and a copy of len bytes of body (may be NULL
 * when len is 0), replacing an earlier body. Returns 0 or WXG_ENOMEM (the status is still set,
 * the body then empty). */
WXG_EXPORT int wxg_httpd_resp_set(wxg_httpd_resp_t *resp, unsigned status, const char *content_type,
                                  const void *body, size_t len);
/* Adds a header (name and value are cut to fit). WXG_EINVAL when the table is full or the value
 * holds CR or LF. */
WXG_EXPORT int wxg_httpd_resp_header(wxg_httpd_resp_t *resp, const char *name, const char *value);

/* Handles one request. Runs on the connection's own thread and may block (e.g. waiting for
 * Kafka); up to max_inflight calls run at once, so it must be thread-safe. */
typedef void (*wxg_httpd_handler_fn)(void *opaque, const wxg_httpd_req_t *req,
                                     wxg_httpd_resp_t *resp);

typedef struct wxg_httpd_opts {
    const char *listen; /* as for wxg_httpd_start */
    wxg_metrics_t *metrics;
    wxg_httpd_ready_fn ready;
    void *ready_opaque;
    wxg_httpd_handler_fn handler; /* NULL: only the built-in paths */
    void *handler_opaque;
    const char *handler_prefix;  /* e.g. "/v1/"; required with a handler */
    size_t max_body;             /* 0 = 1 MiB */
    unsigned max_inflight;       /* 0 = 64 */
    unsigned max_connections;    /* 0 = 2 * max_inflight + 16 */
    unsigned conn_timeout_s;     /* 0 = 30 */
    unsigned request_timeout_ms; /* 0 = conn_timeout_s */
    /* 1: /metrics, /healthz and /readyz are not served here; those paths go to the handler when
     * they match handler_prefix (404 otherwise), like any other path. For a public port whose
     * program serves the built-in paths on an operations port of its own. */
    int no_builtin_paths;
} wxg_httpd_opts_t;

/* Starts a server with application routes. With a handler, every connection gets a thread of its
 * own (so that a handler may block without stalling other connections); without one the server
 * runs on one polling thread, as wxg_httpd_start does. `opts` is read during the call only; the
 * objects it points to (metrics, callbacks' opaques) must outlive the server. NULL with errstr on
 * failure. */
WXG_EXPORT wxg_httpd_t *wxg_httpd_start_opts(const wxg_httpd_opts_t *opts, char *errstr,
                                             size_t errstr_size);

/* The TCP port actually bound (useful after asking for port 0). */
WXG_EXPORT int wxg_httpd_port(const wxg_httpd_t *httpd);

/* Stops the server, waits for its threads (a handler still running is waited for) and frees it.
 * Accepts NULL. */
WXG_EXPORT void wxg_httpd_stop(wxg_httpd_t *httpd);

#endif /* WXGUARD_HTTPD_H */
