/* wxguard over TLS-only Redis servers (plain port 0), with certificates the test makes:
 *   - the guard's state machine (claim, plugin_done, complete, duplicates) over TLS;
 *   - mutual TLS through the guard's configuration: no client certificate, a wrong CA, a
 *     certificate for another name (accepted with tls_verify = 0), an expired one: each
 *     refused by wxg_guard_new() with words that name the cause; the pass phrase of an
 *     encrypted key never appears in an error;
 *   - a TLS server stopped in the middle of a batch: the call times out within its deadline,
 *     nothing is reported done, the connection is replaced, and retrying finds the truth
 *     (each message completed exactly once);
 *   - the primary found through a Sentinel that listens on TLS only;
 *   - the real wxguard-consumer over TLS: 30 % duplicates, one effect per message.
 * The race test also runs over TLS (integration.test_guard_race_tls). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumertest.h"
#include "guardtest.h"
#include "testenv.h"
#include "wxguard/guard.h"

typedef struct fixture {
    char *pki;
    wxg_test_redis_t tls, mtls;
    char ca[600], other_ca[600], crt[600], key[600], enc_key[600], pass[128];
    char prefix[64];
} fixture;

static void pki_path(const fixture *f, char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", f->pki, name);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    f->pki = wxg_test_pki_make();
    if (!f->pki)
        fail_msg("cannot make the test certificates");
    pki_path(f, f->ca, sizeof f->ca, "ca.crt");
    pki_path(f, f->other_ca, sizeof f->other_ca, "other-ca.crt");
    pki_path(f, f->crt, sizeof f->crt, "client.crt");
    pki_path(f, f->key, sizeof f->key, "client.key");
    pki_path(f, f->enc_key, sizeof f->enc_key, "client-enc.key");
    char passfile[600];
    pki_path(f, passfile, sizeof passfile, "client-enc.pass");
    FILE *pf = fopen(passfile, "r");
    if (!pf || !fgets(f->pass, sizeof f->pass, pf))
        fail_msg("cannot read %s", passfile);
    fclose(pf);
    f->pass[strcspn(f->pass, "\n")] = '\0';
    if (wxg_test_redis_start_tls(&f->tls, f->pki, "server", 0) != 0 ||
        wxg_test_redis_start_tls(&f->mtls, f->pki, "server", 1) != 0)
        fail_msg("cannot start the TLS redis-servers");
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_test_redis_stop(&f->tls);
    wxg_test_redis_stop(&f->mtls);
    wxg_test_rmtree(f->pki);
    free(f->pki);
    free(f);
    return 0;
}

/* A guard configuration for the server at `port` over TLS, trusting the test CA. */
static void tls_conf(fixture *f, wxg_guard_conf_t *c, int port, const char *tag)
{
    gt_conf(c, "127.0.0.1", port, tag, f->prefix, sizeof f->prefix);
    c->tls = 1;
    c->tls_ca_file = f->ca;
    c->client_name = "wxguard-tls-test";
}

static void the_state_machine_runs_over_tls(void **state)
{
    fixture *f = *state;
    enum { N = 100 };
    wxg_guard_conf_t c;
    tls_conf(f, &c, f->tls.port, "tls-states");
    wxg_guard_t *g = gt_open(&c);
    static char keys[N][32];
    wxg_guard_msg_t msgs[N];
    wxg_guard_claim_t out[N];
    wxg_guard_ticket_t t[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "wxid_tls:n:%d", 73000 + i);
        msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), NULL};
    }
    gt_claim_all(g, msgs, N, out, t);
    assert_int_equal(wxg_guard_plugin_done(g, &t[0], "billing", "charged", 7), 0);
    assert_int_equal(wxg_guard_complete_batch(g, t, N, res), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(res[i], WXG_GUARD_OK);
        wxg_guard_claim_clear(&out[i]);
    }
    assert_int_equal(wxg_guard_claim_batch(g, msgs, N, out), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(out[i].outcome, WXG_GUARD_DUPLICATE);
        wxg_guard_claim_clear(&out[i]);
    }
    wxg_guard_destroy(g);
}

/* wxg_guard_new() with `c` must fail with `code` and an error containing `want`. */
static void refused(const wxg_guard_conf_t *c, int code, const char *want, const char *secret)
{
    char err[512] = "";
    int rc = 0;
    wxg_guard_t *g = wxg_guard_new(c, &rc, err, sizeof err);
    if (g)
        fail_msg("the guard connected; expected \"%s\"", want);
    print_message("refused: %s\n", err);
    assert_int_equal(rc, code);
    if (!strstr(err, want))
        fail_msg("\"%s\" does not say \"%s\"", err, want);
    if (secret)
        assert_null(strstr(err, secret));
}

