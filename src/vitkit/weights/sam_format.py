"""Segment Anything's own checkpoints (``sam_vit_b_01ec64.pth``, ``sam_vit_l_0b3195.pth``, ``sam_vit_h_4b8939.pth``
and the fine-tunes saved by its code: MedSAM, SAM-HQ's encoder), read into vitkit's SAM family
(:mod:`vitkit.models.sam`). Read-only: timm's names are the layout vitkit writes it in.

- The image encoder is under ``image_encoder.``; the prompt encoder and the mask decoder beside it are left out.
- Its names are timm's but for the MLP's ``lin1`` / ``lin2`` (timm's ``fc1`` / ``fc2``); the table is (1, gh, gw,
  D), as timm holds it.
- SAM's code builds every norm with eps 1e-6 (``build_sam``), where timm's ``samvit_*`` blocks use
  ``nn.LayerNorm``'s 1e-5: read from SAM's files, the blocks have SAM's.
- Its preprocessing is SAM's (``ResizeLongestSide``: the longer side to 1,024 px, bilinear; ImageNet's statistics;
  the image padded at the right and bottom): ``crop_mode='border'``, ``crop_offset='start'``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch

PREFIX = "image_encoder."
#: the norms' eps of SAM's own code
SAM_EPS = 1e-6


def detect(keys) -> bool:
    """Whether a state dict's names are SAM's own (its image encoder under ``image_encoder.``)."""
    return PREFIX + "patch_embed.proj.weight" in set(keys)


def tower_names(names) -> list:
    """Of a checkpoint's tensor names, its image encoder's."""
    return [n for n in names if n.startswith(PREFIX)]


def _in_timms_names(sd: Mapping[str, Any]) -> Dict[str, Any]:
    """The encoder's tensors by timm's names (the prompt encoder and mask decoder left out)."""
    return {k[len(PREFIX):].replace(".mlp.lin", ".mlp.fc"): v for k, v in sd.items() if k.startswith(PREFIX)}


def to_native(sd: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """SAM's names -> vitkit's."""
    from ..models.sam import sam_from_timm

    return sam_from_timm(_in_timms_names(sd))


def infer_config(sd: Mapping[str, Any], **overrides: Any):
    """The encoder's architecture off its tensors (:func:`vitkit.models.sam.infer_sam_config`), SAM's eps."""
    from ..models.sam import infer_sam_config
    from .hf_tower_sam import SAM_PREPROCESSING

    return infer_sam_config(_in_timms_names(sd), **{"norm_eps": SAM_EPS, **SAM_PREPROCESSING, **overrides})


def vision_config(config_json: Any) -> Dict[str, Any]:
    """A SAM checkpoint's own file says all its tower is (its config is a SamModel folder's, read as such)."""
    return {}


def left_out(sd: Mapping[str, Any]) -> str:
    """What reading the encoder leaves out of the file, as ``vitkit info`` says it."""
    others = sum(not k.startswith(PREFIX) for k in sd)
    return f"{others:,} tensors of its prompt encoder and mask decoder" if others else ""


__all__ = ["detect", "tower_names", "to_native", "infer_config", "vision_config", "left_out", "PREFIX", "SAM_EPS"]
