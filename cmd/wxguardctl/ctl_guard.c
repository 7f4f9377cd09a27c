/*
 * wxguardctl subcommands on the Redis guard: inspect, failed, release, purge.
 *
 * Every read and change goes through the guard's public API (include/wxguard/guard.h), so the
 * tool never depends on how records are laid out in Redis. Listing uses the guard's SCAN walk
 * (a cursor and COUNT, never KEYS); nothing here deletes more than one record per call, and
 * nothing ever runs FLUSHDB or FLUSHALL.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "wxguard/err.h"
#include "wxguard/key.h"
#include "wxguard/msg.h"

/* ---- inspect ------------------------------------------------------------------------------ */

void ctl_help_inspect(FILE *out)
{
    fprintf(out,
            "usage: wxguardctl inspect [options] KEY\n"
            "       wxguardctl inspect [options] --message FILE [--format F]\n\n"
            "Shows what the guard knows about a message: its state (ABSENT, PROCESSING, FAILED,\n"
            "DONE), owner, fencing token, attempts, the plugins that already finished with\n"
            "their results, the lease left and the record's TTL. A DONE message has no record\n"
            "of its own: it is remembered by a compact marker in a time-bucketed hash, and the\n"
            "bucket and its expiry are shown. --message decodes a callback record (as\n"
            "`wxguardctl key` does) and inspects every message in it, also telling whether a\n"
            "DONE message was finished with a different payload.\n\n"
            "  -m, --message FILE   a callback record ('-' for standard input)\n"
            "  -f, --format F       its format: auto (default), wkteam, gewe, oa-xml, oa-json,\n"
            "                       generic\n" CTL_COMMON_HELP
            "\nJSON: {\"messages\": [{key, state, has_record, owner, fence, attempt,\n"
            "claimed_at_ms, record_ttl_ms, lease_ms_left, fail_attempts, reason, failed_at_ms,\n"
            "finished_plugins: [{plugin, result}], done: {marker, bucket_key, time_bucket,\n"
            "bucket_start_ms, bucket_end_ms, ttl_ms, payload_matches}}]}\n\n" CTL_EXIT_HELP
            "(1 here: at least one message is ABSENT)\n");
}

static int read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 65536, n = 0;
    char *b = malloc(cap);
    int rc = -1;
    while (b) {
        if (n == cap) {
            char *nb = cap < ((size_t)64 << 20) ? realloc(b, cap * 2) : NULL;
            if (!nb)
                break;
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            rc = ferror(f) ? -1 : 0;
            break;
        }
    }
    if (f != stdin)
        fclose(f);
    if (rc != 0) {
        free(b);
        return -1;
    }
    *buf = b;
    *len = n;
    return 0;
}

/* Inspects one key and prints it; returns 0, 1 (ABSENT) or another exit status. */
static int inspect_one(const ctl_opts *o, wxg_guard_t *g, const char *key,
                       const unsigned char *payload_hash, cJSON *arr, int64_t bucket_ms, int first)
{
    wxg_guard_record_t *r = NULL;
    int rc = wxg_guard_inspect(g, key, strlen(key), payload_hash, &r);
    if (rc != 0)
        return ctl_guard_error(o, g, "inspect", rc);
    int absent = r->state == WXG_GUARD_ABSENT;
    if (arr) {
        cJSON_AddItemToArray(arr, ctl_record_json(key, r, bucket_ms));
    } else {
        if (!first)
            fputc('\n', stdout);
        ctl_record_text(stdout, key, r, bucket_ms);
    }
    wxg_guard_record_free(r);
    return absent ? EXIT_NOTFOUND : EXIT_OK;
}

