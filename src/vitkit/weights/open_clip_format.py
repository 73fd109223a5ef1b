"""open_clip's checkpoints of CLIP image towers (``visual.*``), read into vitkit's ViT.

open_clip keeps the image tower under ``visual.``: ``conv1`` (the patch projection, no bias),
``class_embedding`` (D,), ``positional_embedding`` (1 + patches, D), ``ln_pre``, the blocks as
``transformer.resblocks.N.{ln_1, attn.in_proj_weight / in_proj_bias (q, k, v stacked), attn.out_proj,
ln_2, mlp.c_fc, mlp.c_proj}`` (``ls_1.gamma`` / ``ls_2.gamma`` with LayerScale), ``ln_post`` and ``proj``
(D, embed: the projection into the joint space, used as ``pooled @ proj``). The text tower beside it
(``transformer.*``, ``token_embedding``, ``ln_final``, ``text_projection``, ``logit_scale``) is left out.

The tensors do not hold the activation: OpenAI's weights were trained with QuickGELU, LAION's with
GELU. A hub folder's ``open_clip_config.json`` says which (``model_cfg.quick_gelu``) and gives the
preprocessing; a bare file is read with exact GELU and a :class:`~vitkit.weights.guesses.GuessWarning`
says so (``gelu='quick'`` for OpenAI's). Heads are width / ``head_width`` (64, or 80-112 for the
widths of ViT-H/g/bigG/e, as open_clip's configs set it).
The readout is the class token, or the patch tokens' mean (``pool_type='avg'``) with ``ln_post`` before or after
it (``final_ln_after_pool``; CLIPA's towers, which have no ``ln_pre``), or CoCa's attentional pooler
(:mod:`vitkit.models.coca`: its first query, ``ln_post`` after it).

The towers open_clip has timm build (SigLIP and SigLIP 2, EVA-02, Perception Encoder: ``timm_model_name`` in
``vision_cfg``) hold timm's model under ``visual.trunk.`` and a linear projection beside it
(``visual.head.proj``, where ``timm_proj='linear'``): read as the timm state dict and hub config they stand for
(:func:`timm_tower`, :func:`timm_tower_config`).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from ..models import CoCaConfig, ViTConfig
from ..models.coca import check_open_clip_pool
from ..models.config_base import per_channel
from ..models.vit_names import CLIP_MEAN, CLIP_STD
from .io import WeightsError
from .names import depth_of, rename

#: open_clip's default width of one head
HEAD_WIDTH = 64
#: open_clip's configs that set ``head_width`` (ViT-H, ViT-g, ViT-bigG, ViT-e: 16 heads each), by tower width:
#: a bare file of one of them read at 64 per head computed another function (ViT-H-14: 20 heads for 16)
WIDE_HEAD_WIDTHS = {1280: 80, 1408: 88, 1664: 104, 1792: 112}
#: the other ViT tower widths of open_clip's configs (open_clip 3.3), all at 64 per head (64, 80, 96 and 128 are its
#: ResNet towers' widths: a ViT of those is read with a note)
PLAIN_WIDTHS = (384, 512, 768, 896, 1024)
#: open_clip's preprocess_cfg resize_mode -> vitkit's crop_mode (its "longest" pads to a square, which vitkit does
#: not: read as "center" and said, ``guesses.guesses``)
RESIZE_MODES = {"shortest": "center", "squash": "squash"}
#: the file names of open_clip's hub repositories, after vitkit's own in a folder
WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
CONFIG_FILE = "open_clip_config.json"

_RULES = [
    (r"visual\.conv1\.weight", "patch_embed.proj.weight"),
    (r"visual\.ln_pre\.(weight|bias)", r"norm_pre.\1"),
    (r"visual\.transformer\.resblocks\.(\d+)\.ln_(1|2)\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (r"visual\.transformer\.resblocks\.(\d+)\.attn\.in_proj_weight", r"blocks.\1.attn.qkv.weight"),
    (r"visual\.transformer\.resblocks\.(\d+)\.attn\.in_proj_bias", r"blocks.\1.attn.qkv.bias"),
    (r"visual\.transformer\.resblocks\.(\d+)\.attn\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"visual\.transformer\.resblocks\.(\d+)\.mlp\.c_fc\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),
    (r"visual\.transformer\.resblocks\.(\d+)\.mlp\.c_proj\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"visual\.transformer\.resblocks\.(\d+)\.ls_(1|2)\.gamma", r"blocks.\1.ls\2.gamma"),
]


#: open_clip's block options no config of its pre-trained models sets, by the tensors they add (open_clip's
#: ``ln_attn`` normalises after the output projection, where timm's attention norm sits before it)
_UNREAD_OPTIONS = ((r"\.attn\.ln_[qk]\.", "qk_norm"), (r"\.mlp\.ln\.", "scale_fc"), (r"\.ln_attn\.", "scale_attn"),
                   (r"\.attn\.head_scale$", "scale_heads"))


def is_open_clip(keys) -> bool:
    keys = set(keys)
    return "visual.conv1.weight" in keys and "visual.class_embedding" in keys


#: what an open_clip checkpoint holds beside its image tower: the text tower (CLIP's own, or a Hugging Face
#: one under ``text.``), CoCa's captioning decoder and the contrastive scale and bias; anything else is another
#: layout's
TEXT_PARTS = ("transformer.", "token_embedding.", "ln_final.", "text.", "text_decoder.", "text_projection",
              "positional_embedding", "logit_scale", "logit_bias", "attn_mask")


def _tower_tensors(sd: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """The image tower's tensors (``visual.*``): the text tower and the logit scale are dropped; tensors of
    another layout beside them (a file mixing two models) are refused by name, never dropped unsaid."""
    other = sorted(k for k in sd if not k.startswith(("visual.", *TEXT_PARTS)))
    if other:
        raise WeightsError(f"the file holds open_clip's image tower (visual.*) and tensors of another layout "
                           f"({', '.join(other[:4])}{' ...' if len(other) > 4 else ''}): a checkpoint that mixes "
                           f"two models is not read; save each on its own")
    return {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in sd.items()
            if k.startswith("visual.")}


#: open_clip's towers that timm builds (SigLIP and SigLIP 2, EVA-02 CLIP, ...): timm's model under this prefix,
#: a linear projection (``timm_proj='linear'``) beside it as ``visual.head.proj``
TRUNK = "visual.trunk."


def is_timm_tower(keys) -> bool:
    return any(k.startswith(TRUNK) for k in keys)


def timm_tower(sd: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    """timm's state dict of an open_clip tower built by timm: the trunk's tensors, and its linear projection as
    the head (no bias where open_clip's has none). An MLP projection or an attention pool beside it is refused."""
    tower = _tower_tensors(sd)
    out = {k[len(TRUNK):]: v for k, v in tower.items() if k.startswith(TRUNK)}
    head = {k: v for k, v in tower.items() if not k.startswith(TRUNK)}
    proj, bias = head.pop("visual.head.proj.weight", None), head.pop("visual.head.proj.bias", None)
    if head:
        names = ", ".join(sorted(head)[:3])
        raise WeightsError(f"an open_clip tower whose timm trunk has another head beside it ({names}: an MLP "
                           f"projection or an attention pool) is not one vitkit reads")
    if proj is not None:
        if "head.weight" in out:
            raise WeightsError("an open_clip tower with both a timm head and a projection (visual.head.proj) is not "
                               "one open_clip builds")
        out["head.weight"], out["head.bias"] = proj, bias if bias is not None else proj.new_zeros(proj.shape[0])
    return out


def timm_tower_config(open_clip_config: Optional[Mapping[str, Any]], sd: Mapping[str, Any]
                      ) -> Optional[Dict[str, Any]]:
    """The timm hub ``config.json`` a timm-built tower's ``open_clip_config.json`` stands for (None: it names no
    timm model): the architecture, its pooling (``timm_pool``), the projection's width as the classes and
    open_clip's preprocessing (its transform resizes and crops to the whole input: crop 1.0)."""
    vision = _vision_cfg(open_clip_config) or {}
    name = vision.get("timm_model_name")
    if not isinstance(name, str) or not name:
        return None
    pool, proj = vision.get("timm_pool", "avg"), vision.get("timm_proj", "linear")
    if proj == "mlp" or pool in ("abs_attn", "rot_attn"):
        raise WeightsError(f"an open_clip tower of {name} with timm_pool={pool!r}, timm_proj={proj!r} (a head "
                           f"beside timm's model) is not one vitkit reads")
    head = sd.get("head.weight")
    pre = (open_clip_config or {}).get("preprocess_cfg", {})
    pre = pre if isinstance(pre, Mapping) else {}
    size = vision.get("image_size")
    pretrained = {"mean": list(_numbers("mean", pre.get("mean", CLIP_MEAN))),
                  "std": list(_numbers("std", pre.get("std", CLIP_STD))),
                  "interpolation": pre.get("interpolation", "bicubic"), "crop_pct": 1.0,
                  "crop_mode": RESIZE_MODES.get(_resize_mode(open_clip_config), "center")}
    if isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) == 2):
        pretrained["input_size"] = [3, *((size, size) if isinstance(size, int) else size)]
    args: Dict[str, Any] = {"global_pool": pool} if pool else {}
    if pool and proj == "linear":  # timm's model built at its own pooling, then pooled another way: its norms stay
        args["use_fc_norm" if _eva(name) else "fc_norm"] = "fc_norm.weight" in sd  # (timm's Eva names it so)
    return {"architecture": name, "num_classes": int(head.shape[0]) if head is not None else 0,
            "model_args": args, "pretrained_cfg": pretrained}


