"""The data of a run: its splits, classes and shape, and the batches the loop reads.

Validation is carved from the training split (``val_size`` samples, the same ones for every
seed); the test split is the dataset's own (for file datasets ``test/``, else ``val/``).
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from ..data import datasets
from ..data.datasets import class_difference
from ..data.folder import ImageFolder
from ..data.pipelines import from_model_config
from ..data.randaugment import RandAugment
from ..data.shards import ShardDataset
from ..data.tensors import load_split_tensors, to_tensors  # noqa: F401 (re-exported)
from ..evaluate.dataset import scored_positions
from ..machine import first_process_on_machine
from ..models.sizes import to_2tuple
from .batches import FolderBatches, Layout, MemoryBatches, MicroBatch, ShardBatches
from .config import TrainConfig

log = logging.getLogger("vitkit.train")

#: The validation split is the same for every seed and run.
VAL_SPLIT_SEED = 2021
#: So is the labelled subset of a train_fraction below 1.
SUBSET_SEED = 2022


def _say_copies(folders: Dict[str, Any], strict: bool) -> None:
    """Held-out images that are training images byte for byte (their scores count what was trained on), and test
    images that are validation images (the test score counts what the run's choices were made on). Read by each
    machine's first process (torchrun's LOCAL_RANK 0), which says it for the others."""
    from ..data.folder import COPY_CHECK_FILES, copied_files

    if not first_process_on_machine() or (not strict and sum(map(len, folders.values())) > COPY_CHECK_FILES):
        return
    parts = [p for p in ("test", "val") if p in folders]
    if len(parts) == 2 and os.path.realpath(folders["val"].root) == os.path.realpath(folders["test"].root):
        warnings.warn(f"{folders['val'].root} and {folders['test'].root} are one folder: the test score counts the "
                      f"images the run's choices (the checkpoint kept) were made on", stacklevel=3)
        parts = ["test"]
    pairs = [(part, "training", folders["train"], copies) for part, copies in
             zip(parts, copied_files(folders["train"], [folders[p] for p in parts]))]
    if len(parts) == 2:
        pairs.append(("test", "validation", folders["val"], copied_files(folders["val"], [folders["test"]])[0]))
    for part, other, theirs, copies in pairs:
        if copies:
            held = folders[part]
            relabelled = sum(_class_of(a, held.root) != _class_of(b, theirs.root) for a, b in copies)
            also = f" ({relabelled:,} of them under another class there: one image, two labels)" if relabelled else ""
            warnings.warn(f"{len(copies):,} of the {len(held):,} images of {held.root} are copies of {other} images, "
                          f"byte for byte{also} (first: {copies[0][0]} = {copies[0][1]}): its scores count them as "
                          f"held out; remove them from one split", stacklevel=3)


def _class_of(path: str, root: Any) -> str:
    """The class folder an image file is in, under its split's ``root``."""
    return os.path.relpath(path, root).split(os.sep)[0]


def _scored_test(n: int, test_size: Optional[int]) -> Tuple[List[int], Optional[int]]:
    """(positions of the test images scored: --test-size's sample, the split's size where they are fewer)."""
    scored = scored_positions(n, test_size).tolist()
    return scored, (n if len(scored) < n else None)


def _carve(n: int, val_size: int):
    """(validation indices, training indices); val_size 0: no validation, all of them trained on."""
    if val_size == 0:
        return torch.arange(0), torch.arange(n)
    if not 0 < val_size < n:
        raise ValueError(f"val_size {val_size} must be between 1 and the {n - 1} training samples "
                         f"it is carved from")
    split = torch.randperm(n, generator=torch.Generator().manual_seed(VAL_SPLIT_SEED))
    return split[:val_size], split[val_size:]


