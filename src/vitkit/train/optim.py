"""The optimiser: weight decay on the weight matrices only, layer-wise learning-rate decay by
the parameter groups the model's family declares (:class:`vitkit.models.base.LayerGroups`), and
which weights Muon steps (:func:`hidden_matrices`)."""

from __future__ import annotations

from typing import Dict, List, Set, Tuple

import torch
from torch import nn

from ..models.base import LayerGroups, TokenModel
from .config import TrainConfig
from .muon import Muon


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Weight decay on weight matrices only: not on biases, norms, tokens or position tables.

    With ``layer_decay`` (BEiT's and MAE's fine-tuning rule) each group also carries an
    ``lr_scale``: decay^(depth + 1 - layer) for the embedding (layer 0), block i (layer i + 1)
    and the rest (the final norm and the head, layer depth + 1, scale 1)."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    depth = len(getattr(model, "blocks", ()))
    layers = layer_groups(model)
    matrices = hidden_matrices(model) if cfg.optimizer == "muon" else set()
    groups: Dict[Tuple[bool, int, bool], List[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            layer = layers.layer_of(name, depth) if cfg.layer_decay is not None else depth + 1
            groups.setdefault((p.ndim <= 1 or name in skip, layer, name in matrices), []).append(p)
    decay = cfg.layer_decay if cfg.layer_decay is not None else 1.0
    params = [{"params": ps, "weight_decay": 0.0 if no_wd else cfg.weight_decay,
               "lr_scale": lr_scale(decay, depth, layer) * (cfg.muon_lr_scale if muon else 1.0),
               **({"muon": True} if muon else {})}
              for (no_wd, layer, muon), ps in sorted(groups.items())]
    if cfg.optimizer == "muon":
        return Muon(params, lr=cfg.lr, betas=cfg.betas, momentum=cfg.momentum)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
    # on a GPU the fused kernels (one launch for every tensor); a CPU keeps the foreach step
    fused = {"fused": True} if next(model.parameters()).device.type == "cuda" else {}
    if cfg.optimizer == "adam":  # the paper's Adam with decoupled weight decay is AdamW
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, **fused)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, **fused)


def hidden_matrices(model: nn.Module) -> Set[str]:
    """The weights Muon steps: those of every linear and convolutional layer but the first (it reads
    the pixels) and the classifier (``get_classifier``; a model without one: its last layer), as
    Muon's authors keep the input and output layers on AdamW. Tokens, position tables, norms, biases
    and LayerScale are not layers' matrices and stay on AdamW too, as do LoRA's low-rank factors (Muon
    was made for whole weight matrices)."""
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) and ".lora_" not in f".{name}"]
    if not layers:
        return set()
    heads = model.get_classifier() if hasattr(model, "get_classifier") else layers[-1][1]
    heads = set(map(id, heads if isinstance(heads, tuple) else (heads,)))
    return {f"{name}.weight" for name, m in layers[1:] if id(m) not in heads and m.weight.requires_grad}


def lr_scale(decay: float, depth: int, layer: int) -> float:
    """Layer ``layer``'s learning-rate scale (0 the embedding, i + 1 block i, depth + 1 the rest: scale 1)."""
    return decay ** (depth + 1 - layer)


def layer_decay_line(model: nn.Module, decay: float) -> str:
    """What layer-wise decay does to this model's trainable parameters, said once at the start: the scale of
    the embedding (and which tensors count as it: registers, RoPE tables), of the blocks and of the rest."""
    depth = len(getattr(model, "blocks", ()))
    layers = layer_groups(model)
    held: Dict[int, List[str]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            held.setdefault(layers.layer_of(name, depth), []).append(name.rsplit(".", 1)[0]
                                                                      if name.endswith((".weight", ".bias")) else name)
    parts = []
    if 0 in held:
        parts.append(f"x{lr_scale(decay, depth, 0):.3g} for the embedding ({', '.join(dict.fromkeys(held[0]))})")
    blocks = sorted(k - 1 for k in held if 0 < k <= depth)
    if blocks:
        first, last = blocks[0], blocks[-1]
        scales = f"x{lr_scale(decay, depth, first + 1):.3g}" + (
            f" to x{lr_scale(decay, depth, last + 1):.3g}" if last > first else "")
        parts.append(f"{scales} for block{'s' if last > first else ''} {first}" + (f"-{last}" if last > first else ""))
    if depth + 1 in held:
        parts.append(f"x1 for {', '.join(dict.fromkeys(held[depth + 1]))}")
    return f"layer decay {decay:g}: lr " + "; ".join(parts)


def layer_groups(model: nn.Module) -> LayerGroups:
    """The parameter groups ``model``'s family declares; a module that declares none (a
    pre-training wrapper, a CNN, a model from elsewhere) is grouped by the token models' rule."""
    groups = getattr(model, "layer_groups", None)
    return groups if isinstance(groups, LayerGroups) else TokenModel.layer_groups


def layer_of(name: str, depth: int) -> int:
    """The layer a parameter belongs to for layer-wise decay by the token models' rule: 0 the
    embedding (patches, the class, distillation and register tokens, positions: the learned table and
    RoPE-Mixed's frequencies, the norm after the embedding), i + 1 block i, depth + 1 everything after
    the blocks (the attention pool too)."""
    return TokenModel.layer_groups.layer_of(name, depth)


__all__ = ["hidden_matrices", "layer_decay_line", "layer_groups", "layer_of", "make_optimizer"]
