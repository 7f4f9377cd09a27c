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

/* The producer's own librdkafka setting `name`, as rd_kafka_conf_get() reads it from its
 * handle, into buf; 0, or WXG_ENOTFOUND (unknown name) / WXG_EINVAL (buf too small). For the
 * unit tests: which settings a producer made like a consumer's configuration really took. */
int wxg__producer_conf_get(const wxg_producer_t *p, const char *name, char *buf, size_t size);

#endif /* WXG_DLQ_INT_H */
