/*
 * Configuration: one table of keys, four sources, strict validation.
 *
 * Every key wxguard understands is declared once, in the table in lib/conf.c (name, type,
 * default, range or allowed values, the programs that use it, flags such as "secret", and a
 * description). That table is the only source for validation, defaults, --print-config and the
 * generated reference docs/configuration.md (cmd/wxguard-confdoc). Adding a key is one table line.
 *
 * Sources, lowest precedence first (a value from a higher source always wins, whatever the order
 * of the calls that load them):
 *   1. built-in defaults;
 *   2. a properties file: `key = value` lines, `#` or `!` starting a comment line, whitespace
 *      around key and value trimmed, no line continuation, no inline comments (a value may hold
 *      `#`). A key given twice in one file is refused, naming both lines;
 *   3. the environment: WXG_<KEY> where <KEY> is the key upper-cased with '.' and '-' written as
 *      '_' (WXG_KAFKA_BOOTSTRAP_SERVERS -> kafka.bootstrap.servers). Because '_' is ambiguous the
 *      name is matched against the table, not decoded. Keys outside the table use an escape with
 *      a double underscore: WXG_KAFKA__<PROP> -> kafka.<prop> (prop lower-cased, '_' -> '.'; a
 *      librdkafka property whose own name holds '_', such as log_level, is found too) and
 *      WXG_PLUGIN__<NAME>__<PROP> -> plugin.<name>.<prop> (name lower-cased as written, prop
 *      lower-cased with '_' -> '.'). Other WXG_* variables are not keys: they are ignored and
 *      listed as warnings;
 *   4. `--set key=value` flags (wxg_conf_set_arg). Given twice, the last one wins with a warning.
 *      A secret given so draws a warning naming the key: every local user can read a process's
 *      command line.
 *
 * Secrets from files (the Kubernetes and Docker secrets convention): a secret key (one that
 * wxg_conf_key_is_secret() names) may be given as the path of a file that holds its value:
 * WXG_<KEY>__FILE=/path in the environment (the variable of the key, then a double underscore
 * and FILE; WXG_KAFKA__SASL_PASSWORD__FILE too), `<key>@file = /path` in a properties file, or
 * `--set <key>@file=/path`. The value counts as coming from the source that named the file, so
 * precedence is unchanged; a key given both itself and with __FILE in the environment is refused.
 * Exactly one trailing newline ("\n" or "\r\n") is dropped. Any other key given so is refused
 * naming it: this keeps the rule apart from keys whose own name ends in "file"
 * (WXG_REDIS_TLS_KEY_FILE is the variable of redis.tls.key.file). An unreadable file is an error
 * naming the key and the path (WXG_EIO); the origin of the value is e.g. "env
 * WXG_INGEST_HMAC_SECRET__FILE (/path)". A properties file read by wxg_conf_load_file that gives a
 * secret a value and can be read by its group or others draws a warning naming the file and the
 * keys; the secret files themselves are not checked (orchestrators mount them 0644 by default).
 *
 * Key families:
 *   - table keys, typed (string, int, bool, duration, size, list, enum, address);
 *   - `kafka.<prop>`: every one is handed to librdkafka. Each is checked with rd_kafka_conf_set()
 *     on a scratch configuration when it is set, so an unknown property or bad value is refused at
 *     start-up naming the key. librdkafka's sensitive properties are secrets here too. A few
 *     properties that wxguard itself must control (offset storage and commit) are refused;
 *   - `plugin.<name>.<prop>`: handed to plugin <name> (wxg_conf_plugin_map). When the table
 *     declares keys for a plugin (a built-in one), only those are accepted; any other plugin gets
 *     every key under its prefix and validates them in its own init.
 *   Anything else is refused naming the key (with a close match suggested).
 *
 * Errors: the loading functions return 0 or WXG_ECONFIG (WXG_ENOMEM, WXG_EIO for an unreadable
 * file) and write one line to errstr naming the key and where the value came from, e.g.
 *   consumer.workers: "abc" is not an integer (from /etc/wxguard.conf:12)
 * The value of a secret is never echoed; other echoed values are escaped and cut short.
 *
 * Threads: loading and setting are single-threaded (done at start-up). Once loading is over, every
 * getter may be called from any thread at the same time (they only read).
 */
#ifndef WXGUARD_CONF_H
#define WXGUARD_CONF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "wxguard/common.h"

