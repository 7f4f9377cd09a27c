/* Unit tests for lib/pipeline.c through the in-memory guard (tests/support/fakeguard.h) and a
 * dead-letter sink that records what it is given, so that every path of a message can be
 * driven without Redis or Kafka:
 *   - DUPLICATE: finished, no plugin runs;
 *   - BUSY: re-queued after the owner's lease, never finished while the owner holds it;
 *   - a lease lost at plugin_done or at complete: re-queued for a fresh claim, counted;
 *   - RETRY then FAIL after another plugin finished: the finished plugin's sub-marker is kept and
 *     it is not run again, the dead letter carries the attempts, then the FAILED mark;
 *   - retries exhausting retry_max: a dead letter;
 *   - Redis unreachable (WXG_ECONN): the whole batch re-queued with a backoff, nothing finished;
 *   - a fatal error (WXG_ECONFIG, WXG_EAUTH): returned to the caller, nothing finished;
 *   - a dead letter that cannot be written waits and is written later; a fatal error from the
 *     sink is returned to the caller, and the record waits without its FAILED mark;
 *   - sub-markers that cannot be written leave it to complete, which finishes the message;
 *   - a lease the watchdog found lost while a dead letter waited: the old owner writes none;
 *   - a record that did not decode is parked only for a poison code, never for want of memory;
 *   - the crash window: a slow plugin's sub-marker (or, for the last plugin, its DONE) goes
 *     out as soon as the plugin returns, before it runs for the next message; a fast plugin's
 *     markers still travel in one call per batch; with Redis away, a stage makes two marker
 *     calls, not one per message.
 * Plugins are the built-in noop and fail. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakeguard.h"
#include "guard_int.h"
#include "pipeline_int.h"
#include "pool_int.h"
#include "wxguard/err.h"
#include "wxguard/log.h"

#define MAXN  8
#define TOPIC "orders"

/* What the sink was given, copied (the record's pointers live only for the call). */
typedef struct letter {
    char topic[32];
    int32_t partition;
    int64_t offset;
    int error;
    uint32_t attempts;
    char plugin[32];
    char key[96];
    char value[64];
    size_t header_count;
    char header0[32];
} letter;

typedef struct fixture {
    fakeguard_t *f;
    wxg_guard_conf_t gconf;
    wxg_guard_watchdog_t *wd;
    wxg_plugin_chain_t *chain;
    wxg_metrics_t *reg;
    wxg__pl_metrics_t m;
    wxg__pl_health_t health;
    wxg__pipeline_conf_t conf;
    wxg__pl_worker_t *w;
    /* The sink. */
    int sink_fail_rc, sink_fail_count;
    size_t nletters;
    letter letters[MAXN];
    /* The finished callback. */
    size_t nfinished;
    /* The messages. */
    size_t n;
    char keys[MAXN][96];
    char values[MAXN][64];
    wxg_msg_view_t views[MAXN];
    wxg__pl_record_t recs[MAXN];
    wxg__pl_item_t items[MAXN];
    int64_t out[MAXN];
} fixture;

static size_t one_header(const wxg__pl_record_t *rec, wxg_kafka_header_t *out, size_t cap)
{
    (void)rec;
    if (cap >= 1)
        out[0] = (wxg_kafka_header_t){.name = "x-request-id", .value = "r-1", .value_len = 3};
    return 1;
}

static int sink(void *arg, const wxg_dlq_record_t *dr, char *errstr, size_t errstr_size)
{
    fixture *x = arg;
    if (x->sink_fail_count > 0) {
        x->sink_fail_count--;
        snprintf(errstr, errstr_size, "broker unreachable");
        return x->sink_fail_rc;
    }
    assert_true(x->nletters < MAXN);
    letter *l = &x->letters[x->nletters++];
    snprintf(l->topic, sizeof l->topic, "%s", dr->topic);
    l->partition = dr->partition;
    l->offset = dr->offset;
    l->error = dr->error;
    l->attempts = dr->attempts;
    snprintf(l->plugin, sizeof l->plugin, "%s", dr->plugin ? dr->plugin : "");
    snprintf(l->key, sizeof l->key, "%s", dr->idempotency_key ? dr->idempotency_key : "");
    snprintf(l->value, sizeof l->value, "%.*s", (int)dr->value_len, (const char *)dr->value);
    l->header_count = dr->header_count;
    if (dr->header_count > 0)
        snprintf(l->header0, sizeof l->header0, "%s", dr->headers[0].name);
    return 0;
}

static void finished(void *arg, wxg__pl_item_t *it)
{
    fixture *x = arg;
    assert_true(atomic_load(&it->done));
    x->nfinished++;
}

static wxg_metric_t *counter(fixture *x, const char *name, const char *label, const char *value)
{
    wxg_metric_t *m = wxg_metrics_counter(x->reg, name, "test", label, value, NULL);
    assert_non_null(m);
    return m;
}

