/* End to end from HTTP to the database, with real Kafka, Redis and PostgreSQL:
 *
 *   HTTP POST -> wxguard-ingest -> Kafka -> two wxguard-consumer replicas
 *                -> autoreply (outbound topic), pgsql (rows), billing (balances), record (ledger)
 *
 * A few thousand WeChat callbacks in the wkteam, GeWe and generic formats (three bot accounts,
 * group and private chats) are POSTed to a wxguard-ingest child process, about 30% of them
 * duplicates: some re-POSTed at once (a gateway retry racing the original), some seconds later,
 * some after one consumer replica was SIGKILLed mid-run and started again. Afterwards:
 *   - PostgreSQL holds exactly one row per unique message, and no other;
 *   - each account's balance was charged exactly once per unique message (one charge row per
 *     key, the sum of the charges is the unique count times the price);
 *   - the outbound topic holds one reply per message that an autoreply rule matches, and none
 *     for the others (a group-only rule does not answer private chats);
 *   - the record plugin's ledger has one effect per unique message; a second effect, a second
 *     reply or a rewritten row is allowed only for a message the killed replica was running
 *     (at most its worker count), with a higher fencing token, and the database still holds
 *     one row and one charge for it;
 *   - nothing is dead-lettered and the committed offsets reach the end offsets.
 * Every process the test starts is a child that dies with it (PR_SET_PDEATHSIG). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "consumertest.h"
#include "testenv.h"
#include "testhttp.h"
#include "testkafka.h"
#include "testpg.h"

#define PARTITIONS 6
#define ACCOUNTS   3
#define CONVS      60
#define WORKERS    4
#define PRICE      3
#define SENDERS    6
#define PHASE_UNIQ 1000 /* unique messages in each of the two main phases */
#define ID_BASE    7301234569000000000ULL

enum { FMT_WKTEAM, FMT_GEWE, FMT_GENERIC };
enum { TXT_PLAIN, TXT_HELLO, TXT_PRICE };

/* One unique callback. */
typedef struct cb {
    uint64_t id;
    int account;
    int format;
    int conv;
    int text;
} cb_t;

static const char *const format_path[] = {"wkteam", "gewe", "generic"};

static void account_name(int a, char *buf, size_t size)
{
    snprintf(buf, size, "wxid_e2ebot%04d", a + 1);
}

static void key_of(const cb_t *c, char *buf, size_t size)
{
    char acct[32];
    account_name(c->account, acct, sizeof acct);
    snprintf(buf, size, "%s:n:%llu", acct, (unsigned long long)c->id);
}

/* wkteam callbacks are group messages, GeWe and generic ones private chats here. The rules:
 * "你好" anywhere gets a greeting; "价格" gets an answer in groups only. */
static int expect_reply(const cb_t *c)
{
    return c->text == TXT_HELLO || (c->text == TXT_PRICE && c->format == FMT_WKTEAM);
}

/* The body of callback c in its format. */
static size_t render(const cb_t *c, char *buf, size_t cap)
{
    char acct[32], content[128];
    account_name(c->account, acct, sizeof acct);
    if (c->text == TXT_HELLO)
        snprintf(content, sizeof content, "你好");
    else if (c->text == TXT_PRICE)
        snprintf(content, sizeof content, "请问价格是多少？");
    else
        snprintf(content, sizeof content, "message %llu in conversation %d",
                 (unsigned long long)c->id, c->conv);
    int n;
    switch (c->format) {
    case FMT_WKTEAM:
        n = snprintf(buf, cap,
                     "{\"wcId\":\"%s\",\"messageType\":\"80001\",\"data\":{"
                     "\"fromUser\":\"wxid_member%04d\",\"fromGroup\":\"%d@chatroom\","
                     "\"toUser\":\"%s\",\"newMsgId\":%llu,\"timestamp\":1748140000,"
                     "\"self\":false,\"content\":\"%s\"}}",
                     acct, c->conv % 50, 30000000 + c->conv, acct, (unsigned long long)c->id,
                     content);
        break;
    case FMT_GEWE:
        n = snprintf(buf, cap,
                     "{\"TypeName\":\"AddMsg\",\"Appid\":\"wx_E2EAPPID_000%d\",\"Wxid\":\"%s\","
                     "\"Data\":{\"FromUserName\":{\"string\":\"wxid_peer%04d\"},"
                     "\"ToUserName\":{\"string\":\"%s\"},\"MsgType\":1,"
                     "\"Content\":{\"string\":\"%s\"},\"CreateTime\":1705043418,"
                     "\"NewMsgId\":%llu}}",
                     c->account, acct, c->conv, acct, content, (unsigned long long)c->id);
        break;
    default:
        n = snprintf(buf, cap,
                     "{\"account\":\"%s\",\"msg_id\":\"%llu\",\"conversation\":\"wxid_user%04d\","
                     "\"sender\":\"wxid_user%04d\",\"create_time\":1700000000,\"type\":\"text\","
                     "\"is_group\":false,\"content\":\"%s\"}",
                     acct, (unsigned long long)c->id, c->conv, c->conv, content);
        break;
    }
    return n > 0 && (size_t)n < cap ? (size_t)n : 0; /* 0: did not fit (never, with cap 2048) */
}

