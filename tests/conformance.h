/* tests/conformance.h - one suite, every backend.
 *
 * CONF_TEST(name) { ... } defines a test body that runs once per backend
 * (mem:, local:, local: with no hot budget and a segment per commit (so
 * that keys are looked up through cold segments), redis://,
 * redis-cluster://, the last two also in their day-bucketed layout, and
 * redis-sentinel://), each in its own process,
 * against a fresh store whose URI is conf_uri. A new backend joins by
 * adding a Test() line per test in CONF_TEST and a suite init that sets
 * conf_uri. The Redis suites share servers (tests/redis_harness.h); a
 * store is fresh because its URI has a key prefix no other test uses,
 * which, unlike a FLUSHALL, leaves tests running beside it alone. */
#ifndef IDEM_TESTS_CONFORMANCE_H
#define IDEM_TESTS_CONFORMANCE_H

#include "common.h"

extern const char *conf_uri;
void conf_setup_mem(void);
void conf_setup_local(void);
void conf_setup_cold(void);
void conf_setup_redis(void);
void conf_setup_cluster(void);
void conf_setup_redis_day(void);
void conf_setup_cluster_day(void);
void conf_setup_sentinel(void);
void conf_teardown(void);

#define CONF_TEST(name)                                                    \
    static void conf_##name(void);                                         \
    Test(conf_mem, name, .init = conf_setup_mem, .fini = conf_teardown,    \
         .timeout = 60)                                                    \
    {                                                                      \
        conf_##name();                                                     \
    }                                                                      \
    Test(conf_local, name, .init = conf_setup_local,                       \
         .fini = conf_teardown, .timeout = 60)                             \
    {                                                                      \
        conf_##name();                                                     \
    }                                                                      \
    Test(conf_cold, name, .init = conf_setup_cold, .fini = conf_teardown,  \
         .timeout = 60)                                                    \
    {                                                                      \
        conf_##name();                                                     \
    }                                                                      \
    Test(conf_redis, name, .init = conf_setup_redis,                       \
         .fini = conf_teardown, .timeout = 60)                             \
    {                                                                      \
        conf_##name();                                                     \
    }                                                                      \
    Test(conf_cluster, name, .init = conf_setup_cluster,                   \
         .fini = conf_teardown, .timeout = 60)                             \
    {                                                                      \
        conf_##name();                                                     \
    }                                                                      \
    Test(conf_redis_day, name, .init = conf_setup_redis_day,               \
         .fini = conf_teardown, .timeout = 60)                             \
    {                                                                      \
        conf_##name();                                                     \
    }                                                                      \
    Test(conf_cluster_day, name, .init = conf_setup_cluster_day,           \
         .fini = conf_teardown, .timeout = 60)                             \
    {                                                                      \
        conf_##name();                                                     \
    }                                                                      \
    Test(conf_sentinel, name, .init = conf_setup_sentinel,                 \
         .fini = conf_teardown, .timeout = 60)                             \
    {                                                                      \
        conf_##name();                                                     \
    }                                                                      \
    static void conf_##name(void)

#endif
