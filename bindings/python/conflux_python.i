/*
 * conflux_python.i - the Python part of the SWIG interface, included from ../conflux.i (SWIGPYTHON).
 *
 * It turns the C ABI into a small, safe low-level module (`conflux._capi`) that the hand-written
 * package (python/conflux) builds on; users never call it directly.
 * - A non-OK cfx_status becomes an exception of a per-status class created here (ConfluxError and
 *   its subclasses, ValueError/TypeError families for local argument errors) carrying the C message.
 * - Out-parameters (`... *out`) are hidden and returned.
 * - Tensors cross as plain tuples `(data_address, dtype, shape[, device[, stream]])`: the package takes
 *   the address from numpy (`__array_interface__`) or torch (`data_ptr()`), so the ABI sees the
 *   caller's memory (zero copy) and nothing here depends on numpy or torch headers.
 * - The module is built with `-threads`: the GIL is released around every C call; cfx_py_wait
 *   releases it itself so that it can wake up for signals (Ctrl-C) while it waits.
 * - Shared tensor memory (cfx_alloc) crosses as an int address plus an owner object whose
 *   destructor calls cfx_free (cfx_py_alloc), so Python's refcounting decides when a block goes.
 */

%{
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One exception class per status (index = status value), created at module init. */
static PyObject *cfx_py_exc[CFX_ERR_MEMBERSHIP_CHANGED + 1];
static PyObject *cfx_py_exc_base;

static PyObject *cfx_py_class_for(int status) {
    if (status > 0 && status <= CFX_ERR_MEMBERSHIP_CHANGED && cfx_py_exc[status] != NULL) return cfx_py_exc[status];
    return cfx_py_exc_base;
}

/* Raises the exception of `status` with `msg` (or the status string when msg is empty). */
static void cfx_py_raise(int status, const char *msg) {
    if (msg == NULL || msg[0] == '\0') msg = cfx_status_string((cfx_status)status);
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (text == NULL) return;
    PyErr_SetObject(cfx_py_class_for(status), text);
    Py_DECREF(text);
}

static int cfx_py_make_errors(PyObject *module_dict) {
    struct { int status; const char *name; const char *extra_base; const char *doc; } table[] = {
        {CFX_ERR_INVALID_ARGUMENT, "InvalidArgumentError", "ValueError",
         "A bad argument detected locally, at the call."},
        {CFX_ERR_NOT_INITIALIZED, "NotInitializedError", "ValueError+",
         "Conflux has not been initialized; call conflux.init() first."},
        {CFX_ERR_SHUT_DOWN, "ShutDownError", NULL,
         "Conflux was shut down (locally, or by another rank) before the collective ran."},
        {CFX_ERR_DUPLICATE_NAME, "DuplicateNameError", "ValueError",
         "A tensor of that name is already in flight on this rank."},
        {CFX_ERR_MISMATCH, "MismatchError", NULL,
         "Ranks disagreed on a tensor (dtype, shape, op, root, ...); raised on every rank."},
        {CFX_ERR_UNSUPPORTED, "UnsupportedError", "NotImplementedError+",
         "A valid request that this build or this collective does not support."},
        {CFX_ERR_OUT_OF_MEMORY, "OutOfMemoryError", "MemoryError+", "Conflux ran out of memory."},
        {CFX_ERR_TRANSPORT, "TransportError", NULL, "The transport (MPI) reported an error."},
        {CFX_ERR_TIMEOUT, "WaitTimeoutError", NULL,
         "The wait's deadline passed first; the collective is still pending."},
        {CFX_ERR_IN_PROGRESS, "InProgressError", NULL, "The collective has not completed yet."},
        {CFX_ERR_STALE_HANDLE, "StaleHandleError", "ValueError",
         "The handle was released or never existed."},
        {CFX_ERR_STALL, "StallError", NULL,
         "Some ranks never submitted the tensor before the stall deadline."},
        {CFX_ERR_PEER_LOST, "PeerLostError", NULL, "A peer rank exited or stopped answering."},
        {CFX_ERR_CONFIG, "ConfigError", "ValueError+", "A malformed CFX_* variable or option value."},
        {CFX_ERR_VERSION, "VersionError", NULL, "An options struct version this library does not know."},
        {CFX_ERR_JOINED, "JoinedError", NULL,
         "The collective cannot run while some ranks have joined."},
        {CFX_ERR_INTERNAL, "InternalError", NULL, "An internal error of Conflux (a bug)."},
        {CFX_ERR_CUDA, "CudaError", NULL, "A CUDA call failed."},
        {CFX_ERR_NCCL, "NcclError", NULL, "An NCCL call failed."},
        {CFX_ERR_MEMBERSHIP_CHANGED, "MembershipChangedError", NULL,
         "The elastic world was formed again (or could not be): see cfx_context_reform."},
    };
    PyObject *builtins = PyEval_GetBuiltins(); /* borrowed */
    PyObject *dict = Py_BuildValue("{s:i,s:s}", "status", 0, "__doc__",
                                   "Base of the errors decided across ranks (surfaced at synchronize/wait).");
    if (dict == NULL) return -1;
    cfx_py_exc_base = PyErr_NewException("conflux.ConfluxError", PyExc_RuntimeError, dict);
    Py_DECREF(dict);
    if (cfx_py_exc_base == NULL || PyDict_SetItemString(module_dict, "ConfluxError", cfx_py_exc_base) < 0)
        return -1;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        /* extra_base: NULL = ConfluxError only; "X" = X only (a local error); "X+" = ConfluxError and X. */
        PyObject *bases;
        if (table[i].extra_base == NULL) {
            bases = Py_BuildValue("(O)", cfx_py_exc_base);
        } else {
            char bname[64];
            size_t n = strlen(table[i].extra_base);
            int both = table[i].extra_base[n - 1] == '+';
            snprintf(bname, sizeof bname, "%.*s", (int)(both ? n - 1 : n), table[i].extra_base);
            PyObject *extra = PyDict_GetItemString(builtins, bname); /* borrowed */
            if (extra == NULL) return -1;
            bases = both ? Py_BuildValue("(OO)", cfx_py_exc_base, extra) : Py_BuildValue("(O)", extra);
        }
        if (bases == NULL) return -1;
        char qual[96];
        snprintf(qual, sizeof qual, "conflux.%s", table[i].name);
        dict = Py_BuildValue("{s:i,s:s}", "status", table[i].status, "__doc__", table[i].doc);
        PyObject *cls = dict ? PyErr_NewException(qual, bases, dict) : NULL;
        Py_XDECREF(dict);
        Py_DECREF(bases);
        if (cls == NULL || PyDict_SetItemString(module_dict, table[i].name, cls) < 0) return -1;
        cfx_py_exc[table[i].status] = cls; /* keeps the reference for the module's lifetime */
    }
    return 0;
}

