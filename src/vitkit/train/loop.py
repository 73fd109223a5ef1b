"""The training loop: in-memory data, batched augmentation, mixed precision, checkpoints.

The data order is a function of (seed, epoch) and augmentation randomness of (seed, step),
so the position in the data is the step counter alone (what resuming needs).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data import fashion_mnist
from ..data.augment import random_crop, random_hflip
from ..evaluate.metrics import prepare_batch
from ..models import create_model
from ..utils import write_json
from . import distributed
from .checkpoint import load_latest, save_checkpoint
from .config import TrainConfig
from .init import model_from_init
from .plot import plot_curves
from .progress import Progress
from .tracking import MetricsLog
from .schedule import lr_at

#: Per-channel statistics of the Fashion-MNIST training images (pixel values in [0, 1]).
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)


class NonFiniteLoss(RuntimeError):
    pass


def load_split(dataset: str, split: str, data_dir: Optional[str] = None):
    """One split of a named dataset as an ArrayDataset (the one place dataset names are known)."""
    if dataset not in ("fashion-mnist", "fashion_mnist", "fmnist"):
        raise ValueError(f"unknown dataset {dataset!r}; available: fashion-mnist")
    return fashion_mnist.load_split(split, data_dir)


def load_dataset(cfg: TrainConfig):
    """(train, test) ArrayDatasets for ``cfg.dataset``, with its normalisation statistics."""
    return (load_split(cfg.dataset, "train", cfg.data_dir), load_split(cfg.dataset, "test", cfg.data_dir),
            FMNIST_MEAN, FMNIST_STD)


def load_split_tensors(dataset: str, split: str, data_dir: Optional[str] = None):
    """(uint8 images (N, C, H, W), int64 labels, class names) of one split, on the CPU."""
    data = load_split(dataset, split, data_dir)
    images, labels = to_tensors(data.images, data.labels, torch.device("cpu"))
    return images, labels, data.classes


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


def to_tensors(images: np.ndarray, labels: np.ndarray, device: torch.device):
    x = torch.from_numpy(images)
    x = x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return x.contiguous().to(device), torch.from_numpy(labels).to(device)


@torch.inference_mode()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch_size: int, amp: Optional[torch.dtype]) -> Tuple[float, float]:
    """(mean cross-entropy, top-1 accuracy) over uint8 images."""
    was_training = model.training
    model.eval()
    total_loss, correct = 0.0, 0
    for i in range(0, len(labels), batch_size):
        x = prepare_batch(images[i:i + batch_size], model.config)
        y = labels[i:i + batch_size]
        with _autocast(x.device, amp):
            logits = model(x)
        total_loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
    model.train(was_training)
    n = max(len(labels), 1)
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


def train(cfg: TrainConfig, resume: Optional[str] = None, log=print) -> Dict[str, Any]:
    """Run a training job; returns the summary (also written to ``summary.json``)."""
    if resume:
        run_dir = Path(resume)
        saved = run_dir / "config.json"
        if not saved.is_file():
            raise FileNotFoundError(f"cannot resume: {saved} not found (is {run_dir} a run directory?)")
        cfg = TrainConfig(**{**json.loads(saved.read_text()), "progress": cfg.progress})
        cfg.betas = tuple(cfg.betas)
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
    run_dir = Path(resume) if resume else None
    train_set, test_set, mean, std = load_dataset(cfg)

    split = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(2021))
    val_idx, tr_idx = split[:cfg.val_size], split[cfg.val_size:]
    all_x, all_y = to_tensors(train_set.images, train_set.labels, device)
    tr_x, tr_y = all_x[tr_idx.to(device)], all_y[tr_idx.to(device)]
    va_x, va_y = all_x[val_idx.to(device)], all_y[val_idx.to(device)]
    te_x, te_y = to_tensors(test_set.images, test_set.labels, device)

    torch.manual_seed(cfg.seed)
    data_args = dict(img_size=(cfg.img_size,) * 2 if cfg.img_size else tuple(tr_x.shape[-2:]),
                     in_chans=tr_x.shape[1], num_classes=len(train_set.classes),
                     label_names=list(train_set.classes))
    if cfg.init:  # fine-tuning: the architecture and normalisation come from the weights
        model = model_from_init(cfg.init, data_args, cfg.model_args, cfg.init_head,
                                log=log if main else (lambda *a: None))
    else:
        model = create_model(cfg.model, **{**data_args, "mean": mean, "std": std, "crop_pct": 1.0,
                                                **cfg.model_args})
    model = model.to(device)
    model.set_grad_checkpointing(cfg.grad_checkpointing)
    optimizer = make_optimizer(model, cfg)
    amp = pick_precision(cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else None
    forward = ddp or model
    forward = torch.compile(forward) if cfg.compile else forward

    micro = cfg.batch_size // cfg.accum_steps  # global micro-batch; each rank takes 1/world of it
    local = micro // world
    if micro * cfg.accum_steps != cfg.batch_size or local * world != micro:
        raise ValueError(f"batch_size {cfg.batch_size} must divide into {cfg.accum_steps} accumulation "
                         f"steps x {world} processes")
    steps_per_epoch = len(tr_y) // cfg.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"batch_size {cfg.batch_size} is larger than the {len(tr_y)} training images")
    total = cfg.max_steps or math.ceil(cfg.epochs * steps_per_epoch)

    start = 0
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
        start = int(state["step"])
        if main:
            log(f"resuming {run_dir} at step {start}/{total}")
    else:
        run_dir = Path(distributed.broadcast(dist_info, str(_run_dir(cfg)) if main else None))
        if main:
            write_json(run_dir / "config.json", cfg.to_dict())
    metrics_path = run_dir / "metrics.jsonl"
    metrics = MetricsLog(run_dir, enabled=main, tensorboard=cfg.tensorboard)

    def checkpoint(step: int) -> Optional[Path]:
        if not main:
            return None
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict(), "rng": torch.get_rng_state(), "step": step}
        return save_checkpoint(run_dir, step, state, cfg.keep_checkpoints)

    progress = Progress(total, start, enabled=cfg.progress and main)
    model.train()
    seen, train_time = 0, 0.0
    window = _fresh_window()
    t_start = time.perf_counter()
    last_ckpt: Optional[Path] = None
    perm, perm_epoch = None, -1
    mine = slice(dist_info.rank * local, (dist_info.rank + 1) * local)  # this rank's part of a micro-batch
    for step in range(start, total):
        t0 = time.perf_counter()
        epoch, index = divmod(step, steps_per_epoch)
        if epoch != perm_epoch:
            g = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
            perm, perm_epoch = torch.randperm(len(tr_y), generator=g).to(device), epoch
        lr = lr_at(step, total, cfg.lr, cfg.warmup_steps, cfg.schedule, cfg.min_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        aug = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        batch = perm[index * cfg.batch_size:(index + 1) * cfg.batch_size]
        for k in range(cfg.accum_steps):
            idx = batch[k * micro:(k + 1) * micro]
            x = prepare_batch(tr_x[idx], model.config)  # the global micro-batch: the same draws on every rank
            x = random_crop(x, cfg.crop_pad, aug)
            if cfg.hflip:
                x = random_hflip(x, aug)
            x, y = x[mine], tr_y[idx][mine]
            sync = ddp is None or k == cfg.accum_steps - 1
            with (contextlib.nullcontext() if sync else ddp.no_sync()), _autocast(device, amp):
                logits = forward(x)
                loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.label_smoothing)
            if not math.isfinite(sum(distributed.sum_across(dist_info, [loss.item()]))):
                progress.close()
                metrics.close()
                where = f"; the last good checkpoint is {last_ckpt}" if last_ckpt else ""
                raise NonFiniteLoss(f"loss became {loss.item()} at step {step} (lr {lr:.3g}): stopping"
                                    f"{where}. Lower --lr or raise --warmup-steps.")
            scaler.scale(loss / cfg.accum_steps).backward()
            window["loss"] += loss.item() * len(y)
            window["correct"] += (logits.argmax(-1) == y).sum().item()
            window["n"] += len(y)
        if cfg.clip_grad:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
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
        if done % steps_per_epoch == 0 or done == total:
            val_loss, val_acc = evaluate(model, va_x, va_y, cfg.eval_batch_size, amp)
            metrics.write({"step": done, "epoch": round(done / steps_per_epoch, 3), "val_loss": val_loss,
                         "val_acc": val_acc})
        if done % cfg.checkpoint_every == 0 or done == total:
            last_ckpt = checkpoint(done)
    progress.close()

    test_loss, test_acc = evaluate(model, te_x, te_y, cfg.eval_batch_size, amp)
    val_loss, val_acc = evaluate(model, va_x, va_y, cfg.eval_batch_size, amp)
    if main:
        model.save_pretrained(run_dir / "model")
        plot_curves(metrics_path, run_dir / "training_curves.png")
    summary = {"run_dir": str(run_dir), "model": cfg.model, "init": cfg.init, "dataset": cfg.dataset,
               "params": sum(p.numel() for p in model.parameters()),
               "test_top1": test_acc, "test_loss": test_loss, "val_top1": val_acc,
               "steps": total, "epochs": round(total / steps_per_epoch, 3),
               "seconds": round(time.perf_counter() - t_start, 2),
               "train_img_s": round(seen / max(train_time, 1e-9), 1),
               "precision": str(amp).replace("torch.", "") if amp else "fp32", "device": str(device),
               "processes": world}
    metrics.close(summary)
    if main:
        write_json(run_dir / "summary.json", summary)
    return summary
