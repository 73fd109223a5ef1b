"""DeiT's distillation: a frozen teacher, and the soft or hard distillation loss.

The teacher is any model vitkit loads (a vitkit run's ``model/``, a timm/npz/HF file, a
ResNetV2 checkpoint) or a torchvision classifier given as ``torchvision:NAME:FILE`` (a state
dict, read with ``weights_only=True``; the architecture is built by name, nothing is
unpickled). It runs in eval mode without gradients on the student's batch, converted to its
own input: the student's normalisation undone, the teacher's size, channels and
normalisation applied.

Losses (Touvron et al., 2021, Eq. 2 and 3), with ``cls`` and ``dist`` the student's class and
distillation logits (the same tensor for a student without a distillation token):

- soft: ``(1 - alpha) * CE(cls, y) + alpha * tau^2 * KL(softmax(teacher / tau) || softmax(dist / tau))``,
  the KL summed and divided by batch x classes as the official DeiT code does (the paper's
  Eq. 2 leaves the reduction unsaid);
- hard: ``CE(cls, y) / 2 + CE(dist, argmax teacher) / 2`` (alpha and tau do not apply).

``y`` is class indices, or soft targets (B, C) -- Mixup/CutMix's, label smoothing already
folded in -- for which ``CE`` is the soft-target cross-entropy ``mean_b sum_c -y log p`` and
``label_smoothing`` is not applied again. The teacher sees the same (mixed) inputs (DeiT).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..extras import first_line, require
from ..models.config_base import IMAGENET_MEAN, IMAGENET_STD

DISTILL_MODES = ("none", "soft", "hard")
TORCHVISION_PREFIX = "torchvision:"


@dataclass
class InputSpec:
    """What a model expects at its input (from its config, or torchvision's defaults)."""

    img_size: Tuple[int, int]
    in_chans: int
    mean: Tuple[float, ...]
    std: Tuple[float, ...]

    @classmethod
    def of(cls, config: Any) -> "InputSpec":
        return cls(tuple(config.img_size), config.in_chans, tuple(config.mean), tuple(config.std))


class Teacher(nn.Module):
    """A frozen classifier that takes the student's normalised batch."""

    def __init__(self, model: nn.Module, spec: InputSpec, source: str):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.spec = spec
        self.source = source

    def train(self, mode: bool = True) -> "Teacher":  # always in eval mode
        return super().train(False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, student: InputSpec) -> torch.Tensor:
        x = x.float() * _col(student.std, x) + _col(student.mean, x)  # back to [0, 1]
        if x.shape[1] != self.spec.in_chans:
            if x.shape[1] == 1:
                x = x.expand(-1, self.spec.in_chans, -1, -1)
            elif self.spec.in_chans == 1:
                x = x.mean(dim=1, keepdim=True)
            else:
                raise ValueError(f"the teacher takes {self.spec.in_chans} channels, the data has {x.shape[1]}")
        if tuple(x.shape[-2:]) != self.spec.img_size:
            x = F.interpolate(x, size=self.spec.img_size, mode="bilinear", align_corners=False, antialias=True)
        x = (x - _col(self.spec.mean, x)) / _col(self.spec.std, x)
        return self.model(x).float()


def _col(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(1, -1, 1, 1)


def load_teacher(source: str, num_classes: int, device: Union[str, torch.device] = "cpu") -> Teacher:
    """The teacher named by ``--teacher``; its classes must be the student's."""
    if source.startswith(TORCHVISION_PREFIX):
        model, spec = _torchvision_teacher(source[len(TORCHVISION_PREFIX):], num_classes)
    else:
        from ..models.config_base import no_classes
        from ..runlock import unfinished_run
        from ..weights.pretrained import from_pretrained

        if why := unfinished_run(source):
            raise FileNotFoundError(f"--teacher {why}")
        model = from_pretrained(source)
        spec = InputSpec.of(model.config)
        if getattr(model.config, "head_kind", "classes") != "classes":
            raise ValueError(f"teacher {source} has {no_classes(model.config)}: a teacher scores the classes")
        if model.config.num_classes != num_classes:
            raise ValueError(f"teacher {source} predicts {model.config.num_classes} classes, the data has "
                             f"{num_classes}: distillation needs the same classes")
    return Teacher(model.to(device), spec, source)


def _torchvision_teacher(spec: str, num_classes: int):
    name, sep, path = spec.partition(":")
    if not sep or not name or not path:
        raise ValueError(f"a torchvision teacher is torchvision:NAME:FILE (e.g. torchvision:resnet18:r18.pth), "
                         f"got torchvision:{spec}")
    torchvision = require("torchvision", "train", "torchvision teachers (--teacher torchvision:NAME:FILE)")
    if name not in torchvision.models.list_models(module=torchvision.models):
        raise ValueError(f"unknown torchvision classifier {name!r}")
    from ..weights.io import read_tensors

    state = {k: torch.as_tensor(v) for k, v in read_tensors(path).items()}
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"{path} does not fit torchvision's {name} with {num_classes} classes: "
                         f"{first_line(e)}") from None
    return model, InputSpec((224, 224), 3, IMAGENET_MEAN, IMAGENET_STD)  # torchvision classifiers: ImageNet, 224 px


def split_outputs(outputs: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]):
    """(class logits, distillation logits): a pair from a DeiT student, else the same tensor twice."""
    if isinstance(outputs, tuple):
        return outputs
    return outputs, outputs


def distillation_loss(outputs, labels: torch.Tensor, teacher_logits: Optional[torch.Tensor], mode: str,
                      alpha: float = 0.5, tau: float = 1.0, label_smoothing: float = 0.0) -> torch.Tensor:
    """DeiT's loss for ``mode`` in ("none", "soft", "hard"); ``labels`` are class indices or
    soft targets (B, C); see the module notes."""
    if mode not in DISTILL_MODES:
        raise ValueError(f"distill must be one of {DISTILL_MODES}, not {mode!r}")
    cls, dist = split_outputs(outputs)
    if labels.is_floating_point():  # soft targets: smoothing is already in them
        base = F.cross_entropy(cls.float(), labels.float())
    else:
        base = F.cross_entropy(cls.float(), labels, label_smoothing=label_smoothing)
    if mode == "none":
        return base
    if teacher_logits is None:
        raise ValueError(f"distill={mode!r} needs the teacher's logits")
    if mode == "soft":
        kl = F.kl_div(F.log_softmax(dist.float() / tau, dim=-1), F.log_softmax(teacher_logits / tau, dim=-1),
                      reduction="sum", log_target=True) / dist.numel()
        return (1 - alpha) * base + alpha * tau * tau * kl
    return 0.5 * base + 0.5 * F.cross_entropy(dist.float(), teacher_logits.argmax(dim=-1))
