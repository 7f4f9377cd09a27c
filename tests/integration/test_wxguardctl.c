/* wxguardctl against the real redis-server and Kafka broker of the "services" fixture: the binary
 * runs as a child process and its exit status, stdout (JSON) and effects are checked. Guard
 * records are created through the guard API with the same prefix and DONE layout the tool derives
 * from its configuration. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "guardtest.h"
#include "testenv.h"
#include "testkafka.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"
#include "wxguard/msg.h"

#define MAX_ARGS 40

typedef struct fixture {
    char prefix[64];
    char prefix_set[96];
    char redis_addr[96];
    char *dir;
    wxg_guard_conf_t conf;
    wxg_guard_t *g;
} fixture;

typedef struct run_result {
    int status;
    char *out;
    char *err;
} run_result;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    gt_conf(&f->conf, wxg_test_redis_host(), wxg_test_redis_port(), "ctl", f->prefix,
            sizeof f->prefix);
    /* The tool's guard settings come from the configuration defaults; the layout stamp is
     * derived only from the DONE retention and sizing defaults, which these match. */
    f->conf.lease_ms = 30000;
    f->g = gt_open(&f->conf);
    snprintf(f->prefix_set, sizeof f->prefix_set, "redis.key.prefix=%s", f->prefix);
    snprintf(f->redis_addr, sizeof f->redis_addr, "%s:%d", wxg_test_redis_host(),
             wxg_test_redis_port());
    f->dir = wxg_test_mkdtemp("wxgctl");
    assert_non_null(f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_guard_destroy(f->g);
    wxg_test_rmtree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static char *slurp(const char *path)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 1 >= cap)
            buf = realloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n - 1, fp);
        if (r == 0)
            break;
        n += r;
    }
    fclose(fp);
    buf[n] = '\0';
    return buf;
}

static void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

/* Runs wxguardctl with argv (NULL-terminated) and `input` on stdin; waits at most 90 s (scaled),
 * then kills it by PID and fails. */
static run_result run_ctl(fixture *f, const char *input, const char *const *args)
{
    const char *bin_dir = getenv("WXG_BINARY_DIR");
    assert_non_null(bin_dir);
    char bin[1024], in[1024], out[1024], err[1024];
    snprintf(bin, sizeof bin, "%s/cmd/wxguardctl/wxguardctl", bin_dir);
    snprintf(in, sizeof in, "%s/stdin", f->dir);
    snprintf(out, sizeof out, "%s/stdout", f->dir);
    snprintf(err, sizeof err, "%s/stderr", f->dir);
    FILE *fp = fopen(in, "wb");
    assert_non_null(fp);
    if (input)
        fputs(input, fp);
    fclose(fp);
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = bin;
    for (int i = 0; args[i]; i++) {
        assert_true(n < MAX_ARGS - 1);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    run_result r;
    r.status = wxg_test_run(argv, in, out, err, 90000);
    if (r.status < 0)
        fail_msg("wxguardctl %s did not finish in time", args[0]);
    r.out = slurp(out);
    r.err = slurp(err);
    if (r.status >= 2)
        print_message("wxguardctl %s exited %d; stderr: %s\n", args[0], r.status, r.err);
    return r;
}

/* argv for a guard subcommand: cmd, the connection options, then extra (NULL-terminated). */
#define CTL(f, ...)                                                                           \
    ((const char *const[]){__VA_ARGS__, "--redis", (f)->redis_addr, "--set", (f)->prefix_set, \
                           "--quiet", NULL})

static cJSON *parse_json(const run_result *r)
{
    cJSON *doc = cJSON_Parse(r->out);
    if (!doc)
        fail_msg("not JSON: %s", r->out);
    return doc;
}

static const char *jstr(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double jnum(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v))
        fail_msg("no number %s", name);
    return v->valuedouble;
}

static void claim_ok(fixture *f, const char *key, wxg_guard_claim_t *c)
{
    assert_int_equal(wxg_guard_claim(f->g, key, strlen(key), NULL, c), 0);
    assert_int_equal(c->outcome, WXG_GUARD_CLAIMED);
}

