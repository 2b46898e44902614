// TensorFlow custom ops of conflux.tensorflow: the kernels a TF program (eager or tf.function) runs
// for Conflux's collectives, straight into the C ABI on the job's context, with no Python in the
// data path. Owns: the op registrations (CfxAllreduce, CfxGroupedAllreduce, CfxAllgather,
// CfxBroadcast, CfxAlltoall, CfxReducescatter, CfxJoin, CfxBarrier, CfxRank, CfxSize,
// CfxLocalRank, CfxLocalSize), their CPU kernels, the mapping of TF dtypes onto cfx_dtype and of
// cfx_status onto TF status codes, the one waiter thread that completes every kernel, the cache
// of shared-memory blocks the grouped allreduce's outputs live in, and the pointer to the context
// they use (set by cfx_tf_set_context() from conflux.tensorflow.init())
// with the process sets' contexts (cfx_tf_set_process_set()).
// Loaded twice by conflux/tensorflow/_ops.py: tf.load_op_library (the ops) and ctypes (the
// extern "C" functions at the end); both resolve to the same loaded object.
//
// Each collective kernel is an AsyncOpKernel: ComputeAsync describes the tensors, submits to the
// engine and hands the handles to the waiter thread, which polls them (and lets cfx_wait drive the
// negotiation while nothing completes) and, once all of a kernel's handles completed, copies the
// engine-allocated outputs into TF tensors, releases the handles and calls TF's done callback. No
// TF thread blocks on the network, so graphs with many collectives never starve TF's pools, and
// a collective whose peers are late never holds up one that completed.
//
// Names: the `tensor_name` attr is the engine's name (conflux.tensorflow sets one from the op's
// name inside tf.function, where the executor may run ops in any order); "" submits unnamed
// (named by submission order, which eager mode keeps the same on every rank).
//
// The context pointer is process-wide on purpose: a tf.function traced before shutdown()/init()
// keeps its kernels, so they find the context through the library, not through an attr.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "conflux/conflux.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

#ifndef CFX_TF_BUILT_VERSION
#define CFX_TF_BUILT_VERSION "unknown"
#endif

namespace tf = tensorflow;
using tf::shape_inference::InferenceContext;

namespace {

std::atomic<cfx_context *> g_ctx{nullptr};

// Process sets: id -> the set's subset context (conflux.process_sets.Subset), registered by
// conflux.tensorflow when an op for the set is made and cleared when the set is removed. The id is
// an op attr (Horovod's process_set_id), so a traced graph finds the set's current context.
std::mutex g_sets_mu;
std::unordered_map<int64_t, cfx_context *> g_sets;

// ---- statuses and dtypes ----

absl::StatusCode tf_code(cfx_status st) {
    switch (st) {
    case CFX_ERR_INVALID_ARGUMENT:
    case CFX_ERR_DUPLICATE_NAME: return absl::StatusCode::kInvalidArgument;
    case CFX_ERR_NOT_INITIALIZED:
    case CFX_ERR_MISMATCH:
    case CFX_ERR_JOINED: return absl::StatusCode::kFailedPrecondition;
    case CFX_ERR_SHUT_DOWN: return absl::StatusCode::kAborted;
    case CFX_ERR_UNSUPPORTED: return absl::StatusCode::kUnimplemented;
    case CFX_ERR_OUT_OF_MEMORY: return absl::StatusCode::kResourceExhausted;
    case CFX_ERR_TIMEOUT:
    case CFX_ERR_STALL: return absl::StatusCode::kDeadlineExceeded;
    // What elastic training recovers from (conflux.tensorflow.elastic maps them back).
    case CFX_ERR_PEER_LOST:
    case CFX_ERR_TRANSPORT:
    case CFX_ERR_MEMBERSHIP_CHANGED: return absl::StatusCode::kUnavailable;
    default: return absl::StatusCode::kInternal;
    }
}

// "conflux.tensorflow.allreduce of 'w': mismatch across ranks [MISMATCH]: <detail>": the status
// name in brackets lets conflux.tensorflow raise the matching ConfluxError subclass.
absl::Status cfx_error(const std::string &what, cfx_status st, const char *detail) {
    std::string msg = what + ": " + cfx_status_string(st);
    const char *name = cfx_status_name(st);
    if (name != nullptr) {
        msg += " [";
        msg += name;
        msg += "]";
    }
    if (detail != nullptr && *detail != '\0') {
        msg += ": ";
        msg += detail;
    }
    return absl::Status(tf_code(st), msg);
}

int32_t to_cfx_dtype(tf::DataType t) {
    switch (t) {
    case tf::DT_BOOL: return CFX_BOOL;
    case tf::DT_INT8: return CFX_INT8;
    case tf::DT_UINT8: return CFX_UINT8;
    case tf::DT_INT16: return CFX_INT16;
    case tf::DT_UINT16: return CFX_UINT16;
    case tf::DT_INT32: return CFX_INT32;
    case tf::DT_INT64: return CFX_INT64;
    case tf::DT_HALF: return CFX_FLOAT16;
    case tf::DT_BFLOAT16: return CFX_BFLOAT16;
    case tf::DT_FLOAT: return CFX_FLOAT32;
    case tf::DT_DOUBLE: return CFX_FLOAT64;
    default: return -1;
    }
}

// A cfx_tensor over a TF tensor's buffer; `shape` keeps the extents alive while it is submitted.
struct Described {
    cfx_tensor t;
    std::vector<int64_t> shape;
};

absl::Status describe(const tf::Tensor &x, const std::string &what, Described *d) {
    int32_t dt = to_cfx_dtype(x.dtype());
    if (dt < 0)
        return absl::InvalidArgumentError(what + ": dtype " + tf::DataTypeString(x.dtype()) +
                                          " is not one Conflux reduces");
    d->shape.clear();
    for (int i = 0; i < x.dims(); ++i)
        d->shape.push_back(x.dim_size(i));
    std::memset(&d->t, 0, sizeof d->t);
    d->t.data = const_cast<char *>(x.tensor_data().data());
    d->t.shape = d->shape.data();
    d->t.ndim = static_cast<int32_t>(d->shape.size());
    d->t.dtype = dt;
    d->t.device = CFX_DEVICE_CPU;
    return absl::OkStatus();
}

// ---- the waiter thread ----

// One kernel's submissions: complete when every handle has; `finish` then reads the outputs,
// releases the handles and calls TF's done.
struct Pending {
    cfx_context *ctx;
    std::vector<cfx_handle> handles;
    std::function<void(Pending &)> finish;
};

class Waiter {
  public:
    static Waiter &get() {
        // Never destroyed: a detached thread must not outlive its object at exit.
        static Waiter *w = new Waiter();
        return *w;
    }

