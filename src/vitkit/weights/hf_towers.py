"""Hugging Face layouts of the later ViTs: CLIP, SigLIP, DINOv2 (with registers) and DINOv3, both ways.

Each ``model_type`` of ``config.json`` is one row of :data:`TOWERS`: how its tensor names become
vitkit's (timm's), what vitkit architecture its config describes, and the reverse. What each class is
and how vitkit reads it (the facts that decide parity):

- ``clip_vision_model`` (``CLIPVisionModel``, ``...WithProjection``) and ``clip`` (``CLIPModel``: its vision
  tower and ``visual_projection``; the text tower is left out): the class embedding is ``cls_token``,
  ``pre_layrnorm`` is ``norm_pre`` (the patch projection has no bias), q/k/v are fused into ``qkv``,
  ``post_layernorm`` normalises the class token (vitkit normalises every token, then reads the class
  one: the same numbers); ``visual_projection`` (no bias) is the head, with a zero bias. ``quick_gelu``
  is CLIP's QuickGELU (OpenAI's weights).
- ``siglip_vision_model`` and ``siglip`` (vision tower): no class token, a position table over the
  patches; the MAP head's ``probe`` is ``attn_pool.latent``, its ``nn.MultiheadAttention`` packs q, k, v
  in ``in_proj_weight`` (q to ``attn_pool.q``, k and v to ``attn_pool.kv``); ``gelu_pytorch_tanh`` is the
  tanh GELU.
- ``dinov2`` and ``dinov2_with_registers``: LayerScale ``lambda1``; registers enter after the positions
  are added, so the class token's slot of the table is folded into ``cls_token`` (a constant added to a
  constant: exact) and the table covers the patches (timm's ``reg4_dinov2`` layout); the SwiGLU giant's
  ``weights_in`` / ``weights_out`` are the packed SwiGLU. ``mask_token`` (masked pre-training) is dropped.
  The pooled output is the normalised class token.
- ``dinov3_vit``: DINOv3's rotary positions (theta 100), registers, q and v biases without a k bias,
  ``up_proj``/``down_proj`` (or ``gate_proj`` too: SwiGLU); its pooled output is the normalised class
  token (``global_pool='token'``, where timm's DINOv3 averages the patches).

Hub folders and ``save_pretrained`` folders store the hub's names; transformers 5's in-memory names
(``o_proj``, ``model.layer``) are read too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from ..models import EvaConfig, ViTConfig
from ..models.config_base import IMAGENET_MEAN, IMAGENET_STD
from .io import WeightsError
from .names import rename

_ACTS = {"gelu": "exact", "quick_gelu": "quick", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh",
         "gelu_fast": "tanh"}
#: what the vision part of a two-tower checkpoint is prefixed with, and what of it is the other tower's
_VISION_PREFIX = "vision_model."
_OTHER_TOWER = ("text_model.", "text_projection.", "logit_scale", "logit_bias")


def _act(hf: Mapping[str, Any]) -> str:
    act = hf.get("hidden_act", "gelu")
    if act not in _ACTS:
        raise WeightsError(f"hidden_act {act!r} of the Hugging Face config has no vitkit equivalent "
                           f"(known: {', '.join(_ACTS)})")
    return _ACTS[act]


def _pair(value: Any) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _fuse_qkv(sd: Dict[str, torch.Tensor], part: str = r"(q|k|v)", missing_k_bias: bool = True) -> None:
    """``blocks.N.attn.{q,k,v}.{weight,bias}`` -> ``blocks.N.attn.qkv.*`` in place; a bias absent for k alone
    (EVA/DINOv3) becomes ``q_bias`` / ``v_bias``."""
    parts: Dict[Tuple[str, str], Dict[str, torch.Tensor]] = {}
    for key in [k for k in sd if re.fullmatch(r"blocks\.\d+\.attn\.(q|k|v)\.(weight|bias)", k)]:
        block, name, leaf = re.fullmatch(r"(blocks\.\d+)\.attn\.(q|k|v)\.(weight|bias)", key).groups()
        parts.setdefault((block, leaf), {})[name] = sd.pop(key)
    for (block, leaf), got in parts.items():
        if leaf == "weight":
            if set(got) != {"q", "k", "v"}:
                raise WeightsError(f"{block}: query/key/value weights incomplete ({', '.join(sorted(got))})")
            sd[f"{block}.attn.qkv.weight"] = torch.cat([got["q"], got["k"], got["v"]])
        elif set(got) == {"q", "k", "v"}:
            sd[f"{block}.attn.qkv.bias"] = torch.cat([got["q"], got["k"], got["v"]])
        elif set(got) == {"q", "v"} and missing_k_bias:
            sd[f"{block}.attn.q_bias"], sd[f"{block}.attn.v_bias"] = got["q"], got["v"]
        else:
            raise WeightsError(f"{block}: query/key/value biases incomplete ({', '.join(sorted(got))})")


def _split_qkv(sd: Dict[str, torch.Tensor], width: int) -> Dict[str, torch.Tensor]:
    """The reverse of :func:`_fuse_qkv`: ``blocks.N.attn.{q,k,v}.*`` from ``qkv`` (or ``q_bias``/``v_bias``)."""
    out = {}
    for key, value in sd.items():
        m = re.fullmatch(r"(blocks\.\d+\.attn)\.(qkv\.weight|qkv\.bias|q_bias|v_bias)", key)
        if not m:
            out[key] = value
        elif m.group(2).startswith("qkv"):
            leaf = m.group(2).split(".")[1]
            for part, chunk in zip("qkv", value.split(width)):
                out[f"{m.group(1)}.{part}.{leaf}"] = chunk.contiguous()
        else:
            out[f"{m.group(1)}.{m.group(2)[0]}.bias"] = value
    return out


# ----------------------------------------------------------------------------- CLIP

_CLIP_RULES = [
    (r"embeddings\.patch_embedding\.weight", "patch_embed.proj.weight"),
    (r"pre_layrnorm\.(weight|bias)", r"norm_pre.\1"),
    (r"post_layernorm\.(weight|bias)", r"norm.\1"),
    (r"encoder\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"encoder\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"encoder\.layers\.(\d+)\.layer_norm(1|2)\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (r"encoder\.layers\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"visual_projection\.weight", "head.weight"),
]


def _clip_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    cls = sd.pop("embeddings.class_embedding", None)
    pos = sd.pop("embeddings.position_embedding.weight", None)
    sd.pop("embeddings.position_ids", None)
    out = rename(sd, _CLIP_RULES)
    if cls is not None:
        out["cls_token"] = cls.reshape(1, 1, -1)
    if pos is not None:
        out["pos_embed"] = pos.unsqueeze(0)
    if "head.weight" in out:
        out["head.bias"] = out["head.weight"].new_zeros(out["head.weight"].shape[0])
    _fuse_qkv(out)
    return out


def _clip_config(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> ViTConfig:
    projection = sd.get("visual_projection.weight")
    return ViTConfig(
        img_size=_pair(hf.get("image_size", 224)), patch_size=_pair(hf.get("patch_size", 32)),
        in_chans=hf.get("num_channels", 3), embed_dim=hf["hidden_size"], depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"], norm_eps=hf.get("layer_norm_eps", 1e-5),
        gelu=_act(hf), pre_norm=True, num_classes=int(projection.shape[0]) if projection is not None else 0,
        mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711), crop_pct=1.0)


def _clip_out(sd: Dict[str, torch.Tensor], config: ViTConfig) -> Dict[str, torch.Tensor]:
    sd = _split_qkv(sd, config.embed_dim)
    out = {"embeddings.class_embedding": sd.pop("cls_token").reshape(-1),
           "embeddings.position_embedding.weight": sd.pop("pos_embed")[0]}
    bias = sd.pop("head.bias", None)
    if bias is not None and bias.abs().max() > 0:
        raise WeightsError("CLIP's visual_projection has no bias: this model's head has one (export as 'timm')")
    for ours, theirs in ((r"patch_embed\.proj\.weight", "embeddings.patch_embedding.weight"),
                         (r"norm_pre\.(weight|bias)", r"pre_layrnorm.\1"),
                         (r"norm\.(weight|bias)", r"post_layernorm.\1"),
                         (r"blocks\.(\d+)\.attn\.(q|k|v)\.(weight|bias)", r"encoder.layers.\1.self_attn.\2_proj.\3"),
                         (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layers.\1.self_attn.out_proj.\2"),
                         (r"blocks\.(\d+)\.norm(1|2)\.(weight|bias)", r"encoder.layers.\1.layer_norm\2.\3"),
                         (r"blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"encoder.layers.\1.mlp.\2.\3"),
                         (r"head\.weight", "visual_projection.weight")):
        for key in [k for k in sd if re.fullmatch(ours, k)]:
            out[re.sub(ours, theirs, key)] = sd.pop(key)
    _leftover(sd, "CLIP")
    if "visual_projection.weight" in out:
        out = {(k if k == "visual_projection.weight" else _VISION_PREFIX + k): v for k, v in out.items()}
    return out


def _clip_problems(config: Any) -> List[str]:
    return _problems(config, dict(architecture="vit", pos_embed="learned", class_token=True, pre_norm=True,
                                  global_pool="token", reg_tokens=0, init_values=None, no_embed_class=False,
                                  qkv_bias=True, qk_norm=False, mlp="mlp", norm="layernorm", final_norm=True,
                                  crop_remainder=False),
                     "CLIP's vision tower", patch_bias=False)


def _clip_hf_config(config: ViTConfig) -> Dict[str, Any]:
    out = dict(model_type="clip_vision_model", hidden_size=config.embed_dim, num_hidden_layers=config.depth,
               num_attention_heads=config.num_heads, intermediate_size=config.mlp_dim,
               image_size=config.img_size[0], patch_size=config.patch_size[0], num_channels=config.in_chans,
               layer_norm_eps=config.norm_eps, hidden_act={v: k for k, v in _ACTS.items()}[config.gelu],
               architectures=["CLIPVisionModelWithProjection" if config.num_classes else "CLIPVisionModel"])
    if config.num_classes:
        out["projection_dim"] = config.num_classes
    return out


# ----------------------------------------------------------------------------- SigLIP

_SIGLIP_RULES = [
    (r"embeddings\.patch_embedding\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"post_layernorm\.(weight|bias)", r"norm.\1"),
    (r"encoder\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"encoder\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"encoder\.layers\.(\d+)\.layer_norm(1|2)\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (r"encoder\.layers\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"head\.attention\.out_proj\.(weight|bias)", r"attn_pool.proj.\1"),
    (r"head\.layernorm\.(weight|bias)", r"attn_pool.norm.\1"),
    (r"head\.mlp\.(fc1|fc2)\.(weight|bias)", r"attn_pool.mlp.\1.\2"),
]


def _siglip_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    pos = sd.pop("embeddings.position_embedding.weight", None)
    sd.pop("embeddings.position_ids", None)
    probe = sd.pop("head.probe", None)
    packed = {leaf: sd.pop(f"head.attention.in_proj_{leaf}", None) for leaf in ("weight", "bias")}
    out = rename(sd, _SIGLIP_RULES)
    if pos is not None:
        out["pos_embed"] = pos.unsqueeze(0)
    if probe is not None:
        out["attn_pool.latent"] = probe
    width = hf["hidden_size"]
    for leaf, value in packed.items():
        if value is not None:
            out[f"attn_pool.q.{leaf}"], out[f"attn_pool.kv.{leaf}"] = value[:width], value[width:]
    _fuse_qkv(out)
    return out


def _siglip_config(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> ViTConfig:
    head = hf.get("vision_use_head", True) and "head.probe" in sd
    img, patch = _pair(hf.get("image_size", 224)), _pair(hf.get("patch_size", 16))
    return ViTConfig(
        img_size=img, patch_size=patch, in_chans=hf.get("num_channels", 3), embed_dim=hf["hidden_size"],
        depth=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"],
        norm_eps=hf.get("layer_norm_eps", 1e-6), gelu=_act(hf), class_token=False,
        global_pool="map" if head else "avg", fc_norm=False, num_classes=0, crop_pct=1.0,
        crop_remainder=any(i % p for i, p in zip(img, patch)))


def _siglip_out(sd: Dict[str, torch.Tensor], config: ViTConfig) -> Dict[str, torch.Tensor]:
    sd = _split_qkv(sd, config.embed_dim)
    out = {"embeddings.position_embedding.weight": sd.pop("pos_embed")[0]}
    if "attn_pool.latent" in sd:
        out["head.probe"] = sd.pop("attn_pool.latent")
        for leaf in ("weight", "bias"):
            out[f"head.attention.in_proj_{leaf}"] = torch.cat([sd.pop(f"attn_pool.q.{leaf}"),
                                                                sd.pop(f"attn_pool.kv.{leaf}")])
    for ours, theirs in ((r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embedding.\1"),
                         (r"norm\.(weight|bias)", r"post_layernorm.\1"),
                         (r"blocks\.(\d+)\.attn\.(q|k|v)\.(weight|bias)", r"encoder.layers.\1.self_attn.\2_proj.\3"),
                         (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layers.\1.self_attn.out_proj.\2"),
                         (r"blocks\.(\d+)\.norm(1|2)\.(weight|bias)", r"encoder.layers.\1.layer_norm\2.\3"),
                         (r"blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"encoder.layers.\1.mlp.\2.\3"),
                         (r"attn_pool\.proj\.(weight|bias)", r"head.attention.out_proj.\1"),
                         (r"attn_pool\.norm\.(weight|bias)", r"head.layernorm.\1"),
                         (r"attn_pool\.mlp\.(fc1|fc2)\.(weight|bias)", r"head.mlp.\1.\2")):
        for key in [k for k in sd if re.fullmatch(ours, k)]:
            out[re.sub(ours, theirs, key)] = sd.pop(key)
    _leftover(sd, "SigLIP")
    return out


def _siglip_problems(config: Any) -> List[str]:
    problems = _problems(config, dict(architecture="vit", pos_embed="learned", class_token=False, reg_tokens=0,
                                      init_values=None, pre_norm=False, qkv_bias=True, qk_norm=False, mlp="mlp",
                                      norm="layernorm", final_norm=True, num_classes=0, pool_include_prefix=False),
                         "SigLIP's vision tower", patch_bias=True)
    if config.global_pool == "map" and (config.map_heads not in (None, config.num_heads)
                                        or config.map_mlp_dim not in (None, config.mlp_dim)):
        problems.append("SigLIP's head uses the blocks' heads and MLP width")
    if config.global_pool != "map":
        problems.append("SigLIP's tower reads out with its attention pool (global_pool='map')")
    return problems


def _siglip_hf_config(config: ViTConfig) -> Dict[str, Any]:
    return dict(model_type="siglip_vision_model", architectures=["SiglipVisionModel"], hidden_size=config.embed_dim,
                num_hidden_layers=config.depth, num_attention_heads=config.num_heads,
                intermediate_size=config.mlp_dim, image_size=config.img_size[0], patch_size=config.patch_size[0],
                num_channels=config.in_chans, layer_norm_eps=config.norm_eps,
                hidden_act={v: k for k, v in _ACTS.items()}[config.gelu], vision_use_head=True)


# ----------------------------------------------------------------------------- DINOv2

_DINOV2_RULES = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.register_tokens", "reg_token"),
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
    (r"encoder\.layer\.(\d+)\.norm(1|2)\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (r"encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"encoder\.layer\.(\d+)\.attention\.(q|k|v)_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"encoder\.layer\.(\d+)\.attention\.(?:output\.dense|o_proj)\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"encoder\.layer\.(\d+)\.layer_scale(1|2)\.lambda1", r"blocks.\1.ls\2.gamma"),
    (r"encoder\.layer\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"encoder\.layer\.(\d+)\.mlp\.weights_in\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),
    (r"encoder\.layer\.(\d+)\.mlp\.weights_out\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
]


def _dinov2_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    sd.pop("embeddings.mask_token", None)  # the masked pre-training's token: no use in a forward pass
    pos = sd.pop("embeddings.position_embeddings", None)
    out = rename(sd, _DINOV2_RULES)
    for key in list(out):  # the hub's query/key/value -> q/k/v, then fused
        m = re.fullmatch(r"(blocks\.\d+\.attn)\.(query|key|value)\.(weight|bias)", key)
        if m:
            out[f"{m.group(1)}.{m.group(2)[0]}.{m.group(3)}"] = out.pop(key)
    _fuse_qkv(out)
    if pos is not None:
        if "reg_token" in out:  # registers enter after the positions: the class slot folds into the token
            if "cls_token" in out:
                out["cls_token"] = out["cls_token"] + pos[:, :1]
            pos = pos[:, 1:]
        out["pos_embed"] = pos
    return out


def _dinov2_config(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> ViTConfig:
    width = hf["hidden_size"]
    hidden = int(width * hf.get("mlp_ratio", 4))
    swiglu = bool(hf.get("use_swiglu_ffn"))
    registers = int(hf.get("num_register_tokens", 0)) if hf.get("model_type") == "dinov2_with_registers" else 0
    return ViTConfig(
        img_size=_pair(hf.get("image_size", 518)), patch_size=_pair(hf.get("patch_size", 14)),
        in_chans=hf.get("num_channels", 3), embed_dim=width, depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp="swiglu_packed" if swiglu else "mlp",
        mlp_dim=((int(hidden * 2 / 3) + 7) // 8 * 8) if swiglu else hidden, norm_eps=hf.get("layer_norm_eps", 1e-6),
        gelu=_act(hf), qkv_bias=hf.get("qkv_bias", True), init_values=hf.get("layerscale_value", 1.0),
        reg_tokens=registers, no_embed_class=bool(registers), num_classes=0, mean=IMAGENET_MEAN, std=IMAGENET_STD,
        crop_pct=0.875)


def _dinov2_out(sd: Dict[str, torch.Tensor], config: ViTConfig) -> Dict[str, torch.Tensor]:
    sd = _split_qkv(sd, config.embed_dim)
    out = {"embeddings.mask_token": torch.zeros(1, config.embed_dim)}
    pos = sd.pop("pos_embed")
    if config.reg_tokens:  # a zero class slot: the class token keeps its folded position
        pos = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
    out["embeddings.position_embeddings"] = pos
    names = {"query": "q", "key": "k", "value": "v"}
    fc1, fc2 = ("weights_in", "weights_out") if config.mlp != "mlp" else ("fc1", "fc2")
    for ours, theirs in ((r"cls_token", "embeddings.cls_token"), (r"reg_token", "embeddings.register_tokens"),
                         (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embeddings.projection.\1"),
                         (r"norm\.(weight|bias)", r"layernorm.\1"),
                         (r"blocks\.(\d+)\.norm(1|2)\.(weight|bias)", r"encoder.layer.\1.norm\2.\3"),
                         *[(rf"blocks\.(\d+)\.attn\.{p}\.(weight|bias)",
                            rf"encoder.layer.\1.attention.attention.{n}.\2") for n, p in names.items()],
                         (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layer.\1.attention.output.dense.\2"),
                         (r"blocks\.(\d+)\.ls(1|2)\.gamma", r"encoder.layer.\1.layer_scale\2.lambda1"),
                         (r"blocks\.(\d+)\.mlp\.fc1\.(weight|bias)", rf"encoder.layer.\1.mlp.{fc1}.\2"),
                         (r"blocks\.(\d+)\.mlp\.fc2\.(weight|bias)", rf"encoder.layer.\1.mlp.{fc2}.\2")):
        for key in [k for k in sd if re.fullmatch(ours, k)]:
            out[re.sub(ours, theirs, key)] = sd.pop(key)
    _leftover(sd, "DINOv2")
    return out


def _dinov2_problems(config: Any) -> List[str]:
    problems = _problems(config, dict(architecture="vit", pos_embed="learned", class_token=True, global_pool="token",
                                      pre_norm=False, qk_norm=False, norm="layernorm", final_norm=True, num_classes=0,
                                      crop_remainder=False), "DINOv2", patch_bias=True)
    if config.init_values is None:
        problems.append("DINOv2 has LayerScale (init_values)")
    if config.no_embed_class != bool(config.reg_tokens):
        problems.append("DINOv2's position table has a class slot, and none for registers (no_embed_class only "
                        "with registers)")
    if config.mlp not in ("mlp", "swiglu_packed"):
        problems.append("DINOv2's MLP is GELU or packed SwiGLU")
    return problems


def _dinov2_hf_config(config: ViTConfig) -> Dict[str, Any]:
    swiglu = config.mlp == "swiglu_packed"
    out = dict(model_type="dinov2_with_registers" if config.reg_tokens else "dinov2",
               architectures=["Dinov2WithRegistersModel" if config.reg_tokens else "Dinov2Model"],
               hidden_size=config.embed_dim, num_hidden_layers=config.depth, num_attention_heads=config.num_heads,
               mlp_ratio=config.mlp_dim // config.embed_dim if not swiglu else 4, image_size=config.img_size[0],
               patch_size=config.patch_size[0], num_channels=config.in_chans, layer_norm_eps=config.norm_eps,
               hidden_act={v: k for k, v in _ACTS.items()}[config.gelu], qkv_bias=config.qkv_bias,
               layerscale_value=config.init_values, use_swiglu_ffn=swiglu)
    if config.reg_tokens:
        out["num_register_tokens"] = config.reg_tokens
    return out


def _dinov2_extra(config: Any) -> List[str]:
    if config.mlp == "swiglu_packed" and (int(config.embed_dim * 4 * 2 / 3) + 7) // 8 * 8 != config.mlp_dim:
        return [f"DINOv2's SwiGLU width is fixed by the model width ({config.mlp_dim} here)"]
    if config.mlp == "mlp" and config.mlp_dim % config.embed_dim:
        return [f"DINOv2's MLP width is a whole multiple of the model width ({config.mlp_dim} here)"]
    return []


# ----------------------------------------------------------------------------- DINOv3

_DINOV3_RULES = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.register_tokens", "reg_token"),
    (r"embeddings\.patch_embeddings\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"norm\.(weight|bias)", r"norm.\1"),
    (r"(?:model\.)?layer\.(\d+)\.norm(1|2)\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (r"(?:model\.)?layer\.(\d+)\.attention\.(q|k|v)_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"(?:model\.)?layer\.(\d+)\.attention\.o_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"(?:model\.)?layer\.(\d+)\.layer_scale(1|2)\.lambda1", r"blocks.\1.gamma_\2"),
    (r"(?:model\.)?layer\.(\d+)\.mlp\.up_proj\.(weight|bias)", r"blocks.\1.mlp.UP.\2"),
    (r"(?:model\.)?layer\.(\d+)\.mlp\.down_proj\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"(?:model\.)?layer\.(\d+)\.mlp\.gate_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_g.\2"),
]


def _dinov3_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    sd.pop("embeddings.mask_token", None)
    gated = bool(hf.get("use_gated_mlp"))
    out = rename(sd, _DINOV3_RULES)
    for key in [k for k in out if ".mlp.UP." in k]:
        out[key.replace(".mlp.UP.", ".mlp.fc1_x." if gated else ".mlp.fc1.")] = out.pop(key)
    if out.get("reg_token") is not None and out["reg_token"].shape[1] == 0:
        out.pop("reg_token")
    _fuse_qkv(out)
    return out


def _dinov3_config(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> EvaConfig:
    gated = bool(hf.get("use_gated_mlp"))
    if gated and hf.get("hidden_act") != "silu":
        raise WeightsError(f"DINOv3's gated MLP with hidden_act {hf.get('hidden_act')!r}: vitkit's gated MLP is "
                           f"SwiGLU (silu)")
    q, k, v = (hf.get(f"{n}_bias", d) for n, d in (("query", True), ("key", False), ("value", True)))
    if k and not (q and v) or q != v:
        raise WeightsError(f"DINOv3 with query/key/value biases {q}/{k}/{v}: vitkit reads q and v biases together, "
                           f"k's with them")
    return EvaConfig(
        img_size=_pair(hf.get("image_size", 224)), patch_size=_pair(hf.get("patch_size", 16)),
        in_chans=hf.get("num_channels", 3), embed_dim=hf["hidden_size"], depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp="swiglu" if gated else "mlp",
        mlp_dim=hf["intermediate_size"], proj_bias=hf.get("mlp_bias", True) and hf.get("proj_bias", True),
        norm_eps=hf.get("layer_norm_eps", 1e-5), gelu=_act(hf) if not gated else "exact",
        qkv_bias=bool(q), k_bias=bool(k), init_values=hf.get("layerscale_value", 1.0),
        reg_tokens=int(hf.get("num_register_tokens", 0)), rope="dinov3", rope_temperature=hf.get("rope_theta", 100.0),
        rope_half=True, rope_rescale_coords=hf.get("pos_embed_rescale"), pos_embed="none", global_pool="token",
        fc_norm=False, dynamic_img_size=True, num_classes=0, mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=1.0)


def _dinov3_out(sd: Dict[str, torch.Tensor], config: EvaConfig) -> Dict[str, torch.Tensor]:
    sd = _split_qkv(sd, config.embed_dim)
    out = {"embeddings.mask_token": torch.zeros(1, 1, config.embed_dim),
           "embeddings.register_tokens": sd.pop("reg_token", torch.zeros(1, 0, config.embed_dim))}
    for ours, theirs in ((r"cls_token", "embeddings.cls_token"),
                         (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embeddings.\1"),
                         (r"norm\.(weight|bias)", r"norm.\1"),
                         (r"blocks\.(\d+)\.norm(1|2)\.(weight|bias)", r"layer.\1.norm\2.\3"),
                         (r"blocks\.(\d+)\.attn\.(q|k|v)\.(weight|bias)", r"layer.\1.attention.\2_proj.\3"),
                         (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"layer.\1.attention.o_proj.\2"),
                         (r"blocks\.(\d+)\.gamma_(1|2)", r"layer.\1.layer_scale\2.lambda1"),
                         (r"blocks\.(\d+)\.mlp\.fc1\.(weight|bias)", r"layer.\1.mlp.up_proj.\2"),
                         (r"blocks\.(\d+)\.mlp\.fc1_x\.(weight|bias)", r"layer.\1.mlp.up_proj.\2"),
                         (r"blocks\.(\d+)\.mlp\.fc1_g\.(weight|bias)", r"layer.\1.mlp.gate_proj.\2"),
                         (r"blocks\.(\d+)\.mlp\.fc2\.(weight|bias)", r"layer.\1.mlp.down_proj.\2")):
        for key in [k for k in sd if re.fullmatch(ours, k)]:
            out[re.sub(ours, theirs, key)] = sd.pop(key)
    _leftover(sd, "DINOv3")
    return out


def _dinov3_problems(config: Any) -> List[str]:
    problems = _problems(config, dict(architecture="eva", rope="dinov3", rope_half=True, pos_embed="none",
                                      class_token=True, global_pool="token", pre_norm=False, norm="layernorm",
                                      final_norm=True, num_classes=0, qkv_fused=True, kv_heads=None,
                                      attn_only_layer_scale=False, qk_norm=False, crop_remainder=False), "DINOv3",
                         patch_bias=True)
    if config.init_values is None:
        problems.append("DINOv3 has LayerScale (init_values)")
    if config.mlp == "swiglu_packed":
        problems.append("DINOv3's gated MLP has separate gate and up projections (mlp='swiglu')")
    return problems


def _dinov3_hf_config(config: EvaConfig) -> Dict[str, Any]:
    return dict(model_type="dinov3_vit", architectures=["DINOv3ViTModel"], hidden_size=config.embed_dim,
                num_hidden_layers=config.depth, num_attention_heads=config.num_heads,
                intermediate_size=config.mlp_dim, image_size=config.img_size[0], patch_size=config.patch_size[0],
                num_channels=config.in_chans, layer_norm_eps=config.norm_eps,
                hidden_act="silu" if config.mlp == "swiglu" else {v: k for k, v in _ACTS.items()}[config.gelu],
                layerscale_value=config.init_values, num_register_tokens=config.reg_tokens,
                rope_theta=config.rope_temperature, pos_embed_rescale=config.rope_rescale_coords,
                query_bias=config.qkv_bias, key_bias=config.k_bias and config.qkv_bias, value_bias=config.qkv_bias,
                mlp_bias=config.proj_bias, proj_bias=config.proj_bias, use_gated_mlp=config.mlp == "swiglu")


# ----------------------------------------------------------------------------- the table


def _problems(config: Any, want: Mapping[str, Any], what: str, patch_bias: bool) -> List[str]:
    """What in ``config`` the tower's layout cannot express: fields other than ``want``'s, and the blocks'
    options no tower of these has."""
    problems = [f"{k}={getattr(config, k, None)!r} (it needs {v!r})" for k, v in want.items()
                if getattr(config, k, None) != v]
    if getattr(config, "use_patch_bias", patch_bias) != patch_bias:
        problems.append(f"a patch projection {'with' if patch_bias else 'without'} a bias")
    for name in ("backbone", "representation_size", "distill_token", "attn_norm", "mlp_norm", "embed_norm"):
        if getattr(config, name, None):
            problems.append(f"{name} (none in {what})")
    if getattr(config, "block", "pre") != "pre":
        problems.append(f"block={config.block!r} ({what} has pre-norm blocks)")
    return problems


def _leftover(sd: Mapping[str, Any], what: str) -> None:
    if sd:
        raise WeightsError(f"no {what} name for {', '.join(sorted(sd)[:5])}")


@dataclass(frozen=True)
class Tower:
    """One Hugging Face vision tower's layout (see the module notes)."""

    #: the class names it is saved as (``architectures`` of config.json)
    classes: Tuple[str, ...]
    #: (hub state dict without the vision prefix, the tower's config) -> vitkit names
    to_native: Callable[[Dict[str, torch.Tensor], Mapping[str, Any]], Dict[str, torch.Tensor]]
    #: (the tower's config, its state dict) -> vitkit config
    config: Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
    #: (vitkit state dict, config) -> hub names
    from_native: Callable[[Dict[str, torch.Tensor], Any], Dict[str, torch.Tensor]]
    #: vitkit config -> what the layout cannot express
    problems: Callable[[Any], List[str]]
    #: vitkit config -> the tower's config.json
    hf_config: Callable[[Any], Dict[str, Any]]


