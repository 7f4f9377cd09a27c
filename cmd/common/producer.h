/*
 * The shared producer of the programs: a waited-delivery producer (lib/dlq.c) with the
 * connection settings of a librdkafka configuration built from wxguard's configuration.
 * Single-threaded: called from main() at start-up.
 */
#ifndef WXG_PROG_PRODUCER_H
#define WXG_PROG_PRODUCER_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "wxguard/dlq.h"

/* A producer with the connection, security and timeout settings of `kc` that differ from
 * librdkafka's defaults (consumer-only settings stay behind). `kc` is only read; the caller
 * keeps it. Returns NULL with errstr filled. */
wxg_producer_t *prog_producer(const rd_kafka_conf_t *kc, char *errstr, size_t errstr_size);

#endif /* WXG_PROG_PRODUCER_H */
