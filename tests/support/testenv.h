/*
 * Test support: where the real servers are, and private servers for fault tests.
 *
 * The "services" CTest fixture (scripts/services.sh) starts one redis-server and one Kafka
 * broker on free loopback ports and writes their addresses as KEY=VALUE lines to the file named
 * by $WXG_TEST_ENV_FILE. An environment variable of the same name overrides a line of the file.
 * Keys: WXG_TEST_REDIS_HOST, WXG_TEST_REDIS_PORT, WXG_TEST_KAFKA_BOOTSTRAP.
 *
 * Tests that stop, pause (SIGSTOP) or restart Redis must not do that to the shared server, since
 * other tests may run at the same time: they start a private one with wxg_test_redis_start().
 *
 * Not thread-safe: call these from the test's main thread.
 */
#ifndef WXG_TESTENV_H
#define WXG_TESTENV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The value of `key`, or NULL when neither the environment nor the env file has it. */
const char *wxg_test_env(const char *key);

/* Like wxg_test_env(), but a missing key fails the current cmocka test with a clear message. */
const char *wxg_test_env_required(const char *key);

const char *wxg_test_redis_host(void);
int wxg_test_redis_port(void);
const char *wxg_test_kafka_bootstrap(void);

/* The timeout factor from $WXG_TEST_TIMEOUT_SCALE (>= 1). Multiply every wait by it. */
int wxg_test_scale(void);

/* Monotonic milliseconds. */
int64_t wxg_test_now_ms(void);

/* Sleeps `ms` milliseconds. */
void wxg_test_sleep_ms(int64_t ms);

/* A port on 127.0.0.1 that nothing listened on a moment ago, or -1. */
int wxg_test_free_port(void);

/* A TCP socket listening on 127.0.0.1 on a port the kernel picks, that port in *port; the socket,
 * or -1. */
int wxg_test_listen(int *port);

/* Writes all of buf to a blocking socket (MSG_NOSIGNAL: a closed peer is an error, never
 * SIGPIPE). 0 or -1. */
int wxg_test_send_all(int fd, const void *buf, size_t len);

/* A new empty directory under $TMPDIR (or /tmp) whose name starts with `tag`; the caller frees
 * the string and removes the directory (wxg_test_rmtree). NULL on failure. */
char *wxg_test_mkdtemp(const char *tag);

/* Removes a directory tree created by wxg_test_mkdtemp(). */
void wxg_test_rmtree(const char *path);

/* Waits at most timeout_ms (scaled) for the child `pid` to exit, then kills it (SIGKILL, by
 * PID) and reaps it. Returns its exit status, 128 + the signal that ended it, or -1 when it had
 * to be killed. */
int wxg_test_wait_child(pid_t pid, int64_t timeout_ms);

/* Runs the program at argv[0] with argv (NULL-terminated), stdin from the file `in` (NULL:
 * /dev/null), stdout and stderr into the files `out` and `err` (truncated). The child is killed
 * by the kernel should the test process die first. Waits at most timeout_ms (scaled), then
 * kills it by PID and returns -1; else returns its exit status, or 128 + the signal that ended
 * it. */
int wxg_test_run(const char *const *argv, const char *in, const char *out, const char *err,
                 int64_t timeout_ms);

/* A private redis-server, started and stopped by the test that owns it. */
typedef struct wxg_test_redis {
    pid_t pid;      /* 0 when not running */
    int port;       /* fixed for the life of the struct, also across restarts */
    char *dir;      /* working directory (data, log) */
    char *password; /* requirepass, or NULL */
    int replica_of; /* a replica of the server on 127.0.0.1 at this port; 0: a primary */
    char *monitors; /* a Sentinel watching the primary of this name (see below), or NULL */
    int monitored_port;
    int persistent; /* appendonly yes, appendfsync always: a restart keeps every write */
    /* TLS only (plain port 0, the TLS port is `port`) when tls_dir is set: the directory made
     * by wxg_test_pki_make(), the base name of the server's certificate there ("server",
     * "wrongname", "expired"), and whether a client certificate is required. */
    char *tls_dir;
    char *tls_cert;
    int tls_auth_clients;
    int cluster; /* --cluster-enabled yes (nodes.conf in dir, node timeout 2 s) */
    int starts;  /* servers the last start spawned before one served (1: the first port did) */
    /* A Unix socket only (--port 0, --unixsocketperm 700) when set: its path, in dir. The
     * server is then checked for readiness over the socket, and `port` means nothing. */
    char *unixsocket;
} wxg_test_redis_t;

