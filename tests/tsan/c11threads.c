/*
 * DESIGN: C11 threads for ThreadSanitizer builds only.
 *
 * Debian's librdkafka creates its threads and locks with glibc's C11 API (thrd_create,
 * mtx_lock, cnd_wait, call_once). The TSan runtimes of GCC 12 and clang 14 intercept only the
 * pthread functions, and glibc's C11 functions call its internal pthread code directly, so
 * TSan never sees librdkafka's threads start (the first allocation on such a thread then
 * crashes inside TSan) nor its locks (which would show up as false data races).
 *
 * These definitions, linked into every test program of a TSan build and exported from it,
 * take precedence over glibc's for librdkafka and forward each call to the pthread function
 * that TSan intercepts. glibc lays out mtx_t, cnd_t and once_flag exactly like
 * pthread_mutex_t, pthread_cond_t and pthread_once_t (its own C11 functions are thin wrappers
 * over the same storage), so the casts are sound on this platform.
 */
#if defined(__SANITIZE_THREAD__)
#define WXG_TSAN_SHIM 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WXG_TSAN_SHIM 1
#endif
#endif

#ifdef WXG_TSAN_SHIM
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

#define EXPORT __attribute__((visibility("default")))

_Static_assert(sizeof(mtx_t) == sizeof(pthread_mutex_t), "mtx_t is not a pthread mutex");
_Static_assert(sizeof(cnd_t) == sizeof(pthread_cond_t), "cnd_t is not a pthread condition");
_Static_assert(sizeof(once_flag) == sizeof(pthread_once_t), "once_flag is not a pthread once");

static int status(int rc)
{
    if (rc == 0)
        return thrd_success;
    if (rc == ENOMEM)
        return thrd_nomem;
    if (rc == EBUSY)
        return thrd_busy;
    if (rc == ETIMEDOUT)
        return thrd_timedout;
    return thrd_error;
}

struct start {
    thrd_start_t func;
    void *arg;
};

static void *trampoline(void *p)
{
    struct start s = *(struct start *)p;
    free(p);
    return (void *)(intptr_t)s.func(s.arg);
}

EXPORT int thrd_create(thrd_t *thr, thrd_start_t func, void *arg)
{
    struct start *s = malloc(sizeof *s);
    if (!s)
        return thrd_nomem;
    s->func = func;
    s->arg = arg;
    int rc = pthread_create(thr, NULL, trampoline, s);
    if (rc != 0)
        free(s);
    return status(rc);
}

EXPORT int thrd_join(thrd_t thr, int *res)
{
    void *ret = NULL;
    int rc = pthread_join(thr, &ret);
    if (rc == 0 && res)
        *res = (int)(intptr_t)ret;
    return status(rc);
}

EXPORT int mtx_init(mtx_t *m, int type)
{
    pthread_mutexattr_t attr;
    int rc = pthread_mutexattr_init(&attr);
    if (rc != 0)
        return status(rc);
    if (type & mtx_recursive)
        rc = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    if (rc == 0)
        rc = pthread_mutex_init((pthread_mutex_t *)m, &attr);
    pthread_mutexattr_destroy(&attr);
    return status(rc);
}

EXPORT void mtx_destroy(mtx_t *m)
{
    pthread_mutex_destroy((pthread_mutex_t *)m);
}

EXPORT int mtx_lock(mtx_t *m)
{
    return status(pthread_mutex_lock((pthread_mutex_t *)m));
}

EXPORT int mtx_trylock(mtx_t *m)
{
    return status(pthread_mutex_trylock((pthread_mutex_t *)m));
}

EXPORT int mtx_unlock(mtx_t *m)
{
    return status(pthread_mutex_unlock((pthread_mutex_t *)m));
}

EXPORT int cnd_init(cnd_t *c)
{
    return status(pthread_cond_init((pthread_cond_t *)c, NULL));
}

EXPORT void cnd_destroy(cnd_t *c)
{
    pthread_cond_destroy((pthread_cond_t *)c);
}

EXPORT int cnd_signal(cnd_t *c)
{
    return status(pthread_cond_signal((pthread_cond_t *)c));
}

EXPORT int cnd_broadcast(cnd_t *c)
{
    return status(pthread_cond_broadcast((pthread_cond_t *)c));
}

EXPORT int cnd_wait(cnd_t *c, mtx_t *m)
{
    return status(pthread_cond_wait((pthread_cond_t *)c, (pthread_mutex_t *)m));
}

EXPORT int cnd_timedwait(cnd_t *restrict c, mtx_t *restrict m, const struct timespec *restrict ts)
{
    return status(pthread_cond_timedwait((pthread_cond_t *)c, (pthread_mutex_t *)m, ts));
}

EXPORT void call_once(once_flag *flag, void (*func)(void))
{
    pthread_once((pthread_once_t *)flag, func);
}
#else
/* Not a TSan build: glibc's own C11 threads are used. ISO C wants at least one declaration. */
typedef int wxg_tsan_shim_unused_t;
#endif
