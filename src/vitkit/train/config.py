"""Training configuration: one dataclass (every field, its ``--help`` text and its checks) and
how a run's configuration is resolved: defaults <- a named recipe (:mod:`.recipes`) <- a config
file (:mod:`.config_files`) <- flags, ``model_args`` merged deeply. What each kind of field may
hold is :mod:`.config_types`'; the resume policy is :mod:`.resume`, which reads this module."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from .. import tiny
from ..extras import require
from ..machine import usable_cores
from .chosen import file_choices, flags_over_file, refuse_ignored, refuse_unknown, refuse_unused
from .config_files import (  # noqa: F401 (re-exported)
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_VALUES,
    YAML_SUFFIXES,
    load_config_file,
    own_run_name,
)
from .config_types import (
    CHOICES,
    HF_FIELDS,
    OFF,
    RANGES,
    TUPLES,
    ConfigNote,
    _above,
    _below,
    _range_words,
    _show,
    as_tuples,
    check_value,
    kinds_of,
    sides,
)
from .recipes import PRETRAIN_RECIPES, RECIPES, for_other_optimizer, recipe_in_effect, resolve_width  # noqa: F401

#: The default model of `vitkit train`: the conv-stem hybrid ViT for 28x28 grey images,
#: which reaches about 92% on Fashion-MNIST within the 5-minute CPU budget (README: Training).
DEFAULT_MODEL = "vit_fmnist_hybrid"


@dataclass
class TrainConfig:
    """Every hyper-parameter of a run; saved as ``config.json`` in the run directory. The ``#:`` comment above
    each field is its ``vitkit train --help`` text."""

    #: Named recipe whose values replace these defaults (a config file and flags override it);
    #: none named: fmnist where the run trains in bf16 (a GPU, a CPU with native bf16), fmnist-fp32
    #: where it trains in fp32 (train/precision.py).
    recipe: str = "fmnist"
    #: fashion-mnist, cifar10, cifar100, folder (an ImageFolder), shards (webdataset tar shards) or
    #: hf:NAME_OR_DIR (a Hugging Face dataset: a Hub name, a save_to_disk folder or a folder of
    #: Parquet files).
    dataset: str = "fashion-mnist"
    #: Where the dataset is (file datasets: the folder with train/ and test/ or val/).
    data_dir: Optional[str] = None
    #: hf: datasets: the split to train on (none: train).
    hf_split: Optional[str] = None
    #: hf: datasets: the split to test on (none: test, else validation).
    hf_test_split: Optional[str] = None
    #: hf: datasets: the image column (none: the one Image column).
    image_key: Optional[str] = None
    #: hf: datasets: the label column (none: the one ClassLabel column, whose names are the classes).
    label_key: Optional[str] = None
    #: hf: datasets: stream the rows (datasets larger than the disk or memory) instead of loading
    #: the splits first; validation then scores the test split.
    hf_streaming: bool = False
    #: Registered model name or size string ("B/16"); see `vitkit models`.
    model: str = DEFAULT_MODEL
    #: Model config overrides as JSON, e.g. {"drop_path_rate": 0.1}; merged into the recipe's.
    model_args: Dict[str, Any] = field(default_factory=dict)
    #: What the run learns: classify (from labels: vitkit train) or a self-supervised objective
    #: (simmim, mpp, mae: vitkit pretrain, which never reads the labels).
    objective: str = "classify"
    #: Pre-training: the share of patches masked (none: the paper's, SimMIM 0.6, MPP 0.5, MAE 0.75).
    mask_ratio: Optional[float] = None
    #: SimMIM: side of the square mask blocks in pixels, whole patches that tile the image (none:
    #: 32, the paper's).
    mask_block: Optional[int] = None
    #: MAE: normalise each target patch by its own mean and variance (none: on, as the released models).
    norm_pix_loss: Optional[bool] = None
    #: MAE: the decoder's width (none: 512, MAE's).
    decoder_dim: Optional[int] = None
    #: MAE: the decoder's depth (none: 8).
    decoder_depth: Optional[int] = None
    #: MAE: the decoder's heads (none: 16).
    decoder_heads: Optional[int] = None
    #: MAE: the decoder's MLP width (none: 2048).
    decoder_mlp_dim: Optional[int] = None
    #: Pre-training: end with the frozen encoder's few-shot linear accuracy (in-memory data; the
    #: features of 20,000 images); --no-fewshot leaves it to your own evaluation.
    fewshot: bool = True
    #: Start from these weights (any format vitkit loads, or a run's folder): the paper's fine-tuning.
    init: Optional[str] = None
    #: "new": drop pre-logits and head for a zero-initialised head (the paper); "keep".
    init_head: str = "new"
    #: How the --init position table is resampled to another grid: auto (as the weights' library does:
    #: timm's bicubic, its bilinear for the official .npz files), bicubic, bilinear, or bilinear-aligned (the
    #: official vit_jax code's scipy zoom: the corners aligned).
    init_interpolation: str = "auto"
    #: What fine-tuning trains (with --init): full (everything), lora (low-rank adapters on the
    #: blocks' linear layers, through peft; merged into the weights when the model is saved),
    #: bitfit (the biases) or head (the classifier alone); the new head always trains.
    finetune: str = "full"
    #: LoRA's rank r.
    lora_rank: int = 8
    #: LoRA's alpha: the adapters are scaled by alpha / r.
    lora_alpha: float = 16.0
    #: The blocks' linear layers that get adapters, by the last part of their names, comma-separated
    #: (ViT's: qkv, proj, fc1, fc2).
    lora_targets: str = "qkv,proj,fc1,fc2"
    #: Freeze the embedding and the first N blocks (with any --finetune).
    freeze_blocks: int = 0
    #: Train and evaluate at this size: one side (a square) or height and width (in-memory images are resized on
    #: the device); none: the data's own size.
    img_size: Optional[Union[int, Tuple[int, int]]] = None
    #: Epochs to train: passes over the training images (--max-steps, when given, decides instead;
    #: the default run's batch 128 learned 0.8 points more than 256 in 2 epochs, at the same img/s).
    epochs: float = 6.0
    #: Stop after this many optimiser steps instead (none: from epochs).
    max_steps: Optional[int] = None
    #: Images per optimiser step, over every process and accumulation step.
    batch_size: int = 128
    #: Micro-batches accumulated per optimiser step.
    accum_steps: int = 1
    #: At most this many images per process per forward pass: accumulation steps are added
    #: until the batch fits (none: accum_steps as given).
    micro_batch: Optional[int] = None
    #: adamw (decoupled weight decay), adam, sgd (with momentum) or muon (orthogonalised steps: train/muon.py).
    optimizer: str = "adamw"
    #: Peak learning rate, reached after the warm-up.
    lr: float = 2e-3
    #: Learning rate at the end of the decay.
    min_lr: float = 1e-5
    #: Weight decay of the weight matrices (not of biases, norms, the class and distillation tokens, position
    #: tables; register tokens and a MAP head's latent are decayed, as timm decays them).
    weight_decay: float = 0.05
    #: Layer-wise learning-rate decay (BEiT/MAE fine-tuning: 0.65-0.75): block i learns at
    #: lr x decay^(depth - i), the embedding at lr x decay^(depth + 1), the head at lr; none: off.
    layer_decay: Optional[float] = None
    #: Adam's beta1 and beta2.
    betas: Tuple[float, float] = (0.9, 0.999)
    #: SGD's or Muon's momentum (Muon's authors use 0.95, as the default runs do).
    momentum: float = 0.9
    #: Muon's weight matrices learn and decay at lr x this (1: at AdamW's RMS; the default runs': 4).
    muon_lr_scale: float = 1.0
    #: Decay after the warm-up: cosine, linear or constant.
    schedule: str = "cosine"
    #: Linear warm-up from 0, in optimiser steps.
    warmup_steps: int = 200
    #: Warm-up in epochs (DeiT: 5), from the run's steps per epoch; wins over warmup_steps (a recipe's yields to yours).
    warmup_epochs: Optional[float] = None
    #: The linear scaling rule: when set, resolve_config turns ``lr`` into
    #: ``lr * batch_size / lr_scale_batch`` (DeiT: 5e-4 x batch / 512) and stores the scaled
    #: lr (this field then none, so a saved config is not scaled twice).
    lr_scale_batch: Optional[int] = None
    #: Clip the global gradient norm to this (the paper: 1); none: no clipping.
    clip_grad: Optional[float] = 1.0
    #: Label smoothing of the cross-entropy targets.
    label_smoothing: float = 0.0
    #: Random crop of in-memory data: pad by this many pixels of the data (black, pixel 0) and cut a
    #: window of the data's size (image files are cut by timm's RandomResizedCrop instead). Augmentation
    #: is off by default: a 5-minute run underfits (crop + flip cost the plain vit_fmnist 2.4 points
    #: there); fmnist-long turns it on.
    crop_pad: int = 0
    #: Horizontal flip with probability 0.5 (after the crop); none: in-memory data unflipped, image
    #: files flipped as timm's training pipeline does (no-hflip turns that off).
    hflip: Optional[bool] = None
    #: DeiT's batch regularisers (timm semantics, on the device, drawn from (seed, step)):
    #: the Mixup Beta alpha (0: off; DeiT 0.8). With Mixup or CutMix the loss is soft-target
    #: cross-entropy with label smoothing folded into the targets, and train accuracy is
    #: measured against the argmax of the mixed targets.
    mixup: float = 0.0
    #: The CutMix Beta alpha (0: off; DeiT 1.0).
    cutmix: float = 0.0
    #: The chance of CutMix when both Mixup and CutMix are on.
    mixup_switch_prob: float = 0.5
    #: Random erasing probability per sample (DeiT 0.25; timm 'pixel' mode, one box).
    random_erasing: float = 0.0
    #: RandAugment, timm's spec without "rand-": "m9-mstd0.5" (DeiT: 2 ops, magnitude ~ N(9, 0.5));
    #: in memory per image on the device from (seed, step), for image folders in the pipeline.
    randaugment: Optional[str] = None
    #: Repeated augmentation (DeiT 3; timm's RepeatAugSampler): each sample of an epoch's
    #: selection appears this many times, in different augmentations, split across processes;
    #: an epoch keeps the dataset's size. Not for tar shards.
    repeated_aug: int = 1
    #: DeiT's distillation: none, soft or hard against --teacher.
    distill: str = "none"
    #: The distillation teacher: any weights vitkit loads, or torchvision:NAME:FILE.
    teacher: Optional[str] = None
    #: Soft distillation: the weight of the teacher's term.
    alpha: float = 0.5
    #: Soft distillation: the temperature.
    tau: float = 1.0
    #: Model EMA (DeiT: 0.99996): an exponential moving average of the weights, updated after
    #: every optimiser step, checkpointed, evaluated at the end (``test_top1_ema``) and saved
    #: as ``run_dir/model_ema/``; none: off.
    ema_decay: Optional[float] = None
    #: Training images held out for validation (the same ones for every seed); 0: none held out,
    #: every training image is trained on and validation rows score the test split.
    val_size: int = 5000
    #: Score only this many test images at the end, a fixed random sample (the same for every seed), as
    #: Hugging Face's examples' max_eval_samples (quick checks; the summary's test_images says how many);
    #: none: the whole test split. Indexable data only (in memory, an image folder, a Hugging Face dataset).
    test_size: Optional[int] = None
    #: Test-time augmentation for a second test score at the end (``test_top1_tta``, and the
    #: EMA's; vitkit eval --tta's modes): flip (the image and its mirror) or flip-shift (and their
    #: one-pixel shifts, 10 views), for data whose classes those keep; none: off.
    test_tta: str = "none"
    #: Train on this fraction of the training split (after validation is carved out), the
    #: same share of every class, the same images for every model and seed, and each smaller
    #: fraction's images inside every larger one's: the small-data regime (benchmarks/small_data.py).
    train_fraction: float = 1.0
    #: Validate every this many steps (none: at the end of every epoch, which on a small
    #: fraction of the data would be every few steps).
    val_every: Optional[int] = None
    #: File datasets: DataLoader worker processes.
    workers: int = 2
    #: File datasets: a bad image file is an error instead of skipped and counted.
    strict_data: bool = False
    #: Tar shards: samples held in the shuffle buffer.
    shuffle_buffer: int = 2000
    #: auto (bf16 where the hardware does it well, fp16 on older GPUs, else fp32), bf16, fp16, fp32.
    precision: str = "auto"
    #: torch.compile the model: 11-44 s of compilation on 2 CPU cores, then 0.99x (the default
    #: model, bf16) to 1.2x eager speed (benchmarks/bench_compile.py; README, Training).
    compile: bool = False
    #: Recompute activations in the backward pass (less memory, more time).
    grad_checkpointing: bool = False
    #: The run's seed: initialisation, data order, augmentation and dropout all derive from it.
    seed: int = 0
    #: Folder the run directory is made in (the run writes only into runs_dir/NAME).
    runs_dir: str = "runs"
    #: The run directory's name under runs_dir (none: the trained model's name and the time).
    name: Optional[str] = None
    #: Log training metrics every this many steps.
    log_every: int = 50
    #: Write a checkpoint every this many steps (and at the end).
    checkpoint_every: int = 500
    #: Checkpoints kept (the newest).
    keep_checkpoints: int = 2
    #: Images per forward pass in validation and testing.
    eval_batch_size: int = 1000
    #: CPU threads (none: PyTorch's default, every core).
    threads: Optional[int] = None
    #: How a CPU run uses its threads: batch (each thread runs a part of every batch with
    #: single-threaded operations: no cliff beside other busy processes, ~1.2x faster alone on
    #: the default run), ops (PyTorch's threads inside each operation), auto (batch unless the
    #: run has random layers such as dropout or drop-path, --compile, or several processes).
    cpu_parallel: str = "auto"
    #: Also log to TensorBoard (run_dir/tensorboard) when the tensorboard package is installed.
    tensorboard: bool = True
    #: Show the progress bar.
    progress: bool = True

    def validate(self) -> None:
        """Raise one ValueError listing every problem: each field's type first (a string where a
        number belongs, NaN or infinity, a bool for a count), then every range and combination."""
        problems = type_problems(self.__dict__)
        if problems:  # the range checks below compare numbers: they need the types right
            raise ValueError("invalid training config: " + "; ".join(problems))
        problems = self.range_problems()
        problems += self.objective_problems()
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))
        self.require_packages()

    def range_problems(self) -> list:
        """Every value in its range, every combination possible (types already checked); each
        problem names its field and value."""
        problems = [f"{name} must be {', '.join(choices[:-1])} or {choices[-1]}, not {getattr(self, name)!r}"
                    for name, choices in CHOICES.items() if getattr(self, name) not in choices]
        for name, low, high, note in RANGES:
            value = getattr(self, name)
            if value is not None and any((low is not None and not _above(v, low)) or
                                         (high is not None and not _below(v, high)) for v in sides(value)):
                problems.append(f"{name} must be {_range_words(low, high)}, not {_show(value)}{note}")
        if self.max_steps is None and self.epochs <= 0:
            problems.append(f"epochs must be > 0 (or give max_steps), not {_show(self.epochs)}")
        elif self.epochs < 0:  # max_steps decides the length; a negative count was kept in config.json all the same
            problems.append(f"epochs must be >= 0, not {_show(self.epochs)}")
        if self.finetune in CHOICES["finetune"] and self.finetune != "full" and not self.init:
            problems.append(f"finetune={self.finetune!r} needs --init WEIGHTS (it trains a part of existing weights)")
        if self.init_interpolation in CHOICES["init_interpolation"][1:] and not self.init:
            problems.append(f"init_interpolation={self.init_interpolation!r} needs --init WEIGHTS (it resamples their "
                            f"position table)")
        if self.freeze_blocks and (not self.init or self.finetune == "head"):  # (head: taken, and it did nothing)
            problems.append(f"freeze_blocks={self.freeze_blocks} " + ("needs --init WEIGHTS (it freezes the first "
                            "blocks of existing weights)" if not self.init else "does nothing with finetune='head' "
                            "(only the head trains): drop it, or use it with full, lora or bitfit"))
        if self.finetune == "head" and self.init and self.layer_decay not in (None, 1, 1.0):  # (taken: x1 for all)
            problems.append(f"layer_decay={_show(self.layer_decay)} does nothing with finetune='head': drop it")
        if not [t for t in self.lora_targets.split(",") if t.strip()]:
            problems.append("lora_targets must name at least one layer (e.g. qkv,proj,fc1,fc2)")
        if self.distill != "none" and not self.teacher:
            problems.append(f"distill={self.distill!r} needs --teacher WEIGHTS")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            problems.append(f"betas must be two numbers in [0, 1) (Adam's beta1 and beta2), not {list(self.betas)}")
        if self.randaugment:
            from ..data.randaugment import parse_randaugment
            try:
                parse_randaugment(self.randaugment)
            except ValueError as e:  # (its own words: the part of the string that is wrong)
                problems += [str(e)]
        problems += self._bound_problems()
        return problems

    def _bound_problems(self) -> list:
        """The sizes a machine bounds (its cores), names that must be folders, no empty text."""
        from ..models.config_base import MAX_IMG_SIZE  # here: the command line's flags need no torch

        problems = []
        if self.img_size is not None and max(sides(self.img_size)) > MAX_IMG_SIZE:
            problems.append(f"img_size {_show(self.img_size)} is past the {MAX_IMG_SIZE:,} px vitkit trains at")
        cores = usable_cores()
        if self.threads is not None and self.threads > cores:
            problems.append(f"threads must be at most the {cores} core(s) this process may use, not {self.threads} "
                            f"(more threads than cores only wait on each other)")
        if self.workers > 4 * cores:
            problems.append(f"workers must be at most {4 * cores} (4 per core of the {cores} this process may use), "
                            f"not {self.workers}")
        if self.name is not None and (not self.name.strip() or self.name in (".", "..") or "/" in self.name
                                      or os.sep in self.name or len(self.name.encode()) > 200
                                      or not self.name.isprintable()):
            # printable: a newline or escape in a folder name breaks every command printed with it
            problems.append(f"name must be a folder name (printable, no '/', not '.' or '..', at most 200 "
                            f"bytes), not {self.name!r}")
        empty = [name for name in ("dataset", "model", "runs_dir", "data_dir", "init", "teacher", "randaugment")
                 + HF_FIELDS if getattr(self, name) == ""]
        if empty:
            problems.append(f"{', '.join(empty)} cannot be empty (none: leave the field out)")
        return problems + self._hf_problems()

    def _hf_problems(self) -> list:
        """hf: datasets' own options apply to them alone; their data is the name, not data_dir."""
        from ..data.datasets import is_hf

        given = [name for name in HF_FIELDS + ("hf_streaming",) if getattr(self, name) not in (None, False)]
        if not is_hf(self.dataset):
            return [f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} only to Hugging Face datasets "
                    f"(--dataset hf:NAME_OR_DIR)"] if given else []
        problems = [f"data_dir does not apply to --dataset {self.dataset}: the folder or Hub name follows hf:"] \
            if self.data_dir else []
        indexed = [name for name, on in (("train_fraction", self.train_fraction < 1.0),
                                         ("repeated_aug", self.repeated_aug > 1),
                                         ("test_size", self.test_size is not None)) if on]
        if self.hf_streaming and indexed:
            problems.append(f"{', '.join(indexed)} need{'s' if len(indexed) == 1 else ''} indexable data: a stream "
                            f"cannot be subset or repeated; drop --hf-streaming")
        return problems

    def require_packages(self) -> None:
        """Import the optional packages this run will use, so that a missing one is one line
        (:class:`vitkit.utils.MissingExtra`) before any data is read or run folder made."""
        from ..data.datasets import ALIASES, FILE_DATASETS, is_hf

        dataset = ALIASES.get(self.dataset.lower(), self.dataset.lower())
        if dataset in FILE_DATASETS or is_hf(dataset):
            require("torchvision.transforms.v2", "train", f"training on image files (--dataset "
                                                            f"{self.dataset if is_hf(dataset) else dataset})")
        if is_hf(dataset):
            require("datasets", "hf", f"Hugging Face datasets (--dataset {self.dataset})")
        if self.randaugment:
            require("torchvision.transforms.v2", "train", "RandAugment (--randaugment)")
        if self.finetune == "lora":
            require("peft", "peft", "--finetune lora")
        if self.distill != "none" and (self.teacher or "").startswith("torchvision:"):
            require("torchvision", "train", "torchvision teachers (--teacher torchvision:NAME:FILE)")

    def objective_problems(self) -> list:
        """A pre-training run's options fit its objective: classification uses none, pre-training no labels."""
        from ..selfsup import OBJECTIVES, objective_class

        if self.objective not in ("classify",) + tuple(OBJECTIVES):
            return [f"objective must be classify, {', '.join(OBJECTIVES)}, not {self.objective!r}"]
        given = [name for name in OBJECTIVE_OPTIONS if getattr(self, name) is not None]
        if self.objective == "classify":
            given += [] if self.fewshot else ["fewshot"]
            verb = "applies" if len(given) == 1 else "apply"
            return [f"{', '.join(given)} only {verb} to pre-training (vitkit pretrain --objective ...)"] if given \
                else []
        problems = [f"{name} does not apply to {self.objective} (it is {'/'.join(OBJECTIVE_OPTIONS[name])}'s)"
                    for name in given if self.objective not in OBJECTIVE_OPTIONS[name]]
        labelled = [f"{name}={getattr(self, name)!r}" for name, off in LABEL_FIELDS.items()
                    if getattr(self, name) != off]
        if labelled:
            problems.append(f"pre-training reads no labels, so {', '.join(labelled)} cannot apply (fine-tune with "
                            f"vitkit train --init RUN for those)")
        if not problems:
            try:
                objective_class(self.objective).config_cls(**self.objective_options())
            except (TypeError, ValueError) as e:
                problems.append(str(e))
        return problems

    def objective_options(self) -> Dict[str, Any]:
        """The pre-training objective's options that this run sets (the rest are the paper's)."""
        return {name: getattr(self, name) for name in OBJECTIVE_OPTIONS if getattr(self, name) is not None}

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: list(v) if k in TUPLES and isinstance(v, tuple) else v for k, v in d.items()}


