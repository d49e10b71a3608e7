"""rmtjax: reinforcement learning where the whole training run is one compiled JAX program."""

from rmtjax.config import Config, ConfigError, load_config, make_config
from rmtjax.train import EvalResult, TrainResult, evaluate, load_run, make_train, train

__all__ = ["Config", "ConfigError", "EvalResult", "TrainResult", "evaluate", "load_config", "load_run", "make_config",
           "make_train", "train"]
__version__ = "0.1.0"
