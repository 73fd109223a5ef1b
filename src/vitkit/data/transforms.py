"""Evaluation preprocessing as the weights' config prescribes: resize, centre crop, normalise.

The resize keeps ``crop_pct`` of the image after cropping, as timm evaluates: the shorter
side goes to ``floor(size / crop_pct)`` and the centre ``size`` is kept; a non-square input
size resizes each side by the same rule. Pure Pillow + numpy, so prediction needs no
torchvision.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

_RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
             "nearest": Image.Resampling.NEAREST}


def load_image(path: Union[str, Path], channels: int = 3) -> Image.Image:
    """Open an image file upright (EXIF orientation applied) as RGB, or L for 1 channel."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    try:
        with Image.open(path) as im:
            im = ImageOps.exif_transpose(im)
            if im.mode in ("RGBA", "LA", "P"):
                im = im.convert("RGBA")
                background = Image.new("RGBA", im.size, (255, 255, 255, 255))
                im = Image.alpha_composite(background, im)
            return im.convert("L" if channels == 1 else "RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"cannot read image {path}: {e}") from e


class EvalTransform:
    """PIL image -> normalised (C, H, W) float tensor for a model configuration."""

    def __init__(self, img_size: Tuple[int, int], mean: Sequence[float], std: Sequence[float],
                 crop_pct: float = 0.9, interpolation: str = "bicubic"):
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct}")
        if interpolation not in _RESAMPLE:
            raise ValueError(f"interpolation must be one of {list(_RESAMPLE)}")
        self.img_size = tuple(img_size)
        self.mean = np.asarray(mean, dtype=np.float32)[:, None, None]
        self.std = np.asarray(std, dtype=np.float32)[:, None, None]
        self.crop_pct = crop_pct
        self.resample = _RESAMPLE[interpolation]

    @classmethod
    def from_config(cls, config) -> "EvalTransform":
        return cls(config.img_size, config.mean, config.std, config.crop_pct, config.interpolation)

    def resize(self, im: Image.Image) -> Image.Image:
        th, tw = self.img_size
        if th == tw:
            short = math.floor(th / self.crop_pct)
            w, h = im.size
            scale = short / min(w, h)
            size = (max(tw, round(w * scale)), max(th, round(h * scale)))
        else:
            size = (math.floor(tw / self.crop_pct), math.floor(th / self.crop_pct))
        return im.resize(size, self.resample)

    def view(self, im: Image.Image) -> Image.Image:
        """The pixels the model sees: resized, centre-cropped, before normalisation."""
        im = self.resize(im)
        th, tw = self.img_size
        w, h = im.size
        left, top = (w - tw) // 2, (h - th) // 2
        return im.crop((left, top, left + tw, top + th))

    def __call__(self, im: Image.Image) -> torch.Tensor:
        arr = np.asarray(self.view(im), dtype=np.float32) / 255.0
        arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
        arr = (arr - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(arr))
