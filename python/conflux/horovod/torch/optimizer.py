"""horovod.torch.optimizer: Horovod's DistributedOptimizer on gradient sets.

It is conflux.torch's gradient-set optimizer (conflux/_torch_gradset_optimizer.py) with
Horovod's differences. Construction registers the dense CPU gradients in gradient sets on the
process set's context (collective over its ranks: MismatchError, a HorovodInternalError too, names
a gradient registered differently), each .grad a view into the set's storage; backward's hooks
mark them ready and step() waits for the sets. What a set does not hold goes per call, one
allreduce per gradient from its hook, as in Horovod: CUDA parameters, every gradient under a
compressor of one's own, and sparse gradients.

Sparse gradients (nn.Embedding(sparse=True)) are known only once backward made them. During the
first step after registration each registered gradient's layout is watched; at its end one
allreduce over the ranks tells which were sparse on some rank. Those keep the sparse layout
(.grad sparse after every step) and, unless sparse_as_dense, leave the sets (committed anew) for
the allgather of indices and values from then on; that first step reduced them densely in their
set. A gradient first sparse in a later step is reduced densely in its set, as sparse_as_dense
would, and keeps the dense layout."""
import weakref

import torch

from conflux import _core
from conflux._torch_adasum_optimizer import _adasum_optimizer
from conflux._torch_compression import NoneCompressor
from conflux._torch_gradset_optimizer import _DistributedOptimizer as _Base
from conflux._torch_optimizer_args import _checked_passes

from ..common import process_sets as _ps
from . import mpi_ops as _mpi
from .compression import Compression
from .mpi_ops import Adasum, Average, Max, Min, Product, Sum, global_process_set, size


def _check_groups(groups):
    if groups is None:
        return
    if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "torch.Tensor.")
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))


def _place(process_set):
    """conflux._torch_gradset_optimizer's _place for Horovod's process sets (registered ones:
    ValueError for others)."""
    if process_set is None or process_set.process_set_id == 0:
        return _core.current(), _mpi._GLOBAL, True, size()
    subset = _ps.subset_of(process_set)
    if not subset.included():
        return None, None, False, subset.size()
    return subset.context(), _mpi._set_ops(process_set), True, subset.size()


def _empty_sparse(p, sparse_dim):
    """A sparse gradient of p without entries (sparse_dim sparse dimensions)."""
    return torch.sparse_coo_tensor(torch.zeros((sparse_dim, 0), dtype=torch.int64),
                                   torch.zeros((0,) + tuple(p.shape[sparse_dim:]), dtype=p.dtype),
                                   p.shape)


def _wait_set(s):
    _mpi._horovod_errors(s.wait)


def _watch(seen, p):
    """The hook that records the layout of p's gradients in `seen` (1 dense, 1 + its sparse
    dimensions sparse); it runs before backward accumulates them into p.grad. It holds no
    reference to the optimizer, which may go while the hook is on p."""
    def hook(grad):
        layout = 1 + grad.sparse_dim() if grad.is_sparse else 1
        seen[p] = max(seen.get(p, 0), layout)
    return hook


def _remove_layout_hooks(hooks):
    for h in hooks.values():
        h.remove()
    hooks.clear()


