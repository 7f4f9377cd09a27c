/*
 * Internal to libwxguard: a bounded LIFO list of same-size blocks kept for reuse.
 *
 * Why: the consumer's poll thread allocates a few blocks per record (the decoded batch, the
 * record's bookkeeping) and frees them thousands of records later, in roughly the order it
 * allocated them. Blocks of a few KiB are past glibc's per-thread cache, so each malloc and free
 * went through the shared bins, splitting and merging chunks and growing and trimming the heap:
 * about a fifth of the poll thread's CPU in a perf profile (bench/e2e.md). A list of freed
 * blocks of one size turns both into a pointer swap.
 *
 * Rules: a list has no lock; it belongs to one thread at a time (or to an object that one thread
 * at a time uses). It holds at most `max` blocks; a push beyond that is refused and the caller
 * frees the block. Blocks must be at least a pointer in size and aligned for one; while a block
 * is on the list its first pointer-sized bytes hold the link.
 *
 * Checkers: under AddressSanitizer nothing is kept, so every block goes back to free() and ASan
 * still sees every lifetime. Under valgrind a kept block is marked inaccessible except for its
 * link, and undefined again when it is handed out, so a use after release is still reported.
 */
#ifndef WXG_RECYCLE_INT_H
#define WXG_RECYCLE_INT_H

#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define WXG__RECYCLE_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WXG__RECYCLE_OFF 1
#endif
#endif
#ifndef WXG__RECYCLE_OFF
#define WXG__RECYCLE_OFF 0
#endif

#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define WXG__RECYCLE_VG 1
#endif
#endif
#ifndef WXG__RECYCLE_VG
#define WXG__RECYCLE_VG 0
#endif

typedef struct wxg__recycle {
    void *head;
    size_t count;
    size_t max;
} wxg__recycle_t;

/* A kept block of `size` bytes (contents undefined), or NULL when the list is empty. */
static inline void *wxg__recycle_pop(wxg__recycle_t *r, size_t size)
{
    void *p = r->head;
    if (p == NULL)
        return NULL;
    memcpy(&r->head, p, sizeof r->head);
    r->count--;
#if WXG__RECYCLE_VG
    VALGRIND_MAKE_MEM_UNDEFINED(p, size);
#else
    (void)size;
#endif
    return p;
}

/* Keeps p (a block of `size` bytes) for reuse. Returns 1 when kept, 0 when the list is full or
 * disabled: the caller then frees p itself. */
static inline int wxg__recycle_push(wxg__recycle_t *r, void *p, size_t size)
{
    if (WXG__RECYCLE_OFF || r->count >= r->max)
        return 0;
    memcpy(p, &r->head, sizeof r->head);
#if WXG__RECYCLE_VG
    if (size > sizeof r->head)
        VALGRIND_MAKE_MEM_NOACCESS((char *)p + sizeof r->head, size - sizeof r->head);
#else
    (void)size;
#endif
    r->head = p;
    r->count++;
    return 1;
}

/* Frees every kept block. */
static inline void wxg__recycle_drain(wxg__recycle_t *r)
{
    void *p;
    while ((p = wxg__recycle_pop(r, sizeof p)) != NULL)
        free(p);
}

#endif /* WXG_RECYCLE_INT_H */
