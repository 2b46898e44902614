/*
 * submit (api) - the checks and the submission every ABI entry point that queues work shares
 * (collective_calls.c, context_calls.c's subset creation): a message names the call (`fn`), the
 * tensor (`what`) and the bad value, and a failed call leaves nothing behind. Called on the
 * caller's thread; the context's queue and handle table take their own locks.
 */
#ifndef CFX_API_SUBMIT_H
#define CFX_API_SUBMIT_H

#include <stddef.h>

#include "conflux/conflux.h"
#include "engine/context.h"
#include "protocol/queue.h"

/* The longest tensor name the ABI accepts (bytes, without the terminator). */
#define CX_API_NAME_MAX 4096

/* CFX_ERR_NOT_INITIALIZED for a NULL context, CFX_ERR_INVALID_ARGUMENT for a NULL `out`,
 * CFX_ERR_SHUT_DOWN once the context has been shut down. */
cfx_status cx_api_check_context(const char *fn, cfx_context *ctx, const void *out);

/* A caller's tensor name: NULL (a generated one) or 1..CX_API_NAME_MAX characters. */
cfx_status cx_api_check_name(const char *fn, const char *name);

/* Checks a tensor description (dtype, shape, data, device); *bytes gets its size. `what` names it
 * in messages. The first device tensor binds the context's CUDA device (one device per rank). */
cfx_status cx_api_check_tensor(cfx_context *ctx, const char *fn, const char *what,
                               const cfx_tensor *t, size_t *bytes);

/* A name for the tensor, malloc'd: the caller's, or "<prefix>.noname.<n>" counted per collective
 * kind `coll` and context. NULL when out of memory. */
char *cx_api_make_name(cfx_context *ctx, int coll, const char *prefix, const char *name);

/* A queue entry of collective kind `coll` for tensor `t` (NULL for barrier and join), taking
 * ownership of `name` (freed on failure). `output` NULL means in place. NULL when out of memory. */
cx_entry *cx_api_new_entry(int coll, char *name, const cfx_tensor *t, size_t bytes, void *output);

/* Frees the first `n` entries (cx_entry_free). */
void cx_api_free_entries(cx_entry **entries, size_t n);

/* Records device tensors' ready events, creates the handle for `n` entries with `noutputs`
 * outputs, pushes the entries and returns the handle in *out. On failure frees every entry. */
cfx_status cx_api_submit(cfx_context *ctx, cx_entry **entries, size_t n, size_t noutputs,
                         cfx_handle *out);

#endif /* CFX_API_SUBMIT_H */
