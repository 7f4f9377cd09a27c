/*
 * DESIGN: the native design of the guard -- the default.
 *
 * Purpose: the state machine of docs/guard.md §1 on layout v4 (lib/guard/guard_record.def) with the
 * common transitions as native Redis commands, pipelined per batch, because a native command
 * costs Redis about a third of the same work inside a script (docs/guard.md §9). Only the rare
 * paths go through the scripted transitions (lib/guard/guard_transitions.c): taking over an expired
 * lease, a FAILED or released message, a claim that met another state, a claim or complete near a
 * time-bucket boundary, renew and fail. docs/guard.md §4 argues, step by step, why each native step
 * is safe under concurrency; in short:
 *
 *   claim      HSETNX <newest bucket> <field> <fence><d>, PEXPIREAT that bucket, HGET <each
 *              older live bucket> <field>. The in-flight value is one integer: the fence (the
 *              estimated server time in µs) followed by three digits of the owner token
 *              (lib/guard/guard_record.def). HSETNX creates it atomically, so of two claims of one
 *              message exactly one creates it; the other reads it (HGET, a second round trip)
 *              and answers DUPLICATE for a DONE tag, BUSY while the value's lease is live, or
 *              goes to the script. A claim whose HSETNX won but found state in an older bucket
 *              goes to the script with its value, which the script keeps or takes back.
 *   complete   HINCRBY <the claim's bucket> <field> <tag - value>: exactly when the field still
 *              holds this claim's value the result is the tag, i.e. the DONE marker, written
 *              in one command with the owner checked by arithmetic. A field that became the
 *              pointer 'R' (a takeover, a failure, a release: the scripts never leave an
 *              in-flight value to another owner) makes HINCRBY fail and change nothing; the
 *              script then decides. Any other result means the field held something else (the
 *              marker of a retried complete, nothing, another claim's value after a purge or
 *              lost data): lib/guard/lua/repair.lua undoes the increment or writes the marker,
 *              only if the field still holds what the increment left, and answers
 *              ALREADY_DONE, LEASE_LOST or OK accordingly. Whatever an increment leaves reads
 *              as DONE (a spent value) until then, so a repair that never arrives leaves no
 *              message unclaimable (complete_repair). A WAIT that fell short still gets its
 *              repairs. As with the script, a lease that ran out without a takeover still
 *              completes: the field still holds this claim's value.
 *   plugin_done HGET <the claim's bucket> <field>, HSETNX <sub-marker hash> <plugin> <result>,
 *              PEXPIRE NX and GT: the first result of a plugin stays, the TTL of a FAILED
 *              message's hash is never shortened, and the HGET tells whether the message was
 *              still this claim's (else LEASE_LOST; the sub-marker written meanwhile only says
 *              that the plugin finished, which stays true, and expires with its hash).
 *
 * The bucket names come from the handle's estimate of the server's clock (a TIME sample per
 * connection, lib/guard/guard_conn.c), which is never behind the server's clock; a step closer than
 * WXG__CLOCK_MARGIN_MS to a bucket boundary goes to the script, which reads the server's clock.
 * A native fence is the estimate in µs, greater than any fence handed out earlier for a
 * message without state (docs/guard.md §3.4).
 *
 * Sub-marker hashes of natively completed messages are deleted after the DONE marker was
 * written, with the handle's next pipeline (never before the marker: a crash between the two
 * must not forget which plugins ran while the message is not yet DONE); a handle keeps which
 * messages it wrote sub-markers for.
 *
 * Threads: the handle's thread only; no locks. Failure modes: those of the connection; an
 * error reply (OOM, READONLY, NOPERM) fails the whole call with its code; an I/O failure
 * leaves the outcome unknown, as with every design: a claim retried finds its own in-flight
 * value BUSY until the lease ends, a complete retried finds the DONE marker.
 */
#include "guard_conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock_int.h"
#include "err_int.h"
#include "key_int.h"

/* Messages whose sub-marker hash this handle wrote natively and not yet deleted, and hashes
 * of completed messages waiting for the next pipeline. Bounded: a hash that falls out of
 * either simply expires with its TTL. */
#define WROTE_MAX   1024
#define PENDING_MAX 256

typedef struct native {
    unsigned char wrote[WROTE_MAX][16];
    unsigned wrote_n, wrote_next;
    char pending[PENDING_MAX][WXG__KEY_MAX];
    unsigned npending;
} native_t;

static native_t *native_of(wxg__guard_redis_t *rg)
{
    return rg->design_state;
}

/* ---------------------------------------------------------------------------------------------
 * Time buckets
 */

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* The newest time bucket at the estimated server time now_ms, or -1 when now_ms is within the
 * margin of a boundary (the step then goes to the script). */
static int64_t safe_bucket(const wxg__guard_redis_t *rg, int64_t now_ms)
{
    int64_t width = rg->geom.bucket_ms, tb = floor_div(now_ms, width);
    if (now_ms - tb * width < WXG__CLOCK_MARGIN_MS ||
        (tb + 1) * width - now_ms <= WXG__CLOCK_MARGIN_MS)
        return -1;
    return tb;
}

/* The selector bits of time bucket tb (stamped when `create` and missing: lib/guard/guard_geom.c).
 */
static int sel_of(wxg__guard_redis_t *rg, int64_t tb, int create, int *sel)
{
    return wxg__guard_sel(rg, tb, create, sel);
}

