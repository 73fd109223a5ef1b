"""CaiT: "Going deeper with Image Transformers" (Touvron et al., ICCV 2021).

Two changes to the ViT/DeiT recipe let transformers go deep:

- **LayerScale**: every residual branch is multiplied by a learned per-channel vector
  ``gamma`` initialised to a small epsilon (the paper: 0.1 up to depth 18, 1e-5 at depth 24,
  1e-6 deeper), so each block starts close to the identity;
- **class attention**: the patches are processed by ``depth`` self-attention layers *without*
  a class token; only then does a class token join, in ``cls_depth`` class-attention layers
  (2 in the paper) where the class token alone is updated: it attends to [class, patches]
  (queries from the class token only), and the patches are left unchanged.

The self-attention layers use **talking-heads attention** (Shazeer et al., 2020): the
attention logits are mixed across heads by a learned H x H map before the softmax
(``proj_l``), and the attention weights again after it (``proj_w``).

Position embeddings are added to the patches only (the table has no class slot). Parameter
names equal timm's ``timm.models.cait`` (``blocks.N.gamma_1``, ``blocks.N.attn.proj_l``,
``blocks_token_only.N.attn.{q,k,v}``), so timm state dicts and the official DeiT-repository
checkpoints (timm's names under a ``'model'`` key) load without renaming.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import positions
from .base import LayerGroups, TokenModel
from .complexity import Complexity, token_complexity
from .config_base import IMAGENET_MEAN, IMAGENET_STD, TokenConfig
from .layers import Linear, Mlp, PatchEmbed, drop_path
from .registry import Family, register_family, register_model


def layer_scale_init(depth: int) -> float:
    """The paper's LayerScale epsilon for a network of ``depth`` self-attention layers
    (section 3.1): 0.1 up to depth 18, 1e-5 up to depth 24, 1e-6 deeper. The released models
    (official code = timm) follow it except XXS-36, trained with 1e-5: the registered names
    carry their own value (``CAIT_VARIANTS``)."""
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


@dataclass
class CaiTConfig(TokenConfig):
    """Everything needed to rebuild a CaiT, plus the preprocessing its weights expect.

    Defaults are ``cait_xxs24_224``. MLP widths are timm's ``int(embed_dim * mlp_ratio)``.
    ``init_values=None`` takes the paper's LayerScale epsilon for ``depth``. ``attn_impl``
    picks the class-attention kernel ('auto'/'sdpa' fused, 'explicit' softmax); talking heads
    are always explicit.
    """

    KIND: ClassVar[str] = "CaiT"
    RATES: ClassVar[Tuple[str, ...]] = ("drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate",
                                        "drop_path_rate")

    embed_dim: int = 192
    depth: int = 24
    num_heads: int = 4
    mlp_ratio: float = 4.0
    #: class-attention layers (timm's ``depth_token_only``) and their MLP ratio
    cls_depth: int = 2
    cls_mlp_ratio: float = 4.0
    init_values: Optional[float] = None
    #: timm's dropouts: head (``drop_rate``), after the position embedding, after the
    #: attention/MLP projections and on the attention weights of the self-attention layers
    #: (the class-attention layers have none, as in timm and the official code); stochastic
    #: depth is the same rate in every self-attention layer (the official code).
    pos_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    mean: Tuple[float, ...] = IMAGENET_MEAN
    std: Tuple[float, ...] = IMAGENET_STD
    crop_pct: float = 1.0
    architecture: str = "cait"

    def family_problems(self) -> List[str]:
        problems = []
        if not isinstance(self.cls_depth, int) or self.cls_depth < 1:
            problems.append(f"cls_depth must be >= 1 (the class token joins in the class-attention "
                            f"layers), got {self.cls_depth!r}")
        for name in ("mlp_ratio", "cls_mlp_ratio"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)!r}")
        if isinstance(self.init_values, (int, float)) and not self.init_values > 0:  # (a string: said with the rest)
            problems.append(f"init_values (LayerScale epsilon) must be > 0 or None, got {self.init_values!r}")
        return problems

    @property
    def mlp_dim(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def cls_mlp_dim(self) -> int:
        return int(self.embed_dim * self.cls_mlp_ratio)

    @property
    def layer_scale_init(self) -> float:
        return layer_scale_init(self.depth) if self.init_values is None else float(self.init_values)


# ----------------------------------------------------------------------------- attention


class TalkingHeadAttention(nn.Module):
    """Self-attention with talking heads: logits mixed across heads before the softmax
    (``proj_l``), weights mixed after it (``proj_w``), each an H x H linear map with bias.

    The mixing after the softmax rules out the fused kernel; the returned weights are the
    mixed ones (what multiplies the values; rows need not sum to 1).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = Linear(dim, dim)
        self.proj_l = Linear(num_heads, num_heads)
        self.proj_w = Linear(num_heads, num_heads)
        self.attn_drop = float(attn_drop)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else None

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        logits = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, N, N)
        # Heads last, so the H x H maps are plain linear layers; the softmax runs over keys (dim 2).
        mixed = self.proj_l(logits.permute(0, 2, 3, 1)).softmax(dim=2)
        attn = self.proj_w(mixed).permute(0, 3, 1, 2)  # (B, H, N, N)
        weights = F.dropout(attn, self.attn_drop) if self.training and self.attn_drop else attn
        x = self.proj((weights @ v).transpose(1, 2).reshape(B, N, C))
        if self.proj_drop is not None:
            x = self.proj_drop(x)
        return x, attn if return_attention else None


