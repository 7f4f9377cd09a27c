/*
 * The shared producer of the programs (see producer.h).
 */
#include "producer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The settings a producer shares with the consumer's configuration: where the brokers are and
 * how to reach them securely. Group, fetch and offset settings are the consumer's alone. */
static int producer_prop_wanted(const char *name)
{
    static const char *const exact[] = {
        "bootstrap.servers",     "metadata.broker.list",
        "security.protocol",     "client.id",
        "broker.address.family", "message.timeout.ms",
        "socket.timeout.ms",     "enable.ssl.certificate.verification"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        if (strcmp(name, exact[i]) == 0)
            return 1;
    }
    return strncmp(name, "sasl.", 5) == 0 || strncmp(name, "ssl.", 4) == 0;
}

wxg_producer_t *prog_producer(const rd_kafka_conf_t *kc, char *errstr, size_t errstr_size)
{
    /* Only what the configuration changed from librdkafka's defaults is handed on. */
    size_t cnt = 0, dcnt = 0;
    const char **dump = rd_kafka_conf_dump((rd_kafka_conf_t *)kc, &cnt);
    rd_kafka_conf_t *defconf = rd_kafka_conf_new();
    const char **defs = rd_kafka_conf_dump(defconf, &dcnt);
    wxg_kafka_prop_t *props = calloc(cnt / 2 + 1, sizeof *props);
    size_t np = 0;
    for (size_t i = 0; props && i + 1 < cnt; i += 2) {
        if (!producer_prop_wanted(dump[i]))
            continue;
        int is_default = 0;
        for (size_t k = 0; k + 1 < dcnt; k += 2) {
            if (strcmp(defs[k], dump[i]) == 0) {
                is_default = strcmp(defs[k + 1], dump[i + 1]) == 0;
                break;
            }
        }
        /* librdkafka dumps bootstrap.servers under its older name. */
        const char *name =
            strcmp(dump[i], "metadata.broker.list") == 0 ? "bootstrap.servers" : dump[i];
        if (!is_default)
            props[np++] = (wxg_kafka_prop_t){name, dump[i + 1]};
    }
    wxg_producer_t *p = NULL;
    if (props)
        p = wxg_producer_new(props, np, errstr, errstr_size);
    else
        snprintf(errstr, errstr_size, "out of memory");
    free(props);
    rd_kafka_conf_dump_free(defs, dcnt);
    rd_kafka_conf_destroy(defconf);
    rd_kafka_conf_dump_free(dump, cnt);
    return p;
}
