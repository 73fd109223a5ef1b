"""``export_weights``: write a vitkit model in another project's layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..models import family_of
from ..models.serialize import save_pretrained
from ..utils import PathLike, atomic_path, write_json
from . import hf_format, npz_format, timm_format
from .io import WeightsError

EXPORT_FORMATS = ("vitkit", "timm", "hf", "npz", "big_vision")
_LAYOUT_NAMES = {"timm": "timm", "hf": "Hugging Face ViT", "npz": "official JAX", "big_vision": "big_vision"}


def export_weights(model: nn.Module, path: PathLike, format: str = "npz", scan: bool = False) -> Path:
    """Write ``model`` as ``format``:

    - ``vitkit``: a folder with config.json + model.safetensors (as ``save_pretrained``);
    - ``timm``: a timm state dict, ``.safetensors`` or ``.pth`` by the file's suffix;
    - ``hf``: a Hugging Face ViT folder (config.json, preprocessor_config.json, model.safetensors);
    - ``npz``: the paper's vit_jax npz; ``big_vision``: big_vision's (``scan=True`` stacks blocks).

    Files are written atomically. Layouts that cannot express the model raise a
    :class:`WeightsError` saying which feature is in the way.
    """
    path = Path(path)
    if format not in EXPORT_FORMATS:
        raise WeightsError(f"unknown export format {format!r}; expected one of {', '.join(EXPORT_FORMATS)}")
    if format == "vitkit":
        return save_pretrained(model, path)
    fam = family_of(model.config)
    if format not in fam.layouts:
        raise WeightsError(f"{fam.config_cls.KIND} models (architecture {fam.name!r}) have no {_LAYOUT_NAMES[format]} "
                           f"layout ({format!r}); "
                           f"export them as {', '.join(repr(f) for f in ('vitkit',) + fam.layouts)}")
    if format == "timm":
        sd = timm_format.from_native(model)
        if path.suffix == ".safetensors":
            _save_safetensors(sd, path)
        elif path.suffix in (".pth", ".pt", ".bin"):
            with atomic_path(path) as tmp:
                torch.save(sd, tmp)
        else:
            raise WeightsError(f"timm export: use a .safetensors or .pth file name, not {path.name!r}")
        return path
    if format == "hf":
        sd = hf_format.from_native(model)
        path.mkdir(parents=True, exist_ok=True)
        _save_safetensors(sd, path / "model.safetensors")
        write_json(path / "config.json", hf_format.config_to_hf(model.config))
        write_json(path / "preprocessor_config.json", hf_format.preprocessor_to_hf(model.config))
        return path
    if format in ("npz", "big_vision"):
        if path.suffix != ".npz":
            raise WeightsError(f"npz export: the file name must end in .npz, not {path.name!r}")
        arrays = npz_format.from_native(model, "vit_jax" if format == "npz" else "big_vision", scan)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
        return path
    raise WeightsError(f"unknown export format {format!r}; expected one of {', '.join(EXPORT_FORMATS)}")


def _save_safetensors(sd, path: Path) -> None:
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp))
