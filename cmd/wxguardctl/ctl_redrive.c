/*
 * wxguardctl redrive: re-produce dead-lettered messages to the topic they came from.
 *
 * Reads the DLQ topic without a consumer group (assign, never commit), from the chosen start of
 * each partition up to the high watermark seen when the command started, so it always ends.
 * A record matches by account or idempotency key (from the wxg-dlq-idempotency-key header the
 * DLQ writer adds) or by offset range on one partition.
 *
 * "A redriven message is processed once": before a matching record is re-produced, the guard is
 * asked about its key. DONE: skipped (the original was finished meanwhile; a copy would only be
 * a duplicate). PROCESSING with a live lease: skipped (being processed now). FAILED: re-armed
 * with wxg_guard_rearm(), so that the next claim is attempt 1 with the whole retry budget while
 * the fence and finished plugins stay; the consumer then claims it like any FAILED message, and
 * once it is DONE every further copy is a DUPLICATE. A key met twice in one run is produced once.
 * Records without an idempotency key (they did not decode) are re-produced as they are: the guard
 * has nothing on them.
 *
 * The re-produced record has the original key and value bytes, the original headers without the
 * wxg-dlq-* ones, and a wxg-redrive-source header "<dlq topic>/<partition>/<offset>".
 */
#include <errno.h>
#include <getopt.h>
#include <librdkafka/rdkafka.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "wxguard/dlq.h"
#include "wxguard/err.h"
#include "wxguard/key.h"

#define REDRIVE_HDR_SOURCE "wxg-redrive-source"

/* How long the start waits for a first answer from Kafka, to learn whether it takes the
 * credentials. */
#define KAFKA_CHECK_MS 10000

void ctl_help_redrive(FILE *out)
{
    fprintf(out,
            "usage: wxguardctl redrive [--account A | --key K | --partition P\n"
            "                          [--from-offset N] [--to-offset M]] [--all]\n"
            "                          [--dry-run] [--to-topic T] [options]\n\n"
            "Re-produces dead-lettered records from the DLQ topic (dlq.topic) to the topic\n"
            "they came from (the wxg-dlq-original-topic header), with the original key, value\n"
            "and headers. Before producing, the guard decides: a message already DONE or being\n"
            "processed is skipped; a FAILED one is re-armed (attempts restart, fence and\n"
            "finished plugins kept), so that the consumer processes it once more -- and only\n"
            "once. The DLQ itself is not changed (Kafka records cannot be deleted); redriving\n"
            "twice is harmless: the second copy is a duplicate. Progress goes to stderr.\n\n"
            "selection (at least one; they combine):\n"
            "      --all            every record of the DLQ topic\n"
            "  -a, --account A      records whose idempotency key belongs to account A\n"
            "  -k, --key K          records with idempotency key K\n"
            "  -p, --partition P    only DLQ partition P\n"
            "      --from-offset N  first DLQ offset (with --partition)\n"
            "      --to-offset M    last DLQ offset, inclusive (with --partition)\n"
            "other:\n"
            "  -n, --dry-run        list what would be re-produced; change nothing\n"
            "      --dlq-topic T    read T instead of dlq.topic\n"
            "      --to-topic T     produce to T instead of each record's original topic\n"
            "      --limit N        stop after N matching records\n"
            "      --timeout-ms MS  give up reading after MS (default 60000)\n" CTL_COMMON_HELP
            "\nJSON: {\"records\": [{dlq_partition, dlq_offset, key, original_topic, action,\n"
            "target_topic, reason, error}], \"matched\", \"redriven\", \"skipped\", \"failed\",\n"
            "\"dry_run\"}; action is redriven, would_redrive, skipped_done, skipped_in_flight,\n"
            "skipped_repeat or failed.\n\n" CTL_EXIT_HELP
            "(1 here: nothing matched, or some records could not be re-produced)\n");
}

typedef struct rd_opts {
    int all, dry;
    const char *account, *key, *dlq_topic, *to_topic;
    long long partition, from, to, limit, timeout_ms;
} rd_opts;

typedef struct keyset {
    char **v;
    size_t n, cap;
} keyset;

