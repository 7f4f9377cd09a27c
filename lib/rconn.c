/*
 * DESIGN: wxguard's Redis connection -- hiredis's protocol over our own sockets.
 *
 * Purpose: every Redis user in wxguard (the guard's workers and watchdog, Sentinel discovery,
 * the Redis Cluster client, wxguardctl and the benchmark through the guard, and the benchmark's
 * own connections -- its probes and the designs it measures without the guard, through
 * cmd/wxguard-bench/bench_redis.c) talks to Redis through this file, so each of them reaches a
 * TLS-only or ACL-protected server with the same redis.* settings. hiredis 0.14.1 is used for
 * what does no I/O -- redisFormatCommandArgv and the RESP reader -- and the sockets are ours,
 * for three reasons: TLS (hiredis 0.14.1 has none, and its blocking context cannot be given
 * another transport), deadlines on every step (a blocking hiredis context times out per read()
 * call, so a server that trickles a reply can hold a call far past its timeout), and pipelines
 * whose replies are counted, so a failure says which commands have an unknown outcome.
 *
 * Shape: a connection is a non-blocking socket, an optional OpenSSL session on it, a send
 * buffer of formatted commands and a RESP reader. wxg__rconn_exchange() writes the buffer and
 * reads as many replies as commands were appended, waiting with poll() until one deadline for
 * the whole exchange. While the buffer is being written it also reads, so a pipeline larger
 * than the socket buffers never waits on itself. TLS reads can return data OpenSSL already
 * decrypted, so the loop asks the session before it polls the socket.
 *
 * TLS: TLS 1.2 or newer; the server's certificate is verified against the configured CA file or
 * directory (else the system's store) and the server name (SNI and the host name check; an
 * address literal is checked as an IP address and sent without SNI). An optional client
 * certificate and key give mutual TLS. The SSL_CTX is built at each connect, so certificate
 * files replaced on disk (rotation) are read by the next connection without a restart. The
 * session's socket I/O goes through a BIO of ours that sends with MSG_NOSIGNAL, so a server
 * that closed the connection gives an error, never SIGPIPE, in any program. A failed handshake
 * is reported by its cause (unknown CA, name mismatch, expired certificate, a client
 * certificate the server requires or refuses), in words that name the configuration key.
 *
 * Threads: a connection belongs to one thread at a time; nothing here locks. OpenSSL 3 needs no
 * locking set-up. Its error queue is per thread and is cleared before each TLS call.
 *
 * Failure modes: any I/O error, timeout, TLS error or malformed reply kills the connection (it
 * refuses further use); the caller frees it and connects again, with wxg__rbackoff_t between
 * failed attempts. A server that closed an idle connection is noticed by
 * wxg__rconn_idle_closed() before the next command is sent.
 */
#include "rconn_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock_int.h"
#include "err_int.h"
#include "wxguard/err.h"

#define PEER_MAX   300
#define READ_CHUNK 16384

struct wxg__rconn {
    int fd;
    SSL *ssl; /* NULL: plain */
    redisReader *reader;
    char *out; /* formatted commands not yet sent */
    size_t out_len, out_off, out_cap;
    size_t pending; /* commands appended since the last exchange */
    int dead;
    uint64_t bytes_in, bytes_out;
    char peer[PEER_MAX]; /* "host:port" or the socket path, for error texts */
    const char *role;    /* "Redis" or "Sentinel" (static), for error texts */
    /* No reply has arrived yet, and whether we sent a client certificate. A connection that
     * fails at its first exchange most likely met a server that wants something else: under
     * TLS 1.3 a server refuses a client certificate (or its absence) only after the handshake,
     * and its alert can be lost when it resets the connection; a TLS port resets a plain
     * client. The error then names that likely cause. */
    int fresh, client_cert;
};

/* ---------------------------------------------------------------------------------------------
 * The socket BIO: OpenSSL's own socket BIO writes with write(), which raises SIGPIPE on a
 * connection the server closed; a library must not kill a program that did not ignore it.
 */

static int bio_write(BIO *b, const char *buf, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t n = send(BIO_get_fd(b, NULL), buf, (size_t)len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)n;
}

