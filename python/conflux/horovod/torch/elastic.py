"""Horovod elastic training (hvd.elastic) does not exist in Conflux yet: every entry point raises
NotImplementedError naming the feature."""

_MSG = ("Horovod elastic training (hvd.elastic.%s) is not supported by Conflux yet; run a fixed-size "
        "job (cfxrun -np N) instead")


def run(func):
    raise NotImplementedError(_MSG % "run")


class State:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_MSG % type(self).__name__)


class ObjectState(State):
    pass


class TorchState(State):
    pass


class ElasticSampler:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_MSG % "ElasticSampler")
