"""Shared test helpers: random weights that exercise every mapping."""

import pytest
import torch
from torch import nn


@torch.no_grad()
def randomize(model: nn.Module, seed: int = 0, scale: float = 0.1) -> nn.Module:
    """Fill every parameter with noise (LayerNorm weights around 1) so no mapping is trivial."""
    g = torch.Generator().manual_seed(seed)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            noise = torch.randn(p.shape, generator=g) * scale
            if isinstance(module, nn.LayerNorm) and name == "weight":
                noise += 1.0
            p.copy_(noise)
    return model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture
def images():
    def make(batch=2, h=224, w=224, c=3, seed=1):
        return torch.randn(batch, c, h, w, generator=torch.Generator().manual_seed(seed))
    return make
