/*
 * DESIGN: the per-message pipeline (lib/pipeline_int.h).
 *
 * Purpose: take a batch of messages through the guard's state machine and the plugin chain,
 * so that a message is finished only once it is DONE, a duplicate, or durably dead-lettered.
 * Read it top to bottom from wxg__pipeline_run(): it sorts the batch by the stage each item
 * enters next, then runs the stages in order, each as one guard call for all its items:
 *
 *   stage_claim        one claim call: DUPLICATE finishes, BUSY re-queues after the owner's
 *                      lease, CLAIMED registers the lease with the watchdog and goes on;
 *   stage_plugins      the chain plugin by plugin, so that the sub-markers of one plugin travel
 *                      in few plugin_done calls (see the crash window below); a plugin already
 *                      finished on an earlier attempt is skipped, a lost lease stops the item
 *                      (re-queued for a fresh claim); the outcomes are sorted into complete,
 *                      retry and dead letter;
 *   stage_complete     one complete call for what the last plugin left: DONE finishes, a lost
 *                      lease re-queues for a claim;
 *   stage_retry        one fail call (FAILED keeps the fence and the finished plugins, and
 *                      drops the lease), then a re-queue after the retry backoff;
 *   stage_dead_letter  the original record through the caller's sink, one by one;
 *   stage_fail_mark    one fail call for what was dead-lettered, then finished either way
 *                      (the dead letter is durable).
 *
 * An item re-queued by a stage comes back at the stage it stopped in (its `phase`), so a
 * complete or a fail mark that failed for want of Redis is retried without running the
 * plugins again.
 *
 * The crash window: a process that dies after a plugin's effect and before that effect's
 * marker (the plugin's sub-marker, or the DONE after the last plugin) leaves the effect
 * unrecorded, and the next owner runs the plugin again. Markers batched over the whole stage
 * kept that window open while the plugin ran for the rest of the batch: with a 10 ms plugin
 * and a batch of 40, up to 400 ms and every effect of the batch. So a stage writes the
 * markers it has collected as soon as the plugin call that just returned took MARKER_WAIT_US
 * or more, or the oldest effect waiting for its marker is that old: a slow plugin's effect is
 * marked as soon as the plugin returns (one small guard call per message, against at least a
 * millisecond of plugin time), while a fast plugin's markers still travel in one call per
 * batch. After the last plugin the same rule sends complete calls from inside the stage. The
 * window left is one guard round trip after a slow plugin, MARKER_WAIT_US plus one call after
 * a fast one. Once such a call fails as a whole (Redis unreachable), the rest of the run's
 * markers wait for the end of their stage again, so that an outage costs a stage one timeout
 * rather than one per message.
 *
 * Threads: each worker thread has its own wxg__pl_worker_t (guard connection, plugin thread
 * state, scratch vectors of batch_max entries made once, so a run allocates nothing on the
 * way to DONE: only a failure's reason and a dead letter's header array). The shared configuration
 * is only read; metrics are atomics; the health fields are atomics written by every worker, but
 * for the text of a failed guard call, copied under the health's own mutex (only on a failure).
 * No other lock is taken here; the finished callback and the sink may take the caller's.
 *
 * Failure modes, decided by the error's class (wxg_err_class, include/wxguard/err.h): a guard
 * call that fails as a whole re-queues its items with a capped, jittered backoff and nothing
 * finishes, so nothing is committed past them; when the class is fatal (WXG_EAUTH, WXG_ECONFIG
 * such as a layout stamp that no longer matches, WXG_ENOMEM, ...) the error is also logged as
 * pipeline_fatal and returned to the caller, which stops. A dead letter that cannot be written
 * re-queues the item at the dead-letter stage, holding its partition's watermark; a fatal
 * class is reported the same way. A plugin's own verdict decides between retry (RETRY) and dead
 * letter (FAIL, with the poison code WXG_EPLUGIN). Lease lost anywhere (renewal,
 * plugin_done, complete) re-queues the item for a fresh claim, which decides.
 */
#include "pipeline_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock_int.h"
#include "err_int.h"
#include "pool_int.h"
#include "wxguard/err.h"
#include "wxguard/log.h"

#define INFRA_BACKOFF_MAX_MS 2000
#define INFRA_BACKOFF_MIN_MS 50
/* How long a plugin's effect may wait for its marker (see "The crash window" above). */
#define MARKER_WAIT_US 1000

/* What stage_plugins made of a claimed item. */
enum { OUT_ACTIVE = 0, OUT_RETRY, OUT_FAIL, OUT_LOST };

