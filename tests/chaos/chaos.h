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
    struct rd_kafka_s *sampler; /* reads committed offsets; never joins the group */
} chaos_t;

/* Starts a 3-broker devbroker, names the topic/group/prefix, creates the topic with
 * `partitions` partitions and the dead-letter topic, writes the replicas' configuration with
 * `extra` lines (may be NULL), and plans `nmsgs` messages with ids from `id_base` spread over
 * the partitions by conversation. */
void chaos_setup(chaos_t *c, const char *tag, int partitions, size_t nmsgs, uint64_t id_base,
                 const char *extra);

/* Makes broker 1 lead every partition and broker `coord` (not 1) the coordinator of the test's
 * group, so that a fault on `coord` hits the group and never fetching. Call before spawning. */
void chaos_isolate_coordinator(chaos_t *c, int coord);

/* Produces planned messages [from, to) that belong to a partition for which `want(p)` is
 * true (want may be NULL: all). */
void chaos_produce(chaos_t *c, size_t from, size_t to, int (*want)(int32_t p));

/* Samples every partition's committed offset and checks I3 and that no offset went back.
 * Fails the test otherwise (also when the offsets cannot be read within 30 s). */
void chaos_check(chaos_t *c);

/* Reads every partition's committed offset into committed[] (-1001: none) through the
 * harness's own client, which is created on first use, stays connected (one request a sample,
 * however slow the brokers) and never joins the group. Returns 0, or -1 when the group
 * coordinator did not answer within timeout_ms (scaled), e.g. while it is down. */
int chaos_sample(chaos_t *c, int64_t *committed, int timeout_ms);

/* Like chaos_check() but returns -1 instead of failing when the committed offsets cannot be
 * read within timeout_ms (scaled); 0 after a sample that passed the checks. */
int chaos_try_check(chaos_t *c, int timeout_ms);

/* Waits (bounded, scaled) until every produced message is committed, checking I3 at every
 * sample meanwhile; fails the test on timeout or when a replica exits. */
void chaos_wait_all_committed(chaos_t *c, int64_t timeout_ms);

/* Asserts I1 and I2 for planned messages [0, upto): each has exactly one ledger line, and the
 * ledger has no line for any other message. */
void chaos_check_exactly_once(chaos_t *c, size_t upto);

/* Fills counts[i] (c->nmsgs entries) with how many ledger lines message i of the plan has, from
 * one read of the ledger, so that all counts describe the same moment. Reading it once per
 * message instead takes seconds for a few hundred messages in a sanitizer build, long enough
 * for the state being measured to change halfway through. */
void chaos_effect_counts(chaos_t *c, int *counts);

/* Waits (bounded by timeout_ms, scaled) until replica idx's log has at least `count` lines
 * containing `needle`; fails the test on timeout or when the replica exits. */
void chaos_wait_log(chaos_t *c, int idx, const char *needle, int count, int64_t timeout_ms);

/* SIGTERMs replica idx and asserts that it exits 0 within 60 s. */
void chaos_stop_replica(chaos_t *c, int idx);

/* The largest value of `key`=N in replica idx's log (0 when absent): e.g. "commit_errors"
 * from its stats lines. */
uint64_t chaos_log_max(chaos_t *c, int idx, const char *key);

/* Stops everything still running and removes the temp dir. */
void chaos_teardown(chaos_t *c);

#endif /* WXG_CHAOS_H */