    void add(std::unique_ptr<Pending> p) {
        {
            std::lock_guard<std::mutex> lk(mu_);
            pending_.push_back(std::move(p));
        }
        cv_.notify_all();
    }

    // Waits until nothing is pending (after cfx_shutdown every handle completes).
    bool drain(double timeout_s) {
        std::unique_lock<std::mutex> lk(mu_);
        return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                            [this] { return pending_.empty() && running_ == 0; });
    }

  private:
    Waiter() { std::thread([this] { loop(); }).detach(); }

    static bool complete(const Pending &p) {
        for (cfx_handle h : p.handles) {
            int done = 0;
            if (cfx_poll(p.ctx, h, &done) == CFX_OK && !done)
                return false;
        }
        return true;
    }

    void loop() {
        for (;;) {
            std::vector<std::unique_ptr<Pending>> ready;
            cfx_context *wait_ctx = nullptr;
            cfx_handle wait_h = 0;
            {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [this] { return !pending_.empty(); });
                for (auto it = pending_.begin(); it != pending_.end();) {
                    if (complete(**it)) {
                        ready.push_back(std::move(*it));
                        it = pending_.erase(it);
                    } else {
                        ++it;
                    }
                }
                if (ready.empty()) {
                    // Nothing finished: wait a little on the oldest unfinished handle, which also
                    // lets this thread run the negotiation (cfx_wait's contract).
                    const Pending &p = *pending_.front();
                    for (cfx_handle h : p.handles) {
                        int done = 0;
                        if (cfx_poll(p.ctx, h, &done) == CFX_OK && !done) {
                            wait_ctx = p.ctx;
                            wait_h = h;
                            break;
                        }
                    }
                }
                running_ += ready.size();
            }
            for (auto &p : ready)
                p->finish(*p);
            if (!ready.empty()) {
                {
                    std::lock_guard<std::mutex> lk(mu_);
                    running_ -= ready.size();
                }
                cv_.notify_all();
            }
            if (wait_ctx != nullptr)
                cfx_wait(wait_ctx, wait_h, 0.002);
        }
    }

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Pending>> pending_;
    size_t running_ = 0;
};

// The status of a completed handle as a TF status (OK or the collective's error).
absl::Status handle_status(cfx_context *ctx, cfx_handle h, const std::string &what) {
    cfx_status st = cfx_handle_status(ctx, h);
    if (st == CFX_OK)
        return absl::OkStatus();
    return cfx_error(what, st, cfx_handle_message(ctx, h));
}

void release_all(Pending &p) {
    for (cfx_handle h : p.handles)
        cfx_handle_release(p.ctx, h);
}

