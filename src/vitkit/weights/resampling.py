"""How a loaded position table meets a model of another size: the grid and prefix slots the weights' own
config says their table has (:func:`stored_table`), and the resampling, as the weights' library resamples or as
the caller names it (:func:`load_resampling`); the table fitted to the model with both (:func:`adapt_pos_embed`),
after the prefix tokens it has slots for are checked against the model's (:func:`check_prefix_tokens`)."""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from ..models import build_from_config, config_from_dict, positions
from ..models.layers import INTERPOLATIONS, resample_pos_embed
from ..models.positions import table_grid
from . import timm_format
from .io import WeightsError


def stored_table(src: Any) -> Dict[str, Any]:
    """The grid and prefix slots of the position table a source (:class:`.load.Source`) describes in its own
    config (a vitkit or a timm hub config.json), read off that model built on the meta device: a table of another
    length was cut or mixed with other weights, and a table of a 4x6 grid is not read as one of 6x4 or of a
    square. Empty where no config says (bare tensors: their shapes are read as before) or where the config does
    not build (its own check says why)."""
    cj = src.config_json or {}
    try:
        if src.pretraining:
            return {}
        if src.format == "vitkit" and isinstance(cj.get("config"), dict):
            config = config_from_dict(cj["config"])
        elif src.format == "timm" and "architecture" in cj:
            config = timm_format.config_from_hub(cj, src.tensors, stored=True)
        else:
            return {}
        with torch.device("meta"):
            stored = build_from_config(config)
    except (ValueError, TypeError, KeyError):  # WeightsError is a ValueError
        return {}
    if getattr(stored, "pos_embed_kind", None) is None:
        return {}  # a CNN: no positions
    facts: Dict[str, Any] = {"grid": table_grid(stored)}
    if getattr(stored, "pos_embed", None) is not None:
        facts["pos_slots"] = stored.pos_embed_prefix_tokens
    return facts


#: timm's RADIO v3 weights whose table its loader resamples with the corners aligned
RADIO_ALIGN_CORNERS = ("base_patch16_radio_v3", "huge_patch16_radio_v3")

#: the ``interpolation`` a caller may name while loading. ``bilinear-aligned`` is the official vit_jax code's
#: resampling of a position table: ``scipy.ndimage.zoom(grid, zoom, order=1)`` keeps the corner embeddings at the
#: corners (bilinear with the corners aligned, no antialiasing), where timm's loader of the same files does not
#: align them; patch filters of another size are then resampled bilinearly. Nearest is not one: it gives
#: neighbouring patches one position (and a relative-bias table has no nearest resizing), so one rule holds for
#: from_pretrained, load_weights, ``vitkit convert --interpolation`` and ``vitkit train --init-interpolation``.
LOAD_INTERPOLATIONS = (*(m for m in INTERPOLATIONS if m != "nearest"), "bilinear-aligned")


def interpolation_unused(resampled: Sequence[str], config: Any) -> Optional[str]:
    """Why an interpolation named for a load did nothing (None where it resampled something, ``resampled`` being
    the load's :class:`~.load.LoadReport` list): the weights fit the model built from ``config`` as stored, or the
    model holds its table as stored and resamples it to each input by its own rule. convert's --interpolation and
    train's --init-interpolation refuse it with these words."""
    if resampled:
        return None
    held = getattr(config, "pos_embed_size", None)
    if held:
        return (f"this model holds its table as stored (for {held[0]}x{held[1]} px), resampled to each input's grid "
                f"as its config says ({config.pos_embed_interpolation})")
    return f"these need none at {config.img_size[0]}x{config.img_size[1]} px"


def check_load_interpolation(interpolation: Optional[str]) -> None:
    """Refuse an ``interpolation`` loading does not take (None: as the weights' library resamples)."""
    if interpolation is not None and interpolation not in LOAD_INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {', '.join(LOAD_INTERPOLATIONS)}, not {interpolation!r}")


