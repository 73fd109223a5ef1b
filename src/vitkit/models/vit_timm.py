"""The ViT family's side of timm's format: its state dict and config written as timm's ``VisionTransformer``
would have them, and timm's ``model_args`` read as ViTConfig fields. The family description
(:data:`vitkit.models.vit.FAMILY`) hands these to the weights package."""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch

from . import positions
from .base import TokenModel
from .config_base import TokenConfig


def vit_to_timm(model: TokenModel) -> Dict[str, torch.Tensor]:
    """vitkit ViT -> timm ``VisionTransformer`` state dict (the same module config in timm):
    2D and sine-cosine positions are written as the equivalent ``pos_embed`` table."""
    if model.config.representation_size:
        raise ValueError("timm's VisionTransformer has no pre-logits (representation) layer; "
                         "export this model as 'vitkit', 'npz' or 'hf' instead")
    if model.config.global_pool == "token_avg":
        raise ValueError("timm's VisionTransformer has no pooling of the class token beside the patches' mean "
                         "(global_pool='token_avg'); export this model as 'vitkit' or 'hf' instead")
    if getattr(model.config, "distill_token", False) and not model.config.distill_head:
        raise ValueError("timm's distilled DeiT has two heads, where this model reads its class token alone "
                         "(distill_head=False, transformers' DeiTForImageClassification); export it as 'vitkit' or "
                         "'hf' instead")
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
          if not k.startswith(positions.PARAMETER_NAMES)}
    pos = positions.full_table(model)
    if pos is not None:
        sd["pos_embed"] = pos.cpu().contiguous()
    weight = sd.get("patch_embed.proj.weight")
    if _timm_adds_patch_bias(model.config) and weight is not None:  # timm's patch projection has a bias unless
        sd["patch_embed.proj.bias"] = weight.new_zeros(weight.shape[0])  # pre-norm: CLIPA's none is a zero one
    return sd


def _timm_adds_patch_bias(config: TokenConfig) -> bool:
    """A patch projection without a bias before no pre-norm (open_clip's CLIPA towers), which timm's
    VisionTransformer cannot build (its bias is ``not pre_norm``): written as a zero bias, the same function."""
    return getattr(config, "patch_bias", None) is False and not getattr(config, "pre_norm", False)


def vit_timm_config(config: TokenConfig) -> Dict[str, Any]:
    """The config of ``vit_to_timm``'s state dict: 2D and sine-cosine positions became a learned table."""
    d = config.to_dict()
    if d["pos_embed"] in ("learned_2d", "sincos2d"):
        d["pos_embed"] = "learned"
    if _timm_adds_patch_bias(config):
        d["patch_bias"] = None
    return d


#: timm ``model_args`` that mean the same thing in ViTConfig.
_TIMM_ARGS = ("class_token", "fc_norm", "init_values", "embed_dim", "reg_tokens", "no_embed_class", "pre_norm",
              "final_norm", "qk_norm", "proj_bias", "pool_include_prefix", "drop_path_rate", "attn_drop_rate")
#: timm's names of the same fields
_TIMM_RENAMED = {"scale_attn_norm": "attn_norm", "scale_mlp_norm": "mlp_norm"}
#: timm's activation names -> the ``gelu`` field (SwiGLU's SiLU is the MLP kind's own)
_TIMM_ACTS = {"gelu": "exact", "gelu_tanh": "tanh", "gelu_pytorch_tanh": "tanh", "quick_gelu": "quick"}
#: arguments that change no output (initialisation, dropout placement timm's way, features) or that
#: the generic reader takes (timm_format._TIMM_ARGS)
_TIMM_INERT = ("weight_init", "fix_init", "drop_rate", "pos_drop_rate", "proj_drop_rate", "patch_drop_rate",
               "img_size", "patch_size", "in_chans", "num_classes", "global_pool", "qkv_bias", "dynamic_img_size",
               "depth", "num_heads", "mlp_ratio", "act_layer", "pos_embed", "dynamic_img_pad", "attn_layer")


def vit_timm_args(args: Mapping[str, Any], config: TokenConfig) -> Dict[str, Any]:
    """timm's VisionTransformer ``model_args`` (a hub ``config.json``) -> ViTConfig fields. Layers given by
    class (``norm_layer``, ``mlp_layer``, ``block_fn`` ...) are the architecture's own: a name's
    registered config carries them; any other argument is refused by name rather than dropped."""
    kw = {k: args[k] for k in _TIMM_ARGS if args.get(k) is not None}
    kw.update({ours: args[theirs] for theirs, ours in _TIMM_RENAMED.items() if args.get(theirs) is not None})
    unknown = sorted(k for k in args if k not in _TIMM_ARGS and k not in _TIMM_RENAMED and k not in _TIMM_INERT)
    if unknown:
        raise ValueError(f"timm model_args {', '.join(unknown)} are not read by vitkit (the architecture's own layers "
                         f"come with its name); remove them or build the model with vitkit's fields")
    act = args.get("act_layer")
    if act is not None:
        if act == "silu" and config.mlp in ("swiglu", "swiglu_packed"):
            pass  # SwiGLU's own activation
        elif act in _TIMM_ACTS:
            kw["gelu"] = _TIMM_ACTS[act]
        else:
            raise ValueError(f"timm act_layer {act!r} has no vitkit ViT equivalent (known: {', '.join(_TIMM_ACTS)})")
    attn_layer = args.get("attn_layer")
    if attn_layer not in (None, "", "attn", "diff"):
        raise ValueError(f"timm attn_layer {attn_layer!r} has no vitkit ViT equivalent (known: 'attn', 'diff')")
    if attn_layer == "diff":
        kw["diff_attn"] = True
    if args.get("pos_embed") in ("", "none"):
        kw["pos_embed"] = "none"
    if args.get("dynamic_img_pad"):
        raise ValueError("timm dynamic_img_pad=True (zero padding to whole patches) has no vitkit equivalent")
    if "mlp_ratio" in args or "embed_dim" in kw:  # timm's hidden width is embed_dim x mlp_ratio: it follows the width
        packed = config.mlp == "swiglu_packed"
        ratio = args["mlp_ratio"] if "mlp_ratio" in args else config.mlp_dim * (2 if packed else 1) / config.embed_dim
        hidden = int(kw.get("embed_dim", config.embed_dim) * ratio)
        kw["mlp_dim"] = hidden // 2 if packed else hidden
    return kw


__all__ = ["vit_to_timm", "vit_timm_config", "vit_timm_args"]