/* ---- tensor descriptions from Python tuples ---- */

static int cfx_py_pointer(PyObject *o, void **out, const char *what) {
    if (o == Py_None) { *out = NULL; return 0; }
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int address or None", what);
        return -1;
    }
    *out = PyLong_AsVoidPtr(o);
    return PyErr_Occurred() ? -1 : 0;
}

/* (data, dtype, shape[, device[, stream]]) -> cfx_tensor; `shape` holds CFX_MAX_NDIM entries. */
static int cfx_py_tensor(PyObject *o, cfx_tensor *t, int64_t *shape) {
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) < 3 || PyTuple_GET_SIZE(o) > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "a tensor description is a tuple (data, dtype, shape[, device[, stream]])");
        return -1;
    }
    memset(t, 0, sizeof *t);
    t->device = CFX_DEVICE_CPU;
    if (cfx_py_pointer(PyTuple_GET_ITEM(o, 0), &t->data, "tensor data") < 0) return -1;
    long dtype = PyLong_AsLong(PyTuple_GET_ITEM(o, 1));
    if (dtype == -1 && PyErr_Occurred()) return -1;
    t->dtype = (int32_t)dtype;
    PyObject *seq = PySequence_Fast(PyTuple_GET_ITEM(o, 2), "tensor shape must be a sequence of ints");
    if (seq == NULL) return -1;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    if (nd > CFX_MAX_NDIM) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "tensor has %zd dimensions; Conflux supports at most %d", nd,
                     CFX_MAX_NDIM);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
        shape[i] = (int64_t)v;
    }
    Py_DECREF(seq);
    t->ndim = (int32_t)nd;
    t->shape = nd > 0 ? shape : NULL;
    if (PyTuple_GET_SIZE(o) > 3) {
        long dev = PyLong_AsLong(PyTuple_GET_ITEM(o, 3));
        if (dev == -1 && PyErr_Occurred()) return -1;
        t->device = (int32_t)dev;
    }
    if (PyTuple_GET_SIZE(o) > 4 && cfx_py_pointer(PyTuple_GET_ITEM(o, 4), &t->stream, "stream") < 0)
        return -1;
    return 0;
}

typedef struct cfx_py_tensors {
    size_t count;
    cfx_tensor *tensors;
    int64_t *shapes;
} cfx_py_tensors;

static int cfx_py_tensor_list(PyObject *o, cfx_py_tensors *out) {
    out->count = 0;
    out->tensors = NULL;
    out->shapes = NULL;
    PyObject *seq = PySequence_Fast(o, "expected a sequence of tensor descriptions");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    out->tensors = calloc(n > 0 ? (size_t)n : 1, sizeof(cfx_tensor));
    out->shapes = calloc(n > 0 ? (size_t)n * CFX_MAX_NDIM : 1, sizeof(int64_t));
    if (out->tensors == NULL || out->shapes == NULL) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cfx_py_tensor(PySequence_Fast_GET_ITEM(seq, i), &out->tensors[i],
                          out->shapes + i * CFX_MAX_NDIM) < 0) { Py_DECREF(seq); return -1; }
    }
    out->count = (size_t)n;
    Py_DECREF(seq);
    return 0;
}

static PyObject *cfx_py_tensor_tuple(const cfx_tensor *t) {
    PyObject *shape = PyTuple_New(t->ndim);
    if (shape == NULL) return NULL;
    for (int32_t i = 0; i < t->ndim; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong((long long)t->shape[i]));
    return Py_BuildValue("(NiNi)", PyLong_FromVoidPtr(t->data), (int)t->dtype, shape, (int)t->device);
}

