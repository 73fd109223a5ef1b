"""``load_weights``: weights into a model the caller built, checked against the config the source carries.

A folder or file that says what it is (a vitkit folder, a Hugging Face or timm hub ``config.json``,
``open_clip_config.json``) loaded into a model of another architecture copied every tensor whose shape fitted:
an HF ViT folder (eps 1e-12) into a vitkit ViT (1e-6) was 2-4e-4 off, 12 heads read as 6 0.06 off, with no
word. The fields the source's config and the model's differ in, beyond what loading adapts (image size,
classes, channels) and what no tensor holds (preprocessing, names), are refused when ``strict`` and said when
not. :func:`~vitkit.weights.from_pretrained` builds the source's own model and needs no such check.
"""

from __future__ import annotations

import itertools
import json
import warnings
from typing import Any, Mapping, Optional, Sequence, Union

from torch import nn

from ..files import PathLike
from ..models.config_base import fit_channel_stats
from ..models.features import FeatureModel
from ..selfsup import Pretrainer
from ..utils import check_switches
from .io import WeightsError
from .load import AdaptNote, LoadReport, Source, load_into, read_source
from .pretrained import config_for_source, weights_path
from .resampling import check_load_interpolation
from .timm_format import architecture_differences


def load_weights(model: nn.Module, source: Union[PathLike, Mapping[str, Any], Source],
                 strict: bool = True, interpolation: Optional[str] = None, antialias: Optional[bool] = None,
                 exclude: Sequence[str] = (), copy: bool = True) -> LoadReport:
    """Load weights in any supported layout into ``model`` (in place).

    ``source``: a file (.safetensors, .pth/.bin, .npz), a folder (vitkit, Hugging Face or timm
    hub layout), or an in-memory state dict. The layout is detected from key names. A
    different patch grid or patch size is resampled (``interpolation`` 'bicubic', 'bilinear' or 'bilinear-aligned':
    the official vit_jax code's, corners aligned; ``antialias``; by default as the weights' library does: timm's
    bicubic with antialiasing, its bilinear without for FlexiViT and the official .npz files, a model's
    ``pos_embed_antialias``). ``exclude``: name prefixes to skip, e.g. ``('head.',)``.
    Raises :class:`WeightsError` naming every missing/unexpected key (when ``strict``) and
    every shape mismatch, and a source whose own config describes another architecture than the
    model's (its heads, eps, activation, blocks; said as an :class:`AdaptNote` when not ``strict``);
    the model is untouched when it raises. A source whose config prescribes other preprocessing (mean,
    std, crop) is said as an :class:`AdaptNote`: the model keeps its own. ``copy=False``: every check,
    nothing copied (the model may be on the meta device).
    """
    check_switches("load_weights", strict=strict, copy=copy)
    check_load_interpolation(interpolation)  # before the file is read
    if isinstance(source, nn.Module):
        raise TypeError(f"source is a model ({type(source).__name__}): pass its state_dict(), or a file or folder")
    if copy and any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
        raise ValueError("the model is on the meta device: its tensors have no storage to copy into (nothing would "
                         "load); build it on a device first (model.to_empty(device='cpu')), or pass copy=False to "
                         "check the weights only")
    if not isinstance(source, (Mapping, Source)):
        source = read_source(weights_path(source))
        _check_architecture(model, source, strict)
    return load_into(model, source, strict, interpolation, antialias, exclude, copy)


def _check_architecture(model: nn.Module, src: Source, strict: bool) -> None:
    target = model.model if isinstance(model, FeatureModel) else model
    config = getattr(target, "config", None)
    if config is None or isinstance(target, Pretrainer) or src.pretraining or not (
            src.config_json or src.open_clip_config):  # a bare file says nothing beyond its shapes
        return
    try:
        stored = config_for_source(src)
    except (WeightsError, ValueError, TypeError):  # what cannot be read is said by the load itself
        return
    if type(stored) is not type(config):
        return  # another family: the names and shapes say it
    differences = architecture_differences(stored, config)
    if not differences:
        _note_other_preprocessing(stored, config, src)
        return
    said = (f"{src.path or 'the source'} holds a model of another architecture than this one: its config says "
            f"{'; '.join(differences[:4])}{' ...' if len(differences) > 4 else ''}")
    if strict:
        raise WeightsError(f"{said}; vitkit.from_pretrained builds the model it holds (or build this one with those "
                           f"fields); nothing was loaded")
    warnings.warn(AdaptNote(f"{said}: loaded into this model all the same (strict=False)"), stacklevel=3)


#: the fields of a config that say how images are made into its input
PREPROCESSING = ("mean", "std", "crop_pct", "crop_mode", "crop_offset", "interpolation")


def _note_other_preprocessing(stored: Any, config: Any, src: Source) -> None:
    """The source's config prescribes other preprocessing than the model keeps (its mean and std, crop): said,
    since ``vitkit.preprocess`` and predict then feed the weights images normalised otherwise than they learned."""
    fitted = stored.replace(**fit_channel_stats(stored, {"in_chans": config.in_chans})) \
        if stored.in_chans != config.in_chans else stored  # (grey from RGB: the channel average, as loading makes it)
    other = [f"{f} {json.dumps(getattr(fitted, f))} (this model: {json.dumps(getattr(config, f))})"
             for f in PREPROCESSING if hasattr(fitted, f) and hasattr(config, f)
             and getattr(fitted, f) != getattr(config, f)]
    if other:
        warnings.warn(AdaptNote(f"{src.path or 'the source'}'s config prescribes other preprocessing: "
                                f"{'; '.join(other)}; the model keeps its own (vitkit.from_pretrained takes the "
                                f"source's)"), stacklevel=4)


__all__ = ["load_weights"]
