"""transformers' ``...Backbone`` folders as vitkit feature models: the maps their config asks for.

A ``Dinov2Backbone``, ``Dinov2WithRegistersBackbone``, ``DINOv3ViTBackbone`` or ``BeitBackbone`` folder
holds its encoder's tensors (read as that encoder) and, in ``config.json``, which maps it returns:
``out_features`` / ``out_indices`` over the stages ``stem`` (the embedding's output) and ``stage1`` ...
``stageN`` (block 0 ... N-1), each through the final norm where ``apply_layernorm`` says so (DINOv2 and
DINOv3; BEiT's maps never are), the prefix tokens dropped, as (B, D, gh, gw). ``from_pretrained(folder,
features_only=True)`` without ``out_indices`` builds those maps (:func:`backbone_plan`), so the feature model
returns what transformers' backbone returns for the same images. What vitkit's feature model cannot return
is refused in one line: the ``stem`` map and a DINOv3 backbone with ``apply_layernorm`` false (it still
normalises its last map, and only that one); BEiT's ``add_fpn`` pyramid (a BatchNorm neck, not ViTDet's) is
refused when the folder is read.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

from .io import WeightsError

#: the backbone classes, and whether their maps can go through the final norm (``apply_layernorm``)
BACKBONES = {"Dinov2Backbone": True, "Dinov2WithRegistersBackbone": True, "DINOv3ViTBackbone": True,
             "BeitBackbone": False}


def backbone_class(config_json: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The ``...Backbone`` class a transformers folder was saved as, or None."""
    names = (config_json or {}).get("architectures") or []
    return next((n for n in names if n in BACKBONES), None)


def backbone_plan(config_json: Optional[Mapping[str, Any]], depth: int) -> Optional[Tuple[List[int], bool]]:
    """(the blocks whose maps the backbone returns, whether they pass through the final norm) of a
    transformers backbone folder of ``depth`` blocks; None for any other source."""
    cls = backbone_class(config_json)
    if cls is None:
        return None
    cfg = dict(config_json or {})
    stages = ["stem"] + [f"stage{i}" for i in range(1, depth + 1)]
    wanted = _stages(cfg, stages, cls)
    if "stem" in wanted:
        raise WeightsError(f"this {cls} returns the 'stem' map (the patch embedding's output, before any block): "
                           f"vitkit's feature model returns blocks' maps; pass out_indices (blocks 0-{depth - 1})")
    norm = BACKBONES[cls] and bool(cfg.get("apply_layernorm", True))
    if cls == "DINOv3ViTBackbone" and not norm and stages[-1] in wanted:
        raise WeightsError(f"this {cls} has apply_layernorm false, and normalises its last map anyway (only that "
                           f"one): vitkit's feature model normalises all its maps or none; pass out_indices")
    return sorted(stages.index(s) - 1 for s in wanted), norm


def _stages(cfg: Mapping[str, Any], stages: List[str], cls: str) -> List[str]:
    """The stage names the config asks for (``out_features``, else ``out_indices``; neither: the last)."""
    if cfg.get("out_features"):
        wanted = [str(s) for s in cfg["out_features"]]
    elif cfg.get("out_indices") is not None:
        try:
            wanted = [stages[int(i)] for i in cfg["out_indices"]]
        except (IndexError, TypeError, ValueError):
            raise WeightsError(f"this {cls}'s out_indices {cfg['out_indices']!r} are not stages of its "
                               f"{len(stages) - 1} blocks (0 is the stem, 1-{len(stages) - 1} the blocks)") from None
    else:
        wanted = [stages[-1]]
    unknown = [s for s in wanted if s not in stages]
    if unknown:
        raise WeightsError(f"this {cls}'s out_features name {unknown[0]!r}, not a stage of its {len(stages) - 1} "
                           f"blocks (stem, stage1-stage{len(stages) - 1})")
    return wanted


__all__ = ["BACKBONES", "backbone_class", "backbone_plan"]
