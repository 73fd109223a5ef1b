"""BLIP's, BLIP-2's and InstructBLIP's image encoders in the Hugging Face layout (``BlipVisionModel``,
``Blip2VisionModel``, ``InstructBlipVisionModel``: the ``vision_model`` of their captioning, question-answering and
retrieval models, read through those models' ``vision_config``), read into vitkit's ViT. Their row of
:data:`~vitkit.weights.hf_towers.TOWERS`.

CLIP's tower but for a fused ``qkv`` (BLIP-2's with the query's and value's bias only, stored as one bias whose
key part is zero), ``projection`` for the attention's output, no norm before the blocks, and ``post_layernorm`` over
every token: its ``last_hidden_state`` is vitkit's ``forward_features``, and what their language models and Q-Formers
read. ``model(x)`` is the normalised class token; transformers' ``pooler_output`` normalises it a second time (the
same norm twice), which no model of theirs reads. vitkit writes these encoders as timm's ViT."""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch

from ..models import ViTConfig
from ..models.vit_names import CLIP_MEAN, CLIP_STD
from .hf_tower_clip import CLIP_FAMILY_RULES
from .hf_tower_parts import _act, _pair, read_only_tower
from .io import WeightsError
from .names import rename

_RULES = [
    *CLIP_FAMILY_RULES,
    (r"encoder\.layers\.(\d+)\.self_attn\.qkv\.(weight|bias)", r"blocks.\1.attn.qkv.\2"),
    (r"encoder\.layers\.(\d+)\.self_attn\.projection\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
]


def _blip_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    cls, pos = sd.pop("embeddings.class_embedding", None), sd.pop("embeddings.position_embedding", None)
    out = rename(sd, _RULES)
    if cls is not None:
        out["cls_token"] = cls.reshape(1, 1, -1)
    if pos is not None:
        out["pos_embed"] = pos.reshape(1, -1, pos.shape[-1])
    return out


def _blip_config(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> ViTConfig:
    if _act(hf) != "exact":
        raise WeightsError(f"BLIP's encoder with hidden_act {hf.get('hidden_act')!r}: its MLP's GELU is the exact one")
    return ViTConfig(
        img_size=_pair(hf.get("image_size", 224)), patch_size=_pair(hf.get("patch_size", 16)),
        in_chans=hf.get("num_channels", 3), embed_dim=hf["hidden_size"], depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"],
        qkv_bias=any(k.endswith("self_attn.qkv.bias") for k in sd), norm_eps=hf.get("layer_norm_eps", 1e-5),
        gelu="exact", global_pool="token", num_classes=0, mean=CLIP_MEAN, std=CLIP_STD, crop_pct=1.0,
        crop_mode="squash")


BLIP_TOWER = read_only_tower(("BlipVisionModel", "Blip2VisionModel", "InstructBlipVisionModel"), _blip_in,
                             _blip_config, "BLIP's image encoder", "timm's ViT (--to timm)")

__all__ = ["BLIP_TOWER"]
