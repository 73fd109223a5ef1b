"""Evaluation preprocessing as the weights' config prescribes: resize, centre crop, normalise.

The one evaluation path for image files: prediction, ``vitkit inspect`` and the validation
and test splits of image folders and shards all use :class:`EvalTransform`, so each sees the
pixels the others see. It is timm's evaluation transform exactly (tested pixel for pixel
against ``timm.data.create_transform``): the image is resized to ``floor(size / crop_pct)``
-- for a square size, its shorter side, the longer one in proportion and truncated (as
torchvision's ``Resize``); for a non-square size, by the ratio that brings one side to its
target and keeps the aspect (timm's ``ResizeKeepRatio``); with ``crop_mode='squash'`` the whole
image to that height and width, its aspect not kept (timm's ``crop_mode='squash'``, and Hugging
Face's processors that resize to a height and width) -- then the centre ``size`` is cut
(offsets rounded as torchvision's ``CenterCrop``, or floored as transformers' processors:
``crop_offset``). With ``crop_mode='border'`` the longer side goes to the scale size instead, and
the image is padded to the model's size with the mean's colour (timm's ``ResizeKeepRatio(longest=1)``
and ``CenterCropOrPad``): nothing is cut off; ``crop_offset='start'`` keeps it at the top left and pads the
right and bottom of the normalised image with zeros (SAM's processor). Pure Pillow + numpy, so prediction needs
no torchvision.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image

from ..models.config_base import CROP_MODES, CROP_OFFSETS
from .images import BadImageError, decode_image, load_image, to_rgb

_RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
             "nearest": Image.Resampling.NEAREST}


#: The most pixels evaluation resizes an image to before its centre crop. The shorter side is scaled
#: to the model's size, so a long thin image grows by its aspect ratio (1 x 1,000,000 pixels, a 1 KB
#: PNG, would become 28 x 28,000,000 for a 28 px model: gigabytes for one image).
MAX_RESIZED_PIXELS = 40_000_000


class ImageShapeError(ValueError):
    """An image whose aspect ratio is so far from the model's that resizing it would take more than
    :data:`MAX_RESIZED_PIXELS`; readers turn it into a :class:`~vitkit.data.images.BadImageError`
    naming the file."""


def eval_resize_size(image_size: Tuple[int, int], img_size: Tuple[int, int], crop_pct: float,
                     crop_mode: str = "center") -> Tuple[int, int]:
    """(width, height) an image of ``image_size`` (width, height) is resized to before the
    centre crop to ``img_size`` (height, width)."""
    w, h = image_size
    sh, sw = math.floor(img_size[0] / crop_pct), math.floor(img_size[1] / crop_pct)
    if crop_mode == "squash":
        return sw, sh
    if crop_mode == "border":  # the longer side (relative to the size) to it, the other in proportion
        ratio = max(h / sh, w / sw)
        return round(w / ratio), round(h / ratio)
    if sh == sw:  # the shorter side to the scale size, the longer one truncated
        return (sh, int(sh * h / w)) if w <= h else (int(sh * w / h), sh)
    ratio = min(h / sh, w / sw)
    return round(w / ratio), round(h / ratio)


def with_fixed_draws(seed: int, transform: Any, value: Any) -> Any:
    """``transform(value)`` with its random draws fixed by ``seed`` (a training sample's crops and flips, the same
    after a resume), the caller's random state left as it was. The CPU generator alone is reseeded:
    torch.manual_seed would reseed a GPU's too, which fork_rng(devices=[]) does not put back."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return transform(value)


