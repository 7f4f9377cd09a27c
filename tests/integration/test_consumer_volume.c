/* End to end: two wxguard-consumer replicas of one group read 10,000 callbacks over 6
 * partitions, 30% of them duplicates. Every unique message gets exactly one effect in the record
 * plugin's ledger, every committed offset reaches the end offset, and a committed offset sampled
 * during the run never passes a message whose effect is missing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "consumertest.h"
#include "testenv.h"

#define TOTAL      10000
#define PARTITIONS 6
#define CONVS      240
#define ID_BASE    7301234567890000000ULL

static uint64_t *offset_ids[PARTITIONS];

static void check_invariant(wxg_ct_t *t)
{
    wxg_ct_check_commit_invariant(t, offset_ids);
}

static void every_unique_message_has_one_effect_and_offsets_reach_the_end(void **state)
{
    (void)state;
    wxg_ct_t t;
    wxg_ct_setup(&t, "ct-volume", PARTITIONS);
    wxg_ct_write_config(&t, "consumer.workers = 4\nconsumer.batch.max = 64\n");
    wxg_ct_spawn(&t, 0);
    wxg_ct_spawn(&t, 1);

    static wxg_ct_msg_t msgs[TOTAL];
    size_t unique = 0;
    unsigned seed = 42;
    for (size_t i = 0; i < TOTAL; i++) {
        if (i > 0 && rand_r(&seed) % 100 < 30) {
            msgs[i] = msgs[(size_t)rand_r(&seed) % i]; /* a duplicate of an earlier record */
        } else {
            int conv = rand_r(&seed) % CONVS;
            msgs[i] = (wxg_ct_msg_t){
                .partition = conv % PARTITIONS, .id = ID_BASE + unique, .conv = conv};
            unique++;
        }
    }
    size_t count[PARTITIONS] = {0};
    for (int p = 0; p < PARTITIONS; p++) {
        offset_ids[p] = calloc(TOTAL, sizeof **offset_ids);
        assert_non_null(offset_ids[p]);
    }
    for (size_t i = 0; i < TOTAL; i++)
        offset_ids[msgs[i].partition][count[msgs[i].partition]++] = msgs[i].id;

    /* Feed in chunks while both replicas run, checking the commit invariant in between. */
    for (size_t at = 0; at < TOTAL; at += 1000) {
        wxg_ct_produce(&t, msgs + at, 1000);
        check_invariant(&t);
    }
    assert_true(wxg_ct_wait_all_committed(&t, 120000, check_invariant));
    check_invariant(&t);

    wxg_ct_effect_t *eff;
    size_t torn = 0;
    size_t n = wxg_ct_read_ledger(&t, &eff, &torn);
    assert_int_equal(torn, 0);
    assert_int_equal(n, unique);
    unsigned char *seen = calloc(unique, 1);
    assert_non_null(seen);
    for (size_t i = 0; i < n; i++) {
        assert_true(eff[i].id >= ID_BASE && eff[i].id < ID_BASE + unique);
        assert_int_equal(seen[eff[i].id - ID_BASE], 0);
        seen[eff[i].id - ID_BASE] = 1;
    }
    free(seen);
    free(eff);

    /* Both replicas stop cleanly on SIGTERM (exit 0). */
    int st0 = wxg_ct_signal(&t, 0, SIGTERM, 60000);
    int st1 = wxg_ct_signal(&t, 1, SIGTERM, 60000);
    wxg_ct_assert_exit(&t, 0, st0, 0);
    wxg_ct_assert_exit(&t, 1, st1, 0);
    for (int p = 0; p < PARTITIONS; p++)
        free(offset_ids[p]);
    print_message("%d records, %zu unique messages, one effect each\n", TOTAL, unique);
    wxg_ct_teardown(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_unique_message_has_one_effect_and_offsets_reach_the_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
