/*
 * DESIGN: the shared producer with waited delivery reports, and the dead-letter writer.
 *
 * Purpose. Some writes must be known to be in Kafka before wxguard acts on them: a dead-letter
 * record before the original offset is finished, a plugin's reply before the plugin reports
 * OK. wxg_producer_send() therefore produces one record and blocks its caller until librdkafka
 * delivers that record's delivery report. wxg_dlq_write() builds the dead-letter record (the
 * original bytes plus wxg-dlq-* headers) and sends it that way.
 *
 * Threads. One rd_kafka_t is shared by every caller; librdkafka's produce calls are
 * thread-safe. Delivery reports are served by one background thread that the producer owns and
 * that does nothing but rd_kafka_poll() in a loop; the dr_msg_cb runs there. Having callers
 * poll instead would make one caller run another caller's report, and a caller that has just
 * returned would leave reports unserved, so a dedicated thread is simpler and never starves.
 *
 * Completion. Each send allocates a completion (a condition variable, a done flag, the result)
 * and passes it as the message's opaque. The completion has two references: the waiting
 * caller's and the delivery report's. Whoever drops the last one frees it, so a caller that
 * gives up after its bound (WXG_ETIMEDOUT) leaves the completion to the report that comes
 * later, and a report never writes into freed memory. All completions share the producer's
 * one mutex (held only for a few stores), each has its own condition variable (clock:
 * CLOCK_MONOTONIC) so that a report wakes only its own caller.
 *
 * Bounds. librdkafka itself fails a record after message.timeout.ms (default here 30 s; 0,
 * "infinite", is refused). The caller waits at most that plus WXG_PRODUCER_REPORT_GRACE_MS, so a
 * send never blocks for ever even if librdkafka's threads are starved. A full local queue is
 * waited out within the same deadline. wxg_producer_send_within() lets a caller with a budget of
 * its own (the ingest program answering an HTTP request) shorten that wait; the completion's
 * reference counting already covers a report that comes after the caller left.
 *
 * Broker state. librdkafka has no callback for "a broker connection is up", but its statistics
 * (statistics.interval.ms, 1 s by default here) list every broker with its state; the stats
 * callback, on the poll thread, counts the UP ones into an atomic for wxg_producer_brokers_up().
 *
 * Failure modes. Every failure is an error to the caller, never a silent drop: an unreachable
 * cluster or a missing topic surfaces as the delivery report's error (timed out, unknown
 * topic); a fatal idempotence error (rd_kafka_fatal_error) makes every later send fail with
 * WXG_ESTATE. The last error librdkafka reported through error_cb is remembered and added to
 * the reason of a failed send, so "timed out" comes with "connection refused" beside it.
 * wxg_producer_check() lets a program find out at start-up that the brokers refuse its
 * credentials (a wrong SASL password is otherwise only a log line librdkafka repeats while the
 * program runs without ever reaching Kafka); it asks for metadata and watches error_cb's
 * authentication and all-brokers-down reports, which carry librdkafka's text, never the
 * password.
 *
 * Shutdown. destroy marks the producer closing (new sends get WXG_ECLOSED), flushes within a
 * bound, purges what is left (its reports free their completions), stops the thread and
 * destroys the handle. The caller guarantees that no send is in progress.
 */
#include "wxguard/dlq.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>

#include "clock_int.h"
#include "dlq_int.h"
#include "err_int.h"
#include "wxguard/err.h"
#include "wxguard/log.h"

struct wxg_producer_s {
    rd_kafka_t *rk;
    pthread_t poller;
    atomic_int stop;    /* tells the poll thread to end */
    atomic_int closing; /* destroy has begun: refuse new sends */
    atomic_int fatal;   /* librdkafka raised a fatal error: every send fails */
    int delivery_timeout_ms;
    atomic_int brokers_up;    /* brokers in state UP in the last statistics; -1 before the first */
    atomic_int auth_failed;   /* a broker refused the credentials (error_cb), for the check */
    atomic_int all_down;      /* every broker was down at some moment (error_cb), likewise */
    pthread_mutex_t lock;     /* completions' fields, last_error */
    char last_error[256];     /* the last error_cb text, for reasons */
    char auth_error[256];     /* the text of the last refused login, for wxg_producer_check */
    pthread_condattr_t cattr; /* CLOCK_MONOTONIC, for every completion's cond */
};

