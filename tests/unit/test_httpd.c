/* Unit tests for lib/httpd.c: a server on 127.0.0.1 port 0 answers /metrics, /healthz and
 * /readyz (both ways) to a plain HTTP client, refuses other paths and methods, and reports
 * the port it bound; application routes get the whole request, and the body cap and the
 * in-flight limit are enforced before the handler runs; a server told to leave the built-in
 * paths to another one routes them like any path (handler or 404); a client trickling its request a
 * byte at a time is cut by the request deadline, also on a server without application routes, while
 * others are answered. Loopback only; no external server is needed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wxguard/httpd.h"
#include "wxguard/metrics.h"
#include "testenv.h"
#include "testhttp.h"

typedef struct response {
    int status;
    char headers[2048];
    char body[8192];
} response;

/* Sends one request through the test HTTP client and copies the answer into r, whose fixed
 * buffers keep the assertions below free of cleanup. -1 when the exchange failed or the answer
 * does not fit. */
static int http_request(int port, const char *method, const char *path, response *r)
{
    wxg_test_http_resp_t resp;
    memset(r, 0, sizeof *r);
    if (wxg_test_http(port, method, path, NULL, NULL, 0, &resp) != 0)
        return -1;
    int rc = -1;
    size_t hl = strlen(resp.headers);
    if (hl < sizeof r->headers && resp.body_len < sizeof r->body) {
        r->status = resp.status;
        memcpy(r->headers, resp.headers, hl + 1);
        memcpy(r->body, resp.body, resp.body_len + 1);
        rc = 0;
    }
    wxg_test_http_free(&resp);
    return rc;
}

static atomic_int is_ready;

static int ready_cb(void *opaque, char *reason, size_t size)
{
    (void)opaque;
    if (atomic_load(&is_ready)) {
        snprintf(reason, size, "partitions assigned");
        return 1;
    }
    snprintf(reason, size, "partition 3 stalled at offset 17\nsecond line");
    return 0;
}

