/*
 * Test support for end-to-end tests of wxguard-consumer: a private topic, group, dead-letter
 * topic and Redis key prefix per test; consumer replicas spawned as child processes (stopped by
 * PID); callback records in the generic format; the record plugin's ledger read back; committed
 * offsets sampled from the broker.
 *
 * Every function fails the current cmocka test on error. Call from the test's main thread.
 */
#ifndef WXG_CONSUMERTEST_H
#define WXG_CONSUMERTEST_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WXG_CT_MAX_PARTS    16
#define WXG_CT_MAX_REPLICAS 8

typedef struct wxg_ct {
    char *dir;   /* temp dir: config, ledger, logs */
    char *topic; /* fresh topic */
    char *dlq;   /* fresh dead-letter topic */
    char *group; /* fresh consumer group */
    char prefix[64];
    char ledger[512];
    char config[512];
    int partitions;
    const char *redis_host;
    int redis_port;
    int64_t produced[WXG_CT_MAX_PARTS]; /* records produced per partition (the end offsets) */
    pid_t pids[WXG_CT_MAX_REPLICAS];
    struct wxg_test_kafka_offsets_reader *offsets; /* made on first use */
} wxg_ct_t;

/* Creates the topics (partitions, and 1 for the DLQ) and the temp dir. */
void wxg_ct_setup(wxg_ct_t *t, const char *tag, int partitions);

/* Like wxg_ct_setup() but creates no topics: for brokers without the CreateTopics API (the
 * development broker, whose topics the test creates with its "topic" command). */
void wxg_ct_init(wxg_ct_t *t, const char *tag, int partitions);

/* Stops every replica still running (SIGKILL), removes the temp dir, frees the names. */
void wxg_ct_teardown(wxg_ct_t *t);

/* Writes the config file: servers, topics, group, prefix, `plugins = record` with the ledger,
 * then `extra` (more "key = value" lines, may override; may be NULL). */
void wxg_ct_write_config(wxg_ct_t *t, const char *extra);

/* Starts replica `idx` (stdout/stderr to <dir>/replica-<idx>.log). Returns its PID. */
pid_t wxg_ct_spawn(wxg_ct_t *t, int idx);
/* The same with `--set` flags for this replica only: `sets` is a NULL-terminated list of
 * "key=value" (may be NULL), e.g. a metrics.listen of its own. */
pid_t wxg_ct_spawn_set(wxg_ct_t *t, int idx, const char *const *sets);
/* Starts replica idx with a metrics.listen of its own on a free loopback port; returns the
 * port. */
int wxg_ct_spawn_metrics(wxg_ct_t *t, int idx);

/* Runs wxguardctl with `args` (NULL-terminated, the subcommand first) and nothing on stdin,
 * its stderr to <dir>/wxguardctl.err (printed when the exit status is not 0). Waits at most
 * timeout_ms (scaled), then kills it by PID and fails the test. Returns the exit status, with
 * stdout in *out (NUL-terminated; the caller frees it). */
int wxg_ct_run_ctl(const wxg_ct_t *t, const char *const *args, int64_t timeout_ms, char **out);

/* The sum over the replicas listening on ports[0..n) of the sample `series` of their /metrics
 * (name with its labels as rendered); fails the test when one does not answer with it. */
double wxg_ct_metric_sum(const int *ports, int n, const char *series);

/* Sends `sig` to replica idx and, for SIGTERM/SIGKILL, waits for it to exit (bounded). Returns
 * its exit status as from waitpid (or -1 when it did not exit in time). */
int wxg_ct_signal(wxg_ct_t *t, int idx, int sig, int64_t timeout_ms);
/* Waits for replica idx to exit by itself, at most timeout_ms (scaled). Returns its exit status
 * as from waitpid, or -1 when it did not exit in time. */
int wxg_ct_wait_exit(wxg_ct_t *t, int idx, int64_t timeout_ms);

/* Asserts that `st` (from wxg_ct_signal for replica idx) is a normal exit with status `code`.
 * Otherwise prints how the replica ended (exit code, signal, or still running) and the last
 * lines of its log, then fails the test. */
void wxg_ct_assert_exit(const wxg_ct_t *t, int idx, int st, int code);

/* 1 when replica idx is still running. */
int wxg_ct_alive(wxg_ct_t *t, int idx);

/* SIGTERMs every replica still running and asserts that each exits 0 within 60 s. */
void wxg_ct_stop_all(wxg_ct_t *t);

/* One callback to produce: message id `id` (decimal digits) of conversation `conv`. */
typedef struct wxg_ct_msg {
    int32_t partition;
    uint64_t id;
    int conv;
} wxg_ct_msg_t;

/* Produces the messages (generic format, account "wxid_ctbot0001") in order and counts them in
 * t->produced. `raw` records (may be NULL) are produced as they are instead, for poison input. */
void wxg_ct_produce(wxg_ct_t *t, const wxg_ct_msg_t *msgs, size_t n);
void wxg_ct_produce_raw(wxg_ct_t *t, int32_t partition, const char *value);

/* The message id at each offset: for msgs[0..n) produced in this order to a fresh topic, ids[p]
 * (p < t->partitions; allocated here, n entries each) gets the id of the message at each
 * offset of partition p, for wxg_ct_check_commit_invariant(). Free with wxg_ct_free_offsets. */
void wxg_ct_index_offsets(const wxg_ct_t *t, const wxg_ct_msg_t *msgs, size_t n, uint64_t **ids);
void wxg_ct_free_offsets(const wxg_ct_t *t, uint64_t **ids);

