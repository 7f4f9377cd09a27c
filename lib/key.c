/*
 * DESIGN: idempotency keys.
 *
 * Purpose: turn the identifying parts of a decoded message into a short key that is exact (ids
 * keep every digit), scoped by the bot account, unambiguous (the kind letter sits at a fixed
 * position and parts can never contain the ':' delimiter) and safe (untrusted text is either
 * checked against a strict charset or replaced by its SHA-256). The grammar is in
 * include/wxguard/key.h and docs/keys.md.
 *
 * Ids are never converted to a number type: wxg_id_check() compares the digits against
 * "18446744073709551615" as text, so nothing can round.
 *
 * Hashing uses OpenSSL's EVP interface (libcrypto). Fields are length-prefixed (presence byte,
 * 8-byte big-endian length, bytes), so no choice of field contents can shift a boundary.
 *
 * Threads and locks: none; every function is pure and may run on any thread. Failure modes:
 * WXG_EINVAL for inputs that break a precondition, WXG_ENOMEM when libcrypto cannot allocate a
 * digest context. Nothing here aborts.
 */
#include "wxguard/key.h"

#include <pthread.h>
#include <string.h>

#include <openssl/evp.h>

#include "key_int.h"

#include "wxguard/err.h"

static const char u64_max[] = "18446744073709551615";

wxg_id_verdict_t wxg_id_check(const char *text, size_t len)
{
    if (text == NULL || len == 0)
        return WXG_ID_EMPTY;
    size_t i = 0;
    int neg = 0;
    if (text[0] == '-') {
        neg = 1;
        i = 1;
    }
    /* Classify the whole token first, so that "-1.5" is reported as negative, "1e3" as real. */
    size_t digits = 0;
    int real = 0, other = 0;
    for (size_t j = i; j < len; j++) {
        unsigned char c = (unsigned char)text[j];
        unsigned char prev = j > i ? (unsigned char)text[j - 1] : 0;
        if (c >= '0' && c <= '9')
            digits++;
        else if (c == '.' || c == 'e' || c == 'E')
            real = 1;
        else if ((c == '+' || c == '-') && (prev == 'e' || prev == 'E'))
            real = 1;
        else
            other = 1;
    }
    if (other || digits == 0)
        return WXG_ID_NOT_DIGITS;
    if (neg)
        return WXG_ID_NEGATIVE;
    if (real)
        return WXG_ID_REAL;
    if (len == 1 && text[0] == '0')
        return WXG_ID_ZERO;
    if (text[0] == '0')
        return WXG_ID_LEADING_ZERO;
    if (len > sizeof u64_max - 1)
        return WXG_ID_OUT_OF_RANGE;
    if (len == sizeof u64_max - 1 && memcmp(text, u64_max, len) > 0)
        return WXG_ID_OUT_OF_RANGE;
    return WXG_ID_OK;
}

const char *wxg_id_verdict_str(wxg_id_verdict_t v)
{
    switch (v) {
    case WXG_ID_OK:
        return "a valid id";
    case WXG_ID_EMPTY:
        return "empty";
    case WXG_ID_ZERO:
        return "zero (a placeholder, not an id)";
    case WXG_ID_NEGATIVE:
        return "a negative number";
    case WXG_ID_REAL:
        return "a real number literal, not an integer";
    case WXG_ID_LEADING_ZERO:
        return "an integer with a leading zero";
    case WXG_ID_NOT_DIGITS:
        return "not a decimal integer";
    case WXG_ID_OUT_OF_RANGE:
        return "larger than 2^64-1";
    }
    return "not a decimal integer";
}

void wxg__to_hex(const unsigned char *d, size_t n, char *out)
{
    static const char hexdig[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hexdig[d[i] >> 4];
        out[2 * i + 1] = hexdig[d[i] & 15];
    }
    out[2 * n] = '\0';
}

