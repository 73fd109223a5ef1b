"""Image folders (``root/<class name>/<image>``) as a map-style dataset, robust to broken files.

Collections gathered from the web hold empty files, files that are not images and
half-downloaded ones. A crash an hour into an epoch helps no one, and neither does a file
that silently vanishes, so every bad file is skipped, logged with its path (logger
``vitkit.data``) and counted, or, with ``strict=True``, reported as an error naming it.

Counting is exact with any number of DataLoader workers because nothing is counted inside
a worker (a worker's copy of the dataset is lost with it):

* ``ImageFolder`` scans every file once at construction, in the calling process; what the
  scan rejects is in ``.skipped`` and never reaches ``.samples``.
* A file the scan let through but that fails to decode later (``verify="header"`` does not
  decode, so it lets truncated JPEGs through) makes ``__getitem__`` return a
  :class:`~vitkit.data.images.Skipped` naming it; :func:`collate_skip_bad` drops those from a
  batch and returns their names with it, so the training loop counts each file once, by name,
  in the main process.

How much the scan checks is ``verify``: ``"header"`` (default) opens each file and runs
Pillow's ``verify()`` -- it catches empty files, non-images, bad headers and, for PNG, bad
chunk checksums, and costs a fraction of a decode; ``"full"`` decodes every image (catches
truncated files too, so no ``None`` comes later, at the cost of one extra decode of the
whole dataset); ``"none"`` only lists the files (instant, for huge trusted sets; every
problem then surfaces as a ``None`` at load time).

Decoding is :func:`vitkit.data.images.decode_image`, the one decoder every reader of image
files uses (RGB or L, upright, transparency on white, 16-bit grey scaled, not clipped).
"""

from __future__ import annotations

import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

from ..progress import track
from .images import DECODE_ERRORS, BadImageError, ImageSource, Skipped, _reason, decode_image, to_rgb  # noqa: F401
from .transforms import ImageShapeError

logger = logging.getLogger("vitkit.data")

#: torchvision's ImageFolder's (with its .ppm and .pgm) and GIF
IMG_EXTENSIONS = (".jpg", ".jpeg", ".jfif", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm",
                  ".pnm")
VERIFY_LEVELS = ("none", "header", "full")


def check_image(path: Union[str, Path], verify: str = "header", channels: int = 3) -> Optional[str]:
    """Why ``path`` is not a usable image at the given ``verify`` level, or None if it looks fine."""
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")
    try:
        if not os.path.isfile(path):  # a FIFO or a device has no size either: it was said to be an empty file
            return "not a regular file (a link to nothing, a FIFO or a device)"
        if os.path.getsize(path) == 0:
            return "empty file (0 bytes)"
    except OSError as e:
        return _reason(e)
    if verify == "none":
        return None
    if verify == "full":
        try:
            decode_image(path, channels)
        except BadImageError as e:
            return e.reason
        return None
    try:
        with Image.open(path) as im:
            im.verify()
    except DECODE_ERRORS as e:
        return _reason(e)
    return None


def collate_skip_bad(batch: Sequence[Any]) -> Tuple[Optional[Any], torch.Tensor, Tuple[str, ...]]:
    """DataLoader ``collate_fn``: drop the bad samples of a batch -> (images, labels, their names).

    Datasets give a :class:`~vitkit.data.images.Skipped` (or None) for a sample they cannot use;
    the names come back with the batch, so a run counts each unused file or shard sample once
    however often it is met and whatever the number of workers. A batch whose samples were all
    bad gives ``(None, empty labels, names)``.
    """
    good = [sample for sample in batch if sample is not None and not isinstance(sample, Skipped)]
    names = tuple(s.name if isinstance(s, Skipped) else "<unnamed sample>" for s in batch
                  if s is None or isinstance(s, Skipped))
    if not good:
        return None, torch.empty(0, dtype=torch.int64), names
    images, labels = default_collate(good)
    return images, labels, names


def _walk_once(root: Union[str, Path]) -> Iterator[Tuple[str, List[str]]]:
    """(folder, its non-hidden file names, sorted) under ``root`` in sorted order, symbolic links
    followed (a dataset assembled from links is common) but each real folder visited once: a link back
    up the tree (``sub/up -> ..``) listed every image again at each depth, 40 times over."""
    seen = set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
        yield folder, sorted(f for f in files if not f.startswith("."))


def _suffixes(extensions: Sequence[str]) -> Tuple[str, ...]:
    """Extensions as lower-case suffixes with their dot ("JPG" and ".jpg" alike)."""
    return tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)


