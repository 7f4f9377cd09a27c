/*
 * DESIGN: the near cache of DONE messages (lib/guard/donecache_int.h).
 *
 * Purpose: let a guard answer DUPLICATE for a message this process completed itself without
 * spending Redis CPU, the resource every replica shares. It is an optimisation only: a miss
 * costs nothing but the Redis call that would have happened anyway, so the cache may forget
 * entries whenever it likes (eviction), but it must never remember one longer than the caller
 * asked (expiry), because the caller chooses that expiry so that the cache never answers
 * DUPLICATE where Redis would not.
 *
 * Data: one array of fixed 32-byte slots {fingerprint, expiry, tag} in sets of
 * WXG__DONECACHE_WAYS. The set of a fingerprint comes from its first 8 bytes mixed with a random
 * per-cache seed (so that keys chosen to crowd one set cannot be precomputed), mapped onto the
 * set count by a multiply-shift, so the capacity need not be a power of two. A slot with expiry
 * 0 is empty. Replacement in a full set takes an expired slot, else the slot that expires first:
 * the guard inserts every entry with the same retention, so that is the oldest insert (FIFO),
 * which suits duplicates that mostly follow their original within minutes. Lookups do not
 * reorder anything, so they only read the set.
 *
 * Threads and locks: sets are guarded by a power-of-two number of striped mutexes (set index
 * modulo the stripe count); each stripe also holds its own counters, so statistics need no
 * atomics and no shared cache line is written by every lookup. A lock is held for the compares
 * of one set (8 slots, 4 cache lines) and never across anything else; no function takes two
 * locks, so there is no lock order. Stripes are padded to separate cache lines.
 *
 * Failure modes: only wxg__donecache_new() allocates; it returns NULL with a reason when out of
 * memory or asked for an absurd capacity. Lookups and inserts cannot fail.
 */
#include "donecache_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "err_int.h"

typedef struct slot {
    unsigned char fp[WXG__DONECACHE_FP_LEN];
    int64_t expires_ms; /* 0: empty */
    int16_t tag;
} slot;

typedef struct stripe {
    pthread_mutex_t mu;
    size_t used;
    uint64_t hits, misses, inserts, evictions;
} stripe;

/* A stripe on its own cache lines, so that two stripes' locks and counters never share one. */
typedef union stripe_pad {
    stripe s;
    unsigned char pad[128];
} stripe_pad;

struct wxg_donecache_s {
    size_t nsets;    /* 0: disabled */
    size_t nstripes; /* power of two */
    uint64_t seed;   /* mixed into the set selection */
    slot *slots;     /* nsets * WXG__DONECACHE_WAYS */
    stripe_pad *stripes;
    size_t memory_bytes;
};

_Static_assert(sizeof(slot) == 32, "a slot is 32 bytes (docs/guard.md states the memory)");
_Static_assert(sizeof(stripe) <= 128, "a stripe fits its padding");

static uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static size_t set_of(const wxg_donecache_t *c, const unsigned char fp[16])
{
    /* The fingerprint is already uniform; the seed and the multiply only keep an adversary who
     * knows the fingerprints from aiming many keys at one set. Multiply-shift maps the top 32
     * bits onto [0, nsets) without a division. */
    uint64_t h = (load64(fp) ^ c->seed) * 0x9e3779b97f4a7c15ULL;
    return (size_t)(((h >> 32) * (uint64_t)c->nsets) >> 32);
}

static stripe *stripe_of(wxg_donecache_t *c, size_t set)
{
    return &c->stripes[set & (c->nstripes - 1)].s;
}

wxg_donecache_t *wxg__donecache_new(size_t entries, char *errstr, size_t errstr_size)
{
    wxg_donecache_t *c = NULL;
    size_t inited = 0;
    if (entries > WXG__DONECACHE_MAX_ENTRIES) {
        if (errstr && errstr_size)
            wxg__errf(errstr, errstr_size, "done cache: %zu entries is above the limit of %zu",
                      entries, WXG__DONECACHE_MAX_ENTRIES);
        return NULL;
    }
    c = calloc(1, sizeof *c);
    if (!c)
        goto fail_nomem;
    c->memory_bytes = sizeof *c;
    if (entries == 0)
        return c;
    c->nsets = (entries + WXG__DONECACHE_WAYS - 1) / WXG__DONECACHE_WAYS;
    c->nstripes = 1;
    while (c->nstripes < WXG__DONECACHE_STRIPES && c->nstripes < c->nsets)
        c->nstripes <<= 1;
    if (getrandom(&c->seed, sizeof c->seed, GRND_NONBLOCK) != (ssize_t)sizeof c->seed) {
        /* Without entropy the seed only loses its protection against crowded sets. */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        c->seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)c;
    }
    size_t nslots = c->nsets * WXG__DONECACHE_WAYS;
    c->slots = calloc(nslots, sizeof *c->slots);
    c->stripes = calloc(c->nstripes, sizeof *c->stripes);
    if (!c->slots || !c->stripes)
        goto fail_nomem;
    for (inited = 0; inited < c->nstripes; inited++) {
        if (pthread_mutex_init(&c->stripes[inited].s.mu, NULL) != 0)
            goto fail_mutex;
    }
    c->memory_bytes += nslots * sizeof *c->slots + c->nstripes * sizeof *c->stripes;
    return c;

