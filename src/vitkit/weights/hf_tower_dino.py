"""DINOv2's (with registers too) and DINOv3's towers in the Hugging Face layout, both ways: their rows of
:data:`~vitkit.weights.hf_towers.TOWERS` (what each class is and how vitkit reads it: that module's notes)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

import torch

from ..models import EvaConfig, ViTConfig
from ..models.config_base import IMAGENET_MEAN, IMAGENET_STD
from .hf_tower_parts import HF_ACT_NAMES, Tower, _act, _fuse_qkv, _move_all, _pair, _problems, _split_qkv
from .io import WeightsError
from .names import rename

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


def _registers(hf: Mapping[str, Any]) -> int:
    """The register tokens a DINOv2 config states (only the with-registers class has them)."""
    return int(hf.get("num_register_tokens", 0)) if hf.get("model_type") == "dinov2_with_registers" else 0


def _dinov2_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    registers, held = _registers(hf), "embeddings.register_tokens" in sd
    if bool(registers) != held:  # (the table's class slot folds by the registers: a missing tensor blamed the size)
        said = (f"its config says {registers} register tokens (dinov2_with_registers) where its weights hold no "
                f"embeddings.register_tokens" if registers else
                f"its weights hold embeddings.register_tokens where its config (model_type "
                f"{hf.get('model_type')!r}) has no registers")
        raise WeightsError(f"{said}: it was edited or mixed with other weights; fix or re-save it")
    sd.pop("embeddings.mask_token", None)  # the masked pre-training's token: no use in a forward pass
    pos = sd.pop("embeddings.position_embeddings", None)
    out = rename(sd, _DINOV2_RULES)
    for key in list(out):  # the hub's query/key/value -> q/k/v, then fused
        m = re.fullmatch(r"(blocks\.\d+\.attn)\.(query|key|value)\.(weight|bias)", key)
        if m:
            out[f"{m.group(1)}.{m.group(2)[0]}.{m.group(3)}"] = out.pop(key)
    _fuse_qkv(out)
    if pos is not None:
        if registers:  # registers enter after the positions: the class slot folds into the token
            if "cls_token" in out:
                out["cls_token"] = out["cls_token"] + pos[:, :1]
            pos = pos[:, 1:]
        out["pos_embed"] = pos
    return out


def _dinov2_config(hf: Mapping[str, Any], sd: Mapping[str, Any]) -> ViTConfig:
    width = hf["hidden_size"]
    hidden = int(width * hf.get("mlp_ratio", 4))
    swiglu = bool(hf.get("use_swiglu_ffn"))
    registers = _registers(hf)
    return ViTConfig(
        img_size=_pair(hf.get("image_size", 518)), patch_size=_pair(hf.get("patch_size", 14)),
        in_chans=hf.get("num_channels", 3), embed_dim=width, depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp="swiglu_packed" if swiglu else "mlp",
        mlp_dim=((int(hidden * 2 / 3) + 7) // 8 * 8) if swiglu else hidden, norm_eps=hf.get("layer_norm_eps", 1e-6),
        gelu=_act(hf), qkv_bias=hf.get("qkv_bias", True), init_values=hf.get("layerscale_value", 1.0),
        reg_tokens=registers, no_embed_class=bool(registers), num_classes=0, mean=IMAGENET_MEAN, std=IMAGENET_STD,
        crop_pct=0.875, dynamic_img_size=True)  # transformers runs any size, its table resampled on each call


def _dinov2_out(sd: Dict[str, torch.Tensor], config: ViTConfig) -> Dict[str, torch.Tensor]:
    sd = _split_qkv(sd, config.embed_dim)
    pos = sd.pop("pos_embed")
    out = {"embeddings.mask_token": pos.new_zeros(1, config.embed_dim)}  # the weights' dtype (fp16 stays fp16)
    if config.reg_tokens:  # a zero class slot: the class token keeps its folded position
        pos = torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)
    out["embeddings.position_embeddings"] = pos
    names = {"query": "q", "key": "k", "value": "v"}
    fc1, fc2 = ("weights_in", "weights_out") if config.mlp != "mlp" else ("fc1", "fc2")
    _move_all(sd, ((r"cls_token", "embeddings.cls_token"), (r"reg_token", "embeddings.register_tokens"),
                   (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embeddings.projection.\1"),
                   (r"norm\.(weight|bias)", r"layernorm.\1"),
                   (r"blocks\.(\d+)\.norm(1|2)\.(weight|bias)", r"encoder.layer.\1.norm\2.\3"),
                   *[(rf"blocks\.(\d+)\.attn\.{p}\.(weight|bias)",
                      rf"encoder.layer.\1.attention.attention.{n}.\2") for n, p in names.items()],
                   (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"encoder.layer.\1.attention.output.dense.\2"),
                   (r"blocks\.(\d+)\.ls(1|2)\.gamma", r"encoder.layer.\1.layer_scale\2.lambda1"),
                   (r"blocks\.(\d+)\.mlp\.fc1\.(weight|bias)", rf"encoder.layer.\1.mlp.{fc1}.\2"),
                   (r"blocks\.(\d+)\.mlp\.fc2\.(weight|bias)", rf"encoder.layer.\1.mlp.{fc2}.\2")), out, "DINOv2")
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
               mlp_ratio=config.mlp_dim // config.embed_dim if not swiglu else 4,
               image_size=(config.pos_embed_size or config.img_size)[0],  # the table's (resampled to each input)
               patch_size=config.patch_size[0], num_channels=config.in_chans, layer_norm_eps=config.norm_eps,
               hidden_act=HF_ACT_NAMES[config.gelu], qkv_bias=config.qkv_bias,
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
    like = sd["cls_token"]  # the weights' dtype (fp16 stays fp16)
    out = {"embeddings.mask_token": like.new_zeros(1, 1, config.embed_dim),
           "embeddings.register_tokens": sd.pop("reg_token", like.new_zeros(1, 0, config.embed_dim))}
    _move_all(sd, ((r"cls_token", "embeddings.cls_token"),
                   (r"patch_embed\.proj\.(weight|bias)", r"embeddings.patch_embeddings.\1"),
                   (r"norm\.(weight|bias)", r"norm.\1"),
                   (r"blocks\.(\d+)\.norm(1|2)\.(weight|bias)", r"layer.\1.norm\2.\3"),
                   (r"blocks\.(\d+)\.attn\.(q|k|v)\.(weight|bias)", r"layer.\1.attention.\2_proj.\3"),
                   (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", r"layer.\1.attention.o_proj.\2"),
                   (r"blocks\.(\d+)\.gamma_(1|2)", r"layer.\1.layer_scale\2.lambda1"),
                   (r"blocks\.(\d+)\.mlp\.fc1\.(weight|bias)", r"layer.\1.mlp.up_proj.\2"),
                   (r"blocks\.(\d+)\.mlp\.fc1_x\.(weight|bias)", r"layer.\1.mlp.up_proj.\2"),
                   (r"blocks\.(\d+)\.mlp\.fc1_g\.(weight|bias)", r"layer.\1.mlp.gate_proj.\2"),
                   (r"blocks\.(\d+)\.mlp\.fc2\.(weight|bias)", r"layer.\1.mlp.down_proj.\2")), out, "DINOv3")
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
                hidden_act="silu" if config.mlp == "swiglu" else HF_ACT_NAMES[config.gelu],
                layerscale_value=config.init_values, num_register_tokens=config.reg_tokens,
                rope_theta=config.rope_temperature, pos_embed_rescale=config.rope_rescale_coords,
                query_bias=config.qkv_bias, key_bias=config.k_bias and config.qkv_bias, value_bias=config.qkv_bias,
                mlp_bias=config.proj_bias, proj_bias=config.proj_bias, use_gated_mlp=config.mlp == "swiglu")



DINOV2_TOWER = Tower(("Dinov2Model",), _dinov2_in, _dinov2_config, _dinov2_out,
                     lambda c: _dinov2_problems(c) + _dinov2_extra(c), _dinov2_hf_config)
DINOV2_REGISTERS_TOWER = Tower(("Dinov2WithRegistersModel",), _dinov2_in, _dinov2_config, _dinov2_out,
                               lambda c: _dinov2_problems(c) + _dinov2_extra(c), _dinov2_hf_config)
DINOV3_TOWER = Tower(("DINOv3ViTModel",), _dinov3_in, _dinov3_config, _dinov3_out, _dinov3_problems,
                     _dinov3_hf_config)
