/*
 * The monotonic clock of the programs in cmd/: deadlines, progress intervals and measured
 * durations (never goes back, unaffected by clock changes). Header-only, so that a program that
 * does not link libwxguard (wxguard-devbroker) can use it too. The library's own copy is
 * lib/clock_int.h, which cmd/ may not include. Any thread; no state.
 */
#ifndef WXG_PROGCLOCK_H
#define WXG_PROGCLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t prog_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t prog_mono_ms(void)
{
    return prog_mono_us() / 1000;
}

#endif /* WXG_PROGCLOCK_H */