static void serves_metrics_health_and_readiness_on_a_free_port(void **state)
{
    (void)state;
    char err[256] = "";
    response r;
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_counter_add(wxg_metrics_counter(reg, "wxg_processed_total", "Processed.", NULL), 42);
    atomic_store(&is_ready, 1);
    wxg_httpd_t *h = wxg_httpd_start("127.0.0.1:0", reg, ready_cb, NULL, err, sizeof err);
    if (h == NULL)
        fail_msg("wxg_httpd_start: %s", err);
    int port = wxg_httpd_port(h);
    assert_true(port > 0 && port < 65536);

    assert_int_equal(http_request(port, "GET", "/metrics", &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.headers, "text/plain; version=0.0.4; charset=utf-8"));
    assert_string_equal(r.body, "# HELP wxg_processed_total Processed.\n"
                                "# TYPE wxg_processed_total counter\n"
                                "wxg_processed_total 42\n");

    assert_int_equal(http_request(port, "GET", "/healthz", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ok\n");

    assert_int_equal(http_request(port, "GET", "/readyz", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ready: partitions assigned\n");

    atomic_store(&is_ready, 0);
    assert_int_equal(http_request(port, "GET", "/readyz", &r), 0);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.body, "not ready: partition 3 stalled at offset 17 second line\n");
    /* Liveness does not depend on readiness. */
    assert_int_equal(http_request(port, "GET", "/healthz", &r), 0);
    assert_int_equal(r.status, 200);

    assert_int_equal(http_request(port, "GET", "/nope", &r), 0);
    assert_int_equal(r.status, 404);
    assert_int_equal(http_request(port, "POST", "/metrics", &r), 0);
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.headers, "Allow: GET, HEAD"));
    assert_int_equal(http_request(port, "HEAD", "/healthz", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "");

    /* The metrics served are current, not a snapshot taken at start. */
    wxg_counter_inc(wxg_metrics_counter(reg, "wxg_processed_total", "Processed.", NULL));
    assert_int_equal(http_request(port, "GET", "/metrics", &r), 0);
    assert_non_null(strstr(r.body, "wxg_processed_total 43\n"));

    wxg_httpd_stop(h);
    wxg_metrics_free(reg);
}

static void without_callback_or_registry_it_is_ready_and_empty(void **state)
{
    (void)state;
    char err[256] = "";
    response r;
    wxg_httpd_t *h = wxg_httpd_start("127.0.0.1:0", NULL, NULL, NULL, err, sizeof err);
    assert_non_null(h);
    assert_int_equal(http_request(wxg_httpd_port(h), "GET", "/readyz", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ready\n");
    assert_int_equal(http_request(wxg_httpd_port(h), "GET", "/metrics", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "");
    wxg_httpd_stop(h);
    wxg_httpd_stop(NULL);
}

static void bad_or_busy_addresses_are_refused_with_a_reason(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(wxg_httpd_start("localhost", NULL, NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "invalid listen address \"localhost\""));
    assert_null(wxg_httpd_start(NULL, NULL, NULL, NULL, err, sizeof err));

    wxg_httpd_t *a = wxg_httpd_start("127.0.0.1:0", NULL, NULL, NULL, err, sizeof err);
    assert_non_null(a);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", wxg_httpd_port(a));
    assert_null(wxg_httpd_start(addr, NULL, NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "cannot listen on 127.0.0.1:"));
    assert_non_null(strstr(err, "Address already in use"));
    wxg_httpd_stop(a);
}

typedef struct scraper {
    int port;
    int ok;
} scraper;

static void *scrape(void *arg)
{
    scraper *s = arg;
    response r;
    for (int i = 0; i < 20; i++) {
        if (http_request(s->port, "GET", "/metrics", &r) == 0 && r.status == 200 &&
            strstr(r.body, "# TYPE wxg_busy_total counter\n") != NULL)
            s->ok++;
    }
    return NULL;
}

static void concurrent_scrapes_while_counting_all_succeed(void **state)
{
    (void)state;
    char err[256] = "";
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_metric_t *c = wxg_metrics_counter(reg, "wxg_busy_total", "Busy.", NULL);
    wxg_httpd_t *h = wxg_httpd_start("127.0.0.1:0", reg, NULL, NULL, err, sizeof err);
    assert_non_null(h);
    scraper s[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        s[i].port = wxg_httpd_port(h);
        s[i].ok = 0;
        assert_int_equal(pthread_create(&th[i], NULL, scrape, &s[i]), 0);
    }
    for (int i = 0; i < 100000; i++)
        wxg_counter_inc(c);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(s[i].ok, 20);
    }
    response r;
    assert_int_equal(http_request(wxg_httpd_port(h), "GET", "/metrics", &r), 0);
    assert_non_null(strstr(r.body, "wxg_busy_total 100000\n"));
    wxg_httpd_stop(h);
    wxg_metrics_free(reg);
}

/* ---- application routes ---- */

typedef struct app {
    atomic_int calls;
    atomic_int entered;  /* handler calls that have started */
    atomic_int released; /* the blocking handler may return */
} app;

/* Echoes the request: "<method> <path> q=<q> h=<X-Test> len=<n>\n<body>". A request to
 * /app/block waits (bounded) until the test releases it. */
static void echo_handler(void *opaque, const wxg_httpd_req_t *req, wxg_httpd_resp_t *resp)
{
    app *a = opaque;
    atomic_fetch_add(&a->calls, 1);
    atomic_fetch_add(&a->entered, 1);
    if (strcmp(wxg_httpd_req_path(req), "/app/block") == 0) {
        for (int i = 0; i < 1000 && !atomic_load(&a->released); i++)
            wxg_test_sleep_ms(10);
    }
    size_t len = 0;
    const char *body = wxg_httpd_req_body(req, &len);
    const char *q = wxg_httpd_req_query(req, "q");
    const char *x = wxg_httpd_req_header(req, "x-test");
    char head[512];
    int n = snprintf(head, sizeof head, "%s %s q=%s h=%s len=%zu\n", wxg_httpd_req_method(req),
                     wxg_httpd_req_path(req), q ? q : "-", x ? x : "-", len);
    char *out = malloc((size_t)n + len);
    assert_non_null(out);
    memcpy(out, head, (size_t)n);
    memcpy(out + n, body, len);
    assert_int_equal(wxg_httpd_resp_set(resp, 201, "application/x-echo", out, (size_t)n + len), 0);
    free(out);
    assert_int_equal(wxg_httpd_resp_header(resp, "X-Echo", "yes"), 0);
    assert_int_equal(wxg_httpd_resp_header(resp, "X-Bad", "a\r\nInjected: 1"), -2 /* EINVAL */);
}

static wxg_httpd_t *start_app(app *a, wxg_metrics_t *reg, size_t max_body, unsigned inflight)
{
    char err[256] = "";
    wxg_httpd_opts_t o = {.listen = "127.0.0.1:0",
                          .metrics = reg,
                          .handler = echo_handler,
                          .handler_opaque = a,
                          .handler_prefix = "/app/",
                          .max_body = max_body,
                          .max_inflight = inflight};
    wxg_httpd_t *h = wxg_httpd_start_opts(&o, err, sizeof err);
    if (h == NULL)
        fail_msg("wxg_httpd_start_opts: %s", err);
    return h;
}

static void app_routes_get_method_path_query_headers_and_exact_body(void **state)
{
    (void)state;
    app a = {0};
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_httpd_t *h = start_app(&a, reg, 1024, 4);
    int port = wxg_httpd_port(h);
    wxg_test_http_resp_t r;
    static const char body[] = "a\0b{\"x\":1}";
    assert_int_equal(wxg_test_http(port, "POST", "/app/x?q=hello%20w", "X-Test: 42\r\n", body,
                                   sizeof body - 1, &r),
                     0);
    assert_int_equal(r.status, 201);
    char v[64];
    assert_string_equal(wxg_test_http_header(&r, "X-Echo", v, sizeof v), "yes");
    assert_string_equal(wxg_test_http_header(&r, "Content-Type", v, sizeof v),
                        "application/x-echo");
    assert_null(wxg_test_http_header(&r, "X-Bad", v, sizeof v));
    static const char want[] = "POST /app/x q=hello w h=42 len=10\na\0b{\"x\":1}";
    assert_int_equal(r.body_len, sizeof want - 1);
    assert_memory_equal(r.body, want, sizeof want - 1);
    wxg_test_http_free(&r);

    /* A GET without a body reaches the handler with an empty one. */
    assert_int_equal(wxg_test_http(port, "GET", "/app/", NULL, NULL, 0, &r), 0);
    assert_int_equal(r.status, 201);
    assert_string_equal(r.body, "GET /app/ q=- h=- len=0\n");
    wxg_test_http_free(&r);

    /* Built-in paths still answer beside the routes; other paths are 404. */
    assert_int_equal(wxg_test_http(port, "GET", "/healthz", NULL, NULL, 0, &r), 0);
    assert_int_equal(r.status, 200);
    wxg_test_http_free(&r);
    assert_int_equal(wxg_test_http(port, "GET", "/ap", NULL, NULL, 0, &r), 0);
    assert_int_equal(r.status, 404);
    wxg_test_http_free(&r);
    assert_int_equal(atomic_load(&a.calls), 2);
    wxg_httpd_stop(h);
    wxg_metrics_free(reg);
}

static void bodies_over_the_cap_get_413_by_declared_and_by_streamed_size(void **state)
{
    (void)state;
    app a = {0};
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_httpd_t *h = start_app(&a, reg, 1024, 4);
    int port = wxg_httpd_port(h);
    wxg_test_http_resp_t r;
    char *big = malloc(4096);
    assert_non_null(big);
    memset(big, 'x', 4096);

    /* Exactly the cap is accepted. */
    assert_int_equal(wxg_test_http(port, "POST", "/app/x", NULL, big, 1024, &r), 0);
    assert_int_equal(r.status, 201);
    assert_non_null(strstr(r.body, "len=1024\n"));
    wxg_test_http_free(&r);

    /* One byte more, declared by Content-Length. */
    assert_int_equal(wxg_test_http(port, "POST", "/app/x", NULL, big, 1025, &r), 0);
    assert_int_equal(r.status, 413);
    wxg_test_http_free(&r);

    /* Chunked: no length declared, 3 x 500 bytes arrive. */
    char raw[2048];
    int n = snprintf(raw, sizeof raw,
                     "POST /app/x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 3; i++) {
        n += snprintf(raw + n, sizeof raw - (size_t)n, "1f4\r\n");
        memset(raw + n, 'y', 500);
        n += 500;
        n += snprintf(raw + n, sizeof raw - (size_t)n, "\r\n");
    }
    assert_true((size_t)n + 5 < sizeof raw + 1024); /* fits: checked by snprintf bounds */
    char *req = malloc((size_t)n + 8);
    assert_non_null(req);
    memcpy(req, raw, (size_t)n);
    memcpy(req + n, "0\r\n\r\n", 5);
    assert_int_equal(wxg_test_http_raw(port, req, (size_t)n + 5, &r), 0);
    assert_int_equal(r.status, 413);
    wxg_test_http_free(&r);
    free(req);
    assert_int_equal(atomic_load(&a.calls), 1); /* the handler saw only the first request */

    /* Both refusals are counted. */
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(wxg_metrics_render(reg, &text, &len), 0);
    assert_non_null(strstr(text, "wxg_httpd_refused_total{reason=\"too_large\"} 2\n"));
    free(text);
    free(big);
    wxg_httpd_stop(h);
    wxg_metrics_free(reg);
}

typedef struct blocked_req {
    int port;
    int status;
} blocked_req;

static void *send_blocking(void *arg)
{
    blocked_req *b = arg;
    wxg_test_http_resp_t r;
    b->status = wxg_test_http(b->port, "POST", "/app/block", NULL, "1", 1, &r) == 0 ? r.status : -1;
    wxg_test_http_free(&r);
    return NULL;
}

static void a_request_over_the_inflight_limit_gets_503_with_retry_after(void **state)
{
    (void)state;
    app a = {0};
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_httpd_t *h = start_app(&a, reg, 1024, 1);
    int port = wxg_httpd_port(h);
    blocked_req b = {.port = port, .status = 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, send_blocking, &b), 0);
    for (int i = 0; i < 500 * wxg_test_scale() && atomic_load(&a.entered) == 0; i++)
        wxg_test_sleep_ms(10);
    assert_int_equal(atomic_load(&a.entered), 1);

    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(port, "POST", "/app/x", NULL, "2", 1, &r), 0);
    assert_int_equal(r.status, 503);
    char v[32];
    assert_string_equal(wxg_test_http_header(&r, "Retry-After", v, sizeof v), "1");
    wxg_test_http_free(&r);
    /* Built-in paths are not limited. */
    assert_int_equal(wxg_test_http(port, "GET", "/healthz", NULL, NULL, 0, &r), 0);
    assert_int_equal(r.status, 200);
    wxg_test_http_free(&r);

    atomic_store(&a.released, 1);
    pthread_join(th, NULL);
    assert_int_equal(b.status, 201);
    /* The slot is free again once the first request completed. */
    int status = 0;
    for (int i = 0; i < 100 && status != 201; i++) {
        assert_int_equal(wxg_test_http(port, "POST", "/app/x", NULL, "3", 1, &r), 0);
        status = r.status;
        wxg_test_http_free(&r);
        if (status != 201)
            wxg_test_sleep_ms(10);
    }
    assert_int_equal(status, 201);
    assert_int_equal(atomic_load(&a.calls), 2);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(wxg_metrics_render(reg, &text, &len), 0);
    assert_non_null(strstr(text, "wxg_httpd_refused_total{reason=\"busy\"} 1\n"));
    free(text);
    wxg_httpd_stop(h);
    wxg_metrics_free(reg);
}

/* The ingest callback port: the built-in paths belong to the operations server, so here they
 * reach the handler under its prefix, or get 404 outside it, and never show the registry. */
static void without_builtin_paths_they_go_to_the_handler_or_404(void **state)
{
    (void)state;
    app a = {0};
    char err[256] = "";
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_metrics_counter(reg, "wxg_test_secret_total", "Must not be shown here.", NULL);
    wxg_httpd_opts_t o = {.listen = "127.0.0.1:0",
                          .metrics = reg,
                          .handler = echo_handler,
                          .handler_opaque = &a,
                          .handler_prefix = "/app/",
                          .no_builtin_paths = 1};
    wxg_httpd_t *h = wxg_httpd_start_opts(&o, err, sizeof err);
    if (h == NULL)
        fail_msg("wxg_httpd_start_opts: %s", err);
    int port = wxg_httpd_port(h);
    response r;
    static const char *const paths[] = {"/metrics", "/healthz", "/readyz"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        assert_int_equal(http_request(port, "GET", paths[i], &r), 0);
        assert_int_equal(r.status, 404);
        assert_null(strstr(r.body, "wxg_test_secret_total"));
        assert_int_equal(http_request(port, "HEAD", paths[i], &r), 0);
        assert_int_equal(r.status, 404);
    }
    assert_int_equal(atomic_load(&a.calls), 0);
    wxg_httpd_stop(h);

    /* Under a prefix of "/" (ingest's) the handler answers them, like any unknown path. */
    o.handler_prefix = "/";
    h = wxg_httpd_start_opts(&o, err, sizeof err);
    if (h == NULL)
        fail_msg("wxg_httpd_start_opts: %s", err);
    assert_int_equal(http_request(wxg_httpd_port(h), "GET", "/metrics", &r), 0);
    assert_int_equal(r.status, 201);
    assert_string_equal(r.body, "GET /metrics q=- h=- len=0\n");
    assert_int_equal(atomic_load(&a.calls), 1);
    wxg_httpd_stop(h);
    wxg_metrics_free(reg);
}

static void a_handler_without_a_path_prefix_is_refused(void **state)
{
    (void)state;
    app a = {0};
    char err[256] = "";
    wxg_httpd_opts_t o = {.listen = "127.0.0.1:0", .handler = echo_handler, .handler_opaque = &a};
    assert_null(wxg_httpd_start_opts(&o, err, sizeof err));
    assert_non_null(strstr(err, "prefix"));
}

static void a_trickling_client_is_cut_by_the_request_deadline_while_others_are_served(void **state)
{
    (void)state;
    char err[256] = "";
    /* No application routes (the consumer's metrics port); idle timeout 1 s, deadline 600 ms. */
    wxg_httpd_opts_t o = {.listen = "127.0.0.1:0", .conn_timeout_s = 1, .request_timeout_ms = 600};
    wxg_httpd_t *h = wxg_httpd_start_opts(&o, err, sizeof err);
    if (h == NULL)
        fail_msg("wxg_httpd_start_opts: %s", err);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)wxg_httpd_port(h))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    static const char req[] =
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaa";
    int64_t t0 = wxg_test_now_ms(), cut = -1;
    /* A byte every 200 ms: well inside the idle timeout, so only the deadline can cut it. */
    for (size_t i = 0; i < sizeof req - 1 && cut < 0; i++) {
        if (send(fd, req + i, 1, MSG_NOSIGNAL) != 1) {
            cut = wxg_test_now_ms() - t0;
            break;
        }
        if (i == 2) { /* meanwhile another client is answered */
            response r;
            assert_int_equal(http_request(wxg_httpd_port(h), "GET", "/healthz", &r), 0);
            assert_int_equal(r.status, 200);
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 200) > 0) {
            char c;
            assert_true(recv(fd, &c, 1, 0) <= 0); /* closed, not answered */
            cut = wxg_test_now_ms() - t0;
        }
    }
    close(fd);
    if (cut < 0)
        fail_msg("still connected after %zu bytes over %lld ms", sizeof req - 1,
                 (long long)(wxg_test_now_ms() - t0));
    assert_true(cut >= 500);
    assert_true(cut < 600 + 2000LL * wxg_test_scale());
    wxg_httpd_stop(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serves_metrics_health_and_readiness_on_a_free_port),
        cmocka_unit_test(without_callback_or_registry_it_is_ready_and_empty),
        cmocka_unit_test(bad_or_busy_addresses_are_refused_with_a_reason),
        cmocka_unit_test(concurrent_scrapes_while_counting_all_succeed),
        cmocka_unit_test(app_routes_get_method_path_query_headers_and_exact_body),
        cmocka_unit_test(bodies_over_the_cap_get_413_by_declared_and_by_streamed_size),
        cmocka_unit_test(a_request_over_the_inflight_limit_gets_503_with_retry_after),
        cmocka_unit_test(without_builtin_paths_they_go_to_the_handler_or_404),
        cmocka_unit_test(a_handler_without_a_path_prefix_is_refused),
        cmocka_unit_test(a_trickling_client_is_cut_by_the_request_deadline_while_others_are_served),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
