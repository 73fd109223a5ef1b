"""The Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., 2021): the family "vit".

One configurable class covers the paper's model and its common variants (pooling, position
embeddings, LayerScale, the tanh pre-logits layer), DeiT (a distillation token with its own
head) and the paper's ResNet hybrid (section 3.1: a CNN in the patch embedding,
:mod:`.hybrid`). Every architectural choice lives in :class:`ViTConfig`, which is what
``config.json`` stores next to the weights. This file also registers the family's names:
timm's ``vit_*`` and ``deit_*`` models, the hybrids, the Fashion-MNIST models of ``vitkit
train`` and big_vision's size strings (``"B/16"``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from . import positions
from .base import TokenModel
from .complexity import Complexity, token_complexity
from .config_base import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, TokenConfig  # noqa: F401
from .hybrid import (
    HybridEmbed,
    backbone_channels,
    backbone_feature_size,
    backbone_in_chans,
    backbone_macs,
    backbone_reduction,
    describe_backbone,
    infer_backbone,
    init_backbone_,
    normalize_backbone,
)
from .layers import Block, IntPair, PatchEmbed, init_block_, lecun_normal_, linear_drop_path_rates
from .registry import Family, register_family, register_model, register_name_pattern

POS_EMBEDS = tuple(positions.KINDS)


@dataclass
class ViTConfig(TokenConfig):
    """Everything needed to rebuild a ViT, plus the preprocessing its weights expect."""

    KIND: ClassVar[str] = "ViT"

    mlp_dim: int = 3072
    class_token: bool = True
    #: DeiT's distillation token: a second prefix token with its own head (``head_dist``),
    #: trained against a teacher; inference averages the two heads.
    distill_token: bool = False
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
                                       and not self.representation_size):
            problems.append("distill_token=True is DeiT's layout: it needs class_token=True, "
                            "global_pool='token' and no representation_size")
        if self.pos_embed == "relative" and self.distill_token:
            problems.append("pos_embed='relative' has bias rows for one prefix token (a class token, as BEiT and timm "
                            "have), not DeiT's distillation token")
        if self.gelu not in ("exact", "tanh"):
            problems.append(f"gelu must be 'exact' or 'tanh', got {self.gelu!r}")
        problems += self._positive_int_problems(("mlp_dim",))
        return problems

    def grid_problems(self) -> List[str]:
        if self.backbone is None:
            return super().grid_problems()
        feat = backbone_feature_size(self.backbone, self.img_size)
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
        positions.build(self, cfg.pos_embed, self.patch_embed.grid_size, D, slots=self.num_prefix_tokens)
        self.pos_drop = nn.Dropout(cfg.drop_rate) if cfg.drop_rate > 0 else None

        rates = linear_drop_path_rates(cfg.drop_path_rate, cfg.depth)
        self.blocks = nn.ModuleList([
            Block(D, cfg.num_heads, cfg.mlp_dim, cfg.qkv_bias, cfg.norm_eps, cfg.gelu,
                  cfg.drop_rate, cfg.attn_drop_rate, rates[i], cfg.init_values, cfg.attn_impl)
            for i in range(cfg.depth)])
        positions.attach(self)  # relative positions: a bias table in every block's attention
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

    def head_names(self) -> Tuple[str, ...]:
        return ("head", "head_dist") if self.dist_token is not None else ("head",)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise as the official JAX code does (vit_jax ``models_vit.py``).

        - patch embedding: LeCun normal (Flax Conv default), bias 0;
        - class token 0; learned position embeddings (and DeiT's token) N(0, 0.02);
        - q, k, v, out, MLP kernels: Xavier uniform, each q/k/v its own D x D kernel (the
          official code keeps them separate, so the fused matrix is initialised in thirds);
          attention biases 0, MLP biases N(0, 1e-6);
        - pre-logits: LeCun normal, bias 0; classifier head: zeros (official ``head_kernel_init``);
        - a hybrid's CNN: LeCun-normal kernels, GroupNorm scale 1 and bias 0 (Flax defaults).
        """
        lecun_normal_(self.patch_embed.proj.weight)
        nn.init.zeros_(self.patch_embed.proj.bias)
        if isinstance(self.patch_embed, HybridEmbed):
            init_backbone_(self.patch_embed.backbone)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        for p in positions.parameters(self) + ([self.dist_token] if self.dist_token is not None else []):
            nn.init.normal_(p, std=0.02)
        for blk in self.blocks:
            init_block_(blk)
        if isinstance(self.pre_logits, nn.Sequential):
            lecun_normal_(self.pre_logits.fc.weight)
            nn.init.zeros_(self.pre_logits.fc.bias)
        self._zero_heads()

    def set_distilled_training(self, enable: bool = True) -> None:
        """DeiT: in training mode, return both heads' logits for the distillation loss."""
        if enable and self.dist_token is None:
            raise ValueError("distilled training needs a model with a distillation token (distill_token=True)")
        self.distilled_training = bool(enable)

    def prefix_tokens(self, batch: int) -> List[torch.Tensor]:
        """Tokens that precede the patches: class, then DeiT's distillation token."""
        return [t.expand(batch, -1, -1) for t in (self.cls_token, self.dist_token) if t is not None]

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

    def extra_repr(self) -> str:
        c = self.config
        hybrid = f"backbone={describe_backbone(c.backbone)}, " if c.backbone else ""
        return hybrid + super().extra_repr()


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_tokens(config: ViTConfig) -> int:
    gh, gw = config.grid_size
    return gh * gw + int(config.class_token) + int(config.distill_token)


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
        embed = cnn + gh * gw * D * backbone_channels(config.backbone) * ph * pw
    else:
        embed = gh * gw * D * config.in_chans * ph * pw
    attn_mix = 2 * n * n * D  # q k^T and attention x v, all heads together
    per_block = 3 * n * D * D + attn_mix + n * D * D + 2 * n * D * M
    head_in = D
    tail = 0
    if config.representation_size:
        tail += D * config.representation_size
        head_in = config.representation_size
    tail += head_in * config.num_classes * (2 if config.distill_token else 1)  # DeiT: a second head
    macs = embed + config.depth * per_block + tail
    return token_complexity(config, macs, config.depth * attn_mix, n, config.token_patch_size, cnn)


