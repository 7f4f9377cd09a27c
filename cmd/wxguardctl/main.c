/*
 * wxguardctl: the operator's tool.
 *
 * One program, several subcommands, each a row of the `commands` table below with its own
 * option parsing and --help. Exit status for every subcommand: 0 success, 1 not found / nothing
 * matched / refused / some input rejected or only part of the work done (see the subcommand),
 * 2 usage error, bad configuration or unreadable input, 3 Redis or Kafka unreachable or
 * authentication refused, 4 the operator answered no at a confirmation prompt.
 *
 * Subcommands:
 *   key      decode callback records and print, for each message, its idempotency key and
 *            decoded fields as one JSON line (or the error and its reason) -- answers "why was
 *            this message treated as a duplicate?".
 *   inspect  the guard's record of a message (ctl_guard.c)
 *   failed   list FAILED messages with reasons (ctl_guard.c)
 *   release  clear a stuck PROCESSING claim (ctl_guard.c)
 *   purge    remove one account's guard records (ctl_guard.c)
 *   redrive  re-produce dead-lettered messages (ctl_redrive.c)
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "wxguard/err.h"
#include "wxguard/key.h"
#include "wxguard/msg.h"

#define EXIT_REJECTED 1

typedef struct command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
    void (*help)(FILE *out);
} command;

static int cmd_key(int argc, char **argv);
static void help_key(FILE *out);

static const command commands[] = {
    {"key", "decode callback records and print their idempotency keys", cmd_key, help_key},
    {"inspect", "show the guard's record of a message", ctl_cmd_inspect, ctl_help_inspect},
    {"failed", "list FAILED messages with their reasons", ctl_cmd_failed, ctl_help_failed},
    {"release", "clear a stuck PROCESSING claim", ctl_cmd_release, ctl_help_release},
    {"purge", "remove one account's guard records", ctl_cmd_purge, ctl_help_purge},
    {"redrive", "re-produce dead-lettered messages to their topic", ctl_cmd_redrive,
     ctl_help_redrive},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: wxguardctl <command> [options] [arguments]\n"
                 "       wxguardctl <command> --help\n"
                 "       wxguardctl --version\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n" CTL_EXIT_HELP);
}

/* ---- JSON output ------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes there are not one. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned cp;
    if (c < 0x80)
        return 1;
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
    if (n < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* Writes s as a JSON string: control characters, DEL, U+2028/U+2029 escaped; each byte that is
 * not part of valid UTF-8 becomes U+FFFD (content_utf8 tells the reader that happened). */
static void json_str(FILE *out, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', out);
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc(c, out);
            i++;
        } else if (c == '\n') {
            fputs("\\n", out);
            i++;
        } else if (c == '\r') {
            fputs("\\r", out);
            i++;
        } else if (c == '\t') {
            fputs("\\t", out);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(out, "\\u%04x", c);
            i++;
        } else if (c < 0x80) {
            fputc(c, out);
            i++;
        } else {
            size_t l = utf8_seq(p + i, n - i);
            if (l == 0) {
                fputs("\\ufffd", out);
                i++;
            } else if (l == 3 && c == 0xE2 && p[i + 1] == 0x80 &&
                       (p[i + 2] == 0xA8 || p[i + 2] == 0xA9)) {
                fprintf(out, "\\u%04x", p[i + 2] == 0xA8 ? 0x2028 : 0x2029);
                i += 3;
            } else {
                fwrite(p + i, 1, l, out);
                i += l;
            }
        }
    }
    fputc('"', out);
}

static void json_field(FILE *out, const char *name, const char *s)
{
    fprintf(out, ",\"%s\":", name);
    if (s == NULL)
        fputs("null", out);
    else
        json_str(out, s, strlen(s));
}

/* ---- wxguardctl key ---------------------------------------------------------------------- */

typedef struct key_opts {
    wxg_decode_opts_t dopts;
    int text;
    int lines;
} key_opts;

