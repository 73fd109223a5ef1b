"""The run's state: what the steps of a training run share (:class:`Run`) -- the parts
``loop.build`` makes (data, model, optimiser, precision, batch layout, task) and the counters the
loop keeps (step, seconds, checkpoints, skipped samples). Apart from the steps, so that the task
(:mod:`.tasks`) and the loop (:mod:`.loop`) both read it without importing each other.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch import nn

from ..parallel import BatchParallel
from ..runlock import RunLock
from ..selfsup import encoder_of
from . import distributed
from .batches import Layout
from .config import TrainConfig
from .data import RunData
from .distill import InputSpec, Teacher
from .ema import ModelEma
from .tracking import MetricsLog


@dataclass
class Run:
    """What the steps of a run share: the parts ``build`` makes and the counters the loop keeps."""

    cfg: TrainConfig
    dist: distributed.DistInfo
    log: Callable[[str], None]
    data: RunData
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    amp: Optional[torch.dtype]
    layout: Layout
    steps_per_epoch: int
    total: int
    warmup: int
    forward: Callable[..., Any]
    #: what the run learns (:mod:`.tasks`): classification or a pre-training objective
    task: Any = None
    ddp: Optional[nn.Module] = None
    ema: Optional[ModelEma] = None
    #: a CPU run's batch parts (:mod:`vitkit.parallel`); None: torch's threads inside each operation
    parallel: Optional[BatchParallel] = None
    #: how the run uses the CPU's threads, as the first line says it
    parallel_how: str = "ops"
    teacher: Optional[Teacher] = None
    student_input: Optional[InputSpec] = None
    run_dir: Optional[Path] = None
    lock: Optional[RunLock] = None
    metrics: Optional[MetricsLog] = None
    #: the step this process started at, and the seconds (all, training only) of earlier processes
    start: int = 0
    prior_seconds: float = 0.0
    prior_train_seconds: Optional[float] = 0.0
    #: the process counts of earlier sessions of the run (a resume may run on another number)
    prior_processes: tuple = ()
    t_start: float = field(default_factory=time.perf_counter)
    train_seconds: float = 0.0
    #: names of the samples the batch sources dropped (each counted once, however often met)
    skipped: set = field(default_factory=set)
    #: images each split's final scoring read (a stream's count is known only once read): {"test": n}
    scored: dict = field(default_factory=dict)
    last_ckpt: Optional[Path] = None
    #: what was fitted to a small dataset (:mod:`.fit`), said after the first line
    fit_notes: List[str] = field(default_factory=list)
    final_val: Optional[Tuple[float, float]] = None

    @property
    def main(self) -> bool:
        return self.dist.main

    def note(self, message: str) -> None:
        if self.main:
            self.log(message)

    def stopping(self) -> str:
        """How a diverged run ends its message: where to resume from, and what to change."""
        where = f"; the last good checkpoint is {self.last_ckpt}" if self.last_ckpt else ""
        return f"stopping{where}. Lower --lr or raise --warmup-steps."

    def seconds(self) -> float:
        """Wall clock of the run so far, over every process that worked on it."""
        return self.prior_seconds + time.perf_counter() - self.t_start

    @property
    def precision(self) -> str:
        """The autocast dtype as torch names it ("bfloat16"), or "fp32" without autocast."""
        return str(self.amp).replace("torch.", "") if self.amp else "fp32"

    @property
    def model_name(self) -> str:
        """The model trained: the --model name, or for --init the architecture the weights hold."""
        if not self.cfg.init:
            return self.cfg.model
        config = self.input_config
        return config.name or config.architecture

    @property
    def input_config(self) -> Any:
        """The config that says what the model's input is (a pre-training model's encoder's)."""
        return encoder_of(self.model).config

    def no_sync(self, k: int):
        """DDP synchronises gradients on the last micro-batch of a step only."""
        if self.ddp is None or k == self.layout.accum_steps - 1:
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def score(self, net: nn.Module, split: str) -> Tuple[float, Optional[float]]:
        """(loss, accuracy or None) of ``net`` on ``split``, as the run's task measures them."""
        batches = self.data.eval_batches(split, self.input_config, self.cfg.eval_batch_size)
        return self.task.evaluate(net, batches, self.amp, self.parallel)


__all__ = ["Run"]
