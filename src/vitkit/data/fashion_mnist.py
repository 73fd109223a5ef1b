"""Fashion-MNIST (Xiao et al., 2017; MIT licence): 60k/10k 28x28 grey images, 10 classes.

Located in order: an explicit folder (an error if the files are not there), ``$VITKIT_DATA``
(itself or its ``fashion-mnist/`` subfolder), Debian's ``dataset-fashion-mnist`` package
(``/usr/share/datasets/fashion-mnist/``), the user cache; else downloaded into the user
cache from the dataset's official address, each archive checked against its published MD5.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..files import atomic_path
from ..progress import copy_with_progress
from .idx import IDXError, file_version, read_idx

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]
FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}
SIZES = {"train": 60_000, "test": 10_000}
#: Pixel mean and std of the training split in [0, 1]: the normalisation of training runs and
#: of the models registered for these images.
MEAN, STD = (0.2860,), (0.3530,)
OFFICIAL_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
#: MD5 of the official .gz archives (as published with the dataset).
OFFICIAL_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
#: md5 of each split's decoded arrays (images as uint8 bytes, labels as uint8), whatever their files' compression:
#: MNIST and KMNIST ship under the same four file names, and would be read with Fashion-MNIST's class names
ARRAY_MD5 = {"train": ("f209073e486d5113ebe2cc431d4df862", "3236f6424fc25388b2834cb19942cf7e"),
             "test": ("b7656a891b218fc13e45205c48a92cae", "8dea97a4e78c1bd1b5a6e8efbb870b6e")}


#: whether each version of a split's two files holds the official arrays (hashing 47 MB was most of a load)
_OFFICIAL: Dict[Tuple, bool] = {}


def _official(split: str, images: np.ndarray, labels: np.ndarray, versions: Tuple) -> bool:
    """Whether the decoded arrays are Fashion-MNIST's (:data:`ARRAY_MD5`), worked out once per version of the files."""
    key = (split, *versions) if None not in versions else None  # (a file that cannot be stat'ed: not kept)
    if key not in _OFFICIAL:
        digests = tuple(hashlib.md5(a.astype(np.uint8).tobytes()).hexdigest() for a in (images, labels))
        if key is None:
            return digests == ARRAY_MD5[split]
        _OFFICIAL[key] = digests == ARRAY_MD5[split]
    return _OFFICIAL[key]


class DatasetNotFound(FileNotFoundError):
    """The dataset is nowhere to be found and could not be downloaded."""


@dataclass
class ArrayDataset:
    """An in-memory image classification split: uint8 images (N, H, W[, C]) and int64 labels."""

    images: np.ndarray
    labels: np.ndarray
    classes: List[str]
    source: str = ""

    def __len__(self) -> int:
        return len(self.labels)


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vitkit" / "fashion-mnist"


def _file_in(folder: Path, stem: str) -> Optional[Path]:
    for name in (stem + ".gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def _complete(folder: Path) -> bool:
    return all(_file_in(folder, stem) for stem in FILES.values())


def candidate_dirs() -> List[Path]:
    """Where Fashion-MNIST is looked for when no folder is given, in order."""
    out = []
    env = os.environ.get("VITKIT_DATA")
    if env:
        out += [Path(env), Path(env) / "fashion-mnist"]
    return out + [DEBIAN_DIR, user_cache_dir()]


def locate(data_dir: Optional[Union[str, Path]] = None, download: bool = True,
           base_url: str = OFFICIAL_URL, checksums: Optional[Dict[str, str]] = None) -> Path:
    """The folder holding the four Fashion-MNIST files (downloading them if needed)."""
    if data_dir is not None:
        folder = Path(data_dir)
        for f in (folder, folder / "fashion-mnist"):
            if _complete(f):
                return f
        raise DatasetNotFound(f"no Fashion-MNIST files in {folder}: expected "
                              f"{', '.join(s + '[.gz]' for s in FILES.values())}")
    tried = candidate_dirs()
    for folder in tried:
        if _complete(folder):
            return folder
    if not download:
        raise DatasetNotFound(_how_to_get(tried, None))
    try:
        return download_files(user_cache_dir(), base_url, checksums)
    except (urllib.error.URLError, OSError) as e:
        raise DatasetNotFound(_how_to_get(tried, e)) from e


def _how_to_get(tried: Sequence[Path], error: Optional[BaseException]) -> str:
    msg = ["Fashion-MNIST not found in: " + ", ".join(map(str, tried))]
    if error is not None:
        msg.append(f"and the download from {OFFICIAL_URL} failed ({error}).")
    msg.append("Get it with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or put the four "
               "files (" + ", ".join(s + ".gz" for s in FILES.values()) + ") from the dataset's page "
               "into a folder and pass --data-dir or set VITKIT_DATA.")
    return " ".join(msg)


def download_files(dest: Path, base_url: str = OFFICIAL_URL,
                   checksums: Optional[Dict[str, str]] = None, timeout: float = 60.0, progress: bool = True) -> Path:
    """Download the four archives into ``dest``; each is checked before it is renamed into place.
    ``progress``: megabytes and ETA on stderr for a file that takes more than 5 s."""
    checksums = checksums or OFFICIAL_MD5
    dest.mkdir(parents=True, exist_ok=True)
    for stem in FILES.values():
        name = stem + ".gz"
        target = dest / name
        if target.is_file() and _md5(target) == checksums[name]:
            continue
        with atomic_path(target) as tmp:
            with urllib.request.urlopen(base_url.rstrip("/") + "/" + name, timeout=timeout) as r, \
                    open(tmp, "wb") as f:
                copy_with_progress(r, f, f"downloading {name}", enabled=progress)
            got = _md5(tmp)
            if got != checksums[name]:
                raise OSError(f"checksum mismatch for {name}: got md5 {got}, expected {checksums[name]}")
    return dest


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_split(split: str = "train", data_dir: Optional[Union[str, Path]] = None,
               download: bool = True) -> ArrayDataset:
    """One official split (``train``: 60,000, ``test``: 10,000) as uint8 arrays."""
    if split not in SIZES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    folder = locate(data_dir, download)
    images_path = _file_in(folder, FILES[(split, "images")])
    labels_path = _file_in(folder, FILES[(split, "labels")])
    try:
        images, labels = read_idx(images_path), read_idx(labels_path)
    except IDXError as e:
        raise ValueError(f"Fashion-MNIST in {folder} is damaged: {e}") from e
    n = SIZES[split]
    if images.shape != (n, 28, 28) or labels.shape != (n,) or labels.max() > 9:
        raise ValueError(f"Fashion-MNIST {split} in {folder} has images {images.shape} and labels "
                         f"{labels.shape}; expected ({n}, 28, 28) and ({n},) with labels 0-9")
    if not _official(split, images, labels, (file_version(images_path), file_version(labels_path))):
        warnings.warn(f"{folder} holds IDX files under Fashion-MNIST's names whose {split} split is not "
                      f"Fashion-MNIST's (MNIST and KMNIST use the same names): its labels are read with "
                      f"Fashion-MNIST's class names, and its scores are no Fashion-MNIST scores", stacklevel=2)
    return ArrayDataset(images, labels.astype(np.int64), list(CLASSES), source=str(folder))
