"""Gemma 4's own checkpoints (the ``google/gemma-4-*`` repositories transformers loads: ``Gemma4Model``'s vision tower
under ``model.vision_tower.``, or a ``Gemma4VisionModel`` saved alone), read into vitkit's Gemma 4 encoder
(:mod:`vitkit.models.gemma4`) as timm's ``checkpoint_filter_fn`` reads them, and the encoder written back as a
``Gemma4VisionModel`` folder (the ``_enc`` encoder: the soft tokens; a classifier has no transformers class).

- transformers' names are timm's but for ``patch_embedder.`` (timm's ``patch_embed.``), ``encoder.layers.N.``
  (``blocks.N.``), ``self_attn`` (``attn``) and the four norms (``input_layernorm``, ``post_attention_layernorm``,
  ``pre_feedforward_layernorm``, ``post_feedforward_layernorm``: ``norm1`` to ``norm4``).
- Every tensor beside the tower (the language model's, the audio tower's, ``embed_vision``: the projection of the
  soft tokens into the language model) is left out, and a folder's shards that hold none of the tower are not read.
- The architecture is read off the shapes: the heads' width off ``q_norm``, the key and value heads off ``k_proj``,
  the clamps and the standardisation by their tensors; the rotary base and the soft tokens' blocks off the
  ``vision_config`` where there is one (every released tower's: 100 and 3 x 3). It is read as the ``_enc`` encoder:
  its outputs are the soft tokens transformers' tower gives.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from ..models import get_model_config
from .io import WeightsError
from .names import depth_of

PREFIXES = ("model.vision_tower.", "vision_tower.", "")
_RENAMES = (("patch_embedder.", "patch_embed."), ("encoder.layers.", "blocks."), (".self_attn.", ".attn."),
            (".input_layernorm.", ".norm1."), (".post_attention_layernorm.", ".norm2."),
            (".pre_feedforward_layernorm.", ".norm3."), (".post_feedforward_layernorm.", ".norm4."))


def _prefix(keys) -> Optional[str]:
    """The prefix the tower's tensors are under, where these are transformers' Gemma 4 names."""
    keys = set(keys)
    return next((p for p in PREFIXES if p + "patch_embedder.input_proj.weight" in keys), None)


def detect(keys) -> bool:
    """Whether a state dict's names are transformers' Gemma 4 vision tower's."""
    return _prefix(keys) is not None


def tower_names(names) -> list:
    """Of a checkpoint's tensor names, its tower's (what :func:`to_native` reads)."""
    prefix = _prefix(names)
    return [n for n in names if n.startswith(prefix) and not _outside(n[len(prefix):])]


def _outside(name: str) -> bool:
    """Whether a name (under the tower's prefix) is none of the tower's: a bare tower's file holds nothing else."""
    return not name.startswith(("patch_embedder.", "encoder.", "std_bias", "std_scale"))


