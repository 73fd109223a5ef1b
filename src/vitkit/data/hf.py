"""Hugging Face datasets (``--dataset hf:NAME_OR_DIR``): the Hub's image classification data.

Most image classification sets now live on the Hugging Face Hub as Parquet/Arrow files read by
the ``datasets`` package (an optional extra, ``vitkit[hf]``). Three places are understood:

* a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``load_from_disk``);
* any other folder (Parquet, Arrow, CSV + image files ...: ``load_dataset(folder)``, as the
  ``datasets`` package reads a folder of data files);
* a Hub name, ``org/name`` (``load_dataset``; from the local cache when offline).

Columns: the image column is the one ``Image`` feature and the label column the one
``ClassLabel`` feature, whose names are the class names; ``image_key`` / ``label_key`` choose
when there are several, or none (an integer label column then names its classes by number).
Images are read as bytes (``Image(decode=False)``) and decoded by vitkit's one decoder
(:func:`vitkit.data.images.decode_image`), so grey, RGBA, palette and 16-bit images give the
same pixels as from a file. A sample that cannot be used -- bytes Pillow cannot decode, a label
outside the classes (the ``-1`` of an unlabelled test split) -- is a
:class:`~vitkit.data.images.Skipped` naming it (``hf:NAME/split#index``), counted by the run.

Two ways to read: :class:`HFImages` (map-style, indexable: the run's order, validation carve,
label fraction and DDP split are the image folder's, and resuming is exact) and
:class:`HFStream` (``streaming=True``, for sets larger than the disk or memory: the tar shards'
reader contract -- ``set_epoch``, every rank the same number of samples, a resumed run re-reads
its epoch up to the step -- over ``datasets``' own shuffle buffer and node split).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from torch.utils.data import IterableDataset, get_worker_info

from ..extras import require
from ..models.config_base import MAX_CLASSES
from ..utils import seed_for
from .datasets import HF_PREFIX as PREFIX
from .datasets import class_difference, is_hf
from .folder import SampleList
from .images import BadImageError, Skipped, decode_image
from .streams import RankedReader, repeat_passes

logger = logging.getLogger("vitkit.data")

#: The split a run tests on when none is named: the first of these the dataset has.
TEST_SPLITS = ("test", "validation", "valid", "val")
#: Seconds ``datasets`` sleeps after each shuffled pass over Parquet files (its
#: ``SLEEP_TIME_ON_THREADS_SHUTDOWN``, 5 s), so that pyarrow's threads wind down before a program
#: may exit (apache/arrow#39862: a crash at exit just after a scan; 0.1 s was reported to be
#: enough there). Paid by every DataLoader worker at every epoch's end, 5 s was idle time; here a
#: pass ends in the middle of a run, and the last one well before the process exits.
SHUTDOWN_SLEEP_S = 0.1


def _datasets():
    return require("datasets", "hf", "Hugging Face datasets (--dataset hf:...)")


# ---------------------------------------------------------------------------------- opening

def _where(name: str) -> str:
    where = name[len(PREFIX):] if is_hf(name) else name
    if not where.strip():
        raise ValueError("--dataset hf: needs a Hub name or a folder after it (hf:org/name, hf:path/to/folder)")
    return where


def _looks_local(where: str) -> bool:
    return where.startswith(("/", "./", "../", "~")) or where in (".", "..") or where.count("/") > 1


def load(name: str, streaming: bool = False) -> Any:
    """The ``DatasetDict`` (or ``IterableDatasetDict``) ``hf:NAME_OR_DIR`` names; one clear error
    for a missing folder or an unreachable, uncached Hub name."""
    ds = _datasets()
    where = _where(name)
    path = Path(where).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{name}: {path} is a file; pass the folder save_to_disk wrote, or a folder of "
                             f"Parquet/Arrow files")
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            try:
                loaded = ds.load_from_disk(str(path))
            except Exception as e:  # an empty split (IndexError), a torn Arrow file (OSError), ...
                raise ValueError(f"{name}: {_saved_problem(path) or _first_line(e)}") from None
            if streaming:
                loaded = _to_iterable(loaded)
            return _as_dict(loaded)
        said: List[logging.LogRecord] = []
        try:
            with _holding_logs("datasets", said):  # its multi-line report is said in our one line
                return ds.load_dataset(str(path), streaming=streaming)
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"{name}: the datasets package reads no dataset in {path} ({_first_line(e)}); "
                             f"expected a save_to_disk folder or Parquet/Arrow files") from None
        except Exception as e:  # files that disagree on their columns, or are damaged
            why = next((_first_line(r.getMessage()) for r in said if r.levelno >= logging.ERROR), None)
            raise ValueError(f"{name}: the datasets package cannot read the files in {path} "
                             f"({why or _first_line(e.__cause__ or e)}): do they all have the same columns, and "
                             f"are they whole?") from None
        finally:
            for record in said:  # what went right is still said, as it would have been
                if record.levelno < logging.ERROR:
                    logging.getLogger(record.name).handle(record)
    if _looks_local(where):
        raise FileNotFoundError(f"{name}: no such folder: {where}")
    try:
        with _offline_when_unreachable(ds):
            return ds.load_dataset(where, streaming=streaming)
    except ConnectionError as e:  # no network and not in the local cache
        nor = "" if "/" in where else f"; nor is there a folder {where} here"
        raise ConnectionError(f"{name}: not in the local Hugging Face cache and the Hub cannot be reached "
                              f"({_first_line(e)}){nor}: load it once where the network is (it is then cached), "
                              f"or pass a folder saved with save_to_disk") from None
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{name}: no such dataset on the Hub or in the cache ({_first_line(e)})") from None


@contextlib.contextmanager
def _offline_when_unreachable(ds: Any) -> Iterator[None]:
    """The datasets package in offline mode (the local cache only) where the Hub's host does not resolve and no
    proxy is set: online, a name it cannot reach was asked for again and again (about 25 s of retries, each
    logged) before the same answer."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants as hub

    proxied = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    host = urlparse(hub.ENDPOINT).hostname
    try:
        resolves = hub.HF_HUB_OFFLINE or proxied or not host or bool(socket.getaddrinfo(host, 443))
    except socket.gaierror:
        resolves = False
    if resolves:
        yield
        return
    before = (hub.HF_HUB_OFFLINE, ds.config.HF_HUB_OFFLINE)
    hub.HF_HUB_OFFLINE = ds.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE, ds.config.HF_HUB_OFFLINE = before


