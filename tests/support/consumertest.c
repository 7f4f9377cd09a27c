/*
 * DESIGN: test support for wxguard-consumer end-to-end tests (see consumertest.h). Replicas are
 * fork/exec'd children, stopped by PID, and killed by the kernel (PR_SET_PDEATHSIG) should the
 * test process die first. The ledger is parsed with cJSON; offsets come from the broker through
 * testkafka.
 */
#include "consumertest.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"

#define ACCOUNT "wxid_ctbot0001"

void wxg_ct_init(wxg_ct_t *t, const char *tag, int partitions)
{
    memset(t, 0, sizeof *t);
    assert_true(partitions > 0 && partitions <= WXG_CT_MAX_PARTS);
    t->partitions = partitions;
    t->dir = wxg_test_mkdtemp(tag);
    assert_non_null(t->dir);
    t->topic = wxg_test_kafka_name(tag);
    char buf[128];
    snprintf(buf, sizeof buf, "%s-dlq", tag);
    t->dlq = wxg_test_kafka_name(buf);
    snprintf(buf, sizeof buf, "%s-group", tag);
    t->group = wxg_test_kafka_name(buf);
    snprintf(t->prefix, sizeof t->prefix, "ct%ld%lld", (long)getpid(),
             (long long)wxg_test_now_ms());
    snprintf(t->ledger, sizeof t->ledger, "%s/ledger.jsonl", t->dir);
    snprintf(t->config, sizeof t->config, "%s/consumer.conf", t->dir);
    t->redis_host = wxg_test_redis_host();
    t->redis_port = wxg_test_redis_port();
}

void wxg_ct_setup(wxg_ct_t *t, const char *tag, int partitions)
{
    wxg_ct_init(t, tag, partitions);
    wxg_test_kafka_create_topic(t->topic, partitions);
    wxg_test_kafka_create_topic(t->dlq, 1);
}

void wxg_ct_teardown(wxg_ct_t *t)
{
    for (int i = 0; i < WXG_CT_MAX_REPLICAS; i++) {
        if (t->pids[i] > 0)
            wxg_ct_signal(t, i, SIGKILL, 10000);
    }
    wxg_test_kafka_offsets_reader_free(t->offsets);
    if (getenv("WXG_TEST_KEEP")) {
        print_message("kept %s\n", t->dir);
    } else if (t->dir) {
        wxg_test_rmtree(t->dir);
    }
    free(t->dir);
    free(t->topic);
    free(t->dlq);
    free(t->group);
    memset(t, 0, sizeof *t);
}

/* 1 when `extra` sets `key` itself (a line starting with "key ="). */
static int extra_sets(const char *extra, const char *key)
{
    size_t kl = strlen(key);
    for (const char *l = extra; l && *l;) {
        while (*l == ' ')
            l++;
        if (strncmp(l, key, kl) == 0 && (l[kl] == ' ' || l[kl] == '='))
            return 1;
        l = strchr(l, '\n');
        if (l)
            l++;
    }
    return 0;
}

void wxg_ct_write_config(wxg_ct_t *t, const char *extra)
{
    char port[16];
    snprintf(port, sizeof port, "%d", t->redis_port);
    const char *defaults[][2] = {
        {"kafka.bootstrap.servers", wxg_test_kafka_bootstrap()},
        {"kafka.group.id", t->group},
        {"kafka.broker.address.family", "v4"},
        {"kafka.session.timeout.ms", "6000"},
        {"kafka.heartbeat.interval.ms", "500"},
        {"kafka.auto.offset.reset", "earliest"},
        {"consumer.topics", t->topic},
        {"dlq.topic", t->dlq},
        {"redis.host", t->redis_host},
        {"redis.port", port},
        {"redis.key.prefix", t->prefix},
        {"plugins", "record"},
        {"plugin.record.path", t->ledger},
        {"consumer.workers", "4"},
        {"consumer.commit.interval.ms", "200ms"},
        {"consumer.drain.timeout.ms", "10s"},
        {"consumer.retry.backoff.initial.ms", "20ms"},
        {"consumer.retry.backoff.max.ms", "200ms"},
        {"log.level", "info"},
    };
    FILE *f = fopen(t->config, "w");
    assert_non_null(f);
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
        if (!extra_sets(extra, defaults[i][0]))
            fprintf(f, "%s = %s\n", defaults[i][0], defaults[i][1]);
    }
    if (extra)
        fputs(extra, f);
    assert_int_equal(fclose(f), 0);
}

