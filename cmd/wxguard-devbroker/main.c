/*
 * wxguard-devbroker: a Kafka-protocol broker with no JVM, for development and fault injection.
 *
 *   wxguard-devbroker [--brokers N] [--topic NAME:PARTITIONS]... [--bootstrap-file PATH]
 *                     [--control PATH] [--no-stdin] [--verbose]
 *
 * It wraps librdkafka's mock cluster (librdkafka/rdkafka_mock.h): N brokers (ids 1..N) listening
 * on ephemeral 127.0.0.1 ports, consumer groups with offset commits, and the mock's fault
 * injection, driven by one command per line on stdin or on a Unix-domain control socket. Each
 * command is answered with one line, "ok[ detail]" or "error: why". See docs/devbroker.md.
 *
 * The mock cluster lives inside a librdkafka handle (rd_kafka_mock_cluster_new needs one for its
 * book keeping): this program creates a producer handle with no bootstrap servers, which never
 * connects anywhere, and keeps it for the cluster's whole life.
 *
 * It is NOT a replacement for a real broker: the mock keeps at most 5 MiB (or 100,000 message
 * sets) per partition in memory and silently drops older ones, so a slow consumer can lose
 * messages that a real broker would keep. Use it for development and for fault tests, never
 * for volume tests or anything that must not lose data.
 *
 * Threads: the main thread runs the command loop; the mock cluster runs its own thread inside
 * librdkafka, and every rd_kafka_mock_* call hands its request over to that thread.
 *
 * Exit status: 0 after SIGTERM/SIGINT (or the "shutdown" command), 2 usage error, 3 start-up
 * failure.
 */
#include <errno.h>
#include <getopt.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "progclock.h"
#include "wxguard/common.h"

#define EXIT_USAGE   2
#define EXIT_STARTUP 3

#define MAX_TOPICS  64
#define MAX_CLIENTS 8
#define LINE_MAX_   1024
#define MAX_ARGS    32
#define MAX_ERRS    256
#define MAX_LATER   64

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: wxguard-devbroker [options]\n\n"
            "A development Kafka broker: librdkafka's mock cluster in a process, with fault\n"
            "injection. NOT a replacement for a real broker: it keeps only the last 5 MiB (or\n"
            "100,000 message sets) of each partition in memory and silently drops older\n"
            "messages, has no persistence, no security and no CreateTopics admin API. Use it\n"
            "for development and fault tests, never for volume tests.\n\n"
            "  -b, --brokers N          number of brokers, ids 1..N (default 3)\n"
            "  -t, --topic NAME:PARTS   create a topic (repeatable)\n"
            "  -f, --bootstrap-file P   write the bootstrap address to P once ready\n"
            "  -c, --control PATH       also accept commands on a Unix socket at PATH\n"
            "  -n, --no-stdin           do not read commands from stdin\n"
            "  -v, --verbose            librdkafka's mock logs on stderr\n"
            "  -h, --help               this text\n"
            "  -V, --version            the version\n\n"
            "The first line on stdout is the bootstrap address (127.0.0.1:port,...). Runs until\n"
            "SIGTERM or SIGINT. Commands, one per line, each answered 'ok' or 'error: ...':\n"
            "  topic NAME PARTS [RF]               create a topic\n"
            "  broker down|up ID                   disconnect / reconnect a broker (-1 = all)\n"
            "  rtt ID MS                           add round-trip latency (-1 = all brokers)\n"
            "  rack ID RACK                        set a broker's rack\n"
            "  coordinator group|transaction KEY ID  move a group / transaction coordinator\n"
            "  leader TOPIC PART ID                set a partition leader (-1 = leaderless)\n"
            "  follower TOPIC PART ID              set a partition's preferred replica\n"
            "  errors API COUNT ERR [ERR...]       the next COUNT requests of API fail with the\n"
            "                                      listed errors (the last one repeats)\n"
            "  broker-errors ID API ERR:MS [...]   per-broker errors with a delay each\n"
            "  clear-errors API                    drop the cluster's pending errors for API\n"
            "  error-count ID API                  pending per-broker errors for API\n"
            "  topic-error TOPIC ERR               error returned in Metadata for a topic\n"
            "  apiversion API MIN MAX              limit an API's versions (-1 -1 disables)\n"
            "  after MS COMMAND                    run COMMAND MS milliseconds from now (its\n"
            "                                      answer goes to stderr)\n"
            "  bootstrap | help | shutdown\n"
            "API is a name (OffsetCommit, Fetch, Heartbeat, ...) or a number; ERR is a Kafka\n"
            "error name with or without RD_KAFKA_RESP_ERR_ (REBALANCE_IN_PROGRESS, _TRANSPORT)\n"
            "or a number.\n");
}

