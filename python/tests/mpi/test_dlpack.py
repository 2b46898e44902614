"""DLPack objects in the NumPy functions across ranks: numpy's own __dlpack__ (through an object
offering only __dlpack__/__dlpack_device__), torch tensors through theirs, and such a capsule-only
object over a torch tensor; in-place results land in the original memory, and every result is
checked against the sum of what each rank contributed, recomputed here (conftest.contribution)."""
import numpy as np
import pytest

import conflux
from conftest import contribution

torch = pytest.importorskip("torch", reason="torch (python3-torch) is needed for its DLPack tensors")


class CapsuleOnly:
    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, stream=None):
        return self.inner.__dlpack__()

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


def ranks_sum(size, shape, dtype_name, seed):
    return sum(contribution(r, shape, dtype_name, seed) for r in range(size))


KINDS = {
    "numpy": lambda a: (a, CapsuleOnly(a)),
    "torch": lambda a: (torch.from_numpy(a),) * 2,
    "capsule_only_torch": lambda a: (torch.from_numpy(a), CapsuleOnly(torch.from_numpy(a))),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("dtype_name", ["float32", "float64", "int32"])
def test_allreduce_in_place_writes_the_original_memory(kind, dtype_name, rank, size):
    shape = (7, 5)
    a = contribution(rank, shape, dtype_name, 61).astype(dtype_name)
    owner, x = KINDS[kind](a)
    address = a.ctypes.data
    assert conflux.allreduce_(x, op=conflux.Sum, name="dl.%s.%s" % (kind, dtype_name)) is x
    np.testing.assert_array_equal(a, ranks_sum(size, shape, dtype_name, 61))
    assert a.ctypes.data == address
    h = conflux.allreduce_async_(x, op=conflux.Sum, name="dl.async.%s.%s" % (kind, dtype_name))
    assert conflux.synchronize(h) is x
    np.testing.assert_array_equal(a, size * ranks_sum(size, shape, dtype_name, 61))


def test_out_of_place_and_broadcast_of_torch_tensors(rank, size):
    t = torch.from_numpy(contribution(rank, (9,), "float32", 62).astype(np.float32))
    before = t.clone()
    out = conflux.allreduce(CapsuleOnly(t), op=conflux.Sum, name="dl.out")
    np.testing.assert_array_equal(out, ranks_sum(size, (9,), "float32", 62))
    assert torch.equal(t, before)
    conflux.broadcast_(t, root_rank=1, name="dl.bcast")
    np.testing.assert_array_equal(t.numpy(), contribution(1, (9,), "float32", 62))


def test_gradient_set_borrowed_dlpack(rank, size):
    grads = {"w": ((4, 3), torch.float32), "b": ((6,), torch.float64)}
    tensors = {n: torch.zeros(s, dtype=d) for n, (s, d) in grads.items()}
    names = sorted(grads, reverse=rank % 2 == 1)       # registration order differs by rank
    with conflux.GradientSet("dl.gs", op=conflux.Sum, owned=False, bucket_bytes=64) as gs:
        for n in names:
            gs.add(n, array=tensors[n] if n == "w" else CapsuleOnly(tensors[n]))
        gs.commit()
        for step in range(2):
            for k, n in enumerate(sorted(grads)):
                shape, dt = grads[n]
                tensors[n].copy_(torch.from_numpy(
                    contribution(rank, shape, "float64", 70 + 2 * step + k)))
            for n in names[::-1]:
                gs.ready(n)
            gs.wait(timeout=60)
            for k, n in enumerate(sorted(grads)):
                shape, dt = grads[n]
                np.testing.assert_array_equal(tensors[n].numpy(),
                                              ranks_sum(size, shape, "float64", 70 + 2 * step + k))
