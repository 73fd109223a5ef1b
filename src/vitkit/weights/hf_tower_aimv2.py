"""AIMv2's vision tower in the Hugging Face layout (``Aimv2VisionModel``; the image tower of ``Aimv2Model``), read
into timm's AIMv2 (:mod:`vitkit.models.vit_names`' ``aimv2``): RMSNorm on the patch tokens and in every block,
SwiGLU (``gate_proj``/``up_proj``/``down_proj``), no class token, a learned table over the patches, the mean
of the normalised tokens. Its row of :data:`~vitkit.weights.hf_towers.TOWERS`.

Refused, each in one line: the attention-pooling head of the LiT models (``use_head``: a learned query over
k/v projections, no vitkit equivalent; the encoder of the pre-trained models has none) and the native-resolution
models (``is_native``: sine-cosine positions with their halves swapped). vitkit writes AIMv2 as timm's."""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch

from .hf_tower_parts import _fuse_qkv, _pair, read_only_tower
from .io import WeightsError
from .names import rename

_AIMV2_RULES = [
    (r"embeddings\.patch_embed\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"embeddings\.rms_norm\.weight", "patch_embed.norm.weight"),
    (r"encoder\.layers\.(\d+)\.rms_norm(1|2)\.weight", r"blocks.\1.norm\2.weight"),
    (r"encoder\.layers\.(\d+)\.attention\.(q|k|v)_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"encoder\.layers\.(\d+)\.attention\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"encoder\.layers\.(\d+)\.(?:mlp|ffn)\.gate_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_g.\2"),
    (r"encoder\.layers\.(\d+)\.(?:mlp|ffn)\.up_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_x.\2"),
    (r"encoder\.layers\.(\d+)\.(?:mlp|ffn)\.down_proj\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"rms_norm\.weight", "norm.weight"),
]


def _aimv2_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    _refusals(hf, sd)
    sd.pop("visual_projection.weight", None)  # the two-tower model's projection into the text space
    pos = sd.pop("embeddings.position_embedding.weight", None)
    out = rename(sd, _AIMV2_RULES)
    if pos is not None:
        out["pos_embed"] = pos.unsqueeze(0)
    _fuse_qkv(out, missing_k_bias=False)
    return out


def _refusals(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> None:
    if hf.get("is_native"):
        raise WeightsError("AIMv2's native-resolution model (is_native: sine-cosine positions, halves swapped) is "
                           "not read")
    if any(k.startswith("head.") for k in sd) or hf.get("use_head") and any(k.startswith("encoder.") for k in sd):
        raise WeightsError("AIMv2's attention-pooling head (use_head: its LiT models) has no vitkit equivalent; "
                           "its pre-trained models (no head) load")
    if hf.get("hidden_act", "silu") != "silu":
        raise WeightsError(f"AIMv2 with hidden_act {hf.get('hidden_act')!r}: its MLP is SwiGLU (silu)")


def _aimv2_config(hf: Mapping[str, Any], sd: Mapping[str, Any]):
    from ..models.registry import get_model_config

    _refusals(hf, sd)
    return get_model_config("aimv2_large_patch14_224").replace(
        name=None, img_size=_pair(hf.get("image_size", 224)), patch_size=_pair(hf.get("patch_size", 14)),
        in_chans=hf.get("num_channels", 3), embed_dim=hf["hidden_size"], depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"], norm_eps=hf.get("rms_norm_eps", 1e-5),
        qkv_bias=bool(hf.get("qkv_bias", False)), proj_bias=bool(hf.get("mlp_bias", False)))


AIMV2_TOWER = read_only_tower(("Aimv2VisionModel",), _aimv2_in, _aimv2_config, "AIMv2", "timm's (--to timm)")
