"""The Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., 2021): the family "vit".

One configurable class covers the paper's model and its common variants (pooling, position
embeddings, LayerScale, the tanh pre-logits layer), DeiT (a distillation token with its own
head) and the paper's ResNet hybrid (section 3.1: a CNN in the patch embedding,
:mod:`.hybrid`). Every architectural choice lives in :class:`ViTConfig`, which is what
``config.json`` stores next to the weights. This file registers the family and big_vision's size
strings (``"B/16"``); the family's model names (timm's ``vit_*`` and ``deit_*``, the hybrids, the
Fashion-MNIST models of ``vitkit train``) are :mod:`.vit_names`', its timm conversions :mod:`.vit_timm`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from . import positions
from .base import TokenModel, check_num_classes
from .complexity import Complexity, token_complexity
from .config_base import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, TokenConfig  # noqa: F401
from .diff_attention import DiffAttention
from .hybrid import (
    HybridEmbed,
    backbone_channels,
    backbone_embeds,
    backbone_feature_size,
    backbone_macs,
    backbone_reduction,
    describe_backbone,
    embedding_problem,
    init_backbone_,
    normalize_backbone,
)
from .layers import (
    BLOCKS,
    GELUS,
    MLPS,
    NORMS,
    Attention,
    AttentionPool,
    Block,
    IntPair,
    PatchEmbed,
    ResPostBlock,
    init_attention_pool_,
    init_block_,
    lecun_normal_,
    linear_drop_path_rates,
    make_mlp,
    norm_factory,
    to_2tuple,
)
from .parallel_block import ParallelBlock
from .registry import Family, register_family, register_name_pattern
from .vit_infer import EMBEDDING_STEM, is_vit_state_dict, vit_fields  # noqa: F401 (EMBEDDING_STEM: public)
from .vit_timm import vit_timm_args, vit_timm_config, vit_to_timm

POS_EMBEDS = tuple(positions.KINDS)
#: Registers past this many are a typo (the papers use 1 to 16).
MAX_REGISTERS = 256

#: the most patches a relative position bias is built for (a 128 x 128 grid: 2,048 px at patch 16): its (N, N)
#: index of table rows (int64) takes 2 GiB there; more ended in an allocation error (64 GiB at 4,096 px)
MAX_RELATIVE_PATCHES = 16_384


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _choice_problems(config: Any, fields: Tuple[Tuple[str, Tuple[str, ...]], ...]) -> List[str]:
    """Each named field must hold one of its allowed values."""
    return [f"{name} must be one of {allowed}, got {getattr(config, name)!r}" for name, allowed in fields
            if getattr(config, name) not in allowed]


@dataclass
class ViTConfig(TokenConfig):
    """Everything needed to rebuild a ViT, plus the preprocessing its weights expect."""

    KIND: ClassVar[str] = "ViT"
    #: the class token, the mean of the patch tokens, multi-head attention pooling (SigLIP's MAP head), or the
    #: class token and the patches' mean side by side (DINOv2's linear heads, transformers' Dinov2ForImage-
    #: Classification: twice the width)
    POOLS: ClassVar[Tuple[str, ...]] = ("token", "avg", "map", "token_avg")

    #: the width ``fc2`` reads (for SwiGLU: of the gated product)
    mlp_dim: int = 3072
    class_token: bool = True
    #: DeiT's distillation token: a second prefix token with its own head (``head_dist``),
    #: trained against a teacher; inference averages the two heads.
    distill_token: bool = False
    #: with a distillation token: False reads the class token alone (no ``head_dist``; the token is one more
    #: prefix token), as transformers' DeiTForImageClassification and DeiTModel do with a distilled DeiT
    distill_head: bool = True
    #: register tokens (Darcet et al., 2024): learned prefix tokens after the class token that no
    #: output reads, where attention can park what it needs (timm's ``reg_token``; DINOv2-reg, SigLIP 2)
    reg_tokens: int = 0
    #: the learned position table covers the patches only, the prefix tokens get no position (timm's
    #: ``no_embed_class``: DeiT III, DINOv2 with registers, FlexiViT, big_vision)
    no_embed_class: bool = False
    #: a norm after the embedding, before the first block (timm's ``norm_pre``: CLIP's ``ln_pre``)
    pre_norm: bool = False
    #: the patch projection's bias; None: none when ``pre_norm`` (the norm that follows makes it void), as timm
    patch_bias: Optional[bool] = None
    #: a norm of each patch token right after the projection (timm's ``patch_embed.norm``: AIMv2)
    embed_norm: bool = False
    #: 'layernorm' or 'rmsnorm' for every norm of the model (eps: ``norm_eps``)
    norm: str = "layernorm"
    #: 'mlp' (GELU), 'swiglu' (``fc1_g`` / ``fc1_x``) or 'swiglu_packed' (one ``fc1``)
    mlp: str = "mlp"
    #: a norm of the MLP's hidden activations before ``fc2`` (timm's ``scale_mlp_norm``, EVA's sub-LN)
    mlp_norm: bool = False
    #: a norm of the attention output before its projection (timm's ``scale_attn_norm``)
    attn_norm: bool = False
    #: a norm of each head's queries and keys (timm's ``qk_norm``)
    qk_norm: bool = False
    #: biases of the attention output projection and the MLP's layers (AIMv2 has none)
    proj_bias: bool = True
    #: 'pre' (pre-norm, the paper's), 'res_post' (residual post-norm, timm's ``rpn`` models) or 'parallel'
    #: (attention and MLP side by side on one norm, ViT-22B's: timm's ``pwee``)
    block: str = "pre"
    #: differential attention (Ye et al. 2024: two softmax maps per head, their difference): timm's
    #: ``attn_layer='diff'`` (``vit_dwee``, ``vit_dlittle``, ``vit_dpwee``)
    diff_attn: bool = False
    #: the norm after the last block (before or after pooling, see ``fc_norm``); False: none (RADIO)
    final_norm: bool = True
    #: the attention pool's heads and MLP width (``global_pool='map'``); None: the blocks' own
    map_heads: Optional[int] = None
    map_mlp_dim: Optional[int] = None
    #: average or attention-pool the prefix tokens too (timm's ``pool_include_prefix``)
    pool_include_prefix: bool = False
    #: the hidden width of the 'relative_mlp' positions' MLP, and whether one MLP serves every layer
    rel_pos_dim: int = 128
    shared_rel_pos: bool = False
    #: an image size that is no multiple of the patch: the pixels past the last whole patch are left out,
    #: as timm's and Hugging Face's convolution does (SigLIP so400m/14 at 384 px uses 378 of them)
    crop_remainder: bool = False
    #: LayerNorm after pooling (timm's ``fc_norm``) instead of before it; None = avg pool only.
    fc_norm: Optional[bool] = None
    #: 'learned' (1D table), 'learned_2d' (the paper's row + column ablation), 'sincos2d', 'none',
    #: 'relative' (a learned bias per head and 2D offset in every attention layer; timm's RelPosBias)
    pos_embed: str = "learned"
    #: the tanh pre-logits layer of the paper's pre-training head (its width)
    representation_size: Optional[int] = None
    #: 'exact' (timm, HF) or 'tanh' (the official JAX code)
    gelu: str = "exact"
    #: LayerScale's initial value (None: no LayerScale)
    init_values: Optional[float] = None
    #: A CNN run before the patch embedding (the paper's hybrid, section 3.1), as a JSON-able
    #: dict: ``{"type": "resnetv2", "layers": [3, 4, 9], "width_factor": 1}`` (see
    #: :mod:`vitkit.models.hybrid`). ``patch_size`` then tiles the CNN's feature map (1 for
    #: most hybrids) and the grid is (feature map) / patch_size.
    backbone: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        if self.backbone is not None:
            try:
                self.backbone = normalize_backbone(self.backbone)
            except ValueError as e:
                raise ValueError(f"invalid ViT config: {e}") from None
        super().__post_init__()

    def family_problems(self) -> List[str]:
        problems = positions.check(self.pos_embed, self.embed_dim)
        if self.global_pool == "token" and not self.class_token:
            problems.append("global_pool='token' needs class_token=True (or use global_pool='avg')")
        if self.distill_token and not (self.class_token and self.global_pool == "token"
                                       and not (self.representation_size and self.distill_head)):
            problems.append("distill_token=True is DeiT's layout: it needs class_token=True, "
                            "global_pool='token' and no representation_size (unless distill_head=False)")
        if not isinstance(self.distill_head, bool):
            problems.append(f"distill_head must be true or false, got {self.distill_head!r}")
        elif not self.distill_head and not self.distill_token:
            problems.append("distill_head=False says how a distillation token is read: it needs distill_token=True")
        if self.pos_embed == "relative" and (self.distill_token or self.reg_tokens):
            problems.append("pos_embed='relative' has bias rows for one prefix token (a class token, as BEiT and timm "
                            "have), not DeiT's distillation token or registers")
        if self.shared_rel_pos and self.pos_embed != "relative_mlp":
            problems.append("shared_rel_pos needs pos_embed='relative_mlp'")
        problems += self._positive_int_problems(("rel_pos_dim",))
        if self.distill_token and self.reg_tokens:
            problems.append("distill_token and reg_tokens: DeiT's layout has no registers")
        problems += _choice_problems(self, (("gelu", GELUS), ("norm", NORMS), ("mlp", MLPS), ("block", BLOCKS)))
        if self.mlp != "mlp" and self.gelu != "exact" and self.global_pool != "map":  # (taken, and it changed nothing)
            problems.append(f"gelu {self.gelu!r} has nothing to act on: a {self.mlp} MLP gates with SiLU (no MAP head)")
        problems += self._positive_int_problems(("mlp_dim",))
        if not _is_count(self.reg_tokens) or self.reg_tokens > MAX_REGISTERS:
            problems.append(f"reg_tokens must be an integer in 0..{MAX_REGISTERS}, got {self.reg_tokens!r}")
        if self.global_pool == "token_avg" and not (self.class_token and not self.representation_size
                                                    and not self.distill_token):
            problems.append("global_pool='token_avg' reads the class token beside the patches' mean: it needs "
                            "class_token=True, no distill_token and no representation_size")
        if self.global_pool == "map":
            for name in ("map_heads", "map_mlp_dim"):
                value = getattr(self, name)
                if value is not None and not (_is_count(value) and value > 0):
                    problems.append(f"{name} must be a positive integer or null, got {value!r}")
            heads = self.map_heads or self.num_heads
            if _is_count(heads) and heads > 0 and isinstance(self.embed_dim, int) and self.embed_dim % heads:
                problems.append(f"embed_dim {self.embed_dim} is not divisible by the attention pool's {heads} heads")
            if self.distill_token or self.representation_size:
                problems.append("global_pool='map' has its own head: no distill_token or representation_size")
        problems += self._later_block_problems()
        problems += self._relative_size_problems()
        if self.backbone is not None and (problem := embedding_problem(self.backbone, self.embed_dim,
                                                                         self.patch_size)):
            problems.append(problem)
        if self.block == "res_post" and self.init_values is not None and not isinstance(self.init_values, (int, float)):
            problems.append(f"init_values must be a number, got {self.init_values!r}")
        return problems

    def _relative_size_problems(self) -> List[str]:
        """A relative position bias holds an (N, N) index over the N tokens: past MAX_RELATIVE_PATCHES, said as its
        memory rather than met as torch's allocation error."""
        sizes = (*self.img_size, *self.patch_size)
        if self.pos_embed not in ("relative", "relative_mlp") or self.backbone is not None or \
                not all(_is_count(v) and v > 0 for v in sizes) or not _is_count(self.reg_tokens):
            return []
        patches = (self.img_size[0] // self.patch_size[0]) * (self.img_size[1] // self.patch_size[1])
        if patches <= MAX_RELATIVE_PATCHES:
            return []
        tokens = patches + self.num_prefix_tokens
        return [f"pos_embed={self.pos_embed!r} at {self.img_size[0]}x{self.img_size[1]} px is {tokens:,} tokens: its "
                f"{tokens:,} x {tokens:,} index of bias rows would take {tokens * tokens * 8 / 2 ** 30:,.0f} GiB "
                f"(vitkit builds it for up to {MAX_RELATIVE_PATCHES:,} patches, a 128 x 128 grid: 2,048 px at "
                f"patch 16)"]

    def _later_block_problems(self) -> List[str]:
        """The combinations of differential attention and the parallel block that timm's layouts have."""
        problems = []
        relative = self.pos_embed in ("relative", "relative_mlp")
        if self.diff_attn:
            if not isinstance(self.diff_attn, bool):
                problems.append(f"diff_attn must be true or false, got {self.diff_attn!r}")
            heads = self.num_heads
            if _is_count(heads) and heads > 0 and isinstance(self.embed_dim, int) and self.embed_dim % (2 * heads):
                problems.append(f"differential attention splits each head in two: embed_dim {self.embed_dim} is "
                                f"not divisible by 2 x {heads} heads")
            if relative:
                problems.append("differential attention takes no relative position bias")
        if self.block == "parallel":
            if relative:
                problems.append("block='parallel' takes no relative position bias")
            if self.mlp != "mlp" or self.attn_norm or self.mlp_norm:
                problems.append("block='parallel' has one GELU MLP fused into its input projection: no SwiGLU, "
                                "attn_norm or mlp_norm")
        return problems

    def grid_problems(self) -> List[str]:
        if self.crop_remainder and self.backbone is None:
            return [] if all(i >= p for i, p in zip(self.img_size, self.patch_size)) else \
                [f"img_size {self.img_size} is smaller than one patch {self.patch_size}"]
        if self.backbone is None:
            return super().grid_problems()
        feat = backbone_feature_size(self.backbone, self.img_size)
        if not all(feat):
            step = backbone_reduction(self.backbone)
            return [f"img_size {self.img_size} is smaller than the backbone's stride {step}"]
        if not any(f % p for f, p in zip(feat, self.patch_size)):
            return []
        step = backbone_reduction(self.backbone)
        return [f"img_size {self.img_size} gives a {feat[0]}x{feat[1]} backbone feature map (stride {step}), not "
                f"divisible by patch_size {self.patch_size}; use a multiple of "
                f"{step * self.patch_size[0]}x{step * self.patch_size[1]}"]

    @property
    def use_fc_norm(self) -> bool:
        return self.global_pool == "avg" if self.fc_norm is None else bool(self.fc_norm)

    @property
    def use_patch_bias(self) -> bool:
        return not self.pre_norm if self.patch_bias is None else bool(self.patch_bias)

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.distill_token) + self.reg_tokens

    @property
    def grid_size(self) -> IntPair:
        if self.backbone is not None:
            fh, fw = backbone_feature_size(self.backbone, self.img_size)
            return (fh // self.patch_size[0], fw // self.patch_size[1])
        return super().grid_size

    @property
    def token_patch_size(self) -> IntPair:
        """Pixels per token side: the patch size, times the backbone's stride for hybrids."""
        r = backbone_reduction(self.backbone) if self.backbone is not None else 1
        return (r * self.patch_size[0], r * self.patch_size[1])


class VisionTransformer(TokenModel):
    """ViT: patch embedding, [class] token, position embeddings, pre-LN encoder, head.

    ``model(x)`` -> logits (B, num_classes) or pooled features when ``num_classes == 0``.
    ``model(x, return_attention=True)`` -> ``(logits, [per-layer (B, heads, N, N)])``.
    """

    config_cls = ViTConfig

    def __init__(self, config: Optional[ViTConfig] = None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg, D = self.config, self.config.embed_dim
        norm = norm_factory(cfg.norm, cfg.norm_eps)
        if cfg.backbone is not None:
            # The hybrid: a CNN, then a patch_size projection of its feature map.
            self.patch_embed = HybridEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, cfg.backbone)
        else:
            self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, bias=cfg.use_patch_bias,
                                          norm=norm if cfg.embed_norm else None, crop_remainder=cfg.crop_remainder)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distill_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, D)) if cfg.reg_tokens else None
        self.num_prefix_tokens = cfg.num_prefix_tokens
        #: DeiT: while training with a teacher, return (class logits, distillation logits).
        self.distilled_training = False
        slots = 0 if cfg.no_embed_class else self.num_prefix_tokens
        positions.build(self, cfg.pos_embed, cfg.table_grid, D, slots=slots)
        self.build_rope()
        self.pos_drop = nn.Dropout(cfg.drop_rate) if cfg.drop_rate > 0 else None
        self.norm_pre = norm(D) if cfg.pre_norm else None

        rates = linear_drop_path_rates(cfg.drop_path_rate, cfg.depth)
        self.blocks = nn.ModuleList([self.build_block(i, rates[i], norm) for i in range(cfg.depth)])
        self.shared_rel_pos = None
        positions.attach(self)  # relative positions: a bias table in every block's attention
        use_fc_norm, final = cfg.use_fc_norm, cfg.final_norm
        self.norm = norm(D) if final and not use_fc_norm else nn.Identity()
        self.attn_pool = AttentionPool(D, cfg.map_heads or cfg.num_heads, cfg.map_mlp_dim or cfg.mlp_dim, norm,
                                       self.map_gelu) if cfg.global_pool == "map" else None
        self.fc_norm = norm(D) if final and use_fc_norm else nn.Identity()
        if cfg.representation_size:
            self.pre_logits = nn.Sequential(OrderedDict(
                fc=nn.Linear(D, cfg.representation_size), act=nn.Tanh()))
            self.num_features = cfg.representation_size
        else:
            self.pre_logits = nn.Identity()
            self.num_features = self.pooled_width(cfg.global_pool)
        self.head = self._new_head(cfg.num_classes)
        self.head_dist = self._new_head(cfg.num_classes) if cfg.distill_token and cfg.distill_head else None
        if next(self.patch_embed.parameters()).device.type != "meta":  # a model built to count its parameters has no
            self.init_weights()  # values to initialise (half the cost of `vitkit models`' ~300 builds)

    @property
    def map_gelu(self) -> str:
        """The activation of the attention pool's MLP (timm's ViT: the blocks' own)."""
        return self.config.gelu

    def build_rope(self) -> None:
        """Rotary position embeddings: none in this family (:mod:`.eva` has them)."""
        self.rope = None

    def build_attention(self, norm, i: int = 0) -> nn.Module:
        """Block ``i``'s attention (the same kind in every block of this family; differential attention
        takes the block's index for its lambda_init)."""
        cfg = self.config
        if cfg.diff_attn:
            return DiffAttention(cfg.embed_dim, cfg.num_heads, cfg.qkv_bias, cfg.attn_drop_rate, cfg.drop_rate,
                                 cfg.attn_impl, depth=i, qk_norm=norm if cfg.qk_norm else None,
                                 inner_norm=norm if cfg.attn_norm else None, proj_bias=cfg.proj_bias)
        return Attention(cfg.embed_dim, cfg.num_heads, cfg.qkv_bias, cfg.attn_drop_rate, cfg.drop_rate, cfg.attn_impl,
                         qk_norm=norm if cfg.qk_norm else None, inner_norm=norm if cfg.attn_norm else None,
                         proj_bias=cfg.proj_bias)

    def build_block(self, i: int, drop_path: float, norm) -> nn.Module:
        """Block ``i``: the injected attention, MLP and norm of the configuration."""
        cfg = self.config
        if cfg.block == "parallel":
            return ParallelBlock(cfg.embed_dim, cfg.num_heads, cfg.mlp_dim, norm, cfg.qkv_bias, cfg.gelu, cfg.drop_rate,
                                 cfg.attn_drop_rate, drop_path, cfg.init_values, cfg.attn_impl,
                                 qk_norm=norm if cfg.qk_norm else None, proj_bias=cfg.proj_bias,
                                 differential=cfg.diff_attn, depth=i)
        mlp = make_mlp(cfg.mlp, cfg.embed_dim, cfg.mlp_dim, cfg.gelu, cfg.drop_rate, cfg.proj_bias,
                       norm if cfg.mlp_norm else None)
        return self.assemble_block(drop_path, norm, self.build_attention(norm, i), mlp)

    def assemble_block(self, drop_path: float, norm, attn: nn.Module, mlp: nn.Module) -> nn.Module:
        """The block kind of the configuration around its parts (pre-norm, or residual post-norm)."""
        cfg = self.config
        block = ResPostBlock if cfg.block == "res_post" else Block
        return block(cfg.embed_dim, cfg.num_heads, cfg.mlp_dim, drop_path=drop_path, init_values=cfg.init_values,
                     norm=norm, attn=attn, mlp=mlp)

    def head_names(self) -> Tuple[str, ...]:
        return ("head", "head_dist") if self.dist_token is not None and self.config.distill_head else ("head",)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise as the official JAX code does (vit_jax ``models_vit.py``).

        - patch embedding: LeCun normal (Flax Conv default), bias 0;
        - class token 0; learned position embeddings (and DeiT's token) N(0, 0.02);
        - q, k, v, out, MLP kernels: Xavier uniform, each q/k/v its own D x D kernel (the
          official code keeps them separate, so the fused matrix is initialised in thirds);
          attention biases 0, MLP biases N(0, 1e-6);
        - pre-logits: LeCun normal, bias 0; classifier head: zeros (official ``head_kernel_init``);
        - registers N(0, 0.02) (distinct starts: identical registers would stay identical);
        - an attention pool as big_vision's MAPHead: Xavier-uniform probe and kernels, zero biases;
        - a hybrid's CNN: LeCun-normal kernels, GroupNorm scale 1 and bias 0 (Flax defaults).
        """
        proj = self.patch_embed.proj  # None where the hybrid's CNN makes the tokens itself (MobileCLIP)
        if proj is not None:
            lecun_normal_(proj.weight)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        if isinstance(self.patch_embed, HybridEmbed):
            init_backbone_(self.patch_embed.backbone)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        tokens = [t for t in (self.dist_token, self.reg_token) if t is not None]
        for p in positions.parameters(self) + tokens:
            nn.init.normal_(p, std=0.02)
        for blk in self.blocks:
            blk.init_weights_() if isinstance(blk, ParallelBlock) else init_block_(blk)
        if self.attn_pool is not None:
            init_attention_pool_(self.attn_pool)
        if isinstance(self.pre_logits, nn.Sequential):
            lecun_normal_(self.pre_logits.fc.weight)
            nn.init.zeros_(self.pre_logits.fc.bias)
        self._zero_heads()

    def set_distilled_training(self, enable: bool = True) -> None:
        """DeiT: in training mode, return both heads' logits for the distillation loss."""
        if enable and (self.dist_token is None or not self.config.distill_head):
            raise ValueError("distilled training needs a model with a distillation token and its head "
                             "(distill_token=True, distill_head=True)")
        self.distilled_training = bool(enable)

    def prefix_tokens(self, batch: int) -> List[torch.Tensor]:
        """Tokens that precede the patches: class, then DeiT's distillation token or the registers."""
        return [t.expand(batch, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Final tokens -> the pooled representation (class token, mean of the patches, or attention pool)."""
        if self.attn_pool is not None:
            return self.attn_pool(x if self.config.pool_include_prefix else x[:, self.num_prefix_tokens:])
        if self.global_pool == "avg" and self.config.pool_include_prefix:
            return x.mean(dim=1)
        if self.global_pool == "token_avg":
            return torch.cat([x[:, 0], x[:, self.num_prefix_tokens:].mean(dim=1)], dim=-1)
        return super().pool(x)

    def pooled_width(self, global_pool: str) -> int:
        """The width a pooling gives the head: the class token and the patches' mean side by side are two."""
        return self.embed_dim * (2 if global_pool == "token_avg" else 1)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """As :meth:`TokenModel.reset_classifier`; leaving 'map' drops the attention pool (it cannot be added)."""
        check_num_classes(num_classes)  # before the width below changes
        if global_pool == "map" and self.attn_pool is not None:
            global_pool = None
        changed = global_pool is not None and global_pool != self.global_pool
        if global_pool == "token_avg" and (self.cls_token is None or self.dist_token is not None
                                           or self.config.representation_size):
            raise ValueError("global_pool='token_avg' needs a class token, no distillation token and no "
                             "pre-logits layer")
        if not self.config.representation_size:
            self.num_features = self.pooled_width(global_pool or self.global_pool)
        super().reset_classifier(num_classes, global_pool)
        if changed:  # the norms stay where they are: the config says so explicitly
            self.attn_pool = None
            self.config = self.config.replace(fc_norm=not isinstance(self.fc_norm, nn.Identity))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits; ``pre_logits=True`` stops at the representation before the head.

        With a distillation token (DeiT) the class and distillation heads are averaged, or,
        in distilled training, returned as a pair (class logits, distillation logits).
        """
        if self.head_dist is not None:
            cls, dist = x[:, 0], x[:, 1]
            if pre_logits:
                return (cls + dist) / 2
            cls, dist = self.head(cls), self.head_dist(dist)
            if self.distilled_training and self.training:
                return cls, dist
            return (cls + dist) / 2
        x = self.pre_logits(self.fc_norm(self.pool(x)))
        return x if pre_logits else self.head(x)

    def extra_repr(self) -> str:
        c = self.config
        hybrid = f"backbone={describe_backbone(c.backbone)}, " if c.backbone else ""
        return hybrid + super().extra_repr()


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_tokens(config: ViTConfig) -> int:
    gh, gw = config.grid_size
    return gh * gw + config.num_prefix_tokens


# ----------------------------------------------------------------------------- the family description


def vit_complexity(config: ViTConfig) -> Complexity:
    """Cost of one image. For a hybrid, ``patch_size`` is the pixels per token (backbone
    stride x projection patch) and ``backbone_macs`` the CNN's share of ``macs``."""
    D, M = config.embed_dim, config.mlp_dim
    ph, pw = config.patch_size
    gh, gw = config.grid_size
    n = num_tokens(config)
    cnn = 0
    if config.backbone is not None:
        cnn = backbone_macs(config.backbone, config.img_size, config.in_chans)
        proj = 0 if backbone_embeds(config.backbone) else gh * gw * D * backbone_channels(config.backbone) * ph * pw
        embed = cnn + proj
    else:
        embed = gh * gw * D * config.in_chans * ph * pw
    # q k^T and attention x v, all heads together (differential attention: 2H half-width maps, their difference
    # times the values; its fused path runs one more product, each map times the values)
    attn_mix = 2 * n * n * D
    mlp = (3 if config.mlp != "mlp" else 2) * n * D * M  # SwiGLU: a gate and a value projection, then fc2
    kv_heads = getattr(config, "kv_heads", None) or [config.num_heads] * config.depth  # grouped-query (EVA)
    qkv = sum(n * D * D + 2 * n * D * D * h // config.num_heads for h in kv_heads)
    blocks = qkv + config.depth * (attn_mix + n * D * D + mlp)
    head_in = D
    tail = 0
    if config.pos_embed == "relative_mlp":  # the bias MLP over every offset, in every layer (a shared MLP too:
        offsets = (2 * gh - 1) * (2 * gw - 1)  # each layer asks for its bias; ~0.02% of a ViT-S's MACs)
        tail += offsets * (2 * config.rel_pos_dim + config.rel_pos_dim * config.num_heads) * config.depth
    if config.global_pool == "map":  # one query over the (patch) tokens, projection, MLP
        pooled = n if config.pool_include_prefix else n - config.num_prefix_tokens
        tail += D * D + 2 * pooled * D * D + 2 * pooled * D + D * D + 2 * D * (config.map_mlp_dim or M)
    if config.global_pool == "token_avg":
        head_in = 2 * D
    if config.representation_size:
        tail += D * config.representation_size
        head_in = config.representation_size
    tail += head_in * config.num_classes * (2 if config.distill_token and config.distill_head else 1)  # DeiT's 2nd
    macs = embed + blocks + tail
    return token_complexity(config, macs, config.depth * attn_mix, n, config.token_patch_size, cnn)


def infer_vit_config(sd: Mapping[str, Any], **overrides: Any) -> ViTConfig:
    """Rebuild the architecture from a timm/vitkit-named state dict alone (:func:`.vit_infer.vit_fields`).

    The number of heads is not stored in a fused qkv matrix: it is taken from the paper's
    table for the standard widths, else width / 64 (override with ``num_heads=``).
    """
    size = overrides.get("img_size")
    kw = vit_fields(sd, to_2tuple(size) if size is not None else None)
    kw["num_heads"] = HEADS_BY_WIDTH.get(kw["embed_dim"], max(1, kw["embed_dim"] // 64))
    kw.update(overrides)
    return ViTConfig(**kw)


#: what a bare state dict of a later ViT cannot tell (no tensor holds it): said when it is read off the shapes
UNSTORED = {"block": "the block kind (pre-norm; timm's rpn ViTs are residual post-norm)",
            "norm_eps": "the norms' eps (1e-6; BEiT-3's 1e-5)",
            "gelu": "the GELU (exact; CLIP's OpenAI weights use QuickGELU, SigLIP 2 and SigLIP-gap the tanh form)",
            "rope": "no rotary positions (Perception Encoder's, EVA-02's and DINOv3's have no tensors)"}


FAMILY = register_family(Family(
    name="vit", config_cls=ViTConfig, model_cls=VisionTransformer, complexity=vit_complexity,
    matches=is_vit_state_dict, infer_config=infer_vit_config, detect_priority=-10, to_timm=vit_to_timm,
    timm_args=vit_timm_args, timm_config=vit_timm_config, layouts=("timm", "hf", "npz", "big_vision")))


# ----------------------------------------------------------------------------- sizes: the paper's Table 1

#: size letter -> (width, depth, heads, MLP width), paper Table 1 plus DeiT's Ti/S
VIT_SIZES: Dict[str, Tuple[int, int, int, int]] = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
}
#: heads of the standard widths (not recoverable from a fused qkv matrix)
HEADS_BY_WIDTH = {w: h for (w, _, h, _) in VIT_SIZES.values()}


def vit_config(size: str, patch: int, img_size: int = 224, **kw: Any) -> ViTConfig:
    width, depth, heads, mlp = VIT_SIZES[size]
    # timm's fine-tuned 384 px weights are evaluated on the full image (crop_pct 1.0).
    kw.setdefault("crop_pct", 1.0 if img_size >= 384 else 0.9)
    return ViTConfig(img_size=img_size, patch_size=patch, embed_dim=width, depth=depth,
                     num_heads=heads, mlp_dim=mlp, **kw)


register_name_pattern(r"^(Ti|S|B|L|H)/(\d+)$", lambda m: vit_config(m.group(1), int(m.group(2))))

#: Fashion-MNIST's training-set pixel statistics (:mod:`.vit_names`' models expect them). models/ does
#: not import data/, so they are written here as well as in data.fashion_mnist; a test keeps both equal.
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)


__all__ = ["ViTConfig", "VisionTransformer", "count_parameters", "num_tokens", "vit_complexity",
           "is_vit_state_dict", "infer_vit_config", "vit_to_timm", "vit_timm_args", "vit_timm_config", "FAMILY",
           "VIT_SIZES", "HEADS_BY_WIDTH", "vit_config", "POS_EMBEDS", "FMNIST_MEAN", "FMNIST_STD"]
