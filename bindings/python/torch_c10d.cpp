/*
 * conflux._torch_c10d - torch.distributed's backend "conflux" as a native c10d::Backend (C++ against
 * the torch wheel's headers, pybind11 from that wheel), calling the Conflux C ABI directly.
 *
 * Owns: the Backend subclass (every collective c10d's Backend.hpp declares that the engine can
 * run), its Work objects, the completer thread that waits for the engine's handles in submission
 * order and completes each Work and its torch future, the adapter that hands torch's c10d::Store to
 * the engine as cfx_store_callbacks, and the two ways a backend gets its context:
 *  - Backend.for_context(address, rank, size, timeout_s): the job's context that conflux._core
 *    already holds (the default group, and a new_group of every rank in order; under mpirun that
 *    is the MPI context, the fast path). Not owned: conflux.torch_backend closes the backend
 *    (_close) before conflux._core frees the context at exit.
 *  - Backend.for_group(store, rank, size, timeout_s) and Backend.split(): a context of its own made
 *    by cfx_init_group on the members only, meeting over Gloo through the group's store (torch's
 *    PrefixStore unique to the group), so ranks outside the group carry on.
 * Registration with torch (register_backend, the creator, the rendezvous) is Python's:
 * conflux/torch_backend.py. Nothing here holds the GIL on the data path: torch's bindings release
 * it around the collectives, and the completer thread takes it only where torch does (a Python
 * callback chained on a future; dropping a tensor that Python also holds), which is why close()
 * lets it go while it joins that thread.
 *
 * CUDA tensors (where Conflux and the torch wheel are both CUDA builds: CFX_TORCH_CUDA, set by
 * python/torch_c10d.cmake): allreduce, allreduce_coalesced and broadcast take contiguous CUDA
 * tensors and hand the engine the caller's current stream (the engine's device path orders its work
 * after that stream's and the stream after its own, docs/architecture.md "Device tensors"); the
 * other collectives refuse them, naming the op.
 *
 * Reduce, gather and scatter run as the engine's allreduce, allgather and broadcast (the engine has
 * no rooted collectives); send and recv raise (no point-to-point). Names are NULL: the engine
 * generates them per context in submission order, so ranks must issue a group's collectives in
 * the same order, as c10d requires anyway.
 */
#include <Python.h>

#include <pybind11/pybind11.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "conflux/conflux.h"
#include "torch_dtype.h"

#ifdef CFX_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

namespace py = pybind11;

