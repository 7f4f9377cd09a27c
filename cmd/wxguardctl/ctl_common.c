/*
 * Shared parts of wxguardctl's Redis and Kafka subcommands (see ctl.h).
 *
 * Configuration goes through the conf module exactly as for the consumers, so that wxguardctl
 * reads the same file and sees the same Redis prefix and DONE layout. kafka.bootstrap.servers is
 * required only by the subcommands that talk to Kafka.
 */
#include "ctl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "progclock.h"
#include "progstart.h"
#include "wxguard/err.h"
#include "wxguard/key.h"

void ctl_opts_init(ctl_opts *o, const char *prog)
{
    memset(o, 0, sizeof *o);
    o->prog = prog;
}

void ctl_opts_free(ctl_opts *o)
{
    free(o->sets);
    for (size_t i = 0; i < o->nowned; i++)
        free(o->owned[i]);
    memset(o, 0, sizeof *o);
}

static int add_set(ctl_opts *o, const char *kv)
{
    if (o->nsets == o->capsets) {
        size_t cap = o->capsets ? o->capsets * 2 : 8;
        const char **n = realloc(o->sets, cap * sizeof *n);
        if (!n)
            return -1;
        o->sets = n;
        o->capsets = cap;
    }
    o->sets[o->nsets++] = kv;
    return 0;
}

static int add_owned_set(ctl_opts *o, const char *key, const char *value)
{
    if (o->nowned == sizeof o->owned / sizeof o->owned[0])
        return -1;
    size_t n = strlen(key) + strlen(value) + 2;
    char *s = malloc(n);
    if (!s)
        return -1;
    snprintf(s, n, "%s=%s", key, value);
    o->owned[o->nowned++] = s;
    return add_set(o, s);
}

int ctl_common_opt(ctl_opts *o, int c, const char *arg)
{
    switch (c) {
    case OPT_CONFIG:
    case 'c':
        o->config = arg;
        return 1;
    case OPT_SET:
    case 's':
        if (!strchr(arg, '=')) {
            fprintf(stderr, "%s: --set wants key=value, not '%s'\n", o->prog, arg);
            return -1;
        }
        return add_set(o, arg) == 0 ? 1 : -1;
    case OPT_REDIS: {
        char host[256];
        int port = 0;
        if (wxg_conf_parse_addr(arg, host, sizeof host, &port) != 0 || port <= 0) {
            fprintf(stderr, "%s: --redis wants host:port, not '%s'\n", o->prog, arg);
            return -1;
        }
        char p[16];
        snprintf(p, sizeof p, "%d", port);
        if (add_owned_set(o, "redis.host", host) != 0 || add_owned_set(o, "redis.port", p) != 0)
            return -1;
        return 1;
    }
    case OPT_BROKERS:
        return add_owned_set(o, "kafka.bootstrap.servers", arg) == 0 ? 1 : -1;
    case OPT_JSON:
        o->json = 1;
        return 1;
    case OPT_QUIET:
        o->quiet = 1;
        return 1;
    case OPT_YES:
    case 'y':
        o->yes = 1;
        return 1;
    default:
        return 0;
    }
}

wxg_conf_t *ctl_load_conf(const ctl_opts *o, int need_kafka)
{
    char err[512] = "";
    wxg_conf_t *conf = wxg_conf_new(WXG_PROG_CTL, err, sizeof err);
    if (!conf)
        goto fail;
    if (o->config && wxg_conf_load_file(conf, o->config, err, sizeof err) != 0)
        goto fail;
    if (wxg_conf_load_env(conf, NULL, err, sizeof err) != 0)
        goto fail;
    for (size_t i = 0; i < o->nsets; i++) {
        if (wxg_conf_set_arg(conf, o->sets[i], err, sizeof err) != 0)
            goto fail;
    }
    /* kafka.bootstrap.servers is a required key; the Redis-only subcommands do without it. */
    const char *bs = wxg_conf_get(conf, "kafka.bootstrap.servers");
    if (need_kafka || (bs && *bs)) {
        if (wxg_conf_check(conf, err, sizeof err) != 0)
            goto fail;
    }
    /* log.level, log.id.salt ...: for the lines of the library and of librdkafka. */
    prog_setup_log(conf);
    return conf;
fail:
    fprintf(stderr, "%s: configuration: %s\n", o->prog, err[0] ? err : "out of memory");
    wxg_conf_free(conf);
    return NULL;
}

