/*
 * DESIGN: a Redis Cluster client on wxguard's connection layer (lib/rconn.c).
 *
 * Purpose: run a batch of commands against a Redis Cluster the way the cluster wants them run,
 * for the guard (lib/guard/guard_conn.c) and for anyone below it. hiredis 0.14.1 has no cluster
 * support and no C cluster client is packaged for Debian 12, so this is ours: the slot of a key
 * (CRC16-XMODEM with hash tags), the slot map read with CLUSTER SLOTS, one connection per node,
 * and the redirections. lib/rcluster_int.h says what a caller sees.
 *
 * Shape. A handle keeps a node table (address, connection, reconnect backoff) and the map from
 * each of the 16384 slots to a node. A run goes in rounds. Each round routes every command that
 * has no answer yet -- to the node a redirection named, else to the map's node for its slot --,
 * appends it to that node's connection (after ASKING when an ASK named the node), appends WAIT
 * to every node that got commands when the caller wants replicas, then writes every node's
 * pipeline before it reads any (wxg__rconn_flush, then wxg__rconn_collect), so that all nodes
 * work at once. Each node remembers which command each of its replies answers (an entry list
 * per round), so replies go back to their commands whatever the grouping. A redirection
 * (MOVED, ASK) or a refusal that proves the command did not run (TRYAGAIN, CLUSTERDOWN,
 * LOADING) leaves the command for the next round; every other reply is final. Only those
 * commands are sent again.
 *
 * Map. Read at creation, and again when a MOVED arrived, when a node failed, or when no node
 * serves a slot: at most once per refresh_min_ms, except after a node could not be reached,
 * which forces one read in that run so that a failover is followed at once. A MOVED also
 * corrects its slot's entry immediately. A map is read from a node with a live connection,
 * else from any node known, else from the seeds. Nodes that serve no slot any more lose their
 * connection when a map is read outside a run (ASK can name a node that serves no slot yet, so
 * nodes are never removed during a run).
 *
 * Threads: one thread at a time per handle; nothing is locked; no global state but CRC16's
 * arithmetic.
 *
 * Failure modes. A node that cannot be connected to gets a capped, jittered reconnect backoff;
 * its commands are not sent and are reported as never run (WXG_EBUSY), the call failing with
 * WXG_ECONN and the node named; the map is read again (a replica may have been promoted). A
 * connection that fails while commands are in flight is freed; the commands it had sent without
 * a reply have an unknown outcome (WXG_ETIMEDOUT / WXG_ECONN) and are never sent again here,
 * because they may have run. TRYAGAIN and CLUSTERDOWN are waited out with a pause that grows
 * from 2 ms to 100 ms, within the run's deadline; what is still unanswered at the deadline never
 * ran (WXG_EBUSY). A connection the server closed while idle is noticed before anything is sent
 * on it and replaced. Passwords are sent only in AUTH and wiped when the handle is freed.
 */
#include "rcluster_int.h"

#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock_int.h"
#include "err_int.h"
#include "wxguard/conf.h"
#include "wxguard/err.h"

#define HOST_MAX      256
#define ADDR_MAX      (HOST_MAX + 8)
#define SEEDS_MAX     64
#define PAUSE_MIN_MS  2
#define PAUSE_MAX_MS  100
#define REFRESH_DEF   100
#define ENT_ASKING    (-1)
#define ENT_WAIT      (-2)
#define ROUNDS_CALMLY 8 /* rounds after which every round pauses (a redirection loop) */

typedef struct node {
    char host[HOST_MAX];
    int port;
    char addr[ADDR_MAX]; /* "host:port" ("[v6]:port") for error texts */
    wxg__rconn_t *conn;  /* NULL while disconnected */
    wxg__rbackoff_t backoff;
    int primary;    /* serves slots in the current map */
    int first_slot; /* the lowest of them */
    /* Per run: whether connecting failed (its commands are not sent again in this run), and
     * the entries of the current round: a command's index, ENT_ASKING or ENT_WAIT. */
    int failed_run;
    int *ent;
    size_t nent, cap;
} node;

typedef struct seed {
    char host[HOST_MAX];
    int port;
} seed;

struct wxg__rcluster {
    seed seeds[SEEDS_MAX];
    int nseeds;
    wxg__rtls_conf_t tls; /* strings owned */
    int use_tls;
    char *user, *password, *client_name;
    int connect_timeout_ms, command_timeout_ms, refresh_min_ms;
    int reconnect_min_ms, reconnect_max_ms;

    node *nodes[WXG__RC_NODES_MAX];
    int nnodes;
    int16_t slots[WXG__RC_SLOTS]; /* node index, -1: not served */
    int prim[WXG__RC_NODES_MAX];  /* primaries' node indexes by lowest slot */
    int nprim;
    int64_t last_refresh_ms;
    int refresh_wanted, refresh_forced;
    int in_run;
    wxg__rcluster_stats_t st;
};

/* ---------------------------------------------------------------------------------------------
 * Slots
 */

static unsigned crc16_xmodem(const unsigned char *p, size_t len)
{
    unsigned crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)p[i] << 8;
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
    return crc;
}

unsigned wxg__rcluster_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - from);
        if (close && close > open + 1)
            return crc16_xmodem((const unsigned char *)open + 1, (size_t)(close - open - 1)) &
                   (WXG__RC_SLOTS - 1);
    }
    return crc16_xmodem((const unsigned char *)key, len) & (WXG__RC_SLOTS - 1);
}

