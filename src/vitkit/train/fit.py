"""A run fitted to its data before it starts, and what it will cost, said before the first step.

A recipe's batch and epochs are chosen for its dataset (``fmnist``: 55,000 images, batch 128). On
a small folder of one's own images they do not train: 162 images at batch 128 are one step an
epoch, and 5 epochs five steps. Where the person chose neither (no flag, no config file), the batch
shrinks until an epoch has :data:`STEPS_PER_EPOCH` steps, the epochs grow until the run has
:data:`MIN_STEPS`, and (in a run so fitted) a warm-up longer than a quarter of the run shrinks to a
tenth of it; each change is said in a line. A run whose epochs still make fewer than :data:`TOO_FEW_STEPS` steps is
warned about (``--max-steps N`` is a length asked for knowingly).

Before the first step the run says what it will cost: training operations per image (3x the
forward pass's) times the images it will see, and the time that takes here, from one timed step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any, List, Optional, Tuple

import torch

from ..parallel import BatchParallel
from .batches import Layout
from .config import TrainConfig

#: the fewest optimiser steps an epoch of a small dataset gets (by a smaller batch, down to MIN_BATCH)
STEPS_PER_EPOCH = 10
MIN_BATCH = 8
#: the fewest steps a run whose length nobody chose gets (by more epochs)
MIN_STEPS = 300
#: a run shorter than this learns next to nothing: said, whoever chose it
TOO_FEW_STEPS = 100


def chosen_fields(cfg: TrainConfig) -> Optional[frozenset]:
    """The fields a person set (flags, config file), as :func:`~vitkit.train.resolve_config`
    recorded them; None where unknown (a TrainConfig made directly, a resumed run): nothing is fitted."""
    return getattr(cfg, "chosen", None)


def refuse_an_undividable_batch(cfg: TrainConfig, world: int) -> None:
    """The batch refused before the data is read and the job joined, where it will not be fitted to the data (a
    person chose it, or --micro-batch decides its layout): the same refusal came after the data, the process group
    and the model (about 11 s of a 2-process torchrun job on a 2-core EPYC). One nobody chose is checked after."""
    chosen = chosen_fields(cfg)
    if chosen is None or "batch_size" in chosen or cfg.micro_batch is not None:  # (fit_to_data leaves it as it is)
        Layout.fitting(cfg.batch_size, cfg.accum_steps, world, 0, cfg.micro_batch)


def fit_to_data(cfg: TrainConfig, n_train: int, world: int = 1) -> Tuple[TrainConfig, List[str]]:
    """``cfg`` with the batch, epochs and warm-up nobody chose fitted to ``n_train`` training
    images, and one line per change; the batch a multiple of the ``world``'s processes."""
    chosen = chosen_fields(cfg)
    if chosen is None or n_train <= 0:
        return cfg, []
    changes, notes = {}, []
    batch = cfg.batch_size
    if "batch_size" not in chosen and cfg.micro_batch is None and n_train < batch * STEPS_PER_EPOCH:
        # (fewer images than MIN_BATCH: all of them; 8 of 5 was refused as a batch larger than the data)
        fitted = min(n_train, max(MIN_BATCH, 2 ** int(math.log2(max(1, n_train // STEPS_PER_EPOCH)))))
        fitted = max(world, fitted - fitted % world)  # (5 of 2 processes was refused: "must divide into")
        if fitted < batch:
            changes["batch_size"] = fitted
            notes.append(f"batch {fitted} (not the recipe's {batch}): {n_train:,} training images make "
                         f"{n_train // fitted} steps an epoch at {fitted}, {n_train // batch} at {batch} "
                         f"(--batch-size chooses)")
            batch = fitted
    per_epoch = max(1, n_train // batch)
    total = cfg.max_steps or math.ceil(cfg.epochs * per_epoch)
    if not {"epochs", "max_steps"} & chosen and total < MIN_STEPS:
        epochs = math.ceil(MIN_STEPS / per_epoch)
        changes["epochs"] = float(epochs)
        notes.append(f"{epochs} epochs (not the recipe's {cfg.epochs:g}): {cfg.epochs:g} epochs of {per_epoch} "
                     f"steps would be {total} steps, too few to learn (--epochs chooses)")
        total = epochs * per_epoch
    if changes and not {"warmup_steps", "warmup_epochs"} & chosen and cfg.warmup_epochs is None \
            and cfg.warmup_steps > total / 4:  # a run fitted to small data: its warm-up too
        changes["warmup_steps"] = max(1, total // 10)
        notes.append(f"warm-up of {changes['warmup_steps']} steps (not {cfg.warmup_steps}): a tenth of the "
                     f"run's {total} (--warmup-steps chooses)")
    if total < TOO_FEW_STEPS and "max_steps" not in chosen:  # --max-steps N is a length asked for knowingly
        notes.append(f"note: {total} steps are too few to learn much (under {TOO_FEW_STEPS}): more --epochs, or a "
                     f"smaller --batch-size")
    if not changes:
        return cfg, notes
    fitted_cfg = dataclasses.replace(cfg, **changes)
    fitted_cfg.chosen = chosen
    return fitted_cfg, notes


#: At most this many training FLOPs in the timed step (32 images of ViT-B/16 at 384 px were 9.4
#: TFLOPs, twice: minutes on a laptop to print one line); a large model is timed on fewer images.
TIMED_STEP_FLOPS = 100e9
#: The timed step (two passes) sees at most this share of the images the run will see: a short run
#: (a smoke test, 2 steps of 16) is not made several times longer by its own estimate.
TIMED_SHARE = 0.05


def cost_line(model: torch.nn.Module, macs: int, images: int, micro_batch: int, amp: Optional[torch.dtype],
              device: torch.device, timed: bool = True, parallel: Optional[BatchParallel] = None,
              optimizer: Any = None, steps: int = 0, processes: int = 1) -> str:
    """What the run costs: training operations (3x the forward pass's) per image, times the images
    it will see, and the seconds that takes on this machine from one timed step of ``micro_batch``
    random images (at most :data:`TIMED_STEP_FLOPS` worth, and at most :data:`TIMED_SHARE` of
    ``images``) through ``model`` (its state, gradients and random streams untouched), each of the
    ``processes`` taking its share; in parts on ``parallel``'s workers where the run's steps are
    (beside a busy process, torch's own threads stall at every operation's barrier: "about 59 min"
    for a run of 208 s). An ``optimizer`` whose step costs time of its own (Muon's orthogonalisations)
    adds it for each of the ``steps``. Timed on 32 images where the run's steps take 128, the default
    run's estimate was 4 min for 3 min 8 s of training (a Zen 4): a part of 16 images a thread runs
    slower per image than one of 64."""
    per_image = 6 * macs  # forward 2 x MACs, backward twice the forward
    total = per_image * images
    line = f"cost: {per_image / 1e9:,.2f} GFLOPs of training per image x {images:,} images = {_flops(total)}"
    if not timed:  # pre-training: the encoder's whole pass (masking and a decoder change it), not timed
        return line + " (the encoder's full pass; masking and a decoder change it)"
    n = max(1, min(micro_batch, int(TIMED_STEP_FLOPS // per_image), int(images * TIMED_SHARE)))
    with parallel.single_threaded_ops() if parallel is not None else contextlib.nullcontext():
        seconds = _time_step(model, n, amp, device, parallel)
        if seconds is None:  # (a model without a config's size: nothing to time a step of)
            return line
        step_seconds = optimizer.orthogonalisation_seconds() if hasattr(optimizer, "orthogonalisation_seconds") \
            else 0.0
    how = f"one timed step of {n} image{'s' if n > 1 else ''}"
    if step_seconds:
        each = _duration(step_seconds) if step_seconds >= 1 else f"{step_seconds:.2g} s"
        how += f"; Muon's orthogonalisations {each} a step"
    return line + f"; {_about(seconds / n * images / processes + step_seconds * steps)} here ({how})"


def _time_step(model: torch.nn.Module, n: int, amp: Optional[torch.dtype], device: torch.device,
               parallel: Optional[BatchParallel]) -> Optional[float]:
    config = getattr(model, "config", None)
    size, chans = getattr(config, "img_size", None), getattr(config, "in_chans", None)
    if size is None or chans is None:
        return None
    x = torch.zeros(n, chans, *size, device=device)
    params = [p for p in model.parameters() if p.requires_grad]  # gradients returned, none accumulated in place

    def step(part: slice) -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            out = model(x[part])
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.autograd.grad(out.float().sum(), params, allow_unused=True)

    training = model.training
    model.eval()  # no running statistics move; dropout draws nothing
    try:
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
            for _ in range(2):  # the first pass warms the kernels up
                start = time.perf_counter()
                parallel.run(step, n) if parallel is not None else step(slice(None))
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds = time.perf_counter() - start
    finally:
        model.train(training)
    return seconds


def _flops(n: float) -> str:
    for unit, scale in (("PFLOPs", 1e15), ("TFLOPs", 1e12), ("GFLOPs", 1e9)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1e6:,.1f} MFLOPs"


def _about(seconds: float) -> str:
    return "under 1 s" if seconds < 1 else f"about {_duration(seconds)}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = ["STEPS_PER_EPOCH", "MIN_STEPS", "TOO_FEW_STEPS", "TIMED_STEP_FLOPS", "fit_to_data", "cost_line",
           "chosen_fields"]
