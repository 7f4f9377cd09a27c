/*
 * Message decoding: one callback record (bytes) in, one or more decoded messages out.
 *
 * Supported formats (rules and decisions: docs/keys.md):
 *   wkteam   {"wcId", "messageType", "data": {"newMsgId", "fromUser", "fromGroup", ...}}
 *   gewe     {"TypeName", "Appid", "Wxid", "Data": {"NewMsgId", "FromUserName": {"string"}, ...}}
 *            and the batched {"MessageType", "Wxid", "Data": {"messages": [...]}} sync callbacks
 *   oa-xml   Official Account push, <xml><ToUserName>...</xml>
 *   oa-json  the same fields as a flat JSON object
 *   generic  {"account", "msg_id", "conversation", "sender", "create_time", "type", "content"}
 *
 * Decoding is pure: no I/O, no global state besides libxml2's one-time initialisation. Ids keep
 * every digit whether they arrive as JSON numbers or strings: the JSON reader of lib/msg.c keeps
 * the literal text of number tokens and the exact bytes of strings (NULs included).
 *
 * Thread safety: wxg_decode() may run on many threads at once. A batch and its views may be read
 * from any thread but freed once.
 */
#ifndef WXGUARD_MSG_H
#define WXGUARD_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"

typedef enum wxg_format {
    WXG_FORMAT_AUTO = 0,
    WXG_FORMAT_WKTEAM,
    WXG_FORMAT_GEWE,
    WXG_FORMAT_OA_XML,
    WXG_FORMAT_OA_JSON,
    WXG_FORMAT_GENERIC
} wxg_format_t;

typedef enum wxg_key_kind { /* DESIGN §3: kinds never collide */
                            WXG_KEY_SERVER_ID = 'n',
                            WXG_KEY_OA_MSG = 'm',
                            WXG_KEY_OA_EVENT = 'e',
                            WXG_KEY_FINGERPRINT = 'h'
} wxg_key_kind_t;

/* One decoded message, as handed to plugins. Read-only. Strings are NUL-terminated and never
 * NULL except msg_id; content may hold NUL bytes, so use content_len. Valid until the owning
 * batch is freed. */
typedef struct wxg_msg_view {
    wxg_format_t format;
    const char *account;      /* stable bot id (wkteam wcId, GeWe Wxid, OA ToUserName, generic
                                 account); "" only for a URL-verification probe */
    const char *conversation; /* group id for group messages, otherwise the peer; "" when unknown */
    const char *sender;       /* "" when unknown */
    const char *msg_id;  /* exact decimal string (<= 2^64-1), or NULL when the message has none */
    int64_t create_time; /* seconds since the epoch, 0 when absent */
    const char *type;    /* the format's own type, e.g. "60001", "AddMsg:1", "text",
                            "event:subscribe" */
    const char *content; /* decoded text bytes */
    size_t content_len;
    int is_group;    /* 1 for group chats */
    int is_self;     /* 1 when the bot's own account sent it */
    const char *key; /* idempotency key: "<account-part>:<kind>:<id-part>", e.g.
                        "wxid_fakebot000001:n:7301234567890123457"; never contains
                        untrusted raw text (validated or hashed parts only), never '{' '}' */
    wxg_key_kind_t key_kind;
    unsigned char payload_hash[32]; /* SHA-256 over the decoded fields that define the message
                                       (used by the guard to flag "same key, different payload");
                                       coverage in docs/keys.md */
    /* Fields below were added after the agreed shape. */
    const char *to;         /* receiver (wkteam toUser, GeWe ToUserName, OA ToUserName); "" */
    const char *key_reason; /* one sentence: which fields made the key and why, e.g. "server id
                               from data.newMsgId" or "fingerprint: data.newMsgId is a negative
                               number". Holds no raw input text. */
    int content_is_utf8;    /* 1 when content is valid UTF-8 (invalid bytes are kept as they are) */
    const char *raw;        /* this message's bytes in the record (the element of a batch, else the
                               whole record); not NUL-terminated; use raw_len */
    size_t raw_len;
} wxg_msg_view_t;

/* Memory a thread that decodes many records reuses from one batch to the next: the chunks of
 * freed batches are kept (up to a byte budget) instead of going back to malloc. Optional; the
 * consumer's poll thread uses one.
 *
 * Ownership and threads: the creator frees it with wxg_decode_cache_free(), after every batch
 * decoded with it has been freed. It has no lock: decoding with it and freeing its batches must
 * happen on one thread at a time. */
