/*
 * DESIGN: message decoding.
 *
 * Purpose: turn one callback record (the raw body a gateway POSTed, as it sits in Kafka) into
 * decoded messages with exact idempotency keys. Pure: bytes in, structs out, no I/O.
 *
 * JSON is read by a small strict reader in this file rather than by cJSON, because the decoder
 * needs four things cJSON cannot give: the literal text of number tokens (cJSON stores doubles,
 * so 7301234567890123457 and ...458 become one value), strings with their length (cJSON cuts a
 * string at \u0000), every duplicate member (cJSON silently returns the first), and no shared
 * state (cJSON_Parse* write a global error pointer). The reader builds a small tree in a scratch
 * arena, enforces the nesting cap while it descends (so a 10,000-deep bomb stops at depth
 * max_depth without touching the rest), and keeps invalid UTF-8 bytes and lone surrogate escapes
 * (encoded as their 3-byte form) instead of failing the whole record. Member lookups are
 * case-sensitive; a field read twice with different values is refused (EIDCONFLICT for id
 * fields).
 *
 * XML (Official Account pushes) goes to libxml2 with XML_PARSE_NONET and without
 * XML_PARSE_NOENT / XML_PARSE_DTDLOAD; before that a scan refuses any "<!" declaration
 * (DOCTYPE, ENTITY) outside comments and CDATA and enforces the nesting cap. libxml2 is
 * initialised once through pthread_once; after that each call uses its own parser context.
 *
 * Memory: a decode uses two arenas. The scratch arena holds the JSON tree and temporaries and is
 * freed before wxg_decode() returns; the batch arena holds a copy of the record (views point
 * into it for raw), the views and their strings, and lives until wxg_batch_free().
 *
 * Threads and locks: none shared; any number of threads may decode at once. Failure modes: every
 * malformed input is a typed error with a reason in errstr; allocation failure is WXG_ENOMEM.
 * Nothing here aborts or prints.
 *
 * Dependencies: uses lib/key.c (include/wxguard/key.h) to build keys; key knows nothing of
 * messages.
 */
#include "wxguard/msg.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libxml/parser.h>
#include <libxml/tree.h>

#include "err_int.h"
#include "key_int.h"
#include "recycle_int.h"
#include "wxguard/err.h"
#include "wxguard/key.h"

/* ------------------------------------------------------------------------------------------ */
/* Arena: bump allocation in chunks, freed all at once.                                        */

typedef struct chunk {
    struct chunk *next;
    size_t used;
    size_t cap;
    size_t pad; /* keeps data 16-byte aligned on LP64 */
    unsigned char data[];
} chunk;

typedef struct arena {
    chunk *head;
    size_t first;              /* capacity of the first chunk; 0: ARENA_CHUNK */
    chunk *borrowed;           /* a chunk the arena uses but does not own (arena_lend), or NULL */
    wxg_decode_cache_t *cache; /* where freed chunks go for reuse, or NULL */
} arena;

#define ARENA_CHUNK 65536

/* Chunks of 1..CACHE_CLASSES KiB (the sizes arena_size_for gives records of up to about 3.8 KB)
 * are kept by a decode cache, one list per size. */
#define CACHE_CLASS     1024
#define CACHE_CLASSES   16
#define CACHE_MIN_BYTES ((size_t)64 << 10)

struct wxg_decode_cache_s {
    wxg__recycle_t cls[CACHE_CLASSES];
    size_t bytes; /* kept, over every size */
    size_t limit; /* the budget for `bytes` */
};

wxg_decode_cache_t *wxg_decode_cache_new(size_t max_bytes)
{
    wxg_decode_cache_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->limit = max_bytes < CACHE_MIN_BYTES ? CACHE_MIN_BYTES : max_bytes;
    /* One budget for all sizes (checked in cache_keep): a consumer's records are mostly of one
     * size, which may then use all of it. */
    for (size_t i = 0; i < CACHE_CLASSES; i++)
        c->cls[i].max = SIZE_MAX;
    return c;
}

void wxg_decode_cache_free(wxg_decode_cache_t *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < CACHE_CLASSES; i++)
        wxg__recycle_drain(&c->cls[i]);
    free(c);
}

size_t wxg_decode_cache_bytes(const wxg_decode_cache_t *c)
{
    return c ? c->bytes : 0;
}

/* The cache's list for chunks of capacity cap, or NULL when such chunks are not kept. */
static wxg__recycle_t *cache_class(wxg_decode_cache_t *c, size_t cap)
{
    if (c == NULL || cap % CACHE_CLASS != 0 || cap == 0 || cap > CACHE_CLASSES * CACHE_CLASS)
        return NULL;
    return &c->cls[cap / CACHE_CLASS - 1];
}

/* A kept chunk of capacity cap, or NULL. */
static chunk *cache_take(wxg_decode_cache_t *c, size_t cap)
{
    wxg__recycle_t *l = cache_class(c, cap);
    chunk *ch = l ? wxg__recycle_pop(l, sizeof(chunk) + cap) : NULL;
    if (ch != NULL)
        c->bytes -= sizeof(chunk) + cap;
    return ch;
}

/* Keeps ch for reuse when its size is kept and the budget allows. 1 when kept. */
static int cache_keep(wxg_decode_cache_t *c, chunk *ch)
{
    wxg__recycle_t *l = cache_class(c, ch->cap);
    size_t size = sizeof(chunk) + ch->cap;
    if (l == NULL || size > c->limit - c->bytes || !wxg__recycle_push(l, ch, size))
        return 0;
    c->bytes += size;
    return 1;
}

/* The first chunk of an arena is sized from the record (arena_size_for) rather than taken at
 * ARENA_CHUNK: a consumer decodes one record of a few hundred bytes at a time, and two 64 KiB
 * blocks per record, allocated by the poll thread and freed by a worker, kept glibc growing and
 * shrinking its heap, touching fresh pages (bench/e2e.md, runs G and H). Later chunks, for the
 * records that outgrow the estimate, are ARENA_CHUNK as before. */
static size_t arena_size_for(size_t len)
{
    if (len > ARENA_CHUNK / 4)
        return ARENA_CHUNK;
    size_t n = 4 * len + 1024;
    return (n + 1023) & ~(size_t)1023;
}

