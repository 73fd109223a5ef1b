"""What the Hugging Face vision towers' layouts share (:mod:`.hf_towers`): the activation names, the
vision prefix of two-tower checkpoints, q/k/v fused and split, the checks every tower's export runs, and
:class:`Tower`, the one row of the table each tower's module fills in."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from ..models.config_base import IMAGENET_MEAN, IMAGENET_STD, MAX_IMG_SIZE, _is_int, per_channel
from ..models.vit_names import CLIP_MEAN, CLIP_STD
from .io import WeightsError

#: Hugging Face's ``hidden_act`` -> vitkit's ``gelu``
_ACTS = {"gelu": "exact", "quick_gelu": "quick", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh",
         "gelu_fast": "tanh"}
#: the name each GELU is written under: the one that computes as vitkit does (torch's tanh GELU, not gelu_fast's
#: own formula, 6e-7 off)
HF_ACT_NAMES = {"exact": "gelu", "quick": "quick_gelu", "tanh": "gelu_pytorch_tanh"}
#: what the vision part of a two-tower checkpoint is prefixed with, and what of it is the other tower's
_VISION_PREFIX = "vision_model."
_OTHER_TOWER = ("text_model.", "text_projection.", "logit_scale", "logit_bias", "connector.")  # (connector: a VLM's)


#: PIL's resampling filters (a processor's ``resample``) vitkit resizes with; the others (LANCZOS, BOX, HAMMING)
#: are refused by name
_RESAMPLE_NAMES = {0: "nearest", 2: "bilinear", 3: "bicubic"}
_UNUSED_FILTERS = {1: "LANCZOS", 4: "BOX", 5: "HAMMING"}
#: the processors whose integer ``size`` is the shorter side (the others': a square height and width)
_SHORTEST_EDGE_PROCESSORS = ("CLIPImageProcessor", "ChineseCLIPImageProcessor", "BitImageProcessor",
                             "ConvNextImageProcessor")
_HALF, _OPENAI = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), (CLIP_MEAN, CLIP_STD)
_IMAGENET = (IMAGENET_MEAN, IMAGENET_STD)


def _defaults(size: Dict[str, int], resample: int, stats: Tuple[tuple, tuple], crop: Optional[int] = None):
    return dict(size=size, resample=resample, image_mean=stats[0], image_std=stats[1], do_center_crop=crop is not None,
                **({"crop_size": {"height": crop, "width": crop}} if crop else {}))


#: what each image processor class does with a field its config leaves out (the class's own defaults, as
#: transformers builds it; tests/test_weights_hf_preprocessing.py checks them against transformers)
PROCESSOR_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "ViTImageProcessor": _defaults({"height": 224, "width": 224}, 2, _HALF),
    "DeiTImageProcessor": _defaults({"height": 256, "width": 256}, 3, _HALF, crop=224),
    "BeitImageProcessor": _defaults({"height": 224, "width": 224}, 3, _HALF),
    "SiglipImageProcessor": _defaults({"height": 224, "width": 224}, 3, _HALF),
    **dict.fromkeys(("CLIPImageProcessor", "ChineseCLIPImageProcessor"), _defaults({"shortest_edge": 224}, 3,
                                                                                    _OPENAI, crop=224)),
    "OwlViTImageProcessor": _defaults({"height": 768, "width": 768}, 3, _OPENAI),
    "BitImageProcessor": _defaults({"shortest_edge": 224}, 3, _OPENAI, crop=224),
    "DINOv3ViTImageProcessor": _defaults({"height": 224, "width": 224}, 2, _IMAGENET),
    "ConvNextImageProcessor": {**_defaults({"shortest_edge": 384}, 3, _HALF), "crop_pct": 224 / 256},
    "SamImageProcessor": {**_defaults({"longest_edge": 1024}, 2, _IMAGENET), "do_pad": True,
                          "pad_size": {"height": 1024, "width": 1024}},
}
#: ConvNeXt's processor: a shorter side under this is resized to side / crop_pct and centre-cropped to a square
#: of the side, from it up the image is warped to that square (transformers' ConvNextImageProcessor.resize)
CONVNEXT_WARP = 384
#: the processor class of a config that names none, by the model's ``model_type`` (transformers' image
#: processor mapping; the vision towers alone, which it has no entry for, as their two-tower model's)
MODEL_TYPE_PROCESSORS = {
    **dict.fromkeys(("vit", "vit_mae", "vit_msn", "ijepa"), "ViTImageProcessor"), "deit": "DeiTImageProcessor",
    **dict.fromkeys(("beit", "data2vec-vision"), "BeitImageProcessor"),
    **dict.fromkeys(("clip", "clip_vision_model", "aimv2", "aimv2_vision_model", "metaclip_2",
                     "metaclip_2_vision_model", "altclip", "altclip_vision_model"), "CLIPImageProcessor"),
    **dict.fromkeys(("chinese_clip", "chinese_clip_vision_model"), "ChineseCLIPImageProcessor"),
    **dict.fromkeys(("owlvit", "owlvit_vision_model"), "OwlViTImageProcessor"),
    **dict.fromkeys(("siglip", "siglip_vision_model"), "SiglipImageProcessor"),
    **dict.fromkeys(("dinov2", "dinov2_with_registers"), "BitImageProcessor"), "dinov3_vit": "DINOv3ViTImageProcessor",
    **dict.fromkeys(("sam", "sam_vision_model", "sam_hq", "sam_hq_vision_model"), "SamImageProcessor")}


def processor_class(pre: Mapping[str, Any], model_type: Optional[str] = None) -> str:
    """The image processor class a config is read as, as ``AutoImageProcessor`` picks it: its
    ``image_processor_type``, else the older ``feature_extractor_type`` (``CLIPFeatureExtractor``: OpenAI's CLIP
    folders), else the model's type; without the fast/PIL suffix ("" when none says)."""
    name = pre.get("image_processor_type") or str(pre.get("feature_extractor_type") or "").replace(
        "FeatureExtractor", "ImageProcessor")
    return re.sub(r"(Fast|Pil)$", "", str(name)) or MODEL_TYPE_PROCESSORS.get(model_type or "", "")