/* ---- HTTP senders ---- */

typedef struct phase {
    const cb_t *const *list; /* what to POST, in order (duplicates are repeated pointers) */
    size_t n;
    int port;
    atomic_size_t next;
    atomic_size_t ok;       /* answered 200 */
    atomic_size_t retried;  /* 503 or no answer, sent again (a gateway's retry) */
    atomic_size_t refused;  /* any other status: fails the test */
    atomic_int last_status; /* of a refused request */
} phase_t;

static void *sender(void *arg)
{
    phase_t *ph = arg;
    char body[2048];
    for (;;) {
        size_t i = atomic_fetch_add(&ph->next, 1);
        if (i >= ph->n)
            break;
        const cb_t *c = ph->list[i];
        size_t len = render(c, body, sizeof body);
        if (len == 0) {
            atomic_fetch_add(&ph->refused, 1);
            continue;
        }
        char path[64];
        snprintf(path, sizeof path, "/v1/callback/%s", format_path[c->format]);
        int done = 0;
        for (int attempt = 0; attempt < 20 && !done; attempt++) {
            wxg_test_http_resp_t r;
            int rc = wxg_test_http(ph->port, "POST", path, "Content-Type: application/json\r\n",
                                   body, len, &r);
            if (rc == 0 && r.status == 200) {
                atomic_fetch_add(&ph->ok, 1);
                done = 1;
            } else if (rc != 0 || r.status == 503) {
                atomic_fetch_add(&ph->retried, 1);
                wxg_test_sleep_ms(50 * (attempt + 1));
            } else {
                atomic_store(&ph->last_status, r.status);
                atomic_fetch_add(&ph->refused, 1);
                done = 1;
            }
            if (rc == 0)
                wxg_test_http_free(&r);
        }
        if (!done)
            atomic_fetch_add(&ph->refused, 1);
    }
    return NULL;
}

static void *post_phase_thread(void *arg)
{
    phase_t *ph = arg;
    pthread_t th[SENDERS];
    int started = 0;
    for (int i = 0; i < SENDERS; i++) {
        if (pthread_create(&th[i], NULL, sender, ph) == 0)
            started++;
        else
            break;
    }
    if (started == 0)
        sender(ph);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    return NULL;
}

static void phase_init(phase_t *ph, const cb_t *const *list, size_t n, int port)
{
    memset(ph, 0, sizeof *ph);
    ph->list = list;
    ph->n = n;
    ph->port = port;
}

static void phase_check(phase_t *ph, const char *name)
{
    if (atomic_load(&ph->refused) != 0)
        fail_msg("%s: %zu callbacks refused (last status %d)", name, atomic_load(&ph->refused),
                 atomic_load(&ph->last_status));
    assert_int_equal(atomic_load(&ph->ok), ph->n);
}

/* ---- processes ---- */

/* True when the log at `path` has wxguard-ingest's line saying it listens on `port`. */
static int log_says_listening(const char *path, int port)
{
    char want[64], line[512];
    snprintf(want, sizeof want, "wxguard-ingest listening on port %d\n", port);
    FILE *f = fopen(path, "r");
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = strcmp(line, want) == 0;
    if (f)
        fclose(f);
    return found;
}

