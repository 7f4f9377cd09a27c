/*
 * DESIGN: test support for the shared Kafka broker (see testkafka.h). Each helper opens its own
 * librdkafka handle, does one job with a bounded wait, and destroys the handle, so tests never
 * share client state. Failures end the current test through cmocka's fail_msg() after the
 * handle is released, which keeps valgrind and the sanitizers free of leak reports.
 */
#include "testkafka.h"
#include "testenv.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Milliseconds (before scaling) that any one helper may wait for the broker. */
#define HELPER_TIMEOUT_MS 30000

static int scaled(int ms)
{
    return ms * wxg_test_scale();
}

void wxg_test_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value)
{
    char errstr[256];
    if (rd_kafka_conf_set(conf, name, value, errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
        fail_msg("librdkafka refused %s=%s: %s", name, value, errstr);
}

rd_kafka_conf_t *wxg_test_kafka_conf(void)
{
    const char *bootstrap = wxg_test_kafka_bootstrap();
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_non_null(conf);
    wxg_test_kafka_conf_set(conf, "bootstrap.servers", bootstrap);
    wxg_test_kafka_conf_set(conf, "broker.address.family", "v4");
    wxg_test_kafka_conf_set(conf, "client.id", "wxguard-test");
    wxg_test_kafka_conf_set(conf, "log_level", "4");
    return conf;
}

char *wxg_test_kafka_name(const char *tag)
{
    static unsigned counter;
    char buf[200];
    snprintf(buf, sizeof buf, "%s-%ld-%lld-%u", tag, (long)getpid(), (long long)wxg_test_now_ms(),
             counter++);
    char *s = strdup(buf);
    assert_non_null(s);
    return s;
}

static rd_kafka_t *new_handle(rd_kafka_type_t type, rd_kafka_conf_t *conf)
{
    char errstr[512];
    rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof errstr);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        fail_msg("rd_kafka_new failed: %s", errstr);
    }
    return rk;
}

/* 1 when the broker reports `topic` with `partitions` partitions, each with a leader. */
static int topic_ready(rd_kafka_t *rk, const char *topic, int partitions)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    if (!rkt)
        return 0;
    const struct rd_kafka_metadata *md = NULL;
    int ready = 0;
    if (rd_kafka_metadata(rk, 0, rkt, &md, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR && md &&
        md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
        md->topics[0].partition_cnt == partitions) {
        ready = 1;
        for (int i = 0; i < md->topics[0].partition_cnt; i++) {
            const rd_kafka_metadata_partition_t *p = &md->topics[0].partitions[i];
            if (p->err != RD_KAFKA_RESP_ERR_NO_ERROR || p->leader < 0)
                ready = 0;
        }
    }
    if (md)
        rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    return ready;
}

void wxg_test_kafka_create_topic(const char *topic, int partitions)
{
    char errstr[512] = "";
    char why[600] = "";
    rd_kafka_t *rk = new_handle(RD_KAFKA_PRODUCER, wxg_test_kafka_conf());
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, partitions, 1, errstr, sizeof errstr);
    rd_kafka_AdminOptions_t *opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    rd_kafka_event_t *ev = NULL;
    if (!nt) {
        snprintf(why, sizeof why, "NewTopic: %s", errstr);
        goto out;
    }
    /* The broker answers once the topic exists in the controller's metadata. */
    if (rd_kafka_AdminOptions_set_operation_timeout(opts, scaled(HELPER_TIMEOUT_MS), errstr,
                                                    sizeof errstr) ||
        rd_kafka_AdminOptions_set_request_timeout(opts, scaled(HELPER_TIMEOUT_MS), errstr,
                                                  sizeof errstr)) {
        snprintf(why, sizeof why, "admin options: %s", errstr);
        goto out;
    }
    rd_kafka_CreateTopics(rk, &nt, 1, opts, q);
    ev = rd_kafka_queue_poll(q, scaled(HELPER_TIMEOUT_MS) + 5000);
    if (!ev) {
        snprintf(why, sizeof why, "no CreateTopics result in time");
        goto out;
    }
    if (rd_kafka_event_error(ev)) {
        snprintf(why, sizeof why, "CreateTopics: %s", rd_kafka_event_error_string(ev));
        goto out;
    }
    size_t cnt = 0;
    const rd_kafka_topic_result_t **res =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
    for (size_t i = 0; i < cnt; i++) {
        rd_kafka_resp_err_t err = rd_kafka_topic_result_error(res[i]);
        if (err && err != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
            snprintf(why, sizeof why, "CreateTopics(%s): %s: %s",
                     rd_kafka_topic_result_name(res[i]), rd_kafka_err2name(err),
                     rd_kafka_topic_result_error_string(res[i])
                         ? rd_kafka_topic_result_error_string(res[i])
                         : "");
            goto out;
        }
    }
    /* Creation is acknowledged by the controller; the broker serves the partitions a moment
     * later. Producers and consumers started before that would see transient errors. */
    int64_t deadline = wxg_test_now_ms() + scaled(HELPER_TIMEOUT_MS);
    while (!topic_ready(rk, topic, partitions)) {
        if (wxg_test_now_ms() > deadline) {
            snprintf(why, sizeof why, "topic has no leader for all %d partitions after %d ms",
                     partitions, scaled(HELPER_TIMEOUT_MS));
            goto out;
        }
        wxg_test_sleep_ms(50);
    }
