"""Pre-training models in other projects' layouts, in and out.

- Hugging Face ``ViTForMaskedImageModeling`` (SimMIM): ``vit.*`` is a ViT (:mod:`.hf_format`)
  with ``vit.embeddings.mask_token``; ``decoder.0`` is the 1x1 convolution (``decoder.1`` the
  pixel shuffle, no parameters). ``config.json``: ``model_type`` "vit", ``architectures``
  ["ViTForMaskedImageModeling"], ``encoder_stride`` = the patch size.
- Hugging Face ``ViTMAEForPreTraining``: ``vit.*`` the encoder (learned-table layout holding
  MAE's fixed positions), ``decoder.{decoder_embed, mask_token, decoder_pos_embed,
  decoder_layers.N, decoder_norm, decoder_pred}``. The hub's files name the decoder's layers
  ``decoder.decoder_layers.N.attention.attention.query``; files saved by transformers 5
  ``decoder.decoder_encoder.layer.N...``; its models in memory ``...attention.q_proj``: all
  three are read, the hub's is written. ``config.json``: ``model_type`` "vit_mae" with the
  decoder's sizes, ``mask_ratio`` and ``norm_pix_loss``.
- The official MAE checkpoint (facebookresearch/mae, ``models_mae.py``): a torch file whose
  ``model`` entry holds timm's encoder names unprefixed and ``mask_token``, ``decoder_embed``,
  ``decoder_pos_embed``, ``decoder_blocks.N`` (timm block names), ``decoder_norm``,
  ``decoder_pred``. The decoder's heads are not stored: MAE's 16 (every released model) are
  assumed, as are ImageNet mean/std and ``norm_pix_loss``.

vitkit's own names are the official layout's with the encoder under ``encoder.`` (SimMIM:
``mask_token``, ``decoder``; MPP: ``mask_token``, ``mpp_head``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from ..files import atomic_path, write_json
from ..models.config_base import IMAGENET_MEAN, IMAGENET_STD
from ..models.vit import ViTConfig
from ..selfsup import CONFIG_KEY, Pretrainer
from ..selfsup.masking import block_tiling
from . import hf_format, timm_format
from .io import WeightsError, save_safetensors

#: a vitkit pre-training model's parameters outside its encoder, per objective
OWN_PREFIXES = {"simmim": ("mask_token", "decoder."), "mpp": ("mask_token", "mpp_head."),
                "mae": ("mask_token", "decoder_")}
_HF_DECODER_LAYER = re.compile(r"^decoder\.(?:decoder_layers|decoder_encoder\.layer)\.(\d+)\.(.+)$")
_HF_MAE_TOP = {f"decoder.{name}": name for name in (
    "decoder_embed.weight", "decoder_embed.bias", "mask_token", "decoder_pos_embed", "decoder_norm.weight",
    "decoder_norm.bias", "decoder_pred.weight", "decoder_pred.bias")}
_HF_SIMMIM_TOP = {"vit.embeddings.mask_token": "mask_token", "decoder.0.weight": "decoder.weight",
                  "decoder.0.bias": "decoder.bias"}
#: MAE's decoder heads in every released model (models_mae.py: decoder_num_heads=16)
MAE_DECODER_HEADS = 16


# ----------------------------------------------------------------------------- what a source is


def detect(keys, config_json: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The objective of a pre-training source, or None for a classifier / encoder."""
    keys = set(keys)
    cj = config_json or {}
    if cj.get("format") == "vitkit":
        entry = cj.get(CONFIG_KEY)
        return entry.get("objective") if isinstance(entry, Mapping) else None
    if cj.get("architecture"):  # a timm hub folder holds the timm model it names: tensors beside it are strays
        return None
    if any(k.startswith("encoder.patch_embed.") for k in keys):  # vitkit's names, no config at hand
        own = {"decoder.weight": "simmim", "mpp_head.weight": "mpp", "decoder_embed.weight": "mae"}
        return next((objective for key, objective in own.items() if key in keys), None)
    if "vit.embeddings.mask_token" in keys and "decoder.0.weight" in keys:
        return "simmim"
    if any(k.startswith("decoder.decoder_") for k in keys):
        return "mae"
    if "mask_token" in keys and "decoder_embed.weight" in keys:
        return "mae"  # the official layout
    return None