struct wxg__pl_worker {
    const wxg__pipeline_conf_t *conf;
    const wxg__pl_metrics_t *m;
    unsigned index;
    wxg_guard_t *g;
    wxg_plugin_thread_t *pt;
    size_t nplugins;
    unsigned seed;
    uint64_t round_trips_seen;
    uint64_t cluster_seen[WXG__PL_CL_N]; /* the guard's cluster counters already counted */
    int fatal;                           /* the first fatal error of the current run */
    int64_t *out;                        /* the current run's results */
    /* Scratch of batch_max entries each: the items of each stage, and the guard call's
     * arguments and results. */
    wxg__pl_item_t **claimv, **chainv, **completev, **retryv, **dlqv, **failv, **donev;
    wxg_guard_msg_t *msgs;
    wxg_guard_claim_t *claims;
    wxg_guard_ticket_t *tickets;
    int *results;
    wxg_guard_plugin_done_t *dones;
    /* Copies of the results the dones point at: a plugin's call record lives only for its
     * call, while the markers of one plugin travel together after it ran for every item. */
    char (*doneres)[WXG_PLUGIN_RESULT_MAX + 1];
    wxg_guard_failure_t *failures;
    size_t nclaim, nchain, ncomplete, nretry, ndlq, nfail;
    size_t ncompleted; /* completev[0..ncompleted) already went through a complete call */
    int marker_failed; /* a marker or complete call of this run failed as a whole */
};

/* ---- small helpers ---- */

static int64_t backoff_ms(wxg__pl_worker_t *w, uint32_t n, int64_t initial, int64_t max)
{
    if (n == 0)
        n = 1;
    int64_t d = initial;
    for (uint32_t i = 1; i < n && d < max; i++)
        d *= 2;
    if (d > max)
        d = max;
    if (d < 2)
        return d;
    /* Half fixed, half random: retries of many messages spread out instead of marching. */
    return d / 2 + (int64_t)(rand_r(&w->seed) % (unsigned)(d / 2 + 1));
}

/* The backoff after the item's latest infrastructure error (Redis, the dead-letter sink). */
static int64_t infra_backoff(wxg__pl_worker_t *w, wxg__pl_item_t *it)
{
    it->errors++;
    int64_t max = w->conf->backoff_max_ms < INFRA_BACKOFF_MAX_MS ? w->conf->backoff_max_ms
                                                                 : INFRA_BACKOFF_MAX_MS;
    return backoff_ms(w, it->errors, INFRA_BACKOFF_MIN_MS, max);
}

static void drop_claim(const wxg__pipeline_conf_t *conf, wxg__pl_item_t *it)
{
    if (it->watch) {
        wxg_guard_watchdog_remove(conf->wd, it->watch);
        it->watch = NULL;
    }
    if (it->has_claim) {
        wxg_guard_claim_clear(&it->claim);
        it->has_claim = 0;
    }
}

static void set_failure(wxg__pl_item_t *it, int code, const char *plugin, const char *reason)
{
    int64_t now = wxg__wall_ms();
    if (!it->first_failure_ms)
        it->first_failure_ms = now;
    it->last_failure_ms = now;
    it->fail_code = code;
    it->fail_plugin = plugin;
    free(it->fail_reason);
    it->fail_reason = reason ? strdup(reason) : NULL;
}

/* The item leaves the pipeline finished; it must not be touched afterwards (the finished
 * callback may free it). */
static void finish(wxg__pl_worker_t *w, wxg__pl_item_t *it)
{
    w->out[it->slot] = WXG__POOL_FINISHED;
    atomic_store(&it->done, 1);
    drop_claim(w->conf, it);
    w->conf->finished(w->conf->finished_arg, it);
}

/* The item comes back after delay_ms at `phase`; a fresh claim drops the old one first. */
static void requeue(wxg__pl_worker_t *w, wxg__pl_item_t *it, int phase, int64_t delay_ms)
{
    if (phase == WXG__PL_CLAIM)
        drop_claim(w->conf, it);
    it->phase = phase;
    w->out[it->slot] = delay_ms < 0 ? 0 : delay_ms;
}

/* A guard call that reached Redis and got its answers: Redis is reachable. */
static void guard_ok(wxg__pl_worker_t *w)
{
    atomic_store(&w->conf->health->ok_ms, wxg__mono_ms());
}

