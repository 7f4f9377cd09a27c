/*
 * DESIGN: one partition's finished watermark (lib/offsets_int.h).
 *
 * Purpose: store only offsets below which every dispatched message is finished, whatever order
 * the workers finish in, and never let work from an earlier assignment move the watermark.
 *
 * Data: a ring of {offset, done} entries in dispatch order, from the oldest unfinished entry
 * (head) to the newest (tail). Finishing the head pops it and every finished entry behind it,
 * so the committable offset is the head's offset, or the highest dispatched offset + 1 when
 * the ring is empty. Gaps in the offsets need no entries at all. The ring grows by doubling and
 * is never shrunk within an assignment; a revoke drops a large ring so that the next
 * assignment starts small again.
 *
 * Threads and locks: none here. The tracker is the watermark part of its owner's
 * per-partition state (the consumer's `cpart`), and the owner's lock serialises every call; the
 * consumer used to keep a second table of partitions with locks of its own, and a worker
 * finishing a record took both. Epochs count per tracker: a ticket only ever meets the tracker
 * it came from.
 *
 * Failure modes: allocation failure returns WXG_ENOMEM and leaves the state as it was; a stale
 * or doubled finish is refused with a code and counted, never applied.
 */
#include "offsets_int.h"

#include <stdlib.h>
#include <string.h>

#include "err_int.h"
#include "wxguard/err.h"

#define RING_MIN 64u

typedef struct entry {
    int64_t offset;
    int32_t done;
} entry;

struct wxg__offsets_s {
    int assigned;
    uint64_t epoch;
    entry *ring;
    size_t cap;        /* power of two */
    uint64_t head;     /* seq of the oldest entry kept */
    uint64_t tail;     /* seq one past the newest entry */
    int64_t last;      /* highest dispatched offset, -1 before the first */
    size_t unfinished; /* entries in [head, tail) not done */
    int64_t reported;  /* committable last reported by wxg__offsets_advanced, -1 none */
    uint64_t dispatched, finished, stale, assigns, revokes;
};

wxg__offsets_t *wxg__offsets_new(char *errstr, size_t errstr_size)
{
    wxg__offsets_t *o = calloc(1, sizeof *o);
    if (!o)
        goto fail_alloc;
    o->ring = calloc(RING_MIN, sizeof *o->ring);
    if (!o->ring)
        goto fail_ring;
    o->cap = RING_MIN;
    o->last = -1;
    o->reported = -1;
    return o;

fail_ring:
    free(o);
fail_alloc:
    wxg__errf(errstr, errstr_size, "offsets: out of memory");
    return NULL;
}

void wxg__offsets_destroy(wxg__offsets_t *o)
{
    if (!o)
        return;
    free(o->ring);
    free(o);
}

/* Empties the window. */
static void reset(wxg__offsets_t *o)
{
    o->head = o->tail = 0;
    o->last = -1;
    o->unfinished = 0;
    o->reported = -1;
}

int wxg__offsets_assign(wxg__offsets_t *o, uint64_t *epoch)
{
    if (!o)
        return WXG_EINVAL;
    reset(o);
    o->epoch++;
    o->assigned = 1;
    o->assigns++;
    if (epoch)
        *epoch = o->epoch;
    return 0;
}

int wxg__offsets_revoke(wxg__offsets_t *o)
{
    if (!o || !o->assigned)
        return WXG_ENOTFOUND;
    o->assigned = 0;
    /* A fresh epoch, never handed out, makes every outstanding ticket stale at once. */
    o->epoch++;
    reset(o);
    /* A revoked partition keeps no big ring around: a later assign starts small. */
    if (o->cap > RING_MIN) {
        entry *small = calloc(RING_MIN, sizeof *small);
        if (small) {
            free(o->ring);
            o->ring = small;
            o->cap = RING_MIN;
        }
    }
    o->revokes++;
    return 0;
}

int wxg__offsets_is_assigned(const wxg__offsets_t *o)
{
    return o && o->assigned;
}

/* Doubles the ring, keeping every entry at seq & (cap - 1). */
static int ring_grow(wxg__offsets_t *o)
{
    size_t ncap = o->cap * 2;
    if (ncap < o->cap || ncap > SIZE_MAX / sizeof(entry))
        return WXG_ENOMEM;
    entry *n = calloc(ncap, sizeof *n);
    if (!n)
        return WXG_ENOMEM;
    for (uint64_t s = o->head; s < o->tail; s++)
        n[s & (ncap - 1)] = o->ring[s & (o->cap - 1)];
    free(o->ring);
    o->ring = n;
    o->cap = ncap;
    return 0;
}

int wxg__offsets_dispatch(wxg__offsets_t *o, int64_t offset, wxg__offsets_ticket_t *ticket)
{
    if (!o || !ticket || offset < 0)
        return WXG_EINVAL;
    if (!o->assigned)
        return WXG_ENOTFOUND;
    if (offset <= o->last)
        return WXG_ESTATE;
    if (o->tail - o->head == o->cap) {
        int rc = ring_grow(o);
        if (rc != 0)
            return rc;
    }
    uint64_t seq = o->tail++;
    o->ring[seq & (o->cap - 1)] = (entry){.offset = offset, .done = 0};
    o->last = offset;
    o->unfinished++;
    o->dispatched++;
    *ticket = (wxg__offsets_ticket_t){.epoch = o->epoch, .seq = seq, .offset = offset};
    return 0;
}

int wxg__offsets_finish(wxg__offsets_t *o, const wxg__offsets_ticket_t *ticket)
{
    if (!o || !ticket)
        return WXG_EINVAL;
    if (ticket->epoch != o->epoch || !o->assigned) {
        o->stale++;
        return WXG_ESTATE;
    }
    if (ticket->seq < o->head || ticket->seq >= o->tail)
        return WXG_EINVAL;
    entry *e = &o->ring[ticket->seq & (o->cap - 1)];
    if (e->offset != ticket->offset || e->done)
        return WXG_EINVAL;
    e->done = 1;
    o->unfinished--;
    while (o->head < o->tail && o->ring[o->head & (o->cap - 1)].done)
        o->head++;
    o->finished++;
    return 0;
}

int wxg__offsets_committable(const wxg__offsets_t *o, int64_t *offset)
{
    if (!o || !offset)
        return WXG_EINVAL;
    if (!o->assigned)
        return WXG_ENOTFOUND;
    if (o->last < 0)
        return WXG_ESTATE;
    *offset = o->head < o->tail ? o->ring[o->head & (o->cap - 1)].offset : o->last + 1;
    return 0;
}

size_t wxg__offsets_unfinished(const wxg__offsets_t *o)
{
    return o && o->assigned ? o->unfinished : 0;
}

size_t wxg__offsets_window(const wxg__offsets_t *o)
{
    return o && o->assigned ? (size_t)(o->tail - o->head) : 0;
}

int wxg__offsets_advanced(wxg__offsets_t *o, int64_t *offset)
{
    int64_t off;
    if (wxg__offsets_committable(o, &off) != 0 || off <= o->reported)
        return 0;
    o->reported = off;
    *offset = off;
    return 1;
}

void wxg__offsets_stats(const wxg__offsets_t *o, wxg__offsets_stats_t *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!o)
        return;
    out->dispatched = o->dispatched;
    out->finished = o->finished;
    out->stale_finishes = o->stale;
    out->assigns = o->assigns;
    out->revokes = o->revokes;
    out->assigned = o->assigned;
    out->unfinished = o->assigned ? o->unfinished : 0;
}
