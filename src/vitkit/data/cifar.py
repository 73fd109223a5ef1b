"""CIFAR-10 and CIFAR-100 (Krizhevsky, 2009) from the official "binary version" files.

The binary version is read rather than the python one because the python version is a
pickle, and loading it would run whatever code the file holds. Each record is one label
byte (CIFAR-100: a coarse then a fine label byte) and 3,072 pixel bytes: the red, green and
blue 32x32 planes, each row-major. The folders (``cifar-10-batches-bin``,
``cifar-100-binary``) or the downloaded ``.tar.gz`` archives are read as they are; nothing
needs extracting.

Located in order: an explicit folder (an error if the files are not there), ``$VITKIT_DATA``
(itself, its dataset folder or the archive in it), the user cache (``~/.cache/vitkit``);
else the archive is downloaded into the user cache from the dataset's official address
and checked against its published MD5.
"""

from __future__ import annotations

import os
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..files import atomic_path
from ..progress import copy_with_progress
from .fashion_mnist import ArrayDataset, DatasetNotFound, _md5
from .fashion_mnist import user_cache_dir as _fashion_mnist_cache_dir

IMAGE_SHAPE = (32, 32, 3)
PIXEL_BYTES = 32 * 32 * 3
OFFICIAL_BASE_URL = "https://www.cs.toronto.edu/~kriz/"

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                   "truck"]
CIFAR100_FINE_CLASSES = [
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup",
    "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house",
    "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man",
    "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid",
    "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy",
    "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal",
    "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar",
    "sunflower", "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor",
    "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
]
CIFAR100_COARSE_CLASSES = [
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes",
    "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates", "people",
    "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2",
]


@dataclass(frozen=True)
class Variant:
    """Where one CIFAR variant's files live and how its records are laid out."""

    name: str
    title: str
    folder: str
    archive: str
    md5: str
    split_files: Dict[str, Tuple[str, ...]]
    #: label kind -> (offset of its byte in a record, meta file with the names, built-in names)
    labels: Dict[str, Tuple[int, str, List[str]]]
    #: the folder of the python (pickle) version, named in errors: vitkit does not load it
    python_folder: str

    @property
    def record_bytes(self) -> int:
        return len(self.labels) + PIXEL_BYTES

    @property
    def data_files(self) -> List[str]:
        return [name for files in self.split_files.values() for name in files]


VARIANTS = {
    "cifar10": Variant(
        name="cifar10", title="CIFAR-10", folder="cifar-10-batches-bin",
        archive="cifar-10-binary.tar.gz", md5="c32a1d4ab5d03f1284b67883e8d87530",
        split_files={"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
                     "test": ("test_batch.bin",)},
        labels={"fine": (0, "batches.meta.txt", CIFAR10_CLASSES)},
        python_folder="cifar-10-batches-py",
    ),
    "cifar100": Variant(
        name="cifar100", title="CIFAR-100", folder="cifar-100-binary",
        archive="cifar-100-binary.tar.gz", md5="03b5dce01913d631647c71ecec9e9cb8",
        split_files={"train": ("train.bin",), "test": ("test.bin",)},
        labels={"coarse": (0, "coarse_label_names.txt", CIFAR100_COARSE_CLASSES),
                "fine": (1, "fine_label_names.txt", CIFAR100_FINE_CLASSES)},
        python_folder="cifar-100-python",
    ),
}


def _variant(variant: str) -> Variant:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    return VARIANTS[variant]


def user_cache_dir() -> Path:
    """``~/.cache/vitkit`` (or under ``$XDG_CACHE_HOME``): the archives are kept here as downloaded."""
    return _fashion_mnist_cache_dir().parent


def _is_complete_folder(folder: Path, v: Variant) -> bool:
    return folder.is_dir() and all((folder / name).is_file() for name in v.data_files)


def _sources_under(base: Path, v: Variant) -> List[Path]:
    """The places a variant may sit at ``base``: the folder itself, its dataset folder, the archive."""
    return [base, base / v.folder, base / v.archive]


def _usable(source: Path, v: Variant) -> bool:
    if source.is_file():
        return tarfile.is_tarfile(source)
    return _is_complete_folder(source, v)


def candidate_dirs(variant: str = "cifar10") -> List[Path]:
    """Where a variant is looked for when no folder is given, in order."""
    v = _variant(variant)
    env = os.environ.get("VITKIT_DATA")
    out = _sources_under(Path(env), v) if env else []
    return out + [user_cache_dir() / v.folder, user_cache_dir() / v.archive]


def locate(variant: str = "cifar10", root: Optional[Union[str, Path]] = None, download: bool = True,
           url: Optional[str] = None, md5: Optional[str] = None) -> Path:
    """The folder or ``.tar.gz`` archive holding a CIFAR variant (downloading the archive if needed)."""
    v = _variant(variant)
    if root is not None:
        root = Path(root)
        for source in _sources_under(root, v):
            if _usable(source, v):
                return source
        raise DatasetNotFound(
            f"no {v.title} binary version in {root}: expected the files {', '.join(v.data_files)} "
            f"in {root} or {root / v.folder}, or the archive {root / v.archive}"
            + _python_version_hint(root, v))
    tried = candidate_dirs(variant)
    for source in tried:
        if _usable(source, v):
            return source
    if not download:
        raise DatasetNotFound(_how_to_get(v, tried, None))
    try:
        return download_archive(variant, user_cache_dir(), url=url, md5=md5)
    except (urllib.error.URLError, OSError) as e:
        raise DatasetNotFound(_how_to_get(v, tried, e)) from e


