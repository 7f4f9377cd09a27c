/*
 * An in-memory guard for unit tests: a design behind the guard's operations table
 * (lib/guard/guard_int.h) with the state machine of docs/guard.md §1 and nothing of Redis.
 *
 * One fakeguard_t is one shared "Redis": every handle made from it (one per worker thread, one
 * for a watchdog) sees the same messages. The state is guarded by one mutex, so handles may be
 * used from different threads at once; each handle, like a real one, by one thread at a time.
 *
 * Semantics, per message (as the Lua scripts do them):
 *   claim     absent -> CLAIMED, fence 1, attempt 1; FAILED or PROCESSING with an expired lease
 *             -> CLAIMED, fence + 1, attempt + 1, with the finished plugins; DONE -> DUPLICATE
 *             (payload_mismatch when the payload tag differs from the one claimed); PROCESSING
 *             with a live lease -> BUSY with lease_ms_left.
 *   renew, plugin_done, complete, fail: only for the ticket's owner and fence while the
 *             message is PROCESSING (an expired lease still counts, as in Redis), else
 *             LEASE_LOST and nothing changes; complete of a DONE message is ALREADY_DONE.
 *   fail      -> FAILED with reason and attempts; fence and finished plugins kept.
 *   inspect, release, rearm, purge, scan: as docs/guard.md says; scan reports every record in
 *             one page (the cursor comes back 0).
 * Leases run on CLOCK_MONOTONIC plus what fakeguard_advance() added; records and DONE markers
 * never expire. Owner tokens are random.
 * Counters (wxg_guard_get_stats) are kept as the Lua design keeps them, round_trips counting
 * one per call that was not made to fail.
 */
#ifndef WXG_TEST_FAKEGUARD_H
#define WXG_TEST_FAKEGUARD_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/guard.h"

typedef struct fakeguard fakeguard_t;

typedef enum {
    FG_CLAIM,
    FG_RENEW,
    FG_PLUGIN_DONE,
    FG_COMPLETE,
    FG_FAIL,
    FG_PING,
    FG_OP_N
} fakeguard_op;

/* A new, empty "Redis". NULL on allocation failure. */
fakeguard_t *fakeguard_new(void);

/* Frees it; call after every handle made from it is destroyed. NULL is accepted. */
void fakeguard_destroy(fakeguard_t *f);

/* A guard handle over `f`; free it with wxg_guard_destroy(). `conf` (NULL: the defaults of
 * wxg_guard_conf_init) gives lease_ms, inflight_ttl_ms, failed_retention_ms and
 * done_retention_ms; nothing connects. NULL on allocation failure. */
wxg_guard_t *fakeguard_handle(fakeguard_t *f, const wxg_guard_conf_t *conf);

/* The next `count` calls of `op`, from any handle, fail with `rc` (a negative WXG_E* code such
 * as WXG_ECONN, WXG_ETIMEDOUT, WXG_ECONFIG or WXG_EAUTH) and change nothing. A later call
 * replaces what is left of an earlier one for the same op; count 0 cancels it. */
void fakeguard_fail_next(fakeguard_t *f, fakeguard_op op, int rc, int count);

/* Makes `key` DONE, as if another worker completed it (claims are then DUPLICATE). */
void fakeguard_set_done(fakeguard_t *f, const char *key);

/* Makes another owner hold `key` with a live lease of lease_ms (claims are then BUSY). */
void fakeguard_set_busy(fakeguard_t *f, const char *key, int64_t lease_ms);

/* Another owner takes `key` over now (fence + 1, a lease of 30 s): the current owner's next
 * transitions are LEASE_LOST. */
void fakeguard_steal(fakeguard_t *f, const char *key);

/* Gives `key` a guard state the consumer cannot act on, as a field value the layout does not
 * write: every claim answers BUSY with unreadable set, for ever. */
void fakeguard_set_unreadable(fakeguard_t *f, const char *key);

/* Moves the fake's clock forward by ms, so that leases expire without sleeping. */
void fakeguard_advance(fakeguard_t *f, int64_t ms);

/* The state of `key`, with its fence and attempt (either pointer may be NULL): for DONE those
 * the message had when it was completed, for ABSENT 0. */
wxg_guard_state_t fakeguard_state(fakeguard_t *f, const char *key, uint64_t *fence,
                                  uint32_t *attempt);

/* Calls of `op` made so far from every handle, failed ones included. */
uint64_t fakeguard_calls(fakeguard_t *f, fakeguard_op op);

/* The plugin sub-markers recorded for `key`: returns how many there are and writes the first
 * `cap` names to names[] (may be NULL when cap is 0). The names are valid until `key` next
 * changes. */
size_t fakeguard_finished(fakeguard_t *f, const char *key, const char **names, size_t cap);

/* Called for every message of a claim, renew, plugin_done, complete or fail call, and once for
 * a ping (key NULL), just before the fake applies it and without the fake's lock held: the
 * hook may call any fakeguard_* function, e.g. fakeguard_steal() to lose a lease exactly
 * there. Not called for calls made to fail. fn NULL removes the hook. */
typedef void (*fakeguard_hook_fn)(fakeguard_t *f, fakeguard_op op, const char *key, size_t key_len,
                                  void *arg);
void fakeguard_set_hook(fakeguard_t *f, fakeguard_hook_fn fn, void *arg);

#endif /* WXG_TEST_FAKEGUARD_H */
