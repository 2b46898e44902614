"""horovod.tensorflow.keras.callbacks on Conflux (conflux.keras.callbacks)."""
from conflux.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint, BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, MetricAverageCallback)
