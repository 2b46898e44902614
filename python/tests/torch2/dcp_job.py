"""One job of the sharded-checkpoint test (dcp_driver.py runs it): torch.distributed.checkpoint on
the backend "conflux", saved by one number of ranks and loaded by another.

  dcp_job.py save DIR          FSDP2 model (fully_shard over every rank) trained SAVE_STEPS steps
                               with SGD+momentum, saved with dcp.save: the model's and the
                               optimizer's sharded state dicts (get_state_dict), a DTensor sharded
                               on dim 0, a plain tensor and an int
  dcp_job.py load DIR N        the same structures, built from other values on this job's ranks,
                               loaded with dcp.load (resharded from the N ranks that saved) and
                               checked: the parameters and momentum buffers against the local
                               reference trained on the N saving ranks' batches (t2common), the
                               DTensor, tensor and int against their known values; then one more
                               step on this job's ranks against the reference's next step

Each rank prints "PASS: ..." or "FAIL: ..." and exits 0 or 1. CFX_TORCH2_BACKEND=gloo runs it on
torch's gloo instead (a check of the test itself).
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

import conflux.torch  # noqa: F401  (registers the backend "conflux")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from t2common import LR, loss_of, make_model, reference_step  # noqa: E402

SAVE_STEPS = 2
MOMENTUM = 0.9
EXACT = dict(rtol=1e-5, atol=1e-6)
EXTRA_SHAPE = (7, 5)  # rows uneven at 2 and 3 ranks


def extra_full():
    return torch.arange(35, dtype=torch.float32).reshape(EXTRA_SHAPE) * 0.5 - 3.0


def extra_dtensor(mesh, full, rank, size):
    chunks = torch.chunk(full, size, dim=0)
    local = chunks[rank] if rank < len(chunks) else full[:0]
    return DTensor.from_local(local.clone(), mesh, [Shard(0)], shape=full.shape,
                              stride=full.stride())


def sharded(mesh, seed):
    model = make_model(seed)
    for layer in (model.fc1, model.fc2, model.fc3):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def reference(save_size, steps):
    """The local model and optimizer after `steps` steps on save_size ranks' batches."""
    ref = make_model(0)
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(steps):
        reference_step(ref, opt, save_size, step)
    return ref, opt


def train(model, opt, rank, steps, first=0):
    for step in range(first, first + steps):
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()


def save(path, rank, size, mesh):
    model = sharded(mesh, 0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    train(model, opt, rank, SAVE_STEPS)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": SAVE_STEPS,
             "extra": extra_dtensor(mesh, extra_full(), rank, size),
             "plain": torch.linspace(-1, 1, 9, dtype=torch.float64)}
    dcp.save(state, checkpoint_id=path)
    dist.barrier()
    return "saved %d sharded parameters, optimizer state, a DTensor, a tensor and an int" % len(
        model_sd)


def load(path, rank, size, mesh, save_size):
    model = sharded(mesh, 123)  # other values: what the load gives must come from the files
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    train(model, opt, rank, 1, first=50)  # momentum buffers exist, with other values
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "step": -1,
             "extra": extra_dtensor(mesh, torch.zeros(EXTRA_SHAPE), rank, size),
             "plain": torch.zeros(9, dtype=torch.float64)}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    assert state["step"] == SAVE_STEPS, state["step"]
    torch.testing.assert_close(state["plain"], torch.linspace(-1, 1, 9, dtype=torch.float64),
                               rtol=0, atol=0)
    extra = state["extra"]
    assert isinstance(extra, DTensor), type(extra)
    torch.testing.assert_close(extra.full_tensor(), extra_full(), rtol=0, atol=0)
    ref, ref_opt = reference(save_size, SAVE_STEPS)
    refs = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.full_tensor(), refs[n].detach(), **EXACT,
                                   msg=lambda m, n=n: "loaded parameter %s: %s" % (n, m))
        buf = opt.state[p]["momentum_buffer"]
        torch.testing.assert_close(buf.full_tensor(), ref_opt.state[refs[n]]["momentum_buffer"],
                                   **EXACT, msg=lambda m, n=n: "loaded momentum of %s: %s" % (n, m))
    # the loaded state trains on: one step on this job's ranks, the reference's on theirs
    train(model, opt, rank, 1, first=SAVE_STEPS)
    reference_step(ref, ref_opt, size, SAVE_STEPS)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.full_tensor(), refs[n].detach(), **EXACT,
                                   msg=lambda m, n=n: "parameter %s a step after loading: %s"
                                   % (n, m))
    return "loaded the %d-rank checkpoint: parameters, momentum, DTensor, tensor, int, next step" \
        % save_size


def main():
    mode, path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    # torchrun: env://; mpirun/cfxrun (no MASTER_ADDR): Conflux's rendezvous
    dist.init_process_group(os.environ.get("CFX_TORCH2_BACKEND", "conflux"),
                            init_method=None if "MASTER_ADDR" in os.environ else "conflux://")
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        mesh = init_device_mesh("cpu", (size,))
        if mode == "save":
            what = save(path, rank, size, mesh)
        else:
            what = load(path, rank, size, mesh, int(sys.argv[3]))
    except Exception:
        print("FAIL: rank %d of %d, dcp %s: %s" % (rank, size, mode, traceback.format_exc()),
              flush=True)
        sys.stdout.flush()
        os._exit(1)  # the other ranks may wait in a collective: the launcher ends them
    print("PASS: rank %d of %d: %s" % (rank, size, what), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
