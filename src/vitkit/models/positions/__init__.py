"""Position-embedding kinds: one table of small functions, one row per kind.

A kind says how its parameters are built on a model, what (1, gh*gw, D) table the patches
of a grid get, how the parameters are resampled in place for a new native grid, what it
asks of the width, how a state dict of the kind is fitted to another grid while loading,
and what one flat (1, prefix + gh*gw, D) table in timm's layout it is equal to (the form
every foreign layout stores). Models, the loader and the exporters call the functions of
this module; a new kind is one new row here.

Parameter names are timm's: ``pos_embed`` (the learned table, with ``pos_embed_prefix_tokens``
slots for prefix tokens in front of the patches when the family has them), and vitkit's own
``pos_embed_row`` / ``pos_embed_col`` for the paper's 2D ablation, ``pos_embed_y`` / ``pos_embed_x`` for timm's
NaFlex ``factorized`` tables (a full-width row and column table, added). ``sincos2d`` keeps its
fixed table in the non-persistent buffer ``pos_embed_fixed``. The resampling follows the
model's ``config.pos_embed_interpolation`` and ``config.pos_embed_antialias``.

``relative_mlp`` (timm's ``VisionTransformerRelPos``) computes the bias from the log-spaced offset by a
small MLP in every layer (``attn.rel_pos.mlp``) or one shared by all (``shared_rel_pos``).

``relative`` adds nothing to the tokens: every block's attention adds a learned bias per head
and 2D offset to its logits (the paper's Appendix D.4 ablation has relative positions; this is
the bias form of Swin and BEiT, timm's ``RelPosBias`` with its parameter names,
``blocks.N.attn.rel_pos.relative_position_bias_table``). Its parts live in the blocks, so the
kind ``attach``es them once the blocks exist, and :func:`attention_bias` gives a layer its bias.

The math of the kinds lives in submodules, all of it importable from here: :mod:`.absolute` (the learned
table's resampling, the sine-cosine table), :mod:`.relative` (relative-bias tables and the bias MLP) and
:mod:`.rope` (the rotary embedding and its rotation). This module holds the table of kinds and what models,
the loader and the exporters call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

from ..sizes import IntPair
from .absolute import (
    INTERPOLATIONS,
    SINCOS_SPACINGS,
    resample_line,
    resample_pos_embed,
    resample_pos_embed_grid,
    sincos_2d_pos_embed,
)
from .relative import (
    RELATIVE_RESIZES,
    RelativeBiasTable,
    RelativePositionBias,
    RelativePositionMlp,
    relative_log_coords,
    relative_position_index,
    resize_relative_table,
)
from .rope import ROPES, Rope, RotaryEmbedding, apply_rope, kept_rotations, rotary, rotate_pairs

#: Every parameter a kind may create (position tables are exempt from weight decay).
PARAMETER_NAMES = ("pos_embed", "pos_embed_row", "pos_embed_col", "pos_embed_y", "pos_embed_x")


def _resample_args(model: nn.Module):
    """(interpolation, antialias, corners aligned, aspect ratio kept): Qwen3's towers and RADIO align the corners,
    timm's NaFlex models keep the aspect ratio (the families that do have the fields)."""
    cfg = model.config
    return (cfg.pos_embed_interpolation, cfg.pos_embed_antialias, getattr(cfg, "pos_embed_align_corners", False),
            getattr(cfg, "pos_embed_ar_preserving", False))


# ----------------------------------------------------------------------------- learned (1D table)


def _learned_build(model: nn.Module, grid: IntPair, dim: int, slots: int) -> None:
    model.pos_embed = nn.Parameter(torch.zeros(1, slots + grid[0] * grid[1], dim))


def _learned_table(model: nn.Module, grid: IntPair) -> torch.Tensor:
    table = model.pos_embed[:, model.pos_embed_prefix_tokens:]
    return resample_pos_embed(table, grid, model.pos_embed_grid, 0, *_resample_args(model))


def _learned_resample(model: nn.Module, old: IntPair, new: IntPair) -> None:
    # from the grid the table is held at (``config.pos_embed_size``'s where it is not the image's)
    model.pos_embed = nn.Parameter(resample_pos_embed(model.pos_embed.data, new, model.pos_embed_grid,
                                                      model.pos_embed_prefix_tokens, *_resample_args(model)))
    model.pos_embed_grid = tuple(new)


