/*
 * DESIGN: the metrics registry.
 *
 * Purpose: counters, gauges and histograms that worker threads update on every message, and a
 * renderer for the Prometheus text exposition format 0.0.4 that the HTTP module serves.
 *
 * Threads and locks: updates touch only atomics in the series (a counter is one atomic add; a
 * gauge and a histogram sum hold a double's bits and are updated with a compare-and-swap loop), so
 * workers never wait on each other or on a scrape. `mu` guards the lists of families and series
 * and the collect hooks; registration and rendering take it. Series are only ever added, never
 * removed, so a handle stays valid, without a lock, until the registry is freed.
 *
 * Consistency: a histogram's _count is the sum of the bucket counts read during that render, so
 * the +Inf bucket always equals _count; _sum is read separately and may include an observation
 * whose bucket was read a moment earlier, which Prometheus tolerates.
 *
 * Process metrics (wxg_metrics_add_process) are not series: they are read from /proc at each
 * render and appended after the families, so nothing has to keep them current between scrapes.
 *
 * Failure modes: registration returns NULL on bad input, conflicts, too many series or no memory;
 * updates through a NULL handle do nothing; rendering returns WXG_ENOMEM.
 */
#include "wxguard/metrics.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wxguard/err.h"

#define LABEL_VALUE_MAX 256
#define HELP_MAX        1024

typedef struct family family;

struct wxg_metric_s {
    family *fam;
    char *lvalues[WXG_METRICS_MAX_LABELS];
    atomic_uint_least64_t value;    /* counter: count; gauge: bits of a double */
    atomic_int visible;             /* gauges may be hidden; others are always visible */
    atomic_uint_least64_t *buckets; /* histogram: nbounds + 1 non-cumulative counts */
    atomic_uint_least64_t sum;      /* histogram: bits of a double */
    wxg_metric_t *next;
};

struct family {
    char *name;
    char *help;
    wxg_metric_type_t type;
    char *lnames[WXG_METRICS_MAX_LABELS];
    size_t nlabels;
    double *bounds;
    size_t nbounds;
    wxg_metric_t *first, *last;
    family *next;
};

typedef struct hook {
    wxg_metrics_collect_fn fn;
    void *opaque;
    struct hook *next;
} hook;

struct wxg_metrics_s {
    pthread_mutex_t mu;
    family *first, *last;
    size_t nseries;
    hook *hooks;
    atomic_int process; /* render the process_* families too */
};

static const double latency_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                         0.1,    0.25,  0.5,    1,     2.5,  5,     10};

const double *wxg_metrics_latency_buckets(size_t *nbuckets)
{
    if (nbuckets != NULL)
        *nbuckets = sizeof latency_buckets / sizeof latency_buckets[0];
    return latency_buckets;
}

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p != NULL)
        memcpy(p, s, n + 1);
    return p;
}

