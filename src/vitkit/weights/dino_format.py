"""The official DINOv2 and DINOv3 checkpoints (facebookresearch/dinov2, facebookresearch/dinov3 ``.pth``),
read into vitkit's ViT (DINOv2) and EVA (DINOv3) models. Read with ``torch.load(weights_only=True)``
like every ``.pth``: nothing but tensors.

- DINOv2 (``dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth``): timm's names but for ``mask_token`` (masked
  pre-training only: dropped), ``register_tokens`` (the registers), the giant's SwiGLU ``mlp.w12`` / ``mlp.w3``
  (packed: ``fc1`` / ``fc2``), and a position table with a class slot even where registers follow: the
  class slot is folded into the class token (a constant added to a constant) and the table covers the
  patches, timm's ``reg4_dinov2`` layout.
- DINOv3 (``dinov3_vit*_pretrain_lvd1689m-*.pth``): ``storage_tokens`` (the registers), ``ls1.gamma`` /
  ``ls2.gamma`` (EVA's ``gamma_1`` / ``gamma_2``), one ``qkv.bias`` whose k third is masked to zero
  (``bias_mask``: kept as ``q_bias`` / ``v_bias``), ``mlp.w1`` / ``w2`` / ``w3`` for the SwiGLU sizes, and
  ``rope_embed.periods`` (a buffer: its temperature is checked, not loaded). ``mask_token``,
  ``local_cls_norm`` and distillation ``projectors`` are dropped. The architecture is read off the shapes
  (heads: width / 64, as every DINO size has) with DINOv3's fixed parts: its RoPE (T = 100, halves
  rotated), LayerNorm eps 1e-5, any input size, the class token as the readout (``x_norm_clstoken``).
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Mapping

import torch

from ..models import EvaConfig, ViTConfig
from ..models.config_base import IMAGENET_MEAN, IMAGENET_STD
from .io import WeightsError
from .names import depth_of

HEAD_WIDTH = 64
_DROPPED = ("mask_token", "local_cls_norm.", "projectors.")


def detect(keys) -> str:
    """'dinov3', 'dinov2' or '' for a state dict's key names."""
    keys = set(keys)
    if "storage_tokens" in keys and "patch_embed.proj.weight" in keys:
        return "dinov3"
    if {"mask_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.ls1.gamma"} <= keys:
        return "dinov2"
    return ""


def to_native(sd: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    kind = detect(sd)
    out: Dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key.startswith(_DROPPED) or key.endswith((".bias_mask", ".periods")):
            continue  # pre-training's parts, a mask and a buffer (the periods are checked by infer_config)
        key = key.replace("register_tokens", "reg_token").replace("storage_tokens", "reg_token")
        if kind == "dinov2":
            key = key.replace("mlp.w12.", "mlp.fc1.").replace("mlp.w3.", "mlp.fc2.")
        else:
            key = re.sub(r"\.ls(1|2)\.gamma$", r".gamma_\1", key)
            key = key.replace("mlp.w1.", "mlp.fc1_g.").replace("mlp.w2.", "mlp.fc1_x.").replace("mlp.w3.", "mlp.fc2.")
            if key.endswith("attn.qkv.bias"):  # k's third is masked to zero: q and v biases
                q, _, v = value.chunk(3, dim=-1)
                out[key.replace("qkv.bias", "q_bias")], out[key.replace("qkv.bias", "v_bias")] = q, v
                continue
        out[key] = value
    if kind == "dinov2" and "reg_token" in out and "pos_embed" in out:
        out["cls_token"] = out["cls_token"] + out["pos_embed"][:, :1]
        out["pos_embed"] = out["pos_embed"][:, 1:]
    return out


def infer_config(sd: Mapping[str, Any], **overrides: Any):
    """The architecture of an official checkpoint (``sd``: its own names)."""
    kind = detect(sd)
    width, chans, ph, pw = (int(s) for s in sd["patch_embed.proj.weight"].shape)
    depth = depth_of(sd, "blocks.")
    registers = int(sd.get("register_tokens", sd.get("storage_tokens", torch.zeros(1, 0, 1))).shape[1])
    common = dict(in_chans=chans, patch_size=(ph, pw), embed_dim=width, depth=depth,
                  num_heads=max(1, width // HEAD_WIDTH), reg_tokens=registers, num_classes=0, mean=IMAGENET_MEAN,
                  std=IMAGENET_STD)
    if kind == "dinov2":
        packed = "blocks.0.mlp.w12.weight" in sd
        hidden = int(sd["blocks.0.mlp.w3.weight" if packed else "blocks.0.mlp.fc2.weight"].shape[1])
        slots = int(sd["pos_embed"].shape[1]) - 1
        side = int(round(math.sqrt(slots)))
        if side * side != slots:
            raise WeightsError(f"a DINOv2 position table of {slots} patch slots is no square grid")
        kw = dict(common, img_size=(side * ph, side * pw), mlp="swiglu_packed" if packed else "mlp", mlp_dim=hidden,
                  init_values=1e-5, no_embed_class=bool(registers), crop_pct=0.875)
        kw.update(overrides)
        return ViTConfig(**kw)
    periods = sd.get("rope_embed.periods")
    head = width // common["num_heads"]
    temperature = 100.0
    if periods is not None:  # periods[i] = T^(2i / (head/2)): read T back, never assume another
        temperature = float(periods[1]) ** ((head // 2) / 2) if len(periods) > 1 else temperature
        if not math.isclose(temperature, 100.0, rel_tol=1e-3):
            raise WeightsError(f"this DINOv3 checkpoint's rotary periods say temperature {temperature:.4g}, not "
                               f"DINOv3's 100: not a layout vitkit reads")
    swiglu = "blocks.0.mlp.w1.weight" in sd
    hidden = int(sd["blocks.0.mlp.w3.weight" if swiglu else "blocks.0.mlp.fc2.weight"].shape[1])
    kw = dict(common, img_size=(256, 256), rope="dinov3", rope_temperature=100.0, rope_half=True, pos_embed="none",
              mlp="swiglu" if swiglu else "mlp", mlp_dim=hidden, qkv_bias="blocks.0.attn.qkv.bias" in sd,
              init_values=1e-5, norm_eps=1e-5, global_pool="token", fc_norm=False, dynamic_img_size=True,
              crop_pct=1.0, proj_bias="blocks.0.attn.proj.bias" in sd)
    kw.update(overrides)
    return EvaConfig(**kw)


__all__ = ["detect", "to_native", "infer_config"]
