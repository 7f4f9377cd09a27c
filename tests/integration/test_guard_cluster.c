/* The guard (public API; the native design, and the Lua one as test_guard_cluster_lua) against
 * a private Redis Cluster of 3 primaries with a replica each (conf.cluster_nodes), without slot
 * migrations:
 *   - claim, complete and duplicates of 3,000 keys in batches across many shards, with WAIT for
 *     one replica on every primary written to;
 *   - the guard's keys spread over the primaries: with guard.shards 1024 each holds between 25 %
 *     and 42 % of them;
 *   - the admin operations: the scan walks every primary and finds the FAILED records of all
 *     of them; inspect, release, rearm and purge reach each record's primary; the layout stamp
 *     is checked there; ping answers for every primary;
 *   - wxguardctl failed, inspect, release and purge with redis.cluster.nodes;
 *   - a primary killed: calls for its shards fail clearly (never reported done), its replica is
 *     promoted, the guard follows it (its script cache is empty: NOSCRIPT reloads), and no
 *     DONE acknowledged with WAIT is lost.
 * The exactness of claims while slots migrate needs every key a script touches declared; the
 * key layout that does that is tested with it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "guardtest.h"
#include "testenv.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"

static wxg_test_cluster_t C;

static int up(void **state)
{
    (void)state;
    return wxg_test_cluster_start(&C, 3, 1) == 0 ? 0 : -1;
}

static int down(void **state)
{
    (void)state;
    wxg_test_cluster_stop(&C);
    return 0;
}

static void cluster_conf(wxg_guard_conf_t *c, const char *tag, char *prefix, size_t size)
{
    gt_conf(c, "127.0.0.1", 1, tag, prefix, size);
    c->cluster_nodes = C.seeds;
    c->command_timeout_ms = 5000 * wxg_test_scale();
}

/* Keys under `pattern` on the node at `port` (SCAN there). */
static size_t node_count(int port, const char *pattern)
{
    redisContext *r = gt_redis("127.0.0.1", port, NULL);
    size_t n = gt_count(r, pattern);
    redisFree(r);
    return n;
}

static int is_primary(int port)
{
    redisContext *r = gt_redis("127.0.0.1", port, NULL);
    redisReply *rep = redisCommand(r, "ROLE");
    int p = rep && rep->type == REDIS_REPLY_ARRAY && strcmp(rep->element[0]->str, "master") == 0;
    if (rep)
        freeReplyObject(rep);
    redisFree(r);
    return p;
}

enum { NKEYS = 3000, BATCH = 64 };

static void claims_completes_and_duplicates_across_every_primary(void **state)
{
    (void)state;
    char prefix[64];
    wxg_guard_conf_t conf;
    cluster_conf(&conf, "cl", prefix, sizeof prefix);
    conf.wait_replicas = 1;
    conf.wait_timeout_ms = 2000 * wxg_test_scale();
    wxg_guard_t *g = gt_open(&conf);
    static char keys[NKEYS][40];
    for (int i = 0; i < NKEYS; i++)
        snprintf(keys[i], sizeof keys[i], "wxid_cluster:n:%d", 900000 + i);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < NKEYS; i += BATCH) {
            int n = NKEYS - i < BATCH ? NKEYS - i : BATCH;
            wxg_guard_msg_t msgs[BATCH];
            wxg_guard_claim_t out[BATCH];
            for (int j = 0; j < n; j++)
                msgs[j] = (wxg_guard_msg_t){keys[i + j], strlen(keys[i + j]), NULL};
            int rc = wxg_guard_claim_batch(g, msgs, (size_t)n, out);
            if (rc)
                fail_msg("claim: %s", wxg_guard_last_error(g));
            wxg_guard_ticket_t t[BATCH];
            int res[BATCH];
            for (int j = 0; j < n; j++) {
                assert_int_equal(out[j].outcome,
                                 round == 0 ? WXG_GUARD_CLAIMED : WXG_GUARD_DUPLICATE);
                t[j] = out[j].ticket;
            }
            if (round == 0) {
                rc = wxg_guard_complete_batch(g, t, (size_t)n, res);
                if (rc)
                    fail_msg("complete: %s", wxg_guard_last_error(g));
                for (int j = 0; j < n; j++)
                    assert_int_equal(res[j], WXG_GUARD_OK);
            }
            for (int j = 0; j < n; j++)
                wxg_guard_claim_clear(&out[j]);
        }
    }
    wxg_guard_stats_t st;
    wxg_guard_get_stats(g, &st);
    assert_int_equal(st.claimed, NKEYS);
    assert_int_equal(st.completed, NKEYS);
    assert_int_equal(st.duplicates, NKEYS);
    assert_int_equal(st.cluster_moved, 0);
    assert_int_equal(st.replica_failures, 0);

    /* Spread: every primary holds between 25 % and 42 % of the guard's keys. */
    char pattern[96];
    snprintf(pattern, sizeof pattern, "%s*", prefix);
    size_t total = 0, per[WXG_TEST_CLUSTER_MAX] = {0};
    for (int i = 0; i < C.n; i++) {
        if (!is_primary(C.node[i].port))
            continue;
        per[i] = node_count(C.node[i].port, pattern);
        total += per[i];
    }
    assert_true(total > 0);
    int primaries = 0;
    for (int i = 0; i < C.n; i++) {
        if (!per[i])
            continue;
        primaries++;
        double share = (double)per[i] / (double)total;
        printf("primary %d holds %zu of %zu keys (%.1f %%)\n", C.node[i].port, per[i], total,
               100 * share);
        if (share < 0.25 || share > 0.42)
            fail_msg("primary %d holds %.1f %% of the keys", C.node[i].port, 100 * share);
    }
    assert_int_equal(primaries, 3);
    assert_int_equal(wxg_guard_ping(g), 0);
    wxg_guard_destroy(g);
}

