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
#include "progclock.h"
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
    int from_set, to_set;
    const char *account, *key, *dlq_topic, *to_topic;
    long long partition, from, to, limit, timeout_ms;
} rd_opts;

/* redrive's own long options, above the shared ones (ctl.h). */
enum { OPT_ALL = 2001, OPT_FROM, OPT_TO, OPT_DLQ_TOPIC, OPT_TO_TOPIC, OPT_LIMIT, OPT_TIMEOUT };

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
    if (wxg_err_class(rc) == WXG_CLASS_FATAL) { /* refused credentials */
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

/* What happens to one matching record: an action and, for the ones that are not plain, the
 * reason shown beside it. */
typedef struct rd_verdict {
    const char *action;
    const char *reason;
} rd_verdict;

/* Asks the guard about a record with an idempotency key and re-arms a FAILED one (unless a dry
 * run). Sets v->action when the record is skipped. Returns 0, or an exit status that ends the
 * run. */
static int consult_guard(rd_state *s, const char *ikey, rd_verdict *v)
{
    int added = keyset_add(&s->seen, ikey);
    if (added < 0) {
        fprintf(stderr, "%s: out of memory\n", s->o->prog);
        return EXIT_USAGE;
    }
    if (added == 0) {
        v->action = "skipped_repeat";
        v->reason = "the same key was already handled in this run";
        return 0;
    }
    wxg_guard_record_t *rec = NULL;
    int rc = wxg_guard_inspect(s->g, ikey, strlen(ikey), NULL, &rec);
    if (rc != 0)
        return ctl_guard_error(s->o, s->g, "inspect", rc);
    int status = 0;
    if (rec->state == WXG_GUARD_DONE) {
        v->action = "skipped_done";
        v->reason = "already DONE: a copy would be a duplicate";
    } else if (rec->state == WXG_GUARD_PROCESSING && rec->lease_ms_left > 0) {
        v->action = "skipped_in_flight";
        v->reason = "claimed by a live owner right now";
    } else if (rec->state == WXG_GUARD_FAILED && !s->r->dry) {
        int rearmed = 0;
        rc = wxg_guard_rearm(s->g, ikey, strlen(ikey), &rearmed);
        if (rc != 0)
            status = ctl_guard_error(s->o, s->g, "rearm", rc);
    }
    wxg_guard_record_free(rec);
    return status;
}

/* Produces the record's key and value to `target` with the original headers minus the DLQ's
 * own, plus where this copy came from. Sets v; `errbuf` holds the reason of a failure. Returns
 * 0, or an exit status for the run (EXIT_CONN when Kafka refused our credentials). */
static int reproduce(rd_state *s, const rd_kafka_message_t *m, rd_kafka_headers_t *h,
                     const char *target, rd_verdict *v, char *errbuf, size_t errsize)
{
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
    hv[k++] =
        (wxg_kafka_header_t){.name = REDRIVE_HDR_SOURCE, .value = src, .value_len = strlen(src)};
    int rc = wxg_producer_send(s->p, target, WXG_PARTITION_ANY, m->key, m->key_len, m->payload,
                               m->len, hv, k, NULL, errbuf, errsize);
    free(hv);
    if (rc == 0) {
        v->action = "redriven";
        return 0;
    }
    v->action = "failed";
    v->reason = errbuf;
    /* A fatal class (credentials refused, librdkafka's fatal error) ends the run; another
     * failure is this record's, and the next one is tried. */
    return wxg_err_class(rc) == WXG_CLASS_FATAL ? EXIT_CONN : 0;
}

/* Counts the record and prints its line (or adds its JSON object). */
static void report_record(rd_state *s, const rd_kafka_message_t *m, rd_kafka_headers_t *h,
                          const char *ikey, const char *otopic, const char *target,
                          const rd_verdict *v)
{
    if (strcmp(v->action, "redriven") == 0 || strcmp(v->action, "would_redrive") == 0)
        s->redriven++;
    else if (strcmp(v->action, "failed") == 0)
        s->failed++;
    else
        s->skipped++;
    if (!s->arr) {
        printf("%s\tdlq %d/%lld\t%s\t-> %s%s%s\n", v->action, (int)m->partition,
               (long long)m->offset, ikey ? ikey : "(no key)", target ? target : "-",
               v->reason ? "\t" : "", v->reason ? v->reason : "");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
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
    cJSON_AddStringToObject(o, "action", v->action);
    if (target)
        cJSON_AddStringToObject(o, "target_topic", target);
    char ebuf[256];
    const char *err = hdr_str(h, WXG_DLQ_HDR_REASON, ebuf, sizeof ebuf);
    if (err)
        cJSON_AddStringToObject(o, "dlq_reason", err);
    if (v->reason)
        cJSON_AddStringToObject(o, "reason", v->reason);
    cJSON_AddItemToArray(s->arr, o);
}

/* Decides and (unless a dry run) re-produces one matching record: a target topic is needed,
 * the guard decides for a record with a key, then the record is produced. Returns 0, or an
 * exit status that ends the run (Redis/Kafka unreachable). */
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
    rd_verdict v = {NULL, NULL};
    int status = 0;
    if (!target) {
        v.action = "failed";
        v.reason = "no wxg-dlq-original-topic header; give --to-topic";
    }
    if (!v.action && ikey) {
        status = consult_guard(s, ikey, &v);
        if (status != 0)
            return status;
    }
    if (!v.action && s->r->dry)
        v.action = "would_redrive";
    if (!v.action) {
        status = reproduce(s, m, h, target, &v, errbuf, sizeof errbuf);
        if (!v.action)
            return status; /* out of memory: nothing was produced */
    }
    report_record(s, m, h, ikey, otopic, target, &v);
    return status;
}

/* Everything one run holds, released by run_free. */
typedef struct rd_run {
    ctl_opts o;
    rd_opts r;
    rd_state s;
    wxg_conf_t *conf;
    const char *dlq; /* the topic read */
    rd_kafka_t *rk;
    const rd_kafka_metadata_t *md;
    rd_kafka_topic_partition_list_t *assign;
    int nparts;
    int64_t *ends; /* per partition id: the offset reading stops before */
    int *open;     /* per partition id: 1 while not read to its end */
    int nopen;
    int assigned; /* the reader holds the partitions (rd_kafka_assign) */
    long long total, seen;
    cJSON *doc;
} rd_run;

/* The stages below return GO_ON to let the next one run, or the exit status of the command. */
#define GO_ON (-1)

/* One option of redrive's own (the shared ones are ctl_common_opt's). */
static int redrive_option(rd_run *run, int c, const char *arg)
{
    rd_opts *r = &run->r;
    const char *prog = run->o.prog;
    switch (c) {
    case OPT_ALL:
        r->all = 1;
        return GO_ON;
    case 'a':
        r->account = arg;
        return GO_ON;
    case 'k':
        r->key = arg;
        if (wxg_key_check(arg, NULL) != 0) {
            fprintf(stderr, "%s: '%s' is not an idempotency key\n", prog, arg);
            return EXIT_USAGE;
        }
        return GO_ON;
    case 'p':
        if (ctl_parse_ll(arg, 0, 1000000, &r->partition) != 0) {
            fprintf(stderr, "%s: --partition wants a partition number\n", prog);
            return EXIT_USAGE;
        }
        return GO_ON;
    case OPT_FROM:
        r->from_set = 1;
        if (ctl_parse_ll(arg, 0, INT64_MAX, &r->from) != 0) {
            fprintf(stderr, "%s: --from-offset wants an offset >= 0\n", prog);
            return EXIT_USAGE;
        }
        return GO_ON;
    case OPT_TO:
        r->to_set = 1;
        if (ctl_parse_ll(arg, 0, INT64_MAX, &r->to) != 0) {
            fprintf(stderr, "%s: --to-offset wants an offset >= 0\n", prog);
            return EXIT_USAGE;
        }
        return GO_ON;
    case 'n':
        r->dry = 1;
        return GO_ON;
    case OPT_DLQ_TOPIC:
        r->dlq_topic = arg;
        return GO_ON;
    case OPT_TO_TOPIC:
        r->to_topic = arg;
        return GO_ON;
    case OPT_LIMIT:
        if (ctl_parse_ll(arg, 1, INT64_MAX, &r->limit) != 0) {
            fprintf(stderr, "%s: --limit wants a number >= 1\n", prog);
            return EXIT_USAGE;
        }
        return GO_ON;
    case OPT_TIMEOUT:
        if (ctl_parse_ll(arg, 100, 86400000, &r->timeout_ms) != 0) {
            fprintf(stderr, "%s: --timeout-ms wants 100..86400000\n", prog);
            return EXIT_USAGE;
        }
        return GO_ON;
    case 'h':
        ctl_help_redrive(stdout);
        return EXIT_OK;
    default:
        ctl_help_redrive(stderr);
        return EXIT_USAGE;
    }
}

/* Stage 1: the command line, and the selection it makes. */
static int parse_args(rd_run *run, int argc, char **argv)
{
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
    const rd_opts *r = &run->r;
    const char *prog = run->o.prog;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:a:k:p:nh", longopts, NULL)) != -1) {
        int hc = ctl_common_opt(&run->o, c, optarg);
        if (hc < 0)
            return EXIT_USAGE;
        if (hc > 0)
            continue;
        int status = redrive_option(run, c, optarg);
        if (status != GO_ON)
            return status;
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return EXIT_USAGE;
    }
    if ((r->from_set || r->to_set) && r->partition < 0) {
        fprintf(stderr, "%s: --from-offset/--to-offset need --partition\n", prog);
        return EXIT_USAGE;
    }
    if (r->to_set && r->to < r->from) {
        fprintf(stderr, "%s: --to-offset is before --from-offset\n", prog);
        return EXIT_USAGE;
    }
    if (!r->all && !r->account && !r->key && r->partition < 0) {
        fprintf(stderr, "%s: choose what to redrive: --all, --account, --key or --partition\n",
                prog);
        return EXIT_USAGE;
    }
    return GO_ON;
}

