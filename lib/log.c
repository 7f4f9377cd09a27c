/*
 * DESIGN: logging.
 *
 * Purpose: one line per event, key=value (logfmt) or JSON, with every value escaped so that
 * nothing a message carries can break a line, forge one, or hide text from the reader (CWE-117),
 * and with personal data (ids, content) and secrets kept out unless a debug option asks.
 *
 * Threads and locks: the settings are atomics, read without a lock on every call. A line is
 * formatted into a buffer on the caller's stack, so threads format in parallel; only the hand-off
 * to the sink runs under `sink_mu`, one sink call per line, so lines never interleave and a sink
 * may be swapped at any time. The id-hash salt is copied out under `salt_mu`.
 *
 * Failure modes: nothing here fails loudly. A value longer than the field bound is cut and marked
 * with "..."; a field that does not fit in the line is left out and the line gets truncated=true;
 * a failed or short write(2) to stderr is retried on EINTR and otherwise dropped; if the hash
 * context cannot be allocated the id prints as "h:?" (never as the raw id).
 */
#include "wxguard/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "wxguard/err.h"

#define FIELD_MAX_MIN   16
#define FIELD_MAX_LIMIT 4096
#define NAME_MAX_BYTES  64
#define SALT_MAX        256
/* Room kept at the end of the line for the truncation marker and the closing brace. */
#define LINE_RESERVE 32

static atomic_int cur_level = WXG_LOG_INFO;
static atomic_int cur_format = WXG_LOG_KV;
static atomic_int personal_ids;
static atomic_int log_content;
static atomic_size_t field_max = 256;

static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER;
static wxg_log_sink_fn sink_fn;
static void *sink_opaque;

static pthread_mutex_t salt_mu = PTHREAD_MUTEX_INITIALIZER;
static char salt[SALT_MAX];
static size_t salt_len;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

/* ---- settings ------------------------------------------------------------------------------ */

int wxg_log_enabled(wxg_log_level_t level)
{
    return (int)level >= atomic_load_explicit(&cur_level, memory_order_relaxed) &&
           level < WXG_LOG_OFF;
}

void wxg_log_set_level(wxg_log_level_t level)
{
    if ((int)level < WXG_LOG_DEBUG || level > WXG_LOG_OFF)
        return;
    atomic_store(&cur_level, (int)level);
}

wxg_log_level_t wxg_log_get_level(void)
{
    return (wxg_log_level_t)atomic_load(&cur_level);
}

void wxg_log_set_format(wxg_log_format_t format)
{
    if (format == WXG_LOG_KV || format == WXG_LOG_JSON)
        atomic_store(&cur_format, (int)format);
}

void wxg_log_set_field_max(size_t bytes)
{
    if (bytes < FIELD_MAX_MIN)
        bytes = FIELD_MAX_MIN;
    if (bytes > FIELD_MAX_LIMIT)
        bytes = FIELD_MAX_LIMIT;
    atomic_store(&field_max, bytes);
}

void wxg_log_set_personal_ids(int on)
{
    atomic_store(&personal_ids, on ? 1 : 0);
}

void wxg_log_set_content(int on)
{
    atomic_store(&log_content, on ? 1 : 0);
}

void wxg_log_set_id_salt(const char *s)
{
    pthread_mutex_lock(&salt_mu);
    explicit_bzero(salt, sizeof salt);
    salt_len = 0;
    if (s != NULL) {
        salt_len = strnlen(s, SALT_MAX);
        memcpy(salt, s, salt_len);
    }
    pthread_mutex_unlock(&salt_mu);
}

void wxg_log_set_sink(wxg_log_sink_fn fn, void *opaque)
{
    pthread_mutex_lock(&sink_mu);
    sink_fn = fn;
    sink_opaque = opaque;
    pthread_mutex_unlock(&sink_mu);
}

void wxg_log_sink_file(void *opaque, wxg_log_level_t level, const char *line, size_t len)
{
    FILE *f = opaque;
    (void)level;
    if (f == NULL)
        return;
    fwrite(line, 1, len, f);
    fflush(f);
}