namespace {

const char *const BACKEND = "conflux";

/* ---- errors ---- */
[[noreturn]] void fail_value(const std::string &msg) { C10_THROW_ERROR(ValueError, msg); }

/* A collective's failure as the engine reported it: Python gets the conflux exception class of
 * its status (conflux.MismatchError, conflux.PeerLostError, ...) through the translator that the
 * module registers; C++ callers (DDP's reducer) see a std::runtime_error with the message. */
struct EngineError : std::runtime_error {
    cfx_status status;
    EngineError(cfx_status st, const std::string &msg) : std::runtime_error(msg), status(st) {}
};

std::exception_ptr backend_error(const std::string &msg, cfx_status st = CFX_ERR_INTERNAL)
{
    return std::make_exception_ptr(EngineError(st, msg));
}

/* ---- tensors ---- */
at::ScalarType scalar_of(int32_t dtype)
{
    switch (dtype) {
    case CFX_UINT8: return at::kByte;
    case CFX_INT8: return at::kChar;
    case CFX_INT16: return at::kShort;
    case CFX_INT32: return at::kInt;
    case CFX_INT64: return at::kLong;
    case CFX_FLOAT16: return at::kHalf;
    case CFX_BFLOAT16: return at::kBFloat16;
    case CFX_FLOAT32: return at::kFloat;
    case CFX_FLOAT64: return at::kDouble;
    case CFX_BOOL: return at::kBool;
    default: fail_value("conflux backend: the engine returned dtype " + std::to_string(dtype));
    }
}

/* The collectives that take CUDA tensors (in place, on the caller's stream). */
bool takes_cuda(const char *op)
{
    return kCudaBuild && (!strcmp(op, "allreduce") || !strcmp(op, "allreduce_coalesced") ||
                          !strcmp(op, "broadcast"));
}

/* Refuses what the engine cannot take, naming the op and the tensor. */
void check_tensor(const char *op, const char *what, const at::Tensor &t)
{
    if (!t.defined())
        fail_value(std::string("conflux backend: ") + op + ": " + what + " is undefined");
    bool cuda = t.is_cuda() && takes_cuda(op);
    if ((!t.is_cpu() && !cuda) || t.layout() != at::kStrided)
        fail_value(std::string("conflux backend: ") + op + ": " + what + " is on " +
                   t.device().str() + " with layout " + c10::str(t.layout()) +
                   (kCudaBuild ? "; the backend takes dense CPU tensors, and dense CUDA tensors in "
                                 "allreduce, allreduce_coalesced and broadcast (use a "
                                 "cpu:conflux,cuda:nccl backend string for the others)"
                               : "; this build of the backend takes dense CPU tensors (use a "
                                 "cpu:conflux,cuda:... backend string for device tensors)"));
    if (cuda && !t.is_contiguous())
        fail_value(std::string("conflux backend: ") + op + ": " + what + " on " +
                   t.device().str() + " is not contiguous; CUDA tensors are reduced in place "
                   "(pass .contiguous() and read the result there)");
    if (cfx_dtype_of(t.scalar_type()) < 0)
        fail_value(std::string("conflux backend: ") + op + ": " + what + " has dtype " +
                   c10::toString(t.scalar_type()) + ", which the engine does not reduce or move");
    if (t.dim() > CFX_MAX_NDIM)
        fail_value(std::string("conflux backend: ") + op + ": " + what + " has " +
                   std::to_string(t.dim()) + " dimensions (at most " +
                   std::to_string(CFX_MAX_NDIM) + ")");
}

void check_same(const char *op, const char *what, int64_t expected, int64_t got)
{
    if (expected != got)
        fail_value(std::string("conflux backend: ") + op + ": " + what + " is " +
                   std::to_string(got) + " on this rank, but " + std::to_string(expected) +
                   " is needed");
}

void check_dtype(const char *op, const at::Tensor &out, const at::Tensor &in)
{
    if (out.scalar_type() != in.scalar_type())
        fail_value(std::string("conflux backend: ") + op + ": the output's dtype " +
                   c10::toString(out.scalar_type()) + " differs from the input's " +
                   c10::toString(in.scalar_type()));
}

/* A contiguous tensor and its description; the shape lives here, the description points into it. */
struct Desc {
    at::Tensor t;
    std::vector<int64_t> shape;
    cfx_tensor d;
    explicit Desc(at::Tensor x) : t(std::move(x)), shape(t.sizes().begin(), t.sizes().end())
    {
        int32_t device = CFX_DEVICE_CPU;
        void *stream = nullptr;
#ifdef CFX_TORCH_CUDA
        if (t.is_cuda()) { /* the engine orders its work after the caller's current stream */
            device = t.get_device();
            stream = c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
        }
#endif
        d = cfx_tensor{t.numel() ? t.data_ptr() : nullptr, shape.data(),
                       static_cast<int32_t>(shape.size()), cfx_dtype_of(t.scalar_type()), device,
                       stream};
    }
};

/* tensors as the engine may write them in place: contiguous copies of those that are not, and
 * the copy back into the originals once the engine is done. */
struct InPlace {
    std::vector<at::Tensor> user, work;
    explicit InPlace(const std::vector<at::Tensor> &ts) : user(ts)
    {
        for (const auto &t : ts)
            work.push_back(t.is_contiguous() ? t : t.contiguous());
    }
    void copy_back() const
    {
        for (size_t i = 0; i < user.size(); i++)
            if (!work[i].is_same(user[i]))
                user[i].copy_(work[i]);
    }
};

/* Output `index` of a completed handle, as a tensor over the engine's memory (valid until the
 * handle is released). */
at::Tensor engine_output(cfx_context *ctx, cfx_handle h, size_t index)
{
    cfx_tensor out;
    cfx_status st = cfx_handle_output(ctx, h, index, &out);
    if (st != CFX_OK)
        throw std::runtime_error(std::string("conflux backend: reading output ") +
                                 std::to_string(index) + ": " + cfx_last_error());
    std::vector<int64_t> shape(out.shape, out.shape + out.ndim);
    auto opts = at::TensorOptions().dtype(scalar_of(out.dtype));
    if (!out.data)
        return at::empty(shape, opts);
    return at::from_blob(out.data, shape, opts);
}

/* An uninitialized contiguous tensor in shared tensor memory (cfx_alloc; freed with the tensor),
 * or in private memory where the pool has no room. */
at::Tensor shared_empty(at::IntArrayRef sizes, const at::TensorOptions &options)
{
    size_t bytes = static_cast<size_t>(c10::multiply_integers(sizes)) * options.dtype().itemsize();
    void *p = nullptr;
    if (bytes == 0 || cfx_alloc(bytes, &p) != CFX_OK)
        return at::empty(sizes, options.device(at::kCPU));
    return at::from_blob(p, sizes, [](void *q) { cfx_free(q); }, options.device(at::kCPU));
}

/* The rows of a completed grouped allgather (output i: size rows, one per rank) into the
 * caller's lists (outs[i][r] takes rank r's row of input i); returns the tensors written. */
std::vector<at::Tensor> copy_gathered(std::vector<std::vector<at::Tensor>> &outs, int size,
                                      cfx_context *c, cfx_handle h)
{
    std::vector<at::Tensor> all;
    for (size_t i = 0; i < outs.size(); i++) {
        at::Tensor g = engine_output(c, h, i);
        for (int r = 0; r < size; r++) {
            at::Tensor &o = outs[i][r];
            o.copy_(g[r].view(o.sizes()));
            all.push_back(o);
        }
    }
    return all;
}

std::vector<int64_t> engine_splits(cfx_context *ctx, cfx_handle h, size_t index, int size)
{
    const int64_t *s = nullptr;
    cfx_status st = cfx_handle_splits(ctx, h, index, &s);
    if (st != CFX_OK)
        throw std::runtime_error(std::string("conflux backend: reading the splits: ") +
                                 cfx_last_error());
    return std::vector<int64_t>(s, s + size);
}

/* ---- reduction ops ---- */
struct Op {
    cfx_reduce_op op;
    double prescale;
};

Op reduce_op(const c10d::ReduceOp &r, const char *what)
{
    switch (r.op_) {
    case c10d::ReduceOp::SUM: return {CFX_OP_SUM, 1.0};
    case c10d::ReduceOp::AVG: return {CFX_OP_AVERAGE, 1.0};
    case c10d::ReduceOp::MIN: return {CFX_OP_MIN, 1.0};
    case c10d::ReduceOp::MAX: return {CFX_OP_MAX, 1.0};
    case c10d::ReduceOp::PRODUCT: return {CFX_OP_PRODUCT, 1.0};
    case c10d::ReduceOp::PREMUL_SUM: {
        /* The factor multiplies each rank's tensor before the sum: the engine's prescale. */
        auto s = c10::dynamic_intrusive_pointer_cast<c10d::PreMulSumSupplement>(r.supplement_);
        if (!s)
            fail_value(std::string("conflux backend: ") + what + ": PREMUL_SUM without its factor");
        double f = s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
        return {CFX_OP_SUM, f};
    }
    default: break;
    }
    static const char *const names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND",
                                        "BOR", "BXOR", "PREMUL_SUM", "UNUSED"};
    unsigned k = static_cast<unsigned>(r.op_);
    fail_value(std::string("the conflux backend has no reduction op ") +
               (k < 10 ? names[k] : std::to_string(k).c_str()) + " (" + what +
               "); it has SUM, AVG, PREMUL_SUM, MIN, MAX, PRODUCT");
}

/* ---- Work ---- */
class ConfluxWork : public c10d::Work {
public:
    ConfluxWork(int rank, c10d::OpType type, const char *title, uint64_t seq)
        : Work(rank, type, title), seq_(seq),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get())))
    {
    }

    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
    std::vector<at::Tensor> result() override { return outputs_; }
    uint64_t getSequencenumber() const override { return seq_; }

    void settle(std::vector<at::Tensor> outputs, std::exception_ptr error)
    {
        if (error) {
            finish(error);
            future_->setError(error);
            return;
        }
        outputs_ = outputs;
        finish();
        future_->markCompleted(c10::IValue(std::move(outputs)));
    }

