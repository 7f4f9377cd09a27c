/*
 * The Redis idempotency guard.
 *
 * A message, named by its idempotency key, moves through a small state machine kept in Redis:
 *
 *   absent / FAILED / PROCESSING with an expired lease --claim--> PROCESSING (new owner, fence+1)
 *   PROCESSING --complete--> DONE (a compact marker kept for the DONE retention)
 *   PROCESSING --fail--> FAILED (reason, attempt count; a later claim may take it again)
 *
 * Every transition is atomic: in the native design (the default) the common steps are native Redis
 * commands, each atomic by itself, and the rare paths are Lua scripts that check and change the
 * state in one step; in the Lua design every transition is a script. Every operation has a batch
 * form that handles many messages in one Redis exchange (one pipeline; one script call per batch
 * in the Lua design); results are per message, so one message's BUSY or lease loss never affects
 * another. Every transition but claim carries the ticket returned by claim (owner token + fencing
 * token) and is refused, changing nothing, when the message has since been claimed by someone else
 * ("lease lost").
 *
 * The fencing token of a message only grows, also after Redis forgot the message (it is the Redis
 * server's time in microseconds at the claim, or the last fence + 1 when that is higher); hand it
 * to every downstream store that can refuse a stale writer. docs/guard.md states
 * the guarantees and what they rest on.
 *
 * Threads: a wxg_guard_t owns one Redis connection and is used by one thread at a time (its
 * connection is not locked). Use one handle per worker thread. The watchdog (below) has its own
 * thread and its own connection and is safe to call from any thread.
 *
 * Transport: TCP or a Unix socket, optionally TLS 1.2 or newer with server verification and an
 * optional client certificate (the tls_* members below; docs/operating.md). Every step -- the
 * connect, the handshake, each call -- has a deadline.
 */
#ifndef WXGUARD_GUARD_H
#define WXGUARD_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"
#include "wxguard/err.h"

/* The near cache of DONE messages (lib/guard/donecache.c), opaque here: the consumer makes one from
 * consumer.done_cache_entries and hands it to its guard handles through done_cache below. */
typedef struct wxg_donecache_s wxg_donecache_t;

/* Owner tokens are 128 random bits written as 32 lower-case hex digits. */
#define WXG_GUARD_OWNER_LEN 32
/* Limits enforced before anything reaches Redis (longer values are refused with WXG_EINVAL,
 * except a failure reason, which is truncated). */
#define WXG_GUARD_PLUGIN_NAME_MAX 64
#define WXG_GUARD_RESULT_MAX      256
#define WXG_GUARD_REASON_MAX      512
#define WXG_GUARD_PREFIX_MAX      64
#define WXG_GUARD_SENTINELS_MAX   16

typedef struct wxg_guard_s wxg_guard_t;

/* The designs of wxg_guard_conf_t.design. */
enum { WXG_GUARD_DESIGN_NATIVE = 0, WXG_GUARD_DESIGN_LUA = 1 };

/* Configuration. Fill with wxg_guard_conf_init() and change what you need. Strings are borrowed
 * only for the duration of wxg_guard_new(), which copies them. Durations are milliseconds. */
