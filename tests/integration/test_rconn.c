/* wxguard's Redis connection (lib/rconn.c) against private redis-servers, plain and TLS-only:
 *   - a pipeline large enough to need many partial writes, over TCP and over TLS, each reply
 *     matched to its command;
 *   - the TLS checks: an unknown CA, a certificate for another name (accepted only without
 *     verification), an expired certificate, a server that requires a client certificate
 *     (refused without one, accepted with one, also with an encrypted key), a TLS client on a
 *     plain port, a plain listener that never answers the handshake; each a clear error;
 *   - deadlines: a server stopped (SIGSTOP) halfway through a large reply times the call out
 *     within its deadline; a server that closes the connection in the middle of a pipeline
 *     reports which commands have an unknown outcome, and a new connection finds the truth;
 *   - an idle connection: one the server closed is noticed before the next command, and an
 *     idle TLS connection (with the session tickets TLS 1.3 servers send after the handshake)
 *     is not taken for a closed one;
 *   - a server on a Unix socket only (no TCP port): a command, a pipeline whose replies match
 *     their commands, the large pipeline; and the guard configured with the socket's path
 *     claims, completes and sees the duplicate. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "guardtest.h"
#include "rconn_int.h"
#include "testenv.h"
#include "wxguard/err.h"

typedef struct fixture {
    char *pki;
    wxg_test_redis_t plain, tls, mtls;
    char ca[600], other_ca[600], crt[600], key[600], enc_key[600], pass[128];
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
    if (wxg_test_redis_start(&f->plain, NULL) != 0 ||
        wxg_test_redis_start_tls(&f->tls, f->pki, "server", 0) != 0 ||
        wxg_test_redis_start_tls(&f->mtls, f->pki, "server", 1) != 0)
        fail_msg("cannot start the private redis-servers");
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    wxg_test_redis_stop(&f->plain);
    wxg_test_redis_stop(&f->tls);
    wxg_test_redis_stop(&f->mtls);
    wxg_test_rmtree(f->pki);
    free(f->pki);
    free(f);
    return 0;
}

/* Connects to 127.0.0.1:port (TLS when tls is not NULL); fails the test with the reason. */
static wxg__rconn_t *dial(int port, const wxg__rtls_conf_t *tls)
{
    wxg__rconn_opts_t o = {
        .host = "127.0.0.1", .port = port, .connect_timeout_ms = 3000, .tls = tls};
    char err[512] = "";
    int rc = 0;
    wxg__rconn_t *c = wxg__rconn_connect(&o, &rc, err, sizeof err);
    if (!c)
        fail_msg("connect to %d: %s (%d)", port, err, rc);
    return c;
}

/* Connects expecting a failure; returns its code, the text in err. */
static int dial_fails(int port, const wxg__rtls_conf_t *tls, char *err, size_t size)
{
    wxg__rconn_opts_t o = {
        .host = "127.0.0.1", .port = port, .connect_timeout_ms = 3000, .tls = tls};
    int rc = 0;
    wxg__rconn_t *c = wxg__rconn_connect(&o, &rc, err, size);
    if (!c)
        return rc;
    /* A client certificate is refused after the handshake under TLS 1.3: at the first
     * exchange. */
    redisReply *r = NULL;
    const char *argv[1] = {"PING"};
    size_t lens[1] = {4};
    rc = wxg__rconn_command(c, 3000, 1, argv, lens, &r, err, size);
    if (r)
        freeReplyObject(r);
    wxg__rconn_free(c);
    return rc;
}

static redisReply *cmd(wxg__rconn_t *c, const char *a0, const char *a1, const char *a2)
{
    const char *argv[3] = {a0, a1, a2};
    size_t lens[3] = {strlen(a0), a1 ? strlen(a1) : 0, a2 ? strlen(a2) : 0};
    int argc = a2 ? 3 : a1 ? 2 : 1;
    redisReply *r = NULL;
    char err[512] = "";
    if (wxg__rconn_command(c, 5000, argc, argv, lens, &r, err, sizeof err) != 0)
        fail_msg("%s: %s", a0, err);
    return r;
}

static void ping_ok(wxg__rconn_t *c)
{
    redisReply *r = cmd(c, "PING", NULL, NULL);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    assert_string_equal(r->str, "PONG");
    freeReplyObject(r);
}