size_t wxg__put_dec(char *out, uint64_t v)
{
    char rev[20];
    size_t n = 0;
    do {
        rev[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = rev[n - 1 - i];
    return n;
}

/* SHA-256 fetched from OpenSSL's provider once per process. Passing EVP_sha256() makes OpenSSL 3
 * look the implementation up again on every hash (about 200 ns, more than hashing a short key:
 * 126 against 335 ns per key measured on the benchmark machine), and every message is hashed
 * several times. The fetched method lives as long as the process. */
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_fetched;

static void sha256_fetch(void)
{
    sha256_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *sha256_md(void)
{
    pthread_once(&sha256_once, sha256_fetch);
    return sha256_fetched ? sha256_fetched : EVP_sha256();
}

/* One digest context per thread, kept for the thread's life. A context made and freed per hash
 * takes and drops a reference on the shared method each time, an atomic on one cache line that
 * the poll thread (payload hashes) and every worker (key fingerprints) write for each message;
 * a kept context holds its reference once. Freed when its thread exits. */
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static pthread_key_t ctx_key;
static int ctx_key_ok;

static void ctx_destroy(void *ctx)
{
    EVP_MD_CTX_free(ctx);
}

static void ctx_key_make(void)
{
    ctx_key_ok = pthread_key_create(&ctx_key, ctx_destroy) == 0;
}

/* The calling thread's context, initialised for SHA-256, or NULL when out of memory. */
static EVP_MD_CTX *sha256_begin(void)
{
    pthread_once(&ctx_once, ctx_key_make);
    if (!ctx_key_ok)
        return NULL;
    EVP_MD_CTX *ctx = pthread_getspecific(ctx_key);
    if (ctx == NULL) {
        ctx = EVP_MD_CTX_new();
        if (ctx == NULL)
            return NULL;
        if (pthread_setspecific(ctx_key, ctx) != 0) {
            EVP_MD_CTX_free(ctx);
            return NULL;
        }
    }
    if (EVP_DigestInit_ex(ctx, sha256_md(), NULL) != 1)
        return NULL;
    return ctx;
}

static int sha256_end(EVP_MD_CTX *ctx, unsigned char out[32])
{
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx, out, &n) != 1 || n != 32)
        return WXG_ENOMEM;
    return 0;
}

int wxg_sha256(const void *data, size_t len, unsigned char out[32])
{
    EVP_MD_CTX *ctx = sha256_begin();
    if (ctx == NULL || EVP_DigestUpdate(ctx, data, len) != 1)
        return WXG_ENOMEM;
    return sha256_end(ctx, out);
}

int wxg_key_hash_fields(const wxg_key_field_t *fields, size_t n, unsigned char out[32])
{
    EVP_MD_CTX *ctx = sha256_begin();
    if (ctx == NULL)
        return WXG_ENOMEM;
    /* The headers and short fields are gathered into one buffer: two digest updates per field
     * cost more than hashing the bytes of a typical message. */
    unsigned char buf[1024];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = fields[i].ptr ? (uint64_t)fields[i].len : 0;
        if (used + 9 > sizeof buf) {
            if (EVP_DigestUpdate(ctx, buf, used) != 1)
                return WXG_ENOMEM;
            used = 0;
        }
        buf[used] = fields[i].ptr ? 1 : 0;
        for (int b = 0; b < 8; b++)
            buf[used + 1 + (size_t)b] = (unsigned char)(len >> (56 - 8 * b));
        used += 9;
        if (len == 0)
            continue;
        if (len <= sizeof buf - used) {
            memcpy(buf + used, fields[i].ptr, fields[i].len);
            used += fields[i].len;
            continue;
        }
        if (EVP_DigestUpdate(ctx, buf, used) != 1 ||
            EVP_DigestUpdate(ctx, fields[i].ptr, fields[i].len) != 1)
            return WXG_ENOMEM;
        used = 0;
    }
    if (used > 0 && EVP_DigestUpdate(ctx, buf, used) != 1)
        return WXG_ENOMEM;
    return sha256_end(ctx, out);
}

static int part_char_ok(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '@' || c == '.' || c == '-';
}

int wxg_key_part(const char *text, size_t len, char *out, size_t outsz)
{
    if (text == NULL || len == 0 || out == NULL || outsz < 66)
        return WXG_EINVAL;
    int raw = len <= WXG_KEY_PART_MAX;
    for (size_t i = 0; raw && i < len; i++)
        raw = part_char_ok((unsigned char)text[i]);
    if (raw) {
        memcpy(out, text, len);
        out[len] = '\0';
        return (int)len;
    }
    unsigned char md[32];
    if (wxg_sha256(text, len, md) != 0)
        return WXG_ENOMEM;
    out[0] = 'x';
    wxg__to_hex(md, 32, out + 1);
    return 65;
}

