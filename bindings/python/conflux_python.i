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
#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One exception class per status (index = status value), created at module init from the C
 * library's own list (cfx_status_name), so a status added there gets its class here. */
static PyObject *cfx_py_exc[CFX_STATUS_COUNT];
static PyObject *cfx_py_exc_base;

static PyObject *cfx_py_class_for(int status) {
    if (status > 0 && status < CFX_STATUS_COUNT && cfx_py_exc[status] != NULL) return cfx_py_exc[status];
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

/* What Python adds to a status's class, by its cfx_status_name: a builtin base where Python code
 * expects one (a bad local argument is a ValueError; "X" = X only, a local error; "X+" =
 * ConfluxError and X), and one renamed class (TIMEOUT: Python's builtin TimeoutError would be
 * shadowed). A status not listed is a ConfluxError named after it (PEER_LOST: PeerLostError). */
static const struct { const char *status; const char *class_name; const char *extra_base; }
    cfx_py_error_extras[] = {
        {"INVALID_ARGUMENT", NULL, "ValueError"},
        {"NOT_INITIALIZED", NULL, "ValueError+"},
        {"DUPLICATE_NAME", NULL, "ValueError"},
        {"UNSUPPORTED", NULL, "NotImplementedError+"},
        {"OUT_OF_MEMORY", NULL, "MemoryError+"},
        {"TIMEOUT", "WaitTimeoutError", NULL},
        {"STALE_HANDLE", NULL, "ValueError"},
        {"CONFIG", NULL, "ValueError+"},
};

/* "PEER_LOST" -> "PeerLostError" in `out`. */
static void cfx_py_class_name(const char *status_name, char *out, size_t size) {
    size_t n = 0;
    int upper = 1;
    for (const char *c = status_name; *c != '\0' && n + 6 < size; c++) {
        if (*c == '_') { upper = 1; continue; }
        out[n++] = upper ? *c : (char)tolower((unsigned char)*c);
        upper = 0;
    }
    snprintf(out + n, size - n, "Error");
}

/* The bases of a status's class: ConfluxError, and/or the builtin `extra` ("X" or "X+"). */
static PyObject *cfx_py_error_bases(const char *extra) {
    if (extra == NULL) return Py_BuildValue("(O)", cfx_py_exc_base);
    char bname[64];
    size_t n = strlen(extra);
    int both = extra[n - 1] == '+';
    snprintf(bname, sizeof bname, "%.*s", (int)(both ? n - 1 : n), extra);
    PyObject *builtin = PyDict_GetItemString(PyEval_GetBuiltins(), bname); /* borrowed */
    if (builtin == NULL) return PyErr_Format(PyExc_RuntimeError, "no builtin %s", bname);
    return both ? Py_BuildValue("(OO)", cfx_py_exc_base, builtin) : Py_BuildValue("(O)", builtin);
}

/* Creates ConfluxError and one class per status (1 .. CFX_STATUS_COUNT - 1) in `module_dict`, and
 * ERROR_CLASSES there: the status classes in status order, for the package to export. */
static int cfx_py_make_errors(PyObject *module_dict) {
    PyObject *dict = Py_BuildValue("{s:i,s:s}", "status", 0, "__doc__",
                                   "Base of the errors decided across ranks (surfaced at synchronize/wait).");
    if (dict == NULL) return -1;
    cfx_py_exc_base = PyErr_NewException("conflux.ConfluxError", PyExc_RuntimeError, dict);
    Py_DECREF(dict);
    if (cfx_py_exc_base == NULL || PyDict_SetItemString(module_dict, "ConfluxError", cfx_py_exc_base) < 0)
        return -1;
    PyObject *classes = PyList_New(0);
    if (classes == NULL) return -1;
    for (int status = 1; status < CFX_STATUS_COUNT; status++) {
        const char *status_name = cfx_status_name((cfx_status)status);
        const char *class_name = NULL, *extra = NULL;
        char derived[64], qual[96], doc[256];
        for (size_t i = 0; i < sizeof cfx_py_error_extras / sizeof cfx_py_error_extras[0]; i++) {
            if (strcmp(cfx_py_error_extras[i].status, status_name) == 0) {
                class_name = cfx_py_error_extras[i].class_name;
                extra = cfx_py_error_extras[i].extra_base;
            }
        }
        cfx_py_class_name(status_name, derived, sizeof derived);
        if (class_name == NULL) class_name = derived;
        snprintf(qual, sizeof qual, "conflux.%s", class_name);
        snprintf(doc, sizeof doc, "Status %s (%d): %s.", status_name, status,
                 cfx_status_string((cfx_status)status));
        PyObject *bases = cfx_py_error_bases(extra);
        dict = bases ? Py_BuildValue("{s:i,s:s}", "status", status, "__doc__", doc) : NULL;
        PyObject *cls = dict ? PyErr_NewException(qual, bases, dict) : NULL;
        Py_XDECREF(dict);
        Py_XDECREF(bases);
        if (cls == NULL || PyDict_SetItemString(module_dict, class_name, cls) < 0 ||
            PyList_Append(classes, cls) < 0) {
            Py_DECREF(classes);
            return -1;
        }
        cfx_py_exc[status] = cls; /* keeps the reference for the module's lifetime */
    }
    PyObject *tuple = PyList_AsTuple(classes);
    Py_DECREF(classes);
    if (tuple == NULL || PyDict_SetItemString(module_dict, "ERROR_CLASSES", tuple) < 0) {
        Py_XDECREF(tuple);
        return -1;
    }
    Py_DECREF(tuple);
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

/* Between two slices of a wait (cfx_bind_wait_sliced, run without the GIL): takes the GIL back
 * to run the signal handlers (Ctrl-C), then lets it go again. Nonzero when a handler raised. */
static int cfx_py_check_signals(void *saved_thread) {
    PyThreadState **save = saved_thread;
    PyEval_RestoreThread(*save);
    int raised = PyErr_CheckSignals() < 0;
    *save = PyEval_SaveThread();
    return raised;
}

/* Calls wait(arg, t) with the GIL released, in slices of at most 0.25 s so that signals (Ctrl-C)
 * are seen, until it returns anything but CFX_ERR_TIMEOUT or `timeout_s` (< 0: no limit) passed.
 * -1 when a signal handler raised (the Python error is set). */
static int cfx_py_wait_sliced(cfx_status (*wait)(void *, double), void *arg, double timeout_s,
                              cfx_status *st) {
    int interrupted = 0;
    PyThreadState *save = PyEval_SaveThread();
    *st = cfx_bind_wait_sliced(wait, arg, timeout_s, 0.25, cfx_py_check_signals, &save, &interrupted);
    PyEval_RestoreThread(save);
    return interrupted ? -1 : 0;
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
/* cfx_allreduce_async with a compression (cfx_bind_allreduce_async): the allreduce that
 * collectives started through SWIG's wrappers (process sets' contexts) call, with the arguments of
 * cfx_allreduce_async and one more. */
#define cfx_py_allreduce_async cfx_bind_allreduce_async

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
enum { CFX_PY_ALLREDUCE = CFX_BIND_ALLREDUCE, CFX_PY_BROADCAST = CFX_BIND_BROADCAST,
       CFX_PY_BARRIER = CFX_BIND_BARRIER };
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
    cfx_bind_request r;
    cfx_tensor t;
    int64_t shape[CFX_MAX_NDIM];
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

static int cfx_py_lone_args(PyObject *const *args, cfx_py_lone *lone) {
    cfx_bind_request *r = &lone->r;
    memset(r, 0, sizeof *r);
    long kind = PyLong_AsLong(args[0]);
    if (kind == -1 && PyErr_Occurred()) return -1;
    r->kind = (int)kind;
    if (args[1] != Py_None) {
        r->name = PyUnicode_AsUTF8(args[1]);
        if (r->name == NULL) return -1;
    }
    if (r->kind == CFX_PY_BARRIER) return 0;
    if (cfx_py_tensor(args[2], &lone->t, lone->shape) < 0) return -1;
    r->input = &lone->t;
    if (cfx_py_pointer(args[3], &r->output, "output address") < 0) return -1;
    long a = PyLong_AsLong(args[4]);
    if (a == -1 && PyErr_Occurred()) return -1;
    if (a < INT_MIN || a > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "%s %ld is out of range",
                     r->kind == CFX_PY_BROADCAST ? "root_rank" : "op", a);
        return -1;
    }
    r->arg = (int)a;
    if (r->kind == CFX_PY_ALLREDUCE) {
        int32_t z = 0;
        r->prescale = PyFloat_AsDouble(args[5]);
        if (r->prescale == -1.0 && PyErr_Occurred()) return -1;
        r->postscale = PyFloat_AsDouble(args[6]);
        if (r->postscale == -1.0 && PyErr_Occurred()) return -1;
        if (cfx_py_compression(args[7], &z) < 0) return -1;
        r->compression = z;
    } else if (r->kind != CFX_PY_BROADCAST) {
        PyErr_Format(PyExc_ValueError, "unknown fast collective kind %d", r->kind);
        return -1;
    }
    return 0;
}

static int cfx_py_fast_nargs(Py_ssize_t n, Py_ssize_t want, const char *fn) {
    if (n == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", fn, want, n);
    return -1;
}

static PyObject *cfx_py_run(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    cfx_context *ctx;
    cfx_py_lone lone;
    if (cfx_py_fast_nargs(n, 10, "cfx_py_run") < 0 || cfx_py_lone_args(args, &lone) < 0 ||
        cfx_py_context_of(args[8], &ctx) < 0)
        return NULL;
    cfx_handle h = 0;
    cfx_status sub, st;
    Py_BEGIN_ALLOW_THREADS
    sub = cfx_bind_run(ctx, &lone.r, 0.25, &h, &st);
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
        if (st != CFX_ERR_STALE_HANDLE) (void)cfx_handle_release(ctx, h);
    }
    if (st != CFX_OK) { /* a failed wait leaves the collective's message in cfx_last_error() */
        cfx_py_raise((int)st, cfx_last_error());
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *cfx_py_submit(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    cfx_context *ctx;
    cfx_py_lone lone;
    if (cfx_py_fast_nargs(n, 9, "cfx_py_submit") < 0 || cfx_py_lone_args(args, &lone) < 0 ||
        cfx_py_context_of(args[8], &ctx) < 0)
        return NULL;
    cfx_handle h = 0;
    cfx_status st;
    Py_BEGIN_ALLOW_THREADS
    st = cfx_bind_submit(ctx, &lone.r, &h);
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
%typemap(in, numinputs=0) cfx_store **out (cfx_store *tmp = NULL) { $1 = &tmp; }
%typemap(argout) cfx_store **out {
    $result = SWIG_Python_AppendOutput($result, SWIG_NewPointerObj(SWIG_as_voidptr(tmp$argnum),
                                                                   $descriptor(cfx_store *), 0));
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
/* cfx_store_set: the value as bytes (or any contiguous buffer), held until the call returns. */
%typemap(in) (const void *data, size_t len) (Py_buffer view, int got = 0) {
    if (PyObject_GetBuffer($input, &view, PyBUF_SIMPLE) < 0) SWIG_fail;
    got = 1;
    $1 = view.buf;
    $2 = (size_t)view.len;
}
%typemap(freearg) (const void *data, size_t len) { if (got$argnum) PyBuffer_Release(&view$argnum); }
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

/* The store's look-up and events: cfx_py_store_get and cfx_py_store_next_event (bytes, and a
 * tuple per event, instead of buffers and a struct). */
%ignore cfx_store_get;
%ignore cfx_store_next_event;
%ignore cfx_store_event;
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

/* The rendezvous store (cfx_store_*): the helpers that give Python bytes and tuples. */
%nothread cfx_py_store_get;
%nothread cfx_py_store_next_event;
%inline %{
/* cfx_store_get -> the value as bytes, or None while the key is not set; the GIL released
 * around the look (a client's is a request to its server). */
static PyObject *cfx_py_store_get(cfx_store *store, const char *key) {
    char *data = NULL;
    size_t len = 0;
    int present = 0;
    cfx_status st;
    Py_BEGIN_ALLOW_THREADS
    st = cfx_bind_store_get(store, key, &data, &len, &present);
    Py_END_ALLOW_THREADS
    if (st == CFX_ERR_OUT_OF_MEMORY) return PyErr_NoMemory();
    if (st != CFX_OK) {
        cfx_py_raise((int)st, cfx_last_error());
        return NULL;
    }
    if (!present) Py_RETURN_NONE;
    PyObject *value = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    free(data);
    return value;
}

/* cfx_store_next_event -> None when none came within timeout_s, else (kind, connection, key,
 * value): kind a CFX_STORE_EVENT_* value, key a str (None for CLOSED), value bytes (None for
 * CLOSED). Waits with the GIL released. */
static PyObject *cfx_py_store_next_event(cfx_store *store, double timeout_s) {
    cfx_store_event ev;
    memset(&ev, 0, sizeof ev);
    ev.version = CFX_STORE_EVENT_VERSION;
    cfx_status st;
    Py_BEGIN_ALLOW_THREADS
    st = cfx_store_next_event(store, timeout_s, &ev);
    Py_END_ALLOW_THREADS
    if (st == CFX_ERR_TIMEOUT) Py_RETURN_NONE;
    if (st != CFX_OK) {
        cfx_py_raise((int)st, cfx_last_error());
        return NULL;
    }
    if (ev.kind != CFX_STORE_EVENT_SET)
        return Py_BuildValue("(iKOO)", (int)ev.kind, (unsigned long long)ev.connection, Py_None,
                             Py_None);
    PyObject *key = PyUnicode_DecodeUTF8(ev.key, (Py_ssize_t)strlen(ev.key), "replace");
    if (key == NULL) return NULL;
    return Py_BuildValue("(iKNy#)", (int)ev.kind, (unsigned long long)ev.connection, key,
                         (const char *)ev.value, (Py_ssize_t)ev.len);
}
%}

/* bind.h's names, so that Python accepts what the other languages accept. */
int cfx_bind_compression_code(const char *name);
%nothread cfx_py_compression_names;
%nothread cfx_py_init_option;
%inline %{
/* The compression names, in cfx_compression order ("none", "fp16", ...). */
static PyObject *cfx_py_compression_names(void) {
    PyObject *names = PyTuple_New(CFX_COMPRESSION_COUNT);
    for (int i = 0; names != NULL && i < CFX_COMPRESSION_COUNT; i++) {
        PyObject *v = PyUnicode_FromString(cfx_bind_compression_names[i]);
        if (v == NULL) Py_CLEAR(names);
        else PyTuple_SET_ITEM(names, i, v);
    }
    return names;
}

/* Sets init option `name` (cfx_bind_init_option); raises InvalidArgumentError naming the option
 * and the value, or TypeError for an unknown name, as a keyword argument's would. */
static PyObject *cfx_py_init_option(cfx_init_options *opts, const char *name, double value) {
    char msg[512];
    if (cfx_bind_init_option_index(name) < 0) {
        cfx_bind_init_option(opts, name, value, msg, sizeof msg);
        PyErr_Format(PyExc_TypeError, "init() got an %s", msg);
        return NULL;
    }
    cfx_status st = cfx_bind_init_option(opts, name, value, msg, sizeof msg);
    if (st != CFX_OK) {
        cfx_py_raise((int)st, msg);
        return NULL;
    }
    Py_RETURN_NONE;
}
%}