/* ---- names ---- */

static const struct {
    const char *name;
    int16_t key;
} api_names[] = {
    {"Produce", 0},           {"Fetch", 1},           {"ListOffsets", 2},
    {"Metadata", 3},          {"OffsetCommit", 8},    {"OffsetFetch", 9},
    {"FindCoordinator", 10},  {"JoinGroup", 11},      {"Heartbeat", 12},
    {"LeaveGroup", 13},       {"SyncGroup", 14},      {"DescribeGroups", 15},
    {"ListGroups", 16},       {"SaslHandshake", 17},  {"ApiVersion", 18},
    {"ApiVersions", 18},      {"CreateTopics", 19},   {"DeleteTopics", 20},
    {"DeleteRecords", 21},    {"InitProducerId", 22}, {"AddPartitionsToTxn", 24},
    {"AddOffsetsToTxn", 25},  {"EndTxn", 26},         {"TxnOffsetCommit", 28},
    {"SaslAuthenticate", 36},
};

/* Parses a decimal integer in [lo, hi]. Returns 0 or -1. */
static int parse_int(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s)
        return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_api(const char *s, int16_t *out)
{
    long long v;
    if (parse_int(s, 0, 100, &v) == 0) {
        *out = (int16_t)v;
        return 0;
    }
    for (size_t i = 0; i < sizeof api_names / sizeof api_names[0]; i++) {
        if (strcasecmp(s, api_names[i].name) == 0) {
            *out = api_names[i].key;
            return 0;
        }
    }
    return -1;
}

static int parse_err(const char *s, rd_kafka_resp_err_t *out)
{
    long long v;
    if (parse_int(s, -200, 1000, &v) == 0) {
        *out = (rd_kafka_resp_err_t)v;
        return 0;
    }
    static const char prefix[] = "RD_KAFKA_RESP_ERR_";
    if (strncasecmp(s, prefix, sizeof prefix - 1) == 0)
        s += sizeof prefix - 1;
    const struct rd_kafka_err_desc *descs = NULL;
    size_t cnt = 0;
    rd_kafka_get_err_descs(&descs, &cnt);
    for (size_t i = 0; i < cnt; i++) {
        if (descs[i].name && strcasecmp(s, descs[i].name) == 0) {
            *out = descs[i].code;
            return 0;
        }
    }
    return -1;
}

/* ---- commands ---- */

/* A command scheduled by "after": lets a test start a fault and its end in one breath, e.g.
 * make a partition leaderless now and give it a leader again in five seconds, while the test
 * itself is blocked producing to that partition. */
typedef struct later {
    int64_t due_ms; /* 0: free slot */
    char line[LINE_MAX_];
} later;

typedef struct devbroker {
    rd_kafka_t *rk;
    rd_kafka_mock_cluster_t *mc;
    int brokers;
    later later[MAX_LATER];
} devbroker;

