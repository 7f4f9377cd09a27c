/*
 * The guard's internal design interface, and the helpers every design shares.
 *
 * The guard module is several files, not the one lib/<mod>.c the house style asks for, because
 * one file had grown past what a reader can hold in mind and because it holds more than one
 * design of the same public API:
 *
 *   lib/guard/guard.c           public API: configuration defaults and checks, new/destroy,
 *                               argument checks, dispatch through the design's operations
 *                               table, counters
 *   lib/guard/guard_native.c    the native design (the default, guard.design = native): claim,
 *                               plugin_done and complete as native commands pipelined per
 *                               batch; the rare paths, renew and fail as scripted transitions
 *   lib/guard/guard_lua.c       the Lua design (guard.design = lua): every transition a script
 *   lib/guard/guard_transitions.c  the scripted transitions (claim, renew, plugin_done,
 *                               complete, fail, the native complete's repair), each a batch of
 *                               script calls
 *   lib/guard/guard_batch.c     the scripts' replies and the pipelined batch runner (also the
 *                               admin operations')
 *   lib/guard/guard_near.c      the guard's side of the near cache of DONE messages
 *                               (lib/guard/donecache.c), in front of claim, behind complete
 *   lib/guard/guard_naive.c     the benchmark's naive design (conf.naive)
 *   lib/guard/guard_layout.c    pure parts: key names, fingerprint and marker geometry
 *   lib/guard/guard_geom.c      the adaptive DONE layout: each time bucket's selector bits,
 *                               stamped in Redis under <prefix>g:<time bucket>, cached per
 *                               handle
 *   lib/guard/guard_conn.c      the Redis connection of the Redis designs: connect, AUTH, SELECT,
 *                         Sentinel, reconnect with backoff, script loading, layout stamp, the
 *                         server's clock; over lib/rconn.c, or lib/rcluster.c for a cluster
 *   lib/guard/guard_admin.c     inspect, release, rearm, purge, scan and ping over Redis
 *   lib/guard/guard_watchdog.c  the renewal watchdog, over any handle
 *
 * Beside them, lib/guard/guard_record.def (the layout's record fields and constants, from which
 * both the C code and the scripts are built) and the scripts in lib/guard/lua/ (compiled in). The
 * connection layer below, lib/rconn.c and lib/rcluster.c, is two modules of their own, which
 * know nothing of the guard.
 *
 * Two internal headers: this one (the design interface, which a design outside lib/ such as the
 * unit tests' in-memory fake, tests/support/fakeguard.c, implements), and guard_conn_int.h
 * (what the Redis designs share). The rule behind the house style still holds: nothing outside
 * the guard module includes either header, except the guard's own tests.
 *
 * A design is an operations table plus a pointer to its own state. The public functions check
 * their arguments once and then call the table, so a design sees only valid calls (see
 * wxg__guard_ops_t). The handle, not the design, keeps the counters and the last error text.
 */
#ifndef WXG_GUARD_INT_H
#define WXG_GUARD_INT_H

#include <stddef.h>
#include <stdint.h>

#include "clock_int.h"
#include "err_int.h"
#include "wxguard/guard.h"

/* ---- The design interface ---- */

/* What a design implements. The public functions call these only with checked arguments:
 *   - batches have n >= 1 and non-NULL arrays;
 *   - every message key and every ticket's key is non-NULL with key_len > 0, every ticket is
 *     valid (wxg__guard_ticket_valid), every plugin name valid and every plugin result at most
 *     WXG_GUARD_RESULT_MAX bytes (and non-NULL when not empty);
 *   - claim_batch's out[] is zeroed; on an error the caller clears it, on success the caller
 *     adds the payload tags to the tickets;
 *   - release/rearm/purge get a non-NULL result pointer; inspect, scan a non-NULL out/cursor/fn.
 * Every operation returns 0 or a negative WXG_E* code, sets the handle's last error
 * (wxg__guard_set_error) when it fails, and counts what it did in wxg__guard_stats().
 * An operation left NULL is refused with WXG_ESTATE ("<op> is not available in <name> mode").
 * destroy frees the design's state (not the handle); it is called once, by wxg_guard_destroy.
 * Thread context: the handle's (one thread at a time). */
