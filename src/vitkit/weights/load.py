"""``load_into``: any supported layout into a vitkit model, checked before anything is copied (the public
``load_weights`` (:mod:`.checked`) also checks a source's own config against the model first)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from ..files import PathLike, as_argument
from ..models import config_from_dict, family_of_state_dict, positions, renamed_in_timm
from ..models.features import FeatureModel
from ..models.layers import adapt_input_channels, resample_patch_embed
from ..models.serialize import CONFIG_JSON_METADATA_KEY, non_finite
from ..selfsup import Pretrainer
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
from .file_names import missing_by_file_names
from .hf_format import PREPROCESSOR_FILE, PROCESSOR_FILE, read_json_object
from .io import SHARD_INDEXES, WeightsError, read_sharded, read_weight_file, safetensors_metadata, unwrap_state_dict
from .layouts import detect_format
from .resampling import adapt_pos_embed, check_prefix_tokens, load_resampling, stored_table

#: the layouts of a model's own release that hold a tower among other parts, and their readers
RELEASE_TOWERS = {"deepseek": deepseek_format, "qwen": qwen_format, "gemma4": gemma4_format, "sam": sam_format}
#: Weight file names looked for inside a folder, in order of preference.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pth", "model.npz") + open_clip_format.WEIGHT_FILES
FORMATS = ("vitkit", "timm", "hf", "npz", "big_vision", "open_clip", "dino", "deepseek", "qwen", "gemma4", "sam")
#: The safetensors metadata key under which a timm export stores the vitkit config describing it.
CONFIG_METADATA_KEY = "vitkit_config"


@dataclass
class LoadReport:
    """What a load did: the source format, every name that did not line up, what was resampled to the model's size
    (a position table, patch filters: by the load's interpolation) and what was adapted otherwise (input
    channels)."""

    format: str
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    resampled: List[str] = field(default_factory=list)
    adapted: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"format: {self.format}"]
        for name in ("missing", "unexpected", "resampled", "adapted"):
            items = getattr(self, name)
            if items:
                lines.append(f"{name} ({len(items)}): {', '.join(items)}")
        return "\n".join(lines)


@dataclass
class Source:
    """Tensors read from a file or folder, with what is known about where they came from."""

    tensors: Dict[str, Any]
    format: str
    config_json: Optional[Dict[str, Any]] = None
    preprocessor_json: Optional[Dict[str, Any]] = None
    #: the file ``preprocessor_json`` was read from, as an error names it (:func:`.hf_format.read_image_processor`)
    preprocessor_file: str = PREPROCESSOR_FILE
    path: Optional[Path] = None
    #: the objective of a pre-training model (simmim, mpp, mae), else None
    pretraining: Optional[str] = None
    #: an open_clip hub folder's open_clip_config.json (the activation and preprocessing)
    open_clip_config: Optional[Dict[str, Any]] = None
    #: a timm state dict carrying vitkit's config in its metadata (vitkit's --to timm .safetensors): read as vitkit's
    timm_with_config: bool = False
    #: an open_clip tower that timm builds (``visual.trunk.*``), read as the timm state dict it holds
    open_clip_trunk: bool = False
    #: its projection is open_clip's linear one beside timm's model (``visual.head.proj``), which pools as its
    #: ``timm_pool`` says (not timm's own head, as EVA-02's and Perception Encoder's towers use)
    open_clip_projection: bool = False
    #: the grid a bare table was read as (``pretrained.stored_config``): loaded into a model of another grid, it is
    #: resampled from it (a 4x4 table was copied as it was into a 2x8 grid: as many slots)
    table_grid: Optional[Tuple[int, int]] = None
    #: the names of the tensors not read (a VLM's language model beside its tower: ``vlm_tower_names``)
    unread: List[str] = field(default_factory=list)


#: the configs a reader takes from a weights folder beside its weights
FOLDER_CONFIGS = ("config.json", PREPROCESSOR_FILE, PROCESSOR_FILE, open_clip_format.CONFIG_FILE)


def model_files(folder: Path) -> List[Path]:
    """The files of a weights folder that a reader would take for its model (any weight file a reader looks
    for, a shard index and the shards it names, the configs): what a model written into the folder replaces."""
    out = [folder / name for name in (*WEIGHT_FILES, *SHARD_INDEXES, *FOLDER_CONFIGS) if (folder / name).is_file()]
    for index in SHARD_INDEXES:
        try:
            weight_map = json.loads((folder / index).read_text()).get("weight_map") or {}
        except (OSError, ValueError, AttributeError):
            continue
        out += [folder / shard for shard in set(weight_map.values()) if isinstance(shard, str)
                and "/" not in shard and (folder / shard).is_file()]
    return out


def _unknown_architecture(config_json: Optional[Dict[str, Any]]) -> None:
    """Refuse a timm hub folder whose ``architecture`` vitkit does not build, or a Hugging Face folder of a
    ``model_type`` it does not read, naming it (rather than its tensors' names)."""
    arch = (config_json or {}).get("architecture")
    if arch:
        timm_format.known_architecture(str(arch))
    kind = (config_json or {}).get("model_type")
    known = tuple(hf_format.MODEL_TYPES) + hf_towers.MODEL_TYPES
    if isinstance(kind, str) and kind not in known + ("timm_wrapper",) and not hf_towers.reads(config_json):
        vision = (config_json or {}).get("vision_config")
        tower = vision.get("model_type") if isinstance(vision, dict) else None
        if isinstance(tower, str):  # a VLM whose tower is of another kind (Mistral 3's Pixtral)
            raise WeightsError(f"Hugging Face model_type {kind!r} is a VLM whose vision tower ({tower!r}) is not one "
                               f"vitkit reads (it reads a VLM's {', '.join(tuple(hf_towers.TOWERS))} tower)")
        raise WeightsError(f"Hugging Face model_type {kind!r} is not one vitkit reads ({', '.join(known)})")


def _check_config_kind(folder: Path, config_json: Optional[Dict[str, Any]]) -> None:
    """A ``config.json`` that says no kind (timm's ``architecture``, Hugging Face's ``model_type``, vitkit's
    ``format``) was passed over: its tensors were then read bare, with none of their guesses said."""
    if isinstance(config_json, dict) and not any(config_json.get(k) for k in ("architecture", "model_type")) \
            and config_json.get("format") != "vitkit":
        raise WeightsError(f"{folder / 'config.json'} says neither its architecture (timm's 'architecture'), its "
                           f"Hugging Face 'model_type' nor vitkit's 'format': vitkit cannot tell what it describes; "
                           f"fix it, or load the weights file alone (what its tensors do not hold is then said)")


def _check_layouts_agree(folder: Path, weights: Path, layout: str, config_json: Optional[Dict[str, Any]]) -> None:
    """A Hugging Face config.json beside timm's tensor names was read as that config's architecture over tensors
    it did not describe (an edited head count trained a 4-head model from 2-head tensors, 0.41 off timm's), and
    timm's config.json beside transformers' names was said to lack its config: the mix is said as one."""
    if not isinstance(config_json, dict) or config_json.get("format") == "vitkit":
        return
    kind, arch = config_json.get("model_type"), config_json.get("architecture")
    said = None
    if kind not in (None, "timm_wrapper") and not arch and layout == "timm":
        said = f"is a Hugging Face config (model_type {kind!r}) where {weights.name} holds timm's tensor names"
    elif arch and kind is None and layout == "hf":
        said = f"is timm's (architecture {arch!r}) where {weights.name} holds Hugging Face's tensor names"
    if said:
        raise WeightsError(f"{folder / 'config.json'} {said}: the two were mixed; put each beside its own "
                           f"weights (a weights file is read with the config.json beside it)")


def vlm_tower_names(names: List[str]) -> List[str]:
    """Of a sharded checkpoint's tensor names, those to read: a VLM's tower alone (Qwen's, DeepSeek's: the shards
    of its language model, gigabytes, are not read), else all."""
    for reader in (qwen_format, deepseek_format, gemma4_format):
        if reader.detect(names):
            return reader.tower_names(names)
    tower = [n for n in names if n.startswith(hf_towers.VLM_TOWER_PREFIXES + ("vision_model.",))]  # (LLaVA's, BLIP-2's)
    return tower if tower and any(n.startswith(hf_towers.LANGUAGE_PREFIXES) for n in names) else names


def folder_weights(folder: Path) -> Optional[Path]:
    """The weight file (or shard index) of a folder that :func:`read_source` reads, None if it has none."""
    return next((folder / n for n in WEIGHT_FILES + SHARD_INDEXES if (folder / n).is_file()), None)


def _run_model_config(path: Path) -> Optional[Dict[str, Any]]:
    """The model config of the run whose checkpoint ``path`` is (``RUN/checkpoints/step_N.pt``): the one its
    finished model holds, or an --init run's architecture (``init_model.json``); a checkpoint of another
    unfinished run is refused saying how to finish it (its tensors alone were read as a bare timm state dict,
    refused for a hybrid's stem). None: not a run's checkpoint."""
    run = path.parent.parent
    if path.parent.name != "checkpoints" or not path.name.startswith("step_") or path.suffix != ".pt" \
            or not (run / "config.json").is_file():
        return None
    finished = read_json_object(run / "model" / "config.json")
    if finished is not None:
        return finished
    started = read_json_object(run / "init_model.json")
    if started is not None:
        return {"format": "vitkit", "config": started}
    raise WeightsError(f"{path} is a checkpoint of the run {run}, which has not finished: its architecture is saved "
                       f"with its model at the end (vitkit train --resume {as_argument(run)} finishes it)")


def read_source(path: PathLike) -> Source:
    """Read a weight file, or a folder holding ``config.json`` and a weight file. A folder's own weight file
    named alone is read with the configs beside it, as its folder is (before, its architecture was guessed off
    the shapes and its preprocessing was the family's default: a hub folder's ``model.safetensors``)."""
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    if folder_weights(path.parent) == path and any((path.parent / n).is_file() for n in FOLDER_CONFIGS):
        return _read_folder(path.parent)
    return _read_file(path)


def _read_file(path: Path) -> Source:
    """A weight file alone: its tensors, and the config its metadata or its run holds."""
    run_model = _run_model_config(path)  # a vitkit run's checkpoint: read with the architecture the run saved
    unread: List[str] = []

    def select(names: List[str]) -> List[str]:  # a VLM's tower alone (the names of what is not read kept)
        chosen = vlm_tower_names(names)
        unread.extend(sorted(set(names) - set(chosen)))
        return chosen

    tensors, facts = (read_sharded(path, select), {}) if path.name.endswith(".index.json") \
        else read_weight_file(path, select)
    tensors = backbone_model(tensors, str(path))
    trunk = open_clip_format.is_timm_tower(tensors)
    projection = trunk and "visual.head.proj.weight" in tensors
    if trunk:  # timm's model under open_clip's names: read as timm's state dict
        tensors = open_clip_format.timm_tower(tensors)
    src = Source(tensors, detect_format(tensors.keys()), path=path, open_clip_trunk=trunk,
                 open_clip_projection=projection, unread=unread)
    src.pretraining = selfsup_format.detect(tensors.keys(), None)
    # a training checkpoint names its model: read as the hub config it stands for (a name from DeiT's
    # registry that timm lacks, such as DeiT III's deit_base_patch16_LS: the tensors say, as before)
    if facts and (facts["script"] == "timm" or timm_format.is_known_architecture(facts["arch"])):
        src.config_json = timm_format.training_checkpoint_config(facts, tensors)
    if run_model is not None:
        if any(".base_layer." in k or ".lora_" in k for k in tensors):
            raise WeightsError(f"{path} is a checkpoint of a LoRA run: it holds the adapters apart from the weights "
                               f"they adapt; read the run's model (merged at its end) or its adapter/ with peft")
        src.config_json, src.format = run_model, "vitkit"
    if path.suffix.lower() == ".safetensors":  # vitkit's timm exports carry their config (timm ignores it)
        metadata = safetensors_metadata(path)
        text = metadata.get(CONFIG_METADATA_KEY)
        if metadata.get(CONFIG_JSON_METADATA_KEY) is not None and run_model is None:  # save_pretrained's file alone
            src.config_json, src.format = _metadata_json(path, metadata[CONFIG_JSON_METADATA_KEY]), "vitkit"
            src.pretraining = selfsup_format.detect(tensors.keys(), src.config_json)
        if text is not None:
            try:
                src.config_json = {"format": "vitkit", "config": json.loads(text)}
            except json.JSONDecodeError as e:
                raise WeightsError(f"{path}: the vitkit config in its metadata is not valid JSON: {e}") from None
            src.format, src.timm_with_config = "vitkit", True
    return src


class BackboneNote(UserWarning):
    """A backbone's state dict was read as the model it holds."""


def backbone_model(tensors: Dict[str, Any], where: str) -> Dict[str, Any]:
    """A backbone's state dict (timm's ``features_only`` model, vitkit's feature model: the model under
    ``model.``) as the model it holds; any other, as it is. timm's holds the blocks up to its last map
    and neither the final norm nor the head (it prunes them): read as that shorter model, said in a note."""
    if not tensors or not all(k.startswith("model.") for k in tensors):
        return tensors
    inner = {k[len("model."):]: v for k, v in tensors.items()}
    if family_of_state_dict(inner.keys()) is None:
        return tensors
    blocks = {int(k.split(".")[1]) for k in inner if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    held = f"blocks 0-{max(blocks)}" if blocks else "no blocks"
    pruned = "" if any(k.startswith("norm.") for k in inner) else \
        ", no final norm: timm's features_only keeps the blocks up to its last map"
    warnings.warn(BackboneNote(f"{where} is a backbone's state dict (its model under 'model.'): read as that model "
                               f"({held}{pruned})"), stacklevel=3)
    return inner


def _read_folder(path: Path) -> Source:
    """A folder's weight file with the configs beside it (config.json, the image processor's, open_clip's)."""
    weights = folder_weights(path)
    if weights is None:
        found = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())[:10]  # a folder named as a file
        raise WeightsError(f"no weights in folder {path}: expected one of {', '.join(WEIGHT_FILES)} (or a "
                           f"shard index: {', '.join(SHARD_INDEXES)})"
                           f" (found: {', '.join(found) or 'nothing'})")
    open_clip_config = read_json_object(path / open_clip_format.CONFIG_FILE)
    # open_clip's file is read with open_clip's config: a config.json beside them describes the repository's
    # other file (timm's or transformers' model.safetensors), absent here (it made another function, 0.05 off)
    own = weights.name in open_clip_format.WEIGHT_FILES and open_clip_config is not None
    config_json = None if own else read_json_object(path / "config.json")
    try:
        src = _read_file(weights)
    except WeightsError:
        _unknown_architecture(config_json)  # a timm folder of a model vitkit lacks: said by its name
        if isinstance(config_json, dict) and (vision := hf_towers.vlm_vision_config(config_json)) is not None:
            raise WeightsError(f"{path / 'config.json'} is a {config_json.get('model_type')} VLM's, with a "
                               f"{vision.get('model_type')} tower, where its weights hold none of the tower's tensors "
                               f"({', '.join(hf_towers.VLM_TOWER_PREFIXES[:4])}...): only its language model's?")
        raise
    if src.format != "hf":  # (Hugging Face tensors: their missing model_type is said as transformers says it)
        _check_config_kind(path, config_json)
    _check_layouts_agree(path, weights, src.format, config_json)
    _check_same_model(path, src.config_json, config_json)
    if config_json is not None:  # else the file's own (a vitkit model.safetensors carries its config)
        src.config_json = timm_format.with_timm_defaults(config_json)
    src.preprocessor_json, src.preprocessor_file = hf_format.read_image_processor(path)
    src.open_clip_config = open_clip_config
    if src.open_clip_trunk and config_json is None:  # the timm model its open_clip config names
        src.config_json = open_clip_format.timm_tower_config(src.open_clip_config, src.tensors)
    if src.config_json and src.config_json.get("format") == "vitkit":
        src.format = "vitkit"
    src.pretraining = selfsup_format.detect(src.tensors.keys(), src.config_json)
    return src


def _check_same_model(folder: Path, stored: Optional[Dict[str, Any]], beside: Optional[Dict[str, Any]]) -> None:
    """The folder's config.json against the one its model.safetensors carries (save_pretrained writes both): an
    edit that changes the computation (heads, eps, the blocks) made another function (0.5 off), unsaid; names,
    preprocessing and regularisation may be edited."""
    if not stored or not beside or stored.get("format") != "vitkit" or beside.get("format") != "vitkit":
        return
    a, b = stored.get("config") or {}, beside.get("config") or {}
    edited = [f"{k} {json.dumps(b.get(k))} (the weights': {json.dumps(a.get(k))})" for k in sorted(set(a) | set(b))
              if k not in timm_format.EDITABLE and a.get(k) != b.get(k)]
    if edited:
        raise WeightsError(f"{folder}: its config.json says {'; '.join(edited[:4])}{' ...' if len(edited) > 4 else ''}"
                           f", where its model.safetensors was saved with another: it was edited or mixed with other "
                           f"weights; fix or re-save it")


def _is_fp8(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and tensor.element_size() == 1


def _metadata_json(path: Path, text: str) -> Dict[str, Any]:
    """``config.json`` as ``save_pretrained`` keeps it in ``model.safetensors``'s metadata."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise WeightsError(f"{path}: the vitkit config in its metadata is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != "vitkit":
        raise WeightsError(f"{path}: the vitkit config in its metadata is not one vitkit writes")
    return data


def to_native(src: Source) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """Source tensors in vitkit names, plus facts (source grid, layout) for adaptation. Of a
    pre-training model, its encoder's (what fine-tuning, evaluation and inspection load)."""
    facts: Dict[str, Any] = {}
    tensors = src.tensors
    if src.pretraining:
        tensors = selfsup_format.split(src.pretraining, src.format, tensors)[0]
    if src.format in ("npz", "big_vision"):
        sd, facts = npz_format.to_native(tensors)
    elif src.format == "hf" and hf_towers.reads(src.config_json):
        sd = hf_towers.to_native(tensors, src.config_json)
        facts["grid"] = hf_towers.config_from_hf(src.config_json, tensors).grid_size
    elif src.format == "open_clip":
        sd = open_clip_format.to_native(tensors, src.open_clip_config)
    elif src.format == "dino":
        sd = dino_format.to_native({k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
                                    for k, v in tensors.items()})
    elif src.format in RELEASE_TOWERS:
        sd = RELEASE_TOWERS[src.format].to_native(tensors)
    elif src.format == "hf":
        sd = hf_format.to_native(tensors)
        if src.config_json:
            cfg = hf_format.config_from_hf(src.config_json)
            facts["grid"] = cfg.grid_size
    else:
        sd = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v))
              for k, v in tensors.items()}
        if src.format == "vitkit" and src.config_json:
            grid = getattr(config_from_dict(src.config_json["config"]), "table_grid", None)
            if grid is not None:
                facts["grid"] = grid
        elif src.table_grid is not None:
            facts["grid"] = src.table_grid
        renamed = renamed_in_timm(sd) if src.format == "timm" or src.timm_with_config else None
        if renamed is not None:
            sd = renamed.from_timm(sd)  # (DeepSeek's classifier: its encoder under encoder.)
    return sd, facts


