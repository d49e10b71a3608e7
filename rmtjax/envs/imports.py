"""Which modules environment ids may import when their env is built (never when a config is read)."""

from __future__ import annotations

# Modules that a `gymnasium:<module>:<EnvId>` id may import when its env is built. A config
# alone never imports anything: the user allows each module here, from outside the config.
_ALLOWED_IMPORTS: set[str] = set()


def allow_import(*modules: str) -> None:
    """Let environments named `gymnasium:<module>:<EnvId>` import `module` when they are built
    (importing runs the module's code, so a config or run directory cannot ask for it by
    itself). The CLI's `--allow-import MODULE` calls this."""
    from rmtjax.schema import ConfigError

    for m in modules:
        if not isinstance(m, str) or not m or not all(part.isidentifier() for part in m.split(".")):
            raise ConfigError(f"allow_import: {m!r} is not a module name (e.g. ale_py or my_pkg.envs)")
    _ALLOWED_IMPORTS.update(modules)


def allowed_imports() -> frozenset[str]:
    return frozenset(_ALLOWED_IMPORTS)
