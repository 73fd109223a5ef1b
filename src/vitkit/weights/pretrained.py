"""``from_pretrained``: a ready model from a folder, a file or the Hugging Face Hub.

The architecture comes from the source's own config when it has one (vitkit, timm hub,
Hugging Face ``config.json``), else it is read off the tensor shapes.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union  # noqa: F401

import torch
from torch import nn

from ..files import PathLike
from ..models import build_from_config, config_from_dict, family_of, get_model_config, renamed_in_timm
from ..models.config_base import fit_channel_stats, fit_table_size
from ..models.registry import as_features
from ..models.serialize import NATIVE_FORMAT_VERSION
from ..selfsup import pretrainer_from_configs
from ..utils import check_switches
from . import (
    deepseek_format,
    dino_format,
    gemma4_format,
    hf_format,
    hf_towers,
    npz_format,
    open_clip_format,
    qwen_format,
    sam_format,
    selfsup_format,
    timm_format,
)
from .claims import check_claims
from .guesses import GuessWarning, guesses, note_guesses
from .hf_backbone import backbone_plan
from .hf_tower_parts import ProcessorConfigError, per_image_resize
from .hub_download import HUB_PREFIX, download_from_hub, hub_failure  # noqa: F401 (re-exported)
from .io import WeightsError
from .load import RELEASE_TOWERS, WEIGHT_FILES, AdaptNote, LoadReport, Source, load_into, read_source, to_native


def _config_file(src: Source) -> str:
    """Where a source's config was read: the folder's config.json, or the file's own metadata."""
    if src.path is None:
        return "config.json"
    folder_config = src.path.parent / "config.json"
    return str(folder_config) if folder_config.is_file() and src.path.name in WEIGHT_FILES else str(src.path)


#: layouts of a model's own release -> (the reader of its architecture, what the file is called in a refusal)
_RELEASES = {"dino": (dino_format.infer_config, "official DINO checkpoint"),
             "deepseek": (deepseek_format.infer_config, "DeepSeek checkpoint"),
             "qwen": (qwen_format.infer_config, "Qwen checkpoint"),
             "gemma4": (gemma4_format.infer_config, "Gemma 4 checkpoint"),
             "sam": (sam_format.infer_config, "SAM checkpoint")}
#: the VLMs' and SAM's own checkpoints: the tower read out of them (what is left out, said by ``vitkit info``)
_VLM_RELEASES = {layout: (who, RELEASE_TOWERS[layout]) for layout, who in (
    ("deepseek", "DeepSeek"), ("qwen", "Qwen"), ("gemma4", "Gemma 4"), ("sam", "SAM"))}


