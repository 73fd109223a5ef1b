"""timm's layout: vitkit's parameter names are timm's, so reading is the identity (the exception says so itself,
``Family.from_timm``: timm's DeepSeek classifier keeps its encoder under ``encoder.``).

What differs is each family's business (its :class:`vitkit.models.Family`): ``to_timm``
writes what timm has no module for (a ViT's 2D / sincos position embedding as the equivalent
``pos_embed`` table; timm's ViT has no pre-logits layer), ``infer_config`` reads an
architecture off a bare state dict's shapes, and ``timm_args`` translates timm's hub
``config.json`` (``model_args``). This module asks the family and turns its complaints into
:class:`WeightsError`.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from ..models import config_from_dict, family_of, family_of_state_dict, get_model_config, list_models
from ..models.positions import full_table
from .io import WeightsError


def full_pos_embed(model) -> Optional[torch.Tensor]:
    """The model's position information as one (1, prefix + N, D) table, timm style (see
    :func:`vitkit.models.positions.full_table`)."""
    return full_table(model)


def from_native(model) -> Dict[str, torch.Tensor]:
    """vitkit model -> timm state dict (the same module configuration in timm)."""
    fam = family_of(model.config)
    if "timm" not in fam.layouts:
        raise WeightsError(f"{fam.config_cls.KIND} models have no timm layout; export them as 'vitkit'")
    try:
        return fam.to_timm(model)
    except ValueError as e:
        raise WeightsError(str(e)) from None


def timm_config(model) -> Dict[str, Any]:
    """The vitkit config (a dict) that describes ``from_native(model)``'s state dict."""
    return family_of(model.config).timm_config(model.config)


#: Config fields a bare state dict need not carry to compute the same logits: what the input
#: expects, names, regularisation, kernel choices, resampling choices, initial values.
_NOT_IN_WEIGHTS = frozenset({
    "mean", "std", "crop_pct", "crop_mode", "crop_offset", "interpolation", "label_names", "name", "drop_rate",
    "attn_drop_rate", "drop_path_rate", "pos_drop_rate", "proj_drop_rate", "attn_impl", "dynamic_img_size",
    "pos_embed_interpolation", "pos_embed_antialias", "rel_pos_resize", "init_values", "locality_strength",
    "use_local_init", "head_kind"})
#: what a saved config.json may be edited in against the config its weights file carries: what the input
#: expects, names, regularisation, resampling (a vitkit folder; the rest makes another function of the weights)
EDITABLE = _NOT_IN_WEIGHTS


#: Fields two configs of the same architecture may differ in: what a loader adapts (size, classes,
#: channels, the size a table is held at); how positions are stored is said by :data:`_TABLE_FORMS`.
_ADAPTED = frozenset({"img_size", "num_classes", "in_chans", "pos_embed_size"})


def architecture_differences(config, other) -> List[str]:
    """The fields in which ``config`` is another architecture than ``other`` (empty: the same,
    up to what loading adapts: image size, classes, channels, the form of the position table,
    and what weights do not hold: preprocessing, names, regularisation)."""
    return _differences(config.to_dict(), other.to_dict())


#: the position kinds that are forms of one table (2D and sine-cosine tables are exported as a learned one); no
#: positions and a bias in every attention layer are other architectures
_TABLE_FORMS = frozenset({"learned", "learned_2d", "sincos2d"})


def _differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> List[str]:
    """:func:`architecture_differences` of two configs' ``to_dict`` forms, each said as ``field a (not b)``."""
    skip = _NOT_IN_WEIGHTS | _ADAPTED

    def differ(k: str) -> bool:
        if k in skip or a.get(k) == b.get(k):
            return False
        # pos_embed was skipped whatever its kind: a vit_fmnist entry point returned a run's model without positions
        return k != "pos_embed" or not {a.get(k), b.get(k)} <= _TABLE_FORMS

    return [f"{k} {json.dumps(a.get(k))} (not {json.dumps(b.get(k))})" for k in sorted(set(a) | set(b)) if differ(k)]


#: Fields that change what a timm state dict computes but none of its tensor names or shapes: a timm model built
#: with another value loads the tensors strictly and computes something else, in silence (a 'map' pool has tensors)
SILENT_FIELDS = frozenset({"gelu", "norm_eps", "global_pool", "block", "pool_include_prefix", "num_heads", "map_heads",
                           "rope_grid_indexing", "rope_grid_offset", "rope_half", "rope_ref_grid", "rope_temperature"})