private:
    uint64_t seq_;
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/* ---- completing Works off the completer thread ----
 * torch runs a future's callbacks on the thread that completes the future, and such a callback may
 * wait for another collective of the same group (torch's PowerSGD hook waits for an all_reduce
 * inside its callback), which only the group's completer thread can complete. So the completer
 * hands each finished Work to these threads: a new one starts whenever more Works wait than
 * threads are idle (up to kMaxSettlers), so a callback that blocks never holds up the next
 * completion. Process-wide and never destroyed: its threads may still be completing Works (and
 * running Python callbacks) while the interpreter exits. */
class Settlers {
public:
    static Settlers &instance()
    {
        static Settlers *pool = new Settlers(); /* leaked on purpose (above) */
        return *pool;
    }

    void post(std::function<void()> task)
    {
        std::lock_guard<std::mutex> lk(mu_);
        tasks_.push_back(std::move(task));
        if (tasks_.size() > idle_ && threads_ < kMaxSettlers) {
            threads_++;
            std::thread([this] { run(); }).detach();
        } else {
            cv_.notify_one();
        }
    }

private:
    static constexpr size_t kMaxSettlers = 32;

    void run()
    {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            while (tasks_.empty()) {
                idle_++;
                cv_.wait(lk);
                idle_--;
            }
            std::function<void()> task = std::move(tasks_.front());
            tasks_.pop_front();
            lk.unlock();
            task();
            task = nullptr; /* the Work and its tensors go outside the lock */
            lk.lock();
        }
    }

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> tasks_;
    size_t idle_ = 0, threads_ = 0;
};

/* ---- torch's Store as the engine's store callbacks ---- */
class StoreAdapter {
public:
    explicit StoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store))
    {
        /* An independent connection where the store can make one: the engine's heartbeat thread
         * uses it while torch uses its own. */
        try {
            auto cloned = store_->clone();
            if (cloned)
                store_ = cloned;
        } catch (...) {
        }
        cb_ = cfx_store_callbacks{CFX_STORE_CALLBACKS_VERSION, this, &StoreAdapter::set,
                                  &StoreAdapter::get, &StoreAdapter::wait};
    }
    const cfx_store_callbacks *callbacks() const { return &cb_; }

private:
    static int set(void *user, const char *key, const void *data, size_t len)
    {
        try {
            auto p = static_cast<const uint8_t *>(data);
            static_cast<StoreAdapter *>(user)->store_->set(key, std::vector<uint8_t>(p, p + len));
            return 0;
        } catch (...) {
            return -1;
        }
    }
    static int get(void *user, const char *key, void *buf, size_t cap, size_t *len)
    {
        try {
            std::vector<uint8_t> v = static_cast<StoreAdapter *>(user)->store_->get(key);
            *len = v.size();
            if (!v.empty())
                std::memcpy(buf, v.data(), std::min(cap, v.size()));
            return 0;
        } catch (...) {
            return -1;
        }
    }
    /* A check (timeout 0: the heartbeat thread's every period) and a short wait poll check():
     * torch's TCPStore logs a warning for every wait that times out. A long wait is the store's. */
    static int wait(void *user, const char *const *keys, size_t n, double timeout_s)
    {
        std::vector<std::string> ks(keys, keys + n);
        auto &store = static_cast<StoreAdapter *>(user)->store_;
        try {
            if (timeout_s >= 0 && timeout_s < 1.0) {
                auto deadline = std::chrono::steady_clock::now() +
                                std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
                auto pause = std::chrono::microseconds(200);
                for (;;) {
                    if (store->check(ks))
                        return 0;
                    if (std::chrono::steady_clock::now() + pause > deadline)
                        return 1;
                    std::this_thread::sleep_for(pause);
                    pause = std::min(pause * 2, std::chrono::microseconds(20000));
                }
            }
            double capped = timeout_s < 0 ? 86400.0 * 365 : std::min(timeout_s, 86400.0 * 365);
            store->wait(ks, std::chrono::milliseconds(static_cast<int64_t>(capped * 1000)));
            return 0;
        } catch (const c10::DistStoreError &) {
            return 1; /* the deadline passed */
        } catch (...) {
            return -1;
        }
    }
    c10::intrusive_ptr<c10d::Store> store_;
    cfx_store_callbacks cb_;
};

/* ---- the backend ---- */
using Finish = std::function<std::vector<at::Tensor>(cfx_context *, cfx_handle)>;

class ConfluxBackend : public c10d::Backend {
public:
    ConfluxBackend(cfx_context *ctx, bool owned, int rank, int size,
                   std::chrono::milliseconds timeout, std::unique_ptr<StoreAdapter> store)
        : Backend(rank, size), ctx_(ctx), owned_(owned), store_(std::move(store)),
          options_(c10::make_intrusive<Backend::Options>(BACKEND, timeout))
    {
        thread_ = std::thread([this] { complete_in_order(); });
    }

    ~ConfluxBackend() override { close(); }

    /* The members of a group make its context (cfx_init_group); the GIL is released by the caller. */
    static c10::intrusive_ptr<ConfluxBackend> for_group(const c10::intrusive_ptr<c10d::Store> &store,
                                                        int rank, int size,
                                                        std::chrono::milliseconds timeout)
    {
        auto adapter = std::make_unique<StoreAdapter>(store);
        cfx_context *ctx = nullptr;
        cfx_status st = cfx_init_group(nullptr, adapter->callbacks(), rank, size, &ctx);
        if (st != CFX_OK)
            throw std::runtime_error(std::string("conflux backend: making the group's context "
                                                 "(rank ") + std::to_string(rank) + " of " +
                                     std::to_string(size) + "): " + cfx_last_error());
        return c10::make_intrusive<ConfluxBackend>(ctx, true, rank, size, timeout,
                                                   std::move(adapter));
    }

    /* Finishes what is pending and lets the context go: a group's own context is shut down (its
     * pending collectives fail with CFX_ERR_SHUT_DOWN) and freed; the job's is only no longer
     * used (conflux._core frees it); a collective of the job's context still pending fails here
     * and its buffers are kept (the engine may still write them). Idempotent. Called with the GIL
     * held (a destructor reached from Python), it lets the GIL go while it waits: the completer
     * may need it to drop a tensor that Python also holds. */
    void close()
    {
        {
            std::lock_guard<std::mutex> lk(queue_mu_);
            if (closed_.load())
                return;
            closed_.store(true);
        }
        queue_cv_.notify_all();
        if (PyGILState_Check()) {
            py::gil_scoped_release nogil;
            finish_close();
        } else {
            finish_close();
        }
    }

