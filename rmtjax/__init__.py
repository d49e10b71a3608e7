"""rmtjax: reinforcement learning where the whole training run is one compiled JAX program.

The public names below are loaded on first use (PEP 562), so importing a layer such as
`rmtjax.replay` or `rmtjax.schema` does not load the driver.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "Config": "rmtjax.config", "ConfigError": "rmtjax.schema", "load_config": "rmtjax.config",
    "make_config": "rmtjax.config", "EvalResult": "rmtjax.driver", "TrainResult": "rmtjax.driver",
    "evaluate": "rmtjax.driver", "load_run": "rmtjax.driver", "make_train": "rmtjax.driver", "train": "rmtjax.driver",
    "load_policy": "rmtjax.driver", "make_policy": "rmtjax.driver", "register_env": "rmtjax.envs",
    "sweep": "rmtjax.sweep", "SweepResult": "rmtjax.sweep", "render_video": "rmtjax.video",
    "export_policy": "rmtjax.driver", "compare": "rmtjax.compare", "CompareResult": "rmtjax.compare",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'rmtjax' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_PUBLIC})
