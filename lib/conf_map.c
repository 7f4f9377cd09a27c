/*
 * DESIGN: configuration keys to the guard's and the consumer's configuration.
 *
 * Purpose: the one place where redis.*, guard.* and consumer.* keys become a wxg_guard_conf_t
 * and a wxg_consumer_conf_t. Every program that opens the guard (wxguard-consumer, wxguardctl,
 * wxguard-bench) calls wxg_conf_guard(), so that all of them reach the same Redis, write under the
 * same prefix, wait for the same replicas and compute the same compact DONE layout; a program that
 * built its own copy would drift (a missing key there is a silent default). tests/unit/test_conf.c
 * sets every redis.*, guard.* and consumer.* key of the table and checks that each one changes
 * what these functions fill, so a key added to the table without a mapping fails a test.
 *
 * This file is separate from lib/conf.c because it sits above the guard and the consumer: conf.c
 * knows neither, and a program that only reads keys (wxguard-ingest) links neither through it.
 *
 * Threads and locks: none; the functions only read a loaded configuration, which any thread may
 * do. Failure modes: a value the guard would refuse is reported here with its key named (the
 * table refuses it already, so this is a second line), WXG_ECONFIG.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err_int.h"
#include "wxguard/conf.h"
#include "wxguard/consumer.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"
#include "wxguard/msg.h"

/* An optional string key's value, or NULL when it is empty: their default is "", the guard's
 * is "not set". */
static const char *optional(const wxg_conf_t *conf, const char *key)
{
    const char *s = wxg_conf_get(conf, key);
    return s && *s ? s : NULL;
}

/* redis.key.prefix with a ':' after it unless it ends in one: keys read <prefix>:<kind>... */
static int key_prefix(const wxg_conf_t *conf, char *buf, size_t size, char *errstr,
                      size_t errstr_size)
{
    const char *pfx = wxg_conf_get(conf, "redis.key.prefix");
    size_t len = pfx ? strlen(pfx) : 0;
    if (len == 0) {
        wxg__errf(errstr, errstr_size, "redis.key.prefix: must not be empty");
        return WXG_ECONFIG;
    }
    const char *colon = pfx[len - 1] == ':' ? "" : ":";
    size_t need = len + strlen(colon);
    if (need > WXG_GUARD_PREFIX_MAX) {
        wxg__errf(errstr, errstr_size, "redis.key.prefix: longer than %d bytes with its ':'",
                  WXG_GUARD_PREFIX_MAX);
        return WXG_ECONFIG;
    }
    if (buf == NULL || size <= need) {
        wxg__errf(errstr, errstr_size, "redis.key.prefix: no room for the prefix");
        return WXG_EINVAL;
    }
    snprintf(buf, size, "%s%s", pfx, colon);
    return 0;
}