TOWERS: Dict[str, Tower] = {
    "clip_vision_model": Tower(("CLIPVisionModel", "CLIPVisionModelWithProjection"), _clip_in, _clip_config,
                               _clip_out, _clip_problems, _clip_hf_config),
    "siglip_vision_model": Tower(("SiglipVisionModel",), _siglip_in, _siglip_config, _siglip_out, _siglip_problems,
                                 _siglip_hf_config),
    "dinov2": Tower(("Dinov2Model",), _dinov2_in, _dinov2_config, _dinov2_out,
                    lambda c: _dinov2_problems(c) + _dinov2_extra(c), _dinov2_hf_config),
    "dinov2_with_registers": Tower(("Dinov2WithRegistersModel",), _dinov2_in, _dinov2_config, _dinov2_out,
                                   lambda c: _dinov2_problems(c) + _dinov2_extra(c), _dinov2_hf_config),
    "dinov3_vit": Tower(("DINOv3ViTModel",), _dinov3_in, _dinov3_config, _dinov3_out, _dinov3_problems,
                        _dinov3_hf_config),
}
#: two-tower (image and text) checkpoints: their vision config and tower
TWO_TOWERS = {"clip": "clip_vision_model", "siglip": "siglip_vision_model"}
MODEL_TYPES = tuple(TOWERS) + tuple(TWO_TOWERS)