/* ---------------------------------------------------------------------------------------------
 * Addresses and the node table
 */

/* Parses "host:port" or "[v6]:port" of len bytes (the configuration's address syntax), with a
 * port 1..65535. 0 or -1. */
static int parse_addr(const char *p, size_t len, char *host, size_t hsize, int *port)
{
    char one[ADDR_MAX + 4];
    if (len == 0 || len >= sizeof one)
        return -1;
    memcpy(one, p, len);
    one[len] = '\0';
    return wxg_conf_parse_addr(one, host, hsize, port) == 0 && *port >= 1 ? 0 : -1;
}

/* Parses the seed list into c->seeds. 0 or -1. */
static int parse_seeds(wxg__rcluster_t *c, const char *list)
{
    if (!list)
        return -1;
    for (const char *p = list;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && (*p == ' ' || *p == '\t')) {
            p++;
            len--;
        }
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (c->nseeds == SEEDS_MAX)
            return -1;
        seed *s = &c->seeds[c->nseeds];
        if (parse_addr(p, len, s->host, sizeof s->host, &s->port) != 0)
            return -1;
        c->nseeds++;
        if (!end)
            return 0;
        p = end + 1;
    }
}

static int node_find(const wxg__rcluster_t *c, const char *host, int port)
{
    for (int i = 0; i < c->nnodes; i++) {
        if (c->nodes[i]->port == port && strcmp(c->nodes[i]->host, host) == 0)
            return i;
    }
    return -1;
}

/* The node at host:port, added when unknown. Its index, or -1 (table full, out of memory). */
static int node_get(wxg__rcluster_t *c, const char *host, int port)
{
    int i = node_find(c, host, port);
    if (i >= 0)
        return i;
    if (c->nnodes == WXG__RC_NODES_MAX || strlen(host) >= HOST_MAX)
        return -1;
    node *nd = calloc(1, sizeof *nd);
    if (!nd)
        return -1;
    snprintf(nd->host, sizeof nd->host, "%s", host);
    nd->port = port;
    snprintf(nd->addr, sizeof nd->addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    wxg__rbackoff_init(&nd->backoff, c->reconnect_min_ms, c->reconnect_max_ms);
    nd->first_slot = WXG__RC_SLOTS;
    c->nodes[c->nnodes] = nd;
    return c->nnodes++;
}

static void node_close(node *nd)
{
    wxg__rconn_free(nd->conn);
    nd->conn = NULL;
}

static void node_free(node *nd)
{
    if (!nd)
        return;
    node_close(nd);
    free(nd->ent);
    free(nd);
}

/* Makes sure node i has a live connection: replaces one the server closed while idle, and
 * connects (TLS, AUTH, CLIENT SETNAME) when its backoff allows. 0, or a code with errstr. */
static int node_connect(wxg__rcluster_t *c, int i, char *errstr, size_t errstr_size)
{
    node *nd = c->nodes[i];
    if (nd->conn && !wxg__rconn_idle_closed(nd->conn))
        return 0;
    node_close(nd);
    int64_t now = wxg__mono_ms();
    int64_t wait = wxg__rbackoff_wait(&nd->backoff, now);
    if (wait > 0) {
        wxg__errf(errstr, errstr_size,
                  "Redis Cluster node %s unreachable; next connect attempt in %lld ms", nd->addr,
                  (long long)wait);
        return WXG_ECONN;
    }
    wxg__rtls_conf_t tls = c->tls;
    wxg__rconn_opts_t o = {.host = nd->host,
                           .port = nd->port,
                           .connect_timeout_ms = c->connect_timeout_ms,
                           .tls = c->use_tls ? &tls : NULL,
                           .role = "Redis Cluster node"};
    int rc = 0;
    nd->conn = wxg__rconn_connect(&o, &rc, errstr, errstr_size);
    if (nd->conn) {
        char who[ADDR_MAX + 32];
        snprintf(who, sizeof who, "Redis Cluster node %s", nd->addr);
        rc = wxg__rconn_hello(nd->conn, c->command_timeout_ms, who, c->user, c->password, 0,
                              c->client_name, errstr, errstr_size);
    }
    if (rc) {
        node_close(nd);
        wxg__rbackoff_failed(&nd->backoff, wxg__mono_ms());
        c->st.node_errors++;
        c->refresh_wanted = 1;
        return rc;
    }
    wxg__rbackoff_reset(&nd->backoff);
    return 0;
}

/* A connection that failed under a command: closed, counted, and the map to be read again. */
static void node_failed(wxg__rcluster_t *c, node *nd)
{
    node_close(nd);
    c->st.node_errors++;
    c->refresh_wanted = 1;
}

/* ---------------------------------------------------------------------------------------------
 * The slot map
 */

/* Reads one {host, port, ...} element of CLUSTER SLOTS into a node index (an empty host: the
 * one asked, as Redis means it). -1 when malformed or the table is full. */
static int slots_node(wxg__rcluster_t *c, const redisReply *e, const node *asked)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 ||
        e->element[0]->type != REDIS_REPLY_STRING || e->element[1]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->integer < 1 || e->element[1]->integer > 65535)
        return -1;
    const redisReply *h = e->element[0];
    char host[HOST_MAX];
    if (h->len == 0 || (h->len == 1 && h->str[0] == '?'))
        snprintf(host, sizeof host, "%s", asked->host);
    else if (h->len < sizeof host)
        snprintf(host, sizeof host, "%.*s", (int)h->len, h->str);
    else
        return -1;
    return node_get(c, host, (int)e->element[1]->integer);
}

