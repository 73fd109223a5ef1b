"""The official JAX layouts, flattened with ``/`` into an ``.npz``.

- vit_jax (the paper's code): ``cls``, ``embedding/kernel`` (P, P, C, D), the position table
  ``Transformer/posembed_input/pos_embedding`` (1, 1+N, D), blocks
  ``Transformer/encoderblock_{i}/{LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2,
  MlpBlock_3}``, ``Transformer/encoder_norm``, ``pre_logits``, ``head``; optionally under
  ``opt/target/`` (checkpoints saved with their optimiser).
- big_vision: a ``params/`` prefix (``params/img/`` for a two-tower SigLIP's image tower),
  ``pos_embedding`` (1, N, D) at the top without a class slot (its class token is added after the
  positions), block parts numbered ``LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1,
  MlpBlock_0``, optionally the ``scan`` layout (one ``Transformer/encoderblock`` whose arrays carry a
  leading depth axis), and SigLIP's MAP head ``MAPHead_0/{probe, MultiHeadDotProductAttention_0,
  LayerNorm_0, MlpBlock_0}`` (vitkit's ``attn_pool``).

Attention kernels are stored per head: query/key/value (D, heads, head_dim), out
(heads, head_dim, D). The official "gap" head normalises *before* pooling (``fc_norm=False``
in vitkit/timm terms).

The ResNet hybrids (vit_jax ``R50+ViT-B_16``, augreg ``R_Ti_16``, ``R26_S_32``, ``R50_L_32``)
store their CNN beside ``Transformer/``: ``conv_root/kernel`` (7, 7, C, 64) HWIO,
``gn_root/{scale,bias}``, and per stage s and unit u (both from 1)
``block{s}/unit{u}/{conv1,conv2,conv3}/kernel``, ``.../{gn1,gn2,gn3}/{scale,bias}``, on each
stage's first unit ``.../conv_proj/kernel`` and ``.../gn_proj/{scale,bias}``. GroupNorm
parameters may be stored as (C,) or (1, 1, 1, C). ``embedding/kernel`` is then the projection
of the CNN's feature map (1, 1, C_feat, D) for patch 1.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..models import ViTConfig
from ..models.hybrid import backbone_in_chans, backbone_reduction, infer_backbone
from ..models.positions import full_table
from ..models.sizes import to_2tuple
from ..models.vit_infer import grid_at_size
from .io import WeightsError

_VIT_JAX_PARTS = {"ln1": "LayerNorm_0", "mha": "MultiHeadDotProductAttention_1",
                  "ln2": "LayerNorm_2", "mlp": "MlpBlock_3"}
_BIG_VISION_PARTS = {"ln1": "LayerNorm_0", "mha": "MultiHeadDotProductAttention_0",
                     "ln2": "LayerNorm_1", "mlp": "MlpBlock_0"}


def detect_layout(keys) -> Optional[Tuple[str, str]]:
    """(layout, prefix) for an official npz, or None. layout: 'vit_jax' | 'big_vision'."""
    keys = set(keys)
    for prefix in ("opt/target/", "params/", "params/img/", ""):
        if f"{prefix}embedding/kernel" in keys:
            big = (prefix.startswith("params/") or f"{prefix}pos_embedding" in keys
                   or f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in keys
                   or f"{prefix}Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel" in keys)
            return ("big_vision" if big else "vit_jax"), prefix
    return None


class _Reader:
    """Indexed access to the block arrays of either layout (scan or per-block)."""

    def __init__(self, w: Mapping[str, np.ndarray], layout: str, prefix: str):
        self.w, self.prefix = w, prefix
        self.parts = _BIG_VISION_PARTS if layout == "big_vision" else _VIT_JAX_PARTS
        self.scan = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in w
        if self.scan:
            self.depth = w[f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
        else:
            ids = [int(m.group(1)) for k in w
                   for m in [re.match(rf"^{re.escape(prefix)}Transformer/encoderblock_(\d+)/", k)] if m]
            if not ids:
                raise WeightsError("no Transformer/encoderblock_N arrays in the npz")
            self.depth = max(ids) + 1
        self.used = set()

    def get(self, name: str) -> np.ndarray:
        key = self.prefix + name
        if key not in self.w:
            raise WeightsError(f"npz is missing {key!r}")
        self.used.add(key)
        return self.w[key]

    def has(self, name: str) -> bool:
        return self.prefix + name in self.w

    def block(self, i: int, part: str, leaf: str) -> np.ndarray:
        p = self.parts[part.split("/")[0]]
        sub = part.split("/", 1)[1] + "/" if "/" in part else ""
        if self.scan:
            return self.get(f"Transformer/encoderblock/{p}/{sub}{leaf}")[i]
        return self.get(f"Transformer/encoderblock_{i}/{p}/{sub}{leaf}")


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


_UNIT_LEAVES = {f"{conv}/kernel" for conv in ("conv1", "conv2", "conv3")} | {
    f"{gn}/{leaf}" for gn in ("gn1", "gn2", "gn3") for leaf in ("scale", "bias")}
_PROJ_LEAVES = {"conv_proj/kernel", "gn_proj/scale", "gn_proj/bias"}


def _hwio(r: _Reader, name: str) -> torch.Tensor:
    k = r.get(name)
    if k.ndim != 4:
        raise WeightsError(f"hybrid npz: {r.prefix}{name} has shape {k.shape}, "
                           f"expected an HWIO kernel (kh, kw, in, out)")
    return _t(k.transpose(3, 2, 0, 1))


def _gn(r: _Reader, name: str) -> torch.Tensor:
    a = r.get(name)
    if a.ndim == 4 and a.shape[:3] == (1, 1, 1):
        a = a.reshape(-1)
    if a.ndim != 1:
        raise WeightsError(f"hybrid npz: {r.prefix}{name} has shape {a.shape}, expected (C,) or (1, 1, 1, C)")
    return _t(a)


def _hybrid_to_native(w: Mapping[str, np.ndarray], r: _Reader) -> Dict[str, torch.Tensor]:
    """The CNN of an official hybrid npz -> ``patch_embed.backbone.*`` (timm's names).

    Every ``block{s}/unit{u}/...`` name is checked before anything is converted: stages and
    units must be numbered 1..n without gaps, each unit must hold exactly conv1-3 and gn1-3,
    and the first unit of each stage (only it) the conv_proj / gn_proj shortcut.
    """
    pattern = re.compile(rf"^{re.escape(r.prefix)}block(\d+)/unit(\d+)/(.+)$")
    units: Dict[Tuple[int, int], set] = {}
    for k in w:
        m = pattern.match(k)
        if m:
            units.setdefault((int(m.group(1)), int(m.group(2))), set()).add(m.group(3))
    stages = sorted({s for s, _ in units})
    if stages != list(range(1, len(stages) + 1)):
        raise WeightsError(f"hybrid npz: CNN stages are numbered {stages}; expected block1..block{len(stages)}")
    if len(stages) > 4:
        raise WeightsError(f"hybrid npz: {len(stages)} CNN stages; a ResNetV2 has at most 4")
    layers = []
    for s in stages:
        ids = sorted(u for st, u in units if st == s)
        if ids != list(range(1, len(ids) + 1)):
            raise WeightsError(f"hybrid npz: block{s} has units {ids}; expected unit1..unit{len(ids)}")
        layers.append(len(ids))
        for u in ids:
            want = _UNIT_LEAVES | (_PROJ_LEAVES if u == 1 else set())
            have = units[(s, u)]
            if have != want:
                parts = []
                if want - have:
                    parts.append(f"missing {sorted(want - have)}")
                if have - want:
                    parts.append(f"unknown {sorted(have - want)}")
                raise WeightsError(f"hybrid npz: block{s}/unit{u} does not have the ResNetV2 unit layout: "
                                   + "; ".join(parts))
    out: Dict[str, torch.Tensor] = {}
    root = "patch_embed.backbone.stem." if layers else "patch_embed.backbone."
    out[root + "conv.weight"] = _hwio(r, "conv_root/kernel")
    out[root + "norm.weight"] = _gn(r, "gn_root/scale")
    out[root + "norm.bias"] = _gn(r, "gn_root/bias")
    for s, depth in enumerate(layers, start=1):
        for u in range(1, depth + 1):
            src, dst = f"block{s}/unit{u}/", f"patch_embed.backbone.stages.{s - 1}.blocks.{u - 1}."
            for i in (1, 2, 3):
                out[f"{dst}conv{i}.weight"] = _hwio(r, f"{src}conv{i}/kernel")
                out[f"{dst}norm{i}.weight"] = _gn(r, f"{src}gn{i}/scale")
                out[f"{dst}norm{i}.bias"] = _gn(r, f"{src}gn{i}/bias")
            if u == 1:
                out[f"{dst}downsample.conv.weight"] = _hwio(r, f"{src}conv_proj/kernel")
                out[f"{dst}downsample.norm.weight"] = _gn(r, f"{src}gn_proj/scale")
                out[f"{dst}downsample.norm.bias"] = _gn(r, f"{src}gn_proj/bias")
    return out


def to_native(w: Mapping[str, np.ndarray]) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """Official npz -> vitkit state dict, plus facts for config inference."""
    found = detect_layout(w)
    if found is None:
        raise WeightsError("not an official ViT npz: no 'embedding/kernel'")
    layout, prefix = found
    r = _Reader(w, layout, prefix)
    out: Dict[str, torch.Tensor] = {}
    hybrid = r.has("conv_root/kernel")
    if hybrid:
        out.update(_hybrid_to_native(w, r))
    elif any(re.match(rf"^{re.escape(prefix)}(gn_root|block\d+/unit\d+)/", k) for k in w):
        raise WeightsError("npz has ResNet arrays (gn_root or block*/unit*) but no conv_root/kernel: "
                           "not a known hybrid layout")
    kernel = r.get("embedding/kernel")
    if kernel.ndim != 4:
        raise WeightsError(f"embedding/kernel has shape {kernel.shape}, expected (P, P, C, D)")
    out.update(_embeddings_to_native(r, kernel, layout))
    D = kernel.shape[-1]
    heads = None
    for i in range(r.depth):
        block, heads = _block_to_native(r, i, D)
        out.update(block)
    out.update(_top_to_native(r, D))
    for k in w:  # anything not consumed is reported by name, never dropped silently
        if k.startswith(prefix) and k not in r.used and not k.startswith(f"{prefix}Transformer/encoderblock"):
            out[f"unmapped:{k}"] = _t(w[k]) if np.asarray(w[k]).dtype.kind in "fiub" else torch.zeros(0)
    facts = {"layout": layout, "prefix": prefix, "num_heads": heads, "depth": r.depth,
             "pos_has_class_slot": layout == "vit_jax", "hybrid": hybrid,
             "map_heads": r.get("MAPHead_0/MultiHeadDotProductAttention_0/query/kernel").shape[1]
             if r.has("MAPHead_0/probe") else None}
    return out, facts


def _embeddings_to_native(r: _Reader, kernel: np.ndarray, layout: str) -> Dict[str, torch.Tensor]:
    """The patch projection, the class token and the position table (vit_jax's sits under ``Transformer/``)."""
    out = {"patch_embed.proj.weight": _t(kernel.transpose(3, 2, 0, 1)),
           "patch_embed.proj.bias": _t(r.get("embedding/bias"))}
    if r.has("cls"):
        out["cls_token"] = _t(r.get("cls")).reshape(1, 1, -1)
    pos_key = "pos_embedding" if layout == "big_vision" else "Transformer/posembed_input/pos_embedding"
    if r.has(pos_key):
        pos = _t(r.get(pos_key))
        out["pos_embed"] = pos.reshape(1, -1, pos.shape[-1])
    return out


def _block_to_native(r: _Reader, i: int, D: int) -> Tuple[Dict[str, torch.Tensor], int]:
    """Block ``i`` -> ``blocks.i.*`` (the per-head query/key/value kernels fused into ``qkv``), and its heads."""
    b = f"blocks.{i}."
    out: Dict[str, torch.Tensor] = {}
    for part, name in (("ln1", "norm1"), ("ln2", "norm2")):
        out[b + name + ".weight"] = _t(r.block(i, part, "scale"))
        out[b + name + ".bias"] = _t(r.block(i, part, "bias"))
    qkv_w, qkv_b = [], []
    for p in ("query", "key", "value"):
        k = r.block(i, f"mha/{p}", "kernel")  # (D, H, hd)
        heads = k.shape[1]
        qkv_w.append(_t(k.reshape(D, -1)).T)
        qkv_b.append(_t(r.block(i, f"mha/{p}", "bias")).reshape(-1))
    out[b + "attn.qkv.weight"] = torch.cat(qkv_w, dim=0)
    out[b + "attn.qkv.bias"] = torch.cat(qkv_b, dim=0)
    out[b + "attn.proj.weight"] = _t(r.block(i, "mha/out", "kernel").reshape(-1, D)).T
    out[b + "attn.proj.bias"] = _t(r.block(i, "mha/out", "bias"))
    for j, fc in ((0, "fc1"), (1, "fc2")):
        out[f"{b}mlp.{fc}.weight"] = _t(r.block(i, f"mlp/Dense_{j}", "kernel")).T
        out[f"{b}mlp.{fc}.bias"] = _t(r.block(i, f"mlp/Dense_{j}", "bias"))
    return out, heads


def _top_to_native(r: _Reader, D: int) -> Dict[str, torch.Tensor]:
    """What follows the blocks: the final norm, then the pre-logits layer, head and MAP head where there."""
    out = {"norm.weight": _t(r.get("Transformer/encoder_norm/scale")),
           "norm.bias": _t(r.get("Transformer/encoder_norm/bias"))}
    for name, native in (("pre_logits", "pre_logits.fc"), ("head", "head")):
        if r.has(f"{name}/kernel"):
            out[f"{native}.weight"] = _t(r.get(f"{name}/kernel")).T
            out[f"{native}.bias"] = _t(r.get(f"{name}/bias"))
    if r.has("MAPHead_0/probe"):
        out.update(_map_to_native(r, D))
    return out


#: SigLIP's MAP head (big_vision's ``MAPHead``): the probe, one attention, a LayerNorm and an MLP
_MAP = "MAPHead_0/"
_MAP_MHA = _MAP + "MultiHeadDotProductAttention_0/"


def _map_to_native(r: _Reader, D: int) -> Dict[str, torch.Tensor]:
    """big_vision's MAP head -> ``attn_pool.*`` (q from the query kernel, k and v stacked into ``kv``)."""
    out = {"attn_pool.latent": _t(r.get(_MAP + "probe")).reshape(1, 1, -1)}
    kernel = {n: _t(r.get(f"{_MAP_MHA}{n}/kernel").reshape(D, -1)).T for n in ("query", "key", "value")}
    bias = {n: _t(r.get(f"{_MAP_MHA}{n}/bias")).reshape(-1) for n in ("query", "key", "value")}
    out["attn_pool.q.weight"], out["attn_pool.q.bias"] = kernel["query"], bias["query"]
    out["attn_pool.kv.weight"] = torch.cat([kernel["key"], kernel["value"]])
    out["attn_pool.kv.bias"] = torch.cat([bias["key"], bias["value"]])
    out["attn_pool.proj.weight"] = _t(r.get(_MAP_MHA + "out/kernel").reshape(-1, D)).T
    out["attn_pool.proj.bias"] = _t(r.get(_MAP_MHA + "out/bias"))
    out["attn_pool.norm.weight"] = _t(r.get(_MAP + "LayerNorm_0/scale"))
    out["attn_pool.norm.bias"] = _t(r.get(_MAP + "LayerNorm_0/bias"))
    for j, fc in ((0, "fc1"), (1, "fc2")):
        out[f"attn_pool.mlp.{fc}.weight"] = _t(r.get(f"{_MAP}MlpBlock_0/Dense_{j}/kernel")).T
        out[f"attn_pool.mlp.{fc}.bias"] = _t(r.get(f"{_MAP}MlpBlock_0/Dense_{j}/bias"))
    return out


def _map_from_native(sd: Mapping[str, np.ndarray], D: int, heads: int) -> Dict[str, np.ndarray]:
    hd = D // heads
    w = {_MAP + "probe": sd["attn_pool.latent"].reshape(1, 1, D)}
    k, v = np.split(sd["attn_pool.kv.weight"], 2, axis=0)
    kb, vb = np.split(sd["attn_pool.kv.bias"], 2, axis=0)
    for name, weight, bias in (("query", sd["attn_pool.q.weight"], sd["attn_pool.q.bias"]), ("key", k, kb),
                               ("value", v, vb)):
        w[f"{_MAP_MHA}{name}/kernel"] = weight.T.reshape(D, heads, hd)
        w[f"{_MAP_MHA}{name}/bias"] = bias.reshape(heads, hd)
    w[_MAP_MHA + "out/kernel"] = sd["attn_pool.proj.weight"].T.reshape(heads, hd, D)
    w[_MAP_MHA + "out/bias"] = sd["attn_pool.proj.bias"]
    w[_MAP + "LayerNorm_0/scale"], w[_MAP + "LayerNorm_0/bias"] = sd["attn_pool.norm.weight"], sd["attn_pool.norm.bias"]
    for j, fc in ((0, "fc1"), (1, "fc2")):
        w[f"{_MAP}MlpBlock_0/Dense_{j}/kernel"] = sd[f"attn_pool.mlp.{fc}.weight"].T
        w[f"{_MAP}MlpBlock_0/Dense_{j}/bias"] = sd[f"attn_pool.mlp.{fc}.bias"]
    return w


def from_native(model, layout: str = "vit_jax", scan: bool = False) -> Dict[str, np.ndarray]:
    """vitkit model -> official npz arrays (``layout`` 'vit_jax' or 'big_vision')."""
    cfg = model.config
    problems = _export_problems(cfg, layout)
    if problems:
        raise WeightsError("cannot export to the official npz layout: " + "; ".join(problems))
    backbone = getattr(cfg, "backbone", None)
    parts = _BIG_VISION_PARTS if layout == "big_vision" else _VIT_JAX_PARTS
    prefix = "params/" if layout == "big_vision" else ""
    sd = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}
    D, H = cfg.embed_dim, cfg.num_heads
    w: Dict[str, np.ndarray] = {}
    w["embedding/kernel"] = sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0)
    w["embedding/bias"] = sd["patch_embed.proj.bias"]
    if backbone is not None:
        w.update(_hybrid_from_native(sd, backbone["layers"]))
    w.update(_positions_from_native(model, sd, layout))
    blocks = [_block_from_native(sd, f"blocks.{i}.", parts, D, H) for i in range(cfg.depth)]
    w.update(_blocks_in_layout(blocks, layout, scan))
    # a class token read after its own LayerNorm (fc_norm) is the class token of every token normalised: the
    # official encoder_norm, the same function
    final = "fc_norm" if cfg.global_pool == "token" and cfg.use_fc_norm else "norm"
    w["Transformer/encoder_norm/scale"] = sd[f"{final}.weight"]
    w["Transformer/encoder_norm/bias"] = sd[f"{final}.bias"]
    if cfg.global_pool == "map":
        w.update(_map_from_native(sd, D, cfg.map_heads or H))
    if cfg.representation_size:
        w["pre_logits/kernel"] = sd["pre_logits.fc.weight"].T
        w["pre_logits/bias"] = sd["pre_logits.fc.bias"]
    if cfg.num_classes:
        w["head/kernel"] = sd["head.weight"].T
        w["head/bias"] = sd["head.bias"]
    return {prefix + k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}


