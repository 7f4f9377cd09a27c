/*
 * DESIGN: configuration.
 *
 * Purpose: the one table of configuration keys (keys[] below) and the code that fills a
 * wxg_conf_t from it: defaults, a properties file, WXG_* environment variables and --set flags.
 * Each value is validated when it is set, by the same parser whatever its source, so a bad value
 * is refused at start-up with its key and its origin named. Precedence is decided by the rank of
 * the source stored beside each value, not by the order of the calls, so a program may load its
 * --set flags before its file and still get the documented precedence. A value from a lower
 * source is validated even when a higher one overrides it: a broken file stays refused.
 *
 * kafka.* keys are checked by librdkafka itself (rd_kafka_conf_set on a scratch configuration
 * owned by the wxg_conf_t), so wxguard never has to mirror librdkafka's property list. plugin.*
 * keys are kept as text for the plugin's init, except for plugins whose keys the table declares.
 *
 * Threads and locks: none. Loading happens on one thread at start-up; afterwards the object is
 * only read, which any number of threads may do at once.
 *
 * Failure modes: allocation failure returns WXG_ENOMEM and leaves the object usable (the value
 * being set is simply not stored). Secret values are wiped (explicit_bzero) whenever a copy is
 * replaced or freed, and their text never reaches an error message or a warning.
 *
 * Secrets from files: a secret key may name a file that holds its value (WXG_<KEY>__FILE in the
 * environment, <key>@file in a properties file or --set), the way Kubernetes and Docker mount
 * secrets. The value read counts as coming from the source that named the file, so precedence
 * does not change. Only secret keys may be given so: a non-secret key has no reason to hide,
 * and refusing it keeps the rule from shadowing keys whose own name ends in "file"
 * (redis.tls.key.file, whose variable is WXG_REDIS_TLS_KEY_FILE).
 */
#include "wxguard/conf.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "err_int.h"
#include "wxguard/log.h"
#include "wxguard/err.h"

extern char **environ;

#define SEC  1000LL
#define MIN  (60 * SEC)
#define HOUR (60 * MIN)
#define DAY  (24 * HOUR)
#define KiB  1024LL
#define MiB  (1024 * KiB)
#define GiB  (1024 * MiB)

#define C_ WXG_PROG_CONSUMER
#define I_ WXG_PROG_INGEST
#define T_ WXG_PROG_CTL

/* Longest value accepted from any source. PEM blobs for librdkafka fit; a runaway file does not. */
#define VALUE_MAX (64 * 1024)
#define FILE_MAX  (1024 * 1024)
/* How much of a bad value an error message echoes. */
#define ECHO_MAX 64

static int check_key_prefix(const char *value, char *errstr, size_t errstr_size);
static int check_topic(const char *value, char *errstr, size_t errstr_size);
static int check_topic_list(const char *value, char *errstr, size_t errstr_size);
static int check_rate(const char *value, char *errstr, size_t errstr_size);
static int check_power_of_two(const char *value, char *errstr, size_t errstr_size);
static int check_node_list(const char *value, char *errstr, size_t errstr_size);

/* One line per key (clang-format may wrap it). Each helper fills the fields its type needs. */
// clang-format off
#define KSTR(n, d, lo, hi, p, f, desc)  {n, WXG_CONF_STRING, d, lo, hi, NULL, p, f, desc, NULL}
#define KINT(n, d, lo, hi, p, desc)     {n, WXG_CONF_INT, d, lo, hi, NULL, p, 0, desc, NULL}
#define KBOOL(n, d, p, desc)            {n, WXG_CONF_BOOL, d, 0, 1, NULL, p, 0, desc, NULL}
#define KDUR(n, d, lo, hi, p, desc)     {n, WXG_CONF_DURATION, d, lo, hi, NULL, p, 0, desc, NULL}
#define KSIZE(n, d, lo, hi, p, desc)    {n, WXG_CONF_SIZE, d, lo, hi, NULL, p, 0, desc, NULL}
#define KLIST(n, d, lo, hi, p, f, desc) {n, WXG_CONF_LIST, d, lo, hi, NULL, p, f, desc, NULL}
#define KENUM(n, d, allowed, p, desc)   {n, WXG_CONF_ENUM, d, 0, 0, allowed, p, 0, desc, NULL}
#define KADDR(n, d, p, f, desc)         {n, WXG_CONF_ADDR, d, 0, 65535, NULL, p, f, desc, NULL}
// clang-format on

/* The key table: the single source of truth. Keep related keys together; the reference lists
 * them in this order. */
