/* Unit tests for lib/metrics.c: the exact Prometheus 0.0.4 text, label and help escaping,
 * registration rules, hidden gauges, collect hooks, sums that stay exact under concurrent
 * updates, and the process figures read from /proc. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wxguard/err.h"
#include "wxguard/metrics.h"

static char *render(wxg_metrics_t *reg)
{
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(wxg_metrics_render(reg, &out, &len), 0);
    assert_non_null(out);
    assert_int_equal(len, strlen(out));
    return out;
}

static void exposition_text_is_exact(void **state)
{
    (void)state;
    wxg_metrics_t *reg = wxg_metrics_new();
    assert_non_null(reg);
    wxg_metric_t *dup = wxg_metrics_counter(reg, "wxg_guard_claims_total", "Claims by outcome.",
                                            "outcome", "duplicate", NULL);
    wxg_metric_t *claimed =
        wxg_metrics_counter(reg, "wxg_guard_claims_total", "ignored", "outcome", "claimed", NULL);
    wxg_metric_t *inflight = wxg_metrics_gauge(reg, "wxg_inflight", "In-flight messages.", NULL);
    wxg_metric_t *lag = wxg_metrics_gauge(reg, "wxg_consumer_lag", "Lag per partition.", "topic",
                                          "in", "partition", "3", NULL);
    static const double b[] = {0.01, 0.1, 1};
    wxg_metric_t *lat =
        wxg_metrics_histogram(reg, "wxg_claim_seconds", "Claim latency.", b, 3, NULL);
    wxg_metric_t *plat = wxg_metrics_histogram(reg, "wxg_plugin_seconds", "Plugin latency.", b, 3,
                                               "plugin", "record", NULL);
    assert_non_null(dup);
    assert_non_null(claimed);
    assert_non_null(lat);
    wxg_counter_add(dup, 3);
    wxg_counter_inc(claimed);
    wxg_gauge_set(inflight, 12);
    wxg_gauge_add(inflight, -2.5);
    wxg_gauge_set(lag, 1e6);
    wxg_histogram_observe(lat, 0.005);
    wxg_histogram_observe(lat, 0.01); /* a bound is inclusive */
    wxg_histogram_observe(lat, 0.5);
    wxg_histogram_observe(lat, 7);
    wxg_histogram_observe(plat, 0.25);

    char *out = render(reg);
    assert_string_equal(out, "# HELP wxg_guard_claims_total Claims by outcome.\n"
                             "# TYPE wxg_guard_claims_total counter\n"
                             "wxg_guard_claims_total{outcome=\"duplicate\"} 3\n"
                             "wxg_guard_claims_total{outcome=\"claimed\"} 1\n"
                             "# HELP wxg_inflight In-flight messages.\n"
                             "# TYPE wxg_inflight gauge\n"
                             "wxg_inflight 9.5\n"
                             "# HELP wxg_consumer_lag Lag per partition.\n"
                             "# TYPE wxg_consumer_lag gauge\n"
                             "wxg_consumer_lag{topic=\"in\",partition=\"3\"} 1000000\n"
                             "# HELP wxg_claim_seconds Claim latency.\n"
                             "# TYPE wxg_claim_seconds histogram\n"
                             "wxg_claim_seconds_bucket{le=\"0.01\"} 2\n"
                             "wxg_claim_seconds_bucket{le=\"0.1\"} 2\n"
                             "wxg_claim_seconds_bucket{le=\"1\"} 3\n"
                             "wxg_claim_seconds_bucket{le=\"+Inf\"} 4\n"
                             "wxg_claim_seconds_sum 7.515\n"
                             "wxg_claim_seconds_count 4\n"
                             "# HELP wxg_plugin_seconds Plugin latency.\n"
                             "# TYPE wxg_plugin_seconds histogram\n"
                             "wxg_plugin_seconds_bucket{plugin=\"record\",le=\"0.01\"} 0\n"
                             "wxg_plugin_seconds_bucket{plugin=\"record\",le=\"0.1\"} 0\n"
                             "wxg_plugin_seconds_bucket{plugin=\"record\",le=\"1\"} 1\n"
                             "wxg_plugin_seconds_bucket{plugin=\"record\",le=\"+Inf\"} 1\n"
                             "wxg_plugin_seconds_sum{plugin=\"record\"} 0.25\n"
                             "wxg_plugin_seconds_count{plugin=\"record\"} 1\n");
    free(out);
    assert_int_equal(wxg_counter_value(dup), 3);
    assert_true(wxg_gauge_value(inflight) == 9.5);
    assert_int_equal(wxg_histogram_count(lat), 4);
    assert_true(fabs(wxg_histogram_sum(lat) - 7.515) < 1e-12);
    wxg_metrics_free(reg);
}

