/*
 * A test plugin whose effect lands at the start of a slow call, as when a request to another
 * service is acted on at once but answered late: it appends one JSON line to a ledger, then
 * sleeps. Built as a shared object and loaded by path (descriptor name "sloweffect").
 *
 * The line has the fields of the record plugin's ledger that the tests read (key, msg_id,
 * fence, attempt, topic, partition, offset, plugin, time_ms, pid), written in one write() to a
 * file opened with O_APPEND, so that replicas can share the ledger.
 *
 * With it a test sees the crash window of a slow plugin: a replica killed between the effect
 * and the plugin's sub-marker (or, for the last plugin, the DONE) leaves an effect that the
 * next owner repeats.
 *
 * Configuration (plugin.sloweffect.*):
 *   path      the ledger to append to (required)
 *   delay.ms  how long to sleep after the line is written, 0..60000 (default 10)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wxguard/plugin.h"

typedef struct slow_state {
    int fd;
    int64_t delay_ms;
} slow_state;

static void slow_destroy(void *state)
{
    slow_state *s = state;
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    free(s);
}

static int slow_init(const wxg_plugin_conf_t *conf, void **state, char *errstr, size_t errstr_size)
{
    static const char *const known[] = {"path", "delay.ms", NULL};
    int rc = wxg_plugin_conf_check_keys(conf, known, errstr, errstr_size);
    if (rc != 0)
        return rc;
    const char *path = wxg_plugin_conf_get(conf, "path");
    if (!path || !*path) {
        snprintf(errstr, errstr_size, "plugin.sloweffect.path: required");
        return WXG_ECONFIG;
    }
    slow_state *s = calloc(1, sizeof *s);
    if (!s)
        return WXG_ENOMEM;
    rc = wxg_plugin_conf_get_int64(conf, "delay.ms", 10, 0, 60000, &s->delay_ms, errstr,
                                   errstr_size);
    if (rc != 0) {
        free(s);
        return rc;
    }
    s->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (s->fd < 0) {
        snprintf(errstr, errstr_size, "plugin.sloweffect.path: cannot open %s: %s", path,
                 strerror(errno));
        free(s);
        return WXG_ECONFIG;
    }
    *state = s;
    return 0;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static wxg_plugin_result_t slow_handle(void *state, void *thread_state, const wxg_msg_view_t *msg,
                                       wxg_plugin_ctx_t *ctx)
{
    (void)thread_state;
    slow_state *s = state;
    char line[1024];
    /* The test's keys and ids are plain ASCII: no escaping needed. */
    int n = snprintf(line, sizeof line,
                     "{\"key\":\"%s\",\"msg_id\":\"%s\",\"fence\":%llu,\"attempt\":%u,"
                     "\"topic\":\"%s\",\"partition\":%d,\"offset\":%lld,\"plugin\":\"sloweffect\","
                     "\"time_ms\":%lld,\"pid\":%ld}\n",
                     wxg_plugin_ctx_key(ctx), msg->msg_id ? msg->msg_id : "",
                     (unsigned long long)wxg_plugin_ctx_fence(ctx),
                     (unsigned)wxg_plugin_ctx_attempt(ctx), wxg_plugin_ctx_topic(ctx),
                     (int)wxg_plugin_ctx_partition(ctx), (long long)wxg_plugin_ctx_offset(ctx),
                     (long long)wall_ms(), (long)getpid());
    if (n <= 0 || (size_t)n >= sizeof line || write(s->fd, line, (size_t)n) != n) {
        wxg_plugin_ctx_set_reason(ctx, "sloweffect: cannot write the ledger");
        return WXG_PLUGIN_RETRY;
    }
    if (s->delay_ms > 0) {
        struct timespec d = {.tv_sec = s->delay_ms / 1000,
                             .tv_nsec = (long)(s->delay_ms % 1000) * 1000000L};
        while (nanosleep(&d, &d) != 0 && errno == EINTR)
            ;
    }
    return WXG_PLUGIN_OK;
}

static const wxg_plugin_desc_t slow_desc = {
    .abi_version = WXG_PLUGIN_ABI_VERSION,
    .name = "sloweffect",
    .init = slow_init,
    .handle = slow_handle,
    .destroy = slow_destroy,
};

WXG_PLUGIN_EXPORT const wxg_plugin_desc_t *wxg_plugin_entry(void);
WXG_PLUGIN_EXPORT const wxg_plugin_desc_t *wxg_plugin_entry(void)
{
    return &slow_desc;
}