class ProcessorConfigError(WeightsError):
    """A ``preprocessor_config.json`` that describes no preprocessing (said as that file's, not the model's)."""


#: PIL's filter numbers an image processor's ``resample`` may hold (NEAREST, LANCZOS, BILINEAR, BICUBIC, BOX,
#: HAMMING)
_PIL_FILTERS = range(6)
#: the sides of a ``size`` or ``crop_size`` vitkit's resize and crop read
_READ_SIDES = ("height", "width", "shortest_edge")
#: sides transformers' resize also reads and vitkit's does not: a cap on the longer side, a box to fit inside
_BOUNDING_SIDES = ("longest_edge", "max_height", "max_width")


def preprocessing(pre: Mapping[str, Any], model_type: Optional[str] = None, channels: Any = 3) -> Dict[str, Any]:
    """A Hugging Face image processor's config -> mean, std, interpolation, crop_pct and crop_mode.

    A ``size`` of a height and width resizes the whole image to it (``crop_mode='squash'``: ViT's, DeiT's,
    BEiT's, SigLIP's processors); a ``shortest_edge`` keeps the aspect (``'center'``: CLIP's, DINOv2's); the
    centre crop (``do_center_crop``, ``crop_size``) gives ``crop_pct``, so that vitkit's resize to
    ``floor(size / crop_pct)`` is the processor's size. A field the config leaves out is its processor
    class's default, as transformers fills it (a null is read as left out, where transformers may refuse it).
    A field that holds no such value (a size or crop that is no side up to vitkit's largest image, a filter
    PIL does not have, a mean or std that is not a number per channel of the model, ``channels``) raises
    :class:`ProcessorConfigError` naming it."""
    try:
        return _preprocessing(pre, model_type, channels if _is_int(channels) and channels > 0 else 3)
    except ProcessorConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ProcessorConfigError(str(e)) from None