/* Builds the map from a CLUSTER SLOTS reply into map[]. 0, or WXG_EREDIS. */
static int parse_slots(wxg__rcluster_t *c, const redisReply *r, const node *asked, int16_t *map,
                       char *errstr, size_t errstr_size)
{
    for (int s = 0; s < WXG__RC_SLOTS; s++)
        map[s] = -1;
    if (r->type == REDIS_REPLY_ERROR) {
        wxg__errf(errstr, errstr_size, "Redis Cluster node %s refused CLUSTER SLOTS: %.*s",
                  asked->addr, (int)(r->len > 160 ? 160 : r->len), r->str);
        return wxg__rconn_refusal_code(r->str, r->len);
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0)
        goto bad;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER)
            goto bad;
        long long from = e->element[0]->integer, to = e->element[1]->integer;
        if (from < 0 || to < from || to >= WXG__RC_SLOTS)
            goto bad;
        int nd = slots_node(c, e->element[2], asked);
        if (nd < 0)
            goto bad;
        for (long long s = from; s <= to; s++)
            map[s] = (int16_t)nd;
    }
    return 0;
bad:
    wxg__errf(errstr, errstr_size, "Redis Cluster node %s gave a malformed CLUSTER SLOTS reply",
              asked->addr);
    return WXG_EREDIS;
}

/* Takes map[] as the map: marks the primaries, orders them by lowest slot, and (outside a run)
 * forgets the nodes that serve nothing. */
static void adopt_map(wxg__rcluster_t *c, const int16_t *map)
{
    memcpy(c->slots, map, sizeof c->slots);
    for (int i = 0; i < c->nnodes; i++) {
        c->nodes[i]->primary = 0;
        c->nodes[i]->first_slot = WXG__RC_SLOTS;
    }
    c->nprim = 0;
    for (int s = 0; s < WXG__RC_SLOTS; s++) {
        if (map[s] < 0)
            continue;
        node *nd = c->nodes[map[s]];
        if (!nd->primary) {
            nd->primary = 1;
            nd->first_slot = s;
            c->prim[c->nprim++] = map[s];
        }
    }
    if (c->in_run)
        return;
    /* Compact the table: the nodes that serve slots keep their connections and backoff. */
    int remap[WXG__RC_NODES_MAX], k = 0;
    for (int i = 0; i < c->nnodes; i++) {
        if (c->nodes[i]->primary) {
            remap[i] = k;
            c->nodes[k++] = c->nodes[i];
        } else {
            remap[i] = -1;
            node_free(c->nodes[i]);
        }
    }
    c->nnodes = k;
    for (int s = 0; s < WXG__RC_SLOTS; s++)
        if (c->slots[s] >= 0)
            c->slots[s] = (int16_t)remap[c->slots[s]];
    for (int p = 0; p < c->nprim; p++)
        c->prim[p] = remap[c->prim[p]];
}

/* Forgets the nodes that serve no slot in the current map. */
static void prune(wxg__rcluster_t *c)
{
    int16_t *map = malloc(sizeof c->slots);
    if (!map)
        return;
    memcpy(map, c->slots, sizeof c->slots);
    adopt_map(c, map);
    free(map);
}

/* Asks node i for the map. 0 or a code with errstr. */
static int refresh_from(wxg__rcluster_t *c, int i, int16_t *map, char *errstr, size_t errstr_size)
{
    int rc = node_connect(c, i, errstr, errstr_size);
    if (rc)
        return rc;
    node *nd = c->nodes[i];
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    size_t lens[2] = {7, 5};
    redisReply *r = NULL;
    rc =
        wxg__rconn_command(nd->conn, c->command_timeout_ms, 2, argv, lens, &r, errstr, errstr_size);
    if (rc) {
        node_failed(c, nd);
        return rc;
    }
    rc = parse_slots(c, r, nd, map, errstr, errstr_size);
    freeReplyObject(r);
    return rc;
}

int wxg__rcluster_refresh(wxg__rcluster_t *c, char *errstr, size_t errstr_size)
{
    int16_t *map = malloc(sizeof c->slots);
    if (!map) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    int rc = WXG_ECONN;
    char why[512] = "no Redis Cluster node known";
    /* Connected nodes first (no connect needed), then the other known nodes, then the seeds. */
    for (int pass = 0; pass < 3 && rc != 0; pass++) {
        if (pass < 2) {
            for (int i = 0; i < c->nnodes && rc != 0; i++) {
                int live = c->nodes[i]->conn != NULL;
                if (live == (pass == 0))
                    rc = refresh_from(c, i, map, why, sizeof why);
            }
            continue;
        }
        for (int s = 0; s < c->nseeds && rc != 0; s++) {
            int known = node_find(c, c->seeds[s].host, c->seeds[s].port) >= 0;
            int i = node_get(c, c->seeds[s].host, c->seeds[s].port);
            if (i < 0) {
                rc = WXG_ENOMEM;
                snprintf(why, sizeof why, "out of memory (or too many nodes)");
                break;
            }
            if (!known)
                rc = refresh_from(c, i, map, why, sizeof why);
        }
    }
    if (rc == 0) {
        adopt_map(c, map);
        c->st.refreshes++;
        c->refresh_wanted = 0;
        c->refresh_forced = 0;
    } else {
        wxg__errf(errstr, errstr_size, "cannot read the Redis Cluster slot map: %s", why);
    }
    /* Also after a failure: the next attempt waits the refresh interval. */
    c->last_refresh_ms = wxg__mono_ms();
    free(map);
    return rc;
}

