/* Unit tests for lib/msg.c: every reference sample (tests/fixtures/samples, expected keys in
 * expected.tsv), the edge cases E1-E10 of the format reference, hostile input and the caps. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkey.h"
#include "wxguard/err.h"
#include "wxguard/key.h"
#include "wxguard/msg.h"

/* ---- helpers --------------------------------------------------------------------------- */

/* Under AddressSanitizer a decode cache keeps nothing (lib/recycle_int.h), so that ASan sees
 * every lifetime; the cache's own figures are checked only without it. */
#if defined(__SANITIZE_ADDRESS__)
#define CACHE_KEEPS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CACHE_KEEPS 0
#endif
#endif
#ifndef CACHE_KEEPS
#define CACHE_KEEPS 1
#endif

static char *samples_dir(void)
{
    const char *src = getenv("WXG_SOURCE_DIR");
    static char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/samples", src ? src : ".");
    return path;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

static char *read_sample(const char *name, size_t *len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", samples_dir(), name);
    return read_file(path, len);
}

/* Decodes and expects success; the caller frees the batch. */
static wxg_batch_t *decode_ok_f(const char *buf, size_t len, wxg_format_t f)
{
    wxg_decode_opts_t o = {.format = f};
    wxg_batch_t *b = NULL;
    char err[256];
    int rc = wxg_decode(buf, len, &o, &b, err, sizeof err);
    if (rc != 0)
        fail_msg("decode failed: %s: %s", wxg_err_name(rc), err);
    assert_non_null(b);
    return b;
}

static wxg_batch_t *decode_ok(const char *s)
{
    return decode_ok_f(s, strlen(s), WXG_FORMAT_AUTO);
}

static wxg_batch_t *decode_sample(const char *name)
{
    size_t len;
    char *buf = read_sample(name, &len);
    wxg_batch_t *b = decode_ok_f(buf, len, WXG_FORMAT_AUTO);
    free(buf);
    return b;
}

/* Decodes and expects the error `code`; returns the reason in a static buffer. */
static const char *decode_err_n(const char *buf, size_t len, const wxg_decode_opts_t *o, int code)
{
    static char err[256];
    wxg_batch_t *b = (wxg_batch_t *)1;
    int rc = wxg_decode(buf, len, o, &b, err, sizeof err);
    if (rc != code)
        fail_msg("expected %s, got %s (%s)", wxg_err_name(code), wxg_err_name(rc), err);
    assert_null(b);
    assert_true(strlen(err) > 0);
    return err;
}

static const char *decode_err(const char *s, int code)
{
    return decode_err_n(s, strlen(s), NULL, code);
}

static const wxg_msg_view_t *only(const wxg_batch_t *b)
{
    assert_int_equal(wxg_batch_count(b), 1);
    return wxg_batch_msg(b, 0);
}

static void assert_view_consistent(const wxg_msg_view_t *m)
{
    wxg_test_assert_key_safe(m->key, NULL);
    char kind = 0;
    assert_int_equal(wxg_key_check(m->key, &kind), 0);
    assert_int_equal(kind, (char)m->key_kind);
    assert_non_null(m->account);
    assert_non_null(m->conversation);
    assert_non_null(m->sender);
    assert_non_null(m->to);
    assert_non_null(m->type);
    assert_non_null(m->content);
    assert_non_null(m->key_reason);
    assert_non_null(m->raw);
    assert_int_equal(m->content[m->content_len], '\0');
    if (m->msg_id != NULL)
        assert_int_equal(wxg_id_check(m->msg_id, strlen(m->msg_id)), WXG_ID_OK);
}

/* ---- the manifest ------------------------------------------------------------------------ */

typedef struct row {
    char file[128], format[32], expect[256];
    size_t index;
} row;

static size_t load_manifest(row *rows, size_t max)
{
    size_t len, n = 0;
    char *buf = read_sample("expected.tsv", &len);
    char *save = NULL;
    buf = realloc(buf, len + 1);
    assert_non_null(buf);
    buf[len] = '\0';
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#' || line[0] == '\0')
            continue;
        assert_true(n < max);
        row *r = &rows[n];
        unsigned long idx = 0;
        if (sscanf(line, "%127[^\t]\t%31[^\t]\t%lu\t%255[^\t]", r->file, r->format, &idx,
                   r->expect) != 4)
            fail_msg("bad manifest line: %s", line);
        r->index = idx;
        n++;
    }
    free(buf);
    return n;
}

static void every_sample_gives_the_key_in_the_manifest(void **state)
{
    (void)state;
    static row rows[256];
    size_t n = load_manifest(rows, 256);
    assert_true(n >= 40);
    for (size_t i = 0; i < n; i++) {
        row *r = &rows[i];
        wxg_format_t f;
        assert_int_equal(wxg_format_parse(r->format, &f), 0);
        size_t len;
        char *buf = read_sample(r->file, &len);
        wxg_decode_opts_t o = {.format = f};
        wxg_batch_t *b = NULL;
        char err[256];
        int rc = wxg_decode(buf, len, &o, &b, err, sizeof err);
        free(buf);
        if (strncmp(r->expect, "error:", 6) == 0) {
            if (rc == 0 || strcmp(wxg_err_name(rc), r->expect + 6) != 0)
                fail_msg("%s (%s): expected %s, got %s", r->file, r->format, r->expect,
                         wxg_err_name(rc));
            continue;
        }
        if (rc != 0)
            fail_msg("%s (%s): %s: %s", r->file, r->format, wxg_err_name(rc), err);
        const wxg_msg_view_t *m = wxg_batch_msg(b, r->index);
        if (m == NULL)
            fail_msg("%s: no message %zu", r->file, r->index);
        assert_view_consistent(m);
        if (strcmp(m->key, r->expect) != 0)
            fail_msg("%s (%s) #%zu: key %s, expected %s", r->file, r->format, r->index, m->key,
                     r->expect);
        wxg_batch_free(b);
    }
}

static void every_sample_file_is_listed_in_the_manifest(void **state)
{
    (void)state;
    static row rows[256];
    size_t n = load_manifest(rows, 256);
    DIR *dir = opendir(samples_dir());
    assert_non_null(dir);
    struct dirent *e;
    size_t files = 0;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "expected.tsv") == 0)
            continue;
        files++;
        int found = 0;
        for (size_t i = 0; i < n && !found; i++)
            found = strcmp(rows[i].file, e->d_name) == 0;
        if (!found)
            fail_msg("%s has no row in expected.tsv", e->d_name);
    }
    closedir(dir);
    assert_true(files >= 39);
}

/* ---- wkteam ------------------------------------------------------------------------------ */

