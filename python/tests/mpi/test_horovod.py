"""conflux.horovod.torch: Horovod 0.28's documented torch API (names, arguments, defaults, return
values, exception types), and a Horovod-style training script that runs unchanged apart from its
import line."""
import inspect
import os
import re

import pytest
torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import conflux
import conflux.horovod.torch as hvd

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "horovod_style_train.py")

# Horovod 0.28 horovod.torch exports (HOROVOD-NOTES.md section 4).
DOCUMENTED = """
init shutdown is_initialized size rank local_rank local_size cross_rank cross_size
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built
cuda_built rocm_built start_timeline stop_timeline Average Sum Adasum Min Max Product
HorovodInternalError allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce
grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async
allgather allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_async
broadcast_ broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
grouped_reducescatter grouped_reducescatter_async poll synchronize join barrier ProcessSet
global_process_set add_process_set remove_process_set DistributedOptimizer broadcast_parameters
broadcast_optimizer_state broadcast_object allgather_object Compression SyncBatchNorm elastic
""".split()

# (function, Horovod 0.28 parameter list with defaults as text)
SIGNATURES = {
    "init": "(comm=None, process_sets=None)",
    "allreduce": "(tensor, average=None, name=None, compression=<class 'Compression.none'>, op=None, "
                 "prescale_factor=1.0, postscale_factor=1.0, process_set=global)",
    "allreduce_async": "(tensor, average=None, name=None, op=None, prescale_factor=1.0, "
                       "postscale_factor=1.0, process_set=global)",
    "allreduce_": "(tensor, average=None, name=None, op=None, prescale_factor=1.0, "
                  "postscale_factor=1.0, process_set=global)",
    "allgather": "(tensor, name=None, process_set=global)",
    "broadcast": "(tensor, root_rank, name=None, process_set=global)",
    "broadcast_": "(tensor, root_rank, name=None, process_set=global)",
    "alltoall": "(tensor, splits=None, name=None, process_set=global)",
    "reducescatter": "(tensor, name=None, compression=<class 'Compression.none'>, op=Average, "
                     "process_set=global, prescale_factor=1.0, postscale_factor=1.0)",
    "join": "(device=-1)",
    "barrier": "(process_set=global)",
    "broadcast_parameters": "(params, root_rank, process_set=global)",
    "broadcast_optimizer_state": "(optimizer, root_rank, model=None, process_set=global)",
    "broadcast_object": "(obj, root_rank=0, name=None, process_set=global)",
    "allgather_object": "(obj, name=None, process_set=global)",
    "DistributedOptimizer": "(optimizer, named_parameters=None, compression=<class "
                            "'Compression.none'>, backward_passes_per_step=1, op=Average, "
                            "gradient_predivide_factor=1.0, num_groups=0, groups=None, "
                            "sparse_as_dense=False, process_set=global)",
}


def render(fn):
    parts = []
    for p in inspect.signature(fn).parameters.values():
        if p.default is inspect.Parameter.empty:
            parts.append(p.name)
            continue
        d = p.default
        if d is hvd.global_process_set:
            text = "global"
        elif d is hvd.Compression.none:
            text = "<class 'Compression.none'>"
        elif p.name == "op" and d == hvd.Average:
            text = "Average"
        else:
            text = repr(d)
        parts.append("%s=%s" % (p.name, text))
    return "(" + ", ".join(parts) + ")"


def test_documented_names_exist():
    missing = [n for n in DOCUMENTED if not hasattr(hvd, n)]
    assert not missing, missing


@pytest.mark.parametrize("fn", sorted(SIGNATURES))
def test_signatures_match_horovod(fn):
    assert render(getattr(hvd, fn)) == SIGNATURES[fn]


def test_script_uses_only_documented_api_and_one_changed_line():
    src = open(SCRIPT).read()
    imports = [l for l in src.splitlines() if re.match(r"\s*(import|from)\s", l)]
    hvd_imports = [l for l in imports if "horovod" in l]
    assert hvd_imports == ["import conflux.horovod.torch as hvd"]
    used = set(re.findall(r"\bhvd\.(\w+)", src))
    assert used and used <= set(DOCUMENTED), used - set(DOCUMENTED)


@pytest.mark.parametrize("args", [[], ["--fp16-allreduce", "--clip-grad"],
                                  ["--gradient-predivide-factor", "2.0"]])
def test_horovod_style_script_runs_unchanged(args, rank, size):
    import runpy
    ns = runpy.run_path(SCRIPT)
    result = ns["main"](["--epochs", "3"] + args)
    assert result["size"] == size
    assert result["losses"][-1] < result["losses"][0]


def test_init_repeated_and_after_shutdown(rank, size):
    hvd.init()
    hvd.init()
    assert hvd.is_initialized() and hvd.size() == size and hvd.rank() == rank
    # One rank's shutdown stops every rank's context: without the barrier a fast rank could shut
    # down before a slow one has checked is_initialized() above.
    hvd.barrier()
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.rank()
    hvd.init()
    assert hvd.rank() == rank
    t = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum)
    assert t.item() == size * (size - 1) / 2


def test_capabilities_are_truthful():
    f = conflux.features()
    assert hvd.mpi_built() is f["mpi"] and hvd.mpi_built()  # these suites run under mpirun
    assert hvd.gloo_built() is False and hvd.gloo_enabled() is False
    assert bool(hvd.nccl_built()) == f["nccl"]
    assert hvd.cuda_built() == f["cuda"]
    assert hvd.rocm_built() is False and hvd.ddl_built() is False and hvd.ccl_built() is False
    assert isinstance(hvd.mpi_threads_supported(), bool)