struct wxg_dlq_s {
    wxg_producer_t *producer;
    char *topic;
    char *group_id;
};

/* One send's meeting point with its delivery report; see "Completion" above. */
typedef struct completion {
    pthread_cond_t cond;
    int refs; /* under producer->lock */
    int done;
    rd_kafka_resp_err_t err;
    int32_t partition;
    int64_t offset;
    char errmsg[160];
} completion;

static void completion_unref_locked(completion *c)
{
    if (--c->refs == 0) {
        pthread_cond_destroy(&c->cond);
        free(c);
    }
}

/* Runs on the poll thread (or inside rd_kafka_flush during destroy). */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    wxg_producer_t *p = opaque;
    completion *c = m->_private;
    if (!c)
        return;
    pthread_mutex_lock(&p->lock);
    c->done = 1;
    c->err = m->err;
    c->partition = m->partition;
    c->offset = m->offset;
    if (m->err)
        snprintf(c->errmsg, sizeof c->errmsg, "%s", rd_kafka_err2str(m->err));
    pthread_cond_signal(&c->cond);
    completion_unref_locked(c);
    pthread_mutex_unlock(&p->lock);
}

static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    wxg_producer_t *p = opaque;
    char fatal[200] = "";
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        rd_kafka_fatal_error(rk, fatal, sizeof fatal);
        atomic_store(&p->fatal, 1);
    }
    pthread_mutex_lock(&p->lock);
    snprintf(p->last_error, sizeof p->last_error, "%s%s%s", fatal[0] ? fatal : "",
             fatal[0] ? "; " : "", reason ? reason : rd_kafka_err2str((rd_kafka_resp_err_t)err));
    if (err == RD_KAFKA_RESP_ERR__AUTHENTICATION)
        snprintf(p->auth_error, sizeof p->auth_error, "%s", p->last_error);
    pthread_mutex_unlock(&p->lock);
    /* Set after last_error, in the order librdkafka reports them (a refused login, then all
     * brokers down), which wxg_producer_check() relies on. */
    if (err == RD_KAFKA_RESP_ERR__AUTHENTICATION)
        atomic_store(&p->auth_failed, 1);
    else if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
        atomic_store(&p->all_down, 1);
}

/* Runs on the poll thread every statistics.interval.ms. Counts the real brokers (configured or
 * learned, not librdkafka's internal or logical ones) whose connection is UP, so that a program
 * can tell "Kafka reachable" without a request of its own. */
static int on_stats(rd_kafka_t *rk, char *json, size_t json_len, void *opaque)
{
    (void)rk;
    wxg_producer_t *p = opaque;
    cJSON *root = cJSON_ParseWithLength(json, json_len);
    const cJSON *brokers = cJSON_GetObjectItemCaseSensitive(root, "brokers");
    if (cJSON_IsObject(brokers)) {
        int up = 0;
        const cJSON *b;
        cJSON_ArrayForEach(b, brokers)
        {
            const cJSON *src = cJSON_GetObjectItemCaseSensitive(b, "source");
            const cJSON *state = cJSON_GetObjectItemCaseSensitive(b, "state");
            if (!cJSON_IsString(src) || !cJSON_IsString(state))
                continue;
            if ((strcmp(src->valuestring, "configured") == 0 ||
                 strcmp(src->valuestring, "learned") == 0) &&
                strcmp(state->valuestring, "UP") == 0)
                up++;
        }
        atomic_store(&p->brokers_up, up);
    }
    cJSON_Delete(root);
    return 0; /* librdkafka frees json */
}

/* `what`, then the text librdkafka gave for the refused login (auth) or its last error, into
 * errstr. */
static void last_error_into(wxg_producer_t *p, int auth, const char *what, char *errstr,
                            size_t errstr_size)
{
    pthread_mutex_lock(&p->lock);
    const char *text = auth ? p->auth_error : p->last_error;
    wxg__errf(errstr, errstr_size, "%s%s%s", what, text[0] ? ": " : "", text);
    pthread_mutex_unlock(&p->lock);
}

