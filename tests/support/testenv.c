/*
 * DESIGN: test support (see testenv.h). Reads the fixture's env file once; starts private
 * redis-server processes with fork/exec and stops them by PID, never by name. A started server
 * counts as up when the server on its port (or Unix socket) reports the PID we forked (INFO
 * server), not merely when something there answers PING; the child is reaped with waitpid, so a PID
 * is ours until then.
 */
#define _XOPEN_SOURCE 700
#include "testenv.h"

#include "rconn_int.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hiredis/hiredis.h>
#include <sys/prctl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_VARS 64

static struct {
    int loaded;
    int n;
    char *key[MAX_VARS];
    char *val[MAX_VARS];
} env_file;

static void env_load(void)
{
    if (env_file.loaded)
        return;
    env_file.loaded = 1;
    const char *path = getenv("WXG_TEST_ENV_FILE");
    if (!path)
        return;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[1024];
    while (env_file.n < MAX_VARS && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *eq = strchr(line, '=');
        if (!eq || line[0] == '#')
            continue;
        *eq = '\0';
        env_file.key[env_file.n] = strdup(line);
        env_file.val[env_file.n] = strdup(eq + 1);
        env_file.n++;
    }
    fclose(f);
}

const char *wxg_test_env(const char *key)
{
    const char *v = getenv(key);
    if (v && *v)
        return v;
    env_load();
    for (int i = 0; i < env_file.n; i++) {
        if (strcmp(env_file.key[i], key) == 0)
            return env_file.val[i];
    }
    return NULL;
}

const char *wxg_test_env_required(const char *key)
{
    const char *v = wxg_test_env(key);
    if (!v)
        fail_msg("%s is not set: run this test through ctest so that the services fixture starts "
                 "the real servers (env file: %s)",
                 key, getenv("WXG_TEST_ENV_FILE") ? getenv("WXG_TEST_ENV_FILE") : "(none)");
    return v;
}

const char *wxg_test_redis_host(void)
{
    return wxg_test_env_required("WXG_TEST_REDIS_HOST");
}

int wxg_test_redis_port(void)
{
    return (int)strtol(wxg_test_env_required("WXG_TEST_REDIS_PORT"), NULL, 10);
}

const char *wxg_test_kafka_bootstrap(void)
{
    return wxg_test_env_required("WXG_TEST_KAFKA_BOOTSTRAP");
}

int wxg_test_scale(void)
{
    const char *s = getenv("WXG_TEST_TIMEOUT_SCALE");
    long v = s ? strtol(s, NULL, 10) : 1;
    return v >= 1 ? (int)v : 1;
}

int64_t wxg_test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void wxg_test_sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* A TCP socket bound to 127.0.0.1 on a port the kernel picks, listening when backlog > 0; the
 * socket (its port in *port) or -1. */