/* Sends N SETs of distinct 1 KiB values, then N GETs, each batch in one pipeline, and checks
 * that each GET's reply is its own key's value: 16 MiB each way, far more than a socket buffer
 * holds, so the pipeline is written in many partial writes while replies are read. */
static void big_pipeline_matches_every_reply(wxg__rconn_t *c, const char *tag)
{
    enum { N = 16000, VLEN = 1024 };
    char *vals = malloc((size_t)N * VLEN);
    char(*keys)[32] = malloc(N * sizeof *keys);
    redisReply **rep = calloc(N, sizeof *rep);
    assert_non_null(vals);
    assert_non_null(keys);
    assert_non_null(rep);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "%s:k%d", tag, i);
        memset(vals + (size_t)i * VLEN, 'a' + i % 26, VLEN);
        snprintf(vals + (size_t)i * VLEN, VLEN, "value-%d-", i);
        const char *argv[3] = {"SET", keys[i], vals + (size_t)i * VLEN};
        size_t lens[3] = {3, strlen(keys[i]), VLEN};
        assert_int_equal(wxg__rconn_append(c, 3, argv, lens), 0);
    }
    char err[512] = "";
    size_t got = 0;
    if (wxg__rconn_exchange(c, 60000, rep, &got, err, sizeof err) != 0)
        fail_msg("SET pipeline: %s", err);
    assert_int_equal(got, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rep[i]->type, REDIS_REPLY_STATUS);
        freeReplyObject(rep[i]);
    }
    for (int i = N - 1; i >= 0; i--) { /* reversed, so that order matters */
        const char *argv[2] = {"GET", keys[i]};
        size_t lens[2] = {3, strlen(keys[i])};
        assert_int_equal(wxg__rconn_append(c, 2, argv, lens), 0);
    }
    if (wxg__rconn_exchange(c, 60000, rep, &got, err, sizeof err) != 0)
        fail_msg("GET pipeline: %s", err);
    for (int j = 0; j < N; j++) {
        int i = N - 1 - j;
        assert_int_equal(rep[j]->type, REDIS_REPLY_STRING);
        assert_int_equal(rep[j]->len, VLEN);
        assert_memory_equal(rep[j]->str, vals + (size_t)i * VLEN, VLEN);
        freeReplyObject(rep[j]);
    }
    uint64_t out = 0, in = 0;
    wxg__rconn_bytes(c, &out, &in);
    assert_true(out > (uint64_t)2 * N * VLEN / 2 && in > (uint64_t)N * VLEN);
    free(rep);
    free(keys);
    free(vals);
}

static void a_large_pipeline_needs_partial_writes_and_matches_replies_over_tcp(void **state)
{
    fixture *f = *state;
    wxg__rconn_t *c = dial(f->plain.port, NULL);
    big_pipeline_matches_every_reply(c, "tcp");
    wxg__rconn_free(c);
}

static void a_large_pipeline_needs_partial_writes_and_matches_replies_over_tls(void **state)
{
    fixture *f = *state;
    wxg__rtls_conf_t tls = {.ca_file = f->ca, .verify = 1};
    wxg__rconn_t *c = dial(f->tls.port, &tls);
    ping_ok(c);
    big_pipeline_matches_every_reply(c, "tls");
    wxg__rconn_free(c);
}

