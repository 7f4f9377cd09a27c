/*
 * DESIGN: a preload library for the chaos tests that plays librdkafka 2.0.2's never-answered
 * requests. With STUCK_RELEASE=1 in the environment, rd_kafka_assign(rk, NULL) and
 * rd_kafka_incremental_unassign() block for ever, as they do when the group thread purged the
 * request unanswered (a group terminating after a commit refused with UNKNOWN_MEMBER_ID). With
 * STUCK_RESUME=<path>, rd_kafka_resume_partitions() blocks for ever once that file exists, as a
 * resume of a partition nobody serves any more does; before, it resumes (the test decides when
 * the fault begins). Every other call goes to the real library. Loaded into a wxguard-consumer
 * replica with LD_PRELOAD (tests/chaos/test_chaos_stop_member_lost.c); the replica must still
 * end within its budget.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <librdkafka/rdkafka.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int stuck(void)
{
    const char *v = getenv("STUCK_RELEASE");
    return v && strcmp(v, "1") == 0;
}

static void block_for_ever(void)
{
    for (;;)
        pause();
}

rd_kafka_resp_err_t rd_kafka_assign(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *parts)
{
    if (!parts && stuck())
        block_for_ever();
    rd_kafka_resp_err_t (*real)(rd_kafka_t *, const rd_kafka_topic_partition_list_t *);
    *(void **)&real = dlsym(RTLD_NEXT, "rd_kafka_assign");
    return real(rk, parts);
}

rd_kafka_error_t *rd_kafka_incremental_unassign(rd_kafka_t *rk,
                                                const rd_kafka_topic_partition_list_t *parts)
{
    if (stuck())
        block_for_ever();
    rd_kafka_error_t *(*real)(rd_kafka_t *, const rd_kafka_topic_partition_list_t *);
    *(void **)&real = dlsym(RTLD_NEXT, "rd_kafka_incremental_unassign");
    return real(rk, parts);
}

rd_kafka_resp_err_t rd_kafka_resume_partitions(rd_kafka_t *rk,
                                               rd_kafka_topic_partition_list_t *parts)
{
    const char *path = getenv("STUCK_RESUME");
    struct stat st;
    if (path && path[0] && stat(path, &st) == 0)
        block_for_ever();
    rd_kafka_resp_err_t (*real)(rd_kafka_t *, rd_kafka_topic_partition_list_t *);
    *(void **)&real = dlsym(RTLD_NEXT, "rd_kafka_resume_partitions");
    return real(rk, parts);
}
