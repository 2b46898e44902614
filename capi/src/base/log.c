/* log - leveled log lines to stderr or CFX_LOG_FILE (see log.h). */
#include "base/log.h"

#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static const char *const level_names[] = {"trace", "debug", "info", "warning", "error", "off"};

int cx_log_level_parse(const char *text)
{
    for (int i = 0; i <= CX_LOG_OFF; i++)
        if (strcasecmp(text, level_names[i]) == 0)
            return i;
    if (strcasecmp(text, "warn") == 0)
        return CX_LOG_WARNING;
    if (text[0] >= '0' && text[0] <= '5' && text[1] == '\0')
        return text[0] - '0';
    return -1;
}

void cx_log(const cx_logger *lg, int level, const char *module, const char *fmt, ...)
{
    if (!CX_LOG_ENABLED(lg, level))
        return;
    char line[4096];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "[%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ conflux rank %d %s %s] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000, lg->rank, module, level_names[level < 0 ? 0 : level]);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t w = write(lg->fd, line, len);
    (void)w;
}