static int bio_read(BIO *b, char *buf, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t n = recv(BIO_get_fd(b, NULL), buf, (size_t)len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    return (int)n;
}

static int bio_puts(BIO *b, const char *s)
{
    return bio_write(b, s, (int)strlen(s));
}

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

/* The socket BIO's other operations (fd get/set, close flag) are the stock ones; only the two
 * that touch the socket are replaced. */
static void bio_method_make(void)
{
    const BIO_METHOD *base = BIO_s_socket();
    BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOCKET, "wxguard socket");
    if (!m)
        return;
    if (!BIO_meth_set_write(m, bio_write) || !BIO_meth_set_read(m, bio_read) ||
        !BIO_meth_set_puts(m, bio_puts) || !BIO_meth_set_ctrl(m, BIO_meth_get_ctrl(base)) ||
        !BIO_meth_set_create(m, BIO_meth_get_create(base)) ||
        !BIO_meth_set_destroy(m, BIO_meth_get_destroy(base))) {
        BIO_meth_free(m);
        return;
    }
    bio_method = m;
}

/* ---------------------------------------------------------------------------------------------
 * Waiting
 */

/* Waits until fd is ready for `events` or the deadline passes. 0: ready (or an error the next
 * I/O call will report), WXG_ETIMEDOUT. */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - wxg__mono_ms();
        if (left <= 0)
            return WXG_ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return 0; /* the I/O call that follows reports the error */
    }
}

/* ---------------------------------------------------------------------------------------------
 * TLS: context, handshake, and the words for what went wrong
 */

static int pass_cb(char *buf, int size, int rwflag, void *u)
{
    (void)rwflag;
    const char *pw = u;
    size_t n = pw ? strlen(pw) : 0;
    if (n > (size_t)size)
        n = (size_t)size;
    memcpy(buf, pw, n);
    return (int)n;
}

/* The text of the oldest queued OpenSSL error; clears the queue. */
static const char *ssl_reason(char *buf, size_t size)
{
    unsigned long e = ERR_get_error();
    ERR_clear_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (r)
        snprintf(buf, size, "%s", r);
    else if (e)
        ERR_error_string_n(e, buf, size);
    else
        snprintf(buf, size, "%s", "no detail from OpenSSL");
    return buf;
}

/* Builds the client context from the settings: the files are read now, so a rotated
 * certificate is used from the next connection on. */
