"""A small stack of 3x3 convolutions in front of a ViT, for images far smaller than ImageNet's.

``{"type": "conv", "channels": [32, 64, 64, 96, 96], "strides": [1, 2, 1, 2, 1]}`` (the default
model's): each layer is a 3x3 weight-standardised convolution (SAME padding) followed by
GroupNorm(8) + ReLU -- the "early convolutions" that Xiao et al. (2021) put in front of a
ViT. On 28x28 Fashion-MNIST it gives 7x7 tokens like patch 4 and learns faster per epoch
(see the README's training section).
GroupNorm rather than BatchNorm keeps each image's output independent of its batch, so DDP
runs of any process count still follow one trajectory. It is vitkit's own: native and
timm-named state dicts carry it (``patch_embed.backbone.{i}.conv`` / ``.norm``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from torch import nn

from .bit import ConvNormAct, check_known_fields, int_list, same_out
from .layers import IntPair, to_2tuple

#: GroupNorm groups of the small ``conv`` backbone (channels must be multiples of it).
CONV_GN_GROUPS = 8


class ConvBackbone(nn.Sequential):
    """The ``conv`` backbone: 3x3 ConvNormAct layers with GroupNorm(8) + ReLU (``backbone.{i}.conv`` / ``.norm``)."""

    def __init__(self, channels: Sequence[int], strides: Sequence[int], in_chans: int):
        chans = [in_chans, *channels]
        super().__init__(*(ConvNormAct(chans[i], chans[i + 1], 3, t, num_groups=CONV_GN_GROUPS)
                           for i, t in enumerate(strides)))
        self.out_channels = chans[-1]


def normalize_spec(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"type": "conv", "channels": [c1, ...] (multiples of 8), "strides": [1 or 2, ...]}`` checked."""
    check_known_fields(spec, "conv backbone", ("type", "channels", "strides"))
    channels, strides = spec.get("channels"), spec.get("strides")
    if not int_list(channels) or not channels or any(c < 1 or c % CONV_GN_GROUPS for c in channels):
        raise ValueError(f"conv backbone channels must be a non-empty list of multiples of {CONV_GN_GROUPS}, "
                         f"got {channels!r}")
    if not int_list(strides) or len(strides) != len(channels) or any(t not in (1, 2) for t in strides):
        raise ValueError(f"conv backbone strides must be 1 or 2, one per layer ({len(channels)}), got {strides!r}")
    return {"type": "conv", "channels": [int(c) for c in channels], "strides": [int(t) for t in strides]}


def describe(spec: Mapping[str, Any]) -> str:
    return "conv[" + ", ".join(f"{c}/{t}" for c, t in zip(spec["channels"], spec["strides"])) + "]"


def strides(spec: Mapping[str, Any]) -> List[int]:
    return list(spec["strides"])


def channels(spec: Mapping[str, Any]) -> int:
    return spec["channels"][-1]


def macs(spec: Mapping[str, Any], img_size: IntPair, in_chans: int) -> int:
    h, w = to_2tuple(img_size)
    total, cin = 0, in_chans
    for c, t in zip(spec["channels"], spec["strides"]):
        h, w = same_out(h, t), same_out(w, t)
        total += h * w * c * cin * 9
        cin = c
    return total


def build(spec: Mapping[str, Any], in_chans: int) -> nn.Module:
    return ConvBackbone(spec["channels"], spec["strides"], in_chans)


__all__ = ["CONV_GN_GROUPS", "ConvBackbone"]
