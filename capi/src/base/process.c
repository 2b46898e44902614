/* process - another local process's fate, from kill(2) and /proc (see process.h). */
#include "base/process.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cx_process_machine(char *out, size_t len)
{
    char boot[64] = "", ns[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = '\0';
    snprintf(out, len, "%s/%s", boot[0] ? boot : "unknown", ns[0] ? ns : "unknown");
}

/* The state letter and start time from /proc/<pid>/stat; 0 when it cannot be read. */
static int read_stat(int pid, char *state, unsigned long long *start_time)
{
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *p = strrchr(text, ')'); /* "pid (comm) S ...": comm may hold spaces */
    if (!p || p[1] != ' ' || !p[2])
        return 0;
    *state = p[2];
    /* Field 22 (starttime); the state is field 3, and p moves from the space before field 4. */
    p += 3;
    for (int field = 4; field < 22 && p; field++)
        p = strchr(p + 1, ' ');
    *start_time = p ? strtoull(p + 1, NULL, 10) : 0;
    return 1;
}

unsigned long long cx_process_start_time(int pid)
{
    char state;
    unsigned long long start = 0;
    return read_stat(pid, &state, &start) ? start : 0;
}

cx_process_state cx_process_probe(int pid, unsigned long long start_time)
{
    if (pid <= 0)
        return CX_PROCESS_UNKNOWN;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return CX_PROCESS_ENDED;
    char state;
    unsigned long long start = 0;
    if (!read_stat(pid, &state, &start))
        return kill(pid, 0) != 0 && errno == ESRCH ? CX_PROCESS_ENDED : CX_PROCESS_UNKNOWN;
    if (start_time && start && start != start_time)
        return CX_PROCESS_ENDED; /* the pid was reused */
    if (state == 'Z' || state == 'X' || state == 'x')
        return CX_PROCESS_ENDED;
    if (state == 'T' || state == 't')
        return CX_PROCESS_STOPPED;
    return CX_PROCESS_RUNNING;
}
