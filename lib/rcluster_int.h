/*
 * Internal to libwxguard: a Redis Cluster client on wxguard's connection layer (lib/rcluster.c).
 *
 * It keeps the slot map (from CLUSTER SLOTS), one connection per primary it has talked to, and
 * runs a batch of commands the way a cluster wants them run: each command goes to the primary
 * serving its slot, every node's share is one pipeline, and all nodes' pipelines are in flight
 * at once (written to every node first, then read from each). Redirections are followed for
 * the commands they concern only:
 *   - MOVED: the slot lives elsewhere now; the command did not run. It is sent to the named
 *     node, the map's entry for that slot is corrected at once and the whole map is read again
 *     (at most once per refresh interval);
 *   - ASK: the slot is being migrated and the key is not (or no longer) on the source; the
 *     command did not run. It is sent to the target prefixed with ASKING; the map is unchanged;
 *   - TRYAGAIN (a multi-key command whose keys are split by a migration) and CLUSTERDOWN: the
 *     command did not run; it is sent again after a short, growing pause, within the deadline;
 *   - a node that cannot be reached, or a connection that fails: the commands not yet sent to
 *     it are sent again after the map was read again; those sent without an answer have an
 *     unknown outcome and are reported as such, never retried here.
 *
 * What a caller must know about ordering: commands for one slot are sent in their order and run
 * in that order on one node, except while the slot migrates, when an ASK sends some of them to
 * the target after later ones ran on the source. Each command is atomic by itself (a single-key
 * command, or a script or transaction whose keys all share the slot and are declared), so a
 * step that needs several keys to change together must be one such command; a caller whose
 * correctness rests on the order of two commands on different keys cannot rely on it during a
 * migration.
 *
 * Threads: a cluster handle belongs to one thread at a time (one per guard handle); nothing is
 * locked. Strings of the configuration are copied.
 */
#ifndef WXG_RCLUSTER_INT_H
#define WXG_RCLUSTER_INT_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "rconn_int.h"

#define WXG__RC_SLOTS     16384
#define WXG__RC_NODES_MAX 256

typedef struct wxg__rcluster wxg__rcluster_t;

typedef struct wxg__rcluster_conf {
    const char *seeds;           /* "host:port[,host:port...]" ("[v6]:port" for IPv6) */
    const wxg__rtls_conf_t *tls; /* NULL: plain TCP; else every node over TLS */
    const char *user, *password; /* AUTH on every node (password NULL: none) */
    const char *client_name;     /* CLIENT SETNAME on every node, or NULL */
    int connect_timeout_ms;
    int command_timeout_ms; /* the map's reads, each_primary and on_primary */
    int refresh_min_ms;     /* at most one full map refresh per this; 0: 100 ms */
    int reconnect_min_ms;   /* a node that could not be reached is tried again after this, */
    int reconnect_max_ms;   /* doubling up to this; 0: 50 ms and 2000 ms */
} wxg__rcluster_conf_t;

/* What the client did; the guard exports these as metrics. */
typedef struct wxg__rcluster_stats {
    uint64_t moved;       /* MOVED replies followed */
    uint64_t ask;         /* ASK replies followed */
    uint64_t tryagain;    /* TRYAGAIN replies waited out */
    uint64_t clusterdown; /* CLUSTERDOWN replies waited out */
    uint64_t refreshes;   /* slot maps read */
    uint64_t node_errors; /* connections to a node that failed or could not be made */
} wxg__rcluster_stats_t;

/* One command of a batch, and the slot of its keys (wxg__rcluster_slot); -1 for a command
 * without a key (PING, SCRIPT ...), which goes to the first primary of the map. */
typedef struct wxg__rccmd {
    int argc;
    const char **argv;
    const size_t *lens;
    int slot;
} wxg__rccmd_t;

/* The slot of a key: CRC16 (XMODEM) of the hash tag -- the part between the first '{' and the
 * next '}' when it is not empty -- or of the whole key, modulo 16384. */
unsigned wxg__rcluster_slot(const char *key, size_t len);