int wxg_producer_check(wxg_producer_t *p, int timeout_ms, char *errstr, size_t errstr_size)
{
    int64_t end = wxg__mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        /* all_down first: the refused login that caused it was recorded before it. */
        int down = atomic_load(&p->all_down);
        if (atomic_load(&p->auth_failed)) {
            last_error_into(p, 1, "Kafka refused the credentials", errstr, errstr_size);
            return WXG_EAUTH;
        }
        if (down) {
            last_error_into(p, 0, "no Kafka broker reachable", errstr, errstr_size);
            return WXG_ECONN;
        }
        int64_t left = end - wxg__mono_ms();
        if (left <= 0) {
            last_error_into(p, 0, "no Kafka broker answered in time", errstr, errstr_size);
            return WXG_ETIMEDOUT;
        }
        /* An answer needs a connection that passed TLS and SASL: it proves both. Short slices,
         * so that an error reported meanwhile ends the wait early. */
        const struct rd_kafka_metadata *md = NULL;
        int64_t t0 = wxg__mono_ms();
        rd_kafka_resp_err_t e =
            rd_kafka_metadata(p->rk, 0, NULL, &md, left < 200 ? (int)left : 200);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR) {
            rd_kafka_metadata_destroy(md);
            return 0;
        }
        if (wxg__mono_ms() - t0 < 50)
            wxg__sleep_ms(50); /* refused at once: do not spin */
    }
}

int wxg_producer_brokers_up(const wxg_producer_t *p)
{
    return p ? atomic_load(&p->brokers_up) : -1;
}

static void *poll_main(void *arg)
{
    wxg_producer_t *p = arg;
    prctl(PR_SET_NAME, "wxg-delivery", 0, 0, 0);
    while (!atomic_load(&p->stop))
        rd_kafka_poll(p->rk, 100);
    return NULL;
}

static int conf_value(const rd_kafka_conf_t *conf, const char *name, char *buf, size_t size)
{
    size_t sz = size;
    return rd_kafka_conf_get(conf, name, buf, &sz) == RD_KAFKA_CONF_OK ? 0 : -1;
}

