"""Analytic cost of a ViT: parameters, multiply-accumulates, tokens, attention memory.

Counts the matrix products (patch projection, qkv, q k^T, attention x v, output
projection, MLP, pre-logits, head) and, for hybrids and the ResNetV2 classifier, every
convolution of the CNN (at its SAME-padded output size); LayerNorm, GroupNorm, GELU, ReLU,
softmax, pooling and additions are left out, as fvcore and timm's tables do. FLOPs = 2 x MACs (the convention of
``torch.utils.flop_counter``); many papers quote MACs and call them FLOPs (ViT-B/16 at
224 px: 17.6 G MACs = 35.1 GFLOPs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict

import torch

from .cait import CaiTConfig, cait_macs
from .convit import ConViTConfig, convit_macs
from .hybrid import (
    ResNetV2Config,
    backbone_channels,
    backbone_feature_size,
    backbone_macs,
    backbone_reduction,
    resnet_complexity_macs,
)
from .vit import ViTConfig


@dataclass
class Complexity:
    params: int
    macs: int
    img_size: tuple
    patch_size: tuple
    grid: tuple
    tokens: int
    heads: int
    depth: int
    attn_entries_per_layer: int
    attn_bytes_per_layer_fp32: int
    attn_macs_share: float
    pixel_tokens: int
    pixel_attn_entries: int
    #: MACs of the CNN of a hybrid (or of a ResNet classifier's convolutions), included in macs
    backbone_macs: int = 0

    @property
    def flops(self) -> int:
        return 2 * self.macs

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["flops"] = self.flops
        return d


def count_params(config: ViTConfig) -> int:
    """Exact parameter count, by building the model on the meta device (no memory, no init cost)."""
    from .registry import build_from_config

    with torch.device("meta"):
        model = build_from_config(config)
    return sum(p.numel() for p in model.parameters())


def complexity(config: ViTConfig) -> Complexity:
    """Cost of one image. For a hybrid, ``patch_size`` is the pixels per token (backbone
    stride x projection patch) and ``backbone_macs`` the CNN's share of ``macs``."""
    if isinstance(config, ResNetV2Config):
        return _resnet_complexity(config)
    if isinstance(config, ConViTConfig):
        return _convit_complexity(config)
    if isinstance(config, CaiTConfig):
        return _cait_complexity(config)
    D, M, depth, H = config.embed_dim, config.mlp_dim, config.depth, config.num_heads
    (h, w), (ph, pw) = config.img_size, config.patch_size
    gh, gw = config.grid_size
    n = gh * gw + int(config.class_token) + int(config.distill_token)
    cnn = 0
    if config.backbone is not None:
        cnn = backbone_macs(config.backbone, config.img_size, config.in_chans)
        embed = cnn + gh * gw * D * backbone_channels(config.backbone) * ph * pw
        ph, pw = config.token_patch_size
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
    macs = embed + depth * per_block + tail
    pixels = h * w
    return Complexity(
        params=count_params(config), macs=macs, img_size=(h, w), patch_size=(ph, pw),
        grid=(gh, gw), tokens=n, heads=H, depth=depth,
        attn_entries_per_layer=H * n * n, attn_bytes_per_layer_fp32=4 * H * n * n,
        attn_macs_share=depth * attn_mix / macs,
        pixel_tokens=pixels, pixel_attn_entries=pixels * pixels, backbone_macs=cnn)


def _resnet_complexity(config: ResNetV2Config) -> Complexity:
    """A CNN has no tokens and no attention: those fields are 0; ``grid`` is its final map."""
    cnn, head = resnet_complexity_macs(config)
    h, w = config.img_size
    r = backbone_reduction(config.backbone)
    pixels = h * w
    return Complexity(
        params=count_params(config), macs=cnn + head, img_size=(h, w), patch_size=(r, r),
        grid=backbone_feature_size(config.backbone, config.img_size), tokens=0, heads=0,
        depth=sum(config.layers), attn_entries_per_layer=0, attn_bytes_per_layer_fp32=0,
        attn_macs_share=0.0, pixel_tokens=pixels, pixel_attn_entries=pixels * pixels, backbone_macs=cnn)


def _cait_complexity(config: CaiTConfig) -> Complexity:
    """CaiT: ``tokens`` and the attention entries are those of the self-attention layers
    (patches only; the class token joins in the ``cls_depth`` class-attention layers, whose
    cost is in ``macs``); ``depth`` counts the self-attention layers."""
    gh, gw = config.grid_size
    return _token_model_complexity(config, *cait_macs(config), tokens=gh * gw)


def _convit_complexity(config: ConViTConfig) -> Complexity:
    """ConViT: ``tokens`` and the attention entries are those of the MHSA layers (class token +
    patches); the GPSA layers attend over the patches only (and add the positional scores
    v_pos . r_ij, counted once per image as timm computes them)."""
    gh, gw = config.grid_size
    return _token_model_complexity(config, *convit_macs(config), tokens=gh * gw + 1)


def _token_model_complexity(config, macs: int, mix: int, tokens: int) -> Complexity:
    """The Complexity record of a CaiT/ConViT from its MACs, attention-mixing MACs and tokens."""
    (h, w), H, pixels = config.img_size, config.num_heads, config.img_size[0] * config.img_size[1]
    return Complexity(
        params=count_params(config), macs=macs, img_size=(h, w), patch_size=config.patch_size,
        grid=tuple(config.grid_size), tokens=tokens, heads=H, depth=config.depth,
        attn_entries_per_layer=H * tokens * tokens, attn_bytes_per_layer_fp32=4 * H * tokens * tokens,
        attn_macs_share=mix / macs, pixel_tokens=pixels, pixel_attn_entries=pixels * pixels)