typedef struct wxg__guard_ops {
    const char *name; /* "native", "lua", "naive", "fake": for error texts */
    int (*claim_batch)(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n,
                       wxg_guard_claim_t *out);
    int (*renew_batch)(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results);
    int (*plugin_done_batch)(wxg_guard_t *g, const wxg_guard_plugin_done_t *items, size_t n,
                             int *results);
    int (*complete_batch)(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results);
    int (*fail_batch)(wxg_guard_t *g, const wxg_guard_failure_t *items, size_t n, int *results);
    int (*inspect)(wxg_guard_t *g, const char *key, size_t key_len,
                   const unsigned char *payload_hash, wxg_guard_record_t **out);
    int (*release)(wxg_guard_t *g, const char *key, size_t key_len, int *released);
    int (*rearm)(wxg_guard_t *g, const char *key, size_t key_len, int *rearmed);
    int (*purge)(wxg_guard_t *g, const char *key, size_t key_len, int *purged);
    int (*scan)(wxg_guard_t *g, uint64_t *cursor, int count, wxg_guard_scan_fn fn, void *arg);
    int (*ping)(wxg_guard_t *g);
    int (*describe_layout)(const wxg_guard_t *g, char *buf, size_t size);
    void (*destroy)(wxg_guard_t *g);
} wxg__guard_ops_t;

/* Makes a handle that dispatches to `ops` with the design state `impl`. `ops` must outlive the
 * handle (a static table). `conf` (NULL: the defaults of wxg_guard_conf_init) is copied with
 * every string member set to NULL: a design keeps its own copies of the strings it needs. The
 * configuration is not checked here (wxg_guard_new checks it before it picks a design).
 * Returns NULL with errstr filled on allocation failure; `impl` then stays the caller's. On
 * success wxg_guard_destroy() calls ops->destroy and frees the handle. */
wxg_guard_t *wxg__guard_new_ops(const wxg__guard_ops_t *ops, void *impl,
                                const wxg_guard_conf_t *conf, char *errstr, size_t errstr_size);

/* The design state given to wxg__guard_new_ops. */
void *wxg__guard_impl(const wxg_guard_t *g);

/* The handle's copy of the configuration (strings NULL, see wxg__guard_new_ops). */
const wxg_guard_conf_t *wxg__guard_conf(const wxg_guard_t *g);

/* The handle's counters, for the design to update; valid as long as the handle. */
wxg_guard_stats_t *wxg__guard_stats(wxg_guard_t *g);

/* Sets the text wxg_guard_last_error() returns (truncated to the buffer). */
void wxg__guard_set_error(wxg_guard_t *g, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The buffer behind wxg_guard_last_error(), for functions that take an errstr/errstr_size
 * pair; *size receives its size. Valid as long as the handle. */
char *wxg__guard_error_buf(wxg_guard_t *g, size_t *size);

/* Counts a call-level failure in the counter its code names (conn_errors, timeouts,
 * redis_errors, replica_failures); other codes are not counted. */
void wxg__guard_count_error(wxg_guard_stats_t *s, int rc);

/* 1 when a ticket is usable (key set, fence > 0, owner of WXG_GUARD_OWNER_LEN characters). */
int wxg__guard_ticket_valid(const wxg_guard_ticket_t *t);

/* The payload tag stored with a DONE marker and carried by a claim's ticket: the first two
 * bytes of the payload hash as a signed 16-bit number, never 0 (1 for NULL and for 0). */
int wxg__guard_payload_tag(const unsigned char *payload_hash);

/* 1 when `name` is a usable plugin name ([A-Za-z0-9_.-], 1..WXG_GUARD_PLUGIN_NAME_MAX bytes). */
int wxg__guard_plugin_name_valid(const char *name);

/* ---- Shared helpers ---- */

/* Fills buf with random bytes from the kernel (getrandom, else /dev/urandom). 0 or WXG_EIO. */
int wxg__guard_fill_random(void *buf, size_t len);

/* ---- The watchdog over a given handle ---- */

/* Starts a watchdog (see wxg_guard_watchdog_new) that renews through `g`, any design's handle.
 * Takes ownership of `g` in every case: the watchdog destroys it, and so does a failed call.
 * Returns NULL with errstr filled when the thread or its locks cannot be made (WXG_ENOMEM). */
wxg_guard_watchdog_t *wxg__guard_watchdog_new_on(wxg_guard_t *g, int64_t max_extension_ms,
                                                 int64_t owner_timeout_ms, char *errstr,
                                                 size_t errstr_size);

#endif /* WXG_GUARD_INT_H */