/* [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; labels have no ':' and no leading "__". */
static int valid_name(const char *s, int is_label)
{
    if (s == NULL || *s == '\0' || strlen(s) > 200)
        return 0;
    if (is_label && s[0] == '_' && s[1] == '_')
        return 0;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (!is_label && c == ':') || (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

wxg_metrics_t *wxg_metrics_new(void)
{
    wxg_metrics_t *reg = calloc(1, sizeof *reg);
    if (reg == NULL)
        return NULL;
    if (pthread_mutex_init(&reg->mu, NULL) != 0) {
        free(reg);
        return NULL;
    }
    return reg;
}

static void series_free(wxg_metric_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < WXG_METRICS_MAX_LABELS; i++)
        free(m->lvalues[i]);
    free(m->buckets);
    free(m);
}

static void family_free(family *f)
{
    if (f == NULL)
        return;
    for (wxg_metric_t *m = f->first, *next; m != NULL; m = next) {
        next = m->next;
        series_free(m);
    }
    for (size_t i = 0; i < WXG_METRICS_MAX_LABELS; i++)
        free(f->lnames[i]);
    free(f->name);
    free(f->help);
    free(f->bounds);
    free(f);
}

void wxg_metrics_free(wxg_metrics_t *reg)
{
    if (reg == NULL)
        return;
    for (family *f = reg->first, *next; f != NULL; f = next) {
        next = f->next;
        family_free(f);
    }
    for (hook *h = reg->hooks, *next; h != NULL; h = next) {
        next = h->next;
        free(h);
    }
    pthread_mutex_destroy(&reg->mu);
    free(reg);
}

static family *family_new(wxg_metric_type_t type, const char *name, const char *help,
                          const char *const *labels, size_t nlabels, const double *buckets,
                          size_t nbuckets)
{
    family *f = calloc(1, sizeof *f);
    if (f == NULL)
        return NULL;
    f->type = type;
    f->nlabels = nlabels;
    f->name = xstrdup(name);
    f->help = xstrdup(help != NULL ? help : "");
    if (f->name == NULL || f->help == NULL)
        goto fail;
    if (strlen(f->help) > HELP_MAX)
        f->help[HELP_MAX] = '\0';
    for (size_t i = 0; i < nlabels; i++) {
        f->lnames[i] = xstrdup(labels[2 * i]);
        if (f->lnames[i] == NULL)
            goto fail;
    }
    if (type == WXG_METRIC_HISTOGRAM) {
        f->nbounds = nbuckets;
        f->bounds = malloc(nbuckets * sizeof *f->bounds);
        if (f->bounds == NULL)
            goto fail;
        memcpy(f->bounds, buckets, nbuckets * sizeof *f->bounds);
    }
    return f;
fail:
    family_free(f);
    return NULL;
}

static int family_matches(const family *f, wxg_metric_type_t type, const char *const *labels,
                          size_t nlabels, const double *buckets, size_t nbuckets)
{
    if (f->type != type || f->nlabels != nlabels)
        return 0;
    for (size_t i = 0; i < nlabels; i++) {
        if (strcmp(f->lnames[i], labels[2 * i]) != 0)
            return 0;
    }
    if (type == WXG_METRIC_HISTOGRAM) {
        if (f->nbounds != nbuckets)
            return 0;
        for (size_t i = 0; i < nbuckets; i++) {
            if (f->bounds[i] != buckets[i])
                return 0;
        }
    }
    return 1;
}

wxg_metric_t *wxg_metrics_series(wxg_metrics_t *reg, wxg_metric_type_t type, const char *name,
                                 const char *help, const char *const *labels, size_t nlabels,
                                 const double *buckets, size_t nbuckets)
{
    wxg_metric_t *m = NULL;
    family *f = NULL;
    int new_family = 0;

    if (reg == NULL || !valid_name(name, 0) || nlabels > WXG_METRICS_MAX_LABELS ||
        (nlabels > 0 && labels == NULL) || (int)type < WXG_METRIC_COUNTER ||
        type > WXG_METRIC_HISTOGRAM)
        return NULL;
    for (size_t i = 0; i < nlabels; i++) {
        const char *ln = labels[2 * i];
        const char *lv = labels[2 * i + 1];
        if (!valid_name(ln, 1) || lv == NULL || strlen(lv) > LABEL_VALUE_MAX)
            return NULL;
        if (type == WXG_METRIC_HISTOGRAM && strcmp(ln, "le") == 0)
            return NULL;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(ln, labels[2 * j]) == 0)
                return NULL;
        }
    }
    if (type == WXG_METRIC_HISTOGRAM) {
        if (buckets == NULL)
            buckets = wxg_metrics_latency_buckets(&nbuckets);
        if (nbuckets == 0)
            return NULL;
        for (size_t i = 0; i < nbuckets; i++) {
            if (!isfinite(buckets[i]) || (i > 0 && buckets[i] <= buckets[i - 1]))
                return NULL;
        }
    }

    pthread_mutex_lock(&reg->mu);
    for (f = reg->first; f != NULL; f = f->next) {
        if (strcmp(f->name, name) == 0)
            break;
    }
    if (f != NULL) {
        if (!family_matches(f, type, labels, nlabels, buckets, nbuckets))
            goto out; /* m stays NULL */
        for (m = f->first; m != NULL; m = m->next) {
            size_t i = 0;
            while (i < nlabels && strcmp(m->lvalues[i], labels[2 * i + 1]) == 0)
                i++;
            if (i == nlabels)
                goto out; /* found */
        }
    }
    if (reg->nseries >= WXG_METRICS_MAX_SERIES)
        goto out;
    if (f == NULL) {
        f = family_new(type, name, help, labels, nlabels, buckets, nbuckets);
        if (f == NULL)
            goto out;
        new_family = 1;
    }
    m = calloc(1, sizeof *m);
    if (m == NULL)
        goto fail;
    m->fam = f;
    atomic_init(&m->value, type == WXG_METRIC_GAUGE ? dbits(0.0) : 0);
    atomic_init(&m->visible, 1);
    atomic_init(&m->sum, dbits(0.0));
    for (size_t i = 0; i < nlabels; i++) {
        m->lvalues[i] = xstrdup(labels[2 * i + 1]);
        if (m->lvalues[i] == NULL)
            goto fail;
    }
    if (type == WXG_METRIC_HISTOGRAM) {
        m->buckets = calloc(f->nbounds + 1, sizeof *m->buckets);
        if (m->buckets == NULL)
            goto fail;
        for (size_t i = 0; i <= f->nbounds; i++)
            atomic_init(&m->buckets[i], 0);
    }
    if (new_family) {
        if (reg->last != NULL)
            reg->last->next = f;
        else
            reg->first = f;
        reg->last = f;
    }
    if (f->last != NULL)
        f->last->next = m;
    else
        f->first = m;
    f->last = m;
    reg->nseries++;
    goto out;
