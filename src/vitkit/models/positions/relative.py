"""Relative position biases: a learned bias per head and 2D offset (Swin, BEiT; timm's ``RelPosBias``),
or one computed by a small MLP from the log-spaced offset (timm's ``RelPosMlp``)."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..sizes import IntPair
from .cpu_table import computed_on_cpu


def _check_prefix(prefix_tokens: int) -> None:
    if prefix_tokens not in (0, 1):
        raise ValueError(f"relative position bias supports 0 or 1 prefix tokens (a class token), not {prefix_tokens}")


def _index_shape(grid: IntPair, prefix_tokens: int = 0) -> Tuple[int, int]:
    _check_prefix(prefix_tokens)
    n = grid[0] * grid[1] + prefix_tokens
    return n, n


@computed_on_cpu(shape=_index_shape)
def relative_position_index(grid: IntPair, prefix_tokens: int = 0) -> torch.Tensor:
    """(N, N) long: for query token i and key token j, the row of a relative-bias table that holds
    their 2D offset (Swin / BEiT; equal to timm's ``gen_relative_position_index``).

    Patch p at (r, c) and q at (r', c') share the row (r - r' + gh - 1) * (2 gw - 1) + c - c' + gw - 1
    of the (2 gh - 1)(2 gw - 1) offsets. With one prefix token (a class token, ``prefix_tokens=1``)
    the table has three more rows, BEiT's: class -> patch, patch -> class, class -> class.
    """
    _check_prefix(prefix_tokens)
    gh, gw = grid
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()])  # (2, gh*gw)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, N, N): query minus key
    index = (offsets[0] + gh - 1) * (2 * gw - 1) + offsets[1] + gw - 1
    if prefix_tokens:
        offsets_count = (2 * gh - 1) * (2 * gw - 1)
        index = F.pad(index, (1, 0, 1, 0))
        index[0, :] = offsets_count  # class token as the query
        index[:, 0] = offsets_count + 1  # class token as the key
        index[0, 0] = offsets_count + 2
    return index.contiguous()


#: how a relative-bias table meets another grid (``config.rel_pos_resize``): see :func:`resize_relative_table`
RELATIVE_RESIZES = ("keep", "bilinear", "geometric")


def _geometric_coords(src: int, dst: int) -> torch.Tensor:
    """BEiT's fine-tuning code's (and timm's) positions of a table's ``src`` offsets on a table of ``dst``:
    spaced by a geometric progression whose ratio (found by bisection in [1.01, 1.5]) puts the outermost
    offset past the new table's edge, so the central offsets keep about their place."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        q = (left + right) / 2.0
        if (1.0 - q ** (src // 2)) / (1.0 - q) > dst // 2:
            right = q
        else:
            left = q
    steps, at = [], 1.0
    for i in range(src // 2):
        steps.append(at)
        at += q ** (i + 1)
    return torch.tensor([-s for s in reversed(steps)] + [0.0] + steps)


def _linear_taps(points: torch.Tensor, x: torch.Tensor):
    """The two neighbours in ``points`` of each of ``x`` and their distances (linear interpolation on an
    uneven grid; past the ends, the end value)."""
    right = torch.bucketize(x, points).clamp(max=points.shape[0] - 1)
    left = (right - 1).clamp(0, points.shape[0] - 1)
    to_left, to_right = (x - points[left]).clamp(min=0), (points[right] - x).clamp(min=0)
    both = (to_left == 0) & (to_right == 0)
    return left, right, torch.where(both, 1.0, to_left), torch.where(both, 1.0, to_right)


def _geometric_resize(grid: torch.Tensor, new: IntPair) -> torch.Tensor:
    """A (2 oh - 1, 2 ow - 1, heads) offsets table -> (2 nh - 1, 2 nw - 1, heads), timm's
    ``resize_rel_pos_bias_table`` without scipy (linear between geometrically spaced offsets)."""
    taps = []
    for axis, n in enumerate(new):
        src, dst = grid.shape[axis], 2 * n - 1
        taps.append(_linear_taps(_geometric_coords(src, dst), torch.arange(-(dst // 2), dst // 2 + 1).float()))
    (yl, yr, ayl, ayr), (xl, xr, axl, axr) = taps
    values = grid.float()
    out = (values[yl][:, xl] * (ayr[:, None] * axr[None, :])[..., None]
           + values[yl][:, xr] * (ayr[:, None] * axl[None, :])[..., None]
           + values[yr][:, xl] * (ayl[:, None] * axr[None, :])[..., None]
           + values[yr][:, xr] * (ayl[:, None] * axl[None, :])[..., None])
    return (out / ((ayl + ayr)[:, None] * (axl + axr)[None, :])[..., None]).to(grid.dtype)


def resize_relative_table(table: torch.Tensor, old: IntPair, new: IntPair, prefix_tokens: int = 0,
                          mode: str = "keep") -> torch.Tensor:
    """A ((2 gh - 1)(2 gw - 1) + 3 prefix, heads) relative-bias table for grid ``old`` -> grid ``new``.

    ``keep`` (vitkit's): an offset keeps its bias: it is the same displacement in pixels at any grid of
    the same patch size. A smaller grid keeps the central offsets (exact: resizing back restores the
    table); a larger one repeats the outermost learned offset outwards, as distances past the trained
    range share one bias (T5's far bucket). ``bilinear``: the offsets' (2 gh - 1) x (2 gw - 1) table
    stretched to the new one (bilinear, corners not aligned), as transformers' BEiT resamples it in its
    forward pass (``interpolate_pos_encoding``), so that offsets change meaning; the prefix rows kept.
    ``geometric``: BEiT's fine-tuning code's, timm's for its BEiTs (``set_input_size``, loading at another
    size): offsets placed by a geometric progression and interpolated linearly, the prefix rows kept.
    """
    (oh, ow), (nh, nw) = old, new
    extra = table[table.shape[0] - 3 * prefix_tokens:]
    offsets = table[:table.shape[0] - 3 * prefix_tokens]
    if offsets.shape[0] != (2 * oh - 1) * (2 * ow - 1):
        raise ValueError(f"a relative-bias table of {table.shape[0]} rows is not that of a {oh}x{ow} grid "
                         f"with {prefix_tokens} prefix token(s)")
    grid = offsets.reshape(2 * oh - 1, 2 * ow - 1, -1)
    if mode == "bilinear":
        resized = F.interpolate(grid.permute(2, 0, 1).unsqueeze(0).float(), size=(2 * nh - 1, 2 * nw - 1),
                                mode="bilinear", align_corners=False)[0].permute(1, 2, 0).to(table.dtype)
    elif mode == "geometric":
        if (oh, ow) == tuple(new):
            return table
        resized = _geometric_resize(grid, new)
    elif mode == "keep":
        dy = (torch.arange(-(nh - 1), nh) + oh - 1).clamp(0, 2 * oh - 2)
        dx = (torch.arange(-(nw - 1), nw) + ow - 1).clamp(0, 2 * ow - 2)
        resized = grid[dy][:, dx]
    else:
        raise ValueError(f"rel_pos_resize must be one of {RELATIVE_RESIZES}, got {mode!r}")
    resized = resized.reshape((2 * nh - 1) * (2 * nw - 1), -1)
    return torch.cat([resized, extra]).contiguous()


class RelativeBiasTable:
    """A learned relative position bias (Swin, BEiT; timm's ``RelPosBias``): one scalar per head for each
    2D offset between a query and a key patch, added to the attention logits before the softmax.
    Parameter ``relative_position_bias_table`` ((2 gh - 1)(2 gw - 1) + 3 prefix, heads), timm's name and
    layout; the index is a non-persistent buffer. A mixin of the module that holds the table (its own
    :class:`RelativePositionBias`, or BEiT's attention layer, which holds it itself).

    ``relative_bias(grid)`` -> the (1, heads, N, N) bias of a grid (another grid than the native one is
    resized on the fly by :func:`resize_relative_table`).
    """

    def init_relative(self, grid: IntPair, num_heads: int, prefix_tokens: int = 0, resize: str = "keep") -> None:
        self.grid, self.prefix_tokens, self.resize = tuple(grid), int(prefix_tokens), resize
        rows = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3 * self.prefix_tokens
        self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(self.grid, self.prefix_tokens),
                             persistent=False)

    def relative_bias(self, grid: IntPair) -> torch.Tensor:
        table, index = self.relative_position_bias_table, self.relative_position_index
        if tuple(grid) != self.grid:
            table = resize_relative_table(table, self.grid, grid, self.prefix_tokens, self.resize)
            index = relative_position_index(grid, self.prefix_tokens).to(index.device)
        n = index.shape[0]
        return table[index.view(-1)].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)

    @torch.no_grad()
    def set_relative_grid(self, grid: IntPair) -> None:
        """Make ``grid`` the native one: the table resized in place, the index rebuilt."""
        grid = tuple(grid)
        if grid == self.grid:
            return
        table = resize_relative_table(self.relative_position_bias_table.data, self.grid, grid, self.prefix_tokens,
                                      self.resize)
        self.relative_position_bias_table = nn.Parameter(table, requires_grad=self.relative_position_bias_table
                                                         .requires_grad)
        self.relative_position_index = relative_position_index(grid, self.prefix_tokens).to(table.device)
        self.grid = grid


class RelativePositionBias(RelativeBiasTable, nn.Module):
    """A block's relative position bias as a module of its own (``attn.rel_pos``, timm's ``RelPosBias``
    names): see :class:`RelativeBiasTable`. ``forward(grid)`` -> the (1, heads, N, N) bias."""

    def __init__(self, grid: IntPair, num_heads: int, prefix_tokens: int = 0, resize: str = "keep"):
        super().__init__()
        self.init_relative(grid, num_heads, prefix_tokens, resize)

    def forward(self, grid: IntPair) -> torch.Tensor:
        return self.relative_bias(grid)

    def set_grid(self, grid: IntPair) -> None:
        self.set_relative_grid(grid)

    def extra_repr(self) -> str:
        return f"grid={self.grid}, prefix_tokens={self.prefix_tokens}"


class _ReluMlp(nn.Module):
    """Linear -> ReLU -> Linear, with timm's names (``fc1``, ``fc2``)."""

    def __init__(self, dim: int, hidden: int, out: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@computed_on_cpu
def relative_log_coords(grid: IntPair) -> torch.Tensor:
    """((2 gh - 1), (2 gw - 1), 2) offsets (dy, dx) between patches as sign(d) log(1 + |d|) (timm's 'cr' log
    coordinates, after Swin v2's): continuous in the offset, so a table for any grid is the same function."""
    gh, gw = grid
    dy = torch.arange(-(gh - 1), gh, dtype=torch.float32)
    dx = torch.arange(-(gw - 1), gw, dtype=torch.float32)
    coords = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1)
    return torch.sign(coords) * torch.log(1.0 + coords.abs())


class RelativePositionMlp(nn.Module):
    """A relative position bias computed by a small MLP from the log-spaced 2D offset of each query and key
    patch (timm's ``RelPosMlp``, mode 'cr': ``mlp.fc1`` 2 -> hidden, ReLU, ``mlp.fc2`` hidden -> heads); the
    prefix tokens get none (zero rows and columns). No table depends on the grid, so any grid is exact.
    ``relative_bias(grid)`` -> (1, heads, prefix + N, prefix + N)."""

    def __init__(self, grid: IntPair, num_heads: int, hidden: int = 128, prefix_tokens: int = 0):
        super().__init__()
        self.num_heads, self.prefix_tokens = num_heads, int(prefix_tokens)
        self.mlp = _ReluMlp(2, hidden, num_heads)
        self.grid = tuple(grid)
        self._buffers_for(self.grid)

    def _buffers_for(self, grid: IntPair) -> None:
        self.register_buffer("rel_coords_log", relative_log_coords(grid), persistent=False)
        self.register_buffer("relative_position_index", relative_position_index(grid, 0).view(-1), persistent=False)

    def relative_bias(self, grid: IntPair) -> torch.Tensor:
        coords, index = self.rel_coords_log, self.relative_position_index
        if tuple(grid) != self.grid:
            coords = relative_log_coords(grid).to(coords.device)
            index = relative_position_index(grid, 0).view(-1).to(index.device)
        n = grid[0] * grid[1]
        bias = self.mlp(coords).view(-1, self.num_heads)[index].view(n, n, self.num_heads).permute(2, 0, 1)
        if self.prefix_tokens:
            bias = F.pad(bias, [self.prefix_tokens, 0, self.prefix_tokens, 0])
        return bias.unsqueeze(0)

    def set_relative_grid(self, grid: IntPair) -> None:
        self.grid = tuple(grid)
        device = self.rel_coords_log.device
        self._buffers_for(self.grid)
        self.rel_coords_log, self.relative_position_index = (self.rel_coords_log.to(device),
                                                             self.relative_position_index.to(device))

    def extra_repr(self) -> str:
        return f"grid={self.grid}, prefix_tokens={self.prefix_tokens}"

