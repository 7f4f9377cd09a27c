/*
 * DESIGN: the accept decision of the webhook receiver (wxguard-ingest), and its mirror in the
 * consumer.
 *
 * Purpose: what ingest authenticated is what the consumer runs. wxg_ingest_accept() decides once
 * how a callback body decodes and whether it may be stored; ingest writes the decision into the
 * record's headers (wxguard/ingest.h: WXG_INGEST_HDR_FORMAT, WXG_INGEST_HDR_ACCOUNT), and the
 * consumer decodes the record as stated with wxg_ingest_record_decode() instead of detecting the
 * format again. Before this split a body ingest had checked as a generic message could run in the
 * consumer as an Official Account push that no signature covered.
 *
 * Why detection must agree with the endpoint: a consumer that detects (consumer.format = auto,
 * the default, or a record produced before ingest wrote the header) reads the body by its
 * discriminating fields; refusing any body whose detection differs from the endpoint's reading
 * makes every reader of the record see one format, whichever way it decodes.
 *
 * Both functions are pure (no I/O, no state: only lib/msg.c's decoder), in a file of their own
 * so that the fuzz harness links them without the HTTP and Kafka sides of ingest.
 *
 * Threads: any thread, any number at once.
 */
#include "wxguard/ingest.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err_int.h"
#include "wxguard/err.h"
#include "wxguard/msg.h"

/* The Official Account may be set to push XML or JSON; the body says which. */
static wxg_format_t sniff_oa(const char *body, size_t len)
{
    size_t i = 0;
    if (len >= 3 && memcmp(body, "\xef\xbb\xbf", 3) == 0)
        i = 3;
    while (i < len && isspace((unsigned char)body[i]))
        i++;
    return i < len && body[i] == '<' ? WXG_FORMAT_OA_XML : WXG_FORMAT_OA_JSON;
}

static int is_oa(wxg_format_t f)
{
    return f == WXG_FORMAT_OA_XML || f == WXG_FORMAT_OA_JSON;
}

/* ---- the accept decision ------------------------------------------------------------------ */

static wxg_format_t endpoint_format(wxg_ingest_endpoint_t ep, const char *body, size_t len)
{
    switch (ep) {
    case WXG_INGEST_EP_WKTEAM:
        return WXG_FORMAT_WKTEAM;
    case WXG_INGEST_EP_GEWE:
        return WXG_FORMAT_GEWE;
    case WXG_INGEST_EP_OA:
        return sniff_oa(body, len);
    case WXG_INGEST_EP_GENERIC:
        return WXG_FORMAT_GENERIC;
    default:
        return WXG_FORMAT_AUTO;
    }
}