#: fields the official files hold nothing of and that do not change the function at the stored size
#: (a fixed sin-cos table is stored as a learned one)
_UNSTORED_NEUTRAL = ("name", "pos_embed", "drop_rate", "attn_drop_rate", "drop_path_rate", "pos_drop_rate",
                     "proj_drop_rate", "attn_impl", "dynamic_img_size")


def read_back_losses(arrays: Mapping[str, np.ndarray], model) -> List[str]:
    """What reading ``model``'s exported ``arrays`` back would give otherwise, as vitkit (and the official
    code) reads such a file: the fields no array holds (GELU's form, LayerNorm's eps, the input
    normalisation, the crop, the class names), each as "field VALUE_READ (this model: ITS_VALUE)"."""
    sd, facts = to_native(arrays)
    said = []
    try:
        got = infer_config(sd, facts).to_dict()
    except WeightsError:  # a non-square grid: the official code builds the model from its own config
        size = tuple(model.config.img_size)
        said.append(f"no image size (its position table is no square grid): load it with img_size={size}")
        got = infer_config(sd, facts, img_size=size).to_dict()  # and read at that size, what else it would have
        got["img_size"] = model.config.to_dict()["img_size"]
    want = model.config.to_dict()
    if want["global_pool"] == "token":  # fc_norm on the class token: written as the official encoder_norm
        got["fc_norm"] = want["fc_norm"]
    return said + [f"{k} {json.dumps(got.get(k))} (this model: {json.dumps(want[k])})"
                   for k in want if k not in _UNSTORED_NEUTRAL and want[k] != got.get(k)]


