/*
 * DESIGN: the `autoreply` built-in plugin: rules from configuration turn a matching message
 * into a reply command on an outbound Kafka topic, which the gateway's sender consumes.
 *
 * Rules. One key per rule, tried in the order of their numbers; the first match wins and at
 * most one reply is produced per message:
 *
 *   plugin.autoreply.rule.<n> = [account=<id>|*] [chat=private|group|any] <kind>:<pattern> ->
 * <reply>
 *
 *   <n>        a positive integer (1..1000000); gaps are fine ("rule.10", "rule.20", ...)
 *   account=   only messages of this bot account (default *: every account)
 *   chat=      private (one-to-one), group, or any (default)
 *   <kind>     keyword (also: exact)  the whole message equals <pattern>, ignoring blanks
 *                                     (spaces, tabs, CR, LF) around the message
 *              contains               <pattern> occurs anywhere in the message
 *              regex                  POSIX extended regular expression (regcomp with
 *                                     REG_EXTENDED | REG_NOSUB), searched in the message
 *              iregex                 the same, case-insensitive (REG_ICASE)
 *   <pattern>  everything from the ':' after the kind up to the first " -> " (space, arrow,
 *              space), which therefore cannot occur inside a pattern (write -[>] in a regex)
 *   <reply>    the reply text; \n, \t and \\ stand for a newline, a tab and a backslash
 *
 * For example:
 *   plugin.autoreply.rule.1 = keyword:你好 -> 你好！有什么可以帮您？
 *   plugin.autoreply.rule.2 = chat=group contains:价格 -> 价格请看群公告
 *   plugin.autoreply.rule.3 = account=wxid_bot1 iregex:^(help|帮助)$ -> 发送“价格”查看价目表
 * A rule that does not parse, a regex that does not compile, or an unknown key stops start-up
 * with the key named. A regex is matched against the content up to its first NUL byte.
 *
 * Other settings (plugin.autoreply.*): topic (required: the outbound topic), ignore.self (true:
 * never answer the bot's own messages, which would loop).
 *
 * The reply command (the record's value) is the JSON object
 *   {"account": <bot account>, "to": <conversation: the group, or the peer>, "content": <reply>,
 *    "in_reply_to": <msg_id or null>, "key": <idempotency key>}
 * produced with the idempotency key as the Kafka key (so every copy of one reply lands in one
 * partition, in order) and as the header "wxg-idempotency-key", plus "wxg-fence". The plugin
 * returns OK only after the broker acknowledged the record (the host's producer waits for the
 * delivery report); the result it records is "<topic>/<partition>/<offset>" of the reply.
 *
 * Exactly once in effect, and where it is not. Once OK is returned, the guard's per-plugin
 * marker keeps a retry of this message (say a later plugin such as pgsql failed) from running
 * autoreply again, so the common failure produces no second reply. One window remains: the
 * process dies after the broker acknowledged the reply but before the guard stored the marker
 * (or the delivery report is lost to a timeout while the record did arrive). The next claim
 * then runs autoreply again and a second record with the SAME key lands in the same partition.
 * Kafka's idempotent producer cannot help there (it dedups retries within one producer
 * session only), so the sender that consumes the outbound topic must drop a key it has
 * already sent, e.g. with SET key NX EX <retention> in Redis before calling the send API.
 * The key makes that check exact.
 *
 * Threads: the rules are compiled at init and read-only afterwards; glibc's regexec may run on
 * one compiled pattern from several threads at once. No thread state.
 */
#include "plugin_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RULE_MAX_N 1000000L

enum match_kind { MATCH_KEYWORD, MATCH_CONTAINS, MATCH_REGEX };
enum chat_scope { CHAT_ANY, CHAT_PRIVATE, CHAT_GROUP };

typedef struct rule {
    long n;
    char *account; /* NULL = every account */
    enum chat_scope chat;
    enum match_kind kind;
    char *pattern;
    size_t pattern_len;
    regex_t re;
    int has_re;
    char *reply;
} rule;

struct wxg__ar_rules {
    size_t n;
    rule *r;
};

typedef struct autoreply_state {
    wxg__ar_rules_t *rules;
    char *topic;
    int ignore_self;
} autoreply_state;

void wxg__ar_rules_free(wxg__ar_rules_t *rules)
{
    if (!rules)
        return;
    for (size_t i = 0; i < rules->n; i++) {
        rule *r = &rules->r[i];
        free(r->account);
        free(r->pattern);
        free(r->reply);
        if (r->has_re)
            regfree(&r->re);
    }
    free(rules->r);
    free(rules);
}