def _python_version_hint(root: Path, v: Variant) -> str:
    if (root / v.python_folder).exists() or root.name == v.python_folder:
        return (f" ({v.python_folder} is the python version, a pickle, which vitkit does not load: "
                f"get {v.archive} instead)")
    return ""


def _how_to_get(v: Variant, tried: Sequence[Path], error: Optional[BaseException]) -> str:
    msg = [f"{v.title} not found in: " + ", ".join(map(str, tried))]
    if error is not None:
        msg.append(f"and the download from {OFFICIAL_BASE_URL + v.archive} failed ({error}).")
    msg.append(f"Download {v.archive} (the binary version) from https://www.cs.toronto.edu/~kriz/cifar.html "
               f"and put it, or the {v.folder} folder it holds, into {user_cache_dir()} or a folder "
               f"you pass as the data directory or set as VITKIT_DATA.")
    return " ".join(msg)


def download_archive(variant: str, dest: Path, url: Optional[str] = None, md5: Optional[str] = None,
                     timeout: float = 60.0, progress: bool = True) -> Path:
    """Download a variant's archive into ``dest``; it is checked before it is renamed into place.
    ``progress``: megabytes and ETA on stderr while it lasts more than 5 s (163 MB)."""
    v = _variant(variant)
    url = url or OFFICIAL_BASE_URL + v.archive
    md5 = md5 or v.md5
    target = Path(dest) / v.archive
    if target.is_file() and _md5(target) == md5:
        return target
    with atomic_path(target) as tmp:
        with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, "wb") as f:
            copy_with_progress(r, f, f"downloading {v.archive}", enabled=progress)
        got = _md5(tmp)
        if got != md5:
            raise OSError(f"checksum mismatch for {v.archive} from {url}: got md5 {got}, expected {md5}")
    return target


def _read_files(source: Path, names: Sequence[str]) -> Dict[str, bytes]:
    """The named files (those present) from a folder or, matched by base name, from a tar archive."""
    if source.is_dir():
        return {n: (source / n).read_bytes() for n in names if (source / n).is_file()}
    out: Dict[str, bytes] = {}
    try:
        with tarfile.open(source, "r:*") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and base in names and base not in out:
                    out[base] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ValueError(f"cannot read the archive {source}: {e} (damaged download? delete it and "
                         f"fetch it again)") from e
    return out


def _class_names(meta: Optional[bytes], fallback: List[str]) -> List[str]:
    if meta is None:
        return list(fallback)
    names = [line.strip() for line in meta.decode("utf-8", errors="replace").splitlines()]
    return [n for n in names if n]


def decode_records(data: bytes, v: Variant, label: str, where: str) -> Tuple[np.ndarray, np.ndarray]:
    """Records -> uint8 images (N, 32, 32, 3) and int64 labels, checking the record size."""
    rec = v.record_bytes
    if len(data) == 0 or len(data) % rec:
        raise ValueError(f"{where}: {len(data)} bytes is not a whole number of {rec}-byte "
                         f"{v.title} records (truncated, or not the binary version)")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, rec)
    labels = records[:, v.labels[label][0]].astype(np.int64)
    planes = records[:, len(v.labels):].reshape(-1, 3, 32, 32)
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), labels


def load_split(split: str = "train", root: Optional[Union[str, Path]] = None, variant: str = "cifar10",
               label: str = "fine", download: bool = True) -> ArrayDataset:
    """One split (``train``: 50,000, ``test``: 10,000 images) as uint8 HWC arrays.

    ``label`` picks CIFAR-100's fine (100 classes) or coarse (20 superclasses) labels;
    CIFAR-10 has only ``fine``.
    """
    v = _variant(variant)
    if split not in v.split_files:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if label not in v.labels:
        raise ValueError(f"{v.title} labels are {' or '.join(map(repr, v.labels))}, got {label!r}")
    source = locate(variant, root, download)
    names = v.split_files[split]
    meta_name, fallback = v.labels[label][1], v.labels[label][2]
    files = _read_files(source, list(names) + [meta_name])
    missing = [n for n in names if n not in files]
    if missing:
        raise ValueError(f"{source} lacks {', '.join(missing)} ({v.title} {split} split)")
    classes = _class_names(files.get(meta_name), fallback)
    if len(classes) != len(fallback):
        raise ValueError(f"{meta_name} in {source} names {len(classes)} classes; "
                         f"{v.title} {label} labels have {len(fallback)}")
    images, labels = [], []
    for name in names:
        im, lab = decode_records(files.pop(name), v, label, where=f"{name} in {source}")
        bad = np.flatnonzero(lab >= len(classes))
        if bad.size:
            raise ValueError(f"{name} in {source}: record {bad[0]} has {label} label {lab[bad[0]]}, "
                             f"outside 0-{len(classes) - 1} (corrupt file, or the wrong variant?)")
        images.append(im)
        labels.append(lab)
    return ArrayDataset(np.concatenate(images), np.concatenate(labels), classes, source=str(source))
