/*
 * DESIGN: the guard's key layout -- the pure parts of the Redis designs.
 *
 * Purpose: everything about Redis names and the compact DONE markers that needs no Redis: the
 * false-duplicate arithmetic, the bucket geometry derived from the configuration, the layout
 * stamp that every guard on one prefix must agree on, and the names of one message.
 *
 * Keys. Every Redis name is built from the configured prefix and the SHA-256 fingerprint of the
 * idempotency key, never from the key's bytes, so hostile keys cannot leave the prefix or make
 * huge names. All names of one message share a hash tag {s<shard>} taken from the fingerprint:
 * in Redis Cluster its record, its sub-marker hash and every DONE bucket it may have a field in
 * live in one slot. On
 * complete a message becomes a fixed-width fingerprint field in a small hash bucket selected by
 * time bucket + fingerprint bits; buckets expire whole after the retention (docs/guard.md §3).
 *
 * Threads: pure functions, any thread. Failure modes: a geometry that cannot meet the
 * false-duplicate bound, or that would make claim probe too many buckets, is refused with
 * WXG_ECONFIG and a reason, before anything connects.
 */
#include "guard_conn_int.h"

#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "err_int.h"
#include "key_int.h"
#include "wxguard/key.h"

int wxg__guard_required_bits(double n, double p)
{
    double pairs = n * (n - 1.0) / 2.0;
    if (pairs <= 0)
        return 1;
    int b = (int)ceil(log2(pairs / p));
    /* Guard against rounding at the boundary: the bound must hold strictly. */
    while (pairs / ldexp(1.0, b) >= p)
        b++;
    return b;
}

/* The configuration checks that need no derived figure; 0 or WXG_ECONFIG with errstr. */
static int geom_check(const wxg_guard_conf_t *c, char *errstr, size_t errstr_size)
{
    if (c->done_retention_ms <= 0) {
        wxg__errf(errstr, errstr_size, "done_retention_ms must be positive");
        return WXG_ECONFIG;
    }
    if (c->done_expected_rate < 0 || c->done_expected_rate > 1e9) {
        wxg__errf(errstr, errstr_size, "done_expected_rate must be in [0, 1e9] (0: adaptive)");
        return WXG_ECONFIG;
    }
    if (c->done_bucket_target < 1 || c->done_bucket_target > 128) {
        wxg__errf(errstr, errstr_size,
                  "done_bucket_target must be 1..128 (Redis keeps hashes of up to 128 entries "
                  "compact by default)");
        return WXG_ECONFIG;
    }
    if (c->shard_bits < 0 || c->shard_bits > 16) {
        wxg__errf(errstr, errstr_size, "shard_bits must be 0..16");
        return WXG_ECONFIG;
    }
    return 0;
}

/* Selector bits for `per_time_bucket` markers in one time bucket, `target` per bucket. */
static int sel_for(double per_time_bucket, int target, int shard_bits)
{
    double want = per_time_bucket / (double)target;
    int sel = want > 1.0 ? (int)ceil(log2(want)) : 0;
    return sel < shard_bits ? shard_bits : sel;
}

int wxg__guard_sel_for_count(const wxg__guard_geom_t *g, double markers)
{
    int sel = sel_for(markers, g->bucket_target, g->shard_bits);
    return sel > WXG__SELECTOR_BITS_MAX ? WXG__SELECTOR_BITS_MAX : sel;
}

/* The fingerprint bytes a field needs so that selector + field bits meet the false-duplicate
 * bound for `window` markers; WXG_ECONFIG (with errstr) when that exceeds the maximum. */
static int field_bytes_for(double window, int sel, int *fb, int *required, char *errstr,
                           size_t errstr_size)
{
    *required = wxg__guard_required_bits(window, WXG__FALSE_DUP_P);
    int b = (*required - sel + 7) / 8;
    if (b < WXG__FIELD_BYTES_MIN)
        b = WXG__FIELD_BYTES_MIN;
    if (b > WXG__FIELD_BYTES_MAX) {
        wxg__errf(errstr, errstr_size, "needed fingerprint of %d bytes exceeds %d", b,
                  WXG__FIELD_BYTES_MAX);
        return WXG_ECONFIG;
    }
    *fb = b;
    return 0;
}

