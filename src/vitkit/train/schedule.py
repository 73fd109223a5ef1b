"""Learning-rate schedules: linear warm-up, then cosine, linear or constant."""

from __future__ import annotations

import math


def lr_at(step: int, total: int, base: float, warmup: int, schedule: str = "cosine",
          min_lr: float = 0.0) -> float:
    """The learning rate for optimiser step ``step`` (0-based) of ``total``; it decays towards ``min_lr`` but
    never rises (a peak below the default floor, ``--lr 5e-6``, is held, not raised to 1e-5)."""
    min_lr = min(min_lr, base)
    if warmup > 0 and step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant":
        return base
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return min_lr + (base - min_lr) * (1.0 - progress)
    if schedule == "cosine":
        return min_lr + 0.5 * (base - min_lr) * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}")
