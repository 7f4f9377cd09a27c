/* Unit tests for lib/log.c: line shape, escaping of CR/LF/control/invalid bytes, value and line
 * bounds, redaction of secrets, ids and content, level filtering, and whole lines under many
 * threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "wxguard/err.h"
#include "wxguard/log.h"
#include "testenv.h"

/* Lines captured by the sink (called with the log lock held, so it needs no lock). */
typedef struct capture {
    char *buf;
    size_t len, cap;
    size_t calls;
} capture;

static capture cap;

static void capture_sink(void *opaque, wxg_log_level_t level, const char *line, size_t len)
{
    capture *c = opaque;
    (void)level;
    if (c->len + len + 1 > c->cap) {
        size_t ncap = (c->cap + len + 1) * 2;
        char *p = realloc(c->buf, ncap);
        assert_non_null(p);
        c->buf = p;
        c->cap = ncap;
    }
    memcpy(c->buf + c->len, line, len);
    c->len += len;
    c->buf[c->len] = '\0';
    c->calls++;
}

static int setup(void **state)
{
    (void)state;
    memset(&cap, 0, sizeof cap);
    wxg_log_set_sink(capture_sink, &cap);
    wxg_log_set_level(WXG_LOG_DEBUG);
    wxg_log_set_format(WXG_LOG_KV);
    wxg_log_set_field_max(256);
    wxg_log_set_personal_ids(0);
    wxg_log_set_content(0);
    wxg_log_set_id_salt(NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    wxg_log_set_sink(NULL, NULL);
    free(cap.buf);
    memset(&cap, 0, sizeof cap);
    return 0;
}

/* The text of the captured output after "event=<event> " up to the newline. */
static const char *fields_after(const char *event)
{
    static char out[WXG_LOG_LINE_MAX];
    char needle[128];
    snprintf(needle, sizeof needle, "event=%s", event);
    const char *p = strstr(cap.buf, needle);
    assert_non_null(p);
    p += strlen(needle);
    if (*p == ' ')
        p++;
    const char *nl = strchr(p, '\n');
    assert_non_null(nl);
    size_t n = (size_t)(nl - p);
    memcpy(out, p, n);
    out[n] = '\0';
    return out;
}

static void assert_matches(const char *text, const char *pattern)
{
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    int rc = regexec(&re, text, 0, NULL, 0);
    regfree(&re);
    if (rc != 0)
        fail_msg("\"%s\" does not match /%s/", text, pattern);
}

static void kv_line_has_timestamp_level_event_and_fields(void **state)
{
    (void)state;
    wxg_log(WXG_LOG_INFO, "claim", WXG_LS("key", "wxid_a:n:17"), WXG_LI("partition", 3),
            WXG_LU("offset", 17), WXG_LB("dup", 0), WXG_LD("ms", 1.5), WXG_LERR(WXG_ETIMEDOUT));
    wxg_log(WXG_LOG_ERROR, "bare");
    assert_int_equal(cap.calls, 2);
    assert_matches(cap.buf, "^ts=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                            "level=info event=claim key=wxid_a:n:17 partition=3 offset=17 "
                            "dup=false ms=1\\.5 err=ETIMEDOUT\n"
                            "ts=[^ ]+ level=error event=bare\n$");
}

static void librdkafka_lines_become_kafka_events_at_their_severity(void **state)
{
    (void)state;
    /* librdkafka passes syslog severities: 3 is an error, 4 a warning, 7 debug. */
    wxg_log_kafka(NULL, 3, "FAIL", "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed");
    wxg_log_kafka(NULL, 4, "MAXPOLL", "Application maximum poll interval exceeded\r\nforged");
    wxg_log_kafka(NULL, 7, "FETCH", NULL);
    assert_int_equal(cap.calls, 3);
    assert_matches(cap.buf, "^ts=[^ ]+ level=error event=kafka facility=FAIL "
                            "message=\"127\\.0\\.0\\.1:9/bootstrap: Connect to "
                            "ipv4#127\\.0\\.0\\.1:9 failed\"\n"
                            "ts=[^ ]+ level=warn event=kafka facility=MAXPOLL message=\"[^\n]*\"\n"
                            "ts=[^ ]+ level=debug event=kafka facility=FETCH message=\"\"\n$");
}

static void kv_values_escape_cr_lf_control_and_invalid_bytes(void **state)
{
    (void)state;
    wxg_log(WXG_LOG_INFO, "e1", WXG_LS("v", "x\r\nts=0 level=error event=forged"));
    assert_string_equal(fields_after("e1"), "v=\"x\\r\\nts=0 level=error event=forged\"");
    wxg_log(WXG_LOG_INFO, "e2", WXG_LS("a", "two words"), WXG_LS("b", "k=v"),
            WXG_LS("c", "say \"hi\" \\o/"), WXG_LS("d", ""), WXG_LS("e", NULL));
    assert_string_equal(fields_after("e2"),
                        "a=\"two words\" b=\"k=v\" c=\"say \\\"hi\\\" \\\\o/\" d=\"\" e=-");
    wxg_log(WXG_LOG_INFO, "e3", WXG_LSN("v", "a\0b\x01\x1b[31m\x7f\tz", 12));
    assert_string_equal(fields_after("e3"), "v=\"a\\x00b\\x01\\x1b[31m\\x7f\\tz\"");
    /* Valid UTF-8 stays readable; invalid bytes and text-reordering characters are escaped. */
    wxg_log(WXG_LOG_INFO, "e4", WXG_LS("name", "\xe4\xbd\xa0\xe5\xa5\xbd"),
            WXG_LS("bad", "a\xff\xc3("),
            WXG_LS("bidi", "abc\xe2\x80\xae"
                           "def"),
            WXG_LS("ls", "x\xe2\x80\xa8y"), WXG_LS("overlong", "\xc0\xaf"));
    assert_string_equal(fields_after("e4"),
                        "name=\"\xe4\xbd\xa0\xe5\xa5\xbd\" bad=\"a\\xff\\xc3(\" "
                        "bidi=\"abc\\u202edef\" ls=\"x\\u2028y\" "
                        "overlong=\"\\xc0\\xaf\"");
    /* Names are reduced to a safe charset too. */
    wxg_log(WXG_LOG_INFO, "e5", WXG_LI("bad name=\n", 1));
    assert_string_equal(fields_after("e5"), "bad_name__=1");
    /* The event is escaped like a value. */
    wxg_log(WXG_LOG_INFO, "ev\nx", WXG_LI("n", 1));
    assert_non_null(strstr(cap.buf, "event=\"ev\\nx\" n=1\n"));
    /* No line holds a raw control byte other than its final newline. */
    size_t lines = 0;
    for (const char *p = cap.buf; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '\n')
            lines++;
        else
            assert_true(c >= 0x20 && c != 0x7f);
    }
    assert_int_equal(lines, cap.calls);
}