/* Keeps the first fatal error of the run for the caller, with one line that says why. */
static void fatal(wxg__pl_worker_t *w, const char *op, int rc, const char *reason)
{
    wxg_log(WXG_LOG_ERROR, "pipeline_fatal", WXG_LS("op", op), WXG_LERR(rc),
            WXG_LS("class", wxg_err_class_name(wxg_err_class(rc))), WXG_LU("worker", w->index),
            WXG_LS("reason", reason && reason[0] ? reason : wxg_strerror(rc)));
    if (!w->fatal)
        w->fatal = rc;
}

/* A guard call failed as a whole: counted, logged, and remembered for readiness. Its class
 * decides the rest: the caller re-queues the items either way (nothing finishes), and a fatal
 * error is also kept for the caller of wxg__pipeline_run, which stops. */
static void guard_failed(wxg__pl_worker_t *w, int op, int rc, size_t n)
{
    static const char *const ops[WXG__PL_OP_N] = {"claim", "complete", "fail", "plugin_done"};
    wxg_counter_inc(w->m->guard_errors[op]);
    wxg__pl_health_t *h = w->conf->health;
    const char *why = wxg_guard_last_error(w->g);
    pthread_mutex_lock(&h->err_mu);
    snprintf(h->err_text, sizeof h->err_text, "%s", why);
    pthread_mutex_unlock(&h->err_mu);
    atomic_store(&h->err, rc);
    atomic_store(&h->err_op, op);
    atomic_store(&h->err_ms, wxg__mono_ms());
    wxg_log(WXG_LOG_WARN, "guard_error", WXG_LS("op", ops[op]), WXG_LERR(rc),
            WXG_LU("worker", w->index), WXG_LU("batch", n), WXG_LS("reason", why));
    if (wxg_err_class(rc) == WXG_CLASS_FATAL)
        fatal(w, ops[op], rc, wxg_guard_last_error(w->g));
}

static const wxg_guard_plugin_result_t *finished_plugin(const wxg__pl_item_t *it,
                                                        const char *plugin)
{
    for (size_t i = 0; i < it->claim.n_finished; i++) {
        if (strcmp(it->claim.finished[i].name, plugin) == 0)
            return &it->claim.finished[i];
    }
    return NULL;
}

/* ---- the stages ---- */

/* Sorts the batch by the stage each item enters now. */
static void stage_sort(wxg__pl_worker_t *w, void *const *items, size_t n)
{
    w->nclaim = w->nchain = w->ncomplete = w->nretry = w->ndlq = w->nfail = 0;
    w->ncompleted = 0;
    w->marker_failed = 0;
    for (size_t i = 0; i < n; i++) {
        wxg__pl_item_t *it = items[i];
        it->slot = i;
        w->out[i] = WXG__POOL_FINISHED;
        switch (it->phase) {
        case WXG__PL_CLAIM:
            w->claimv[w->nclaim++] = it;
            break;
        case WXG__PL_COMPLETE:
            w->completev[w->ncomplete++] = it;
            break;
        case WXG__PL_DEAD_LETTER:
            w->dlqv[w->ndlq++] = it;
            break;
        default:
            w->failv[w->nfail++] = it;
            break;
        }
    }
}

/* A claim met a guard state it cannot act on (a field value the layout does not write): the
 * message waits, retried, and holds its partition's watermark until an operator clears the
 * state, so it must not wait silently. Counted at every answer, logged at the first and then
 * at most once a minute per message. */
static void unreadable_state(wxg__pl_worker_t *w, wxg__pl_item_t *it)
{
    wxg_counter_inc(w->m->unreadable);
    int64_t now = wxg__mono_ms();
    if (it->unreadable_logged_ms && now - it->unreadable_logged_ms < 60000)
        return;
    it->unreadable_logged_ms = now;
    const wxg__pl_record_t *r = it->rec;
    wxg_log(WXG_LOG_ERROR, "guard_state_unreadable", WXG_LS("topic", r->topic),
            WXG_LI("partition", r->partition), WXG_LI("offset", r->offset),
            WXG_LID("key", it->msg ? it->msg->key : NULL),
            WXG_LS("action", "retried until cleared: wxguardctl inspect, then purge"));
}

/* One claim answer: DUPLICATE finishes, BUSY waits out the owner's lease, CLAIMED goes on to
 * the plugins. */