def test_unsupported_features_raise_not_implemented(rank, size):
    with pytest.raises(NotImplementedError, match="ElasticSampler"):
        hvd.elastic.ElasticSampler(None)
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


def test_timeline_per_rank_file(rank, size, tmp_path_factory):
    import json
    # every rank agrees on the directory: rank 0's temporary path, broadcast
    base = hvd.broadcast_object(str(tmp_path_factory.mktemp("tl")) if rank == 0 else None, 0)
    path = os.path.join(base, "hvd.json")
    hvd.start_timeline(path, mark_cycles=True)
    hvd.allreduce(torch.ones(3), name="hvd.timeline.tensor")
    hvd.stop_timeline()
    hvd.barrier()
    mine = os.path.join(base, "hvd.rank%d.json" % rank)
    with open(mine) as f:
        events = json.load(f)  # complete, valid JSON
    assert "hvd.timeline.tensor" in json.dumps(events)
    hvd.stop_timeline()  # stopping twice is fine


def test_average_keyword_backwards_compatible(rank, size):
    with pytest.warns(DeprecationWarning):
        t = hvd.allreduce(torch.tensor([float(rank)]), average=False)
    assert t.item() == size * (size - 1) / 2


def test_collective_error_is_horovod_internal_error(rank, size):
    t = torch.ones(2 if rank else 3)
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.synchronize(hvd.allreduce_async(t, name="hvd.mismatch"))
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, conflux.MismatchError)
    assert "hvd.mismatch" in str(info.value)
    with pytest.raises(hvd.HorovodInternalError):
        hvd.allreduce(t, name="hvd.mismatch2")
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size


def test_unsupported_dtype_value_or_type_error(rank, size):
    for exc in (ValueError, TypeError):  # Horovod raises ValueError; Conflux's error is both
        with pytest.raises(exc, match="not supported"):
            hvd.allreduce(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce_(torch.zeros(4, 4).t())


def test_alltoall_return_forms(rank, size):
    t = torch.arange(size, dtype=torch.float32) + 10 * rank
    out = hvd.alltoall(t)
    assert isinstance(out, torch.Tensor)
    assert out.tolist() == [10 * r + rank for r in range(size)]
    out, splits = hvd.alltoall(t, splits=[1] * size)
    assert splits.tolist() == [1] * size


@pytest.mark.parametrize("garbage", [0.0, 3.0e38, float("nan"), float("inf"), -1e20])
def test_alltoall_splits_of_a_float_dtype_is_a_value_error_on_every_rank(rank, size, garbage):
    """Horovod's test_horovod_alltoall_splits_type_error passes float32 splits of uninitialized
    values: whatever they hold on each rank (here a different value per rank, some beyond any int),
    every rank refuses them with the same ValueError before anything is submitted, and the next
    collective runs (the ranks still agree on what ran)."""
    splits = torch.full((size,), garbage if rank % 2 else float(rank), dtype=torch.float32)
    t = torch.arange(size, dtype=torch.float32)
    with pytest.raises(ValueError, match="splits must be of an integer dtype, not torch.float32"):
        hvd.alltoall(t, splits)
    out = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name="after_splits_error")
    assert out.item() == sum(range(size))


def test_alltoall_splits_out_of_range_are_value_errors_not_overflow(rank, size):
    t = torch.arange(size, dtype=torch.float32)
    for bad in ([2 ** 64] * size, [-1] * size):
        with pytest.raises(ValueError, match=r"splits\[0\] is -?\d+; a split is a row count"):
            hvd.alltoall(t, bad)
    with pytest.raises(TypeError, match="sequence of ints"):
        hvd.alltoall(t, [1.5] * size)


def test_join_and_barrier(rank, size):
    hvd.barrier()
    assert hvd.join() in range(size)


def test_sync_batch_norm_uses_global_statistics(rank, size):
    torch.manual_seed(0)
    full = torch.randn(4 * size, 3, dtype=torch.float64) * 3 + 1
    mine = full[rank * 4:(rank + 1) * 4].clone().requires_grad_(True)
    bn = hvd.SyncBatchNorm(3).double()
    out = bn(mine)
    ref_bn = torch.nn.BatchNorm1d(3).double()
    ref_in = full.clone().requires_grad_(True)
    ref = ref_bn(ref_in)
    assert torch.allclose(out, ref[rank * 4:(rank + 1) * 4], atol=1e-8)
    assert torch.allclose(bn.running_mean, ref_bn.running_mean, atol=1e-8)
    assert torch.allclose(bn.running_var, ref_bn.running_var, atol=1e-8)
    w = torch.arange(12 * size, dtype=torch.float64).reshape(4 * size, 3)
    (out * w[rank * 4:(rank + 1) * 4]).sum().backward()
    (ref * w).sum().backward()
    assert torch.allclose(mine.grad, ref_in.grad[rank * 4:(rank + 1) * 4], atol=1e-8)


def test_sparse_allreduce(rank, size):
    i = torch.tensor([[rank, 0]])
    v = torch.tensor([1.0, 2.0])
    sp = torch.sparse_coo_tensor(i, v, size=(size,))
    res = hvd.sparse_allreduce_async(sp, name="hvd.sparse", op=hvd.Sum)().to_dense()
    want = torch.zeros(size)
    for r in range(size):
        want[r] += 1.0
        want[0] += 2.0
    assert torch.allclose(res, want)