/* Reads the map when it is wanted and allowed (or forced). */
static void maybe_refresh(wxg__rcluster_t *c)
{
    if (!c->refresh_wanted)
        return;
    if (!c->refresh_forced && wxg__mono_ms() - c->last_refresh_ms < c->refresh_min_ms)
        return;
    char why[256];
    (void)wxg__rcluster_refresh(c, why, sizeof why);
}

/* ---------------------------------------------------------------------------------------------
 * The handle
 */

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void free_secret(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

/* Copies the strings of the configuration. 0 or WXG_ENOMEM. */
static int copy_conf(wxg__rcluster_t *c, const wxg__rcluster_conf_t *conf)
{
    c->user = dup_or_null(conf->user);
    c->password = dup_or_null(conf->password);
    c->client_name = conf->client_name && *conf->client_name ? strdup(conf->client_name) : NULL;
    if ((conf->user && !c->user) || (conf->password && !c->password) ||
        (conf->client_name && *conf->client_name && !c->client_name))
        return WXG_ENOMEM;
    if (!conf->tls)
        return 0;
    const wxg__rtls_conf_t *t = conf->tls;
    c->use_tls = 1;
    c->tls.verify = t->verify;
    c->tls.ca_file = dup_or_null(t->ca_file);
    c->tls.ca_path = dup_or_null(t->ca_path);
    c->tls.cert_file = dup_or_null(t->cert_file);
    c->tls.key_file = dup_or_null(t->key_file);
    c->tls.key_password = dup_or_null(t->key_password);
    c->tls.server_name = dup_or_null(t->server_name);
    if ((t->ca_file && !c->tls.ca_file) || (t->ca_path && !c->tls.ca_path) ||
        (t->cert_file && !c->tls.cert_file) || (t->key_file && !c->tls.key_file) ||
        (t->key_password && !c->tls.key_password) || (t->server_name && !c->tls.server_name))
        return WXG_ENOMEM;
    return 0;
}

wxg__rcluster_t *wxg__rcluster_new(const wxg__rcluster_conf_t *conf, int *rc, char *errstr,
                                   size_t errstr_size)
{
    int code = WXG_ENOMEM;
    wxg__rcluster_t *c = calloc(1, sizeof *c);
    if (!c) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    for (int s = 0; s < WXG__RC_SLOTS; s++)
        c->slots[s] = -1;
    if (!conf || parse_seeds(c, conf->seeds) != 0 || c->nseeds == 0) {
        code = WXG_ECONFIG;
        wxg__errf(errstr, errstr_size,
                  "invalid Redis Cluster seed list: need 1..%d host:port entries separated by "
                  "commas ([address]:port for IPv6)",
                  SEEDS_MAX);
        goto fail;
    }
    if (copy_conf(c, conf) != 0) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    c->connect_timeout_ms = conf->connect_timeout_ms > 0 ? conf->connect_timeout_ms : 2000;
    c->command_timeout_ms = conf->command_timeout_ms > 0 ? conf->command_timeout_ms : 2000;
    c->refresh_min_ms = conf->refresh_min_ms > 0 ? conf->refresh_min_ms : REFRESH_DEF;
    c->reconnect_min_ms = conf->reconnect_min_ms > 0 ? conf->reconnect_min_ms : 50;
    c->reconnect_max_ms = conf->reconnect_max_ms > 0 ? conf->reconnect_max_ms : 2000;
    code = wxg__rcluster_refresh(c, errstr, errstr_size);
    if (code)
        goto fail;
    if (rc)
        *rc = 0;
    return c;
fail:
    wxg__rcluster_free(c);
    if (rc)
        *rc = code;
    return NULL;
}

void wxg__rcluster_free(wxg__rcluster_t *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nnodes; i++)
        node_free(c->nodes[i]);
    free(c->user);
    free_secret(c->password);
    free(c->client_name);
    free((char *)c->tls.ca_file);
    free((char *)c->tls.ca_path);
    free((char *)c->tls.cert_file);
    free((char *)c->tls.key_file);
    free_secret((char *)c->tls.key_password);
    free((char *)c->tls.server_name);
    free(c);
}

void wxg__rcluster_check_idle(wxg__rcluster_t *c)
{
    for (int i = 0; i < c->nnodes; i++) {
        node *nd = c->nodes[i];
        if (nd->conn && wxg__rconn_idle_closed(nd->conn)) {
            node_close(nd);
            c->refresh_wanted = 1; /* a restart or a failover: the map may have changed */
        }
    }
}

void wxg__rcluster_get_stats(const wxg__rcluster_t *c, wxg__rcluster_stats_t *out)
{
    *out = c->st;
}

int wxg__rcluster_primaries(const wxg__rcluster_t *c)
{
    return c->nprim;
}

const char *wxg__rcluster_primary_addr(const wxg__rcluster_t *c, int i)
{
    return i >= 0 && i < c->nprim ? c->nodes[c->prim[i]]->addr : NULL;
}