static void json_lines_parse_and_keep_the_values(void **state)
{
    (void)state;
    wxg_log_set_format(WXG_LOG_JSON);
    wxg_log(WXG_LOG_WARN, "lease_lost", WXG_LS("key", "k\"1\\\n\x01"), WXG_LI("partition", -1),
            WXG_LU("fence", 18446744073709551615ULL), WXG_LB("ok", 1), WXG_LD("nan", 0.0 / 0.0),
            WXG_LS("bad", "\xff"), WXG_LSECRET("password"), WXG_LERR(WXG_ELEASELOST),
            WXG_LS("nul", NULL));
    assert_int_equal(cap.calls, 1);
    assert_non_null(strstr(cap.buf, "\\u0001"));
    cJSON *j = cJSON_Parse(cap.buf);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "level")->valuestring, "warn");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "event")->valuestring, "lease_lost");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "key")->valuestring, "k\"1\\\n\x01");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "partition")->valuedouble, -1);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ok")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "nan")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "nul")));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "bad")->valuestring, "\\xff");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "password")->valuestring, "***");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "err")->valuestring, "ELEASELOST");
    assert_non_null(strstr(cap.buf, "\"fence\":18446744073709551615,"));
    cJSON_Delete(j);
}

static void values_and_lines_are_bounded(void **state)
{
    (void)state;
    char big[5000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    wxg_log_set_field_max(16);
    wxg_log(WXG_LOG_INFO, "cut", WXG_LS("v", big), WXG_LS("w", "\n\n\n\n\n\n\n\n\n"));
    /* Escapes count toward the bound and are never split. */
    assert_string_equal(fields_after("cut"),
                        "v=aaaaaaaaaaaaaaaa... w=\"\\n\\n\\n\\n\\n\\n\\n\\n...\"");

    wxg_log_set_field_max(4096);
    cap.len = 0;
    wxg_log(WXG_LOG_INFO, "long", WXG_LS("f1", big), WXG_LS("f2", big), WXG_LS("f3", big),
            WXG_LS("f4", big), WXG_LS("f5", big), WXG_LI("last", 7));
    assert_true(cap.len <= WXG_LOG_LINE_MAX);
    assert_int_equal(cap.buf[cap.len - 1], '\n');
    assert_non_null(strstr(cap.buf, " f3="));
    assert_null(strstr(cap.buf, " f4="));
    /* A later small field still fits; the line says it lost something. */
    assert_non_null(strstr(cap.buf, " last=7 truncated=true\n"));

    wxg_log_set_format(WXG_LOG_JSON);
    cap.len = 0;
    wxg_log(WXG_LOG_INFO, "long", WXG_LS("f1", big), WXG_LS("f2", big), WXG_LS("f3", big),
            WXG_LS("f4", big), WXG_LS("f5", big));
    cJSON *j = cJSON_Parse(cap.buf);
    assert_non_null(j);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "truncated")));
    cJSON_Delete(j);
}

