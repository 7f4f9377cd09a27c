/*
 * DESIGN: test support for the development broker (see testdevbroker.h). The broker runs as a
 * fork/exec'd child with pipes on its stdin and stdout; a command is one line written to the
 * pipe, its answer one line read back within a bounded time. Its stderr is the test's.
 */
#include "testdevbroker.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testenv.h"

#define ANSWER_TIMEOUT_MS 10000

/* Reads one line from fd into buf (without the newline) within timeout_ms. Returns 0 or -1. */
static int read_line(int fd, char *buf, size_t size, int64_t timeout_ms)
{
    size_t n = 0;
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    while (n + 1 < size) {
        int64_t left = deadline - wxg_test_now_ms();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        char c;
        ssize_t got = read(fd, &c, 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        if (c == '\n') {
            buf[n] = '\0';
            return 0;
        }
        buf[n++] = c;
    }
    return -1;
}

void wxg_test_devbroker_start(wxg_test_devbroker_t *db, int brokers)
{
    memset(db, 0, sizeof *db);
    db->cmd_fd = db->ans_fd = -1;
    const char *bin = getenv("WXG_BINARY_DIR");
    assert_non_null(bin);
    char path[512], nb[16];
    snprintf(path, sizeof path, "%s/cmd/wxguard-devbroker/wxguard-devbroker", bin);
    snprintf(nb, sizeof nb, "%d", brokers);
    int in[2], out[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execl(path, path, "--brokers", nb, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    db->pid = pid;
    db->cmd_fd = in[1];
    db->ans_fd = out[0];
    if (read_line(db->ans_fd, db->bootstrap, sizeof db->bootstrap, ANSWER_TIMEOUT_MS) != 0 ||
        !strchr(db->bootstrap, ':')) {
        wxg_test_devbroker_stop(db);
        fail_msg("%s did not print its bootstrap address", path);
    }
    assert_int_equal(setenv("WXG_TEST_KAFKA_BOOTSTRAP", db->bootstrap, 1), 0);
}

void wxg_test_devbroker_cmd(wxg_test_devbroker_t *db, const char *fmt, ...)
{
    char line[1024], ans[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && (size_t)n < sizeof line - 1);
    line[n++] = '\n';
    assert_int_equal(write(db->cmd_fd, line, (size_t)n), n);
    line[n - 1] = '\0';
    if (read_line(db->ans_fd, ans, sizeof ans, ANSWER_TIMEOUT_MS) != 0)
        fail_msg("devbroker gave no answer to '%s'", line);
    if (strncmp(ans, "ok", 2) != 0)
        fail_msg("devbroker refused '%s': %s", line, ans);
}

void wxg_test_devbroker_stop(wxg_test_devbroker_t *db)
{
    if (db->pid > 0) {
        kill(db->pid, SIGTERM);
        int64_t deadline = wxg_test_now_ms() + 10000;
        int st;
        while (waitpid(db->pid, &st, WNOHANG) == 0) {
            if (wxg_test_now_ms() > deadline) {
                kill(db->pid, SIGKILL);
                waitpid(db->pid, &st, 0);
                break;
            }
            wxg_test_sleep_ms(20);
        }
        db->pid = 0;
    }
    if (db->cmd_fd >= 0)
        close(db->cmd_fd);
    if (db->ans_fd >= 0)
        close(db->ans_fd);
    db->cmd_fd = db->ans_fd = -1;
}
