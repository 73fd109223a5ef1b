"""BEiT's Hugging Face layout (``BeitModel``, ``BeitForImageClassification``; data2vec-vision's classes are
the same layout under ``data2vec_vision.``), both ways: its rows of :data:`~vitkit.weights.hf_towers.TOWERS`.

What decides parity (the rest is renaming):

- q and v have biases, k none: the hub's ``query``/``key``/``value`` are fused into timm's ``qkv`` with
  ``q_bias``/``v_bias``; LayerScale ``lambda_1``/``lambda_2`` is timm's ``gamma_1``/``gamma_2`` (none when
  ``layer_scale_init_value`` is 0).
- the relative position bias tables: per layer (``use_relative_position_bias``) as timm's; one shared table
  (``use_shared_relative_position_bias``, BEiT's pre-training) is the same table in every layer, so it is read
  into each (exact) and written back per layer. An absolute table (``use_absolute_position_embeddings``) is
  the ViT's learned one; both kinds in one model are refused (vitkit's BEiT holds one).
- a non-square grid: transformers reads each table's (2h - 1) x (2w - 1) offsets as (2w - 1) x (2h - 1) and
  resamples them bilinearly to (2h - 1) x (2w - 1) in every forward pass (even at the model's own size), so
  its BEiT at h != w computes another function than timm's on the same tensors. vitkit reads such a folder
  with that resampling done once into the tables (transformers' outputs, exactly), and refuses to write a
  non-square BEiT as a Hugging Face folder (the resampling cannot be undone: transformers would change it).
- ``use_mean_pooling``: the patches' mean through ``pooler.layernorm`` (timm's ``fc_norm``); without it the
  final ``layernorm`` and the class token. The classifier is the head.
- eps comes from ``layer_norm_eps``: Hugging Face's BEiT configs say 1e-12 where timm's BEiT uses 1e-6.

``BeitForMaskedImageModeling`` (BEiT's pre-trained checkpoints, ``microsoft/beit-*-pt22k``: where fine-tuning
starts) reads as its encoder: the tokens through its final ``layernorm``, what its visual-token head
(``lm_head``, left out: vitkit has no BEiT pre-training objective) reads; the segmentation classes keep
heads vitkit has no use for: refused, naming them.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

import torch
import torch.nn.functional as F

from .hf_tower_parts import (
    Tower,
    _act,
    _fuse_qkv,
    _move_all,
    _pair,
    _problems,
    _split_qkv,
    labels_from_hf,
    labels_to_hf,
)
from .io import WeightsError
from .names import rename

#: the base model's prefix in a classifier's checkpoint, per model_type
_PREFIXES = ("beit.", "data2vec_vision.")
#: heads of the other BEiT classes: never read, and never dropped in silence
_OTHER_HEADS = ("decode_head.", "auxiliary_head.", "fpn1.", "fpn2.", "fpn3.", "fpn4.")
#: the masked-image-modelling class's head over the visual tokens' vocabulary (its encoder is read)
_MIM_HEAD = "lm_head."
_LAYER = r"(?:encoder\.layer|layers)\.(\d+)\."
_BEIT_RULES = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (rf"{_LAYER}layernorm_(before|after)\.(weight|bias)", r"blocks.\1.NORM_\2.\3"),
    (rf"{_LAYER}attention\.attention\.(query|key|value)\.(weight|bias)", r"blocks.\1.attn.QKV_\2.\3"),
    (rf"{_LAYER}attention\.(q|k|v)_proj\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (rf"{_LAYER}attention\.(?:output\.dense|o_proj)\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (rf"{_LAYER}(?:attention\.attention\.)?relative_position_bias\.relative_position_bias_table",
     r"blocks.\1.attn.relative_position_bias_table"),
    (rf"{_LAYER}(?:intermediate\.dense|mlp\.fc1)\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),
    (rf"{_LAYER}(?:output\.dense|mlp\.fc2)\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (rf"{_LAYER}lambda_(1|2)", r"blocks.\1.gamma_\2"),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
    (r"pooler\.layernorm\.(weight|bias)", r"fc_norm.\1"),
    (r"classifier\.(weight|bias)", r"head.\1"),
]
_SHARED_TABLES = ("encoder.relative_position_bias.relative_position_bias_table",
                  "shared_position_bias.relative_position_bias_table")


def _base(sd: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The base model's names (its prefix off); the other classes' heads refused by name."""
    heads = sorted(k for k in sd if k.startswith(_OTHER_HEADS))
    if heads:
        what = "the backbone's add_fpn pyramid" if heads[0].startswith("fpn") else "segmentation"
        raise WeightsError(f"a BEiT checkpoint with a head vitkit does not read ({heads[0]}: {what}): vitkit "
                           f"loads BeitModel, BeitForImageClassification, BeitForMaskedImageModeling and BeitBackbone "
                           f"(without add_fpn) folders (for the encoder, load it in transformers as BeitModel and "
                           f"save_pretrained that)")
    out = {}
    for key, value in sd.items():
        if key.startswith(_MIM_HEAD):
            continue
        out[next((key[len(p):] for p in _PREFIXES if key.startswith(p)), key)] = value
    if any(k.startswith(_MIM_HEAD) for k in sd) and any(k.startswith(f"{p}layernorm.") for k in sd for p in _PREFIXES):
        raise WeightsError("a BEiT masked-image-modelling checkpoint without mean pooling normalises its tokens twice "
                           "(the model's layernorm, then the head's): vitkit's BEiT has one final norm")
    return out