static void make_failed(fixture *f, const char *key, const char *reason)
{
    wxg_guard_claim_t c;
    claim_ok(f, key, &c);
    assert_int_equal(wxg_guard_fail(f->g, &c.ticket, reason, c.attempt), 0);
    wxg_guard_claim_clear(&c);
}

static void make_done(fixture *f, const char *key)
{
    wxg_guard_claim_t c;
    claim_ok(f, key, &c);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
}

static wxg_guard_state_t state_of(fixture *f, const char *key, uint32_t *attempt)
{
    wxg_guard_record_t *r = NULL;
    assert_int_equal(wxg_guard_inspect(f->g, key, strlen(key), NULL, &r), 0);
    wxg_guard_state_t s = r->state;
    if (attempt)
        *attempt = r->attempt;
    wxg_guard_record_free(r);
    return s;
}

/* ---- inspect ------------------------------------------------------------------------------ */

static void inspect_reports_claimed_failed_and_done_records(void **state)
{
    fixture *f = *state;
    /* PROCESSING with one finished plugin. */
    wxg_guard_claim_t c;
    claim_ok(f, "botA:n:101", &c);
    assert_int_equal(wxg_guard_plugin_done(f->g, &c.ticket, "billing", "charged", 7), 0);
    run_result r = run_ctl(f, NULL, CTL(f, "inspect", "--json", "botA:n:101"));
    assert_int_equal(r.status, 0);
    cJSON *doc = parse_json(&r);
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "messages"), 0);
    assert_string_equal(jstr(m, "state"), "PROCESSING");
    assert_string_equal(jstr(m, "owner"), c.ticket.owner);
    /* A fence is a server time in microseconds: exact in JSON (below 2^53). */
    assert_int_equal((uint64_t)jnum(m, "fence"), c.ticket.fence);
    assert_int_equal((int)jnum(m, "attempt"), 1);
    assert_true(jnum(m, "lease_ms_left") > 0);
    assert_true(jnum(m, "record_ttl_ms") > 0);
    const cJSON *fin = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "finished_plugins"), 0);
    assert_string_equal(jstr(fin, "plugin"), "billing");
    assert_string_equal(jstr(fin, "result"), "charged");
    cJSON_Delete(doc);
    run_free(&r);
    wxg_guard_claim_clear(&c);

    /* FAILED with its reason, in words. */
    make_failed(f, "botA:n:102", "billing: card declined");
    r = run_ctl(f, NULL, CTL(f, "inspect", "botA:n:102"));
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "state:        FAILED"));
    assert_non_null(strstr(r.out, "billing: card declined"));
    run_free(&r);
    r = run_ctl(f, NULL, CTL(f, "inspect", "--json", "botA:n:102"));
    doc = parse_json(&r);
    m = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "messages"), 0);
    assert_string_equal(jstr(m, "state"), "FAILED");
    assert_string_equal(jstr(m, "reason"), "billing: card declined");
    assert_int_equal((int)jnum(m, "fail_attempts"), 1);
    cJSON_Delete(doc);
    run_free(&r);

    /* DONE: a compact marker in a time bucket. */
    make_done(f, "botA:n:103");
    r = run_ctl(f, NULL, CTL(f, "inspect", "botA:n:103"));
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "state:        DONE"));
    assert_non_null(strstr(r.out, "compact DONE marker"));
    assert_non_null(strstr(r.out, "time bucket:"));
    run_free(&r);
    r = run_ctl(f, NULL, CTL(f, "inspect", "--json", "botA:n:103"));
    doc = parse_json(&r);
    m = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "messages"), 0);
    assert_string_equal(jstr(m, "state"), "DONE");
    const cJSON *d = cJSON_GetObjectItem(m, "done");
    assert_string_equal(jstr(d, "marker"), "compact");
    assert_true(jnum(d, "time_bucket") >= 0);
    assert_true(jnum(d, "ttl_ms") > 0);
    double now_ms = (double)time(NULL) * 1000.0;
    assert_true(jnum(d, "bucket_start_ms") <= now_ms + 1000);
    assert_true(jnum(d, "bucket_end_ms") >= now_ms - 1000);
    cJSON_Delete(doc);
    run_free(&r);

    /* Absent: exit 1. A malformed key: exit 2. */
    r = run_ctl(f, NULL, CTL(f, "inspect", "botA:n:999"));
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.out, "ABSENT"));
    run_free(&r);
    r = run_ctl(f, NULL, CTL(f, "inspect", "not a key"));
    assert_int_equal(r.status, 2);
    run_free(&r);
    r = run_ctl(f, NULL, (const char *const[]){"inspect", "--help", NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "usage: wxguardctl inspect"));
    run_free(&r);
}

