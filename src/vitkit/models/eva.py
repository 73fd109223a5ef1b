"""EVA-style ViTs with rotary positions, and BEiT: the family "eva" (timm's ``Eva`` and ``Beit``).

EVA-02 (Fang et al. 2023), timm's RoPE ViTs (``vit_*_rope_*``, Heo et al. 2024's axial and RoPE-Mixed),
Perception Encoder (Bolya et al. 2025) and DINOv3 (Siméoni et al. 2025) are ViTs whose attention rotates
queries and keys by the patches' positions (:class:`vitkit.models.positions.RotaryEmbedding`), with or
without a learned absolute table beside it. Everything else is the ViT's (:mod:`.vit`): this family's
config is a :class:`~vitkit.models.vit.ViTConfig` with the rotary fields and the attention and
LayerScale layouts timm's ``Eva`` stores:

- attention: ``qkv`` without a bias of its own plus ``q_bias`` / ``v_bias`` (EVA, BEiT: no k bias);
  ``qkv`` with a full bias (timm's ``attn_type='rope'``); or separate ``q_proj`` / ``k_proj`` / ``v_proj``
  (``qkv_fused=False``; k without a bias unless ``k_bias``);
- LayerScale as ``gamma_1`` / ``gamma_2`` of the block (timm's ``ls1.gamma`` in the ViT);
- SwiGLU MLPs: ``fc1_g`` / ``fc1_x`` with EVA-02's sub-LN (``mlp.norm``) or packed in one ``fc1``;
- BEiT (Bao et al. 2022) and BEiT v2 (Peng et al. 2022): the same layouts with a relative position bias
  table in every attention layer (``pos_embed='relative'``, the table on the layer as timm's Beit keeps it).

A bare state dict of this family does not hold its rotary kind or temperature (they have no tensors):
it is never read off the shapes; load it with its architecture's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from . import positions
from .config_base import _is_int
from .layers import Attention, Block, QVBiasAttention, RelativeQVBiasAttention, SplitAttention
from .registry import Family, register_family, register_model
from .vit import VisionTransformer, ViTConfig, vit_complexity
from .vit_names import CLIP, IMAGENET
from .vit_names import SIZES as VIT_SIZES


@dataclass
class EvaConfig(ViTConfig):
    """A ViT with rotary positions and EVA's attention and LayerScale layouts (see the module notes)."""

    KIND: ClassVar[str] = "EVA"

    architecture: str = "eva"
    #: timm's Eva pools the mean of the patches unless told otherwise
    global_pool: str = "avg"
    #: 'none', 'axial', 'mixed' or 'dinov3' (see :data:`vitkit.models.positions.ROPES`)
    rope: str = "axial"
    rope_temperature: float = 10000.0
    #: added to every patch index ('axial') or centre ('dinov3') before scaling
    rope_grid_offset: float = 0.0
    #: 'ij': the row's frequencies first; 'xy': the column's
    rope_grid_indexing: str = "ij"
    #: the grid whose index range the coordinates are scaled to ('axial'; EVA-02: 16x16); None: indices as they are
    rope_ref_grid: Optional[Tuple[int, int]] = None
    #: rotate the two halves of each head (DINOv3) rather than neighbouring pairs
    rope_half: bool = False
    #: DINOv3's training augmentation: every forward in training scales all coordinates by one factor
    #: drawn log-uniformly from [1/r, r] (None: off; it never acts in evaluation)
    rope_rescale_coords: Optional[float] = None
    #: separate q/k/v projections (False) or one fused ``qkv``
    qkv_fused: bool = True
    #: a bias on k too (timm's rope ViTs); EVA and BEiT have none, where it would cancel in the softmax
    k_bias: bool = False
    #: LayerScale on the attention branch only (Sapiens)
    attn_only_layer_scale: bool = False
    #: key/value heads of each block (grouped-query attention, Sapiens; needs qkv_fused=False); None: the heads
    kv_heads: Optional[List[int]] = None

    def __post_init__(self) -> None:
        if self.rope_ref_grid is not None and isinstance(self.rope_ref_grid, (list, tuple, int)):
            try:
                from .layers import to_2tuple

                self.rope_ref_grid = to_2tuple(self.rope_ref_grid)
            except ValueError:
                pass  # named by family_problems
        super().__post_init__()

    def replace(self, **overrides: Any) -> "EvaConfig":
        """As the ViT's; a new ``global_pool`` pools as timm's Eva does unless told: its attention pool reads every
        token (the class token and registers too), its mean the patches only."""
        pool = overrides.get("global_pool")
        if pool is not None and pool != self.global_pool and "pool_include_prefix" not in overrides:
            overrides["pool_include_prefix"] = pool == "map"
        return super().replace(**overrides)

    def family_problems(self) -> List[str]:
        problems = super().family_problems()
        if self.rope not in positions.ROPES:
            problems.append(f"rope must be one of {positions.ROPES}, got {self.rope!r}")
        if self.rope_grid_indexing not in ("ij", "xy"):
            problems.append(f"rope_grid_indexing must be 'ij' or 'xy', got {self.rope_grid_indexing!r}")
        for name in ("rope_temperature", "rope_grid_offset"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value \
                    or abs(value) == float("inf"):
                problems.append(f"{name} must be a finite number, got {value!r}")
        if isinstance(self.rope_temperature, (int, float)) and self.rope_temperature <= 0:
            problems.append(f"rope_temperature must be positive, got {self.rope_temperature!r}")
        ref = self.rope_ref_grid
        if ref is not None and not (isinstance(ref, tuple) and len(ref) == 2
                                    and all(_is_int(r) and r > 0 for r in ref)):
            problems.append(f"rope_ref_grid must be a pair of positive integers or null, got {ref!r}")
        r = self.rope_rescale_coords
        if r is not None and not (isinstance(r, (int, float)) and not isinstance(r, bool) and 1 <= r < 100):
            problems.append(f"rope_rescale_coords must be a factor in [1, 100) or null, got {r!r}")
        head = self.embed_dim // self.num_heads if _is_int(self.embed_dim) and _is_int(self.num_heads) \
            and self.num_heads > 0 else None
        if self.rope != "none" and head is not None and head % 4:
            problems.append(f"rotary positions need a head width divisible by 4, got {head} "
                            f"(embed_dim {self.embed_dim} / {self.num_heads} heads)")
        if self.pos_embed not in ("learned", "none", "relative"):
            problems.append(f"pos_embed must be 'learned', 'none' or 'relative' (BEiT's bias tables) in an EVA "
                            f"model, got {self.pos_embed!r}")
        if self.pos_embed == "relative" and not (self.qkv_fused and not self.k_bias):
            problems.append("pos_embed='relative' is BEiT's layout: fused qkv with q/v biases (qkv_fused=True, "
                            "k_bias=False)")
        if self.kv_heads is not None:
            kv = self.kv_heads
            if not (isinstance(kv, (list, tuple)) and _is_int(self.depth) and len(kv) == self.depth
                    and all(_is_int(h) and h > 0 and _is_int(self.num_heads) and self.num_heads % h == 0
                            for h in kv)):
                problems.append(f"kv_heads must list, for each of the {self.depth} blocks, a divisor of num_heads "
                                f"{self.num_heads}, got {kv!r}")
            elif self.qkv_fused:
                problems.append("kv_heads (grouped-query attention) needs separate projections (qkv_fused=False)")
            else:
                self.kv_heads = [int(h) for h in kv]
        if self.block != "pre" or self.distill_token or self.backbone is not None or self.diff_attn:
            problems.append("EVA models are pre-norm ViTs without a distillation token, a CNN backbone or "
                            "differential attention")
        return problems


class EvaBlock(Block):
    """A pre-norm block whose LayerScale is ``gamma_1`` / ``gamma_2`` (EVA's and BEiT's names);
    ``attn_only`` keeps the attention branch's alone (Sapiens)."""

    def __init__(self, dim: int, *args, init_values: Optional[float] = None, attn_only: bool = False, **kwargs):
        super().__init__(dim, *args, init_values=None, **kwargs)
        self.gamma_1 = nn.Parameter(torch.full((dim,), float(init_values))) if init_values is not None else None
        self.gamma_2 = nn.Parameter(torch.full((dim,), float(init_values))) \
            if init_values is not None and not attn_only else None

    def scale_attn(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.gamma_1 is None else self.gamma_1 * y

    def scale_mlp(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.gamma_2 is None else self.gamma_2 * y


class Eva(VisionTransformer):
    """A ViT with rotary positions (see the module notes); ``forward`` etc. as every token model."""

    config_cls = EvaConfig

    @property
    def map_gelu(self) -> str:
        return "exact"  # timm's Eva builds its attention pool's MLP with nn.GELU whatever the blocks use

    def build_rope(self) -> None:
        cfg = self.config
        if cfg.rope == "none":
            self.rope = None
            return
        self.rope = positions.RotaryEmbedding(
            cfg.rope, cfg.embed_dim // cfg.num_heads, cfg.num_heads, cfg.depth, self.patch_embed.grid_size,
            cfg.rope_temperature, cfg.rope_grid_offset, cfg.rope_grid_indexing, cfg.rope_ref_grid, cfg.rope_half,
            cfg.rope_rescale_coords)

    def build_attention(self, norm, i: int = 0) -> nn.Module:
        cfg = self.config
        kw = dict(qk_norm=norm if cfg.qk_norm else None, inner_norm=norm if cfg.attn_norm else None,
                  proj_bias=cfg.proj_bias)
        args = (cfg.embed_dim, cfg.num_heads, cfg.qkv_bias, cfg.attn_drop_rate, cfg.drop_rate, cfg.attn_impl)
        if not cfg.qkv_fused:
            return SplitAttention(*args, k_bias=cfg.k_bias, kv_heads=cfg.kv_heads[i] if cfg.kv_heads else None, **kw)
        if cfg.pos_embed == "relative":  # BEiT: the layer holds its relative-bias table
            return RelativeQVBiasAttention(*args, **kw)
        return (Attention if cfg.k_bias else QVBiasAttention)(*args, **kw)

    def assemble_block(self, drop_path: float, norm, attn: nn.Module, mlp: nn.Module) -> nn.Module:
        """A pre-norm block with LayerScale as ``gamma_1`` / ``gamma_2``."""
        cfg = self.config
        return EvaBlock(cfg.embed_dim, cfg.num_heads, cfg.mlp_dim, drop_path=drop_path, init_values=cfg.init_values,
                        attn_only=cfg.attn_only_layer_scale, norm=norm, attn=attn, mlp=mlp)

    @torch.no_grad()
    def init_weights(self) -> None:
        """The ViT's initialisation (:meth:`VisionTransformer.init_weights`); LayerScale starts at
        ``init_values`` and RoPE-Mixed's frequencies as the paper's (made with the module)."""
        super().init_weights()

    def no_weight_decay(self) -> set:
        """Also RoPE-Mixed's frequencies (timm's rule)."""
        return super().no_weight_decay() | ({"rope.freqs"} if getattr(self.rope, "kind", None) == "mixed" else set())


# ----------------------------------------------------------------------------- the family description


#: BEiT's own relative-bias table, in the attention itself (a vitkit ViT's sits in ``attn.rel_pos``)
BEIT_TABLE = "blocks.0.attn.relative_position_bias_table"


def is_eva_state_dict(keys: Collection[str]) -> bool:
    """timm's Eva names: LayerScale as ``gamma_1``, split projections, q/v biases (BEiT's with its relative
    tables), or RoPE-Mixed's frequencies."""
    keys = set(keys)
    if "patch_embed.proj.weight" not in keys:
        return False
    if BEIT_TABLE in keys:
        return "blocks.0.attn.q_bias" in keys
    return not any("relative_position" in k for k in keys) and (
        "rope.freqs" in keys or any(k.endswith((".gamma_1", ".attn.q_proj.weight", ".attn.q_bias")) for k in keys))


def _size_of_table(rows: int, patch: Tuple[int, int], given: Any) -> Tuple[int, int]:
    """The image size a BEiT relative-bias table of no square grid was made at: the size asked for, where its
    (2 gh - 1)(2 gw - 1) + 3 rows are the table's (a bare file was refused even with its size given)."""
    if given is None:
        raise ValueError(f"cannot infer the image size from a relative-bias table of {rows} rows (a square grid "
                         f"has (2 g - 1)^2 + 3; another shape has several readings): pass img_size= (--img-size H "
                         f"W), or load it from its hub folder")
    h, w = (given, given) if isinstance(given, int) else tuple(given)
    gh, gw = h // patch[0], w // patch[1]
    if (2 * gh - 1) * (2 * gw - 1) + 3 != rows:
        raise ValueError(f"a relative-bias table of {rows} rows is no {gh}x{gw} grid of {patch[0]}x{patch[1]} "
                         f"patches ({h}x{w} px), which has {(2 * gh - 1) * (2 * gw - 1) + 3}: give the size it was "
                         f"trained at")
    return h, w


def infer_eva_config(sd: Mapping[str, Any], **overrides: Any) -> EvaConfig:
    """BEiT's architecture off its tensors (its heads are its tables' columns, its grid their rows); the rotary
    models are refused: no tensor holds their positions."""
    if BEIT_TABLE not in sd:
        raise ValueError("an EVA-style state dict (EVA-02, RoPE ViTs, DINOv3, Perception Encoder) does not hold its "
                         "rotary positions (kind, temperature, grid: no tensors): load it with its architecture "
                         "(model_name= or --model, e.g. eva02_base_patch14_224), or from its hub folder")
    from .registry import get_model_config

    D, C, ph, pw = (int(n) for n in sd["patch_embed.proj.weight"].shape)
    rows, heads = (int(n) for n in sd[BEIT_TABLE].shape)
    side = positions.square_table_side(rows - 3)  # the class token's three rows off
    size = _size_of_table(rows, (ph, pw), overrides.get("img_size")) if side is None else (side * ph, side * pw)
    fields: Dict[str, Any] = dict(
        name=None, embed_dim=D, in_chans=C, patch_size=(ph, pw), img_size=size, num_heads=heads,
        depth=1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks.")),
        mlp_dim=int(sd["blocks.0.mlp.fc1.weight"].shape[0]),
        init_values=0.1 if "blocks.0.gamma_1" in sd else None,
        global_pool="avg" if "fc_norm.weight" in sd else "token",
        num_classes=int(sd["head.weight"].shape[0]) if "head.weight" in sd else 0)
    fields.update(overrides)
    return get_model_config("beit_base_patch16_224").replace(**fields)


#: timm ``Eva`` model_args -> EvaConfig fields (the same meaning under other names)
_EVA_RENAMED = {"num_reg_tokens": "reg_tokens", "scale_attn_inner": "attn_norm", "scale_mlp": "mlp_norm",
                "use_pre_transformer_norm": "pre_norm", "rope_temperature": "rope_temperature",
                "rope_grid_offset": "rope_grid_offset", "rope_grid_indexing": "rope_grid_indexing",
                "rope_rotate_half": "rope_half", "rope_rescale_coords": "rope_rescale_coords",
                "qkv_fused": "qkv_fused", "qk_norm": "qk_norm", "init_values": "init_values",
                "attn_only_layer_scale": "attn_only_layer_scale", "class_token": "class_token",
                "no_embed_class": "no_embed_class", "embed_dim": "embed_dim", "drop_path_rate": "drop_path_rate",
                "attn_drop_rate": "attn_drop_rate", "use_fc_norm": "fc_norm"}
_EVA_INERT = ("img_size", "patch_size", "in_chans", "num_classes", "global_pool", "qkv_bias", "dynamic_img_size",
              "depth", "num_heads", "drop_rate", "pos_drop_rate", "proj_drop_rate", "patch_drop_rate",
              "head_init_scale", "dynamic_img_pad", "mlp_ratio", "use_post_transformer_norm",
              "use_abs_pos_emb", "use_rot_pos_emb", "rope_type", "ref_feat_shape", "attn_type",
              "attn_pool_num_heads", "attn_pool_mlp_ratio", "swiglu_mlp", "swiglu_align_to", "num_kv_heads")


def eva_timm_args(args: Mapping[str, Any], config: EvaConfig) -> Dict[str, Any]:
    """timm's Eva ``model_args`` -> EvaConfig fields; the MLP kind and the norms' placement come with the
    architecture's name (a change of them is refused by name, as any argument vitkit does not read)."""
    kw = {ours: args[theirs] for theirs, ours in _EVA_RENAMED.items() if args.get(theirs) is not None}
    unknown = sorted(k for k in args if k not in _EVA_RENAMED and k not in _EVA_INERT)
    if unknown:
        raise ValueError(f"timm Eva model_args {', '.join(unknown)} are not read by vitkit; remove them or build the "
                         f"model with vitkit's fields")
    fixed = [k for k in ("swiglu_mlp", "swiglu_align_to", "use_post_transformer_norm", "rope_type",
                         "attn_type", "num_kv_heads") if k in args]
    if fixed:
        raise ValueError(f"timm Eva model_args {', '.join(fixed)} change the architecture of its name; vitkit reads "
                         f"them from the name only")
    if "use_abs_pos_emb" in args:
        kw["pos_embed"] = "learned" if args["use_abs_pos_emb"] else "none"
    if "use_rot_pos_emb" in args and not args["use_rot_pos_emb"]:
        kw["rope"] = "none"
    if args.get("ref_feat_shape") is not None:
        kw["rope_ref_grid"] = args["ref_feat_shape"]
    if args.get("attn_pool_num_heads") is not None:
        kw["map_heads"] = int(args["attn_pool_num_heads"])
    width = kw.get("embed_dim", config.embed_dim)
    if args.get("attn_pool_mlp_ratio") is not None:
        kw["map_mlp_dim"] = int(width * args["attn_pool_mlp_ratio"])
    if args.get("mlp_ratio") is not None or "embed_dim" in kw:  # timm's hidden width follows the width given
        ratio = args["mlp_ratio"] if args.get("mlp_ratio") is not None else config.mlp_dim / config.embed_dim
        kw["mlp_dim"] = int(width * ratio)
    return kw


def eva_timm_config(config: EvaConfig) -> Dict[str, Any]:
    return config.to_dict()


FAMILY = register_family(Family(
    name="eva", config_cls=EvaConfig, model_cls=Eva, complexity=vit_complexity, matches=is_eva_state_dict,
    infer_config=infer_eva_config, detect_priority=5, to_timm=lambda m: {
        k: v.detach().cpu().contiguous() for k, v in m.state_dict().items()},
    timm_args=eva_timm_args, timm_config=eva_timm_config, layouts=("timm", "hf")))


# ----------------------------------------------------------------------------- names: timm's

#: the recipes: what each family's weights share (timm's arguments, in vitkit's fields)
RECIPES: Dict[str, Dict[str, Any]] = {
    # EVA-02 (Fang et al. 2023): axial RoPE scaled to a 16x16 grid, SwiGLU (with sub-LN from base up),
    # mean pooling; the ImageNet models at patch 14
    "eva02": dict(patch_size=14, mlp="swiglu_packed", rope="axial", rope_ref_grid=(16, 16), global_pool="avg",
                  crop_pct=1.0, **CLIP),
    "eva02_subln": dict(patch_size=14, mlp="swiglu", mlp_norm=True, qkv_fused=False, rope="axial",
                        rope_ref_grid=(16, 16), global_pool="avg", crop_pct=1.0, **CLIP),
    "eva02_clip": dict(mlp="swiglu", mlp_norm=True, attn_norm=True, qkv_fused=False, rope="axial",
                       rope_ref_grid=(16, 16), global_pool="token", crop_pct=1.0, **CLIP),
    # timm's ImageNet-12k RoPE ViTs: registers, mean pooling, no absolute table
    "rope_reg_gap": dict(rope="axial", rope_ref_grid=(16, 16), pos_embed="none", init_values=1e-5,
                         class_token=False, global_pool="avg", img_size=256, crop_pct=0.95),
    # Heo et al. 2024's RoPE ViTs (DeiT III recipe): axial (T = 100) or RoPE-Mixed (T = 10), x before y,
    # with or without the absolute table ('ape'); the full qkv bias of timm's AttentionRope
    "rope_axial": dict(rope="axial", rope_temperature=100.0, rope_grid_indexing="xy", pos_embed="none", k_bias=True,
                       init_values=1e-5, global_pool="token", **IMAGENET),
    "rope_mixed": dict(rope="mixed", rope_temperature=10.0, rope_grid_indexing="xy", pos_embed="none", k_bias=True,
                       init_values=1e-5, global_pool="token", **IMAGENET),
    # Perception Encoder (Bolya et al. 2025): ln_pre, axial RoPE (x first, from index 1) scaled to the
    # reference grid beside the absolute table; core: an attention pool of 8 heads over every token (the
    # class token too); spatial / lang: the mean of the patches, no final norm
    "pe_core": dict(pre_norm=True, norm_eps=1e-5, rope="axial", rope_grid_offset=1.0, rope_grid_indexing="xy",
                    k_bias=True, global_pool="map", map_heads=8, pool_include_prefix=True, crop_pct=1.0),
    "pe_spatial": dict(pre_norm=True, norm_eps=1e-5, rope="axial", rope_grid_offset=1.0, rope_grid_indexing="xy",
                       k_bias=True, final_norm=False, fc_norm=False, num_classes=0, crop_pct=1.0),
    "sapiens2": dict(rope="dinov3", rope_temperature=100.0, rope_half=True, rope_rescale_coords=2.0, pos_embed="none",
                     reg_tokens=8, qkv_fused=False, k_bias=True, qk_norm=True, mlp="swiglu_packed", init_values=1.0,
                     attn_only_layer_scale=True, norm="rmsnorm", norm_eps=1e-6, global_pool="token", fc_norm=False,
                     dynamic_img_size=True, img_size=(1024, 768), num_classes=0, crop_pct=1.0,
                     interpolation="bilinear", **IMAGENET),
    # BEiT and BEiT v2: relative position bias per layer, no absolute table, mean pooling, LayerScale; at
    # another size the tables are resampled as BEiT's fine-tuning code and timm resample them
    "beit": dict(rope="none", pos_embed="relative", init_values=0.1, rel_pos_resize="geometric"),
    "beitv2": dict(rope="none", pos_embed="relative", init_values=1e-5, rel_pos_resize="geometric", **IMAGENET),
    # DINOv3 (Siméoni et al. 2025): its own RoPE (coordinates in [-1, 1], T = 100, halves rotated), 4 registers,
    # no absolute table, LayerNorm eps 1e-5, any input size; "qkvb": with the q/v biases
    "dinov3": dict(rope="dinov3", rope_temperature=100.0, rope_half=True, pos_embed="none", reg_tokens=4,
                   init_values=1e-5, qkv_bias=False, norm_eps=1e-5, fc_norm=False, dynamic_img_size=True,
                   img_size=256, num_classes=0, crop_pct=1.0, **IMAGENET),
}


#: the sizes: the ViT's, and DINOv3's "plus" sizes (SwiGLU)
SIZES = {**VIT_SIZES, "small_plus": (384, 12, 6, 1536), "huge_plus": (1280, 32, 20, 5120)}


def _entry(size: str, recipe: str, **fields: Any) -> EvaConfig:
    width, depth, heads, mlp = SIZES[size]
    kw: Dict[str, Any] = dict(embed_dim=width, depth=depth, num_heads=heads, mlp_dim=mlp)
    kw.update(RECIPES[recipe])
    kw.update(fields)
    return EvaConfig(**kw)


#: SwiGLU widths: EVA-02's 2.67 x width (8/3), DINOv3's own
_E2 = {"tiny": 512, "small": 1024, "base": 2048, "large": 2730}
NAMES: Dict[str, Tuple[str, str, Dict[str, Any]]] = {
    **{f"eva02_{size}_patch14_{res}": (size, "eva02" if size in ("tiny", "small") else "eva02_subln",
                                       dict(img_size=res, mlp_dim=_E2[size], num_classes=1000 if res > 224 else 0,
                                            crop_pct=0.9 if res == 224 else 1.0,
                                            crop_mode="squash" if res == 448 else "center"))
       for size, res in (("tiny", 224), ("tiny", 336), ("small", 224), ("small", 336), ("base", 224),
                         ("base", 448), ("large", 224), ("large", 448))},
    "eva02_base_patch16_clip_224": ("base", "eva02_clip", dict(mlp_dim=2048, num_classes=512, crop_pct=0.9)),
    "eva02_large_patch14_clip_224": ("large", "eva02_clip", dict(patch_size=14, mlp_dim=2730, num_classes=768,
                                                                 crop_pct=0.9)),
    "eva02_large_patch14_clip_336": ("large", "eva02_clip", dict(patch_size=14, img_size=336, mlp_dim=2730,
                                                                 num_classes=768)),
    "vit_medium_patch16_rope_reg1_gap_256": ("medium", "rope_reg_gap", dict(reg_tokens=1)),
    "vit_mediumd_patch16_rope_reg1_gap_256": ("mediumd", "rope_reg_gap", dict(reg_tokens=1, qkv_bias=False)),
    "vit_betwixt_patch16_rope_reg4_gap_256": ("betwixt", "rope_reg_gap", dict(reg_tokens=4, **CLIP)),
    "vit_base_patch16_rope_reg1_gap_256": ("base", "rope_reg_gap", dict(reg_tokens=1)),
    **{f"vit_{size}_patch16_rope{mixed}{ape}_224": (size, f"rope{mixed or '_axial'}", dict(
        pos_embed="learned" if ape else "none", no_embed_class=bool(ape)))
       for size in ("small", "base", "large") for mixed in ("", "_mixed") for ape in ("", "_ape")},
    "vit_pe_core_tiny_patch16_384": ("tiny", "pe_core", dict(img_size=384, rope_ref_grid=(24, 24), num_classes=512)),
    "vit_pe_core_small_patch16_384": ("small", "pe_core", dict(img_size=384, rope_ref_grid=(24, 24),
                                                               num_classes=512)),
    "vit_pe_core_base_patch16_224": ("base", "pe_core", dict(rope_ref_grid=(14, 14), num_classes=1024)),
    "vit_pe_core_large_patch14_336": ("large", "pe_core", dict(patch_size=14, img_size=336, rope_ref_grid=(24, 24),
                                                               num_classes=1024)),
    **{f"vit_pe_spatial_{size}_patch16_512": (size, "pe_spatial", dict(img_size=512, rope_ref_grid=(32, 32)))
       for size in ("tiny", "small", "base")},
    "vit_pe_spatial_large_patch14_448": ("large", "pe_spatial", dict(patch_size=14, img_size=448,
                                                                     rope_ref_grid=(32, 32))),
    # the language tower's encoder: the large model without its last block, LayerScale 0.1
    "vit_pe_lang_large_patch14_448": ("large", "pe_spatial", dict(patch_size=14, img_size=448, rope_ref_grid=(32, 32),
                                                                  init_values=0.1, depth=23)),
    **{f"vit_{size}_patch16_dinov3{qkvb}": (size, "dinov3", dict(qkv_bias=bool(qkvb)))
       for size in ("small", "base", "large") for qkvb in ("", "_qkvb")},
    "vit_tiny_patch16_dinov3_qkvb": ("tiny", "dinov3", dict(qkv_bias=True)),
    **{f"vit_{size}_patch16_dinov3{qkvb}": (size, "dinov3", dict(qkv_bias=bool(qkvb), mlp="swiglu", mlp_dim=hidden))
       for size, hidden in (("small_plus", 1536), ("huge_plus", 5120)) for qkvb in ("", "_qkvb")},
    **{f"vit_{size}_patch16_lingbot": (size, "dinov3", dict(qkv_bias=True, global_pool="token", crop_mode="squash",
                                                            interpolation="bilinear"))
       for size in ("small", "base", "large")},
    # Sapiens 2 (human-centric DINOv3-style encoders at 1024 x 768): RMSNorm, q/k norms, split projections with
    # full biases and grouped-query attention in the middle blocks, LayerScale on attention only, 8 registers
    **{f"vit_{size}_patch16_sapiens2": (size, "sapiens2", dict(kv_heads=kv, crop_mode="squash")) for size, kv in (
        ("base", [12] * 12), ("large", [16] * 8 + [8] * 8 + [16] * 8), ("huge", [16] * 8 + [8] * 16 + [16] * 8))},
    "beit_base_patch16_224": ("base", "beit", {}),
    "beit_base_patch16_384": ("base", "beit", dict(img_size=384, crop_pct=1.0)),
    "beit_large_patch16_224": ("large", "beit", dict(init_values=1e-5)),
    "beit_large_patch16_384": ("large", "beit", dict(img_size=384, init_values=1e-5, crop_pct=1.0)),
    "beit_large_patch16_512": ("large", "beit", dict(img_size=512, init_values=1e-5, crop_pct=1.0)),
    "beitv2_base_patch16_224": ("base", "beitv2", {}),
    "beitv2_large_patch16_224": ("large", "beitv2", dict(crop_pct=0.95)),
}
for _name, (_size, _recipe, _fields) in NAMES.items():
    register_model(_name, _entry(_size, _recipe, **_fields), f"timm's {_name}")


__all__ = ["EvaConfig", "Eva", "EvaBlock", "FAMILY", "RECIPES", "NAMES", "is_eva_state_dict", "eva_timm_args"]