static void wkteam_private_text_decodes_every_field(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("W1.json");
    const wxg_msg_view_t *m = only(b);
    assert_int_equal(m->format, WXG_FORMAT_WKTEAM);
    assert_string_equal(m->account, "wxid_fakebot000001");
    assert_string_equal(m->sender, "wxid_fakealice0001");
    assert_string_equal(m->conversation, "wxid_fakealice0001");
    assert_string_equal(m->to, "wxid_fakebot000001");
    assert_string_equal(m->msg_id, "7301234567890123457");
    assert_int_equal(m->create_time, 1748140000);
    assert_string_equal(m->type, "60001");
    assert_string_equal(m->content, "你好，在吗？😀");
    assert_int_equal(m->content_len, strlen("你好，在吗？😀"));
    assert_true(m->content_is_utf8);
    assert_false(m->is_group);
    assert_false(m->is_self);
    assert_int_equal(m->key_kind, WXG_KEY_SERVER_ID);
    assert_string_equal(m->key_reason, "server id from data.newMsgId");
    wxg_batch_free(b);
}

static void wkteam_ids_that_collide_as_doubles_stay_apart(void **state)
{
    (void)state;
    wxg_batch_t *a = decode_sample("W1.json"), *b = decode_sample("W1b.json");
    assert_string_equal(only(a)->key, "wxid_fakebot000001:n:7301234567890123457");
    assert_string_equal(only(b)->key, "wxid_fakebot000001:n:7301234567890123458");
    assert_memory_not_equal(only(a)->payload_hash, only(b)->payload_hash, 32);
    wxg_batch_free(a);
    wxg_batch_free(b);
}

static void wkteam_group_message_under_two_bots_gives_two_keys(void **state)
{
    (void)state;
    wxg_batch_t *a = decode_sample("W2.json"), *b = decode_sample("W2_botB.json");
    const wxg_msg_view_t *ma = only(a), *mb = only(b);
    assert_true(ma->is_group);
    assert_string_equal(ma->conversation, "12345678901@chatroom");
    assert_string_equal(ma->sender, "wxid_fakebob00002");
    assert_string_equal(ma->key, "wxid_fakebot000001:n:5512345678901234567");
    assert_string_equal(mb->key, "wxid_fakebot000002:n:5512345678901234567");
    wxg_batch_free(a);
    wxg_batch_free(b);
}

static void wkteam_quote_keeps_its_xml_content_and_ignores_the_quoted_svrid(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("W3.json");
    const wxg_msg_view_t *m = only(b);
    assert_string_equal(m->msg_id, "6288900000000000026");
    assert_non_null(strstr(m->content, "<svrid>5893200000000000098</svrid>"));
    assert_non_null(strstr(m->content, "&lt;msgsource&gt;"));
    assert_string_equal(m->type, "60014");
    wxg_batch_free(b);
}

static void wkteam_self_message_is_flagged_and_keyed_like_any_other(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("W6.json");
    const wxg_msg_view_t *m = only(b);
    assert_true(m->is_self);
    assert_string_equal(m->conversation, "wxid_fakealice0001");
    assert_string_equal(m->key, "wxid_fakebot000001:n:2200000000000000007");
    wxg_batch_free(b);
}

static void wkteam_offline_notice_gets_a_fingerprint_over_its_data(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("W5.json");
    const wxg_msg_view_t *m = only(b);
    assert_int_equal(m->key_kind, WXG_KEY_FINGERPRINT);
    assert_null(m->msg_id);
    assert_string_equal(m->type, "30000");
    assert_string_equal(m->key_reason, "fingerprint: no data.newMsgId");
    /* The same notice after a re-login (new wId) is a different callback. */
    wxg_batch_t *c =
        decode_ok("{\"wcId\":\"wxid_fakebot000001\",\"messageType\":\"30000\","
                  "\"data\":{\"wId\":\"another-login\",\"reason\":\"session expired\"}}");
    assert_string_not_equal(only(c)->key, m->key);
    wxg_batch_free(b);
    wxg_batch_free(c);
}

/* ---- GeWe -------------------------------------------------------------------------------- */

static void gewe_private_text_unwraps_string_objects(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("G1.json");
    const wxg_msg_view_t *m = only(b);
    assert_int_equal(m->format, WXG_FORMAT_GEWE);
    assert_string_equal(m->account, "wxid_fakebot000001");
    assert_string_equal(m->sender, "wxid_fakealice0001");
    assert_string_equal(m->conversation, "wxid_fakealice0001");
    assert_string_equal(m->content, "晚上好 🌙");
    assert_string_equal(m->type, "AddMsg:1");
    assert_int_equal(m->create_time, 1705043418);
    assert_string_equal(m->key, "wxid_fakebot000001:n:7773700000000000001");
    wxg_batch_free(b);
}

static void gewe_group_text_takes_the_sender_from_the_content_prefix(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("G2.json");
    const wxg_msg_view_t *m = only(b);
    assert_true(m->is_group);
    assert_string_equal(m->conversation, "34700000001@chatroom");
    assert_string_equal(m->sender, "wxid_fakebob00002");
    assert_string_equal(m->content, "收到，谢谢 👍");
    wxg_batch_free(b);
}

static void gewe_short_revoke_id_is_a_valid_id(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("G3.json");
    assert_string_equal(only(b)->key, "wxid_fakebot000001:n:1968000003");
    assert_string_equal(only(b)->type, "AddMsg:10002");
    wxg_batch_free(b);
}

static void gewe_mod_contacts_keeps_nul_bytes_and_big_numbers_in_its_fingerprint(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("G5.json");
    const wxg_msg_view_t *m = only(b);
    assert_int_equal(m->key_kind, WXG_KEY_FINGERPRINT);
    assert_string_equal(m->type, "ModContacts");
    assert_string_equal(m->conversation, "34700000001@chatroom");
    /* A different byte after the \u0000 in Description changes the fingerprint. */
    size_t len;
    char *buf = read_sample("G5.json", &len);
    char *p = strstr(buf, "\\u0001@\\u0000");
    assert_non_null(p);
    p[5] = '2';
    wxg_batch_t *c = decode_ok_f(buf, len, WXG_FORMAT_AUTO);
    assert_string_not_equal(only(c)->key, m->key);
    /* So does SnsBgobjectId 14000000000000000001 -> ...002 (equal as doubles). */
    memcpy(buf, "", 0);
    free(buf);
    buf = read_sample("G5.json", &len);
    p = strstr(buf, "14000000000000000001");
    assert_non_null(p);
    p[19] = '2';
    wxg_batch_t *d = decode_ok_f(buf, len, WXG_FORMAT_AUTO);
    assert_string_not_equal(only(d)->key, m->key);
    free(buf);
    wxg_batch_free(b);
    wxg_batch_free(c);
    wxg_batch_free(d);
}

static void gewe_offline_without_data_still_decodes(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("G6.json");
    const wxg_msg_view_t *m = only(b);
    assert_string_equal(m->type, "Offline");
    assert_int_equal(m->key_kind, WXG_KEY_FINGERPRINT);
    assert_int_equal(m->content_len, 0);
    wxg_batch_free(b);
}

