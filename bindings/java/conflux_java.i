/*
 * conflux_java.i - the Java (JNI) part of the SWIG interface, included from conflux.i's SWIGJAVA
 * block. It owns the low-level layer under org.conflux: the generated classes ConfluxNative and
 * ConfluxNativeJNI (package-private: users see only the hand-written classes in java/src).
 *
 * Shape of the layer, chosen so that the hand-written Java code stays simple and fast:
 * - cfx_context * travels as a Java long (the pointer), cfx_handle (uint64_t) as a long, every enum
 *   as an int (enumtypeunsafe); no proxy objects, no BigInteger, no per-call allocation.
 * - Calls that would need out-parameters or cfx_tensor structs are replaced by cfxj_* helpers that
 *   take addresses (long) and element counts. A helper that fails returns 0 / NULL / -1 and leaves
 *   its status in cfxj_last_status() and its message in cfx_last_error() (both per thread), which
 *   the Java side turns into exceptions. Returning a sentinel instead of throwing from C keeps the
 *   exception mapping in one Java place (ConfluxException.of).
 * - Memory: direct buffers are used in place (cfxj_buffer_address); Java arrays are staged in
 *   malloc'd memory (cfxj_stage / cfxj_unstage / cfxj_free), owned by the Java Handle. Shared
 *   tensor memory (cfx_alloc) reaches Java only as a direct buffer over the block
 *   (cfxj_shared_alloc / cfxj_shared_free); SharedMemory.java owns the blocks.
 */

%include <enumtypeunsafe.swg>
%javaconst(1);
%typemap(javaclassmodifiers) enum SWIGTYPE "final $static class"
%pragma(java) jniclassclassmodifiers="final class"
%pragma(java) moduleclassmodifiers="final class"
/* Loading is done by NativeLoader (build tree, installed jar, java.library.path). */
%pragma(java) jniclasscode=%{
  static { NativeLoader.load(); }
%}

/* ---- Type mappings ------------------------------------------------------------------------ */

%typemap(jni) cfx_context *, const cfx_context * "jlong"
%typemap(jtype) cfx_context *, const cfx_context * "long"
%typemap(jstype) cfx_context *, const cfx_context * "long"
%typemap(in) cfx_context *, const cfx_context * %{ $1 = ($1_ltype)(intptr_t)$input; %}
%typemap(out) cfx_context * %{ $result = (jlong)(intptr_t)$1; %}
%typemap(javain) cfx_context *, const cfx_context * "$javainput"
%typemap(javaout) cfx_context * { return $jnicall; }

%typemap(jni) cfx_handle "jlong"
%typemap(jtype) cfx_handle "long"
%typemap(jstype) cfx_handle "long"
%typemap(in) cfx_handle %{ $1 = (cfx_handle)$input; %}
%typemap(out) cfx_handle %{ $result = (jlong)$1; %}
%typemap(javain) cfx_handle "$javainput"
%typemap(javaout) cfx_handle { return $jnicall; }

/* uint32_t would become a Java long anyway; keep the bit mask as an int. */
%typemap(jni) uint32_t cfx_features "jint"
%typemap(jtype) uint32_t cfx_features "int"
%typemap(jstype) uint32_t cfx_features "int"
%typemap(out) uint32_t cfx_features %{ $result = (jint)$1; %}
%typemap(javaout) uint32_t cfx_features { return $jnicall; }

/* The JNIEnv of the current call, for helpers that touch Java objects. */
%typemap(in, numinputs=0) JNIEnv *jenv %{ $1 = jenv; %}

/* ---- What Java does not use from the header (replaced by the helpers below) ---------------- */

%ignore CFX_VERSION_MAJOR;
%ignore CFX_VERSION_MINOR;
%ignore CFX_VERSION_PATCH;
%ignore CFX_VERSION_NUMBER;
%ignore CFX_ABI_VERSION;
%ignore CFX_DTYPE_COUNT;
%ignore CFX_OP_COUNT;
%ignore CFX_DEVICE_CPU;
%ignore CFX_MAX_NDIM;
%ignore CFX_INIT_OPTIONS_VERSION;
%ignore cfx_tensor;
%ignore cfx_init_options;
%ignore cfx_init_options_init;
%ignore cfx_init;
%ignore cfx_poll;
%ignore cfx_handle_output_count;
%ignore cfx_handle_output;
%ignore cfx_handle_output_copy;
%ignore cfx_handle_splits;
%ignore cfx_handle_join_rank;
%ignore cfx_allreduce_async;
/* Per-call options: cfxj_allreduce takes every field (Conflux.AllreduceOptions on the Java side). */
%ignore CFX_ALLREDUCE_OPTIONS_VERSION;
%ignore CFX_COMPRESSION_COUNT;
%ignore cfx_allreduce_options;
%ignore cfx_allreduce_options_init;
%ignore cfx_allreduce_async_opts;
%ignore cfx_grouped_allreduce_async;
%ignore cfx_allgather_async;
%ignore cfx_grouped_allgather_async;
%ignore cfx_broadcast_async;
%ignore cfx_alltoall_async;
%ignore cfx_reducescatter_async;
%ignore cfx_grouped_reducescatter_async;
%ignore cfx_barrier_async;
%ignore cfx_join_async;
/* Raw, these would take SWIGTYPE_p_p_void / SWIGTYPE_p_void objects Java can neither make nor
 * read; cfxj_shared_alloc / cfxj_shared_free replace them. */
