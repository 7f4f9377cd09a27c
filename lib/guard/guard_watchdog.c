/*
 * DESIGN: the guard's renewal watchdog.
 *
 * Purpose: keeps the leases of long-running work alive, like Redisson's watchdog: one thread
 * with its own handle renews every registered claim every lease/3, all due ones in one
 * wxg_guard_renew_batch call, for at most max_extension_ms per registration. It stops renewing
 * a registration when the lease is lost, when the bound is reached, when the owner stops
 * touching it, or when renewals kept failing for longer than a lease. With probing on, the
 * thread also PINGs Redis while it has nothing to renew, so that an idle process still learns
 * that Redis went away. It works over any design's handle (wxg__guard_watchdog_new_on), which
 * is how the unit tests run it over the in-memory fake.
 *
 * Threads: the watchdog thread owns the handle; workers call add/remove/status/touch from any
 * thread. The registration list is guarded by one mutex, never held across network I/O: a
 * registration being renewed is marked busy, and if its owner removes it meanwhile the thread
 * frees it afterwards (orphan). Status flags, touch times and the contact figures are atomics,
 * read lock-free.
 *
 * Failure modes: a failed renewal batch changes no registration; each one is retried on the
 * next tick and turns UNSURE once a lease has passed without a success. Renewing never blocks a
 * worker: workers only read a registration's status before each side effect.
 */
#include "guard_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "clock_int.h"
#include "err_int.h"

struct wxg_guard_watch_s {
    struct wxg_guard_watch_s *prev, *next;
    char *key;
    size_t key_len;
    uint64_t fence;
    char owner[WXG_GUARD_OWNER_LEN + 1];
    atomic_int status;
    atomic_llong touched_ms;
    int64_t registered_ms; /* local monotonic clock */
    int64_t renewed_ms;    /* last successful renewal (or registration) */
    int busy;              /* being renewed by the thread right now (under mu) */
    int orphan;            /* removed by its owner while busy: the thread frees it */
};

struct wxg_guard_watchdog_s {
    wxg_guard_t *g;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    struct wxg_guard_watch_s *head;
    int64_t lease_ms, max_extension_ms, owner_timeout_ms;
    int64_t probe_ms; /* PING after this long without Redis contact; 0 = never (under mu) */
    atomic_ullong batches, renewals;
    /* The latest Redis contact of the thread (a renewal batch or a probe), in wxg__mono_ms().
     */
    atomic_llong contact_ok_ms, contact_err_ms;
    atomic_int contact_err;
    char contact_err_text[256]; /* the handle's text for that failure (under mu) */
};

/* Records the outcome of a renewal batch or a probe. Called by the thread without mu. */
static void watchdog_contact(wxg_guard_watchdog_t *wd, int rc)
{
    if (rc == 0) {
        atomic_store(&wd->contact_ok_ms, wxg__mono_ms());
    } else {
        pthread_mutex_lock(&wd->mu);
        snprintf(wd->contact_err_text, sizeof wd->contact_err_text, "%s",
                 wxg_guard_last_error(wd->g));
        pthread_mutex_unlock(&wd->mu);
        atomic_store(&wd->contact_err, rc);
        atomic_store(&wd->contact_err_ms, wxg__mono_ms());
    }
}

/* How long until the probe is due (0: now), or -1 when probing is off. Called with mu held. */
static int64_t watchdog_probe_in(wxg_guard_watchdog_t *wd, int64_t now)
{
    if (wd->probe_ms <= 0)
        return -1;
    int64_t ok = atomic_load(&wd->contact_ok_ms), bad = atomic_load(&wd->contact_err_ms);
    int64_t last = ok > bad ? ok : bad;
    int64_t due = last + wd->probe_ms - now;
    return due > 0 ? due : 0;
}

static void watch_free(struct wxg_guard_watch_s *w)
{
    free(w->key);
    free(w);
}

static void watch_unlink(wxg_guard_watchdog_t *wd, struct wxg_guard_watch_s *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        wd->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
}

