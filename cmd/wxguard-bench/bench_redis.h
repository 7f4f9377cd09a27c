/*
 * The benchmark's own Redis connections (bench_redis.c): its probes (INFO, DBSIZE, FLUSHDB,
 * SCRIPT, CLUSTER SLOTS, SCAN) and the designs it measures without the guard (naive, seed, the
 * protocol variants, the --rate markers), over wxguard's connection layer (lib/rconn.c), so
 * they reach whatever server the guard reaches: TLS, ACL user and password, database, client
 * name, all from the wxg_guard_conf_t the configuration mapping made (wxgb_conf_guard).
 *
 * A connection belongs to one thread at a time. After a failure it is dead (every later call
 * fails too) and wxgb_redis_errstr() says why; the benchmark then ends or counts failures.
 */
#ifndef WXGB_BENCH_REDIS_H
#define WXGB_BENCH_REDIS_H

#include <hiredis/hiredis.h>
#include <stddef.h>

#include "wxguard/guard.h"

typedef struct wxgb_redis wxgb_redis_t;

/* Connects to the server `gc` names (host and port, or its Unix socket), over TLS when gc->tls
 * is set, then AUTH, SELECT gc->db and CLIENT SETNAME as the guard does. With host not NULL:
 * host:port instead, database 0, the same TLS and credentials (a Redis Cluster node). Commands
 * wait up to gc->command_timeout_ms, and at least 30 s (a FLUSHDB of a million markers takes
 * seconds). `gc` is read during the call only. NULL with errstr on failure. */
wxgb_redis_t *wxgb_redis_connect(const wxg_guard_conf_t *gc, const char *host, int port,
                                 char *errstr, size_t errstr_size);
/* NULL is accepted. */
void wxgb_redis_free(wxgb_redis_t *r);
/* Why the last call failed; "" when none did. Valid until the next call on r. */
const char *wxgb_redis_errstr(const wxgb_redis_t *r);

/* One command and its reply (the caller's, freeReplyObject), or NULL when the exchange failed.
 * An error reply is a reply. The arguments are NUL-terminated strings, the list ended by NULL
 * (at most 15), or argc binary-safe ones (lens NULL: each one's strlen). */
redisReply *wxgb_redis_cmd(wxgb_redis_t *r, const char *arg, ...) __attribute__((sentinel));
redisReply *wxgb_redis_cmd_argv(wxgb_redis_t *r, int argc, const char **argv, const size_t *lens);

/* A pipeline: append any number of commands (as for wxgb_redis_cmd), then wxgb_redis_replies
 * sends them all and reads one reply each, in the order appended: *n replies, owned by r and
 * valid until the next call on it, or NULL when the exchange (or an append) failed. With
 * nothing appended: no I/O, *n = 0. */
void wxgb_redis_append(wxgb_redis_t *r, const char *arg, ...) __attribute__((sentinel));
void wxgb_redis_append_argv(wxgb_redis_t *r, int argc, const char **argv, const size_t *lens);
redisReply **wxgb_redis_replies(wxgb_redis_t *r, size_t *n);

/* wxgb_redis_replies without waiting, for a thread that multiplexes several connections with
 * poll(): sends what was appended and reads the replies that have arrived. Every reply in: the
 * replies as wxgb_redis_replies gives them. NULL with *events != 0: more are due; poll
 * wxgb_redis_fd(r) for *events, then call again (appending nothing meanwhile); the caller keeps
 * its own deadline. NULL with *events == 0: the exchange failed (wxgb_redis_errstr). */
redisReply **wxgb_redis_replies_some(wxgb_redis_t *r, size_t *n, short *events);
int wxgb_redis_fd(const wxgb_redis_t *r);

#endif
