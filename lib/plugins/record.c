/*
 * DESIGN: the `record` built-in plugin, an append-only ledger of executed effects.
 *
 * Every call of handle appends one JSON line to a file, so that "how many times did the effect
 * of message K happen" can be counted afterwards by anyone (the end-to-end tests, the run
 * command's summary, an operator). Fields:
 *
 *   key, account, conversation, sender, msg_id (string or null), type, create_time, is_group,
 *   payload_hash (hex SHA-256), fence, attempt, topic, partition, offset, plugin ("record"),
 *   time_ms (wall clock, ms since the epoch), pid, and with include.content=true: content
 *   (and content_truncated when it was cut to keep the line short).
 * Integers are written exactly (never through a double); msg_id stays a string.
 *
 * Configuration (plugin.record.*):
 *   path               file to append to (required); created with mode 0644 when missing
 *   fsync              never (default) | always | interval. "never" leaves durability to the
 *                      page cache, which survives a process crash (SIGKILL) but not a machine
 *                      crash; "always" fdatasyncs after each line; "interval" fdatasyncs when the
 *                      last sync is older than fsync.interval.ms (checked on each line, and at
 *                      shutdown)
 *   fsync.interval.ms  1..3600000, default 1000
 *   include.content    true | false (default): also write the message text (personal data!)
 *   lock               true | false (default): take flock(LOCK_EX) around each write, for
 *                      file systems where O_APPEND is not atomic (NFS)
 *
 * Several replicas (processes) may append to one file. The file is opened with O_APPEND and
 * each line goes out in ONE write() call: on a local file system the kernel moves the end of
 * file and copies the bytes under the inode's lock, so lines never interleave. Lines are kept
 * under RECORD_LINE_MAX (below PIPE_BUF) by cutting the optional content, so even the weaker
 * pipe guarantee would hold. With lock=true a process-wide mutex (threads share the file
 * description, which flock does not separate) plus flock cover other file systems.
 *
 * Failures: a failed or short write, or a failed sync under fsync=always, returns RETRY with
 * the reason (the message is retried, and this plugin's effect with it). A short write is
 * followed by a lone newline so that the torn fragment stays on a line of its own, which a
 * reader skips because it is not valid JSON. A sync failure after a whole line means the line
 * may be there twice after the retry; a reader counting effects should know that an I/O error
 * was reported in the log.
 *
 * Threads: handle runs on every worker at once; it shares the descriptor and, with lock=true,
 * the mutex. The last-sync time is an atomic, and one thread at a time wins the right to sync.
 */
#include "plugin_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "clock_int.h"

#define RECORD_LINE_MAX 4000 /* bytes, newline included; PIPE_BUF is 4096 on Linux */

enum fsync_policy { FSYNC_NEVER, FSYNC_ALWAYS, FSYNC_INTERVAL };

typedef struct record_state {
    int fd;
    char *path;
    enum fsync_policy fsync;
    int64_t fsync_interval_ms;
    int include_content;
    int lock;
    pthread_mutex_t mu; /* only with lock=true */
    atomic_llong last_sync_ms;
} record_state;

static void record_destroy(void *state)
{
    record_state *s = state;
    if (!s)
        return;
    if (s->fd >= 0) {
        if (s->fsync != FSYNC_NEVER)
            fdatasync(s->fd);
        close(s->fd);
    }
    if (s->lock)
        pthread_mutex_destroy(&s->mu);
    free(s->path);
    free(s);
}

