/*
 * The benchmark's own Redis connections over lib/rconn.c (bench_redis.h): one module connects
 * every Redis user of wxguard, the benchmark included, so a benchmark reaches a TLS-only or
 * ACL-protected server exactly as the guard it measures does. This file only adapts the
 * connection layer's calls to the benchmark's habits: a reply per call, pipelines whose replies
 * the connection keeps until the next call (waited for, or collected without waiting by a thread
 * that polls several connections), and the error text kept with the connection.
 *
 * Threads: none of its own; a connection belongs to the thread using it. Failure: the layer's
 * (any I/O error or timeout kills the connection), reported through wxgb_redis_errstr().
 */
#include "bench_redis.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rconn_int.h"
#include "wxguard/err.h"

/* The probes' smallest command timeout. */
#define PROBE_TIMEOUT_MS 30000
/* Arguments of one wxgb_redis_cmd / wxgb_redis_append call. */
#define ARGS_MAX 15

struct wxgb_redis {
    wxg__rconn_t *conn;
    int timeout_ms;
    size_t pending;       /* commands appended since the last exchange */
    int broken;           /* an append failed: the pipeline is incomplete */
    int collecting;       /* wxgb_redis_replies_some has replies still to come */
    redisReply **replies; /* the last pipeline's replies */
    size_t nreplies, cap;
    char err[512];
};

wxgb_redis_t *wxgb_redis_connect(const wxg_guard_conf_t *gc, const char *host, int port,
                                 char *errstr, size_t errstr_size)
{
    wxgb_redis_t *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    wxg__rtls_conf_t tls = {.ca_file = gc->tls_ca_file,
                            .ca_path = gc->tls_ca_path,
                            .cert_file = gc->tls_cert_file,
                            .key_file = gc->tls_key_file,
                            .key_password = gc->tls_key_password,
                            .server_name = gc->tls_server_name,
                            .verify = gc->tls_verify};
    wxg__rconn_opts_t o = {.host = host ? host : gc->host,
                           .port = host ? port : gc->port,
                           .unix_path = host ? NULL : gc->unix_path,
                           .connect_timeout_ms = gc->connect_timeout_ms,
                           .tls = gc->tls ? &tls : NULL};
    r->timeout_ms =
        gc->command_timeout_ms > PROBE_TIMEOUT_MS ? gc->command_timeout_ms : PROBE_TIMEOUT_MS;
    int rc = 0;
    r->conn = wxg__rconn_connect(&o, &rc, errstr, errstr_size);
    if (!r->conn)
        goto fail;
    char who[320];
    snprintf(who, sizeof who, "Redis %s", wxg__rconn_peer(r->conn));
    if (wxg__rconn_hello(r->conn, r->timeout_ms, who, gc->user, gc->password, host ? 0 : gc->db,
                         gc->client_name, errstr, errstr_size) != 0)
        goto fail;
    return r;
fail:
    wxgb_redis_free(r);
    return NULL;
}

static void drop_replies(wxgb_redis_t *r)
{
    for (size_t i = 0; i < r->nreplies; i++)
        freeReplyObject(r->replies[i]);
    r->nreplies = 0;
}

void wxgb_redis_free(wxgb_redis_t *r)
{
    if (r) {
        drop_replies(r);
        free(r->replies);
        wxg__rconn_free(r->conn);
    }
    free(r);
}

const char *wxgb_redis_errstr(const wxgb_redis_t *r)
{
    return r->err;
}

void wxgb_redis_append_argv(wxgb_redis_t *r, int argc, const char **argv, const size_t *lens)
{
    if (r->broken)
        return;
    int rc = wxg__rconn_append(r->conn, argc, argv, lens);
    if (rc) {
        snprintf(r->err, sizeof r->err, "Redis %s: %s", wxg__rconn_peer(r->conn),
                 rc == WXG_ENOMEM ? "out of memory" : "the connection is closed");
        r->broken = 1;
        return;
    }
    r->pending++;
}

