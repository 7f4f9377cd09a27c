/*
 * Logging: one line per event, key=value (logfmt) or JSON.
 *
 *   wxg_log(WXG_LOG_INFO, "claim", WXG_LS("key", key), WXG_LI("partition", p),
 *           WXG_LI("offset", off));
 * writes
 *   ts=2024-05-01T12:00:00.123Z level=info event=claim key=wxid_a:n:17 partition=3 offset=17
 * or, with WXG_LOG_JSON,
 *   {"ts":"2024-05-01T12:00:00.123Z","level":"info","event":"claim","key":"wxid_a:n:17",...}
 *
 * Values are escaped so that a line can never be forged or broken by what it carries (CWE-117):
 * CR, LF, tab and other control bytes, DEL, invalid UTF-8 bytes and the Unicode characters that
 * reorder or break text (C1 controls, U+2028/2029, bidirectional overrides) come out as \n, \r, \t,
 * \xNN or \uNNNN; in kv form a value with a space, '=', '"', a backslash or a non-ASCII byte is
 * quoted. Each value is cut at the configured number of bytes (marked with "..."), and a line at
 * WXG_LOG_LINE_MAX bytes (fields that do not fit are left out and truncated=true is added).
 *
 * Personal data stays out unless asked for: WXG_LSECRET always prints ***; WXG_LID (account,
 * conversation and sender ids) prints a short salted hash unless personal ids are switched on;
 * WXG_LCONTENT (message text) prints only its length unless content logging is switched on.
 *
 * Threads: every function may be called from any thread. A line is formatted on the caller's
 * stack and handed to the sink in one call under a process-wide lock, so lines never interleave.
 * The settings are process-wide; set them at start-up.
 */
#ifndef WXGUARD_LOG_H
#define WXGUARD_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "wxguard/common.h"

typedef enum wxg_log_level {
    WXG_LOG_DEBUG = 0,
    WXG_LOG_INFO,
    WXG_LOG_WARN,
    WXG_LOG_ERROR,
    WXG_LOG_OFF /* as a threshold: write nothing */
} wxg_log_level_t;

typedef enum wxg_log_format { WXG_LOG_KV = 0, WXG_LOG_JSON } wxg_log_format_t;

/* The longest line handed to a sink, newline included. */
#define WXG_LOG_LINE_MAX 16384
/* Hex digits of an id hash (WXG_LID, wxg_log_hash_id). */
#define WXG_LOG_HASH_HEX 12

typedef enum wxg_log_ftype {
    WXG_LOG_F_STR = 0, /* s (NUL-terminated; NULL prints as -) */
    WXG_LOG_F_BYTES,   /* s, len (may hold NUL and any byte) */
    WXG_LOG_F_INT,     /* i */
    WXG_LOG_F_UINT,    /* u */
    WXG_LOG_F_DOUBLE,  /* d */
    WXG_LOG_F_BOOL,    /* i (0/1) */
    WXG_LOG_F_SECRET,  /* always *** */
    WXG_LOG_F_ID,      /* s: a personal id, hashed unless personal ids are on */
    WXG_LOG_F_CONTENT, /* s, len: message content, only its length unless content is on */
    WXG_LOG_F_ERR      /* i: a WXG_E* code, printed by name */
} wxg_log_ftype_t;

/* One field. Build them with the WXG_L* macros; the strings are only read during the call. */
typedef struct wxg_log_field {
    const char *name;
    wxg_log_ftype_t type;
    const char *s;
    size_t len;
    int64_t i;
    uint64_t u;
    double d;
} wxg_log_field_t;

#define WXG_LS(n, v) ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_STR, .s = (v)})
#define WXG_LSN(n, p, l) \
    ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_BYTES, .s = (p), .len = (l)})
#define WXG_LI(n, v)   ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_INT, .i = (int64_t)(v)})
#define WXG_LU(n, v)   ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_UINT, .u = (uint64_t)(v)})
#define WXG_LD(n, v)   ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_DOUBLE, .d = (double)(v)})
#define WXG_LB(n, v)   ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_BOOL, .i = (v) ? 1 : 0})
#define WXG_LSECRET(n) ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_SECRET})
#define WXG_LID(n, v)  ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_ID, .s = (v)})
#define WXG_LCONTENT(n, p, l) \
    ((wxg_log_field_t){.name = (n), .type = WXG_LOG_F_CONTENT, .s = (p), .len = (l)})
