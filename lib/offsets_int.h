/*
 * Internal to libwxguard: one partition's finished watermark (lib/offsets.c), kept in the
 * consumer's partition table. No program uses it, so it is not public.
 *
 * The consumer hands every record it dispatches from a partition to that partition's tracker
 * (in poll order, so offsets rise within one assignment, possibly with gaps left by compaction
 * or transaction markers) and gets a ticket back. A worker marks the ticket finished once the
 * message is DONE, a DUPLICATE, or durably parked in the dead-letter topic, in any order. The
 * committable offset is the lowest dispatched offset not yet finished, or the highest
 * dispatched offset + 1 when everything is finished: the next offset a new owner must read. It
 * never moves backwards within an assignment and gaps never hold it back.
 *
 * Assignment epochs: every assign gets a new epoch, and revoking bumps the epoch again. A
 * ticket remembers the epoch it was issued under; finishing a ticket whose epoch is no longer
 * current (the partition was revoked, or revoked and assigned again meanwhile) is ignored and
 * counted, so late work can never move the watermark of an assignment it does not belong to.
 *
 * Threads and locks: the tracker takes no lock. It is one part of its owner's per-partition
 * state, and the owner serialises every call with that state's lock (the consumer's partition
 * mutex, lib/consumer.c), so that one lock covers the watermark and everything kept beside it.
 * Keep the tracker until no ticket of it can be finished any more.
 *
 * Cost: dispatch and finish are O(1) amortised (a ring of entries that grows by doubling;
 * finished entries leave from its head). Memory is 16 bytes per offset between the watermark
 * and the highest dispatched offset; wxg__offsets_window() reports that span so the owner can
 * pause a partition whose head is stuck.
 */
#ifndef WXG_OFFSETS_INT_H
#define WXG_OFFSETS_INT_H

#include <stddef.h>
#include <stdint.h>

typedef struct wxg__offsets_s wxg__offsets_t;

/* What a worker needs to finish one dispatched offset (with the tracker it came from). A plain
 * value: copy it freely. */
typedef struct wxg__offsets_ticket {
    uint64_t epoch; /* assignment epoch the offset was dispatched under */
    uint64_t seq;   /* position in the ring */
    int64_t offset;
} wxg__offsets_ticket_t;

/* Counters since creation (monotonic) and the state now. */
typedef struct wxg__offsets_stats {
    uint64_t dispatched;     /* offsets handed out */
    uint64_t finished;       /* finishes that counted */
    uint64_t stale_finishes; /* finishes for an epoch no longer current: ignored */
    uint64_t assigns;
    uint64_t revokes;
    int assigned;      /* 1 while assigned */
    size_t unfinished; /* dispatched and not finished in this assignment */
} wxg__offsets_stats_t;

/* Creates a tracker for one partition, not assigned. NULL (and errstr filled) on allocation
 * failure. */
wxg__offsets_t *wxg__offsets_new(char *errstr, size_t errstr_size);

/* Frees the tracker; its tickets are invalid afterwards. NULL is accepted. */
void wxg__offsets_destroy(wxg__offsets_t *o);

/* Starts a new assignment: forgets any earlier window and returns the new epoch in *epoch (may
 * be NULL). Assigning while assigned starts a new epoch too (tickets of the old one become
 * stale). 0, WXG_EINVAL or WXG_ENOMEM. */
int wxg__offsets_assign(wxg__offsets_t *o, uint64_t *epoch);

/* Ends the current assignment: later finishes of its tickets are stale. Returns 0, or
 * WXG_ENOTFOUND when not assigned. */
int wxg__offsets_revoke(wxg__offsets_t *o);

/* 1 while assigned, else 0. */
int wxg__offsets_is_assigned(const wxg__offsets_t *o);

/* Records that `offset` was dispatched and fills *ticket. Offsets must rise within an
 * assignment; an offset at or below the highest dispatched one returns WXG_ESTATE (a re-fetch
 * of something already in hand: the caller skips it). WXG_ENOTFOUND when not assigned,
 * WXG_ENOMEM when the ring cannot grow. */
int wxg__offsets_dispatch(wxg__offsets_t *o, int64_t offset, wxg__offsets_ticket_t *ticket);

/* Marks a ticket of this tracker finished. Returns 0 when it counted, WXG_ESTATE when the
 * ticket's epoch is no longer current (ignored, counted as stale), WXG_EINVAL for a ticket
 * finished twice or never issued. */
int wxg__offsets_finish(wxg__offsets_t *o, const wxg__offsets_ticket_t *ticket);

/* The committable offset in *offset: the lowest unfinished dispatched offset, else the highest
 * dispatched + 1. Returns 0, WXG_ENOTFOUND when not assigned, or WXG_ESTATE when nothing was
 * dispatched in this assignment (no position known yet). */
int wxg__offsets_committable(const wxg__offsets_t *o, int64_t *offset);

/* Dispatched-but-unfinished offsets of the assignment (0 when not assigned). */
size_t wxg__offsets_unfinished(const wxg__offsets_t *o);

/* Entries held: offsets dispatched from the watermark up to the highest dispatched, finished
 * or not (0 when not assigned). */
size_t wxg__offsets_window(const wxg__offsets_t *o);

/* Returns 1 with the committable offset in *offset when it moved past what this function last
 * reported in this assignment (and remembers it as reported), else 0: what is left to store. */
int wxg__offsets_advanced(wxg__offsets_t *o, int64_t *offset);

void wxg__offsets_stats(const wxg__offsets_t *o, wxg__offsets_stats_t *out);

#endif /* WXG_OFFSETS_INT_H */
