/* The configuration files shipped in deploy/ load with the conf module's own loader, as the
 * programs would load them: natively, with the WXG_* variables docker-compose.yml sets, and the
 * Kubernetes ConfigMap with the Secret's variables. An environment variable the loader does not
 * map to a key would only be a warning, so the tests also assert that none was ignored, and that
 * no ingest configuration still sets a key ingest does not use (metrics.listen, the consumer's:
 * ingest's operations port is ingest.ops.listen). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wxguard/conf.h"

static char *path_of(const char *rel)
{
    const char *src = getenv("WXG_SOURCE_DIR");
    assert_non_null(src);
    size_t n = strlen(src) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", src, rel);
    return p;
}

static char *slurp(const char *rel)
{
    char *path = path_of(rel);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    free(path);
    return buf;
}

static wxg_conf_t *load(unsigned prog, const char *rel, const char *const *envp)
{
    char err[512] = "";
    char *path = path_of(rel);
    static const char *const no_env[] = {NULL};
    wxg_conf_t *c = wxg_conf_load(prog, path, envp ? envp : no_env, NULL, 0, err, sizeof err);
    if (!c)
        fail_msg("%s: %s", rel, err);
    free(path);
    return c;
}

/* Fails when a key of the file is not one of this program's (the environment may hold the
 * other program's keys: one Secret serves both). */
static void assert_all_keys_used(const wxg_conf_t *c)
{
    for (size_t i = 0; i < wxg_conf_warning_count(c); i++) {
        const char *w = wxg_conf_warning(c, i);
        if (strstr(w, "not used by") && !strstr(w, "(env "))
            fail_msg("warning: %s", w);
    }
}

/* Fails when the loader ignored a WXG_* variable (a misspelt name). */
static void assert_no_ignored_env(const wxg_conf_t *c)
{
    for (size_t i = 0; i < wxg_conf_warning_count(c); i++) {
        const char *w = wxg_conf_warning(c, i);
        if (strstr(w, "WXG_") && !strstr(w, "not used by"))
            fail_msg("warning: %s", w);
    }
}

static void native_consumer_and_ingest_files_load_and_agree_on_the_topic(void **state)
{
    (void)state;
    wxg_conf_t *c = load(WXG_PROG_CONSUMER, "deploy/config/consumer.properties", NULL);
    wxg_conf_t *in = load(WXG_PROG_INGEST, "deploy/config/ingest.properties", NULL);
    assert_string_equal(wxg_conf_get(c, "redis.host"), "127.0.0.1");
    assert_string_equal(wxg_conf_get(c, "kafka.bootstrap.servers"),
                        wxg_conf_get(in, "kafka.bootstrap.servers"));
    const char *const *topics = NULL;
    size_t n = wxg_conf_list(c, "consumer.topics", &topics);
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found |= strcmp(topics[i], wxg_conf_get(in, "ingest.topic")) == 0;
    assert_true(found);
    assert_int_equal(wxg_conf_int(c, "consumer.drain.timeout.ms"), 30000);
    assert_true(wxg_conf_list(c, "plugins", NULL) >= 1);
    /* Both programs' operations ports on one host, neither of them the callback port. */
    assert_string_equal(wxg_conf_get(in, "ingest.ops.listen"), "127.0.0.1:9465");
    assert_string_not_equal(wxg_conf_get(in, "ingest.ops.listen"),
                            wxg_conf_get(c, "metrics.listen"));
    assert_string_not_equal(wxg_conf_get(in, "ingest.ops.listen"),
                            wxg_conf_get(in, "ingest.listen"));
    assert_false(wxg_conf_bool(in, "ingest.ops.on.callback.port"));
    assert_all_keys_used(in);
    wxg_conf_free(c);
    wxg_conf_free(in);
}