out:
    if (ev)
        rd_kafka_event_destroy(ev);
    if (nt)
        rd_kafka_NewTopic_destroy(nt);
    rd_kafka_AdminOptions_destroy(opts);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    if (why[0])
        fail_msg("creating topic %s: %s", topic, why);
}

struct delivery {
    size_t ok;
    size_t failed;
    rd_kafka_resp_err_t first_err;
};

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    struct delivery *d = opaque;
    if (m->err) {
        if (!d->failed)
            d->first_err = m->err;
        d->failed++;
    } else {
        d->ok++;
    }
}

/* Produces and waits for every acknowledgement; on failure writes the reason to `why` and
 * returns -1 (the callers fail the test after releasing their own memory). */
static int produce_records(const char *topic, const wxg_test_kafka_record_t *recs, size_t n,
                           char *why, size_t why_size)
{
    struct delivery d = {0};
    why[0] = '\0';
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    wxg_test_kafka_conf_set(conf, "acks", "all");
    wxg_test_kafka_conf_set(conf, "linger.ms", "5");
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_conf_set_opaque(conf, &d);
    rd_kafka_t *rk = new_handle(RD_KAFKA_PRODUCER, conf);
    for (size_t i = 0; i < n; i++) {
        rd_kafka_resp_err_t err =
            rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(recs[i].partition),
                              RD_KAFKA_V_KEY(recs[i].key, recs[i].key_len),
                              RD_KAFKA_V_VALUE((void *)recs[i].value, recs[i].value_len),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (err) {
            snprintf(why, why_size, "record %zu not queued: %s", i, rd_kafka_err2str(err));
            break;
        }
    }
    rd_kafka_resp_err_t ferr = rd_kafka_flush(rk, scaled(HELPER_TIMEOUT_MS));
    if (!why[0] && ferr)
        snprintf(why, why_size, "flush: %s (%zu of %zu acknowledged)", rd_kafka_err2str(ferr), d.ok,
                 n);
    if (!why[0] && d.failed)
        snprintf(why, why_size, "%zu records failed, first with %s", d.failed,
                 rd_kafka_err2name(d.first_err));
    if (!why[0] && d.ok != n)
        snprintf(why, why_size, "%zu of %zu records acknowledged", d.ok, n);
    rd_kafka_destroy(rk);
    return why[0] ? -1 : 0;
}

void wxg_test_kafka_produce(const char *topic, const wxg_test_kafka_record_t *recs, size_t n)
{
    char why[400];
    if (produce_records(topic, recs, n, why, sizeof why) != 0)
        fail_msg("producing to %s: %s", topic, why);
}

void wxg_test_kafka_produce_n(const char *topic, int32_t partition, int n, const char *value_prefix)
{
    assert_true(n >= 0);
    char why[400];
    wxg_test_kafka_record_t *recs = calloc((size_t)n + 1, sizeof *recs);
    char(*keys)[32] = calloc((size_t)n + 1, sizeof *keys);
    char(*vals)[256] = calloc((size_t)n + 1, sizeof *vals);
    assert_true(recs && keys && vals);
    for (int i = 0; i < n; i++) {
        int kl = snprintf(keys[i], sizeof keys[i], "k%d", i);
        int vl = snprintf(vals[i], sizeof vals[i], "%s%d", value_prefix, i);
        recs[i] = (wxg_test_kafka_record_t){.partition = partition,
                                            .key = keys[i],
                                            .key_len = (size_t)kl,
                                            .value = vals[i],
                                            .value_len = (size_t)vl};
    }
    int rc = produce_records(topic, recs, (size_t)n, why, sizeof why);
    free(vals);
    free(keys);
    free(recs);
    if (rc != 0)
        fail_msg("producing to %s: %s", topic, why);
}

int64_t wxg_test_kafka_committed(const char *group, const char *topic, int32_t partition)
{
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    wxg_test_kafka_conf_set(conf, "group.id", group);
    wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
    rd_kafka_t *rk = new_handle(RD_KAFKA_CONSUMER, conf);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, partition);
    rd_kafka_resp_err_t err = rd_kafka_committed(rk, parts, scaled(HELPER_TIMEOUT_MS));
    int64_t offset = parts->elems[0].offset;
    rd_kafka_resp_err_t perr = parts->elems[0].err;
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    if (err || perr)
        fail_msg("committed offset of group %s on %s[%d]: %s", group, topic, (int)partition,
                 rd_kafka_err2str(err ? err : perr));
    return offset;
}