const char *wxg__rcluster_slot_addr(const wxg__rcluster_t *c, int slot)
{
    if (slot < 0 || slot >= WXG__RC_SLOTS || c->slots[slot] < 0)
        return NULL;
    return c->nodes[c->slots[slot]]->addr;
}

/* ---------------------------------------------------------------------------------------------
 * Running a batch
 */

static int starts_with(const redisReply *r, const char *word)
{
    size_t w = strlen(word);
    return r->len >= w && memcmp(r->str, word, w) == 0 && (r->len == w || r->str[w] == ' ');
}

/* Adds an entry to node nd's list for this round. 0 or WXG_ENOMEM. */
static int ent_push(node *nd, int e)
{
    if (nd->nent == nd->cap) {
        size_t cap = nd->cap ? nd->cap * 2 : 64;
        int *p = realloc(nd->ent, cap * sizeof *p);
        if (!p)
            return WXG_ENOMEM;
        nd->ent = p;
        nd->cap = cap;
    }
    nd->ent[nd->nent++] = e;
    return 0;
}

/* Everything a run keeps per command and for the whole call. */
typedef struct run {
    const wxg__rccmd_t *cmds;
    size_t n, open;        /* commands, and those without a final answer */
    int *target;           /* node a redirection named, or -1: by the map */
    unsigned char *asking; /* the target is an ASK's */
    unsigned char *done;
    redisReply **replies;
    int *codes;
    int wait_replicas, wait_timeout_ms;
    long long min_acks;
    int pause; /* some command waits out TRYAGAIN / CLUSTERDOWN / LOADING */
    int rc_unknown, rc_unreachable, rc_other;
    char err_unknown[512], err_unreachable[512], err_other[512];
} run;

static void finish(run *R, size_t i, int code)
{
    if (!R->done[i]) {
        R->done[i] = 1;
        R->open--;
    }
    R->codes[i] = code;
}

static void note(int *rc, char *buf, size_t size, int code, const char *text)
{
    if (*rc == 0) {
        *rc = code;
        snprintf(buf, size, "%s", text);
    }
}

/* Reads a redirection "MOVED|ASK <slot> <host>:<port>" into a node index (an empty host: the
 * node that answered). -1 when malformed. */
static int redirect_node(wxg__rcluster_t *c, const redisReply *r, const node *from, int *slot)
{
    const char *sp = memchr(r->str, ' ', r->len);
    if (!sp)
        return -1;
    const char *end = r->str + r->len;
    const char *sp2 = memchr(sp + 1, ' ', (size_t)(end - sp - 1));
    if (!sp2)
        return -1;
    char digits[8], host[HOST_MAX];
    size_t dl = (size_t)(sp2 - sp - 1);
    if (dl == 0 || dl >= sizeof digits)
        return -1;
    memcpy(digits, sp + 1, dl);
    digits[dl] = '\0';
    char *e = NULL;
    long s = strtol(digits, &e, 10);
    if (*e || s < 0 || s >= WXG__RC_SLOTS)
        return -1;
    /* Redis writes "ip:port" without brackets, also for IPv6: the port follows the last ':'. */
    const char *a = sp2 + 1;
    const char *colon = NULL;
    for (const char *p = a; p < end; p++)
        if (*p == ':')
            colon = p;
    if (!colon || colon + 1 >= end || (size_t)(colon - a) >= sizeof host)
        return -1;
    if (colon == a)
        snprintf(host, sizeof host, "%s", from->host);
    else
        snprintf(host, sizeof host, "%.*s", (int)(colon - a), a);
    if ((size_t)(end - colon - 1) >= sizeof digits)
        return -1;
    memcpy(digits, colon + 1, (size_t)(end - colon - 1));
    digits[end - colon - 1] = '\0';
    long port = strtol(digits, &e, 10);
    if (*e || port < 1 || port > 65535)
        return -1;
    *slot = (int)s;
    return node_get(c, host, (int)port);
}

/* Takes the reply to command i from node `from`: final, or left for the next round. */
static void take_reply(wxg__rcluster_t *c, run *R, size_t i, int from, redisReply *r)
{
    if (r->type == REDIS_REPLY_ERROR && r->str) {
        int slot = -1, to;
        if (starts_with(r, "MOVED") && (to = redirect_node(c, r, c->nodes[from], &slot)) >= 0) {
            c->slots[slot] = (int16_t)to; /* at once; the whole map follows */
            R->target[i] = to;
            R->asking[i] = 0;
            c->st.moved++;
            c->refresh_wanted = 1;
            freeReplyObject(r);
            return;
        }
        if (starts_with(r, "ASK") && (to = redirect_node(c, r, c->nodes[from], &slot)) >= 0) {
            R->target[i] = to;
            R->asking[i] = 1;
            c->st.ask++;
            freeReplyObject(r);
            return;
        }
        int tryagain = starts_with(r, "TRYAGAIN"), down = starts_with(r, "CLUSTERDOWN");
        if (tryagain || down || starts_with(r, "LOADING")) {
            /* The command did not run. Route it by the map again: a migration that ended or a
             * failover that finished sends it elsewhere. */
            c->st.tryagain += (uint64_t)tryagain;
            c->st.clusterdown += (uint64_t)down;
            if (down)
                c->refresh_wanted = 1;
            R->target[i] = -1;
            R->asking[i] = 0;
            R->pause = 1;
            freeReplyObject(r);
            return;
        }
    }
    R->replies[i] = r;
    finish(R, i, 0);
}