def tower_of(hf: Mapping[str, Any]) -> Tuple[str, Mapping[str, Any]]:
    """(the tower's model_type, the tower's own config) of a config.json."""
    kind = hf.get("model_type")
    if kind in TWO_TOWERS:
        vision = hf.get("vision_config")
        if not isinstance(vision, Mapping):
            raise WeightsError(f"a {kind} config.json without a vision_config object")
        return TWO_TOWERS[kind], vision
    if kind not in TOWERS:
        raise WeightsError(f"Hugging Face model_type {kind!r} is not one of vitkit's ({', '.join(MODEL_TYPES)}, vit)")
    return kind, hf


def vision_part(sd: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The vision tower's tensors of a (possibly two-tower) checkpoint, without its prefix (the text
    tower, text projection and logit scale are left out: a vision model has no use for them)."""
    prefixed = any(k.startswith(_VISION_PREFIX) for k in sd)
    out = {}
    for key, value in sd.items():
        if key.startswith(_OTHER_TOWER):
            continue
        if prefixed and key.startswith(_VISION_PREFIX):
            key = key[len(_VISION_PREFIX):]
        out[key] = value
    return out


def to_native(sd: Mapping[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    kind, tower = tower_of(hf)
    tensors = {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in vision_part(sd).items()}
    return TOWERS[kind].to_native(tensors, tower)


def config_from_hf(hf: Mapping[str, Any], sd: Mapping[str, Any], preprocessor: Optional[Mapping[str, Any]] = None,
                   **overrides: Any):
    kind, tower = tower_of(hf)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(tower.get(key), int) or isinstance(tower.get(key), bool):
            raise WeightsError(f"the {kind} config needs an integer {key}, got {tower.get(key)!r}")
    try:
        config = TOWERS[kind].config(tower, vision_part(sd))
        fields = preprocessing(preprocessor) if preprocessor else {}
        return config.replace(**fields, **overrides)
    except (ValueError, TypeError) as e:
        raise WeightsError(f"the {kind} config describes no model vitkit builds: {e}") from None


def preprocessing(pre: Mapping[str, Any]) -> Dict[str, Any]:
    """A Hugging Face image processor's config -> mean, std, crop_pct, interpolation."""
    out: Dict[str, Any] = {}
    if "image_mean" in pre:
        out["mean"] = tuple(float(m) for m in pre["image_mean"])
    if "image_std" in pre:
        out["std"] = tuple(float(s) for s in pre["image_std"])
    resample = pre.get("resample")
    if resample in (2, 3):
        out["interpolation"] = "bilinear" if resample == 2 else "bicubic"
    size, crop = pre.get("size") or {}, pre.get("crop_size") or {}
    side = size.get("shortest_edge") if isinstance(size, Mapping) else size
    crop_side = crop.get("height") if isinstance(crop, Mapping) else crop
    if pre.get("do_center_crop") and isinstance(side, (int, float)) and isinstance(crop_side, (int, float)) and side:
        out["crop_pct"] = min(1.0, float(crop_side) / float(side))
    elif pre.get("do_center_crop") is False:
        out["crop_pct"] = 1.0
    return out