/* A Redis Cluster on loopback: `primaries` primaries with `replicas` replicas each, made with
 * `redis-cli --cluster create`, private to the test that starts it. */
#define WXG_TEST_CLUSTER_MAX 12
typedef struct wxg_test_cluster {
    wxg_test_redis_t node[WXG_TEST_CLUSTER_MAX];
    int n;
    char seeds[WXG_TEST_CLUSTER_MAX * 24]; /* "127.0.0.1:port,..." of every node */
} wxg_test_cluster_t;

/* Starts one cluster-enabled node that belongs to no cluster yet (a plain one, no TLS). 0 or
 * -1; stop it with wxg_test_redis_stop(). */
int wxg_test_cluster_node_start(wxg_test_redis_t *r);

/* Starts the nodes, creates the cluster (slots spread evenly over the primaries, replicas
 * assigned by redis-cli), and waits until every node reports cluster_state:ok with all 16384
 * slots served and every replica's link is up. 0, or -1 with the reason printed (the nodes
 * started are stopped). */
int wxg_test_cluster_start(wxg_test_cluster_t *c, int primaries, int replicas);

/* The same with every node on TLS only (the PKI's "server" certificate, no client certificate
 * required), the cluster bus and replication over TLS too (tls-cluster, tls-replication). */
int wxg_test_cluster_start_tls(wxg_test_cluster_t *c, int primaries, int replicas, const char *pki);

/* Waits until every running node reports cluster_state:ok and all slots ok, at most
 * timeout_ms (scaled). 0 or -1. */
int wxg_test_cluster_wait_ok(const wxg_test_cluster_t *c, int64_t timeout_ms);

/* The index in c->node of the primary serving `slot` according to node `via` (CLUSTER
 * SHARDS), or -1. */
int wxg_test_cluster_owner(const wxg_test_cluster_t *c, int via, int slot);

/* Moves `count` of the slots that primary `from` serves (its lowest ones) to primary `to`
 * (indices in c->node), the way `redis-cli --cluster reshard` does, `group` slots at a time:
 * the group's slots IMPORTING on the target and MIGRATING on the source; half of their keys
 * moved with MIGRATE, a pause of pause_ms / 2, the other half, another pause (meanwhile the
 * source answers ASK for a key that already moved, and TRYAGAIN for a multi-key command over
 * keys on both sides); then SETSLOT NODE on the target, the source and every other primary.
 * Plain (not TLS) clusters only. It touches no cmocka state, so a test may run it on a thread
 * of its own. Returns the number of slots moved (and the keys in *keys, may be NULL), or -1
 * with the reason printed; every command waits at most 5 s. */
int wxg_test_cluster_move_slots(const wxg_test_cluster_t *c, int from, int to, int count, int group,
                                int pause_ms, long *keys);

/* The index in c->node of every primary (in c->node order) into idx; returns how many. */
int wxg_test_cluster_primaries(const wxg_test_cluster_t *c, int *idx, int cap);
/* The index in c->node of every running replica of the primary c->node[primary] into idx;
 * returns how many. */
int wxg_test_cluster_replicas_of(const wxg_test_cluster_t *c, int primary, int *idx, int cap);

/* Stops every node and removes their directories. */
void wxg_test_cluster_stop(wxg_test_cluster_t *c);