// Copies output 0 of a completed handle into a new TF output `index` of the engine's shape.
absl::Status copy_output(tf::OpKernelContext *c, cfx_context *ctx, cfx_handle h, int index,
                         const std::string &what) {
    cfx_tensor o;
    cfx_status st = cfx_handle_output(ctx, h, 0, &o);
    if (st != CFX_OK)
        return cfx_error(what + " (reading the result)", st, cfx_last_error());
    tf::TensorShape shape;
    size_t bytes = cfx_dtype_size(static_cast<cfx_dtype>(o.dtype));
    for (int32_t i = 0; i < o.ndim; ++i) {
        shape.AddDim(o.shape[i]);
        bytes *= static_cast<size_t>(o.shape[i]);
    }
    tf::Tensor *out = nullptr;
    absl::Status s = c->allocate_output(index, shape, &out);
    if (!s.ok())
        return s;
    if (bytes != 0)
        std::memcpy(const_cast<char *>(out->tensor_data().data()), o.data, bytes);
    return absl::OkStatus();
}

// ---- outputs in shared tensor memory ----
//
// A reduction on a host of several ranks is fastest when every rank's tensors lie in shared tensor
// memory (cfx_alloc): the engine's direct path reads them where they are and writes the result
// into them, with no copies into and out of its slots. TF allocates the gradients, so the grouped
// allreduce copies its inputs once into one block of that memory, reduces there in place, and its
// outputs are views of the block. The block goes back to a small cache when its last view is
// released: the next step's block is the same one, its pages already mapped (a fresh block of
// ResNet-50's 100 MB would fault every page in again, each step).

constexpr size_t kSharedMinBytes = 1 << 20;  // below it the slots' copies cost next to nothing
constexpr size_t kSharedAlign = 64;          // cfx_alloc's alignment, and Eigen's
constexpr size_t kCachedBlocks = 2;          // blocks kept for reuse, the least recent freed

class SharedBlock {
  public:
    // A block of `bytes` (a cached one of that size, else a new one), with one reference;
    // nullptr when the pool has no room (the caller then takes the copies).
    static SharedBlock *take(size_t bytes) {
        {
            std::lock_guard<std::mutex> lk(cache_mu());
            auto &cache = cached();
            for (auto it = cache.begin(); it != cache.end(); ++it) {
                if ((*it)->bytes_ == bytes) {
                    SharedBlock *b = *it;
                    cache.erase(it);
                    b->refs_.store(1);
                    return b;
                }
            }
        }
        void *p = nullptr;
        if (cfx_alloc(bytes, &p) != CFX_OK)
            return nullptr;
        return new SharedBlock(static_cast<char *>(p), bytes);
    }

    void ref() { refs_.fetch_add(1, std::memory_order_relaxed); }

    // The last reference puts the block into the cache (freeing the least recent one past
    // kCachedBlocks).
    void unref() {
        if (refs_.fetch_sub(1, std::memory_order_acq_rel) != 1)
            return;
        SharedBlock *evicted = nullptr;
        {
            std::lock_guard<std::mutex> lk(cache_mu());
            auto &cache = cached();
            cache.push_back(this);
            if (cache.size() > kCachedBlocks) {
                evicted = cache.front();
                cache.erase(cache.begin());
            }
        }
        if (evicted != nullptr) {
            cfx_free(evicted->data_);
            delete evicted;
        }
    }

    char *data() const { return data_; }

  private:
    SharedBlock(char *data, size_t bytes) : data_(data), bytes_(bytes) {}
    static std::mutex &cache_mu() {
        static std::mutex *m = new std::mutex();  // never destroyed: blocks outlive static order
        return *m;
    }
    static std::vector<SharedBlock *> &cached() {
        static auto *v = new std::vector<SharedBlock *>();
        return *v;
    }

    char *data_;
    size_t bytes_;
    std::atomic<int> refs_{1};
};

// A TF tensor's buffer: `size` bytes at `offset` of a shared block, holding a reference to it.
class SharedSlice : public tf::TensorBuffer {
  public:
    SharedSlice(SharedBlock *block, size_t offset, size_t size)
        : tf::TensorBuffer(block->data() + offset), block_(block), size_(size) {
        block_->ref();
    }
    ~SharedSlice() override { block_->unref(); }
    size_t size() const override { return size_; }
    tf::TensorBuffer *root_buffer() override { return this; }
    void FillAllocationDescription(tf::AllocationDescription *proto) const override {
        proto->set_requested_bytes(static_cast<int64_t>(size_));
        proto->set_allocator_name("conflux_shared");
    }

  private:
    SharedBlock *block_;
    size_t size_;
};

// ---- the kernels ----