static int loopback_socket(int backlog, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || (backlog > 0 && listen(fd, backlog)) ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

int wxg_test_free_port(void)
{
    int port = -1, fd = loopback_socket(0, &port);
    if (fd < 0)
        return -1;
    close(fd);
    return port;
}

int wxg_test_listen(int *port)
{
    return loopback_socket(16, port);
}

int wxg_test_send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

char *wxg_test_mkdtemp(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char buf[512];
    snprintf(buf, sizeof buf, "%s/%s.XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(buf))
        return NULL;
    return strdup(buf);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void wxg_test_rmtree(const char *path)
{
    if (path && *path)
        nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int wxg_test_wait_child(pid_t pid, int64_t timeout_ms)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (wxg_test_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        wxg_test_sleep_ms(20);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int wxg_test_run(const char *const *argv, const char *in, const char *out, const char *err,
                 int64_t timeout_ms)
{
    pid_t pid = fork();
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int i0 = open(in ? in : "/dev/null", O_RDONLY),
            o1 = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600),
            e2 = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (i0 < 0 || o1 < 0 || e2 < 0)
            _exit(120);
        dup2(i0, 0);
        dup2(o1, 1);
        dup2(e2, 2);
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    return wxg_test_wait_child(pid, timeout_ms);
}

/* True when the server on srv's port (or Unix socket) answers as process `pid` and serves
 * data: INFO server names that process id, and PING answers PONG. A PING alone would take any
 * server for ours, such as one that took the port between wxg_test_free_port() and the exec; INFO
 * alone answers while a restarted server still loads its append-only file, when every data command
 * (DBSIZE, the guard's scripts) gets -LOADING. Every step is bounded by a 300 ms socket timeout. */
static int redis_serves_tls(const wxg_test_redis_t *r, pid_t pid);

/* The server and cli programs: redis-server and redis-cli, or what WXG_TEST_REDIS_SERVER and
 * WXG_TEST_REDIS_CLI name (a path or a name on PATH), so that one suite runs against another
 * server of the same protocol (scripts/test.sh's valkey phase: valkey-server, valkey-cli). */
static const char *redis_program(const char *var, const char *def)
{
    const char *v = getenv(var);
    return v && *v ? v : def;
}

const char *wxg_test_redis_server_bin(void)
{
    return redis_program("WXG_TEST_REDIS_SERVER", "redis-server");
}

static const char *redis_cli_bin(void)
{
    return redis_program("WXG_TEST_REDIS_CLI", "redis-cli");
}

static int redis_serves(const wxg_test_redis_t *srv, pid_t pid)
{
    struct timeval tv = {.tv_sec = 0, .tv_usec = 300000};
    const char *password = srv->password;
    redisContext *c = srv->unixsocket ? redisConnectUnixWithTimeout(srv->unixsocket, tv)
                                      : redisConnectWithTimeout("127.0.0.1", srv->port, tv);
    redisReply *r = NULL;
    const char *at = NULL;
    int ok = 0;
    if (!c || c->err || redisSetTimeout(c, tv) != REDIS_OK)
        goto out;
    if (password) {
        r = redisCommand(c, "AUTH %s", password);
        if (!r || r->type == REDIS_REPLY_ERROR)
            goto out;
        freeReplyObject(r);
    }
    r = redisCommand(c, "INFO server");
    at = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "\nprocess_id:") : NULL;
    if (at) {
        char *end;
        errno = 0;
        long v = strtol(at + strlen("\nprocess_id:"), &end, 10);
        ok = errno == 0 && end != at && (*end == '\r' || *end == '\n') && v == (long)pid;
    }
    if (ok) {
        freeReplyObject(r);
        r = redisCommand(c, "PING");
        ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
    }
out:
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

/* Writes the Sentinel's configuration file (Sentinel rewrites it as it learns), whose path
 * goes in `path`. 0 or -1. */
static int sentinel_conf(const wxg_test_redis_t *r, char *path, size_t size)
{
    snprintf(path, size, "%s/sentinel.conf", r->dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f,
            "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s/sentinel.log\n"
            "sentinel monitor %s 127.0.0.1 %d 1\n"
            "sentinel down-after-milliseconds %s 1000\n"
            "sentinel failover-timeout %s 5000\n",
            r->port, r->dir, r->dir, r->monitors, r->monitored_port, r->monitors, r->monitors);
    if (r->password)
        fprintf(f, "requirepass %s\n", r->password);
    if (r->tls_dir)
        fprintf(f,
                "port 0\ntls-port %d\ntls-cert-file %s/%s.crt\ntls-key-file %s/%s.key\n"
                "tls-ca-cert-file %s/ca.crt\ntls-auth-clients no\ntls-replication yes\n",
                r->port, r->tls_dir, r->tls_cert, r->tls_dir, r->tls_cert, r->tls_dir);
    return fclose(f) == 0 ? 0 : -1;
}

/* Says on stderr why server r did not start: what happened and the last line its log holds
 * (Redis logs the reason it exits, such as a port it cannot bind), so a fixture that gives up
 * leaves the cause in the test's output. */
static void spawn_failed(const wxg_test_redis_t *r, const char *what, int status)
{
    char path[600], line[512], last[512] = "";
    snprintf(path, sizeof path, "%s/redis.log", r->dir);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
        if (line[0] != '\n')
            snprintf(last, sizeof last, "%s", line);
    if (f)
        fclose(f);
    last[strcspn(last, "\n")] = '\0';
    if (r->unixsocket)
        fprintf(stderr, "redis-server on %s %s (status %d): %s\n", r->unixsocket, what, status,
                last[0] ? last : "(nothing logged)");
    else
        fprintf(stderr, "redis-server on port %d %s (status %d): %s\n", r->port, what, status,
                last[0] ? last : "(nothing logged)");
}

static int redis_spawn(wxg_test_redis_t *r)
{
    char port[16], logfile[600], primary[16], conf[600];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(logfile, sizeof logfile, "%s/redis.log", r->dir);
    snprintf(primary, sizeof primary, "%d", r->replica_of);
    if (r->monitors && sentinel_conf(r, conf, sizeof conf) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* A test that fails skips its teardown: the server must not outlive the test process
         * (an orphan would also hold the test's output pipe open, and ctest would wait for it
         * until the test's timeout). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (r->monitors) {
            execlp(wxg_test_redis_server_bin(), "redis-server", conf, "--sentinel", (char *)NULL);
            _exit(127);
        }
        const char *argv[64];
        int i = 0;
        argv[i++] = "redis-server";
        argv[i++] = "--port";
        argv[i++] = r->tls_dir || r->unixsocket ? "0" : port;
        if (r->unixsocket) {
            argv[i++] = "--unixsocket";
            argv[i++] = r->unixsocket;
            argv[i++] = "--unixsocketperm";
            argv[i++] = "700";
        }
        char crt[600], key[600], ca[600];
        if (r->tls_dir) {
            snprintf(crt, sizeof crt, "%s/%s.crt", r->tls_dir, r->tls_cert);
            snprintf(key, sizeof key, "%s/%s.key", r->tls_dir, r->tls_cert);
            snprintf(ca, sizeof ca, "%s/ca.crt", r->tls_dir);
            argv[i++] = "--tls-port";
            argv[i++] = port;
            argv[i++] = "--tls-cert-file";
            argv[i++] = crt;
            argv[i++] = "--tls-key-file";
            argv[i++] = key;
            argv[i++] = "--tls-ca-cert-file";
            argv[i++] = ca;
            argv[i++] = "--tls-auth-clients";
            argv[i++] = r->tls_auth_clients ? "yes" : "no";
            argv[i++] = "--tls-replication"; /* a replica reaches its TLS-only primary */
            argv[i++] = "yes";
        }
        argv[i++] = "--bind";
        argv[i++] = "127.0.0.1";
        argv[i++] = "--dir";
        argv[i++] = r->dir;
        argv[i++] = "--save";
        argv[i++] = "";
        argv[i++] = "--appendonly";
        argv[i++] = r->persistent ? "yes" : "no";
        if (r->persistent) {
            argv[i++] = "--appendfsync";
            argv[i++] = "always";
        }
        argv[i++] = "--logfile";
        argv[i++] = logfile;
        argv[i++] = "--daemonize";
        argv[i++] = "no";
        if (r->password) {
            argv[i++] = "--requirepass";
            argv[i++] = r->password;
        }
        char ccrt[600], ckey[600];
        if (r->cluster && r->tls_dir) {
            /* The cluster bus over TLS too. A node authenticates to another's bus with a client
             * certificate whatever tls-auth-clients says, and the server certificate is for
             * serverAuth only: outgoing connections use the PKI's client certificate. */
            snprintf(ccrt, sizeof ccrt, "%s/client.crt", r->tls_dir);
            snprintf(ckey, sizeof ckey, "%s/client.key", r->tls_dir);
            argv[i++] = "--tls-cluster";
            argv[i++] = "yes";
            argv[i++] = "--tls-client-cert-file";
            argv[i++] = ccrt;
            argv[i++] = "--tls-client-key-file";
            argv[i++] = ckey;
        }
        if (r->cluster) {
            argv[i++] = "--cluster-enabled";
            argv[i++] = "yes";
            argv[i++] = "--cluster-config-file";
            argv[i++] = "nodes.conf"; /* in --dir */
            argv[i++] = "--cluster-node-timeout";
            argv[i++] = "2000";
        }
        if (r->replica_of > 0) {
            argv[i++] = "--replicaof";
            argv[i++] = "127.0.0.1";
            argv[i++] = primary;
        }
        argv[i] = NULL;
        execvp(wxg_test_redis_server_bin(), (char *const *)argv);
        _exit(127);
    }
    r->pid = pid;
    int64_t deadline = wxg_test_now_ms() + 10000 * wxg_test_scale();
    while (wxg_test_now_ms() < deadline) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            r->pid = 0;
            spawn_failed(r, "exited", status);
            return -1;
        }
        if (r->tls_dir ? redis_serves_tls(r, pid) : redis_serves(r, pid))
            return 0;
        wxg_test_sleep_ms(50);
    }
    spawn_failed(r, "did not become ready", 0);
    wxg_test_redis_kill(r);
    return -1;
}

/* True when nothing holds 127.0.0.1:port. Binding without SO_REUSEADDR is stricter than the
 * server's own bind, so a port this accepts, the server can take. */
static int port_is_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/* A port for server r. A cluster node also listens on its bus port, which Redis puts 10000
 * above the client port: an ephemeral port above 55535 makes the node exit at once ("port
 * number too high"), about one pick in five from Linux's default range, and a bus port some
 * other socket holds makes it exit too. Both are ruled out before the start. */
static int server_port(const wxg_test_redis_t *r)
{
    for (int pick = 0; pick < 200; pick++) {
        int port = wxg_test_free_port();
        if (port <= 0)
            return -1;
        if (!r->cluster)
            return port;
        if (port + 10000 <= 65535 && port_is_free(port + 10000))
            return port;
    }
    return -1;
}

static int start_on_free_port(wxg_test_redis_t *r)
{
    if (!r->dir)
        return -1;
    r->starts = 0;
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = server_port(r);
        r->starts++;
        if (r->port > 0 && redis_spawn(r) == 0)
            return 0;
    }
    return -1;
}

int wxg_test_redis_start_replica(wxg_test_redis_t *r, int primary_port)
{
    memset(r, 0, sizeof *r);
    r->dir = wxg_test_mkdtemp("wxg-redis");
    r->replica_of = primary_port;
    return start_on_free_port(r);
}

int wxg_test_sentinel_start(wxg_test_redis_t *r, const char *master, int primary_port,
                            const char *password)
{
    memset(r, 0, sizeof *r);
    r->dir = wxg_test_mkdtemp("wxg-sentinel");
    r->monitors = strdup(master);
    r->monitored_port = primary_port;
    r->password = password ? strdup(password) : NULL;
    return r->monitors && (!password || r->password) ? start_on_free_port(r) : -1;
}

int wxg_test_redis_start_unix(wxg_test_redis_t *r)
{
    memset(r, 0, sizeof *r);
    r->dir = wxg_test_mkdtemp("wxg-redis");
    if (!r->dir)
        return -1;
    size_t size = strlen(r->dir) + sizeof "/redis.sock";
    r->unixsocket = malloc(size);
    if (!r->unixsocket)
        return -1;
    snprintf(r->unixsocket, size, "%s/redis.sock", r->dir);
    /* No port to lose to another process: one start is enough. */
    r->starts = 1;
    return redis_spawn(r);
}

int wxg_test_redis_start_persistent(wxg_test_redis_t *r)
{
    memset(r, 0, sizeof *r);
    r->dir = wxg_test_mkdtemp("wxg-redis");
    r->persistent = 1;
    return start_on_free_port(r);
}

int wxg_test_redis_start(wxg_test_redis_t *r, const char *password)
{
    memset(r, 0, sizeof *r);
    r->dir = wxg_test_mkdtemp("wxg-redis");
    if (!r->dir)
        return -1;
    r->password = password ? strdup(password) : NULL;
    return start_on_free_port(r);
}

/* The value of `field` in INFO `section` of the server at `port` ("" when absent). */
static void info_field(int port, const char *section, const char *field, char *out, size_t size)
{
    out[0] = '\0';
    struct timeval tv = {.tv_sec = 2, .tv_usec = 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = c && !c->err ? redisCommand(c, "INFO %s", section) : NULL;
    const char *at = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, field) : NULL;
    if (at) {
        at += strlen(field);
        snprintf(out, size, "%.*s", (int)strcspn(at, "\r\n"), at);
    }
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
}

/* Polls INFO `section` of `port` until `field` reads `want`, for at most timeout_ms (scaled). */
static int wait_info(int port, const char *section, const char *field, const char *want,
                     int64_t timeout_ms)
{
    int64_t end = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    char v[64];
    for (;;) {
        info_field(port, section, field, v, sizeof v);
        if (strcmp(v, want) == 0)
            return 0;
        if (wxg_test_now_ms() > end) {
            fprintf(stderr, "port %d: %s is '%s', not '%s'\n", port, field, v, want);
            return -1;
        }
        wxg_test_sleep_ms(50);
    }
}

int wxg_test_redis_wait_link(const wxg_test_redis_t *replica, int64_t timeout_ms)
{
    return wait_info(replica->port, "replication", "master_link_status:", "up", timeout_ms);
}

/* The primary's port according to the Sentinel at `port`, or 0. */
static int sentinel_names(int port, const char *master)
{
    struct timeval tv = {.tv_sec = 2, .tv_usec = 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r =
        c && !c->err ? redisCommand(c, "SENTINEL get-master-addr-by-name %s", master) : NULL;
    int named =
        r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? atoi(r->element[1]->str) : 0;
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return named;
}

int wxg_test_sentinel_failover(const wxg_test_redis_t *sentinel, const char *master, int new_port,
                               int old_port, int64_t timeout_ms)
{
    struct timeval tv = {.tv_sec = 2, .tv_usec = 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", sentinel->port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return -1;
    }
    int64_t end = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    int ok = 0;
    while (!ok) {
        redisReply *r = redisCommand(c, "SENTINEL FAILOVER %s", master);
        ok = r && r->type == REDIS_REPLY_STATUS;
        if (!ok && wxg_test_now_ms() > end)
            fprintf(stderr, "SENTINEL FAILOVER: %s\n", r && r->str ? r->str : c->errstr);
        if (r)
            freeReplyObject(r);
        if (!ok && wxg_test_now_ms() > end)
            break;
        if (!ok)
            wxg_test_sleep_ms(200);
    }
    redisFree(c);
    if (!ok)
        return -1;
    end = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    while (sentinel_names(sentinel->port, master) != new_port) {
        if (wxg_test_now_ms() > end)
            return -1;
        wxg_test_sleep_ms(100);
    }
    if (wait_info(new_port, "replication", "role:", "master", timeout_ms) != 0)
        return -1;
    return wait_info(old_port, "replication", "role:", "slave", timeout_ms);
}

void wxg_test_redis_kill(wxg_test_redis_t *r)
{
    if (r->pid <= 0)
        return;
    kill(r->pid, SIGCONT);
    kill(r->pid, SIGTERM);
    int64_t deadline = wxg_test_now_ms() + 5000;
    int status;
    while (waitpid(r->pid, &status, WNOHANG) == 0) {
        if (wxg_test_now_ms() > deadline) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &status, 0);
            break;
        }
        wxg_test_sleep_ms(20);
    }
    r->pid = 0;
}