/* The operations port wxguard-ingest wrote to the log at `path` (before its listening line), or
 * 0. */
static int log_ops_port(const char *path)
{
    char line[512];
    int port = 0;
    FILE *f = fopen(path, "r");
    while (f && port == 0 && fgets(line, sizeof line, f)) {
        if (sscanf(line, "wxguard-ingest operations on port %d", &port) != 1)
            port = 0;
    }
    if (f)
        fclose(f);
    return port;
}

static pid_t spawn_ingest(const char *dir, int port, const char *topic)
{
    const char *bin = getenv("WXG_BINARY_DIR");
    assert_non_null(bin);
    char path[512], logp[512], listen[64], top[256], boot[256];
    snprintf(path, sizeof path, "%s/cmd/wxguard-ingest/wxguard-ingest", bin);
    snprintf(logp, sizeof logp, "%s/ingest.log", dir);
    snprintf(listen, sizeof listen, "ingest.listen=127.0.0.1:%d", port);
    snprintf(top, sizeof top, "ingest.topic=%s", topic);
    snprintf(boot, sizeof boot, "kafka.bootstrap.servers=%s", wxg_test_kafka_bootstrap());
    /* Empty, so that no line of an earlier run passes for this one's. */
    FILE *fresh = fopen(logp, "w");
    assert_non_null(fresh);
    fclose(fresh);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execl(path, path, "--set", boot, "--set", top, "--set", listen, "--set",
              "ingest.ops.listen=127.0.0.1:0", "--set", "kafka.broker.address.family=v4", "--set",
              "ingest.concurrency=32", "--set", "ingest.produce.timeout.ms=10s", (char *)NULL);
        _exit(127);
    }
    int64_t deadline = wxg_test_now_ms() + 30000 * wxg_test_scale();
    int ops = 0;
    for (;;) {
        wxg_test_http_resp_t r;
        /* A /readyz answer counts only once our child wrote that it listens on the port: a
         * server of another test that took the port meanwhile would answer just the same. The
         * operations port (readiness, metrics) is the one it wrote just before. */
        if (ops == 0 && log_says_listening(logp, port))
            ops = log_ops_port(logp);
        if (ops > 0 && wxg_test_http(ops, "GET", "/readyz", NULL, NULL, 0, &r) == 0) {
            int st = r.status;
            wxg_test_http_free(&r);
            if (st == 200)
                break;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            fail_msg("wxguard-ingest exited at start-up (see %s)", logp);
        if (wxg_test_now_ms() >= deadline)
            fail_msg("wxguard-ingest not ready in time (see %s)", logp);
        wxg_test_sleep_ms(100);
    }
    /* The program exports the standard process figures beside its own. */
    wxg_test_http_resp_t r;
    assert_int_equal(wxg_test_http(ops, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    assert_non_null(strstr(r.body, "\nprocess_resident_memory_bytes "));
    assert_non_null(strstr(r.body, "\nprocess_cpu_seconds_total "));
    wxg_test_http_free(&r);
    return pid;
}

static int stop_child(pid_t pid, int sig, int64_t timeout_ms)
{
    kill(pid, sig);
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return st;
        if (wxg_test_now_ms() >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        wxg_test_sleep_ms(20);
    }
}

/* ---- Kafka read-back ---- */

/* High watermarks of topic's partitions into ends[]; returns their sum. */
static int64_t end_offsets(const char *topic, int partitions, int64_t *ends)
{
    char err[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, wxg_test_kafka_conf(), err, sizeof err);
    assert_non_null(rk);
    int64_t total = 0;
    for (int p = 0; p < partitions; p++) {
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 10000);
        if (e)
            fail_msg("watermarks of %s/%d: %s", topic, p, rd_kafka_err2str(e));
        ends[p] = hi;
        total += hi;
    }
    rd_kafka_destroy(rk);
    return total;
}

typedef struct reply {
    char key[96];
    uint64_t fence;
    char to[64];
} reply_t;

/* Reads every record of the outbound topic (up to its end offsets): key and fence of each. */
static size_t read_replies(const char *topic, int partitions, reply_t **out)
{
    int64_t ends[PARTITIONS];
    int64_t total = end_offsets(topic, partitions, ends);
    reply_t *v = calloc((size_t)total + 1, sizeof *v);
    assert_non_null(v);
    char *group = wxg_test_kafka_name("e2e-replies");
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    wxg_test_kafka_conf_set(conf, "group.id", group);
    wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
    char err[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; p++)
        rd_kafka_topic_partition_list_add(parts, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    assert_int_equal(rd_kafka_assign(rk, parts), 0);
    rd_kafka_topic_partition_list_destroy(parts);
    size_t n = 0;
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while ((int64_t)n < total && wxg_test_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m)
            continue;
        if (m->err == 0 && m->offset < ends[m->partition]) {
            reply_t *r = &v[n++];
            cJSON *j = cJSON_ParseWithLength(m->payload, m->len);
            const cJSON *k = j ? cJSON_GetObjectItemCaseSensitive(j, "key") : NULL;
            const cJSON *to = j ? cJSON_GetObjectItemCaseSensitive(j, "to") : NULL;
            if (!cJSON_IsString(k) || !cJSON_IsString(to))
                fail_msg("reply at %d/%lld is not a reply command", (int)m->partition,
                         (long long)m->offset);
            snprintf(r->key, sizeof r->key, "%s", k->valuestring);
            snprintf(r->to, sizeof r->to, "%s", to->valuestring);
            cJSON_Delete(j);
            /* The Kafka key is the idempotency key too. */
            assert_int_equal(m->key_len, strlen(r->key));
            assert_memory_equal(m->key, r->key, m->key_len);
            rd_kafka_headers_t *h = NULL;
            const void *hv = NULL;
            size_t hl = 0;
            char fence[32] = "";
            if (rd_kafka_message_headers(m, &h) == 0 &&
                rd_kafka_header_get_last(h, "wxg-fence", &hv, &hl) == 0 && hv &&
                hl < sizeof fence) {
                memcpy(fence, hv, hl);
                fence[hl] = '\0';
            }
            r->fence = strtoull(fence, NULL, 10);
            assert_true(r->fence > 0);
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    free(group);
    assert_int_equal((int64_t)n, total);
    *out = v;
    return n;
}

/* ---- checks ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_reply(const void *a, const void *b)
{
    const reply_t *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c)
        return c;
    return x->fence < y->fence ? -1 : x->fence > y->fence;
}

static int cmp_effect(const void *a, const void *b)
{
    const wxg_ct_effect_t *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->fence < y->fence ? -1 : x->fence > y->fence;
}

/* Ledger: one effect per unique id; a repeat only from the killed replica, under a lower fence
 * than the one that followed. Returns the number of repeats. */
static size_t check_ledger(const wxg_ct_t *t, size_t unique, long killed)
{
    wxg_ct_effect_t *eff;
    size_t torn = 0;
    size_t n = wxg_ct_read_ledger(t, &eff, &torn);
    assert_int_equal(torn, 0);
    qsort(eff, n, sizeof *eff, cmp_effect);
    size_t distinct = 0, repeats = 0, by_killed = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(eff[i].id >= ID_BASE && eff[i].id < ID_BASE + unique);
        by_killed += eff[i].pid == killed;
        if (i > 0 && eff[i].id == eff[i - 1].id) {
            repeats++;
            assert_int_equal(eff[i - 1].pid, killed);
            assert_true(eff[i].fence > eff[i - 1].fence);
            continue;
        }
        distinct++;
    }
    assert_int_equal(distinct, unique);
    /* The killed replica was doing its share of the work before it died. */
    assert_true(by_killed > 0);
    free(eff);
    return repeats;
}

/* The outbound topic: exactly the expected keys; a second copy of a reply only under a higher
 * fence (the killed replica's copy first). Returns the keys with a second copy. */
static size_t check_replies(const char *topic, char **want, size_t nwant, size_t *total_out)
{
    reply_t *r;
    size_t n = read_replies(topic, PARTITIONS, &r);
    qsort(r, n, sizeof *r, cmp_reply);
    qsort(want, nwant, sizeof *want, cmp_str);
    size_t distinct = 0, repeated = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(r[i].key, r[i - 1].key) == 0) {
            assert_true(r[i].fence > r[i - 1].fence);
            repeated++;
            continue;
        }
        if (distinct >= nwant || strcmp(r[i].key, want[distinct]) != 0)
            fail_msg("reply for %s, expected %s", r[i].key,
                     distinct < nwant ? want[distinct] : "none");
        distinct++;
    }
    assert_int_equal(distinct, nwant);
    free(r);
    *total_out = n;
    return repeated;
}

