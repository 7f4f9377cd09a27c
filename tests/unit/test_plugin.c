/* Unit tests for lib/plugin.c and the built-in plugins: the registry, chain order and
 * configuration, loading external plugins by path (and refusing broken ones), the fail plugin's
 * behaviours and the record plugin's ledger lines, also with several processes appending. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testenv.h"
#include "wxguard/conf.h"
#include "wxguard/err.h"
#include "wxguard/plugin_registry.h"

/* ----- helpers ----- */

typedef struct msgbuf {
    wxg_msg_view_t v;
    char key[128];
    char msg_id[32];
} msgbuf;

static void make_msg(msgbuf *m, const char *account, const char *id, const char *content,
                     size_t content_len)
{
    memset(m, 0, sizeof *m);
    snprintf(m->msg_id, sizeof m->msg_id, "%s", id ? id : "");
    snprintf(m->key, sizeof m->key, "%s:n:%s", account, id ? id : "none");
    m->v.format = WXG_FORMAT_GENERIC;
    m->v.account = account;
    m->v.conversation = "room_1@chatroom";
    m->v.sender = "wxid_sender";
    m->v.msg_id = id ? m->msg_id : NULL;
    m->v.create_time = 1700000000;
    m->v.type = "text";
    m->v.content = content;
    m->v.content_len = content_len;
    m->v.is_group = 1;
    m->v.key = m->key;
    m->v.key_kind = WXG_KEY_SERVER_ID;
    for (int i = 0; i < 32; i++)
        m->v.payload_hash[i] = (unsigned char)(i * 7);
}

static void call_for(wxg_plugin_call_t *c, uint64_t fence, uint32_t attempt)
{
    wxg_plugin_call_init(c);
    c->fence = fence;
    c->attempt = attempt;
    c->topic = "callbacks";
    c->partition = 3;
    c->offset = 12345;
}

/* Builds a chain from spec and conf or fails the test with the error text. */
static wxg_plugin_chain_t *chain_ok(const char *spec, const wxg_plugin_kv_t *conf, size_t n)
{
    wxg_plugin_chain_t *chain = NULL;
    char err[1024] = "";
    int rc = wxg_plugin_chain_new(spec, conf, n, &chain, err, sizeof err);
    if (rc != 0)
        fail_msg("chain '%s' refused: %s (%s)", spec, err, wxg_err_name(rc));
    return chain;
}

