"""The ViT family's reading of a bare state dict: which tensor names are a ViT's, and the config fields its
names and shapes hold (width, depth, tokens, pooling, the blocks' kind and parts, the grid). What no tensor
holds -- the heads of a fused qkv matrix, the norms' eps, the GELU -- is the family's to add
(:func:`vitkit.models.vit.infer_vit_config`)."""

from __future__ import annotations

import math
import re
from typing import Any, Collection, Dict, Mapping, Optional, Tuple

from . import positions
from .hybrid import backbone_channels, backbone_in_chans, backbone_reduction, infer_backbone
from .sizes import IntPair

#: a hybrid whose CNN makes the tokens (MobileCLIP's stem) has no patch projection: this names its first layer
EMBEDDING_STEM = "patch_embed.backbone.0.bn.running_var"
#: the first layer of timm's relative-bias MLP, in every block or one shared by all (its rows: the hidden width)
REL_POS_MLP, SHARED_REL_POS_MLP = "blocks.0.attn.rel_pos.mlp.fc1.weight", "shared_rel_pos.mlp.fc1.weight"


def is_vit_state_dict(keys: Collection[str]) -> bool:
    """timm/vitkit names of a patch-token model: every family has a patch projection, so this
    recogniser is asked last (more specific families first)."""
    return "patch_embed.proj.weight" in keys or EMBEDDING_STEM in keys


def vit_fields(sd: Mapping[str, Any], img_size: Optional[IntPair] = None) -> Dict[str, Any]:
    """The ViTConfig fields a timm/vitkit-named state dict holds (all but the heads); ValueError naming what
    is missing when it is no ViT's. ``img_size``: the size the caller asks for, read as the stored one where
    the table's length cannot say it (a non-square grid)."""
    if "patch_embed.proj.weight" not in sd and EMBEDDING_STEM not in sd:
        raise ValueError("not a ViT state dict: 'patch_embed.proj.weight' is missing")
    try:
        backbone = infer_backbone(sd)
    except ValueError as e:
        raise ValueError(f"hybrid backbone: {e}") from None
    if "patch_embed.proj.weight" in sd:
        D, C, ph, pw = (int(s) for s in sd["patch_embed.proj.weight"].shape)
    else:  # the CNN's last layer made the tokens
        D, C, ph, pw = backbone_channels(backbone), 0, 1, 1
    if backbone is not None:
        C = backbone_in_chans(sd)
    block_ids = {int(k.split(".")[1]) for k in sd if k.startswith("blocks.")}
    if not block_ids:
        raise ValueError("no transformer blocks ('blocks.N.*') in the state dict")
    class_token = "cls_token" in sd
    distill_token = "dist_token" in sd  # DeiT's distilled models
    registers = int(sd["reg_token"].shape[1]) if "reg_token" in sd else 0
    has_fc_norm = "fc_norm.weight" in sd
    attn_pool = "attn_pool.latent" in sd
    pool = "map" if attn_pool else "token" if class_token and not has_fc_norm else "avg"
    kw: Dict[str, Any] = dict(
        embed_dim=D, in_chans=C, patch_size=(ph, pw), depth=max(block_ids) + 1,
        class_token=class_token, distill_token=distill_token, reg_tokens=registers,
        distill_head=not (distill_token and "head.weight" in sd and "head_dist.weight" not in sd),
        global_pool=pool, fc_norm=None if has_fc_norm or class_token else False,
        num_classes=int(sd["head.weight"].shape[0]) if "head.weight" in sd else 0,
        representation_size=int(sd["pre_logits.fc.weight"].shape[0]) if "pre_logits.fc.weight" in sd else None,
        pre_norm="norm_pre.weight" in sd, patch_bias="patch_embed.proj.bias" in sd,
        embed_norm="patch_embed.norm.weight" in sd,
        final_norm="norm.weight" in sd or has_fc_norm,
        pos_embed=_position_kind(sd), backbone=backbone,
        **_block_fields(sd, D),
    )
    if kw["pos_embed"] == "relative_mlp":
        kw["shared_rel_pos"] = SHARED_REL_POS_MLP in sd
        kw["rel_pos_dim"] = int(sd[SHARED_REL_POS_MLP if kw["shared_rel_pos"] else REL_POS_MLP].shape[0])
    if attn_pool:
        kw["map_mlp_dim"] = int(sd["attn_pool.mlp.fc1.weight"].shape[0])
    kw.update(_infer_img_size(sd, kw["pos_embed"], class_token, int(class_token) + int(distill_token) + registers,
                              backbone, (ph, pw), img_size, registers))
    return kw


