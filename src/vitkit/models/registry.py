"""Model names -> configurations, and configurations -> modules.

Names follow timm where timm has the model (``vit_base_patch16_224``); big_vision-style
size strings (``"B/16"``) are accepted too. Each architecture family registers its config
class and module class so that ``config.json`` alone can rebuild a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple, Type

from torch import nn

from .hybrid import ResNetV2, ResNetV2Config
from .vit import IMAGENET_MEAN, IMAGENET_STD, VisionTransformer, ViTConfig

# architecture name -> (config class, module class)
_ARCHITECTURES: Dict[str, Tuple[type, Type[nn.Module]]] = {}


def register_architecture(name: str, config_cls: type, model_cls: Type[nn.Module]) -> None:
    _ARCHITECTURES[name] = (config_cls, model_cls)


def build_from_config(config: Any) -> nn.Module:
    """Instantiate the module class registered for ``config.architecture``."""
    arch = getattr(config, "architecture", None)
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(sorted(_ARCHITECTURES))}")
    return _ARCHITECTURES[arch][1](config)


def config_from_dict(d: Dict[str, Any]) -> Any:
    arch = d.get("architecture", "vit")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r} in config; known: {', '.join(sorted(_ARCHITECTURES))}")
    return _ARCHITECTURES[arch][0].from_dict(d)


register_architecture("vit", ViTConfig, VisionTransformer)
register_architecture("resnetv2", ResNetV2Config, ResNetV2)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    config: Any
    description: str = ""


_MODELS: Dict[str, ModelEntry] = {}


def register_model(name: str, config: Any, description: str = "") -> None:
    if name in _MODELS:
        raise ValueError(f"model {name!r} is registered twice")
    config.name = name
    _MODELS[name] = ModelEntry(name, config, description)


# ---------------------------------------------------------------- the paper's Table 1

#: size letter -> (width, depth, heads, MLP width), paper Table 1 plus DeiT's Ti/S
VIT_SIZES: Dict[str, Tuple[int, int, int, int]] = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
}
_SIZE_WORDS = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}


def vit_config(size: str, patch: int, img_size: int = 224, **kw: Any) -> ViTConfig:
    width, depth, heads, mlp = VIT_SIZES[size]
    # timm's fine-tuned 384 px weights are evaluated on the full image (crop_pct 1.0).
    kw.setdefault("crop_pct", 1.0 if img_size >= 384 else 0.9)
    return ViTConfig(img_size=img_size, patch_size=patch, embed_dim=width, depth=depth,
                     num_heads=heads, mlp_dim=mlp, **kw)


_VIT_VARIANTS = [
    ("Ti", 16, 224), ("Ti", 16, 384),
    ("S", 16, 224), ("S", 16, 384), ("S", 32, 224), ("S", 32, 384),
    ("B", 16, 224), ("B", 16, 384), ("B", 32, 224), ("B", 32, 384), ("B", 8, 224),
    ("L", 16, 224), ("L", 16, 384), ("L", 32, 224), ("L", 32, 384),
    ("H", 14, 224),
]
for _size, _patch, _res in _VIT_VARIANTS:
    register_model(f"vit_{_SIZE_WORDS[_size]}_patch{_patch}_{_res}", vit_config(_size, _patch, _res),
                   f"ViT-{_size}/{_patch} at {_res} px")

# ---------------------------------------------------------------- DeiT (Touvron et al., 2021)
# The plain ViT trained on ImageNet-1k alone with strong regularisation (ImageNet mean/std,
# crop 0.875); the distilled variants add a distillation token and a second head whose
# average with the class head is the prediction.
for _size in ("Ti", "S", "B"):
    for _res in ((224, 384) if _size == "B" else (224,)):
        for _distilled in (False, True):
            _name = f"deit_{_SIZE_WORDS[_size]}{'_distilled' if _distilled else ''}_patch16_{_res}"
            register_model(_name, vit_config(_size, 16, _res, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                                             crop_pct=1.0 if _res == 384 else 0.875, distill_token=_distilled),
                           f"DeiT-{_size}/16 at {_res} px" + (", distillation token" if _distilled else ""))

#: Fashion-MNIST's training-set pixel statistics (the models below expect them). models/ does
#: not import data/, so they are written here as well as in data.fashion_mnist; a test keeps both equal.
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)

# The default model of `vitkit train` on Fashion-MNIST (28x28 grey): patch 4 gives a 7x7 grid
# (49 tokens), fine enough for 28 px garments while attention stays cheap; width 96 with 4
# layers and 3 heads (head dim 32) trains at ~2,500 img/s on a 2-core CPU. Global average
# pooling and sine-cosine positions (the "plain ViT baseline" of big_vision) converge
# faster on small data than a class token and learned positions.
register_model("vit_fmnist", ViTConfig(img_size=28, patch_size=4, in_chans=1, num_classes=10,
                                       embed_dim=96, depth=4, num_heads=3, mlp_dim=192,
                                       global_pool="avg", class_token=False, fc_norm=False,
                                       pos_embed="sincos2d", mean=FMNIST_MEAN, std=FMNIST_STD,
                                       crop_pct=1.0),
               "ViT for 28x28 grey images (plain: patch 4)")

# Its hybrid (section 3.1 at 28 px): three 3x3 convolutions (32, 64, 96 channels; strides
# 1, 2, 2; weight-standardised, GroupNorm + ReLU) make the same 7x7 grid of tokens with a
# receptive field that overlaps patches; two transformer layers of width 96 follow. Per
# epoch it learns faster than the plain model (+2.4 points after 2 epochs) at the same
# img/s (the convolutions cost what two transformer layers did), so within a few CPU minutes
# it goes further - the paper's Fig. 5 finding that hybrids win at small compute.
register_model("vit_fmnist_hybrid",
               ViTConfig(img_size=28, patch_size=1, in_chans=1, num_classes=10,
                         embed_dim=96, depth=2, num_heads=3, mlp_dim=192,
                         global_pool="avg", class_token=False, fc_norm=False,
                         pos_embed="sincos2d", mean=FMNIST_MEAN, std=FMNIST_STD, crop_pct=1.0,
                         backbone={"type": "conv", "channels": [32, 64, 96], "strides": [1, 2, 2]}),
               "conv-stem hybrid ViT for 28x28 grey images")

# ---------------------------------------------------------------- the ResNet hybrids (section 3.1)

def _resnetv2(*layers: int) -> Dict[str, Any]:
    return {"type": "resnetv2", "layers": list(layers), "width_factor": 1}


#: (timm name stem, size, projection patch, backbone, what it is); timm's names and counts.
#: The paper's R50 hybrid drops stage 4 and extends stage 3 to 9 blocks (output stride 16).
_HYBRID_VARIANTS = [
    ("vit_tiny_r_s16_p8", "Ti", 8, _resnetv2(), "R+ViT-Ti: the ResNet stem alone (stride 4), 8x8 patches",
     (224, 384)),
    ("vit_small_r26_s32", "S", 1, _resnetv2(2, 2, 2, 2), "R26+ViT-S/32 hybrid", (224, 384)),
    ("vit_base_r26_s32", "B", 1, _resnetv2(2, 2, 2, 2), "R26+ViT-B/32 hybrid", (224,)),
    ("vit_base_r50_s16", "B", 1, _resnetv2(3, 4, 9), "R50+ViT-B/16 hybrid of the paper (stages 3, 4, 9)",
     (224, 384)),
    ("vit_large_r50_s32", "L", 1, _resnetv2(3, 4, 6, 3), "R50+ViT-L/32 hybrid (all four R50 stages)",
     (224, 384)),
]
for _stem, _size, _patch, _backbone, _what, _sizes in _HYBRID_VARIANTS:
    for _res in _sizes:
        register_model(f"{_stem}_{_res}", vit_config(_size, _patch, _res, backbone=dict(_backbone)),
                       f"{_what} at {_res} px")

# The CNN alone: the hybrid's non-pre-activation ResNetV2 with a pooled linear head. Not
# timm's resnetv2_50 (pre-activation, BatchNorm), hence its own name.
register_model("resnetv2_50_nopreact", ResNetV2Config(layers=(3, 4, 6, 3)),
               "ResNet-50 of the hybrids (GroupNorm, weight standardisation, not pre-activation) as a classifier")

_SIZE_STRING = re.compile(r"^(Ti|S|B|L|H)/(\d+)$")


def list_models(pattern: str = "*") -> List[str]:
    """Registered model names, optionally filtered by a shell-style pattern."""
    import fnmatch

    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def get_model_config(name: str) -> Any:
    """The configuration behind a name (a copy: changing it changes nothing registered)."""
    m = _SIZE_STRING.match(name)
    if m:
        return vit_config(m.group(1), int(m.group(2)), name=name)
    if name not in _MODELS:
        import difflib

        close = difflib.get_close_matches(name, list(_MODELS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `vitkit models`"
        raise ValueError(f"unknown model {name!r}{hint}")
    return _MODELS[name].config.replace()


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a model by registered name (``vit_base_patch16_224``) or size string (``"B/16"``).

    Keyword overrides change the configuration: ``create_model("B/16", img_size=384,
    num_classes=10)``. The model is randomly initialised as the official code does; load
    weights with :func:`vitkit.load_weights` or use :func:`vitkit.from_pretrained`.
    """
    config = get_model_config(name).replace(**overrides)
    return build_from_config(config)



# ---------------------------------------------------------------- CaiT (Touvron et al., 2021)
from . import cait as _cait  # noqa: E402,F401  (registers "cait" and timm's cait_* names)

# ---------------------------------------------------------------- ConViT (d'Ascoli et al., 2021)
from . import convit as _convit  # noqa: E402,F401  (registers "convit" and timm's convit_* names)
