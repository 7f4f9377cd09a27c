/* Hostile clients against the real wxguard-ingest program (a child process) and the real Kafka
 * broker of the services fixture, all on 127.0.0.1:
 *   - slow clients (headers one byte a second, a body one byte a second) are cut off within
 *     the request deadline (ingest.connection.timeout.ms from a request's first byte), while
 *     other callbacks keep being answered 200 promptly; an honest request a little slower than
 *     a burst but within the deadline is still answered;
 *   - oversized headers, a malformed, negative or conflicting Content-Length, Content-Length
 *     beside Transfer-Encoding, and an unknown transfer coding get a clear 4xx/5xx at once;
 *     a chunked body is accepted up to the cap and refused with 413 beyond it;
 *   - bytes after the announced body (a second request hidden in the first one's body) are
 *     not processed: the first request is answered, then the connection is closed;
 *   - 1,000 connections at once, far beyond ingest.concurrency, each end with 200, 503 with
 *     Retry-After, or a closed connection, within a bounded time; the program is still running
 *     and serves normally afterwards;
 *   - Kafka holds exactly one record per 200 answer and nothing else.
 * Every loop is bounded in count and in time (scaled by WXG_TEST_TIMEOUT_SCALE); the timing
 * assertions are generous bounds, not measurements (bench/ingest_hostile.sh measures). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"

#define CONCURRENCY  8       /* ingest.concurrency: at most 2 * 8 + 16 = 32 connections */
#define DEADLINE_MS  2000    /* ingest.connection.timeout.ms */
#define MAX_BODY     65536   /* ingest.max.body.bytes */
#define SMUGGLED_ID  "77001" /* a message id that only ever travels hidden in another body */
#define FLOOD        1000
#define SLOW_HEADERS 3
#define SLOW_BODIES  3

static struct {
    char *dir;
    char *topic;
    int port;
    int ops_port; /* /readyz */
    pid_t pid;
    atomic_int stored; /* requests answered 200: each must be one record in Kafka */
    atomic_int next_id;
} g;

/* ---- the program ---- */

static int ready(int port)
{
    wxg_test_http_resp_t r;
    if (wxg_test_http(port, "GET", "/readyz", NULL, NULL, 0, &r) != 0)
        return 0;
    int ok = r.status == 200;
    wxg_test_http_free(&r);
    return ok;
}