class CfxKernel : public tf::AsyncOpKernel {
  public:
    CfxKernel(tf::OpKernelConstruction *c, const char *op) : tf::AsyncOpKernel(c), op_(op) {
        if (c->HasAttr("tensor_name"))
            OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
        if (c->HasAttr("process_set_id"))
            OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
        what_ = std::string("conflux.tensorflow.") + op_;
        if (!tensor_name_.empty())
            what_ += " of '" + tensor_name_ + "'";
    }

  protected:
    const char *engine_name() const { return tensor_name_.empty() ? nullptr : tensor_name_.c_str(); }

    // The context (the process set's, for a set), or fails the kernel (and calls done) and
    // returns NULL.
    cfx_context *context(tf::OpKernelContext *c, const DoneCallback &done) {
        cfx_context *ctx = g_ctx.load(std::memory_order_acquire);
        if (ctx == nullptr) {
            c->SetStatus(absl::FailedPreconditionError(
                what_ + ": Conflux is not initialized; call conflux.tensorflow.init() first"));
            done();
            return nullptr;
        }
        if (process_set_id_ == 0)
            return ctx;
        {
            std::lock_guard<std::mutex> lk(g_sets_mu);
            auto it = g_sets.find(process_set_id_);
            ctx = it == g_sets.end() ? nullptr : it->second;
        }
        if (ctx == nullptr) {
            c->SetStatus(absl::FailedPreconditionError(
                what_ + ": process set " + std::to_string(process_set_id_) +
                " is not registered on this rank (removed, or this rank is not in it)"));
            done();
        }
        return ctx;
    }

    // Ends a failed submission: the error now, on this thread.
    void submit_failed(tf::OpKernelContext *c, cfx_status st, const DoneCallback &done) {
        c->SetStatus(cfx_error(what_, st, cfx_last_error()));
        done();
    }

    // Ends the submission of one collective: its failure now, else the waiter completes the kernel
    // once it is done (`outputs` as in await).
    void submitted(tf::OpKernelContext *c, cfx_context *ctx, cfx_status st, cfx_handle h,
                   DoneCallback done,
                   std::function<absl::Status(tf::OpKernelContext *, Pending &)> outputs = nullptr) {
        if (st != CFX_OK)
            return submit_failed(c, st, done);
        await(c, ctx, {h}, std::move(done), std::move(outputs));
    }

    // The outputs of a collective whose one result the engine allocated: into output 0.
    std::function<absl::Status(tf::OpKernelContext *, Pending &)> engine_output() const {
        std::string what = what_;
        return [what](tf::OpKernelContext *k, Pending &p) {
            return copy_output(k, p.ctx, p.handles[0], 0, what);
        };
    }

    // Hands `handles` to the waiter; once they completed, `outputs` (may be empty) fills the
    // outputs of a successful collective, and done() is called.
    void await(tf::OpKernelContext *c, cfx_context *ctx, std::vector<cfx_handle> handles,
               DoneCallback done,
               std::function<absl::Status(tf::OpKernelContext *, Pending &)> outputs = nullptr) {
        auto p = std::make_unique<Pending>();
        p->ctx = ctx;
        p->handles = std::move(handles);
        std::string what = what_;
        p->finish = [c, done = std::move(done), outputs = std::move(outputs),
                     what = std::move(what)](Pending &pp) {
            absl::Status s = absl::OkStatus();
            for (cfx_handle h : pp.handles) {
                s = handle_status(pp.ctx, h, what);
                if (!s.ok())
                    break;
            }
            if (s.ok() && outputs)
                s = outputs(c, pp);
            release_all(pp);
            if (!s.ok())
                c->SetStatus(s);
            done();
        };
        Waiter::get().add(std::move(p));
    }

    std::string tensor_name_;
    std::string what_;
    const char *op_;
    int64_t process_set_id_ = 0;
};

// The reduction attrs shared by allreduce, grouped allreduce and reducescatter.
struct ReduceAttrs {
    int op = CFX_OP_SUM;
    float prescale = 1.0f;
    float postscale = 1.0f;
    int compression = CFX_COMPRESSION_NONE;
    void read(tf::OpKernelConstruction *c) {
        OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
        OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale));
        OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale));
        if (c->HasAttr("compression"))
            OP_REQUIRES_OK(c, c->GetAttr("compression", &compression));
    }
    cfx_allreduce_options options() const {
        cfx_allreduce_options o;
        cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION);
        o.op = op;
        o.prescale = prescale;
        o.postscale = postscale;
        o.compression = compression;
        return o;
    }
};

class AllreduceOp : public CfxKernel {
  public:
    explicit AllreduceOp(tf::OpKernelConstruction *c) : CfxKernel(c, "allreduce") { attrs_.read(c); }