/* Writes the answer for one command into `ans`. Returns 1 when the command asks to stop. */
static int run_command(devbroker *d, char *line, char *ans, size_t ans_size)
{
    char *argv[MAX_ARGS];
    int argc = 0;
    for (char *p = line; *p && argc < MAX_ARGS;) {
        p += strspn(p, " \t\r\n");
        if (!*p)
            break;
        argv[argc++] = p;
        p += strcspn(p, " \t\r\n");
        if (*p)
            *p++ = '\0';
    }
    long long a, b, c;
    int16_t api;
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    snprintf(ans, ans_size, "ok");
    if (argc == 0 || argv[0][0] == '#') {
        ans[0] = '\0'; /* blank lines and comments get no answer */
        return 0;
    }
    const char *cmd = argv[0];
    if (strcmp(cmd, "after") == 0 && argc >= 3) {
        if (parse_int(argv[1], 0, 86400000, &a))
            goto bad_args;
        later *slot = NULL;
        for (int i = 0; i < MAX_LATER && !slot; i++)
            if (d->later[i].due_ms == 0)
                slot = &d->later[i];
        if (!slot) {
            snprintf(ans, ans_size, "error: too many scheduled commands (%d)", MAX_LATER);
            return 0;
        }
        /* Rebuild the rest of the line from its words (the parse cut it into pieces). */
        size_t off = 0;
        for (int i = 2; i < argc && off < sizeof slot->line; i++) {
            int w = snprintf(slot->line + off, sizeof slot->line - off, "%s%s", i > 2 ? " " : "",
                             argv[i]);
            off += w > 0 ? (size_t)w : 0;
        }
        slot->due_ms = prog_mono_ms() + a;
        if (slot->due_ms == 0)
            slot->due_ms = 1;
    } else if (strcmp(cmd, "help") == 0) {
        snprintf(ans, ans_size,
                 "ok commands: topic, broker down|up, rtt, rack, coordinator, leader, follower, "
                 "errors, broker-errors, clear-errors, error-count, topic-error, apiversion, "
                 "after, bootstrap, shutdown");
    } else if (strcmp(cmd, "bootstrap") == 0 && argc == 1) {
        snprintf(ans, ans_size, "ok %s", rd_kafka_mock_cluster_bootstraps(d->mc));
    } else if (strcmp(cmd, "shutdown") == 0 && argc == 1) {
        return 1;
    } else if (strcmp(cmd, "topic") == 0 && (argc == 3 || argc == 4)) {
        if (parse_int(argv[2], 1, 100000, &a) ||
            (argc == 4 ? parse_int(argv[3], 1, d->brokers, &b) : (b = 1, 0)))
            goto bad_args;
        err = rd_kafka_mock_topic_create(d->mc, argv[1], (int)a, (int)b);
    } else if (strcmp(cmd, "broker") == 0 && argc == 3) {
        if (parse_int(argv[2], -1, INT32_MAX, &a))
            goto bad_args;
        if (strcmp(argv[1], "down") == 0)
            err = rd_kafka_mock_broker_set_down(d->mc, (int32_t)a);
        else if (strcmp(argv[1], "up") == 0)
            err = rd_kafka_mock_broker_set_up(d->mc, (int32_t)a);
        else
            goto bad_args;
    } else if (strcmp(cmd, "rtt") == 0 && argc == 3) {
        if (parse_int(argv[1], -1, INT32_MAX, &a) || parse_int(argv[2], 0, 3600000, &b))
            goto bad_args;
        err = rd_kafka_mock_broker_set_rtt(d->mc, (int32_t)a, (int)b);
    } else if (strcmp(cmd, "rack") == 0 && argc == 3) {
        if (parse_int(argv[1], -1, INT32_MAX, &a))
            goto bad_args;
        err = rd_kafka_mock_broker_set_rack(d->mc, (int32_t)a, argv[2]);
    } else if (strcmp(cmd, "coordinator") == 0 && argc == 4) {
        if ((strcmp(argv[1], "group") != 0 && strcmp(argv[1], "transaction") != 0) ||
            parse_int(argv[3], -1, INT32_MAX, &a))
            goto bad_args;
        err = rd_kafka_mock_coordinator_set(d->mc, argv[1], argv[2], (int32_t)a);
    } else if ((strcmp(cmd, "leader") == 0 || strcmp(cmd, "follower") == 0) && argc == 4) {
        if (parse_int(argv[2], 0, INT32_MAX, &a) || parse_int(argv[3], -1, INT32_MAX, &b))
            goto bad_args;
        if (cmd[0] == 'l')
            err = rd_kafka_mock_partition_set_leader(d->mc, argv[1], (int32_t)a, (int32_t)b);
        else
            err = rd_kafka_mock_partition_set_follower(d->mc, argv[1], (int32_t)a, (int32_t)b);
    } else if (strcmp(cmd, "errors") == 0 && argc >= 4) {
        rd_kafka_resp_err_t errs[MAX_ERRS];
        if (parse_api(argv[1], &api) || parse_int(argv[2], 1, MAX_ERRS, &a))
            goto bad_args;
        int given = argc - 3;
        for (int i = 0; i < a; i++) {
            const char *name = argv[3 + (i < given ? i : given - 1)];
            if (parse_err(name, &errs[i])) {
                snprintf(ans, ans_size, "error: unknown error name %s", name);
                return 0;
            }
        }
        rd_kafka_mock_push_request_errors_array(d->mc, api, (size_t)a, errs);
    } else if (strcmp(cmd, "broker-errors") == 0 && argc >= 4) {
        if (parse_int(argv[1], 0, INT32_MAX, &a) || parse_api(argv[2], &api))
            goto bad_args;
        for (int i = 3; i < argc && !err; i++) {
            char *colon = strchr(argv[i], ':');
            if (colon)
                *colon = '\0';
            rd_kafka_resp_err_t e;
            if (parse_err(argv[i], &e) || (colon ? parse_int(colon + 1, 0, 3600000, &b) : (b = 0)))
                goto bad_args;
            err =
                rd_kafka_mock_broker_push_request_error_rtts(d->mc, (int32_t)a, api, 1, e, (int)b);
        }
    } else if (strcmp(cmd, "clear-errors") == 0 && argc == 2) {
        if (parse_api(argv[1], &api))
            goto bad_args;
        rd_kafka_mock_clear_request_errors(d->mc, api);
    } else if (strcmp(cmd, "error-count") == 0 && argc == 3) {
        size_t cnt = 0;
        if (parse_int(argv[1], 0, INT32_MAX, &a) || parse_api(argv[2], &api))
            goto bad_args;
        err = rd_kafka_mock_broker_error_stack_cnt(d->mc, (int32_t)a, api, &cnt);
        if (!err)
            snprintf(ans, ans_size, "ok %zu", cnt);
    } else if (strcmp(cmd, "topic-error") == 0 && argc == 3) {
        rd_kafka_resp_err_t e;
        if (parse_err(argv[2], &e))
            goto bad_args;
        rd_kafka_mock_topic_set_error(d->mc, argv[1], e);
    } else if (strcmp(cmd, "apiversion") == 0 && argc == 4) {
        if (parse_api(argv[1], &api) || parse_int(argv[2], -1, 100, &b) ||
            parse_int(argv[3], -1, 100, &c))
            goto bad_args;
        err = rd_kafka_mock_set_apiversion(d->mc, api, (int16_t)b, (int16_t)c);
    } else {
        snprintf(ans, ans_size, "error: unknown command or wrong arguments (try help)");
        return 0;
    }
    if (err)
        snprintf(ans, ans_size, "error: %s", rd_kafka_err2name(err));
    return 0;

bad_args:
    snprintf(ans, ans_size, "error: bad arguments for %s (try help)", cmd);
    return 0;
}