static int evaluated;
static int side_effect(void)
{
    evaluated++;
    return 1;
}

static void levels_below_the_threshold_are_dropped_unevaluated(void **state)
{
    (void)state;
    wxg_log_set_level(WXG_LOG_WARN);
    evaluated = 0;
    wxg_log(WXG_LOG_INFO, "quiet", WXG_LI("x", side_effect()));
    wxg_log(WXG_LOG_DEBUG, "quiet");
    assert_int_equal(cap.calls, 0);
    assert_int_equal(evaluated, 0);
    wxg_log(WXG_LOG_ERROR, "loud", WXG_LI("x", side_effect()));
    assert_int_equal(cap.calls, 1);
    assert_int_equal(evaluated, 1);
    wxg_log_set_level(WXG_LOG_OFF);
    wxg_log(WXG_LOG_ERROR, "off");
    assert_int_equal(cap.calls, 1);
    assert_int_equal(wxg_log_get_level(), WXG_LOG_OFF);

    wxg_log_level_t l;
    assert_int_equal(wxg_log_level_parse("WARNING", &l), 0);
    assert_int_equal(l, WXG_LOG_WARN);
    assert_int_equal(wxg_log_level_parse("debug", &l), 0);
    assert_int_equal(l, WXG_LOG_DEBUG);
    assert_int_equal(wxg_log_level_parse("loud", &l), WXG_EINVAL);
    wxg_log_format_t f;
    assert_int_equal(wxg_log_format_parse("json", &f), 0);
    assert_int_equal(f, WXG_LOG_JSON);
    assert_int_equal(wxg_log_format_parse("xml", &f), WXG_EINVAL);
    assert_int_equal(wxg_log_level_from_syslog(3), WXG_LOG_ERROR);
    assert_int_equal(wxg_log_level_from_syslog(4), WXG_LOG_WARN);
    assert_int_equal(wxg_log_level_from_syslog(6), WXG_LOG_INFO);
    assert_int_equal(wxg_log_level_from_syslog(7), WXG_LOG_DEBUG);
}

static void secrets_ids_and_content_stay_out_unless_asked(void **state)
{
    (void)state;
    const char *content = "hello, my card number is 1234";
    wxg_log(WXG_LOG_INFO, "r1", WXG_LSECRET("redis_password"), WXG_LID("sender", "wxid_alice"),
            WXG_LCONTENT("content", content, strlen(content)));
    const char *f = fields_after("r1");
    assert_matches(f, "^redis_password=\\*\\*\\* sender=h:[0-9a-f]{12} "
                      "content=\"\\[29 bytes\\]\"$");
    assert_null(strstr(cap.buf, "alice"));
    assert_null(strstr(cap.buf, "card"));

    /* The hash is stable for one salt and changes with the salt. */
    char h1[32], h2[32], h3[32];
    wxg_log_hash_id("wxid_alice", 10, h1, sizeof h1);
    wxg_log_hash_id("wxid_alice", 10, h2, sizeof h2);
    assert_string_equal(h1, h2);
    assert_non_null(strstr(f, h1));
    wxg_log_set_id_salt("pepper");
    wxg_log_hash_id("wxid_alice", 10, h3, sizeof h3);
    assert_string_not_equal(h1, h3);
    wxg_log_hash_id("wxid_alice", 10, h2, 4); /* too small: a marker, never the id */
    assert_string_equal(h2, "h:?");

    wxg_log_set_personal_ids(1);
    wxg_log_set_content(1);
    wxg_log(WXG_LOG_DEBUG, "r2", WXG_LID("sender", "wxid_alice"),
            WXG_LCONTENT("content", "hi\nthere", 8), WXG_LSECRET("pw"));
    assert_string_equal(fields_after("r2"), "sender=wxid_alice content=\"hi\\nthere\" pw=***");
}

