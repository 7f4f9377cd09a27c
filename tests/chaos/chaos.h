/*
 * Shared harness of the chaos tests: wxguard-consumer replicas (child processes) against a
 * private wxguard-devbroker (the fault-injection broker) and the shared Redis, with the global
 * invariants of every fault scenario:
 *   I1 no loss: every produced message has an effect in the record plugin's ledger;
 *   I2 no double effect: no message has two;
 *   I3 safe commits: a committed offset, sampled during the run by a separate client, never
 *      passes a message without its effect; and a partition's committed offset never goes back.
 *
 * One test at a time per process; call from the test's main thread.
 */
#ifndef WXG_CHAOS_H
#define WXG_CHAOS_H

#include <stddef.h>
#include <stdint.h>

#include "consumertest.h"
#include "testdevbroker.h"

#define CHAOS_MAX_MSGS 4000

typedef struct chaos {
    wxg_test_devbroker_t db;
    wxg_ct_t t;
    size_t nmsgs;
    wxg_ct_msg_t msgs[CHAOS_MAX_MSGS];
    int64_t offset_of[CHAOS_MAX_MSGS];        /* offset of msgs[i] in its partition */
    uint64_t *offset_ids[WXG_CT_MAX_PARTS];   /* id at each offset of a partition */
    int64_t last_committed[WXG_CT_MAX_PARTS]; /* highest sample so far */
    unsigned samples;
} chaos_t;

/* Starts a 3-broker devbroker, names the topic/group/prefix, creates the topic with
 * `partitions` partitions and the dead-letter topic, writes the replicas' configuration with
 * `extra` lines (may be NULL), and plans `nmsgs` messages with ids from `id_base` spread over
 * the partitions by conversation. */
void chaos_setup(chaos_t *c, const char *tag, int partitions, size_t nmsgs, uint64_t id_base,
                 const char *extra);

/* Produces planned messages [from, to) that belong to a partition for which `want(p)` is
 * true (want may be NULL: all). */
void chaos_produce(chaos_t *c, size_t from, size_t to, int (*want)(int32_t p));

/* Samples every partition's committed offset and checks I3 and that no offset went back.
 * Fails the test otherwise. Also usable as the wxg_ct_wait_all_committed() check. */
void chaos_check(chaos_t *c);

/* Waits (bounded, scaled) until every produced message is committed, checking I3 about once
 * a second meanwhile; fails the test on timeout. */
void chaos_wait_all_committed(chaos_t *c, int64_t timeout_ms);

/* Asserts I1 and I2 for planned messages [0, upto): each has exactly one ledger line, and the
 * ledger has no line for any other message. */
void chaos_check_exactly_once(chaos_t *c, size_t upto);

/* How many ledger lines message `i` of the plan has now. */
int chaos_effects_of(chaos_t *c, size_t i);

/* SIGTERMs replica idx and asserts that it exits 0 within 60 s. */
void chaos_stop_replica(chaos_t *c, int idx);

/* The largest value of `key`=N in replica idx's log (0 when absent): e.g. "commit_errors"
 * from its stats lines. */
uint64_t chaos_log_max(chaos_t *c, int idx, const char *key);

/* Stops everything still running and removes the temp dir. */
void chaos_teardown(chaos_t *c);

#endif /* WXG_CHAOS_H */
