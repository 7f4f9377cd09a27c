/* A soak test of the real wxguard-consumer: two replicas of one group on a private Redis with
 * persistence, a steady stream of generic callbacks (RATE records a second, 30 % of them
 * duplicates of a message sent in the last DUP_WINDOW seconds) for WXG_SOAK_SECONDS (default
 * 120), replica 1 restarted (SIGTERM, then started again) at 40 % of the run and Redis restarted
 * (SIGTERM) at the first second past 55 % that is mid-minute; it must keep every key. Every 10 s it
 * samples each replica's resident memory, open descriptors and threads
 * (/proc/PID/status, /proc/PID/fd), its in-flight gauge from /metrics (the lease watchdog's
 * registrations are not exported; each message in flight holds one), and Redis's key count.
 * At the end:
 *   - the ledger holds exactly one effect per unique message, and every offset is committed;
 *   - after the warm-up, each series of a replica is flat: the least-squares slope of its
 *     samples stays within a generous bound (printed beside the table);
 *   - Redis holds no more keys than the DONE markers that can be alive (one per unique message
 *     of the last two retentions, plus a few), and its key count grows no faster than new
 *     messages arrive.
 *
 * Redis runs with appendonly yes and appendfsync always: without persistence a restart would
 * forget the DONE markers and the duplicates sent after it would take effect again, which is a
 * property of the deployment (docs/guarantees.md), not of the consumer. The DONE retention is
 * the smallest allowed (1 min), so that Redis's key count reaches its steady state within a run;
 * duplicates are therefore drawn from the last DUP_WINDOW seconds only.
 *
 * The timing bounds are generous and scaled by WXG_TEST_TIMEOUT_SCALE; the printed table is
 * what bench/soak.md records for a 600 s run. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "consumertest.h"
#include "testenv.h"
#include "testhttp.h"

#define PARTITIONS  4
#define CONVS       32
#define REPLICAS    2
#define RATE        60 /* records a second */
#define DUP_PCT     30
#define DUP_WINDOW  15 /* seconds: duplicates copy a message at most this old */
#define SAMPLE_S    10
#define RETENTION_S 60
#define MAX_SAMPLES 400
#define ID_BASE     7305000000000000000ULL

/* RSS in KiB/s, descriptors and threads per second, messages per second. */
#define RSS_SLOPE_MAX      64.0
#define FDS_SLOPE_MAX      0.1
#define THREADS_SLOPE_MAX  0.05
#define INFLIGHT_SLOPE_MAX 1.0

enum { S_RSS, S_FDS, S_THREADS, S_INFLIGHT, NSERIES };
static const char *const series_names[NSERIES] = {"rss_kib", "fds", "threads", "inflight"};

typedef struct sample {
    int64_t t_s;        /* seconds since the start of production */
    long pid[REPLICAS]; /* 0: the replica was not running */
    double v[REPLICAS][NSERIES];
    long long dbsize;
    uint64_t unique; /* unique messages produced so far */
} sample;

typedef struct soak {
    wxg_ct_t t;
    wxg_test_redis_t redis;
    int metrics_port[REPLICAS];
    sample samples[MAX_SAMPLES];
    int nsamples;
    uint64_t *unique_at; /* unique messages produced by the end of second s */
    int restarting;      /* replica 1 was sent SIGTERM and is not yet reaped */
} soak;

/* ---- samples ---- */

/* VmRSS (KiB) and Threads of /proc/PID/status; 0 when unreadable. */
static void proc_status(long pid, double *rss_kib, double *threads)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    *rss_kib = *threads = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0)
            *rss_kib = strtod(line + 6, NULL);
        else if (strncmp(line, "Threads:", 8) == 0)
            *threads = strtod(line + 8, NULL);
    }
    if (f != NULL)
        fclose(f);
}

static double proc_fds(long pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/fd", pid);
    DIR *d = opendir(path);
    double n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.')
            n++;
    }
    if (d != NULL)
        closedir(d);
    return n;
}

/* The value of an unlabelled series in a replica's /metrics, or -1. */
static double metric(int port, const char *name)
{
    wxg_test_http_resp_t r;
    double v = -1;
    if (wxg_test_http(port, "GET", "/metrics", NULL, NULL, 0, &r) != 0)
        return -1;
    char needle[128];
    snprintf(needle, sizeof needle, "\n%s ", name);
    const char *at = strstr(r.body, needle);
    if (at != NULL)
        v = strtod(at + strlen(needle), NULL);
    wxg_test_http_free(&r);
    return v;
}