%ignore cfx_alloc;
%ignore cfx_free;
%ignore cfx_is_shared; /* Java tracks its own shared buffers (SharedMemory.java) */
/* Gradient sets: the cfxj_gradset_* helpers below (the set travels as a long address). */
%ignore cfx_gradset_options;
%ignore cfx_gradset_options_init;
%ignore cfx_gradset_create;
%ignore cfx_gradset_add;
%ignore cfx_gradset_commit;
%ignore cfx_gradset_data;
%ignore cfx_gradset_ready;
%ignore cfx_gradset_wait;
%ignore cfx_gradset_free;
/* Subset contexts: cfxj_subset (the ranks as an int[]). */
%ignore cfx_context_create_subset;
/* Elastic worlds: the options by name (cfxj_reform_option), cfxj_elastic_init, cfxj_reform and
 * cfxj_membership_pending (an out-parameter); cfx_membership_round and cfx_member_id are wrapped
 * as they are. */
%ignore CFX_REFORM_OPTIONS_VERSION;
%ignore cfx_reform_options;
%ignore cfx_reform_options_init;
%ignore cfx_elastic_init;
%ignore cfx_context_reform;
%ignore cfx_membership_pending;
/* A group's context over a store the caller hands in: cfxj_store_new wraps a Java Store (through
 * the package-private StoreBridge) in the C callbacks, cfxj_init_group joins with them. Raw, the
 * callbacks struct would be function pointers Java cannot make. */
%ignore CFX_STORE_CALLBACKS_VERSION;
%ignore cfx_store_callbacks;
%ignore cfx_init_with_store;
%ignore cfx_init_group;
/* The public rendezvous store (cfx_store_*, since 1.4): TcpStore.java through the cfxj_tcpstore_*
 * helpers (the store as a long, values as byte[]); a TcpStore.Server keeps no events. */
%ignore cfx_store_serve;
%ignore cfx_store_connect;
%ignore cfx_store_port;
%ignore cfx_store_set;
%ignore cfx_store_get;
%ignore cfx_store_event_kind;
%ignore CFX_STORE_EVENT_NONE;
%ignore CFX_STORE_EVENT_SET;
%ignore CFX_STORE_EVENT_CLOSED;
%ignore CFX_STORE_EVENT_VERSION;
%ignore cfx_store_event;
%ignore cfx_store_next_event;
%ignore cfx_store_free;

/* ---- Helpers ------------------------------------------------------------------------------ */

%{
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local int cfxj_status_tl;

/* Records a failure of a cfxj_* helper for cfxj_last_status(). */
static void cfxj_set_status(cfx_status s) { cfxj_status_tl = (int)s; }

static void *cfxj_ptr(int64_t addr) { return (void *)(intptr_t)addr; }

/* A one-dimensional tensor over `count` elements at `addr`; `shape` is the caller's storage. */
static cfx_tensor cfxj_tensor(int64_t addr, int64_t count, int32_t dtype, int64_t *shape) {
    cfx_tensor t;
    shape[0] = count;
    t.data = cfxj_ptr(addr);
    t.shape = shape;
    t.ndim = 1;
    t.dtype = dtype;
    t.device = CFX_DEVICE_CPU;
    t.stream = NULL;
    return t;
}

/* Copies `bytes` between a primitive Java array and native memory at `native` (into the array when
 * `to_array`). 0 = ok, -1 when the JVM cannot pin the array. */
static int cfxj_copy_array(JNIEnv *jenv, jobject array, void *native, int64_t bytes, int to_array) {
    void *elems;
    if (bytes <= 0) return 0;
    elems = (*jenv)->GetPrimitiveArrayCritical(jenv, (jarray)array, NULL);
    if (!elems) return -1;
    if (to_array) memcpy(elems, native, (size_t)bytes);
    else memcpy(native, elems, (size_t)bytes);
    (*jenv)->ReleasePrimitiveArrayCritical(jenv, (jarray)array, elems, to_array ? 0 : JNI_ABORT);
    return 0;
}

/* The message of this thread's last failed cfxj_run (a completed handle's message does not
 * outlive the handle, which cfxj_run releases). */
static _Thread_local char cfxj_message_tl[1024];

static void cfxj_set_message(const char *msg) {
    snprintf(cfxj_message_tl, sizeof cfxj_message_tl, "%s", msg ? msg : "");
}

/* Returns the handle, or 0 after recording the status. */
static cfx_handle cfxj_handle_or_zero(cfx_status s, cfx_handle h) {
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return 0;
    }
    return h;
}
%}