static void gewe_empty_wrapped_string_is_empty_content(void **state)
{
    (void)state;
    wxg_batch_t *b =
        decode_ok("{\"TypeName\":\"AddMsg\",\"Wxid\":\"bot\",\"Data\":{"
                  "\"NewMsgId\":5,\"Content\":{},\"FromUserName\":{\"string\":\"a\"}}}");
    assert_int_equal(only(b)->content_len, 0);
    assert_string_equal(only(b)->sender, "a");
    wxg_batch_free(b);
}

static void gewe_uses_appid_only_when_there_is_no_wxid(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_ok("{\"TypeName\":\"AddMsg\",\"Appid\":\"wx_app\",\"Data\":{"
                               "\"NewMsgId\":7773700000000000001}}");
    assert_string_equal(only(b)->key, "wx_app:n:7773700000000000001");
    assert_non_null(strstr(only(b)->key_reason, "Appid"));
    wxg_batch_free(b);
    b = decode_sample("G1.json");
    assert_string_equal(only(b)->account, "wxid_fakebot000001");
    wxg_batch_free(b);
    decode_err("{\"TypeName\":\"AddMsg\",\"Data\":{\"NewMsgId\":1}}", WXG_ENOACCOUNT);
}

static void sync_batch_gives_one_message_per_element(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("sync_batch.json");
    assert_int_equal(wxg_batch_count(b), 2);
    const wxg_msg_view_t *m0 = wxg_batch_msg(b, 0), *m1 = wxg_batch_msg(b, 1);
    assert_null(wxg_batch_msg(b, 2));
    assert_string_equal(m0->key, "wxid_fakebot000001:n:293000000000000001");
    assert_string_equal(m1->key, "wxid_fakebot000001:n:293000000000000002");
    assert_string_equal(m0->content, "在吗");
    assert_true(m1->is_group);
    assert_string_equal(m1->sender, "wxid_fakebob00002");
    assert_string_equal(m1->content, "在的");
    assert_string_equal(m0->type, "sync_message:1");
    /* raw is the element, not the whole record. */
    assert_int_equal(m0->raw[0], '{');
    assert_int_equal(m0->raw[m0->raw_len - 1], '}');
    assert_non_null(memchr(m0->raw, '1', m0->raw_len));
    assert_null(strstr(m0->raw, "MessageType") < m0->raw + m0->raw_len &&
                        strstr(m0->raw, "MessageType") != NULL
                    ? "found"
                    : NULL);
    wxg_batch_free(b);
}

static void sync_batch_edge_shapes(void **state)
{
    (void)state;
    wxg_batch_t *b =
        decode_ok("{\"MessageType\":\"sync_message\",\"Wxid\":\"bot\",\"Data\":{\"messages\":[]}}");
    assert_int_equal(wxg_batch_count(b), 0);
    assert_null(wxg_batch_msg(b, 0));
    wxg_batch_free(b);
    decode_err("{\"MessageType\":\"sync_message\",\"Wxid\":\"bot\",\"Data\":{\"messages\":[1]}}",
               WXG_EFORMAT);
    /* More elements than WXG_DECODE_MAX_MESSAGES: refused before any view is built. */
    size_t n = WXG_DECODE_MAX_MESSAGES + 1;
    char *big = malloc(n * 3 + 128);
    assert_non_null(big);
    size_t len = (size_t)snprintf(big, 128,
                                  "{\"MessageType\":\"sync_message\",\"Wxid\":\"bot\","
                                  "\"Data\":{\"messages\":[");
    for (size_t i = 0; i < n; i++) {
        memcpy(big + len, i ? ",{}" : "{}", i ? 3 : 2);
        len += i ? 3 : 2;
    }
    memcpy(big + len, "]}}", 3);
    len += 3;
    assert_non_null(strstr(decode_err_n(big, len, NULL, WXG_ETOOBIG), "messages"));
    /* Exactly at the limit it decodes. */
    memmove(big + len - 6, "]}}", 3);
    b = decode_ok_f(big, len - 3, WXG_FORMAT_AUTO);
    assert_int_equal(wxg_batch_count(b), WXG_DECODE_MAX_MESSAGES);
    wxg_batch_free(b);
    free(big);
    decode_err("{\"MessageType\":\"sync_message\",\"Wxid\":\"bot\",\"Data\":{\"messages\":{}}}",
               WXG_EFORMAT);
    decode_err("{\"MessageType\":\"sync_message\",\"Wxid\":\"bot\",\"Data\":{\"messages\":["
               "{\"newMsgId\":1},{\"newMsgId\":2,\"newMsgId\":3}]}}",
               WXG_EIDCONFLICT);
}

/* ---- Official Account -------------------------------------------------------------------- */

static void oa_xml_text_gets_the_message_tuple_key(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("O1.xml");
    const wxg_msg_view_t *m = only(b);
    assert_int_equal(m->format, WXG_FORMAT_OA_XML);
    assert_string_equal(m->account, "gh_fake00000001");
    assert_string_equal(m->sender, "oFAKE_openid_000000001");
    assert_string_equal(m->msg_id, "24500000000000001");
    assert_string_equal(m->type, "text");
    assert_string_equal(m->content, "你好，想咨询一下 🙂");
    assert_int_equal(m->create_time, 1732329909);
    assert_string_equal(m->key,
                        "gh_fake00000001:m:24500000000000001:oFAKE_openid_000000001:1732329909");
    wxg_batch_free(b);
}

static void oa_events_get_event_keys_and_job_ids(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("O2.xml");
    const wxg_msg_view_t *m = only(b);
    assert_int_equal(m->key_kind, WXG_KEY_OA_EVENT);
    assert_string_equal(m->type, "event:subscribe");
    assert_string_equal(m->content, "qrscene_123123");
    assert_null(m->msg_id);
    wxg_batch_free(b);
    b = decode_sample("O4.xml");
    m = only(b);
    assert_int_equal(m->key_kind, WXG_KEY_OA_EVENT);
    assert_string_equal(m->msg_id, "200163836");
    assert_string_equal(m->type, "event:TEMPLATESENDJOBFINISH");
    wxg_batch_free(b);
    /* LOCATION events five seconds apart are different events. */
    b = decode_sample("O3.xml");
    size_t len;
    char *buf = read_sample("O3.xml", &len);
    char *p = strstr(buf, "1732330005");
    p[9] = '9';
    wxg_batch_t *c = decode_ok_f(buf, len, WXG_FORMAT_AUTO);
    assert_string_not_equal(only(b)->key, only(c)->key);
    free(buf);
    wxg_batch_free(b);
    wxg_batch_free(c);
}

