/*
 * DESIGN: the guard's admin operations over Redis: inspect, release, rearm, purge, scan, ping.
 *
 * Purpose: what the admin tool (wxguardctl) and the readiness probes need beside the worker's
 * transitions. inspect reads everything known about one message (its in-flight record and its
 * DONE marker); release clears a claim whose owner is known dead; rearm gives a FAILED message a
 * fresh retry budget for a redrive; purge deletes one in-flight record; scan walks the in-flight
 * records under the prefix with SCAN (never KEYS); ping checks that Redis answers. Each
 * one-message operation is one read-only or owner-free Lua script (lib/guard/lua/) run through the
 * scripts' batch runner (lib/guard/guard_batch.c), so it sees the record exactly as the
 * transitions write it. The record's format stays inside the scripts: they hand C a flat name/value
 * list (lib/guard/lua/_record.lua's rec_fields, named as lib/guard/guard_record.def names them),
 * which parse_record_fields reads.
 *
 * The Redis designs' operations tables point here. They read layout v4, which the native and
 * the Lua design share: in the naive design they find nothing of its keys (docs/guard.md §8).
 *
 * Threads: the handle's thread only; no locks. Failure modes: those of the connection
 * (lib/guard/guard_conn.c) and of the batch runner; an answer of the wrong shape is WXG_EREDIS with
 * the last error set; a scan callback's non-zero value stops the walk and is returned.
 */
#include "guard_conn_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Record fields
 */

static int64_t str_ll(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 20)
        return 0;
    char buf[24];
    memcpy(buf, r->str, r->len);
    buf[r->len] = '\0';
    char *end = NULL;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end)
        return 0;
    return v;
}

static char *str_dup_reply(const redisReply *r)
{
    char *s = malloc(r->len + 1);
    if (s) {
        memcpy(s, r->str, r->len);
        s[r->len] = '\0';
    }
    return s;
}

/* The names the admin scripts give the record's fields and parts (lib/guard/guard_record.def). */
static const char *const field_names[WXG__F_COUNT] = {
#define WXG__REC_FIELD(name, admin) admin,
#include "guard_record.def"
};
static const char *const part_names[WXG__P_COUNT] = {
#define WXG__REC_PART(name, admin) admin,
#include "guard_record.def"
};

static int is_name(const redisReply *k, const char *name)
{
    size_t n = strlen(name);
    return n > 0 && k->len == n && memcmp(k->str, name, n) == 0;
}

/* The field named by `k`, or -1 when it names none. */
static int field_of(const redisReply *k)
{
    for (int i = 0; i < WXG__F_COUNT; i++) {
        if (is_name(k, field_names[i]))
            return i;
    }
    return -1;
}

/* A finished plugin's field: the PLUGINS part's name followed by the plugin's name. */
static int is_plugin_field(const redisReply *k)
{
    size_t n = strlen(part_names[WXG__P_PLUGINS]);
    return k->len > n && memcmp(k->str, part_names[WXG__P_PLUGINS], n) == 0;
}

/* Fills the record member of field `i` from `v` (i < 0: not a field). */
static void record_number(wxg_guard_record_t *rec, int i, const redisReply *v, int64_t now,
                          char *st)
{
    switch (i) {
    case WXG__F_ST:
        if (v->len == 1)
            *st = v->str[0];
        break;
    case WXG__F_OWNER:
        if (v->len == WXG_GUARD_OWNER_LEN) {
            memcpy(rec->owner, v->str, WXG_GUARD_OWNER_LEN);
            rec->owner[WXG_GUARD_OWNER_LEN] = '\0';
        }
        break;
    case WXG__F_FENCE:
        rec->fence = (uint64_t)str_ll(v);
        break;
    case WXG__F_ATTEMPT:
        rec->attempt = (uint32_t)str_ll(v);
        break;
    case WXG__F_LEASE:
        rec->lease_ms_left = str_ll(v) - now;
        break;
    case WXG__F_CLAIMED:
        rec->claimed_at_ms = str_ll(v);
        break;
    case WXG__F_FAILS:
        rec->fail_attempts = (uint32_t)str_ll(v);
        break;
    case WXG__F_FAILED:
        rec->failed_at_ms = str_ll(v);
        break;
    case WXG__F_REARMED:
        rec->rearmed_at_ms = str_ll(v);
        break;
    default:
        break; /* the payload tag, or a name a newer layout added */
    }
}