/* ---- line-oriented channels (stdin and control-socket clients) ---- */

typedef struct chan {
    int fd;  /* -1: closed */
    int out; /* where answers go */
    size_t len;
    char buf[LINE_MAX_];
} chan;

static void chan_answer(int fd, const char *ans)
{
    if (!ans[0])
        return;
    char line[LINE_MAX_ + 16];
    int n = snprintf(line, sizeof line, "%s\n", ans);
    size_t left = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    const char *p = line;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* the reader went away: nothing to tell it */
        p += w;
        left -= (size_t)w;
    }
}

/* Reads what is available and runs complete lines. Returns -1 on EOF or error, 1 when a
 * command asked to stop, else 0. */
static int chan_read(devbroker *d, chan *ch)
{
    ssize_t r = read(ch->fd, ch->buf + ch->len, sizeof ch->buf - 1 - ch->len);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (r <= 0)
        return -1;
    ch->len += (size_t)r;
    int stop = 0;
    for (;;) {
        char *nl = memchr(ch->buf, '\n', ch->len);
        if (!nl && ch->len < sizeof ch->buf - 1)
            break;
        size_t linelen = nl ? (size_t)(nl - ch->buf) : ch->len;
        char line[LINE_MAX_];
        memcpy(line, ch->buf, linelen);
        line[linelen] = '\0';
        size_t used = nl ? linelen + 1 : linelen;
        memmove(ch->buf, ch->buf + used, ch->len - used);
        ch->len -= used;
        char ans[LINE_MAX_];
        if (!nl)
            snprintf(ans, sizeof ans, "error: line too long");
        else
            stop |= run_command(d, line, ans, sizeof ans);
        chan_answer(ch->out, ans);
    }
    return stop;
}