%inline %{
/* The status of this thread's last failed cfxj_* call; its message is cfx_last_error(). */
int cfxj_last_status(void) { return cfxj_status_tl; }

/* Init options set by name (bindings/bind.h), then cfx_init: cfxj_init_options() makes a set of
 * unset options, cfxj_init_option() sets one (the status, the message in cfxj_run_message()), and
 * cfxj_init() joins with them and frees them (NULL on failure, after recording the status). */
int64_t cfxj_init_options(void) {
    cfx_init_options *o = malloc(sizeof *o);
    cfx_status s = o ? cfx_init_options_init(o, CFX_INIT_OPTIONS_VERSION) : CFX_ERR_OUT_OF_MEMORY;
    if (s != CFX_OK) {
        free(o);
        cfxj_set_status(s);
        return 0;
    }
    return (int64_t)(intptr_t)o;
}

int cfxj_init_option(int64_t options, const char *name, double value) {
    char msg[512];
    cfx_status s = cfx_bind_init_option(cfxj_ptr(options), name, value, msg, sizeof msg);
    if (s != CFX_OK) cfxj_set_message(msg);
    return (int)s;
}

cfx_context *cfxj_init(int64_t options) {
    cfx_context *ctx = NULL;
    cfx_status s = cfx_init(cfxj_ptr(options), &ctx);
    free(cfxj_ptr(options));
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return NULL;
    }
    return ctx;
}

/* Reform options set by name, as the init options above: cfxj_reform_options() makes a set filled
 * with the defaults (cfx_reform_options_init: CFX_ELASTIC_* or built-in), cfxj_reform_option()
 * sets one (the status, the message in cfxj_run_message()); cfxj_elastic_init() and cfxj_reform()
 * use a set and free it. */
int64_t cfxj_reform_options(void) {
    cfx_reform_options *o = malloc(sizeof *o);
    cfx_status s = o ? cfx_reform_options_init(o, CFX_REFORM_OPTIONS_VERSION) : CFX_ERR_OUT_OF_MEMORY;
    if (s != CFX_OK) {
        free(o);
        cfxj_set_status(s);
        return 0;
    }
    return (int64_t)(intptr_t)o;
}

int cfxj_reform_option(int64_t options, const char *name, double value) {
    char msg[512];
    cfx_status s = cfx_bind_reform_option(cfxj_ptr(options), name, value, msg, sizeof msg);
    if (s != CFX_OK) cfxj_set_message(msg);
    return (int)s;
}

/* cfx_elastic_init with both sets, which it frees; NULL on failure, after recording the status. */
cfx_context *cfxj_elastic_init(int64_t options, int64_t reform_options) {
    cfx_context *ctx = NULL;
    cfx_status s = cfx_elastic_init(cfxj_ptr(options), cfxj_ptr(reform_options), &ctx);
    free(cfxj_ptr(options));
    free(cfxj_ptr(reform_options));
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return NULL;
    }
    return ctx;
}

/* cfx_context_reform with the set, which it frees. Returns the status (message in
 * cfx_last_error()). */
int cfxj_reform(cfx_context *ctx, int64_t reform_options) {
    cfx_status s = cfx_context_reform(ctx, cfxj_ptr(reform_options));
    free(cfxj_ptr(reform_options));
    return (int)s;
}

/* cfx_membership_pending: the newcomers waiting, or -1 after recording the status. */
int cfxj_membership_pending(cfx_context *ctx) {
    int n = 0;
    cfx_status s = cfx_membership_pending(ctx, &n);
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return -1;
    }
    return n;
}

/* The cfx_compression named `name` (any case), or -1 (bindings/bind.h). */
int cfxj_compression_code(const char *name) { return cfx_bind_compression_code(name); }

/* The address of a direct buffer's storage (ignoring its position); 0 for a heap buffer. */
int64_t cfxj_buffer_address(JNIEnv *jenv, jobject buffer) {
    void *p = buffer ? (*jenv)->GetDirectBufferAddress(jenv, buffer) : NULL;
    return (int64_t)(intptr_t)p;
}

/* Copies `bytes` of a primitive Java array into new malloc'd memory; 0 when out of memory. */
int64_t cfxj_stage(JNIEnv *jenv, jobject array, int64_t bytes) {
    void *dst = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (!dst || cfxj_copy_array(jenv, array, dst, bytes, 0) != 0) {
        free(dst);
        cfxj_set_status(CFX_ERR_OUT_OF_MEMORY);
        return 0;
    }
    return (int64_t)(intptr_t)dst;
}

/* Copies `bytes` from native memory at `src` back into a primitive Java array. 0 = ok. */
int cfxj_unstage(JNIEnv *jenv, int64_t src, jobject array, int64_t bytes) {
    return cfxj_copy_array(jenv, array, cfxj_ptr(src), bytes, 1) ? (int)CFX_ERR_OUT_OF_MEMORY : 0;
}