/* Marks registrations that must no longer be renewed and collects the due ones (marked busy).
 * Called with mu held. Returns how many were collected into `due`. */
static size_t watchdog_collect(wxg_guard_watchdog_t *wd, struct wxg_guard_watch_s **due, size_t cap,
                               int64_t now)
{
    size_t n = 0;
    int64_t period = wd->lease_ms / 3 > 0 ? wd->lease_ms / 3 : 1;
    for (struct wxg_guard_watch_s *w = wd->head; w; w = w->next) {
        if (atomic_load(&w->status) != WXG_GUARD_WATCH_LIVE)
            continue;
        if (wd->owner_timeout_ms > 0 &&
            now - (int64_t)atomic_load(&w->touched_ms) > wd->owner_timeout_ms) {
            atomic_store(&w->status, WXG_GUARD_WATCH_ABANDONED);
            continue;
        }
        if (now - w->registered_ms >= wd->max_extension_ms) {
            atomic_store(&w->status, WXG_GUARD_WATCH_EXHAUSTED);
            continue;
        }
        if (now - w->renewed_ms > wd->lease_ms) {
            /* Renewals kept failing: the lease may have expired and someone else may own it. */
            atomic_store(&w->status, WXG_GUARD_WATCH_UNSURE);
            continue;
        }
        if (now - w->renewed_ms >= period && n < cap) {
            w->busy = 1;
            due[n++] = w;
        }
    }
    return n;
}

/* The thread's buffers for one renewal batch of at most cap registrations. */
typedef struct renew_buf {
    size_t cap;
    struct wxg_guard_watch_s **due;
    wxg_guard_ticket_t *t;
    int *res;
} renew_buf;

/* Renews the n collected registrations in one call, with mu released meanwhile, and records
 * the outcome in each. Called with mu held; returns with it held. */
static void watchdog_renew(wxg_guard_watchdog_t *wd, renew_buf *rb, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rb->t[i].key = rb->due[i]->key;
        rb->t[i].key_len = rb->due[i]->key_len;
        rb->t[i].fence = rb->due[i]->fence;
        memcpy(rb->t[i].owner, rb->due[i]->owner, sizeof rb->t[i].owner);
    }
    pthread_mutex_unlock(&wd->mu);
    int64_t sent_at = wxg__mono_ms();
    int rc = wxg_guard_renew_batch(wd->g, rb->t, n, rb->res);
    atomic_fetch_add(&wd->batches, 1);
    watchdog_contact(wd, rc);
    pthread_mutex_lock(&wd->mu);
    for (size_t i = 0; i < n; i++) {
        struct wxg_guard_watch_s *w = rb->due[i];
        w->busy = 0;
        if (w->orphan) {
            watch_free(w);
            continue;
        }
        if (rc != 0)
            continue; /* retried next tick; UNSURE once a lease passes without one */
        if (rb->res[i] == WXG_GUARD_OK) {
            /* Count the lease from when the request left, not when it came back. */
            w->renewed_ms = sent_at;
            atomic_fetch_add(&wd->renewals, 1);
        } else {
            atomic_store(&w->status, WXG_GUARD_WATCH_LOST);
        }
    }
}

/* Waits for the next tick, or probes Redis when a probe is due. Called with mu held; returns
 * with it held. */
static void watchdog_idle(wxg_guard_watchdog_t *wd, int64_t tick)
{
    /* With nothing to renew for a while, a PING keeps the thread's view of Redis fresh, so
     * that an idle process can still tell that Redis went away (readiness). The guard's
     * reconnect backoff bounds how often a dead server is dialled. */
    int64_t probe_in = watchdog_probe_in(wd, wxg__mono_ms());
    if (probe_in == 0) {
        pthread_mutex_unlock(&wd->mu);
        watchdog_contact(wd, wxg_guard_ping(wd->g));
        pthread_mutex_lock(&wd->mu);
        return;
    }
    struct timespec ts = wxg__mono_after(probe_in > 0 && probe_in < tick ? probe_in : tick);
    pthread_cond_timedwait(&wd->cv, &wd->mu, &ts);
}