/* Joins already-safe pieces into out. Returns 0 or WXG_EINVAL when out is too small. */
static int join(char *out, size_t outsz, const char *const *pieces, size_t n)
{
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(pieces[i]);
        if (used + l + 1 > outsz)
            return WXG_EINVAL;
        memcpy(out + used, pieces[i], l);
        used += l;
    }
    out[used] = '\0';
    return 0;
}

static int account_part(const char *account, size_t len, char part[66])
{
    if (account == NULL || len == 0)
        return WXG_EINVAL;
    int n = wxg_key_part(account, len, part, 66);
    return n < 0 ? n : 0;
}

int wxg_key_server(char *out, size_t outsz, const char *account, size_t account_len, const char *id,
                   size_t id_len)
{
    char acct[66], digits[24];
    if (out == NULL || wxg_id_check(id, id_len) != WXG_ID_OK)
        return WXG_EINVAL;
    int rc = account_part(account, account_len, acct);
    if (rc != 0)
        return rc;
    memcpy(digits, id, id_len);
    digits[id_len] = '\0';
    const char *pieces[] = {acct, ":n:", digits};
    return join(out, outsz, pieces, 3);
}

int wxg_key_oa_msg(char *out, size_t outsz, const char *account, size_t account_len,
                   const char *msg_id, size_t msg_id_len, const char *from, size_t from_len,
                   int64_t create_time)
{
    char acct[66], fromp[66], digits[24], ts[24];
    if (out == NULL || wxg_id_check(msg_id, msg_id_len) != WXG_ID_OK || create_time < 0)
        return WXG_EINVAL;
    int rc = account_part(account, account_len, acct);
    if (rc != 0)
        return rc;
    if (from == NULL || from_len == 0)
        return WXG_EINVAL;
    rc = wxg_key_part(from, from_len, fromp, sizeof fromp);
    if (rc < 0)
        return rc;
    memcpy(digits, msg_id, msg_id_len);
    digits[msg_id_len] = '\0';
    /* Render create_time by hand: no printf family on untrusted values is needed here. */
    char rev[24];
    size_t n = 0;
    uint64_t v = (uint64_t)create_time;
    do {
        rev[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    for (size_t i = 0; i < n; i++)
        ts[i] = rev[n - 1 - i];
    ts[n] = '\0';
    const char *pieces[] = {acct, ":m:", digits, ":", fromp, ":", ts};
    return join(out, outsz, pieces, 7);
}

static int hashed_key(char *out, size_t outsz, const char *acct, const char *kind,
                      const wxg_key_field_t *fields, size_t n)
{
    unsigned char md[32];
    char hex[65];
    int rc = wxg_key_hash_fields(fields, n, md);
    if (rc != 0)
        return rc;
    wxg__to_hex(md, 32, hex);
    const char *pieces[] = {acct, kind, hex};
    return join(out, outsz, pieces, 3);
}

int wxg_key_oa_event(char *out, size_t outsz, const char *account, size_t account_len,
                     const wxg_key_event_t *ev)
{
    char acct[66];
    if (out == NULL || ev == NULL)
        return WXG_EINVAL;
    int rc = account_part(account, account_len, acct);
    if (rc != 0)
        return rc;
    /* The leading tag versions the tuple: a future change of fields changes every hash. */
    static const char tag[] = "wxg.e.v1";
    const wxg_key_field_t f[] = {
        {tag, sizeof tag - 1}, ev->from, ev->create_time, ev->event, ev->event_key, ev->job_id,
    };
    return hashed_key(out, outsz, acct, ":e:", f, sizeof f / sizeof f[0]);
}

int wxg_key_fingerprint(char *out, size_t outsz, const char *account, size_t account_len,
                        const wxg_key_fingerprint_t *fp)
{
    char acct[66];
    unsigned char cmd[32];
    if (out == NULL || fp == NULL)
        return WXG_EINVAL;
    if (account == NULL) {
        memcpy(acct, WXG_KEY_NO_ACCOUNT, sizeof WXG_KEY_NO_ACCOUNT);
    } else {
        int rc = account_part(account, account_len, acct);
        if (rc != 0)
            return rc;
    }
    wxg_key_field_t content = {NULL, 0};
    if (fp->content.ptr != NULL) {
        if (wxg_sha256(fp->content.ptr, fp->content.len, cmd) != 0)
            return WXG_ENOMEM;
        content.ptr = cmd;
        content.len = sizeof cmd;
    }
    static const char tag[] = "wxg.h.v1";
    const wxg_key_field_t f[] = {
        {tag, sizeof tag - 1}, fp->format, fp->type, fp->from, fp->chat, fp->to,
        fp->create_time,       content,
    };
    return hashed_key(out, outsz, acct, ":h:", f, sizeof f / sizeof f[0]);
}

static int is_hex_lower(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    }
    return 1;
}

/* Length of a valid part at s (raw or hashed), ended by ':' or NUL; 0 when invalid. */
static size_t check_part(const char *s)
{
    size_t n = 0;
    while (s[n] != '\0' && s[n] != ':')
        n++;
    if (n == 65 && s[0] == 'x' && is_hex_lower(s + 1, 64))
        return n;
    if (n == 0 || n > WXG_KEY_PART_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!part_char_ok((unsigned char)s[i]))
            return 0;
    }
    return n;
}

