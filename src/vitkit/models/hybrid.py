"""The BiT ResNetV2 of the ViT paper's hybrid (section 3.1), and that CNN as a classifier.

"As an alternative to raw image patches, the input sequence can be formed from feature maps
of a CNN": the hybrid runs a ResNet first and embeds its feature map with a patch size of 1
(or larger). The ResNet is Big Transfer's (BiT) variant: every convolution is
weight-standardised, every batch norm is a GroupNorm with 32 groups. Facts that decide
parity with the official JAX code and timm (``vit_base_r50_s16_224`` and friends):

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
norm1, ..., downsample.conv, downsample.norm}``), so a hybrid's state dict is timm's with no
renaming. A backbone is described by a JSON-able dict (``ViTConfig.backbone``):
``{"type": "resnetv2", "layers": [3, 4, 9], "width_factor": 1}``.

A second, small kind serves images far smaller than ImageNet's (``{"type": "conv",
"channels": [32, 64, 96], "strides": [1, 2, 2]}``): a stack of 3x3 weight-standardised
convolutions, each followed by GroupNorm + ReLU, the "early convolutions" that Xiao et al.
(2021) put in front of a ViT. On 28x28 Fashion-MNIST it gives 7x7 tokens like patch 4 and
learns faster per epoch (see the README's training section). GroupNorm rather than
BatchNorm keeps each image's output independent of its batch, so DDP runs of any process
count still follow one trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .config_base import ConfigMixin
from .layers import IntPair, PatchEmbed, lecun_normal_, to_2tuple
from .serialize import SaveMixin

BACKBONE_TYPES = ("resnetv2", "conv")
#: GroupNorm groups of the small ``conv`` backbone (channels must be multiples of it).
CONV_GN_GROUPS = 8
STAGE_CHANNELS = (256, 512, 1024, 2048)
STEM_CHANNELS = 64
BOTTLENECK_RATIO = 0.25
WS_EPS = 1e-8   # timm's hybrids and the official vit_jax ResNet
GN_GROUPS = 32
GN_EPS = 1e-5


# ----------------------------------------------------------------------------- backbone specs


def _int_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in value)


def normalize_backbone(spec: Any) -> Dict[str, Any]:
    """Check a backbone description and return it with every field spelled out.

    Raises ``ValueError`` naming what is wrong. Accepted: ``{"type": "resnetv2", "layers":
    [n1, ...] (0 to 4 stages, each >= 1 block), "width_factor": int >= 1 (default 1)}`` and
    ``{"type": "conv", "channels": [c1, ...] (multiples of 8), "strides": [1 or 2, ...]}``.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"backbone must be a dict such as {{'type': 'resnetv2', 'layers': [3, 4, 9]}}, "
                         f"got {type(spec).__name__}")
    kind = spec.get("type", "resnetv2")
    if kind not in BACKBONE_TYPES:
        raise ValueError(f"backbone type must be one of {BACKBONE_TYPES}, got {kind!r}")
    if kind == "conv":
        return _normalize_conv(spec)
    unknown = sorted(set(spec) - {"type", "layers", "width_factor"})
    if unknown:
        raise ValueError(f"backbone: unknown field(s) {', '.join(unknown)}; known: type, layers, width_factor")
    layers = spec.get("layers")
    if not _int_list(layers):
        raise ValueError(f"backbone layers must be a list of block counts such as [3, 4, 9], got {layers!r}")
    if len(layers) > len(STAGE_CHANNELS) or any(n < 1 for n in layers):
        raise ValueError(f"backbone layers {list(layers)}: at most {len(STAGE_CHANNELS)} stages "
                         f"of at least one block each ([] = the stem alone)")
    width = spec.get("width_factor", 1)
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"backbone width_factor must be an integer >= 1, got {width!r}")
    return {"type": kind, "layers": [int(n) for n in layers], "width_factor": int(width)}


