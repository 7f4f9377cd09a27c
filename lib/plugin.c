/*
 * DESIGN: the plugin registry and chain (host side of include/wxguard/plugin.h).
 *
 * Purpose. Turn the `plugins` setting into an ordered chain of initialised plugins: built-ins
 * are looked up in a static table, external plugins are loaded with dlopen by path and asked
 * for their descriptor through wxg_plugin_entry. Everything a plugin could get wrong at load
 * time (no entry symbol, another ABI version, no handle function, a bad or repeated name, a
 * configuration its init refuses) stops start-up with a message naming the entry, instead of
 * failing later on the first message.
 *
 * Threads. Building and destroying the chain happen on the main thread; the chain is then
 * immutable, so wxg_plugin_chain_handle needs no lock and runs on every worker at once. The
 * per-thread states live in a wxg_plugin_thread_t owned by one worker. The context handed to
 * a plugin is built on the worker's stack for one call; its function table is a static const
 * shared by all.
 *
 * ABI. Plugins reach the host only through the context's function table, so they need no
 * symbol of libwxguard (which programs link statically and do not export). RTLD_LOCAL keeps
 * one plugin's symbols from resolving another's; RTLD_NOW makes an unresolved symbol a load
 * error at start-up rather than a crash mid-run.
 *
 * Loading safely. An external plugin runs with the service's rights, so whoever can replace its
 * file or its directory owns the service. Its path must be absolute (a relative one would
 * resolve against whatever the working directory is); the directory and the file must be owned
 * by root or the running user and not be writable by group or others. The file is opened
 * relative to the checked directory (O_NOFOLLOW), checked on that open descriptor, and loaded
 * through /proc/self/fd/N, so what was checked is what is loaded: nobody can swap the file
 * between the check and the dlopen.
 *
 * Failure modes. Load and init failures unwind what was done in reverse order (destroy the
 * plugins already initialised, dlclose the objects). A plugin's handle that returns a value
 * outside the enum is treated as FAIL. A plugin that never returns blocks its worker; the host
 * cannot preempt C code, which the header states.
 */
#include "wxguard/plugin_registry.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err_int.h"
#include "plugin_int.h"
#include "wxguard/err.h"

#define MAX_CHAIN       64 /* plugins in one chain */
#define MAX_PRODUCE_HDR 64 /* headers on one produced record */

typedef struct entry {
    const wxg_plugin_desc_t *desc;
    void *state;
    int initialised;
    void *dl;   /* dlopen handle, NULL for a built-in */
    int fd;     /* descriptor + 1 the object was loaded from (0: none); see load_external */
    char *path; /* NULL for a built-in */
} entry;

struct wxg_plugin_chain_s {
    size_t n;
    entry *e;
    wxg_producer_t *producer;
};

struct wxg_plugin_thread_s {
    const wxg_plugin_chain_t *chain;
    void **tstate; /* one per plugin */
};

/* The context of one handle call; pub must stay the first member (plugins see only pub). */
typedef struct host_ctx {
    wxg_plugin_ctx_t pub;
    const wxg_plugin_chain_t *chain;
    const wxg_msg_view_t *msg;
    wxg_plugin_call_t *call;
    char produce_err[256];
} host_ctx;

static const struct {
    const char *name;
    const wxg_plugin_desc_t *(*get)(void);
} builtins[] = {
    {"noop", wxg__plugin_noop},   {"record", wxg__plugin_record},
    {"fail", wxg__plugin_fail},   {"autoreply", wxg__plugin_autoreply},
    {"pgsql", wxg__plugin_pgsql}, {"billing", wxg__plugin_billing},
    {"http", wxg__plugin_http},
};

const wxg_plugin_desc_t *wxg_plugin_builtin(const char *name)
{
    for (size_t i = 0; name && i < sizeof builtins / sizeof builtins[0]; i++) {
        if (strcmp(builtins[i].name, name) == 0)
            return builtins[i].get();
    }
    return NULL;
}

const char *wxg_plugin_builtin_names(void)
{
    return "noop, record, fail, autoreply, pgsql, billing, http";
}

const char *wxg_plugin_result_name(wxg_plugin_result_t r)
{
    switch (r) {
    case WXG_PLUGIN_OK:
        return "ok";
    case WXG_PLUGIN_RETRY:
        return "retry";
    case WXG_PLUGIN_FAIL:
        return "fail";
    }
    return "fail";
}