#: fields only training reads (DINOv3's random rescale of the rotary coordinates)
TRAINING_ONLY = frozenset({"rope_rescale_coords"})
#: what a timm user passes for such a field, where timm's keyword is not the field's own name
_TIMM_WORDS = {"gelu": "act_layer", "norm_eps": "norm_layer's eps", "block": "block_fn"}
#: registered names timm does not have
VITKIT_ONLY = frozenset({"vit_fmnist", "vit_fmnist_hybrid", "resnetv2_50_nopreact"})


def _as_computed(config) -> Dict[str, Any]:
    """``config``'s fields with a default that resolves one way said that way (fc_norm null: ``use_fc_norm``)."""
    values = config.to_dict()
    if values.get("fc_norm", False) is None:
        values["fc_norm"] = config.use_fc_norm
    return values


def nearest_timm_name(model) -> Optional[tuple]:
    """(timm architecture, the fields it differs in, the silent ones among them) nearest to what ``model``'s timm
    state dict computes: its family's registered timm name with the fewest differences (training-only ones count
    last; its own name first on a tie); None where no name of its family is timm's."""
    config = config_from_dict({**model.config.to_dict(), **timm_config(model)})
    ours, found = _as_computed(config), []
    for name in list_models():
        other = get_model_config(name)
        if name not in VITKIT_ONLY and type(other) is type(config):
            differences = _differences(ours, _as_computed(other))
            training = sum(d.split()[0] in TRAINING_ONLY for d in differences)
            found.append((len(differences) - training, training, name != model.config.name, name, differences))
    if not found:
        return None
    *_, name, differences = min(found)
    silent = [d for d in differences if d.split()[0] in SILENT_FIELDS and not (d.startswith("global_pool") and
                                                                               '"map"' in d)]
    return name, differences, silent


def timm_function_note(model) -> Optional[str]:
    """What to tell a timm user: the architecture timm builds this model as, where it is not the model's own
    name, or what its nearest one computes differently from the same tensors (None: timm builds it under its own
    name, or it differs in more than those fields and the depth: other shapes, which timm refuses loudly)."""
    near = nearest_timm_name(model)
    if near is None:
        return None
    name, differences, silent = near
    fields = [d.split()[0] for d in differences]
    if any(f not in SILENT_FIELDS | TRAINING_ONLY | {"depth"} for f in fields) or \
            (not silent and name == model.config.name):
        return None
    call = f"timm.create_model({name!r}" + (f", depth={model.config.depth})" if "depth" in fields else ")")
    training = [d for d in differences if d.split()[0] in TRAINING_ONLY]
    also = f" ({'; '.join(training)}: only training reads it)" if training else ""
    if not silent:
        return f"timm builds this model as {name}: {call}{also}"
    words = sorted({f"{_TIMM_WORDS[f]} for {f}" for f in (d.split()[0] for d in silent) if f in _TIMM_WORDS})
    differ = "; ".join(d for d in differences if d not in training)
    return (f"timm's nearest architecture, {name}, loads these tensors and computes another function: it differs in "
            f"{differ}{also}. Build it in timm with this model's values ({call[:-1]}, ...)"
            f"{': ' + ', '.join(words) if words else ''}), or read the file with vitkit")


#: how a model expects its images: what a bare state dict is read back with its family's defaults for
_PREPROCESSING = ("mean", "std", "crop_pct", "crop_mode", "interpolation")