static void *arena_alloc(arena *a, size_t n)
{
    if (n > SIZE_MAX / 2)
        return NULL;
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    chunk *c = a->head;
    if (c == NULL || c->cap - c->used < n) {
        size_t want = c == NULL && a->first ? a->first : ARENA_CHUNK;
        size_t cap = n > want ? n : want;
        c = cache_take(a->cache, cap);
        if (c == NULL)
            c = malloc(sizeof(chunk) + cap);
        if (c == NULL)
            return NULL;
        c->used = 0;
        c->cap = cap;
        /* A large one-off block goes behind the current chunk so that the current chunk's
         * free space stays usable. */
        if (a->head != NULL && n > ARENA_CHUNK / 2) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

static char *arena_strndup(arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    if (p == NULL)
        return NULL;
    if (n > 0)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static void arena_free(arena *a)
{
    chunk *c = a->head;
    while (c != NULL) {
        chunk *next = c->next;
        if (c != a->borrowed && !cache_keep(a->cache, c))
            free(c);
        c = next;
    }
    a->head = NULL;
    a->borrowed = NULL;
}

/* The scratch arena lives only while one decode runs, so its first chunk can be a buffer on the
 * decoding thread's stack: a malloc and a free of a few KiB per record, both outside glibc's
 * per-thread cache, were about a tenth of the consumer's poll thread (bench/e2e.md, runs N-Q).
 * Used only when the record's estimate fits (a larger record keeps the heap chunk it had), so a
 * record that outgrows the buffer continues in ARENA_CHUNK blocks as before. */
#define SCRATCH_STACK 8192

typedef union scratch_buf {
    chunk c;
    unsigned char bytes[SCRATCH_STACK];
} scratch_buf;

static void arena_lend(arena *a, scratch_buf *buf, size_t first)
{
    a->first = first;
    if (first > sizeof *buf - sizeof(chunk))
        return;
    buf->c.next = NULL;
    buf->c.used = 0;
    buf->c.cap = sizeof *buf - sizeof(chunk);
    a->head = &buf->c;
    a->borrowed = &buf->c;
}

/* ------------------------------------------------------------------------------------------ */
/* Decode context and errors.                                                                  */

/* A text value as read from JSON or XML. p == NULL: absent. */
typedef struct tval {
    const char *p;
    size_t n;
    int kind; /* TV_* */
} tval;

enum { TV_ABSENT = 0, TV_STR, TV_NUM, TV_NULL, TV_OTHER };

/* One message before it becomes a view. */
typedef struct draft {
    wxg_format_t format;
    int no_account; /* URL-verification probe: reserved account part */
    tval account, conversation, sender, to, type, content, ctime;
    tval body;           /* fingerprint content; TV_ABSENT -> content */
    tval id;             /* candidate id */
    const char *id_path; /* where id came from, e.g. "data.newMsgId" */
    int is_group, is_self;
    int oa;                   /* 0, OA_MSG or OA_EVT */
    tval oa_event, oa_evkey;  /* OA events */
    const char *account_note; /* appended to key_reason, or NULL */
    const char *raw;
    size_t raw_len;
} draft;

enum { OA_MSG = 1, OA_EVT = 2 };

typedef struct dctx {
    arena scratch;
    arena *keep;
    int max_depth;
    char *errstr;
    size_t errsz;
    int err;
    draft *drafts;
    size_t ndrafts, capdrafts;
    const char *rec; /* the record copy in the batch arena */
    size_t rec_len;
} dctx;

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static int
fail(dctx *d, int code, const char *fmt, ...)
{
    if (d->err == 0) {
        d->err = code;
        va_list ap;
        va_start(ap, fmt);
        wxg__verrf(d->errstr, d->errsz, fmt, ap);
        va_end(ap);
    }
    return d->err;
}

static int nomem(dctx *d)
{
    return fail(d, WXG_ENOMEM, "out of memory while decoding");
}

/* ------------------------------------------------------------------------------------------ */
/* JSON reader.                                                                                */

enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jnode {
    struct jnode *next;  /* next sibling */
    struct jnode *child; /* first child (arrays, objects) */
    const char *key;     /* member name, decoded (members of objects only) */
    size_t key_len;
    const char *raw; /* the value's text in the record */
    size_t raw_len;
    const char *str; /* J_STR: decoded bytes; J_NUM: the literal token */
    size_t str_len;
    size_t nchild;
    int type;
} jnode;

typedef struct jreader {
    dctx *d;
    const char *start, *cur, *end;
} jreader;

static int jfail(jreader *r, const char *what)
{
    return fail(r->d, WXG_EPARSE, "invalid JSON at byte %zu: %s", (size_t)(r->cur - r->start),
                what);
}

static void jws(jreader *r)
{
    while (r->cur < r->end &&
           (*r->cur == ' ' || *r->cur == '\t' || *r->cur == '\n' || *r->cur == '\r'))
        r->cur++;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int read_u4(const char *p, const char *end, unsigned *out)
{
    if (end - p < 4)
        return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0)
            return -1;
        v = (v << 4) | (unsigned)h;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Reads a string at r->cur (which is '"'). Bytes other than '"' and '\\' are taken as they are
 * (also control bytes and invalid UTF-8: they are kept, not judged, here). A lone surrogate
 * escape becomes its 3-byte encoding, so "\ud83d" and "\ud83e" stay different. */
static int jstring(jreader *r, const char **out, size_t *out_len)
{
    const char *s = r->cur + 1, *q = s;
    int esc = 0;
    while (q < r->end && *q != '"') {
        if (*q == '\\') {
            esc = 1;
            q++;
        }
        q++;
    }
    if (q >= r->end)
        return jfail(r, "unterminated string");
    if (!esc) {
        *out = s;
        *out_len = (size_t)(q - s);
        r->cur = q + 1;
        return 0;
    }
    /* Decoded text is never longer than its escaped form. */
    char *o = arena_alloc(&r->d->scratch, (size_t)(q - s) + 1);
    if (o == NULL)
        return nomem(r->d);
    size_t n = 0;
    const char *p = s;
    while (p < q) {
        if (*p != '\\') {
            o[n++] = *p++;
            continue;
        }
        r->cur = p;
        p++;
        switch (*p) {
        case '"':
        case '\\':
        case '/':
            o[n++] = *p++;
            break;
        case 'b':
            o[n++] = '\b';
            p++;
            break;
        case 'f':
            o[n++] = '\f';
            p++;
            break;
        case 'n':
            o[n++] = '\n';
            p++;
            break;
        case 'r':
            o[n++] = '\r';
            p++;
            break;
        case 't':
            o[n++] = '\t';
            p++;
            break;
        case 'u': {
            unsigned cp, lo;
            if (read_u4(p + 1, q, &cp) != 0)
                return jfail(r, "bad \\u escape");
            p += 5;
            if (cp >= 0xD800 && cp <= 0xDBFF && q - p >= 6 && p[0] == '\\' && p[1] == 'u' &&
                read_u4(p + 2, q, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default:
            return jfail(r, "bad escape in string");
        }
    }
    o[n] = '\0';
    *out = o;
    *out_len = n;
    r->cur = q + 1;
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int jnumber(jreader *r)
{
    const char *p = r->cur;
    if (p < r->end && *p == '-')
        p++;
    if (p >= r->end || !is_digit(*p))
        return jfail(r, "bad number");
    if (*p == '0') {
        p++;
    } else {
        while (p < r->end && is_digit(*p))
            p++;
    }
    if (p < r->end && *p == '.') {
        p++;
        if (p >= r->end || !is_digit(*p))
            return jfail(r, "bad number fraction");
        while (p < r->end && is_digit(*p))
            p++;
    }
    if (p < r->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < r->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= r->end || !is_digit(*p))
            return jfail(r, "bad number exponent");
        while (p < r->end && is_digit(*p))
            p++;
    }
    r->cur = p;
    return 0;
}

static int jliteral(jreader *r, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(r->end - r->cur) < n || memcmp(r->cur, lit, n) != 0)
        return jfail(r, "unexpected character");
    r->cur += n;
    return 0;
}

static int jvalue(jreader *r, int depth, jnode **out);

static int jcontainer(jreader *r, int depth, jnode *node)
{
    int is_obj = node->type == J_OBJ;
    char close = is_obj ? '}' : ']';
    if (depth + 1 > r->d->max_depth)
        return fail(r->d, WXG_EDEPTH, "JSON nested deeper than %d levels (at byte %zu)",
                    r->d->max_depth, (size_t)(r->cur - r->start));
    r->cur++;
    jws(r);
    if (r->cur < r->end && *r->cur == close) {
        r->cur++;
        return 0;
    }
    jnode *tail = NULL;
    for (;;) {
        const char *key = NULL;
        size_t key_len = 0;
        if (is_obj) {
            if (r->cur >= r->end || *r->cur != '"')
                return jfail(r, "expected a member name");
            if (jstring(r, &key, &key_len) != 0)
                return r->d->err;
            jws(r);
            if (r->cur >= r->end || *r->cur != ':')
                return jfail(r, "expected ':' after a member name");
            r->cur++;
            jws(r);
        }
        jnode *child;
        if (jvalue(r, depth + 1, &child) != 0)
            return r->d->err;
        child->key = key;
        child->key_len = key_len;
        if (tail == NULL)
            node->child = child;
        else
            tail->next = child;
        tail = child;
        node->nchild++;
        jws(r);
        if (r->cur >= r->end)
            return jfail(r, is_obj ? "unterminated object" : "unterminated array");
        if (*r->cur == ',') {
            r->cur++;
            jws(r);
            continue;
        }
        if (*r->cur == close) {
            r->cur++;
            return 0;
        }
        return jfail(r, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int jvalue(jreader *r, int depth, jnode **out)
{
    jnode *n = arena_alloc(&r->d->scratch, sizeof *n);
    if (n == NULL)
        return nomem(r->d);
    memset(n, 0, sizeof *n);
    *out = n;
    if (r->cur >= r->end)
        return jfail(r, "unexpected end of input");
    n->raw = r->cur;
    int rc;
    switch (*r->cur) {
    case '{':
        n->type = J_OBJ;
        rc = jcontainer(r, depth, n);
        break;
    case '[':
        n->type = J_ARR;
        rc = jcontainer(r, depth, n);
        break;
    case '"':
        n->type = J_STR;
        rc = jstring(r, &n->str, &n->str_len);
        break;
    case 't':
        n->type = J_TRUE;
        rc = jliteral(r, "true");
        break;
    case 'f':
        n->type = J_FALSE;
        rc = jliteral(r, "false");
        break;
    case 'n':
        n->type = J_NULL;
        rc = jliteral(r, "null");
        break;
    default:
        if (*r->cur != '-' && !is_digit(*r->cur))
            return jfail(r, "unexpected character");
        n->type = J_NUM;
        rc = jnumber(r);
        n->str = n->raw;
        n->str_len = (size_t)(r->cur - n->raw);
        break;
    }
    n->raw_len = (size_t)(r->cur - n->raw);
    return rc;
}

static int jparse(dctx *d, const char *buf, size_t len, size_t skip, jnode **root)
{
    jreader r = {d, buf, buf + skip, buf + len};
    if (jvalue(&r, 0, root) != 0)
        return d->err;
    jws(&r);
    if (r.cur != r.end)
        return jfail(&r, "unexpected data after the JSON value");
    return 0;
}

/* Same value? Strings compare decoded bytes, numbers their literal text; for id fields a number
 * and a string with the same text agree. Containers compare their raw text. */
static int jsame(const jnode *a, const jnode *b, int is_id)
{
    int ta = a->type, tb = b->type;
    int texta = ta == J_STR || ta == J_NUM, textb = tb == J_STR || tb == J_NUM;
    if (ta != tb && !(is_id && texta && textb))
        return 0;
    if (texta)
        return a->str_len == b->str_len && memcmp(a->str, b->str, a->str_len) == 0;
    if (ta == J_ARR || ta == J_OBJ)
        return a->raw_len == b->raw_len && memcmp(a->raw, b->raw, a->raw_len) == 0;
    return 1;
}

/* Case-sensitive member lookup. *out is the first match or NULL. A second member of the same
 * name with a different value is an error: EIDCONFLICT for id fields, EPARSE otherwise. */
static int jget(dctx *d, const jnode *obj, const char *name, const char *path, int is_id,
                const jnode **out)
{
    *out = NULL;
    if (obj == NULL || obj->type != J_OBJ)
        return 0;
    size_t nl = strlen(name);
    for (const jnode *c = obj->child; c != NULL; c = c->next) {
        if (c->key_len != nl || memcmp(c->key, name, nl) != 0)
            continue;
        if (*out == NULL)
            *out = c;
        else if (!jsame(*out, c, is_id))
            return fail(d, is_id ? WXG_EIDCONFLICT : WXG_EPARSE,
                        "field %s appears more than once with different values", path);
    }
    return 0;
}

static int jhas(const jnode *obj, const char *name)
{
    if (obj == NULL || obj->type != J_OBJ)
        return 0;
    size_t nl = strlen(name);
    for (const jnode *c = obj->child; c != NULL; c = c->next) {
        if (c->key_len == nl && memcmp(c->key, name, nl) == 0)
            return 1;
    }
    return 0;
}

static tval tv_of(const jnode *n)
{
    tval v = {NULL, 0, TV_ABSENT};
    if (n == NULL)
        return v;
    switch (n->type) {
    case J_STR:
        v.kind = TV_STR;
        v.p = n->str;
        v.n = n->str_len;
        break;
    case J_NUM:
        v.kind = TV_NUM;
        v.p = n->str;
        v.n = n->str_len;
        break;
    case J_NULL:
        v.kind = TV_NULL;
        v.p = "";
        break;
    default:
        v.kind = TV_OTHER;
        v.p = "";
        break;
    }
    return v;
}

static tval tv_str(const char *s, size_t n)
{
    tval v = {s, n, TV_STR};
    return v;
}

static int tv_text(const tval *v)
{
    return v->kind == TV_STR || v->kind == TV_NUM;
}

static int tv_eq(const tval *v, const char *s)
{
    size_t n = strlen(s);
    return tv_text(v) && v->n == n && memcmp(v->p, s, n) == 0;
}

static int tv_eqv(const tval *a, const tval *b)
{
    return tv_text(a) && tv_text(b) && a->n == b->n && memcmp(a->p, b->p, a->n) == 0;
}

/* Reads a field into *v; a wrong (non-text) type is kept as TV_OTHER. */
static int get_tv(dctx *d, const jnode *obj, const char *name, const char *path, int is_id, tval *v)
{
    const jnode *n;
    if (jget(d, obj, name, path, is_id, &n) != 0)
        return d->err;
    *v = tv_of(n);
    return 0;
}

/* GeWe wraps strings as {"string": "..."} and writes an empty one as {}. */
static int get_wrapped(dctx *d, const jnode *obj, const char *name, const char *path, tval *v)
{
    const jnode *n, *s;
    if (jget(d, obj, name, path, 0, &n) != 0)
        return d->err;
    if (n != NULL && n->type == J_OBJ) {
        if (n->nchild == 0) {
            *v = tv_str("", 0);
            return 0;
        }
        if (jget(d, n, "string", path, 0, &s) != 0)
            return d->err;
        *v = tv_of(s);
        if (s == NULL) {
            v->kind = TV_OTHER;
            v->p = "";
        }
        return 0;
    }
    *v = tv_of(n);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Canonical JSON: members sorted by name, minimal escapes, number tokens as written. It makes
 * the fingerprint of a callback without content independent of key order and whitespace. */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            cap *= 2;
        }
        char *np = realloc(b->p, cap);
        if (np == NULL) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void sb_str(sbuf *b, const char *s, size_t n)
{
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            char e[7] = {
                '\\', 'u', '0', '0', "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15], 0};
            sb_put(b, e, 6);
        } else {
            sb_put(b, s + i, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int member_cmp(const void *a, const void *b)
{
    const jnode *x = *(const jnode *const *)a, *y = *(const jnode *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    if (c != 0)
        return c;
    if (x->key_len != y->key_len)
        return x->key_len < y->key_len ? -1 : 1;
    /* Equal names keep document order (raw positions grow). */
    return x->raw < y->raw ? -1 : (x->raw > y->raw);
}

static void canon(sbuf *b, const jnode *n)
{
    switch (n->type) {
    case J_NULL:
        sb_put(b, "null", 4);
        return;
    case J_TRUE:
        sb_put(b, "true", 4);
        return;
    case J_FALSE:
        sb_put(b, "false", 5);
        return;
    case J_NUM:
        sb_put(b, n->str, n->str_len);
        return;
    case J_STR:
        sb_str(b, n->str, n->str_len);
        return;
    case J_ARR:
        sb_put(b, "[", 1);
        for (const jnode *c = n->child; c != NULL; c = c->next) {
            if (c != n->child)
                sb_put(b, ",", 1);
            canon(b, c);
        }
        sb_put(b, "]", 1);
        return;
    case J_OBJ: {
        sb_put(b, "{", 1);
        if (n->nchild > 0) {
            const jnode **v = malloc(n->nchild * sizeof *v);
            if (v == NULL) {
                b->oom = 1;
                return;
            }
            size_t i = 0;
            for (const jnode *c = n->child; c != NULL; c = c->next)
                v[i++] = c;
            qsort(v, n->nchild, sizeof *v, member_cmp);
            for (i = 0; i < n->nchild; i++) {
                if (i > 0)
                    sb_put(b, ",", 1);
                sb_str(b, v[i]->key, v[i]->key_len);
                sb_put(b, ":", 1);
                canon(b, v[i]);
            }
            free(v);
        }
        sb_put(b, "}", 1);
        return;
    }
    }
}

/* The canonical text of n as a tval in the scratch arena. */
static int canon_tv(dctx *d, const jnode *n, tval *out)
{
    sbuf b = {NULL, 0, 0, 0};
    canon(&b, n);
    if (b.oom) {
        free(b.p);
        return nomem(d);
    }
    char *p = arena_strndup(&d->scratch, b.p ? b.p : "", b.n);
    free(b.p);
    if (p == NULL)
        return nomem(d);
    *out = tv_str(p, b.n);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Drafts.                                                                                     */

static draft *new_draft(dctx *d, wxg_format_t f, const char *raw, size_t raw_len)
{
    if (d->ndrafts == d->capdrafts) {
        /* The array grows in the scratch arena, which is freed as a whole with the decode; the
         * outgrown copy stays there until then. */
        size_t cap = d->capdrafts ? d->capdrafts * 2 : 4;
        draft *nd =
            cap <= SIZE_MAX / sizeof *nd ? arena_alloc(&d->scratch, cap * sizeof *nd) : NULL;
        if (nd == NULL) {
            nomem(d);
            return NULL;
        }
        if (d->ndrafts > 0)
            memcpy(nd, d->drafts, d->ndrafts * sizeof *nd);
        d->drafts = nd;
        d->capdrafts = cap;
    }
    draft *m = &d->drafts[d->ndrafts++];
    memset(m, 0, sizeof *m);
    m->format = f;
    m->raw = raw;
    m->raw_len = raw_len;
    return m;
}

static int ends_with(const tval *v, const char *suffix)
{
    size_t n = strlen(suffix);
    return tv_text(v) && v->n >= n && memcmp(v->p + v->n - n, suffix, n) == 0;
}

/* Group content of iPad-protocol gateways starts with "<sender>:\n". When it does, the sender is
 * taken from there and the prefix is removed from the content. */
static void split_group_prefix(draft *m)
{
    if (m->content.kind != TV_STR)
        return;
    const char *p = m->content.p;
    size_t lim = m->content.n < 130 ? m->content.n : 130;
    for (size_t i = 1; i + 1 < lim; i++) {
        unsigned char c = (unsigned char)p[i - 1];
        if (c <= ' ' || c == ':')
            return;
        if (p[i] == ':' && p[i + 1] == '\n') {
            m->sender = tv_str(p, i);
            m->content = tv_str(p + i + 2, m->content.n - i - 2);
            return;
        }
    }
}

/* Chat semantics shared by the gateways where the room id can be the sender or the receiver
 * (GeWe and sync batches). */
static void gateway_chat(draft *m, const tval *from, const tval *to)
{
    m->to = *to;
    if (ends_with(from, "@chatroom")) {
        m->is_group = 1;
        m->conversation = *from;
        split_group_prefix(m);
    } else if (ends_with(to, "@chatroom")) {
        m->is_group = 1;
        m->conversation = *to;
        m->sender = *from;
    } else {
        m->sender = *from;
        m->conversation = m->is_self ? *to : *from;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* URL-verification probes: sent once when a callback URL is configured; no account.          */

static const char probe_text[] = "\xe9\xaa\x8c\xe8\xaf\x81\xe5\x9b\x9e\xe8\xb0\x83\xe5\x9c\xb0"
                                 "\xe5\x9d\x80\xe6\x98\xaf\xe5\x90\xa6\xe5\x8f\xaf\xe7\x94\xa8";

static int contains(const char *h, size_t hn, const char *needle, size_t nn)
{
    for (size_t i = 0; nn <= hn && i <= hn - nn; i++) {
        if (memcmp(h + i, needle, nn) == 0)
            return 1;
    }
    return 0;
}

/* A top-level "testMsg" member, or a top-level string that carries the verification text. */
static const jnode *probe_of(const jnode *root)
{
    if (root == NULL || root->type != J_OBJ)
        return NULL;
    for (const jnode *c = root->child; c != NULL; c = c->next) {
        if (c->key_len == 7 && memcmp(c->key, "testMsg", 7) == 0)
            return c;
        if (c->type == J_STR && contains(c->str, c->str_len, probe_text, sizeof probe_text - 1))
            return c;
    }
    return NULL;
}

static int add_probe(dctx *d, const jnode *root, const jnode *probe, wxg_format_t f)
{
    draft *m = new_draft(d, f, d->rec, d->rec_len);
    if (m == NULL)
        return d->err;
    m->no_account = 1;
    m->type = tv_str("verify", 6);
    if (probe->type == J_STR)
        m->content = tv_of(probe);
    return canon_tv(d, root, &m->body);
}

/* ------------------------------------------------------------------------------------------ */
/* wkteam.                                                                                     */

static int account_field(dctx *d, draft *m, const tval *v, const char *name, const char *fmt)
{
    if (v->kind == TV_STR && v->n > 0) {
        m->account = *v;
        return 0;
    }
    if (v->kind == TV_ABSENT)
        return fail(d, WXG_ENOACCOUNT, "%s callback has no %s (the bot account)", fmt, name);
    if (v->kind == TV_STR)
        return fail(d, WXG_ENOACCOUNT, "%s callback has an empty %s (the bot account)", fmt, name);
    return fail(d, WXG_ENOACCOUNT, "%s callback: %s is not a string", fmt, name);
}

static int dec_wkteam(dctx *d, const jnode *root)
{
    const jnode *data, *self;
    tval acct, mtype, from, to, group, content, ts, id;
    if (get_tv(d, root, "wcId", "wcId", 0, &acct) ||
        get_tv(d, root, "messageType", "messageType", 0, &mtype) ||
        jget(d, root, "data", "data", 0, &data))
        return d->err;
    const jnode *probe = probe_of(root);
    if (acct.kind == TV_ABSENT && probe != NULL)
        return add_probe(d, root, probe, WXG_FORMAT_WKTEAM);
    if (get_tv(d, data, "fromUser", "data.fromUser", 0, &from) ||
        get_tv(d, data, "toUser", "data.toUser", 0, &to) ||
        get_tv(d, data, "fromGroup", "data.fromGroup", 0, &group) ||
        get_tv(d, data, "content", "data.content", 0, &content) ||
        get_tv(d, data, "timestamp", "data.timestamp", 0, &ts) ||
        get_tv(d, data, "newMsgId", "data.newMsgId", 1, &id) ||
        jget(d, data, "self", "data.self", 0, &self))
        return d->err;
    draft *m = new_draft(d, WXG_FORMAT_WKTEAM, d->rec, d->rec_len);
    if (m == NULL)
        return d->err;
    /* wcId is the stable bot id; wId changes on every login and account is a phone number. */
    if (account_field(d, m, &acct, "wcId", "wkteam") != 0)
        return d->err;
    if (tv_text(&mtype))
        m->type = mtype;
    m->id = id;
    m->id_path = "data.newMsgId";
    m->ctime = ts;
    m->to = to;
    m->sender = from;
    if (self != NULL)
        m->is_self = self->type == J_TRUE;
    else
        m->is_self = tv_eqv(&from, &acct);
    if (group.kind == TV_STR && group.n > 0) {
        m->is_group = 1;
        m->conversation = group;
    } else {
        m->conversation = m->is_self ? to : from;
    }
    if (content.kind == TV_STR)
        m->content = content;
    else if (data != NULL)
        return canon_tv(d, data, &m->body);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* GeWe-style callbacks and batched sync callbacks.                                            */

static int concat_type(dctx *d, const tval *a, const tval *b, tval *out)
{
    if (!tv_text(b)) {
        *out = *a;
        return 0;
    }
    size_t n = a->n + 1 + b->n;
    char *p = arena_alloc(&d->scratch, n + 1);
    if (p == NULL)
        return nomem(d);
    memcpy(p, a->p, a->n);
    p[a->n] = ':';
    memcpy(p + a->n + 1, b->p, b->n);
    p[n] = '\0';
    *out = tv_str(p, n);
    return 0;
}

static int gewe_account(dctx *d, draft *m, const tval *wxid, const tval *appid)
{
    /* Wxid is stable across devices; Appid is a device id. Appid only when there is no Wxid. */
    if (wxid->kind != TV_ABSENT || appid->kind != TV_STR || appid->n == 0)
        return account_field(d, m, wxid, "Wxid", "GeWe");
    m->account = *appid;
    m->account_note = "; account from Appid (no Wxid)";
    return 0;
}

static int dec_sync_batch(dctx *d, const tval *wxid, const tval *appid, const tval *mtype,
                          const jnode *msgs)
{
    if (msgs->type != J_ARR)
        return fail(d, WXG_EFORMAT, "sync callback: Data.messages is not an array");
    /* Real batches carry tens of messages; a cap keeps a record of empty objects from costing
     * hundreds of thousands of views. */
    if (msgs->nchild > WXG_DECODE_MAX_MESSAGES)
        return fail(d, WXG_ETOOBIG, "sync callback carries %zu messages; the limit is %d",
                    msgs->nchild, WXG_DECODE_MAX_MESSAGES);
    size_t i = 0;
    for (const jnode *e = msgs->child; e != NULL; e = e->next, i++) {
        char pb[7][64];
        const jnode *self;
        tval from, to, id, ts, sub, text;
        if (e->type != J_OBJ)
            return fail(d, WXG_EFORMAT, "sync callback: Data.messages[%zu] is not an object", i);
        static const char *const names[] = {"fromUser", "toUser", "newMsgId", "createTime",
                                            "msgType",  "text",   "isSelf"};
        for (int k = 0; k < 7; k++)
            snprintf(pb[k], sizeof pb[k], "Data.messages[%zu].%s", i, names[k]);
        if (get_tv(d, e, "fromUser", pb[0], 0, &from) || get_tv(d, e, "toUser", pb[1], 0, &to) ||
            get_tv(d, e, "newMsgId", pb[2], 1, &id) || get_tv(d, e, "createTime", pb[3], 0, &ts) ||
            get_tv(d, e, "msgType", pb[4], 0, &sub) || get_tv(d, e, "text", pb[5], 0, &text) ||
            jget(d, e, "isSelf", pb[6], 0, &self))
            return d->err;
        draft *m = new_draft(d, WXG_FORMAT_GEWE, e->raw, e->raw_len);
        if (m == NULL || gewe_account(d, m, wxid, appid) != 0)
            return d->err;
        if (concat_type(d, mtype, &sub, &m->type) != 0)
            return d->err;
        char *path = arena_strndup(&d->scratch, pb[2], strlen(pb[2]));
        if (path == NULL)
            return nomem(d);
        m->id = id;
        m->id_path = path;
        m->ctime = ts;
        m->is_self = self != NULL ? self->type == J_TRUE : tv_eqv(&from, &m->account);
        if (text.kind == TV_STR)
            m->content = text;
        gateway_chat(m, &from, &to);
        if (m->content.kind != TV_STR && canon_tv(d, e, &m->body) != 0)
            return d->err;
    }
    return 0;
}

static int dec_gewe(dctx *d, const jnode *root)
{
    const jnode *data, *msgs;
    tval tname, wxid, appid, mtype;
    if (get_tv(d, root, "TypeName", "TypeName", 0, &tname) ||
        get_tv(d, root, "Wxid", "Wxid", 0, &wxid) || get_tv(d, root, "Appid", "Appid", 0, &appid) ||
        get_tv(d, root, "MessageType", "MessageType", 0, &mtype) ||
        jget(d, root, "Data", "Data", 0, &data))
        return d->err;
    const jnode *probe = probe_of(root);
    if (wxid.kind == TV_ABSENT && appid.kind == TV_ABSENT && probe != NULL)
        return add_probe(d, root, probe, WXG_FORMAT_GEWE);
    if (tname.kind == TV_ABSENT) {
        if (jget(d, data, "messages", "Data.messages", 0, &msgs) != 0)
            return d->err;
        if (msgs != NULL) {
            if (wxid.kind == TV_ABSENT && appid.kind == TV_ABSENT)
                return fail(d, WXG_ENOACCOUNT, "sync callback has no Wxid (the bot account)");
            tval t = tv_text(&mtype) ? mtype : tv_str("sync", 4);
            return dec_sync_batch(d, &wxid, &appid, &t, msgs);
        }
    }
    tval from, to, content, id, ts, sub, user;
    if (get_wrapped(d, data, "FromUserName", "Data.FromUserName", &from) ||
        get_wrapped(d, data, "ToUserName", "Data.ToUserName", &to) ||
        get_wrapped(d, data, "Content", "Data.Content", &content) ||
        get_wrapped(d, data, "UserName", "Data.UserName", &user) ||
        get_tv(d, data, "NewMsgId", "Data.NewMsgId", 1, &id) ||
        get_tv(d, data, "CreateTime", "Data.CreateTime", 0, &ts) ||
        get_tv(d, data, "MsgType", "Data.MsgType", 0, &sub))
        return d->err;
    draft *m = new_draft(d, WXG_FORMAT_GEWE, d->rec, d->rec_len);
    if (m == NULL || gewe_account(d, m, &wxid, &appid) != 0)
        return d->err;
    if (!tv_text(&tname))
        return fail(d, WXG_EFORMAT, "GeWe callback has no TypeName");
    if (concat_type(d, &tname, &sub, &m->type) != 0)
        return d->err;
    m->id = id;
    m->id_path = "Data.NewMsgId";
    m->ctime = ts;
    m->is_self = tv_eqv(&from, &m->account);
    if (content.kind == TV_STR)
        m->content = content;
    if (tv_text(&from) || tv_text(&to)) {
        gateway_chat(m, &from, &to);
    } else if (user.kind == TV_STR) {
        /* Contact and group changes: the chat is the changed contact or room. */
        m->conversation = user;
        m->is_group = ends_with(&user, "@chatroom");
    }
    if (m->content.kind != TV_STR && data != NULL)
        return canon_tv(d, data, &m->body);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Official Account (XML and JSON share the field rules).                                      */

enum {
    OA_TO,
    OA_FROM,
    OA_CTIME,
    OA_MSGTYPE,
    OA_CONTENT,
    OA_MSGID,
    OA_MSGID_D,
    OA_EVENT,
    OA_EVENTKEY,
    OA_ENCRYPT,
    OA_NFIELDS
};
static const char *const oa_names[OA_NFIELDS] = {
    "ToUserName", "FromUserName", "CreateTime", "MsgType",  "Content",
    "MsgId",      "MsgID",        "Event",      "EventKey", "Encrypt",
};

static int oa_is_id(int i)
{
    return i == OA_MSGID || i == OA_MSGID_D;
}

static int dec_oa(dctx *d, wxg_format_t f, tval *v)
{
    const char *fmt = f == WXG_FORMAT_OA_XML ? "Official Account XML" : "Official Account JSON";
    if (v[OA_MSGTYPE].kind == TV_ABSENT && v[OA_ENCRYPT].kind != TV_ABSENT)
        return fail(d, WXG_EFORMAT,
                    "%s push is encrypted (safe mode): decrypt it before it is queued", fmt);
    draft *m = new_draft(d, f, d->rec, d->rec_len);
    if (m == NULL || account_field(d, m, &v[OA_TO], "ToUserName", fmt) != 0)
        return d->err;
    /* MsgId (messages) and MsgID (job-finish events) are two spellings of one field; no other
     * case variant is read. Both present with different values is a conflict. */
    tval *id = &v[OA_MSGID];
    const char *id_path = "MsgId";
    if (v[OA_MSGID].kind != TV_ABSENT && v[OA_MSGID_D].kind != TV_ABSENT) {
        if (!tv_eqv(&v[OA_MSGID], &v[OA_MSGID_D]))
            return fail(d, WXG_EIDCONFLICT, "%s push carries MsgId and MsgID with different values",
                        fmt);
    } else if (v[OA_MSGID].kind == TV_ABSENT) {
        id = &v[OA_MSGID_D];
        id_path = "MsgID";
    }
    m->id = *id;
    m->id_path = id_path;
    m->sender = v[OA_FROM];
    m->conversation = v[OA_FROM];
    m->to = v[OA_TO];
    m->ctime = v[OA_CTIME];
    if (tv_eq(&v[OA_MSGTYPE], "event")) {
        m->oa = OA_EVT;
        m->oa_event = v[OA_EVENT];
        m->oa_evkey = v[OA_EVENTKEY];
        tval ev = tv_text(&v[OA_EVENT]) ? v[OA_EVENT] : tv_str("", 0);
        if (concat_type(d, &v[OA_MSGTYPE], &ev, &m->type) != 0)
            return d->err;
        /* An event's argument (menu key, QR scene) is its content. */
        if (v[OA_EVENTKEY].kind == TV_STR)
            m->content = v[OA_EVENTKEY];
    } else {
        m->oa = OA_MSG;
        if (tv_text(&v[OA_MSGTYPE]))
            m->type = v[OA_MSGTYPE];
        if (v[OA_CONTENT].kind == TV_STR)
            m->content = v[OA_CONTENT];
    }
    return 0;
}

static int dec_oa_json(dctx *d, const jnode *root)
{
    tval v[OA_NFIELDS];
    for (int i = 0; i < OA_NFIELDS; i++) {
        if (get_tv(d, root, oa_names[i], oa_names[i], oa_is_id(i), &v[i]) != 0)
            return d->err;
    }
    const jnode *probe = probe_of(root);
    if (v[OA_TO].kind == TV_ABSENT && probe != NULL)
        return add_probe(d, root, probe, WXG_FORMAT_OA_JSON);
    return dec_oa(d, WXG_FORMAT_OA_JSON, v);
}

/* ---- XML ---- */

static const char *find_seq(const char *p, const char *end, const char *s)
{
    size_t n = strlen(s);
    for (; (size_t)(end - p) >= n; p++) {
        if (memcmp(p, s, n) == 0)
            return p;
    }
    return NULL;
}

static int starts(const char *p, const char *end, const char *s)
{
    size_t n = strlen(s);
    return (size_t)(end - p) >= n && memcmp(p, s, n) == 0;
}

/* Refuses declarations and counts element nesting before libxml2 sees the bytes. Malformed
 * markup is left for libxml2 to report. */
static int xml_prescan(dctx *d, const char *p, const char *end)
{
    int depth = 0;
    while (p < end) {
        if (*p != '<') {
            p++;
            continue;
        }
        const char *q;
        if (starts(p, end, "<!--")) {
            q = find_seq(p + 4, end, "-->");
            if (q == NULL)
                return 0;
            p = q + 3;
        } else if (starts(p, end, "<![CDATA[")) {
            q = find_seq(p + 9, end, "]]>");
            if (q == NULL)
                return 0;
            p = q + 3;
        } else if (starts(p, end, "<?")) {
            q = find_seq(p + 2, end, "?>");
            if (q == NULL)
                return 0;
            p = q + 2;
        } else if (starts(p, end, "<!")) {
            return fail(d, WXG_EPARSE,
                        "XML declarations (DOCTYPE, ENTITY) are not accepted in a push");
        } else if (starts(p, end, "</")) {
            depth--;
            q = memchr(p, '>', (size_t)(end - p));
            if (q == NULL)
                return 0;
            p = q + 1;
        } else {
            char quote = 0;
            q = p + 1;
            while (q < end && (quote || *q != '>')) {
                if (quote && *q == quote)
                    quote = 0;
                else if (!quote && (*q == '"' || *q == '\''))
                    quote = *q;
                q++;
            }
            if (q >= end)
                return 0;
            if (q[-1] != '/' && ++depth > d->max_depth)
                return fail(d, WXG_EDEPTH, "XML nested deeper than %d levels", d->max_depth);
            p = q + 1;
        }
    }
    return 0;
}

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;

static void xml_init(void)
{
    xmlInitParser();
}

/* libxml2's message, reduced to printable ASCII and trimmed. */
static void xml_reason(const xmlError *e, char *out, size_t outsz)
{
    const char *msg = e != NULL && e->message != NULL ? e->message : "unknown error";
    size_t n = 0;
    for (size_t i = 0; msg[i] != '\0' && n + 1 < outsz && i < 160; i++) {
        unsigned char c = (unsigned char)msg[i];
        if (c == '\n' || c == '\r')
            continue;
        out[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    out[n] = '\0';
}

/* Parses an Official Account XML push and reads its fields into v (copies in the scratch
 * arena, so they outlive the parse). */
static int oa_xml_fields(dctx *d, const char *buf, size_t len, tval *v)
{
    memset(v, 0, OA_NFIELDS * sizeof *v);
    if (xml_prescan(d, buf, buf + len) != 0)
        return d->err;
    if (len > INT_MAX)
        return fail(d, WXG_ETOOBIG, "XML record larger than the XML parser accepts");
    pthread_once(&xml_once, xml_init);
    xmlParserCtxtPtr ctxt = xmlNewParserCtxt();
    if (ctxt == NULL)
        return nomem(d);
    xmlDocPtr doc = NULL;
    /* NONET: no network. Not NOENT (no entity substitution), not DTDLOAD (no external DTD). */
    doc = xmlCtxtReadMemory(ctxt, buf, (int)len, NULL, NULL,
                            XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    if (doc == NULL) {
        char why[200];
        const xmlError *e = xmlCtxtGetLastError(ctxt);
        xml_reason(e, why, sizeof why);
        fail(d, WXG_EPARSE, "invalid XML at line %d: %s", e ? e->line : 0, why);
        goto out;
    }
    if (doc->intSubset != NULL || doc->extSubset != NULL) {
        fail(d, WXG_EPARSE, "XML declarations (DOCTYPE, ENTITY) are not accepted in a push");
        goto out;
    }
    xmlNodePtr root = xmlDocGetRootElement(doc);
    if (root == NULL || root->name == NULL || strcmp((const char *)root->name, "xml") != 0) {
        fail(d, WXG_EFORMAT, "Official Account XML push: the root element is not <xml>");
        goto out;
    }
    for (xmlNodePtr c = root->children; c != NULL; c = c->next) {
        if (c->type != XML_ELEMENT_NODE)
            continue;
        int i;
        for (i = 0; i < OA_NFIELDS; i++) {
            if (strcmp((const char *)c->name, oa_names[i]) == 0)
                break;
        }
        if (i == OA_NFIELDS)
            continue;
        xmlChar *text = xmlNodeGetContent(c);
        if (text == NULL) {
            nomem(d);
            goto out;
        }
        size_t tl = strlen((const char *)text);
        if (v[i].kind != TV_ABSENT) {
            int same = v[i].n == tl && memcmp(v[i].p, text, tl) == 0;
            xmlFree(text);
            if (!same) {
                fail(d, oa_is_id(i) ? WXG_EIDCONFLICT : WXG_EPARSE,
                     "field %s appears more than once with different values", oa_names[i]);
                goto out;
            }
            continue;
        }
        char *copy = arena_strndup(&d->scratch, (const char *)text, tl);
        xmlFree(text);
        if (copy == NULL) {
            nomem(d);
            goto out;
        }
        v[i] = tv_str(copy, tl);
    }
out:
    xmlFreeDoc(doc);
    xmlFreeParserCtxt(ctxt);
    return d->err;
}

static int dec_oa_xml(dctx *d, const char *buf, size_t len)
{
    tval v[OA_NFIELDS];
    if (oa_xml_fields(d, buf, len, v) != 0)
        return d->err;
    return dec_oa(d, WXG_FORMAT_OA_XML, v);
}

/* ------------------------------------------------------------------------------------------ */
/* Generic form.                                                                               */

static int dec_generic(dctx *d, const jnode *root)
{
    const jnode *grp, *self;
    tval acct, id, conv, sender, to, ts, type, content;
    if (get_tv(d, root, "account", "account", 0, &acct) ||
        get_tv(d, root, "msg_id", "msg_id", 1, &id) ||
        get_tv(d, root, "conversation", "conversation", 0, &conv) ||
        get_tv(d, root, "sender", "sender", 0, &sender) || get_tv(d, root, "to", "to", 0, &to) ||
        get_tv(d, root, "create_time", "create_time", 0, &ts) ||
        get_tv(d, root, "type", "type", 0, &type) ||
        get_tv(d, root, "content", "content", 0, &content) ||
        jget(d, root, "is_group", "is_group", 0, &grp) ||
        jget(d, root, "is_self", "is_self", 0, &self))
        return d->err;
    const jnode *probe = probe_of(root);
    if (acct.kind == TV_ABSENT && probe != NULL)
        return add_probe(d, root, probe, WXG_FORMAT_GENERIC);
    draft *m = new_draft(d, WXG_FORMAT_GENERIC, d->rec, d->rec_len);
    if (m == NULL || account_field(d, m, &acct, "account", "generic") != 0)
        return d->err;
    m->id = id;
    m->id_path = "msg_id";
    m->ctime = ts;
    if (tv_text(&type))
        m->type = type;
    if (conv.kind == TV_STR)
        m->conversation = conv;
    if (sender.kind == TV_STR)
        m->sender = sender;
    if (to.kind == TV_STR)
        m->to = to;
    if (content.kind == TV_STR)
        m->content = content;
    else
        return canon_tv(d, root, &m->body);
    m->is_group = grp != NULL && grp->type == J_TRUE;
    m->is_self = self != NULL && self->type == J_TRUE;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Detection and views.                                                                        */

static int dec_json(dctx *d, wxg_format_t f, const char *buf, size_t len, size_t skip)
{
    jnode *root;
    if (jparse(d, buf, len, skip, &root) != 0)
        return d->err;
    if (root->type != J_OBJ)
        return fail(d, WXG_EFORMAT, "the record's top-level JSON value is not an object");
    if (f == WXG_FORMAT_AUTO) {
        if (jhas(root, "TypeName") || (jhas(root, "MessageType") && jhas(root, "Wxid")))
            f = WXG_FORMAT_GEWE;
        else if (jhas(root, "wcId") || (jhas(root, "messageType") && jhas(root, "data")))
            f = WXG_FORMAT_WKTEAM;
        else if (jhas(root, "ToUserName"))
            f = WXG_FORMAT_OA_JSON;
        else if (jhas(root, "account") &&
                 (jhas(root, "msg_id") || jhas(root, "content") || jhas(root, "conversation") ||
                  jhas(root, "sender") || jhas(root, "type") || jhas(root, "create_time")))
            f = WXG_FORMAT_GENERIC;
        else if (probe_of(root) != NULL)
            f = jhas(root, "testMsg") ? WXG_FORMAT_GEWE : WXG_FORMAT_WKTEAM;
        else
            return fail(d, WXG_EFORMAT,
                        "unrecognised JSON callback: none of wcId, TypeName, MessageType+Wxid, "
                        "ToUserName or account is present");
    }
    switch (f) {
    case WXG_FORMAT_WKTEAM:
        return dec_wkteam(d, root);
    case WXG_FORMAT_GEWE:
        return dec_gewe(d, root);
    case WXG_FORMAT_OA_JSON:
        return dec_oa_json(d, root);
    case WXG_FORMAT_GENERIC:
        return dec_generic(d, root);
    default:
        return fail(d, WXG_EINVAL, "format is not a JSON format");
    }
}

static int utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/* Parses a seconds value (integer text, no sign) into *out; 0 on success. */
static int parse_time(const tval *v, int64_t *out)
{
    if (!tv_text(v) || v->n == 0 || v->n > 19)
        return -1;
    if (v->n > 1 && v->p[0] == '0')
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (!is_digit(v->p[i]))
            return -1;
        x = x * 10 + (uint64_t)(v->p[i] - '0');
    }
    if (x > (uint64_t)INT64_MAX)
        return -1;
    *out = (int64_t)x;
    return 0;
}

static wxg_key_field_t kf(const tval *v)
{
    wxg_key_field_t f = {NULL, 0};
    if (tv_text(v)) {
        f.ptr = v->p;
        f.len = v->n;
    }
    return f;
}

static wxg_key_field_t kfs(const char *s)
{
    wxg_key_field_t f = {s, strlen(s)};
    return f;
}

static const char *keep_tv(dctx *d, const tval *v)
{
    if (!tv_text(v))
        return arena_strndup(d->keep, "", 0);
    return arena_strndup(d->keep, v->p, v->n);
}

/* Describes why an id was not used, e.g. "data.newMsgId is a negative number". */
static void id_problem(const draft *m, char *out, size_t outsz)
{
    const char *path = m->id_path ? m->id_path : "id";
    switch (m->id.kind) {
    case TV_ABSENT:
        snprintf(out, outsz, "no %s", path);
        return;
    case TV_NULL:
        snprintf(out, outsz, "%s is null", path);
        return;
    case TV_OTHER:
        snprintf(out, outsz, "%s is not a number or string", path);
        return;
    default:
        snprintf(out, outsz, "%s is %s", path, wxg_id_verdict_str(wxg_id_check(m->id.p, m->id.n)));
        return;
    }
}

/* out = a b c, cut to fit. The key reasons of the common keys are built for every message, and
 * snprintf's format parsing cost more than the rest of their making. */
static void join3(char *out, size_t cap, const char *a, const char *b, const char *c)
{
    const char *parts[3] = {a, b, c};
    size_t n = 0;
    for (size_t i = 0; i < 3 && cap > 0; i++) {
        size_t len = strlen(parts[i]);
        if (len > cap - 1 - n)
            len = cap - 1 - n;
        memcpy(out + n, parts[i], len);
        n += len;
    }
    if (cap > 0)
        out[n] = '\0';
}

/* The decimal text of t in out (at least 22 bytes). */
static void put_i64(char *out, int64_t t)
{
    size_t n = 0;
    if (t < 0)
        out[n++] = '-';
    n += wxg__put_dec(out + n, t < 0 ? 0 - (uint64_t)t : (uint64_t)t);
    out[n] = '\0';
}

static int has_nul(const tval *v)
{
    return tv_text(v) && memchr(v->p, '\0', v->n) != NULL;
}

static int finish(dctx *d, const draft *m, wxg_msg_view_t *v)
{
    char key[WXG_KEY_MAX], reason[200], why[120], ct[24];
    const struct {
        const tval *v;
        const char *name;
    } idf[] = {{&m->account, "account"},
               {&m->conversation, "conversation"},
               {&m->sender, "sender"},
               {&m->to, "receiver"},
               {&m->type, "type"}};
    for (size_t i = 0; i < sizeof idf / sizeof idf[0]; i++) {
        if (has_nul(idf[i].v))
            return fail(d, WXG_EPARSE, "the %s field contains a NUL character", idf[i].name);
    }
    memset(v, 0, sizeof *v);
    v->format = m->format;
    int64_t t = 0;
    int time_ok = parse_time(&m->ctime, &t) == 0;
    v->create_time = time_ok ? t : 0;
    tval ctime_text = m->ctime;
    if (time_ok) {
        put_i64(ct, t);
        ctime_text = tv_str(ct, strlen(ct));
    }
    int id_ok = tv_text(&m->id) && wxg_id_check(m->id.p, m->id.n) == WXG_ID_OK;
    const char *acct = m->no_account ? NULL : m->account.p;
    size_t acct_len = m->no_account ? 0 : m->account.n;
    const char *fmtname = wxg_format_name(m->format);
    const char *note = m->account_note ? m->account_note : "";
    int rc;
    if (m->oa == OA_EVT) {
        wxg_key_event_t ev = {kf(&m->sender), kf(&ctime_text), kf(&m->oa_event), kf(&m->oa_evkey),
                              kf(&m->id)};
        rc = wxg_key_oa_event(key, sizeof key, acct, acct_len, &ev);
        v->key_kind = WXG_KEY_OA_EVENT;
        join3(reason, sizeof reason,
              "event tuple (FromUserName, CreateTime, Event, EventKey, MsgID)", note, "");
    } else if (m->oa == OA_MSG && id_ok && m->sender.n > 0 && time_ok) {
        rc = wxg_key_oa_msg(key, sizeof key, acct, acct_len, m->id.p, m->id.n, m->sender.p,
                            m->sender.n, t);
        v->key_kind = WXG_KEY_OA_MSG;
        char what[120];
        join3(what, sizeof what, "message tuple (", m->id_path ? m->id_path : "id",
              ", FromUserName, CreateTime)");
        join3(reason, sizeof reason, what, note, "");
    } else if (m->oa == 0 && id_ok) {
        rc = wxg_key_server(key, sizeof key, acct, acct_len, m->id.p, m->id.n);
        v->key_kind = WXG_KEY_SERVER_ID;
        join3(reason, sizeof reason, "server id from ", m->id_path ? m->id_path : "id", note);
    } else {
        const tval *body = m->body.kind != TV_ABSENT ? &m->body : &m->content;
        wxg_key_fingerprint_t fp = {
            kfs(fmtname), kf(&m->type),    kf(&m->sender), kf(&m->conversation),
            kf(&m->to),   kf(&ctime_text), kf(body)};
        rc = wxg_key_fingerprint(key, sizeof key, acct, acct_len, &fp);
        v->key_kind = WXG_KEY_FINGERPRINT;
        if (m->no_account) {
            snprintf(reason, sizeof reason, "fingerprint: URL-verification probe without account");
        } else if (m->oa == OA_MSG && id_ok) {
            snprintf(reason, sizeof reason, "fingerprint: %s without FromUserName or CreateTime%s",
                     m->id_path, note);
        } else {
            id_problem(m, why, sizeof why);
            snprintf(reason, sizeof reason, "fingerprint: %s%s", why, note);
        }
    }
    if (rc == WXG_ENOMEM)
        return nomem(d);
    if (rc != 0)
        return fail(d, WXG_EINVAL, "internal error: the key could not be built");

    v->account = m->no_account ? arena_strndup(d->keep, "", 0) : keep_tv(d, &m->account);
    v->conversation = keep_tv(d, &m->conversation);
    v->sender = keep_tv(d, &m->sender);
    v->to = keep_tv(d, &m->to);
    v->type = keep_tv(d, &m->type);
    v->msg_id = id_ok ? arena_strndup(d->keep, m->id.p, m->id.n) : NULL;
    v->content = keep_tv(d, &m->content);
    v->content_len = m->content.kind == TV_STR ? m->content.n : 0;
    v->key = arena_strndup(d->keep, key, strlen(key));
    v->key_reason = arena_strndup(d->keep, reason, strlen(reason));
    if (!v->account || !v->conversation || !v->sender || !v->to || !v->type ||
        (id_ok && !v->msg_id) || !v->content || !v->key || !v->key_reason)
        return nomem(d);
    v->is_group = m->is_group;
    v->is_self = m->is_self;
    v->content_is_utf8 = utf8_valid((const unsigned char *)v->content, v->content_len);
    v->raw = m->raw;
    v->raw_len = m->raw_len;

    /* payload_hash: the fields a plugin acts on, never volatile envelope fields. */
    static const char tag[] = "wxg.p.v1";
    wxg_key_field_t pf[] = {
        {tag, sizeof tag - 1},
        kfs(fmtname),
        kfs(v->account),
        kfs(v->conversation),
        kfs(v->sender),
        kfs(v->to),
        {v->msg_id, v->msg_id ? strlen(v->msg_id) : 0},
        kf(&ctime_text),
        kfs(v->type),
        {v->content, v->content_len},
        {v->is_group ? "1" : "0", 1},
        {v->is_self ? "1" : "0", 1},
    };
    if (wxg_key_hash_fields(pf, sizeof pf / sizeof pf[0], v->payload_hash) != 0)
        return nomem(d);
    return 0;
}

struct wxg_batch_s {
    arena a;
    wxg_msg_view_t *msgs;
    size_t n;
};

/* Sets up a decode context from the options and checks the size cap (the context carries the
 * error then). */
static int dctx_start(dctx *d, const wxg_decode_opts_t *opts, size_t len, char *errstr,
                      size_t errstr_size)
{
    size_t max_bytes = opts && opts->max_bytes ? opts->max_bytes : WXG_DECODE_DEFAULT_MAX_BYTES;
    int max_depth = opts && opts->max_depth > 0 ? opts->max_depth : WXG_DECODE_DEFAULT_MAX_DEPTH;
    if (max_depth > WXG_DECODE_LIMIT_MAX_DEPTH)
        max_depth = WXG_DECODE_LIMIT_MAX_DEPTH;
    memset(d, 0, sizeof *d);
    d->max_depth = max_depth;
    d->errstr = errstr;
    d->errsz = errstr_size;
    if (len > max_bytes)
        return fail(d, WXG_ETOOBIG, "record is %zu bytes; the limit is %zu", len, max_bytes);
    return 0;
}

/* The offset of the first byte after a UTF-8 byte-order mark and blanks. */
static size_t skip_blank(const char *rec, size_t len)
{
    size_t skip = 0;
    if (len >= 3 && memcmp(rec, "\xef\xbb\xbf", 3) == 0)
        skip = 3;
    while (skip < len &&
           (rec[skip] == ' ' || rec[skip] == '\t' || rec[skip] == '\n' || rec[skip] == '\r'))
        skip++;
    return skip;
}

int wxg_decode(const void *buf, size_t len, const wxg_decode_opts_t *opts, wxg_batch_t **out,
               char *errstr, size_t errstr_size)
{
    if (errstr != NULL && errstr_size > 0)
        errstr[0] = '\0';
    if (out == NULL || (buf == NULL && len > 0)) {
        if (errstr != NULL && errstr_size > 0)
            wxg__errf(errstr, errstr_size, "invalid arguments to wxg_decode");
        return WXG_EINVAL;
    }
    *out = NULL;
    wxg_format_t f = opts ? opts->format : WXG_FORMAT_AUTO;
    dctx d;
    if ((int)f < (int)WXG_FORMAT_AUTO || (int)f > (int)WXG_FORMAT_GENERIC) {
        dctx_start(&d, NULL, 0, errstr, errstr_size);
        return fail(&d, WXG_EINVAL, "unknown format %d", (int)f);
    }
    if (dctx_start(&d, opts, len, errstr, errstr_size) != 0)
        return d.err;

    /* The batch lives in its own arena's first chunk: one allocation per record. */
    arena keep = {.first = arena_size_for(len), .cache = opts ? opts->cache : NULL};
    wxg_batch_t *b = arena_alloc(&keep, sizeof *b);
    if (b == NULL)
        return nomem(&d);
    memset(b, 0, sizeof *b);
    b->a = keep;
    scratch_buf scratch_mem;
    arena_lend(&d.scratch, &scratch_mem, arena_size_for(len));
    d.keep = &b->a;
    char *rec = arena_alloc(&b->a, len + 1);
    if (rec == NULL) {
        nomem(&d);
        goto out;
    }
    if (len > 0)
        memcpy(rec, buf, len);
    rec[len] = '\0';
    d.rec = rec;
    d.rec_len = len;

    size_t skip = skip_blank(rec, len);
    if (skip == len) {
        fail(&d, WXG_EPARSE, "empty record");
        goto out;
    }
    if (f == WXG_FORMAT_AUTO && rec[skip] == '<')
        f = WXG_FORMAT_OA_XML;
    if (f == WXG_FORMAT_OA_XML) {
        if (dec_oa_xml(&d, rec, len) != 0)
            goto out;
    } else {
        if (f == WXG_FORMAT_AUTO && rec[skip] != '{' && rec[skip] != '[') {
            fail(&d, WXG_EPARSE, "record is neither JSON nor XML (first byte 0x%02x)",
                 (unsigned)(unsigned char)rec[skip]);
            goto out;
        }
        if (dec_json(&d, f, rec, len, skip) != 0)
            goto out;
    }

    if (d.ndrafts > 0) {
        b->msgs = arena_alloc(&b->a, d.ndrafts * sizeof *b->msgs);
        if (b->msgs == NULL) {
            nomem(&d);
            goto out;
        }
        for (size_t i = 0; i < d.ndrafts; i++) {
            if (finish(&d, &d.drafts[i], &b->msgs[i]) != 0)
                goto out;
        }
    }
    b->n = d.ndrafts;
out:
    arena_free(&d.scratch);
    if (d.err != 0) {
        wxg_batch_free(b);
        return d.err;
    }
    *out = b;
    return 0;
}

/* The safe-mode envelope: the same parsers, limits and refusals as wxg_decode(), but only the
 * Encrypt field is read. */
int wxg_decode_oa_encrypt(const void *buf, size_t len, const wxg_decode_opts_t *opts, char **out,
                          size_t *out_len, char *errstr, size_t errstr_size)
{
    if (errstr != NULL && errstr_size > 0)
        errstr[0] = '\0';
    if (out == NULL || out_len == NULL || (buf == NULL && len > 0)) {
        if (errstr != NULL && errstr_size > 0)
            wxg__errf(errstr, errstr_size, "invalid arguments to wxg_decode_oa_encrypt");
        return WXG_EINVAL;
    }
    *out = NULL;
    *out_len = 0;
    dctx d;
    if (dctx_start(&d, opts, len, errstr, errstr_size) != 0)
        return d.err;
    scratch_buf scratch_mem;
    arena_lend(&d.scratch, &scratch_mem, arena_size_for(len));
    const char *rec = buf;
    size_t skip = skip_blank(rec, len);
    tval v[OA_NFIELDS];
    memset(v, 0, sizeof v);
    if (skip == len) {
        fail(&d, WXG_EPARSE, "empty record");
    } else if (rec[skip] == '<') {
        oa_xml_fields(&d, rec, len, v);
    } else {
        jnode *root;
        if (jparse(&d, rec, len, skip, &root) == 0) {
            if (root->type != J_OBJ)
                fail(&d, WXG_EFORMAT, "the record's top-level JSON value is not an object");
            else
                get_tv(&d, root, oa_names[OA_ENCRYPT], oa_names[OA_ENCRYPT], 0, &v[OA_ENCRYPT]);
        }
    }
    if (d.err == 0 && v[OA_ENCRYPT].kind != TV_STR)
        fail(&d, WXG_EFORMAT,
             v[OA_ENCRYPT].kind == TV_ABSENT
                 ? "encrypted Official Account push without an Encrypt field"
                 : "the Encrypt field of an Official Account push is not a string");
    if (d.err == 0) {
        *out = malloc(v[OA_ENCRYPT].n + 1);
        if (*out == NULL) {
            nomem(&d);
        } else {
            memcpy(*out, v[OA_ENCRYPT].p, v[OA_ENCRYPT].n);
            (*out)[v[OA_ENCRYPT].n] = '\0';
            *out_len = v[OA_ENCRYPT].n;
        }
    }
    arena_free(&d.scratch);
    return d.err;
}

size_t wxg_batch_count(const wxg_batch_t *b)
{
    return b ? b->n : 0;
}

const wxg_msg_view_t *wxg_batch_msg(const wxg_batch_t *b, size_t i)
{
    if (b == NULL || i >= b->n)
        return NULL;
    return &b->msgs[i];
}

void wxg_batch_free(wxg_batch_t *b)
{
    if (b == NULL)
        return;
    arena a = b->a; /* b itself lives in one of the arena's chunks */
    arena_free(&a);
}

static const char *const format_names[] = {"auto",   "wkteam",  "gewe",
                                           "oa-xml", "oa-json", "generic"};

const char *wxg_format_name(wxg_format_t f)
{
    if ((int)f < 0 || (size_t)f >= sizeof format_names / sizeof format_names[0])
        return "unknown";
    return format_names[f];
}

int wxg_format_parse(const char *name, wxg_format_t *out)
{
    if (name == NULL || out == NULL)
        return WXG_EINVAL;
    for (size_t i = 0; i < sizeof format_names / sizeof format_names[0]; i++) {
        if (strcmp(name, format_names[i]) == 0) {
            *out = (wxg_format_t)i;
            return 0;
        }
    }
    return WXG_EINVAL;
}
