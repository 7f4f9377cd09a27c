/*
 * Per-partition finished-watermark tracker.
 *
 * The consumer hands every record it dispatches to the tracker (in poll order, so offsets rise
 * within one assignment, possibly with gaps left by compaction or transaction markers) and gets
 * a ticket back. A worker marks the ticket finished once the message is DONE, a DUPLICATE, or
 * durably parked in the dead-letter topic, in any order. The committable offset of a partition
 * is the lowest dispatched offset not yet finished, or the highest dispatched offset + 1 when
 * everything is finished: the next offset a new owner must read. It never moves backwards
 * within an assignment and gaps never hold it back.
 *
 * Assignment epochs: every assign of a partition gets a new epoch, and revoking it bumps the
 * epoch again. A ticket remembers the epoch it was issued under; finishing a ticket whose epoch
 * is no longer current (the partition was revoked, or revoked and assigned again meanwhile) is
 * ignored and counted, so late work can never move the watermark of an assignment it does not
 * belong to.
 *
 * Threads and locks:
 *   - One thread (the poll thread) calls assign, revoke, dispatch, committable and
 *     foreach_advanced. These take the tracker's table lock and the partition's lock.
 *   - Any thread may call wxg_offsets_finish() and the read-only queries; finish takes only the
 *     lock of the ticket's partition (workers on different partitions never contend).
 *   - Partition records are never freed before wxg_offsets_destroy(), so a ticket stays safe to
 *     finish after its partition was revoked. Destroy only after every worker has stopped.
 *
 * Cost: dispatch and finish are O(1) amortised (a ring of entries per partition that grows by
 * doubling; finished entries leave from its head). Memory per partition is 16 bytes per offset
 * between the watermark and the highest dispatched offset; wxg_offsets_window() reports that
 * span so the caller can pause a partition whose head is stuck.
 */
#ifndef WXGUARD_OFFSETS_H
#define WXGUARD_OFFSETS_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"

typedef struct wxg_offsets_s wxg_offsets_t;
typedef struct wxg_offsets_part_s wxg_offsets_part_t;

/* What a worker needs to finish one dispatched offset. A plain value: copy it freely. */
typedef struct wxg_offsets_ticket {
    wxg_offsets_part_t *part; /* owned by the tracker; valid until wxg_offsets_destroy() */
    uint64_t epoch;           /* assignment epoch the offset was dispatched under */
    uint64_t seq;             /* position in the partition's ring */
    int64_t offset;
} wxg_offsets_ticket_t;

/* Counters of the whole tracker (monotonic since creation). */
typedef struct wxg_offsets_stats {
    uint64_t dispatched;     /* offsets handed out */
    uint64_t finished;       /* finishes that counted */
    uint64_t stale_finishes; /* finishes for an epoch no longer current: ignored */
    uint64_t assigns;
    uint64_t revokes;
    size_t assigned;   /* partitions assigned now */
    size_t unfinished; /* dispatched and not finished, over assigned partitions */
} wxg_offsets_stats_t;

/* Creates an empty tracker. NULL (and errstr filled) on allocation failure. */
WXG_EXPORT wxg_offsets_t *wxg_offsets_new(char *errstr, size_t errstr_size);

/* Frees the tracker and every partition record; invalidates every ticket. NULL is accepted.
 * @locality no other thread may use the tracker or a ticket during or after this call */
WXG_EXPORT void wxg_offsets_destroy(wxg_offsets_t *o);

/* Starts a new assignment of topic/partition: forgets any earlier window and returns the new
 * epoch in *epoch (may be NULL). Assigning an already assigned partition starts a new epoch too
 * (tickets of the old one become stale). `topic` is copied. 0, WXG_EINVAL or WXG_ENOMEM.
 * @locality poll thread */
WXG_EXPORT int wxg_offsets_assign(wxg_offsets_t *o, const char *topic, int32_t partition,
                                  uint64_t *epoch);

/* Ends the current assignment: later finishes of its tickets are stale. Returns 0, or
 * WXG_ENOTFOUND when the partition is not assigned. @locality poll thread */
WXG_EXPORT int wxg_offsets_revoke(wxg_offsets_t *o, const char *topic, int32_t partition);

/* 1 when topic/partition is assigned now, else 0. @locality any thread */
WXG_EXPORT int wxg_offsets_is_assigned(wxg_offsets_t *o, const char *topic, int32_t partition);

/* Records that `offset` was dispatched and fills *ticket. Offsets must rise within an
 * assignment; an offset at or below the highest dispatched one returns WXG_ESTATE (a re-fetch of
 * something already in hand: the caller skips it). WXG_ENOTFOUND when not assigned, WXG_ENOMEM
 * when the ring cannot grow. @locality poll thread */
WXG_EXPORT int wxg_offsets_dispatch(wxg_offsets_t *o, const char *topic, int32_t partition,
                                    int64_t offset, wxg_offsets_ticket_t *ticket);

/* Marks a ticket finished. Returns 0 when it counted, WXG_ESTATE when the ticket's epoch is no
 * longer current (ignored, counted as stale), WXG_EINVAL for a ticket finished twice or never
 * issued. @locality any thread; takes only the partition's lock */
WXG_EXPORT int wxg_offsets_finish(const wxg_offsets_ticket_t *ticket);

/* The committable offset of an assigned partition in *offset: the lowest unfinished dispatched
 * offset, else the highest dispatched + 1. Returns 0, WXG_ENOTFOUND when not assigned, or
 * WXG_ESTATE when nothing was dispatched in this assignment (no position known yet).
 * @locality any thread */
WXG_EXPORT int wxg_offsets_committable(wxg_offsets_t *o, const char *topic, int32_t partition,
                                       int64_t *offset);

/* Number of dispatched-but-unfinished offsets of an assigned partition (0 when not assigned).
 * @locality any thread */
WXG_EXPORT size_t wxg_offsets_unfinished(wxg_offsets_t *o, const char *topic, int32_t partition);

/* Entries held for an assigned partition: offsets dispatched from the watermark up to the
 * highest dispatched, finished or not (0 when not assigned). @locality any thread */
WXG_EXPORT size_t wxg_offsets_window(wxg_offsets_t *o, const char *topic, int32_t partition);

/* Called by wxg_offsets_foreach_advanced() for each assigned partition whose committable offset
 * moved past what was last reported. Return 0 to record `offset` as reported, non-zero to
 * report it again next time. Runs with no tracker lock held; it must not call assign/revoke. */
typedef int (*wxg_offsets_advanced_fn)(void *opaque, const char *topic, int32_t partition,
                                       int64_t offset, uint64_t epoch);

/* Reports advanced watermarks (see above). Returns the number of callbacks made.
 * @locality poll thread */
WXG_EXPORT size_t wxg_offsets_foreach_advanced(wxg_offsets_t *o, wxg_offsets_advanced_fn fn,
                                               void *opaque);

/* Calls fn for every assigned partition with its committable offset, whether it advanced or not
 * (partitions with nothing dispatched are skipped). Used for a final synchronous commit.
 * Returns the number of callbacks made. @locality poll thread */
WXG_EXPORT size_t wxg_offsets_foreach_committable(wxg_offsets_t *o, wxg_offsets_advanced_fn fn,
                                                  void *opaque);

/* Snapshot of the counters. @locality any thread */
WXG_EXPORT void wxg_offsets_stats(wxg_offsets_t *o, wxg_offsets_stats_t *out);

#endif /* WXGUARD_OFFSETS_H */