static SSL_CTX *tls_ctx_new(const wxg__rtls_conf_t *t, int *rc, char *errstr, size_t errstr_size)
{
    char why[256];
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        *rc = WXG_ENOMEM;
        wxg__errf(errstr, errstr_size, "TLS: cannot create a context: %s",
                  ssl_reason(why, sizeof why));
        return NULL;
    }
    *rc = WXG_ECONFIG;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_verify(ctx, t->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    if (t->ca_file || t->ca_path) {
        if (SSL_CTX_load_verify_locations(ctx, t->ca_file, t->ca_path) != 1) {
            wxg__errf(errstr, errstr_size, "TLS: cannot load the CA certificates from %s%s%s: %s",
                      t->ca_file ? t->ca_file : "", t->ca_file && t->ca_path ? " and " : "",
                      t->ca_path ? t->ca_path : "", ssl_reason(why, sizeof why));
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        wxg__errf(errstr, errstr_size, "TLS: cannot load the system's CA certificates: %s",
                  ssl_reason(why, sizeof why));
        goto fail;
    }
    if (t->cert_file) {
        const char *key = t->key_file ? t->key_file : t->cert_file;
        SSL_CTX_set_default_passwd_cb(ctx, pass_cb);
        SSL_CTX_set_default_passwd_cb_userdata(ctx, (void *)t->key_password);
        if (SSL_CTX_use_certificate_chain_file(ctx, t->cert_file) != 1) {
            wxg__errf(errstr, errstr_size, "TLS: cannot load the client certificate %s: %s",
                      t->cert_file, ssl_reason(why, sizeof why));
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
            wxg__errf(errstr, errstr_size,
                      "TLS: cannot load the client key %s (a wrong or missing pass phrase in "
                      "redis.tls.key.password?): %s",
                      key, ssl_reason(why, sizeof why));
            goto fail;
        }
        if (SSL_CTX_check_private_key(ctx) != 1) {
            wxg__errf(errstr, errstr_size, "TLS: the key %s does not belong to the certificate %s",
                      key, t->cert_file);
            goto fail;
        }
        /* The pass phrase is not needed after the key was read. */
        SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
    }
    *rc = 0;
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

/* Words for a certificate the client refused, naming what to change. */
static void describe_verify(long v, const char *name, char *errstr, size_t errstr_size,
                            const char *peer)
{
    const char *what = X509_verify_cert_error_string(v);
    switch (v) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
        wxg__errf(
            errstr, errstr_size,
            "TLS to %s: the server's certificate is not signed by a trusted CA (%s); give its "
            "CA in redis.tls.ca.file or redis.tls.ca.path",
            peer, what);
        break;
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
        wxg__errf(errstr, errstr_size,
                  "TLS to %s: the server's certificate is not valid for the name '%s' (%s); set "
                  "redis.tls.server.name to a name the certificate carries",
                  peer, name, what);
        break;
    case X509_V_ERR_CERT_HAS_EXPIRED:
        wxg__errf(errstr, errstr_size, "TLS to %s: the server's certificate has expired (%s)", peer,
                  what);
        break;
    case X509_V_ERR_CERT_NOT_YET_VALID:
        wxg__errf(errstr, errstr_size,
                  "TLS to %s: the server's certificate is not valid yet (%s; check the clocks)",
                  peer, what);
        break;
    default:
        wxg__errf(errstr, errstr_size, "TLS to %s: certificate verification failed: %s", peer,
                  what);
    }
}

/* Words for a failed TLS operation (handshake, read or write): the certificate check when that
 * failed, else what the server's alert or OpenSSL said. Clears OpenSSL's error queue. */
static void describe_tls_failure(wxg__rconn_t *c, const char *name, char *errstr,
                                 size_t errstr_size)
{
    long v = SSL_get_verify_result(c->ssl);
    unsigned long e = ERR_peek_error();
    int reason = e ? ERR_GET_REASON(e) : 0;
    char why[256];
    if (v != X509_V_OK && reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        ERR_clear_error();
        describe_verify(v, name, errstr, errstr_size, c->peer);
        return;
    }
    switch (reason) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
        wxg__errf(
            errstr, errstr_size,
            "TLS to %s: the server requires a client certificate; set redis.tls.cert.file and "
            "redis.tls.key.file (%s)",
            c->peer, ssl_reason(why, sizeof why));
        return;
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
        wxg__errf(errstr, errstr_size,
                  "TLS to %s: the server refused our client certificate (redis.tls.cert.file): %s",
                  c->peer, ssl_reason(why, sizeof why));
        return;
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
        wxg__errf(errstr, errstr_size,
                  "TLS to %s: the server does not speak TLS on this port (a plain Redis port?): %s",
                  c->peer, ssl_reason(why, sizeof why));
        return;
    default:
        break;
    }
    if (e)
        wxg__errf(errstr, errstr_size, "TLS to %s: %s", c->peer, ssl_reason(why, sizeof why));
    else
        wxg__errf(errstr, errstr_size, "TLS to %s: connection closed (%s)", c->peer,
                  errno ? strerror(errno) : "end of file");
}

/* 1 when `s` is an IPv4 or IPv6 address literal. */
static int is_address(const char *s)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

/* Creates the session on the connected socket and runs the handshake until the deadline. */
static int tls_handshake(wxg__rconn_t *c, const wxg__rtls_conf_t *t, const char *host,
                         int64_t deadline, char *errstr, size_t errstr_size)
{
    int rc = 0;
    pthread_once(&bio_once, bio_method_make);
    SSL_CTX *ctx = tls_ctx_new(t, &rc, errstr, errstr_size);
    if (!ctx)
        return rc;
    const char *name = t->server_name ? t->server_name : host;
    rc = WXG_ENOMEM;
    c->ssl = SSL_new(ctx);
    BIO *bio = bio_method ? BIO_new(bio_method) : NULL;
    if (!c->ssl || !bio) {
        BIO_free(bio);
        wxg__errf(errstr, errstr_size, "TLS: out of memory");
        goto out;
    }
    BIO_set_fd(bio, c->fd, BIO_NOCLOSE);
    SSL_set_bio(c->ssl, bio, bio);
    int addr = is_address(name);
    if ((!addr && SSL_set_tlsext_host_name(c->ssl, name) != 1) ||
        (t->verify && addr && !X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), name)) ||
        (t->verify && !addr && SSL_set1_host(c->ssl, name) != 1)) {
        wxg__errf(errstr, errstr_size, "TLS: cannot use the server name '%s'", name);
        rc = WXG_ECONFIG;
        goto out;
    }
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_connect(c->ssl);
        if (r == 1) {
            rc = 0;
            break;
        }
        int e = SSL_get_error(c->ssl, r);
        short ev = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        if (!ev) {
            rc = WXG_ECONN;
            describe_tls_failure(c, name, errstr, errstr_size);
            break;
        }
        if (wait_fd(c->fd, ev, deadline) != 0) {
            rc = WXG_ETIMEDOUT;
            wxg__errf(errstr, errstr_size, "TLS to %s: the handshake timed out", c->peer);
            break;
        }
    }