/* Fingerprint fp's bucket of time bucket tb, laid out with `sel` selector bits. */
static int bucket_name(const wxg__guard_redis_t *rg, const unsigned char fp[32], int sel,
                       int64_t tb, char *out)
{
    return wxg__guard_bucket_of(rg->prefix, &rg->geom, sel, fp, tb, out, WXG__KEY_MAX);
}

/* ---------------------------------------------------------------------------------------------
 * A pipeline of native commands, with the deferred deletions in front
 */

typedef struct npipe {
    wxg__guard_cmd_t *cmds;
    redisReply **replies;
    size_t n, cap, ndel;
    int notint_ok; /* complete's HINCRBY: "not an integer" (a pointer) and "would overflow"
                      are answers, not failures */
    int writes;    /* WAIT for conf.wait_replicas after it, when set */
    /* Per command up to 4 arguments, kept here so that the caller's strings may be stack ones
     * that live as long as the pipe. */
    const char *(*argv)[4];
    size_t (*lens)[4];
} npipe_t;

static int npipe_init(npipe_t *p, size_t cap)
{
    memset(p, 0, sizeof *p);
    p->cap = cap + PENDING_MAX + 1; /* the deferred deletions, and a WAIT */
    p->cmds = calloc(p->cap, sizeof *p->cmds);
    p->replies = calloc(p->cap, sizeof *p->replies);
    p->argv = calloc(p->cap, sizeof *p->argv);
    p->lens = calloc(p->cap, sizeof *p->lens);
    return p->cmds && p->replies && p->argv && p->lens ? 0 : WXG_ENOMEM;
}

static void npipe_free(npipe_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        if (p->replies[i])
            freeReplyObject(p->replies[i]);
    }
    free(p->cmds);
    free(p->replies);
    free(p->argv);
    free(p->lens);
}

/* Appends one command of argc (<= 4) arguments; returns its index. */
static size_t npipe_add(npipe_t *p, int argc, const char *a0, size_t l0, const char *a1, size_t l1,
                        const char *a2, size_t l2, const char *a3, size_t l3)
{
    size_t i = p->n++;
    const char *a[4] = {a0, a1, a2, a3};
    size_t l[4] = {l0, l1, l2, l3};
    for (int k = 0; k < 4; k++) {
        p->argv[i][k] = a[k];
        p->lens[i][k] = l[k];
    }
    p->cmds[i] = (wxg__guard_cmd_t){argc, p->argv[i], p->lens[i]};
    return i;
}

/* Puts the handle's deferred deletions of sub-marker hashes in front of the pipe. */
static void npipe_deletions(wxg__guard_redis_t *rg, npipe_t *p)
{
    native_t *nt = native_of(rg);
    for (unsigned i = 0; i < nt->npending; i++)
        npipe_add(p, 2, "DEL", 3, nt->pending[i], strlen(nt->pending[i]), NULL, 0, NULL, 0);
    p->ndel = p->n;
}

/* HINCRBY's answer for a field that holds no integer (here: the pointer 'R'). */
static int not_integer(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR && strstr(r->str, "not an integer") != NULL;
}

/* HINCRBY's answer when the sum leaves 64 bits; the field is unchanged. */
static int would_overflow(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR && strstr(r->str, "would overflow") != NULL;
}

/* Sends the pipe. An error reply to any command fails the call with its code; the deferred
 * deletions it carried are done once their replies arrived. WXG_EREPLICAS (the WAIT after the
 * writes fell short) leaves every reply in place: the commands ran on the primary. */