static void tls_verification_failures_name_their_cause(void **state)
{
    fixture *f = *state;
    char err[512] = "";

    /* A client that trusts another CA. */
    wxg__rtls_conf_t other = {.ca_file = f->other_ca, .verify = 1};
    assert_int_equal(dial_fails(f->tls.port, &other, err, sizeof err), WXG_ECONN);
    assert_non_null(strstr(err, "not signed by a trusted CA"));
    assert_non_null(strstr(err, "redis.tls.ca.file"));

    /* The right CA, a name the certificate does not carry. */
    wxg__rtls_conf_t named = {.ca_file = f->ca, .server_name = "redis.other.invalid", .verify = 1};
    assert_int_equal(dial_fails(f->tls.port, &named, err, sizeof err), WXG_ECONN);
    assert_non_null(strstr(err, "not valid for the name 'redis.other.invalid'"));

    /* A server whose certificate names another host: refused, unless verification is off. */
    wxg_test_redis_t wrong;
    assert_int_equal(wxg_test_redis_start_tls(&wrong, f->pki, "wrongname", 0), 0);
    wxg__rtls_conf_t ok = {.ca_file = f->ca, .verify = 1};
    assert_int_equal(dial_fails(wrong.port, &ok, err, sizeof err), WXG_ECONN);
    assert_non_null(strstr(err, "not valid for the name '127.0.0.1'"));
    wxg__rtls_conf_t noverify = {.ca_file = f->ca, .verify = 0};
    wxg__rconn_t *c = dial(wrong.port, &noverify);
    ping_ok(c);
    wxg__rconn_free(c);
    /* The name it carries is accepted when asked for. */
    wxg__rtls_conf_t asked = {.ca_file = f->ca, .server_name = "other.invalid", .verify = 1};
    c = dial(wrong.port, &asked);
    ping_ok(c);
    wxg__rconn_free(c);
    wxg_test_redis_stop(&wrong);

    /* An expired server certificate. */
    wxg_test_redis_t expired;
    assert_int_equal(wxg_test_redis_start_tls(&expired, f->pki, "expired", 0), 0);
    assert_int_equal(dial_fails(expired.port, &ok, err, sizeof err), WXG_ECONN);
    assert_non_null(strstr(err, "has expired"));
    wxg_test_redis_stop(&expired);

    /* TLS spoken to a plain port. */
    assert_int_not_equal(dial_fails(f->plain.port, &ok, err, sizeof err), 0);
    assert_non_null(strstr(err, "TLS to 127.0.0.1:"));

    /* A CA file that does not exist is a configuration error naming it. */
    wxg__rtls_conf_t missing = {.ca_file = "/nonexistent/ca.pem", .verify = 1};
    assert_int_equal(dial_fails(f->tls.port, &missing, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "/nonexistent/ca.pem"));
}

static void mutual_tls_requires_and_accepts_a_client_certificate(void **state)
{
    fixture *f = *state;
    char err[512] = "";
    wxg__rtls_conf_t none = {.ca_file = f->ca, .verify = 1};
    assert_int_equal(dial_fails(f->mtls.port, &none, err, sizeof err), WXG_ECONN);
    /* The server's alert, or (when its reset overtook the alert) the hint. */
    print_message("without a client certificate: %s\n", err);
    assert_true(strstr(err, "requires a client certificate") ||
                strstr(err, "require a client certificate"));
    assert_non_null(strstr(err, "redis.tls.cert.file"));

    wxg__rtls_conf_t with = {
        .ca_file = f->ca, .cert_file = f->crt, .key_file = f->key, .verify = 1};
    wxg__rconn_t *c = dial(f->mtls.port, &with);
    ping_ok(c);
    wxg__rconn_free(c);

    /* An encrypted key with its pass phrase, and with a wrong one (never repeated). */
    wxg__rtls_conf_t enc = {.ca_file = f->ca,
                            .cert_file = f->crt,
                            .key_file = f->enc_key,
                            .key_password = f->pass,
                            .verify = 1};
    c = dial(f->mtls.port, &enc);
    ping_ok(c);
    wxg__rconn_free(c);
    enc.key_password = "not-the-pass-phrase";
    assert_int_equal(dial_fails(f->mtls.port, &enc, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "cannot load the client key"));
    assert_null(strstr(err, "not-the-pass-phrase"));
    assert_null(strstr(err, f->pass));

    /* A client certificate the server's CA did not sign. */
    char other_crt[600], other_key[600];
    pki_path(f, other_crt, sizeof other_crt, "other-ca.crt");
    pki_path(f, other_key, sizeof other_key, "other-ca.key");
    wxg__rtls_conf_t foreign = {
        .ca_file = f->ca, .cert_file = other_crt, .key_file = other_key, .verify = 1};
    assert_int_equal(dial_fails(f->mtls.port, &foreign, err, sizeof err), WXG_ECONN);
    print_message("with a foreign client certificate: %s\n", err);
    assert_true(strstr(err, "refused our client certificate") ||
                strstr(err, "refuse the client certificate"));
}

