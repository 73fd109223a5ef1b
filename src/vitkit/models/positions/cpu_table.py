"""Fixed tables (sine-cosine embeddings, relative-offset indices) computed on the CPU.

A model built on the meta device only to count its parameters (``complexity.count_params``:
every ``vitkit train`` and ``vitkit models``) would otherwise run ``arange`` and ``meshgrid`` on
meta tensors, whose decompositions import ``torch._dynamo``: 2.4 s of a process's start-up,
and 2.7 s of ``vitkit models``' 250 builds. The table is small; it is made on the CPU and moved
to the default device (meta, a GPU under ``torch.device``, or the CPU itself).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., torch.Tensor])


def computed_on_cpu(fn: F) -> F:
    """``fn``'s tensor made on the CPU, then moved to ``torch.get_default_device()``."""

    @functools.wraps(fn)
    def on_cpu(*args: Any, **kwargs: Any) -> torch.Tensor:
        device = torch.get_default_device()
        with torch.device("cpu"):
            table = fn(*args, **kwargs)
        return table.to(device)

    return on_cpu  # type: ignore[return-value]
