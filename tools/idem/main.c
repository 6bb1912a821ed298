/* main.c - the idem command: dispatch to one file per subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "idem/idem.h"

static const struct idem_cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} cmds[] = {
    {"dedup", idem_cmd_dedup, "print each key's first occurrence, "
                              "exactly once"},
    {"run", idem_cmd_run, "run a handler once per key, exactly once"},
    {"get", idem_cmd_get, "show the record of a key"},
    {"forget", idem_cmd_forget, "delete the record of a key"},
    {"stats", idem_cmd_stats, "keys by state, segments, disk and memory"},
    {"sweep", idem_cmd_sweep, "remove expired records now"},
    {"check", idem_cmd_check, "verify every checksum (exit 1 on damage)"},
    {"repair", idem_cmd_repair, "rewrite damaged segments, keeping every "
                                "valid record"},
    {"dump", idem_cmd_dump, "export every live record as NDJSON"},
    {"load", idem_cmd_load, "import records written by dump"},
    {"bench", idem_cmd_bench, "measure claim throughput of a store"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: idem COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
    fprintf(f, "\n`idem COMMAND --help` explains one command; "
               "`man idem` explains them all.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("idem %s\n", idem_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name))
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "idem: unknown command '%s'; try `idem --help`\n",
            argv[1]);
    return 2;
}