def _vitkit_config(src: Source, cj: Mapping[str, Any], overrides: Mapping[str, Any]):
    """A vitkit config.json's model (its format version checked; a bad field said as that file's)."""
    where = _config_file(src)
    if not isinstance(cj.get("config"), dict):
        raise WeightsError(f"{where}: a vitkit config.json needs a \"config\" object "
                           f"(the model's fields), got {cj.get('config')!r}")
    version = cj.get("format_version", NATIVE_FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version > NATIVE_FORMAT_VERSION:
        raise WeightsError(f"{where}: format_version {version!r} is newer than the {NATIVE_FORMAT_VERSION} this "
                           f"vitkit reads (upgrade vitkit)")
    try:
        return config_from_dict(cj["config"]).replace(**overrides)
    except (ValueError, TypeError) as e:  # which file holds the bad field
        raise WeightsError(f"{where}: {' '.join(str(e).split())}") from None


def config_for_source(src: Source, **overrides: Any):
    """The model configuration a source describes (its config file, else its shapes)."""
    cj = src.config_json
    if cj and cj.get("format") == "vitkit":
        return _vitkit_config(src, cj, overrides)
    if src.format in _VLM_RELEASES and cj:  # a VLM's folder: its tower read (Qwen's heads from its vision_config)
        overrides = {**_VLM_RELEASES[src.format][1].vision_config(cj), **overrides}
    elif cj and cj.get("model_type") not in (None, "timm_wrapper"):  # transformers' TimmWrapper: a timm hub config
        try:
            if hf_towers.reads(cj):
                return hf_towers.config_from_hf(cj, src.tensors, src.preprocessor_json, **overrides)
            return hf_format.config_from_hf(cj, src.tensors, src.preprocessor_json, **overrides)
        except WeightsError as e:  # which file said it
            name = src.preprocessor_file if isinstance(e, ProcessorConfigError) else "config.json"
            raise WeightsError(f"{src.path.parent / name if src.path else name}: {e}") from None
    if src.pretraining and src.format == "vitkit":
        raise WeightsError("a vitkit pre-training model needs its config.json (its objective's options): "
                           "pass the folder that holds both")
    if src.format == "hf":
        if cj and "architecture" not in cj:  # no model_type: said as transformers' AutoConfig says it
            raise WeightsError(f"{_config_file(src)} has no \"model_type\", which transformers writes and reads to "
                               f"know the model (\"vit\", \"deit\", \"dinov2\", \"clip_vision_model\", ...): add "
                               f"the one these Hugging Face weights were saved with")
        raise WeightsError("Hugging Face weights need their config.json (heads, eps, image size): "
                           "pass the folder that holds both")
    if cj and "architecture" in cj:
        try:
            config = timm_format.config_from_hub(cj, src.tensors, **overrides)
            if src.open_clip_trunk and config.num_classes and "head_kind" not in overrides:
                config = config.replace(head_kind="projection")  # open_clip's projection into the joint space
            return config
        except WeightsError:  # said already (an architecture vitkit does not know)
            raise
        except (ValueError, TypeError) as e:  # a pretrained_cfg or model_args field: said as that file's
            raise WeightsError(f"{_config_file(src)}: {' '.join(str(e).split())}") from None
    if src.format == "open_clip":
        return open_clip_format.infer_config(src.tensors, src.open_clip_config, **overrides)
    if src.format in _RELEASES:  # a release's own names: its reader reads the architecture off the shapes
        try:
            return _RELEASES[src.format][0](src.tensors, **overrides)
        except (ValueError, TypeError, KeyError) as e:
            raise WeightsError(f"{_RELEASES[src.format][1]}: {' '.join(str(e).split())}") from None
    # (a family's own timm names are read by that family, which says what no tensor holds: DeepSeek's rotations)
    sd, facts = (src.tensors, {}) if renamed_in_timm(src.tensors) is not None else to_native(src)
    if src.format in ("npz", "big_vision"):
        return npz_format.infer_config(sd, facts, **overrides)
    if src.pretraining == "mae":  # the official MAE layout: ImageNet statistics, as MAE trains
        overrides = {**selfsup_format.official_mae_encoder_overrides(), **overrides}
    if src.open_clip_trunk:  # a bare tower timm built: open_clip's defaults, where its config would say
        overrides = {**open_clip_format.bare_trunk_defaults(sd, src.open_clip_projection), **overrides}
    return timm_format.infer_config(sd, **overrides)


def stored_config(src: Source, overrides: Mapping[str, Any]):
    """The source's configuration (:func:`_read_config`); a bare timm table's grid is kept on ``src`` for the
    loader, which resamples it from that grid (``Source.table_grid``)."""
    config = _read_config(src, overrides)
    if src.config_json is None and src.format == "timm" and "pos_embed" in src.tensors:
        src.table_grid = tuple(config.grid_size) if hasattr(config, "grid_size") else None
    return config


def _read_config(src: Source, overrides: Mapping[str, Any]):
    """The source's configuration; where it cannot be read alone (a position table of no square grid,
    where nothing stores the size) and an ``img_size`` is asked for, read at that size: what is wrong
    with that reading is then the error (the same one, where the size was not the reason). A bare table
    that reads two ways (25 slots: 5 x 5, or a class slot before 4 x 6) is read at the size asked for
    where that size reads it (``from_pretrained`` and ``train --init`` both)."""
    size = overrides.get("img_size")
    try:
        config = config_for_source(src)
    except WeightsError:
        if size is None:
            raise
        return config_for_source(src, img_size=size)
    if size is not None and src.config_json is None and getattr(config, "no_embed_class", False) and \
            config.class_token and not config.reg_tokens:
        # 25 slots: a 5 x 5 table over the patches only, or a class slot before the 4 x 6 patches of 64 x 96 px
        try:
            at_size = config_for_source(src, img_size=size)
        except WeightsError:  # a size the table cannot be read at: the one reading, resampled to it
            return config
        if not at_size.no_embed_class:
            return at_size
    return config


def _tower_config(src: Source) -> Optional[Mapping[str, Any]]:
    """The config.json of a transformers vision tower's folder (None: any other source)."""
    cj = src.config_json or {}
    return cj if src.format == "hf" and hf_towers.reads(cj) else None


def processor_run_size(src: Source) -> Optional[Tuple[int, int]]:
    """The size a transformers folder's image processor runs its tower at (:func:`.hf_towers.run_size`); None for
    every other source."""
    return None if (cj := _tower_config(src)) is None else hf_towers.run_size(cj, src.preprocessor_json)


def processor_run_config(src: Source, stored: Any) -> Any:
    """``stored`` as transformers runs the folder (:func:`.hf_towers.run_config`); as it is for any other source."""
    return stored if (cj := _tower_config(src)) is None else hf_towers.run_config(cj, src.preprocessor_json, stored)


def describe_source(source: PathLike, img_size: Any = None) -> Dict[str, Any]:
    """What a weights file or folder is, before any model is built: its layout, what it calls itself
    (a timm architecture, a Hugging Face class, open_clip), the vitkit config it loads as (or why it
    does not), and its tensors (count, parameters, dtypes). A pre-training source gives its encoder.
    ``img_size``: the size a bare table that stores none is read at (:func:`stored_config`)."""
    path = weights_path(source)
    if not path.exists():
        raise WeightsError(f"weights not found: {path} (no such file or folder)")
    src = read_source(path)
    cj = src.config_json or {}
    own = (cj.get("architecture") or (cj.get("config") or {}).get("name") or
           ", ".join(cj.get("architectures", []) or []) or cj.get("model_type"))
    if cj.get("model_type") == "timm_wrapper":
        own = f"{own} (saved by transformers' {', '.join(cj.get('architectures') or ['TimmWrapperModel'])})"
    if src.format == "open_clip":
        own = "open_clip image tower" + (" (open_clip_config.json)" if src.open_clip_config else "")
    if src.open_clip_trunk:
        own = f"open_clip image tower built by timm: {own or 'no open_clip_config.json'}"
    if src.timm_with_config:  # what timm reads; vitkit reads the config beside it
        own = "vitkit's config in its metadata"
    if src.format in _VLM_RELEASES:
        who, reader = _VLM_RELEASES[src.format]
        said = reader.left_out(list(src.tensors) + src.unread)
        own = f"{who}'s own: its vision tower" + (f"; {said} left out" if said else "")
    elif src.unread:  # (a transformers VLM's folder: SmolVLM's, Idefics3's)
        own = f"{own}: its vision tower; {len(src.unread):,} tensors of its language model and projector left out"
    tensors = list(src.tensors.values())
    info: Dict[str, Any] = dict(
        path=str(path), format="timm" if src.timm_with_config else src.format, source_name=own,
        pretraining=src.pretraining, tensors=len(tensors),
        values=int(sum(getattr(t, "numel", lambda: t.size)() for t in tensors)),
        dtypes=sorted({str(getattr(t, "dtype", "?")).replace("torch.", "") for t in tensors}))
    try:
        info["config"] = stored_config(src, {"img_size": img_size} if img_size is not None else {})
        if not src.pretraining:  # what from_pretrained checks next: a file it refuses is not said to load
            _check_loads(info["config"], src)
        if plan := saved_features(src):  # a saved backbone: what features_only=True returns
            info["features"] = {"out_indices": plan[0], "norm": plan[1]}
    except (WeightsError, ValueError, TypeError) as e:
        info["refused"] = " ".join(str(e).split())
        return info
    info["assumed"] = guesses(info["config"], src)
    stored, info["config"] = info["config"], processor_run_config(src, info["config"])  # what from_pretrained builds
    if (size := info["config"].img_size) != stored.img_size:
        table = ("its rotary positions following the grid" if getattr(stored, "pos_embed", None) == "none" else
                 "its position table held as stored and resampled to each input's grid"
                 if info["config"].pos_embed_size else "its position table resampled")
        info["assumed"].append(f"built at {size[0]}x{size[1]}, the size its image processor makes (transformers "
                               f"runs it so), {table}; at_processor_size=False keeps its config's size")
    return info


def _check_loads(config: Any, src: Source) -> None:
    """Every check :func:`from_pretrained` makes before it copies (the source's claims, names,
    shapes, values), against a model on the meta device: nothing is built or copied."""
    check_claims(config, src)
    with torch.device("meta"):
        model = build_from_config(config)
    _load_described(model, src, src.config_json, copy=False)


def _load_described(model: nn.Module, src: Source, described: Optional[Mapping[str, Any]], **how: Any) -> LoadReport:
    """``load_into``; tensors of other shapes than the architecture a config file ``described`` say which file."""
    try:
        return load_into(model, src, **how)
    except WeightsError as e:
        if described is None or not str(e).startswith("shape mismatch"):
            raise
        raise WeightsError(f"{_config_file(src)} describes another model than these weights: {e}") from None


def from_pretrained(source: PathLike, model_name: Optional[str] = None, strict: bool = True,
                    interpolation: Optional[str] = None, encoder_only: bool = False, features_only: bool = False,
                    out_indices: Optional[Union[int, Sequence[int]]] = None, pyramid: bool = False,
                    pyramid_channels: int = 256, at_processor_size: bool = True, output_loading_info: bool = False,
                    **overrides: Any) -> nn.Module:
    """Build a model and load its weights from a folder, a file or ``"hf-hub:org/name"``.

    ``model_name`` forces the architecture (``"vit_small_patch16_224"``) instead of reading it
    from the source. Overrides change the configuration: ``img_size=384`` resamples the
    position embeddings (as the weights' library resamples them, or by ``interpolation``: 'bicubic', 'bilinear',
    or 'bilinear-aligned', the official vit_jax code's); a new ``num_classes`` keeps a fresh zero-initialised head;
    ``in_chans=1`` sums RGB patch filters for grey input (and averages the normalisation). An override that
    would compute another function of the same tensors (``block``, ``num_heads``, ``norm_eps``, ``gelu``,
    ``global_pool`` against a source whose config states them) is refused, or with ``strict=False`` noted.

    A pre-training model (a vitkit pre-training run, Hugging Face ``ViTForMaskedImageModeling``
    / ``ViTMAEForPreTraining``, an official MAE checkpoint) comes back as the
    :mod:`vitkit.selfsup` model; ``encoder_only=True`` gives its encoder, a plain ViT.
    ``features_only=True`` (with ``out_indices``, ``pyramid``, ``pyramid_channels``) gives the
    model as a backbone, as :func:`vitkit.create_model` does; from a transformers ``...Backbone``
    folder without ``out_indices``, the maps its config names, as transformers returns them.
    A transformers DINOv2 or DINOv3 folder is built at the size its image processor makes, as transformers
    runs it (``facebook/dinov2-*``: 224 px, its 518 px table resampled as transformers resamples it);
    ``at_processor_size=False`` builds it at its config's ``image_size`` (the table as it is stored).
    ``output_loading_info=True`` returns ``(model, report)``, as transformers' ``from_pretrained`` does: the
    :class:`~vitkit.weights.load.LoadReport` names the source's format and what was resampled to fit the model.
    """
    check_switches("from_pretrained", strict=strict, encoder_only=encoder_only, features_only=features_only,
                   pyramid=pyramid, at_processor_size=at_processor_size, output_loading_info=output_loading_info)
    path = weights_path(source)
    if not path.exists():
        raise WeightsError(f"weights not found: {path} (no such file or folder)" + _name_hint(str(source)))
    src = read_source(path)
    if src.pretraining and not (encoder_only or features_only):  # a backbone is the encoder
        model, report = _pretrainer(src, model_name, strict, interpolation, overrides)
        return (model, report) if output_loading_info else model
    stored, model_name = _config_to_build(src, model_name, overrides)
    if not model_name:
        check_claims(stored, src)
        note_guesses(stored, src, overrides)
    overrides = _processor_run(src, stored, overrides, path, at_processor_size)
    every_call = (cj := _tower_config(src)) is not None and hf_towers.table_every_call(cj)  # (transformers' towers)
    config = stored.replace(**fit_table_size(stored, fit_channel_stats(stored, overrides), every_call))
    _check_overrides_compute_the_same(src, stored, config, strict)
    model = build_from_config(config)
    exclude: Tuple[str, ...] = ()
    if config.num_classes != stored.num_classes:  # every classifier (a distilled DeiT's head_dist too) is new
        exclude = tuple(f"{name}." for name in model.head_names())
    # resampled to another size as the source's library resamples it (resampling.load_resampling)
    report = _load_described(model, src, None if model_name else src.config_json, strict=strict,
                             interpolation=interpolation, exclude=exclude)
    norm = False
    if features_only and out_indices is None:  # a saved backbone or a transformers one: the maps it returns
        depth = len(getattr(model, "blocks", ()))
        plan = saved_features(src) or (None if pyramid else backbone_plan(src.config_json, depth))
        out_indices, norm = plan or (None, False)
    model = as_features(model, features_only, out_indices, pyramid, pyramid_channels, norm)
    model.eval()
    return (model, report) if output_loading_info else model


def _processor_run(src: Source, stored: Any, overrides: Dict[str, Any], path: Path, at_processor_size: bool
                   ) -> Dict[str, Any]:
    """The overrides with the size a transformers folder's processor runs it at (where asked and none is given),
    and what that pipeline does otherwise than vitkit's said."""
    if at_processor_size and overrides.get("img_size") is None and (size := processor_run_size(src)):
        overrides = {**overrides, "img_size": size}
        if size[0] != size[1] and getattr(stored, "crop_mode", "") == "center":
            warnings.warn(f"{path}: its image processor resizes the shorter side and then crops {size[0]}x{size[1]}; "
                          f"vitkit resizes images to cover {size[0]}x{size[1]} keeping their aspect (timm's way): "
                          f"images of another shape get other pixels than transformers gives them", GuessWarning,
                          stacklevel=4)
    _per_image_note(src, path, overrides.get("img_size") or getattr(stored, "img_size", None))
    _feature_layer_note(src, path)
    return overrides


def _feature_layer_note(src: Source, path: Path) -> None:
    """A LLaVA-style VLM feeds its language model the tokens of one of its tower's blocks (``vision_feature_layer``;
    the class token dropped by its ``default`` strategy), where vitkit's model is the whole tower: said, with the
    call that gives those tokens."""
    cj = src.config_json or {}
    layer = cj.get("vision_feature_layer") if src.format == "hf" and hf_towers.vlm_vision_config(cj) else None
    if type(layer) is int:
        which = "its patches (the class token dropped)" if cj.get("vision_feature_select_strategy",
                                                                   "default") == "default" else "every token"
        warnings.warn(f"{path}: its language model is fed the tower's tokens after block {layer} ({which}), where "
                      f"vitkit's model is the whole tower: model.forward_intermediates(x, indices=[{layer}], "
                      f"output_fmt='NLC') gives them", GuessWarning, stacklevel=4)


def _per_image_note(src: Source, path: Path, img_size: Any) -> None:
    """A VLM's processor (SigLIP 2's NaFlex, Gemma 4's, Qwen's) resizes each image to a grid of its own, keeping its
    aspect; vitkit's pipeline resizes every image to the model's size: said, since on an image of another shape
    the pixels, and the features, are not transformers' (0.23 off on a 420x300 photo with NaFlex's)."""
    what = per_image_resize(src.preprocessor_json or {})
    if what is not None:
        h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size or ("?", "?"))
        warnings.warn(f"{path}: its image processor {what} keeping its aspect; vitkit's resizes every image to the "
                      f"model's size ({h}x{w}): images of another shape or size get other pixels and features than "
                      f"transformers' pipeline gives (the model itself runs any grid: resize to the grid you want and "
                      f"call it)", GuessWarning, stacklevel=4)


