/*
 * wxguard-bench feed: a load generator for the demo and for manual runs.
 *
 *   feed --bootstrap B --topic T --create P            create T with P partitions
 *   feed --bootstrap B --topic T --messages N [--dup R] [--poison K] [--seed S] [--replay M]
 *        [--convs C]
 *        produce N callbacks (wkteam, GeWe and generic formats), a share R of them duplicates
 *        of earlier ones, K undecodable records, over C conversations (default 40); with
 *        --replay, only the first M records of the same stream (the same seed) are produced
 *        again: duplicates after the fact
 *   feed --bootstrap B --topic T --partitions P --wait-group G [--timeout S]
 *        wait until group G committed the end offset of every partition
 *   feed --bootstrap B --topic T --partitions P --count   print the number of records in T
 *
 * Prints one line of key=value results per action.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static void feed_usage(FILE *f)
{
    fprintf(f, "usage: wxguard-bench feed --bootstrap HOST:PORT --topic T [--partitions P]\n"
               "       [--create P] [--messages N --dup R --poison K --seed S [--replay M]\n"
               "       [--convs C]]\n"
               "       [--wait-group G --timeout SECONDS] [--count]\n");
}

int wxgb_feed_main(int argc, char **argv)
{
    const char *bootstrap = NULL, *topic = NULL, *group = NULL;
    uint64_t create = 0, messages = 0, poison = 0, seed = 1, replay = 0, timeout = 120;
    uint64_t partitions = 1, convs = 40;
    double dup = 0.25;
    int count = 0;
    static const struct option lo[] = {{"bootstrap", required_argument, NULL, 'b'},
                                       {"topic", required_argument, NULL, 't'},
                                       {"create", required_argument, NULL, 'c'},
                                       {"messages", required_argument, NULL, 'n'},
                                       {"dup", required_argument, NULL, 'd'},
                                       {"poison", required_argument, NULL, 'x'},
                                       {"seed", required_argument, NULL, 's'},
                                       {"replay", required_argument, NULL, 'r'},
                                       {"partitions", required_argument, NULL, 'p'},
                                       {"wait-group", required_argument, NULL, 'g'},
                                       {"timeout", required_argument, NULL, 'T'},
                                       {"count", no_argument, NULL, 'C'},
                                       {"convs", required_argument, NULL, 'v'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'b':
            bootstrap = optarg;
            break;
        case 't':
            topic = optarg;
            break;
        case 'c':
            if (wxgb_parse_u64(optarg, &create) || create > 256)
                goto usage;
            partitions = create;
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
        case 'x':
            poison = strtoull(optarg, NULL, 10);
            break;
        case 's':
            if (wxgb_parse_u64(optarg, &seed))
                goto usage;
            break;
        case 'r':
            if (wxgb_parse_u64(optarg, &replay))
                goto usage;
            break;
        case 'p':
            if (wxgb_parse_u64(optarg, &partitions) || partitions > 256)
                goto usage;
            break;
        case 'g':
            group = optarg;
            break;
        case 'T':
            if (wxgb_parse_u64(optarg, &timeout))
                goto usage;
            break;
        case 'C':
            count = 1;
            break;
        case 'v':
            if (wxgb_parse_u64(optarg, &convs) || convs > 1000000)
                goto usage;
            break;
        case 'h':
            feed_usage(stdout);
            return 0;
        default:
            goto usage;
        }
    }
    if (!bootstrap || !topic)
        goto usage;
    if (create && wxgb_create_topic(bootstrap, topic, (int)create) != 0)
        return 1;
    if (messages) {
        wxgb_rec_t *recs = calloc(messages + poison, sizeof *recs);
        if (!recs)
            return 1;
        int unique =
            wxgb_make_stream(recs, messages, (int)partitions, dup, (int)convs,
                             7301234500000000000ULL + seed * 1000000ULL, 3, (unsigned)seed);
        size_t n = messages;
        /* Undecodable records, spread over the stream's partitions. */
        for (uint64_t i = 0; i < poison; i++)
            recs[n++] = (wxgb_rec_t){.partition = (int32_t)(i % partitions),
                                     .raw = "{\"wcId\": \"wxid_benchbot0001\", \"data\": {"};
        size_t send = replay ? (replay < n ? replay : n) : n;
        if (wxgb_produce(bootstrap, topic, recs, send, 120) != 0) {
            free(recs);
            return 1;
        }
        printf("produced=%zu unique=%d poison=%llu replay=%s\n", send, unique,
               (unsigned long long)(replay ? 0 : poison), replay ? "yes" : "no");
        free(recs);
    }
    if (group) {
        int64_t ends[256], com[256];
        int64_t total = wxgb_end_offsets(bootstrap, topic, (int)partitions, ends);
        time_t until = time(NULL) + (time_t)timeout;
        int64_t done = -1;
        while (time(NULL) < until) {
            done = wxgb_committed(bootstrap, group, topic, (int)partitions, com);
            int all = done >= 0;
            for (uint64_t p = 0; all && p < partitions; p++)
                all = com[p] == ends[p] || (ends[p] == 0 && com[p] < 0);
            if (all) {
                printf("committed=%lld end=%lld\n", (long long)done, (long long)total);
                fflush(stdout);
                return 0;
            }
            struct timespec ts = {0, 300000000};
            nanosleep(&ts, NULL);
        }
        printf("committed=%lld end=%lld timeout=true\n", (long long)done, (long long)total);
        return 1;
    }
    if (count) {
        int64_t ends[256];
        printf("records=%lld\n",
               (long long)wxgb_end_offsets(bootstrap, topic, (int)partitions, ends));
    }
    return 0;
usage:
    feed_usage(stderr);
    return 2;
}
