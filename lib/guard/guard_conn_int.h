/*
 * What the guard's Redis designs (lib/guard/guard_native.c, lib/guard/guard_lua.c,
 * lib/guard/guard_naive.c) share: the design state with its connection (lib/guard/guard_conn.c),
 * the key layout (lib/guard/guard_layout.c) and each time bucket's layout (lib/guard/guard_geom.c),
 * the pipelined script-call runner (lib/guard/guard_batch.c), the script transitions
 * (lib/guard/guard_transitions.c), the near cache (lib/guard/guard_near.c), and the admin
 * operations (lib/guard/guard_admin.c). guard_int.h lists
 * the module's files and says why it has two internal headers.
 *
 * Thread context: everything here runs on the thread that uses the handle; nothing locks.
 */
#ifndef WXG_GUARD_CONN_INT_H
#define WXG_GUARD_CONN_INT_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "donecache_int.h"
#include "guard_int.h"
#include "rcluster_int.h"
#include "rconn_int.h"
#include "wxguard/guard.h"

/* ---- Key layout (lib/guard/guard_layout.c): pure, no Redis ---- */

/* The false-duplicate requirement: below WXG__FALSE_DUP_P over a retention window holding at
 * least WXG__FALSE_DUP_MARKERS markers (more when the configured rate implies more). */
#define WXG__FALSE_DUP_P       1e-9
#define WXG__FALSE_DUP_MARKERS 600e6
/* The fingerprint's selector bits come from its first bytes, the stored field from byte 8 on,
 * so the two never overlap. */
#define WXG__SELECTOR_BITS_MAX 40
#define WXG__FIELD_OFFSET      8
#define WXG__FIELD_BYTES_MIN   4
#define WXG__FIELD_BYTES_MAX   16
#define WXG__KEY_MAX           (WXG_GUARD_PREFIX_MAX + 64)
/* The version of the key layout (record shape + marker geometry) in the layout stamp. v2: the
 * in-flight record is one string (lib/guard/guard_record.def) instead of a hash. v3: that string
 * also carries the idempotency key and the rearm time (for the admin tool). v4: a message's state
 * is its field in the DONE bucket of its claim (an in-flight value, a pointer to its record, or
 * its DONE marker), so that the common transitions are native commands on one hash; records
 * only after a takeover, a failure or a release; sub-markers in a hash of their own. */
#define WXG__LAYOUT_VERSION "v4"
/* Default time-bucket width = retention / this: claim probes this + 1 buckets, and a marker lives
 * between the retention and retention * (1 + 1 / this). Chosen by measurement: docs/guard.md. */
#define WXG__BUCKETS_PER_RETENTION 1

/* The adaptive layout (docs/guard.md §3.6): the rate the first time bucket of a prefix is sized
 * for, and the highest rate the one field width it keeps for every time bucket is sized for. */
#define WXG__ADAPTIVE_FIRST_RATE 1000.0
#define WXG__ADAPTIVE_MAX_RATE   1e5

/* Geometry of the compact DONE markers, derived from the configuration. */
typedef struct wxg__guard_geom {
    int shard_bits;        /* hash-tag shard = first shard_bits bits of the fingerprint */
    int selector_bits;     /* shard bits + sub-bucket bits: fingerprint bits implied by a bucket;
                              adaptive: the first time bucket's (each later one's is stamped in
                              Redis, wxg__guard_sel) */
    int adaptive;          /* 1: selector bits per time bucket, from the one before */
    int bucket_target;     /* aimed-for mean entries per bucket */
    int field_bytes;       /* stored fingerprint bytes per marker */
    int required_bits;     /* fingerprint bits needed for the false-duplicate bound */
    int64_t bucket_ms;     /* time-bucket width */
    int64_t retention_ms;  /* DONE retention */
    double window_markers; /* N: markers assumed live in one retention window */
    double false_dup;      /* N(N-1)/2 / 2^(selector_bits + 8 field_bytes) */
    double bucket_mean;    /* expected entries per bucket at the configured rate */
} wxg__guard_geom_t;

/* Smallest b with n(n-1)/2 / 2^b < p (birthday bound). */
int wxg__guard_required_bits(double n, double p);

/* The selector bits of a time bucket that is to hold `markers` markers. */
int wxg__guard_sel_for_count(const wxg__guard_geom_t *g, double markers);

