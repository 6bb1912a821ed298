/* procgroup.c - does anything of a process group still run?
 *
 * kill(-pgid, 0) answers yes while the group has zombies, and a zombie
 * stays until its parent reaps it. A handler's shell may leave children
 * that, killed with the group, are reparented to PID 1; in a container
 * whose PID 1 never reaps, they stay zombies for good, and a wait for the
 * group to vanish would always run to its end. A zombie runs nothing, so
 * what matters is whether a member is in any other state: /proc tells,
 * and is read only when kill() says the group is not gone. */
#include "cli.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Is /proc/NAME a live (not zombie) member of group pgid? */
static int member_runs(const char *name, pid_t pgid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", name);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;  /* gone since the directory was read */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');  /* the name may hold anything */
    char state;
    long group;
    if (!p || sscanf(p + 1, " %c %*d %ld", &state, &group) != 2)
        return 0;
    return group == (long)pgid && state != 'Z' && state != 'X';
}

int cli_group_runs(pid_t pgid)
{
    if (kill(-pgid, 0) != 0)
        return 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 1;  /* cannot tell: say it runs, the caller waits */
    int runs = 0;
    struct dirent *e;
    while (!runs && (e = readdir(d)))
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9')
            runs = member_runs(e->d_name, pgid);
    closedir(d);
    return runs;
}
