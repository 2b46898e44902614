"""conflux.torch's elastic state (docs/elastic.md): TorchState keeps a model's and an optimizer's
state across changes of the world; everything else is conflux.elastic's."""
import copy

from .elastic import ObjectState, State, run, check_host_updates  # noqa: F401  (re-exported)
from .elastic import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from ._torch_broadcast import broadcast_optimizer_state, broadcast_parameters


class TorchState(ObjectState):
    """A model and an optimizer (either may be None) plus plain attributes, as Horovod's
    hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._saved_model = self._saved_optimizer = None
        super().__init__(**kwargs)
        self._save_torch()

    def _save_torch(self):
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())

    def save(self):
        self._save_torch()
        super().save()

    def restore(self):
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        super().restore()

    def _sync_from(self, root):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=root)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=root)
        super()._sync_from(root)
