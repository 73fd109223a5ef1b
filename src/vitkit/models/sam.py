"""Segment Anything's image encoder (Kirillov et al., 2023; the plain-ViT backbone of ViTDet, Li et al., 2022): the
family "sam" (timm's ``samvit_{base,large,huge}_patch16`` and ``samvit_base_patch16_224``).

A pre-norm ViT without a class token on a 64 x 64 grid (1,024 px at patch 16), whose blocks differ in two ways:

- most attend within 14 x 14 windows of the grid (the grid padded with zeros past its edge, after the block's
  norm; the padding takes part in each window's attention and is cut off after it), a few over the whole grid
  (``global_attn_indexes``: the last block of each quarter of the depth);
- each attention adds a decomposed relative position bias (MViTv2's): ``q . R_h[dy] + q . R_w[dx]`` from one table
  of 2S - 1 offsets per axis (``rel_pos_h``, ``rel_pos_w``; S the window's side, or the grid's in a global block),
  shared by the heads and stretched linearly to the grid of another input.

The learned table (timm holds it as (1, gh, gw, D)) is added to the patches and resampled to any input's grid. A
"neck" ends the encoder: a 1x1 convolution to 256 channels, a LayerNorm over the channels, a 3x3 convolution and
another LayerNorm -- the map SAM's mask decoder reads. vitkit gives it as tokens (B, gh*gw, 256), timm's NCHW map
flattened; a classifier averages it. timm's models normalise the blocks with ``nn.LayerNorm``'s eps (1e-5), SAM's
own code and transformers' with 1e-6: each source's files are read with its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .complexity import Complexity, token_complexity
from .config_base import IMAGENET_MEAN, IMAGENET_STD, MAX_IMG_SIZE
from .layers import (
    Attention,
    Block,
    IntPair,
    drop_path,
    intermediates_plan,
    make_mlp,
    mix_values,
    patch_tokens_as,
    to_2tuple,
)
from .registry import Family, register_family, register_model
from .vit import VisionTransformer, ViTConfig, _is_count
from .vit_timm import vit_timm_args

#: the LayerNorms of the neck (timm's LayerNorm2d, SAM's own)
NECK_EPS = 1e-6


@dataclass
class SamConfig(ViTConfig):
    """Segment Anything's image encoder (see the module notes): a ViT config with windows and a neck."""

    KIND: ClassVar[str] = "SAM ViT"
    #: (field, the value every SAM encoder has)
    FIXED: ClassVar[Tuple[Tuple[str, Any], ...]] = (
        ("class_token", False), ("distill_token", False), ("reg_tokens", 0), ("global_pool", "avg"),
        ("fc_norm", False), ("final_norm", False), ("block", "pre"), ("mlp", "mlp"), ("norm", "layernorm"),
        ("diff_attn", False), ("representation_size", None), ("backbone", None), ("dynamic_img_size", True),
        ("embed_norm", False), ("attn_norm", False), ("mlp_norm", False))

    architecture: str = "sam"
    img_size: Tuple[int, int] = (1024, 1024)
    class_token: bool = False
    global_pool: str = "avg"
    fc_norm: Optional[bool] = False
    final_norm: bool = False
    dynamic_img_size: bool = True
    norm_eps: float = 1e-5
    mean: Tuple[float, ...] = IMAGENET_MEAN
    std: Tuple[float, ...] = IMAGENET_STD
    crop_pct: float = 1.0
    #: the side of the windows the blocks attend in (0: every block attends over the whole grid)
    window_size: int = 14
    #: the blocks that attend over the whole grid
    global_attn_indexes: Tuple[int, ...] = ()
    #: the decomposed relative position bias in every attention (timm's ``use_rel_pos``)
    rel_pos: bool = True
    #: the neck's channels (0: a LayerNorm over the blocks' width alone, timm's ``neck_chans=None``)
    neck_chans: int = 256
    #: the image size the global blocks' offset tables are held at, where it is not the position table's (None:
    #: it is): the weights of a model without a table, saved at one size and served at another (stretched to each
    #: input's grid, as timm does)
    rel_pos_size: Optional[Tuple[int, int]] = None

    def __post_init__(self) -> None:
        if isinstance(self.global_attn_indexes, list):  # (JSON's lists)
            self.global_attn_indexes = tuple(self.global_attn_indexes)
        if self.rel_pos_size is not None:
            try:
                self.rel_pos_size = to_2tuple(self.rel_pos_size)
            except (TypeError, ValueError):
                raise ValueError(f"invalid {self.KIND} config: rel_pos_size must be an int or a pair (H, W) of ints, "
                                 f"got {self.rel_pos_size!r}") from None
        super().__post_init__()
        if self.rel_pos_size is not None and self.rel_grid == self.table_grid:  # (one size: the table's)
            self.rel_pos_size = None

    def family_problems(self) -> List[str]:
        problems = super().family_problems()
        problems += [f"{name} is {value!r} in a {self.KIND}, got {getattr(self, name)!r}"
                     for name, value in self.FIXED if getattr(self, name) != value]
        if self.pos_embed not in ("learned", "none"):
            problems.append(f"a {self.KIND}'s pos_embed is 'learned' or 'none' (its relative positions are rel_pos), "
                            f"got {self.pos_embed!r}")
        for name in ("window_size", "neck_chans"):
            if not _is_count(getattr(self, name)):
                problems.append(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        if not isinstance(self.rel_pos, bool):
            problems.append(f"rel_pos must be true or false, got {self.rel_pos!r}")
        indexes = self.global_attn_indexes
        if not isinstance(indexes, tuple) or not all(_is_count(i) for i in indexes) or \
                len(set(indexes)) != len(indexes):
            problems.append(f"global_attn_indexes must be a list of distinct block indexes, got {indexes!r}")
        elif _is_count(self.depth) and any(i >= self.depth for i in indexes):
            problems.append(f"global_attn_indexes {list(indexes)} name blocks past the last of depth {self.depth}")
        size = self.rel_pos_size
        if size is not None and (min(size) <= 0 or max(size) > MAX_IMG_SIZE or
                                 any(s % p for s, p in zip(size, self.patch_size)) or not self.rel_pos):
            problems.append(f"rel_pos_size must be a positive multiple of the patch {self.patch_size} of at most "
                            f"{MAX_IMG_SIZE:,} px, in a model with rel_pos, got {size}")
        return problems

    @property
    def rel_grid(self) -> IntPair:
        """The grid the global blocks' offset tables are held at."""
        if self.rel_pos_size is None:
            return self.table_grid
        return (self.rel_pos_size[0] // self.patch_size[0], self.rel_pos_size[1] // self.patch_size[1])

    def is_global(self, i: int) -> bool:
        """Whether block ``i`` attends over the whole grid."""
        return not self.window_size or i in self.global_attn_indexes


# ----------------------------------------------------------------------------- attention


def axis_offsets(table: torch.Tensor, size: int) -> torch.Tensor:
    """A (2S - 1, d) table of one axis's offsets -> the (size, size, d) vectors of every (query, key) pair along an
    axis of ``size`` tokens; a table of another length is stretched linearly first (SAM's, timm's)."""
    n = 2 * size - 1
    if table.shape[0] != n:
        table = axis_offsets_table(table, n)
    pos = torch.arange(size, device=table.device)
    return table[pos[:, None] - pos[None, :] + (size - 1)]


class SamAttention(Attention):
    """Self-attention with the decomposed relative position bias (``rel_pos_h``, ``rel_pos_w``: one table of 2S - 1
    offsets per axis of the grid it was built for, S x S)."""

    #: ONNX export keeps the layer as it is (its bias comes from its own queries: the export form takes one given)
    exported_as_is = True

    def __init__(self, dim: int, num_heads: int, rel_grid: Optional[IntPair], **kwargs: Any):
        super().__init__(dim, num_heads, **kwargs)
        self.rel_pos_h = self.rel_pos_w = None
        if rel_grid is not None:
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_grid[0] - 1, self.head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_grid[1] - 1, self.head_dim))

    def decomposed_bias(self, q: torch.Tensor, grid: IntPair) -> torch.Tensor:
        """Queries (B, heads, gh*gw, d) -> their (B, heads, N, N) bias: the row offset's term plus the column's."""
        (B, H, N, d), (gh, gw) = q.shape, grid
        rows, cols = axis_offsets(self.rel_pos_h, gh).to(q.dtype), axis_offsets(self.rel_pos_w, gw).to(q.dtype)
        q = q.reshape(B, H, gh, gw, d)
        by_row = torch.einsum("bnhwc,hkc->bnhwk", q, rows)
        by_col = torch.einsum("bnhwc,wkc->bnhwk", q, cols)
        return (by_row[..., :, None] + by_col[..., None, :]).reshape(B, H, N, N)

    def forward(self, x: torch.Tensor, return_attention: bool = False, grid: Optional[IntPair] = None):
        B, N, C = x.shape
        q, k, v = self.project(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        bias = self.decomposed_bias(q, grid) if self.rel_pos_h is not None else None
        x, attn = mix_values(q, k, v, return_attention or self._explicit(x), self.attn_drop if self.training else 0.0,
                             bias)
        return self.finish(x.transpose(1, 2).reshape(B, N, C)), attn if return_attention else None


def to_windows(x: torch.Tensor, grid: IntPair, side: int) -> Tuple[torch.Tensor, IntPair]:
    """Tokens (B, gh*gw, D) -> windows (B * windows, side*side, D) of the grid padded with zeros to whole windows,
    and the padded grid."""
    (B, _, D), (gh, gw) = x.shape, grid
    ph, pw = -gh % side, -gw % side
    x = F.pad(x.reshape(B, gh, gw, D), (0, 0, 0, pw, 0, ph))
    H, W = gh + ph, gw + pw
    x = x.reshape(B, H // side, side, W // side, side, D).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, side * side, D), (H, W)


def from_windows(x: torch.Tensor, grid: IntPair, padded: IntPair, side: int) -> torch.Tensor:
    """:func:`to_windows`'s inverse: windows -> the tokens (B, gh*gw, D) of the grid, the padding cut off."""
    (H, W), (gh, gw), D = padded, grid, x.shape[-1]
    x = x.reshape(-1, H // side, W // side, side, side, D).permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, D)
    return x[:, :gh, :gw].reshape(-1, gh * gw, D)


def windows_on_grid(attn: torch.Tensor, grid: IntPair, padded: IntPair, side: int) -> torch.Tensor:
    """Each window's attention weights (B * windows, heads, side^2, side^2) -> the (B, heads, N, N) weights over the
    grid's tokens: 0 between tokens of different windows, the weight on the padding left out (rows of an edge
    window sum to less than 1). Each window's block is copied into zeros (a gather of every pair of tokens through
    four indexes, then a mask, took 2.6x as long at 4,096 tokens)."""
    (gh, gw), across = grid, padded[1] // side
    per_image = attn.reshape(-1, (padded[0] // side) * across, *attn.shape[1:])
    full = attn.new_zeros(per_image.shape[0], attn.shape[1], gh * gw, gh * gw)
    tokens = torch.arange(gh * gw, device=attn.device).reshape(gh, gw)
    for n, (top, left) in enumerate((top, left) for top in range(0, gh, side) for left in range(0, gw, side)):
        mine = tokens[top:top + side, left:left + side]  # (the window's tokens on the grid; an edge one's fewer)
        h, w = mine.shape
        place = (torch.arange(h, device=attn.device)[:, None] * side + torch.arange(w, device=attn.device)).flatten()
        mine = mine.flatten()
        full[:, :, mine[:, None], mine[None, :]] = per_image[:, n][:, :, place[:, None], place[None, :]]
    return full


class SamBlock(Block):
    """A pre-norm block that attends within windows of ``window_size`` (0: over the whole grid)."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, window_size: int, **kwargs: Any):
        super().__init__(dim, num_heads, mlp_dim, **kwargs)
        self.window_size = window_size

    def forward(self, x: torch.Tensor, return_attention: bool = False, grid: Optional[IntPair] = None):
        side, y = self.window_size, self.norm1(x)
        if side:
            windows, padded = to_windows(y, grid, side)
            y, attn = self.attn(windows, return_attention, (side, side))
            y = from_windows(y, grid, padded, side)
            attn = None if attn is None else windows_on_grid(attn, grid, padded, side)
        else:
            y, attn = self.attn(y, return_attention, grid)
        x = x + drop_path(self.scale_attn(y), self.drop_path, self.training)
        x = x + drop_path(self.scale_mlp(self.mlp(self.norm2(x))), self.drop_path, self.training)
        return x, attn


# ----------------------------------------------------------------------------- the neck


class SamNeck(nn.Sequential):
    """The blocks' tokens (B, gh*gw, D) -> the neck's (B, gh*gw, C): 1x1 convolution, LayerNorm over the channels,
    3x3 convolution, LayerNorm (timm's and SAM's ``neck.0`` to ``neck.3``)."""

    def __init__(self, dim: int, chans: int):
        super().__init__(nn.Conv2d(dim, chans, 1, bias=False), nn.LayerNorm(chans, eps=NECK_EPS),
                         nn.Conv2d(chans, chans, 3, padding=1, bias=False), nn.LayerNorm(chans, eps=NECK_EPS))

    def forward(self, x: torch.Tensor, grid: IntPair) -> torch.Tensor:
        for conv, norm in ((self[0], self[1]), (self[2], self[3])):
            B, _, D = x.shape
            x = norm(conv(x.transpose(1, 2).reshape(B, D, *grid)).flatten(2).transpose(1, 2))
        return x


class NeckNorm(nn.LayerNorm):
    """The neck of an encoder without one: a LayerNorm over the channels (timm's ``neck_chans=None``)."""

    def forward(self, x: torch.Tensor, grid: IntPair) -> torch.Tensor:
        return super().forward(x)


# ----------------------------------------------------------------------------- the model


class SamViT(VisionTransformer):
    """Segment Anything's image encoder and classifier (see the module notes).

    ``forward_features`` -> the neck's map as tokens (B, gh*gw, neck_chans); ``model(x)`` -> their mean through the
    head (none: the mean). ``return_attention``: a windowed block's weights are placed on the grid, 0 outside each
    token's window.
    """

    config_cls = SamConfig

    def __init__(self, config: Optional[SamConfig] = None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg = self.config
        self.neck = SamNeck(cfg.embed_dim, cfg.neck_chans) if cfg.neck_chans else \
            NeckNorm(cfg.embed_dim, eps=NECK_EPS)

    def pooled_width(self, global_pool: str) -> int:
        return self.config.neck_chans or self.config.embed_dim

    def build_attention(self, norm, i: int = 0) -> nn.Module:
        cfg = self.config
        side = cfg.window_size
        rel_grid = None if not cfg.rel_pos else (cfg.rel_grid if cfg.is_global(i) else (side, side))
        return SamAttention(cfg.embed_dim, cfg.num_heads, rel_grid, qkv_bias=cfg.qkv_bias,
                            attn_drop=cfg.attn_drop_rate, proj_drop=cfg.drop_rate, impl=cfg.attn_impl,
                            qk_norm=norm if cfg.qk_norm else None)

    def build_block(self, i: int, drop_path: float, norm) -> nn.Module:
        cfg = self.config
        mlp = make_mlp(cfg.mlp, cfg.embed_dim, cfg.mlp_dim, cfg.gelu, cfg.drop_rate, cfg.proj_bias)
        return SamBlock(cfg.embed_dim, cfg.num_heads, cfg.mlp_dim, 0 if cfg.is_global(i) else cfg.window_size,
                        drop_path=drop_path, init_values=cfg.init_values, norm=norm,
                        attn=self.build_attention(norm, i), mlp=mlp)

    def _layer(self, i: int, blk: nn.Module, x: torch.Tensor, grid: IntPair, return_attention: bool,
               keep: Optional[torch.Tensor] = None):
        if keep is not None:
            raise ValueError("a SAM ViT's windows and relative positions cover the whole grid, not a subset of its "
                             "patches (MAE encodes the visible ones only)")
        return self._checkpointed(blk, x, return_attention, grid)

    def finish_on(self, x: torch.Tensor, grid: IntPair, attns: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        return self.neck(x, grid)

    def forward_intermediates(self, x: torch.Tensor, indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, output_fmt: str = "NCHW", return_prefix_tokens: bool = False,
                              intermediates_only: bool = False, stop_early: bool = False):
        """timm's contract (see :meth:`TokenModel.forward_intermediates`); ``norm`` runs the neck on each (timm's),
        and the final tokens are the neck's."""
        take, last = intermediates_plan(len(self.blocks), indices, output_fmt, stop_early, intermediates_only)
        x, grid = self.embed(x)
        outs = []
        for i, blk in enumerate(self.blocks[: last + 1]):
            x, _ = self._layer(i, blk, x, grid, False)
            if i in take:
                outs.append(patch_tokens_as(self.neck(x, grid) if norm else x, grid, output_fmt))
        return outs if intermediates_only else (self.finish_on(x, grid), outs)

    @torch.no_grad()
    def set_input_size(self, img_size: Union[int, Sequence[int]]) -> None:
        """As every token model's, and the global blocks' offset tables stretched to the new grid (as the forward
        stretches them for an input of another size)."""
        super().set_input_size(img_size)
        self.config = self.config.replace(rel_pos_size=None)
        for name, table in list(self.named_parameters()):
            if (side := self.global_table_side(name)) is not None and table.shape[0] != side:
                module, leaf = self.get_submodule(name.rsplit(".", 1)[0]), name.rsplit(".", 1)[1]
                setattr(module, leaf, nn.Parameter(axis_offsets_table(table.detach(), side)))

    def global_table_side(self, name: str) -> Optional[int]:
        """The rows a global block's offset table ``name`` has at the model's grid (None: no such table)."""
        found = re.fullmatch(r"blocks\.(\d+)\.attn\.rel_pos_([hw])", name)
        if found is None or not self.config.is_global(int(found.group(1))):
            return None
        return 2 * self.config.rel_grid[0 if found.group(2) == "h" else 1] - 1

    def fit_own_tables(self, sd: Dict[str, torch.Tensor]) -> List[str]:
        """Loading: the global blocks' offset tables of weights trained at another grid stretched to the model's
        (what the forward does to them at that grid); returns what was stretched."""
        said = []
        for name in list(sd):
            side = self.global_table_side(name)
            if side is not None and getattr(sd[name], "dim", lambda: 0)() == 2 and sd[name].shape[0] != side:
                said.append(f"{name} {sd[name].shape[0]} -> {side} offsets (linear)")
                sd[name] = axis_offsets_table(sd[name], side)
        return said


def axis_offsets_table(table: torch.Tensor, rows: int) -> torch.Tensor:
    """A (L, d) offset table stretched linearly to ``rows`` offsets (:func:`axis_offsets`' stretch)."""
    return F.interpolate(table.t()[None].float(), size=rows, mode="linear")[0].t().to(table.dtype)


# ----------------------------------------------------------------------------- cost


def sam_complexity(config: SamConfig) -> Complexity:
    """Cost of one image: window blocks' projections and attention over the padded grid, the bias's two products
    per query, the neck's convolutions, the head."""
    D, M, (ph, pw), (gh, gw) = config.embed_dim, config.mlp_dim, config.patch_size, config.grid_size
    n, mix_total, macs = gh * gw, 0, gh * gw * D * config.in_chans * ph * pw
    for i in range(config.depth):
        side = 0 if config.is_global(i) else config.window_size
        H, W = (gh, gw) if not side else (-(-gh // side) * side, -(-gw // side) * side)
        per_window = n if not side else side * side
        attended = H * W
        mix = 2 * attended * per_window * D
        bias = attended * D * ((gh + gw) if not side else 2 * side) if config.rel_pos else 0
        macs += attended * 4 * D * D + mix + bias + 2 * n * D * M
        mix_total += mix
    C = config.neck_chans
    macs += (n * D * C + n * C * C * 9) if C else 0
    macs += (C or D) * config.num_classes
    return token_complexity(config, macs, mix_total, n)


# ----------------------------------------------------------------------------- timm's and SAM's names


def sam_from_timm(sd: Mapping[str, Any]) -> Dict[str, Any]:
    """timm's names -> vitkit's: the (1, gh, gw, D) table flattened row by row, the head's ``fc`` off (SAM's own
    checkpoints: :mod:`vitkit.weights.sam_format`)."""
    out = {}
    for key, value in sd.items():
        if key == "pos_embed" and getattr(value, "dim", lambda: 0)() == 4:
            value = value.reshape(1, -1, value.shape[-1])
        out[{"head.fc.weight": "head.weight", "head.fc.bias": "head.bias"}.get(key, key)] = value
    return out


def sam_to_timm(model: SamViT) -> Dict[str, torch.Tensor]:
    """vitkit's model -> timm's VisionTransformerSAM state dict (:func:`sam_from_timm`'s inverse)."""
    out = {}
    for key, value in model.state_dict().items():
        value = value.detach().cpu()
        if key == "pos_embed":
            value = value.reshape(1, *model.config.table_grid, value.shape[-1])
        out[{"head.weight": "head.fc.weight", "head.bias": "head.fc.bias"}.get(key, key)] = value.contiguous()
    return out


def is_sam_state_dict(keys) -> bool:
    keys = set(keys)
    return "patch_embed.proj.weight" in keys and ("neck.0.weight" in keys or "neck.weight" in keys)


def infer_sam_config(sd: Mapping[str, Any], **overrides: Any) -> SamConfig:
    """A SAM encoder from timm's tensors alone: widths off the shapes, the heads off the offset tables' width, the
    grid off the (1, gh, gw, D) table; a block whose tables span the grid (2g - 1 offsets an axis) attends over it,
    the others in windows of their tables' side; timm's eps (1e-5). Without a table, which length is the grid's is
    said by an ``img_size`` asked for, else refused where the blocks differ (a wrong reading must not be silent)."""
    pos = sd.get("pos_embed")
    sd = sam_from_timm(sd)
    weight = sd["patch_embed.proj.weight"]
    D, _, ph, pw = (int(s) for s in weight.shape)
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    tables = [(sd.get(f"blocks.{i}.attn.rel_pos_h"), sd.get(f"blocks.{i}.attn.rel_pos_w")) for i in range(depth)]
    missing = [f"blocks.{i}.attn.rel_pos_{axis}" for i, pair in enumerate(tables) for axis, t in zip("hw", pair)
               if t is None]
    if len(missing) == 2 * depth:
        raise ValueError("a SAM ViT state dict without relative position tables does not say which blocks attend in "
                         "windows: load it with its architecture (model_name=samvit_base_patch16_224, ...)")
    if missing:
        raise ValueError(f"the SAM ViT state dict is partial: {', '.join(missing[:3])} missing, where the other "
                         f"blocks have their offset tables")
    lengths = [(int(h.shape[0]), int(w.shape[0])) for h, w in tables]
    if getattr(pos, "dim", lambda: 0)() == 4:
        grid = (int(pos.shape[1]), int(pos.shape[2]))
    elif "img_size" in overrides:
        size = to_2tuple(overrides["img_size"])
        grid = (size[0] // ph, size[1] // pw)
    elif len(set(lengths)) == 1:
        grid = ((lengths[0][0] + 1) // 2, (lengths[0][1] + 1) // 2)
    else:
        raise ValueError(f"a SAM ViT state dict without a position table holds offset tables of {len(set(lengths))} "
                         f"lengths, and no tensor says which is the grid's: give its img_size (or load it with its "
                         f"architecture, model_name=samvit_base_patch16_224, ...)")
    spans = (2 * grid[0] - 1, 2 * grid[1] - 1)
    windows = {n for n in lengths if n != spans}
    if len(windows) > 1 or any(h != w for h, w in windows):
        raise ValueError(f"a SAM ViT state dict whose window blocks' offset tables differ ({sorted(windows)} rows): "
                         f"one square window side per model")
    window = (windows.pop()[0] + 1) // 2 if windows else 0
    kw = dict(patch_size=(ph, pw), embed_dim=D, depth=depth, num_heads=D // int(tables[0][0].shape[1]),
              mlp_dim=int(sd["blocks.0.mlp.fc1.weight"].shape[0]), img_size=(grid[0] * ph, grid[1] * pw),
              window_size=window, global_attn_indexes=tuple(i for i, n in enumerate(lengths) if window and n == spans),
              qkv_bias="blocks.0.attn.qkv.bias" in sd, pre_norm="norm_pre.weight" in sd,
              qk_norm="blocks.0.attn.q_norm.weight" in sd, pos_embed="learned" if pos is not None else "none",
              neck_chans=int(sd["neck.0.weight"].shape[0]) if "neck.0.weight" in sd else 0,
              num_classes=int(sd["head.weight"].shape[0]) if "head.weight" in sd else 0)
    if "blocks.0.ls1.gamma" in sd:
        kw["init_values"] = 1e-5
    kw.update(overrides)
    return SamConfig(**kw)


#: timm's VisionTransformerSAM arguments -> SamConfig fields
_RENAMED = {"window_size": "window_size", "global_attn_indexes": "global_attn_indexes", "use_rel_pos": "rel_pos"}


def sam_timm_args(args: Mapping[str, Any], config: SamConfig) -> Dict[str, Any]:
    """timm's ``model_args`` -> fields: the windows, the neck and the positions here, the rest as a ViT's."""
    kw = {ours: args[theirs] for theirs, ours in _RENAMED.items() if theirs in args}
    if "neck_chans" in args:
        kw["neck_chans"] = args["neck_chans"] or 0
    if args.get("use_abs_pos") is False:
        kw["pos_embed"] = "none"
    for name, value in (("use_rope", False), ("head_hidden_size", None), ("ref_feat_shape", None)):
        if args.get(name, value) != value:
            raise ValueError(f"timm SAM ViT model_args {name}={args[name]!r} is not built by vitkit")
    rest = {k: v for k, v in args.items() if k not in _RENAMED and k not in (
        "neck_chans", "use_abs_pos", "use_rope", "head_hidden_size", "ref_feat_shape")}
    return {**vit_timm_args(rest, config), **kw}


def sam_tensor_fields(sd: Mapping[str, Any], config: SamConfig) -> Dict[str, Any]:
    """``Family.hub_tensor_fields``: the grid the global blocks' offset tables were saved at, where it is not the
    position table's (a model without a table, saved at another size than timm serves it at)."""
    first = next((i for i in range(config.depth) if config.is_global(i)), None)
    rows = [sd.get(f"blocks.{first}.attn.rel_pos_{axis}") for axis in "hw"] if config.rel_pos else [None]
    if first is None or any(getattr(r, "dim", lambda: 0)() != 2 for r in rows):
        return {}
    grid = tuple((int(r.shape[0]) + 1) // 2 for r in rows)
    if grid == config.table_grid:
        return {}
    return {"rel_pos_size": (grid[0] * config.patch_size[0], grid[1] * config.patch_size[1])}


FAMILY = register_family(Family(
    name="sam", config_cls=SamConfig, model_cls=SamViT, complexity=sam_complexity, matches=is_sam_state_dict,
    infer_config=infer_sam_config, detect_priority=20, to_timm=sam_to_timm, timm_args=sam_timm_args,
    layouts=("timm", "hf"), from_timm=sam_from_timm, hub_tensor_fields=sam_tensor_fields))

#: timm's names -> (width, depth, heads, global blocks, what SAM calls it)
_SIZES = {"base": (768, 12, 12, (2, 5, 8, 11), "ViT-B"), "large": (1024, 24, 16, (5, 11, 17, 23), "ViT-L"),
          "huge": (1280, 32, 16, (7, 15, 23, 31), "ViT-H")}
for _size, (_width, _depth, _heads, _globals, _sam) in _SIZES.items():
    register_model(f"samvit_{_size}_patch16", SamConfig(
        embed_dim=_width, depth=_depth, num_heads=_heads, mlp_dim=4 * _width, global_attn_indexes=_globals,
        num_classes=0), f"Segment Anything's {_sam} image encoder, 1,024 px (timm's samvit_{_size}_patch16)")
register_model("samvit_base_patch16_224", SamConfig(
    img_size=224, global_attn_indexes=(2, 5, 8, 11), pos_embed="none", neck_chans=0, num_classes=1000, crop_pct=0.9),
    "timm's SAM ViT-B/16 at 224 px for classification (no position table, a LayerNorm for a neck)")

__all__ = ["SamConfig", "SamViT", "SamAttention", "SamBlock", "SamNeck", "FAMILY", "axis_offsets", "to_windows",
           "from_windows", "windows_on_grid", "sam_from_timm", "sam_to_timm", "infer_sam_config"]