/* Appends command i (after ASKING when its target is an ASK's) to node nd. */
static int append_cmd(run *R, node *nd, size_t i)
{
    const wxg__rccmd_t *cmd = &R->cmds[i];
    if (R->asking[i]) {
        const char *argv[1] = {"ASKING"};
        size_t lens[1] = {6};
        int rc = wxg__rconn_append(nd->conn, 1, argv, lens);
        if (rc == 0)
            rc = ent_push(nd, ENT_ASKING);
        if (rc)
            return rc;
    }
    int rc = wxg__rconn_append(nd->conn, cmd->argc, cmd->argv, cmd->lens);
    if (rc == 0)
        rc = ent_push(nd, (int)i);
    return rc;
}

/* The node a command goes to this round: a redirection's, else the map's for its slot, else
 * (no key) the first primary. -1 when no node serves the slot. */
static int route(const wxg__rcluster_t *c, const run *R, size_t i)
{
    if (R->target[i] >= 0)
        return R->target[i];
    int slot = R->cmds[i].slot;
    if (slot >= WXG__RC_SLOTS)
        return -1;
    if (slot >= 0)
        return c->slots[slot];
    return c->nprim > 0 ? c->prim[0] : -1;
}

/* Appends WAIT to node nd after its commands. */
static int append_wait(const run *R, node *nd)
{
    char nb[16], tb[16];
    const char *argv[3] = {"WAIT", nb, tb};
    size_t lens[3];
    lens[0] = 4;
    lens[1] = (size_t)snprintf(nb, sizeof nb, "%d", R->wait_replicas);
    lens[2] = (size_t)snprintf(tb, sizeof tb, "%d", R->wait_timeout_ms);
    int rc = wxg__rconn_append(nd->conn, 3, argv, lens);
    return rc ? rc : ent_push(nd, ENT_WAIT);
}

/* Routes and appends every open command. A node that cannot be reached has its commands left
 * open for the next round, which reads the map again first and then either finds another
 * node for the slot or gives them up as never run (the node's failure counts once per run). */
static void route_round(wxg__rcluster_t *c, run *R)
{
    for (int k = 0; k < c->nnodes; k++)
        c->nodes[k]->nent = 0;
    for (size_t i = 0; i < R->n; i++) {
        if (R->done[i])
            continue;
        int t = route(c, R, i);
        if (t < 0) {
            /* No node serves the slot (yet): wait for the cluster, read the map again. */
            R->pause = 1;
            c->refresh_wanted = 1;
            continue;
        }
        node *nd = c->nodes[t];
        if (nd->failed_run) {
            finish(R, i, WXG_EBUSY);
            continue;
        }
        if (nd->nent == 0) {
            char why[512];
            int waiting = !nd->conn && wxg__rbackoff_wait(&nd->backoff, wxg__mono_ms()) > 0;
            int rc = node_connect(c, t, why, sizeof why);
            if (rc) {
                /* A connect that just failed reads the map again at once (a failover may have
                 * moved the slots); one still backing off waits for the refresh interval. */
                nd->failed_run = 1;
                c->refresh_wanted = 1;
                c->refresh_forced |= !waiting;
                note(&R->rc_unreachable, R->err_unreachable, sizeof R->err_unreachable,
                     rc == WXG_EAUTH || rc == WXG_ECONFIG ? rc : WXG_ECONN, why);
                continue;
            }
        }
        int rc = append_cmd(R, nd, i);
        if (rc) {
            finish(R, i, rc == WXG_ENOMEM ? WXG_ENOMEM : WXG_EBUSY);
            note(&R->rc_other, R->err_other, sizeof R->err_other, WXG_ENOMEM, "out of memory");
        }
    }
    for (int k = 0; R->wait_replicas > 0 && k < c->nnodes; k++) {
        node *nd = c->nodes[k];
        if (nd->nent > 0 && append_wait(R, nd) != 0)
            note(&R->rc_other, R->err_other, sizeof R->err_other, WXG_ENOMEM, "out of memory");
    }
}

/* The commands of node nd's entries from e on have no reply: their outcome is unknown. A lost
 * WAIT leaves the replication of the commands before it unknown. */
static void entries_unknown(run *R, node *nd, size_t e, int rc, const char *why)
{
    for (size_t k = e; k < nd->nent; k++) {
        int x = nd->ent[k];
        if (x >= 0) {
            finish(R, (size_t)x, rc);
        } else if (x == ENT_WAIT) {
            R->min_acks = -1;
            for (size_t j = 0; j < k; j++)
                if (nd->ent[j] >= 0 && R->codes[nd->ent[j]] == 0)
                    R->codes[nd->ent[j]] = WXG_EREPLICAS;
        }
    }
    note(&R->rc_unknown, R->err_unknown, sizeof R->err_unknown, rc, why);
}

/* Hands node k's `got` replies to their commands; rc != 0: the exchange failed after them (the
 * rest have an unknown outcome, the connection is gone). Frees reps. */
