/*
 * The operations HTTP server: /metrics, /healthz and /readyz.
 *
 *   GET /metrics  200, the registry in the Prometheus text format 0.0.4
 *   GET /healthz  200 "ok" whenever the process can answer at all
 *   GET /readyz   200 "ready" or 503 "not ready: <reason>" from the readiness callback
 * Other paths get 404, other methods 405 (HEAD is answered like GET, without the body).
 *
 * The server runs on its own thread (libmicrohttpd's internal polling thread), so a scrape
 * never waits for a worker and a stuck worker never hides the metrics.
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

/* The TCP port actually bound (useful after asking for port 0). */
WXG_EXPORT int wxg_httpd_port(const wxg_httpd_t *httpd);

/* Stops the server, waits for its thread and frees it. Accepts NULL. */
WXG_EXPORT void wxg_httpd_stop(wxg_httpd_t *httpd);

#endif /* WXGUARD_HTTPD_H */