/* Runs plugin i of a one-thread chain for one message. */
static wxg_plugin_result_t run1(wxg_plugin_chain_t *chain, size_t i, const msgbuf *m,
                                wxg_plugin_call_t *call)
{
    wxg_plugin_thread_t *thr = NULL;
    char err[256];
    assert_int_equal(wxg_plugin_thread_new(chain, &thr, err, sizeof err), 0);
    wxg_plugin_result_t r = wxg_plugin_chain_handle(chain, thr, i, &m->v, call);
    wxg_plugin_thread_destroy(thr);
    return r;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

/* Splits buf into lines in place; returns the count (at most max). */
static size_t split_lines(char *buf, char **lines, size_t max)
{
    size_t n = 0;
    char *p = buf;
    while (*p && n < max) {
        char *nl = strchr(p, '\n');
        if (!nl)
            fail_msg("last line has no newline: a torn write");
        *nl = '\0';
        lines[n++] = p;
        p = nl + 1;
    }
    return n;
}

/* ----- registry and chain ----- */

static void builtins_are_found_by_name_and_unknown_names_are_refused(void **state)
{
    (void)state;
    const char *names[] = {"noop", "record", "fail"};
    for (size_t i = 0; i < 3; i++) {
        const wxg_plugin_desc_t *d = wxg_plugin_builtin(names[i]);
        assert_non_null(d);
        assert_string_equal(d->name, names[i]);
        assert_int_equal(d->abi_version, WXG_PLUGIN_ABI_VERSION);
    }
    assert_null(wxg_plugin_builtin("nope"));
    assert_null(wxg_plugin_builtin(NULL));

    wxg_plugin_chain_t *chain = NULL;
    char err[512] = "";
    assert_int_equal(wxg_plugin_chain_new("noop,nope", NULL, 0, &chain, err, sizeof err),
                     WXG_ECONFIG);
    assert_null(chain);
    assert_non_null(strstr(err, "'nope'"));
    assert_non_null(strstr(err, "noop, record, fail"));
}

static void chain_keeps_the_configured_order_and_trims_blanks(void **state)
{
    (void)state;
    char *dir = wxg_test_mkdtemp("wxg-plugin");
    char path[600];
    snprintf(path, sizeof path, "%s/ledger.jsonl", dir);
    wxg_plugin_kv_t conf[] = {{"plugin.record.path", path}};
    wxg_plugin_chain_t *chain = chain_ok(" fail , noop,record ", conf, 1);
    assert_int_equal(wxg_plugin_chain_count(chain), 3);
    assert_string_equal(wxg_plugin_chain_name(chain, 0), "fail");
    assert_string_equal(wxg_plugin_chain_name(chain, 1), "noop");
    assert_string_equal(wxg_plugin_chain_name(chain, 2), "record");
    assert_null(wxg_plugin_chain_path(chain, 2));
    assert_null(wxg_plugin_chain_name(chain, 3));
    wxg_plugin_chain_destroy(chain);
    wxg_plugin_chain_destroy(NULL);
    wxg_test_rmtree(dir);
    free(dir);
}

static void empty_entries_and_duplicate_names_are_refused(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = NULL;
    char err[512] = "";
    assert_int_equal(wxg_plugin_chain_new("noop,,fail", NULL, 0, &chain, err, sizeof err),
                     WXG_ECONFIG);
    assert_non_null(strstr(err, "entry 2 is empty"));
    assert_int_equal(wxg_plugin_chain_new("", NULL, 0, &chain, err, sizeof err), WXG_ECONFIG);
    assert_int_equal(wxg_plugin_chain_new("noop, noop", NULL, 0, &chain, err, sizeof err),
                     WXG_ECONFIG);
    assert_non_null(strstr(err, "appears twice"));
    assert_int_equal(wxg_plugin_chain_new(WXG_EXAMPLE_PLUGIN "," WXG_EXAMPLE_PLUGIN, NULL, 0,
                                          &chain, err, sizeof err),
                     WXG_ECONFIG);
    assert_non_null(strstr(err, "'example' appears twice"));
    assert_null(chain);
}

static void config_reaches_only_its_plugin_with_the_prefix_removed(void **state)
{
    (void)state;
    wxg_plugin_kv_t conf[] = {
        {"plugin.example.prefix", "first"},
        {"plugin.examplex.prefix", "wrong-plugin"}, /* not in the chain: ignored */
        {"plugin.example_a.prefix", "other-plugin"},
        {"plugins", WXG_EXAMPLE_PLUGIN},
        {"plugin.example.prefix", "hello"}, /* a key given twice: the last wins */
    };
    wxg_plugin_chain_t *chain = chain_ok(WXG_EXAMPLE_PLUGIN, conf, 5);
    assert_string_equal(wxg_plugin_chain_name(chain, 0), "example");
    assert_string_equal(wxg_plugin_chain_path(chain, 0), WXG_EXAMPLE_PLUGIN);
    msgbuf m;
    make_msg(&m, "wxid_bot", "7301234567890123457", "hi", 2);
    wxg_plugin_call_t call;
    call_for(&call, 7, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    assert_true(call.has_result);
    assert_string_equal(call.result, "hello:wxid_bot:n:7301234567890123457:fence=7:attempt=1");
    wxg_plugin_chain_destroy(chain);

    /* A key the plugin does not know stops start-up, named in full. */
    wxg_plugin_kv_t bad[] = {{"plugin.example.prefx", "typo"}};
    char err[512] = "";
    assert_int_equal(wxg_plugin_chain_new(WXG_EXAMPLE_PLUGIN, bad, 1, &chain, err, sizeof err),
                     WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.example.prefx"));
}

/* The consumer's path for a plugin given by file: the configuration cannot know the plugin's
 * name before the object is loaded, so every plugin.* setting goes to the registry, which picks
 * the keys under the loaded descriptor's name (also from the environment). */
static void external_plugin_loaded_by_path_gets_its_settings_from_the_configuration(void **state)
{
    (void)state;
    char err[1024] = "";
    const char *sets[] = {"plugins=" WXG_EXAMPLE_PLUGIN_A, "plugin.example_b.prefix=not-mine",
                          "plugin.example.prefix=nor-this"};
    const char *const env[] = {"WXG_PLUGIN__EXAMPLE_A__PREFIX=from-env", NULL};
    wxg_conf_t *conf = wxg_conf_new(WXG_PROG_CONSUMER, err, sizeof err);
    assert_non_null(conf);
    assert_int_equal(wxg_conf_load_env(conf, env, err, sizeof err), 0);
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        if (wxg_conf_set_arg(conf, sets[i], err, sizeof err) != 0)
            fail_msg("%s refused: %s", sets[i], err);
    }
    wxg_conf_map_t *map = wxg_conf_plugin_settings(conf);
    assert_non_null(map);
    wxg_plugin_kv_t *kv = calloc(map->count + 1, sizeof *kv);
    assert_non_null(kv);
    for (size_t i = 0; i < map->count; i++)
        kv[i] = (wxg_plugin_kv_t){map->items[i].key, map->items[i].value};
    wxg_plugin_chain_t *chain = chain_ok(WXG_EXAMPLE_PLUGIN_A, kv, map->count);
    assert_string_equal(wxg_plugin_chain_name(chain, 0), "example_a");
    msgbuf m;
    make_msg(&m, "wxid_bot", "7301234567890123457", "hi", 2);
    wxg_plugin_call_t call;
    call_for(&call, 3, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    assert_true(call.has_result);
    assert_string_equal(call.result, "from-env:wxid_bot:n:7301234567890123457:fence=3:attempt=1");
    wxg_plugin_chain_destroy(chain);

    /* A key the loaded plugin does not know, set in the configuration, stops start-up. */
    assert_int_equal(wxg_conf_set_arg(conf, "plugin.example_a.prefx=typo", err, sizeof err), 0);
    wxg_conf_map_free(map);
    map = wxg_conf_plugin_settings(conf);
    assert_non_null(map);
    free(kv);
    kv = calloc(map->count + 1, sizeof *kv);
    assert_non_null(kv);
    for (size_t i = 0; i < map->count; i++)
        kv[i] = (wxg_plugin_kv_t){map->items[i].key, map->items[i].value};
    chain = NULL;
    assert_int_equal(
        wxg_plugin_chain_new(WXG_EXAMPLE_PLUGIN_A, kv, map->count, &chain, err, sizeof err),
        WXG_ECONFIG);
    assert_null(chain);
    assert_non_null(strstr(err, "plugin.example_a.prefx"));
    free(kv);
    wxg_conf_map_free(map);
    wxg_conf_free(conf);
}

static void external_plugin_sees_the_context_and_its_earlier_result(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = chain_ok(WXG_EXAMPLE_PLUGIN, NULL, 0);
    msgbuf m;
    make_msg(&m, "wxid_bot", "42", "hi", 2);
    wxg_plugin_call_t call;
    call_for(&call, 18446744073709551615ULL, 3);
    call.key = "explicit:n:key";
    call.prev_result = "seen:before";
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    assert_string_equal(call.result,
                        "seen:explicit:n:key:fence=18446744073709551615:attempt=3:again");
    assert_string_equal(call.reason, "");
    wxg_plugin_chain_destroy(chain);
}

static void lifecycle_runs_in_chain_order_and_unwinds_in_reverse(void **state)
{
    (void)state;
    char *dir = wxg_test_mkdtemp("wxg-plugin");
    char trace[600];
    snprintf(trace, sizeof trace, "%s/trace", dir);
    wxg_plugin_kv_t conf[] = {{"plugin.example_a.trace", trace}, {"plugin.example_b.trace", trace}};
    wxg_plugin_chain_t *chain =
        chain_ok(WXG_EXAMPLE_PLUGIN_A "," WXG_EXAMPLE_PLUGIN_B ",noop", conf, 2);
    wxg_plugin_thread_t *thr = NULL;
    char err[256];
    assert_int_equal(wxg_plugin_thread_new(chain, &thr, err, sizeof err), 0);
    wxg_plugin_thread_destroy(thr);
    wxg_plugin_thread_destroy(NULL);
    wxg_plugin_chain_destroy(chain);
    size_t len;
    char *got = read_file(trace, &len);
    assert_non_null(got);
    assert_string_equal(got, "init example_a\ninit example_b\n"
                             "thread_init example_a\nthread_init example_b\n"
                             "thread_destroy example_b\nthread_destroy example_a\n"
                             "destroy example_b\ndestroy example_a\n");
    free(got);
    wxg_test_rmtree(dir);
    free(dir);
}

static void init_failure_destroys_the_plugins_already_initialised(void **state)
{
    (void)state;
    char *dir = wxg_test_mkdtemp("wxg-plugin");
    char trace[600];
    snprintf(trace, sizeof trace, "%s/trace", dir);
    wxg_plugin_kv_t conf[] = {{"plugin.example_a.trace", trace}, {"plugin.example_b.unknown", "1"}};
    wxg_plugin_chain_t *chain = NULL;
    char err[512] = "";
    assert_int_equal(wxg_plugin_chain_new(WXG_EXAMPLE_PLUGIN_A "," WXG_EXAMPLE_PLUGIN_B, conf, 2,
                                          &chain, err, sizeof err),
                     WXG_ECONFIG);
    assert_null(chain);
    assert_non_null(strstr(err, "plugin example_b: init failed"));
    assert_non_null(strstr(err, "plugin.example_b.unknown"));
    size_t len;
    char *got = read_file(trace, &len);
    assert_non_null(got);
    assert_string_equal(got, "init example_a\ndestroy example_a\n");
    free(got);
    wxg_test_rmtree(dir);
    free(dir);
}

static void a_missing_file_is_a_config_error_naming_the_path(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = NULL;
    char err[1024] = "";
    assert_int_equal(
        wxg_plugin_chain_new("noop,/nonexistent/dir/plugin.so", NULL, 0, &chain, err, sizeof err),
        WXG_ECONFIG);
    assert_null(chain);
    assert_non_null(strstr(err, "/nonexistent/dir/plugin.so"));
    assert_non_null(strstr(err, "No such file")); /* dlerror's text */
}

/* Copies the example plugin to dir/name with `mode`; the path goes to `path`. */
static void copy_plugin(const char *dir, const char *name, mode_t mode, char *path, size_t size)
{
    size_t len = 0;
    char *so = read_file(WXG_EXAMPLE_PLUGIN, &len);
    assert_non_null(so);
    snprintf(path, size, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(so, 1, len, f), len);
    fclose(f);
    free(so);
    assert_int_equal(chmod(path, mode), 0);
}

static void plugin_paths_must_be_absolute_and_the_files_not_writable_by_others(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = NULL;
    char err[1024] = "";
    /* A relative path would resolve against the working directory. */
    assert_int_equal(wxg_plugin_chain_new("noop,plugins/x.so", NULL, 0, &chain, err, sizeof err),
                     WXG_ECONFIG);
    assert_null(chain);
    assert_non_null(strstr(err, "plugin path 'plugins/x.so' is relative"));
    assert_int_equal(wxg_plugin_chain_new("./x.so", NULL, 0, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "is relative"));
    /* The hint for an unknown built-in no longer suggests ./name.so. */
    assert_int_equal(wxg_plugin_chain_new("crm", NULL, 0, &chain, err, sizeof err), WXG_ECONFIG);
    assert_null(strstr(err, "./crm.so"));
    assert_non_null(strstr(err, "absolute path"));

    char *dir = wxg_test_mkdtemp("wxg-plugin-trust");
    assert_non_null(dir);
    assert_int_equal(chmod(dir, 0755), 0);
    char ok[600], grp[600], link[600], open_dir[600], in_open[600];
    /* A copy owned by the running user in a directory only it writes: loads. */
    copy_plugin(dir, "ok.so", 0755, ok, sizeof ok);
    assert_int_equal(wxg_plugin_chain_new(ok, NULL, 0, &chain, err, sizeof err), 0);
    assert_string_equal(wxg_plugin_chain_name(chain, 0), "example");
    wxg_plugin_chain_destroy(chain);
    chain = NULL;
    /* A group-writable file: refused, naming it and why. */
    copy_plugin(dir, "grp.so", 0775, grp, sizeof grp);
    assert_int_equal(wxg_plugin_chain_new(grp, NULL, 0, &chain, err, sizeof err), WXG_ECONFIG);
    assert_null(chain);
    assert_non_null(strstr(err, grp));
    assert_non_null(strstr(err, "its file"));
    assert_non_null(strstr(err, "is writable by its group (mode 0775)"));
    /* A symbolic link: refused (it could point anywhere). */
    snprintf(link, sizeof link, "%s/link.so", dir);
    assert_int_equal(symlink(ok, link), 0);
    assert_int_equal(wxg_plugin_chain_new(link, NULL, 0, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "symbolic link"));
    /* A good file in a directory everybody may write (as /tmp, sticky bit or not): refused. */
    snprintf(open_dir, sizeof open_dir, "%s/open", dir);
    assert_int_equal(mkdir(open_dir, 0700), 0);
    assert_int_equal(chmod(open_dir, 01777), 0);
    copy_plugin(open_dir, "ok.so", 0755, in_open, sizeof in_open);
    assert_int_equal(wxg_plugin_chain_new(in_open, NULL, 0, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, in_open));
    assert_non_null(strstr(err, "its directory"));
    assert_non_null(strstr(err, "is writable by others (mode 1777)"));
    wxg_test_rmtree(dir);
    free(dir);
}

static void an_abi_mismatch_is_refused_with_both_versions(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = NULL;
    char err[1024] = "";
    assert_int_equal(
        wxg_plugin_chain_new(WXG_EXAMPLE_PLUGIN_BAD_ABI, NULL, 0, &chain, err, sizeof err),
        WXG_EABI);
    assert_null(chain);
    char want[128];
    assert_non_null(strstr(err, WXG_EXAMPLE_PLUGIN_BAD_ABI));
    snprintf(want, sizeof want, "ABI version %u", WXG_PLUGIN_ABI_VERSION + 1);
    assert_non_null(strstr(err, want));
    snprintf(want, sizeof want, "speaks version %u", WXG_PLUGIN_ABI_VERSION);
    assert_non_null(strstr(err, want));
}

static void a_missing_entry_symbol_is_refused_with_the_dlerror_text(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = NULL;
    char err[1024] = "";
    assert_int_equal(
        wxg_plugin_chain_new(WXG_EXAMPLE_PLUGIN_NO_ENTRY, NULL, 0, &chain, err, sizeof err),
        WXG_EABI);
    assert_null(chain);
    assert_non_null(strstr(err, WXG_EXAMPLE_PLUGIN_NO_ENTRY));
    assert_non_null(strstr(err, "no symbol wxg_plugin_entry"));
    assert_non_null(strstr(err, "undefined symbol")); /* dlerror's text */
}

static void produce_without_a_producer_fails_and_the_plugin_retries(void **state)
{
    (void)state;
    wxg_plugin_kv_t conf[] = {{"plugin.example.topic", "replies"}};
    wxg_plugin_chain_t *chain = chain_ok(WXG_EXAMPLE_PLUGIN, conf, 1);
    msgbuf m;
    make_msg(&m, "wxid_bot", "1", "hi", 2);
    wxg_plugin_call_t call;
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_RETRY);
    assert_int_equal(call.produce_error, WXG_ESTATE);
    assert_int_equal(call.produce_count, 0);
    assert_false(call.has_result);
    assert_string_equal(call.reason, "example: produce to replies failed: ESTATE");
    wxg_plugin_chain_destroy(chain);
}

static void results_must_be_short_text(void **state)
{
    (void)state;
    /* A control character in the result is refused, so nothing is recorded. */
    wxg_plugin_kv_t tab[] = {{"plugin.example.prefix", "a\tb"}};
    wxg_plugin_chain_t *chain = chain_ok(WXG_EXAMPLE_PLUGIN, tab, 1);
    msgbuf m;
    make_msg(&m, "wxid_bot", "1", "hi", 2);
    wxg_plugin_call_t call;
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    assert_false(call.has_result);
    wxg_plugin_chain_destroy(chain);

    /* The example cuts its result to WXG_PLUGIN_RESULT_MAX bytes, which is accepted whole. */
    char longp[400];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    wxg_plugin_kv_t lng[] = {{"plugin.example.prefix", longp}};
    chain = chain_ok(WXG_EXAMPLE_PLUGIN, lng, 1);
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    assert_true(call.has_result);
    assert_int_equal(strlen(call.result), WXG_PLUGIN_RESULT_MAX);
    wxg_plugin_chain_destroy(chain);
}

static void noop_succeeds_and_refuses_settings(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = chain_ok("noop", NULL, 0);
    msgbuf m;
    make_msg(&m, "wxid_bot", "1", "hi", 2);
    wxg_plugin_call_t call;
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    assert_false(call.has_result);
    wxg_plugin_chain_destroy(chain);
    wxg_plugin_kv_t conf[] = {{"plugin.noop.x", "1"}};
    char err[256];
    assert_int_equal(wxg_plugin_chain_new("noop", conf, 1, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.noop.x"));
}

/* ----- fail ----- */

static void fail_plugin_fails_matching_messages_permanently(void **state)
{
    (void)state;
    wxg_plugin_kv_t conf[] = {{"plugin.fail.match.keys", "wxid_bot:n:1, wxid_bot:n:2"},
                              {"plugin.fail.reason", "drill 7"}};
    wxg_plugin_chain_t *chain = chain_ok("fail", conf, 2);
    msgbuf m;
    wxg_plugin_call_t call;
    make_msg(&m, "wxid_bot", "2", "hi", 2);
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_FAIL);
    assert_string_equal(call.reason, "fail: drill 7");
    make_msg(&m, "wxid_bot", "3", "hi", 2);
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    assert_string_equal(call.reason, "");
    wxg_plugin_chain_destroy(chain);
}

static void fail_plugin_retries_n_times_then_succeeds(void **state)
{
    (void)state;
    wxg_plugin_kv_t conf[] = {{"plugin.fail.action", "retry"}, {"plugin.fail.retry.times", "2"}};
    wxg_plugin_chain_t *chain = chain_ok("fail", conf, 2);
    msgbuf m;
    make_msg(&m, "wxid_bot", "9", "hi", 2);
    wxg_plugin_call_t call;
    for (uint32_t attempt = 1; attempt <= 2; attempt++) {
        call_for(&call, attempt, attempt);
        assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_RETRY);
        assert_non_null(strstr(call.reason, "injected failure"));
    }
    call_for(&call, 3, 3);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    wxg_plugin_chain_destroy(chain);

    /* retry.times = 0: every attempt is transient, so the retries run out. */
    wxg_plugin_kv_t always[] = {{"plugin.fail.action", "retry"}, {"plugin.fail.retry.times", "0"}};
    chain = chain_ok("fail", always, 2);
    call_for(&call, 100, 100);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_RETRY);
    wxg_plugin_chain_destroy(chain);
}

static void fail_plugin_stalls_at_least_the_configured_time(void **state)
{
    (void)state;
    wxg_plugin_kv_t conf[] = {{"plugin.fail.action", "stall"}, {"plugin.fail.stall.ms", "30"}};
    wxg_plugin_chain_t *chain = chain_ok("fail", conf, 2);
    msgbuf m;
    make_msg(&m, "wxid_bot", "9", "hi", 2);
    wxg_plugin_call_t call;
    call_for(&call, 1, 1);
    int64_t t0 = wxg_test_now_ms();
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    assert_true(wxg_test_now_ms() - t0 >= 30);
    wxg_plugin_chain_destroy(chain);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static void fail_plugin_matches_msg_ids_content_and_every_nth_key(void **state)
{
    (void)state;
    wxg_plugin_kv_t ids[] = {{"plugin.fail.match.msg_ids", "5,6"}};
    wxg_plugin_chain_t *chain = chain_ok("fail", ids, 1);
    msgbuf m;
    wxg_plugin_call_t call;
    make_msg(&m, "wxid_bot", "6", "hi", 2);
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_FAIL);
    make_msg(&m, "wxid_bot", NULL, "hi", 2); /* no id: no match */
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    wxg_plugin_chain_destroy(chain);

    /* The content is bytes: the substring is found after an embedded NUL. */
    wxg_plugin_kv_t content[] = {{"plugin.fail.match.content", "boom"}};
    chain = chain_ok("fail", content, 1);
    static const char text[] = "a\0b boom c";
    make_msg(&m, "wxid_bot", "1", text, sizeof text - 1);
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_FAIL);
    make_msg(&m, "wxid_bot", "1", text, 5); /* "boom" lies beyond content_len */
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    wxg_plugin_chain_destroy(chain);

    wxg_plugin_kv_t every[] = {{"plugin.fail.match.every", "3"}};
    chain = chain_ok("fail", every, 1);
    int matched = 0;
    for (int i = 0; i < 60; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", 1000 + i);
        make_msg(&m, "wxid_bot", id, "hi", 2);
        call_for(&call, 1, 1);
        wxg_plugin_result_t want = fnv1a64(m.key) % 3 == 0 ? WXG_PLUGIN_FAIL : WXG_PLUGIN_OK;
        assert_int_equal(run1(chain, 0, &m, &call), want);
        matched += want == WXG_PLUGIN_FAIL;
    }
    assert_true(matched > 0 && matched < 60); /* the predicate selects some, not all */
    wxg_plugin_chain_destroy(chain);
}