/* Calls wait(arg, t) with the GIL released, in slices of at most 0.25 s so that signals (Ctrl-C)
 * are seen, until it returns anything but CFX_ERR_TIMEOUT or `timeout_s` (< 0: no limit) passed.
 * -1 when a signal handler raised (the Python error is set). */
static int cfx_py_wait_sliced(cfx_status (*wait)(void *, double), void *arg, double timeout_s,
                              cfx_status *st) {
    const double slice = 0.25;
    double left = timeout_s;
    for (;;) {
        double t = (timeout_s < 0 || left > slice) ? slice : left;
        Py_BEGIN_ALLOW_THREADS
        *st = wait(arg, t);
        Py_END_ALLOW_THREADS
        if (*st != CFX_ERR_TIMEOUT) return 0;
        if (timeout_s >= 0) {
            left -= t;
            if (left <= 0) return 0;
        }
        if (PyErr_CheckSignals() < 0) return -1;
    }
}

typedef struct cfx_py_handle_ref { cfx_context *ctx; uint64_t handle; } cfx_py_handle_ref;

static cfx_status cfx_py_wait_handle(void *arg, double t) {
    cfx_py_handle_ref *h = arg;
    return cfx_wait(h->ctx, (cfx_handle)h->handle, t);
}

/* Waits for `handle` (cfx_py_wait_sliced). Returns None, or raises the collective's error with its
 * message (the handle's message, not last_error). */
static PyObject *cfx_py_wait(cfx_context *ctx, uint64_t handle, double timeout_s) {
    cfx_py_handle_ref ref = {ctx, handle};
    cfx_status st;
    if (cfx_py_wait_sliced(cfx_py_wait_handle, &ref, timeout_s, &st) < 0) return NULL;
    if (st == CFX_OK) Py_RETURN_NONE;
    const char *msg = NULL;
    if (st != CFX_ERR_TIMEOUT && st != CFX_ERR_STALE_HANDLE && st != CFX_ERR_NOT_INITIALIZED)
        msg = cfx_handle_message(ctx, (cfx_handle)handle);
    if (msg == NULL || msg[0] == '\0') msg = cfx_last_error();
    cfx_py_raise(st, msg);
    return NULL;
}

/* The handle's status as an int (CFX_ERR_IN_PROGRESS while pending); never raises for it. */
static int cfx_py_handle_status(cfx_context *ctx, uint64_t handle) {
    return (int)cfx_handle_status(ctx, (cfx_handle)handle);
}

/* ---- shared tensor memory ---- */

#define CFX_PY_BLOCK "conflux.shared_block"

/* The destructor of a block's owner, run when the last reference to the owner goes, so once per
 * block. It runs from deallocation, where an exception may already be set (saved around it) and
 * raising is impossible (a failure is reported as unraisable). The owner records the allocating
 * process: a forked child inherits the mapping but not the pool, and its copies free nothing. */
static void cfx_py_block_free(PyObject *owner) {
    void *ptr = PyCapsule_GetPointer(owner, CFX_PY_BLOCK);
    if (ptr == NULL) {
        PyErr_Clear();
        return;
    }
    if ((pid_t)(intptr_t)PyCapsule_GetContext(owner) != getpid()) return;
    cfx_status st;
    Py_BEGIN_ALLOW_THREADS /* cfx_free gives large blocks' pages back to the kernel */
    st = cfx_free(ptr);
    Py_END_ALLOW_THREADS
    if (st != CFX_OK) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        char msg[512];
        snprintf(msg, sizeof msg, "releasing a collected array's shared tensor memory: %s",
                 cfx_last_error());
        cfx_py_raise((int)st, msg);
        PyErr_WriteUnraisable(NULL); /* not `owner`: a reference to it now would deallocate it twice */
        PyErr_Restore(type, value, tb);
    }
}

/* cfx_alloc -> (address, owner): the block lives as long as `owner` (a capsule) is referenced. The
 * allocation and its owner come from one call so that no exception can fall between them and leak
 * the block. */
static PyObject *cfx_py_alloc(size_t bytes) {
    void *ptr = NULL;
    cfx_status st;
    Py_BEGIN_ALLOW_THREADS
    st = cfx_alloc(bytes, &ptr);
    Py_END_ALLOW_THREADS
    if (st != CFX_OK) {
        cfx_py_raise((int)st, cfx_last_error());
        return NULL;
    }
    PyObject *owner = PyCapsule_New(ptr, CFX_PY_BLOCK, cfx_py_block_free);
    if (owner == NULL) {
        cfx_free(ptr);
        return NULL;
    }
    (void)PyCapsule_SetContext(owner, (void *)(intptr_t)getpid()); /* cannot fail on a capsule */
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr(ptr), owner);
}

/* Raises the exception class of `status` with `message` (lets Python code raise the same classes). */
static PyObject *cfx_py_raise_status(int status, const char *message) {
    cfx_py_raise(status, message);
    return NULL;
}

/* ---- gradient sets ---- */

static cfx_status cfx_py_wait_gradset(void *set, double t) { return cfx_gradset_wait(set, t); }