static void claim_answered(wxg__pl_worker_t *w, wxg__pl_item_t *it, wxg_guard_claim_t *cl)
{
    const wxg__pl_metrics_t *m = w->m;
    switch (cl->outcome) {
    case WXG_GUARD_DUPLICATE:
        wxg_counter_inc(m->claims[WXG__PL_DUPLICATE]);
        if (cl->cached)
            wxg_counter_inc(m->cache_hits);
        if (cl->payload_mismatch)
            wxg_counter_inc(m->mismatches);
        wxg_guard_claim_clear(cl);
        finish(w, it);
        break;
    case WXG_GUARD_BUSY: {
        wxg_counter_inc(m->claims[WXG__PL_BUSY]);
        if (cl->unreadable)
            unreadable_state(w, it);
        int64_t d = cl->lease_ms_left > 0 ? cl->lease_ms_left : 0;
        wxg_guard_claim_clear(cl);
        requeue(w, it, WXG__PL_CLAIM, d + 5 + rand_r(&w->seed) % 50);
        break;
    }
    case WXG_GUARD_CLAIMED:
        wxg_counter_inc(m->claims[WXG__PL_CLAIMED]);
        it->claim = *cl; /* takes over what the result owns */
        memset(cl, 0, sizeof *cl);
        it->claim.ticket.key = it->msg->key;
        it->has_claim = 1;
        it->attempts = it->claim.attempt;
        it->outcome = OUT_ACTIVE;
        it->watch = wxg_guard_watchdog_add(w->conf->wd, &it->claim.ticket);
        if (!it->watch) {
            requeue(w, it, WXG__PL_CLAIM, infra_backoff(w, it));
            break;
        }
        w->chainv[w->nchain++] = it;
        break;
    default:
        wxg_guard_claim_clear(cl);
        requeue(w, it, WXG__PL_CLAIM, infra_backoff(w, it));
        break;
    }
}

static void stage_claim(wxg__pl_worker_t *w)
{
    size_t n = w->nclaim;
    if (n == 0)
        return;
    for (size_t k = 0; k < n; k++) {
        const wxg_msg_view_t *msg = w->claimv[k]->msg;
        w->msgs[k] = (wxg_guard_msg_t){
            .key = msg->key, .key_len = strlen(msg->key), .payload_hash = msg->payload_hash};
    }
    memset(w->claims, 0, n * sizeof *w->claims);
    int64_t t0 = wxg__mono_us();
    int rc = wxg_guard_claim_batch(w->g, w->msgs, n, w->claims);
    wxg_histogram_observe(w->m->claim_seconds, (double)(wxg__mono_us() - t0) / 1e6);
    if (rc != 0) {
        guard_failed(w, WXG__PL_OP_CLAIM, rc, n);
        for (size_t k = 0; k < n; k++)
            requeue(w, w->claimv[k], WXG__PL_CLAIM, infra_backoff(w, w->claimv[k]));
        return;
    }
    guard_ok(w);
    for (size_t k = 0; k < n; k++) {
        wxg__pl_item_t *it = w->claimv[k];
        int_fast64_t unset = 0;
        it->errors = 0;
        /* The record's claim-to-commit clock starts at its first claim answer. */
        atomic_compare_exchange_strong(&it->rec->claimed_us, &unset, t0);
        claim_answered(w, it, &w->claims[k]);
    }
}

/* Runs plugin s for one item. Returns 1 when it succeeded and a sub-marker is due. *took_us
 * is how long the call took, *end_us when it returned (monotonic). */
static int run_plugin(wxg__pl_worker_t *w, size_t s, const char *name, wxg__pl_item_t *it,
                      size_t nd, int64_t *took_us, int64_t *end_us)
{
    const wxg__pl_metrics_t *m = w->m;
    const wxg_guard_plugin_result_t *prev = finished_plugin(it, name);
    wxg_plugin_call_t call;
    wxg_plugin_call_init(&call);
    call.key = it->msg->key;
    call.fence = it->claim.ticket.fence;
    call.attempt = it->claim.attempt;
    call.topic = it->rec->topic;
    call.partition = it->rec->partition;
    call.offset = it->rec->offset;
    call.prev_result = prev ? (const char *)prev->result : NULL;
    int64_t t0 = wxg__mono_us();
    wxg_plugin_result_t res = wxg_plugin_chain_handle(w->conf->chain, w->pt, s, it->msg, &call);
    *end_us = wxg__mono_us();
    *took_us = *end_us - t0;
    wxg_histogram_observe(m->plugin_seconds[s], (double)*took_us / 1e6);
    int r = res == WXG_PLUGIN_OK      ? WXG__PL_OK
            : res == WXG_PLUGIN_RETRY ? WXG__PL_RETRY
                                      : WXG__PL_FAIL;
    wxg_counter_inc(m->plugin_results[s * WXG__PL_RESULT_N + (size_t)r]);
    if (res != WXG_PLUGIN_OK) {
        it->outcome = res == WXG_PLUGIN_RETRY ? OUT_RETRY : OUT_FAIL;
        set_failure(it, WXG_EPLUGIN, name, call.reason[0] ? call.reason : NULL);
        return 0;
    }
    /* The last plugin gets no marker: complete records it. */
    if (s + 1 == w->nplugins)
        return 0;
    size_t rl = 0;
    if (call.has_result) {
        rl = strlen(call.result);
        memcpy(w->doneres[nd], call.result, rl + 1);
    }
    w->dones[nd] = (wxg_guard_plugin_done_t){.ticket = &it->claim.ticket,
                                             .plugin = name,
                                             .result = call.has_result ? w->doneres[nd] : NULL,
                                             .result_len = rl};
    return 1;
}