class EvalTransform:
    """PIL image -> normalised (C, H, W) float tensor for a model configuration."""

    def __init__(self, img_size: Tuple[int, int], mean: Sequence[float], std: Sequence[float],
                 crop_pct: float = 0.9, interpolation: str = "bicubic", crop_mode: str = "center",
                 crop_offset: str = "round"):
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct}")
        if crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode must be one of {list(CROP_MODES)}, got {crop_mode!r}")
        if crop_offset not in CROP_OFFSETS:
            raise ValueError(f"crop_offset must be one of {list(CROP_OFFSETS)}, got {crop_offset!r}")
        if interpolation not in _RESAMPLE:
            raise ValueError(f"interpolation must be one of {list(_RESAMPLE)}, got {interpolation!r}")
        if any(s <= 0 for s in std):
            raise ValueError(f"std must be positive, got {tuple(std)}")
        self.img_size = tuple(img_size)
        self.mean = np.asarray(mean, dtype=np.float32)[:, None, None]
        #: the padding's colour (``border``): timm's round(255 * mean) of the mean as given (0.3: 76, float32's 77)
        self.fill = [round(255 * float(m)) for m in mean]
        self.std = np.asarray(std, dtype=np.float32)[:, None, None]
        self.crop_pct = crop_pct
        self.crop_mode = crop_mode
        self.crop_offset = crop_offset
        self.resample = _RESAMPLE[interpolation]

    @classmethod
    def from_config(cls, config) -> "EvalTransform":
        return cls(config.img_size, config.mean, config.std, config.crop_pct, config.interpolation,
                   getattr(config, "crop_mode", "center"), getattr(config, "crop_offset", "round"))

    def resize(self, im: Image.Image) -> Image.Image:
        size = eval_resize_size(im.size, self.img_size, self.crop_pct, self.crop_mode)
        if size[0] * size[1] > MAX_RESIZED_PIXELS:
            raise ImageShapeError(f"{im.size[0]} x {im.size[1]} pixels would be resized to {size[0]:,} x {size[1]:,} "
                                  f"before the centre crop to {self.img_size[1]} x {self.img_size[0]} (more than "
                                  f"{MAX_RESIZED_PIXELS:,} pixels): crop it nearer to the model's aspect ratio")
        return im.resize(size, self.resample)

    def view(self, im: Image.Image, pad: bool = True) -> Image.Image:
        """The pixels the model sees: in its channels (RGB or grey, converted as :func:`.images.to_rgb` converts a
        decoded file: a palette, 16-bit grey or an alpha channel read as ``preprocess`` reads them), resized,
        centre-cropped, before normalisation. ``pad=False``: the resized image without the padding ``'border'``
        with ``crop_offset='start'`` adds after normalising (SAM's: :meth:`__call__`)."""
        channels = len(self.mean)
        if channels in (1, 3) and im.mode != ("L" if channels == 1 else "RGB"):  # (other counts: as given)
            im = to_rgb(im, channels)
        im = self.resize(im)
        th, tw = self.img_size
        w, h = im.size
        if not pad:
            return im.crop((0, 0, min(w, tw), min(h, th)))
        if self.crop_mode == "border" and (w < tw or h < th):
            im = self._pad(im, max(w, tw), max(h, th))
            w, h = im.size
        if self.crop_offset == "start":  # (SAM's: the image at the top left, padded at the right and bottom)
            left = top = 0
        elif self.crop_offset == "floor":  # transformers' processors
            left, top = (w - tw) // 2, (h - th) // 2
        else:  # torchvision's CenterCrop (timm's)
            left, top = int(round((w - tw) / 2.0)), int(round((h - th) / 2.0))
        return im.crop((left, top, left + tw, top + th))

    def _pad(self, im: Image.Image, width: int, height: int) -> Image.Image:
        """``im`` in the middle of a ``width`` x ``height`` canvas of the mean's colour (timm's ``CenterCropOrPad``:
        the odd pixel of a margin on the right and at the bottom), or at its top left (``crop_offset='start'``)."""
        bands = len(im.getbands())
        fill = tuple(self.fill[i % len(self.fill)] for i in range(bands))
        canvas = Image.new(im.mode, (width, height), fill[0] if bands == 1 else fill)
        start = self.crop_offset == "start"
        canvas.paste(im, (0, 0) if start else ((width - im.size[0]) // 2, (height - im.size[1]) // 2))
        return canvas

    def __call__(self, im: Image.Image) -> torch.Tensor:
        start = self.crop_mode == "border" and self.crop_offset == "start"  # (SAM's: zeros after normalising)
        pixels = np.asarray(self.view(im, pad=not start))
        pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
        # timm's arithmetic ((x / 255 - mean) / std, bit for bit) in one float buffer, channels first:
        # a quarter of the time of converting, broadcasting over a transposed view and copying
        arr = np.empty(pixels.shape, dtype=np.float32)
        np.divide(pixels, np.float32(255.0), out=arr, dtype=np.float32)
        np.subtract(arr, self.mean, out=arr)
        np.divide(arr, self.std, out=arr)
        if start:  # the normalised image padded with zeros at the right and bottom, as SAM's processor pads it
            (th, tw), (_, h, w) = self.img_size, arr.shape
            arr = np.pad(arr, ((0, 0), (0, th - h), (0, tw - w)))
        return torch.from_numpy(arr)

    def __repr__(self) -> str:
        return f"EvalTransform(img_size={self.img_size}, crop_pct={self.crop_pct}, crop_mode={self.crop_mode})"


#: what :func:`preprocess` takes for one image
ImageLike = Union[Image.Image, str, Path, bytes, np.ndarray, torch.Tensor]


def transform_for(model: Any) -> EvalTransform:
    """The model's own evaluation preprocessing (timm's ``resolve_data_config`` + ``create_transform``,
    or a Hugging Face image processor): a callable from a PIL image to its (C, H, W) input.
    ``model``: a vitkit model (a classifier, a backbone, a runtime wrapper) or its config."""
    config = getattr(model, "config", model)
    missing = [f for f in ("img_size", "mean", "std", "crop_pct", "interpolation") if not hasattr(config, f)]
    if missing:
        raise TypeError(f"{type(model).__name__} carries no preprocessing (no {', '.join(missing)}): pass a vitkit "
                        f"model or its config")
    return EvalTransform.from_config(config)


def preprocess(model: Any, images: Union[ImageLike, Sequence[ImageLike]]) -> torch.Tensor:
    """Image(s) -> the model's input batch (N, C, H, W), with its own preprocessing: decoded upright (a path
    or bytes: their EXIF orientation applied; a PIL image is taken as it stands), converted to its channels,
    resized and centre-cropped as its config says (``crop_pct``, ``interpolation``, ``crop_mode``), normalised
    by its mean and std -- what ``vitkit predict`` feeds it.

    An image is a PIL image, a path, the bytes of a file, or an array (H, W) / (H, W, C) of uint8,
    or floats in [0, 1] (a tensor may also be (C, H, W)). One image gives a batch of one."""
    transform = transform_for(model)
    channels = len(transform.mean)
    single = not isinstance(images, (list, tuple))
    batch = [images] if single else list(images)
    if not batch:
        raise ValueError("no images given")
    return torch.stack([_transformed(transform, im, channels, i) for i, im in enumerate(batch)])


def _transformed(transform: EvalTransform, image: ImageLike, channels: int, index: int) -> torch.Tensor:
    try:
        return transform(_as_pil(image, channels, index))
    except ImageShapeError as e:  # named as a file that cannot be read is
        raise BadImageError(str(image) if isinstance(image, (str, Path)) else f"image {index}", str(e)) from None


def _as_pil(image: ImageLike, channels: int, index: int) -> Image.Image:
    if isinstance(image, Image.Image):
        return to_rgb(image, channels)
    if isinstance(image, (str, Path)):
        return load_image(image, channels)
    if isinstance(image, bytes):
        return decode_image(image, channels, name=f"image {index} (bytes)")
    if isinstance(image, torch.Tensor):
        array = image.detach().cpu()
        if array.dim() == 3 and array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
            array = array.permute(1, 2, 0)  # (C, H, W), as torch holds images
        image = array.numpy()
    if isinstance(image, np.ndarray):
        return to_rgb(Image.fromarray(_as_uint8(image, index)), channels)
    raise TypeError(f"image {index}: a PIL image, a path, bytes or an array, not {type(image).__name__}")


def _as_uint8(array: np.ndarray, index: int) -> np.ndarray:
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        raise ValueError(f"image {index}: an array of shape {array.shape}; expected (H, W), (H, W, 3) or (H, W, 4)")
    if array.dtype == np.uint8:
        return array
    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all() or array.min() < 0 or array.max() > 1:
            raise ValueError(f"image {index}: float pixels must lie in [0, 1] (got {array.min():g} to "
                             f"{array.max():g}); pass uint8 for 0-255")
        return np.round(array * 255).astype(np.uint8)
    raise ValueError(f"image {index}: pixels of {array.dtype}; pass uint8 (0-255) or floats in [0, 1]")