static int group_setup(void **state)
{
    (void)state;
    const char *bin = getenv("WXG_BINARY_DIR");
    assert_non_null(bin);
    struct rlimit rl;
    /* The flood needs a thousand descriptors at once in this process. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096) {
        rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    g.dir = wxg_test_mkdtemp("wxg-hostile");
    assert_non_null(g.dir);
    g.topic = wxg_test_kafka_name("hostile");
    wxg_test_kafka_create_topic(g.topic, 2);
    g.port = wxg_test_free_port();
    assert_true(g.port > 0);
    do
        g.ops_port = wxg_test_free_port();
    while (g.ops_port == g.port);
    assert_true(g.ops_port > 0);
    atomic_init(&g.next_id, 1000);
    char path[512], logp[600], listen[64], ops[64], top[300], boot[300], conc[64], tmo[64],
        body[64];
    snprintf(path, sizeof path, "%s/cmd/wxguard-ingest/wxguard-ingest", bin);
    snprintf(logp, sizeof logp, "%s/ingest.log", g.dir);
    snprintf(listen, sizeof listen, "ingest.listen=127.0.0.1:%d", g.port);
    snprintf(ops, sizeof ops, "ingest.ops.listen=127.0.0.1:%d", g.ops_port);
    snprintf(top, sizeof top, "ingest.topic=%s", g.topic);
    snprintf(boot, sizeof boot, "kafka.bootstrap.servers=%s", wxg_test_kafka_bootstrap());
    snprintf(conc, sizeof conc, "ingest.concurrency=%d", CONCURRENCY);
    snprintf(tmo, sizeof tmo, "ingest.connection.timeout.ms=%d", DEADLINE_MS);
    snprintf(body, sizeof body, "ingest.max.body.bytes=%d", MAX_BODY);
    g.pid = fork();
    assert_true(g.pid >= 0);
    if (g.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execl(path, path, "--set", boot, "--set", top, "--set", listen, "--set", ops, "--set", conc,
              "--set", tmo, "--set", body, "--set", "kafka.broker.address.family=v4", "--set",
              "ingest.produce.timeout.ms=10s", "--set", "log.level=warn", (char *)NULL);
        _exit(127);
    }
    int64_t deadline = wxg_test_now_ms() + 30000 * wxg_test_scale();
    while (!ready(g.ops_port)) {
        int st;
        if (waitpid(g.pid, &st, WNOHANG) == g.pid)
            fail_msg("wxguard-ingest exited at start-up (see %s)", logp);
        if (wxg_test_now_ms() >= deadline)
            fail_msg("wxguard-ingest not ready in time (see %s)", logp);
        wxg_test_sleep_ms(100);
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (g.pid > 0) {
        kill(g.pid, SIGTERM);
        int st;
        int64_t deadline = wxg_test_now_ms() + 15000 * wxg_test_scale();
        while (waitpid(g.pid, &st, WNOHANG) != g.pid) {
            if (wxg_test_now_ms() >= deadline) {
                kill(g.pid, SIGKILL);
                waitpid(g.pid, &st, 0);
                break;
            }
            wxg_test_sleep_ms(20);
        }
    }
    if (getenv("WXG_TEST_KEEP") == NULL)
        wxg_test_rmtree(g.dir);
    else
        print_message("kept %s\n", g.dir);
    free(g.dir);
    free(g.topic);
    return 0;
}

static void assert_alive(void)
{
    int st;
    if (waitpid(g.pid, &st, WNOHANG) == g.pid) {
        g.pid = 0;
        fail_msg("wxguard-ingest is gone (status %d, see %s/ingest.log)", st, g.dir);
    }
}

/* A generic callback with a fresh message id (or `id` when not NULL). */
static int callback(char *buf, size_t size, const char *id)
{
    char idbuf[32];
    if (id == NULL) {
        snprintf(idbuf, sizeof idbuf, "%d", atomic_fetch_add(&g.next_id, 1));
        id = idbuf;
    }
    return snprintf(buf, size,
                    "{\"account\":\"wxid_hostile01\",\"msg_id\":\"%s\",\"conversation\":"
                    "\"wxid_peer01\",\"type\":\"text\",\"content\":\"hostile load %s\"}",
                    id, id);
}

/* One normal callback; returns its status (or -1) and its latency in *ms. */
static int post_normal(int64_t *ms)
{
    char body[512];
    int n = callback(body, sizeof body, NULL);
    int64_t t0 = wxg_test_now_ms();
    wxg_test_http_resp_t r;
    int status = -1;
    if (wxg_test_http(g.port, "POST", "/v1/callback/generic", NULL, body, (size_t)n, &r) == 0) {
        status = r.status;
        wxg_test_http_free(&r);
    }
    *ms = wxg_test_now_ms() - t0;
    if (status == 200)
        atomic_fetch_add(&g.stored, 1);
    return status;
}

/* ---- raw connections ---- */

static int connect_lo(int nonblock)
{
    int fd = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g.port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* What came back on one connection after sending `raw`. */
typedef struct exchange {
    char buf[16384];
    size_t len;
    int closed;      /* the server closed (FIN or reset) */
    int answers;     /* status lines at the start of an answer */
    int status;      /* the first one's code, -1 without an answer */
    int64_t elapsed; /* ms from the send to the close (or to the timeout) */
} exchange;

/* The three digits of a status line's code. */
static int status_code(const char *p)
{
    long v = strtol(p, NULL, 10);
    return v >= 100 && v <= 999 ? (int)v : -1;
}

static int count_answers(const char *buf, size_t len, int *first)
{
    int n = 0;
    *first = -1;
    for (size_t i = 0; i + 12 <= len; i++) {
        if ((i == 0 || (buf[i - 1] == '\n' && i >= 2 && buf[i - 2] == '\r')) &&
            memcmp(buf + i, "HTTP/1.1 ", 9) == 0) {
            if (n++ == 0)
                *first = status_code(buf + i + 9);
        }
    }
    return n;
}

/* Sends `raw` on a new connection and reads until the server closes it or timeout_ms (scaled)
 * passes. With `nudge`, sends an empty line (allowed before a request line) once the first
 * answer's head is in: libmicrohttpd may leave bytes it has already buffered unparsed until more
 * arrive, and the nudge makes it go on with them if it keeps the connection. */
static void send_raw(const void *raw, size_t len, int timeout_ms, int nudge, exchange *x)
{
    memset(x, 0, sizeof *x);
    int fd = connect_lo(0);
    assert_true(fd >= 0);
    int64_t t0 = wxg_test_now_ms();
    int64_t deadline = t0 + (int64_t)timeout_ms * wxg_test_scale();
    const char *p = raw;
    while (len > 0) { /* the server may close before the whole request is written */
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        p += w;
        len -= (size_t)w;
    }
    while (x->len + 1 < sizeof x->buf) {
        int64_t left = deadline - wxg_test_now_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            break;
        ssize_t got = recv(fd, x->buf + x->len, sizeof x->buf - 1 - x->len, 0);
        if (got <= 0) {
            x->closed = 1;
            break;
        }
        x->len += (size_t)got;
        x->buf[x->len] = '\0';
        if (nudge && strstr(x->buf, "\r\n\r\n") != NULL) {
            nudge = 0;
            (void)send(fd, "\r\n", 2, MSG_NOSIGNAL);
        }
    }
    x->elapsed = wxg_test_now_ms() - t0;
    x->buf[x->len] = '\0';
    x->answers = count_answers(x->buf, x->len, &x->status);
    close(fd);
}

/* ---- slow clients ---- */

typedef struct slow {
    pthread_t th;
    int body_phase; /* 0: trickle the headers; 1: headers at once, then trickle the body */
    atomic_int started;
    int64_t cut_ms; /* ms from the first byte until the server cut the connection, -1: never */
    int status;     /* a status line that came instead, or 0 */
    int sent;       /* bytes trickled */
} slow;

static void *slow_main(void *arg)
{
    slow *s = arg;
    s->cut_ms = -1;
    int fd = connect_lo(0);
    if (fd < 0)
        return NULL;
    static const char head[] = "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    static const char body_head[] = "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                    "Content-Length: 4000\r\n\r\n";
    int64_t t0 = wxg_test_now_ms();
    /* Give up well after the bound the test asserts, so that a server that never cuts is seen
     * as such and the thread still ends. */
    int64_t give_up = t0 + (int64_t)(DEADLINE_MS + 6000) * wxg_test_scale();
    if (s->body_phase)
        send(fd, body_head, sizeof body_head - 1, MSG_NOSIGNAL);
    else
        send(fd, head, 27, MSG_NOSIGNAL); /* "POST /v1/callback/generic " */
    atomic_store(&s->started, 1);
    size_t hi = 27;
    while (wxg_test_now_ms() < give_up) {
        char c = s->body_phase ? ' ' : (hi < sizeof head - 1 ? head[hi++] : 'x');
        if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) {
            s->cut_ms = wxg_test_now_ms() - t0;
            break;
        }
        s->sent++;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 1000) > 0) { /* one byte a second */
            char buf[256];
            ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
            if (got > 0 && memcmp(buf, "HTTP/1.1 ", 9) == 0) {
                buf[got] = '\0';
                s->status = status_code(buf + 9);
            }
            s->cut_ms = wxg_test_now_ms() - t0;
            break;
        }
    }
    close(fd);
    return NULL;
}