out:
    SSL_CTX_free(ctx); /* the session keeps its own reference */
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Connecting
 */

static void tune_tcp(int fd)
{
    int one = 1, idle = 15, intvl = 5, cnt = 3;
    /* Replies are small and latency matters; a dead peer is found within about 30 s. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* Connects a new non-blocking socket to `sa` until the deadline. Returns the descriptor, or -1
 * with *rc and errno set. */
static int connect_addr(const struct sockaddr *sa, socklen_t len, int64_t deadline, int *rc)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *rc = errno == ENOMEM || errno == ENOBUFS ? WXG_ENOMEM : WXG_ECONN;
        return -1;
    }
    if (connect(fd, sa, len) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        *rc = WXG_ECONN;
        goto fail;
    }
    if (wait_fd(fd, POLLOUT, deadline) != 0) {
        *rc = WXG_ETIMEDOUT;
        errno = ETIMEDOUT;
        goto fail;
    }
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
        errno = err ? err : errno;
        *rc = WXG_ECONN;
        goto fail;
    }
    return fd;
fail:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

static int connect_unix(wxg__rconn_t *c, const char *path, int64_t deadline, char *errstr,
                        size_t errstr_size)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        wxg__errf(errstr, errstr_size, "the Unix socket path %s is too long", path);
        return WXG_ECONFIG;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int rc = 0;
    c->fd = connect_addr((struct sockaddr *)&sa, sizeof sa, deadline, &rc);
    if (c->fd < 0) {
        wxg__errf(errstr, errstr_size, "connecting to %s %s: %s", c->role, path, strerror(errno));
        return rc;
    }
    return 0;
}

/* Tries every address the name resolves to, in order, until one connects or the deadline. */
static int connect_tcp(wxg__rconn_t *c, const char *host, int port, int64_t deadline, char *errstr,
                       size_t errstr_size)
{
    char service[8];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(host, service, &hints, &res);
    if (g != 0) {
        wxg__errf(errstr, errstr_size, "connecting to %s %s: cannot resolve the name: %s", c->role,
                  c->peer, gai_strerror(g));
        return g == EAI_MEMORY ? WXG_ENOMEM : WXG_ECONN;
    }
    int rc = WXG_ECONN, saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        c->fd = connect_addr(ai->ai_addr, ai->ai_addrlen, deadline, &rc);
        if (c->fd >= 0)
            break;
        saved = errno;
        if (rc == WXG_ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    if (c->fd < 0) {
        wxg__errf(errstr, errstr_size, "connecting to %s %s: %s", c->role, c->peer,
                  rc == WXG_ETIMEDOUT ? "timed out" : strerror(saved));
        return rc;
    }
    tune_tcp(c->fd);
    return 0;
}

wxg__rconn_t *wxg__rconn_connect(const wxg__rconn_opts_t *o, int *rc, char *errstr,
                                 size_t errstr_size)
{
    int code = WXG_ENOMEM;
    int64_t deadline = wxg__mono_ms() + (o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 1);
    wxg__rconn_t *c = calloc(1, sizeof *c);
    if (!c || !(c->reader = redisReaderCreate())) {
        wxg__errf(errstr, errstr_size, "out of memory creating a Redis connection");
        goto fail;
    }
    c->fd = -1;
    c->role = o->role ? o->role : "Redis";
    const char *host = o->host ? o->host : "127.0.0.1";
    if (o->unix_path) {
        snprintf(c->peer, sizeof c->peer, "%s", o->unix_path);
        code = connect_unix(c, o->unix_path, deadline, errstr, errstr_size);
    } else {
        snprintf(c->peer, sizeof c->peer, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, o->port);
        code = connect_tcp(c, host, o->port, deadline, errstr, errstr_size);
    }
    if (code == 0 && o->tls) {
        code = tls_handshake(c, o->tls, host, deadline, errstr, errstr_size);
        c->client_cert = o->tls->cert_file != NULL;
    }
    c->fresh = 1;
    if (code != 0)
        goto fail;
    if (rc)
        *rc = 0;
    return c;
fail:
    wxg__rconn_free(c);
    if (rc)
        *rc = code;
    return NULL;
}

void wxg__rconn_free(wxg__rconn_t *c)
{
    if (!c)
        return;
    if (c->ssl) {
        /* No close_notify: a shutdown exchange could block, and the server does not need it. */
        SSL_free(c->ssl);
    }
    if (c->fd >= 0)
        close(c->fd);
    if (c->reader)
        redisReaderFree(c->reader);
    free(c->out);
    free(c);
}

/* ---------------------------------------------------------------------------------------------
 * Sending and receiving
 */

int wxg__rconn_append(wxg__rconn_t *c, int argc, const char **argv, const size_t *lens)
{
    if (c->dead)
        return WXG_ECONN;
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0)
        return WXG_ENOMEM;
    if (c->out_len + (size_t)len > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + (size_t)len)
            cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p) {
            free(cmd);
            return WXG_ENOMEM;
        }
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, cmd, (size_t)len);
    c->out_len += (size_t)len;
    c->pending++;
    free(cmd);
    return 0;
}