def load_resampling(model: nn.Module, interpolation: Optional[str], antialias: Optional[bool],
                    source_format: Optional[str] = None) -> Tuple[str, bool, bool]:
    """How a position table or patch filters of another size are resampled while loading, where the caller does not
    say: as the weights' library loads them. timm: bicubic, antialiased, but FlexiViT's and RADIO's bilinear without
    (its ``checkpoint_filter_fn`` for ``flexi*`` and ``*radio*``, RADIO v3 base and huge with the corners aligned;
    bicubic was 4e-4 to 0.13 off timm's FlexiViT, 0.2 off its RADIO), and the official npz files' bilinear without
    (timm's ``_load_weights``; the official vit_jax code's ``bilinear-aligned`` differs from it by up to a third of
    a smooth table's spread: named, it is used); a transformers tower's antialiasing is its config's (none for CLIP's
    and DINOv2's); a model that takes the nearest slots at every grid (SmolVLM's and Idefics3's towers bucket the
    positions) takes them while loading too. Returns (interpolation, antialias, align_corners)."""
    check_load_interpolation(interpolation)
    if interpolation == "bilinear-aligned":  # scipy's zoom: no antialiasing, whichever way the grid changes
        return "bilinear", bool(antialias), True
    config = getattr(model, "config", None)
    name = str(getattr(config, "name", None) or "")
    timm_bilinear = "flexi" in name or "radio" in name or source_format in ("npz", "big_vision")
    aligned = interpolation is None and any(n in name for n in RADIO_ALIGN_CORNERS)
    if interpolation is None and getattr(config, "pos_embed_interpolation", None) == "nearest":
        return "nearest", False, False  # (its positions are the table's nearest slots at any grid: SmolVLM's)
    if interpolation is None:
        interpolation = "bilinear" if timm_bilinear else "bicubic"
    if antialias is None:
        antialias = False if timm_bilinear else bool(getattr(config, "pos_embed_antialias", True))
    return interpolation, antialias, aligned


def _square_side(n: int) -> Optional[int]:
    side = int(round(math.sqrt(n))) if n > 0 else 0
    return side if side * side == n and n > 0 else None


def adapt_pos_embed(sd: Dict[str, torch.Tensor], model: nn.Module, facts: Mapping[str, Any],
                     fit: positions.StateFit, report: Any) -> None:
    """Fit the source position table to the model: prefix slots and grid size (a flat table,
    the form every layout stores); the model's other kinds fit their own parameters."""
    if getattr(model, "pos_embed_kind", None) is None:
        return  # a CNN: no positions
    grid = positions.table_grid(model)
    if "pos_embed" in sd and model.pos_embed is not None:
        pos = sd["pos_embed"]
        if pos.dim() != 3 or pos.shape[0] != 1:
            raise WeightsError(f"pos_embed has shape {tuple(pos.shape)}, expected (1, tokens, width)")
        # CaiT's and ConViT's tables cover the patches only although their outputs have a class token.
        prefix = model.pos_embed_prefix_tokens
        n = pos.shape[1]
        src_grid = facts.get("grid")
        area = grid[0] * grid[1]
        if src_grid is not None:
            src_prefix = n - src_grid[0] * src_grid[1]
            slots = facts.get("pos_slots")
            if slots is not None and src_prefix != slots:
                raise WeightsError(f"pos_embed has {n} slots where the weights' own config ({src_grid[0]}x"
                                   f"{src_grid[1]} patches, {slots} prefix slot(s)) needs "
                                   f"{slots + src_grid[0] * src_grid[1]}: the table was cut, or the config edited "
                                   f"or mixed with other weights")
        elif facts.get("pos_has_class_slot") is False:
            src_prefix = 0
        elif n in (prefix + area, area):  # the model's own grid, with or without prefix slots
            src_prefix = n - area
        elif _square_side(n - prefix) is None and _square_side(n):
            side = _square_side(n)
            raise WeightsError(
                f"pos_embed has {n} slots: a {side}x{side} grid without a class slot, or {n - prefix} patches "
                f"of a non-square grid after {prefix} prefix slot(s), and the weights do not say which; build "
                f"the model at the source's image size (img_size=(H, W)), or with no_embed_class=True for a "
                f"table over the patches only, then load")
        else:
            src_prefix = prefix
        if not 0 <= src_prefix <= prefix:
            raise WeightsError(f"pos_embed has {n} slots: {src_prefix} prefix slots do not fit a model "
                               f"with {prefix} prefix token(s)")
        if src_grid is None and n - src_prefix == area:
            src_grid = grid
        if src_grid is None:
            side = _square_side(n - src_prefix)
            if side is None:
                raise WeightsError(f"pos_embed has {n} slots: not a square grid plus {src_prefix} prefix "
                                   f"slot(s); cannot resample it to the model's {grid[0]}x{grid[1]} grid; "
                                   + _other_prefix(n, src_prefix, model))
            src_grid = (side, side)
        if src_prefix < prefix:
            # Prefix tokens the source adds after the positions (big_vision, timm
            # no_embed_class): a zero slot is exactly "no position" for them.
            pad = pos.new_zeros(1, prefix - src_prefix, pos.shape[-1])
            pos = torch.cat([pad, pos], dim=1)
        if tuple(src_grid) != grid:
            pos = resample_pos_embed(pos, grid, tuple(src_grid), prefix, fit.interpolation, fit.antialias,
                                     fit.align_corners)
            report.resampled.append(f"pos_embed {src_grid[0]}x{src_grid[1]} -> {grid[0]}x{grid[1]} ({fit.said})")
        sd["pos_embed"] = pos
    report.resampled.extend(positions.fit_state_dict(sd, model, fit))