/* The name of the DONE bucket <prefix>{s<shard>}:d:<sub>:<tb>, and that of a fingerprint's
 * bucket of time bucket tb under `sel` selector bits. 0 or WXG_EINVAL (no room). */
int wxg__guard_bucket_name(const char *prefix, int shard_bits, unsigned shard, uint64_t sub,
                           int64_t tb, char *out, size_t size);
int wxg__guard_bucket_of(const char *prefix, const wxg__guard_geom_t *g, int sel,
                         const unsigned char fp[32], int64_t tb, char *out, size_t size);

/* Derives the geometry; returns 0 or WXG_ECONFIG with a reason in errstr. */
int wxg__guard_geom_compute(const wxg_guard_conf_t *c, wxg__guard_geom_t *g, char *errstr,
                            size_t errstr_size);

/* The layout stamp stored in Redis for this geometry. */
int wxg__guard_geom_stamp(const wxg__guard_geom_t *g, char *buf, size_t size);

/* The description wxg_guard_describe_layout() gives of this geometry. */
int wxg__guard_geom_describe(const wxg__guard_geom_t *g, char *buf, size_t size);

/* SHA-256 of the idempotency key. Returns 0 or WXG_ENOMEM. */
int wxg__guard_fingerprint(const void *key, size_t len, unsigned char fp[32]);

/* The Redis names of one message. */
typedef struct wxg__guard_keys {
    unsigned shard;
    uint64_t sub; /* sub-bucket index within the shard */
    char record[WXG__KEY_MAX];
    size_t record_len;
    char plugins[WXG__KEY_MAX]; /* the sub-marker hash */
    size_t plugins_len;
    char stem[WXG__KEY_MAX]; /* DONE bucket name without the time-bucket index */
    size_t stem_len;
    unsigned char field[WXG__FIELD_BYTES_MAX];
    size_t field_len;
} wxg__guard_keys_t;

/* Builds the names from the prefix and the fingerprint:
 *   record  <prefix>{s<shard hex>}:r:<first 16 fingerprint bytes in hex>
 *   plugins <prefix>{s<shard hex>}:p:<the same hex>
 *   bucket  <prefix>{s<shard hex>}:d:<sub>:<time bucket>   (stem = all but the time bucket)
 * The shard is written in fixed-width hex (one digit per 4 shard bits).
 * Returns 0 or WXG_EINVAL (prefix too long). */
int wxg__guard_keys_build(const char *prefix, const wxg__guard_geom_t *g,
                          const unsigned char fp[32], wxg__guard_keys_t *out);

/* The owner token of an in-flight value with this fence: the first WXG_GUARD_OWNER_LEN hex digits
 * of the SHA-1 of the fence in decimal (lib/guard/lua/_record.lua's inf_owner_of), so that the
 * value, which keeps only WXG__REC_OWNER_DIGITS digits of it, names its owner to any reader. 0 or
 * WXG_ENOMEM. */
int wxg__guard_inflight_owner(uint64_t fence, char out[WXG_GUARD_OWNER_LEN + 1]);

/* wxg__guard_payload_tag (guard_int.h) is a marker's value: Redis keeps it as a 2-byte integer
 * in the bucket's listpack. */

/* 1 when `prefix` is usable ([A-Za-z0-9:_.-], 1..WXG_GUARD_PREFIX_MAX bytes), else 0. */
int wxg__guard_prefix_valid(const char *prefix);

/* ---- The in-flight record (lib/guard/guard_record.def, shared with the Lua scripts) ---- */

/* The record's '|'-separated fields, 0-based (Lua's F_* are these + 1). */
enum wxg__guard_rec_field {
#define WXG__REC_FIELD(name, admin) WXG__F_##name,
#include "guard_record.def"
    WXG__F_COUNT
};

/* The variable parts after the fields (reason, key, plugins). */
enum wxg__guard_rec_part {
#define WXG__REC_PART(name, admin) WXG__P_##name,
#include "guard_record.def"
    WXG__P_COUNT
};

/* The numbers both sides use, as WXG__REC_<name>. */
enum wxg__guard_rec_const {
#define WXG__REC_CONST(name, value) WXG__REC_##name = value,
#include "guard_record.def"
    WXG__REC_CONST_END
};

/* ---- The Lua scripts (lib/guard/lua/, compiled in by lib/guard/lua/embed.cmake) ---- */

