/* A minimal HTTP/1.1 client for tests; see testhttp.h. */
#include "testhttp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "testenv.h"

#define READ_MAX ((size_t)64 << 20)

/* Decodes a chunked body in place; returns its length or -1. */
static long dechunk(char *b, size_t len)
{
    size_t in = 0, out = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        char *end = NULL;
        unsigned long sz = strtoul(b + in, &end, 16);
        char *crlf = strstr(b + in, "\r\n");
        if (end == b + in || crlf == NULL)
            return -1;
        in = (size_t)(crlf - b) + 2;
        if (sz == 0)
            return (long)out;
        if (in + sz > len)
            return -1;
        memmove(b + out, b + in, sz);
        out += sz;
        in += sz + 2;
    }
    return -1;
}

static int exchange(int port, const char *head, size_t head_len, const void *body, size_t body_len,
                    wxg_test_http_resp_t *out)
{
    int rc = -1;
    size_t cap = 65536, len = 0;
    char *buf = NULL;
    memset(out, 0, sizeof *out);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 5 * wxg_test_scale(), .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        goto out;
    /* A server may answer (413, 503) and close before the whole body is written: a failed write
     * is not yet a failed exchange, the answer may be waiting. */
    if (wxg_test_send_all(fd, head, head_len) == 0 && body_len > 0)
        (void)wxg_test_send_all(fd, body, body_len);
    buf = malloc(cap);
    if (buf == NULL)
        goto out;
    for (;;) { /* bounded by READ_MAX and the receive timeout */
        if (len + 1 == cap) {
            if (cap >= READ_MAX)
                goto out;
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL)
                goto out;
            buf = nb;
            cap *= 2;
        }
        ssize_t got = recv(fd, buf + len, cap - 1 - len, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break; /* closed, reset or timed out: parse what came */
        len += (size_t)got;
    }
    buf[len] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    if (end == NULL || sscanf(buf, "HTTP/1.%*d %d", &out->status) != 1)
        goto out;
    size_t hl = (size_t)(end - buf);
    out->headers = malloc(hl + 1);
    if (out->headers == NULL)
        goto out;
    memcpy(out->headers, buf, hl);
    out->headers[hl] = '\0';
    char *b = end + 4;
    size_t bl = len - (size_t)(b - buf);
    char te[64];
    if (wxg_test_http_header(out, "Transfer-Encoding", te, sizeof te) != NULL &&
        strcasecmp(te, "chunked") == 0) {
        long d = dechunk(b, bl);
        if (d < 0)
            goto out;
        bl = (size_t)d;
    }
    out->body = malloc(bl + 1);
    if (out->body == NULL)
        goto out;
    memcpy(out->body, b, bl);
    out->body[bl] = '\0';
    out->body_len = bl;
    rc = 0;
out:
    free(buf);
    close(fd);
    if (rc != 0)
        wxg_test_http_free(out);
    return rc;
}

int wxg_test_http(int port, const char *method, const char *target, const char *extra_headers,
                  const void *body, size_t body_len, wxg_test_http_resp_t *out)
{
    char head[8192];
    int n;
    if (body != NULL)
        n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%sContent-Length: "
                     "%zu\r\n\r\n",
                     method, target, extra_headers ? extra_headers : "", body_len);
    else
        n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s\r\n", method,
                     target, extra_headers ? extra_headers : "");
    if (n < 0 || (size_t)n >= sizeof head) {
        memset(out, 0, sizeof *out);
        return -1;
    }
    return exchange(port, head, (size_t)n, body, body != NULL ? body_len : 0, out);
}

int wxg_test_http_raw(int port, const void *raw, size_t raw_len, wxg_test_http_resp_t *out)
{
    return exchange(port, raw, raw_len, NULL, 0, out);
}

const char *wxg_test_http_header(const wxg_test_http_resp_t *resp, const char *name, char *buf,
                                 size_t size)
{
    if (resp->headers == NULL || size == 0)
        return NULL;
    size_t nl = strlen(name);
    const char *line = strstr(resp->headers, "\r\n");
    while (line != NULL) {
        line += 2;
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            const char *e = strstr(v, "\r\n");
            size_t vl = e ? (size_t)(e - v) : strlen(v);
            if (vl >= size)
                vl = size - 1;
            memcpy(buf, v, vl);
            buf[vl] = '\0';
            return buf;
        }
        line = strstr(line, "\r\n");
    }
    return NULL;
}

void wxg_test_http_free(wxg_test_http_resp_t *resp)
{
    if (resp == NULL)
        return;
    free(resp->headers);
    free(resp->body);
    memset(resp, 0, sizeof *resp);
}

int wxg_test_http_get(int port, const char *path, char **body)
{
    wxg_test_http_resp_t r;
    if (body)
        *body = NULL;
    if (wxg_test_http(port, "GET", path, NULL, NULL, 0, &r) != 0)
        return 0;
    int st = r.status;
    if (body)
        *body = strdup(r.body ? r.body : "");
    wxg_test_http_free(&r);
    return st;
}

int wxg_test_http_wait_status(int port, const char *path, int status, int64_t timeout_ms,
                              char **body)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    for (;;) {
        char *b = NULL;
        int st = wxg_test_http_get(port, path, &b);
        if (st == status) {
            if (body)
                *body = b;
            else
                free(b);
            return 1;
        }
        free(b);
        if (wxg_test_now_ms() >= deadline)
            return 0;
        wxg_test_sleep_ms(100);
    }
}

double wxg_test_metric_sample(const char *body, const char *series)
{
    size_t n = strlen(series);
    for (const char *l = body; l && *l;) {
        if (strncmp(l, series, n) == 0 && l[n] == ' ')
            return strtod(l + n + 1, NULL);
        l = strchr(l, '\n');
        if (l)
            l++;
    }
    return -1;
}

double wxg_test_metric_scrape(int port, const char *series)
{
    char *b = NULL;
    double v =
        wxg_test_http_get(port, "/metrics", &b) == 200 ? wxg_test_metric_sample(b, series) : -1;
    free(b);
    return v;
}

int wxg_test_metric_wait(int port, const char *series, double want, int64_t timeout_ms)
{
    int64_t deadline = wxg_test_now_ms() + timeout_ms * wxg_test_scale();
    for (;;) {
        if (wxg_test_metric_scrape(port, series) == want)
            return 1;
        if (wxg_test_now_ms() >= deadline)
            return 0;
        wxg_test_sleep_ms(100);
    }
}