typedef struct seen {
    int failed;
    char first_key[64];
} seen;

static int count_failed(const wxg_guard_record_t *rec, void *arg)
{
    seen *s = arg;
    if (rec->state == WXG_GUARD_FAILED) {
        if (!s->failed && rec->msg_key)
            snprintf(s->first_key, sizeof s->first_key, "%s", rec->msg_key);
        s->failed++;
    }
    return 0;
}

static void the_scan_walks_every_primary_and_admin_operations_reach_each_record(void **state)
{
    (void)state;
    char prefix[64];
    wxg_guard_conf_t conf;
    cluster_conf(&conf, "adm", prefix, sizeof prefix);
    wxg_guard_t *g = gt_open(&conf);
    enum { NF = 60 };
    char keys[NF][40];
    for (int i = 0; i < NF; i++) {
        snprintf(keys[i], sizeof keys[i], "wxid_admin:n:%d", 1000 + i);
        wxg_guard_claim_t c;
        assert_int_equal(wxg_guard_claim(g, keys[i], strlen(keys[i]), NULL, &c), 0);
        assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
        assert_int_equal(wxg_guard_fail(g, &c.ticket, "boom", c.attempt), 0);
        wxg_guard_claim_clear(&c);
    }
    /* The records live on every primary. */
    char pattern[96];
    snprintf(pattern, sizeof pattern, "%s*", prefix);
    int holding = 0;
    for (int i = 0; i < C.n; i++)
        if (is_primary(C.node[i].port) && node_count(C.node[i].port, pattern) > 0)
            holding++;
    assert_int_equal(holding, 3);
    /* The walk: small pages, over all primaries, finds each FAILED record once. */
    seen s = {0};
    uint64_t cursor = 0;
    int pages = 0, crossed = 0;
    do {
        uint64_t before = cursor;
        assert_int_equal(wxg_guard_scan(g, &cursor, 10, count_failed, &s), 0);
        crossed += (cursor >> 48) != (before >> 48);
        assert_true(++pages < 10000);
    } while (cursor != 0);
    assert_int_equal(s.failed, NF);
    assert_true(crossed >= 2);

    /* inspect, rearm, release, purge on records of every primary. */
    for (int i = 0; i < NF; i++) {
        wxg_guard_record_t *rec = NULL;
        assert_int_equal(wxg_guard_inspect(g, keys[i], strlen(keys[i]), NULL, &rec), 0);
        assert_int_equal(rec->state, WXG_GUARD_FAILED);
        assert_string_equal(rec->fail_reason, "boom");
        wxg_guard_record_free(rec);
    }
    int done = 0;
    assert_int_equal(wxg_guard_rearm(g, keys[0], strlen(keys[0]), &done), 0);
    assert_true(done);
    for (int i = 0; i < NF; i += 2) {
        int purged = 0;
        assert_int_equal(wxg_guard_purge(g, keys[i], strlen(keys[i]), &purged), 0);
        assert_true(purged);
    }
    /* A claim held by someone, released by the operator. */
    wxg_guard_claim_t c;
    const char *held = "wxid_admin:n:held";
    assert_int_equal(wxg_guard_claim(g, held, strlen(held), NULL, &c), 0);
    assert_int_equal(c.outcome, WXG_GUARD_CLAIMED);
    int released = 0;
    assert_int_equal(wxg_guard_release(g, held, strlen(held), &released), 0);
    assert_true(released);
    wxg_guard_claim_clear(&c);
    s = (seen){0};
    cursor = 0;
    do
        assert_int_equal(wxg_guard_scan(g, &cursor, 50, count_failed, &s), 0);
    while (cursor != 0);
    /* The odd ones are left, and the released claim is FAILED now. */
    assert_int_equal(s.failed, NF / 2 + 1);
    wxg_guard_destroy(g);
}