def image_files(paths: Sequence[Union[str, Path]], extensions: Sequence[str] = IMG_EXTENSIONS,
                say: bool = True) -> List[str]:
    """``paths`` with each folder replaced by the image files under it (sorted, subfolders included,
    hidden ones not), as timm's inference script reads a folder; files are kept as given (a file
    that is not an image is said when it is read). A folder without images, a path that is not
    there or is no regular file: refused by name, before any image is read. A folder's files without an image
    extension are said (``say``), by extension."""
    out: List[str] = []
    suffixes = _suffixes(extensions)
    for path in map(str, paths):
        if not os.path.isdir(path):
            if not os.path.exists(path):
                raise FileNotFoundError(f"image not found: {path}")
            if not os.path.isfile(path):
                raise ValueError(f"{path} is not a regular file (a FIFO, a socket or a device): pass an image file")
            out.append(path)
            continue
        found, others = [], {}  # (the files left out, by extension: said, as a class folder's are)
        for folder, files in _walk_once(path):
            for f in files:
                if f.lower().endswith(suffixes):
                    found.append(os.path.join(folder, f))
                else:
                    kind = os.path.splitext(f)[1].lower() or "no extension"
                    others[kind] = others.get(kind, 0) + 1
        if not found:
            raise ValueError(f"no image files ({', '.join(extensions)}) in the folder {path}")
        if say:
            _say_left_out(others, path, suffixes)
        out += found
    return out


def _say_left_out(others: Dict[str, int], root: Any, extensions: Sequence[str]) -> None:
    if others:
        kinds = sorted(others.items(), key=lambda kv: (-kv[1], kv[0]))
        logger.warning("left out %d file(s) of %s without an image extension (%s%s); read: %s",
                       sum(others.values()), root, ", ".join(f"{k} x{n}" for k, n in kinds[:5]),
                       " ..." if len(kinds) > 5 else "", ", ".join(extensions))


def find_images(root: Union[str, Path], extensions: Sequence[str] = IMG_EXTENSIONS, progress: bool = False
                ) -> Tuple[List[str], List[Tuple[str, int]]]:
    """Sorted class names and (path, class index) of every file with an image extension.

    Subfolders of a class folder belong to that class; hidden files and folders are ignored.
    ``progress``: the class folders listed so far on stderr, once listing has taken 5 s (a
    million files on a network file system).
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"image folder not found: {root}")
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is a file; expected a folder with one subfolder per class")
    extensions = _suffixes(extensions)
    with os.scandir(root) as entries:
        listing = sorted(entries, key=lambda e: e.name)
    classes = [e.name for e in listing if e.is_dir() and not e.name.startswith(".")]
    real: Dict[str, str] = {}
    for name in classes:  # a link to another class's folder: its images would be both classes at once
        other = real.setdefault(os.path.realpath(root / name), name)
        if other != name:
            raise ValueError(f"the class folders {other!r} and {name!r} of {root} are one folder (a link): each of "
                             f"its images would carry two labels; remove the link, or copy the images that belong "
                             f"to both")
    loose = [e.name for e in listing if e.is_file() and e.name.lower().endswith(extensions)]
    if not classes:
        hint = f" (it holds {len(loose)} images directly: move them into a subfolder per class)" if loose else ""
        raise ValueError(f"no class subfolders in {root}: expected {root}/<class name>/<image file>{hint}")
    if loose:  # beside the class folders: no class, so not read, and said (they are not in any count)
        logger.warning("left out %d image(s) of %s that lie beside its class folders, in no class (%s%s): move "
                       "each into its class's folder", len(loose), root, ", ".join(loose[:3]),
                       " ..." if len(loose) > 3 else "")
    samples: List[Tuple[str, int]] = []
    others: Dict[str, int] = {}  # the files left out, by extension: said once, not in silence
    for index, name in track(list(enumerate(classes)), f"listing {root}", enabled=progress, unit="classes"):
        found = 0
        for folder, files in _walk_once(root / name):
            for f in files:
                if f.lower().endswith(extensions):
                    samples.append((os.path.join(folder, f), index))
                    found += 1
                else:
                    kind = os.path.splitext(f)[1].lower() or "no extension"
                    others[kind] = others.get(kind, 0) + 1
        if not found:
            logger.warning("class folder %s has no images (%s)", root / name, ", ".join(extensions))
    _say_left_out(others, root, extensions)
    if not samples:
        raise ValueError(f"no image files ({', '.join(extensions)}) in the {len(classes)} class "
                         f"subfolders of {root}")
    return classes, samples


#: the most files a folder's copies across its splits are looked for in by default (their sizes are read from
#: the file system: seconds for a million on a local disk, longer on a network one); --strict-data: always
COPY_CHECK_FILES = 300_000


def copied_files(trained: "ImageFolder", held_out: Sequence["ImageFolder"]) -> List[List[Tuple[str, str]]]:
    """For each held-out folder, its (held-out file, training file) pairs with the same bytes: a test image that
    is a training image scores what was trained on as if held out. Files of one size are compared by their
    BLAKE2 digests; the training files' sizes and digests are read once for every held-out folder."""
    theirs: Dict[int, List[str]] = _by_size(trained)
    known: Dict[int, Dict[Optional[bytes], str]] = {}  # a size's training files by digest, read once
    found = []
    for folder in held_out:
        pairs = []
        for size, paths in _by_size(folder).items():
            if size in theirs:
                digests = known.setdefault(size, {_digest(p): p for p in theirs[size]})
                pairs += [(p, digests[d]) for p in paths if (d := _digest(p)) is not None and d in digests]
        found.append(pairs)
    return found