def _filled(pre: Mapping[str, Any], model_type: Optional[str]) -> Tuple[str, Dict[str, Any]]:
    """The processor's class and its config with the class's defaults where it leaves a field out (as
    transformers fills it)."""
    kind = processor_class(pre, model_type)
    return kind, {**PROCESSOR_DEFAULTS.get(kind, {}), **{k: v for k, v in pre.items() if v is not None}}


def _size_and_crop(pre: Mapping[str, Any], kind: str) -> Tuple[Dict[str, float], Dict[str, float]]:
    """A filled processor config's ``size`` and ``crop_size`` as the sides vitkit reads (:func:`_sides`)."""
    size = _sides("size", pre.get("size"), "shortest_edge" if kind in _SHORTEST_EDGE_PROCESSORS else "height")
    return size, _sides("crop_size", pre.get("crop_size"), "height", used=bool(pre.get("do_center_crop")))


def _preprocessing(pre: Mapping[str, Any], model_type: Optional[str], channels: int) -> Dict[str, Any]:
    kind, pre = _filled(pre, model_type)
    out: Dict[str, Any] = {}
    for field, key in (("image_mean", "mean"), ("image_std", "std")):
        if field in pre:
            out[key] = _per_channel(field, pre[field], channels, positive=key == "std")
    out.update(_scaled_statistics(pre, out), crop_offset="floor")  # transformers floors an odd margin's half
    resample = pre.get("resample")
    if resample is not None and (not _is_int(resample) or resample not in _PIL_FILTERS):
        raise ProcessorConfigError(f"resample must be one of PIL's filter numbers 0-5 (3: bicubic), got {resample!r}")
    if resample in _UNUSED_FILTERS:  # before, the family's default filter was used in silence
        raise ProcessorConfigError(f"resample {resample} ({_UNUSED_FILTERS[resample]}) is a filter vitkit's resize "
                                   f"does not use (0 nearest, 2 bilinear, 3 bicubic): set one of those in the file "
                                   f"to resize with it")
    if resample in _RESAMPLE_NAMES:
        out["interpolation"] = _RESAMPLE_NAMES[resample]
    if kind == "SamImageProcessor":
        return {**out, **_sam_padding(pre)}
    size, crop = _size_and_crop(pre, kind)
    if kind == "ConvNextImageProcessor":  # its crop_pct was left unread (a 36 px resize read as 32)
        return {**out, **_convnext_crop(pre, size)}
    side = size.get("shortest_edge") or size.get("height")
    if size.get("height") and size.get("width") and not size.get("shortest_edge"):
        out["crop_mode"] = "squash"
    elif size.get("shortest_edge"):
        out["crop_mode"] = "center"
    crop_side = crop.get("height")
    if pre.get("do_center_crop") and side and crop_side:
        out["crop_pct"] = _crop_pct(float(crop_side), float(side))
    elif pre.get("do_center_crop") is False or out.get("crop_mode") == "squash":
        out["crop_pct"] = 1.0
    if pre.get("do_pad") and pre.get("background_color") is not None and size.get("height") == size.get("width"):
        out.update(crop_mode="border", crop_pct=1.0)  # DeepSeek-VL's: the longer side to the size, padded to a square
    return out