fail:
    series_free(m);
    m = NULL;
    if (new_family)
        family_free(f);
out:
    pthread_mutex_unlock(&reg->mu);
    return m;
}

/* Collects NULL-terminated name/value pairs from a va_list. Returns the pair count, or -1 for
 * too many labels or a name without a value. */
static long collect_labels(va_list ap, const char **pairs)
{
    long n = 0;
    for (;;) {
        const char *ln = va_arg(ap, const char *);
        if (ln == NULL)
            return n;
        if (n >= WXG_METRICS_MAX_LABELS)
            return -1;
        const char *lv = va_arg(ap, const char *);
        if (lv == NULL)
            return -1;
        pairs[2 * n] = ln;
        pairs[2 * n + 1] = lv;
        n++;
    }
}

wxg_metric_t *wxg_metrics_counter(wxg_metrics_t *reg, const char *name, const char *help, ...)
{
    const char *pairs[2 * WXG_METRICS_MAX_LABELS];
    va_list ap;
    va_start(ap, help);
    long n = collect_labels(ap, pairs);
    va_end(ap);
    if (n < 0)
        return NULL;
    return wxg_metrics_series(reg, WXG_METRIC_COUNTER, name, help, pairs, (size_t)n, NULL, 0);
}

wxg_metric_t *wxg_metrics_gauge(wxg_metrics_t *reg, const char *name, const char *help, ...)
{
    const char *pairs[2 * WXG_METRICS_MAX_LABELS];
    va_list ap;
    va_start(ap, help);
    long n = collect_labels(ap, pairs);
    va_end(ap);
    if (n < 0)
        return NULL;
    return wxg_metrics_series(reg, WXG_METRIC_GAUGE, name, help, pairs, (size_t)n, NULL, 0);
}

wxg_metric_t *wxg_metrics_histogram(wxg_metrics_t *reg, const char *name, const char *help,
                                    const double *buckets, size_t nbuckets, ...)
{
    const char *pairs[2 * WXG_METRICS_MAX_LABELS];
    va_list ap;
    va_start(ap, nbuckets);
    long n = collect_labels(ap, pairs);
    va_end(ap);
    if (n < 0)
        return NULL;
    return wxg_metrics_series(reg, WXG_METRIC_HISTOGRAM, name, help, pairs, (size_t)n, buckets,
                              nbuckets);
}

/* ---- updates ------------------------------------------------------------------------------- */

