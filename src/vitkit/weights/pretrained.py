"""``from_pretrained``: a ready model from a folder, a file or the Hugging Face Hub.

The architecture comes from the source's own config when it has one (vitkit, timm hub,
Hugging Face ``config.json``), else it is read off the tensor shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from torch import nn

from ..models import build_from_config, config_from_dict, get_model_config
from ..selfsup import pretrainer_from_configs
from ..utils import PathLike, require
from . import hf_format, npz_format, selfsup_format, timm_format
from .io import WeightsError
from .load import WEIGHT_FILES, Source, load_weights, read_source, to_native

HUB_PREFIX = "hf-hub:"
_HUB_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.npz")
_HUB_OPTIONAL_FILES = ("preprocessor_config.json",)


def download_from_hub(spec: str, cache_dir: Optional[PathLike] = None) -> Path:
    """Fetch ``config.json`` and one weight file of ``org/name[@revision]``; return their folder."""
    repo, _, revision = spec.partition("@")
    if repo.count("/") != 1:
        raise WeightsError(f"hub id {spec!r} should look like 'org/name' or 'org/name@revision'")
    hub = require("huggingface_hub", "hub", "'hf-hub:' sources (or pass a folder downloaded elsewhere)")

    def fetch(name: str) -> str:
        return hub.hf_hub_download(repo, name, revision=revision or None,
                                   cache_dir=None if cache_dir is None else str(cache_dir))

    try:
        config_path = Path(fetch("config.json"))
    except Exception as e:  # the hub client raises many types; all mean "not available"
        raise WeightsError(
            f"could not fetch config.json of {repo!r} from the Hugging Face Hub "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}). "
            f"Offline or no access? Download the repository elsewhere and pass the local folder "
            f"to from_pretrained().") from e
    for name in _HUB_OPTIONAL_FILES + _HUB_WEIGHT_FILES:
        try:
            fetch(name)
            if name in _HUB_WEIGHT_FILES:
                break
        except Exception as e:
            if "EntryNotFound" not in type(e).__name__ and "NotFound" not in type(e).__name__:
                raise WeightsError(f"could not fetch {name} of {repo!r}: {type(e).__name__}: {e}") from e
    else:
        raise WeightsError(f"{repo!r} has none of {', '.join(_HUB_WEIGHT_FILES)}")
    return config_path.parent


def config_for_source(src: Source, **overrides: Any):
    """The model configuration a source describes (its config file, else its shapes)."""
    cj = src.config_json
    if cj and cj.get("format") == "vitkit":
        if not isinstance(cj.get("config"), dict):
            where = src.path.parent / "config.json" if src.path else "config.json"
            raise WeightsError(f"{where}: a vitkit config.json needs a \"config\" object "
                               f"(the model's fields), got {cj.get('config')!r}")
        return config_from_dict(cj["config"]).replace(**overrides)
    if cj and cj.get("model_type") is not None:
        return hf_format.config_from_hf(cj, src.tensors, src.preprocessor_json, **overrides)
    if src.pretraining and src.format == "vitkit":
        raise WeightsError("a vitkit pre-training model needs its config.json (its objective's options): "
                           "pass the folder that holds both")
    if src.format == "hf":
        raise WeightsError("Hugging Face weights need their config.json (heads, eps, image size): "
                           "pass the folder that holds both")
    if cj and "architecture" in cj:
        return timm_format.config_from_hub(cj, src.tensors, **overrides)
    sd, facts = to_native(src)
    if src.format in ("npz", "big_vision"):
        return npz_format.infer_config(sd, facts, **overrides)
    if src.pretraining == "mae":  # the official MAE layout: ImageNet statistics, as MAE trains
        overrides = {**selfsup_format.official_mae_encoder_overrides(), **overrides}
    return timm_format.infer_config(sd, **overrides)


def from_pretrained(source: PathLike, model_name: Optional[str] = None, strict: bool = True,
                    interpolation: str = "bicubic", encoder_only: bool = False, **overrides: Any) -> nn.Module:
    """Build a model and load its weights from a folder, a file or ``"hf-hub:org/name"``.

    ``model_name`` forces the architecture (``"vit_small_patch16_224"``) instead of reading it
    from the source. Overrides change the configuration: ``img_size=384`` resamples the
    position embeddings; a new ``num_classes`` keeps a fresh zero-initialised head;
    ``in_chans=1`` sums RGB patch filters for grey input (and averages the normalisation).

    A pre-training model (a vitkit pre-training run, Hugging Face ``ViTForMaskedImageModeling``
    / ``ViTMAEForPreTraining``, an official MAE checkpoint) comes back as the
    :mod:`vitkit.selfsup` model; ``encoder_only=True`` gives its encoder, a plain ViT.
    """
    path = weights_path(source)
    if not path.exists():
        raise WeightsError(f"weights not found: {path} (no such file or folder)")
    src = read_source(path)
    if src.pretraining and not encoder_only:
        return _pretrainer(src, model_name, strict, interpolation, overrides)
    stored = _named_config(src, model_name) if model_name else config_for_source(src)
    config = stored.replace(**fit_channel_stats(stored, overrides))
    model = build_from_config(config)
    exclude: Tuple[str, ...] = ()
    if config.num_classes != stored.num_classes:
        exclude = ("head.",)
    load_weights(model, src, strict=strict, interpolation=interpolation, exclude=exclude)
    model.eval()
    return model


def _pretrainer(src: Source, model_name: Optional[str], strict: bool, interpolation: str,
                overrides: Dict[str, Any]) -> nn.Module:
    """The pre-training model a source holds, at its own size (fine-tuning changes sizes)."""
    if model_name or overrides:
        given = ", ".join(([f"model_name={model_name!r}"] if model_name else []) + sorted(overrides))
        raise WeightsError(f"a pre-training model loads as it was saved ({given} cannot change it); fine-tune "
                           f"its encoder instead (vitkit train --init), or pass encoder_only=True")
    encoder = config_for_source(src)
    model = pretrainer_from_configs(encoder, selfsup_format.options(src.pretraining, src.tensors, src.config_json,
                                                                    encoder))
    load_weights(model, src, strict=strict, interpolation=interpolation)
    return model.eval()


def weights_path(source: PathLike) -> Path:
    """The local file or folder of ``source``: ``"hf-hub:org/name"`` is downloaded first; a
    training run's folder (``runs/NAME``) stands for the model it saved (``runs/NAME/model``)."""
    text = str(source)
    path = download_from_hub(text[len(HUB_PREFIX):]) if text.startswith(HUB_PREFIX) else Path(source)
    return run_model_folder(path) or path


def run_model_folder(path: Path) -> Optional[Path]:
    """``path/model`` when ``path`` is a vitkit run's folder (its config.json is a training
    config, its model saved in ``model/``), else None."""
    if path.is_dir() and not any((path / n).is_file() for n in WEIGHT_FILES) \
            and (path / "model" / "config.json").is_file():
        return path / "model"
    return None


def fit_channel_stats(stored, overrides: dict) -> dict:
    """A new ``in_chans`` brings per-channel mean/std of that length unless they are given."""
    chans = overrides.get("in_chans", stored.in_chans)
    out = dict(overrides)
    for key in ("mean", "std"):
        values = tuple(out.get(key, getattr(stored, key)))
        if len(values) != chans:
            avg = sum(values) / len(values)
            out[key] = (avg,) * chans
    return out


def _named_config(src: Source, model_name: str):
    """A registered architecture, with the class count the checkpoint's head has."""
    config = get_model_config(model_name)
    sd, _ = to_native(src)
    head = "head.fc.weight" if "head.fc.weight" in sd else "head.weight"  # ResNetV2: a 1x1 conv head
    classes = sd[head].shape[0] if head in sd else 0
    return config.replace(num_classes=classes)