static void register_metrics(fixture *x, size_t nplugins)
{
    static const char *const outcomes[] = {"claimed", "duplicate", "busy"};
    static const char *const ops[] = {"claim", "complete", "fail", "plugin_done"};
    static const char *const results[] = {"ok", "retry", "fail"};
    x->reg = wxg_metrics_new();
    assert_non_null(x->reg);
    for (int i = 0; i < WXG__PL_CLAIM_N; i++)
        x->m.claims[i] = counter(x, "claims", "outcome", outcomes[i]);
    for (int i = 0; i < WXG__PL_OP_N; i++)
        x->m.guard_errors[i] = counter(x, "guard_errors", "op", ops[i]);
    x->m.mismatches = counter(x, "mismatches", "k", "v");
    x->m.cache_hits = counter(x, "cache_hits", "k", "v");
    x->m.processed = counter(x, "processed", "k", "v");
    x->m.retries = counter(x, "retries", "k", "v");
    x->m.dlq_writes = counter(x, "dlq_writes", "k", "v");
    x->m.dlq_errors = counter(x, "dlq_errors", "k", "v");
    x->m.lease_lost = counter(x, "lease_lost", "k", "v");
    x->m.unreadable = counter(x, "unreadable", "k", "v");
    x->m.claim_seconds = wxg_metrics_histogram(x->reg, "claim_seconds", "test", NULL, 0, NULL);
    x->m.plugin_results = calloc(nplugins * WXG__PL_RESULT_N, sizeof *x->m.plugin_results);
    x->m.plugin_seconds = calloc(nplugins, sizeof *x->m.plugin_seconds);
    assert_non_null(x->m.plugin_results);
    assert_non_null(x->m.plugin_seconds);
    for (size_t s = 0; s < nplugins; s++) {
        const char *name = wxg_plugin_chain_name(x->chain, s);
        for (int r = 0; r < WXG__PL_RESULT_N; r++) {
            x->m.plugin_results[s * WXG__PL_RESULT_N + (size_t)r] = wxg_metrics_counter(
                x->reg, "plugin_results", "test", "plugin", name, "result", results[r], NULL);
            assert_non_null(x->m.plugin_results[s * WXG__PL_RESULT_N + (size_t)r]);
        }
        x->m.plugin_seconds[s] =
            wxg_metrics_histogram(x->reg, "plugin_seconds", "test", NULL, 0, "plugin", name, NULL);
        assert_non_null(x->m.plugin_seconds[s]);
    }
}

static wxg_plugin_chain_t *make_chain(const char *spec, const wxg_plugin_kv_t *kv, size_t n)
{
    wxg_plugin_chain_t *chain = NULL;
    char err[512] = "";
    int rc = wxg_plugin_chain_new(spec, kv, n, &chain, err, sizeof err);
    if (rc != 0)
        fail_msg("chain '%s' refused: %s", spec, err);
    return chain;
}

/* A worker over a fresh fake guard handle, with the chain's plugin thread state. */
static wxg__pl_worker_t *make_worker(fixture *x, wxg__pipeline_conf_t *conf, unsigned index)
{
    char err[256] = "";
    wxg_plugin_thread_t *pt = NULL;
    assert_int_equal(wxg_plugin_thread_new(conf->chain, &pt, err, sizeof err), 0);
    wxg_guard_t *g = fakeguard_handle(x->f, &x->gconf);
    assert_non_null(g);
    wxg__pl_worker_t *w = wxg__pipeline_worker_new(conf, index, g, pt, err, sizeof err);
    assert_non_null(w);
    return w;
}

/* Sets up the fake guard, the watchdog over it, the chain and one worker; retry_max 3 and
 * short backoffs, so that the delays returned can be checked. */
static fixture *setup_lease(const char *spec, const wxg_plugin_kv_t *kv, size_t nkv,
                            int64_t lease_ms)
{
    fixture *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->f = fakeguard_new();
    assert_non_null(x->f);
    wxg_guard_conf_init(&x->gconf);
    x->gconf.lease_ms = lease_ms;
    char err[256] = "";
    x->wd = wxg__guard_watchdog_new_on(fakeguard_handle(x->f, &x->gconf), 0, 0, err, sizeof err);
    assert_non_null(x->wd);
    x->chain = make_chain(spec, kv, nkv);
    register_metrics(x, wxg_plugin_chain_count(x->chain));
    assert_int_equal(wxg__pipeline_health_init(&x->health), 0);
    x->conf = (wxg__pipeline_conf_t){.chain = x->chain,
                                     .wd = x->wd,
                                     .batch_max = MAXN,
                                     .retry_max = 3,
                                     .backoff_initial_ms = 100,
                                     .backoff_max_ms = 1000,
                                     .metrics = &x->m,
                                     .health = &x->health,
                                     .dead_letter = sink,
                                     .dead_letter_arg = x,
                                     .finished = finished,
                                     .finished_arg = x};
    x->w = make_worker(x, &x->conf, 0);
    return x;
}

static fixture *setup(const char *spec, const wxg_plugin_kv_t *kv, size_t nkv)
{
    return setup_lease(spec, kv, nkv, 10000);
}