static void inspect_message_file_decodes_and_inspects_its_key(void **state)
{
    fixture *f = *state;
    const char *rec = "{\"account\":\"botM\",\"msg_id\":\"7301234567890123457\","
                      "\"conversation\":\"g1\",\"sender\":\"u1\",\"type\":\"text\","
                      "\"content\":\"hello\",\"create_time\":1700000000}";
    wxg_batch_t *b = NULL;
    char err[256];
    assert_int_equal(wxg_decode(rec, strlen(rec), NULL, &b, err, sizeof err), 0);
    const wxg_msg_view_t *mv = wxg_batch_msg(b, 0);
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(f->g, mv->key, strlen(mv->key), mv->payload_hash, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/msg.json", f->dir);
    FILE *fp = fopen(path, "wb");
    fputs(rec, fp);
    fclose(fp);
    run_result r = run_ctl(f, NULL, CTL(f, "inspect", "--json", "--message", path));
    assert_int_equal(r.status, 0);
    cJSON *doc = parse_json(&r);
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "messages"), 0);
    assert_string_equal(jstr(m, "key"), mv->key);
    assert_string_equal(jstr(m, "state"), "DONE");
    assert_true(
        cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "done"), "payload_matches")));
    cJSON_Delete(doc);
    run_free(&r);
    wxg_batch_free(b);
}

/* ---- failed ------------------------------------------------------------------------------- */

static void failed_lists_reasons_by_account_with_limit(void **state)
{
    fixture *f = *state;
    make_failed(f, "acctA:n:201", "reason A1");
    make_failed(f, "acctA:n:202", "reason A2");
    make_failed(f, "acctB:n:203", "reason B1");
    wxg_guard_claim_t c;
    claim_ok(f, "acctA:n:204", &c); /* PROCESSING: never listed */

    run_result r = run_ctl(f, NULL, CTL(f, "failed", "--json", "--account", "acctA"));
    assert_int_equal(r.status, 0);
    cJSON *doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "listed"), 2);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(doc, "complete")));
    int seen1 = 0, seen2 = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(doc, "failed"))
    {
        if (strcmp(jstr(it, "key"), "acctA:n:201") == 0)
            seen1 = strcmp(jstr(it, "reason"), "reason A1") == 0;
        if (strcmp(jstr(it, "key"), "acctA:n:202") == 0)
            seen2 = strcmp(jstr(it, "reason"), "reason A2") == 0;
        assert_string_equal(jstr(it, "state"), "FAILED");
    }
    assert_true(seen1 && seen2);
    cJSON_Delete(doc);
    run_free(&r);

    r = run_ctl(f, NULL, CTL(f, "failed", "--json", "--count", "1"));
    assert_int_equal(r.status, 0);
    doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "listed"), 3);
    cJSON_Delete(doc);
    run_free(&r);

    r = run_ctl(f, NULL, CTL(f, "failed", "--json", "--limit", "1"));
    assert_int_equal(r.status, 0);
    doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "listed"), 1);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(doc, "complete")));
    cJSON_Delete(doc);
    run_free(&r);

    /* Text output names key and reason; no match is exit 1. */
    r = run_ctl(f, NULL, CTL(f, "failed", "--account", "acctB"));
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "acctB:n:203"));
    assert_non_null(strstr(r.out, "reason B1"));
    assert_null(strstr(r.out, "acctA"));
    run_free(&r);
    r = run_ctl(f, NULL, CTL(f, "failed", "--account", "acctC"));
    assert_int_equal(r.status, 1);
    run_free(&r);
    r = run_ctl(f, NULL, CTL(f, "failed", "--limit", "0"));
    assert_int_equal(r.status, 2);
    run_free(&r);
    wxg_guard_claim_clear(&c);
}

