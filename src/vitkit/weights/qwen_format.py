"""Qwen's own checkpoints (Qwen3-VL, Qwen3.5, Qwen3.8, Qwen-Drive-1.0 on the Hugging Face hub: the
``model*.safetensors`` shard that holds ``model.visual.*``), read into vitkit's Qwen3 model (:mod:`vitkit.models.
qwen3`). Read-only: timm's names are the layout vitkit writes it in.

- The vision tower is under ``model.visual.`` (``visual.`` in a tower saved alone, ``vlm.model.visual.`` in
  Qwen-Drive's, none in a ``Qwen3VLVisionModel`` or ``Qwen3_5VisionModel`` folder, whose config is its own);
  every other tensor is the language model's and is left out, and so are the DeepStack projectors
  (``deepstack_merger_list``: mid-block tokens for the language model's first layers, no part of the tower's
  output; its blocks' tokens are ``forward_intermediates``').
- ``mlp.linear_fc1`` / ``linear_fc2`` and ``merger.linear_fc1`` / ``linear_fc2`` are timm's ``fc1`` / ``fc2``;
  ``pos_embed.weight`` (an embedding of the 48 x 48 slots) is the table.
- The patch embedding is a 3D convolution over two frames; an image is fed as the same frame twice, so it is the
  2D convolution whose kernel is the two frames' kernels summed (in float64, rounded once: as timm and
  transformers' reference compute it).

The architecture is read off the shapes: heads of the released widths as released (768: 12, 1,024: 16, 1,152: 16,
of 72 channels), else of 64 channels; the table's side from its slots.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

import torch

from ..models import get_model_config
from ..models.vlm_tower import blocks_ratio
from .io import WeightsError
from .names import depth_of

#: where the tower is: beside Qwen-Drive's, a VLM's or its own language model, or alone (a ``Qwen3VLVisionModel`` or
#: ``Qwen3_5VisionModel`` saved by itself: its own names, told from timm's by ``mlp.linear_fc1``)
PREFIXES = ("vlm.model.visual.", "model.visual.", "visual.", "")
#: the released towers' heads by width (1,152 is 16 heads of 72 channels), and their names in timm
HEADS_BY_WIDTH = {768: 12, 1024: 16, 1152: 16}
SIZES_BY_WIDTH = {768: "88m", 1024: "306m", 1152: "416m"}
_DROPPED = ("deepstack_merger_list.", "rotary_pos_emb.")
_RENAMES = ((".mlp.linear_fc1.", ".mlp.fc1."), (".mlp.linear_fc2.", ".mlp.fc2."), ("merger.linear_fc1.", "merger.fc1."),
            ("merger.linear_fc2.", "merger.fc2."))


def _prefix(keys) -> Optional[str]:
    """The prefix the tower's tensors are under, where these are Qwen's own names."""
    keys = list(keys)
    return next((p for p in PREFIXES if any(k.startswith(p + "blocks.") and ".mlp.linear_fc1." in k for k in keys)),
                None)


def detect(keys) -> bool:
    """Whether a state dict's names are Qwen's own (its vision tower under ``model.visual.`` or ``visual.``)."""
    return _prefix(keys) is not None


def tower_names(names) -> list:
    """Of a checkpoint's tensor names, its tower's (what :func:`to_native` reads)."""
    prefix = _prefix(names)
    return [n for n in names if n.startswith(prefix) and not n[len(prefix):].startswith(_DROPPED)]


def tower_tensors(sd: Mapping[str, Any]) -> Dict[str, Any]:
    """The tower's tensors by their names in it (the language model's and the DeepStack projectors' left out)."""
    prefix = _prefix(sd)
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix) and not
            k[len(prefix):].startswith(_DROPPED)}


def to_native(sd: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """Qwen's names -> vitkit's."""
    out: Dict[str, torch.Tensor] = {}
    for key, value in tower_tensors(sd).items():
        for theirs, ours in _RENAMES:
            key = key.replace(theirs, ours)
        if key == "patch_embed.proj.weight" and value.dim() == 5:  # the two frames' kernels, summed exactly
            value = value.double().sum(dim=2).to(torch.promote_types(value.dtype, torch.float32))
        elif key == "pos_embed.weight":
            key, value = "pos_embed", value.unsqueeze(0)
        out[key] = value
    return out


def vision_config(config_json: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The fields a Qwen VLM's config.json (``vision_config``: transformers' Qwen3VLVisionConfig), or a tower's saved
    alone, says that its tensors do not: the heads; an activation other than the tanh GELU is refused."""
    cj = config_json or {}
    vision = cj.get("vision_config") if "vision_config" in cj else cj if str(cj.get("model_type", "")).endswith(
        "_vision") else None  # (a tower saved alone: its config is the vision config)
    if not isinstance(vision, Mapping):
        return {}
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise WeightsError(f"Qwen's vision_config hidden_act {act!r}: vitkit's Qwen3 tower is the tanh GELU's")
    heads = vision.get("num_heads")
    return {"num_heads": heads} if heads is not None else {}


def infer_config(sd: Mapping[str, Any], **overrides: Any):
    """The architecture of a Qwen checkpoint (``sd``: its own names; the language model's may be there)."""
    tower = tower_tensors(sd)
    embed = tower["patch_embed.proj.weight"]
    width, patch = int(embed.shape[0]), (int(embed.shape[-2]), int(embed.shape[-1]))
    depth = depth_of(tower, "blocks.")
    slots = int(tower["pos_embed.weight"].shape[0])
    side = math.isqrt(slots)
    if side * side != slots:
        raise WeightsError(f"Qwen's position table has {slots} slots: no square grid")
    kw: Dict[str, Any] = dict(embed_dim=width, depth=depth, num_heads=HEADS_BY_WIDTH.get(width, max(1, width // 64)),
                              patch_size=patch, mlp_dim=int(tower["blocks.0.mlp.linear_fc1.weight"].shape[0]),
                              pos_embed_size=(side * patch[0], side * patch[1]), img_size=768)
    fc1, fc2 = tower.get("merger.linear_fc1.weight"), tower.get("merger.linear_fc2.weight")
    size = SIZES_BY_WIDTH.get(width)
    base = f"qwen3_vit_{size or '416m'}"
    if fc1 is not None and fc2 is not None:
        ratio = blocks_ratio(int(fc1.shape[1]), width)
        if ratio is None:
            raise WeightsError(f"Qwen's merger takes {int(fc1.shape[1])} inputs: no r x r blocks of {width}-wide "
                               f"patches")
        base += "_enc"  # (the tower and its merger: the language model's tokens)
        kw.update(projector_dim=int(fc2.shape[0]), projector_ratio=ratio)
    if size is None:
        kw["name"] = None  # (no released tower of this width: no name to give it)
    kw.update(overrides)
    return get_model_config(base).replace(**kw)


def left_out(sd: Mapping[str, Any]) -> str:
    """What reading the tower leaves out of the file, as ``vitkit info`` says it."""
    prefix = _prefix(sd)
    others = sum(not k.startswith(prefix) for k in sd)
    deepstack = sum(k.startswith(prefix + "deepstack_merger_list.") for k in sd)
    parts = [f"{others:,} tensors of its language model" if others else "",
             f"{deepstack} of its DeepStack projectors" if deepstack else ""]
    return "; ".join(p for p in parts if p)


__all__ = ["detect", "vision_config", "tower_names", "to_native", "infer_config", "tower_tensors", "left_out"]