def to_native(sd: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """transformers' names -> vitkit's (timm's)."""
    prefix, out = _prefix(sd), {}
    for key, value in sd.items():
        if not key.startswith(prefix) or _outside(key[len(prefix):]):
            continue
        key = key[len(prefix):]
        for theirs, ours in _RENAMES:
            key = key.replace(theirs, ours)
        out[key] = value
    return out


def vision_config(config_json: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """What a Gemma 4 folder's config.json (``vision_config``, or a ``Gemma4VisionModel``'s own) says that the
    tensors do not: the norms' eps, the rotary base, the soft tokens' blocks (before, a folder's own base or blocks
    were left out for the released towers' 100 and 3); an activation, a rotary kind or a bias vitkit's tower does
    not have is refused."""
    cj = config_json or {}
    vision = cj.get("vision_config") if isinstance(cj.get("vision_config"), Mapping) else cj
    act = vision.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise WeightsError(f"Gemma 4's vision_config hidden_activation {act!r}: vitkit's tower gates with GELU-tanh")
    if vision.get("attention_bias"):
        raise WeightsError("Gemma 4's vision_config attention_bias true: vitkit's tower's projections have no bias")
    rope = vision.get("rope_parameters") or {}
    if not isinstance(rope, Mapping) or rope.get("rope_type", "axial") not in ("axial", "default"):
        raise WeightsError(f"Gemma 4's vision_config rope_parameters {rope!r}: vitkit's tower turns each head's "
                           f"halves by the column and the row (rope_type 'axial')")
    out = {"norm_eps": vision.get("rms_norm_eps"), "rope_theta": rope.get("rope_theta"),
           "pool_kernel": vision.get("pooling_kernel_size")}
    return {k: v for k, v in out.items() if v is not None}  # (a value of the wrong kind: the config refuses it)


def export_problems(config: Any) -> List[str]:
    """What keeps a vitkit Gemma 4 model from transformers' ``Gemma4VisionModel`` (empty: it can be written)."""
    problems = []
    if getattr(config, "architecture", None) != "gemma4":
        return [f"architecture {getattr(config, 'architecture', None)!r} (Gemma4VisionModel is Gemma 4's tower)"]
    if config.num_classes or config.global_pool != "soft":
        problems.append("a classifier (Gemma4VisionModel gives the soft tokens: export the _enc encoder, or as "
                        "'timm')")
    if config.in_chans != 3:
        problems.append(f"in_chans={config.in_chans} (its patch projection reads 3 channels)")
    if config.patch_size[0] != config.patch_size[1]:
        problems.append(f"patch_size {tuple(config.patch_size)} (its patches are square)")
    return problems


def from_native(model: nn.Module) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """A vitkit Gemma 4 encoder -> (transformers' ``Gemma4VisionModel`` state dict, its config.json)."""
    c = model.config
    if problems := export_problems(c):
        raise WeightsError(f"no Hugging Face class expresses this model: Gemma4VisionModel cannot hold "
                           f"{'; '.join(problems)}")
    sd = {}
    for key, value in model.state_dict().items():
        for theirs, ours in _RENAMES:
            key = key.replace(ours, theirs)
        sd[key] = value.detach().cpu().contiguous()
    heads = c.num_heads
    hf = dict(model_type="gemma4_vision", architectures=["Gemma4VisionModel"], hidden_size=c.embed_dim,
              intermediate_size=c.mlp_dim, num_hidden_layers=c.depth, num_attention_heads=heads,
              num_key_value_heads=c.kv_heads or heads, head_dim=c.embed_dim // heads,
              hidden_activation="gelu_pytorch_tanh", rms_norm_eps=c.norm_eps, attention_bias=False,
              rope_parameters={"rope_theta": float(c.rope_theta), "rope_type": "axial"},
              pooling_kernel_size=c.pool_kernel, patch_size=c.patch_size[0], position_embedding_size=c.table_size,
              use_clipped_linears=c.clipped, standardize=c.standardize)
    return sd, hf


def infer_config(sd: Mapping[str, Any], **overrides: Any):
    """The architecture of a Gemma 4 checkpoint (``sd``: its own names; the language model's may be there)."""
    tower = to_native(sd)
    proj, table = tower["patch_embed.input_proj.weight"], tower["patch_embed.position_embedding_table"]
    width, flat = (int(s) for s in proj.shape)
    head = int(tower["blocks.0.attn.q_norm.weight"].shape[0])
    side = int(round((flat / 3) ** 0.5))
    if 3 * side * side != flat:
        raise WeightsError(f"Gemma 4's patch projection reads {flat} values: no square patch of 3 channels")
    kw: Dict[str, Any] = dict(
        embed_dim=width, depth=depth_of(tower, "blocks."), num_heads=int(tower["blocks.0.attn.q_proj.linear.weight"]
                                                                         .shape[0]) // head,
        kv_heads=int(tower["blocks.0.attn.k_proj.linear.weight"].shape[0]) // head, patch_size=side,
        mlp_dim=int(tower["blocks.0.mlp.gate_proj.linear.weight"].shape[0]), table_size=int(table.shape[1]),
        clipped="blocks.0.attn.q_proj.input_min" in tower, standardize="std_bias" in tower, name=None)
    if kw["kv_heads"] == kw["num_heads"]:
        kw["kv_heads"] = None
    kw.update(overrides)
    base = get_model_config("gemma4_vit_570m_enc")
    k, slots = kw.get("pool_kernel", base.pool_kernel), kw["table_size"]
    if "img_size" not in overrides and type(k) is int and 0 < k <= slots < base.img_size[0] // side:
        kw["img_size"] = (slots - slots % k) * side  # (a table smaller than the released: its largest grid of blocks)
    return base.replace(**kw)


def left_out(sd: Mapping[str, Any]) -> str:
    """What reading the tower leaves out of the file, as ``vitkit info`` says it."""
    prefix = _prefix(sd)
    others = sum(not k.startswith(prefix) or _outside(k[len(prefix):]) for k in sd)
    return f"{others:,} tensors of its language model and projections" if others else ""


__all__ = ["detect", "vision_config", "tower_names", "to_native", "infer_config", "left_out", "export_problems",
           "from_native"]