/* Stage 2: the configuration, the guard, the producer (not for a dry run) and the DLQ reader. */
static int open_clients(rd_run *run)
{
    char err[512] = "";
    int status = EXIT_USAGE;
    run->conf = ctl_load_conf(&run->o, 1);
    if (!run->conf)
        return EXIT_USAGE;
    run->dlq = run->r.dlq_topic ? run->r.dlq_topic : wxg_conf_get(run->conf, "dlq.topic");
    run->s.o = &run->o;
    run->s.r = &run->r;
    run->s.g = ctl_open_guard(&run->o, run->conf, &status);
    if (!run->s.g)
        return status;
    if (!run->r.dry) {
        run->s.p = make_producer(run->conf, err, sizeof err);
        if (!run->s.p) {
            fprintf(stderr, "%s: Kafka producer: %s\n", run->o.prog, err);
            return EXIT_CONN;
        }
    }
    if (check_kafka(&run->o, run->conf, run->s.p) != 0)
        return EXIT_CONN;
    run->rk = make_reader(run->conf, err, sizeof err);
    if (!run->rk) {
        fprintf(stderr, "%s: Kafka: %s\n", run->o.prog, err);
        return EXIT_CONN;
    }
    return GO_ON;
}

/* The DLQ topic's metadata, with its partition count in run->nparts. */
static int read_metadata(rd_run *run)
{
    const char *prog = run->o.prog;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(run->rk, run->dlq, NULL);
    rd_kafka_resp_err_t kerr =
        rkt ? rd_kafka_metadata(run->rk, 0, rkt, &run->md, 10000) : RD_KAFKA_RESP_ERR__INVALID_ARG;
    if (rkt)
        rd_kafka_topic_destroy(rkt);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR || run->md->topic_cnt != 1) {
        fprintf(stderr, "%s: Kafka: metadata of %s: %s\n", prog, run->dlq, rd_kafka_err2str(kerr));
        return EXIT_CONN;
    }
    rd_kafka_resp_err_t terr = run->md->topics[0].err;
    if (terr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "%s: DLQ topic %s: %s\n", prog, run->dlq, rd_kafka_err2str(terr));
        return terr == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ? EXIT_NOTFOUND : EXIT_CONN;
    }
    run->nparts = run->md->topics[0].partition_cnt;
    if (run->r.partition >= run->nparts) {
        fprintf(stderr, "%s: %s has no partition %lld (it has %d)\n", prog, run->dlq,
                run->r.partition, run->nparts);
        return EXIT_NOTFOUND;
    }
    return GO_ON;
}

