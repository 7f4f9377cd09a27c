/*
 * Kafka helpers shared by the e2e and feed subcommands: create a topic, produce callback
 * records in the reference formats, wait for a group's committed offsets, count a topic.
 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static rd_kafka_conf_t *base_conf(const char *bootstrap)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err) ||
        rd_kafka_conf_set(c, "broker.address.family", "v4", err, sizeof err) ||
        rd_kafka_conf_set(c, "log_level", "3", err, sizeof err)) {
        fprintf(stderr, "kafka: %s\n", err);
        rd_kafka_conf_destroy(c);
        return NULL;
    }
    return c;
}

int wxgb_create_topic(const char *bootstrap, const char *topic, int partitions)
{
    char err[256];
    rd_kafka_conf_t *c = base_conf(bootstrap);
    if (!c)
        return -1;
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "kafka: %s\n", err);
        return -1;
    }
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, partitions, 1, err, sizeof err);
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
    int rc = -1;
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
    if (ev) {
        const rd_kafka_CreateTopics_result_t *res = rd_kafka_event_CreateTopics_result(ev);
        size_t n = 0;
        const rd_kafka_topic_result_t **tr =
            res ? rd_kafka_CreateTopics_result_topics(res, &n) : NULL;
        if (tr && n == 1) {
            rd_kafka_resp_err_t e = rd_kafka_topic_result_error(tr[0]);
            rc = e == RD_KAFKA_RESP_ERR_NO_ERROR || e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS
                     ? 0
                     : -1;
            if (rc)
                fprintf(stderr, "create topic %s: %s\n", topic, rd_kafka_err2str(e));
        }
        rd_kafka_event_destroy(ev);
    }
    rd_kafka_NewTopic_destroy(nt);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    /* Give the new partitions a moment to get their leader. */
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    return rc;
}

size_t wxgb_render(char *buf, size_t cap, const wxgb_rec_t *r, size_t size)
{
    char content[4096], bot[32];
    int n;
    snprintf(bot, sizeof bot, "wxid_benchbot%04d", r->account + 1);
    if (r->text == WXGB_TEXT_HELLO)
        n = snprintf(content, sizeof content, "你好");
    else if (r->text == WXGB_TEXT_PRICE)
        n = snprintf(content, sizeof content, "请问价格是多少？ (message %llu)",
                     (unsigned long long)r->id);
    else
        n = snprintf(content, sizeof content, "message %llu for conversation %d",
                     (unsigned long long)r->id, r->conv);
    size_t len = (size_t)n;
    while (r->text == WXGB_TEXT_PLAIN && len + 1 < size && len + 1 < sizeof content)
        content[len++] = 'x';
    content[len] = '\0';
    switch (r->format) {
    case 0: /* wkteam, a group message */
        n = snprintf(buf, cap,
                     "{\"wcId\":\"%s\",\"messageType\":\"80001\",\"data\":{"
                     "\"fromUser\":\"wxid_member%04d\",\"fromGroup\":\"%d@chatroom\","
                     "\"toUser\":\"%s\",\"newMsgId\":%llu,\"timestamp\":1748140000,"
                     "\"self\":false,\"content\":\"%s\"}}",
                     bot, r->conv % 50, 20000000 + r->conv, bot, (unsigned long long)r->id,
                     content);
        break;
    case 1: /* GeWe, a private chat */
        n = snprintf(buf, cap,
                     "{\"TypeName\":\"AddMsg\",\"Appid\":\"wx_BENCHAPPID_0001\","
                     "\"Wxid\":\"%s\",\"Data\":{\"FromUserName\":{\"string\":"
                     "\"wxid_peer%04d\"},\"ToUserName\":{\"string\":\"%s\"},"
                     "\"MsgType\":1,\"Content\":{\"string\":\"%s\"},\"CreateTime\":1705043418,"
                     "\"NewMsgId\":%llu}}",
                     bot, r->conv, bot, content, (unsigned long long)r->id);
        break;
    default: /* generic, a private chat */
        n = snprintf(buf, cap,
                     "{\"account\":\"%s\",\"msg_id\":\"%llu\","
                     "\"conversation\":\"conv%04d\",\"sender\":\"wxid_peer%04d\","
                     "\"create_time\":1700000000,\"type\":\"text\",\"content\":\"%s\"}",
                     bot, (unsigned long long)r->id, r->conv, r->conv, content);
        break;
    }
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    if (m->err)
        (*(int *)opaque)++;
}