def options(objective: str, src_tensors: Mapping[str, Any], config_json: Optional[Mapping[str, Any]],
            encoder_config: Any) -> Dict[str, Any]:
    """The objective's options a source describes (its config, else its shapes)."""
    cj = config_json or {}
    if cj.get("format") == "vitkit":
        return dict(cj[CONFIG_KEY])
    if objective == "simmim":
        stride = cj.get("encoder_stride")
        if stride is not None and stride != encoder_config.patch_size[0]:
            raise WeightsError(f"encoder_stride {stride} with {encoder_config.patch_size[0]} px patches: its decoder "
                               f"predicts {stride} x {stride} pixels per patch, where vitkit's SimMIM reconstructs the "
                               f"patch itself (transformers' ViT default is 16: set it to the patch size)")
        # HF keeps no block size (masks come from the caller): the paper's 32 px where it tiles
        block = 32 if not block_tiling(encoder_config.img_size, encoder_config.patch_size, 32) \
            else encoder_config.patch_size[0]
        return {"objective": "simmim", "mask_block": block}
    dec = _mae_decoder_tensors(src_tensors)
    width, depth = int(dec["decoder_embed.weight"].shape[0]), 1 + max(
        (int(k.split(".")[1]) for k in dec if k.startswith("decoder_blocks.")), default=-1)
    out = {"objective": "mae", "decoder_dim": width, "decoder_depth": depth,
           "decoder_heads": int(cj.get("decoder_num_attention_heads", MAE_DECODER_HEADS if width % 16 == 0 else 1)),
           "decoder_mlp_dim": int(dec["decoder_blocks.0.mlp.fc1.weight"].shape[0]) if depth else 4 * width}
    if "mask_ratio" in cj:
        out["mask_ratio"] = float(cj["mask_ratio"])
    if "norm_pix_loss" in cj:
        out["norm_pix_loss"] = bool(cj["norm_pix_loss"])
    return out


def official_mae_encoder_overrides() -> Dict[str, Any]:
    """What an official MAE checkpoint's encoder expects and its shapes do not say."""
    return {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}


# ----------------------------------------------------------------------------- reading


def split(objective: str, fmt: str, tensors: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
    """A pre-training source's tensors -> (the encoder's, in the source's own layout; the
    objective's own parts, in vitkit's names)."""
    if fmt == "vitkit":
        own_prefixes = OWN_PREFIXES[objective]
        encoder = {k[len("encoder."):]: v for k, v in tensors.items() if k.startswith("encoder.")}
        own = {k: v for k, v in tensors.items() if k.startswith(own_prefixes)}
        stray = sorted(set(tensors) - {f"encoder.{k}" for k in encoder} - set(own))
        if stray:
            own.update({f"unmapped:{k}": tensors[k] for k in stray})
        return encoder, own
    if fmt == "hf":
        table = _HF_SIMMIM_TOP if objective == "simmim" else _HF_MAE_TOP
        encoder = {k: v for k, v in tensors.items() if k not in table and not k.startswith("decoder.")}
        own = {table[k]: v for k, v in tensors.items() if k in table}
        if objective == "mae":
            layers = hf_format.LayerNames("decoder_blocks.")
            for k, v in tensors.items():
                m = _HF_DECODER_LAYER.match(k)
                if m is not None and not layers.add(m.group(1), m.group(2), v):
                    own[f"unmapped:{k}"] = v
            own.update(layers.finish())
        known = set(table) | {k for k in tensors if _HF_DECODER_LAYER.match(k)}
        own.update({f"unmapped:{k}": v for k, v in tensors.items() if k.startswith("decoder.") and k not in known})
        return encoder, own
    # the official MAE layout: the encoder in timm's names, the rest beside it
    own = _mae_decoder_tensors(tensors)
    encoder = {k: v for k, v in tensors.items() if k not in own}
    return encoder, {k: _tensor(v) for k, v in own.items()}


def _mae_decoder_tensors(tensors: Mapping[str, Any]) -> Dict[str, Any]:
    """The official layout's non-encoder tensors (from an HF source: mapped to them first)."""
    if any(k.startswith("decoder.") for k in tensors):
        return split("mae", "hf", tensors)[1]
    return {k: v for k, v in tensors.items() if k.startswith(OWN_PREFIXES["mae"])}


def _tensor(v: Any) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.as_tensor(v)


# ----------------------------------------------------------------------------- writing


def export(model: Pretrainer, path: Path, fmt: str) -> Path:
    """Write a pre-training model as ``hf`` (ViTForMaskedImageModeling / ViTMAEForPreTraining
    folder) or ``mae`` (the official MAE checkpoint, a torch file of tensors under ``model``)."""
    objective = model.objective
    enc = model.encoder
    own = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if not k.startswith("encoder.")}
    if fmt == "mae":
        if objective != "mae":
            raise WeightsError(f"the official MAE layout holds MAE models only, not {objective}; "
                               f"export it as 'vitkit' (or its encoder as 'timm')")
        if path.suffix.lower() not in (".pth", ".pt"):
            raise WeightsError(f"MAE export: the official checkpoints are .pth files, not {path.name!r}")
        _need_class_token(enc, "the official MAE layout")
        if type(enc.config) is not ViTConfig:  # (its shapes were read back as another model, in garbled words)
            raise WeightsError(f"the official MAE layout holds a plain ViT, not an {enc.config.KIND} encoder "
                               f"(rotary positions are no tensors); export it as 'vitkit' (or its encoder as 'timm')")
        encoder_sd = timm_format.from_native(enc)  # timm names; any position kind as its full table
        shapes = mae_shape_losses(encoder_sd, model)
        if shapes:  # a pre-training model loads as it was saved: no keyword could set them back
            raise WeightsError(f"the official MAE layout holds tensors only: read back, this model would have "
                               f"{'; '.join(shapes)}; export it as 'vitkit' or 'hf' (ViTMAEForPreTraining), which "
                               f"keep them")
        with atomic_path(path) as tmp:
            torch.save({"model": {**encoder_sd, **own}}, tmp)
        return path
    if objective == "mpp":
        raise WeightsError("masked patch prediction has no Hugging Face layout; export it as 'vitkit' "
                           "(or its encoder as 'timm', 'hf', 'npz')")

    name = "ViTForMaskedImageModeling" if objective == "simmim" else "ViTMAEForPreTraining"
    _need_class_token(enc, f"Hugging Face's {name}")
    sd = {k if k.startswith("vit.") else f"vit.{k}": v for k, v in hf_format.from_native(enc).items()}
    hf_cfg = hf_format.config_to_hf(enc.config)
    hf_cfg["architectures"] = [name]
    if objective == "simmim":
        if enc.config.patch_size[0] != enc.config.patch_size[1]:
            raise WeightsError("ViTForMaskedImageModeling's pixel shuffle needs square patches; export this "
                               "model as 'vitkit'")
        sd.update({hf: own[native] for hf, native in _HF_SIMMIM_TOP.items()})
        hf_cfg["encoder_stride"] = enc.config.patch_size[0]
    else:
        cfg = model.config
        sd.update({hf: own[native] for hf, native in _HF_MAE_TOP.items()})
        sd.update(hf_format.layers_from_native(own, "decoder_blocks.", "decoder.decoder_layers.", cfg.decoder_dim))
        hf_cfg.pop("encoder_stride", None)
        hf_cfg.update(model_type="vit_mae", decoder_hidden_size=cfg.decoder_dim,
                      decoder_num_hidden_layers=cfg.decoder_depth, decoder_num_attention_heads=cfg.decoder_heads,
                      decoder_intermediate_size=cfg.decoder_mlp_dim, mask_ratio=cfg.mask_ratio,
                      norm_pix_loss=cfg.norm_pix_loss)
    path.mkdir(parents=True, exist_ok=True)
    save_safetensors(sd, path / "model.safetensors")
    write_json(path / "config.json", hf_cfg)
    hf_format.write_preprocessor(path, path, hf_format.preprocessor_to_hf(enc.config))
    return path