def _beit_in(sd: Dict[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    sd = _base(sd)
    sd.pop("embeddings.mask_token", None)  # masked pre-training's token: no use in a forward pass
    for key in [k for k in sd if k.endswith("relative_position_index")]:  # derived from the grid
        sd.pop(key)
    shared = [sd.pop(k) for k in _SHARED_TABLES if k in sd]
    out = rename(sd, _BEIT_RULES)
    for key in list(out):
        m = re.fullmatch(r"(blocks\.\d+)\.(NORM_before|NORM_after|attn\.QKV_\w+)\.(weight|bias)", key)
        if m:
            part = {"NORM_before": "norm1", "NORM_after": "norm2", "attn.QKV_query": "attn.q",
                    "attn.QKV_key": "attn.k", "attn.QKV_value": "attn.v"}[m.group(2)]
            out[f"{m.group(1)}.{part}.{m.group(3)}"] = out.pop(key)
    if any(re.fullmatch(r"blocks\.\d+\.attn\.k\.bias", k) for k in out):
        raise WeightsError("a BEiT checkpoint with a key bias: BEiT's attention has q and v biases only")
    _fuse_qkv(out)
    if shared:  # one table for every layer is that table in each
        layers = sorted({int(k.split(".")[1]) for k in out if k.startswith("blocks.")})
        for i in layers:
            out[f"blocks.{i}.attn.relative_position_bias_table"] = shared[0].clone()
    h, w = (s // p for s, p in zip(_pair(hf.get("image_size", 224)), _pair(hf.get("patch_size", 16))))
    if h != w:
        for key in [k for k in out if k.endswith(".relative_position_bias_table")]:
            out[key] = _as_transformers_reads(out[key], h, w)
    return out


def _as_transformers_reads(table: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The table transformers' BEiT uses on an h x w grid (h != w): the offsets read as (2w - 1) x (2h - 1),
    resampled bilinearly to (2h - 1) x (2w - 1); the class token's three rows as they are."""
    rows, cols = 2 * h - 1, 2 * w - 1
    if table.shape[0] != rows * cols + 3:
        return table  # the loader names the shape that does not fit
    grid = table[:rows * cols].reshape(1, cols, rows, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(rows, cols), mode="bilinear").permute(0, 2, 3, 1).reshape(rows * cols, -1)
    return torch.cat([grid, table[rows * cols:]])


def _beit_config(hf: Mapping[str, Any], sd: Mapping[str, Any]):
    from ..models.registry import get_model_config

    relative = bool(hf.get("use_relative_position_bias") or hf.get("use_shared_relative_position_bias"))
    absolute = bool(hf.get("use_absolute_position_embeddings"))
    if relative and absolute:
        raise WeightsError("a BEiT with both an absolute position table and relative position biases: vitkit's BEiT "
                           "holds one of the two")
    scale = hf.get("layer_scale_init_value", 0.1)
    base = _base(sd)
    head = base.get("classifier.weight")
    num_classes = int(head.shape[0]) if head is not None else 0
    labels = labels_from_hf(hf, num_classes) if head is not None else None
    mean_pool = bool(hf.get("use_mean_pooling", True)) and "layernorm.weight" not in base  # MIM: its final norm
    # mean pooling without the pooler's norm (BeitModel built without its pooling layer: data2vec-vision's
    # model, the backbone): no norm at all, the tokens as the last block leaves them
    bare_mean = mean_pool and "pooler.layernorm.weight" not in base
    fields: Dict[str, Any] = dict(
        name=None, img_size=_pair(hf.get("image_size", 224)), patch_size=_pair(hf.get("patch_size", 16)),
        in_chans=hf.get("num_channels", 3), embed_dim=hf["hidden_size"], depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf.get("intermediate_size", 4 * hf["hidden_size"]),
        norm_eps=hf.get("layer_norm_eps", 1e-12), gelu=_act(hf),
        init_values=float(scale) if isinstance(scale, (int, float)) and scale > 0 else None,
        pos_embed="relative" if relative else "learned" if absolute else "none",
        global_pool="avg" if mean_pool else "token", fc_norm=False if bare_mean else None,
        final_norm=not bare_mean, num_classes=num_classes, crop_pct=1.0,
        rel_pos_resize="bilinear")  # at another size, its tables stretched as transformers stretches them
    if labels:
        fields["label_names"] = labels
    return get_model_config("beit_base_patch16_224").replace(**fields)


def _beit_out(sd: Dict[str, torch.Tensor], config: Any) -> Dict[str, torch.Tensor]:
    classify = config.num_classes > 0
    root = "beit." if classify else ""
    sd = _split_qkv(sd, config.embed_dim)
    layer = rf"{root}encoder.layer.\1"
    rules = ((r"cls_token", f"{root}embeddings.cls_token"), (r"pos_embed", f"{root}embeddings.position_embeddings"),
             (r"patch_embed\.proj\.(weight|bias)", rf"{root}embeddings.patch_embeddings.projection.\1"),
             (r"blocks\.(\d+)\.norm1\.(weight|bias)", rf"{layer}.layernorm_before.\2"),
             (r"blocks\.(\d+)\.norm2\.(weight|bias)", rf"{layer}.layernorm_after.\2"),
             (r"blocks\.(\d+)\.attn\.q\.(weight|bias)", rf"{layer}.attention.attention.query.\2"),
             (r"blocks\.(\d+)\.attn\.k\.weight", rf"{layer}.attention.attention.key.weight"),
             (r"blocks\.(\d+)\.attn\.v\.(weight|bias)", rf"{layer}.attention.attention.value.\2"),
             (r"blocks\.(\d+)\.attn\.relative_position_bias_table",
              rf"{layer}.attention.attention.relative_position_bias.relative_position_bias_table"),
             (r"blocks\.(\d+)\.attn\.proj\.(weight|bias)", rf"{layer}.attention.output.dense.\2"),
             (r"blocks\.(\d+)\.mlp\.fc1\.(weight|bias)", rf"{layer}.intermediate.dense.\2"),
             (r"blocks\.(\d+)\.mlp\.fc2\.(weight|bias)", rf"{layer}.output.dense.\2"),
             (r"blocks\.(\d+)\.gamma_(1|2)", rf"{layer}.lambda_\2"),
             (r"norm\.(weight|bias)", rf"{root}layernorm.\1"),
             (r"fc_norm\.(weight|bias)", rf"{root}pooler.layernorm.\1"),
             (r"head\.(weight|bias)", r"classifier.\1"))
    return _move_all(sd, rules, {}, "BEiT")


def _beit_problems(config: Any) -> List[str]:
    problems = _problems(config, dict(architecture="eva", rope="none", class_token=True, pre_norm=False,
                                      norm="layernorm", final_norm=True, reg_tokens=0, qkv_fused=True, qkv_bias=True,
                                      k_bias=False, proj_bias=True, mlp="mlp", kv_heads=None, qk_norm=False,
                                      attn_only_layer_scale=False, no_embed_class=False, crop_remainder=False),
                         "BEiT", patch_bias=True, square=False)
    if config.pos_embed not in ("relative", "learned", "none"):
        problems.append(f"pos_embed={config.pos_embed!r} (BEiT's are relative biases or a learned table)")
    pool = (config.global_pool, config.use_fc_norm)
    if pool not in (("avg", True), ("token", False)):
        problems.append(f"global_pool={config.global_pool!r} with fc_norm={config.use_fc_norm} (BEiT pools the "
                        f"patches' mean through a LayerNorm, or the class token after the final one)")
    if config.pos_embed == "relative" and config.grid_size[0] != config.grid_size[1]:
        problems.append(f"a relative bias on a {config.grid_size[0]} x {config.grid_size[1]} grid (transformers' BEiT "
                        f"resamples a non-square grid's tables in every forward pass: it would compute another "
                        f"function)")
    if config.patch_size[0] != config.patch_size[1]:
        problems.append(f"patch_size={tuple(config.patch_size)} (Hugging Face's BEiT has square patches)")
    if config.gelu not in ("exact", "tanh"):
        problems.append(f"gelu={config.gelu!r} (BEiT's is the exact or the tanh GELU)")
    return problems


def _beit_hf_config(config: Any) -> Dict[str, Any]:
    square = config.img_size[0] == config.img_size[1]
    classify = config.num_classes > 0
    out: Dict[str, Any] = dict(
        model_type="beit", architectures=["BeitForImageClassification" if classify else "BeitModel"],
        hidden_size=config.embed_dim, num_hidden_layers=config.depth, num_attention_heads=config.num_heads,
        intermediate_size=config.mlp_dim, image_size=config.img_size[0] if square else list(config.img_size),
        patch_size=config.patch_size[0], num_channels=config.in_chans,
        layer_norm_eps=config.norm_eps, hidden_act="gelu" if config.gelu == "exact" else "gelu_pytorch_tanh",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
        layer_scale_init_value=config.init_values or 0.0, use_mask_token=False,
        use_absolute_position_embeddings=config.pos_embed == "learned",
        use_relative_position_bias=config.pos_embed == "relative", use_shared_relative_position_bias=False,
        use_mean_pooling=config.global_pool == "avg")
    if classify:
        out.update(labels_to_hf(config))
    return out


BEIT_TOWER = Tower(("BeitModel", "BeitForImageClassification"), _beit_in, _beit_config, _beit_out, _beit_problems,
                   _beit_hf_config)
DATA2VEC_VISION_TOWER = Tower(("Data2VecVisionModel", "Data2VecVisionForImageClassification"), _beit_in,
                              _beit_config, _beit_out, _beit_problems, _beit_hf_config)