def saved_features(src: Source) -> Optional[Tuple[List[int], bool]]:
    """(blocks, norm) a vitkit backbone was saved with (``FeatureModel.save_pretrained``'s ``"features"``)."""
    config_json = src.config_json or {}
    saved = config_json.get("features") if config_json.get("format") == "vitkit" else None
    if saved is None:
        return None
    blocks, norm = (saved.get("out_indices"), saved.get("norm", False)) if isinstance(saved, dict) else (None, None)
    if not (isinstance(blocks, list) and blocks and all(type(i) is int for i in blocks) and isinstance(norm, bool)):
        raise WeightsError(f"{_config_file(src)}: its \"features\" ({json.dumps(saved)[:80]}) is not a backbone's "
                           f"plan vitkit writes (\"out_indices\": a list of block numbers, \"norm\": true or false)")
    return blocks, norm


def _pretrainer(src: Source, model_name: Optional[str], strict: bool, interpolation: Optional[str],
                overrides: Dict[str, Any]) -> Tuple[nn.Module, LoadReport]:
    """The pre-training model a source holds, at its own size (fine-tuning changes sizes)."""
    if model_name or overrides:
        given = ", ".join(([f"model_name={model_name!r}"] if model_name else []) + sorted(overrides))
        raise WeightsError(f"a pre-training model loads as it was saved ({given} cannot change it: on the command "
                           f"line --model and the size flags); fine-tune its encoder instead (vitkit train --init), "
                           f"or, in Python, pass encoder_only=True")
    encoder = config_for_source(src)
    try:
        model = pretrainer_from_configs(encoder, selfsup_format.options(src.pretraining, src.tensors,
                                                                        src.config_json, encoder))
    except ValueError as e:  # e.g. transformers' MAE saved with mask_ratio 0 (its setting for feature extraction)
        raise WeightsError(f"{src.path or 'the weights'}: {' '.join(str(e).split())}: its {src.pretraining} "
                           f"pre-training model cannot be built; its encoder loads (encoder_only=True, or "
                           f"vitkit train --init)") from None
    report = load_into(model, src, strict=strict, interpolation=interpolation)
    return model.eval(), report


