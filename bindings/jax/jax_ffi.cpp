// XLA FFI handlers of conflux.jax: the custom calls a jitted (or eager) JAX program runs for
// Conflux's collectives, straight into the C ABI on the job's context. Owns: the handlers
// (cfx_jax_allreduce, _allgather, _broadcast, _alltoall, _reducescatter, _barrier), the mapping of
// XLA's element types onto cfx_dtype, the one pointer to the context they use, set by
// cfx_jax_set_context() from conflux.jax's init(), and the process sets' contexts by number, set
// by cfx_jax_set_subset() from conflux.jax.ProcessSet. conflux/_jax_primitive.py loads this
// library with ctypes and registers the handlers with jax.ffi. Called by XLA's CPU runtime on its
// threads.
//
// Every handler takes an ordered-effect token first and returns one first: conflux.jax threads
// JAX's ordered effect through them so they run in program order, the same order on every rank,
// which is what matches unnamed collectives (the engine names them by per-context submission
// order). Each handler submits, waits and returns: XLA's buffers are borrowed only for the call.
//
// The context pointer is process-wide state on purpose: XLA keeps compiled programs across
// conflux.jax.shutdown()/init(), so they must find the context through the library, not through
// a value baked into the program. It is an atomic, set and cleared by conflux.jax only. Process
// sets (conflux.jax.ProcessSet) are found the same way: a program carries the set's number (the
// attribute "set", 0 for the job's context), the library maps it to the set's subset context
// while the set lives (cfx_jax_set_subset), and a set freed or a job shut down makes a program
// that still names it fail with a message instead of touching a freed context.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "conflux/conflux.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

std::atomic<cfx_context *> g_ctx{nullptr};
std::mutex g_sets_mu;
std::unordered_map<int32_t, cfx_context *> g_sets; // process set number -> its subset context

// "conflux.jax.allreduce of 'w'" / "conflux.jax.allreduce": what every message starts with.
std::string what(std::string_view op, std::string_view label) {
    std::string s = "conflux.jax.";
    s += op;
    if (!label.empty()) {
        s += " of ";
        s += label;
    }
    return s;
}

// The cfx_dtype of an XLA element type, or -1 for one the engine lacks.
int32_t to_cfx_dtype(ffi::DataType t) {
    switch (t) {
    case ffi::DataType::PRED: return CFX_BOOL;
    case ffi::DataType::S8: return CFX_INT8;
    case ffi::DataType::U8: return CFX_UINT8;
    case ffi::DataType::S16: return CFX_INT16;
    case ffi::DataType::U16: return CFX_UINT16;
    case ffi::DataType::S32: return CFX_INT32;
    case ffi::DataType::S64: return CFX_INT64;
    case ffi::DataType::F16: return CFX_FLOAT16;
    case ffi::DataType::BF16: return CFX_BFLOAT16;
    case ffi::DataType::F32: return CFX_FLOAT32;
    case ffi::DataType::F64: return CFX_FLOAT64;
    default: return -1;
    }
}

// A cfx_tensor over an XLA buffer; `shape` keeps the extents alive while the tensor is used.
struct Described {
    cfx_tensor t;
    std::vector<int64_t> shape;
};

ffi::ErrorOr<Described> describe(const ffi::AnyBuffer &b, std::string_view op,
                                 std::string_view label) {
    Described d;
    int32_t dt = to_cfx_dtype(b.element_type());
    if (dt < 0)
        return ffi::Unexpected(ffi::Error::InvalidArgument(
            what(op, label) + ": element type " + std::to_string(static_cast<int>(b.element_type())) +
            " is not one Conflux reduces (bool, int8..int64, uint8, uint16, float16, bfloat16, "
            "float32, float64)"));
    auto dims = b.dimensions();
    d.shape.assign(dims.begin(), dims.end());
    std::memset(&d.t, 0, sizeof d.t);
    d.t.data = b.untyped_data();
    d.t.ndim = static_cast<int32_t>(d.shape.size());
    d.t.dtype = dt;
    d.t.device = CFX_DEVICE_CPU;
    return d;
}

// The context of process set `set` (0: the job's).
ffi::ErrorOr<cfx_context *> context(std::string_view op, std::string_view label, int32_t set) {
    cfx_context *ctx = g_ctx.load(std::memory_order_acquire);
    if (ctx == nullptr)
        return ffi::Unexpected(ffi::Error(
            ffi::ErrorCode::kFailedPrecondition,
            what(op, label) + ": Conflux is not initialized; call conflux.jax.init() first"));
    if (set == 0)
        return ctx;
    std::lock_guard<std::mutex> lock(g_sets_mu);
    auto it = g_sets.find(set);
    if (it == g_sets.end())
        return ffi::Unexpected(ffi::Error(
            ffi::ErrorCode::kFailedPrecondition,
            what(op, label) + ": its process set was freed (or Conflux shut down since it was "
                              "created); create the conflux.jax.ProcessSet again"));
    return it->second;
}