static void settle_node(wxg__rcluster_t *c, run *R, int k, redisReply **reps, size_t got, int rc,
                        const char *why)
{
    node *nd = c->nodes[k];
    for (size_t e = 0; e < got; e++) {
        int x = nd->ent[e];
        redisReply *r = reps[e];
        if (x >= 0) {
            take_reply(c, R, (size_t)x, k, r);
            continue;
        }
        if (x == ENT_WAIT) {
            long long acks = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
            if (acks < R->min_acks)
                R->min_acks = acks;
            for (size_t j = 0; acks < R->wait_replicas && j < e; j++) {
                int y = nd->ent[j];
                if (y >= 0 && R->done[y] && R->codes[y] == 0)
                    R->codes[y] = WXG_EREPLICAS;
            }
        }
        freeReplyObject(r); /* ASKING's +OK, or the WAIT's count */
    }
    if (rc) {
        entries_unknown(R, nd, got, rc, why);
        node_failed(c, nd);
    }
    free(reps);
    nd->nent = 0;
}

/* One node's exchange in a round. */
typedef struct xchg {
    int k; /* node index */
    redisReply **reps;
    size_t got;
    short events;
} xchg;

/* Sends every node's share and reads every node's replies, all nodes at once: each connection
 * moves what it can without waiting, then one poll() waits for any of them. A node that is slow
 * or stopped delays no other node's replies; at the deadline what a node has not answered has
 * an unknown outcome. */
static void exchange_round(wxg__rcluster_t *c, run *R, int64_t deadline)
{
    xchg *x = calloc((size_t)c->nnodes, sizeof *x);
    struct pollfd *pf = calloc((size_t)c->nnodes, sizeof *pf);
    int nx = 0;
    for (int k = 0; k < c->nnodes; k++) {
        node *nd = c->nodes[k];
        if (nd->nent == 0)
            continue;
        redisReply **reps = x && pf ? calloc(nd->nent, sizeof *reps) : NULL;
        if (!reps) {
            /* Nothing was sent on it yet: its commands never ran, but the connection holds
             * them appended, so it is closed. */
            for (size_t e = 0; e < nd->nent; e++)
                if (nd->ent[e] >= 0)
                    finish(R, (size_t)nd->ent[e], WXG_ENOMEM);
            note(&R->rc_other, R->err_other, sizeof R->err_other, WXG_ENOMEM, "out of memory");
            node_close(nd);
            nd->nent = 0;
            continue;
        }
        x[nx++] = (xchg){.k = k, .reps = reps};
    }
    while (nx > 0) {
        int np = 0;
        for (int a = 0; a < nx;) {
            node *nd = c->nodes[x[a].k];
            char why[512];
            int rc = wxg__rconn_collect_some(nd->conn, x[a].reps, &x[a].got, &x[a].events, why,
                                             sizeof why);
            if (rc || x[a].events == 0) {
                settle_node(c, R, x[a].k, x[a].reps, x[a].got, rc, why);
                x[a] = x[--nx];
                continue;
            }
            pf[np++] = (struct pollfd){.fd = wxg__rconn_fd(nd->conn), .events = x[a].events};
            a++;
        }
        if (nx == 0)
            break;
        int64_t left = deadline - wxg__mono_ms();
        if (left <= 0) {
            for (int a = 0; a < nx; a++) {
                char why[512];
                node *nd = c->nodes[x[a].k];
                int rc = wxg__rconn_expired(nd->conn, x[a].got, why, sizeof why);
                settle_node(c, R, x[a].k, x[a].reps, x[a].got, rc, why);
            }
            break;
        }
        (void)poll(pf, (nfds_t)np, left > 1000000 ? 1000000 : (int)left);
    }
    free(x);
    free(pf);
}

static void sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The call's code and text once the rounds are over. */
static int run_result(run *R, char *errstr, size_t errstr_size)
{
    if (R->rc_unknown) {
        wxg__errf(errstr, errstr_size, "%s", R->err_unknown);
        return R->rc_unknown;
    }
    if (R->rc_unreachable) {
        wxg__errf(errstr, errstr_size, "%s", R->err_unreachable);
        return R->rc_unreachable;
    }
    for (size_t i = 0; i < R->n; i++) {
        if (R->codes[i] == WXG_EBUSY) {
            wxg__errf(errstr, errstr_size,
                      "Redis Cluster: the deadline came while commands were being redirected "
                      "or waited out (TRYAGAIN, CLUSTERDOWN, or no node serving their slot); "
                      "they did not run");
            return WXG_EBUSY;
        }
    }
    if (R->rc_other) {
        wxg__errf(errstr, errstr_size, "%s", R->err_other);
        return R->rc_other;
    }
    for (size_t i = 0; i < R->n; i++) {
        if (R->codes[i] == WXG_EREPLICAS) {
            wxg__errf(errstr, errstr_size,
                      "WAIT: %lld of %d replicas acknowledged within %d ms on a Redis Cluster "
                      "node",
                      R->min_acks, R->wait_replicas, R->wait_timeout_ms);
            return WXG_EREPLICAS;
        }
    }
    return 0;
}