void cfxj_free(int64_t addr) { free(cfxj_ptr(addr)); }

/* A direct ByteBuffer (capacity `bytes`, at most Integer.MAX_VALUE: the caller checks) over a new
 * cfx_alloc block; null after recording the status. If the JVM cannot make the buffer (an
 * OutOfMemoryError is pending then) the block goes back at once. */
jobject cfxj_shared_alloc(JNIEnv *jenv, int64_t bytes) {
    void *p = NULL;
    jobject buffer;
    cfx_status s = cfx_alloc((size_t)bytes, &p);
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return NULL;
    }
    buffer = (*jenv)->NewDirectByteBuffer(jenv, p, (jlong)bytes);
    if (!buffer) {
        cfx_free(p);
        cfxj_set_status(CFX_ERR_OUT_OF_MEMORY);
    }
    return buffer;
}

/* cfx_free on the block at `addr`. Returns the status (message in cfx_last_error()). */
int cfxj_shared_free(int64_t addr) { return (int)cfx_free(cfxj_ptr(addr)); }

/* A blocking allreduce (kind 0) or broadcast (kind 1) in one JNI crossing, for Conflux's blocking
 * forms: stage `array` (null for a direct buffer at `data`), submit, wait, copy the result back,
 * release. No handle outlives the call, so nothing is tracked on the Java side. Arrays of up to
 * CFXJ_RUN_STACK bytes are staged on the stack (the lone small call allocates nothing). `arg` is the
 * op (allreduce) or the root (broadcast). Returns the status; on failure the message is
 * cfxj_run_message(). */
#define CFXJ_RUN_STACK 512
int cfxj_run(JNIEnv *jenv, cfx_context *ctx, int32_t kind, const char *name, jobject array,
             int64_t data, int64_t count, int32_t dtype, int32_t arg, double prescale,
             double postscale, int32_t compression) {
    _Alignas(64) unsigned char stack[CFXJ_RUN_STACK];
    int64_t shape[1], bytes = count * (int64_t)cfx_dtype_size((cfx_dtype)dtype);
    void *staged = NULL;
    cfx_tensor t;
    cfx_handle h = 0;
    cfx_status s;
    if (array) {
        staged = bytes <= CFXJ_RUN_STACK ? (void *)stack : malloc((size_t)bytes);
        if (!staged || cfxj_copy_array(jenv, array, staged, bytes, 0) != 0) {
            if (staged != stack) free(staged);
            cfxj_set_message("Conflux: cannot stage the array (out of memory)");
            return (int)CFX_ERR_OUT_OF_MEMORY;
        }
        data = (int64_t)(intptr_t)staged;
    }
    t = cfxj_tensor(data, count, dtype, shape);
    {
        cfx_bind_request r = {kind == 1 ? CFX_BIND_BROADCAST : CFX_BIND_ALLREDUCE, name, &t, NULL, arg,
                              prescale, postscale, compression};
        cfx_status waited;
        s = cfx_bind_run(ctx, &r, -1.0, &h, &waited);
        if (s == CFX_OK) s = waited;
    }
    if (s != CFX_OK) {
        cfxj_set_message(cfx_last_error()); /* cfx_bind_run leaves the collective's message there */
    } else if (array && cfxj_copy_array(jenv, array, staged, bytes, 1) != 0) {
        s = CFX_ERR_OUT_OF_MEMORY;
        cfxj_set_message("Conflux: cannot copy the result into the array");
    }
    if (staged != stack) free(staged);
    return (int)s;
}

/* The message of this thread's last failed cfxj_run. */
const char *cfxj_run_message(void) { return cfxj_message_tl; }

/* An allreduce with every field of cfx_allreduce_options spelled out (cfx_bind_allreduce_async:
 * the plain call without a compression). */
cfx_handle cfxj_allreduce(cfx_context *ctx, const char *name, int64_t data, int64_t count,
                               int32_t dtype, int32_t op, double prescale, double postscale,
                               int32_t compression) {
    int64_t shape[1];
    cfx_tensor t = cfxj_tensor(data, count, dtype, shape);
    cfx_handle h = 0;
    cfx_status s = cfx_bind_allreduce_async(ctx, name, &t, NULL, op, prescale, postscale, compression, &h);
    return cfxj_handle_or_zero(s, h);
}

cfx_handle cfxj_allgather(cfx_context *ctx, const char *name, int64_t data, int64_t count,
                          int32_t dtype) {
    int64_t shape[1];
    cfx_tensor t = cfxj_tensor(data, count, dtype, shape);
    cfx_handle h = 0;
    cfx_status s = cfx_allgather_async(ctx, name, &t, &h);
    return cfxj_handle_or_zero(s, h);
}

