/* Integration tests of the http plugin against a small HTTP server started by the test on
 * 127.0.0.1 (a thread that answers each request with a status the test chose, and records what
 * it received): 2xx is OK with the response's id as the result; 5xx, 408, 429 and timeouts are
 * RETRY; other 4xx are FAIL with the status in the reason; the request carries the
 * Idempotency-Key, X-Wxg-Fence and X-Wxg-Attempt headers and the message as JSON with exact
 * ids. */
#define _GNU_SOURCE /* strcasestr */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "testenv.h"
#include "wxguard/err.h"
#include "wxguard/plugin_registry.h"

/* ----- the in-test server ----- */

#define REQ_MAX 16384

typedef struct server {
    int fd;
    int port;
    pthread_t th;
    atomic_int stop;
    pthread_mutex_t mu;
    /* what to answer (set by the test between requests) */
    int status;
    char body[256];
    int stall_ms; /* wait this long before answering */
    /* what the last request was */
    char req[REQ_MAX + 1];
    size_t req_len;
    int requests;
} server;

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    default:
        return "Status";
    }
}

/* Reads one request (headers and a Content-Length body) with bounded waits. */
static size_t read_request(server *s, int c, char *buf)
{
    size_t len = 0;
    size_t need = 0;
    for (int rounds = 0; rounds < 200 && len < REQ_MAX; rounds++) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) {
            if (atomic_load(&s->stop))
                break;
            continue;
        }
        ssize_t n = read(c, buf + len, REQ_MAX - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (!end)
            continue;
        if (need == 0) {
            const char *cl = strcasestr(buf, "\r\nContent-Length:");
            need = (size_t)(end - buf) + 4 + (cl ? strtoul(cl + 17, NULL, 10) : 0);
        }
        if (len >= need)
            break;
    }
    return len;
}

static void *serve(void *p)
{
    server *s = p;
    char buf[REQ_MAX + 1];
    while (!atomic_load(&s->stop)) {
        struct pollfd pf = {.fd = s->fd, .events = POLLIN};
        if (poll(&pf, 1, 50) <= 0)
            continue;
        int c = accept(s->fd, NULL, NULL);
        if (c < 0)
            continue;
        size_t len = read_request(s, c, buf);
        pthread_mutex_lock(&s->mu);
        memcpy(s->req, buf, len);
        s->req[len] = '\0';
        s->req_len = len;
        s->requests++;
        int status = s->status, stall = s->stall_ms;
        char body[256];
        snprintf(body, sizeof body, "%s", s->body);
        pthread_mutex_unlock(&s->mu);
        for (int waited = 0; waited < stall && !atomic_load(&s->stop); waited += 20)
            usleep(20 * 1000);
        char resp[512];
        int n = snprintf(resp, sizeof resp,
                         "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: "
                         "%zu\r\nConnection: close\r\n\r\n%s",
                         status, reason_phrase(status), strlen(body), body);
        ssize_t w = write(c, resp, (size_t)n);
        (void)w;
        close(c);
    }
    return NULL;
}

static void server_start(server *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s->fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->fd, 16), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(s->fd, (struct sockaddr *)&a, &al), 0);
    s->port = ntohs(a.sin_port);
    s->status = 200;
    assert_int_equal(pthread_create(&s->th, NULL, serve, s), 0);
}

static void server_stop(server *s)
{
    atomic_store(&s->stop, 1);
    pthread_join(s->th, NULL);
    close(s->fd);
    pthread_mutex_destroy(&s->mu);
}

static void server_answer(server *s, int status, const char *body, int stall_ms)
{
    pthread_mutex_lock(&s->mu);
    s->status = status;
    snprintf(s->body, sizeof s->body, "%s", body ? body : "");
    s->stall_ms = stall_ms;
    pthread_mutex_unlock(&s->mu);
}

/* The value of header `name` in the last request (copied into out), or NULL. */
static const char *last_header(server *s, const char *name, char *out, size_t size)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\r\n%s:", name);
    pthread_mutex_lock(&s->mu);
    const char *h = strcasestr(s->req, pat);
    const char *res = NULL;
    if (h) {
        h += strlen(pat);
        while (*h == ' ')
            h++;
        size_t n = strcspn(h, "\r\n");
        snprintf(out, size, "%.*s", (int)n, h);
        res = out;
    }
    pthread_mutex_unlock(&s->mu);
    return res;
}

/* ----- fixture ----- */

typedef struct fx {
    server srv;
    wxg_plugin_chain_t *chain;
    wxg_plugin_thread_t *thr;
    wxg_msg_view_t v;
} fx;

static int setup(void **st)
{
    fx *f = calloc(1, sizeof *f);
    server_start(&f->srv);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/hooks/wechat", f->srv.port);
    char timeout[16];
    snprintf(timeout, sizeof timeout, "%d", 400 * wxg_test_scale());
    wxg_plugin_kv_t kv[] = {{"plugin.http.url", url}, {"plugin.http.timeout.ms", timeout}};
    char err[512];
    assert_int_equal(wxg_plugin_chain_new("http", kv, 2, &f->chain, err, sizeof err), 0);
    assert_int_equal(wxg_plugin_thread_new(f->chain, &f->thr, err, sizeof err), 0);
    f->v = (wxg_msg_view_t){.format = WXG_FORMAT_WKTEAM,
                            .account = "wxid_bot1",
                            .conversation = "room_1@chatroom",
                            .sender = "wxid_alice",
                            .msg_id = "18446744073709551615",
                            .create_time = 1700000000,
                            .type = "60001",
                            .content = "价格多少?",
                            .content_len = strlen("价格多少?"),
                            .is_group = 1,
                            .key = "wxid_bot1:n:18446744073709551615",
                            .key_kind = WXG_KEY_SERVER_ID};
    *st = f;
    return 0;
}