/* Fills the record member named by `k` from `v`; names it does not know are skipped (a newer
 * layout may add some). 0 or WXG_ENOMEM. */
static int record_field(wxg_guard_record_t *rec, const redisReply *k, const redisReply *v,
                        int64_t now, char *st)
{
    if (is_name(k, part_names[WXG__P_KEY])) {
        rec->msg_key = str_dup_reply(v);
        if (!rec->msg_key)
            return WXG_ENOMEM;
        rec->msg_key_len = v->len;
    } else if (is_name(k, part_names[WXG__P_REASON])) {
        rec->fail_reason = str_dup_reply(v);
        if (!rec->fail_reason)
            return WXG_ENOMEM;
    } else {
        record_number(rec, field_of(k), v, now, st);
    }
    return 0;
}

/* Copies the plugin fields of `f` (np of them, pbytes of names and results with their NULs)
 * into rec->finished, one allocation. 0 or WXG_ENOMEM. */
static int record_plugins(wxg_guard_record_t *rec, const redisReply *f, size_t np, size_t pbytes)
{
    rec->finished = malloc(np * sizeof *rec->finished + pbytes);
    if (!rec->finished)
        return WXG_ENOMEM;
    char *p = (char *)(rec->finished + np);
    for (size_t i = 0; i < f->elements; i += 2) {
        const redisReply *k = f->element[i], *v = f->element[i + 1];
        if (!is_plugin_field(k))
            continue;
        wxg_guard_plugin_result_t *pr = &rec->finished[rec->n_finished++];
        size_t skip = strlen(part_names[WXG__P_PLUGINS]);
        memcpy(p, k->str + skip, k->len - skip);
        p[k->len - skip] = '\0';
        pr->name = p;
        p += k->len - skip + 1;
        memcpy(p, v->str, v->len);
        p[v->len] = '\0';
        pr->result = (const unsigned char *)p;
        pr->result_len = v->len;
        p += v->len + 1;
    }
    return 0;
}

/* Fills `rec` from the flat name/value list `f` of an in-flight record (lib/guard/lua/_record.lua's
 * rec_fields), read at server time `now` (ms); *st receives the state letter. Returns 0,
 * WXG_EREDIS or WXG_ENOMEM (what was filled is freed by wxg_guard_record_free). */
static int parse_record_fields(wxg_guard_record_t *rec, const redisReply *f, int64_t now, char *st)
{
    if (f->type != REDIS_REPLY_ARRAY || f->elements % 2)
        return WXG_EREDIS;
    size_t np = 0, pbytes = 0;
    for (size_t i = 0; i < f->elements; i += 2) {
        const redisReply *k = f->element[i], *v = f->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            return WXG_EREDIS;
        if (is_plugin_field(k)) {
            np++;
            pbytes += k->len - strlen(part_names[WXG__P_PLUGINS]) + 1 + v->len + 1;
            continue;
        }
        int rc = record_field(rec, k, v, now, st);
        if (rc)
            return rc;
    }
    if (np > 0) {
        int rc = record_plugins(rec, f, np, pbytes);
        if (rc)
            return rc;
    }
    rec->has_record = f->elements > 0;
    return 0;
}

static wxg_guard_state_t record_state(char st)
{
    return st == 'P' ? WXG_GUARD_PROCESSING : st == 'F' ? WXG_GUARD_FAILED : WXG_GUARD_ABSENT;
}

/* ---------------------------------------------------------------------------------------------
 * inspect, release, rearm, purge
 */

/* One-message admin batches (inspect, release, rearm, purge) share the batch runner: the
 * message's names, its time window (its keys declared, lib/guard/lua/_record.lua), then the
 * script's own header arguments and its per-message arguments, run with a rebuild after WXGSKEW. */
