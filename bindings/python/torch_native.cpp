/*
 * conflux._torch_native - conflux.torch's C++ (pybind11 over torch's headers), where the build has
 * Debian's libtorch-dev and pybind11-dev (CONFLUX_WITH_TORCH_NATIVE); without it conflux.torch does
 * the same in Python. Two parts:
 *
 * Hooks: the hooks of conflux.torch.DistributedOptimizer's gradient sets: one post hook on each
 * parameter's AccumulateGrad node that marks the gradient ready (cfx_gradset_ready) with no Python
 * in between, as torch's own DistributedDataParallel hooks its reducer. A Python hook costs each
 * gradient a call into the interpreter (about 1.5-2 us here), which for a model of 10,000 small
 * parameters is several times its allreduce; this costs about 0.1 us.
 * Hooks(set_address, params, views, refused): views[i] is params[i]'s buffer in the set's owned
 * storage (its .grad). Each time backward has accumulated params[i]'s gradient the hook:
 *  - gives params[i] its view back if .grad is no longer it (zero_grad(set_to_none=True), a
 *    gradient the user assigned: the view takes its values, zeros for None, a sparse one added);
 *  - marks i fired and calls cfx_gradset_ready(set, i); on a refusal it calls
 *    refused(status, message), which raises what the Python hooks raise (torch_optimizer's
 *    _refused), and backward() raises that.
 * fired() / fired_any() / fired_all() / clear() tell and reset which gradients fired this step; remove()
 * takes the hooks off (also when the object goes). The AccumulateGrad nodes are held here: the
 * graph reuses a parameter's node only while something keeps it alive.
 *
 * allreduce(...): the per-call path of conflux.torch's lone allreduce (allreduce_, allreduce,
 * allreduce_async_, and so Horovod's), below ("The lone allreduce").
 *
 * move_to_shared(tensor): moves the memory under a tensor's storage into shared tensor memory, for
 * every tensor that shares the storage at once (conflux.torch.ddp_hooks.shared_memory_hook moves
 * DDP's bucket, and with it the reducer's views of it). Below ("Moving a storage").
 */
#include <Python.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "conflux/conflux.h"
#include "torch_dtype.h"
#include "bind.h"

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::variable_list;
// What grad_accumulator returns: an intrusive_ptr from torch 2.1x on, a shared_ptr before.
using NodeRef = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor &>()));

namespace {

class Hooks;

struct ReadyHook : torch::autograd::FunctionPostHook {
    Hooks *owner;
    int32_t index;
    ReadyHook(Hooks *o, int32_t i) : owner(o), index(i) {}
    variable_list operator()(const variable_list &outputs, const variable_list &inputs) override;
};

class Hooks {
public:
    Hooks(std::uintptr_t set_address, const std::vector<at::Tensor> &params,
          const std::vector<at::Tensor> &views, py::object refused)
        : set_(reinterpret_cast<cfx_gradset *>(set_address)), params_(params), views_(views),
          refused_(std::move(refused)), fired_(params.size(), 0)
    {
        if (params.size() != views.size())
            throw std::invalid_argument("Hooks: one view per parameter");
        for (size_t i = 0; i < params_.size(); i++) {
            NodeRef node = torch::autograd::impl::grad_accumulator(params_[i]);
            if (!node)
                throw std::invalid_argument("Hooks: parameter " + std::to_string(i) +
                                            " does not require grad (no AccumulateGrad node)");
            keys_.push_back(node->add_post_hook(
                std::make_unique<ReadyHook>(this, static_cast<int32_t>(i))));
            nodes_.push_back(std::move(node));
        }
    }
    ~Hooks() { remove(); }