static void oa_msgid_and_msgID_are_one_field_other_cases_are_not_read(void **state)
{
    (void)state;
    const char *agree = "<xml><ToUserName>gh_a</ToUserName><FromUserName>o1</FromUserName>"
                        "<CreateTime>1</CreateTime><MsgType>text</MsgType><MsgId>7</MsgId>"
                        "<MsgID>7</MsgID></xml>";
    wxg_batch_t *b = decode_ok(agree);
    assert_string_equal(only(b)->key, "gh_a:m:7:o1:1");
    wxg_batch_free(b);
    decode_err("<xml><ToUserName>gh_a</ToUserName><MsgType>text</MsgType><MsgId>7</MsgId>"
               "<MsgID>8</MsgID></xml>",
               WXG_EIDCONFLICT);
    /* "msgid" is not MsgId. */
    b = decode_ok("{\"ToUserName\":\"gh_a\",\"FromUserName\":\"o1\",\"CreateTime\":1,"
                  "\"MsgType\":\"text\",\"msgid\":7}");
    assert_int_equal(only(b)->key_kind, WXG_KEY_FINGERPRINT);
    assert_null(only(b)->msg_id);
    wxg_batch_free(b);
    decode_err("<xml><ToUserName>gh_a</ToUserName><MsgId>7</MsgId><MsgId>8</MsgId></xml>",
               WXG_EIDCONFLICT);
}

static void oa_json_accepts_ids_as_numbers_or_strings(void **state)
{
    (void)state;
    wxg_batch_t *a = decode_sample("O6.json");
    wxg_batch_t *b =
        decode_ok("{\"ToUserName\":\"gh_fake00000001\",\"FromUserName\":"
                  "\"oFAKE_openid_000000001\",\"CreateTime\":\"1732329909\","
                  "\"MsgType\":\"text\",\"Content\":\"x\",\"MsgId\":\"24500000000000001\"}");
    assert_int_equal(only(a)->format, WXG_FORMAT_OA_JSON);
    assert_string_equal(only(a)->key, only(b)->key);
    wxg_batch_free(a);
    wxg_batch_free(b);
}

static void oa_encrypted_push_is_refused_with_a_reason(void **state)
{
    (void)state;
    size_t len;
    char *buf = read_sample("O5.xml", &len);
    const char *why = decode_err_n(buf, len, NULL, WXG_EFORMAT);
    assert_non_null(strstr(why, "encrypted"));
    free(buf);
}

static void oa_xml_declarations_and_entities_are_refused(void **state)
{
    (void)state;
    const char *xxe = "<?xml version=\"1.0\"?><!DOCTYPE xml [<!ENTITY x SYSTEM "
                      "\"file:///etc/passwd\">]><xml><ToUserName>gh_a</ToUserName>"
                      "<Content>&x;</Content></xml>";
    assert_non_null(strstr(decode_err(xxe, WXG_EPARSE), "DOCTYPE"));
    const char *laughs = "<!DOCTYPE xml [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;\">]>"
                         "<xml><ToUserName>gh_a</ToUserName><Content>&b;</Content></xml>";
    decode_err(laughs, WXG_EPARSE);
    /* An undeclared entity is malformed XML. */
    decode_err("<xml><ToUserName>gh_a</ToUserName><Content>&x;</Content></xml>", WXG_EPARSE);
    /* Declarations inside CDATA are just text. */
    wxg_batch_t *b = decode_ok("<xml><ToUserName>gh_a</ToUserName><FromUserName>o</FromUserName>"
                               "<CreateTime>1</CreateTime><MsgType>text</MsgType>"
                               "<Content><![CDATA[<!DOCTYPE x>]]></Content><MsgId>9</MsgId></xml>");
    assert_string_equal(only(b)->content, "<!DOCTYPE x>");
    wxg_batch_free(b);
}

static void oa_xml_errors_are_typed(void **state)
{
    (void)state;
    assert_non_null(strstr(decode_err("<xml><ToUserName>gh_a</xml>", WXG_EPARSE), "line"));
    decode_err("<msg><ToUserName>gh_a</ToUserName></msg>", WXG_EFORMAT);
    decode_err("<xml><FromUserName>o</FromUserName></xml>", WXG_ENOACCOUNT);
    decode_err("<xml><ToUserName></ToUserName></xml>", WXG_ENOACCOUNT);
}

/* ---- generic ----------------------------------------------------------------------------- */

static void generic_form_decodes_numbers_and_strings_alike(void **state)
{
    (void)state;
    wxg_batch_t *a = decode_sample("GEN1.json"), *b = decode_sample("GEN2.json");
    const wxg_msg_view_t *m = only(a);
    assert_int_equal(m->format, WXG_FORMAT_GENERIC);
    assert_string_equal(m->conversation, "12345678901@chatroom");
    assert_string_equal(m->sender, "wxid_fakebob00002");
    assert_true(m->is_group);
    assert_int_equal(m->create_time, 1748140300);
    assert_int_equal(only(b)->create_time, 1748140301);
    assert_string_equal(only(b)->key, "wxid_fakebot000001:n:9300000000000000002");
    wxg_batch_free(a);
    wxg_batch_free(b);
}

static void url_verification_probe_decodes_without_account(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("PROBE.json");
    const wxg_msg_view_t *m = only(b);
    assert_string_equal(m->account, "");
    assert_string_equal(m->type, "verify");
    assert_memory_equal(m->key, "~:h:", 4);
    wxg_batch_free(b);
    b = decode_ok("{\"wcId\":\"wxid_bot\",\"testMsg\":\"验证回调地址是否可用\"}");
    assert_string_equal(only(b)->account, "wxid_bot");
    wxg_batch_free(b);
}

/* ---- E1..E10 ----------------------------------------------------------------------------- */

static void e1_id_as_string_equals_id_as_number(void **state)
{
    (void)state;
    wxg_batch_t *a = decode_sample("E1.json"), *b = decode_sample("W1.json");
    assert_string_equal(only(a)->key, "wxid_fakebot000001:n:7301234567890123457");
    assert_string_equal(only(a)->key, only(b)->key);
    wxg_batch_free(a);
    wxg_batch_free(b);
}

static void e2_to_e5_non_ids_fall_back_to_distinct_fingerprints(void **state)
{
    (void)state;
    static const char *const files[] = {"E2.json", "E3.json", "E4.json", "E5.json"};
    static const char *const why[] = {"real number", "negative", "larger than 2^64-1", "null"};
    char keys[4][WXG_KEY_MAX];
    for (int i = 0; i < 4; i++) {
        wxg_batch_t *b = decode_sample(files[i]);
        const wxg_msg_view_t *m = only(b);
        assert_int_equal(m->key_kind, WXG_KEY_FINGERPRINT);
        assert_null(m->msg_id);
        if (strstr(m->key_reason, why[i]) == NULL)
            fail_msg("%s: reason '%s' does not say '%s'", files[i], m->key_reason, why[i]);
        snprintf(keys[i], sizeof keys[i], "%s", m->key);
        wxg_batch_free(b);
    }
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            assert_string_not_equal(keys[i], keys[j]);
}

