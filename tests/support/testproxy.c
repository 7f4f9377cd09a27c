/*
 * DESIGN: the fault proxy of testproxy.h. One thread polls the listening socket and every pair
 * (client side, server side) and forwards chunk by chunk; a cut or a delay is done on that
 * thread too, so a cut exchange holds up the proxy's other connections for as long as it takes
 * (at most 2 x 5 s, scaled). The members shared with callers (stop, drop, cut, delay and the
 * last cut's figures) are under `mu`; the sockets and buffers belong to the thread.
 */
#include "testproxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "testenv.h"

enum { PAIRS = 8, BUF = 1 << 20, QUIET_MS = 100, LIMIT_MS = 5000 };

struct wxg_test_proxy {
    int lfd, port, upstream;
    int client[PAIRS], server[PAIRS]; /* -1: unused */
    pthread_t th;
    pthread_mutex_t mu; /* guards the members below */
    int stop, drop, cut, delay_ms;
    wxg_test_proxy_cut_t last;
    char *buf, *rep;
};

static int get(wxg_test_proxy_t *p, const int *field)
{
    pthread_mutex_lock(&p->mu);
    int v = *field;
    pthread_mutex_unlock(&p->mu);
    return v;
}

static void set(wxg_test_proxy_t *p, int *field, int v)
{
    pthread_mutex_lock(&p->mu);
    *field = v;
    pthread_mutex_unlock(&p->mu);
}

/* Reads from fd into buf[*len..cap) until it has been quiet for QUIET_MS (scaled), closed, or
 * LIMIT_MS (scaled) passed. */
static void read_until_quiet(int fd, char *buf, size_t *len, size_t cap)
{
    int64_t end = wxg_test_now_ms() + (int64_t)LIMIT_MS * wxg_test_scale();
    while (*len < cap && wxg_test_now_ms() < end) {
        struct pollfd q = {.fd = fd, .events = POLLIN};
        if (poll(&q, 1, QUIET_MS * wxg_test_scale()) <= 0)
            return;
        ssize_t n = recv(fd, buf + *len, cap - *len, 0);
        if (n <= 0)
            return;
        *len += (size_t)n;
    }
}

static void pair_close(wxg_test_proxy_t *p, int i)
{
    close(p->client[i]);
    close(p->server[i]);
    p->client[i] = p->server[i] = -1;
}

/* The cut, on pair i whose client has just sent something. */
static void cut(wxg_test_proxy_t *p, int i, int how)
{
    size_t req = 0, rep = 0, req_sent, rep_sent;
    read_until_quiet(p->client[i], p->buf, &req, BUF);
    if (how == WXG_TEST_CUT_REQUESTS) {
        req_sent = req / 2;
        wxg_test_send_all(p->server[i], p->buf, req_sent);
        shutdown(p->server[i], SHUT_WR);
        /* The server answers what it ran, then closes on the end of the stream. */
        read_until_quiet(p->server[i], p->rep, &rep, BUF);
        rep_sent = rep;
    } else {
        req_sent = req;
        wxg_test_send_all(p->server[i], p->buf, req);
        read_until_quiet(p->server[i], p->rep, &rep, BUF);
        rep_sent = rep / 2;
    }
    /* Recorded before the client can see the end of its connection and look. */
    pthread_mutex_lock(&p->mu);
    p->cut = WXG_TEST_CUT_NONE;
    p->last.cuts++;
    p->last.req_total = req;
    p->last.req_sent = req_sent;
    p->last.rep_total = rep;
    p->last.rep_sent = rep_sent;
    pthread_mutex_unlock(&p->mu);
    wxg_test_send_all(p->client[i], p->rep, rep_sent);
    pair_close(p, i);
}

static void accept_one(wxg_test_proxy_t *p)
{
    int c = accept(p->lfd, NULL, NULL);
    if (c < 0)
        return;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->upstream)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < PAIRS; i++) {
        if (p->client[i] >= 0)
            continue;
        if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
            p->client[i] = c;
            p->server[i] = s;
            return;
        }
        break;
    }
    close(c); /* no room, or no server: the client sees its connection closed */
    if (s >= 0)
        close(s);
}

