"""python/tests/tensorflow: conflux.tensorflow and conflux.keras, one process per rank (TF imports
slowly: every file of this folder runs in the same pytest process). Skipped, saying why, when the
op library was not built (CFX_TF_SKIP_REASON from python/tensorflow.cmake) or does not load."""
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

SKIP_REASON = os.environ.get("CFX_TF_SKIP_REASON")
cfx = None
if not SKIP_REASON:
    try:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        import conflux.tensorflow as cfx
        if cfx.UNAVAILABLE:
            SKIP_REASON = cfx.UNAVAILABLE
    except ImportError as e:
        SKIP_REASON = "conflux.tensorflow does not import: %s" % e


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON:
        mark = pytest.mark.skip(reason="conflux.tensorflow: " + SKIP_REASON)
        for item in items:
            item.add_marker(mark)


@pytest.fixture(scope="session")
def hvd():
    cfx.init()
    yield cfx


@pytest.fixture(scope="session")
def world(hvd):
    return hvd.rank(), hvd.size()
