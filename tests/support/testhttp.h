/*
 * Test support: a minimal HTTP/1.1 client over a plain loopback socket.
 *
 * One request per connection (Connection: close), the whole answer read until the server closes
 * or the timeout (5 s times wxg_test_scale()) passes. Enough for tests of wxguard's own HTTP
 * servers; not a general client (no redirects, the answer is read as one buffer).
 *
 * Thread-safe: no shared state, so tests may send requests from several threads at once.
 */
#ifndef WXG_TESTHTTP_H
#define WXG_TESTHTTP_H

#include <stddef.h>
#include <stdint.h>

/* An answer. headers holds the status line and header lines (CRLF-separated, NUL-terminated);
 * body is NUL-terminated, body_len excludes the terminator. Free with wxg_test_http_free(). */
typedef struct wxg_test_http_resp {
    int status;
    char *headers;
    char *body;
    size_t body_len;
} wxg_test_http_resp_t;

/* Sends `method` `target` (path and query) to 127.0.0.1:port with `extra_headers` (zero or more
 * complete "Name: value\r\n" lines, may be NULL) and body_len bytes of body (a Content-Length is
 * added whenever body is not NULL). Returns 0 and fills *out, or -1 when the connection failed
 * or no complete answer came (then *out is empty). */
int wxg_test_http(int port, const char *method, const char *target, const char *extra_headers,
                  const void *body, size_t body_len, wxg_test_http_resp_t *out);

/* Sends `raw` (a complete request written by the caller, e.g. with chunked encoding) and reads
 * the answer as wxg_test_http() does. A server that closes the connection without an answer gives
 * -1. */
int wxg_test_http_raw(int port, const void *raw, size_t raw_len, wxg_test_http_resp_t *out);

/* The value of header `name` (case-insensitive) in resp, copied into buf; NULL when absent. */
const char *wxg_test_http_header(const wxg_test_http_resp_t *resp, const char *name, char *buf,
                                 size_t size);

void wxg_test_http_free(wxg_test_http_resp_t *resp);

/* GETs path; returns the status (0 when the server did not answer) and, when body is not NULL,
 * the body in *body (caller frees; NULL when the server did not answer). */
int wxg_test_http_get(int port, const char *path, char **body);

/* Polls path until it answers `status`, for at most timeout_ms (scaled). Returns 1 on success,
 * with the body of that answer in *body when body is not NULL (caller frees); 0 otherwise. */
int wxg_test_http_wait_status(int port, const char *path, int status, int64_t timeout_ms,
                              char **body);

/* The value of the sample `series` (name with its labels exactly as rendered) in a Prometheus
 * text body, or -1 when absent. */
double wxg_test_metric_sample(const char *body, const char *series);

/* One scrape of /metrics on port: the value of `series`, or -1 when absent or when the server
 * did not answer 200. */
double wxg_test_metric_scrape(int port, const char *series);

/* Scrapes /metrics on port until `series` equals `want`, for at most timeout_ms (scaled).
 * Returns 1 when it did, 0 otherwise. */
int wxg_test_metric_wait(int port, const char *series, double want, int64_t timeout_ms);

#endif /* WXG_TESTHTTP_H */