def _export_problems(cfg: Any, layout: str) -> List[str]:
    """What in ``cfg`` the official ``layout`` cannot express (none: it exports)."""
    problems = []
    if cfg.init_values:
        problems.append("the official layout has no LayerScale")
    if cfg.global_pool == "avg" and cfg.use_fc_norm:
        problems.append("the official 'gap' head normalises before pooling; this model "
                        "normalises after (fc_norm); build it with fc_norm=False")
    if not cfg.qkv_bias:
        problems.append("the official attention always has q/k/v biases")
    if getattr(cfg, "distill_token", False):
        problems.append("the official ViT has no distillation token (DeiT's: export as 'timm' or 'hf')")
    elif getattr(cfg, "class_token", False) and cfg.global_pool != "token":
        problems.append(f"the official layout reads the class token whenever it holds one; this model pools "
                        f"{cfg.global_pool!r} beside it (export as 'timm' or 'vitkit')")
    elif cfg.global_pool not in ("token", "avg", "map"):
        problems.append(f"the official heads read the class token, the patches' mean or a MAP head, not "
                        f"{cfg.global_pool!r}")
    if cfg.pos_embed in ("relative", "relative_mlp"):
        problems.append("the official layout has no relative position bias (export as 'vitkit' or 'timm')")
    if cfg.architecture != "vit":
        problems.append(f"the official layout has no {cfg.KIND} models (rotary positions, EVA's layouts)")
    plain = (("mlp", "mlp"), ("norm", "layernorm"), ("block", "pre"), ("final_norm", True))
    later = [f for f in ("reg_tokens", "pre_norm", "qk_norm", "attn_norm", "mlp_norm", "embed_norm", "no_embed_class",
                         "diff_attn")
             if getattr(cfg, f, None)] + [f"{f}={getattr(cfg, f)!r}" for f, ok in plain if getattr(cfg, f) != ok]
    if later:
        problems.append(f"the official ViT has none of {', '.join(later)}")
    if cfg.global_pool == "map" and layout != "big_vision":
        problems.append("the MAP head is big_vision's (export as 'big_vision')")
    if cfg.global_pool == "map" and (cfg.map_mlp_dim not in (None, cfg.mlp_dim) or cfg.pool_include_prefix):
        problems.append("big_vision's MAP head has the blocks' MLP width and pools the patches")
    backbone = getattr(cfg, "backbone", None)
    if backbone is not None and backbone["type"] == "resnetv2" and layout != "vit_jax":
        problems.append("big_vision has no ResNet hybrid layout (export hybrids as 'npz', the vit_jax layout)")
    elif backbone is not None and backbone["type"] != "resnetv2":
        problems.append(f"the official layout has only ResNet hybrids, not a {backbone['type']!r} backbone "
                        f"(export as 'vitkit' or 'timm')")
    return problems