def bare_state_dict_losses(sd: Mapping[str, Any], model, preprocessing: bool = False) -> List[str]:
    """What reading ``model``'s timm state dict back from its shapes alone would get wrong: each
    config field that changes the function and is read differently (empty: nothing is lost); with
    ``preprocessing``, also the image preprocessing it would be read with otherwise (its family's defaults for
    the fields no tensor holds)."""
    try:
        read = infer_config(sd).to_dict()
    except WeightsError as e:
        return [str(e)]
    got, want = dict(read), timm_config(model)
    # patch_bias None is "the family's default" (none after a pre-norm): equal where the tensor is read the same
    if want.get("patch_bias") is None and ("patch_embed.proj.bias" in sd) == bool(got.get("patch_bias", True)):
        got["patch_bias"] = None
    # fc_norm None is "after an average pool only" (ViTConfig.use_fc_norm): equal where it resolves the same
    pool = got.get("global_pool")
    if "fc_norm" in want and "fc_norm" in got and want.get("global_pool") == pool:
        ours, theirs = (pool == "avg" if v is None else bool(v) for v in (want["fc_norm"], got["fc_norm"]))
        if ours == theirs:
            got["fc_norm"] = want["fc_norm"]
    lost = [f"{k} ({json.dumps(want[k])} in the model, {json.dumps(got.get(k))} read off the shapes)"
            for k in want if k not in _NOT_IN_WEIGHTS and want[k] != got.get(k)]
    if preprocessing:
        config = model.config.to_dict()
        lost += [f"{k} ({json.dumps(config[k])} in the model, {json.dumps(read.get(k))} read back)"
                 for k in _PREPROCESSING if k in config and config[k] != read.get(k)]
    return lost


def infer_config(sd: Mapping[str, Any], **overrides: Any):
    """Rebuild the architecture from a timm/vitkit-named state dict alone (the family that
    recognises its key names reads the shapes)."""
    fam = family_of_state_dict(sd.keys())
    if fam is None:
        raise WeightsError("not a ViT state dict: 'patch_embed.proj.weight' is missing")
    try:
        return fam.infer_config(sd, **overrides)
    except (ValueError, TypeError) as e:
        raise WeightsError(f"{fam.config_cls.KIND} state dict: {e}") from None
    except KeyError as e:  # a tensor the shapes are read from is not there: a damaged or partial file
        raise WeightsError(f"{fam.config_cls.KIND} state dict without {e.args[0]!r}, which its architecture is read "
                           f"from: the file is partial or mixes names (a 'module.' prefix on some of them?)") from None


#: timm ``model_args`` that mean the same in every token family's config.
_TIMM_ARGS = ("img_size", "patch_size", "in_chans", "global_pool", "qkv_bias", "dynamic_img_size", "depth",
              "num_heads")


def is_known_architecture(arch: str) -> bool:
    return arch.split(".")[0] in list_models()


def known_architecture(arch: str) -> str:
    """A timm hub ``architecture`` (``name`` or ``name.tag``) -> the registered name; one vitkit does not know
    is refused by name, never guessed from the tensor names (another architecture can share them: timm's
    residual post-norm ViT has a pre-norm ViT's names and other logits)."""
    base = arch.split(".")[0]
    if not is_known_architecture(base):
        raise WeightsError(f"timm architecture {base!r} is not one vitkit knows (see `vitkit models`): it is not read "
                           f"as another from its tensor names; load the weights with model_name= a vitkit "
                           f"architecture if you know it is the same model")
    return base


def training_checkpoint_config(facts: Mapping[str, Any], sd: Mapping[str, Any]) -> Dict[str, Any]:
    """The timm hub ``config.json`` a checkpoint of timm's train.py (or DeiT's main.py) stands for
    (``facts``: its ``arch`` and ``args``, :func:`~.io.read_weight_file`), built as train.py builds the model: the
    architecture by name (one vitkit does not know is refused by name, not guessed from the tensors),
    ``args.model_kwargs``, ``--in-chans`` (or ``--input-size``'s channels), ``--gp``, the classes;
    the data arguments its data config takes where they were given (mean, std, crop_pct,
    interpolation; else the architecture's own). The image size is the position table's (where
    model_kwargs do not give one): train.py builds the model at its default size whatever
    ``--img-size`` the data was resized to, and a table of another grid is not resampled unsaid."""
    args = facts["args"]
    model_args = dict(args["model_kwargs"]) if isinstance(args.get("model_kwargs"), Mapping) else {}
    if "img_size" not in model_args:
        try:
            model_args["img_size"] = list(infer_config(sd).img_size)
        except (ValueError, TypeError, AttributeError):  # no table to read it from: the architecture's own
            pass
    size = args.get("input_size")
    chans = args.get("in_chans") or (size[0] if isinstance(size, (list, tuple)) and len(size) == 3 else None)
    if isinstance(chans, int):
        model_args.setdefault("in_chans", chans)
    if args.get("gp"):
        model_args.setdefault("global_pool", args["gp"])
    pre = {k: list(v) if isinstance(v, (list, tuple)) else v for k in ("mean", "std", "crop_pct", "interpolation")
           if (v := args.get(k)) not in (None, "")}
    head = sd.get("head.weight")
    classes = args.get("num_classes")
    if not isinstance(classes, int) or isinstance(classes, bool):
        classes = int(head.shape[0]) if isinstance(head, torch.Tensor) and head.dim() == 2 else 0
    return {"architecture": facts["arch"], "num_classes": classes, "model_args": model_args, "pretrained_cfg": pre}