static void slow_clients_are_cut_by_the_deadline_while_others_get_200_promptly(void **state)
{
    (void)state;
    slow sl[SLOW_HEADERS + SLOW_BODIES];
    memset(sl, 0, sizeof sl);
    for (int i = 0; i < SLOW_HEADERS + SLOW_BODIES; i++) {
        sl[i].body_phase = i >= SLOW_HEADERS;
        assert_int_equal(pthread_create(&sl[i].th, NULL, slow_main, &sl[i]), 0);
    }
    for (int i = 0; i < SLOW_HEADERS + SLOW_BODIES; i++) {
        while (!atomic_load(&sl[i].started))
            wxg_test_sleep_ms(10);
    }
    /* While they trickle: callbacks one after another, each answered at once. */
    int64_t worst = 0;
    for (int i = 0; i < 10; i++) {
        int64_t ms = 0;
        int st = post_normal(&ms);
        if (st != 200)
            fail_msg("callback %d during the slow clients: status %d after %" PRId64 " ms", i, st,
                     ms);
        if (ms > worst)
            worst = ms;
        wxg_test_sleep_ms(150);
    }
    if (worst > 2000LL * wxg_test_scale())
        fail_msg("a callback took %" PRId64 " ms while slow clients trickled", worst);
    /* An honest client that is slower than a burst, within the deadline, is answered. */
    char body[512], head[256];
    int n = callback(body, sizeof body, NULL);
    int hn = snprintf(head, sizeof head,
                      "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
                      "close\r\nContent-Length: %d\r\n\r\n",
                      n);
    int fd = connect_lo(0);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, head, (size_t)hn, MSG_NOSIGNAL), hn);
    wxg_test_sleep_ms(DEADLINE_MS / 4);
    assert_int_equal(send(fd, body, 10, MSG_NOSIGNAL), 10);
    wxg_test_sleep_ms(DEADLINE_MS / 4);
    assert_int_equal(send(fd, body + 10, (size_t)n - 10, MSG_NOSIGNAL), n - 10);
    char ans[512];
    struct timeval tv = {.tv_sec = 5 * wxg_test_scale()};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t got = recv(fd, ans, sizeof ans - 1, 0);
    close(fd);
    assert_true(got > 12);
    ans[got] = '\0';
    assert_int_equal(status_code(ans + 9), 200);
    atomic_fetch_add(&g.stored, 1);

    for (int i = 0; i < SLOW_HEADERS + SLOW_BODIES; i++)
        pthread_join(sl[i].th, NULL);
    int64_t bound = (int64_t)(DEADLINE_MS + 3000) * wxg_test_scale();
    for (int i = 0; i < SLOW_HEADERS + SLOW_BODIES; i++) {
        print_message("slow client %d (%s): %d bytes, cut after %" PRId64 " ms%s\n", i,
                      sl[i].body_phase ? "body" : "headers", sl[i].sent, sl[i].cut_ms,
                      sl[i].status ? " with an answer" : "");
        if (sl[i].cut_ms < 0)
            fail_msg("slow client %d (%s) still connected after %d bytes a second apart", i,
                     sl[i].body_phase ? "body" : "headers", sl[i].sent);
        if (sl[i].cut_ms > bound)
            fail_msg("slow client %d cut after %" PRId64 " ms, more than %" PRId64, i, sl[i].cut_ms,
                     bound);
        /* Cut by the deadline, not by anything earlier. */
        assert_true(sl[i].cut_ms >= DEADLINE_MS / 2);
        assert_true(sl[i].status == 0 || sl[i].status == 408);
    }
    assert_alive();
}

