/*
 * DESIGN: the history checker of histcheck.h. Recording appends to one array under a lock;
 * checking groups the ops by message, each group sorted by invocation, and runs the five rules
 * on each group, with the restarts that lost data and the quiet markers as global events. The
 * pair rules (1 and 2) look back only as far as a lease (with its renewals) or a retention can
 * reach, so a history of hours is checked in seconds. Allocation failures while checking are
 * reported as a violation of no rule (the return value is then -1).
 */
#include "histcheck.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct hc_hist {
    pthread_mutex_t mu;
    hc_op_t *op;
    size_t n, cap;
};

hc_hist_t *hc_new(void)
{
    hc_hist_t *h = calloc(1, sizeof *h);
    if (h)
        pthread_mutex_init(&h->mu, NULL);
    return h;
}

void hc_free(hc_hist_t *h)
{
    if (!h)
        return;
    pthread_mutex_destroy(&h->mu);
    free(h->op);
    free(h);
}

long hc_add(hc_hist_t *h, const hc_op_t *op)
{
    long i = -1;
    pthread_mutex_lock(&h->mu);
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 1024;
        hc_op_t *o = realloc(h->op, cap * sizeof *o);
        if (!o)
            goto out;
        h->op = o;
        h->cap = cap;
    }
    h->op[h->n] = *op;
    i = (long)h->n++;
out:
    pthread_mutex_unlock(&h->mu);
    return i;
}

size_t hc_len(const hc_hist_t *h)
{
    return h->n;
}

const hc_op_t *hc_get(const hc_hist_t *h, size_t i)
{
    return i < h->n ? &h->op[i] : NULL;
}