extern const char wxg__lua_claim[];
extern const char wxg__lua_renew[];
extern const char wxg__lua_plugin_done[];
extern const char wxg__lua_complete[];
extern const char wxg__lua_fail[];
extern const char wxg__lua_inspect[];
extern const char wxg__lua_release[];
extern const char wxg__lua_layout[];
extern const char wxg__lua_rearm[];
extern const char wxg__lua_purge[];
extern const char wxg__lua_peek[];
extern const char wxg__lua_repair[];

/* The scripts by index: wxg__guard_redis_t.sha[] holds their SHA1s once loaded. */
enum wxg__guard_script {
    WXG__S_CLAIM,
    WXG__S_RENEW,
    WXG__S_PLUGIN_DONE,
    WXG__S_COMPLETE,
    WXG__S_FAIL,
    WXG__S_INSPECT,
    WXG__S_RELEASE,
    WXG__S_LAYOUT,
    WXG__S_REARM,
    WXG__S_PURGE,
    WXG__S_PEEK,
    WXG__S_REPAIR,
    WXG__S_COUNT
};

/* ---- The Redis designs' state and connection (lib/guard/guard_conn.c) ---- */

/* One Sentinel of conf.sentinels. */
typedef struct wxg__guard_sentinel {
    char host[256];
    int port;
} wxg__guard_sentinel_t;

/* Time buckets whose selector bits a handle remembers: more than a claim's window holds (at
 * most retention / width + 1 = 65, and the clock margin's worth more), so that a steady handle
 * asks Redis once per time bucket. */
#define WXG__GEOM_CACHE 72

/* The state of a Redis design's handle (its wxg__guard_impl). */
typedef struct wxg__guard_redis {
    /* The handle this state belongs to, with its counters and error buffer (set by
     * wxg__guard_redis_attach; NULL before). */
    wxg_guard_t *handle;
    wxg_guard_stats_t *stats;
    char *last_error;
    size_t last_error_size;
    wxg_guard_conf_t conf; /* string members point at the copies below */
    char *host, *unix_path, *user, *password, *prefix;
    /* Sentinel mode (nsent > 0): the Sentinels, the one to ask first (the last that answered),
     * and the primary's address they gave for the current connection. */
    char *sentinel_master, *sentinel_user, *sentinel_password;
    wxg__guard_sentinel_t sent[WXG_GUARD_SENTINELS_MAX];
    int nsent, sent_next;
    char cur_host[256];
    int cur_port;
    wxg__guard_geom_t geom;
    char stamp[160];
    char layout_key[WXG__KEY_MAX];
    char *client_name;    /* NULL: no CLIENT SETNAME */
    wxg__rtls_conf_t tls; /* the strings owned here; used when conf.tls / conf.sentinel_tls */
    wxg__rconn_t *conn;   /* NULL while disconnected (single server and Sentinel) */
    /* Redis Cluster mode (cluster_nodes set): the client of the cluster instead of conn, NULL
     * while disconnected; the counters of the clients freed before it, so that the handle's
     * cluster_* counters keep growing over reconnects. */
    char *cluster_nodes;
    wxg__rcluster_t *cluster;
    wxg__rcluster_stats_t cluster_base;
    char sha[WXG__S_COUNT][41];
    wxg__rbackoff_t backoff;
    int64_t stamp_checked_ms;
    /* The selector bits of recent time buckets (adaptive layout, lib/guard/guard_geom.c); sel 0:
     * an empty slot; negative: a time bucket that ended without a stamp. Valid only for the
     * connections they were read over (gcache_epoch, see wxg__guard_sel). */
    struct {
        int64_t tb;
        int sel;
    } gcache[WXG__GEOM_CACHE];
    uint64_t gcache_epoch;
    /* A design's own state beside this one (the native design's), freed by its destroy. */
    void *design_state;
    /* The server's clock, sampled with TIME (wxg__guard_clock_sample): its time in µs, and this
     * machine's monotonic µs just before the TIME was sent. An estimate from them is never
     * behind the server's clock by more than the drift since the sample. */
    int64_t clock_srv_us, clock_mono_us;
    /* Mixed into the near cache's fingerprints: this Redis server, database and prefix. */
    unsigned char cache_ns[WXG__DONECACHE_FP_LEN];
} wxg__guard_redis_t;

/* Allocates the state for a checked `conf` (wxg_guard_new checked it): copies the strings,
 * derives the geometry and the layout stamp, parses the Sentinels. Does not connect.
 * Returns 0 with *out set, or WXG_ECONFIG / WXG_ENOMEM with errstr filled. */