def is_vit_state_dict(keys: Collection[str]) -> bool:
    """timm/vitkit names of a patch-token model: every family has a patch projection, so this
    recogniser is asked last (more specific families first)."""
    return "patch_embed.proj.weight" in keys


def infer_vit_config(sd: Mapping[str, Any], **overrides: Any) -> ViTConfig:
    """Rebuild the architecture from a timm/vitkit-named state dict alone.

    The number of heads is not stored in a fused qkv matrix: it is taken from the paper's
    table for the standard widths, else width / 64 (override with ``num_heads=``).
    """
    if "patch_embed.proj.weight" not in sd:
        raise ValueError("not a ViT state dict: 'patch_embed.proj.weight' is missing")
    D, C, ph, pw = (int(s) for s in sd["patch_embed.proj.weight"].shape)
    try:
        backbone = infer_backbone(sd)
    except ValueError as e:
        raise ValueError(f"hybrid backbone: {e}") from None
    if backbone is not None:
        C = backbone_in_chans(sd)
    block_ids = {int(k.split(".")[1]) for k in sd if k.startswith("blocks.")}
    if not block_ids:
        raise ValueError("no transformer blocks ('blocks.N.*') in the state dict")
    class_token = "cls_token" in sd
    distill_token = "dist_token" in sd  # DeiT's distilled models
    has_fc_norm = "fc_norm.weight" in sd
    kw: Dict[str, Any] = dict(
        embed_dim=D, in_chans=C, patch_size=(ph, pw), depth=max(block_ids) + 1,
        num_heads=HEADS_BY_WIDTH.get(D, max(1, D // 64)),
        mlp_dim=int(sd["blocks.0.mlp.fc1.weight"].shape[0]),
        class_token=class_token, distill_token=distill_token,
        global_pool="token" if class_token and not has_fc_norm else "avg",
        fc_norm=None if has_fc_norm or class_token else False,
        num_classes=int(sd["head.weight"].shape[0]) if "head.weight" in sd else 0,
        representation_size=int(sd["pre_logits.fc.weight"].shape[0]) if "pre_logits.fc.weight" in sd else None,
        init_values=1e-5 if "blocks.0.ls1.gamma" in sd else None,
        qkv_bias="blocks.0.attn.qkv.bias" in sd,
        pos_embed="learned" if "pos_embed" in sd else "relative" if f"blocks.0.{positions.RELATIVE_TABLE}" in sd
        else "none",
        backbone=backbone,
    )
    if "pos_embed" in sd:
        n = int(sd["pos_embed"].shape[1]) - int(class_token) - int(distill_token)
        side = int(round(n ** 0.5))
        if side * side != n:
            raise ValueError(f"cannot infer the image size from a position embedding with {n} "
                             f"patch slots; pass img_size=")
        r = backbone_reduction(backbone) if backbone is not None else 1
        kw["img_size"] = (side * ph * r, side * pw * r)
    elif kw["pos_embed"] == "relative":  # (2 g - 1)^2 offsets (+ 3 rows for a class token): a square grid
        offsets = int(sd[f"blocks.0.{positions.RELATIVE_TABLE}"].shape[0]) - 3 * int(class_token)
        side = (round(offsets ** 0.5) + 1) // 2
        if offsets <= 0 or (2 * side - 1) ** 2 != offsets:
            raise ValueError(f"cannot infer the image size from a relative-bias table of {offsets} offsets; "
                             f"pass img_size=")
        r = backbone_reduction(backbone) if backbone is not None else 1
        kw["img_size"] = (side * ph * r, side * pw * r)
    kw.update(overrides)
    return ViTConfig(**kw)


def vit_to_timm(model: VisionTransformer) -> Dict[str, torch.Tensor]:
    """vitkit ViT -> timm ``VisionTransformer`` state dict (the same module config in timm):
    2D and sine-cosine positions are written as the equivalent ``pos_embed`` table."""
    if model.config.representation_size:
        raise ValueError("timm's VisionTransformer has no pre-logits (representation) layer; "
                         "export this model as 'vitkit', 'npz' or 'hf' instead")
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
          if not k.startswith(positions.PARAMETER_NAMES)}
    pos = positions.full_table(model)
    if pos is not None:
        sd["pos_embed"] = pos.cpu().contiguous()
    return sd


def vit_timm_config(config: ViTConfig) -> Dict[str, Any]:
    """The config of ``vit_to_timm``'s state dict: 2D and sine-cosine positions became a learned table."""
    d = config.to_dict()
    if d["pos_embed"] in ("learned_2d", "sincos2d"):
        d["pos_embed"] = "learned"
    return d


#: timm ``model_args`` that mean the same thing in ViTConfig.
_TIMM_ARGS = ("class_token", "fc_norm", "init_values", "embed_dim")
_TIMM_UNSUPPORTED = ("no_embed_class", "reg_tokens", "pre_norm", "qk_norm")


def vit_timm_args(args: Mapping[str, Any], config: ViTConfig) -> Dict[str, Any]:
    unsupported = sorted(k for k in _TIMM_UNSUPPORTED if args.get(k))
    if unsupported:
        raise ValueError(f"timm model_args {unsupported} have no vitkit ViT equivalent")
    kw = {k: args[k] for k in _TIMM_ARGS if args.get(k) is not None}
    if "mlp_ratio" in args:
        kw["mlp_dim"] = int(kw.get("embed_dim", config.embed_dim) * args["mlp_ratio"])
    return kw


FAMILY = register_family(Family(
    name="vit", config_cls=ViTConfig, model_cls=VisionTransformer, complexity=vit_complexity,
    matches=is_vit_state_dict, infer_config=infer_vit_config, detect_priority=-10, to_timm=vit_to_timm,
    timm_args=vit_timm_args, timm_config=vit_timm_config, layouts=("timm", "hf", "npz", "big_vision")))


# ----------------------------------------------------------------------------- names: the paper's Table 1

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
_SIZE_WORDS = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}


