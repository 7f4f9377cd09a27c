/* End to end, with a private Redis server so that the shared one is never disturbed: the
 * compact-marker layout stamp of the replica's key prefix is rewritten with another geometry
 * while the replica runs, as a second deployment with other settings would. Its connections
 * are closed, so that the next call reconnects and checks the stamp again (docs/guard.md
 * §3.5). The replica must stop by itself with exit status 1, saying why in a pipeline_fatal
 * line that names WXG_ECONFIG and in its final fatal line, and commit nothing past the
 * messages it could no longer process: a fatal error is not retried for ever. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consumertest.h"
#include "guardtest.h"
#include "testenv.h"

#define BEFORE  20
#define AFTER   5
#define ID_BASE 7301234570000000000ULL

static size_t ledger_lines(const wxg_ct_t *t)
{
    wxg_ct_effect_t *eff;
    size_t n = wxg_ct_read_ledger(t, &eff, NULL);
    free(eff);
    return n;
}

/* Replaces the stamp under `key` with the same one but one more shard bit. */
static void restamp_with_another_geometry(redisContext *rc, const char *key)
{
    const char *get[] = {"GET", key};
    redisReply *r = gt_cmd(rc, 2, get);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    char stamp[256];
    snprintf(stamp, sizeof stamp, "%s", r->str);
    freeReplyObject(r);
    char *shard = strstr(stamp, "shard=");
    assert_non_null(shard);
    int bits = 0, used = 0;
    assert_int_equal(sscanf(shard, "shard=%d%n", &bits, &used), 1);
    char other[256];
    snprintf(other, sizeof other, "%.*sshard=%d%s", (int)(shard - stamp), stamp, bits + 1,
             shard + used);
    const char *set[] = {"SET", key, other, "KEEPTTL"};
    r = gt_cmd(rc, 4, set);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
}

static void a_layout_stamp_changed_under_a_running_replica_stops_it_with_status_1(void **state)
{
    (void)state;
    wxg_test_redis_t redis;
    assert_int_equal(wxg_test_redis_start(&redis, NULL), 0);
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-fatal", 1);
    t.redis_host = "127.0.0.1";
    t.redis_port = redis.port;
    wxg_ct_write_config(&t, "redis.command.timeout.ms = 500ms\n"
                            "redis.connect.timeout.ms = 500ms\n"
                            "consumer.drain.timeout.ms = 10s\n");

    wxg_ct_msg_t msgs[BEFORE + AFTER];
    for (size_t i = 0; i < BEFORE + AFTER; i++)
        msgs[i] = (wxg_ct_msg_t){.partition = 0, .id = ID_BASE + i, .conv = (int)(i % 7)};
    wxg_ct_spawn(&t, 0);
    wxg_ct_produce(&t, msgs, BEFORE);
    assert_true(wxg_ct_wait_all_committed(&t, 60000, NULL));
    assert_int_equal(ledger_lines(&t), BEFORE);

    redisContext *rc = gt_redis("127.0.0.1", redis.port, NULL);
    char key[128];
    snprintf(key, sizeof key, "%s:layout", t.prefix); /* the consumer adds the colon */
    restamp_with_another_geometry(rc, key);
    /* Every connection but this one: the replica's workers and its watchdog reconnect. */
    const char *kill_cmd[] = {"CLIENT", "KILL", "TYPE", "normal"};
    freeReplyObject(gt_cmd(rc, 4, kill_cmd));
    wxg_ct_produce(&t, msgs + BEFORE, AFTER);

    int st = wxg_ct_wait_exit(&t, 0, 60000);
    wxg_ct_assert_exit(&t, 0, st, 1);
    assert_true(wxg_ct_log_count(&t, 0, "event=pipeline_fatal") > 0);
    assert_true(wxg_ct_log_count(&t, 0, "err=ECONFIG class=fatal") > 0);
    assert_true(wxg_ct_log_count(&t, 0, "event=fatal err=ECONFIG") == 1);
    assert_true(wxg_ct_log_count(&t, 0, "event=stopped") == 1);
    /* Nothing of what came after the mismatch took effect or was committed. */
    assert_int_equal(ledger_lines(&t), BEFORE);
    assert_int_equal(wxg_ct_committed(&t, 0), BEFORE);

    redisFree(rc);
    wxg_ct_teardown(&t);
    wxg_test_redis_stop(&redis);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_layout_stamp_changed_under_a_running_replica_stops_it_with_status_1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