/* The ledger: per message id, how many effect lines, and for each the fence and pid. */
typedef struct wxg_ct_effect {
    uint64_t id;
    uint64_t fence;
    uint64_t attempt; /* the claim's attempt number (0 when the line has none) */
    long pid;
    int32_t partition;
    int64_t offset;
    int64_t time_ms; /* wall clock of the effect, ms since the epoch (0 when none) */
} wxg_ct_effect_t;

/* Reads the ledger; returns the number of lines parsed into *out (caller frees). Lines that are
 * not JSON (a torn write) are skipped and counted in *torn (may be NULL). */
size_t wxg_ct_read_ledger(const wxg_ct_t *t, wxg_ct_effect_t **out, size_t *torn);
/* The number of effects in the ledger now. */
size_t wxg_ct_ledger_lines(const wxg_ct_t *t);

/* Committed offset of partition p for the test's group (-1001 when none), read by a client
 * that stays connected (one request, a few milliseconds). */
int64_t wxg_ct_committed(wxg_ct_t *t, int32_t p);

/* The committed offsets of every partition, from one request, into out[t->partitions]. */
void wxg_ct_committed_all(wxg_ct_t *t, int64_t *out);

/* Waits until every partition's committed offset equals t->produced[p]. Returns 1 on success,
 * 0 after timeout_ms (scaled). While waiting, calls check (may be NULL) about once a second. */
int wxg_ct_wait_all_committed(wxg_ct_t *t, int64_t timeout_ms, void (*check)(wxg_ct_t *));

/* The same, sampling the committed offsets and calling check every period_ms. */
int wxg_ct_wait_all_committed_every(wxg_ct_t *t, int64_t timeout_ms, void (*check)(wxg_ct_t *),
                                    int64_t period_ms);

/* Asserts that a committed offset never passed a message without its effect: for every
 * partition, every produced message below the committed offset sampled now has a ledger
 * line. `offset_ids[p][o]` gives the message id at offset o of partition p (0 = not a message
 * with an id, e.g. poison). */
void wxg_ct_check_commit_invariant(wxg_ct_t *t, uint64_t *const *offset_ids);

/* Asserts that the ledger holds exactly one effect of each message id base .. base + total - 1
 * and nothing else. */
void wxg_ct_assert_each_once(const wxg_ct_t *t, uint64_t base, size_t total);

/* A replica stopped by the test: its pid, the signal, and the wall clock (ms since the epoch,
 * as the ledger's time_ms) just before the signal was sent and once the replica was reaped. */
typedef struct wxg_ct_stop {
    long pid;
    int sig;
    int64_t sent_ms;
    int64_t exited_ms;
} wxg_ct_stop_t;

/* Like wxg_ct_signal() for SIGKILL or SIGTERM, and notes the stop in *stop. */
int wxg_ct_stop(wxg_ct_t *t, int idx, int sig, int64_t timeout_ms, wxg_ct_stop_t *stop);

/* Why a message took effect more than once, judged from the ledger and the test's stops. For
 * each effect after a message's first (in the ledger's order of time), the effect before it
 * is the "earlier" one:
 *   CRASH     the earlier one's process was SIGKILLed after it (the effect happened, the
 *             process died before its DONE or sub-marker was written), and the repeat is a new
 *             claim (a higher fencing token) after the kill: the one expected kind;
 *   SIGTERM   the earlier one's process was stopped with SIGTERM after it: a drain that let an
 *             effect go without its marker;
 *   SAME      the repeat carries the same fencing token: one claim ran the plugin twice;
 *   LIVE      the earlier one's process was not stopped after it: a lease lost while it lived,
 *             a rebalance or a BUSY retry let another claim in. */
enum {
    WXG_CT_REPEAT_CRASH,
    WXG_CT_REPEAT_SIGTERM,
    WXG_CT_REPEAT_SAME,
    WXG_CT_REPEAT_LIVE,
    WXG_CT_REPEAT_KINDS
};

typedef struct wxg_ct_repeats {
    size_t n[WXG_CT_REPEAT_KINDS];
    size_t total;
    /* Of the CRASH repeats: the largest time from the earlier effect to the kill (ms). */
    int64_t crash_window_max_ms;
    /* Messages whose effect came from a claim after a stop's (fence > 1 and an effect after the
     * stop was sent): work the stopped replica held. Indexed like `stops`. */
    size_t taken_over[WXG_CT_MAX_REPLICAS];
} wxg_ct_repeats_t;

/* Reads the ledger and classifies every repeated effect (see above), printing one line per
 * repeat: the message, each effect's process, fence, attempt and time relative to the stops.
 * `stops` (n of them, at most WXG_CT_MAX_REPLICAS) are the replicas the test stopped. */
void wxg_ct_classify_repeats(const wxg_ct_t *t, const wxg_ct_stop_t *stops, size_t n,
                             wxg_ct_repeats_t *out);

/* Counts lines of replica idx's log containing `needle`. */
int wxg_ct_log_count(const wxg_ct_t *t, int idx, const char *needle);

/* The sum of N over the lines of replica idx's log that contain `prefix` followed by a number
 * N (e.g. "event=assigned partitions="). */
long wxg_ct_log_sum(const wxg_ct_t *t, int idx, const char *prefix);

/* Waits until replica idx's log has at least `count` lines containing `needle`, at most
 * timeout_ms (scaled). Returns 1, or 0 on timeout. */
int wxg_ct_wait_log(const wxg_ct_t *t, int idx, const char *needle, int count, int64_t timeout_ms);

/* The value N of the last " key=N" in lines of replica idx's log that contain `event` (e.g.
 * "event=stats", whose last line is the replica's final count when it stopped), or -1 when no
 * such line has the key. */
int64_t wxg_ct_log_last(const wxg_ct_t *t, int idx, const char *event, const char *key);

#endif /* WXG_CONSUMERTEST_H */
