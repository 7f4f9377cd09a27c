/*
 * wxguard-bench hostile: hostile HTTP clients against wxguard-ingest on 127.0.0.1, for a bounded
 * time, while another tool (wrk, in bench/ingest_hostile.sh) measures what honest clients see.
 *
 *   hostile --port P --seconds S [--slow-headers N] [--slow-bodies N] [--idle N]
 *           [--bad-per-second R] [--burst N] [--burst-every S]
 *
 *   --slow-headers N    N clients sending a request's headers one byte a second
 *   --slow-bodies N     N clients sending a body (Content-Length 4000) one byte a second
 *   --idle N            N connections that send nothing
 *   --bad-per-second R  R requests a second with bad framing or oversized headers, in turn:
 *                       70 KB header, non-numeric and conflicting Content-Length,
 *                       Content-Length with chunked, Transfer-Encoding gzip
 *   --burst N           every --burst-every seconds (default 5), N connections at once, each
 *                       with a complete callback
 *
 * A client that the server cuts connects again at once, so the pressure lasts the whole run.
 * Every loop ends by --seconds (at most 3600); only 127.0.0.1 is ever contacted. Prints one
 * summary line at the end, e.g.
 *
 *   hostile: seconds=25 slow_headers=8 slow_cut=16 slow_cut_ms_max=10250 slow_bodies=8 ...
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define MAX_SLOW   256
#define MAX_IDLE   1024
#define MAX_BURST  4000
#define BAD_KINDS  5
#define STATUS_MAX 600

typedef struct hostile {
    struct sockaddr_in addr;
    int64_t end_us;
    atomic_int slow_cut[2]; /* [headers, bodies]: connections the server cut */
    atomic_llong slow_cut_ms_max[2];
    atomic_int idle_closed;
    atomic_int bad_sent, bad_unanswered;
    atomic_int status[STATUS_MAX]; /* answers to bad requests and bursts, by status */
    atomic_int burst_closed, burst_hung, bursts;
    int idle, bad_rate, burst, burst_every;
} hostile;

typedef struct slow_arg {
    hostile *h;
    int body;
} slow_arg;

static int running(const hostile *h)
{
    return prog_mono_us() < h->end_us;
}

static int dial(const hostile *h, int nonblock)
{
    int fd = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (const struct sockaddr *)&h->addr, sizeof h->addr) != 0 &&
        errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void count_status(hostile *h, const char *buf)
{
    int st = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &st) == 1 && st > 0 && st < STATUS_MAX)
        atomic_fetch_add(&h->status[st], 1);
}

/* One slow client after another until the run ends. */
static void *slow_main(void *arg)
{
    slow_arg *a = arg;
    hostile *h = a->h;
    static const char head[] = "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               "Content-Length: 4000\r\n\r\n";
    while (running(h)) {
        int fd = dial(h, 0);
        if (fd < 0) {
            sleep_ms(100);
            continue;
        }
        int64_t t0 = prog_mono_us();
        size_t i = 0;
        if (a->body && send(fd, head, sizeof head - 1, MSG_NOSIGNAL) != (ssize_t)sizeof head - 1)
            i = sizeof head; /* cut at once */
        int cut = 0;
        while (!cut && running(h)) {
            char c = a->body ? ' ' : (i < 52 ? head[i] : 'x');
            i++;
            if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) {
                cut = 1;
                break;
            }
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            char buf[256];
            if (poll(&pfd, 1, 1000) > 0 && recv(fd, buf, sizeof buf, 0) >= 0)
                cut = 1; /* an answer or the end of the stream: either way, cut */
        }
        close(fd);
        if (cut) {
            long long ms = (prog_mono_us() - t0) / 1000;
            atomic_fetch_add(&h->slow_cut[a->body], 1);
            long long seen = atomic_load(&h->slow_cut_ms_max[a->body]);
            while (ms > seen &&
                   !atomic_compare_exchange_weak(&h->slow_cut_ms_max[a->body], &seen, ms))
                ;
        }
    }
    return NULL;
}