def _name_hint(source: str) -> str:
    """For a model name given where weights belong (timm's and Hugging Face's habit): how to get them."""
    from ..models import list_models

    if source in list_models():
        return (f"; vitkit fetches nothing by name: timm's weights are Hub repositories, "
                f"'hf-hub:timm/{source}.<tag>' (e.g. .augreg2_in21k_ft_in1k; needs huggingface_hub and the "
                f"network), a downloaded file or folder is its path, and vitkit.create_model({source!r}) builds "
                f"it with random weights")
    if source.count("/") == 1 and not source.startswith((".", "/", "~")) and not Path(source).parent.exists():
        return f"; a Hugging Face Hub repository is read as 'hf-hub:{source}' (needs huggingface_hub and the network)"
    return ""


def weights_path(source: PathLike) -> Path:
    """The local file or folder of ``source``: ``"hf-hub:org/name"`` is downloaded first; a
    training run's folder (``runs/NAME``) stands for the model it saved (``runs/NAME/model``)."""
    if not isinstance(source, (str, os.PathLike)) or not str(source):  # None was pathlib's TypeError
        # (a state dict's repr printed every tensor into the message)
        kind = type(source).__name__
        what = repr(source) if source is None or isinstance(source, (str, int, float, bool)) else \
            f"{'an' if kind[0] in 'AEIOUaeiou' else 'a'} {kind}" + (
                " (a state dict loads into a model: vitkit.load_weights(model, sd))" if isinstance(source, Mapping)
                else "")
        raise WeightsError(f"weights are a file, a folder or hf-hub:NAME, not {what}")
    text = str(source)
    path = download_from_hub(text[len(HUB_PREFIX):]) if text.startswith(HUB_PREFIX) else Path(source)
    return run_model_folder(path) or path