typedef struct wxg_guard_conf {
    const char *host;       /* default "127.0.0.1"; ignored when unix_path is set */
    int port;               /* default 6379 */
    const char *unix_path;  /* Unix socket path, or NULL */
    int db;                 /* SELECT this database when not 0 */
    const char *user;       /* ACL user, or NULL for the default user */
    const char *password;   /* NULL for no AUTH; never logged, wiped from memory on destroy */
    int connect_timeout_ms; /* default 2000 */
    int command_timeout_ms; /* default 2000; a reply later than this is WXG_ETIMEDOUT */
    const char *prefix;     /* key prefix, default "wxg:"; [A-Za-z0-9:_.-], at most 64 bytes */

    /* Redis Sentinel (docs/guard.md §5). When `sentinels` is set ("host:port[,host:port...]",
     * at most WXG_GUARD_SENTINELS_MAX; "[v6 address]:port" for IPv6), host, port and unix_path
     * are ignored: every connect asks the Sentinels, in turn, for the address of the primary
     * named `sentinel_master` (required then), connects there and checks with ROLE that it is
     * the primary. A connection lost, or a READONLY answer (the server was demoted), makes the
     * next call ask again. sentinel_user / sentinel_password authenticate to the Sentinels
     * (NULL: no AUTH); user / password still authenticate to the primary. */
    const char *sentinels;
    const char *sentinel_master;
    const char *sentinel_user;
    const char *sentinel_password;

    /* TLS (docs/operating.md). tls != 0 connects to Redis over TLS 1.2 or newer and verifies
     * the server's certificate against tls_ca_file / tls_ca_path (both NULL: the system's CA
     * store) and the name tls_server_name (NULL: the host connected to), which is also sent as
     * SNI. tls_cert_file and tls_key_file (NULL: the key is in the certificate file) give a
     * client certificate for mutual TLS; tls_key_password unlocks an encrypted key (a secret:
     * never logged, wiped on destroy). tls_verify = 0 accepts any server certificate (testing
     * only). sentinel_tls != 0 reaches the Sentinels over TLS with the same files; the name
     * verified there is each Sentinel's host. */
    int tls;
    const char *tls_ca_file;
    const char *tls_ca_path;
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *tls_key_password;
    const char *tls_server_name;
    int tls_verify; /* default 1 */
    int sentinel_tls;
    /* CLIENT SETNAME on every connection, so that CLIENT LIST tells wxguard's connections
     * apart; default "wxguard"; NULL or "" sends none. [!-~] without spaces, at most 64 bytes. */
    const char *client_name;

    int64_t lease_ms;            /* claim lease, default 30000 */
    int64_t inflight_ttl_ms;     /* TTL of an in-flight record, well beyond the lease; keeps the
                                    fencing counter alive after a lease expires. Default 24 h */
    int64_t done_retention_ms;   /* how long a DONE message stays a duplicate, default 7 days */
    int64_t failed_retention_ms; /* TTL of a FAILED record, default 7 days */

    int wait_replicas;   /* after each write, WAIT for this many replicas (0 = off) */
    int wait_timeout_ms; /* WAIT timeout, default 100; fewer acks = WXG_EREPLICAS */

    /* Compact DONE markers (docs/guard.md). The geometry derived from these is stamped in Redis
     * at start-up; a handle whose geometry differs from the stamp is refused (WXG_ECONFIG). */
    int64_t done_bucket_ms;    /* width of a time bucket; 0 = the retention (claim probes 2
                                  buckets). Retention is exact to within one bucket width. */
    double done_expected_rate; /* expected DONE markers per second across all replicas: sizes
                                  the hash buckets. 0 (the default): every time bucket is sized
                                  from the markers the one before it holds (the first for
                                  1000/s), stamped per time bucket in Redis (docs/guard.md
                                  §3.6); > 0 pins one size for all */
    int done_bucket_target;    /* aimed-for mean entries per bucket, default 64 (<= 128) */
    int done_selector_bits;    /* 0 = derived from the rate; set to pin the stored layout */
    int shard_bits;            /* hash-tag shards = 2^shard_bits (0..16), default 10 (1024):
                                  well above the primaries of a Redis Cluster, so that the
                                  keys of all messages spread over all of them */
    int cluster;               /* 1: never put two shards in one script call (Redis Cluster) */

    int batch_max;        /* messages per Redis exchange (one script call per batch in the
                             Lua design), default 64; larger batches are split and pipelined */
    int reconnect_min_ms; /* first reconnect backoff, default 50 */
    int reconnect_max_ms; /* backoff cap, default 2000 */

    /* How the state machine talks to Redis (docs/guard.md §4); both keep the same state in
     * the same layout, so replicas of either design may share a prefix:
     *   WXG_GUARD_DESIGN_NATIVE (default): a new message's claim, a duplicate's claim, the
     *     completion of a native claim and the plugins' sub-markers are native commands,
     *     pipelined; the rare paths are Lua scripts;
     *   WXG_GUARD_DESIGN_LUA: every transition is a Lua script. */
    int design;

    /* Benchmark only, never for production (default 0): 1 swaps the state machine for the
     * naive design the benchmarks compare against: claim = one `SET <key> <owner> NX GET PX
     * <lease>` round trip per message, complete = one `SET <key> D EX <retention>` round trip
     * per message (one key per DONE marker), renew = one PEXPIRE per message. No batching, no
     * fencing (every fence is 1), no plugin_done or fail (they return WXG_ESTATE), no admin
     * operations. Keys are <prefix>n:<SHA-256 of the key in hex>. */
    int naive;

    /* The near cache of DONE messages (docs/guard.md §10), borrowed: NULL (the default) turns it
     * off. A claim of a message found there is answered DUPLICATE without Redis, and a complete
     * that wrote a DONE marker (result OK) remembers the message for the DONE retention. One
     * cache may be shared by any number of handles (and threads) of a process; entries are kept
     * apart per Redis server, database and prefix. It must outlive every handle using it.
     * Ignored in naive mode. The consumer sets it (wxg_consumer_conf_t.done_cache_entries);
     * the functions that make a cache are internal to libwxguard, so a program leaves it
     * NULL. */
    wxg_donecache_t *done_cache;

    /* Redis Cluster (docs/guard.md §11). When `cluster_nodes` is set ("host:port[,host:port...]",
     * any nodes of the cluster, "[v6 address]:port" for IPv6), host, port and unix_path are
     * ignored: the handle reads the slot map from one of them and keeps a connection to each
     * primary it needs, sending every command to the primary serving its first key and
     * following MOVED, ASK, TRYAGAIN, CLUSTERDOWN and failovers. TLS, user, password and
     * client_name apply to every node; db must be 0; `cluster` is implied; Sentinel mode
     * cannot be combined with it. wait_replicas waits on every primary that was written. */
    const char *cluster_nodes;
} wxg_guard_conf_t;

