"""What a run's sizes ask of the memory, refused before the work when it cannot be had.

Both checks use lower bounds computed from the model's config
(:mod:`vitkit.models.complexity`), so a size they refuse cannot run on this machine; what they
let through may still run out (the bound leaves out attention's weights, the optimiser's
temporaries and the data), but no typo -- depth 1,000,000, batch 10^8 -- gets as far as an
allocation traceback, or the kernel's out-of-memory kill mid-run.
"""

from __future__ import annotations

from typing import Any

from ..machine import available_memory
from ..models.complexity import complexity, head_params, memory_floor, params_floor

#: Bytes a trained parameter holds: fp32 weight, gradient and Adam's two moments.
TRAINED_PARAM_BYTES = 16


def check_model_fits(config: Any) -> None:
    """Refuse a model whose weights and optimiser state alone exceed the free memory, from its
    config, before it is built."""
    params, available = params_floor(config), available_memory()
    if params is None or available is None or params * TRAINED_PARAM_BYTES <= available:
        return
    head = head_params(config)
    what = (f"its head for {config.num_classes:,} classes" if 2 * head > params else
            f"{getattr(config, 'depth', '?')} blocks of width {getattr(config, 'embed_dim', '?')}")
    raise ValueError(f"the model ({what}) has at least {params:,} parameters: training them needs at least "
                     f"{params * TRAINED_PARAM_BYTES / 2 ** 30:,.1f} GiB and {available / 2 ** 30:,.1f} GiB are free")


def check_batches_fit(config: Any, micro_batch: int, eval_batch: int) -> None:
    """Refuse a micro-batch (or evaluation batch) that cannot fit in the memory left, by
    :func:`vitkit.models.complexity.memory_floor`."""
    available = available_memory()
    if available is None or not hasattr(config, "embed_dim"):
        return
    cost = complexity(config)  # once for both batches: it builds the model on the meta device
    for batch, training, flag in ((micro_batch, True, "--batch-size (or --micro-batch)"),
                                  (eval_batch, False, "--eval-batch-size")):
        need = memory_floor(config, batch, training, cost)
        if need > available:
            h, w = config.img_size
            raise ValueError(f"{'training' if training else 'evaluating'} {batch} images of {h}x{w} at once needs "
                             f"at least {need / 2 ** 30:,.1f} GiB and {available / 2 ** 30:,.1f} GiB are free: "
                             f"lower {flag} or --img-size")


__all__ = ["check_model_fits", "check_batches_fit"]