int wxg_conf_guard(const wxg_conf_t *conf, wxg_guard_conf_t *out, char *prefix, size_t prefix_size,
                   char *errstr, size_t errstr_size)
{
    if (conf == NULL || out == NULL) {
        wxg__errf(errstr, errstr_size, "no configuration");
        return WXG_EINVAL;
    }
    wxg_guard_conf_t gc;
    wxg_guard_conf_init(&gc);
    int rc = key_prefix(conf, prefix, prefix_size, errstr, errstr_size);
    if (rc != 0)
        return rc;
    gc.prefix = prefix;

    /* Where Redis is and who we are there. */
    gc.host = wxg_conf_get(conf, "redis.host");
    gc.port = (int)wxg_conf_int(conf, "redis.port");
    gc.unix_path = optional(conf, "redis.unix.socket");
    gc.db = (int)wxg_conf_int(conf, "redis.db");
    gc.user = optional(conf, "redis.user");
    gc.password = optional(conf, "redis.password");
    gc.sentinels = optional(conf, "redis.sentinels");
    gc.sentinel_master = optional(conf, "redis.sentinel.master");
    gc.sentinel_user = optional(conf, "redis.sentinel.user");
    gc.sentinel_password = optional(conf, "redis.sentinel.password");
    gc.cluster_nodes = optional(conf, "redis.cluster.nodes");
    if (gc.cluster_nodes && gc.sentinels) {
        wxg__errf(errstr, errstr_size,
                  "redis.cluster.nodes and redis.sentinels cannot both be set: a Redis Cluster "
                  "fails over by itself; point redis.cluster.nodes at the cluster's nodes, or "
                  "redis.sentinels at the Sentinels of one primary");
        return WXG_ECONFIG;
    }
    if (gc.cluster_nodes && wxg_conf_int(conf, "redis.db") != 0) {
        wxg__errf(errstr, errstr_size,
                  "redis.db must be 0 with redis.cluster.nodes (a Redis "
                  "Cluster has only database 0)");
        return WXG_ECONFIG;
    }
    gc.cluster = gc.cluster_nodes != NULL; /* one shard per script call */
    gc.tls = wxg_conf_bool(conf, "redis.tls");
    gc.tls_ca_file = optional(conf, "redis.tls.ca.file");
    gc.tls_ca_path = optional(conf, "redis.tls.ca.path");
    gc.tls_cert_file = optional(conf, "redis.tls.cert.file");
    gc.tls_key_file = optional(conf, "redis.tls.key.file");
    gc.tls_key_password = optional(conf, "redis.tls.key.password");
    gc.tls_server_name = optional(conf, "redis.tls.server.name");
    gc.tls_verify = wxg_conf_bool(conf, "redis.tls.verify");
    gc.sentinel_tls = wxg_conf_bool(conf, "redis.sentinel.tls");
    gc.client_name = optional(conf, "redis.client.name");
    gc.connect_timeout_ms = (int)wxg_conf_int(conf, "redis.connect.timeout.ms");
    gc.command_timeout_ms = (int)wxg_conf_int(conf, "redis.command.timeout.ms");

    /* The state machine's durations; the DONE retention also decides the compact layout, which
     * every program must compute alike or the guard refuses the stamp in Redis. */
    const char *design = wxg_conf_get(conf, "guard.design");
    gc.design =
        design && strcmp(design, "lua") == 0 ? WXG_GUARD_DESIGN_LUA : WXG_GUARD_DESIGN_NATIVE;
    gc.lease_ms = wxg_conf_int(conf, "guard.lease.ms");
    gc.done_retention_ms = wxg_conf_int(conf, "guard.done.retention");
    gc.failed_retention_ms = wxg_conf_int(conf, "guard.failed.retention");
    gc.wait_replicas = (int)wxg_conf_int(conf, "guard.wait.replicas");
    gc.wait_timeout_ms = (int)wxg_conf_int(conf, "guard.wait.timeout.ms");
    gc.batch_max = (int)wxg_conf_int(conf, "consumer.batch.max");
    /* The compact markers' geometry (checked by the table: a positive rate, a power of two). */
    /* "auto": 0, the layout that follows the real rate (docs/guard.md §3.6). */
    const char *rate = wxg_conf_get(conf, "guard.done.expected.rate");
    gc.done_expected_rate = strcmp(rate, "auto") == 0 ? 0 : strtod(rate, NULL);
    int64_t shards = wxg_conf_int(conf, "guard.shards");
    gc.shard_bits = 0;
    while (gc.shard_bits < 16 && (1LL << gc.shard_bits) < shards)
        gc.shard_bits++;

    *out = gc;
    return 0;
}

int wxg_conf_consumer(const wxg_conf_t *conf, wxg_consumer_conf_t *out, char *errstr,
                      size_t errstr_size)
{
    if (conf == NULL || out == NULL) {
        wxg__errf(errstr, errstr_size, "no configuration");
        return WXG_EINVAL;
    }
    wxg_consumer_conf_t cc;
    wxg_consumer_conf_init(&cc);
    /* The table allows only words the decoder knows; a word it does not know is a table that
     * drifted from the decoder, reported rather than read as "auto". */
    if (wxg_format_parse(wxg_conf_get(conf, "consumer.format"), &cc.format) != 0) {
        wxg__errf(errstr, errstr_size, "consumer.format: the decoder does not know \"%s\"",
                  wxg_conf_get(conf, "consumer.format"));
        return WXG_ECONFIG;
    }
    cc.ntopics = wxg_conf_list(conf, "consumer.topics", &cc.topics);
    cc.group_id = wxg_conf_get(conf, "kafka.group.id");
    cc.workers = (unsigned)wxg_conf_int(conf, "consumer.workers");
    cc.queue_capacity = (size_t)wxg_conf_int(conf, "consumer.queue.capacity");
    cc.batch_max = (size_t)wxg_conf_int(conf, "consumer.batch.max");
    cc.batch_delay_us = wxg_conf_int(conf, "consumer.batch.delay.ms") * 1000;
    cc.drain_timeout_ms = wxg_conf_int(conf, "consumer.drain.timeout.ms");
    cc.commit_interval_ms = wxg_conf_int(conf, "consumer.commit.interval.ms");
    cc.commit_timeout_ms = wxg_conf_int(conf, "consumer.commit.timeout.ms");
    cc.retry_max = (uint32_t)wxg_conf_int(conf, "consumer.retry.max");
    cc.backoff_initial_ms = wxg_conf_int(conf, "consumer.retry.backoff.initial.ms");
    cc.backoff_max_ms = wxg_conf_int(conf, "consumer.retry.backoff.max.ms");
    cc.max_message_bytes = (size_t)wxg_conf_int(conf, "consumer.max.message.bytes");
    cc.stall_timeout_ms = wxg_conf_int(conf, "consumer.stall.timeout.ms");
    cc.redis_probe_ms = wxg_conf_int(conf, "redis.probe.interval.ms");
    cc.done_cache_entries = (size_t)wxg_conf_int(conf, "guard.done.cache.entries");
    *out = cc;
    return 0;
}
