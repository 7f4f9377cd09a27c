/*
 * The benchmarks' configuration: the keys and the mapping of wxguard-consumer and wxguardctl
 * (wxg_conf_guard() and wxg_conf_consumer(), lib/conf_map.c), so that a benchmark row measures
 * the guard and the consumer as a deployment configures them, with the same defaults. A
 * subcommand's own options become key settings (as a properties file would give them), and
 * --set KEY=VALUE, which wins over them, sets any other key: a deployment's
 * guard.done.retention or redis.command.timeout.ms, say. What has no key -- the naive design,
 * the DONE-bucket sizing of a compressed run, the benchmark's own key prefixes -- the
 * subcommand sets on the mapped structure afterwards.
 *
 * Main thread only; a refused setting ends the program with the key named (status 2).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "wxguard/conf.h"
#include "wxguard/consumer.h"
#include "wxguard/guard.h"

wxg_conf_t *wxgb_conf_new(const char *options, const char *const *sets, size_t nsets)
{
    char err[512] = "";
    wxg_conf_t *conf = wxg_conf_new(WXG_PROG_CONSUMER, err, sizeof err);
    if (!conf)
        goto fail;
    if (options && wxg_conf_load_string(conf, options, strlen(options), "wxguard-bench options",
                                        err, sizeof err) != 0)
        goto fail;
    for (size_t i = 0; i < nsets; i++) {
        if (wxg_conf_set_arg(conf, sets[i], err, sizeof err) != 0)
            goto fail;
    }
    return conf;
fail:
    fprintf(stderr, "wxguard-bench: configuration: %s\n", err[0] ? err : "out of memory");
    exit(2);
}

void wxgb_conf_guard(const wxg_conf_t *conf, wxg_guard_conf_t *out, char *prefix,
                     size_t prefix_size)
{
    char err[512] = "";
    if (wxg_conf_guard(conf, out, prefix, prefix_size, err, sizeof err) != 0) {
        fprintf(stderr, "wxguard-bench: configuration: %s\n", err);
        exit(2);
    }
}

void wxgb_conf_consumer(const wxg_conf_t *conf, wxg_consumer_conf_t *out)
{
    char err[512] = "";
    if (wxg_conf_consumer(conf, out, err, sizeof err) != 0) {
        fprintf(stderr, "wxguard-bench: configuration: %s\n", err);
        exit(2);
    }
}

char *wxgb_props(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s) {
        fprintf(stderr, "wxguard-bench: out of memory\n");
        exit(1);
    }
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}
