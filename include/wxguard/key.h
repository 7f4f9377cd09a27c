/*
 * Idempotency keys: id grammar, safe key parts, SHA-256 fingerprints.
 *
 * A key is "<account-part>:<kind>:<id-part>" (grammar in docs/keys.md):
 *
 *   account-part  raw account when it matches [A-Za-z0-9_@.-]{1,64}; otherwise "x" followed by the
 *                 64 hex digits of SHA-256(account). The hashed form is 65 characters long, so it
 *                 can never equal a raw part (at most 64). "~" (reserved, never produced from
 *                 text) marks a callback that by design carries no account.
 *   kind          one letter: 'n' server id, 'm' Official Account MsgId tuple, 'e' Official
 *                 Account event tuple, 'h' content fingerprint. It always sits right after the
 *                 first ':', and no account part contains ':', so kinds never collide.
 *   id-part       n: an id that passed wxg_id_check() (1..20 digits, <= 2^64-1)
 *                 m: <MsgId digits>:<from-part>:<CreateTime digits> (from-part encoded like an
 *                    account part)
 *                 e, h: 64 lower-case hex digits of a SHA-256 over length-prefixed fields
 *
 * A key therefore only ever holds [A-Za-z0-9_@.:~-]: never '{', '}', spaces, CR/LF, NUL or the
 * glob characters * ? [ ], and it is at most WXG_KEY_MAX - 1 bytes long.
 *
 * Length-prefixed hashing: every field is fed to SHA-256 as one presence byte (0 absent, 1
 * present), the 8-byte big-endian length, then the bytes; so no two different field lists hash
 * the same input, whatever bytes the fields hold.
 *
 * Every function here is pure and thread-safe. Pointers are borrowed for the duration of the call.
 * The two hashing functions keep one digest context per calling thread (a few hundred bytes),
 * made on its first hash and freed when the thread exits.
 * This module knows nothing of message formats; lib/msg.c applies it.
 */
#ifndef WXGUARD_KEY_H
#define WXGUARD_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"

/* A buffer of this size holds every key, including its terminating NUL. */
#define WXG_KEY_MAX 192
/* The longest raw (unhashed) account or from part. */
#define WXG_KEY_PART_MAX 64
/* The account part used when a callback by design carries no account. */
#define WXG_KEY_NO_ACCOUNT "~"

/* Why a candidate id is (not) an id. Only WXG_ID_OK makes an 'n' or 'm' key. */
typedef enum wxg_id_verdict {
    WXG_ID_OK = 0,
    WXG_ID_EMPTY,        /* "" */
    WXG_ID_ZERO,         /* "0": a placeholder, never a real server id */
    WXG_ID_NEGATIVE,     /* "-123" */
    WXG_ID_REAL,         /* "1.0", "1e5": a real number literal */
    WXG_ID_LEADING_ZERO, /* "0123" */
    WXG_ID_NOT_DIGITS,   /* anything else: spaces, signs, letters, NUL ... */
    WXG_ID_OUT_OF_RANGE  /* more than 2^64-1 */
} wxg_id_verdict_t;

/* Checks `text` (len bytes, need not be NUL-terminated) against ^[1-9][0-9]*$ with a value of at
 * most 18446744073709551615. The text is the exact digits as they arrived, from a JSON number
 * token or a string. */
WXG_EXPORT wxg_id_verdict_t wxg_id_check(const char *text, size_t len);

/* A short English phrase for a verdict, e.g. "a negative number" (static; never NULL). */
WXG_EXPORT const char *wxg_id_verdict_str(wxg_id_verdict_t v);

/* One field of a length-prefixed hash. ptr == NULL means "absent" (distinct from empty). */
typedef struct wxg_key_field {
    const void *ptr;
    size_t len;
} wxg_key_field_t;

/* SHA-256 of len bytes. Returns 0 or WXG_ENOMEM. */
WXG_EXPORT int wxg_sha256(const void *data, size_t len, unsigned char out[32]);

