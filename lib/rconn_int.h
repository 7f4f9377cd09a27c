/*
 * Internal to libwxguard: wxguard's Redis connection (lib/rconn.c).
 *
 * hiredis does the protocol and nothing else here: its command formatter turns arguments into
 * RESP and its reader turns bytes into replies (neither does I/O). The sockets are ours: TCP
 * (TCP_NODELAY, keepalive) or a Unix socket, optionally TLS through OpenSSL, always
 * non-blocking, every step waited on with poll() against a deadline. That is what lets one
 * connection keep its timeouts on every path (connect, TLS handshake, a reply that stops
 * halfway) and lets a caller hold pipelines to several servers at once.
 *
 * A connection carries pipelines: append any number of commands, then one exchange sends them
 * and reads exactly as many replies, replies[i] answering the i-th command appended. When an
 * exchange fails part-way, it says how many replies arrived; the commands after those have an
 * unknown outcome (they may have run), and the connection is dead.
 *
 * Ownership and threads: a connection belongs to one thread at a time and is not locked. Every
 * failure leaves it dead (as a hiredis context after an error): free it and connect again. The
 * strings of the options are borrowed for the call that takes them. Replies are the caller's,
 * freed with freeReplyObject(). Error texts never contain a password or a key password.
 */
#ifndef WXG_RCONN_INT_H
#define WXG_RCONN_INT_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wxg__rconn wxg__rconn_t;

/* TLS settings (docs/operating.md). Strings may be NULL. */
typedef struct wxg__rtls_conf {
    const char *ca_file;      /* trusted CAs (PEM); with ca_path NULL too: the system's store */
    const char *ca_path;      /* a directory of hashed CA certificates (c_rehash) */
    const char *cert_file;    /* client certificate (PEM, chain allowed) for mutual TLS */
    const char *key_file;     /* its private key; NULL: in cert_file */
    const char *key_password; /* the key's pass phrase, or NULL; a secret */
    const char *server_name;  /* SNI and the name verified; NULL: the host connected to */
    int verify;               /* 0: accept any certificate (testing only) */
} wxg__rtls_conf_t;

typedef struct wxg__rconn_opts {
    const char *host; /* name or address; ignored when unix_path is set */
    int port;
    const char *unix_path;       /* a Unix socket, or NULL */
    int connect_timeout_ms;      /* the TCP connect and the TLS handshake together */
    const wxg__rtls_conf_t *tls; /* NULL: plain TCP */
    const char *role;            /* names the server in error texts; NULL: "Redis" */
} wxg__rconn_opts_t;

/* Connects (and completes the TLS handshake) within connect_timeout_ms. Name resolution
 * (getaddrinfo) is the one step without a deadline: the system resolver has its own timeouts.
 * Returns the connection, or NULL with *rc (WXG_ECONN, WXG_ETIMEDOUT, WXG_ENOMEM, WXG_ECONFIG
 * for TLS files that cannot be loaded) and errstr naming the server and the cause. */
wxg__rconn_t *wxg__rconn_connect(const wxg__rconn_opts_t *o, int *rc, char *errstr,
                                 size_t errstr_size);

/* Closes the socket and frees everything, also commands appended and not sent. NULL is
 * accepted. */
void wxg__rconn_free(wxg__rconn_t *c);

/* Formats one command (argc binary-safe arguments) into the send buffer. Nothing is sent until
 * wxg__rconn_exchange. 0, WXG_ENOMEM or WXG_ECONN (the connection is dead). */
int wxg__rconn_append(wxg__rconn_t *c, int argc, const char **argv, const size_t *lens);

/* Sends every appended command and reads one reply per command into replies[] (room for as
 * many as were appended), all within timeout_ms. Returns 0 when every reply arrived (an error
 * reply is a reply). Otherwise the connection is dead, errstr says why, *got (may be NULL)
 * holds how many replies arrived (replies[0..*got), the caller's), and the code is
 * WXG_ETIMEDOUT, WXG_ECONN (closed, reset, TLS or protocol error) or WXG_ENOMEM. */
int wxg__rconn_exchange(wxg__rconn_t *c, int timeout_ms, redisReply **replies, size_t *got,
                        char *errstr, size_t errstr_size);

