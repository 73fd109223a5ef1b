"""What an architecture read off bare tensors took for fields no tensor holds (open_clip's activation, a fused
qkv's number of heads, the input normalisation, the later ViTs' unstored fields), said once per load: a wrong
guess changes every output without an error; and the fields fine-tuning may therefore set."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Mapping, Optional, Sequence

from ..models.sizes import to_2tuple
from . import open_clip_format
from .load import Source


class GuessWarning(UserWarning):
    """An architecture read off a bare state dict's shapes in a field the shapes do not hold."""


def note_guesses(config: Any, src: Source, overrides: Dict[str, Any]) -> None:
    """Say, once per load, which fields of an architecture read off bare tensors were guessed (:func:`guesses`):
    a wrong guess changes every output without an error."""
    for guess in guesses(config, src, overrides):
        warnings.warn(f"{src.path} holds tensors only: {guess}", GuessWarning, stacklevel=3)


def guesses(config: Any, src: Source, overrides: Optional[Dict[str, Any]] = None) -> list:
    """What an architecture read off bare tensors took for fields no tensor holds, a sentence each: open_clip's
    activation (and a resize_mode of its config that vitkit has no equivalent for); the input normalisation; a
    fused qkv matrix's number of heads (width / 64 outside the paper's table); and what :func:`_unstored` names.
    Empty for a source with its config, or where ``overrides`` set the field."""
    overrides = overrides or {}
    if src.format == "open_clip":
        said = []
        # an open_clip_config.json without its model_cfg says no more than none (it was read without a note)
        bare = not isinstance((src.open_clip_config or {}).get("model_cfg"), Mapping)
        if bare and "gelu" not in overrides:
            said.append("open_clip's activation is not stored and was read as exact GELU (LAION's); OpenAI's CLIP "
                        "weights need gelu='quick' (or the folder with open_clip_config.json)")
        if bare and "num_heads" not in overrides and not open_clip_format.heads_known(
                config.embed_dim):
            said.append(f"its number of heads is not stored and was read as {config.num_heads} (width "
                        f"{config.embed_dim} / 64, open_clip's default head width); a tower trained with another "
                        f"needs num_heads= (or the folder with open_clip_config.json)")
        if bare and config.global_pool == "avg":
            said.append("its readout is not stored: a tower without ln_pre was read as CLIPA's (the patch tokens' "
                        "mean, ln_post after it; every open_clip config without ln_pre pools so; or the folder with "
                        "open_clip_config.json)")
        mode = open_clip_format.unread_resize_mode(src.open_clip_config)
        if mode and "crop_mode" not in overrides:
            said.append(f"its preprocess_cfg resize_mode {mode!r} is not one vitkit does ('shortest', 'squash'; "
                        f"open_clip's 'longest' pads to a square): images are resized and centre-cropped instead "
                        f"(crop_mode='center'); pass crop_mode= to choose")
        return said
    if src.config_json is not None or src.format != "timm":
        return []
    said = []
    if src.open_clip_trunk:
        read = ["timm_pool 'avg' after the norm"] if src.open_clip_projection else []
        read += ["its head an embedding's projection"] if "head.weight" in src.tensors else []
        read += ["CLIP's normalisation", "the whole image resized"]
        said.append(f"an open_clip tower built by timm, without its open_clip_config.json: read with open_clip's "
                    f"defaults ({', '.join(read)}); the folder with open_clip_config.json removes the guess")
    elif "mean" not in overrides and "std" not in overrides:  # preprocessing: every image predict/eval/train feeds
        said.append(f"its input normalisation is not stored and was read as mean {_numbers(config.mean)} std "
                    f"{_numbers(config.std)}, and its resize as {config.interpolation} to the centre "
                    f"{config.crop_pct:g} ({config.crop_mode}); a model trained with another (DeiT's, DINOv2's and "
                    f"BEiT v2's are ImageNet's, CLIP's its own) needs mean= and std= (vitkit predict --mean --std; "
                    f"crop_pct= and interpolation= in Python)")
    if getattr(config, "architecture", None) == "coca" and not overrides:
        said.append("what no tensor holds was assumed as open_clip builds CoCa: LayerNorm eps 1e-5, exact GELU, the "
                    "pooler's 8 heads, the tower's heads 64 wide, a head of the pooler's width the projection; load "
                    "open_clip's folder (open_clip_config.json) to be sure")
    if getattr(config, "architecture", None) != "vit":
        return said
    from ..models.vit import HEADS_BY_WIDTH

    if config.embed_dim not in HEADS_BY_WIDTH and "num_heads" not in overrides:
        said.append(f"its number of heads is not stored and was read as {config.num_heads} (width "
                    f"{config.embed_dim} / 64); if the model had another, load it with its architecture "
                    f"(--model NAME, model_name=) or num_heads= (vitkit train --init: --model-args)")
    assumed = _unstored(config, src, overrides)
    if assumed:
        said.append(f"what no tensor holds was assumed: {'; '.join(assumed)}. Load it with its architecture "
                    f"(--model NAME, model_name=) or from its hub folder to be sure")
    return said


