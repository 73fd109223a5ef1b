"""Rotary positions (RoPE): the rotation applied to queries and keys (:class:`Rope`, :func:`apply_rope`), and
the model's :class:`RotaryEmbedding` that makes it for a grid and a layer."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

from ..sizes import IntPair


class Rope(NamedTuple):
    """A rotary position embedding of the patch tokens: ``sin`` and ``cos`` broadcast against the heads'
    queries and keys (..., patches, head_dim), and the rotation layout: ``half`` rotates the two halves
    of a head ((a, b) -> (-b, a): DINOv3, Hugging Face), otherwise neighbouring pairs (EVA-02, timm's
    default). Built by :mod:`vitkit.models.positions`; the prefix tokens before the patches are not rotated.
    """

    sin: torch.Tensor
    cos: torch.Tensor
    half: bool = False


def rotate_pairs(x: torch.Tensor, half: bool) -> torch.Tensor:
    """The 90-degree rotation RoPE pairs with the sine: (x0, x1) -> (-x1, x0) within each pair."""
    if half:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate the patch tokens of queries or keys ``x`` (B, heads, N, head_dim) by their positions; the
    first ``N - patches`` (prefix) tokens are left as they are. Computed in the rope's precision (float32)
    and cast back, as timm does."""
    skip = x.shape[-2] - rope.sin.shape[-2]
    if skip < 0:
        raise ValueError(f"a rotary embedding of {rope.sin.shape[-2]} positions for {x.shape[-2]} tokens")
    patches = x[..., skip:, :] if skip else x
    rotated = (patches * rope.cos + rotate_pairs(patches, rope.half) * rope.sin).to(x.dtype)
    return torch.cat([x[..., :skip, :], rotated], dim=-2) if skip else rotated


def kept_rotations(rope: Rope, keep: torch.Tensor) -> Rope:
    """The rotations of the patches ``keep`` (B, K) picks, per image, as (B, heads or 1, K, head_dim): MAE's
    encoder sees each image's visible patches alone (timm's ``apply_keep_indices_nlc`` for its patch dropout)."""
    def pick(table: torch.Tensor) -> torch.Tensor:  # (..., N, d) -> (B, ..., K, d)
        picked = table.movedim(-2, 0)[keep].movedim(1, -2)
        return picked if picked.ndim == 4 else picked.unsqueeze(1)

    return Rope(pick(rope.sin), pick(rope.cos), rope.half)


#: Rotary kinds, each rotating the patches' queries and keys in every attention layer by angles that are
#: linear in their 2D position (Su et al. 2021, in 2D as Heo et al. 2024), with no parameters but
#: 'mixed''s:
#:   'axial'   half of each head's frequencies for the row, half for the column: 1 / T^(i / (d/4))
#:             times the patch index (+ ``rope_grid_offset``; scaled to ``rope_ref_grid`` when given, so a
#:             larger image spans the trained range): EVA-02, timm's rope ViTs, Perception Encoder
#:   'mixed'   RoPE-Mixed (Heo et al. 2024): learned frequencies per layer and head that mix both axes
#:             (``rope.freqs`` (2, depth, heads, d/2)), on the patch index
#:   'dinov3'  DINOv3's: coordinates normalised to [-1, 1] (patch centres), periods T^(2 i / (d/2)),
#:             angle 2 pi x / period
#: ``rope_grid_indexing`` 'ij' lists the row's frequencies first, 'xy' the column's; ``rope_half``
#: rotates the halves of a head rather than neighbouring pairs. A new grid recomputes the angles (no
#: parameter is resampled): 'axial' with a reference grid compresses it into the trained range,
#: 'dinov3' always does, 'axial' without one and 'mixed' extend the indices.
ROPES = ("none", "axial", "mixed", "dinov3")


def _axes(grid: IntPair, indexing: str) -> IntPair:
    return tuple(grid) if indexing == "ij" else (grid[1], grid[0])


def _coordinates(axes: Sequence[torch.Tensor], indexing: str) -> torch.Tensor:
    """Per-axis coordinates (in ``_axes`` order) -> (rows * cols, 2) in token order (row-major)."""
    mesh = torch.meshgrid(*axes, indexing=indexing)
    return torch.stack(mesh, dim=-1).reshape(-1, 2)