static int listen_unix(const char *path)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        fprintf(stderr, "wxguard-devbroker: control path too long: %s\n", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, MAX_CLIENTS) != 0) {
        fprintf(stderr, "wxguard-devbroker: control socket %s: %s\n", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Writes the bootstrap address to `path` through a temporary file and rename(), so that a
 * reader polling for the file never sees it half written. */
static int write_bootstrap_file(const char *path, const char *bootstrap)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return -1;
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    int bad = fprintf(f, "%s\n", bootstrap) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"brokers", required_argument, NULL, 'b'},
        {"topic", required_argument, NULL, 't'},
        {"bootstrap-file", required_argument, NULL, 'f'},
        {"control", required_argument, NULL, 'c'},
        {"no-stdin", no_argument, NULL, 'n'},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    long long brokers = 3;
    const char *topics[MAX_TOPICS];
    int ntopics = 0, use_stdin = 1, verbose = 0;
    const char *bootstrap_file = NULL, *control = NULL;
    int o;
    while ((o = getopt_long(argc, argv, "b:t:f:c:nvhV", opts, NULL)) != -1) {
        switch (o) {
        case 'b':
            if (parse_int(optarg, 1, 32, &brokers)) {
                fprintf(stderr, "wxguard-devbroker: --brokers wants 1..32\n");
                return EXIT_USAGE;
            }
            break;
        case 't':
            if (ntopics == MAX_TOPICS || !strchr(optarg, ':')) {
                fprintf(stderr, "wxguard-devbroker: --topic wants NAME:PARTITIONS (at most %d)\n",
                        MAX_TOPICS);
                return EXIT_USAGE;
            }
            topics[ntopics++] = optarg;
            break;
        case 'f':
            bootstrap_file = optarg;
            break;
        case 'c':
            control = optarg;
            break;
        case 'n':
            use_stdin = 0;
            break;
        case 'v':
            verbose = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("wxguard-devbroker %s (librdkafka %s)\n", WXG_VERSION_STRING,
                   rd_kafka_version_str());
            return 0;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return EXIT_USAGE;
    }

    int rc = EXIT_STARTUP, lfd = -1;
    devbroker d = {.brokers = (int)brokers};
    chan chans[1 + MAX_CLIENTS];
    for (size_t i = 0; i < sizeof chans / sizeof chans[0]; i++)
        chans[i].fd = -1;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll() returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a control client that hangs up must not kill the broker */

    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "log_level", verbose ? "7" : "3", errstr, sizeof errstr) ||
        rd_kafka_conf_set(conf, "client.id", "wxguard-devbroker", errstr, sizeof errstr)) {
        fprintf(stderr, "wxguard-devbroker: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return EXIT_STARTUP;
    }
    if (verbose && rd_kafka_conf_set(conf, "debug", "mock", errstr, sizeof errstr))
        fprintf(stderr, "wxguard-devbroker: %s (mock logs unavailable)\n", errstr);
    /* The host handle: a producer with no bootstrap servers never connects anywhere. */
    d.rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (!d.rk) {
        fprintf(stderr, "wxguard-devbroker: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return EXIT_STARTUP;
    }
    d.mc = rd_kafka_mock_cluster_new(d.rk, d.brokers);
    if (!d.mc) {
        fprintf(stderr, "wxguard-devbroker: could not create the mock cluster\n");
        goto out;
    }
    for (int i = 0; i < ntopics; i++) {
        char name[512];
        const char *colon = strrchr(topics[i], ':');
        size_t nl = (size_t)(colon - topics[i]);
        long long parts;
        if (nl == 0 || nl >= sizeof name || parse_int(colon + 1, 1, 100000, &parts)) {
            fprintf(stderr, "wxguard-devbroker: bad --topic %s\n", topics[i]);
            rc = EXIT_USAGE;
            goto out;
        }
        memcpy(name, topics[i], nl);
        name[nl] = '\0';
        rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(d.mc, name, (int)parts, 1);
        if (err) {
            fprintf(stderr, "wxguard-devbroker: topic %s: %s\n", name, rd_kafka_err2str(err));
            goto out;
        }
    }
    if (control) {
        lfd = listen_unix(control);
        if (lfd < 0)
            goto out;
    }
    const char *bootstrap = rd_kafka_mock_cluster_bootstraps(d.mc);
    if (bootstrap_file && write_bootstrap_file(bootstrap_file, bootstrap) != 0) {
        fprintf(stderr, "wxguard-devbroker: cannot write %s: %s\n", bootstrap_file,
                strerror(errno));
        goto out;
    }
    printf("%s\n", bootstrap);
    fflush(stdout);
    if (use_stdin) {
        chans[0].fd = STDIN_FILENO;
        chans[0].out = STDOUT_FILENO;
        chans[0].len = 0;
    }

    rc = 0;
    while (!stop_requested) {
        struct pollfd pfd[2 + MAX_CLIENTS];
        int idx[2 + MAX_CLIENTS];
        nfds_t n = 0;
        for (int i = 0; i < 1 + MAX_CLIENTS; i++) {
            if (chans[i].fd >= 0) {
                pfd[n] = (struct pollfd){.fd = chans[i].fd, .events = POLLIN};
                idx[n++] = i;
            }
        }
        if (lfd >= 0) {
            pfd[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
            idx[n++] = -1;
        }
        int64_t now = prog_mono_ms(), wait_ms = 1000;
        for (int i = 0; i < MAX_LATER; i++) {
            if (d.later[i].due_ms && d.later[i].due_ms - now < wait_ms)
                wait_ms = d.later[i].due_ms > now ? d.later[i].due_ms - now : 0;
        }
        /* Without any channel (stdin closed, no socket) this just waits for a signal. */
        int pr = poll(pfd, n, (int)wait_ms);
        now = prog_mono_ms();
        for (int i = 0; i < MAX_LATER && !stop_requested; i++) {
            if (!d.later[i].due_ms || d.later[i].due_ms > now)
                continue;
            char line[LINE_MAX_], ans[LINE_MAX_];
            memcpy(line, d.later[i].line, sizeof line);
            d.later[i].due_ms = 0;
            if (run_command(&d, line, ans, sizeof ans))
                stop_requested = 1;
            fprintf(stderr, "wxguard-devbroker: after: %s: %s\n", d.later[i].line, ans);
        }
        if (pr <= 0)
            continue;
        for (nfds_t i = 0; i < n && !stop_requested; i++) {
            if (!pfd[i].revents)
                continue;
            if (idx[i] < 0) {
                int cfd = accept(lfd, NULL, NULL);
                if (cfd < 0)
                    continue;
                int slot = -1;
                for (int j = 1; j < 1 + MAX_CLIENTS && slot < 0; j++)
                    if (chans[j].fd < 0)
                        slot = j;
                if (slot < 0) {
                    chan_answer(cfd, "error: too many control clients");
                    close(cfd);
                    continue;
                }
                chans[slot].fd = chans[slot].out = cfd;
                chans[slot].len = 0;
                continue;
            }
            chan *ch = &chans[idx[i]];
            int r = chan_read(&d, ch);
            if (r > 0)
                stop_requested = 1;
            if (r < 0) {
                /* stdin at EOF: keep serving until a signal (a backgrounded broker has none). */
                if (ch->fd != STDIN_FILENO)
                    close(ch->fd);
                ch->fd = -1;
            }
        }
    }

out:
    for (int i = 1; i < 1 + MAX_CLIENTS; i++)
        if (chans[i].fd >= 0)
            close(chans[i].fd);
    if (lfd >= 0) {
        close(lfd);
        unlink(control);
    }
    if (bootstrap_file && rc == 0)
        unlink(bootstrap_file);
    if (d.mc)
        rd_kafka_mock_cluster_destroy(d.mc);
    rd_kafka_destroy(d.rk);
    return rc;
}