/* ---- framing ---- */

static void check_refused(const char *what, const char *raw, int want1, int want2)
{
    exchange x;
    send_raw(raw, strlen(raw), 5000, 0, &x);
    print_message("%-28s -> %d after %" PRId64 " ms%s\n", what, x.status, x.elapsed,
                  x.closed ? ", closed" : "");
    if (x.status == 200)
        atomic_fetch_add(&g.stored, 1);
    if (x.status != want1 && x.status != want2)
        fail_msg("%s: status %d (expected %d or %d), %zu bytes: %.200s", what, x.status, want1,
                 want2, x.len, x.buf);
    if (!x.closed)
        fail_msg("%s: the connection stayed open after the refusal", what);
    if (x.elapsed > 2000LL * wxg_test_scale())
        fail_msg("%s: answered after %" PRId64 " ms", what, x.elapsed);
}

static void bad_headers_and_framing_get_a_clear_answer_at_once(void **state)
{
    (void)state;
    char body[512];
    int n = callback(body, sizeof body, NULL);
    static char raw[200000];
    const char *pre = "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\n";

    /* 70 KB of one header, and 5,000 small ones: beyond libmicrohttpd's buffer. */
    int k = snprintf(raw, sizeof raw, "%sX-Big: ", pre);
    memset(raw + k, 'a', 70000);
    k += 70000;
    snprintf(raw + k, sizeof raw - (size_t)k, "\r\nContent-Length: %d\r\n\r\n%s", n, body);
    check_refused("one 70 KB header", raw, 431, 413);
    k = snprintf(raw, sizeof raw, "%s", pre);
    for (int i = 0; i < 5000; i++)
        k += snprintf(raw + k, sizeof raw - (size_t)k, "X-H%d: v\r\n", i);
    snprintf(raw + k, sizeof raw - (size_t)k, "Content-Length: %d\r\n\r\n%s", n, body);
    check_refused("5,000 headers", raw, 431, 413);

    const char *lengths[] = {"abc", "-5", "12abc", "5, 5", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        char what[64];
        snprintf(raw, sizeof raw, "%sContent-Length: %s\r\n\r\n%s", pre, lengths[i], body);
        snprintf(what, sizeof what, "Content-Length: %s", lengths[i]);
        check_refused(what, raw, 400, 413);
    }
    /* Two lengths that disagree: whichever one a proxy in front used, the other splits the
     * stream differently (request smuggling), so neither may be trusted. */
    snprintf(raw, sizeof raw, "%sContent-Length: %d\r\nContent-Length: 5\r\n\r\n%s", pre, n, body);
    check_refused("two Content-Lengths", raw, 400, 400);
    snprintf(raw, sizeof raw,
             "%sContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", pre,
             n, body);
    check_refused("Content-Length and chunked", raw, 400, 400);
    snprintf(raw, sizeof raw, "%sTransfer-Encoding: gzip\r\n\r\n%s", pre, body);
    check_refused("Transfer-Encoding: gzip", raw, 501, 400);

    /* Chunked: accepted under the cap (in two chunks), 413 beyond it. */
    exchange x;
    int half = n / 2;
    snprintf(raw, sizeof raw,
             "%sTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%.*s\r\n%x\r\n%s\r\n"
             "0\r\n\r\n",
             pre, half, half, body, n - half, body + half);
    send_raw(raw, strlen(raw), 5000, 0, &x);
    if (x.status != 200)
        fail_msg("a chunked callback: status %d: %.200s", x.status, x.buf);
    atomic_fetch_add(&g.stored, 1);
    k = snprintf(raw, sizeof raw, "%sTransfer-Encoding: chunked\r\n\r\n", pre);
    for (int i = 0; i < 3; i++) { /* 3 x 30,000 bytes > 64 KiB */
        k += snprintf(raw + k, sizeof raw - (size_t)k, "%x\r\n", 30000);
        memset(raw + k, ' ', 30000);
        k += 30000;
        k += snprintf(raw + k, sizeof raw - (size_t)k, "\r\n");
    }
    snprintf(raw + k, sizeof raw - (size_t)k, "0\r\n\r\n");
    check_refused("chunked body over the cap", raw, 413, 413);
    assert_alive();
}

