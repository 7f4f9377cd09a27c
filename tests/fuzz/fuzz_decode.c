/* libFuzzer harness for wxg_decode() and the safe-mode path (wxg_decode_oa_encrypt(),
 * wxg__oa_decrypt()): every input is decoded with every forced format and with detection, at the
 * default caps and at a small depth cap. Beyond "no crash, no leak, no undefined behaviour" it
 * checks the decoder's promises and traps when one is broken:
 *   - a success yields views whose keys pass wxg_key_check() with the view's kind, whose
 *     strings are NUL-terminated and whose msg_id passes the id grammar;
 *   - a failure is one of the input error codes, with a non-empty printable reason;
 *   - whatever ingest's accept decision (wxg_ingest_accept) takes on any endpoint, the consumer's
 *     decode of the record ingest writes (wxg_ingest_record_decode with its headers) yields the
 *     same messages: formats, accounts and keys. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oacrypt_int.h"
#include "wxguard/err.h"
#include "wxguard/ingest.h"
#include "wxguard/key.h"
#include "wxguard/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_view(const wxg_msg_view_t *m)
{
    char kind = 0;
    if (m == NULL || m->key == NULL || wxg_key_check(m->key, &kind) != 0 ||
        kind != (char)m->key_kind)
        __builtin_trap();
    if (m->account == NULL || m->conversation == NULL || m->sender == NULL || m->to == NULL ||
        m->type == NULL || m->content == NULL || m->key_reason == NULL || m->raw == NULL)
        __builtin_trap();
    if (m->content[m->content_len] != '\0')
        __builtin_trap();
    if (m->msg_id != NULL && wxg_id_check(m->msg_id, strlen(m->msg_id)) != WXG_ID_OK)
        __builtin_trap();
    /* Touch every string so that ASan sees any read past its end. */
    volatile size_t sink = strlen(m->account) + strlen(m->conversation) + strlen(m->sender) +
                           strlen(m->to) + strlen(m->type) + strlen(m->key_reason);
    (void)sink;
}

static void check_error(int rc, const char *err)
{
    switch (rc) {
    case WXG_ETOOBIG:
    case WXG_EDEPTH:
    case WXG_EPARSE:
    case WXG_EFORMAT:
    case WXG_ENOACCOUNT:
    case WXG_EIDCONFLICT:
        break;
    default:
        __builtin_trap();
    }
    if (err[0] == '\0')
        __builtin_trap();
    for (const char *p = err; *p; p++) {
        if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
            __builtin_trap();
    }
}

/* The differential check of the accept decision against the consumer's decode. */
static void check_accept(const uint8_t *data, size_t size)
{
    for (int ep = WXG_INGEST_EP_WKTEAM; ep <= WXG_INGEST_EP_AUTO; ep++) {
        wxg_batch_t *b = NULL;
        const char *why = NULL;
        char err[256];
        int rc = wxg_ingest_accept((wxg_ingest_endpoint_t)ep, data, size, NULL, &b, &why, err,
                                   sizeof err);
        if (rc != 0) {
            if (b != NULL || why == NULL)
                __builtin_trap();
            if (rc != WXG_ENOACCOUNT && rc != WXG_EAUTH)
                check_error(rc, err);
            continue;
        }
        size_t n = wxg_batch_count(b);
        if (n > 0) {
            const wxg_msg_view_t *first = wxg_batch_msg(b, 0);
            const char *fn = wxg_format_name(first->format);
            wxg_decode_opts_t any = {.format = WXG_FORMAT_AUTO};
            wxg_batch_t *c = NULL;
            if (wxg_ingest_record_decode(data, size, fn, strlen(fn), first->account,
                                         strlen(first->account), &any, &c, err, sizeof err) != 0 ||
                wxg_batch_count(c) != n)
                __builtin_trap();
            for (size_t i = 0; i < n; i++) {
                const wxg_msg_view_t *x = wxg_batch_msg(b, i), *y = wxg_batch_msg(c, i);
                if (x->format != y->format || strcmp(x->account, y->account) != 0 ||
                    strcmp(x->key, y->key) != 0)
                    __builtin_trap();
            }
            wxg_batch_free(c);
        }
        wxg_batch_free(b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_accept(data, size);
    static const wxg_format_t formats[] = {WXG_FORMAT_AUTO,    WXG_FORMAT_WKTEAM,
                                           WXG_FORMAT_GEWE,    WXG_FORMAT_OA_XML,
                                           WXG_FORMAT_OA_JSON, WXG_FORMAT_GENERIC};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0] * 2; i++) {
        wxg_decode_opts_t o = {.format = formats[i % 6], .max_depth = i >= 6 ? 4 : 0};
        wxg_batch_t *b = NULL;
        char err[256];
        int rc = wxg_decode(data, size, &o, &b, err, sizeof err);
        if (rc != 0) {
            if (b != NULL)
                __builtin_trap();
            check_error(rc, err);
            continue;
        }
        for (size_t k = 0; k < wxg_batch_count(b); k++)
            check_view(wxg_batch_msg(b, k));
        wxg_batch_free(b);
    }
    /* The safe-mode path of wxguard-ingest: the envelope reader, then decryption of whatever
     * Encrypt it found (and of the raw input as if it were Encrypt) with a fixed key. */
    static const unsigned char key[WXG__OA_AES_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8};
    char err[256];
    char *enc = NULL, *plain = NULL;
    size_t enc_len = 0, plain_len = 0;
    int rc = wxg_decode_oa_encrypt(data, size, NULL, &enc, &enc_len, err, sizeof err);
    if (rc != 0) {
        if (enc != NULL)
            __builtin_trap();
        check_error(rc, err);
    } else {
        if (enc == NULL || enc[enc_len] != '\0')
            __builtin_trap();
        rc = wxg__oa_decrypt(key, "wx_FUZZ", enc, enc_len, &plain, &plain_len, err, sizeof err);
        if (rc == 0 && (plain == NULL || plain[plain_len] != '\0'))
            __builtin_trap();
        free(plain);
        free(enc);
    }
    plain = NULL;
    rc = wxg__oa_decrypt(key, NULL, (const char *)data, size, &plain, &plain_len, err, sizeof err);
    if (rc == 0 && (plain == NULL || plain[plain_len] != '\0'))
        __builtin_trap();
    free(plain);
    return 0;
}