static void fail_plugin_refuses_bad_settings(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = NULL;
    char err[512];
    wxg_plugin_kv_t action[] = {{"plugin.fail.action", "explode"}};
    assert_int_equal(wxg_plugin_chain_new("fail", action, 1, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.fail.action"));
    wxg_plugin_kv_t every[] = {{"plugin.fail.match.every", "0"}};
    assert_int_equal(wxg_plugin_chain_new("fail", every, 1, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.fail.match.every"));
    wxg_plugin_kv_t stall[] = {{"plugin.fail.stall.ms", "12x"}};
    assert_int_equal(wxg_plugin_chain_new("fail", stall, 1, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.fail.stall.ms"));
    assert_null(chain);
}

/* ----- record ----- */

static void record_plugin_writes_one_parsable_line_per_effect(void **state)
{
    (void)state;
    char *dir = wxg_test_mkdtemp("wxg-plugin");
    char path[600];
    snprintf(path, sizeof path, "%s/ledger.jsonl", dir);
    wxg_plugin_kv_t conf[] = {{"plugin.record.path", path}, {"plugin.record.fsync", "always"}};
    wxg_plugin_chain_t *chain = chain_ok("record", conf, 2);
    wxg_plugin_thread_t *thr = NULL;
    char err[256];
    assert_int_equal(wxg_plugin_thread_new(chain, &thr, err, sizeof err), 0);
    msgbuf m;
    wxg_plugin_call_t call;
    for (int i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "730123456789012345%d", i);
        make_msg(&m, "wxid_bot\"quoted", i == 2 ? NULL : id, "secret text", 11);
        call_for(&call, 9007199254740993ULL + (uint64_t)i, (uint32_t)(i + 1));
        assert_int_equal(wxg_plugin_chain_handle(chain, thr, 0, &m.v, &call), WXG_PLUGIN_OK);
    }
    wxg_plugin_thread_destroy(thr);
    wxg_plugin_chain_destroy(chain);

    size_t len;
    char *buf = read_file(path, &len);
    assert_non_null(buf);
    char *lines[8];
    assert_int_equal(split_lines(buf, lines, 8), 3);
    for (int i = 0; i < 3; i++) {
        /* Integers are exact, beyond 2^53. */
        char want[64];
        snprintf(want, sizeof want, "\"fence\":%" PRIu64,
                 (uint64_t)(9007199254740993ULL + (uint64_t)i));
        assert_non_null(strstr(lines[i], want));
        assert_null(strstr(lines[i], "secret text")); /* content stays out by default */
        cJSON *o = cJSON_Parse(lines[i]);
        assert_non_null(o);
        char key[128];
        assert_string_equal(cJSON_GetObjectItem(o, "account")->valuestring, "wxid_bot\"quoted");
        if (i == 2) {
            assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "msg_id")));
            assert_string_equal(cJSON_GetObjectItem(o, "key")->valuestring,
                                "wxid_bot\"quoted:n:none");
        } else {
            char id[32];
            snprintf(id, sizeof id, "730123456789012345%d", i);
            assert_string_equal(cJSON_GetObjectItem(o, "msg_id")->valuestring, id);
            snprintf(key, sizeof key, "wxid_bot\"quoted:n:%s", id);
            assert_string_equal(cJSON_GetObjectItem(o, "key")->valuestring, key);
        }
        assert_string_equal(cJSON_GetObjectItem(o, "topic")->valuestring, "callbacks");
        assert_int_equal(cJSON_GetObjectItem(o, "partition")->valueint, 3);
        assert_int_equal(cJSON_GetObjectItem(o, "offset")->valueint, 12345);
        assert_int_equal(cJSON_GetObjectItem(o, "attempt")->valueint, i + 1);
        assert_string_equal(cJSON_GetObjectItem(o, "plugin")->valuestring, "record");
        assert_string_equal(cJSON_GetObjectItem(o, "conversation")->valuestring, "room_1@chatroom");
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "is_group")));
        assert_true(cJSON_GetObjectItem(o, "time_ms")->valuedouble > 1.6e12);
        assert_int_equal(cJSON_GetObjectItem(o, "pid")->valueint, (int)getpid());
        assert_int_equal(strlen(cJSON_GetObjectItem(o, "payload_hash")->valuestring), 64);
        assert_int_equal(strncmp(cJSON_GetObjectItem(o, "payload_hash")->valuestring, "00070e", 6),
                         0);
        cJSON_Delete(o);
    }
    free(buf);
    wxg_test_rmtree(dir);
    free(dir);
}