static void bytes_after_the_announced_body_are_not_a_second_request(void **state)
{
    (void)state;
    char body[512], hidden[512], raw[2048];
    int n = callback(body, sizeof body, NULL);
    int hn = callback(hidden, sizeof hidden, SMUGGLED_ID);
    static const char head[] =
        "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s";
    for (int i = 0; i < 2; i++) {
        if (i > 0)
            n = callback(body, sizeof body, NULL);
        int len = snprintf(raw, sizeof raw, head, n, body);
        if (i == 0) /* a whole second request after the body */
            len += snprintf(raw + len, sizeof raw - (size_t)len, head, hn, hidden);
        else /* the tail of a body whose length was counted in characters, not bytes */
            len += snprintf(raw + len, sizeof raw - (size_t)len, "\xe4\xbd\xa0\xe5\xa5\xbd\"}\r\n");
        exchange x;
        send_raw(raw, (size_t)len, 5000, 1, &x);
        print_message("extra bytes form %d: %d answer(s), first %d, %s after %" PRId64 " ms\n", i,
                      x.answers, x.status, x.closed ? "closed" : "open", x.elapsed);
        if (x.status != 200)
            fail_msg("form %d: the announced request got %d: %.300s", i, x.status, x.buf);
        atomic_fetch_add(&g.stored, 1);
        if (x.answers != 1)
            fail_msg("form %d: the extra bytes were answered as a request: %.600s", i, x.buf);
        if (!x.closed)
            fail_msg("form %d: the connection stayed open with the extra bytes in it", i);
        /* Closed after the answer, not by the idle timeout (which is the same setting): not
         * scaled, since the answer itself takes a produce round trip. */
        if (x.elapsed >= DEADLINE_MS)
            fail_msg("form %d: closed only after %" PRId64 " ms, by the idle timeout", i,
                     x.elapsed);
    }
    assert_alive();
}