int wxg__guard_geom_compute(const wxg_guard_conf_t *c, wxg__guard_geom_t *g, char *errstr,
                            size_t errstr_size)
{
    wxg__guard_geom_t r;
    memset(&r, 0, sizeof r);
    int rc = geom_check(c, errstr, errstr_size);
    if (rc)
        return rc;
    r.retention_ms = c->done_retention_ms;
    r.bucket_ms = c->done_bucket_ms > 0 ? c->done_bucket_ms
                                        : c->done_retention_ms / WXG__BUCKETS_PER_RETENTION;
    if (r.bucket_ms < 1)
        r.bucket_ms = 1;
    if (r.retention_ms / r.bucket_ms > 64) {
        wxg__errf(errstr, errstr_size,
                  "done_bucket_ms too small: claim checks every live time bucket, at most 65 "
                  "(retention / width = %lld)",
                  (long long)(r.retention_ms / r.bucket_ms));
        return WXG_ECONFIG;
    }
    r.shard_bits = c->shard_bits;
    r.bucket_target = c->done_bucket_target;
    /* Adaptive: neither a rate nor selector bits pinned. The first time bucket of a prefix is
     * sized for WXG__ADAPTIVE_FIRST_RATE; each later one from the markers of the one before. */
    r.adaptive = !(c->done_expected_rate > 0) && c->done_selector_bits <= 0;
    double rate = r.adaptive ? WXG__ADAPTIVE_FIRST_RATE : c->done_expected_rate;
    double per_time_bucket = rate * (double)r.bucket_ms / 1000.0;
    int sel = c->done_selector_bits > 0 ? c->done_selector_bits
                                        : sel_for(per_time_bucket, c->done_bucket_target, 0);
    if (sel < r.shard_bits)
        sel = r.shard_bits;
    if (sel > WXG__SELECTOR_BITS_MAX) {
        wxg__errf(errstr, errstr_size, "selector bits %d exceed %d: lower the rate or the width",
                  sel, WXG__SELECTOR_BITS_MAX);
        return WXG_ECONFIG;
    }
    r.selector_bits = sel;
    r.bucket_mean = per_time_bucket / ldexp(1.0, sel);
    double window = rate * (double)(r.retention_ms + r.bucket_ms) / 1000.0;
    r.window_markers = window > WXG__FALSE_DUP_MARKERS ? window : WXG__FALSE_DUP_MARKERS;
    rc = field_bytes_for(r.window_markers, sel, &r.field_bytes, &r.required_bits, errstr,
                         errstr_size);
    double n = r.window_markers;
    int bound_sel = sel;
    if (rc == 0 && r.adaptive) {
        /* One field width for every time bucket, whatever its selector bits: wide enough for
         * the fewest selector bits (the shards alone) at the floor of the bound, and for
         * WXG__ADAPTIVE_MAX_RATE with the selector bits that rate gets. Between the two the
         * bound only eases (halving the rate halves the selector range but quarters the
         * pairs), so the stated bound is the one at WXG__ADAPTIVE_MAX_RATE. */
        int fb_low = 0, fb_high = 0, req = 0;
        double high = WXG__ADAPTIVE_MAX_RATE * (double)(r.retention_ms + r.bucket_ms) / 1000.0;
        if (high < WXG__FALSE_DUP_MARKERS)
            high = WXG__FALSE_DUP_MARKERS;
        int high_sel =
            wxg__guard_sel_for_count(&r, WXG__ADAPTIVE_MAX_RATE * (double)r.bucket_ms / 1000.0);
        rc = field_bytes_for(WXG__FALSE_DUP_MARKERS, r.shard_bits, &fb_low, &req, errstr,
                             errstr_size);
        if (rc == 0)
            rc = field_bytes_for(high, high_sel, &fb_high, &req, errstr, errstr_size);
        r.field_bytes = fb_low > fb_high ? fb_low : fb_high;
        n = high;
        bound_sel = high_sel;
    }
    if (rc)
        return rc;
    r.false_dup = n * (n - 1.0) / 2.0 / ldexp(1.0, bound_sel + 8 * r.field_bytes);
    *g = r;
    return 0;
}

int wxg__guard_geom_stamp(const wxg__guard_geom_t *g, char *buf, size_t size)
{
    char sel[16];
    if (g->adaptive)
        snprintf(sel, sizeof sel, "auto");
    else
        snprintf(sel, sizeof sel, "%d", g->selector_bits);
    int n = snprintf(buf, size, "%s shard=%d sel=%s field=%d width=%lld", WXG__LAYOUT_VERSION,
                     g->shard_bits, sel, g->field_bytes, (long long)g->bucket_ms);
    return n > 0 && (size_t)n < size ? 0 : WXG_EINVAL;
}

int wxg__guard_fingerprint(const void *key, size_t len, unsigned char fp[32])
{
    /* The key module's SHA-256 reuses one fetched implementation (see wxg_sha256). */
    return wxg_sha256(key, len, fp);
}

static uint64_t fp_bits(const unsigned char fp[32], int from, int count)
{
    /* Bits [from, from+count) of the fingerprint, most significant first; count <= 56. */
    uint64_t v = 0;
    for (int i = 0; i < count; i++) {
        int bit = from + i;
        v = (v << 1) | ((fp[bit / 8] >> (7 - bit % 8)) & 1u);
    }
    return v;
}

