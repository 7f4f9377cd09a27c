/*
 * Test support: a private wxguard-devbroker (librdkafka's mock cluster in its own process) for
 * fault tests, driven through its command lines on stdin (docs/devbroker.md).
 *
 * The broker is a child process, stopped by PID, and killed by the kernel should the test
 * process die first. wxg_test_devbroker_start() also points WXG_TEST_KAFKA_BOOTSTRAP at it,
 * so that testkafka.h and consumertest.h talk to it instead of the shared broker.
 *
 * Every function fails the current cmocka test on error. Call from the test's main thread.
 */
#ifndef WXG_TESTDEVBROKER_H
#define WXG_TESTDEVBROKER_H

#include <sys/types.h>

typedef struct wxg_test_devbroker {
    pid_t pid;
    int cmd_fd; /* its stdin */
    int ans_fd; /* its stdout */
    char bootstrap[512];
} wxg_test_devbroker_t;

/* Starts a broker with `brokers` brokers (ids 1..brokers) and waits for its address. */
void wxg_test_devbroker_start(wxg_test_devbroker_t *db, int brokers);

/* Sends one command line (printf-style) and asserts that the answer starts with "ok". */
void wxg_test_devbroker_cmd(wxg_test_devbroker_t *db, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Stops the broker (SIGTERM, then SIGKILL after 10 s) and waits for it. Safe to call twice. */
void wxg_test_devbroker_stop(wxg_test_devbroker_t *db);

#endif /* WXG_TESTDEVBROKER_H */
