"""Writing tar shards in the webdataset layout (:mod:`.shards`' notes): samples or an image folder,
one shard at a time, each renamed into place when complete, with ``meta.json`` beside them."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..files import atomic_path
from .folder import ImageFolder
from .tar_records import CLASSES_FILE, IMAGE_EXTENSIONS, LABEL_EXTENSION, META_FILE

logger = logging.getLogger("vitkit.data")

#: an image to write: its encoded bytes, or a file whose bytes are copied
ImageData = Union[bytes, str, Path]


def write_shards(samples: Iterable[Tuple[ImageData, Optional[str], int]], out_pattern: Union[str, Path],
                 max_per_shard: int = 1000, classes: Optional[Sequence[str]] = None) -> List[Path]:
    """Write (image bytes or file, extension, label) samples into tar shards; return their paths.

    ``out_pattern`` holds one %-field for the shard number (``"out/shard-%06d.tar"``). Each
    shard is written to a temporary file and renamed when complete, so a crash never leaves
    half a shard under a shard's name. The extension may be None for a file (its suffix is
    used). Members carry fixed times and owners: the same samples give byte-identical shards.
    ``meta.json`` (and ``classes.txt`` when ``classes`` is given) is written beside them.
    """
    out_pattern = str(out_pattern)
    if max_per_shard <= 0:
        raise ValueError(f"max_per_shard must be positive, got {max_per_shard}")
    try:
        if out_pattern % 0 == out_pattern % 1:
            raise TypeError
    except TypeError:
        raise ValueError(f"out_pattern needs one %-field for the shard number, like 'shard-%06d.tar'; "
                         f"got {out_pattern!r}") from None
    end = object()
    it = iter(samples)
    nxt = next(it, end)
    paths: List[Path] = []
    counts: Dict[str, int] = {}
    index = 0
    while nxt is not end:
        path = Path(out_pattern % len(paths))
        n = 0
        with atomic_path(path) as tmp, tarfile.open(tmp, "w") as tar:
            while nxt is not end and n < max_per_shard:
                _add_sample(tar, f"{index:09d}", nxt, classes)
                index, n = index + 1, n + 1
                nxt = next(it, end)
        paths.append(path)
        counts[path.name] = n
    if not paths:
        raise ValueError("no samples to write")
    if Path(out_pattern % len(paths)).exists():
        logger.warning("%s exists from an earlier run and is not part of this set: a glob over the "
                       "folder would pick it up (meta.json lists the %d shards written)",
                       out_pattern % len(paths), len(paths))
    _write_meta(paths[0].parent, classes, counts)
    return paths


def _add_sample(tar: tarfile.TarFile, key: str, sample: Tuple[ImageData, Optional[str], int],
                classes: Optional[Sequence[str]]) -> None:
    image, ext, label = sample
    if isinstance(image, (str, Path)):
        ext = ext or Path(image).suffix
        data = Path(image).read_bytes()
    else:
        data = bytes(image)
    ext = (ext or "").lower().lstrip(".")
    if ext not in IMAGE_EXTENSIONS:
        raise ValueError(f"sample {key}: image extension must be one of {IMAGE_EXTENSIONS}, got {ext!r}")
    if not isinstance(label, (int, np.integer)) or label < 0 or (classes is not None and label >= len(classes)):
        limit = f" below {len(classes)}" if classes is not None else ""
        raise ValueError(f"sample {key}: label must be an integer >= 0{limit}, got {label!r}")
    _add_member(tar, f"{key}.{ext}", data)
    _add_member(tar, f"{key}.{LABEL_EXTENSION}", str(int(label)).encode("ascii"))


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


def _write_meta(folder: Path, classes: Optional[Sequence[str]], counts: Dict[str, int]) -> None:
    meta = {"classes": list(classes) if classes is not None else None,
            "num_samples": sum(counts.values()), "shards": counts}
    with atomic_path(folder / META_FILE) as tmp:
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
    if classes is not None:
        with atomic_path(folder / CLASSES_FILE) as tmp:
            tmp.write_text("".join(f"{name}\n" for name in classes))


def folder_to_shards(root: Union[str, Path], out_dir: Union[str, Path], max_per_shard: int = 1000,
                     pattern: str = "shard-%06d.tar", seed: Optional[int] = 0,
                     verify: str = "full") -> List[Path]:
    """Pack an image folder (``root/<class>/<image>``) into shards, file bytes as they are.

    The samples are shuffled (by ``seed``; None keeps the folder's order) before packing:
    an image folder is sorted by class, and shards of one class each would leave the reader's
    shuffle buffer to mix classes on its own. Files the folder scan rejects (``verify``, see
    :class:`~vitkit.data.folder.ImageFolder`) are logged and left out.
    """
    folder = ImageFolder(root, verify=verify)
    order = list(range(len(folder.samples)))
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(order)).tolist()
    samples = ((folder.samples[i][0], None, folder.samples[i][1]) for i in order)
    return write_shards(samples, Path(out_dir) / pattern, max_per_shard, folder.classes)
