"""timm's NaFlexViT on whole images: the family "naflexvit" (NaFlex SigLIP 2's towers, NVIDIA's C-RADIO v3 and v4
backbones and timm's own NaFlex ViTs, under timm's ``naflexvit_*`` names).

On an image tensor timm's NaFlexViT is a plain pre-norm ViT whose parts vitkit has: registers, LayerScale, the
MAP head, a final norm or ``fc_norm`` or neither (RADIO), and a learned position table over the patches only, held
at its own grid (16 x 16; RADIO's 128 x 128) and resampled to each input's grid in the forward (vitkit's
``dynamic_img_size`` with ``pos_embed_size``). What is its own:

- the tensors are under ``embeds.`` and the patch projection is a linear layer over each patch flattened
  height, width, channel (timm's ``checkpoint_filter_fn`` turns a convolution's kernel into it so): vitkit holds
  the same kernel as its convolution, and writes it back that way;
- ``pos_embed_ar_preserving``: the table is resampled to a square of the grid's longer side and its top-left
  part taken, so a row of patches keeps its positions whatever the image's height;
- ``pos_embed='factorized'``: a row and a column table of full width, added (:mod:`.positions`);
- RADIO resamples bilinearly without antialias, v3's base and huge with the corners aligned.

The packed sequences of NaFlex (patches with coordinates and a mask, several images in one row) are transformers'
``Siglip2Model``'s input in vitkit (``vitkit.weights``); here the model takes images, as timm's does without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

import torch

from .config_base import INCEPTION_MEAN, INCEPTION_STD
from .layers import to_2tuple
from .registry import Family, register_family, register_model
from .vit import HEADS_BY_WIDTH, VisionTransformer, ViTConfig, vit_complexity, vit_fields
from .vit_names import CLIP
from .vit_timm import vit_timm_args

#: the position kinds timm's NaFlexViT has (its 'rope' kinds are EVA's, not built here)
NAFLEX_POS_EMBEDS = ("learned", "factorized", "none")


@dataclass
class NaFlexConfig(ViTConfig):
    """timm's NaFlexViT on whole images (see the module notes): a ViT config with the table's own rules."""

    KIND: ClassVar[str] = "NaFlex ViT"
    #: (field, the value timm's NaFlexViT always has): its table is over the patches and resampled per input
    FIXED: ClassVar[Tuple[Tuple[str, Any], ...]] = (("no_embed_class", True), ("dynamic_img_size", True))
    #: the table stays at its own grid whatever image size is asked for (timm's ignores img_size for it)
    TABLE_HELD: ClassVar[bool] = True

    architecture: str = "naflexvit"
    img_size: Tuple[int, int] = (384, 384)
    class_token: bool = False
    global_pool: str = "map"
    no_embed_class: bool = True
    dynamic_img_size: bool = True
    #: the table's grid, 16 x 16 (timm's ``pos_embed_grid_size``), in pixels
    pos_embed_size: Optional[Tuple[int, int]] = (256, 256)
    #: resampled to a square of the grid's longer side, its top-left part taken (timm's ``pos_embed_ar_preserving``)
    pos_embed_ar_preserving: bool = False
    pos_embed_align_corners: bool = False
    mean: Tuple[float, ...] = INCEPTION_MEAN
    std: Tuple[float, ...] = INCEPTION_STD
    crop_pct: float = 1.0

    def family_problems(self) -> List[str]:
        problems = super().family_problems()
        problems += [f"{name} is {value!r} in a {self.KIND}, got {getattr(self, name)!r}" for name, value in self.FIXED
                     if getattr(self, name) != value]
        if self.pos_embed not in NAFLEX_POS_EMBEDS:
            problems.append(f"a {self.KIND}'s pos_embed is one of {NAFLEX_POS_EMBEDS}, got {self.pos_embed!r}")
        return problems


class NaFlexViT(VisionTransformer):
    """timm's NaFlexViT on whole images (see the module notes); vitkit's ViT with its config."""

    config_cls = NaFlexConfig


# ----------------------------------------------------------------------------- timm's names

#: timm's names of the embedding's tensors (under ``embeds.``) -> vitkit's
_EMBEDS = {"embeds.proj.weight": "patch_embed.proj.weight", "embeds.proj.bias": "patch_embed.proj.bias",
           "embeds.cls_token": "cls_token", "embeds.reg_token": "reg_token", "embeds.pos_embed": "pos_embed",
           "embeds.pos_embed_y": "pos_embed_y", "embeds.pos_embed_x": "pos_embed_x"}
_TIMM = {ours: theirs for theirs, ours in _EMBEDS.items()}


def is_naflex_state_dict(keys) -> bool:
    return "embeds.proj.weight" in keys


def patch_of(width: int) -> Tuple[int, int]:
    """(patch side, channels) of a linear patch projection reading ``width`` values (side x side x channels): 3
    channels or 1 (no width is both: 3 is no square)."""
    for chans in (3, 1):
        side = math.isqrt(width // chans)
        if side * side * chans == width and side:
            return side, chans
    raise ValueError(f"a linear patch projection over {width} values is no square patch of 3 or 1 channels")


def naflex_from_timm(sd: Mapping[str, Any]) -> Dict[str, Any]:
    """timm's names -> vitkit's: the linear patch projection as the convolution's kernel (height, width, channel
    -> channel, height, width), the (1, H, W, D) table flattened row by row."""
    out = {}
    for key, value in sd.items():
        name = _EMBEDS.get(key, key)
        if key == "embeds.proj.weight" and getattr(value, "dim", lambda: 0)() == 2:
            side, chans = patch_of(int(value.shape[1]))
            value = value.reshape(value.shape[0], side, side, chans).permute(0, 3, 1, 2).contiguous()
        elif key == "embeds.pos_embed" and getattr(value, "dim", lambda: 0)() == 4:
            value = value.reshape(1, -1, value.shape[-1])
        out[name] = value
    return out


def naflex_to_timm(model: NaFlexViT) -> Dict[str, torch.Tensor]:
    """vitkit's model -> timm's NaFlexViT state dict (:func:`naflex_from_timm`'s inverse)."""
    out = {}
    for key, value in model.state_dict().items():
        value = value.detach().cpu()
        if key == "patch_embed.proj.weight":
            value = value.permute(0, 2, 3, 1).flatten(1)
        elif key == "pos_embed":
            value = value.reshape(1, *model.pos_embed_grid, value.shape[-1])
        out[_TIMM.get(key, key)] = value.contiguous()
    return out


def infer_naflex_config(sd: Mapping[str, Any], **overrides: Any) -> NaFlexConfig:
    """A NaFlexViT from timm's tensors alone: the ViT's fields off the shapes, the table's grid off its own shape.
    The resampling (bicubic with antialias, no aspect ratio kept, timm's defaults) is no tensor's: a RADIO or
    SigLIP 2 state dict alone needs its architecture named (``model_name=``)."""
    native = naflex_from_timm(sd)
    kw = vit_fields({k: v for k, v in native.items() if not k.startswith("pos_embed")})
    ph, pw = kw["patch_size"]
    if "embeds.pos_embed" in sd:
        kind, (gh, gw) = "learned", tuple(int(s) for s in sd["embeds.pos_embed"].shape[1:3])
    elif "embeds.pos_embed_y" in sd:
        kind, (gh, gw) = "factorized", (int(sd["embeds.pos_embed_y"].shape[1]), int(sd["embeds.pos_embed_x"].shape[1]))
    else:
        kind, (gh, gw) = "none", (16, 16)
    kw.update(pos_embed=kind, pos_embed_size=(gh * ph, gw * pw), img_size=(gh * ph, gw * pw),
              num_heads=HEADS_BY_WIDTH.get(kw["embed_dim"], max(1, kw["embed_dim"] // 64)))
    kw.update(overrides)  # (an img_size asked for leaves the table's size: timm's NaFlexViT ignores it for the table)
    return NaFlexConfig(**kw)


#: NaFlexVitCfg's fields -> NaFlexConfig's (the table's grid in patches; vitkit's size in pixels)
_RENAMED = {"pos_embed_interp_mode": "pos_embed_interpolation", "pos_embed_antialias": "pos_embed_antialias",
            "pos_embed_ar_preserving": "pos_embed_ar_preserving",
            "pos_embed_align_corners": "pos_embed_align_corners"}
#: NaFlexVitCfg's fields that change nothing on whole images at timm's values (read: any other value is refused)
_INERT = {"embed_proj_type": "linear", "patchify_channels_last": True, "pos_embed_use_grid_sample": False,
          "use_key_only_attn_mask": False, "enable_patch_interpolator": False, "attn_type": "standard",
          "rope_type": "", "swiglu_mlp": False, "qkv_fused": True}


def naflex_timm_args(args: Mapping[str, Any], config: NaFlexConfig) -> Dict[str, Any]:
    """timm's ``model_args`` (NaFlexVitCfg's fields, as ``create_model`` takes them) -> fields: the table's own
    here, the rest as a ViT's (:func:`.vit_timm.vit_timm_args`)."""
    kw = {ours: args[theirs] for theirs, ours in _RENAMED.items() if args.get(theirs) is not None}
    # the table's size is its own grid's, whatever img_size timm is given (which only a plain ViT's table follows)
    sides = []
    for name, default in (("pos_embed_grid_size", config.table_grid), ("patch_size", config.patch_size)):
        try:
            sides.append(to_2tuple(args.get(name) or default))
        except (TypeError, ValueError):
            raise ValueError(f"timm model_args {name} must be an int or a pair (H, W) of ints, got "
                             f"{args.get(name)!r}") from None
    kw["pos_embed_size"] = (sides[0][0] * sides[1][0], sides[0][1] * sides[1][1])
    odd = [f"{k}={args[k]!r}" for k, value in _INERT.items() if k in args and args[k] != value]
    if odd:
        raise ValueError(f"timm NaFlexViT model_args {', '.join(odd)} are not built by vitkit")
    if args.get("pos_embed") == "factorized":
        kw["pos_embed"] = "factorized"
    rest = {k: v for k, v in args.items() if k not in _RENAMED and k not in _INERT and k != "pos_embed_grid_size"
            and not (k == "pos_embed" and v == "factorized")}
    return {**vit_timm_args(rest, config), **kw}


FAMILY = register_family(Family(
    name="naflexvit", config_cls=NaFlexConfig, model_cls=NaFlexViT, complexity=vit_complexity,
    matches=is_naflex_state_dict, infer_config=infer_naflex_config, detect_priority=20, to_timm=naflex_to_timm,
    timm_args=naflex_timm_args, layouts=("timm",), from_timm=naflex_from_timm))


# ----------------------------------------------------------------------------- timm's names

def _register(name: str, description: str, **fields: Any) -> None:
    register_model(name, NaFlexConfig(**fields), description)


_IN1K = dict(embed_dim=768, depth=12, num_heads=12, mlp_dim=3072, init_values=1e-5, global_pool="avg",
             reg_tokens=4, fc_norm=True, num_classes=1000)
_register("naflexvit_base_patch16_gap", "timm's NaFlexViT-B/16, 4 registers, mean pooling (ImageNet-1k)", **_IN1K)
_register("naflexvit_base_patch16_par_gap", "timm's NaFlexViT-B/16, its table keeping the aspect ratio",
          **_IN1K, pos_embed_ar_preserving=True)
_register("naflexvit_base_patch16_parfac_gap", "timm's NaFlexViT-B/16, factorised tables keeping the aspect ratio",
          **_IN1K, pos_embed_ar_preserving=True, pos_embed="factorized")
_register("naflexvit_base_patch16_map", "timm's NaFlexViT-B/16 with a register and the MAP head",
          **{**_IN1K, "global_pool": "map", "reg_tokens": 1, "fc_norm": None})
_SO150M2 = dict(embed_dim=832, depth=21, num_heads=13, mlp_dim=2176, init_values=1e-5, qkv_bias=False,
                reg_tokens=1, num_classes=1000)
_register("naflexvit_so150m2_patch16_reg1_gap", "timm's NaFlexViT-SO150M2/16, a register, mean pooling",
          **_SO150M2, global_pool="avg", fc_norm=True)
_register("naflexvit_so150m2_patch16_reg1_map", "timm's NaFlexViT-SO150M2/16, a register, the MAP head",
          **_SO150M2, global_pool="map")
_SIGLIP = dict(gelu="tanh", global_pool="map", pos_embed_interpolation="bilinear", num_classes=0)
_register("naflexvit_base_patch16_siglip", "SigLIP 2 NaFlex's B/16 image tower (timm's)", **_SIGLIP)
_register("naflexvit_so400m_patch16_siglip", "SigLIP 2 NaFlex's So400m/16 image tower (timm's)",
          embed_dim=1152, depth=27, num_heads=16, mlp_dim=4304, **_SIGLIP)
#: C-RADIO: a class token and the other teachers' summary tokens as registers, no final norm, a 128 x 128 table
_RADIO = dict(img_size=512, class_token=True, global_pool="token", final_norm=False, pos_embed_size=2048,
              pos_embed_interpolation="bilinear", pos_embed_ar_preserving=True, pos_embed_antialias=False,
              **CLIP, num_classes=0)
for _name, _fields in (
        ("naflexvit_base_patch16_radio_v3", dict(embed_dim=768, depth=12, num_heads=12, mlp_dim=3072, init_values=1e-5,
                                                 reg_tokens=7, pos_embed_align_corners=True)),
        ("naflexvit_large_patch16_radio_v3", dict(embed_dim=1024, depth=24, num_heads=16, mlp_dim=4096,
                                                  init_values=1e-5, reg_tokens=7)),
        ("naflexvit_huge_patch16_radio_v3", dict(embed_dim=1280, depth=32, num_heads=16, mlp_dim=5120, reg_tokens=7,
                                                 pos_embed_align_corners=True)),
        ("naflexvit_giant_patch16_radio_v3", dict(embed_dim=1536, depth=40, num_heads=24, mlp_dim=6144,
                                                  reg_tokens=7)),
        ("naflexvit_so400m_patch16_radio_v4", dict(embed_dim=1152, depth=27, num_heads=16, mlp_dim=4304,
                                                   reg_tokens=9)),
        ("naflexvit_huge_patch16_radio_v4", dict(embed_dim=1280, depth=32, num_heads=16, mlp_dim=5120,
                                                 reg_tokens=9))):
    _register(_name, f"NVIDIA's C-RADIO{_name.split('_')[-1]} {_name.split('_')[1]} backbone (timm's)",
              **_RADIO, **_fields)

__all__ = ["NaFlexConfig", "NaFlexViT", "FAMILY", "NAFLEX_POS_EMBEDS", "naflex_from_timm", "naflex_to_timm",
           "infer_naflex_config", "patch_of"]