def _sam_padding(pre: Mapping[str, Any]) -> Dict[str, Any]:
    """SAM's processor: the longer side to ``size``'s ``longest_edge``, the image padded at the right and bottom to
    the square ``pad_size`` (``crop_mode='border'`` anchored at the top left); another size or no padding (an
    image of its own shape) is refused."""
    size, pad = pre.get("size"), pre.get("pad_size")
    longest = size.get("longest_edge") if isinstance(size, Mapping) else None
    if not pre.get("do_pad") or not _is_int(longest) or not isinstance(pad, Mapping) or \
            (pad.get("height"), pad.get("width")) != (longest, longest):
        raise ProcessorConfigError(f"SamImageProcessor with size {size!r}, pad_size {pad!r} and do_pad "
                                   f"{pre.get('do_pad')!r}: vitkit reads SAM's (the longer side to longest_edge, the "
                                   f"image padded at the right and bottom to a square of that side)")
    return {"crop_mode": "border", "crop_offset": "start", "crop_pct": 1.0}


def sam_processor_fields(config: Any) -> Dict[str, Any]:
    """vitkit's preprocessing as SAM's processor's config (:func:`_sam_padding` reads it back)."""
    side = max(config.img_size)
    return {**_statistics_fields(config), "do_pad": True, "size": {"longest_edge": side},
            "pad_size": {"height": side, "width": side}}


def per_image_resize(pre: Mapping[str, Any]) -> Optional[str]:
    """What an image processor that resizes each image to a size of its own (keeping its aspect, within a budget
    of patches or pixels, or in tiles: the VLMs' processors) does, in words, for the note on loading
    (:mod:`.pretrained`); None for one that resizes every image alike, which :func:`preprocessing` reads."""
    def field(name: str, default: Any = None) -> Any:
        value = pre.get(name, default)
        return value if type(value) is int and value > 0 else None  # (anything else: said as the processor's)

    if field("max_num_patches"):
        return f"(SigLIP 2's NaFlex) resizes each image to a grid of at most {field('max_num_patches')} patches"
    if field("max_soft_tokens"):
        k, side = field("pooling_kernel_size", 3) or 3, field("patch_size", 16) or 16
        return (f"(Gemma 4's) resizes each image to at most {field('max_soft_tokens') * k * k:,} patches "
                f"({field('max_soft_tokens')} soft tokens), its sides multiples of {k * side} px,")
    size = pre.get("size") if isinstance(pre.get("size"), Mapping) else {}
    if pre.get("crop_to_patches") is True and field("max_patches"):  # InternVL's (GOT-OCR 2's processor), Cohere's
        return (f"(InternVL's or Cohere's tiling) gives tiles of the image on a grid of 1 to {field('max_patches')} "
                f"of them, nearest its aspect, and the whole image after them,")
    if pre.get("do_image_splitting") and field("tile_size") and field("max_image_tokens"):  # LFM2-VL's
        return (f"(LFM2-VL's) resizes each image to at most {field('max_image_tokens')} image tokens and cuts a large "
                f"one into tiles of {field('tile_size')} px beside a thumbnail,")
    if isinstance(pre.get("image_grid_pinpoints"), list) and pre["image_grid_pinpoints"]:  # LLaVA-NeXT's, OneVision's
        return ("(LLaVA-NeXT's) gives the whole image and tiles of it resized to the nearest of its "
                f"{len(pre['image_grid_pinpoints'])} grid pinpoints,")
    tile = pre.get("max_image_size") if isinstance(pre.get("max_image_size"), Mapping) else {}
    if pre.get("do_image_splitting") and type(tile.get("longest_edge")) is int:  # SmolVLM's, Idefics3's
        return (f"(SmolVLM's or Idefics3's) gives the whole image squashed to {tile['longest_edge']} px (LANCZOS, "
                f"resized three times: vitkit's one view, resized once, bicubic) and tiles of {tile['longest_edge']} "
                f"px cut from it resized to a longer side of {size.get('longest_edge', '?')} px,")
    if field("merge_size") and field("temporal_patch_size"):  # Qwen's (min_pixels and max_pixels, or in its size)
        low = field("min_pixels") or (size.get("shortest_edge") if type(size.get("shortest_edge")) is int else None)
        high = field("max_pixels") or (size.get("longest_edge") if type(size.get("longest_edge")) is int else None)
        bounds = f"between {low:,} and {high:,} pixels" if low and high else "about its own size"
        return (f"(Qwen's) resizes each image to {bounds}, its sides multiples of "
                f"{field('merge_size') * (field('patch_size', 14) or 14)} px,")
    return None