size_t wxg__ar_rules_count(const wxg__ar_rules_t *rules)
{
    return rules ? rules->n : 0;
}

/* "rule.<n>" with n in 1..RULE_MAX_N, without leading zeros. Returns n or 0. */
static long rule_number(const char *key)
{
    if (strncmp(key, "rule.", 5) != 0)
        return 0;
    const char *d = key + 5;
    if (*d < '1' || *d > '9')
        return 0;
    char *end = NULL;
    errno = 0;
    long n = strtol(d, &end, 10);
    if (errno != 0 || *end != '\0' || n < 1 || n > RULE_MAX_N)
        return 0;
    return n;
}

static char *dup_range(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* *dst = the reply text with \n, \t and \\ replaced. Returns 0, WXG_ECONFIG (a bad escape)
 * or WXG_ENOMEM, with why. */
static int unescape(const char *s, char **dst, char *why, size_t why_size)
{
    size_t n = strlen(s);
    char *out = malloc(n + 1);
    if (!out) {
        snprintf(why, why_size, "out of memory");
        return WXG_ENOMEM;
    }
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            out[j++] = s[i];
            continue;
        }
        char c = s[++i];
        if (c == 'n')
            out[j++] = '\n';
        else if (c == 't')
            out[j++] = '\t';
        else if (c == '\\')
            out[j++] = '\\';
        else {
            snprintf(why, why_size, "unknown escape '\\%c' in the reply (use \\n, \\t or \\\\)",
                     c ? c : ' ');
            free(out);
            return WXG_ECONFIG;
        }
    }
    out[j] = '\0';
    *dst = out;
    return 0;
}

/* Parses one rule's value into r. Returns 0, or WXG_ECONFIG/WXG_ENOMEM with why. */
static int parse_rule(const char *v, rule *r, char *why, size_t why_size)
{
    const char *p = v;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        size_t tok = strcspn(p, " \t");
        if (strncmp(p, "account=", 8) == 0) {
            if (r->account) {
                snprintf(why, why_size, "account= is given twice");
                return WXG_ECONFIG;
            }
            const char *a = p + 8;
            size_t alen = tok - 8;
            if (alen == 0) {
                snprintf(why, why_size, "account= needs an account id or *");
                return WXG_ECONFIG;
            }
            if (!(alen == 1 && a[0] == '*') && !(r->account = dup_range(a, alen))) {
                snprintf(why, why_size, "out of memory");
                return WXG_ENOMEM;
            }
            p += tok;
        } else if (strncmp(p, "chat=", 5) == 0) {
            const char *c = p + 5;
            size_t clen = tok - 5;
            if (clen == 3 && strncmp(c, "any", 3) == 0)
                r->chat = CHAT_ANY;
            else if (clen == 7 && strncmp(c, "private", 7) == 0)
                r->chat = CHAT_PRIVATE;
            else if (clen == 5 && strncmp(c, "group", 5) == 0)
                r->chat = CHAT_GROUP;
            else {
                snprintf(why, why_size, "chat=%.*s is not one of private, group, any", (int)clen,
                         c);
                return WXG_ECONFIG;
            }
            p += tok;
        } else {
            break;
        }
    }
    const char *colon = strchr(p, ':');
    if (!colon) {
        snprintf(why, why_size,
                 "expected <kind>:<pattern> -> <reply> with kind keyword, contains, regex or "
                 "iregex");
        return WXG_ECONFIG;
    }
    size_t klen = (size_t)(colon - p);
    int icase = 0;
    if ((klen == 7 && strncmp(p, "keyword", 7) == 0) || (klen == 5 && strncmp(p, "exact", 5) == 0))
        r->kind = MATCH_KEYWORD;
    else if (klen == 8 && strncmp(p, "contains", 8) == 0)
        r->kind = MATCH_CONTAINS;
    else if (klen == 5 && strncmp(p, "regex", 5) == 0)
        r->kind = MATCH_REGEX;
    else if (klen == 6 && strncmp(p, "iregex", 6) == 0) {
        r->kind = MATCH_REGEX;
        icase = 1;
    } else {
        snprintf(why, why_size, "unknown match kind '%.*s' (keyword, contains, regex, iregex)",
                 (int)klen, p);
        return WXG_ECONFIG;
    }
    const char *pat = colon + 1;
    const char *arrow = strstr(pat, " -> ");
    if (!arrow) {
        snprintf(why, why_size, "no ' -> ' between the pattern and the reply");
        return WXG_ECONFIG;
    }
    if (arrow == pat) {
        snprintf(why, why_size, "the pattern is empty");
        return WXG_ECONFIG;
    }
    const char *reply = arrow + 4;
    while (*reply == ' ' || *reply == '\t')
        reply++;
    if (!*reply) {
        snprintf(why, why_size, "the reply is empty");
        return WXG_ECONFIG;
    }
    r->pattern_len = (size_t)(arrow - pat);
    if (!(r->pattern = dup_range(pat, r->pattern_len))) {
        snprintf(why, why_size, "out of memory");
        return WXG_ENOMEM;
    }
    if (r->kind == MATCH_REGEX) {
        int flags = REG_EXTENDED | REG_NOSUB | (icase ? REG_ICASE : 0);
        int rerr = regcomp(&r->re, r->pattern, flags);
        if (rerr != 0) {
            char msg[160];
            regerror(rerr, &r->re, msg, sizeof msg);
            snprintf(why, why_size, "the regular expression does not compile: %s", msg);
            return WXG_ECONFIG;
        }
        r->has_re = 1;
    }
    return unescape(reply, &r->reply, why, why_size);
}

