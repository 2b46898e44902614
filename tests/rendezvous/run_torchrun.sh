#!/bin/sh
# run_torchrun.sh NPROC PROGRAM ARGS...: runs PROGRAM as NPROC processes under torchrun of
# $CFX_PYTHON (the project's .venv, which CMake passes) on this host (--standalone: torch's own c10d
# rendezvous); a PROGRAM ending in .py runs under torchrun's Python, anything else with --no_python.
# Exit 77 with the reason when torch is not installed.
py=${CFX_PYTHON:-python3}
nproc=$1
shift
if ! "$py" -c 'import torch.distributed.run' 2>/dev/null; then
    echo "run_torchrun: skipped: $py cannot import torch.distributed.run (tools/install-python installs it)"
    exit 77
fi
# The launching environment's own settings must not leak into the ranks' world discovery.
unset CFX_RANK CFX_SIZE CFX_RENDEZVOUS_ADDR CFX_RENDEZVOUS_DIR OMPI_COMM_WORLD_SIZE
case "$1" in
    *.py) how=
        if ! "$py" -c 'import conflux.torch' 2>/dev/null; then
            echo "run_torchrun: skipped: conflux.torch does not import from PYTHONPATH=$PYTHONPATH" \
                 "(configure with CONFLUX_WITH_PYTHON=ON)"
            exit 77
        fi ;;
    *) how=--no_python ;;
esac
exec "$py" -m torch.distributed.run --standalone --nproc_per_node="$nproc" \
    --redirects 1 --tee 1 $how "$@"