int wxg_test_redis_restart(wxg_test_redis_t *r)
{
    wxg_test_redis_kill(r);
    /* The port was just released; another process could take it, which the spawn detects. */
    return redis_spawn(r);
}

void wxg_test_redis_stop(wxg_test_redis_t *r)
{
    wxg_test_redis_kill(r);
    wxg_test_rmtree(r->dir);
    free(r->tls_dir);
    free(r->tls_cert);
    r->tls_dir = r->tls_cert = NULL;
    free(r->dir);
    free(r->password);
    free(r->monitors);
    free(r->unixsocket);
    r->dir = NULL;
    r->password = NULL;
    r->monitors = NULL;
    r->unixsocket = NULL;
}

/* The same check as redis_serves() over TLS, with the test PKI's client certificate and no
 * verification: the server may be the one with the expired or wrong-name certificate. */
static int redis_serves_tls(const wxg_test_redis_t *r, pid_t pid)
{
    char ca[600], crt[600], key[600], err[256];
    snprintf(ca, sizeof ca, "%s/ca.crt", r->tls_dir);
    snprintf(crt, sizeof crt, "%s/client.crt", r->tls_dir);
    snprintf(key, sizeof key, "%s/client.key", r->tls_dir);
    wxg__rtls_conf_t tls = {.ca_file = ca, .cert_file = crt, .key_file = key, .verify = 0};
    wxg__rconn_opts_t o = {
        .host = "127.0.0.1", .port = r->port, .connect_timeout_ms = 300, .tls = &tls};
    int rc = 0, ok = 0;
    wxg__rconn_t *c = wxg__rconn_connect(&o, &rc, err, sizeof err);
    redisReply *rep = NULL;
    if (!c)
        return 0;
    const char *argv[2] = {"INFO", "server"};
    size_t lens[2] = {4, 6};
    if (wxg__rconn_command(c, 300, 2, argv, lens, &rep, err, sizeof err) == 0 &&
        rep->type == REDIS_REPLY_STRING) {
        char want[40];
        snprintf(want, sizeof want, "\nprocess_id:%ld\r", (long)pid);
        ok = strstr(rep->str, want) != NULL;
    }
    if (rep)
        freeReplyObject(rep);
    rep = NULL;
    const char *ping[1] = {"PING"};
    size_t plen[1] = {4};
    if (ok && wxg__rconn_command(c, 300, 1, ping, plen, &rep, err, sizeof err) == 0)
        ok = rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "PONG") == 0;
    else
        ok = 0;
    if (rep)
        freeReplyObject(rep);
    wxg__rconn_free(c);
    return ok;
}

