/*
 * wxguard-bench e2e: end-to-end throughput of the consumer.
 *
 * For each worker count: a fresh topic gets N callbacks (a share of them duplicates); a plain
 * librdkafka consumer that does no processing reads them (the ceiling), then an in-process
 * wxguard consumer with the noop plugin processes them against a real Redis. Reported per
 * row: messages/s of both and their ratio, p50/p99 of dispatch-to-finished latency (the time a
 * record waits until its offset may be committed: decode, batching, claim, plugins, complete),
 * Redis round trips per message (worker guard calls; the lease watchdog's are not counted),
 * Redis data commands and Redis CPU per message (the server's INFO commandstats and INFO cpu
 * before and after the run) and the mean batch size.
 *
 * --naive adds, per worker count and on the same topic, a run of the same consumer on the naive
 * guard (wxg_guard_conf_t.naive: one SET NX GET PX round trip per claim, one SET EX round trip
 * per DONE marker, no batching). The light-load row runs with batching on and off, to show the
 * latency batching adds. --designs native,lua runs both guard designs on each topic, one after
 * the other (otherwise the one guard.design names). --plot FILE writes "workers <msg/s per
 * design run>" lines for gnuplot (bench/e2e-workers.gp).
 *
 * The consumer runs with its near cache of DONE messages on, as in production (the default of
 * wxg_consumer_conf_init, docs/guard.md §10): a duplicate whose original this process completed
 * costs no Redis call. --no-done-cache turns it off, to measure what it saves; the last column
 * shows the share of messages it answered.
 */
#include <getopt.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include "bench.h"
#include "bench_redis.h"
#include "wxguard/conf.h"
#include "wxguard/consumer.h"
#include "wxguard/dlq.h"
#include "wxguard/guard.h"
#include "wxguard/log.h"
#include "wxguard/metrics.h"
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
    int naive;
    int designs; /* --designs: bit RUN_NATIVE, bit RUN_LUA; 0: the keys' design alone */
    int no_done_cache;
    int fresh_buckets; /* the guard's default geometry: nearly every marker opens a bucket */
    const char *plot;
    long broker_pid;     /* the Kafka broker's process, for its CPU column; 0: not shown */
    const char *cluster; /* --cluster: seed nodes of a Redis Cluster, or NULL */
    const char *sets[WXGB_SETS_MAX]; /* --set KEY=VALUE */
    size_t nsets;
} e2e_opts;