/* Copies the configuration, connects to a seed (each in turn) and reads the slot map. Returns
 * the handle, or NULL with *rc (WXG_ECONFIG for a bad seed list, WXG_ECONN / WXG_ETIMEDOUT /
 * WXG_EAUTH from the seeds, WXG_ENOMEM) and errstr. */
wxg__rcluster_t *wxg__rcluster_new(const wxg__rcluster_conf_t *conf, int *rc, char *errstr,
                                   size_t errstr_size);

/* Closes every connection, wipes the password and frees the handle. NULL is accepted. */
void wxg__rcluster_free(wxg__rcluster_t *c);

/* Runs the n commands (see the top of this file) within timeout_ms (plus wait_timeout_ms when
 * waiting). On return replies[i] is the reply to cmds[i] (the caller's, error replies included)
 * or NULL, and codes[i] says what became of it:
 *   0                        a reply (possibly an error reply other than a redirection);
 *   WXG_ETIMEDOUT, WXG_ECONN it was sent and no reply came: its outcome is unknown, it may have
 *                            run; it is never sent again here;
 *   WXG_EBUSY                it never ran: its node could not be reached, no node served its
 *                            slot, or the deadline came while it was being redirected or
 *                            waited out; sending it again is safe;
 *   WXG_EREPLICAS            a reply, but the node's WAIT counted fewer than wait_replicas
 *                            acknowledgements (or was lost); the reply is kept;
 *   WXG_ENOMEM               never sent.
 * wait_replicas > 0 sends WAIT wait_replicas wait_timeout_ms after each node's commands in each
 * round; *min_acks (may be NULL) receives the fewest acknowledgements any WAIT reported (-1
 * when one was lost; wait_replicas when none was sent). Returns 0 when every command has code
 * 0, else the code of the call, with errstr: a code of a command with an unknown outcome first,
 * then WXG_ECONN when a node could not be reached, then WXG_EBUSY, WXG_ENOMEM, WXG_EREPLICAS. */
int wxg__rcluster_run(wxg__rcluster_t *c, const wxg__rccmd_t *cmds, size_t n, int timeout_ms,
                      int wait_replicas, int wait_timeout_ms, redisReply **replies, int *codes,
                      long long *min_acks, char *errstr, size_t errstr_size);

/* Runs one command on every primary of the current map (SCRIPT LOAD, PING), sent to all of them
 * at once; fn (may be NULL) then sees each reply (borrowed for the call) with the node's index
 * (as wxg__rcluster_on_primary counts them) and its address, in that order. Returns 0, the
 * first failing code (WXG_ECONN for a node that cannot be reached), or fn's non-zero return. */
int wxg__rcluster_each_primary(wxg__rcluster_t *c, int argc, const char **argv, const size_t *lens,
                               int (*fn)(void *arg, int node, const char *addr,
                                         const redisReply *r),
                               void *arg, char *errstr, size_t errstr_size);

/* The number of primaries in the map, and the command run on primary `node` alone (SCAN's
 * next page): 0 or a code; *out is the caller's. Primaries are counted in the order of the
 * lowest slot each serves, so an index names the same node as long as the map is unchanged. */
int wxg__rcluster_primaries(const wxg__rcluster_t *c);

/* "host:port" of primary `node`, or NULL; valid until the map changes. */
const char *wxg__rcluster_primary_addr(const wxg__rcluster_t *c, int node);

/* "host:port" of the primary serving `slot` in the current map, or NULL. */
const char *wxg__rcluster_slot_addr(const wxg__rcluster_t *c, int slot);
int wxg__rcluster_on_primary(wxg__rcluster_t *c, int node, int argc, const char **argv,
                             const size_t *lens, redisReply **out, char *errstr,
                             size_t errstr_size);

/* Reads the slot map again now (not rate-limited). 0 or a code with errstr. */
int wxg__rcluster_refresh(wxg__rcluster_t *c, char *errstr, size_t errstr_size);

/* Closes connections the servers closed while idle (a restart, a failover), so that the next
 * run connects again before it sends anything. */
void wxg__rcluster_check_idle(wxg__rcluster_t *c);

void wxg__rcluster_get_stats(const wxg__rcluster_t *c, wxg__rcluster_stats_t *out);

#endif /* WXG_RCLUSTER_INT_H */