int wxg_log_level_parse(const char *name, wxg_log_level_t *out)
{
    if (name == NULL || out == NULL)
        return WXG_EINVAL;
    for (int i = WXG_LOG_DEBUG; i <= WXG_LOG_ERROR; i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            *out = (wxg_log_level_t)i;
            return 0;
        }
    }
    if (strcasecmp(name, "warning") == 0) {
        *out = WXG_LOG_WARN;
        return 0;
    }
    return WXG_EINVAL;
}

const char *wxg_log_level_name(wxg_log_level_t level)
{
    if ((int)level < WXG_LOG_DEBUG || level > WXG_LOG_OFF)
        return "unknown";
    return level_names[level];
}

int wxg_log_format_parse(const char *name, wxg_log_format_t *out)
{
    if (name == NULL || out == NULL)
        return WXG_EINVAL;
    if (strcmp(name, "kv") == 0) {
        *out = WXG_LOG_KV;
        return 0;
    }
    if (strcmp(name, "json") == 0) {
        *out = WXG_LOG_JSON;
        return 0;
    }
    return WXG_EINVAL;
}

wxg_log_level_t wxg_log_level_from_syslog(int severity)
{
    if (severity <= 3) /* emerg, alert, crit, err */
        return WXG_LOG_ERROR;
    if (severity == 4) /* warning */
        return WXG_LOG_WARN;
    if (severity <= 6) /* notice, info */
        return WXG_LOG_INFO;
    return WXG_LOG_DEBUG;
}

void wxg_log_kafka(const struct rd_kafka_s *rk, int severity, const char *facility,
                   const char *message)
{
    (void)rk;
    wxg_log(wxg_log_level_from_syslog(severity), "kafka",
            WXG_LS("facility", facility ? facility : ""),
            WXG_LS("message", message ? message : ""));
}

void wxg_log_hash_id(const char *id, size_t len, char *out, size_t out_size)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    char s[SALT_MAX];
    size_t slen;
    int ok = 0;

    if (out == NULL || out_size == 0)
        return;
    pthread_mutex_lock(&salt_mu);
    slen = salt_len;
    memcpy(s, salt, slen);
    pthread_mutex_unlock(&salt_mu);

    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
        EVP_DigestUpdate(ctx, s, slen) == 1 && EVP_DigestUpdate(ctx, "", 1) == 1 &&
        EVP_DigestUpdate(ctx, id != NULL ? id : "", id != NULL ? len : 0) == 1 &&
        EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen >= WXG_LOG_HASH_HEX / 2)
        ok = 1;
    EVP_MD_CTX_free(ctx);
    explicit_bzero(s, sizeof s);

    if (!ok || out_size < WXG_LOG_HASH_HEX + 3) {
        snprintf(out, out_size, "h:?");
        return;
    }
    out[0] = 'h';
    out[1] = ':';
    for (size_t i = 0; i < WXG_LOG_HASH_HEX / 2; i++) {
        out[2 + 2 * i] = hex[md[i] >> 4];
        out[3 + 2 * i] = hex[md[i] & 0xf];
    }
    out[2 + WXG_LOG_HASH_HEX] = '\0';
}

/* ---- formatting ---------------------------------------------------------------------------- */

typedef struct wbuf {
    char *p;
    size_t len;
    size_t cap;
    int overflow;
} wbuf;

