/*
 * Internals of the guard shared with its unit tests: the pure parts (key building, fingerprint
 * and bucket geometry, reply parsing) that need no Redis.
 */
#ifndef WXG_GUARD_INT_H
#define WXG_GUARD_INT_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "wxguard/guard.h"

/* The Lua scripts from lib/lua/, compiled in by lib/lua/embed.cmake. */
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
 * in-flight record is one string (lib/lua/_record.lua) instead of a hash. v3: that string also
 * carries the idempotency key and the rearm time (for the admin tool). */
#define WXG__LAYOUT_VERSION "v3"
/* Default time-bucket width = retention / this: claim probes this + 1 buckets, and a marker lives
 * between the retention and retention * (1 + 1 / this). Chosen by measurement: docs/guard.md. */
#define WXG__BUCKETS_PER_RETENTION 1

/* Geometry of the compact DONE markers, derived from the configuration. */
typedef struct wxg__guard_geom {
    int shard_bits;        /* hash-tag shard = first shard_bits bits of the fingerprint */
    int selector_bits;     /* shard bits + sub-bucket bits: fingerprint bits implied by a bucket */
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

/* Derives the geometry; returns 0 or WXG_ECONFIG with a reason in errstr. */
int wxg__guard_geom_compute(const wxg_guard_conf_t *c, wxg__guard_geom_t *g, char *errstr,
                            size_t errstr_size);

/* The layout stamp stored in Redis for this geometry. */
int wxg__guard_geom_stamp(const wxg__guard_geom_t *g, char *buf, size_t size);

/* SHA-256 of the idempotency key. Returns 0 or WXG_ENOMEM. */
int wxg__guard_fingerprint(const void *key, size_t len, unsigned char fp[32]);

/* The Redis names of one message. */
typedef struct wxg__guard_keys {
    unsigned shard;
    uint64_t sub; /* sub-bucket index within the shard */
    char record[WXG__KEY_MAX];
    size_t record_len;
    char stem[WXG__KEY_MAX]; /* DONE bucket name without the time-bucket index */
    size_t stem_len;
    unsigned char field[WXG__FIELD_BYTES_MAX];
    size_t field_len;
} wxg__guard_keys_t;

/* Builds the names from the prefix and the fingerprint:
 *   record  <prefix>{s<shard hex>}:r:<first 16 fingerprint bytes in hex>
 *   bucket  <prefix>{s<shard hex>}:d:<sub>:<time bucket>   (stem = all but the time bucket)
 * The shard is written in fixed-width hex (one digit per 4 shard bits).
 * Returns 0 or WXG_EINVAL (prefix too long). */
int wxg__guard_keys_build(const char *prefix, const wxg__guard_geom_t *g,
                          const unsigned char fp[32], wxg__guard_keys_t *out);

/* The payload tag stored as a marker's value: the first two bytes of the payload hash as a
 * signed 16-bit number (Redis keeps it as a 2-byte integer in the listpack); 0 for NULL. */
int wxg__guard_payload_tag(const unsigned char *payload_hash);

/* 1 when `prefix` is usable ([A-Za-z0-9:_.-], 1..WXG_GUARD_PREFIX_MAX bytes), else 0. */
int wxg__guard_prefix_valid(const char *prefix);

/* 1 when `name` is a usable plugin name, else 0. */
int wxg__guard_plugin_name_valid(const char *name);

/* Classifies an error reply: WXG_EAUTH for NOAUTH/WRONGPASS/NOPERM, 1 for NOSCRIPT (not an error
 * for the caller: reload and retry), WXG_EREDIS for anything else. */
int wxg__guard_classify_error(const char *str, size_t len);

/* Parses one message's element of a claim reply into `out` (outcome, fence, attempt, finished
 * plugins). The ticket's key and owner are not touched. Returns 0, WXG_EREDIS (malformed) or
 * WXG_ENOMEM. */
int wxg__guard_parse_claim(const redisReply *r, wxg_guard_claim_t *out);

/* Parses one message's element of a renew/plugin_done/complete/fail reply into a
 * wxg_guard_result_t. Returns 0 or WXG_EREDIS. */
int wxg__guard_parse_result(const redisReply *r, int *result);

#endif /* WXG_GUARD_INT_H */