/* Fills `conf` with the defaults above. */
WXG_EXPORT void wxg_guard_conf_init(wxg_guard_conf_t *conf);

/* Connects, authenticates, selects the database, loads the scripts and checks the compact-marker
 * layout stamp. Returns the handle, or NULL with a reason in errstr (never the password) and the
 * code in *err when err is not NULL: WXG_EINVAL / WXG_ECONFIG (bad configuration), WXG_EAUTH
 * (wrong credentials or missing ACL permissions: fatal), WXG_ECONN / WXG_ETIMEDOUT (Redis not
 * reachable: retriable), WXG_ENOMEM. */
WXG_EXPORT wxg_guard_t *wxg_guard_new(const wxg_guard_conf_t *conf, int *err, char *errstr,
                                      size_t errstr_size);

/* Closes the connection and frees the handle. NULL is accepted. */
WXG_EXPORT void wxg_guard_destroy(wxg_guard_t *g);

/* ---- Results ---- */

/* What claim found. */
typedef enum wxg_guard_outcome {
    WXG_GUARD_CLAIMED = 1,   /* you own it now: run the unfinished plugins, then complete/fail */
    WXG_GUARD_DUPLICATE = 2, /* already DONE: finish the offset, run nothing */
    WXG_GUARD_BUSY = 3       /* a live owner is processing it: retry later, never acknowledge */
} wxg_guard_outcome_t;

/* Per-message result of renew, plugin_done, complete and fail in batch form. */
typedef enum wxg_guard_result {
    WXG_GUARD_OK = 0,
    WXG_GUARD_LEASE_LOST = 1,  /* someone else claimed it since (or it is gone): nothing changed */
    WXG_GUARD_ALREADY_DONE = 2 /* complete only: no record of yours, but the message is DONE */
} wxg_guard_result_t;

/* A claim's proof of ownership, passed to every later transition of that message. `key` is
 * borrowed from the caller and must stay valid while the ticket is used. */
