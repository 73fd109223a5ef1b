"""``export_weights``: write a vitkit model in another project's layout."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from ..files import PathLike, atomic_path, check_output, weights_folder, write_json
from ..models import family_of, positions
from ..models.features import FeatureModel
from ..models.serialize import save_pretrained
from ..runlock import run_settings
from ..selfsup import Pretrainer
from . import gemma4_format, hf_format, hf_towers, npz_format, selfsup_format, timm_format
from .io import WeightsError, save_safetensors
from .load import CONFIG_METADATA_KEY, model_files

EXPORT_FORMATS = ("vitkit", "timm", "hf", "npz", "big_vision", "mae")
_LAYOUT_NAMES = {"timm": "timm", "hf": "Hugging Face", "npz": "official JAX", "big_vision": "big_vision",
                 "mae": "official MAE"}


#: The files a folder of weights is read from, and those ``vitkit`` and ``hf`` folders are written as.
FOLDER_FILES = ("config.json", "preprocessor_config.json", "processor_config.json", "model.safetensors",
                "pytorch_model.bin", "model.pth", "model.npz")
#: Suffixes of a file, never of a folder to write into.
_FILE_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz", ".onnx", ".json")


#: the file names each file layout's writer takes (its own check, made again by check_destination before the work)
FILE_SUFFIXES = {"timm": (".safetensors", ".pth", ".pt", ".bin"), "npz": (".npz",), "big_vision": (".npz",),
                 "mae": (".pth", ".pt"), "onnx": (".onnx",)}


def check_destination(src: str, dst: str, to: str) -> None:
    """``dst`` can be written as ``to`` writes it (a folder for vitkit/hf, a file otherwise; an
    OpenVINO IR's ``.xml`` with its ``.bin``) and would not overwrite a file ``src`` is read from
    (``convert M M/model.safetensors --to timm`` would replace the model it reads with another
    layout). Called before the work, so a mistake costs no conversion."""
    from .pretrained import run_model_folder

    folder = to in ("vitkit", "hf")
    if folder and Path(dst).suffix.lower() in _FILE_SUFFIXES:
        raise ValueError(f"--to {to} writes a folder (config.json, model.safetensors, ...); DST {dst} is a file name")
    if to == "openvino" and Path(dst).suffix.lower() != ".xml":
        raise ValueError(f"--to openvino writes an IR: DST must end in .xml (its weights go beside it as .bin), "
                         f"not {dst}")
    if to in FILE_SUFFIXES and Path(dst).suffix.lower() not in FILE_SUFFIXES[to]:  # said before the model is read
        raise ValueError(f"--to {to} writes a file: DST must end in {' or '.join(FILE_SUFFIXES[to])}, not {dst}")
    check_output(dst, "folder" if folder else "file", "DST")
    if to == "openvino":
        check_output(str(Path(dst).with_suffix(".bin")), "file", "DST's weights")
    if folder and run_settings(Path(dst)) is not None:  # its config.json, which the model's would replace
        raise ValueError(f"DST {dst} is a training run's folder (its config.json holds the run's settings): write "
                         f"the model somewhere else")
    source = Path(src)
    source = run_model_folder(source) or source
    if folder and source.is_dir() and Path(dst).resolve() == source.resolve():  # its model files would be replaced
        raise ValueError(f"DST {dst} is the folder SRC {src} is read from (its files would be replaced by the "
                         f"converted ones): write somewhere else")
    reads = ({source / name for name in FOLDER_FILES} | set(model_files(source))) if source.is_dir() else {source}
    writes = {Path(dst) / name for name in FOLDER_FILES} if folder else {Path(dst)}
    if to == "openvino":
        writes.add(Path(dst).with_suffix(".bin"))
    hit = sorted(str(p) for p in {p.resolve() for p in reads} & {p.resolve() for p in writes} if p.exists())
    if hit:
        raise ValueError(f"DST {dst} would overwrite {hit[0]}, which SRC {src} is read from: write somewhere else")


def source_half_dtype(source: PathLike) -> Optional[torch.dtype]:
    """The half precision a ``.safetensors`` source (a file, or a folder's weights) stores its floats in, else None:
    what a copy of it in another layout keeps (not twice its size as float32)."""
    from .io import stored_half_dtype
    from .load import folder_weights
    from .pretrained import weights_path

    path = weights_path(source)
    path = folder_weights(path) if path.is_dir() else path
    return stored_half_dtype(path) if path is not None else None


def export_weights(model: nn.Module, path: PathLike, format: str = "npz", scan: bool = False) -> Path:
    """Write ``model`` as ``format``:

    - ``vitkit``: a folder with config.json + model.safetensors (as ``save_pretrained``);
    - ``timm``: a timm state dict, ``.safetensors`` or ``.pth`` by the file's suffix;
    - ``hf``: a Hugging Face folder (config.json, preprocessor_config.json, model.safetensors): the vision
      tower the model is (CLIP, SigLIP, DINOv2, DINOv3: :mod:`.hf_towers`), else a ViT;
    - ``npz``: the paper's vit_jax npz; ``big_vision``: big_vision's (``scan=True`` stacks blocks);
    - ``mae``: the official MAE checkpoint (a ``.pth`` of tensors under ``model``; MAE models).

    A pre-training model (:mod:`vitkit.selfsup`) exports whole as ``vitkit``, ``hf`` (SimMIM as
    ``ViTForMaskedImageModeling``, MAE as ``ViTMAEForPreTraining``) and ``mae``; as ``timm``,
    ``npz`` and ``big_vision``, which have no place for its decoder, its encoder is written
    (an :class:`ExportWarning` says so).

    Files are written atomically. Layouts that cannot express the model raise a
    :class:`WeightsError` saying which feature is in the way.
    """
    path = Path(path)
    if isinstance(model, FeatureModel):  # a backbone: the model it wraps (features_only is chosen when loading)
        model = model.model
    if format not in EXPORT_FORMATS:
        raise WeightsError(f"unknown export format {format!r}; expected one of {', '.join(EXPORT_FORMATS)}")
    if format in ("vitkit", "hf") and path.suffix.lower() in _FILE_SUFFIXES:  # (the command line refused it)
        raise WeightsError(f"the {format!r} layout is a folder (config.json, model.safetensors, ...); {path} is a "
                           f"file name: give a folder")
    if format in ("hf", "npz", "big_vision") or (format == "mae" and isinstance(model, Pretrainer)):  # one size
        model = _table_at_img_size(model, format)
    if isinstance(model, Pretrainer):
        if format == "vitkit":
            return _replacing(path, model.save_pretrained)
        if format in ("hf", "mae"):
            written = selfsup_format.export(model, path, format)
            if format == "mae":
                _mae_statistics_note(model, path)
            return written
        warnings.warn(f"the {_LAYOUT_NAMES[format]} layout has no place for {model.objective}'s decoder: "
                      f"{path} holds its encoder (a ViT without head)", ExportWarning, stacklevel=2)
        model = model.encoder
    if format == "vitkit":
        return _replacing(path, lambda into: save_pretrained(model, into))
    if format == "mae":
        what = "a classifier" if getattr(model.config, "num_classes", 0) else "an encoder without a decoder"
        raise WeightsError(f"the official MAE layout holds MAE pre-training models; this is {what} "
                           f"(export it as 'timm': MAE's fine-tuned checkpoints and released encoders are timm state "
                           f"dicts)")
    fam = family_of(model.config)
    if format not in fam.layouts:
        raise WeightsError(f"{fam.config_cls.KIND} models (architecture {fam.name!r}) have no {_LAYOUT_NAMES[format]} "
                           f"layout ({format!r}); "
                           f"export them as {', '.join(repr(f) for f in ('vitkit',) + fam.layouts)}")
    if format == "timm":
        return _export_timm(model, path)
    if format == "hf":
        return _export_hf(model, path)
    if format in ("npz", "big_vision"):
        return _export_npz(model, path, format, scan)
    raise WeightsError(f"unknown export format {format!r}; expected one of {', '.join(EXPORT_FORMATS)}")


def _export_npz(model: nn.Module, path: Path, format: str, scan: bool) -> Path:
    """The official arrays (vit_jax's or big_vision's), and what reading them back assumes otherwise."""
    if path.suffix.lower() != ".npz":
        raise WeightsError(f"npz export: the file name must end in .npz, not {path.name!r}")
    arrays = npz_format.from_native(model, "vit_jax" if format == "npz" else "big_vision", scan)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    lost = npz_format.read_back_losses(arrays, model)
    if lost:  # the official files hold arrays only: say what reading one back assumes, as --to timm's .pth does
        warnings.warn(f"{path} holds the official arrays only: read back, it would have {'; '.join(lost)}. "
                      f"Load it with this model's values as keywords (from_pretrained(path, field=value); "
                      f"vitkit predict --mean --std), or export as 'vitkit' or 'timm' (.safetensors), which "
                      f"keep them",
                      ExportWarning, stacklevel=3)
    return path


def writes_held_table(model: nn.Module, format: str) -> bool:
    """Whether ``format`` writes a table held at another size (``pos_embed_size``) as it is held: vitkit's and timm's
    layouts, and transformers' DINOv2 (which resamples the table as stored); the others hold one size."""
    if format == "hf":
        inner = positions.token_model(model)
        return inner is not None and hf_towers.holds_table_apart(inner.config)
    return format not in ("npz", "big_vision", "mae")


def _table_at_img_size(model: nn.Module, format: str) -> nn.Module:
    """The layouts of one image size (Hugging Face's, the npz and MAE files) get a table held at another size
    (``pos_embed_size``) resampled to the model's own, as it computes at that size; said, since other sizes lose.
    A pre-training model's encoder too (:func:`writes_held_table`)."""
    if not positions.held_apart(model) or writes_held_table(model, format):
        return model
    served = positions.at_img_size(model)
    inner = positions.token_model(model)
    held, grid = positions.table_grid(inner), inner.patch_embed.grid_size
    warnings.warn(f"the position table, held at {held[0]}x{held[1]} (pos_embed_size) and resampled to each "
                  f"input's grid, is written resampled to {grid[0]}x{grid[1]} (img_size): the "
                  f"{_LAYOUT_NAMES[format]} layout holds one size; export as 'vitkit' or 'timm' to keep it",
                  ExportWarning, stacklevel=3)
    return served


def _replacing(path: Path, save) -> Path:
    """``save(folder)`` into ``path`` as a whole: the model files of any layout the folder held (an HF
    model's shards and processor) go as the new ones move in; a failure leaves it as it was."""
    with weights_folder(path, model_files) as into:
        save(into)
    return path


def _export_hf(model: nn.Module, path: Path) -> Path:
    """A Hugging Face folder: the vision tower the model is (CLIP, SigLIP, DINOv2, DINOv3), else a ViT."""
    gemma4 = model.config.architecture == "gemma4"  # (its processor resizes each image within a budget: not written)
    kind = "gemma4_vision" if gemma4 else hf_towers.layout_of(model.config)
    processor: Optional[dict] = None
    if gemma4:
        sd, config = gemma4_format.from_native(model)
    elif kind is not None:
        sd, config = hf_towers.from_native(model)
        processor = hf_towers.preprocessor_to_hf(model.config, kind)
    elif model.config.architecture != "vit" or _later_vit(model.config):
        nearest, problems = min(hf_towers.export_problems(model.config).items(), key=lambda kv: len(kv[1]))
        raise WeightsError(f"no Hugging Face class expresses this model: the nearest, {nearest}, cannot hold "
                           f"{'; '.join(problems)} (export as 'timm' or 'vitkit')")
    else:
        sd, config, processor = (hf_format.from_native(model), hf_format.config_to_hf(model.config),
                                 hf_format.preprocessor_to_hf(model.config))
        _pooler_note(model.config, path)
    _processor_notes(model.config, path, kind)
    floats = {t.dtype for t in sd.values() if t.is_floating_point()}
    if len(floats) == 1:  # as transformers' save_pretrained writes it: dtype="auto" (4.x) reads it
        config["dtype"] = str(floats.pop()).replace("torch.", "")
    with weights_folder(path, model_files) as into:  # a failure leaves the folder as it was (or none)
        save_safetensors(sd, into / "model.safetensors")
        write_json(into / "config.json", config)
        if processor is not None:
            hf_format.write_preprocessor(into, path, processor)
    return path


def _processor_notes(config, path: Path, kind: Optional[str]) -> None:
    """What the folder's image processor does otherwise than vitkit's preprocessing, said (SAM's processor pads at
    the right and bottom: exact for crop_mode='border' with crop_offset='start', SAM's own)."""
    if kind == "gemma4_vision":
        warnings.warn(f"{path}: no image processor is written: Gemma 4's (Gemma4ImageProcessor, the Gemma 4 "
                      f"repository's) resizes each image to its own grid within a budget of soft tokens, keeping its "
                      f"aspect, and scales it to [0, 1], where this model's pipeline resizes every image to "
                      f"{config.img_size[0]}x{config.img_size[1]}", ExportWarning, stacklevel=4)
        return
    if kind == "sam_vision_model":
        if (config.crop_mode, config.crop_offset) != ("border", "start"):
            warnings.warn(f"{path}: transformers' SamImageProcessor resizes the longer side and pads the image at the "
                          f"right and bottom (SAM's preprocessing), where this model's is crop_mode="
                          f"{config.crop_mode!r}: transformers' pixels will differ on images that are not square "
                          f"(crop_mode='border' with crop_offset='start' is written exactly)", ExportWarning,
                          stacklevel=4)
        return
    h, w = config.img_size
    if h != w and getattr(config, "crop_mode", "center") == "center":
        warnings.warn(f"{path}: Hugging Face's image processors resize the shorter side and then crop, where vitkit "
                      f"(as timm) resizes a non-square model's images to cover {h}x{w} keeping their aspect: "
                      f"transformers' pixels will differ on images of another shape than {h}:{w} "
                      f"(crop_mode='squash' is written exactly)", ExportWarning, stacklevel=4)
    if getattr(config, "crop_mode", "center") == "border":
        warnings.warn(f"{path}: Hugging Face's image processors do not pad (crop_mode='border': the longer side to "
                      f"the size, the rest in the mean's colour): its processor resizes the shorter side and crops, "
                      f"so transformers' pixels will differ on images that are not {h}:{w}", ExportWarning,
                      stacklevel=4)
    _odd_margin_note(config, path)


def _mae_statistics_note(model: Pretrainer, path: Path) -> None:
    """The official MAE checkpoint is read back with ImageNet's mean and std and MAE's masking and loss: other
    values are said."""
    statistics = selfsup_format.mae_statistics_losses(model)
    if statistics:
        warnings.warn(f"{path} holds tensors only, read back with MAE's input statistics and settings: "
                      f"{'; '.join(statistics)}; "
                      f"this model's are not kept (export as 'vitkit' or 'hf', which keep them)", ExportWarning,
                      stacklevel=3)


def _odd_margin_note(config, path: Path) -> None:
    """transformers floors an odd crop margin's half where vitkit (as timm and torchvision) rounds it: where the
    margin is odd on every image (a squashed resize, or the shorter side), the folder's processor cuts every
    image one pixel over, another classifier's input (a 32 px BEiT: 35 cut to 32, probabilities 0.50 and 0.76),
    said rather than written in silence."""
    if getattr(config, "crop_offset", "round") != "round" or config.crop_pct >= 1.0:
        return
    h, w = config.img_size
    scaled = (math.floor(h / config.crop_pct), math.floor(w / config.crop_pct))
    squash = getattr(config, "crop_mode", "center") == "squash"
    odd = [side for side, (s, c) in zip("hw", zip(scaled, (h, w))) if (s - c) % 2] if squash else \
        (["shorter side"] if (min(scaled) - min(h, w)) % 2 else [])
    if odd:
        warnings.warn(f"{path}: at {h}x{w} the centre crop's margin is odd ({min(scaled)} px cut to {min(h, w)}): "
                      f"transformers' processor floors its half where vitkit rounds it, so it cuts every image one "
                      f"pixel over (other inputs, other answers); a size whose margin is even (or crop_pct 1) is "
                      f"written exactly", ExportWarning, stacklevel=5)


def _pooler_note(config, path: Path) -> None:
    """transformers' ViTModel and DeiTModel add a pooler (dense + tanh) by default: without the paper's
    pre-logits layer to fill it, transformers initialises it at random (its MISSING report) and its
    ``pooler_output`` means nothing, where vitkit's output is the normalised class token."""
    kind = hf_format.model_type_of(config)
    if config.num_classes == 0 and not config.representation_size and kind in ("vit", "deit"):
        cls = "ViTModel" if kind == "vit" else "DeiTModel"
        warnings.warn(f"{path}: transformers' {cls} adds a pooler (a dense layer and tanh) this model does not "
                      f"have, initialised at random there: its pooler_output means nothing; what vitkit outputs is "
                      f"last_hidden_state[:, 0] (or load with {cls}.from_pretrained(..., add_pooling_layer=False))",
                      ExportWarning, stacklevel=4)


def _later_vit(config) -> bool:
    """Whether a ViT config uses a part of the later ViTs (the paper's ViT layout of HF cannot hold it)."""
    return bool(config.reg_tokens or config.pre_norm or config.global_pool == "map" or config.no_embed_class
                or config.init_values is not None  # LayerScale: DINOv2's tower, not HF's ViT
                or config.mlp != "mlp" or config.norm != "layernorm" or config.qk_norm or config.attn_norm
                or config.mlp_norm or config.embed_norm or config.block != "pre" or not config.final_norm
                or config.diff_attn)


class ExportWarning(UserWarning):
    """An export that timm reads but vitkit cannot rebuild from alone (it says what to pass)."""


def _export_timm(model: nn.Module, path: Path) -> Path:
    """timm's state dict. A ``.safetensors`` file also carries the vitkit config that describes it
    (in its metadata, which timm ignores), so vitkit reads it back exactly. A bare ``.pth`` holds
    tensors only: when its architecture cannot be read back off the shapes (heads of a
    non-standard width, a conv backbone), a :class:`ExportWarning` says what to pass when loading."""
    sd = timm_format.from_native(model)
    if path.suffix.lower() == ".safetensors":
        save_safetensors(sd, path, {CONFIG_METADATA_KEY: json.dumps(timm_format.timm_config(model))})
    elif path.suffix.lower() in (".pth", ".pt", ".bin"):
        with atomic_path(path) as tmp:
            torch.save(sd, tmp)
        lost = timm_format.bare_state_dict_losses(sd, model, preprocessing=True)
        names = " (its class names are not kept either: predictions name classes by number)" \
            if model.config.label_names else ""
        if lost:
            warnings.warn(f"{path} holds tensors only; read back off its shapes alone it would have "
                          f"{'; '.join(lost)}. Load it with the architecture given (model_name= or those fields "
                          f"as keywords){names}, or export a .safetensors file, which carries vitkit's config",
                          ExportWarning, stacklevel=3)
    else:
        raise WeightsError(f"timm export: use a .safetensors or .pth file name, not {path.name!r}")
    config = model.config
    fixed = getattr(type(config), "FIXED", {})  # (a family whose timm model resamples its own way: Qwen3's)
    if getattr(config, "dynamic_img_size", False) and getattr(config, "pos_embed", None) == "learned" and (
            config.pos_embed_interpolation, config.pos_embed_antialias) != ("bicubic", True) and \
            "pos_embed_interpolation" not in fixed:
        way = f"{config.pos_embed_interpolation}{', antialiased' if config.pos_embed_antialias else ''}"
        warnings.warn(f"{path}: timm resamples a dynamic model's position table bicubic and antialiased to every "
                      f"input of another grid; this model resamples it {way} (as transformers does): in timm its "
                      f"outputs at other sizes than its table's differ (vitkit reads the file as this model)",
                      ExportWarning, stacklevel=3)
    note = timm_format.timm_function_note(model)
    if note:  # a timm user would load it under that name strictly, and compute something else
        warnings.warn(f"{path}: {note}" + ("" if note.startswith("timm builds") else
                                           ", which reads this model's config from the file's metadata"
                                           if path.suffix.lower() == ".safetensors" else " with those keywords"),
                      ExportWarning, stacklevel=3)
    return path