typedef struct wxg_decode_cache_s wxg_decode_cache_t;

/* A cache that keeps at most about max_bytes of freed chunks (at least 64 KiB). NULL when out of
 * memory. */
WXG_EXPORT wxg_decode_cache_t *wxg_decode_cache_new(size_t max_bytes);

/* Frees the cache and the chunks it kept. Accepts NULL. */
WXG_EXPORT void wxg_decode_cache_free(wxg_decode_cache_t *c);

/* The bytes the cache keeps now (0 for NULL), never more than its budget. Same thread rules. */
WXG_EXPORT size_t wxg_decode_cache_bytes(const wxg_decode_cache_t *c);

typedef struct wxg_decode_opts {
    wxg_format_t format; /* WXG_FORMAT_AUTO detects from the content */
    size_t max_bytes;    /* size cap checked before parsing; 0 = default (1 MiB) */
    int max_depth;       /* nesting cap; 0 = default (32); values above 512 are treated as 512 */
    wxg_decode_cache_t *cache; /* NULL, or where the batch takes its memory from and gives it
                                  back to in wxg_batch_free() (see wxg_decode_cache_t) */
} wxg_decode_opts_t;

#define WXG_DECODE_DEFAULT_MAX_BYTES ((size_t)1 << 20)
#define WXG_DECODE_DEFAULT_MAX_DEPTH 32
#define WXG_DECODE_LIMIT_MAX_DEPTH   512
/* The most messages one batched record may carry (more is WXG_ETOOBIG). */
#define WXG_DECODE_MAX_MESSAGES 10000

/* One record -> zero or more messages (batched sync callbacks; an empty batch has none). */
typedef struct wxg_batch_s wxg_batch_t;

/* Decodes one record of len bytes (need not be NUL-terminated). On success returns 0 and *out
 * owns every message view; free it with wxg_batch_free(). On failure returns a negative WXG_E*
 * code (ETOOBIG, EDEPTH, EPARSE, EFORMAT, ENOACCOUNT, EIDCONFLICT, ENOMEM, EINVAL), leaves *out
 * NULL and writes a human-readable reason to errstr when errstr_size > 0 (printable ASCII; it
 * quotes no payload text beyond the element names libxml2 may mention).
 * opts may be NULL (defaults). buf may be NULL only when len is 0. Thread-safe. */
WXG_EXPORT int wxg_decode(const void *buf, size_t len, const wxg_decode_opts_t *opts,
                          wxg_batch_t **out, char *errstr, size_t errstr_size);

/* Reads the Encrypt field of an encrypted ("safe mode" or "compatible mode") Official Account
 * push: XML when the first non-blank byte is '<', JSON otherwise, with wxg_decode()'s parsers,
 * size and depth limits and refusals (no DTD, no entities). opts may be NULL; only max_bytes and
 * max_depth are used. On success returns 0 and sets *out to a malloc'd NUL-terminated copy of
 * the field (*out_len bytes, not counting the NUL), which the caller frees. Errors: WXG_EPARSE,
 * WXG_EDEPTH, WXG_ETOOBIG as wxg_decode(); WXG_EFORMAT when there is no Encrypt string;
 * WXG_EINVAL, WXG_ENOMEM. errstr (may be NULL) says why. Thread-safe. */
WXG_EXPORT int wxg_decode_oa_encrypt(const void *buf, size_t len, const wxg_decode_opts_t *opts,
                                     char **out, size_t *out_len, char *errstr, size_t errstr_size);

/* The number of messages in b (0 for NULL). */
WXG_EXPORT size_t wxg_batch_count(const wxg_batch_t *b);

/* Message i of b, or NULL when i is out of range. Valid until wxg_batch_free(b). */
WXG_EXPORT const wxg_msg_view_t *wxg_batch_msg(const wxg_batch_t *b, size_t i);

/* Frees b and every view in it (to its decode cache, when it was decoded with one: then on the
 * cache's thread rules). Accepts NULL. */
WXG_EXPORT void wxg_batch_free(wxg_batch_t *b);

/* "wkteam", "gewe", "oa-xml", "oa-json", "generic", "auto" (static; "unknown" otherwise). */
WXG_EXPORT const char *wxg_format_name(wxg_format_t f);

/* Parses a name of wxg_format_name() into *out. Returns 0 or WXG_EINVAL. */
WXG_EXPORT int wxg_format_parse(const char *name, wxg_format_t *out);

#endif /* WXGUARD_MSG_H */