static int valid_name(const char *name)
{
    if (!name)
        return 0;
    size_t len = strlen(name);
    if (len == 0 || len > WXG_PLUGIN_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Refuses `what` (the plugin file or its directory, at `shown`) unless root or the running user
 * owns it and neither its group nor others may write it. */
static int check_trusted(const struct stat *st, const char *path, const char *what,
                         const char *shown, char *errstr, size_t errstr_size)
{
    uid_t me = geteuid();
    if (st->st_uid != 0 && st->st_uid != me) {
        wxg__errf(errstr, errstr_size,
                  "plugins: refusing plugin '%s': its %s %s is owned by uid %u, not by root or "
                  "the running user (uid %u)",
                  path, what, shown, (unsigned)st->st_uid, (unsigned)me);
        return WXG_ECONFIG;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        wxg__errf(errstr, errstr_size,
                  "plugins: refusing plugin '%s': its %s %s is writable by %s (mode %04o); "
                  "only its owner may write it",
                  path, what, shown, (st->st_mode & S_IWOTH) ? "others" : "its group",
                  (unsigned)(st->st_mode & 07777));
        return WXG_ECONFIG;
    }
    return 0;
}

/* Opens the plugin at absolute `path` after checking its directory and, on the open descriptor,
 * the file itself. Returns the descriptor in *fd_out. */
static int open_trusted(const char *path, int *fd_out, char *errstr, size_t errstr_size)
{
    int rc = 0, dfd = -1, fd = -1;
    struct stat st;
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (slash[1] == '\0') {
        wxg__errf(errstr, errstr_size, "plugins: plugin path '%s' names a directory", path);
        return WXG_ECONFIG;
    }
    size_t dlen = slash == path ? 1 : (size_t)(slash - path);
    if (dlen >= sizeof dir) {
        wxg__errf(errstr, errstr_size, "plugins: plugin path '%s' is too long", path);
        return WXG_ECONFIG;
    }
    memcpy(dir, path, dlen);
    dir[dlen] = '\0';
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        wxg__errf(errstr, errstr_size, "plugins: cannot load plugin '%s': %s: %s", path, dir,
                  strerror(errno));
        return WXG_ECONFIG;
    }
    if (fstat(dfd, &st) != 0) {
        wxg__errf(errstr, errstr_size, "plugins: cannot load plugin '%s': %s: %s", path, dir,
                  strerror(errno));
        rc = WXG_ECONFIG;
        goto out;
    }
    if ((rc = check_trusted(&st, path, "directory", dir, errstr, errstr_size)) != 0)
        goto out;
    /* O_NOFOLLOW: a symbolic link would point outside the directory just checked. O_NONBLOCK:
     * a FIFO must not hang the start (it is refused as not a regular file). */
    fd = openat(dfd, slash + 1, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        wxg__errf(errstr, errstr_size, "plugins: cannot load plugin '%s': %s", path,
                  err == ELOOP ? "it is a symbolic link; give the path of the file itself"
                               : strerror(err));
        rc = WXG_ECONFIG;
        goto out;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        wxg__errf(errstr, errstr_size, "plugins: cannot load plugin '%s': not a regular file",
                  path);
        rc = WXG_ECONFIG;
        goto out;
    }
    if ((rc = check_trusted(&st, path, "file", path, errstr, errstr_size)) != 0)
        goto out;
    *fd_out = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    close(dfd);
    return rc;
}

/* Loads the object at `path` into e (dl, desc), from the descriptor open_trusted checked. */
static int load_external(entry *e, const char *path, char *errstr, size_t errstr_size)
{
    int fd = -1;
    int rc = open_trusted(path, &fd, errstr, errstr_size);
    if (rc != 0)
        return rc;
    char fdpath[64];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", fd);
    dlerror(); /* clear a stale message */
    void *dl = dlopen(fdpath, RTLD_NOW | RTLD_LOCAL);
    /* The descriptor stays open as long as the object is loaded: the dynamic linker knows a
     * loaded object by its name, and another plugin opened at the same descriptor number would
     * otherwise be taken for this one. */
    if (!dl)
        close(fd);
    else
        e->fd = fd + 1;
    if (!dl) {
        const char *why = dlerror();
        wxg__errf(errstr, errstr_size, "plugins: cannot load plugin '%s': %s", path,
                  why ? why : "unknown dlopen error");
        return WXG_ECONFIG;
    }
    dlerror();
    void *sym = dlsym(dl, WXG_PLUGIN_ENTRY_SYMBOL);
    const char *why = dlerror();
    if (why || !sym) {
        wxg__errf(errstr, errstr_size,
                  "plugins: '%s' is not a wxguard plugin: no symbol " WXG_PLUGIN_ENTRY_SYMBOL
                  " (%s); export it with WXG_PLUGIN_EXPORT",
                  path, why ? why : "symbol is NULL");
        dlclose(dl);
        return WXG_EABI;
    }
    /* POSIX guarantees that a data pointer from dlsym converts to a function pointer. */
    wxg_plugin_entry_fn entry_fn;
    memcpy(&entry_fn, &sym, sizeof entry_fn);
    const wxg_plugin_desc_t *desc = entry_fn();
    if (!desc) {
        wxg__errf(errstr, errstr_size,
                  "plugins: '%s': " WXG_PLUGIN_ENTRY_SYMBOL " returned no descriptor", path);
        dlclose(dl);
        return WXG_EABI;
    }
    e->dl = dl;
    e->desc = desc;
    return 0;
}

/* Checks what the host relies on before calling anything else in the descriptor. */
static int check_desc(const wxg_plugin_desc_t *d, const char *what, char *errstr,
                      size_t errstr_size)
{
    if (d->abi_version != WXG_PLUGIN_ABI_VERSION) {
        wxg__errf(errstr, errstr_size,
                  "plugins: '%s' was built for plugin ABI version %u, this wxguard speaks version "
                  "%u: rebuild it against this wxguard's include/wxguard/plugin.h",
                  what, (unsigned)d->abi_version, (unsigned)WXG_PLUGIN_ABI_VERSION);
        return WXG_EABI;
    }
    if (!valid_name(d->name)) {
        wxg__errf(errstr, errstr_size,
                  "plugins: '%s' has an invalid name (1 to %d characters of a-z, 0-9, '_', '-')",
                  what, WXG_PLUGIN_NAME_MAX);
        return WXG_EABI;
    }
    if (!d->init || !d->handle) {
        wxg__errf(errstr, errstr_size, "plugins: '%s' (plugin %s) lacks its %s function", what,
                  d->name, d->init ? "handle" : "init");
        return WXG_EABI;
    }
    return 0;
}

/* Calls e's init with the plugin.<name>.* entries of conf. */
static int init_entry(entry *e, const wxg_plugin_kv_t *conf, size_t conf_count, char *errstr,
                      size_t errstr_size)
{
    const char *name = e->desc->name;
    char prefix[WXG_PLUGIN_NAME_MAX + 16];
    int plen = snprintf(prefix, sizeof prefix, "plugin.%s.", name);
    const char **keys = calloc(conf_count + 1, sizeof *keys);
    const char **values = calloc(conf_count + 1, sizeof *values);
    int rc = 0;
    if (!keys || !values) {
        wxg__errf(errstr, errstr_size, "out of memory");
        rc = WXG_ENOMEM;
        goto out;
    }
    size_t n = 0;
    for (size_t i = 0; i < conf_count; i++) {
        const char *k = conf[i].key;
        if (!k || !conf[i].value || strncmp(k, prefix, (size_t)plen) != 0 || k[plen] == '\0')
            continue;
        keys[n] = k + plen;
        values[n] = conf[i].value;
        n++;
    }
    wxg_plugin_conf_t view = {.abi_version = WXG_PLUGIN_ABI_VERSION,
                              .plugin_name = name,
                              .count = n,
                              .keys = keys,
                              .values = values};
    char perr[512] = "";
    void *state = NULL;
    rc = e->desc->init(&view, &state, perr, sizeof perr);
    if (rc != 0) {
        if (rc > 0)
            rc = WXG_ECONFIG; /* a plugin must return a negative code; do not report success */
        wxg__errf(errstr, errstr_size, "plugin %s: init failed (%s): %s", name, wxg_err_name(rc),
                  perr[0] ? perr : "no reason given");
        goto out;
    }
    e->state = state;
    e->initialised = 1;
out:
    free(keys);
    free(values);
    return rc;
}

/* Copies the next comma-separated entry of *sp, without surrounding blanks, into buf. */
static int next_entry(const char **sp, char *buf, size_t size)
{
    const char *s = *sp;
    const char *comma = strchr(s, ',');
    const char *end = comma ? comma : s + strlen(s);
    *sp = comma ? comma + 1 : NULL;
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t len = (size_t)(end - s);
    if (len >= size)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    return 0;
}

void wxg_plugin_chain_destroy(wxg_plugin_chain_t *chain)
{
    if (!chain)
        return;
    for (size_t i = chain->n; i-- > 0;) {
        entry *e = &chain->e[i];
        if (e->initialised && e->desc->destroy)
            e->desc->destroy(e->state);
    }
    /* Unload only after every destroy: a later plugin's destroy cannot use an earlier object,
     * but the order keeps "destroy before unload" obvious. */
    for (size_t i = chain->n; i-- > 0;) {
        if (chain->e[i].dl)
            dlclose(chain->e[i].dl);
        if (chain->e[i].fd > 0)
            close(chain->e[i].fd - 1);
        free(chain->e[i].path);
    }
    free(chain->e);
    free(chain);
}

int wxg_plugin_chain_new(const char *spec, const wxg_plugin_kv_t *conf, size_t conf_count,
                         wxg_plugin_chain_t **out, char *errstr, size_t errstr_size)
{
    int rc = 0;
    char item[4096];
    if (!spec || !out || (!conf && conf_count)) {
        wxg__errf(errstr, errstr_size, "plugins: invalid arguments");
        return WXG_EINVAL;
    }
    wxg_plugin_chain_t *chain = calloc(1, sizeof *chain);
    if (!chain || !(chain->e = calloc(MAX_CHAIN, sizeof *chain->e))) {
        free(chain);
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }

    /* Pass 1: resolve every entry to a checked descriptor, loading objects as needed. */
    const char *s = spec;
    size_t pos = 0;
    while (s) {
        pos++;
        if (next_entry(&s, item, sizeof item) != 0) {
            wxg__errf(errstr, errstr_size, "plugins: entry %zu is too long", pos);
            rc = WXG_ECONFIG;
            goto fail;
        }
        if (item[0] == '\0') {
            wxg__errf(errstr, errstr_size,
                      "plugins: entry %zu is empty (list plugin names or paths separated by ',')",
                      pos);
            rc = WXG_ECONFIG;
            goto fail;
        }
        if (chain->n == MAX_CHAIN) {
            wxg__errf(errstr, errstr_size, "plugins: more than %d plugins", MAX_CHAIN);
            rc = WXG_ECONFIG;
            goto fail;
        }
        entry *e = &chain->e[chain->n];
        if (strchr(item, '/') && item[0] != '/') {
            wxg__errf(errstr, errstr_size,
                      "plugins: plugin path '%s' is relative; give an absolute path (a relative "
                      "one would be looked up from the working directory)",
                      item);
            rc = WXG_ECONFIG;
            goto fail;
        }
        if (strchr(item, '/')) {
            if (!(e->path = strdup(item))) {
                wxg__errf(errstr, errstr_size, "out of memory");
                rc = WXG_ENOMEM;
                goto fail;
            }
            chain->n++; /* from here on destroy cleans the entry up */
            if ((rc = load_external(e, item, errstr, errstr_size)) != 0)
                goto fail;
        } else {
            e->desc = wxg_plugin_builtin(item);
            if (!e->desc) {
                wxg__errf(errstr, errstr_size,
                          "plugins: unknown built-in plugin '%s' (built-ins: %s; give an external "
                          "plugin by its absolute path, e.g. /opt/wxguard/plugins/%s.so)",
                          item, wxg_plugin_builtin_names(), item);
                rc = WXG_ECONFIG;
                goto fail;
            }
            chain->n++;
        }
        if ((rc = check_desc(e->desc, item, errstr, errstr_size)) != 0)
            goto fail;
        for (size_t j = 0; j + 1 < chain->n; j++) {
            if (strcmp(chain->e[j].desc->name, e->desc->name) == 0) {
                wxg__errf(errstr, errstr_size,
                          "plugins: plugin '%s' appears twice (entries %zu and %zu); a name may "
                          "run once per message",
                          e->desc->name, j + 1, chain->n);
                rc = WXG_ECONFIG;
                goto fail;
            }
        }
    }

    /* Pass 2: init in chain order, only once every entry is known to be loadable. */
    for (size_t i = 0; i < chain->n; i++) {
        if ((rc = init_entry(&chain->e[i], conf, conf_count, errstr, errstr_size)) != 0)
            goto fail;
    }
    *out = chain;
    return 0;

fail:
    wxg_plugin_chain_destroy(chain);
    return rc;
}

void wxg_plugin_chain_set_producer(wxg_plugin_chain_t *chain, wxg_producer_t *producer)
{
    chain->producer = producer;
}

size_t wxg_plugin_chain_count(const wxg_plugin_chain_t *chain)
{
    return chain->n;
}

const char *wxg_plugin_chain_name(const wxg_plugin_chain_t *chain, size_t i)
{
    return i < chain->n ? chain->e[i].desc->name : NULL;
}

const char *wxg_plugin_chain_path(const wxg_plugin_chain_t *chain, size_t i)
{
    return i < chain->n ? chain->e[i].path : NULL;
}

/* Calls thread_destroy for plugins [0, upto) in reverse order. */
static void thread_unwind(wxg_plugin_thread_t *thr, size_t upto)
{
    for (size_t i = upto; i-- > 0;) {
        const entry *e = &thr->chain->e[i];
        if (e->desc->thread_destroy)
            e->desc->thread_destroy(e->state, thr->tstate[i]);
    }
}

int wxg_plugin_thread_new(wxg_plugin_chain_t *chain, wxg_plugin_thread_t **out, char *errstr,
                          size_t errstr_size)
{
    wxg_plugin_thread_t *thr = calloc(1, sizeof *thr);
    if (!thr || !(thr->tstate = calloc(chain->n + 1, sizeof *thr->tstate))) {
        free(thr);
        wxg__errf(errstr, errstr_size, "out of memory");
        return WXG_ENOMEM;
    }
    thr->chain = chain;
    for (size_t i = 0; i < chain->n; i++) {
        const entry *e = &chain->e[i];
        if (!e->desc->thread_init)
            continue;
        char perr[512] = "";
        int rc = e->desc->thread_init(e->state, &thr->tstate[i], perr, sizeof perr);
        if (rc != 0) {
            if (rc > 0)
                rc = WXG_EPLUGIN;
            wxg__errf(errstr, errstr_size, "plugin %s: thread_init failed (%s): %s", e->desc->name,
                      wxg_err_name(rc), perr[0] ? perr : "no reason given");
            thread_unwind(thr, i);
            free(thr->tstate);
            free(thr);
            return rc;
        }
    }
    *out = thr;
    return 0;
}

void wxg_plugin_thread_destroy(wxg_plugin_thread_t *thr)
{
    if (!thr)
        return;
    thread_unwind(thr, thr->chain->n);
    free(thr->tstate);
    free(thr);
}

void wxg_plugin_call_init(wxg_plugin_call_t *call)
{
    memset(call, 0, sizeof *call);
}

/* Copies text into dst (size > 4), replacing control characters with spaces and cutting at a
 * UTF-8 character boundary. */
static void copy_text(char *dst, size_t size, const char *src)
{
    size_t len = strlen(src);
    if (len >= size) {
        len = size - 1;
        while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80)
            len--;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = (c < 0x20 || c == 0x7f) ? ' ' : (char)c;
    }
    dst[len] = '\0';
}

