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
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config_base import ConfigMixin
from .layers import (
    IntPair,
    Linear,
    Mlp,
    PatchEmbed,
    drop_path,
    intermediates_plan,
    patch_tokens_as,
    resample_pos_embed,
    to_2tuple,
)
from .serialize import SaveMixin

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
GLOBAL_POOLS = ("token", "avg")


def layer_scale_init(depth: int) -> float:
    """The paper's LayerScale epsilon for a network of ``depth`` self-attention layers
    (section 3.1): 0.1 up to depth 18, 1e-5 at depth 24, 1e-6 deeper. The released models
    (official code = timm) follow it except XXS-36, trained with 1e-5: the registered names
    carry their own value (``CAIT_VARIANTS``)."""
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


@dataclass
class CaiTConfig(ConfigMixin):
    KIND = "CaiT"

    """Everything needed to rebuild a CaiT, plus the preprocessing its weights expect.

    Defaults are ``cait_xxs24_224``. MLP widths are timm's ``int(embed_dim * mlp_ratio)``.
    ``init_values=None`` takes the paper's LayerScale epsilon for ``depth``.
    """

    img_size: Tuple[int, int] = (224, 224)
    patch_size: Tuple[int, int] = (16, 16)
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 192
    depth: int = 24
    num_heads: int = 4
    mlp_ratio: float = 4.0
    #: class-attention layers (timm's ``depth_token_only``) and their MLP ratio
    cls_depth: int = 2
    cls_mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    init_values: Optional[float] = None
    global_pool: str = "token"
    #: timm's dropouts: head (``drop_rate``), after the position embedding, after the
    #: attention/MLP projections and on the attention weights of the self-attention layers
    #: (the class-attention layers have none, as in timm and the official code).
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    #: stochastic depth, the same rate in every self-attention layer (the official code)
    drop_path_rate: float = 0.0
    #: class attention: 'auto'/'sdpa' fused, 'explicit' softmax; talking heads are always explicit
    attn_impl: str = "auto"
    dynamic_img_size: bool = False
    pos_embed_interpolation: str = "bicubic"
    pos_embed_antialias: bool = True
    # ---- what the weights expect at the input, and what their outputs mean
    mean: Tuple[float, ...] = IMAGENET_MEAN
    std: Tuple[float, ...] = IMAGENET_STD
    crop_pct: float = 1.0
    interpolation: str = "bicubic"
    label_names: Optional[List[str]] = None
    architecture: str = "cait"
    name: Optional[str] = None

    def __post_init__(self) -> None:
        self.img_size = to_2tuple(self.img_size)
        self.patch_size = to_2tuple(self.patch_size)
        self.validate()

    def validate(self) -> None:
        problems = []
        if self.architecture != "cait":
            problems.append(f"architecture must be 'cait', got {self.architecture!r}")
        if self.global_pool not in GLOBAL_POOLS:
            problems.append(f"global_pool must be one of {GLOBAL_POOLS}, got {self.global_pool!r}")
        for name in ("embed_dim", "depth", "num_heads", "in_chans"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                problems.append(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.cls_depth, int) or self.cls_depth < 1:
            problems.append(f"cls_depth must be >= 1 (the class token joins in the class-attention "
                            f"layers), got {self.cls_depth!r}")
        if isinstance(self.num_heads, int) and self.num_heads > 0 and isinstance(self.embed_dim, int) \
                and self.embed_dim % self.num_heads:
            problems.append(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        for name in ("mlp_ratio", "cls_mlp_ratio"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.init_values is not None and not self.init_values > 0:
            problems.append(f"init_values (LayerScale epsilon) must be > 0 or None, got {self.init_values!r}")
        problems += self._token_problems(("drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate",
                                          "drop_path_rate"))
        problems += self._patch_grid_problems()
        if self.num_classes < 0:
            problems.append(f"num_classes must be >= 0, got {self.num_classes}")
        problems += self._io_problems()
        if problems:
            raise ValueError("invalid CaiT config: " + "; ".join(problems))

    @property
    def mlp_dim(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def cls_mlp_dim(self) -> int:
        return int(self.embed_dim * self.cls_mlp_ratio)

    @property
    def layer_scale_init(self) -> float:
        return layer_scale_init(self.depth) if self.init_values is None else float(self.init_values)

    @property
    def grid_size(self) -> IntPair:
        return (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])

    @property
    def token_patch_size(self) -> IntPair:
        return self.patch_size

    @property
    def class_token(self) -> bool:
        return True


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
        self.gamma_1 = nn.Parameter(init_values * torch.ones(dim))
        self.gamma_2 = nn.Parameter(init_values * torch.ones(dim))
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
        self.gamma_1 = nn.Parameter(init_values * torch.ones(dim))
        self.gamma_2 = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor, cls: torch.Tensor, return_attention: bool = False):
        y, attn = self.attn(self.norm1(torch.cat((cls, x), dim=1)), return_attention)
        cls = cls + self.gamma_1 * y
        cls = cls + self.gamma_2 * self.mlp(self.norm2(cls))
        return cls, attn


# ----------------------------------------------------------------------------- the model


class CaiT(SaveMixin, nn.Module):
    """CaiT: patch embedding + positions, talking-heads LayerScale layers on the patches,
    class-attention layers for the class token, final LayerNorm on [class, patches], head.

    ``model(x)`` -> logits; ``model(x, return_attention=True)`` -> ``(logits, maps)`` with
    ``depth`` self-attention maps (B, H, N, N) over the patches, then ``cls_depth``
    class-attention maps (B, H, 1, 1 + N).
    """

    def __init__(self, config: Optional[CaiTConfig] = None, **overrides: Any):
        super().__init__()
        cfg = (config or CaiTConfig()).replace(**overrides) if overrides else (config or CaiTConfig())
        self.config = cfg
        D = cfg.embed_dim
        self.embed_dim = self.num_features = D
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.dynamic_img_size = cfg.dynamic_img_size
        self.grad_checkpointing = False
        self.num_prefix_tokens = 1  # in the output sequence [class, patches]
        self.pos_embed_prefix_tokens = 0  # the position table covers the patches only

        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, D))
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
        self.init_weights()

    def _new_head(self, num_classes: int) -> nn.Module:
        return Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

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

    # ------------------------------------------------------------------ public API

    @property
    def patch_size(self) -> IntPair:
        return self.patch_embed.patch_size

    def no_weight_decay(self) -> set:
        return {"pos_embed", "cls_token"}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = bool(enable)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """Replace the head by a zero-initialised linear layer (0: the model returns features)."""
        if global_pool is not None:
            if global_pool not in GLOBAL_POOLS:
                raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {global_pool!r}")
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = self._new_head(num_classes).to(self.patch_embed.proj.weight.device)
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        # replace() drops label names that no longer fit the class count
        self.config = self.config.replace(num_classes=num_classes, global_pool=self.global_pool)

    @torch.no_grad()
    def set_input_size(self, img_size: Union[int, Sequence[int]]) -> None:
        """Change the native input size; the position table is resampled in place."""
        img_size = to_2tuple(img_size)
        old_grid = self.patch_embed.grid_size
        self.patch_embed.set_img_size(img_size)
        cfg = self.config
        new = resample_pos_embed(self.pos_embed.data, self.patch_embed.grid_size, old_grid, 0,
                                 cfg.pos_embed_interpolation, cfg.pos_embed_antialias)
        self.pos_embed = nn.Parameter(new)
        self.config = cfg.replace(img_size=img_size)

    def patch_pos_embed(self, grid: IntPair) -> torch.Tensor:
        """The (1, gh*gw, D) position embedding of the patches for a grid."""
        cfg = self.config
        return resample_pos_embed(self.pos_embed, grid, self.patch_embed.grid_size, 0,
                                  cfg.pos_embed_interpolation, cfg.pos_embed_antialias)

    # ------------------------------------------------------------------ forward pieces

    def embed(self, x: torch.Tensor) -> Tuple[torch.Tensor, IntPair]:
        """Images -> patch tokens with positions (no class token yet), and the grid."""
        x = self.patch_embed(x, strict=not self.dynamic_img_size)
        B, gh, gw, D = x.shape
        x = x.reshape(B, gh * gw, D)
        if (gh, gw) == self.patch_embed.grid_size:
            x = x + self.pos_embed
        else:
            x = x + self.patch_pos_embed((gh, gw))
        if self.pos_drop is not None:
            x = self.pos_drop(x)
        return x, (gh, gw)

    def _run(self, blk: nn.Module, *args):
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            return checkpoint(blk, *args, use_reentrant=False)
        return blk(*args)

    def encode(self, x: torch.Tensor, return_attention: bool = False):
        """Images -> final normalised tokens [class, patches] (B, 1 + N, D), and the maps."""
        x, _ = self.embed(x)
        attns: List[torch.Tensor] = []
        for blk in self.blocks:
            x, attn = self._run(blk, x, return_attention)
            if return_attention:
                attns.append(attn)
        return self._class_attention(x, attns if return_attention else None), attns

    def _class_attention(self, x: torch.Tensor, attns: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """Patch tokens -> normalised [class, patches] after the class-attention layers
        (their maps appended to ``attns`` when given)."""
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        for blk in self.blocks_token_only:
            cls, attn = self._run(blk, x, cls, attns is not None)
            if attns is not None:
                attns.append(attn)
        return self.norm(torch.cat((cls, x), dim=1))

    def forward_intermediates(self, x: torch.Tensor, indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
                              stop_early: bool = False):
        """Patch tokens after chosen self-attention layers (timm's contract for CaiT).

        ``indices`` count the self-attention layers only (the class-attention layers update
        just the class token). Returns ``(final tokens, intermediates)`` -- the final tokens
        after the class-attention layers, as :meth:`forward_features` -- or only the
        intermediates, each (B, D, gh, gw) for NCHW or (B, gh*gw, D) for NLC.
        """
        take, last = intermediates_plan(len(self.blocks), indices, output_fmt, stop_early, intermediates_only)
        x, grid = self.embed(x)
        outs = []
        for i, blk in enumerate(self.blocks[: last + 1]):
            x, _ = self._run(blk, x, False)
            if i in take:
                outs.append(patch_tokens_as(self.norm(x) if norm else x, grid, output_fmt))
        if intermediates_only:
            return outs
        return self._class_attention(x), outs

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode(x)[0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits; ``pre_logits=True`` stops at the pooled features."""
        x = x[:, 1:].mean(dim=1) if self.global_pool == "avg" else x[:, 0]
        if self.head_drop is not None:
            x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        tokens, attns = self.encode(x, return_attention)
        logits = self.forward_head(tokens)
        return (logits, attns) if return_attention else logits

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


def is_cait_state_dict(keys) -> bool:
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


# registry.py imports this module at its end (after its own definitions), so the names are there.
from .registry import register_architecture, register_model  # noqa: E402

register_architecture("cait", CaiTConfig, CaiT)
for _name, _width, _depth, _heads, _size, _eps in CAIT_VARIANTS:
    register_model(_name, CaiTConfig(img_size=_size, patch_size=16, embed_dim=_width, depth=_depth,
                                     num_heads=_heads, init_values=_eps),
                   f"CaiT-{_name.split('_')[1].upper()} ({_depth} + 2 class-attention layers) at {_size} px")


__all__ = ["CaiTConfig", "CaiT", "TalkingHeadAttention", "ClassAttention", "LayerScaleBlock",
           "ClassAttentionBlock", "layer_scale_init", "cait_macs", "infer_cait_config", "is_cait_state_dict",
           "CAIT_VARIANTS"]