/* ---- a thousand connections ---- */

typedef struct conn {
    int fd;
    int sent;
    size_t len;
    char buf[512];
    int outcome; /* 0 open; 200, 503, other status; -1 closed without an answer */
} conn;

static void conn_read(conn *c)
{
    ssize_t got = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
    if (got > 0) {
        c->len += (size_t)got;
        c->buf[c->len] = '\0';
        char *end = strstr(c->buf, "\r\n\r\n");
        int st = 0;
        if (end != NULL && sscanf(c->buf, "HTTP/1.1 %d", &st) == 1) {
            int cl = 0;
            const char *h = strstr(c->buf, "Content-Length: ");
            if (h != NULL)
                cl = (int)strtol(h + 16, NULL, 10);
            if ((size_t)(end + 4 - c->buf) + (size_t)cl <= c->len)
                c->outcome = st; /* the whole answer is in */
        }
        if (c->len + 1 >= sizeof c->buf && c->outcome == 0)
            c->outcome = 1; /* too long to be one of ours */
        return;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    int st = 0;
    c->outcome = (c->len > 12 && sscanf(c->buf, "HTTP/1.1 %d", &st) == 1) ? st : -1;
}

static void a_thousand_connections_at_once_end_in_503_or_a_close_and_service_resumes(void **state)
{
    (void)state;
    conn *cs = calloc(FLOOD, sizeof *cs);
    struct pollfd *pf = calloc(FLOOD, sizeof *pf);
    assert_true(cs != NULL && pf != NULL);
    int64_t t0 = wxg_test_now_ms();
    int connect_failed = 0;
    for (int i = 0; i < FLOOD; i++) {
        cs[i].fd = connect_lo(1);
        if (cs[i].fd < 0) {
            cs[i].outcome = -2;
            connect_failed++;
        }
    }
    int64_t deadline = t0 + 30000LL * wxg_test_scale();
    int open = FLOOD - connect_failed;
    while (open > 0 && wxg_test_now_ms() < deadline) {
        int np = 0;
        for (int i = 0; i < FLOOD; i++) {
            if (cs[i].outcome != 0)
                continue;
            pf[np].fd = cs[i].fd;
            pf[np].events = cs[i].sent ? POLLIN : POLLOUT;
            pf[np].revents = 0;
            np++;
        }
        if (poll(pf, (nfds_t)np, 200) <= 0)
            continue;
        for (int i = 0, p = 0; i < FLOOD; i++) {
            if (cs[i].outcome != 0)
                continue;
            short re = pf[p++].revents;
            if (re == 0)
                continue;
            if (!cs[i].sent && (re & POLLOUT)) {
                char body[512], raw[1024];
                int n = callback(body, sizeof body, NULL);
                int len = snprintf(raw, sizeof raw,
                                   "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   "Connection: close\r\nContent-Length: %d\r\n\r\n%s",
                                   n, body);
                cs[i].sent = 1;
                if (send(cs[i].fd, raw, (size_t)len, MSG_NOSIGNAL) != len)
                    cs[i].outcome = -1; /* closed before it could be written */
            } else if (re & (POLLIN | POLLHUP | POLLERR)) {
                conn_read(&cs[i]);
            }
            if (cs[i].outcome != 0)
                open--;
        }
    }
    int64_t took = wxg_test_now_ms() - t0;
    int ok = 0, busy = 0, closed = 0, other = 0, hung = 0, no_retry_after = 0;
    for (int i = 0; i < FLOOD; i++) {
        switch (cs[i].outcome) {
        case 0:
            hung++;
            break;
        case 200:
            ok++;
            break;
        case 503:
            busy++;
            if (strstr(cs[i].buf, "Retry-After: ") == NULL)
                no_retry_after++;
            break;
        case -1:
        case -2:
            closed++;
            break;
        default:
            other++;
            print_message("connection %d: %.200s\n", i, cs[i].buf);
        }
        if (cs[i].fd >= 0)
            close(cs[i].fd);
    }
    free(cs);
    free(pf);
    atomic_fetch_add(&g.stored, ok);
    print_message("%d connections: %d answered 200, %d 503, %d closed without an answer "
                  "(%d could not connect), %d other, %d still waiting, after %" PRId64 " ms\n",
                  FLOOD, ok, busy, closed, connect_failed, other, hung, took);
    assert_int_equal(hung, 0);
    assert_int_equal(other, 0);
    assert_int_equal(no_retry_after, 0);
    assert_int_equal(ok + busy + closed, FLOOD);
    assert_alive();
    /* Afterwards the program serves as before. */
    for (int i = 0; i < 5; i++) {
        int64_t ms = 0;
        int st = post_normal(&ms);
        if (st != 200)
            fail_msg("callback %d after the flood: status %d", i, st);
        assert_true(ms < 2000LL * wxg_test_scale());
    }
}

/* ---- what reached Kafka ---- */

static void kafka_holds_one_record_per_200_and_nothing_else(void **state)
{
    (void)state;
    int want = atomic_load(&g.stored);
    wxg_test_kafka_msg_t *msgs = NULL;
    /* One more than expected, with a short wait for it: a record too many shows up. */
    size_t got = wxg_test_kafka_read(g.topic, (size_t)want + 1, 5000, &msgs);
    int smuggled = 0;
    for (size_t i = 0; i < got; i++) {
        if (msgs[i].value != NULL && strstr(msgs[i].value, "\"msg_id\":\"" SMUGGLED_ID "\""))
            smuggled++;
    }
    wxg_test_kafka_msgs_free(msgs, got);
    print_message("records: %zu, answers 200: %d\n", got, want);
    assert_int_equal(smuggled, 0);
    assert_int_equal(got, (size_t)want);
    assert_alive();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slow_clients_are_cut_by_the_deadline_while_others_get_200_promptly),
        cmocka_unit_test(bad_headers_and_framing_get_a_clear_answer_at_once),
        cmocka_unit_test(bytes_after_the_announced_body_are_not_a_second_request),
        cmocka_unit_test(a_thousand_connections_at_once_end_in_503_or_a_close_and_service_resumes),
        cmocka_unit_test(kafka_holds_one_record_per_200_and_nothing_else),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