typedef struct wxg_guard_ticket {
    const char *key;
    size_t key_len;
    uint64_t fence; /* fencing token: strictly greater than any earlier claim of this message */
    char owner[WXG_GUARD_OWNER_LEN + 1];
    /* Set by claim: the payload tag the DONE marker will carry (payload_tag_set = 1). A ticket
     * built by hand leaves payload_tag_set 0, and its completion is then not put in the near
     * cache (conf.done_cache). */
    int payload_tag;
    int payload_tag_set;
    /* Set by claim: the SHA-256 of `key` (fingerprint_set = 1), so that the transitions need
     * not hash the key again. A ticket built by hand must be zeroed first (fingerprint_set 0:
     * the key is hashed); a copy whose key is changed must clear fingerprint_set. */
    unsigned char fingerprint[32];
    int fingerprint_set;
    /* Set by a claim of the native design (docs/guard.md §4): the time bucket whose DONE hash
     * holds the message's in-flight value, plus one, so that complete can turn that value into
     * the DONE marker with one command. 0 (a ticket built by hand, or a claim that went
     * through a script) completes through the script, which finds the value itself. */
    int64_t native_bucket;
} wxg_guard_ticket_t;

/* A plugin that already finished on an earlier attempt, with the small result it recorded. */
typedef struct wxg_guard_plugin_result {
    const char *name;
    const unsigned char *result; /* NUL-terminated for convenience; may hold NUL bytes */
    size_t result_len;
} wxg_guard_plugin_result_t;

/* The result of claiming one message. Owned by the caller; release its memory with
 * wxg_guard_claim_clear(). Only the fields of the outcome are meaningful. */
typedef struct wxg_guard_claim {
    wxg_guard_outcome_t outcome;
    wxg_guard_ticket_t ticket;           /* CLAIMED */
    uint32_t attempt;                    /* CLAIMED: 1 for the first claim */
    size_t n_finished;                   /* CLAIMED: plugins finished on earlier attempts */
    wxg_guard_plugin_result_t *finished; /* CLAIMED: owned by this struct */
    int payload_mismatch;                /* DUPLICATE: the DONE message had another payload */
    int64_t lease_ms_left;               /* BUSY: time left on the live owner's lease */
    /* BUSY: the message's field in Redis holds a value this layout never writes (written by
     * something else, or by a newer version): it stays BUSY until an operator looks at it and
     * clears it (wxguardctl inspect, purge). Counted in wxg_guard_stats_t.unreadable. */
    int unreadable;
    int cached; /* DUPLICATE: answered by the near cache (conf.done_cache), without Redis */
} wxg_guard_claim_t;

/* Frees what a claim result owns and zeroes it. NULL is accepted. */
WXG_EXPORT void wxg_guard_claim_clear(wxg_guard_claim_t *c);

/* One message to claim. payload_hash (32 bytes, e.g. wxg_msg_view_t.payload_hash) may be NULL. */
typedef struct wxg_guard_msg {
    const char *key; /* any bytes; hashed, so hostile keys never leave the prefix */
    size_t key_len;
    const unsigned char *payload_hash;
} wxg_guard_msg_t;

/* ---- Transitions ----
 *
 * Call-level errors (the whole call failed; no per-message result is valid): WXG_ECONN,
 * WXG_ETIMEDOUT, WXG_EREDIS (retriable: the outcome on the server is unknown, so a retried claim
 * may see BUSY until its own lost lease expires, and a retried complete may see ALREADY_DONE),
 * WXG_EREPLICAS (written on the primary but not acknowledged by enough replicas in time: treat the
 * transition as failed), WXG_EAUTH (fatal), WXG_EINVAL, WXG_ENOMEM. The guard never retries a
 * transition by itself, except after NOSCRIPT, which proves the script did not run. */

/* Claims up to n messages, batch_max at a time, each batch in one Redis exchange (the native
 * design pipelines its commands, one pipeline per node in flight at once in cluster mode; the
 * Lua design makes one script call per batch, one per shard and batch in cluster mode). out[i]
 * receives the result for msgs[i]; each CLAIMED result holds a fresh owner token and the
 * fencing token. On a call-level error out[] is left cleared. With conf.done_cache, a message
 * the near cache holds is answered DUPLICATE (cached = 1, with the payload check against the
 * cached tag) without Redis; only the others are sent, and when the cache holds every message no
 * Redis call is made at all. */
