"""CLIP's and SigLIP's vision towers in the Hugging Face layout, both ways: their rows of
:data:`~vitkit.weights.hf_towers.TOWERS` (what each class is and how vitkit reads it: that module's notes)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import torch

from ..models import ViTConfig
from ..models.vit_names import CLIP_MEAN, CLIP_STD
from .hf_tower_parts import (
    _VISION_PREFIX,
    HF_ACT_NAMES,
    Tower,
    _act,
    _fuse_qkv,
    _move_all,
    _pair,
    _problems,
    _split_qkv,
    read_only_tower,
)
from .io import WeightsError
from .names import rename

# ----------------------------------------------------------------------------- CLIP

#: what CLIP's, SigLIP's and BLIP's towers name alike: the patch projection, each layer's norms and MLP, the norm
#: after the blocks (AltCLIP's checkpoints name the layers ``encoder.layer.N``, as transformers saves them for its hub)
CLIP_FAMILY_RULES = [
    (r"embeddings\.patch_embedding\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"post_layernorm\.(weight|bias)", r"norm.\1"),
    (r"encoder\.layers?\.(\d+)\.layer_norm(1|2)\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (r"encoder\.layers?\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
]
#: the attention's separate projections (CLIP's and SigLIP's)
_SEPARATE_QKV_RULES = [
    (r"encoder\.layers?\.(\d+)\.self_attn\.(q|k|v)_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (r"encoder\.layers?\.(\d+)\.self_attn\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
]
_CLIP_RULES = [
    *CLIP_FAMILY_RULES, *_SEPARATE_QKV_RULES,
    (r"pre_lay(?:r|er)norm\.(weight|bias)", r"norm_pre.\1"),  # (CLIP's misspelt name; OWL-ViT's spelt)
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
        head_kind="projection",
        mean=CLIP_MEAN, std=CLIP_STD, crop_pct=1.0)


def _clip_out(sd: Dict[str, torch.Tensor], config: ViTConfig) -> Dict[str, torch.Tensor]:
    sd = _split_qkv(sd, config.embed_dim)
    out = {"embeddings.class_embedding": sd.pop("cls_token").reshape(-1),
           "embeddings.position_embedding.weight": sd.pop("pos_embed")[0]}
    bias = sd.pop("head.bias", None)
    if bias is not None and bias.abs().max() > 0:
        raise WeightsError("CLIP's visual_projection has no bias: this model's head has one (export as 'timm')")
    _move_all(sd, ((r"patch_embed\.proj\.weight", "embeddings.patch_embedding.weight"),
                   (r"norm_pre\.(weight|bias)", r"pre_layrnorm.\1"),
                   (r"norm\.(weight|bias)", r"post_layernorm.\1"),
                   (r"blocks\.(\d+)\.attn\.(q|k|v)\.(weight|bias)", r"encoder.layers.\1.self_attn.\2_proj.\3"),
                   (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layers.\1.self_attn.out_proj.\2"),
                   (r"blocks\.(\d+)\.norm(1|2)\.(weight|bias)", r"encoder.layers.\1.layer_norm\2.\3"),
                   (r"blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"encoder.layers.\1.mlp.\2.\3"),
                   (r"head\.weight", "visual_projection.weight")), out, "CLIP")
    if "visual_projection.weight" in out:
        out = {(k if k == "visual_projection.weight" else _VISION_PREFIX + k): v for k, v in out.items()}
    return out


def _clip_problems(config: Any) -> List[str]:
    problems = _problems(config, dict(architecture="vit", pos_embed="learned", class_token=True, pre_norm=True,
                                      global_pool="token", reg_tokens=0, init_values=None, no_embed_class=False,
                                      qkv_bias=True, qk_norm=False, mlp="mlp", norm="layernorm", final_norm=True,
                                      crop_remainder=False),
                         "CLIP's vision tower", patch_bias=False)
    if config.num_classes and getattr(config, "head_kind", "classes") != "projection":  # read back as a projection
        problems.append("a head of classes on the class token (CLIP's visual_projection is a projection into the "
                        "image-text space; CLIPForImageClassification reads the patches' mean without the final norm)")
    return problems


def _clip_hf_config(config: ViTConfig) -> Dict[str, Any]:
    out = dict(model_type="clip_vision_model", hidden_size=config.embed_dim, num_hidden_layers=config.depth,
               num_attention_heads=config.num_heads, intermediate_size=config.mlp_dim,
               image_size=config.img_size[0], patch_size=config.patch_size[0], num_channels=config.in_chans,
               layer_norm_eps=config.norm_eps, hidden_act=HF_ACT_NAMES[config.gelu],
               architectures=["CLIPVisionModelWithProjection" if config.num_classes else "CLIPVisionModel"])
    if config.num_classes:
        out["projection_dim"] = config.num_classes
    return out


# ----------------------------------------------------------------------------- SigLIP

_SIGLIP_RULES = [
    *CLIP_FAMILY_RULES, *_SEPARATE_QKV_RULES,
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
    # the head by any of its tensors: a file without head.probe alone was read as headless (its 12 other head
    # tensors said as "not in the model")
    head = hf.get("vision_use_head", True) and any(k.startswith("head.") for k in sd)
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
    _move_all(sd, ((r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embedding.\1"),
                   (r"norm\.(weight|bias)", r"post_layernorm.\1"),
                   (r"blocks\.(\d+)\.attn\.(q|k|v)\.(weight|bias)", r"encoder.layers.\1.self_attn.\2_proj.\3"),
                   (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layers.\1.self_attn.out_proj.\2"),
                   (r"blocks\.(\d+)\.norm(1|2)\.(weight|bias)", r"encoder.layers.\1.layer_norm\2.\3"),
                   (r"blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)", r"encoder.layers.\1.mlp.\2.\3"),
                   (r"attn_pool\.proj\.(weight|bias)", r"head.attention.out_proj.\1"),
                   (r"attn_pool\.norm\.(weight|bias)", r"head.layernorm.\1"),
                   (r"attn_pool\.mlp\.(fc1|fc2)\.(weight|bias)", r"head.mlp.\1.\2")), out, "SigLIP")
    return out


def _siglip_problems(config: Any) -> List[str]:
    problems = _problems(config, dict(architecture="vit", pos_embed="learned", class_token=False, reg_tokens=0,
                                      init_values=None, pre_norm=False, qkv_bias=True, qk_norm=False, mlp="mlp",
                                      norm="layernorm", final_norm=True, num_classes=0, pool_include_prefix=False),
                         "SigLIP's vision tower", patch_bias=True)
    if config.global_pool == "map" and (config.map_heads not in (None, config.num_heads)
                                        or config.map_mlp_dim not in (None, config.mlp_dim)):
        problems.append("SigLIP's head uses the blocks' heads and MLP width")
    # without its head (vision_use_head false, PaliGemma's tower) it holds the normed tokens, read as their mean: a
    # SigLIP by its GELU (big_vision's tanh) or its name (timm's SigLIP-gap, exact GELU), else I-JEPA's layout
    siglip = config.gelu == "tanh" or "siglip" in (getattr(config, "name", None) or "")
    if config.global_pool != "map" and not (config.global_pool == "avg" and not config.use_fc_norm and siglip):
        problems.append("SigLIP's tower reads out with its attention pool (global_pool='map'), or without it "
                        "(vision_use_head false) the mean of its normed tokens (global_pool='avg', no fc_norm)")
    return problems


def _siglip_hf_config(config: ViTConfig) -> Dict[str, Any]:
    return dict(model_type="siglip_vision_model", architectures=["SiglipVisionModel"], hidden_size=config.embed_dim,
                num_hidden_layers=config.depth, num_attention_heads=config.num_heads,
                intermediate_size=config.mlp_dim, image_size=config.img_size[0], patch_size=config.patch_size[0],
                num_channels=config.in_chans, layer_norm_eps=config.norm_eps,
                hidden_act=HF_ACT_NAMES[config.gelu], vision_use_head=config.global_pool == "map")



# ----------------------------------------------------------------------------- SigLIP 2 (NaFlex)


def _siglip2_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """SigLIP 2's NaFlex tower: SigLIP's names, with a patch projection over flattened (row, column, channel)
    patches (a Linear: the convolution's kernel reordered) and a square base table."""
    patch = int(hf.get("patch_size", 16))
    weight = sd.get("embeddings.patch_embedding.weight")
    if weight is not None and weight.dim() == 2:
        channels = weight.shape[1] // (patch * patch)
        if channels * patch * patch != weight.shape[1]:
            raise WeightsError(f"SigLIP 2's patch projection takes {weight.shape[1]} values, not a whole number of "
                               f"{patch} x {patch} patches")
        sd["embeddings.patch_embedding.weight"] = weight.reshape(weight.shape[0], patch, patch, channels).permute(
            0, 3, 1, 2).contiguous()
    return _siglip_in(sd, hf)


def _siglip2_config(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> ViTConfig:
    """SigLIP's, at the base grid of its table (``num_patches``, a square), with transformers' resampling of it to
    any other grid: bilinear with antialiasing, at every input size (NaFlex's per-image grids, one size per
    batch here)."""
    patches = int(hf.get("num_patches", 256))
    side = int(round(patches ** 0.5))
    if side * side != patches:
        raise WeightsError(f"SigLIP 2's position table of {patches} patches is not a square grid")
    patch = int(hf.get("patch_size", 16))
    return _siglip_config({**hf, "image_size": side * patch}, sd).replace(
        pos_embed_interpolation="bilinear", pos_embed_antialias=True, dynamic_img_size=True, crop_pct=1.0)


CLIP_TOWER = Tower(("CLIPVisionModel", "CLIPVisionModelWithProjection"), _clip_in, _clip_config, _clip_out,
                   _clip_problems, _clip_hf_config)
SIGLIP_TOWER = Tower(("SiglipVisionModel",), _siglip_in, _siglip_config, _siglip_out, _siglip_problems,
                     _siglip_hf_config)
SIGLIP2_TOWER = read_only_tower(("Siglip2VisionModel",), _siglip2_in, _siglip2_config, "SigLIP 2's NaFlex tower",
                                "SigLIP's (SiglipVisionModel)")
