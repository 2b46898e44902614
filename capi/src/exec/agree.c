/* agree - the failure agreement of the collective engine (agree.h), and its
 * injection for tests (CFX_TEST_FAIL, base/test_hooks.h). */
#include "exec/agree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* CFX_TEST_FAIL (tests only; parsed with the configuration, base/test_hooks.h): this rank fails
 * the batches the hook names, at the agreement it names. */
static bool injected(const cx_exec *x, cx_agree_phase phase, const char *name)
{
    const struct cx_fail_test *f = &x->cfg->test.fail;
    int r = x->transport->rank;
    return f->prefix[0] && f->phase == (int)phase && r < 64 && ((f->ranks >> r) & 1) && name &&
           strncmp(name, f->prefix, strlen(f->prefix)) == 0;
}

/* What the lowest failing rank tells the others (fixed size: no allocation on any rank). */
typedef struct agree_reason {
    int32_t status;
    char message[1020];
} agree_reason;

/* " (ranks 1, 2 and 5 failed; rank 1's reason)" when more than one rank failed, else "". */
static void list_failed(const uint64_t *ok, int size, int nfailed, char *out, size_t len)
{
    out[0] = '\0';
    if (nfailed < 2)
        return;
    size_t used = (size_t)snprintf(out, len, " (ranks");
    int listed = 0, first = -1;
    for (int r = 0; r < size && used < len; r++) {
        if ((ok[r / 64] >> (r % 64)) & 1)
            continue;
        if (first < 0)
            first = r;
        if (listed == 8) {
            used += (size_t)snprintf(out + used, len - used, " and %d more", nfailed - listed);
            break;
        }
        used += (size_t)snprintf(out + used, len - used, "%s %d", !listed ? "" :
                                 listed == nfailed - 1 ? " and" : ",", r);
        listed++;
    }
    if (used < len)
        snprintf(out + used, len - used, " failed; rank %d's reason)", first);
}

cfx_status cx_exec_agree(cx_exec *x, cfx_status local, cx_agree_phase phase, const char *name,
                         uint32_t *flags)
{
    cx_transport *t = x->transport;
    if (!local && injected(x, phase, name))
        local = cx_fail(CFX_ERR_OUT_OF_MEMORY, "injected failure on rank %d (CFX_TEST_FAIL: "
                        "prefix '%s', %s agreement)", t->rank, x->cfg->test.fail.prefix,
                        phase == CX_AGREE_DONE ? "done" : "ready");
    if (t->size == 1)
        return local; /* its message is still this thread's */
    agree_reason why;
    memset(&why, 0, sizeof why);
    if (local) {
        why.status = (int32_t)local;
        snprintf(why.message, sizeof why.message, "%s", cx_error_message());
    }
    int size = t->size;
    size_t nw = ((size_t)size + 63) / 64 + 1; /* a bit per rank, then the flags (inverted: OR) */
    uint64_t words[nw];
    for (size_t i = 0; i < nw; i++)
        words[i] = ~0ull;
    if (local)
        words[t->rank / 64] &= ~(1ull << (t->rank % 64));
    words[nw - 1] = ~(uint64_t)(flags ? *flags : 0);
    cfx_status st = t->ops->allreduce_and(t, words, nw);
    if (st)
        return st;
    if (flags)
        *flags = (uint32_t)~words[nw - 1];
    int first = -1, nfailed = 0;
    for (int r = 0; r < size; r++)
        if (!((words[r / 64] >> (r % 64)) & 1)) {
            first = first < 0 ? r : first;
            nfailed++;
        }
    if (first < 0)
        return CFX_OK;
    if ((st = t->ops->broadcast(t, &why, sizeof why, first)))
        return st;
    why.message[sizeof why.message - 1] = '\0';
    cfx_status agreed = why.status > 0 && why.status <= CFX_ERR_NCCL ? (cfx_status)why.status
                                                                     : CFX_ERR_INTERNAL;
    char others[160];
    list_failed(words, size, nfailed, others, sizeof others);
    return cx_fail(agreed, "rank %d %s%s: %s", first, phase == CX_AGREE_READY ?
                   "could not take part" : "failed after the collective", others, why.message);
}
