"""Training: config and recipes, the loop, schedules, checkpoints.

The loop (and torch) load on first use of ``train`` or ``NonFiniteLoss``: the command line
builds its flags from the config alone.
"""

from typing import Any

from .config import RECIPES, TrainConfig, resolve_config


def __getattr__(name: str) -> Any:
    if name in ("NonFiniteLoss", "train"):
        from . import loop

        value = getattr(loop, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vitkit.train' has no attribute {name!r}")


__all__ = ["RECIPES", "TrainConfig", "resolve_config", "NonFiniteLoss", "train"]