static void add_double(atomic_uint_least64_t *a, double delta)
{
    uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &old, dbits(bitsd(old) + delta),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void wxg_counter_add(wxg_metric_t *m, uint64_t n)
{
    if (m == NULL || m->fam->type != WXG_METRIC_COUNTER)
        return;
    atomic_fetch_add_explicit(&m->value, n, memory_order_relaxed);
}

void wxg_counter_inc(wxg_metric_t *m)
{
    wxg_counter_add(m, 1);
}

void wxg_gauge_set(wxg_metric_t *m, double v)
{
    if (m == NULL || m->fam->type != WXG_METRIC_GAUGE)
        return;
    atomic_store_explicit(&m->value, dbits(v), memory_order_relaxed);
    atomic_store_explicit(&m->visible, 1, memory_order_relaxed);
}

void wxg_gauge_add(wxg_metric_t *m, double delta)
{
    if (m == NULL || m->fam->type != WXG_METRIC_GAUGE)
        return;
    add_double(&m->value, delta);
    atomic_store_explicit(&m->visible, 1, memory_order_relaxed);
}

void wxg_gauge_clear(wxg_metric_t *m)
{
    if (m == NULL || m->fam->type != WXG_METRIC_GAUGE)
        return;
    atomic_store_explicit(&m->visible, 0, memory_order_relaxed);
    atomic_store_explicit(&m->value, dbits(0.0), memory_order_relaxed);
}

void wxg_histogram_observe(wxg_metric_t *m, double v)
{
    if (m == NULL || m->fam->type != WXG_METRIC_HISTOGRAM || isnan(v))
        return;
    const family *f = m->fam;
    size_t lo = 0, hi = f->nbounds; /* first bound >= v, or nbounds for +Inf */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (f->bounds[mid] >= v)
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_fetch_add_explicit(&m->buckets[lo], 1, memory_order_relaxed);
    add_double(&m->sum, v);
}

uint64_t wxg_counter_value(const wxg_metric_t *m)
{
    if (m == NULL || m->fam->type != WXG_METRIC_COUNTER)
        return 0;
    return atomic_load_explicit(&m->value, memory_order_relaxed);
}

double wxg_gauge_value(const wxg_metric_t *m)
{
    if (m == NULL || m->fam->type != WXG_METRIC_GAUGE)
        return 0;
    return bitsd(atomic_load_explicit(&m->value, memory_order_relaxed));
}

uint64_t wxg_histogram_count(const wxg_metric_t *m)
{
    uint64_t n = 0;
    if (m == NULL || m->fam->type != WXG_METRIC_HISTOGRAM)
        return 0;
    for (size_t i = 0; i <= m->fam->nbounds; i++)
        n += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
    return n;
}

double wxg_histogram_sum(const wxg_metric_t *m)
{
    if (m == NULL || m->fam->type != WXG_METRIC_HISTOGRAM)
        return 0;
    return bitsd(atomic_load_explicit(&m->sum, memory_order_relaxed));
}

int wxg_metrics_on_collect(wxg_metrics_t *reg, wxg_metrics_collect_fn fn, void *opaque)
{
    if (reg == NULL || fn == NULL)
        return WXG_EINVAL;
    hook *h = calloc(1, sizeof *h);
    if (h == NULL)
        return WXG_ENOMEM;
    h->fn = fn;
    h->opaque = opaque;
    pthread_mutex_lock(&reg->mu);
    h->next = reg->hooks;
    reg->hooks = h;
    pthread_mutex_unlock(&reg->mu);
    return 0;
}

/* ---- rendering ----------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

/* Escapes for HELP text (backslash, newline) or, with `quote`, label values (also '"'). */
static void sb_escaped(sbuf *b, const char *s, int quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            sb_puts(b, "\\\\");
        else if (*s == '\n')
            sb_puts(b, "\\n");
        else if (quote && *s == '"')
            sb_puts(b, "\\\"");
        else
            sb_put(b, s, 1);
    }
}

/* The shortest decimal that reads back as the same double; +Inf, -Inf and NaN as Prometheus
 * writes them. */
static void format_double(double v, char *buf, size_t size)
{
    if (isnan(v)) {
        snprintf(buf, size, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, size, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, size, "%.0f", v); /* whole numbers without an exponent: 10, not 1e+01 */
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, size, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                return;
        }
    }
}

/* {a="x",b="y"} plus an optional le label; nothing when there are no labels at all. */
static void sb_labels(sbuf *b, const wxg_metric_t *m, const char *le)
{
    const family *f = m->fam;
    if (f->nlabels == 0 && le == NULL)
        return;
    sb_puts(b, "{");
    for (size_t i = 0; i < f->nlabels; i++) {
        if (i > 0)
            sb_puts(b, ",");
        sb_puts(b, f->lnames[i]);
        sb_puts(b, "=\"");
        sb_escaped(b, m->lvalues[i], 1);
        sb_puts(b, "\"");
    }
    if (le != NULL) {
        sb_puts(b, f->nlabels > 0 ? ",le=\"" : "le=\"");
        sb_puts(b, le);
        sb_puts(b, "\"");
    }
    sb_puts(b, "}");
}