def _normalize_conv(spec: Mapping[str, Any]) -> Dict[str, Any]:
    unknown = sorted(set(spec) - {"type", "channels", "strides"})
    if unknown:
        raise ValueError(f"conv backbone: unknown field(s) {', '.join(unknown)}; known: type, channels, strides")
    channels, strides = spec.get("channels"), spec.get("strides")
    if not _int_list(channels) or not channels or any(c < 1 or c % CONV_GN_GROUPS for c in channels):
        raise ValueError(f"conv backbone channels must be a non-empty list of multiples of {CONV_GN_GROUPS}, "
                         f"got {channels!r}")
    if not _int_list(strides) or len(strides) != len(channels) or any(t not in (1, 2) for t in strides):
        raise ValueError(f"conv backbone strides must be 1 or 2, one per layer ({len(channels)}), got {strides!r}")
    return {"type": "conv", "channels": [int(c) for c in channels], "strides": [int(t) for t in strides]}


def describe_backbone(spec: Mapping[str, Any]) -> str:
    """A short name for reprs and tables: ``resnetv2[3, 4, 9]``, ``conv[32/1, 64/2, 96/2]``."""
    if spec["type"] == "conv":
        return "conv[" + ", ".join(f"{c}/{t}" for c, t in zip(spec["channels"], spec["strides"])) + "]"
    return f"{spec['type']}{spec['layers']}"


def _strides(spec: Mapping[str, Any]) -> List[int]:
    """The stride of every down-sampling layer, in order (SAME padding: each one ceils)."""
    if spec["type"] == "conv":
        return list(spec["strides"])
    return [2, 2] + [2] * max(len(spec["layers"]) - 1, 0)  # stem conv, pool, strided stages


def backbone_reduction(spec: Mapping[str, Any]) -> int:
    """Output stride of a backbone (ResNetV2: 4 after the stem, x2 for every later stage)."""
    r = 1
    for t in _strides(spec):
        r *= t
    return r


def backbone_channels(spec: Mapping[str, Any]) -> int:
    """Channels of the backbone's output feature map."""
    if spec["type"] == "conv":
        return spec["channels"][-1]
    wf = spec.get("width_factor", 1)
    layers = spec["layers"]
    return (STAGE_CHANNELS[len(layers) - 1] if layers else STEM_CHANNELS) * wf