/* ----- the context's function table ----- */

static const host_ctx *hc(const wxg_plugin_ctx_t *ctx)
{
    return (const host_ctx *)ctx;
}

static const char *ctx_key(const wxg_plugin_ctx_t *ctx)
{
    const host_ctx *h = hc(ctx);
    if (h->call->key)
        return h->call->key;
    return h->msg && h->msg->key ? h->msg->key : "";
}

static uint64_t ctx_fence(const wxg_plugin_ctx_t *ctx)
{
    return hc(ctx)->call->fence;
}

static uint32_t ctx_attempt(const wxg_plugin_ctx_t *ctx)
{
    return hc(ctx)->call->attempt;
}

static const char *ctx_topic(const wxg_plugin_ctx_t *ctx)
{
    return hc(ctx)->call->topic ? hc(ctx)->call->topic : "";
}

static int32_t ctx_partition(const wxg_plugin_ctx_t *ctx)
{
    return hc(ctx)->call->partition;
}

static int64_t ctx_offset(const wxg_plugin_ctx_t *ctx)
{
    return hc(ctx)->call->offset;
}

static const char *ctx_prev_result(const wxg_plugin_ctx_t *ctx)
{
    return hc(ctx)->call->prev_result;
}

static int ctx_produce_delivery(wxg_plugin_ctx_t *ctx, const char *topic, const void *key,
                                size_t key_len, const void *value, size_t value_len,
                                const wxg_plugin_header_t *headers, size_t header_count,
                                int32_t *partition, int64_t *offset)
{
    host_ctx *h = (host_ctx *)ctx;
    int rc;
    wxg_delivery_t dr = {.partition = -1, .offset = -1};
    wxg_kafka_header_t hdr[MAX_PRODUCE_HDR];
    if (!h->chain->producer) {
        snprintf(h->produce_err, sizeof h->produce_err,
                 "no Kafka producer is configured for plugins");
        rc = WXG_ESTATE;
        goto out;
    }
    if (header_count > MAX_PRODUCE_HDR || (!headers && header_count)) {
        snprintf(h->produce_err, sizeof h->produce_err, "more than %d headers", MAX_PRODUCE_HDR);
        rc = WXG_EINVAL;
        goto out;
    }
    for (size_t i = 0; i < header_count; i++)
        hdr[i] = (wxg_kafka_header_t){headers[i].name, headers[i].value, headers[i].value_len};
    rc =
        wxg_producer_send(h->chain->producer, topic, WXG_PARTITION_ANY, key, key_len, value,
                          value_len, hdr, header_count, &dr, h->produce_err, sizeof h->produce_err);
out:
    if (rc == 0) {
        h->call->produce_count++;
        if (partition)
            *partition = dr.partition;
        if (offset)
            *offset = dr.offset;
    } else {
        h->call->produce_error = rc;
    }
    return rc;
}