static void the_guard_refuses_bad_certificates_with_their_cause(void **state)
{
    fixture *f = *state;
    wxg_guard_conf_t c;

    /* Mutual TLS: without a client certificate, then with one. */
    tls_conf(f, &c, f->mtls.port, "tls-mutual");
    refused(&c, WXG_ECONN, "client certificate", NULL);
    c.tls_cert_file = f->crt;
    c.tls_key_file = f->enc_key;
    c.tls_key_password = f->pass;
    wxg_guard_destroy(gt_open(&c));
    c.tls_key_password = "wrong-pass-phrase";
    refused(&c, WXG_ECONFIG, "cannot load the client key", "wrong-pass-phrase");

    /* A CA that did not sign the server's certificate. */
    tls_conf(f, &c, f->tls.port, "tls-ca");
    c.tls_ca_file = f->other_ca;
    refused(&c, WXG_ECONN, "not signed by a trusted CA", NULL);

    /* A name the certificate does not carry: refused, accepted without verification. */
    tls_conf(f, &c, f->tls.port, "tls-name");
    c.tls_server_name = "redis.elsewhere.invalid";
    refused(&c, WXG_ECONN, "not valid for the name 'redis.elsewhere.invalid'", NULL);
    c.tls_verify = 0;
    wxg_guard_destroy(gt_open(&c));

    /* An expired server certificate. */
    wxg_test_redis_t expired;
    assert_int_equal(wxg_test_redis_start_tls(&expired, f->pki, "expired", 0), 0);
    tls_conf(f, &c, expired.port, "tls-expired");
    refused(&c, WXG_ECONN, "has expired", NULL);
    wxg_test_redis_stop(&expired);

    /* A key without its certificate is a configuration error before any connection. */
    tls_conf(f, &c, f->tls.port, "tls-conf");
    c.tls_key_file = f->key;
    refused(&c, WXG_ECONFIG, "needs its certificate", NULL);
}

/* Completes t[0..n) until no call-level error is left, counting the failed calls; every
 * result ends OK or ALREADY_DONE: the message is done, once. */
static void complete_until_known(wxg_guard_t *g, wxg_guard_ticket_t *t, size_t n, int *res)
{
    int rc, fails = 0;
    GT_RETRY(rc, fails, 20000, wxg_guard_complete_batch(g, t, n, res));
    assert_int_equal(rc, 0);
    for (size_t i = 0; i < n; i++)
        assert_true(res[i] == WXG_GUARD_OK || res[i] == WXG_GUARD_ALREADY_DONE);
}

static void a_tls_server_stopped_mid_batch_times_out_and_a_retry_finds_the_truth(void **state)
{
    fixture *f = *state;
    enum { N = 64 };
    wxg_guard_conf_t c;
    tls_conf(f, &c, f->tls.port, "tls-stop");
    c.command_timeout_ms = 500;
    c.batch_max = 8; /* eight script calls in one pipeline */
    wxg_guard_t *g = gt_open(&c);
    static char keys[N][32];
    wxg_guard_msg_t msgs[N];
    wxg_guard_claim_t out[N];
    wxg_guard_ticket_t t[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "wxid_tls:n:%d", 74000 + i);
        msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), NULL};
    }
    assert_int_equal(wxg_guard_claim_batch(g, msgs, N, out), 0);
    for (int i = 0; i < N; i++)
        t[i] = out[i].ticket;

    kill(f->tls.pid, SIGSTOP);
    for (int i = 0; i < N; i++)
        res[i] = -9;
    int64_t t0 = wxg_test_now_ms();
    int rc = wxg_guard_complete_batch(g, t, N, res);
    int64_t took = wxg_test_now_ms() - t0;
    kill(f->tls.pid, SIGCONT);
    assert_int_equal(rc, WXG_ETIMEDOUT);
    assert_true(took >= 450 && took < 500 + 1000 * wxg_test_scale());
    for (int i = 0; i < N; i++)
        assert_int_equal(res[i], -9); /* no per-message result: nothing reported done */
    wxg_guard_stats_t st;
    wxg_guard_get_stats(g, &st);
    uint64_t connects = st.connects;

    /* The server may or may not have run the completes it had received: the retry says which,
     * and each message ends done exactly once. */
    complete_until_known(g, t, N, res);
    wxg_guard_get_stats(g, &st);
    assert_true(st.connects > connects); /* the dead connection was replaced */
    assert_int_equal(wxg_guard_claim_batch(g, msgs, N, out + 0), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(out[i].outcome, WXG_GUARD_DUPLICATE);
        wxg_guard_claim_clear(&out[i]);
    }
    wxg_guard_destroy(g);
}