static void teardown(fixture *x)
{
    for (size_t i = 0; i < x->n; i++) {
        /* What is still in flight leaves as a revoke would take it. */
        if (!atomic_load(&x->items[i].done))
            wxg__pipeline_item_drop(&x->conf, &x->items[i]);
        wxg__pipeline_item_clear(&x->items[i]);
    }
    wxg__pipeline_worker_destroy(x->w);
    wxg_guard_watchdog_destroy(x->wd);
    wxg_plugin_chain_destroy(x->chain);
    free(x->m.plugin_results);
    free(x->m.plugin_seconds);
    wxg_metrics_free(x->reg);
    wxg__pipeline_health_destroy(&x->health);
    fakeguard_destroy(x->f);
    free(x);
}

/* Adds message i with id `id`, offset 100 + i of TOPIC partition 2, and returns its key. */
static const char *add_message(fixture *x, unsigned id)
{
    size_t i = x->n++;
    assert_true(i < MAXN);
    snprintf(x->keys[i], sizeof x->keys[i], "wxid_bot:n:%u", id);
    snprintf(x->values[i], sizeof x->values[i], "{\"msg_id\":%u}", id);
    x->views[i] = (wxg_msg_view_t){.format = WXG_FORMAT_GENERIC,
                                   .account = "wxid_bot",
                                   .conversation = "conv",
                                   .sender = "",
                                   .type = "text",
                                   .content = "hello",
                                   .content_len = 5,
                                   .key = x->keys[i],
                                   .to = "",
                                   .key_reason = "test",
                                   .raw = x->values[i],
                                   .raw_len = strlen(x->values[i])};
    x->recs[i] = (wxg__pl_record_t){.topic = TOPIC,
                                    .partition = 2,
                                    .offset = 100 + (int64_t)i,
                                    .timestamp_ms = 1700000000000,
                                    .value = x->values[i],
                                    .value_len = strlen(x->values[i]),
                                    .headers = one_header};
    wxg__pipeline_item_init(&x->items[i], &x->recs[i], &x->views[i]);
    return x->keys[i];
}

/* Runs the items not finished yet through `w` as one batch; returns the run's result and leaves
 * each item's delay (or WXG__POOL_FINISHED) in x->out. */
static int run_on(fixture *x, wxg__pl_worker_t *w)
{
    void *batch[MAXN];
    size_t idx[MAXN], n = 0;
    for (size_t i = 0; i < x->n; i++) {
        if (!atomic_load(&x->items[i].done)) {
            idx[n] = i;
            batch[n++] = &x->items[i];
        }
    }
    assert_true(n > 0);
    int64_t out[MAXN];
    int rc = wxg__pipeline_run(w, batch, n, out);
    for (size_t k = 0; k < n; k++)
        x->out[idx[k]] = out[k];
    return rc;
}

static int run(fixture *x)
{
    return run_on(x, x->w);
}

static uint64_t value(const wxg_metric_t *m)
{
    return wxg_counter_value(m);
}

static uint64_t plugin_runs(fixture *x, size_t plugin, int result)
{
    return value(x->m.plugin_results[plugin * WXG__PL_RESULT_N + (size_t)result]);
}

/* The fail plugin set to `action` (fail or retry), and for retry never OK. */
#define FAIL_KV(action)                                                   \
    {                                                                     \
        {"plugin.fail.action", action}, {"plugin.fail.retry.times", "0"}, \
        {                                                                 \
            "plugin.fail.reason", "downstream refused"                    \
        }                                                                 \
    }

static void a_duplicate_is_finished_and_runs_no_plugin(void **state)
{
    (void)state;
    fixture *x = setup("noop", NULL, 0);
    const char *key = add_message(x, 1);
    fakeguard_set_done(x->f, key);
    assert_int_equal(run(x), 0);
    assert_int_equal(x->out[0], WXG__POOL_FINISHED);
    assert_int_equal(x->nfinished, 1);
    assert_int_equal(value(x->m.claims[WXG__PL_DUPLICATE]), 1);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 0);
    assert_int_equal(fakeguard_calls(x->f, FG_COMPLETE), 0);
    assert_int_equal(x->nletters, 0);
    teardown(x);
}

static void busy_is_requeued_after_the_owners_lease_and_never_finished_early(void **state)
{
    (void)state;
    fixture *x = setup("noop", NULL, 0);
    const char *key = add_message(x, 2);
    fakeguard_set_busy(x->f, key, 5000);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(run(x), 0);
        /* After what is left of the owner's lease (plus a little jitter), not before. */
        assert_true(x->out[0] >= 4000 && x->out[0] <= 5100);
        assert_int_equal(x->nfinished, 0);
        assert_false(atomic_load(&x->items[0].done));
    }
    assert_int_equal(value(x->m.claims[WXG__PL_BUSY]), 2);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 0);
    /* The owner's lease runs out: the retry claims it and completes it. */
    fakeguard_advance(x->f, 6000);
    assert_int_equal(run(x), 0);
    assert_int_equal(x->out[0], WXG__POOL_FINISHED);
    assert_int_equal(x->nfinished, 1);
    assert_int_equal(value(x->m.processed), 1);
    assert_int_equal(fakeguard_state(x->f, key, NULL, NULL), WXG_GUARD_DONE);
    teardown(x);
}

/* Collects log lines (the pipeline logs from the calling thread here). */
static char unreadable_log[8192];
static size_t unreadable_log_len;

