/*
 * Test support: a history of operations on the idempotency guard and a checker of the guard's
 * guarantees (docs/guard.md §4) over it, for randomized fault tests
 * (tests/integration/test_guard_nemesis.c) and its own unit test (tests/unit/test_histcheck.c).
 *
 * A history is every operation a test made, each with the handle that made it, the message (a
 * small integer key), what it was, its result, and when it was invoked and when it returned in
 * SERVER time (microseconds of the Redis server's clock; the test's servers run on this machine,
 * so the test reads its own realtime clock, offset by what Redis TIME said). An operation's
 * effect on the server happened at some instant between the two; the checker only calls
 * something a violation when it is one for every choice of those instants.
 *
 * The rules, and what a Redis restart that lost its data (HC_RESTART with HC_R_LOST) excuses:
 *
 * 1. Two live owners: a CLAIMED answer B while another claim A of the same message was certainly
 *    live: A returned CLAIMED before B was invoked, B returned before the earliest end of A's
 *    lease (A's invocation + lease, or a later renewal's that returned OK before B was invoked),
 *    and nothing had ended A before B returned: no complete or fail of A's ticket invoked (any
 *    result: one that failed may have run), no release invoked that answered 1 or failed, no
 *    renewal of A answered LEASE_LOST, and no purge that answered 1 or failed while A's lease
 *    could already have ended (a purge of a live claim is itself the fault this rule catches).
 *    Excused: a restart that lost the data between A's invocation and B's return (Redis forgot
 *    A's claim; fencing is what protects the effects then).
 * 2. A DONE message claimed again within its retention: a CLAIMED answer invoked after a
 *    complete of the message returned OK (or ALREADY_DONE), that returned before that DONE
 *    marker could have expired: the complete's invocation + retention (for ALREADY_DONE the
 *    marker may be older: its ticket's claim invocation + retention). Excused: a restart that
 *    lost the data in between. A purge is not modelled as a reset: it never deletes a DONE
 *    marker (lib/guard/lua/purge.lua), so a purge excuses nothing.
 * 3. A fence out of order: an effect whose fence is not above every fence of the message handed
 *    out (CLAIMED) or used by an effect before its own claim was invoked. Nothing excuses it:
 *    fences come from the server's clock and grow across lost data too (docs/guard.md §3.4).
 * 4. A message stuck after the faults: after every HC_QUIET marker (every fault stopped then and
 *    no other op runs until the probes end), the probe claims of each message invoked before the
 *    next marker must include one that answered CLAIMED or DUPLICATE, provided the last probe
 *    came after every lease the message could still hold (every earlier claim's or renewal's
 *    return + lease, whatever it answered, + slack); a probe round that ended earlier is
 *    reported too (the test did not wait long enough). Nothing excuses it: a Redis that lost its
 *    data leaves every message claimable.
 * 5. A DUPLICATE (claim) or ALREADY_DONE (complete) answer for a message none of whose effects
 *    had returned before the answer did. Nothing excuses it: losing data only forgets DONE.
 *
 * Every violation is printed with the run's seed and the minimal history: the ops of the
 * offending message only (plus the restarts and quiet markers among them), in invocation order,
 * from a little before the first op the violation involves to its last.
 *
 * Threads: hc_add() may be called from any thread (the history has a lock); everything else from
 * one thread, after the recording threads stopped.
 */
#ifndef WXG_HISTCHECK_H
#define WXG_HISTCHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum hc_kind {
    HC_CLAIM = 1,
    HC_RENEW,
    HC_EFFECT, /* the fake side effect of a ticket, with its fence; result HC_R_OK */
    HC_COMPLETE,
    HC_FAIL,
    HC_RELEASE, /* admin; result HC_R_DONE (released) or HC_R_NOOP */
    HC_PURGE,   /* admin; result HC_R_DONE (purged) or HC_R_NOOP */
    HC_RESTART, /* key -1: Redis restarted, HC_R_KEPT (its data) or HC_R_LOST */
    HC_QUIET    /* key -1: every fault stopped at inv_us (a probe round follows) */
} hc_kind_t;

typedef enum hc_result {
    HC_R_ERROR = 1, /* the call failed (outcome on the server unknown) */
    HC_R_CLAIMED,
    HC_R_DUPLICATE,
    HC_R_BUSY,
    HC_R_OK,
    HC_R_LEASE_LOST,
    HC_R_ALREADY_DONE,
    HC_R_DONE,
    HC_R_NOOP,
    HC_R_KEPT,
    HC_R_LOST
} hc_result_t;

typedef struct hc_op {
    int handle;
    int key; /* -1 for HC_RESTART and HC_QUIET */
    hc_kind_t kind;
    hc_result_t result;
    int64_t inv_us, comp_us; /* server time */
    uint64_t fence;          /* the ticket's fence (CLAIMED claims and every op of a ticket) */
    long ticket;             /* ops of a ticket: the index (from hc_add) of its CLAIMED claim;
                                -1 otherwise (a CLAIMED claim may leave it -1 or name itself) */
    int64_t lease_end_us;    /* CLAIMED claim and OK renew: the earliest end of the lease
                                (inv_us + lease); 0 otherwise */
    int probe;               /* a claim of a probe round (rule 4) */
} hc_op_t;

typedef struct hc_hist hc_hist_t;

/* An empty history; NULL on allocation failure. */
hc_hist_t *hc_new(void);
void hc_free(hc_hist_t *h);

/* Appends a copy of `op` and returns its index (for hc_op_t.ticket), or -1 on allocation
 * failure. Any thread. */
long hc_add(hc_hist_t *h, const hc_op_t *op);

size_t hc_len(const hc_hist_t *h);
const hc_op_t *hc_get(const hc_hist_t *h, size_t i);

typedef struct hc_conf {
    uint64_t seed;        /* printed with every violation */
    int64_t lease_us;     /* the guard's lease */
    int64_t retention_us; /* the guard's DONE retention */
    int64_t slack_us;     /* clock reading and rounding tolerance, e.g. 20 ms */
} hc_conf_t;

typedef struct hc_counts {
    int violations[6]; /* per rule (index 1..5) */
    int excused[6];    /* found, but excused by lost data (rules 1 and 2) */
    long ops, keys;    /* ops checked, messages seen */
} hc_counts_t;

/* Checks every rule over the whole history, printing each violation (with the seed and the
 * minimal history) to `out` (may be NULL: count only). Fills *counts (may be NULL). Returns the
 * number of violations. */
int hc_check(const hc_hist_t *h, const hc_conf_t *conf, FILE *out, hc_counts_t *counts);

/* Writes every op, one a line, in the order added (for a failed run's record). */
void hc_dump(const hc_hist_t *h, FILE *out);

/* Names for printing. */
const char *hc_kind_name(hc_kind_t k);
const char *hc_result_name(hc_result_t r);

#endif /* WXG_HISTCHECK_H */