wxg_guard_t *ctl_open_guard(const ctl_opts *o, const wxg_conf_t *conf, int *exit_code)
{
    /* The same mapping as wxguard-consumer's, so that the admin tool reads the records the
     * consumers wrote: same server, prefix and DONE layout. The handle copies the prefix. */
    char prefix[WXG_GUARD_PREFIX_MAX + 1];
    wxg_guard_conf_t gc;
    char err[512] = "";
    int rc = wxg_conf_guard(conf, &gc, prefix, sizeof prefix, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "%s: configuration: %s\n", o->prog, err);
        *exit_code = EXIT_USAGE;
        return NULL;
    }
    /* The admin tool makes single calls; one reconnect attempt is enough. */
    gc.reconnect_min_ms = 10;
    rc = 0;
    wxg_guard_t *g = wxg_guard_new(&gc, &rc, err, sizeof err);
    if (!g) {
        fprintf(stderr, "%s: Redis: %s (%s)\n", o->prog, err, wxg_err_name(rc));
        *exit_code = (rc == WXG_EINVAL || rc == WXG_ECONFIG) ? EXIT_USAGE : EXIT_CONN;
    }
    return g;
}

int ctl_guard_error(const ctl_opts *o, wxg_guard_t *g, const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s: %s\n", o->prog, what, wxg_err_name(rc),
            g && *wxg_guard_last_error(g) ? wxg_guard_last_error(g) : wxg_strerror(rc));
    if (rc == WXG_EINVAL || rc == WXG_ECONFIG)
        return EXIT_USAGE;
    return EXIT_CONN;
}

int ctl_confirm(const ctl_opts *o, const char *question)
{
    if (o->yes)
        return 1;
    fprintf(stderr, "%s [y/N] ", question);
    fflush(stderr);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) {
        fputc('\n', stderr);
        return 0;
    }
    size_t n = strcspn(line, "\r\n");
    line[n] = '\0';
    return strcmp(line, "y") == 0 || strcmp(line, "Y") == 0 || strcmp(line, "yes") == 0 ||
           strcmp(line, "YES") == 0 || strcmp(line, "Yes") == 0;
}