#define WXG_LERR(v) ((wxg_log_field_t){.name = "err", .type = WXG_LOG_F_ERR, .i = (v)})

/* Writes one line when `level` passes the threshold; the field list may be empty. The arguments
 * are not evaluated when the level is filtered out. */
#define wxg_log(level, event, ...)                                                                 \
    do {                                                                                           \
        wxg_log_level_t wxg_lvl_ = (level);                                                        \
        if (wxg_log_enabled(wxg_lvl_)) {                                                           \
            const wxg_log_field_t wxg_lf_[] = {{0}, __VA_ARGS__};                                  \
            wxg_log_write(wxg_lvl_, (event), wxg_lf_ + 1, sizeof wxg_lf_ / sizeof wxg_lf_[0] - 1); \
        }                                                                                          \
    } while (0)

/* The function behind wxg_log(), for callers that build field arrays themselves (e.g. a
 * librdkafka log callback). `event` NULL prints as -. */
WXG_EXPORT void wxg_log_write(wxg_log_level_t level, const char *event,
                              const wxg_log_field_t *fields, size_t nfields);

/* Whether a line of `level` would be written. Cheap (one atomic load). */
WXG_EXPORT int wxg_log_enabled(wxg_log_level_t level);

/* A sink receives each finished line (ending in '\n', at most WXG_LOG_LINE_MAX bytes) in one
 * call, with the log lock held: it needs no lock of its own but must not log. */
typedef void (*wxg_log_sink_fn)(void *opaque, wxg_log_level_t level, const char *line, size_t len);
/* Routes output to `fn` (NULL restores the default: one write(2) per line to stderr). */
WXG_EXPORT void wxg_log_set_sink(wxg_log_sink_fn fn, void *opaque);
/* A ready-made sink for a FILE * passed as `opaque` (fwrite + fflush). */
WXG_EXPORT void wxg_log_sink_file(void *opaque, wxg_log_level_t level, const char *line,
                                  size_t len);

WXG_EXPORT void wxg_log_set_level(wxg_log_level_t level); /* default WXG_LOG_INFO */
WXG_EXPORT wxg_log_level_t wxg_log_get_level(void);
WXG_EXPORT void wxg_log_set_format(wxg_log_format_t format); /* default WXG_LOG_KV */
/* Bytes a value may take before it is cut (16 .. 4096; default 256). */
WXG_EXPORT void wxg_log_set_field_max(size_t bytes);
WXG_EXPORT void wxg_log_set_personal_ids(int on); /* default off: ids are hashed */
WXG_EXPORT void wxg_log_set_content(int on);      /* default off: content shows its length only */
/* Salt mixed into id hashes (copied; at most 256 bytes are used). NULL or "" for none. */
WXG_EXPORT void wxg_log_set_id_salt(const char *salt);

/* "debug", "info", "warn", "error" (also "warning"); 0 or WXG_EINVAL. */
WXG_EXPORT int wxg_log_level_parse(const char *name, wxg_log_level_t *out);
WXG_EXPORT const char *wxg_log_level_name(wxg_log_level_t level);
/* "kv" or "json"; 0 or WXG_EINVAL. */
WXG_EXPORT int wxg_log_format_parse(const char *name, wxg_log_format_t *out);
/* Maps a syslog severity (0 emerg .. 7 debug, as librdkafka's log callback passes) to a level. */
WXG_EXPORT wxg_log_level_t wxg_log_level_from_syslog(int severity);

struct rd_kafka_s;

/* A librdkafka log callback (rd_kafka_conf_set_log_cb): logs each of librdkafka's own lines as
 * event "kafka" with fields facility and message, at the level of its syslog severity, so that
 * connection failures and the like reach the same sink, format and escaping as wxguard's own
 * lines rather than raw stderr. `rk` is not used. Safe from any thread: librdkafka calls it
 * from its own threads. */
WXG_EXPORT void wxg_log_kafka(const struct rd_kafka_s *rk, int severity, const char *facility,
                              const char *message);

/* Writes the log form of an id: "h:" followed by WXG_LOG_HASH_HEX hex digits of
 * SHA-256(salt || 0x00 || id). `out` needs at least WXG_LOG_HASH_HEX + 3 bytes. */
WXG_EXPORT void wxg_log_hash_id(const char *id, size_t len, char *out, size_t out_size);

#endif /* WXGUARD_LOG_H */