static int admin_batch(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, int script, const char *key,
                       size_t key_len, const long long *hdr, int nhdr, int writes)
{
    int rc = 0;
    for (int round = 0; round < 2; round++) {
        rc = wxg__guard_batch_init(b, script, 1, 2);
        if (rc)
            return rc;
        wxg__guard_item_t *it = &b->items[0];
        rc = wxg__guard_item_keys(rg, it, key, key_len, NULL);
        if (rc == 0)
            rc = wxg__guard_batch_window(rg, b);
        for (int h = 0; h < nhdr && rc == 0; h++)
            wxg__guard_batch_hdr_num(b, hdr[h]);
        it->arg[0] = (const char *)it->k.field;
        it->len[0] = it->k.field_len;
        it->arg[1] = key;
        it->len[1] = key_len;
        if (rc == 0)
            rc = wxg__guard_batch_build(rg, b);
        if (rc == 0)
            rc = wxg__guard_batch_run(rg, b, writes, 0);
        if (rc != WXG__GUARD_SKEW)
            break;
        wxg__guard_batch_free(b);
    }
    if (rc == WXG__GUARD_SKEW) {
        rc = WXG_EREDIS;
        wxg__guard_set_error(rg->handle, "the server's clock moved twice under one call");
    }
    if (rc)
        wxg__guard_batch_free(b);
    return rc;
}

/* Whether `r` is inspect.lua's answer {now, fields, pttl, bucket, marker, bucket pttl}. */
static int inspect_reply_ok(const redisReply *r)
{
    return r->elements == 6 && r->element[0]->type == REDIS_REPLY_INTEGER &&
           r->element[1]->type == REDIS_REPLY_ARRAY && r->element[2]->type == REDIS_REPLY_INTEGER &&
           r->element[3]->type == REDIS_REPLY_STRING && r->element[4]->type == REDIS_REPLY_STRING &&
           r->element[5]->type == REDIS_REPLY_INTEGER && r->element[1]->elements % 2 == 0;
}

/* Builds the record of an inspect answer `r` for the message whose names are `k`. */
static int inspect_record(const redisReply *r, const wxg__guard_keys_t *k,
                          const unsigned char *payload_hash, wxg_guard_record_t **out)
{
    wxg_guard_record_t *rec = calloc(1, sizeof *rec);
    if (!rec)
        return WXG_ENOMEM;
    char st = 0;
    int rc = 0;
    rec->record_key = strdup(k->record);
    if (!rec->record_key) {
        rc = WXG_ENOMEM;
        goto out;
    }
    rc = parse_record_fields(rec, r->element[1], r->element[0]->integer, &st);
    if (rc)
        goto out;
    rec->record_ttl_ms = r->element[2]->integer;
    rec->payload_tag = wxg__guard_payload_tag(payload_hash);
    if (r->element[3]->len > 0) {
        rec->done_bucket = str_dup_reply(r->element[3]);
        if (!rec->done_bucket) {
            rc = WXG_ENOMEM;
            goto out;
        }
        /* A spent value (lib/guard/guard_record.def) is DONE with an unknown tag: 0. */
        long long tag = str_ll(r->element[4]);
        rec->done_payload_tag = tag >= -32768 && tag <= 32767 ? (int)tag : 0;
        rec->done_ttl_ms = r->element[5]->integer;
    }
    rec->state = rec->done_bucket ? WXG_GUARD_DONE : record_state(st);
out:
    if (rc)
        wxg_guard_record_free(rec);
    else
        *out = rec;
    return rc;
}

int wxg__guard_admin_inspect(wxg_guard_t *g, const char *key, size_t key_len,
                             const unsigned char *payload_hash, wxg_guard_record_t **out)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    wxg__guard_batch_t b;
    /* inspect.lua reads the field; the key is sent too, unused. */
    int rc = admin_batch(rg, &b, WXG__S_INSPECT, key, key_len, NULL, 0, 0);
    if (rc)
        return rc;
    if (!inspect_reply_ok(b.chunks[0].reply)) {
        rc = WXG_EREDIS;
        wxg__guard_set_error(g, "unexpected inspect reply");
    } else {
        rc = inspect_record(b.chunks[0].reply, &b.items[0].k, payload_hash, out);
    }
    wxg__guard_batch_free(&b);
    return rc;
}

/* Runs a one-message admin script with the header arguments hdr[0..nhdr) and returns its
 * integer reply. */
static int admin_int(wxg__guard_redis_t *rg, int script, const char *key, size_t key_len,
                     const long long *hdr, int nhdr, long long *v)
{
    wxg__guard_batch_t b;
    int rc = admin_batch(rg, &b, script, key, key_len, hdr, nhdr, 1);
    if (rc)
        return rc;
    if (b.chunks[0].reply->type != REDIS_REPLY_INTEGER) {
        rc = WXG_EREDIS;
        wxg__guard_set_error(rg->handle, "unexpected admin reply");
    } else {
        *v = b.chunks[0].reply->integer;
    }
    wxg__guard_batch_free(&b);
    return rc;
}