static int by_number(const void *a, const void *b)
{
    long x = ((const rule *)a)->n, y = ((const rule *)b)->n;
    return (x > y) - (x < y);
}

int wxg__ar_rules_parse(const wxg_plugin_conf_t *conf, wxg__ar_rules_t **out, char *errstr,
                        size_t errstr_size)
{
    int rc = 0;
    wxg__ar_rules_t *rules = calloc(1, sizeof *rules);
    if (!rules || !(rules->r = calloc(conf->count + 1, sizeof *rules->r))) {
        free(rules);
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    for (size_t i = 0; i < conf->count; i++) {
        long n = rule_number(conf->keys[i]);
        if (n == 0)
            continue;
        /* A key given twice yields its last value (as wxg_plugin_conf_get). */
        const char *v = wxg_plugin_conf_get(conf, conf->keys[i]);
        int seen = 0;
        for (size_t j = 0; j < rules->n; j++)
            seen |= rules->r[j].n == n;
        if (seen)
            continue;
        rule *r = &rules->r[rules->n++];
        r->n = n;
        char why[256] = "";
        if ((rc = parse_rule(v, r, why, sizeof why)) != 0) {
            snprintf(errstr, errstr_size, "plugin.%s.%s: %s", conf->plugin_name, conf->keys[i],
                     why);
            wxg__ar_rules_free(rules);
            return rc;
        }
    }
    qsort(rules->r, rules->n, sizeof *rules->r, by_number);
    *out = rules;
    return 0;
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static int contains(const char *hay, size_t hay_len, const char *needle, size_t n)
{
    if (n == 0 || n > hay_len)
        return 0;
    for (size_t i = 0; i + n <= hay_len; i++) {
        if (hay[i] == needle[0] && memcmp(hay + i, needle, n) == 0)
            return 1;
    }
    return 0;
}

static int rule_matches(const rule *r, const wxg_msg_view_t *msg)
{
    if (r->account && (!msg->account || strcmp(r->account, msg->account) != 0))
        return 0;
    if ((r->chat == CHAT_GROUP && !msg->is_group) || (r->chat == CHAT_PRIVATE && msg->is_group))
        return 0;
    const char *c = msg->content ? msg->content : "";
    size_t len = msg->content ? msg->content_len : 0;
    switch (r->kind) {
    case MATCH_KEYWORD: {
        while (len > 0 && is_blank(*c)) {
            c++;
            len--;
        }
        while (len > 0 && is_blank(c[len - 1]))
            len--;
        return len == r->pattern_len && memcmp(c, r->pattern, len) == 0;
    }
    case MATCH_CONTAINS:
        return contains(c, len, r->pattern, r->pattern_len);
    case MATCH_REGEX:
        return regexec(&r->re, c, 0, NULL, 0) == 0;
    }
    return 0;
}

const char *wxg__ar_rules_match(const wxg__ar_rules_t *rules, const wxg_msg_view_t *msg,
                                long *rule_no)
{
    for (size_t i = 0; rules && i < rules->n; i++) {
        if (rule_matches(&rules->r[i], msg)) {
            if (rule_no)
                *rule_no = rules->r[i].n;
            return rules->r[i].reply;
        }
    }
    return NULL;
}

char *wxg__ar_reply_json(const wxg_msg_view_t *msg, const char *key, const char *content)
{
    char *out = NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (cJSON_AddStringToObject(o, "account", msg->account ? msg->account : "") &&
        cJSON_AddStringToObject(o, "to", msg->conversation ? msg->conversation : "") &&
        cJSON_AddStringToObject(o, "content", content) &&
        (msg->msg_id ? cJSON_AddStringToObject(o, "in_reply_to", msg->msg_id) != NULL
                     : cJSON_AddNullToObject(o, "in_reply_to") != NULL) &&
        cJSON_AddStringToObject(o, "key", key))
        out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

static void autoreply_destroy(void *state)
{
    autoreply_state *s = state;
    if (!s)
        return;
    wxg__ar_rules_free(s->rules);
    free(s->topic);
    free(s);
}

static int autoreply_init(const wxg_plugin_conf_t *conf, void **state, char *errstr,
                          size_t errstr_size)
{
    int rc;
    for (size_t i = 0; i < conf->count; i++) {
        const char *k = conf->keys[i];
        if (strcmp(k, "topic") != 0 && strcmp(k, "ignore.self") != 0 && rule_number(k) == 0) {
            snprintf(errstr, errstr_size,
                     "plugin.autoreply.%s: unknown setting (topic, ignore.self, rule.<n> with n "
                     "in 1..%ld)",
                     k, RULE_MAX_N);
            return WXG_ECONFIG;
        }
    }
    autoreply_state *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    const char *topic = wxg_plugin_conf_get(conf, "topic");
    if (!topic || !*topic) {
        snprintf(errstr, errstr_size,
                 "plugin.autoreply.topic: required (the outbound topic the gateway's sender "
                 "reads)");
        rc = WXG_ECONFIG;
        goto fail;
    }
    if ((rc = wxg_plugin_conf_get_bool(conf, "ignore.self", 1, &s->ignore_self, errstr,
                                       errstr_size)) != 0 ||
        (rc = wxg__ar_rules_parse(conf, &s->rules, errstr, errstr_size)) != 0)
        goto fail;
    if (!(s->topic = strdup(topic))) {
        snprintf(errstr, errstr_size, "out of memory");
        rc = WXG_ENOMEM;
        goto fail;
    }
    *state = s;
    return 0;
fail:
    autoreply_destroy(s);
    return rc;
}

static wxg_plugin_result_t autoreply_handle(void *state, void *thread_state,
                                            const wxg_msg_view_t *msg, wxg_plugin_ctx_t *ctx)
{
    (void)thread_state;
    const autoreply_state *s = state;
    if (s->ignore_self && msg->is_self)
        return WXG_PLUGIN_OK;
    long n = 0;
    const char *reply = wxg__ar_rules_match(s->rules, msg, &n);
    if (!reply)
        return WXG_PLUGIN_OK;
    if (!msg->conversation || !*msg->conversation) {
        wxg_plugin_ctx_set_result(ctx, "no reply: the message names no conversation");
        return WXG_PLUGIN_OK;
    }
    const char *key = wxg_plugin_ctx_key(ctx);
    char *json = wxg__ar_reply_json(msg, key, reply);
    if (!json) {
        wxg_plugin_ctx_set_reason(ctx, "autoreply: out of memory building the reply");
        return WXG_PLUGIN_RETRY;
    }
    char fence[24];
    snprintf(fence, sizeof fence, "%" PRIu64, wxg_plugin_ctx_fence(ctx));
    wxg_plugin_header_t hdr[2] = {
        {"wxg-idempotency-key", key, strlen(key)},
        {"wxg-fence", fence, strlen(fence)},
    };
    int32_t partition = -1;
    int64_t offset = -1;
    int rc = wxg_plugin_ctx_produce_delivery(ctx, s->topic, key, strlen(key), json, strlen(json),
                                             hdr, 2, &partition, &offset);
    free(json);
    if (rc != 0) {
        wxg_plugin_ctx_set_reason(ctx,
                                  "autoreply: producing the reply of rule %ld to %s failed (%s)", n,
                                  s->topic, wxg_plugin_ctx_err_name(ctx, rc));
        return WXG_PLUGIN_RETRY;
    }
    char result[WXG_PLUGIN_RESULT_MAX];
    snprintf(result, sizeof result, "%s/%" PRId32 "/%" PRId64, s->topic, partition, offset);
    wxg_plugin_ctx_set_result(ctx, result);
    return WXG_PLUGIN_OK;
}

static const wxg_plugin_desc_t autoreply_desc = {
    .abi_version = WXG_PLUGIN_ABI_VERSION,
    .name = "autoreply",
    .init = autoreply_init,
    .handle = autoreply_handle,
    .destroy = autoreply_destroy,
};

const wxg_plugin_desc_t *wxg__plugin_autoreply(void)
{
    return &autoreply_desc;
}