/* ---- release ------------------------------------------------------------------------------ */

static void release_clears_a_processing_claim_after_yes_and_refuses_done(void **state)
{
    fixture *f = *state;
    const char *key = "botR:n:301";
    wxg_guard_claim_t c;
    claim_ok(f, key, &c);

    /* "n" at the prompt: exit 4, nothing changes. */
    run_result r = run_ctl(f, "n\n", CTL(f, "release", key));
    assert_int_equal(r.status, 4);
    assert_non_null(strstr(r.err, "[y/N]"));
    assert_int_equal(state_of(f, key, NULL), WXG_GUARD_PROCESSING);
    run_free(&r);
    /* No answer at all (EOF) is a no too. */
    r = run_ctl(f, "", CTL(f, "release", key));
    assert_int_equal(r.status, 4);
    run_free(&r);

    r = run_ctl(f, "y\n", CTL(f, "release", key));
    assert_int_equal(r.status, 0);
    assert_int_equal(state_of(f, key, NULL), WXG_GUARD_FAILED);
    run_free(&r);

    /* A new claim succeeds with a higher fence; the old owner is refused. */
    wxg_guard_claim_t c2;
    claim_ok(f, key, &c2);
    assert_true(c2.ticket.fence > c.ticket.fence);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), WXG_ELEASELOST);
    assert_int_equal(wxg_guard_complete(f->g, &c2.ticket, NULL), 0);

    /* DONE: refused even with --yes, and still DONE. */
    r = run_ctl(f, NULL, CTL(f, "release", "--yes", "--json", key));
    assert_int_equal(r.status, 1);
    cJSON *doc = parse_json(&r);
    assert_string_equal(jstr(doc, "outcome"), "refused_done");
    cJSON_Delete(doc);
    assert_int_equal(state_of(f, key, NULL), WXG_GUARD_DONE);
    run_free(&r);

    /* Absent: nothing to release. */
    r = run_ctl(f, NULL, CTL(f, "release", "--yes", "botR:n:399"));
    assert_int_equal(r.status, 1);
    run_free(&r);
    wxg_guard_claim_clear(&c);
    wxg_guard_claim_clear(&c2);
}

/* ---- purge -------------------------------------------------------------------------------- */

