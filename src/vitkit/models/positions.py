"""Position-embedding kinds: one table of small functions, one row per kind.

A kind says how its parameters are built on a model, what (1, gh*gw, D) table the patches
of a grid get, how the parameters are resampled in place for a new native grid, what it
asks of the width, how a state dict of the kind is fitted to another grid while loading,
and what one flat (1, prefix + gh*gw, D) table in timm's layout it is equal to (the form
every foreign layout stores). Models, the loader and the exporters call the functions of
this module; a new kind is one new row here.

Parameter names are timm's: ``pos_embed`` (the learned table, with ``pos_embed_prefix_tokens``
slots for prefix tokens in front of the patches when the family has them), and vitkit's own
``pos_embed_row`` / ``pos_embed_col`` for the paper's 2D ablation. ``sincos2d`` keeps its
fixed table in the non-persistent buffer ``pos_embed_fixed``. The resampling follows the
model's ``config.pos_embed_interpolation`` and ``config.pos_embed_antialias``.

``relative_mlp`` (timm's ``VisionTransformerRelPos``) computes the bias from the log-spaced offset by a
small MLP in every layer (``attn.rel_pos.mlp``) or one shared by all (``shared_rel_pos``).

``relative`` adds nothing to the tokens: every block's attention adds a learned bias per head
and 2D offset to its logits (the paper's Appendix D.4 ablation has relative positions; this is
the bias form of Swin and BEiT, timm's ``RelPosBias`` with its parameter names,
``blocks.N.attn.rel_pos.relative_position_bias_table``). Its parts live in the blocks, so the
kind ``attach``es them once the blocks exist, and :func:`attention_bias` gives a layer its bias.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .layers import (
    IntPair,
    RelativePositionBias,
    RelativePositionMlp,
    Rope,
    resample_pos_embed,
    resample_pos_embed_grid,
    resize_relative_table,
    sincos_2d_pos_embed,
)

#: Every parameter a kind may create (position tables are exempt from weight decay).
PARAMETER_NAMES = ("pos_embed", "pos_embed_row", "pos_embed_col")


def _resample_args(model: nn.Module):
    cfg = model.config
    return cfg.pos_embed_interpolation, cfg.pos_embed_antialias


# ----------------------------------------------------------------------------- learned (1D table)


def _learned_build(model: nn.Module, grid: IntPair, dim: int, slots: int) -> None:
    model.pos_embed = nn.Parameter(torch.zeros(1, slots + grid[0] * grid[1], dim))


def _learned_table(model: nn.Module, grid: IntPair) -> torch.Tensor:
    table = model.pos_embed[:, model.pos_embed_prefix_tokens:]
    return resample_pos_embed(table, grid, model.patch_embed.grid_size, 0, *_resample_args(model))


def _learned_resample(model: nn.Module, old: IntPair, new: IntPair) -> None:
    model.pos_embed = nn.Parameter(resample_pos_embed(model.pos_embed.data, new, old, model.pos_embed_prefix_tokens,
                                                      *_resample_args(model)))


# ----------------------------------------------------------------------------- learned_2d (row + column)


def _2d_build(model: nn.Module, grid: IntPair, dim: int, slots: int) -> None:
    # The paper's 2D ablation: a row and a column table of D/2 each, concatenated.
    model.pos_embed_row = nn.Parameter(torch.zeros(1, grid[0], dim // 2))
    model.pos_embed_col = nn.Parameter(torch.zeros(1, grid[1], dim // 2))


def _resample_axis(table: torch.Tensor, axis: int, size: int, interpolation: str, antialias: bool) -> torch.Tensor:
    """A (1, n, D') row (axis 0) or column (axis 1) table resampled to ``size`` entries."""
    if table.shape[1] == size:
        return table
    grid = table.unsqueeze(2 if axis == 0 else 1)
    out = resample_pos_embed_grid(grid, (size, 1) if axis == 0 else (1, size), interpolation, antialias)
    return out.squeeze(2 if axis == 0 else 1)


def _2d_tables(model: nn.Module, grid: IntPair):
    args = _resample_args(model)
    return (_resample_axis(model.pos_embed_row, 0, grid[0], *args),
            _resample_axis(model.pos_embed_col, 1, grid[1], *args))


def _2d_table(model: nn.Module, grid: IntPair) -> torch.Tensor:
    row, col = _2d_tables(model, grid)
    gh, gw = grid
    full = torch.cat([row[:, :, None, :].expand(-1, gh, gw, -1), col[:, None, :, :].expand(-1, gh, gw, -1)], dim=-1)
    return full.reshape(1, gh * gw, -1)


def _2d_resample(model: nn.Module, old: IntPair, new: IntPair) -> None:
    row, col = _2d_tables(model, new)
    model.pos_embed_row, model.pos_embed_col = nn.Parameter(row.detach()), nn.Parameter(col.detach())


def _2d_fit_state(sd: Dict[str, torch.Tensor], model: nn.Module, grid: IntPair, interpolation: str,
                  antialias: bool) -> List[str]:
    notes = []
    for axis, key in enumerate(("pos_embed_row", "pos_embed_col")):
        if key in sd and sd[key].dim() == 3 and sd[key].shape[1] != grid[axis]:
            notes.append(f"{key} {sd[key].shape[1]} -> {grid[axis]}")
            sd[key] = _resample_axis(sd[key], axis, grid[axis], interpolation, antialias)
    return notes


# ----------------------------------------------------------------------------- sincos2d (fixed)


def _sincos_build(model: nn.Module, grid: IntPair, dim: int, slots: int) -> None:
    model.register_buffer("pos_embed_fixed", sincos_2d_pos_embed(grid, dim), persistent=False)


def _sincos_table(model: nn.Module, grid: IntPair) -> torch.Tensor:
    if tuple(grid) != tuple(model.patch_embed.grid_size):
        return sincos_2d_pos_embed(grid, model.embed_dim).to(model.pos_embed_fixed)
    return model.pos_embed_fixed


def _sincos_resample(model: nn.Module, old: IntPair, new: IntPair) -> None:
    model.pos_embed_fixed = sincos_2d_pos_embed(new, model.embed_dim).to(model.pos_embed_fixed.device)


# ----------------------------------------------------------------------------- relative (a bias in attention)

#: the name a ViT block's relative-bias table has (timm's RelPosBias); BEiT's attention holds its own
#: (``attn.relative_position_bias_table``): both end with RELATIVE_LEAF
RELATIVE_TABLE = "attn.rel_pos.relative_position_bias_table"
RELATIVE_LEAF = "relative_position_bias_table"


def _bias_holder(blk: nn.Module):
    """The module of a block that holds its relative-bias table: ``attn.rel_pos``, or (BEiT) the attention."""
    attn = getattr(blk, "attn", None)
    rel = getattr(attn, "rel_pos", None)
    if rel is not None:
        return rel
    return attn if hasattr(attn, "relative_bias") else None


def _relative_attach(model: nn.Module) -> None:
    for blk in model.blocks:
        if hasattr(blk.attn, "init_relative"):  # BEiT: the layer holds the table
            blk.attn.init_relative(model.patch_embed.grid_size, blk.attn.num_heads, model.num_prefix_tokens)
        else:
            blk.attn.rel_pos = RelativePositionBias(model.patch_embed.grid_size, blk.attn.num_heads,
                                                    model.num_prefix_tokens)


def _relative_resample(model: nn.Module, old: IntPair, new: IntPair) -> None:
    for blk in model.blocks:
        _bias_holder(blk).set_relative_grid(new)


def _mlp_attach(model: nn.Module) -> None:
    cfg, grid = model.config, model.patch_embed.grid_size
    make = lambda heads: RelativePositionMlp(grid, heads, cfg.rel_pos_dim, model.num_prefix_tokens)  # noqa: E731
    if cfg.shared_rel_pos:  # one MLP for every layer (timm's vit_srelpos)
        model.shared_rel_pos = make(cfg.num_heads)
        return
    for blk in model.blocks:
        blk.attn.rel_pos = make(blk.attn.num_heads)


def _mlp_resample(model: nn.Module, old: IntPair, new: IntPair) -> None:
    holders = [_bias_holder(blk) for blk in model.blocks] + [getattr(model, "shared_rel_pos", None)]
    for holder in holders:
        if holder is not None:
            holder.set_relative_grid(new)


def _relative_source_grid(rows: int, grid: IntPair, prefix: int) -> IntPair:
    """The grid a stored table of ``rows`` rows was made for: the model's, else a square one."""
    offsets = rows - 3 * prefix
    if offsets == (2 * grid[0] - 1) * (2 * grid[1] - 1):
        return tuple(grid)
    side = (round(offsets ** 0.5) + 1) // 2
    if offsets > 0 and (2 * side - 1) ** 2 == offsets:
        return (side, side)
    need = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3 * prefix
    raise ValueError(f"a relative-bias table of {rows} rows fits no square grid with {prefix} prefix token(s) "
                     f"(the model's {grid[0]}x{grid[1]} grid needs {need})")


def _relative_fit_state(sd: Dict[str, torch.Tensor], model: nn.Module, grid: IntPair, interpolation: str,
                        antialias: bool) -> List[str]:
    prefix, resized, source = model.num_prefix_tokens, 0, None
    for key in [k for k in sd if k.endswith(RELATIVE_LEAF)]:
        if sd[key].dim() != 2:
            continue  # the loader's shape check names it
        source = _relative_source_grid(sd[key].shape[0], grid, prefix)
        if source != tuple(grid):
            sd[key] = resize_relative_table(sd[key], source, grid, prefix)
            resized += 1
    if not resized:
        return []
    return [f"{resized} relative-bias tables {source[0]}x{source[1]} -> {grid[0]}x{grid[1]} (offsets kept, the "
            f"outermost extended)"]


# ----------------------------------------------------------------------------- rotary (RoPE, in attention)

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


# ----------------------------------------------------------------------------- the table


def _nothing(*args) -> None:
    return None


def _no_notes(*args) -> List[str]:
    return []


@dataclass(frozen=True)
class PosEmbedKind:
    """The functions of one position-embedding kind (see the module notes)."""

    #: (model, grid, width, prefix slots) -> None: create the parameters on the model
    build: Callable[[nn.Module, IntPair, int, int], None]
    #: (model, grid) -> (1, gh*gw, D) positions of the patches, or None
    table: Callable[[nn.Module, IntPair], Optional[torch.Tensor]]
    #: (model, old grid, new grid) -> None: resample the parameters in place
    resample: Callable[[nn.Module, IntPair, IntPair], None]
    #: the width the kind needs: D is divisible by this
    width_multiple: int = 1
    #: (state dict, model, model grid, interpolation, antialias) -> notes: fit a loaded state
    #: dict's parameters of this kind to the model's grid in place (the learned table, which every
    #: foreign layout stores, is fitted by the loader itself: it also infers prefix slots)
    fit_state: Callable[[Dict[str, torch.Tensor], nn.Module, IntPair, str, bool], List[str]] = _no_notes
    #: (model) -> None: create the parts that live in the blocks, once they exist
    attach: Callable[[nn.Module], None] = _nothing


KINDS: Dict[str, PosEmbedKind] = {
    "learned": PosEmbedKind(_learned_build, _learned_table, _learned_resample),
    "learned_2d": PosEmbedKind(_2d_build, _2d_table, _2d_resample, width_multiple=2, fit_state=_2d_fit_state),
    "sincos2d": PosEmbedKind(_sincos_build, _sincos_table, _sincos_resample, width_multiple=4),
    "none": PosEmbedKind(_nothing, _nothing, _nothing),
    "relative": PosEmbedKind(_nothing, _nothing, _relative_resample, fit_state=_relative_fit_state,
                             attach=_relative_attach),
    # timm's VisionTransformerRelPos: a bias from an MLP of the log-spaced offset (per layer, or shared)
    "relative_mlp": PosEmbedKind(_nothing, _nothing, _mlp_resample, attach=_mlp_attach),
}


def check(kind: str, dim: int, allowed: Sequence[str] = tuple(KINDS)) -> List[str]:
    """Problems with position-embedding ``kind`` for width ``dim`` (a family may allow fewer kinds)."""
    if kind not in allowed:
        return [f"pos_embed must be one of {tuple(allowed)}, got {kind!r}"]
    multiple = KINDS[kind].width_multiple
    if isinstance(dim, int) and dim % multiple:
        return [f"pos_embed={kind!r} needs embed_dim divisible by {multiple}, got {dim}"]
    return []


def build(model: nn.Module, kind: str, grid: IntPair, dim: int, slots: int = 0) -> None:
    """Create ``kind``'s parameters on ``model`` for its native ``grid``; the learned table gets
    ``slots`` prefix slots in front of the patches (the ViT's class / distillation tokens)."""
    for name in PARAMETER_NAMES:
        setattr(model, name, None)
    model.pos_embed_kind = kind
    model.pos_embed_prefix_tokens = slots if kind == "learned" else 0
    KINDS[kind].build(model, tuple(grid), dim, model.pos_embed_prefix_tokens)


def attach(model: nn.Module) -> None:
    """Create the kind's parts inside the blocks (relative biases); call once the blocks exist."""
    KINDS[model.pos_embed_kind].attach(model)


def parameters(model: nn.Module) -> List[nn.Parameter]:
    """The model's position parameters (for initialisation), the blocks' relative biases included."""
    found = [p for p in (getattr(model, n, None) for n in PARAMETER_NAMES) if p is not None]
    return found + [p for n, p in model.named_parameters() if n.endswith(RELATIVE_LEAF)]


def attention_bias(model: nn.Module, blk: nn.Module, grid: IntPair) -> Optional[torch.Tensor]:
    """The (1, heads, N, N) bias block ``blk`` adds to its attention logits on ``grid`` (None: none)."""
    rel = _bias_holder(blk)
    if rel is None:
        rel = getattr(model, "shared_rel_pos", None)  # one bias for every layer
    return None if rel is None else rel.relative_bias(grid)


def patch_table(model: nn.Module, grid: IntPair) -> Optional[torch.Tensor]:
    """(1, gh*gw, D) positions of the patches of ``grid`` (resampled when it is not the native one)."""
    return KINDS[model.pos_embed_kind].table(model, tuple(grid))


def resample_(model: nn.Module, old: IntPair, new: IntPair) -> None:
    """Resample the model's position parameters in place from grid ``old`` to ``new`` (a rotary
    embedding recomputes its angles for the new grid)."""
    KINDS[model.pos_embed_kind].resample(model, tuple(old), tuple(new))
    if getattr(model, "rope", None) is not None:
        model.rope.set_grid(new)


def add(model: nn.Module, x: torch.Tensor, grid: IntPair, prefix: List[torch.Tensor]) -> torch.Tensor:
    """Patch tokens (B, gh*gw, D) -> ``prefix`` + patches with their positions (B, P + gh*gw, D).

    Prefix tokens take their slots of the learned table when it has them, else no position.
    """
    if model.pos_embed_kind == "learned" and tuple(grid) == tuple(model.patch_embed.grid_size) \
            and model.pos_embed_prefix_tokens == sum(t.shape[1] for t in prefix):
        # The common case: the stored table (with its prefix slots) as it is, in one addition.
        if prefix:
            x = torch.cat(prefix + [x], dim=1)
        return x + model.pos_embed
    return join_prefix(model, add_to_patches(model, x, grid), prefix)


def add_to_patches(model: nn.Module, x: torch.Tensor, grid: IntPair) -> torch.Tensor:
    """Patch tokens (B, gh*gw, D) + their positions (MAE adds them before it drops the masked patches)."""
    pos = patch_table(model, grid)
    return x if pos is None else x + pos


def join_prefix(model: nn.Module, x: torch.Tensor, prefix: List[torch.Tensor]) -> torch.Tensor:
    """``prefix`` tokens, with their slots of the learned table where it has them, in front of
    the tokens ``x`` (B, L, D) whose positions are already added."""
    if not prefix:
        return x
    tokens = torch.cat(prefix, dim=1) if len(prefix) > 1 else prefix[0]
    if model.pos_embed_prefix_tokens:
        tokens = tokens + model.pos_embed[:, :tokens.shape[1]]
    return torch.cat([tokens, x], dim=1)


def full_table(model: nn.Module) -> Optional[torch.Tensor]:
    """The model's positions as one (1, slots + gh*gw, D) table, timm style (None without any).

    A learned table is returned as stored; other kinds are written out for the native grid
    with a zero slot per prefix token, which is exactly "no position" for it.
    """
    if model.pos_embed_kind == "learned":
        return model.pos_embed.detach()
    patches = patch_table(model, model.patch_embed.grid_size)
    if patches is None:
        return None
    prefix = patches.new_zeros(1, model.num_prefix_tokens, patches.shape[-1])
    return torch.cat([prefix, patches.detach()], dim=1)


def fit_state_dict(sd: Dict[str, torch.Tensor], model: nn.Module, interpolation: str, antialias: bool) -> List[str]:
    """Fit the state dict's parameters of the model's kind (other than the learned table) to the
    model's grid; returns what was resampled."""
    return KINDS[model.pos_embed_kind].fit_state(sd, model, tuple(model.patch_embed.grid_size), interpolation,
                                                 antialias)


__all__ = ["PARAMETER_NAMES", "RELATIVE_TABLE", "RELATIVE_LEAF", "ROPES", "RotaryEmbedding", "rotary",
           "PosEmbedKind", "KINDS", "check", "build", "attach", "parameters", "attention_bias", "patch_table",
           "resample_", "add", "add_to_patches", "join_prefix", "full_table", "fit_state_dict"]
