/*
 * DESIGN: the Lua design of the guard: every transition a script (lib/guard/guard_transitions.c),
 * behind the near cache (lib/guard/guard_near.c).
 *
 * Purpose: the design that keeps every check and change of a message's state inside one script
 * call per batch: it costs Redis about three times the native design's commands
 * (docs/guard.md §9), and it is the reference the native design's rare paths share.
 *
 * Threads: the handle's thread only; no locks.
 */
#include "guard_conn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock_int.h"

/* ---------------------------------------------------------------------------------------------
 * The operations table of the Lua design: every transition a script
 */

static int lua_claim_redis(wxg__guard_redis_t *rg, const wxg_guard_msg_t *msgs, size_t n,
                           wxg_guard_claim_t *out, const unsigned char (*fps)[32])
{
    return wxg__guard_script_claim(rg, msgs, n, out, fps, NULL, NULL);
}

static int lua_claim(wxg_guard_t *g, const wxg_guard_msg_t *msgs, size_t n, wxg_guard_claim_t *out)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    if (rg->conf.done_cache)
        return wxg__guard_near_claim(rg, msgs, n, out, lua_claim_redis);
    return lua_claim_redis(rg, msgs, n, out, NULL);
}

static int lua_renew(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    return wxg__guard_script_renew(wxg__guard_impl(g), t, n, results);
}

static int lua_plugin_done(wxg_guard_t *g, const wxg_guard_plugin_done_t *items, size_t n,
                           int *results)
{
    return wxg__guard_script_plugin_done(wxg__guard_impl(g), items, n, results);
}

static int lua_complete(wxg_guard_t *g, const wxg_guard_ticket_t *t, size_t n, int *results)
{
    wxg__guard_redis_t *rg = wxg__guard_impl(g);
    /* Taken before the call: the marker is written after this instant (server time), so an
     * expiry counted from here never outlasts it (wxg__guard_near_remember). */
    int64_t sent_ms = wxg__mono_ms();
    unsigned char(*fps)[32] = NULL;
    if (rg->conf.done_cache) {
        fps = malloc(n * sizeof *fps);
        if (!fps)
            return WXG_ENOMEM;
    }
    int rc = wxg__guard_script_complete(rg, t, n, results, fps);
    if (rc == 0 && fps)
        wxg__guard_near_remember(rg, t, n, results, (const unsigned char(*)[32])fps, sent_ms);
    free(fps);
    return rc;
}

static int lua_fail(wxg_guard_t *g, const wxg_guard_failure_t *items, size_t n, int *results)
{
    return wxg__guard_script_fail(wxg__guard_impl(g), items, n, results);
}

static const wxg__guard_ops_t lua_ops = {
    .name = "lua",
    .claim_batch = lua_claim,
    .renew_batch = lua_renew,
    .plugin_done_batch = lua_plugin_done,
    .complete_batch = lua_complete,
    .fail_batch = lua_fail,
    WXG__GUARD_REDIS_OPS,
};

wxg_guard_t *wxg__guard_lua_new(const wxg_guard_conf_t *conf, int *err, char *errstr,
                                size_t errstr_size)
{
    return wxg__guard_redis_new(conf, &lua_ops, err, errstr, errstr_size);
}
