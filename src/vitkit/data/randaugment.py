"""RandAugment as DeiT trains with it: timm's ``rand-m9-mstd0.5-inc1``, on uint8 tensors.

Facts from timm (``timm.data.auto_augment``, ``rand_augment_transform``): ``n`` ops (2) are
chosen per image with replacement from the 15 "increasing" ops; each is applied with
probability 0.5 at a magnitude drawn from ``N(m, mstd)`` clipped to [0, 10]; levels:
rotate ``30 * mag/10`` degrees, shear ``0.3 * mag/10``, translate ``0.45 * mag/10`` of the
side (each with a random sign), colour / contrast / brightness / sharpness factor
``1 +- 0.9 * mag/10``, posterize to ``4 - int(4 * mag/10)`` bits, solarize above
``256 - int(256 * mag/10)``, solarize-add ``int(110 * mag/10)`` below 128; auto-contrast,
equalize and invert take no magnitude. Geometric ops fill with timm's ImageNet mean pixel
(124, 116, 104) (its mean, 115, for one channel).

The ops are torchvision.transforms.v2.functional on tensors rather than PIL's, with timm's
geometry (shears about the top-left corner, translations by the same sub-pixel offset in the
same direction, bilinear); the enhancement means are not rounded as Pillow rounds them, so
pixels can differ from timm's by a grey level (tested op by op against timm's); the
distribution of ops is timm's. Draws come
from an explicit ``torch.Generator`` (or torch's global state when none is given, as in a
DataLoader worker seeded per sample).
"""

from __future__ import annotations

import math
import re
from typing import List, Optional, Tuple

import torch

from ..extras import require

OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
       "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
       "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
_MAX_LEVEL = 10.0


def parse_randaugment(spec: str) -> Tuple[int, float, float]:
    """"m9-mstd0.5" / "rand-m9-mstd0.5-inc1" / "m9-n2" -> (n ops, magnitude, magnitude std)."""
    text = spec.strip()
    text = text[5:] if text.startswith("rand-") else text
    n, m, mstd = 2, None, 0.0
    for part in text.split("-"):
        found = re.fullmatch(r"(mstd|inc|m|n)(\d+(?:\.\d+)?)", part)
        if not found:
            raise ValueError(f"randaugment {spec!r}: cannot read {part!r}; expected e.g. 'm9-mstd0.5' "
                             f"(m magnitude 0-10, n ops, mstd magnitude std, inc1)")
        key, value = found.groups()
        if key == "m":
            m = float(value)
        elif key == "n":
            n = int(float(value))
        elif key == "mstd":
            mstd = float(value)
        elif value not in ("1", "1.0"):
            raise ValueError(f"randaugment {spec!r}: only the increasing ops (inc1, DeiT's) are implemented")
    if m is None or not 0 <= m <= _MAX_LEVEL or n < 1 or mstd < 0:
        raise ValueError(f"randaugment {spec!r}: needs a magnitude m in [0, 10] (e.g. 'm9-mstd0.5'), "
                         f"n >= 1 and mstd >= 0")
    return n, m, mstd


class RandAugment:
    """Callable on uint8 (B, C, H, W) or (C, H, W) tensors with an optional generator."""

    def __init__(self, num_ops: int = 2, magnitude: float = 9.0, magnitude_std: float = 0.5, prob: float = 0.5):
        # the ops are torchvision's: fail here, where the run is set up, not in the first batch
        require("torchvision.transforms.v2", "train", "RandAugment (--randaugment)")
        self.num_ops, self.magnitude, self.magnitude_std, self.prob = num_ops, magnitude, magnitude_std, prob

    @classmethod
    def from_spec(cls, spec: str) -> "RandAugment":
        n, m, mstd = parse_randaugment(spec)
        return cls(n, m, mstd)

    def draw(self, batch: int, generator: Optional[torch.Generator] = None) -> List[List[Tuple[int, float, bool]]]:
        """Per image, the ops applied: (op index, magnitude, negate), in order."""
        g = dict(generator=generator, device="cpu")
        shape = (batch, self.num_ops)
        ops = torch.randint(0, len(OPS), shape, **g)
        apply = torch.rand(shape, **g) < self.prob
        mags = (self.magnitude + self.magnitude_std * torch.randn(shape, **g)).clamp(0, _MAX_LEVEL)
        negate = torch.rand(shape, **g) > 0.5
        return [[(int(ops[b, i]), float(mags[b, i]), bool(negate[b, i]))
                 for i in range(self.num_ops) if apply[b, i]] for b in range(batch)]

    def __call__(self, images: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        single = images.dim() == 3
        x = images[None] if single else images
        if x.dtype != torch.uint8:
            raise ValueError(f"RandAugment takes uint8 images, got {x.dtype}")
        plan = self.draw(len(x), generator)
        out = torch.stack([_apply_all(img, ops) for img, ops in zip(x.as_subclass(torch.Tensor), plan)])
        return out[0] if single else out


def _apply_all(img: torch.Tensor, ops) -> torch.Tensor:
    for op, mag, negate in ops:
        img = apply_op(img, OPS[op], mag, negate)
    return img


def apply_op(img: torch.Tensor, name: str, mag: float, negate: bool = False) -> torch.Tensor:
    """One of :data:`OPS` on a uint8 (C, H, W) image at magnitude ``mag`` (0-10)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    level = mag / _MAX_LEVEL
    sign = -1.0 if negate else 1.0
    C, H, W = img.shape
    fill = [124.0, 116.0, 104.0] if C == 3 else [115.0] * C
    bilinear = InterpolationMode.BILINEAR
    if name == "AutoContrast":
        return F.autocontrast(img)
    if name == "Equalize":
        return F.equalize(img)
    if name == "Invert":
        return F.invert(img)
    if name == "Rotate":
        return F.rotate(img, sign * 30.0 * level, interpolation=bilinear, fill=fill)
    if name == "PosterizeIncreasing":
        return F.posterize(img, 4 - int(level * 4))
    if name == "SolarizeIncreasing":
        threshold = 256 - int(level * 256)
        return img if threshold >= 256 else F.solarize(img, threshold)
    if name == "SolarizeAdd":
        add = int(level * 110)
        return torch.where(img < 128, (img.to(torch.int16) + add).clamp(max=255).to(torch.uint8), img)
    if name in ("ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"):
        factor = 1.0 + sign * 0.9 * level
        fn = {"ColorIncreasing": F.adjust_saturation, "ContrastIncreasing": F.adjust_contrast,
              "BrightnessIncreasing": F.adjust_brightness, "SharpnessIncreasing": F.adjust_sharpness}[name]
        return fn(img, factor)
    if name in ("ShearX", "ShearY"):
        degrees = math.degrees(math.atan(sign * 0.3 * level))
        shear = [degrees, 0.0] if name == "ShearX" else [0.0, degrees]
        # about the top-left corner, as timm's PIL affine (1, f, 0, 0, 1, 0) shears
        return F.affine(img, angle=0.0, translate=[0.0, 0.0], scale=1.0, shear=shear, interpolation=bilinear,
                        fill=fill, center=[0.0, 0.0])
    if name in ("TranslateXRel", "TranslateYRel"):
        # timm's PIL offset samples the input at x + pct * W: the image moves by -pct * W (sub-pixel)
        pct = sign * 0.45 * level
        shift = [-pct * W, 0.0] if name == "TranslateXRel" else [0.0, -pct * H]
        return F.affine(img, angle=0.0, translate=shift, scale=1.0, shear=[0.0, 0.0], interpolation=bilinear,
                        fill=fill)
    raise ValueError(f"unknown RandAugment op {name!r}")