static void render_series(sbuf *b, const wxg_metric_t *m)
{
    const family *f = m->fam;
    char num[64];
    switch (f->type) {
    case WXG_METRIC_COUNTER:
        sb_puts(b, f->name);
        sb_labels(b, m, NULL);
        snprintf(num, sizeof num, " %llu\n",
                 (unsigned long long)atomic_load_explicit(&m->value, memory_order_relaxed));
        sb_puts(b, num);
        break;
    case WXG_METRIC_GAUGE:
        sb_puts(b, f->name);
        sb_labels(b, m, NULL);
        sb_puts(b, " ");
        format_double(bitsd(atomic_load_explicit(&m->value, memory_order_relaxed)), num,
                      sizeof num);
        sb_puts(b, num);
        sb_puts(b, "\n");
        break;
    case WXG_METRIC_HISTOGRAM: {
        uint64_t cum = 0;
        char le[64];
        for (size_t i = 0; i <= f->nbounds; i++) {
            cum += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
            if (i < f->nbounds)
                format_double(f->bounds[i], le, sizeof le);
            else
                snprintf(le, sizeof le, "+Inf");
            sb_puts(b, f->name);
            sb_puts(b, "_bucket");
            sb_labels(b, m, le);
            snprintf(num, sizeof num, " %llu\n", (unsigned long long)cum);
            sb_puts(b, num);
        }
        sb_puts(b, f->name);
        sb_puts(b, "_sum");
        sb_labels(b, m, NULL);
        sb_puts(b, " ");
        format_double(bitsd(atomic_load_explicit(&m->sum, memory_order_relaxed)), num, sizeof num);
        sb_puts(b, num);
        sb_puts(b, "\n");
        sb_puts(b, f->name);
        sb_puts(b, "_count");
        sb_labels(b, m, NULL);
        snprintf(num, sizeof num, " %llu\n", (unsigned long long)cum);
        sb_puts(b, num);
        break;
    }
    }
}

static const char *type_word(wxg_metric_type_t t)
{
    return t == WXG_METRIC_COUNTER ? "counter" : t == WXG_METRIC_GAUGE ? "gauge" : "histogram";
}

/* ---- process metrics ----------------------------------------------------------------------- */

/* Reads a small /proc file whole; returns its length or -1. */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (ssize_t)n;
}

/* The boot time in seconds since the epoch, from the btime line of /proc/stat; -1 if unknown. */
static double boot_time(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL)
        return -1;
    char line[256];
    double bt = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long long v;
        if (sscanf(line, "btime %llu", &v) == 1) {
            bt = (double)v;
            break;
        }
    }
    fclose(f);
    return bt;
}

static double count_fds(long pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/fd", pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    double n = 0;
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        if (e->d_name[0] != '.')
            n++;
    }
    closedir(d);
    /* Reading our own table lists the descriptor opendir() holds while it reads. */
    return pid == (long)getpid() ? n - 1 : n;
}

/* The soft "Max open files" limit from /proc/PID/limits; -1 when unknown or unlimited. */
static double max_fds(long pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%ld/limits", pid);
    if (read_small(path, buf, sizeof buf) < 0)
        return -1;
    const char *at = strstr(buf, "Max open files");
    unsigned long long v;
    if (at == NULL || sscanf(at + strlen("Max open files"), " %llu", &v) != 1)
        return -1;
    return (double)v;
}

