"""DeepSeek's vision encoder (DeepSeek-V4 / V4.1, 2026): the family "deepseek" (timm's ``deepseek_vit_412m``).

A plain pre-norm ViT whose parts vitkit already has (:mod:`.eva`): RMSNorm everywhere, one fused ``qkv`` with
its full bias, a packed SwiGLU MLP, axial 2D rotary positions on the patches' integer indices (T = 10,000,
the two halves of each head rotated) and no learned position table, no class token, any input size that is
a multiple of the patch. Two things are its own:

- the MLP has no biases, while the attention's projections keep theirs;
- the classifier pools the mean of the final-normed patches and normalises it again with an RMSNorm that
  has no weight (timm's ``RmsNormFp32(affine=False)``) before the head.

timm keeps the encoder under ``encoder.`` and the head beside it; vitkit's names are the encoder's own
(:func:`from_timm` and :func:`to_timm` move the prefix). The VLM projector (DeepSeek's "aligner": a 3 x 3
pixel-unshuffle and two linear layers to the language model's width; timm's ``_align`` and ``_enc``
variants) is not built: those checkpoints are refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Dict, List, Mapping

import torch
from torch import nn

from .eva import Eva, EvaConfig
from .mlp import make_mlp
from .norms import RmsNorm
from .registry import Family, register_family, register_model
from .vit import vit_complexity

#: where timm's classifier keeps everything but its head
TIMM_PREFIX = "encoder."
#: the tensors of timm's DeepSeek classifier, and of nothing else vitkit reads (no class token, no table,
#: bias-free MLP layers)
_TIMM_NAMES = re.compile(r"encoder\.(patch_embed\.proj\.(weight|bias)|norm\.weight|blocks\.\d+\.(norm[12]\.weight|"
                         r"attn\.(qkv|proj)\.(weight|bias)|mlp\.fc[12]\.weight))|head\.(weight|bias)")
#: the VLM projector's tensors (timm's ``_align`` classifier)
_ALIGNER = re.compile(r"(encoder\.)?aligner\.")
#: timm's variants with the VLM projector, refused by name: what each is
UNBUILT = {"deepseek_vit_412m_align": "DeepSeek's encoder read out through its VLM projector (the aligner)",
           "deepseek_vit_412m_enc": "DeepSeek's encoder with its VLM projector (the aligner's tokens for the "
                                    "language model)"}


@dataclass
class DeepseekConfig(EvaConfig):
    """DeepSeek's vision encoder (see the module notes): an EVA-style config with its fixed parts."""

    KIND: ClassVar[str] = "DeepSeek ViT"

    architecture: str = "deepseek"
    rope: str = "axial"
    rope_half: bool = True
    pos_embed: str = "none"
    class_token: bool = False
    global_pool: str = "avg"
    #: the final norm before pooling (the pooled mean gets the weightless one)
    fc_norm: bool = False
    k_bias: bool = True
    norm: str = "rmsnorm"
    mlp: str = "swiglu_packed"
    dynamic_img_size: bool = True
    #: timm's ``final_norm``: the weightless RMSNorm of the pooled mean
    pooled_norm: bool = True

    def family_problems(self) -> List[str]:
        problems = super().family_problems()
        fixed = dict(rope="axial", rope_half=True, pos_embed="none", class_token=False, fc_norm=False, k_bias=True,
                     norm="rmsnorm", mlp="swiglu_packed", qkv_fused=True, reg_tokens=0, init_values=None,
                     pre_norm=False)
        problems += [f"{k} is {v!r} in a DeepSeek ViT, got {getattr(self, k)!r}" for k, v in fixed.items()
                     if getattr(self, k) != v]
        if self.global_pool != "avg":
            problems.append(f"a DeepSeek ViT pools the mean of its patches (global_pool='avg'), got "
                            f"{self.global_pool!r}")
        return problems  # (pooled_norm's type: checked with every bool field, config_base)


