"""The precision a run trains in, and the default recipe that follows from it.

``auto`` means the machine's fastest precision that trains well: bf16 on a GPU that has it (fp16
on older ones), bf16 on a CPU that runs it natively (AVX-512 BF16 or AMX), and fp32 elsewhere,
where torch would emulate bf16 many times slower than fp32. A run that names no recipe gets
the one chosen for that precision (``recipes.DEFAULT_RECIPES``): a model and schedule sized so that the
default run fits its few minutes on the machine it runs on.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..machine import native_bf16_cpu


def this_device() -> torch.device:
    """The device a single-process run picks (distributed.setup's rule): the GPU when there is one."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def pick_precision(precision: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype for ``precision`` (auto, bf16, fp16, fp32) on ``device``; None: fp32."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if native_bf16_cpu() else None


def why_precision(precision: str, device: torch.device) -> str:
    """Why ``precision`` resolves as it does on ``device``, in a few words for a run's first line."""
    if precision != "auto":
        return f"--precision {precision}"
    if device.type == "cuda":
        return "the GPU's" if torch.cuda.is_bf16_supported() else "the GPU has no bf16"
    return "this CPU runs bf16 natively" if native_bf16_cpu() else "this CPU has no native bf16"


def name_of(dtype: Optional[torch.dtype]) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def trains_in(precision: str = "auto", device: Optional[torch.device] = None) -> Tuple[str, str]:
    """(the precision a run asking for ``precision`` trains in, why), which picks a run's default recipe
    (recipes.default_recipe)."""
    device = device or this_device()
    return name_of(pick_precision(precision, device)), why_precision(precision, device)


__all__ = ["name_of", "pick_precision", "this_device", "trains_in", "why_precision"]