static void purge_removes_one_account_and_keeps_the_other_and_live_claims(void **state)
{
    fixture *f = *state;
    make_failed(f, "gone:n:401", "x");
    make_failed(f, "gone:n:402", "y");
    make_done(f, "gone:n:403");
    wxg_guard_claim_t live;
    claim_ok(f, "gone:n:404", &live);
    /* A live claim with a record (a renewal gives it one): purge lists it and keeps it. A claim
     * simply in flight is a field of its DONE bucket, which purge does not list. */
    assert_int_equal(wxg_guard_renew(f->g, &live.ticket), 0);
    make_failed(f, "keep:n:405", "z");

    run_result r = run_ctl(f, "no\n", CTL(f, "purge", "--account", "gone"));
    assert_int_equal(r.status, 4);
    assert_int_equal(state_of(f, "gone:n:401", NULL), WXG_GUARD_FAILED);
    run_free(&r);

    r = run_ctl(f, NULL, CTL(f, "purge", "--account", "gone", "--dry-run", "--json"));
    assert_int_equal(r.status, 1); /* a live claim is kept */
    cJSON *doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "matched"), 2);
    assert_int_equal((int)jnum(doc, "purged"), 0);
    cJSON_Delete(doc);
    assert_int_equal(state_of(f, "gone:n:401", NULL), WXG_GUARD_FAILED);
    run_free(&r);

    r = run_ctl(f, "y\n", CTL(f, "purge", "--account", "gone", "--json"));
    assert_int_equal(r.status, 1);
    doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "purged"), 2);
    assert_int_equal((int)jnum(doc, "kept_live"), 1);
    cJSON_Delete(doc);
    run_free(&r);
    assert_int_equal(state_of(f, "gone:n:401", NULL), WXG_GUARD_ABSENT);
    assert_int_equal(state_of(f, "gone:n:402", NULL), WXG_GUARD_ABSENT);
    /* DONE markers live in shared buckets: untouched. The live claim stays. */
    assert_int_equal(state_of(f, "gone:n:403", NULL), WXG_GUARD_DONE);
    assert_int_equal(state_of(f, "gone:n:404", NULL), WXG_GUARD_PROCESSING);
    assert_int_equal(state_of(f, "keep:n:405", NULL), WXG_GUARD_FAILED);

    r = run_ctl(f, NULL, CTL(f, "purge", "--account", "keep", "--yes"));
    assert_int_equal(r.status, 0);
    assert_int_equal(state_of(f, "keep:n:405", NULL), WXG_GUARD_ABSENT);
    run_free(&r);
    r = run_ctl(f, NULL, CTL(f, "purge", "--account", "nobody", "--yes"));
    assert_int_equal(r.status, 1);
    run_free(&r);
    r = run_ctl(f, NULL, CTL(f, "purge"));
    assert_int_equal(r.status, 2);
    run_free(&r);
    wxg_guard_claim_clear(&live);
}

/* The help describes what a purge does to fences as the guard does it (test_guard_admin.c
 * checks that the next claim's fence is higher): it used to say the counter restarts at 1. */
static void purge_help_says_the_fence_rises_after_a_purge(void **state)
{
    fixture *f = *state;
    run_result r = run_ctl(f, NULL, (const char *const[]){"purge", "--help", NULL});
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "usage: wxguardctl purge"));
    assert_null(strstr(r.out, "restarted at 1"));
    assert_non_null(strstr(r.out, "its fence still rises above every fence"));
    run_free(&r);
}

/* ---- redrive ------------------------------------------------------------------------------ */

/* Writes one dead-letter record as the consumer does. */
static void park(wxg_dlq_t *dlq, const char *topic, int64_t offset, const char *key,
                 const void *value, size_t value_len, const char *ikey)
{
    wxg_kafka_header_t h = {.name = "trace", .value = "t-1", .value_len = 3};
    wxg_dlq_record_t d = {
        .topic = topic,
        .partition = 0,
        .offset = offset,
        .key = key,
        .key_len = strlen(key),
        .value = value,
        .value_len = value_len,
        .headers = &h,
        .header_count = 1,
        .timestamp_ms = -1,
        .error = WXG_EPLUGIN,
        .reason = "plugin said no",
        .attempts = 5,
        .idempotency_key = ikey,
        .plugin = "billing",
    };
    char err[256];
    wxg_delivery_t dr;
    if (wxg_dlq_write(dlq, &d, &dr, err, sizeof err) != 0)
        fail_msg("dlq write: %s", err);
}