#: The pre-training options of TrainConfig and the objectives each applies to.
OBJECTIVE_OPTIONS: Dict[str, Tuple[str, ...]] = {
    "mask_ratio": ("simmim", "mpp", "mae"), "mask_block": ("simmim",), "norm_pix_loss": ("mae",),
    "decoder_dim": ("mae",), "decoder_depth": ("mae",), "decoder_heads": ("mae",), "decoder_mlp_dim": ("mae",)}
#: Classification's fields that need labels (or a classifier), with their "off" values.
LABEL_FIELDS: Dict[str, Any] = {"mixup": 0.0, "cutmix": 0.0, "label_smoothing": 0.0, "distill": "none",
                                "teacher": None, "init": None, "test_tta": "none"}


# ------------------------------------------------------------------ field types, as people write them


@functools.lru_cache(maxsize=None)
def field_kinds() -> Dict[str, Tuple[str, bool]]:
    """Each TrainConfig field's kind (int, float, bool, str, pair, mapping) and whether it may be none (once)."""
    return kinds_of(TrainConfig)


def check_field(name: str, value: Any, coerce: bool = False) -> Tuple[Any, Optional[str], Optional[str]]:
    """``(value, problem, note)`` for one field: the value (coerced when ``coerce`` and it is unambiguous: "1e-3"
    or 1e4 for a number, 1e4 for an integer), a problem naming the field, the value and what is allowed, or a note
    saying what was coerced."""
    kind, optional = field_kinds()[name]
    return check_value(name, value, kind, optional, coerce)


