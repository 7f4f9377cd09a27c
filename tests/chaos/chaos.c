/*
 * DESIGN: the chaos tests' shared harness (see chaos.h). The devbroker is a child process that
 * takes fault commands on its stdin; replicas are children too (consumertest.h); committed
 * offsets are read by one client of the harness's own (a consumer that never subscribes, so it
 * never joins the group), kept for the whole test: a fresh client per sample would pay its
 * connection set-up each time, which is several seconds per sample once the brokers answer
 * slowly.
 */
#include "chaos.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "testenv.h"
#include "testkafka.h"

#define SAMPLE_TIMEOUT_MS 30000

void chaos_setup(chaos_t *c, const char *tag, int partitions, size_t nmsgs, uint64_t id_base,
                 const char *extra)
{
    memset(c, 0, sizeof *c);
    assert_true(nmsgs <= CHAOS_MAX_MSGS);
    wxg_test_devbroker_start(&c->db, 3);
    wxg_ct_init(&c->t, tag, partitions);
    wxg_test_devbroker_cmd(&c->db, "topic %s %d", c->t.topic, partitions);
    wxg_test_devbroker_cmd(&c->db, "topic %s 1", c->t.dlq);
    wxg_ct_write_config(&c->t, extra);
    c->nmsgs = nmsgs;
    for (int p = 0; p < partitions; p++) {
        c->offset_ids[p] = calloc(nmsgs ? nmsgs : 1, sizeof **c->offset_ids);
        assert_non_null(c->offset_ids[p]);
        c->last_committed[p] = -1001; /* none yet (RD_KAFKA_OFFSET_INVALID) */
    }
    for (size_t i = 0; i < nmsgs; i++) {
        int conv = (int)(i * 7 % 97);
        int32_t p = conv % partitions;
        c->msgs[i] = (wxg_ct_msg_t){.partition = p, .id = id_base + i, .conv = conv};
    }
}

void chaos_isolate_coordinator(chaos_t *c, int coord)
{
    assert_true(coord != 1);
    for (int p = 0; p < c->t.partitions; p++)
        wxg_test_devbroker_cmd(&c->db, "leader %s %d 1", c->t.topic, p);
    wxg_test_devbroker_cmd(&c->db, "coordinator group %s %d", c->t.group, coord);
}

void chaos_produce(chaos_t *c, size_t from, size_t to, int (*want)(int32_t p))
{
    assert_true(from <= to && to <= c->nmsgs);
    wxg_ct_msg_t *batch = calloc(to - from + 1, sizeof *batch);
    assert_non_null(batch);
    size_t n = 0;
    int64_t next[WXG_CT_MAX_PARTS];
    for (int p = 0; p < c->t.partitions; p++)
        next[p] = c->t.produced[p];
    /* One producer writes the batch in order, so each partition's offsets follow it. */
    for (size_t i = from; i < to; i++) {
        int32_t p = c->msgs[i].partition;
        if (want && !want(p))
            continue;
        c->offset_of[i] = next[p]++;
        c->offset_ids[p][c->offset_of[i]] = c->msgs[i].id;
        batch[n++] = c->msgs[i];
    }
    wxg_ct_produce(&c->t, batch, n);
    free(batch);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int chaos_sample(chaos_t *c, int64_t *committed, int timeout_ms)
{
    if (!c->sampler) {
        char errstr[512];
        rd_kafka_conf_t *conf = wxg_test_kafka_conf();
        wxg_test_kafka_conf_set(conf, "group.id", c->t.group);
        wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
        /* Refused connections to a broker a test took down are expected: a sample that
         * cannot be taken says so through its result. */
        wxg_test_kafka_conf_set(conf, "log_level", "2");
        c->sampler = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
        if (!c->sampler) {
            rd_kafka_conf_destroy(conf);
            fail_msg("offset sampler: %s", errstr);
        }
    }
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(c->t.partitions);
    assert_non_null(l);
    for (int p = 0; p < c->t.partitions; p++)
        rd_kafka_topic_partition_list_add(l, c->t.topic, p);
    rd_kafka_resp_err_t err =
        rd_kafka_committed(c->sampler, l, (int)(timeout_ms * wxg_test_scale()));
    for (int p = 0; !err && p < c->t.partitions; p++) {
        if (l->elems[p].err)
            err = l->elems[p].err;
        committed[p] = l->elems[p].offset;
    }
    rd_kafka_topic_partition_list_destroy(l);
    return err ? -1 : 0;
}

/* The checks of one sample (see chaos_check). */
static void check_sample(chaos_t *c, const int64_t *committed)
{
    for (int p = 0; p < c->t.partitions; p++) {
        if (committed[p] < c->last_committed[p])
            fail_msg("partition %d: committed offset went back from %lld to %lld", p,
                     (long long)c->last_committed[p], (long long)committed[p]);
        c->last_committed[p] = committed[p];
    }
    c->samples++;
    /* Effects are written before an offset passes them, so the ledger read after the sample
     * must hold every message below the sampled offsets. */
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&c->t, &eff, NULL);
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = eff[i].id;
    qsort(ids, n, sizeof *ids, cmp_u64);
    for (int p = 0; p < c->t.partitions; p++) {
        if (committed[p] > c->t.produced[p])
            fail_msg("partition %d: committed %lld beyond the %lld produced", p,
                     (long long)committed[p], (long long)c->t.produced[p]);
        for (int64_t o = 0; o < committed[p]; o++) {
            uint64_t id = c->offset_ids[p][o];
            if (!bsearch(&id, ids, n, sizeof *ids, cmp_u64))
                fail_msg("partition %d committed %lld, but message %llu at offset %lld has no "
                         "effect",
                         p, (long long)committed[p], (unsigned long long)id, (long long)o);
        }
    }
    free(ids);
    free(eff);
}