/* The outcome of one read or write step. */
enum { IO_DONE, IO_WANT_READ, IO_WANT_WRITE, IO_EOF, IO_ERROR };

/* Writes what it can of the send buffer. */
static int write_some(wxg__rconn_t *c)
{
    const char *p = c->out + c->out_off;
    size_t left = c->out_len - c->out_off;
    if (c->ssl) {
        ERR_clear_error();
        errno = 0;
        int n = SSL_write(c->ssl, p, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n > 0) {
            c->out_off += (size_t)n;
            c->bytes_out += (uint64_t)n;
            return IO_DONE;
        }
        int e = SSL_get_error(c->ssl, n);
        return e == SSL_ERROR_WANT_WRITE    ? IO_WANT_WRITE
               : e == SSL_ERROR_WANT_READ   ? IO_WANT_READ
               : e == SSL_ERROR_ZERO_RETURN ? IO_EOF
                                            : IO_ERROR;
    }
    ssize_t n = send(c->fd, p, left, MSG_NOSIGNAL);
    if (n >= 0) {
        c->out_off += (size_t)n;
        c->bytes_out += (uint64_t)n;
        return IO_DONE;
    }
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? IO_WANT_WRITE : IO_ERROR;
}

/* Reads what is there into the reader. */
static int read_some(wxg__rconn_t *c)
{
    char buf[READ_CHUNK];
    ssize_t n;
    if (c->ssl) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_read(c->ssl, buf, sizeof buf);
        if (r <= 0) {
            int e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_WANT_READ)
                return IO_WANT_READ;
            if (e == SSL_ERROR_WANT_WRITE)
                return IO_WANT_WRITE;
            if (e == SSL_ERROR_ZERO_RETURN ||
                (e == SSL_ERROR_SYSCALL && errno == 0 && ERR_peek_error() == 0))
                return IO_EOF;
            return IO_ERROR;
        }
        n = r;
    } else {
        n = recv(c->fd, buf, sizeof buf, 0);
        if (n == 0)
            return IO_EOF;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? IO_WANT_READ
                                                                             : IO_ERROR;
    }
    c->bytes_in += (uint64_t)n;
    if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK)
        return IO_ERROR;
    return IO_DONE;
}

/* Says why an I/O step failed, and marks the connection dead. */
static int io_failed(wxg__rconn_t *c, int st, const char *doing, char *errstr, size_t errstr_size)
{
    int saved = errno;
    c->dead = 1;
    if (c->reader->err) {
        wxg__errf(errstr, errstr_size, "%s %s sent a malformed reply: %s", c->role, c->peer,
                  c->reader->errstr);
        return c->reader->err == REDIS_ERR_OOM ? WXG_ENOMEM : WXG_ECONN;
    }
    if (c->ssl && st != IO_EOF && (ERR_peek_error() != 0 || saved == 0)) {
        describe_tls_failure(c, c->peer, errstr, errstr_size);
        return WXG_ECONN;
    }
    const char *hint = "";
    if (c->fresh && c->ssl)
        hint = c->client_cert ? " right after the TLS handshake (did it refuse the client "
                                "certificate of redis.tls.cert.file?)"
                              : " right after the TLS handshake (does it require a client "
                                "certificate? set redis.tls.cert.file and redis.tls.key.file)";
    else if (c->fresh)
        hint = strcmp(c->role, "Sentinel") == 0
                   ? " at the first command (does it listen on TLS only? set redis.sentinel.tls)"
                   : " at the first command (does it listen on TLS only? set redis.tls)";
    if (st == IO_EOF)
        wxg__errf(errstr, errstr_size, "%s %s closed the connection while %s%s", c->role, c->peer,
                  doing, hint);
    else
        wxg__errf(errstr, errstr_size, "%s %s: %s while %s%s", c->role, c->peer, strerror(saved),
                  doing, hint);
    return WXG_ECONN;
}

