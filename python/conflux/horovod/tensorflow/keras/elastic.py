"""horovod.tensorflow.keras.elastic on Conflux (conflux.keras.elastic): KerasState, run and the
CommitState/UpdateBatchState/UpdateEpochState callbacks for Keras 3."""
from conflux.keras.elastic import (  # noqa: F401
    CommitStateCallback, HorovodInternalError, HostsUpdatedInterrupt, KerasState, ObjectState,
    State, TensorFlowKerasState, UpdateBatchStateCallback, UpdateEpochStateCallback, run)