/* SHA-256 over n length-prefixed fields (see above). Returns 0 or WXG_ENOMEM. */
WXG_EXPORT int wxg_key_hash_fields(const wxg_key_field_t *fields, size_t n, unsigned char out[32]);

/* Writes the safe part for `text` (raw or "x"+hex) to out. Returns the length written, or
 * WXG_EINVAL when len is 0 or outsz < 66. */
WXG_EXPORT int wxg_key_part(const char *text, size_t len, char *out, size_t outsz);

/* 'n' key: account + server id. `id` must pass wxg_id_check(), otherwise WXG_EINVAL. An empty
 * account is WXG_EINVAL. Returns 0 on success. */
WXG_EXPORT int wxg_key_server(char *out, size_t outsz, const char *account, size_t account_len,
                              const char *id, size_t id_len);

/* 'm' key: account + Official Account MsgId + sender OpenID + CreateTime. `msg_id` must pass
 * wxg_id_check(); `from` must not be empty; create_time >= 0. Returns 0 or WXG_EINVAL. */
WXG_EXPORT int wxg_key_oa_msg(char *out, size_t outsz, const char *account, size_t account_len,
                              const char *msg_id, size_t msg_id_len, const char *from,
                              size_t from_len, int64_t create_time);

/* The fields of an 'e' (Official Account event) key, each possibly absent. */
typedef struct wxg_key_event {
    wxg_key_field_t from;        /* FromUserName */
    wxg_key_field_t create_time; /* CreateTime as decimal text */
    wxg_key_field_t event;       /* Event */
    wxg_key_field_t event_key;   /* EventKey */
    wxg_key_field_t job_id;      /* MsgID of job-finish events */
} wxg_key_event_t;

/* 'e' key. Returns 0, WXG_EINVAL or WXG_ENOMEM. */
WXG_EXPORT int wxg_key_oa_event(char *out, size_t outsz, const char *account, size_t account_len,
                                const wxg_key_event_t *ev);

/* The fields of an 'h' (fingerprint) key, each possibly absent. content is hashed on its own
 * first (SHA-256 of its bytes), and that digest enters the tuple. */
typedef struct wxg_key_fingerprint {
    wxg_key_field_t format;      /* wxg_format_name() */
    wxg_key_field_t type;        /* the format's type string */
    wxg_key_field_t from;        /* sender */
    wxg_key_field_t chat;        /* conversation */
    wxg_key_field_t to;          /* receiver */
    wxg_key_field_t create_time; /* decimal text, or the raw text when it is not an integer */
    wxg_key_field_t content;     /* decoded content bytes (or the canonical body of an event) */
} wxg_key_fingerprint_t;

/* 'h' key. account == NULL selects the reserved WXG_KEY_NO_ACCOUNT part; an empty non-NULL
 * account is WXG_EINVAL. Returns 0, WXG_EINVAL or WXG_ENOMEM. */
WXG_EXPORT int wxg_key_fingerprint(char *out, size_t outsz, const char *account, size_t account_len,
                                   const wxg_key_fingerprint_t *fp);

/* Checks that `key` (NUL-terminated) follows the grammar above; stores its kind letter in *kind
 * when kind is not NULL. Returns 0 or WXG_EINVAL. Use it before acting on a key typed by an
 * operator. */
WXG_EXPORT int wxg_key_check(const char *key, char *kind);

/* Builds a Redis key name "<prefix>{<key>}<suffix>": the braces form a Redis Cluster hash tag, so
 * all names of one message share a slot. prefix and suffix may be NULL (empty) and must not
 * contain '{' or '}'. Checks `key` with wxg_key_check(). Returns the length written, or
 * WXG_EINVAL (bad key or affix) / WXG_EOVERFLOW (outsz too small). */
WXG_EXPORT int wxg_key_redis_name(char *out, size_t outsz, const char *prefix, const char *key,
                                  const char *suffix);

#endif /* WXGUARD_KEY_H */