def without_preprocessing(source: PathLike) -> bool:
    """Whether ``source`` is a bare timm state dict: tensors without a config, so nothing says how its images
    were normalised (``vitkit predict --mean/--std`` may say it; a source with its config keeps its own)."""
    path = weights_path(source)
    if not path.exists() or path.is_dir():
        return False
    src = read_source(path)
    return src.config_json is None and src.format == "timm"


def run_model_folder(path: Path) -> Optional[Path]:
    """``path/model`` when ``path`` is a vitkit run's folder (its config.json is a training
    config, its model saved in ``model/``), else None."""
    if path.is_dir() and not any((path / n).is_file() for n in WEIGHT_FILES) \
            and (path / "model" / "config.json").is_file():
        return path / "model"
    return None


def _config_to_build(src: Source, model_name: Optional[str], overrides: Mapping[str, Any]) -> Tuple[Any, Optional[str]]:
    """(the configuration to build, the model name still in force): the named architecture's for a source without
    a config; else the source's own, read once, a name given beside it checked against it and then dropped."""
    if model_name and src.config_json is None:
        return _named_config(src, model_name), model_name
    stored = stored_config(src, overrides)
    if model_name:
        _check_named_agrees(src, model_name, stored)
    return stored, None


def _check_overrides_compute_the_same(src: Source, stored: Any, config: Any, strict: bool) -> None:
    """Overrides of fields no tensor holds (the block, heads, eps, activation, pool) against a source whose config
    states them: the tensors loaded and computed another function, in silence (``load_weights`` refused the same
    model). Refused when ``strict``, else an :class:`AdaptNote`."""
    stated = src.config_json is not None or isinstance((src.open_clip_config or {}).get("model_cfg"), Mapping)
    if not stated:  # bare tensors: the overrides are how their unstored fields are told
        return
    new_head = config.num_classes != stored.num_classes  # (the pooling a new head reads is the caller's choice)
    silent = [d for d in timm_format.architecture_differences(config, stored)
              if d.split()[0] in timm_format.SILENT_FIELDS and not (new_head and d.startswith("global_pool "))]
    if not silent:
        return
    fields = ", ".join(d.split()[0] for d in silent)
    said = (f"{src.path or 'the weights'}: overriding its config with {'; '.join(silent)} would compute another "
            f"function of the same tensors")
    if strict:
        raise WeightsError(f"{said}: load it without {fields} (its config says what it is), or build the model you "
                           f"mean with vitkit.create_model and load_weights(model, path, strict=False); nothing was "
                           f"loaded")
    warnings.warn(AdaptNote(f"{said}: built so all the same (strict=False)"), stacklevel=3)


