"""The Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., 2021).

One configurable class covers the paper's model and its common variants (pooling, position
embeddings, LayerScale, the tanh pre-logits layer). Every architectural choice lives in
:class:`ViTConfig`, which is what ``config.json`` stores next to the weights.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config_base import ConfigMixin
from .hybrid import (
    HybridEmbed,
    backbone_feature_size,
    backbone_reduction,
    describe_backbone,
    init_backbone_,
    normalize_backbone,
)
from .layers import (
    Block,
    IntPair,
    Linear,
    PatchEmbed,
    intermediates_plan,
    lecun_normal_,
    patch_tokens_as,
    resample_pos_embed,
    resample_pos_embed_grid,
    sincos_2d_pos_embed,
    to_2tuple,
    xavier_uniform_fan,
)
from .serialize import SaveMixin

POS_EMBEDS = ("learned", "learned_2d", "sincos2d", "none")
GLOBAL_POOLS = ("token", "avg")

# Normalisation constants of the two weight families (see DESIGN: inputs travel with weights).
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class ViTConfig(ConfigMixin):
    KIND = "ViT"

    """Everything needed to rebuild a ViT, plus the preprocessing its weights expect."""

    img_size: Tuple[int, int] = (224, 224)
    patch_size: Tuple[int, int] = (16, 16)
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    global_pool: str = "token"
    class_token: bool = True
    #: DeiT's distillation token: a second prefix token with its own head (``head_dist``),
    #: trained against a teacher; inference averages the two heads.
    distill_token: bool = False
    #: LayerNorm after pooling (timm's ``fc_norm``) instead of before it; None = avg pool only.
    fc_norm: Optional[bool] = None
    pos_embed: str = "learned"
    representation_size: Optional[int] = None
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    gelu: str = "exact"
    #: Dropout as the official code places it: after the embeddings, the attention output
    #: and inside the MLP (timm's ``drop_rate`` is a head dropout instead).
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    init_values: Optional[float] = None
    #: 'auto' (fused SDPA; the explicit path for CPU training, faster there), 'sdpa', 'explicit'.
    attn_impl: str = "auto"
    dynamic_img_size: bool = False
    #: How position embeddings are resampled for a new grid (dynamic size, set_input_size).
    pos_embed_interpolation: str = "bicubic"
    pos_embed_antialias: bool = True
    # ---- what the weights expect at the input, and what their outputs mean
    mean: Tuple[float, ...] = INCEPTION_MEAN
    std: Tuple[float, ...] = INCEPTION_STD
    crop_pct: float = 0.9
    interpolation: str = "bicubic"
    label_names: Optional[List[str]] = None
    #: A CNN run before the patch embedding (the paper's hybrid, section 3.1), as a JSON-able
    #: dict: ``{"type": "resnetv2", "layers": [3, 4, 9], "width_factor": 1}`` (see
    #: :mod:`vitkit.models.hybrid`). ``patch_size`` then tiles the CNN's feature map (1 for
    #: most hybrids) and the grid is (feature map) / patch_size.
    backbone: Optional[Dict[str, Any]] = None
    architecture: str = "vit"
    name: Optional[str] = None

    def __post_init__(self) -> None:
        self.img_size = to_2tuple(self.img_size)
        self.patch_size = to_2tuple(self.patch_size)
        if self.backbone is not None:
            try:
                self.backbone = normalize_backbone(self.backbone)
            except ValueError as e:
                raise ValueError(f"invalid ViT config: {e}") from None
        self.validate()

    def validate(self) -> None:
        problems = []
        if self.global_pool not in GLOBAL_POOLS:
            problems.append(f"global_pool must be one of {GLOBAL_POOLS}, got {self.global_pool!r}")
        if self.pos_embed not in POS_EMBEDS:
            problems.append(f"pos_embed must be one of {POS_EMBEDS}, got {self.pos_embed!r}")
        if self.global_pool == "token" and not self.class_token:
            problems.append("global_pool='token' needs class_token=True (or use global_pool='avg')")
        if self.distill_token and not (self.class_token and self.global_pool == "token"
                                       and not self.representation_size):
            problems.append("distill_token=True is DeiT's layout: it needs class_token=True, "
                            "global_pool='token' and no representation_size")
        if self.gelu not in ("exact", "tanh"):
            problems.append(f"gelu must be 'exact' or 'tanh', got {self.gelu!r}")
        if self.embed_dim % self.num_heads:
            problems.append(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.pos_embed == "learned_2d" and self.embed_dim % 2:
            problems.append("pos_embed='learned_2d' needs an even embed_dim")
        if self.pos_embed == "sincos2d" and self.embed_dim % 4:
            problems.append("pos_embed='sincos2d' needs embed_dim divisible by 4")
        problems += self._token_problems()
        if self.backbone is None:
            problems += self._patch_grid_problems()
        elif min(self.img_size) > 0 and min(self.patch_size) > 0:
            feat = backbone_feature_size(self.backbone, self.img_size)
            if any(f % p for f, p in zip(feat, self.patch_size)):
                step = backbone_reduction(self.backbone)
                problems.append(f"img_size {self.img_size} gives a {feat[0]}x{feat[1]} backbone feature map "
                                f"(stride {step}), not divisible by patch_size {self.patch_size}; use a "
                                f"multiple of {step * self.patch_size[0]}x{step * self.patch_size[1]}")
        if self.num_classes < 0 or self.depth <= 0 or self.in_chans <= 0:
            problems.append("num_classes must be >= 0, depth and in_chans > 0")
        problems += self._io_problems()
        if problems:
            raise ValueError("invalid ViT config: " + "; ".join(problems))

    @property
    def use_fc_norm(self) -> bool:
        return self.global_pool == "avg" if self.fc_norm is None else bool(self.fc_norm)

    @property
    def grid_size(self) -> IntPair:
        if self.backbone is not None:
            fh, fw = backbone_feature_size(self.backbone, self.img_size)
            return (fh // self.patch_size[0], fw // self.patch_size[1])
        return (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])

    @property
    def token_patch_size(self) -> IntPair:
        """Pixels per token side: the patch size, times the backbone's stride for hybrids."""
        r = backbone_reduction(self.backbone) if self.backbone is not None else 1
        return (r * self.patch_size[0], r * self.patch_size[1])