def open_fields(config: Any, src: Source) -> frozenset:
    """The config fields a bare source's tensors do not hold (what :func:`guesses` says were taken for them):
    fine-tuning's --model-args may set them, where a field the weights do hold is refused (a bare file's guessed
    1 head was "the weights'", and every way the notes named to give the true count was refused)."""
    preprocessing = {"mean", "std", "crop_pct", "interpolation", "crop_mode"}
    if src.format == "open_clip":
        bare = not isinstance((src.open_clip_config or {}).get("model_cfg"), Mapping)
        return frozenset({"gelu", "num_heads", *preprocessing} if bare else ())
    if src.config_json is not None or src.format != "timm":
        return frozenset()
    if getattr(config, "architecture", None) != "vit":
        return frozenset(preprocessing)
    from ..models.vit import UNSTORED

    return frozenset({*preprocessing, "num_heads", *UNSTORED})


def _numbers(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _unstored(config: Any, src: Source, overrides: Dict[str, Any]) -> list:
    """What a bare ViT state dict leaves open where it matters. The original ViTs and DeiT (a class token, plain
    blocks) are read as they were built; a file with anything of the later ViTs (registers, a pre-norm, a MAP
    head, SwiGLU, RMSNorm, q/k or sub-norms, or no class token: timm's gap, SigLIP-gap, relpos and rpn models)
    could have any of UNSTORED's fields otherwise (a SigLIP-gap file's tanh GELU, BEiT-3's eps 1e-5, an rpn
    file's post-norm blocks change every output without an error). Also the image size, where the positions
    hold no grid (a relative-bias MLP's bias depends on it). A field in ``overrides`` is not a guess."""
    from ..models.vit import UNSTORED

    later = (any(n in src.tensors for n in ("reg_token", "norm_pre.weight", "attn_pool.latent"))
             or config.mlp != "mlp" or config.norm == "rmsnorm" or not config.class_token
             or config.qk_norm or config.attn_norm or config.mlp_norm)
    assumed = [what for field, what in UNSTORED.items() if field not in overrides] if later else []
    prefix = int(config.class_token) + int(config.distill_token) + config.reg_tokens
    # a size asked for settles the reading only where it is the table's own (another one is a resampling of it)
    saved_at = overrides.get("img_size") is not None and to_2tuple(overrides["img_size"]) == tuple(config.img_size)
    if config.pos_embed == "learned" and config.no_embed_class and prefix and not config.reg_tokens and \
            not saved_at:
        h, w = config.grid_size
        assumed.append(f"the position table over the patches only ({h}x{w}, DeiT III's and FlexiViT's form; "
                       f"a class slot before {h * w - 1} patches of a non-square grid reads the same: img_size= "
                       f"(--img-size) the size it was saved at, for that)")
    if config.pos_embed in ("relative_mlp", "none") and "img_size" not in overrides:
        h, w = config.img_size
        assumed.append(f"the image size ({h}x{w} px: its positions hold no grid; img_size= for another)")
    return assumed