/* The two halves of an exchange, for pipelines to several servers at once: flush every
 * connection first (each server then works on its commands while the others are written),
 * then collect from each. flush writes all appended commands by the monotonic deadline_ms
 * (wxg__mono_ms), reading replies into the reader meanwhile when the socket is full. collect
 * reads the replies of every command appended, sending what flush had not. Their results and
 * failures are those of wxg__rconn_exchange. */
int wxg__rconn_flush(wxg__rconn_t *c, int64_t deadline_ms, char *errstr, size_t errstr_size);
int wxg__rconn_collect(wxg__rconn_t *c, int64_t deadline_ms, redisReply **replies, size_t *got,
                       char *errstr, size_t errstr_size);

/* collect without waiting, for a caller that waits on several connections at once: reads the
 * replies that have arrived into replies[*got..] (advancing *got; start with 0), sending what
 * flush had not. 0 with *events == 0: every reply is in. 0 with *events != 0: more are due;
 * poll wxg__rconn_fd for those events, then call again. Otherwise the connection failed as in
 * wxg__rconn_collect. A caller whose deadline passes first ends the exchange with
 * wxg__rconn_expired (the connection is dead then; errstr says how many replies came). */
int wxg__rconn_collect_some(wxg__rconn_t *c, redisReply **replies, size_t *got, short *events,
                            char *errstr, size_t errstr_size);
int wxg__rconn_fd(const wxg__rconn_t *c);
int wxg__rconn_expired(wxg__rconn_t *c, size_t got, char *errstr, size_t errstr_size);

/* 1 when the connection failed and must be freed. */
int wxg__rconn_dead(const wxg__rconn_t *c);

/* "host:port" or the socket path, for error texts; valid as long as the connection. */
const char *wxg__rconn_peer(const wxg__rconn_t *c);

/* One command, one reply (*out, the caller's): append + exchange. */
int wxg__rconn_command(wxg__rconn_t *c, int timeout_ms, int argc, const char **argv,
                       const size_t *lens, redisReply **out, char *errstr, size_t errstr_size);

/* The connection's opening, pipelined in one round trip: AUTH [user] password (when password
 * is not NULL), SELECT db (when db is not 0), CLIENT SETNAME name (when name is not NULL nor
 * empty). `who` names the server in error texts ("Redis 10.0.0.1:6379"). Returns 0, WXG_EAUTH
 * (a refused AUTH, or NOAUTH/NOPERM on the others), WXG_EREDIS (another refusal), or the
 * exchange's code. */
int wxg__rconn_hello(wxg__rconn_t *c, int timeout_ms, const char *who, const char *user,
                     const char *password, int db, const char *name, char *errstr,
                     size_t errstr_size);

/* 1 when the server closed the connection (or sent something nobody asked for) while it was
 * idle between exchanges: the next command would fail with an unknown outcome, so the caller
 * connects again first. Costs one poll() when the socket is quiet. 0: it looks alive. */
int wxg__rconn_idle_closed(wxg__rconn_t *c);

/* Bytes sent and received since the connection was made. */
void wxg__rconn_bytes(const wxg__rconn_t *c, uint64_t *out, uint64_t *in);

/* Classifies an error reply's text: WXG_EAUTH for NOAUTH, WRONGPASS and NOPERM, else
 * WXG_EREDIS. */
int wxg__rconn_refusal_code(const char *str, size_t len);

/* ---- Reconnect backoff ---- */

/* Capped exponential backoff with jitter: after each failed connect the next attempt waits
 * between half and all of the current step, which doubles from min_ms up to max_ms. */
typedef struct wxg__rbackoff {
    int64_t min_ms, max_ms;
    int64_t step_ms; /* 0: no failure since the last success */
    int64_t next_ms; /* monotonic ms before which no attempt is made */
    uint64_t rng;
} wxg__rbackoff_t;

void wxg__rbackoff_init(wxg__rbackoff_t *b, int64_t min_ms, int64_t max_ms);
/* 0 when an attempt may be made at monotonic time now_ms, else the ms left to wait. */
int64_t wxg__rbackoff_wait(const wxg__rbackoff_t *b, int64_t now_ms);
void wxg__rbackoff_failed(wxg__rbackoff_t *b, int64_t now_ms);
void wxg__rbackoff_reset(wxg__rbackoff_t *b);

#endif /* WXG_RCONN_INT_H */