static int npipe_run(wxg__guard_redis_t *rg, npipe_t *p)
{
    size_t got = 0, waited = SIZE_MAX;
    char wn[16], wt[16];
    int extra = 0;
    if (p->writes && rg->conf.wait_replicas > 0) {
        snprintf(wn, sizeof wn, "%d", rg->conf.wait_replicas);
        snprintf(wt, sizeof wt, "%d", rg->conf.wait_timeout_ms);
        waited = npipe_add(p, 3, "WAIT", 4, wn, strlen(wn), wt, strlen(wt), NULL, 0);
        extra = rg->conf.wait_timeout_ms;
    }
    int rc = wxg__guard_conn_pipeline(rg, p->cmds, p->n, extra, p->replies, &got);
    if (got >= p->ndel)
        native_of(rg)->npending = 0;
    if (rc) {
        for (size_t i = got; i < p->n; i++)
            p->replies[i] = NULL;
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    for (size_t i = 0; i < p->n; i++) {
        const redisReply *r = p->replies[i];
        if (r->type == REDIS_REPLY_ERROR &&
            !(p->notint_ok && (not_integer(r) || would_overflow(r)))) {
            wxg__guard_set_error(rg->handle, "Redis refused %.*s: %.*s", (int)p->cmds[i].lens[0],
                                 p->cmds[i].argv[0], (int)(r->len > 200 ? 200 : r->len), r->str);
            rc = wxg__guard_refusal_code(r);
            wxg__guard_conn_note_refusal(rg, r);
            wxg__guard_count_error(rg->stats, rc);
            return rc;
        }
    }
    if (waited != SIZE_MAX) {
        long long acks =
            p->replies[waited]->type == REDIS_REPLY_INTEGER ? p->replies[waited]->integer : -1;
        if (acks < rg->conf.wait_replicas) {
            wxg__guard_set_error(rg->handle, "WAIT: %lld of %d replicas acknowledged within %d ms",
                                 acks, rg->conf.wait_replicas, rg->conf.wait_timeout_ms);
            wxg__guard_count_error(rg->stats, WXG_EREPLICAS);
            return WXG_EREPLICAS;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * claim
 */

/* What a native claim keeps per message. */
typedef struct nclaim {
    wxg__guard_keys_t k;
    unsigned char fp[32];
    char owner[WXG_GUARD_OWNER_LEN + 1];
    char value[24];
    char tag[8];
    char cur[WXG__KEY_MAX];
    size_t hsetnx; /* its HSETNX's index in the pipe */
    size_t hget;   /* round 2: its HGET's index */
    int state;     /* what it needs next, below */
} nclaim_t;

enum { NC_CLAIMED, NC_READ, NC_SCRIPT, NC_SCRIPT_MINE, NC_DONE };

/* The owner token's digits in an in-flight value (lib/guard/lua/_record.lua's owner_digits). */
static int owner_digits(const char *owner)
{
    char h[4] = {owner[0], owner[1], owner[2], '\0'};
    return (int)(strtol(h, NULL, 16) % 1000);
}

/* The in-flight value of a native claim: the fence, then the owner's digits. */
static int64_t inflight_of(uint64_t fence, const char *owner)
{
    return (int64_t)fence * 1000 + owner_digits(owner);
}

static void inflight_value(nclaim_t *c, uint64_t fence)
{
    snprintf(c->value, sizeof c->value, "%lld", (long long)inflight_of(fence, c->owner));
}

/* Whether a field's value is an in-flight value, and its lease's end (server ms): its fence. */
static int inflight_lease(const redisReply *r, int64_t *until)
{
    if (r->len < WXG__REC_FENCE_MIN_DIGITS + WXG__REC_OWNER_DIGITS || r->len > 19)
        return 0;
    for (size_t i = 0; i < r->len; i++) {
        if (r->str[i] < '0' || r->str[i] > '9')
            return 0;
    }
    long long v = strtoll(r->str, NULL, 10);
    *until = v / 1000 / 1000;
    return 1;
}

/* Whether reply r has an in-flight value's shape (its digits, its length). */
static int inflight_len(const redisReply *r)
{
    int64_t until;
    return inflight_lease(r, &until);
}

/* Whether a field's value is a DONE marker: a payload tag, a small integer. */
static int is_marker(const char *s, size_t len)
{
    if (len == 0 || len > 6)
        return 0;
    for (size_t i = s[0] == '-' ? 1 : 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
    }
    return 1;
}

/* A spent value: an integer that is neither a marker nor an in-flight value, which only a
 * complete's increments leave (lib/guard/guard_record.def). The message was completed; its
 * payload tag is unknown. Called after inflight_lease() said no. */
static int is_spent(const char *s, size_t len)
{
    if (len <= 6)
        return 0;
    for (size_t i = s[0] == '-' ? 1 : 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
    }
    return 1;
}

/* Round 1: HSETNX the in-flight value into the newest bucket, set its expiry, read the older
 * buckets. */
static int claim_round1(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                        const unsigned char (*fps)[32], nclaim_t *c, int64_t tb, int64_t now_ms,
                        uint64_t fence, npipe_t *p, char *names, int nold, char *expire_at)
{
    char owner[WXG_GUARD_OWNER_LEN + 1];
    int sel = 0;
    /* The selector bits of each older live time bucket (as many as the window holds: up to
     * retention / width + 1, plus the clock margin's worth when the width is tiny). */
    int *old = calloc(nold > 0 ? (size_t)nold : 1, sizeof *old);
    int rc = old ? wxg__guard_inflight_owner(fence, owner) : WXG_ENOMEM;
    if (rc == 0)
        rc = sel_of(rg, tb, 1, &sel);
    for (int j = 0; j < nold && rc == 0; j++)
        rc = sel_of(rg, tb - 1 - j, 0, &old[j]);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (fps)
            memcpy(c[i].fp, fps[i], 32);
        else
            rc = wxg__guard_fingerprint(msgs[i].key, msgs[i].key_len, c[i].fp);
        if (rc == 0)
            rc = wxg__guard_keys_build(rg->prefix, &rg->geom, c[i].fp, &c[i].k);
        if (rc)
            break;
        memcpy(c[i].owner, owner, sizeof owner);
        inflight_value(&c[i], fence);
        snprintf(c[i].tag, sizeof c[i].tag, "%d", wxg__guard_payload_tag(msgs[i].payload_hash));
        rc = bucket_name(rg, c[i].fp, sel, tb, c[i].cur);
        if (rc)
            break;
        size_t cl = strlen(c[i].cur);
        c[i].hsetnx = npipe_add(p, 4, "HSETNX", 6, c[i].cur, cl, (const char *)c[i].k.field,
                                c[i].k.field_len, c[i].value, strlen(c[i].value));
        npipe_add(p, 3, "PEXPIREAT", 9, c[i].cur, cl, expire_at, strlen(expire_at), NULL, 0);
        for (int j = 0; j < nold && rc == 0; j++) {
            char *nm = names + (i * (size_t)nold + (size_t)j) * WXG__KEY_MAX;
            rc = bucket_name(rg, c[i].fp, old[j], tb - 1 - j, nm);
            if (rc == 0)
                npipe_add(p, 3, "HGET", 4, nm, strlen(nm), (const char *)c[i].k.field,
                          c[i].k.field_len, NULL, 0);
        }
    }
    free(old);
    return rc;
}

/* A claim found the message DONE (a marker or a spent value in reply r): DUPLICATE. */
static void claim_duplicate(wxg__guard_redis_t *rg, nclaim_t *c, const redisReply *r,
                            wxg_guard_claim_t *out)
{
    out->outcome = WXG_GUARD_DUPLICATE;
    out->payload_mismatch = is_marker(r->str, r->len) &&
                            (r->len != strlen(c->tag) || memcmp(r->str, c->tag, r->len) != 0);
    rg->stats->duplicates++;
    rg->stats->payload_mismatches += (uint64_t)out->payload_mismatch;
    c->state = NC_DONE;
}

/* Whether reply r holds a DONE marker or a spent value (DONE with an unknown tag). */
static int reply_done(const redisReply *r)
{
    return r->type == REDIS_REPLY_STRING &&
           (is_marker(r->str, r->len) || (!inflight_len(r) && is_spent(r->str, r->len)));
}

/* Sorts the round-1 answers: a won HSETNX with nothing older is CLAIMED; a won one with
 * something older goes to the script with its value; a lost one is DUPLICATE when an older
 * bucket holds the message DONE (a marker wins over whatever a newer bucket holds: an
 * in-flight value left there by a claim whose second round trip never came), else it reads the
 * value it lost to. */
static int claim_sort1(wxg__guard_redis_t *rg, npipe_t *p, nclaim_t *c, size_t n, int nold,
                       wxg_guard_claim_t *out)
{
    for (size_t i = 0; i < n; i++) {
        const redisReply *h = p->replies[c[i].hsetnx];
        if (h->type != REDIS_REPLY_INTEGER) {
            wxg__guard_set_error(rg->handle, "unexpected HSETNX reply");
            return WXG_EREDIS;
        }
        int older = 0;
        const redisReply *done = NULL;
        for (int j = 0; j < nold; j++) {
            const redisReply *o = p->replies[c[i].hsetnx + 2 + (size_t)j];
            older |= o->type != REDIS_REPLY_NIL;
            if (!done && reply_done(o))
                done = o;
        }
        c[i].state = h->integer == 0 ? NC_READ : older ? NC_SCRIPT_MINE : NC_CLAIMED;
        if (c[i].state == NC_READ && done)
            claim_duplicate(rg, &c[i], done, &out[i]);
    }
    return 0;
}

/* Round 2 for the claims that lost their HSETNX: what holds the field. */
static int claim_round2(wxg__guard_redis_t *rg, nclaim_t *c, size_t n, wxg_guard_claim_t *out,
                        const wxg_guard_msg_t *msgs, int64_t now_ms)
{
    npipe_t p;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += c[i].state == NC_READ;
    if (m == 0)
        return 0;
    int rc = npipe_init(&p, m);
    if (rc)
        goto out;
    npipe_deletions(rg, &p);
    for (size_t i = 0; i < n; i++) {
        if (c[i].state == NC_READ)
            c[i].hget = npipe_add(&p, 3, "HGET", 4, c[i].cur, strlen(c[i].cur),
                                  (const char *)c[i].k.field, c[i].k.field_len, NULL, 0);
    }
    rc = npipe_run(rg, &p);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (c[i].state != NC_READ)
            continue;
        const redisReply *r = p.replies[c[i].hget];
        c[i].state = NC_SCRIPT;
        if (r->type != REDIS_REPLY_STRING || r->len == 0)
            continue;
        int64_t until = 0;
        if (inflight_lease(r, &until)) {
            if (until > now_ms) {
                /* now_ms is never behind the server's clock: the lease is live. */
                out[i].outcome = WXG_GUARD_BUSY;
                out[i].lease_ms_left = until - now_ms;
                rg->stats->busy++;
                c[i].state = NC_DONE;
            }
        } else if (is_marker(r->str, r->len) || is_spent(r->str, r->len)) {
            claim_duplicate(rg, &c[i], r, &out[i]);
        }
        (void)msgs;
    }
    npipe_free(&p);
out:
    return rc;
}

/* The claims the native steps could not decide, through the script (with the values they
 * already wrote, which the script keeps or takes back). */
static int claim_by_script(wxg__guard_redis_t *rg, nclaim_t *c, size_t n,
                           const wxg_guard_msg_t *msgs, wxg_guard_claim_t *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += c[i].state == NC_SCRIPT || c[i].state == NC_SCRIPT_MINE;
    if (m == 0)
        return 0;
    wxg_guard_msg_t *sub = malloc(m * sizeof *sub);
    wxg_guard_claim_t *subout = calloc(m, sizeof *subout);
    unsigned char(*fps)[32] = malloc(m * sizeof *fps);
    char(*owners)[WXG_GUARD_OWNER_LEN + 1] = malloc(m * sizeof *owners);
    const char **mine = malloc(m * sizeof *mine);
    size_t *idx = malloc(m * sizeof *idx);
    int rc = sub && subout && fps && owners && mine && idx ? 0 : WXG_ENOMEM;
    for (size_t i = 0, k = 0; i < n && rc == 0; i++) {
        if (c[i].state != NC_SCRIPT && c[i].state != NC_SCRIPT_MINE)
            continue;
        sub[k] = msgs[i];
        memcpy(fps[k], c[i].fp, 32);
        memcpy(owners[k], c[i].owner, sizeof owners[k]);
        mine[k] = c[i].state == NC_SCRIPT_MINE ? c[i].value : NULL;
        idx[k++] = i;
    }
    if (rc == 0)
        rc = wxg__guard_script_claim(rg, sub, m, subout, (const unsigned char(*)[32])fps,
                                     (const char(*)[WXG_GUARD_OWNER_LEN + 1]) owners, mine);
    for (size_t k = 0; k < m && rc == 0; k++)
        out[idx[k]] = subout[k]; /* takes over what the result owns */
    free(sub);
    free(subout);
    free(fps);
    free(owners);
    free(mine);
    free(idx);
    return rc;
}

/* The tickets of the claims the native steps decided. */
static void claim_tickets(wxg__guard_redis_t *rg, nclaim_t *c, size_t n,
                          const wxg_guard_msg_t *msgs, wxg_guard_claim_t *out, uint64_t fence,
                          int64_t tb)
{
    for (size_t i = 0; i < n; i++) {
        if (c[i].state != NC_CLAIMED)
            continue;
        wxg_guard_claim_t *o = &out[i];
        o->outcome = WXG_GUARD_CLAIMED;
        o->attempt = 1;
        o->ticket.key = msgs[i].key;
        o->ticket.key_len = msgs[i].key_len;
        o->ticket.fence = fence;
        memcpy(o->ticket.owner, c[i].owner, WXG_GUARD_OWNER_LEN + 1);
        memcpy(o->ticket.fingerprint, c[i].fp, 32);
        o->ticket.fingerprint_set = 1;
        o->ticket.native_bucket = tb + 1;
        rg->stats->claimed++;
    }
}

static int native_claim_redis(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                              wxg_guard_claim_t *out, const unsigned char (*fps)[32])
{
    int rc = wxg__guard_conn_ensure(rg);
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    int64_t now_us = wxg__guard_clock_us(rg), now_ms = now_us / 1000;
    int64_t mono0_us = wxg__mono_us();
    int64_t tb = safe_bucket(rg, now_ms);
    if (tb < 0)
        return wxg__guard_script_claim(rg, msgs, n, out, fps, NULL, NULL);
    int64_t width = rg->geom.bucket_ms;
    /* The older buckets that may hold a live marker, with the margin on the old side. */
    int nold = (int)(tb - floor_div(now_ms - WXG__CLOCK_MARGIN_MS - rg->geom.retention_ms, width));
    char expire_at[24];
    snprintf(expire_at, sizeof expire_at, "%lld",
             (long long)((tb + 1) * width + rg->geom.retention_ms));
    nclaim_t *c = calloc(n, sizeof *c);
    char *names = malloc(n * (size_t)(nold > 0 ? nold : 1) * WXG__KEY_MAX);
    npipe_t p;
    rc = c && names ? npipe_init(&p, n * (size_t)(2 + nold)) : WXG_ENOMEM;
    if (rc) {
        free(c);
        free(names);
        return rc;
    }
    npipe_deletions(rg, &p);
    p.writes = 1;
    /* The fence of a native claim is its lease's end (lib/guard/guard_record.def). */
    uint64_t fence = (uint64_t)(now_us + rg->conf.lease_ms * 1000);
    rc = claim_round1(rg, msgs, n, fps, c, tb, now_ms, fence, &p, names, nold, expire_at);
    if (rc == 0)
        rc = npipe_run(rg, &p);
    if (rc == 0)
        rc = claim_sort1(rg, &p, c, n, nold, out);
    if (rc == 0)
        rc = claim_round2(rg, c, n, out, msgs, now_ms);
    if (rc == 0)
        claim_tickets(rg, c, n, msgs, out, fence, tb);
    if (rc == 0)
        rc = claim_by_script(rg, c, n, msgs, out);
    /* The claim was sized for time bucket tb: it wrote there and probed only older ones. If its
     * commands may have run after tb ended (the estimate is never behind the server's clock, so
     * the server's time then was at most the estimate plus the time since), a claim made after
     * the boundary may have written into the new time bucket, having read tb as empty: both
     * would be CLAIMED. Such a result is not trusted: nothing is handed out, the call fails
     * retriably, and the values this claim wrote end with their leases (no effect ran under
     * them; a retry probes both time buckets). */
    if (rc == 0 && now_ms + (wxg__mono_us() - mono0_us) / 1000 >= (tb + 1) * width) {
        rc = WXG_ETIMEDOUT;
        rg->stats->late_claims++;
        wxg__guard_set_error(rg->handle,
                             "a claim reached Redis after the time bucket it was sized for had "
                             "ended (%lld ms after it was prepared); retry",
                             (long long)((wxg__mono_us() - mono0_us) / 1000));
        wxg__guard_count_error(rg->stats, rc);
    }
    if (rc) {
        for (size_t i = 0; i < n; i++)
            wxg_guard_claim_clear(&out[i]);
    }
    npipe_free(&p);
    free(names);
    free(c);
    return rc;
}

static int native_claim(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n,
                        wxg_guard_claim_t *out)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    if (rg->conf.done_cache)
        return wxg__guard_near_claim(rg, msgs, n, out, native_claim_redis);
    return native_claim_redis(rg, msgs, n, out, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Tickets
 */

/* Whether ticket t may take a native step now, when the newest time bucket is tb (-1: too
 * close to a boundary): its claim was native, in that bucket. Its lease need not be live: as
 * with a script, what decides is whether the field still holds its value (HINCRBY's arithmetic
 * for complete, the HGET beside a sub-marker), and a takeover replaced that value. */
static int ticket_native(const wxg_guard_ticket_t *t, int64_t tb)
{
    return tb >= 0 && t->native_bucket == tb + 1;
}

/* The names of ticket t's message into k (and its fingerprint into fp). */
static int ticket_keys(const wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t,
                       wxg__guard_keys_t *k, unsigned char fp[32])
{
    int rc = 0;
    if (t->fingerprint_set)
        memcpy(fp, t->fingerprint, 32);
    else
        rc = wxg__guard_fingerprint(t->key, t->key_len, fp);
    return rc ? rc : wxg__guard_keys_build(rg->prefix, &rg->geom, fp, k);
}

/* ---------------------------------------------------------------------------------------------
 * plugin_done
 */

/* Notes that this handle wrote the sub-marker hash of fingerprint fp. */
static void wrote_note(native_t *nt, const unsigned char fp[32])
{
    for (unsigned i = 0; i < nt->wrote_n; i++) {
        if (memcmp(nt->wrote[i], fp, 16) == 0)
            return;
    }
    unsigned slot = nt->wrote_n < WROTE_MAX ? nt->wrote_n++ : nt->wrote_next++ % WROTE_MAX;
    memcpy(nt->wrote[slot], fp, 16);
}

/* Whether this handle wrote fp's sub-marker hash; forgets it. */
static int wrote_take(native_t *nt, const unsigned char fp[32])
{
    for (unsigned i = 0; i < nt->wrote_n; i++) {
        if (memcmp(nt->wrote[i], fp, 16) == 0) {
            memcpy(nt->wrote[i], nt->wrote[--nt->wrote_n], 16);
            return 1;
        }
    }
    return 0;
}

/* What a native step keeps per ticket. */
typedef struct nstep {
    wxg__guard_keys_t k;
    unsigned char fp[32];
    char bucket[WXG__KEY_MAX];
    char arg[24];
    int64_t value; /* the claim's in-flight value */
    size_t at;     /* its first command's index in the pipe */
    /* complete: what its HINCRBY left ("" when it changed nothing) and found, for the repair */
    char left[24], before[24];
} nstep_t;

/* The sub-markers of the tickets that may take a native step (native[i] = 1); the others, and
 * those whose field turned out to point to their record (native[i] set to 0), are left to the
 * script. */
static int plugin_done_native(wxg__guard_redis_t *rg, const wxg_guard_plugin_done_t *items,
                              size_t n, int *results, char *native, nstep_t *st, int64_t tb)
{
    char ttl[24];
    snprintf(ttl, sizeof ttl, "%lld", (long long)rg->conf.inflight_ttl_ms);
    int sel = 0;
    npipe_t p;
    int rc = npipe_init(&p, 4 * n);
    if (rc)
        return rc;
    npipe_deletions(rg, &p);
    p.writes = 1;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!native[i])
            continue;
        const wxg_guard_ticket_t *t = items[i].ticket;
        rc = ticket_keys(rg, t, &st[i].k, st[i].fp);
        if (rc)
            break;
        rc = sel_of(rg, tb, 1, &sel);
        if (rc == 0)
            rc = bucket_name(rg, st[i].fp, sel, tb, st[i].bucket);
        if (rc)
            break;
        st[i].value = inflight_of(t->fence, t->owner);
        st[i].at = npipe_add(&p, 3, "HGET", 4, st[i].bucket, strlen(st[i].bucket),
                             (const char *)st[i].k.field, st[i].k.field_len, NULL, 0);
        const char *res = items[i].result_len ? items[i].result : "";
        npipe_add(&p, 4, "HSETNX", 6, st[i].k.plugins, st[i].k.plugins_len, items[i].plugin,
                  strlen(items[i].plugin), res, items[i].result_len);
        /* Set the TTL of a new hash (NX) and lengthen a shorter one (GT); never shorten the
         * one a FAILED message's hash was given. */
        npipe_add(&p, 4, "PEXPIRE", 7, st[i].k.plugins, st[i].k.plugins_len, ttl, strlen(ttl), "NX",
                  2);
        npipe_add(&p, 4, "PEXPIRE", 7, st[i].k.plugins, st[i].k.plugins_len, ttl, strlen(ttl), "GT",
                  2);
    }
    if (rc == 0)
        rc = npipe_run(rg, &p);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!native[i])
            continue;
        const redisReply *r = p.replies[st[i].at];
        char want[24];
        int wl = snprintf(want, sizeof want, "%lld", (long long)st[i].value);
        int mine = r->type == REDIS_REPLY_STRING && r->len == (size_t)wl &&
                   memcmp(r->str, want, (size_t)wl) == 0;
        if (!mine && r->type == REDIS_REPLY_STRING && r->len == 1 && r->str[0] == 'R') {
            /* The message's state moved to its record (a renewal, or a takeover): the script
             * checks the owner there. The sub-marker written meanwhile stays true. */
            native[i] = 0;
            continue;
        }
        results[i] = mine ? WXG_GUARD_OK : WXG_GUARD_LEASE_LOST;
        if (mine) {
            rg->stats->plugins_done++;
            wrote_note(native_of(rg), st[i].fp);
        } else {
            rg->stats->lease_lost++;
        }
    }
    npipe_free(&p);
    return rc;
}