def _convnext_crop(pre: Mapping[str, Any], size: Mapping[str, float]) -> Dict[str, Any]:
    side, pct = size.get("shortest_edge"), pre.get("crop_pct")
    if not side:
        return {}
    if side >= CONVNEXT_WARP:
        return {"crop_mode": "squash", "crop_pct": 1.0}
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 1:
        raise ProcessorConfigError(f"crop_pct must be a number in (0, 1] (the share of the resized side kept), "
                                   f"got {pct!r}")
    return {"crop_mode": "center", "crop_pct": float(pct)}


def processor_size(pre: Mapping[str, Any], model_type: Optional[str] = None) -> Optional[Tuple[int, int]]:
    """The height and width of the pixels a processor makes: its centre crop, or the size it squashes images to;
    None where they keep the image's aspect (a shorter side without a crop) or the file says no size."""
    kind, pre = _filled(pre, model_type)
    try:
        size, crop = _size_and_crop(pre, kind)
    except ProcessorConfigError:  # said by :func:`preprocessing`, which reads the same fields
        return None
    if kind == "ConvNextImageProcessor" and size.get("shortest_edge"):  # a square of the side either way
        box = {"height": size["shortest_edge"], "width": size["shortest_edge"]}
    else:
        box = crop if pre.get("do_center_crop") else {} if size.get("shortest_edge") else size
    return (int(box["height"]), int(box["width"])) if box.get("height") and box.get("width") else None


def _per_channel(field: str, value: Any, channels: int, positive: bool) -> Tuple[float, ...]:
    """A processor's mean or std: a number for every channel, or one number for all (as transformers spreads it);
    three for another channel count are left to the model's config (which spreads the first, or says the count
    contradicts the weights)."""
    numbers = per_channel(value, channels)
    if numbers is None or len(numbers) not in (channels, 3) or not all(math.isfinite(v) and (v > 0 or not positive)
                                                               for v in numbers):
        what = "positive numbers" if positive else "numbers"
        raise ProcessorConfigError(f"{field} must be {channels} {what} (one per channel) or one, got {value!r}")
    return numbers


def _sides(field: str, value: Any, side: str, used: bool = True) -> Dict[str, float]:
    """A processor's ``size`` or ``crop_size`` as the sides vitkit reads (height, width, shortest edge), each a
    positive number: an integer is ``side`` (and the width for a height), as transformers' ``get_size_dict``
    reads it. A bound on the longer side (``longest_edge``, ``max_height``/``max_width``) is a resize vitkit's
    pipeline does not do: refused in one line where the field is ``used`` (before, it was left out, and the
    model was fed other pixels than its processor makes, or, with nothing else in ``size``, the default size,
    where transformers refuses such a size). Pixel budgets of VLM processors and null sides are left out."""
    if value is None:
        return {}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = {side: value, **({"width": value} if side == "height" else {})}
    bounds = [k for k in _BOUNDING_SIDES if isinstance(value, Mapping) and value.get(k) is not None]
    if bounds and used:
        others = [k for k in _READ_SIDES if value.get(k) is not None]
        fix = (f"remove {' and '.join(bounds)} from the file to resize by {' and '.join(others)} alone" if others
               else "give it a height and width, or a shortest_edge, instead")
        raise ProcessorConfigError(f"{field} {dict(value)} bounds the longer side ({', '.join(bounds)}), a resize "
                                   f"vitkit does not do (a height and width, or the shorter side, then the centre "
                                   f"crop): {fix}")
    read = {k: v for k, v in value.items() if k in _READ_SIDES and v is not None} if isinstance(value, Mapping) \
        else None
    if read is None or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= MAX_IMG_SIZE
                               for v in read.values()):
        raise ProcessorConfigError(f"{field} must be a side or a mapping ({'/'.join(_READ_SIDES)}) of sides from 1 "
                                   f"to {MAX_IMG_SIZE:,} px, got {value!r}")
    return read