def type_problems(values: Mapping[str, Any]) -> List[str]:
    """The fields of ``values`` whose type is wrong (no coercion: the API takes what it is given)."""
    kinds = field_kinds()
    return [p for name, value in values.items() if name in kinds for p in (check_field(name, value)[1],) if p]


def coerce_fields(values: Mapping[str, Any], where: str) -> Tuple[Dict[str, Any], List[str]]:
    """Check and coerce the fields of one layer of a configuration (a file): the coerced values and
    the notes that say what was read how; a ValueError naming ``where``, each field, its value and
    what is allowed for the rest."""
    kinds = field_kinds()
    out, notes, problems = {}, [], []
    for name, value in values.items():
        if name not in kinds:
            out[name] = value  # resolve_config names unknown options, with renamed ones
            continue
        value, problem, note = check_field(name, value, coerce=True)
        out[name] = value
        problems += [problem] if problem else []
        notes += [f"{where}: {note}"] if note else []
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))
    return out, notes


# ------------------------------------------------------------------ resolving a run's configuration

#: Fields renamed since runs were first saved: a run folder's older ``config.json`` still resumes.
RENAMED = {"out": "runs_dir"}


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> Dict[str, Any]:
    """``update`` merged into ``base``: dicts merge key by key (recursively), other values replace,
    and a None (JSON null) removes the key, so a flag can undo one key of a recipe's model_args."""
    out = dict(base)
    for key, value in update.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def resolve_config(recipe: Optional[str] = None, file: Optional[str] = None, **overrides: Any) -> TrainConfig:
    """Defaults <- recipe <- config file <- explicit overrides (None: not given; ``OFF``: switch
    an optional field off). ``model_args`` is merged deeply across the three, not replaced. No
    recipe: the default run's for the precision the run will train in (recipes.default_recipe)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    from_file = _file_values(file, given)
    recipe = recipe_in_effect(recipe, file, given, from_file)
    _check_objective_of_recipe(recipe, {**from_file, **given}.get("objective"))
    values: Dict[str, Any] = {"recipe": recipe, "objective": PRETRAIN_RECIPES.get(recipe, "classify")}
    for layer in (RECIPES[recipe], from_file, given):  # (a pre-training recipe implies its objective)
        for key, value in layer.items():
            if key == "model_args" and isinstance(value, Mapping):
                value = deep_merge(values.get(key, {}), value)
            values[key] = None if value is OFF else value
    fields = [f for f in dataclasses.fields(TrainConfig) if f.init]
    below = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory() for f in fields}
    chosen = {**from_file, **given}  # what a person wrote: kept from fitting, and over a recipe's warm-up
    changing = {**file_choices(from_file, {**below, **RECIPES[recipe]}), **given}  # what a file changes (min_lr)
    unread = {**file_choices(from_file, below, RECIPES[recipe]), **given}  # of it, what is off the field's default
    optimizer_note = for_other_optimizer(recipe, values, chosen, below)
    if "warmup_steps" in chosen and "warmup_epochs" not in chosen and values.get("warmup_epochs") is not None:
        values["warmup_epochs"] = None  # the steps asked for, not the recipe's epochs (a 37k-step warm-up)
    if values.get("objective", "classify") != "classify":
        # a label option the recipe set (the default run's smoothing) has nothing to act on in
        # pre-training: dropped; one the user chose is still refused by name (validate)
        for name, off in LABEL_FIELDS.items():
            if name in RECIPES[recipe] and name not in chosen:
                values[name] = off
    if values.get("crop_pad") and "crop_pad" not in chosen and \
            not in_memory_images(values.get("dataset", TrainConfig.dataset)):
        values["crop_pad"] = 0  # the recipe's padding of in-memory images: else saved, unread, refused on resume
    refuse_ignored(values, unread, typed=given)
    refuse_unknown(values, set(below), RENAMED, file, from_file)
    if not isinstance(values.get("model_args", {}), Mapping):
        raise ValueError(f"model_args must be a JSON object of model options, not {values['model_args']!r}")
    values = as_tuples(values)
    recipe_only = set(RECIPES[recipe]) & set(OBJECTIVE_OPTIONS) - set(chosen)
    with _naming(file, {k for k in from_file if k not in given}, recipe, recipe_only):
        cfg = _checked(values)
        refuse_unused(cfg, unread, changing)
    if optimizer_note:  # once the run is accepted (no note before a refusal's line)
        warnings.warn(ConfigNote(optimizer_note), stacklevel=2)
    if not tiny.enabled():  # what a person set: the rest may be fitted to the data (vitkit.train.fit)
        cfg.chosen = frozenset(chosen)
    return cfg


def in_memory_images(dataset: Any) -> bool:
    """Whether ``dataset``'s images are in memory (padded and cropped by --crop-pad), not files (cut by
    RandomResizedCrop); an unknown name counts as in memory: the config's check says it."""
    from ..data.datasets import canonical, is_in_memory

    try:
        return is_in_memory(canonical(dataset))
    except (ValueError, TypeError, AttributeError):
        return True


