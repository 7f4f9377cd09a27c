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

#endif /* WXG_TESTHTTP_H */