// The engine's name for a collective: NULL (named by submission order) for "".
const char *engine_name(const std::string &name) { return name.empty() ? nullptr : name.c_str(); }

ffi::Error fail(std::string_view op, std::string_view label, const char *step, cfx_status st,
                const char *detail) {
    // "[PEER_LOST]": conflux.jax turns JAX's runtime error back into the status's error class.
    const char *sname = cfx_status_name(st);
    std::string msg = what(op, label) + ": " + step + " failed: [" + (sname ? sname : "?") + "] " +
                      cfx_status_string(st);
    if (detail != nullptr && *detail != '\0') {
        msg += ": ";
        msg += detail;
    }
    return ffi::Error(ffi::ErrorCode::kInternal, msg);
}

ffi::Error submit_failed(std::string_view op, std::string_view label, cfx_status st) {
    return fail(op, label, "submitting", st, cfx_last_error());
}

// Waits for `h`, then copies output 0 into `dst` when given (dst_bytes must match exactly:
// a rank-dependent extent that disagrees with the static shape is an error, never a truncation),
// and releases the handle whatever happened.
ffi::Error finish(cfx_context *ctx, cfx_handle h, std::string_view op, std::string_view label,
                  void *dst = nullptr, size_t dst_bytes = 0, const char *shape_hint = nullptr) {
    cfx_status st = cfx_wait(ctx, h, -1.0);
    ffi::Error err = ffi::Error::Success();
    if (st != CFX_OK) {
        err = fail(op, label, "the collective", st, cfx_handle_message(ctx, h));
    } else if (dst != nullptr || dst_bytes != 0) {
        cfx_tensor out;
        st = cfx_handle_output(ctx, h, 0, &out);
        size_t bytes = 0;
        if (st == CFX_OK) {
            bytes = cfx_dtype_size(static_cast<cfx_dtype>(out.dtype));
            for (int32_t i = 0; i < out.ndim; ++i)
                bytes *= static_cast<size_t>(out.shape[i]);
        }
        if (st != CFX_OK) {
            err = fail(op, label, "reading the result", st, cfx_last_error());
        } else if (bytes != dst_bytes) {
            err = ffi::Error(ffi::ErrorCode::kInvalidArgument,
                             what(op, label) + ": the result holds " + std::to_string(bytes) +
                                 " bytes but the static output shape holds " +
                                 std::to_string(dst_bytes) + (shape_hint ? shape_hint : ""));
        } else if (bytes != 0) {
            std::memcpy(dst, out.data, bytes);
        }
    }
    cfx_handle_release(ctx, h);
    return err;
}

// ---- allreduce and grouped allreduce: N arrays in, N out, one submission ----
ffi::Error allreduce_impl(ffi::Token, ffi::RemainingArgs args, ffi::Result<ffi::Token>,
                          ffi::RemainingRets rets, int32_t op, double prescale, double postscale,
                          int32_t compression, std::string_view name_attr,
                          std::string_view label, int32_t set) {
    const char *opname = args.size() > 1 ? "grouped_allreduce" : "allreduce";
    auto ctx = context(opname, label, set);
    if (ctx.has_error())
        return ctx.error();
    size_t n = args.size();
    if (rets.size() != n)
        return ffi::Error::InvalidArgument(what(opname, label) + ": inputs and outputs differ");
    std::vector<Described> in(n);
    std::vector<cfx_tensor> tensors(n);
    std::vector<void *> outs(n);
    for (size_t i = 0; i < n; ++i) {
        auto a = args.get<ffi::AnyBuffer>(i);
        auto r = rets.get<ffi::AnyBuffer>(i);
        if (a.has_error())
            return a.error();
        if (r.has_error())
            return r.error();
        auto d = describe(*a, opname, label);
        if (d.has_error())
            return d.error();
        in[i] = std::move(*d);
        in[i].t.shape = in[i].shape.data();
        tensors[i] = in[i].t;
        outs[i] = (*r)->untyped_data();
    }
    std::string name(name_attr);
    if (n == 0)
        return ffi::Error::Success();
    if (n > 1 && compression == CFX_COMPRESSION_NONE) {
        cfx_handle h = 0;
        cfx_status st = cfx_grouped_allreduce_async(*ctx, engine_name(name), n, tensors.data(),
                                                    outs.data(), static_cast<cfx_reduce_op>(op),
                                                    prescale, postscale, &h);
        if (st != CFX_OK)
            return submit_failed(opname, label, st);
        return finish(*ctx, h, opname, label);
    }
    // One handle per array (the grouped call takes no compression): all submitted, then waited.
    cfx_allreduce_options o;
    cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION);
    o.op = op;
    o.prescale = prescale;
    o.postscale = postscale;
    o.compression = compression;
    std::vector<cfx_handle> hs;
    ffi::Error err = ffi::Error::Success();
    for (size_t i = 0; i < n; ++i) {
        std::string nm = name.empty() || n == 1 ? name : name + "." + std::to_string(i);
        cfx_handle h = 0;
        cfx_status st = cfx_allreduce_async_opts(*ctx, engine_name(nm), &tensors[i], outs[i], &o, &h);
        if (st != CFX_OK) {
            err = submit_failed(opname, label, st);
            break;
        }
        hs.push_back(h);
    }
    for (cfx_handle h : hs) {
        ffi::Error e = finish(*ctx, h, opname, label);
        if (e.failure() && err.success())
            err = std::move(e);
    }
    return err;
}