pid_t wxg_ct_spawn(wxg_ct_t *t, int idx)
{
    return wxg_ct_spawn_set(t, idx, NULL);
}

pid_t wxg_ct_spawn_set(wxg_ct_t *t, int idx, const char *const *sets)
{
    assert_true(idx >= 0 && idx < WXG_CT_MAX_REPLICAS);
    const char *bin = getenv("WXG_BINARY_DIR");
    assert_non_null(bin);
    char path[512], logp[512];
    snprintf(path, sizeof path, "%s/cmd/wxguard-consumer/wxguard-consumer", bin);
    snprintf(logp, sizeof logp, "%s/replica-%d.log", t->dir, idx);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* A failing test skips its teardown: the replica must not outlive the test process. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        const char *argv[40];
        int n = 0;
        argv[n++] = path;
        argv[n++] = "--config";
        argv[n++] = t->config;
        for (size_t i = 0; sets && sets[i] && n < 37; i++) {
            argv[n++] = "--set";
            argv[n++] = sets[i];
        }
        argv[n] = NULL;
        execv(path, (char *const *)argv);
        _exit(127);
    }
    t->pids[idx] = pid;
    return pid;
}

int wxg_ct_spawn_metrics(wxg_ct_t *t, int idx)
{
    char listen[64];
    int port = wxg_test_free_port();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "metrics.listen=127.0.0.1:%d", port);
    wxg_ct_spawn_set(t, idx, (const char *const[]){listen, NULL});
    return port;
}

/* The whole file at `path`, NUL-terminated (the caller frees it); "" when it cannot be read. */
static char *read_whole(const char *path)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    FILE *f = fopen(path, "rb");
    for (size_t got = 1; f && got > 0; len += got) {
        if (cap - len < 2) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
        got = fread(buf + len, 1, cap - len - 1, f);
    }
    if (f)
        fclose(f);
    buf[len] = '\0';
    return buf;
}

int wxg_ct_run_ctl(const wxg_ct_t *t, const char *const *args, int64_t timeout_ms, char **out)
{
    const char *bin = getenv("WXG_BINARY_DIR");
    assert_non_null(bin);
    char path[512], outp[512], errp[512];
    snprintf(path, sizeof path, "%s/cmd/wxguardctl/wxguardctl", bin);
    snprintf(outp, sizeof outp, "%s/wxguardctl.out", t->dir);
    snprintf(errp, sizeof errp, "%s/wxguardctl.err", t->dir);
    const char *argv[48];
    int n = 0;
    argv[n++] = path;
    for (int i = 0; args[i]; i++) {
        assert_true(n < 47);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    int status = wxg_test_run(argv, NULL, outp, errp, timeout_ms);
    if (status < 0)
        fail_msg("wxguardctl %s did not finish in time", args[0]);
    if (status != 0) {
        char *err = read_whole(errp);
        print_message("wxguardctl %s exited %d; stderr:\n%s\n", args[0], status, err);
        free(err);
    }
    *out = read_whole(outp);
    return status;
}

double wxg_ct_metric_sum(const int *ports, int n, const char *series)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double v = wxg_test_metric_scrape(ports[i], series);
        if (v < 0)
            fail_msg("no %s on the /metrics of port %d", series, ports[i]);
        sum += v;
    }
    return sum;
}

int wxg_ct_alive(wxg_ct_t *t, int idx)
{
    if (t->pids[idx] <= 0)
        return 0;
    int st;
    pid_t r = waitpid(t->pids[idx], &st, WNOHANG);
    if (r == t->pids[idx]) {
        t->pids[idx] = 0;
        return 0;
    }
    return 1;
}

int wxg_ct_signal(wxg_ct_t *t, int idx, int sig, int64_t timeout_ms)
{
    pid_t pid = t->pids[idx];
    if (pid <= 0)
        return -1;
    kill(pid, sig);
    if (sig != SIGTERM && sig != SIGKILL && sig != SIGINT)
        return 0;
    return wxg_ct_wait_exit(t, idx, timeout_ms);
}

int wxg_ct_wait_exit(wxg_ct_t *t, int idx, int64_t timeout_ms)
{
    pid_t pid = t->pids[idx];
    if (pid <= 0)
        return -1;
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            t->pids[idx] = 0;
            return st;
        }
        if (wxg_test_now_ms() >= deadline)
            return -1;
        wxg_test_sleep_ms(20);
    }
}