/* ---- wxguardctl against the cluster ---- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Runs wxguardctl with args, the cluster's nodes and the prefix; returns the exit status, with
 * stdout in *out (the caller's). */
static int ctl(const char *dir, const char *prefix, const char *input, char **out,
               const char *const *args)
{
    char bin[1024], nodes[512], pfx[128], in[600], o[600], e[600];
    snprintf(bin, sizeof bin, "%s/cmd/wxguardctl/wxguardctl", getenv("WXG_BINARY_DIR"));
    snprintf(nodes, sizeof nodes, "redis.cluster.nodes=%s", C.seeds);
    snprintf(pfx, sizeof pfx, "redis.key.prefix=%s", prefix);
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(o, sizeof o, "%s/out", dir);
    snprintf(e, sizeof e, "%s/err", dir);
    FILE *fp = fopen(in, "w");
    fputs(input ? input : "", fp);
    fclose(fp);
    const char *argv[32];
    int n = 0;
    argv[n++] = bin;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n++] = "--set";
    argv[n++] = nodes;
    argv[n++] = "--set";
    argv[n++] = pfx;
    argv[n++] = "--quiet";
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int i0 = open(in, O_RDONLY), o1 = open(o, O_WRONLY | O_CREAT | O_TRUNC, 0600),
            e2 = open(e, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(i0, 0);
        dup2(o1, 1);
        dup2(e2, 2);
        execv(bin, (char *const *)argv);
        _exit(121);
    }
    int64_t deadline = wxg_test_now_ms() + 60000LL * wxg_test_scale();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (wxg_test_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("wxguardctl %s did not finish", args[0]);
        }
        wxg_test_sleep_ms(20);
    }
    *out = slurp(o);
    char *err = slurp(e);
    int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (status >= 2)
        print_message("wxguardctl %s exited %d: %s\n", args[0], status, err);
    free(err);
    return status;
}

static void wxguardctl_failed_inspect_release_and_purge_work_on_a_cluster(void **state)
{
    (void)state;
    char prefix[64];
    wxg_guard_conf_t conf;
    cluster_conf(&conf, "ctl", prefix, sizeof prefix);
    conf.lease_ms = 30000; /* the tool's defaults give the same layout stamp */
    wxg_guard_t *g = gt_open(&conf);
    char *dir = wxg_test_mkdtemp("wxgctl-cluster");
    enum { NF = 30 };
    for (int i = 0; i < NF; i++) {
        char key[40];
        snprintf(key, sizeof key, "%s:n:%d", i % 2 ? "acctA" : "gone", 5000 + i);
        wxg_guard_claim_t c;
        assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &c), 0);
        assert_int_equal(wxg_guard_fail(g, &c.ticket, "bad", c.attempt), 0);
        wxg_guard_claim_clear(&c);
    }
    char *out = NULL;
    assert_int_equal(ctl(dir, prefix, NULL, &out, (const char *const[]){"failed", "--json", NULL}),
                     0);
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    const cJSON *list = cJSON_IsArray(doc) ? doc : cJSON_GetObjectItem(doc, "records");
    if (!list)
        list = cJSON_GetObjectItem(doc, "failed");
    assert_non_null(list);
    assert_int_equal(cJSON_GetArraySize(list), NF);
    cJSON_Delete(doc);
    free(out);

    assert_int_equal(ctl(dir, prefix, NULL, &out,
                         (const char *const[]){"inspect", "--json", "acctA:n:5001", NULL}),
                     0);
    assert_non_null(strstr(out, "FAILED"));
    free(out);

    const char *held = "acctA:n:9999";
    wxg_guard_claim_t c;
    assert_int_equal(wxg_guard_claim(g, held, strlen(held), NULL, &c), 0);
    assert_int_equal(
        ctl(dir, prefix, NULL, &out, (const char *const[]){"release", "--yes", held, NULL}), 0);
    free(out);
    wxg_guard_record_t *rec = NULL;
    assert_int_equal(wxg_guard_inspect(g, held, strlen(held), NULL, &rec), 0);
    assert_int_equal(rec->state, WXG_GUARD_FAILED);
    wxg_guard_record_free(rec);
    wxg_guard_claim_clear(&c);

    assert_int_equal(ctl(dir, prefix, "y\n", &out,
                         (const char *const[]){"purge", "--account", "gone", "--json", NULL}),
                     0);
    free(out);
    for (int i = 0; i < NF; i += 2) {
        char key[40];
        snprintf(key, sizeof key, "gone:n:%d", 5000 + i);
        assert_int_equal(wxg_guard_inspect(g, key, strlen(key), NULL, &rec), 0);
        assert_int_equal(rec->state, WXG_GUARD_ABSENT);
        wxg_guard_record_free(rec);
    }
    assert_int_equal(wxg_guard_inspect(g, "acctA:n:5001", 12, NULL, &rec), 0);
    assert_int_equal(rec->state, WXG_GUARD_FAILED);
    wxg_guard_record_free(rec);
    wxg_test_rmtree(dir);
    free(dir);
    wxg_guard_destroy(g);
}