/* Runs fn over the items not taken natively (native[i] == 0), as one batch, and puts their
 * results in place. */
typedef int (*script_items_fn)(wxg__guard_redis_t *rg, const void *items, size_t n, int *results);

static int rest_by_script(wxg__guard_redis_t *rg, const void *items, size_t size, size_t n,
                          int *results, const char *native, script_items_fn fn)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += !native[i];
    if (m == 0)
        return 0;
    char *sub = malloc(m * size);
    int *subres = malloc(m * sizeof *subres);
    size_t *idx = malloc(m * sizeof *idx);
    int rc = sub && subres && idx ? 0 : WXG_ENOMEM;
    for (size_t i = 0, k = 0; i < n && rc == 0; i++) {
        if (!native[i]) {
            memcpy(sub + k * size, (const char *)items + i * size, size);
            idx[k++] = i;
        }
    }
    if (rc == 0)
        rc = fn(rg, sub, m, subres);
    for (size_t k = 0; k < m && rc == 0; k++)
        results[idx[k]] = subres[k];
    free(sub);
    free(subres);
    free(idx);
    return rc;
}

static int script_plugin_done_items(wxg__guard_redis_t *rg, const void *items, size_t n,
                                    int *results)
{
    return wxg__guard_script_plugin_done(rg, items, n, results);
}

