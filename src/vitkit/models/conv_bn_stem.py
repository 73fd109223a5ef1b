"""MobileCLIP's convolutional stem (Vasu et al., 2024; timm's ``ConvStem`` in ``vit_base_mci_224``).

``{"type": "conv_bn", "channels": [192, 192, 768], "kernels": [4, 2, 2]}``: patchify convolutions (kernel
= stride, no padding, so each output position sees its own block of pixels), BatchNorm + GELU after each
but the last, and the last (with a bias, no norm) makes the tokens itself: a hybrid with this backbone has
no projection after it (``patch_size`` 1, the last width the model's). timm's names:
``patch_embed.backbone.{i}.conv`` / ``.bn``. The feature map of a size is size // (kernels' product): pixels
past the last whole block are left out, as the convolutions without padding do.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn

from .bit import check_known_fields, int_list
from .layers import IntPair, to_2tuple

#: BatchNorm2d's eps in timm's ConvStem (PyTorch's default)
BN_EPS = 1e-5


class ConvBnAct(nn.Module):
    """Conv2d (kernel = stride), then BatchNorm + GELU unless it is the last layer (``conv``, ``bn``)."""

    def __init__(self, cin: int, cout: int, kernel: int, last: bool):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=kernel, bias=last)
        self.bn = None if last else nn.BatchNorm2d(cout, eps=BN_EPS)
        self.act = None if last else nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x if self.bn is None else self.act(self.bn(x))


class ConvBnStem(nn.Sequential):
    """The ``conv_bn`` backbone: patchify ConvBnAct layers; the last one's output is the tokens."""

    def __init__(self, channels: Sequence[int], kernels: Sequence[int], in_chans: int):
        chans = [in_chans, *channels]
        super().__init__(*(ConvBnAct(chans[i], chans[i + 1], k, i == len(kernels) - 1) for i, k in enumerate(kernels)))
        self.out_channels = chans[-1]


def normalize_spec(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"type": "conv_bn", "channels": [c1, ...], "kernels": [k1, ...]}`` checked (kernel = stride)."""
    check_known_fields(spec, "conv_bn backbone", ("type", "channels", "kernels"))
    channels, kernels = spec.get("channels"), spec.get("kernels")
    if not int_list(channels) or not channels or any(c < 1 for c in channels):
        raise ValueError(f"conv_bn backbone channels must be a non-empty list of positive integers, got {channels!r}")
    if not int_list(kernels) or len(kernels) != len(channels) or any(not 1 <= k <= 64 for k in kernels):
        raise ValueError(f"conv_bn backbone kernels must be integers from 1 to 64, one per layer ({len(channels)}), "
                         f"got {kernels!r}")
    return {"type": "conv_bn", "channels": [int(c) for c in channels], "kernels": [int(k) for k in kernels]}


def describe(spec: Mapping[str, Any]) -> str:
    return "conv_bn[" + ", ".join(f"{c}/{k}" for c, k in zip(spec["channels"], spec["kernels"])) + "]"


def strides(spec: Mapping[str, Any]) -> List[int]:
    return list(spec["kernels"])


def channels(spec: Mapping[str, Any]) -> int:
    return spec["channels"][-1]


def feature_size(spec: Mapping[str, Any], img_size: IntPair) -> IntPair:
    """No padding: every layer keeps the whole blocks (floor)."""
    h, w = to_2tuple(img_size)
    for k in spec["kernels"]:
        h, w = h // k, w // k
    return (h, w)


def macs(spec: Mapping[str, Any], img_size: IntPair, in_chans: int) -> int:
    h, w = to_2tuple(img_size)
    total, cin = 0, in_chans
    for c, k in zip(spec["channels"], spec["kernels"]):
        h, w = h // k, w // k
        total += h * w * c * cin * k * k
        cin = c
    return total


def infer_spec(sd: Mapping[str, Any], prefix: str) -> Optional[Dict[str, Any]]:
    """The backbone dict of a state dict with this stem under ``prefix`` (BatchNorm statistics after the first
    convolution tell it from the other kinds), or None."""
    if f"{prefix}0.bn.running_var" not in sd:
        return None
    convs = []
    while f"{prefix}{len(convs)}.conv.weight" in sd:
        convs.append(sd[f"{prefix}{len(convs)}.conv.weight"])
    return normalize_spec({"type": "conv_bn", "channels": [int(w.shape[0]) for w in convs],
                           "kernels": [int(w.shape[-1]) for w in convs]})


def in_chans_of(sd: Mapping[str, Any], prefix: str) -> Optional[int]:
    key = f"{prefix}0.conv.weight"
    return int(sd[key].shape[1]) if f"{prefix}0.bn.running_var" in sd and key in sd else None


def build(spec: Mapping[str, Any], in_chans: int) -> nn.Module:
    return ConvBnStem(spec["channels"], spec["kernels"], in_chans)


__all__ = ["BN_EPS", "ConvBnAct", "ConvBnStem"]
