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
    {"bench", idem_cmd_bench, "measure claim throughput of a store"},
    {"keygen", idem_cmd_keygen, "make or decode idempotency keys"},
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
    fprintf(f, "\n`idem <command> --help` explains one command.\n"
               "exit status: 0 done, 1 failed, 2 bad command line\n");
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
    return IDEM_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        cli_usage(stderr);
        return IDEM_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        cli_usage(stdout);
        return IDEM_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) {
        printf("idem %s\n", idem_version());
        return IDEM_EXIT_OK;
    }
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            cli_usage(stdout);
            return IDEM_EXIT_OK;
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
        return IDEM_EXIT_USAGE;
    }
    const struct cli_cmd *c = cli_find(name);
    if (!c)
        return cli_unknown(name);
    return c->run(argc - 1, argv + 1);
}