    void ComputeAsync(tf::OpKernelContext *c, DoneCallback done) override {
        cfx_context *ctx = context(c, done);
        if (ctx == nullptr)
            return;
        const tf::Tensor &in = c->input(0);
        tf::Tensor *out = nullptr;
        OP_REQUIRES_OK_ASYNC(c, c->forward_input_or_allocate_output({0}, 0, in.shape(), &out), done);
        Described d;
        OP_REQUIRES_OK_ASYNC(c, describe(in, what_, &d), done);
        cfx_allreduce_options o = attrs_.options();
        cfx_handle h = 0;
        cfx_status st = cfx_allreduce_async_opts(ctx, engine_name(), &d.t,
                                                 const_cast<char *>(out->tensor_data().data()), &o, &h);
        submitted(c, ctx, st, h, std::move(done));
    }

  private:
    ReduceAttrs attrs_;
};

// N tensors, one submission (one negotiation, fused together); with compression one handle per
// tensor (the grouped call takes none), all submitted before any is waited for.
class GroupedAllreduceOp : public CfxKernel {
  public:
    explicit GroupedAllreduceOp(tf::OpKernelConstruction *c) : CfxKernel(c, "grouped_allreduce") {
        attrs_.read(c);
    }

    void ComputeAsync(tf::OpKernelContext *c, DoneCallback done) override {
        cfx_context *ctx = context(c, done);
        if (ctx == nullptr)
            return;
        int n = c->num_inputs();
        std::vector<Described> ds(n);
        std::vector<cfx_tensor> ts(n);
        std::vector<void *> outs(n);
        for (int i = 0; i < n; ++i)
            OP_REQUIRES_OK_ASYNC(c, describe(c->input(i), what_, &ds[i]), done);
        if (n == 0) {
            done();
            return;
        }
        // The shared block (if the outputs are views of one) stays referenced until the kernel
        // completes, whatever TF does with the outputs meanwhile.
        std::shared_ptr<SharedBlock> block = shared_outputs(c, ctx, ds, outs);
        if (!block) {
            for (int i = 0; i < n; ++i) {
                tf::Tensor *out = nullptr;
                OP_REQUIRES_OK_ASYNC(
                    c, c->forward_input_or_allocate_output({i}, i, c->input(i).shape(), &out), done);
                outs[i] = const_cast<char *>(out->tensor_data().data());
            }
        }
        for (int i = 0; i < n; ++i)
            ts[i] = ds[i].t;
        auto keep = [block](tf::OpKernelContext *, Pending &) { return absl::OkStatus(); };
        std::vector<cfx_handle> hs;
        if (attrs_.compression == CFX_COMPRESSION_NONE) {
            cfx_handle h = 0;
            cfx_status st = cfx_grouped_allreduce_async(
                ctx, engine_name(), static_cast<size_t>(n), ts.data(), outs.data(),
                static_cast<cfx_reduce_op>(attrs_.op), attrs_.prescale, attrs_.postscale, &h);
            if (st != CFX_OK)
                return submit_failed(c, st, done);
            hs.push_back(h);
        } else {
            cfx_allreduce_options o = attrs_.options();
            for (int i = 0; i < n; ++i) {
                std::string nm = tensor_name_.empty() ? "" : tensor_name_ + "." + std::to_string(i);
                cfx_handle h = 0;
                cfx_status st = cfx_allreduce_async_opts(ctx, nm.empty() ? nullptr : nm.c_str(),
                                                         &ts[i], outs[i], &o, &h);
                if (st != CFX_OK) {
                    // Those already submitted still complete (and are released) before done.
                    c->SetStatus(cfx_error(what_, st, cfx_last_error()));
                    break;
                }
                hs.push_back(h);
            }
            if (hs.empty()) {
                done();
                return;
            }
        }
        await(c, ctx, std::move(hs), std::move(done), keep);
    }