static void record_plugin_cuts_long_content_to_keep_lines_short(void **state)
{
    (void)state;
    char *dir = wxg_test_mkdtemp("wxg-plugin");
    char path[600];
    snprintf(path, sizeof path, "%s/ledger.jsonl", dir);
    wxg_plugin_kv_t conf[] = {{"plugin.record.path", path},
                              {"plugin.record.include.content", "true"}};
    wxg_plugin_chain_t *chain = chain_ok("record", conf, 2);
    /* Control bytes escape to six characters each: the cut must allow for that. */
    size_t n = 10000;
    char *content = malloc(n);
    for (size_t i = 0; i < n; i++)
        content[i] = (char)(i % 2 ? 0x01 : 'a');
    msgbuf m;
    make_msg(&m, "wxid_bot", "1", content, n);
    wxg_plugin_call_t call;
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    make_msg(&m, "wxid_bot", "2", "short", 5);
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_OK);
    wxg_plugin_chain_destroy(chain);
    size_t len;
    char *buf = read_file(path, &len);
    char *lines[4];
    assert_int_equal(split_lines(buf, lines, 4), 2);
    assert_true(strlen(lines[0]) + 1 <= 4000);
    cJSON *o = cJSON_Parse(lines[0]);
    assert_non_null(o);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "content_truncated")));
    assert_true(strlen(cJSON_GetObjectItem(o, "content")->valuestring) > 100);
    cJSON_Delete(o);
    o = cJSON_Parse(lines[1]);
    assert_string_equal(cJSON_GetObjectItem(o, "content")->valuestring, "short");
    assert_null(cJSON_GetObjectItem(o, "content_truncated"));
    cJSON_Delete(o);
    free(buf);
    free(content);
    wxg_test_rmtree(dir);
    free(dir);
}

