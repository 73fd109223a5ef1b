"""InternViT, InternVL's vision tower, in the Hugging Face layout (``InternVLVisionModel``; the ``vision_tower`` of
``InternVLForConditionalGeneration``, read through its ``vision_config``), read into vitkit's ViT: a class token and a
learned table over it and the patches, pre-norm blocks with LayerScale (``lambda_1`` / ``lambda_2``), separate
q / k / v projections (with a bias where ``attention_bias`` says), a final norm only where the tower does not pool by
the mean (``use_mean_pooling``: the released 300M tower has none). Its row of
:data:`~vitkit.weights.hf_towers.TOWERS`.

Its outputs are transformers' ``last_hidden_state`` (``forward_features``; ``model(x)`` the patches' mean, as the tower
was trained to pool). Refused, each in one line: the 6B tower's RMSNorm and its q / k norms over the whole width, and
the mask token of its pre-training (vitkit has no use for it). vitkit writes InternViT as timm's ViT."""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch

from ..models import ViTConfig
from ..models.config_base import IMAGENET_MEAN, IMAGENET_STD
from .hf_tower_parts import _fuse_qkv, _pair, read_only_tower
from .io import WeightsError
from .names import rename

_RULES = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"encoder\.layer\.(\d+)\.lambda_(1|2)", r"blocks.\1.ls\2.gamma"),
    (r"encoder\.layer\.(\d+)\.attention\.(q|k|v)_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"encoder\.layer\.(\d+)\.attention\.projection_layer\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"encoder\.layer\.(\d+)\.layernorm_before\.(weight|bias)", r"blocks.\1.norm1.\2"),
    (r"encoder\.layer\.(\d+)\.layernorm_after\.(weight|bias)", r"blocks.\1.norm2.\2"),
    (r"encoder\.layer\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
]


def _refusals(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> None:
    if hf.get("norm_type", "layer_norm") != "layer_norm" or hf.get("use_qk_norm"):
        raise WeightsError("InternViT's 6B tower (RMSNorm, q and k normalised over the whole width: norm_type "
                           f"{hf.get('norm_type')!r}, use_qk_norm {hf.get('use_qk_norm')!r}) is not read; its 300M "
                           f"tower (LayerNorm) is")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise WeightsError(f"InternViT with hidden_act {hf.get('hidden_act')!r}: its MLP's GELU is the exact one")


def _internvl_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    _refusals(hf, sd)
    sd.pop("embeddings.mask_token", None)  # (pre-training's: masked patches replaced; nothing computes with it)
    out = rename(sd, _RULES)
    _fuse_qkv(out, missing_k_bias=False)
    return out


def _internvl_config(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> ViTConfig:
    _refusals(hf, sd)
    mean_pooled = bool(hf.get("use_mean_pooling", True))
    scale = hf.get("layer_scale_init_value", 0.1)
    return ViTConfig(
        img_size=_pair(hf.get("image_size", 448)), patch_size=_pair(hf.get("patch_size", 14)),
        in_chans=hf.get("num_channels", 3), embed_dim=hf["hidden_size"], depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"], qkv_bias=bool(hf.get("attention_bias")),
        norm_eps=hf.get("layer_norm_eps", 1e-6), gelu="exact", init_values=scale if scale else None,
        pos_embed="learned" if hf.get("use_absolute_position_embeddings", True) else "none",
        final_norm=not mean_pooled, global_pool="avg" if mean_pooled else "token", fc_norm=False, num_classes=0,
        mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=1.0, crop_mode="squash")


INTERNVL_TOWER = read_only_tower(("InternVLVisionModel",), _internvl_in, _internvl_config, "InternViT",
                                 "timm's ViT (--to timm)")

__all__ = ["INTERNVL_TOWER"]