  private:
    // Outputs as views of one block of shared tensor memory holding a copy of the inputs, which
    // then become those views too (reduced in place): where the engine's direct path can take
    // them (several local ranks, no prescale, no compression: every rank decides alike) and the
    // copy is worth it. Otherwise (or when the pool has no room) nullptr, and nothing was set.
    std::shared_ptr<SharedBlock> shared_outputs(tf::OpKernelContext *c, cfx_context *ctx,
                                                std::vector<Described> &ds,
                                                std::vector<void *> &outs) {
        if (attrs_.compression != CFX_COMPRESSION_NONE || attrs_.prescale != 1.0f ||
            cfx_local_size(ctx) < 2)
            return nullptr;
        int n = static_cast<int>(ds.size());
        std::vector<size_t> offset(n);
        size_t total = 0;
        for (int i = 0; i < n; ++i) {
            offset[i] = total;
            total += (c->input(i).TotalBytes() + kSharedAlign - 1) / kSharedAlign * kSharedAlign;
        }
        if (total < kSharedMinBytes)
            return nullptr;
        SharedBlock *raw = SharedBlock::take(total);
        if (raw == nullptr)
            return nullptr;
        std::shared_ptr<SharedBlock> block(raw, [](SharedBlock *b) { b->unref(); });
        for (int i = 0; i < n; ++i) {
            const tf::Tensor &in = c->input(i);
            size_t bytes = in.TotalBytes();
            char *at = block->data() + offset[i];
            if (bytes != 0)
                std::memcpy(at, in.tensor_data().data(), bytes);
            tf::core::RefCountPtr<tf::TensorBuffer> buf(new SharedSlice(block.get(), offset[i], bytes));
            c->set_output(i, tf::Tensor(in.dtype(), in.shape(), std::move(buf)));
            ds[i].t.data = at;
            outs[i] = at;
        }
        return block;
    }

    ReduceAttrs attrs_;
};

class AllgatherOp : public CfxKernel {
  public:
    explicit AllgatherOp(tf::OpKernelConstruction *c) : CfxKernel(c, "allgather") {}

    void ComputeAsync(tf::OpKernelContext *c, DoneCallback done) override {
        cfx_context *ctx = context(c, done);
        if (ctx == nullptr)
            return;
        Described d;
        OP_REQUIRES_OK_ASYNC(c, describe(c->input(0), what_, &d), done);
        OP_REQUIRES_ASYNC(c, d.t.ndim >= 1,
                          absl::InvalidArgumentError(what_ + ": needs at least one dimension"), done);
        cfx_handle h = 0;
        cfx_status st = cfx_allgather_async(ctx, engine_name(), &d.t, &h);
        submitted(c, ctx, st, h, std::move(done), engine_output());
    }
};

class BroadcastOp : public CfxKernel {
  public:
    explicit BroadcastOp(tf::OpKernelConstruction *c) : CfxKernel(c, "broadcast") {
        OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_));
    }

    void ComputeAsync(tf::OpKernelContext *c, DoneCallback done) override {
        cfx_context *ctx = context(c, done);
        if (ctx == nullptr)
            return;
        const tf::Tensor &in = c->input(0);
        tf::Tensor *out = nullptr;
        OP_REQUIRES_OK_ASYNC(c, c->forward_input_or_allocate_output({0}, 0, in.shape(), &out), done);
        if (out->tensor_data().data() != in.tensor_data().data() && in.TotalBytes() != 0)
            std::memcpy(const_cast<char *>(out->tensor_data().data()), in.tensor_data().data(),
                        in.tensor_data().size());
        Described d;
        OP_REQUIRES_OK_ASYNC(c, describe(*out, what_, &d), done);
        cfx_handle h = 0;
        cfx_status st = cfx_broadcast_async(ctx, engine_name(), &d.t, root_, &h);
        submitted(c, ctx, st, h, std::move(done));
    }

  private:
    int root_ = 0;
};

class AlltoallOp : public CfxKernel {
  public:
    explicit AlltoallOp(tf::OpKernelConstruction *c) : CfxKernel(c, "alltoall") {}

    void ComputeAsync(tf::OpKernelContext *c, DoneCallback done) override {
        cfx_context *ctx = context(c, done);
        if (ctx == nullptr)
            return;
        Described d;
        OP_REQUIRES_OK_ASYNC(c, describe(c->input(0), what_, &d), done);
        OP_REQUIRES_ASYNC(c, d.t.ndim >= 1,
                          absl::InvalidArgumentError(what_ + ": needs at least one dimension"), done);
        const tf::Tensor &splits = c->input(1);
        std::vector<int64_t> sp;
        auto flat = splits.flat<int64_t>();
        for (int64_t i = 0; i < flat.size(); ++i)
            sp.push_back(flat(i));
        cfx_handle h = 0;
        cfx_status st = cfx_alltoall_async(ctx, engine_name(), &d.t, sp.empty() ? nullptr : sp.data(),
                                           sp.size(), &h);
        if (st != CFX_OK)
            return submit_failed(c, st, done);
        std::string what = what_;
        await(c, ctx, {h}, std::move(done), [what](tf::OpKernelContext *k, Pending &p) {
            absl::Status s = copy_output(k, p.ctx, p.handles[0], 0, what);
            if (!s.ok())
                return s;
            const int64_t *rs = nullptr;
            cfx_status st2 = cfx_handle_splits(p.ctx, p.handles[0], 0, &rs);
            if (st2 != CFX_OK)
                return cfx_error(what + " (reading the splits)", st2, cfx_last_error());
            int n = cfx_size(p.ctx);
            tf::Tensor *out = nullptr;
            s = k->allocate_output(1, tf::TensorShape({n}), &out);
            if (!s.ok())
                return s;
            auto o = out->flat<int32_t>();
            for (int i = 0; i < n; ++i)
                o(i) = static_cast<int32_t>(rs[i]);
            return absl::OkStatus();
        });
    }
};