class _DistributedOptimizer(torch.optim.Optimizer):
    """What Horovod's optimizer replaces in conflux.torch's (_Base)."""

    _SET_PREFIX = "conflux.horovod.torch.DistributedOptimizer"
    _place = staticmethod(_place)
    _wait_handle = staticmethod(_mpi.synchronize)
    _wait_set = staticmethod(_wait_set)
    _AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                   "optimizer.synchronize(). This can cause training slowdown. You may want to "
                   "consider using optimizer.skip_synchronize() context if you use "
                   "optimizer.synchronize() in your code.")

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, sparse_as_dense, process_set):
        self.sparse_as_dense = sparse_as_dense
        self._layout_hooks = {}  # p -> the hook that watches its gradient's layout (_watch)
        self._watched = set()    # every parameter ever watched
        self._seen = {}          # p -> its gradient's layout on this rank: 1 dense, 1 + sparse dims
        self._sparse = {}        # p -> sparse dimensions, for gradients sparse on some rank
        weakref.finalize(self, _remove_layout_hooks, self._layout_hooks)
        _Base.__init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, "conflux", process_set=process_set)

    def _register(self, params):
        _mpi._horovod_errors(_Base._register, self, params)
        for s in self._sets:
            for p in s.params:
                if p not in self._watched:
                    self._watched.add(p)
                    self._layout_hooks[p] = p.register_hook(_watch(self._seen, p))

    def _settle_layouts(self):
        """The end of the first step that produced some of the newly registered gradients on
        some rank: which of them were sparse on some rank (one allreduce per step until then,
        Max of a layout code per gradient)."""
        watched = sorted(self._layout_hooks, key=self._parameter_names.get)
        mine = torch.tensor([self._seen.get(p, 0) for p in watched], dtype=torch.int32)
        handle = self._ops.allreduce_async(mine, op=Max, name=self._sets[-1].name + ".layouts")
        layouts = self._wait_handle(handle).tolist()
        if not any(layouts):  # no backward yet anywhere (or none reached these gradients)
            return
        _remove_layout_hooks(self._layout_hooks)
        sparse = {p: code - 1 for p, code in zip(watched, layouts) if code > 1}
        self._sparse.update(sparse)
        if sparse and not self.sparse_as_dense:
            self._rebuild(leave=sparse)  # collective: the same `sparse` on every rank

    def _world_reformed(self):
        """As a newcomer settles its gradients' layouts after its first step, so does every rank
        of a new world, from scratch: the settling allreduce and the sets then match."""
        _remove_layout_hooks(self._layout_hooks)
        self._watched.clear()
        self._seen.clear()
        self._sparse.clear()
        _Base._world_reformed(self)

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Not produced on this rank (dynamic graphs); other ranks may have it: send zeros
            # (no entries for a gradient known to be sparse).
            dims = self._sparse.get(p)
            p.grad = torch.zeros_like(p) if dims is None else _empty_sparse(p, dims)
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return (_mpi._sparse_allreduce(self._ops, tensor, name, self.op, 1.0, 1.0),
                        (tensor, None, NoneCompressor))
            tensor = tensor.to_dense()
        return self._dense_allreduce(tensor, name)

    @staticmethod
    def _take(p, aggregated):
        if p.grad.is_sparse:
            if not aggregated.is_sparse:  # sparse_as_dense: back to the gradient's layout
                aggregated = aggregated.to_sparse(p.grad.sparse_dim())
            p.grad.zero_().add_(aggregated)
        elif aggregated is not p.grad:
            p.grad.set_(aggregated)

    def synchronize(self):
        """Waits for every gradient's reduction (the gradient sets, and the per-call allreduces,
        starting those whose hooks did not fire); sparse gradients keep their layout."""
        _Base.synchronize(self)
        if not self._distributed:
            return
        if self._layout_hooks:
            self._settle_layouts()
        for p, dims in self._sparse.items():
            if p.grad is not None and not p.grad.is_sparse:
                p.grad = p.grad.to_sparse(dims)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Horovod's DistributedOptimizer: gradients are reduced over `process_set` as backward
    produces them and step() waits for them (a rank outside the set reduces nothing).
    Construction is collective over the set's ranks: the dense CPU gradients are registered in
    gradient sets on its context (each .grad a view into the set's storage; HorovodInternalError,
    also a conflux.MismatchError, names a gradient registered differently on some rank), and so
    is a later add_param_group(). CUDA gradients, every gradient under a compressor of one's own
    and sparse gradients are allreduced one by one from their hooks; sparse ones (known after the
    first step) as allgathers of indices and values, or as dense tensors with
    sparse_as_dense=True. `num_groups`/`groups` (grouping hints) are checked and otherwise
    ignored: Conflux fuses ready tensors by itself. compression=Compression.fp16 is the engine's
    wire compression for float32/float64 CPU gradients (their gradient set's; rounded once where
    they are packed, combined in float32; Horovod's cast elsewhere). op=Adasum (more than one
    rank, the global set): Adasum combines each rank's optimizer update, as Horovod's Adasum
    optimizer does."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        import warnings
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    _check_groups(groups)
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    _checked_passes(backward_passes_per_step)
    if op == Adasum and size() > 1:
        if process_set is not global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        return _adasum_optimizer(optimizer, named_parameters, compression,
                                 backward_passes_per_step,
                                 {"_wait_handle": staticmethod(_mpi.synchronize)})
    if op not in (Sum, Average, Min, Max, Product, Adasum):
        raise ValueError("unknown reduction op %r" % (op,))
    attributes = {k: v for cls in (_Base, _DistributedOptimizer) for k, v in vars(cls).items()
                  if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), attributes)
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
                  op, gradient_predivide_factor, sparse_as_dense, process_set)
    wrapped.defaults = optimizer.defaults  # for add_param_group (the class's own are placeholders)
    return wrapped