    const std::string getBackendName() const override { return BACKEND; }
    c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
    bool supportsSplitting() const override { return true; }
    bool supportsCoalescing() const override { return false; }
    void setSequenceNumberForGroup() override {} /* they start at 0 on every rank */
    uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
    void setTimeout(std::chrono::milliseconds timeout) override { options_->timeout = timeout; }

    /* DDP's Reducer asks the backend for its buckets' memory (torch 2.15's does, unless
     * DDP_DISABLE_COMM_MEM=1): buckets in shared tensor memory take the engine's direct path. */
    bool supportsTensorAlloc(c10::DeviceIndex) override { return true; }
    at::Tensor allocateTensor(long size, at::TensorOptions options) override
    {
        if (options.device().type() != c10::DeviceType::CPU)
            return at::empty({size}, options);
        return shared_empty({size}, options);
    }

    /* dist.split_group: torch calls it on every rank of the parent with the ranks of this rank's
     * group (parent ranks); members meet through the group's store, others get nullptr. */
    c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store> &store,
                                            const std::vector<int> &ranks,
                                            const c10::intrusive_ptr<Options> &opts) override
    {
        auto it = std::find(ranks.begin(), ranks.end(), getRank());
        if (it == ranks.end())
            return nullptr;
        auto timeout = opts ? opts->timeout : options_->timeout;
        auto b = for_group(store, static_cast<int>(it - ranks.begin()),
                           static_cast<int>(ranks.size()), timeout);
        if (opts)
            b->options_->group_name = opts->group_name;
        return b;
    }

    /* ---- allreduce ---- */
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override
    {
        return allreduce_tensors("allreduce", c10d::OpType::ALLREDUCE, tensors, opts.reduceOp,
                                 CFX_COMPRESSION_NONE);
    }

    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override
    {
        return allreduce_tensors("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors,
                                 opts.reduceOp, CFX_COMPRESSION_NONE);
    }

    /* For conflux.torch.ddp_hooks: one tensor, averaged or summed with the engine's wire
     * compression; Python chains on the Work's future. */
    c10::intrusive_ptr<c10d::Work> allreduce_compressed(at::Tensor tensor, int op, int compression)
    {
        if (op < 0 || op >= CFX_OP_COUNT)
            fail_value("conflux backend: ddp hook: op " + std::to_string(op) + " is unknown");
        std::vector<at::Tensor> ts{tensor};
        c10d::ReduceOp r = op == CFX_OP_AVERAGE ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
        return allreduce_tensors("ddp_hook", c10d::OpType::ALLREDUCE, ts, r, compression);
    }

    /* ---- broadcast ---- */
    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override
    {
        const char *what = "broadcast";
        check_same(what, "the number of tensors", 1, static_cast<int64_t>(tensors.size()));
        check_tensor(what, "the tensor", tensors[0]);
        check_root(what, opts.rootRank);
        auto io = std::make_shared<InPlace>(tensors);
        Desc d(io->work[0]);
        return submit(what, c10d::OpType::BROADCAST, [&](cfx_context *c, cfx_handle *h) {
            return cfx_broadcast_async(c, nullptr, &d.d, static_cast<int>(opts.rootRank), h);
        }, [io](cfx_context *, cfx_handle) {
            io->copy_back();
            return io->user;
        });
    }

    /* ---- allgather: every input as one row of the engine's allgather ---- */
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &) override
    {
        const char *what = "allgather";
        check_same(what, "the number of output lists", static_cast<int64_t>(inputs.size()),
                   static_cast<int64_t>(outputs.size()));
        for (size_t i = 0; i < inputs.size(); i++) {
            check_tensor(what, "an input", inputs[i]);
            check_same(what, "the number of output tensors", getSize(),
                       static_cast<int64_t>(outputs[i].size()));
            for (const auto &o : outputs[i]) {
                check_tensor(what, "an output", o);
                check_dtype(what, o, inputs[i]);
                check_same(what, "an output tensor's number of elements", inputs[i].numel(),
                           o.numel());
            }
        }
        auto outs = std::make_shared<std::vector<std::vector<at::Tensor>>>(outputs);
        int size = getSize();
        return gathered(what, c10d::OpType::ALLGATHER, inputs,
                        [outs, size](cfx_context *c, cfx_handle h) {
            return copy_gathered(*outs, size, c, h);
        });
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &) override
    {
        std::vector<at::Tensor> outs{output}, ins{input};
        return gather_into("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, outs, ins);
    }

    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::AllgatherOptions &) override
    {
        return gather_into("allgather_into_tensor_coalesced",
                           c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, outputs, inputs);
    }

    /* ---- reduce-scatter: the inputs stacked (size x n), row r to rank r ---- */
    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override
    {
        const char *what = "reduce_scatter";
        check_same(what, "the number of input lists", static_cast<int64_t>(outputs.size()),
                   static_cast<int64_t>(inputs.size()));
        std::vector<at::Tensor> stacked;
        for (size_t i = 0; i < outputs.size(); i++) {
            check_tensor(what, "an output", outputs[i]);
            check_same(what, "the number of input tensors", getSize(),
                       static_cast<int64_t>(inputs[i].size()));
            std::vector<at::Tensor> rows;
            for (const auto &t : inputs[i]) {
                check_tensor(what, "an input", t);
                check_dtype(what, outputs[i], t);
                check_same(what, "an input tensor's number of elements", outputs[i].numel(),
                           t.numel());
                rows.push_back(t.reshape({-1}));
            }
            stacked.push_back(at::stack(rows));
        }
        return scattered(what, c10d::OpType::REDUCE_SCATTER, outputs, stacked, opts.reduceOp);
    }

    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override
    {
        std::vector<at::Tensor> outs{output}, ins{input};
        return scatter_from("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, outs, ins,
                            opts.reduceOp);
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::ReduceScatterOptions &opts) override
    {
        return scatter_from("reduce_scatter_tensor_coalesced",
                            c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs, inputs,
                            opts.reduceOp);
    }

    /* ---- alltoall ---- */
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &outputSplits,
                                                 std::vector<int64_t> &inputSplits,
                                                 const c10d::AllToAllOptions &) override
    {
        const char *what = "all_to_all_single";
        check_tensor(what, "the input", input);
        check_tensor(what, "the output", output);
        check_dtype(what, output, input);
        int size = getSize();
        auto splits = std::make_shared<std::vector<int64_t>>(inputSplits);
        if (splits->empty()) {
            if (input.dim() == 0 || input.size(0) % size)
                fail_value("conflux backend: all_to_all_single: dim 0 of the input (" +
                           std::string(input.dim() ? std::to_string(input.size(0)) : "none") +
                           ") does not divide by the group's size (" + std::to_string(size) +
                           "); give input_split_sizes");
        } else {
            check_same(what, "the number of input_split_sizes", size,
                       static_cast<int64_t>(splits->size()));
        }
        auto want = std::make_shared<std::vector<int64_t>>(outputSplits);
        if (!want->empty())
            check_same(what, "the number of output_split_sizes", size,
                       static_cast<int64_t>(want->size()));
        auto in = std::make_shared<Desc>(input.contiguous());
        at::Tensor out = output;
        return submit(what, c10d::OpType::ALLTOALL_BASE, [&](cfx_context *c, cfx_handle *h) {
            return cfx_alltoall_async(c, nullptr, &in->d, splits->empty() ? nullptr : splits->data(),
                                      splits->size(), h);
        }, [in, out, want, size](cfx_context *c, cfx_handle h) {
            at::Tensor got = engine_output(c, h, 0);
            std::vector<int64_t> received = engine_splits(c, h, 0, size);
            if (!want->empty() && *want != received)
                throw std::invalid_argument(
                    "conflux backend: all_to_all_single: output_split_sizes " + c10::str(*want) +
                    " differ from the rows received from each rank " + c10::str(received));
            if (got.sizes() != out.sizes())
                throw std::invalid_argument(
                    "conflux backend: all_to_all_single: the output's shape " +
                    c10::str(out.sizes()) + " differs from what was received " +
                    c10::str(got.sizes()));
            at::Tensor o = out;
            o.copy_(got);
            return std::vector<at::Tensor>{out};
        });
    }

    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                            std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &) override
    {
        const char *what = "all_to_all";
        int size = getSize();
        check_same(what, "the number of input tensors", size, static_cast<int64_t>(inputs.size()));
        check_same(what, "the number of output tensors", size,
                   static_cast<int64_t>(outputs.size()));
        std::vector<at::Tensor> flat;
        auto splits = std::make_shared<std::vector<int64_t>>();
        for (int r = 0; r < size; r++) {
            check_tensor(what, "an input", inputs[r]);
            check_tensor(what, "an output", outputs[r]);
            check_dtype(what, outputs[r], inputs[0]);
            check_dtype(what, inputs[r], inputs[0]);
            flat.push_back(inputs[r].reshape({-1}));
            splits->push_back(inputs[r].numel());
        }
        auto in = std::make_shared<Desc>(at::cat(flat));
        auto outs = std::make_shared<std::vector<at::Tensor>>(outputs);
        return submit(what, c10d::OpType::ALLTOALL, [&](cfx_context *c, cfx_handle *h) {
            return cfx_alltoall_async(c, nullptr, &in->d, splits->data(), splits->size(), h);
        }, [in, outs, size](cfx_context *c, cfx_handle h) {
            at::Tensor got = engine_output(c, h, 0);
            std::vector<int64_t> received = engine_splits(c, h, 0, size);
            int64_t offset = 0;
            for (int r = 0; r < size; r++) {
                at::Tensor &o = (*outs)[r];
                if (received[r] != o.numel())
                    throw std::invalid_argument(
                        "conflux backend: all_to_all: output tensor " + std::to_string(r) +
                        " has " + std::to_string(o.numel()) + " elements, but rank " +
                        std::to_string(r) + " sent " + std::to_string(received[r]));
                o.copy_(got.narrow(0, offset, o.numel()).view(o.sizes()));
                offset += o.numel();
            }
            return *outs;
        });
    }

    /* ---- barrier ---- */
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &) override
    {
        return submit("barrier", c10d::OpType::BARRIER,
                      [](cfx_context *c, cfx_handle *h) { return cfx_barrier_async(c, h); },
                      [](cfx_context *, cfx_handle) { return std::vector<at::Tensor>{}; });
    }

    /* torch's monitored_barrier: the engine's barrier, waited for here within the timeout (the
     * call's, else the group's). A rank that does not arrive in time fails the call on every rank
     * that did, naming the group's size and the timeout; the barrier stays pending in the engine,
     * so the group should be destroyed after such a failure (as with Gloo's). waitAllRanks asks
     * Gloo to name every missing rank; the engine's barrier completes only when all arrived, so
     * either way the error is the same. */
    void monitoredBarrier(const c10d::BarrierOptions &opts, bool /* waitAllRanks */) override
    {
        auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
        auto work = barrier(opts);
        auto future = work->getFuture();
        auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!future->completed() && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!future->completed())
            C10_THROW_ERROR(DistBackendError,
                            "conflux backend (rank " + std::to_string(getRank()) + " of " +
                                std::to_string(getSize()) + "): monitored_barrier: not every rank of "
                                "the group reached the barrier within " +
                                std::to_string(timeout.count()) + " ms; destroy the group");
        work->wait();  /* raises the engine's error, if the barrier failed */
    }

    /* ---- rooted collectives over the engine's ---- */
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override
    {
        const char *what = "reduce";
        check_root(what, opts.rootRank);
        Op op = reduce_op(opts.reduceOp, what);
        auto user = std::make_shared<std::vector<at::Tensor>>(tensors);
        auto copies = std::make_shared<std::vector<Desc>>();
        for (const auto &t : tensors) {
            check_tensor(what, "a tensor", t);
            copies->emplace_back(t.clone(at::MemoryFormat::Contiguous));
        }
        bool root = opts.rootRank == getRank();
        return submit(what, c10d::OpType::REDUCE, [&](cfx_context *c, cfx_handle *h) {
            return grouped_allreduce(c, *copies, op, h);
        }, [user, copies, root](cfx_context *, cfx_handle) {
            if (root)
                for (size_t i = 0; i < user->size(); i++)
                    (*user)[i].copy_((*copies)[i].t);
            return *user;
        });
    }

    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::GatherOptions &opts) override
    {
        const char *what = "gather";
        check_root(what, opts.rootRank);
        bool root = opts.rootRank == getRank();
        int size = getSize();
        for (size_t i = 0; i < inputs.size(); i++) {
            check_tensor(what, "an input", inputs[i]);
            if (root) {
                check_same(what, "the number of output lists", static_cast<int64_t>(inputs.size()),
                           static_cast<int64_t>(outputs.size()));
                check_same(what, "the number of output tensors", size,
                           static_cast<int64_t>(outputs[i].size()));
                for (const auto &o : outputs[i]) {
                    check_dtype(what, o, inputs[i]);
                    check_same(what, "an output tensor's number of elements", inputs[i].numel(),
                               o.numel());
                }
            }
        }
        auto outs = std::make_shared<std::vector<std::vector<at::Tensor>>>(outputs);
        return gathered(what, c10d::OpType::GATHER, inputs,
                        [outs, size, root](cfx_context *c, cfx_handle h) {
            return root ? copy_gathered(*outs, size, c, h) : std::vector<at::Tensor>{};
        });
    }

    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override
    {
        const char *what = "scatter";
        check_root(what, opts.rootRank);
        check_same(what, "the number of output tensors", 1, static_cast<int64_t>(outputs.size()));
        at::Tensor out = outputs[0];
        check_tensor(what, "the output", out);
        int size = getSize(), rank = getRank();
        at::Tensor stacked;
        if (opts.rootRank == rank) {
            check_same(what, "the number of input lists", 1, static_cast<int64_t>(inputs.size()));
            check_same(what, "the number of input tensors", size,
                       static_cast<int64_t>(inputs[0].size()));
            std::vector<at::Tensor> rows;
            for (const auto &t : inputs[0]) {
                check_dtype(what, out, t);
                check_same(what, "an input tensor's number of elements", out.numel(), t.numel());
                rows.push_back(t.reshape({-1}));
            }
            stacked = at::stack(rows);
        } else {
            stacked = at::empty({size, out.numel()}, out.options().memory_format(
                                                         at::MemoryFormat::Contiguous));
        }
        auto d = std::make_shared<Desc>(stacked);
        return submit(what, c10d::OpType::SCATTER, [&](cfx_context *c, cfx_handle *h) {
            return cfx_broadcast_async(c, nullptr, &d->d, static_cast<int>(opts.rootRank), h);
        }, [d, out, rank](cfx_context *, cfx_handle) {
            at::Tensor o = out;
            o.copy_(d->t[rank].view(o.sizes()));
            return std::vector<at::Tensor>{out};
        });
    }

    /* ---- no point-to-point ---- */
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &, int dst, int) override
    {
        no_point_to_point("send", "to", dst);
    }
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &, int src, int) override
    {
        no_point_to_point("recv", "from", src);
    }
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &, int) override
    {
        no_point_to_point("recv", "from", -1);
    }

    int64_t context_address()
    {
        std::lock_guard<std::mutex> lk(queue_mu_);
        return closed_.load() ? 0 : static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(ctx_));
    }