#define TAIL_LINES 30

void wxg_ct_assert_exit(const wxg_ct_t *t, int idx, int st, int code)
{
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == code)
        return;
    char how[96];
    if (st == -1)
        snprintf(how, sizeof how, "did not exit in time (still running, pid %ld)",
                 (long)t->pids[idx]);
    else if (WIFEXITED(st))
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(st));
    else
        snprintf(how, sizeof how, "ended with wait status 0x%x", (unsigned)st);
    char logp[512];
    snprintf(logp, sizeof logp, "%s/replica-%d.log", t->dir, idx);
    print_message("replica %d %s; expected exit status %d. Last lines of %s:\n", idx, how, code,
                  logp);
    /* A ring of the last TAIL_LINES lines (long lines are cut, which is fine for a tail). */
    static char ring[TAIL_LINES][1024];
    size_t n = 0;
    FILE *f = fopen(logp, "r");
    while (f && fgets(ring[n % TAIL_LINES], sizeof ring[0], f)) {
        size_t len = strlen(ring[n % TAIL_LINES]);
        if (len > 0 && ring[n % TAIL_LINES][len - 1] != '\n') {
            int ch;
            while ((ch = fgetc(f)) != EOF && ch != '\n')
                ;
        }
        n++;
    }
    if (f)
        fclose(f);
    for (size_t i = n > TAIL_LINES ? n - TAIL_LINES : 0; i < n; i++) {
        const char *line = ring[i % TAIL_LINES];
        size_t len = strlen(line);
        print_message("  | %s%s", line, len > 0 && line[len - 1] == '\n' ? "" : "\n");
    }
    fail_msg("replica %d %s (expected exit status %d)", idx, how, code);
}

void wxg_ct_index_offsets(const wxg_ct_t *t, const wxg_ct_msg_t *msgs, size_t n, uint64_t **ids)
{
    size_t count[WXG_CT_MAX_PARTS] = {0};
    for (int p = 0; p < t->partitions; p++) {
        ids[p] = calloc(n ? n : 1, sizeof **ids);
        assert_non_null(ids[p]);
    }
    for (size_t i = 0; i < n; i++) {
        assert_true(msgs[i].partition >= 0 && msgs[i].partition < t->partitions);
        ids[msgs[i].partition][count[msgs[i].partition]++] = msgs[i].id;
    }
}

void wxg_ct_free_offsets(const wxg_ct_t *t, uint64_t **ids)
{
    for (int p = 0; p < t->partitions; p++) {
        free(ids[p]);
        ids[p] = NULL;
    }
}

void wxg_ct_stop_all(wxg_ct_t *t)
{
    for (int i = 0; i < WXG_CT_MAX_REPLICAS; i++) {
        if (t->pids[i] > 0)
            wxg_ct_assert_exit(t, i, wxg_ct_signal(t, i, SIGTERM, 60000), 0);
    }
}

static char *msg_json(uint64_t id, int conv)
{
    char *s = malloc(512);
    assert_non_null(s);
    snprintf(s, 512,
             "{\"account\":\"" ACCOUNT
             "\",\"msg_id\":\"%llu\",\"conversation\":\"conv%04d@chatroom\","
             "\"sender\":\"wxid_sender%04d\",\"create_time\":1700000000,\"type\":\"text\","
             "\"is_group\":true,\"content\":\"message %llu in conversation %d\"}",
             (unsigned long long)id, conv, conv, (unsigned long long)id, conv);
    return s;
}

void wxg_ct_produce(wxg_ct_t *t, const wxg_ct_msg_t *msgs, size_t n)
{
    wxg_test_kafka_record_t *recs = calloc(n ? n : 1, sizeof *recs);
    char **vals = calloc(n ? n : 1, sizeof *vals);
    char **keys = calloc(n ? n : 1, sizeof *keys);
    assert_true(recs && vals && keys);
    for (size_t i = 0; i < n; i++) {
        vals[i] = msg_json(msgs[i].id, msgs[i].conv);
        keys[i] = malloc(64);
        assert_non_null(keys[i]);
        snprintf(keys[i], 64, ACCOUNT ":conv%04d", msgs[i].conv);
        recs[i] = (wxg_test_kafka_record_t){.partition = msgs[i].partition,
                                            .key = keys[i],
                                            .key_len = strlen(keys[i]),
                                            .value = vals[i],
                                            .value_len = strlen(vals[i])};
        assert_true(msgs[i].partition >= 0 && msgs[i].partition < t->partitions);
    }
    wxg_test_kafka_produce(t->topic, recs, n);
    for (size_t i = 0; i < n; i++) {
        t->produced[msgs[i].partition]++;
        free(vals[i]);
        free(keys[i]);
    }
    free(recs);
    free(vals);
    free(keys);
}