/* Forwards what one side of pair i has; a closed or failed side closes the pair. */
static void forward(wxg_test_proxy_t *p, int i, int from_client)
{
    char chunk[16384];
    int from = from_client ? p->client[i] : p->server[i];
    int to = from_client ? p->server[i] : p->client[i];
    ssize_t n = recv(from, chunk, sizeof chunk, 0);
    int delay = from_client ? get(p, &p->delay_ms) : 0;
    if (n > 0 && delay > 0)
        usleep((useconds_t)delay * 1000); /* a late command: a stalled network or client */
    if (n <= 0 || wxg_test_send_all(to, chunk, (size_t)n) != 0)
        pair_close(p, i);
}

static void *proxy_main(void *arg)
{
    wxg_test_proxy_t *p = arg;
    while (!get(p, &p->stop)) {
        if (get(p, &p->drop)) {
            for (int i = 0; i < PAIRS; i++)
                if (p->client[i] >= 0)
                    pair_close(p, i);
            set(p, &p->drop, 0);
        }
        struct pollfd q[1 + 2 * PAIRS];
        int idx[1 + 2 * PAIRS], n = 0;
        q[n] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
        idx[n++] = -1;
        for (int i = 0; i < PAIRS; i++) {
            if (p->client[i] < 0)
                continue;
            q[n] = (struct pollfd){.fd = p->client[i], .events = POLLIN};
            idx[n++] = 2 * i;
            q[n] = (struct pollfd){.fd = p->server[i], .events = POLLIN};
            idx[n++] = 2 * i + 1;
        }
        if (poll(q, (nfds_t)n, 20) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (!(q[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (idx[k] < 0) {
                accept_one(p);
                continue;
            }
            int i = idx[k] / 2, from_client = idx[k] % 2 == 0;
            if (p->client[i] < 0)
                continue; /* closed earlier in this round */
            int how = get(p, &p->cut);
            if (from_client && how != WXG_TEST_CUT_NONE)
                cut(p, i, how);
            else
                forward(p, i, from_client);
        }
    }
    for (int i = 0; i < PAIRS; i++)
        if (p->client[i] >= 0)
            pair_close(p, i);
    return NULL;
}

wxg_test_proxy_t *wxg_test_proxy_start(int upstream)
{
    wxg_test_proxy_t *p = calloc(1, sizeof *p);
    if (!p)
        goto fail_alloc;
    p->upstream = upstream;
    for (int i = 0; i < PAIRS; i++)
        p->client[i] = p->server[i] = -1;
    p->buf = malloc(BUF);
    p->rep = malloc(BUF);
    if (!p->buf || !p->rep)
        goto fail_bufs;
    p->lfd = wxg_test_listen(&p->port);
    if (p->lfd < 0)
        goto fail_bufs;
    pthread_mutex_init(&p->mu, NULL);
    if (pthread_create(&p->th, NULL, proxy_main, p) != 0)
        goto fail_thread;
    return p;

fail_thread:
    pthread_mutex_destroy(&p->mu);
    close(p->lfd);
fail_bufs:
    free(p->buf);
    free(p->rep);
    free(p);
fail_alloc:
    fprintf(stderr, "testproxy: cannot start a proxy to port %d\n", upstream);
    return NULL;
}

int wxg_test_proxy_port(const wxg_test_proxy_t *p)
{
    return p->port;
}

void wxg_test_proxy_arm(wxg_test_proxy_t *p, int how)
{
    set(p, &p->cut, how);
}

int wxg_test_proxy_armed(wxg_test_proxy_t *p)
{
    return get(p, &p->cut);
}

void wxg_test_proxy_set_delay(wxg_test_proxy_t *p, int ms)
{
    set(p, &p->delay_ms, ms);
}

void wxg_test_proxy_drop(wxg_test_proxy_t *p)
{
    set(p, &p->drop, 1);
}

void wxg_test_proxy_last_cut(wxg_test_proxy_t *p, wxg_test_proxy_cut_t *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->last;
    pthread_mutex_unlock(&p->mu);
}

void wxg_test_proxy_stop(wxg_test_proxy_t *p)
{
    if (!p)
        return;
    set(p, &p->stop, 1);
    pthread_join(p->th, NULL);
    close(p->lfd);
    pthread_mutex_destroy(&p->mu);
    free(p->buf);
    free(p->rep);
    free(p);
}