/* librdkafka's configuration object, declared here so that this header needs no librdkafka one. */
struct rd_kafka_conf_s;
/* The guard's and the consumer's configurations (wxguard/guard.h, wxguard/consumer.h), filled by
 * wxg_conf_guard() and wxg_conf_consumer() below. */
struct wxg_guard_conf;
struct wxg_consumer_conf;

/* The programs a key is meant for (a bit set). A key of another program is accepted with a
 * warning, so that one file may serve several programs. */
#define WXG_PROG_CONSUMER 0x1u
#define WXG_PROG_INGEST   0x2u
#define WXG_PROG_CTL      0x4u
#define WXG_PROG_ALL      (WXG_PROG_CONSUMER | WXG_PROG_INGEST | WXG_PROG_CTL)

typedef enum wxg_conf_type {
    WXG_CONF_STRING = 0, /* free text; min/max bound its length in bytes (max 0 = no bound) */
    WXG_CONF_INT,        /* signed 64-bit decimal integer within [min, max] */
    WXG_CONF_BOOL,       /* true/false, yes/no, on/off, 1/0 (any case) */
    WXG_CONF_DURATION,   /* integer + unit ms, s, m, h, d; held in milliseconds within [min, max].
                            A bare number means milliseconds and is accepted only for keys whose
                            name ends in ".ms" */
    WXG_CONF_SIZE,       /* integer + optional unit B, K/KiB, M/MiB, G/GiB (powers of 1024); held
                            in bytes within [min, max] */
    WXG_CONF_LIST,       /* comma-separated items, each trimmed and non-empty; min/max bound the
                            number of items */
    WXG_CONF_ENUM,       /* one of the '|'-separated words in `allowed` */
    WXG_CONF_ADDR        /* host:port or [v6]:port, port 0..65535; empty means "off" unless the
                            key is required */
} wxg_conf_type_t;

/* Key flags. */
#define WXG_CONF_SECRET   0x1u /* never printed or echoed: shown as *** */
#define WXG_CONF_REQUIRED 0x2u /* must be non-empty for the programs in `programs` */

/* One entry of the key table. Read-only; entries live for the whole process. */
typedef struct wxg_conf_keydef {
    const char *name;
    wxg_conf_type_t type;
    const char *def; /* default, written as a user would write it ("" = empty) */
    int64_t min;     /* see wxg_conf_type_t for what min/max bound */
    int64_t max;
    const char *allowed; /* WXG_CONF_ENUM: "a|b|c"; otherwise NULL */
    unsigned programs;   /* WXG_PROG_* bits */
    unsigned flags;      /* WXG_CONF_* bits */
    const char *desc;    /* one or two sentences for the reference */
    /* Optional extra check of a value that already passed the type check (e.g. a charset);
     * returns 0 or WXG_ECONFIG with a reason (no key name) in errstr. */
    int (*check)(const char *value, char *errstr, size_t errstr_size);
} wxg_conf_keydef_t;

/* The key table, in the order of the reference. Pure, any thread. */
WXG_EXPORT size_t wxg_conf_keydef_count(void);
WXG_EXPORT const wxg_conf_keydef_t *wxg_conf_keydef_at(size_t i); /* NULL when i is out of range */
WXG_EXPORT const wxg_conf_keydef_t *wxg_conf_keydef_find(const char *name); /* NULL if absent */
WXG_EXPORT const char *wxg_conf_type_name(wxg_conf_type_t type); /* "string", "duration", ... */

/* Writes the range or allowed values of `def` as the reference and error messages show them,
 * e.g. "1 .. 256", "100ms .. 1h", "kv | json", or "" when unbounded. Always NUL-terminates. */
WXG_EXPORT void wxg_conf_describe_range(const wxg_conf_keydef_t *def, char *buf, size_t size);

/* 1 when the value of `key` must never be shown: table keys flagged secret, librdkafka's sensitive
 * properties under kafka.*, and any kafka.* or plugin.* key whose name contains password,
 * passphrase, secret, token, credential, dsn, api.key or private.key. */
WXG_EXPORT int wxg_conf_key_is_secret(const char *key);

/* Parsers used for table values, exposed for callers with the same needs. Each returns 0 or
 * WXG_ECONFIG and writes *out only on success. */