def _layout(angles: torch.Tensor, half: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(..., N, d/2) angles -> sin, cos (..., N, d) in the rotation's layout."""
    sin, cos = angles.sin(), angles.cos()
    if half:
        return torch.cat([sin, sin], dim=-1), torch.cat([cos, cos], dim=-1)
    return sin.repeat_interleave(2, dim=-1), cos.repeat_interleave(2, dim=-1)


class RotaryEmbedding(nn.Module):
    """A model's rotary embedding (``model.rope``): ``forward(layer, grid)`` -> the :class:`Rope` of the
    patches of ``grid`` in that layer. The native grid's sines and cosines are kept (a non-persistent
    buffer, recomputed by :meth:`set_grid`); another grid's are computed on the fly."""

    def __init__(self, kind: str, head_dim: int, num_heads: int, depth: int, grid: IntPair,
                 temperature: float, offset: float = 0.0, indexing: str = "ij",
                 ref_grid: Optional[IntPair] = None, half: bool = False, rescale: Optional[float] = None):
        super().__init__()
        if kind not in ROPES[1:]:
            raise ValueError(f"rope must be one of {ROPES}, got {kind!r}")
        if head_dim % 4:
            raise ValueError(f"rotary positions need a head width divisible by 4, got {head_dim}")
        self.kind, self.head_dim, self.temperature = kind, head_dim, float(temperature)
        self.offset, self.indexing, self.half = float(offset), indexing, bool(half)
        self.ref_grid = tuple(ref_grid) if ref_grid else None
        #: training augmentation (DINOv3): coordinates scaled by exp(U(-log r, log r)) in every training forward
        self.rescale = float(rescale) if rescale else None
        if kind == "mixed":
            self.freqs = nn.Parameter(self.initial_freqs(depth, num_heads))
        self.grid = tuple(grid)
        self._draw: Optional[torch.Tensor] = None
        if kind == "mixed":  # learned: computed in every forward, so gradients reach the frequencies
            self.cached = None
        else:
            self.register_buffer("cached", torch.stack(self._sin_cos(self.grid, None)), persistent=False)

    @torch.no_grad()
    def initial_freqs(self, depth: int, num_heads: int) -> torch.Tensor:
        """RoPE-Mixed's start: each layer and head gets the axial magnitudes 1 / T^(4i / d) along a random
        direction and its perpendicular: (2 axes, depth, heads, d/2)."""
        d = self.head_dim
        mag = 1.0 / self.temperature ** (torch.arange(0, d, 4, dtype=torch.float32) / d)
        angle = torch.rand(depth, num_heads, 1) * 2 * math.pi
        fx = torch.cat([mag * torch.cos(angle), mag * torch.cos(angle + math.pi / 2)], dim=-1)
        fy = torch.cat([mag * torch.sin(angle), mag * torch.sin(angle + math.pi / 2)], dim=-1)
        return torch.stack([fx, fy])

    def _angles(self, grid: IntPair, layer: Optional[int], scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(..., gh*gw, d/2) rotation angles of the patches of ``grid`` (float32); ``scale`` multiplies the
        coordinates (the training augmentation)."""
        axes = _axes(grid, self.indexing)
        quarter = self.head_dim // 4
        if self.kind == "axial":
            t = [torch.arange(n, dtype=torch.float32) + self.offset for n in axes]
            if self.ref_grid is not None:
                t = [x / n * r for x, n, r in zip(t, axes, _axes(self.ref_grid, self.indexing))]
            bands = 1.0 / self.temperature ** (torch.arange(quarter, dtype=torch.float32) / quarter)
            coords = _coordinates(t, self.indexing)
            return (coords[:, :, None] * bands).flatten(1)
        if self.kind == "dinov3":
            t = [(torch.arange(0.5, n, dtype=torch.float32) + self.offset) / float(n) for n in axes]
            coords = 2.0 * _coordinates(t, self.indexing) - 1.0
            if scale is not None:
                coords = coords * scale
            periods = self.temperature ** (2.0 * torch.arange(quarter, dtype=torch.float32) / (self.head_dim // 2))
            return (2 * math.pi * coords[:, :, None] / periods).flatten(1)
        coords = _coordinates([torch.arange(n, dtype=torch.float32) for n in axes], self.indexing)
        coords = coords.to(self.freqs.device)
        freqs = self.freqs[:, layer].float()  # (2, heads, d/2)
        return coords[:, 0, None] * freqs[0][:, None, :] + coords[:, 1, None] * freqs[1][:, None, :]

    def _sin_cos(self, grid: IntPair, layer: Optional[int], scale: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
        return _layout(self._angles(grid, layer, scale), self.half)

    def forward(self, layer: int, grid: IntPair) -> Rope:
        if self.training and self.rescale is not None and self.kind == "dinov3":
            # one draw per forward, shared by the layers (layer 0 draws; the others reuse it)
            if layer == 0 or self._draw is None:
                bound = math.log(self.rescale)
                self._draw = torch.empty(1).uniform_(-bound, bound).exp()
            sin, cos = self._sin_cos(tuple(grid), layer, self._draw)
            return Rope(sin.to(self.cached.device), cos.to(self.cached.device), self.half)
        if self.cached is not None and tuple(grid) == self.grid:
            return Rope(self.cached[0], self.cached[1], self.half)
        sin, cos = self._sin_cos(tuple(grid), layer)
        device = self.freqs.device if self.kind == "mixed" else self.cached.device
        return Rope(sin.to(device), cos.to(device), self.half)

    @torch.no_grad()
    def set_grid(self, grid: IntPair) -> None:
        """Make ``grid`` the native one (the kept sines and cosines recomputed)."""
        self.grid = tuple(grid)
        if self.cached is not None:
            self.cached = torch.stack(self._sin_cos(self.grid, None)).to(self.cached.device)

    def extra_repr(self) -> str:
        ref = f", ref_grid={self.ref_grid}" if self.ref_grid else ""
        return (f"kind={self.kind}, head_dim={self.head_dim}, temperature={self.temperature:g}, grid={self.grid}, "
                f"indexing={self.indexing}, half={self.half}{ref}")


def rotary(model: nn.Module, layer: int, grid: IntPair) -> Optional[Rope]:
    """The rotary embedding layer ``layer`` applies to the patches of ``grid`` (None: the model has none)."""
    rope = getattr(model, "rope", None)
    return None if rope is None else rope(layer, grid)