static void put(wbuf *b, const char *s, size_t n)
{
    if (b->overflow || n > b->cap - b->len) {
        b->overflow = 1;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void puts_(wbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* Decodes one UTF-8 sequence at s (n bytes left). Returns its length and the code point, or 0
 * for an invalid, overlong or truncated sequence or a surrogate. */
static size_t utf8_decode(const unsigned char *s, size_t n, unsigned *cp)
{
    unsigned c = s[0];
    size_t len;
    unsigned v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xe0) == 0xc0) {
        len = 2, v = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        len = 3, v = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return len;
}

/* Code points that are valid but would hide, reorder or break text on a terminal. */
static int cp_is_dangerous(unsigned cp)
{
    return (cp >= 0x80 && cp <= 0x9f) || cp == 0x200e || cp == 0x200f || cp == 0x2028 ||
           cp == 0x2029 || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069) ||
           cp == 0xfeff;
}

/* Appends the escaped form of s[0..n) without quotes, at most `max` bytes of output; a cut value
 * ends in "...". */
static void put_escaped(wbuf *b, const unsigned char *s, size_t n, int json, size_t max)
{
    size_t out = 0;
    char tmp[16];
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        unsigned cp = 0;
        size_t step = 1;
        const char *unit = tmp;
        size_t ulen;
        if (c == '"') {
            unit = "\\\"";
        } else if (c == '\\') {
            unit = "\\\\";
        } else if (c == '\n') {
            unit = "\\n";
        } else if (c == '\r') {
            unit = "\\r";
        } else if (c == '\t') {
            unit = "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, json ? "\\u%04x" : "\\x%02x", c);
        } else if (c < 0x80) {
            tmp[0] = (char)c;
            tmp[1] = '\0';
        } else if ((step = utf8_decode(s + i, n - i, &cp)) == 0) {
            step = 1;
            snprintf(tmp, sizeof tmp, json ? "\\\\x%02x" : "\\x%02x", c);
        } else if (cp_is_dangerous(cp)) {
            snprintf(tmp, sizeof tmp, "\\u%04x", cp);
        } else {
            memcpy(tmp, s + i, step);
            tmp[step] = '\0';
        }
        ulen = strlen(unit);
        if (out + ulen > max) {
            put(b, "...", 3);
            return;
        }
        put(b, unit, ulen);
        out += ulen;
        i += step;
    }
}

static int kv_needs_quotes(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 1;
    for (size_t i = 0; i < n; i++) {
        unsigned c = s[i];
        if (c <= 0x20 || c >= 0x7f || c == '=' || c == '"' || c == '\\')
            return 1;
    }
    return 0;
}

