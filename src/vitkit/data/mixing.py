"""Batch-level regularisers of DeiT: Mixup / CutMix with soft targets, and random erasing.

Facts from timm (``timm.data.mixup.Mixup`` in batch mode, ``timm.data.random_erasing``), as
DeiT trains with them:

- Mixup / CutMix: per batch, when both are on, CutMix with probability ``switch_prob`` else
  Mixup; ``lam ~ Beta(alpha, alpha)`` of the chosen one. Each sample is mixed with the sample
  at the mirrored position (the batch flipped). CutMix pastes a box of side
  ``cut = int(sqrt(1 - lam) * side)`` pixels (rows ``cy - cut // 2`` to ``cy + (cut + 1) // 2``,
  as the ``rand_bbox`` of the timm the tests pin, 1.0.31; older timm, DeiT's included, ended
  it at ``cy + cut // 2``, one pixel short for an odd ``cut``), its centre uniform over the
  pixels, clipped to the image, and corrects ``lam`` to ``1 - box area / image area``. Targets are
  ``lam * smooth(y) + (1 - lam) * smooth(y_flipped)`` with ``smooth`` the label-smoothed
  one-hot (``1 - s + s / C`` on the class, ``s / C`` elsewhere).
- Random erasing ('pixel' mode, one box): with probability ``p`` per sample, a box of
  2%-1/3 of the area at a log-uniform aspect ratio in [0.3, 1/0.3] (timm's ``min_aspect=0.3``,
  ``max_aspect = 1 / min_aspect``; not torchvision's 3.3) (up to 10 tries to fit) is
  filled with standard-normal values (the batch is already normalised).

Everything is batched on the batch's device; randomness comes from an explicit CPU
``torch.Generator`` (the Beta draw through a NumPy generator seeded from it), so a run can
derive it from (seed, step) and resume with the same draws.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch


def smooth_one_hot(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """float (B, C): ``1 - smoothing + smoothing / C`` on the label, ``smoothing / C`` elsewhere."""
    off = smoothing / num_classes
    out = torch.full((len(labels), num_classes), off, device=labels.device)
    return out.scatter_(1, labels.long()[:, None], 1.0 - smoothing + off)


def _numpy_rng(generator: Optional[torch.Generator]) -> np.random.Generator:
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    return np.random.default_rng(seed)


def cutmix_box(shape: Tuple[int, ...], lam: float, generator: Optional[torch.Generator] = None
               ) -> Tuple[Tuple[int, int, int, int], float]:
    """timm's ``rand_bbox`` + ``correct_lam``: ((y0, y1, x0, x1), lam corrected by the box's area)."""
    H, W = shape[-2:]
    ratio = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(H * ratio), int(W * ratio)
    cy = int(torch.randint(0, H, (1,), generator=generator))
    cx = int(torch.randint(0, W, (1,), generator=generator))
    y0, y1 = min(max(cy - cut_h // 2, 0), H), min(max(cy + (cut_h + 1) // 2, 0), H)
    x0, x1 = min(max(cx - cut_w // 2, 0), W), min(max(cx + (cut_w + 1) // 2, 0), W)
    return (y0, y1, x0, x1), 1.0 - (y1 - y0) * (x1 - x0) / float(H * W)


def mixup_cutmix(x: torch.Tensor, labels: torch.Tensor, num_classes: int, mixup_alpha: float = 0.0,
                 cutmix_alpha: float = 0.0, switch_prob: float = 0.5, smoothing: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor, dict]:
    """(mixed batch, soft targets (B, C), {"lam", "cutmix", "box"}) -- see the module notes.

    With both alphas 0 the batch is returned as is with smoothed one-hot targets (lam 1).
    """
    lam, use_cutmix, box = 1.0, False, None
    if mixup_alpha > 0 or cutmix_alpha > 0:
        rng = _numpy_rng(generator)
        if mixup_alpha > 0 and cutmix_alpha > 0:
            use_cutmix = bool(rng.random() < switch_prob)
            alpha = cutmix_alpha if use_cutmix else mixup_alpha
        else:
            use_cutmix = cutmix_alpha > 0
            alpha = cutmix_alpha if use_cutmix else mixup_alpha
        lam = float(rng.beta(alpha, alpha))
    if lam != 1.0:
        flipped = x.flip(0)
        if use_cutmix:
            box, lam = cutmix_box(x.shape, lam, generator)
            y0, y1, x0, x1 = box
            x = x.clone()
            x[..., y0:y1, x0:x1] = flipped[..., y0:y1, x0:x1]
        else:
            x = x * lam + flipped * (1.0 - lam)
    one_hot = smooth_one_hot(labels, num_classes, smoothing)
    targets = one_hot * lam + one_hot.flip(0) * (1.0 - lam)
    return x, targets, {"lam": lam, "cutmix": use_cutmix, "box": box}


def random_erasing(x: torch.Tensor, p: float, generator: Optional[torch.Generator] = None,
                   scale: Tuple[float, float] = (0.02, 1 / 3), ratio: Tuple[float, float] = (0.3, 1 / 0.3),
                   attempts: int = 10) -> torch.Tensor:
    """timm's RandomErasing(mode='pixel', max_count=1) on a normalised (B, C, H, W) batch."""
    if p <= 0:
        return x
    B, C, H, W = x.shape
    g = dict(generator=generator, device="cpu")
    erase = torch.rand(B, **g) < p
    area = H * W * (scale[0] + (scale[1] - scale[0]) * torch.rand(B, attempts, **g))
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * torch.rand(B, attempts, **g)
    aspect = torch.exp(log_r)
    h = torch.round(torch.sqrt(area * aspect)).long()
    w = torch.round(torch.sqrt(area / aspect)).long()
    fits = (h < H) & (w < W)  # timm's test; the first try that fits is used
    first = torch.where(fits.any(1), fits.float().argmax(1), torch.zeros(B, dtype=torch.long))
    erase &= fits.any(1)
    h = h.gather(1, first[:, None])[:, 0]
    w = w.gather(1, first[:, None])[:, 0]
    u = torch.rand(B, 2, **g)
    top = (u[:, 0] * (H - h + 1).clamp(min=1)).long()
    left = (u[:, 1] * (W - w + 1).clamp(min=1)).long()
    noise = torch.randn(B, C, H, W, **g).to(device=x.device, dtype=x.dtype)
    rows = torch.arange(H)[None, :]
    cols = torch.arange(W)[None, :]
    in_rows = (rows >= top[:, None]) & (rows < (top + h)[:, None])
    in_cols = (cols >= left[:, None]) & (cols < (left + w)[:, None])
    mask = (in_rows[:, :, None] & in_cols[:, None, :] & erase[:, None, None]).to(x.device)
    return torch.where(mask[:, None], noise, x)
