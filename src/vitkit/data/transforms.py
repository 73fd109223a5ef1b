"""Evaluation preprocessing as the weights' config prescribes: resize, centre crop, normalise.

The one evaluation path for image files: prediction, ``vitkit inspect`` and the validation
and test splits of image folders and shards all use :class:`EvalTransform`, so each sees the
pixels the others see. It is timm's evaluation transform exactly (tested pixel for pixel
against ``timm.data.create_transform``): the image is resized to ``floor(size / crop_pct)``
-- for a square size, its shorter side, the longer one in proportion and truncated (as
torchvision's ``Resize``); for a non-square size, by the ratio that brings one side to its
target and keeps the aspect (timm's ``ResizeKeepRatio``) -- then the centre ``size`` is cut
(offsets rounded as torchvision's ``CenterCrop``). Pure Pillow + numpy, so prediction needs
no torchvision.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from .images import load_image  # noqa: F401 (the decoder every reader uses; re-exported)

_RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
             "nearest": Image.Resampling.NEAREST}


def eval_resize_size(image_size: Tuple[int, int], img_size: Tuple[int, int], crop_pct: float) -> Tuple[int, int]:
    """(width, height) an image of ``image_size`` (width, height) is resized to before the
    centre crop to ``img_size`` (height, width)."""
    w, h = image_size
    sh, sw = math.floor(img_size[0] / crop_pct), math.floor(img_size[1] / crop_pct)
    if sh == sw:  # the shorter side to the scale size, the longer one truncated
        return (sh, int(sh * h / w)) if w <= h else (int(sh * w / h), sh)
    ratio = min(h / sh, w / sw)
    return round(w / ratio), round(h / ratio)


class EvalTransform:
    """PIL image -> normalised (C, H, W) float tensor for a model configuration."""

    def __init__(self, img_size: Tuple[int, int], mean: Sequence[float], std: Sequence[float],
                 crop_pct: float = 0.9, interpolation: str = "bicubic"):
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct}")
        if interpolation not in _RESAMPLE:
            raise ValueError(f"interpolation must be one of {list(_RESAMPLE)}, got {interpolation!r}")
        if any(s <= 0 for s in std):
            raise ValueError(f"std must be positive, got {tuple(std)}")
        self.img_size = tuple(img_size)
        self.mean = np.asarray(mean, dtype=np.float32)[:, None, None]
        self.std = np.asarray(std, dtype=np.float32)[:, None, None]
        self.crop_pct = crop_pct
        self.resample = _RESAMPLE[interpolation]

    @classmethod
    def from_config(cls, config) -> "EvalTransform":
        return cls(config.img_size, config.mean, config.std, config.crop_pct, config.interpolation)

    def resize(self, im: Image.Image) -> Image.Image:
        return im.resize(eval_resize_size(im.size, self.img_size, self.crop_pct), self.resample)

    def view(self, im: Image.Image) -> Image.Image:
        """The pixels the model sees: resized, centre-cropped, before normalisation."""
        im = self.resize(im)
        th, tw = self.img_size
        w, h = im.size
        left, top = int(round((w - tw) / 2.0)), int(round((h - th) / 2.0))
        return im.crop((left, top, left + tw, top + th))

    def __call__(self, im: Image.Image) -> torch.Tensor:
        arr = np.asarray(self.view(im), dtype=np.float32) / 255.0
        arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
        arr = (arr - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(arr))

    def __repr__(self) -> str:
        return f"EvalTransform(img_size={self.img_size}, crop_pct={self.crop_pct})"
