/* kafka_mock.c - a Kafka cluster for the tests: librdkafka's mock.
 *
 *   kafka_mock TOPIC:PARTITIONS...
 *
 * Starts rd_kafka_mock_cluster_new() with 3 brokers on loopback, creates
 * the topics, prints the bootstrap servers on one line and then obeys
 * commands on standard input, one a line, answering "ok" to each:
 *
 *   down ID | up ID          a broker stops answering, or comes back
 *   errors APIKEY N CODE     the next N requests of APIKEY fail so
 *   clear APIKEY             the errors still pushed for APIKEY go
 *   slow APIKEY N MS         every broker answers its next N requests of
 *                            APIKEY MS late (they are carried out at once)
 *   topic NAME PARTITIONS    another topic
 *
 * It runs until its input ends or it is killed. The mock lacks
 * transactions and read_committed, which nothing in idem relies on. */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int make_topic(rd_kafka_mock_cluster_t *mc, const char *spec)
{
    char name[256];
    int parts = 0;
    if (sscanf(spec, "%255[^:]:%d", name, &parts) != 2 || parts < 1)
        return -1;
    return rd_kafka_mock_topic_create(mc, name, parts, 3) ? -1 : 0;
}

static int command(rd_kafka_mock_cluster_t *mc, const char *line)
{
    int id, key, n, code;
    char spec[300];
    if (sscanf(line, "down %d", &id) == 1)
        return rd_kafka_mock_broker_set_down(mc, id) ? -1 : 0;
    if (sscanf(line, "up %d", &id) == 1)
        return rd_kafka_mock_broker_set_up(mc, id) ? -1 : 0;
    if (sscanf(line, "errors %d %d %d", &key, &n, &code) == 3) {
        rd_kafka_resp_err_t *errs = calloc((size_t)n, sizeof *errs);
        if (!errs)
            return -1;
        for (int i = 0; i < n; i++)
            errs[i] = (rd_kafka_resp_err_t)code;
        rd_kafka_mock_push_request_errors_array(mc, (int16_t)key,
                                                (size_t)n, errs);
        free(errs);
        return 0;
    }
    if (sscanf(line, "slow %d %d %d", &key, &n, &code) == 3) {
        for (int b = 1; b <= 3; b++)
            for (int i = 0; i < n; i++)
                if (rd_kafka_mock_broker_push_request_error_rtts(
                        mc, b, (int16_t)key, 1, RD_KAFKA_RESP_ERR_NO_ERROR,
                        code))
                    return -1;
        return 0;
    }
    if (sscanf(line, "clear %d", &key) == 1) {
        rd_kafka_mock_clear_request_errors(mc, (int16_t)key);
        return 0;
    }
    if (sscanf(line, "topic %299s", spec) == 1)
        return make_topic(mc, spec);
    return -1;
}

int main(int argc, char **argv)
{
    char err[256];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", NULL, 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "kafka_mock: %s\n", err);
        return 1;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, 3);
    if (!mc) {
        fprintf(stderr, "kafka_mock: no mock cluster\n");
        return 1;
    }
    for (int i = 1; i < argc; i++)
        if (make_topic(mc, argv[i])) {
            fprintf(stderr, "kafka_mock: bad topic %s\n", argv[i]);
            return 1;
        }
    printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
    fflush(stdout);
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        printf("%s\n", command(mc, line) ? "error" : "ok");
        fflush(stdout);
    }
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return 0;
}
