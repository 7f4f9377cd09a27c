/*
 * wxguard-bench: benchmark programs that print markdown tables.
 *
 *   wxguard-bench guard [options]   Redis cost of the idempotency guard vs a naive design
 *   wxguard-bench e2e [options]     the consumer end to end vs a plain librdkafka consumer
 *   wxguard-bench feed [options]    load generator for the demo and manual runs
 *   wxguard-bench post [options]    the same stream POSTed to wxguard-ingest over HTTP
 *   wxguard-bench hostile [options] slow, idle, malformed and bursting clients against ingest
 *
 * Each subcommand lives in its own file; this file only dispatches and holds small helpers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "wxguard/common.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand subcommands[] = {
    {"guard", wxgb_guard_main,
     "claim+complete throughput, Redis CPU and memory per DONE marker, batched/compact vs naive"},
    {"e2e", wxgb_e2e_main,
     "end-to-end messages/s through wxguard-consumer (noop plugin) vs a plain librdkafka reader"},
    {"feed", wxgb_feed_main,
     "create topics, feed a stream of callbacks with duplicates, wait for a group, count"},
    {"post", wxgb_post_main,
     "POST a stream of callbacks with duplicates to wxguard-ingest over HTTP"},
    {"protocol", wxgb_protocol_main,
     "Redis CPU of candidate native and Lua command sequences for a new message, beside the "
     "guard"},
    {"hostile", wxgb_hostile_main,
     "slow, idle, malformed and bursting HTTP clients against wxguard-ingest, for S seconds"},
};

int wxgb_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return -1;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v == 0 || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

int wxgb_parse_list(const char *s, int *out, int max)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 1 || v > 1024 || n == max)
            return -1;
        out[n++] = (int)v;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return n > 0 ? n : -1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: wxguard-bench <subcommand> [options]\n\nsubcommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-8s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(f, "\n'wxguard-bench <subcommand> --help' describes its options;\n"
               "'wxguard-bench --version' prints the version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
        printf("wxguard-bench %s\n", WXG_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++) {
        if (strcmp(argv[1], subcommands[i].name) == 0)
            return subcommands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "wxguard-bench: unknown subcommand '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