def _other_prefix(n: int, prefix: int, model: nn.Module) -> str:
    """The advice for a table of no square grid after the model's prefix slots: where it is one after another count
    of them (DINOv2's class slot before its grid, loaded by a DeiT III name whose table has none), the weights are
    of another architecture, and no image size makes them fit; else the size they were trained at may."""
    at_size = "build the model at the size it was trained at (img_size=, --img-size H W)"
    other = next(((k, side) for k in range(1, 6) if k != prefix and (side := _square_side(n - k))), None)
    if other is None:
        return at_size
    name = getattr(getattr(model, "config", None), "name", None)
    return (f"it reads as {other[0]} prefix slot(s) before a {other[1]}x{other[1]} grid, which the model"
            f"{f' ({name})' if name else ''} has no slots for: weights of another architecture (load them by their "
            f"own name, or without one: their tensors say what they are); for a table of a non-square grid, "
            f"{at_size}")


#: the prefix tokens a token model may have: the tensor, the config field that makes it, what it is in words
_PREFIX_TOKENS = (("cls_token", "class_token", "a class token"),
                  ("dist_token", "distill_token", "a distillation token"),
                  ("reg_token", "reg_tokens", "register tokens"))


def check_prefix_tokens(sd: Mapping[str, Any], model: nn.Module, exclude: Sequence[str]) -> None:
    """The weights' prefix tokens against the model's, named before their position table is fitted: a DINOv2
    without registers loaded by a registers name was refused as a table of no square grid."""
    for key, field, what in _PREFIX_TOKENS:
        if key.startswith(tuple(exclude)) or not hasattr(model, key):
            continue
        ours = getattr(model, key) is not None
        if ours == (key in sd):
            continue
        config = getattr(model, "config", None)
        name = getattr(config, "name", None)
        built = f"{field}={json.dumps(getattr(config, field, ours))}"
        model_is = f"the model ({name}, {built})" if name else f"the model ({built})"
        said = (f"the weights hold no {key} where {model_is} has {what}" if ours
                else f"the weights hold {key} ({what}) where {model_is} has none")
        raise WeightsError(f"{said}: load them into a model with the tokens they hold (by their own architecture's "
                           f"name, or without one: their tensors say what they are)")


__all__ = ["LOAD_INTERPOLATIONS", "RADIO_ALIGN_CORNERS", "adapt_pos_embed", "check_load_interpolation",
           "interpolation_unused",
           "check_prefix_tokens", "load_resampling", "stored_table"]