static void e6_lone_surrogate_is_kept_as_bytes_not_a_failure(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("E6.json");
    const wxg_msg_view_t *m = only(b);
    assert_string_equal(m->key, "wxid_fakebot000001:n:1");
    assert_int_equal(m->content_len, 5);
    assert_memory_equal(m->content, "hi\xed\xa0\xbd", 5);
    assert_false(m->content_is_utf8);
    wxg_batch_free(b);
    /* A different lone surrogate is different content; a proper pair is 4-byte UTF-8. */
    b = decode_ok("{\"wcId\":\"b\",\"data\":{\"newMsgId\":1,\"content\":\"hi\\ud83e\"}}");
    assert_memory_equal(only(b)->content, "hi\xed\xa0\xbe", 5);
    wxg_batch_free(b);
    b = decode_ok("{\"wcId\":\"b\",\"data\":{\"newMsgId\":1,\"content\":\"\\ud83d\\ude00\"}}");
    assert_string_equal(only(b)->content, "😀");
    assert_true(only(b)->content_is_utf8);
    wxg_batch_free(b);
}

static void e7_nul_escape_keeps_the_whole_content(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("E7.json");
    const wxg_msg_view_t *m = only(b);
    assert_int_equal(m->content_len, 3);
    assert_memory_equal(m->content, "a\0b", 3);
    assert_int_equal(m->key_kind, WXG_KEY_FINGERPRINT);
    wxg_batch_t *c = decode_ok("{\"wcId\":\"wxid_fakebot000001\",\"messageType\":\"60001\","
                               "\"data\":{\"content\":\"a\\u0000c\"}}");
    assert_string_not_equal(only(c)->key, m->key);
    wxg_batch_free(b);
    wxg_batch_free(c);
}

static void e8_duplicate_ids_that_disagree_are_a_conflict(void **state)
{
    (void)state;
    size_t len;
    char *buf = read_sample("E8.json", &len);
    const char *why = decode_err_n(buf, len, NULL, WXG_EIDCONFLICT);
    assert_non_null(strstr(why, "data.newMsgId"));
    free(buf);
    wxg_batch_t *b = decode_sample("E8_agree.json");
    assert_string_equal(only(b)->key, "wxid_fakebot000001:n:7301234567890123457");
    wxg_batch_free(b);
    /* Other fields read twice must agree too; fields not read may repeat. */
    decode_err("{\"wcId\":\"a\",\"wcId\":\"b\",\"data\":{}}", WXG_EPARSE);
    b = decode_ok("{\"wcId\":\"a\",\"x\":1,\"x\":2,\"data\":{\"newMsgId\":3}}");
    wxg_batch_free(b);
}

static void e9_invalid_utf8_is_kept_and_flagged(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_sample("E9.json");
    const wxg_msg_view_t *m = only(b);
    assert_memory_equal(m->content, "bad \xff byte", 10);
    assert_false(m->content_is_utf8);
    assert_string_equal(m->key, "wxid_fakebot000001:n:7301234567890123459");
    wxg_batch_free(b);
}

static void e10_same_id_under_two_gewe_accounts_gives_two_keys(void **state)
{
    (void)state;
    wxg_batch_t *a = decode_sample("E10a.json"), *b = decode_sample("E10b.json");
    assert_string_equal(only(a)->key, "wxid_fakebot000001:n:7773700000000000001");
    assert_string_equal(only(b)->key, "wxid_fakebot000002:n:7773700000000000001");
    wxg_batch_free(a);
    wxg_batch_free(b);
}

/* ---- hostile input, caps, errors ------------------------------------------------------- */

static void hostile_accounts_never_appear_raw_in_keys(void **state)
{
    (void)state;
    static const char *const accts[] = {
        "wxid with spaces", "bot\\r\\nFLUSHALL", "bot*?[x]", "{tag}", "a:n:1", "\\u00ff\\u0001"};
    char doc[512];
    for (size_t i = 0; i < sizeof accts / sizeof accts[0]; i++) {
        snprintf(doc, sizeof doc, "{\"wcId\":\"%s\",\"data\":{\"newMsgId\":42}}", accts[i]);
        wxg_batch_t *b = decode_ok(doc);
        const wxg_msg_view_t *m = only(b);
        wxg_test_assert_key_safe(m->key, NULL);
        assert_int_equal(m->key[0], 'x');
        assert_int_equal(strlen(m->key), 65 + strlen(":n:42"));
        wxg_batch_free(b);
    }
    /* 100 KB account. */
    size_t big = 100 * 1024;
    char *s = malloc(big + 64);
    assert_non_null(s);
    size_t n = (size_t)snprintf(s, 64, "{\"wcId\":\"");
    memset(s + n, 'a', big);
    n += big;
    n += (size_t)snprintf(s + n, 64, "\",\"data\":{\"newMsgId\":42}}");
    wxg_batch_t *b = decode_ok_f(s, n, WXG_FORMAT_AUTO);
    wxg_test_assert_key_safe(only(b)->key, NULL);
    assert_true(strlen(only(b)->key) < WXG_KEY_MAX);
    wxg_batch_free(b);
    free(s);
    /* NUL inside an account would make the C string lie: refused. Empty: no account. */
    decode_err("{\"wcId\":\"bot\\u0000x\",\"data\":{\"newMsgId\":1}}", WXG_EPARSE);
    decode_err("{\"wcId\":\"\",\"data\":{\"newMsgId\":1}}", WXG_ENOACCOUNT);
    decode_err("{\"wcId\":7,\"data\":{\"newMsgId\":1}}", WXG_ENOACCOUNT);
    decode_err("{\"messageType\":\"60001\",\"data\":{\"newMsgId\":1}}", WXG_ENOACCOUNT);
}

static void hostile_ids_never_appear_raw_in_keys(void **state)
{
    (void)state;
    static const char *const ids[] = {"\"1 2\"",      "\"1\\r\\nFLUSHALL\"",
                                      "\"1*\"",       "\"[1]\"",
                                      "\"1\\u0000\"", "\"\"",
                                      "\"+1\"",       "\"0\"",
                                      "\"01\"",       "true",
                                      "{}",           "[1]"};
    char doc[512];
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        snprintf(doc, sizeof doc, "{\"wcId\":\"bot\",\"data\":{\"newMsgId\":%s}}", ids[i]);
        wxg_batch_t *b = decode_ok(doc);
        const wxg_msg_view_t *m = only(b);
        assert_int_equal(m->key_kind, WXG_KEY_FINGERPRINT);
        assert_null(m->msg_id);
        wxg_test_assert_key_safe(m->key, NULL);
        wxg_batch_free(b);
    }
    /* 100 KB of digits. */
    size_t big = 100 * 1024;
    char *s = malloc(big + 64);
    assert_non_null(s);
    size_t n = (size_t)snprintf(s, 64, "{\"wcId\":\"bot\",\"data\":{\"newMsgId\":");
    memset(s + n, '7', big);
    n += big;
    n += (size_t)snprintf(s + n, 64, "}}");
    wxg_batch_t *b = decode_ok_f(s, n, WXG_FORMAT_AUTO);
    assert_int_equal(only(b)->key_kind, WXG_KEY_FINGERPRINT);
    assert_non_null(strstr(only(b)->key_reason, "larger than 2^64-1"));
    wxg_test_assert_key_safe(only(b)->key, NULL);
    wxg_batch_free(b);
    free(s);
}

