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