def _first_conv(model: nn.Module) -> Optional[str]:
    """Name of the convolution that sees the image: the patch projection of a ViT, the stem
    of a hybrid's CNN or of a ResNet (the first Conv2d registered)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            return name
    return None


class AdaptNote(UserWarning):
    """Weights loaded into another patch size or channel count: what was done to them."""


def _adapt_input_channels(sd: Dict[str, torch.Tensor], model: nn.Module) -> Optional[str]:
    """Fit the first convolution's filters to the model's input channels (timm's ``adapt_input_conv``:
    RGB to grey sums the colours; otherwise the filters repeat cyclically, scaled by C / C').

    For a plain convolution, an image whose channels are all equal gives the response it had, so
    an RGB model fine-tuned on grey or 4-band data starts from the function it had. (A weight-
    standardised stem, as in the hybrids, is re-standardised: a close start, not the same function.)
    """
    name = _first_conv(model)
    if name is None:
        return _adapt_linear_patches(sd, model)
    key = f"{name}.weight"
    target = model.get_submodule(name).weight
    if key not in sd or sd[key].dim() != 4 or sd[key].shape[1] == target.shape[1]:
        return None
    have, want = sd[key].shape[1], target.shape[1]
    sd[key] = adapt_input_channels(sd[key], want)
    return _channels_note(key, have, want)


def _adapt_linear_patches(sd: Dict[str, torch.Tensor], model: nn.Module) -> Optional[str]:
    """:func:`_adapt_input_channels` for a linear patch projection over each patch flattened channel first (Gemma
    4's ``input_proj``): the same filters, held flat."""
    embed = getattr(model, "patch_embed", None)
    proj, key = getattr(embed, "input_proj", None), "patch_embed.input_proj.weight"
    if proj is None or key not in sd or sd[key].dim() != 2 or tuple(sd[key].shape) == tuple(proj.weight.shape):
        return None
    (ph, pw), want, (width, flat) = embed.patch_size, embed.in_chans, sd[key].shape
    have = flat // (ph * pw)
    if have * ph * pw != flat or have == want:
        return None  # (another patch size or width: the shape check names it)
    sd[key] = adapt_input_channels(sd[key].reshape(width, have, ph, pw), want).reshape(width, want * ph * pw)
    return _channels_note(key, have, want)


def _channels_note(key: str, have: int, want: int) -> str:
    how = "summed" if want == 1 else f"repeated and scaled by {have}/{want}"
    return f"{key} {have} -> {want} input channels ({how}, as timm's adapt_input_conv)"


def _adapt_patch_size(sd: Dict[str, torch.Tensor], model: nn.Module, interpolation: str, antialias: bool
                      ) -> Optional[str]:
    """Patch filters of another size resampled to the model's (FlexiViT's pseudo-inverse resize,
    timm's ``resample_patch_embed``): weights trained on 16 px patches serve a model of 8 or 32."""
    key = "patch_embed.proj.weight"
    target = model.state_dict().get(key) if hasattr(model, "patch_embed") else None
    if target is None or key not in sd or sd[key].dim() != 4 or target.dim() != 4:
        return None
    old, new = tuple(sd[key].shape[-2:]), tuple(target.shape[-2:])
    if old == new or sd[key].shape[:2] != target.shape[:2]:
        return None  # the same size, or another width or channel count: the shape check names it
    sd[key] = resample_patch_embed(sd[key], new, interpolation, antialias)
    return (f"{key} {old[0]}x{old[1]} -> {new[0]}x{new[1]} px patches (FlexiViT's pseudo-inverse resize, "
            f"{interpolation}{', antialiased' if antialias else ''})")


#: the shape mismatches one error names (another width makes every tensor one)
SHOWN_MISMATCHES = 6


def load_state_dict_checked(model: nn.Module, sd: Mapping[str, torch.Tensor], strict: bool = True,
                            exclude: Sequence[str] = (), report: Optional[LoadReport] = None,
                            copy: bool = True, file_names: Collection[str] = ()) -> LoadReport:
    """Copy ``sd`` into ``model`` after checking every name and shape; nothing is copied on error
    (``copy=False``: check only). ``file_names``: the names the file of a foreign layout holds (``sd`` is in
    vitkit's), to name what it lacks as the file would."""
    report = report or LoadReport("state_dict")
    exclude = tuple(exclude)
    target = model.state_dict()
    source = {k: v for k, v in sd.items() if not (exclude and k.startswith(exclude))}
    differing, missing, unexpected = state_dict_differences(source, target)
    report.unexpected = sorted(k.replace("unmapped:", "", 1) for k in unexpected)
    report.missing = [k for k in missing if not (exclude and k.startswith(exclude))]
    if differing:
        hint = ""
        head = "head.weight"
        if head in differing and source[head].shape[0] != target[head].shape[0]:
            hint = " (a different number of classes: pass exclude=('head.',) to keep a fresh head)"
        # another width differs in every tensor: the first few say it (the head's, which says the classes, kept)
        shown = list(dict.fromkeys([*differing[:SHOWN_MISMATCHES], *[head] * (head in differing)]))
        more = len(differing) - len(shown)
        raise WeightsError("shape mismatch: " + "; ".join(f"{k}: checkpoint {tuple(source[k].shape)} vs model "
                                                          f"{tuple(target[k].shape)}" for k in shown)
                           + (f"; and {more} more of {len(differing)} tensors" if more else "") + hint)
    # integers or 8-bit floats where the model holds floats (a quantized file, its scales kept elsewhere) were cast
    # as they stood (float8 ended in torch's "isfinite not implemented" below)
    integral = [k for k, v in source.items()
                if k in target and target[k].is_floating_point() and (not v.is_floating_point() or _is_fp8(v))]
    if integral:
        kinds = sorted({str(source[k].dtype).replace("torch.", "") for k in integral})
        raise WeightsError(f"{'/'.join(kinds)} values in {_names(integral, 5)} where the model holds floating-point "
                           f"weights: a quantized file (its scales kept apart) is not weights as they stand; load "
                           f"the float file, or dequantize it first; nothing was loaded")
    # NaN or inf would run: predict printed 'nan%' and eval scored every image as class 0, with exit 0
    broken = [k for k in non_finite(source, getattr(model, "UNBOUNDED", ())) if k in target]
    if broken:
        raise WeightsError(f"non-finite values (NaN or inf) in {_names(broken, 5)}: the file is damaged or was saved "
                           f"from a run that diverged; nothing was loaded")
    if strict and (report.missing or report.unexpected):
        parts = []
        theirs = missing_by_file_names(model, report.format, file_names) if report.missing and file_names else None
        if theirs:
            parts.append(f"missing from the checkpoint: {_names(theirs)} (vitkit's {_names(report.missing)})")
        elif report.missing:
            parts.append(f"missing from the checkpoint: {_names(report.missing)}")
        if report.unexpected:
            parts.append(f"not in the model: {_names(report.unexpected)}")
        named = "" if report.format in ("vitkit", "timm") or (theirs and not report.unexpected) else \
            f" (named as vitkit names the {report.format} file's tensors)"
        raise WeightsError(f"{report.format} weights do not match the model: " + "; ".join(parts) + named
                           + " (in Python, load_weights(model, source, strict=False) loads the rest)")
    if copy:
        with torch.no_grad():
            for k, v in source.items():
                if k in target:
                    target[k].copy_(v.to(dtype=target[k].dtype))
    return report


def state_dict_differences(sd: Mapping[str, Any], target: Mapping[str, Any]
                           ) -> Tuple[List[str], List[str], List[str]]:
    """How a state dict differs from a model's (``target``): the names of tensors of other shapes
    (in ``sd``'s order), the names it lacks, and the names the model lacks (both sorted)."""
    differing = [k for k, v in sd.items() if k in target and tuple(v.shape) != tuple(target[k].shape)]
    return differing, sorted(set(target) - set(sd)), sorted(set(sd) - set(target))


def shape_problems(sd: Dict[str, Any], target: Dict[str, Any], limit: int = 3) -> list:
    """Where a state dict in a model's own names differs from the model's (``target``: its
    state dict): tensors of other shapes, tensors missing, tensors it does not have; at most
    ``limit`` named, then how many more."""
    differing, missing, extra = state_dict_differences(sd, target)
    problems = [f"{k} of shape {tuple(target[k].shape)} where its weights hold {tuple(sd[k].shape)}"
                for k in differing]
    if missing:
        problems.append(f"{', '.join(missing[:limit])} where its weights hold none")
    if extra:
        problems.append(f"no {', '.join(extra[:limit])} where its weights hold {'it' if len(extra) == 1 else 'them'}")
    return problems[:limit] + ([f"{len(problems) - limit} more"] if len(problems) > limit else [])


def _names(names: List[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... and {len(names) - limit} more" if len(names) > limit else "")


def load_into(model: nn.Module, source: Union[PathLike, Mapping[str, Any], Source],
              strict: bool = True, interpolation: Optional[str] = None, antialias: Optional[bool] = None,
              exclude: Sequence[str] = (), copy: bool = True) -> LoadReport:
    """:func:`vitkit.weights.load_weights` (whose docstring says what each argument does) without its check of a
    source's own config against the model: for callers that built the model from that config themselves."""
    if isinstance(exclude, str):  # one prefix (a string was read a character at a time: 'p', 'o', 's', ...)
        exclude = (exclude,)
    if isinstance(model, FeatureModel):  # a backbone: its model holds the weights (a pyramid is new), and
        model = model.model              # a checkpoint's classifier, of any class count, is not part of it
        exclude = (*exclude, *(f"{name}." for name in model.head_names()))
    if isinstance(source, Source):
        src = source
    elif isinstance(source, Mapping):  # read as a file's is: out of a checkpoint's wrapper, without DDP's prefix
        tensors = backbone_model(unwrap_state_dict(source, "the state dict"), "the state dict")
        src = Source(tensors, detect_format(tensors.keys()))
        src.pretraining = selfsup_format.detect(tensors.keys(), None)
    else:
        src = read_source(source)
    if isinstance(model, Pretrainer):
        return _load_pretrainer(model, src, strict, interpolation, antialias)
    interpolation, antialias, aligned = load_resampling(model, interpolation, antialias, src.format)
    sd, facts = to_native(src)
    facts = {**stored_table(src), **facts}
    report = LoadReport(src.format)
    fit = positions.StateFit(interpolation, antialias, aligned, facts.get("grid"))
    if strict:
        check_prefix_tokens(sd, model, exclude)
    adapt_pos_embed(sd, model, facts, fit, report)
    channels, patches = _adapt_input_channels(sd, model), _adapt_patch_size(sd, model, interpolation, antialias)
    report.adapted += [channels] if channels else []
    report.resampled += [patches] if patches else []
    adapted = [m for m in (channels, patches) if m]
    out = load_state_dict_checked(model, sd, strict, exclude, report, copy, file_names=src.tensors.keys())
    # filters that compute another function are said; a position grid is the expected case
    for what in adapted if copy else ():
        warnings.warn(AdaptNote(f"adapted the weights: {what}"), stacklevel=2)
    return out


def _load_pretrainer(model: Pretrainer, src: Source, strict: bool, interpolation: Optional[str],
                     antialias: Optional[bool]) -> LoadReport:
    """A pre-training source into a pre-training model: the encoder as any ViT is loaded, the
    objective's parts by name; both are checked before either is copied."""
    if src.pretraining != model.objective:
        what = f"a {src.pretraining} model" if src.pretraining else "no pre-training model (no decoder or mask token)"
        raise WeightsError(f"the weights hold {what}, the model is {model.objective}; load a plain ViT's weights "
                           f"into model.encoder")
    own = selfsup_format.split(src.pretraining, src.format, src.tensors)[1]
    report = load_state_dict_checked(model, own, strict, exclude=("encoder.",), copy=False,
                                     report=LoadReport(src.format))
    encoder = load_into(model.encoder, src, strict, interpolation, antialias)
    load_state_dict_checked(model, own, strict, exclude=("encoder.",))
    report.missing += [f"encoder.{k}" for k in encoder.missing]
    report.unexpected += [f"encoder.{k}" for k in encoder.unexpected]
    report.resampled += encoder.resampled
    report.adapted += encoder.adapted
    return report