def vit_config(size: str, patch: int, img_size: int = 224, **kw: Any) -> ViTConfig:
    width, depth, heads, mlp = VIT_SIZES[size]
    # timm's fine-tuned 384 px weights are evaluated on the full image (crop_pct 1.0).
    kw.setdefault("crop_pct", 1.0 if img_size >= 384 else 0.9)
    return ViTConfig(img_size=img_size, patch_size=patch, embed_dim=width, depth=depth,
                     num_heads=heads, mlp_dim=mlp, **kw)


register_name_pattern(r"^(Ti|S|B|L|H)/(\d+)$", lambda m: vit_config(m.group(1), int(m.group(2))))

_VIT_VARIANTS = [
    ("Ti", 16, 224), ("Ti", 16, 384),
    ("S", 16, 224), ("S", 16, 384), ("S", 32, 224), ("S", 32, 384),
    ("B", 16, 224), ("B", 16, 384), ("B", 32, 224), ("B", 32, 384), ("B", 8, 224),
    ("L", 16, 224), ("L", 16, 384), ("L", 32, 224), ("L", 32, 384),
    ("H", 14, 224),
]
for _size, _patch, _res in _VIT_VARIANTS:
    register_model(f"vit_{_SIZE_WORDS[_size]}_patch{_patch}_{_res}", vit_config(_size, _patch, _res),
                   f"ViT-{_size}/{_patch} at {_res} px")

# ---- DeiT (Touvron et al., 2021): the plain ViT trained on ImageNet-1k alone with strong
# regularisation (ImageNet mean/std, crop 0.875); the distilled variants add a distillation
# token and a second head whose average with the class head is the prediction.
for _size in ("Ti", "S", "B"):
    for _res in ((224, 384) if _size == "B" else (224,)):
        for _distilled in (False, True):
            _name = f"deit_{_SIZE_WORDS[_size]}{'_distilled' if _distilled else ''}_patch16_{_res}"
            register_model(_name, vit_config(_size, 16, _res, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                                             crop_pct=1.0 if _res == 384 else 0.875, distill_token=_distilled),
                           f"DeiT-{_size}/16 at {_res} px" + (", distillation token" if _distilled else ""))

