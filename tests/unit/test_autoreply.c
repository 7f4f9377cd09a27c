/* Unit tests for lib/plugins/autoreply.c: the rule grammar (kinds, scopes, escapes, ordering),
 * errors that name the offending key, matching against message views, the reply command's
 * JSON, and the plugin's behaviour through the registry when it has no producer. Producing to
 * a real broker is covered by tests/integration/test_plugins_pg.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_int.h"
#include "wxguard/conf.h"
#include "wxguard/err.h"
#include "wxguard/plugin_registry.h"

typedef struct msgbuf {
    wxg_msg_view_t v;
} msgbuf;

static void make_msg(msgbuf *m, const char *account, int is_group, const char *content)
{
    memset(m, 0, sizeof *m);
    m->v.format = WXG_FORMAT_GENERIC;
    m->v.account = account;
    m->v.conversation = is_group ? "room_1@chatroom" : "wxid_peer";
    m->v.sender = "wxid_peer";
    m->v.msg_id = "7301234567890123457";
    m->v.type = "text";
    m->v.content = content;
    m->v.content_len = strlen(content);
    m->v.is_group = is_group;
    m->v.key = "wxid_bot1:n:7301234567890123457";
    m->v.key_kind = WXG_KEY_SERVER_ID;
}

/* Parses rules given as alternating key/value strings; returns the rc, *out on success. */
static int parse(wxg__ar_rules_t **out, char *err, size_t errsz, size_t n, const char *const *kv)
{
    const char *keys[16], *vals[16];
    for (size_t i = 0; i < n; i++) {
        keys[i] = kv[2 * i];
        vals[i] = kv[2 * i + 1];
    }
    wxg_plugin_conf_t conf = {.abi_version = WXG_PLUGIN_ABI_VERSION,
                              .plugin_name = "autoreply",
                              .count = n,
                              .keys = keys,
                              .values = vals};
    err[0] = '\0';
    return wxg__ar_rules_parse(&conf, out, err, errsz);
}

static const char *match(const wxg__ar_rules_t *r, const char *account, int group,
                         const char *content, long *no)
{
    msgbuf m;
    make_msg(&m, account, group, content);
    return wxg__ar_rules_match(r, &m.v, no);
}

static void test_keyword_matches_whole_message_ignoring_surrounding_blanks(void **st)
{
    (void)st;
    const char *kv[] = {"rule.1", "keyword:你好 -> 你好！有什么可以帮您？"};
    wxg__ar_rules_t *r = NULL;
    char err[256];
    assert_int_equal(parse(&r, err, sizeof err, 1, kv), 0);
    assert_int_equal(wxg__ar_rules_count(r), 1);
    long no = 0;
    assert_string_equal(match(r, "wxid_bot1", 0, "你好", &no), "你好！有什么可以帮您？");
    assert_int_equal(no, 1);
    assert_non_null(match(r, "wxid_bot1", 0, "  你好\r\n", NULL));
    assert_null(match(r, "wxid_bot1", 0, "你好吗", NULL));
    assert_null(match(r, "wxid_bot1", 0, "说你好", NULL));
    assert_null(match(r, "wxid_bot1", 0, "", NULL));
    wxg__ar_rules_free(r);
}

static void test_contains_and_regex_kinds_match_inside_the_message(void **st)
{
    (void)st;
    const char *kv[] = {"rule.1", "contains:价格 -> 见公告",
                        "rule.2", "regex:^order [0-9]+$ -> 查询中",
                        "rule.3", "iregex:^(help|帮助)$ -> 帮助信息"};
    wxg__ar_rules_t *r = NULL;
    char err[256];
    assert_int_equal(parse(&r, err, sizeof err, 3, kv), 0);
    long no = 0;
    assert_string_equal(match(r, "a", 1, "请问价格多少", &no), "见公告");
    assert_int_equal(no, 1);
    assert_string_equal(match(r, "a", 1, "order 42", &no), "查询中");
    assert_int_equal(no, 2);
    assert_null(match(r, "a", 1, "order 42x", NULL));
    assert_string_equal(match(r, "a", 1, "HeLp", &no), "帮助信息");
    assert_int_equal(no, 3);
    assert_null(match(r, "a", 1, "helpme", NULL));
    wxg__ar_rules_free(r);
}

static void test_scopes_restrict_account_and_chat_kind(void **st)
{
    (void)st;
    const char *kv[] = {"rule.1", "account=wxid_bot1 chat=group keyword:hi -> group hi from bot1",
                        "rule.2", "chat=private keyword:hi -> private hi",
                        "rule.3", "account=* chat=any keyword:hi -> anyone hi"};
    wxg__ar_rules_t *r = NULL;
    char err[256];
    assert_int_equal(parse(&r, err, sizeof err, 3, kv), 0);
    assert_string_equal(match(r, "wxid_bot1", 1, "hi", NULL), "group hi from bot1");
    assert_string_equal(match(r, "wxid_bot2", 1, "hi", NULL), "anyone hi");
    assert_string_equal(match(r, "wxid_bot1", 0, "hi", NULL), "private hi");
    assert_string_equal(match(r, "wxid_bot2", 0, "hi", NULL), "private hi");
    wxg__ar_rules_free(r);
}

