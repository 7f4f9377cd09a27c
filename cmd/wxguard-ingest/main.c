/*
 * wxguard-ingest: the webhook receiver. WeChat gateway callbacks over HTTP in, Kafka records out.
 *
 *   wxguard-ingest --config FILE [--set key=value]... [--print-config]
 *
 * Reads the configuration (file, WXG_* environment, --set flags; see docs/configuration.md),
 * serves POST /v1/callback/{wkteam,gewe,oa,generic,auto}[/{account}] (and the Official Account's
 * GET URL verification) on ingest.listen, and /healthz, /readyz and /metrics on
 * ingest.ops.listen (lib/ingest.c starts both servers), and runs until SIGTERM or SIGINT. A stop
 * finishes the requests in progress (each within its produce budget) and flushes the producer.
 *
 * Exit status: 0 clean stop, 1 fatal error, 2 usage or configuration error, 3 start-up failure
 * (the address cannot be bound, Kafka settings refused, the brokers refuse the SASL credentials).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progstart.h"
#include "wxguard/conf.h"
#include "wxguard/err.h"
#include "wxguard/ingest.h"
#include "wxguard/log.h"
#include "wxguard/metrics.h"

#define EXIT_FATAL   PROG_EXIT_FATAL
#define EXIT_STARTUP 3

/* How long start-up waits for a first answer from Kafka, to learn whether it takes the
 * credentials; an answer or a refusal usually comes within a second. */
#define KAFKA_CHECK_MS 10000

static void usage(FILE *out)
{
    fprintf(out,
            "usage: wxguard-ingest --config FILE [--set key=value]... [--print-config | --check]\n"
            "       wxguard-ingest --help | --version\n\n"
            "  -c, --config FILE    properties file (key = value lines, # comments)\n"
            "  -s, --set K=V        override one key (repeatable; wins over file and env)\n"
            "  -p, --print-config   print the effective configuration (secrets as ***), exit\n"
            "  -C, --check          check the configuration (keys, types, limits), exit 0 when\n"
            "                       it is valid, 2 when not; no server is contacted\n"
            "  -h, --help           this text\n"
            "  -V, --version        print the version\n\n"
            "Endpoints on ingest.listen (the callback port):\n"
            "  POST /v1/callback/{wkteam|gewe|oa|generic|auto}[/{account}]  store a callback\n"
            "  GET  /v1/callback/oa?signature=&timestamp=&nonce=&echostr=   URL verification\n"
            "on ingest.ops.listen (default 127.0.0.1:9465; also on the callback port with\n"
            "ingest.ops.on.callback.port = true):\n"
            "  GET  /healthz  /readyz  /metrics\n"
            "200 only after Kafka acknowledged the raw body; 503 (retry) when it did not within\n"
            "ingest.produce.timeout.ms; 400/401/404/405/413 as docs/ingest.md describes.\n\n"
            "Every key may also come from the environment as WXG_<KEY> (upper case, '.' as "
            "'_'),\ne.g. WXG_KAFKA_BOOTSTRAP_SERVERS. kafka.* keys go to librdkafka as they are.\n"
            "exit status: 0 clean stop, 1 fatal error, 2 usage or configuration error, "
            "3 start-up failure\n");
}

int main(int argc, char **argv)
{
    int exit_code = 0;
    wxg_conf_t *conf = prog_start(argc, argv, "wxguard-ingest", WXG_PROG_INGEST, usage, &exit_code);
    if (!conf)
        return exit_code;

    /* Signals are taken by sigwait() on this thread; every thread started from here on inherits
     * the mask, so none of them is interrupted by a stop request. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[512] = "";
    int status = EXIT_STARTUP;
    wxg_ingest_t *in = NULL;
    wxg_metrics_t *metrics = prog_metrics("wxguard-ingest");
    if (!metrics) {
        fprintf(stderr, "wxguard-ingest: out of memory\n");
        status = EXIT_FATAL;
        goto out;
    }
    in = wxg_ingest_new(conf, metrics, err, sizeof err);
    if (!in) {
        wxg_log(WXG_LOG_ERROR, "start_failed", WXG_LS("reason", err));
        goto out;
    }
    /* A wrong SASL password is a start-up error; brokers that are down are waited for (requests
     * get 503 meanwhile), as before. */
    int rc = wxg_ingest_check_kafka(in, KAFKA_CHECK_MS, err, sizeof err);
    if (wxg_err_class(rc) == WXG_CLASS_FATAL) { /* refused credentials */
        wxg_log(WXG_LOG_ERROR, "kafka_auth_failed", WXG_LERR(rc), WXG_LS("reason", err));
        goto out;
    }
    /* The operations port first, then the one line a supervisor or a test waits for: whoever
     * sees that line has seen the other already. */
    if (wxg_ingest_ops_port(in) > 0)
        printf("wxguard-ingest operations on port %d\n", wxg_ingest_ops_port(in));
    printf("wxguard-ingest listening on port %d\n", wxg_ingest_port(in));
    fflush(stdout);

    int sig = 0;
    sigwait(&stop, &sig);
    wxg_log(WXG_LOG_INFO, "stopping", WXG_LI("signal", sig));
    status = 0;

out:
    wxg_ingest_destroy(in); /* stops its operations server first */
    wxg_metrics_free(metrics);
    wxg_conf_free(conf);
    if (status == 0)
        wxg_log(WXG_LOG_INFO, "stopped");
    return status;
}