static const wxg_conf_keydef_t keys[] = {
    /* Kafka. Every other kafka.<property> is passed to librdkafka as <property>. */
    KSTR("kafka.bootstrap.servers", "", 0, 0, C_ | I_ | T_, WXG_CONF_REQUIRED,
         "Kafka brokers as host:port[,host:port...] (librdkafka bootstrap.servers)."),
    KSTR("kafka.group.id", "wxguard", 1, 249, C_ | T_, 0,
         "Consumer group shared by every consumer replica (librdkafka group.id)."),

    /* The consumer. */
    {.name = "consumer.topics",
     .type = WXG_CONF_LIST,
     .def = "wxguard.callbacks",
     .min = 1,
     .max = 64,
     .programs = C_ | T_,
     .desc = "Topics the consumer subscribes to, comma-separated.",
     .check = check_topic_list},
    KENUM("consumer.format", "auto", "auto|wkteam|gewe|oa-xml|oa-json|generic", C_,
          "Callback format of the records; auto detects it per record."),
    KINT("consumer.workers", "4", 1, 256, C_,
         "Worker threads; each holds its own Redis connection. Messages of one conversation "
         "run one at a time, in order, though not always on the same worker thread."),
    KINT("consumer.queue.capacity", "4096", 1, 1000000, C_,
         "Messages held in the worker queues at most; as many again may wait in the poll "
         "thread's backlog. A full backlog stops polling until the workers make room; one "
         "that stays full for 200 ms pauses every partition (resumed at half of it)."),
    KINT("consumer.batch.max", "64", 1, 1024, C_ | T_,
         "Messages claimed or completed in one guard call (one Redis pipeline or script call) at "
         "most."),
    KDUR("consumer.batch.delay.ms", "1ms", 0, 1 * SEC, C_,
         "How long a worker waits to fill a batch before it sends a partial one."),
    KDUR("consumer.drain.timeout.ms", "30s", 0, 10 * MIN, C_,
         "Budget for finishing in-flight messages on shutdown and before giving up revoked "
         "partitions; what is unfinished then is not committed and will be redelivered."),
    KDUR("consumer.commit.interval.ms", "1s", 10, 10 * MIN, C_,
         "How often the finished watermark of each partition is committed."),
    KDUR("consumer.commit.timeout.ms", "5s", 100, 10 * MIN, C_,
         "Longest wait for the answer to a synchronous commit: the one for revoked partitions "
         "and the final one on shutdown. A commit not answered by then (the group coordinator "
         "is unreachable or silent) is abandoned; its messages are redelivered to the next "
         "owner and skipped as duplicates; the close that follows an unanswered final commit, "
         "or a commit refused because the group dropped the member, gets this long too, and so "
         "does the release of revoked partitions, after which the replica gives up its Kafka "
         "handle and stops. The longest stop is consumer.drain.timeout.ms plus this plus "
         "kafka.session.timeout.ms (the close), and with the coordinator unreachable the "
         "drain plus twice this."),
    KINT("consumer.retry.max", "5", 1, 1000, C_,
         "Attempts of a message whose plugin asks for a retry before it goes to the dead-letter "
         "topic."),
    KDUR("consumer.retry.backoff.initial.ms", "200ms", 1, 1 * HOUR, C_,
         "Delay before the first retry; it doubles (with jitter) on each further attempt."),
    KDUR("consumer.retry.backoff.max.ms", "30s", 1, 1 * DAY, C_,
         "Largest delay between two retries."),
    KSIZE("consumer.max.message.bytes", "1MiB", 1 * KiB, 64 * MiB, C_,
          "Records larger than this are not decoded; they go to the dead-letter topic."),
    KDUR("consumer.stall.timeout.ms", "5m", 1 * SEC, 1 * DAY, C_,
         "When the oldest in-flight message or a paused partition is older than this, /readyz "
         "turns false and a log line names the partition, offset and key."),
    {.name = "dlq.topic",
     .type = WXG_CONF_STRING,
     .def = "wxguard.dlq",
     .min = 1,
     .max = 249,
     .programs = C_ | T_,
     .desc = "Dead-letter topic for messages that failed for good; an offset passes such a "
             "message only after its dead-letter record is acknowledged.",
     .check = check_topic},

    /* Redis, for the guard. */
    KSTR("redis.host", "127.0.0.1", 0, 253, C_ | T_, 0, "Redis server host name or address."),
    KINT("redis.port", "6379", 1, 65535, C_ | T_, "Redis server TCP port."),
    KSTR("redis.unix.socket", "", 0, 107, C_ | T_, 0,
         "Path of a Redis Unix socket; when set it is used instead of redis.host and redis.port."),
    KINT("redis.db", "0", 0, 1023, C_ | T_, "Redis logical database (SELECT)."),
    KSTR("redis.user", "", 0, 128, C_ | T_, 0,
         "Redis ACL user name; empty authenticates as the default user when a password is set."),
    KSTR("redis.password", "", 0, 512, C_ | T_, WXG_CONF_SECRET,
         "Redis password (AUTH). Prefer the environment (WXG_REDIS_PASSWORD) to a file."),
    KSTR("redis.sentinels", "", 0, 1024, C_ | T_, 0,
         "Redis Sentinels to ask for the primary's address, as host:port[,host:port...] "
         "([address]:port for IPv6); when set, redis.host, redis.port and redis.unix.socket "
         "are not used, and a failover is followed."),
    KSTR("redis.sentinel.master", "", 0, 128, C_ | T_, 0,
         "Name under which the Sentinels monitor the primary; required with redis.sentinels."),
    KSTR("redis.sentinel.user", "", 0, 128, C_ | T_, 0,
         "ACL user for the Sentinels; empty authenticates as the default user when a Sentinel "
         "password is set."),
    KSTR("redis.sentinel.password", "", 0, 512, C_ | T_, WXG_CONF_SECRET,
         "Password of the Sentinels (their requirepass), when they have one; "
         "redis.user and redis.password still authenticate to the primary."),
    {.name = "redis.cluster.nodes",
     .type = WXG_CONF_STRING,
     .def = "",
     .min = 0,
     .max = 1024,
     .programs = C_ | T_,
     .desc = "Nodes of a Redis Cluster to read the slot map from, as host:port[,host:port...] "
             "([address]:port for IPv6; a few of them, in case one is down). When set, wxguard "
             "talks to the cluster: each command goes to the primary serving its key, "
             "redirections and failovers are followed, redis.host, redis.port and "
             "redis.unix.socket are not used, and redis.user, redis.password, redis.tls.* and "
             "redis.client.name apply to every node. Cannot be combined with redis.sentinels; "
             "redis.db must be 0.",
     .check = check_node_list},
    KBOOL("redis.tls", "false", C_ | T_,
          "Connect to Redis over TLS 1.2 or newer, verifying the server's certificate "
          "(docs/operating.md)."),
    KSTR("redis.tls.ca.file", "", 0, 4096, C_ | T_, 0,
         "PEM file of the CA certificates that may sign the server's certificate; with "
         "redis.tls.ca.path also empty, the system's CA store is used."),
    KSTR("redis.tls.ca.path", "", 0, 4096, C_ | T_, 0,
         "Directory of hashed CA certificates (c_rehash) that may sign the server's "
         "certificate."),
    KSTR("redis.tls.cert.file", "", 0, 4096, C_ | T_, 0,
         "Client certificate (PEM, chain allowed) for servers that require one (mutual TLS, "
         "tls-auth-clients yes)."),
    KSTR("redis.tls.key.file", "", 0, 4096, C_ | T_, 0,
         "Private key of the client certificate (PEM); empty: the key is in "
         "redis.tls.cert.file."),
    KSTR("redis.tls.key.password", "", 0, 512, C_ | T_, WXG_CONF_SECRET,
         "Pass phrase of an encrypted client key."),
    KSTR("redis.tls.server.name", "", 0, 253, C_ | T_, 0,
         "Name sent as SNI and checked against the server's certificate; empty: the host "
         "connected to (redis.host, or the address a Sentinel gave)."),
    KBOOL("redis.tls.verify", "true", C_ | T_,
          "Verify the server's certificate and name; false accepts any certificate and is for "
          "tests only."),
    KBOOL("redis.sentinel.tls", "false", C_ | T_,
          "Reach the Sentinels over TLS with the redis.tls.* files; each Sentinel's certificate "
          "is checked against its own host name."),
    KSTR("redis.client.name", "wxguard", 0, 64, C_ | T_, 0,
         "Name every Redis connection gives itself (CLIENT SETNAME), as CLIENT LIST shows it; "
         "empty sends none. Printable, no spaces."),
    KDUR("redis.connect.timeout.ms", "2s", 1, 1 * MIN, C_ | T_, "Timeout for connecting to Redis."),
    KDUR("redis.command.timeout.ms", "2s", 1, 1 * MIN, C_ | T_,
         "Timeout for one Redis command, pipeline or script call."),
    KDUR("redis.probe.interval.ms", "5s", 0, 1 * MIN, C_,
         "An idle consumer sends PING after this long without any Redis contact of its lease "
         "watchdog, so that /readyz and wxg_redis_reachable notice a Redis outage with no "
         "message in flight; 0 turns the probe off."),
    {.name = "redis.key.prefix",
     .type = WXG_CONF_STRING,
     .def = "wxg",
     .min = 1,
     .max = 64,
     .programs = C_ | T_,
     .desc = "Prefix of every Redis key wxguard writes (letters, digits, '_', '-', '.', ':'); "
             "lets several deployments share one Redis. A ':' is added when it does not end "
             "in one, so 63 bytes is the most without it.",
     .check = check_key_prefix},

    /* The idempotency guard. */
    KENUM("guard.design", "native", "native|lua", C_ | T_,
          "How the guard talks to Redis: native runs the common transitions (a new message's "
          "claim, a duplicate's, a completion, a plugin's sub-marker) as native commands and the "
          "rare ones as Lua scripts; lua runs every transition as a script. Both keep the same "
          "state, so replicas of either design may share a prefix (docs/guard.md §4)."),
    KDUR("guard.lease.ms", "30s", 100, 1 * HOUR, C_ | T_,
         "How long a claim stays owned without renewal; a crashed replica's messages are taken "
         "over after it."),
    KDUR("guard.done.retention", "7d", 1 * MIN, 365 * DAY, C_ | T_,
         "How long a finished message is remembered; a duplicate arriving later than this is "
         "processed again. Needs a unit (s, m, h, d)."),
    KDUR("guard.failed.retention", "30d", 1 * MIN, 365 * DAY, C_ | T_,
         "How long a dead-lettered message's FAILED record is kept for inspection and redrive."),
    KINT("guard.wait.replicas", "0", 0, 16, C_ | T_,
         "Redis replicas that must acknowledge each write of the guard (WAIT): a DONE record "
         "before the offset may pass it, and wxguardctl's release, purge and redrive; 0 does "
         "not wait."),
    KDUR("guard.wait.timeout.ms", "500ms", 1, 1 * MIN, C_ | T_, "Timeout of that WAIT."),
    {.name = "guard.done.expected.rate",
     .type = WXG_CONF_STRING,
     .def = "auto",
     .min = 1,
     .max = 32,
     .programs = C_ | T_,
     .desc = "Finished messages per second across all replicas, which sizes the compact DONE "
             "markers' buckets so that each holds about 64 markers. auto (the default) sizes "
             "every new time bucket from the markers the one before it holds, so the layout "
             "follows the real rate without an operator (the first time bucket of a prefix is "
             "sized for 1000/s); a decimal number (e.g. 0.17 for 100,000 a week) pins it. "
             "Every replica and wxguardctl on one prefix must use the same value (the layout "
             "is stamped in Redis; another one is refused at start-up).",
     .check = check_rate},
    {.name = "guard.shards",
     .type = WXG_CONF_INT,
     .def = "1024",
     .min = 1,
     .max = 65536,
     .programs = C_ | T_,
     .desc = "Hash-tag shards of the guard's keys (a power of two): one message's keys share "
             "one shard, and the DONE buckets of all messages spread over all of them, so that "
             "a Redis Cluster spreads the guard over its primaries when this is well above "
             "their number. Part of the stamped layout: keep 16 on a prefix written by a "
             "version before this key existed.",
     .check = check_power_of_two},
    /* The upper bound is WXG__DONECACHE_MAX_ENTRIES (lib/guard/donecache_int.h). */
    KINT("guard.done.cache.entries", "65536", 0, 67108864, C_,
         "Messages this replica completed that it remembers in memory (32 bytes each), so that "
         "their redeliveries are answered as duplicates without a Redis call; 0 turns the near "
         "cache off. Duplicates of messages completed elsewhere still ask Redis."),

    /* Plugins. */
    {.name = "plugins",
     .type = WXG_CONF_LIST,
     .def = "",
     .min = 1,
     .max = 32,
     .programs = C_,
     .flags = WXG_CONF_REQUIRED,
     .desc = "The plugin chain, in order: built-in names (record, noop, fail) or other registered "
             "plugins, and absolute paths of external plugins (file and directory owned by root "
             "or the service user and not writable by group or others, docs/plugins.md). "
             "Required, so that no message is marked done by an empty chain.",
     .check = NULL},
    KSTR("plugin.record.path", "", 0, 4096, C_, 0,
         "File the record plugin appends one JSON line per effect to; required when record is in "
         "the chain. Safe for several replicas appending to one file."),

    /* Logging. */
    KENUM("log.level", "info", "debug|info|warn|error", C_ | I_ | T_,
          "Lowest level written to the log."),
    KENUM("log.format", "kv", "kv|json", C_ | I_ | T_,
          "kv writes key=value lines (logfmt); json writes one JSON object per line."),
    KSIZE("log.field.max.bytes", "256", 16, 4 * KiB, C_ | I_ | T_,
          "A logged value longer than this is cut short and marked as truncated."),
    KBOOL("log.personal.ids", "false", C_ | I_ | T_,
          "Log account, conversation and sender ids as they are instead of as short hashes. For "
          "debugging only."),
    KBOOL("log.content", "false", C_ | I_ | T_,
          "Log message content at debug level. For debugging only: content is personal data."),
    KSTR("log.id.salt", "", 0, 256, C_ | I_ | T_, WXG_CONF_SECRET,
         "Salt mixed into the hashes of personal ids, so that log readers cannot confirm a "
         "guessed id; use the same value on every replica to correlate their logs."),

    /* Metrics and health. */
    KADDR("metrics.listen", "", C_, 0,
          "host:port of the consumer's HTTP server for /metrics, /healthz and /readyz; empty "
          "turns it off, port 0 picks a free port. wxguard-ingest has ingest.ops.listen "
          "instead."),

    /* The ingest program. */
    KADDR("ingest.listen", "127.0.0.1:8080", I_, WXG_CONF_REQUIRED,
          "host:port the webhook receiver listens on: the callback port, for the gateways."),
    KADDR("ingest.ops.listen", "127.0.0.1:9465", I_, 0,
          "host:port of the receiver's operations server: /metrics, /healthz and /readyz, kept "
          "off the callback port so that whoever can post callbacks cannot read the metrics. "
          "Empty turns it off; port 0 picks a free port. The default port is one above the "
          "consumer's usual 9464, so that both fit on one host."),
    KBOOL("ingest.ops.on.callback.port", "false", I_,
          "Serve /metrics, /healthz and /readyz on ingest.listen too, for a setup that can expose "
          "only one port. Otherwise they are 404 there, like any unknown path."),
    {.name = "ingest.topic",
     .type = WXG_CONF_STRING,
     .def = "wxguard.callbacks",
     .min = 1,
     .max = 249,
     .programs = I_,
     .desc = "Topic the callbacks are produced to.",
     .check = check_topic},
    KSIZE("ingest.max.body.bytes", "1MiB", 1 * KiB, 64 * MiB, I_,
          "Requests with a larger body are refused with 413."),
    KDUR("ingest.produce.timeout.ms", "4s", 100, 5 * MIN, I_,
         "How long a request waits for Kafka to acknowledge the record before it is answered "
         "with 503 (the gateway retries). WeChat's servers give up on an Official Account "
         "callback after 5 s, so keep it below that."),
    KINT("ingest.concurrency", "64", 1, 4096, I_,
         "Callback requests handled at once (reading their body or waiting for Kafka); one more "
         "is answered 503 with Retry-After at once. Each request in progress holds a thread."),
    KDUR("ingest.connection.timeout.ms", "30s", SEC, 10 * MIN, I_,
         "A connection idle for this long (keep-alive, or a client that stops sending its body) "
         "is closed, and a request not received whole this long after its first byte (a client "
         "trickling its headers or body) is cut. Rounded up to whole seconds."),
    KSTR("ingest.oa.token", "", 0, 128, I_, WXG_CONF_SECRET,
         "Token configured for the Official Account's server URL: the signature of every request "
         "to /v1/callback/oa is checked against it (401 when wrong). Empty turns the Official "
         "Account endpoint off (404)."),
    KSTR("ingest.oa.aes.key", "", 0, 43, I_, WXG_CONF_SECRET,
         "EncodingAESKey of the Official Account (43 characters). When set, a push is accepted "
         "only encrypted (encrypt_type=aes, in any case; safe or compatible mode): its "
         "msg_signature over Encrypt is checked (401 when wrong), Encrypt is decrypted and the "
         "plaintext push is what gets stored; a plaintext push is refused with 401 unless "
         "ingest.oa.plaintext.accept is set. Empty: encrypted pushes are refused with 400 in safe "
         "mode and read from their plaintext fields in compatible mode. Requires ingest.oa.token "
         "and ingest.oa.appid."),
    KSTR("ingest.oa.aes.key.previous", "", 0, 43, I_, WXG_CONF_SECRET,
         "The EncodingAESKey before the last change, tried when a push does not decrypt with "
         "ingest.oa.aes.key, so that pushes sealed just before a key change are not lost. Empty "
         "once every push in flight has arrived."),
    KSTR("ingest.oa.appid", "", 0, 64, I_, 0,
         "AppId of the Official Account: a decrypted push must end with it (400 otherwise). "
         "Required with ingest.oa.aes.key."),
    KSTR("ingest.hmac.secret", "", 0, 1024, I_, WXG_CONF_SECRET,
         "Shared secret of the gateways, valid for every account: when any gateway secret is set "
         "(this one, ingest.hmac.secret.previous or ingest.hmac.gateways), every callback except "
         "the Official Account's must carry X-Wxg-Timestamp: <Unix seconds> and X-Wxg-Signature: "
         "sha256=<hex HMAC-SHA256 of the timestamp, '.', and the body> under one of them (401 "
         "otherwise); with ingest.signature.tolerance.ms = 0 a request without X-Wxg-Timestamp "
         "may sign the body alone."),
    KSTR("ingest.hmac.secret.previous", "", 0, 1024, I_, WXG_CONF_SECRET,
         "The gateway secret before the last change, accepted beside ingest.hmac.secret so that "
         "the gateways can move to the new one without downtime. Empty once they all have."),
    KSTR("ingest.hmac.gateways", "", 0, 65536, I_, WXG_CONF_SECRET,
         "Gateway secrets bound to accounts, for an operator who runs several gateways: a "
         "comma-separated list of <account>[|<account>...]=<secret> (a secret here holds no "
         "comma and no surrounding blanks). A callback signed with one of them is accepted only "
         "for its accounts (403 otherwise, also for the {account} path segment). List a secret "
         "twice, old and new, to rotate it."),
    KBOOL("ingest.hmac.required", "true", I_,
          "Refuse to start when ingest.listen is not a loopback address and no gateway secret is "
          "set, since anyone who reaches the port could then post callbacks for any account. Set "
          "false only when something in front of ingest authenticates the gateways (a warning is "
          "logged at start-up)."),
    KBOOL("ingest.oa.plaintext.accept", "false", I_,
          "Accept plaintext Official Account pushes although ingest.oa.aes.key is set, for the "
          "time of a migration to safe mode (a warning is logged at start-up). A plaintext push's "
          "signature covers the token, timestamp and nonce but no byte of its body: anyone who "
          "saw one request URL can post any body under it within ingest.signature.tolerance.ms. "
          "With false, such pushes are refused with 401."),
    KDUR("ingest.signature.tolerance.ms", "5m", 0, 1 * DAY, I_,
         "Replay window of signed callbacks: a request whose signed timestamp (the Official "
         "Account's timestamp parameter, the gateway's X-Wxg-Timestamp) is older or further in "
         "the future than this is refused with 401, so that a captured request cannot be "
         "replayed after the DONE retention has forgotten it. 0 turns the check off. Keep it "
         "well below guard.done.retention."),
};