static void case_variants_of_id_fields_do_not_alias(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_ok("{\"wcId\":\"bot\",\"data\":{\"NewMsgId\":7301234567890123457}}");
    assert_int_equal(only(b)->key_kind, WXG_KEY_FINGERPRINT);
    wxg_batch_free(b);
    b = decode_ok("{\"TypeName\":\"AddMsg\",\"Wxid\":\"bot\",\"Data\":{\"newMsgId\":1}}");
    assert_int_equal(only(b)->key_kind, WXG_KEY_FINGERPRINT);
    wxg_batch_free(b);
}

static char *nested(size_t depth, char open, char close, const char *inner, size_t *len)
{
    size_t il = strlen(inner);
    char *s = malloc(2 * depth + il + 1);
    assert_non_null(s);
    memset(s, open, depth);
    memcpy(s + depth, inner, il);
    memset(s + depth + il, close, depth);
    *len = 2 * depth + il;
    s[*len] = '\0';
    return s;
}

static void depth_bombs_are_refused_with_edepth(void **state)
{
    (void)state;
    size_t len;
    char *s = nested(10000, '[', ']', "1", &len);
    assert_non_null(strstr(decode_err_n(s, len, NULL, WXG_EDEPTH), "32"));
    free(s);
    /* Objects: {"a":{"a":...}} */
    size_t depth = 10000;
    s = malloc(depth * 6 + 8);
    assert_non_null(s);
    len = 0;
    for (size_t i = 0; i < depth; i++) {
        memcpy(s + len, "{\"a\":", 5);
        len += 5;
    }
    s[len++] = '1';
    memset(s + len, '}', depth);
    len += depth;
    decode_err_n(s, len, NULL, WXG_EDEPTH);
    free(s);
    /* Unterminated bombs too: the cap is hit before the missing end. */
    s = nested(10000, '[', ']', "1", &len);
    decode_err_n(s, 10000, NULL, WXG_EDEPTH);
    free(s);
    /* XML. */
    char *x = malloc(10000 * 7 + 64);
    assert_non_null(x);
    len = (size_t)snprintf(x, 64, "<xml>");
    for (int i = 0; i < 10000; i++) {
        memcpy(x + len, "<a>", 3);
        len += 3;
    }
    decode_err_n(x, len, NULL, WXG_EDEPTH);
    free(x);
    /* The cap is configurable; within it the document decodes. */
    const char *three = "{\"wcId\":\"b\",\"data\":{\"x\":{\"y\":1},\"newMsgId\":5}}";
    wxg_decode_opts_t o = {.format = WXG_FORMAT_AUTO, .max_depth = 2};
    decode_err_n(three, strlen(three), &o, WXG_EDEPTH);
    o.max_depth = 3;
    wxg_batch_t *b = NULL;
    char err[256];
    assert_int_equal(wxg_decode(three, strlen(three), &o, &b, err, sizeof err), 0);
    wxg_batch_free(b);
}

static void oversized_records_are_refused_before_parsing(void **state)
{
    (void)state;
    size_t big = 10 * 1024 * 1024;
    char *s = malloc(big);
    assert_non_null(s);
    memset(s, '[', big); /* would also be a depth bomb: size is checked first */
    const char *why = decode_err_n(s, big, NULL, WXG_ETOOBIG);
    assert_non_null(strstr(why, "limit"));
    free(s);
    const char *w1 = "{\"wcId\":\"b\",\"data\":{\"newMsgId\":5}}";
    wxg_decode_opts_t o = {.format = WXG_FORMAT_AUTO, .max_bytes = 10};
    decode_err_n(w1, strlen(w1), &o, WXG_ETOOBIG);
    o.max_bytes = strlen(w1);
    wxg_batch_t *b = NULL;
    assert_int_equal(wxg_decode(w1, strlen(w1), &o, &b, NULL, 0), 0);
    wxg_batch_free(b);
}

static void malformed_json_is_eparse_with_a_position(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"wcId\":\"b\"",
        "{\"wcId\":\"b\"}x",
        "{\"wcId\":\"b\\q\"}",
        "{\"wcId\":\"b\\u12\"}",
        "{\"wcId\":01}",
        "{\"wcId\":1.}",
        "{\"wcId\":-}",
        "{\"wcId\":tru}",
        "{\"wcId\" \"b\"}",
        "{\"wcId\":\"b\",}",
        "{,}",
        "{\"a\":[1,]}",
        "{\"wcId\":\"unterminated",
        "{\"a\":NaN}",
        "{\"a\":1e}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *why = decode_err(bad[i], WXG_EPARSE);
        if (strstr(why, "byte") == NULL)
            fail_msg("'%s': reason '%s' gives no position", bad[i], why);
    }
    decode_err("", WXG_EPARSE);
    decode_err("  \n ", WXG_EPARSE);
    decode_err("hello", WXG_EPARSE);
    wxg_batch_t *b = (wxg_batch_t *)1;
    assert_int_equal(wxg_decode(NULL, 0, NULL, &b, NULL, 0), WXG_EPARSE);
    assert_null(b);
}

static void unknown_shapes_are_eformat(void **state)
{
    (void)state;
    decode_err("[1,2]", WXG_EFORMAT);
    decode_err("{}", WXG_EFORMAT);
    decode_err("{\"hello\":\"world\"}", WXG_EFORMAT);
    size_t len;
    char *buf = read_sample("wechaty.json", &len);
    decode_err_n(buf, len, NULL, WXG_EFORMAT);
    free(buf);
}

static void forcing_a_format_skips_detection(void **state)
{
    (void)state;
    size_t len;
    char *buf = read_sample("W1.json", &len);
    wxg_decode_opts_t o = {.format = WXG_FORMAT_WKTEAM};
    wxg_batch_t *b = NULL;
    assert_int_equal(wxg_decode(buf, len, &o, &b, NULL, 0), 0);
    assert_string_equal(only(b)->key, "wxid_fakebot000001:n:7301234567890123457");
    wxg_batch_free(b);
    o.format = WXG_FORMAT_OA_XML;
    decode_err_n(buf, len, &o, WXG_EPARSE);
    o.format = WXG_FORMAT_GEWE;
    decode_err_n(buf, len, &o, WXG_ENOACCOUNT);
    o.format = (wxg_format_t)99;
    decode_err_n(buf, len, &o, WXG_EINVAL);
    free(buf);
}

static void bom_and_whitespace_around_a_record_are_accepted(void **state)
{
    (void)state;
    wxg_batch_t *b = decode_ok("\xef\xbb\xbf \r\n{\"wcId\":\"b\",\"data\":{\"newMsgId\":5}}\n ");
    assert_string_equal(only(b)->key, "b:n:5");
    wxg_batch_free(b);
}

