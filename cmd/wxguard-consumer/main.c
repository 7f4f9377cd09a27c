/*
 * wxguard-consumer: one replica of the consumer group.
 *
 *   wxguard-consumer --config FILE [--set key=value]... [--print-config]
 *
 * Reads the configuration (file, WXG_* environment, --set flags; see docs/configuration.md),
 * connects to Kafka and Redis, builds the plugin chain and runs the consumer until SIGTERM or
 * SIGINT. The first signal drains within consumer.drain.timeout.ms, commits the finished
 * watermarks synchronously and exits 0; a plugin call still running when the drain budget is
 * spent is not waited for (its message is not committed; the next owner takes it over). A
 * second signal exits at once (nothing has been committed past unfinished work, so nothing is
 * lost: it is redelivered).
 *
 * When metrics.listen is set, /metrics, /healthz and /readyz are served there (lib/httpd.c) from
 * start-up until the consumer has stopped; readiness is wxg_consumer_ready().
 *
 * Exit status: 0 clean stop, 1 fatal error while running, 2 usage or configuration error,
 * 3 start-up failure (Kafka or Redis not usable, e.g. the brokers refuse the SASL credentials).
 */
#include <errno.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wxguard/conf.h"
#include "wxguard/consumer.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"
#include "wxguard/guard.h"
#include "wxguard/httpd.h"
#include "wxguard/log.h"
#include "wxguard/metrics.h"
#include "wxguard/plugin_registry.h"

#include "progstart.h"

#define EXIT_FATAL   1
#define EXIT_USAGE   2
#define EXIT_STARTUP 3

/* How long start-up waits for a first answer from Kafka, to learn whether it takes the
 * credentials; an answer or a refusal usually comes within a second. */
#define KAFKA_CHECK_MS 10000

static wxg_consumer_t *volatile the_consumer;
static volatile sig_atomic_t signals_seen;

static void on_signal(int sig)
{
    if (signals_seen++ > 0)
        _exit(128 + sig); /* the second signal: at once */
    wxg_consumer_t *c = the_consumer;
    if (c)
        wxg_consumer_stop(c);
}

static int ready_cb(void *opaque, char *reason, size_t size)
{
    return wxg_consumer_ready(opaque, reason, size);
}

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: wxguard-consumer --config FILE [--set key=value]... [--print-config | --check]\n"
        "       wxguard-consumer --help | --version\n\n"
        "  -c, --config FILE    properties file (key = value lines, # comments)\n"
        "  -s, --set K=V        override one key (repeatable; wins over file and env)\n"
        "  -p, --print-config   print the effective configuration (secrets as ***), exit\n"
        "  -C, --check          check the configuration (keys, types, limits), exit 0 when\n"
        "                       it is valid, 2 when not; no server is contacted\n"
        "  -h, --help           this text\n"
        "  -V, --version        print the version\n\n"
        "Every key may also come from the environment as WXG_<KEY> (upper case, '.' as "
        "'_'),\ne.g. WXG_KAFKA_BOOTSTRAP_SERVERS. kafka.* keys go to librdkafka as they are.\n"
        "SIGTERM/SIGINT: drain, commit, exit 0; a second signal exits at once.\n"
        "exit status: 0 clean stop, 1 fatal error, 2 usage or configuration error, "
        "3 start-up failure\n");
}

/* Every plugin.<name>.* setting, whatever the plugin: an external plugin's name is known only
 * once the registry has loaded it, and the registry hands each plugin the keys under its
 * descriptor's name. The kv array points into `map`. */
static wxg_plugin_kv_t *plugin_settings(const wxg_conf_t *conf, wxg_conf_map_t **map_out)
{
    wxg_conf_map_t *map = wxg_conf_plugin_settings(conf);
    wxg_plugin_kv_t *kv = map ? calloc(map->count + 1, sizeof *kv) : NULL;
    if (!kv) {
        wxg_conf_map_free(map);
        fprintf(stderr, "wxguard-consumer: out of memory\n");
        exit(EXIT_FATAL);
    }
    for (size_t i = 0; i < map->count; i++) {
        kv[i].key = map->items[i].key;
        kv[i].value = map->items[i].value;
    }
    *map_out = map;
    return kv;
}

/* Warns about settings for a plugin that is not in the chain (a typo in the name, or a plugin
 * left out of `plugins`): nothing reads them. */
static void warn_unused_plugin_settings(const wxg_conf_map_t *map, const wxg_plugin_chain_t *chain)
{
    for (size_t i = 0; i < map->count; i++) {
        const char *name = map->items[i].key + 7; /* after "plugin." */
        const char *dot = strchr(name, '.');
        if (!dot)
            continue;
        size_t len = (size_t)(dot - name);
        int used = 0;
        for (size_t k = 0; k < wxg_plugin_chain_count(chain) && !used; k++) {
            const char *cn = wxg_plugin_chain_name(chain, k);
            used = strlen(cn) == len && strncmp(cn, name, len) == 0;
        }
        /* Declared keys carry defaults for every built-in; only keys someone set matter. */
        if (!used && !wxg_conf_keydef_find(map->items[i].key))
            wxg_log(WXG_LOG_WARN, "plugin_setting_unused", WXG_LS("key", map->items[i].key),
                    WXG_LS("detail", "no plugin of that name in the chain"));
    }
}

static char *join_list(const char *const *items, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(items[i]) + 1;
    char *s = calloc(1, len);
    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (i)
            strncat(s, ",", len - strlen(s) - 1);
        strncat(s, items[i], len - strlen(s) - 1);
    }
    return s;
}