_NORM_BIAS = re.compile(r"(blocks\.\d+\.(norm1|norm2|in_norm)|norm|fc_norm)\.bias")


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def grid_at_size(slots: int, prefix: int, backbone: Optional[Dict[str, Any]], patch: IntPair,
                given: IntPair) -> Dict[str, Any]:
    """``img_size`` for a table of no square grid: the size asked for, when its grid has the table's slots
    (timm/vitkit state dicts and the official npz files read it the same way)."""
    r = backbone_reduction(backbone) if backbone is not None else 1
    grid = (given[0] // (patch[0] * r), given[1] // (patch[1] * r))
    n = grid[0] * grid[1]
    if slots == n + prefix:
        return {"img_size": given}
    if prefix and slots == n:
        return {"img_size": given, "no_embed_class": True}
    raise ValueError(f"a position embedding of {slots} slots is no {grid[0]} x {grid[1]} grid "
                     f"(img_size={given}{f' with {prefix} prefix tokens' if prefix else ''}): pass the size it "
                     f"was trained at")


def _position_kind(sd: Mapping[str, Any]) -> str:
    """The position scheme its tensors show: a learned table, BEiT's per-layer bias tables, timm's relative-bias
    MLP (``vit_relpos``/``vit_srelpos``: per layer or shared) or none (rotary positions have no tensors)."""
    if "pos_embed" in sd:
        return "learned"
    if f"blocks.0.{positions.RELATIVE_TABLE}" in sd:
        return "relative"
    return "relative_mlp" if REL_POS_MLP in sd or SHARED_REL_POS_MLP in sd else "none"


def _block_fields(sd: Mapping[str, Any], D: int) -> Dict[str, Any]:
    """The blocks' kind and parts off the first block's names: pre-norm or parallel (timm's
    ParallelScalingBlock: one input projection, one norm), differential attention, the MLP, biases, norms."""
    parallel = "blocks.0.in_proj.weight" in sd
    attn = "blocks.0." if parallel else "blocks.0.attn."  # where the attention's own parameters are
    if parallel:
        mlp, fc2_in = "mlp", int(sd["blocks.0.in_proj.weight"].shape[0]) - 3 * D
        qkv, proj = "blocks.0.in_proj.bias", ("blocks.0.attn_out_proj.bias", "blocks.0.out_proj.bias")
    else:
        mlp, fc2_in = _infer_mlp(sd)
        qkv, proj = "blocks.0.attn.qkv.bias", ("blocks.0.attn.proj.bias",)
    return dict(
        block="parallel" if parallel else "pre", diff_attn=f"{attn}lambda_q1" in sd, mlp=mlp, mlp_dim=fc2_in,
        init_values=1e-5 if "blocks.0.ls1.gamma" in sd or "blocks.0.ls.gamma" in sd else None,
        qkv_bias=qkv in sd, proj_bias=any(k in sd for k in proj), qk_norm=f"{attn}q_norm.weight" in sd,
        attn_norm="blocks.0.attn.norm.weight" in sd, mlp_norm="blocks.0.mlp.norm.weight" in sd,
        # RMSNorm has no bias: any norm's (one missing bias was read as RMSNorm everywhere, and every other
        # norm's bias was then blamed as "not in the model")
        norm="layernorm" if any(_NORM_BIAS.fullmatch(k) for k in sd) else "rmsnorm",
    )


def _infer_mlp(sd: Mapping[str, Any]) -> Tuple[str, int]:
    """The MLP kind of the blocks and the width ``fc2`` reads."""
    swiglu = "blocks.0.mlp.fc1_g.weight" in sd
    fc1 = sd["blocks.0.mlp.fc1_g.weight" if swiglu else "blocks.0.mlp.fc1.weight"]
    fc2_in = int(sd["blocks.0.mlp.fc2.weight"].shape[1])
    packed = not swiglu and int(fc1.shape[0]) == 2 * fc2_in  # SwiGLU's gate and value in one fc1
    return "swiglu" if swiglu else "swiglu_packed" if packed else "mlp", fc2_in


def _infer_img_size(sd: Mapping[str, Any], pos_embed: str, class_token: bool, prefix: int,
                    backbone: Optional[Dict[str, Any]], patch: IntPair, given: Optional[IntPair] = None,
                    registers: int = 0) -> Dict[str, Any]:
    """``img_size`` (and ``no_embed_class`` for a table over the patches only), read off the learned
    position table or the relative-bias table; nothing when the positions store no grid. A table of no
    square grid is read at ``given`` (the size asked for) when it fits it. A table that is a square grid
    both with and without the prefix slots (9 slots beside a class token and 4 registers: 3 x 3, or 2 x 2
    after 5 prefix slots) is read over the patches only where there are registers, as every model with
    registers keeps its table (timm's, DINOv2's): a 42 px DINOv2-reg tower was read as a 28 px one."""
    ph, pw = patch
    found: Dict[str, Any] = {}
    if pos_embed == "learned":
        slots = int(sd["pos_embed"].shape[1])
        n = slots - prefix
        if prefix and given is not None and _is_square(slots) and not _is_square(n) and not registers:
            try:  # 25 slots at 64 x 96 px: a class slot and 4 x 6 patches, not a 5 x 5 table without one
                return grid_at_size(slots, prefix, backbone, patch, tuple(given))
            except ValueError:
                pass  # another size: the square table, resampled
        if prefix and _is_square(slots) and (not _is_square(n) or registers):
            n, found["no_embed_class"] = slots, True  # a table over the patches only (DeiT III, DINOv2-reg)
        side = math.isqrt(max(n, 0))
        if side * side != n and given is not None:
            return grid_at_size(slots, prefix, backbone, patch, tuple(given))
        if side * side != n or not n:
            held = f"{slots} slots (no square grid with or without its {prefix} prefix slot(s))" if prefix else \
                f"{n} patch slots"  # (a DeiT III table holds no class slot: "5 patch slots" of its 6 misled)
            raise ValueError(f"cannot infer the image size from a position embedding with {held}; pass img_size= "
                             f"(--img-size H W)")
    elif pos_embed == "relative":  # (2 g - 1)^2 offsets (+ 3 rows for a class token): a square grid
        offsets = int(sd[f"blocks.0.{positions.RELATIVE_TABLE}"].shape[0]) - 3 * int(class_token)
        side = positions.square_table_side(offsets)
        if side is None:
            raise ValueError(f"cannot infer the image size from a relative-bias table of {offsets} offsets; "
                             f"pass img_size=")
    else:
        return found
    r = backbone_reduction(backbone) if backbone is not None else 1
    found["img_size"] = (side * ph * r, side * pw * r)
    return found


__all__ = ["EMBEDDING_STEM", "is_vit_state_dict", "vit_fields", "grid_at_size"]