char *wxg_test_pki_make(void)
{
    char *dir = wxg_test_mkdtemp("wxg-pki");
    const char *src = getenv("WXG_SOURCE_DIR");
    if (!dir || !src) {
        fprintf(stderr, "wxg_test_pki_make: no directory or no WXG_SOURCE_DIR\n");
        free(dir);
        return NULL;
    }
    char script[600];
    snprintf(script, sizeof script, "%s/tests/support/mkpki.sh", src);
    pid_t pid = fork();
    if (pid < 0) {
        free(dir);
        return NULL;
    }
    if (pid == 0) {
        execl(script, script, dir, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "wxg_test_pki_make: %s failed (status %d)\n", script, st);
        wxg_test_rmtree(dir);
        free(dir);
        return NULL;
    }
    return dir;
}

/* Sets the TLS members of a zeroed struct; 0 or -1. */
static int tls_members(wxg_test_redis_t *r, const char *pki, const char *cert, int auth_clients)
{
    r->tls_dir = strdup(pki);
    r->tls_cert = strdup(cert);
    r->tls_auth_clients = auth_clients;
    return r->tls_dir && r->tls_cert ? 0 : -1;
}

int wxg_test_redis_start_tls(wxg_test_redis_t *r, const char *pki, const char *cert,
                             int auth_clients)
{
    memset(r, 0, sizeof *r);
    r->dir = wxg_test_mkdtemp("wxg-redis");
    if (tls_members(r, pki, cert, auth_clients) != 0)
        return -1;
    return start_on_free_port(r);
}

