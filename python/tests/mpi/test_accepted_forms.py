"""What every binding accepts alike (docs/bindings.md): the default op of allreduce and
reducescatter is Average, and a compression may be given as its name ("fp16", "BF16", ...) as well
as a conflux.Compression. Results are checked against every rank's contribution recomputed here,
and the name form against the enum form of the same call (bitwise: the same rounding)."""
import numpy as np
import pytest
import torch

import conflux
import conflux.torch as ct

from conftest import contribution


def _all_inputs(size, shape, seed):
    return [contribution(r, shape, "float64", seed) for r in range(size)]


def test_default_op_is_average_numpy_and_torch(rank, size):
    xs = _all_inputs(size, (7,), 41)
    want = sum(xs) / size
    np.testing.assert_allclose(conflux.allreduce(xs[rank].copy(), name="forms.avg.np"), want)
    got = ct.allreduce(torch.from_numpy(xs[rank].copy()), name="forms.avg.torch")
    np.testing.assert_allclose(got.numpy(), want)
    rows = _all_inputs(size, (size * 2,), 42)
    mine = conflux.reducescatter(rows[rank].copy(), name="forms.avg.rs")
    np.testing.assert_allclose(mine, (sum(rows) / size)[rank * 2:rank * 2 + 2])


@pytest.mark.parametrize("name", ["fp16", "bf16", "FP16_everywhere", "bf16_everywhere", "none"])
def test_compression_by_name_is_the_enum(rank, size, name):
    xs = [x / 7.0 for x in _all_inputs(size, (33,), 43)]
    x = xs[rank].astype(np.float32)
    by_enum = conflux.allreduce(x, op=conflux.Sum, name="forms.z.enum." + name,
                                compression=conflux.Compression[name.lower()])
    by_name = conflux.allreduce(x, op=conflux.Sum, name="forms.z.name." + name, compression=name)
    assert by_name.tobytes() == by_enum.tobytes()
    np.testing.assert_allclose(by_name, sum(xs), rtol=1e-2, atol=1e-2)
    t = ct.allreduce(torch.from_numpy(x.copy()), op=ct.Sum, name="forms.z.torch." + name,
                     compression=name)
    assert t.numpy().tobytes() == by_enum.tobytes()


def test_compression_names_are_the_c_list():
    assert [c.name for c in conflux.Compression] == list(conflux._capi.cfx_py_compression_names())
    assert [int(c) for c in conflux.Compression] == list(range(len(conflux.Compression)))
    with pytest.raises(ValueError, match="unknown compression 'fp8'"):
        conflux.allreduce(np.ones(2, np.float32), compression="fp8")
