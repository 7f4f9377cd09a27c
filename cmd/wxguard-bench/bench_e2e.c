/*
 * wxguard-bench e2e: end-to-end throughput of the consumer.
 *
 * For each worker count: a fresh topic gets N callbacks (a share of them duplicates); a plain
 * librdkafka consumer that does no processing reads them (the ceiling), then an in-process
 * wxguard consumer with the noop plugin processes them against a real Redis. Reported per
 * row: messages/s of both and their ratio, p50/p99 of dispatch-to-finished latency (the time a
 * record waits until its offset may be committed: decode, batching, claim, plugins, complete),
 * Redis round trips per message (worker guard calls; the lease watchdog's are not counted)
 * and the mean batch size.
 */
#include <getopt.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "wxguard/consumer.h"
#include "wxguard/dlq.h"
#include "wxguard/guard.h"
#include "wxguard/log.h"
#include "wxguard/plugin_registry.h"

typedef struct e2e_opts {
    const char *bootstrap;
    const char *redis_host;
    int redis_port;
    uint64_t messages;
    uint64_t size;
    double dup;
    int workers[16];
    int nworkers;
    int partitions;
    uint64_t batch;
    uint64_t delay_us;
    uint64_t light_rate; /* messages/s of the light-load row */
} e2e_opts;

static void e2e_usage(FILE *f)
{
    fprintf(f, "usage: wxguard-bench e2e --bootstrap HOST:PORT --redis-port PORT [options]\n"
               "  --redis-host HOST   default 127.0.0.1\n"
               "  --messages N        records per run (default 20000)\n"
               "  --size BYTES        content size per record (default 200)\n"
               "  --dup RATIO         share of duplicates, 0..0.9 (default 0.3)\n"
               "  --workers LIST      worker counts, e.g. 1,4,8,16 (default)\n"
               "  --partitions N      topic partitions (default 6)\n"
               "  --batch N           guard batch size (default 64)\n"
               "  --delay-us N        longest batch wait (default 1000)\n"
               "  --light-rate N      messages/s of the light-load latency row (default 200;\n"
               "                      1000 messages fed while the consumer runs, 4 workers)\n");
}