static int ctx_produce(wxg_plugin_ctx_t *ctx, const char *topic, const void *key, size_t key_len,
                       const void *value, size_t value_len, const wxg_plugin_header_t *headers,
                       size_t header_count)
{
    return ctx_produce_delivery(ctx, topic, key, key_len, value, value_len, headers, header_count,
                                NULL, NULL);
}

static int ctx_set_result(wxg_plugin_ctx_t *ctx, const char *result)
{
    wxg_plugin_call_t *call = ((host_ctx *)ctx)->call;
    if (!result) {
        call->has_result = 0;
        call->result[0] = '\0';
        return 0;
    }
    size_t len = strlen(result);
    if (len > WXG_PLUGIN_RESULT_MAX)
        return WXG_ETOOBIG;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)result[i];
        if (c < 0x20 || c == 0x7f)
            return WXG_EINVAL;
    }
    memcpy(call->result, result, len + 1);
    call->has_result = 1;
    return 0;
}

static void ctx_set_reason(wxg_plugin_ctx_t *ctx, const char *reason)
{
    wxg_plugin_call_t *call = ((host_ctx *)ctx)->call;
    copy_text(call->reason, sizeof call->reason, reason ? reason : "");
}

static const wxg_plugin_ctx_api_t ctx_api = {
    .struct_size = sizeof(wxg_plugin_ctx_api_t),
    .key = ctx_key,
    .fence = ctx_fence,
    .attempt = ctx_attempt,
    .topic = ctx_topic,
    .partition = ctx_partition,
    .offset = ctx_offset,
    .prev_result = ctx_prev_result,
    .produce = ctx_produce,
    .set_result = ctx_set_result,
    .set_reason = ctx_set_reason,
    .err_name = wxg_err_name,
    .produce_delivery = ctx_produce_delivery,
};

