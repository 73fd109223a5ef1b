"""DeepSeek's own checkpoints (DeepSeek-V4.1-Flash, DeepSeek-V4-Flash-Vision-Exp: the first of the 48
``model-*.safetensors`` shards holds the whole vision tower), read into vitkit's DeepSeek model (:mod:`vitkit.models.
deepseek`). Read-only: timm's names are the layout vitkit writes it in.

- The vision tower is under ``vision.``, its VLM projector under ``aligner.``; every other tensor of the shard is
  the language model's (its own ``norm.weight`` and ``head.weight`` among them, and the image span embeddings) and
  is left out.
- ``attn.wqkv`` / ``attn.wo`` are timm's ``qkv`` / ``proj``, the packed SwiGLU's ``mlp.w1`` / ``w2`` its ``fc1`` /
  ``fc2``, the projector's ``w1`` / ``w2`` its ``fc1`` / ``fc2``.
- The patch embedding is a linear layer over each flattened (channel, row, column) patch: the same numbers as
  timm's convolution kernel of stride 14, reshaped.

The architecture is read off the shapes (heads: width / 64, as the 412M tower's 16 of 1,024); the image size is the
checkpoint's own (V4.1-Flash's 546 px, V4-Flash-Vision-Exp's 392 px, told apart by the projector's width, as timm's
configs pair them); any multiple of the patch runs.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping

import torch

from ..models import get_model_config
from ..models.vlm_tower import blocks_ratio
from .io import WeightsError
from .names import depth_of

VISION, ALIGNER = "vision.", "aligner."
HEAD_WIDTH = 64
#: the projector's width -> the checkpoint's image size (timm's deepseek_vit configs)
IMG_SIZE_BY_WIDTH = {5120: 546, 4096: 392}
_RENAMES = ((".attn.wqkv.", ".attn.qkv."), (".attn.wo.", ".attn.proj."), (".mlp.w1.", ".mlp.fc1."),
            (".mlp.w2.", ".mlp.fc2."))


def detect(keys) -> bool:
    """Whether a state dict's names are DeepSeek's own (its vision tower under ``vision.``)."""
    return any(k.startswith(VISION + "blocks.") and ".attn.wqkv." in k for k in keys)


def tower_names(names) -> list:
    """Of a checkpoint's tensor names, its tower's and its projector's (what :func:`to_native` reads)."""
    return [n for n in names if n.startswith((VISION, ALIGNER))]


def to_native(sd: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """DeepSeek's names -> vitkit's (the language model's tensors left out)."""
    out: Dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key.startswith(ALIGNER):
            key = key.replace("aligner.w1.", "aligner.fc1.").replace("aligner.w2.", "aligner.fc2.")
        elif key.startswith(VISION):
            key = key[len(VISION):]
            for theirs, ours in _RENAMES:
                key = key.replace(theirs, ours)
            if key == "patch_embed.proj.weight" and value.dim() == 2:  # a linear layer over each (channel, row,
                value = value.reshape(value.shape[0], -1, *_patch(value))  # column) patch: a stride-patch conv
        else:
            continue  # the language model's
        out[key] = value
    return out


def _patch(weight) -> tuple:
    """The (rows, columns) of a linear patch embedding's flattened RGB patches."""
    side = math.isqrt(int(weight.shape[1]) // 3)
    if 3 * side * side != int(weight.shape[1]):
        raise WeightsError(f"DeepSeek's patch embedding takes {int(weight.shape[1])} values: no square RGB patch")
    return side, side


def infer_config(sd: Mapping[str, Any], **overrides: Any):
    """The architecture of a DeepSeek checkpoint (``sd``: its own names; the language model's may be there)."""
    embed = sd[VISION + "patch_embed.proj.weight"]
    width = int(embed.shape[0])
    patch = _patch(embed) if embed.dim() == 2 else (int(embed.shape[2]), int(embed.shape[3]))
    depth = depth_of(sd, VISION + "blocks.")
    kw: Dict[str, Any] = dict(embed_dim=width, depth=depth, num_heads=max(1, width // HEAD_WIDTH),
                              patch_size=patch, mlp_dim=int(sd[VISION + "blocks.0.mlp.w2.weight"].shape[1]))
    fc1 = sd.get(ALIGNER + "w1.weight")
    base = "deepseek_vit_412m"
    if fc1 is not None:
        ratio = blocks_ratio(int(fc1.shape[1]), width)
        if ratio is None:
            raise WeightsError(f"DeepSeek's projector takes {int(fc1.shape[1])} inputs: no r x r blocks of "
                               f"{width}-wide patches")
        base = "deepseek_vit_412m_enc"  # (the tower and its projector: the language model's tokens)
        kw.update(projector_dim=int(fc1.shape[0]), projector_ratio=ratio)
        side = IMG_SIZE_BY_WIDTH.get(int(fc1.shape[0]))
        if side is not None:
            kw["img_size"] = side
    if width != 1024:
        kw["name"] = None  # (no released tower of this width: no name to give it)
    kw.update(overrides)
    return get_model_config(base).replace(**kw)


def vision_config(config_json: Any) -> Dict[str, Any]:
    """What a DeepSeek VLM's config.json says of its tower that its tensors do not: nothing vitkit reads (the
    shapes give it all; the heads are of 64 channels)."""
    return {}


def left_out(sd: Mapping[str, Any]) -> str:
    """What reading the tower leaves out of the file, as ``vitkit info`` says it."""
    others = sum(not k.startswith((VISION, ALIGNER)) for k in sd)
    return f"{others:,} tensors of its language model" if others else ""


__all__ = ["detect", "vision_config", "tower_names", "to_native", "infer_config", "left_out"]