/* The headers of the only record of partition 0 of `topic` at `offset`, as "name=value;..." */
static char *headers_at(const char *topic, int64_t offset)
{
    rd_kafka_conf_t *kc = wxg_test_kafka_conf();
    wxg_test_kafka_conf_set(kc, "group.id", "wxgctl-test-reader");
    wxg_test_kafka_conf_set(kc, "enable.auto.commit", "false");
    char err[256];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof err);
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, 0)->offset = offset;
    assert_int_equal(rd_kafka_assign(rk, l), 0);
    rd_kafka_topic_partition_list_destroy(l);
    char *out = calloc(1, 4096);
    int64_t deadline = wxg_test_now_ms() + 30000LL * wxg_test_scale();
    while (wxg_test_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m)
            continue;
        if (!m->err) {
            rd_kafka_headers_t *h = NULL;
            if (rd_kafka_message_headers(m, &h) == 0) {
                const char *name;
                const void *v;
                size_t sz;
                for (size_t i = 0; rd_kafka_header_get_all(h, i, &name, &v, &sz) == 0; i++) {
                    size_t len = strlen(out);
                    snprintf(out + len, 4096 - len, "%s=%.*s;", name, (int)sz,
                             v ? (const char *)v : "");
                }
            }
            rd_kafka_message_destroy(m);
            break;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return out;
}

static const cJSON *find_record(const cJSON *doc, const char *key)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(doc, "records"))
    {
        const char *k = jstr(it, "key");
        if (k && strcmp(k, key) == 0)
            return it;
    }
    fail_msg("no record for %s", key);
    return NULL;
}