static void unreadable_sink(void *opaque, wxg_log_level_t level, const char *line, size_t len)
{
    (void)opaque;
    (void)level;
    if (unreadable_log_len + len < sizeof unreadable_log) {
        memcpy(unreadable_log + unreadable_log_len, line, len);
        unreadable_log_len += len;
        unreadable_log[unreadable_log_len] = '\0';
    }
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* A guard state the consumer cannot act on (a field value the layout does not write) keeps the
 * message waiting, never finished nor run, and says so: a metric at every answer and a log line
 * naming the partition and offset, at most once a minute. */
static void an_unreadable_guard_state_is_counted_and_logged_not_waited_on_silently(void **state)
{
    (void)state;
    fixture *x = setup("noop", NULL, 0);
    const char *key = add_message(x, 2);
    fakeguard_set_unreadable(x->f, key);
    unreadable_log_len = 0;
    unreadable_log[0] = '\0';
    wxg_log_set_sink(unreadable_sink, NULL);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(run(x), 0);
        assert_true(x->out[0] > 0); /* waits, retried */
        assert_int_equal(x->nfinished, 0);
    }
    wxg_log_set_sink(NULL, NULL);
    assert_int_equal(value(x->m.unreadable), 3);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 0);
    assert_int_equal(count_of(unreadable_log, "event=guard_state_unreadable"), 1);
    assert_non_null(strstr(unreadable_log, "partition="));
    assert_non_null(strstr(unreadable_log, "offset="));
    teardown(x);
}

/* Steals the message just before the transition of `op` reaches the fake. */
typedef struct steal_at {
    fakeguard_op op;
    int done;
} steal_at;

static void steal_hook(fakeguard_t *f, fakeguard_op op, const char *key, size_t key_len, void *arg)
{
    steal_at *s = arg;
    if (op != s->op || s->done || !key)
        return;
    char k[128];
    snprintf(k, sizeof k, "%.*s", (int)key_len, key);
    s->done = 1;
    fakeguard_steal(f, k);
}

static void lease_lost_at(fakeguard_op op)
{
    static const wxg_plugin_kv_t kv[] = {{"plugin.fail.match.keys", "nothing-matches"}};
    fixture *x = setup("noop,fail", kv, 1); /* two plugins, so that noop records a marker */
    const char *key = add_message(x, 3);
    steal_at s = {.op = op};
    fakeguard_set_hook(x->f, steal_hook, &s);
    assert_int_equal(run(x), 0);
    assert_true(s.done);
    /* Re-queued at once for a fresh claim, which decides; counted; not finished. */
    assert_int_equal(x->out[0], 0);
    assert_int_equal(x->items[0].phase, WXG__PL_CLAIM);
    assert_int_equal(x->items[0].has_claim, 0);
    assert_int_equal(value(x->m.lease_lost), 1);
    assert_int_equal(x->nfinished, 0);
    assert_int_equal(value(x->m.processed), 0);
    /* The thief holds a live lease: the fresh claim finds it BUSY. */
    assert_int_equal(run(x), 0);
    assert_true(x->out[0] > 0);
    assert_int_equal(value(x->m.claims[WXG__PL_BUSY]), 1);
    assert_int_equal(x->nfinished, 0);
    assert_int_equal(fakeguard_state(x->f, key, NULL, NULL), WXG_GUARD_PROCESSING);
    fakeguard_set_hook(x->f, NULL, NULL);
    teardown(x);
}

static void a_lease_lost_at_plugin_done_requeues_for_a_fresh_claim(void **state)
{
    (void)state;
    lease_lost_at(FG_PLUGIN_DONE);
}

static void a_lease_lost_at_complete_requeues_for_a_fresh_claim(void **state)
{
    (void)state;
    lease_lost_at(FG_COMPLETE);
}