def _check_objective_of_recipe(recipe: str, objective: Any) -> None:
    """A pre-training recipe trains its own objective: another one asked beside it was refused by a field of the
    recipe's it cannot read ("mask_block does not apply to mae"), not as the two disagreeing."""
    implied = PRETRAIN_RECIPES.get(recipe)
    if implied and isinstance(objective, str) and objective != implied:
        mine = next((r for r, o in PRETRAIN_RECIPES.items() if o == objective), None)
        hint = f"--recipe {mine}" if mine else "no pre-training recipe"
        raise ValueError(f"the recipe {recipe} pre-trains {implied}, not {objective}: give the objective's own recipe "
                         f"({hint}) or leave the objective out")


def _file_values(file: Optional[str], given: Mapping[str, Any]) -> Dict[str, Any]:
    """The config file's fields (none: no file), their types checked and numbers coerced; a flag over one is said."""
    if not file:
        return {}
    from_file, notes = coerce_fields(load_config_file(file), str(file))
    if "name" not in given and own_run_name(file, from_file):  # run r's own runs/r/config.json: the new run is not r
        notes.append(f"{file} is run {from_file.pop('name')}'s own: this run gets a folder of its own (--name)")
    notes += flags_over_file(file, from_file, given)
    for note in notes:  # said, not silent: the command line prints each as one "note:" line
        warnings.warn(ConfigNote(note), stacklevel=3)  # at resolve_config's caller
    return from_file