class ReducescatterOp : public CfxKernel {
  public:
    explicit ReducescatterOp(tf::OpKernelConstruction *c) : CfxKernel(c, "reducescatter") {
        attrs_.read(c);
    }

    void ComputeAsync(tf::OpKernelContext *c, DoneCallback done) override {
        cfx_context *ctx = context(c, done);
        if (ctx == nullptr)
            return;
        Described d;
        OP_REQUIRES_OK_ASYNC(c, describe(c->input(0), what_, &d), done);
        OP_REQUIRES_ASYNC(c, d.t.ndim >= 1,
                          absl::InvalidArgumentError(what_ + ": needs at least one dimension"), done);
        cfx_handle h = 0;
        cfx_status st = cfx_reducescatter_async(ctx, engine_name(), &d.t,
                                                static_cast<cfx_reduce_op>(attrs_.op),
                                                attrs_.prescale, attrs_.postscale, &h);
        submitted(c, ctx, st, h, std::move(done), engine_output());
    }

  private:
    ReduceAttrs attrs_;
};

class JoinOp : public CfxKernel {
  public:
    explicit JoinOp(tf::OpKernelConstruction *c) : CfxKernel(c, "join") {}

    void ComputeAsync(tf::OpKernelContext *c, DoneCallback done) override {
        cfx_context *ctx = context(c, done);
        if (ctx == nullptr)
            return;
        cfx_handle h = 0;
        cfx_status st = cfx_join_async(ctx, &h);
        if (st != CFX_OK)
            return submit_failed(c, st, done);
        std::string what = what_;
        await(c, ctx, {h}, std::move(done), [what](tf::OpKernelContext *k, Pending &p) {
            int last = -1;
            cfx_status st2 = cfx_handle_join_rank(p.ctx, p.handles[0], &last);
            if (st2 != CFX_OK)
                return cfx_error(what, st2, cfx_last_error());
            tf::Tensor *out = nullptr;
            absl::Status s = k->allocate_output(0, tf::TensorShape({}), &out);
            if (s.ok())
                out->scalar<int32_t>()() = last;
            return s;
        });
    }
};

class BarrierOp : public CfxKernel {
  public:
    explicit BarrierOp(tf::OpKernelConstruction *c) : CfxKernel(c, "barrier") {}

    void ComputeAsync(tf::OpKernelContext *c, DoneCallback done) override {
        cfx_context *ctx = context(c, done);
        if (ctx == nullptr)
            return;
        cfx_handle h = 0;
        cfx_status st = cfx_barrier_async(ctx, &h);
        submitted(c, ctx, st, h, std::move(done));
    }
};

// rank/size/local_rank/local_size: read when the op runs (a tf.function traced before an elastic
// reform reads the new world).
template <int (*Fn)(const cfx_context *)>
class TopologyOp : public tf::OpKernel {
  public:
    explicit TopologyOp(tf::OpKernelConstruction *c) : tf::OpKernel(c) {}

    void Compute(tf::OpKernelContext *c) override {
        cfx_context *ctx = g_ctx.load(std::memory_order_acquire);
        OP_REQUIRES(c, ctx != nullptr,
                    absl::FailedPreconditionError(
                        "conflux.tensorflow: Conflux is not initialized; call conflux.tensorflow.init() first"));
        tf::Tensor *out = nullptr;
        OP_REQUIRES_OK(c, c->allocate_output(0, tf::TensorShape({}), &out));
        out->scalar<int32_t>()() = Fn(ctx);
    }
};

// ---- shape functions ----

absl::Status unknown_first_dim(InferenceContext *c) {
    tf::shape_inference::ShapeHandle in = c->input(0);
    if (!c->RankKnown(in)) {
        c->set_output(0, c->UnknownShape());
        return absl::OkStatus();
    }
    tf::shape_inference::ShapeHandle out;
    TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, c->UnknownDim(), &out));
    c->set_output(0, out);
    return absl::OkStatus();
}

absl::Status scalar_shape(InferenceContext *c) {
    c->set_output(0, c->Scalar());
    return absl::OkStatus();
}

} // namespace

#define CFX_TF_TYPES "{uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double, bool}"