#define NKEYS (sizeof keys / sizeof keys[0])

/* librdkafka properties wxguard sets itself; a user value would break the offset guarantees. */
static const struct {
    const char *prop;
    const char *why;
} kafka_reserved[] = {
    {"enable.auto.offset.store",
     "wxguard stores only the finished watermark itself; this must stay false"},
};

/* librdkafka's sensitive properties (flagged _RK_SENSITIVE in its property table). */
static const char *const kafka_sensitive[] = {
    "sasl.password",
    "sasl.username",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.key.pem",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
};

enum { RANK_DEFAULT = 0, RANK_FILE, RANK_ENV, RANK_CLI };

typedef struct entry {
    char *key;    /* full key */
    char *value;  /* as written, trimmed */
    char *origin; /* "default", "file x:3", "env WXG_X", "--set", + " (/path)" when read from a
                     secret file */
    int rank;
    int via_file; /* the value was read from a secret file named by its source */
    int srcid;    /* which load call set it (duplicates inside one file are refused) */
    int secret;
    const wxg_conf_keydef_t *def; /* NULL for kafka.* / plugin.* pass-through keys */
    int64_t num;                  /* INT, DURATION, SIZE, BOOL */
    char **items;                 /* LIST */
    size_t nitems;
} entry;

struct wxg_conf_s {
    unsigned program;
    entry tab[NKEYS];
    entry *extra;
    size_t nextra, capextra;
    char **warnings;
    size_t nwarn, capwarn;
    rd_kafka_conf_t *scratch;
    int next_srcid;
    int cli_srcid;
};

/* ---- small helpers ---------------------------------------------------------------------- */

static char *xstrndup(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p == NULL)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static char *xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

static void wipe_free(char *s, int secret)
{
    if (s == NULL)
        return;
    if (secret)
        explicit_bzero(s, strlen(s));
    free(s);
}

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Writes `v` for an error message: escaped, cut at ECHO_MAX bytes, in quotes. */
static void echo_value(const char *v, char *buf, size_t size)
{
    size_t o = 0;
    if (size < 8) {
        if (size)
            buf[0] = '\0';
        return;
    }
    buf[o++] = '"';
    for (size_t i = 0; v[i] != '\0' && o + 6 < size; i++) {
        unsigned char c = (unsigned char)v[i];
        if (i >= ECHO_MAX) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
}

static int is_key_char(int c)
{
    return isalnum(c) || c == '.' || c == '_' || c == '-';
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

static int warn(wxg_conf_t *conf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int warn(wxg_conf_t *conf, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < conf->nwarn; i++) {
        if (strcmp(conf->warnings[i], buf) == 0)
            return 0;
    }
    if (conf->nwarn == conf->capwarn) {
        size_t cap = conf->capwarn ? conf->capwarn * 2 : 8;
        char **w = realloc(conf->warnings, cap * sizeof *w);
        if (w == NULL)
            return WXG_ENOMEM;
        conf->warnings = w;
        conf->capwarn = cap;
    }
    char *copy = xstrdup(buf);
    if (copy == NULL)
        return WXG_ENOMEM;
    conf->warnings[conf->nwarn++] = copy;
    return 0;
}

static size_t levenshtein(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    size_t row[128];
    if (m >= sizeof row / sizeof row[0] || n >= 128)
        return SIZE_MAX;
    for (size_t j = 0; j <= m; j++)
        row[j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[m];
}

/* The table key closest to `key` (case-insensitively), when it is close enough to be a typo. */
static const char *suggest(const char *key)
{
    char lower[128];
    size_t n = strlen(key);
    if (n >= sizeof lower)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        lower[i] = (char)tolower((unsigned char)key[i]);
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t d = levenshtein(lower, keys[i].name);
        if (d < best_d) {
            best_d = d;
            best = keys[i].name;
        }
    }
    return best;
}

/* ---- the table ----------------------------------------------------------------------------- */

size_t wxg_conf_keydef_count(void)
{
    return NKEYS;
}

const wxg_conf_keydef_t *wxg_conf_keydef_at(size_t i)
{
    return i < NKEYS ? &keys[i] : NULL;
}

static long keydef_index(const char *name)
{
    if (name == NULL)
        return -1;
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(keys[i].name, name) == 0)
            return (long)i;
    }
    return -1;
}

const wxg_conf_keydef_t *wxg_conf_keydef_find(const char *name)
{
    long i = keydef_index(name);
    return i < 0 ? NULL : &keys[i];
}

const char *wxg_conf_type_name(wxg_conf_type_t type)
{
    switch (type) {
    case WXG_CONF_STRING:
        return "string";
    case WXG_CONF_INT:
        return "int";
    case WXG_CONF_BOOL:
        return "bool";
    case WXG_CONF_DURATION:
        return "duration";
    case WXG_CONF_SIZE:
        return "size";
    case WXG_CONF_LIST:
        return "list";
    case WXG_CONF_ENUM:
        return "enum";
    case WXG_CONF_ADDR:
        return "address";
    }
    return "unknown";
}

static void format_duration(int64_t ms, char *buf, size_t size)
{
    static const struct {
        int64_t unit;
        const char *name;
    } units[] = {{DAY, "d"}, {HOUR, "h"}, {MIN, "m"}, {SEC, "s"}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (ms != 0 && ms % units[i].unit == 0) {
            snprintf(buf, size, "%lld%s", (long long)(ms / units[i].unit), units[i].name);
            return;
        }
    }
    snprintf(buf, size, "%lldms", (long long)ms);
}

static void format_size(int64_t bytes, char *buf, size_t size)
{
    if (bytes != 0 && bytes % GiB == 0)
        snprintf(buf, size, "%lldGiB", (long long)(bytes / GiB));
    else if (bytes != 0 && bytes % MiB == 0)
        snprintf(buf, size, "%lldMiB", (long long)(bytes / MiB));
    else if (bytes != 0 && bytes % KiB == 0)
        snprintf(buf, size, "%lldKiB", (long long)(bytes / KiB));
    else
        snprintf(buf, size, "%lld", (long long)bytes);
}

void wxg_conf_describe_range(const wxg_conf_keydef_t *def, char *buf, size_t size)
{
    char lo[32], hi[32];
    if (buf == NULL || size == 0)
        return;
    buf[0] = '\0';
    if (def == NULL)
        return;
    switch (def->type) {
    case WXG_CONF_INT:
        snprintf(buf, size, "%lld .. %lld", (long long)def->min, (long long)def->max);
        break;
    case WXG_CONF_DURATION:
        format_duration(def->min, lo, sizeof lo);
        format_duration(def->max, hi, sizeof hi);
        snprintf(buf, size, "%s .. %s", lo, hi);
        break;
    case WXG_CONF_SIZE:
        format_size(def->min, lo, sizeof lo);
        format_size(def->max, hi, sizeof hi);
        snprintf(buf, size, "%s .. %s", lo, hi);
        break;
    case WXG_CONF_BOOL:
        snprintf(buf, size, "true | false");
        break;
    case WXG_CONF_ENUM: {
        size_t o = 0;
        for (const char *p = def->allowed; *p && o + 4 < size; p++) {
            if (*p == '|') {
                o += (size_t)snprintf(buf + o, size - o, " | ");
            } else {
                buf[o++] = *p;
                buf[o] = '\0';
            }
        }
        break;
    }
    case WXG_CONF_LIST:
        if (def->max > 0)
            snprintf(buf, size, "%lld .. %lld items", (long long)def->min, (long long)def->max);
        break;
    case WXG_CONF_STRING:
        if (def->min > 0 && def->max > 0)
            snprintf(buf, size, "%lld .. %lld bytes", (long long)def->min, (long long)def->max);
        else if (def->max > 0)
            snprintf(buf, size, "at most %lld bytes", (long long)def->max);
        else if (def->min > 0)
            snprintf(buf, size, "non-empty");
        break;
    case WXG_CONF_ADDR:
        snprintf(buf, size, "host:port");
        break;
    }
}