def layout_of(config: Any) -> Optional[str]:
    """The tower's model_type a vitkit config exports to (the first whose problems are none), or None."""
    for kind in ("clip_vision_model", "siglip_vision_model", "dinov2", "dinov3_vit"):
        if not TOWERS[kind].problems(config):
            return "dinov2_with_registers" if kind == "dinov2" and config.reg_tokens else kind
    return None


def export_problems(config: Any) -> Dict[str, List[str]]:
    """Per tower of the config's family, what keeps ``config`` from its layout (for one message naming the
    nearest): an EVA-style model can only be DINOv3, a ViT one of the others."""
    kinds = ("dinov3_vit",) if getattr(config, "architecture", "vit") == "eva" else (
        "clip_vision_model", "siglip_vision_model", "dinov2")
    return {kind: TOWERS[kind].problems(config) for kind in kinds}


_PROCESSORS = {"clip_vision_model": "CLIPImageProcessor", "siglip_vision_model": "SiglipImageProcessor",
               "dinov2": "BitImageProcessor", "dinov2_with_registers": "BitImageProcessor",
               "dinov3_vit": "DINOv3ViTImageProcessor"}


def preprocessor_to_hf(config: Any, kind: str) -> Dict[str, Any]:
    """The tower's image processor config for vitkit's preprocessing: resize the short side to
    size / crop_pct, centre crop (or, at crop_pct 1, resize to the size: SigLIP's way)."""
    h, w = config.img_size
    out: Dict[str, Any] = {"image_processor_type": _PROCESSORS[kind], "do_resize": True, "do_rescale": True,
                           "do_normalize": True, "image_mean": list(config.mean), "image_std": list(config.std),
                           "resample": 2 if config.interpolation == "bilinear" else 3}
    if config.crop_pct < 1.0:
        out.update(size={"shortest_edge": int(round(min(h, w) / config.crop_pct))}, do_center_crop=True,
                   crop_size={"height": h, "width": w})
    else:
        out.update(size={"height": h, "width": w}, do_center_crop=False)
    return out


def from_native(model) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """vitkit model -> (hub state dict, config.json) of the tower it is."""
    kind = layout_of(model.config)
    if kind is None:
        raise WeightsError("no Hugging Face vision tower expresses this model")
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    return TOWERS[kind].from_native(sd, model.config), TOWERS[kind].hf_config(model.config)


__all__ = ["TOWERS", "TWO_TOWERS", "MODEL_TYPES", "tower_of", "to_native", "config_from_hf", "preprocessing",
           "layout_of", "from_native", "export_problems", "vision_part", "preprocessor_to_hf"]
