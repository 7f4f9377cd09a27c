/* Unit tests for lib/httpd.c: a server on 127.0.0.1 port 0 answers /metrics, /healthz and
 * /readyz (both ways) to a plain socket client, refuses other paths and methods, and reports
 * the port it bound. Loopback only; no external server is needed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "wxguard/httpd.h"
#include "wxguard/metrics.h"
#include "testenv.h"

typedef struct response {
    int status;
    char headers[2048];
    char body[8192];
} response;

/* Sends one request with Connection: close and reads the whole answer. */
static int http_request(int port, const char *method, const char *path, response *r)
{
    int rc = -1;
    char req[512];
    char buf[16384];
    size_t len = 0;
    memset(r, 0, sizeof *r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 5 * wxg_test_scale(), .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        goto out;
    int n =
        snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                 method, path);
    if (write(fd, req, (size_t)n) != n)
        goto out;
    for (int i = 0; i < 1000 && len < sizeof buf - 1; i++) { /* bounded: 1000 reads at most */
        ssize_t got = read(fd, buf + len, sizeof buf - 1 - len);
        if (got < 0)
            goto out;
        if (got == 0)
            break;
        len += (size_t)got;
    }
    buf[len] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    if (end == NULL || sscanf(buf, "HTTP/1.1 %d", &r->status) != 1)
        goto out;
    *end = '\0';
    size_t hl = strlen(buf), bl = strlen(end + 4);
    if (hl >= sizeof r->headers || bl >= sizeof r->body)
        goto out;
    memcpy(r->headers, buf, hl + 1);
    memcpy(r->body, end + 4, bl + 1);
    rc = 0;
out:
    close(fd);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serves_metrics_health_and_readiness_on_a_free_port),
        cmocka_unit_test(without_callback_or_registry_it_is_ready_and_empty),
        cmocka_unit_test(bad_or_busy_addresses_are_refused_with_a_reason),
        cmocka_unit_test(concurrent_scrapes_while_counting_all_succeed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