def _positions_from_native(model, sd: Mapping[str, np.ndarray], layout: str) -> Dict[str, np.ndarray]:
    """The class token and the position table: big_vision's without prefix slots, vit_jax's always there."""
    pos = full_table(model)
    pos = None if pos is None else pos.cpu().float().numpy()
    w: Dict[str, np.ndarray] = {}
    if layout == "big_vision":
        if "cls_token" in sd:
            # big_vision adds the class token after the positions: fold its slot in (exact).
            w["cls"] = sd["cls_token"] + (pos[:, :1] if pos is not None else 0)
        if pos is not None:
            w["pos_embedding"] = pos[:, model.num_prefix_tokens:]
    else:
        if "cls_token" in sd:
            w["cls"] = sd["cls_token"]
        if pos is None:
            pos = np.zeros((1, model.num_prefix_tokens + model.patch_embed.num_patches, model.config.embed_dim),
                           np.float32)
        w["Transformer/posembed_input/pos_embedding"] = pos
    return w


def _block_from_native(sd: Mapping[str, np.ndarray], b: str, parts: Mapping[str, str], D: int, H: int
                       ) -> Dict[str, np.ndarray]:
    """One block (state dict prefix ``b``) in the official names, attention kernels per head."""
    hd = D // H
    blk: Dict[str, np.ndarray] = {
        f"{parts['ln1']}/scale": sd[b + "norm1.weight"], f"{parts['ln1']}/bias": sd[b + "norm1.bias"],
        f"{parts['ln2']}/scale": sd[b + "norm2.weight"], f"{parts['ln2']}/bias": sd[b + "norm2.bias"],
    }
    qw = np.split(sd[b + "attn.qkv.weight"], 3, axis=0)
    qb = np.split(sd[b + "attn.qkv.bias"], 3, axis=0)
    for name, wt, bs in zip(("query", "key", "value"), qw, qb):
        blk[f"{parts['mha']}/{name}/kernel"] = wt.T.reshape(D, H, hd)
        blk[f"{parts['mha']}/{name}/bias"] = bs.reshape(H, hd)
    blk[f"{parts['mha']}/out/kernel"] = sd[b + "attn.proj.weight"].T.reshape(H, hd, D)
    blk[f"{parts['mha']}/out/bias"] = sd[b + "attn.proj.bias"]
    for j, fc in ((0, "fc1"), (1, "fc2")):
        blk[f"{parts['mlp']}/Dense_{j}/kernel"] = sd[f"{b}mlp.{fc}.weight"].T
        blk[f"{parts['mlp']}/Dense_{j}/bias"] = sd[f"{b}mlp.{fc}.bias"]
    return blk