int wxg__guard_admin_release(wxg_guard_t *g, const char *key, size_t key_len, int *released)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    long long v = 0, hdr[1] = {rg->conf.failed_retention_ms};
    int rc = admin_int(rg, WXG__S_RELEASE, key, key_len, hdr, 1, &v);
    if (rc == 0)
        *released = v == 1;
    return rc;
}

int wxg__guard_admin_rearm(wxg_guard_t *g, const char *key, size_t key_len, int *rearmed)
{
    long long v = 0;
    int rc = admin_int(wxg__guard_impl(g), WXG__S_REARM, key, key_len, NULL, 0, &v);
    if (rc == 0)
        *rearmed = v == 1;
    return rc;
}

int wxg__guard_admin_purge(wxg_guard_t *g, const char *key, size_t key_len, int *purged)
{
    long long v = 0;
    int rc = admin_int(wxg__guard_impl(g), WXG__S_PURGE, key, key_len, NULL, 0, &v);
    if (rc == 0)
        *purged = v == 1;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Plain commands: ping, SCAN
 */

/* Sends argv as one command on the handle's connection (connecting first when needed). */
static int admin_cmd(wxg__guard_redis_t *rg, int argc, const char **argv, const size_t *lens,
                     redisReply **out)
{
    int rc = wxg__guard_conn_ensure(rg);
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    wxg__guard_cmd_t cmd = {argc, argv, lens};
    rc = wxg__guard_conn_pipeline(rg, &cmd, 1, 0, out, NULL);
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    if ((*out)->type == REDIS_REPLY_ERROR) {
        rc = wxg__guard_refusal_code(*out);
        wxg__guard_set_error(rg->handle, "Redis refused %s: %.*s", argv[0],
                             (int)((*out)->len > 200 ? 200 : (*out)->len), (*out)->str);
        wxg__guard_conn_note_refusal(rg, *out);
        freeReplyObject(*out);
        *out = NULL;
        wxg__guard_count_error(rg->stats, rc);
    }
    return rc;
}

static int pong(void *arg, int node, const char *addr, const redisReply *r)
{
    (void)node;
    wxg__guard_redis_t *rg = arg;
    if (r->type == REDIS_REPLY_STATUS && r->len == 4 && memcmp(r->str, "PONG", 4) == 0)
        return 0;
    wxg__guard_set_error(rg->handle, "unexpected answer to PING from %s", addr);
    return r->type == REDIS_REPLY_ERROR ? wxg__guard_refusal_code(r) : WXG_EREDIS;
}

/* Cluster mode: every primary must answer, since every one serves some messages. */
static int cluster_ping(wxg__guard_redis_t *rg)
{
    int rc = wxg__guard_conn_ensure(rg);
    if (rc == 0) {
        const char *argv[] = {"PING"};
        size_t lens[] = {4};
        char why[512] = "";
        rc = wxg__rcluster_each_primary(rg->cluster, 1, argv, lens, pong, rg, why, sizeof why);
        if (rc && why[0])
            wxg__guard_set_error(rg->handle, "%s", why);
        if (rc == 0)
            rg->stats->round_trips++;
    }
    if (rc)
        wxg__guard_count_error(rg->stats, rc);
    return rc;
}

int wxg__guard_admin_ping(wxg_guard_t *g)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    if (rg->cluster_nodes)
        return cluster_ping(rg);
    const char *argv[] = {"PING"};
    size_t lens[] = {4};
    redisReply *r = NULL;
    int rc = admin_cmd(rg, 1, argv, lens, &r);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_STATUS || r->len != 4 || memcmp(r->str, "PONG", 4) != 0) {
        wxg__guard_set_error(g, "unexpected answer to PING");
        rc = WXG_EREDIS;
        wxg__guard_count_error(rg->stats, rc);
    }
    freeReplyObject(r);
    return rc;
}

/* Calls fn for every record of one peek reply element {now, fields, pttl}; a record gone since
 * SCAN saw it (no fields) is skipped. */