static void test_rules_are_tried_in_number_order_not_file_order(void **st)
{
    (void)st;
    const char *kv[] = {"rule.20",  "contains:a -> twenty", "rule.3", "contains:a -> three",
                        "rule.100", "contains:b -> hundred"};
    wxg__ar_rules_t *r = NULL;
    char err[256];
    assert_int_equal(parse(&r, err, sizeof err, 3, kv), 0);
    long no = 0;
    assert_string_equal(match(r, "x", 0, "ab", &no), "three");
    assert_int_equal(no, 3);
    assert_string_equal(match(r, "x", 0, "b", &no), "hundred");
    assert_int_equal(no, 100);
    wxg__ar_rules_free(r);
}

static void test_reply_escapes_and_arrow_inside_reply(void **st)
{
    (void)st;
    const char *kv[] = {"rule.1", "keyword:menu -> 1. 价格\\n2. 帮助\\t-> more \\\\ end"};
    wxg__ar_rules_t *r = NULL;
    char err[256];
    assert_int_equal(parse(&r, err, sizeof err, 1, kv), 0);
    assert_string_equal(match(r, "x", 0, "menu", NULL), "1. 价格\n2. 帮助\t-> more \\ end");
    wxg__ar_rules_free(r);
}

/* Each bad rule is refused with the key's full name and a reason. */
static void test_bad_rules_are_refused_naming_the_key(void **st)
{
    (void)st;
    static const struct {
        const char *value;
        const char *why;
    } bad[] = {
        {"keyword:hi", "' -> '"},
        {"hi -> there", "kind"},
        {"fuzzy:hi -> there", "unknown match kind"},
        {"keyword: -> there", "pattern is empty"},
        {"keyword:hi -> ", "reply is empty"},
        {"regex:([a-z -> there", "does not compile"},
        {"chat=channel keyword:hi -> x", "chat=channel"},
        {"account= keyword:hi -> x", "account="},
        {"keyword:hi -> bad \\q escape", "unknown escape"},
        {"keyword:hi -> trailing \\", "unknown escape"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *kv[] = {"rule.7", bad[i].value};
        wxg__ar_rules_t *r = NULL;
        char err[256];
        assert_int_equal(parse(&r, err, sizeof err, 1, kv), WXG_ECONFIG);
        assert_null(r);
        assert_non_null(strstr(err, "plugin.autoreply.rule.7"));
        if (!strstr(err, bad[i].why))
            fail_msg("rule '%s': error '%s' lacks '%s'", bad[i].value, err, bad[i].why);
    }
}

static void test_reply_command_json_has_the_gateway_fields(void **st)
{
    (void)st;
    msgbuf m;
    make_msg(&m, "wxid_bot1", 1, "你好");
    char *json = wxg__ar_reply_json(&m.v, m.v.key, "hi \"there\"");
    assert_non_null(json);
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "account")->valuestring, "wxid_bot1");
    assert_string_equal(cJSON_GetObjectItem(o, "to")->valuestring, "room_1@chatroom");
    assert_string_equal(cJSON_GetObjectItem(o, "content")->valuestring, "hi \"there\"");
    /* The id stays an exact string (never a double). */
    assert_string_equal(cJSON_GetObjectItem(o, "in_reply_to")->valuestring, "7301234567890123457");
    assert_string_equal(cJSON_GetObjectItem(o, "key")->valuestring, m.v.key);
    cJSON_Delete(o);
    free(json);

    m.v.msg_id = NULL;
    json = wxg__ar_reply_json(&m.v, m.v.key, "x");
    o = cJSON_Parse(json);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "in_reply_to")));
    cJSON_Delete(o);
    free(json);
}

/* ----- through the registry ----- */

static int chain_for(wxg_plugin_chain_t **chain, const wxg_plugin_kv_t *kv, size_t n, char *err,
                     size_t errsz)
{
    return wxg_plugin_chain_new("autoreply", kv, n, chain, err, errsz);
}