def class_subset(labels: torch.Tensor, fraction: float) -> torch.Tensor:
    """Positions of ``fraction`` of every class in ``labels`` (at least one each), sorted.

    Each class is shuffled once with a fixed seed and its first ceil(fraction x count)
    members kept, so the subset depends only on the labels and the fraction, and a smaller
    fraction's images are inside every larger one's (1% of the labels within 10%).
    """
    if fraction >= 1.0:
        return torch.arange(len(labels))
    labels = labels.cpu()
    g = torch.Generator().manual_seed(SUBSET_SEED)
    keep = []
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).flatten()
        members = members[torch.randperm(len(members), generator=g)]
        keep.append(members[:max(1, math.ceil(fraction * len(members)))])
    return torch.cat(keep).sort().values


def _labelled_subset(tr_idx: torch.Tensor, labels: torch.Tensor, fraction: float) -> torch.Tensor:
    """The part of the training indices ``tr_idx`` a train_fraction keeps (``labels``: all of them)."""
    if fraction >= 1.0:
        return tr_idx
    kept = tr_idx[class_subset(labels[tr_idx], fraction)]
    log.info(f"train_fraction {fraction:g}: {len(kept)} of {len(tr_idx)} training images")
    if len(kept) > 1.5 * fraction * len(tr_idx) + 1:  # every class keeps one: more than the fraction asked for
        warnings.warn(f"--train-fraction {fraction:g} of {len(tr_idx):,} training images keeps {len(kept):,}, not "
                      f"{fraction * len(tr_idx):,.1f}: every class keeps at least one", stacklevel=4)
    return kept


@dataclass
class RunData:
    """Splits and facts of a dataset; batch sources need the model's config (size, normalisation)."""

    kind: str  # how it is batched: "memory", "folder" (indexable files or rows) or "shards" (a stream)
    classes: List[str]
    in_chans: int
    img_size: Optional[tuple]  # the data's own size (in-memory), else None: the model's
    mean: tuple
    std: tuple
    train: Any
    val: Any
    test: Any
    n_train: int
    skipped: List[Any] = field(default_factory=list)
    #: the validation rows score the test split (--val-size 0, or a stream without val/): said as such, not as a
    #: validation score beside the test one
    val_is_test: bool = False
    #: the test split's images where --test-size scores fewer of them (None: all are scored)
    test_split: Optional[int] = None

    def model_args(self, img_size: Any) -> Dict[str, Any]:
        """The new data's model options; ``img_size``: --img-size (one side or height and width), else the data's."""
        args: Dict[str, Any] = dict(in_chans=self.in_chans, num_classes=len(self.classes),
                                    label_names=list(self.classes))
        size = to_2tuple(img_size) if img_size else self.img_size
        if size:
            args["img_size"] = tuple(size)
        return args

    def steps_per_epoch(self, layout: Layout) -> int:
        if self.kind == "shards":  # every rank streams its own share of the samples, whole batches per worker
            steps = self.n_train // layout.world // layout.local // layout.accum_steps
        else:
            steps = self.n_train // layout.batch_size
        if steps == 0:
            raise ValueError(f"batch_size {layout.batch_size} is larger than the {self.n_train} training images")
        return steps

    def train_batches(self, config: Any, cfg: TrainConfig, layout: Layout, start: int, total: int
                      ) -> Iterator[MicroBatch]:
        if self.kind == "memory":
            return self.train.train(config, cfg.seed, layout, start, total, cfg.repeated_aug)
        transform = from_model_config(config, train=True, randaugment=cfg.randaugment,
                                      hflip=0.0 if cfg.hflip is False else 0.5)  # (--no-hflip was unread here)
        if self.kind == "folder":
            return self.train.train(transform, cfg.seed, layout, start, total, cfg.repeated_aug)
        return self.train.train(transform, cfg.seed, layout, start, total, self.steps_per_epoch(layout))

    def eval_batches(self, which: str, config: Any, batch_size: int) -> Iterator[MicroBatch]:
        source = self.val if which == "val" else self.test
        if self.kind == "memory":
            return source.eval(config, batch_size)
        return source.eval(from_model_config(config, train=False), batch_size)


def open_data(cfg: TrainConfig, device: torch.device, channels: int = 3) -> RunData:
    """Load (in memory) or scan (files) the dataset of ``cfg``; ``channels`` for file datasets."""
    name = datasets.canonical(cfg.dataset)
    if datasets.is_hf(name):
        return _hf(cfg, name, channels)
    if datasets.is_in_memory(name):
        return _memory(cfg, name, device)
    if name == "folder":
        return _folder(cfg, channels)
    return _shards(cfg, channels)