/* Last: it kills a primary of the shared cluster. */
static void a_killed_primary_is_followed_and_no_acknowledged_done_is_lost(void **state)
{
    (void)state;
    char prefix[64];
    wxg_guard_conf_t conf;
    cluster_conf(&conf, "kill", prefix, sizeof prefix);
    conf.wait_replicas = 1;
    conf.wait_timeout_ms = 2000 * wxg_test_scale();
    conf.command_timeout_ms = 2000;
    wxg_guard_t *g = gt_open(&conf);
    /* After the failover the promoted replica has no replica of its own (until the old primary
     * returns), so WAIT 1 cannot be met there: the DONEs are written with WAIT, then checked
     * through a handle that does not wait, connected before the kill. */
    wxg_guard_conf_t check_conf = conf;
    check_conf.wait_replicas = 0;
    wxg_guard_t *chk = gt_open(&check_conf);
    enum { NK = 400 };
    char keys[NK][40];
    for (int i = 0; i < NK; i++) {
        snprintf(keys[i], sizeof keys[i], "wxid_kill:n:%d", 300 + i);
        wxg_guard_claim_t c;
        assert_int_equal(wxg_guard_claim(g, keys[i], strlen(keys[i]), NULL, &c), 0);
        int already = 0;
        assert_int_equal(wxg_guard_complete(g, &c.ticket, &already), 0);
        wxg_guard_claim_clear(&c);
    }
    int victim = -1;
    for (int i = 0; i < C.n && victim < 0; i++)
        if (is_primary(C.node[i].port))
            victim = i;
    kill(C.node[victim].pid, SIGKILL);
    waitpid(C.node[victim].pid, NULL, 0);
    C.node[victim].pid = 0;
    /* Readiness: a primary that does not answer fails the ping, and the error names it. */
    char port[16];
    snprintf(port, sizeof port, ":%d", C.node[victim].port);
    assert_int_not_equal(wxg_guard_ping(chk), 0);
    if (!strstr(wxg_guard_last_error(chk), port))
        fail_msg("the ping's error does not name the node: %s", wxg_guard_last_error(chk));
    /* Until the replica takes over, calls for the dead primary's shards fail; a failed call is
     * never a result. Every DONE written with WAIT 1 is still a duplicate afterwards. */
    int fails = 0;
    for (int i = 0; i < NK; i++) {
        wxg_guard_claim_t c;
        int rc;
        GT_RETRY(rc, fails, 40000, wxg_guard_claim(chk, keys[i], strlen(keys[i]), NULL, &c));
        if (rc)
            fail_msg("claim after the failover: %s", wxg_guard_last_error(chk));
        assert_int_equal(c.outcome, WXG_GUARD_DUPLICATE);
    }
    wxg_guard_stats_t st;
    wxg_guard_get_stats(chk, &st);
    printf("calls failed during the failover: %d; node errors %llu, map reads %llu, NOSCRIPT "
           "reloads %llu\n",
           fails, (unsigned long long)st.cluster_node_errors,
           (unsigned long long)st.cluster_refreshes, (unsigned long long)st.noscript_reloads);
    assert_true(fails > 0);
    assert_true(st.cluster_node_errors > 0);
    assert_int_equal(wxg_guard_ping(chk), 0);
    wxg_guard_destroy(chk);
    wxg_guard_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(claims_completes_and_duplicates_across_every_primary),
        cmocka_unit_test(the_scan_walks_every_primary_and_admin_operations_reach_each_record),
        cmocka_unit_test(wxguardctl_failed_inspect_release_and_purge_work_on_a_cluster),
        cmocka_unit_test(a_killed_primary_is_followed_and_no_acknowledged_done_is_lost),
    };
    return cmocka_run_group_tests(tests, up, down);
}