#: Fashion-MNIST's training-set pixel statistics (the models below expect them). models/ does
#: not import data/, so they are written here as well as in data.fashion_mnist; a test keeps both equal.
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)

# The plain model for Fashion-MNIST (28x28 grey): patch 4 gives a 7x7 grid (49 tokens), fine
# enough for 28 px garments while attention stays cheap; width 96 with 4 layers and 3 heads
# (head dim 32). Global average pooling and sine-cosine positions (the "plain ViT baseline" of
# big_vision) converge faster on small data than a class token and learned positions.
register_model("vit_fmnist", ViTConfig(img_size=28, patch_size=4, in_chans=1, num_classes=10,
                                       embed_dim=96, depth=4, num_heads=3, mlp_dim=192,
                                       global_pool="avg", class_token=False, fc_norm=False,
                                       pos_embed="sincos2d", mean=FMNIST_MEAN, std=FMNIST_STD,
                                       crop_pct=1.0),
               "ViT for 28x28 grey images (plain: patch 4)")

# The default model of `vitkit train`, its hybrid (section 3.1 at 28 px): five 3x3 convolutions
# (32, 64, 64, 96, 96 channels; strides 1, 2, 1, 2, 1; weight-standardised, GroupNorm + ReLU)
# make the same 7x7 grid of tokens with a receptive field that overlaps patches; one
# transformer layer of width 96 follows. Per epoch the convolutions learn fastest: after 4
# epochs (label smoothing 0.1, one seed) the earlier 3-convolution stem with 2 layers gave
# 90.5% test, 4 convolutions 91.1%, 5 convolutions 92.0% with 2 layers and 92.6% with 1 -
# while a third transformer layer lost 0.6 points. One layer keeps it at 0.92x the earlier
# model's img/s. The paper's Fig. 5 finding that hybrids win at small compute, taken further.
register_model("vit_fmnist_hybrid",
               ViTConfig(img_size=28, patch_size=1, in_chans=1, num_classes=10,
                         embed_dim=96, depth=1, num_heads=3, mlp_dim=192,
                         global_pool="avg", class_token=False, fc_norm=False,
                         pos_embed="sincos2d", mean=FMNIST_MEAN, std=FMNIST_STD, crop_pct=1.0,
                         backbone={"type": "conv", "channels": [32, 64, 64, 96, 96], "strides": [1, 2, 1, 2, 1]}),
               "conv-stem hybrid ViT for 28x28 grey images")


# ---- the ResNet hybrids (section 3.1), timm's names and counts. The paper's R50 hybrid
# drops stage 4 and extends stage 3 to 9 blocks (output stride 16).
def _resnetv2(*layers: int) -> Dict[str, Any]:
    return {"type": "resnetv2", "layers": list(layers), "width_factor": 1}


#: (timm name stem, size, projection patch, backbone, what it is, image sizes)
_HYBRID_VARIANTS = [
    ("vit_tiny_r_s16_p8", "Ti", 8, _resnetv2(), "R+ViT-Ti: the ResNet stem alone (stride 4), 8x8 patches",
     (224, 384)),
    ("vit_small_r26_s32", "S", 1, _resnetv2(2, 2, 2, 2), "R26+ViT-S/32 hybrid", (224, 384)),
    ("vit_base_r26_s32", "B", 1, _resnetv2(2, 2, 2, 2), "R26+ViT-B/32 hybrid", (224,)),
    ("vit_base_r50_s16", "B", 1, _resnetv2(3, 4, 9), "R50+ViT-B/16 hybrid of the paper (stages 3, 4, 9)",
     (224, 384)),
    ("vit_large_r50_s32", "L", 1, _resnetv2(3, 4, 6, 3), "R50+ViT-L/32 hybrid (all four R50 stages)",
     (224, 384)),
]
for _stem, _size, _patch, _backbone, _what, _sizes in _HYBRID_VARIANTS:
    for _res in _sizes:
        register_model(f"{_stem}_{_res}", vit_config(_size, _patch, _res, backbone=dict(_backbone)),
                       f"{_what} at {_res} px")


__all__ = ["ViTConfig", "VisionTransformer", "count_parameters", "num_tokens", "vit_complexity",
           "is_vit_state_dict", "infer_vit_config", "vit_to_timm", "vit_timm_args", "vit_timm_config", "FAMILY",
           "VIT_SIZES", "HEADS_BY_WIDTH", "vit_config", "POS_EMBEDS", "FMNIST_MEAN", "FMNIST_STD"]
