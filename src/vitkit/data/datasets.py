"""Dataset names: the one place ``--dataset`` values are known.

Three kinds. *In-memory* datasets (Fashion-MNIST, CIFAR-10/100) load whole into uint8 arrays;
the training loop augments them in batches on the device. *File* datasets (an image
folder, tar shards) are decoded image by image in DataLoader workers through the paper's
torchvision pipelines. A file dataset's ``--data-dir`` holds ``train/`` and ``test/`` (or
``val/``): class subfolders of images, or ``.tar`` shards with their ``meta.json``.
*Hugging Face* datasets (``hf:NAME_OR_DIR``, :mod:`.hf`) are read row by row like an image
folder, or streamed like shards.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .. import tiny
from ..files import as_argument
from . import cifar, fashion_mnist
from .fashion_mnist import ArrayDataset, DatasetNotFound

Stats = Tuple[Tuple[float, ...], Tuple[float, ...]]

#: name -> (split loader (split, data_dir) -> ArrayDataset, per-channel mean and std in [0, 1]).
IN_MEMORY: Dict[str, Tuple[Callable[[str, Optional[str]], ArrayDataset], Stats]] = {
    "fashion-mnist": (lambda split, d: fashion_mnist.load_split(split, d), (fashion_mnist.MEAN, fashion_mnist.STD)),
    "cifar10": (lambda split, d: cifar.load_split(split, d, variant="cifar10"),
                ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))),
    "cifar100": (lambda split, d: cifar.load_split(split, d, variant="cifar100"),
                 ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))),
}
ALIASES = {"fashion_mnist": "fashion-mnist", "fmnist": "fashion-mnist", "cifar-10": "cifar10",
           "cifar-100": "cifar100", "imagefolder": "folder", "webdataset": "shards"}
FILE_DATASETS = ("folder", "shards")
#: A Hugging Face dataset: hf:org/name (the Hub, or its local cache) or hf:FOLDER (vitkit.data.hf).
HF_PREFIX = "hf:"
#: Normalisation of file datasets trained from scratch: the ViT paper's, to [-1, 1].
FILE_STATS: Stats = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


#: The class names of the in-memory datasets (the weights of a model trained on one carry them).
CLASS_NAMES: Dict[str, List[str]] = {"fashion-mnist": list(fashion_mnist.CLASSES),
                                     "cifar10": list(cifar.CIFAR10_CLASSES),
                                     "cifar100": list(cifar.CIFAR100_FINE_CLASSES)}


def dataset_for_labels(label_names: Optional[List[str]]) -> Optional[str]:
    """The in-memory dataset whose classes these label names are (None: none of them)."""
    return next((name for name, classes in CLASS_NAMES.items() if list(label_names or []) == classes), None)


def class_difference(ours: Optional[Sequence[str]], theirs: Optional[Sequence[str]],
                     who: Tuple[str, str] = ("the weights", "the data")) -> Optional[str]:
    """How two class lists differ, in words (None: the same names in the same order, or one side
    has no names to compare). A head's row i answers for class i: the same names in another order
    are as wrong as other names."""
    if not ours or not theirs:
        return None
    ours, theirs = [str(n) for n in ours], [str(n) for n in theirs]
    if ours == theirs:
        return None
    if sorted(ours) == sorted(theirs):
        i = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        return (f"the same {len(ours)} classes in another order (class {i} is {ours[i]!r} in {who[0]}, "
                f"{theirs[i]!r} in {who[1]})")
    missing = [n for n in ours if n not in theirs]
    extra = [n for n in theirs if n not in ours]
    if [unicodedata.normalize("NFC", n) for n in missing] == [unicodedata.normalize("NFC", n) for n in extra]:
        return (f"the same names in two Unicode forms ({', '.join(ascii(n) for n in missing[:2])} in {who[0]}, "
                f"{', '.join(ascii(n) for n in extra[:2])} in {who[1]}: letters precomposed in one, combined in "
                f"the other); rename one side's to the other's form")
    return (f"other classes ({who[0]}: {len(ours)}, {who[1]}: {len(theirs)}; "
            + "; ".join(part for part in (f"only in {who[0]}: {_names(missing)}" if missing else "",
                                          f"only in {who[1]}: {_names(extra)}" if extra else "") if part)
            + ")")


def _names(names: Sequence[str], n: int = 3) -> str:
    return ", ".join(repr(x) for x in names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def is_hf(name: Optional[str]) -> bool:
    return bool(name) and name.lower().startswith(HF_PREFIX)


def canonical(name: str) -> str:
    """The dataset's registered name; a clear error listing the names for anything else."""
    if is_hf(name):  # hf:NAME_OR_DIR keeps its case (Hub names and paths are case-sensitive)
        return HF_PREFIX + name[len(HF_PREFIX):]
    given, name = name, ALIASES.get(name.lower(), name.lower())
    if name not in IN_MEMORY and name not in FILE_DATASETS:
        hint = (f" ({given} is a folder: --dataset folder --data-dir {given} reads its train/ and test/ class "
                f"folders, --dataset hf:{given} reads it with Hugging Face datasets)") if Path(given).is_dir() else ""
        raise ValueError(f"unknown dataset {given!r}; available: "
                         f"{', '.join(list(IN_MEMORY) + list(FILE_DATASETS))}, hf:NAME_OR_DIR (a Hugging Face "
                         f"dataset){hint}")
    return name


