/*
 * Internal to libwxguard: the clocks every module reads. Monotonic time for deadlines, backoffs
 * and latencies (never goes back, unaffected by clock changes); wall time only where a value is
 * shown to people or compared with another host (Unix ms). Any thread; no state.
 *
 * Every condition variable in lib/ that waits with a timeout is made with
 * pthread_condattr_setclock(CLOCK_MONOTONIC), so its absolute deadlines come from the same
 * clock: wxg__mono_after() and wxg__mono_timespec() build them.
 *
 * The programs in cmd/ see only the public API; their copy is cmd/common/progclock.h.
 */
#ifndef WXG_CLOCK_INT_H
#define WXG_CLOCK_INT_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

static inline int64_t wxg__mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t wxg__mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t wxg__wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The monotonic time `abs_us` (a wxg__mono_us() value) as a timespec. */
static inline struct timespec wxg__mono_timespec(int64_t abs_us)
{
    struct timespec ts = {.tv_sec = (time_t)(abs_us / 1000000),
                          .tv_nsec = (long)(abs_us % 1000000) * 1000L};
    return ts;
}

/* The monotonic time `ms` milliseconds from now (negative: now), as a timespec. */
static inline struct timespec wxg__mono_after(int64_t ms)
{
    return wxg__mono_timespec(wxg__mono_us() + (ms > 0 ? ms : 0) * 1000);
}

/* Sleeps `ms` milliseconds (nothing for ms <= 0), resuming after signals. */
static inline void wxg__sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

#endif /* WXG_CLOCK_INT_H */