def _saved_problem(path: Path) -> Optional[str]:
    """What is wrong with a ``save_to_disk`` folder, by file: a split without rows (no Arrow file:
    the datasets package cannot read it back) or an Arrow file that is cut short or damaged."""
    import json

    import pyarrow as pa

    try:
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        splits = [None]
    for split in splits:
        folder = path / split if split else path
        files = sorted(folder.glob("*.arrow"))
        if not files:
            return f"split {split or folder.name!r} holds no rows (no Arrow file in {folder}): drop it or fill it"
        for file in files:
            try:
                with pa.memory_map(str(file)) as source:
                    pa.ipc.open_stream(source).read_all()
            except (OSError, pa.ArrowException) as e:
                return f"{file} is cut short or damaged ({_first_line(e)}): save the dataset again"
    return None


def _first_line(error: Union[BaseException, str]) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


@contextlib.contextmanager
def _holding_logs(logger_name: str, into: List[logging.LogRecord]) -> Iterator[None]:
    """Keep the records ``logger_name`` (and its children) log inside the block, instead of printing them."""
    logger = logging.getLogger(logger_name)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            into.append(record)

    keep, propagate = Keep(), logger.propagate
    handlers = logger.handlers[:]
    logger.handlers, logger.propagate = [keep], False
    try:
        yield
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def _as_dict(loaded: Any) -> Any:
    """A lone split saved without its DatasetDict counts as its "train" split."""
    ds = _datasets()
    if isinstance(loaded, (ds.Dataset, ds.IterableDataset)):
        cls = ds.DatasetDict if isinstance(loaded, ds.Dataset) else ds.IterableDatasetDict
        return cls({"train": loaded})
    return loaded


