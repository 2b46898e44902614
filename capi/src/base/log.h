/*
 * log - leveled log lines "time rank module level: message" to stderr or CFX_LOG_FILE.
 *
 * A logger belongs to a context (no global state); modules log through the context's logger.
 * Safe from any thread: each line is formatted whole and written with one write call.
 */
#ifndef CFX_LOG_H
#define CFX_LOG_H

#include <stdio.h>

typedef enum cx_log_level {
    CX_LOG_TRACE = 0,
    CX_LOG_DEBUG = 1,
    CX_LOG_INFO = 2,
    CX_LOG_WARNING = 3,
    CX_LOG_ERROR = 4,
    CX_LOG_OFF = 5
} cx_log_level;

typedef struct cx_logger {
    int level;  /* lines below this level are dropped */
    int rank;   /* -1 until known */
    int fd;     /* 2 (stderr) or an opened CFX_LOG_FILE */
    int owns_fd;
} cx_logger;

void cx_log(const cx_logger *lg, int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* "trace" ... "off"; -1 for an unknown name. Accepts the numbers 0..5 too. */
int cx_log_level_parse(const char *text);

#define CX_LOG_ENABLED(lg, lvl) ((lg) != NULL && (lvl) >= (lg)->level)

#endif /* CFX_LOG_H */