    void fire(int32_t i)
    {
        at::Tensor &grad = params_[i].mutable_grad();
        const at::Tensor &view = views_[i];
        if (!grad.defined()) {
            view.zero_();
            grad = view;
        } else if (!grad.is_same(view)) {
            if (grad.is_sparse())
                view.zero_().add_(grad);
            else
                view.copy_(grad);
            grad = view;
        }
        fired_[i] = 1;
        cfx_status st = cfx_gradset_ready(set_, i);
        if (st != CFX_OK) {
            std::string msg = cfx_last_error(); /* this thread's, before Python runs */
            py::gil_scoped_acquire gil;
            try {
                refused_(static_cast<int>(st), msg);
            } catch (py::error_already_set &e) {
                e.restore();
                throw python_error(); /* autograd rethrows it in backward()'s caller as it is */
            }
            throw std::runtime_error("refused did not raise: " + msg);
        }
    }

    /* Every hook once, last gradient first, from here: what autograd does after accumulating a
     * model's gradients in reverse order (benchmarks time the hooks this way, bench/torch_gloo.py). */
    void fire_all()
    {
        for (size_t i = params_.size(); i-- > 0;)
            fire(static_cast<int32_t>(i));
    }

    static bool set(uint8_t f) { return f != 0; }
    bool fired_any() const { return std::any_of(fired_.begin(), fired_.end(), set); }
    bool fired_all() const { return std::all_of(fired_.begin(), fired_.end(), set); }
    void clear() { std::fill(fired_.begin(), fired_.end(), 0); }
    std::vector<bool> fired() const { return std::vector<bool>(fired_.begin(), fired_.end()); }

