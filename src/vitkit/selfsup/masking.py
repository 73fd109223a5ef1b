"""The random draws of the objectives: which patches are masked, and how.

Every function takes a ``torch.Generator`` (CPU) so that a training run draws each batch's
masks from its own seed -- ``(seed, "mask", step, micro-batch)`` -- and a resumed run draws
what the uninterrupted run drew. Masks are (B, N) over the row-major patch grid, True where
a patch is masked.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

from ..models.layers import IntPair


def _rand(shape: Tuple[int, ...], generator: Optional[torch.Generator]) -> torch.Tensor:
    return torch.rand(shape, generator=generator)


def noise(batch: int, n: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """MAE's per-sample noise (B, N) in [0, 1): its argsort orders the patches, the first kept."""
    return _rand((batch, n), generator)


def shuffle_ids(noise: torch.Tensor, keep: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MAE's masking by noise, as the reference code does it: patches sorted by their noise
    (ascending), the first ``keep`` visible. Returns (ids_keep (B, keep), mask (B, N) float with
    1 = masked, ids_restore (B, N): where each patch sits in the sorted order)."""
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    mask = torch.ones_like(noise)
    mask[:, :keep] = 0
    return ids_shuffle[:, :keep], torch.gather(mask, 1, ids_restore), ids_restore


def random_mask(batch: int, n: int, count: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """(B, N) bool with exactly ``count`` True per row, uniformly placed."""
    order = torch.argsort(_rand((batch, n), generator), dim=1)
    return torch.zeros(batch, n, dtype=torch.bool).scatter_(1, order[:, :count], True)


def block_tiling(img_size: IntPair, patch_size: IntPair, block: int, ratio: Optional[float] = None) -> List[str]:
    """Problems of a SimMIM mask block of ``block`` pixels: it must be a whole number of patches
    on each side and tile the image (SimMIM: 32 px blocks on 192 px images of 16 px patches),
    and, given the mask ``ratio``, leave enough blocks for that ratio to be drawn (one block
    masks everything; a few blocks mask a share far from the one asked for)."""
    if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
        return [f"mask_block must be a positive number of pixels, got {block!r}"]
    fits = [b for b in range(1, max(img_size) + 1)
            if all(b % p == 0 and s % b == 0 for s, p in zip(img_size, patch_size))]
    if block not in fits:
        return [f"mask_block {block} px does not tile the {img_size[0]}x{img_size[1]} image in whole "
                f"{patch_size[0]}x{patch_size[1]} patches; blocks that do: {', '.join(map(str, fits)) or 'none'} px"]
    n = (img_size[0] // block) * (img_size[1] // block)
    if ratio is None:
        return []
    masked = block_count(n, ratio)
    if n < 2 or abs(masked / n - ratio) > 0.1:
        smaller = ", ".join(map(str, [b for b in fits if b < block][-4:])) or "none"
        what = "is the whole image: its one block would always be masked" if n < 2 else \
            f"leaves {n} blocks, of which a mask_ratio of {ratio:g} masks {masked} ({masked / n:.0%})"
        return [f"mask_block {block} px {what}, whatever mask_ratio says; smaller blocks that tile the "
                f"{img_size[0]}x{img_size[1]} image: {smaller} px"]
    return []


def block_count(n: int, ratio: float) -> int:
    """How many of ``n`` blocks SimMIM masks at ``ratio``: ceil(ratio x n), at least one, and one
    fewer than all (an image with no visible block has nothing to predict from)."""
    return min(math.ceil(ratio * n), n - 1) or 1


def block_mask(batch: int, grid: IntPair, patch_size: IntPair, block: int, ratio: float,
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """SimMIM's masks (B, gh*gw): ceil(ratio x blocks) square blocks of ``block`` pixels chosen
    at random per image (as its MaskGenerator), each covering (block / patch)^2 patches."""
    sh, sw = block // patch_size[0], block // patch_size[1]
    bh, bw = grid[0] // sh, grid[1] // sw
    blocks = random_mask(batch, bh * bw, block_count(bh * bw, ratio), generator)
    blocks = blocks.reshape(batch, bh, bw)
    return blocks.repeat_interleave(sh, dim=1).repeat_interleave(sw, dim=2).reshape(batch, grid[0] * grid[1])


#: MPP's corruption kinds, the values of ``kinds``
INTACT, MASK_TOKEN, RANDOM_PATCH, UNCHANGED = 0, 1, 2, 3


def corruption(mask: torch.Tensor, split: Tuple[float, float, float],
               generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ViT paper's corruption of the masked patches (its 4.6, after BERT): each masked patch
    independently becomes the [mask] embedding (``split[0]``, 80%), another patch's embedding
    (``split[1]``, 10%) or stays (``split[2]``, 10%). Returns (kinds (B, N) long: INTACT,
    MASK_TOKEN, RANDOM_PATCH or UNCHANGED; sources (B, N) long: the patch of the same image whose
    embedding a RANDOM_PATCH takes, uniform over the N - 1 others)."""
    B, N = mask.shape
    u = _rand((B, N), generator)
    kinds = torch.full((B, N), UNCHANGED, dtype=torch.long)
    kinds[u < split[0] + split[1]] = RANDOM_PATCH
    kinds[u < split[0]] = MASK_TOKEN
    kinds[~mask.bool()] = INTACT
    # another patch: uniform over the N - 1 others (draw from N - 1, skip over itself)
    other = (_rand((B, N), generator) * (N - 1)).long().clamp_max(max(N - 2, 0))
    positions = torch.arange(N).expand(B, N)
    sources = other + (other >= positions).long()
    return kinds, torch.where(kinds == RANDOM_PATCH, sources, positions)


__all__ = ["noise", "shuffle_ids", "random_mask", "block_tiling", "block_count", "block_mask", "corruption",
           "INTACT", "MASK_TOKEN", "RANDOM_PATCH", "UNCHANGED"]
