/*
 * Internal to libwxguard: the clocks every module reads. Monotonic time for deadlines, backoffs
 * and latencies (never goes back, unaffected by clock changes); wall time only where a value is
 * shown to people or compared with another host (Unix ms). Any thread.
 */
#ifndef WXG_CLOCK_INT_H
#define WXG_CLOCK_INT_H

#include <stdint.h>
#include <time.h>

static inline int64_t wxg__mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t wxg__mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t wxg__wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif /* WXG_CLOCK_INT_H */