static void payload_hash_ignores_layout_but_not_content(void **state)
{
    (void)state;
    wxg_batch_t *a = decode_ok("{\"wcId\":\"b\",\"data\":{\"newMsgId\":5,\"content\":\"你好\","
                               "\"timestamp\":10,\"wId\":\"login-1\"}}");
    wxg_batch_t *b =
        decode_ok("{ \"data\" : { \"wId\":\"login-2\", \"content\" : \"\\u4f60\\u597d\","
                  " \"newMsgId\" : \"5\", \"timestamp\":10 }, \"wcId\" : \"b\" }");
    wxg_batch_t *c = decode_ok("{\"wcId\":\"b\",\"data\":{\"newMsgId\":5,\"content\":\"你好!\","
                               "\"timestamp\":10}}");
    assert_string_equal(only(a)->key, only(b)->key);
    assert_memory_equal(only(a)->payload_hash, only(b)->payload_hash, 32);
    assert_string_equal(only(a)->key, only(c)->key);
    assert_memory_not_equal(only(a)->payload_hash, only(c)->payload_hash, 32);
    wxg_batch_free(a);
    wxg_batch_free(b);
    wxg_batch_free(c);
}

static void fingerprints_ignore_escaping_and_member_order(void **state)
{
    (void)state;
    wxg_batch_t *a = decode_ok("{\"wcId\":\"b\",\"messageType\":\"30000\",\"data\":"
                               "{\"wId\":\"w\",\"reason\":\"你\"}}");
    wxg_batch_t *b = decode_ok("{\"messageType\":\"30000\",\"wcId\":\"b\",\"data\":"
                               "{ \"reason\" : \"\\u4f60\", \"wId\" : \"w\" }}");
    assert_int_equal(only(a)->key_kind, WXG_KEY_FINGERPRINT);
    assert_string_equal(only(a)->key, only(b)->key);
    wxg_batch_free(a);
    wxg_batch_free(b);
}

static void format_names_round_trip(void **state)
{
    (void)state;
    for (int f = WXG_FORMAT_AUTO; f <= WXG_FORMAT_GENERIC; f++) {
        wxg_format_t out;
        assert_int_equal(wxg_format_parse(wxg_format_name((wxg_format_t)f), &out), 0);
        assert_int_equal(out, f);
    }
    wxg_format_t out;
    assert_int_equal(wxg_format_parse("WKTEAM", &out), WXG_EINVAL);
    assert_int_equal(wxg_format_parse(NULL, &out), WXG_EINVAL);
    assert_string_equal(wxg_format_name((wxg_format_t)42), "unknown");
    assert_string_equal(wxg_format_name(WXG_FORMAT_OA_XML), "oa-xml");
}

static void bad_arguments_are_einval(void **state)
{
    (void)state;
    char err[64];
    assert_int_equal(wxg_decode("{}", 2, NULL, NULL, err, sizeof err), WXG_EINVAL);
    wxg_batch_t *b = NULL;
    assert_int_equal(wxg_decode(NULL, 5, NULL, &b, err, sizeof err), WXG_EINVAL);
    assert_int_equal(wxg_batch_count(NULL), 0);
    assert_null(wxg_batch_msg(NULL, 0));
    wxg_batch_free(NULL);
}

/* Many threads decode the same samples at once and get the same keys (run under TSan too). */
typedef struct thr {
    const char *buf;
    size_t len;
    char key[WXG_KEY_MAX];
    int mismatches;
} thr;

static void *decode_loop(void *arg)
{
    thr *t = arg;
    for (int i = 0; i < 200; i++) {
        wxg_batch_t *b = NULL;
        if (wxg_decode(t->buf, t->len, NULL, &b, NULL, 0) != 0 ||
            strcmp(wxg_batch_msg(b, 0)->key, t->key) != 0)
            t->mismatches++;
        wxg_batch_free(b);
    }
    return NULL;
}

static void concurrent_decodes_agree(void **state)
{
    (void)state;
    static const char *const files[] = {"W1.json", "O1.xml", "G5.json", "O2.xml"};
    thr t[4];
    pthread_t th[4];
    char *bufs[4];
    for (int i = 0; i < 4; i++) {
        bufs[i] = read_sample(files[i], &t[i].len);
        t[i].buf = bufs[i];
        t[i].mismatches = 0;
        wxg_batch_t *b = decode_ok_f(t[i].buf, t[i].len, WXG_FORMAT_AUTO);
        snprintf(t[i].key, sizeof t[i].key, "%s", wxg_batch_msg(b, 0)->key);
        wxg_batch_free(b);
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, decode_loop, &t[i]), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].mismatches, 0);
        free(bufs[i]);
    }
}

/* A decode cache changes where a batch's memory comes from, never what it holds: every view
 * equals the one decoded without a cache, while batches are freed out of order, after decode
 * errors, and for a record too big for the cached sizes. */
static void a_decode_cache_gives_the_same_views(void **state)
{
    (void)state;
    static const char *const files[] = {"W1.json",   "O1.xml",  "G5.json", "O2.xml",
                                        "GEN1.json", "E1.json", "O6.json"};
    enum { NFILES = sizeof files / sizeof files[0], RING = 5, ROUNDS = 60 };
    char *bufs[NFILES];
    size_t lens[NFILES];
    wxg_batch_t *plain[NFILES];
    for (size_t i = 0; i < NFILES; i++) {
        bufs[i] = read_sample(files[i], &lens[i]);
        plain[i] = decode_ok_f(bufs[i], lens[i], WXG_FORMAT_AUTO);
    }
    wxg_decode_cache_t *cache = wxg_decode_cache_new(0);
    assert_non_null(cache);
    wxg_decode_opts_t o = {.format = WXG_FORMAT_AUTO, .cache = cache};
    wxg_batch_t *ring[RING] = {NULL};
    char err[256];
    for (size_t n = 0; n < ROUNDS; n++) {
        size_t f = n % NFILES, slot = (n * 3) % RING;
        wxg_batch_free(ring[slot]);
        ring[slot] = NULL;
        if (n % 7 == 3) {
            /* A record that fails keeps nothing and gives its memory back. */
            wxg_batch_t *bad = NULL;
            assert_int_equal(wxg_decode("{\"a\":", 5, &o, &bad, err, sizeof err), WXG_EPARSE);
            assert_null(bad);
        }
        assert_int_equal(wxg_decode(bufs[f], lens[f], &o, &ring[slot], err, sizeof err), 0);
        assert_int_equal(wxg_batch_count(ring[slot]), wxg_batch_count(plain[f]));
        for (size_t i = 0; i < wxg_batch_count(plain[f]); i++) {
            const wxg_msg_view_t *a = wxg_batch_msg(plain[f], i), *b = wxg_batch_msg(ring[slot], i);
            assert_string_equal(a->key, b->key);
            assert_string_equal(a->key_reason, b->key_reason);
            assert_string_equal(a->account, b->account);
            assert_int_equal(a->content_len, b->content_len);
            assert_memory_equal(a->content, b->content, a->content_len);
            assert_memory_equal(a->payload_hash, b->payload_hash, sizeof a->payload_hash);
        }
    }
    for (size_t i = 0; i < RING; i++)
        wxg_batch_free(ring[i]);

    /* Larger than any cached chunk size: the batch takes ordinary chunks and still frees them. */
    size_t big = 20000;
    char *rec = malloc(big + 200);
    assert_non_null(rec);
    int head = snprintf(rec, 200,
                        "{\"account\":\"wxid_bot\",\"msg_id\":\"42\",\"conversation\":\"c\","
                        "\"sender\":\"s\",\"create_time\":1700000000,\"type\":\"text\","
                        "\"content\":\"");
    memset(rec + head, 'x', big);
    memcpy(rec + head + big, "\"}", 2);
    wxg_batch_t *b = NULL;
    o.format = WXG_FORMAT_GENERIC;
    assert_int_equal(wxg_decode(rec, (size_t)head + big + 2, &o, &b, err, sizeof err), 0);
    assert_int_equal(wxg_batch_msg(b, 0)->content_len, big);
    wxg_batch_free(b);
    free(rec);

    assert_true(CACHE_KEEPS ? wxg_decode_cache_bytes(cache) > 0
                            : wxg_decode_cache_bytes(cache) == 0);
    assert_true(wxg_decode_cache_bytes(cache) <= 64 * 1024);
    wxg_decode_cache_free(cache);
    for (size_t i = 0; i < NFILES; i++) {
        wxg_batch_free(plain[i]);
        free(bufs[i]);
    }
}