static void compose_environment_overrides_the_addresses(void **state)
{
    (void)state;
    /* The variables docker-compose.yml sets for consumer-1 and for ingest. */
    const char *const consumer_env[] = {
        "WXG_KAFKA_BOOTSTRAP_SERVERS=kafka:19092",
        "WXG_REDIS_HOST=redis",
        "WXG_REDIS_PORT=6379",
        "WXG_METRICS_LISTEN=0.0.0.0:9464",
        "WXG_PLUGIN__PGSQL__DSN=host=postgres port=5432 dbname=wxguard user=wxguard",
        "WXG_PLUGIN__PGSQL__PASSWORD=wxguard-demo",
        "WXG_KAFKA__CLIENT_ID=wxguard-consumer-1",
        NULL,
    };
    const char *const ingest_env[] = {
        "WXG_KAFKA_BOOTSTRAP_SERVERS=kafka:19092",
        "WXG_INGEST_LISTEN=0.0.0.0:8080",
        "WXG_INGEST_OPS_LISTEN=0.0.0.0:9465",
        NULL,
    };
    char *compose = slurp("docker-compose.yml");
    const char *const *envs[] = {consumer_env, ingest_env};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; envs[k][i]; i++) {
            char name[128];
            snprintf(name, sizeof name, "%.*s:", (int)strcspn(envs[k][i], "="), envs[k][i]);
            if (!strstr(compose, name))
                fail_msg("docker-compose.yml no longer sets %s", name);
        }
    }
    free(compose);
    wxg_conf_t *c = load(WXG_PROG_CONSUMER, "deploy/config/consumer.properties", consumer_env);
    assert_no_ignored_env(c);
    assert_string_equal(wxg_conf_get(c, "kafka.bootstrap.servers"), "kafka:19092");
    assert_string_equal(wxg_conf_get(c, "redis.host"), "redis");
    assert_string_equal(wxg_conf_get(c, "metrics.listen"), "0.0.0.0:9464");
    assert_string_equal(wxg_conf_get(c, "kafka.client.id"), "wxguard-consumer-1");
    assert_string_equal(wxg_conf_get(c, "plugin.pgsql.password"), "wxguard-demo");
    wxg_conf_free(c);
    wxg_conf_t *in = load(WXG_PROG_INGEST, "deploy/config/ingest.properties", ingest_env);
    assert_no_ignored_env(in);
    assert_string_equal(wxg_conf_get(in, "ingest.listen"), "0.0.0.0:8080");
    assert_string_equal(wxg_conf_get(in, "ingest.ops.listen"), "0.0.0.0:9465");
    assert_all_keys_used(in);
    wxg_conf_free(in);
}

/* The block scalar under "  <key>: |" in the ConfigMap, de-indented. */
static char *configmap_block(const char *yaml, const char *key)
{
    char head[128];
    snprintf(head, sizeof head, "\n  %s: |\n", key);
    const char *p = strstr(yaml, head);
    if (!p)
        fail_msg("ConfigMap has no %s", key);
    p += strlen(head);
    char *out = calloc(1, strlen(p) + 1);
    size_t n = 0;
    while (*p && strncmp(p, "    ", 4) == 0) {
        p += 4;
        size_t len = strcspn(p, "\n");
        memcpy(out + n, p, len);
        n += len;
        out[n++] = '\n';
        p += len + (p[len] == '\n');
    }
    return out;
}