int wxg__guard_redis_init(const wxg_guard_conf_t *conf, wxg__guard_redis_t **out, char *errstr,
                          size_t errstr_size);

/* Makes the handle over `rg` with `ops` and connects it. Takes ownership of `rg`: on failure it
 * is freed and NULL returned, with errstr and *err (may be NULL) as wxg_guard_new(). */
wxg_guard_t *wxg__guard_redis_attach(wxg__guard_redis_t *rg, const wxg__guard_ops_t *ops, int *err,
                                     char *errstr, size_t errstr_size);

/* Closes the connection, wipes the secrets and frees the state. NULL is accepted. */
void wxg__guard_redis_free(wxg__guard_redis_t *rg);

/* Makes sure there is a live connection: replaces one the server closed, reconnects when the
 * backoff allows (else fails fast with WXG_ECONN) and refreshes the layout stamp now and then.
 * Returns 0 or the connection's error code, with the last error set. */
int wxg__guard_conn_ensure(wxg__guard_redis_t *rg);

/* Frees a dead connection; the next wxg__guard_conn_ensure connects again. */
void wxg__guard_conn_drop(wxg__guard_redis_t *rg);

/* Sends one command on the live connection and reads its reply (*out, the caller's to free).
 * On an I/O error the connection is dropped and the code returned, errstr naming argv[0]. */
int wxg__guard_conn_command(wxg__guard_redis_t *rg, int argc, const char **argv, const size_t *lens,
                            redisReply **out, char *errstr, size_t errstr_size);

/* One command of a pipeline: argc binary-safe arguments. In Redis Cluster mode a command goes
 * to the primary serving the slot of its first key: KEYS[1] of an EVAL / EVALSHA / FCALL with
 * keys (argv[3]), else argv[1]; a command without a key (PING, a script without keys) goes to
 * any primary, and a trailing WAIT waits on every primary the pipeline wrote to. Every key a
 * command touches must share that slot. (A design whose commands put their key elsewhere
 * needs a routing-key member here; the designs so far do not. Appended at the end, it would
 * still break the positional initialisers under -Wmissing-field-initializers.) */
typedef struct wxg__guard_cmd {
    int argc;
    const char **argv;
    const size_t *lens;
} wxg__guard_cmd_t;

/* Sends the n commands (n >= 1) in one pipeline on the live connection (call
 * wxg__guard_conn_ensure first) and reads their replies: replies[i] answers cmds[i] and is the
 * caller's to free (freeReplyObject). extra_ms lengthens the reply deadline beyond the command
 * timeout (a WAIT's own timeout). Counts one round trip. In Redis Cluster mode the commands go
 * to their slots' primaries as parallel pipelines (see wxg__guard_cmd_t), redirections are
 * followed, and a trailing WAIT is answered with the fewest acknowledgements of any primary
 * written to; a node's failure leaves the cluster client connected to the others.
 * Returns 0 when every reply arrived (error replies included: they are replies). Otherwise the
 * connection is dropped, the last error set and WXG_ECONN, WXG_ETIMEDOUT or WXG_ENOMEM
 * returned; *got (may be NULL) holds how many replies arrived, replies[0..*got) are valid, and
 * commands *got..n-1 have an unknown outcome: they may or may not have run, so the caller
 * treats them as a timeout, never as done. */
int wxg__guard_conn_pipeline(wxg__guard_redis_t *rg, const wxg__guard_cmd_t *cmds, size_t n,
                             int extra_ms, redisReply **replies, size_t *got);

/* ---- The layout of each time bucket (lib/guard/guard_geom.c) ---- */

/* The selector bits of time bucket tb: the pinned ones, or (adaptive layout) its stamp in Redis,
 * which `create` makes when there is none (from the markers of the time bucket before); without
 * `create` a time bucket without a stamp holds nothing and any selector bits do. May talk to
 * Redis (once per time bucket and handle). 0 or an error code, with the last error set. */
int wxg__guard_sel(wxg__guard_redis_t *rg, int64_t tb, int create, int *sel);

/* What the remembered selector bits are valid for: a number that changes with every new
 * connection (single server, Sentinel), and in a cluster with every slot map read and every
 * node connection lost. Bits remembered under another number are read again. */
uint64_t wxg__guard_conn_epoch(const wxg__guard_redis_t *rg);

/* Samples the server's clock with TIME on the live connection. 0 or an error code. */
int wxg__guard_clock_sample(wxg__guard_redis_t *rg);