static void test_init_requires_topic_and_refuses_unknown_keys(void **st)
{
    (void)st;
    char err[512];
    wxg_plugin_chain_t *chain = NULL;
    wxg_plugin_kv_t no_topic[] = {{"plugin.autoreply.rule.1", "keyword:a -> b"}};
    assert_int_equal(chain_for(&chain, no_topic, 1, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.autoreply.topic"));
    wxg_plugin_kv_t unknown[] = {{"plugin.autoreply.topic", "out"},
                                 {"plugin.autoreply.rules.1", "keyword:a -> b"}};
    assert_int_equal(chain_for(&chain, unknown, 2, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.autoreply.rules.1"));
    wxg_plugin_kv_t zero[] = {{"plugin.autoreply.topic", "out"},
                              {"plugin.autoreply.rule.01", "keyword:a -> b"}};
    assert_int_equal(chain_for(&chain, zero, 2, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.autoreply.rule.01"));
    assert_null(chain);
}

/* A matching message without a producer is a RETRY (the reply must not be lost); a message
 * that matches nothing, or the bot's own message, is OK without producing anything. */
static void test_handle_retries_when_reply_cannot_be_produced_and_skips_others(void **st)
{
    (void)st;
    char err[512];
    wxg_plugin_chain_t *chain = NULL;
    wxg_plugin_kv_t kv[] = {{"plugin.autoreply.topic", "outbound"},
                            {"plugin.autoreply.rule.1", "keyword:hi -> hello"}};
    assert_int_equal(chain_for(&chain, kv, 2, err, sizeof err), 0);
    wxg_plugin_thread_t *thr = NULL;
    assert_int_equal(wxg_plugin_thread_new(chain, &thr, err, sizeof err), 0);
    msgbuf m;
    wxg_plugin_call_t call;

    make_msg(&m, "wxid_bot1", 0, "hi");
    wxg_plugin_call_init(&call);
    call.fence = 1;
    call.attempt = 1;
    assert_int_equal(wxg_plugin_chain_handle(chain, thr, 0, &m.v, &call), WXG_PLUGIN_RETRY);
    assert_non_null(strstr(call.reason, "ESTATE"));
    assert_int_equal(call.produce_count, 0);

    make_msg(&m, "wxid_bot1", 0, "nothing to see");
    wxg_plugin_call_init(&call);
    call.fence = 1;
    assert_int_equal(wxg_plugin_chain_handle(chain, thr, 0, &m.v, &call), WXG_PLUGIN_OK);
    assert_int_equal(call.has_result, 0);

    make_msg(&m, "wxid_bot1", 0, "hi");
    m.v.is_self = 1;
    wxg_plugin_call_init(&call);
    call.fence = 1;
    assert_int_equal(wxg_plugin_chain_handle(chain, thr, 0, &m.v, &call), WXG_PLUGIN_OK);
    assert_int_equal(call.produce_error, 0);

    wxg_plugin_thread_destroy(thr);
    wxg_plugin_chain_destroy(chain);
}

/* The rules as an operator writes them in the properties file, read by the configuration
 * loader and handed over the way the consumer does (plugin map, prefix put back). */
static void test_rules_from_a_properties_file_reach_the_plugin_intact(void **st)
{
    (void)st;
    static const char text[] =
        "# replies\n"
        "plugin.autoreply.topic = wechat-outbound\n"
        "plugin.autoreply.rule.10 = keyword:你好 -> 你好！有什么可以帮您？\n"
        "plugin.autoreply.rule.2 = chat=group regex:^(price|价格)=?$ -> a=b #1 \\n done\n";
    char err[512];
    wxg_conf_t *conf = wxg_conf_new(WXG_PROG_CONSUMER, err, sizeof err);
    assert_non_null(conf);
    assert_int_equal(
        wxg_conf_load_string(conf, text, strlen(text), "test.properties", err, sizeof err), 0);
    wxg_conf_map_t *map = wxg_conf_plugin_map(conf, "autoreply");
    assert_non_null(map);
    wxg_plugin_kv_t kv[8];
    char keys[8][64];
    assert_true(map->count <= 8);
    for (size_t i = 0; i < map->count; i++) {
        snprintf(keys[i], sizeof keys[i], "plugin.autoreply.%s", map->items[i].key);
        kv[i] = (wxg_plugin_kv_t){keys[i], map->items[i].value};
    }
    wxg_plugin_chain_t *chain = NULL;
    assert_int_equal(wxg_plugin_chain_new("autoreply", kv, map->count, &chain, err, sizeof err), 0);

    /* The same values parsed directly give the same answers. */
    const char *direct[] = {"rule.10", wxg_conf_get(conf, "plugin.autoreply.rule.10"), "rule.2",
                            wxg_conf_get(conf, "plugin.autoreply.rule.2")};
    wxg__ar_rules_t *r = NULL;
    assert_int_equal(parse(&r, err, sizeof err, 2, direct), 0);
    assert_string_equal(match(r, "wxid_bot1", 0, "你好", NULL), "你好！有什么可以帮您？");
    assert_string_equal(match(r, "wxid_bot1", 1, "价格=", NULL), "a=b #1 \n done");
    assert_null(match(r, "wxid_bot1", 0, "价格", NULL));
    wxg__ar_rules_free(r);
    wxg_plugin_chain_destroy(chain);
    wxg_conf_map_free(map);
    wxg_conf_free(conf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyword_matches_whole_message_ignoring_surrounding_blanks),
        cmocka_unit_test(test_contains_and_regex_kinds_match_inside_the_message),
        cmocka_unit_test(test_scopes_restrict_account_and_chat_kind),
        cmocka_unit_test(test_rules_are_tried_in_number_order_not_file_order),
        cmocka_unit_test(test_reply_escapes_and_arrow_inside_reply),
        cmocka_unit_test(test_bad_rules_are_refused_naming_the_key),
        cmocka_unit_test(test_reply_command_json_has_the_gateway_fields),
        cmocka_unit_test(test_init_requires_topic_and_refuses_unknown_keys),
        cmocka_unit_test(test_handle_retries_when_reply_cannot_be_produced_and_skips_others),
        cmocka_unit_test(test_rules_from_a_properties_file_reach_the_plugin_intact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
