"""Families and names: architecture -> family description, model name -> configuration.

A **family** is one file of ``models/`` (``vit.py``, ``cait.py``, ``convit.py``,
``resnetv2.py``): its config class, its module, and a :class:`Family` that tells shared code
what it needs to know -- the cost of a configuration, how to recognise the family's state
dicts and read a config off their shapes, how timm names its options, which weight layouts
can carry it, which extra analyses apply. ``complexity``, ``weights/`` and ``inspect/`` ask
the family instead of branching on types. The file registers its family and its model names
(timm's, where timm has the model) when imported; ``models/__init__`` imports every family.

This module imports no family (so a family may import it without a cycle).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Pattern, Sequence, Tuple, Union

import torch
from torch import nn

from ..utils import check_switches
from .config_base import fit_channel_stats


def _state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def _no_args(args: Mapping[str, Any], config: Any) -> Dict[str, Any]:
    return {}


def _config_dict(config: Any) -> Dict[str, Any]:
    return config.to_dict()


@dataclass(frozen=True)
class Family:
    """Everything shared code needs to know about one model family."""

    #: the ``architecture`` value its configs carry (what ``config.json`` stores)
    name: str
    config_cls: type
    model_cls: type
    #: config -> :class:`vitkit.models.complexity.Complexity` of one image
    complexity: Callable[[Any], Any]
    #: state-dict keys (timm/vitkit names) -> whether they are this family's
    matches: Callable[[Collection[str]], bool]
    #: (state dict, **overrides) -> config, read off the tensor shapes; raises ValueError
    infer_config: Callable[..., Any]
    #: families with a higher priority are asked first whether a state dict is theirs
    detect_priority: int = 0
    #: model -> state dict in timm's layout (vitkit's names are timm's: a copy by default)
    to_timm: Callable[[nn.Module], Dict[str, torch.Tensor]] = _state_dict
    #: (timm hub ``model_args``, the base config) -> this family's config fields
    timm_args: Callable[[Mapping[str, Any], Any], Dict[str, Any]] = _no_args
    #: config -> the config that describes ``to_timm``'s state dict (as a dict; what a timm
    #: export carries in its metadata and what reading it back must rebuild)
    timm_config: Callable[[Any], Dict[str, Any]] = _config_dict
    #: the weight layouts that can express the family (besides vitkit's own)
    layouts: Tuple[str, ...] = ("timm",)
    #: extra analyses of ``vitkit inspect`` that apply (names from :mod:`vitkit.inspect.report`)
    analyses: Tuple[str, ...] = ()
    #: whether the models are patch-token transformers (``vitkit info``, inspection) or CNNs
    tokens: bool = True
    #: timm's state dict -> vitkit's names, for a family whose timm names are not vitkit's (None: they are;
    #: DeepSeek's classifier keeps its encoder under ``encoder.``); ``matches`` recognises timm's names
    from_timm: Optional[Callable[[Mapping[str, Any]], Dict[str, Any]]] = None
    #: (a timm hub folder's tensors, the base config) -> fields its ``config.json`` leaves to the tensors (timm
    #: resolves DeepSeek's projector width from the checkpoint's tag)
    hub_tensor_fields: Callable[[Mapping[str, Any], Any], Dict[str, Any]] = _no_args


_FAMILIES: Dict[str, Family] = {}


def register_family(family: Family) -> Family:
    if family.name in _FAMILIES:
        raise ValueError(f"model family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Remove a family and its model names (for families defined in tests)."""
    _FAMILIES.pop(name, None)
    for key in [k for k, m in _MODELS.items() if getattr(m.config, "architecture", None) == name]:
        del _MODELS[key]


