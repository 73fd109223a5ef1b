"""Which layout a state dict's tensor names are (vitkit's, timm's, Hugging Face's, open_clip's, the official npz
ones, DINO's releases), and one that mixes two of them refused as a mix."""

from __future__ import annotations

import re
from typing import List

from ..models import family_of_state_dict, renamed_in_timm
from . import (
    deepseek_format,
    dino_format,
    gemma4_format,
    hf_format,
    npz_format,
    open_clip_format,
    qwen_format,
    sam_format,
)
from .io import WeightsError


def detect_format(keys) -> str:
    """Name the layout of a flat state dict from its key names."""
    keys = list(keys)
    if renamed_in_timm(keys) is not None:
        return "timm"  # a family's own timm names (DeepSeek's classifier: its encoder under encoder.)
    if any(k.startswith("encoder.patch_embed.") for k in keys):
        return "vitkit"  # a vitkit pre-training model: its ViT under encoder., the objective's parts beside it
    found = npz_format.detect_layout(keys)
    if found is not None:
        return "npz" if found[0] == "vit_jax" else "big_vision"
    if hf_format.is_hf(keys):
        return _one_layout(keys, "hf")
    if open_clip_format.is_open_clip(keys):
        return _one_layout(keys, "open_clip")  # CLIP's image tower under visual. (the text tower is left out)
    if dino_format.detect(keys):
        return "dino"  # the official DINOv2 / DINOv3 releases (registers, mask token, DINOv3's names)
    if deepseek_format.detect(keys):
        return "deepseek"  # DeepSeek's own shard: its vision tower under vision., the language model beside it
    if qwen_format.detect(keys):
        return "qwen"  # Qwen's own checkpoint: its vision tower under model.visual., the language model beside it
    if gemma4_format.detect(keys):
        return "gemma4"  # Gemma 4's own checkpoint: its vision tower under model.vision_tower., the rest beside it
    if sam_format.detect(keys):
        return "sam"  # SAM's own checkpoint: its image encoder under image_encoder., the prompt encoder beside it
    if family_of_state_dict(keys) is not None:
        return _one_layout(keys, "timm")  # vitkit's names are timm's (the official DeiT/CaiT/ConViT .pth files too)
    preview = ", ".join(sorted(keys)[:6])
    if any(k.startswith("blocks.0.") for k in keys) and ("pos_embed" in keys or "cls_token" in keys):
        raise WeightsError(f"timm/vitkit names without 'patch_embed.proj.weight', the patch projection every ViT "
                           f"has (first keys: {preview}): the file is partial")
    raise WeightsError(f"unrecognised weight layout (first keys: {preview}); expected vitkit/timm, Hugging Face "
                       f"(ViT, DeiT, I-JEPA, CLIP, SigLIP, DINOv2, DINOv3, BEiT, AIMv2, SAM), open_clip, DINO's, "
                       f"DeepSeek's, Qwen's, Gemma 4's or SAM's releases, or official vit_jax / big_vision npz names")


#: the transformer layers' names of the layouts one file could mix (a timm half and a Hugging Face half was refused
#: by the other half's names only, as "not in the model" or as Hugging Face weights that "need their config.json")
LAYER_NAMES = {"timm": re.compile(r"^blocks\.\d+\."), "hf": re.compile(r"(^|\.)layers?\.\d+\."),
               "open_clip": re.compile(r"^visual\.transformer\.resblocks\.\d+\.")}
_LAYOUT_WORDS = {"timm": "timm", "hf": "Hugging Face", "open_clip": "open_clip"}


def _one_layout(keys: List[str], layout: str) -> str:
    """``layout``, after checking that no tensor is another layout's transformer layer (an open_clip file's
    text tower, under ``text.`` or ``transformer.``, is its own)."""
    if layout == "open_clip":
        keys = [k for k in keys if not k.startswith(open_clip_format.TEXT_PARTS)]
    for other, names in LAYER_NAMES.items():
        theirs = sorted(k for k in keys if names.search(k)) if other != layout else []
        if theirs:
            ours = [k for k in keys if LAYER_NAMES[layout].search(k)] or [k for k in keys if _LAYOUT_MARKS[layout](k)]
            raise WeightsError(f"the file mixes two layouts: {_LAYOUT_WORDS[layout]}'s names (e.g. {sorted(ours)[0]}) "
                               f"beside {len(theirs)} tensors of {_LAYOUT_WORDS[other]}'s layers (e.g. {theirs[0]}); "
                               f"vitkit reads one layout a file: convert each part with the library that wrote it")
    return layout


#: a name that made :func:`detect_format` read a file as each layout (where it has no layer of its own)
_LAYOUT_MARKS = {"hf": lambda k: hf_format.is_hf([k]), "open_clip": lambda k: k.startswith("visual."),
                 "timm": lambda k: k.startswith(("patch_embed.", "cls_token", "pos_embed"))}