def mae_shape_losses(encoder_sd: Mapping[str, Any], model: Pretrainer) -> List[str]:
    """What reading an official MAE checkpoint of ``model`` back builds otherwise, as the loader and
    :func:`options` read one: the encoder off its shapes (heads of 64 channels), 16 decoder heads (one where the
    width does not divide them). Empty for the released models."""
    shapes = [f"encoder {what}" for what in timm_format.bare_state_dict_losses(encoder_sd, model.encoder)]
    width, heads = model.config.decoder_dim, model.config.decoder_heads
    read = MAE_DECODER_HEADS if width % 16 == 0 else 1
    if heads != read:
        shapes.append(f"decoder_heads {read} (this model: {heads})")
    return shapes


def mae_statistics_losses(model: Pretrainer) -> List[str]:
    """What an official MAE checkpoint of ``model`` is read back with where the model's differ: the input statistics
    (ImageNet's) and MAE's own ``mask_ratio`` and ``norm_pix_loss`` (the file holds tensors only: a 0.5 ratio
    without the pixel norm came back 0.75 with it, its loss 1.13 against 1.16, in silence)."""
    lost = []
    for field, value in official_mae_encoder_overrides().items():
        ours = tuple(getattr(model.encoder.config, field))
        if len(ours) != len(value) or any(abs(a - b) > 1e-6 for a, b in zip(ours, value)):
            lost.append(f"{field} {json.dumps(list(value))} (this model: {json.dumps(list(ours))})")
    from ..selfsup.mae import MAEConfig

    for field in ("mask_ratio", "norm_pix_loss"):
        read, ours = getattr(MAEConfig, field), getattr(model.config, field)
        if read != ours:
            lost.append(f"{field} {json.dumps(read)} (this model: {json.dumps(ours)})")
    return lost


def _need_class_token(encoder: nn.Module, layout: str) -> None:
    if not encoder.config.class_token:
        raise WeightsError(f"{layout} always has a class token and this encoder has none; export the model "
                           f"as 'vitkit'")


__all__ = ["detect", "options", "split", "export", "official_mae_encoder_overrides", "mae_shape_losses",
           "mae_statistics_losses",
           "OWN_PREFIXES"]