static void record_plugin_needs_a_writable_path(void **state)
{
    (void)state;
    wxg_plugin_chain_t *chain = NULL;
    char err[512] = "";
    assert_int_equal(wxg_plugin_chain_new("record", NULL, 0, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.record.path"));
    wxg_plugin_kv_t conf[] = {{"plugin.record.path", "/nonexistent/dir/ledger"}};
    assert_int_equal(wxg_plugin_chain_new("record", conf, 1, &chain, err, sizeof err), WXG_ECONFIG);
    assert_non_null(strstr(err, "/nonexistent/dir/ledger"));
    wxg_plugin_kv_t policy[] = {{"plugin.record.path", "/dev/null"},
                                {"plugin.record.fsync", "sometimes"}};
    assert_int_equal(wxg_plugin_chain_new("record", policy, 2, &chain, err, sizeof err),
                     WXG_ECONFIG);
    assert_non_null(strstr(err, "plugin.record.fsync"));
    assert_null(chain);
}

static void record_plugin_write_failure_is_retry(void **state)
{
    (void)state;
    /* Every write to /dev/full fails with ENOSPC. */
    wxg_plugin_kv_t conf[] = {{"plugin.record.path", "/dev/full"}};
    wxg_plugin_chain_t *chain = chain_ok("record", conf, 1);
    msgbuf m;
    make_msg(&m, "wxid_bot", "1", "hi", 2);
    wxg_plugin_call_t call;
    call_for(&call, 1, 1);
    assert_int_equal(run1(chain, 0, &m, &call), WXG_PLUGIN_RETRY);
    assert_non_null(strstr(call.reason, "record: write to '/dev/full' failed"));
    wxg_plugin_chain_destroy(chain);
}

#define PROCS           4
#define THREADS_PER     2
#define LINES_PER_THR   150
#define CONCURRENT_BODY 3000

typedef struct writer_arg {
    wxg_plugin_chain_t *chain;
    int proc;
    int thread;
    int failures;
} writer_arg;

static void *writer_main(void *p)
{
    writer_arg *a = p;
    wxg_plugin_thread_t *thr = NULL;
    char err[256];
    if (wxg_plugin_thread_new(a->chain, &thr, err, sizeof err) != 0) {
        a->failures = LINES_PER_THR;
        return NULL;
    }
    char *content = malloc(CONCURRENT_BODY);
    memset(content, 'a' + a->proc, CONCURRENT_BODY);
    for (int i = 0; i < LINES_PER_THR; i++) {
        msgbuf m;
        char id[32];
        snprintf(id, sizeof id, "%d%02d%05d", a->proc + 1, a->thread, i);
        make_msg(&m, "wxid_bot", id, content, CONCURRENT_BODY);
        wxg_plugin_call_t call;
        call_for(&call, 1, 1);
        if (wxg_plugin_chain_handle(a->chain, thr, 0, &m.v, &call) != WXG_PLUGIN_OK)
            a->failures++;
    }
    free(content);
    wxg_plugin_thread_destroy(thr);
    return NULL;
}

static void concurrent_appends_from_processes_and_threads_give_whole_lines(void **state)
{
    (void)state;
    char *dir = wxg_test_mkdtemp("wxg-plugin");
    char path[600];
    snprintf(path, sizeof path, "%s/ledger.jsonl", dir);
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            /* Each child is a replica: its own chain on the same file. Half of them also take
             * the flock, which must mix safely with plain O_APPEND writers. */
            wxg_plugin_kv_t conf[] = {{"plugin.record.path", path},
                                      {"plugin.record.include.content", "true"},
                                      {"plugin.record.lock", p % 2 ? "true" : "false"}};
            wxg_plugin_chain_t *chain = NULL;
            char err[512];
            if (wxg_plugin_chain_new("record", conf, 3, &chain, err, sizeof err) != 0)
                _exit(2);
            pthread_t t[THREADS_PER];
            writer_arg a[THREADS_PER];
            for (int i = 0; i < THREADS_PER; i++) {
                a[i] = (writer_arg){.chain = chain, .proc = p, .thread = i};
                if (pthread_create(&t[i], NULL, writer_main, &a[i]) != 0)
                    _exit(3);
            }
            int failures = 0;
            for (int i = 0; i < THREADS_PER; i++) {
                pthread_join(t[i], NULL);
                failures += a[i].failures;
            }
            wxg_plugin_chain_destroy(chain);
            _exit(failures ? 1 : 0);
        }
    }
    for (int p = 0; p < PROCS; p++) {
        int status = 0;
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }

    size_t len;
    char *buf = read_file(path, &len);
    assert_non_null(buf);
    enum { TOTAL = PROCS * THREADS_PER * LINES_PER_THR };
    char **lines = calloc(TOTAL + 1, sizeof *lines);
    assert_int_equal(split_lines(buf, lines, TOTAL + 1), TOTAL);
    static unsigned char seen[PROCS][THREADS_PER][LINES_PER_THR];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < TOTAL; i++) {
        cJSON *o = cJSON_Parse(lines[i]);
        assert_non_null(o); /* a whole line, never two interleaved */
        const char *id = cJSON_GetObjectItem(o, "msg_id")->valuestring;
        const char *content = cJSON_GetObjectItem(o, "content")->valuestring;
        int p = id[0] - '1';
        int t = (id[1] - '0') * 10 + (id[2] - '0');
        int n = (int)strtol(id + 3, NULL, 10);
        assert_true(p >= 0 && p < PROCS && t >= 0 && t < THREADS_PER && n >= 0 &&
                    n < LINES_PER_THR);
        assert_int_equal(strlen(content), CONCURRENT_BODY);
        assert_int_equal(content[0], 'a' + p);
        assert_int_equal(content[CONCURRENT_BODY - 1], 'a' + p);
        assert_int_equal(seen[p][t][n], 0);
        seen[p][t][n] = 1;
        cJSON_Delete(o);
    }
    free(lines);
    free(buf);
    wxg_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(builtins_are_found_by_name_and_unknown_names_are_refused),
        cmocka_unit_test(chain_keeps_the_configured_order_and_trims_blanks),
        cmocka_unit_test(empty_entries_and_duplicate_names_are_refused),
        cmocka_unit_test(config_reaches_only_its_plugin_with_the_prefix_removed),
        cmocka_unit_test(external_plugin_loaded_by_path_gets_its_settings_from_the_configuration),
        cmocka_unit_test(external_plugin_sees_the_context_and_its_earlier_result),
        cmocka_unit_test(lifecycle_runs_in_chain_order_and_unwinds_in_reverse),
        cmocka_unit_test(init_failure_destroys_the_plugins_already_initialised),
        cmocka_unit_test(a_missing_file_is_a_config_error_naming_the_path),
        cmocka_unit_test(plugin_paths_must_be_absolute_and_the_files_not_writable_by_others),
        cmocka_unit_test(an_abi_mismatch_is_refused_with_both_versions),
        cmocka_unit_test(a_missing_entry_symbol_is_refused_with_the_dlerror_text),
        cmocka_unit_test(produce_without_a_producer_fails_and_the_plugin_retries),
        cmocka_unit_test(results_must_be_short_text),
        cmocka_unit_test(noop_succeeds_and_refuses_settings),
        cmocka_unit_test(fail_plugin_fails_matching_messages_permanently),
        cmocka_unit_test(fail_plugin_retries_n_times_then_succeeds),
        cmocka_unit_test(fail_plugin_stalls_at_least_the_configured_time),
        cmocka_unit_test(fail_plugin_matches_msg_ids_content_and_every_nth_key),
        cmocka_unit_test(fail_plugin_refuses_bad_settings),
        cmocka_unit_test(record_plugin_writes_one_parsable_line_per_effect),
        cmocka_unit_test(record_plugin_cuts_long_content_to_keep_lines_short),
        cmocka_unit_test(record_plugin_needs_a_writable_path),
        cmocka_unit_test(record_plugin_write_failure_is_retry),
        cmocka_unit_test(concurrent_appends_from_processes_and_threads_give_whole_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