cfx_handle cfxj_broadcast(cfx_context *ctx, const char *name, int64_t data, int64_t count,
                          int32_t dtype, int32_t root) {
    int64_t shape[1];
    cfx_tensor t = cfxj_tensor(data, count, dtype, shape);
    cfx_handle h = 0;
    cfx_status s = cfx_broadcast_async(ctx, name, &t, root, &h);
    return cfxj_handle_or_zero(s, h);
}

/* `splits` may be null (equal split). */
cfx_handle cfxj_alltoall(JNIEnv *jenv, cfx_context *ctx, const char *name, int64_t data,
                         int64_t count, int32_t dtype, jlongArray splits) {
    int64_t shape[1];
    cfx_tensor t = cfxj_tensor(data, count, dtype, shape);
    cfx_handle h = 0;
    int64_t *sp = NULL;
    size_t n = 0;
    cfx_status s;
    if (splits) {
        n = (size_t)(*jenv)->GetArrayLength(jenv, splits);
        sp = malloc((n ? n : 1) * sizeof *sp);
        if (!sp) return cfxj_handle_or_zero(CFX_ERR_OUT_OF_MEMORY, 0);
        (*jenv)->GetLongArrayRegion(jenv, splits, 0, (jsize)n, (jlong *)sp);
    }
    s = cfx_alltoall_async(ctx, name, &t, sp, n, &h);
    free(sp);
    return cfxj_handle_or_zero(s, h);
}

cfx_handle cfxj_reducescatter(cfx_context *ctx, const char *name, int64_t data, int64_t count,
                              int32_t dtype, int32_t op, double prescale, double postscale) {
    int64_t shape[1];
    cfx_tensor t = cfxj_tensor(data, count, dtype, shape);
    cfx_handle h = 0;
    cfx_status s = cfx_reducescatter_async(ctx, name, &t, (cfx_reduce_op)op, prescale, postscale,
                                           &h);
    return cfxj_handle_or_zero(s, h);
}

cfx_handle cfxj_barrier(cfx_context *ctx) {
    cfx_handle h = 0;
    cfx_status s = cfx_barrier_async(ctx, &h);
    return cfxj_handle_or_zero(s, h);
}

cfx_handle cfxj_join(cfx_context *ctx) {
    cfx_handle h = 0;
    cfx_status s = cfx_join_async(ctx, &h);
    return cfxj_handle_or_zero(s, h);
}

/* 1 when complete, 0 when pending, -status on error. */
int cfxj_poll(cfx_context *ctx, cfx_handle handle) {
    int done = 0;
    cfx_status s = cfx_poll(ctx, handle, &done);
    return s == CFX_OK ? (done != 0) : -(int)s;
}

/* Size in bytes of output `index` of a completed handle; -1 on error. */
int64_t cfxj_output_bytes(cfx_context *ctx, cfx_handle handle, int64_t index) {
    cfx_tensor t;
    int64_t n = 1;
    int32_t i;
    cfx_status s = cfx_handle_output(ctx, handle, (size_t)index, &t);
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return -1;
    }
    for (i = 0; i < t.ndim; i++) n *= t.shape[i];
    return n * (int64_t)cfx_dtype_size((cfx_dtype)t.dtype);
}

/* Copies output `index` to native memory at `dst`. Returns the status. */
int cfxj_output_copy(cfx_context *ctx, cfx_handle handle, int64_t index, int64_t dst,
                     int64_t bytes) {
    return (int)cfx_handle_output_copy(ctx, handle, (size_t)index, cfxj_ptr(dst), (size_t)bytes);
}

/* Copies output `index` into a primitive Java array of at least `bytes` bytes. Returns the status. */
int cfxj_output_to_array(JNIEnv *jenv, cfx_context *ctx, cfx_handle handle, int64_t index,
                         jobject array, int64_t bytes) {
    cfx_status s;
    void *dst;
    if (bytes <= 0) return (int)CFX_OK;
    dst = (*jenv)->GetPrimitiveArrayCritical(jenv, (jarray)array, NULL);
    if (!dst) return (int)CFX_ERR_OUT_OF_MEMORY;
    s = cfx_handle_output_copy(ctx, handle, (size_t)index, dst, (size_t)bytes);
    (*jenv)->ReleasePrimitiveArrayCritical(jenv, (jarray)array, dst, 0);
    return (int)s;
}

/* The per-rank row counts of output `index` (size entries); null on error. */
jlongArray cfxj_splits(JNIEnv *jenv, cfx_context *ctx, cfx_handle handle, int64_t index) {
    const int64_t *sp = NULL;
    int n = cfx_size(ctx);
    jlongArray out;
    cfx_status s = cfx_handle_splits(ctx, handle, (size_t)index, &sp);
    if (s != CFX_OK || n < 0) {
        cfxj_set_status(s != CFX_OK ? s : CFX_ERR_NOT_INITIALIZED);
        return NULL;
    }
    out = (*jenv)->NewLongArray(jenv, n);
    if (out && n > 0) (*jenv)->SetLongArrayRegion(jenv, out, 0, n, (const jlong *)sp);
    return out;
}