WXG_EXPORT int wxg_conf_parse_int(const char *s, int64_t *out);
WXG_EXPORT int wxg_conf_parse_bool(const char *s, int *out);
WXG_EXPORT int wxg_conf_parse_duration_ms(const char *s, int allow_bare_ms, int64_t *out);
WXG_EXPORT int wxg_conf_parse_size(const char *s, int64_t *out);
/* Splits "host:port" / "[v6]:port" into host (without brackets) and port. */
WXG_EXPORT int wxg_conf_parse_addr(const char *s, char *host, size_t host_size, int *port);

typedef struct wxg_conf_s wxg_conf_t;

/* A new configuration holding the defaults, for the program `program` (one WXG_PROG_* bit; it
 * decides which keys are required and which draw a "not used by" warning). NULL on failure. */
WXG_EXPORT wxg_conf_t *wxg_conf_new(unsigned program, char *errstr, size_t errstr_size);
/* Frees everything and wipes the copies of secret values. Accepts NULL. */
WXG_EXPORT void wxg_conf_free(wxg_conf_t *conf);

/* Loads a properties file (at most 1 MiB). */
WXG_EXPORT int wxg_conf_load_file(wxg_conf_t *conf, const char *path, char *errstr,
                                  size_t errstr_size);
/* Loads properties text; `origin` names it in messages (e.g. a file name). */
WXG_EXPORT int wxg_conf_load_string(wxg_conf_t *conf, const char *text, size_t len,
                                    const char *origin, char *errstr, size_t errstr_size);
/* Applies WXG_* variables from `envp` (a NULL-terminated "NAME=value" array; NULL means the
 * process environment). */
WXG_EXPORT int wxg_conf_load_env(wxg_conf_t *conf, const char *const *envp, char *errstr,
                                 size_t errstr_size);
/* A `--set` override: key and value separately, or "key=value" in one argument. */
WXG_EXPORT int wxg_conf_set(wxg_conf_t *conf, const char *key, const char *value, char *errstr,
                            size_t errstr_size);
WXG_EXPORT int wxg_conf_set_arg(wxg_conf_t *conf, const char *arg, char *errstr,
                                size_t errstr_size);

/* Checks what single values cannot show: required keys are set, and rules between keys (e.g. the
 * first retry backoff is not larger than the largest). Call once after loading every source. */
WXG_EXPORT int wxg_conf_check(wxg_conf_t *conf, char *errstr, size_t errstr_size);

/* The whole start-up sequence in one call: defaults, `path` (may be NULL), the environment
 * (`envp`, NULL = process environment), `nsets` "key=value" overrides, then wxg_conf_check().
 * Returns the configuration or NULL with the reason in errstr. */
WXG_EXPORT wxg_conf_t *wxg_conf_load(unsigned program, const char *path, const char *const *envp,
                                     const char *const *sets, size_t nsets, char *errstr,
                                     size_t errstr_size);

/* Getters. `key` is a table key, or for wxg_conf_get also a kafka.* / plugin.* key.
 * wxg_conf_get: the effective value as written (trimmed); NULL for a key that is neither in the
 * table nor set. The string lives as long as `conf`.
 * wxg_conf_int: INT, DURATION (milliseconds), SIZE (bytes) and BOOL (0/1) keys; 0 for any other
 * key. wxg_conf_bool: BOOL keys; 0 otherwise.
 * wxg_conf_list: LIST keys; the number of items, with *items (if not NULL) pointing at an array
 * that lives as long as `conf`; 0 for any other key.
 * wxg_conf_get_int: the checked form: WXG_ENOTFOUND for a key not in the table, WXG_EINVAL for a
 * key of another type. */
WXG_EXPORT const char *wxg_conf_get(const wxg_conf_t *conf, const char *key);
WXG_EXPORT int64_t wxg_conf_int(const wxg_conf_t *conf, const char *key);
WXG_EXPORT int wxg_conf_bool(const wxg_conf_t *conf, const char *key);
WXG_EXPORT size_t wxg_conf_list(const wxg_conf_t *conf, const char *key, const char *const **items);
WXG_EXPORT int wxg_conf_get_int(const wxg_conf_t *conf, const char *key, int64_t *out);

/* Where the effective value of `key` came from: "default", "file /path:12", "env WXG_...",
 * "--set"; NULL when the key is not set. */
WXG_EXPORT const char *wxg_conf_origin(const wxg_conf_t *conf, const char *key);

/* Writes the effective configuration as a properties file (for --print-config): every table key
 * of the program, then the kafka.* and plugin.* keys that are set. Secrets print as ***; a
 * comment line before a value names its source when it is not the default. Returns 0 or WXG_EIO. */
