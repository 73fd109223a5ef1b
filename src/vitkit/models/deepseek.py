"""DeepSeek's vision encoder (DeepSeek-V4 / V4.1, 2026): the family "deepseek" (timm's ``deepseek_vit_412m``,
``_align``, ``_enc``), a VLM's tower (:mod:`.vlm_tower`: the projector, the pooled norm, timm's names).

A plain pre-norm ViT whose parts vitkit already has (:mod:`.eva`): RMSNorm everywhere, one fused ``qkv`` with
its full bias, a packed SwiGLU MLP, axial 2D rotary positions on the patches' integer indices (T = 10,000,
the two halves of each head rotated) and no learned position table, no class token, any input size that is
a multiple of the patch. Its own parts:

- the MLP has no biases, while the attention's projections keep theirs;
- the pooled mean is normalised again with an RMSNorm that has no weight (timm's ``RmsNormFp32(affine=False)``);
- the VLM projector (DeepSeek's "aligner") puts each 3 x 3 block of final patches side by side, channel-major,
  the grid zero-padded at the bottom and right to a multiple of 3, and maps them through two linear layers with a
  GELU between them to the language model's width (5,120 for V4.1-Flash, 4,096 for V4-Flash-Vision-Exp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .layers import Linear
from .mlp import make_mlp
from .norms import RmsNorm
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

#: timm's names: the encoder's tensors (no class token, no table, bias-free MLP layers), the projector's beside them
NAMES = TimmNames(encoder=r"patch_embed\.proj\.(weight|bias)|norm\.weight|blocks\.\d+\.(norm[12]\.weight|"
                          r"attn\.(qkv|proj)\.(weight|bias)|mlp\.fc[12]\.weight)",
                  projector="aligner", telltale="blocks.0.mlp.fc1.weight")


@dataclass
class DeepseekConfig(TowerConfig):
    """DeepSeek's vision encoder (see the module notes): an EVA-style config with its fixed parts."""

    KIND: ClassVar[str] = "DeepSeek ViT"
    FIXED: ClassVar[Tuple[str, ...]] = ("rope", "rope_half", "pos_embed", "class_token", "fc_norm", "k_bias", "norm",
                                        "mlp", "qkv_fused", "reg_tokens", "init_values", "pre_norm")
    #: DeepSeek-V4.1-Flash's hidden size
    LLM_WIDTH: ClassVar[int] = 5120

    architecture: str = "deepseek"
    rope: str = "axial"
    rope_half: bool = True
    pos_embed: str = "none"
    #: the final norm before pooling (the pooled mean gets the weightless one)
    fc_norm: bool = False
    k_bias: bool = True
    norm: str = "rmsnorm"
    mlp: str = "swiglu_packed"
    projector_ratio: int = 3


