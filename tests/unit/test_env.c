/* The environment, read in one place (src/util/env.h, docs/env.md): settings
 * follow the environment at each call; diagnostics are read once, by
 * whichever thread asks first, and later changes are not seen; the log level
 * comes from them unless refit_log_set_level() says otherwise. */
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

#define NTHREADS 8

static pthread_barrier_t g_start;

static void *first_reader(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&g_start); /* every thread asks at once: one of them runs the read */
    return (void *)refit_diag();
}

/* Runs before anything in the process has asked for the diagnostics (main
 * sets the variables first): all threads see one struct, holding the values
 * of the environment at the time of the read. */
static void test_diag_read_once_by_many(void **state)
{
    (void)state;
    pthread_t t[NTHREADS];
    void *got[NTHREADS];
    assert_int_equal(pthread_barrier_init(&g_start, NULL, NTHREADS), 0);
    for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, first_reader, NULL), 0);
    for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_join(t[i], &got[i]), 0);
    pthread_barrier_destroy(&g_start);
    for (int i = 1; i < NTHREADS; i++) assert_ptr_equal(got[i], got[0]);
    const refit_diag_t *d = got[0];
    assert_string_equal(d->cuda_small, "after");
    assert_string_equal(d->cuda_alloc_round, "0");
    assert_string_equal(d->cuda_trace, ""); /* empty strings are kept: gpu.cu reads "" as off */
    assert_string_equal(d->log_level, "warn");
    assert_string_equal(d->digest_gpu, "separate");
    assert_null(d->digest_trace);
    assert_string_equal(d->fleet_trace, "/nonexistent/fleet-trace");
    /* A later change is not seen: the values are copies, taken once. */
    setenv("REFIT_CUDA_SMALL", "before", 1);
    unsetenv("REFIT_CUDA_ALLOC_ROUND");
    setenv("REFIT_LOG_LEVEL", "trace", 1);
    setenv("REFIT_DIGEST_GPU", "host", 1);
    assert_ptr_equal(refit_diag(), d);
    assert_string_equal(refit_diag()->digest_gpu, "separate");
    assert_string_equal(refit_diag()->cuda_small, "after");
    assert_string_equal(refit_diag()->cuda_alloc_round, "0");
    assert_string_equal(refit_diag()->log_level, "warn");
}

static void test_log_level(void **state)
{
    (void)state;
    assert_int_equal(refit_log_get_level(), REFIT_LOG_WARN); /* REFIT_LOG_LEVEL=warn when first read */
    refit_log_set_level(REFIT_LOG_ERROR);
    assert_int_equal(refit_log_get_level(), REFIT_LOG_ERROR);
    refit_log_set_level(REFIT_LOG_OFF);
    assert_int_equal(refit_log_get_level(), REFIT_LOG_OFF);
}

static void test_settings_follow_the_environment(void **state)
{
    (void)state;
    setenv("REFIT_REGISTRY", "file:/a", 1);
    assert_string_equal(refit_env(REFIT_ENV_REGISTRY), "file:/a");
    setenv("REFIT_REGISTRY", "file:/b", 1);
    assert_string_equal(refit_env(REFIT_ENV_REGISTRY), "file:/b");
    unsetenv("REFIT_REGISTRY");
    assert_null(refit_env(REFIT_ENV_REGISTRY));
    /* The secret's pointer is getenv's own (registry.c overwrites it in place). */
    setenv("REFIT_SECRET_FILE", "/x", 1);
    assert_ptr_equal(refit_env(REFIT_ENV_SECRET_FILE), getenv("REFIT_SECRET_FILE"));
    unsetenv("REFIT_SECRET_FILE");
    assert_string_equal(refit_env_name(REFIT_ENV_REGISTRY), "REFIT_REGISTRY");
    assert_string_equal(refit_env_name(REFIT_ENV_HOME), "HOME");
    assert_string_equal(refit_env_name(REFIT_ENV_COUNT), "?");
    assert_null(refit_env(REFIT_ENV_COUNT));
    assert_null(refit_env((refit_env_t)-1));
}

/* Each name in the table is a distinct REFIT_ or system variable. */
static void test_names(void **state)
{
    (void)state;
    for (int i = 0; i < REFIT_ENV_COUNT; i++) {
        const char *n = refit_env_name((refit_env_t)i);
        assert_true(!strncmp(n, "REFIT_", 6) || !strcmp(n, "XDG_RUNTIME_DIR") || !strcmp(n, "HOME"));
        for (int j = 0; j < i; j++) assert_string_not_equal(n, refit_env_name((refit_env_t)j));
    }
}

int main(void)
{
    /* Before the library reads any diagnostic. */
    setenv("REFIT_CUDA_SMALL", "after", 1);
    setenv("REFIT_CUDA_ALLOC_ROUND", "0", 1);
    setenv("REFIT_CUDA_TRACE", "", 1);
    setenv("REFIT_LOG_LEVEL", "warn", 1);
    setenv("REFIT_DIGEST_GPU", "separate", 1);
    unsetenv("REFIT_DIGEST_TRACE");
    setenv("REFIT_FLEET_TRACE", "/nonexistent/fleet-trace", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_diag_read_once_by_many),
        cmocka_unit_test(test_log_level),
        cmocka_unit_test(test_settings_follow_the_environment),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
