/*
 * The decoded message model (include/wxguard/msg.h).
 *
 * AGREED INTERFACE: this file is an exact copy of the declarations fixed in the project's interface
 * agreement, placed here so that the plugin ABI can be built and tested before the decoder lands.
 * The decoder's own version of this header (with lib/msg.c) supersedes this copy; nothing else
 * here may differ from it.
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

/* One decoded message, as handed to plugins. Read-only. Strings are NUL-terminated; content may
 * hold NUL bytes, so use content_len. Valid until the owning batch is freed. */
typedef struct wxg_msg_view {
    wxg_format_t format;
    const char
        *account; /* stable bot id (wkteam wcId, GeWe Wxid, OA ToUserName, generic account) */
    const char *conversation; /* group id for group messages, otherwise the peer; "" when unknown */
    const char *sender;       /* "" when unknown */
    const char *msg_id;  /* exact decimal string (<= 2^64-1), or NULL when the message has none */
    int64_t create_time; /* seconds since the epoch, 0 when absent */
    const char
        *type; /* the format's own type, e.g. "60001", "AddMsg:1", "text", "event:subscribe" */
    const char *content; /* decoded text bytes */
    size_t content_len;
    int is_group;    /* 1 for group chats */
    int is_self;     /* 1 when the bot's own account sent it */
    const char *key; /* idempotency key: "<account-part>:<kind>:<id-part>", e.g.
                        "wxid_fakebot000001:n:7301234567890123457"; never contains
                        untrusted raw text (validated or hashed parts only), never '{' '}' */
    wxg_key_kind_t key_kind;
    unsigned char payload_hash[32]; /* SHA-256 over the decoded fields that define the message
                                       (used by the guard to flag "same key, different payload") */
} wxg_msg_view_t;

typedef struct wxg_decode_opts {
    wxg_format_t format; /* WXG_FORMAT_AUTO detects from the content */
    size_t max_bytes;    /* size cap checked before parsing; 0 = default (1 MiB) */
    int max_depth;       /* nesting cap; 0 = default (32) */
} wxg_decode_opts_t;

typedef struct wxg_batch_s
    wxg_batch_t; /* one record -> one or more messages (batched sync callbacks) */

/* Decodes one record. On success *out owns every message view; on failure returns a negative
 * WXG_E* code (ETOOBIG, EDEPTH, EPARSE, EFORMAT, ENOACCOUNT, EIDCONFLICT, ...) and writes a
 * human-readable reason to errstr. opts may be NULL (defaults). Thread-safe (no shared state). */
int wxg_decode(const void *buf, size_t len, const wxg_decode_opts_t *opts, wxg_batch_t **out,
               char *errstr, size_t errstr_size);
size_t wxg_batch_count(const wxg_batch_t *b);
const wxg_msg_view_t *wxg_batch_msg(const wxg_batch_t *b, size_t i);
void wxg_batch_free(wxg_batch_t *b);
const char *
wxg_format_name(wxg_format_t f); /* "wkteam", "gewe", "oa-xml", "oa-json", "generic", "auto" */
int wxg_format_parse(const char *name, wxg_format_t *out); /* 0 or WXG_EINVAL */

#endif /* WXGUARD_MSG_H */