void wxg_ct_produce_raw(wxg_ct_t *t, int32_t partition, const char *value)
{
    wxg_test_kafka_record_t r = {.partition = partition,
                                 .key = "raw",
                                 .key_len = 3,
                                 .value = value,
                                 .value_len = strlen(value)};
    wxg_test_kafka_produce(t->topic, &r, 1);
    t->produced[partition]++;
}

size_t wxg_ct_read_ledger(const wxg_ct_t *t, wxg_ct_effect_t **out, size_t *torn)
{
    size_t n = 0, cap = 1024, bad = 0;
    wxg_ct_effect_t *v = malloc(cap * sizeof *v);
    assert_non_null(v);
    FILE *f = fopen(t->ledger, "r");
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *id = j ? cJSON_GetObjectItemCaseSensitive(j, "msg_id") : NULL;
        const cJSON *fence = j ? cJSON_GetObjectItemCaseSensitive(j, "fence") : NULL;
        if (!j || !cJSON_IsString(id) || !cJSON_IsNumber(fence)) {
            bad++;
            cJSON_Delete(j);
            continue;
        }
        if (n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
            assert_non_null(v);
        }
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(j, "pid");
        const cJSON *part = cJSON_GetObjectItemCaseSensitive(j, "partition");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "offset");
        const cJSON *att = cJSON_GetObjectItemCaseSensitive(j, "attempt");
        const cJSON *tms = cJSON_GetObjectItemCaseSensitive(j, "time_ms");
        v[n].id = strtoull(id->valuestring, NULL, 10);
        v[n].fence = (uint64_t)fence->valuedouble;
        v[n].pid = cJSON_IsNumber(pid) ? (long)pid->valuedouble : -1;
        v[n].partition = cJSON_IsNumber(part) ? (int32_t)part->valuedouble : -1;
        v[n].offset = cJSON_IsNumber(off) ? (int64_t)off->valuedouble : -1;
        v[n].attempt = cJSON_IsNumber(att) ? (uint64_t)att->valuedouble : 0;
        v[n].time_ms = cJSON_IsNumber(tms) ? (int64_t)tms->valuedouble : 0;
        n++;
        cJSON_Delete(j);
    }
    if (f)
        fclose(f);
    if (torn)
        *torn = bad;
    *out = v;
    return n;
}

size_t wxg_ct_ledger_lines(const wxg_ct_t *t)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    free(eff);
    return n;
}

void wxg_ct_committed_all(wxg_ct_t *t, int64_t *out)
{
    if (!t->offsets)
        t->offsets = wxg_test_kafka_offsets_reader(t->group);
    wxg_test_kafka_offsets_read(t->offsets, t->topic, t->partitions, out);
}

int64_t wxg_ct_committed(wxg_ct_t *t, int32_t p)
{
    int64_t all[WXG_CT_MAX_PARTS];
    assert_true(p >= 0 && p < t->partitions);
    wxg_ct_committed_all(t, all);
    return all[p];
}

int wxg_ct_wait_all_committed(wxg_ct_t *t, int64_t timeout_ms, void (*check)(wxg_ct_t *))
{
    return wxg_ct_wait_all_committed_every(t, timeout_ms, check, 1000);
}