WXG_EXPORT int wxg_guard_claim_batch(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n,
                                     wxg_guard_claim_t *out);
WXG_EXPORT int wxg_guard_claim(wxg_guard_t *g, const char *key, size_t key_len,
                               const unsigned char *payload_hash, wxg_guard_claim_t *out);

/* Extends the lease of each ticket by lease_ms from now (server clock). results[i] is a
 * wxg_guard_result_t. The single form returns 0 or WXG_ELEASELOST (or a call-level error). */
WXG_EXPORT int wxg_guard_renew_batch(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n,
                                     int *results);
WXG_EXPORT int wxg_guard_renew(wxg_guard_t *g, const wxg_guard_ticket_t *t);

/* Records that one plugin finished, with its small result (at most WXG_GUARD_RESULT_MAX bytes);
 * the next claim after a failure reports it in `finished`. */
typedef struct wxg_guard_plugin_done {
    const wxg_guard_ticket_t *ticket;
    const char *plugin; /* [A-Za-z0-9_.-], 1..64 bytes */
    const void *result; /* may be NULL when result_len is 0 */
    size_t result_len;
} wxg_guard_plugin_done_t;
WXG_EXPORT int wxg_guard_plugin_done_batch(wxg_guard_t *g, const wxg_guard_plugin_done_t *items,
                                           size_t n, int *results);
WXG_EXPORT int wxg_guard_plugin_done(wxg_guard_t *g, const wxg_guard_ticket_t *t,
                                     const char *plugin, const void *result, size_t result_len);

/* Marks each message DONE: deletes its in-flight record and adds its compact marker, kept for the
 * DONE retention. results[i]: OK, LEASE_LOST or ALREADY_DONE (no record of this owner, but the
 * message is DONE, e.g. when a timed-out complete did run). With conf.done_cache, each message
 * whose result is OK is remembered in the near cache for the retention (counted from before the
 * call); ALREADY_DONE ones are not (their marker's age is unknown). The single form returns 0 for
 * OK and ALREADY_DONE (setting *already_done, which may be NULL) or WXG_ELEASELOST. */
WXG_EXPORT int wxg_guard_complete_batch(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n,
                                        int *results);
WXG_EXPORT int wxg_guard_complete(wxg_guard_t *g, const wxg_guard_ticket_t *t, int *already_done);

/* Marks each message FAILED with a reason (truncated to WXG_GUARD_REASON_MAX bytes) and the
 * caller's attempt count, and drops the lease so that a retry can claim it at once. The record,
 * its fencing counter and its finished plugins are kept for failed_retention_ms. */
typedef struct wxg_guard_failure {
    const wxg_guard_ticket_t *ticket;
    const char *reason; /* may be NULL */
    uint32_t attempts;
} wxg_guard_failure_t;
WXG_EXPORT int wxg_guard_fail_batch(wxg_guard_t *g, const wxg_guard_failure_t *items, size_t n,
                                    int *results);
WXG_EXPORT int wxg_guard_fail(wxg_guard_t *g, const wxg_guard_ticket_t *t, const char *reason,
                              uint32_t attempts);

/* ---- Administration ---- */

typedef enum wxg_guard_state {
    WXG_GUARD_ABSENT = 0,     /* nothing known (never seen, or the retention passed) */
    WXG_GUARD_PROCESSING = 1, /* claimed; see lease_ms_left (<= 0: the lease expired) */
    WXG_GUARD_FAILED = 2,
    WXG_GUARD_DONE = 3
} wxg_guard_state_t;

/* Everything the guard knows about one message. Owned by the caller; free with
 * wxg_guard_record_free(). */