/* Drops what was appended but not sent (after a failure). */
static void discard_pending(wxg__rconn_t *c)
{
    c->out_len = c->out_off = 0;
    c->pending = 0;
}

/* Moves bytes once without waiting: writes what is left to send (reading meanwhile whatever
 * arrives when the socket is full, so that replies to what was sent free the server's
 * buffers), or, with nothing left to send, reads. 0 on progress; 1 when it must wait for the
 * socket, with *events what to wait for; else the connection failed (errstr, dead). */
static int move(wxg__rconn_t *c, short *events, char *errstr, size_t errstr_size)
{
    int sending = c->out_off < c->out_len;
    int st = sending ? write_some(c) : read_some(c);
    if (sending && st == IO_WANT_WRITE) {
        int rs = read_some(c);
        if (rs == IO_DONE)
            return 0;
        if (rs != IO_WANT_READ)
            return io_failed(c, rs, "sending", errstr, errstr_size);
        *events = POLLOUT | POLLIN;
        return 1;
    }
    if (st == IO_DONE)
        return 0;
    if (st == IO_WANT_READ || st == IO_WANT_WRITE) {
        *events = st == IO_WANT_READ ? POLLIN : POLLOUT;
        return 1;
    }
    return io_failed(c, st, sending ? "sending" : "reading replies", errstr, errstr_size);
}

/* Moves bytes once (move), waiting for the socket when it can do nothing. 0 on progress or
 * after a wait; WXG_ETIMEDOUT at the deadline; else the connection failed (errstr, dead). The
 * deadline holds also for a server that keeps sending, only too slowly. */
static int step(wxg__rconn_t *c, int64_t deadline, char *errstr, size_t errstr_size)
{
    if (wxg__mono_ms() >= deadline)
        return WXG_ETIMEDOUT;
    short events = 0;
    int rc = move(c, &events, errstr, errstr_size);
    if (rc == 1)
        return wait_fd(c->fd, events, deadline);
    return rc;
}

/* Ends a failed exchange: the connection is dead and what was appended is dropped. */
static int exchange_failed(wxg__rconn_t *c, int rc, size_t k, char *errstr, size_t errstr_size)
{
    c->dead = 1;
    if (rc == WXG_ETIMEDOUT)
        wxg__errf(errstr, errstr_size, "%s %s: no reply by the deadline (%zu of %zu arrived)",
                  c->role, c->peer, k, c->pending);
    discard_pending(c);
    return rc;
}

int wxg__rconn_flush(wxg__rconn_t *c, int64_t deadline_ms, char *errstr, size_t errstr_size)
{
    if (c->dead) {
        wxg__errf(errstr, errstr_size, "%s %s: the connection is closed", c->role, c->peer);
        discard_pending(c);
        return WXG_ECONN;
    }
    while (c->out_off < c->out_len) {
        int rc = step(c, deadline_ms, errstr, errstr_size);
        if (rc)
            return exchange_failed(c, rc, 0, errstr, errstr_size);
    }
    return 0;
}

int wxg__rconn_collect(wxg__rconn_t *c, int64_t deadline_ms, redisReply **replies, size_t *got,
                       char *errstr, size_t errstr_size)
{
    size_t want = c->pending, k = 0;
    int rc = 0;
    if (c->dead) {
        wxg__errf(errstr, errstr_size, "%s %s: the connection is closed", c->role, c->peer);
        rc = WXG_ECONN;
        discard_pending(c);
        goto out;
    }
    while (k < want) {
        void *r = NULL;
        if (redisReaderGetReply(c->reader, &r) != REDIS_OK) {
            rc = exchange_failed(c, io_failed(c, IO_ERROR, "reading", errstr, errstr_size), k,
                                 errstr, errstr_size);
            goto out;
        }
        if (r) {
            replies[k++] = r;
            c->fresh = 0;
            continue;
        }
        rc = step(c, deadline_ms, errstr, errstr_size);
        if (rc) {
            rc = exchange_failed(c, rc, k, errstr, errstr_size);
            goto out;
        }
    }
    c->out_len = c->out_off = c->pending = 0;
out:
    if (got)
        *got = k;
    return rc;
}