fail_mutex:
    if (errstr && errstr_size)
        wxg__errf(errstr, errstr_size, "done cache: cannot create a mutex");
    goto fail;
fail_nomem:
    if (errstr && errstr_size)
        wxg__errf(errstr, errstr_size, "done cache: out of memory for %zu entries", entries);
fail:
    if (c) {
        for (size_t i = 0; i < inited; i++)
            pthread_mutex_destroy(&c->stripes[i].s.mu);
        free(c->stripes);
        free(c->slots);
        free(c);
    }
    return NULL;
}

void wxg__donecache_destroy(wxg_donecache_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->stripes && i < c->nstripes; i++)
        pthread_mutex_destroy(&c->stripes[i].s.mu);
    free(c->stripes);
    free(c->slots);
    free(c);
}

int wxg__donecache_lookup(wxg_donecache_t *c, const unsigned char fp[16], int64_t now_ms, int *tag)
{
    if (!c || c->nsets == 0 || !fp)
        return 0;
    size_t set = set_of(c, fp);
    stripe *st = stripe_of(c, set);
    const slot *s = &c->slots[set * WXG__DONECACHE_WAYS];
    int found = 0;
    pthread_mutex_lock(&st->mu);
    for (size_t w = 0; w < WXG__DONECACHE_WAYS; w++) {
        if (s[w].expires_ms > now_ms && memcmp(s[w].fp, fp, WXG__DONECACHE_FP_LEN) == 0) {
            if (tag)
                *tag = s[w].tag;
            found = 1;
            break;
        }
    }
    if (found)
        st->hits++;
    else
        st->misses++;
    pthread_mutex_unlock(&st->mu);
    return found;
}

void wxg__donecache_insert(wxg_donecache_t *c, const unsigned char fp[16], int tag,
                           int64_t expires_ms, int64_t now_ms)
{
    if (!c || c->nsets == 0 || !fp || expires_ms <= now_ms || expires_ms <= 0)
        return;
    size_t set = set_of(c, fp);
    stripe *st = stripe_of(c, set);
    slot *s = &c->slots[set * WXG__DONECACHE_WAYS];
    pthread_mutex_lock(&st->mu);
    /* The same fingerprint anywhere in the set wins (a message completed again after its
     * retention, or a cached entry that expired); then an empty or expired slot; then the slot
     * that expires first. */
    slot *same = NULL, *dead = NULL, *first = &s[0];
    for (size_t w = 0; w < WXG__DONECACHE_WAYS; w++) {
        if (s[w].expires_ms != 0 && memcmp(s[w].fp, fp, WXG__DONECACHE_FP_LEN) == 0) {
            same = &s[w];
            break;
        }
        if (!dead && s[w].expires_ms <= now_ms)
            dead = &s[w];
        if (s[w].expires_ms < first->expires_ms)
            first = &s[w];
    }
    slot *to = same ? same : dead ? dead : first;
    if (to->expires_ms == 0)
        st->used++;
    else if (!same && to->expires_ms > now_ms)
        st->evictions++;
    memcpy(to->fp, fp, WXG__DONECACHE_FP_LEN);
    to->expires_ms = expires_ms;
    to->tag = (int16_t)tag;
    st->inserts++;
    pthread_mutex_unlock(&st->mu);
}

void wxg__donecache_stats(wxg_donecache_t *c, wxg__donecache_stats_t *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    out->capacity = c->nsets * WXG__DONECACHE_WAYS;
    out->memory_bytes = c->memory_bytes;
    for (size_t i = 0; i < c->nstripes && c->nsets > 0; i++) {
        stripe *st = &c->stripes[i].s;
        pthread_mutex_lock(&st->mu);
        out->used += st->used;
        out->hits += st->hits;
        out->misses += st->misses;
        out->inserts += st->inserts;
        out->evictions += st->evictions;
        pthread_mutex_unlock(&st->mu);
    }
}
