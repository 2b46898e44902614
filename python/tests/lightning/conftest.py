"""Lightning (Trainer and Fabric) and Hugging Face Accelerate on torch.distributed's backend
"conflux", at 2 or more ranks.

Run under a launcher, one pytest process per rank: torchrun (`python -m torch.distributed.run
--standalone --nproc_per_node 2 -m pytest python/tests/lightning`), cfxrun/mpirun (`tools/cfxrun
-np 2 python -m pytest python/tests/lightning`) or cfxrun without MPI (`--transport gloo`); CMake:
python/tests/lightning/tests.cmake.

Every test starts without a process group and ends by destroying the one it trained on (the
trainers under test create theirs themselves, Accelerate's is the user's), so each test shows that
its trainer reaches the backend on its own.
"""
import logging
import os
import warnings

import pytest
import torch
import torch.distributed as dist

import conflux.torch  # noqa: F401  (registers the backend "conflux")


def from_launcher(torchrun, mpirun, cfxrun_gloo, default):
    """A variable of whichever launcher started this process (torchrun's, Open MPI's, or cfxrun
    --transport gloo's), as an int."""
    for name in (torchrun, mpirun, cfxrun_gloo):
        if name in os.environ:
            return int(os.environ[name])
    return default


def launcher_size():
    return from_launcher("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "CFX_SIZE", 1)


def launcher_rank():
    return from_launcher("RANK", "OMPI_COMM_WORLD_RANK", "CFX_RANK", 0)


def pytest_configure(config):
    if launcher_size() < 2:
        pytest.exit("python/tests/lightning needs 2 or more ranks (run it under torchrun or "
                    "cfxrun)", 2)
    torch.set_num_threads(1)
    # Lightning's and Accelerate's notes about this machine (no GPU, srun on PATH, few dataloader
    # workers) are not what these tests look at (after their import, which sets Lightning's level).
    import accelerate  # noqa: F401
    import lightning  # noqa: F401
    for name in ("lightning.pytorch", "lightning.fabric", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*(does not have many workers|srun|LeafSpec|"
                            "litlogger|OMP_NUM_THREADS).*")


@pytest.fixture(autouse=True)
def fresh_group():
    """No process group before a test; the test's own destroyed after it."""
    assert not dist.is_initialized(), "a process group was left over from an earlier test"
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def pytest_report_header(config):
    return "rank %d of %d" % (launcher_rank(), launcher_size())
