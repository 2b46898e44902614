/*
 * process - what one process can learn about another on the same machine: the machine's and the
 * pid namespace's identity (so a pid is only read where it means the same process), and whether a
 * peer's process runs, has ended or is stopped. The shared-memory barrier and the Gloo transport
 * use it to name the rank that died instead of "a peer".
 */
#ifndef CFX_PROCESS_H
#define CFX_PROCESS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cx_process_state {
    CX_PROCESS_UNKNOWN = 0, /* cannot tell (no /proc, another user's process) */
    CX_PROCESS_RUNNING = 1,
    CX_PROCESS_STOPPED = 2, /* SIGSTOP or a debugger: alive, but answers nobody */
    CX_PROCESS_ENDED = 3    /* gone, or a zombie its parent has not reaped yet */
} cx_process_state;

/* "<boot id>/<pid namespace>" of this process: two processes whose identities match see each
 * other's pids. Never empty ("unknown" when /proc says nothing). */
void cx_process_machine(char *out, size_t len);

/* The kernel's start time of `pid` (clock ticks since boot), 0 when it cannot be read: with the
 * pid it names one process for good (a reused pid has another start time). */
unsigned long long cx_process_start_time(int pid);

/* What became of the process `pid` that started at `start_time` (0: any start time). A pid now
 * held by another process reads as ended. */
cx_process_state cx_process_probe(int pid, unsigned long long start_time);

#ifdef __cplusplus
}
#endif

#endif /* CFX_PROCESS_H */