class ClassAttention(nn.Module):
    """Class attention: the class token (row 0) queries [class, patches]; only it is updated.

    Separate ``q``, ``k``, ``v`` projections (timm's names); fused SDPA unless the weights
    are asked for, which are then (B, H, 1, 1 + patches).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, impl: str = "auto"):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.impl = impl
        self.q = Linear(dim, dim, bias=qkv_bias)
        self.k = Linear(dim, dim, bias=qkv_bias)
        self.v = Linear(dim, dim, bias=qkv_bias)
        self.proj = Linear(dim, dim)
        self.attn_drop = float(attn_drop)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else None

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        B, N, C = x.shape
        H, d = self.num_heads, self.head_dim
        q = self.q(x[:, :1]).reshape(B, 1, H, d).transpose(1, 2)
        k = self.k(x).reshape(B, N, H, d).transpose(1, 2)
        v = self.v(x).reshape(B, N, H, d).transpose(1, 2)
        attn = None
        if return_attention or self.impl == "explicit":
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            weights = F.dropout(attn, self.attn_drop) if self.training and self.attn_drop else attn
            out = weights @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        out = self.proj(out.transpose(1, 2).reshape(B, 1, C))
        if self.proj_drop is not None:
            out = self.proj_drop(out)
        return out, attn if return_attention else None


# ----------------------------------------------------------------------------- blocks


class LayerScaleBlock(nn.Module):
    """x + DropPath(gamma_1 * TalkingHeads(LN(x))), then x + DropPath(gamma_2 * MLP(LN(x)))."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, qkv_bias: bool, norm_eps: float,
                 init_values: float, proj_drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = TalkingHeadAttention(dim, num_heads, qkv_bias, attn_drop, proj_drop)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, mlp_dim, "exact", proj_drop)
        self.gamma_1 = nn.Parameter(torch.full((dim,), float(init_values)))
        self.gamma_2 = nn.Parameter(torch.full((dim,), float(init_values)))
        self.drop_path = float(drop_path)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        y, attn = self.attn(self.norm1(x), return_attention)
        x = x + drop_path(self.gamma_1 * y, self.drop_path, self.training)
        x = x + drop_path(self.gamma_2 * self.mlp(self.norm2(x)), self.drop_path, self.training)
        return x, attn