/* The last rank to join (completed join handle); -1 on error. */
int cfxj_join_rank(cfx_context *ctx, cfx_handle handle) {
    int r = -1;
    cfx_status s = cfx_handle_join_rank(ctx, handle, &r);
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return -1;
    }
    return r;
}

/* ---- gradient sets (GradientSet.java); the set is a long address, 0 = none ---- */

/* cfx_gradset_create with every option spelled out; 0 on failure (status recorded). */
int64_t cfxj_gradset_create(cfx_context *ctx, const char *name, int32_t op, int64_t bucket_bytes,
                            int32_t accumulate_steps, double prescale, double postscale,
                            int32_t owned, int32_t compression, int32_t error_feedback) {
    cfx_gradset_options o;
    cfx_gradset *set = NULL;
    cfx_status s = cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    if (s == CFX_OK) {
        o.op = op;
        o.bucket_bytes = bucket_bytes;
        o.accumulate_steps = accumulate_steps;
        o.prescale = prescale;
        o.postscale = postscale;
        o.owned = owned;
        o.compression = compression;
        o.error_feedback = error_feedback;
        s = cfx_gradset_create(ctx, name, &o, &set);
    }
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return 0;
    }
    return (int64_t)(intptr_t)set;
}

/* cfx_gradset_add of a gradient of `shape` (a long[]) at `data` (0: owned); its index, or -1. */
int32_t cfxj_gradset_add(JNIEnv *jenv, int64_t set, const char *name, int32_t dtype, jobject shape,
                         int64_t data) {
    int64_t dims[CFX_MAX_NDIM];
    jsize nd = (*jenv)->GetArrayLength(jenv, (jarray)shape);
    int32_t index = -1;
    cfx_tensor t;
    cfx_status s;
    if (nd > CFX_MAX_NDIM) {
        cfxj_set_status(CFX_ERR_INVALID_ARGUMENT);
        return -1;
    }
    (*jenv)->GetLongArrayRegion(jenv, (jlongArray)shape, 0, nd, (jlong *)dims);
    t.data = cfxj_ptr(data);
    t.shape = nd ? dims : NULL;
    t.ndim = (int32_t)nd;
    t.dtype = dtype;
    t.device = CFX_DEVICE_CPU;
    t.stream = NULL;
    s = cfx_gradset_add(cfxj_ptr(set), name, &t, &index);
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return -1;
    }
    return index;
}

int cfxj_gradset_commit(int64_t set) { return (int)cfx_gradset_commit(cfxj_ptr(set)); }

/* A direct buffer over the owned gradient `index` (`bytes` long); NULL on failure. */
jobject cfxj_gradset_buffer(JNIEnv *jenv, int64_t set, int32_t index, int64_t bytes) {
    void *p = NULL;
    jobject buffer;
    cfx_status s = cfx_gradset_data(cfxj_ptr(set), index, &p);
    if (s != CFX_OK) {
        cfxj_set_status(s);
        return NULL;
    }
    buffer = (*jenv)->NewDirectByteBuffer(jenv, p, (jlong)bytes);
    if (!buffer) cfxj_set_status(CFX_ERR_OUT_OF_MEMORY);
    return buffer;
}

int cfxj_gradset_ready(int64_t set, int32_t index) {
    return (int)cfx_gradset_ready(cfxj_ptr(set), index);
}

int cfxj_gradset_wait(int64_t set, double timeout_s) {
    return (int)cfx_gradset_wait(cfxj_ptr(set), timeout_s);
}

void cfxj_gradset_free(int64_t set) { cfx_gradset_free(cfxj_ptr(set)); }

%}

/* ---- a store handed in from Java (Conflux.initGroup, Store.java) ---- */