// ---- allgather: equal dim 0 on every rank (the static output is size x the input) ----
ffi::Error allgather_impl(ffi::Token, ffi::AnyBuffer x, ffi::Result<ffi::Token>,
                          ffi::Result<ffi::AnyBuffer> out, std::string_view name_attr,
                          std::string_view label, int32_t set) {
    auto ctx = context("allgather", label, set);
    if (ctx.has_error())
        return ctx.error();
    auto d = describe(x, "allgather", label);
    if (d.has_error())
        return d.error();
    d->t.shape = d->shape.data();
    std::string name(name_attr);
    cfx_handle h = 0;
    cfx_status st = cfx_allgather_async(*ctx, engine_name(name), &d->t, &h);
    if (st != CFX_OK)
        return submit_failed("allgather", label, st);
    return finish(*ctx, h, "allgather", label, out->untyped_data(), out->size_bytes(),
                  " (inside jit every rank must contribute the same dim 0; gather ragged arrays "
                  "outside jit)");
}

// ---- broadcast: root's array into every rank's output ----
ffi::Error broadcast_impl(ffi::Token, ffi::AnyBuffer x, ffi::Result<ffi::Token>,
                          ffi::Result<ffi::AnyBuffer> out, int32_t root, std::string_view name_attr,
                          std::string_view label, int32_t set) {
    auto ctx = context("broadcast", label, set);
    if (ctx.has_error())
        return ctx.error();
    auto d = describe(x, "broadcast", label);
    if (d.has_error())
        return d.error();
    if (out->untyped_data() != x.untyped_data() && x.size_bytes() != 0)
        std::memcpy(out->untyped_data(), x.untyped_data(), x.size_bytes());
    d->t.data = out->untyped_data();
    d->t.shape = d->shape.data();
    std::string name(name_attr);
    cfx_handle h = 0;
    cfx_status st = cfx_broadcast_async(*ctx, engine_name(name), &d->t, root, &h);
    if (st != CFX_OK)
        return submit_failed("broadcast", label, st);
    return finish(*ctx, h, "broadcast", label);
}

// ---- alltoall: dim 0 split equally (the static output has the input's shape) ----
ffi::Error alltoall_impl(ffi::Token, ffi::AnyBuffer x, ffi::Result<ffi::Token>,
                         ffi::Result<ffi::AnyBuffer> out, std::string_view name_attr,
                         std::string_view label, int32_t set) {
    auto ctx = context("alltoall", label, set);
    if (ctx.has_error())
        return ctx.error();
    auto d = describe(x, "alltoall", label);
    if (d.has_error())
        return d.error();
    d->t.shape = d->shape.data();
    std::string name(name_attr);
    cfx_handle h = 0;
    cfx_status st = cfx_alltoall_async(*ctx, engine_name(name), &d->t, nullptr, 0, &h);
    if (st != CFX_OK)
        return submit_failed("alltoall", label, st);
    return finish(*ctx, h, "alltoall", label, out->untyped_data(), out->size_bytes(),
                  " (inside jit every rank must send equal splits)");
}

// ---- reducescatter: this rank's block of dim 0 (its extent computed by conflux.jax) ----
ffi::Error reducescatter_impl(ffi::Token, ffi::AnyBuffer x, ffi::Result<ffi::Token>,
                              ffi::Result<ffi::AnyBuffer> out, int32_t op, double prescale,
                              double postscale, std::string_view name_attr,
                              std::string_view label, int32_t set) {
    auto ctx = context("reducescatter", label, set);
    if (ctx.has_error())
        return ctx.error();
    auto d = describe(x, "reducescatter", label);
    if (d.has_error())
        return d.error();
    d->t.shape = d->shape.data();
    std::string name(name_attr);
    cfx_handle h = 0;
    cfx_status st = cfx_reducescatter_async(*ctx, engine_name(name), &d->t,
                                            static_cast<cfx_reduce_op>(op), prescale, postscale, &h);
    if (st != CFX_OK)
        return submit_failed("reducescatter", label, st);
    return finish(*ctx, h, "reducescatter", label, out->untyped_data(), out->size_bytes());
}