int wxg_conf_key_is_secret(const char *key)
{
    if (key == NULL)
        return 0;
    const wxg_conf_keydef_t *def = wxg_conf_keydef_find(key);
    if (def != NULL)
        return (def->flags & WXG_CONF_SECRET) != 0;
    if (has_prefix(key, "kafka.")) {
        for (size_t i = 0; i < sizeof kafka_sensitive / sizeof kafka_sensitive[0]; i++) {
            if (strcmp(key + 6, kafka_sensitive[i]) == 0)
                return 1;
        }
    }
    if (has_prefix(key, "kafka.") || has_prefix(key, "plugin.")) {
        /* Connection strings (dsn) carry passwords too. */
        static const char *const words[] = {"password",   "passphrase", "secret",  "token",
                                            "credential", "dsn",        "api.key", "private.key"};
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
            if (strstr(key, words[i]) != NULL)
                return 1;
        }
    }
    return 0;
}

/* ---- value parsers ------------------------------------------------------------------------- */

/* Parses a decimal integer prefix: digits with an optional sign, no leading space. *end points
 * after the digits. */
static int parse_int_prefix(const char *s, int64_t *out, const char **end)
{
    if (*s == '\0' || isspace((unsigned char)*s))
        return WXG_ECONFIG;
    const char *d = (*s == '-' || *s == '+') ? s + 1 : s;
    if (!isdigit((unsigned char)*d))
        return WXG_ECONFIG;
    char *e = NULL;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    if (errno == ERANGE || e == s)
        return WXG_EOVERFLOW;
    *out = v;
    *end = e;
    return 0;
}

int wxg_conf_parse_int(const char *s, int64_t *out)
{
    int64_t v;
    const char *end;
    if (s == NULL || out == NULL)
        return WXG_ECONFIG;
    int rc = parse_int_prefix(s, &v, &end);
    if (rc != 0)
        return WXG_ECONFIG;
    if (*end != '\0')
        return WXG_ECONFIG;
    *out = v;
    return 0;
}

int wxg_conf_parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    if (s == NULL || out == NULL)
        return WXG_ECONFIG;
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return WXG_ECONFIG;
}

/* Multiplies v by unit, refusing negative values and overflow. */
static int scale(int64_t v, int64_t unit, int64_t *out)
{
    if (v < 0)
        return WXG_ECONFIG;
    if (v > INT64_MAX / unit)
        return WXG_ECONFIG;
    *out = v * unit;
    return 0;
}

int wxg_conf_parse_duration_ms(const char *s, int allow_bare_ms, int64_t *out)
{
    static const struct {
        const char *name;
        int64_t ms;
    } units[] = {{"ms", 1}, {"s", SEC}, {"m", MIN}, {"h", HOUR}, {"d", DAY}};
    int64_t v;
    const char *end;
    if (s == NULL || out == NULL || parse_int_prefix(s, &v, &end) != 0)
        return WXG_ECONFIG;
    if (*end == '\0')
        return allow_bare_ms ? scale(v, 1, out) : WXG_ECONFIG;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].name) == 0)
            return scale(v, units[i].ms, out);
    }
    return WXG_ECONFIG;
}

int wxg_conf_parse_size(const char *s, int64_t *out)
{
    static const struct {
        const char *name;
        int64_t bytes;
    } units[] = {{"", 1},    {"B", 1},     {"K", KiB}, {"KiB", KiB},
                 {"M", MiB}, {"MiB", MiB}, {"G", GiB}, {"GiB", GiB}};
    int64_t v;
    const char *end;
    if (s == NULL || out == NULL || parse_int_prefix(s, &v, &end) != 0)
        return WXG_ECONFIG;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].name) == 0)
            return scale(v, units[i].bytes, out);
    }
    return WXG_ECONFIG;
}

int wxg_conf_parse_addr(const char *s, char *host, size_t host_size, int *port)
{
    const char *colon;
    const char *h = s;
    size_t hlen;
    if (s == NULL || host == NULL || port == NULL)
        return WXG_ECONFIG;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL || close[1] != ':')
            return WXG_ECONFIG;
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL || memchr(s, ':', (size_t)(colon - s)) != NULL)
            return WXG_ECONFIG; /* a bare IPv6 address needs brackets */
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= host_size)
        return WXG_ECONFIG;
    for (size_t i = 0; i < hlen; i++) {
        unsigned char c = (unsigned char)h[i];
        if (!(isalnum(c) || c == '.' || c == '-' || c == '_' || c == ':' || c == '%'))
            return WXG_ECONFIG;
    }
    int64_t p;
    if (wxg_conf_parse_int(colon + 1, &p) != 0 || p < 0 || p > 65535)
        return WXG_ECONFIG;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (int)p;
    return 0;
}

static int check_rate(const char *value, char *errstr, size_t errstr_size)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (strcmp(value, "auto") == 0)
        return 0;
    if (errno != 0 || end == value || *end != '\0' || !(v > 0) || v > 1e9) {
        wxg__errf(errstr, errstr_size, "not a rate: auto, or a positive decimal number up to 1e9");
        return WXG_EINVAL;
    }
    return 0;
}

/* "" or host:port[,host:port...] with ports 1..65535 (blanks around entries allowed). */
static int check_node_list(const char *value, char *errstr, size_t errstr_size)
{
    if (*value == '\0')
        return 0;
    for (const char *p = value;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && (*p == ' ' || *p == '\t')) {
            p++;
            len--;
        }
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        char one[300], host[256];
        int port = 0;
        if (len == 0 || len >= sizeof one) {
            wxg__errf(errstr, errstr_size, "an empty or overlong entry: need host:port[,...]");
            return WXG_ECONFIG;
        }
        memcpy(one, p, len);
        one[len] = '\0';
        if (wxg_conf_parse_addr(one, host, sizeof host, &port) != 0 || port < 1) {
            wxg__errf(errstr, errstr_size,
                      "\"%s\" is not host:port with a port 1..65535 ([address]:port for IPv6)",
                      one);
            return WXG_ECONFIG;
        }
        if (!end)
            return 0;
        p = end + 1;
    }
}

static int check_power_of_two(const char *value, char *errstr, size_t errstr_size)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0' || v == 0 || (v & (v - 1)) != 0) {
        wxg__errf(errstr, errstr_size, "not a power of two");
        return WXG_EINVAL;
    }
    return 0;
}

static int check_key_prefix(const char *value, char *errstr, size_t errstr_size)
{
    /* The guard takes at most 64 bytes (WXG_GUARD_PREFIX_MAX) including the ':' that
     * wxg_conf_guard() adds to a prefix without one; the table's bound is 64. */
    size_t len = strlen(value);
    if (len >= 64 && value[len - 1] != ':') {
        wxg__errf(errstr, errstr_size,
                  "is 64 bytes without a trailing ':'; the ':' that is added would make it "
                  "longer than 64");
        return WXG_ECONFIG;
    }
    for (const char *p = value; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (!(isalnum(c) || c == '_' || c == '-' || c == '.' || c == ':')) {
            wxg__errf(
                errstr, errstr_size,
                "may hold only letters, digits, '_', '-', '.' and ':' (it becomes part of Redis "
                "keys and SCAN patterns)");
            return WXG_ECONFIG;
        }
    }
    return 0;
}

/* Kafka topic names: [a-zA-Z0-9._-] (Kafka also bounds them at 249 bytes). */
static int check_topic_chars(const char *value, const char *extra, char *errstr, size_t errstr_size)
{
    for (const char *p = value; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (!(isalnum(c) || c == '_' || c == '-' || c == '.' || strchr(extra, c) != NULL)) {
            wxg__errf(errstr, errstr_size,
                      "a topic name may hold only letters, digits, '.', '_' and '-'");
            return WXG_ECONFIG;
        }
    }
    return 0;
}

static int check_topic(const char *value, char *errstr, size_t errstr_size)
{
    return check_topic_chars(value, "", errstr, errstr_size);
}

/* A list is checked as written: its separators (and the spaces around them) are allowed too. */
static int check_topic_list(const char *value, char *errstr, size_t errstr_size)
{
    return check_topic_chars(value, ", \t", errstr, errstr_size);
}

static void free_items(entry *e)
{
    for (size_t i = 0; i < e->nitems; i++)
        free(e->items[i]);
    free(e->items);
    e->items = NULL;
    e->nitems = 0;
}

/* Splits a list value into trimmed items. Returns 0, WXG_ECONFIG (an empty item) or ENOMEM. */
static int split_list(const char *value, char ***items_out, size_t *n_out)
{
    char **items = NULL;
    size_t n = 0;
    int rc = 0;
    char *copy = xstrdup(value);
    if (copy == NULL)
        return WXG_ENOMEM;
    if (*trim(copy) == '\0')
        goto out; /* "" is the empty list */
    size_t cap = 1;
    for (const char *p = copy; *p; p++)
        cap += *p == ',';
    items = calloc(cap, sizeof *items);
    if (items == NULL) {
        rc = WXG_ENOMEM;
        goto out;
    }
    char *start = copy;
    for (;;) {
        char *comma = strchr(start, ',');
        if (comma != NULL)
            *comma = '\0';
        char *item = trim(start);
        if (*item == '\0') {
            rc = WXG_ECONFIG;
            goto out;
        }
        items[n] = xstrdup(item);
        if (items[n] == NULL) {
            rc = WXG_ENOMEM;
            goto out;
        }
        n++;
        if (comma == NULL)
            break;
        start = comma + 1;
    }
out:
    free(copy);
    if (rc != 0) {
        for (size_t i = 0; i < n; i++)
            free(items[i]);
        free(items);
        return rc;
    }
    *items_out = items;
    *n_out = n;
    return 0;
}

static int enum_allows(const char *allowed, const char *value)
{
    size_t vlen = strlen(value);
    const char *p = allowed;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == vlen && strncmp(p, value, len) == 0)
            return 1;
        if (bar == NULL)
            break;
        p = bar + 1;
    }
    return 0;
}

/* Parses a value of a type other than LIST into *v (0 for strings, enums and addresses). `echo`
 * is the value as error messages show it and `range` the key's range in words. */
static int parse_scalar(const wxg_conf_keydef_t *def, const char *value, const char *echo,
                        const char *range, int64_t *v, char *errstr, size_t errstr_size)
{
    size_t len = strlen(value);
    int b = 0;
    switch (def->type) {
    case WXG_CONF_STRING:
        if (def->min > 0 && len < (size_t)def->min) {
            wxg__errf(errstr, errstr_size, "must not be empty");
            return WXG_ECONFIG;
        }
        if (def->max > 0 && len > (size_t)def->max) {
            wxg__errf(errstr, errstr_size, "%s is longer than %lld bytes", echo,
                      (long long)def->max);
            return WXG_ECONFIG;
        }
        return 0;
    case WXG_CONF_INT:
        if (wxg_conf_parse_int(value, v) != 0) {
            wxg__errf(errstr, errstr_size, "%s is not an integer", echo);
            return WXG_ECONFIG;
        }
        return 0;
    case WXG_CONF_BOOL:
        if (wxg_conf_parse_bool(value, &b) != 0) {
            wxg__errf(errstr, errstr_size, "%s is not a boolean (true/false, yes/no, on/off, 1/0)",
                      echo);
            return WXG_ECONFIG;
        }
        *v = b;
        return 0;
    case WXG_CONF_DURATION: {
        int bare_ok = ends_with(def->name, ".ms");
        if (wxg_conf_parse_duration_ms(value, bare_ok, v) != 0) {
            wxg__errf(errstr, errstr_size,
                      "%s is not a duration (a whole number with a unit: ms, s, m, h, d%s)", echo,
                      bare_ok ? "; a bare number means ms" : "");
            return WXG_ECONFIG;
        }
        return 0;
    }
    case WXG_CONF_SIZE:
        if (wxg_conf_parse_size(value, v) != 0) {
            wxg__errf(
                errstr, errstr_size,
                "%s is not a size (a whole number of bytes, optionally with K, KiB, M, MiB, G or "
                "GiB)",
                echo);
            return WXG_ECONFIG;
        }
        return 0;
    case WXG_CONF_ENUM:
        if (!enum_allows(def->allowed, value)) {
            wxg__errf(errstr, errstr_size, "%s is not one of %s", echo, range);
            return WXG_ECONFIG;
        }
        return 0;
    case WXG_CONF_ADDR: {
        char host[256];
        int port;
        if (len == 0)
            return 0; /* "off"; wxg_conf_check refuses it for a required key */
        if (wxg_conf_parse_addr(value, host, sizeof host, &port) != 0) {
            wxg__errf(errstr, errstr_size,
                      "%s is not host:port (port 0..65535; an IPv6 address in brackets)", echo);
            return WXG_ECONFIG;
        }
        return 0;
    }
    case WXG_CONF_LIST:
        break;
    }
    return 0;
}