def _memory(cfg: TrainConfig, name: str, device: torch.device) -> RunData:
    train_set = datasets.load_split(name, "train", cfg.data_dir)
    test_set = datasets.load_split(name, "test", cfg.data_dir)
    val_idx, tr_idx = _carve(len(train_set), cfg.val_size)
    tr_idx = _labelled_subset(tr_idx, torch.from_numpy(train_set.labels), cfg.train_fraction)
    all_x, all_y = to_tensors(train_set.images, train_set.labels, device)
    scored, cut = _scored_test(len(test_set.labels), cfg.test_size)
    te_x, te_y = to_tensors(test_set.images[scored], test_set.labels[scored], device)
    mean, std = datasets.stats(name)
    tr_idx, val_idx = tr_idx.to(device), val_idx.to(device)
    test = MemoryBatches(te_x, te_y)
    return RunData("memory", list(train_set.classes), all_x.shape[1], tuple(all_x.shape[-2:]), mean, std,
                   train=MemoryBatches(all_x[tr_idx], all_y[tr_idx], cfg.crop_pad, cfg.hflip,
                                       RandAugment.from_spec(cfg.randaugment) if cfg.randaugment else None),
                   val=MemoryBatches(all_x[val_idx], all_y[val_idx]) if cfg.val_size else test, test=test,
                   n_train=len(tr_idx), val_is_test=not cfg.val_size, test_split=cut)


def _folder(cfg: TrainConfig, channels: int) -> RunData:
    train_dir, test_dir = datasets.file_split_dirs("folder", cfg.data_dir)
    # validation: a val/ beside test/ (as tar shards have it), else carved from train/
    val_dir = train_dir.parent / "val" if test_dir.name == "test" and (train_dir.parent / "val").is_dir() else None
    # --strict-data stops on the first bad file before anything is written: every file decoded in the scan (the
    # header check lets a truncated JPEG through, which then stopped the run part-way)
    verify = "full" if cfg.strict_data else "header"
    folders = {part: ImageFolder(folder, channels=channels, strict=cfg.strict_data, progress=cfg.progress,
                                 verify=verify)
               for part, folder in (("train", train_dir), ("test", test_dir), ("val", val_dir)) if folder}
    train, test = folders["train"], folders["test"]
    for other in [f for part, f in folders.items() if part != "train"]:
        if why := class_difference(train.classes, other.classes, (f"{train_dir.name}/", f"{other.root.name}/")):
            raise ValueError(f"the class folders of {other.root} differ from those of {train_dir}: {why}")
    _say_copies(folders, cfg.strict_data)
    val_idx, tr_idx = _split_training(cfg, train, str(train_dir), carve="val" not in folders)
    mean, std = datasets.FILE_STATS
    scored, cut = _scored_test(len(test), cfg.test_size)
    test_batches = FolderBatches(test, scored, cfg.workers)
    val = FolderBatches(folders["val"], range(len(folders["val"])), cfg.workers) if "val" in folders else \
        FolderBatches(train, val_idx.tolist(), cfg.workers)
    return RunData("folder", train.classes, channels, None, mean[:channels], std[:channels],
                   train=FolderBatches(train, tr_idx.tolist(), cfg.workers),
                   val=val if cfg.val_size else test_batches, test=test_batches,
                   n_train=len(tr_idx), skipped=[bad for f in folders.values() for bad in f.skipped],
                   val_is_test=not cfg.val_size, test_split=cut)


def _split_training(cfg: TrainConfig, train: Any, where: str, carve: bool = True):
    """(validation, training) indices of an indexable training split (a folder's, or a Hugging Face split's rows):
    validation carved from it unless ``carve`` is off (a val/ of its own), ``train_fraction``'s class-balanced
    subset, and a class left without a training image said."""
    targets = torch.as_tensor(train.targets)
    carved = _carved_size(cfg, len(train)) if carve else 0
    val_idx, tr_idx = _carve(len(train), carved)
    tr_idx = _labelled_subset(tr_idx, targets, cfg.train_fraction)
    if cfg.objective == "classify":  # (pre-training reads no label)
        _say_untrained_classes(train.classes, targets, targets[tr_idx], where, carved)
    return val_idx, tr_idx


