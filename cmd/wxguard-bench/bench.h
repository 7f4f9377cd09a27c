/*
 * wxguard-bench subcommands. Each takes the arguments after its name (argv[0] is the subcommand
 * name) and returns the process exit status. Add a subcommand by adding a file and a line to the
 * table in main.c.
 */
#ifndef WXGB_BENCH_H
#define WXGB_BENCH_H

#include <stdint.h>

#include "progclock.h"

int wxgb_guard_main(int argc, char **argv);
int wxgb_e2e_main(int argc, char **argv);
int wxgb_feed_main(int argc, char **argv);
int wxgb_post_main(int argc, char **argv);
int wxgb_hostile_main(int argc, char **argv);
int wxgb_protocol_main(int argc, char **argv);

/* One callback record of a generated stream (bench_kafka.c). */
typedef struct wxgb_rec {
    int32_t partition;
    uint64_t id;
    int conv;
    int format;      /* 0 wkteam, 1 GeWe, 2 generic */
    int account;     /* bot wxid_benchbot<account+1>, 4 digits */
    int text;        /* WXGB_TEXT_*: what the message says */
    const char *raw; /* when set, produced as is (poison input) */
} wxgb_rec_t;

/* Message texts: a plain numbered line, a greeting, a question about prices. */
enum { WXGB_TEXT_PLAIN, WXGB_TEXT_HELLO, WXGB_TEXT_PRICE };

/* The callback body of r in its format (wkteam: a group message; GeWe and generic: a private
 * chat), content padded to about `size` bytes. Returns the length (0 when cap is too small). */
size_t wxgb_render(char *buf, size_t cap, const wxgb_rec_t *r, size_t size);

/* Fills recs with n records over `partitions` (by conversation), a share `dup_ratio` of them
 * copies of earlier ones; ids start at id_base; formats 1 = generic only, 3 = all three.
 * Returns the number of unique messages. */
int wxgb_make_stream(wxgb_rec_t *recs, size_t n, int partitions, double dup_ratio, int convs,
                     uint64_t id_base, int formats, unsigned seed);
int wxgb_create_topic(const char *bootstrap, const char *topic, int partitions);
/* Produces the records (content padded to about `size` bytes) and waits for every report. */
int wxgb_produce(const char *bootstrap, const char *topic, const wxgb_rec_t *recs, size_t n,
                 size_t size);
/* End offsets / committed offsets per partition; return their sum or -1. */
int64_t wxgb_end_offsets(const char *bootstrap, const char *topic, int partitions, int64_t *ends);
int64_t wxgb_committed(const char *bootstrap, const char *group, const char *topic, int partitions,
                       int64_t *out);

/* The configuration keys and their one mapping (bench_conf.c), as wxguard-consumer uses them.
 * wxgb_conf_new: the keys' defaults, then `options` (properties text made from the subcommand's
 * own options; may be NULL), then `sets` ("key=value" from --set), which win. The wxgb_conf_*
 * mappings fill the structure as wxg_conf_guard() / wxg_conf_consumer() do; strings point into
 * `conf`, so free it (wxg_conf_free) only after the guard or consumer is gone. Each exits the
 * program with the key named when a value is refused. wxgb_props: a malloc'd formatted string
 * for `options`. */
struct wxg_conf_s;
struct wxg_guard_conf;
struct wxg_consumer_conf;
struct wxg_conf_s *wxgb_conf_new(const char *options, const char *const *sets, size_t nsets);
void wxgb_conf_guard(const struct wxg_conf_s *conf, struct wxg_guard_conf *out, char *prefix,
                     size_t prefix_size);
void wxgb_conf_consumer(const struct wxg_conf_s *conf, struct wxg_consumer_conf *out);
char *wxgb_props(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* At most this many --set options per run. */
#define WXGB_SETS_MAX 64

/* Redis server counters (bench_guard.c), over a probe connection (bench_redis.h); each exits
 * the program if INFO fails. */
struct wxgb_redis;
struct wxg_guard_conf;
/* A numeric field of INFO <section>. */
double wxgb_info_field(struct wxgb_redis *c, const char *section, const char *field);
/* used_cpu_sys + used_cpu_user, in seconds. */
double wxgb_redis_cpu_s(struct wxgb_redis *c);
/* Data commands Redis has run so far (INFO commandstats without script calls themselves and
 * administration), so that the commands scripts run are counted. */
double wxgb_data_calls(struct wxgb_redis *c);
/* Connects to every primary of the Redis Cluster whose seed nodes are `seeds` ("host:port,...",
 * CLUSTER SLOTS of the first), at most max of them, with the TLS settings and credentials of
 * `gc` (the mapped keys): out[i] and names[i] ("host:port"). Returns how many; exits the
 * program when a node cannot be reached. */
int wxgb_cluster_primaries(const char *seeds, const struct wxg_guard_conf *gc,
                           struct wxgb_redis **out, char (*names)[300], int max);

/* wxguard-bench guard --rate (bench_rate.c): memory per DONE marker at the steady-state density
 * of each rate in `rates` (a comma-separated list of messages/s) with the layout the guard
 * configured from `conf`'s keys (wxgb_conf_guard) chooses for it, `markers` markers per rate, on
 * the empty database `admin` is connected to (flushed between rates). Prints a table; returns
 * the exit status. */
struct wxg_conf_s;
int wxgb_rate_run(struct wxgb_redis *admin, const struct wxg_conf_s *conf, const char *rates,
                  uint64_t markers);

/* Shared helpers (main.c); the clock is prog_mono_us() (cmd/common/progclock.h). */
/* Parses "1,4,8,16" into out (at most max values, each 1..1024); returns the count or -1. */
int wxgb_parse_list(const char *s, int *out, int max);
/* Parses a positive integer option value; returns 0 or -1. */
int wxgb_parse_u64(const char *s, uint64_t *out);

#endif