/* Splits a LIST value into *items (owned by the caller on success) and checks the number of
 * items and that none is there twice. */
static int parse_list(const wxg_conf_keydef_t *def, const char *value, const char *echo,
                      const char *range, char ***items, size_t *nitems, char *errstr,
                      size_t errstr_size)
{
    int rc = split_list(value, items, nitems);
    if (rc == WXG_ENOMEM)
        return rc;
    if (rc != 0) {
        wxg__errf(errstr, errstr_size, "%s has an empty item", echo);
        return WXG_ECONFIG;
    }
    /* An empty list of a required key is reported by wxg_conf_check, so that the default
     * "" can stand until every source is loaded. */
    if (*nitems != 0 &&
        ((int64_t)*nitems < def->min || (def->max > 0 && (int64_t)*nitems > def->max))) {
        wxg__errf(errstr, errstr_size, "%s has %zu items; allowed: %s", echo, *nitems, range);
        goto fail;
    }
    for (size_t i = 0; i < *nitems; i++) {
        for (size_t j = i + 1; j < *nitems; j++) {
            if (strcmp((*items)[i], (*items)[j]) == 0) {
                wxg__errf(errstr, errstr_size, "%s names \"%s\" twice", echo, (*items)[i]);
                goto fail;
            }
        }
    }
    return 0;
fail:
    for (size_t i = 0; i < *nitems; i++)
        free((*items)[i]);
    free(*items);
    *items = NULL;
    *nitems = 0;
    return WXG_ECONFIG;
}

/* Validates `value` against `def`. On success fills num/items (items owned by the caller).
 * On failure writes the reason (without the key) to errstr. The steps: the type's own parse,
 * the numeric range, then the key's extra check. */
static int parse_value(const wxg_conf_keydef_t *def, const char *value, int64_t *num, char ***items,
                       size_t *nitems, char *errstr, size_t errstr_size)
{
    char echo[ECHO_MAX + 16];
    char range[128];
    int64_t v = 0;

    if (def->flags & WXG_CONF_SECRET)
        snprintf(echo, sizeof echo, "the value");
    else
        echo_value(value, echo, sizeof echo);
    wxg_conf_describe_range(def, range, sizeof range);
    *num = 0;
    *items = NULL;
    *nitems = 0;

    int rc = def->type == WXG_CONF_LIST
                 ? parse_list(def, value, echo, range, items, nitems, errstr, errstr_size)
                 : parse_scalar(def, value, echo, range, &v, errstr, errstr_size);
    if (rc != 0)
        return rc;
    if (def->type == WXG_CONF_INT || def->type == WXG_CONF_DURATION || def->type == WXG_CONF_SIZE) {
        if (v < def->min || v > def->max) {
            wxg__errf(errstr, errstr_size, "%s is out of range (%s)", echo, range);
            return WXG_ECONFIG;
        }
    }
    if (def->check != NULL && *value != '\0') {
        char why[256] = "";
        if (def->check(value, why, sizeof why) != 0) {
            wxg__errf(errstr, errstr_size, "%s: %s", echo, why);
            free_items(&(entry){.items = *items, .nitems = *nitems});
            *items = NULL;
            *nitems = 0;
            return WXG_ECONFIG;
        }
    }
    *num = v;
    return 0;
}

/* ---- storing values ------------------------------------------------------------------------ */

static void entry_clear(entry *e)
{
    wipe_free(e->value, e->secret);
    free(e->origin);
    free(e->key);
    free_items(e);
    memset(e, 0, sizeof *e);
}

static entry *extra_find(const wxg_conf_t *conf, const char *key)
{
    for (size_t i = 0; i < conf->nextra; i++) {
        if (strcmp(conf->extra[i].key, key) == 0)
            return &conf->extra[i];
    }
    return NULL;
}

static int plugin_has_declared_keys(const char *key, size_t name_end)
{
    for (size_t i = 0; i < NKEYS; i++) {
        if (strncmp(keys[i].name, key, name_end + 1) == 0)
            return 1;
    }
    return 0;
}

/* Checks a kafka.* property with librdkafka. */
static int kafka_validate(wxg_conf_t *conf, const char *key, const char *value, int secret,
                          char *errstr, size_t errstr_size)
{
    const char *prop = key + 6;
    char why[512] = "";
    for (size_t i = 0; i < sizeof kafka_reserved / sizeof kafka_reserved[0]; i++) {
        if (strcmp(prop, kafka_reserved[i].prop) == 0) {
            wxg__errf(errstr, errstr_size, "%s: cannot be set: %s", key, kafka_reserved[i].why);
            return WXG_ECONFIG;
        }
    }
    if (conf->scratch == NULL) {
        conf->scratch = rd_kafka_conf_new();
        if (conf->scratch == NULL)
            return WXG_ENOMEM;
    }
    rd_kafka_conf_res_t res = rd_kafka_conf_set(conf->scratch, prop, value, why, sizeof why);
    if (res == RD_KAFKA_CONF_OK)
        return 0;
    if (res == RD_KAFKA_CONF_UNKNOWN) {
        wxg__errf(errstr, errstr_size, "%s: librdkafka has no property \"%s\"", key, prop);
    } else if (secret) {
        wxg__errf(errstr, errstr_size, "%s: librdkafka refused the value", key);
    } else {
        wxg__errf(errstr, errstr_size, "%s: librdkafka refused the value: %s", key, why);
    }
    return WXG_ECONFIG;
}

/* A value on its way into the table: what parsing it gave, before it is stored. */
typedef struct pending {
    long idx;     /* index in keys[], or -1 for a kafka.* / plugin.* pass-through key */
    int secret;   /* wxg_conf_key_is_secret(key) */
    int via_file; /* read from a secret file */
    int64_t num;
    char **items; /* owned until stored */
    size_t nitems;
} pending;

static void pending_free(pending *p)
{
    entry tmp = {.items = p->items, .nitems = p->nitems};
    free_items(&tmp);
    p->items = NULL;
    p->nitems = 0;
}

/* What holds for any key and value, whatever the family: a key of key characters, a bounded
 * value without control characters. */
static int check_key_and_value(const char *key, const char *value, const char *origin, char *errstr,
                               size_t errstr_size)
{
    if (key == NULL || value == NULL) {
        wxg__errf(errstr, errstr_size, "missing key or value (%s)", origin);
        return WXG_ECONFIG;
    }
    size_t klen = strlen(key);
    int key_ok = klen > 0 && klen <= 255;
    for (size_t i = 0; key_ok && i < klen; i++)
        key_ok = is_key_char((unsigned char)key[i]);
    if (!key_ok) {
        char echo[ECHO_MAX + 16];
        echo_value(key, echo, sizeof echo);
        wxg__errf(errstr, errstr_size, "invalid configuration key %s (%s)", echo, origin);
        return WXG_ECONFIG;
    }
    if (strlen(value) > VALUE_MAX) {
        wxg__errf(errstr, errstr_size, "%s: the value is longer than %d bytes (%s)", key, VALUE_MAX,
                  origin);
        return WXG_ECONFIG;
    }
    for (const char *p = value; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 || c == 0x7f) {
            wxg__errf(errstr, errstr_size, "%s: the value holds a control character (%s)", key,
                      origin);
            return WXG_ECONFIG;
        }
    }
    return 0;
}

static int refuse_unknown_key(const char *key, const char *origin, char *errstr, size_t errstr_size)
{
    const char *s = suggest(key);
    wxg__errf(errstr, errstr_size, "unknown configuration key \"%s\" (%s)%s%s%s", key, origin,
              s ? "; did you mean \"" : "", s ? s : "", s ? "\"?" : "");
    return WXG_ECONFIG;
}

/* A table key: its value parsed by its type, a kafka.* one checked by librdkafka too, and a
 * warning when the key is not meant for this program. */
static int accept_table_key(wxg_conf_t *conf, const char *key, const char *value, int rank,
                            const char *origin, pending *p, char *errstr, size_t errstr_size)
{
    char why[512] = "";
    const wxg_conf_keydef_t *def = &keys[p->idx];
    int rc = parse_value(def, value, &p->num, &p->items, &p->nitems, why, sizeof why);
    if (rc == WXG_ENOMEM)
        return rc;
    if (rc != 0) {
        wxg__errf(errstr, errstr_size, "%s: %s (%s)", key, why, origin);
        return rc;
    }
    if (has_prefix(key, "kafka.") && *value != '\0') {
        rc = kafka_validate(conf, key, value, p->secret, why, sizeof why);
        if (rc != 0) {
            wxg__errf(errstr, errstr_size, "%s (%s)", why, origin);
            return rc;
        }
    }
    if (rank > RANK_DEFAULT && !(def->programs & conf->program))
        return warn(conf, "%s is not used by this program (%s)", key, origin);
    return 0;
}

/* A plugin.<name>.<property> key, for a plugin whose keys the table does not declare. */
static int accept_plugin_key(const char *key, const char *origin, char *errstr, size_t errstr_size)
{
    const char *name = key + 7;
    const char *dot = strchr(name, '.');
    if (dot == NULL || dot == name || dot[1] == '\0') {
        wxg__errf(errstr, errstr_size, "%s: a plugin key is written plugin.<name>.<property> (%s)",
                  key, origin);
        return WXG_ECONFIG;
    }
    if (plugin_has_declared_keys(key, (size_t)(dot - key)))
        return refuse_unknown_key(key, origin, errstr, errstr_size);
    return 0;
}

/* Validates the value by the key's family and finds where it goes: *slot is the table entry,
 * the pass-through entry already set, or NULL for a pass-through key seen for the first time. */
