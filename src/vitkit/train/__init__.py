"""Training: config and recipes, the loop, schedules, checkpoints."""

from .config import RECIPES, TrainConfig, resolve_config
from .loop import NonFiniteLoss, train

__all__ = ["RECIPES", "TrainConfig", "resolve_config", "NonFiniteLoss", "train"]