/* pgsql: exactly the expected keys, one row each. Returns the rows a newer claim rewrote. */
static int64_t check_rows(PGconn *pg, const char *table, char **want, size_t nwant)
{
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT idem_key FROM %s ORDER BY idem_key COLLATE \"C\"", table);
    PGresult *res = PQexec(pg, sql);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    qsort(want, nwant, sizeof *want, cmp_str);
    assert_int_equal((size_t)PQntuples(res), nwant);
    for (size_t i = 0; i < nwant; i++) {
        if (strcmp(PQgetvalue(res, (int)i, 0), want[i]) != 0)
            fail_msg("row %zu is %s, expected %s", i, PQgetvalue(res, (int)i, 0), want[i]);
    }
    PQclear(res);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE writes > 1", table);
    return wxg_test_pg_int(pg, sql);
}

static void drop(PGconn *pg, const char *table)
{
    char sql[256];
    snprintf(sql, sizeof sql, "DROP TABLE IF EXISTS %s", table);
    wxg_test_pg_exec(pg, sql);
}

/* Appends `count` duplicates of random members of uniq[0..nuniq) to out (at *n). */
static void add_dups(const cb_t **out, size_t *n, const cb_t *uniq, size_t nuniq, size_t count,
                     unsigned *seed)
{
    for (size_t i = 0; i < count; i++)
        out[(*n)++] = &uniq[(size_t)rand_r(seed) % nuniq];
}

