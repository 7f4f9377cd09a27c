/*
 * wxguard-bench post: the feed subcommand's stream of callbacks, POSTed to wxguard-ingest over
 * HTTP the way a gateway delivers them (one request per callback, several at once).
 *
 *   post --port P [--host 127.0.0.1] --messages N [--dup R] [--seed S] [--replay M]
 *        [--accounts A] [--threads T]
 *
 * The stream is wxgb_make_stream's (the same seed gives the same stream, so --replay M re-sends
 * its first M callbacks: duplicates after the fact), spread over A bot accounts, each callback to
 * /v1/callback/<format>. One in ten says "你好" and about one in seven asks about prices, so
 * that autoreply rules have something to answer. A 503 or a failed connection is retried, as a
 * gateway does, up to 20 times with a growing pause; any other answer than 200 is counted as
 * refused. Prints one line:
 *
 *   posted=N accepted=N retried=N refused=N unique=U hello=H price_group=G price_private=P
 *
 * where hello, price_group and price_private count the unique messages of each kind (wkteam
 * callbacks are group messages, GeWe and generic ones private chats). Exit status 1 when a
 * callback was refused.
 */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define MAX_THREADS 64

static const char *const format_path[] = {"wkteam", "gewe", "generic"};

typedef struct post_job {
    const wxgb_rec_t *recs;
    size_t n;
    struct sockaddr_in addr;
    atomic_size_t next, accepted, retried, refused;
} post_job;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One request on a new connection; returns the status code, or -1 without an answer. */
static int post_once(const struct sockaddr_in *addr, const char *path, const char *body, size_t len)
{
    int status = -1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      path, len);
    if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) != 0)
        goto out;
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl)
        goto out;
    for (size_t off = 0; off < len;) {
        ssize_t w = send(fd, body + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            goto out;
        off += (size_t)w;
    }
    char resp[512];
    size_t got = 0;
    while (got < sizeof resp - 1) {
        ssize_t r = recv(fd, resp + got, sizeof resp - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    resp[got] = '\0';
    int code = 0;
    if (sscanf(resp, "HTTP/1.%*d %d", &code) == 1)
        status = code;
out:
    close(fd);
    return status;
}

static void *post_worker(void *arg)
{
    post_job *job = arg;
    char *body = malloc(8192);
    if (!body)
        return NULL;
    for (;;) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->n)
            break;
        const wxgb_rec_t *r = &job->recs[i];
        size_t len = wxgb_render(body, 8192, r, 0);
        char path[64];
        snprintf(path, sizeof path, "/v1/callback/%s", format_path[r->format % 3]);
        int status = -1;
        for (int attempt = 0; attempt < 20; attempt++) {
            status = len ? post_once(&job->addr, path, body, len) : 400;
            if (status != -1 && status != 503)
                break;
            atomic_fetch_add(&job->retried, 1);
            sleep_ms(50L * (attempt + 1));
        }
        atomic_fetch_add(status == 200 ? &job->accepted : &job->refused, 1);
        if (status != 200)
            fprintf(stderr, "post: callback %zu answered %d\n", i, status);
    }
    free(body);
    return NULL;
}

static void post_usage(FILE *f)
{
    fprintf(f, "usage: wxguard-bench post --port P [--host 127.0.0.1] --messages N [--dup R]\n"
               "       [--seed S] [--replay M] [--accounts A] [--threads T]\n");
}

int wxgb_post_main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    uint64_t port = 0, messages = 0, seed = 1, replay = 0, accounts = 3, threads = 8;
    double dup = 0.25;
    static const struct option lo[] = {
        {"host", required_argument, NULL, 'H'},     {"port", required_argument, NULL, 'P'},
        {"messages", required_argument, NULL, 'n'}, {"dup", required_argument, NULL, 'd'},
        {"seed", required_argument, NULL, 's'},     {"replay", required_argument, NULL, 'r'},
        {"accounts", required_argument, NULL, 'a'}, {"threads", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'H':
            host = optarg;
            break;
        case 'P':
            if (wxgb_parse_u64(optarg, &port) || port > 65535)
                goto usage;
            break;
        case 'n':
            if (wxgb_parse_u64(optarg, &messages))
                goto usage;
            break;
        case 'd':
            dup = strtod(optarg, NULL);
            if (dup < 0 || dup > 0.9)
                goto usage;
            break;
        case 's':
            if (wxgb_parse_u64(optarg, &seed))
                goto usage;
            break;
        case 'r':
            if (wxgb_parse_u64(optarg, &replay))
                goto usage;
            break;
        case 'a':
            if (wxgb_parse_u64(optarg, &accounts) || accounts > 100)
                goto usage;
            break;
        case 'T':
            if (wxgb_parse_u64(optarg, &threads) || threads > MAX_THREADS)
                goto usage;
            break;
        case 'h':
            post_usage(stdout);
            return 0;
        default:
            goto usage;
        }
    }
    if (!port || !messages)
        goto usage;
    post_job job;
    memset(&job, 0, sizeof job);
    job.addr.sin_family = AF_INET;
    job.addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &job.addr.sin_addr) != 1) {
        fprintf(stderr, "post: --host must be an IPv4 address\n");
        return 2;
    }
    wxgb_rec_t *recs = calloc(messages, sizeof *recs);
    if (!recs)
        return 1;
    int unique = wxgb_make_stream(recs, messages, 1, dup, 40,
                                  7301234500000000000ULL + seed * 1000000ULL, 3, (unsigned)seed);
    /* The account and text follow from the id, so a duplicate (a copy of the record) keeps
     * them, and the counts below are per unique message. */
    uint64_t hello = 0, price_group = 0, price_private = 0;
    uint64_t last_id = 0;
    for (size_t i = 0; i < messages; i++) {
        uint64_t id = recs[i].id;
        recs[i].account = (int)(id % accounts);
        recs[i].text = id % 10 == 3  ? WXGB_TEXT_HELLO
                       : id % 7 == 5 ? WXGB_TEXT_PRICE
                                     : WXGB_TEXT_PLAIN;
        if (i > 0 && id <= last_id)
            continue; /* a duplicate: ids of new messages only grow */
        last_id = id;
        hello += recs[i].text == WXGB_TEXT_HELLO;
        price_group += recs[i].text == WXGB_TEXT_PRICE && recs[i].format == 0;
        price_private += recs[i].text == WXGB_TEXT_PRICE && recs[i].format != 0;
    }
    job.recs = recs;
    job.n = replay ? (replay < messages ? replay : messages) : messages;
    pthread_t th[MAX_THREADS];
    uint64_t started = 0;
    for (; started < (threads ? threads : 1); started++) {
        if (pthread_create(&th[started], NULL, post_worker, &job) != 0)
            break;
    }
    if (started == 0)
        post_worker(&job);
    for (uint64_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    size_t refused = atomic_load(&job.refused);
    printf("posted=%zu accepted=%zu retried=%zu refused=%zu unique=%d hello=%llu "
           "price_group=%llu price_private=%llu\n",
           job.n, atomic_load(&job.accepted), atomic_load(&job.retried), refused, unique,
           (unsigned long long)hello, (unsigned long long)price_group,
           (unsigned long long)price_private);
    free(recs);
    return refused ? 1 : 0;
usage:
    post_usage(stderr);
    return 2;
}