static void help_key(FILE *out)
{
    fprintf(out,
            "usage: wxguardctl key [--format F] [--json|--text] [--lines] [--max-bytes N]\n"
            "                      [--max-depth N] [FILE|-]\n\n"
            "Decodes callback records from FILE (standard input when FILE is '-' or absent) and\n"
            "prints, for each message, its idempotency key and decoded fields as one JSON line,\n"
            "or the error name and reason when the record is rejected.\n\n"
            "options:\n"
            "  -f, --format F     auto (default), wkteam, gewe, oa-xml, oa-json, generic\n"
            "  -j, --json         one JSON object per line (default)\n"
            "  -t, --text         one plain line per message: key, format, reason\n"
            "  -l, --lines        the input holds one record per line (blank lines skipped);\n"
            "                     otherwise the whole input is one record\n"
            "      --max-bytes N  size cap of a record (default %zu)\n"
            "      --max-depth N  nesting cap (default %d)\n"
            "  -h, --help         this text\n\n"
            "JSON fields: record (1-based record number; the line number with --lines),\n"
            "message (index within the record), format, key, key_kind, key_reason, account,\n"
            "conversation, sender, to, msg_id (null when none), create_time, type, is_group,\n"
            "is_self, content_len (bytes), content_utf8, content (escaped; invalid UTF-8 bytes\n"
            "shown as U+FFFD), payload_hash. A rejected record prints {record, error, reason};\n"
            "a record that carries no message prints {record, messages: 0}.\n\n"
            "exit status: 0 every record decoded, 1 at least one record was rejected,\n"
            "2 usage error or unreadable input\n",
            WXG_DECODE_DEFAULT_MAX_BYTES, WXG_DECODE_DEFAULT_MAX_DEPTH);
}

static void print_msg(const key_opts *o, size_t record, size_t i, const wxg_msg_view_t *m)
{
    if (o->text) {
        printf("%s\t%s\t%s\n", m->key, wxg_format_name(m->format), m->key_reason);
        return;
    }
    printf("{\"record\":%zu,\"message\":%zu", record, i);
    json_field(stdout, "format", wxg_format_name(m->format));
    json_field(stdout, "key", m->key);
    printf(",\"key_kind\":\"%c\"", (char)m->key_kind);
    json_field(stdout, "key_reason", m->key_reason);
    json_field(stdout, "account", m->account);
    json_field(stdout, "conversation", m->conversation);
    json_field(stdout, "sender", m->sender);
    json_field(stdout, "to", m->to);
    json_field(stdout, "msg_id", m->msg_id);
    printf(",\"create_time\":%lld", (long long)m->create_time);
    json_field(stdout, "type", m->type);
    printf(",\"is_group\":%s,\"is_self\":%s", m->is_group ? "true" : "false",
           m->is_self ? "true" : "false");
    printf(",\"content_len\":%zu,\"content_utf8\":%s,\"content\":", m->content_len,
           m->content_is_utf8 ? "true" : "false");
    json_str(stdout, m->content, m->content_len);
    fputs(",\"payload_hash\":\"", stdout);
    for (int k = 0; k < 32; k++)
        printf("%02x", m->payload_hash[k]);
    fputs("\"}\n", stdout);
}

/* Decodes one record and prints it. Returns 0 when it decoded, 1 when it was rejected. */
static int key_record(const key_opts *o, size_t record, const char *buf, size_t len)
{
    char err[256];
    wxg_batch_t *b = NULL;
    int rc = wxg_decode(buf, len, &o->dopts, &b, err, sizeof err);
    if (rc != 0) {
        if (o->text) {
            printf("record %zu: %s: %s\n", record, wxg_err_name(rc), err);
        } else {
            printf("{\"record\":%zu", record);
            json_field(stdout, "error", wxg_err_name(rc));
            json_field(stdout, "reason", err);
            fputs("}\n", stdout);
        }
        return 1;
    }
    size_t n = wxg_batch_count(b);
    if (n == 0) {
        if (o->text)
            printf("record %zu: no messages\n", record);
        else
            printf("{\"record\":%zu,\"messages\":0}\n", record);
    }
    for (size_t i = 0; i < n; i++)
        print_msg(o, record, i, wxg_batch_msg(b, i));
    wxg_batch_free(b);
    return 0;
}