static long long dbsize(int port)
{
    struct timeval tv = {.tv_sec = 2};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    long long n = -1;
    redisReply *r = c != NULL && !c->err ? redisCommand(c, "DBSIZE") : NULL;
    if (r != NULL && r->type == REDIS_REPLY_INTEGER)
        n = r->integer;
    if (r != NULL)
        freeReplyObject(r);
    if (c != NULL)
        redisFree(c);
    return n;
}

static void take_sample(soak *s, int64_t t_s, uint64_t unique)
{
    if (s->nsamples >= MAX_SAMPLES)
        return;
    sample *x = &s->samples[s->nsamples++];
    memset(x, 0, sizeof *x);
    x->t_s = t_s;
    x->unique = unique;
    for (int i = 0; i < REPLICAS; i++) {
        /* wxg_ct_alive() reaps an exited replica: not the one being restarted. */
        if ((i == 1 && s->restarting) || !wxg_ct_alive(&s->t, i))
            continue;
        x->pid[i] = (long)s->t.pids[i];
        proc_status(x->pid[i], &x->v[i][S_RSS], &x->v[i][S_THREADS]);
        x->v[i][S_FDS] = proc_fds(x->pid[i]);
        x->v[i][S_INFLIGHT] = metric(s->metrics_port[i], "wxg_inflight_messages");
    }
    x->dbsize = dbsize(s->redis.port);
}

/* Least-squares slope (per second) of series `k` of replica `r` over the samples at or after
 * `from_s` taken from process `pid`; *n is how many there were. */
static double slope(const soak *s, int r, int k, int64_t from_s, long pid, int *n)
{
    double st = 0, sy = 0, stt = 0, sty = 0;
    *n = 0;
    for (int i = 0; i < s->nsamples; i++) {
        const sample *x = &s->samples[i];
        if (x->t_s < from_s || x->pid[r] != pid || pid == 0)
            continue;
        double t = (double)x->t_s, y = k < 0 ? (double)x->dbsize : x->v[r][k];
        st += t;
        sy += y;
        stt += t * t;
        sty += t * y;
        (*n)++;
    }
    double d = *n * stt - st * st;
    return *n >= 2 && d > 0 ? (*n * sty - st * sy) / d : 0;
}

static void print_table(const soak *s)
{
    print_message("| t (s) | unique | r0 pid | r0 RSS (KiB) | r0 fds | r0 threads | r0 inflight | "
                  "r1 pid | r1 RSS (KiB) | r1 fds | r1 threads | r1 inflight | Redis keys |\n");
    print_message("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < s->nsamples; i++) {
        const sample *x = &s->samples[i];
        print_message("| %" PRId64 " | %" PRIu64
                      " | %ld | %.0f | %.0f | %.0f | %.0f | %ld | %.0f | "
                      "%.0f | %.0f | %.0f | %lld |\n",
                      x->t_s, x->unique, x->pid[0], x->v[0][S_RSS], x->v[0][S_FDS],
                      x->v[0][S_THREADS], x->v[0][S_INFLIGHT], x->pid[1], x->v[1][S_RSS],
                      x->v[1][S_FDS], x->v[1][S_THREADS], x->v[1][S_INFLIGHT], x->dbsize);
    }
}

/* Asserts the slopes of replica r (process pid) after from_s, when it has enough samples. */
static void check_flat(const soak *s, int r, long pid, int64_t from_s)
{
    static const double bound[NSERIES] = {RSS_SLOPE_MAX, FDS_SLOPE_MAX, THREADS_SLOPE_MAX,
                                          INFLIGHT_SLOPE_MAX};
    for (int k = 0; k < NSERIES; k++) {
        int n = 0;
        double m = slope(s, r, k, from_s, pid, &n);
        print_message("slope replica %d (pid %ld) %s from %" PRId64 " s: %+.4f per s over %d "
                      "samples (bound %.2f)\n",
                      r, pid, series_names[k], from_s, m, n, bound[k]);
        if (n < 4)
            continue; /* too few to say */
        if (m > bound[k] || m < -bound[k])
            fail_msg("replica %d %s is not flat: slope %+.4f per s (bound %.2f)", r,
                     series_names[k], m, bound[k]);
    }
}

/* ---- the run ---- */

static uint64_t rnd(uint64_t *st)
{
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return *st;
}