void ctl_progress(const ctl_opts *o, int force, const char *fmt, ...)
{
    static int64_t last;
    if (o->quiet)
        return;
    int64_t now = prog_mono_ms();
    if (!force && now - last < 1000)
        return;
    last = now;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", o->prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void ctl_fmt_duration(int64_t ms, char *buf, size_t size)
{
    if (ms == -1) {
        snprintf(buf, size, "no expiry");
        return;
    }
    if (ms < 0) {
        snprintf(buf, size, "none");
        return;
    }
    if (ms < 1000) {
        snprintf(buf, size, "%lld ms", (long long)ms);
        return;
    }
    long long s = ms / 1000, d = s / 86400, h = s % 86400 / 3600, m = s % 3600 / 60;
    s %= 60;
    if (d > 0)
        snprintf(buf, size, "%lldd %lldh %lldm", d, h, m);
    else if (h > 0)
        snprintf(buf, size, "%lldh %lldm %llds", h, m, s);
    else if (m > 0)
        snprintf(buf, size, "%lldm %llds", m, s);
    else
        snprintf(buf, size, "%lld.%03llds", s, (long long)(ms % 1000));
}

void ctl_fmt_time(int64_t unix_ms, char *buf, size_t size)
{
    if (unix_ms <= 0) {
        snprintf(buf, size, "-");
        return;
    }
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    char day[40];
    strftime(day, sizeof day, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf, size, "%s.%03d UTC", day, (int)(unix_ms % 1000));
}

int64_t ctl_bucket_ms(const wxg_guard_t *g)
{
    char buf[512];
    if (wxg_guard_describe_layout(g, buf, sizeof buf) != 0)
        return 0;
    const char *p = strstr(buf, "bucket_ms=");
    if (!p)
        return 0;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(p + 10, &end, 10);
    return errno || end == p + 10 ? 0 : v;
}

const char *ctl_state_name(wxg_guard_state_t s)
{
    switch (s) {
    case WXG_GUARD_PROCESSING:
        return "PROCESSING";
    case WXG_GUARD_FAILED:
        return "FAILED";
    case WXG_GUARD_DONE:
        return "DONE";
    default:
        return "ABSENT";
    }
}

/* The time-bucket index at the end of a DONE bucket name ("...:d:<sub>:<bucket>"), or -1. */
static long long bucket_index(const char *name)
{
    const char *p = name ? strrchr(name, ':') : NULL;
    if (!p || !p[1])
        return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(p + 1, &end, 10);
    return errno || *end ? -1 : v;
}

cJSON *ctl_record_json(const char *key, const wxg_guard_record_t *r, int64_t bucket_ms)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    const char *k = key ? key : r->msg_key;
    if (k)
        cJSON_AddStringToObject(o, "key", k);
    else
        cJSON_AddNullToObject(o, "key");
    cJSON_AddStringToObject(o, "state", ctl_state_name(r->state));
    if (r->record_key)
        cJSON_AddStringToObject(o, "record_key", r->record_key);
    cJSON_AddBoolToObject(o, "has_record", r->has_record);
    if (r->has_record) {
        if (r->owner[0])
            cJSON_AddStringToObject(o, "owner", r->owner);
        else
            cJSON_AddNullToObject(o, "owner");
        cJSON_AddNumberToObject(o, "fence", (double)r->fence);
        cJSON_AddNumberToObject(o, "attempt", r->attempt);
        cJSON_AddNumberToObject(o, "claimed_at_ms", (double)r->claimed_at_ms);
        cJSON_AddNumberToObject(o, "record_ttl_ms", (double)r->record_ttl_ms);
        if (r->state == WXG_GUARD_PROCESSING)
            cJSON_AddNumberToObject(o, "lease_ms_left", (double)r->lease_ms_left);
        if (r->state == WXG_GUARD_FAILED) {
            cJSON_AddNumberToObject(o, "fail_attempts", r->fail_attempts);
            if (r->fail_reason)
                cJSON_AddStringToObject(o, "reason", r->fail_reason);
            else
                cJSON_AddNullToObject(o, "reason");
            cJSON_AddNumberToObject(o, "failed_at_ms", (double)r->failed_at_ms);
        }
        if (r->rearmed_at_ms)
            cJSON_AddNumberToObject(o, "rearmed_at_ms", (double)r->rearmed_at_ms);
        cJSON *fin = cJSON_AddArrayToObject(o, "finished_plugins");
        for (size_t i = 0; fin && i < r->n_finished; i++) {
            cJSON *p = cJSON_CreateObject();
            if (!p)
                break;
            cJSON_AddStringToObject(p, "plugin", r->finished[i].name);
            /* Results are small texts by convention; bytes that are not printable are shown as
             * '?' so that the JSON stays valid. */
            char res[WXG_GUARD_RESULT_MAX + 1];
            size_t n = r->finished[i].result_len;
            if (n > WXG_GUARD_RESULT_MAX)
                n = WXG_GUARD_RESULT_MAX;
            for (size_t j = 0; j < n; j++) {
                unsigned char ch = r->finished[i].result[j];
                res[j] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
            }
            res[n] = '\0';
            cJSON_AddStringToObject(p, "result", res);
            cJSON_AddItemToArray(fin, p);
        }
    }
    if (r->state == WXG_GUARD_DONE) {
        cJSON *d = cJSON_AddObjectToObject(o, "done");
        if (d) {
            cJSON_AddStringToObject(d, "marker", "compact");
            cJSON_AddStringToObject(d, "bucket_key", r->done_bucket);
            long long b = bucket_index(r->done_bucket);
            cJSON_AddNumberToObject(d, "time_bucket", (double)b);
            if (b >= 0 && bucket_ms > 0) {
                cJSON_AddNumberToObject(d, "bucket_start_ms", (double)(b * bucket_ms));
                cJSON_AddNumberToObject(d, "bucket_end_ms", (double)((b + 1) * bucket_ms));
            }
            cJSON_AddNumberToObject(d, "ttl_ms", (double)r->done_ttl_ms);
            cJSON_AddBoolToObject(d, "payload_matches", r->done_payload_tag == r->payload_tag);
        }
    }
    return o;
}