def _blocks_in_layout(blocks: List[Dict[str, np.ndarray]], layout: str, scan: bool) -> Dict[str, np.ndarray]:
    """The blocks as ``encoderblock_{i}`` each, or (``scan``, big_vision's) one ``encoderblock`` stacked on depth."""
    w: Dict[str, np.ndarray] = {}
    if scan:
        if layout != "big_vision":
            raise WeightsError("the scan layout exists only in big_vision checkpoints")
        for name in blocks[0]:
            w[f"Transformer/encoderblock/{name}"] = np.stack([blk[name] for blk in blocks])
    else:
        for i, blk in enumerate(blocks):
            for name, arr in blk.items():
                w[f"Transformer/encoderblock_{i}/{name}"] = arr
    return w


def _hybrid_from_native(sd: Mapping[str, np.ndarray], layers) -> Dict[str, np.ndarray]:
    """A hybrid's CNN in the official naming (kernels HWIO, GroupNorm parameters (C,))."""
    def hwio(key: str) -> np.ndarray:
        return sd[key].transpose(2, 3, 1, 0)

    root = "patch_embed.backbone.stem." if layers else "patch_embed.backbone."
    w = {"conv_root/kernel": hwio(root + "conv.weight"),
         "gn_root/scale": sd[root + "norm.weight"], "gn_root/bias": sd[root + "norm.bias"]}
    for s, depth in enumerate(layers):
        for u in range(depth):
            src, dst = f"patch_embed.backbone.stages.{s}.blocks.{u}.", f"block{s + 1}/unit{u + 1}/"
            for i in (1, 2, 3):
                w[f"{dst}conv{i}/kernel"] = hwio(f"{src}conv{i}.weight")
                w[f"{dst}gn{i}/scale"] = sd[f"{src}norm{i}.weight"]
                w[f"{dst}gn{i}/bias"] = sd[f"{src}norm{i}.bias"]
            if u == 0:
                w[f"{dst}conv_proj/kernel"] = hwio(f"{src}downsample.conv.weight")
                w[f"{dst}gn_proj/scale"] = sd[f"{src}downsample.norm.weight"]
                w[f"{dst}gn_proj/bias"] = sd[f"{src}downsample.norm.bias"]
    return w