static void label_values_and_help_are_escaped(void **state)
{
    (void)state;
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_metric_t *m = wxg_metrics_gauge(reg, "wxg_x", "Line one\nback\\slash \"quoted\"", "v",
                                        "a\"b\\c\nd", NULL);
    wxg_gauge_set(m, -0.1);
    wxg_metric_t *inf = wxg_metrics_gauge(reg, "wxg_inf", "Infinite.", NULL);
    wxg_gauge_set(inf, INFINITY);
    wxg_metric_t *nan_ = wxg_metrics_gauge(reg, "wxg_nan", "Not a number.", NULL);
    wxg_gauge_set(nan_, NAN);
    char *out = render(reg);
    assert_string_equal(out, "# HELP wxg_x Line one\\nback\\\\slash \"quoted\"\n"
                             "# TYPE wxg_x gauge\n"
                             "wxg_x{v=\"a\\\"b\\\\c\\nd\"} -0.1\n"
                             "# HELP wxg_inf Infinite.\n"
                             "# TYPE wxg_inf gauge\n"
                             "wxg_inf +Inf\n"
                             "# HELP wxg_nan Not a number.\n"
                             "# TYPE wxg_nan gauge\n"
                             "wxg_nan NaN\n");
    free(out);
    wxg_metrics_free(reg);
}

static void registration_finds_existing_series_and_refuses_conflicts(void **state)
{
    (void)state;
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_metric_t *a = wxg_metrics_counter(reg, "wxg_a_total", "A.", "k", "1", NULL);
    assert_non_null(a);
    assert_ptr_equal(wxg_metrics_counter(reg, "wxg_a_total", "A.", "k", "1", NULL), a);
    assert_ptr_not_equal(wxg_metrics_counter(reg, "wxg_a_total", "A.", "k", "2", NULL), a);
    /* Same name, other type or other label names. */
    assert_null(wxg_metrics_gauge(reg, "wxg_a_total", "A.", "k", "1", NULL));
    assert_null(wxg_metrics_counter(reg, "wxg_a_total", "A.", "j", "1", NULL));
    assert_null(wxg_metrics_counter(reg, "wxg_a_total", "A.", NULL));
    /* Invalid names and labels. */
    assert_null(wxg_metrics_counter(reg, "9lives", "x", NULL));
    assert_null(wxg_metrics_counter(reg, "has-dash", "x", NULL));
    assert_null(wxg_metrics_counter(reg, "wxg_b", "x", "__reserved", "1", NULL));
    assert_null(wxg_metrics_counter(reg, "wxg_b", "x", "a:b", "1", NULL));
    assert_null(wxg_metrics_counter(reg, "wxg_b", "x", "k", "1", "k", "2", NULL));
    assert_null(wxg_metrics_counter(reg, "wxg_b", "x", "a", "1", "b", "2", "c", "3", "d", "4", "e",
                                    "5", NULL));
    assert_null(wxg_metrics_histogram(reg, "wxg_h", "x", NULL, 0, "le", "1", NULL));
    static const double bad[] = {1, 1};
    assert_null(wxg_metrics_histogram(reg, "wxg_h", "x", bad, 2, NULL));
    static const double other[] = {1, 2};
    assert_non_null(wxg_metrics_histogram(reg, "wxg_h", "x", NULL, 0, NULL));
    assert_null(wxg_metrics_histogram(reg, "wxg_h", "x", other, 2, NULL));
    /* Updates of the wrong type and through NULL do nothing. */
    wxg_gauge_set(a, 5);
    wxg_counter_inc(NULL);
    wxg_histogram_observe(NULL, 1);
    assert_int_equal(wxg_counter_value(a), 0);
    wxg_metrics_free(reg);
    wxg_metrics_free(NULL);
}