static void e2e_usage(FILE *f)
{
    fprintf(f,
            "usage: wxguard-bench e2e --bootstrap HOST:PORT (--redis-port PORT | --cluster "
            "NODES) [options]\n"
            "  --redis-host HOST   default 127.0.0.1\n"
            "  --cluster NODES     a Redis Cluster (seed nodes host:port,...) instead of one\n"
            "                      server: redis.cluster.nodes for the consumer, and the Redis\n"
            "                      columns summed over every primary (each primary's CPU on\n"
            "                      stderr)\n"
            "  --messages N        records per run (default 20000)\n"
            "  --size BYTES        content size per record (default 200)\n"
            "  --dup RATIO         share of duplicates, 0..0.9 (default 0.3)\n"
            "  --workers LIST      worker counts, e.g. 1,4,8,16 (default)\n"
            "  --partitions N      topic partitions (default 6)\n"
            "  --batch N           guard batch size (default 64)\n"
            "  --delay-us N        longest batch wait (default 1000)\n"
            "  --light-rate N      messages/s of the light-load latency rows (default 200;\n"
            "                      1000 messages fed while the consumer runs, 4 workers,\n"
            "                      batching on and off; 0 leaves them out)\n"
            "  --naive             also run the naive guard design on the same topics\n"
            "  --designs LIST      native, lua or both (native,lua): the guard designs run on\n"
            "                      each topic, one after the other (default: guard.design)\n"
            "  --no-done-cache     run the consumer without its near cache of DONE messages\n"
            "                      (on by default, as in production)\n"
            "  --fresh-buckets     keep the guard's default DONE-bucket geometry, sized for\n"
            "                      1,000 messages/s over 7 days: a short run then opens a new\n"
            "                      bucket for nearly every marker (the first hours of a time\n"
            "                      bucket); by default the buckets are sized so that this\n"
            "                      run's messages fill them as a time bucket is filled in\n"
            "                      steady state\n"
            "  --plot FILE         write 'workers msg/s...' lines to FILE, one column per design\n"
            "                      run (named in its first line)\n"
            "  --broker-pid PID    the local Kafka broker's process id: adds the CPU it spent\n"
            "                      per message while the consumer ran\n"
            "  --set KEY=VALUE     any key of wxguard-consumer (docs/configuration.md), mapped\n"
            "                      as the consumer maps it; wins over the options above\n"
            "                      (redis.key.prefix, consumer.topics and kafka.group.id are\n"
            "                      the run's own)\n");
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
    int64_t t0 = 0, t1 = 0, deadline = prog_mono_us() + 120000000;
    while (got < n && prog_mono_us() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (!m->err) {
            if (got == 0)
                t0 = prog_mono_us();
            got++;
            t1 = prog_mono_us();
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return got == n && t1 > t0 ? (double)(n - 1) * 1e6 / (double)(t1 - t0) : 0;
}

static void *run_consumer(void *arg)
{
    prctl(PR_SET_NAME, "wxg-poll", 0, 0, 0);
    wxg_consumer_run(arg);
    return NULL;
}

typedef struct e2e_row {
    double rate, plain, p50_ms, p99_ms, rt_per_msg, batch, cmds_per_msg, cpu_us_per_msg;
    double replica_us_per_msg, broker_us_per_msg; /* broker: -1 when not measured */
    double cache_hits_per_msg;
    int ok;
} e2e_row;

#define E2E_PRIMARIES_MAX 16

/* Connections for the Redis figures, made as the guard `gc` connects (TLS, AUTH, SELECT):
 * the server, or every primary of the cluster. Returns how many (0 on failure). */
static int admins_connect(const e2e_opts *o, const wxg_guard_conf_t *gc, wxgb_redis_t **out)
{
    if (o->cluster) {
        char names[E2E_PRIMARIES_MAX][300];
        return wxgb_cluster_primaries(o->cluster, gc, out, names, E2E_PRIMARIES_MAX);
    }
    char err[512] = "";
    out[0] = wxgb_redis_connect(gc, NULL, 0, err, sizeof err);
    if (!out[0]) {
        fprintf(stderr, "e2e: cannot connect to Redis: %s\n", err);
        return 0;
    }
    return 1;
}

/* Sums of Redis CPU seconds, data calls and used_memory over the servers; cpu (nadmin
 * entries) gets each one's CPU. */
static void redis_sample(wxgb_redis_t **admins, int nadmin, double *cpu, double *cpu_sum,
                         double *calls, double *mem)
{
    *cpu_sum = *calls = *mem = 0;
    for (int i = 0; i < nadmin; i++) {
        cpu[i] = wxgb_redis_cpu_s(admins[i]);
        *cpu_sum += cpu[i];
        *calls += wxgb_data_calls(admins[i]);
        *mem += wxgb_info_field(admins[i], "memory", "used_memory");
    }
}

/* Deletes every key of a finished row (its prefix is unique to the row), so that each row
 * starts from the Redis the first one found: a naive row alone leaves about 140,000 keys, and
 * a larger keyspace makes every later row's commands dearer. Returns the keys deleted. */
static long long drop_prefix(wxgb_redis_t *r, const char *prefix)
{
    char match[80], cursor[32] = "0";
    snprintf(match, sizeof match, "%s*", prefix);
    long long dropped = 0;
    do {
        redisReply *rep = wxgb_redis_cmd(r, "SCAN", cursor, "MATCH", match, "COUNT", "1000", NULL);
        if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
            if (rep)
                freeReplyObject(rep);
            return -1;
        }
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        redisReply *keys = rep->element[1];
        if (keys->elements > 0) {
            const char **argv = malloc((keys->elements + 1) * sizeof *argv);
            size_t *lens = malloc((keys->elements + 1) * sizeof *lens);
            if (argv && lens) {
                argv[0] = "UNLINK";
                lens[0] = 6;
                for (size_t i = 0; i < keys->elements; i++) {
                    argv[i + 1] = keys->element[i]->str;
                    lens[i + 1] = keys->element[i]->len;
                }
                redisReply *d = wxgb_redis_cmd_argv(r, (int)keys->elements + 1, argv, lens);
                if (d && d->type == REDIS_REPLY_INTEGER)
                    dropped += d->integer;
                if (d)
                    freeReplyObject(d);
            }
            free(argv);
            free(lens);
        }
        freeReplyObject(rep);
    } while (strcmp(cursor, "0") != 0);
    return dropped;
}

/* CPU seconds this process has used, all threads. While consume() waits, the consumer is the
 * only thing running in it (the sampling loop sleeps 5 ms between looks), so the difference
 * over a run is the replica's CPU. */
static double self_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* CPU seconds (user + system) of another process; -1 when unreadable. */
static double proc_cpu_s(long pid)
{
    wxg_process_stats_t ps;
    return pid > 0 && wxg_process_stats(pid, &ps) == 0 ? ps.cpu_seconds : -1;
}

/* The guard design of a run: the one the keys name (guard.design), the naive one, or a design
 * chosen by --designs. */
enum { RUN_KEYS, RUN_NAIVE, RUN_NATIVE, RUN_LUA };

/* One consumer run over `topic` with the guard design `design` (RUN_*). With light_rate, the
 * records are produced while it runs; otherwise they are already in the topic. */
static e2e_row consume(const e2e_opts *o, const char *topic, const char *tag, int workers,
                       int design, uint64_t batch, uint64_t light_rate, const wxgb_rec_t *recs)
{
    int naive = design == RUN_NAIVE;
    e2e_row row = {0};
    char group[200], dlqt[220], err[512], prefix[64];
    snprintf(group, sizeof group, "%s-%s", topic, tag);
    snprintf(dlqt, sizeof dlqt, "%s-dlq", group);
    snprintf(prefix, sizeof prefix, "wxgb%ld%s:", (long)getpid(), tag);

    wxg_plugin_chain_t *chain = NULL;
    if (wxg_plugin_chain_new("noop", NULL, 0, &chain, err, sizeof err) != 0) {
        fprintf(stderr, "e2e: %s\n", err);
        return row;
    }
    wxg_kafka_prop_t props[] = {{"bootstrap.servers", o->bootstrap},
                                {"broker.address.family", "v4"}};
    wxg_producer_t *prod = wxg_producer_new(props, 2, err, sizeof err);
    wxg_dlq_t *dlq = prod ? wxg_dlq_new(prod, dlqt, topic, err, sizeof err) : NULL;
    /* The guard and the consumer from the keys, mapped as wxguard-consumer maps them; the
     * run's options are key settings, --set wins over them. */
    char *keys = wxgb_props(
        "kafka.bootstrap.servers = %s\nkafka.broker.address.family = v4\n"
        "kafka.group.id = %s\nkafka.auto.offset.reset = earliest\nconsumer.topics = %s\n"
        "redis.host = %s\nredis.port = %d\nredis.key.prefix = %s\nconsumer.workers = %d\n"
        "consumer.batch.max = %llu\n%s",
        o->bootstrap, group, topic, o->redis_host, o->redis_port ? o->redis_port : 6379, prefix,
        workers, (unsigned long long)batch,
        o->no_done_cache ? "guard.done.cache.entries = 0\n" : "");
    wxg_conf_t *conf = wxgb_conf_new(keys, o->sets, o->nsets);
    free(keys);
    char mapped_prefix[WXG_GUARD_PREFIX_MAX + 1];
    wxg_guard_conf_t gc;
    wxgb_conf_guard(conf, &gc, mapped_prefix, sizeof mapped_prefix);
    /* What has no key: the naive design, and the bucket sizing of a compressed run. */
    gc.naive = naive;
    if (design == RUN_NATIVE || design == RUN_LUA)
        gc.design = design == RUN_NATIVE ? WXG_GUARD_DESIGN_NATIVE : WXG_GUARD_DESIGN_LUA;
    if (!o->fresh_buckets && !naive) {
        /* As wxguard-bench guard does: a run compresses a time bucket's worth of markers into
         * seconds, so the buckets are sized for the density a time bucket has in steady state
         * when it holds this run's messages (about 36-64 markers per bucket). With the
         * default geometry every marker of a short run would open a bucket of its own (a key
         * with a TTL), which a deployment pays only while a new time bucket fills. */
        gc.done_expected_rate = (double)o->messages / ((double)gc.done_retention_ms / 1000.0);
    }
    rd_kafka_conf_t *kc = wxg_conf_kafka(conf, err, sizeof err);
    if (!kc) {
        fprintf(stderr, "e2e: %s\n", err);
        exit(2);
    }
    wxg_consumer_conf_t cc;
    wxgb_conf_consumer(conf, &cc);
    cc.kafka = kc;
    /* consumer.batch.delay.ms has millisecond steps; --delay-us is finer. */
    cc.batch_delay_us = (int64_t)o->delay_us;
    cc.guard = &gc;
    cc.chain = chain;
    cc.dlq = dlq;
    wxgb_redis_t *admins[E2E_PRIMARIES_MAX];
    int nadmin = admins_connect(o, &gc, admins);
    if (!nadmin)
        snprintf(err, sizeof err, "cannot connect to Redis");
    wxg_consumer_t *c = dlq && nadmin ? wxg_consumer_new(&cc, err, sizeof err) : NULL;
    if (!c) {
        if (!dlq || !nadmin)
            rd_kafka_conf_destroy(kc);
        fprintf(stderr, "e2e: %s\n", err);
        goto out;
    }
    double node0[E2E_PRIMARIES_MAX], node1[E2E_PRIMARIES_MAX], cpu0, calls0, mem0, cpu1, calls1,
        mem1;
    redis_sample(admins, nadmin, node0, &cpu0, &calls0, &mem0);
    double self0 = self_cpu_s(), broker0 = proc_cpu_s(o->broker_pid);
    pthread_t th;
    pthread_create(&th, NULL, run_consumer, c);
    int64_t t0 = 0, t1 = 0, deadline = prog_mono_us() + 300000000;
    int done = 0;
    wxg_consumer_stats_t st;
    if (light_rate) {
        /* Light load: feed chunks of 10 at the given rate while the consumer runs. */
        for (;;) {
            wxg_consumer_stats(c, &st);
            if (st.assigned > 0 || prog_mono_us() > deadline)
                break;
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        int64_t start = prog_mono_us();
        for (uint64_t at = 0; at < o->messages; at += 10) {
            uint64_t k = o->messages - at < 10 ? o->messages - at : 10;
            wxgb_produce(o->bootstrap, topic, recs + at, k, o->size);
            int64_t due = start + (int64_t)((at + k) * 1000000 / light_rate);
            int64_t now = prog_mono_us();
            if (due > now) {
                struct timespec ts = {(due - now) / 1000000, ((due - now) % 1000000) * 1000};
                nanosleep(&ts, NULL);
            }
        }
    }
    for (;;) {
        wxg_consumer_stats(c, &st);
        if (!t0 && st.received > 0)
            t0 = prog_mono_us();
        if (st.processed + st.duplicates + st.dead_lettered >= o->messages && st.in_flight == 0) {
            t1 = prog_mono_us();
            done = 1;
            break;
        }
        if (prog_mono_us() > deadline)
            break;
        struct timespec ts = {0, 5000000}; /* 5 ms: sampling must not load the pool lock */
        nanosleep(&ts, NULL);
    }
    wxg_consumer_stats(c, &st); /* before the pool goes away with the shutdown */
    redis_sample(admins, nadmin, node1, &cpu1, &calls1, &mem1);
    double self1 = self_cpu_s(), broker1 = proc_cpu_s(o->broker_pid);
    /* What the run left in Redis (DONE markers, layout stamp, anything not cleaned up): with a
     * Redis of its own, used_memory growth per unique message of the stream. */
    fprintf(stderr, "e2e %s, %d workers: used_memory grew by %.0f bytes over %llu records\n", tag,
            workers, mem1 - mem0, (unsigned long long)o->messages);
    if (nadmin > 1) {
        fprintf(stderr, "e2e %s, %d workers: Redis CPU us/msg per primary:", tag, workers);
        for (int i = 0; i < nadmin; i++)
            fprintf(stderr, "%s %.2f", i ? " /" : "",
                    (node1[i] - node0[i]) * 1e6 / (double)o->messages);
        fprintf(stderr, "\n");
    }
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
        row.cpu_us_per_msg = (cpu1 - cpu0) * 1e6 / (double)o->messages;
        row.cmds_per_msg = (calls1 - calls0) / (double)o->messages;
        row.replica_us_per_msg = (self1 - self0) * 1e6 / (double)o->messages;
        row.broker_us_per_msg =
            broker0 >= 0 && broker1 >= 0 ? (broker1 - broker0) * 1e6 / (double)o->messages : -1;
        row.cache_hits_per_msg = (double)st.done_cache_hits / (double)o->messages;
    }
out:
    for (int i = 0; i < nadmin; i++) {
        if (drop_prefix(admins[i], prefix) < 0)
            fprintf(stderr, "e2e: could not delete the keys of %s*\n", prefix);
        wxgb_redis_free(admins[i]);
    }
    wxg_dlq_destroy(dlq);
    wxg_producer_destroy(prod, 1000);
    wxg_plugin_chain_destroy(chain);
    wxg_conf_free(conf);
    return row;
}

/* A fresh topic with the run's stream: produced now (light_rate 0, and *plain gets the plain
 * consumer's rate) or returned in *recs_out for producing during the run. */
static int prepare(const e2e_opts *o, int run, uint64_t light_rate, char *topic, size_t topic_size,
                   double *plain, wxgb_rec_t **recs_out)
{
    snprintf(topic, topic_size, "wxgb-e2e-%ld-%d", (long)getpid(), run);
    if (wxgb_create_topic(o->bootstrap, topic, o->partitions) != 0)
        return -1;
    wxgb_rec_t *recs = calloc(o->messages, sizeof *recs);
    if (!recs)
        return -1;
    int unique = wxgb_make_stream(recs, o->messages, o->partitions, o->dup, 500,
                                  7400000000000000000ULL + (uint64_t)run * 100000000ULL, 1,
                                  17u + (unsigned)run);
    fprintf(stderr, "e2e: run %d: %llu records, %d unique\n", run, (unsigned long long)o->messages,
            unique);
    if (light_rate) {
        *recs_out = recs;
        return 0;
    }
    int rc = wxgb_produce(o->bootstrap, topic, recs, o->messages, o->size);
    free(recs);
    if (rc != 0)
        return -1;
    *plain = plain_rate(o, topic, o->messages);
    return 0;
}

static void print_row(const char *design, int workers, const e2e_row *r, double plain)
{
    if (!r->ok) {
        printf("| %s | %d | failed | | | | | | | | | | | |\n", design, workers);
        return;
    }
    char broker[32] = "-";
    if (r->broker_us_per_msg >= 0)
        snprintf(broker, sizeof broker, "%.2f", r->broker_us_per_msg);
    printf("| %s | %d | %.0f | %.0f | %.3f | %.2f | %.2f | %.3f | %.2f | %.2f | %.2f | %s | %.1f | "
           "%.3f |\n",
           design, workers, r->rate, plain, plain > 0 ? r->rate / plain : 0, r->p50_ms, r->p99_ms,
           r->rt_per_msg, r->cmds_per_msg, r->cpu_us_per_msg, r->replica_us_per_msg, broker,
           r->batch, r->cache_hits_per_msg);
    fflush(stdout);
}

/* The light-load rows: the same trickle with batching on (o->batch) and off (batch 1). */
static int light_rows(e2e_opts *o, int run)
{
    uint64_t heavy = o->messages;
    o->messages = 1000;
    int failures = 0;
    e2e_row r[2];
    uint64_t batches[2] = {o->batch, 1};
    for (int k = 0; k < 2; k++) {
        char topic[128];
        wxgb_rec_t *recs = NULL;
        double plain = 0;
        r[k] = (e2e_row){0};
        if (prepare(o, run + k, o->light_rate, topic, sizeof topic, &plain, &recs) == 0)
            r[k] = consume(o, topic, k ? "light-nobatch" : "light", 4, RUN_KEYS, batches[k],
                           o->light_rate, recs);
        free(recs);
    }
    o->messages = heavy;
    printf("\nLight load: 1000 records fed at %llu/s while the consumer runs (4 workers); "
           "dispatch-to-finished latency:\n\n"
           "| batching | p50 ms | p99 ms | Redis round trips/msg | mean batch |\n"
           "|---|---:|---:|---:|---:|\n",
           (unsigned long long)o->light_rate);
    for (int k = 0; k < 2; k++) {
        if (!r[k].ok) {
            printf("| %s | failed | | | |\n", k ? "off (batch 1)" : "on");
            failures++;
            continue;
        }
        char on[64];
        snprintf(on, sizeof on, "on (batch %llu, delay %llu us)", (unsigned long long)o->batch,
                 (unsigned long long)o->delay_us);
        printf("| %s | %.2f | %.2f | %.3f | %.1f |\n", k ? "off (batch 1)" : on, r[k].p50_ms,
               r[k].p99_ms, r[k].rt_per_msg, r[k].batch);
    }
    if (r[0].ok && r[1].ok)
        printf("\nAdded by batching: p50 %+.2f ms, p99 %+.2f ms\n", r[0].p50_ms - r[1].p50_ms,
               r[0].p99_ms - r[1].p99_ms);
    return failures;
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
                                       {"naive", no_argument, NULL, 'N'},
                                       {"designs", required_argument, NULL, 'E'},
                                       {"no-done-cache", no_argument, NULL, 'C'},
                                       {"fresh-buckets", no_argument, NULL, 'F'},
                                       {"plot", required_argument, NULL, 'G'},
                                       {"broker-pid", required_argument, NULL, 'K'},
                                       {"cluster", required_argument, NULL, 'R'},
                                       {"set", required_argument, NULL, 'S'},
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
            if (strcmp(optarg, "0") == 0)
                o.light_rate = 0; /* no light-load rows */
            else if (wxgb_parse_u64(optarg, &o.light_rate))
                goto usage;
            break;
        case 'N':
            o.naive = 1;
            break;
        case 'E':
            for (const char *q = optarg; *q;) {
                size_t n = strcspn(q, ",");
                if (n == 6 && strncmp(q, "native", 6) == 0)
                    o.designs |= 1 << RUN_NATIVE;
                else if (n == 3 && strncmp(q, "lua", 3) == 0)
                    o.designs |= 1 << RUN_LUA;
                else
                    goto usage;
                q += n + (q[n] == ',');
            }
            break;
        case 'C':
            o.no_done_cache = 1;
            break;
        case 'F':
            o.fresh_buckets = 1;
            break;
        case 'G':
            o.plot = optarg;
            break;
        case 'K':
            if (wxgb_parse_u64(optarg, &v) || v == 0 || v > 4194304)
                goto usage;
            o.broker_pid = (long)v;
            break;
        case 'S':
            if (o.nsets == WXGB_SETS_MAX)
                goto usage;
            o.sets[o.nsets++] = optarg;
            break;
        case 'R':
            o.cluster = optarg;
            break;
        case 'h':
            e2e_usage(stdout);
            return 0;
        default:
            goto usage;
        }
    }
    /* The consumer reaches the cluster through its key; a --set of the same key wins. */
    char cluster_set[1100];
    if (o.cluster) {
        if (o.nsets == WXGB_SETS_MAX)
            goto usage;
        snprintf(cluster_set, sizeof cluster_set, "redis.cluster.nodes=%s", o.cluster);
        memmove(o.sets + 1, o.sets, o.nsets * sizeof *o.sets);
        o.sets[0] = cluster_set;
        o.nsets++;
    }
    if (!o.bootstrap || (!o.redis_port && !o.cluster))
        goto usage;
    wxg_log_set_level(WXG_LOG_WARN);
    printf("## wxguard-bench e2e\n\n%llu records per run (%.0f%% duplicates, ~%llu-byte content), "
           "%d partitions, noop plugin, batch %llu, batch delay %llu us, near cache %s, DONE "
           "buckets %s\n\n",
           (unsigned long long)o.messages, o.dup * 100, (unsigned long long)o.size, o.partitions,
           (unsigned long long)o.batch, (unsigned long long)o.delay_us,
           o.no_done_cache ? "off" : "on",
           o.fresh_buckets ? "fresh (default geometry)" : "steady-state density");
    printf("| design | workers | msg/s | plain librdkafka msg/s | ratio | p50 ms | p99 ms | Redis "
           "round trips/msg | Redis commands/msg | Redis CPU us/msg | replica CPU us/msg | "
           "broker CPU us/msg | mean batch | near-cache hits/msg |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    FILE *plot = o.plot ? fopen(o.plot, "w") : NULL;
    if (o.plot && !plot) {
        fprintf(stderr, "e2e: cannot write %s\n", o.plot);
        return 1;
    }
    /* The designs of each worker count, in this order, on the same topic. */
    int runs[3], nruns = 0;
    if (o.designs & 1 << RUN_NATIVE)
        runs[nruns++] = RUN_NATIVE;
    if (o.designs & 1 << RUN_LUA)
        runs[nruns++] = RUN_LUA;
    if (nruns == 0)
        runs[nruns++] = RUN_KEYS;
    if (o.naive)
        runs[nruns++] = RUN_NAIVE;
    static const char *const run_name[] = {"wxguard", "naive", "native", "lua"};
    if (plot) {
        fprintf(plot, "# workers");
        for (int k = 0; k < nruns; k++)
            fprintf(plot, " %s-msg/s", run_name[runs[k]]);
        fprintf(plot, " (0: failed)\n");
    }
    int failures = 0;
    for (int i = 0; i < o.nworkers; i++) {
        char topic[128];
        double plain = 0;
        e2e_row rows[3] = {{0}};
        if (prepare(&o, i, 0, topic, sizeof topic, &plain, NULL) == 0) {
            for (int k = 0; k < nruns; k++)
                rows[k] = consume(&o, topic, run_name[runs[k]], o.workers[i], runs[k],
                                  runs[k] == RUN_NAIVE ? 1 : o.batch, 0, NULL);
        }
        for (int k = 0; k < nruns; k++) {
            print_row(run_name[runs[k]], o.workers[i], &rows[k], plain);
            failures += !rows[k].ok;
        }
        if (plot) {
            fprintf(plot, "%d", o.workers[i]);
            for (int k = 0; k < nruns; k++)
                fprintf(plot, " %.0f", rows[k].rate);
            fprintf(plot, "\n");
        }
    }
    if (plot)
        fclose(plot);
    if (o.light_rate > 0)
        failures += light_rows(&o, o.nworkers);
    return failures ? 1 : 0;
usage:
    e2e_usage(stderr);
    return 2;
}
