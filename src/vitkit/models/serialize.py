"""Writing a model in vitkit's native layout: ``config.json`` + ``model.safetensors``.

Reading (with format detection and every foreign layout) lives in :mod:`vitkit.weights`;
writing the native layout is here so that ``model.save_pretrained`` needs nothing above
``models/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import torch
from torch import nn

from .._version import __version__
from ..files import PathLike, atomic_path, weights_folder, write_json

NATIVE_FORMAT = "vitkit"
NATIVE_FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
#: the safetensors metadata key of ``config.json``'s content in ``model.safetensors``: the file alone (copied
#: without its folder) is read exactly, not as a bare state dict whose unstored fields are guessed
CONFIG_JSON_METADATA_KEY = "vitkit_config_json"


def native_config_dict(config: Any, **extra: Any) -> Dict[str, Any]:
    """``config.json``'s content: the model's config, and ``extra`` top-level entries (a
    pre-training model adds ``"pretraining"``: its objective and options; ``config`` stays its
    encoder's, so every reader of the architecture finds a plain ViT there)."""
    return {"format": NATIVE_FORMAT, "format_version": NATIVE_FORMAT_VERSION,
            "vitkit_version": __version__, "config": config.to_dict(), **extra}


def save_pretrained(model: nn.Module, directory: PathLike, config: Any = None, **extra: Any) -> Path:
    """Write ``directory/config.json`` and ``directory/model.safetensors`` (each atomically; a
    failed save removes the folder it made); ``config`` (default ``model.config``) and ``extra``
    as :func:`native_config_dict` says."""
    from safetensors.torch import save_file

    if config is None:
        _check_rebuildable(model)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    # a failed save removes the folder it made, or leaves the one there was as it was
    described = native_config_dict(model.config if config is None else config, **extra)
    with weights_folder(directory, _own_files) as into:
        with atomic_path(into / WEIGHTS_NAME) as tmp:
            save_file(tensors, str(tmp), metadata={"format": NATIVE_FORMAT,
                                                   CONFIG_JSON_METADATA_KEY: json.dumps(described)})
        write_json(into / CONFIG_NAME, described)
    return Path(directory)


def _check_rebuildable(model: nn.Module) -> None:
    """Refuse to write what ``from_pretrained`` would refuse to read (the save succeeded, the reload said "it was
    edited or mixed with other weights"): tensors its config does not build (a head replaced by assignment, a
    module added) and NaN or infinite values."""
    import torch

    if any(v.is_meta for v in model.state_dict().values()):
        raise ValueError("the model is on the meta device (shapes without values): load its weights first "
                         "(load_weights(model, ..., copy=True) on a model built on the CPU)")
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in type(model)(model.config).state_dict().items()}
    have = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = [f"{k} is {have[k]}, the config builds {expected[k]}" for k in have if k in expected
                and have[k] != expected[k]] + [f"{k} is not in the model the config builds" for k in have
                                               if k not in expected] + [f"{k} is missing" for k in expected
                                                                        if k not in have]
    if problems:
        raise ValueError(f"the model's tensors do not match its config ({'; '.join(problems[:3])}"
                         f"{' ...' if len(problems) > 3 else ''}): from_pretrained could not rebuild it; after "
                         f"replacing a layer by assignment, use model.reset_classifier(n) (a new head) or a config "
                         f"that builds it")
    bad = non_finite(model.state_dict(), getattr(model, "UNBOUNDED", ()))
    if bad:
        raise ValueError(f"the model holds NaN or infinite values ({', '.join(bad[:3])}"
                         f"{' ...' if len(bad) > 3 else ''}): weights from_pretrained refuses; nothing was written")


def _own_files(folder: Path) -> list:
    """The files of vitkit's own layout in ``folder`` (what a save replaces; ``vitkit convert`` replaces any
    layout's, :func:`vitkit.weights.load.model_files`)."""
    return [folder / name for name in (CONFIG_NAME, WEIGHTS_NAME) if (folder / name).is_file()]


class SaveMixin:
    def save_pretrained(self, directory: PathLike) -> Path:
        """Save config and weights so :func:`vitkit.from_pretrained` rebuilds this model."""
        return save_pretrained(self, directory)  # type: ignore[arg-type]


def non_finite(sd: Mapping[str, Any], unbounded: Sequence[str] = ()) -> List[str]:
    """The floating tensors of a state dict that hold NaN or inf; one whose name ends in one of ``unbounded`` (a
    family's clamp bounds, its ``UNBOUNDED``: inf is no bound, Gemma 4's) may be infinite, NaN never."""
    def bad(name: str, value: Any) -> bool:
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            return False
        if name.endswith(tuple(unbounded)):
            return bool(torch.isnan(value).any())
        return not bool(torch.isfinite(value).all())

    return [k for k, v in sd.items() if bad(k, v)]


__all__ = ["save_pretrained", "SaveMixin", "native_config_dict", "non_finite", "CONFIG_NAME", "WEIGHTS_NAME"]