def _eva(name: str) -> bool:
    """timm's architecture ``name`` is one of its Eva family (EVA-02, Perception Encoder, ...)."""
    from ..models import family_of, get_model_config
    from .timm_format import is_known_architecture

    base = name.split(".")[0]
    return is_known_architecture(base) and family_of(get_model_config(base)).name == "eva"


def bare_trunk_defaults(sd: Mapping[str, Any], projection: bool) -> Dict[str, Any]:
    """What open_clip builds a timm-built tower with where no ``open_clip_config.json`` says (``sd``: timm's
    names): its head is an embedding's projection, not classes; a linear ``projection`` beside timm's model
    pools as vision_cfg's default ``timm_pool``, 'avg' after timm's own norm; CLIP's normalisation, the whole
    image resized. A bare file was read as a classifier of the class token, 1.4 off ``encode_image``."""
    out: Dict[str, Any] = {"mean": CLIP_MEAN, "std": CLIP_STD, "interpolation": "bicubic", "crop_pct": 1.0}
    if projection:
        out.update(global_pool="avg", fc_norm="fc_norm.weight" in sd)
    if "head.weight" in sd:
        out["head_kind"] = "projection"
    return out


def readout(sd: Mapping[str, Any], open_clip_config: Optional[Mapping[str, Any]] = None) -> Tuple[str, Optional[bool]]:
    """(global_pool, fc_norm) of a tower: its vision_cfg's ``pool_type`` and ``final_ln_after_pool`` (ln_post
    after the pooling), or for a bare file the class token, but CLIPA's patch mean normalised after it where
    ``ln_pre`` is missing (only CLIPA's configs leave it out, and all of them pool so)."""
    vision = _vision_cfg(open_clip_config)
    if vision is not None:
        pool, after = vision.get("pool_type", "tok"), bool(vision.get("final_ln_after_pool", False))
    elif "visual.ln_pre.weight" not in sd:
        pool, after = "avg", True
    else:
        pool, after = "tok", False
    if pool not in ("tok", "avg"):
        raise WeightsError(f"an open_clip tower with pool_type {pool!r} (its tokens, no pooled output) is not one "
                           f"vitkit reads")
    return ("avg", after) if pool == "avg" else ("token", None)  # ln_post after a class token's pick is the same


