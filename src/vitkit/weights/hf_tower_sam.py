"""Segment Anything's image encoder in the Hugging Face layout (``SamVisionModel``; the ``vision_encoder`` of
``SamModel``, whose prompt encoder and mask decoder are left out), both ways: its row of
:data:`~vitkit.weights.hf_towers.TOWERS`, read into vitkit's SAM family (:mod:`vitkit.models.sam`).

The names are SAM's own code's under ``vision_encoder.`` (``layers.N.layer_norm1``, ``mlp.lin1``, the neck's
``conv1`` / ``layer_norm1`` / ``conv2`` / ``layer_norm2``), the table is (1, gh, gw, D), and every norm has the
config's ``layer_norm_eps`` (1e-6, SAM's, where timm's blocks use 1e-5). transformers runs the encoder at its
config's ``image_size`` alone."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

import torch

from .hf_tower_parts import Tower, _act, _move_all, _pair, _problems
from .io import WeightsError
from .names import rename

PREFIX = "vision_encoder."
#: SAM's preprocessing (its code's ResizeLongestSide and padding, transformers' SamImageProcessor): the longer side
#: to the size, bilinear, the image padded at the right and bottom (read exactly from any processor config)
SAM_PREPROCESSING = dict(crop_mode="border", crop_offset="start", crop_pct=1.0, interpolation="bilinear")
#: the rest of a SamModel checkpoint (its prompt encoder, mask decoder, the shared positional embedding)
OTHER_PARTS = ("prompt_encoder.", "mask_decoder.", "shared_image_embedding.")

#: (vitkit's name, transformers') of every tensor: ``{i}`` a block's index, ``{leaf}`` weight or bias
_NAMES = [("patch_embed.proj.{leaf}", "patch_embed.projection.{leaf}"), ("pos_embed", "pos_embed"),
          *[(f"blocks.{{i}}.norm{n}.{{leaf}}", f"layers.{{i}}.layer_norm{n}.{{leaf}}") for n in (1, 2)],
          *[(f"blocks.{{i}}.attn.{p}.{{leaf}}", f"layers.{{i}}.attn.{p}.{{leaf}}") for p in ("qkv", "proj")],
          *[(f"blocks.{{i}}.attn.{t}", f"layers.{{i}}.attn.{t}") for t in ("rel_pos_h", "rel_pos_w")],
          *[(f"blocks.{{i}}.mlp.fc{n}.{{leaf}}", f"layers.{{i}}.mlp.lin{n}.{{leaf}}") for n in (1, 2)],
          ("neck.0.weight", "neck.conv1.weight"), ("neck.1.{leaf}", "neck.layer_norm1.{leaf}"),
          ("neck.2.weight", "neck.conv2.weight"), ("neck.3.{leaf}", "neck.layer_norm2.{leaf}")]


def _rules(names, forward: bool):
    """:data:`_NAMES` as (pattern, replacement) rules, transformers' to vitkit's (``forward``) or back."""
    def pattern(name: str) -> str:
        return re.escape(name).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{leaf\}", r"(?P<leaf>weight|bias)")

    def replacement(name: str) -> str:
        return name.replace("{i}", r"\g<i>").replace("{leaf}", r"\g<leaf>")

    return [(pattern(theirs), replacement(ours)) if forward else (pattern(ours), replacement(theirs))
            for ours, theirs in names]


_RULES, _BACK = _rules(_NAMES, True), _rules(_NAMES, False)


def _own(sd: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The encoder's tensors without their prefix (a SamModel's other parts left out)."""
    return {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in sd.items() if not k.startswith(OTHER_PARTS)}


def _sam_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    out = rename(_own(sd), _RULES)
    pos = out.get("pos_embed")
    if pos is not None and pos.dim() == 4:
        out["pos_embed"] = pos.reshape(1, -1, pos.shape[-1])
    return out


def _sam_config(hf: Mapping[str, Any], sd: Mapping[str, Any]):
    from ..models.sam import SamConfig

    if _act(hf) != "exact":
        raise WeightsError(f"SAM's encoder with hidden_act {hf.get('hidden_act')!r}: its MLP's GELU is the exact one")
    width = hf["hidden_size"]
    return SamConfig(
        img_size=_pair(hf.get("image_size", 1024)), patch_size=_pair(hf.get("patch_size", 16)),
        in_chans=hf.get("num_channels", 3), embed_dim=width, depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf.get("mlp_dim") or int(width * hf.get("mlp_ratio", 4.0)),
        qkv_bias=bool(hf.get("qkv_bias", True)), norm_eps=hf.get("layer_norm_eps", 1e-6),
        pos_embed="learned" if hf.get("use_abs_pos", True) else "none", rel_pos=bool(hf.get("use_rel_pos", True)),
        window_size=hf.get("window_size", 14), global_attn_indexes=tuple(hf.get("global_attn_indexes") or ()),
        neck_chans=hf.get("output_channels", 256), num_classes=0,
        **SAM_PREPROCESSING)  # (SAM's processor, where the folder has none: its preprocessor_config.json says)


def _sam_out(sd: Dict[str, torch.Tensor], config: Any) -> Dict[str, torch.Tensor]:
    if "pos_embed" in sd:
        sd["pos_embed"] = sd["pos_embed"].reshape(1, *config.grid_size, config.embed_dim)
    return {PREFIX + k: v for k, v in _move_all(sd, _BACK, {}, "SamVisionModel").items()}


def _sam_problems(config: Any) -> List[str]:
    problems = _problems(config, dict(architecture="sam", num_classes=0, pre_norm=False, qk_norm=False,
                                      init_values=None, rel_pos_size=None), "SamVisionModel", patch_bias=True)
    if getattr(config, "architecture", None) == "sam":
        if not config.neck_chans:
            problems.append("a neck (SamVisionModel's has its convolutions: neck_chans > 0)")
        if config.gelu != "exact":
            problems.append(f"gelu={config.gelu!r} (SAM's is the exact GELU)")
        if getattr(config, "pos_embed_size", None) is not None:
            problems.append("a position table held at another size than img_size (transformers runs SAM at one)")
    return problems


def _sam_hf_config(config: Any) -> Dict[str, Any]:
    return dict(model_type="sam_vision_model", architectures=["SamVisionModel"], hidden_size=config.embed_dim,
                num_hidden_layers=config.depth, num_attention_heads=config.num_heads, mlp_dim=config.mlp_dim,
                image_size=config.img_size[0], patch_size=config.patch_size[0], num_channels=config.in_chans,
                layer_norm_eps=config.norm_eps, hidden_act="gelu", qkv_bias=config.qkv_bias,
                use_abs_pos=config.pos_embed == "learned", use_rel_pos=config.rel_pos,
                window_size=config.window_size, global_attn_indexes=list(config.global_attn_indexes),
                output_channels=config.neck_chans)


SAM_TOWER = Tower(("SamVisionModel", "SamModel"), _sam_in, _sam_config, _sam_out, _sam_problems, _sam_hf_config)

__all__ = ["SAM_TOWER", "PREFIX", "OTHER_PARTS"]