static void
retry_then_fail_keeps_the_finished_plugin_and_dead_letters_with_the_attempts(void **state)
{
    (void)state;
    static const wxg_plugin_kv_t retry[] = FAIL_KV("retry");
    static const wxg_plugin_kv_t fail[] = FAIL_KV("fail");
    fixture *x = setup("noop,fail", retry, 3);
    const char *key = add_message(x, 4);

    /* Attempt 1: noop finishes (its sub-marker is recorded), fail asks for a retry. */
    assert_int_equal(run(x), 0);
    assert_true(x->out[0] >= 50 && x->out[0] <= 100); /* backoff_initial_ms, half jittered */
    assert_int_equal(x->nfinished, 0);
    assert_int_equal(value(x->m.retries), 1);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 1);
    assert_int_equal(plugin_runs(x, 1, WXG__PL_RETRY), 1);
    const char *names[4];
    assert_int_equal(fakeguard_finished(x->f, key, names, 4), 1);
    assert_string_equal(names[0], "noop");
    uint32_t attempt = 0;
    assert_int_equal(fakeguard_state(x->f, key, NULL, &attempt), WXG_GUARD_FAILED);
    assert_int_equal(attempt, 1);

    /* Attempt 2, on a worker whose fail plugin now fails for good (the downstream refused):
     * noop is not run again, the message is dead-lettered, then marked FAILED. */
    wxg__pipeline_conf_t conf2 = x->conf;
    conf2.chain = make_chain("noop,fail", fail, 3);
    wxg__pl_worker_t *w2 = make_worker(x, &conf2, 1);
    assert_int_equal(run_on(x, w2), 0);
    assert_int_equal(x->out[0], WXG__POOL_FINISHED);
    assert_int_equal(x->nfinished, 1);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 1);
    assert_int_equal(plugin_runs(x, 1, WXG__PL_FAIL), 1);
    assert_int_equal(x->nletters, 1);
    const letter *l = &x->letters[0];
    assert_string_equal(l->topic, TOPIC);
    assert_int_equal(l->partition, 2);
    assert_int_equal(l->offset, 100);
    assert_int_equal(l->error, WXG_EPLUGIN);
    assert_int_equal(l->attempts, 2);
    assert_string_equal(l->plugin, "fail");
    assert_string_equal(l->key, key);
    assert_string_equal(l->value, x->values[0]);
    assert_int_equal(l->header_count, 1);
    assert_string_equal(l->header0, "x-request-id");
    assert_int_equal(value(x->m.dlq_writes), 1);
    assert_int_equal(fakeguard_state(x->f, key, NULL, &attempt), WXG_GUARD_FAILED);
    assert_int_equal(attempt, 2);
    assert_int_equal(fakeguard_calls(x->f, FG_FAIL), 2); /* the retry's and the FAILED mark */
    wxg__pipeline_worker_destroy(w2);
    wxg_plugin_chain_destroy(conf2.chain);
    teardown(x);
}

static void retries_exhausting_retry_max_are_dead_lettered(void **state)
{
    (void)state;
    static const wxg_plugin_kv_t retry[] = FAIL_KV("retry");
    fixture *x = setup("fail", retry, 3);
    const char *key = add_message(x, 5);
    int runs = 0;
    int64_t last_delay = 0;
    while (!atomic_load(&x->items[0].done) && runs < 10) {
        assert_int_equal(run(x), 0);
        runs++;
        if (x->out[0] >= 0) {
            assert_true(x->out[0] >= last_delay / 2); /* the backoff grows */
            last_delay = x->out[0];
        }
    }
    assert_int_equal(runs, 3); /* retry_max attempts */
    assert_int_equal(value(x->m.retries), 2);
    assert_int_equal(x->nletters, 1);
    assert_int_equal(x->letters[0].attempts, 3);
    assert_int_equal(x->letters[0].error, WXG_EPLUGIN);
    assert_int_equal(x->nfinished, 1);
    assert_int_equal(fakeguard_state(x->f, key, NULL, NULL), WXG_GUARD_FAILED);
    teardown(x);
}

static void redis_unreachable_requeues_the_whole_batch_with_a_backoff(void **state)
{
    (void)state;
    fixture *x = setup("noop", NULL, 0);
    for (unsigned i = 0; i < 3; i++)
        add_message(x, 10 + i);
    fakeguard_fail_next(x->f, FG_CLAIM, WXG_ECONN, 1);
    assert_int_equal(run(x), 0); /* retriable: not reported as fatal */
    for (size_t i = 0; i < 3; i++) {
        assert_true(x->out[i] >= 25 && x->out[i] <= 50); /* the first infrastructure backoff */
        assert_int_equal(x->items[i].phase, WXG__PL_CLAIM);
    }
    assert_int_equal(x->nfinished, 0);
    assert_int_equal(value(x->m.guard_errors[WXG__PL_OP_CLAIM]), 1);
    assert_int_equal(atomic_load(&x->health.err), WXG_ECONN);
    /* The guard's own text goes with it, for /readyz and the log. */
    char why[256];
    wxg__pipeline_health_error(&x->health, why, sizeof why);
    assert_string_equal(why, "fake guard: injected ECONN");
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 0);

    /* Complete fails too: re-queued at complete, so the plugins do not run again. */
    fakeguard_fail_next(x->f, FG_COMPLETE, WXG_ETIMEDOUT, 1);
    assert_int_equal(run(x), 0);
    for (size_t i = 0; i < 3; i++) {
        assert_true(x->out[i] >= 0);
        assert_int_equal(x->items[i].phase, WXG__PL_COMPLETE);
    }
    assert_int_equal(x->nfinished, 0);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 3);
    assert_int_equal(run(x), 0);
    assert_int_equal(x->nfinished, 3);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 3);
    assert_int_equal(value(x->m.processed), 3);
    teardown(x);
}