def is_in_memory(name: str) -> bool:
    return canonical(name) in IN_MEMORY


def load_split(name: str, split: str, data_dir: Optional[str] = None) -> ArrayDataset:
    """One split of an in-memory dataset as uint8 arrays."""
    name = canonical(name)
    if name not in IN_MEMORY:
        raise ValueError(f"{name} is a file dataset: it is read through a DataLoader, not into memory")
    data = IN_MEMORY[name][0](split, data_dir)
    if tiny.enabled():  # VITKIT_TINY=1: the documentation's commands at test scale
        images, labels = tiny.shrink_split(split, data.images, data.labels)
        data = dataclasses.replace(data, images=images, labels=labels)
    return data


def stats(name: str) -> Stats:
    name = canonical(name)
    return IN_MEMORY[name][1] if name in IN_MEMORY else FILE_STATS


def _split_given(root: Path) -> str:
    """The advice where ``root`` is itself one split of a dataset folder (photos/test given for photos)."""
    parent, splits = root.resolve().parent, ("train", "test", "val")
    if root.resolve().name in splits and sum((parent / s).is_dir() for s in splits) > 1:
        return f"; {root} looks like one split of {parent}: give --data-dir {as_argument(parent)}"
    return ""


def file_split_dirs(name: str, data_dir: Optional[str], need_train: bool = True) -> Tuple[Path, Path]:
    """(train folder, test folder) of a file dataset: ``train/`` and ``test/`` (else ``val/``); without
    ``need_train`` (scoring the held-out split alone) a folder without ``train/`` will do."""
    if not data_dir:
        raise DatasetNotFound(f"--dataset {name} needs --data-dir: a folder with train/ and test/ "
                              f"(or val/) subfolders")
    root = Path(data_dir)
    if root.exists() and not root.is_dir():
        raise DatasetNotFound(f"--data-dir {root} is a file: give the folder that holds train/ and test/")
    if not root.is_dir():
        raise DatasetNotFound(f"data folder not found: {root}")
    train = root / "train"
    held_out: List[Path] = [root / "test", root / "val"]
    test = next((p for p in held_out if p.is_dir()), None)
    if (need_train and not train.is_dir()) or test is None:
        what = "class subfolders of images" if name == "folder" else ".tar shards"
        needed = "train/ and test/ (or val/), each" if need_train else "test/ (or val/)"
        raise DatasetNotFound(f"{root} must hold {needed} with {what}; "
                              f"found: {', '.join(sorted(p.name for p in root.iterdir())) or 'nothing'}"
                              + _split_given(root))
    if train.is_dir() and train.resolve() == test.resolve():  # a link: the test score would be of the training images
        raise DatasetNotFound(f"{test} is {train} (a link to the same folder): a score on it would be of the "
                              f"training images; give {root} a {test.name}/ of held-out images")
    return train, test
