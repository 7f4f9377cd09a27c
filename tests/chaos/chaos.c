/*
 * DESIGN: the chaos tests' shared harness (see chaos.h). The devbroker is a child process that
 * takes fault commands on its stdin; replicas are children too (consumertest.h); committed
 * offsets are read by short-lived clients of their own, so the sampling never joins the group.
 */
#include "chaos.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "testenv.h"

/* wxg_ct_wait_all_committed() hands its check only the wxg_ct_t: find the chaos_t from it. */
static chaos_t *current;

void chaos_setup(chaos_t *c, const char *tag, int partitions, size_t nmsgs, uint64_t id_base,
                 const char *extra)
{
    memset(c, 0, sizeof *c);
    assert_true(nmsgs <= CHAOS_MAX_MSGS);
    current = c;
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

void chaos_check(chaos_t *c)
{
    int64_t committed[WXG_CT_MAX_PARTS];
    for (int p = 0; p < c->t.partitions; p++) {
        committed[p] = wxg_ct_committed(&c->t, p);
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

static void check_current(wxg_ct_t *t)
{
    (void)t;
    chaos_check(current);
}

void chaos_wait_all_committed(chaos_t *c, int64_t timeout_ms)
{
    if (!wxg_ct_wait_all_committed(&c->t, timeout_ms, check_current))
        fail_msg("not every message was committed within %lld ms (logs in %s)",
                 (long long)timeout_ms, c->t.dir);
    chaos_check(c);
}

int chaos_effects_of(chaos_t *c, size_t i)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(&c->t, &eff, NULL);
    int k = 0;
    for (size_t j = 0; j < n; j++)
        k += eff[j].id == c->msgs[i].id;
    free(eff);
    return k;
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
    wxg_ct_teardown(&c->t);
    wxg_test_devbroker_stop(&c->db);
    for (int p = 0; p < WXG_CT_MAX_PARTS; p++)
        free(c->offset_ids[p]);
    memset(c, 0, sizeof *c);
    current = NULL;
}