def _check_named_agrees(src: Source, model_name: str, own: Any) -> None:
    """A source with its own config named as an architecture is read by its config (the name's 224 px and ImageNet
    statistics rebuilt a 64 x 96 model at 224 and normalised it otherwise, in silence); a name of another
    architecture is refused, naming how they differ."""
    differences = timm_format.architecture_differences(own, get_model_config(model_name))
    if differences:
        raise WeightsError(f"{src.path or 'the weights'}: the file's config is another architecture than "
                           f"{model_name}: {'; '.join(differences[:3])}; load it without a model name (the file says "
                           f"what it is)")


def _named_config(src: Source, model_name: str):
    """A registered architecture, with the class count the checkpoint's head has. Foreign layouts
    store positions as one learned table (timm's ``pos_embed``): an architecture with 2D or
    sine-cosine positions is read in the equivalent form its timm export has (the same function),
    so ``vitkit convert RUN w.pth --to timm`` reads back with ``model_name=`` as its note says."""
    config = get_model_config(model_name)
    if src.format != "vitkit" and "timm" in family_of(config).layouts and not _own_form(config, src):
        config = config_from_dict(family_of(config).timm_config(config))
    elif src.config_json and src.config_json.get("format") == "vitkit" and hasattr(config, "pos_embed"):
        # the file declares its config (a timm export's .safetensors: positions as one learned
        # table): the named architecture is read in the form of position table the file holds
        declared = src.config_json.get("config") or {}
        if declared.get("architecture") == getattr(config, "architecture", None):
            differences = timm_format.architecture_differences(config_from_dict(declared), config)
            if differences:
                raise WeightsError(f"{src.path or 'the weights'}: the file's config is another architecture "
                                   f"than {model_name}: {'; '.join(differences[:3])}; load it without a model "
                                   f"name (the file says what it is)")
            config = config.replace(pos_embed=declared.get("pos_embed", config.pos_embed))
    sd, _ = to_native(src)
    head = "head.fc.weight" if "head.fc.weight" in sd else "head.weight"  # ResNetV2: a 1x1 conv head
    classes = sd[head].shape[0] if head in sd else 0
    size = _table_size(config, sd)  # a name's default size for a file fine-tuned at another: the file's
    return config.replace(num_classes=classes, **({"img_size": size} if size else {}))


