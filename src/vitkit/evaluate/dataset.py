"""Scoring a model on a whole dataset: what ``vitkit eval`` and ``vitkit fewshot`` do, as two calls.

``score_dataset`` reads a split (an in-memory one, or image files through the model's own
evaluation pipeline: an image folder's, tar shards, a Hugging Face one), checks that its classes
are the model's, in order, and returns the report with the split it read. ``fewshot_on_dataset``
extracts frozen features of a fixed pool of training images and of the test split and fits the
paper's ridge probes. Both refuse wrong options before reading any image, in the words the
command line uses (the flags are the parameters' names).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import IterableDataset

from ..data.images import Skipped
from .fewshot import (
    HOLDOUT_PER_CLASS,
    FewShotResult,
    NoImages,
    TooFewImages,
    extract_features,
    features_over,
    fewshot_from_features,
)
from .metrics import ClassificationReport, classification_report, report_over
from .tta import check_mode

#: Images per batch for few-shot features of a Hugging Face split.
FEATURE_BATCH = 500
#: the fixed draw of a split's scored images (scored_positions)
SCORED_SEED = 2021


@dataclass
class DatasetScore:
    """A model's report on one split; ``total`` counts the split's images (``max_images`` may
    have scored fewer), ``skipped`` names the unusable rows of a Hugging Face split."""
    report: ClassificationReport
    dataset: str
    split: str
    total: int
    skipped: List[str] = field(default_factory=list)
    #: a stream's first ``max_images`` were scored (a sample where the split has positions to draw from)
    first_only: bool = False

    def to_dict(self) -> Dict[str, Any]:
        return {"dataset": self.dataset, "split": self.split, **self.report.to_dict()}


@dataclass
class FewShotScore:
    """Few-shot results per shot count, and the unusable rows a Hugging Face split skipped."""
    results: Dict[int, FewShotResult]
    dataset: str
    skipped: List[str] = field(default_factory=list)


def check_hf_options(dataset: Optional[str], data_dir: Optional[str] = None, hf_split: Optional[str] = None,
                     image_key: Optional[str] = None, label_key: Optional[str] = None,
                     hf_test_split: Optional[str] = None) -> None:
    """A Hugging Face split's and columns' names apply to ``hf:`` datasets alone, ``data_dir`` to the others."""
    from ..data import datasets

    given = [f"--{k.replace('_', '-')}" for k, v in (("hf_split", hf_split), ("hf_test_split", hf_test_split),
                                                      ("image_key", image_key), ("label_key", label_key))
             if v is not None]
    if given and not datasets.is_hf(dataset):
        raise ValueError(f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} only to Hugging Face "
                         f"datasets (--dataset hf:NAME_OR_DIR)")
    if datasets.is_hf(dataset) and data_dir:
        raise ValueError(f"--data-dir does not apply to --dataset {dataset}: the folder or Hub name follows hf:")


def check_score_options(batch_size: int, max_images: Optional[int], tta: str = "none") -> None:
    if batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer, not {batch_size}")
    if max_images is not None and max_images < 1:
        raise ValueError(f"--max-images must be a positive integer, not {max_images}")
    check_mode(tta)


#: the most draws a few-shot score averages
MAX_SEEDS = 1000


def check_fewshot_options(shots: Sequence[int], seeds: int, pool: int) -> None:
    if not shots or min(shots) < 1 or seeds < 1 or pool < 0:
        raise ValueError(f"--shots must be >= 1, --seeds >= 1 and --pool >= 0 (0: all), not {list(shots)}, "
                         f"{seeds} and {pool}")
    if seeds > MAX_SEEDS:  # each seed is a fit per shot count: 10^11 of them ran until killed
        raise ValueError(f"--seeds {seeds}: at most {MAX_SEEDS} (the paper averages 5 draws, big_vision 3)")
    whole = all(isinstance(k, int) and not isinstance(k, bool) for k in shots)  # (else fewshot_from_features says)
    need = 2 * (max(shots) + HOLDOUT_PER_CLASS) if whole else 0  # two classes at least: said before the features
    if pool and need > pool:
        raise ValueError(f"--shots {max(shots)}: the probe draws {max(shots)} + {HOLDOUT_PER_CLASS} held-out images "
                         f"of each of at least 2 classes, {need:,} or more, from a pool of {pool:,}: a larger "
                         f"--pool (0 for the whole split), or fewer --shots")


def dataset_of(model, dataset: Optional[str]) -> str:
    """``dataset``, or the one whose class names the model's labels are."""
    from ..data import datasets

    names = model.config.label_names
    found = dataset or datasets.dataset_for_labels(names)
    if found is None:
        shown = f"{len(names)}: " + ", ".join(map(str, names[:3])) + (", ..." if len(names) > 3 else "") \
            if names else "no label names"
        raise ValueError(f"the weights' classes ({shown}) are none of {', '.join(datasets.CLASS_NAMES)}: "
                         f"pass --dataset (dataset= in Python)")
    return found


