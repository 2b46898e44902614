"""What Horovod's test_torch.py takes from Horovod's test/utils/common.py, for this folder."""
import contextlib
import os
import tempfile


def mpi_env_rank_and_size():
    """The rank and size Open MPI's launcher gave this process ((0, 1) outside mpirun)."""
    rank = os.environ.get("OMPI_COMM_WORLD_RANK")
    size = os.environ.get("OMPI_COMM_WORLD_SIZE")
    return (int(rank), int(size)) if rank is not None else (0, 1)


def skip_or_fail_gpu_test(test, message):
    """Skips a GPU test (with its reason) where no GPU is usable."""
    test.skipTest(message)


@contextlib.contextmanager
def temppath():
    """A path for a temporary file, removed afterwards."""
    fd, path = tempfile.mkstemp()
    os.close(fd)
    os.remove(path)  # a fresh name with nothing there yet, as Horovod's helper gives
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)