/* Reads every record with a plain consumer; returns messages/s from first to last record. */
static double plain_rate(const e2e_opts *o, const char *topic, uint64_t n)
{
    char err[256], group[160];
    snprintf(group, sizeof group, "%s-plain", topic);
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", o->bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "broker.address.family", "v4", err, sizeof err);
    rd_kafka_conf_set(c, "group.id", group, err, sizeof err);
    rd_kafka_conf_set(c, "auto.offset.reset", "earliest", err, sizeof err);
    rd_kafka_conf_set(c, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    if (!rk)
        return 0;
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    uint64_t got = 0;
    int64_t t0 = 0, t1 = 0, deadline = wxgb_now_us() + 120000000;
    while (got < n && wxgb_now_us() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (!m->err) {
            if (got == 0)
                t0 = wxgb_now_us();
            got++;
            t1 = wxgb_now_us();
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return got == n && t1 > t0 ? (double)(n - 1) * 1e6 / (double)(t1 - t0) : 0;
}

static void *run_consumer(void *arg)
{
    wxg_consumer_run(arg);
    return NULL;
}

typedef struct e2e_row {
    double rate, plain, p50_ms, p99_ms, rt_per_msg, batch;
    int ok;
} e2e_row;

static e2e_row one_run(const e2e_opts *o, int workers, int run, uint64_t light_rate)
{
    e2e_row row = {0};
    char topic[128], dlqt[160], err[512], prefix[64];
    snprintf(topic, sizeof topic, "wxgb-e2e-%ld-%d-%d", (long)getpid(), run, workers);
    snprintf(dlqt, sizeof dlqt, "%s-dlq", topic);
    snprintf(prefix, sizeof prefix, "wxgb%ld%d:", (long)getpid(), run);
    if (wxgb_create_topic(o->bootstrap, topic, o->partitions) != 0)
        return row;
    wxgb_rec_t *recs = calloc(o->messages, sizeof *recs);
    if (!recs)
        return row;
    wxgb_make_stream(recs, o->messages, o->partitions, o->dup, 500,
                     7400000000000000000ULL + (uint64_t)run * 100000000ULL, 1, 17u + (unsigned)run);
    if (!light_rate) {
        if (wxgb_produce(o->bootstrap, topic, recs, o->messages, o->size) != 0) {
            free(recs);
            return row;
        }
        free(recs);
        recs = NULL;
        row.plain = plain_rate(o, topic, o->messages);
    }

    wxg_plugin_chain_t *chain = NULL;
    if (wxg_plugin_chain_new("noop", NULL, 0, &chain, err, sizeof err) != 0) {
        fprintf(stderr, "e2e: %s\n", err);
        return row;
    }
    wxg_kafka_prop_t props[] = {{"bootstrap.servers", o->bootstrap},
                                {"broker.address.family", "v4"}};
    wxg_producer_t *prod = wxg_producer_new(props, 2, err, sizeof err);
    wxg_dlq_t *dlq = prod ? wxg_dlq_new(prod, dlqt, topic, err, sizeof err) : NULL;
    wxg_guard_conf_t gc;
    wxg_guard_conf_init(&gc);
    gc.host = o->redis_host;
    gc.port = o->redis_port;
    gc.prefix = prefix;
    gc.batch_max = (int)o->batch;
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", o->bootstrap, err, sizeof err);
    rd_kafka_conf_set(kc, "broker.address.family", "v4", err, sizeof err);
    rd_kafka_conf_set(kc, "group.id", topic, err, sizeof err);
    rd_kafka_conf_set(kc, "auto.offset.reset", "earliest", err, sizeof err);
    const char *topics[] = {topic};
    wxg_consumer_conf_t cc;
    wxg_consumer_conf_init(&cc);
    cc.kafka = kc;
    cc.topics = topics;
    cc.ntopics = 1;
    cc.group_id = topic;
    cc.workers = (unsigned)workers;
    cc.batch_max = o->batch;
    cc.batch_delay_us = (int64_t)o->delay_us;
    cc.guard = &gc;
    cc.chain = chain;
    cc.dlq = dlq;
    wxg_consumer_t *c = dlq ? wxg_consumer_new(&cc, err, sizeof err) : NULL;
    if (!c) {
        if (!dlq)
            rd_kafka_conf_destroy(kc);
        fprintf(stderr, "e2e: %s\n", err);
        goto out;
    }
    pthread_t th;
    pthread_create(&th, NULL, run_consumer, c);
    int64_t t0 = 0, t1 = 0, deadline = wxgb_now_us() + 300000000;
    int done = 0;
    wxg_consumer_stats_t st;
    if (light_rate) {
        /* Light load: feed chunks of 10 at the given rate while the consumer runs. */
        for (;;) {
            wxg_consumer_stats(c, &st);
            if (st.assigned > 0 || wxgb_now_us() > deadline)
                break;
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        int64_t start = wxgb_now_us();
        for (uint64_t at = 0; at < o->messages; at += 10) {
            uint64_t k = o->messages - at < 10 ? o->messages - at : 10;
            wxgb_produce(o->bootstrap, topic, recs + at, k, o->size);
            int64_t due = start + (int64_t)((at + k) * 1000000 / light_rate);
            int64_t now = wxgb_now_us();
            if (due > now) {
                struct timespec ts = {(due - now) / 1000000, ((due - now) % 1000000) * 1000};
                nanosleep(&ts, NULL);
            }
        }
        free(recs);
        recs = NULL;
    }
    for (;;) {
        wxg_consumer_stats(c, &st);
        if (!t0 && st.received > 0)
            t0 = wxgb_now_us();
        if (st.processed + st.duplicates + st.dead_lettered >= o->messages && st.in_flight == 0) {
            t1 = wxgb_now_us();
            done = 1;
            break;
        }
        if (wxgb_now_us() > deadline)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    wxg_consumer_stats(c, &st); /* before the pool goes away with the shutdown */
    wxg_consumer_stop(c);
    pthread_join(th, NULL);
    wxg_consumer_destroy(c);
    if (done) {
        /* Under light load everything may be finished before the first look: no rate then. */
        row.ok = 1;
        row.rate = t1 > t0 ? (double)o->messages * 1e6 / (double)(t1 - t0) : 0;
        row.p50_ms = (double)st.latency_p50_us / 1000.0;
        row.p99_ms = (double)st.latency_p99_us / 1000.0;
        row.rt_per_msg = (double)st.redis_round_trips / (double)o->messages;
        row.batch = st.batches ? (double)st.batched_jobs / (double)st.batches : 0;
    }
out:
    free(recs);
    wxg_dlq_destroy(dlq);
    wxg_producer_destroy(prod, 1000);
    wxg_plugin_chain_destroy(chain);
    return row;
}

int wxgb_e2e_main(int argc, char **argv)
{
    e2e_opts o = {.redis_host = "127.0.0.1",
                  .messages = 20000,
                  .size = 200,
                  .dup = 0.3,
                  .workers = {1, 4, 8, 16},
                  .nworkers = 4,
                  .partitions = 6,
                  .batch = 64,
                  .delay_us = 1000,
                  .light_rate = 200};
    static const struct option lo[] = {{"bootstrap", required_argument, NULL, 'b'},
                                       {"redis-host", required_argument, NULL, 'H'},
                                       {"redis-port", required_argument, NULL, 'P'},
                                       {"messages", required_argument, NULL, 'n'},
                                       {"size", required_argument, NULL, 's'},
                                       {"dup", required_argument, NULL, 'd'},
                                       {"workers", required_argument, NULL, 'w'},
                                       {"partitions", required_argument, NULL, 'p'},
                                       {"batch", required_argument, NULL, 'B'},
                                       {"delay-us", required_argument, NULL, 'D'},
                                       {"light-rate", required_argument, NULL, 'L'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    int ch;
    uint64_t v;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'b':
            o.bootstrap = optarg;
            break;
        case 'H':
            o.redis_host = optarg;
            break;
        case 'P':
            if (wxgb_parse_u64(optarg, &v) || v > 65535)
                goto usage;
            o.redis_port = (int)v;
            break;
        case 'n':
            if (wxgb_parse_u64(optarg, &o.messages))
                goto usage;
            break;
        case 's':
            if (wxgb_parse_u64(optarg, &o.size) || o.size > 3000)
                goto usage;
            break;
        case 'd':
            o.dup = strtod(optarg, NULL);
            if (o.dup < 0 || o.dup > 0.9)
                goto usage;
            break;
        case 'w':
            o.nworkers = wxgb_parse_list(optarg, o.workers, 16);
            if (o.nworkers < 0)
                goto usage;
            break;
        case 'p':
            if (wxgb_parse_u64(optarg, &v) || v > 64)
                goto usage;
            o.partitions = (int)v;
            break;
        case 'B':
            if (wxgb_parse_u64(optarg, &o.batch) || o.batch > 1024)
                goto usage;
            break;
        case 'D':
            o.delay_us = strtoull(optarg, NULL, 10);
            break;
        case 'L':
            if (wxgb_parse_u64(optarg, &o.light_rate))
                goto usage;
            break;
        case 'h':
            e2e_usage(stdout);
            return 0;
        default:
            goto usage;
        }
    }
    if (!o.bootstrap || !o.redis_port)
        goto usage;
    wxg_log_set_level(WXG_LOG_WARN);
    printf("## wxguard-bench e2e\n\n%llu records per run (%.0f%% duplicates, ~%llu-byte content), "
           "%d partitions, noop plugin, batch %llu, batch delay %llu us\n\n",
           (unsigned long long)o.messages, o.dup * 100, (unsigned long long)o.size, o.partitions,
           (unsigned long long)o.batch, (unsigned long long)o.delay_us);
    printf("| workers | wxguard msg/s | plain librdkafka msg/s | ratio | p50 ms | p99 ms | Redis "
           "round trips/msg | mean batch |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int failures = 0;
    for (int i = 0; i < o.nworkers; i++) {
        e2e_row r = one_run(&o, o.workers[i], i, 0);
        if (!r.ok) {
            printf("| %d | failed | | | | | | |\n", o.workers[i]);
            failures++;
            continue;
        }
        printf("| %d | %.0f | %.0f | %.3f | %.2f | %.2f | %.3f | %.1f |\n", o.workers[i], r.rate,
               r.plain, r.plain > 0 ? r.rate / r.plain : 0, r.p50_ms, r.p99_ms, r.rt_per_msg,
               r.batch);
        fflush(stdout);
    }
    /* Light load: what batching adds when messages trickle in. */
    uint64_t heavy = o.messages;
    o.messages = 1000;
    e2e_row r = one_run(&o, 4, o.nworkers, o.light_rate);
    o.messages = heavy;
    printf("\nLight load: 1000 records fed at %llu/s while the consumer runs (4 workers): ",
           (unsigned long long)o.light_rate);
    if (r.ok)
        printf("dispatch-to-finished p50 %.2f ms, p99 %.2f ms, %.3f Redis round trips/msg, mean "
               "batch %.1f\n",
               r.p50_ms, r.p99_ms, r.rt_per_msg, r.batch);
    else
        printf("failed\n");
    return failures || !r.ok ? 1 : 0;
usage:
    e2e_usage(stderr);
    return 2;
}