/* The server's time now as the last sample gives it, in µs: the server's time at the sample
 * plus this machine's monotonic time since the TIME was sent, so never earlier than the server's
 * clock (clock rates being equal). */
int64_t wxg__guard_clock_us(const wxg__guard_redis_t *rg);

/* How far the estimate may be from the server's clock, in ms: the margin a time window keeps
 * and a native step's distance from a bucket boundary. */
#define WXG__CLOCK_MARGIN_MS 2000
/* A sample older than this is taken again before the next call. */
#define WXG__CLOCK_RESAMPLE_MS 60000

/* (Re)loads every script into the server's script cache. 0 or an error code with errstr. */
int wxg__guard_conn_load_scripts(wxg__guard_redis_t *rg, char *errstr, size_t errstr_size);

/* Classifies an error reply: WXG_EAUTH for NOAUTH/WRONGPASS/NOPERM, 1 for NOSCRIPT (not an error
 * for the caller: reload and retry), WXG_EREDIS for anything else. */
int wxg__guard_classify_error(const char *str, size_t len);

/* The code a call fails with for an error reply: WXG_EAUTH for authentication and ACL
 * refusals, WXG_EREDIS for the rest (NOSCRIPT included). */
int wxg__guard_refusal_code(const redisReply *r);

/* Notes an error reply: READONLY (the server was demoted, or the name points elsewhere now)
 * counts a demotion and drops the connection, so that the next call connects again. */
void wxg__guard_conn_note_refusal(wxg__guard_redis_t *rg, const redisReply *r);

/* ---- Pipelined script calls (lib/guard/guard_batch.c) ----
 *
 * One EVALSHA per chunk of at most batch_max messages (one shard per chunk in cluster mode), all
 * chunks of an API call pipelined in one round trip. A transition or one-message admin script
 * declares every key of every message (lib/guard/lua/_record.lua): the NB DONE buckets of its time
 * window, newest first, then the record and the sub-marker hash; its first four arguments are
 * NB, TB_HI, the bucket width and the retention (wxg__guard_batch_window). */

#define WXG__ITEM_ARGS 6

/* One message of a batch. */
typedef struct wxg__guard_item {
    wxg__guard_keys_t k;
    unsigned char fp[32]; /* SHA-256 of the idempotency key */
    const char *arg[WXG__ITEM_ARGS];
    size_t len[WXG__ITEM_ARGS];
    char owner[WXG_GUARD_OWNER_LEN + 1];
    char who[WXG_GUARD_OWNER_LEN + 24]; /* 'owner|fence' of a ticket */
    char fence[24];
    char tag[8];    /* payload tag */
    char extra[24]; /* fail: attempt count */
} wxg__guard_item_t;

/* One script call of a batch. */
typedef struct wxg__guard_chunk {
    size_t first, count; /* a range of batch.order */
    int argc;
    const char **argv;
    size_t *lens;
    char numkeys[24];
    redisReply *reply;
} wxg__guard_chunk_t;

typedef struct wxg__guard_batch {
    int script;
    size_t n;
    wxg__guard_item_t *items;
    size_t *order;
    size_t nchunks;
    wxg__guard_chunk_t *chunks;
    const char *hdr[8];
    size_t hdrlen[8];
    int nhdr;
    int nargs;
    char hdrbuf[8][24];
    /* The time window (wxg__guard_batch_window): nb buckets from tb_hi down; every message
     * declares its KPM = nb + 2 keys. 0: the items declare their record and sub-marker hash
     * only (peek). */
    int nb;
    int64_t tb_hi;
    char *names; /* the bucket names, WXG__KEY_MAX bytes each, message i's j-th at i * nb + j */
    /* The connections the names were laid out over (wxg__guard_conn_epoch); a batch run over
     * others is refused before anything is sent, since their stamps may differ. */
    uint64_t epoch;
} wxg__guard_batch_t;

/* A batch of n messages for `script`, nargs arguments per message. 0 or WXG_ENOMEM. Free with
 * wxg__guard_batch_free. */
int wxg__guard_batch_init(wxg__guard_batch_t *b, int script, size_t n, int nargs);
void wxg__guard_batch_free(wxg__guard_batch_t *b);

