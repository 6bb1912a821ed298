/* main.c - `idem <command> [args]`: find the command, run it.
 *
 * Nothing here but the table: every command is a function in its own
 * file (see cli.h), so adding one is one line below. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "idem/idem.h"

struct cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct cli_cmd cli_cmds[] = {
    {"dedup", cli_cmd_dedup, "print each key's first occurrence, "
                              "exactly once"},
    {"run", cli_cmd_run, "run a handler once per key, exactly once"},
    {"get", cli_cmd_get, "show the record of a key"},
    {"forget", cli_cmd_forget, "delete the record of a key"},
    {"stats", cli_cmd_stats, "keys by state, segments, disk and memory"},
    {"sweep", cli_cmd_sweep, "remove expired records now"},
    {"check", cli_cmd_check, "verify every checksum (exit 1 on damage)"},
    {"repair", cli_cmd_repair, "rewrite damaged segments, keeping every "
                                "valid record"},
    {"dump", cli_cmd_dump, "export every live record as NDJSON"},
    {"load", cli_cmd_load, "import records written by dump"},
    {"reset", cli_cmd_reset, "drop a job's checkpoint: its next run "
                              "starts over"},
    {"keygen", cli_cmd_keygen, "make or decode idempotency keys"},
    {"bench", cli_cmd_bench, "measure claim throughput of a store"},
};

#define CLI_NCMDS (sizeof cli_cmds / sizeof cli_cmds[0])

static void cli_usage(FILE *f)
{
    fprintf(f, "usage: idem <command> [options]\n"
               "       idem help <command>   (same as idem <command> --help)\n"
               "       idem --version\n"
               "\n"
               "commands:\n");
    for (size_t i = 0; i < CLI_NCMDS; i++)
        fprintf(f, "  %-10s %s\n", cli_cmds[i].name, cli_cmds[i].summary);
    fprintf(f, "\n`idem <command> --help` explains one command; "
               "`man idem` explains them all.\n"
               "exit status, the same for every command:\n"
               "  0    all done\n"
               "  1    failed: a store, file or handler error, damage "
               "found\n"
               "  2    bad usage (a --store URI included); nothing was "
               "done\n"
               "  3    dedup, run: input read, but some messages not done "
               "(named on stderr)\n"
               "  130  dedup, run: stopped by SIGINT\n");
}

static const struct cli_cmd *cli_find(const char *name)
{
    for (size_t i = 0; i < CLI_NCMDS; i++)
        if (strcmp(cli_cmds[i].name, name) == 0)
            return &cli_cmds[i];
    return NULL;
}

static int cli_unknown(const char *name)
{
    fprintf(stderr,
            "idem: unknown command '%s'; run 'idem --help' for the list\n",
            name);
    return CLI_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        cli_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (cli_argv_hide(argc, argv)) {
        fprintf(stderr, "idem: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        cli_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) {
        printf("idem %s\n", idem_version());
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
        const struct cli_cmd *c = cli_find(argv[2]);
        if (!c)
            return cli_unknown(argv[2]);
        char help[] = "--help";
        char *args[] = {argv[2], help, NULL};
        return c->run(2, args);
    }
    if (name[0] == '-') {
        fprintf(stderr,
                "idem: '%s' is not a command; options go after the command "
                "(idem <command> %s); run 'idem --help' for the list\n",
                name, name);
        return CLI_EXIT_USAGE;
    }
    const struct cli_cmd *c = cli_find(name);
    if (!c)
        return cli_unknown(name);
    return c->run(argc - 1, argv + 1);
}