static void *watchdog_main(void *arg)
{
    wxg_guard_watchdog_t *wd = arg;
    prctl(PR_SET_NAME, "wxg-watchdog", 0, 0, 0);
    renew_buf rb;
    rb.cap = (size_t)wxg__guard_conf(wd->g)->batch_max * 4;
    rb.due = calloc(rb.cap, sizeof *rb.due);
    rb.t = calloc(rb.cap, sizeof *rb.t);
    rb.res = calloc(rb.cap, sizeof *rb.res);
    /* Wake often enough that a registration is renewed between lease/3 and lease/2 after the
     * previous renewal. */
    int64_t tick = wd->lease_ms / 6 > 0 ? wd->lease_ms / 6 : 1;
    pthread_mutex_lock(&wd->mu);
    while (!wd->stop) {
        size_t n =
            (rb.due && rb.t && rb.res) ? watchdog_collect(wd, rb.due, rb.cap, wxg__mono_ms()) : 0;
        if (n > 0) {
            watchdog_renew(wd, &rb, n);
            if (n == rb.cap)
                continue; /* more may be due */
        }
        if (wd->stop)
            break;
        watchdog_idle(wd, tick);
    }
    pthread_mutex_unlock(&wd->mu);
    free(rb.due);
    free(rb.t);
    free(rb.res);
    return NULL;
}

/* Initialises the mutex and the condition variable (on the monotonic clock). */
static int watchdog_locks(wxg_guard_watchdog_t *wd, char *errstr, size_t errstr_size)
{
    if (pthread_mutex_init(&wd->mu, NULL) != 0) {
        wxg__errf(errstr, errstr_size, "pthread_mutex_init failed");
        return WXG_ENOMEM;
    }
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) {
        wxg__errf(errstr, errstr_size, "pthread_condattr_init failed");
        goto fail_cond;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int crc = pthread_cond_init(&wd->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (crc != 0) {
        wxg__errf(errstr, errstr_size, "pthread_cond_init failed");
        goto fail_cond;
    }
    return 0;

fail_cond:
    pthread_mutex_destroy(&wd->mu);
    return WXG_ENOMEM;
}

wxg_guard_watchdog_t *wxg__guard_watchdog_new_on(wxg_guard_t *g, int64_t max_extension_ms,
                                                 int64_t owner_timeout_ms, char *errstr,
                                                 size_t errstr_size)
{
    wxg_guard_watchdog_t *wd = calloc(1, sizeof *wd);
    if (!wd) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto fail_alloc;
    }
    wd->g = g;
    wd->lease_ms = wxg__guard_conf(g)->lease_ms;
    wd->max_extension_ms = max_extension_ms > 0 ? max_extension_ms : 10 * wd->lease_ms;
    wd->owner_timeout_ms = owner_timeout_ms > 0 ? owner_timeout_ms : 0;
    atomic_init(&wd->batches, 0);
    atomic_init(&wd->renewals, 0);
    /* The handle has just connected: that is the first contact. */
    atomic_init(&wd->contact_ok_ms, wxg__mono_ms());
    atomic_init(&wd->contact_err_ms, 0);
    atomic_init(&wd->contact_err, 0);
    if (watchdog_locks(wd, errstr, errstr_size) != 0)
        goto fail_locks;
    if (pthread_create(&wd->thread, NULL, watchdog_main, wd) != 0) {
        wxg__errf(errstr, errstr_size, "cannot start the watchdog thread");
        goto fail_thread;
    }
    return wd;

fail_thread:
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
fail_locks:
    free(wd);
fail_alloc:
    wxg_guard_destroy(g);
    return NULL;
}