/* Keeps `idle` silent connections open; one the server closes is opened again. */
static void *idle_main(void *arg)
{
    hostile *h = arg;
    int *fds = calloc((size_t)h->idle, sizeof *fds);
    struct pollfd *pf = calloc((size_t)h->idle, sizeof *pf);
    if (fds == NULL || pf == NULL)
        goto out;
    for (int i = 0; i < h->idle; i++)
        fds[i] = -1;
    while (running(h)) {
        for (int i = 0; i < h->idle; i++) {
            if (fds[i] < 0)
                fds[i] = dial(h, 1);
            pf[i].fd = fds[i];
            pf[i].events = POLLIN;
            pf[i].revents = 0;
        }
        if (poll(pf, (nfds_t)h->idle, 200) <= 0)
            continue;
        for (int i = 0; i < h->idle; i++) {
            char buf[64];
            if (fds[i] >= 0 && (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
                recv(fds[i], buf, sizeof buf, MSG_DONTWAIT) <= 0) {
                close(fds[i]);
                fds[i] = -1;
                atomic_fetch_add(&h->idle_closed, 1);
            }
        }
    }
    for (int i = 0; i < h->idle; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
    }
out:
    free(fds);
    free(pf);
    return NULL;
}

/* Writes bad request number `kind` into buf; returns its length. */
static size_t bad_request(char *buf, size_t size, int kind)
{
    static const char pre[] = "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    static const char body[] = "{\"account\":\"wxid_hostile01\",\"msg_id\":\"1\"}";
    int n = 0;
    switch (kind) {
    case 0: /* a 70 KB header */
        n = snprintf(buf, size, "%sX-Big: ", pre);
        if (n > 0 && (size_t)n + 70000 + 64 < size) {
            memset(buf + n, 'a', 70000);
            n += 70000;
            n += snprintf(buf + n, size - (size_t)n, "\r\nContent-Length: 0\r\n\r\n");
        }
        break;
    case 1:
        n = snprintf(buf, size, "%sContent-Length: abc\r\n\r\n%s", pre, body);
        break;
    case 2:
        n = snprintf(buf, size, "%sContent-Length: %zu\r\nContent-Length: 5\r\n\r\n%s", pre,
                     sizeof body - 1, body);
        break;
    case 3:
        n = snprintf(
            buf, size,
            "%sContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n", pre,
            sizeof body - 1, body);
        break;
    default:
        n = snprintf(buf, size, "%sTransfer-Encoding: gzip\r\n\r\n%s", pre, body);
    }
    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

/* bad_rate bad requests a second, each on its own connection, its answer read (5 s at most). */
static void *bad_main(void *arg)
{
    hostile *h = arg;
    char *buf = malloc(80000);
    if (buf == NULL)
        return NULL;
    for (int k = 0; running(h); k++) {
        int64_t next = prog_mono_us() + 1000000 / h->bad_rate;
        size_t len = bad_request(buf, 80000, k % BAD_KINDS);
        int fd = dial(h, 0);
        if (fd >= 0 && len > 0) {
            struct timeval tv = {5, 0};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            (void)send(fd, buf, len, MSG_NOSIGNAL);
            char ans[512];
            ssize_t got = recv(fd, ans, sizeof ans - 1, 0);
            atomic_fetch_add(&h->bad_sent, 1);
            if (got > 0) {
                ans[got] = '\0';
                count_status(h, ans);
            } else {
                atomic_fetch_add(&h->bad_unanswered, 1);
            }
        }
        if (fd >= 0)
            close(fd);
        int64_t left = next - prog_mono_us();
        if (left > 0)
            sleep_ms((long)(left / 1000));
    }
    free(buf);
    return NULL;
}

/* One burst: `burst` connections at once, a callback on each, every answer (or close) awaited
 * for at most 10 s. */
static void burst_once(hostile *h, int *fds, int *state, struct pollfd *pf)
{
    int open = 0;
    for (int i = 0; i < h->burst; i++) {
        fds[i] = dial(h, 1);
        state[i] = fds[i] < 0 ? 2 : 0; /* 0 to send, 1 sent, 2 over */
        open += fds[i] >= 0;
    }
    int64_t end = prog_mono_us() + 10000000;
    while (open > 0 && prog_mono_us() < end) {
        for (int i = 0; i < h->burst; i++) {
            pf[i].fd = state[i] == 2 ? -1 : fds[i];
            pf[i].events = state[i] == 0 ? POLLOUT : POLLIN;
            pf[i].revents = 0;
        }
        if (poll(pf, (nfds_t)h->burst, 200) <= 0)
            continue;
        for (int i = 0; i < h->burst; i++) {
            char buf[512];
            if (state[i] == 2 || pf[i].revents == 0)
                continue;
            if (state[i] == 0 && (pf[i].revents & POLLOUT)) {
                static atomic_int next_id = 1;
                char body[160];
                int bl = snprintf(body, sizeof body,
                                  "{\"account\":\"wxid_hostile01\",\"msg_id\":\"9%09d\","
                                  "\"conversation\":\"wxid_burst\",\"content\":\"burst\"}",
                                  atomic_fetch_add(&next_id, 1));
                int n = snprintf(buf, sizeof buf,
                                 "POST /v1/callback/generic HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Connection: close\r\nContent-Length: %d\r\n\r\n%s",
                                 bl, body);
                state[i] = send(fds[i], buf, (size_t)n, MSG_NOSIGNAL) == n ? 1 : 2;
                if (state[i] == 2)
                    atomic_fetch_add(&h->burst_closed, 1);
            } else {
                ssize_t got = recv(fds[i], buf, sizeof buf - 1, 0);
                if (got > 0) {
                    buf[got] = '\0';
                    count_status(h, buf);
                } else {
                    atomic_fetch_add(&h->burst_closed, 1);
                }
                state[i] = 2;
            }
            open -= state[i] == 2;
        }
    }
    for (int i = 0; i < h->burst; i++) {
        if (state[i] != 2)
            atomic_fetch_add(&h->burst_hung, 1);
        if (fds[i] >= 0)
            close(fds[i]);
    }
    atomic_fetch_add(&h->bursts, 1);
}

static void *burst_main(void *arg)
{
    hostile *h = arg;
    int *fds = calloc((size_t)h->burst, sizeof *fds);
    int *state = calloc((size_t)h->burst, sizeof *state);
    struct pollfd *pf = calloc((size_t)h->burst, sizeof *pf);
    while (fds != NULL && state != NULL && pf != NULL && running(h)) {
        int64_t next = prog_mono_us() + (int64_t)h->burst_every * 1000000;
        burst_once(h, fds, state, pf);
        while (running(h) && prog_mono_us() < next)
            sleep_ms(100);
    }
    free(fds);
    free(state);
    free(pf);
    return NULL;
}

static void report(hostile *h, uint64_t seconds, int slow_headers, int slow_bodies)
{
    printf("hostile: seconds=%llu slow_headers=%d cut=%d cut_ms_max=%lld slow_bodies=%d cut=%d "
           "cut_ms_max=%lld idle=%d idle_closed=%d bad_sent=%d bad_unanswered=%d bursts=%d x %d "
           "burst_closed=%d burst_hung=%d statuses:",
           (unsigned long long)seconds, slow_headers, atomic_load(&h->slow_cut[0]),
           atomic_load(&h->slow_cut_ms_max[0]), slow_bodies, atomic_load(&h->slow_cut[1]),
           atomic_load(&h->slow_cut_ms_max[1]), h->idle, atomic_load(&h->idle_closed),
           atomic_load(&h->bad_sent), atomic_load(&h->bad_unanswered), atomic_load(&h->bursts),
           h->burst, atomic_load(&h->burst_closed), atomic_load(&h->burst_hung));
    for (int st = 100; st < STATUS_MAX; st++) {
        if (atomic_load(&h->status[st]) > 0)
            printf(" %d=%d", st, atomic_load(&h->status[st]));
    }
    printf("\n");
}

static void hostile_usage(FILE *f)
{
    fprintf(f, "usage: wxguard-bench hostile --port P --seconds S [--slow-headers N]\n"
               "       [--slow-bodies N] [--idle N] [--bad-per-second R] [--burst N]\n"
               "       [--burst-every S]\n");
}

/* Parses one option value of at most `max` (0 allowed). */
static int opt_value(const char *s, uint64_t max, uint64_t *out)
{
    if (strcmp(s, "0") == 0) {
        *out = 0;
        return 0;
    }
    return wxgb_parse_u64(s, out) != 0 || *out > max ? -1 : 0;
}

int wxgb_hostile_main(int argc, char **argv)
{
    uint64_t port = 0, seconds = 0, sh = 0, sb = 0, idle = 0, bad = 0, burst = 0, every = 5;
    static const struct option lo[] = {{"port", required_argument, NULL, 'P'},
                                       {"seconds", required_argument, NULL, 's'},
                                       {"slow-headers", required_argument, NULL, 'H'},
                                       {"slow-bodies", required_argument, NULL, 'B'},
                                       {"idle", required_argument, NULL, 'i'},
                                       {"bad-per-second", required_argument, NULL, 'b'},
                                       {"burst", required_argument, NULL, 'u'},
                                       {"burst-every", required_argument, NULL, 'e'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    int ch, bad_opt = 0;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'P':
            bad_opt |= opt_value(optarg, 65535, &port);
            break;
        case 's':
            bad_opt |= opt_value(optarg, 3600, &seconds);
            break;
        case 'H':
            bad_opt |= opt_value(optarg, MAX_SLOW / 2, &sh);
            break;
        case 'B':
            bad_opt |= opt_value(optarg, MAX_SLOW / 2, &sb);
            break;
        case 'i':
            bad_opt |= opt_value(optarg, MAX_IDLE, &idle);
            break;
        case 'b':
            bad_opt |= opt_value(optarg, 1000, &bad);
            break;
        case 'u':
            bad_opt |= opt_value(optarg, MAX_BURST, &burst);
            break;
        case 'e':
            bad_opt |= opt_value(optarg, 3600, &every) || every == 0;
            break;
        case 'h':
            hostile_usage(stdout);
            return 0;
        default:
            bad_opt = 1;
        }
    }
    if (bad_opt || port == 0 || seconds == 0) {
        hostile_usage(stderr);
        return 2;
    }
    hostile *h = calloc(1, sizeof *h);
    if (h == NULL)
        return 1;
    h->addr.sin_family = AF_INET;
    h->addr.sin_port = htons((uint16_t)port);
    h->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    h->end_us = prog_mono_us() + (int64_t)seconds * 1000000;
    h->idle = (int)idle;
    h->bad_rate = (int)bad;
    h->burst = (int)burst;
    h->burst_every = (int)every;
    pthread_t th[MAX_SLOW + 3];
    slow_arg args[MAX_SLOW];
    int n = 0;
    for (uint64_t i = 0; i < sh + sb; i++) {
        args[i] = (slow_arg){.h = h, .body = i >= sh};
        if (pthread_create(&th[n], NULL, slow_main, &args[i]) == 0)
            n++;
    }
    if (idle > 0 && pthread_create(&th[n], NULL, idle_main, h) == 0)
        n++;
    if (bad > 0 && pthread_create(&th[n], NULL, bad_main, h) == 0)
        n++;
    if (burst > 0 && pthread_create(&th[n], NULL, burst_main, h) == 0)
        n++;
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    report(h, seconds, (int)sh, (int)sb);
    free(h);
    return 0;
}
