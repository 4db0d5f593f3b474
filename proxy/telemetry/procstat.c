#include "proxy/telemetry/procstat.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The boot time (btime of /proc/stat), in Unix seconds; 0 if unknown. */
static unsigned long long boot_time(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long t = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "btime %llu", &t) == 1)
            break;
    fclose(f);
    return t;
}

/* Entries of /proc/self/fd, less the one the listing itself opened. */
static int64_t open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int64_t n = 0;
    int own = dirfd(d);
    char own_name[16];
    snprintf(own_name, sizeof(own_name), "%d", own);
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.' && strcmp(e->d_name, own_name) != 0;
    closedir(d);
    return n;
}

void procstat_read(struct procstat *p)
{
    memset(p, 0, sizeof(*p));
    p->open_fds = open_fds();
    struct rlimit rl;
    p->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                     ? (int64_t)rl.rlim_cur
                     : -1;

    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* the command name, field 2, is in parentheses and may hold spaces and ')': the fields
     * that follow start after the last ')' */
    const char *p3 = strrchr(buf, ')');
    unsigned long long utime, stime, start;
    long long rss;
    /* after it: fields 3 to 13, utime (14), stime (15), 16 to 21, starttime (22), vsize (23),
     * rss (24, in pages) */
    if (!p3 || sscanf(p3 + 1,
                      "%*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu %*s %*s %*s %*s %*s "
                      "%*s %llu %*s %lld",
                      &utime, &stime, &start, &rss) != 4)
        return;
    double tick = (double)sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    p->cpu_seconds = (double)(utime + stime) / tick;
    p->start_time_seconds = (double)boot_time() + (double)start / tick;
    p->resident_bytes = rss > 0 ? (uint64_t)rss * (uint64_t)page : 0;
    p->ok = true;
}