/* cfx_gradset_wait (cfx_py_wait_sliced); raises the step's error with its message. */
static PyObject *cfx_py_gradset_wait(cfx_gradset *set, double timeout_s) {
    cfx_status st;
    if (cfx_py_wait_sliced(cfx_py_wait_gradset, set, timeout_s, &st) < 0) return NULL;
    if (st == CFX_OK) Py_RETURN_NONE;
    cfx_py_raise((int)st, cfx_last_error());
    return NULL;
}
/* cfx_allreduce_async with a compression: the allreduce that collectives started through SWIG's
 * wrappers (process sets' contexts) call, with the arguments of cfx_allreduce_async and one more. */
static cfx_status cfx_py_allreduce_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                                         void *output, int op, double prescale, double postscale,
                                         int compression, cfx_handle *out) {
    return cfx_bind_allreduce_async(ctx, name, input, output, op, prescale, postscale, compression, out);
}

/* ---- the fast path of lone collectives ----
 * METH_FASTCALL functions added to the native module at init (SWIG's wrappers unpack a tuple and
 * convert every argument through its type table; these take the package's objects as they are):
 *   cfx_py_run(kind, name, desc, output, a, b, c, d, ctx, keep) -> None: submits, waits (the GIL
 *     released once for the submit and the first slice of the wait) and releases the handle; raises
 *     the collective's error. Interrupted by a signal, it hands (ctx, handle, keep) to the parking
 *     function set by cfx_py_fast_init before the exception propagates: the engine still borrows
 *     the memory that `keep` holds.
 *   cfx_py_submit(kind, name, desc, output, a, b, c, d, ctx) -> the handle id (an int).
 * ctx: an object whose attribute `ptr` is the SWIG cfx_context pointer. kind: CFX_PY_ALLREDUCE
 * (a = op, b = prescale, c = postscale, d = the compression, output = an address or None),
 * CFX_PY_BROADCAST (a = root rank) or CFX_PY_BARRIER (desc None). name: a str or None; desc: the
 * tuple of cfx_py_tensor. d is an int (a cfx_compression, checked by the engine), or any object
 * that the converter set by cfx_py_fast_init turns into one; an allreduce without compression
 * goes through cfx_allreduce_async as before, one with it through cfx_allreduce_async_opts.
 * The context comes after the request, so that a bad argument is reported before a missing init. */
enum { CFX_PY_ALLREDUCE = 0, CFX_PY_BROADCAST = 1, CFX_PY_BARRIER = 2 };
static PyObject *cfx_py_park;    /* park(ctx, handle, keep), set by cfx_py_fast_init */
static PyObject *cfx_py_compression_of; /* compression_of(obj) -> int, set by cfx_py_fast_init */
static PyObject *cfx_py_str_ptr; /* "ptr", interned */

static int cfx_py_context_of(PyObject *ctx, cfx_context **out) {
    PyObject *p = PyObject_GetAttr(ctx, cfx_py_str_ptr);
    if (p == NULL) return -1;
    void *vp = NULL;
    int res = p == Py_None ? SWIG_ERROR : SWIG_ConvertPtr(p, &vp, SWIGTYPE_p_cfx_context, 0);
    Py_DECREF(p);
    if (!SWIG_IsOK(res) || vp == NULL) {
        cfx_py_raise(CFX_ERR_NOT_INITIALIZED, "Conflux has not been initialized; use conflux.init().");
        return -1;
    }
    *out = vp;
    return 0;
}

/* The request of a lone collective, read from the fast functions' arguments (args[0..6]). */
typedef struct cfx_py_lone {
    int kind;
    const char *name;
    cfx_tensor t;
    int64_t shape[CFX_MAX_NDIM];
    void *output;
    long a;
    double b, c;
    int32_t compression;
} cfx_py_lone;

/* A compression argument as a cfx_compression value: an int as it is (the engine names a value
 * it does not know), anything else (a compressor class of conflux.torch, a bool) through the
 * package's converter, which raises for what it does not take. */
static int cfx_py_compression(PyObject *o, int32_t *out) {
    PyObject *conv = NULL;
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        if (cfx_py_compression_of == NULL) {
            PyErr_SetString(PyExc_TypeError, "compression must be an int (cfx_py_fast_init not called)");
            return -1;
        }
        conv = PyObject_CallOneArg(cfx_py_compression_of, o);
        if (conv == NULL) return -1;
        o = conv;
    }
    long v = PyLong_AsLong(o);
    Py_XDECREF(conv);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "compression %ld is not a cfx_compression", v);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int cfx_py_lone_args(PyObject *const *args, cfx_py_lone *r) {
    long kind = PyLong_AsLong(args[0]);
    if (kind == -1 && PyErr_Occurred()) return -1;
    r->kind = (int)kind;
    r->name = NULL;
    if (args[1] != Py_None) {
        r->name = PyUnicode_AsUTF8(args[1]);
        if (r->name == NULL) return -1;
    }
    if (r->kind == CFX_PY_BARRIER) return 0;
    if (cfx_py_tensor(args[2], &r->t, r->shape) < 0) return -1;
    if (cfx_py_pointer(args[3], &r->output, "output address") < 0) return -1;
    r->a = PyLong_AsLong(args[4]);
    if (r->a == -1 && PyErr_Occurred()) return -1;
    if (r->kind == CFX_PY_ALLREDUCE) {
        r->b = PyFloat_AsDouble(args[5]);
        if (r->b == -1.0 && PyErr_Occurred()) return -1;
        r->c = PyFloat_AsDouble(args[6]);
        if (r->c == -1.0 && PyErr_Occurred()) return -1;
        if (cfx_py_compression(args[7], &r->compression) < 0) return -1;
    } else if (r->kind == CFX_PY_BROADCAST) {
        if (r->a < INT_MIN || r->a > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "root_rank %ld is out of range", r->a);
            return -1;
        }
    } else {
        PyErr_Format(PyExc_ValueError, "unknown fast collective kind %d", r->kind);
        return -1;
    }
    return 0;
}