static int native_plugin_done(wxg_guard_t *g, const wxg_guard_plugin_done_t *items, size_t n,
                              int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    int rc = wxg__guard_conn_ensure(rg);
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    int64_t now_ms = wxg__guard_clock_us(rg) / 1000, tb = safe_bucket(rg, now_ms);
    char *native = calloc(n, 1);
    nstep_t *st = calloc(n, sizeof *st);
    rc = native && st ? 0 : WXG_ENOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        m += native[i] = (char)ticket_native(items[i].ticket, tb);
    if (rc == 0 && m > 0)
        rc = plugin_done_native(rg, items, n, results, native, st, tb);
    if (rc == 0)
        rc = rest_by_script(rg, items, sizeof *items, n, results, native, script_plugin_done_items);
    free(native);
    free(st);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * complete
 */

/* Queues the deletion of a completed message's sub-marker hash for the next pipeline. */
static void defer_deletion(wxg__guard_redis_t *rg, const wxg__guard_keys_t *k)
{
    native_t *nt = native_of(rg);
    if (nt->npending == PENDING_MAX)
        return; /* it expires with its TTL */
    memcpy(nt->pending[nt->npending++], k->plugins, k->plugins_len + 1);
}

/* What a native complete's HINCRBY found: done, a pointer (the script decides), or a field
 * that held something else and needs the second step, lib/guard/lua/repair.lua. */
enum { NC_OK, NC_POINTER, NC_REPAIR };

/* Why a repair is a script: the field held something other than this claim's value, so the
 * increment has to be undone (a marker, another claim's value), or the marker written (nothing,
 * a spent value), but only if nobody changed the field meanwhile. A complete whose answer never
 * came (a timeout, a lost connection) or whose WAIT fell short is retried by its caller, and
 * every attempt that reached Redis added delta = tag - value: on this claim's value that is the
 * marker and then marker + j * delta, on an empty field j * delta, all spent values; a stale
 * owner's increment on another claim's in-flight value (after a purge or lost data) leaves a
 * positive value shorter than an in-flight one, spent as well (lib/guard/guard_record.def).
 * Each of them reads as DONE to every claim, so that none of them can leave a message
 * unclaimable when the repair never arrives; the script writes the marker over them. */
/* The HINCRBY of each native ticket: tag - value onto the field. */
static int complete_round1(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                           const char *native, nstep_t *st, int *kind, int64_t tb)
{
    int sel = 0;
    npipe_t p;
    int rc = npipe_init(&p, n);
    if (rc)
        return rc;
    p.notint_ok = 1;
    p.writes = 1;
    npipe_deletions(rg, &p);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!native[i])
            continue;
        rc = ticket_keys(rg, &t[i], &st[i].k, st[i].fp);
        if (rc)
            break;
        rc = sel_of(rg, tb, 1, &sel);
        if (rc == 0)
            rc = bucket_name(rg, st[i].fp, sel, tb, st[i].bucket);
        if (rc)
            break;
        st[i].value = inflight_of(t[i].fence, t[i].owner);
        snprintf(st[i].arg, sizeof st[i].arg, "%lld", (long long)(t[i].payload_tag - st[i].value));
        st[i].at =
            npipe_add(&p, 4, "HINCRBY", 7, st[i].bucket, strlen(st[i].bucket),
                      (const char *)st[i].k.field, st[i].k.field_len, st[i].arg, strlen(st[i].arg));
    }
    if (rc == 0)
        rc = npipe_run(rg, &p);
    /* WAIT falling short leaves every answer: the increments ran and still need their repair,
     * reported with the call's WXG_EREPLICAS. */
    int answered = rc == 0 || rc == WXG_EREPLICAS;
    for (size_t i = 0; i < n && answered; i++) {
        if (!native[i])
            continue;
        const redisReply *r = p.replies[st[i].at];
        if (not_integer(r)) {
            kind[i] = NC_POINTER;
            continue;
        }
        kind[i] = NC_REPAIR;
        if (would_overflow(r))
            continue; /* nothing changed: left stays "" */
        if (r->type != REDIS_REPLY_INTEGER) {
            wxg__guard_set_error(rg->handle, "unexpected HINCRBY reply");
            rc = WXG_EREDIS;
            break;
        }
        long long delta = t[i].payload_tag - st[i].value, before = r->integer - delta;
        if (before == st[i].value) {
            kind[i] = NC_OK;
            continue;
        }
        snprintf(st[i].left, sizeof st[i].left, "%lld", r->integer);
        snprintf(st[i].before, sizeof st[i].before, "%lld", before);
    }
    npipe_free(&p);
    return rc;
}