/* Writes `value` and a newline to a new file `name` in dir, whose path goes to path. */
static void secret_file(const char *dir, const char *name, const char *value, char *path,
                        size_t size)
{
    snprintf(path, size, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", value);
    fclose(f);
}

/* The ConfigMap's properties load with the secrets as the Deployments hand them over: files of
 * Secrets named by WXG_<KEY>__FILE variables (each Deployment names them), and each program
 * gets only secrets it reads (an unknown or unused variable would be reported). */
static void kubernetes_configmap_loads_with_the_secret_files(void **state)
{
    (void)state;
    char *yaml = slurp("deploy/k8s/configmap.yaml");
    char dir[] = "/tmp/wxg-deploy-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char redis[600], pgsql[600], salt[600], hmac[600];
    secret_file(dir, "redis-password", "s1", redis, sizeof redis);
    secret_file(dir, "pgsql-password", "s2", pgsql, sizeof pgsql);
    secret_file(dir, "id-salt", "s3", salt, sizeof salt);
    secret_file(dir, "hmac-secret", "s4", hmac, sizeof hmac);
    char e[5][700];
    snprintf(e[0], sizeof e[0], "WXG_REDIS_PASSWORD__FILE=%s", redis);
    snprintf(e[1], sizeof e[1], "WXG_PLUGIN__PGSQL__PASSWORD__FILE=%s", pgsql);
    snprintf(e[2], sizeof e[2], "WXG_LOG_ID_SALT__FILE=%s", salt);
    snprintf(e[3], sizeof e[3], "WXG_INGEST_HMAC_SECRET__FILE=%s", hmac);
    snprintf(e[4], sizeof e[4], "WXG_LOG_ID_SALT__FILE=%s", salt);
    const char *const consumer_env[] = {e[0], e[1], e[2], NULL};
    const char *const ingest_env[] = {e[3], e[4], NULL};
    const char *const *envs[2] = {consumer_env, ingest_env};
    const char *deployments[2] = {"deploy/k8s/consumer.yaml", "deploy/k8s/ingest.yaml"};
    const char *keys[2] = {"consumer.properties", "ingest.properties"};
    unsigned progs[2] = {WXG_PROG_CONSUMER, WXG_PROG_INGEST};
    for (int k = 0; k < 2; k++) {
        char *dep = slurp(deployments[k]);
        for (int i = 0; envs[k][i]; i++) {
            char name[128];
            snprintf(name, sizeof name, "- name: %.*s\n", (int)strcspn(envs[k][i], "="),
                     envs[k][i]);
            if (!strstr(dep, name))
                fail_msg("%s no longer sets %.*s", deployments[k], (int)strcspn(name + 8, "\n"),
                         name + 8);
        }
        free(dep);
        char *text = configmap_block(yaml, keys[k]);
        char err[512] = "";
        wxg_conf_t *c = wxg_conf_new(progs[k], err, sizeof err);
        assert_non_null(c);
        if (wxg_conf_load_string(c, text, strlen(text), keys[k], err, sizeof err) != 0 ||
            wxg_conf_load_env(c, envs[k], err, sizeof err) != 0 ||
            wxg_conf_check(c, err, sizeof err))
            fail_msg("ConfigMap %s: %s", keys[k], err);
        assert_string_equal(wxg_conf_get(c, "log.id.salt"), "s3");
        if (k == 0) {
            assert_no_ignored_env(c);
            assert_string_equal(wxg_conf_get(c, "redis.password"), "s1");
            assert_string_equal(wxg_conf_get(c, "plugin.pgsql.password"), "s2");
            /* deploy/k8s/consumer.yaml's grace period (60 s) is checked against this. */
            assert_true(wxg_conf_int(c, "consumer.drain.timeout.ms") < 60000);
        } else {
            assert_string_equal(wxg_conf_get(c, "ingest.hmac.secret"), "s4");
            /* deploy/k8s/ingest.yaml's "ops" containerPort, probes and scrape annotation. */
            assert_string_equal(wxg_conf_get(c, "ingest.ops.listen"), "0.0.0.0:9465");
            assert_false(wxg_conf_bool(c, "ingest.ops.on.callback.port"));
            assert_all_keys_used(c);
        }
        wxg_conf_free(c);
        free(text);
    }
    const char *files[4] = {redis, pgsql, salt, hmac};
    for (int i = 0; i < 4; i++)
        unlink(files[i]);
    rmdir(dir);
    free(yaml);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(native_consumer_and_ingest_files_load_and_agree_on_the_topic),
        cmocka_unit_test(compose_environment_overrides_the_addresses),
        cmocka_unit_test(kubernetes_configmap_loads_with_the_secret_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