/* Without the GIL. */
static cfx_status cfx_py_lone_submit(cfx_context *ctx, const cfx_py_lone *r, cfx_handle *h) {
    switch (r->kind) {
    case CFX_PY_ALLREDUCE:
        return cfx_py_allreduce_async(ctx, r->name, &r->t, r->output, (int)r->a, r->b, r->c,
                                      r->compression, h);
    case CFX_PY_BROADCAST:
        return cfx_broadcast_async(ctx, r->name, &r->t, (int)r->a, h);
    default:
        return cfx_barrier_async(ctx, h);
    }
}

static int cfx_py_fast_nargs(Py_ssize_t n, Py_ssize_t want, const char *fn) {
    if (n == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", fn, want, n);
    return -1;
}

/* The collective's error of a completed handle, raised; the handle is released afterwards. */
static PyObject *cfx_py_fail_handle(cfx_context *ctx, cfx_handle h, cfx_status st) {
    const char *msg = NULL;
    if (st != CFX_ERR_STALE_HANDLE && st != CFX_ERR_NOT_INITIALIZED) msg = cfx_handle_message(ctx, h);
    if (msg == NULL || msg[0] == '\0') msg = cfx_last_error();
    cfx_py_raise(st, msg);
    if (st != CFX_ERR_STALE_HANDLE) (void)cfx_handle_release(ctx, h);
    return NULL;
}

static PyObject *cfx_py_run(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    cfx_context *ctx;
    cfx_py_lone r;
    if (cfx_py_fast_nargs(n, 10, "cfx_py_run") < 0 || cfx_py_lone_args(args, &r) < 0 ||
        cfx_py_context_of(args[8], &ctx) < 0)
        return NULL;
    cfx_handle h = 0;
    cfx_status sub, st = CFX_ERR_TIMEOUT;
    Py_BEGIN_ALLOW_THREADS
    sub = cfx_py_lone_submit(ctx, &r, &h);
    if (sub == CFX_OK) {
        st = cfx_wait(ctx, h, 0.25);
        if (st == CFX_OK) (void)cfx_handle_release(ctx, h);
    }
    Py_END_ALLOW_THREADS
    if (sub != CFX_OK) {
        cfx_py_raise((int)sub, cfx_last_error());
        return NULL;
    }
    if (st == CFX_ERR_TIMEOUT) {
        cfx_py_handle_ref ref = {ctx, h};
        if (PyErr_CheckSignals() < 0 || cfx_py_wait_sliced(cfx_py_wait_handle, &ref, -1.0, &st) < 0) {
            /* Still pending: park it with what it borrows, keeping the signal's exception. */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyObject *hid = PyLong_FromUnsignedLongLong((unsigned long long)h);
            PyObject *res = hid && cfx_py_park ? PyObject_CallFunctionObjArgs(cfx_py_park, args[8], hid,
                                                                              args[9], NULL) : NULL;
            if (res == NULL) PyErr_WriteUnraisable(cfx_py_park);
            Py_XDECREF(res);
            Py_XDECREF(hid);
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        if (st == CFX_OK) (void)cfx_handle_release(ctx, h);
    }
    if (st != CFX_OK) return cfx_py_fail_handle(ctx, h, st);
    Py_RETURN_NONE;
}

static PyObject *cfx_py_submit(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    cfx_context *ctx;
    cfx_py_lone r;
    if (cfx_py_fast_nargs(n, 9, "cfx_py_submit") < 0 || cfx_py_lone_args(args, &r) < 0 ||
        cfx_py_context_of(args[8], &ctx) < 0)
        return NULL;
    cfx_handle h = 0;
    cfx_status st;
    Py_BEGIN_ALLOW_THREADS
    st = cfx_py_lone_submit(ctx, &r, &h);
    Py_END_ALLOW_THREADS
    if (st != CFX_OK) {
        cfx_py_raise((int)st, cfx_last_error());
        return NULL;
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)h);
}

static PyObject *cfx_py_fast_init(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (cfx_py_fast_nargs(n, 2, "cfx_py_fast_init") < 0) return NULL;
    if (!PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "cfx_py_fast_init needs two callables");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(cfx_py_park, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(cfx_py_compression_of, args[1]);
    Py_RETURN_NONE;
}

/* The bench helpers' result: a list of n floats (times in us) taken from t, which is freed. */
static PyObject *cfx_py_times_list(double *t, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *v = PyFloat_FromDouble(t[i]);
        if (v == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, v);
    }
    free(t);
    return out;
}

static double cfx_py_elapsed_us(const struct timespec *a, const struct timespec *b) {
    return (double)(b->tv_sec - a->tv_sec) * 1e6 + (double)(b->tv_nsec - a->tv_nsec) * 1e-3;
}

/* cfx_py_bench_c_allreduce(ptr, n) -> a list of n times (us): the C loop of bench/lang (a blocking
 * 1-element float32 SUM allreduce named "ovh": submit, cfx_wait, release), run inside this process
 * with the GIL released, so that the Python calls are compared with C under the same load. */
static PyObject *cfx_py_bench_c_allreduce(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *vp = NULL;
    if (cfx_py_fast_nargs(n, 2, "cfx_py_bench_c_allreduce") < 0) return NULL;
    if (!SWIG_IsOK(SWIG_ConvertPtr(args[0], &vp, SWIGTYPE_p_cfx_context, 0)) || vp == NULL) {
        PyErr_SetString(PyExc_TypeError, "cfx_py_bench_c_allreduce: expected a cfx_context pointer");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "count must be >= 0");
        return NULL;
    }
    double *t = malloc(((size_t)count + 1) * sizeof *t);
    if (t == NULL) return PyErr_NoMemory();
    float x = 1.0f;
    int64_t shape[1] = {1};
    cfx_tensor tensor;
    memset(&tensor, 0, sizeof tensor);
    tensor.data = &x;
    tensor.dtype = CFX_FLOAT32;
    tensor.ndim = 1;
    tensor.shape = shape;
    tensor.device = CFX_DEVICE_CPU;
    cfx_status st = CFX_OK;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && st == CFX_OK; i++) {
        struct timespec a, b;
        cfx_handle h = 0;
        timespec_get(&a, TIME_UTC);
        st = cfx_allreduce_async(vp, "ovh", &tensor, NULL, CFX_OP_SUM, 1.0, 1.0, &h);
        if (st == CFX_OK) st = cfx_wait(vp, h, -1.0);
        if (h) (void)cfx_handle_release(vp, h);
        timespec_get(&b, TIME_UTC);
        t[i] = cfx_py_elapsed_us(&a, &b);
        x = 1.0f;
    }
    Py_END_ALLOW_THREADS
    if (st != CFX_OK) {
        free(t);
        cfx_py_raise((int)st, cfx_last_error());
        return NULL;
    }
    return cfx_py_times_list(t, count);
}