def _own_form(config: Any, src: Source) -> bool:
    """Whether the file holds the tensors of the named architecture as vitkit builds it (a vitkit
    ``model.safetensors`` on its own: its fixed sine-cosine positions are not stored), rather than timm's
    form of it (positions as one learned table)."""
    with torch.device("meta"):
        own = {k for k in build_from_config(config).state_dict() if not k.startswith("head.")}
    return own == {k for k in src.tensors if not k.startswith("head.")}


def _table_size(config: Any, sd: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
    """The (square) image size a checkpoint's position table holds where ``config``'s table has another
    length (None: the same length, or no table to read): a file fine-tuned at 384 px loaded by its
    architecture's name is built at 384, not resampled to the name's 224 without a word."""
    table = sd.get("pos_embed")
    if not isinstance(table, torch.Tensor) or table.ndim != 3 or not hasattr(config, "patch_size"):
        return None
    with torch.device("meta"):
        own = getattr(build_from_config(config), "pos_embed", None)
    if not isinstance(own, torch.Tensor) or own.ndim != 3 or own.shape[1] == table.shape[1]:
        return None
    (ph, pw), (h, w) = config.patch_size, config.img_size
    prefix = own.shape[1] - (h // ph) * (w // pw)  # the class (and distillation) slots the table holds
    side = math.isqrt(max(table.shape[1] - prefix, 0))
    return (side * ph, side * pw) if side and prefix >= 0 and side * side == table.shape[1] - prefix else None
