"""Gemma 4's vision encoder (Google, 2026): the family "gemma4" (timm's ``gemma4_vit_{167m,570m}`` classifiers and
their ``_enc`` encoders).

A ViT of RMSNorms without a class token, whose parts are its own:

- the patch embedding is a linear layer without bias over each patch flattened channel, row, column (a stride-P
  convolution's kernel, held as timm's ``input_proj``), of pixels in [0, 1] scaled to [-1, 1] inside the model
  (its preprocessing's mean 0 and std 1); a patch's position is ``table[0][column] + table[1][row]``, two learned
  tables of 10,240 slots (``position_embedding_table``, looked up, never resampled: any grid up to that);
- a "sandwich" block: ``x + norm2(attn(norm1(x)))``, then ``x + norm4(mlp(norm3(x)))``;
- attention with separate q, k, v and output projections without bias, RMSNorm of each head's queries and keys
  (with weights) and values (without), 2D rotary positions on the heads' two halves (the first rotated by the
  column, the second by the row, each half's halves swapped: theta 100), and no 1/sqrt(d) scale;
- a gated MLP ``down(gelu_tanh(gate(x)) * up(x))``;
- ``use_clipped_linears`` (the 167M tower): every projection clamps its input and output to four stored bounds.

The classifier averages the patches, normalises them by an RMSNorm without weight, and maps them to the classes.
The ``_enc`` encoder (``global_pool='soft'``) ends in the VLM's soft tokens: each 3 x 3 block of patches averaged
(a grid of whole blocks), times sqrt(width), and for the 570M tower standardised by two stored vectors
(``std_bias``, ``std_scale``); ``forward_features`` gives them, ``model(x)`` their mean. Gemma 4's own checkpoints
(transformers' names) are read by :mod:`vitkit.weights.gemma4_format`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import positions
from .base import LayerGroups, TokenModel
from .complexity import Complexity, token_complexity
from .config_base import TokenConfig
from .layers import IntPair, Linear, drop_path, linear_drop_path_rates
from .norms import RmsNorm
from .patch import PatchGrid
from .registry import Family, register_family, register_model
from .vit import _is_count

#: the classifier's encoder under ``encoder.`` (timm's names); its ``_enc`` encoder holds them bare
TIMM_PREFIX = "encoder."


@dataclass
class Gemma4Config(TokenConfig):
    """Gemma 4's vision encoder (see the module notes)."""

    KIND: ClassVar[str] = "Gemma 4 ViT"
    #: the classifier's readout (the patches' mean), or the encoder's soft tokens (their mean for ``model(x)`` and
    #: a head: timm's classifier with ``encoder_pool='soft'``, what fine-tuning a VLM's tower makes)
    POOLS: ClassVar[Tuple[str, ...]] = ("avg", "soft")

    architecture: str = "gemma4"
    img_size: Tuple[int, int] = (768, 768)
    depth: int = 16
    global_pool: str = "avg"
    qkv_bias: bool = False
    dynamic_img_size: bool = True
    mean: Tuple[float, ...] = (0.0, 0.0, 0.0)
    std: Tuple[float, ...] = (1.0, 1.0, 1.0)
    crop_pct: float = 1.0
    num_classes: int = 0
    mlp_dim: int = 3072
    #: key and value heads (grouped-query attention; None: as many as the queries')
    kv_heads: Optional[int] = None
    rope_theta: float = 100.0
    #: the slots of each position table (the largest column and row index a patch may have, plus one)
    table_size: int = 10240
    #: the side of the blocks of patches the soft tokens average
    pool_kernel: int = 3
    #: the soft tokens standardised by ``std_bias`` and ``std_scale`` (the 570M tower)
    standardize: bool = False
    #: every projection clamps its input and output (``use_clipped_linears``: the 167M tower)
    clipped: bool = False
    #: the classifier's weightless RMSNorm after the mean
    final_norm: bool = True

    def family_problems(self) -> List[str]:
        problems = []
        for name in ("mlp_dim", "table_size", "pool_kernel"):
            if not _is_count(getattr(self, name)) or not getattr(self, name):
                problems.append(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        heads, kv = self.num_heads, self.kv_heads
        if kv is not None and not (_is_count(kv) and kv > 0 and _is_count(heads) and heads % kv == 0):
            problems.append(f"kv_heads must divide num_heads {heads}, got {kv!r}")
        if _is_count(heads) and heads and _is_count(self.embed_dim) and (self.embed_dim // heads) % 4:
            problems.append(f"the heads' width {self.embed_dim // heads} is no multiple of 4 (two rotated halves)")
        for name in ("standardize", "clipped", "final_norm", "dynamic_img_size"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 0:
            problems.append(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        return problems

    def grid_problems(self) -> List[str]:
        problems = super().grid_problems()
        (gh, gw), slots = self.grid_size, self.table_size
        if not problems and _is_count(slots) and slots and max(gh, gw) > slots:
            problems.append(f"img_size {tuple(self.img_size)} is a grid of {gh}x{gw} patches, past the position "
                            f"tables' {slots:,} slots")
        if problems or self.global_pool != "soft" or not (_is_count(self.pool_kernel) and self.pool_kernel):
            return problems
        k, (ph, pw) = self.pool_kernel, self.patch_size
        if gh % k or gw % k:
            problems.append(f"img_size {tuple(self.img_size)} is a grid of {gh}x{gw} patches, not of whole {k}x{k} "
                            f"blocks for the soft tokens: give it a multiple of {k * ph}x{k * pw} px")
        return problems


# ----------------------------------------------------------------------------- parts


class ClippableLinear(nn.Module):
    """A linear layer without bias (timm's ``Gemma4ClippableLinear``: ``linear``), whose input and output are clamped
    to stored bounds where ``clipped``."""

    def __init__(self, dim: int, out: int, clipped: bool):
        super().__init__()
        self.linear = Linear(dim, out, bias=False)
        self.clipped = clipped
        if clipped:
            for name in ("input_min", "output_min", "input_max", "output_max"):
                self.register_buffer(name, torch.tensor(-math.inf if name.endswith("min") else math.inf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return self.linear(x)
        return _clamped(self.linear(_clamped(x, self.input_min, self.input_max)), self.output_min, self.output_max)


def _clamped(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """``torch.clamp(x, low, high)`` written as two selections: the ONNX exporter's optimiser fused a clamp (or a
    maximum and a minimum) of every layer into Clip nodes over one bound it kept, naming others it dropped (a graph
    ONNX Runtime refused to load)."""
    x = torch.where(x < low, low.to(x.dtype), x)
    return torch.where(x > high, high.to(x.dtype), x)


class Gemma4PatchEmbed(PatchGrid, nn.Module):
    """Images in [0, 1] (B, C, H, W) -> tokens (B, gh, gw, D): scaled to [-1, 1], each patch flattened channel,
    row, column through ``input_proj``, plus ``position_embedding_table[0][column] + [1][row]``."""

    def __init__(self, img_size: IntPair, patch_size: IntPair, in_chans: int, embed_dim: int, table_size: int):
        super().__init__()
        self.patch_size, self.in_chans, self.embed_dim = tuple(patch_size), in_chans, embed_dim
        self.set_img_size(img_size)
        self.input_proj = Linear(in_chans * self.patch_size[0] * self.patch_size[1], embed_dim, bias=False)
        self.position_embedding_table = nn.Parameter(torch.zeros(2, table_size, embed_dim))

    def grid_for(self, img_size: IntPair) -> IntPair:
        (h, w), (ph, pw) = img_size, self.patch_size
        if h % ph or w % pw:
            raise ValueError(f"image size {h}x{w} is not divisible by the patch size {ph}x{pw}; resize or crop the "
                             f"input to a multiple of the patch size")
        grid, table = (h // ph, w // pw), getattr(self, "position_embedding_table", None)
        if table is not None and max(grid) > table.shape[1]:
            raise ValueError(f"a grid of {grid[0]}x{grid[1]} patches is past the position tables' "
                             f"{table.shape[1]:,} slots")
        return grid

    def filters(self) -> torch.Tensor:
        """``input_proj`` as the (D, C, P, P) filters of the convolution it is (what inspection draws)."""
        return self.input_proj.weight.reshape(self.embed_dim, self.in_chans, *self.patch_size)

    def positions(self, grid: IntPair) -> torch.Tensor:
        """The (gh, gw, D) positions of a grid's patches: the column's row of the first table plus the row's of the
        second."""
        table = self.position_embedding_table
        return table[0, :grid[1]][None, :, :] + table[1, :grid[0]][:, None, :]

    def forward(self, x: torch.Tensor, strict: bool = True) -> torch.Tensor:
        self.check_images(x, strict)
        (B, C, H, W), (ph, pw) = x.shape, self.patch_size
        gh, gw = H // ph, W // pw
        patches = x.reshape(B, C, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5).reshape(B, gh, gw, C * ph * pw)
        return self.input_proj(2 * (patches - 0.5)) + self.positions((gh, gw))


def rope_tables(grid: IntPair, head_dim: int, theta: float, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (gh*gw, head_dim): the first half of a head turned by the column, the second by the row,
    each half's angles repeated over its two halves (timm's and transformers' layout)."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, 2, dtype=torch.float32, device=device) / half))
    rows, cols = torch.meshgrid(torch.arange(grid[0], device=device), torch.arange(grid[1], device=device),
                                indexing="ij")
    angles = [torch.cat([f, f], dim=-1) for f in (cols.flatten()[:, None].float() * inv_freq,
                                                   rows.flatten()[:, None].float() * inv_freq)]
    emb = torch.cat(angles, dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each half of the heads (B, heads, N, d) rotated by its angles, its own halves swapped ((a, b) -> (-b, a))."""
    parts = []
    for p, c, s in zip(x.chunk(2, dim=-1), cos.chunk(2, dim=-1), sin.chunk(2, dim=-1)):
        a, b = p.chunk(2, dim=-1)
        parts.append(p * c + torch.cat([-b, a], dim=-1) * s)
    return torch.cat(parts, dim=-1)


class Gemma4Attention(nn.Module):
    """Separate q, k, v, o projections, RMSNorm of the heads' q, k (weighted) and v (not), rotary positions, no
    1/sqrt(d) scale; grouped-query attention where ``kv_heads`` is fewer."""

    def __init__(self, dim: int, num_heads: int, kv_heads: int, eps: float, clipped: bool, attn_drop: float):
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim = num_heads, kv_heads, dim // num_heads
        d = self.head_dim
        self.q_proj, self.o_proj = ClippableLinear(dim, num_heads * d, clipped), ClippableLinear(num_heads * d, dim,
                                                                                                  clipped)
        self.k_proj, self.v_proj = (ClippableLinear(dim, kv_heads * d, clipped) for _ in range(2))
        self.q_norm, self.k_norm, self.v_norm = RmsNorm(d, eps), RmsNorm(d, eps), RmsNorm(d, eps, affine=False)
        self.attn_drop = float(attn_drop)

    def forward(self, x: torch.Tensor, return_attention: bool, rope: Tuple[torch.Tensor, torch.Tensor]):
        B, N, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, N, self.num_heads, -1)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, N, self.kv_heads, -1)).transpose(1, 2)
        v = self.v_norm(self.v_proj(x).view(B, N, self.kv_heads, -1)).transpose(1, 2)
        q, k = rotate(q, *rope).to(v.dtype), rotate(k, *rope).to(v.dtype)
        if self.kv_heads != self.num_heads:
            k, v = (t.repeat_interleave(self.num_heads // self.kv_heads, dim=1) for t in (k, v))
        dropout, attn = self.attn_drop if self.training else 0.0, None
        if return_attention:
            attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
            y = (F.dropout(attn, dropout) if dropout else attn) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=1.0)
        return self.o_proj(y.transpose(1, 2).reshape(B, N, -1)), attn


class Gemma4Mlp(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))``, without biases."""

    def __init__(self, dim: int, hidden: int, clipped: bool):
        super().__init__()
        self.gate_proj, self.up_proj = ClippableLinear(dim, hidden, clipped), ClippableLinear(dim, hidden, clipped)
        self.down_proj = ClippableLinear(hidden, dim, clipped)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Gemma4Block(nn.Module):
    """The sandwich block: ``x + norm2(attn(norm1(x)))``, then ``x + norm4(mlp(norm3(x)))``."""

    def __init__(self, cfg: Gemma4Config, drop_path: float):
        super().__init__()
        D, eps = cfg.embed_dim, cfg.norm_eps
        self.norm1, self.norm2, self.norm3, self.norm4 = (RmsNorm(D, eps) for _ in range(4))
        self.attn = Gemma4Attention(D, cfg.num_heads, cfg.kv_heads or cfg.num_heads, eps, cfg.clipped,
                                    cfg.attn_drop_rate)
        self.mlp = Gemma4Mlp(D, cfg.mlp_dim, cfg.clipped)
        self.drop_path = float(drop_path)

    def forward(self, x: torch.Tensor, return_attention: bool = False, rope=None):
        y, attn = self.attn(self.norm1(x), return_attention, rope)
        x = x + drop_path(self.norm2(y), self.drop_path, self.training)
        x = x + drop_path(self.norm4(self.mlp(self.norm3(x))), self.drop_path, self.training)
        return x, attn


# ----------------------------------------------------------------------------- the model


class Gemma4ViT(TokenModel):
    """Gemma 4's vision encoder and classifier (see the module notes)."""

    config_cls = Gemma4Config
    NO_WEIGHT_DECAY = ("patch_embed.position_embedding_table",)
    #: the clamps' bounds, which may be infinite (no bound: timm's default, where a checkpoint stores none)
    UNBOUNDED = (".input_min", ".input_max", ".output_min", ".output_max")
    layer_groups = LayerGroups(embed=("patch_embed.",))

    def __init__(self, config: Optional[Gemma4Config] = None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg, D = self.config, self.config.embed_dim
        self.patch_embed = Gemma4PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, cfg.table_size)
        self.cls_token, self.num_prefix_tokens = None, 0
        positions.build(self, "none", cfg.grid_size, D)  # (its positions are the patch embedding's tables)
        self.blocks = nn.ModuleList(Gemma4Block(cfg, rate) for rate in linear_drop_path_rates(cfg.drop_path_rate,
                                                                                             cfg.depth))
        self.norm = nn.Identity()
        self.fc_norm = RmsNorm(D, cfg.norm_eps, affine=False) if cfg.final_norm else None
        if cfg.standardize:
            self.register_buffer("std_bias", torch.zeros(D))
            self.register_buffer("std_scale", torch.ones(D))
        else:
            self.std_bias = self.std_scale = None
        self.head = self._new_head(cfg.num_classes)
        self._rope: Dict[Tuple[IntPair, str], Tuple[torch.Tensor, torch.Tensor]] = {}
        if self.patch_embed.input_proj.weight.device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """timm's: every projection and the position tables truncated normal (std 0.02), the norms 1, biases 0."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02, a=-0.04, b=0.04)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.trunc_normal_(self.patch_embed.position_embedding_table, std=0.02, a=-0.04, b=0.04)

    def rotations(self, grid: IntPair, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """The rotary (cos, sin) of a grid's patches, computed once per grid and device."""
        key = (tuple(grid), str(device))
        if key not in self._rope:
            cfg = self.config
            self._rope[key] = rope_tables(grid, cfg.embed_dim // cfg.num_heads, cfg.rope_theta, device)
        return self._rope[key]

    def _layer(self, i: int, blk: nn.Module, x: torch.Tensor, grid: IntPair, return_attention: bool,
               keep: Optional[torch.Tensor] = None):
        if keep is not None:
            raise ValueError("a Gemma 4 ViT's rotations are its whole grid's, not a subset of its patches (MAE encodes "
                             "the visible ones only)")
        return self._checkpointed(blk, x, return_attention, self.rotations(grid, x.device))

    def finish_on(self, x: torch.Tensor, grid: IntPair, attns: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """The last block's tokens -> the classifier's (as they are) or the encoder's soft tokens: each
        ``pool_kernel``-square block of patches averaged, times sqrt(width), standardised where stored."""
        if self.global_pool != "soft":
            return x
        (B, _, D), (gh, gw), k = x.shape, grid, self.config.pool_kernel
        if gh % k or gw % k:
            raise ValueError(f"Gemma 4's soft tokens average whole {k}x{k} blocks of patches: a grid of {gh}x{gw} "
                             f"patches is not (give it images whose sides are a multiple of {k} patches)")
        x = x.reshape(B, gh // k, k, gw // k, k, D).mean(dim=(2, 4)).reshape(B, -1, D) * math.sqrt(D)
        return x if self.std_bias is None else (x - self.std_bias) * self.std_scale

    def patch_pos_embed(self, grid: IntPair) -> Optional[torch.Tensor]:
        """The (1, gh*gw, D) positions of a grid's patches, looked up in the two tables (the paper's similarity
        figure draws them)."""
        return self.patch_embed.positions(grid).reshape(1, -1, self.config.embed_dim)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """The mean of the tokens (the patches, or the soft tokens), through the classifier's weightless norm."""
        x = x.mean(dim=1)
        return x if self.fc_norm is None else self.fc_norm(x)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool not in (None, self.global_pool):
            raise ValueError(f"a Gemma 4 ViT's readout is built ({self.global_pool!r}), not chosen")
        super().reset_classifier(num_classes)


def gemma4_complexity(config: Gemma4Config) -> Complexity:
    """Cost of one image: the patch projection; per block q, k, v, o, the attention's two products, the gated MLP;
    the head."""
    D, M, (gh, gw), (ph, pw) = config.embed_dim, config.mlp_dim, config.grid_size, config.patch_size
    n, H = gh * gw, config.num_heads
    d, kv = D // H, config.kv_heads or H
    mix = 2 * n * n * D
    block = n * D * (H * d) * 2 + 2 * n * D * (kv * d) + mix + 3 * n * D * M
    macs = n * config.in_chans * ph * pw * D + config.depth * block + D * config.num_classes
    return token_complexity(config, macs, config.depth * mix, n)


# ----------------------------------------------------------------------------- timm's names


def is_gemma4_state_dict(keys) -> bool:
    keys = set(keys)
    return "patch_embed.input_proj.weight" in keys or TIMM_PREFIX + "patch_embed.input_proj.weight" in keys


def gemma4_from_timm(sd: Mapping[str, Any]) -> Dict[str, Any]:
    """timm's names -> vitkit's (the classifier's encoder prefix off; the encoder's are vitkit's)."""
    return {k[len(TIMM_PREFIX):] if k.startswith(TIMM_PREFIX) else k: v for k, v in sd.items()}


def gemma4_to_timm(model: Gemma4ViT) -> Dict[str, torch.Tensor]:
    """vitkit's model -> timm's: the classifier's encoder under ``encoder.``, the head beside it (a head over the soft
    tokens: timm's classifier with ``encoder_pool='soft'``)."""
    classifier = model.config.global_pool != "soft" or model.config.num_classes > 0
    return {(TIMM_PREFIX + k if classifier and not k.startswith("head.") else k): v.detach().cpu().contiguous()
            for k, v in model.state_dict().items()}


def infer_gemma4_config(sd: Mapping[str, Any], **overrides: Any) -> Gemma4Config:
    raise ValueError("a Gemma 4 ViT state dict holds neither its rotary positions' base nor its readout (the "
                     "classifier's or the soft tokens): load it with its architecture (model_name=gemma4_vit_167m, "
                     "...), or from its hub folder")


#: timm's Gemma4VitEncoder / Gemma4VitClassifier arguments -> fields
_RENAMED = {"embed_dim": "embed_dim", "num_kv_heads": "kv_heads", "intermediate_size": "mlp_dim",
            "norm_eps": "norm_eps", "rope_theta": "rope_theta", "position_embedding_size": "table_size",
            "pooling_kernel_size": "pool_kernel", "standardize": "standardize", "use_clipped_linears": "clipped",
            "final_norm": "final_norm", "drop_path_rate": "drop_path_rate", "attn_drop_rate": "attn_drop_rate"}
#: arguments the generic reader or the registered name already says, or that change nothing computed
_INERT = ("img_size", "patch_size", "in_chans", "num_classes", "depth", "num_heads", "drop_rate", "proj_drop_rate",
          "weight_init")


def gemma4_timm_args(args: Mapping[str, Any], config: Gemma4Config) -> Dict[str, Any]:
    """timm's ``model_args`` -> fields; a head width other than the width's share, an activation, or a readout
    vitkit does not build is refused by name."""
    unknown = sorted(k for k in args if k not in _RENAMED and k not in _INERT
                     and k not in ("head_dim", "global_pool", "encoder_pool", "act_layer"))
    if unknown:
        raise ValueError(f"timm Gemma 4 ViT model_args {', '.join(unknown)} are not read by vitkit")
    kw = {ours: args[theirs] for theirs, ours in _RENAMED.items() if args.get(theirs) is not None}
    width, heads = kw.get("embed_dim", config.embed_dim), args.get("num_heads") or config.num_heads
    if args.get("head_dim") is not None and args["head_dim"] * heads != width:
        raise ValueError(f"timm Gemma 4 ViT model_args head_dim={args['head_dim']!r}: vitkit's heads are the width's "
                         f"share ({width} / {heads})")
    if args.get("act_layer") is not None:
        raise ValueError("timm Gemma 4 ViT model_args act_layer is not read by vitkit (its MLP gates with GELU-tanh)")
    pool, inner = args.get("global_pool"), args.get("encoder_pool")
    soft = config.global_pool == "soft"
    if pool not in ((None, "soft") if soft else (None, "avg")) or inner not in (None, "", "none"):
        raise ValueError(f"timm Gemma 4 ViT model_args global_pool={pool!r}, encoder_pool={inner!r}: vitkit reads "
                         f"the classifier's mean ('avg') and the encoder's soft tokens ('soft')")
    return kw


FAMILY = register_family(Family(
    name="gemma4", config_cls=Gemma4Config, model_cls=Gemma4ViT, complexity=gemma4_complexity,
    matches=is_gemma4_state_dict, infer_config=infer_gemma4_config, detect_priority=20, to_timm=gemma4_to_timm,
    timm_args=gemma4_timm_args, layouts=("timm", "hf"), from_timm=gemma4_from_timm))

#: timm's names -> (width, depth, heads, MLP width, the 570M's standardisation, the 167M's clamps, the VLMs)
_SIZES = {"167m": (768, 16, 12, 3072, False, True, "Gemma 4 E2B and E4B"),
          "570m": (1152, 27, 16, 4304, True, False, "Gemma 4 26B and 31B")}
for _size, (_width, _depth, _heads, _mlp, _std, _clip, _source) in _SIZES.items():
    _base = Gemma4Config(embed_dim=_width, depth=_depth, num_heads=_heads, mlp_dim=_mlp, standardize=_std,
                         clipped=_clip)
    register_model(f"gemma4_vit_{_size}", _base,
                   f"timm's gemma4_vit_{_size}: the vision encoder of {_source}, the patches' mean as a classifier")
    register_model(f"gemma4_vit_{_size}_enc", _base.replace(global_pool="soft", final_norm=False),
                   f"timm's gemma4_vit_{_size}_enc: the vision encoder of {_source} (forward_features gives the "
                   f"language model's soft tokens)")

__all__ = ["Gemma4Config", "Gemma4ViT", "FAMILY", "rope_tables", "gemma4_from_timm", "gemma4_to_timm"]