/* A new directory with the test PKI (tests/support/mkpki.sh says what is in it): a CA, server
 * certificates for localhost and 127.0.0.1 (also a wrong-name and an expired one), a client
 * certificate, an unrelated CA. The caller frees the string and removes the directory
 * (wxg_test_rmtree). NULL on failure, with the reason printed. */
char *wxg_test_pki_make(void);

/* Starts a TLS-only redis-server (no persistence, no password) whose certificate is
 * `cert` ("server", "wrongname", "expired") from the PKI in `pki`, requiring a client
 * certificate when auth_clients is 1. Returns 0 or -1. */
int wxg_test_redis_start_tls(wxg_test_redis_t *r, const char *pki, const char *cert,
                             int auth_clients);

/* A Sentinel like wxg_test_sentinel_start() (no password) that listens on TLS only and reaches
 * the primary it monitors over TLS, both with the PKI's "server" certificate. */
int wxg_test_sentinel_start_tls(wxg_test_redis_t *r, const char *master, int primary_port,
                                const char *pki);

/* The server program the tests start: redis-server, or what WXG_TEST_REDIS_SERVER names. */
const char *wxg_test_redis_server_bin(void);

/* Starts redis-server on a free port with persistence off, waits until it answers PING.
 * `password` may be NULL. Returns 0 or -1. */
int wxg_test_redis_start(wxg_test_redis_t *r, const char *password);

/* The same listening on a Unix socket only, r->unixsocket (<dir>/redis.sock), and on no TCP
 * port. Returns 0 or -1. */
int wxg_test_redis_start_unix(wxg_test_redis_t *r);

/* The same with persistence on (appendonly yes, appendfsync always, in r->dir), so that
 * wxg_test_redis_restart() brings back every write acknowledged before it. No password. */
int wxg_test_redis_start_persistent(wxg_test_redis_t *r);

/* The same, as a replica of the server at 127.0.0.1:primary_port (no password). */
int wxg_test_redis_start_replica(wxg_test_redis_t *r, int primary_port);

/* Starts a Redis Sentinel (redis-server --sentinel) on a free port that monitors the primary at
 * 127.0.0.1:primary_port under the name `master`, with quorum 1, down-after 1 s and a failover
 * timeout of 5 s, so that a test can fail over in seconds. `password` (may be NULL) is the
 * Sentinel's own requirepass. Stop it like a server. */
int wxg_test_sentinel_start(wxg_test_redis_t *r, const char *master, int primary_port,
                            const char *password);

/* Waits until the replica's link to its primary is up, for at most timeout_ms (scaled).
 * Start a Sentinel only after this, so that it learns of the replica at once. 0 or -1. */
int wxg_test_redis_wait_link(const wxg_test_redis_t *replica, int64_t timeout_ms);

/* Fails over the primary the Sentinel knows as `master` to the replica at 127.0.0.1:new_port
 * (SENTINEL FAILOVER, repeated while the Sentinel has not yet heard from the replica), then
 * waits until the Sentinel names it, it reports the master role, and the old primary at
 * old_port reports the replica role (the Sentinel closes the old primary's clients then).
 * Bounded by timeout_ms (scaled) for each wait. 0, or -1 with the reason printed. */
int wxg_test_sentinel_failover(const wxg_test_redis_t *sentinel, const char *master, int new_port,
                               int old_port, int64_t timeout_ms);

/* Stops it (SIGCONT + SIGTERM, then SIGKILL after 5 s) and waits for the process. Keeps the
 * port and directory so that wxg_test_redis_restart() can reuse them. */
void wxg_test_redis_kill(wxg_test_redis_t *r);

/* Kills the server and starts it again on the same port: empty, unless it is persistent.
 * Returns 0 or -1. */
int wxg_test_redis_restart(wxg_test_redis_t *r);

/* Kills the server and removes its directory. Safe on a struct that never started. */
void wxg_test_redis_stop(wxg_test_redis_t *r);

#endif /* WXG_TESTENV_H */