static void spawn_replica(soak *s, int idx)
{
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", s->metrics_port[idx]);
    /* The environment overrides the shared config file: one metrics port per replica. */
    setenv("WXG_METRICS_LISTEN", listen, 1);
    wxg_ct_spawn(&s->t, idx);
    unsetenv("WXG_METRICS_LISTEN");
}

static void wait_metrics(soak *s, int idx)
{
    int64_t deadline = wxg_test_now_ms() + 30000LL * wxg_test_scale();
    while (metric(s->metrics_port[idx], "wxg_inflight_messages") < 0) {
        if (!wxg_ct_alive(&s->t, idx))
            fail_msg("replica %d exited at start-up (see %s/replica-%d.log)", idx, s->t.dir, idx);
        if (wxg_test_now_ms() >= deadline)
            fail_msg("replica %d serves no /metrics", idx);
        wxg_test_sleep_ms(100);
    }
}

static long soak_seconds(void)
{
    const char *v = getenv("WXG_SOAK_SECONDS");
    char *end = NULL;
    long n = v != NULL ? strtol(v, &end, 10) : 120;
    if (v != NULL && (end == v || *end != '\0' || n < 60 || n > 86400))
        fail_msg("WXG_SOAK_SECONDS must be 60 .. 86400, not \"%s\"", v);
    return n;
}

/* Produces the records due by second `sec` (RATE a second), 30 % of them duplicates. */
static void produce_due(soak *s, int64_t sec, uint64_t *produced, uint64_t *unique, uint64_t *rng)
{
    uint64_t due = (uint64_t)sec * RATE;
    wxg_ct_msg_t batch[RATE * 8];
    size_t n = 0;
    while (*produced < due && n < sizeof batch / sizeof batch[0]) {
        uint64_t id;
        uint64_t window_start = sec > DUP_WINDOW ? s->unique_at[sec - DUP_WINDOW] : 0;
        if (*unique > window_start && rnd(rng) % 100 < DUP_PCT)
            id = ID_BASE + window_start + rnd(rng) % (*unique - window_start);
        else
            id = ID_BASE + (*unique)++;
        int conv = (int)(id % CONVS);
        batch[n++] = (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = id, .conv = conv};
        (*produced)++;
    }
    if (n > 0)
        wxg_ct_produce(&s->t, batch, n);
}

/* Once replica 1 has exited after its SIGTERM, checks its exit and starts it again. */
static void restart_pending(soak *s)
{
    int st = 0;
    pid_t pid = s->t.pids[1];
    if (!s->restarting || waitpid(pid, &st, WNOHANG) != pid)
        return;
    s->t.pids[1] = 0;
    s->restarting = 0;
    wxg_ct_assert_exit(&s->t, 1, st, 0);
    spawn_replica(s, 1);
}

/* 1 between 20 and 40 s past the wall clock's minute. DONE markers live in time buckets whose
 * keys expire together at minute boundaries (retention 1 min), so a restart there could not
 * tell keys it lost from keys that expired. */
static int mid_minute(void)
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    return tm.tm_sec >= 20 && tm.tm_sec < 40;
}

/* Restarts Redis and asserts that it kept its keys: persistence is what the run relies on. */
static void restart_redis(soak *s, int64_t sec)
{
    long long before = dbsize(s->redis.port);
    assert_int_equal(wxg_test_redis_restart(&s->redis), 0);
    long long after = dbsize(s->redis.port);
    print_message("Redis restarted at %" PRId64 " s: %lld keys before, %lld after\n", sec, before,
                  after);
    /* No bucket expires mid-minute; what may go is the in-flight records of messages that
     * complete meanwhile (one key each, a few dozen at most). */
    if (after < before - 100)
        fail_msg("the Redis restart lost keys: %lld before, %lld after", before, after);
}