static int record_init(const wxg_plugin_conf_t *conf, void **state, char *errstr,
                       size_t errstr_size)
{
    static const char *const known[] = {"path", "fsync", "fsync.interval.ms", "include.content",
                                        "lock", NULL};
    int rc = wxg_plugin_conf_check_keys(conf, known, errstr, errstr_size);
    if (rc != 0)
        return rc;
    record_state *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    s->fd = -1;
    const char *path = wxg_plugin_conf_get(conf, "path");
    const char *policy = wxg_plugin_conf_get(conf, "fsync");
    if (!path || !*path) {
        snprintf(errstr, errstr_size,
                 "plugin.record.path: required (the ledger file to append to)");
        rc = WXG_ECONFIG;
        goto fail;
    }
    if (!policy || strcmp(policy, "never") == 0) {
        s->fsync = FSYNC_NEVER;
    } else if (strcmp(policy, "always") == 0) {
        s->fsync = FSYNC_ALWAYS;
    } else if (strcmp(policy, "interval") == 0) {
        s->fsync = FSYNC_INTERVAL;
    } else {
        snprintf(errstr, errstr_size,
                 "plugin.record.fsync: '%s' is not one of never, always, interval", policy);
        rc = WXG_ECONFIG;
        goto fail;
    }
    if ((rc = wxg_plugin_conf_get_int64(conf, "fsync.interval.ms", 1000, 1, 3600000,
                                        &s->fsync_interval_ms, errstr, errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_bool(conf, "include.content", 0, &s->include_content, errstr,
                                       errstr_size)) != 0 ||
        (rc = wxg_plugin_conf_get_bool(conf, "lock", 0, &s->lock, errstr, errstr_size)) != 0)
        goto fail;
    if (!(s->path = strdup(path))) {
        snprintf(errstr, errstr_size, "out of memory");
        rc = WXG_ENOMEM;
        goto fail;
    }
    if (s->lock && pthread_mutex_init(&s->mu, NULL) != 0) {
        s->lock = 0;
        snprintf(errstr, errstr_size, "cannot create a mutex");
        rc = WXG_ENOMEM;
        goto fail;
    }
    s->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (s->fd < 0) {
        snprintf(errstr, errstr_size, "plugin.record.path: cannot open '%s' for appending: %s",
                 path, strerror(errno));
        rc = WXG_ECONFIG;
        goto fail;
    }
    atomic_store(&s->last_sync_ms, wxg__mono_ms());
    *state = s;
    return 0;

fail:
    record_destroy(s);
    return rc;
}

static int add_raw_int(cJSON *o, const char *name, const char *fmt_value)
{
    return cJSON_AddRawToObject(o, name, fmt_value) != NULL;
}

static const char *or_empty(const char *s)
{
    return s ? s : "";
}

/* Builds the line (without content when content_cap is 0) into a malloc'd string. */
static char *build_line(const record_state *s, const wxg_msg_view_t *msg, wxg_plugin_ctx_t *ctx,
                        int64_t now_ms, size_t content_cap, int *truncated)
{
    char num[32];
    char hash[65];
    char *out = NULL;
    char *content = NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    for (int i = 0; i < 32; i++)
        snprintf(hash + 2 * i, 3, "%02x", msg->payload_hash[i]);
    int ok = cJSON_AddStringToObject(o, "key", wxg_plugin_ctx_key(ctx)) &&
             cJSON_AddStringToObject(o, "account", or_empty(msg->account)) &&
             cJSON_AddStringToObject(o, "conversation", or_empty(msg->conversation)) &&
             cJSON_AddStringToObject(o, "sender", or_empty(msg->sender)) &&
             (msg->msg_id ? cJSON_AddStringToObject(o, "msg_id", msg->msg_id) != NULL
                          : cJSON_AddNullToObject(o, "msg_id") != NULL) &&
             cJSON_AddStringToObject(o, "type", or_empty(msg->type));
    snprintf(num, sizeof num, "%" PRId64, msg->create_time);
    ok = ok && add_raw_int(o, "create_time", num) &&
         cJSON_AddBoolToObject(o, "is_group", msg->is_group != 0) &&
         cJSON_AddStringToObject(o, "payload_hash", hash);
    snprintf(num, sizeof num, "%" PRIu64, wxg_plugin_ctx_fence(ctx));
    ok = ok && add_raw_int(o, "fence", num);
    snprintf(num, sizeof num, "%" PRIu32, wxg_plugin_ctx_attempt(ctx));
    ok = ok && add_raw_int(o, "attempt", num) &&
         cJSON_AddStringToObject(o, "topic", wxg_plugin_ctx_topic(ctx));
    snprintf(num, sizeof num, "%" PRId32, wxg_plugin_ctx_partition(ctx));
    ok = ok && add_raw_int(o, "partition", num);
    snprintf(num, sizeof num, "%" PRId64, wxg_plugin_ctx_offset(ctx));
    ok = ok && add_raw_int(o, "offset", num) && cJSON_AddStringToObject(o, "plugin", "record");
    snprintf(num, sizeof num, "%" PRId64, now_ms);
    ok = ok && add_raw_int(o, "time_ms", num);
    snprintf(num, sizeof num, "%ld", (long)getpid());
    ok = ok && add_raw_int(o, "pid", num);
    if (ok && content_cap > 0) {
        size_t len = msg->content_len < content_cap ? msg->content_len : content_cap;
        *truncated = len < msg->content_len;
        /* Do not split a UTF-8 character when cutting. */
        while (*truncated && len > 0 && ((unsigned char)msg->content[len] & 0xC0) == 0x80)
            len--;
        content = malloc(len + 1);
        if (!content) {
            ok = 0;
        } else {
            for (size_t i = 0; i < len; i++)
                content[i] = msg->content[i] == '\0' ? ' ' : msg->content[i];
            content[len] = '\0';
            ok = cJSON_AddStringToObject(o, "content", content) != NULL;
            if (ok && *truncated)
                ok = cJSON_AddBoolToObject(o, "content_truncated", 1) != NULL;
        }
    }
    if (ok)
        out = cJSON_PrintUnformatted(o);
    free(content);
    cJSON_Delete(o);
    return out;
}

/* One write() of the whole line; see the DESIGN comment for why. */
static int append_line(record_state *s, const char *line, size_t len, char *why, size_t why_size)
{
    int rc = 0;
    if (s->lock) {
        pthread_mutex_lock(&s->mu);
        if (flock(s->fd, LOCK_EX) != 0) {
            snprintf(why, why_size, "flock on '%s' failed: %s", s->path, strerror(errno));
            pthread_mutex_unlock(&s->mu);
            return -1;
        }
    }
    ssize_t n;
    do {
        n = write(s->fd, line, len);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        snprintf(why, why_size, "write to '%s' failed: %s", s->path, strerror(errno));
        rc = -1;
    } else if ((size_t)n != len) {
        /* Keep the torn fragment on a line of its own (see DESIGN). */
        ssize_t ignored = write(s->fd, "\n", 1);
        (void)ignored;
        snprintf(why, why_size, "short write to '%s' (%zd of %zu bytes)", s->path, n, len);
        rc = -1;
    }
    if (s->lock) {
        flock(s->fd, LOCK_UN);
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

static int maybe_sync(record_state *s, char *why, size_t why_size)
{
    if (s->fsync == FSYNC_NEVER)
        return 0;
    if (s->fsync == FSYNC_INTERVAL) {
        long long last = atomic_load(&s->last_sync_ms);
        long long now = wxg__mono_ms();
        /* One thread wins the interval; the others go on without waiting for the sync. */
        if (now - last < s->fsync_interval_ms ||
            !atomic_compare_exchange_strong(&s->last_sync_ms, &last, now))
            return 0;
    }
    if (fdatasync(s->fd) != 0) {
        snprintf(why, why_size, "fdatasync of '%s' failed: %s", s->path, strerror(errno));
        return -1;
    }
    return 0;
}

static wxg_plugin_result_t record_handle(void *state, void *thread_state, const wxg_msg_view_t *msg,
                                         wxg_plugin_ctx_t *ctx)
{
    (void)thread_state;
    record_state *s = state;
    char why[300];
    int truncated = 0;
    int64_t now = wxg__wall_ms();
    char *line = build_line(s, msg, ctx, now, 0, &truncated);
    if (line && s->include_content) {
        /* Fit the content into what is left of the line; escaping can grow it, so shrink the
         * cap until the whole line fits (a bounded number of halvings). */
        size_t base = strlen(line);
        size_t cap = base + 64 < RECORD_LINE_MAX ? RECORD_LINE_MAX - base - 64 : 1;
        for (int tries = 0; tries < 16; tries++) {
            char *with = build_line(s, msg, ctx, now, cap, &truncated);
            if (!with)
                break;
            if (strlen(with) + 1 <= RECORD_LINE_MAX || cap <= 1) {
                free(line);
                line = with;
                break;
            }
            free(with);
            cap /= 2;
        }
    }
    if (!line) {
        wxg_plugin_ctx_set_reason(ctx, "record: out of memory building the line");
        return WXG_PLUGIN_RETRY;
    }
    size_t len = strlen(line);
    char *nl = realloc(line, len + 2);
    if (!nl) {
        free(line);
        wxg_plugin_ctx_set_reason(ctx, "record: out of memory building the line");
        return WXG_PLUGIN_RETRY;
    }
    line = nl;
    line[len++] = '\n';
    line[len] = '\0';
    int rc = append_line(s, line, len, why, sizeof why);
    free(line);
    if (rc == 0)
        rc = maybe_sync(s, why, sizeof why);
    if (rc != 0) {
        wxg_plugin_ctx_set_reason(ctx, "record: %s", why);
        return WXG_PLUGIN_RETRY;
    }
    return WXG_PLUGIN_OK;
}

static const wxg_plugin_desc_t record_desc = {
    .abi_version = WXG_PLUGIN_ABI_VERSION,
    .name = "record",
    .init = record_init,
    .handle = record_handle,
    .destroy = record_destroy,
};

const wxg_plugin_desc_t *wxg__plugin_record(void)
{
    return &record_desc;
}