def family(architecture: str) -> Family:
    """The family of an ``architecture`` name."""
    if architecture not in _FAMILIES:
        raise ValueError(f"unknown architecture {architecture!r}; known: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[architecture]


def family_of(config: Any) -> Family:
    """The family of a configuration (by its ``architecture`` field)."""
    return family(getattr(config, "architecture", None))


def families() -> List[Family]:
    """Every registered family, the most specific state-dict recogniser first."""
    return sorted(_FAMILIES.values(), key=lambda f: -f.detect_priority)


def family_of_state_dict(keys: Collection[str]) -> Optional[Family]:
    """The family whose state dicts have these key names, or None."""
    keys = list(keys)
    return next((f for f in families() if f.matches(keys)), None)


def renamed_in_timm(keys: Collection[str]) -> Optional[Family]:
    """The family whose timm names these are, where they are not vitkit's (``Family.from_timm``), or None."""
    keys = list(keys)
    return next((f for f in families() if f.from_timm is not None and f.matches(keys)), None)


def register_architecture(name: str, config_cls: type, model_cls: type) -> None:
    """Register a bare architecture (no cost model, no state-dict recogniser): prefer :class:`Family`."""
    def unsupported(*args, **kw):
        raise ValueError(f"architecture {name!r} was registered without a family description")
    register_family(Family(name, config_cls, model_cls, complexity=unsupported, matches=lambda keys: False,
                           infer_config=unsupported))


def build_from_config(config: Any) -> nn.Module:
    """Instantiate the module of ``config``'s family."""
    return family_of(config).model_cls(config)


def config_from_dict(d: Dict[str, Any]) -> Any:
    """A config from its ``to_dict`` form (``config.json``); the family comes from ``architecture``."""
    if not isinstance(d, Mapping):
        raise ValueError(f"a model config must be a mapping of fields, not {type(d).__name__}")
    arch = d.get("architecture", "vit")
    if arch not in _FAMILIES:
        raise ValueError(f"unknown architecture {arch!r} in config; known: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[arch].config_cls.from_dict(d)


# ----------------------------------------------------------------------------- model names


@dataclass(frozen=True)
class ModelEntry:
    name: str
    config: Any
    description: str = ""


_MODELS: Dict[str, ModelEntry] = {}
#: (pattern, config factory of the match): names accepted without being listed ("B/16")
_PATTERNS: List[Tuple[Pattern[str], Callable[[re.Match], Any]]] = []


def register_model(name: str, config: Any, description: str = "") -> None:
    if name in _MODELS:
        raise ValueError(f"model {name!r} is registered twice")
    config.name = name
    _MODELS[name] = ModelEntry(name, config, description)


def register_name_pattern(pattern: str, factory: Callable[[re.Match], Any]) -> None:
    """Accept names matching ``pattern`` (a regular expression) by building their config with ``factory``."""
    _PATTERNS.append((re.compile(pattern), factory))


def list_models(pattern: str = "*") -> List[str]:
    """Registered model names, optionally filtered by a shell-style pattern."""
    if not isinstance(pattern, str):
        raise ValueError(f"list_models takes a shell-style pattern string (\"*dinov2*\"), not {pattern!r}")
    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def get_model_config(name: str) -> Any:
    """The configuration behind a name (a copy: changing it changes nothing registered)."""
    if not isinstance(name, str):  # None or 3 was a TypeError inside re
        raise ValueError(f"a model name is a string (\"vit_base_patch16_224\", \"B/16\"), not {name!r}")
    for pattern, factory in _PATTERNS:
        m = pattern.match(name)
        if m:
            config = factory(m)
            config.name = name
            return config
    if name not in _MODELS:
        close = difflib.get_close_matches(name, list(_MODELS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `vitkit models`"
        raise ValueError(f"unknown model {name!r}{hint}")
    return _MODELS[name].config.replace()


def create_model(name: str, features_only: bool = False, out_indices: Optional[Union[int, Sequence[int]]] = None,
                 pyramid: bool = False, pyramid_channels: int = 256, **overrides: Any) -> nn.Module:
    """Build a model by registered name (``vit_base_patch16_224``) or size string (``"B/16"``).

    Keyword overrides change the configuration: ``create_model("B/16", img_size=384,
    num_classes=10)``. The model is randomly initialised as the official code does; load
    weights with :func:`vitkit.load_weights` or use :func:`vitkit.from_pretrained`.
    ``features_only=True`` gives a backbone (:class:`~vitkit.models.features.FeatureModel`): the
    maps of blocks ``out_indices`` as timm's ``features_only``, or with ``pyramid=True`` ViTDet's
    four-scale pyramid of ``pyramid_channels`` channels.
    """
    if pretrained := overrides.pop("pretrained", False):
        raise ValueError(f"create_model builds random weights (pretrained={pretrained!r}): load weights with "
                         f"vitkit.from_pretrained(a file, a folder or 'hf-hub:org/name')")
    check_switches("create_model", features_only=features_only, pyramid=pyramid)
    base = get_model_config(name)
    has_mlp_dim = "mlp_dim" in getattr(base, "__dataclass_fields__", ()) and bool(base.mlp_dim)
    if has_mlp_dim and isinstance(overrides.get("embed_dim"), int) and "mlp_dim" not in overrides:
        # the MLP keeps its ratio to the width, as timm's mlp_ratio does (it kept the registered width)
        overrides["mlp_dim"] = int(overrides["embed_dim"] * base.mlp_dim / base.embed_dim)
    config = base.replace(**fit_channel_stats(base, overrides))
    return as_features(build_from_config(config), features_only, out_indices, pyramid, pyramid_channels)


def as_features(model: nn.Module, features_only: bool, out_indices: Optional[Union[int, Sequence[int]]],
                pyramid: bool, pyramid_channels: int, norm: bool = False) -> nn.Module:
    """``model`` itself, or (``features_only``) its backbone, its maps through the final norm with ``norm``;
    the feature options need it."""
    if not features_only:
        if pyramid or out_indices is not None or pyramid_channels != 256:
            raise ValueError("out_indices, pyramid and pyramid_channels apply with features_only=True")
        return model
    from .features import FeatureModel

    return FeatureModel(model, out_indices, norm=norm, pyramid=pyramid, pyramid_channels=pyramid_channels)


__all__ = ["Family", "register_family", "unregister_family", "family", "family_of", "families",
           "family_of_state_dict", "renamed_in_timm", "register_architecture", "build_from_config", "config_from_dict",
           "ModelEntry", "register_model", "register_name_pattern", "list_models", "get_model_config", "create_model",
           "as_features"]