static void redrive_reproduces_original_bytes_and_the_guard_runs_it_once(void **state)
{
    fixture *f = *state;
    char *main_topic = wxg_test_kafka_name("ctl-main");
    char *dlq_topic = wxg_test_kafka_name("ctl-dlq");
    wxg_test_kafka_create_topic(main_topic, 1);
    wxg_test_kafka_create_topic(dlq_topic, 1);

    /* Three parked messages: two FAILED (accounts A and B) and one that was finished since. */
    make_failed(f, "rdA:n:501", "plugin said no");
    make_failed(f, "rdB:n:502", "plugin said no");
    make_done(f, "rdA:n:503");
    static const unsigned char value_a[] = {'{', '"', 'a', '"', ':', '1', '}', 0x00, 0xff, '\n'};
    wxg_kafka_prop_t props[] = {{"bootstrap.servers", wxg_test_kafka_bootstrap()},
                                {"broker.address.family", "v4"}};
    char err[256];
    wxg_producer_t *p = wxg_producer_new(props, 2, err, sizeof err);
    assert_non_null(p);
    wxg_dlq_t *dlq = wxg_dlq_new(p, dlq_topic, "wxguard", err, sizeof err);
    assert_non_null(dlq);
    park(dlq, main_topic, 10, "rdA:conv", value_a, sizeof value_a, "rdA:n:501");
    park(dlq, main_topic, 11, "rdB:conv", "value-b", 7, "rdB:n:502");
    park(dlq, main_topic, 12, "rdA:conv", "value-c", 7, "rdA:n:503");
    wxg_dlq_destroy(dlq);
    wxg_producer_destroy(p, 5000);

    char dlq_set[300], brokers[300];
    snprintf(dlq_set, sizeof dlq_set, "dlq.topic=%s", dlq_topic);
    snprintf(brokers, sizeof brokers, "%s", wxg_test_kafka_bootstrap());
#define RD(...)                                                                                 \
    CTL(f, "redrive", "--brokers", brokers, "--set", "kafka.broker.address.family=v4", "--set", \
        dlq_set, __VA_ARGS__)

    /* Dry run: lists, changes nothing. */
    uint32_t attempt = 0;
    run_result r = run_ctl(f, NULL, RD("--all", "--dry-run", "--json"));
    assert_int_equal(r.status, 0);
    cJSON *doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "matched"), 3);
    assert_int_equal((int)jnum(doc, "redriven"), 2);
    assert_int_equal((int)jnum(doc, "skipped"), 1);
    assert_string_equal(jstr(find_record(doc, "rdA:n:501"), "action"), "would_redrive");
    assert_string_equal(jstr(find_record(doc, "rdA:n:501"), "target_topic"), main_topic);
    assert_string_equal(jstr(find_record(doc, "rdA:n:503"), "action"), "skipped_done");
    cJSON_Delete(doc);
    run_free(&r);
    wxg_test_kafka_msg_t *msgs = NULL;
    assert_int_equal(wxg_test_kafka_read(main_topic, 1, 2000, &msgs), 0);
    wxg_test_kafka_msgs_free(msgs, 0);
    assert_int_equal(state_of(f, "rdA:n:501", &attempt), WXG_GUARD_FAILED);
    assert_int_equal(attempt, 1);

    /* By account: only A's FAILED message is re-produced, with the original bytes. */
    r = run_ctl(f, NULL, RD("--account", "rdA", "--json"));
    assert_int_equal(r.status, 0);
    doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "matched"), 2);
    assert_int_equal((int)jnum(doc, "redriven"), 1);
    assert_string_equal(jstr(find_record(doc, "rdA:n:501"), "action"), "redriven");
    cJSON_Delete(doc);
    run_free(&r);
    size_t n = wxg_test_kafka_read(main_topic, 1, 30000, &msgs);
    assert_int_equal(n, 1);
    assert_int_equal(msgs[0].value_len, sizeof value_a);
    assert_memory_equal(msgs[0].value, value_a, sizeof value_a);
    assert_string_equal(msgs[0].key, "rdA:conv");
    int64_t off = msgs[0].offset;
    wxg_test_kafka_msgs_free(msgs, n);
    char *hdrs = headers_at(main_topic, off);
    assert_non_null(strstr(hdrs, "trace=t-1;"));
    assert_non_null(strstr(hdrs, "wxg-redrive-source="));
    assert_null(strstr(hdrs, "wxg-dlq-"));
    free(hdrs);

    /* The guard lets it run once: re-armed (attempt 1 again, higher fence), then a duplicate. */
    assert_int_equal(state_of(f, "rdA:n:501", &attempt), WXG_GUARD_FAILED);
    assert_int_equal(attempt, 0);
    assert_int_equal(state_of(f, "rdB:n:502", &attempt), WXG_GUARD_FAILED);
    assert_int_equal(attempt, 1);
    wxg_guard_claim_t c;
    claim_ok(f, "rdA:n:501", &c);
    assert_int_equal(c.attempt, 1);
    gt_assert_fence_is_now(c.ticket.fence);
    assert_int_equal(wxg_guard_complete(f->g, &c.ticket, NULL), 0);
    wxg_guard_claim_clear(&c);
    assert_int_equal(wxg_guard_claim(f->g, "rdA:n:501", 9, NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_DUPLICATE);
    wxg_guard_claim_clear(&c);

    /* Redriving A again: everything is DONE now, nothing is produced. */
    r = run_ctl(f, NULL, RD("--account", "rdA", "--json"));
    assert_int_equal(r.status, 0);
    doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "redriven"), 0);
    assert_string_equal(jstr(find_record(doc, "rdA:n:501"), "action"), "skipped_done");
    cJSON_Delete(doc);
    run_free(&r);

    /* By offset range on the DLQ partition: B's record (offset 1). */
    r = run_ctl(f, NULL,
                RD("--partition", "0", "--from-offset", "1", "--to-offset", "1", "--json"));
    assert_int_equal(r.status, 0);
    doc = parse_json(&r);
    assert_int_equal((int)jnum(doc, "matched"), 1);
    assert_string_equal(jstr(find_record(doc, "rdB:n:502"), "action"), "redriven");
    cJSON_Delete(doc);
    run_free(&r);
    n = wxg_test_kafka_read(main_topic, 2, 30000, &msgs);
    assert_int_equal(n, 2);
    assert_string_equal(msgs[1].value, "value-b");
    wxg_test_kafka_msgs_free(msgs, n);

    /* By key that is not in the DLQ: exit 1. Usage errors: exit 2. */
    r = run_ctl(f, NULL, RD("--key", "rdZ:n:1"));
    assert_int_equal(r.status, 1);
    run_free(&r);
    r = run_ctl(f, NULL, RD("--dry-run"));
    assert_int_equal(r.status, 2);
    run_free(&r);
    r = run_ctl(f, NULL, RD("--from-offset", "3"));
    assert_int_equal(r.status, 2);
    run_free(&r);