def _carved_size(cfg: TrainConfig, n: int) -> int:
    """The validation images carved from ``n`` training images: --val-size (0: none), at most a tenth of them (an
    explicit --val-size cut so is said: 5 asked of 27 images gave 2 without a word)."""
    carved = min(cfg.val_size, max(1, n // 10))
    if carved < cfg.val_size and "val_size" in (getattr(cfg, "chosen", None) or ()):
        warnings.warn(f"--val-size {cfg.val_size} is more than a tenth of the {n:,} training images: {carved:,} "
                      f"{'is' if carved == 1 else 'are'} carved for validation", stacklevel=4)
    return carved


def _say_untrained_classes(classes: List[str], labels: torch.Tensor, trained: torch.Tensor, where: str,
                           carved: int) -> None:
    """A class without a training image (none in the split: a Hugging Face label no training row has, or all of
    its few carved for validation) is learned from nothing and scored all the same: said, with the way out."""
    def listed(names: List[str]) -> str:
        return ", ".join(names[:6]) + (f" ... ({len(names)} in all)" if len(names) > 6 else "")

    if not classes:  # pre-training on a dataset without labels
        return
    never = [name for i, name in enumerate(classes) if not bool((labels == i).any())]
    carved_out = [name for i, name in enumerate(classes) if name not in never and not bool((trained == i).any())]
    if never:
        warnings.warn(f"{len(never)} of the {len(classes)} classes have no training image in {where}: "
                      f"{listed(never)}; they are learned from nothing and scored all the same", stacklevel=4)
    if carved_out:
        warnings.warn(f"{len(carved_out)} of the {len(classes)} classes of {where} have no training image left "
                      f"after {carved} were carved for validation: {listed(carved_out)}; give them more images, a "
                      f"val/ folder beside train/, or a smaller --val-size", stacklevel=4)


def _shards(cfg: TrainConfig, channels: int) -> RunData:
    if cfg.train_fraction < 1.0:
        raise ValueError("train_fraction needs indexable data (in-memory or an image folder); tar shards "
                         "are streams: write a smaller set of shards instead")
    if cfg.repeated_aug > 1:
        raise ValueError("repeated_aug needs indexable data (in-memory or an image folder); tar shards "
                         "are streams: use --repeated-aug 1")
    if cfg.test_size is not None:
        raise ValueError("test_size needs indexable data (in-memory, an image folder or a Hugging Face dataset); "
                         "tar shards are streams: write a smaller set of test shards instead")
    train_dir, test_dir = datasets.file_split_dirs("shards", cfg.data_dir)
    val_dir = test_dir.parent / "val" if (test_dir.parent / "val").is_dir() else test_dir

    def maker(folder):
        def make(transform, seed: int, shuffle: bool) -> ShardDataset:
            if shuffle:  # training: ranks split the shards, all the same number of samples
                return ShardDataset(folder, transform, channels, seed, cfg.shuffle_buffer,
                                    epoch_length="auto", strict=cfg.strict_data)
            return ShardDataset(folder, transform, channels, rank=0, world_size=1, strict=cfg.strict_data)
        return make

    probe = ShardDataset(train_dir, rank=0, world_size=1)
    classes = probe.named_classes()
    for other in dict.fromkeys((test_dir, val_dir)):  # a label is a class number: the same names, the same order
        if why := class_difference(classes, ShardDataset(other, rank=0, world_size=1).classes,
                                   (f"{train_dir.name}/", f"{other.name}/")):
            raise ValueError(f"the shards of {other} name other classes than those of {train_dir}: {why}")
    mean, std = datasets.FILE_STATS
    # validation: val/ when there is one, else the test split (a stream is not carved): said
    if val_dir == test_dir and cfg.val_size:
        warnings.warn(f"the shards in {cfg.data_dir} have no val/ folder: validation rows score the test split "
                      f"({test_dir.name}/; a stream cannot be carved): write held-out shards to val/ for a "
                      f"validation set, or pass --val-size 0 to say it is meant", stacklevel=2)
    return RunData("shards", classes, channels, None, mean[:channels], std[:channels],
                   train=ShardBatches(maker(train_dir), cfg.workers), val=ShardBatches(maker(val_dir), cfg.workers),
                   test=ShardBatches(maker(test_dir), cfg.workers), n_train=probe.num_samples,
                   val_is_test=val_dir == test_dir or not cfg.val_size)


def _hf(cfg: TrainConfig, name: str, channels: int) -> RunData:
    """A Hugging Face dataset: its rows indexed as an image folder's files are (validation carved
    from the training split, exact resume), or, ``hf_streaming``, streamed as tar shards are."""
    from ..data import hf

    splits = hf.load(name, streaming=cfg.hf_streaming)
    train_name = hf.pick_split(splits, name, cfg.hf_split, "train")
    test_name = hf.pick_split(splits, name, cfg.hf_test_split, "test")
    if train_name == test_name:
        raise ValueError(f"{name}: the training and test splits are both {train_name!r}: name another with "
                         f"--hf-test-split")
    image_key, label_key, classes = hf.find_columns(splits[train_name].features, name, cfg.image_key, cfg.label_key,
                                                    need_labels=cfg.objective == "classify" or cfg.hf_streaming)
    mean, std = datasets.FILE_STATS
    if cfg.hf_streaming:
        return _hf_stream(cfg, name, splits, (train_name, test_name), (image_key, label_key, classes), channels)
    train = hf.HFImages(splits[train_name], name, train_name, image_key, label_key, classes, channels=channels,
                        strict=cfg.strict_data)
    test = hf.HFImages(splits[test_name], name, test_name, image_key, label_key, train.classes, channels=channels,
                       strict=cfg.strict_data)
    val_idx, tr_idx = _split_training(cfg, train, f"{name}'s {train_name} split")
    scored, cut = _scored_test(len(test), cfg.test_size)
    test_batches = FolderBatches(test, scored, cfg.workers)
    return RunData("folder", train.classes, channels, None, mean[:channels], std[:channels],
                   train=FolderBatches(train, tr_idx.tolist(), cfg.workers),
                   val=FolderBatches(train, val_idx.tolist(), cfg.workers) if cfg.val_size else test_batches,
                   test=test_batches, n_train=len(tr_idx),
                   skipped=train.skipped + test.skipped, val_is_test=not cfg.val_size, test_split=cut)


def _hf_stream(cfg: TrainConfig, name: str, splits: Any, names: tuple, columns: tuple, channels: int) -> RunData:
    from ..data import hf
    train_name, test_name = names
    image_key, label_key, classes = columns
    classes = hf.stream_classes(splits[train_name], label_key, classes, f"{name}/{train_name}")
    rows = hf.count_rows(splits[train_name], label_key, f"{name}/{train_name}")

    def maker(split_name: str):
        def make(transform, seed: int, shuffle: bool) -> hf.HFStream:
            if shuffle:  # training: every rank the same number of samples
                return hf.HFStream(splits[split_name], name, split_name, image_key, label_key, classes, transform,
                                   channels, seed, cfg.shuffle_buffer, "auto", cfg.strict_data, num_rows=rows)
            return hf.HFStream(splits[split_name], name, split_name, image_key, label_key, classes, transform,
                               channels, strict=cfg.strict_data, rank=0, world_size=1)
        return make

    if cfg.val_size:
        warnings.warn(f"{name} is streamed: validation rows score the {test_name} split (a stream cannot be "
                      f"carved); pass --val-size 0 to say it is meant", stacklevel=2)
    mean, std = datasets.FILE_STATS
    test = ShardBatches(maker(test_name), cfg.workers)
    return RunData("shards", classes, channels, None, mean[:channels], std[:channels],
                   train=ShardBatches(maker(train_name), cfg.workers), val=test, test=test, n_train=rows,
                   val_is_test=True)