/* Appends a command of a NULL-terminated list of NUL-terminated strings. */
static void vappend(wxgb_redis_t *r, const char *arg, va_list ap)
{
    const char *argv[ARGS_MAX];
    int n = 0;
    for (const char *a = arg; a; a = va_arg(ap, const char *)) {
        if (n == ARGS_MAX) {
            snprintf(r->err, sizeof r->err, "%s: more than %d arguments", arg, ARGS_MAX);
            r->broken = 1;
            return;
        }
        argv[n++] = a;
    }
    wxgb_redis_append_argv(r, n, argv, NULL);
}

void wxgb_redis_append(wxgb_redis_t *r, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    vappend(r, arg, ap);
    va_end(ap);
}

/* The start of a pipeline's exchange: drops the last replies, takes the count of the commands
 * appended into *want and makes room for their replies. -1 when the pipeline cannot be sent. */
static int begin_exchange(wxgb_redis_t *r, size_t *want)
{
    drop_replies(r);
    *want = r->pending;
    r->pending = 0;
    if (r->broken)
        return -1;
    if (*want > r->cap || !r->replies) {
        /* Room for one at least: an empty pipeline answers an array, not NULL. */
        size_t cap = *want ? *want : 1;
        redisReply **p = realloc(r->replies, cap * sizeof *p);
        if (!p) {
            snprintf(r->err, sizeof r->err, "out of memory");
            r->broken = 1;
            return -1;
        }
        r->replies = p;
        r->cap = cap;
    }
    return 0;
}

redisReply **wxgb_redis_replies(wxgb_redis_t *r, size_t *n)
{
    size_t want = 0;
    *n = 0;
    if (r->collecting) {
        snprintf(r->err, sizeof r->err, "a pipeline sent while another is being collected");
        r->broken = 1;
    }
    if (begin_exchange(r, &want) != 0)
        return NULL;
    if (want == 0)
        return r->replies;
    size_t got = 0;
    int rc = wxg__rconn_exchange(r->conn, r->timeout_ms, r->replies, &got, r->err, sizeof r->err);
    r->nreplies = got;
    if (rc) {
        r->broken = 1;
        return NULL;
    }
    *n = got;
    return r->replies;
}

int wxgb_redis_fd(const wxgb_redis_t *r)
{
    return wxg__rconn_fd(r->conn);
}

redisReply **wxgb_redis_replies_some(wxgb_redis_t *r, size_t *n, short *events)
{
    *n = 0;
    *events = 0;
    if (!r->collecting) {
        size_t want = 0;
        if (begin_exchange(r, &want) != 0)
            return NULL;
        if (want == 0)
            return r->replies;
        r->collecting = 1;
    }
    int rc =
        wxg__rconn_collect_some(r->conn, r->replies, &r->nreplies, events, r->err, sizeof r->err);
    if (rc) {
        r->collecting = 0;
        r->broken = 1;
        *events = 0;
        return NULL;
    }
    if (*events)
        return NULL;
    r->collecting = 0;
    *n = r->nreplies;
    return r->replies;
}

/* The reply of the one command just appended, handed to the caller. */
static redisReply *one_reply(wxgb_redis_t *r)
{
    if (r->pending > 1) {
        snprintf(r->err, sizeof r->err, "a command sent while a pipeline waits");
        r->broken = 1;
    }
    size_t n = 0;
    redisReply **rep = wxgb_redis_replies(r, &n);
    if (!rep || n != 1)
        return NULL;
    r->nreplies = 0;
    return rep[0];
}

redisReply *wxgb_redis_cmd_argv(wxgb_redis_t *r, int argc, const char **argv, const size_t *lens)
{
    wxgb_redis_append_argv(r, argc, argv, lens);
    return one_reply(r);
}

redisReply *wxgb_redis_cmd(wxgb_redis_t *r, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    vappend(r, arg, ap);
    va_end(ap);
    return one_reply(r);
}