/* A field name reduced to [A-Za-z0-9_.-], at most NAME_MAX_BYTES. */
static void put_name(wbuf *b, const char *name)
{
    char buf[NAME_MAX_BYTES];
    size_t n = 0;
    if (name == NULL || *name == '\0')
        name = "_";
    for (; name[n] != '\0' && n < sizeof buf; n++) {
        unsigned char c = (unsigned char)name[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '-';
        buf[n] = ok ? (char)c : '_';
    }
    put(b, buf, n);
}

static void put_key(wbuf *b, const char *name, int json, int first)
{
    if (json) {
        puts_(b, first ? "\"" : ",\"");
        put_name(b, name);
        puts_(b, "\":");
    } else {
        if (!first)
            puts_(b, " ");
        put_name(b, name);
        puts_(b, "=");
    }
}

static void put_str_value(wbuf *b, const char *s, size_t n, int json, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    int quote = json || kv_needs_quotes(u, n);
    if (quote)
        puts_(b, "\"");
    put_escaped(b, u, n, json, max);
    if (quote)
        puts_(b, "\"");
}

/* A value that is known to be plain (numbers, names): quoted in JSON only when `as_string`. */
static void put_plain(wbuf *b, const char *s, int json, int as_string)
{
    if (json && as_string)
        puts_(b, "\"");
    puts_(b, s);
    if (json && as_string)
        puts_(b, "\"");
}

static void put_field(wbuf *b, const wxg_log_field_t *f, int json, size_t max)
{
    char num[64];
    put_key(b, f->name, json, 0);
    switch (f->type) {
    case WXG_LOG_F_STR:
        if (f->s == NULL)
            put_plain(b, json ? "null" : "-", json, 0);
        else
            put_str_value(b, f->s, strlen(f->s), json, max);
        break;
    case WXG_LOG_F_BYTES:
        if (f->s == NULL)
            put_plain(b, json ? "null" : "-", json, 0);
        else
            put_str_value(b, f->s, f->len, json, max);
        break;
    case WXG_LOG_F_INT:
        snprintf(num, sizeof num, "%lld", (long long)f->i);
        put_plain(b, num, json, 0);
        break;
    case WXG_LOG_F_UINT:
        snprintf(num, sizeof num, "%llu", (unsigned long long)f->u);
        put_plain(b, num, json, 0);
        break;
    case WXG_LOG_F_DOUBLE:
        if (f->d != f->d || f->d > 1e308 || f->d < -1e308) {
            /* JSON has no NaN or infinity. */
            put_plain(b, json ? "null" : (f->d != f->d ? "NaN" : (f->d > 0 ? "+Inf" : "-Inf")),
                      json, 0);
        } else {
            snprintf(num, sizeof num, "%.6g", f->d);
            put_plain(b, num, json, 0);
        }
        break;
    case WXG_LOG_F_BOOL:
        put_plain(b, f->i ? "true" : "false", json, 0);
        break;
    case WXG_LOG_F_SECRET:
        put_plain(b, "***", json, 1);
        break;
    case WXG_LOG_F_ID:
        if (f->s == NULL) {
            put_plain(b, json ? "null" : "-", json, 0);
        } else if (atomic_load_explicit(&personal_ids, memory_order_relaxed)) {
            put_str_value(b, f->s, strlen(f->s), json, max);
        } else {
            char h[WXG_LOG_HASH_HEX + 3];
            wxg_log_hash_id(f->s, strlen(f->s), h, sizeof h);
            put_plain(b, h, json, 1);
        }
        break;
    case WXG_LOG_F_CONTENT:
        if (f->s == NULL) {
            put_plain(b, json ? "null" : "-", json, 0);
        } else if (atomic_load_explicit(&log_content, memory_order_relaxed)) {
            put_str_value(b, f->s, f->len, json, max);
        } else {
            snprintf(num, sizeof num, "[%zu bytes]", f->len);
            put_str_value(b, num, strlen(num), json, max);
        }
        break;
    case WXG_LOG_F_ERR:
        put_plain(b, wxg_err_name((int)f->i), json, 1);
        break;
    default:
        put_plain(b, json ? "null" : "-", json, 0);
        break;
    }
}

static void put_timestamp(wbuf *b)
{
    struct timespec ts;
    struct tm tm;
    char buf[64];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03ldZ", (long)(ts.tv_nsec / 1000000));
    puts_(b, buf);
}

static void write_stderr(const char *line, size_t len)
{
    while (len > 0) {
        ssize_t w = write(STDERR_FILENO, line, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        line += w;
        len -= (size_t)w;
    }
}

void wxg_log_write(wxg_log_level_t level, const char *event, const wxg_log_field_t *fields,
                   size_t nfields)
{
    char line[WXG_LOG_LINE_MAX];
    wbuf b = {line, 0, sizeof line - LINE_RESERVE, 0};
    int json = atomic_load_explicit(&cur_format, memory_order_relaxed) == WXG_LOG_JSON;
    size_t max = atomic_load_explicit(&field_max, memory_order_relaxed);
    int truncated = 0;

    if (!wxg_log_enabled(level))
        return;
    if (json)
        puts_(&b, "{");
    put_key(&b, "ts", json, 1);
    if (json)
        puts_(&b, "\"");
    put_timestamp(&b);
    if (json)
        puts_(&b, "\"");
    put_key(&b, "level", json, 0);
    put_plain(&b, level_names[level], json, 1);
    put_key(&b, "event", json, 0);
    if (event == NULL)
        put_plain(&b, json ? "null" : "-", json, 0);
    else
        put_str_value(&b, event, strlen(event), json, max);

    for (size_t i = 0; i < nfields && fields != NULL; i++) {
        size_t mark = b.len;
        put_field(&b, &fields[i], json, max);
        if (b.overflow) {
            /* Leave the whole field out rather than cut the line in the middle of it. */
            b.len = mark;
            b.overflow = 0;
            truncated = 1;
        }
    }
    b.cap = sizeof line; /* the reserve is for the end of the line */
    if (truncated)
        puts_(&b, json ? ",\"truncated\":true" : " truncated=true");
    puts_(&b, json ? "}\n" : "\n");

    pthread_mutex_lock(&sink_mu);
    if (sink_fn != NULL)
        sink_fn(sink_opaque, level, line, b.len);
    else
        write_stderr(line, b.len);
    pthread_mutex_unlock(&sink_mu);
}