int wxg_ct_wait_all_committed_every(wxg_ct_t *t, int64_t timeout_ms, void (*check)(wxg_ct_t *),
                                    int64_t period_ms)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    int64_t next_check = 0;
    int64_t committed[WXG_CT_MAX_PARTS];
    for (;;) {
        wxg_ct_committed_all(t, committed);
        int done = 1;
        for (int p = 0; p < t->partitions && done; p++) {
            if (committed[p] != t->produced[p])
                done = 0;
        }
        if (done)
            return 1;
        if (wxg_test_now_ms() >= deadline)
            break;
        for (int i = 0; i < WXG_CT_MAX_REPLICAS; i++) {
            if (t->pids[i] > 0 && !wxg_ct_alive(t, i))
                fail_msg("replica %d exited unexpectedly (see %s/replica-%d.log)", i, t->dir, i);
        }
        if (check && wxg_test_now_ms() >= next_check) {
            check(t);
            next_check = wxg_test_now_ms() + period_ms;
        }
        wxg_test_sleep_ms(period_ms < 200 ? period_ms : 200);
    }
    wxg_ct_committed_all(t, committed);
    for (int p = 0; p < t->partitions; p++)
        print_message("partition %d: committed %lld of %lld\n", p, (long long)committed[p],
                      (long long)t->produced[p]);
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void wxg_ct_check_commit_invariant(wxg_ct_t *t, uint64_t *const *offset_ids)
{
    int64_t committed[WXG_CT_MAX_PARTS];
    wxg_ct_committed_all(t, committed);
    /* Effects are written before the offset passes them, so the ledger read after the sample
     * must hold every message below the sampled offsets. */
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = eff[i].id;
    qsort(ids, n, sizeof *ids, cmp_u64);
    for (int p = 0; p < t->partitions; p++) {
        assert_true(committed[p] <= t->produced[p]);
        for (int64_t o = 0; o < committed[p]; o++) {
            uint64_t id = offset_ids[p][o];
            if (id == 0)
                continue;
            if (!bsearch(&id, ids, n, sizeof *ids, cmp_u64))
                fail_msg("partition %d committed %lld, but message %llu at offset %lld has no "
                         "effect",
                         p, (long long)committed[p], (unsigned long long)id, (long long)o);
        }
    }
    free(ids);
    free(eff);
}

/* Over the lines of replica idx's log that contain `needle`: how many, and the sum of the
 * numbers that follow it. */
static long log_scan(const wxg_ct_t *t, int idx, const char *needle, int sum)
{
    char logp[512];
    snprintf(logp, sizeof logp, "%s/replica-%d.log", t->dir, idx);
    FILE *f = fopen(logp, "r");
    if (!f)
        return 0;
    char line[16384];
    long n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, needle);
        if (at)
            n += sum ? strtol(at + strlen(needle), NULL, 10) : 1;
    }
    fclose(f);
    return n;
}

int wxg_ct_log_count(const wxg_ct_t *t, int idx, const char *needle)
{
    return (int)log_scan(t, idx, needle, 0);
}

long wxg_ct_log_sum(const wxg_ct_t *t, int idx, const char *prefix)
{
    return log_scan(t, idx, prefix, 1);
}

int wxg_ct_wait_log(const wxg_ct_t *t, int idx, const char *needle, int count, int64_t timeout_ms)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    while (wxg_ct_log_count(t, idx, needle) < count) {
        if (wxg_test_now_ms() >= deadline)
            return 0;
        wxg_test_sleep_ms(20);
    }
    return 1;
}

int64_t wxg_ct_log_last(const wxg_ct_t *t, int idx, const char *event, const char *key)
{
    char logp[512], needle[128];
    snprintf(logp, sizeof logp, "%s/replica-%d.log", t->dir, idx);
    snprintf(needle, sizeof needle, " %s=", key);
    FILE *f = fopen(logp, "r");
    if (!f)
        return -1;
    char line[16384];
    int64_t v = -1;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, event) ? strstr(line, needle) : NULL;
        if (at)
            v = strtoll(at + strlen(needle), NULL, 10);
    }
    fclose(f);
    return v;
}

void wxg_ct_assert_each_once(const wxg_ct_t *t, uint64_t base, size_t total)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    assert_int_equal(n, total);
    unsigned char *seen = calloc(total, 1);
    assert_non_null(seen);
    for (size_t i = 0; i < n; i++) {
        assert_in_range(eff[i].id, base, base + total - 1);
        assert_int_equal(seen[eff[i].id - base]++, 0);
    }
    free(seen);
    free(eff);
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int wxg_ct_stop(wxg_ct_t *t, int idx, int sig, int64_t timeout_ms, wxg_ct_stop_t *stop)
{
    assert_true(sig == SIGKILL || sig == SIGTERM);
    stop->pid = (long)t->pids[idx];
    stop->sig = sig;
    stop->sent_ms = wall_ms();
    int st = wxg_ct_signal(t, idx, sig, timeout_ms);
    stop->exited_ms = wall_ms();
    return st;
}