static void replicas_keep_flat_and_effects_stay_exactly_once_through_restarts(void **state)
{
    (void)state;
    long seconds = soak_seconds();
    soak *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->unique_at = calloc((size_t)seconds + 2, sizeof *s->unique_at);
    assert_non_null(s->unique_at);
    assert_int_equal(wxg_test_redis_start_persistent(&s->redis), 0);
    wxg_ct_setup(&s->t, "soak", PARTITIONS);
    s->t.redis_host = "127.0.0.1";
    s->t.redis_port = s->redis.port;
    wxg_ct_write_config(&s->t, "guard.done.retention = 1m\n"
                               "consumer.workers = 4\n"
                               "log.level = warn\n");
    for (int i = 0; i < REPLICAS; i++) {
        s->metrics_port[i] = wxg_test_free_port();
        assert_true(s->metrics_port[i] > 0);
        spawn_replica(s, i);
    }
    for (int i = 0; i < REPLICAS; i++)
        wait_metrics(s, i);

    int64_t warmup_s = seconds / 4 > 30 ? seconds / 4 : 30;
    int64_t restart_at = seconds * 40 / 100, redis_at = seconds * 55 / 100;
    int redis_done = 0;
    uint64_t produced = 0, unique = 0, rng = 0x9e3779b97f4a7c15ULL;
    int64_t replica_back_s = 0;
    int64_t t0 = wxg_test_now_ms();
    print_message("soak: %ld s, %d records/s with %d %% duplicates, replica 1 restart at %" PRId64
                  " s, Redis restart from %" PRId64 " s, warm-up %" PRId64 " s\n",
                  seconds, RATE, DUP_PCT, restart_at, redis_at, warmup_s);
    for (int64_t sec = 1; sec <= seconds; sec++) {
        produce_due(s, sec, &produced, &unique, &rng);
        s->unique_at[sec] = unique;
        if (sec == restart_at) {
            kill(s->t.pids[1], SIGTERM);
            s->restarting = 1;
        }
        if (s->restarting) {
            restart_pending(s);
            if (!s->restarting)
                replica_back_s = sec;
        }
        if (!redis_done && sec >= redis_at && mid_minute()) {
            restart_redis(s, sec);
            redis_done = 1;
        }
        if (sec % SAMPLE_S == 0)
            take_sample(s, sec, unique);
        for (int i = 0; i < REPLICAS; i++) {
            if (!(i == 1 && s->restarting) && !wxg_ct_alive(&s->t, i))
                fail_msg("replica %d died at %" PRId64 " s (see %s/replica-%d.log)", i, sec,
                         s->t.dir, i);
        }
        int64_t next = t0 + sec * 1000;
        int64_t left = next - wxg_test_now_ms();
        if (left > 0)
            wxg_test_sleep_ms(left);
    }
    if (!redis_done)
        fail_msg("Redis was not restarted: no mid-minute second after %" PRId64 " s", redis_at);
    if (s->restarting)
        fail_msg("replica 1 did not stop within the rest of the run after SIGTERM");
    print_message("produced %" PRIu64 " records, %" PRIu64 " unique, in %.1f s\n", produced, unique,
                  (wxg_test_now_ms() - t0) / 1000.0);

    if (!wxg_ct_wait_all_committed(&s->t, 120000, NULL))
        fail_msg("offsets not all committed in time");
    print_table(s);

    /* Replica 0 ran throughout; replica 1 since its restart. */
    check_flat(s, 0, (long)s->t.pids[0], warmup_s);
    check_flat(s, 1, (long)s->t.pids[1], replica_back_s + warmup_s / 2);
    int n = 0;
    double keys_slope = slope(s, 0, -1, warmup_s, (long)s->t.pids[0], &n);
    double unique_rate = RATE * (100 - DUP_PCT) / 100.0;
    print_message("slope Redis keys from %" PRId64 " s: %+.2f per s over %d samples (new "
                  "messages: %.1f per s)\n",
                  warmup_s, keys_slope, n, unique_rate);
    assert_true(keys_slope <= 1.25 * unique_rate);
    const sample *last = &s->samples[s->nsamples - 1];
    int64_t horizon = last->t_s - 2 * RETENTION_S;
    uint64_t alive = last->unique - (horizon > 0 ? s->unique_at[horizon] : 0);
    print_message("Redis keys at the end: %lld, unique messages of the last %d s: %" PRIu64 "\n",
                  last->dbsize, 2 * RETENTION_S, alive);
    assert_true(last->dbsize >= 0);
    assert_true((uint64_t)last->dbsize <= alive + alive / 5 + 64);

    wxg_ct_assert_each_once(&s->t, ID_BASE, unique);
    for (int i = 0; i < REPLICAS; i++) {
        int st = wxg_ct_signal(&s->t, i, SIGTERM, 30000);
        wxg_ct_assert_exit(&s->t, i, st, 0);
    }
    wxg_ct_teardown(&s->t);
    wxg_test_redis_stop(&s->redis);
    free(s->unique_at);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(replicas_keep_flat_and_effects_stay_exactly_once_through_restarts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
