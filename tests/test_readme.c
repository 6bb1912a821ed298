/* tests/test_readme.c - the README's shell examples run verbatim and print
 * what the README says (scripts/readme-examples.py), so the README cannot
 * drift from the program; and that checker itself catches a drift. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Run the checker on README (a path) with the CLI's build directory;
 * its report goes to t_dir/report. */
static int check(const char *readme)
{
    return t_sh("python3 \"$IDEM_SCRIPTS/readme-examples.py\" \"%s\" "
                "\"$(dirname \"$IDEM_CLI\")\" > '%s' 2>&1", readme,
                t_at("report"));
}

TestSuite(readme, .init = t_dir_init, .fini = t_dir_fini, .timeout = 300);

Test(readme, every_shell_example_prints_what_the_readme_says,
     .timeout = 300)
{
    int rc = check("$IDEM_SCRIPTS/../README.md");
    char *report = t_read(t_at("report"), NULL);
    cr_assert_eq(rc, 0, "%s", report);
    cr_assert(strstr(report, ": ok"), "%s", report);
    free(report);
}

Test(readme, the_checker_catches_a_drift, .timeout = 60)
{
    const char *md =
        "Text.\n\n<!-- norun -->\n```sh\nexit 1\n```\n\n"
        "```sh\n$ build/idem keygen bizkey --prefix o --id 1 --payload x\n"
        "o:1:2d711642b726b044    # a comment\n"
        "$ echo one two;  echo three\none two\n...\n```\n\n"
        "<!-- shape -->\n```sh\n$ build/idem keygen uuid7\n"
        "01a23655-407c-700a-8929-fa246f1ae3c3\n```\n\n"
        "```sh\n$ build/idem keygen --decode 1\nkind=snowflake\nid=2\n"
        "```\n";
    t_write(t_at("README.md"), md, strlen(md));
    cr_assert_eq(check(t_at("README.md")), 1);
    char *report = t_read(t_at("report"), NULL);
    cr_assert(strstr(report, "README.md:4: not run"), "%s", report);
    cr_assert(strstr(report, "README.md:8: ok"), "%s", report);
    cr_assert(strstr(report, "README.md:17: ok"), "%s", report);
    cr_assert(strstr(report, "README.md:22: FAILED\n$ build/idem keygen "
                             "--decode 1\nprinted:\nkind=snowflake\nid=1\n"),
              "%s", report);
    free(report);
}
