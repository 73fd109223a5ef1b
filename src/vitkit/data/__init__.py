"""Data: image reading and transforms (datasets and augmentation grow here)."""

from .transforms import EvalTransform, load_image

__all__ = ["EvalTransform", "load_image"]