static int accept_value(wxg_conf_t *conf, const char *key, const char *value, int rank,
                        const char *origin, pending *p, entry **slot, char *errstr,
                        size_t errstr_size)
{
    char why[512] = "";
    int rc = 0;
    p->idx = keydef_index(key);
    p->secret = wxg_conf_key_is_secret(key);
    *slot = NULL;
    if (p->idx >= 0) {
        rc = accept_table_key(conf, key, value, rank, origin, p, errstr, errstr_size);
        if (rc == 0)
            *slot = &conf->tab[p->idx];
    } else if (has_prefix(key, "kafka.") && strlen(key) > 6) {
        rc = kafka_validate(conf, key, value, p->secret, why, sizeof why);
        if (rc != 0)
            wxg__errf(errstr, errstr_size, "%s (%s)", why, origin);
        else
            *slot = extra_find(conf, key);
    } else if (has_prefix(key, "plugin.")) {
        rc = accept_plugin_key(key, origin, errstr, errstr_size);
        if (rc == 0)
            *slot = extra_find(conf, key);
    } else {
        rc = refuse_unknown_key(key, origin, errstr, errstr_size);
    }
    return rc;
}

/* Decides whether a value from `rank` replaces what `e` holds. *keep is set when a higher
 * source already set the key (the new value was still checked). The same key twice in one file
 * is an error, and so is a secret given in the environment both itself and with __FILE (the
 * order of the environment is no order to pick one by); the same rank from two calls (two --set
 * flags) is a warning and the later wins. */
static int check_precedence(wxg_conf_t *conf, const entry *e, const char *key, int rank, int srcid,
                            int via_file, const char *origin, int *keep, char *errstr,
                            size_t errstr_size)
{
    *keep = 0;
    if (e == NULL || e->value == NULL)
        return 0;
    if (e->rank > rank) {
        *keep = 1;
        return 0;
    }
    if (e->rank != rank || rank == RANK_DEFAULT)
        return 0;
    if ((rank == RANK_FILE || (rank == RANK_ENV && (via_file || e->via_file))) &&
        e->srcid == srcid) {
        wxg__errf(errstr, errstr_size, "%s is set twice: %s and %s", key, e->origin, origin);
        return WXG_ECONFIG;
    }
    return warn(conf, "%s is set more than once; %s wins over %s", key, origin, e->origin);
}

/* A new pass-through entry at the end of conf->extra, zeroed. NULL when out of memory. */
static entry *extra_append(wxg_conf_t *conf)
{
    if (conf->nextra == conf->capextra) {
        size_t cap = conf->capextra ? conf->capextra * 2 : 16;
        entry *x = realloc(conf->extra, cap * sizeof *x);
        if (x == NULL)
            return NULL;
        conf->extra = x;
        conf->capextra = cap;
    }
    entry *e = &conf->extra[conf->nextra++];
    memset(e, 0, sizeof *e);
    return e;
}

/* Replaces the value in `e` (NULL: a new pass-through entry) by copies of key, value and
 * origin and the parsed form in `p`, whose items it takes. On WXG_ENOMEM nothing changes. */
static int store_value(wxg_conf_t *conf, entry *e, const char *key, const char *value, int rank,
                       int srcid, const char *origin, pending *p)
{
    entry fresh = {0};
    fresh.secret = p->secret;
    fresh.key = xstrdup(key);
    fresh.value = xstrdup(value);
    fresh.origin = xstrdup(origin);
    if (fresh.key == NULL || fresh.value == NULL || fresh.origin == NULL)
        goto fail;
    if (e == NULL && (e = extra_append(conf)) == NULL)
        goto fail;
    fresh.rank = rank;
    fresh.srcid = srcid;
    fresh.via_file = p->via_file;
    fresh.def = p->idx >= 0 ? &keys[p->idx] : NULL;
    fresh.num = p->num;
    fresh.items = p->items;
    fresh.nitems = p->nitems;
    p->items = NULL;
    p->nitems = 0;
    entry_clear(e);
    *e = fresh;
    return 0;
fail:
    entry_clear(&fresh);
    return WXG_ENOMEM;
}

/* Sets `key` to `value` from a source of `rank`. `origin` describes the source for messages.
 * The steps: the checks every key and value pass; the value parsed and checked by its key's
 * family, which also says where it goes; whether it wins over what is there; storing it. */
static int conf_put(wxg_conf_t *conf, const char *key, const char *value, int rank, int srcid,
                    int via_file, const char *origin, char *errstr, size_t errstr_size)
{
    pending p = {.idx = -1, .via_file = via_file};
    entry *e = NULL;
    int keep = 0;
    int rc = check_key_and_value(key, value, origin, errstr, errstr_size);
    if (rc == 0)
        rc = accept_value(conf, key, value, rank, origin, &p, &e, errstr, errstr_size);
    if (rc == 0)
        rc = check_precedence(conf, e, key, rank, srcid, via_file, origin, &keep, errstr,
                              errstr_size);
    if (rc == 0 && !keep)
        rc = store_value(conf, e, key, value, rank, srcid, origin, &p);
    pending_free(&p);
    return rc;
}

/* ---- secrets from files -------------------------------------------------------------------- */

#define ENV_FILE_SUFFIX "__FILE"
#define KEY_FILE_SUFFIX "@file"

/* Refuses a key named in the file form that may not be: an unknown key as any unknown key, a
 * known one because it is not a secret. */
static int refuse_file_form(const char *key, const char *origin, char *errstr, size_t errstr_size)
{
    if (keydef_index(key) < 0 && !has_prefix(key, "kafka.") && !has_prefix(key, "plugin."))
        return refuse_unknown_key(key, origin, errstr, errstr_size);
    wxg__errf(errstr, errstr_size,
              "%s is not a secret key: only secret keys are read from a file; give its value "
              "itself (%s)",
              key, origin);
    return WXG_ECONFIG;
}

/* Reads the value of secret `key` from the file `path` into *out (the caller wipes and frees
 * it). Exactly one trailing newline ("\n" or "\r\n") is dropped: editors and `echo` add one,
 * and a secret that really ends in a newline could not be written in any other source either.
 * Errors name the key and the path, never the content. */
static int read_secret_file(const char *key, const char *path, const char *origin, char **out,
                            char *errstr, size_t errstr_size)
{
    int rc = 0;
    size_t len = 0, cap = VALUE_MAX + 3; /* room to see that a value is too long */
    char *buf = NULL;
    struct stat st;
    /* O_NONBLOCK: a FIFO named by mistake must not hang the start; it is refused below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        wxg__errf(errstr, errstr_size, "%s: cannot read the secret file %s: %s (%s)", key, path,
                  strerror(errno), origin);
        return WXG_EIO;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        wxg__errf(errstr, errstr_size, "%s: the secret file %s is not a regular file (%s)", key,
                  path, origin);
        rc = WXG_EIO;
        goto out;
    }
    buf = malloc(cap + 1);
    if (buf == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        rc = WXG_ENOMEM;
        goto out;
    }
    while (len < cap) {
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            wxg__errf(errstr, errstr_size, "%s: cannot read the secret file %s: %s (%s)", key, path,
                      strerror(errno), origin);
            rc = WXG_EIO;
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (len > 0 && buf[len - 1] == '\n') {
        len--;
        if (len > 0 && buf[len - 1] == '\r')
            len--;
    }
    if (len > VALUE_MAX) {
        wxg__errf(errstr, errstr_size, "%s: the secret file %s is longer than %d bytes (%s)", key,
                  path, VALUE_MAX, origin);
        rc = WXG_ECONFIG;
        goto out;
    }
    if (memchr(buf, '\0', len) != NULL) {
        wxg__errf(errstr, errstr_size, "%s: the secret file %s holds a NUL byte (%s)", key, path,
                  origin);
        rc = WXG_ECONFIG;
        goto out;
    }
    buf[len] = '\0';
    *out = buf;
    buf = NULL;
out:
    if (buf != NULL) {
        explicit_bzero(buf, cap + 1);
        free(buf);
    }
    close(fd);
    return rc;
}

/* Sets secret `key` to the content of the file `path`, as a value from `rank`; the origin is
 * `source` with the path appended. */
static int put_from_file(wxg_conf_t *conf, const char *key, const char *path, int rank, int srcid,
                         const char *source, char *errstr, size_t errstr_size)
{
    char origin[1024];
    char *value = NULL;
    snprintf(origin, sizeof origin, "%s (%s)", source, path);
    if (!wxg_conf_key_is_secret(key))
        return refuse_file_form(key, origin, errstr, errstr_size);
    int rc = read_secret_file(key, path, origin, &value, errstr, errstr_size);
    if (rc == 0)
        rc = conf_put(conf, key, value, rank, srcid, 1, origin, errstr, errstr_size);
    wipe_free(value, 1);
    return rc;
}

/* ---- sources ------------------------------------------------------------------------------- */

wxg_conf_t *wxg_conf_new(unsigned program, char *errstr, size_t errstr_size)
{
    wxg_conf_t *conf = calloc(1, sizeof *conf);
    if (conf == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    conf->program = program;
    for (size_t i = 0; i < NKEYS; i++) {
        /* Defaults are checked like any value: a bad table entry fails here, and in the unit
         * tests, instead of at the first use of the key. */
        int rc = conf_put(conf, keys[i].name, keys[i].def, RANK_DEFAULT, 0, 0, "default", errstr,
                          errstr_size);
        if (rc != 0) {
            wxg_conf_free(conf);
            return NULL;
        }
    }
    conf->next_srcid = 1;
    conf->cli_srcid = -1;
    return conf;
}

void wxg_conf_free(wxg_conf_t *conf)
{
    if (conf == NULL)
        return;
    for (size_t i = 0; i < NKEYS; i++)
        entry_clear(&conf->tab[i]);
    for (size_t i = 0; i < conf->nextra; i++)
        entry_clear(&conf->extra[i]);
    free(conf->extra);
    for (size_t i = 0; i < conf->nwarn; i++)
        free(conf->warnings[i]);
    free(conf->warnings);
    if (conf->scratch != NULL)
        rd_kafka_conf_destroy(conf->scratch); /* librdkafka wipes its sensitive values */
    free(conf);
}

/* Appends `key` to the comma-separated list in `buf` (cut short when it does not fit). */
static void list_append(char *buf, size_t size, const char *key)
{
    size_t o = strlen(buf);
    if (o + 1 < size)
        snprintf(buf + o, size - o, "%s%s", o ? ", " : "", key);
}

/* Whether the value of secret `key` really holds a secret, for the warning about a file others
 * can read. Connection strings (dsn) are secrets by name because they may carry a password; one
 * without (libpq's "host=... user=...", a URL without user:password@) holds none, and a
 * configuration that keeps the password elsewhere (PGPASSWORD, a secret file) should not draw the
 * warning on every start. */
static int value_holds_secret(const char *key, const char *value)
{
    if (*value == '\0')
        return 0;
    if (keydef_index(key) >= 0 || !ends_with(key, "dsn"))
        return 1;
    if (strstr(value, "password") != NULL)
        return 1;
    const char *scheme = strstr(value, "://");
    const char *at = scheme != NULL ? strchr(scheme + 3, '@') : NULL;
    const char *colon = scheme != NULL ? strchr(scheme + 3, ':') : NULL;
    return at != NULL && colon != NULL && colon < at;
}

/* wxg_conf_load_string, also listing in `secrets` (when not NULL) the secret keys the text
 * gives a value of its own, for the warning about a file others can read. */
static int load_text(wxg_conf_t *conf, const char *text, size_t len, const char *origin,
                     char *secrets, size_t secrets_size, char *errstr, size_t errstr_size)
{
    int rc = 0;
    if (conf == NULL || text == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return WXG_EINVAL;
    }
    if (origin == NULL)
        origin = "(text)";
    if (len > FILE_MAX) {
        wxg__errf(errstr, errstr_size, "%s: larger than %d bytes", origin, FILE_MAX);
        return WXG_ECONFIG;
    }
    if (memchr(text, '\0', len) != NULL) {
        wxg__errf(errstr, errstr_size, "%s: holds a NUL byte (not a text file)", origin);
        return WXG_ECONFIG;
    }
    char *copy = xstrndup(text, len);
    if (copy == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    int srcid = conf->next_srcid++;
    char *line = copy;
    if (len >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0)
        line += 3; /* a UTF-8 byte order mark left by some editors */
    for (size_t lineno = 1; line != NULL; lineno++) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        char *s = trim(line);
        line = nl ? nl + 1 : NULL;
        if (*s == '\0' || *s == '#' || *s == '!')
            continue;
        char where[512];
        snprintf(where, sizeof where, "file %s:%zu", origin, lineno);
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            wxg__errf(errstr, errstr_size, "%s: expected key = value", where);
            rc = WXG_ECONFIG;
            break;
        }
        *eq = '\0';
        char *key = trim(s);
        char *value = trim(eq + 1);
        size_t klen = strlen(key);
        if (ends_with(key, KEY_FILE_SUFFIX)) {
            key[klen - strlen(KEY_FILE_SUFFIX)] = '\0';
            rc = put_from_file(conf, key, value, RANK_FILE, srcid, where, errstr, errstr_size);
        } else {
            rc = conf_put(conf, key, value, RANK_FILE, srcid, 0, where, errstr, errstr_size);
            if (rc == 0 && secrets != NULL && wxg_conf_key_is_secret(key) &&
                value_holds_secret(key, value))
                list_append(secrets, secrets_size, key);
        }
        if (rc != 0)
            break;
    }
    explicit_bzero(copy, len); /* the text may hold secrets */
    free(copy);
    return rc;
}

int wxg_conf_load_string(wxg_conf_t *conf, const char *text, size_t len, const char *origin,
                         char *errstr, size_t errstr_size)
{
    return load_text(conf, text, len, origin, NULL, 0, errstr, errstr_size);
}

int wxg_conf_load_file(wxg_conf_t *conf, const char *path, char *errstr, size_t errstr_size)
{
    int rc = 0;
    char *buf = NULL;
    size_t len = 0;
    if (conf == NULL || path == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return WXG_EINVAL;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        wxg__errf(errstr, errstr_size, "%s: cannot open: %s", path, strerror(errno));
        return WXG_EIO;
    }
    buf = malloc(FILE_MAX + 1);
    if (buf == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        rc = WXG_ENOMEM;
        goto out;
    }
    len = fread(buf, 1, FILE_MAX + 1, f);
    if (ferror(f)) {
        wxg__errf(errstr, errstr_size, "%s: read error", path);
        rc = WXG_EIO;
        goto out;
    }
    char secrets[512] = "";
    rc = load_text(conf, buf, len, path, secrets, sizeof secrets, errstr, errstr_size);
    /* The mode of the file that was read (fstat on the open stream, not a second lookup by
     * name). Anyone in its group, or anyone at all, can read a secret in it. Secret files named
     * with @file are not checked: the orchestrators mount them 0644 by default, and the pod's
     * manifest, not the service, is where their mode is decided. */
    struct stat st;
    if (rc == 0 && secrets[0] != '\0' && fstat(fileno(f), &st) == 0 && (st.st_mode & 077)) {
        rc = warn(conf,
                  "%s is readable by group or others (mode %04o) and holds secrets: %s; make it "
                  "readable by the service user only (chmod 600), or read each secret from a "
                  "file of its own (<key>@file, WXG_<KEY>__FILE)",
                  path, (unsigned)(st.st_mode & 07777), secrets);
    }
out:
    if (buf != NULL) {
        explicit_bzero(buf, len);
        free(buf);
    }
    fclose(f);
    return rc;
}

/* The WXG_ variable name of a table key: upper case, '.' and '-' as '_'. */
static void env_name(const char *key, char *buf, size_t size)
{
    size_t o = 0;
    o += (size_t)snprintf(buf, size, "WXG_");
    for (const char *p = key; *p && o + 1 < size; p++) {
        char c = *p;
        buf[o++] = (c == '.' || c == '-') ? '_' : (char)toupper((unsigned char)c);
    }
    buf[o < size ? o : size - 1] = '\0';
}

/* lower-case, '_' -> '.' (when dots), into buf. */
static void env_prop(const char *s, size_t n, int dots, char *buf, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < size; i++) {
        char c = (char)tolower((unsigned char)s[i]);
        buf[o++] = (dots && c == '_') ? '.' : c;
    }
    buf[o] = '\0';
}