class Deepseek(Eva):
    """DeepSeek's vision encoder and classifier (see the module notes)."""

    config_cls = DeepseekConfig

    def __init__(self, config=None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg = self.config
        self.fc_norm = RmsNorm(cfg.embed_dim, cfg.norm_eps, affine=False) if cfg.pooled_norm else nn.Identity()

    def build_block(self, i: int, drop_path: float, norm) -> nn.Module:
        """The EVA block with a packed SwiGLU without biases (the attention keeps its own)."""
        cfg = self.config
        mlp = make_mlp(cfg.mlp, cfg.embed_dim, cfg.mlp_dim, cfg.gelu, cfg.drop_rate, False)
        return self.assemble_block(drop_path, norm, self.build_attention(norm, i), mlp)


# ----------------------------------------------------------------------------- names: timm's classifier


def is_timm_layout(keys: Collection[str]) -> bool:
    """Whether these are timm's DeepSeek classifier's tensors (``encoder.`` and ``head.``), and nothing else."""
    keys = list(keys)
    return bool(keys) and "encoder.blocks.0.mlp.fc1.weight" in keys and all(
        _TIMM_NAMES.fullmatch(k) or _ALIGNER.match(k) for k in keys)


def from_timm(sd: Mapping[str, Any]) -> Dict[str, Any]:
    """timm's classifier state dict -> vitkit's names (the encoder's prefix off); the VLM projector is refused."""
    projector = sorted(k for k in sd if _ALIGNER.match(k))
    if projector:
        raise ValueError(f"a DeepSeek checkpoint with its VLM projector ({projector[0]}, ...: timm's "
                         f"deepseek_vit_412m_align) is not one vitkit builds: load the encoder's tensors alone")
    return {k[len(TIMM_PREFIX):] if k.startswith(TIMM_PREFIX) else k: v for k, v in sd.items()}


def to_timm(model: nn.Module) -> Dict[str, torch.Tensor]:
    """vitkit's DeepSeek model -> timm's classifier names (the encoder under ``encoder.``, the head beside it)."""
    return {(k if k.startswith("head.") else TIMM_PREFIX + k): v.detach().cpu().contiguous()
            for k, v in model.state_dict().items()}


def infer_deepseek_config(sd: Mapping[str, Any], **overrides: Any) -> DeepseekConfig:
    raise ValueError("a DeepSeek ViT state dict does not hold its rotary positions (no tensors): load it with its "
                     "architecture (model_name= or --model deepseek_vit_412m), or from its hub folder")


#: timm's DeepseekVitClassifier arguments -> DeepseekConfig fields
_RENAMED = {"embed_dim": "embed_dim", "rope_temperature": "rope_temperature", "norm_eps": "norm_eps",
            "final_norm": "pooled_norm", "drop_path_rate": "drop_path_rate", "attn_drop_rate": "attn_drop_rate"}
_INERT = ("img_size", "patch_size", "in_chans", "num_classes", "global_pool", "depth", "num_heads", "drop_rate",
          "proj_drop_rate", "mlp_ratio")


def deepseek_timm_args(args: Mapping[str, Any], config: DeepseekConfig) -> Dict[str, Any]:
    """timm's ``model_args`` -> fields; the projector (``encoder_pool='align'``) and padded inputs are refused."""
    kw = {ours: args[theirs] for theirs, ours in _RENAMED.items() if args.get(theirs) is not None}
    if args.get("encoder_pool") or args.get("out_features"):
        raise ValueError("timm DeepSeek model_args encoder_pool/out_features build the VLM projector (the aligner), "
                         "which vitkit does not build")
    if args.get("dynamic_img_pad"):
        raise ValueError("timm DeepSeek model_args dynamic_img_pad (zero-padding images to the patch grid) is not "
                         "read by vitkit: give it images whose size is a multiple of the patch")
    unknown = sorted(k for k in args if k not in _RENAMED and k not in _INERT
                     and k not in ("encoder_pool", "out_features", "dynamic_img_pad"))
    if unknown:
        raise ValueError(f"timm DeepSeek model_args {', '.join(unknown)} are not read by vitkit; remove them or build "
                         f"the model with vitkit's fields")
    width = kw.get("embed_dim", config.embed_dim)
    if args.get("mlp_ratio") is not None or "embed_dim" in kw:  # timm's hidden width follows the width given
        ratio = args["mlp_ratio"] if args.get("mlp_ratio") is not None else config.mlp_dim / config.embed_dim
        kw["mlp_dim"] = int(width * ratio)
    return kw


FAMILY = register_family(Family(
    name="deepseek", config_cls=DeepseekConfig, model_cls=Deepseek, complexity=vit_complexity, matches=is_timm_layout,
    infer_config=infer_deepseek_config, detect_priority=20, to_timm=to_timm, timm_args=deepseek_timm_args,
    layouts=("timm",)))

#: timm's name -> the model: 32 blocks of 1,024 (16 heads), SwiGLU 2,816, patch 14, its two checkpoints' size
#: (DeepSeek-V4.1-Flash's: 546 px, 39 x 39 patches), the whole image kept (crop_mode='border')
register_model("deepseek_vit_412m", DeepseekConfig(
    img_size=546, patch_size=14, embed_dim=1024, depth=32, num_heads=16, mlp_dim=2816, num_classes=0,
    crop_pct=1.0, crop_mode="border", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bicubic"),
    "timm's deepseek_vit_412m (DeepSeek-V4 / V4.1's vision encoder)")


__all__ = ["DeepseekConfig", "Deepseek", "FAMILY", "UNBUILT", "is_timm_layout", "from_timm", "to_timm"]