static int scan_report(const redisReply *e, const redisReply *name, wxg_guard_scan_fn fn, void *arg)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_ARRAY ||
        e->element[2]->type != REDIS_REPLY_INTEGER)
        return WXG_EREDIS;
    if (e->element[1]->elements == 0)
        return 0;
    wxg_guard_record_t *rec = calloc(1, sizeof *rec);
    if (!rec)
        return WXG_ENOMEM;
    char st = 0;
    int rc = parse_record_fields(rec, e->element[1], e->element[0]->integer, &st);
    if (rc == 0) {
        rec->record_key = str_dup_reply(name);
        if (!rec->record_key)
            rc = WXG_ENOMEM;
    }
    if (rc == 0) {
        rec->record_ttl_ms = e->element[2]->integer;
        rec->state = record_state(st);
        rc = fn(rec, arg);
    }
    wxg_guard_record_free(rec);
    return rc;
}

/* In cluster mode the walk goes through the primaries one after the other (in the order of the
 * slots they serve); the cursor carries the primary's index in its top 16 bits and that
 * primary's SCAN cursor in the rest. A map that changes during the walk (resharding, a
 * failover) may make it miss or repeat records, as SCAN may anyway. */
#define SCAN_NODE_SHIFT  48
#define SCAN_CURSOR_MASK ((UINT64_C(1) << SCAN_NODE_SHIFT) - 1)

/* Sends SCAN to the primary the cursor names. */
static int cluster_scan_cmd(wxg__guard_redis_t *rg, uint64_t cursor, const char **argv,
                            const size_t *lens, redisReply **page)
{
    int rc = wxg__guard_conn_ensure(rg);
    if (rc == 0) {
        int node = (int)(cursor >> SCAN_NODE_SHIFT);
        if (node >= wxg__rcluster_primaries(rg->cluster)) {
            wxg__guard_set_error(rg->handle,
                                 "scan cursor names primary %d, but the cluster has %d now", node,
                                 wxg__rcluster_primaries(rg->cluster));
            return WXG_EINVAL;
        }
        rc = wxg__rcluster_on_primary(rg->cluster, node, 6, argv, lens, page, rg->last_error,
                                      rg->last_error_size);
    }
    if (rc == 0 && (*page)->type == REDIS_REPLY_ERROR) {
        rc = wxg__guard_refusal_code(*page);
        wxg__guard_set_error(rg->handle, "Redis refused SCAN: %.*s",
                             (int)((*page)->len > 200 ? 200 : (*page)->len), (*page)->str);
        freeReplyObject(*page);
        *page = NULL;
    }
    if (rc)
        wxg__guard_count_error(rg->stats, rc);
    else
        rg->stats->round_trips++;
    return rc;
}

/* The cluster cursor after a page of primary `node` whose own next cursor is v. */
static int cluster_next(wxg__guard_redis_t *rg, uint64_t cursor, uint64_t v, uint64_t *next)
{
    uint64_t node = cursor >> SCAN_NODE_SHIFT;
    if (v > SCAN_CURSOR_MASK) {
        wxg__guard_set_error(rg->handle, "SCAN cursor too large to walk a cluster");
        return WXG_EREDIS;
    }
    if (v != 0)
        *next = (node << SCAN_NODE_SHIFT) | v;
    else if ((int)node + 1 < wxg__rcluster_primaries(rg->cluster))
        *next = (node + 1) << SCAN_NODE_SHIFT;
    else
        *next = 0;
    return 0;
}