static int cmp_effect_time(const void *a, const void *b)
{
    const wxg_ct_effect_t *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    if (x->time_ms != y->time_ms)
        return x->time_ms < y->time_ms ? -1 : 1;
    return x->fence < y->fence ? -1 : x->fence > y->fence;
}

/* The stop of process `pid` sent at or after `when` (the first such), or NULL. */
static const wxg_ct_stop_t *stop_after(const wxg_ct_stop_t *stops, size_t n, long pid, int64_t when)
{
    for (size_t i = 0; i < n; i++) {
        if (stops[i].pid == pid && stops[i].sent_ms >= when)
            return &stops[i];
    }
    return NULL;
}

/* "pid 123 (SIGKILLed)", for the repeat lines. */
static const char *role(const wxg_ct_stop_t *stops, size_t n, long pid, char *buf, size_t size)
{
    for (size_t i = 0; i < n; i++) {
        if (stops[i].pid == pid) {
            snprintf(buf, size, "pid %ld (%s)", pid,
                     stops[i].sig == SIGKILL ? "SIGKILLed" : "SIGTERMed");
            return buf;
        }
    }
    snprintf(buf, size, "pid %ld", pid);
    return buf;
}

/* The effect's time relative to each stop: " kill+12ms term-340ms". */
static void relative(const wxg_ct_stop_t *stops, size_t n, int64_t when, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && len < size; i++) {
        int w =
            snprintf(buf + len, size - len, " %s%+lldms", stops[i].sig == SIGKILL ? "kill" : "term",
                     (long long)(when - stops[i].sent_ms));
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

void wxg_ct_classify_repeats(const wxg_ct_t *t, const wxg_ct_stop_t *stops, size_t n,
                             wxg_ct_repeats_t *out)
{
    static const char *const kind_name[WXG_CT_REPEAT_KINDS] = {"crash window", "SIGTERM",
                                                               "same fence", "live owner"};
    assert_true(n <= WXG_CT_MAX_REPLICAS);
    memset(out, 0, sizeof *out);
    wxg_ct_effect_t *eff;
    size_t ne = wxg_ct_read_ledger(t, &eff, NULL);
    qsort(eff, ne, sizeof *eff, cmp_effect_time);
    for (size_t i = 0; i < ne; i++) {
        /* Work a stopped replica held: a later claim's effect, after the stop. */
        if (eff[i].fence > 1) {
            for (size_t s = 0; s < n; s++) {
                if (eff[i].pid != stops[s].pid && eff[i].time_ms >= stops[s].sent_ms)
                    out->taken_over[s]++;
            }
        }
        if (i == 0 || eff[i].id != eff[i - 1].id)
            continue;
        const wxg_ct_effect_t *a = &eff[i - 1], *b = &eff[i];
        const wxg_ct_stop_t *s = stop_after(stops, n, a->pid, a->time_ms);
        int kind;
        if (b->fence == a->fence && b->pid == a->pid)
            kind = WXG_CT_REPEAT_SAME;
        else if (s && s->sig == SIGKILL && b->time_ms >= s->sent_ms && b->fence > a->fence)
            kind = WXG_CT_REPEAT_CRASH;
        else if (s && s->sig == SIGTERM)
            kind = WXG_CT_REPEAT_SIGTERM;
        else
            kind = WXG_CT_REPEAT_LIVE;
        out->n[kind]++;
        out->total++;
        if (kind == WXG_CT_REPEAT_CRASH && s->sent_ms - a->time_ms > out->crash_window_max_ms)
            out->crash_window_max_ms = s->sent_ms - a->time_ms;
        char ra[64], rb[64], ta[160], tb[160];
        relative(stops, n, a->time_ms, ta, sizeof ta);
        relative(stops, n, b->time_ms, tb, sizeof tb);
        print_message("repeat: message %llu (partition %d offset %lld): first by %s fence %llu "
                      "attempt %llu at%s; again by %s fence %llu attempt %llu at%s: %s\n",
                      (unsigned long long)a->id, (int)a->partition, (long long)a->offset,
                      role(stops, n, a->pid, ra, sizeof ra), (unsigned long long)a->fence,
                      (unsigned long long)a->attempt, ta, role(stops, n, b->pid, rb, sizeof rb),
                      (unsigned long long)b->fence, (unsigned long long)b->attempt, tb,
                      kind_name[kind]);
    }
    free(eff);
}
