/*
 * DESIGN: the `noop` built-in plugin.
 *
 * Does nothing and returns OK for every message. It exists so that the pipeline (claim,
 * complete, offsets) can run and be benchmarked without any effect, and as the smallest example
 * of a plugin. It has no state, no thread state and no configuration keys: any
 * `plugin.noop.*` key is refused at start-up as a likely typo.
 */
#include "plugin_int.h"

static int noop_init(const wxg_plugin_conf_t *conf, void **state, char *errstr, size_t errstr_size)
{
    static const char *const known[] = {NULL};
    *state = NULL;
    return wxg_plugin_conf_check_keys(conf, known, errstr, errstr_size);
}

static wxg_plugin_result_t noop_handle(void *state, void *thread_state, const wxg_msg_view_t *msg,
                                       wxg_plugin_ctx_t *ctx)
{
    (void)state;
    (void)thread_state;
    (void)msg;
    (void)ctx;
    return WXG_PLUGIN_OK;
}

static const wxg_plugin_desc_t noop_desc = {
    .abi_version = WXG_PLUGIN_ABI_VERSION,
    .name = "noop",
    .init = noop_init,
    .handle = noop_handle,
};

const wxg_plugin_desc_t *wxg__plugin_noop(void)
{
    return &noop_desc;
}