/* Stage 3: which partitions to read, from where, and up to the high watermark seen now, so that
 * the run ends. */
static int plan_partitions(rd_run *run)
{
    int status = read_metadata(run);
    if (status != GO_ON)
        return status;
    int nparts = run->nparts;
    run->ends = calloc((size_t)nparts + 1, sizeof *run->ends);
    run->open = calloc((size_t)nparts + 1, sizeof *run->open);
    run->assign = rd_kafka_topic_partition_list_new(nparts);
    if (!run->ends || !run->open || !run->assign) {
        fprintf(stderr, "%s: out of memory\n", run->o.prog);
        return EXIT_USAGE;
    }
    for (int i = 0; i < nparts; i++) {
        int32_t pid = run->md->topics[0].partitions[i].id;
        if (run->r.partition >= 0 && pid != run->r.partition)
            continue;
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t kerr =
            rd_kafka_query_watermark_offsets(run->rk, run->dlq, pid, &lo, &hi, 10000);
        if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "%s: Kafka: watermarks of %s/%d: %s\n", run->o.prog, run->dlq, (int)pid,
                    rd_kafka_err2str(kerr));
            return EXIT_CONN;
        }
        int64_t start = lo > run->r.from ? lo : run->r.from;
        int64_t end = hi; /* exclusive */
        if (run->r.to >= 0 && run->r.to + 1 < end)
            end = run->r.to + 1;
        if (start >= end || pid > nparts)
            continue;
        run->ends[pid] = end;
        run->open[pid] = 1;
        run->nopen++;
        run->total += end - start;
        rd_kafka_topic_partition_list_add(run->assign, run->dlq, pid)->offset = start;
    }
    return GO_ON;
}