#undef RD
    free(main_topic);
    free(dlq_topic);
}

static void unreachable_redis_is_exit_3(void **state)
{
    fixture *f = *state;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", wxg_test_free_port());
    run_result r = run_ctl(f, NULL,
                           (const char *const[]){"inspect", "--redis", addr, "--set",
                                                 "redis.connect.timeout.ms=500ms", "x:n:1", NULL});
    assert_int_equal(r.status, 3);
    assert_non_null(strstr(r.err, "ECONN"));
    run_free(&r);
    r = run_ctl(f, NULL, (const char *const[]){"frobnicate", NULL});
    assert_int_equal(r.status, 2);
    run_free(&r);
}

/* wxguardctl honours the redis.tls.* keys: it inspects a message on a TLS-only server, and a
 * CA that did not sign the server's certificate is a connection error (exit 3) naming it. */
static void inspect_over_tls_and_a_certificate_error_is_named(void **state)
{
    fixture *f = *state;
    char *pki = wxg_test_pki_make();
    assert_non_null(pki);
    wxg_test_redis_t srv;
    assert_int_equal(wxg_test_redis_start_tls(&srv, pki, "server", 0), 0);
    char ca[600], other[600], ca_set[700], other_set[700], addr[64];
    snprintf(ca, sizeof ca, "%s/ca.crt", pki);
    snprintf(other, sizeof other, "%s/other-ca.crt", pki);
    snprintf(ca_set, sizeof ca_set, "redis.tls.ca.file=%s", ca);
    snprintf(other_set, sizeof other_set, "redis.tls.ca.file=%s", other);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", srv.port);
    wxg_guard_conf_t c = f->conf;
    c.port = srv.port;
    c.tls = 1;
    c.tls_ca_file = ca;
    wxg_guard_t *g = gt_open(&c);
    wxg_guard_claim_t cl;
    assert_int_equal(wxg_guard_claim(g, "botT:n:1", 8, NULL, &cl), 0);
    assert_int_equal(wxg_guard_complete(g, &cl.ticket, NULL), 0);
    wxg_guard_claim_clear(&cl);
    wxg_guard_destroy(g);

    run_result r = run_ctl(f, NULL,
                           (const char *const[]){"inspect", "--json", "--redis", addr, "--set",
                                                 f->prefix_set, "--set", "redis.tls=true", "--set",
                                                 ca_set, "--quiet", "botT:n:1", NULL});
    assert_int_equal(r.status, 0);
    cJSON *doc = parse_json(&r);
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "messages"), 0);
    assert_string_equal(jstr(m, "state"), "DONE");
    cJSON_Delete(doc);
    run_free(&r);

    r = run_ctl(f, NULL,
                (const char *const[]){"inspect", "--redis", addr, "--set", f->prefix_set, "--set",
                                      "redis.tls=true", "--set", other_set, "botT:n:1", NULL});
    assert_int_equal(r.status, 3);
    assert_non_null(strstr(r.err, "not signed by a trusted CA"));
    run_free(&r);
    wxg_test_redis_stop(&srv);
    wxg_test_rmtree(pki);
    free(pki);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(inspect_reports_claimed_failed_and_done_records, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(inspect_message_file_decodes_and_inspects_its_key, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(failed_lists_reasons_by_account_with_limit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            release_clears_a_processing_claim_after_yes_and_refuses_done, setup, teardown),
        cmocka_unit_test_setup_teardown(
            purge_removes_one_account_and_keeps_the_other_and_live_claims, setup, teardown),
        cmocka_unit_test_setup_teardown(purge_help_says_the_fence_rises_after_a_purge, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            redrive_reproduces_original_bytes_and_the_guard_runs_it_once, setup, teardown),
        cmocka_unit_test_setup_teardown(unreachable_redis_is_exit_3, setup, teardown),
        cmocka_unit_test_setup_teardown(inspect_over_tls_and_a_certificate_error_is_named, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