/* The unique callbacks uniq[0..n) interleaved with exactly `dups` copies of earlier ones (a
 * gateway retrying while the original is still in flight), spread evenly at random. */
static size_t interleave(const cb_t **out, const cb_t *uniq, size_t n, size_t dups, unsigned *seed)
{
    size_t k = 0, left = dups;
    for (size_t i = 0; i < n; i++) {
        out[k++] = &uniq[i];
        if (left > 0 && (size_t)rand_r(seed) % (n - i) < left) {
            out[k++] = &uniq[(size_t)rand_r(seed) % (i + 1)];
            left--;
        }
    }
    return k;
}

static void http_to_database_exactly_once_with_duplicates_and_a_sigkilled_replica(void **state)
{
    (void)state;
    int64_t t0 = wxg_test_now_ms();
    enum { UNIQUE = 2 * PHASE_UNIQ, IN_STREAM = 130, LATE = 300, AFTER_RESTART = 300 };
    static cb_t uniq[UNIQUE];
    unsigned seed = 20241;
    size_t per_account[ACCOUNTS] = {0};
    size_t nwant_replies = 0;
    static char *keys[UNIQUE], *reply_keys[UNIQUE];
    for (size_t i = 0; i < UNIQUE; i++) {
        int r = rand_r(&seed) % 100;
        uniq[i] = (cb_t){.id = ID_BASE + i,
                         .account = rand_r(&seed) % ACCOUNTS,
                         .format = rand_r(&seed) % 3,
                         .conv = rand_r(&seed) % CONVS,
                         .text = r < 10   ? TXT_HELLO
                                 : r < 25 ? TXT_PRICE
                                          : TXT_PLAIN};
        per_account[uniq[i].account]++;
        keys[i] = malloc(96);
        assert_non_null(keys[i]);
        key_of(&uniq[i], keys[i], 96);
        if (expect_reply(&uniq[i]))
            reply_keys[nwant_replies++] = keys[i];
    }

    wxg_ct_t t;
    wxg_ct_setup(&t, "e2e-http", PARTITIONS);
    char *outbound = wxg_test_kafka_name("e2e-outbound");
    wxg_test_kafka_create_topic(outbound, PARTITIONS);
    PGconn *pg = wxg_test_pg_connect();
    char *rows = wxg_test_pg_name("e2e_msgs");
    char *charges = wxg_test_pg_name("e2e_charges");
    char *balances = wxg_test_pg_name("e2e_bal");
    char extra[4096];
    snprintf(extra, sizeof extra,
             "plugins = autoreply,pgsql,billing,record\n"
             "consumer.workers = %d\n"
             "guard.lease.ms = 3s\n"
             "plugin.autoreply.topic = %s\n"
             "plugin.autoreply.rule.10 = keyword:你好 -> 你好！有什么可以帮您？\n"
             "plugin.autoreply.rule.20 = chat=group contains:价格 -> 价格请看群公告\n"
             "plugin.pgsql.dsn = %s\n"
             "plugin.pgsql.table = %s\n"
             "plugin.billing.dsn = %s\n"
             "plugin.billing.charges.table = %s\n"
             "plugin.billing.balances.table = %s\n"
             "plugin.billing.price.default = %d\n",
             WORKERS, outbound, wxg_test_pg_dsn(), rows, wxg_test_pg_dsn(), charges, balances,
             PRICE);
    wxg_ct_write_config(&t, extra);

    int port = wxg_test_free_port();
    assert_true(port > 0);
    pid_t ingest = spawn_ingest(t.dir, port, t.topic);
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);

    static const cb_t *list_a[PHASE_UNIQ + IN_STREAM], *list_b[PHASE_UNIQ + IN_STREAM];
    static const cb_t *list_late[LATE], *list_after[AFTER_RESTART];
    size_t na = interleave(list_a, uniq, PHASE_UNIQ, IN_STREAM, &seed);
    size_t nb = interleave(list_b, uniq + PHASE_UNIQ, PHASE_UNIQ, IN_STREAM, &seed);
    size_t nlate = 0, nafter = 0;
    add_dups(list_late, &nlate, uniq, PHASE_UNIQ, LATE, &seed);
    add_dups(list_after, &nafter, uniq, UNIQUE, AFTER_RESTART, &seed);

    /* Phase A, then duplicates of it some seconds later. */
    phase_t pa, pl, pb, pr;
    phase_init(&pa, list_a, na, port);
    post_phase_thread(&pa);
    phase_check(&pa, "phase A");
    wxg_test_sleep_ms(2000);
    phase_init(&pl, list_late, nlate, port);
    post_phase_thread(&pl);
    phase_check(&pl, "late duplicates");

    /* Phase B, with replica 0 SIGKILLed while it runs and started again. */
    phase_init(&pb, list_b, nb, port);
    pthread_t tb;
    assert_int_equal(pthread_create(&tb, NULL, post_phase_thread, &pb), 0);
    int64_t deadline = wxg_test_now_ms() + 120000 * wxg_test_scale();
    for (;;) {
        wxg_ct_effect_t *eff;
        size_t lines = wxg_ct_read_ledger(&t, &eff, NULL);
        free(eff);
        if (lines >= PHASE_UNIQ + PHASE_UNIQ / 4 || wxg_test_now_ms() >= deadline)
            break;
        wxg_test_sleep_ms(50);
    }
    pid_t killed = t.pids[0];
    assert_true(wxg_ct_signal(&t, 0, SIGKILL, 10000) != -1);
    size_t posted_at_kill = atomic_load(&pb.ok);
    wxg_test_sleep_ms(1000);
    wxg_ct_spawn(&t, 0);
    pthread_join(tb, NULL);
    phase_check(&pb, "phase B");

    /* Duplicates after the restart. */
    phase_init(&pr, list_after, nafter, port);
    post_phase_thread(&pr);
    phase_check(&pr, "duplicates after the restart");
    int64_t t_posted = wxg_test_now_ms();

    size_t posted = na + nlate + nb + nafter;
    size_t accepted = pa.ok + pl.ok + pb.ok + pr.ok;
    size_t http_retries = pa.retried + pl.retried + pb.retried + pr.retried;
    /* Every 200 is a stored record; a 503 whose record was stored late adds one more. */
    int64_t ends[PARTITIONS];
    int64_t stored = end_offsets(t.topic, PARTITIONS, ends);
    assert_true(stored >= (int64_t)accepted && stored <= (int64_t)(accepted + http_retries));
    for (int p = 0; p < PARTITIONS; p++)
        t.produced[p] = ends[p];
    assert_true(wxg_ct_wait_all_committed(&t, 240000, NULL));
    int64_t t_done = wxg_test_now_ms();

    /* Effects. */
    size_t ledger_repeats = check_ledger(&t, UNIQUE, (long)killed);
    int64_t rewritten = check_rows(pg, rows, keys, UNIQUE);
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", charges);
    assert_int_equal(wxg_test_pg_int(pg, sql), UNIQUE);
    snprintf(sql, sizeof sql, "SELECT count(DISTINCT idem_key) FROM %s", charges);
    assert_int_equal(wxg_test_pg_int(pg, sql), UNIQUE);
    snprintf(sql, sizeof sql, "SELECT count(DISTINCT charge_id) FROM %s", charges);
    assert_int_equal(wxg_test_pg_int(pg, sql), UNIQUE);
    snprintf(sql, sizeof sql, "SELECT sum(amount) FROM %s", charges);
    assert_int_equal(wxg_test_pg_int(pg, sql), (int64_t)UNIQUE * PRICE);
    for (int a = 0; a < ACCOUNTS; a++) {
        char acct[32];
        account_name(a, acct, sizeof acct);
        snprintf(sql, sizeof sql, "SELECT balance FROM %s WHERE account = '%s'", balances, acct);
        assert_int_equal(wxg_test_pg_int(pg, sql), -(int64_t)per_account[a] * PRICE);
        snprintf(sql, sizeof sql, "SELECT charges FROM %s WHERE account = '%s'", balances, acct);
        assert_int_equal(wxg_test_pg_int(pg, sql), (int64_t)per_account[a]);
        snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE account = '%s'", charges, acct);
        assert_int_equal(wxg_test_pg_int(pg, sql), (int64_t)per_account[a]);
    }
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", balances);
    assert_int_equal(wxg_test_pg_int(pg, sql), ACCOUNTS);
    size_t replies_total = 0;
    size_t reply_repeats = check_replies(outbound, reply_keys, nwant_replies, &replies_total);
    /* Only messages the killed replica was running can have run twice: at most its workers. */
    assert_true(ledger_repeats <= WORKERS);
    assert_true(reply_repeats <= WORKERS);
    assert_true(rewritten <= WORKERS);

    int64_t dlq_end[1];
    assert_int_equal(end_offsets(t.dlq, 1, dlq_end), 0);

    print_message("%zu callbacks POSTed (%zu duplicates, %.0f%%), %zu accepted, %lld stored, "
                  "%zu HTTP retries; replica SIGKILLed after %zu of phase B's %zu were accepted\n",
                  posted, posted - UNIQUE, 100.0 * (double)(posted - UNIQUE) / (double)posted,
                  accepted, (long long)stored, http_retries, posted_at_kill, nb);
    print_message("%d rows, %d charges, %zu replies (%zu expected keys); re-run after the "
                  "SIGKILL: %zu effects, %zu replies, %lld rows rewritten\n",
                  UNIQUE, UNIQUE, replies_total, nwant_replies, ledger_repeats, reply_repeats,
                  (long long)rewritten);
    print_message("posting took %.1f s, all committed %.1f s later\n",
                  (double)(t_posted - t0) / 1000.0, (double)(t_done - t_posted) / 1000.0);

    for (int i = 0; i < 2; i++) {
        int st = wxg_ct_signal(&t, i, SIGTERM, 60000);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    int st = stop_child(ingest, SIGTERM, 30000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    drop(pg, rows);
    drop(pg, charges);
    drop(pg, balances);
    PQfinish(pg);
    free(rows);
    free(charges);
    free(balances);
    free(outbound);
    for (size_t i = 0; i < UNIQUE; i++)
        free(keys[i]);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(http_to_database_exactly_once_with_duplicates_and_a_sigkilled_replica),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
