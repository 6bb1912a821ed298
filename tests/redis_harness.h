/* tests/redis_harness.h - real Redis servers for the tests.
 *
 * scripts/redis-test.sh does the starting and stopping (the same script
 * scripts/run-tests.sh and bench/run.sh use); this is its C face. A test
 * run started by scripts/run-tests.sh shares one server and one 6-node
 * cluster between all test processes (IDEM_TEST_REDIS, IDEM_TEST_CLUSTER);
 * a test process started without them starts its own and stops them in
 * th_shared_stop(). Tests that kill or reshard nodes always start their
 * own cluster. Tests share servers safely by giving every store its own
 * key prefix (th_prefix()). */
#ifndef IDEM_TESTS_REDIS_HARNESS_H
#define IDEM_TESTS_REDIS_HARNESS_H

#include <hiredis/hiredis.h>

#define TH_MAX_NODES 16

typedef struct th_servers {
    char dir[1024];
    int ports[TH_MAX_NODES];
    int n;
} th_servers;

/* Start one server / a cluster of masters x (1 + replicas) nodes.
 * Fails the test if they cannot be started. */
void th_start_single(th_servers *sv);
/* The same with redis-server options (a shell fragment), e.g.
 * "--requirepass pw". */
void th_start_single_with(th_servers *sv, const char *options);
void th_start_cluster(th_servers *sv, int masters, int replicas);
/* A master (ports[0]), its replica (ports[1]) and three sentinels
 * (ports[2..4]) that watch it as `name` and fail it over within a few
 * seconds of its death. */
void th_start_sentinel(th_servers *sv, const char *name);
/* The same with passwords: the servers require pw, the sentinels spw. */
void th_start_sentinel_auth(th_servers *sv, const char *name, const char *pw,
                            const char *spw);
/* kill -9 every server of sv and remove its directory. */
void th_stop(th_servers *sv);

/* "127.0.0.1:PORT" of the shared server, "127.0.0.1:P1,..." of the
 * shared cluster (3 masters, 3 replicas), and "127.0.0.1:S1,.../NAME"
 * of the shared sentinels and the name of the master they watch (that
 * master is never killed: tests that kill start their own). */
const char *th_redis_addr(void);
const char *th_cluster_addr(void);
const char *th_sentinel_addr(void);
/* Stop what th_redis_addr/th_cluster_addr started for this process. */
void th_shared_stop(void);

/* A key prefix no other store in this test run uses, e.g. "t4242-9f3a:". */
const char *th_prefix(void);

/* A plain hiredis connection to 127.0.0.1:port (fails the test if not). */
redisContext *th_connect(int port);
/* A command on c; the test fails on a NULL reply. Caller frees. */
redisReply *th_cmd(redisContext *c, const char *fmt, ...);

/* The port of the first host of an "h:p,h:p" list. */
int th_first_port(const char *addrs);



/* kill -9 the server on port (one of sv's); start it again as it was. */
void th_kill9(const th_servers *sv, int port);
/* The pid of the server on port (one of sv's), from its pid file, and a
 * signal sent to it (SIGSTOP, SIGCONT, SIGKILL); fail the test if not. */
long th_pid(const th_servers *sv, int port);
void th_signal(const th_servers *sv, int port, int sig);
void th_restart(const th_servers *sv, int port);
/* The cluster node id of the server on port. */
void th_node_id(int port, char id[64]);
/* Port of the master that serves slot, asked of the node on port. */
int th_slot_owner(int port, unsigned slot);
/* Port of a replica of the master on port (-1 if none). */
int th_replica_of(const th_servers *sv, int master_port);
#endif