/* Reads all of f into a malloc'd buffer. Returns 0 or -1 (errno set). */
static int read_all(FILE *f, char **out, size_t *out_len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return -1;
    for (;;) {
        if (n == cap) {
            char *nb = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2) : NULL;
            if (nb == NULL) {
                free(buf);
                errno = ENOMEM;
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                free(buf);
                errno = EIO;
                return -1;
            }
            break;
        }
    }
    *out = buf;
    *out_len = n;
    return 0;
}

static int parse_size(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    errno = 0;
    if (s == NULL || *s == '\0' || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v == 0 || v > max)
        return -1;
    *out = v;
    return 0;
}

static int cmd_key(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"format", required_argument, NULL, 'f'},
        {"json", no_argument, NULL, 'j'},
        {"text", no_argument, NULL, 't'},
        {"lines", no_argument, NULL, 'l'},
        {"max-bytes", required_argument, NULL, 'B'},
        {"max-depth", required_argument, NULL, 'D'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    key_opts o;
    memset(&o, 0, sizeof o);
    unsigned long long v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "f:jtlh", longopts, NULL)) != -1) {
        switch (c) {
        case 'f':
            if (wxg_format_parse(optarg, &o.dopts.format) != 0) {
                fprintf(stderr, "wxguardctl key: unknown format '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'j':
            o.text = 0;
            break;
        case 't':
            o.text = 1;
            break;
        case 'l':
            o.lines = 1;
            break;
        case 'B':
            if (parse_size(optarg, (unsigned long long)1 << 30, &v) != 0) {
                fprintf(stderr, "wxguardctl key: --max-bytes wants 1..%llu\n",
                        (unsigned long long)1 << 30);
                return EXIT_USAGE;
            }
            o.dopts.max_bytes = (size_t)v;
            break;
        case 'D':
            if (parse_size(optarg, WXG_DECODE_LIMIT_MAX_DEPTH, &v) != 0) {
                fprintf(stderr, "wxguardctl key: --max-depth wants 1..%d\n",
                        WXG_DECODE_LIMIT_MAX_DEPTH);
                return EXIT_USAGE;
            }
            o.dopts.max_depth = (int)v;
            break;
        case 'h':
            help_key(stdout);
            return 0;
        default:
            help_key(stderr);
            return EXIT_USAGE;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "wxguardctl key: at most one FILE\n");
        return EXIT_USAGE;
    }
    const char *path = optind < argc ? argv[optind] : "-";
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "wxguardctl key: cannot open %s: %s\n", path, strerror(errno));
        return EXIT_USAGE;
    }
    char *buf = NULL;
    size_t len = 0;
    int rd = read_all(f, &buf, &len);
    int saved = errno;
    if (f != stdin)
        fclose(f);
    if (rd != 0) {
        fprintf(stderr, "wxguardctl key: cannot read %s: %s\n", path, strerror(saved));
        return EXIT_USAGE;
    }
    int rejected = 0;
    if (!o.lines) {
        rejected |= key_record(&o, 1, buf, len);
    } else {
        size_t start = 0, line = 0;
        while (start < len) {
            const char *nl = memchr(buf + start, '\n', len - start);
            size_t end = nl ? (size_t)(nl - buf) : len;
            size_t e = end;
            line++;
            if (e > start && buf[e - 1] == '\r')
                e--;
            int blank = 1;
            for (size_t i = start; i < e && blank; i++)
                blank = buf[i] == ' ' || buf[i] == '\t';
            if (!blank)
                rejected |= key_record(&o, line, buf + start, e - start);
            start = end + 1;
        }
    }
    free(buf);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "wxguardctl key: cannot write output: %s\n", strerror(errno));
        return EXIT_USAGE;
    }
    return rejected ? EXIT_REJECTED : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        if (argc > 2) {
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
                if (strcmp(argv[2], commands[i].name) == 0) {
                    commands[i].help(stdout);
                    return 0;
                }
            }
        }
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("wxguardctl %s\n", WXG_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "wxguardctl: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