int wxg__guard_keys_build(const char *prefix, const wxg__guard_geom_t *g,
                          const unsigned char fp[32], wxg__guard_keys_t *out)
{
    /* Written byte by byte rather than with snprintf: this runs twice per message (claim and
     * complete), and format parsing was a visible share of a worker's CPU. */
    static const char digits[] = "0123456789abcdef";
    out->shard = (unsigned)fp_bits(fp, 0, g->shard_bits);
    out->sub = fp_bits(fp, g->shard_bits, g->selector_bits - g->shard_bits);
    /* Shards in fixed-width hex, so that every record name of a geometry has one length. */
    int w = g->shard_bits > 0 ? (g->shard_bits + 3) / 4 : 1;
    char tag[16];
    size_t tl = 0;
    tag[tl++] = '{';
    tag[tl++] = 's';
    for (int i = w - 1; i >= 0; i--)
        tag[tl++] = digits[(out->shard >> (4 * i)) & 15];
    tag[tl++] = '}';
    char sub[20];
    size_t sl = wxg__put_dec(sub, out->sub);
    size_t pl = strlen(prefix);
    /* record: prefix tag ":r:" 32 hex; stem: prefix tag ":d:" sub ":" */
    if (pl + tl + 3 + 32 >= sizeof out->record || pl + tl + 3 + sl + 1 >= sizeof out->stem)
        return WXG_EINVAL;
    char *p = out->record;
    memcpy(p, prefix, pl);
    memcpy(p + pl, tag, tl);
    memcpy(p + pl + tl, ":r:", 3);
    wxg__to_hex(fp, 16, p + pl + tl + 3);
    out->record_len = pl + tl + 3 + 32;
    memcpy(out->plugins, out->record, out->record_len + 1);
    out->plugins[pl + tl + 1] = 'p';
    out->plugins_len = out->record_len;
    p = out->stem;
    memcpy(p, prefix, pl);
    memcpy(p + pl, tag, tl);
    memcpy(p + pl + tl, ":d:", 3);
    p += pl + tl + 3;
    memcpy(p, sub, sl);
    p[sl] = ':';
    p[sl + 1] = '\0';
    out->stem_len = pl + tl + 3 + sl + 1;
    memcpy(out->field, fp + WXG__FIELD_OFFSET, (size_t)g->field_bytes);
    out->field_len = (size_t)g->field_bytes;
    return 0;
}

int wxg__guard_bucket_name(const char *prefix, int shard_bits, unsigned shard, uint64_t sub,
                           int64_t tb, char *out, size_t size)
{
    int w = shard_bits > 0 ? (shard_bits + 3) / 4 : 1;
    int n = snprintf(out, size, "%s{s%0*x}:d:%llu:%lld", prefix, w, shard, (unsigned long long)sub,
                     (long long)tb);
    return n > 0 && (size_t)n < size ? 0 : WXG_EINVAL;
}

int wxg__guard_bucket_of(const char *prefix, const wxg__guard_geom_t *g, int sel,
                         const unsigned char fp[32], int64_t tb, char *out, size_t size)
{
    unsigned shard = (unsigned)fp_bits(fp, 0, g->shard_bits);
    uint64_t sub = fp_bits(fp, g->shard_bits, sel - g->shard_bits);
    return wxg__guard_bucket_name(prefix, g->shard_bits, shard, sub, tb, out, size);
}

int wxg__guard_inflight_owner(uint64_t fence, char out[WXG_GUARD_OWNER_LEN + 1])
{
    char dec[24];
    size_t n = wxg__put_dec(dec, fence);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int ml = 0;
    if (EVP_Digest(dec, n, md, &ml, EVP_sha1(), NULL) != 1 || ml * 2 < WXG_GUARD_OWNER_LEN)
        return WXG_ENOMEM;
    wxg__to_hex(md, WXG_GUARD_OWNER_LEN / 2, out);
    out[WXG_GUARD_OWNER_LEN] = '\0';
    return 0;
}

int wxg__guard_payload_tag(const unsigned char *payload_hash)
{
    /* Never 0: the native complete's HINCRBY reads a field it found empty as 0, and must tell
     * it from a marker (lib/guard/guard_native.c). A payload whose two bytes are 0 shares tag 1. */
    if (!payload_hash)
        return 1;
    int t = (int)(int16_t)(uint16_t)((payload_hash[0] << 8) | payload_hash[1]);
    return t ? t : 1;
}

int wxg__guard_prefix_valid(const char *prefix)
{
    size_t n = prefix ? strlen(prefix) : 0;
    if (n == 0 || n > WXG_GUARD_PREFIX_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = prefix[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == ':' || ch == '_' || ch == '.' || ch == '-';
        if (!ok)
            return 0;
    }
    return 1;
}

int wxg__guard_geom_describe(const wxg__guard_geom_t *m, char *buf, size_t size)
{
    /* Adaptive: each time bucket's selector bits are stamped in Redis; the first one's are
     * shown, and the bound is the one at the highest rate the field width is sized for. */
    char sel[48];
    if (m->adaptive)
        snprintf(sel, sizeof sel, "auto first_selector_bits=%d", m->selector_bits);
    else
        snprintf(sel, sizeof sel, "%d", m->selector_bits);
    int n = snprintf(buf, size,
                     "shards=%d selector_bits=%s field_bytes=%d bucket_ms=%lld retention_ms=%lld "
                     "bucket_target=%d bucket_mean=%.1f window_markers=%.3g "
                     "false_duplicate_bound=%.3g",
                     1 << m->shard_bits, sel, m->field_bytes, (long long)m->bucket_ms,
                     (long long)m->retention_ms, m->bucket_target, m->bucket_mean,
                     m->window_markers, m->false_dup);
    return n > 0 && (size_t)n < size ? 0 : WXG_EINVAL;
}
