/*
 * Metrics: counters, gauges and histograms with a few labels, rendered in the Prometheus text
 * exposition format 0.0.4.
 *
 * A registry holds metric families (one name, help text, type and label names) and their series
 * (one set of label values each). Registering returns a series handle; registering the same name
 * and label values again returns the same handle, so code may look a series up whenever it needs
 * one (e.g. per partition on assignment). Handles stay valid until the registry is freed.
 *
 *   wxg_metric_t *dups = wxg_metrics_counter(reg, "wxg_guard_claims_total",
 *                                            "Claims by outcome.", "outcome", "duplicate", NULL);
 *   wxg_counter_inc(dups);
 *
 * Threads: every function may be called from any thread. Updates are lock-free atomics;
 * registration and rendering take the registry's lock. Update functions accept a NULL handle and
 * do nothing, so a failed registration never crashes the caller.
 */
#ifndef WXGUARD_METRICS_H
#define WXGUARD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"

/* Label pairs a series may carry at most. */
#define WXG_METRICS_MAX_LABELS 4
/* Series a registry holds at most (a guard against unbounded label values). */
#define WXG_METRICS_MAX_SERIES 10000
/* The Content-Type of the rendered text. */
#define WXG_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct wxg_metrics_s wxg_metrics_t;
typedef struct wxg_metric_s wxg_metric_t;

typedef enum wxg_metric_type {
    WXG_METRIC_COUNTER = 0,
    WXG_METRIC_GAUGE,
    WXG_METRIC_HISTOGRAM
} wxg_metric_type_t;

/* A new, empty registry, or NULL when out of memory. */
WXG_EXPORT wxg_metrics_t *wxg_metrics_new(void);
/* Frees the registry and every handle it gave out. Accepts NULL. No other thread may use the
 * registry or its handles any more. */
WXG_EXPORT void wxg_metrics_free(wxg_metrics_t *reg);

/* Registers (or finds) a series. `labels` holds `nlabels` name/value pairs as
 * {name0, value0, name1, value1, ...}. Every series of a family must use the same label names
 * in the same order, and a histogram family the same buckets. `buckets` are the upper bounds of a
 * histogram, strictly increasing and finite (+Inf is added); NULL uses
 * wxg_metrics_latency_buckets(). Returns NULL for an invalid name, label or bucket list, a
 * conflict with the family already registered, too many series, or no memory. */
WXG_EXPORT wxg_metric_t *wxg_metrics_series(wxg_metrics_t *reg, wxg_metric_type_t type,
                                            const char *name, const char *help,
                                            const char *const *labels, size_t nlabels,
                                            const double *buckets, size_t nbuckets);

/* The same, with label pairs as arguments ending in NULL. */
WXG_EXPORT wxg_metric_t *wxg_metrics_counter(wxg_metrics_t *reg, const char *name, const char *help,
                                             ...) __attribute__((sentinel));
WXG_EXPORT wxg_metric_t *wxg_metrics_gauge(wxg_metrics_t *reg, const char *name, const char *help,
                                           ...) __attribute__((sentinel));
WXG_EXPORT wxg_metric_t *wxg_metrics_histogram(wxg_metrics_t *reg, const char *name,
                                               const char *help, const double *buckets,
                                               size_t nbuckets, ...) __attribute__((sentinel));

/* Latency buckets in seconds, 0.5 ms .. 10 s. */
WXG_EXPORT const double *wxg_metrics_latency_buckets(size_t *nbuckets);

/* Updates. A call on a handle of another type does nothing. */
WXG_EXPORT void wxg_counter_add(wxg_metric_t *m, uint64_t n);
WXG_EXPORT void wxg_counter_inc(wxg_metric_t *m);
WXG_EXPORT void wxg_gauge_set(wxg_metric_t *m, double v);
WXG_EXPORT void wxg_gauge_add(wxg_metric_t *m, double delta);
/* Hides a gauge series from the output (e.g. the lag of a partition no longer assigned) until
 * it is set again. */
WXG_EXPORT void wxg_gauge_clear(wxg_metric_t *m);
WXG_EXPORT void wxg_histogram_observe(wxg_metric_t *m, double v);

/* Current values (for tests and for code that reacts to its own metrics). */
WXG_EXPORT uint64_t wxg_counter_value(const wxg_metric_t *m);
WXG_EXPORT double wxg_gauge_value(const wxg_metric_t *m);
WXG_EXPORT uint64_t wxg_histogram_count(const wxg_metric_t *m);
WXG_EXPORT double wxg_histogram_sum(const wxg_metric_t *m);

/* Registers a function called at the start of every render, without the registry lock, so that
 * it may set gauges that are cheaper to compute on demand (queue depth, oldest in-flight age).
 * It runs on the thread that renders (the HTTP server's), possibly while other threads update
 * metrics; `opaque` must stay valid until the registry is freed (hooks cannot be removed).
 * 0, WXG_EINVAL or WXG_ENOMEM. */
typedef void (*wxg_metrics_collect_fn)(void *opaque, wxg_metrics_t *reg);
WXG_EXPORT int wxg_metrics_on_collect(wxg_metrics_t *reg, wxg_metrics_collect_fn fn, void *opaque);

/* Renders every family with at least one visible series, in registration order, into a new
 * NUL-terminated buffer that the caller frees with free(). 0, WXG_EINVAL or WXG_ENOMEM. */
WXG_EXPORT int wxg_metrics_render(wxg_metrics_t *reg, char **out, size_t *len);

/* ---- Process metrics ----
 *
 * Resource use of one process, read from Linux's /proc at the moment of the call. */
typedef struct wxg_process_stats {
    double cpu_seconds;        /* user + system CPU time used so far */
    double resident_bytes;     /* resident set size */
    double virtual_bytes;      /* virtual memory size */
    double start_time_seconds; /* when the process started, seconds since the Unix epoch */
    double open_fds;           /* open file descriptors; -1 when /proc/PID/fd is not readable */
    double max_fds;            /* soft limit on open descriptors; -1 when unknown */
} wxg_process_stats_t;

/* Fills `out` for process `pid` (0 or getpid(): this process). Returns 0, WXG_EINVAL, or
 * WXG_ENOTFOUND when the process does not exist (or /proc cannot be read). Any thread. */
WXG_EXPORT int wxg_process_stats(long pid, wxg_process_stats_t *out);

/* Makes every later render of `reg` end with the standard process families of this process,
 * as Prometheus client libraries name them: process_cpu_seconds_total,
 * process_resident_memory_bytes, process_virtual_memory_bytes, process_start_time_seconds,
 * process_open_fds and process_max_fds (each one read at render time; a value that cannot be
 * read is left out). Do not register families of those names yourself. 0 or WXG_EINVAL. */
WXG_EXPORT int wxg_metrics_add_process(wxg_metrics_t *reg);

#endif /* WXGUARD_METRICS_H */
