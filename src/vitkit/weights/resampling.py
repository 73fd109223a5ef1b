"""How a loaded position table meets a model of another size: the grid and prefix slots the weights' own
config says their table has (:func:`stored_table`), and the resampling, as the weights' library resamples or as
the caller names it (:func:`load_resampling`). :mod:`.load` adapts the tensors with both."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from ..models import build_from_config, config_from_dict
from ..models.layers import INTERPOLATIONS
from ..models.positions import table_grid
from . import timm_format


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
    and DINOv2's). Returns (interpolation, antialias, align_corners)."""
    check_load_interpolation(interpolation)
    if interpolation == "bilinear-aligned":  # scipy's zoom: no antialiasing, whichever way the grid changes
        return "bilinear", bool(antialias), True
    config = getattr(model, "config", None)
    name = str(getattr(config, "name", None) or "")
    timm_bilinear = "flexi" in name or "radio" in name or source_format in ("npz", "big_vision")
    aligned = interpolation is None and any(n in name for n in RADIO_ALIGN_CORNERS)
    if interpolation is None:
        interpolation = "bilinear" if timm_bilinear else "bicubic"
    if antialias is None:
        antialias = False if timm_bilinear else bool(getattr(config, "pos_embed_antialias", True))
    return interpolation, antialias, aligned


__all__ = ["LOAD_INTERPOLATIONS", "RADIO_ALIGN_CORNERS", "check_load_interpolation", "load_resampling", "stored_table"]
