/*
 * DESIGN: the per-partition finished-watermark tracker (include/wxguard/offsets.h).
 *
 * Purpose: store only offsets below which every dispatched message is finished, whatever order
 * the workers finish in, and never let work from an earlier assignment move a watermark.
 *
 * Data: a hash table (open addressing, never shrinks) maps topic/partition to a partition
 * record. A record holds a ring of {offset, done} entries in dispatch order, from the oldest
 * unfinished entry (head) to the newest (tail). Finishing the head pops it and every finished
 * entry behind it, so the committable offset is the head's offset, or the highest dispatched
 * offset + 1 when the ring is empty. Gaps in the offsets need no entries at all. The ring grows
 * by doubling and is never shrunk within an assignment (a new assignment starts small again).
 *
 * Threads and locks: the poll thread is the only one that inserts records or grows the table;
 * it does so under `table_mu`, which readers from other threads (stats, queries) also take.
 * Every record has its own mutex guarding its ring, epoch and counters; workers finishing
 * tickets take only that mutex. Lock order: table_mu before a partition mutex, never the
 * reverse. Records live until the tracker is destroyed, so tickets never dangle.
 *
 * Failure modes: allocation failure returns WXG_ENOMEM and leaves the state as it was; a stale
 * or doubled finish is refused with a code and counted, never applied.
 */
#include "wxguard/offsets.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wxguard/err.h"

#define RING_MIN 64u

typedef struct entry {
    int64_t offset;
    int32_t done;
} entry;

struct wxg_offsets_part_s {
    pthread_mutex_t mu;
    wxg_offsets_t *owner;
    char *topic;
    int32_t partition;
    int assigned;
    uint64_t epoch;
    entry *ring;
    size_t cap;        /* power of two */
    uint64_t head;     /* seq of the oldest entry kept */
    uint64_t tail;     /* seq one past the newest entry */
    int64_t last;      /* highest dispatched offset, -1 before the first */
    size_t unfinished; /* entries in [head, tail) not done */
    int64_t reported;  /* committable last reported by foreach_advanced, -1 none */
};

struct wxg_offsets_s {
    pthread_mutex_t table_mu;
    wxg_offsets_part_t **slots;
    size_t nslots; /* power of two */
    size_t nparts;
    uint64_t next_epoch;
    atomic_uint_fast64_t dispatched;
    atomic_uint_fast64_t finished;
    atomic_uint_fast64_t stale;
    atomic_uint_fast64_t assigns;
    atomic_uint_fast64_t revokes;
};

static uint64_t part_hash(const char *topic, int32_t partition)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const unsigned char *s = (const unsigned char *)topic; *s; s++) {
        h ^= *s;
        h *= 1099511628211ULL;
    }
    h ^= (uint64_t)(uint32_t)partition;
    h *= 1099511628211ULL;
    return h ^ (h >> 29);
}

/* @locks table_mu held (or poll thread, the only writer) */
static wxg_offsets_part_t *table_find(const wxg_offsets_t *o, const char *topic, int32_t partition)
{
    size_t mask = o->nslots - 1;
    for (size_t i = part_hash(topic, partition) & mask;; i = (i + 1) & mask) {
        wxg_offsets_part_t *p = o->slots[i];
        if (!p)
            return NULL;
        if (p->partition == partition && strcmp(p->topic, topic) == 0)
            return p;
    }
}

static void table_put(wxg_offsets_part_t **slots, size_t nslots, wxg_offsets_part_t *p)
{
    size_t mask = nslots - 1;
    size_t i = part_hash(p->topic, p->partition) & mask;
    while (slots[i])
        i = (i + 1) & mask;
    slots[i] = p;
}

static wxg_offsets_part_t *lookup(wxg_offsets_t *o, const char *topic, int32_t partition)
{
    pthread_mutex_lock(&o->table_mu);
    wxg_offsets_part_t *p = table_find(o, topic, partition);
    pthread_mutex_unlock(&o->table_mu);
    return p;
}