%{
/* The callbacks of cfx_init_group over a Java StoreBridge (a global reference), with the method
 * ids and String class cached at creation: the engine calls them from the thread in cfx_init_group
 * and may call them from its own threads, whose class loader would not find org.conflux (Spark
 * loads it from --jars). A thread the JVM does not know is attached for the one call and detached
 * again. Freed (cfxj_store_free) only after the context that uses it. */
typedef struct cfxj_store {
    cfx_store_callbacks cb;
    JavaVM *vm;
    jobject bridge;
    jclass string_class;
    jmethodID set, get, wait;
} cfxj_store;

/* This thread's JNIEnv with a local frame of `locals` references; *attached says whether the
 * thread was attached here (cfxj_store_leave detaches it). NULL when the JVM refuses. */
static JNIEnv *cfxj_store_enter(cfxj_store *s, jint locals, int *attached) {
    JNIEnv *env = NULL;
    jint r = (*s->vm)->GetEnv(s->vm, (void **)&env, JNI_VERSION_1_8);
    *attached = 0;
    if (r == JNI_EDETACHED) {
        if ((*s->vm)->AttachCurrentThreadAsDaemon(s->vm, (void **)&env, NULL) != JNI_OK) return NULL;
        *attached = 1;
    } else if (r != JNI_OK) {
        return NULL;
    }
    if ((*env)->PushLocalFrame(env, locals) != 0) {
        (*env)->ExceptionClear(env);
        if (*attached) (*s->vm)->DetachCurrentThread(s->vm);
        return NULL;
    }
    return env;
}

/* Ends a call: an exception the bridge let through becomes `failed` (StoreBridge keeps the
 * Java exception for the message). */
static int cfxj_store_leave(cfxj_store *s, JNIEnv *env, int attached, int rc, int failed) {
    if ((*env)->ExceptionCheck(env)) {
        (*env)->ExceptionClear(env);
        rc = failed;
    }
    (*env)->PopLocalFrame(env, NULL);
    if (attached) (*s->vm)->DetachCurrentThread(s->vm);
    return rc;
}

static int cfxj_store_set(void *user, const char *key, const void *data, size_t len) {
    cfxj_store *s = user;
    int attached, rc = -1;
    JNIEnv *env = cfxj_store_enter(s, 8, &attached);
    jstring k;
    jbyteArray v;
    if (!env) return -1;
    k = (*env)->NewStringUTF(env, key);
    v = k && len <= 0x7fffffff ? (*env)->NewByteArray(env, (jsize)len) : NULL;
    if (v) {
        (*env)->SetByteArrayRegion(env, v, 0, (jsize)len, (const jbyte *)data);
        rc = (*env)->CallIntMethod(env, s->bridge, s->set, k, v);
    }
    return cfxj_store_leave(s, env, attached, rc, -1);
}

static int cfxj_store_get(void *user, const char *key, void *buf, size_t cap, size_t *len) {
    cfxj_store *s = user;
    int attached, rc = -1;
    JNIEnv *env = cfxj_store_enter(s, 8, &attached);
    jstring k;
    jbyteArray v = NULL;
    if (!env) return -1;
    k = (*env)->NewStringUTF(env, key);
    if (k) v = (jbyteArray)(*env)->CallObjectMethod(env, s->bridge, s->get, k);
    if (v && !(*env)->ExceptionCheck(env)) {
        jsize n = (*env)->GetArrayLength(env, v);
        *len = (size_t)n;
        (*env)->GetByteArrayRegion(env, v, 0, (jsize)((size_t)n < cap ? (size_t)n : cap), (jbyte *)buf);
        rc = 0;
    }
    return cfxj_store_leave(s, env, attached, rc, -1);
}

static int cfxj_store_wait(void *user, const char *const *keys, size_t n, double timeout_s) {
    cfxj_store *s = user;
    int attached, rc = -1;
    JNIEnv *env;
    jobjectArray arr;
    size_t i;
    if (n > 0x7ffffff0) return -1;
    env = cfxj_store_enter(s, (jint)n + 8, &attached);
    if (!env) return -1;
    arr = (*env)->NewObjectArray(env, (jsize)n, s->string_class, NULL);
    for (i = 0; arr && i < n; i++) {
        jstring k = (*env)->NewStringUTF(env, keys[i]);
        if (!k) {
            arr = NULL;
            break;
        }
        (*env)->SetObjectArrayElement(env, arr, (jsize)i, k);
    }
    if (arr) rc = (*env)->CallIntMethod(env, s->bridge, s->wait, arr, timeout_s);
    return cfxj_store_leave(s, env, attached, rc, -1);
}
%}

%inline %{
/* Wraps a StoreBridge in store callbacks; 0 after recording the status. */
int64_t cfxj_store_new(JNIEnv *jenv, jobject bridge) {
    cfxj_store *s = calloc(1, sizeof *s);
    jclass cls, str;
    if (!s || !bridge || (*jenv)->GetJavaVM(jenv, &s->vm) != JNI_OK) {
        free(s);
        cfxj_set_status(bridge ? CFX_ERR_OUT_OF_MEMORY : CFX_ERR_INVALID_ARGUMENT);
        return 0;
    }
    cls = (*jenv)->GetObjectClass(jenv, bridge);
    str = (*jenv)->FindClass(jenv, "java/lang/String");
    s->set = cls ? (*jenv)->GetMethodID(jenv, cls, "set", "(Ljava/lang/String;[B)I") : NULL;
    s->get = s->set ? (*jenv)->GetMethodID(jenv, cls, "get", "(Ljava/lang/String;)[B") : NULL;
    s->wait = s->get ? (*jenv)->GetMethodID(jenv, cls, "await", "([Ljava/lang/String;D)I") : NULL;
    s->bridge = s->wait && str ? (*jenv)->NewGlobalRef(jenv, bridge) : NULL;
    s->string_class = s->bridge ? (jclass)(*jenv)->NewGlobalRef(jenv, str) : NULL;
    if (!s->string_class) {
        (*jenv)->ExceptionClear(jenv);
        if (s->bridge) (*jenv)->DeleteGlobalRef(jenv, s->bridge);
        free(s);
        cfxj_set_status(CFX_ERR_INTERNAL);
        return 0;
    }
    s->cb.version = CFX_STORE_CALLBACKS_VERSION;
    s->cb.user = s;
    s->cb.set = cfxj_store_set;
    s->cb.get = cfxj_store_get;
    s->cb.wait = cfxj_store_wait;
    return (int64_t)(intptr_t)s;
}

void cfxj_store_free(JNIEnv *jenv, int64_t store) {
    cfxj_store *s = cfxj_ptr(store);
    if (!s) return;
    (*jenv)->DeleteGlobalRef(jenv, s->bridge);
    (*jenv)->DeleteGlobalRef(jenv, s->string_class);
    free(s);
}

/* cfx_init_group with the options (freed here) and a store from cfxj_store_new; NULL on failure,
 * after recording the status. */
cfx_context *cfxj_init_group(int64_t options, int64_t store, int32_t rank, int32_t size) {
    cfx_context *ctx = NULL;
    cfxj_store *s = cfxj_ptr(store);
    cfx_status st = cfx_init_group(cfxj_ptr(options), &s->cb, rank, size, &ctx);
    free(cfxj_ptr(options));
    if (st != CFX_OK) {
        cfxj_set_status(st);
        return NULL;
    }
    return ctx;
}
%}