/* One complete call for completev[ncompleted..ncomplete): DONE finishes, a lost lease
 * re-queues for a claim, a failed call re-queues at complete. */
static void complete_pending(wxg__pl_worker_t *w)
{
    size_t from = w->ncompleted, n = w->ncomplete - from;
    w->ncompleted = w->ncomplete;
    if (n == 0)
        return;
    wxg__pl_item_t **v = w->completev + from;
    for (size_t k = 0; k < n; k++)
        w->tickets[k] = v[k]->claim.ticket;
    int rc = wxg_guard_complete_batch(w->g, w->tickets, n, w->results);
    if (rc != 0) {
        w->marker_failed = 1;
        guard_failed(w, WXG__PL_OP_COMPLETE, rc, n);
        for (size_t k = 0; k < n; k++)
            requeue(w, v[k], WXG__PL_COMPLETE, infra_backoff(w, v[k]));
        return;
    }
    guard_ok(w);
    for (size_t k = 0; k < n; k++) {
        wxg__pl_item_t *it = v[k];
        if (w->results[k] == WXG_GUARD_LEASE_LOST) {
            wxg_counter_inc(w->m->lease_lost);
            requeue(w, it, WXG__PL_CLAIM, 0);
            continue;
        }
        it->errors = 0;
        wxg_counter_inc(w->m->processed);
        finish(w, it);
    }
}

/* The sub-markers collected so far (w->dones[0..nd), for the items w->donev[0..nd)), in one
 * call. */
static void flush_markers(wxg__pl_worker_t *w, size_t nd)
{
    if (nd == 0)
        return;
    int rc = wxg_guard_plugin_done_batch(w->g, w->dones, nd, w->results);
    if (rc != 0) {
        /* The markers only spare work after a partial failure; complete is what counts, so go
         * on and let complete decide. */
        w->marker_failed = 1;
        guard_failed(w, WXG__PL_OP_PLUGIN_DONE, rc, nd);
        return;
    }
    guard_ok(w);
    for (size_t k = 0; k < nd; k++) {
        if (w->results[k] == WXG_GUARD_LEASE_LOST)
            w->donev[k]->outcome = OUT_LOST;
    }
}

/* Plugin s for every claimed item still active, with its sub-markers (after the last plugin:
 * the DONE of complete) written in as few calls as the crash window allows: together while the
 * plugin is fast, as soon as it returns once it is slow. An item handed to complete leaves
 * chainv (its slot is cleared): complete may finish it, and a finished item is not ours any
 * more. */
static void plugin_stage(wxg__pl_worker_t *w, size_t s)
{
    const char *name = wxg_plugin_chain_name(w->conf->chain, s);
    int last = s + 1 == w->nplugins;
    size_t nd = 0;
    int64_t oldest_us = 0; /* when the oldest effect still without its marker happened */
    for (size_t k = 0; k < w->nchain; k++) {
        wxg__pl_item_t *it = w->chainv[k];
        if (!it || it->outcome != OUT_ACTIVE || finished_plugin(it, name))
            continue;
        if (wxg_guard_watch_status(it->watch) != WXG_GUARD_WATCH_LIVE) {
            it->outcome = OUT_LOST;
            continue;
        }
        int64_t took_us, end_us;
        if (run_plugin(w, s, name, it, nd, &took_us, &end_us))
            w->donev[nd++] = it;
        if (last && it->outcome == OUT_ACTIVE) {
            w->completev[w->ncomplete++] = it;
            w->chainv[k] = NULL;
        }
        if ((last ? w->ncomplete - w->ncompleted : nd) == 0)
            continue;
        if (!oldest_us)
            oldest_us = end_us;
        /* After a call that failed as a whole (Redis away) the rest waits for the end of the
         * stage, so that an outage costs a stage one timeout, not one per message. */
        if (w->marker_failed || (took_us < MARKER_WAIT_US && end_us - oldest_us < MARKER_WAIT_US))
            continue;
        if (last) {
            complete_pending(w);
        } else {
            flush_markers(w, nd);
            nd = 0;
        }
        oldest_us = 0;
    }
    /* The rest of the last plugin's go with stage_complete, right after. */
    flush_markers(w, nd);
}