/* Whether librdkafka knows `prop`: setting the value on a throw-away configuration tells. */
static int kafka_knows(const char *prop, const char *value)
{
    char why[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (c == NULL)
        return 0;
    rd_kafka_conf_res_t res = rd_kafka_conf_set(c, prop, value, why, sizeof why);
    rd_kafka_conf_destroy(c);
    return res != RD_KAFKA_CONF_UNKNOWN;
}

/* The table key whose variable is `name`, into key ("" when none). The name is matched against
 * the table, not decoded, because '_' stands for both '.' and '-'. */
static void env_table_key(const char *name, char *key, size_t size)
{
    key[0] = '\0';
    for (size_t k = 0; k < NKEYS; k++) {
        char en[256];
        env_name(keys[k].name, en, sizeof en);
        if (strcmp(en, name) == 0) {
            snprintf(key, size, "%s", keys[k].name);
            return;
        }
    }
}

/* The key the variable `name` sets: a table key, or a kafka.* / plugin.* key through the double
 * underscore escapes ("" when none). `value` helps tell librdkafka's property names apart. */
static void env_key(const char *name, const char *value, char *key, size_t size)
{
    size_t nlen = strlen(name);
    env_table_key(name, key, size);
    if (key[0] == '\0' && has_prefix(name, "WXG_KAFKA__") && nlen > 11) {
        char prop[256];
        env_prop(name + 11, nlen - 11, 1, prop, sizeof prop);
        if (!kafka_knows(prop, value))
            env_prop(name + 11, nlen - 11, 0, prop, sizeof prop);
        snprintf(key, size, "kafka.%s", prop);
    } else if (key[0] == '\0' && has_prefix(name, "WXG_PLUGIN__")) {
        const char *pname = name + 12;
        const char *sep = strstr(pname, "__");
        if (sep != NULL && sep > pname && sep[2] != '\0') {
            char plugin[128], prop[128];
            env_prop(pname, (size_t)(sep - pname), 0, plugin, sizeof plugin);
            env_prop(sep + 2, strlen(sep + 2), 1, prop, sizeof prop);
            snprintf(key, size, "plugin.%s.%s", plugin, prop);
        }
    }
}

int wxg_conf_load_env(wxg_conf_t *conf, const char *const *envp, char *errstr, size_t errstr_size)
{
    int rc = 0;
    if (conf == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return WXG_EINVAL;
    }
    if (envp == NULL)
        envp = (const char *const *)environ;
    int srcid = conf->next_srcid++;
    for (size_t i = 0; envp[i] != NULL && rc == 0; i++) {
        const char *var = envp[i];
        const char *eq = strchr(var, '=');
        if (!has_prefix(var, "WXG_") || eq == NULL)
            continue;
        size_t nlen = (size_t)(eq - var);
        const char *value = eq + 1;
        char name[256];
        char key[512];
        char origin[300];
        if (nlen >= sizeof name)
            continue;
        memcpy(name, var, nlen);
        name[nlen] = '\0';
        snprintf(origin, sizeof origin, "env %s", name);
        /* A table key's own variable first, so that WXG_REDIS_TLS_KEY_FILE stays the variable
         * of redis.tls.key.file; then the __FILE form of a secret; then the escapes. */
        int via_file = 0;
        env_table_key(name, key, sizeof key);
        if (key[0] == '\0' && ends_with(name, ENV_FILE_SUFFIX) &&
            nlen > strlen("WXG_") + strlen(ENV_FILE_SUFFIX)) {
            char base[256];
            snprintf(base, sizeof base, "%.*s", (int)(nlen - strlen(ENV_FILE_SUFFIX)), name);
            env_key(base, "", key, sizeof key);
            via_file = key[0] != '\0';
        }
        if (key[0] == '\0')
            env_key(name, value, key, sizeof key);
        if (key[0] == '\0') {
            rc = warn(conf, "environment variable %s is not a configuration key; ignored", name);
            continue;
        }
        if (via_file)
            rc = put_from_file(conf, key, value, RANK_ENV, srcid, origin, errstr, errstr_size);
        else
            rc = conf_put(conf, key, value, RANK_ENV, srcid, 0, origin, errstr, errstr_size);
    }
    return rc;
}

int wxg_conf_set(wxg_conf_t *conf, const char *key, const char *value, char *errstr,
                 size_t errstr_size)
{
    if (conf == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return WXG_EINVAL;
    }
    if (conf->cli_srcid < 0)
        conf->cli_srcid = conf->next_srcid++;
    if (key != NULL && value != NULL && ends_with(key, KEY_FILE_SUFFIX)) {
        char base[256];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(key) - strlen(KEY_FILE_SUFFIX)), key);
        return put_from_file(conf, base, value, RANK_CLI, conf->cli_srcid, "--set", errstr,
                             errstr_size);
    }
    int rc = conf_put(conf, key, value, RANK_CLI, conf->cli_srcid, 0, "--set", errstr, errstr_size);
    /* Every local user can read a process's arguments (/proc/<pid>/cmdline, ps). */
    if (rc == 0 && *value != '\0' && wxg_conf_key_is_secret(key)) {
        char en[256];
        env_name(key, en, sizeof en);
        rc = keydef_index(key) >= 0
                 ? warn(conf,
                        "%s is a secret given with --set, which every local user can read in "
                        "the process's command line; give it with %s, %s__FILE or %s@file "
                        "instead",
                        key, en, en, key)
                 : warn(conf,
                        "%s is a secret given with --set, which every local user can read in "
                        "the process's command line; give it in the environment or with "
                        "%s@file instead",
                        key, key);
    }
    return rc;
}

