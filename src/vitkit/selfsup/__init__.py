"""Self-supervised pre-training of a plain or an EVA-style ViT (rotary positions): one module per objective.

- ``simmim``: SimMIM (arXiv 2111.09886, the source seed 003 cites): masked blocks replaced by a
  mask token, L1 regression of their pixels by a one-layer head (:mod:`.simmim`);
- ``mpp``: the ViT paper's masked patch prediction (its 4.6): 50% of the patch embeddings
  corrupted BERT-style, their 3-bit mean colour predicted (:mod:`.mpp`);
- ``mae``: MAE (arXiv 2111.06377): 75% of the patches dropped, a light decoder reconstructs
  their pixels (:mod:`.mae`).

Every model holds its ViT as ``.encoder`` (a headless :class:`~vitkit.models.VisionTransformer`)
and is called the same way: ``out = model(images, mask=BOOL_B_N)`` (SimMIM, MPP) or
``out = model(images, noise=FLOAT_B_N)`` (MAE), drawing its own when not given; ``out.loss``,
``out.pred`` (per patch) and ``out.mask`` (B, N; 1 = masked) are always there.
``model.save_pretrained(folder)`` writes the encoder's config with the objective under
``"pretraining"``; :func:`vitkit.from_pretrained` reads it back (and Hugging Face's
``ViTForMaskedImageModeling`` / ``ViTMAEForPreTraining`` folders and the official MAE
checkpoints), and ``vitkit train --init`` fine-tunes the encoder.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Type

from torch import nn

from .base import CONFIG_KEY, PretrainConfig, Pretrainer, PretrainOutput, encoder_config
from .mae import MAE, MAEConfig
from .mpp import MaskedPatchPrediction, MPPConfig
from .simmim import SimMIM, SimMIMConfig

#: objective name -> its model class
OBJECTIVES: Dict[str, Type[Pretrainer]] = {"simmim": SimMIM, "mpp": MaskedPatchPrediction, "mae": MAE}


def objective_class(name: str) -> Type[Pretrainer]:
    if name not in OBJECTIVES:
        raise ValueError(f"unknown pre-training objective {name!r}; known: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


def create_pretrainer(objective: str, encoder: Any = None, **options: Any) -> Pretrainer:
    """A pre-training model: ``objective`` on ``encoder`` (a model name, a ViTConfig or a
    headless VisionTransformer; default ViT-B/16), with the objective's ``options``."""
    return objective_class(objective)(encoder, **options)


def pretrainer_from_configs(encoder: Any, pretraining: Mapping[str, Any]) -> Pretrainer:
    """The model ``config.json`` describes: the encoder's config and its ``"pretraining"`` entry."""
    if not isinstance(pretraining, Mapping) or "objective" not in pretraining:
        raise ValueError(f"a pre-training entry needs its objective, got {pretraining!r}")
    cls = objective_class(pretraining["objective"])
    return cls(encoder, cls.config_cls.from_dict(dict(pretraining)))


def is_pretrainer(model: nn.Module) -> bool:
    return isinstance(model, Pretrainer)


def encoder_of(model: nn.Module) -> nn.Module:
    """The ViT to evaluate or inspect: a pre-training model's encoder, any other model itself."""
    return model.encoder if isinstance(model, Pretrainer) else model


__all__ = ["OBJECTIVES", "CONFIG_KEY", "Pretrainer", "PretrainConfig", "PretrainOutput", "SimMIM", "SimMIMConfig",
           "MaskedPatchPrediction", "MPPConfig", "MAE", "MAEConfig", "create_pretrainer", "pretrainer_from_configs",
           "objective_class", "is_pretrainer", "encoder_of", "encoder_config"]