class VisionTransformer(SaveMixin, nn.Module):
    """ViT: patch embedding, [class] token, position embeddings, pre-LN encoder, head.

    ``model(x)`` -> logits (B, num_classes) or pooled features when ``num_classes == 0``.
    ``model(x, return_attention=True)`` -> ``(logits, [per-layer (B, heads, N, N)])``.
    """

    def __init__(self, config: Optional[ViTConfig] = None, **overrides: Any):
        super().__init__()
        cfg = (config or ViTConfig()).replace(**overrides) if overrides else (config or ViTConfig())
        self.config = cfg
        D = cfg.embed_dim
        self.embed_dim = self.num_features = D
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.dynamic_img_size = cfg.dynamic_img_size
        self.grad_checkpointing = False

        if cfg.backbone is not None:
            # The hybrid: a CNN, then a patch_size projection of its feature map.
            self.patch_embed = HybridEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, cfg.backbone)
        else:
            self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distill_token else None
        self.num_prefix_tokens = int(cfg.class_token) + int(cfg.distill_token)
        #: DeiT: while training with a teacher, return (class logits, distillation logits).
        self.distilled_training = False
        self._build_pos_embed()
        self.pos_drop = nn.Dropout(cfg.drop_rate) if cfg.drop_rate > 0 else None

        rates = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]  # linear
        self.blocks = nn.ModuleList([
            Block(D, cfg.num_heads, cfg.mlp_dim, cfg.qkv_bias, cfg.norm_eps, cfg.gelu,
                  cfg.drop_rate, cfg.attn_drop_rate, rates[i], cfg.init_values, cfg.attn_impl)
            for i in range(cfg.depth)])
        use_fc_norm = cfg.use_fc_norm
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(D, eps=cfg.norm_eps)
        self.fc_norm = nn.LayerNorm(D, eps=cfg.norm_eps) if use_fc_norm else nn.Identity()
        if cfg.representation_size:
            self.pre_logits = nn.Sequential(OrderedDict(
                fc=nn.Linear(D, cfg.representation_size), act=nn.Tanh()))
            self.num_features = cfg.representation_size
        else:
            self.pre_logits = nn.Identity()
        self.head = self._new_head(cfg.num_classes)
        self.head_dist = self._new_head(cfg.num_classes) if cfg.distill_token else None
        self.init_weights()

    # ------------------------------------------------------------------ construction

    def _build_pos_embed(self) -> None:
        cfg, D = self.config, self.config.embed_dim
        gh, gw = self.patch_embed.grid_size
        self.pos_embed = self.pos_embed_row = self.pos_embed_col = None
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + gh * gw, D))
        elif cfg.pos_embed == "learned_2d":
            # The paper's 2D ablation: a row and a column table of D/2 each, concatenated.
            self.pos_embed_row = nn.Parameter(torch.zeros(1, gh, D // 2))
            self.pos_embed_col = nn.Parameter(torch.zeros(1, gw, D // 2))
        elif cfg.pos_embed == "sincos2d":
            self.register_buffer("pos_embed_fixed", sincos_2d_pos_embed((gh, gw), D), persistent=False)

    def _new_head(self, num_classes: int) -> nn.Module:
        return Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise as the official JAX code does (vit_jax ``models_vit.py``).

        - patch embedding: LeCun normal (Flax Conv default), bias 0;
        - class token 0; learned position embeddings N(0, 0.02);
        - q, k, v, out, MLP kernels: Xavier uniform, each q/k/v its own D x D kernel (the
          official code keeps them separate, so the fused matrix is initialised in thirds);
          attention biases 0, MLP biases N(0, 1e-6);
        - pre-logits: LeCun normal, bias 0; classifier head: zeros (official ``head_kernel_init``);
        - a hybrid's CNN: LeCun-normal kernels, GroupNorm scale 1 and bias 0 (Flax defaults).
        """
        D = self.embed_dim
        lecun_normal_(self.patch_embed.proj.weight)
        nn.init.zeros_(self.patch_embed.proj.bias)
        if isinstance(self.patch_embed, HybridEmbed):
            init_backbone_(self.patch_embed.backbone)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        for p in (self.pos_embed, self.pos_embed_row, self.pos_embed_col, self.dist_token):
            if p is not None:
                nn.init.normal_(p, std=0.02)
        for blk in self.blocks:
            for part in blk.attn.qkv.weight.split(D, dim=0):
                xavier_uniform_fan(part, D, D)
            if blk.attn.qkv.bias is not None:
                nn.init.zeros_(blk.attn.qkv.bias)
            xavier_uniform_fan(blk.attn.proj.weight, D, D)
            nn.init.zeros_(blk.attn.proj.bias)
            for fc in (blk.mlp.fc1, blk.mlp.fc2):
                xavier_uniform_fan(fc.weight, fc.in_features, fc.out_features)
                nn.init.normal_(fc.bias, std=1e-6)
        if isinstance(self.pre_logits, nn.Sequential):
            lecun_normal_(self.pre_logits.fc.weight)
            nn.init.zeros_(self.pre_logits.fc.bias)
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    # ------------------------------------------------------------------ public API

    @property
    def patch_size(self) -> IntPair:
        """Pixels per token side (for a hybrid: backbone stride x projection patch)."""
        return self.patch_embed.patch_size

    def no_weight_decay(self) -> set:
        """Parameters the paper's recipes exempt from weight decay."""
        names = {"cls_token", "dist_token", "pos_embed", "pos_embed_row", "pos_embed_col"}
        return {n for n, _ in self.named_parameters() if n in names}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = bool(enable)

    def set_distilled_training(self, enable: bool = True) -> None:
        """DeiT: in training mode, return both heads' logits for the distillation loss."""
        if enable and self.dist_token is None:
            raise ValueError("distilled training needs a model with a distillation token (distill_token=True)")
        self.distilled_training = bool(enable)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """Replace the head by a zero-initialised linear layer (the paper's fine-tuning)."""
        if global_pool is not None and global_pool != self.global_pool:
            if global_pool not in GLOBAL_POOLS:
                raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("global_pool='token' needs a class token")
            self.global_pool = global_pool
        self.num_classes = num_classes
        device = self.patch_embed.proj.weight.device
        self.head = self._new_head(num_classes).to(device)
        if self.dist_token is not None:
            self.head_dist = self._new_head(num_classes).to(device)
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)
        # replace() drops label names that no longer fit the class count
        self.config = self.config.replace(num_classes=num_classes, global_pool=self.global_pool)

    @torch.no_grad()
    def set_input_size(self, img_size: Union[int, Sequence[int]]) -> None:
        """Change the native input size; learned position embeddings are resampled in place."""
        img_size = to_2tuple(img_size)
        old_grid = self.patch_embed.grid_size
        self.patch_embed.set_img_size(img_size)
        new_grid = self.patch_embed.grid_size
        cfg = self.config
        if self.pos_embed is not None:
            new = resample_pos_embed(self.pos_embed.data, new_grid, old_grid, self.num_prefix_tokens,
                                     cfg.pos_embed_interpolation, cfg.pos_embed_antialias)
            self.pos_embed = nn.Parameter(new)
        if self.pos_embed_row is not None:
            row, col = self._resample_2d_tables(new_grid)
            self.pos_embed_row, self.pos_embed_col = nn.Parameter(row), nn.Parameter(col)
        if cfg.pos_embed == "sincos2d":
            self.pos_embed_fixed = sincos_2d_pos_embed(new_grid, self.embed_dim).to(
                self.pos_embed_fixed.device)
        self.config = cfg.replace(img_size=img_size)

    # ------------------------------------------------------------------ forward pieces

    def _resample_2d_tables(self, grid: IntPair) -> Tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        row = resample_pos_embed_grid(self.pos_embed_row.unsqueeze(2), (grid[0], 1),
                                      cfg.pos_embed_interpolation, cfg.pos_embed_antialias)
        col = resample_pos_embed_grid(self.pos_embed_col.unsqueeze(1), (1, grid[1]),
                                      cfg.pos_embed_interpolation, cfg.pos_embed_antialias)
        return row.squeeze(2), col.squeeze(1)

    def patch_pos_embed(self, grid: IntPair) -> Optional[torch.Tensor]:
        """The (1, gh*gw, D) position embedding of the patch tokens for a grid."""
        cfg = self.config
        if self.pos_embed is not None:
            table = self.pos_embed[:, self.num_prefix_tokens:]
            return resample_pos_embed(table, grid, self.patch_embed.grid_size, 0,
                                      cfg.pos_embed_interpolation, cfg.pos_embed_antialias)
        if self.pos_embed_row is not None:
            row, col = self.pos_embed_row, self.pos_embed_col
            if (row.shape[1], col.shape[1]) != tuple(grid):
                row, col = self._resample_2d_tables(grid)
            gh, gw = grid
            full = torch.cat([row[:, :, None, :].expand(-1, gh, gw, -1),
                              col[:, None, :, :].expand(-1, gh, gw, -1)], dim=-1)
            return full.reshape(1, gh * gw, -1)
        if cfg.pos_embed == "sincos2d":
            if tuple(grid) != self.patch_embed.grid_size:
                return sincos_2d_pos_embed(grid, self.embed_dim).to(self.pos_embed_fixed)
            return self.pos_embed_fixed
        return None

    def prefix_tokens(self, batch: int) -> List[torch.Tensor]:
        """Tokens that precede the patches: class, then DeiT's distillation token."""
        return [t.expand(batch, -1, -1) for t in (self.cls_token, self.dist_token) if t is not None]

    def embed(self, x: torch.Tensor) -> Tuple[torch.Tensor, IntPair]:
        """Images -> token sequence with position information, and the patch grid."""
        x = self.patch_embed(x, strict=not self.dynamic_img_size)
        B, gh, gw, D = x.shape
        x = x.reshape(B, gh * gw, D)
        prefix = self.prefix_tokens(B)
        if self.pos_embed is not None and (gh, gw) == self.patch_embed.grid_size:
            # The common case: the stored table (with its class slot) as it is.
            if prefix:
                x = torch.cat(prefix + [x], dim=1)
            x = x + self.pos_embed
        else:
            pos = self.patch_pos_embed((gh, gw))
            if pos is not None:
                x = x + pos
            if self.pos_embed is not None and self.num_prefix_tokens:
                prefix = [t + self.pos_embed[:, i:i + 1] for i, t in enumerate(prefix)]
            if prefix:
                x = torch.cat(prefix + [x], dim=1)
        if self.pos_drop is not None:
            x = self.pos_drop(x)
        return x, (gh, gw)

    def _run_block(self, blk: Block, x: torch.Tensor, return_attention: bool):
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            return checkpoint(blk, x, return_attention, use_reentrant=False)
        return blk(x, return_attention)

    def encode(self, x: torch.Tensor, return_attention: bool = False):
        """Images -> final normalised tokens (B, N, D) and, when asked, per-layer attention."""
        x, _ = self.embed(x)
        attns: List[torch.Tensor] = []
        for blk in self.blocks:
            x, attn = self._run_block(blk, x, return_attention)
            if return_attention:
                attns.append(attn)
        return self.norm(x), attns

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode(x)[0]

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        if self.global_pool == "avg":
            return x[:, self.num_prefix_tokens:].mean(dim=1)
        return x[:, 0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits; ``pre_logits=True`` stops at the representation before the head.

        With a distillation token (DeiT) the class and distillation heads are averaged, or,
        in distilled training, returned as a pair (class logits, distillation logits).
        """
        if self.dist_token is not None:
            cls, dist = x[:, 0], x[:, 1]
            if pre_logits:
                return (cls + dist) / 2
            cls, dist = self.head(cls), self.head_dist(dist)
            if self.distilled_training and self.training:
                return cls, dist
            return (cls + dist) / 2
        x = self.pre_logits(self.fc_norm(self.pool(x)))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        tokens, attns = self.encode(x, return_attention)
        logits = self.forward_head(tokens)
        return (logits, attns) if return_attention else logits

    def forward_intermediates(self, x: torch.Tensor, indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, output_fmt: str = "NCHW",
                              return_prefix_tokens: bool = False, intermediates_only: bool = False,
                              stop_early: bool = False):
        """Features of chosen blocks (timm's contract).

        ``indices``: an int n takes the last n blocks, a sequence takes those blocks
        (negative from the end), None takes all. Returns ``(final_tokens, intermediates)``,
        or only the intermediates; each is (B, D, gh, gw) for NCHW or (B, gh*gw, D) for NLC,
        paired with its prefix tokens when ``return_prefix_tokens``.
        """
        take, last = intermediates_plan(len(self.blocks), indices, output_fmt, stop_early, intermediates_only)
        x, grid = self.embed(x)
        outs = []
        for i, blk in enumerate(self.blocks[: last + 1]):
            x, _ = self._run_block(blk, x, False)
            if i in take:
                y = self.norm(x) if norm else x
                prefix, spatial = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens:]
                spatial = patch_tokens_as(spatial, grid, output_fmt)
                outs.append((spatial, prefix) if return_prefix_tokens else spatial)
        if intermediates_only:
            return outs
        return self.norm(x), outs

    def extra_repr(self) -> str:
        c = self.config
        hybrid = f"backbone={describe_backbone(c.backbone)}, " if c.backbone else ""
        return (f"{hybrid}img_size={c.img_size}, patch_size={c.patch_size}, grid={self.patch_embed.grid_size}, "
                f"pos_embed={c.pos_embed}, global_pool={self.global_pool}")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_tokens(config: ViTConfig) -> int:
    gh, gw = config.grid_size
    return gh * gw + int(config.class_token) + int(config.distill_token)


__all__ = ["ViTConfig", "VisionTransformer", "count_parameters", "num_tokens"]