wxg_plugin_result_t wxg_plugin_chain_handle(const wxg_plugin_chain_t *chain,
                                            wxg_plugin_thread_t *thr, size_t i,
                                            const wxg_msg_view_t *msg, wxg_plugin_call_t *call)
{
    if (!chain || !thr || thr->chain != chain || i >= chain->n || !msg || !call) {
        if (call)
            copy_text(call->reason, sizeof call->reason, "invalid plugin call");
        return WXG_PLUGIN_FAIL;
    }
    const entry *e = &chain->e[i];
    host_ctx h = {.pub = {.api = &ctx_api}, .chain = chain, .msg = msg, .call = call};
    int r = (int)e->desc->handle(e->state, thr->tstate[i], msg, &h.pub);
    switch (r) {
    case WXG_PLUGIN_OK:
        return WXG_PLUGIN_OK;
    case WXG_PLUGIN_RETRY:
    case WXG_PLUGIN_FAIL:
        if (call->reason[0] == '\0') {
            if (call->produce_error)
                copy_text(call->reason, sizeof call->reason, h.produce_err);
            else
                snprintf(call->reason, sizeof call->reason,
                         "plugin %s returned %s without a reason", e->desc->name,
                         r == WXG_PLUGIN_RETRY ? "RETRY" : "FAIL");
        }
        return (wxg_plugin_result_t)r;
    default:
        snprintf(call->reason, sizeof call->reason,
                 "plugin %s returned %d, which is not OK, RETRY or FAIL", e->desc->name, r);
        return WXG_PLUGIN_FAIL;
    }
}