wxg_guard_watchdog_t *wxg_guard_watchdog_new(const wxg_guard_conf_t *conf, int64_t max_extension_ms,
                                             int64_t owner_timeout_ms, int *err, char *errstr,
                                             size_t errstr_size)
{
    int rc = 0;
    wxg_guard_watchdog_t *wd = NULL;
    wxg_guard_t *g = wxg_guard_new(conf, &rc, errstr, errstr_size);
    if (g) {
        wd = wxg__guard_watchdog_new_on(g, max_extension_ms, owner_timeout_ms, errstr, errstr_size);
        if (!wd)
            rc = WXG_ENOMEM;
    }
    if (err)
        *err = rc;
    return wd;
}

void wxg_guard_watchdog_destroy(wxg_guard_watchdog_t *wd)
{
    if (!wd)
        return;
    pthread_mutex_lock(&wd->mu);
    wd->stop = 1;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);
    while (wd->head) {
        struct wxg_guard_watch_s *w = wd->head;
        watch_unlink(wd, w);
        watch_free(w);
    }
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
    wxg_guard_destroy(wd->g);
    free(wd);
}

wxg_guard_watch_t *wxg_guard_watchdog_add(wxg_guard_watchdog_t *wd, const wxg_guard_ticket_t *t)
{
    if (!wd || !wxg__guard_ticket_valid(t))
        return NULL;
    struct wxg_guard_watch_s *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->key = malloc(t->key_len);
    if (!w->key) {
        free(w);
        return NULL;
    }
    memcpy(w->key, t->key, t->key_len);
    w->key_len = t->key_len;
    w->fence = t->fence;
    memcpy(w->owner, t->owner, sizeof w->owner);
    int64_t now = wxg__mono_ms();
    atomic_init(&w->status, WXG_GUARD_WATCH_LIVE);
    atomic_init(&w->touched_ms, now);
    w->registered_ms = now;
    w->renewed_ms = now;
    pthread_mutex_lock(&wd->mu);
    w->next = wd->head;
    if (wd->head)
        wd->head->prev = w;
    wd->head = w;
    pthread_mutex_unlock(&wd->mu);
    return w;
}

void wxg_guard_watchdog_remove(wxg_guard_watchdog_t *wd, wxg_guard_watch_t *w)
{
    if (!wd || !w)
        return;
    pthread_mutex_lock(&wd->mu);
    watch_unlink(wd, w);
    if (w->busy)
        w->orphan = 1;
    else
        watch_free(w);
    pthread_mutex_unlock(&wd->mu);
}

int wxg_guard_watch_status(const wxg_guard_watch_t *w)
{
    return atomic_load(&((wxg_guard_watch_t *)w)->status);
}

void wxg_guard_watch_touch(wxg_guard_watch_t *w)
{
    if (w)
        atomic_store(&w->touched_ms, wxg__mono_ms());
}

void wxg_guard_watchdog_counts(wxg_guard_watchdog_t *wd, uint64_t *batches, uint64_t *renewals)
{
    if (batches)
        *batches = atomic_load(&wd->batches);
    if (renewals)
        *renewals = atomic_load(&wd->renewals);
}

void wxg_guard_watchdog_probe(wxg_guard_watchdog_t *wd, int64_t every_ms)
{
    if (!wd)
        return;
    pthread_mutex_lock(&wd->mu);
    wd->probe_ms = every_ms > 0 ? every_ms : 0;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
}

void wxg_guard_watchdog_last_error(wxg_guard_watchdog_t *wd, char *buf, size_t size)
{
    if (!buf || size == 0)
        return;
    pthread_mutex_lock(&wd->mu);
    snprintf(buf, size, "%s", wd->contact_err_text);
    pthread_mutex_unlock(&wd->mu);
}

int wxg_guard_watchdog_health(wxg_guard_watchdog_t *wd, int64_t *ok_ms, int64_t *err_ms)
{
    /* The failure's code is stored before its time, so a reader that sees the time sees at
     * least that code (or a later failure's). */
    int64_t bad = atomic_load(&wd->contact_err_ms);
    int err = atomic_load(&wd->contact_err);
    if (ok_ms)
        *ok_ms = atomic_load(&wd->contact_ok_ms);
    if (err_ms)
        *err_ms = bad;
    return err;
}