int wxg_test_sentinel_start_tls(wxg_test_redis_t *r, const char *master, int primary_port,
                                const char *pki)
{
    memset(r, 0, sizeof *r);
    r->dir = wxg_test_mkdtemp("wxg-sentinel");
    r->monitors = strdup(master);
    r->monitored_port = primary_port;
    if (!r->monitors || tls_members(r, pki, "server", 0) != 0)
        return -1;
    return start_on_free_port(r);
}

/* ---- Redis Cluster ---- */

/* Runs redis-cli with argv (NULL-terminated, after the program name), output to a log file in
 * `dir`; its exit status, or -1. Bounded by 60 s (scaled). */
static int run_redis_cli(const char *dir, const char *const *args)
{
    char log[600];
    snprintf(log, sizeof log, "%s/redis-cli.log", dir);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        const char *argv[64];
        int n = 0;
        argv[n++] = "redis-cli";
        for (int i = 0; args[i] && n < 63; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        execvp(redis_cli_bin(), (char *const *)argv);
        _exit(127);
    }
    int64_t end = wxg_test_now_ms() + 60000 * wxg_test_scale();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (wxg_test_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fprintf(stderr, "redis-cli %s did not finish in time\n", args[0]);
            return -1;
        }
        wxg_test_sleep_ms(50);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "redis-cli %s failed (status %d); see %s\n", args[0], st, log);
        return -1;
    }
    return 0;
}

/* One command on a node of a cluster, over TLS (with the PKI's client certificate, no
 * verification) when the node listens on TLS only; the reply (caller's) or NULL. */