// Every op is stateful: never constant-folded, deduplicated or pruned (each is a message to the
// other ranks, which wait for it).
REGISTER_OP("CfxAllreduce")
    .Attr("T: " CFX_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("compression: int = 0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("sum: T")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::UnchangedShape);

REGISTER_OP("CfxGroupedAllreduce")
    .Attr("T: list(" CFX_TF_TYPES ") >= 0")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("compression: int = 0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("sums: T")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext *c) {
        for (int i = 0; i < c->num_inputs(); ++i)
            c->set_output(i, c->input(i));
        return absl::OkStatus();
    });

REGISTER_OP("CfxAllgather")
    .Attr("T: " CFX_TF_TYPES)
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(unknown_first_dim);

REGISTER_OP("CfxBroadcast")
    .Attr("T: " CFX_TF_TYPES)
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::UnchangedShape);

REGISTER_OP("CfxAlltoall")
    .Attr("T: " CFX_TF_TYPES)
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int64")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext *c) {
        TF_RETURN_IF_ERROR(unknown_first_dim(c));
        c->set_output(1, c->Vector(c->UnknownDim()));
        return absl::OkStatus();
    });

REGISTER_OP("CfxReducescatter")
    .Attr("T: " CFX_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(unknown_first_dim);

REGISTER_OP("CfxJoin").Output("last_joined_rank: int32").SetIsStateful().SetShapeFn(scalar_shape);
REGISTER_OP("CfxBarrier")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::NoOutputs);
REGISTER_OP("CfxRank").Output("rank: int32").SetIsStateful().SetShapeFn(scalar_shape);
REGISTER_OP("CfxSize").Output("size: int32").SetIsStateful().SetShapeFn(scalar_shape);
REGISTER_OP("CfxLocalRank").Output("local_rank: int32").SetIsStateful().SetShapeFn(scalar_shape);
REGISTER_OP("CfxLocalSize").Output("local_size: int32").SetIsStateful().SetShapeFn(scalar_shape);

REGISTER_KERNEL_BUILDER(Name("CfxAllreduce").Device(tf::DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("CfxGroupedAllreduce").Device(tf::DEVICE_CPU), GroupedAllreduceOp);
REGISTER_KERNEL_BUILDER(Name("CfxAllgather").Device(tf::DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("CfxBroadcast").Device(tf::DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("CfxAlltoall").Device(tf::DEVICE_CPU), AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("CfxReducescatter").Device(tf::DEVICE_CPU), ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("CfxJoin").Device(tf::DEVICE_CPU), JoinOp);
REGISTER_KERNEL_BUILDER(Name("CfxBarrier").Device(tf::DEVICE_CPU), BarrierOp);
REGISTER_KERNEL_BUILDER(Name("CfxRank").Device(tf::DEVICE_CPU), TopologyOp<cfx_rank>);
REGISTER_KERNEL_BUILDER(Name("CfxSize").Device(tf::DEVICE_CPU), TopologyOp<cfx_size>);
REGISTER_KERNEL_BUILDER(Name("CfxLocalRank").Device(tf::DEVICE_CPU), TopologyOp<cfx_local_rank>);
REGISTER_KERNEL_BUILDER(Name("CfxLocalSize").Device(tf::DEVICE_CPU), TopologyOp<cfx_local_size>);

#define CFX_TF_EXPORT extern "C" __attribute__((visibility("default")))

// Sets (or, with NULL, clears) the context every kernel uses: conflux.tensorflow passes the
// address of conflux._core's cfx_context at init().
CFX_TF_EXPORT void cfx_tf_set_context(void *ctx) {
    g_ctx.store(static_cast<cfx_context *>(ctx), std::memory_order_release);
}

// Before the context is freed: clears it, shuts it down (every pending handle then completes)
// and waits up to timeout_s for the waiter to finish every kernel. 1 when it did, 0 on timeout.
CFX_TF_EXPORT int cfx_tf_quiesce(double timeout_s) {
    cfx_context *ctx = g_ctx.exchange(nullptr);
    if (ctx != nullptr)
        cfx_shutdown(ctx);
    return Waiter::get().drain(timeout_s) ? 1 : 0;
}

// Registers (or, with NULL, forgets) the context of process set `id` (> 0).
CFX_TF_EXPORT void cfx_tf_set_process_set(int64_t id, void *ctx) {
    std::lock_guard<std::mutex> lk(g_sets_mu);
    if (ctx == nullptr)
        g_sets.erase(id);
    else
        g_sets[id] = static_cast<cfx_context *>(ctx);
}

// The tensorflow version this library was compiled against (tf.__version__ at build time).
CFX_TF_EXPORT const char *cfx_tf_built_version(void) { return CFX_TF_BUILT_VERSION; }
