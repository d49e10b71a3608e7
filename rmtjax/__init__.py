"""rmtjax: reinforcement learning where the whole training run is one compiled JAX program.

The public names below are loaded on first use (PEP 562), so importing a layer such as
`rmtjax.replay` or `rmtjax.schema` does not load the driver.
"""

from __future__ import annotations

import importlib
import sys
import types

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


def _callable_module(module_name: str, function) -> None:
    """Make the module `module_name` (rmtjax.compare, rmtjax.sweep: modules named after the public
    function they hold) callable as that function. Importing such a module (`from rmtjax.compare
    import ...`) makes it the package's attribute in place of the function; this keeps
    `rmtjax.compare(...)` working either way."""

    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return function(*args, **kwargs)

    sys.modules[module_name].__class__ = CallableModule


def __dir__():
    return sorted({*globals(), *_PUBLIC})