private:
    void finish_close()
    {
        if (owned_)
            cfx_shutdown(ctx_);
        if (thread_.joinable()) {
            if (thread_.get_id() == std::this_thread::get_id())
                thread_.detach(); /* the last reference went in a future's callback */
            else
                thread_.join();
        }
        if (owned_)
            cfx_context_free(ctx_); /* after the completer: nothing calls into it any more */
    }

    struct Item {
        cfx_handle handle;
        c10::intrusive_ptr<ConfluxWork> work;
        Finish finish;
    };

    [[noreturn]] void no_point_to_point(const char *what, const char *dir, int peer)
    {
        TORCH_CHECK(false, std::string("the conflux backend has no point-to-point ") + what + " (" + dir +
                   " rank " + std::to_string(peer) + "): the engine runs collectives only; use a "
                   "group of another backend for it, e.g. dist.new_group(backend=\"gloo\")");
    }

    void check_root(const char *what, int64_t root)
    {
        if (root < 0 || root >= getSize())
            fail_value(std::string("conflux backend: ") + what + ": root rank " +
                       std::to_string(root) + " is not in the group of " +
                       std::to_string(getSize()));
    }

    static cfx_status grouped_allreduce(cfx_context *c, std::vector<Desc> &ds, Op op,
                                        cfx_handle *h)
    {
        if (ds.size() == 1)
            return cfx_allreduce_async(c, nullptr, &ds[0].d, nullptr, op.op, op.prescale, 1.0, h);
        std::vector<cfx_tensor> v;
        for (auto &d : ds)
            v.push_back(d.d);
        return cfx_grouped_allreduce_async(c, nullptr, v.size(), v.data(), nullptr, op.op,
                                           op.prescale, 1.0, h);
    }

    c10::intrusive_ptr<c10d::Work> allreduce_tensors(const char *what, c10d::OpType type,
                                                     std::vector<at::Tensor> &tensors,
                                                     const c10d::ReduceOp &rop, int compression)
    {
        Op op = reduce_op(rop, what);
        if (tensors.empty())
            fail_value(std::string("conflux backend: ") + what + ": no tensors");
        for (const auto &t : tensors)
            check_tensor(what, "a tensor", t);
        auto io = std::make_shared<InPlace>(tensors);
        auto ds = std::make_shared<std::vector<Desc>>();
        for (const auto &t : io->work)
            ds->emplace_back(t);
        return submit(what, type, [&](cfx_context *c, cfx_handle *h) {
            if (compression != CFX_COMPRESSION_NONE) {
                if (ds->size() != 1)
                    return CFX_ERR_INVALID_ARGUMENT;
                cfx_allreduce_options o;
                cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION);
                o.op = op.op;
                o.prescale = op.prescale;
                o.compression = compression;
                return cfx_allreduce_async_opts(c, nullptr, &(*ds)[0].d, nullptr, &o, h);
            }
            return grouped_allreduce(c, *ds, op, h);
        }, [io, ds](cfx_context *, cfx_handle) {
            io->copy_back();
            return io->user;
        });
    }

    c10::intrusive_ptr<c10d::Work> gathered(const char *what, c10d::OpType type,
                                            const std::vector<at::Tensor> &inputs, Finish finish)
    {
        if (inputs.empty())
            fail_value(std::string("conflux backend: ") + what + ": no input tensors");
        auto rows = std::make_shared<std::vector<Desc>>();
        for (const auto &t : inputs)
            rows->emplace_back(t.reshape({1, -1}).contiguous());
        return submit(what, type, [&](cfx_context *c, cfx_handle *h) {
            if (rows->size() == 1)
                return cfx_allgather_async(c, nullptr, &(*rows)[0].d, h);
            std::vector<cfx_tensor> v;
            for (auto &d : *rows)
                v.push_back(d.d);
            return cfx_grouped_allgather_async(c, nullptr, v.size(), v.data(), h);
        }, [rows, finish](cfx_context *c, cfx_handle h) { return finish(c, h); });
    }

    c10::intrusive_ptr<c10d::Work> gather_into(const char *what, c10d::OpType type,
                                               std::vector<at::Tensor> &outputs,
                                               std::vector<at::Tensor> &inputs)
    {
        check_same(what, "the number of outputs", static_cast<int64_t>(inputs.size()),
                   static_cast<int64_t>(outputs.size()));
        for (size_t i = 0; i < inputs.size(); i++) {
            check_tensor(what, "an input", inputs[i]);
            check_tensor(what, "an output", outputs[i]);
            check_dtype(what, outputs[i], inputs[i]);
            check_same(what, "the output's number of elements", inputs[i].numel() * getSize(),
                       outputs[i].numel());
        }
        /* Every rank's row of equal size: an integer SUM allreduce of a staging block in shared
         * tensor memory that holds this rank's bytes in its row and zeros elsewhere gives every
         * row's bytes exactly (an integer sum with zeros changes no bit, whatever the dtype, and
         * -0.0 stays -0.0), over the engine's direct path, several times faster on one host
         * than its allgather through the slots. */
        int size = getSize(), rank = getRank();
        auto ds = std::make_shared<std::vector<Desc>>();
        auto blocks = std::make_shared<std::vector<at::Tensor>>();
        for (const auto &in : inputs) {
            int64_t row = in.numel() * static_cast<int64_t>(in.element_size());
            at::ScalarType word = row % 8 == 0 ? at::kLong : row % 4 == 0 ? at::kInt
                                : row % 2 == 0 ? at::kShort : at::kByte;
            blocks->push_back(take_staging(static_cast<size_t>(row * size)));
            at::Tensor bytes = blocks->back().narrow(0, 0, row * size).view({size, row});
            bytes.zero_();
            if (row)
                bytes[rank].copy_(in.contiguous().view({-1}).view(at::kByte));
            ds->emplace_back(bytes.view(word));
        }
        auto outs = std::make_shared<std::vector<at::Tensor>>(outputs);
        return submit(what, type, [&](cfx_context *c, cfx_handle *h) {
            return grouped_allreduce(c, *ds, Op{CFX_OP_SUM, 1.0}, h);
        }, [this, ds, blocks, outs](cfx_context *, cfx_handle) {
            for (size_t i = 0; i < outs->size(); i++) {
                at::Tensor &o = (*outs)[i];
                o.copy_((*ds)[i].t.view(at::kByte).view({-1}).view(o.scalar_type()).view(o.sizes()));
            }
            ds->clear();
            for (auto &b : *blocks)
                give_staging(std::move(b));
            return *outs;
        });
    }

    c10::intrusive_ptr<c10d::Work> scatter_from(const char *what, c10d::OpType type,
                                                std::vector<at::Tensor> &outputs,
                                                std::vector<at::Tensor> &inputs,
                                                const c10d::ReduceOp &rop)
    {
        check_same(what, "the number of inputs", static_cast<int64_t>(outputs.size()),
                   static_cast<int64_t>(inputs.size()));
        std::vector<at::Tensor> stacked;
        for (size_t i = 0; i < inputs.size(); i++) {
            check_tensor(what, "an input", inputs[i]);
            check_tensor(what, "an output", outputs[i]);
            check_dtype(what, outputs[i], inputs[i]);
            check_same(what, "the input's number of elements", outputs[i].numel() * getSize(),
                       inputs[i].numel());
            stacked.push_back(inputs[i].reshape({getSize(), -1}));
        }
        return scattered(what, type, outputs, stacked, rop);
    }

    c10::intrusive_ptr<c10d::Work> scattered(const char *what, c10d::OpType type,
                                             const std::vector<at::Tensor> &outputs,
                                             const std::vector<at::Tensor> &stacked,
                                             const c10d::ReduceOp &rop)
    {
        Op op = reduce_op(rop, what);
        if (stacked.empty())
            fail_value(std::string("conflux backend: ") + what + ": no tensors");
        /* An allreduce of a copy of the stacked inputs in shared tensor memory, of which each rank
         * keeps its row: the engine's allreduce of tensors in shared memory takes the direct path
         * (no copy in or out of its slots), which on one host is several times faster than its
         * reducescatter, and the result is the same (every op reduces elementwise). */
        auto ds = std::make_shared<std::vector<Desc>>();
        auto blocks = std::make_shared<std::vector<at::Tensor>>();
        for (const auto &t : stacked) {
            blocks->push_back(take_staging(static_cast<size_t>(t.numel()) * t.element_size()));
            at::Tensor staging = blocks->back()
                                     .narrow(0, 0, t.numel() * t.element_size())
                                     .view(t.scalar_type())
                                     .view(t.sizes());
            staging.copy_(t);
            ds->emplace_back(staging);
        }
        auto outs = std::make_shared<std::vector<at::Tensor>>(outputs);
        int rank = getRank();
        return submit(what, type, [&](cfx_context *c, cfx_handle *h) {
            return grouped_allreduce(c, *ds, op, h);
        }, [this, ds, blocks, outs, rank](cfx_context *, cfx_handle) {
            for (size_t i = 0; i < outs->size(); i++) {
                at::Tensor &o = (*outs)[i];
                o.copy_((*ds)[i].t[rank].view(o.sizes()));
            }
            ds->clear();
            for (auto &b : *blocks)
                give_staging(std::move(b));
            return *outs;
        });
    }

    /* Submits through `start` (argument errors raise here, in the caller) and queues the handle
     * for the completer; `finish` runs there once the engine completed it. */
    template <typename Start>
    c10::intrusive_ptr<c10d::Work> submit(const char *what, c10d::OpType type, Start &&start,
                                          Finish finish)
    {
        cfx_handle h = 0;
        /* Under the queue's lock: close() cannot take the context away meanwhile, and the
         * completer sees the handles in submission order. */
        std::lock_guard<std::mutex> lk(queue_mu_);
        if (closed_.load())
            TORCH_CHECK(false, "conflux backend: ", what, ": the group was closed (its process "
                        "group destroyed, or the interpreter is exiting)");
        cfx_status st = start(ctx_, &h);
        if (st != CFX_OK)
            TORCH_CHECK(false, "conflux backend: ", what, " (rank ", getRank(), " of ", getSize(),
                        "): ", cfx_status_name(st), ": ", cfx_last_error());
        uint64_t seq = ++seq_;
        auto work = c10::make_intrusive<ConfluxWork>(getRank(), type, what, seq);
        queue_.push_back(Item{h, work, std::move(finish)});
        queue_cv_.notify_one();
        return work;
    }

    /* The completer thread: waits for each handle in submission order, runs its finish, completes
     * its Work. Waits in slices so that close() can take the context away. */
    void complete_in_order()
    {
        for (;;) {
            Item it;
            {
                std::unique_lock<std::mutex> lk(queue_mu_);
                queue_cv_.wait(lk, [this] { return !queue_.empty() || closed_.load(); });
                if (queue_.empty())
                    return;
                it = std::move(queue_.front());
                queue_.pop_front();
            }
            std::vector<at::Tensor> result;
            std::exception_ptr error;
            for (;;) {
                bool closing = closed_.load();
                cfx_status st = cfx_wait(ctx_, it.handle, closing ? 0.0 : 0.5);
                if (st == CFX_ERR_TIMEOUT && !closing)
                    continue;
                if (st == CFX_ERR_TIMEOUT) {
                    /* closed while pending on a context that lives on: the engine still borrows
                     * the buffers, so they are kept (leaked) rather than freed under it */
                    error = backend_error("conflux backend (rank " + std::to_string(getRank()) +
                                          " of " + std::to_string(getSize()) + "): the group was "
                                          "closed before the collective completed",
                                          CFX_ERR_SHUT_DOWN);
                    cfx_handle_release(ctx_, it.handle);
                    new Finish(std::move(it.finish));
                    break;
                }
                if (st != CFX_OK) {
                    const char *m = cfx_handle_message(ctx_, it.handle);
                    error = backend_error(std::string("conflux backend (rank ") +
                                          std::to_string(getRank()) + " of " +
                                          std::to_string(getSize()) + "): " + cfx_status_name(st) +
                                          ": " + (m && *m ? m : cfx_status_string(st)), st);
                } else {
                    try {
                        result = it.finish(ctx_, it.handle);
                    } catch (const std::exception &e) {
                        error = backend_error(e.what());
                    }
                }
                cfx_handle_release(ctx_, it.handle);
                break;
            }
            it.finish = nullptr; /* the staging tensors go before the Work completes */
            Settlers::instance().post([work = std::move(it.work), result = std::move(result),
                                       error]() mutable { work->settle(std::move(result), error); });
        }
    }

    /* Shared-memory staging blocks (1-D uint8 in cfx_alloc memory) kept between calls: FSDP
     * reduce-scatters the same sizes every step, and a block used again has its pages already
     * (a fresh one takes a page fault per page). A call takes the smallest that fits, or makes
     * one; at most kStagingKept wait for the next call. */
    static constexpr size_t kStagingKept = 4;

    at::Tensor take_staging(size_t bytes)
    {
        {
            std::lock_guard<std::mutex> lk(staging_mu_);
            auto best = staging_free_.end();
            for (auto it = staging_free_.begin(); it != staging_free_.end(); ++it)
                if (static_cast<size_t>(it->numel()) >= bytes &&
                    (best == staging_free_.end() || it->numel() < best->numel()))
                    best = it;
            if (best != staging_free_.end()) {
                at::Tensor b = std::move(*best);
                staging_free_.erase(best);
                return b;
            }
        }
        return shared_empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                            at::TensorOptions().dtype(at::kByte));
    }

    void give_staging(at::Tensor block)
    {
        std::lock_guard<std::mutex> lk(staging_mu_);
        if (staging_free_.size() < kStagingKept)
            staging_free_.push_back(std::move(block));
    }

    std::mutex staging_mu_;
    std::vector<at::Tensor> staging_free_;
    cfx_context *ctx_; /* valid until close() joined the completer */
    bool owned_;
    std::unique_ptr<StoreAdapter> store_; /* outlives the context that calls it */
    c10::intrusive_ptr<Options> options_;
    std::atomic<uint64_t> seq_{0};
    std::mutex queue_mu_;
    std::condition_variable queue_cv_;
    std::deque<Item> queue_;
    std::atomic<bool> closed_{false};
    std::thread thread_;
};

} // namespace