    void remove()
    {
        for (size_t i = 0; i < nodes_.size(); i++)
            nodes_[i]->del_post_hook(keys_[i]);
        nodes_.clear();
        keys_.clear();
    }

private:
    cfx_gradset *set_;
    std::vector<at::Tensor> params_, views_;
    py::object refused_;
    std::vector<NodeRef> nodes_;
    std::vector<std::uintptr_t> keys_;
    std::vector<uint8_t> fired_;
};

variable_list ReadyHook::operator()(const variable_list &outputs, const variable_list &)
{
    owner->fire(index);
    return outputs;
}

/* ---- The lone allreduce ----------------------------------------------------------------------
 * allreduce(form, name, tensor, op, prescale, postscale, compression, ctx_address): a METH_FASTCALL
 * function (no pybind11 argument conversion) that does in C++ what conflux.torch's generated
 * functions do in Python for the common case: check the tensor, describe it (address, dtype,
 * shape read from the at::Tensor), allocate the result (form 1: at::empty_like), submit, and for
 * the blocking forms wait with the GIL released and release the handle. In Python those steps are
 * a dozen torch attribute reads and calls (about 3 us for the new-tensor form, 1 us in place);
 * here they cost about 0.5 us. form: 0 in place, blocking (returns the tensor); 1 a new tensor,
 * blocking (returns it); 2 in place, started (returns the handle id, which the caller wraps in a
 * Handle keeping the tensor alive).
 * It returns None for anything but the plain case: not a dense contiguous CPU tensor of a
 * supported dtype, a tensor that needs a gradient (form 1: the autograd Function), an input in
 * shared tensor memory (form 1: the result goes there too), a name that is not a str, an op,
 * scale or compression that is not a plain number. The caller then takes its Python path, which
 * handles those cases or raises the error that names what is wrong, so both paths raise alike.
 * A blocking call still pending after WAIT_FIRST_S returns (handle id, keep, result) and the
 * caller waits for the rest through a Handle (signals, parking: conflux._core). A collective
 * that fails raises through raise_status(status, message) (conflux._core.raise_status, set by
 * init_allreduce), the exception classes of the rest of the package. */

PyObject *g_raise_status = nullptr;
constexpr double WAIT_FIRST_S = 0.25;

/* An int (not a bool) within [lo, hi]. */
bool plain_int(PyObject *o, long lo, long hi, long *out)
{
    if (!PyLong_Check(o) || PyBool_Check(o))
        return false;
    int overflow = 0;
    long v = PyLong_AsLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* A float or an int (not a bool). */
bool plain_number(PyObject *o, double *out)
{
    if (PyFloat_CheckExact(o)) {
        *out = PyFloat_AS_DOUBLE(o);
        return true;
    }
    if (!PyLong_CheckExact(o))
        return false;
    *out = PyLong_AsDouble(o);
    if (*out == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    return true;
}

PyObject *raise_status(cfx_status st, const char *message)
{
    if (!g_raise_status) {
        PyErr_Format(PyExc_RuntimeError, "conflux: %s", message);
        return nullptr;
    }
    PyObject *r = PyObject_CallFunction(g_raise_status, "is", static_cast<int>(st), message);
    if (r) { /* it returned instead of raising */
        Py_DECREF(r);
        PyErr_Format(PyExc_RuntimeError, "conflux: %s", message);
    }
    return nullptr;
}

PyObject *lone_allreduce(PyObject *, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "allreduce takes 8 arguments");
        return nullptr;
    }
    long form = 0, op = 0, compression = 0;
    double pre = 1.0, post = 1.0;
    unsigned long long address = PyLong_AsUnsignedLongLong(args[7]);
    if (!plain_int(args[0], 0, 2, &form) || (address == (unsigned long long)-1 && PyErr_Occurred())) {
        PyErr_SetString(PyExc_TypeError, "allreduce: bad form or context address");
        return nullptr;
    }
    if (address == 0) /* no live context: the Python path raises that, after checking the arguments */
        Py_RETURN_NONE;
    PyObject *x = args[2];
    const char *name = nullptr;
    if (args[1] != Py_None) {
        if (!PyUnicode_Check(args[1]) || !(name = PyUnicode_AsUTF8(args[1]))) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    if (!THPVariable_Check(x) || !plain_int(args[3], 0, CFX_OP_COUNT - 1, &op) ||
        !plain_number(args[4], &pre) || !plain_number(args[5], &post))
        Py_RETURN_NONE;
    if (args[6] != Py_None && !plain_int(args[6], INT32_MIN, INT32_MAX, &compression))
        Py_RETURN_NONE;
    const at::Tensor &t = THPVariable_Unpack(x);
    int dtype = cfx_dtype_of(t.scalar_type());
    if (dtype < 0 || !t.is_cpu() || t.layout() != at::kStrided || !t.is_contiguous() ||
        t.dim() > CFX_MAX_NDIM)
        Py_RETURN_NONE;
    void *in = t.data_ptr();
    at::Tensor out;
    if (form == 1) {
        if ((at::GradMode::is_enabled() && t.requires_grad()) ||
            cfx_is_shared(in, static_cast<size_t>(t.numel()) * t.element_size()))
            Py_RETURN_NONE;
        out = at::empty_like(t, at::MemoryFormat::Contiguous);
    }
    cfx_context *ctx = reinterpret_cast<cfx_context *>(static_cast<std::uintptr_t>(address));
    cfx_tensor desc{in, t.sizes().data(), static_cast<int32_t>(t.dim()), dtype, CFX_DEVICE_CPU, nullptr};
    void *output = form == 1 ? out.data_ptr() : nullptr;
    cfx_bind_request request{CFX_BIND_ALLREDUCE, name, &desc, output, static_cast<int>(op), pre, post,
                             static_cast<int>(compression)};
    cfx_handle h = 0;
    cfx_status sub, st = CFX_ERR_TIMEOUT;
    Py_BEGIN_ALLOW_THREADS
    if (form == 2)
        sub = cfx_bind_submit(ctx, &request, &h);
    else
        sub = cfx_bind_run(ctx, &request, WAIT_FIRST_S, &h, &st);
    Py_END_ALLOW_THREADS
    if (sub != CFX_OK)
        return raise_status(sub, cfx_last_error());
    if (form == 2)
        return PyLong_FromUnsignedLongLong(h);
    PyObject *result = form == 1 ? THPVariable_Wrap(std::move(out)) : (Py_INCREF(x), x);
    if (st == CFX_OK || !result)
        return result;
    if (st == CFX_ERR_TIMEOUT) { /* still running: the caller's Handle waits for the rest */
        PyObject *keep = form == 1 ? PyTuple_Pack(2, x, result) : (Py_INCREF(x), x);
        if (!keep) {
            Py_DECREF(result);
            return nullptr;
        }
        return Py_BuildValue("(KNN)", static_cast<unsigned long long>(h), keep, result);
    }
    Py_DECREF(result);
    return raise_status(st, cfx_last_error()); /* cfx_bind_run released the handle */
}

PyMethodDef lone_allreduce_def = {
    "allreduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(lone_allreduce)),
    METH_FASTCALL,
    "allreduce(form, name, tensor, op, prescale, postscale, compression, ctx_address): the lone "
    "allreduce's per-call path (torch_native.cpp); None when the caller's Python path must take it"};

/* ---- Moving a storage ----
 * The StorageImpl's data pointer is swapped for a block of shared tensor memory holding the same
 * bytes; every tensor that views the storage (DDP's bucket, the reducer's per-parameter views and,
 * with gradient_as_bucket_view, the .grad of the parameters) reads and writes the block from then
 * on, and the old memory goes when the swapped-out DataPtr does. The block goes back to the pool
 * when the storage dies (the pool outlives cfx_shutdown, so that may be later). The caller
 * guarantees that no kernel is using the memory meanwhile: DDP's hook runs once the bucket is full
 * and before anything reads it. */
void free_shared(void *block) { cfx_free(block); }

bool move_to_shared(const at::Tensor &t)
{
    c10::StorageImpl *impl = t.storage().unsafeGetStorageImpl();
    if (!t.is_cpu() || impl->nbytes() == 0)
        return false;
    const size_t nbytes = impl->nbytes();
    if (cfx_is_shared(impl->data(), nbytes))
        return true;
    void *block = nullptr;
    cfx_status st = cfx_alloc(nbytes, &block);
    if (st != CFX_OK)
        throw std::runtime_error(std::string("conflux: move_to_shared: ") + cfx_last_error());
    std::memcpy(block, impl->data(), nbytes);
    impl->set_data_ptr(at::DataPtr(block, block, &free_shared, t.device()));
    return true;
}

} // namespace

PYBIND11_MODULE(_torch_native, m)
{
    m.doc() = "conflux.torch's C++: the optimizer's gradient-set hooks and the lone allreduce "
              "(torch_native.cpp)";
    py::class_<Hooks>(m, "Hooks")
        .def(py::init<std::uintptr_t, const std::vector<at::Tensor> &,
                      const std::vector<at::Tensor> &, py::object>())
        .def("fire", &Hooks::fire, "What backward's hook does for gradient i")
        .def("fire_all", &Hooks::fire_all, "Every hook, last gradient first (benchmarks)")
        .def("fired_any", &Hooks::fired_any)
        .def("fired_all", &Hooks::fired_all)
        .def("fired", &Hooks::fired, "Per gradient, whether its hook ran this step")
        .def("clear", &Hooks::clear)
        .def("remove", &Hooks::remove);
    m.add_object("allreduce", py::reinterpret_steal<py::object>(
                                  PyCFunction_NewEx(&lone_allreduce_def, nullptr, m.ptr())));
    m.def("move_to_shared", &move_to_shared,
          "Moves the memory under the tensor's storage (every view of it) into shared tensor "
          "memory; False for a tensor not on the CPU or an empty storage (torch_native.cpp)");
    m.def("init_allreduce", [](py::object raise_status) {
        Py_XSETREF(g_raise_status, raise_status.release().ptr());
    }, "Sets the function that raises a cfx_status with its message (conflux._core.raise_status)");
}
