"""Training: the job config, the stage-schedule trainer, checkpoints and the one-job command.

::

    job = JobConfig.from_dict(json.load(open("job.json")))
    result = Trainer(job, workdir="out", callbacks=[JsonlWriter("out")]).run()
"""

from engine.train.callbacks import Callback, FunctionCallback, JsonlWriter
from engine.train.config import ConfigError, StageConfig
from engine.train.job import JobConfig
from engine.train.trainer import Trainer, TrainResult

__all__ = [
    "Callback",
    "FunctionCallback",
    "JsonlWriter",
    "ConfigError",
    "StageConfig",
    "JobConfig",
    "Trainer",
    "TrainResult",
]
