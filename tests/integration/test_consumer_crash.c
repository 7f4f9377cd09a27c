/* End to end, with replicas that crash, join and leave while messages are in flight. Every
 * repeated effect is classified (wxg_ct_classify_repeats): the only kind allowed is the crash
 * window, where the SIGKILLed replica ran a plugin and died before that effect's marker, and a
 * new claim (a higher fencing token, which a fenced downstream keeps as the one effect) ran it
 * again. A committed offset sampled during each run never passes a message without its effect.
 *  - SIGKILL one of two replicas while hundreds of messages are in flight (each stalls 10 ms),
 *    then start it again: every message has an effect; the killed replica held claims that
 *    the other took over;
 *  - with cooperative-sticky assignment, a third replica joins mid-run and one leaves with
 *    SIGTERM (exit 0) while it holds uncommitted work: exactly one effect per message;
 *  - the record plugin alone under a steady stream with late duplicates: one replica SIGKILLed,
 *    the other SIGTERMed later, each while it holds work; repeats only in the crash window
 *    (WXG_CRASH_RUNS=N runs it N times and prints the counts);
 *  - a kill while a slow plugin runs (it acts at once and answers 10 ms later): at most one
 *    repeated effect per worker of the killed replica, whether that plugin's marker is its
 *    sub-marker or the DONE of the last plugin (WXG_CRASH_WINDOW=marker|done runs one). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumertest.h"
#include "testenv.h"

#define PARTITIONS 6
#define CONVS      120
#define ID_BASE    7301234568000000000ULL

static uint64_t *offset_ids[PARTITIONS];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

/* Builds `total` records with ~20% duplicates; returns the number of unique ids. */
static size_t make_msgs(wxg_ct_msg_t *msgs, size_t total, unsigned seed)
{
    size_t unique = 0;
    for (size_t i = 0; i < total; i++) {
        if (i > 0 && rand_r(&seed) % 100 < 20) {
            msgs[i] = msgs[(size_t)rand_r(&seed) % i];
        } else {
            int conv = rand_r(&seed) % CONVS;
            msgs[i] = (wxg_ct_msg_t){
                .partition = conv % PARTITIONS, .id = ID_BASE + unique, .conv = conv};
            unique++;
        }
    }
    return unique;
}

static size_t ledger_lines(const wxg_ct_t *t)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    free(eff);
    return n;
}

static int cmp_effect(const void *a, const void *b)
{
    const wxg_ct_effect_t *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->fence < y->fence ? -1 : x->fence > y->fence;
}

/* Checks the ledger: every unique id has an effect; repeated effects of one id come only from
 * `killed_pid` (0: none allowed) and carry distinct fencing tokens. Returns the repeats. */
static size_t check_effects(const wxg_ct_t *t, size_t unique, long killed_pid)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    qsort(eff, n, sizeof *eff, cmp_effect);
    size_t distinct = 0, repeats = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(eff[i].id >= ID_BASE && eff[i].id < ID_BASE + unique);
        if (i > 0 && eff[i].id == eff[i - 1].id) {
            repeats++;
            /* The earlier effect is the dead replica's; the later one has a higher fence. */
            if (killed_pid == 0)
                fail_msg("message %llu has two effects", (unsigned long long)eff[i].id);
            assert_int_equal(eff[i - 1].pid, killed_pid);
            assert_true(eff[i].fence > eff[i - 1].fence);
            continue;
        }
        distinct++;
    }
    assert_int_equal(distinct, unique);
    free(eff);
    return repeats;
}

/* Effects of the stopped process at or past their partition's committed offset as sampled
 * around its stop: work it held uncommitted. After a SIGKILL another replica has to take it
 * over (as duplicates, or with a new claim where it died before DONE); after a SIGTERM its
 * drain commits it. `drained` (may be NULL) counts the effects between the signal and the
 * exit. */