wxg_offsets_t *wxg_offsets_new(char *errstr, size_t errstr_size)
{
    wxg_offsets_t *o = calloc(1, sizeof *o);
    if (!o)
        goto fail_alloc;
    o->nslots = 64;
    o->slots = calloc(o->nslots, sizeof *o->slots);
    if (!o->slots)
        goto fail_slots;
    if (pthread_mutex_init(&o->table_mu, NULL) != 0)
        goto fail_mutex;
    o->next_epoch = 1;
    return o;

fail_mutex:
    free(o->slots);
fail_slots:
    free(o);
fail_alloc:
    if (errstr && errstr_size)
        snprintf(errstr, errstr_size, "offsets: out of memory");
    return NULL;
}

void wxg_offsets_destroy(wxg_offsets_t *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->nslots; i++) {
        wxg_offsets_part_t *p = o->slots[i];
        if (!p)
            continue;
        pthread_mutex_destroy(&p->mu);
        free(p->ring);
        free(p->topic);
        free(p);
    }
    free(o->slots);
    pthread_mutex_destroy(&o->table_mu);
    free(o);
}

/* Inserts a new record, growing the table first when it is half full.
 * @locks takes table_mu @locality poll thread */
static int part_create(wxg_offsets_t *o, const char *topic, int32_t partition,
                       wxg_offsets_part_t **out)
{
    int rc = WXG_ENOMEM;
    wxg_offsets_part_t *p = calloc(1, sizeof *p);
    if (!p)
        goto out;
    p->topic = strdup(topic);
    if (!p->topic)
        goto fail_topic;
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        goto fail_mutex;
    p->owner = o;
    p->partition = partition;
    p->last = -1;
    p->reported = -1;

    pthread_mutex_lock(&o->table_mu);
    if ((o->nparts + 1) * 2 > o->nslots) {
        size_t n = o->nslots * 2;
        wxg_offsets_part_t **slots = calloc(n, sizeof *slots);
        if (!slots) {
            pthread_mutex_unlock(&o->table_mu);
            goto fail_grow;
        }
        for (size_t i = 0; i < o->nslots; i++) {
            if (o->slots[i])
                table_put(slots, n, o->slots[i]);
        }
        free(o->slots);
        o->slots = slots;
        o->nslots = n;
    }
    table_put(o->slots, o->nslots, p);
    o->nparts++;
    pthread_mutex_unlock(&o->table_mu);
    *out = p;
    rc = 0;
    goto out;

fail_grow:
    pthread_mutex_destroy(&p->mu);
fail_mutex:
    free(p->topic);
fail_topic:
    free(p);
out:
    return rc;
}

/* Empties the window of a record. @locks p->mu held */
static void part_reset(wxg_offsets_part_t *p)
{
    p->head = p->tail = 0;
    p->last = -1;
    p->unfinished = 0;
    p->reported = -1;
}

int wxg_offsets_assign(wxg_offsets_t *o, const char *topic, int32_t partition, uint64_t *epoch)
{
    if (!o || !topic || partition < 0)
        return WXG_EINVAL;
    wxg_offsets_part_t *p = lookup(o, topic, partition);
    if (!p) {
        int rc = part_create(o, topic, partition, &p);
        if (rc != 0)
            return rc;
    }
    pthread_mutex_lock(&p->mu);
    if (!p->ring) {
        p->ring = calloc(RING_MIN, sizeof *p->ring);
        if (!p->ring) {
            pthread_mutex_unlock(&p->mu);
            return WXG_ENOMEM;
        }
        p->cap = RING_MIN;
    }
    part_reset(p);
    p->epoch = o->next_epoch++;
    p->assigned = 1;
    if (epoch)
        *epoch = p->epoch;
    pthread_mutex_unlock(&p->mu);
    atomic_fetch_add(&o->assigns, 1);
    return 0;
}

