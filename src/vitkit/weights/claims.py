"""What a source says about itself (its config.json, or the config in a safetensors file's metadata) against
what its tensors hold: a file that contradicts itself is refused by name, never loaded into another shape."""

from __future__ import annotations

import math
from typing import Any, List, Mapping

import torch
from torch import nn

from ..models import build_from_config
from ..models.sizes import to_2tuple
from .io import WeightsError
from .load import Source, shape_problems, to_native


def check_claims(config: Any, src: Source) -> None:
    """What a source says about itself (its config.json, or the config in a safetensors file's
    metadata) against what its tensors hold: the classes of its head, the channels of its first
    convolution and (vitkit and Hugging Face layouts, whose configs fix the grid) the slots of its
    position table. A file that contradicts itself is refused by name: believing its config would
    load its weights into another shape (resampled or adapted) without a word."""
    if src.config_json is None:
        return  # read off the shapes: consistent by construction
    sd, _ = to_native(src)
    with torch.device("meta"):
        model = build_from_config(config)
    target = model.state_dict()
    checks = [("head.weight", 0, "num_classes", "classes in its head"),
              ("head.fc.weight", 0, "num_classes", "classes in its head")]
    conv = next((name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)
    if conv is not None:
        checks.append((f"{conv}.weight", 1, "in_chans", "input channels in its first convolution"))
    if src.format in ("vitkit", "hf"):
        checks.append(("pos_embed", 1, "img_size", _slots_what(config, sd)))
        checks.append(("blocks.0.attn.relative_position_bias_table", 0, "img_size",
                       "relative-bias rows (a grid of another image size)"))
        # a rotary model has no table to contradict: its filters were resampled to the config's patch (DINOv3)
        checks += [("patch_embed.proj.weight", dim, "patch_size", "px patch filters") for dim in (2, 3)]
    fired = [(key, f"{field} {_claimed(config, field)} where its weights hold {sd[key].shape[dim]} {what}")
             for key, dim, field, what in checks
             if key in sd and key in target and sd[key].dim() > dim and sd[key].shape[dim] != target[key].shape[dim]]
    fired = list({key: (key, said) for key, said in fired}.values())  # one line for a filter wrong both ways
    patch = _timm_patch_claim(src, sd)
    problems = [p for _, p in fired] + patch
    if src.format == "vitkit":  # vitkit's own names: every other tensor is the config's too
        said = tuple(key.rsplit(".", 1)[0] for key, _ in fired)
        problems += [p for p in shape_problems(sd, target) if not said or not p.startswith(said)]
    if problems:  # (timm's local-dir: resamples filters under an edited patch_size; the way to ask for that here)
        other = (" (to run its filters at other patches, resampled as timm resamples them, keep its patch_size and "
                 "ask for another: from_pretrained(path, patch_size=N), or vitkit train --init with --model-args "
                 "'{\"patch_size\": N}')") if patch else ""
        raise WeightsError(f"{src.path or 'the weights'}: its config does not match its weights (the config says "
                           f"{'; '.join(problems)}): it was edited or mixed with other weights; fix or re-save it"
                           + other)


def _timm_patch_claim(src: Source, sd: Mapping[str, Any]) -> List[str]:
    """A timm hub config.json's own ``patch_size`` against its patch filters: a folder edited or mixed was refused as
    a cut position table. Read off the file itself: the built config may carry a size asked for (filters resampled)."""
    args = (src.config_json or {}).get("model_args")
    weight = sd.get("patch_embed.proj.weight")
    if src.format != "timm" or not isinstance(args, Mapping) or args.get("patch_size") is None \
            or not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        return []
    try:
        claimed = to_2tuple(args["patch_size"])
    except ValueError:
        return []  # (the config's own check says it)
    held = tuple(weight.shape[2:])
    return [] if claimed == held else [f"patch_size {claimed[0]}x{claimed[1]} where its weights hold "
                                       f"{held[0]}x{held[1]} px patch filters"]


def _claimed(config: Any, field: str) -> str:
    value = getattr(config, field)
    if field == "img_size":
        grid = getattr(config, "grid_size", None)
        return f"{value[0]}x{value[1]}" + (f" (a {grid[0]}x{grid[1]} grid)" if grid else "")
    if field == "patch_size":
        return f"{value[0]}x{value[1]}"
    return str(value)


#: the most prefix slots a table holds (a class and a distillation token and 16 registers)
_MOST_PREFIX = 18


def _slots_what(config: Any, sd: Mapping[str, Any]) -> str:
    """What a position table of the wrong length holds, in words: another grid, or the config's grid with
    another number of prefix slots (a class token, registers, a table over the patches only: the config of
    another family, where "a grid of another image size" sent the user after the size)."""
    grid, table = getattr(config, "table_grid", None), sd.get("pos_embed")
    own = getattr(config, "num_prefix_tokens", None)
    if not grid or table is None or table.dim() != 3 or own is None:
        return "position slots (a grid of another image size)"
    own = 0 if getattr(config, "no_embed_class", False) else own
    slots, patches = int(table.shape[1]), grid[0] * grid[1]
    if slots - own > 0 and math.isqrt(slots - own) ** 2 == slots - own or not 0 <= slots - patches <= _MOST_PREFIX:
        return "position slots (a grid of another image size)"
    return (f"position slots: its {grid[0]}x{grid[1]} grid's and {slots - patches} for prefix tokens where the "
            f"config's model has {own} (a class token, registers or a table over the patches only: the config "
            f"of another model)")


__all__ = ["check_claims"]