/* Stage 4: the JSON document the records go into, with --json. */
static int start_output(rd_run *run)
{
    if (run->o.json) {
        run->doc = cJSON_CreateObject();
        run->s.arr = run->doc ? cJSON_AddArrayToObject(run->doc, "records") : NULL;
        if (!run->s.arr) {
            fprintf(stderr, "%s: out of memory\n", run->o.prog);
            return EXIT_USAGE;
        }
    }
    ctl_progress(&run->o, 1, "reading %lld record(s) from %d partition(s) of %s%s", run->total,
                 run->nopen, run->dlq, run->r.dry ? " (dry run)" : "");
    return GO_ON;
}

/* One message from the reader: an end of partition, an error, or a record to redrive. Returns
 * EXIT_OK to go on reading, or the status the run ends with. */
static int take_message(rd_run *run, const rd_kafka_message_t *m)
{
    int32_t pid = m->partition;
    int known = pid >= 0 && pid < run->nparts + 1 && run->open[pid];
    int status = EXIT_OK;
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        if (known && m->offset >= run->ends[pid]) {
            run->open[pid] = 0;
            run->nopen--;
        }
    } else if (m->err) {
        fprintf(stderr, "%s: Kafka: %s\n", run->o.prog, rd_kafka_message_errstr(m));
        if (m->err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
            m->err == RD_KAFKA_RESP_ERR__AUTHENTICATION)
            status = EXIT_CONN;
    } else if (known && m->offset < run->ends[pid]) {
        run->seen++;
        status = redrive_one(&run->s, m);
        if (m->offset + 1 >= run->ends[pid]) {
            run->open[pid] = 0;
            run->nopen--;
        }
        ctl_progress(&run->o, 0, "read %lld of %lld, matched %lld, re-produced %lld", run->seen,
                     run->total, run->s.matched, run->s.redriven);
    }
    return status;
}