static void a_fatal_error_is_returned_to_the_caller_and_finishes_nothing(void **state)
{
    (void)state;
    fixture *x = setup("noop", NULL, 0);
    const char *key = add_message(x, 20);
    add_message(x, 21);
    /* A layout stamp that changed under the worker: the claim is refused. */
    fakeguard_fail_next(x->f, FG_CLAIM, WXG_ECONFIG, 1);
    assert_int_equal(run(x), WXG_ECONFIG);
    assert_int_equal(x->nfinished, 0);
    assert_true(x->out[0] >= 0 && x->out[1] >= 0);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 0);
    /* Credentials refused at complete: fatal too, the items wait at complete. */
    fakeguard_fail_next(x->f, FG_COMPLETE, WXG_EAUTH, 1);
    assert_int_equal(run(x), WXG_EAUTH);
    assert_int_equal(x->nfinished, 0);
    assert_int_equal(x->items[0].phase, WXG__PL_COMPLETE);
    assert_int_equal(fakeguard_state(x->f, key, NULL, NULL), WXG_GUARD_PROCESSING);
    /* A retriable error is not fatal: the result of a run is that of its own calls. */
    fakeguard_fail_next(x->f, FG_COMPLETE, WXG_EREPLICAS, 1);
    assert_int_equal(run(x), 0);
    assert_int_equal(run(x), 0);
    assert_int_equal(x->nfinished, 2);
    teardown(x);
}

static void a_dead_letter_that_cannot_be_written_waits_and_is_written_later(void **state)
{
    (void)state;
    static const wxg_plugin_kv_t fail[] = FAIL_KV("fail");
    fixture *x = setup("fail", fail, 3);
    const char *key = add_message(x, 30);
    x->sink_fail_rc = WXG_ETIMEDOUT;
    x->sink_fail_count = 1;
    assert_int_equal(run(x), 0);
    assert_true(x->out[0] >= 0);
    assert_int_equal(x->items[0].phase, WXG__PL_DEAD_LETTER);
    assert_int_equal(value(x->m.dlq_errors), 1);
    assert_int_equal(x->nfinished, 0);
    /* The next run writes it without running the plugin again, then marks it FAILED. */
    assert_int_equal(run(x), 0);
    assert_int_equal(x->out[0], WXG__POOL_FINISHED);
    assert_int_equal(x->nletters, 1);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_FAIL), 1);
    assert_int_equal(fakeguard_state(x->f, key, NULL, NULL), WXG_GUARD_FAILED);
    /* A record that did not decode goes straight to the dead letter, with no claim. */
    wxg__pl_item_t *parked = &x->items[x->n];
    x->recs[x->n] = x->recs[0];
    assert_int_equal(wxg__pipeline_item_park(parked, &x->recs[x->n], WXG_EPARSE, "not JSON"), 0);
    x->n++;
    uint64_t claims = fakeguard_calls(x->f, FG_CLAIM);
    assert_int_equal(run(x), 0);
    assert_int_equal(x->nletters, 2);
    assert_int_equal(x->letters[1].error, WXG_EPARSE);
    assert_string_equal(x->letters[1].key, "");
    assert_int_equal(fakeguard_calls(x->f, FG_CLAIM), claims);
    assert_int_equal(x->nfinished, 2);
    teardown(x);
}

static void a_fatal_dead_letter_error_is_returned_and_the_record_waits(void **state)
{
    (void)state;
    static const wxg_plugin_kv_t fail[] = FAIL_KV("fail");
    fixture *x = setup("fail", fail, 3);
    const char *key = add_message(x, 40);
    /* Kafka refuses the dead-letter producer's credentials. */
    x->sink_fail_rc = WXG_EAUTH;
    x->sink_fail_count = 1;
    assert_int_equal(run(x), WXG_EAUTH);
    assert_true(x->out[0] >= 0);
    assert_int_equal(x->items[0].phase, WXG__PL_DEAD_LETTER);
    assert_int_equal(x->nfinished, 0);
    assert_int_equal(x->nletters, 0);
    assert_int_equal(value(x->m.dlq_errors), 1);
    /* Not marked FAILED either: nothing moves until the dead letter is durable. */
    assert_int_equal(fakeguard_state(x->f, key, NULL, NULL), WXG_GUARD_PROCESSING);
    assert_int_equal(fakeguard_calls(x->f, FG_FAIL), 0);
    /* Once the sink works again (after a restart, say) it is written, then marked. */
    assert_int_equal(run(x), 0);
    assert_int_equal(x->nletters, 1);
    assert_int_equal(x->nfinished, 1);
    assert_int_equal(fakeguard_state(x->f, key, NULL, NULL), WXG_GUARD_FAILED);
    teardown(x);
}

static void markers_that_cannot_be_written_leave_it_to_complete(void **state)
{
    (void)state;
    static const wxg_plugin_kv_t kv[] = {{"plugin.fail.match.keys", "nothing-matches"}};
    fixture *x = setup("noop,fail", kv, 1); /* noop's sub-marker is due after it ran */
    const char *key = add_message(x, 41);
    fakeguard_fail_next(x->f, FG_PLUGIN_DONE, WXG_ECONN, 1);
    /* The markers only spare work after a partial failure: complete still decides, and the
     * message is DONE in the same run. */
    assert_int_equal(run(x), 0);
    assert_int_equal(x->out[0], WXG__POOL_FINISHED);
    assert_int_equal(x->nfinished, 1);
    assert_int_equal(value(x->m.guard_errors[WXG__PL_OP_PLUGIN_DONE]), 1);
    assert_int_equal(value(x->m.processed), 1);
    assert_int_equal(plugin_runs(x, 0, WXG__PL_OK), 1);
    assert_int_equal(plugin_runs(x, 1, WXG__PL_OK), 1);
    assert_int_equal(fakeguard_state(x->f, key, NULL, NULL), WXG_GUARD_DONE);
    teardown(x);
}