static int keyset_add(keyset *s, const char *k)
{
    /* Open addressing on a power-of-two table of string pointers. */
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        char **nv = calloc(cap, sizeof *nv);
        if (!nv)
            return -1;
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->v[i])
                continue;
            size_t h = 5381;
            for (const char *p = s->v[i]; *p; p++)
                h = h * 33 + (unsigned char)*p;
            size_t j = h & (cap - 1);
            while (nv[j])
                j = (j + 1) & (cap - 1);
            nv[j] = s->v[i];
        }
        free(s->v);
        s->v = nv;
        s->cap = cap;
    }
    size_t h = 5381;
    for (const char *p = k; *p; p++)
        h = h * 33 + (unsigned char)*p;
    size_t j = h & (s->cap - 1);
    while (s->v[j]) {
        if (strcmp(s->v[j], k) == 0)
            return 0; /* already there */
        j = (j + 1) & (s->cap - 1);
    }
    s->v[j] = strdup(k);
    if (!s->v[j])
        return -1;
    s->n++;
    return 1;
}

static void keyset_free(keyset *s)
{
    for (size_t i = 0; i < s->cap; i++)
        free(s->v[i]);
    free(s->v);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A header value as a NUL-terminated copy in buf, or NULL when absent or null. */
static const char *hdr_str(rd_kafka_headers_t *h, const char *name, char *buf, size_t size)
{
    const void *v = NULL;
    size_t len = 0;
    if (!h || rd_kafka_header_get_last(h, name, &v, &len) != RD_KAFKA_RESP_ERR_NO_ERROR || !v)
        return NULL;
    if (len >= size)
        len = size - 1;
    memcpy(buf, v, len);
    buf[len] = '\0';
    return buf;
}

/* The librdkafka properties a producer shares with the configuration (addresses, security). */
/* A waited-delivery producer with the configuration's connection properties. */
static wxg_producer_t *make_producer(const wxg_conf_t *conf, char *err, size_t errsz)
{
    rd_kafka_conf_t *kc = wxg_conf_kafka(conf, err, errsz);
    if (!kc)
        return NULL;
    /* The connection settings only: the rest of kafka.* configures the consumer. */
    wxg_producer_t *p = wxg_producer_new_like(kc, WXG_PRODUCER_CONNECTION, NULL, 0, err, errsz);
    rd_kafka_conf_destroy(kc);
    return p;
}

/* Fails (-1, with the reason on stderr) when the brokers refuse the configuration's SASL
 * credentials, so that a wrong password reads as such and not as a metadata time-out. Asks
 * through `p`, or through a producer of its own for a dry run (which has none). Other
 * outcomes are left to the reads that follow. */
static int check_kafka(const ctl_opts *o, const wxg_conf_t *conf, wxg_producer_t *p)
{
    char err[512] = "";
    wxg_producer_t *own = p ? NULL : make_producer(conf, err, sizeof err);
    int rc = p || own ? wxg_producer_check(p ? p : own, KAFKA_CHECK_MS, err, sizeof err) : 0;
    wxg_producer_destroy(own, 0);
    if (rc == WXG_EAUTH) {
        fprintf(stderr, "%s: %s\n", o->prog, err);
        return -1;
    }
    return 0;
}

/* A consumer handle for reading the DLQ by assignment: its own throw-away group id (never
 * joined, never committed). */
static rd_kafka_t *make_reader(const wxg_conf_t *conf, char *err, size_t errsz)
{
    rd_kafka_conf_t *kc = wxg_conf_kafka(conf, err, errsz);
    if (!kc)
        return NULL;
    char gid[64];
    snprintf(gid, sizeof gid, "wxguardctl-redrive-%ld", (long)getpid());
    if (rd_kafka_conf_set(kc, "group.id", gid, err, errsz) != RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(kc, "enable.auto.commit", "false", err, errsz) != RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(kc, "enable.partition.eof", "true", err, errsz) != RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(kc);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, errsz);
    if (!rk) {
        rd_kafka_conf_destroy(kc);
        return NULL;
    }
    rd_kafka_poll_set_consumer(rk);
    return rk;
}

typedef struct rd_state {
    const ctl_opts *o;
    const rd_opts *r;
    wxg_guard_t *g;
    wxg_producer_t *p;
    keyset seen;
    cJSON *arr;
    long long matched, redriven, skipped, failed;
} rd_state;

static int record_matches(const rd_opts *r, const char *ikey, const rd_kafka_message_t *m)
{
    if (r->partition >= 0 && m->partition != r->partition)
        return 0;
    if (m->offset < r->from || (r->to >= 0 && m->offset > r->to))
        return 0;
    if (r->key && (!ikey || strcmp(ikey, r->key) != 0))
        return 0;
    if (r->account && !ctl_key_in_account(ikey, r->account))
        return 0;
    return 1;
}

/* Decides and (unless a dry run) re-produces one matching record. Returns 0, or an exit status
 * that ends the run (Redis/Kafka unreachable). */
static int redrive_one(rd_state *s, const rd_kafka_message_t *m)
{
    rd_kafka_headers_t *h = NULL;
    rd_kafka_message_headers(m, &h);
    char kbuf[WXG_KEY_MAX + 1], tbuf[256], errbuf[512] = "";
    const char *ikey = hdr_str(h, WXG_DLQ_HDR_IDEMPOTENCY, kbuf, sizeof kbuf);
    const char *otopic = hdr_str(h, WXG_DLQ_HDR_TOPIC, tbuf, sizeof tbuf);
    if (!record_matches(s->r, ikey, m))
        return 0;
    s->matched++;
    const char *target = s->r->to_topic ? s->r->to_topic : otopic;
    const char *action = NULL, *reason = NULL;
    int status = 0;
    if (!target) {
        action = "failed";
        reason = "no wxg-dlq-original-topic header; give --to-topic";
    }
    if (!action && ikey) {
        int added = keyset_add(&s->seen, ikey);
        if (added < 0) {
            fprintf(stderr, "%s: out of memory\n", s->o->prog);
            return EXIT_USAGE;
        }
        if (added == 0) {
            action = "skipped_repeat";
            reason = "the same key was already handled in this run";
        }
    }
    if (!action && ikey) {
        wxg_guard_record_t *rec = NULL;
        int rc = wxg_guard_inspect(s->g, ikey, strlen(ikey), NULL, &rec);
        if (rc != 0)
            return ctl_guard_error(s->o, s->g, "inspect", rc);
        if (rec->state == WXG_GUARD_DONE) {
            action = "skipped_done";
            reason = "already DONE: a copy would be a duplicate";
        } else if (rec->state == WXG_GUARD_PROCESSING && rec->lease_ms_left > 0) {
            action = "skipped_in_flight";
            reason = "claimed by a live owner right now";
        } else if (rec->state == WXG_GUARD_FAILED && !s->r->dry) {
            int rearmed = 0;
            rc = wxg_guard_rearm(s->g, ikey, strlen(ikey), &rearmed);
            if (rc != 0) {
                wxg_guard_record_free(rec);
                return ctl_guard_error(s->o, s->g, "rearm", rc);
            }
        }
        wxg_guard_record_free(rec);
    }
    if (!action && s->r->dry)
        action = "would_redrive";
    if (!action) {
        /* Original headers minus the DLQ's own, plus where this copy came from. */
        size_t nh = h ? rd_kafka_header_cnt(h) : 0, k = 0;
        wxg_kafka_header_t *hv = calloc(nh + 1, sizeof *hv);
        char src[400];
        snprintf(src, sizeof src, "%s/%d/%lld", rd_kafka_topic_name(m->rkt), (int)m->partition,
                 (long long)m->offset);
        if (!hv) {
            fprintf(stderr, "%s: out of memory\n", s->o->prog);
            return EXIT_USAGE;
        }
        for (size_t i = 0; i < nh; i++) {
            const char *name;
            const void *val;
            size_t size;
            if (rd_kafka_header_get_all(h, i, &name, &val, &size) != RD_KAFKA_RESP_ERR_NO_ERROR)
                break;
            if (strncmp(name, WXG_DLQ_HDR_PREFIX, strlen(WXG_DLQ_HDR_PREFIX)) == 0 ||
                strcmp(name, REDRIVE_HDR_SOURCE) == 0)
                continue;
            hv[k++] = (wxg_kafka_header_t){.name = name, .value = val, .value_len = size};
        }
        hv[k++] = (wxg_kafka_header_t){
            .name = REDRIVE_HDR_SOURCE, .value = src, .value_len = strlen(src)};
        int rc = wxg_producer_send(s->p, target, WXG_PARTITION_ANY, m->key, m->key_len, m->payload,
                                   m->len, hv, k, NULL, errbuf, sizeof errbuf);
        free(hv);
        if (rc == 0) {
            action = "redriven";
        } else {
            action = "failed";
            reason = errbuf;
            if (rc == WXG_EAUTH)
                status = EXIT_CONN;
        }
    }
    if (strcmp(action, "redriven") == 0 || strcmp(action, "would_redrive") == 0)
        s->redriven++;
    else if (strcmp(action, "failed") == 0)
        s->failed++;
    else
        s->skipped++;
    if (s->arr) {
        cJSON *o = cJSON_CreateObject();
        if (o) {
            cJSON_AddNumberToObject(o, "dlq_partition", m->partition);
            cJSON_AddNumberToObject(o, "dlq_offset", (double)m->offset);
            if (ikey)
                cJSON_AddStringToObject(o, "key", ikey);
            else
                cJSON_AddNullToObject(o, "key");
            if (otopic)
                cJSON_AddStringToObject(o, "original_topic", otopic);
            else
                cJSON_AddNullToObject(o, "original_topic");
            cJSON_AddStringToObject(o, "action", action);
            if (target)
                cJSON_AddStringToObject(o, "target_topic", target);
            char ebuf[256];
            const char *err = hdr_str(h, WXG_DLQ_HDR_REASON, ebuf, sizeof ebuf);
            if (err)
                cJSON_AddStringToObject(o, "dlq_reason", err);
            if (reason)
                cJSON_AddStringToObject(o, "reason", reason);
            cJSON_AddItemToArray(s->arr, o);
        }
    } else {
        printf("%s\tdlq %d/%lld\t%s\t-> %s%s%s\n", action, (int)m->partition, (long long)m->offset,
               ikey ? ikey : "(no key)", target ? target : "-", reason ? "\t" : "",
               reason ? reason : "");
    }
    return status;
}

int ctl_cmd_redrive(int argc, char **argv)
{
    enum { OPT_ALL = 2001, OPT_FROM, OPT_TO, OPT_DLQ_TOPIC, OPT_TO_TOPIC, OPT_LIMIT, OPT_TIMEOUT };
    static const struct option longopts[] = {
        CTL_COMMON_LONGOPTS,
        {"all", no_argument, NULL, OPT_ALL},
        {"account", required_argument, NULL, 'a'},
        {"key", required_argument, NULL, 'k'},
        {"partition", required_argument, NULL, 'p'},
        {"from-offset", required_argument, NULL, OPT_FROM},
        {"to-offset", required_argument, NULL, OPT_TO},
        {"dry-run", no_argument, NULL, 'n'},
        {"dlq-topic", required_argument, NULL, OPT_DLQ_TOPIC},
        {"to-topic", required_argument, NULL, OPT_TO_TOPIC},
        {"limit", required_argument, NULL, OPT_LIMIT},
        {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
        {NULL, 0, NULL, 0},
    };
    ctl_opts o;
    ctl_opts_init(&o, "wxguardctl redrive");
    rd_opts r = {.partition = -1, .from = 0, .to = -1, .limit = -1, .timeout_ms = 60000};
    int from_set = 0, to_set = 0;
    int status = EXIT_USAGE, c;
    wxg_conf_t *conf = NULL;
    rd_state s;
    memset(&s, 0, sizeof s);
    rd_kafka_t *rk = NULL;
    rd_kafka_topic_partition_list_t *assign = NULL;
    const rd_kafka_metadata_t *md = NULL;
    int64_t *ends = NULL;
    int *open = NULL;
    cJSON *doc = NULL;
    char err[512] = "";
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:a:k:p:nh", longopts, NULL)) != -1) {
        int hc = ctl_common_opt(&o, c, optarg);
        if (hc < 0)
            goto out;
        if (hc > 0)
            continue;
        switch (c) {
        case OPT_ALL:
            r.all = 1;
            break;
        case 'a':
            r.account = optarg;
            break;
        case 'k':
            r.key = optarg;
            if (wxg_key_check(optarg, NULL) != 0) {
                fprintf(stderr, "%s: '%s' is not an idempotency key\n", o.prog, optarg);
                goto out;
            }
            break;
        case 'p':
            if (ctl_parse_ll(optarg, 0, 1000000, &r.partition) != 0) {
                fprintf(stderr, "%s: --partition wants a partition number\n", o.prog);
                goto out;
            }
            break;
        case OPT_FROM:
            from_set = 1;
            if (ctl_parse_ll(optarg, 0, INT64_MAX, &r.from) != 0) {
                fprintf(stderr, "%s: --from-offset wants an offset >= 0\n", o.prog);
                goto out;
            }
            break;
        case OPT_TO:
            to_set = 1;
            if (ctl_parse_ll(optarg, 0, INT64_MAX, &r.to) != 0) {
                fprintf(stderr, "%s: --to-offset wants an offset >= 0\n", o.prog);
                goto out;
            }
            break;
        case 'n':
            r.dry = 1;
            break;
        case OPT_DLQ_TOPIC:
            r.dlq_topic = optarg;
            break;
        case OPT_TO_TOPIC:
            r.to_topic = optarg;
            break;
        case OPT_LIMIT:
            if (ctl_parse_ll(optarg, 1, INT64_MAX, &r.limit) != 0) {
                fprintf(stderr, "%s: --limit wants a number >= 1\n", o.prog);
                goto out;
            }
            break;
        case OPT_TIMEOUT:
            if (ctl_parse_ll(optarg, 100, 86400000, &r.timeout_ms) != 0) {
                fprintf(stderr, "%s: --timeout-ms wants 100..86400000\n", o.prog);
                goto out;
            }
            break;
        case 'h':
            ctl_help_redrive(stdout);
            status = EXIT_OK;
            goto out;
        default:
            ctl_help_redrive(stderr);
            goto out;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", o.prog, argv[optind]);
        goto out;
    }
    if ((from_set || to_set) && r.partition < 0) {
        fprintf(stderr, "%s: --from-offset/--to-offset need --partition\n", o.prog);
        goto out;
    }
    if (to_set && r.to < r.from) {
        fprintf(stderr, "%s: --to-offset is before --from-offset\n", o.prog);
        goto out;
    }
    if (!r.all && !r.account && !r.key && r.partition < 0) {
        fprintf(stderr, "%s: choose what to redrive: --all, --account, --key or --partition\n",
                o.prog);
        goto out;
    }
    conf = ctl_load_conf(&o, 1);
    if (!conf)
        goto out;
    const char *dlq = r.dlq_topic ? r.dlq_topic : wxg_conf_get(conf, "dlq.topic");
    s.o = &o;
    s.r = &r;
    s.g = ctl_open_guard(&o, conf, &status);
    if (!s.g)
        goto out;
    status = EXIT_CONN;
    if (!r.dry) {
        s.p = make_producer(conf, err, sizeof err);
        if (!s.p) {
            fprintf(stderr, "%s: Kafka producer: %s\n", o.prog, err);
            goto out;
        }
    }
    if (check_kafka(&o, conf, s.p) != 0)
        goto out;
    rk = make_reader(conf, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "%s: Kafka: %s\n", o.prog, err);
        goto out;
    }
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, dlq, NULL);
    rd_kafka_resp_err_t kerr =
        rkt ? rd_kafka_metadata(rk, 0, rkt, &md, 10000) : RD_KAFKA_RESP_ERR__INVALID_ARG;
    if (rkt)
        rd_kafka_topic_destroy(rkt);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR || md->topic_cnt != 1) {
        fprintf(stderr, "%s: Kafka: metadata of %s: %s\n", o.prog, dlq, rd_kafka_err2str(kerr));
        goto out;
    }
    if (md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "%s: DLQ topic %s: %s\n", o.prog, dlq, rd_kafka_err2str(md->topics[0].err));
        status = md->topics[0].err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ? EXIT_NOTFOUND
                                                                              : EXIT_CONN;
        goto out;
    }
    int nparts = md->topics[0].partition_cnt;
    if (r.partition >= nparts) {
        fprintf(stderr, "%s: %s has no partition %lld (it has %d)\n", o.prog, dlq, r.partition,
                nparts);
        status = EXIT_NOTFOUND;
        goto out;
    }
    ends = calloc((size_t)nparts + 1, sizeof *ends);
    open = calloc((size_t)nparts + 1, sizeof *open);
    assign = rd_kafka_topic_partition_list_new(nparts);
    if (!ends || !open || !assign) {
        fprintf(stderr, "%s: out of memory\n", o.prog);
        status = EXIT_USAGE;
        goto out;
    }
    int nopen = 0;
    long long total = 0;
    for (int i = 0; i < nparts; i++) {
        int32_t pid = md->topics[0].partitions[i].id;
        if (r.partition >= 0 && pid != r.partition)
            continue;
        int64_t lo = 0, hi = 0;
        kerr = rd_kafka_query_watermark_offsets(rk, dlq, pid, &lo, &hi, 10000);
        if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "%s: Kafka: watermarks of %s/%d: %s\n", o.prog, dlq, (int)pid,
                    rd_kafka_err2str(kerr));
            goto out;
        }
        int64_t start = lo > r.from ? lo : r.from;
        int64_t end = hi; /* exclusive */
        if (r.to >= 0 && r.to + 1 < end)
            end = r.to + 1;
        if (start >= end || pid > nparts)
            continue;
        ends[pid] = end;
        open[pid] = 1;
        nopen++;
        total += end - start;
        rd_kafka_topic_partition_list_add(assign, dlq, pid)->offset = start;
    }
    if (o.json) {
        doc = cJSON_CreateObject();
        s.arr = doc ? cJSON_AddArrayToObject(doc, "records") : NULL;
        if (!s.arr) {
            fprintf(stderr, "%s: out of memory\n", o.prog);
            status = EXIT_USAGE;
            goto out;
        }
    }
    ctl_progress(&o, 1, "reading %lld record(s) from %d partition(s) of %s%s", total, nopen, dlq,
                 r.dry ? " (dry run)" : "");
    int run_status = EXIT_OK;
    long long seen = 0;
    if (nopen > 0) {
        kerr = rd_kafka_assign(rk, assign);
        if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "%s: Kafka: assign: %s\n", o.prog, rd_kafka_err2str(kerr));
            goto out;
        }
        int64_t deadline = mono_ms() + r.timeout_ms;
        while (nopen > 0 && run_status == EXIT_OK && (r.limit < 0 || s.matched < r.limit)) {
            if (mono_ms() > deadline) {
                fprintf(stderr, "%s: timed out with %d partition(s) not read to the end\n", o.prog,
                        nopen);
                run_status = EXIT_CONN;
                break;
            }
            rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
            if (!m)
                continue;
            int32_t pid = m->partition;
            int known = pid >= 0 && pid < nparts + 1 && open[pid];
            if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                if (known && m->offset >= ends[pid]) {
                    open[pid] = 0;
                    nopen--;
                }
            } else if (m->err) {
                fprintf(stderr, "%s: Kafka: %s\n", o.prog, rd_kafka_message_errstr(m));
                if (m->err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
                    m->err == RD_KAFKA_RESP_ERR__AUTHENTICATION)
                    run_status = EXIT_CONN;
            } else if (known && m->offset < ends[pid]) {
                seen++;
                run_status = redrive_one(&s, m);
                if (m->offset + 1 >= ends[pid]) {
                    open[pid] = 0;
                    nopen--;
                }
                ctl_progress(&o, 0, "read %lld of %lld, matched %lld, re-produced %lld", seen,
                             total, s.matched, s.redriven);
            }
            rd_kafka_message_destroy(m);
        }
        rd_kafka_assign(rk, NULL);
    }
    ctl_progress(&o, 1, "read %lld record(s): matched %lld, %s %lld, skipped %lld, failed %lld",
                 seen, s.matched, r.dry ? "would re-produce" : "re-produced", s.redriven, s.skipped,
                 s.failed);
    if (doc) {
        cJSON_AddNumberToObject(doc, "matched", (double)s.matched);
        cJSON_AddNumberToObject(doc, "redriven", (double)s.redriven);
        cJSON_AddNumberToObject(doc, "skipped", (double)s.skipped);
        cJSON_AddNumberToObject(doc, "failed", (double)s.failed);
        cJSON_AddBoolToObject(doc, "dry_run", r.dry);
        ctl_print_json(doc);
        doc = NULL;
    }
    status = run_status;
    if (status == EXIT_OK && (s.matched == 0 || s.failed > 0))
        status = EXIT_NOTFOUND;
out:
    cJSON_Delete(doc);
    if (md)
        rd_kafka_metadata_destroy(md);
    if (assign)
        rd_kafka_topic_partition_list_destroy(assign);
    if (rk) {
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
    }
    free(ends);
    free(open);
    wxg_producer_destroy(s.p, 5000);
    wxg_guard_destroy(s.g);
    keyset_free(&s.seen);
    wxg_conf_free(conf);
    ctl_opts_free(&o);
    return status;
}