/* The second step for the fields HINCRBY found holding something else, by script: results[]
 * of those tickets, counted there. */
static int complete_repair(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                           nstep_t *st, const int *kind, int64_t tb, int *results)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += kind[i] == NC_REPAIR;
    if (m == 0)
        return 0;
    wxg__guard_repair_t *r = calloc(m, sizeof *r);
    int *res = calloc(m, sizeof *res);
    int rc = r && res ? 0 : WXG_ENOMEM;
    for (size_t i = 0, j = 0; i < n && rc == 0; i++) {
        if (kind[i] != NC_REPAIR)
            continue;
        r[j].t = &t[i];
        snprintf(r[j].tb, sizeof r[j].tb, "%lld", (long long)tb);
        memcpy(r[j].left, st[i].left, sizeof r[j].left);
        memcpy(r[j].before, st[i].before, sizeof r[j].before);
        j++;
    }
    if (rc == 0)
        rc = wxg__guard_script_repair(rg, r, m, res);
    for (size_t i = 0, j = 0; i < n && rc == 0; i++) {
        if (kind[i] == NC_REPAIR)
            results[i] = res[j++];
    }
    free(r);
    free(res);
    return rc;
}

/* Completes natively the tickets that may (native[i] = 1), turning the ones whose field held
 * the pointer over to the script (native[i] = 0). */
