"""ConViT: "Improving Vision Transformers with Soft Convolutional Inductive Biases" (d'Ascoli et al., 2021).

A DeiT whose first layers replace self-attention by *gated positional self-attention*
(GPSA). Each GPSA head mixes two attention matrices with a learned gate
``lambda_h = sigmoid(gating_param_h)``::

    A_h = (1 - lambda_h) softmax(q_i . k_j / sqrt(d)) + lambda_h softmax(v_pos_h . r_ij)

``r_ij = (dx, dy, dx^2 + dy^2)`` is the offset from query patch i to key patch j on the
patch grid and ``v_pos_h`` (the rows of ``pos_proj``) a learned 3-vector per head. At
initialisation ("local init") ``v_pos_h = alpha (2 dx_h, 2 dy_h, -1)`` for the heads of a
sqrt(H) x sqrt(H) kernel, so that head h's positional attention is
``softmax(-alpha ||r - delta_h||^2)``: a soft convolution tap at offset ``delta_h`` whose
sharpness is the locality strength ``alpha``; the value projection starts as the identity
and every gate at sigmoid(1) = 0.73. The rows are renormalised after mixing (as timm and
the official code do). Facts that decide parity with timm's ``convit_*`` (and the official
checkpoints, which carry timm's names under ``'model'``):

- widths are ``48 x heads`` (tiny 192/4, small 432/9, base 768/16), 12 layers, MLP ratio 4,
  no q/k/v biases (``qkv_bias=False``), LayerNorm eps 1e-6, exact GELU;
- GPSA in the first ``local_up_to_layer = 10`` layers (``attn.qk``, ``attn.v``, ``attn.proj``,
  ``attn.pos_proj`` with a bias, ``attn.gating_param``), plain MHSA after (``attn.qkv``,
  ``attn.proj``);
- the class token is concatenated *after* the GPSA layers: they see patches only; the learned
  absolute position embedding ``pos_embed`` (1, patches, D) has no class slot;
- ImageNet mean/std, crop 0.875, bicubic.

For a non-square grid the offsets are taken on the real (rows, columns) grid; for square
grids this is timm's table exactly. ``model(x, return_attention=True)`` returns per layer the
(B, heads, N, N) weights: patch-only (N = patches) for the GPSA layers, [class] + patches
after them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import positions
from .base import TokenModel
from .complexity import Complexity, token_complexity
from .config_base import IMAGENET_MEAN, IMAGENET_STD, TokenConfig
from .layers import (
    ATTN_IMPLS,
    Block,
    IntPair,
    Linear,
    Mlp,
    PatchEmbed,
    drop_path,
    explicit_attention,
    linear_drop_path_rates,
)
from .registry import Family, register_family, register_model

CONVIT_POS_EMBEDS = ("learned", "none")


@dataclass
class ConViTConfig(TokenConfig):
    """Everything needed to rebuild a ConViT, plus the preprocessing its weights expect.

    ``embed_dim`` is the full width (timm's ``convit_*`` pass 48 per head and multiply).
    ``attn_impl`` is ViTConfig's: GPSA's content attention fuses too when it has no attention
    dropout in training (the gated mix is then made of the two outputs).
    """

    KIND: ClassVar[str] = "ConViT"

    num_heads: int = 16
    mlp_dim: int = 3072
    #: GPSA in layers 0 .. local_up_to_layer - 1, then MHSA; the class token joins after them.
    local_up_to_layer: int = 10
    #: alpha of the local init: how sharply each head's positional attention peaks at its offset.
    locality_strength: float = 1.0
    #: Start GPSA as a convolution (value = identity, positional attention at kernel offsets).
    use_local_init: bool = True
    #: a learned table over the patches (no class slot), or none
    pos_embed: str = "learned"
    qkv_bias: bool = False
    gelu: str = "exact"
    mean: Tuple[float, ...] = IMAGENET_MEAN
    std: Tuple[float, ...] = IMAGENET_STD
    crop_pct: float = 0.875
    architecture: str = "convit"

    def family_problems(self) -> List[str]:
        problems = positions.check(self.pos_embed, self.embed_dim, CONVIT_POS_EMBEDS)
        if self.gelu not in ("exact", "tanh"):
            problems.append(f"gelu must be 'exact' or 'tanh', got {self.gelu!r}")
        problems += self._positive_int_problems(("mlp_dim",))
        if isinstance(self.depth, int) and self.depth > 0 and not 0 <= self.local_up_to_layer < self.depth:
            problems.append(f"local_up_to_layer must be in 0..{self.depth - 1} (GPSA layers, then at least one "
                            f"MHSA layer that the class token joins), got {self.local_up_to_layer}")
        if not (math.isfinite(self.locality_strength) and self.locality_strength > 0):
            problems.append(f"locality_strength must be a positive number, got {self.locality_strength}")
        return problems


# ----------------------------------------------------------------------------- GPSA


def relative_positions(grid: IntPair, device=None, dtype=torch.float32) -> torch.Tensor:
    """(N, N, 3) table r_ij = (dx, dy, dx^2 + dy^2) from query patch i to key patch j, row-major
    patches on a (rows, columns) grid; timm's ``rel_indices`` for square grids."""
    gh, gw = grid
    rows = torch.arange(gh, dtype=torch.float32).repeat_interleave(gw)
    cols = torch.arange(gw, dtype=torch.float32).repeat(gh)
    dx = cols[None, :] - cols[:, None]
    dy = rows[None, :] - rows[:, None]
    return torch.stack([dx, dy, dx * dx + dy * dy], dim=-1).to(device=device, dtype=dtype)


def kernel_offsets(num_heads: int) -> List[Tuple[float, float]]:
    """(dx, dy) of each head that the local init places on a sqrt(H) x sqrt(H) kernel (head
    ``h1 + k h2`` at dx = h2 - c, dy = h1 - c); heads beyond k*k keep a random init."""
    k = int(num_heads ** 0.5)
    centre = (k - 1) / 2 if k % 2 == 0 else k // 2
    offsets: List[Tuple[float, float]] = [(0.0, 0.0)] * (k * k)
    for h1 in range(k):
        for h2 in range(k):
            offsets[h1 + k * h2] = (float(h2 - centre), float(h1 - centre))
    return offsets


class GPSA(nn.Module):
    """Gated positional self-attention (timm's names: qk, v, proj, pos_proj, gating_param).

    attn = (1 - g) softmax(q k^T / sqrt(d)) + g softmax(v_pos . r_ij) per head, renormalised
    (timm and the official code divide by the row sums, which are 1 up to rounding). The
    fused path uses that attn @ v = (1 - g) SDPA(q, k, v) + g (positional @ v), so the
    content attention never materialises; the explicit path returns the weights.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, locality_strength: float = 1.0, impl: str = "auto"):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        if impl not in ATTN_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTN_IMPLS}, got {impl!r}")
        self.impl = impl
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.locality_strength = float(locality_strength)
        self.qk = Linear(dim, dim * 2, bias=qkv_bias)
        self.v = Linear(dim, dim, bias=qkv_bias)
        self.proj = Linear(dim, dim)
        self.pos_proj = Linear(3, num_heads)
        self.gating_param = nn.Parameter(torch.ones(num_heads))
        self.attn_drop = float(attn_drop)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else None
        self._rel_cache: Optional[Tuple[Any, torch.Tensor]] = None

    def rel_indices(self, grid: IntPair) -> torch.Tensor:
        w = self.pos_proj.weight
        key = (tuple(grid), w.device, w.dtype)
        if self._rel_cache is None or self._rel_cache[0] != key:
            self._rel_cache = (key, relative_positions(grid, w.device, w.dtype))
        return self._rel_cache[1]

    def gates(self) -> torch.Tensor:
        """lambda per head: the weight of the positional attention, in (0, 1)."""
        return torch.sigmoid(self.gating_param)

    def positional_attention(self, grid: IntPair) -> torch.Tensor:
        """(heads, N, N) softmax(v_pos . r_ij): each head's input-independent attention."""
        return self.pos_proj(self.rel_indices(grid)).permute(2, 0, 1).softmax(dim=-1)

    @torch.no_grad()
    def local_init(self) -> None:
        """Start as a convolution: value = identity, head h's positional attention peaked at its
        kernel offset with sharpness alpha (the paper's Eq. 5; timm/official ``local_init``)."""
        self.v.weight.copy_(torch.eye(self.dim))
        w = self.pos_proj.weight
        for h, (dx, dy) in enumerate(kernel_offsets(self.num_heads)):
            w[h, 2] = -1.0
            w[h, 1] = 2.0 * dy
            w[h, 0] = 2.0 * dx
        w.mul_(self.locality_strength)

    def forward(self, x: torch.Tensor, grid: IntPair, return_attention: bool = False):
        B, N, C = x.shape
        if N != grid[0] * grid[1]:
            raise ValueError(f"GPSA got {N} tokens for a {grid[0]}x{grid[1]} patch grid (patches only)")
        H, d = self.num_heads, self.head_dim
        q, k = self.qk(x).reshape(B, N, 2, H, d).permute(2, 0, 3, 1, 4).unbind(0)
        v = self.v(x).reshape(B, N, H, d).transpose(1, 2)
        positional = self.positional_attention(grid).unsqueeze(0)
        gate = torch.sigmoid(self.gating_param).view(1, H, 1, 1)
        dropout = self.training and self.attn_drop > 0
        attn = None
        if return_attention or dropout or explicit_attention(self.impl, x, self.qk.weight):
            # Dropout acts on the mixed weights (timm), so it needs them whole.
            content = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
            attn = (1.0 - gate) * content + gate * positional
            attn = attn / attn.sum(dim=-1, keepdim=True)
            out = (F.dropout(attn, self.attn_drop) if dropout else attn) @ v
        else:
            content = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
            out = (1.0 - gate) * content + gate * (positional.to(v.dtype) @ v)
        x = self.proj(out.transpose(1, 2).reshape(B, N, C))
        if self.proj_drop is not None:
            x = self.proj_drop(x)
        return x, attn if return_attention else None


class GPSABlock(nn.Module):
    """Pre-LN block with GPSA: x + DropPath(GPSA(LN(x))), then x + DropPath(MLP(LN(x)))."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, qkv_bias: bool = False,
                 norm_eps: float = 1e-6, gelu: str = "exact", drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float = 0.0, locality_strength: float = 1.0, attn_impl: str = "auto"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = GPSA(dim, num_heads, qkv_bias, attn_drop, drop, locality_strength, attn_impl)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, mlp_dim, gelu, drop)
        self.drop_path = float(drop_path)

    def forward(self, x: torch.Tensor, grid: IntPair, return_attention: bool = False):
        y, attn = self.attn(self.norm1(x), grid, return_attention)
        x = x + drop_path(y, self.drop_path, self.training)
        x = x + drop_path(self.mlp(self.norm2(x)), self.drop_path, self.training)
        return x, attn


# ----------------------------------------------------------------------------- the model


class ConViT(TokenModel):
    """ConViT: patch embedding + positions, GPSA layers on patches, [class] token, MHSA layers, head.

    ``model(x)`` -> logits (B, num_classes) or pooled features when ``num_classes == 0``.
    ``model(x, return_attention=True)`` -> ``(logits, [per-layer (B, heads, N, N)])`` with
    N = patches for GPSA layers and 1 + patches for the MHSA layers. ``forward_intermediates``
    returns the patch tokens of chosen layers, the class token left out (timm's contract).
    """

    config_cls = ConViTConfig

    def __init__(self, config: Optional[ConViTConfig] = None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg, D = self.config, self.config.embed_dim
        self.local_up_to_layer = cfg.local_up_to_layer
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.num_prefix_tokens = 1
        positions.build(self, cfg.pos_embed, cfg.table_grid, D)  # the table covers the patches only
        self.pos_drop = nn.Dropout(cfg.drop_rate) if cfg.drop_rate > 0 else None
        rates = linear_drop_path_rates(cfg.drop_path_rate, cfg.depth)
        self.blocks = nn.ModuleList([
            GPSABlock(D, cfg.num_heads, cfg.mlp_dim, cfg.qkv_bias, cfg.norm_eps, cfg.gelu, cfg.drop_rate,
                      cfg.attn_drop_rate, rates[i], cfg.locality_strength, cfg.attn_impl)
            if i < cfg.local_up_to_layer else
            Block(D, cfg.num_heads, cfg.mlp_dim, cfg.qkv_bias, cfg.norm_eps, cfg.gelu, cfg.drop_rate,
                  cfg.attn_drop_rate, rates[i], None, cfg.attn_impl)
            for i in range(cfg.depth)])
        self.norm = nn.LayerNorm(D, eps=cfg.norm_eps)
        self.head = self._new_head(cfg.num_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """As the official ConViT code (DeiT's recipe): linear kernels, position embedding and
        class token N(0, 0.02) truncated at +-2, zero biases, LayerNorm 1/0, PyTorch's default
        for the patch convolution, gates 1 (lambda = 0.73); then the local init of every GPSA
        layer when ``use_local_init``."""
        self.patch_embed.proj.reset_parameters()
        for p in positions.parameters(self) + [self.cls_token]:
            nn.init.trunc_normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, GPSA):
                nn.init.ones_(m.gating_param)
        if self.config.use_local_init:
            for m in self.gpsa_layers():
                m.local_init()

    def gpsa_layers(self) -> List[GPSA]:
        return [blk.attn for blk in self.blocks if isinstance(blk, GPSABlock)]

    def gates(self) -> torch.Tensor:
        """(GPSA layers, heads) gate values lambda = sigmoid(gating_param)."""
        layers = self.gpsa_layers()
        if not layers:
            return torch.zeros(0, self.config.num_heads)
        return torch.stack([a.gates() for a in layers])

    def _layer(self, i: int, blk: nn.Module, x: torch.Tensor, grid: IntPair, return_attention: bool):
        """GPSA layers see the patches (and their grid); the class token joins before the first MHSA layer."""
        if i < self.local_up_to_layer:
            return self._checkpointed(blk, x, grid, return_attention)
        if i == self.local_up_to_layer:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self._checkpointed(blk, x, return_attention)

    def extra_repr(self) -> str:
        c = self.config
        return (f"img_size={c.img_size}, patch_size={c.patch_size}, grid={self.patch_embed.grid_size}, "
                f"gpsa_layers={c.local_up_to_layer}/{c.depth}, locality_strength={c.locality_strength}, "
                f"global_pool={self.global_pool}")


# ----------------------------------------------------------------------------- cost, weights


def convit_macs(config: ConViTConfig) -> Tuple[int, int]:
    """(total MACs, attention-mixing MACs) of one image: the matrix products, counted as
    ``FlopCounterMode`` does (the positional scores v_pos . r_ij are a (N^2 x 3) x (3 x H)
    product per forward; at batch 1 that is per image, as timm computes it per image)."""
    D, M, H = config.embed_dim, config.mlp_dim, config.num_heads
    gh, gw = config.grid_size
    n = gh * gw
    (ph, pw), C = config.patch_size, config.in_chans
    embed = n * D * C * ph * pw
    L = config.local_up_to_layer
    gpsa_mix = 2 * n * n * D
    gpsa = 2 * n * D * D + n * D * D + n * D * D + n * n * 3 * H + gpsa_mix + 2 * n * D * M
    t = n + 1
    mhsa_mix = 2 * t * t * D
    mhsa = 3 * t * D * D + mhsa_mix + t * D * D + 2 * t * D * M
    total = embed + L * gpsa + (config.depth - L) * mhsa + D * config.num_classes
    return total, L * gpsa_mix + (config.depth - L) * mhsa_mix


def convit_complexity(config: ConViTConfig) -> Complexity:
    """``tokens`` and the attention entries are those of the MHSA layers (class token +
    patches); the GPSA layers attend over the patches only (and add the positional scores
    v_pos . r_ij, counted once per image as timm computes them)."""
    gh, gw = config.grid_size
    return token_complexity(config, *convit_macs(config), tokens=gh * gw + 1)


def convit_timm_args(args: Mapping[str, Any], config: ConViTConfig) -> Dict[str, Any]:
    """timm's ConVit ``model_args`` -> ConViTConfig fields (timm passes the width per head)."""
    kw = {k: args[k] for k in ("local_up_to_layer", "locality_strength") if k in args}
    if "embed_dim" in args:
        kw["embed_dim"] = int(args["embed_dim"]) * int(args.get("num_heads", config.num_heads))
    if "embed_dim" in args or "mlp_ratio" in args:
        ratio = args.get("mlp_ratio", config.mlp_dim / config.embed_dim)
        kw["mlp_dim"] = int(kw.get("embed_dim", config.embed_dim) * ratio)
    return kw


def is_convit_state_dict(sd: Collection[str]) -> bool:
    """timm/official ConViT names: GPSA layers have ``attn.gating_param`` / ``attn.qk``."""
    return any(k.endswith(("attn.gating_param", "attn.qk.weight", "attn.pos_proj.weight")) for k in sd)


def infer_convit_config(sd: Mapping[str, Any], **overrides: Any) -> ConViTConfig:
    """A ConViT's config from a timm/vitkit-named state dict alone.

    Heads are the length of ``gating_param``; GPSA layers the blocks that have one; the image
    size comes from a square position table (else pass ``img_size=``). The pooling (timm's
    default: the class token) is not in the weights.
    """
    if "patch_embed.proj.weight" not in sd:
        raise ValueError("not a ConViT state dict: 'patch_embed.proj.weight' is missing")
    D, C, ph, pw = (int(s) for s in sd["patch_embed.proj.weight"].shape)
    block_ids = sorted({int(k.split(".")[1]) for k in sd if k.startswith("blocks.")})
    if not block_ids:
        raise ValueError("no transformer blocks ('blocks.N.*') in the state dict")
    depth = block_ids[-1] + 1
    gpsa = [i for i in block_ids if f"blocks.{i}.attn.gating_param" in sd]
    if gpsa != list(range(len(gpsa))):
        raise ValueError(f"GPSA layers must come first; found gating parameters in blocks {gpsa}")
    if gpsa:
        heads = int(sd["blocks.0.attn.gating_param"].shape[0])
        qkv_bias = "blocks.0.attn.qk.bias" in sd
    else:
        heads = max(1, D // 48)  # timm's ConViTs: 48 channels per head
        qkv_bias = "blocks.0.attn.qkv.bias" in sd
    kw: Dict[str, Any] = dict(
        embed_dim=D, in_chans=C, patch_size=(ph, pw), depth=depth, num_heads=heads,
        mlp_dim=int(sd["blocks.0.mlp.fc1.weight"].shape[0]), local_up_to_layer=len(gpsa),
        qkv_bias=qkv_bias, pos_embed="learned" if "pos_embed" in sd else "none",
        num_classes=int(sd["head.weight"].shape[0]) if "head.weight" in sd else 0)
    if "pos_embed" in sd and "img_size" not in overrides:
        n = int(sd["pos_embed"].shape[1])
        side = int(round(n ** 0.5))
        if side * side != n:
            raise ValueError(f"cannot infer the image size from a ConViT position embedding with {n} "
                             f"patch slots; pass img_size=")
        kw["img_size"] = (side * ph, side * pw)
    kw.update(overrides)
    return ConViTConfig(**kw)


# ----------------------------------------------------------------------------- registration

FAMILY = register_family(Family(
    name="convit", config_cls=ConViTConfig, model_cls=ConViT, complexity=convit_complexity,
    matches=is_convit_state_dict, infer_config=infer_convit_config, detect_priority=10,
    timm_args=convit_timm_args, analyses=("gates",)))

#: timm's names and sizes: 48 channels per head, GPSA in the first 10 of 12 layers.
_CONVIT_VARIANTS = (("tiny", "Ti", 4), ("small", "S", 9), ("base", "B", 16))
for _size, _letter, _heads in _CONVIT_VARIANTS:
    register_model(f"convit_{_size}", ConViTConfig(embed_dim=48 * _heads, num_heads=_heads, mlp_dim=4 * 48 * _heads,
                                                   depth=12, local_up_to_layer=10, locality_strength=1.0),
                   f"ConViT-{_letter}: {_heads} heads x 48, GPSA in layers 1-10, 224 px")

__all__ = ["ConViTConfig", "ConViT", "GPSA", "GPSABlock", "relative_positions", "kernel_offsets", "convit_macs",
           "convit_complexity", "convit_timm_args", "is_convit_state_dict", "infer_convit_config", "FAMILY"]
