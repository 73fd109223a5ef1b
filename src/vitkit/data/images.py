"""The one image decoder: every file vitkit reads as an image goes through :func:`decode_image`.

Prediction, evaluation, inspection, image folders and tar shards all see the same pixels of
a file. Decoding converts every mode Pillow opens to RGB (or L for ``channels=1``), upright
as the EXIF orientation says: transparency (RGBA, LA, PA, palette or grey with a transparent
colour) is composited on white, CMYK is converted, and 16-bit or 32-bit grey (``I;16``,
``I``, ``F``) is scaled to 8 bits rather than clipped (Pillow's own ``convert`` would clip
a 16-bit image to near-white). Anything Pillow cannot decode, truncated files included, is
a :class:`BadImageError` naming the file.
"""

from __future__ import annotations

import io
import logging
import struct
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Optional, Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

logger = logging.getLogger("vitkit.data")

#: What Pillow raises on a damaged or unsupported file (plugins raise more than OSError).
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error,
                 Image.DecompressionBombError, TypeError)  # (a TIFF tag of the wrong type: Pillow's TypeError)
_HIGH_DEPTH_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
_ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")

ImageSource = Union[str, Path, bytes, BinaryIO]


class Skipped(NamedTuple):
    """What a dataset gives instead of a sample it cannot use: which one (a file, or a shard and
    sample number) and why. :func:`vitkit.data.folder.collate_skip_bad` drops these from a
    batch and returns their names, so a run counts every unused sample once, by name."""

    name: str
    reason: str


class BadImageError(ValueError):
    """A file that cannot be decoded as an image; ``path`` names it, ``reason`` says why."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"cannot read image {path}: {reason}")
        self.path = path
        self.reason = reason


def _reason(error: BaseException) -> str:
    if isinstance(error, UnidentifiedImageError):
        return "not an image Pillow can identify"
    return f"{type(error).__name__}: {error}"


def _high_depth_to_l(im: Image.Image, sixteen: Optional[bool] = None) -> Image.Image:
    """16/32-bit integer or float grey -> 8-bit L, scaled (Pillow's convert would clip at 255); a transparent
    grey level (a 16-bit PNG's tRNS) composited on white, as an 8-bit one is. Integers are 16-bit levels where
    the mode or the file says so (``sixteen``, else :func:`_sixteen_bit`: a dark 16-bit PGM whose levels were all
    under 256 was read as 8-bit, 257 times too bright); elsewhere (an image made in memory, a copy of an opened
    one, a 32-bit TIFF) by their largest value, as 16-bit levels where it passes 255."""
    arr = np.asarray(im)
    if im.mode == "F":
        arr = arr * 255.0 if arr.size and np.nanmax(arr) <= 1.0 else arr
        out = np.clip(np.nan_to_num(arr), 0, 255).round()
    else:
        arr = arr.astype(np.int64)
        sixteen = _sixteen_bit(im) if sixteen is None else sixteen
        if sixteen or (arr.size and arr.max() > 255):
            out = (np.clip(arr, 0, 65535) * 255 + 32767) // 65535
        else:
            out = np.clip(arr, 0, 255)
        clear = im.info.get("transparency")
        if isinstance(clear, int) and not isinstance(clear, bool):
            out[arr == clear] = 255
    return Image.fromarray(out.astype(np.uint8), "L")


def _sixteen_bit(im: Image.Image) -> bool:
    """Whether an integer grey image holds 16-bit levels: its mode says so (I;16), or its file does (a PGM or PNG
    Pillow opens as 'I' holds 16-bit levels, and a TIFF says its bits per sample)."""
    if im.mode.startswith("I;16") or im.format in ("PPM", "PNG"):
        return True
    bits = getattr(im, "tag_v2", {}).get(258) if im.format == "TIFF" else None
    return bits in (16, (16,))


def to_rgb(im: Image.Image, channels: int = 3) -> Image.Image:
    """Any Pillow mode -> RGB (``channels=3``) or L (``channels=1``); transparency onto white."""
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if im.mode in _HIGH_DEPTH_MODES:
        im = _high_depth_to_l(im)
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        im = im.convert("RGBA")
        im = Image.alpha_composite(Image.new("RGBA", im.size, (255, 255, 255, 255)), im)
    want = "L" if channels == 1 else "RGB"
    try:
        return im.convert(want)
    except ValueError:  # a colour space Pillow converts to RGB only (LAB, HSV): its grey through RGB
        if want == "RGB":
            raise
        return im.convert("RGB").convert(want)


def decode_image(source: ImageSource, channels: int = 3, name: Optional[str] = None) -> Image.Image:
    """A file, its bytes or an open binary file -> an upright RGB/L image, fully decoded.

    Raises :class:`BadImageError` (naming ``name`` or the path) for anything Pillow cannot
    decode, truncated files included.
    """
    name = name or (str(source) if isinstance(source, (str, Path)) else "<bytes>")
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    try:
        with Image.open(source) as im:
            im.load()
            sixteen = _sixteen_bit(im)  # while the file's format is known (the upright copy has none)
            try:
                im = ImageOps.exif_transpose(im)
            except DECODE_ERRORS as e:  # the pixels are fine; only the orientation tag is not
                logger.warning("ignoring the unreadable EXIF orientation of %s (%s)", name, _reason(e))
            if im.mode in _HIGH_DEPTH_MODES:
                im = _high_depth_to_l(im, sixteen)
            return to_rgb(im, channels)
    except FileNotFoundError:
        raise
    except DECODE_ERRORS as e:
        raise BadImageError(name, _unidentified(source) if isinstance(e, UnidentifiedImageError) else _reason(e)) \
            from e


def _unidentified(source: Any) -> str:
    """Why Pillow found no image, where the first bytes say: none at all (predict said "not an image Pillow can
    identify" of an empty file, which eval calls empty), or JSON or a form where the server wants the image's bytes."""
    try:
        if isinstance(source, (str, Path)):
            with open(source, "rb") as f:
                head = f.read(64)
        else:
            source.seek(0)
            head = source.read(64)
    except (OSError, AttributeError, ValueError):
        return _reason(UnidentifiedImageError())
    text = head.lstrip()
    if not head:
        return "empty (0 bytes)"
    if text[:1] in (b"{", b"["):  # (the advice where bytes were sent: a request's body)
        sent = "" if isinstance(source, (str, Path)) else " (send the image file's own bytes, or a form upload)"
        return f"not an image Pillow can identify: it is JSON{sent}"
    return _reason(UnidentifiedImageError())


def load_image(path: Union[str, Path], channels: int = 3) -> Image.Image:
    """An image file, upright, as RGB (or L for ``channels=1``): :func:`decode_image` with a
    plain FileNotFoundError for a path that is not a file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not an image file (pass the images in it)")
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is not a regular file (a FIFO, a socket or a device): pass an image file")
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    return decode_image(path, channels)


__all__ = ["Skipped", "BadImageError", "DECODE_ERRORS", "ImageSource", "to_rgb", "decode_image", "load_image"]
