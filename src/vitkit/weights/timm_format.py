"""timm's VisionTransformer layout (and its ResNet hybrids and non-pre-activation ResNetV2).

vitkit's parameter names are timm's, so reading is the identity; what differs is handled
here: timm has no pre-logits layer, no 2D / sincos position embedding modules (those are
written out as the equivalent ``pos_embed`` table) and its hub ``config.json``. A hybrid's
CNN (``patch_embed.backbone.*``) has timm's names too and is read off the shapes.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch

from ..models import VIT_SIZES, ViTConfig, get_model_config, list_models
from ..models.cait import infer_cait_config, is_cait_state_dict
from ..models.convit import infer_convit_config, is_convit_state_dict
from ..models.hybrid import backbone_in_chans, backbone_reduction, infer_backbone, infer_resnet_config
from .io import WeightsError

HEADS_BY_WIDTH = {w: h for (w, _, h, _) in VIT_SIZES.values()}


def full_pos_embed(model) -> Optional[torch.Tensor]:
    """The model's position information as one (1, prefix + N, D) table, timm style.

    Prefix tokens of models without a learned class slot get zeros, which is exactly
    "no position embedding" for them; None when the model uses no position embedding.
    """
    if model.pos_embed is not None:
        return model.pos_embed.detach()
    patches = model.patch_pos_embed(model.patch_embed.grid_size)
    if patches is None:
        return None
    prefix = patches.new_zeros(1, model.num_prefix_tokens, patches.shape[-1])
    return torch.cat([prefix, patches.detach()], dim=1)


def from_native(model) -> Dict[str, torch.Tensor]:
    """vitkit model -> timm ``VisionTransformer`` state dict (same module config in timm)."""
    cfg = model.config
    if getattr(cfg, "architecture", "vit") == "convit":  # timm's ConVit: the same names
        return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if getattr(cfg, "architecture", "vit") in ("resnetv2", "cait"):
        # timm's ResNetV2(preact=False, stem_type='same', conv_layer=StdConv2dSame(eps=1e-8)) and
        # timm's Cait: the same names
        return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if getattr(cfg, "architecture", "vit") != "vit":
        raise WeightsError(f"export to timm is implemented for ViTs, ResNetV2 and CaiT, not {cfg.architecture!r}")
    if cfg.representation_size:
        raise WeightsError("timm's VisionTransformer has no pre-logits (representation) layer; "
                           "export this model as 'vitkit', 'npz' or 'hf' instead")
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
          if not k.startswith(("pos_embed_row", "pos_embed_col"))}
    pos = full_pos_embed(model)
    if pos is not None:
        sd["pos_embed"] = pos.cpu().contiguous()
    return sd


def infer_config(sd: Mapping[str, Any], **overrides: Any) -> ViTConfig:
    """Rebuild the architecture from a timm/vitkit-named state dict alone.

    The number of heads is not stored in a fused qkv matrix: it is taken from the paper's
    table for the standard widths, else width / 64 (override with ``num_heads=``).
    """
    if is_convit_state_dict(sd):  # GPSA layers: heads from the gates, no class slot in pos_embed
        try:
            return infer_convit_config(sd, **overrides)
        except (ValueError, TypeError) as e:
            raise WeightsError(f"ConViT state dict: {e}") from None
    if is_cait_state_dict(sd):
        try:
            return infer_cait_config(sd, **overrides)
        except (ValueError, TypeError) as e:
            raise WeightsError(f"CaiT state dict: {e}") from None
    if "patch_embed.proj.weight" not in sd and "stem.conv.weight" in sd:
        try:
            return infer_resnet_config(sd, **overrides)
        except ValueError as e:
            raise WeightsError(str(e)) from None
    if "patch_embed.proj.weight" not in sd:
        raise WeightsError("not a ViT state dict: 'patch_embed.proj.weight' is missing")
    D, C, ph, pw = sd["patch_embed.proj.weight"].shape
    try:
        backbone = infer_backbone(sd)
    except ValueError as e:
        raise WeightsError(f"hybrid backbone: {e}") from None
    if backbone is not None:
        C = backbone_in_chans(sd)
    block_ids = {int(k.split(".")[1]) for k in sd if k.startswith("blocks.")}
    if not block_ids:
        raise WeightsError("no transformer blocks ('blocks.N.*') in the state dict")
    class_token = "cls_token" in sd
    distill_token = "dist_token" in sd  # DeiT's distilled models
    has_fc_norm = "fc_norm.weight" in sd
    kw: Dict[str, Any] = dict(
        embed_dim=D, in_chans=C, patch_size=(ph, pw), depth=max(block_ids) + 1,
        num_heads=HEADS_BY_WIDTH.get(D, max(1, D // 64)),
        mlp_dim=sd["blocks.0.mlp.fc1.weight"].shape[0],
        class_token=class_token, distill_token=distill_token,
        global_pool="token" if class_token and not has_fc_norm else "avg",
        fc_norm=None if has_fc_norm or class_token else False,
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        representation_size=sd["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in sd else None,
        init_values=1e-5 if "blocks.0.ls1.gamma" in sd else None,
        qkv_bias="blocks.0.attn.qkv.bias" in sd,
        pos_embed="learned" if "pos_embed" in sd else "none",
        backbone=backbone,
    )
    if "pos_embed" in sd:
        n = sd["pos_embed"].shape[1] - int(class_token) - int(distill_token)
        side = int(round(n ** 0.5))
        if side * side != n:
            raise WeightsError(f"cannot infer the image size from a position embedding with {n} "
                               f"patch slots; pass img_size=")
        r = backbone_reduction(backbone) if backbone is not None else 1
        kw["img_size"] = (side * ph * r, side * pw * r)
    kw.update(overrides)
    return ViTConfig(**kw)


#: timm ``model_args`` that mean the same thing in ViTConfig.
_TIMM_ARGS = ("img_size", "patch_size", "in_chans", "class_token", "global_pool", "fc_norm",
              "init_values", "qkv_bias", "dynamic_img_size", "embed_dim", "depth", "num_heads")


def config_from_hub(cfg: Mapping[str, Any], sd: Mapping[str, Any], **overrides: Any) -> ViTConfig:
    """A timm hub ``config.json`` (``architecture``, ``model_args``, ``pretrained_cfg``) -> ViTConfig."""
    arch = str(cfg.get("architecture", ""))
    pre = cfg.get("pretrained_cfg", {}) or {}
    args = cfg.get("model_args", {}) or {}
    unsupported = sorted(k for k in ("no_embed_class", "reg_tokens", "pre_norm", "qk_norm")
                         if args.get(k))
    if unsupported:
        raise WeightsError(f"timm model_args {unsupported} have no vitkit ViT equivalent")
    kw: Dict[str, Any] = {k: args[k] for k in _TIMM_ARGS if k in args and args[k] is not None}
    if "mlp_ratio" in args:
        width = kw.get("embed_dim") or sd["patch_embed.proj.weight"].shape[0]
        kw["mlp_dim"] = int(width * args["mlp_ratio"])
    if "num_classes" in cfg:
        kw["num_classes"] = int(cfg["num_classes"])
    if cfg.get("global_pool") in ("token", "avg"):
        kw["global_pool"] = cfg["global_pool"]
    for key in ("mean", "std", "crop_pct", "interpolation"):
        if key in pre:
            kw[key] = tuple(pre[key]) if isinstance(pre[key], list) else pre[key]
    if "input_size" in pre:
        kw.setdefault("img_size", tuple(pre["input_size"][1:]))
    names = cfg.get("label_names")
    if isinstance(names, dict):
        names = [names.get(str(i), names.get(i)) for i in range(len(names))]
    if isinstance(names, list) and len(names) == kw.get("num_classes", -1) and None not in names:
        kw["label_names"] = [str(n) for n in names]
    kw.update(overrides)
    base = arch.split(".")[0]
    config = get_model_config(base) if base in list_models() else infer_config(sd)
    if not isinstance(config, ViTConfig):  # a ResNet or a CaiT: only the arguments they share apply
        if config.architecture == "convit":  # timm passes the width per head
            if "embed_dim" in args:
                kw["embed_dim"] = int(args["embed_dim"]) * int(args.get("num_heads", config.num_heads))
            kw.update({k: args[k] for k in ("local_up_to_layer", "locality_strength") if k in args})
            kw.pop("mlp_dim", None)
            if "embed_dim" in args or "mlp_ratio" in args:
                ratio = args.get("mlp_ratio", config.mlp_dim / config.embed_dim)
                kw["mlp_dim"] = int(kw.get("embed_dim", config.embed_dim) * ratio)
            kw.update(overrides)
        if config.architecture == "cait":
            kw.update({k: args[k] for k in ("mlp_ratio",) if k in args})
            if "depth_token_only" in args:
                kw["cls_depth"] = int(args["depth_token_only"])
            if "mlp_ratio_token_only" in args:
                kw["cls_mlp_ratio"] = args["mlp_ratio_token_only"]
            kw.update(overrides)
        known = set(config.to_dict())
        kw = {k: v for k, v in kw.items() if k in known}
    return config.replace(**kw)