void chaos_check(chaos_t *c)
{
    int64_t committed[WXG_CT_MAX_PARTS];
    if (chaos_sample(c, committed, SAMPLE_TIMEOUT_MS) != 0)
        fail_msg("cannot read the committed offsets of group %s", c->t.group);
    check_sample(c, committed);
}

int chaos_try_check(chaos_t *c, int timeout_ms)
{
    int64_t committed[WXG_CT_MAX_PARTS];
    if (chaos_sample(c, committed, timeout_ms) != 0)
        return -1;
    check_sample(c, committed);
    return 0;
}

void chaos_wait_all_committed(chaos_t *c, int64_t timeout_ms)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    int64_t committed[WXG_CT_MAX_PARTS];
    for (;;) {
        /* Every sample is checked: one request reads all partitions, and the checks read
         * only the local ledger. */
        chaos_check(c);
        int done = 1;
        for (int p = 0; p < c->t.partitions; p++)
            done &= c->last_committed[p] == c->t.produced[p];
        if (done)
            return;
        if (wxg_test_now_ms() >= deadline)
            break;
        for (int i = 0; i < WXG_CT_MAX_REPLICAS; i++) {
            if (c->t.pids[i] > 0 && !wxg_ct_alive(&c->t, i))
                fail_msg("replica %d exited unexpectedly (see %s/replica-%d.log)", i, c->t.dir, i);
        }
        wxg_test_sleep_ms(200);
    }
    if (chaos_sample(c, committed, SAMPLE_TIMEOUT_MS) == 0) {
        for (int p = 0; p < c->t.partitions; p++)
            print_message("partition %d: committed %lld of %lld\n", p, (long long)committed[p],
                          (long long)c->t.produced[p]);
    }
    fail_msg("not every message was committed within %lld ms (logs in %s)", (long long)timeout_ms,
             c->t.dir);
}

void chaos_wait_log(chaos_t *c, int idx, const char *needle, int count, int64_t timeout_ms)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    int n;
    while ((n = wxg_ct_log_count(&c->t, idx, needle)) < count) {
        if (!wxg_ct_alive(&c->t, idx))
            fail_msg("replica %d exited while waiting for '%s' (see %s/replica-%d.log)", idx,
                     needle, c->t.dir, idx);
        if (wxg_test_now_ms() >= deadline)
            fail_msg("replica %d logged '%s' %d times, not %d, within %lld ms (see "
                     "%s/replica-%d.log)",
                     idx, needle, n, count, (long long)timeout_ms, c->t.dir, idx);
        wxg_test_sleep_ms(100);
    }
}

void chaos_effect_counts(chaos_t *c, int *counts)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&c->t, &eff, NULL);
    uint64_t base = c->msgs[0].id;
    memset(counts, 0, c->nmsgs * sizeof *counts);
    for (size_t j = 0; j < n; j++) {
        if (eff[j].id >= base && eff[j].id - base < c->nmsgs)
            counts[eff[j].id - base]++;
    }
    free(eff);
}

void chaos_check_exactly_once(chaos_t *c, size_t upto)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&c->t, &eff, NULL);
    uint64_t base = c->msgs[0].id;
    unsigned char *seen = calloc(c->nmsgs ? c->nmsgs : 1, 1);
    assert_non_null(seen);
    for (size_t j = 0; j < n; j++) {
        if (eff[j].id < base || eff[j].id >= base + upto)
            fail_msg("ledger has an effect for message %llu, which was never produced",
                     (unsigned long long)eff[j].id);
        if (seen[eff[j].id - base]++)
            fail_msg("message %llu has a second effect (I2)", (unsigned long long)eff[j].id);
    }
    for (size_t i = 0; i < upto; i++) {
        if (!seen[i])
            fail_msg("message %llu has no effect (I1)", (unsigned long long)c->msgs[i].id);
    }
    free(seen);
    free(eff);
}

void chaos_stop_replica(chaos_t *c, int idx)
{
    int st = wxg_ct_signal(&c->t, idx, SIGTERM, 60000);
    if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0))
        fail_msg("replica %d did not stop cleanly on SIGTERM (status %d, log in %s)", idx, st,
                 c->t.dir);
}

uint64_t chaos_log_max(chaos_t *c, int idx, const char *key)
{
    char logp[512], needle[128];
    snprintf(logp, sizeof logp, "%s/replica-%d.log", c->t.dir, idx);
    snprintf(needle, sizeof needle, " %s=", key);
    FILE *f = fopen(logp, "r");
    if (!f)
        return 0;
    char line[16384];
    uint64_t max = 0;
    while (fgets(line, sizeof line, f)) {
        const char *s = strstr(line, needle);
        if (!s)
            continue;
        uint64_t v = strtoull(s + strlen(needle), NULL, 10);
        if (v > max)
            max = v;
    }
    fclose(f);
    return max;
}

void chaos_teardown(chaos_t *c)
{
    if (c->sampler) {
        /* It never joined the group, so closing it has nothing to wait for. */
        rd_kafka_consumer_close(c->sampler);
        rd_kafka_destroy(c->sampler);
    }
    wxg_ct_teardown(&c->t);
    wxg_test_devbroker_stop(&c->db);
    for (int p = 0; p < WXG_CT_MAX_PARTS; p++)
        free(c->offset_ids[p]);
    memset(c, 0, sizeof *c);
}