static void stage_plugins(wxg__pl_worker_t *w)
{
    if (w->nchain == 0)
        return;
    for (size_t s = 0; s < w->nplugins; s++)
        plugin_stage(w, s);
    for (size_t k = 0; k < w->nchain; k++) {
        wxg__pl_item_t *it = w->chainv[k];
        if (!it)
            continue; /* handed to complete by the last plugin's stage */
        switch (it->outcome) {
        case OUT_ACTIVE:
            /* No plugins, or the last one finished on an earlier attempt. */
            w->completev[w->ncomplete++] = it;
            break;
        case OUT_LOST:
            wxg_counter_inc(w->m->lease_lost);
            requeue(w, it, WXG__PL_CLAIM, 0);
            break;
        case OUT_RETRY:
            if (it->attempts < w->conf->retry_max) {
                w->retryv[w->nretry++] = it;
                break;
            }
            w->dlqv[w->ndlq++] = it;
            break;
        default:
            w->dlqv[w->ndlq++] = it;
            break;
        }
    }
}

static void stage_complete(wxg__pl_worker_t *w)
{
    complete_pending(w);
}

/* Fills the fail call's arguments for v[0..n). */
static void fill_failures(wxg__pl_worker_t *w, wxg__pl_item_t *const *v, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        w->failures[k] = (wxg_guard_failure_t){
            .ticket = &v[k]->claim.ticket, .reason = v[k]->fail_reason, .attempts = v[k]->attempts};
    }
}

/* Retries: drop the lease (FAILED keeps the fence and the finished plugins) and come back after
 * the backoff. */
static void stage_retry(wxg__pl_worker_t *w)
{
    size_t n = w->nretry;
    if (n == 0)
        return;
    fill_failures(w, w->retryv, n);
    int rc = wxg_guard_fail_batch(w->g, w->failures, n, w->results);
    if (rc != 0)
        guard_failed(w, WXG__PL_OP_FAIL, rc, n); /* the lease runs out by itself */
    else
        guard_ok(w);
    for (size_t k = 0; k < n; k++) {
        wxg__pl_item_t *it = w->retryv[k];
        wxg_counter_inc(w->m->retries);
        requeue(w, it, WXG__PL_CLAIM,
                backoff_ms(w, it->attempts, w->conf->backoff_initial_ms, w->conf->backoff_max_ms));
    }
}

/* Writes one dead letter. Returns 1 when it is written and the item's FAILED mark is still to
 * be set; the item is finished or re-queued otherwise (and must not be touched again). */