wxg_producer_t *wxg_producer_new(const wxg_kafka_prop_t *props, size_t n, char *errstr,
                                 size_t errstr_size)
{
    char rkerr[512];
    char buf[64];
    rd_kafka_conf_t *conf = NULL;
    wxg_producer_t *p = calloc(1, sizeof *p);
    if (!p) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        wxg__errf(errstr, errstr_size, "cannot create a mutex");
        goto fail_mutex;
    }
    if (pthread_condattr_init(&p->cattr) != 0 ||
        pthread_condattr_setclock(&p->cattr, CLOCK_MONOTONIC) != 0) {
        wxg__errf(errstr, errstr_size, "cannot set up condition variables");
        goto fail_cattr;
    }
    conf = rd_kafka_conf_new();
    if (!conf) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto fail_conf;
    }
    /* librdkafka's own lines go through the log module instead of raw stderr. */
    rd_kafka_conf_set_log_cb(conf, wxg_log_kafka);
    /* wxguard's defaults first, then the caller's properties on top of them. */
    static const wxg_kafka_prop_t defaults[] = {
        {"enable.idempotence", "true"},
        {"acks", "all"},
        {"message.timeout.ms", "30000"},
        {"statistics.interval.ms", "1000"}, /* for wxg_producer_brokers_up() */
    };
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
        if (rd_kafka_conf_set(conf, defaults[i].name, defaults[i].value, rkerr, sizeof rkerr) !=
            RD_KAFKA_CONF_OK) {
            wxg__errf(errstr, errstr_size, "kafka property %s: %s", defaults[i].name, rkerr);
            goto fail_set;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!props[i].name || !props[i].value) {
            wxg__errf(errstr, errstr_size, "kafka property %zu has no name or value", i);
            goto fail_set;
        }
        if (rd_kafka_conf_set(conf, props[i].name, props[i].value, rkerr, sizeof rkerr) !=
            RD_KAFKA_CONF_OK) {
            wxg__errf(errstr, errstr_size, "kafka property %s: %s", props[i].name, rkerr);
            goto fail_set;
        }
    }
    /* Read the effective values back, so that aliases (delivery.timeout.ms,
     * request.required.acks) cannot slip past these checks. */
    if (conf_value(conf, "enable.idempotence", buf, sizeof buf) != 0 || strcmp(buf, "true") != 0) {
        wxg__errf(errstr, errstr_size,
                  "kafka property enable.idempotence: the producer must be idempotent (true)");
        goto fail_set;
    }
    if (conf_value(conf, "acks", buf, sizeof buf) != 0 ||
        (strcmp(buf, "-1") != 0 && strcmp(buf, "all") != 0)) {
        wxg__errf(errstr, errstr_size,
                  "kafka property acks: the producer must wait for all in-sync replicas (all)");
        goto fail_set;
    }
    if (conf_value(conf, "message.timeout.ms", buf, sizeof buf) != 0) {
        wxg__errf(errstr, errstr_size, "kafka property message.timeout.ms cannot be read");
        goto fail_set;
    }
    char *end = NULL;
    errno = 0;
    long long tmo = strtoll(buf, &end, 10);
    if (errno != 0 || *end != '\0' || tmo <= 0 || tmo > INT32_MAX - 2 * 86400000LL) {
        wxg__errf(errstr, errstr_size,
                  "kafka property message.timeout.ms: '%s' must be a bounded time in ms (> 0)",
                  buf);
        goto fail_set;
    }
    p->delivery_timeout_ms = (int)tmo;
    rd_kafka_conf_set_opaque(conf, p);
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_conf_set_error_cb(conf, on_error);
    rd_kafka_conf_set_stats_cb(conf, on_stats);
    atomic_init(&p->brokers_up, -1);
    atomic_init(&p->auth_failed, 0);
    atomic_init(&p->all_down, 0);
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, rkerr, sizeof rkerr);
    if (!p->rk) {
        wxg__errf(errstr, errstr_size, "cannot create the Kafka producer: %s", rkerr);
        goto fail_set;
    }
    conf = NULL; /* now owned by rk */
    if (pthread_create(&p->poller, NULL, poll_main, p) != 0) {
        wxg__errf(errstr, errstr_size, "cannot start the delivery-report thread");
        goto fail_thread;
    }
    return p;

fail_thread:
    rd_kafka_destroy(p->rk);
fail_set:
    if (conf)
        rd_kafka_conf_destroy(conf);
fail_conf:
    pthread_condattr_destroy(&p->cattr);
fail_cattr:
    pthread_mutex_destroy(&p->lock);
fail_mutex:
    free(p);
    return NULL;
}

/* Whether a producer of `scope` takes over the setting `name` (see wxg_producer_scope_t). */
int wxg__producer_prop_wanted(wxg_producer_scope_t scope, const char *name)
{
    size_t nl = strlen(name);
    /* Callbacks (log_cb, ...) are dumped as pointers and can only be set through their own
     * functions; the producer installs its own. */
    if (nl > 3 && strcmp(name + nl - 3, "_cb") == 0)
        return 0;
    /* Dumped as pointers too: the topic settings come from the default topic configuration's
     * own dump, and the opaque belongs to the caller's handle. */
    if (strcmp(name, "default_topic_conf") == 0 || strcmp(name, "opaque") == 0)
        return 0;
    if (scope == WXG_PRODUCER_ALL)
        return strcmp(name, "group.id") != 0;
    static const char *const exact[] = {
        "bootstrap.servers",     "metadata.broker.list",
        "security.protocol",     "client.id",
        "broker.address.family", "message.timeout.ms",
        "socket.timeout.ms",     "enable.ssl.certificate.verification"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        if (strcmp(name, exact[i]) == 0)
            return 1;
    }
    return strncmp(name, "sasl.", 5) == 0 || strncmp(name, "ssl.", 4) == 0;
}

int wxg__producer_conf_get(const wxg_producer_t *p, const char *name, char *buf, size_t size)
{
    size_t len = size;
    rd_kafka_conf_res_t r = rd_kafka_conf_get(rd_kafka_conf(p->rk), name, buf, &len);
    if (r == RD_KAFKA_CONF_UNKNOWN)
        return WXG_ENOTFOUND;
    return r == RD_KAFKA_CONF_OK && len <= size ? 0 : WXG_EINVAL;
}