typedef struct wxg_guard_record {
    wxg_guard_state_t state;
    /* The in-flight record (PROCESSING or FAILED), when it exists. */
    int has_record;
    char owner[WXG_GUARD_OWNER_LEN + 1]; /* "" when no live claim */
    uint64_t fence;
    uint32_t attempt;
    int64_t lease_ms_left;  /* PROCESSING only */
    int64_t claimed_at_ms;  /* server time of the last claim, Unix ms */
    int64_t record_ttl_ms;  /* PTTL of the record */
    uint32_t fail_attempts; /* FAILED: the caller's attempt count */
    char *fail_reason;      /* FAILED: NULL when none */
    size_t n_finished;
    wxg_guard_plugin_result_t *finished;
    /* The compact DONE marker, when the message is DONE. */
    int64_t done_ttl_ms;  /* PTTL of the bucket holding the marker */
    char *done_bucket;    /* name of that bucket key */
    int done_payload_tag; /* the stored payload-hash tag */
    int payload_tag;      /* the tag this key's marker would carry for the given hash */
    char *record_key;     /* the Redis key of the in-flight record */
    /* Appended for the admin tool. */
    char *msg_key; /* the idempotency key stored by the last claim (NUL-terminated; NULL
                      when the record holds none, e.g. one written by an older version) */
    size_t msg_key_len;
    int64_t failed_at_ms;  /* FAILED: server time of the failure (or release), Unix ms; else 0 */
    int64_t rearmed_at_ms; /* server time of the last wxg_guard_rearm(), Unix ms; else 0 */
} wxg_guard_record_t;

/* Reads the full record of `key` (in-flight record with TTL, finished plugins, and the DONE
 * marker). payload_hash may be NULL. */
WXG_EXPORT int wxg_guard_inspect(wxg_guard_t *g, const char *key, size_t key_len,
                                 const unsigned char *payload_hash, wxg_guard_record_t **out);
WXG_EXPORT void wxg_guard_record_free(wxg_guard_record_t *r);

/* Clears a PROCESSING claim (an operator's action when an owner is known dead): the message
 * becomes FAILED with reason "released", keeps its fencing counter, and the old owner's later
 * transitions are refused as lease lost. *released is 1 when a claim was cleared, 0 when the
 * message was not PROCESSING. */
WXG_EXPORT int wxg_guard_release(wxg_guard_t *g, const char *key, size_t key_len, int *released);

/* Prepares a FAILED message to run again, for the redrive of a dead-lettered message: its
 * attempt counter restarts, so the next claim is attempt 1 and gets the consumer's whole retry
 * budget, while the fencing counter and the finished plugins are kept (a plugin that finished
 * before the failure is not run again, and a stale owner stays refused). Nothing else changes:
 * the next claim takes the message as it takes any FAILED one, and once it is DONE every further
 * copy is a DUPLICATE -- so a redriven message is processed once however often it is re-produced.
 * *rearmed (may be NULL) is 1 when a FAILED record was re-armed and 0 when the message was not
 * FAILED (absent, in flight or DONE: use wxg_guard_inspect() first to tell which). */
WXG_EXPORT int wxg_guard_rearm(wxg_guard_t *g, const char *key, size_t key_len, int *rearmed);

/* Deletes the in-flight record (FAILED, or PROCESSING whose lease has expired) of `key`, for an
 * operator removing one account's data. A live claim is never deleted (*purged = 0). The DONE
 * marker, if any, is not touched: markers of all accounts share compact buckets, which expire
 * whole after the retention. A later claim starts at attempt 1 with no finished plugins; its fence
 * is still higher than any before, since fences come from the server's clock. *purged (may be
 * NULL) is 1 when a record was deleted. */
WXG_EXPORT int wxg_guard_purge(wxg_guard_t *g, const char *key, size_t key_len, int *purged);

/* Called by wxg_guard_scan() for every in-flight record found. The record is freed after the
 * call returns. Return 0 to go on, anything else to stop the scan (that value is returned). */
typedef int (*wxg_guard_scan_fn)(const wxg_guard_record_t *rec, void *arg);

/* One step of a cursor walk over the in-flight records (PROCESSING and FAILED) under this
 * handle's prefix, with SCAN ... MATCH ... COUNT, never KEYS. Start with *cursor = 0; each call
 * reads one SCAN page (about `count` keys; <= 0 means 100) and updates *cursor, which is 0 again
 * when the walk is complete. Records may be seen twice or not at all if they change meanwhile
 * (SCAN's guarantees). DONE messages have no record and are never reported. Returns 0, a
 * call-level error, or the callback's non-zero value. */