static redisReply *node_command(const wxg_test_redis_t *n, int argc, const char **argv)
{
    char ca[600], crt[600], key[600], err[256];
    wxg__rtls_conf_t tls = {.ca_file = ca, .cert_file = crt, .key_file = key, .verify = 0};
    if (n->tls_dir) {
        snprintf(ca, sizeof ca, "%s/ca.crt", n->tls_dir);
        snprintf(crt, sizeof crt, "%s/client.crt", n->tls_dir);
        snprintf(key, sizeof key, "%s/client.key", n->tls_dir);
    }
    wxg__rconn_opts_t o = {.host = "127.0.0.1",
                           .port = n->port,
                           .connect_timeout_ms = 2000,
                           .tls = n->tls_dir ? &tls : NULL};
    int rc = 0;
    wxg__rconn_t *c = wxg__rconn_connect(&o, &rc, err, sizeof err);
    if (!c)
        return NULL;
    size_t lens[8];
    for (int i = 0; i < argc && i < 8; i++)
        lens[i] = strlen(argv[i]);
    redisReply *r = NULL;
    if (wxg__rconn_command(c, 5000, argc, argv, lens, &r, err, sizeof err) != 0)
        r = NULL;
    wxg__rconn_free(c);
    return r;
}

/* The value of `field` in INFO `section` of node n ("" when absent). */
static void node_info(const wxg_test_redis_t *n, const char *section, const char *field, char *out,
                      size_t size)
{
    out[0] = '\0';
    redisReply *r = node_command(n, 2, (const char *[]){"INFO", section});
    const char *at = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, field) : NULL;
    if (at) {
        at += strlen(field);
        snprintf(out, size, "%.*s", (int)strcspn(at, "\r\n"), at);
    }
    if (r)
        freeReplyObject(r);
}

int wxg_test_cluster_wait_ok(const wxg_test_cluster_t *c, int64_t timeout_ms)
{
    int64_t end = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    for (int i = 0; i < c->n; i++) {
        if (c->node[i].pid <= 0)
            continue;
        for (;;) {
            redisReply *r = node_command(&c->node[i], 2, (const char *[]){"CLUSTER", "INFO"});
            int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") &&
                     strstr(r->str, "cluster_slots_ok:16384");
            if (r)
                freeReplyObject(r);
            if (ok)
                break;
            if (wxg_test_now_ms() > end) {
                fprintf(stderr, "cluster node %d (port %d) is not ok\n", i, c->node[i].port);
                return -1;
            }
            wxg_test_sleep_ms(100);
        }
    }
    return 0;
}

int wxg_test_cluster_node_start(wxg_test_redis_t *r)
{
    memset(r, 0, sizeof *r);
    r->dir = wxg_test_mkdtemp("wxg-cluster");
    r->cluster = 1;
    return start_on_free_port(r);
}

static int cluster_start(wxg_test_cluster_t *c, int primaries, int replicas, const char *pki)
{
    memset(c, 0, sizeof *c);
    int total = primaries * (1 + replicas);
    if (primaries < 1 || total > WXG_TEST_CLUSTER_MAX)
        return -1;
    const char *args[WXG_TEST_CLUSTER_MAX + 16];
    char addr[WXG_TEST_CLUSTER_MAX][24], reps[8], ca[600];
    int na = 0;
    if (pki) {
        snprintf(ca, sizeof ca, "%s/ca.crt", pki);
        args[na++] = "--tls";
        args[na++] = "--cacert";
        args[na++] = ca;
    }
    args[na++] = "--cluster";
    args[na++] = "create";
    for (int i = 0; i < total; i++) {
        wxg_test_redis_t *r = &c->node[i];
        r->dir = wxg_test_mkdtemp("wxg-cluster");
        r->cluster = 1;
        if (pki && tls_members(r, pki, "server", 0) != 0) {
            c->n = i + 1;
            goto fail;
        }
        if (start_on_free_port(r) != 0) {
            fprintf(stderr, "cannot start cluster node %d\n", i);
            c->n = i + 1;
            goto fail;
        }
        c->n = i + 1;
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", r->port);
        args[na++] = addr[i];
        size_t len = strlen(c->seeds);
        snprintf(c->seeds + len, sizeof c->seeds - len, "%s%s", i ? "," : "", addr[i]);
    }
    snprintf(reps, sizeof reps, "%d", replicas);
    args[na++] = "--cluster-replicas";
    args[na++] = reps;
    args[na++] = "--cluster-yes";
    args[na] = NULL;
    if (run_redis_cli(c->node[0].dir, args) != 0)
        goto fail;
    if (wxg_test_cluster_wait_ok(c, 30000) != 0)
        goto fail;
    /* Every replica has its data link up. */
    for (int i = 0; i < c->n; i++) {
        char role[32], link[32];
        node_info(&c->node[i], "replication", "role:", role, sizeof role);
        if (strcmp(role, "slave") != 0)
            continue;
        int64_t end = wxg_test_now_ms() + 30000 * wxg_test_scale();
        for (;;) {
            node_info(&c->node[i], "replication", "master_link_status:", link, sizeof link);
            if (strcmp(link, "up") == 0)
                break;
            if (wxg_test_now_ms() > end) {
                fprintf(stderr, "cluster replica %d: link %s\n", c->node[i].port, link);
                goto fail;
            }
            wxg_test_sleep_ms(50);
        }
    }
    return 0;
fail:
    wxg_test_cluster_stop(c);
    return -1;
}

int wxg_test_cluster_start(wxg_test_cluster_t *c, int primaries, int replicas)
{
    return cluster_start(c, primaries, replicas, NULL);
}

int wxg_test_cluster_start_tls(wxg_test_cluster_t *c, int primaries, int replicas, const char *pki)
{
    return cluster_start(c, primaries, replicas, pki);
}

