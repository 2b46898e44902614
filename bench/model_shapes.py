"""The parameter shapes of a model in bench/workloads/<model>.tsv (one `name<TAB>AxBxC` line a
parameter, in registration order; '#' starts a comment line), for the Python benchmarks."""
import os

WORKLOADS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads")


def read_tsv(path):
    """[(name, (d0, d1, ...)), ...] in the file's order."""
    shapes = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, dims = line.split()
            shapes.append((name, tuple(int(d) for d in dims.split("x"))))
    return shapes