def same_out(size: int, stride: int) -> int:
    """Output length of a SAME-padded convolution or pool: ceil(size / stride)."""
    return -(-size // stride)


def backbone_feature_size(spec: Mapping[str, Any], img_size: IntPair) -> IntPair:
    """Spatial size of the backbone's feature map for an input size (SAME padding: ceil)."""
    h, w = to_2tuple(img_size)
    for t in _strides(spec):
        h, w = same_out(h, t), same_out(w, t)
    return (h, w)


def backbone_macs(spec: Mapping[str, Any], img_size: IntPair, in_chans: int) -> int:
    """Multiply-accumulates of the backbone's convolutions for one image (norms, ReLU, pool,
    additions left out, as for the transformer)."""
    if spec["type"] == "conv":
        h, w = to_2tuple(img_size)
        macs, cin = 0, in_chans
        for c, t in zip(spec["channels"], spec["strides"]):
            h, w = same_out(h, t), same_out(w, t)
            macs += h * w * c * cin * 9
            cin = c
        return macs
    wf = spec.get("width_factor", 1)
    h, w = to_2tuple(img_size)
    stem = STEM_CHANNELS * wf
    h, w = same_out(h, 2), same_out(w, 2)
    macs = h * w * stem * in_chans * 49
    h, w = same_out(h, 2), same_out(w, 2)  # max pool
    cin = stem
    for i, depth in enumerate(spec["layers"]):
        out = STAGE_CHANNELS[i] * wf
        mid = int(out * BOTTLENECK_RATIO)
        stride = 1 if i == 0 else 2
        for j in range(depth):
            ho, wo = (same_out(h, stride), same_out(w, stride)) if j == 0 else (h, w)
            if j == 0:
                macs += ho * wo * out * cin                 # shortcut 1x1 projection
            macs += h * w * mid * cin                       # conv1 1x1 (at the input size)
            macs += ho * wo * mid * mid * 9                 # conv2 3x3 (strided)
            macs += ho * wo * out * mid                     # conv3 1x1
            h, w, cin = ho, wo, out
    return macs


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


class Downsample(nn.Module):
    """The projection shortcut: 1x1 strided StdConv + GroupNorm (no ReLU)."""

    def __init__(self, in_chans: int, out_chans: int, stride: int):
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chans, 1, stride=stride)
        self.norm = GroupNormAct(out_chans, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


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


class ConvNormAct(nn.Module):
    """3x3 weight-standardised convolution (SAME), GroupNorm(8) + ReLU."""

    def __init__(self, in_chans: int, out_chans: int, stride: int):
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chans, 3, stride=stride)
        self.norm = GroupNormAct(out_chans, num_groups=CONV_GN_GROUPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class ConvBackbone(nn.Sequential):
    """The ``conv`` backbone: ConvNormAct layers (``backbone.{i}.conv`` / ``.norm``)."""

    def __init__(self, channels: Sequence[int], strides: Sequence[int], in_chans: int):
        chans = [in_chans, *channels]
        super().__init__(*(ConvNormAct(chans[i], chans[i + 1], t) for i, t in enumerate(strides)))
        self.out_channels = chans[-1]


@torch.no_grad()
def init_backbone_(module: nn.Module) -> None:
    """The official (Flax) defaults: LeCun-normal kernels, GroupNorm scale 1 and bias 0."""
    for m in module.modules():
        if isinstance(m, StdConv2dSame):
            lecun_normal_(m.weight)
        elif isinstance(m, nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def build_backbone(spec: Mapping[str, Any], in_chans: int) -> nn.Module:
    """The module a backbone dict describes; with no stages it is the stem itself (as timm's
    ``vit_tiny_r_s16_p8``, whose parameters are ``backbone.conv`` / ``backbone.norm``)."""
    spec = normalize_backbone(spec)
    if spec["type"] == "conv":
        return ConvBackbone(spec["channels"], spec["strides"], in_chans)
    wf = spec["width_factor"]
    if not spec["layers"]:
        return ResNetStem(in_chans, STEM_CHANNELS * wf)
    return ResNetV2Backbone(spec["layers"], in_chans, wf)


# ----------------------------------------------------------------------------- hybrid embedding


class HybridEmbed(nn.Module):
    """Images -> CNN feature map -> patch tokens (B, gh, gw, D): the hybrid's input embedding.

    ``proj`` is a convolution with kernel = stride = ``proj_patch_size`` on the feature map
    (1 for the paper's hybrids: every feature-map position is a token). ``patch_size`` is
    the pixel footprint of one token (backbone stride x projection patch), so grid sizes and
    pixel distances read the same as for a plain ViT; the grid of an input size follows the
    backbone's SAME padding (ceil at every stride-2 layer).
    """

    def __init__(self, img_size: IntPair, patch_size: IntPair, in_chans: int, embed_dim: int,
                 backbone: Mapping[str, Any], bias: bool = True):
        super().__init__()
        self.spec = normalize_backbone(backbone)
        self.backbone = build_backbone(self.spec, in_chans)
        self.feature_dim = backbone_channels(self.spec)
        self.reduction = backbone_reduction(self.spec)
        self.proj_patch_size = to_2tuple(patch_size)
        self.patch_size = (self.reduction * self.proj_patch_size[0], self.reduction * self.proj_patch_size[1])
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.img_size = to_2tuple(img_size)
        self.grid_size = self.grid_for(self.img_size)
        self.proj = nn.Conv2d(self.feature_dim, embed_dim, self.proj_patch_size,
                              stride=self.proj_patch_size, bias=bias)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    def grid_for(self, img_size: IntPair) -> IntPair:
        fh, fw = backbone_feature_size(self.spec, img_size)
        ph, pw = self.proj_patch_size
        if fh % ph or fw % pw:
            raise ValueError(
                f"image size {img_size[0]}x{img_size[1]} gives a {fh}x{fw} backbone feature map, "
                f"not divisible by the projection patch {ph}x{pw}; use a multiple of "
                f"{self.patch_size[0]}x{self.patch_size[1]} pixels")
        return (fh // ph, fw // pw)

    def set_img_size(self, img_size: Union[int, IntPair]) -> None:
        self.img_size = to_2tuple(img_size)
        self.grid_size = self.grid_for(self.img_size)

    # the same input checks as a plain patch embedding (its grid_for is this class's)
    check_images = PatchEmbed.check_images

    def forward(self, x: torch.Tensor, strict: bool = True) -> torch.Tensor:
        self.check_images(x, strict)
        x = self.proj(self.backbone(x))
        return x.permute(0, 2, 3, 1)

    def extra_repr(self) -> str:
        return (f"backbone={describe_backbone(self.spec)}, reduction={self.reduction}, "
                f"proj_patch={self.proj_patch_size}")


def infer_backbone(sd: Mapping[str, Any], prefix: str = "patch_embed.backbone.") -> Optional[Dict[str, Any]]:
    """The backbone dict of a state dict in timm/vitkit names, or None when it has none."""
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
    return normalize_backbone({"type": "resnetv2", "layers": layers, "width_factor": out_ch // STEM_CHANNELS})


def backbone_in_chans(sd: Mapping[str, Any], prefix: str = "patch_embed.backbone.") -> Optional[int]:
    for key in (f"{prefix}stem.conv.weight", f"{prefix}conv.weight"):
        if key in sd:
            return int(sd[key].shape[1])
    return None


# ----------------------------------------------------------------------------- the CNN alone


@dataclass
class ResNetV2Config(ConfigMixin):
    KIND = "ResNetV2"

    """A ResNetV2 classifier: the hybrid's (non-pre-activation) backbone, average pool, linear head.

    Not BiT's pre-activation classifier and not timm's ``resnetv2_50`` (pre-activation with
    BatchNorm): its state dict equals timm's ``ResNetV2(preact=False, stem_type='same',
    conv_layer=StdConv2dSame(eps=1e-8))``, which timm registers under no name.
    """

    layers: Tuple[int, ...] = (3, 4, 6, 3)
    width_factor: int = 1
    in_chans: int = 3
    num_classes: int = 1000
    img_size: Tuple[int, int] = (224, 224)
    mean: Tuple[float, ...] = (0.5, 0.5, 0.5)
    std: Tuple[float, ...] = (0.5, 0.5, 0.5)
    crop_pct: float = 0.9
    interpolation: str = "bicubic"
    label_names: Optional[List[str]] = None
    architecture: str = "resnetv2"
    name: Optional[str] = None

    def __post_init__(self) -> None:
        self.layers = tuple(int(n) for n in self.layers)
        self.img_size = to_2tuple(self.img_size)
        self.validate()

    def validate(self) -> None:
        problems = []
        try:
            normalize_backbone({"type": "resnetv2", "layers": list(self.layers), "width_factor": self.width_factor})
        except ValueError as e:
            problems.append(str(e))
        if not self.layers:
            problems.append("a ResNetV2 classifier needs at least one stage")
        if self.num_classes < 0 or self.in_chans <= 0 or min(self.img_size) <= 0:
            problems.append("num_classes must be >= 0, in_chans and img_size > 0")
        problems += self._io_problems()
        if problems:
            raise ValueError("invalid ResNetV2 config: " + "; ".join(problems))

    @property
    def backbone(self) -> Dict[str, Any]:
        return {"type": "resnetv2", "layers": list(self.layers), "width_factor": self.width_factor}


class ClassifierHead(nn.Module):
    """Global average pool, then a linear map stored as a 1x1 convolution (``head.fc``), as
    timm's ResNetV2 stores it, so state dicts match without reshaping."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.fc = nn.Conv2d(in_features, num_classes, 1) if num_classes > 0 else None

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x.mean(dim=(2, 3), keepdim=True)
        if pre_logits or self.fc is None:
            return x.flatten(1)
        return self.fc(x).flatten(1)


class ResNetV2(SaveMixin, ResNetV2Backbone):
    """The hybrid's CNN as an image classifier (the CNN side of the paper's comparisons).

    Structure: :class:`ResNetV2Backbone` (non-pre-activation bottlenecks, GroupNorm, weight
    standardisation, SAME padding), global average pooling, a linear head. BiT's published
    classifiers are pre-activation ResNets; this is not one of them. It equals timm's
    ``ResNetV2(layers, preact=False, stem_type='same', conv_layer=partial(StdConv2dSame,
    eps=1e-8))`` parameter for parameter (tested), not timm's ``resnetv2_50``.
    """

    def __init__(self, config: Optional[ResNetV2Config] = None, **overrides: Any):
        cfg = (config or ResNetV2Config()).replace(**overrides) if overrides else (config or ResNetV2Config())
        super().__init__(cfg.layers, cfg.in_chans, cfg.width_factor)
        self.config = cfg
        self.num_classes = cfg.num_classes
        self.num_features = self.out_channels
        self.grad_checkpointing = False
        self.head = ClassifierHead(self.num_features, cfg.num_classes)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Flax defaults for the CNN (LeCun normal, GroupNorm 1/0); a zero head (BiT's)."""
        init_backbone_(self)
        if self.head.fc is not None:
            nn.init.zeros_(self.head.fc.weight)
            nn.init.zeros_(self.head.fc.bias)

    def no_weight_decay(self) -> set:
        return set()

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = bool(enable)

    def reset_classifier(self, num_classes: int) -> None:
        """A zero-initialised head for ``num_classes`` (0: the model returns pooled features)."""
        device = self.stem.conv.weight.device
        self.head = ClassifierHead(self.num_features, num_classes).to(device)
        if self.head.fc is not None:
            nn.init.zeros_(self.head.fc.weight)
            nn.init.zeros_(self.head.fc.bias)
        self.num_classes = num_classes
        self.config = self.config.replace(num_classes=num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> the last stage's feature map (B, C, H/32, W/32 for four stages)."""
        if x.dim() != 4 or x.shape[1] != self.config.in_chans:
            raise ValueError(f"expected images of shape (B, {self.config.in_chans}, H, W), got {tuple(x.shape)}")
        x = self.stem(x)
        if self.grad_checkpointing and self.training:
            from torch.utils.checkpoint import checkpoint

            for stage in self.stages:
                x = checkpoint(stage, x, use_reentrant=False)
            return x
        return self.stages(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def resnet_complexity_macs(config: ResNetV2Config) -> Tuple[int, int]:
    """(backbone MACs, head MACs) of a ResNetV2 classifier for one image."""
    return (backbone_macs(config.backbone, config.img_size, config.in_chans),
            backbone_channels(config.backbone) * config.num_classes)


def infer_resnet_config(sd: Mapping[str, Any], **overrides: Any) -> ResNetV2Config:
    """A ResNetV2 classifier's config from a timm/vitkit-named state dict alone."""
    if "norm.weight" in sd or "stem.norm.weight" not in sd:
        raise ValueError("this is a pre-activation ResNetV2 (BiT / timm resnetv2_*: a final 'norm', no "
                         "'stem.norm'); vitkit implements the non-pre-activation ResNetV2 of the ViT hybrid")
    if any(k.endswith("running_mean") for k in sd):
        raise ValueError("this ResNet uses BatchNorm; vitkit's ResNetV2 uses GroupNorm + weight standardisation")
    spec = infer_backbone(sd, prefix="")
    kw: Dict[str, Any] = dict(layers=tuple(spec["layers"]), width_factor=spec["width_factor"],
                              in_chans=int(sd["stem.conv.weight"].shape[1]),
                              num_classes=int(sd["head.fc.weight"].shape[0]) if "head.fc.weight" in sd else 0)
    kw.update(overrides)
    return ResNetV2Config(**kw)


__all__ = ["BACKBONE_TYPES", "normalize_backbone", "describe_backbone", "ConvNormAct", "ConvBackbone",
           "backbone_reduction", "backbone_channels",
           "backbone_feature_size", "backbone_macs", "StdConv2dSame", "GroupNormAct", "MaxPool2dSame",
           "ResNetStem", "Bottleneck", "ResNetStage", "ResNetV2Backbone", "build_backbone", "init_backbone_",
           "HybridEmbed", "infer_backbone", "backbone_in_chans", "ResNetV2Config", "ResNetV2",
           "infer_resnet_config"]