int wxg_test_cluster_owner(const wxg_test_cluster_t *c, int via, int slot)
{
    redisReply *r = node_command(&c->node[via], 2, (const char *[]){"CLUSTER", "SLOTS"});
    int owner = -1;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->elements < 3 || slot < e->element[0]->integer || slot > e->element[1]->integer)
            continue;
        long long port = e->element[2]->element[1]->integer;
        for (int k = 0; k < c->n; k++)
            if (c->node[k].port == port)
                owner = k;
    }
    if (r)
        freeReplyObject(r);
    return owner;
}

int wxg_test_cluster_primaries(const wxg_test_cluster_t *c, int *idx, int cap)
{
    int n = 0;
    for (int i = 0; i < c->n && n < cap; i++) {
        if (c->node[i].pid <= 0)
            continue;
        char role[32];
        node_info(&c->node[i], "replication", "role:", role, sizeof role);
        if (strcmp(role, "master") == 0)
            idx[n++] = i;
    }
    return n;
}

int wxg_test_cluster_replicas_of(const wxg_test_cluster_t *c, int primary, int *idx, int cap)
{
    char want[16];
    int n = 0;
    snprintf(want, sizeof want, "%d", c->node[primary].port);
    for (int i = 0; i < c->n && n < cap; i++) {
        if (c->node[i].pid <= 0 || i == primary)
            continue;
        char port[16];
        node_info(&c->node[i], "replication", "master_port:", port, sizeof port);
        if (strcmp(port, want) == 0)
            idx[n++] = i;
    }
    return n;
}

/* One command on a plain node; the reply (caller's), or NULL with the reason printed (an
 * error reply too, unless `errors_ok`). */