struct wxg_test_kafka_offsets_reader {
    rd_kafka_t *rk;
};

wxg_test_kafka_offsets_reader_t *wxg_test_kafka_offsets_reader(const char *group)
{
    wxg_test_kafka_offsets_reader_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    wxg_test_kafka_conf_set(conf, "group.id", group);
    wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
    r->rk = new_handle(RD_KAFKA_CONSUMER, conf);
    return r;
}

void wxg_test_kafka_offsets_reader_free(wxg_test_kafka_offsets_reader_t *r)
{
    if (!r)
        return;
    /* It never joined the group: closing has nothing to wait for. */
    rd_kafka_consumer_close(r->rk);
    rd_kafka_destroy(r->rk);
    free(r);
}

void wxg_test_kafka_offsets_read(wxg_test_kafka_offsets_reader_t *r, const char *topic, int n,
                                 int64_t *out)
{
    rd_kafka_t *rk = r->rk;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(n);
    for (int p = 0; p < n; p++)
        rd_kafka_topic_partition_list_add(parts, topic, p);
    rd_kafka_resp_err_t err = rd_kafka_committed(rk, parts, scaled(HELPER_TIMEOUT_MS));
    for (int p = 0; p < n; p++) {
        if (!err && parts->elems[p].err)
            err = parts->elems[p].err;
        out[p] = parts->elems[p].offset;
    }
    rd_kafka_topic_partition_list_destroy(parts);
    if (err)
        fail_msg("committed offsets of %s: %s", topic, rd_kafka_err2str(err));
}

static char *copy_bytes(const void *p, size_t len)
{
    if (!p)
        return NULL;
    char *s = malloc(len + 1);
    assert_non_null(s);
    memcpy(s, p, len);
    s[len] = '\0';
    return s;
}

size_t wxg_test_kafka_read(const char *topic, size_t want, int timeout_ms,
                           wxg_test_kafka_msg_t **out)
{
    char why[400] = "";
    size_t got = 0;
    wxg_test_kafka_msg_t *msgs = calloc(want + 1, sizeof *msgs);
    assert_non_null(msgs);
    char *group = wxg_test_kafka_name("reader");
    rd_kafka_conf_t *conf = wxg_test_kafka_conf();
    /* A group id is required by the consumer API, but nothing is committed and no group is
     * joined: partitions are assigned by hand. */
    wxg_test_kafka_conf_set(conf, "group.id", group);
    wxg_test_kafka_conf_set(conf, "enable.auto.commit", "false");
    wxg_test_kafka_conf_set(conf, "enable.partition.eof", "false");
    rd_kafka_t *rk = new_handle(RD_KAFKA_CONSUMER, conf);
    rd_kafka_topic_partition_list_t *parts = NULL;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, scaled(HELPER_TIMEOUT_MS));
    if (!err && (!md || md->topic_cnt != 1))
        err = RD_KAFKA_RESP_ERR__FAIL;
    if (!err)
        err = md->topics[0].err;
    if (err) {
        snprintf(why, sizeof why, "metadata: %s", rd_kafka_err2str(err));
        goto out;
    }
    parts = rd_kafka_topic_partition_list_new(md->topics[0].partition_cnt);
    for (int i = 0; i < md->topics[0].partition_cnt; i++)
        rd_kafka_topic_partition_list_add(parts, topic, md->topics[0].partitions[i].id)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    err = rd_kafka_assign(rk, parts);
    if (err) {
        snprintf(why, sizeof why, "assign: %s", rd_kafka_err2str(err));
        goto out;
    }
    int64_t deadline = wxg_test_now_ms() + scaled(timeout_ms);
    while (got < want && wxg_test_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (m->err) {
            /* Transient conditions (e.g. a partition EOF) are not records; keep polling. */
            rd_kafka_message_destroy(m);
            continue;
        }
        msgs[got].partition = m->partition;
        msgs[got].offset = m->offset;
        msgs[got].key = copy_bytes(m->key, m->key_len);
        msgs[got].key_len = m->key_len;
        msgs[got].value = copy_bytes(m->payload, m->len);
        msgs[got].value_len = m->payload ? m->len : 0;
        got++;
        rd_kafka_message_destroy(m);
    }
out:
    if (parts)
        rd_kafka_topic_partition_list_destroy(parts);
    if (md)
        rd_kafka_metadata_destroy(md);
    if (rkt)
        rd_kafka_topic_destroy(rkt);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    free(group);
    if (why[0]) {
        wxg_test_kafka_msgs_free(msgs, got);
        fail_msg("reading %s: %s", topic, why);
    }
    *out = msgs;
    return got;
}

void wxg_test_kafka_msgs_free(wxg_test_kafka_msg_t *msgs, size_t n)
{
    if (!msgs)
        return;
    for (size_t i = 0; i < n; i++) {
        free(msgs[i].key);
        free(msgs[i].value);
    }
    free(msgs);
}