static void cleared_gauges_disappear_until_set_again(void **state)
{
    (void)state;
    wxg_metrics_t *reg = wxg_metrics_new();
    wxg_metric_t *p0 = wxg_metrics_gauge(reg, "wxg_lag", "Lag.", "partition", "0", NULL);
    wxg_metric_t *p1 = wxg_metrics_gauge(reg, "wxg_lag", "Lag.", "partition", "1", NULL);
    wxg_gauge_set(p0, 5);
    wxg_gauge_set(p1, 7);
    wxg_gauge_clear(p0);
    char *out = render(reg);
    assert_string_equal(out, "# HELP wxg_lag Lag.\n# TYPE wxg_lag gauge\n"
                             "wxg_lag{partition=\"1\"} 7\n");
    free(out);
    wxg_gauge_clear(p1);
    out = render(reg);
    assert_string_equal(out, "");
    free(out);
    wxg_gauge_set(p0, 1);
    out = render(reg);
    assert_string_equal(out, "# HELP wxg_lag Lag.\n# TYPE wxg_lag gauge\n"
                             "wxg_lag{partition=\"0\"} 1\n");
    free(out);
    wxg_metrics_free(reg);
}

static void on_collect(void *opaque, wxg_metrics_t *reg)
{
    int *calls = opaque;
    (*calls)++;
    wxg_gauge_set(wxg_metrics_gauge(reg, "wxg_queue_depth", "Queue depth.", NULL), *calls * 10);
}

static void collect_hooks_run_before_each_render(void **state)
{
    (void)state;
    int calls = 0;
    wxg_metrics_t *reg = wxg_metrics_new();
    assert_int_equal(wxg_metrics_on_collect(reg, on_collect, &calls), 0);
    assert_int_equal(wxg_metrics_on_collect(reg, NULL, NULL), WXG_EINVAL);
    char *out = render(reg);
    assert_non_null(strstr(out, "wxg_queue_depth 10\n"));
    free(out);
    out = render(reg);
    assert_non_null(strstr(out, "wxg_queue_depth 20\n"));
    free(out);
    assert_int_equal(calls, 2);
    wxg_metrics_free(reg);
}

#define THREADS 8
#define ROUNDS  20000

typedef struct shared {
    wxg_metrics_t *reg;
    wxg_metric_t *c, *g, *h;
} shared;

static void *hammer(void *arg)
{
    shared *s = arg;
    for (int i = 0; i < ROUNDS; i++) {
        wxg_counter_inc(s->c);
        wxg_gauge_add(s->g, 1);
        wxg_histogram_observe(s->h, (i % 4) * 0.25); /* 0, .25, .5, .75: exact in binary */
        /* Lookups and renders run alongside the updates. */
        if (i % 5000 == 0) {
            char *out = NULL;
            assert_ptr_equal(wxg_metrics_counter(s->reg, "wxg_ops_total", "Ops.", NULL), s->c);
            assert_int_equal(wxg_metrics_render(s->reg, &out, NULL), 0);
            free(out);
        }
    }
    return NULL;
}

static void concurrent_updates_sum_exactly(void **state)
{
    (void)state;
    shared s;
    static const double b[] = {0.25, 0.5};
    s.reg = wxg_metrics_new();
    s.c = wxg_metrics_counter(s.reg, "wxg_ops_total", "Ops.", NULL);
    s.g = wxg_metrics_gauge(s.reg, "wxg_level", "Level.", NULL);
    s.h = wxg_metrics_histogram(s.reg, "wxg_lat", "Lat.", b, 2, NULL);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, hammer, &s), 0);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    const uint64_t n = (uint64_t)THREADS * ROUNDS;
    assert_int_equal(wxg_counter_value(s.c), n);
    assert_true(wxg_gauge_value(s.g) == (double)n);
    assert_int_equal(wxg_histogram_count(s.h), n);
    assert_true(wxg_histogram_sum(s.h) == (double)n / 4 * (0 + 0.25 + 0.5 + 0.75));
    char *out = render(s.reg);
    char want[256];
    snprintf(want, sizeof want,
             "wxg_lat_bucket{le=\"0.25\"} %llu\nwxg_lat_bucket{le=\"0.5\"} %llu\n"
             "wxg_lat_bucket{le=\"+Inf\"} %llu\n",
             (unsigned long long)(n / 2), (unsigned long long)(3 * n / 4), (unsigned long long)n);
    assert_non_null(strstr(out, want));
    free(out);
    wxg_metrics_free(s.reg);
}