/* Appends to `props` the settings of one dump that a producer of `scope` takes over: those that
 * differ from the defaults dump `defs`. Returns the new count. */
static size_t props_changed(wxg_producer_scope_t scope, const char **dump, size_t cnt,
                            const char **defs, size_t dcnt, wxg_kafka_prop_t *props, size_t np)
{
    for (size_t i = 0; i + 1 < cnt; i += 2) {
        if (!wxg__producer_prop_wanted(scope, dump[i]))
            continue;
        int is_default = 0;
        for (size_t k = 0; k + 1 < dcnt; k += 2) {
            if (strcmp(defs[k], dump[i]) == 0) {
                is_default = strcmp(defs[k + 1], dump[i + 1]) == 0;
                break;
            }
        }
        const char *name =
            strcmp(dump[i], "metadata.broker.list") == 0 ? "bootstrap.servers" : dump[i];
        if (!is_default)
            props[np++] = (wxg_kafka_prop_t){name, dump[i + 1]};
    }
    return np;
}

wxg_producer_t *wxg_producer_new_like(const rd_kafka_conf_t *kc, wxg_producer_scope_t scope,
                                      const wxg_kafka_prop_t *defaults, size_t n_defaults,
                                      char *errstr, size_t errstr_size)
{
    if (!kc || (scope != WXG_PRODUCER_CONNECTION && scope != WXG_PRODUCER_ALL) ||
        (n_defaults > 0 && !defaults)) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return NULL;
    }
    wxg_producer_t *p = NULL;
    size_t cnt = 0, dcnt = 0, tcnt = 0, tdcnt = 0, np = 0;
    /* Topic-level settings (message.timeout.ms, compression ...) set through the global
     * configuration live in its default topic configuration, which the global dump leaves out.
     * rd_kafka_conf_dump and the getter only read; their prototypes lack the const. */
    rd_kafka_conf_t *c = (rd_kafka_conf_t *)kc;
    const char **dump = rd_kafka_conf_dump(c, &cnt);
    rd_kafka_topic_conf_t *tc = rd_kafka_conf_get_default_topic_conf(c);
    const char **tdump = tc ? rd_kafka_topic_conf_dump(tc, &tcnt) : NULL;
    rd_kafka_conf_t *def = rd_kafka_conf_new();
    rd_kafka_topic_conf_t *tdef = rd_kafka_topic_conf_new();
    const char **defs = def ? rd_kafka_conf_dump(def, &dcnt) : NULL;
    const char **tdefs = tdef ? rd_kafka_topic_conf_dump(tdef, &tdcnt) : NULL;
    wxg_kafka_prop_t *props = calloc(n_defaults + cnt / 2 + tcnt / 2 + 1, sizeof *props);
    if (!dump || !defs || !tdefs || !props || (tc && !tdump)) {
        wxg__errf(errstr, errstr_size, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n_defaults; i++)
        props[np++] = defaults[i];
    /* Only what the configuration changed from librdkafka's defaults is handed on. */
    np = props_changed(scope, dump, cnt, defs, dcnt, props, np);
    if (tdump)
        np = props_changed(scope, tdump, tcnt, tdefs, tdcnt, props, np);
    p = wxg_producer_new(props, np, errstr, errstr_size);
out:
    free(props);
    if (tdefs)
        rd_kafka_conf_dump_free(tdefs, tdcnt);
    if (defs)
        rd_kafka_conf_dump_free(defs, dcnt);
    if (tdef)
        rd_kafka_topic_conf_destroy(tdef);
    if (def)
        rd_kafka_conf_destroy(def);
    if (tdump)
        rd_kafka_conf_dump_free(tdump, tcnt);
    if (dump)
        rd_kafka_conf_dump_free(dump, cnt);
    return p;
}

int wxg_producer_delivery_timeout_ms(const wxg_producer_t *p)
{
    return p->delivery_timeout_ms;
}

static int map_kafka_err(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR_NO_ERROR:
        return 0;
    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
        return WXG_ETIMEDOUT;
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
        return WXG_EAUTH;
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
        return WXG_ETOOBIG;
    case RD_KAFKA_RESP_ERR__FATAL:
        return WXG_ESTATE;
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
        return WXG_ECLOSED;
    default:
        return WXG_EKAFKA;
    }
}