#define THREADS 8
#define LINES   2000

static void *log_many(void *arg)
{
    long t = (long)(intptr_t)arg;
    char pad[200];
    memset(pad, 'a' + (int)t, sizeof pad - 1);
    pad[sizeof pad - 1] = '\0';
    for (long i = 0; i < LINES; i++)
        wxg_log(WXG_LOG_INFO, "tick", WXG_LI("thread", t), WXG_LI("seq", i), WXG_LS("pad", pad),
                WXG_LS("note", "a b\nc"));
    return NULL;
}

static void concurrent_lines_never_interleave(void **state)
{
    (void)state;
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, log_many, (void *)(intptr_t)t), 0);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    assert_int_equal(cap.calls, THREADS * LINES);

    regex_t re;
    assert_int_equal(regcomp(&re,
                             "^ts=[^ ]+ level=info event=tick thread=([0-9]) seq=([0-9]+) "
                             "pad=([a-h]{199}) note=\"a b\\\\nc\"$",
                             REG_EXTENDED),
                     0);
    long next[THREADS] = {0};
    size_t lines = 0;
    char *save = NULL;
    for (char *line = strtok_r(cap.buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        regmatch_t m[4];
        if (regexec(&re, line, 4, m, 0) != 0)
            fail_msg("malformed line: %.300s", line);
        long t = strtol(line + m[1].rm_so, NULL, 10);
        long seq = strtol(line + m[2].rm_so, NULL, 10);
        assert_int_equal(line[m[3].rm_so], 'a' + t); /* the padding belongs to the same thread */
        assert_int_equal(seq, next[t]);              /* each thread's lines stay in order */
        next[t]++;
        lines++;
    }
    regfree(&re);
    assert_int_equal(lines, THREADS * LINES);
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(next[t], LINES);
}

static void default_sink_writes_whole_lines_to_stderr(void **state)
{
    (void)state;
    char *dir = wxg_test_mkdtemp("wxg-log");
    assert_non_null(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/stderr.log", dir);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
    assert_true(fd >= 0);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    wxg_log_set_sink(NULL, NULL);
    wxg_log(WXG_LOG_INFO, "to_stderr", WXG_LI("n", 42));
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    char buf[512] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    assert_true(n > 0);
    assert_matches(buf, "^ts=[^ ]+ level=info event=to_stderr n=42\n$");

    /* The FILE sink writes the same line. */
    FILE *f = fopen(path, "w+");
    assert_non_null(f);
    wxg_log_set_sink(wxg_log_sink_file, f);
    wxg_log(WXG_LOG_WARN, "to_file");
    wxg_log_set_sink(capture_sink, &cap);
    rewind(f);
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    assert_matches(buf, "^ts=[^ ]+ level=warn event=to_file\n$");
    wxg_test_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(kv_line_has_timestamp_level_event_and_fields, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(kv_values_escape_cr_lf_control_and_invalid_bytes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(json_lines_parse_and_keep_the_values, setup, teardown),
        cmocka_unit_test_setup_teardown(values_and_lines_are_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(levels_below_the_threshold_are_dropped_unevaluated, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(secrets_ids_and_content_stay_out_unless_asked, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(concurrent_lines_never_interleave, setup, teardown),
        cmocka_unit_test_setup_teardown(default_sink_writes_whole_lines_to_stderr, setup, teardown),
        cmocka_unit_test_setup_teardown(librdkafka_lines_become_kafka_events_at_their_severity,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