static size_t held_at_stop(const wxg_ct_t *t, const wxg_ct_stop_t *s, const int64_t *committed,
                           size_t *drained)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL), k = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        if (eff[i].pid != s->pid)
            continue;
        k += eff[i].partition >= 0 && eff[i].partition < PARTITIONS &&
             eff[i].offset >= committed[eff[i].partition];
        d += eff[i].time_ms >= s->sent_ms && eff[i].time_ms <= s->exited_ms;
    }
    free(eff);
    if (drained)
        *drained = d;
    return k;
}

/* Waits (bounded) until replica idx holds work: an effect of its process at or past its
 * partition's committed offset, sampled now. Leaves that sample in committed[]. */
static void wait_held_work(wxg_ct_t *t, int idx, int64_t *committed)
{
    wxg_ct_stop_t self = {.pid = (long)t->pids[idx]};
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    for (;;) {
        wxg_ct_committed_all(t, committed);
        if (held_at_stop(t, &self, committed, NULL) > 0)
            return;
        if (wxg_test_now_ms() >= deadline)
            fail_msg("replica %d never held uncommitted work", idx);
        wxg_test_sleep_ms(20);
    }
}

static void sigkill_mid_run_loses_nothing_and_never_commits_past_a_missing_effect(void **state)
{
    (void)state;
    enum { TOTAL = 3000 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-kill", PARTITIONS);
    /* Every message stalls 10 ms in the fail plugin: hundreds stay in flight per replica. */
    wxg_ct_write_config(&t, "plugins = fail,record\n"
                            "plugin.fail.action = stall\n"
                            "plugin.fail.stall.ms = 10\n"
                            "plugin.fail.match.every = 1\n"
                            "guard.lease.ms = 2s\n"
                            "consumer.workers = 4\n");
    static wxg_ct_msg_t msgs[TOTAL];
    size_t unique = make_msgs(msgs, TOTAL, 7);
    wxg_ct_index_offsets(&t, msgs, TOTAL, offset_ids);
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    /* Both hold their half before the stream arrives, so that the one killed has work. */
    assert_true(wxg_ct_wait_log(&t, 0, "event=assigned partitions=3 ", 1, 60000));
    assert_true(wxg_ct_wait_log(&t, 1, "event=assigned partitions=3 ", 1, 60000));
    wxg_ct_produce(&t, msgs, TOTAL);

    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (ledger_lines(&t) < 400 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    /* Mid-run: 400 effects, and most of the work still to do. */
    size_t before = ledger_lines(&t);
    assert_true(before >= 400 && before < unique / 2);
    check_invariant(&t);
    wxg_ct_stop_t stop;
    assert_true(wxg_ct_stop(&t, 0, SIGKILL, 10000, &stop) != -1);
    check_invariant(&t);
    wxg_test_sleep_ms(1000);
    wxg_ct_spawn(&t, 0);

    assert_true(wxg_ct_wait_all_committed(&t, 180000, check_invariant));
    check_invariant(&t);
    wxg_ct_repeats_t r;
    wxg_ct_classify_repeats(&t, &stop, 1, &r);
    size_t repeats = check_effects(&t, unique, stop.pid);
    print_message("%d records, %zu unique; the killed replica's claims taken over: %zu; %zu "
                  "re-executed after the SIGKILL (crash window %zu, at most %lld ms before the "
                  "kill)\n",
                  TOTAL, unique, r.taken_over[0], repeats, r.n[WXG_CT_REPEAT_CRASH],
                  (long long)r.crash_window_max_ms);
    /* The killed replica held claims (every message stalls 10 ms, so each of its workers had
     * a batch in hand), which the other replicas took over with a new fence; a message ran
     * again only in the crash window. */
    assert_true(r.taken_over[0] > 0);
    assert_int_equal(r.n[WXG_CT_REPEAT_CRASH], r.total);
    wxg_ct_stop_all(&t);
    wxg_ct_free_offsets(&t, offset_ids);
    wxg_ct_teardown(&t);
}

static void a_replica_joins_and_one_leaves_with_sigterm_without_double_effects(void **state)
{
    (void)state;
    enum { TOTAL = 3000 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-join", PARTITIONS);
    wxg_ct_write_config(&t, "plugins = fail,record\n"
                            "plugin.fail.action = stall\n"
                            "plugin.fail.stall.ms = 5\n"
                            "plugin.fail.match.every = 1\n"
                            "kafka.partition.assignment.strategy = cooperative-sticky\n");
    static wxg_ct_msg_t msgs[TOTAL];
    size_t unique = make_msgs(msgs, TOTAL, 11);
    wxg_ct_index_offsets(&t, msgs, TOTAL, offset_ids);
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    wxg_ct_produce(&t, msgs, TOTAL / 3);
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    while (ledger_lines(&t) < 300 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    wxg_ct_spawn(&t, 2); /* joins mid-run */
    wxg_ct_produce(&t, msgs + TOTAL / 3, TOTAL / 3);
    check_invariant(&t);
    while (ledger_lines(&t) < 1200 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    assert_true(ledger_lines(&t) >= 1200);
    /* The last third, and replica 1 leaves while it holds work of it. */
    wxg_ct_produce(&t, msgs + 2 * (TOTAL / 3), TOTAL - 2 * (TOTAL / 3));
    int64_t committed[PARTITIONS];
    wait_held_work(&t, 1, committed);
    wxg_ct_stop_t stop;
    int st = wxg_ct_stop(&t, 1, SIGTERM, 60000, &stop); /* leaves */
    wxg_ct_assert_exit(&t, 1, st, 0);

    assert_true(wxg_ct_wait_all_committed(&t, 180000, check_invariant));
    check_invariant(&t);
    /* The leaving replica held work: effects past the committed offset sampled just before
     * its SIGTERM (its drain committed them), and no message ran twice. */
    size_t drained;
    size_t held = held_at_stop(&t, &stop, committed, &drained);
    print_message("the SIGTERMed replica's effects past the committed offset: %zu, after the "
                  "signal: %zu\n",
                  held, drained);
    assert_true(held > 0);
    wxg_ct_repeats_t r;
    wxg_ct_classify_repeats(&t, &stop, 1, &r);
    assert_int_equal(r.total, 0);
    assert_int_equal(check_effects(&t, unique, 0), 0);
    assert_true(wxg_ct_log_count(&t, 2, "event=assigned") >= 1);
    wxg_ct_stop_all(&t);
    wxg_ct_free_offsets(&t, offset_ids);
    wxg_ct_teardown(&t);
}

/* The message plan of the kill-and-term run: `unique` new messages in three phases, each phase
 * after the first also carrying late duplicates of earlier phases (sent long after their
 * original took effect). Fills msgs in production order; returns the count. */
static size_t make_phased(wxg_ct_msg_t *msgs, size_t unique, size_t late, unsigned seed,
                          size_t phase_end[3])
{
    size_t n = 0, made = 0;
    for (int ph = 0; ph < 3; ph++) {
        size_t upto = unique * (size_t)(ph + 1) / 3;
        size_t dups = ph == 0 ? 0 : late;
        size_t before = made;
        while (made < upto || dups > 0) {
            if (dups > 0 && (made == upto || rand_r(&seed) % 4 == 0)) {
                msgs[n] = msgs[(size_t)rand_r(&seed) % before];
                /* Find an earlier record of a new message (not itself a duplicate). */
                n++;
                dups--;
                continue;
            }
            int conv = rand_r(&seed) % CONVS;
            msgs[n++] =
                (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = ID_BASE + made, .conv = conv};
            made++;
        }
        phase_end[ph] = n;
    }
    return n;
}

typedef struct repeat_totals {
    unsigned runs, runs_with_repeats;
    wxg_ct_repeats_t sum;
} repeat_totals;

/* Assignments of one or more partitions in replica idx's log. */
static int assigned_some(const wxg_ct_t *t, int idx)
{
    return wxg_ct_log_count(t, idx, "event=assigned ") -
           wxg_ct_log_count(t, idx, "event=assigned partitions=0 ");
}

/* One run: two replicas with the record plugin alone under a steady stream of records (CHUNK
 * every PACE_MS), late duplicates among them. Replica 0 is SIGKILLed a sixth into the stream;
 * once replica 1 has taken its partitions over, replica 0 starts again; once both hold
 * partitions again, replica 1 is SIGTERMed (and starts again at once). The stream goes on
 * throughout, so that each stop hits a replica with work. */
static void kill_and_term_run(unsigned seed, repeat_totals *tot)
{
    enum { UNIQUE = 6000, LATE = 600, MAX = UNIQUE + 2 * LATE, CHUNK = 20, PACE_MS = 40 };
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-repeat", PARTITIONS);
    wxg_ct_write_config(&t, "plugins = record\n"
                            "guard.lease.ms = 2s\n"
                            "consumer.workers = 4\n");
    static wxg_ct_msg_t msgs[MAX];
    size_t end[3];
    size_t total = make_phased(msgs, UNIQUE, LATE, seed, end);
    wxg_ct_index_offsets(&t, msgs, total, offset_ids);
    size_t chunks = (total + CHUNK - 1) / CHUNK;
    wxg_ct_stop_t stops[2];
    int64_t committed_at_kill[PARTITIONS], committed_at_term[PARTITIONS];
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    /* Both in the group before the stream starts, so that both hold work when stopped. */
    int64_t deadline = wxg_test_now_ms() + 30000 * wxg_test_scale();
    while ((assigned_some(&t, 0) == 0 || assigned_some(&t, 1) == 0) && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(50);
    int st;
    /* 0: stream; 1: killed, waiting for replica 1 to take over; 2: replica 0 back, waiting
     * for both to hold partitions; 3: SIGTERM sent and replica 1 back. */
    int step = 0, base1 = 0, base0 = 0;
    size_t settled_at = 0;
    int64_t next = wxg_test_now_ms();
    for (size_t c = 0; c < chunks || step < 3; c++) {
        if (c < chunks) {
            size_t from = c * CHUNK, n = total - from < CHUNK ? total - from : CHUNK;
            int64_t now = wxg_test_now_ms();
            if (now < next)
                wxg_test_sleep_ms(next - now);
            next += PACE_MS;
            wxg_ct_produce(&t, msgs + from, n);
        } else {
            /* The stream ended first (a slow machine): the steps go on without it. */
            wxg_test_sleep_ms(PACE_MS);
            assert_true(wxg_test_now_ms() < deadline);
        }
        if (step == 0 && c == chunks / 6) {
            check_invariant(&t);
            base1 = assigned_some(&t, 1);
            assert_true(wxg_ct_stop(&t, 0, SIGKILL, 10000, &stops[0]) != -1);
            check_invariant(&t);
            for (int p = 0; p < PARTITIONS; p++)
                committed_at_kill[p] = wxg_ct_committed(&t, p);
            deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
            step = 1;
        } else if (step == 1 && assigned_some(&t, 1) > base1) {
            base0 = assigned_some(&t, 0);
            base1 = assigned_some(&t, 1);
            wxg_ct_spawn(&t, 0);
            step = 2;
        } else if (step == 2 && !settled_at && assigned_some(&t, 0) > base0 &&
                   assigned_some(&t, 1) > base1) {
            settled_at = c;
        } else if (step == 2 && settled_at && c >= settled_at + 10) {
            for (int p = 0; p < PARTITIONS; p++)
                committed_at_term[p] = wxg_ct_committed(&t, p);
            st = wxg_ct_stop(&t, 1, SIGTERM, 60000, &stops[1]);
            wxg_ct_assert_exit(&t, 1, st, 0);
            wxg_ct_spawn(&t, 1);
            step = 3;
        }
    }

    assert_true(wxg_ct_wait_all_committed(&t, 180000, check_invariant));
    check_invariant(&t);
    wxg_ct_repeats_t r;
    wxg_ct_classify_repeats(&t, stops, 2, &r);
    size_t drained;
    size_t killed_held = held_at_stop(&t, &stops[0], committed_at_kill, NULL);
    size_t termed_held = held_at_stop(&t, &stops[1], committed_at_term, &drained);
    print_message("run seed %u: %zu records, %d unique; the SIGKILLed replica's effects past the "
                  "committed offset: %zu, its claims taken over: %zu; the SIGTERMed replica's "
                  "effects past the committed offset: %zu, of them after the signal: %zu; "
                  "repeats %zu (crash window %zu, at most %lld ms before the kill; SIGTERM %zu, "
                  "same fence %zu, live owner %zu)\n",
                  seed, total, UNIQUE, killed_held, r.taken_over[0], termed_held, drained, r.total,
                  r.n[WXG_CT_REPEAT_CRASH], (long long)r.crash_window_max_ms,
                  r.n[WXG_CT_REPEAT_SIGTERM], r.n[WXG_CT_REPEAT_SAME], r.n[WXG_CT_REPEAT_LIVE]);
    tot->runs++;
    tot->runs_with_repeats += r.total > 0;
    for (int k = 0; k < WXG_CT_REPEAT_KINDS; k++)
        tot->sum.n[k] += r.n[k];
    tot->sum.total += r.total;
    if (r.crash_window_max_ms > tot->sum.crash_window_max_ms)
        tot->sum.crash_window_max_ms = r.crash_window_max_ms;
    /* Every message took effect; a repeat only in the crash window. */
    check_effects(&t, UNIQUE, stops[0].pid);
    assert_int_equal(r.n[WXG_CT_REPEAT_CRASH], r.total);
    /* The kill hit a replica with work: it had done work it had not committed. */
    assert_true(killed_held > 0);
    wxg_ct_stop_all(&t);
    wxg_ct_free_offsets(&t, offset_ids);
    wxg_ct_teardown(&t);
}

static void repeated_effects_after_a_sigkill_and_a_sigterm_are_only_the_crash_window(void **state)
{
    (void)state;
    /* By hand, WXG_CRASH_RUNS=N repeats the run N times (and leaves the other tests out);
     * WXG_CRASH_SEED picks the first run's message plan. */
    const char *env = getenv("WXG_CRASH_RUNS");
    long runs = env ? strtol(env, NULL, 10) : 1;
    if (runs < 1)
        runs = 1;
    env = getenv("WXG_CRASH_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : 17;
    repeat_totals tot = {0};
    for (long i = 0; i < runs; i++)
        kill_and_term_run(seed + (unsigned)i, &tot);
    print_message("%u runs, %u with repeats; repeats %zu: crash window %zu (at most %lld ms "
                  "before the kill), SIGTERM %zu, same fence %zu, live owner %zu\n",
                  tot.runs, tot.runs_with_repeats, tot.sum.total, tot.sum.n[WXG_CT_REPEAT_CRASH],
                  (long long)tot.sum.crash_window_max_ms, tot.sum.n[WXG_CT_REPEAT_SIGTERM],
                  tot.sum.n[WXG_CT_REPEAT_SAME], tot.sum.n[WXG_CT_REPEAT_LIVE]);
}

/* A kill while a slow plugin runs, in the chain sloweffect followed by `after` (may be ""):
 * the killed replica's workers were each between two calls, and the
 * effects it leaves without their marker (sub-marker or DONE) are the ones that run again. */
static void kill_during_a_slow_plugin(const char *tag, const char *after)
{
    enum { N = 1200, WORKERS = 4 };
    wxg_ct_t t;
    wxg_ct_setup(&t, tag, PARTITIONS);
    char extra[2048], plugins[700];
    snprintf(plugins, sizeof plugins, "%s%s", WXG_SLOW_EFFECT_PLUGIN, after);
    snprintf(extra, sizeof extra,
             "plugins = %s\n"
             "plugin.sloweffect.path = %s\n"
             "plugin.sloweffect.delay.ms = 10\n"
             "guard.lease.ms = 2s\n"
             "consumer.workers = %d\n",
             plugins, t.ledger, WORKERS);
    wxg_ct_write_config(&t, extra);
    static wxg_ct_msg_t msgs[N];
    for (size_t i = 0; i < N; i++) {
        int conv = (int)(i * 7 % CONVS);
        msgs[i] = (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = ID_BASE + i, .conv = conv};
    }
    wxg_ct_index_offsets(&t, msgs, N, offset_ids);
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);
    /* Both replicas hold their half before the stream arrives, so that the one killed has
     * work in hand. */
    assert_true(wxg_ct_wait_log(&t, 0, "event=assigned partitions=3 ", 1, 60000));
    assert_true(wxg_ct_wait_log(&t, 1, "event=assigned partitions=3 ", 1, 60000));
    int64_t deadline = wxg_test_now_ms() + 60000 * wxg_test_scale();
    wxg_ct_produce(&t, msgs, N);
    while (ledger_lines(&t) < 200 && wxg_test_now_ms() < deadline)
        wxg_test_sleep_ms(20);
    wxg_ct_stop_t stop;
    assert_true(wxg_ct_stop(&t, 0, SIGKILL, 10000, &stop) != -1);
    check_invariant(&t);
    wxg_test_sleep_ms(500);
    wxg_ct_spawn(&t, 0);
    assert_true(wxg_ct_wait_all_committed(&t, 180000, check_invariant));
    check_invariant(&t);

    wxg_ct_repeats_t r;
    wxg_ct_classify_repeats(&t, &stop, 1, &r);
    print_message("%s: %d messages; the killed replica's claims taken over: %zu; repeats %zu "
                  "(crash window %zu, at most %lld ms before the kill; other %zu)\n",
                  plugins, N, r.taken_over[0], r.total, r.n[WXG_CT_REPEAT_CRASH],
                  (long long)r.crash_window_max_ms, r.total - r.n[WXG_CT_REPEAT_CRASH]);
    check_effects(&t, N, stop.pid);
    /* The kill hit a replica holding claims, and each of its workers left at most the one
     * effect whose marker was on its way: a marker goes out as soon as a slow plugin returns,
     * not after the plugin has run for the rest of the batch. */
    assert_true(r.taken_over[0] > 0);
    assert_int_equal(r.n[WXG_CT_REPEAT_CRASH], r.total);
    assert_true(r.total <= WORKERS);
    wxg_ct_stop_all(&t);
    wxg_ct_free_offsets(&t, offset_ids);
    wxg_ct_teardown(&t);
}

static void a_kill_during_a_slow_plugin_repeats_at_most_one_effect_per_worker(void **state)
{
    (void)state;
    /* Not the last plugin: its sub-marker; the last plugin: the DONE. By hand,
     * WXG_CRASH_WINDOW=marker or =done runs only one of them. */
    const char *only = getenv("WXG_CRASH_WINDOW");
    if (!only || strcmp(only, "done") != 0)
        kill_during_a_slow_plugin("ct-window-marker", ",noop");
    if (!only || strcmp(only, "marker") != 0)
        kill_during_a_slow_plugin("ct-window-done", "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sigkill_mid_run_loses_nothing_and_never_commits_past_a_missing_effect),
        cmocka_unit_test(a_replica_joins_and_one_leaves_with_sigterm_without_double_effects),
        cmocka_unit_test(repeated_effects_after_a_sigkill_and_a_sigterm_are_only_the_crash_window),
        cmocka_unit_test(a_kill_during_a_slow_plugin_repeats_at_most_one_effect_per_worker),
    };
    const struct CMUnitTest repeats_only[] = {
        cmocka_unit_test(repeated_effects_after_a_sigkill_and_a_sigterm_are_only_the_crash_window),
    };
    const struct CMUnitTest window_only[] = {
        cmocka_unit_test(a_kill_during_a_slow_plugin_repeats_at_most_one_effect_per_worker),
    };
    if (getenv("WXG_CRASH_RUNS"))
        return cmocka_run_group_tests(repeats_only, NULL, NULL);
    if (getenv("WXG_CRASH_WINDOW"))
        return cmocka_run_group_tests(window_only, NULL, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