int wxg_process_stats(long pid, wxg_process_stats_t *out)
{
    if (pid < 0 || out == NULL)
        return WXG_EINVAL;
    if (pid == 0)
        pid = (long)getpid();
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    if (read_small(path, buf, sizeof buf) < 0)
        return WXG_ENOTFOUND;
    /* The command name (field 2) may hold spaces and parentheses: fields are counted after its
     * last ')'. Fields 14-15 are utime and stime in clock ticks, 22 the start time in ticks
     * after boot, 23 the virtual size in bytes, 24 the resident set in pages (proc(5)). */
    const char *p = strrchr(buf, ')');
    unsigned long long ut, st, start, vsize;
    long long rss;
    if (p == NULL || sscanf(p + 1,
                            " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d "
                            "%*d %*d %*d %llu %llu %lld",
                            &ut, &st, &start, &vsize, &rss) != 5)
        return WXG_ENOTFOUND;
    long hz = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    if (hz <= 0)
        hz = 100;
    if (page <= 0)
        page = 4096;
    double bt = boot_time();
    *out = (wxg_process_stats_t){
        .cpu_seconds = (double)(ut + st) / (double)hz,
        .resident_bytes = (double)rss * (double)page,
        .virtual_bytes = (double)vsize,
        .start_time_seconds = bt < 0 ? -1 : bt + (double)start / (double)hz,
        .open_fds = count_fds(pid),
        .max_fds = max_fds(pid),
    };
    return 0;
}

int wxg_metrics_add_process(wxg_metrics_t *reg)
{
    if (reg == NULL)
        return WXG_EINVAL;
    atomic_store(&reg->process, 1);
    return 0;
}

static void render_process(sbuf *b)
{
    wxg_process_stats_t ps;
    if (wxg_process_stats(0, &ps) != 0)
        return;
    const struct {
        const char *name, *type, *help;
        double v;
    } rows[] = {
        {"process_cpu_seconds_total", "counter", "User and system CPU time spent in seconds.",
         ps.cpu_seconds},
        {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
         ps.resident_bytes},
        {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
         ps.virtual_bytes},
        {"process_start_time_seconds", "gauge",
         "Start time of the process since the Unix epoch in seconds.", ps.start_time_seconds},
        {"process_open_fds", "gauge", "Number of open file descriptors.", ps.open_fds},
        {"process_max_fds", "gauge", "Maximum number of open file descriptors.", ps.max_fds},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].v < 0)
            continue;
        char num[64];
        format_double(rows[i].v, num, sizeof num);
        sb_puts(b, "# HELP ");
        sb_puts(b, rows[i].name);
        sb_puts(b, " ");
        sb_puts(b, rows[i].help);
        sb_puts(b, "\n# TYPE ");
        sb_puts(b, rows[i].name);
        sb_puts(b, " ");
        sb_puts(b, rows[i].type);
        sb_puts(b, "\n");
        sb_puts(b, rows[i].name);
        sb_puts(b, " ");
        sb_puts(b, num);
        sb_puts(b, "\n");
    }
}

int wxg_metrics_render(wxg_metrics_t *reg, char **out, size_t *len)
{
    sbuf b = {0};
    if (reg == NULL || out == NULL)
        return WXG_EINVAL;

    /* Hooks run without the lock: they set gauges and may register series. They are only ever
     * prepended, so the list read here stays valid while they run. */
    pthread_mutex_lock(&reg->mu);
    hook *hooks = reg->hooks;
    pthread_mutex_unlock(&reg->mu);
    for (hook *h = hooks; h != NULL; h = h->next)
        h->fn(h->opaque, reg);

    pthread_mutex_lock(&reg->mu);
    sb_puts(&b, ""); /* an empty registry renders as "" rather than NULL */
    for (const family *f = reg->first; f != NULL; f = f->next) {
        int any = 0;
        for (const wxg_metric_t *m = f->first; m != NULL && !any; m = m->next)
            any = atomic_load_explicit(&m->visible, memory_order_relaxed);
        if (!any)
            continue;
        sb_puts(&b, "# HELP ");
        sb_puts(&b, f->name);
        sb_puts(&b, " ");
        sb_escaped(&b, f->help, 0);
        sb_puts(&b, "\n# TYPE ");
        sb_puts(&b, f->name);
        sb_puts(&b, " ");
        sb_puts(&b, type_word(f->type));
        sb_puts(&b, "\n");
        for (const wxg_metric_t *m = f->first; m != NULL; m = m->next) {
            if (atomic_load_explicit(&m->visible, memory_order_relaxed))
                render_series(&b, m);
        }
    }
    pthread_mutex_unlock(&reg->mu);
    if (atomic_load(&reg->process))
        render_process(&b);
    if (b.oom) {
        free(b.p);
        return WXG_ENOMEM;
    }
    *out = b.p;
    if (len != NULL)
        *len = b.len;
    return 0;
}