int wxg_conf_set_arg(wxg_conf_t *conf, const char *arg, char *errstr, size_t errstr_size)
{
    if (conf == NULL || arg == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return WXG_EINVAL;
    }
    const char *eq = strchr(arg, '=');
    if (eq == NULL) {
        char echo[ECHO_MAX + 16];
        echo_value(arg, echo, sizeof echo);
        wxg__errf(errstr, errstr_size, "--set %s: expected key=value", echo);
        return WXG_ECONFIG;
    }
    char *key = xstrndup(arg, (size_t)(eq - arg));
    if (key == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    int rc = wxg_conf_set(conf, trim(key), eq + 1, errstr, errstr_size);
    free(key);
    return rc;
}

static const entry *lookup(const wxg_conf_t *conf, const char *key)
{
    if (conf == NULL || key == NULL)
        return NULL;
    long idx = keydef_index(key);
    if (idx >= 0)
        return &conf->tab[idx];
    return extra_find(conf, key);
}

int wxg_conf_check(wxg_conf_t *conf, char *errstr, size_t errstr_size)
{
    if (conf == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return WXG_EINVAL;
    }
    for (size_t i = 0; i < NKEYS; i++) {
        const wxg_conf_keydef_t *def = &keys[i];
        const entry *e = &conf->tab[i];
        if (!(def->flags & WXG_CONF_REQUIRED) || !(def->programs & conf->program))
            continue;
        if (e->value[0] == '\0') {
            char en[256];
            env_name(def->name, en, sizeof en);
            wxg__errf(errstr, errstr_size,
                      "%s: required but not set (set it in the file, with %s or with --set %s=...)",
                      def->name, en, def->name);
            return WXG_ECONFIG;
        }
    }
    if (conf->program & WXG_PROG_CONSUMER) {
        int64_t lo = wxg_conf_int(conf, "consumer.retry.backoff.initial.ms");
        int64_t hi = wxg_conf_int(conf, "consumer.retry.backoff.max.ms");
        if (lo > hi) {
            wxg__errf(errstr, errstr_size,
                      "consumer.retry.backoff.initial.ms (%s) is larger than "
                      "consumer.retry.backoff.max.ms (%s)",
                      wxg_conf_get(conf, "consumer.retry.backoff.initial.ms"),
                      wxg_conf_get(conf, "consumer.retry.backoff.max.ms"));
            return WXG_ECONFIG;
        }
        if (wxg_conf_int(conf, "consumer.batch.max") >
            wxg_conf_int(conf, "consumer.queue.capacity")) {
            wxg__errf(errstr, errstr_size,
                      "consumer.batch.max (%s) is larger than consumer.queue.capacity (%s)",
                      wxg_conf_get(conf, "consumer.batch.max"),
                      wxg_conf_get(conf, "consumer.queue.capacity"));
            return WXG_ECONFIG;
        }
    }
    return 0;
}

wxg_conf_t *wxg_conf_load(unsigned program, const char *path, const char *const *envp,
                          const char *const *sets, size_t nsets, char *errstr, size_t errstr_size)
{
    wxg_conf_t *conf = wxg_conf_new(program, errstr, errstr_size);
    if (conf == NULL)
        return NULL;
    if (path != NULL && wxg_conf_load_file(conf, path, errstr, errstr_size) != 0)
        goto fail;
    if (wxg_conf_load_env(conf, envp, errstr, errstr_size) != 0)
        goto fail;
    for (size_t i = 0; i < nsets; i++) {
        if (wxg_conf_set_arg(conf, sets[i], errstr, errstr_size) != 0)
            goto fail;
    }
    if (wxg_conf_check(conf, errstr, errstr_size) != 0)
        goto fail;
    return conf;
fail:
    wxg_conf_free(conf);
    return NULL;
}

/* ---- getters ------------------------------------------------------------------------------- */

const char *wxg_conf_get(const wxg_conf_t *conf, const char *key)
{
    const entry *e = lookup(conf, key);
    return e != NULL ? e->value : NULL;
}

const char *wxg_conf_origin(const wxg_conf_t *conf, const char *key)
{
    const entry *e = lookup(conf, key);
    return e != NULL ? e->origin : NULL;
}

int wxg_conf_get_int(const wxg_conf_t *conf, const char *key, int64_t *out)
{
    long idx = keydef_index(key);
    if (conf == NULL || idx < 0)
        return WXG_ENOTFOUND;
    switch (keys[idx].type) {
    case WXG_CONF_INT:
    case WXG_CONF_DURATION:
    case WXG_CONF_SIZE:
    case WXG_CONF_BOOL:
        if (out != NULL)
            *out = conf->tab[idx].num;
        return 0;
    default:
        return WXG_EINVAL;
    }
}

int64_t wxg_conf_int(const wxg_conf_t *conf, const char *key)
{
    int64_t v = 0;
    return wxg_conf_get_int(conf, key, &v) == 0 ? v : 0;
}

int wxg_conf_bool(const wxg_conf_t *conf, const char *key)
{
    const wxg_conf_keydef_t *def = wxg_conf_keydef_find(key);
    if (def == NULL || def->type != WXG_CONF_BOOL)
        return 0;
    return wxg_conf_int(conf, key) != 0;
}

size_t wxg_conf_list(const wxg_conf_t *conf, const char *key, const char *const **items)
{
    long idx = keydef_index(key);
    if (conf == NULL || idx < 0 || keys[idx].type != WXG_CONF_LIST)
        return 0;
    if (items != NULL)
        *items = (const char *const *)conf->tab[idx].items;
    return conf->tab[idx].nitems;
}

size_t wxg_conf_warning_count(const wxg_conf_t *conf)
{
    return conf != NULL ? conf->nwarn : 0;
}

const char *wxg_conf_warning(const wxg_conf_t *conf, size_t i)
{
    return (conf != NULL && i < conf->nwarn) ? conf->warnings[i] : NULL;
}

static int cmp_entry_ptr(const void *a, const void *b)
{
    const entry *x = *(const entry *const *)a;
    const entry *y = *(const entry *const *)b;
    return strcmp(x->key, y->key);
}

static int print_entry(const entry *e, FILE *out)
{
    if (e->rank != RANK_DEFAULT && fprintf(out, "# from %s\n", e->origin) < 0)
        return WXG_EIO;
    const char *v = (e->secret && e->value[0] != '\0') ? "***" : e->value;
    if (fprintf(out, "%s = %s\n", e->key, v) < 0)
        return WXG_EIO;
    return 0;
}

int wxg_conf_print(const wxg_conf_t *conf, FILE *out)
{
    int rc = 0;
    const entry **sorted = NULL;
    if (conf == NULL || out == NULL)
        return WXG_EINVAL;
    if (fprintf(out, "# effective configuration (secrets are shown as ***)\n") < 0)
        return WXG_EIO;
    for (size_t i = 0; i < NKEYS && rc == 0; i++) {
        if (keys[i].programs & conf->program)
            rc = print_entry(&conf->tab[i], out);
    }
    if (rc != 0 || conf->nextra == 0)
        return rc;
    sorted = malloc(conf->nextra * sizeof *sorted);
    if (sorted == NULL)
        return WXG_ENOMEM;
    for (size_t i = 0; i < conf->nextra; i++)
        sorted[i] = &conf->extra[i];
    qsort(sorted, conf->nextra, sizeof *sorted, cmp_entry_ptr);
    for (size_t i = 0; i < conf->nextra && rc == 0; i++)
        rc = print_entry(sorted[i], out);
    free(sorted);
    if (rc == 0 && fflush(out) != 0)
        rc = WXG_EIO;
    return rc;
}

/* ---- hand-offs ----------------------------------------------------------------------------- */

static int kafka_apply(rd_kafka_conf_t *rk, const entry *e, char *errstr, size_t errstr_size)
{
    char why[512];
    if (!has_prefix(e->key, "kafka.") || e->value[0] == '\0')
        return 0;
    if (rd_kafka_conf_set(rk, e->key + 6, e->value, why, sizeof why) != RD_KAFKA_CONF_OK) {
        wxg__errf(errstr, errstr_size, "%s: librdkafka refused the value%s%s", e->key,
                  e->secret ? "" : ": ", e->secret ? "" : why);
        return WXG_ECONFIG;
    }
    return 0;
}

struct rd_kafka_conf_s *wxg_conf_kafka(const wxg_conf_t *conf, char *errstr, size_t errstr_size)
{
    if (conf == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return NULL;
    }
    rd_kafka_conf_t *rk = rd_kafka_conf_new();
    if (rk == NULL) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < NKEYS; i++) {
        if (kafka_apply(rk, &conf->tab[i], errstr, errstr_size) != 0)
            goto fail;
    }
    for (size_t i = 0; i < conf->nextra; i++) {
        if (kafka_apply(rk, &conf->extra[i], errstr, errstr_size) != 0)
            goto fail;
    }
    /* librdkafka's own lines go through the log module instead of raw stderr. */
    rd_kafka_conf_set_log_cb(rk, wxg_log_kafka);
    return rk;
fail:
    rd_kafka_conf_destroy(rk);
    return NULL;
}

static int cmp_kv(const void *a, const void *b)
{
    return strcmp(((const wxg_conf_kv_t *)a)->key, ((const wxg_conf_kv_t *)b)->key);
}

void wxg_conf_map_free(wxg_conf_map_t *map)
{
    if (map == NULL)
        return;
    for (size_t i = 0; i < map->count; i++) {
        wipe_free((char *)map->items[i].value, 1);
        free((char *)map->items[i].key);
    }
    free((void *)map->items);
    free(map);
}

/* The keys under `prefix` (declared ones with their effective values, then pass-through ones),
 * with the first `strip` bytes of each key removed, sorted by key. */
static wxg_conf_map_t *prefix_map(const wxg_conf_t *conf, const char *prefix, size_t strip)
{
    wxg_conf_kv_t *items = NULL;
    size_t n = 0;
    wxg_conf_map_t *map = calloc(1, sizeof *map);
    items = calloc(NKEYS + conf->nextra + 1, sizeof *items);
    if (map == NULL || items == NULL)
        goto fail;
    map->items = items;
    for (size_t pass = 0; pass < 2; pass++) {
        size_t count = pass == 0 ? NKEYS : conf->nextra;
        for (size_t i = 0; i < count; i++) {
            const entry *e = pass == 0 ? &conf->tab[i] : &conf->extra[i];
            if (e->key == NULL || e->value == NULL || !has_prefix(e->key, prefix))
                continue;
            items[n].key = xstrdup(e->key + strip);
            items[n].value = xstrdup(e->value);
            n++;
            map->count = n;
            if (items[n - 1].key == NULL || items[n - 1].value == NULL)
                goto fail;
        }
    }
    qsort(items, n, sizeof *items, cmp_kv);
    return map;
fail:
    if (map == NULL)
        free(items);
    wxg_conf_map_free(map);
    return NULL;
}

wxg_conf_map_t *wxg_conf_plugin_map(const wxg_conf_t *conf, const char *plugin)
{
    char prefix[256];
    if (conf == NULL || plugin == NULL)
        return NULL;
    int plen = snprintf(prefix, sizeof prefix, "plugin.%s.", plugin);
    if (plen < 0 || (size_t)plen >= sizeof prefix)
        return NULL;
    return prefix_map(conf, prefix, (size_t)plen);
}

wxg_conf_map_t *wxg_conf_plugin_settings(const wxg_conf_t *conf)
{
    if (conf == NULL)
        return NULL;
    return prefix_map(conf, "plugin.", 0);
}

const char *wxg_conf_map_get(const wxg_conf_map_t *map, const char *key)
{
    if (map == NULL || key == NULL)
        return NULL;
    for (size_t i = 0; i < map->count; i++) {
        if (strcmp(map->items[i].key, key) == 0)
            return map->items[i].value;
    }
    return NULL;
}
