/*
 * wxguard-bench subcommands. Each takes the arguments after its name (argv[0] is the subcommand
 * name) and returns the process exit status. Add a subcommand by adding a file and a line to the
 * table in main.c.
 */
#ifndef WXGB_BENCH_H
#define WXGB_BENCH_H

#include <stdint.h>

int wxgb_guard_main(int argc, char **argv);

/* Shared helpers (main.c). */
int64_t wxgb_now_us(void);
/* Parses "1,4,8,16" into out (at most max values, each 1..1024); returns the count or -1. */
int wxgb_parse_list(const char *s, int *out, int max);
/* Parses a positive integer option value; returns 0 or -1. */
int wxgb_parse_u64(const char *s, uint64_t *out);

#endif
