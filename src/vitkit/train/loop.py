"""The training loop: in-memory data, batched augmentation, mixed precision, checkpoints.

The data order is a function of (seed, epoch) and augmentation randomness of (seed, step),
so the position in the data is the step counter alone (what resuming needs).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..data.mixing import mixup_cutmix, random_erasing
from ..models import create_model, get_model_config
from ..utils import write_json
from . import distributed
from .batches import Layout, MicroBatch, augment_seed
from .checkpoint import load_latest, save_checkpoint
from .config import TrainConfig, resolve_width, resumed_config
from .data import RunData, load_split_tensors, open_data, to_tensors  # noqa: F401 (re-exported)
from .distill import InputSpec, distillation_loss, load_teacher, split_outputs
from .ema import ModelEma
from .init import model_from_init
from .plot import plot_curves
from .progress import Progress
from .schedule import lr_at
from .tracking import MetricsLog


class NonFiniteLoss(RuntimeError):
    pass


def mix_seed(seed: int, step: int, k: int, rank: int) -> int:
    """The seed of micro-batch ``k`` of ``step`` on ``rank`` for erasing and Mixup/CutMix."""
    return (((augment_seed(seed, step) * 1024 + k) * 4096 + rank) * 2 + 1) % 2 ** 63


def pick_precision(cfg: TrainConfig, device: torch.device) -> Optional[torch.dtype]:
    """bf16 autocast where the hardware does it well, fp16 on older GPUs, else fp32 (None)."""
    if cfg.precision == "fp32":
        return None
    if cfg.precision == "bf16":
        return torch.bfloat16
    if cfg.precision == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    try:  # oneDNN's own probe for native bf16 (AVX-512 BF16 / AMX); a private API, so guarded
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        native = False
    return torch.bfloat16 if native else None


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Weight decay on weight matrices only: not on biases, norms, tokens or position tables."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    if cfg.optimizer == "adam":  # the paper's Adam with decoupled weight decay is AdamW
        return torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


@torch.inference_mode()
def evaluate(model: nn.Module, batches: Iterable[MicroBatch], amp: Optional[torch.dtype]) -> Tuple[float, float]:
    """(mean cross-entropy, top-1 accuracy) over (inputs, labels, skipped) batches."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total_loss, correct, n = 0.0, 0, 0
    for x, y, _ in batches:
        if x is None:
            continue
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with _autocast(x.device, amp):
            logits = model(x)
        total_loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        n += len(y)
    model.train(was_training)
    n = max(n, 1)
    return total_loss / n, correct / n


def _fresh_window() -> Dict[str, float]:
    """Running sums for the train metrics of one logging interval."""
    return {"loss": 0.0, "correct": 0, "n": 0, "t": time.perf_counter()}


def _autocast(device: torch.device, amp: Optional[torch.dtype]):
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp)


def _run_dir(cfg: TrainConfig) -> Path:
    name = cfg.name or f"{cfg.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(cfg.out) / name
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"run directory {path} already exists; pass --resume {path} to continue "
                              f"it or another --name")
    path.mkdir(parents=True, exist_ok=True)
    return path


def busy_cpu_note(threads: Optional[int]) -> Optional[str]:
    """A hint when this run takes every core of a CPU that is already busy: two runs that each
    use all threads oversubscribe OpenMP and slow each other far beyond their share (measured on
    2 cores: ~25 img/s instead of ~1,000), while one thread each keeps ~600 img/s per run."""
    if threads or not hasattr(os, "getloadavg"):
        return None
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load < max(1.0, cores / 2):
        return None
    return (f"the CPU is already busy (load {load:.1f} over the last minute on {cores} cores) and this run "
            f"uses {torch.get_num_threads()} threads; runs that share a CPU should split it, e.g. "
            f"--threads {max(1, cores // 2)} each")


def train(cfg: TrainConfig, resume: Optional[str] = None, log=print) -> Dict[str, Any]:
    """Run a training job; returns the summary (also written to ``summary.json``)."""
    if resume:  # the saved configuration; only the machine's fields (threads, ...) may change
        cfg = resumed_config(resume, cfg)
    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dist_info = distributed.setup()
    try:
        return _train(cfg, resume, log, dist_info)
    finally:
        distributed.cleanup(dist_info)