class ClassAttentionBlock(nn.Module):
    """The class token only: cls + gamma_1 * CA(LN([cls, x])), then cls + gamma_2 * MLP(LN(cls))."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, qkv_bias: bool, norm_eps: float,
                 init_values: float, attn_impl: str = "auto"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = ClassAttention(dim, num_heads, qkv_bias, impl=attn_impl)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, mlp_dim, "exact")
        self.gamma_1 = nn.Parameter(torch.full((dim,), float(init_values)))
        self.gamma_2 = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor, cls: torch.Tensor, return_attention: bool = False):
        y, attn = self.attn(self.norm1(torch.cat((cls, x), dim=1)), return_attention)
        cls = cls + self.gamma_1 * y
        cls = cls + self.gamma_2 * self.mlp(self.norm2(cls))
        return cls, attn


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ClassAttentionLayers(LayerGroups):
    """CaiT's layers for layer-wise decay, as timm's ``group_matcher`` numbers them: the class-attention blocks
    overlap the last self-attention blocks (``blocks_token_only.i``: layer ``i + depth - token_only + 1``) and the
    final norm is the last block's; they took the head's full rate (x1 where timm's gives 0.25 and 0.5)."""

    token_only: int = 2

    def layer_of(self, name: str, depth: int) -> int:
        if name.startswith("blocks_token_only."):
            return int(name.split(".")[1]) + depth - self.token_only + 1
        if name.startswith("norm."):
            return depth
        return super().layer_of(name, depth)


class CaiT(TokenModel):
    """CaiT: patch embedding + positions, talking-heads LayerScale layers on the patches,
    class-attention layers for the class token, final LayerNorm on [class, patches], head.

    ``model(x)`` -> logits; ``model(x, return_attention=True)`` -> ``(logits, maps)`` with
    ``depth`` self-attention maps (B, H, N, N) over the patches, then ``cls_depth``
    class-attention maps (B, H, 1, 1 + N). ``forward_intermediates`` indices count the
    self-attention layers only (the class-attention layers update just the class token).
    """

    config_cls = CaiTConfig

    def __init__(self, config: Optional[CaiTConfig] = None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg, D = self.config, self.config.embed_dim
        self.num_prefix_tokens = 1  # in the output sequence [class, patches]
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        positions.build(self, "learned", cfg.table_grid, D)  # the table covers the patches only
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate) if cfg.pos_drop_rate > 0 else None
        eps = cfg.layer_scale_init
        self.blocks = nn.ModuleList([
            LayerScaleBlock(D, cfg.num_heads, cfg.mlp_dim, cfg.qkv_bias, cfg.norm_eps, eps,
                            cfg.proj_drop_rate, cfg.attn_drop_rate, cfg.drop_path_rate)
            for _ in range(cfg.depth)])
        self.blocks_token_only = nn.ModuleList([
            ClassAttentionBlock(D, cfg.num_heads, cfg.cls_mlp_dim, cfg.qkv_bias, cfg.norm_eps, eps, cfg.attn_impl)
            for _ in range(cfg.cls_depth)])
        self.norm = nn.LayerNorm(D, eps=cfg.norm_eps)
        self.head_drop = nn.Dropout(cfg.drop_rate) if cfg.drop_rate > 0 else None
        self.head = self._new_head(cfg.num_classes)
        self.layer_groups = ClassAttentionLayers(embed=TokenModel.layer_groups.embed, token_only=cfg.cls_depth)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """As the official code (and timm): linear weights truncated N(0, 0.02) with zero
        biases (the talking-heads maps too), LayerNorm 1/0, class token and positions
        truncated N(0, 0.02), PyTorch's default for the patch convolution; LayerScale at
        its epsilon (set in the constructor)."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02, a=-2.0, b=2.0)
        nn.init.trunc_normal_(self.cls_token, std=0.02, a=-2.0, b=2.0)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02, a=-2.0, b=2.0)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _finish(self, x: torch.Tensor, attns: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """Patch tokens -> normalised [class, patches] after the class-attention layers
        (their maps appended to ``attns`` when given)."""
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        for blk in self.blocks_token_only:
            cls, attn = self._checkpointed(blk, x, cls, attns is not None)
            if attns is not None:
                attns.append(attn)
        return self.norm(torch.cat((cls, x), dim=1))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits; ``pre_logits=True`` stops at the pooled features (head dropout after pooling)."""
        x = self.pool(x)
        if self.head_drop is not None:
            x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def extra_repr(self) -> str:
        c = self.config
        return (f"img_size={c.img_size}, patch_size={c.patch_size}, grid={self.patch_embed.grid_size}, "
                f"depth={c.depth}+{c.cls_depth}, layer_scale={c.layer_scale_init:g}")


# ----------------------------------------------------------------------------- cost, shapes


def cait_macs(config: CaiTConfig) -> Tuple[int, int]:
    """(total MACs, attention-mixing MACs) of one image: the matrix products, as
    ``torch.utils.flop_counter`` counts them (the talking-heads maps are H x H products
    over every query-key pair)."""
    D, H = config.embed_dim, config.num_heads
    gh, gw = config.grid_size
    n = gh * gw
    (ph, pw), C = config.patch_size, config.in_chans
    embed = n * D * C * ph * pw
    sa_mix = 2 * n * n * D + 2 * n * n * H * H  # q k^T, attn v; proj_l and proj_w
    sa = 3 * n * D * D + sa_mix + n * D * D + 2 * n * D * config.mlp_dim
    ca_mix = 2 * (n + 1) * D  # one query over 1 + n keys
    ca = D * D + 2 * (n + 1) * D * D + ca_mix + D * D + 2 * D * config.cls_mlp_dim
    total = embed + config.depth * sa + config.cls_depth * ca + D * config.num_classes
    return total, config.depth * sa_mix + config.cls_depth * ca_mix


def cait_complexity(config: CaiTConfig) -> Complexity:
    """``tokens`` and the attention entries are those of the self-attention layers (patches
    only; the class token joins in the ``cls_depth`` class-attention layers, whose cost is in
    ``macs``); ``depth`` counts the self-attention layers."""
    gh, gw = config.grid_size
    return token_complexity(config, *cait_macs(config), tokens=gh * gw)


def cait_timm_args(args: Mapping[str, Any], config: CaiTConfig) -> Dict[str, Any]:
    """timm's Cait ``model_args`` -> CaiTConfig fields."""
    kw = {k: args[k] for k in ("embed_dim", "init_values", "mlp_ratio") if args.get(k) is not None}
    if "depth_token_only" in args:
        kw["cls_depth"] = int(args["depth_token_only"])
    if "mlp_ratio_token_only" in args:
        kw["cls_mlp_ratio"] = args["mlp_ratio_token_only"]
    return kw


def infer_cait_config(sd: Mapping[str, Any], **overrides: Any) -> CaiTConfig:
    """A CaiT's config from a timm-named state dict alone: width and patch from the patch
    projection, heads from the talking-heads map (H x H), depths from the block indices,
    MLP ratios from ``fc1``, image size from the (square) position table, LayerScale
    epsilon by the paper's rule (it only sets the initial value)."""
    need = ("patch_embed.proj.weight", "pos_embed", "blocks.0.attn.proj_l.weight", "blocks_token_only.0.attn.q.weight")
    missing = [k for k in need if k not in sd]
    if missing:
        raise ValueError(f"not a CaiT state dict: missing {', '.join(missing)}")
    D, C, ph, pw = (int(s) for s in sd["patch_embed.proj.weight"].shape)
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    cls_depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks_token_only."))
    heads = int(sd["blocks.0.attn.proj_l.weight"].shape[0])
    ratios = []
    for key in ("blocks.0.mlp.fc1.weight", "blocks_token_only.0.mlp.fc1.weight"):
        hidden = int(sd[key].shape[0])
        ratio = hidden / D
        if int(D * ratio) != hidden:
            raise ValueError(f"{key}: MLP width {hidden} is not int({D} * ratio) for any float ratio")
        ratios.append(ratio)
    n = int(sd["pos_embed"].shape[1])
    side = int(round(n ** 0.5))
    kw: Dict[str, Any] = dict(embed_dim=D, in_chans=C, patch_size=(ph, pw), depth=depth, cls_depth=cls_depth,
                              num_heads=heads, mlp_ratio=ratios[0], cls_mlp_ratio=ratios[1],
                              qkv_bias="blocks.0.attn.qkv.bias" in sd,
                              num_classes=int(sd["head.weight"].shape[0]) if "head.weight" in sd else 0)
    if side * side == n:
        kw["img_size"] = (side * ph, side * pw)
    elif "img_size" not in overrides:
        raise ValueError(f"cannot infer the image size from a position table of {n} patches "
                         f"(not a square grid); pass img_size=")
    kw.update(overrides)
    return CaiTConfig(**kw)


def is_cait_state_dict(keys: Collection[str]) -> bool:
    return any(str(k).startswith("blocks_token_only.") for k in keys)


# ----------------------------------------------------------------------------- registry

#: timm's CaiT models: (name, width, depth, heads, image size, LayerScale epsilon). The
#: epsilons are the official code's (= timm's ``init_values``): the paper's rule, except the
#: 36-layer XXS models, which were trained with 1e-5.
CAIT_VARIANTS = [
    ("cait_xxs24_224", 192, 24, 4, 224, 1e-5), ("cait_xxs24_384", 192, 24, 4, 384, 1e-5),
    ("cait_xxs36_224", 192, 36, 4, 224, 1e-5), ("cait_xxs36_384", 192, 36, 4, 384, 1e-5),
    ("cait_xs24_384", 288, 24, 6, 384, 1e-5),
    ("cait_s24_224", 384, 24, 8, 224, 1e-5), ("cait_s24_384", 384, 24, 8, 384, 1e-5),
    ("cait_s36_384", 384, 36, 8, 384, 1e-6),
    ("cait_m36_384", 768, 36, 16, 384, 1e-6), ("cait_m48_448", 768, 48, 16, 448, 1e-6),
]


FAMILY = register_family(Family(
    name="cait", config_cls=CaiTConfig, model_cls=CaiT, complexity=cait_complexity, matches=is_cait_state_dict,
    infer_config=infer_cait_config, detect_priority=10, timm_args=cait_timm_args))

for _name, _width, _depth, _heads, _size, _eps in CAIT_VARIANTS:
    register_model(_name, CaiTConfig(img_size=_size, patch_size=16, embed_dim=_width, depth=_depth,
                                     num_heads=_heads, init_values=_eps),
                   f"CaiT-{_name.split('_')[1].upper()} ({_depth} + 2 class-attention layers) at {_size} px")


__all__ = ["CaiTConfig", "CaiT", "TalkingHeadAttention", "ClassAttention", "LayerScaleBlock",
           "ClassAttentionBlock", "layer_scale_init", "cait_macs", "cait_complexity", "cait_timm_args",
           "infer_cait_config", "is_cait_state_dict", "CAIT_VARIANTS", "FAMILY"]