ffi::Error barrier_impl(ffi::Token, ffi::Result<ffi::Token>, int32_t set) {
    auto ctx = context("barrier", "", set);
    if (ctx.has_error())
        return ctx.error();
    cfx_handle h = 0;
    cfx_status st = cfx_barrier_async(*ctx, &h);
    if (st != CFX_OK)
        return submit_failed("barrier", "", st);
    return finish(*ctx, h, "barrier", "");
}

} // namespace

#define CFX_JAX_EXPORT __attribute__((visibility("default")))

// Sets (or, with NULL, clears) the context every handler uses: conflux.jax passes the address of
// conflux._core's cfx_context at init() and NULL at shutdown().
// Every process set is forgotten with it: a new or no context ends the sets of the old one.
extern "C" CFX_JAX_EXPORT void cfx_jax_set_context(void *ctx) {
    std::lock_guard<std::mutex> lock(g_sets_mu);
    g_sets.clear();
    g_ctx.store(static_cast<cfx_context *>(ctx), std::memory_order_release);
}

// Maps process set number `set` (> 0) to its subset context, or forgets it (NULL): conflux.jax's
// ProcessSet calls it when the set is made (on its members) and freed.
extern "C" CFX_JAX_EXPORT void cfx_jax_set_subset(int32_t set, void *ctx) {
    std::lock_guard<std::mutex> lock(g_sets_mu);
    if (ctx == nullptr)
        g_sets.erase(set);
    else
        g_sets[set] = static_cast<cfx_context *>(ctx);
}

extern "C" CFX_JAX_EXPORT void *cfx_jax_context(void) { return g_ctx.load(); }

// The handler symbols (extern "C"; XLA_FFI_DEFINE_HANDLER_SYMBOL declares them).
#define CFX_JAX_HANDLER(sym, impl, binding) \
    extern "C" CFX_JAX_EXPORT XLA_FFI_Error *sym(XLA_FFI_CallFrame *); \
    XLA_FFI_DEFINE_HANDLER_SYMBOL(sym, impl, binding)

CFX_JAX_HANDLER(cfx_jax_allreduce, allreduce_impl,
                ffi::Ffi::Bind()
                    .Arg<ffi::Token>()
                    .RemainingArgs()
                    .Ret<ffi::Token>()
                    .RemainingRets()
                    .Attr<int32_t>("op")
                    .Attr<double>("prescale")
                    .Attr<double>("postscale")
                    .Attr<int32_t>("compression")
                    .Attr<std::string_view>("name")
                    .Attr<std::string_view>("label")
                    .Attr<int32_t>("set"));

// The binding of a one-array collective: the effect's token and the array in, the token and the
// result out (the attributes follow, in the order of the handler's parameters).
static auto one_array()
{
    return ffi::Ffi::Bind().Arg<ffi::Token>().Arg<ffi::AnyBuffer>().Ret<ffi::Token>().Ret<ffi::AnyBuffer>();
}

CFX_JAX_HANDLER(cfx_jax_allgather, allgather_impl,
                one_array()
                    .Attr<std::string_view>("name")
                    .Attr<std::string_view>("label")
                    .Attr<int32_t>("set"));

CFX_JAX_HANDLER(cfx_jax_broadcast, broadcast_impl,
                one_array()
                    .Attr<int32_t>("root")
                    .Attr<std::string_view>("name")
                    .Attr<std::string_view>("label")
                    .Attr<int32_t>("set"));

CFX_JAX_HANDLER(cfx_jax_alltoall, alltoall_impl,
                one_array()
                    .Attr<std::string_view>("name")
                    .Attr<std::string_view>("label")
                    .Attr<int32_t>("set"));

CFX_JAX_HANDLER(cfx_jax_reducescatter, reducescatter_impl,
                one_array()
                    .Attr<int32_t>("op")
                    .Attr<double>("prescale")
                    .Attr<double>("postscale")
                    .Attr<std::string_view>("name")
                    .Attr<std::string_view>("label")
                    .Attr<int32_t>("set"));

CFX_JAX_HANDLER(cfx_jax_barrier, barrier_impl,
                ffi::Ffi::Bind().Arg<ffi::Token>().Ret<ffi::Token>().Attr<int32_t>("set"));