int wxg__rconn_collect_some(wxg__rconn_t *c, redisReply **replies, size_t *got, short *events,
                            char *errstr, size_t errstr_size)
{
    size_t want = c->pending, k = *got;
    int rc = 0;
    *events = 0;
    if (c->dead) {
        wxg__errf(errstr, errstr_size, "%s %s: the connection is closed", c->role, c->peer);
        discard_pending(c);
        return WXG_ECONN;
    }
    while (k < want) {
        void *r = NULL;
        if (redisReaderGetReply(c->reader, &r) != REDIS_OK) {
            rc = exchange_failed(c, io_failed(c, IO_ERROR, "reading", errstr, errstr_size), k,
                                 errstr, errstr_size);
            goto out;
        }
        if (r) {
            replies[k++] = r;
            c->fresh = 0;
            continue;
        }
        rc = move(c, events, errstr, errstr_size);
        if (rc == 1) {
            rc = 0;
            goto out; /* nothing more now: the caller waits for *events */
        }
        if (rc) {
            rc = exchange_failed(c, rc, k, errstr, errstr_size);
            goto out;
        }
    }
    c->out_len = c->out_off = c->pending = 0;
out:
    *got = k;
    return rc;
}

int wxg__rconn_fd(const wxg__rconn_t *c)
{
    return c->fd;
}

int wxg__rconn_expired(wxg__rconn_t *c, size_t got, char *errstr, size_t errstr_size)
{
    return exchange_failed(c, WXG_ETIMEDOUT, got, errstr, errstr_size);
}

int wxg__rconn_exchange(wxg__rconn_t *c, int timeout_ms, redisReply **replies, size_t *got,
                        char *errstr, size_t errstr_size)
{
    int64_t deadline = wxg__mono_ms() + (timeout_ms > 0 ? timeout_ms : 1);
    size_t want = c->pending, k = 0;
    /* Collecting also sends: one loop moves both ways, and replies wait in the reader. */
    int rc = wxg__rconn_collect(c, deadline, replies, &k, errstr, errstr_size);
    if (rc == WXG_ETIMEDOUT)
        wxg__errf(errstr, errstr_size, "%s %s: no reply within %d ms (%zu of %zu arrived)", c->role,
                  c->peer, timeout_ms, k, want);
    if (got)
        *got = k;
    return rc;
}

int wxg__rconn_command(wxg__rconn_t *c, int timeout_ms, int argc, const char **argv,
                       const size_t *lens, redisReply **out, char *errstr, size_t errstr_size)
{
    int rc = wxg__rconn_append(c, argc, argv, lens);
    if (rc) {
        wxg__errf(errstr, errstr_size, "%s %s: %s", c->role, c->peer,
                  rc == WXG_ENOMEM ? "out of memory" : "the connection is closed");
        return rc;
    }
    return wxg__rconn_exchange(c, timeout_ms, out, NULL, errstr, errstr_size);
}

static int starts_with(const char *s, size_t len, const char *word)
{
    size_t w = strlen(word);
    return s && len >= w && memcmp(s, word, w) == 0;
}

int wxg__rconn_refusal_code(const char *str, size_t len)
{
    if (starts_with(str, len, "NOAUTH") || starts_with(str, len, "WRONGPASS") ||
        starts_with(str, len, "NOPERM"))
        return WXG_EAUTH;
    return WXG_EREDIS;
}

