"""horovod.torch.elastic on Conflux (docs/elastic.md): hvd.elastic.run, State, ObjectState and
TorchState with Horovod's semantics, over Conflux's membership rounds (conflux.elastic). Start the
job with cfxrun --elastic (horovodrun's elastic flags)."""
from ...elastic import State, run  # noqa: F401
from ...torch_elastic import ObjectState, TorchState  # noqa: F401
from ..common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401

_SAMPLER_MSG = ("hvd.elastic.ElasticSampler is not supported by Conflux yet: shard the data by "
                "hvd.rank()/hvd.size() after each reset (a reset callback)")


class ElasticSampler:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_SAMPLER_MSG)
