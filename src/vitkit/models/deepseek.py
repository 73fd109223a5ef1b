"""DeepSeek's vision encoder (DeepSeek-V4 / V4.1, 2026): the family "deepseek" (timm's ``deepseek_vit_412m``).

A plain pre-norm ViT whose parts vitkit already has (:mod:`.eva`): RMSNorm everywhere, one fused ``qkv`` with
its full bias, a packed SwiGLU MLP, axial 2D rotary positions on the patches' integer indices (T = 10,000,
the two halves of each head rotated) and no learned position table, no class token, any input size that is
a multiple of the patch. Two things are its own:

- the MLP has no biases, while the attention's projections keep theirs;
- the classifier pools the mean of the final-normed patches and normalises it again with an RMSNorm that
  has no weight (timm's ``RmsNormFp32(affine=False)``) before the head.

The VLM projector (DeepSeek's "aligner", ``projector_dim`` > 0: timm's ``_align`` classifier and ``_enc``
encoder) puts each 3 x 3 block of final patches side by side, channel-major, the grid zero-padded at the bottom
and right to a multiple of 3, and maps them through two linear layers with a GELU between them to the language
model's width (5,120 for V4.1-Flash, 4,096 for V4-Flash-Vision-Exp). With it, ``forward_features`` gives those
tokens (what the language model reads, as timm's) and the pooled mean is theirs.

timm keeps the classifier's encoder under ``encoder.`` and the head beside it; vitkit's names are the encoder's
own, as timm's ``_enc`` has them (:func:`from_timm` and :func:`to_timm` move the prefix).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Dict, List, Mapping, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .config_base import _is_int
from .eva import Eva, EvaConfig
from .layers import Linear
from .mlp import make_mlp
from .norms import RmsNorm
from .registry import Family, register_family, register_model
from .vit import vit_complexity

#: where timm's classifier keeps everything but its head
TIMM_PREFIX = "encoder."
#: the encoder's tensors (no class token, no table, bias-free MLP layers) and the VLM projector's
_ENCODER = (r"(patch_embed\.proj\.(weight|bias)|norm\.weight|blocks\.\d+\.(norm[12]\.weight|attn\.(qkv|proj)\."
            r"(weight|bias)|mlp\.fc[12]\.weight))")
_ALIGNER = r"aligner\.fc[12]\.(weight|bias)"
#: timm's classifier (the encoder under ``encoder.``, the head beside it) and timm's ``_enc`` encoder with its
#: projector (vitkit's own names; the projector's tell them from another family's)
_TIMM_NAMES = re.compile(rf"encoder\.({_ENCODER}|{_ALIGNER})|head\.(weight|bias)")
_ENCODER_NAMES = re.compile(rf"{_ENCODER}|{_ALIGNER}")
#: the projector's width in the registered models: DeepSeek-V4.1-Flash's hidden size
LLM_WIDTH = 5120


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
    #: the VLM projector's width (timm's ``out_features``: the language model's); 0: no projector
    projector_dim: int = 0
    #: the projector's r x r blocks of patches (timm's ``downsample_ratio``)
    projector_ratio: int = 3

    def family_problems(self) -> List[str]:
        problems = super().family_problems()
        if not _is_int(self.projector_dim) or self.projector_dim < 0:
            problems.append(f"projector_dim must be 0 (no VLM projector) or a positive integer, got "
                            f"{self.projector_dim!r}")
        if not _is_int(self.projector_ratio) or not 1 <= self.projector_ratio <= 16:
            problems.append(f"projector_ratio must be an integer in 1..16, got {self.projector_ratio!r}")
        fixed = dict(rope="axial", rope_half=True, pos_embed="none", class_token=False, fc_norm=False, k_bias=True,
                     norm="rmsnorm", mlp="swiglu_packed", qkv_fused=True, reg_tokens=0, init_values=None,
                     pre_norm=False)
        problems += [f"{k} is {v!r} in a DeepSeek ViT, got {getattr(self, k)!r}" for k, v in fixed.items()
                     if getattr(self, k) != v]
        if self.global_pool != "avg":
            problems.append(f"a DeepSeek ViT pools the mean of its patches (global_pool='avg'), got "
                            f"{self.global_pool!r}")
        return problems  # (pooled_norm's type: checked with every bool field, config_base)


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


class Deepseek(Eva):
    """DeepSeek's vision encoder and classifier (see the module notes)."""

    config_cls = DeepseekConfig

    def __init__(self, config=None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg = self.config
        self.aligner = Aligner(cfg.embed_dim, cfg.projector_ratio, cfg.projector_dim) if cfg.projector_dim else None
        if self.aligner is not None and self.aligner.fc1.weight.device.type != "meta":
            for fc in (self.aligner.fc1, self.aligner.fc2):  # (timm's: truncated normal, zero biases)
                nn.init.trunc_normal_(fc.weight, std=0.02)
                nn.init.zeros_(fc.bias)
        self.fc_norm = RmsNorm(self.num_features, cfg.norm_eps, affine=False) if cfg.pooled_norm else nn.Identity()

    def pooled_width(self, global_pool: str) -> int:
        """The projector's width where there is one (its tokens are pooled)."""
        return self.config.projector_dim or super().pooled_width(global_pool)

    def build_block(self, i: int, drop_path: float, norm) -> nn.Module:
        """The EVA block with a packed SwiGLU without biases (the attention keeps its own)."""
        cfg = self.config
        mlp = make_mlp(cfg.mlp, cfg.embed_dim, cfg.mlp_dim, cfg.gelu, cfg.drop_rate, False)
        return self.assemble_block(drop_path, norm, self.build_attention(norm, i), mlp)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The final-normed patches (B, N, D); with the projector, its tokens for the language model
        (B, ceil(gh/r) * ceil(gw/r), projector_dim), as timm's ``forward_features``."""
        if self.aligner is None:
            return super().forward_features(x)
        x, grid = self.embed(x)
        return self.aligner(self.encode_tokens(x, grid)[0], grid)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """As every token model's; with the projector, the head pools its tokens (the attention maps stay the
        encoder's)."""
        if self.aligner is None:
            return super().forward(x, return_attention)
        x, grid = self.embed(x)
        tokens, attns = self.encode_tokens(x, grid, return_attention)
        logits = self.forward_head(self.aligner(tokens, grid))
        return (logits, attns) if return_attention else logits


def deepseek_complexity(config: DeepseekConfig):
    """The ViT's cost (:func:`.vit.vit_complexity`) and the projector's: its two layers over the r x r blocks,
    and a head over its width."""
    c = vit_complexity(config)
    if not config.projector_dim:
        return c
    (gh, gw), r, P, D = config.grid_size, config.projector_ratio, config.projector_dim, config.embed_dim
    blocks = math.ceil(gh / r) * math.ceil(gw / r)
    macs = c.macs + blocks * (D * r * r * P + P * P) + (P - D) * config.num_classes
    return dataclasses.replace(c, macs=macs, attn_macs_share=c.attn_macs_share * c.macs / macs)


# ----------------------------------------------------------------------------- names: timm's classifier


def is_timm_layout(keys: Collection[str]) -> bool:
    """Whether these are timm's DeepSeek tensors: its classifier's (``encoder.`` and ``head.``), or its encoder's
    with the VLM projector (``aligner.``), and nothing else."""
    keys = list(keys)
    if "encoder.blocks.0.mlp.fc1.weight" in keys:
        return all(_TIMM_NAMES.fullmatch(k) for k in keys)
    return "aligner.fc1.weight" in keys and "blocks.0.mlp.fc1.weight" in keys and all(
        _ENCODER_NAMES.fullmatch(k) for k in keys)


def from_timm(sd: Mapping[str, Any]) -> Dict[str, Any]:
    """timm's state dict -> vitkit's names (the classifier's encoder prefix off; the encoder's are vitkit's)."""
    return {k[len(TIMM_PREFIX):] if k.startswith(TIMM_PREFIX) else k: v for k, v in sd.items()}


def timm_name(key: str, config: DeepseekConfig) -> str:
    """A tensor's name in timm: its encoder's (``_enc``: the projector, no classifier and no norm after pooling)
    are vitkit's; its classifier's have the encoder under ``encoder.`` and the head beside it."""
    encoder = bool(config.projector_dim) and not config.pooled_norm and not config.num_classes
    return key if encoder or key.startswith("head.") else TIMM_PREFIX + key


def to_timm(model: nn.Module) -> Dict[str, torch.Tensor]:
    """vitkit's DeepSeek model -> timm's names (:func:`timm_name`)."""
    return {timm_name(k, model.config): v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def hub_tensor_fields(sd: Mapping[str, Any], config: DeepseekConfig) -> Dict[str, Any]:
    """The projector's width and ratio off its first layer, where the config has one (timm resolves the width from
    the checkpoint's tag: V4.1-Flash's 5,120, V4-Flash-Vision-Exp's 4,096; a hub config.json holds neither)."""
    if not config.projector_dim:
        return {}  # (projector tensors in a file of a model without one: refused by the loader as unexpected)
    fc1 = next((sd[k] for k in ("aligner.fc1.weight", "encoder.aligner.fc1.weight") if k in sd), None)
    embed = next((sd[k] for k in ("patch_embed.proj.weight", "encoder.patch_embed.proj.weight") if k in sd), None)
    if fc1 is None or embed is None or len(fc1.shape) != 2:
        return {}
    ratio = math.isqrt(int(fc1.shape[1]) // int(embed.shape[0]))
    if ratio * ratio * int(embed.shape[0]) != int(fc1.shape[1]):
        raise ValueError(f"the VLM projector's first layer takes {int(fc1.shape[1])} inputs: no r x r blocks of "
                         f"{int(embed.shape[0])}-wide patches")
    return {"projector_dim": int(fc1.shape[0]), "projector_ratio": ratio}


def infer_deepseek_config(sd: Mapping[str, Any], **overrides: Any) -> DeepseekConfig:
    raise ValueError("a DeepSeek ViT state dict does not hold its rotary positions (no tensors): load it with its "
                     "architecture (model_name= or --model deepseek_vit_412m), or from its hub folder")


#: timm's DeepseekVitClassifier / DeepseekVitEncoder arguments -> DeepseekConfig fields
_RENAMED = {"embed_dim": "embed_dim", "rope_temperature": "rope_temperature", "norm_eps": "norm_eps",
            "final_norm": "pooled_norm", "drop_path_rate": "drop_path_rate", "attn_drop_rate": "attn_drop_rate",
            "out_features": "projector_dim", "downsample_ratio": "projector_ratio"}
_INERT = ("img_size", "patch_size", "in_chans", "num_classes", "depth", "num_heads", "drop_rate", "proj_drop_rate",
          "mlp_ratio")
_POOLS = ("global_pool", "encoder_pool", "dynamic_img_pad")


def deepseek_timm_args(args: Mapping[str, Any], config: DeepseekConfig) -> Dict[str, Any]:
    """timm's ``model_args`` -> fields. Whether the projector is there: the classifier's ``encoder_pool``
    ('align'), the encoder's ``global_pool`` ('align'; 'avg' pools its patches without it); the width (timm's
    ``out_features``, else the checkpoint tag's) is read off the tensors (:func:`hub_tensor_fields`)."""
    kw = {ours: args[theirs] for theirs, ours in _RENAMED.items() if args.get(theirs) is not None}
    unknown = sorted(k for k in args if k not in _RENAMED and k not in _INERT and k not in _POOLS)
    if unknown:
        raise ValueError(f"timm DeepSeek model_args {', '.join(unknown)} are not read by vitkit; remove them or build "
                         f"the model with vitkit's fields")
    if args.get("dynamic_img_pad"):
        raise ValueError("timm DeepSeek model_args dynamic_img_pad (zero-padding images to the patch grid) is not "
                         "read by vitkit: give it images whose size is a multiple of the patch")
    pool, encoder_pool = args.get("global_pool"), args.get("encoder_pool")
    encoder = bool(config.projector_dim) and not config.pooled_norm  # timm's _enc (no classifier, so no norm)
    if pool not in ((None, "align", "avg") if encoder else (None, "avg")) or encoder_pool not in (None, "", "align"):
        raise ValueError(f"timm DeepSeek model_args global_pool={pool!r}, encoder_pool={encoder_pool!r}: vitkit "
                         f"pools the patches (or the projector's tokens) into one vector ('avg'; the encoder's "
                         f"'align': its projector's tokens)")
    if (encoder and pool == "avg") or encoder_pool == "":
        kw["projector_dim"] = 0  # the patches' mean, without the projector
    elif encoder_pool == "align" and not config.projector_dim:
        kw.setdefault("projector_dim", LLM_WIDTH)  # (the tensors' width replaces it: hub_tensor_fields)
    kw["global_pool"] = "avg"
    width = kw.get("embed_dim", config.embed_dim)
    if args.get("mlp_ratio") is not None or "embed_dim" in kw:  # timm's hidden width follows the width given
        ratio = args["mlp_ratio"] if args.get("mlp_ratio") is not None else config.mlp_dim / config.embed_dim
        kw["mlp_dim"] = int(width * ratio)
    return kw


FAMILY = register_family(Family(
    name="deepseek", config_cls=DeepseekConfig, model_cls=Deepseek, complexity=deepseek_complexity,
    matches=is_timm_layout, infer_config=infer_deepseek_config, detect_priority=20, to_timm=to_timm,
    timm_args=deepseek_timm_args, layouts=("timm",), from_timm=from_timm, hub_tensor_fields=hub_tensor_fields))

#: timm's names -> the models: 32 blocks of 1,024 (16 heads), SwiGLU 2,816, patch 14, its two checkpoints' size
#: (DeepSeek-V4.1-Flash's: 546 px, 39 x 39 patches), the whole image kept (crop_mode='border'); the projector to
#: V4.1-Flash's width (V4-Flash-Vision-Exp's, 4,096, is read off its tensors)
_DEEPSEEK_412M = DeepseekConfig(
    img_size=546, patch_size=14, embed_dim=1024, depth=32, num_heads=16, mlp_dim=2816, num_classes=0,
    crop_pct=1.0, crop_mode="border", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bicubic")
register_model("deepseek_vit_412m", _DEEPSEEK_412M, "timm's deepseek_vit_412m (DeepSeek-V4 / V4.1's vision encoder)")
register_model("deepseek_vit_412m_align", _DEEPSEEK_412M.replace(projector_dim=LLM_WIDTH),
               "timm's deepseek_vit_412m_align (the classifier over the VLM projector's tokens)")
register_model("deepseek_vit_412m_enc", _DEEPSEEK_412M.replace(projector_dim=LLM_WIDTH, pooled_norm=False),
               "timm's deepseek_vit_412m_enc (the encoder and its VLM projector: forward_features gives the "
               "language model's tokens)")


__all__ = ["DeepseekConfig", "Deepseek", "Aligner", "FAMILY", "is_timm_layout", "from_timm", "to_timm", "timm_name",
           "hub_tensor_fields"]