int ctl_cmd_inspect(int argc, char **argv)
{
    static const struct option longopts[] = {
        CTL_COMMON_LONGOPTS,
        {"message", required_argument, NULL, 'm'},
        {"format", required_argument, NULL, 'f'},
        {NULL, 0, NULL, 0},
    };
    ctl_opts o;
    ctl_opts_init(&o, "wxguardctl inspect");
    const char *message = NULL;
    wxg_format_t format = WXG_FORMAT_AUTO;
    int status = EXIT_USAGE, c;
    wxg_conf_t *conf = NULL;
    wxg_guard_t *g = NULL;
    wxg_batch_t *batch = NULL;
    char *buf = NULL;
    cJSON *doc = NULL, *arr = NULL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:m:f:h", longopts, NULL)) != -1) {
        int h = ctl_common_opt(&o, c, optarg);
        if (h < 0)
            goto out;
        if (h > 0)
            continue;
        switch (c) {
        case 'm':
            message = optarg;
            break;
        case 'f':
            if (wxg_format_parse(optarg, &format) != 0) {
                fprintf(stderr, "%s: unknown format '%s'\n", o.prog, optarg);
                goto out;
            }
            break;
        case 'h':
            ctl_help_inspect(stdout);
            status = EXIT_OK;
            goto out;
        default:
            ctl_help_inspect(stderr);
            goto out;
        }
    }
    int nargs = argc - optind;
    if ((message && nargs != 0) || (!message && nargs != 1)) {
        fprintf(stderr, "%s: give exactly one KEY or --message FILE (see --help)\n", o.prog);
        goto out;
    }
    const char *key = message ? NULL : argv[optind];
    if (key && wxg_key_check(key, NULL) != 0) {
        fprintf(stderr,
                "%s: '%s' is not an idempotency key (<account>:<kind>:<id>, see docs/keys.md)\n",
                o.prog, key);
        goto out;
    }
    if (message) {
        size_t len = 0;
        if (read_file(message, &buf, &len) != 0) {
            fprintf(stderr, "%s: cannot read %s: %s\n", o.prog, message, strerror(errno));
            goto out;
        }
        wxg_decode_opts_t dopts = {.format = format};
        char err[256];
        int rc = wxg_decode(buf, len, &dopts, &batch, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "%s: the message does not decode: %s: %s\n", o.prog, wxg_err_name(rc),
                    err);
            goto out;
        }
        if (wxg_batch_count(batch) == 0) {
            fprintf(stderr, "%s: the record holds no message\n", o.prog);
            status = EXIT_NOTFOUND;
            goto out;
        }
    }
    conf = ctl_load_conf(&o, 0);
    if (!conf)
        goto out;
    g = ctl_open_guard(&o, conf, &status);
    if (!g)
        goto out;
    int64_t bucket_ms = ctl_bucket_ms(g);
    if (o.json) {
        doc = cJSON_CreateObject();
        arr = doc ? cJSON_AddArrayToObject(doc, "messages") : NULL;
        if (!arr) {
            fprintf(stderr, "%s: out of memory\n", o.prog);
            goto out;
        }
    }
    status = EXIT_OK;
    if (key) {
        status = inspect_one(&o, g, key, NULL, arr, bucket_ms, 1);
    } else {
        for (size_t i = 0; i < wxg_batch_count(batch); i++) {
            const wxg_msg_view_t *m = wxg_batch_msg(batch, i);
            int rc = inspect_one(&o, g, m->key, m->payload_hash, arr, bucket_ms, i == 0);
            if (rc > status)
                status = rc;
            if (rc > EXIT_NOTFOUND)
                break;
        }
    }
    if (doc && status <= EXIT_NOTFOUND) {
        ctl_print_json(doc);
        doc = NULL;
    }
out:
    cJSON_Delete(doc);
    wxg_batch_free(batch);
    free(buf);
    wxg_guard_destroy(g);
    wxg_conf_free(conf);
    ctl_opts_free(&o);
    return status;
}

/* ---- failed ------------------------------------------------------------------------------- */

void ctl_help_failed(FILE *out)
{
    fprintf(out,
            "usage: wxguardctl failed [--account A] [--limit N] [--count C] [options]\n\n"
            "Lists FAILED messages with their reasons: messages that were dead-lettered, whose\n"
            "last attempt failed and waits for a retry, or whose claim an operator released.\n"
            "Walks the guard's records with SCAN (a cursor and COUNT, never KEYS); progress goes\n"
            "to stderr. DONE messages have no record and never appear.\n\n"
            "  -a, --account A      only messages of this bot account (as written in callbacks)\n"
            "  -n, --limit N        stop after N messages (default 1000)\n"
            "      --count C        SCAN COUNT hint per page (default 500)\n" CTL_COMMON_HELP
            "\nJSON: {\"failed\": [{key, reason, fail_attempts, fence, failed_at_ms,\n"
            "record_ttl_ms, finished_plugins, ...}], \"listed\": n, \"scanned\": m,\n"
            "\"complete\": true when the walk reached its end}\n\n" CTL_EXIT_HELP
            "(1 here: no FAILED message matched)\n");
}

