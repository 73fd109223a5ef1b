"""Batched augmentation for in-memory image tensors, run on the training device.

A per-sample Python loop is the bottleneck of small-image training on a CPU; these work on
the whole batch at once. Randomness comes from an explicit generator, so a run can derive
it from (seed, step) and resume at any step with the same draws.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def random_crop(x: torch.Tensor, pad: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Zero-pad by ``pad`` and cut a random H x W window per sample (B, C, H, W); on uint8
    pixels the pad is black, as in torchvision's RandomCrop."""
    if pad <= 0:
        return x
    B, C, H, W = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    oy = torch.randint(0, 2 * pad + 1, (B,), generator=generator, device="cpu").to(x.device)
    ox = torch.randint(0, 2 * pad + 1, (B,), generator=generator, device="cpu").to(x.device)
    rows = (oy[:, None] + torch.arange(H, device=x.device))[:, None, :, None].expand(B, C, H, W)
    cols = (ox[:, None] + torch.arange(W, device=x.device))[:, None, None, :].expand(B, C, H, W)
    return _window(padded, rows, cols)


def _window(padded: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Pick rows, then columns: two gathers instead of a per-sample loop."""
    B, C, H, W = rows.shape
    picked_rows = padded.gather(2, rows[..., :1].expand(B, C, H, padded.shape[-1]))
    return picked_rows.gather(3, cols)


def random_hflip(x: torch.Tensor, generator: Optional[torch.Generator] = None, p: float = 0.5) -> torch.Tensor:
    flip = (torch.rand(x.shape[0], generator=generator, device="cpu") < p).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(-1), x)

