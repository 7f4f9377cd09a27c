/*
 * Internal to libwxguard: the near cache of DONE messages (lib/guard/donecache.c), a fixed-size,
 * process-local memory of the messages this process itself completed, so that a duplicate
 * delivery of one of them is answered DUPLICATE without a Redis call (docs/guard.md §10). The
 * consumer makes it and the guard's Lua design reads and fills it; no program uses it, so it is
 * not public. Its type keeps the public name wxg_donecache_t because the guard's public
 * configuration carries it as an opaque pointer.
 *
 * Entries are keyed by a 16-byte fingerprint (the guard passes the first 16 bytes of the SHA-256
 * of the idempotency key, mixed with the identity of its Redis prefix) and hold the 16-bit
 * payload tag the DONE marker carries plus an expiry. The cache is set-associative: a key can
 * live only in the WXG__DONECACHE_WAYS slots of the set its fingerprint selects; inserting into
 * a full set replaces an expired entry, else the one that expires first (the oldest, since every
 * insert of a process uses the same retention). Nothing is allocated after wxg__donecache_new().
 *
 * Memory: 32 bytes per entry slot (capacity rounded up to a multiple of WXG__DONECACHE_WAYS)
 * plus 128 bytes per lock stripe (at most WXG__DONECACHE_STRIPES, i.e. 32 KiB); 65,536 entries
 * take 2 MiB + 32 KiB.
 *
 * Times are milliseconds on one monotonic clock chosen by the caller (the guard uses
 * CLOCK_MONOTONIC); every call on one cache must use the same clock. An entry is live while
 * now_ms < its expiry.
 *
 * Threads: every function but new and destroy may be called from any number of threads at
 * once. Sets are guarded by striped mutexes held only for the few compares of one set, never
 * across I/O. destroy must not run concurrently with any other call on the cache.
 */
#ifndef WXG_DONECACHE_INT_H
#define WXG_DONECACHE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/err.h"

/* The same declaration as in include/wxguard/guard.h (C11 allows the repeat), so that this
 * module does not include the guard's header while the guard includes this one. */
typedef struct wxg_donecache_s wxg_donecache_t;

/* Bytes of the fingerprint an entry is keyed by. */
#define WXG__DONECACHE_FP_LEN 16
/* Slots per set. */
#define WXG__DONECACHE_WAYS 8
/* Most lock stripes a cache uses (fewer when it has fewer sets). */
#define WXG__DONECACHE_STRIPES 256
/* Largest capacity accepted by wxg__donecache_new() (about 2 GiB of slots). */
#define WXG__DONECACHE_MAX_ENTRIES ((size_t)1 << 26)

/* A cache of `entries` slots (rounded up to a multiple of WXG__DONECACHE_WAYS). entries = 0
 * gives a disabled cache: every lookup misses and every insert is ignored, so a caller need not
 * special-case it. Returns NULL with a reason in errstr for entries above
 * WXG__DONECACHE_MAX_ENTRIES or when out of memory. The caller owns the cache; free it with
 * wxg__donecache_destroy() after every user (e.g. every guard handle configured with it). */
wxg_donecache_t *wxg__donecache_new(size_t entries, char *errstr, size_t errstr_size);

/* Frees the cache. NULL is accepted. */
void wxg__donecache_destroy(wxg_donecache_t *c);

/* Looks `fp` up. Returns 1 and sets *tag (may be NULL) to the stored payload tag when a live
 * entry (expiry > now_ms) holds it, else 0. NULL `c` is a miss. */
int wxg__donecache_lookup(wxg_donecache_t *c, const unsigned char fp[16], int64_t now_ms, int *tag);

/* Remembers `fp` with `tag` (a 16-bit value, stored as int16_t) until expires_ms. An existing entry
 * of the same fingerprint is overwritten; otherwise a free or expired slot of its set is used, else
 * the set's entry that expires first is evicted (counted in stats.evictions). An entry whose expiry
 * is not after now_ms is not stored. NULL `c` is ignored. */
void wxg__donecache_insert(wxg_donecache_t *c, const unsigned char fp[16], int tag,
                           int64_t expires_ms, int64_t now_ms);

/* Counters since creation and the current occupancy. */
typedef struct wxg__donecache_stats {
    size_t capacity;     /* entry slots (0: disabled) */
    size_t used;         /* slots holding an entry (some may have expired and await reuse) */
    size_t memory_bytes; /* bytes allocated by the cache */
    uint64_t hits;       /* lookups that found a live entry */
    uint64_t misses;     /* lookups that did not */
    uint64_t inserts;    /* entries stored (new or overwritten) */
    uint64_t evictions;  /* live entries displaced before their expiry by an insert */
} wxg__donecache_stats_t;

/* Fills *out (consistent per lock stripe, not across stripes). Any thread. NULL `c` gives
 * zeros. */
void wxg__donecache_stats(wxg_donecache_t *c, wxg__donecache_stats_t *out);

#endif /* WXG_DONECACHE_INT_H */