typedef struct failed_walk {
    const ctl_opts *o;
    const char *account;
    long long limit;
    long long listed, scanned;
    int64_t bucket_ms;
    cJSON *arr;
} failed_walk;

static int failed_cb(const wxg_guard_record_t *r, void *arg)
{
    failed_walk *w = arg;
    w->scanned++;
    if (r->state != WXG_GUARD_FAILED)
        return 0;
    if (w->account && !ctl_key_in_account(r->msg_key, w->account))
        return 0;
    w->listed++;
    if (w->arr) {
        cJSON_AddItemToArray(w->arr, ctl_record_json(NULL, r, w->bucket_ms));
    } else {
        char t[64], ttl[64];
        ctl_fmt_time(r->failed_at_ms, t, sizeof t);
        ctl_fmt_duration(r->record_ttl_ms, ttl, sizeof ttl);
        printf("%s\tfailed %s\tattempts %u\tfence %llu\tkept %s\treason: %s\n",
               r->msg_key ? r->msg_key : r->record_key, t, r->fail_attempts,
               (unsigned long long)r->fence, ttl, r->fail_reason ? r->fail_reason : "-");
    }
    return w->listed >= w->limit ? 1 : 0;
}

int ctl_cmd_failed(int argc, char **argv)
{
    static const struct option longopts[] = {
        CTL_COMMON_LONGOPTS,
        {"account", required_argument, NULL, 'a'},
        {"limit", required_argument, NULL, 'n'},
        {"count", required_argument, NULL, 'C'},
        {NULL, 0, NULL, 0},
    };
    ctl_opts o;
    ctl_opts_init(&o, "wxguardctl failed");
    failed_walk w = {.o = &o, .limit = 1000};
    long long count = 500;
    int status = EXIT_USAGE, c;
    wxg_conf_t *conf = NULL;
    wxg_guard_t *g = NULL;
    cJSON *doc = NULL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:a:n:h", longopts, NULL)) != -1) {
        int h = ctl_common_opt(&o, c, optarg);
        if (h < 0)
            goto out;
        if (h > 0)
            continue;
        switch (c) {
        case 'a':
            w.account = optarg;
            if (!*optarg) {
                fprintf(stderr, "%s: --account wants a non-empty account\n", o.prog);
                goto out;
            }
            break;
        case 'n':
            if (ctl_parse_ll(optarg, 1, 100000000, &w.limit) != 0) {
                fprintf(stderr, "%s: --limit wants 1..100000000\n", o.prog);
                goto out;
            }
            break;
        case 'C':
            if (ctl_parse_ll(optarg, 1, 100000, &count) != 0) {
                fprintf(stderr, "%s: --count wants 1..100000\n", o.prog);
                goto out;
            }
            break;
        case 'h':
            ctl_help_failed(stdout);
            status = EXIT_OK;
            goto out;
        default:
            ctl_help_failed(stderr);
            goto out;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", o.prog, argv[optind]);
        goto out;
    }
    conf = ctl_load_conf(&o, 0);
    if (!conf)
        goto out;
    g = ctl_open_guard(&o, conf, &status);
    if (!g)
        goto out;
    w.bucket_ms = ctl_bucket_ms(g);
    if (o.json) {
        doc = cJSON_CreateObject();
        w.arr = doc ? cJSON_AddArrayToObject(doc, "failed") : NULL;
        if (!w.arr) {
            fprintf(stderr, "%s: out of memory\n", o.prog);
            goto out;
        }
    }
    uint64_t cursor = 0;
    int complete = 0;
    for (;;) {
        int rc = wxg_guard_scan(g, &cursor, (int)count, failed_cb, &w);
        if (rc < 0) {
            status = ctl_guard_error(&o, g, "scan", rc);
            goto out;
        }
        ctl_progress(&o, 0, "scanned %lld records, %lld FAILED listed", w.scanned, w.listed);
        if (rc > 0)
            break; /* the limit was reached */
        if (cursor == 0) {
            complete = 1;
            break;
        }
    }
    ctl_progress(&o, 1, "%s: scanned %lld records, %lld FAILED listed",
                 complete ? "done" : "stopped at --limit", w.scanned, w.listed);
    if (doc) {
        cJSON_AddNumberToObject(doc, "listed", (double)w.listed);
        cJSON_AddNumberToObject(doc, "scanned", (double)w.scanned);
        cJSON_AddBoolToObject(doc, "complete", complete);
        ctl_print_json(doc);
        doc = NULL;
    }
    status = w.listed > 0 ? EXIT_OK : EXIT_NOTFOUND;
out:
    cJSON_Delete(doc);
    wxg_guard_destroy(g);
    wxg_conf_free(conf);
    ctl_opts_free(&o);
    return status;
}