int wxgb_produce(const char *bootstrap, const char *topic, const wxgb_rec_t *recs, size_t n,
                 size_t size)
{
    char err[256];
    rd_kafka_conf_t *c = base_conf(bootstrap);
    if (!c)
        return -1;
    int failed = 0;
    rd_kafka_conf_set(c, "linger.ms", "5", err, sizeof err);
    rd_kafka_conf_set_dr_msg_cb(c, dr_cb);
    rd_kafka_conf_set_opaque(c, &failed);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "kafka: %s\n", err);
        return -1;
    }
    char *buf = malloc(size + 1024);
    if (!buf) {
        rd_kafka_destroy(rk);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len;
        if (recs[i].raw) {
            len = strlen(recs[i].raw);
            memcpy(buf, recs[i].raw, len);
        } else {
            len = wxgb_render(buf, size + 1024, &recs[i], size);
        }
        char key[64];
        int kl =
            snprintf(key, sizeof key, "wxid_benchbot%04d:%d", recs[i].account + 1, recs[i].conv);
        for (;;) {
            rd_kafka_resp_err_t e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(recs[i].partition),
                RD_KAFKA_V_KEY(key, (size_t)kl), RD_KAFKA_V_VALUE(buf, len),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                rd_kafka_poll(rk, 10);
                continue;
            }
            if (e)
                failed++;
            break;
        }
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_flush(rk, 60000);
    free(buf);
    rd_kafka_destroy(rk);
    return failed ? -1 : 0;
}

int wxgb_make_stream(wxgb_rec_t *recs, size_t n, int partitions, double dup_ratio, int convs,
                     uint64_t id_base, int formats, unsigned seed)
{
    int unique = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && (double)(rand_r(&seed) % 10000) < dup_ratio * 10000) {
            recs[i] = recs[(size_t)rand_r(&seed) % i];
            continue;
        }
        int conv = rand_r(&seed) % convs;
        recs[i] = (wxgb_rec_t){.partition = conv % partitions,
                               .id = id_base + (uint64_t)unique,
                               .conv = conv,
                               .format = formats > 1 ? conv % formats : 2};
        unique++;
    }
    return unique;
}

int64_t wxgb_end_offsets(const char *bootstrap, const char *topic, int partitions, int64_t *ends)
{
    char err[256];
    rd_kafka_conf_t *c = base_conf(bootstrap);
    rd_kafka_t *rk = c ? rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err) : NULL;
    if (!rk)
        return -1;
    int64_t total = 0;
    for (int p = 0; p < partitions; p++) {
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 10000))
            hi = -1;
        ends[p] = hi;
        total += hi > 0 ? hi : 0;
    }
    rd_kafka_destroy(rk);
    return total;
}

int64_t wxgb_committed(const char *bootstrap, const char *group, const char *topic, int partitions,
                       int64_t *out)
{
    char err[256];
    rd_kafka_conf_t *c = base_conf(bootstrap);
    if (!c)
        return -1;
    rd_kafka_conf_set(c, "group.id", group, err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    if (!rk)
        return -1;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; p++)
        rd_kafka_topic_partition_list_add(l, topic, p);
    int64_t total = 0;
    if (rd_kafka_committed(rk, l, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        for (int p = 0; p < partitions; p++) {
            out[p] = l->elems[p].offset;
            total += out[p] > 0 ? out[p] : 0;
        }
    } else {
        total = -1;
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return total;
}
