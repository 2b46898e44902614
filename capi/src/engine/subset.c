/* subset - the agreement on a subset context's members (see subset.h). */
#include "engine/subset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

void cx_subset_encode(const int *ranks, size_t n, int size, int32_t *row)
{
    memset(row, 0, cx_subset_row(size) * sizeof *row);
    row[0] = !ranks ? -1 : n > (size_t)size ? -2 : (int32_t)n;
    for (size_t i = 0; row[0] > 0 && i < n; i++)
        row[1 + i] = ranks[i];
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* One rank's list as gathered: n, then up to size ranks (n < 0: NULL or too long). Writes the
 * sorted members to sorted[] and returns 0, or names the first problem in why. */
static int read_subset(const int32_t *row, int size, int from, int *sorted, size_t *n, char *why,
                       size_t why_len)
{
    if (row[0] < 1) {
        snprintf(why, why_len, "rank %d passed %s", from,
                 row[0] == 0 ? "an empty list" : row[0] == -1 ? "no list (NULL)"
                                                : "more ranks than the context has");
        return -1;
    }
    *n = (size_t)row[0];
    for (size_t i = 0; i < *n; i++) {
        sorted[i] = row[1 + i];
        if (sorted[i] < 0 || sorted[i] >= size) {
            snprintf(why, why_len, "rank %d listed rank %d, outside the context's %d ranks", from,
                     sorted[i], size);
            return -1;
        }
    }
    qsort(sorted, *n, sizeof *sorted, cmp_int);
    for (size_t i = 1; i < *n; i++)
        if (sorted[i] == sorted[i - 1]) {
            snprintf(why, why_len, "rank %d listed rank %d twice", from, sorted[i]);
            return -1;
        }
    return 0;
}

static void format_ranks(const int *r, size_t n, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (size_t i = 0; i < n && used + 16 < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%d", i ? ", " : "", r[i]);
    snprintf(buf + used, len - used, "%s]", used + 16 >= len ? ", ..." : "");
}

cfx_status cx_subset_decide(const char *fn, const int32_t *all, int size, int *sorted, size_t *n)
{
    size_t row = cx_subset_row(size), n0 = 0, nr = 0;
    char why[256] = "";
    for (int r = 0; r < size; r++) {
        int *list = r ? sorted + row : sorted;
        if (read_subset(all + (size_t)r * row, size, r, list, r ? &nr : &n0, why, sizeof why))
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s", fn, why);
        if (r && (nr != n0 || memcmp(list, sorted, n0 * sizeof *list) != 0)) {
            char a[96], b[96];
            format_ranks(sorted, n0, a, sizeof a);
            format_ranks(list, nr, b, sizeof b);
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: the ranks disagree on the subset: rank "
                           "0 passed %s, rank %d passed %s", fn, a, r, b);
        }
    }
    *n = n0;
    return CFX_OK;
}
