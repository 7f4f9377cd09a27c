/*
 * The start-up every long-running wxguard program shares: its command line
 * (--config FILE, --set K=V ..., --print-config, --check, --help, --version), loading the
 * configuration through the conf module, --print-config, --check, the log.* settings and the
 * configuration warnings.
 * Compiled into each program that uses it (cmd/<prog>/CMakeLists.txt adds progstart.c), so it
 * sees only the public API, as the rest of cmd/ does.
 *
 * Call it once from main() before starting threads: it uses getopt_long and the process-wide
 * log settings.
 */
#ifndef WXG_PROGSTART_H
#define WXG_PROGSTART_H

#include <stdio.h>

#include "wxguard/conf.h"
#include "wxguard/metrics.h"

/* Exit statuses shared by the programs (each one's --help lists them). */
#define PROG_EXIT_FATAL 1 /* a fatal error */
#define PROG_EXIT_USAGE 2 /* usage or configuration error */

/* Parses the command line of program `prog` (its name in messages and --version), loads the
 * configuration for `program` (a WXG_PROG_* bit) and applies its log.* keys, logging each
 * configuration warning. usage(out) prints the program's help. Returns the configuration (the
 * caller frees it with wxg_conf_free) when the program should go on; NULL when it should exit
 * with *exit_code: 0 after --help, --version, --print-config or --check (the configuration
 * loads and holds every key's rules; its warnings go to stderr), PROG_EXIT_USAGE for a bad
 * argument or configuration (the reason printed on stderr), PROG_EXIT_FATAL when out of memory
 * or the configuration could not be printed. */
wxg_conf_t *prog_start(int argc, char **argv, const char *prog, unsigned program,
                       void (*usage)(FILE *out), int *exit_code);

/* Applies the log.* keys (level, format, field size, personal ids, content, id salt) to the
 * process-wide log settings; prog_start does it, and so does a program that loads its
 * configuration otherwise (wxguardctl). Before threads start. */
void prog_setup_log(const wxg_conf_t *conf);

/* A program's metrics registry: the process families and wxg_build_info{program, version} = 1,
 * so that a dashboard tells which version each replica runs. NULL when out of memory; the
 * caller frees it with wxg_metrics_free. */
wxg_metrics_t *prog_metrics(const char *prog);

/* s, or NULL when s is NULL or empty: optional string keys default to "". */
const char *prog_nonempty(const char *s);

#endif /* WXG_PROGSTART_H */