int main(int argc, char **argv)
{
    int code = 0;
    wxg_conf_t *conf = prog_start(argc, argv, "wxguard-consumer", WXG_PROG_CONSUMER, usage, &code);
    if (!conf)
        return code;
    char err[512] = "";

    int status = EXIT_STARTUP;
    wxg_plugin_chain_t *chain = NULL;
    wxg_producer_t *producer = NULL;
    wxg_dlq_t *dlq = NULL;
    wxg_consumer_t *c = NULL;
    wxg_conf_map_t *pmap = NULL;
    wxg_metrics_t *metrics = NULL;
    wxg_httpd_t *ops = NULL;
    wxg_plugin_kv_t *pkv = NULL;
    char *spec = NULL;
    char prefix[WXG_GUARD_PREFIX_MAX + 1];

    /* The plugin chain. */
    const char *const *plugins = NULL;
    size_t nplugins = wxg_conf_list(conf, "plugins", &plugins);
    spec = join_list(plugins, nplugins);
    pkv = plugin_settings(conf, &pmap);
    int rc = wxg_plugin_chain_new(spec, pkv, pmap->count, &chain, err, sizeof err);
    if (rc != 0) {
        wxg_log(WXG_LOG_ERROR, "plugin_chain_failed", WXG_LERR(rc), WXG_LS("reason", err));
        status = EXIT_USAGE;
        goto out;
    }
    warn_unused_plugin_settings(pmap, chain);

    /* The producer for the dead-letter topic and for plugins. */
    rd_kafka_conf_t *kconf = wxg_conf_kafka(conf, err, sizeof err);
    if (!kconf) {
        wxg_log(WXG_LOG_ERROR, "kafka_config_failed", WXG_LS("reason", err));
        status = EXIT_USAGE;
        goto out;
    }
    /* The dead-letter producer takes the connection settings only: the rest of kafka.*
     * configures the consumer. */
    producer = wxg_producer_new_like(kconf, WXG_PRODUCER_CONNECTION, NULL, 0, err, sizeof err);
    if (!producer) {
        rd_kafka_conf_destroy(kconf);
        wxg_log(WXG_LOG_ERROR, "producer_failed", WXG_LS("reason", err));
        goto out;
    }
    /* A wrong SASL password is a configuration error to report now, not a log line that
     * librdkafka repeats while the consumer never reaches Kafka. Brokers that are down are
     * waited for, as before. */
    rc = wxg_producer_check(producer, KAFKA_CHECK_MS, err, sizeof err);
    if (wxg_err_class(rc) == WXG_CLASS_FATAL) { /* refused credentials */
        rd_kafka_conf_destroy(kconf);
        wxg_log(WXG_LOG_ERROR, "kafka_auth_failed", WXG_LERR(rc), WXG_LS("reason", err));
        goto out;
    }
    wxg_plugin_chain_set_producer(chain, producer);
    dlq = wxg_dlq_new(producer, wxg_conf_get(conf, "dlq.topic"),
                      wxg_conf_get(conf, "kafka.group.id"), err, sizeof err);
    if (!dlq) {
        rd_kafka_conf_destroy(kconf);
        wxg_log(WXG_LOG_ERROR, "dlq_failed", WXG_LS("reason", err));
        goto out;
    }

    /* The guard and the consumer, from the one mapping every program shares. */
    wxg_guard_conf_t gc;
    wxg_consumer_conf_t cc;
    if (wxg_conf_guard(conf, &gc, prefix, sizeof prefix, err, sizeof err) != 0 ||
        wxg_conf_consumer(conf, &cc, err, sizeof err) != 0) {
        rd_kafka_conf_destroy(kconf);
        wxg_log(WXG_LOG_ERROR, "config_failed", WXG_LS("reason", err));
        status = EXIT_USAGE;
        goto out;
    }
    cc.kafka = kconf;
    cc.guard = &gc;
    cc.chain = chain;
    cc.dlq = dlq;
    metrics = prog_metrics("wxguard-consumer");
    if (!metrics) {
        rd_kafka_conf_destroy(kconf);
        wxg_log(WXG_LOG_ERROR, "start_failed", WXG_LS("reason", "out of memory"));
        goto out;
    }
    cc.metrics = metrics;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    c = wxg_consumer_new(&cc, err, sizeof err); /* takes kconf */
    if (!c) {
        wxg_log(WXG_LOG_ERROR, "start_failed", WXG_LS("reason", err));
        goto out;
    }
    const char *ops_listen = prog_nonempty(wxg_conf_get(conf, "metrics.listen"));
    if (ops_listen) {
        ops = wxg_httpd_start(ops_listen, metrics, ready_cb, c, err, sizeof err);
        if (!ops) {
            wxg_log(WXG_LOG_ERROR, "metrics_listen_failed", WXG_LS("reason", err));
            goto out;
        }
        wxg_log(WXG_LOG_INFO, "metrics_listening", WXG_LI("port", wxg_httpd_port(ops)));
    }
    the_consumer = c;
    if (signals_seen)
        wxg_consumer_stop(c);
    rc = wxg_consumer_run(c);
    status = rc == 0 ? 0 : EXIT_FATAL;
    if (wxg_consumer_abandoned(c) > 0) {
        /* A worker is still inside a plugin past the drain budget: it may use the chain, the
         * dead-letter sink and the consumer until the process ends, so end it now, without
         * freeing them (or running exit handlers that would). Its message was not committed. */
        fflush(stdout);
        fflush(stderr);
        _exit(status);
    }

out:
    the_consumer = NULL;
    wxg_httpd_stop(ops); /* first: its readiness callback reads the consumer */
    wxg_consumer_destroy(c);
    wxg_metrics_free(metrics);
    wxg_dlq_destroy(dlq);
    wxg_producer_destroy(producer, 5000);
    wxg_plugin_chain_destroy(chain);
    free(pkv);
    wxg_conf_map_free(pmap);
    free(spec);
    wxg_conf_free(conf);
    return status;
}