def _vision_cfg(open_clip_config: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    _check_shape(open_clip_config)
    model_cfg = (open_clip_config or {}).get("model_cfg")
    vision = model_cfg.get("vision_cfg") if isinstance(model_cfg, Mapping) else None
    return vision if isinstance(vision, Mapping) else None


def _check_shape(open_clip_config: Any) -> None:
    """``open_clip_config.json`` as open_clip writes it: an object whose model_cfg, its vision_cfg and the
    preprocess_cfg are objects (a list or a number in their place was an AttributeError, or ignored)."""
    if open_clip_config is None:
        return
    if not isinstance(open_clip_config, Mapping):
        raise WeightsError(f"{CONFIG_FILE} must hold an object of fields, not a {type(open_clip_config).__name__}")
    model_cfg = open_clip_config.get("model_cfg")
    for name, value in (("model_cfg", model_cfg), ("preprocess_cfg", open_clip_config.get("preprocess_cfg")),
                        ("model_cfg's vision_cfg", model_cfg.get("vision_cfg") if isinstance(model_cfg, Mapping)
                         else None)):
        if value is not None and not isinstance(value, Mapping):
            raise WeightsError(f"{CONFIG_FILE}: {name} must be an object of fields, not {value!r}")


def to_native(sd: Mapping[str, Any], open_clip_config: Optional[Mapping[str, Any]] = None) -> Dict[str, torch.Tensor]:
    """open_clip names -> vitkit's (``ln_post`` where :func:`readout` places it); the text tower is dropped,
    anything else of ``visual.`` unmapped; tensors of another layout beside the tower (a file mixing two models)
    are refused by name, never dropped unsaid."""
    tower = _tower_tensors(sd)
    pooler = {k: tower.pop(k) for k in list(tower) if k.startswith("visual.attn_pool.")}
    after = readout(tower, open_clip_config)[1] or bool(pooler)  # CoCa's ln_post follows its pooler
    cls, pos, proj = (tower.pop(f"visual.{k}", None) for k in ("class_embedding", "positional_embedding", "proj"))
    post = {part: tower.pop(f"visual.ln_post.{part}") for part in ("weight", "bias")
            if f"visual.ln_post.{part}" in tower}
    out = rename(tower, _RULES)
    out.update({f"{'fc_norm' if after else 'norm'}.{part}": v for part, v in post.items()})
    if cls is not None:
        out["cls_token"] = cls.reshape(1, 1, -1)
    if pos is not None:
        out["pos_embed"] = pos.unsqueeze(0)
    if proj is not None:
        out["head.weight"], out["head.bias"] = proj.t().contiguous(), proj.new_zeros(proj.shape[1])
    out.update(_pooler(pooler))
    return out


def _pooler(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """CoCa's ``AttentionalPooler`` (``nn.MultiheadAttention``: separate q/k/v weights where the tokens' width is
    not the queries', one ``in_proj_weight`` where it is; ``in_proj_bias`` always) in vitkit's names."""
    out: Dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        name = key[len("visual.attn_pool."):]
        if name == "attn.in_proj_weight":
            out.update(zip(("attn_pool.q.weight", "attn_pool.k.weight", "attn_pool.v.weight"), value.chunk(3)))
        elif name == "attn.in_proj_bias":
            out.update(zip(("attn_pool.q.bias", "attn_pool.k.bias", "attn_pool.v.bias"), value.chunk(3)))
        elif (m := re.fullmatch(r"attn\.([qkv])_proj_weight", name)):
            out[f"attn_pool.{m.group(1)}.weight"] = value
        else:  # query, ln_q, ln_k, and out_proj -> proj (anything else stays unmapped, and is named)
            out[f"attn_pool.{name.replace('attn.out_proj.', 'proj.')}"] = value
    return out


def _resize_mode(open_clip_config: Optional[Mapping[str, Any]]) -> str:
    """The preprocess_cfg's resize_mode as text (open_clip's default, "shortest", where it says none)."""
    pre = (open_clip_config or {}).get("preprocess_cfg")
    return str(pre.get("resize_mode", "shortest")) if isinstance(pre, Mapping) else "shortest"


def unread_resize_mode(open_clip_config: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The preprocess_cfg's resize_mode where vitkit has no equivalent (open_clip's "longest"), else None."""
    mode = _resize_mode(open_clip_config)
    return None if mode in RESIZE_MODES else mode


def infer_config(sd: Mapping[str, Any], open_clip_config: Optional[Mapping[str, Any]] = None,
                 **overrides: Any) -> ViTConfig:
    """The tower's architecture off its shapes (and ``open_clip_config.json`` where given)."""
    options = sorted({option for k in sd for pattern, option in _UNREAD_OPTIONS if re.search(pattern, k)})
    if options:
        raise WeightsError(f"an open_clip tower built with {', '.join(options)} (no open_clip config of a "
                           f"pre-trained model sets it) is not one vitkit reads")
    conv, pos = sd["visual.conv1.weight"], sd["visual.positional_embedding"]
    width, chans, ph, pw = (int(s) for s in conv.shape)
    depth = depth_of(sd, "visual.transformer.resblocks.")
    patches = int(pos.shape[0]) - 1
    vision = _vision_cfg(open_clip_config) or {}
    model_cfg = (open_clip_config or {}).get("model_cfg") or {}
    coca = any(k.startswith("visual.attn_pool.") for k in sd)
    if vision.get("attentional_pool") and (why := check_open_clip_pool(vision) or (
            None if coca else "its vision_cfg has an attentional_pool, its weights none")):
        raise WeightsError(why)
    if any(k.startswith("visual.attn_pool_contrastive.") for k in sd):
        raise WeightsError(check_open_clip_pool({"attentional_pool": "parallel"}))
    mlp = int(sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0])
    _check_vision_cfg(vision, width, depth, (ph, pw), mlp)
    size = vision.get("image_size")  # the config's size (a non-square one was read as the nearest square)
    if isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) == 2):
        h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        if (h // ph) * (w // pw) != patches:
            raise WeightsError(f"{CONFIG_FILE} says image_size {h}x{w} ({h // ph}x{w // pw} patches), its "
                               f"positional_embedding holds {patches} patch slots: the config and the weights disagree")
        grid = (h // ph, w // pw)
    else:
        side = int(round(patches ** 0.5))
        if side * side != patches:
            raise WeightsError(f"open_clip positional_embedding of {patches} patch slots is not a square grid; "
                               f"pass img_size=")
        grid = (side, side)
    norm_kwargs = vision.get("norm_kwargs") or {}
    act_kwargs = vision.get("act_kwargs") or {}
    if set(act_kwargs) - {"approximate"} or act_kwargs.get("approximate", "none") not in ("none", "tanh"):
        raise WeightsError(f"an open_clip vision_cfg with act_kwargs {act_kwargs} is not one vitkit reads")
    pool, after = readout(sd, open_clip_config)
    kw: Dict[str, Any] = dict(
        img_size=(grid[0] * ph, grid[1] * pw), patch_size=(ph, pw), in_chans=chans, embed_dim=width, depth=depth,
        num_heads=width // int(vision.get("head_width", head_width(width))), global_pool=pool, fc_norm=after,
        mlp_dim=mlp,
        pre_norm="visual.ln_pre.weight" in sd, patch_bias=False, norm_eps=float(norm_kwargs.get("eps", 1e-5)),
        init_values=1.0 if "visual.transformer.resblocks.0.ls_1.gamma" in sd else None,
        num_classes=int(sd["visual.proj"].shape[1]) if "visual.proj" in sd else 0, head_kind="projection",
        gelu="quick" if model_cfg.get("quick_gelu") else "tanh" if act_kwargs.get("approximate") == "tanh" else
        "exact", mean=CLIP_MEAN, std=CLIP_STD, crop_pct=1.0)
    kw.update(_preprocessing(open_clip_config))
    if coca:
        kw.update(_coca_fields(sd, vision))
    kw.update(overrides)
    try:
        return (CoCaConfig if coca else ViTConfig)(**kw)
    except ValueError as e:
        raise WeightsError(f"open_clip tower: {e}") from None


def _preprocessing(open_clip_config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The config fields its preprocess_cfg gives: mean, std, interpolation and crop mode."""
    pre = (open_clip_config or {}).get("preprocess_cfg", {})
    kw: Dict[str, Any] = {}
    if isinstance(pre, Mapping):
        for key in ("mean", "std"):
            if key in pre:
                kw[key] = _numbers(key, pre[key])
        if pre.get("interpolation") in ("bicubic", "bilinear"):
            kw["interpolation"] = pre["interpolation"]
        kw["crop_mode"] = RESIZE_MODES.get(_resize_mode(open_clip_config), "center")  # else: a GuessWarning
    return kw


def _coca_fields(sd: Mapping[str, Any], vision: Mapping[str, Any]) -> Dict[str, Any]:
    """CoCa's readout: the attentional pooler's first query, ln_post after it (open_clip's only CoCa readout)."""
    if vision.get("pool_type", "tok") != "tok":
        raise WeightsError(f"an open_clip CoCa tower with pool_type {vision['pool_type']!r} (the mean of its "
                           f"pooler's other queries) is not one vitkit reads")
    queries, dim = (int(s) for s in sd["visual.attn_pool.query"].shape)
    return dict(global_pool="coca", fc_norm=None, pool_include_prefix=True, coca_dim=dim, coca_queries=queries,
                coca_heads=int(vision.get("attn_pooler_heads", 8)))


def _check_vision_cfg(vision: Mapping[str, Any], width: int, depth: int, patch: Tuple[int, int], mlp: int) -> None:
    """The folder's vision_cfg against the tensors: a config of another tower (its activation and head width then
    wrong for these weights, 0.05 off) is refused naming what disagrees; a malformed field in one line."""
    said = {"width": width, "layers": depth, "patch_size": patch[0] if patch[0] == patch[1] else list(patch)}
    wrong = [f"{key} {vision[key]!r} (the tensors: {value!r})" for key, value in said.items()
             if key in vision and vision[key] != value and not (key == "patch_size" and list(patch) == vision[key])]
    ratio = vision.get("mlp_ratio")
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and int(width * ratio) != mlp:
        wrong.append(f"mlp_ratio {ratio!r} (the tensors: {mlp / width:g})")
    if wrong:
        raise WeightsError(f"{CONFIG_FILE} describes another tower than its weights: {'; '.join(wrong)}")
    heads = vision.get("head_width")
    if heads is not None and (not isinstance(heads, int) or isinstance(heads, bool) or heads <= 0 or width % heads):
        raise WeightsError(f"{CONFIG_FILE}: vision_cfg's head_width must be a positive integer dividing the width "
                           f"{width}, got {heads!r}")


def head_width(width: int) -> int:
    """The width of one head of an open_clip tower whose config is not at hand (open_clip's own configs')."""
    return WIDE_HEAD_WIDTHS.get(width, HEAD_WIDTH)


def heads_known(width: int) -> bool:
    """Whether open_clip's own configs of this width all agree on its head width."""
    return width in WIDE_HEAD_WIDTHS or width in PLAIN_WIDTHS


def _numbers(key: str, value: Any) -> tuple:
    """A ``preprocess_cfg`` mean or std as numbers, one number spread to the three channels as open_clip's
    transform does (one line naming the file where it holds none)."""
    numbers = per_channel(value)
    if numbers is None:
        raise WeightsError(f"{CONFIG_FILE}: preprocess_cfg's {key} must be a list of numbers or one, got {value!r}")
    return numbers


__all__ = ["is_open_clip", "is_timm_tower", "timm_tower", "timm_tower_config", "to_native", "infer_config",
           "WEIGHT_FILES", "CONFIG_FILE", "HEAD_WIDTH"]