static int complete_native(wxg__guard_redis_t *rg, const wxg_guard_ticket_t *t, size_t n,
                           int *results, char *native, int64_t tb)
{
    nstep_t *st = calloc(n, sizeof *st);
    int *kind = calloc(n, sizeof *kind);
    int rc = st && kind ? 0 : WXG_ENOMEM;
    if (rc == 0)
        rc = complete_round1(rg, t, n, native, st, kind, tb);
    if (rc == 0 || rc == WXG_EREPLICAS) {
        int repaired = complete_repair(rg, t, n, st, kind, tb, results);
        if (repaired != 0)
            rc = repaired;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!native[i])
            continue;
        if (kind[i] == NC_POINTER) {
            native[i] = 0;
            continue;
        }
        if (kind[i] == NC_OK) {
            results[i] = WXG_GUARD_OK;
            rg->stats->completed++;
        }
        if (results[i] == WXG_GUARD_OK && wrote_take(native_of(rg), st[i].fp))
            defer_deletion(rg, &st[i].k);
    }
    free(st);
    free(kind);
    return rc;
}

static int script_complete_items(wxg__guard_redis_t *rg, const void *items, size_t n, int *results)
{
    return wxg__guard_script_complete(rg, items, n, results, NULL);
}

static int native_complete(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    int rc = wxg__guard_conn_ensure(rg);
    if (rc) {
        wxg__guard_count_error(rg->stats, rc);
        return rc;
    }
    /* Taken before the call: the marker is written after this instant (server time), so an
     * expiry counted from here never outlasts it (wxg__guard_near_remember). */
    int64_t sent_ms = wxg__mono_ms();
    int64_t now_ms = wxg__guard_clock_us(rg) / 1000, tb = safe_bucket(rg, now_ms);
    char *native = calloc(n, 1);
    unsigned char(*fps)[32] = malloc(n * sizeof *fps);
    rc = native && fps ? 0 : WXG_ENOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (t[i].fingerprint_set)
            memcpy(fps[i], t[i].fingerprint, 32);
        else
            rc = wxg__guard_fingerprint(t[i].key, t[i].key_len, fps[i]);
        m += native[i] = (char)(t[i].payload_tag_set && ticket_native(&t[i], tb));
    }
    if (rc == 0 && m > 0)
        rc = complete_native(rg, t, n, results, native, tb);
    if (rc == 0)
        rc = rest_by_script(rg, t, sizeof *t, n, results, native, script_complete_items);
    if (rc == 0 && rg->conf.done_cache)
        wxg__guard_near_remember(rg, t, n, results, (const unsigned char(*)[32])fps, sent_ms);
    free(native);
    free(fps);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The rest through the scripts, and the operations table
 */