def _checked(values: Dict[str, Any]) -> TrainConfig:
    """The merged values as a validated TrainConfig, the linear scaling rule applied once; with
    VITKIT_TINY shrunk to test scale after what was asked is checked as it would be without it."""
    if tiny.enabled():  # VITKIT_TINY=1: the documentation's commands at test scale (vitkit/tiny.py)
        TrainConfig(**values).validate()  # what the words ask for is checked as it would be without it
        from ..data.datasets import canonical

        dataset = canonical(values.get("dataset", TrainConfig.dataset))
        stream = bool(values.get("hf_streaming")) or dataset == "shards"
        values = tiny.shrink_config(values, TrainConfig, stream)
    if values.get("lr_scale_batch"):  # the linear scaling rule, applied once, here
        batch = values.get("batch_size", TrainConfig.batch_size)
        values["lr"] = values.get("lr", TrainConfig.lr) * batch / values["lr_scale_batch"]
        values["lr_scale_batch"] = None
    cfg = TrainConfig(**values)
    cfg.validate()
    return cfg


@contextlib.contextmanager
def _naming(file: Optional[str], fields: set, recipe: str, recipe_fields: set):
    """A problem with a field the config file set (and no flag replaced) names the file too; one with a pre-training
    option only the recipe set names the recipe (``--recipe mae-fmnist --decoder-dim 7``: its decoder_heads, 4)."""
    try:
        yield
    except ValueError as e:
        named = sorted(f for f in fields if re.search(rf"\b{f}\b", str(e)))
        if file and named:
            raise ValueError(f"{file} ({', '.join(named)}): {e}") from None
        named = sorted(f for f in recipe_fields - fields if re.search(rf"\b{f}\b", str(e)))
        if named:
            raise ValueError(f"{e} ({', '.join(named)}: set by recipe {recipe})") from None
        raise
