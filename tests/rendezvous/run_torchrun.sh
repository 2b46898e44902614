#!/bin/sh
# run_torchrun.sh NPROC PROGRAM ARGS...: runs PROGRAM as NPROC processes under Debian's torchrun
# on this host (--standalone: torch's own c10d rendezvous); a PROGRAM ending in .py runs under
# torchrun's Python, anything else with --no_python. Debian 12's torchrun fails at its
# defaults under Python 3.11 (--redirects' parser drops Std.NONE), so the flags a user must pass
# are passed: --redirects 1 --tee 1. Exit 77 with the reason when torch is not installed.
nproc=$1
shift
if ! /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null; then
    echo "run_torchrun: skipped: /usr/bin/python3 cannot import torch.distributed.run (python3-torch)"
    exit 77
fi
# The launching environment's own settings must not leak into the ranks' world discovery.
unset CFX_RANK CFX_SIZE CFX_RENDEZVOUS_ADDR CFX_RENDEZVOUS_DIR OMPI_COMM_WORLD_SIZE
case "$1" in
    *.py) how=
        if ! /usr/bin/python3 -c 'import conflux.torch' 2>/dev/null; then
            echo "run_torchrun: skipped: conflux.torch does not import from PYTHONPATH=$PYTHONPATH" \
                 "(configure with CONFLUX_WITH_PYTHON=ON)"
            exit 77
        fi ;;
    *) how=--no_python ;;
esac
exec /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node="$nproc" \
    --redirects 1 --tee 1 $how "$@"