/* ---- release ------------------------------------------------------------------------------ */

void ctl_help_release(FILE *out)
{
    fprintf(out,
            "usage: wxguardctl release [--yes] [options] KEY\n\n"
            "Clears a stuck PROCESSING claim, for when its owner is known to be dead and you do\n"
            "not want to wait for its lease to expire. The message becomes FAILED with reason\n"
            "\"released\" and keeps its fencing counter: the next delivery claims it with a\n"
            "higher fence, and the old owner's later writes are refused as lease lost. Asks\n"
            "for confirmation (y/N on stdin) unless --yes. A DONE message is never touched.\n\n"
            "  -y, --yes            do not ask\n" CTL_COMMON_HELP "\n" CTL_EXIT_HELP
            "(1 here: the message is not PROCESSING -- DONE, FAILED or absent -- so nothing\n"
            "was released)\n");
}

int ctl_cmd_release(int argc, char **argv)
{
    static const struct option longopts[] = {
        CTL_COMMON_LONGOPTS,
        {"yes", no_argument, NULL, 'y'},
        {NULL, 0, NULL, 0},
    };
    ctl_opts o;
    ctl_opts_init(&o, "wxguardctl release");
    int status = EXIT_USAGE, c;
    wxg_conf_t *conf = NULL;
    wxg_guard_t *g = NULL;
    wxg_guard_record_t *r = NULL;
    cJSON *doc = NULL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:yh", longopts, NULL)) != -1) {
        int h = ctl_common_opt(&o, c, optarg);
        if (h < 0)
            goto out;
        if (h > 0)
            continue;
        if (c == 'h') {
            ctl_help_release(stdout);
            status = EXIT_OK;
        } else {
            ctl_help_release(stderr);
        }
        goto out;
    }
    if (argc - optind != 1) {
        fprintf(stderr, "%s: give exactly one KEY (see --help)\n", o.prog);
        goto out;
    }
    const char *key = argv[optind];
    if (wxg_key_check(key, NULL) != 0) {
        fprintf(stderr, "%s: '%s' is not an idempotency key\n", o.prog, key);
        goto out;
    }
    conf = ctl_load_conf(&o, 0);
    if (!conf)
        goto out;
    g = ctl_open_guard(&o, conf, &status);
    if (!g)
        goto out;
    int rc = wxg_guard_inspect(g, key, strlen(key), NULL, &r);
    if (rc != 0) {
        status = ctl_guard_error(&o, g, "inspect", rc);
        goto out;
    }
    const char *outcome;
    if (r->state != WXG_GUARD_PROCESSING) {
        if (r->state == WXG_GUARD_DONE)
            fprintf(stderr, "%s: refused: %s is DONE; a finished message is never released\n",
                    o.prog, key);
        else
            fprintf(stderr, "%s: %s is %s, not PROCESSING: nothing to release\n", o.prog, key,
                    ctl_state_name(r->state));
        outcome = r->state == WXG_GUARD_DONE ? "refused_done" : "not_processing";
        status = EXIT_NOTFOUND;
    } else {
        char q[512], left[64];
        ctl_fmt_duration(r->lease_ms_left > 0 ? r->lease_ms_left : 0, left, sizeof left);
        if (r->lease_ms_left > 0)
            fprintf(stderr,
                    "%s: %s is claimed by owner %s (fence %llu) and its lease is LIVE for %s.\n"
                    "Release it only if you know that owner is dead; otherwise two workers may "
                    "run its plugins.\n",
                    o.prog, key, r->owner, (unsigned long long)r->fence, left);
        snprintf(q, sizeof q, "Release the claim of %s (owner %s, fence %llu)?", key, r->owner,
                 (unsigned long long)r->fence);
        if (!ctl_confirm(&o, q)) {
            fprintf(stderr, "%s: not released\n", o.prog);
            outcome = "aborted";
            status = EXIT_ABORTED;
        } else {
            int released = 0;
            rc = wxg_guard_release(g, key, strlen(key), &released);
            if (rc != 0) {
                status = ctl_guard_error(&o, g, "release", rc);
                goto out;
            }
            outcome = released ? "released" : "not_processing";
            status = released ? EXIT_OK : EXIT_NOTFOUND;
            if (!o.json)
                printf("%s: %s\n", key,
                       released ? "released (now FAILED, reason \"released\")"
                                : "was no longer PROCESSING: nothing released");
        }
    }
    if (o.json) {
        doc = cJSON_CreateObject();
        if (doc) {
            cJSON_AddStringToObject(doc, "key", key);
            cJSON_AddStringToObject(doc, "outcome", outcome);
            cJSON_AddStringToObject(doc, "state_before", ctl_state_name(r->state));
        }
        ctl_print_json(doc);
        doc = NULL;
    }