int wxg__rconn_hello(wxg__rconn_t *c, int timeout_ms, const char *who, const char *user,
                     const char *password, int db, const char *name, char *errstr,
                     size_t errstr_size)
{
    enum { AUTH, SELECT, SETNAME, STEPS };
    static const char *const what[STEPS] = {"AUTH", "SELECT", "CLIENT SETNAME"};
    int step[STEPS], n = 0, rc = 0;
    char dbs[16];
    snprintf(dbs, sizeof dbs, "%d", db);
    if (password) {
        const char *argv[3] = {"AUTH", user, password};
        size_t lens[3] = {4, user ? strlen(user) : 0, strlen(password)};
        if (!user) {
            argv[1] = password;
            lens[1] = lens[2];
        }
        rc = wxg__rconn_append(c, user ? 3 : 2, argv, lens);
        step[n++] = AUTH;
    }
    if (rc == 0 && db != 0) {
        rc = wxg__rconn_append(c, 2, (const char *[]){"SELECT", dbs}, (size_t[]){6, strlen(dbs)});
        step[n++] = SELECT;
    }
    if (rc == 0 && name && *name) {
        rc = wxg__rconn_append(c, 3, (const char *[]){"CLIENT", "SETNAME", name},
                               (size_t[]){6, 7, strlen(name)});
        step[n++] = SETNAME;
    }
    if (rc) {
        wxg__errf(errstr, errstr_size, "%s: out of memory", who);
        return rc;
    }
    if (n == 0)
        return 0;
    redisReply *r[STEPS] = {NULL};
    size_t got = 0;
    rc = wxg__rconn_exchange(c, timeout_ms, r, &got, errstr, errstr_size);
    /* The first refusal is the one to report: after a refused AUTH the others say NOAUTH. */
    for (size_t i = 0; rc == 0 && i < got; i++) {
        if (r[i]->type != REDIS_REPLY_ERROR)
            continue;
        rc = step[i] == AUTH ? WXG_EAUTH : wxg__rconn_refusal_code(r[i]->str, r[i]->len);
        /* Redis's text ("WRONGPASS invalid username-password pair ...") never echoes the
         * password, and neither does ours. */
        if (step[i] == AUTH)
            wxg__errf(errstr, errstr_size, "%s AUTH as user '%s' failed: %.*s", who,
                      user ? user : "default", (int)(r[i]->len > 160 ? 160 : r[i]->len), r[i]->str);
        else
            wxg__errf(errstr, errstr_size, "%s refused %s: %.*s", who, what[step[i]],
                      (int)(r[i]->len > 160 ? 160 : r[i]->len), r[i]->str);
    }
    for (size_t i = 0; i < got; i++)
        freeReplyObject(r[i]);
    return rc;
}

int wxg__rconn_idle_closed(wxg__rconn_t *c)
{
    if (c->dead)
        return 1;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0)
        return 0;
    /* Every reply is read before an exchange returns, so a readable idle socket holds an end of
     * file, a reset, or (TLS 1.3) a session ticket the server sent after the handshake. Only
     * the last is harmless: the TLS layer consumes it and has no data to give. */
    if (c->ssl) {
        char b[1];
        ERR_clear_error();
        int r = SSL_read(c->ssl, b, 1);
        if (r <= 0 && SSL_get_error(c->ssl, r) == SSL_ERROR_WANT_READ)
            return 0;
    }
    c->dead = 1;
    return 1;
}

int wxg__rconn_dead(const wxg__rconn_t *c)
{
    return c->dead;
}

const char *wxg__rconn_peer(const wxg__rconn_t *c)
{
    return c->peer;
}

void wxg__rconn_bytes(const wxg__rconn_t *c, uint64_t *out, uint64_t *in)
{
    *out = c->bytes_out;
    *in = c->bytes_in;
}

/* ---------------------------------------------------------------------------------------------
 * Backoff
 */

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64*: only for backoff jitter, never for tokens. */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ULL;
}

void wxg__rbackoff_init(wxg__rbackoff_t *b, int64_t min_ms, int64_t max_ms)
{
    memset(b, 0, sizeof *b);
    b->min_ms = min_ms > 0 ? min_ms : 1;
    b->max_ms = max_ms >= b->min_ms ? max_ms : b->min_ms;
    b->rng = ((uint64_t)(uintptr_t)b ^ (uint64_t)wxg__mono_us()) | 1;
}

int64_t wxg__rbackoff_wait(const wxg__rbackoff_t *b, int64_t now_ms)
{
    return now_ms < b->next_ms ? b->next_ms - now_ms : 0;
}

void wxg__rbackoff_failed(wxg__rbackoff_t *b, int64_t now_ms)
{
    int64_t step = b->step_ms ? b->step_ms * 2 : b->min_ms;
    if (step > b->max_ms)
        step = b->max_ms;
    b->step_ms = step;
    int64_t half = step / 2;
    b->next_ms =
        now_ms + half + (half > 0 ? (int64_t)(rng_next(&b->rng) % (uint64_t)(half + 1)) : 0);
}

void wxg__rbackoff_reset(wxg__rbackoff_t *b)
{
    b->step_ms = 0;
    b->next_ms = 0;
}