int wxg_offsets_revoke(wxg_offsets_t *o, const char *topic, int32_t partition)
{
    if (!o || !topic)
        return WXG_EINVAL;
    wxg_offsets_part_t *p = lookup(o, topic, partition);
    if (!p)
        return WXG_ENOTFOUND;
    int rc = WXG_ENOTFOUND;
    pthread_mutex_lock(&p->mu);
    if (p->assigned) {
        p->assigned = 0;
        /* A fresh epoch, never handed out, makes every outstanding ticket stale at once. */
        p->epoch = o->next_epoch++;
        part_reset(p);
        /* A revoked partition keeps no big ring around: a later assign starts small. */
        if (p->cap > RING_MIN) {
            entry *small = calloc(RING_MIN, sizeof *small);
            if (small) {
                free(p->ring);
                p->ring = small;
                p->cap = RING_MIN;
            }
        }
        rc = 0;
    }
    pthread_mutex_unlock(&p->mu);
    if (rc == 0)
        atomic_fetch_add(&o->revokes, 1);
    return rc;
}

int wxg_offsets_is_assigned(wxg_offsets_t *o, const char *topic, int32_t partition)
{
    if (!o || !topic)
        return 0;
    wxg_offsets_part_t *p = lookup(o, topic, partition);
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    int a = p->assigned;
    pthread_mutex_unlock(&p->mu);
    return a;
}

/* Doubles the ring, keeping every entry at seq & (cap - 1). @locks p->mu held */
static int ring_grow(wxg_offsets_part_t *p)
{
    size_t ncap = p->cap * 2;
    if (ncap < p->cap || ncap > SIZE_MAX / sizeof(entry))
        return WXG_ENOMEM;
    entry *n = calloc(ncap, sizeof *n);
    if (!n)
        return WXG_ENOMEM;
    for (uint64_t s = p->head; s < p->tail; s++)
        n[s & (ncap - 1)] = p->ring[s & (p->cap - 1)];
    free(p->ring);
    p->ring = n;
    p->cap = ncap;
    return 0;
}

int wxg_offsets_dispatch(wxg_offsets_t *o, const char *topic, int32_t partition, int64_t offset,
                         wxg_offsets_ticket_t *ticket)
{
    if (!o || !topic || !ticket || offset < 0)
        return WXG_EINVAL;
    wxg_offsets_part_t *p = lookup(o, topic, partition);
    if (!p)
        return WXG_ENOTFOUND;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (!p->assigned) {
        rc = WXG_ENOTFOUND;
        goto out;
    }
    if (offset <= p->last) {
        rc = WXG_ESTATE;
        goto out;
    }
    if (p->tail - p->head == p->cap) {
        rc = ring_grow(p);
        if (rc != 0)
            goto out;
    }
    uint64_t seq = p->tail++;
    p->ring[seq & (p->cap - 1)] = (entry){.offset = offset, .done = 0};
    p->last = offset;
    p->unfinished++;
    ticket->part = p;
    ticket->epoch = p->epoch;
    ticket->seq = seq;
    ticket->offset = offset;
out:
    pthread_mutex_unlock(&p->mu);
    if (rc == 0)
        atomic_fetch_add(&o->dispatched, 1);
    return rc;
}

int wxg_offsets_finish(const wxg_offsets_ticket_t *ticket)
{
    if (!ticket || !ticket->part)
        return WXG_EINVAL;
    wxg_offsets_part_t *p = ticket->part;
    wxg_offsets_t *o = p->owner;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (ticket->epoch != p->epoch || !p->assigned) {
        rc = WXG_ESTATE;
        goto out;
    }
    if (ticket->seq < p->head || ticket->seq >= p->tail) {
        rc = WXG_EINVAL;
        goto out;
    }
    entry *e = &p->ring[ticket->seq & (p->cap - 1)];
    if (e->offset != ticket->offset || e->done) {
        rc = WXG_EINVAL;
        goto out;
    }
    e->done = 1;
    p->unfinished--;
    while (p->head < p->tail && p->ring[p->head & (p->cap - 1)].done)
        p->head++;
out:
    pthread_mutex_unlock(&p->mu);
    if (rc == 0)
        atomic_fetch_add(&o->finished, 1);
    else if (rc == WXG_ESTATE)
        atomic_fetch_add(&o->stale, 1);
    return rc;
}