#: what timm's ``PretrainedCfg`` holds where a hub ``config.json`` leaves a preprocessing field out: timm reads
#: the file's pretrained_cfg into that dataclass, so its defaults, not the architecture's, fill the gap
TIMM_CFG_DEFAULTS: Dict[str, Any] = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "crop_pct": 0.875,
                                     "interpolation": "bicubic", "crop_mode": "center"}


def with_timm_defaults(cfg: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """A timm hub ``config.json`` (either form) with the preprocessing fields its pretrained_cfg leaves out filled
    as timm fills them (:data:`TIMM_CFG_DEFAULTS`): without this such a folder was preprocessed with the
    architecture's crop and statistics (0.9, mean 0.5) where timm uses 0.875 and ImageNet's. Any other config, or
    one that says every field, as it is."""
    if not isinstance(cfg, dict) or "architecture" not in cfg or cfg.get("model_type") is not None or \
            cfg.get("format") == "vitkit":
        return cfg
    nested = "pretrained_cfg" in cfg
    pre = cfg["pretrained_cfg"] if nested else cfg
    if not isinstance(pre, dict):
        return cfg  # said where it is read
    missing = {k: v for k, v in TIMM_CFG_DEFAULTS.items() if pre.get(k) is None}  # (null: absent, as timm reads it)
    if not missing:
        return cfg
    return {**cfg, "pretrained_cfg": {**pre, **missing}} if nested else {**cfg, **missing}


def _current_hub_form(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """timm 0.6's ``config.json`` (one dict: ``architecture`` beside the pretrained config's own keys,
    ``labels`` for the class names) in the current form, as timm's ``load_model_config_from_hf`` still
    reads it: without this its mean, std, crop and class names were left out in silence."""
    if "pretrained_cfg" in cfg:
        return cfg
    current = dict(cfg)  # (transformers' TimmWrapper configs have model_args and no pretrained_cfg: kept as they are)
    current["pretrained_cfg"] = {k: v for k, v in cfg.items()
                                 if k not in ("architecture", "num_features", "model_args")}
    if "labels" in cfg and "label_names" not in cfg:
        current["label_names"] = cfg["labels"]
    return current


#: timm's architectures of image-text towers (CLIP, EVA-02 CLIP, Perception Encoder, MobileCLIP), whose
#: pre-trained head is the projection into the joint space (its fine-tuned weights' tags say ``ft``)
_TOWER_NAMES = ("clip", "pe_core", "_mci")


def projection_head(arch: str, pretrained_cfg: Mapping[str, Any]) -> bool:
    """Whether a timm hub config's head is an image-text projection, not classes: an image-text tower's
    architecture with a pre-training tag (``vit_base_patch16_clip_224.openai``: 512 wide, no classes); a
    fine-tuned tag (``laion2b_ft_in1k``) or none (a file saved without timm's tag) is read as classes."""
    base, _, tag = arch.partition(".")
    tag = pretrained_cfg.get("tag") if isinstance(pretrained_cfg.get("tag"), str) else tag
    return bool(tag) and any(n in base for n in _TOWER_NAMES) and "ft" not in tag.split("_")


def _input_size(value: Any) -> Tuple[int, int]:
    """pretrained_cfg's ``input_size`` (channels, height, width) -> (height, width); anything else refused (a size
    of ``"x"`` was taken without a word where model_args gave one)."""
    if not (isinstance(value, (list, tuple)) and len(value) == 3 and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise WeightsError(f"pretrained_cfg input_size must be [channels, height, width] in whole numbers, not "
                           f"{json.dumps(value)[:80]}")
    return int(value[1]), int(value[2])


def _label_names(names: Any, num_classes: Any) -> Dict[str, Any]:
    """A hub config.json's ``label_names`` (a list, or a dict by index) -> the field, where there is one name for
    each class; names for another count are said and left out."""
    if isinstance(names, dict):
        names = [names.get(str(i), names.get(i)) for i in range(len(names))]
    if isinstance(names, list) and num_classes is not None and len(names) == num_classes and None not in names:
        return {"label_names": [str(n) for n in names]}
    if isinstance(names, list) and names and isinstance(num_classes, int) and num_classes:
        # (a headless build, transformers' TimmWrapperModel of a classifier, has no classes to name)
        warnings.warn(f"the config.json's label_names ({len(names)}) are not one name for each of the head's "
                      f"{num_classes} classes: read without names", UserWarning, stacklevel=3)
    return {}


def config_from_hub(cfg: Mapping[str, Any], sd: Mapping[str, Any], stored: bool = False, **overrides: Any):
    """A timm hub ``config.json`` (``architecture``, ``model_args``, ``pretrained_cfg``) -> config.

    The base configuration is the registered model of that name, else the one read off the
    shapes; timm's arguments are translated by the family (``Family.timm_args``). A model built with
    ``dynamic_img_size`` runs at ``pretrained_cfg``'s input size, as timm's data config feeds it, its learned table
    held at the size it was saved at (``pos_embed_size``: ``model_args``' img_size) and resampled to each input's
    grid, as timm does; ``stored``: the model at the size its table was saved at, which the loader reads.
    """
    for key in ("pretrained_cfg", "model_args"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise ValueError(f"{key} must be an object of fields, not a {type(cfg[key]).__name__}")
    cfg = _current_hub_form(cfg)
    arch = str(cfg.get("architecture", ""))
    pre = cfg.get("pretrained_cfg", {}) or {}
    args = cfg.get("model_args", {}) or {}
    base = known_architecture(arch)
    config = get_model_config(base)
    kw: Dict[str, Any] = {k: args[k] for k in _TIMM_ARGS if k in args and args[k] is not None}
    try:
        kw.update(family_of(config).timm_args(args, config))
    except ValueError as e:
        raise WeightsError(str(e)) from None
    if "num_classes" in cfg:
        kw["num_classes"] = int(cfg["num_classes"])
    if cfg.get("model_type") == "timm_wrapper" and "TimmWrapperModel" in (cfg.get("architectures") or []):
        kw["num_classes"] = 0  # transformers builds its TimmWrapperModel headless
    if cfg.get("global_pool") in getattr(type(config), "POOLS", ("token", "avg")):
        kw["global_pool"] = cfg["global_pool"]
    channels = kw.get("in_chans", getattr(config, "in_chans", 3))
    for key in ("mean", "std", "crop_pct", "interpolation", "crop_mode"):
        if pre.get(key) is not None:  # (null: timm's data config takes it as absent)
            kw[key] = tuple(pre[key]) if isinstance(pre[key], list) else pre[key]
            if key in ("mean", "std") and isinstance(kw[key], tuple) and len(kw[key]) == 1 and channels != 1:
                kw[key] *= channels  # one value for every channel: timm's Normalize spreads it
    if pre.get("input_size") is not None:
        served = _input_size(pre["input_size"])
        dynamic = args.get("dynamic_img_size", getattr(config, "dynamic_img_size", False))  # (DINOv3's by default)
        if dynamic and not stored:  # (it ran at model_args' size: other answers than timm's)
            table = kw.get("img_size", getattr(config, "img_size", None))
            kw["img_size"] = served
            if hasattr(config, "pos_embed_size") and kw.get("pos_embed", getattr(config, "pos_embed", "learned")) \
                    == "learned" and "img_size" not in overrides:  # (a size asked for: the table is resampled to it)
                kw.setdefault("pos_embed_size", table)  # timm keeps its table at that size (or at the family's:
                # Qwen3's pos_embed_grid_size), resampled to each input's grid
        kw.setdefault("img_size", served)
    if kw.get("num_classes") and projection_head(arch, pre):
        kw["head_kind"] = "projection"
    kw.update(_label_names(cfg.get("label_names"), kw.get("num_classes")))
    known = set(config.to_dict())
    kw = {k: v for k, v in kw.items() if k in known}
    kw.update(family_of(config).hub_tensor_fields(sd, config.replace(**kw)))  # what only the tensors say
    kw.update(overrides)
    return config.replace(**kw)
