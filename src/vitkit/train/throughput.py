"""What the steps measure as they go: the train metrics of each logging interval, kept on the
device and read once per interval (:class:`Window`, which stops a run at its first non-finite
loss: :class:`NonFiniteLoss`), the run's training images per second for its summary, and the hint
when a busy CPU would slow the run."""

from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Optional

import torch

from . import distributed
from .schedule import lr_at
from .state import Run


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite: the run stops, its last checkpoint the last good one."""


class Window:
    """The train metrics of one logging interval, kept on the device until read.

    One (2,) tensor per step -- the summed loss and the correct predictions of its micro-batches
    on this rank -- and the image count on the host; :meth:`check` reads the steps not yet
    read in one transfer (one all-reduce under DDP) and stops the run at a non-finite loss.
    """

    def __init__(self, first_step: int):
        self.pending: List[torch.Tensor] = []
        self.pending_n: List[int] = []
        self.next_step = first_step  # the step of pending[0]
        self.loss, self.correct, self.n = 0.0, 0.0, 0
        self.t = time.perf_counter()

    def add(self, stats: torch.Tensor, n: int) -> None:
        self.pending.append(stats)
        self.pending_n.append(n)

    def check(self, run: Run) -> None:
        if not self.pending:
            return
        device = self.pending[0].device
        counts = torch.tensor(self.pending_n, dtype=torch.float64, device=device)[:, None]
        table = distributed.sum_tensor(run.dist, torch.cat([torch.stack(self.pending).double(), counts], dim=1))
        rows = table.tolist()  # the one host sync of the interval
        for i, (loss, correct, n) in enumerate(rows):
            if not math.isfinite(loss):
                step = self.next_step + i
                lr = lr_at(step, run.total, run.cfg.lr, run.warmup, run.cfg.schedule, run.cfg.min_lr)
                raise NonFiniteLoss(f"loss became {loss / max(n, 1)} at step {step} (lr {lr:.3g}): "
                                    f"{run.stopping()}")
            self.loss, self.correct, self.n = self.loss + loss, self.correct + correct, self.n + int(n)
        self.next_step += len(rows)
        self.pending, self.pending_n = [], []

    def row(self, run: Run, done: int, lr: float) -> Dict[str, float]:
        """The metrics row of the interval ending at step ``done``; an interval without a single
        usable image stops the run (the data source gives nothing but skipped samples)."""
        self.check(run)
        if self.n == 0:
            first = ", ".join(sorted(run.skipped)[:3]) or "none named"
            raise ValueError(f"steps up to {done} saw no usable image: every sample was skipped "
                             f"({len(run.skipped)} so far; first: {first}); see the log for why")
        n = self.n
        row = {"step": done, "epoch": round(done / run.steps_per_epoch, 3), "lr": lr, "train_loss": self.loss / n}
        if run.task.has_accuracy:
            row["train_acc"] = self.correct / n
        row["img_s"] = self.n / max(time.perf_counter() - self.t, 1e-9)
        return row


def train_throughput(run: Run) -> Dict[str, Any]:
    """Training images per second (steps only: no evaluation, no start-up) and which steps it covers:
    every step of the run when the checkpoints carried their training seconds, else this process's."""
    if run.prior_train_seconds is not None:
        steps, seconds, scope = run.total, run.prior_train_seconds + run.train_seconds, "all steps"
    else:
        steps, seconds = run.total - run.start, run.train_seconds
        scope = f"steps {run.start + 1}-{run.total} (since the resume; earlier checkpoints kept no training time)"
    if steps == 0:  # resumed at its last step from a checkpoint that kept no training time
        return {"train_img_s": None, "train_img_s_covers": "no step: the run resumed at its last step, and its "
                                                           "checkpoints kept no training time"}
    return {"train_img_s": round(steps * run.cfg.batch_size / max(seconds, 1e-9), 1),
            "train_img_s_covers": scope}


def busy_cpu_note(threads: Optional[int]) -> Optional[str]:
    """A hint when this run takes every core of a CPU that is already busy: two runs that each
    use all threads oversubscribe OpenMP and slow each other far beyond their share (measured on
    2 cores: ~25 img/s instead of ~1,000), while one thread each keeps ~600 img/s per run."""
    if threads or not hasattr(os, "getloadavg"):
        return None
    cores = os.cpu_count() or 1
    load, threads = os.getloadavg()[0], torch.get_num_threads()
    if load < max(1.0, cores / 2) or threads <= max(1, cores // 2):  # busy, but this run already takes its share
        return None
    return (f"the CPU is already busy (load {load:.1f} over the last minute on {cores} cores) and this run "
            f"uses {threads} threads; runs that share a CPU should split it, e.g. --threads {max(1, cores // 2)} each")


__all__ = ["NonFiniteLoss", "Window", "busy_cpu_note", "train_throughput"]