def _train(cfg: TrainConfig, resume: Optional[str], log, dist_info) -> Dict[str, Any]:
    device, world, main = dist_info.device, dist_info.world, dist_info.main
    note = busy_cpu_note(cfg.threads) if main and world == 1 and device.type == "cpu" else None
    if note:
        log(note)
    run_dir = Path(resume) if resume else None
    # file datasets decode to the model's channels (RGB for --init: the loader adapts the filters)
    in_chans = cfg.model_args.get("in_chans", 3 if cfg.init else get_model_config(cfg.model).in_chans)
    data = open_data(cfg, device, channels=1 if in_chans == 1 else 3)
    if data.skipped and main:
        log(f"skipped {len(data.skipped)} unreadable image files (first: {data.skipped[0][0]}: "
            f"{data.skipped[0][1]}); --strict-data makes them an error")

    torch.manual_seed(cfg.seed)
    data_args = data.model_args(cfg.img_size)
    if cfg.init:  # fine-tuning: the architecture and normalisation come from the weights
        model = model_from_init(cfg.init, data_args, cfg.model_args, cfg.init_head,
                                log=log if main else (lambda *a: None))
    else:
        stats = {"mean": data.mean, "std": data.std}
        if data.kind == "memory":
            stats["crop_pct"] = 1.0  # whole small images, no centre crop
        model_args = resolve_width(cfg.model_args, get_model_config(cfg.model))
        model = create_model(cfg.model, **{**data_args, **stats, **model_args})
    model = model.to(device)
    model.set_grad_checkpointing(cfg.grad_checkpointing)
    teacher = None
    if cfg.distill != "none":  # DeiT: a frozen teacher; a distillation token gets its own head's loss
        teacher = load_teacher(cfg.teacher, model.config.num_classes, device)
        student_input = InputSpec.of(model.config)
        if getattr(model, "dist_token", None) is not None:
            model.set_distilled_training(True)
        if main:
            log(f"distilling ({cfg.distill}) from {cfg.teacher}")
    optimizer = make_optimizer(model, cfg)
    ema = ModelEma(model, cfg.ema_decay) if cfg.ema_decay is not None else None
    amp = pick_precision(cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else None
    forward = ddp or model
    forward = torch.compile(forward) if cfg.compile else forward

    layout = Layout.fitting(cfg.batch_size, cfg.accum_steps, world, dist_info.rank, cfg.micro_batch)
    if layout.accum_steps != cfg.accum_steps and main:
        log(f"batch {cfg.batch_size} as {layout.accum_steps} accumulation steps of {layout.local} images "
            f"x {world} processes (micro_batch {cfg.micro_batch})")
    steps_per_epoch = data.steps_per_epoch(layout)
    total = cfg.max_steps or math.ceil(cfg.epochs * steps_per_epoch)
    warmup = cfg.warmup_steps if cfg.warmup_epochs is None else round(cfg.warmup_epochs * steps_per_epoch)

    start, prior_seconds = 0, 0.0  # prior_seconds: the wall clock of earlier processes of this run
    if resume:
        state = load_latest(run_dir)
        if state is None:
            raise FileNotFoundError(f"cannot resume: no checkpoints in {run_dir / 'checkpoints'}")
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as e:
            raise ValueError(f"the checkpoint in {run_dir} does not fit model {cfg.model!r}: "
                             f"{str(e).splitlines()[0]}") from e
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        if ema is not None:
            if "ema" not in state:
                raise ValueError(f"the checkpoint in {run_dir} has no EMA weights but ema_decay is set")
            ema.load_state_dict(state["ema"])
        start = int(state["step"])
        prior_seconds = float(state.get("seconds", 0.0))
        if main:
            log(f"resuming {run_dir} at step {start}/{total}")
    else:
        run_dir = Path(distributed.broadcast(dist_info, str(_run_dir(cfg)) if main else None))
        if main:
            write_json(run_dir / "config.json", cfg.to_dict())
    metrics = MetricsLog(run_dir, enabled=main, tensorboard=cfg.tensorboard)

    def checkpoint(step: int) -> Optional[Path]:
        if not main:
            return None
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict(), "rng": torch.get_rng_state(), "step": step,
                 "seconds": prior_seconds + time.perf_counter() - t_start}
        if ema is not None:
            state["ema"] = ema.state_dict()
        return save_checkpoint(run_dir, step, state, cfg.keep_checkpoints)

    progress = Progress(total, start, enabled=cfg.progress and main)
    model.train()
    seen, train_time, skipped = 0, 0.0, 0
    window = _fresh_window()
    t_start = time.perf_counter()
    last_ckpt: Optional[Path] = None
    batches = data.train_batches(model.config, cfg, layout, start, total)
    mixing = cfg.mixup > 0 or cfg.cutmix > 0

    def score(net: nn.Module, split: str) -> Tuple[float, float]:
        return evaluate(net, data.eval_batches(split, model.config, cfg.eval_batch_size), amp)

    final_val: Optional[Tuple[float, float]] = None  # the last step's validation, made in the loop
    for step in range(start, total):
        t0 = time.perf_counter()
        lr = lr_at(step, total, cfg.lr, warmup, cfg.schedule, cfg.min_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for k in range(layout.accum_steps):
            x, y, bad = next(batches)
            skipped += bad
            if x is None:  # every sample of this micro-batch was unreadable
                continue
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if mixing or cfg.random_erasing:  # this rank's micro-batch, its draws from (seed, step, k, rank)
                gen = torch.Generator().manual_seed(mix_seed(cfg.seed, step, k, dist_info.rank))
                x = random_erasing(x, cfg.random_erasing, gen)
                if mixing:
                    x, y, _ = mixup_cutmix(x, y, model.config.num_classes, cfg.mixup, cfg.cutmix,
                                           cfg.mixup_switch_prob, cfg.label_smoothing, gen)
            sync = ddp is None or k == layout.accum_steps - 1
            with (contextlib.nullcontext() if sync else ddp.no_sync()), _autocast(device, amp):
                outputs = forward(x)
                taught = teacher(x, student_input) if teacher is not None else None
                loss = distillation_loss(outputs, y, taught, cfg.distill, cfg.alpha, cfg.tau, cfg.label_smoothing)
                logits = split_outputs(outputs)[0]
            if not math.isfinite(sum(distributed.sum_across(dist_info, [loss.item()]))):
                progress.close()
                metrics.close()
                where = f"; the last good checkpoint is {last_ckpt}" if last_ckpt else ""
                raise NonFiniteLoss(f"loss became {loss.item()} at step {step} (lr {lr:.3g}): stopping"
                                    f"{where}. Lower --lr or raise --warmup-steps.")
            scaler.scale(loss / layout.accum_steps).backward()
            window["loss"] += loss.item() * len(y)
            # with mixing, accuracy is against the argmax of the mixed targets
            hard = y.argmax(-1) if y.is_floating_point() else y
            window["correct"] += (logits.argmax(-1) == hard).sum().item()
            window["n"] += len(y)
        if cfg.clip_grad:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None:
            ema.update(model)
        train_time += time.perf_counter() - t0
        seen += cfg.batch_size
        done = step + 1
        if done % cfg.log_every == 0 or done == total:
            now = time.perf_counter()
            window["loss"], window["correct"], window["n"] = distributed.sum_across(
                dist_info, [window["loss"], window["correct"], window["n"]])
            row = {"step": done, "epoch": round(done / steps_per_epoch, 3), "lr": lr,
                   "train_loss": window["loss"] / window["n"], "train_acc": window["correct"] / window["n"],
                   "img_s": window["n"] / max(now - window["t"], 1e-9)}
            metrics.write(row)
            progress.update(done, {"loss": row["train_loss"], "acc": row["train_acc"], "img/s": row["img_s"],
                                   "epoch": row["epoch"]})
            window = _fresh_window()
        if done % (cfg.val_every or steps_per_epoch) == 0 or done == total:
            val_loss, val_acc = final_val = score(model, "val")
            metrics.write({"step": done, "epoch": round(done / steps_per_epoch, 3), "val_loss": val_loss,
                         "val_acc": val_acc})
        if done % cfg.checkpoint_every == 0 or done == total:
            last_ckpt = checkpoint(done)
    progress.close()

    test_loss, test_acc = score(model, "test")
    # the loop validated after its last step; a run resumed at its end has not run the loop
    val_loss, val_acc = final_val if start < total else score(model, "val")
    ema_results = {}
    if ema is not None:
        ema_test_loss, ema_test_acc = score(ema.module, "test")
        ema_val_loss, ema_val_acc = score(ema.module, "val")
        ema_results = {"test_top1_ema": ema_test_acc, "test_loss_ema": ema_test_loss, "val_top1_ema": ema_val_acc}
    if main:
        model.save_pretrained(run_dir / "model")
        if ema is not None:
            ema.module.save_pretrained(run_dir / "model_ema")
        plot_curves(metrics.path, run_dir / "training_curves.png")
    summary = {"run_dir": str(run_dir), "model": cfg.model, "init": cfg.init, "dataset": cfg.dataset,
               "params": sum(p.numel() for p in model.parameters()),
               "test_top1": test_acc, "test_loss": test_loss, "val_top1": val_acc, **ema_results,
               "train_images": data.n_train, "steps": total, "epochs": round(total / steps_per_epoch, 3),
               "seconds": round(prior_seconds + time.perf_counter() - t_start, 2),
               **({"resumed_at_step": start} if start else {}),
               "train_img_s": round(seen / max(train_time, 1e-9), 1),
               "precision": str(amp).replace("torch.", "") if amp else "fp32", "device": str(device),
               "processes": world, "skipped_files": len(data.skipped) + skipped}
    metrics.close(summary)
    if main:
        write_json(run_dir / "summary.json", summary)
    return summary