WXG_EXPORT int wxg_guard_scan(wxg_guard_t *g, uint64_t *cursor, int count, wxg_guard_scan_fn fn,
                              void *arg);

/* ---- Counters ---- */

/* Counters of one handle since it was created. Read them from the thread that uses the handle. */
typedef struct wxg_guard_stats {
    uint64_t script_calls; /* EVALSHA calls sent */
    uint64_t round_trips;  /* pipelines sent and answered (one per API call that reached Redis) */
    uint64_t claimed, duplicates, busy, payload_mismatches;
    uint64_t renewed, plugins_done, completed, already_done, failed;
    uint64_t lease_lost; /* transitions refused because the caller no longer owned the message */
    uint64_t noscript_reloads;
    uint64_t connects;     /* successful (re)connections, including the first */
    uint64_t conn_errors;  /* calls that failed with WXG_ECONN */
    uint64_t timeouts;     /* calls that failed with WXG_ETIMEDOUT */
    uint64_t redis_errors; /* error replies other than NOSCRIPT */
    uint64_t replica_failures;
    uint64_t local_duplicates; /* duplicates answered by the near cache without Redis (also
                                  counted in duplicates and, if so, payload_mismatches) */
    uint64_t sentinel_lookups; /* primary addresses obtained from a Sentinel */
    uint64_t demotions;        /* READONLY answers: the server was no longer the primary */
    /* Redis Cluster mode only (0 otherwise): redirections followed, refusals waited out, slot
     * maps read, and node connections that failed or could not be made. */
    uint64_t cluster_moved, cluster_ask, cluster_tryagain, cluster_clusterdown;
    uint64_t cluster_refreshes, cluster_node_errors;
    /* Native claims whose commands may have run after the time bucket they were sized for had
     * ended (a stall past the clock margin): refused with WXG_ETIMEDOUT, never CLAIMED. */
    uint64_t late_claims;
    /* Claims answered BUSY because the message's field holds a value the layout does not write
     * (wxg_guard_claim_t.unreadable). */
    uint64_t unreadable;
} wxg_guard_stats_t;

WXG_EXPORT void wxg_guard_get_stats(const wxg_guard_t *g, wxg_guard_stats_t *out);

/* The text of the last error on this handle (never contains the password); "" when none. Valid
 * until the next call on the handle. */
WXG_EXPORT const char *wxg_guard_last_error(const wxg_guard_t *g);

/* Sends PING and waits for its answer, connecting first when the handle has no connection (a
 * call made during the reconnect backoff fails at once with WXG_ECONN, as every call does).
 * Returns 0 when Redis answered PONG, else WXG_ECONN, WXG_ETIMEDOUT, WXG_EREDIS, WXG_EAUTH or
 * WXG_ECONFIG (the layout stamp no longer matches), with wxg_guard_last_error() set. Counts one
 * round trip. Same thread rules as every call on the handle. */
WXG_EXPORT int wxg_guard_ping(wxg_guard_t *g);

/* A description of the compact-marker layout this handle uses (for logs and the admin tool):
 * selector bits, fingerprint bytes, bucket width and the false-duplicate bound. */
WXG_EXPORT int wxg_guard_describe_layout(const wxg_guard_t *g, char *buf, size_t size);

/* ---- Renewal watchdog ----
 *
 * Keeps the leases of long-running work alive, like Redisson's watchdog: a thread with its own
 * connection renews every registered claim every lease/3 (in one batch call), for at most
 * max_extension_ms in total per registration. It stops renewing a registration when the lease is
 * lost (someone else owns the message), when the total bound is reached, when the owner stops
 * touching it for longer than owner_timeout_ms (the owner is gone or hung), or when renewals fail
 * for longer than a lease. The worker checks wxg_guard_watch_status() before each side effect. */

typedef struct wxg_guard_watchdog_s wxg_guard_watchdog_t;
typedef struct wxg_guard_watch_s wxg_guard_watch_t;