/* Stage 5: the planned partitions assigned to the reader (nothing to do when none has a
 * record to read). */
static int assign_partitions(rd_run *run)
{
    if (run->nopen == 0)
        return GO_ON;
    rd_kafka_resp_err_t kerr = rd_kafka_assign(run->rk, run->assign);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "%s: Kafka: assign: %s\n", run->o.prog, rd_kafka_err2str(kerr));
        return EXIT_CONN;
    }
    run->assigned = 1;
    return GO_ON;
}

/* Stage 6: reads every assigned partition to its end (or to --limit matches, or the timeout)
 * and redrives what matches. Returns the status of the run so far. */
static int read_dlq(rd_run *run)
{
    if (!run->assigned)
        return EXIT_OK;
    int status = EXIT_OK;
    int64_t deadline = prog_mono_ms() + run->r.timeout_ms;
    while (run->nopen > 0 && status == EXIT_OK &&
           (run->r.limit < 0 || run->s.matched < run->r.limit)) {
        if (prog_mono_ms() > deadline) {
            fprintf(stderr, "%s: timed out with %d partition(s) not read to the end\n", run->o.prog,
                    run->nopen);
            status = EXIT_CONN;
            break;
        }
        rd_kafka_message_t *m = rd_kafka_consumer_poll(run->rk, 200);
        if (!m)
            continue;
        status = take_message(run, m);
        rd_kafka_message_destroy(m);
    }
    rd_kafka_assign(run->rk, NULL);
    return status;
}

/* Stage 7: the summary (a progress line, and the JSON document with --json) and the exit
 * status: 1 when nothing matched or a record could not be re-produced. */
static int finish(rd_run *run, int status)
{
    const rd_state *s = &run->s;
    ctl_progress(&run->o, 1,
                 "read %lld record(s): matched %lld, %s %lld, skipped %lld, failed %lld", run->seen,
                 s->matched, run->r.dry ? "would re-produce" : "re-produced", s->redriven,
                 s->skipped, s->failed);
    if (run->doc) {
        cJSON_AddNumberToObject(run->doc, "matched", (double)s->matched);
        cJSON_AddNumberToObject(run->doc, "redriven", (double)s->redriven);
        cJSON_AddNumberToObject(run->doc, "skipped", (double)s->skipped);
        cJSON_AddNumberToObject(run->doc, "failed", (double)s->failed);
        cJSON_AddBoolToObject(run->doc, "dry_run", run->r.dry);
        ctl_print_json(run->doc);
        run->doc = NULL;
    }
    if (status == EXIT_OK && (s->matched == 0 || s->failed > 0))
        status = EXIT_NOTFOUND;
    return status;
}

static void run_free(rd_run *run)
{
    cJSON_Delete(run->doc);
    if (run->md)
        rd_kafka_metadata_destroy(run->md);
    if (run->assign)
        rd_kafka_topic_partition_list_destroy(run->assign);
    if (run->rk) {
        rd_kafka_consumer_close(run->rk);
        rd_kafka_destroy(run->rk);
    }
    free(run->ends);
    free(run->open);
    wxg_producer_destroy(run->s.p, 5000);
    wxg_guard_destroy(run->s.g);
    keyset_free(&run->s.seen);
    wxg_conf_free(run->conf);
    ctl_opts_free(&run->o);
}

int ctl_cmd_redrive(int argc, char **argv)
{
    rd_run run;
    memset(&run, 0, sizeof run);
    ctl_opts_init(&run.o, "wxguardctl redrive");
    run.r = (rd_opts){.partition = -1, .from = 0, .to = -1, .limit = -1, .timeout_ms = 60000};

    int status = parse_args(&run, argc, argv);
    if (status == GO_ON)
        status = open_clients(&run);
    if (status == GO_ON)
        status = plan_partitions(&run);
    if (status == GO_ON)
        status = start_output(&run);
    if (status == GO_ON)
        status = assign_partitions(&run);
    if (status == GO_ON)
        status = finish(&run, read_dlq(&run));
    run_free(&run);
    return status;
}
