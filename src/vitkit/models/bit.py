"""Big Transfer's ResNetV2 as the ViT paper's hybrid uses it (section 3.1): layers and specs.

Every convolution is weight-standardised and every batch norm is a GroupNorm with 32 groups.
Facts that decide parity with the official JAX code and timm (``vit_base_r50_s16_224`` and
friends):

- ``StdConv2dSame``: the kernel is standardised per output channel over (in, kh, kw) with the
  biased variance and eps 1e-8, then applied with TensorFlow "SAME" padding computed from the
  input size (asymmetric for even inputs and stride 2: the extra row/column goes bottom/right);
  no bias.
- GroupNorm(32, eps 1e-5) followed by ReLU, except after ``conv3`` and on the shortcut.
- stem: 7x7 stride-2 conv (64 channels), GroupNorm + ReLU, 3x3 stride-2 max pool with SAME
  padding (padded with -inf); output stride 4.
- *non*-pre-activation bottlenecks (the hybrid's, unlike BiT's classifiers):
  ``relu(norm3(conv3(relu(norm2(conv2(relu(norm1(conv1(x)))))))) + shortcut(x))`` with the
  stride on the 3x3 ``conv2`` and, on each stage's first block, a 1x1 strided StdConv +
  GroupNorm shortcut (``downsample``); stages of 256/512/1024/2048 channels (x width factor),
  bottleneck ratio 1/4, strides 1, 2, 2, 2.
- the paper's R50 hybrid keeps three stages with (3, 4, 9) blocks (output stride 16); the
  "stem only" hybrid (``vit_tiny_r_s16_p8``) has no stages at all.

Parameter names are timm's (``stem.conv``, ``stem.norm``, ``stages.{i}.blocks.{j}.{conv1,
norm1, ..., downsample.conv, downsample.norm}``). The backbone dict of this kind is
``{"type": "resnetv2", "layers": [3, 4, 9], "width_factor": 1}`` (see :mod:`.hybrid`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .layers import IntPair, to_2tuple

STAGE_CHANNELS = (256, 512, 1024, 2048)
STEM_CHANNELS = 64
BOTTLENECK_RATIO = 0.25
WS_EPS = 1e-8   # timm's hybrids and the official vit_jax ResNet
GN_GROUPS = 32
GN_EPS = 1e-5


def same_out(size: int, stride: int) -> int:
    """Output length of a SAME-padded convolution or pool: ceil(size / stride)."""
    return -(-size // stride)


# ----------------------------------------------------------------------------- layers


def _same_padding(size: int, kernel: int, stride: int) -> Tuple[int, int]:
    """TensorFlow SAME padding (before, after) along one axis for an input length."""
    total = max((same_out(size, stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: IntPair, stride: IntPair, value: float = 0.0) -> torch.Tensor:
    top, bottom = _same_padding(x.shape[-2], kernel[0], stride[0])
    left, right = _same_padding(x.shape[-1], kernel[1], stride[1])
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


class StdConv2dSame(nn.Conv2d):
    """Weight-standardised convolution with TensorFlow SAME padding, no bias.

    The kernel of each output channel is normalised to zero mean and unit (biased) variance
    over its inputs and taps before use: ``(w - mean) / sqrt(var + eps)``. SAME padding is
    a fixed symmetric ``(k - 1) / 2`` when the stride is 1 (odd kernels), else computed from
    the input size at every call.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 eps: float = WS_EPS):
        static = stride == 1 and kernel_size % 2 == 1
        super().__init__(in_channels, out_channels, kernel_size, stride=stride,
                         padding=(kernel_size - 1) // 2 if static else 0, bias=False)
        self.dynamic_pad = not static
        self.eps = eps

    def standardized_weight(self) -> torch.Tensor:
        var, mean = torch.var_mean(self.weight, dim=(1, 2, 3), unbiased=False, keepdim=True)
        return (self.weight - mean) * torch.rsqrt(var + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dynamic_pad:
            x = pad_same(x, self.kernel_size, self.stride)
        return F.conv2d(x, self.standardized_weight(), None, self.stride, self.padding)


class GroupNormAct(nn.GroupNorm):
    """GroupNorm (32 groups, eps 1e-5), then ReLU when ``act``; parameters ``weight``/``bias``."""

    def __init__(self, num_channels: int, act: bool = True, num_groups: int = GN_GROUPS,
                 eps: float = GN_EPS):
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: {num_channels} channels are not divisible into {num_groups} groups")
        super().__init__(num_groups, num_channels, eps=eps)
        self.act = bool(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        return F.relu(x, inplace=True) if self.act else x

    def extra_repr(self) -> str:
        return super().extra_repr() + (", relu" if self.act else "")


class MaxPool2dSame(nn.Module):
    """Max pool with TensorFlow SAME padding (the padding never wins: it is -inf)."""

    def __init__(self, kernel_size: int = 3, stride: int = 2):
        super().__init__()
        self.kernel_size, self.stride = to_2tuple(kernel_size), to_2tuple(stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size, self.stride, value=float("-inf"))
        return F.max_pool2d(x, self.kernel_size, self.stride)


class ResNetStem(nn.Module):
    """7x7/2 StdConv, GroupNorm + ReLU, 3x3/2 SAME max pool: (B, C, H, W) -> (B, 64w, H/4, W/4)."""

    def __init__(self, in_chans: int, out_chans: int = STEM_CHANNELS):
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chans, 7, stride=2)
        self.norm = GroupNormAct(out_chans)
        self.pool = MaxPool2dSame(3, 2)
        self.out_channels = out_chans

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.norm(self.conv(x)))


class ConvNormAct(nn.Module):
    """A weight-standardised convolution (SAME), then GroupNorm, then ReLU when ``act``."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int = 1, act: bool = True,
                 num_groups: int = GN_GROUPS):
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chans, kernel_size, stride=stride)
        self.norm = GroupNormAct(out_chans, act=act, num_groups=num_groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Downsample(ConvNormAct):
    """The projection shortcut: 1x1 strided StdConv + GroupNorm (no ReLU)."""

    def __init__(self, in_chans: int, out_chans: int, stride: int):
        super().__init__(in_chans, out_chans, 1, stride, act=False)


class Bottleneck(nn.Module):
    """Non-pre-activation bottleneck: 1x1, 3x3 (strided), 1x1, each normalised; add, ReLU."""

    def __init__(self, in_chans: int, out_chans: int, stride: int = 1, project: bool = False):
        super().__init__()
        mid = int(out_chans * BOTTLENECK_RATIO)
        self.downsample = Downsample(in_chans, out_chans, stride) if project else None
        self.conv1 = StdConv2dSame(in_chans, mid, 1)
        self.norm1 = GroupNormAct(mid)
        self.conv2 = StdConv2dSame(mid, mid, 3, stride=stride)
        self.norm2 = GroupNormAct(mid)
        self.conv3 = StdConv2dSame(mid, out_chans, 1)
        self.norm3 = GroupNormAct(out_chans, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.norm1(self.conv1(x))
        x = self.norm2(self.conv2(x))
        x = self.norm3(self.conv3(x))
        return F.relu(x + shortcut, inplace=True)


class ResNetStage(nn.Module):
    """``depth`` bottlenecks; the first one strides and projects the shortcut."""

    def __init__(self, in_chans: int, out_chans: int, depth: int, stride: int):
        super().__init__()
        self.blocks = nn.Sequential(*[
            Bottleneck(in_chans if j == 0 else out_chans, out_chans, stride if j == 0 else 1, project=j == 0)
            for j in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetV2Backbone(nn.Module):
    """Stem + stages of the hybrid (no final norm, no head): images -> feature map."""

    def __init__(self, layers: Sequence[int], in_chans: int = 3, width_factor: int = 1):
        super().__init__()
        self.stem = ResNetStem(in_chans, STEM_CHANNELS * width_factor)
        self.stages = nn.Sequential()
        prev = self.stem.out_channels
        for i, depth in enumerate(layers):
            out = STAGE_CHANNELS[i] * width_factor
            self.stages.add_module(str(i), ResNetStage(prev, out, depth, 1 if i == 0 else 2))
            prev = out
        self.out_channels = prev

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)


# ----------------------------------------------------------------------------- the backbone dict


def check_known_fields(spec: Mapping[str, Any], what: str, known: Sequence[str]) -> None:
    """A backbone dict names only its kind's fields: ValueError naming the others (``what``: whose)."""
    unknown = sorted(set(spec) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(unknown)}; known: {', '.join(known)}")


def int_list(value: Any) -> bool:
    """A list (or tuple) of ints, none of them a bool."""
    return isinstance(value, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in value)


def normalize_spec(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"type": "resnetv2", "layers": [n1, ...] (0 to 4 stages, each >= 1 block),
    "width_factor": int >= 1 (default 1)}`` checked, with every field spelled out."""
    check_known_fields(spec, "backbone", ("type", "layers", "width_factor"))
    layers = spec.get("layers")
    if not int_list(layers):
        raise ValueError(f"backbone layers must be a list of block counts such as [3, 4, 9], got {layers!r}")
    if len(layers) > len(STAGE_CHANNELS) or any(n < 1 for n in layers):
        raise ValueError(f"backbone layers {list(layers)}: at most {len(STAGE_CHANNELS)} stages "
                         f"of at least one block each ([] = the stem alone)")
    width = spec.get("width_factor", 1)
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"backbone width_factor must be an integer >= 1, got {width!r}")
    return {"type": "resnetv2", "layers": [int(n) for n in layers], "width_factor": int(width)}


def describe(spec: Mapping[str, Any]) -> str:
    return f"resnetv2{spec['layers']}"


def strides(spec: Mapping[str, Any]) -> List[int]:
    """Stem conv, pool, then every strided stage (SAME padding: each one ceils)."""
    return [2, 2] + [2] * max(len(spec["layers"]) - 1, 0)


def channels(spec: Mapping[str, Any]) -> int:
    """Channels of the output feature map."""
    layers = spec["layers"]
    return (STAGE_CHANNELS[len(layers) - 1] if layers else STEM_CHANNELS) * spec.get("width_factor", 1)


def macs(spec: Mapping[str, Any], img_size: IntPair, in_chans: int) -> int:
    """Multiply-accumulates of the convolutions for one image (norms, ReLU, pool, additions
    left out, as for the transformer)."""
    wf = spec.get("width_factor", 1)
    h, w = to_2tuple(img_size)
    stem = STEM_CHANNELS * wf
    h, w = same_out(h, 2), same_out(w, 2)
    total = h * w * stem * in_chans * 49
    h, w = same_out(h, 2), same_out(w, 2)  # max pool
    cin = stem
    for i, depth in enumerate(spec["layers"]):
        out = STAGE_CHANNELS[i] * wf
        mid = int(out * BOTTLENECK_RATIO)
        stride = 1 if i == 0 else 2
        for j in range(depth):
            ho, wo = (same_out(h, stride), same_out(w, stride)) if j == 0 else (h, w)
            if j == 0:
                total += ho * wo * out * cin                 # shortcut 1x1 projection
            total += h * w * mid * cin                       # conv1 1x1 (at the input size)
            total += ho * wo * mid * mid * 9                 # conv2 3x3 (strided)
            total += ho * wo * out * mid                     # conv3 1x1
            h, w, cin = ho, wo, out
    return total


def build(spec: Mapping[str, Any], in_chans: int) -> nn.Module:
    """The backbone; with no stages it is the stem itself (as timm's ``vit_tiny_r_s16_p8``, whose
    parameters are ``backbone.conv`` / ``backbone.norm``)."""
    wf = spec["width_factor"]
    if not spec["layers"]:
        return ResNetStem(in_chans, STEM_CHANNELS * wf)
    return ResNetV2Backbone(spec["layers"], in_chans, wf)


def infer_spec(sd: Mapping[str, Any], prefix: str) -> Optional[Dict[str, Any]]:
    """The backbone dict of a state dict whose backbone parameters start with ``prefix``, or None."""
    if f"{prefix}stem.conv.weight" in sd:
        stem = sd[f"{prefix}stem.conv.weight"]
        blocks: Dict[int, int] = {}
        for k in sd:
            if k.startswith(f"{prefix}stages."):
                parts = k[len(prefix):].split(".")
                if len(parts) > 3 and parts[2] == "blocks":
                    s, b = int(parts[1]), int(parts[3])
                    blocks[s] = max(blocks.get(s, 0), b + 1)
        if sorted(blocks) != list(range(len(blocks))):
            raise ValueError(f"backbone stages {sorted(blocks)} are not numbered 0..n-1")
        layers = [blocks[i] for i in range(len(blocks))]
    elif f"{prefix}conv.weight" in sd:
        stem = sd[f"{prefix}conv.weight"]
        layers = []
    else:
        return None
    out_ch = int(stem.shape[0])
    if out_ch % STEM_CHANNELS:
        raise ValueError(f"backbone stem has {out_ch} channels, not a multiple of {STEM_CHANNELS}")
    return normalize_spec({"type": "resnetv2", "layers": layers, "width_factor": out_ch // STEM_CHANNELS})


def in_chans_of(sd: Mapping[str, Any], prefix: str) -> Optional[int]:
    """Input channels of a state dict's backbone (its first convolution), or None."""
    for key in (f"{prefix}stem.conv.weight", f"{prefix}conv.weight"):
        if key in sd:
            return int(sd[key].shape[1])
    return None


__all__ = ["STAGE_CHANNELS", "STEM_CHANNELS", "BOTTLENECK_RATIO", "WS_EPS", "GN_GROUPS", "GN_EPS", "same_out",
           "pad_same", "StdConv2dSame", "GroupNormAct", "MaxPool2dSame", "ResNetStem", "ConvNormAct",
           "Downsample", "Bottleneck", "ResNetStage", "ResNetV2Backbone"]