int wxg__rcluster_run(wxg__rcluster_t *c, const wxg__rccmd_t *cmds, size_t n, int timeout_ms,
                      int wait_replicas, int wait_timeout_ms, redisReply **replies, int *codes,
                      long long *min_acks, char *errstr, size_t errstr_size)
{
    run R = {.cmds = cmds,
             .n = n,
             .open = n,
             .replies = replies,
             .codes = codes,
             .wait_replicas = wait_replicas > 0 ? wait_replicas : 0,
             .wait_timeout_ms = wait_timeout_ms,
             .min_acks = LLONG_MAX};
    R.target = malloc((n ? n : 1) * sizeof *R.target);
    R.asking = calloc(n ? n : 1, 1);
    R.done = calloc(n ? n : 1, 1);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        replies[i] = NULL;
        codes[i] = WXG_EBUSY;
    }
    if (!R.target || !R.asking || !R.done) {
        for (size_t i = 0; i < n; i++)
            codes[i] = WXG_ENOMEM;
        wxg__errf(errstr, errstr_size, "out of memory");
        rc = WXG_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        R.target[i] = -1;
    int64_t deadline = wxg__mono_ms() + (timeout_ms > 0 ? timeout_ms : 1) +
                       (R.wait_replicas > 0 && wait_timeout_ms > 0 ? wait_timeout_ms : 0);
    c->in_run = 1;
    for (int k = 0; k < c->nnodes; k++)
        c->nodes[k]->failed_run = 0;
    int64_t pause = 0;
    for (int round = 0; R.open > 0; round++) {
        if (round > 0 && (R.pause || round >= ROUNDS_CALMLY)) {
            pause = pause ? pause * 2 : PAUSE_MIN_MS;
            if (pause > PAUSE_MAX_MS)
                pause = PAUSE_MAX_MS;
            int64_t left = deadline - wxg__mono_ms();
            sleep_ms(pause < left ? pause : left);
        }
        R.pause = 0;
        if (wxg__mono_ms() >= deadline)
            break;
        maybe_refresh(c);
        route_round(c, &R);
        exchange_round(c, &R, deadline);
    }
    c->in_run = 0;
    /* Nodes named by redirections or old maps that serve nothing now are forgotten now and
     * then, outside the rounds (an ASK target may serve no slot yet during a round). */
    if (c->nnodes > 2 * c->nprim + 8)
        prune(c);
    if (min_acks)
        *min_acks = R.min_acks == LLONG_MAX ? R.wait_replicas : R.min_acks;
    rc = run_result(&R, errstr, errstr_size);
out:
    free(R.target);
    free(R.asking);
    free(R.done);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Every primary, one primary
 */

int wxg__rcluster_each_primary(wxg__rcluster_t *c, int argc, const char **argv, const size_t *lens,
                               int (*fn)(void *arg, int node, const char *addr,
                                         const redisReply *r),
                               void *arg, char *errstr, size_t errstr_size)
{
    maybe_refresh(c);
    if (c->nprim == 0) {
        int rc = wxg__rcluster_refresh(c, errstr, errstr_size);
        if (rc)
            return rc;
    }
    int np = c->nprim, rc = 0;
    int64_t deadline = wxg__mono_ms() + c->command_timeout_ms;
    redisReply **reps = calloc((size_t)np, sizeof *reps);
    int *sent = calloc((size_t)np, sizeof *sent);
    if (!reps || !sent) {
        free(reps);
        free(sent);
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    /* Written to every primary first, then read from each; a node that fails does not keep
     * the others from answering, and the first failure is the call's. */
    char why[512];
    for (int p = 0; p < np; p++) {
        node *nd = c->nodes[c->prim[p]];
        int e = node_connect(c, c->prim[p], why, sizeof why);
        if (e == 0)
            e = wxg__rconn_append(nd->conn, argc, argv, lens);
        if (e == 0)
            e = wxg__rconn_flush(nd->conn, deadline, why, sizeof why);
        if (e == 0) {
            sent[p] = 1;
        } else {
            if (nd->conn)
                node_failed(c, nd);
            if (rc == 0) {
                rc = e;
                wxg__errf(errstr, errstr_size, "%s", why);
            }
        }
    }
    for (int p = 0; p < np; p++) {
        node *nd = c->nodes[c->prim[p]];
        if (!sent[p])
            continue;
        int e = wxg__rconn_collect(nd->conn, deadline, &reps[p], NULL, why, sizeof why);
        if (e) {
            node_failed(c, nd);
            if (rc == 0) {
                rc = e;
                wxg__errf(errstr, errstr_size, "%s", why);
            }
        }
    }
    for (int p = 0; p < np && fn; p++) {
        if (!reps[p])
            continue;
        int e = fn(arg, p, c->nodes[c->prim[p]]->addr, reps[p]);
        if (e && rc == 0)
            rc = e;
    }
    for (int p = 0; p < np; p++) {
        if (reps[p])
            freeReplyObject(reps[p]);
    }
    free(reps);
    free(sent);
    return rc;
}

int wxg__rcluster_on_primary(wxg__rcluster_t *c, int i, int argc, const char **argv,
                             const size_t *lens, redisReply **out, char *errstr, size_t errstr_size)
{
    if (i < 0 || i >= c->nprim) {
        wxg__errf(errstr, errstr_size, "Redis Cluster: no primary %d (the map has %d)", i,
                  c->nprim);
        return WXG_EINVAL;
    }
    node *nd = c->nodes[c->prim[i]];
    int rc = node_connect(c, c->prim[i], errstr, errstr_size);
    if (rc == 0)
        rc = wxg__rconn_command(nd->conn, c->command_timeout_ms, argc, argv, lens, out, errstr,
                                errstr_size);
    if (rc && nd->conn)
        node_failed(c, nd);
    return rc;
}