static int teardown(void **st)
{
    fx *f = *st;
    wxg_plugin_thread_destroy(f->thr);
    wxg_plugin_chain_destroy(f->chain);
    server_stop(&f->srv);
    free(f);
    return 0;
}

static wxg_plugin_result_t post(fx *f, wxg_plugin_call_t *call)
{
    wxg_plugin_call_init(call);
    call->fence = 7;
    call->attempt = 2;
    call->topic = "callbacks";
    return wxg_plugin_chain_handle(f->chain, f->thr, 0, &f->v, call);
}

/* ----- tests ----- */

static void test_2xx_is_ok_with_headers_and_exact_json_body(void **st)
{
    fx *f = *st;
    wxg_plugin_call_t call;
    server_answer(&f->srv, 200, "{\"id\":\"evt-123\",\"status\":\"accepted\"}", 0);
    assert_int_equal(post(f, &call), WXG_PLUGIN_OK);
    assert_string_equal(call.result, "http 200 id=evt-123");
    char h[256];
    assert_non_null(last_header(&f->srv, "Idempotency-Key", h, sizeof h));
    assert_string_equal(h, "wxid_bot1:n:18446744073709551615");
    assert_non_null(last_header(&f->srv, "X-Wxg-Fence", h, sizeof h));
    assert_string_equal(h, "7");
    assert_non_null(last_header(&f->srv, "X-Wxg-Attempt", h, sizeof h));
    assert_string_equal(h, "2");
    assert_non_null(last_header(&f->srv, "Content-Type", h, sizeof h));
    assert_string_equal(h, "application/json");
    pthread_mutex_lock(&f->srv.mu);
    assert_non_null(strstr(f->srv.req, "POST /hooks/wechat HTTP/1.1\r\n"));
    const char *body = strstr(f->srv.req, "\r\n\r\n");
    assert_non_null(body);
    cJSON *o = cJSON_Parse(body + 4);
    pthread_mutex_unlock(&f->srv.mu);
    assert_non_null(o);
    /* The id is the exact 20-digit string, not a rounded double. */
    assert_string_equal(cJSON_GetObjectItem(o, "msg_id")->valuestring, "18446744073709551615");
    assert_string_equal(cJSON_GetObjectItem(o, "key")->valuestring, f->v.key);
    assert_int_equal((int)cJSON_GetObjectItem(o, "fence")->valuedouble, 7);
    assert_string_equal(cJSON_GetObjectItem(o, "content")->valuestring, "价格多少?");
    assert_string_equal(cJSON_GetObjectItem(o, "format")->valuestring, "wkteam");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "is_group")));
    cJSON_Delete(o);

    server_answer(&f->srv, 201, "{\"id\":42}", 0);
    assert_int_equal(post(f, &call), WXG_PLUGIN_OK);
    assert_string_equal(call.result, "http 201 id=42");
    server_answer(&f->srv, 200, "not json", 0);
    assert_int_equal(post(f, &call), WXG_PLUGIN_OK);
    assert_string_equal(call.result, "http 200");
}

static void test_5xx_and_429_retry_other_4xx_fail_with_status_in_reason(void **st)
{
    fx *f = *st;
    static const struct {
        int status;
        wxg_plugin_result_t want;
    } cases[] = {{503, WXG_PLUGIN_RETRY},
                 {500, WXG_PLUGIN_RETRY},
                 {429, WXG_PLUGIN_RETRY},
                 {400, WXG_PLUGIN_FAIL},
                 {404, WXG_PLUGIN_FAIL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wxg_plugin_call_t call;
        int before = f->srv.requests;
        server_answer(&f->srv, cases[i].status, "{\"error\":\"x\"}", 0);
        assert_int_equal(post(f, &call), cases[i].want);
        char status[8];
        snprintf(status, sizeof status, "%d", cases[i].status);
        if (!strstr(call.reason, status))
            fail_msg("status %d: reason '%s' lacks the status", cases[i].status, call.reason);
        assert_int_equal(call.has_result, 0);
        pthread_mutex_lock(&f->srv.mu);
        assert_int_equal(f->srv.requests, before + 1); /* one request, no hidden retries */
        pthread_mutex_unlock(&f->srv.mu);
    }
}

static void test_timeout_is_a_retry(void **st)
{
    fx *f = *st;
    wxg_plugin_call_t call;
    /* The server answers only after the plugin's timeout. */
    server_answer(&f->srv, 200, "{}", 1500 * wxg_test_scale());
    int64_t t0 = wxg_test_now_ms();
    assert_int_equal(post(f, &call), WXG_PLUGIN_RETRY);
    int64_t took = wxg_test_now_ms() - t0;
    assert_non_null(strstr(call.reason, "POST failed"));
    assert_non_null(strstr(call.reason, "imeout"));
    assert_true(took < 1400 * wxg_test_scale());
    server_answer(&f->srv, 200, "{}", 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_2xx_is_ok_with_headers_and_exact_json_body, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_5xx_and_429_retry_other_4xx_fail_with_status_in_reason,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_is_a_retry, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