/* Length of a valid id at s, ended by ':' or NUL; 0 when invalid. */
static size_t check_id(const char *s)
{
    size_t n = 0;
    while (s[n] != '\0' && s[n] != ':')
        n++;
    return wxg_id_check(s, n) == WXG_ID_OK ? n : 0;
}

int wxg_key_check(const char *key, char *kind)
{
    if (key == NULL)
        return WXG_EINVAL;
    size_t alen;
    int no_account = 0;
    if (key[0] == '~' && key[1] == ':') {
        alen = 1;
        no_account = 1;
    } else {
        alen = check_part(key);
    }
    if (alen == 0 || key[alen] != ':')
        return WXG_EINVAL;
    const char *k = key + alen + 1;
    if (k[0] == '\0' || k[1] != ':')
        return WXG_EINVAL;
    const char *rest = k + 2;
    char kd = k[0];
    if (no_account && kd != 'h')
        return WXG_EINVAL;
    size_t n;
    switch (kd) {
    case 'n':
        n = check_id(rest);
        if (n == 0 || rest[n] != '\0')
            return WXG_EINVAL;
        break;
    case 'm':
        n = check_id(rest);
        if (n == 0 || rest[n] != ':')
            return WXG_EINVAL;
        rest += n + 1;
        n = check_part(rest);
        if (n == 0 || rest[n] != ':')
            return WXG_EINVAL;
        rest += n + 1;
        /* CreateTime: digits without a leading zero, or exactly "0". */
        n = 0;
        while (rest[n] >= '0' && rest[n] <= '9')
            n++;
        if (n == 0 || n > 19 || rest[n] != '\0' || (n > 1 && rest[0] == '0'))
            return WXG_EINVAL;
        break;
    case 'e':
    case 'h':
        if (strlen(rest) != 64 || !is_hex_lower(rest, 64))
            return WXG_EINVAL;
        break;
    default:
        return WXG_EINVAL;
    }
    if (kind != NULL)
        *kind = kd;
    return 0;
}

static int affix_ok(const char *s)
{
    return s == NULL || (strchr(s, '{') == NULL && strchr(s, '}') == NULL);
}

int wxg_key_redis_name(char *out, size_t outsz, const char *prefix, const char *key,
                       const char *suffix)
{
    if (out == NULL || wxg_key_check(key, NULL) != 0 || !affix_ok(prefix) || !affix_ok(suffix))
        return WXG_EINVAL;
    size_t lp = prefix ? strlen(prefix) : 0, lk = strlen(key), ls = suffix ? strlen(suffix) : 0;
    size_t total = lp + 1 + lk + 1 + ls;
    if (total + 1 > outsz || total > (size_t)0x7fffffff)
        return WXG_EOVERFLOW;
    char *p = out;
    if (lp > 0)
        memcpy(p, prefix, lp);
    p += lp;
    *p++ = '{';
    memcpy(p, key, lk);
    p += lk;
    *p++ = '}';
    if (ls > 0)
        memcpy(p, suffix, ls);
    p += ls;
    *p = '\0';
    return (int)total;
}