/* Reads one SCAN page of record names from *cursor: *page is the reply, *next the cursor. */
static int scan_page(wxg__guard_redis_t *rg, uint64_t cursor, int count, redisReply **page,
                     uint64_t *next)
{
    char cur[24], cnt[16], match[WXG__KEY_MAX];
    snprintf(cur, sizeof cur, "%llu",
             (unsigned long long)(rg->cluster_nodes ? cursor & SCAN_CURSOR_MASK : cursor));
    snprintf(cnt, sizeof cnt, "%d", count > 0 ? count : 100);
    /* The prefix holds no glob characters (checked at creation), and record names are the only
     * names with ":r:" after the shard tag. */
    snprintf(match, sizeof match, "%s{s*}:r:*", rg->prefix);
    const char *argv[] = {"SCAN", cur, "MATCH", match, "COUNT", cnt};
    size_t lens[6];
    for (int i = 0; i < 6; i++)
        lens[i] = strlen(argv[i]);
    int rc = rg->cluster_nodes ? cluster_scan_cmd(rg, cursor, argv, lens, page)
                               : admin_cmd(rg, 6, argv, lens, page);
    if (rc)
        return rc;
    const redisReply *p = *page;
    if (p->type != REDIS_REPLY_ARRAY || p->elements != 2 ||
        p->element[0]->type != REDIS_REPLY_STRING || p->element[1]->type != REDIS_REPLY_ARRAY) {
        wxg__guard_set_error(rg->handle, "unexpected SCAN reply");
        return WXG_EREDIS;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(p->element[0]->str, &end, 10);
    if (errno || !end || *end)
        return WXG_EREDIS;
    if (rg->cluster_nodes)
        return cluster_next(rg, cursor, v, next);
    *next = v;
    return 0;
}

/* Makes the peek batch's items from the names SCAN returned: each name as it is, with its
 * shard (the hex number of its {s<shard>} tag) for cluster mode's grouping. */
static int scan_items(wxg__guard_redis_t *rg, wxg__guard_batch_t *b, const redisReply *names)
{
    size_t plen = strlen(rg->prefix);
    for (size_t i = 0; i < names->elements; i++) {
        const redisReply *nm = names->element[i];
        wxg__guard_item_t *it = &b->items[i];
        if (nm->type != REDIS_REPLY_STRING || nm->len >= sizeof it->k.record) {
            wxg__guard_set_error(rg->handle, "unexpected SCAN reply");
            return WXG_EREDIS;
        }
        memcpy(it->k.record, nm->str, nm->len);
        it->k.record[nm->len] = '\0';
        it->k.record_len = nm->len;
        /* Its sub-marker hash: the same name with ':p:' for ':r:' (lib/guard/guard_layout.c). */
        memcpy(it->k.plugins, it->k.record, nm->len + 1);
        it->k.plugins_len = nm->len;
        char *r = strstr(it->k.plugins + plen, "}:r:");
        if (r)
            r[2] = 'p';
        if (nm->len > plen + 2 && memcmp(nm->str + plen, "{s", 2) == 0)
            it->k.shard = (unsigned)strtoul(it->k.record + plen + 2, NULL, 16);
    }
    return 0;
}

/* Reads the records named in one SCAN page and reports each to fn. The records are strings
 * whose format only the scripts know: the peek script reads them, chunked (and in cluster mode
 * grouped by shard) like any batch, in one round trip. */
static int scan_records(wxg__guard_redis_t *rg, const redisReply *names, wxg_guard_scan_fn fn,
                        void *arg)
{
    wxg__guard_batch_t b;
    int rc = wxg__guard_batch_init(&b, WXG__S_PEEK, names->elements, 0);
    if (rc)
        return rc;
    rc = scan_items(rg, &b, names);
    if (rc == 0)
        rc = wxg__guard_batch_build(rg, &b);
    if (rc == 0)
        rc = wxg__guard_batch_run(rg, &b, 0, 1);
    for (size_t c = 0; c < b.nchunks && rc == 0; c++) {
        for (size_t j = 0; j < b.chunks[c].count && rc == 0; j++) {
            size_t idx = b.order[b.chunks[c].first + j];
            rc = scan_report(wxg__guard_batch_elem(&b, c, j), names->element[idx], fn, arg);
            if (rc == WXG_EREDIS)
                wxg__guard_set_error(rg->handle, "unexpected peek reply");
        }
    }
    wxg__guard_batch_free(&b);
    return rc;
}

int wxg__guard_admin_scan(wxg_guard_t *g, uint64_t *cursor, int count, wxg_guard_scan_fn fn,
                          void *arg)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    redisReply *page = NULL;
    uint64_t next = 0;
    int rc = scan_page(rg, *cursor, count, &page, &next);
    if (rc == 0 && page->element[1]->elements > 0)
        rc = scan_records(rg, page->element[1], fn, arg);
    if (rc == 0)
        *cursor = next;
    if (page)
        freeReplyObject(page);
    return rc;
}

int wxg__guard_admin_describe_layout(const wxg_guard_t *g, char *buf, size_t size)
{
    const wxg__guard_redis_t *rg = wxg__guard_impl(g);
    return wxg__guard_geom_describe(&rg->geom, buf, size);
}