/* cfx_py_bench_c_gradset(set, ngrads, steps) -> a list of `steps` times (us): the C gradient-set
 * step of bench/run (every gradient of the committed set marked ready, last first, then wait), run
 * inside this process with the GIL released, so that an optimizer's step through its hooks is
 * compared with C on the same set under the same load. */
static PyObject *cfx_py_bench_c_gradset(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *vp = NULL;
    if (cfx_py_fast_nargs(n, 3, "cfx_py_bench_c_gradset") < 0) return NULL;
    if (!SWIG_IsOK(SWIG_ConvertPtr(args[0], &vp, SWIGTYPE_p_cfx_gradset, 0)) || vp == NULL) {
        PyErr_SetString(PyExc_TypeError, "cfx_py_bench_c_gradset: expected a cfx_gradset pointer");
        return NULL;
    }
    Py_ssize_t grads = PyLong_AsSsize_t(args[1]), steps = PyLong_AsSsize_t(args[2]);
    if (grads < 0 || steps < 0 || grads > INT32_MAX) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "counts must be >= 0");
        return NULL;
    }
    double *t = malloc(((size_t)steps + 1) * sizeof *t);
    if (t == NULL) return PyErr_NoMemory();
    cfx_status st = CFX_OK;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < steps && st == CFX_OK; i++) {
        struct timespec a, b;
        timespec_get(&a, TIME_UTC);
        for (int32_t g = (int32_t)grads - 1; g >= 0 && st == CFX_OK; g--)
            st = cfx_gradset_ready(vp, g);
        if (st == CFX_OK) st = cfx_gradset_wait(vp, -1.0);
        timespec_get(&b, TIME_UTC);
        t[i] = cfx_py_elapsed_us(&a, &b);
    }
    Py_END_ALLOW_THREADS
    if (st != CFX_OK) {
        free(t);
        cfx_py_raise((int)st, cfx_last_error());
        return NULL;
    }
    return cfx_py_times_list(t, steps);
}

/* cfx_py_data_address(obj) -> the address of obj's memory through the buffer protocol (a C-contiguous
 * numpy array: what __array_interface__["data"][0] says, without building that dict). */
static PyObject *cfx_py_data_address(PyObject *self, PyObject *obj) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    void *buf = view.buf;
    PyBuffer_Release(&view);
    return PyLong_FromVoidPtr(buf);
}

