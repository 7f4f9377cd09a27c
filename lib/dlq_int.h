/*
 * Internals of the producer module (lib/dlq.c) shared with its unit tests. Pure (compares `name`,
 * borrowed for the call, with fixed property names), any thread.
 */
#ifndef WXG_DLQ_INT_H
#define WXG_DLQ_INT_H

#include "wxguard/dlq.h"

/* Whether a producer of `scope` takes over the librdkafka setting `name` (never a callback;
 * with WXG_PRODUCER_CONNECTION only broker addresses, security and timeouts). */
int wxg__producer_prop_wanted(wxg_producer_scope_t scope, const char *name);

#endif /* WXG_DLQ_INT_H */
