"""Model EMA (DeiT; timm's ModelEmaV2): an exponential moving average of the weights.

After every optimiser step each floating-point entry of the state dict (parameters and
buffers) becomes ``ema = decay * ema + (1 - decay) * current``; integer buffers are copied.
The average lives in a frozen copy of the model, kept in eval mode, on the model's device.
"""

from __future__ import annotations

import copy
from typing import Any, Dict

import torch
from torch import nn


class ModelEma:
    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        current = model.state_dict()
        for name, ema_v in self.module.state_dict().items():
            v = current[name].detach()
            if ema_v.is_floating_point():
                ema_v.mul_(self.decay).add_(v.to(ema_v.dtype), alpha=1.0 - self.decay)
            else:
                ema_v.copy_(v)

    def state_dict(self) -> Dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.module.load_state_dict(state)