out:
    cJSON_Delete(doc);
    wxg_guard_record_free(r);
    wxg_guard_destroy(g);
    wxg_conf_free(conf);
    ctl_opts_free(&o);
    return status;
}

/* ---- purge -------------------------------------------------------------------------------- */

void ctl_help_purge(FILE *out)
{
    fprintf(out,
            "usage: wxguardctl purge --account A [--yes] [--dry-run] [options]\n\n"
            "Removes one account's guard records: every FAILED record, and every PROCESSING\n"
            "record whose lease has expired. Live claims are kept (and reported). Walks the\n"
            "records with SCAN; asks for confirmation (y/N on stdin) with the count unless\n"
            "--yes.\n\n"
            "What purge cannot remove: DONE messages. They have no record of their own; each is\n"
            "a fingerprint in a compact hash shared by every account, which expires as a whole\n"
            "after guard.done.retention. Until then a redelivered DONE message of the account\n"
            "is still skipped as a duplicate. A purged FAILED message that is delivered again\n"
            "is processed again from its first plugin; its fence still rises above every fence\n"
            "it had before (fences come from the Redis server's clock), so fenced stores accept\n"
            "it and still refuse a writer from before the purge.\n"
            "Records written before keys were stored in them carry no account and are never\n"
            "purged by account.\n\n"
            "  -a, --account A      the bot account (required)\n"
            "      --dry-run        count and list, change nothing\n"
            "  -y, --yes            do not ask\n"
            "      --count C        SCAN COUNT hint per page (default 500)\n" CTL_COMMON_HELP
            "\nJSON: {\"account\", \"matched\", \"purged\", \"kept_live\", \"keys\": [...],\n"
            "\"dry_run\"}\n\n" CTL_EXIT_HELP
            "(1 here: no record of the account, or live claims were kept)\n");
}

typedef struct purge_walk {
    const char *account;
    char **keys;
    size_t n, cap;
    long long scanned, live;
} purge_walk;

static int purge_cb(const wxg_guard_record_t *r, void *arg)
{
    purge_walk *w = arg;
    w->scanned++;
    if (!ctl_key_in_account(r->msg_key, w->account))
        return 0;
    if (r->state == WXG_GUARD_PROCESSING && r->lease_ms_left > 0) {
        w->live++;
        return 0;
    }
    /* SCAN may report a key twice. */
    for (size_t i = 0; i < w->n; i++) {
        if (strcmp(w->keys[i], r->msg_key) == 0)
            return 0;
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k)
            return WXG_ENOMEM;
        w->keys = k;
        w->cap = cap;
    }
    w->keys[w->n] = strdup(r->msg_key);
    if (!w->keys[w->n])
        return WXG_ENOMEM;
    w->n++;
    return 0;
}