/* Writes "<what>: <detail> (last error: ...)" to errstr. */
static void report(wxg_producer_t *p, char *errstr, size_t errstr_size, const char *topic,
                   const char *detail)
{
    char last[sizeof p->last_error];
    pthread_mutex_lock(&p->lock);
    snprintf(last, sizeof last, "%s", p->last_error);
    pthread_mutex_unlock(&p->lock);
    wxg__errf(errstr, errstr_size, "delivery to topic '%s' failed: %s%s%s%s", topic, detail,
              last[0] ? " (last client error: " : "", last, last[0] ? ")" : "");
}

int wxg_producer_send(wxg_producer_t *p, const char *topic, int32_t partition, const void *key,
                      size_t key_len, const void *value, size_t value_len,
                      const wxg_kafka_header_t *headers, size_t header_count, wxg_delivery_t *dr,
                      char *errstr, size_t errstr_size)
{
    return wxg_producer_send_within(p, 0, topic, partition, key, key_len, value, value_len, headers,
                                    header_count, dr, errstr, errstr_size);
}

int wxg_producer_send_within(wxg_producer_t *p, int wait_ms, const char *topic, int32_t partition,
                             const void *key, size_t key_len, const void *value, size_t value_len,
                             const wxg_kafka_header_t *headers, size_t header_count,
                             wxg_delivery_t *dr, char *errstr, size_t errstr_size)
{
    if (!p || !topic || !*topic || (!key && key_len) || (!value && value_len) ||
        (!headers && header_count) || partition < WXG_PARTITION_ANY || wait_ms < 0) {
        wxg__errf(errstr, errstr_size, "invalid arguments to the producer");
        return WXG_EINVAL;
    }
    for (size_t i = 0; i < header_count; i++) {
        if (!headers[i].name || (!headers[i].value && headers[i].value_len)) {
            wxg__errf(errstr, errstr_size, "header %zu has no name, or a length without a value",
                      i);
            return WXG_EINVAL;
        }
    }
    if (atomic_load(&p->closing)) {
        wxg__errf(errstr, errstr_size, "the producer is shutting down");
        return WXG_ECLOSED;
    }
    if (atomic_load(&p->fatal)) {
        report(p, errstr, errstr_size, topic, "the producer hit a fatal error");
        return WXG_ESTATE;
    }
    int64_t bound = (int64_t)p->delivery_timeout_ms + WXG_PRODUCER_REPORT_GRACE_MS;
    if (wait_ms > 0 && wait_ms < bound)
        bound = wait_ms;
    int64_t deadline = wxg__mono_ms() + bound;

    completion *c = calloc(1, sizeof *c);
    if (!c) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    if (pthread_cond_init(&c->cond, &p->cattr) != 0) {
        free(c);
        wxg__errf(errstr, errstr_size, "cannot create a condition variable");
        return WXG_ENOMEM;
    }
    c->refs = 2; /* the caller's and the delivery report's */

    int rc = 0;
    rd_kafka_resp_err_t perr;
    for (;;) {
        rd_kafka_headers_t *hdrs = NULL;
        if (header_count > 0) {
            hdrs = rd_kafka_headers_new(header_count);
            for (size_t i = 0; i < header_count; i++) {
                const char *hv = headers[i].value;
                rd_kafka_header_add(hdrs, headers[i].name, -1, hv,
                                    hv ? (ssize_t)headers[i].value_len : 0);
            }
        }
        perr = rd_kafka_producev(
            p->rk, RD_KAFKA_V_TOPIC(topic),
            RD_KAFKA_V_PARTITION(partition == WXG_PARTITION_ANY ? RD_KAFKA_PARTITION_UA
                                                                : partition),
            RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE((void *)(uintptr_t)value, value_len),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs),
            RD_KAFKA_V_OPAQUE(c), RD_KAFKA_V_END);
        if (perr == RD_KAFKA_RESP_ERR_NO_ERROR)
            break;
        if (hdrs)
            rd_kafka_headers_destroy(hdrs); /* not taken over on failure */
        /* The local queue is full: the poll thread drains it as reports come in. */
        if (perr == RD_KAFKA_RESP_ERR__QUEUE_FULL && wxg__mono_ms() < deadline) {
            wxg__sleep_ms(5);
            continue;
        }
        /* No report will come for a record that was never queued. */
        pthread_cond_destroy(&c->cond);
        free(c);
        report(p, errstr, errstr_size, topic, rd_kafka_err2str(perr));
        return perr == RD_KAFKA_RESP_ERR__QUEUE_FULL ? WXG_ETIMEDOUT : map_kafka_err(perr);
    }

    struct timespec ts = wxg__mono_timespec(deadline * 1000);
    pthread_mutex_lock(&p->lock);
    while (!c->done) {
        if (pthread_cond_timedwait(&c->cond, &p->lock, &ts) == ETIMEDOUT && !c->done)
            break;
    }
    int done = c->done;
    rd_kafka_resp_err_t derr = c->err;
    char detail[sizeof c->errmsg + 64];
    snprintf(detail, sizeof detail, "%s", c->errmsg);
    if (done && !derr && dr) {
        dr->partition = c->partition;
        dr->offset = c->offset;
    }
    completion_unref_locked(c);
    pthread_mutex_unlock(&p->lock);

    if (!done) {
        report(p, errstr, errstr_size, topic, "no delivery report within the bound");
        rc = WXG_ETIMEDOUT;
    } else if (derr) {
        /* librdkafka reports a missing topic (auto-creation off) as a plain timeout. */
        if (derr == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT)
            snprintf(detail + strlen(detail), sizeof detail - strlen(detail), "%s",
                     " (is the topic missing, or the cluster unreachable?)");
        report(p, errstr, errstr_size, topic, detail);
        rc = map_kafka_err(derr);
        if (rc == 0)
            rc = WXG_EKAFKA;
    }
    return rc;
}