static int native_renew(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    return wxg__guard_script_renew(wxg__guard_impl(g), t, n, results);
}

static int native_fail(wxg_guard_t *g, const wxg_guard_failure_t *items, size_t n, int *results)
{
    return wxg__guard_script_fail(wxg__guard_impl(g), items, n, results);
}

/* Sends the deletions still deferred (best effort), then frees the handle's state. */
static void native_destroy(wxg_guard_t *g)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    native_t *nt = native_of(rg);
    if (nt && nt->npending > 0 && rg->conn) {
        npipe_t p;
        if (npipe_init(&p, 0) == 0) {
            npipe_deletions(rg, &p);
            npipe_run(rg, &p);
            npipe_free(&p);
        }
    }
    free(nt);
    rg->design_state = NULL;
    wxg__guard_redis_destroy(g);
}

static const wxg__guard_ops_t native_ops = {
    .name = "native",
    .claim_batch = native_claim,
    .renew_batch = native_renew,
    .plugin_done_batch = native_plugin_done,
    .complete_batch = native_complete,
    .fail_batch = native_fail,
    WXG__GUARD_REDIS_ADMIN_OPS,
    .destroy = native_destroy,
};

wxg_guard_t *wxg__guard_native_new(const wxg_guard_conf_t *conf, int *err, char *errstr,
                                   size_t errstr_size)
{
    native_t *nt = calloc(1, sizeof *nt);
    if (!nt) {
        wxg__errf(errstr, errstr_size, "out of memory");
        if (err)
            *err = WXG_ENOMEM;
        return NULL;
    }
    wxg_guard_t *g = wxg__guard_redis_new(conf, &native_ops, err, errstr, errstr_size);
    if (!g) {
        free(nt);
        return NULL;
    }
    ((wxg__guard_redis_t *)wxg__guard_impl(g))->design_state = nt;
    return g;
}