static void a_lease_the_watchdog_lost_stops_the_old_owners_dead_letter(void **state)
{
    (void)state;
    static const wxg_plugin_kv_t fail[] = FAIL_KV("fail");
    /* A short lease, so that the watchdog renews every 100 ms. */
    fixture *x = setup_lease("fail", fail, 3, 300);
    const char *key = add_message(x, 42);
    /* The plugin fails for good, and the dead letter cannot be written yet: the item waits at
     * its dead letter, still holding its claim and its watchdog registration. */
    x->sink_fail_rc = WXG_ETIMEDOUT;
    x->sink_fail_count = 1;
    assert_int_equal(run(x), 0);
    assert_int_equal(x->items[0].phase, WXG__PL_DEAD_LETTER);
    assert_non_null(x->items[0].watch);
    /* Meanwhile another owner takes the message over; the watchdog's next renewal learns it. */
    fakeguard_steal(x->f, key);
    for (int i = 0; i < 200 && wxg_guard_watch_status(x->items[0].watch) != WXG_GUARD_WATCH_LOST;
         i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(wxg_guard_watch_status(x->items[0].watch), WXG_GUARD_WATCH_LOST);
    /* The old owner writes no dead letter: a fresh claim decides, and finds the new owner. */
    assert_int_equal(run(x), 0);
    assert_int_equal(x->nletters, 0);
    assert_int_equal(x->nfinished, 0);
    assert_int_equal(x->items[0].phase, WXG__PL_CLAIM);
    assert_int_equal(value(x->m.lease_lost), 1);
    assert_int_equal(run(x), 0);
    assert_int_equal(value(x->m.claims[WXG__PL_BUSY]), 1);
    assert_int_equal(x->nletters, 0);
    teardown(x);
}

static void a_decode_that_ran_out_of_memory_parks_nothing(void **state)
{
    (void)state;
    fixture *x = setup("noop", NULL, 0);
    /* The record is not at fault: a dead letter would lose a good message. park refuses it
     * and leaves the item as it was; the caller keeps the record unfinished and stops. */
    static const int not_poison[] = {WXG_ENOMEM, WXG_EINVAL, WXG_ETIMEDOUT};
    for (size_t i = 0; i < sizeof not_poison / sizeof not_poison[0]; i++) {
        wxg__pl_item_t it = {0};
        x->recs[0] = (wxg__pl_record_t){.topic = TOPIC, .partition = 2, .offset = 100};
        assert_int_equal(wxg__pipeline_item_park(&it, &x->recs[0], not_poison[i], "no memory"),
                         not_poison[i]);
        assert_null(it.rec);
        assert_int_equal(it.phase, WXG__PL_CLAIM);
        assert_int_equal(it.fail_code, 0);
        assert_null(it.fail_reason);
    }
    /* Every poison code parks. */
    static const int poison[] = {WXG_ETOOBIG,    WXG_EDEPTH, WXG_EPARSE,   WXG_EFORMAT,
                                 WXG_ENOACCOUNT, WXG_EUTF8,  WXG_EOVERFLOW};
    for (size_t i = 0; i < sizeof poison / sizeof poison[0]; i++) {
        wxg__pl_item_t it = {0};
        assert_int_equal(wxg__pipeline_item_park(&it, &x->recs[0], poison[i], "bad"), 0);
        assert_int_equal(it.phase, WXG__PL_DEAD_LETTER);
        assert_int_equal(it.fail_code, poison[i]);
        wxg__pipeline_item_clear(&it);
    }
    assert_int_equal(x->nletters, 0);
    teardown(x);
}

/* Counts, at each marker or complete call, how many times the stalling fail plugin had run:
 * the marker of an effect must go out before the plugin runs for the next message. */
typedef struct marker_log {
    fixture *x;
    size_t plugin; /* the chain index of the slow plugin */
    uint64_t runs_at[2][MAXN];
    size_t n[2];
} marker_log;

static void marker_hook(fakeguard_t *f, fakeguard_op op, const char *key, size_t key_len, void *arg)
{
    (void)f;
    (void)key;
    (void)key_len;
    marker_log *l = arg;
    int i = op == FG_PLUGIN_DONE ? 0 : op == FG_COMPLETE ? 1 : -1;
    if (i < 0 || l->n[i] >= MAXN)
        return;
    l->runs_at[i][l->n[i]++] = plugin_runs(l->x, l->plugin, WXG__PL_OK);
}

/* Four messages through `spec`, whose plugin at index `slow` stalls 2 ms when `stall`. */
static fixture *markers_of(const char *spec, size_t slow, int stall, marker_log *l)
{
    static const wxg_plugin_kv_t stalling[] = {{"plugin.fail.action", "stall"},
                                               {"plugin.fail.stall.ms", "2"}};
    static const wxg_plugin_kv_t passing[] = {{"plugin.fail.match.keys", "nothing-matches"}};
    fixture *x = stall ? setup(spec, stalling, 2) : setup(spec, passing, 1);
    for (unsigned i = 0; i < 4; i++)
        add_message(x, 40 + i);
    *l = (marker_log){.x = x, .plugin = slow};
    fakeguard_set_hook(x->f, marker_hook, l);
    assert_int_equal(run(x), 0);
    fakeguard_set_hook(x->f, NULL, NULL);
    assert_int_equal(x->nfinished, 4);
    assert_int_equal(value(x->m.processed), 4);
    return x;
}

static void a_slow_plugins_marker_goes_out_as_soon_as_it_returns(void **state)
{
    (void)state;
    marker_log l;
    /* Not the last plugin: one sub-marker call per message, each before the next run. The
     * fast last plugin's DONEs still travel together (see below). */
    fixture *x = markers_of("fail,noop", 0, 1, &l);
    assert_int_equal(fakeguard_calls(x->f, FG_PLUGIN_DONE), 4);
    for (size_t k = 0; k < 4; k++)
        assert_int_equal(l.runs_at[0][k], k + 1);
    assert_true(fakeguard_calls(x->f, FG_COMPLETE) < 4);
    teardown(x);
    /* The last plugin: its DONE (complete) goes out as soon as it returns. */
    x = markers_of("noop,fail", 1, 1, &l);
    assert_int_equal(fakeguard_calls(x->f, FG_PLUGIN_DONE), 1);
    assert_int_equal(fakeguard_calls(x->f, FG_COMPLETE), 4);
    for (size_t k = 0; k < 4; k++)
        assert_int_equal(l.runs_at[1][k], k + 1);
    teardown(x);
}

static void a_fast_plugins_markers_travel_in_one_call_per_batch(void **state)
{
    (void)state;
    marker_log l;
    /* Fewer calls than messages: one, unless the test thread was preempted for a millisecond
     * between two plugin calls (under valgrind, say), which sends what is waiting. */
    fixture *x = markers_of("fail,noop", 0, 0, &l);
    assert_true(fakeguard_calls(x->f, FG_PLUGIN_DONE) < 4);
    assert_true(l.runs_at[0][0] >= 2);
    assert_true(fakeguard_calls(x->f, FG_COMPLETE) < 4);
    teardown(x);
}

static void an_outage_costs_a_slow_stage_two_marker_calls_not_one_per_message(void **state)
{
    (void)state;
    static const wxg_plugin_kv_t stalling[] = {{"plugin.fail.action", "stall"},
                                               {"plugin.fail.stall.ms", "2"}};
    fixture *x = setup("fail,noop", stalling, 2);
    for (unsigned i = 0; i < 4; i++)
        add_message(x, 50 + i);
    fakeguard_fail_next(x->f, FG_PLUGIN_DONE, WXG_ECONN, 100);
    fakeguard_fail_next(x->f, FG_COMPLETE, WXG_ECONN, 100);
    assert_int_equal(run(x), 0);
    /* The first marker call fails; the rest of the stage's markers wait for its end. */
    assert_int_equal(fakeguard_calls(x->f, FG_PLUGIN_DONE), 2);
    assert_int_equal(fakeguard_calls(x->f, FG_COMPLETE), 1);
    assert_int_equal(x->nfinished, 0);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(x->items[i].phase, WXG__PL_COMPLETE);
        assert_true(x->out[i] > 0);
    }
    fakeguard_fail_next(x->f, FG_PLUGIN_DONE, 0, 0);
    fakeguard_fail_next(x->f, FG_COMPLETE, 0, 0);
    teardown(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_duplicate_is_finished_and_runs_no_plugin),
        cmocka_unit_test(busy_is_requeued_after_the_owners_lease_and_never_finished_early),
        cmocka_unit_test(an_unreadable_guard_state_is_counted_and_logged_not_waited_on_silently),
        cmocka_unit_test(a_lease_lost_at_plugin_done_requeues_for_a_fresh_claim),
        cmocka_unit_test(a_lease_lost_at_complete_requeues_for_a_fresh_claim),
        cmocka_unit_test(
            retry_then_fail_keeps_the_finished_plugin_and_dead_letters_with_the_attempts),
        cmocka_unit_test(retries_exhausting_retry_max_are_dead_lettered),
        cmocka_unit_test(redis_unreachable_requeues_the_whole_batch_with_a_backoff),
        cmocka_unit_test(a_fatal_error_is_returned_to_the_caller_and_finishes_nothing),
        cmocka_unit_test(a_dead_letter_that_cannot_be_written_waits_and_is_written_later),
        cmocka_unit_test(a_fatal_dead_letter_error_is_returned_and_the_record_waits),
        cmocka_unit_test(markers_that_cannot_be_written_leave_it_to_complete),
        cmocka_unit_test(a_lease_the_watchdog_lost_stops_the_old_owners_dead_letter),
        cmocka_unit_test(a_decode_that_ran_out_of_memory_parks_nothing),
        cmocka_unit_test(a_slow_plugins_marker_goes_out_as_soon_as_it_returns),
        cmocka_unit_test(a_fast_plugins_markers_travel_in_one_call_per_batch),
        cmocka_unit_test(an_outage_costs_a_slow_stage_two_marker_calls_not_one_per_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
