"""Fixed tables (sine-cosine embeddings, relative-offset indices) computed on the CPU.

A model built on the meta device only to count its parameters (``complexity.count_params``:
every ``vitkit train`` and ``vitkit models``) would otherwise run ``arange`` and ``meshgrid`` on
meta tensors, whose decompositions import ``torch._dynamo``: 2.4 s of a process's start-up,
and 2.7 s of ``vitkit models``' 250 builds. The table is small; it is made on the CPU and moved
to the default device (meta, a GPU under ``torch.device``, or the CPU itself). A table whose
shape is known without computing it (``shape=``) is only allocated on the meta device: a relative
index at 2,048 px is 2 GiB of int64, 10-30 s of the CPU to count a model that holds no data.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Tuple, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., torch.Tensor])


def computed_on_cpu(fn: Optional[F] = None, *, shape: Optional[Callable[..., Tuple[int, ...]]] = None,
                    dtype: torch.dtype = torch.long) -> Any:
    """``fn``'s tensor made on the CPU, then moved to ``torch.get_default_device()``; on the meta device,
    with ``shape`` (the table's shape from ``fn``'s arguments), an empty ``dtype`` table of that shape."""
    if fn is None:
        return functools.partial(computed_on_cpu, shape=shape, dtype=dtype)

    @functools.wraps(fn)
    def on_cpu(*args: Any, **kwargs: Any) -> torch.Tensor:
        device = torch.get_default_device()
        if shape is not None and device.type == "meta":
            return torch.empty(shape(*args, **kwargs), dtype=dtype, device=device)
        with torch.device("cpu"):
            table = fn(*args, **kwargs)
        return table.to(device)

    return on_cpu