def infer_config(sd: Mapping[str, torch.Tensor], facts: Mapping[str, Any], **overrides: Any) -> ViTConfig:
    """Architecture of an official checkpoint, as the official code would run it.

    GELU is the tanh approximation (Flax's default, used to train these weights), LayerNorm
    eps 1e-6, inputs in [-1, 1].
    """
    D, C, ph, pw = sd["patch_embed.proj.weight"].shape
    class_token = "cls_token" in sd
    kw: Dict[str, Any] = dict(
        embed_dim=D, in_chans=C, patch_size=(ph, pw), depth=facts["depth"],
        num_heads=facts["num_heads"], mlp_dim=sd["blocks.0.mlp.fc1.weight"].shape[0],
        class_token=class_token,
        global_pool="token" if class_token else "map" if facts.get("map_heads") else "avg",
        fc_norm=None if class_token else False,
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        representation_size=sd["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in sd else None,
        gelu="tanh", norm_eps=1e-6,
        pos_embed="learned" if "pos_embed" in sd else "sincos2d",
    )
    if facts.get("map_heads") and facts["map_heads"] != facts["num_heads"]:
        kw["map_heads"] = facts["map_heads"]
    backbone = infer_backbone(sd) if facts.get("hybrid") else None
    if backbone is not None:
        kw.update(backbone=backbone, in_chans=backbone_in_chans(sd))
    if "pos_embed" in sd:
        n = sd["pos_embed"].shape[1] - (1 if facts["pos_has_class_slot"] and class_token else 0)
        side = int(round(n ** 0.5))
        r = backbone_reduction(backbone) if backbone is not None else 1
        given = overrides.get("img_size")
        if side * side != n and given is not None:  # no square grid: read at the size asked for, if it fits
            try:
                kw["img_size"] = grid_at_size(n, 0, backbone, (ph, pw), to_2tuple(given))["img_size"]
            except ValueError as e:
                raise WeightsError(str(e)) from None
        elif side * side != n:
            raise WeightsError(f"cannot infer the grid of a {n}-slot position embedding; pass img_size=")
        else:
            kw["img_size"] = (side * ph * r, side * pw * r)
        if facts.get("layout") == "vit_jax":  # as timm evaluates these weights: the whole shorter side at 384 px
            kw["crop_pct"] = 1.0 if max(kw["img_size"]) >= 384 else 0.9  # (big_vision's SigLIP: 0.9 at every size)
    kw.update(overrides)
    return ViTConfig(**kw)