class Aligner(nn.Module):
    """DeepSeek's VLM projector: each r x r block of patches side by side, channel-major (the grid zero-padded at
    the bottom and right to a multiple of r), then two linear layers with a GELU between them."""

    def __init__(self, dim: int, ratio: int, width: int):
        super().__init__()
        self.ratio = ratio
        self.fc1 = Linear(dim * ratio * ratio, width)  # (vitkit's: fast_inference keeps their autocast copies)
        self.act = nn.GELU()
        self.fc2 = Linear(width, width)

    def forward(self, x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """Patches (B, gh*gw, D) -> tokens (B, ceil(gh/r) * ceil(gw/r), width)."""
        (B, _, D), (gh, gw), r = x.shape, grid, self.ratio
        x = F.pad(x.transpose(1, 2).reshape(B, D, gh, gw), (0, -gw % r, 0, -gh % r))
        h, w = x.shape[2] // r, x.shape[3] // r
        x = x.reshape(B, D, h, r, w, r).permute(0, 2, 4, 1, 3, 5).reshape(B, h * w, D * r * r)
        return self.fc2(self.act(self.fc1(x)))


class Deepseek(Tower):
    """DeepSeek's vision encoder and classifier (see the module notes)."""

    config_cls = DeepseekConfig
    PROJECTOR = "aligner"

    def build_projector(self) -> nn.Module:
        cfg = self.config
        return Aligner(cfg.embed_dim, cfg.projector_ratio, cfg.projector_dim)

    def build_pooled_norm(self, width: int) -> nn.Module:
        return RmsNorm(width, self.config.norm_eps, affine=False)

    def build_block(self, i: int, drop_path: float, norm) -> nn.Module:
        """The EVA block with a packed SwiGLU without biases (the attention keeps its own)."""
        cfg = self.config
        mlp = make_mlp(cfg.mlp, cfg.embed_dim, cfg.mlp_dim, cfg.gelu, cfg.drop_rate, False)
        return self.assemble_block(drop_path, norm, self.build_attention(norm, i), mlp)


def deepseek_complexity(config: DeepseekConfig):
    """The ViT's cost and the projector's: its two layers over the padded r x r blocks."""
    r, P, D = config.projector_ratio, config.projector_dim, config.embed_dim
    return tower_complexity(config, lambda c: blocks_of(c, pad=True) * (D * r * r * P + P * P))


def infer_deepseek_config(sd: Mapping[str, Any], **overrides: Any) -> DeepseekConfig:
    raise ValueError("a DeepSeek ViT state dict does not hold its rotary positions (no tensors): load it with its "
                     "architecture (model_name= or --model deepseek_vit_412m), or from its hub folder")


#: timm's DeepseekVitClassifier / DeepseekVitEncoder arguments -> DeepseekConfig fields
_RENAMED = {**TIMM_RENAMED, "downsample_ratio": "projector_ratio"}


def deepseek_timm_args(args: Mapping[str, Any], config: DeepseekConfig) -> Dict[str, Any]:
    """timm's ``model_args`` -> fields (:func:`.vlm_tower.tower_timm_args`; its projector is 'align')."""
    return tower_timm_args(args, config, _RENAMED, TIMM_INERT, "align", padded=("dynamic_img_pad",))


FAMILY = register_family(Family(
    name="deepseek", config_cls=DeepseekConfig, model_cls=Deepseek, complexity=deepseek_complexity,
    matches=NAMES.is_timm_layout, infer_config=infer_deepseek_config, detect_priority=20, to_timm=NAMES.to_timm,
    timm_args=deepseek_timm_args, layouts=("timm",), from_timm=NAMES.from_timm,
    hub_tensor_fields=NAMES.projector_fields))

#: timm's names -> the models: 32 blocks of 1,024 (16 heads), SwiGLU 2,816, patch 14, its two checkpoints' size
#: (DeepSeek-V4.1-Flash's: 546 px, 39 x 39 patches), the whole image kept (crop_mode='border'); the projector to
#: V4.1-Flash's width (V4-Flash-Vision-Exp's, 4,096, is read off its tensors)
_DEEPSEEK_412M = DeepseekConfig(
    img_size=546, patch_size=14, embed_dim=1024, depth=32, num_heads=16, mlp_dim=2816, num_classes=0,
    crop_pct=1.0, crop_mode="border", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bicubic")
register_model("deepseek_vit_412m", _DEEPSEEK_412M, "timm's deepseek_vit_412m (DeepSeek-V4 / V4.1's vision encoder)")
register_model("deepseek_vit_412m_align", _DEEPSEEK_412M.replace(projector_dim=5120),
               "timm's deepseek_vit_412m_align (the classifier over the VLM projector's tokens)")
register_model("deepseek_vit_412m_enc", _DEEPSEEK_412M.replace(projector_dim=5120, pooled_norm=False),
               "timm's deepseek_vit_412m_enc (the encoder and its VLM projector: forward_features gives the "
               "language model's tokens)")

__all__ = ["DeepseekConfig", "Deepseek", "Aligner", "FAMILY", "NAMES"]
