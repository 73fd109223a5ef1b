"""The ViT family's names: the paper's (timm's ``vit_*`` at the sizes of its Table 1, DeiT's, the ResNet
hybrids) and vitkit's Fashion-MNIST models, registered first; then timm's names of the ViTs that grew from
the paper: CLIP and SigLIP towers, DINOv2 (with and without registers), DeiT III, FlexiViT, AIMv2, BEiT-3,
RADIO, TIPSv2, the ``reg``/``gap`` ViTs of timm's own training and the paper's sizes at other patch and
image sizes.

Each family below is one recipe (the fields its weights share) over sizes; every name builds the model
timm builds under it (``timm.create_model(name)``: the same parameter names, shapes and count, and the
class count of its default weights), with the preprocessing of timm's default weights for that name. A
hub folder's own ``pretrained_cfg`` (``config.json``) replaces the preprocessing and the class count of
its weights. ``tests/test_models_names.py`` checks every name against timm; ``benchmarks/coverage.py``
loads each from timm's hub layout and compares the logits.

timm's relative-position ViTs (``vit_relpos_*``, ``vit_srelpos_*``) are here too. The models with rotary
positions (``*_rope_*``, EVA-02, DINOv3, Perception Encoder) are :mod:`.eva`'s.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from .config_base import IMAGENET_MEAN, IMAGENET_STD
from .registry import register_model
from .vit import FMNIST_MEAN, FMNIST_STD, VIT_SIZES, ViTConfig, vit_config

# ----------------------------------------------------------------------------- the paper's names

#: size letter -> timm's word for it
_SIZE_WORDS = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}

#: (size, patch, image size) of timm's plain ViTs
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

# ---- DeiT (Touvron et al., 2021): the plain ViT trained on ImageNet-1k alone with strong
# regularisation (ImageNet mean/std, crop 0.875); the distilled variants add a distillation
# token and a second head whose average with the class head is the prediction.
for _size in ("Ti", "S", "B"):
    for _res in ((224, 384) if _size == "B" else (224,)):
        for _distilled in (False, True):
            _name = f"deit_{_SIZE_WORDS[_size]}{'_distilled' if _distilled else ''}_patch16_{_res}"
            register_model(_name, vit_config(_size, 16, _res, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                                             crop_pct=1.0 if _res == 384 else 0.875, distill_token=_distilled),
                           f"DeiT-{_size}/16 at {_res} px" + (", distillation token" if _distilled else ""))


# The plain model for Fashion-MNIST (28x28 grey): patch 4 gives a 7x7 grid (49 tokens), fine
# enough for 28 px garments while attention stays cheap; width 96 with 4 layers and 3 heads
# (head dim 32). Global average pooling and sine-cosine positions (the "plain ViT baseline" of
# big_vision) converge faster on small data than a class token and learned positions.
register_model("vit_fmnist", ViTConfig(img_size=28, patch_size=4, in_chans=1, num_classes=10,
                                       embed_dim=96, depth=4, num_heads=3, mlp_dim=192,
                                       global_pool="avg", class_token=False, fc_norm=False,
                                       pos_embed="sincos2d", mean=FMNIST_MEAN, std=FMNIST_STD,
                                       crop_pct=1.0),
               "ViT for 28x28 grey images (plain: patch 4)")

# The default model of `vitkit train`, its hybrid (section 3.1 at 28 px): five 3x3 convolutions
# (32, 64, 64, 96, 96 channels; strides 1, 2, 1, 2, 1; weight-standardised, GroupNorm + ReLU)
# make the same 7x7 grid of tokens with a receptive field that overlaps patches; one
# transformer layer of width 96 follows. Per epoch the convolutions learn fastest: after 4
# epochs (label smoothing 0.1, one seed) the earlier 3-convolution stem with 2 layers gave
# 90.5% test, 4 convolutions 91.1%, 5 convolutions 92.0% with 2 layers and 92.6% with 1 -
# while a third transformer layer lost 0.6 points. One layer keeps it at 0.92x the earlier
# model's img/s. The paper's Fig. 5 finding that hybrids win at small compute, taken further.
register_model("vit_fmnist_hybrid",
               ViTConfig(img_size=28, patch_size=1, in_chans=1, num_classes=10,
                         embed_dim=96, depth=1, num_heads=3, mlp_dim=192,
                         global_pool="avg", class_token=False, fc_norm=False,
                         pos_embed="sincos2d", mean=FMNIST_MEAN, std=FMNIST_STD, crop_pct=1.0,
                         backbone={"type": "conv", "channels": [32, 64, 64, 96, 96], "strides": [1, 2, 1, 2, 1]}),
               "conv-stem hybrid ViT for 28x28 grey images")


# ---- the ResNet hybrids (section 3.1), timm's names and counts. The paper's R50 hybrid
# drops stage 4 and extends stage 3 to 9 blocks (output stride 16).
def _resnetv2(*layers: int) -> Dict[str, Any]:
    return {"type": "resnetv2", "layers": list(layers), "width_factor": 1}


#: (timm name stem, size, projection patch, backbone, what it is, image sizes)
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


# ----------------------------------------------------------------------------- the later ViTs

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: width, depth, heads, MLP width of the sizes beyond the paper's (timm's names for them)
SIZES: Dict[str, Tuple[int, int, int, int]] = {
    **{k: v for k, v in zip(("tiny", "small", "base", "large", "huge"), VIT_SIZES.values())},
    "xsmall": (256, 10, 4, 1024), "wee": (256, 14, 4, 1280), "little": (320, 14, 5, 1792),
    "medium": (512, 12, 8, 2048), "mediumd": (512, 20, 8, 2048), "betwixt": (640, 12, 10, 2560),
    "base_plus": (896, 12, 14, 3584), "so150m": (896, 18, 14, 2304), "so150m2": (832, 21, 13, 2176),
    "so400m": (1152, 27, 16, 4304), "giant": (1408, 40, 16, 6144), "gigantic": (1664, 48, 16, 8192),
    "giant2": (1536, 40, 24, 4096), "giantopt": (1536, 40, 16, 6144),
    "aimv2_large": (1024, 24, 8, 2816), "aimv2_huge": (1536, 24, 12, 4096), "aimv2_1b": (2048, 24, 16, 5632),
    "aimv2_3b": (3072, 24, 24, 8192),
    "test": (64, 6, 2, 192), "test2": (64, 8, 2, 192), "test3": (96, 9, 3, 192),
}

IMAGENET = dict(mean=IMAGENET_MEAN, std=IMAGENET_STD)
CLIP = dict(mean=CLIP_MEAN, std=CLIP_STD)
RAW = dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # pixels in [0, 1] as they are

#: the recipes: what the weights of a family share
RECIPES: Dict[str, Dict[str, Any]] = {
    # CLIP / OpenCLIP image towers (Radford et al. 2021): ln_pre after the embedding (so no patch bias),
    # LayerNorm eps 1e-5; the head is the tower's projection into the joint embedding
    "clip": dict(pre_norm=True, norm_eps=1e-5, **CLIP),
    "clip_quickgelu": dict(pre_norm=True, norm_eps=1e-5, gelu="quick", **CLIP),
    # SigLIP (Zhai et al. 2023): no class token, the MAP head; SigLIP 2's towers use tanh GELU
    "siglip": dict(class_token=False, global_pool="map", num_classes=0),
    "siglip_tanh": dict(class_token=False, global_pool="map", gelu="tanh", num_classes=0),
    "siglip_gap": dict(class_token=False, global_pool="avg", fc_norm=False, num_classes=0),
    "siglip_gap_tanh": dict(class_token=False, global_pool="avg", fc_norm=False, gelu="tanh", num_classes=0),
    # DINOv2 (Oquab et al. 2023): LayerScale, 518 px; with registers (Darcet et al. 2024): 4 of them, the
    # position table over the patches only
    "dinov2": dict(patch_size=14, img_size=518, init_values=1e-5, num_classes=0, crop_pct=1.0, **IMAGENET),
    "dinov2_reg4": dict(patch_size=14, img_size=518, init_values=1e-5, no_embed_class=True, reg_tokens=4,
                        num_classes=0, crop_pct=1.0, **IMAGENET),
    # TIPSv2: one register, LayerScale starting at 1, pixels as they are
    "tipsv2": dict(patch_size=14, img_size=448, init_values=1.0, no_embed_class=True, reg_tokens=1, num_classes=0,
                   crop_pct=1.0, **RAW),
    # DeiT III (Touvron et al. 2022): LayerScale 1e-6, no position for the class token
    "deit3": dict(init_values=1e-6, no_embed_class=True, **IMAGENET),
    # timm's own ImageNet-12k ViTs: registers, average pooling, LayerScale
    "reg_gap": dict(init_values=1e-5, class_token=False, no_embed_class=True, global_pool="avg", crop_pct=0.95),
    # timm's global-average-pooled ViTs (norm before pooling, as big_vision's)
    "gap": dict(class_token=False, global_pool="avg", fc_norm=False),
    # AIMv2 (Fini et al. 2024): RMSNorm everywhere (also on the patch tokens), SwiGLU, no biases
    "aimv2": dict(patch_size=14, norm="rmsnorm", norm_eps=1e-5, embed_norm=True, mlp="swiglu", qkv_bias=False,
                  proj_bias=False, class_token=False, fc_norm=False, global_pool="avg", num_classes=0, crop_pct=1.0,
                  **CLIP),
    # BEiT-3's vision tower: sub-LN inside attention and MLP (Magneto), mean pooling over all tokens' patches
    "beit3": dict(norm_eps=1e-5, attn_norm=True, mlp_norm=True, global_pool="avg", crop_pct=1.0, **IMAGENET),
    # RADIO (Ranzinger et al. 2024): registers, no final norm
    "radio": dict(img_size=512, no_embed_class=True, final_norm=False, num_classes=0, crop_pct=1.0, **CLIP),
    # FlexiViT (Beyer et al. 2023): trained over patch sizes; the table at 240 px, no class slot
    "flexivit": dict(img_size=240, no_embed_class=True, crop_pct=0.95),
    # timm's relative-position ViTs: a bias from an MLP of the log-spaced offset in every layer (or one
    # shared: "srelpos"), no absolute table, LayerScale 1e-6, mean pooling
    "relpos": dict(pos_embed="relative_mlp", init_values=1e-6, class_token=False, global_pool="avg", fc_norm=False,
                   qkv_bias=False),
}


def _entry(size: str, recipe: str, **fields: Any) -> ViTConfig:
    width, depth, heads, mlp = SIZES[size]
    kw: Dict[str, Any] = dict(embed_dim=width, depth=depth, num_heads=heads, mlp_dim=mlp)
    kw.update(RECIPES[recipe] if recipe else {})
    kw.update(fields)
    return ViTConfig(**kw)


#: name -> (size, recipe, fields beyond the recipe)
#: the SigLIP names whose default weights timm evaluates on the whole image (an ImageNet fine-tune)
_SIGLIP_WHOLE = {("so400m", 14, 384, "_gap"): 1.0}

NAMES: Dict[str, Tuple[str, str, Dict[str, Any]]] = {
    # ---- CLIP / OpenCLIP towers
    "vit_xsmall_patch16_clip_224": ("xsmall", "clip", dict(num_classes=512)),
    "vit_medium_patch16_clip_224": ("medium", "clip", dict(num_classes=512)),
    "vit_medium_patch32_clip_224": ("medium", "clip", dict(patch_size=32, num_classes=512)),
    "vit_betwixt_patch32_clip_224": ("betwixt", "clip", dict(patch_size=32, num_classes=512)),
    "vit_base_patch32_clip_224": ("base", "clip", dict(patch_size=32)),
    "vit_base_patch32_clip_256": ("base", "clip", dict(patch_size=32, img_size=256, num_classes=512, crop_pct=1.0)),
    "vit_base_patch32_clip_384": ("base", "clip", dict(patch_size=32, img_size=384, crop_pct=1.0)),
    "vit_base_patch32_clip_448": ("base", "clip", dict(patch_size=32, img_size=448, crop_pct=1.0)),
    "vit_base_patch32_clip_quickgelu_224": ("base", "clip_quickgelu", dict(patch_size=32, num_classes=512)),
    "vit_base_patch16_clip_224": ("base", "clip", dict(crop_pct=0.95)),
    "vit_base_patch16_clip_384": ("base", "clip", dict(img_size=384, crop_pct=1.0, crop_mode="squash")),
    "vit_base_patch16_clip_quickgelu_224": ("base", "clip_quickgelu", dict(num_classes=512, crop_pct=1.0)),
    "vit_base_patch16_plus_clip_240": ("base_plus", "clip", dict(img_size=240, num_classes=640, crop_pct=1.0)),
    "vit_large_patch14_clip_224": ("large", "clip", dict(patch_size=14, crop_pct=1.0)),
    "vit_large_patch14_clip_336": ("large", "clip", dict(patch_size=14, img_size=336, crop_pct=1.0,
                                                         crop_mode="squash")),
    "vit_large_patch14_clip_quickgelu_224": ("large", "clip_quickgelu", dict(patch_size=14, num_classes=768,
                                                                             crop_pct=1.0)),
    "vit_large_patch14_clip_quickgelu_336": ("large", "clip_quickgelu", dict(patch_size=14, img_size=336,
                                                                             num_classes=768, crop_pct=1.0)),
    "vit_huge_patch14_clip_224": ("huge", "clip", dict(patch_size=14, crop_pct=1.0)),
    "vit_huge_patch14_clip_336": ("huge", "clip", dict(patch_size=14, img_size=336, crop_pct=1.0,
                                                       crop_mode="squash")),
    "vit_huge_patch14_clip_378": ("huge", "clip", dict(patch_size=14, img_size=378, num_classes=1024, crop_pct=1.0)),
    "vit_huge_patch14_clip_quickgelu_224": ("huge", "clip_quickgelu", dict(patch_size=14, num_classes=1024,
                                                                           crop_pct=1.0)),
    "vit_huge_patch14_clip_quickgelu_378": ("huge", "clip_quickgelu", dict(patch_size=14, img_size=378,
                                                                           num_classes=1024, crop_pct=1.0)),
    "vit_giant_patch14_clip_224": ("giant", "clip", dict(patch_size=14, num_classes=1024, crop_pct=1.0)),
    "vit_gigantic_patch14_clip_224": ("gigantic", "clip", dict(patch_size=14, num_classes=1280, crop_pct=1.0)),
    "vit_gigantic_patch14_clip_378": ("gigantic", "clip", dict(patch_size=14, img_size=378, num_classes=1280,
                                                               crop_pct=1.0, crop_mode="squash")),
    "vit_gigantic_patch14_clip_quickgelu_224": ("gigantic", "clip_quickgelu", dict(patch_size=14, num_classes=1280,
                                                                                   crop_pct=1.0)),
    # EVA-01's MIM-trained large tower (a plain ViT with mean pooling)
    "eva_large_patch14_196": ("large", "", dict(patch_size=14, img_size=196, global_pool="avg", crop_pct=1.0, **CLIP)),
    "eva_large_patch14_336": ("large", "", dict(patch_size=14, img_size=336, global_pool="avg", crop_pct=1.0,
                                                crop_mode="squash", **CLIP)),
    # ---- SigLIP and SigLIP 2 towers
    **{f"vit_{size}_patch{p}_siglip{gap}_{res}": (size, f"siglip{gap}{'_tanh' if tanh else ''}",
                                                  dict(patch_size=p, img_size=res, crop_remainder=bool(res % p),
                                                       crop_pct=_SIGLIP_WHOLE.get((size, p, res, gap), 0.9)))
       for size, p, res, tanh in (
           ("base", 16, 224, False), ("base", 16, 256, False), ("base", 16, 384, False), ("base", 16, 512, False),
           ("base", 32, 256, True), ("large", 16, 256, False), ("large", 16, 384, False), ("large", 16, 512, True),
           ("so400m", 14, 224, False), ("so400m", 14, 378, False), ("so400m", 14, 384, False),
           ("so400m", 16, 256, True), ("so400m", 16, 384, True), ("so400m", 16, 512, True),
           ("giantopt", 16, 256, True), ("giantopt", 16, 384, True))
       for gap in ("", "_gap")},
    "vit_so400m_patch14_siglip_gap_448": ("so400m", "siglip_gap", dict(patch_size=14, img_size=448, crop_pct=1.0)),
    "vit_so400m_patch14_siglip_gap_896": ("so400m", "siglip_gap", dict(patch_size=14, img_size=896, crop_pct=1.0)),
    # ---- DINOv2, with registers; TIPSv2
    **{f"vit_{size}_patch14_dinov2": (size, "dinov2", {}) for size in ("small", "base", "large")},
    **{f"vit_{size}_patch14_reg4_dinov2": (size, "dinov2_reg4", {}) for size in ("small", "base", "large")},
    "vit_giant_patch14_dinov2": ("giant2", "dinov2", dict(mlp="swiglu_packed")),
    "vit_giant_patch14_reg4_dinov2": ("giant2", "dinov2_reg4", dict(mlp="swiglu_packed")),
    "vit_base_patch14_reg1_tipsv2": ("base", "tipsv2", {}),
    "vit_large_patch14_reg1_tipsv2": ("large", "tipsv2", {}),
    "vit_so400m_patch14_reg1_tipsv2": ("so400m", "tipsv2", {}),
    "vit_giant_patch14_reg1_tipsv2": ("giant2", "tipsv2", dict(mlp="swiglu_packed")),
    # ---- DeiT III
    "deit3_small_patch16_224": ("small", "deit3", {}),
    "deit3_small_patch16_384": ("small", "deit3", dict(img_size=384, crop_pct=1.0)),
    "deit3_medium_patch16_224": ("medium", "deit3", {}),
    "deit3_base_patch16_224": ("base", "deit3", {}),
    "deit3_base_patch16_384": ("base", "deit3", dict(img_size=384, crop_pct=1.0)),
    "deit3_large_patch16_224": ("large", "deit3", {}),
    "deit3_large_patch16_384": ("large", "deit3", dict(img_size=384, crop_pct=1.0)),
    "deit3_huge_patch14_224": ("huge", "deit3", dict(patch_size=14)),
    # ---- timm's register / average-pool ViTs (ImageNet-12k)
    **{f"vit_{size}_patch16_reg{r}_gap_{res}": (size, "reg_gap", dict(reg_tokens=r, img_size=res,
                                                                       crop_pct=1.0 if res == 384 else 0.95))
       for size, r, res in (("wee", 1, 256), ("little", 1, 256), ("little", 4, 256), ("medium", 1, 256),
                            ("medium", 4, 256), ("mediumd", 4, 256), ("mediumd", 4, 384), ("betwixt", 1, 256),
                            ("betwixt", 4, 256), ("betwixt", 4, 384))},
    # differential attention (Ye et al. 2024) and ViT-22B's parallel blocks on the same recipe
    "vit_dwee_patch16_reg1_gap_256": ("wee", "reg_gap", dict(reg_tokens=1, img_size=256, diff_attn=True)),
    "vit_dlittle_patch16_reg1_gap_256": ("little", "reg_gap", dict(reg_tokens=1, img_size=256, diff_attn=True)),
    "vit_pwee_patch16_reg1_gap_256": ("wee", "reg_gap", dict(reg_tokens=1, img_size=256, depth=16, block="parallel")),
    "vit_dpwee_patch16_reg1_gap_256": ("wee", "reg_gap", dict(reg_tokens=1, img_size=256, depth=16, block="parallel",
                                                              diff_attn=True)),
    **{f"vit_so150m_patch16_reg4_gap_{res}": ("so150m", "gap", dict(reg_tokens=4, img_size=res,
                                                                     crop_pct=1.0 if res == 384 else 0.95))
       for res in (256, 384)},
    **{f"vit_so150m2_patch16_reg1_gap_{res}": ("so150m2", "", dict(
        reg_tokens=1, img_size=res, qkv_bias=False, init_values=1e-5, class_token=False, global_pool="avg",
        crop_pct=1.0, crop_mode="squash" if res == 448 else "center")) for res in (256, 384, 448)},
    **{f"vit_medium_patch16_gap_{res}": ("medium", "gap", dict(
        img_size=res, qkv_bias=False, init_values=1e-6, num_classes=11821 if res == 240 else 1000, crop_pct=0.95,
        crop_mode="squash" if res == 384 else "center")) for res in (240, 256, 384)},
    "vit_huge_patch14_gap_224": ("huge", "gap", dict(patch_size=14, num_classes=0, **IMAGENET)),
    "vit_huge_patch16_gap_448": ("huge", "gap", dict(img_size=448, num_classes=0, crop_pct=1.0, **IMAGENET)),
    "vit_giant_patch16_gap_224": ("giant", "gap", dict(num_classes=0, **IMAGENET)),
    # residual post-norm blocks (timm's "rpn"); the tiny test models of timm's suite
    "vit_base_patch16_rpn_224": ("base", "", dict(block="res_post", qkv_bias=False, init_values=1e-5,
                                                   class_token=False, global_pool="avg")),
    "test_vit": ("test", "", dict(img_size=160, dynamic_img_size=True, crop_pct=0.95)),
    "test_vit2": ("test2", "", dict(img_size=160, init_values=1e-5, class_token=False, dynamic_img_size=True,
                                    global_pool="avg", reg_tokens=1, crop_pct=0.95)),
    "test_vit3": ("test3", "", dict(img_size=160, init_values=1e-5, class_token=False, pool_include_prefix=True,
                                    global_pool="map", reg_tokens=1, crop_pct=0.95)),
    # ---- AIMv2, BEiT-3, RADIO, InternViT, FlexiViT, the paper's sizes at other patches
    **{f"aimv2_{size}_patch14_{res}": (f"aimv2_{size}", "aimv2", dict(img_size=res))
       for size in ("large", "huge", "1b", "3b") for res in (224, 336, 448)},
    "beit3_base_patch16_224": ("base", "beit3", {}),
    "beit3_large_patch16_224": ("large", "beit3", {}),
    "vit_base_patch16_radio_v3": ("base", "radio", dict(reg_tokens=7, init_values=1e-5)),
    "vit_large_patch16_radio_v3": ("large", "radio", dict(reg_tokens=7, init_values=1e-5)),
    "vit_huge_patch16_radio_v3": ("huge", "radio", dict(reg_tokens=7)),
    "vit_huge_patch16_radio_v4": ("huge", "radio", dict(reg_tokens=9)),
    "vit_giant_patch16_radio_v3": ("giant2", "radio", dict(reg_tokens=7, mlp_dim=6144)),
    "vit_so400m_patch16_radio_v4": ("so400m", "radio", dict(reg_tokens=9)),
    "vit_intern300m_patch14_448": ("large", "", dict(patch_size=14, img_size=448, init_values=0.1, final_norm=False,
                                                     dynamic_img_size=True, num_classes=0, crop_pct=1.0, **IMAGENET)),
    "flexivit_small": ("small", "flexivit", {}),
    "flexivit_base": ("base", "flexivit", {}),
    "flexivit_large": ("large", "flexivit", {}),
    # MobileCLIP's image tower (Vasu et al. 2024): patchify convolutions with BatchNorm make the tokens
    "vit_base_mci_224": ("base", "", dict(patch_size=1, no_embed_class=True, num_classes=512, **RAW,
                                          backbone={"type": "conv_bn", "channels": [192, 192, 768],
                                                    "kernels": [4, 2, 2]})),
    "vit_small_patch8_224": ("small", "", dict(patch_size=8, num_classes=0, **IMAGENET)),
    "vit_base_patch16_224_miil": ("base", "", dict(qkv_bias=False, num_classes=11221, crop_pct=0.875,
                                                   interpolation="bilinear", **RAW)),
    # ---- timm's relative-position ViTs
    "vit_relpos_small_patch16_224": ("small", "relpos", dict(fc_norm=True)),
    "vit_relpos_medium_patch16_224": ("medium", "relpos", dict(fc_norm=True)),
    "vit_relpos_base_patch16_224": ("base", "relpos", dict(fc_norm=True)),
    "vit_relpos_base_patch16_clsgap_224": ("base", "relpos", dict(fc_norm=True, class_token=True)),
    "vit_relpos_medium_patch16_cls_224": ("medium", "relpos", dict(class_token=True, global_pool="token",
                                                                    rel_pos_dim=256)),
    "vit_srelpos_small_patch16_224": ("small", "relpos", dict(shared_rel_pos=True, rel_pos_dim=384)),
    "vit_srelpos_medium_patch16_224": ("medium", "relpos", dict(shared_rel_pos=True, rel_pos_dim=512)),
    "vit_relpos_medium_patch16_rpn_224": ("medium", "relpos", dict(block="res_post")),
    "vit_relpos_base_patch32_plus_rpn_256": ("base_plus", "relpos", dict(block="res_post", patch_size=32,
                                                                         img_size=256, qkv_bias=True)),
}


for _name, (_size, _recipe, _fields) in NAMES.items():
    register_model(_name, _entry(_size, _recipe, **_fields), f"timm's {_name}")


__all__ = ["SIZES", "RECIPES", "NAMES", "CLIP_MEAN", "CLIP_STD"]