int ctl_cmd_purge(int argc, char **argv)
{
    enum { OPT_DRY = 2001, OPT_COUNT };
    static const struct option longopts[] = {
        CTL_COMMON_LONGOPTS,
        {"account", required_argument, NULL, 'a'},
        {"yes", no_argument, NULL, 'y'},
        {"dry-run", no_argument, NULL, OPT_DRY},
        {"count", required_argument, NULL, OPT_COUNT},
        {NULL, 0, NULL, 0},
    };
    ctl_opts o;
    ctl_opts_init(&o, "wxguardctl purge");
    purge_walk w = {0};
    int dry = 0, status = EXIT_USAGE, c;
    long long count = 500, purged = 0, gone = 0;
    wxg_conf_t *conf = NULL;
    wxg_guard_t *g = NULL;
    cJSON *doc = NULL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:a:yh", longopts, NULL)) != -1) {
        int h = ctl_common_opt(&o, c, optarg);
        if (h < 0)
            goto out;
        if (h > 0)
            continue;
        switch (c) {
        case 'a':
            w.account = optarg;
            break;
        case OPT_DRY:
            dry = 1;
            break;
        case OPT_COUNT:
            if (ctl_parse_ll(optarg, 1, 100000, &count) != 0) {
                fprintf(stderr, "%s: --count wants 1..100000\n", o.prog);
                goto out;
            }
            break;
        case 'h':
            ctl_help_purge(stdout);
            status = EXIT_OK;
            goto out;
        default:
            ctl_help_purge(stderr);
            goto out;
        }
    }
    if (optind != argc || !w.account || !*w.account) {
        fprintf(stderr, "%s: --account A is required and no other argument is taken\n", o.prog);
        goto out;
    }
    conf = ctl_load_conf(&o, 0);
    if (!conf)
        goto out;
    g = ctl_open_guard(&o, conf, &status);
    if (!g)
        goto out;
    uint64_t cursor = 0;
    do {
        int rc = wxg_guard_scan(g, &cursor, (int)count, purge_cb, &w);
        if (rc != 0) {
            status = ctl_guard_error(&o, g, "scan", rc);
            goto out;
        }
        ctl_progress(&o, 0, "scanned %lld records, %zu of account to purge", w.scanned, w.n);
    } while (cursor != 0);
    ctl_progress(&o, 1, "scanned %lld records: %zu of account %s to purge, %lld live claims kept",
                 w.scanned, w.n, w.account, w.live);
    status = EXIT_OK;
    if (w.n > 0 && !dry) {
        char q[512];
        snprintf(q, sizeof q,
                 "Delete %zu guard record(s) of account %s (DONE markers are not affected)?", w.n,
                 w.account);
        if (!ctl_confirm(&o, q)) {
            fprintf(stderr, "%s: nothing purged\n", o.prog);
            status = EXIT_ABORTED;
        } else {
            for (size_t i = 0; i < w.n; i++) {
                int done = 0;
                int rc = wxg_guard_purge(g, w.keys[i], strlen(w.keys[i]), &done);
                if (rc != 0) {
                    status = ctl_guard_error(&o, g, "purge", rc);
                    break;
                }
                if (done)
                    purged++;
                else
                    gone++; /* taken by a new claim or removed since the walk */
                ctl_progress(&o, 0, "purged %lld of %zu", purged, w.n);
            }
        }
    }
    if (status == EXIT_OK && (w.n == 0 || w.live > 0 || gone > 0))
        status = EXIT_NOTFOUND;
    if (o.json) {
        doc = cJSON_CreateObject();
        if (doc) {
            cJSON_AddStringToObject(doc, "account", w.account);
            cJSON_AddNumberToObject(doc, "matched", (double)w.n);
            cJSON_AddNumberToObject(doc, "purged", (double)purged);
            cJSON_AddNumberToObject(doc, "kept_live", (double)w.live);
            cJSON_AddNumberToObject(doc, "scanned", (double)w.scanned);
            cJSON_AddBoolToObject(doc, "dry_run", dry);
            cJSON *arr = cJSON_AddArrayToObject(doc, "keys");
            for (size_t i = 0; arr && i < w.n; i++)
                cJSON_AddItemToArray(arr, cJSON_CreateString(w.keys[i]));
        }
        ctl_print_json(doc);
        doc = NULL;
    } else {
        for (size_t i = 0; dry && i < w.n; i++)
            printf("%s\n", w.keys[i]);
        printf("account %s: %zu record(s) matched, %lld purged, %lld live claim(s) kept%s\n",
               w.account, w.n, purged, w.live, dry ? " (dry run)" : "");
    }
out:
    for (size_t i = 0; i < w.n; i++)
        free(w.keys[i]);
    free(w.keys);
    cJSON_Delete(doc);
    wxg_guard_destroy(g);
    wxg_conf_free(conf);
    ctl_opts_free(&o);
    return status;
}
