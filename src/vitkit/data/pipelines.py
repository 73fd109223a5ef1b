"""The paper's preprocessing for image files: training with torchvision.transforms.v2, evaluation as prediction.

Training follows the ViT paper (and the Inception crop it inherits): a random crop of 8-100%
of the area at an aspect ratio of 3/4-4/3, resized to the model's input, and a horizontal
flip. Evaluation is :class:`vitkit.data.transforms.EvalTransform`, the one evaluation path
that ``vitkit predict`` and ``vitkit inspect`` use too (timm's: resize to ``floor(size /
crop_pct)``, keep the centre). Both take a PIL image -- RGB, or L for a one-channel model --
and give a normalised float32 (C, H, W) tensor; the resizing runs in Pillow, on the PIL image.

torchvision (the ``train`` extra) is imported when a training pipeline is built: vitkit
itself, and evaluation, run without it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple, Union

from ..extras import require
from .transforms import EvalTransform

IntOrPair = Union[int, Sequence[int]]
INTERPOLATIONS = ("bicubic", "bilinear", "nearest")


def _v2() -> Any:
    return require("torchvision.transforms.v2", "train", "the training pipeline of image files (folder, shards)")


def _pair(size: IntOrPair) -> Tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(pair) != 2 or min(pair) <= 0:
        raise ValueError(f"img_size must be a positive int or (height, width), got {size!r}")
    return pair


def _interpolation(name: str) -> Any:
    if name not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {name!r}")
    from torchvision.transforms import InterpolationMode
    return {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR,
            "nearest": InterpolationMode.NEAREST}[name]


def _to_normalised_tensor(v2: Any, mean: Sequence[float], std: Sequence[float]) -> list:
    import torch
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[float(m) for m in mean], std=[float(s) for s in std])]


def train_transform(img_size: IntOrPair, mean: Sequence[float], std: Sequence[float],
                    scale: Tuple[float, float] = (0.08, 1.0), ratio: Tuple[float, float] = (3 / 4, 4 / 3),
                    hflip: float = 0.5, interpolation: str = "bicubic", randaugment: Optional[str] = None
                    ) -> Callable[[Any], Any]:
    """Inception crop (RandomResizedCrop) + horizontal flip [+ RandAugment] + float + normalise.

    ``randaugment``: a spec such as "m9-mstd0.5" (DeiT), applied after the flip as in timm, by
    :class:`vitkit.data.randaugment.RandAugment` from torch's random state (seeded per sample).
    """
    v2 = _v2()
    if not 0 <= hflip <= 1:
        raise ValueError(f"hflip is a probability, got {hflip}")
    steps = [v2.RandomResizedCrop(_pair(img_size), scale=tuple(scale), ratio=tuple(ratio),
                                  interpolation=_interpolation(interpolation), antialias=True)]
    if hflip > 0:
        steps.append(v2.RandomHorizontalFlip(p=hflip))
    if randaugment:
        from .randaugment import RandAugment

        steps += [v2.ToImage(), _TensorOp(RandAugment.from_spec(randaugment))]
    return v2.Compose(steps + _to_normalised_tensor(v2, mean, std))


class _TensorOp:
    """A callable on uint8 (C, H, W) tensors as a pipeline step (the result stays an Image)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, img: Any) -> Any:
        import torch
        from torchvision import tv_tensors
        return tv_tensors.Image(self.fn(img.as_subclass(torch.Tensor)))

    def __repr__(self) -> str:
        return f"{type(self.fn).__name__}()"


def eval_transform(img_size: IntOrPair, mean: Sequence[float], std: Sequence[float],
                   crop_pct: float = 0.875, interpolation: str = "bicubic",
                   crop_mode: str = "center", crop_offset: str = "round") -> Callable[[Any], Any]:
    """Resize to ``floor(size / crop_pct)`` + centre crop + float + normalise: :class:`EvalTransform`."""
    return EvalTransform(_pair(img_size), mean, std, crop_pct, interpolation, crop_mode, crop_offset)


def from_model_config(config: Any, train: bool, randaugment: Optional[str] = None,
                      hflip: float = 0.5) -> Callable[[Any], Any]:
    """The training or evaluation pipeline for a :class:`vitkit.models.vit.ViTConfig`.

    Size, mean, std and interpolation come from the config (the weights' preprocessing);
    ``crop_pct`` is used for evaluation only; ``hflip``: training's flip probability.
    """
    if train:
        return train_transform(config.img_size, config.mean, config.std, interpolation=config.interpolation,
                               randaugment=randaugment, hflip=hflip)
    return eval_transform(config.img_size, config.mean, config.std, crop_pct=config.crop_pct,
                          interpolation=config.interpolation, crop_mode=getattr(config, "crop_mode", "center"),
                          crop_offset=getattr(config, "crop_offset", "round"))
