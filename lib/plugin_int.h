/*
 * Internal to the plugin module: the descriptors of the built-in plugins in lib/plugins/. Each
 * built-in defines one of these functions; lib/plugin.c lists them in its registry table. To add
 * a built-in, declare its function here and add a line to that table.
 */
#ifndef WXG_PLUGIN_INT_H
#define WXG_PLUGIN_INT_H

#include "wxguard/plugin.h"

const wxg_plugin_desc_t *wxg__plugin_noop(void);
const wxg_plugin_desc_t *wxg__plugin_record(void);
const wxg_plugin_desc_t *wxg__plugin_fail(void);

#endif /* WXG_PLUGIN_INT_H */