/* ---- the engine's TCP store (TcpStore.java) ---- */

%inline %{
/* cfx_store_serve without events; 0 after recording the status. */
int64_t cfxj_tcpstore_serve(int32_t port) {
    cfx_store *s = NULL;
    cfx_status st = cfx_store_serve(port, 0, &s);
    if (st != CFX_OK) {
        cfxj_set_status(st);
        return 0;
    }
    return (int64_t)(intptr_t)s;
}

/* cfx_store_connect; 0 after recording the status. */
int64_t cfxj_tcpstore_connect(const char *host, int32_t port, double timeout_s) {
    cfx_store *s = NULL;
    cfx_status st = cfx_store_connect(host, port, timeout_s, &s);
    if (st != CFX_OK) {
        cfxj_set_status(st);
        return 0;
    }
    return (int64_t)(intptr_t)s;
}

int32_t cfxj_tcpstore_port(int64_t store) { return cfx_store_port(cfxj_ptr(store)); }

/* cfx_store_set of a byte[]: the status. */
int32_t cfxj_tcpstore_set(JNIEnv *jenv, int64_t store, const char *key, jbyteArray value) {
    jsize n = (*jenv)->GetArrayLength(jenv, value);
    jbyte *b = (*jenv)->GetByteArrayElements(jenv, value, NULL);
    cfx_status st;
    if (!b) {
        (*jenv)->ExceptionClear(jenv);
        return (int32_t)CFX_ERR_OUT_OF_MEMORY;
    }
    st = cfx_store_set(cfxj_ptr(store), key, b, (size_t)n);
    (*jenv)->ReleaseByteArrayElements(jenv, value, b, JNI_ABORT);
    return (int32_t)st;
}

/* cfx_store_get as a byte[]: NULL while the key is not set (status CFX_OK) or after recording a
 * failure. */
jbyteArray cfxj_tcpstore_get(JNIEnv *jenv, int64_t store, const char *key) {
    char *data = NULL;
    size_t len = 0;
    int present = 0;
    jbyteArray v = NULL;
    cfx_status st = cfx_bind_store_get(cfxj_ptr(store), key, &data, &len, &present);
    cfxj_set_status(st == CFX_OK && present && len > 0x7fffffff ? CFX_ERR_OUT_OF_MEMORY : st);
    if (st == CFX_OK && present && len <= 0x7fffffff) {
        v = (*jenv)->NewByteArray(jenv, (jsize)len);
        if (v) (*jenv)->SetByteArrayRegion(jenv, v, 0, (jsize)len, (const jbyte *)data);
    }
    free(data);
    return v;
}

void cfxj_tcpstore_free(int64_t store) { cfx_store_free(cfxj_ptr(store)); }
%}

%inline %{
/* cfx_context_create_subset over `ranks` (Conflux.subset): the new context, or NULL; the status
 * is recorded either way, so NULL with CFX_OK means this rank is not listed. */
cfx_context *cfxj_subset(JNIEnv *jenv, cfx_context *ctx, jintArray ranks) {
    jsize n = (*jenv)->GetArrayLength(jenv, ranks);
    jint *r = malloc((n ? (size_t)n : 1) * sizeof *r);
    cfx_context *out = NULL;
    cfx_status s;
    if (!r) {
        cfxj_set_status(CFX_ERR_OUT_OF_MEMORY);
        return NULL;
    }
    (*jenv)->GetIntArrayRegion(jenv, ranks, 0, n, r);
    s = cfx_context_create_subset(ctx, (const int *)r, (size_t)n, &out);
    free(r);
    cfxj_set_status(s);
    return s == CFX_OK ? out : NULL;
}
%}