# ----------------------------------------------------------------------------- learned_2d (row + column)


def _2d_build(model: nn.Module, grid: IntPair, dim: int, slots: int) -> None:
    # The paper's 2D ablation: a row and a column table of D/2 each, concatenated.
    model.pos_embed_row = nn.Parameter(torch.zeros(1, grid[0], dim // 2))
    model.pos_embed_col = nn.Parameter(torch.zeros(1, grid[1], dim // 2))


def _resample_axis(table: torch.Tensor, axis: int, size: int, interpolation: str, antialias: bool,
                   align_corners: bool = False) -> torch.Tensor:
    """A (1, n, D') row (axis 0) or column (axis 1) table resampled to ``size`` entries."""
    if table.shape[1] == size:
        return table
    grid = table.unsqueeze(2 if axis == 0 else 1)
    out = resample_pos_embed_grid(grid, (size, 1) if axis == 0 else (1, size), interpolation, antialias,
                                  align_corners)
    return out.squeeze(2 if axis == 0 else 1)


def _2d_tables(model: nn.Module, grid: IntPair):
    args = _resample_args(model)[:3]
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


def _fit_axis_tables(sd: Dict[str, torch.Tensor], keys: Sequence[str], grid: IntPair, said: str,
                     resample: Callable[[torch.Tensor, int, int], torch.Tensor]) -> List[str]:
    """A loaded row and column table (``keys``) each fitted to the grid's side by ``resample(table, axis, size)``."""
    notes = []
    for axis, key in enumerate(keys):
        if key in sd and sd[key].dim() == 3 and sd[key].shape[1] != grid[axis]:
            notes.append(f"{key} {sd[key].shape[1]} -> {grid[axis]} ({said})")
            sd[key] = resample(sd[key], axis, grid[axis])
    return notes


def _2d_fit_state(sd: Dict[str, torch.Tensor], model: nn.Module, grid: IntPair, fit: "StateFit") -> List[str]:
    return _fit_axis_tables(sd, ("pos_embed_row", "pos_embed_col"), grid, fit.said, lambda table, axis, size: (
        _resample_axis(table, axis, size, fit.interpolation, fit.antialias, fit.align_corners)))


# ----------------------------------------------------------------------------- factorized (row + column, summed)


def _factorized_build(model: nn.Module, grid: IntPair, dim: int, slots: int) -> None:
    # timm's NaFlex "factorized": a full-width table per axis, added (the paper's 2D ablation concatenates halves)
    model.pos_embed_y = nn.Parameter(torch.zeros(1, grid[0], dim))
    model.pos_embed_x = nn.Parameter(torch.zeros(1, grid[1], dim))


def _factorized_tables(model: nn.Module, grid: IntPair):
    square = max(grid) if _resample_args(model)[3] else None
    return resample_line(model.pos_embed_y, grid[0], square), resample_line(model.pos_embed_x, grid[1], square)


def _factorized_table(model: nn.Module, grid: IntPair) -> torch.Tensor:
    y, x = _factorized_tables(model, grid)
    return (y[:, :, None, :] + x[:, None, :, :]).reshape(1, grid[0] * grid[1], -1)


def _factorized_resample(model: nn.Module, old: IntPair, new: IntPair) -> None:
    y, x = _factorized_tables(model, new)
    model.pos_embed_y, model.pos_embed_x = nn.Parameter(y.detach()), nn.Parameter(x.detach())


def _factorized_fit_state(sd: Dict[str, torch.Tensor], model: nn.Module, grid: IntPair, fit: "StateFit") -> List[str]:
    return _fit_axis_tables(sd, ("pos_embed_y", "pos_embed_x"), grid, "linear",
                            lambda table, axis, size: resample_line(table, size))


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
    resize = model.config.rel_pos_resize
    for blk in model.blocks:
        if hasattr(blk.attn, "init_relative"):  # BEiT: the layer holds the table
            blk.attn.init_relative(model.patch_embed.grid_size, blk.attn.num_heads, model.num_prefix_tokens, resize)
        else:
            blk.attn.rel_pos = RelativePositionBias(model.patch_embed.grid_size, blk.attn.num_heads,
                                                    model.num_prefix_tokens, resize)


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


def square_table_side(offsets: int) -> Optional[int]:
    """The side g of the square grid whose relative-bias table has ``offsets`` = (2 g - 1)^2 rows (its prefix
    tokens' rows taken off), or None: no square grid has that many (another shape has several readings)."""
    side = (round(max(offsets, 0) ** 0.5) + 1) // 2
    return side if offsets > 0 and (2 * side - 1) ** 2 == offsets else None


def _relative_source_grid(rows: int, grid: IntPair, prefix: int, stored: Optional[IntPair] = None) -> IntPair:
    """The grid a stored table of ``rows`` rows was made for: the one the weights' config names (``stored``), else
    the model's, else a square one (a 4x6 grid's table has the rows of a 6x4 one: only a config tells them apart)."""
    offsets = rows - 3 * prefix
    if stored is not None:
        if offsets == (2 * stored[0] - 1) * (2 * stored[1] - 1):
            return tuple(stored)
        raise ValueError(f"a relative-bias table of {rows} rows does not fit the {stored[0]}x{stored[1]} grid the "
                         f"weights' config names ({(2 * stored[0] - 1) * (2 * stored[1] - 1) + 3 * prefix} rows with "
                         f"{prefix} prefix token(s)): the table or the config was changed")
    if offsets == (2 * grid[0] - 1) * (2 * grid[1] - 1):
        return tuple(grid)
    side = square_table_side(offsets)
    if side is not None:
        return (side, side)
    need = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3 * prefix
    raise ValueError(f"a relative-bias table of {rows} rows fits no square grid with {prefix} prefix token(s) "
                     f"(the model's {grid[0]}x{grid[1]} grid needs {need})")


def _relative_fit_state(sd: Dict[str, torch.Tensor], model: nn.Module, grid: IntPair, fit: "StateFit") -> List[str]:
    prefix, resized, source = model.num_prefix_tokens, 0, None
    for key in [k for k in sd if k.endswith(RELATIVE_LEAF)]:
        if sd[key].dim() != 2:
            continue  # the loader's shape check names it
        source = _relative_source_grid(sd[key].shape[0], grid, prefix, fit.source_grid)
        if source != tuple(grid):
            sd[key] = resize_relative_table(sd[key], source, grid, prefix, model.config.rel_pos_resize)
            resized += 1
    if not resized:
        return []
    how = {"bilinear": "stretched bilinearly", "geometric": "resampled as BEiT's fine-tuning and timm do",
           "keep": "offsets kept, the outermost extended"}[model.config.rel_pos_resize]
    return [f"{resized} relative-bias tables {source[0]}x{source[1]} -> {grid[0]}x{grid[1]} ({how})"]


# ----------------------------------------------------------------------------- the table


def _nothing(*args) -> None:
    return None


def _no_notes(*args) -> List[str]:
    return []


@dataclass(frozen=True)
class StateFit:
    """How a loaded state dict's position parameters meet the model's grid: the resampling the loader chose
    (as the weights' library resamples, or as the caller named) and the grid the weights were made for, where
    their config names it (a table's size alone does not tell a 4x6 grid from a 6x4 one)."""

    interpolation: str = "bicubic"
    antialias: bool = True
    align_corners: bool = False
    source_grid: Optional[IntPair] = None

    @property
    def said(self) -> str:
        return self.interpolation + (", antialiased" if self.antialias else "") + \
            (", corners aligned" if self.align_corners else "")


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
    #: (state dict, model, model grid, StateFit) -> notes: fit a loaded state dict's parameters of
    #: this kind to the model's grid in place (the learned table, which every foreign layout stores,
    #: is fitted by the loader itself: it also infers prefix slots)
    fit_state: Callable[[Dict[str, torch.Tensor], nn.Module, IntPair, StateFit], List[str]] = _no_notes
    #: (model) -> None: create the parts that live in the blocks, once they exist
    attach: Callable[[nn.Module], None] = _nothing


KINDS: Dict[str, PosEmbedKind] = {
    "learned": PosEmbedKind(_learned_build, _learned_table, _learned_resample),
    "learned_2d": PosEmbedKind(_2d_build, _2d_table, _2d_resample, width_multiple=2, fit_state=_2d_fit_state),
    "sincos2d": PosEmbedKind(_sincos_build, _sincos_table, _sincos_resample, width_multiple=4),
    # timm's NaFlexViT pos_embed='factorized': a row and a column table added, each resampled linearly
    "factorized": PosEmbedKind(_factorized_build, _factorized_table, _factorized_resample,
                               fit_state=_factorized_fit_state),
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
    ``slots`` prefix slots in front of the patches (the ViT's class / distillation tokens). The grid is the
    config's ``table_grid``: a learned table may be held at another grid than the image's (``pos_embed_size``),
    kept as ``model.pos_embed_grid`` and resampled to each input's grid."""
    for name in PARAMETER_NAMES:
        setattr(model, name, None)
    model.pos_embed_kind = kind
    model.pos_embed_grid = tuple(grid)
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
    if model.pos_embed_kind == "learned" and tuple(grid) == model.pos_embed_grid \
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


def table_grid(model: nn.Module) -> IntPair:
    """The grid the model's position table is held at (:func:`build`): the image's unless its config's
    ``pos_embed_size`` names another."""
    return tuple(getattr(model, "pos_embed_grid", None) or model.patch_embed.grid_size)


def token_model(module: nn.Module) -> Optional[nn.Module]:
    """The model with positions in ``module``: itself, a backbone's model or a pre-training model's encoder."""
    for inner in (module, getattr(module, "model", None), getattr(module, "encoder", None)):
        if isinstance(inner, nn.Module) and getattr(inner, "pos_embed_kind", None) is not None:
            return inner
    return None


def held_apart(module: nn.Module) -> bool:
    """Whether the learned table of ``module`` (a model, a backbone, a pre-training model) is held at another grid
    than its image size's (``pos_embed_size``)."""
    model = token_model(module)
    return model is not None and model.pos_embed_kind == "learned" and \
        table_grid(model) != tuple(model.patch_embed.grid_size)


def parameters_at_img_size(module: nn.Module) -> int:
    """The parameter count of :func:`at_img_size`'s ``module``, without the copy it makes."""
    count = sum(p.numel() for p in module.parameters())
    if held_apart(module):
        model = token_model(module)
        (th, tw), (gh, gw) = table_grid(model), model.patch_embed.grid_size
        count -= (th * tw - gh * gw) * model.pos_embed.shape[-1]
    return count


def at_img_size(module: nn.Module) -> nn.Module:
    """``module`` with its learned table at the image size's grid: itself where it is held there, else a copy
    resampled to it (the layouts that hold one size: Hugging Face's, the npz files, an exported graph)."""
    if not held_apart(module):
        return module
    import copy

    module = copy.deepcopy(module)
    model = token_model(module)
    with torch.no_grad():
        _learned_resample(model, model.pos_embed_grid, tuple(model.patch_embed.grid_size))
    model.config = model.config.replace(pos_embed_size=None)
    return module


def fit_state_dict(sd: Dict[str, torch.Tensor], model: nn.Module, fit: StateFit) -> List[str]:
    """Fit the state dict's parameters of the model's kind (other than the learned table) to the grid the model
    holds them at (its image's, or ``pos_embed_size``'s: NaFlex's factorised tables), and those a family keeps in
    its blocks (``fit_own_tables``: SAM's offset tables); returns what was resampled."""
    said = KINDS[model.pos_embed_kind].fit_state(sd, model, table_grid(model), fit)
    own = getattr(model, "fit_own_tables", None)
    return said + (own(sd) if own is not None else [])


__all__ = ["IntPair", "INTERPOLATIONS", "SINCOS_SPACINGS", "resample_pos_embed_grid", "resample_pos_embed",
           "sincos_2d_pos_embed", "relative_position_index", "resize_relative_table", "RELATIVE_RESIZES",
           "square_table_side", "StateFit",
           "RelativeBiasTable",
           "RelativePositionBias", "relative_log_coords", "RelativePositionMlp", "Rope", "rotate_pairs", "apply_rope",
           "kept_rotations",
           "PARAMETER_NAMES", "RELATIVE_TABLE", "RELATIVE_LEAF", "ROPES", "RotaryEmbedding", "rotary",
           "PosEmbedKind", "KINDS", "check", "build", "attach", "parameters", "attention_bias", "patch_table",
           "resample_", "add", "add_to_patches", "join_prefix", "full_table", "fit_state_dict", "table_grid",
           "token_model", "held_apart", "parameters_at_img_size", "at_img_size"]