static void process_stats_describe_this_process_and_a_child(void **state)
{
    (void)state;
    wxg_process_stats_t a, b;
    assert_int_equal(wxg_process_stats(0, &a), 0);
    assert_true(a.cpu_seconds >= 0);
    assert_true(a.resident_bytes > 0);
    assert_true(a.virtual_bytes >= a.resident_bytes);
    double now = (double)time(NULL);
    assert_true(a.start_time_seconds > now - 3600 && a.start_time_seconds <= now + 2);
    assert_true(a.max_fds > 0);

    /* Two more descriptors are counted exactly. */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(wxg_process_stats((long)getpid(), &b), 0);
    assert_true(b.open_fds == a.open_fds + 2);
    close(fds[0]);
    close(fds[1]);

    /* CPU time grows with work (bounded: at most 2 s of it). */
    clock_t c0 = clock();
    volatile unsigned long spin = 0;
    while (clock() - c0 < CLOCKS_PER_SEC / 10 && clock() - c0 < 2 * CLOCKS_PER_SEC)
        spin++;
    assert_int_equal(wxg_process_stats(0, &b), 0);
    assert_true(b.cpu_seconds >= a.cpu_seconds + 0.05);

    /* Another process, then the same pid once it is gone. The child counts its own
     * descriptors and sends the figure: what we read of it must be the same. (Comparing with
     * our own count instead fails under valgrind, whose private descriptors differ between a
     * process and its fork.) The child dies with us, so a failed assertion here cannot leave
     * it holding the test's output open. */
    int report[2];
    assert_int_equal(pipe(report), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        wxg_process_stats_t own;
        double n = wxg_process_stats(0, &own) == 0 ? own.open_fds : -1;
        if (write(report[1], &n, sizeof n) != (ssize_t)sizeof n)
            _exit(1);
        pause();
        _exit(0);
    }
    double told = -2;
    assert_int_equal(read(report[0], &told, sizeof told), (ssize_t)sizeof told);
    wxg_process_stats_t c;
    assert_int_equal(wxg_process_stats((long)child, &c), 0);
    close(report[0]);
    close(report[1]);
    assert_true(c.resident_bytes > 0);
    assert_true(c.start_time_seconds >= a.start_time_seconds);
    if (c.open_fds != told)
        fail_msg("read %.0f descriptors of the child, which counts %.0f", c.open_fds, told);
    kill(child, SIGKILL);
    assert_int_equal(waitpid(child, NULL, 0), child);
    assert_int_equal(wxg_process_stats((long)child, &c), WXG_ENOTFOUND);

    assert_int_equal(wxg_process_stats(-1, &c), WXG_EINVAL);
    assert_int_equal(wxg_process_stats(0, NULL), WXG_EINVAL);
}

/* The value of an unlabelled sample in a rendered text, or -1 when absent. */
static double sample_of(const char *text, const char *name)
{
    char want[128];
    snprintf(want, sizeof want, "\n%s ", name);
    const char *at = strstr(text, want);
    return at ? strtod(at + strlen(want), NULL) : -1;
}

static void process_families_are_rendered_only_when_asked(void **state)
{
    (void)state;
    wxg_metrics_t *reg = wxg_metrics_new();
    assert_non_null(reg);
    wxg_gauge_set(wxg_metrics_gauge(reg, "wxg_up", "Up.", NULL), 1);
    char *out = render(reg);
    assert_null(strstr(out, "process_"));
    free(out);

    assert_int_equal(wxg_metrics_add_process(reg), 0);
    assert_int_equal(wxg_metrics_add_process(NULL), WXG_EINVAL);
    out = render(reg);
    /* The registry's own families come first, then the process ones with HELP and TYPE. */
    assert_true(strstr(out, "wxg_up 1\n") < strstr(out, "process_cpu_seconds_total"));
    assert_non_null(strstr(out, "# TYPE process_cpu_seconds_total counter\n"));
    assert_non_null(strstr(out, "# TYPE process_resident_memory_bytes gauge\n"));
    assert_non_null(strstr(out, "# HELP process_open_fds "));
    assert_true(sample_of(out, "process_cpu_seconds_total") >= 0);
    assert_true(sample_of(out, "process_resident_memory_bytes") > 0);
    assert_true(sample_of(out, "process_virtual_memory_bytes") > 0);
    assert_true(sample_of(out, "process_start_time_seconds") > 1e9);
    assert_true(sample_of(out, "process_open_fds") >= 3);
    assert_true(sample_of(out, "process_max_fds") > 0);
    free(out);
    wxg_metrics_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exposition_text_is_exact),
        cmocka_unit_test(label_values_and_help_are_escaped),
        cmocka_unit_test(registration_finds_existing_series_and_refuses_conflicts),
        cmocka_unit_test(cleared_gauges_disappear_until_set_again),
        cmocka_unit_test(collect_hooks_run_before_each_render),
        cmocka_unit_test(concurrent_updates_sum_exactly),
        cmocka_unit_test(process_stats_describe_this_process_and_a_child),
        cmocka_unit_test(process_families_are_rendered_only_when_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