static redisReply *mv_cmd(redisContext *x, int port, int errors_ok, int argc, const char **argv,
                          const size_t *lens)
{
    redisReply *r = redisCommandArgv(x, argc, argv, lens);
    if (!r) {
        fprintf(stderr, "move slots: node %d: %s: %s\n", port, argv[0], x->errstr);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR && !errors_ok) {
        fprintf(stderr, "move slots: node %d: %s %s: %s\n", port, argv[0], argc > 1 ? argv[1] : "",
                r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

static int mv_ok(redisContext *x, int port, int argc, const char **argv)
{
    redisReply *r = mv_cmd(x, port, 0, argc, argv, NULL);
    if (r)
        freeReplyObject(r);
    return r ? 0 : -1;
}

static int mv_setslot(redisContext *x, int port, int slot, const char *how, const char *id)
{
    char s[16];
    snprintf(s, sizeof s, "%d", slot);
    return mv_ok(x, port, 5, (const char *[]){"CLUSTER", "SETSLOT", s, how, id});
}

/* The keys of a group's slots on the source, appended to *keys (each a reply element, kept
 * in *replies to be freed). */
typedef struct mv_keys {
    redisReply **replies;
    size_t nreplies;
    const redisReply **key;
    size_t n, cap;
} mv_keys;

static int mv_list(redisContext *x, int port, int slot, mv_keys *k)
{
    char s[16];
    snprintf(s, sizeof s, "%d", slot);
    redisReply *r =
        mv_cmd(x, port, 0, 4, (const char *[]){"CLUSTER", "GETKEYSINSLOT", s, "100000"}, NULL);
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        if (r)
            freeReplyObject(r);
        return -1;
    }
    redisReply **rs = realloc(k->replies, (k->nreplies + 1) * sizeof *rs);
    if (!rs) {
        freeReplyObject(r);
        return -1;
    }
    k->replies = rs;
    k->replies[k->nreplies++] = r;
    for (size_t i = 0; i < r->elements; i++) {
        if (k->n == k->cap) {
            size_t cap = k->cap ? 2 * k->cap : 64;
            const redisReply **kk = realloc(k->key, cap * sizeof *kk);
            if (!kk)
                return -1;
            k->key = kk;
            k->cap = cap;
        }
        k->key[k->n++] = r->element[i];
    }
    return 0;
}

static void mv_keys_free(mv_keys *k)
{
    for (size_t i = 0; i < k->nreplies; i++)
        freeReplyObject(k->replies[i]);
    free(k->replies);
    free(k->key);
    memset(k, 0, sizeof *k);
}

/* MIGRATE of keys [a, b) from the source to the target; a key gone meanwhile answers NOKEY. */
static int mv_migrate(redisContext *x, int port, int to_port, const mv_keys *k, size_t a, size_t b)
{
    char p[16];
    snprintf(p, sizeof p, "%d", to_port);
    for (size_t i = a; i < b; i++) {
        const char *argv[6] = {"MIGRATE", "127.0.0.1", p, k->key[i]->str, "0", "5000"};
        size_t lens[6] = {7, 9, strlen(p), k->key[i]->len, 1, 4};
        redisReply *r = mv_cmd(x, port, 0, 6, argv, lens);
        if (!r)
            return -1;
        freeReplyObject(r);
    }
    return 0;
}

int wxg_test_cluster_move_slots(const wxg_test_cluster_t *c, int from, int to, int count, int group,
                                int pause_ms, long *keys)
{
    enum { SLOTS = 16384 };
    redisContext *x[WXG_TEST_CLUSTER_MAX] = {0};
    int prim[WXG_TEST_CLUSTER_MAX], np = wxg_test_cluster_primaries(c, prim, WXG_TEST_CLUSTER_MAX);
    int *slots = calloc(SLOTS, sizeof *slots), nslots = 0, moved = -1;
    char from_id[64] = "", to_id[64] = "";
    long nkeys = 0;
    mv_keys k = {0};
    struct timeval tv = {.tv_sec = 5};
    if (!slots || group < 1)
        goto out;
    for (int i = 0; i < np; i++) {
        x[prim[i]] = redisConnectWithTimeout("127.0.0.1", c->node[prim[i]].port, tv);
        if (!x[prim[i]] || x[prim[i]]->err || redisSetTimeout(x[prim[i]], tv) != REDIS_OK) {
            fprintf(stderr, "move slots: cannot connect to node %d\n", c->node[prim[i]].port);
            goto out;
        }
    }
    if (!x[from] || !x[to] || from == to) {
        fprintf(stderr, "move slots: nodes %d and %d are not two primaries\n", from, to);
        goto out;
    }
    int fp = c->node[from].port, tp = c->node[to].port;
    redisContext *src = x[from], *dst = x[to];
    for (int w = 0; w < 2; w++) {
        redisReply *r =
            mv_cmd(w ? dst : src, w ? tp : fp, 0, 2, (const char *[]){"CLUSTER", "MYID"}, NULL);
        if (!r || r->type != REDIS_REPLY_STRING) {
            if (r)
                freeReplyObject(r);
            goto out;
        }
        snprintf(w ? to_id : from_id, sizeof from_id, "%s", r->str);
        freeReplyObject(r);
    }
    /* The source's lowest `count` slots, from its own map. */
    redisReply *map = mv_cmd(src, fp, 0, 2, (const char *[]){"CLUSTER", "SLOTS"}, NULL);
    if (!map || map->type != REDIS_REPLY_ARRAY) {
        if (map)
            freeReplyObject(map);
        goto out;
    }
    char *mine = calloc(SLOTS, 1);
    for (size_t i = 0; mine && i < map->elements; i++) {
        const redisReply *e = map->element[i];
        if (e->elements >= 3 && e->element[2]->element[1]->integer == fp)
            for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++)
                mine[s] = 1;
    }
    freeReplyObject(map);
    for (int s = 0; mine && s < SLOTS && nslots < count; s++)
        if (mine[s])
            slots[nslots++] = s;
    free(mine);
    moved = 0;
    for (int g = 0; g < nslots && moved >= 0; g += group) {
        int end = g + group < nslots ? g + group : nslots;
        for (int i = g; i < end && moved >= 0; i++)
            if (mv_setslot(dst, tp, slots[i], "IMPORTING", from_id) != 0 ||
                mv_setslot(src, fp, slots[i], "MIGRATING", to_id) != 0)
                moved = -1;
        for (int i = g; i < end && moved >= 0; i++)
            if (mv_list(src, fp, slots[i], &k) != 0)
                moved = -1;
        if (moved < 0)
            break;
        /* Half of the keys, a pause with the slots split, the rest, a pause with every key on
         * the target while the source still answers for the slots. */
        size_t half = k.n / 2;
        if (mv_migrate(src, fp, tp, &k, 0, half) != 0)
            moved = -1;
        wxg_test_sleep_ms(pause_ms / 2);
        if (moved == 0 && mv_migrate(src, fp, tp, &k, half, k.n) != 0)
            moved = -1;
        nkeys += (long)k.n;
        mv_keys_free(&k);
        /* No key can appear on a migrating source (a missing key is answered ASK), but look
         * again before handing the slots over, as redis-cli does. */
        for (int i = g; i < end && moved >= 0; i++) {
            if (mv_list(src, fp, slots[i], &k) != 0 || mv_migrate(src, fp, tp, &k, 0, k.n) != 0)
                moved = -1;
            nkeys += (long)k.n;
            mv_keys_free(&k);
        }
        wxg_test_sleep_ms(pause_ms / 2);
        for (int i = g; i < end && moved >= 0; i++) {
            if (mv_setslot(dst, tp, slots[i], "NODE", to_id) != 0 ||
                mv_setslot(src, fp, slots[i], "NODE", to_id) != 0)
                moved = -1;
            for (int p = 0; p < np && moved >= 0; p++)
                if (prim[p] != from && prim[p] != to &&
                    mv_setslot(x[prim[p]], c->node[prim[p]].port, slots[i], "NODE", to_id) != 0)
                    moved = -1;
            if (moved >= 0)
                moved++;
        }
    }
out:
    mv_keys_free(&k);
    for (int i = 0; i < WXG_TEST_CLUSTER_MAX; i++)
        if (x[i])
            redisFree(x[i]);
    free(slots);
    if (keys)
        *keys = nkeys;
    return moved;
}

void wxg_test_cluster_stop(wxg_test_cluster_t *c)
{
    for (int i = 0; i < c->n; i++)
        wxg_test_redis_stop(&c->node[i]);
    c->n = 0;
}
