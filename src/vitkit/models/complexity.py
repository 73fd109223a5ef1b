"""Analytic cost of a ViT: parameters, multiply-accumulates, tokens, attention memory.

Counts the matrix products (patch projection, qkv, q k^T, attention x v, output
projection, MLP, pre-logits, head); LayerNorm, GELU, softmax and additions are left out,
as fvcore and timm's tables do. FLOPs = 2 x MACs (the convention of
``torch.utils.flop_counter``); many papers quote MACs and call them FLOPs (ViT-B/16 at
224 px: 17.6 G MACs = 35.1 GFLOPs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict

import torch

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
    D, M, depth, H = config.embed_dim, config.mlp_dim, config.depth, config.num_heads
    (h, w), (ph, pw) = config.img_size, config.patch_size
    gh, gw = h // ph, w // pw
    n = gh * gw + (1 if config.class_token else 0)
    embed = gh * gw * D * config.in_chans * ph * pw
    attn_mix = 2 * n * n * D  # q k^T and attention x v, all heads together
    per_block = 3 * n * D * D + attn_mix + n * D * D + 2 * n * D * M
    head_in = D
    tail = 0
    if config.representation_size:
        tail += D * config.representation_size
        head_in = config.representation_size
    tail += head_in * config.num_classes
    macs = embed + depth * per_block + tail
    pixels = h * w
    return Complexity(
        params=count_params(config), macs=macs, img_size=(h, w), patch_size=(ph, pw),
        grid=(gh, gw), tokens=n, heads=H, depth=depth,
        attn_entries_per_layer=H * n * n, attn_bytes_per_layer_fp32=4 * H * n * n,
        attn_macs_share=depth * attn_mix / macs,
        pixel_tokens=pixels, pixel_attn_entries=pixels * pixels)