void wxg_producer_destroy(wxg_producer_t *p, int flush_timeout_ms)
{
    if (!p)
        return;
    atomic_store(&p->closing, 1);
    if (flush_timeout_ms < 0)
        flush_timeout_ms = p->delivery_timeout_ms;
    if (rd_kafka_flush(p->rk, flush_timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        /* What is still queued fails now with a purge error; its reports free completions. */
        rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(p->rk, 2000);
    }
    atomic_store(&p->stop, 1);
    pthread_join(p->poller, NULL);
    rd_kafka_destroy(p->rk);
    pthread_condattr_destroy(&p->cattr);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* ------------------------------------------------------------------------------------------ */
/* Dead-letter writer                                                                          */
/* ------------------------------------------------------------------------------------------ */

wxg_dlq_t *wxg_dlq_new(wxg_producer_t *producer, const char *topic, const char *group_id,
                       char *errstr, size_t errstr_size)
{
    if (!producer || !topic || !*topic) {
        wxg__errf(errstr, errstr_size, "the dead-letter writer needs a producer and a topic");
        return NULL;
    }
    wxg_dlq_t *d = calloc(1, sizeof *d);
    if (!d)
        goto fail_alloc;
    d->producer = producer;
    d->topic = strdup(topic);
    d->group_id = strdup(group_id ? group_id : "");
    if (!d->topic || !d->group_id)
        goto fail_strings;
    return d;

fail_strings:
    free(d->topic);
    free(d->group_id);
    free(d);
fail_alloc:
    wxg__errf(errstr, errstr_size, "out of memory");
    return NULL;
}

const char *wxg_dlq_topic(const wxg_dlq_t *dlq)
{
    return dlq->topic;
}

const wxg_producer_t *wxg_dlq_producer(const wxg_dlq_t *dlq)
{
    return dlq != NULL ? dlq->producer : NULL;
}

void wxg_dlq_destroy(wxg_dlq_t *dlq)
{
    if (!dlq)
        return;
    free(dlq->topic);
    free(dlq->group_id);
    free(dlq);
}

/* Copies `reason` into buf (size > 8), cutting it at a UTF-8 character boundary with "..." when
 * it does not fit. */
static size_t cut_reason(const char *reason, char *buf, size_t size)
{
    size_t len = strlen(reason);
    if (len < size) {
        memcpy(buf, reason, len + 1);
        return len;
    }
    size_t keep = size - 4;
    while (keep > 0 && ((unsigned char)reason[keep] & 0xC0) == 0x80)
        keep--; /* do not split a multi-byte character */
    memcpy(buf, reason, keep);
    memcpy(buf + keep, "...", 4);
    return keep + 3;
}

static int starts_with(const char *s, const char *prefix)
{
    return s && strncmp(s, prefix, strlen(prefix)) == 0;
}

int wxg_dlq_write(wxg_dlq_t *dlq, const wxg_dlq_record_t *rec, wxg_delivery_t *dr, char *errstr,
                  size_t errstr_size)
{
    enum { OURS = 14 };
    if (!dlq || !rec || !rec->topic || (!rec->headers && rec->header_count) ||
        (!rec->key && rec->key_len) || (!rec->value && rec->value_len)) {
        wxg__errf(errstr, errstr_size, "invalid dead-letter record");
        return WXG_EINVAL;
    }
    wxg_kafka_header_t *h = calloc(rec->header_count + OURS, sizeof *h);
    if (!h) {
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < rec->header_count; i++) {
        if (!rec->headers[i].name || starts_with(rec->headers[i].name, WXG_DLQ_HDR_PREFIX))
            continue;
        h[n++] = rec->headers[i];
    }

    char partition[16], offset[24], ts[24], attempts[16], first[24], last[24];
    char reason[WXG_DLQ_REASON_MAX];
    snprintf(partition, sizeof partition, "%" PRId32, rec->partition);
    snprintf(offset, sizeof offset, "%" PRId64, rec->offset);
    snprintf(ts, sizeof ts, "%" PRId64, rec->timestamp_ms);
    snprintf(attempts, sizeof attempts, "%" PRIu32, rec->attempts);
    snprintf(first, sizeof first, "%" PRId64, rec->first_failure_ms);
    snprintf(last, sizeof last, "%" PRId64, rec->last_failure_ms);
    size_t reason_len =
        cut_reason(rec->reason ? rec->reason : wxg_strerror(rec->error), reason, sizeof reason);
    const char *err_name = wxg_err_name(rec->error);

#define ADD_(hname, v, vlen) h[n++] = (wxg_kafka_header_t){(hname), (v), (vlen)}
    ADD_(WXG_DLQ_HDR_TOPIC, rec->topic, strlen(rec->topic));
    ADD_(WXG_DLQ_HDR_PARTITION, partition, strlen(partition));
    ADD_(WXG_DLQ_HDR_OFFSET, offset, strlen(offset));
    ADD_(WXG_DLQ_HDR_KEY, rec->key, rec->key ? rec->key_len : 0);
    if (rec->timestamp_ms >= 0)
        ADD_(WXG_DLQ_HDR_TIMESTAMP, ts, strlen(ts));
    ADD_(WXG_DLQ_HDR_ERROR, err_name, strlen(err_name));
    ADD_(WXG_DLQ_HDR_REASON, reason, reason_len);
    ADD_(WXG_DLQ_HDR_ATTEMPTS, attempts, strlen(attempts));
    ADD_(WXG_DLQ_HDR_FIRST_FAILURE, first, strlen(first));
    ADD_(WXG_DLQ_HDR_LAST_FAILURE, last, strlen(last));
    ADD_(WXG_DLQ_HDR_GROUP, dlq->group_id, strlen(dlq->group_id));
    if (rec->idempotency_key)
        ADD_(WXG_DLQ_HDR_IDEMPOTENCY, rec->idempotency_key, strlen(rec->idempotency_key));
    if (rec->plugin)
        ADD_(WXG_DLQ_HDR_PLUGIN, rec->plugin, strlen(rec->plugin));
#undef ADD_

    /* The original key keeps a conversation's dead letters together (and compaction safe). */
    int rc = wxg_producer_send(dlq->producer, dlq->topic, WXG_PARTITION_ANY, rec->key,
                               rec->key ? rec->key_len : 0, rec->value,
                               rec->value ? rec->value_len : 0, h, n, dr, errstr, errstr_size);
    free(h);
    return rc;
}
