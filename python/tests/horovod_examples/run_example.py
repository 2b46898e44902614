"""Runs one of Horovod's PyTorch examples (this folder: their files, only the import changed to
conflux.horovod) on every rank of a job and checks what it trained. Usage, under mpirun or cfxrun:

    run_example.py mnist WORKDIR [example arguments...]
    run_example.py synthetic [example arguments...]

mnist: writes a small MNIST-format dataset into WORKDIR/MNIST/raw first (rank 0; torchvision's
MNIST reads it and downloads nothing): 28x28 images whose class k is a bright block at the k-th of
ten places over noise, so a model that trained on the ranks' averaged gradients classifies it.
Then the example runs as `python pytorch_mnist.py --data-dir WORKDIR ...` would.

Checks after the example returns (each rank prints "FAIL: ..." and exits 1 on a failure):
- the parameters the example broadcast from rank 0 at its start (hvd.broadcast_parameters, which
  both examples call with model.state_dict(): its tensors are the model's; those the optimizer
  given to hvd.DistributedOptimizer steps) are bitwise the same on every rank at the end: the
  ranks trained one model on different data;
- training moved them (the last state differs from the first);
- mnist: that model classifies the test images (accuracy over 0.9, computed here with the
  example's own Net on the dataset written here; chance is 0.1).
"""
import hashlib
import os
import runpy
import struct
import sys

import numpy as np
import torch

import conflux.horovod.torch as hvd

HERE = os.path.dirname(os.path.abspath(__file__))
N_TRAIN, N_TEST = 3000, 500


def fail(msg):
    print("FAIL: rank %d: %s" % (hvd.rank(), msg), flush=True)
    sys.exit(1)


def write_mnist(raw_dir, seed=7):
    """The four idx files of MNIST, uncompressed (torchvision looks for them so before it would
    download)."""
    rng = np.random.default_rng(seed)
    os.makedirs(raw_dir, exist_ok=True)
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, k in enumerate(labels):
            r, c = 2 + 12 * (k // 5), 2 + 5 * (k % 5)
            images[i, r:r + 10, c:c + 4] = 255
        with open(os.path.join(raw_dir, prefix + "-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        with open(os.path.join(raw_dir, prefix + "-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 2049, n) + labels.tobytes())


def capture():
    """Keeps the state dict the example broadcasts (and a copy of it as broadcast), and the
    optimizer it hands to hvd.DistributedOptimizer (whose parameters are the ones the ranks
    average; the state dict has buffers too, e.g. BatchNorm's statistics of each rank's own
    data, which Horovod leaves per rank)."""
    seen = {}
    broadcast, distributed = hvd.broadcast_parameters, hvd.DistributedOptimizer

    def keep_state(params, root_rank, *args, **kwargs):
        out = broadcast(params, root_rank, *args, **kwargs)
        if "state" not in seen:
            seen["state"] = params
            seen["initial"] = {k: v.detach().clone() for k, v in dict(params).items()}
        return out

    def keep_optimizer(optimizer, *args, **kwargs):
        seen["optimizer"] = optimizer
        return distributed(optimizer, *args, **kwargs)
    hvd.broadcast_parameters, hvd.DistributedOptimizer = keep_state, keep_optimizer
    return seen


def trained_entries(seen):
    """The names of the state dict's entries that are the optimizer's parameters."""
    ptrs = {p.data_ptr() for g in seen["optimizer"].param_groups for p in g["params"]}
    return sorted(k for k, v in dict(seen["state"]).items() if v.data_ptr() in ptrs)


def digest(state, keys):
    h = hashlib.sha256()
    for k in keys:
        h.update(k.encode())
        h.update(state[k].detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def mnist_accuracy(example_globals, state, data_dir):
    from torchvision import datasets, transforms
    test = datasets.MNIST(data_dir, train=False, transform=transforms.Compose([
        transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]))
    model = example_globals["Net"]()
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        x = torch.stack([test[i][0] for i in range(len(test))])
        y = torch.tensor([test[i][1] for i in range(len(test))])
        return (model(x).argmax(1) == y).float().mean().item()


def main():
    which, rest = sys.argv[1], sys.argv[2:]
    hvd.init()
    if which == "mnist":
        data_dir, rest = rest[0], rest[1:]
        if hvd.rank() == 0:
            write_mnist(os.path.join(data_dir, "MNIST", "raw"))
        hvd.barrier()
        script, argv = "pytorch_mnist.py", ["--data-dir", data_dir] + rest
    elif which == "synthetic":
        script, argv = "pytorch_synthetic_benchmark.py", rest
    else:
        raise SystemExit("run_example.py: unknown example %r (mnist, synthetic)" % which)
    seen = capture()
    path = os.path.join(HERE, script)
    sys.argv = [path] + argv
    example = runpy.run_path(path, run_name="__main__")

    if "state" not in seen or "optimizer" not in seen:
        fail("%s never called hvd.broadcast_parameters or hvd.DistributedOptimizer" % script)
    state, keys = dict(seen["state"]), trained_entries(seen)
    if not keys:
        fail("%s: none of the broadcast state is the optimizer's parameters" % script)
    digests = hvd.allgather_object(digest(state, keys))
    if len(set(digests)) != 1:
        fail("%s: the ranks end with different parameters (digests %s)" % (script, digests))
    if digest(seen["initial"], keys) == digests[0]:
        fail("%s: training left the parameters as they were broadcast" % script)
    if which == "mnist":
        acc = mnist_accuracy(example, state, data_dir)
        if acc < 0.9:
            fail("pytorch_mnist.py: the trained model classifies %.3f of the test images "
                 "(over 0.9 expected; chance is 0.1)" % acc)
        print("rank %d: accuracy %.3f" % (hvd.rank(), acc))
    print("PASS: rank %d of %d: %s trained one model on every rank" % (hvd.rank(), hvd.size(), script),
          flush=True)


if __name__ == "__main__":
    main()