static int refused(const char **why, const char *what, char *reason, size_t reason_size, int rc,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int refused(const char **why, const char *what, char *reason, size_t reason_size, int rc,
                   const char *fmt, ...)
{
    *why = what;
    va_list ap;
    va_start(ap, fmt);
    wxg__verrf(reason, reason_size, fmt, ap);
    va_end(ap);
    return rc;
}

/* Whether detection reads the body as the endpoint's decode did. Both readings of a probe carry
 * no account and so act for nobody: they may name different formats. 1 same, 0 not, or
 * WXG_ENOMEM. `seen` receives the name of what detection decided. */
static int detection_agrees(const void *body, size_t len, size_t max_bytes,
                            const wxg_msg_view_t *first, const char **seen)
{
    wxg_decode_opts_t o = {.format = WXG_FORMAT_AUTO, .max_bytes = max_bytes};
    wxg_batch_t *a = NULL;
    char tmp[256];
    int rc = wxg_decode(body, len, &o, &a, tmp, sizeof tmp);
    if (rc == WXG_ENOMEM)
        return WXG_ENOMEM;
    const wxg_msg_view_t *af = rc == 0 ? wxg_batch_msg(a, 0) : NULL;
    int same = af != NULL && (af->format == first->format ||
                              (af->account[0] == '\0' && first->account[0] == '\0'));
    *seen = af != NULL ? wxg_format_name(af->format) : rc == 0 ? "an empty batch" : "nothing";
    wxg_batch_free(a);
    return same;
}

static int allowed_account(const wxg_ingest_accept_opts_t *o, const char *account)
{
    if (o->allowed == NULL || account[0] == '\0')
        return 1;
    for (size_t i = 0; i < o->nallowed; i++) {
        if (o->allowed[i] != NULL && strcmp(o->allowed[i], account) == 0)
            return 1;
    }
    return 0;
}

int wxg_ingest_accept(wxg_ingest_endpoint_t ep, const void *body, size_t len,
                      const wxg_ingest_accept_opts_t *opts, wxg_batch_t **out, const char **why,
                      char *reason, size_t reason_size)
{
    static const wxg_ingest_accept_opts_t none = {0};
    const char *dummy;
    char tmp[8];
    if (why == NULL)
        why = &dummy;
    *why = NULL;
    if (reason == NULL || reason_size == 0) {
        reason = tmp;
        reason_size = sizeof tmp;
    }
    reason[0] = '\0';
    if (out == NULL || (body == NULL && len > 0) || (unsigned)ep > WXG_INGEST_EP_AUTO)
        return refused(why, "undecodable", reason, reason_size, WXG_EINVAL, "invalid argument");
    *out = NULL;
    const wxg_ingest_accept_opts_t *o = opts != NULL ? opts : &none;
    const char *pacct = o->path_account != NULL ? o->path_account : "";

    wxg_format_t f = endpoint_format(ep, body, len);
    wxg_decode_opts_t dopts = {.format = f, .max_bytes = o->max_bytes};
    wxg_batch_t *b = NULL;
    int rc = wxg_decode(body, len, &dopts, &b, reason, reason_size);
    if (rc != 0) {
        *why = rc == WXG_ENOMEM ? "nomem" : "undecodable";
        return rc;
    }
    size_t n = wxg_batch_count(b);
    if (n == 0) {
        *out = b;
        return 0;
    }
    const wxg_msg_view_t *first = wxg_batch_msg(b, 0);
    const char *fname = wxg_format_name(first->format);
    if (f != WXG_FORMAT_AUTO) {
        const char *seen = "nothing";
        int same = detection_agrees(body, len, o->max_bytes, first, &seen);
        if (same != 1) {
            wxg_batch_free(b);
            if (same == WXG_ENOMEM)
                return refused(why, "nomem", reason, reason_size, WXG_ENOMEM, "out of memory");
            return refused(why, "format_mismatch", reason, reason_size, WXG_EFORMAT,
                           "the body reads as %s to format detection, not as the endpoint's %s: a "
                           "body carrying another format's fields is refused",
                           seen, fname);
        }
    }
    if (ep != WXG_INGEST_EP_OA && is_oa(first->format)) {
        /* Through another endpoint an Official Account push would skip its signature check. */
        wxg_batch_free(b);
        return refused(why, "oa_elsewhere", reason, reason_size, WXG_EFORMAT,
                       "Official Account pushes are accepted only on " WXG_INGEST_PATH_PREFIX
                       "oa, where their signature is checked");
    }
    const char *want = pacct[0] != '\0' ? pacct : first->account;
    for (size_t i = 0; i < n; i++) {
        const wxg_msg_view_t *m = wxg_batch_msg(b, i);
        if (strcmp(m->account, want) != 0) {
            wxg_batch_free(b);
            if (pacct[0] != '\0')
                return refused(why, "account_mismatch", reason, reason_size, WXG_ENOACCOUNT,
                               "message %zu belongs to another account than the path names", i);
            return refused(why, "mixed_accounts", reason, reason_size, WXG_ENOACCOUNT,
                           "message %zu belongs to another account than message 0: one callback "
                           "carries the messages of one bot",
                           i);
        }
    }
    if (!allowed_account(o, want)) {
        wxg_batch_free(b);
        return refused(why, "account_not_allowed", reason, reason_size, WXG_EAUTH,
                       "the signing secret is not bound to this callback's account");
    }
    *out = b;
    return 0;
}

int wxg_ingest_record_decode(const void *buf, size_t len, const char *format, size_t format_len,
                             const char *account, size_t account_len, const wxg_decode_opts_t *opts,
                             wxg_batch_t **out, char *errstr, size_t errstr_size)
{
    if (format == NULL)
        return wxg_decode(buf, len, opts, out, errstr, errstr_size);
    if (out == NULL) {
        wxg__errf(errstr, errstr_size, "invalid argument");
        return WXG_EINVAL;
    }
    *out = NULL;
    char name[16];
    wxg_format_t stated = WXG_FORMAT_AUTO;
    if (format_len < sizeof name) {
        memcpy(name, format, format_len);
        name[format_len] = '\0';
    }
    if (format_len >= sizeof name || wxg_format_parse(name, &stated) != 0 ||
        stated == WXG_FORMAT_AUTO) {
        wxg__errf(errstr, errstr_size,
                  "the record's " WXG_INGEST_HDR_FORMAT " header names no format");
        return WXG_EFORMAT;
    }
    wxg_format_t pinned = opts != NULL ? opts->format : WXG_FORMAT_AUTO;
    if (pinned != WXG_FORMAT_AUTO && pinned != stated) {
        wxg__errf(errstr, errstr_size,
                  "the record's " WXG_INGEST_HDR_FORMAT
                  " header states %s but consumer.format is %s",
                  wxg_format_name(stated), wxg_format_name(pinned));
        return WXG_EFORMAT;
    }
    wxg_decode_opts_t o = opts != NULL ? *opts : (wxg_decode_opts_t){0};
    o.format = stated;
    char why[256] = "";
    wxg_batch_t *b = NULL;
    int rc = wxg_decode(buf, len, &o, &b, why, sizeof why);
    if (rc != 0) {
        wxg__errf(errstr, errstr_size, "as its " WXG_INGEST_HDR_FORMAT " header states (%s): %s",
                  wxg_format_name(stated), why);
        return rc;
    }
    if (account != NULL) {
        for (size_t i = 0; i < wxg_batch_count(b); i++) {
            const char *a = wxg_batch_msg(b, i)->account;
            if (strlen(a) != account_len || memcmp(a, account, account_len) != 0) {
                wxg_batch_free(b);
                wxg__errf(
                    errstr, errstr_size,
                    "message %zu names another account than the record's " WXG_INGEST_HDR_ACCOUNT
                    " header",
                    i);
                return WXG_EFORMAT;
            }
        }
    }
    *out = b;
    return 0;
}