def _by_size(folder: "ImageFolder") -> Dict[int, List[str]]:
    """A folder's files by their size in bytes (a file that cannot be read is left out)."""
    out: Dict[int, List[str]] = {}
    for path, _ in folder.samples:
        try:
            out.setdefault(os.path.getsize(path), []).append(path)
        except OSError:
            continue
    return out


def _digest(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return hashlib.blake2b(f.read(), digest_size=16).digest()
    except OSError:
        return None


class SampleList(Dataset):
    """A map-style dataset over ``self.samples`` ((source, class index) pairs): its length and labels."""

    samples: List[Tuple[Any, int]]

    @property
    def targets(self) -> List[int]:
        return [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)


class ImageFolder(SampleList):
    """``root/<class>/<image>`` as (transformed image, class index) pairs; classes sorted by name.

    ``transform`` is applied to the upright RGB (or L) PIL image; without one the PIL image
    itself is returned. ``__getitem__`` returns ``None`` for a file that fails to decode
    (see the module notes); use :func:`collate_skip_bad` as the DataLoader's ``collate_fn``.
    With ``strict=True`` a bad file raises :class:`BadImageError` naming it, during the scan
    or on loading. ``scan_threads`` > 1 checks files in parallel (Pillow decodes outside the
    GIL), for large folders on a machine with cores to spare. ``progress``: the files listed and
    checked so far on stderr, with the ETA, once the scan has taken 5 s (ImageNet's 1.28 million
    files: minutes).
    """

    def __init__(self, root: Union[str, Path], transform: Optional[Callable[[Image.Image], Any]] = None,
                 channels: int = 3, verify: str = "header", strict: bool = False,
                 extensions: Sequence[str] = IMG_EXTENSIONS, scan_threads: int = 1, progress: bool = True):
        if verify not in VERIFY_LEVELS:
            raise ValueError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        self.root = Path(root)
        self.transform = transform
        self.channels = channels
        self.strict = strict
        self.classes, candidates = find_images(self.root, extensions, progress)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples: List[Tuple[str, int]] = []
        self.skipped: List[Tuple[str, str]] = []
        self._scan(candidates, verify, scan_threads, progress)

    def _scan(self, candidates: List[Tuple[str, int]], verify: str, threads: int, progress: bool) -> None:
        paths = [path for path, _ in candidates]
        checked = track(self._check_all(paths, verify, threads), f"checking {self.root} ({verify})", len(paths),
                        progress, unit="files")
        for reason, sample in zip(checked, candidates):  # checked first: zip then ends it, which draws its end
            if reason is None:
                self.samples.append(sample)
                continue
            if self.strict:
                raise BadImageError(sample[0], reason)
            logger.warning("skipping %s: %s", sample[0], reason)
            self.skipped.append((sample[0], reason))
        if self.skipped:
            logger.warning("%s: skipped %d of %d image files (each named above)", self.root,
                           len(self.skipped), len(candidates))
        if not self.samples:
            raise ValueError(f"none of the {len(candidates)} image files in {self.root} can be read "
                             f"(first: {self.skipped[0][0]}: {self.skipped[0][1]})")

    def _check_all(self, paths: List[str], verify: str, threads: int) -> Iterator[Optional[str]]:
        check = partial(check_image, verify=verify, channels=self.channels)
        if threads <= 1:
            yield from map(check, paths)
            return
        with ThreadPoolExecutor(threads) as pool:  # in chunks: no million pending futures
            for start in range(0, len(paths), 512):
                yield from pool.map(check, paths[start:start + 512])

    def stored_image(self, index: int) -> Image.Image:
        """Sample ``index``'s image in colour as stored, whatever ``channels`` reads it as (BadImageError if bad)."""
        return decode_image(self.samples[index][0], 3)

    def __getitem__(self, index: int) -> Union[Tuple[Any, int], Skipped]:
        path, label = self.samples[index]
        try:
            im = decode_image(path, self.channels)
            return (self.transform(im) if self.transform is not None else im), label
        except ImageShapeError as e:  # evaluation's resize of a long thin image: skipped as a bad file is
            if self.strict:
                raise BadImageError(str(path), str(e)) from None
            logger.warning("skipping %s: %s", path, e)
            return Skipped(str(path), str(e))
        except (BadImageError, FileNotFoundError) as e:
            if self.strict:
                raise
            reason = str(getattr(e, "reason", e))
            logger.warning("skipping %s: %s", path, reason)
            return Skipped(str(path), reason)

    def __repr__(self) -> str:
        return (f"ImageFolder({str(self.root)!r}: {len(self.samples)} images, {len(self.classes)} classes, "
                f"{len(self.skipped)} skipped)")