static void the_primary_is_found_through_a_tls_sentinel(void **state)
{
    fixture *f = *state;
    wxg_test_redis_t sentinel;
    assert_int_equal(wxg_test_sentinel_start_tls(&sentinel, "wxgtls", f->tls.port, f->pki), 0);
    char list[64];
    snprintf(list, sizeof list, "127.0.0.1:%d", sentinel.port);
    wxg_guard_conf_t c;
    tls_conf(f, &c, wxg_test_free_port(), "tls-sentinel");
    c.sentinels = list;
    c.sentinel_master = "wxgtls";
    /* Without TLS to the Sentinel, it cannot be asked. */
    refused(&c, WXG_ECONN, "set redis.sentinel.tls", NULL);
    c.sentinel_tls = 1;
    wxg_guard_t *g = gt_open(&c);
    wxg_guard_claim_t cl;
    const char *key = "wxid_tls:n:75000";
    assert_int_equal(wxg_guard_claim(g, key, strlen(key), NULL, &cl), 0);
    assert_int_equal(cl.outcome, WXG_GUARD_CLAIMED);
    assert_int_equal(wxg_guard_complete(g, &cl.ticket, NULL), 0);
    wxg_guard_stats_t st;
    wxg_guard_get_stats(g, &st);
    assert_true(st.sentinel_lookups >= 1);
    wxg_guard_claim_clear(&cl);
    wxg_guard_destroy(g);
    wxg_test_redis_stop(&sentinel);
}

static void the_consumer_over_tls_has_one_effect_per_message(void **state)
{
    fixture *f = *state;
    enum { PARTITIONS = 3, UNIQUE = 700 };
    const uint64_t base = 7307000000000000000ULL;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-tls", PARTITIONS);
    t.redis_host = "127.0.0.1";
    t.redis_port = f->mtls.port;
    char extra[2048];
    snprintf(extra, sizeof extra,
             "redis.tls = true\nredis.tls.ca.file = %s\nredis.tls.cert.file = %s\n"
             "redis.tls.key.file = %s\nredis.tls.key.password = %s\n",
             f->ca, f->crt, f->enc_key, f->pass);
    wxg_ct_write_config(&t, extra);
    /* 30 % of the records are duplicates of earlier ones. */
    static wxg_ct_msg_t msgs[2 * UNIQUE]; /* at most one duplicate per unique message */
    size_t n = 0;
    unsigned seed = 7;
    for (int i = 0; i < UNIQUE; i++) {
        int conv = i % 60;
        msgs[n++] = (wxg_ct_msg_t){.partition = conv % PARTITIONS, .id = base + i, .conv = conv};
        if (i > 0 && rand_r(&seed) % 7 < 3) {
            int j = rand_r(&seed) % i;
            int cj = j % 60;
            msgs[n++] = (wxg_ct_msg_t){.partition = cj % PARTITIONS, .id = base + j, .conv = cj};
        }
    }
    wxg_ct_spawn(&t, 0);
    wxg_ct_produce(&t, msgs, n);
    assert_true(wxg_ct_wait_all_committed(&t, 120000, NULL));
    wxg_ct_assert_each_once(&t, base, UNIQUE);
    int st = wxg_ct_signal(&t, 0, SIGTERM, 60000);
    wxg_ct_assert_exit(&t, 0, st, 0);
    /* The key's pass phrase never reached the log. */
    assert_int_equal(wxg_ct_log_count(&t, 0, f->pass), 0);
    print_message("%zu records, %d unique, over mutual TLS\n", n, UNIQUE);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_state_machine_runs_over_tls),
        cmocka_unit_test(the_guard_refuses_bad_certificates_with_their_cause),
        cmocka_unit_test(a_tls_server_stopped_mid_batch_times_out_and_a_retry_finds_the_truth),
        cmocka_unit_test(the_primary_is_found_through_a_tls_sentinel),
        cmocka_unit_test(the_consumer_over_tls_has_one_effect_per_message),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
