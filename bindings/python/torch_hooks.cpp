/*
 * conflux._torch_hooks - the hooks of conflux.torch.DistributedOptimizer's gradient sets, in C++:
 * one post hook on each parameter's AccumulateGrad node that marks the gradient ready
 * (cfx_gradset_ready) with no Python in between, as torch's own DistributedDataParallel hooks its
 * reducer. A Python hook costs each gradient a call into the interpreter (about 1.5-2 us here),
 * which for a model of 10,000 small parameters is several times its allreduce; this costs about
 * 0.1 us. Built where Debian's libtorch-dev and pybind11-dev are installed
 * (CONFLUX_TORCH_HOOKS); without it the optimizer registers the same hooks in Python.
 *
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
 */
#include <Python.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conflux/conflux.h"

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::variable_list;

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
            std::shared_ptr<Node> node = torch::autograd::impl::grad_accumulator(params_[i]);
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
    std::vector<std::shared_ptr<Node>> nodes_;
    std::vector<std::uintptr_t> keys_;
    std::vector<uint8_t> fired_;
};

variable_list ReadyHook::operator()(const variable_list &outputs, const variable_list &)
{
    owner->fire(index);
    return outputs;
}

} // namespace

PYBIND11_MODULE(_torch_hooks, m)
{
    m.doc() = "conflux.torch.DistributedOptimizer's gradient-set hooks in C++ (torch_hooks.cpp)";
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
}
