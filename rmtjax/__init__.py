"""rmtjax: reinforcement learning where the whole training run is one compiled JAX program."""

from rmtjax.config import Config, ConfigError, load_config, make_config
from rmtjax.train import TrainResult, make_train, train

__all__ = ["Config", "ConfigError", "TrainResult", "load_config", "make_config", "make_train", "train"]
__version__ = "0.1.0"
