"""Qwen3's vision encoder (Qwen3-VL, Qwen3.5, Qwen3.8, Qwen-Drive-1.0; 2025-2026): the family "qwen3" (timm's
``qwen3_vit_{88m,306m,416m}``, ``_merge``, ``_enc``), a VLM's tower (:mod:`.vlm_tower`: the projector, the pooled
norm, timm's names).

A plain pre-norm ViT whose parts vitkit already has (:mod:`.eva`): LayerNorm (eps 1e-6), one fused ``qkv`` with
its bias, a GELU-tanh MLP with biases, no class token and no final norm. Two position encodings together:

- a learned 48 x 48 table, resampled to each input's grid bilinearly with the corners aligned (held at its size,
  ``pos_embed_size``; ``pos_embed_align_corners``), added to the patches;
- axial 2D rotary positions on the patches' integer indices (T = 10,000, the two halves of each head rotated).

The pooled mean is normalised again by a LayerNorm without weight or bias. The VLM projector (Qwen's "merger")
normalises each patch (a LayerNorm of its own), puts each 2 x 2 block side by side in row-major order (a grid of
whole blocks: an image size that is a multiple of 32 px), and maps it through a linear layer of the same width, a
GELU and a last layer to the language model's width (1,024 to 5,120 by checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from .layers import Linear
from .registry import Family, register_family, register_model
from .vlm_tower import (
    TIMM_INERT,
    TIMM_RENAMED,
    TimmNames,
    Tower,
    TowerConfig,
    blocks_of,
    tower_complexity,
    tower_timm_args,
)

#: timm's names: the encoder's tensors (a table, no class token, no final norm), the projector's beside them
NAMES = TimmNames(encoder=r"pos_embed|patch_embed\.proj\.(weight|bias)|blocks\.\d+\.(norm[12]|attn\.(qkv|proj)|"
                          r"mlp\.fc[12])\.(weight|bias)",
                  projector="merger", telltale="blocks.0.mlp.fc1.bias")
#: the side of the released models' learned table
TABLE_GRID = 48


@dataclass
class Qwen3Config(TowerConfig):
    """Qwen3's vision encoder (see the module notes): an EVA-style config with its fixed parts."""

    KIND: ClassVar[str] = "Qwen3 ViT"
    FIXED: ClassVar[Tuple[str, ...]] = (
        "rope", "rope_half", "pos_embed", "class_token", "fc_norm", "final_norm", "k_bias", "norm", "mlp", "gelu",
        "qkv_fused", "reg_tokens", "init_values", "pre_norm", "pos_embed_interpolation", "pos_embed_antialias",
        "pos_embed_align_corners")
    #: Qwen3.5-9B's hidden size (each registered size has its default checkpoint's)
    LLM_WIDTH: ClassVar[int] = 4096

    architecture: str = "qwen3"
    rope: str = "axial"
    rope_half: bool = True
    pos_embed: str = "learned"
    fc_norm: bool = False
    final_norm: bool = False
    k_bias: bool = True
    gelu: str = "tanh"
    pos_embed_interpolation: str = "bilinear"
    pos_embed_antialias: bool = False
    #: the table is resampled with its corners' embeddings kept at the corners (Qwen's; timm's)
    pos_embed_align_corners: bool = True
    img_size: Any = 768
    pos_embed_size: Optional[Any] = 768
    norm_eps: float = 1e-6

    def family_problems(self) -> List[str]:
        problems = super().family_problems()
        r = self.projector_ratio
        if self.projector_dim and not problems and any(g % r for g in self.grid_size):
            (gh, gw), (ph, pw) = self.grid_size, self.patch_size
            problems.append(f"img_size {tuple(self.img_size)} is a grid of {gh}x{gw} patches, not of whole {r}x{r} "
                            f"blocks for the merger: give it a multiple of {r * ph}x{r * pw} px")
        return problems


