/*
 * Helpers for the guard's integration tests: a configuration with a prefix of its own (so that
 * tests sharing one redis-server never see each other's keys), a raw hiredis connection for
 * checking what the guard wrote, and key scans.
 *
 * Not thread-safe except where noted; failures fail the current cmocka test.
 */
#ifndef WXG_GUARDTEST_H
#define WXG_GUARDTEST_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "testenv.h"
#include "wxguard/guard.h"

/* Defaults for a test: the given server, a fresh prefix "t<pid>-<tag>-<random>:", short
 * timeouts, the design of gt_design(), and a DONE layout sized for tests. The prefix lives in a
 * static buffer per call site's `buf` (at least 64 bytes). */
void gt_conf(wxg_guard_conf_t *c, const char *host, int port, const char *tag, char *buf,
             size_t bufsize);

/* The design the guard's tests run against: WXG_GUARD_DESIGN_LUA when the environment has
 * WXG_TEST_GUARD_DESIGN=lua (the *_lua registrations in tests/integration/CMakeLists.txt), else
 * the default, native. gt_conf() sets it. */
int gt_design(void);

/* wxg_guard_new() that fails the test with the error text on failure. */
wxg_guard_t *gt_open(const wxg_guard_conf_t *c);

/* A plain connection (AUTH with `password` when not NULL). */
redisContext *gt_redis(const char *host, int port, const char *password);

/* Fails the test unless the server behind c is the one the run asked for: Valkey when
 * WXG_TEST_REDIS_SERVER names valkey-server (the valkey phase), else Redis. Prints its
 * version. */
void gt_assert_server(redisContext *c);

/* Runs one command given as an argv of NUL-terminated strings; fails the test on I/O errors. */
redisReply *gt_cmd(redisContext *c, int argc, const char **argv);

/* Every key matching `pattern` (SCAN, bounded). Returns the count; *keys is a NULL-terminated
 * array the caller frees with gt_free_keys(). */
size_t gt_scan(redisContext *c, const char *pattern, char ***keys);
void gt_free_keys(char **keys);

/* PTTL of a key. */
long long gt_pttl(redisContext *c, const char *key);

/* Number of keys matching the pattern. */
size_t gt_count(redisContext *c, const char *pattern);

/* Creates (or resets) the ACL user `user` with `password` on the server at host:port, allowed
 * only the keys matching `keys` (e.g. "wxg:*") and exactly the commands docs/guard.md §7 lists
 * for the guard, plus `extra` when not NULL (e.g. "+role" for Sentinel mode). ACL rules are not
 * replicated: call it on every server the guard may reach. */
void gt_acl_user(const char *host, int port, const char *user, const char *password,
                 const char *keys, const char *extra);

/* When the environment has WXG_TEST_GUARD_TLS=1: makes the test PKI, starts a TLS-only
 * redis-server in *srv and points `c` at it over TLS (verifying against the test CA), and
 * returns the PKI directory, which gt_tls_target_stop() removes. Otherwise changes nothing
 * and returns NULL. The CA path in `c` stays valid until gt_tls_target_stop(). */
char *gt_tls_target(wxg_test_redis_t *srv, wxg_guard_conf_t *c);
void gt_tls_target_stop(wxg_test_redis_t *srv, char *pki);

/* When the environment has WXG_TEST_GUARD_CLUSTER=1: starts a private Redis Cluster of 3
 * primaries with a replica each in *cl and points `c` at it (cluster_nodes), and returns 1;
 * gt_cluster_target_stop() stops it. Otherwise changes nothing and returns 0. */
int gt_cluster_target(wxg_test_cluster_t *cl, wxg_guard_conf_t *c);
void gt_cluster_target_stop(wxg_test_cluster_t *cl, int started);

/* Claims msgs[0..n) in one batch call, asserts that the call succeeded and that every message
 * was CLAIMED, and copies each ticket into t[i] (pointing into out[i], which the caller clears). */
void gt_claim_all(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n, wxg_guard_claim_t *out,
                  wxg_guard_ticket_t *t);

/* Asserts that a fencing token is a server time in microseconds (docs/guard.md §3.4) within a
 * minute of this machine's clock (the test servers run on this machine). */
void gt_assert_fence_is_now(uint64_t fence);

/* Whether a guard call's code is one a caller retries: the connection, a timeout, an error
 * reply, or too few WAIT acknowledgements. */
int gt_retriable(int rc);

/* Runs `call` (a guard call returning a code) into rc until it stops failing with a retriable
 * error or timeout_ms (scaled) has passed, counting the retriable failures in fails. */
#define GT_RETRY(rc, fails, timeout_ms, call)                                      \
    do {                                                                           \
        int64_t end_ = wxg_test_now_ms() + (int64_t)(timeout_ms)*wxg_test_scale(); \
        for (;;) {                                                                 \
            (rc) = (call);                                                         \
            if (!gt_retriable(rc) || wxg_test_now_ms() > end_)                     \
                break;                                                             \
            (fails)++;                                                             \
            wxg_test_sleep_ms(20);                                                 \
        }                                                                          \
    } while (0)

#endif