/* Sets the batch's time window from the handle's estimate of the server's clock (with a margin
 * either side, so that the buckets live at the server's time are among them), names each
 * message's bucket of each time bucket in the layout of that time bucket (wxg__guard_sel: may
 * talk to Redis) and appends its four header arguments: NB, TB_HI, width, retention. Call it first,
 * after the items' names are computed and before any other header argument. 0 or WXG_ENOMEM. */
int wxg__guard_batch_window(wxg__guard_redis_t *rg, wxg__guard_batch_t *b);

/* Appends a numeric argument sent once per script call, before the per-message ones. */
void wxg__guard_batch_hdr_num(wxg__guard_batch_t *b, long long v);

/* Computes an item's names from its key. fp: the key's fingerprint when the caller already
 * has it, else NULL. 0, WXG_EINVAL or WXG_ENOMEM. */
int wxg__guard_item_keys(const wxg__guard_redis_t *rg, wxg__guard_item_t *it, const char *key,
                         size_t key_len, const unsigned char *fp);

/* Fills it->who with 'owner|fence' of a ticket (and it->fence). 0 or WXG_EINVAL. */
int wxg__guard_item_who(wxg__guard_item_t *it, const wxg_guard_ticket_t *t);

/* Splits the filled items into chunks and builds each chunk's argv. 0 or WXG_ENOMEM. */
int wxg__guard_batch_build(const wxg__guard_redis_t *rg, wxg__guard_batch_t *b);

/* What a script answers when the batch's time window does not cover the server's clock (the
 * estimate drifted or the server's clock moved): sample the clock again and rebuild. Positive,
 * so that it never passes for a WXG_E* code. */
#define WXG__GUARD_SKEW 1

/* Runs a built batch: connects when needed, sends every chunk in one pipeline (plus WAIT for
 * writes when configured), reloads the scripts and re-sends once after NOSCRIPT. per_message:
 * each reply must be an array with one element per message. On success every chunk has a
 * non-error reply; a failure is counted and the last error set. WXG__GUARD_SKEW (after the
 * clock was sampled again) when a script refused the window. */
int wxg__guard_batch_run(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int writes,
                         int per_message);

/* The reply element of the j-th message of chunk c. */
const redisReply *wxg__guard_batch_elem(const wxg__guard_batch_t *b, size_t c, size_t j);

/* The per-message results of a run renew/plugin_done/complete/fail/repair batch into
 * results[] (WXG_GUARD_OK, _ALREADY_DONE, _LEASE_LOST). 0 or WXG_EREDIS. */
int wxg__guard_batch_results(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int *results);

/* ---- Script transitions (lib/guard/guard_transitions.c) ----
 *
 * Every transition as a script call per chunk, for the Lua design and for the native design's
 * rare paths. Arguments are checked as wxg__guard_ops_t says; results and counting as the
 * operations table's. */

/* Claims the messages by script. fps: the keys' fingerprints (NULL: hashed here); owners: the
 * owner token of each message (NULL: fresh random tokens); mine: for each message the in-flight
 * value a native claim already wrote with that owner, or NULL (the whole array may be NULL).
 * On failure out[] is cleared. */
int wxg__guard_script_claim(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                            wxg_guard_claim_t *out, const unsigned char (*fps)[32],
                            const char (*owners)[WXG_GUARD_OWNER_LEN + 1], const char *const *mine);
/* fps (may be NULL) receives each ticket's key fingerprint, for the near cache. */
int wxg__guard_script_complete(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                               int *results, unsigned char (*fps)[32]);
int wxg__guard_script_renew(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                            int *results);
int wxg__guard_script_plugin_done(wxg__guard_redis_t *rg, const wxg_guard_plugin_done_t *items,
                                  size_t n, int *results);
int wxg__guard_script_fail(wxg__guard_redis_t *rg, const wxg_guard_failure_t *items, size_t n,
                           int *results);

/* The second step of a native complete (lib/guard/lua/repair.lua): per ticket, the time bucket
 * its HINCRBY went to, what the HINCRBY left there and what the field held before, as decimal
 * strings (an in-flight value does not fit Lua's numbers); `left` is "" when the increment
 * changed nothing. Results as a complete's; counted. */
typedef struct wxg__guard_repair {
    const wxg_guard_ticket_t *t;
    char tb[24], left[24], before[24];
} wxg__guard_repair_t;
int wxg__guard_script_repair(wxg__guard_redis_t *rg, const wxg__guard_repair_t *r, size_t n,
                             int *results);

/* ---- The near cache in front of claim and behind complete (lib/guard/guard_near.c) ---- */