class Merger(nn.Module):
    """Qwen's VLM projector: each patch normalised, each r x r block side by side in row-major order, a linear layer
    of that width, a GELU, a last layer to the language model's width."""

    def __init__(self, dim: int, ratio: int, width: int, eps: float):
        super().__init__()
        self.ratio, hidden = ratio, dim * ratio * ratio
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.fc1 = Linear(hidden, hidden)  # (vitkit's: fast_inference keeps their autocast copies)
        self.act = nn.GELU()
        self.fc2 = Linear(hidden, width)

    def forward(self, x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """Patches (B, gh*gw, D) -> tokens (B, gh/r * gw/r, width)."""
        (B, _, D), (gh, gw), r = x.shape, grid, self.ratio
        if gh % r or gw % r:
            raise ValueError(f"Qwen's merger takes whole {r}x{r} blocks of patches: a grid of {gh}x{gw} patches is "
                             f"not (give it images whose sides are a multiple of {r} patches)")
        x = self.norm(x).reshape(B, gh // r, r, gw // r, r, D).permute(0, 1, 3, 2, 4, 5)
        return self.fc2(self.act(self.fc1(x.reshape(B, (gh // r) * (gw // r), r * r * D))))


class Qwen3(Tower):
    """Qwen3's vision encoder and classifier (see the module notes)."""

    config_cls = Qwen3Config
    PROJECTOR = "merger"

    def build_projector(self) -> nn.Module:
        cfg = self.config
        return Merger(cfg.embed_dim, cfg.projector_ratio, cfg.projector_dim, cfg.norm_eps)

    def build_pooled_norm(self, width: int) -> nn.Module:
        return nn.LayerNorm(width, eps=self.config.norm_eps, elementwise_affine=False)


def qwen3_complexity(config: Qwen3Config):
    """The ViT's cost and the projector's: two layers over the r x r blocks."""
    hidden = config.embed_dim * config.projector_ratio ** 2
    return tower_complexity(config, lambda c: blocks_of(c, pad=False) * hidden * (hidden + c.projector_dim))


def infer_qwen3_config(sd: Mapping[str, Any], **overrides: Any) -> Qwen3Config:
    raise ValueError("a Qwen3 ViT state dict does not hold its rotary positions (no tensors): load it with its "
                     "architecture (model_name= or --model qwen3_vit_416m, ...), or from its hub folder")


#: timm's Qwen3VitClassifier / Qwen3VitEncoder arguments -> Qwen3Config fields (the table's side: qwen3_timm_args)
_RENAMED = {**TIMM_RENAMED, "merge_size": "projector_ratio"}
_INERT = TIMM_INERT + ("pos_embed_grid_size", "act_layer")


def qwen3_timm_args(args: Mapping[str, Any], config: Qwen3Config) -> Dict[str, Any]:
    """timm's ``model_args`` -> fields (:func:`.vlm_tower.tower_timm_args`; its projector is 'merge'); the table's
    side (``pos_embed_grid_size``) in patches."""
    if args.get("act_layer") is not None:
        raise ValueError("timm Qwen3 ViT model_args act_layer is not read by vitkit (its MLP's GELU is the tanh form)")
    kw = tower_timm_args(args, config, _RENAMED, _INERT, "merge")
    side = args.get("pos_embed_grid_size") or TABLE_GRID  # (whatever img_size the model was built at)
    patch = args.get("patch_size") or config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    kw["pos_embed_size"] = (side * ph, side * pw)
    return kw


FAMILY = register_family(Family(
    name="qwen3", config_cls=Qwen3Config, model_cls=Qwen3, complexity=qwen3_complexity, matches=NAMES.is_timm_layout,
    infer_config=infer_qwen3_config, detect_priority=20, to_timm=NAMES.to_timm, timm_args=qwen3_timm_args,
    layouts=("timm",), from_timm=NAMES.from_timm,
    hub_tensor_fields=NAMES.projector_fields))

#: timm's names -> the models (patch 16, 768 px, the 48 x 48 table, the whole image squashed to the square), each
#: projector to its default checkpoint's width (another checkpoint's is read off its tensors)
_SIZES = {"88m": (768, 12, 12, 3072, 1024, "Qwen3.5-0.8B"),
          "306m": (1024, 24, 16, 4096, 2048, "Qwen3.5-2B and 4B, Qwen3-VL-4B, Qwen-Drive-1.0"),
          "416m": (1152, 27, 16, 4304, 5120, "Qwen3.5-9B and 27B, Qwen3.8, Qwen3-VL-8B to 235B")}
for _size, (_width, _depth, _heads, _mlp, _llm, _source) in _SIZES.items():
    _base = Qwen3Config(patch_size=16, embed_dim=_width, depth=_depth, num_heads=_heads, mlp_dim=_mlp, num_classes=0,
                        crop_pct=1.0, crop_mode="squash", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                        interpolation="bicubic")
    register_model(f"qwen3_vit_{_size}", _base, f"timm's qwen3_vit_{_size} (the vision encoder of {_source})")
    register_model(f"qwen3_vit_{_size}_merge", _base.replace(projector_dim=_llm),
                   f"timm's qwen3_vit_{_size}_merge (the classifier over the VLM projector's tokens)")
    register_model(f"qwen3_vit_{_size}_enc", _base.replace(projector_dim=_llm, pooled_norm=False),
                   f"timm's qwen3_vit_{_size}_enc (the encoder and its VLM projector: forward_features gives the "
                   f"language model's tokens)")

__all__ = ["Qwen3Config", "Qwen3", "Merger", "FAMILY", "NAMES"]
