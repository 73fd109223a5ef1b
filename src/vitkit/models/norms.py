"""Normalisations and activations, by kind: what a family's ``norm`` and ``gelu`` fields name, bound
once into the factories that blocks, heads and poolings are given."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

#: width -> a normalisation layer of that width (a family's norm kind and eps, bound once)
NormFactory = Callable[[int], nn.Module]

#: normalisation kinds (``TokenConfig.norm``): LayerNorm, or RMSNorm (no centring, no bias: AIMv2, Sapiens)
NORMS = ("layernorm", "rmsnorm")
#: the MLP activation (``gelu`` field): exact GELU (timm, HF), its tanh approximation (the official JAX
#: code, SigLIP), or CLIP's QuickGELU x * sigmoid(1.702 x) (OpenAI's CLIP weights were trained with it)
GELUS = ("exact", "tanh", "quick")


class RmsNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension; ``weight`` as timm's RmsNorm names it.
    ``affine=False``: no weight (DeepSeek's norm after pooling, timm's ``RmsNormFp32(affine=False)``)."""

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True):
        super().__init__()
        self.dim, self.eps = int(dim), float(eps)
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is not None and x.dtype != self.weight.dtype:  # (autocast's bf16 tokens: normalised in the
            # weight's float32, as autocast normalises a LayerNorm's; torch's mixed-dtype fallback said so each run)
            return F.rms_norm(x.to(self.weight.dtype), (self.dim,), self.weight, self.eps).to(x.dtype)
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}" + ("" if self.weight is not None else ", affine=False")


def norm_factory(kind: str = "layernorm", eps: float = 1e-6) -> NormFactory:
    """The family's normalisation as a factory of widths (what blocks, heads and poolings are given)."""
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
    if kind == "rmsnorm":
        return lambda dim: RmsNorm(dim, eps)
    return lambda dim: nn.LayerNorm(dim, eps=eps)


class QuickGELU(nn.Module):
    """CLIP's GELU approximation x * sigmoid(1.702 x) (OpenAI's weights need it; open_clip's ``QuickGELU``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def gelu_layer(kind: str) -> nn.Module:
    """The MLP activation of a ``gelu`` kind (see :data:`GELUS`)."""
    if kind not in GELUS:
        raise ValueError(f"gelu must be one of {GELUS}, got {kind!r}")
    return QuickGELU() if kind == "quick" else nn.GELU(approximate="none" if kind == "exact" else "tanh")