static int dead_letter(wxg__pl_worker_t *w, wxg__pl_item_t *it)
{
    const wxg__pl_record_t *r = it->rec;
    if (it->has_claim && wxg_guard_watch_status(it->watch) == WXG_GUARD_WATCH_LOST) {
        /* Another owner took the message over meanwhile: let a fresh claim decide. */
        wxg_counter_inc(w->m->lease_lost);
        requeue(w, it, WXG__PL_CLAIM, 0);
        return 0;
    }
    /* Allocated only for a dead letter of a record with headers. */
    size_t nh = r->headers ? r->headers(r, NULL, 0) : 0;
    wxg_kafka_header_t *hv = nh ? calloc(nh, sizeof *hv) : NULL;
    nh = hv ? r->headers(r, hv, nh) : 0;
    wxg_dlq_record_t dr = {
        .topic = r->topic,
        .partition = r->partition,
        .offset = r->offset,
        .key = r->key,
        .key_len = r->key_len,
        .value = r->value,
        .value_len = r->value_len,
        .headers = hv,
        .header_count = nh,
        .timestamp_ms = r->timestamp_ms,
        .error = it->fail_code ? it->fail_code : WXG_EPLUGIN,
        .reason = it->fail_reason,
        .attempts = it->attempts,
        .first_failure_ms = it->first_failure_ms,
        .last_failure_ms = it->last_failure_ms,
        .idempotency_key = it->msg ? it->msg->key : NULL,
        .plugin = it->fail_plugin,
    };
    char err[256] = "";
    int rc = w->conf->dead_letter(w->conf->dead_letter_arg, &dr, err, sizeof err);
    free(hv);
    if (rc != 0) {
        wxg_counter_inc(w->m->dlq_errors);
        wxg_log(WXG_LOG_ERROR, "dlq_write_failed", WXG_LS("topic", r->topic),
                WXG_LI("partition", r->partition), WXG_LI("offset", r->offset), WXG_LERR(rc),
                WXG_LS("reason", err));
        /* Whatever the class, the record waits and its watermark holds: a poison answer (the
         * record is too large for the dead-letter topic) has nowhere else to go. */
        if (wxg_err_class(rc) == WXG_CLASS_FATAL)
            fatal(w, "dead_letter", rc, err);
        requeue(w, it, WXG__PL_DEAD_LETTER, infra_backoff(w, it));
        return 0;
    }
    it->errors = 0;
    wxg_counter_inc(w->m->dlq_writes);
    wxg_log(WXG_LOG_WARN, "dead_lettered", WXG_LS("topic", r->topic),
            WXG_LI("partition", r->partition), WXG_LI("offset", r->offset), WXG_LERR(dr.error),
            WXG_LU("attempts", it->attempts), WXG_LS("plugin", it->fail_plugin),
            WXG_LID("key", it->msg ? it->msg->key : NULL),
            WXG_LS("reason", it->fail_reason ? it->fail_reason : wxg_strerror(dr.error)));
    if (it->has_claim)
        return 1;
    finish(w, it);
    return 0;
}

static void stage_dead_letter(wxg__pl_worker_t *w)
{
    for (size_t k = 0; k < w->ndlq; k++) {
        wxg__pl_item_t *it = w->dlqv[k];
        it->phase = WXG__PL_DEAD_LETTER;
        if (dead_letter(w, it)) {
            it->phase = WXG__PL_FAIL_MARK; /* picked up by stage_fail_mark of this same run */
            w->failv[w->nfail++] = it;
        }
    }
}

/* The FAILED marks of what was dead-lettered; finished either way, since the dead letter is
 * durable. */
static void stage_fail_mark(wxg__pl_worker_t *w)
{
    size_t n = w->nfail;
    if (n == 0)
        return;
    fill_failures(w, w->failv, n);
    int rc = wxg_guard_fail_batch(w->g, w->failures, n, w->results);
    if (rc != 0) {
        guard_failed(w, WXG__PL_OP_FAIL, rc, n);
        for (size_t k = 0; k < n; k++)
            requeue(w, w->failv[k], WXG__PL_FAIL_MARK, infra_backoff(w, w->failv[k]));
        return;
    }
    guard_ok(w);
    for (size_t k = 0; k < n; k++) {
        if (w->results[k] == WXG_GUARD_LEASE_LOST)
            wxg_counter_inc(w->m->lease_lost);
        finish(w, w->failv[k]);
    }
}

/* Adds what the handle counted since the last run to the health figures and the metrics. */
static void count_guard_stats(wxg__pl_worker_t *w)
{
    wxg_guard_stats_t gs;
    wxg_guard_get_stats(w->g, &gs);
    atomic_fetch_add(&w->conf->health->round_trips, gs.round_trips - w->round_trips_seen);
    w->round_trips_seen = gs.round_trips;
    const uint64_t cl[WXG__PL_CL_N] = {gs.cluster_moved,     gs.cluster_ask,
                                       gs.cluster_tryagain,  gs.cluster_clusterdown,
                                       gs.cluster_refreshes, gs.cluster_node_errors};
    for (int i = 0; i < WXG__PL_CL_N; i++) {
        if (cl[i] != w->cluster_seen[i])
            wxg_counter_add(w->m->cluster[i], cl[i] - w->cluster_seen[i]);
        w->cluster_seen[i] = cl[i];
    }
}

int wxg__pipeline_run(wxg__pl_worker_t *w, void *const *items, size_t n, int64_t *out)
{
    w->out = out;
    w->fatal = 0;
    stage_sort(w, items, n);
    stage_claim(w);
    stage_plugins(w);
    stage_complete(w);
    stage_retry(w);
    stage_dead_letter(w);
    stage_fail_mark(w);

    count_guard_stats(w);
    return w->fatal;
}

/* ---- health ---- */