void ctl_record_text(FILE *out, const char *key, const wxg_guard_record_t *r, int64_t bucket_ms)
{
    char a[64], b[64];
    const char *k = key ? key : r->msg_key;
    fprintf(out, "key:          %s\n", k ? k : "(not stored in this record)");
    fprintf(out, "state:        %s\n", ctl_state_name(r->state));
    switch (r->state) {
    case WXG_GUARD_ABSENT:
        fprintf(out, "              nothing is known about this message: never seen, or its "
                     "retention has passed\n");
        break;
    case WXG_GUARD_PROCESSING:
        if (r->lease_ms_left > 0) {
            ctl_fmt_duration(r->lease_ms_left, a, sizeof a);
            fprintf(out, "              claimed by owner %s; lease %s left\n", r->owner, a);
        } else {
            ctl_fmt_duration(-r->lease_ms_left, a, sizeof a);
            fprintf(out,
                    "              claimed by owner %s; the lease EXPIRED %s ago: the next "
                    "delivery takes it over\n",
                    r->owner, a);
        }
        break;
    case WXG_GUARD_FAILED:
        ctl_fmt_time(r->failed_at_ms, a, sizeof a);
        fprintf(out, "              failed at %s after %u attempt(s): %s\n", a, r->fail_attempts,
                r->fail_reason ? r->fail_reason : "(no reason)");
        fprintf(out, "              a new delivery (or a redrive) claims it again\n");
        break;
    case WXG_GUARD_DONE: {
        long long bi = bucket_index(r->done_bucket);
        fprintf(out,
                "              finished; remembered by a compact DONE marker (a fingerprint in a "
                "shared hash), not a record of its own\n");
        if (bi >= 0 && bucket_ms > 0) {
            ctl_fmt_time(bi * bucket_ms, a, sizeof a);
            ctl_fmt_time((bi + 1) * bucket_ms, b, sizeof b);
            fprintf(out, "time bucket:  %lld (%s .. %s)\n", bi, a, b);
        } else {
            fprintf(out, "time bucket:  %lld\n", bi);
        }
        fprintf(out, "bucket key:   %s\n", r->done_bucket);
        ctl_fmt_duration(r->done_ttl_ms, a, sizeof a);
        fprintf(out, "marker TTL:   %s (the bucket expires as a whole)\n", a);
        fprintf(out, "payload:      %s\n",
                r->done_payload_tag == r->payload_tag
                    ? "same payload tag as given (or none given)"
                    : "DIFFERENT payload tag: the same key was finished with another payload");
        break;
    }
    }
    if (r->has_record) {
        fprintf(out, "record key:   %s\n", r->record_key ? r->record_key : "-");
        fprintf(out, "fence:        %llu\n", (unsigned long long)r->fence);
        fprintf(out, "attempt:      %u\n", r->attempt);
        ctl_fmt_time(r->claimed_at_ms, a, sizeof a);
        fprintf(out, "claimed at:   %s\n", a);
        if (r->rearmed_at_ms) {
            ctl_fmt_time(r->rearmed_at_ms, a, sizeof a);
            fprintf(out, "re-armed at:  %s (redrive)\n", a);
        }
        ctl_fmt_duration(r->record_ttl_ms, a, sizeof a);
        fprintf(out, "record TTL:   %s\n", a);
        if (r->n_finished == 0)
            fprintf(out, "finished plugins: none\n");
        else
            fprintf(out, "finished plugins (not run again on a retry):\n");
        for (size_t i = 0; i < r->n_finished; i++) {
            fprintf(out, "  %-20s result: ", r->finished[i].name);
            for (size_t j = 0; j < r->finished[i].result_len && j < WXG_GUARD_RESULT_MAX; j++) {
                unsigned char ch = r->finished[i].result[j];
                fputc(ch >= 0x20 && ch < 0x7f ? ch : '?', out);
            }
            fputc('\n', out);
        }
    }
}

int ctl_key_in_account(const char *key, const char *account)
{
    char part[WXG_KEY_MAX];
    int n = wxg_key_part(account, strlen(account), part, sizeof part);
    if (n <= 0 || !key)
        return 0;
    return strncmp(key, part, (size_t)n) == 0 && key[n] == ':';
}

void ctl_print_json(cJSON *doc)
{
    char *s = doc ? cJSON_PrintUnformatted(doc) : NULL;
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        cJSON_free(s);
    }
    cJSON_Delete(doc);
}

int ctl_parse_ll(const char *s, long long min, long long max, long long *out)
{
    if (!s || !*s)
        return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}