typedef enum wxg_guard_watch_status {
    WXG_GUARD_WATCH_LIVE = 0,      /* renewed in time so far */
    WXG_GUARD_WATCH_LOST = 1,      /* renew answered LEASE_LOST: stop, another owner took over */
    WXG_GUARD_WATCH_EXHAUSTED = 2, /* max_extension_ms reached: no more renewals */
    WXG_GUARD_WATCH_ABANDONED = 3, /* the owner did not touch it within owner_timeout_ms */
    WXG_GUARD_WATCH_UNSURE = 4     /* renewals failed (Redis unreachable) past the lease */
} wxg_guard_watch_status_t;

/* Starts the watchdog thread with its own connection made from `conf`. max_extension_ms bounds
 * how long one registration is kept alive (0 = 10 leases); owner_timeout_ms (0 = off) drops
 * registrations whose owner has not called wxg_guard_watch_touch() for that long. Returns NULL
 * with errstr and *err (may be NULL) as wxg_guard_new(). */
WXG_EXPORT wxg_guard_watchdog_t *wxg_guard_watchdog_new(const wxg_guard_conf_t *conf,
                                                        int64_t max_extension_ms,
                                                        int64_t owner_timeout_ms, int *err,
                                                        char *errstr, size_t errstr_size);

/* Stops the thread, frees every registration still present and the handle. NULL is accepted.
 * Registrations must not be used afterwards. */
WXG_EXPORT void wxg_guard_watchdog_destroy(wxg_guard_watchdog_t *wd);

/* Registers a claim for renewal (the key is copied). Returns the registration, or NULL on
 * allocation failure. Any thread. */
WXG_EXPORT wxg_guard_watch_t *wxg_guard_watchdog_add(wxg_guard_watchdog_t *wd,
                                                     const wxg_guard_ticket_t *t);

/* Unregisters and frees a registration; `w` is invalid afterwards. NULL is accepted. */
WXG_EXPORT void wxg_guard_watchdog_remove(wxg_guard_watchdog_t *wd, wxg_guard_watch_t *w);

/* The registration's status (a wxg_guard_watch_status_t); lock-free. */
WXG_EXPORT int wxg_guard_watch_status(const wxg_guard_watch_t *w);

/* Tells the watchdog the owner is still alive (only needed with owner_timeout_ms). */
WXG_EXPORT void wxg_guard_watch_touch(wxg_guard_watch_t *w);

/* Renewal batches sent and leases renewed so far (for tests and metrics). */
WXG_EXPORT void wxg_guard_watchdog_counts(wxg_guard_watchdog_t *wd, uint64_t *batches,
                                          uint64_t *renewals);

/* Makes the watchdog thread probe Redis while it has nothing to renew: when its connection has
 * had no answer and no failure for every_ms, the thread sends PING (wxg_guard_ping()). 0 turns
 * probing off, the default. Lets an idle process notice that Redis went away, which no worker
 * call would tell it. Any thread. */
WXG_EXPORT void wxg_guard_watchdog_probe(wxg_guard_watchdog_t *wd, int64_t every_ms);

/* The watchdog thread's latest contact with Redis, from its renewal batches and probes.
 * *ok_ms and *err_ms (either may be NULL) receive the CLOCK_MONOTONIC time in milliseconds of
 * the latest success and the latest failure (0: none yet; creating the watchdog counts as a
 * success). Returns the WXG_E* code of the latest failure, 0 when there was none; compare the
 * two times to tell whether it is the latest contact. Lock-free; any thread. */
WXG_EXPORT int wxg_guard_watchdog_health(wxg_guard_watchdog_t *wd, int64_t *ok_ms, int64_t *err_ms);

/* The watchdog handle's text for its latest failed contact (wxg_guard_last_error() at that
 * moment; in cluster mode it names the node), copied into buf; "" when there was none. Any
 * thread. */
WXG_EXPORT void wxg_guard_watchdog_last_error(wxg_guard_watchdog_t *wd, char *buf, size_t size);

#endif /* WXGUARD_GUARD_H */