def _scaled_statistics(pre: Mapping[str, Any], stats: Dict[str, Any]) -> Dict[str, Any]:
    """A processor that does not scale pixels by 1/255 (``do_rescale: false``, another ``rescale_factor``) or
    does not normalise (``do_normalize: false``) as vitkit's mean and std: it computes (p r - m) / s on pixels
    p in 0-255, which is (p / 255 - m / 255r) / (s / 255r); none for the usual processor."""
    try:
        factor = float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else 1.0
    except (TypeError, ValueError):
        factor = math.nan
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"the image processor's rescale_factor must be a positive number, got "
                         f"{pre.get('rescale_factor')!r}")
    normalise = pre.get("do_normalize", True)
    if normalise and abs(255 * factor - 1) < 1e-9:
        return {}
    if not normalise:
        stats = {"mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
    elif "mean" not in stats or "std" not in stats:
        return {}  # the processor class's own defaults, which the config does not say: left as read
    scale = 255 * factor
    return {"mean": tuple(m / scale for m in stats["mean"]), "std": tuple(s / scale for s in stats["std"])}


def _crop_pct(crop: float, side: float) -> float:
    """crop / side, nudged where floating point would make ``floor(crop / crop_pct)`` one short of ``side``."""
    pct = min(1.0, crop / side)
    return pct if math.floor(crop / pct) == side else min(1.0, crop / (side + 1e-6))


def _statistics_fields(config: Any) -> Dict[str, Any]:
    """What every written processor config holds: resized, rescaled, normalised by the config's mean and std with
    its filter."""
    return {"do_resize": True, "do_rescale": True, "do_normalize": True, "image_mean": list(config.mean),
            "image_std": list(config.std), "resample": {v: k for k, v in _RESAMPLE_NAMES.items()}[config.interpolation]}


def processor_fields(config: Any) -> Dict[str, Any]:
    """vitkit's evaluation preprocessing as an image processor's config (what :func:`preprocessing` reads back):
    ``squash``: the whole image to ``floor(size / crop_pct)``, then the centre crop where ``crop_pct`` < 1;
    ``center``: the shorter side to it and the centre crop."""
    h, w = config.img_size
    out = _statistics_fields(config)
    scale_h, scale_w = math.floor(h / config.crop_pct), math.floor(w / config.crop_pct)
    if getattr(config, "crop_mode", "center") == "squash":
        out["size"] = {"height": scale_h, "width": scale_w}
        if config.crop_pct < 1.0:
            out.update(do_center_crop=True, crop_size={"height": h, "width": w})
        else:
            out["do_center_crop"] = False
    else:
        out.update(size={"shortest_edge": min(scale_h, scale_w)}, do_center_crop=True,
                   crop_size={"height": h, "width": w})
    return out


def labels_from_hf(hf: Mapping[str, Any], count: int) -> Optional[List[str]]:
    """The class names of a classifier of ``count`` classes from config.json's ``id2label`` (None without, or
    where they are transformers' ``LABEL_i``); a
    count that disagrees with the classifier's is an edited file, refused (transformers keeps the two equal)."""
    names = hf.get("id2label") or {}
    if not isinstance(names, dict):  # transformers writes {"0": "cat", ...}
        raise WeightsError(f"id2label must map class numbers to names ({{\"0\": \"cat\", ...}}), not a "
                           f"{type(names).__name__}")
    if names and len(names) != count:
        raise WeightsError(f"the config's id2label names {len(names)} classes where its classifier holds {count}: "
                           f"it was edited or mixed with other weights; fix or re-save it")
    labels = [str(names.get(str(i), names.get(i, i))) for i in range(count)] if names else None
    if labels == [f"LABEL_{i}" for i in range(count)]:  # transformers' placeholders (what it writes for no names)
        return None  # as names they would show in predictions and cards as if someone had named the classes
    return labels


def labels_to_hf(config: Any) -> Dict[str, Any]:
    """config.json's ``id2label`` and ``label2id`` of a classifier (transformers' LABEL_i where it has no names)."""
    names = config.label_names or [f"LABEL_{i}" for i in range(config.num_classes)]
    return dict(id2label={str(i): n for i, n in enumerate(names)}, label2id={n: i for i, n in enumerate(names)})


def _act(hf: Mapping[str, Any]) -> str:
    act = hf.get("hidden_act", "gelu")
    if act not in _ACTS:
        raise WeightsError(f"hidden_act {act!r} of the Hugging Face config has no vitkit equivalent "
                           f"(known: {', '.join(_ACTS)})")
    return _ACTS[act]


def _pair(value: Any) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _fuse_qkv(sd: Dict[str, torch.Tensor], part: str = r"(q|k|v)", missing_k_bias: bool = True) -> None:
    """``blocks.N.attn.{q,k,v}.{weight,bias}`` -> ``blocks.N.attn.qkv.*`` in place; a bias absent for k alone
    (EVA/DINOv3) becomes ``q_bias`` / ``v_bias``."""
    parts: Dict[Tuple[str, str], Dict[str, torch.Tensor]] = {}
    for key in [k for k in sd if re.fullmatch(r"blocks\.\d+\.attn\.(q|k|v)\.(weight|bias)", k)]:
        block, name, leaf = re.fullmatch(r"(blocks\.\d+)\.attn\.(q|k|v)\.(weight|bias)", key).groups()
        parts.setdefault((block, leaf), {})[name] = sd.pop(key)
    for (block, leaf), got in parts.items():
        if leaf == "weight":
            if set(got) != {"q", "k", "v"}:
                raise WeightsError(_incomplete(block, leaf, got))
            sd[f"{block}.attn.qkv.weight"] = torch.cat([got["q"], got["k"], got["v"]])
        elif set(got) == {"q", "k", "v"}:
            sd[f"{block}.attn.qkv.bias"] = torch.cat([got["q"], got["k"], got["v"]])
        elif set(got) == {"q", "v"} and missing_k_bias:
            sd[f"{block}.attn.q_bias"], sd[f"{block}.attn.v_bias"] = got["q"], got["v"]
        else:
            raise WeightsError(_incomplete(block, leaf, got))


def _incomplete(block: str, leaf: str, got: Mapping[str, Any]) -> str:
    """A layer whose query, key and value are not all in the file, in words (it was "blocks.0: query/key/value
    weights incomplete (k, v)": vitkit's name, and the parts it held, not the one it lacked)."""
    words = {"q": "query", "k": "key", "v": "value"}
    lacks = " and ".join(words[p] for p in "qkv" if p not in got)
    holds = " and ".join(words[p] for p in "qkv" if p in got)
    return f"layer {block.split('.')[-1]}'s attention lacks its {lacks} {leaf} (the file holds its {holds} {leaf}): " \
           f"the file is incomplete; fix or re-save it"


def _split_qkv(sd: Dict[str, torch.Tensor], width: int) -> Dict[str, torch.Tensor]:
    """The reverse of :func:`_fuse_qkv`: ``blocks.N.attn.{q,k,v}.*`` from ``qkv`` (or ``q_bias``/``v_bias``)."""
    out = {}
    for key, value in sd.items():
        m = re.fullmatch(r"(blocks\.\d+\.attn)\.(qkv\.weight|qkv\.bias|q_bias|v_bias)", key)
        if not m:
            out[key] = value
        elif m.group(2).startswith("qkv"):
            leaf = m.group(2).split(".")[1]
            for part, chunk in zip("qkv", value.split(width)):
                out[f"{m.group(1)}.{part}.{leaf}"] = chunk.contiguous()
        else:
            out[f"{m.group(1)}.{m.group(2)[0]}.bias"] = value
    return out



def _problems(config: Any, want: Mapping[str, Any], what: str, patch_bias: bool, square: bool = True) -> List[str]:
    """What in ``config`` the tower's layout cannot express: fields other than ``want``'s, and the blocks'
    options no tower of these has; ``square``: a config that holds one image and patch side (a non-square
    model was written as its height alone: a folder transformers refused, or read back at another size)."""
    problems = [f"{k}={getattr(config, k, None)!r} (it needs {v!r})" for k, v in want.items()
                if getattr(config, k, None) != v]
    # (a table held apart, pos_embed_size, is what the config's image_size says: the input's size is the processor's)
    sides = (*(getattr(config, "pos_embed_size", None) or getattr(config, "img_size", (0, 0))),
             *getattr(config, "patch_size", (0, 0)))
    if square and (sides[0] != sides[1] or sides[2] != sides[3]):
        problems.append(f"a {sides[0]}x{sides[1]} image in {sides[2]}x{sides[3]} patches ({what}'s config holds one "
                        f"side of each: a square)")
    if getattr(config, "use_patch_bias", patch_bias) != patch_bias:
        problems.append(f"a patch projection {'with' if patch_bias else 'without'} a bias")
    for name in ("backbone", "representation_size", "distill_token", "attn_norm", "mlp_norm", "embed_norm",
                 "diff_attn"):
        if getattr(config, name, None):
            problems.append(f"{name} (none in {what})")
    if getattr(config, "block", "pre") != "pre":
        problems.append(f"block={config.block!r} ({what} has pre-norm blocks)")
    return problems


def _leftover(sd: Mapping[str, Any], what: str) -> None:
    if sd:
        raise WeightsError(f"no {what} name for {', '.join(sorted(sd)[:5])}")


def _move_all(sd: Dict[str, torch.Tensor], rules, out: Dict[str, torch.Tensor], what: str) -> Dict[str, torch.Tensor]:
    """Every tensor of ``sd`` moved into ``out`` under its name in ``what``'s layout, rule by rule
    (regex, replacement); one that no rule names is refused: an export never drops a tensor."""
    for ours, theirs in rules:
        for key in [k for k in sd if re.fullmatch(ours, k)]:
            out[re.sub(ours, theirs, key)] = sd.pop(key)
    _leftover(sd, what)
    return out



@dataclass(frozen=True)
class Tower:
    """One Hugging Face vision tower's layout (see :mod:`.hf_towers`' notes)."""

    #: the class names it is saved as (``architectures`` of config.json)
    classes: Tuple[str, ...]
    #: (hub state dict without the vision prefix, the tower's config) -> vitkit names
    to_native: Callable[[Dict[str, torch.Tensor], Mapping[str, Any]], Dict[str, torch.Tensor]]
    #: (the tower's config, its state dict) -> vitkit config
    config: Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
    #: (vitkit state dict, config) -> hub names
    from_native: Callable[[Dict[str, torch.Tensor], Any], Dict[str, torch.Tensor]]
    #: vitkit config -> what the layout cannot express
    problems: Callable[[Any], List[str]]
    #: vitkit config -> the tower's config.json
    hf_config: Callable[[Any], Dict[str, Any]]


def read_only_tower(classes: Tuple[str, ...], to_native: Callable, config: Callable, what: str,
                    written_as: str) -> Tower:
    """A layout vitkit reads and writes as another: its export side says so, in one line."""
    def refuse(*_: Any) -> Dict[str, torch.Tensor]:
        raise WeightsError(f"vitkit writes {what} as {written_as}")

    return Tower(classes, to_native, config, refuse, lambda c: [f"{what} is written as {written_as}"], refuse)