/* A design's Redis path of a claim: fps holds the keys' fingerprints when the near cache
 * computed them, else NULL; on failure out[] is cleared. */
typedef int (*wxg__guard_claim_fn)(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                                   wxg_guard_claim_t *out, const unsigned char (*fps)[32]);

/* Sets the handle's cache namespace (server, database, prefix). 0 or an error code. */
int wxg__guard_near_ns(wxg__guard_redis_t *rg);

/* Answers from the cache what it knows and sends only the rest through claim_redis. */
int wxg__guard_near_claim(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                          wxg_guard_claim_t *out, wxg__guard_claim_fn claim_redis);

/* Remembers the messages whose DONE marker a complete sent at monotonic sent_ms wrote (result
 * OK). fps: their key fingerprints. */
void wxg__guard_near_remember(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                              const int *results, const unsigned char (*fps)[32], int64_t sent_ms);

/* Parses one message's element of a claim reply into `out` (outcome, fence, attempt, finished
 * plugins). The ticket's key and owner are not touched. Returns 0, WXG_EREDIS (malformed) or
 * WXG_ENOMEM. */
int wxg__guard_parse_claim(const redisReply *r, wxg_guard_claim_t *out);

/* Parses one message's element of a renew/plugin_done/complete/fail reply into a
 * wxg_guard_result_t. Returns 0 or WXG_EREDIS. */
int wxg__guard_parse_result(const redisReply *r, int *result);

/* ---- The admin operations and ping of the Redis designs (lib/guard/guard_admin.c) ----
 *
 * Operations tables point at these; their arguments are checked as wxg__guard_ops_t says. They
 * read and write layout v4, the native and the Lua design's, whichever design the handle has. */

int wxg__guard_admin_inspect(wxg_guard_t *g, const char *key, size_t key_len,
                             const unsigned char *payload_hash, wxg_guard_record_t **out);
int wxg__guard_admin_release(wxg_guard_t *g, const char *key, size_t key_len, int *released);
int wxg__guard_admin_rearm(wxg_guard_t *g, const char *key, size_t key_len, int *rearmed);
int wxg__guard_admin_purge(wxg_guard_t *g, const char *key, size_t key_len, int *purged);
int wxg__guard_admin_scan(wxg_guard_t *g, uint64_t *cursor, int count, wxg_guard_scan_fn fn,
                          void *arg);
int wxg__guard_admin_ping(wxg_guard_t *g);
int wxg__guard_admin_describe_layout(const wxg_guard_t *g, char *buf, size_t size);
/* The ops->destroy of the Redis designs (the native one calls it from its own): frees the
 * wxg__guard_redis_t. */
void wxg__guard_redis_destroy(wxg_guard_t *g);

/* The entries the Redis designs' operations tables share, for their initialisers: the admin
 * operations, and with them the destroy of a design that keeps no state of its own. */
#define WXG__GUARD_REDIS_ADMIN_OPS                                            \
    .inspect = wxg__guard_admin_inspect, .release = wxg__guard_admin_release, \
    .rearm = wxg__guard_admin_rearm, .purge = wxg__guard_admin_purge,         \
    .scan = wxg__guard_admin_scan, .ping = wxg__guard_admin_ping,             \
    .describe_layout = wxg__guard_admin_describe_layout
#define WXG__GUARD_REDIS_OPS WXG__GUARD_REDIS_ADMIN_OPS, .destroy = wxg__guard_redis_destroy

/* ---- The designs' constructors (wxg_guard_new picks one) ---- */

wxg_guard_t *wxg__guard_lua_new(const wxg_guard_conf_t *conf, int *err, char *errstr,
                                size_t errstr_size);
wxg_guard_t *wxg__guard_native_new(const wxg_guard_conf_t *conf, int *err, char *errstr,
                                   size_t errstr_size);

/* The constructor both script-using designs share: the state (wxg__guard_redis_init), the
 * near cache's namespace, and the handle over `ops`, connected (wxg__guard_redis_attach). */
wxg_guard_t *wxg__guard_redis_new(const wxg_guard_conf_t *conf, const wxg__guard_ops_t *ops,
                                  int *err, char *errstr, size_t errstr_size);
wxg_guard_t *wxg__guard_naive_new(const wxg_guard_conf_t *conf, int *err, char *errstr,
                                  size_t errstr_size);

#endif /* WXG_GUARD_CONN_INT_H */
