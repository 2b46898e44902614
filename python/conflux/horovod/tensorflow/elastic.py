"""horovod.tensorflow.elastic on Conflux (conflux.tensorflow.elastic): hvd.elastic.run, State,
ObjectState, TensorFlowState and TensorFlowKerasState, started with cfxrun --elastic."""
from conflux.tensorflow.elastic import (  # noqa: F401
    HorovodInternalError, HostsUpdatedInterrupt, ObjectState, State, TensorFlowKerasState,
    TensorFlowState, run)