/* @locks p->mu held */
static int part_committable(const wxg_offsets_part_t *p, int64_t *offset)
{
    if (p->last < 0)
        return WXG_ESTATE;
    *offset = p->head < p->tail ? p->ring[p->head & (p->cap - 1)].offset : p->last + 1;
    return 0;
}

int wxg_offsets_committable(wxg_offsets_t *o, const char *topic, int32_t partition, int64_t *offset)
{
    if (!o || !topic || !offset)
        return WXG_EINVAL;
    wxg_offsets_part_t *p = lookup(o, topic, partition);
    if (!p)
        return WXG_ENOTFOUND;
    pthread_mutex_lock(&p->mu);
    int rc = p->assigned ? part_committable(p, offset) : WXG_ENOTFOUND;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

size_t wxg_offsets_unfinished(wxg_offsets_t *o, const char *topic, int32_t partition)
{
    if (!o || !topic)
        return 0;
    wxg_offsets_part_t *p = lookup(o, topic, partition);
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    size_t n = p->assigned ? p->unfinished : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

size_t wxg_offsets_window(wxg_offsets_t *o, const char *topic, int32_t partition)
{
    if (!o || !topic)
        return 0;
    wxg_offsets_part_t *p = lookup(o, topic, partition);
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    size_t n = p->assigned ? (size_t)(p->tail - p->head) : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Walks the table by index; the poll thread is the only writer, so dropping table_mu between
 * slots is safe for it (and the callback may not assign or revoke). */
static size_t foreach_part(wxg_offsets_t *o, wxg_offsets_advanced_fn fn, void *opaque,
                           int only_advanced)
{
    size_t calls = 0;
    if (!o || !fn)
        return 0;
    pthread_mutex_lock(&o->table_mu);
    size_t nslots = o->nslots;
    pthread_mutex_unlock(&o->table_mu);
    for (size_t i = 0; i < nslots; i++) {
        pthread_mutex_lock(&o->table_mu);
        wxg_offsets_part_t *p = o->slots[i];
        pthread_mutex_unlock(&o->table_mu);
        if (!p)
            continue;
        int64_t off = -1;
        pthread_mutex_lock(&p->mu);
        int ok =
            p->assigned && part_committable(p, &off) == 0 && (!only_advanced || off > p->reported);
        uint64_t epoch = p->epoch;
        pthread_mutex_unlock(&p->mu);
        if (!ok)
            continue;
        calls++;
        if (fn(opaque, p->topic, p->partition, off, epoch) != 0)
            continue;
        pthread_mutex_lock(&p->mu);
        if (p->epoch == epoch && off > p->reported)
            p->reported = off;
        pthread_mutex_unlock(&p->mu);
    }
    return calls;
}

size_t wxg_offsets_foreach_advanced(wxg_offsets_t *o, wxg_offsets_advanced_fn fn, void *opaque)
{
    return foreach_part(o, fn, opaque, 1);
}

size_t wxg_offsets_foreach_committable(wxg_offsets_t *o, wxg_offsets_advanced_fn fn, void *opaque)
{
    return foreach_part(o, fn, opaque, 0);
}

void wxg_offsets_stats(wxg_offsets_t *o, wxg_offsets_stats_t *out)
{
    if (!o || !out)
        return;
    memset(out, 0, sizeof *out);
    out->dispatched = atomic_load(&o->dispatched);
    out->finished = atomic_load(&o->finished);
    out->stale_finishes = atomic_load(&o->stale);
    out->assigns = atomic_load(&o->assigns);
    out->revokes = atomic_load(&o->revokes);
    pthread_mutex_lock(&o->table_mu);
    for (size_t i = 0; i < o->nslots; i++) {
        wxg_offsets_part_t *p = o->slots[i];
        if (!p)
            continue;
        pthread_mutex_lock(&p->mu);
        if (p->assigned) {
            out->assigned++;
            out->unfinished += p->unfinished;
        }
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&o->table_mu);
}