WXG_EXPORT int wxg_conf_print(const wxg_conf_t *conf, FILE *out);

/* Warnings collected while loading (ignored WXG_* variables, keys of other programs, a --set
 * given twice, ...). Programs log them once logging is set up. */
WXG_EXPORT size_t wxg_conf_warning_count(const wxg_conf_t *conf);
WXG_EXPORT const char *wxg_conf_warning(const wxg_conf_t *conf,
                                        size_t i); /* NULL if out of range */

/* A fresh librdkafka configuration with every kafka.* key applied (prefix removed). The caller
 * owns it (rd_kafka_conf_destroy, or hand it to rd_kafka_new). NULL with errstr on failure. */
WXG_EXPORT struct rd_kafka_conf_s *wxg_conf_kafka(const wxg_conf_t *conf, char *errstr,
                                                  size_t errstr_size);

/* The keys of one plugin, with the "plugin.<name>." prefix removed: declared keys with their
 * effective values (defaults included) and any other key set under the prefix. This is the shape
 * handed to a plugin's init; it owns copies of its strings and is independent of the conf. */
typedef struct wxg_conf_kv {
    const char *key;
    const char *value;
} wxg_conf_kv_t;

typedef struct wxg_conf_map {
    size_t count;
    const wxg_conf_kv_t *items; /* sorted by key */
} wxg_conf_map_t;

/* NULL on allocation failure (an empty map when the plugin has no keys). Free with
 * wxg_conf_map_free, which wipes secret values. */
WXG_EXPORT wxg_conf_map_t *wxg_conf_plugin_map(const wxg_conf_t *conf, const char *plugin);
/* Every plugin.<name>.<prop> setting of every plugin, keys kept whole (prefix included): the
 * declared keys of the built-in plugins with their effective values, and every key set for a
 * plugin wxguard does not know (an external plugin, whose name is only known once it is
 * loaded). The plugin registry picks each plugin's keys by its descriptor's name. NULL on
 * allocation failure; free with wxg_conf_map_free. */
WXG_EXPORT wxg_conf_map_t *wxg_conf_plugin_settings(const wxg_conf_t *conf);
WXG_EXPORT void wxg_conf_map_free(wxg_conf_map_t *map);
/* The value of `key` (without prefix) or NULL. */
WXG_EXPORT const char *wxg_conf_map_get(const wxg_conf_map_t *map, const char *key);

/* The guard's configuration from the keys (lib/conf_map.c): the one mapping every program that
 * opens the guard uses, so that they all reach the same Redis and compute the same DONE layout.
 * `out` is set to wxg_guard_conf_init()'s defaults, then every redis.* key the guard takes, the
 * guard.* keys (guard.done.cache.entries is the consumer's: wxg_conf_consumer) and
 * consumer.batch.max as the size of one script call. Empty optional strings (redis.user,
 * redis.password, redis.unix.socket, redis.sentinel*) become NULL. Strings point into `conf` and
 * live as long as it; the key prefix is written, with a ':' appended unless it ends in one, into
 * `prefix` (at least WXG_GUARD_PREFIX_MAX + 1 bytes), which must outlive every use of `out` (a
 * consumer keeps using it after wxg_consumer_new). The caller may change fields afterwards.
 * Returns 0, WXG_ECONFIG (a value the guard would refuse, key named in errstr) or WXG_EINVAL
 * (NULL arguments, `prefix` too small); `out` is written only on success. */
WXG_EXPORT int wxg_conf_guard(const wxg_conf_t *conf, struct wxg_guard_conf *out, char *prefix,
                              size_t prefix_size, char *errstr, size_t errstr_size);

/* The consumer's configuration from the keys (lib/conf_map.c): wxg_consumer_conf_init()'s
 * defaults, then every consumer.* key, kafka.group.id, redis.probe.interval.ms and
 * guard.done.cache.entries. topics and group_id point into `conf`. kafka, guard, chain, dlq and
 * metrics stay NULL for the caller to set. Returns 0, WXG_ECONFIG or WXG_EINVAL as above; `out`
 * is written only on success. */
WXG_EXPORT int wxg_conf_consumer(const wxg_conf_t *conf, struct wxg_consumer_conf *out,
                                 char *errstr, size_t errstr_size);

#endif /* WXGUARD_CONF_H */
