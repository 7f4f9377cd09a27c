/*
 * The shared start-up of wxguard's long-running programs (see progstart.h). Single-threaded:
 * it runs in main() before any thread starts.
 */
#include "progstart.h"

#include <getopt.h>
#include <librdkafka/rdkafka.h>
#include <stdlib.h>

#include "wxguard/log.h"
#include "wxguard/metrics.h"

const char *prog_nonempty(const char *s)
{
    return s && *s ? s : NULL;
}

void prog_setup_log(const wxg_conf_t *conf)
{
    wxg_log_level_t lvl;
    if (wxg_log_level_parse(wxg_conf_get(conf, "log.level"), &lvl) == 0)
        wxg_log_set_level(lvl);
    wxg_log_format_t fmt;
    if (wxg_log_format_parse(wxg_conf_get(conf, "log.format"), &fmt) == 0)
        wxg_log_set_format(fmt);
    wxg_log_set_field_max((size_t)wxg_conf_int(conf, "log.field.max.bytes"));
    wxg_log_set_personal_ids(wxg_conf_bool(conf, "log.personal.ids"));
    wxg_log_set_content(wxg_conf_bool(conf, "log.content"));
    wxg_log_set_id_salt(prog_nonempty(wxg_conf_get(conf, "log.id.salt")));
}

wxg_conf_t *prog_start(int argc, char **argv, const char *prog, unsigned program,
                       void (*usage)(FILE *out), int *exit_code)
{
    const char *config = NULL;
    int print_config = 0, check_only = 0;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    size_t nsets = 0;
    if (!sets) {
        *exit_code = PROG_EXIT_FATAL;
        return NULL;
    }
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"set", required_argument, NULL, 's'},
                                         {"print-config", no_argument, NULL, 'p'},
                                         {"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'V'},
                                         {"check", no_argument, NULL, 'C'},
                                         {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "c:s:phVC", opts, NULL)) != -1) {
        switch (ch) {
        case 'C':
            check_only = 1;
            break;
        case 'c':
            config = optarg;
            break;
        case 's':
            sets[nsets++] = optarg;
            break;
        case 'p':
            print_config = 1;
            break;
        case 'h':
            usage(stdout);
            free(sets);
            *exit_code = 0;
            return NULL;
        case 'V':
            printf("%s %s (librdkafka %s)\n", prog, WXG_VERSION_STRING, rd_kafka_version_str());
            free(sets);
            *exit_code = 0;
            return NULL;
        default:
            usage(stderr);
            free(sets);
            *exit_code = PROG_EXIT_USAGE;
            return NULL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        usage(stderr);
        free(sets);
        *exit_code = PROG_EXIT_USAGE;
        return NULL;
    }

    char err[512] = "";
    wxg_conf_t *conf = wxg_conf_load(program, config, NULL, sets, nsets, err, sizeof err);
    free(sets);
    if (!conf) {
        fprintf(stderr, "%s: %s\n", prog, err);
        *exit_code = PROG_EXIT_USAGE;
        return NULL;
    }
    if (check_only) {
        /* The configuration as the program would load it: every key known, typed and within
         * its limits, the cross-key rules held; warnings on stderr. No server is contacted. */
        for (size_t i = 0; i < wxg_conf_warning_count(conf); i++)
            fprintf(stderr, "%s: warning: %s\n", prog, wxg_conf_warning(conf, i));
        printf("%s: configuration %s is valid\n", prog, config ? config : "(defaults)");
        wxg_conf_free(conf);
        *exit_code = 0;
        return NULL;
    }
    if (print_config) {
        int rc = wxg_conf_print(conf, stdout);
        wxg_conf_free(conf);
        *exit_code = rc == 0 ? 0 : PROG_EXIT_FATAL;
        return NULL;
    }
    prog_setup_log(conf);
    for (size_t i = 0; i < wxg_conf_warning_count(conf); i++)
        wxg_log(WXG_LOG_WARN, "config_warning", WXG_LS("detail", wxg_conf_warning(conf, i)));
    *exit_code = 0;
    return conf;
}

wxg_metrics_t *prog_metrics(const char *prog)
{
    wxg_metrics_t *m = wxg_metrics_new();
    if (!m)
        return NULL;
    wxg_metrics_add_process(m);
    wxg_metric_t *info =
        wxg_metrics_gauge(m, "wxg_build_info", "The program and its version; always 1.", "program",
                          prog, "version", WXG_VERSION_STRING, NULL);
    if (!info) {
        wxg_metrics_free(m);
        return NULL;
    }
    wxg_gauge_set(info, 1);
    return m;
}
