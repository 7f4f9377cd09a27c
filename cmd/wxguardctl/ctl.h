/*
 * Shared parts of wxguardctl's subcommands: exit statuses, the connection options every
 * Redis/Kafka subcommand takes, configuration loading through the conf module, the operator's
 * confirmation prompt, progress lines and small formatting helpers.
 *
 * The program is single-threaded; nothing here is thread-safe.
 */
#ifndef WXGUARDCTL_CTL_H
#define WXGUARDCTL_CTL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "wxguard/conf.h"
#include "wxguard/guard.h"

/* Exit statuses, the same for every subcommand (documented in `wxguardctl --help` and
 * docs/operating.md). */
#define EXIT_OK       0
#define EXIT_NOTFOUND 1 /* nothing matched, not found, refused, or only part of the work done */
#define EXIT_USAGE    2 /* bad arguments, bad configuration, unreadable input */
#define EXIT_CONN     3 /* Redis or Kafka unreachable, or authentication refused */
#define EXIT_ABORTED  4 /* the operator answered no at the confirmation prompt */

/* Long options shared by the Redis/Kafka subcommands; values above 1000 so they never clash
 * with a subcommand's own short options. */
enum { OPT_CONFIG = 1001, OPT_SET, OPT_REDIS, OPT_BROKERS, OPT_JSON, OPT_YES, OPT_QUIET };

#define CTL_COMMON_LONGOPTS                                                                       \
    {"config", required_argument, NULL, OPT_CONFIG}, {"set", required_argument, NULL, OPT_SET},   \
        {"redis", required_argument, NULL, OPT_REDIS},                                            \
        {"brokers", required_argument, NULL, OPT_BROKERS}, {"json", no_argument, NULL, OPT_JSON}, \
        {"quiet", no_argument, NULL, OPT_QUIET},                                                  \
    {                                                                                             \
        "help", no_argument, NULL, 'h'                                                            \
    }

/* The help text of the shared options. */
#define CTL_COMMON_HELP                                                                   \
    "connection (the same configuration the consumers use; see docs/configuration.md):\n" \
    "  -c, --config FILE    properties file (redis.*, guard.*, kafka.*, dlq.topic ...)\n" \
    "  -s, --set K=V        override one key (repeatable)\n"                              \
    "      --redis H:P      shorthand for --set redis.host=H --set redis.port=P\n"        \
    "      --brokers LIST   shorthand for --set kafka.bootstrap.servers=LIST\n"           \
    "  WXG_* environment variables apply as for the other programs.\n"                    \
    "output:\n"                                                                           \
    "      --json           machine-readable JSON on stdout\n"                            \
    "      --quiet          no progress lines on stderr\n"                                \
    "  -h, --help           this text\n"

#define CTL_EXIT_HELP                                                                           \
    "exit status: 0 done, 1 not found / nothing matched / refused / partly done,\n"             \
    "2 usage or configuration error, 3 Redis or Kafka unreachable or authentication refused,\n" \
    "4 answered no at the confirmation prompt\n"

typedef struct ctl_opts {
    const char *prog; /* "wxguardctl <cmd>" for messages */
    const char *config;
    const char **sets;
    size_t nsets, capsets;
    char *owned[4]; /* --set strings built from shorthands */
    size_t nowned;
    int json;
    int quiet;
    int yes;
} ctl_opts;

void ctl_opts_init(ctl_opts *o, const char *prog);
void ctl_opts_free(ctl_opts *o);

/* Handles a shared option (c from getopt_long). Returns 1 when handled, 0 when c is not a
 * shared option, -1 on a bad value (message printed). */
int ctl_common_opt(ctl_opts *o, int c, const char *arg);

/* Loads the configuration for wxguardctl. need_kafka: kafka.bootstrap.servers must be set.
 * Returns the configuration or NULL (message printed). */
wxg_conf_t *ctl_load_conf(const ctl_opts *o, int need_kafka);

/* Opens the guard from the configuration, through the same mapping as wxguard-consumer
 * (wxg_conf_guard). On failure prints the reason and sets *exit_code (EXIT_CONN for
 * unreachable/auth, EXIT_USAGE for configuration). */
wxg_guard_t *ctl_open_guard(const ctl_opts *o, const wxg_conf_t *conf, int *exit_code);

/* The exit status for a guard call-level error (prints the reason). */
int ctl_guard_error(const ctl_opts *o, wxg_guard_t *g, const char *what, int rc);

/* Asks "question [y/N] " on stderr and reads one line from stdin. 1 for y/yes, 0 otherwise
 * (EOF included). With o->yes it returns 1 without asking. */
int ctl_confirm(const ctl_opts *o, const char *question);

/* A progress line on stderr (unless --quiet), rate-limited to one per second unless `force`. */
void ctl_progress(const ctl_opts *o, int force, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "1d 2h 3m 4s", "350 ms", or "none" (ms < 0 from PTTL: -1 no TTL, -2 gone). */
void ctl_fmt_duration(int64_t ms, char *buf, size_t size);
/* "2026-01-02 03:04:05.678 UTC", or "-" for 0. */
void ctl_fmt_time(int64_t unix_ms, char *buf, size_t size);

/* The bucket width of the handle's compact DONE layout in ms (0 when unknown). */
int64_t ctl_bucket_ms(const wxg_guard_t *g);

/* The record as a JSON object (caller owns it). `bucket_ms` from ctl_bucket_ms. */
cJSON *ctl_record_json(const char *key, const wxg_guard_record_t *r, int64_t bucket_ms);

/* Prints the record in words. */
void ctl_record_text(FILE *out, const char *key, const wxg_guard_record_t *r, int64_t bucket_ms);

const char *ctl_state_name(wxg_guard_state_t s);

/* 1 when the idempotency key belongs to `account` (its account part, as the key module writes
 * it, followed by ':'). */
int ctl_key_in_account(const char *key, const char *account);

/* Prints a cJSON document on stdout followed by a newline, and frees it. */
void ctl_print_json(cJSON *doc);

/* Parses a decimal number within [min, max]. Returns 0 or -1. */
int ctl_parse_ll(const char *s, long long min, long long max, long long *out);

/* Subcommands. */
int ctl_cmd_inspect(int argc, char **argv);
void ctl_help_inspect(FILE *out);
int ctl_cmd_failed(int argc, char **argv);
void ctl_help_failed(FILE *out);
int ctl_cmd_release(int argc, char **argv);
void ctl_help_release(FILE *out);
int ctl_cmd_purge(int argc, char **argv);
void ctl_help_purge(FILE *out);
int ctl_cmd_redrive(int argc, char **argv);
void ctl_help_redrive(FILE *out);

#endif