def fewshot_data_of(model, weights: Optional[str], dataset: Optional[str],
                    data_dir: Optional[str]) -> Tuple[str, Optional[str], Optional[str]]:
    """(dataset, data_dir, a note) for few-shot: ``dataset``; else the one the model's class names are; else the one
    the run that saved ``weights`` trained on (a pre-training run's encoder has no classes), with its data_dir. None
    of them: refused (it ran on Fashion-MNIST whatever the model: an ImageNet tower's "1-shot 23.92%")."""

    from ..data import datasets

    if dataset:
        return dataset, data_dir, None
    if found := datasets.dataset_for_labels(model.config.label_names):
        return found, data_dir, None
    if found := run_data_of(weights, data_dir):
        return found
    raise ValueError("pass --dataset: few-shot fits its probes on the dataset named (fashion-mnist, cifar10, "
                     "cifar100, folder or hf:NAME_OR_DIR), and the weights' classes name none vitkit knows, nor "
                     "are they a run's")


def run_data_of(weights: Optional[str], data_dir: Optional[str] = None
                ) -> Optional[Tuple[str, Optional[str], str]]:
    """(dataset, data_dir, a note) of the run whose folder ``weights`` is (its folder, its model/ folder, or a file in
    either: runs/r/model/model.safetensors, a checkpoint), from its config.json; None where it is no run's."""
    import json
    from pathlib import Path

    path = Path(weights) if weights and not str(weights).startswith("hf-hub:") else None
    for run in (path, *path.parents[:2]) if path is not None else ():
        try:
            saved = json.loads((run / "config.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(saved, dict) and isinstance(saved.get("dataset"), str) and "objective" in saved:
            return (saved["dataset"], data_dir or saved.get("data_dir"),
                    f"{saved['dataset']}, the dataset the run {run} trained on (--dataset chooses another)")
    return None


def check_same_classes(names: Optional[Sequence[str]], classes: Sequence[str], dataset: str) -> None:
    """The model's classes are the data's, the same names in the same order."""
    from ..data.datasets import class_difference

    if why := class_difference(names, classes, ("the weights", f"{dataset}'s data")):
        raise ValueError(f"the weights were trained on {why}: evaluate them on their own dataset")
    if not names and classes:  # (a bare file: its rows were scored as the data's classes without a word)
        shown = ", ".join(map(str, list(classes)[:4])) + (", ..." if len(classes) > 4 else "")
        warnings.warn(f"the weights name no classes: {dataset}'s {len(classes)} classes, in its order ({shown}), are "
                      f"taken as the head's rows 0 to {len(classes) - 1}; give the weights their names (label_names) "
                      f"if they were trained in another order", stacklevel=3)


def score_dataset(model, dataset: Optional[str] = None, split: str = "test", *, data_dir: Optional[str] = None,
                  hf_split: Optional[str] = None, image_key: Optional[str] = None, label_key: Optional[str] = None,
                  max_images: Optional[int] = None, batch_size: int = 500, tta: str = "none",
                  progress: bool = True) -> DatasetScore:
    """Top-1, top-5, per-class accuracy and the confusion matrix of a classifier on a split
    (``dataset`` None: the one whose classes the model names); ``max_images``: a fixed random sample of that
    many (a stream's first N)."""
    from ..data import datasets

    check_score_options(batch_size, max_images, tta)
    check_hf_options(dataset, data_dir, hf_split, image_key, label_key)
    dataset = datasets.canonical(dataset_of(model, dataset))
    if dataset == "shards":
        data, name = _shard_split(model, data_dir, split)
        return _score_files(model, dataset, data, name, max_images, batch_size, tta, progress)
    if datasets.is_hf(dataset):
        hf_split = hf_split or ("train" if split == "train" else None)
        data = _hf_splits(model, dataset, {split: hf_split}, image_key, label_key, scored=True)[split]
        return _score_files(model, dataset, data, data.split_name, max_images, batch_size, tta, progress)
    if dataset == "folder":
        data = _folder_splits(model, data_dir, (split,), progress)[split]
        _in_models_order(data, model.config.label_names)
        return _score_files(model, dataset, data, data.root.name, max_images, batch_size, tta, progress)
    from ..data.tensors import load_split_tensors

    images, labels, classes = load_split_tensors(dataset, split, data_dir)
    check_same_classes(model.config.label_names, classes, dataset)
    total = len(labels)
    scored = scored_positions(total, max_images)
    images, labels = images[scored], labels[scored]
    report = classification_report(model, images, labels, classes, batch_size, progress=progress,
                                   label=f"evaluating {dataset} {split}", tta=tta)
    return DatasetScore(report, dataset, split, total)


def _indexable(dataset: str) -> str:
    """The dataset's registered name, where few-shot reads it: a random pool of training images is
    drawn, which tar shards (a stream) do not offer."""
    from ..data import datasets

    name = datasets.canonical(dataset)
    if name == "shards":
        raise ValueError("few-shot draws a random pool of training images, which tar shards (a stream) do not "
                         "offer: run it on the image folder the shards were written from (--dataset folder), or "
                         "on hf:NAME_OR_DIR")
    return name


def _shard_split(model, data_dir: Optional[str], split: str):
    """A split of tar shards (D/test or val, D/train for ``split="train"``) and its folder's name, read
    in order through the model's evaluation pipeline, as vitkit train evaluates on them."""
    from ..data.datasets import file_split_dirs
    from ..data.pipelines import from_model_config
    from ..data.shards import ShardDataset

    train, test = file_split_dirs("shards", data_dir, need_train=split == "train")
    folder = train if split == "train" else test
    data = ShardDataset(folder, from_model_config(model.config, train=False), channels_of(model), rank=0,
                        world_size=1)
    data.named_classes()  # one line where there are none
    return data, folder.name


def _hf_splits(model, dataset: str, roles: Dict[str, Optional[str]], image_key: Optional[str],
               label_key: Optional[str], scored: bool = False) -> Dict[str, Any]:
    """Hugging Face splits by role, through the model's evaluation pipeline (resize, centre crop). ``scored``: the
    model's head scores them, so integer labels without names are its numbered classes (a test split without the
    last class was read as one class fewer, and refused as "other classes")."""
    from ..data import hf
    from ..data.pipelines import from_model_config

    n = model.config.num_classes
    numbered = [str(i) for i in range(n)] if scored and n and list(model.config.label_names or []) in (
        [], [str(i) for i in range(n)]) else None
    return hf.open_splits(dataset, roles, image_key, label_key, channels_of(model),
                          from_model_config(model.config, train=False), numbered)


def _in_models_order(folder, names: Optional[Sequence[str]]) -> None:
    """A folder's classes numbered as the model numbers them, where they are the same names: a folder lists its
    class folders alphabetically, which says nothing of a head's order (a model trained as dog, cat was refused
    on a folder of cat/ and dog/)."""
    classes, order = _in_models_numbers(names, folder.classes)
    if order is not None:
        folder.samples = [(source, int(order[label])) for source, label in folder.samples]
        folder.classes, folder.class_to_idx = list(classes), {name: i for i, name in enumerate(classes)}


def _in_models_numbers(names: Optional[Sequence[str]], classes: Sequence[str]
                       ) -> Tuple[Sequence[str], Optional[torch.Tensor]]:
    """(the classes as the model numbers them, the data's label -> the model's) where a Hugging Face split or shards
    hold the model's classes in another order (refused, "evaluate them on their own dataset", on the very data the
    run trained on, whose splits may order their ClassLabels apart), or some of them (a test folder without one
    class's folder was refused as other classes, where an empty folder of it scored the rest); (``classes``,
    None) otherwise."""
    names = [str(n) for n in names or ()]
    held = [str(c) for c in classes]
    if not names or names == held or not set(held) <= set(names) or len(set(names)) < len(names) or \
            len(set(held)) < len(held):
        return classes, None
    index = {name: i for i, name in enumerate(names)}
    return names, torch.tensor([index[str(c)] for c in classes])


def _folder_splits(model, data_dir: Optional[str], roles: Sequence[str], progress: bool) -> Dict[str, Any]:
    """An image folder's splits by role ("train": train/, else test/ or val/, as vitkit train reads
    them), through the model's evaluation pipeline; unreadable files skipped and named."""
    from ..data.datasets import class_difference, file_split_dirs
    from ..data.folder import ImageFolder
    from ..data.pipelines import from_model_config

    train, test = file_split_dirs("folder", data_dir, need_train="train" in roles)  # test/ alone scores test/
    out = {role: ImageFolder(train if role == "train" else test, from_model_config(model.config, train=False),
                             channels_of(model), progress=progress) for role in roles}
    if len(out) == 2 and (why := class_difference(out["train"].classes, out["test"].classes,
                                                  (f"{train.name}/", f"{test.name}/"))):
        if not set(out["test"].classes) < set(out["train"].classes):
            raise ValueError(f"the class folders of {train.parent} differ between its splits: {why}")
        _numbered_as(out["test"], out["train"].classes)  # a test folder without some classes: the rest scored, said
    return out


def _numbered_as(data, classes: Sequence[str]) -> None:
    """Renumber an image folder's samples by ``classes``, a superset of its own (the train split's)."""
    index = {name: i for i, name in enumerate(classes)}
    data.samples = [(path, index[data.classes[label]]) for path, label in data.samples]
    data.classes, data.class_to_idx = list(classes), index


def _score_files(model, dataset: str, data, split_name: str, max_images: Optional[int], batch_size: int,
                 tta: str, progress: bool) -> DatasetScore:
    """A split of image files (an image folder, a Hugging Face split, tar shards) decoded in DataLoader
    workers; unusable files skipped and named. ``max_images``: a fixed random sample of N (of a stream, the first
    N in its shards' order, read by one worker: two interleave their batches, so which N came first depended on
    the batch size)."""
    from torch.utils.data import Subset

    from ..data.loader import decoded_batches

    classes, order = _in_models_numbers(model.config.label_names, data.classes)
    check_same_classes(model.config.label_names, classes, dataset)
    skipped = [name for name, _ in getattr(data, "skipped", ())]  # (a stream finds its bad samples as it reads)
    stream = isinstance(data, IterableDataset)
    total = data.num_samples if stream else len(data)
    wanted = total if max_images is None else min(max_images, total)
    first_only = stream and wanted < total
    if first_only:  # the worker stops at the N-th readable (a bad one past it was named and counted as skipped)
        batches = decoded_batches(_FirstReadable(data, wanted), batch_size, 1, skipped)
    else:
        batches = decoded_batches(data if stream or wanted == total else
                                  Subset(data, scored_positions(total, wanted).tolist()), batch_size, 2, skipped)
    if order is not None:
        batches = ((x, order[y]) for x, y in batches)
    whole = stream and max_images is None  # every sample the stream gives, whatever its index counted
    report = report_over(model, _first(batches, wanted) if stream and not whole else batches, classes,
                         -(-wanted // batch_size), progress, f"evaluating {dataset} {split_name}", tta)
    if report.count == 0:  # every sample unreadable: "top-1 0.00% (0 images)", exit 0
        raise ValueError(f"{dataset} {split_name}: none of the {wanted:,} images tried could be read (first: "
                         f"{skipped[0] if skipped else 'none named'}): there is nothing to score")
    if whole and report.count + len(skipped) != total:  # the first N were scored: samples past a stale count lost
        read = report.count + len(skipped)
        warnings.warn(f"{dataset} {split_name}: its index (meta.json) counts {total:,} samples, its shards hold "
                      f"{read:,}: every one was scored; rewrite the index (write_shards writes it)", stacklevel=2)
        total = read
    return DatasetScore(report, dataset, split_name, total, skipped, first_only=first_only)


def _first(batches, n: int):
    """The first ``n`` samples of (inputs, labels) batches."""
    seen = 0
    for x, y in batches:
        if seen >= n:
            return
        yield x[:n - seen], y[:n - seen]
        seen += len(y)


class _FirstReadable(IterableDataset):
    """A stream's first ``n`` readable samples, and the unreadable ones among them: stopped where it is decoded
    (in the DataLoader's worker), so nothing past the ``n``-th is read, named or counted."""

    def __init__(self, data, n: int):
        self.data, self.n = data, n

    def __iter__(self):
        readable = 0
        for item in self.data:
            yield item
            readable += not isinstance(item, Skipped)
            if readable >= self.n:
                return


def channels_of(model) -> int:
    """The channels to decode image files to for ``model`` (grey for one, else RGB)."""
    return 1 if model.config.in_chans == 1 else 3


def scored_positions(n: int, size: Optional[int]) -> torch.Tensor:
    """Positions of a split's images scored (train's ``test_size``, eval's ``max_images``): all of them, or a fixed
    random ``size`` of them (the same for every seed and run), in the split's order. The first N of a class-ordered
    folder were one class's (Hugging Face's examples shuffle before their max_eval_samples too)."""
    if size is None or size >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(SCORED_SEED))[:size].sort().values


def pool_rows(n: int, pool: int) -> torch.Tensor:
    """The training rows shots are drawn from: a random ``pool`` of them (0: all), the same every run."""
    if not pool or pool >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(0))[:pool]


def fewshot_on_dataset(model, dataset: Optional[str] = None, shots: Sequence[int] = (1, 5, 10, 25),
                       seeds: int = 3, pool: int = 10_000, *, data_dir: Optional[str] = None,
                       hf_split: Optional[str] = None, image_key: Optional[str] = None,
                       label_key: Optional[str] = None, progress: bool = True,
                       hf_test_split: Optional[str] = None) -> FewShotScore:
    """The paper's few-shot linear evaluation of ``model``'s frozen features: ridge probes fitted
    on ``shots`` images per class drawn from a fixed random ``pool`` of the training split
    (0: all of it), scored on the test split, over ``seeds`` draws. ``dataset`` None: the one whose class names
    the model's labels are (it was Fashion-MNIST whatever the model); a model without them needs one named.
    ``hf_split`` / ``hf_test_split``: a Hugging Face dataset's splits the shots come from and are scored on
    (default: train; the first of test, validation, valid, val)."""
    from ..data import datasets

    check_fewshot_options(shots, seeds, pool)
    check_hf_options(dataset, data_dir, hf_split, image_key, label_key, hf_test_split)
    dataset = _indexable(dataset_of(model, dataset))
    skipped: List[str] = []
    if datasets.is_hf(dataset):
        splits = _hf_splits(model, dataset, {"train": hf_split, "test": hf_test_split}, image_key, label_key)
        if splits["train"].split_name == splits["test"].split_name:  # fitted on the images it is scored on
            said = "--hf-test-split" if hf_test_split is not None and hf_split is None else "--hf-split"
            raise ValueError(f"{said} {splits['train'].split_name}: fewshot draws its shots from the "
                             f"{splits['train'].split_name} split (--hf-split) and scores the "
                             f"{splits['test'].split_name} split (--hf-test-split): they must be two splits")
    elif dataset == "folder":
        splits = _folder_splits(model, data_dir, ("train", "test"), progress)
    if datasets.is_hf(dataset) or dataset == "folder":
        features, names = _file_features(model, splits, pool, progress, skipped), splits["train"].classes
    else:
        features, names = _memory_features(model, dataset, pool, data_dir, progress)
    _note_classes_not_scored(features[1], features[3], names)
    try:
        results = fewshot_from_features(*features, list(shots), seeds, progress=progress, class_names=names)
    except TooFewImages as e:
        if pool and len(features[1]) >= pool:  # the pool drawn, not the split, held too few of a class
            raise ValueError(f"{e}; only a pool of {pool:,} training images was drawn: a larger pool, or 0 for the "
                             f"whole split (vitkit fewshot --pool 0)") from None
        raise
    return FewShotScore(results, dataset, skipped)


def _note_classes_not_scored(train_y: torch.Tensor, test_y: torch.Tensor, names: Optional[Sequence[str]]) -> None:
    """A note where the test split lacks classes the probes are fitted on (a folder's class without usable
    images scored the rest in silence; eval says so)."""
    missing = sorted(set(torch.as_tensor(train_y).tolist()) - set(torch.as_tensor(test_y).tolist()))
    if missing and len(test_y):
        said = [str(names[c]) if names is not None and c < len(names) else str(c) for c in missing]
        warnings.warn(f"the test split holds no images of {len(missing)} of the classes the probes are fitted on "
                      f"({', '.join(said[:5])}{' ...' if len(said) > 5 else ''}): the score is of the others only",
                      stacklevel=3)


def _memory_features(model, dataset: str, pool: int, data_dir: Optional[str], progress: bool):
    from ..data.tensors import load_split_tensors

    tr_x, tr_y, names = load_split_tensors(dataset, "train", data_dir)
    te_x, te_y, _ = load_split_tensors(dataset, "test", data_dir)
    pick = pool_rows(len(tr_y), pool)  # features of a random subset of the training pool are enough
    tr_x, tr_y = tr_x[pick], tr_y[pick]
    return (extract_features(model, tr_x, progress=progress, label="extracting train features"), tr_y,
            extract_features(model, te_x, progress=progress, label="extracting test features"), te_y), names


def _file_features(model, data: Dict[str, Any], pool: int, progress: bool, skipped: List[str]):
    """Features of a random ``pool`` of the train split and of the whole test split of image files
    (a Hugging Face dataset, an image folder), with their labels; unusable files skipped and named."""
    from torch.utils.data import Subset

    from ..data.loader import decoded_batches

    skipped += [name for split in data.values() for name, _ in split.skipped]
    out: list = []
    for role, rows in (("train", pool_rows(len(data["train"]), pool).tolist()), ("test", None)):
        part = data[role] if rows is None else Subset(data[role], rows)
        labels: list = []

        def inputs(part=part, labels=labels):
            for x, y in decoded_batches(part, FEATURE_BATCH, 2, skipped):
                labels.append(y)
                yield x

        try:
            feats = features_over(model, inputs(), -(-len(part) // FEATURE_BATCH), progress,
                                  f"extracting {role} features")
        except NoImages:  # every image unreadable ("torch.cat(): expected a non-empty list of Tensors")
            raise ValueError(f"none of the {len(part):,} {role} images read for few-shot could be read (first: "
                             f"{skipped[0] if skipped else 'none named'}): there is nothing to fit or score") from None
        out += [feats, torch.cat(labels)]
    return tuple(out)