static PyMethodDef cfx_py_fast_methods[] = {
    {"cfx_py_data_address", cfx_py_data_address, METH_O,
     "cfx_py_data_address(obj) -> the address of a contiguous buffer's memory."},
    {"cfx_py_bench_c_allreduce", (PyCFunction)(void (*)(void))cfx_py_bench_c_allreduce, METH_FASTCALL,
     "cfx_py_bench_c_allreduce(ptr, n) -> n times (us) of a blocking 1-element allreduce from C."},
    {"cfx_py_bench_c_gradset", (PyCFunction)(void (*)(void))cfx_py_bench_c_gradset, METH_FASTCALL,
     "cfx_py_bench_c_gradset(set, ngrads, steps) -> step times (us) of a gradient-set step from C."},
    {"cfx_py_run", (PyCFunction)(void (*)(void))cfx_py_run, METH_FASTCALL,
     "cfx_py_run(kind, name, desc, output, a, b, c, d, ctx, keep): a lone collective, submitted and waited for."},
    {"cfx_py_submit", (PyCFunction)(void (*)(void))cfx_py_submit, METH_FASTCALL,
     "cfx_py_submit(kind, name, desc, output, a, b, c, d, ctx) -> handle id."},
    {"cfx_py_fast_init", (PyCFunction)(void (*)(void))cfx_py_fast_init, METH_FASTCALL,
     "cfx_py_fast_init(park, compression_of): park(ctx, handle, keep) takes a blocking call's handle "
     "left pending; compression_of(obj) -> the cfx_compression of a compression argument that is no int."},
    {NULL, NULL, 0, NULL},
};

static int cfx_py_add_fast(PyObject *module) {
    cfx_py_str_ptr = PyUnicode_InternFromString("ptr");
    if (cfx_py_str_ptr == NULL || PyModule_AddFunctions(module, cfx_py_fast_methods) < 0) return -1;
    if (PyModule_AddIntConstant(module, "CFX_PY_ALLREDUCE", CFX_PY_ALLREDUCE) < 0 ||
        PyModule_AddIntConstant(module, "CFX_PY_BROADCAST", CFX_PY_BROADCAST) < 0 ||
        PyModule_AddIntConstant(module, "CFX_PY_BARRIER", CFX_PY_BARRIER) < 0)
        return -1;
    return 0;
}
%}

%init %{
    if (cfx_py_make_errors(d) < 0 || cfx_py_add_fast(m) < 0) {
        return NULL;
    }
%}

/* ---- status -> exception ---- */
%typemap(out) cfx_status {
    if ($1 != CFX_OK) {
        cfx_py_raise((int)$1, cfx_last_error());
        SWIG_fail;
    }
    $result = SWIG_Py_Void();
}

/* ---- hidden out-parameters ---- */
%typemap(in, numinputs=0) cfx_context **out (cfx_context *tmp = NULL) { $1 = &tmp; }
%typemap(argout) cfx_context **out {
    $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(SWIG_as_voidptr(tmp$argnum),
                                                                   $descriptor(cfx_context *), 0));
}
%typemap(in, numinputs=0) cfx_handle *out (cfx_handle tmp = 0) { $1 = &tmp; }
%typemap(argout) cfx_handle *out {
    $result = SWIG_Python_AppendOutput($result, PyLong_FromUnsignedLongLong((unsigned long long)tmp$argnum));
}
%typemap(in, numinputs=0) cfx_gradset **out (cfx_gradset *tmp = NULL) { $1 = &tmp; }
%typemap(argout) cfx_gradset **out {
    $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(SWIG_as_voidptr(tmp$argnum),
                                                                   $descriptor(cfx_gradset *), 0));
}
%typemap(in, numinputs=0) int32_t *out (int32_t tmp = 0) { $1 = &tmp; }
%typemap(argout) int32_t *out { $result = SWIG_Python_AppendOutput($result, PyLong_FromLong(tmp$argnum)); }
%typemap(in, numinputs=0) int *out (int tmp = 0) { $1 = &tmp; }
%typemap(argout) int *out { $result = SWIG_Python_AppendOutput($result, PyLong_FromLong(tmp$argnum)); }
%typemap(in, numinputs=0) size_t *out (size_t tmp = 0) { $1 = &tmp; }
%typemap(argout) size_t *out { $result = SWIG_Python_AppendOutput($result, PyLong_FromSize_t(tmp$argnum)); }
/* cfx_alloc: the address as an int (the package uses cfx_py_alloc, which also frees it). */
%typemap(in, numinputs=0) void **out (void *tmp = NULL) { $1 = &tmp; }
%typemap(argout) void **out { $result = SWIG_Python_AppendOutput($result, PyLong_FromVoidPtr(tmp$argnum)); }
%typemap(in, numinputs=0) cfx_tensor *out (cfx_tensor tmp) { memset(&tmp, 0, sizeof tmp); $1 = &tmp; }
%typemap(argout) cfx_tensor *out {
    PyObject *desc = cfx_py_tensor_tuple(&tmp$argnum);
    if (desc == NULL) SWIG_fail;
    $result = SWIG_Python_AppendOutput($result, desc);
}
/* cfx_handle_splits: `size` entries, size taken from the context (argument 1). */
%typemap(in, numinputs=0) const int64_t **out (const int64_t *tmp = NULL) { $1 = ($1_ltype)&tmp; }
%typemap(argout) const int64_t **out {
    int n = cfx_size(arg1);
    PyObject *lst = PyList_New(n > 0 ? n : 0);
    if (lst == NULL) SWIG_fail;
    for (int i = 0; i < n; i++) PyList_SET_ITEM(lst, i, PyLong_FromLongLong((long long)tmp$argnum[i]));
    $result = SWIG_Python_AppendOutput($result, lst);
}