/* A listener that accepts TCP connections (the kernel completes them) and never says a word. */
static void a_silent_listener_times_the_handshake_out_within_the_connect_timeout(void **state)
{
    (void)state;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s, 4), 0);
    socklen_t al = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &al);
    wxg__rtls_conf_t tls = {.verify = 0};
    wxg__rconn_opts_t o = {
        .host = "127.0.0.1", .port = ntohs(a.sin_port), .connect_timeout_ms = 400, .tls = &tls};
    char err[512] = "";
    int rc = 0;
    int64_t t0 = wxg_test_now_ms();
    assert_null(wxg__rconn_connect(&o, &rc, err, sizeof err));
    int64_t took = wxg_test_now_ms() - t0;
    assert_int_equal(rc, WXG_ETIMEDOUT);
    assert_non_null(strstr(err, "handshake timed out"));
    assert_true(took >= 380 && took < 400 + 500 * wxg_test_scale());
    close(s);
}

/* Bytes process `pid` has written (wchar of /proc/PID/io): Redis writes replies with write(),
 * so this grows as the reply leaves it. */
static long long written_by(pid_t pid)
{
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/%d/io", (int)pid);
    FILE *f = fopen(path, "r");
    long long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "wchar: %lld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

typedef struct stopper {
    pid_t pid;
    long long from;
    int stopped;
} stopper;

/* Stops the server once it has written 8 MiB of the 256 MiB reply: mid-reply. */
static void *stop_mid_reply(void *arg)
{
    stopper *s = arg;
    int64_t end = wxg_test_now_ms() + 20000;
    while (wxg_test_now_ms() < end) {
        if (written_by(s->pid) - s->from > 8 << 20) {
            s->stopped = kill(s->pid, SIGSTOP) == 0;
            return NULL;
        }
        usleep(100);
    }
    return NULL;
}

static void a_server_stopped_mid_reply_times_out_within_the_deadline(void **state, int use_tls)
{
    fixture *f = *state;
    wxg_test_redis_t *srv = use_tls ? &f->tls : &f->plain;
    wxg__rtls_conf_t tls = {.ca_file = f->ca, .verify = 1};
    wxg__rconn_t *c = dial(srv->port, use_tls ? &tls : NULL);
    /* A 256 MiB value: the reply takes far longer to arrive than the 8 MiB the stopper waits
     * for. */
    redisReply *r = NULL;
    {
        const char *argv[] = {"EVAL", "redis.call('SET', KEYS[1], string.rep('x', 268435456))", "1",
                              "big"};
        size_t lens[4] = {4, strlen(argv[1]), 1, 3};
        char err[512] = "";
        if (wxg__rconn_command(c, 30000, 4, argv, lens, &r, err, sizeof err) != 0)
            fail_msg("making the big value: %s", err);
        freeReplyObject(r);
    }
    uint64_t out0, in0, out1, in1;
    wxg__rconn_bytes(c, &out0, &in0);
    stopper s = {.pid = srv->pid, .from = written_by(srv->pid)};
    pthread_t th;
    pthread_create(&th, NULL, stop_mid_reply, &s);
    const char *argv[2] = {"GET", "big"};
    size_t lens[2] = {3, 3};
    char err[512] = "";
    /* Redis copies the whole value into its reply buffers before it writes a byte of it, which
     * on a loaded machine has taken longer than 1.5 s: the deadline leaves room for that, so
     * that the stop falls inside the reply, not before it. */
    const int deadline = 3000 * wxg_test_scale();
    char want[64];
    snprintf(want, sizeof want, "no reply within %d ms", deadline);
    int64_t t0 = wxg_test_now_ms();
    int rc = wxg__rconn_command(c, deadline, 2, argv, lens, &r, err, sizeof err);
    int64_t took = wxg_test_now_ms() - t0;
    pthread_join(th, NULL);
    kill(srv->pid, SIGCONT);
    wxg__rconn_bytes(c, &out1, &in1);
    print_message("GET of 256 MiB: %s after %lld ms with %llu bytes in\n", wxg_err_name(rc),
                  (long long)took, (unsigned long long)(in1 - in0));
    assert_true(s.stopped);
    assert_int_equal(rc, WXG_ETIMEDOUT);
    /* It stopped mid-reply: part of the value had arrived, not all of it. */
    assert_true(in1 - in0 > 1 << 20 && in1 - in0 < 256u << 20);
    assert_non_null(strstr(err, want));
    assert_true(took >= deadline - 50 && took < deadline + 1000 * wxg_test_scale());
    /* The connection is dead; a new one works once the server runs again. */
    assert_int_equal(wxg__rconn_command(c, 1000, 2, argv, lens, &r, err, sizeof err), WXG_ECONN);
    wxg__rconn_free(c);
    c = dial(srv->port, use_tls ? &tls : NULL);
    r = cmd(c, "DEL", "big", NULL);
    freeReplyObject(r);
    wxg__rconn_free(c);
}

static void a_tcp_server_stopped_mid_reply_times_out_within_the_deadline(void **state)
{
    a_server_stopped_mid_reply_times_out_within_the_deadline(state, 0);
}

static void a_tls_server_stopped_mid_reply_times_out_within_the_deadline(void **state)
{
    a_server_stopped_mid_reply_times_out_within_the_deadline(state, 1);
}

/* The server runs the first commands of a pipeline and closes the connection at CLIENT KILL:
 * the replies that arrived are returned, the commands after them are reported as unknown, and
 * a new connection finds out what really happened. */
static void a_connection_closed_mid_pipeline_reports_the_unknown_commands(void **state, int use_tls)
{
    fixture *f = *state;
    wxg__rtls_conf_t tls = {.ca_file = f->ca, .verify = 1};
    int port = use_tls ? f->tls.port : f->plain.port;
    wxg__rconn_t *c = dial(port, use_tls ? &tls : NULL);
    redisReply *id = cmd(c, "CLIENT", "ID", NULL);
    char ids[32];
    snprintf(ids, sizeof ids, "%lld", id->integer);
    freeReplyObject(id);
    const char *k[4] = {"mid:a", "mid:b", "mid:c", "mid:d"};
    for (int i = 0; i < 2; i++)
        assert_int_equal(
            wxg__rconn_append(c, 3, (const char *[]){"SET", k[i], "1"}, (size_t[]){3, 5, 1}), 0);
    assert_int_equal(
        wxg__rconn_append(c, 6, (const char *[]){"CLIENT", "KILL", "ID", ids, "SKIPME", "no"},
                          (size_t[]){6, 4, 2, strlen(ids), 6, 2}),
        0);
    for (int i = 2; i < 4; i++)
        assert_int_equal(
            wxg__rconn_append(c, 3, (const char *[]){"SET", k[i], "1"}, (size_t[]){3, 5, 1}), 0);
    redisReply *rep[5] = {NULL};
    size_t got = 99;
    char err[512] = "";
    assert_int_equal(wxg__rconn_exchange(c, 3000, rep, &got, err, sizeof err), WXG_ECONN);
    assert_non_null(strstr(err, "closed the connection"));
    /* The two SETs before the kill answered; what came after is unknown to this side. */
    assert_true(got >= 2 && got <= 3);
    for (size_t i = 0; i < got; i++) {
        if (i < 2)
            assert_int_equal(rep[i]->type, REDIS_REPLY_STATUS);
        freeReplyObject(rep[i]);
    }
    wxg__rconn_free(c);
    /* The truth: the first two ran, the last two did not. */
    c = dial(port, use_tls ? &tls : NULL);
    redisReply *n = cmd(c, "EXISTS", "mid:a", NULL);
    assert_int_equal(n->integer, 1);
    freeReplyObject(n);
    n = cmd(c, "EXISTS", "mid:c", NULL);
    assert_int_equal(n->integer, 0);
    freeReplyObject(n);
    n = cmd(c, "EXISTS", "mid:d", NULL);
    assert_int_equal(n->integer, 0);
    freeReplyObject(n);
    wxg__rconn_free(c);
}

static void a_tcp_connection_closed_mid_pipeline_reports_the_unknown_commands(void **state)
{
    a_connection_closed_mid_pipeline_reports_the_unknown_commands(state, 0);
}

static void a_tls_connection_closed_mid_pipeline_reports_the_unknown_commands(void **state)
{
    a_connection_closed_mid_pipeline_reports_the_unknown_commands(state, 1);
}

/* An idle connection the server closed is noticed before anything is sent; an idle one the
 * server keeps is not taken for closed, also over TLS where the server sends session tickets
 * after the handshake. */
static void idle_connections_are_told_apart_from_closed_ones(void **state)
{
    fixture *f = *state;
    wxg__rtls_conf_t tls = {.ca_file = f->ca, .verify = 1};
    for (int use_tls = 0; use_tls < 2; use_tls++) {
        int port = use_tls ? f->tls.port : f->plain.port;
        wxg__rconn_t *c = dial(port, use_tls ? &tls : NULL);
        wxg__rconn_t *admin = dial(port, use_tls ? &tls : NULL);
        wxg_test_sleep_ms(100); /* let any post-handshake message arrive */
        assert_false(wxg__rconn_idle_closed(c));
        ping_ok(c);
        wxg_test_sleep_ms(50);
        assert_false(wxg__rconn_idle_closed(c));
        const char *kill_argv[6] = {"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"};
        size_t kill_lens[6] = {6, 4, 4, 6, 6, 3};
        redisReply *r = NULL;
        char err[512] = "";
        if (wxg__rconn_command(admin, 3000, 6, kill_argv, kill_lens, &r, err, sizeof err) != 0)
            fail_msg("CLIENT KILL: %s", err);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        assert_true(r->integer >= 1);
        freeReplyObject(r);
        int64_t end = wxg_test_now_ms() + 3000;
        while (!wxg__rconn_idle_closed(c) && wxg_test_now_ms() < end)
            wxg_test_sleep_ms(10);
        assert_true(wxg__rconn_idle_closed(c));
        wxg__rconn_free(c);
        wxg__rconn_free(admin);
    }
}

/* Starts a private server listening on a Unix socket only; fails the test otherwise. The
 * socket is the server's only way in (--port 0), so whatever answers came through it. */
static void start_unix(wxg_test_redis_t *u)
{
    if (wxg_test_redis_start_unix(u) != 0)
        fail_msg("cannot start a redis-server on a Unix socket");
    struct stat st;
    assert_int_equal(stat(u->unixsocket, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
}

static void a_unix_socket_carries_commands_and_pipelines(void **state)
{
    (void)state;
    wxg_test_redis_t u;
    start_unix(&u);
    wxg__rconn_opts_t o = {.unix_path = u.unixsocket, .connect_timeout_ms = 3000};
    char err[512] = "";
    int rc = 0;
    wxg__rconn_t *c = wxg__rconn_connect(&o, &rc, err, sizeof err);
    if (!c)
        fail_msg("connect to %s: %s (%d)", u.unixsocket, err, rc);
    assert_string_equal(wxg__rconn_peer(c), u.unixsocket);

    /* One command, one reply. */
    ping_ok(c);
    redisReply *r = cmd(c, "SET", "unix:one", "1");
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);

    /* A pipeline of different commands: each reply answers its own command, in order. */
    assert_int_equal(
        wxg__rconn_append(c, 3, (const char *[]){"SET", "unix:k", "v1"}, (size_t[]){3, 6, 2}), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(
            wxg__rconn_append(c, 2, (const char *[]){"INCR", "unix:n"}, (size_t[]){4, 6}), 0);
    assert_int_equal(wxg__rconn_append(c, 2, (const char *[]){"GET", "unix:k"}, (size_t[]){3, 6}),
                     0);
    assert_int_equal(
        wxg__rconn_append(c, 2, (const char *[]){"GET", "unix:none"}, (size_t[]){3, 9}), 0);
    assert_int_equal(wxg__rconn_append(c, 2, (const char *[]){"INCR", "unix:k"}, (size_t[]){4, 6}),
                     0);
    redisReply *rep[7] = {NULL};
    size_t got = 0;
    if (wxg__rconn_exchange(c, 5000, rep, &got, err, sizeof err) != 0)
        fail_msg("pipeline over %s: %s", u.unixsocket, err);
    assert_int_equal(got, 7);
    assert_int_equal(rep[0]->type, REDIS_REPLY_STATUS);
    assert_string_equal(rep[0]->str, "OK");
    for (int i = 1; i <= 3; i++) {
        assert_int_equal(rep[i]->type, REDIS_REPLY_INTEGER);
        assert_int_equal(rep[i]->integer, i);
    }
    assert_int_equal(rep[4]->type, REDIS_REPLY_STRING);
    assert_string_equal(rep[4]->str, "v1");
    assert_int_equal(rep[5]->type, REDIS_REPLY_NIL);
    assert_int_equal(rep[6]->type, REDIS_REPLY_ERROR); /* an error reply is a reply */
    for (int i = 0; i < 7; i++)
        freeReplyObject(rep[i]);
    assert_false(wxg__rconn_dead(c));

    /* A pipeline far larger than the socket's buffers. */
    big_pipeline_matches_every_reply(c, "unix");
    wxg__rconn_free(c);

    /* A path where nothing listens is a connection error naming it. */
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none.sock", u.dir);
    o.unix_path = missing;
    assert_null(wxg__rconn_connect(&o, &rc, err, sizeof err));
    assert_int_equal(rc, WXG_ECONN);
    assert_non_null(strstr(err, missing));
    wxg_test_redis_stop(&u);
}

static void the_guard_over_a_unix_socket_claims_completes_and_sees_the_duplicate(void **state)
{
    (void)state;
    wxg_test_redis_t u;
    start_unix(&u);
    char prefix[64];
    wxg_guard_conf_t conf;
    /* host and port lead nowhere: only the socket can serve this guard. */
    gt_conf(&conf, "127.0.0.1", wxg_test_free_port(), "unix", prefix, sizeof prefix);
    conf.unix_path = u.unixsocket;
    wxg_guard_t *g = gt_open(&conf);

    enum { N = 5 };
    static char keys[N][32];
    wxg_guard_msg_t msgs[N];
    wxg_guard_claim_t out[N], again[N];
    wxg_guard_ticket_t t[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "bot:unix:%d", i);
        msgs[i] = (wxg_guard_msg_t){keys[i], strlen(keys[i]), NULL};
    }
    gt_claim_all(g, msgs, N, out, t);
    /* A second claim while the first holds the lease is BUSY. */
    wxg_guard_claim_t busy;
    assert_int_equal(wxg_guard_claim(g, keys[0], strlen(keys[0]), NULL, &busy), 0);
    assert_int_equal(busy.outcome, WXG_GUARD_BUSY);
    wxg_guard_claim_clear(&busy);
    assert_int_equal(wxg_guard_complete_batch(g, t, N, res), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(res[i], WXG_GUARD_OK);
    assert_int_equal(wxg_guard_claim_batch(g, msgs, N, again), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(again[i].outcome, WXG_GUARD_DUPLICATE);
        wxg_guard_claim_clear(&again[i]);
        wxg_guard_claim_clear(&out[i]);
    }
    /* The state is on the socket's server. */
    redisContext *x = redisConnectUnix(u.unixsocket);
    assert_true(x && !x->err);
    char pattern[96];
    snprintf(pattern, sizeof pattern, "%s*", prefix);
    assert_true(gt_count(x, pattern) >= 1);
    redisFree(x);
    wxg_guard_stats_t st;
    wxg_guard_get_stats(g, &st);
    assert_int_equal(st.connects, 1);
    assert_int_equal(st.conn_errors, 0);
    wxg_guard_destroy(g);
    wxg_test_redis_stop(&u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_large_pipeline_needs_partial_writes_and_matches_replies_over_tcp),
        cmocka_unit_test(a_large_pipeline_needs_partial_writes_and_matches_replies_over_tls),
        cmocka_unit_test(tls_verification_failures_name_their_cause),
        cmocka_unit_test(mutual_tls_requires_and_accepts_a_client_certificate),
        cmocka_unit_test(a_silent_listener_times_the_handshake_out_within_the_connect_timeout),
        cmocka_unit_test(a_tcp_server_stopped_mid_reply_times_out_within_the_deadline),
        cmocka_unit_test(a_tls_server_stopped_mid_reply_times_out_within_the_deadline),
        cmocka_unit_test(a_tcp_connection_closed_mid_pipeline_reports_the_unknown_commands),
        cmocka_unit_test(a_tls_connection_closed_mid_pipeline_reports_the_unknown_commands),
        cmocka_unit_test(idle_connections_are_told_apart_from_closed_ones),
        cmocka_unit_test(a_unix_socket_carries_commands_and_pipelines),
        cmocka_unit_test(the_guard_over_a_unix_socket_claims_completes_and_sees_the_duplicate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