/* The budget covers every chunk size together: batches of many sizes freed at once leave no
 * more than the budget kept, and what is kept is used again. */
static void a_decode_cache_keeps_no_more_than_its_budget(void **state)
{
    (void)state;
    enum { N = 120 };
    wxg_decode_cache_t *cache = wxg_decode_cache_new(64 * 1024);
    assert_non_null(cache);
    wxg_decode_opts_t o = {.format = WXG_FORMAT_GENERIC, .cache = cache};
    static wxg_batch_t *b[N];
    static char rec[8192];
    char err[256];
    size_t prev = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            /* Contents of 10 to about 1,800 bytes: chunks of many sizes. */
            size_t clen = 10 + (size_t)(i * 15);
            int head = snprintf(rec, sizeof rec,
                                "{\"account\":\"wxid_bot\",\"msg_id\":\"%d\",\"conversation\":"
                                "\"c\",\"sender\":\"s\",\"create_time\":1700000000,"
                                "\"type\":\"text\",\"content\":\"",
                                i + 1);
            memset(rec + head, 'y', clen);
            memcpy(rec + head + clen, "\"}", 2);
            assert_int_equal(wxg_decode(rec, (size_t)head + clen + 2, &o, &b[i], err, sizeof err),
                             0);
        }
        size_t before = wxg_decode_cache_bytes(cache);
        for (int i = 0; i < N; i++)
            wxg_batch_free(b[i]);
        size_t kept = wxg_decode_cache_bytes(cache);
        assert_true(kept <= 64 * 1024);
        if (CACHE_KEEPS) {
            assert_true(kept > before);
            /* The second round's decodes took their chunks from what the first kept. */
            if (round == 1)
                assert_true(before < prev);
        } else {
            assert_int_equal(kept, 0);
        }
        prev = kept;
    }
    wxg_decode_cache_free(cache);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_sample_gives_the_key_in_the_manifest),
        cmocka_unit_test(every_sample_file_is_listed_in_the_manifest),
        cmocka_unit_test(wkteam_private_text_decodes_every_field),
        cmocka_unit_test(wkteam_ids_that_collide_as_doubles_stay_apart),
        cmocka_unit_test(wkteam_group_message_under_two_bots_gives_two_keys),
        cmocka_unit_test(wkteam_quote_keeps_its_xml_content_and_ignores_the_quoted_svrid),
        cmocka_unit_test(wkteam_self_message_is_flagged_and_keyed_like_any_other),
        cmocka_unit_test(wkteam_offline_notice_gets_a_fingerprint_over_its_data),
        cmocka_unit_test(gewe_private_text_unwraps_string_objects),
        cmocka_unit_test(gewe_group_text_takes_the_sender_from_the_content_prefix),
        cmocka_unit_test(gewe_short_revoke_id_is_a_valid_id),
        cmocka_unit_test(gewe_mod_contacts_keeps_nul_bytes_and_big_numbers_in_its_fingerprint),
        cmocka_unit_test(gewe_offline_without_data_still_decodes),
        cmocka_unit_test(gewe_empty_wrapped_string_is_empty_content),
        cmocka_unit_test(gewe_uses_appid_only_when_there_is_no_wxid),
        cmocka_unit_test(sync_batch_gives_one_message_per_element),
        cmocka_unit_test(sync_batch_edge_shapes),
        cmocka_unit_test(oa_xml_text_gets_the_message_tuple_key),
        cmocka_unit_test(oa_events_get_event_keys_and_job_ids),
        cmocka_unit_test(oa_msgid_and_msgID_are_one_field_other_cases_are_not_read),
        cmocka_unit_test(oa_json_accepts_ids_as_numbers_or_strings),
        cmocka_unit_test(oa_encrypted_push_is_refused_with_a_reason),
        cmocka_unit_test(oa_xml_declarations_and_entities_are_refused),
        cmocka_unit_test(oa_xml_errors_are_typed),
        cmocka_unit_test(generic_form_decodes_numbers_and_strings_alike),
        cmocka_unit_test(url_verification_probe_decodes_without_account),
        cmocka_unit_test(e1_id_as_string_equals_id_as_number),
        cmocka_unit_test(e2_to_e5_non_ids_fall_back_to_distinct_fingerprints),
        cmocka_unit_test(e6_lone_surrogate_is_kept_as_bytes_not_a_failure),
        cmocka_unit_test(e7_nul_escape_keeps_the_whole_content),
        cmocka_unit_test(e8_duplicate_ids_that_disagree_are_a_conflict),
        cmocka_unit_test(e9_invalid_utf8_is_kept_and_flagged),
        cmocka_unit_test(e10_same_id_under_two_gewe_accounts_gives_two_keys),
        cmocka_unit_test(hostile_accounts_never_appear_raw_in_keys),
        cmocka_unit_test(hostile_ids_never_appear_raw_in_keys),
        cmocka_unit_test(case_variants_of_id_fields_do_not_alias),
        cmocka_unit_test(depth_bombs_are_refused_with_edepth),
        cmocka_unit_test(oversized_records_are_refused_before_parsing),
        cmocka_unit_test(malformed_json_is_eparse_with_a_position),
        cmocka_unit_test(unknown_shapes_are_eformat),
        cmocka_unit_test(forcing_a_format_skips_detection),
        cmocka_unit_test(bom_and_whitespace_around_a_record_are_accepted),
        cmocka_unit_test(payload_hash_ignores_layout_but_not_content),
        cmocka_unit_test(fingerprints_ignore_escaping_and_member_order),
        cmocka_unit_test(format_names_round_trip),
        cmocka_unit_test(bad_arguments_are_einval),
        cmocka_unit_test(concurrent_decodes_agree),
        cmocka_unit_test(a_decode_cache_gives_the_same_views),
        cmocka_unit_test(a_decode_cache_keeps_no_more_than_its_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