const char *hc_kind_name(hc_kind_t k)
{
    static const char *names[] = {"?",    "claim",   "renew", "effect",  "complete",
                                  "fail", "release", "purge", "restart", "quiet"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

const char *hc_result_name(hc_result_t r)
{
    static const char *names[] = {"?",    "ERROR", "CLAIMED",    "DUPLICATE",
                                  "BUSY", "OK",    "LEASE_LOST", "ALREADY_DONE",
                                  "DONE", "NOOP",  "KEPT",       "LOST"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "?";
}

void hc_dump(const hc_hist_t *h, FILE *out)
{
    for (size_t i = 0; i < h->n; i++) {
        const hc_op_t *o = &h->op[i];
        fprintf(out, "%zu h%d k%d %s %s inv %lld comp %lld fence %llu ticket %ld lease %lld%s\n", i,
                o->handle, o->key, hc_kind_name(o->kind), hc_result_name(o->result),
                (long long)o->inv_us, (long long)o->comp_us, (unsigned long long)o->fence,
                o->ticket, (long long)o->lease_end_us, o->probe ? " probe" : "");
    }
}

/* ---- checking ---- */

typedef struct chk {
    const hc_hist_t *h;
    const hc_conf_t *conf;
    FILE *out;
    hc_counts_t c;
    long *lost; /* indices of HC_RESTART ops that lost the data */
    size_t nlost;
    long *quiet; /* the HC_QUIET ops, by invocation */
    size_t nquiet;
    long *next; /* next op of the same ticket (chain from head[ticket]), -1 at the end */
    long *head;
} chk;

static const hc_op_t *OP(const chk *k, long i)
{
    return &k->h->op[i];
}

/* Whether a restart that lost the data may have fallen between t1 and t2 (server µs). */
static int lost_between(const chk *k, int64_t t1, int64_t t2)
{
    for (size_t i = 0; i < k->nlost; i++) {
        const hc_op_t *r = OP(k, k->lost[i]);
        if (r->comp_us > t1 && r->inv_us < t2)
            return 1;
    }
    return 0;
}

static const hc_op_t *sort_base;
static int by_key_inv(const void *a, const void *b)
{
    const hc_op_t *x = &sort_base[*(const long *)a], *y = &sort_base[*(const long *)b];
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->inv_us != y->inv_us)
        return x->inv_us < y->inv_us ? -1 : 1;
    return *(const long *)a < *(const long *)b ? -1 : 1;
}

static int by_inv(const void *a, const void *b)
{
    const hc_op_t *x = &sort_base[*(const long *)a], *y = &sort_base[*(const long *)b];
    if (x->inv_us != y->inv_us)
        return x->inv_us < y->inv_us ? -1 : 1;
    return *(const long *)a < *(const long *)b ? -1 : 1;
}

static void print_op(const chk *k, long i, const long *mark, int nmark)
{
    const hc_op_t *o = OP(k, i);
    const char *m = "  ";
    for (int j = 0; j < nmark; j++)
        if (mark[j] == i)
            m = "=>";
    fprintf(k->out, "  %s #%ld h%d %-8s %-12s inv %lld.%06lld comp +%lldus", m, i, o->handle,
            hc_kind_name(o->kind), hc_result_name(o->result), (long long)(o->inv_us / 1000000),
            (long long)(o->inv_us % 1000000), (long long)(o->comp_us - o->inv_us));
    if (o->fence)
        fprintf(k->out, " fence %llu", (unsigned long long)o->fence);
    if (o->ticket >= 0 && o->ticket != i)
        fprintf(k->out, " ticket #%ld", o->ticket);
    if (o->lease_end_us)
        fprintf(k->out, " lease>=%lld.%06lld", (long long)(o->lease_end_us / 1000000),
                (long long)(o->lease_end_us % 1000000));
    if (o->probe)
        fprintf(k->out, " probe");
    fputc('\n', k->out);
}

enum { PRINT_MAX = 80 };

/* The violation's header and the minimal history: the ops of message `key` (sorted[0..n)) and
 * the global events invoked in [from, to], the last PRINT_MAX of them. */
static void report(chk *k, int rule, int key, const long *sorted, size_t n, int64_t from,
                   int64_t to, const long *mark, int nmark, const char *what)
{
    k->c.violations[rule]++;
    if (!k->out)
        return;
    fprintf(k->out, "VIOLATION rule %d, message %d (seed %llu): %s\n", rule, key,
            (unsigned long long)k->conf->seed, what);
    long *w = malloc((n + k->h->n) * sizeof *w);
    size_t m = 0;
    if (!w)
        return;
    size_t quiet = 0;
    for (size_t i = 0; i < n; i++) {
        const hc_op_t *o = OP(k, sorted[i]);
        if (o->comp_us < from || o->inv_us > to)
            continue;
        int marked = 0;
        for (int j = 0; j < nmark; j++)
            marked |= mark[j] == sorted[i];
        /* Answers that changed nothing on the server are left out, unless they are part of
         * the violation: they only bury the ops that matter. */
        int inert = (o->kind == HC_CLAIM && !o->probe &&
                     (o->result == HC_R_DUPLICATE || o->result == HC_R_BUSY)) ||
                    ((o->kind == HC_PURGE || o->kind == HC_RELEASE) && o->result == HC_R_NOOP);
        if (inert && !marked) {
            quiet++;
            continue;
        }
        w[m++] = sorted[i];
    }
    for (size_t i = 0; i < k->h->n; i++) {
        const hc_op_t *o = &k->h->op[i];
        if (o->key < 0 && o->comp_us >= from && o->inv_us <= to)
            w[m++] = (long)i;
    }
    sort_base = k->h->op;
    qsort(w, m, sizeof *w, by_inv);
    size_t skip = m > PRINT_MAX ? m - PRINT_MAX : 0;
    fprintf(k->out,
            "  minimal history (ops of message %d only; %zu DUPLICATE/BUSY claims and no-op "
            "admin calls left out%s):\n",
            key, quiet, skip ? ", and the earliest" : "");
    for (size_t i = skip; i < m; i++)
        print_op(k, w[i], mark, nmark);
    free(w);
}

/* The earliest end of claim A's lease as known before time `before`: its own and every renewal
 * that returned OK before then. */
static int64_t lease_min_end(const chk *k, long a, int64_t before)
{
    int64_t end = OP(k, a)->lease_end_us;
    for (long j = k->head[a]; j >= 0; j = k->next[j]) {
        const hc_op_t *r = OP(k, j);
        if (r->kind == HC_RENEW && r->result == HC_R_OK && r->comp_us < before &&
            r->lease_end_us > end)
            end = r->lease_end_us;
    }
    return end;
}

/* Whether something may have ended claim A before time `t`, given its earliest lease end. */
static int ended_before(const chk *k, long a, const long *sorted, size_t n, int64_t t,
                        int64_t endmin)
{
    const hc_op_t *A = OP(k, a);
    for (long j = k->head[a]; j >= 0; j = k->next[j]) {
        const hc_op_t *o = OP(k, j);
        if (o->inv_us >= t)
            continue;
        if (o->kind == HC_COMPLETE || o->kind == HC_FAIL)
            return 1;
        if (o->kind == HC_RENEW && o->result == HC_R_LEASE_LOST)
            return 1;
    }
    for (size_t i = 0; i < n; i++) {
        const hc_op_t *o = OP(k, sorted[i]);
        if (o->inv_us >= t || o->comp_us <= A->inv_us)
            continue;
        int maybe = o->result == HC_R_DONE || o->result == HC_R_ERROR;
        if (o->kind == HC_RELEASE && maybe)
            return 1;
        if (o->kind == HC_PURGE && maybe && o->comp_us + k->conf->slack_us >= endmin)
            return 1;
    }
    return 0;
}

static void rule1(chk *k, int key, const long *s, size_t n, int64_t span)
{
    for (size_t bi = 0; bi < n; bi++) {
        const hc_op_t *B = OP(k, s[bi]);
        if (B->kind != HC_CLAIM || B->result != HC_R_CLAIMED)
            continue;
        for (size_t ai = bi; ai-- > 0;) {
            const hc_op_t *A = OP(k, s[ai]);
            if (A->inv_us < B->inv_us - span)
                break;
            if (A->kind != HC_CLAIM || A->result != HC_R_CLAIMED || A->comp_us >= B->inv_us)
                continue;
            int64_t endmin = lease_min_end(k, s[ai], B->inv_us);
            if (B->comp_us + k->conf->slack_us >= endmin)
                continue;
            if (ended_before(k, s[ai], s, n, B->comp_us, endmin))
                continue;
            if (lost_between(k, A->inv_us, B->comp_us)) {
                k->c.excused[1]++;
                continue;
            }
            long mark[2] = {s[ai], s[bi]};
            char what[200];
            snprintf(what, sizeof what,
                     "two live owners: #%ld CLAIMED while #%ld's lease (to at least %lld us "
                     "later) was live and not ended",
                     s[bi], s[ai], (long long)(endmin - B->comp_us));
            report(k, 1, key, s, n, A->inv_us - k->conf->lease_us, B->comp_us, mark, 2, what);
            break;
        }
    }
}

static void rule2(chk *k, int key, const long *s, size_t n)
{
    int64_t ret = k->conf->retention_us, slack = k->conf->slack_us;
    for (size_t ci = 0; ci < n; ci++) {
        const hc_op_t *C = OP(k, s[ci]);
        if (C->kind != HC_CLAIM || C->result != HC_R_CLAIMED)
            continue;
        for (size_t di = ci; di-- > 0;) {
            const hc_op_t *D = OP(k, s[di]);
            if (D->inv_us < C->comp_us - ret - slack)
                break;
            if (D->kind != HC_COMPLETE || D->comp_us >= C->inv_us)
                continue;
            int64_t anchor;
            if (D->result == HC_R_OK)
                anchor = D->inv_us;
            else if (D->result == HC_R_ALREADY_DONE && D->ticket >= 0)
                anchor = OP(k, D->ticket)->inv_us;
            else
                continue;
            if (C->comp_us + slack >= anchor + ret)
                continue;
            if (lost_between(k, anchor, C->comp_us)) {
                k->c.excused[2]++;
                continue;
            }
            long mark[2] = {s[di], s[ci]};
            char what[200];
            snprintf(what, sizeof what,
                     "DONE claimed again: #%ld CLAIMED %lld us after complete #%ld answered %s, "
                     "within the retention",
                     s[ci], (long long)(C->comp_us - anchor), s[di], hc_result_name(D->result));
            report(k, 2, key, s, n, anchor - k->conf->lease_us, C->comp_us, mark, 2, what);
            break;
        }
    }
}

static void rule3(chk *k, int key, const long *s, size_t n)
{
    for (size_t ei = 0; ei < n; ei++) {
        const hc_op_t *E = OP(k, s[ei]);
        if (E->kind != HC_EFFECT || E->ticket < 0)
            continue;
        const hc_op_t *T = OP(k, E->ticket);
        for (size_t i = 0; i < n; i++) {
            const hc_op_t *o = OP(k, s[i]);
            if (o->inv_us >= T->inv_us)
                break;
            int fenced = (o->kind == HC_CLAIM && o->result == HC_R_CLAIMED) || o->kind == HC_EFFECT;
            if (!fenced || s[i] == E->ticket || o->comp_us >= T->inv_us || o->fence < E->fence)
                continue;
            long mark[3] = {s[i], E->ticket, s[ei]};
            char what[200];
            snprintf(what, sizeof what,
                     "fence out of order: effect #%ld ran with fence %llu, not above fence %llu "
                     "of #%ld, which came before its claim #%ld",
                     s[ei], (unsigned long long)E->fence, (unsigned long long)o->fence, s[i],
                     E->ticket);
            report(k, 3, key, s, n, o->inv_us, E->comp_us, mark, 3, what);
            break;
        }
    }
}

/* Rule 4 for the probe round after quiet marker q (up to the next marker, `until`). */
static void rule4_round(chk *k, int key, const long *s, size_t n, const hc_op_t *q, int64_t until)
{
    int64_t lease_end = q->inv_us, last = 0;
    int probes = 0, ok = 0;
    long mark[1] = {-1};
    for (size_t i = 0; i < n; i++) {
        const hc_op_t *o = OP(k, s[i]);
        if ((o->kind == HC_CLAIM || o->kind == HC_RENEW) && !o->probe && o->inv_us < q->inv_us &&
            o->comp_us + k->conf->lease_us > lease_end)
            lease_end = o->comp_us + k->conf->lease_us;
        if (o->kind != HC_CLAIM || !o->probe || o->inv_us < q->inv_us || o->inv_us >= until)
            continue;
        probes++;
        last = o->inv_us;
        mark[0] = s[i];
        ok |= o->result == HC_R_CLAIMED || o->result == HC_R_DUPLICATE;
    }
    if (ok)
        return;
    char what[240];
    if (probes == 0)
        snprintf(what, sizeof what, "never probed after the faults stopped");
    else if (last <= lease_end + k->conf->slack_us)
        snprintf(what, sizeof what,
                 "%d probes, none claimable, but the last came before every lease could end "
                 "(the test waited too little)",
                 probes);
    else
        snprintf(what, sizeof what,
                 "stuck: %d probes after the faults stopped and every lease ended (the last "
                 "%lld ms after), none answered CLAIMED or DUPLICATE",
                 probes, (long long)((last - lease_end) / 1000));
    report(k, 4, key, s, n, lease_end - 3 * k->conf->lease_us, last ? last : q->inv_us, mark, 1,
           what);
}

/* Each probe round checks the messages that had ops in the epoch before it (after the round
 * before): a message met in no epoch since need not be probed again. */
static void rule4(chk *k, int key, const long *s, size_t n)
{
    for (size_t r = 0; r < k->nquiet; r++) {
        const hc_op_t *q = OP(k, k->quiet[r]);
        int64_t since = r > 0 ? OP(k, k->quiet[r - 1])->inv_us : INT64_MIN;
        int64_t until = r + 1 < k->nquiet ? OP(k, k->quiet[r + 1])->inv_us : INT64_MAX;
        int used = 0;
        for (size_t i = 0; i < n && !used; i++) {
            const hc_op_t *o = OP(k, s[i]);
            used = !o->probe && o->kind == HC_CLAIM && o->inv_us > since && o->inv_us < q->inv_us;
        }
        if (used)
            rule4_round(k, key, s, n, q, until);
    }
}

static void rule5(chk *k, int key, const long *s, size_t n)
{
    int64_t first_effect = INT64_MAX;
    for (size_t i = 0; i < n; i++) {
        const hc_op_t *o = OP(k, s[i]);
        if (o->kind == HC_EFFECT && o->comp_us < first_effect)
            first_effect = o->comp_us;
    }
    for (size_t i = 0; i < n; i++) {
        const hc_op_t *o = OP(k, s[i]);
        int done = (o->kind == HC_CLAIM && o->result == HC_R_DUPLICATE) ||
                   (o->kind == HC_COMPLETE && o->result == HC_R_ALREADY_DONE);
        if (!done || first_effect < o->comp_us)
            continue;
        long mark[1] = {s[i]};
        char what[160];
        snprintf(what, sizeof what, "#%ld answered %s, but no effect of the message had run", s[i],
                 hc_result_name(o->result));
        report(k, 5, key, s, n, o->inv_us - 2 * k->conf->lease_us, o->comp_us, mark, 1, what);
        break; /* every later one would say the same */
    }
}

int hc_check(const hc_hist_t *h, const hc_conf_t *conf, FILE *out, hc_counts_t *counts)
{
    chk k = {.h = h, .conf = conf, .out = out};
    int rc = -1;
    size_t n = h->n;
    long *order = malloc((n + 1) * sizeof *order);
    k.lost = malloc((n + 1) * sizeof *k.lost);
    k.next = malloc((n + 1) * sizeof *k.next);
    k.head = malloc((n + 1) * sizeof *k.head);
    k.quiet = malloc((n + 1) * sizeof *k.quiet);
    if (!order || !k.lost || !k.next || !k.head || !k.quiet)
        goto out;
    /* Ticket chains, global events, and the longest a claim's lease may be known to reach
     * beyond its invocation (its renewals), which bounds how far rule 1 looks back. */
    int64_t span = conf->lease_us;
    for (size_t i = 0; i < n; i++)
        k.head[i] = k.next[i] = -1;
    for (size_t i = n; i-- > 0;) {
        const hc_op_t *o = &h->op[i];
        if (o->ticket >= 0 && (size_t)o->ticket < n && (size_t)o->ticket != i) {
            k.next[i] = k.head[o->ticket];
            k.head[o->ticket] = (long)i;
            int64_t reach = o->lease_end_us - h->op[o->ticket].inv_us;
            if (o->kind == HC_RENEW && reach > span)
                span = reach;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const hc_op_t *o = &h->op[i];
        if (o->kind == HC_RESTART && o->result == HC_R_LOST)
            k.lost[k.nlost++] = (long)i;
        if (o->kind == HC_QUIET)
            k.quiet[k.nquiet++] = (long)i;
    }
    span += conf->slack_us;
    sort_base = h->op;
    qsort(k.quiet, k.nquiet, sizeof *k.quiet, by_inv);
    k.c.ops = (long)n;
    /* One message at a time: its ops sorted by invocation. */
    for (size_t i = 0; i < n; i++)
        order[i] = (long)i;
    sort_base = h->op;
    qsort(order, n, sizeof *order, by_key_inv);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        int key = h->op[order[i]].key;
        while (j < n && h->op[order[j]].key == key)
            j++;
        if (key >= 0) {
            k.c.keys++;
            rule1(&k, key, order + i, j - i, span);
            rule2(&k, key, order + i, j - i);
            rule3(&k, key, order + i, j - i);
            rule4(&k, key, order + i, j - i);
            rule5(&k, key, order + i, j - i);
        }
        i = j;
    }
    rc = 0;
    for (int r = 1; r <= 5; r++)
        rc += k.c.violations[r];
out:
    if (rc < 0 && out)
        fprintf(out, "histcheck: out of memory (seed %llu)\n", (unsigned long long)conf->seed);
    if (counts)
        *counts = k.c;
    free(order);
    free(k.lost);
    free(k.next);
    free(k.head);
    free(k.quiet);
    return rc;
}