/* ---- inputs ---- */
%typemap(in) const cfx_tensor *input (cfx_tensor tmp, int64_t shape[CFX_MAX_NDIM]),
             const cfx_tensor *tensor (cfx_tensor tmp, int64_t shape[CFX_MAX_NDIM]),
             const cfx_tensor *grad (cfx_tensor tmp, int64_t shape[CFX_MAX_NDIM]) {
    if (cfx_py_tensor($input, &tmp, shape) < 0) SWIG_fail;
    $1 = &tmp;
}
%typemap(in) (size_t count, const cfx_tensor *inputs) (cfx_py_tensors tmp = {0, NULL, NULL}) {
    if (cfx_py_tensor_list($input, &tmp) < 0) SWIG_fail;
    $1 = tmp.count;
    $2 = tmp.tensors;
}
%typemap(freearg) (size_t count, const cfx_tensor *inputs) {
    free(tmp$argnum.tensors);
    free(tmp$argnum.shapes);
}
%typemap(in) void *output, void *dst {
    if (cfx_py_pointer($input, &$1, "output address") < 0) SWIG_fail;
}
/* cfx_free: an int address (None: NULL, a no-op). */
%typemap(in) void *ptr {
    if (cfx_py_pointer($input, &$1, "address") < 0) SWIG_fail;
}
/* cfx_is_shared: an int address. */
%typemap(in) const void *ptr (void *tmp = NULL) {
    if (cfx_py_pointer($input, &tmp, "address") < 0) SWIG_fail;
    $1 = tmp;
}
/* outputs: None (all in place) or a sequence of addresses/None. */
%typemap(in) void *const *outputs (void **tmp = NULL) {
    if ($input != Py_None) {
        PyObject *seq = PySequence_Fast($input, "outputs must be None or a sequence of addresses");
        if (seq == NULL) SWIG_fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        tmp = calloc(n > 0 ? (size_t)n : 1, sizeof(void *));
        if (tmp == NULL) { Py_DECREF(seq); PyErr_NoMemory(); SWIG_fail; }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (cfx_py_pointer(PySequence_Fast_GET_ITEM(seq, i), &tmp[i], "output") < 0) {
                Py_DECREF(seq);
                SWIG_fail;
            }
        }
        Py_DECREF(seq);
    }
    $1 = tmp;
}
%typemap(freearg) void *const *outputs { free(tmp$argnum); }
/* splits: None (equal split) or a sequence of row counts. */
%typemap(in) (const int64_t *splits, size_t nsplits) (int64_t *tmp = NULL) {
    $1 = NULL;
    $2 = 0;
    if ($input != Py_None) {
        PyObject *seq = PySequence_Fast($input, "splits must be None or a sequence of ints");
        if (seq == NULL) SWIG_fail;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        tmp = calloc(n > 0 ? (size_t)n : 1, sizeof(int64_t));
        if (tmp == NULL) { Py_DECREF(seq); PyErr_NoMemory(); SWIG_fail; }
        for (Py_ssize_t i = 0; i < n; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == -1 && PyErr_Occurred()) { Py_DECREF(seq); SWIG_fail; }
            tmp[i] = (int64_t)v;
        }
        Py_DECREF(seq);
        $1 = tmp;
        $2 = (size_t)n;
    }
}
%typemap(freearg) (const int64_t *splits, size_t nsplits) { free(tmp$argnum); }
/* cfx_context_create_subset: a sequence of ranks (ints). An empty sequence passes a non-NULL
 * pointer with n = 0, so the ABI's own check ("empty") names what is wrong. The new context comes
 * back through the cfx_context **out typemap: None on ranks that are not listed. */
%typemap(in) (const int *ranks, size_t n) (int *tmp = NULL) {
    PyObject *seq = PySequence_Fast($input, "ranks must be a sequence of ints");
    if (seq == NULL) SWIG_fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    tmp = calloc(n > 0 ? (size_t)n : 1, sizeof(int));
    if (tmp == NULL) { Py_DECREF(seq); PyErr_NoMemory(); SWIG_fail; }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(seq); SWIG_fail; }
        if (v < INT_MIN || v > INT_MAX) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "rank %ld is out of range", v);
            SWIG_fail;
        }
        tmp[i] = (int)v;
    }
    Py_DECREF(seq);
    $1 = tmp;
    $2 = (size_t)n;
}
%typemap(freearg) (const int *ranks, size_t n) { free(tmp$argnum); }

/* Replaced by the helpers below (their status is the collective's, not a call error). */
%ignore cfx_wait;
%ignore cfx_handle_status;
%ignore cfx_gradset_wait;

/* The header is included here (SWIG includes a file once) so that the helpers below see its types;
 * the common part's own %include of it is then a no-op. */
%include "conflux/conflux.h"

%nothread cfx_py_wait;
%nothread cfx_py_raise_status;
%nothread cfx_py_alloc;
%nothread cfx_py_gradset_wait;
PyObject *cfx_py_wait(cfx_context *ctx, uint64_t handle, double timeout_s);
PyObject *cfx_py_alloc(size_t bytes);
PyObject *cfx_py_gradset_wait(cfx_gradset *set, double timeout_s);
int cfx_py_handle_status(cfx_context *ctx, uint64_t handle);
cfx_status cfx_py_allreduce_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                                  void *output, int op, double prescale, double postscale,
                                  int compression, cfx_handle *out);
PyObject *cfx_py_raise_status(int status, const char *message);