def _to_iterable(loaded: Any) -> Any:
    ds = _datasets()
    if isinstance(loaded, ds.Dataset):
        return loaded.to_iterable_dataset(num_shards=max(1, min(64, len(loaded) // 1000)))
    return ds.IterableDatasetDict({k: _to_iterable(v) for k, v in loaded.items()})


def pick_split(splits: Any, name: str, split: Optional[str], role: str) -> str:
    """``split`` when the dataset has it, else (none given) the first of ``TEST_SPLITS`` for the
    test role and "train" for training; one error naming the splits there are otherwise."""
    have = list(splits)
    if split is not None:
        if split not in have:
            raise ValueError(f"{name} has no split {split!r}; its splits: {', '.join(have)}")
        return split
    wanted = ("train",) if role == "train" else TEST_SPLITS
    found = next((s for s in wanted if s in have), None)
    if found is None:
        flag = "--hf-split" if role == "train" else "--hf-test-split (vitkit eval: --hf-split)"
        raise ValueError(f"{name} has no {' or '.join(wanted)} split for {role}; its splits: {', '.join(have)}: "
                         f"name one with {flag}")
    return found


# ---------------------------------------------------------------------------------- columns

def find_columns(features: Any, name: str, image_key: Optional[str] = None, label_key: Optional[str] = None,
                 need_labels: bool = True) -> Tuple[str, Optional[str], Optional[List[str]]]:
    """(image column, label column, class names or None) from a split's features: the one
    ``Image`` and the one ``ClassLabel`` column unless named; one error a person can act on.
    ``need_labels=False`` (pre-training): a dataset without a label column gives ``None`` for it."""
    ds = _datasets()
    columns = list(features)
    if image_key is not None:
        if image_key not in features:
            raise ValueError(f"{name} has no column {image_key!r} (--image-key); its columns: {', '.join(columns)}")
        if not isinstance(features[image_key], ds.Image):
            raise ValueError(f"{name}: column {image_key!r} is {type(features[image_key]).__name__}, not images")
    else:
        images = [c for c in columns if isinstance(features[c], ds.Image)]
        if len(images) != 1:
            what = "no image column" if not images else f"{len(images)} image columns ({', '.join(images)})"
            raise ValueError(f"{name} has {what}; its columns: {', '.join(columns)}: name the images with --image-key")
        image_key = images[0]
    if label_key is None:
        labels = [c for c in columns if isinstance(features[c], ds.ClassLabel)]
        if not labels and not need_labels:
            return image_key, None, None
        if len(labels) != 1:
            what = "no label column (ClassLabel)" if not labels else \
                f"{len(labels)} label columns ({', '.join(labels)})"
            raise ValueError(f"{name} has {what}; its columns: {', '.join(columns)}: name the labels with --label-key")
        label_key = labels[0]
    elif label_key not in features:
        raise ValueError(f"{name} has no column {label_key!r} (--label-key); its columns: {', '.join(columns)}")
    feature = features[label_key]
    if isinstance(feature, ds.ClassLabel):
        return image_key, label_key, list(feature.names)
    if not (isinstance(feature, ds.Value) and feature.dtype.startswith(("int", "uint"))):
        raise ValueError(f"{name}: label column {label_key!r} holds {feature!r}; labels must be a ClassLabel or "
                         f"integers")
    return image_key, label_key, None


#: the one class of a dataset read without labels (pre-training needs none)
UNLABELLED = "(unlabelled)"


def _raw_images(split: Any, image_key: str) -> Any:
    """The split with its image column as bytes/paths: vitkit decodes them itself."""
    return split.cast_column(image_key, _datasets().Image(decode=False))


def data_roots(name: str) -> Tuple[Path, ...]:
    """The folders an image cell that holds a path may point into: a local dataset's own folder,
    or the Hugging Face caches a Hub dataset was downloaded to. A path elsewhere is not read (a
    dataset is data, not a way to make vitkit open any file on the machine)."""
    path = Path(_where(name)).expanduser()
    if path.exists():
        return (path.resolve(),)
    ds = _datasets()
    roots = [Path(ds.config.HF_DATASETS_CACHE)]
    try:
        from huggingface_hub import constants

        roots.append(Path(constants.HF_HUB_CACHE))
    except ImportError:
        pass
    return tuple(r.expanduser().resolve() for r in roots)


def decode_cell(cell: Any, channels: int, name: str, roots: Optional[Sequence[Path]] = None):
    """An ``Image(decode=False)`` cell ({"bytes", "path"}) -> an upright RGB/L PIL image. A path
    is read only inside ``roots`` (relative ones from the first): :func:`data_roots`."""
    if not isinstance(cell, dict) or (cell.get("bytes") is None and not cell.get("path")):
        raise BadImageError(name, "no image in this row")
    source = cell["bytes"] if cell.get("bytes") is not None else cell["path"]
    if isinstance(source, str) and roots:
        where = Path(source) if Path(source).is_absolute() else Path(roots[0]) / source
        if not any(where.resolve().is_relative_to(root) for root in roots):
            raise BadImageError(name, f"image path {source} is outside the dataset's folder ({roots[0]}): not read")
        source = str(where)
    try:
        return decode_image(source, channels, name=name)
    except FileNotFoundError as e:
        raise BadImageError(name, f"image file not found: {e.filename or source}") from None


def _label_problem(label: Any, num_classes: int) -> Optional[str]:
    if label is None:
        return "no label"
    if not 0 <= int(label) < num_classes:
        return f"label {int(label)} is outside the {num_classes} classes (0-{num_classes - 1})"
    return None


def label_order(split: Any, label_key: Optional[str], classes: Optional[Sequence[str]], where: str
                ) -> Optional[List[int]]:
    """Where a split's ClassLabel names the classes in another order than ``classes`` (the training split's):
    the index in ``classes`` of each of its label numbers, so that a label means its name (None: the same order,
    or no names to compare). A name ``classes`` lacks is refused: its rows would be scored as another class."""
    features = getattr(split, "features", None) or {}
    feature = features.get(label_key) if label_key else None
    names = getattr(feature, "names", None) if isinstance(feature, _datasets().ClassLabel) else None
    if not names or not classes or list(names) == list(classes):
        return None
    unknown = [n for n in names if n not in classes]
    if unknown:
        raise ValueError(f"{where}: its label column names classes the training split does not have "
                         f"({', '.join(map(repr, unknown[:3]))}{' ...' if len(unknown) > 3 else ''}): "
                         f"{class_difference(list(classes), list(names), ('the training split', 'this one'))}")
    return [list(classes).index(n) for n in names]


def _reordered(label: Any, order: Optional[List[int]]) -> Any:
    """A label number of a split read in the training split's order; one outside the split's own names is -1
    (no class: skipped), as a number it could otherwise land on another class."""
    if order is None or label is None:
        return label
    return order[int(label)] if 0 <= int(label) < len(order) else -1


# ---------------------------------------------------------------------------------- map-style

class HFImages(SampleList):
    """One split of a (non-streaming) Hugging Face dataset as (image, class index) pairs, with
    :class:`~vitkit.data.folder.ImageFolder`'s interface: ``classes``, ``targets``, ``skipped``,
    ``samples``; ``transform`` applies to the decoded PIL image (none: the image itself).

    Labels are read once at construction: a row whose label is outside the classes is in
    ``skipped`` and never indexed. A row whose image does not decode gives a ``Skipped``
    naming it (or, ``strict``, a :class:`~vitkit.data.images.BadImageError`).
    """

    def __init__(self, split: Any, name: str, split_name: str, image_key: str, label_key: Optional[str],
                 classes: Optional[List[str]], transform: Optional[Callable] = None, channels: int = 3,
                 strict: bool = False):
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        self.name, self.split_name = name, split_name
        self.roots = data_roots(name)
        self.image_key, self.label_key = image_key, label_key
        self.transform, self.channels, self.strict = transform, channels, strict
        if label_key is None:  # images alone (pre-training): one class that nothing reads
            self._rows = _raw_images(split.select_columns([image_key]), image_key)
            labels: List[Optional[int]] = [0] * len(split)
            classes = [UNLABELLED]
        else:
            self._rows = _raw_images(split.select_columns([image_key, label_key]), image_key)
            labels = split.select_columns([label_key]).with_format("numpy")[label_key]
            order = label_order(split, label_key, classes, f"{name} split {split_name!r}")
            labels = [None if v is None or v != v else _reordered(int(v), order) for v in labels]  # NaN: a None
        if classes is None:  # integer labels without names: their numbers name them
            top = max((v for v in labels if v is not None), default=-1)
            if top + 1 > MAX_CLASSES:  # bounded before two billion names are made
                raise ValueError(f"{name} split {split_name!r}: the label column {label_key!r} holds {top:,} (row "
                                 f"{labels.index(top)}), which would make {top + 1:,} classes, past {MAX_CLASSES:,}: "
                                 f"integer labels are class numbers 0..N-1 (cast the column to a ClassLabel, or "
                                 f"name another --label-key)")
            classes = [str(i) for i in range(top + 1)]
        self.classes = list(classes)
        self.samples: List[Tuple[int, int]] = []
        self.skipped: List[Tuple[str, str]] = []
        for row, label in enumerate(labels):
            problem = _label_problem(label, len(self.classes))
            if problem is None:
                self.samples.append((row, label))
            elif strict:
                raise ValueError(f"{self.sample_name(row)}: {problem}")
            else:
                self.skipped.append((self.sample_name(row), problem))
        if self.skipped:
            logger.warning("%s/%s: skipped %d of %d rows (first: %s: %s)", name, split_name, len(self.skipped),
                           len(labels), *self.skipped[0])
        if not self.samples:
            first = f" (first: {self.skipped[0][1]})" if self.skipped else ""
            raise ValueError(f"{name} split {split_name!r} has no usable labelled rows of {len(labels)}{first}")

    def sample_name(self, row: int) -> str:
        return f"{self.name}/{self.split_name}#{row}"

    def stored_image(self, index: int) -> Any:
        """Sample ``index``'s image (PIL) in colour as stored, whatever ``channels`` reads it as (BadImageError if
        bad)."""
        row = self.samples[index][0]
        return decode_cell(self._rows[row][self.image_key], 3, self.sample_name(row), self.roots)

    def __getitem__(self, index: int) -> Union[Tuple[Any, int], Skipped]:
        row, label = self.samples[index]
        name = self.sample_name(row)
        try:
            im = decode_cell(self._rows[row][self.image_key], self.channels, name, self.roots)
        except BadImageError as e:
            if self.strict:
                raise
            logger.warning("skipping %s: %s", name, e.reason)
            return Skipped(name, e.reason)
        return (self.transform(im) if self.transform is not None else im), label

    def __repr__(self) -> str:
        return (f"HFImages({self.name!r}, split {self.split_name!r}: {len(self.samples)} images, "
                f"{len(self.classes)} classes, {len(self.skipped)} skipped)")


# ---------------------------------------------------------------------------------- streaming

class HFStream(RankedReader, IterableDataset):
    """One split of a streaming Hugging Face dataset, read as the tar shards are
    (:class:`~vitkit.data.shards.ShardDataset`'s contract).

    Every reader (a rank's DataLoader worker) takes its part with ``datasets``'
    ``split_dataset_by_node`` (whole files when they divide evenly, else every n-th row), after
    the same seeded shuffle on every rank (``datasets``' buffer shuffle, its file order and
    buffer reseeded by ``set_epoch``). With ``epoch_length`` ("auto": the rows // ranks)
    every rank yields exactly that many samples an epoch, a reader that runs out reading its
    part again; without it, every row once (evaluation).
    """

    def __init__(self, split: Any, name: str, split_name: str, image_key: str, label_key: str,
                 classes: List[str], transform: Optional[Callable] = None, channels: int = 3, seed: int = 0,
                 shuffle_buffer: int = 0, epoch_length: Optional[Union[int, str]] = None, strict: bool = False,
                 num_rows: Optional[int] = None, rank: Optional[int] = None, world_size: Optional[int] = None):
        super().__init__()
        self.name, self.split_name = name, split_name
        self.roots = data_roots(name)
        self.image_key, self.label_key, self.classes = image_key, label_key, list(classes)
        self.transform, self.channels, self.seed = transform, channels, seed
        self.shuffle_buffer, self.strict = shuffle_buffer, strict
        self._split = _raw_images(split.select_columns([image_key, label_key]), image_key)
        self._order = label_order(split, label_key, classes, f"{name} split {split_name!r}")
        self._epoch_length = epoch_length
        self._num_rows = num_rows
        self._rank, self._world_size = rank, world_size
        self.epoch = 0

    @property
    def num_samples(self) -> int:
        if self._num_rows is None:
            self._num_rows = count_rows(self._split, self.label_key, f"{self.name}/{self.split_name}")
        return self._num_rows

    @property
    def epoch_length(self) -> Optional[int]:
        if self._epoch_length != "auto":
            return self._epoch_length
        n = self.num_samples // self.world_size
        if n == 0:
            raise ValueError(f"{self.num_samples} rows cannot feed {self.world_size} ranks")
        return n

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _stream(self, reader: int, readers: int, passes: int) -> Iterator[Dict[str, Any]]:
        from datasets.distributed import split_dataset_by_node

        stream = self._split
        if self.shuffle_buffer > 0:
            stream = stream.shuffle(seed=seed_for(self.seed, "hf-stream", passes) % 2 ** 32,
                                    buffer_size=self.shuffle_buffer)
        if readers > 1:
            stream = split_dataset_by_node(stream, rank=reader, world_size=readers)
        stream.set_epoch(self.epoch)  # after the split, which starts its copy at epoch 0
        # iter(): no second split by DataLoader worker; closed here, so that its end (and datasets'
        # wait for pyarrow's threads) comes while the shorter wait is set
        with _shorter_shutdown_sleep(), contextlib.closing(stream.iter(batch_size=1)) as rows:
            for batch in rows:
                yield {k: v[0] for k, v in batch.items()}

    def __iter__(self) -> Iterator[Union[Tuple[Any, int], Skipped]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        reader, readers = self.rank * workers + worker, self.world_size * workers
        length = self.epoch_length
        quota = self.worker_quota(length, worker, workers)
        rows = repeat_passes(lambda passes: self._stream(reader, readers, passes), quota, lambda row: True,
                             lambda: f"{self.name}/{self.split_name}: reader {reader} of {readers} found no rows: "
                                     f"too few rows (or files) for {readers} readers: use fewer --workers")
        for position, row in enumerate(itertools.islice(rows, quota) if quota is not None else rows):
            yield self._sample(position, row, reader)

    def _sample(self, position: int, row: Dict[str, Any], reader: int) -> Union[Tuple[Any, int], Skipped]:
        name = f"{self.name}/{self.split_name}@epoch{self.epoch}:{self.rank}.{position}"
        label = _reordered(row.get(self.label_key), self._order)
        problem = _label_problem(label, len(self.classes))
        try:
            if problem is not None:
                raise BadImageError(name, problem)
            im = decode_cell(row[self.image_key], self.channels, name, self.roots)
        except BadImageError as e:
            if self.strict:
                raise
            logger.warning("skipping %s: %s", name, e.reason)
            return Skipped(name, e.reason)
        return self.transformed(im, reader, position), int(label)


@contextlib.contextmanager
def _shorter_shutdown_sleep() -> Iterator[None]:
    """:data:`SHUTDOWN_SLEEP_S` while a pass is read, the caller's setting back after it."""
    import datasets.config

    before = getattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", None)
    if before is None or before <= SHUTDOWN_SLEEP_S:
        yield
        return
    datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = SHUTDOWN_SLEEP_S
    try:
        yield
    finally:
        datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = before


def count_rows(split: Any, label_key: str, what: str) -> int:
    """The rows of a split: from its metadata when known, else by reading its label column once."""
    info = getattr(split, "info", None)
    splits = getattr(info, "splits", None) or {}
    name = getattr(split, "split", None)
    if name is not None and str(name) in splits and splits[str(name)].num_examples:
        return int(splits[str(name)].num_examples)
    from ..progress import track

    labels = split.select_columns([label_key]).iter(batch_size=1000)
    return sum(len(b[label_key]) for b in track(labels, f"counting the rows of {what}", unit="batches"))


def stream_classes(split: Any, label_key: str, classes: Optional[List[str]], what: str) -> List[str]:
    """Class names of a stream: the ClassLabel's; integer labels need them named (a stream is
    not read twice to find its largest label)."""
    if classes is None:
        raise ValueError(f"{what}: streaming needs a ClassLabel column for its class names; the label column "
                         f"{label_key!r} holds plain integers: read it without streaming, or cast the column "
                         f"to a ClassLabel")
    return classes


__all__ = ["PREFIX", "TEST_SPLITS", "is_hf", "load", "pick_split", "find_columns", "decode_cell", "HFImages",
           "HFStream", "count_rows", "stream_classes"]



# ---------------------------------------------------------------------------------- evaluation

def open_splits(name: str, roles: Dict[str, Optional[str]], image_key: Optional[str] = None,
                label_key: Optional[str] = None, channels: int = 3, transform: Optional[Callable] = None,
                numbered: Optional[List[str]] = None) -> Dict[str, HFImages]:
    """{role: HFImages} for roles "train"/"test" and the split asked for each (None: found),
    the columns read off the first; every split shares the first one's classes. ``numbered``: the classes of
    integer labels without names (a model's "0".."N-1"), else the largest label in the split counts them."""
    splits = load(name)
    out: Dict[str, HFImages] = {}
    classes = None
    for role, split in roles.items():
        split_name = pick_split(splits, name, split, role)
        if classes is None:
            image_key, label_key, classes = find_columns(splits[split_name].features, name, image_key, label_key)
            classes = classes if classes is not None else numbered
        out[role] = HFImages(splits[split_name], name, split_name, image_key, label_key, classes, transform,
                             channels)
        classes = out[role].classes
    return out