int wxg__pipeline_health_init(wxg__pl_health_t *h)
{
    h->err_text[0] = '\0';
    return pthread_mutex_init(&h->err_mu, NULL) == 0 ? 0 : -1;
}

void wxg__pipeline_health_destroy(wxg__pl_health_t *h)
{
    pthread_mutex_destroy(&h->err_mu);
}

void wxg__pipeline_health_error(wxg__pl_health_t *h, char *buf, size_t size)
{
    if (size == 0)
        return;
    pthread_mutex_lock(&h->err_mu);
    snprintf(buf, size, "%s", h->err_text);
    pthread_mutex_unlock(&h->err_mu);
}

/* ---- items ---- */

void wxg__pipeline_item_init(wxg__pl_item_t *it, wxg__pl_record_t *rec, const wxg_msg_view_t *msg)
{
    it->rec = rec;
    it->msg = msg;
    it->phase = WXG__PL_CLAIM;
}

int wxg__pipeline_item_park(wxg__pl_item_t *it, wxg__pl_record_t *rec, int code, const char *reason)
{
    if (wxg_err_class(code) != WXG_CLASS_POISON)
        return code ? code : WXG_EINVAL;
    it->rec = rec;
    it->msg = NULL;
    it->phase = WXG__PL_DEAD_LETTER;
    set_failure(it, code, NULL, reason);
    it->attempts = 1;
    return 0;
}

void wxg__pipeline_item_drop(const wxg__pipeline_conf_t *conf, wxg__pl_item_t *it)
{
    atomic_store(&it->done, 1);
    drop_claim(conf, it);
}

int wxg__pipeline_item_past_plugins(const wxg__pl_item_t *it)
{
    return it->phase != WXG__PL_CLAIM;
}

void wxg__pipeline_item_clear(wxg__pl_item_t *it)
{
    free(it->fail_reason);
    it->fail_reason = NULL;
}

/* ---- workers ---- */

void wxg__pipeline_worker_destroy(wxg__pl_worker_t *w)
{
    if (!w)
        return;
    wxg_plugin_thread_destroy(w->pt);
    wxg_guard_destroy(w->g);
    free(w->claimv);
    free(w->chainv);
    free(w->completev);
    free(w->retryv);
    free(w->dlqv);
    free(w->failv);
    free(w->donev);
    free(w->msgs);
    free(w->claims);
    free(w->tickets);
    free(w->results);
    free(w->dones);
    free(w->doneres);
    free(w->failures);
    free(w);
}

wxg__pl_worker_t *wxg__pipeline_worker_new(const wxg__pipeline_conf_t *conf, unsigned index,
                                           wxg_guard_t *g, wxg_plugin_thread_t *pt, char *errstr,
                                           size_t errstr_size)
{
    size_t b = conf->batch_max;
    wxg__pl_worker_t *w = calloc(1, sizeof *w);
    if (!w) {
        wxg_plugin_thread_destroy(pt);
        wxg_guard_destroy(g);
        goto fail;
    }
    w->conf = conf;
    w->m = conf->metrics;
    w->index = index;
    w->g = g;
    w->pt = pt;
    w->nplugins = wxg_plugin_chain_count(conf->chain);
    w->seed = (unsigned)time(NULL) ^ (index * 2654435761u);
    w->claimv = calloc(b, sizeof *w->claimv);
    w->chainv = calloc(b, sizeof *w->chainv);
    w->completev = calloc(b, sizeof *w->completev);
    w->retryv = calloc(b, sizeof *w->retryv);
    w->dlqv = calloc(b, sizeof *w->dlqv);
    w->failv = calloc(b, sizeof *w->failv);
    w->donev = calloc(b, sizeof *w->donev);
    w->msgs = calloc(b, sizeof *w->msgs);
    w->claims = calloc(b, sizeof *w->claims);
    w->tickets = calloc(b, sizeof *w->tickets);
    w->results = calloc(b, sizeof *w->results);
    w->dones = calloc(b, sizeof *w->dones);
    w->doneres = calloc(b, sizeof *w->doneres);
    w->failures = calloc(b, sizeof *w->failures);
    if (!w->claimv || !w->chainv || !w->completev || !w->retryv || !w->dlqv || !w->failv ||
        !w->donev || !w->msgs || !w->claims || !w->tickets || !w->results || !w->dones ||
        !w->doneres || !w->failures) {
        wxg__pipeline_worker_destroy(w);
        goto fail;
    }
    return w;
fail:
    wxg__errf(errstr, errstr_size, "pipeline: out of memory");
    return NULL;
}
