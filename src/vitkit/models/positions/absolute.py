"""Absolute position tables: a learned (1, prefix + gh*gw, D) table resampled to another grid, and the
fixed 2D sine-cosine table."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ..sizes import IntPair
from .cpu_table import computed_on_cpu

#: the resampling modes of a position table (``config.pos_embed_interpolation``)
INTERPOLATIONS = ("bicubic", "bilinear", "nearest")


def resample_pos_embed_grid(grid: torch.Tensor, new_size: IntPair, interpolation: str = "bicubic",
                            antialias: bool = True, align_corners: bool = False, square: bool = False) -> torch.Tensor:
    """Resample a (1, gh, gw, D) grid of embeddings to (1, H', W', D).

    ``bicubic`` with ``antialias=True`` is timm's default (DeiT, timm checkpoints);
    the official JAX code resizes bilinearly with the corners aligned (scipy's zoom); Hugging Face uses bicubic
    without antialias. ``align_corners``: the corner embeddings stay the corners' (that zoom; timm's loader for
    RADIO v3 base and huge). ``square``: the aspect ratio kept (timm's NaFlex ``pos_embed_ar_preserving``): the
    table is resampled to a square of the longer side and its top-left H' x W' taken, so a row of patches has the
    same positions whatever the image's height.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}")
    if tuple(grid.shape[1:3]) == tuple(new_size):
        return grid
    mode = interpolation
    antialias = antialias and mode != "nearest"
    dtype = grid.dtype
    x = grid.float().permute(0, 3, 1, 2)
    size = (max(new_size),) * 2 if square else tuple(new_size)
    x = F.interpolate(x, size=size, mode=mode, antialias=antialias,
                      align_corners=None if mode == "nearest" else align_corners)
    return x[:, :, :new_size[0], :new_size[1]].permute(0, 2, 3, 1).to(dtype)


def resample_line(table: torch.Tensor, size: int, square_of: Optional[int] = None) -> torch.Tensor:
    """A (1, n, D) table of one axis resampled linearly to ``size`` entries (timm's NaFlex factorised tables:
    linear, corners not aligned, whatever the 2D tables' mode); ``square_of``: resampled to that length and its
    first ``size`` entries taken (the aspect ratio kept, as :func:`resample_pos_embed_grid`'s ``square``)."""
    length = square_of or size
    if table.shape[1] != length:
        table = F.interpolate(table.permute(0, 2, 1).float(), size=length, mode="linear",
                              align_corners=False).permute(0, 2, 1).to(table.dtype)
    return table[:, :size]


def resample_pos_embed(pos_embed: torch.Tensor, new_size: IntPair,
                       old_size: Optional[IntPair] = None, num_prefix_tokens: int = 1,
                       interpolation: str = "bicubic", antialias: bool = True, align_corners: bool = False,
                       square: bool = False) -> torch.Tensor:
    """Resample a flat (1, prefix + gh*gw, D) table to a new grid, prefix slots kept apart.

    ``old_size`` defaults to a square grid; a table whose patch count is not a square
    needs it spelled out.
    """
    n_patch = pos_embed.shape[1] - num_prefix_tokens
    if old_size is None:
        side = int(round(math.sqrt(n_patch)))
        if side * side != n_patch:
            raise ValueError(
                f"cannot infer the grid of a position embedding with {n_patch} patch slots; "
                f"pass its grid size")
        old_size = (side, side)
    if old_size[0] * old_size[1] != n_patch:
        raise ValueError(f"position embedding has {n_patch} patch slots, "
                         f"not {old_size[0]}x{old_size[1]}")
    if tuple(old_size) == tuple(new_size):
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    grid = patches.reshape(1, old_size[0], old_size[1], -1)
    grid = resample_pos_embed_grid(grid, new_size, interpolation, antialias, align_corners, square)
    return torch.cat([prefix, grid.reshape(1, -1, grid.shape[-1])], dim=1)


#: the frequency spacings of :func:`sincos_2d_pos_embed`: big_vision's and MAE's
SINCOS_SPACINGS = ("big_vision", "mae")


@computed_on_cpu(shape=lambda grid_size, dim, *args, **kwargs: (1, grid_size[0] * grid_size[1], dim),
                 dtype=torch.float32)  # (counting a model on the meta device computes no table)
def sincos_2d_pos_embed(grid_size: IntPair, dim: int, temperature: float = 10000.0,
                        spacing: str = "big_vision") -> torch.Tensor:
    """Fixed 2D sine-cosine embedding, laid out as big_vision's ``posemb_sincos_2d``.

    Returns (1, gh*gw, dim): [sin(x w), cos(x w), sin(y w), cos(y w)] with D/4 frequencies
    w_i = T^(-i / s). The two references differ only in s: big_vision spans [1, 1/T] (s = D/4 - 1);
    MAE (and Hugging Face's ViTMAE, after its half swap) stops one step short (s = D/4).
    """
    if dim % 4:
        raise ValueError(f"sincos2d position embedding needs a width divisible by 4, got {dim}")
    if spacing not in SINCOS_SPACINGS:
        raise ValueError(f"spacing must be one of {SINCOS_SPACINGS}, got {spacing!r}")
    gh, gw = grid_size
    quarter = dim // 4
    omega = torch.arange(quarter, dtype=torch.float64) / (quarter if spacing == "mae" else max(quarter - 1, 1))
    omega = 1.0 / temperature ** omega
    # each axis's angles once (float64, as the references), spread over the grid in the float32 table: the table
    # alone in memory (a float64 copy per term held five times it: a large grid's build was killed by the kernel)
    x = torch.arange(gw, dtype=torch.float64)[:, None] * omega[None, :]
    y = torch.arange(gh, dtype=torch.float64)[:, None] * omega[None, :]
    pe = torch.empty(gh, gw, 4, quarter)
    for i, part in enumerate((x.sin()[None], x.cos()[None], y.sin()[:, None], y.cos()[:, None])):
        pe[:, :, i] = part.float()
    return pe.reshape(1, gh * gw, dim)