PYBIND11_MODULE(_torch_c10d, m)
{
    m.doc() = "torch.distributed's backend \"conflux\" as a native c10d::Backend (torch_c10d.cpp)";
    m.attr("CUDA") = kCudaBuild; /* takes CUDA tensors (conflux.torch_backend registers "cuda") */
    py::module_::import("torch._C._distributed_c10d");
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p)
                std::rethrow_exception(p);
        } catch (const EngineError &e) {
            /* conflux._core.raise_status raises the class of the status with the message. */
            try {
                py::module_::import("conflux._core").attr("raise_status")(
                    static_cast<int>(e.status), e.what());
                PyErr_SetString(PyExc_RuntimeError, e.what());
            } catch (py::error_already_set &raised) {
                raised.restore();
            }
        }
    });
    py::class_<ConfluxBackend, c10d::Backend, c10::intrusive_ptr<ConfluxBackend>>(m, "Backend")
        .def_static("for_context", [](int64_t address, int rank, int size, double timeout_s) {
            auto *ctx = reinterpret_cast<cfx_context *>(static_cast<std::uintptr_t>(address));
            if (!ctx)
                fail_value("conflux backend: no Conflux context (conflux.init() first)");
            return c10::make_intrusive<ConfluxBackend>(
                ctx, false, rank, size,
                std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)), nullptr);
        }, py::arg("address"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
           "The backend of the default group over the job's context (not owned)")
        .def_static("for_group", [](const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                    int size, double timeout_s) {
            return ConfluxBackend::for_group(
                store, rank, size,
                std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
        }, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>(),
           "The backend of a group over a context of its own (cfx_init_group, members only)")
        .def("_allreduce_work", &ConfluxBackend::allreduce_compressed, py::arg("tensor"),
             py::arg("op"), py::arg("compression"), py::call_guard<py::gil_scoped_release>(),
             "One tensor's allreduce (a cfx_reduce_op, a cfx_compression) as a c10d Work: the "
             "DDP hooks of conflux.torch.ddp_hooks chain on its future")
        .def("_close", &ConfluxBackend::close, py::call_guard<py::gil_scoped_release>(),
             "Completes what is pending and lets the context go (a group's: shut down, freed)")
        .def_property_readonly("_context_address", &ConfluxBackend::context_address);
}
