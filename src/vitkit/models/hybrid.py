"""The paper's hybrid input (section 3.1): a CNN's feature map embedded as the token sequence.

"As an alternative to raw image patches, the input sequence can be formed from feature maps
of a CNN": the hybrid runs a CNN first and embeds its feature map with a patch size of 1 (or
larger). The CNN is one JSON-able dict, ``ViTConfig.backbone``, so ``config.json`` rebuilds
it. Its kinds, one row each in ``BACKBONES``:

- ``{"type": "resnetv2", "layers": [3, 4, 9], "width_factor": 1}``: Big Transfer's ResNetV2
  as the official hybrids use it (:mod:`.bit`);
- ``{"type": "conv", "channels": [32, 64, 64, 96, 96], "strides": [1, 2, 1, 2, 1]}``: a small stack of 3x3
  convolutions for small images (:mod:`.conv_stem`), used by ``vit_fmnist_hybrid``;
- ``{"type": "conv_bn", "channels": [192, 192, 768], "kernels": [4, 2, 2]}``: MobileCLIP's patchify
  convolutions with BatchNorm (:mod:`.conv_bn_stem`), whose last layer makes the tokens (no projection).

Every down-sampling layer of the first two kinds pads as TensorFlow's SAME does, so the feature map of an
input is ceil(size / stride) at every stride-2 layer; ``conv_bn``'s do not pad (floor). The CNN's
parameters are timm's names under ``patch_embed.backbone.``, so a hybrid's state dict is timm's with no
renaming.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
from torch import nn

from . import bit, conv_bn_stem, conv_stem
from .bit import (  # noqa: F401 (public names)
    BOTTLENECK_RATIO,
    GN_EPS,
    GN_GROUPS,
    STAGE_CHANNELS,
    STEM_CHANNELS,
    WS_EPS,
    Bottleneck,
    ConvNormAct,
    Downsample,
    GroupNormAct,
    MaxPool2dSame,
    ResNetStage,
    ResNetStem,
    ResNetV2Backbone,
    StdConv2dSame,
    pad_same,
    same_out,
)
from .conv_stem import CONV_GN_GROUPS, ConvBackbone  # noqa: F401 (public names)
from .layers import IntPair, PatchGrid, lecun_normal_, to_2tuple


@dataclass(frozen=True)
class BackboneKind:
    """The functions of one backbone kind (each takes the normalised dict)."""

    normalize: Callable[[Mapping[str, Any]], Dict[str, Any]]
    describe: Callable[[Mapping[str, Any]], str]
    #: the stride of every down-sampling layer, in order
    strides: Callable[[Mapping[str, Any]], List[int]]
    #: channels of the output feature map
    channels: Callable[[Mapping[str, Any]], int]
    macs: Callable[[Mapping[str, Any], IntPair, int], int]
    build: Callable[[Mapping[str, Any], int], nn.Module]
    #: the feature map of an input size (None: SAME padding, ceil at every down-sampling layer)
    feature_size: Optional[Callable[[Mapping[str, Any], IntPair], IntPair]] = None
    #: the backbone's last layer makes the tokens: the hybrid has no projection after it
    embeds: bool = False


BACKBONES: Dict[str, BackboneKind] = {
    "resnetv2": BackboneKind(bit.normalize_spec, bit.describe, bit.strides, bit.channels, bit.macs, bit.build),
    "conv": BackboneKind(conv_stem.normalize_spec, conv_stem.describe, conv_stem.strides, conv_stem.channels,
                         conv_stem.macs, conv_stem.build),
    "conv_bn": BackboneKind(conv_bn_stem.normalize_spec, conv_bn_stem.describe, conv_bn_stem.strides,
                            conv_bn_stem.channels, conv_bn_stem.macs, conv_bn_stem.build,
                            feature_size=conv_bn_stem.feature_size, embeds=True),
}
BACKBONE_TYPES = tuple(BACKBONES)


def normalize_backbone(spec: Any) -> Dict[str, Any]:
    """Check a backbone description and return it with every field spelled out; raises
    ``ValueError`` naming what is wrong (see each kind's module for its fields)."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"backbone must be a dict such as {{'type': 'resnetv2', 'layers': [3, 4, 9]}}, "
                         f"got {type(spec).__name__}")
    kind = spec.get("type", "resnetv2")
    if kind not in BACKBONES:
        raise ValueError(f"backbone type must be one of {BACKBONE_TYPES}, got {kind!r}")
    return BACKBONES[kind].normalize(spec)


def _kind(spec: Mapping[str, Any]) -> BackboneKind:
    return BACKBONES[spec["type"]]


def describe_backbone(spec: Mapping[str, Any]) -> str:
    """A short name for reprs and tables: ``resnetv2[3, 4, 9]``, ``conv[32/1, 64/2, 96/2]``."""
    return _kind(spec).describe(spec)


def backbone_reduction(spec: Mapping[str, Any]) -> int:
    """Output stride of a backbone (ResNetV2: 4 after the stem, x2 for every later stage)."""
    r = 1
    for t in _kind(spec).strides(spec):
        r *= t
    return r


def backbone_channels(spec: Mapping[str, Any]) -> int:
    """Channels of the backbone's output feature map."""
    return _kind(spec).channels(spec)


def backbone_embeds(spec: Mapping[str, Any]) -> bool:
    """Whether the backbone's last layer makes the tokens (no projection after it: MobileCLIP's stem)."""
    return _kind(spec).embeds


def embedding_problem(spec: Mapping[str, Any], embed_dim: int, patch_size: IntPair) -> Optional[str]:
    """What is wrong with a backbone that makes the tokens itself for a model of ``embed_dim`` and
    ``patch_size`` (its last width must be the model's, the patch 1), or None."""
    width = backbone_channels(spec)
    if not backbone_embeds(spec) or (width == embed_dim and tuple(patch_size) == (1, 1)):
        return None
    return (f"a {spec['type']} backbone makes the tokens itself: its last width {width} must be embed_dim "
            f"({embed_dim}) and patch_size 1, got {tuple(patch_size)}")


def backbone_feature_size(spec: Mapping[str, Any], img_size: IntPair) -> IntPair:
    """Spatial size of the backbone's feature map for an input size (SAME padding: ceil; ``conv_bn``: floor)."""
    kind = _kind(spec)
    if kind.feature_size is not None:
        return kind.feature_size(spec, img_size)
    h, w = to_2tuple(img_size)
    for t in kind.strides(spec):
        h, w = same_out(h, t), same_out(w, t)
    return (h, w)


def backbone_macs(spec: Mapping[str, Any], img_size: IntPair, in_chans: int) -> int:
    """Multiply-accumulates of the backbone's convolutions for one image."""
    return _kind(spec).macs(spec, img_size, in_chans)


def build_backbone(spec: Mapping[str, Any], in_chans: int) -> nn.Module:
    """The module a backbone dict describes."""
    spec = normalize_backbone(spec)
    return _kind(spec).build(spec, in_chans)


@torch.no_grad()
def init_backbone_(module: nn.Module) -> None:
    """The official (Flax) defaults: LeCun-normal kernels, GroupNorm scale 1 and bias 0."""
    for m in module.modules():
        if isinstance(m, StdConv2dSame):
            lecun_normal_(m.weight)
        elif isinstance(m, nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def infer_backbone(sd: Mapping[str, Any], prefix: str = "patch_embed.backbone.") -> Optional[Dict[str, Any]]:
    """The backbone dict of a state dict in timm/vitkit names, or None when it has none (the
    ``conv`` kind is vitkit's own and travels in ``config.json``)."""
    spec = bit.infer_spec(sd, prefix)
    return spec if spec is not None else conv_bn_stem.infer_spec(sd, prefix)


def backbone_in_chans(sd: Mapping[str, Any], prefix: str = "patch_embed.backbone.") -> Optional[int]:
    chans = bit.in_chans_of(sd, prefix)
    return chans if chans is not None else conv_bn_stem.in_chans_of(sd, prefix)


# ----------------------------------------------------------------------------- hybrid embedding


class HybridEmbed(PatchGrid, nn.Module):
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
        self.set_img_size(img_size)
        if backbone_embeds(self.spec):  # its last convolution made the tokens (timm: proj=False)
            if problem := embedding_problem(self.spec, embed_dim, self.proj_patch_size):
                raise ValueError(problem)
            self.proj = None
        else:
            self.proj = nn.Conv2d(self.feature_dim, embed_dim, self.proj_patch_size,
                                  stride=self.proj_patch_size, bias=bias)

    def grid_for(self, img_size: IntPair) -> IntPair:
        fh, fw = backbone_feature_size(self.spec, img_size)
        ph, pw = self.proj_patch_size
        if fh % ph or fw % pw:
            raise ValueError(
                f"image size {img_size[0]}x{img_size[1]} gives a {fh}x{fw} backbone feature map, "
                f"not divisible by the projection patch {ph}x{pw}; use a multiple of "
                f"{self.patch_size[0]}x{self.patch_size[1]} pixels")
        return (fh // ph, fw // pw)

    def forward(self, x: torch.Tensor, strict: bool = True) -> torch.Tensor:
        self.check_images(x, strict)
        x = self.backbone(x)
        if self.proj is not None:
            x = self.proj(x)
        return x.permute(0, 2, 3, 1)

    def extra_repr(self) -> str:
        return (f"backbone={describe_backbone(self.spec)}, reduction={self.reduction}, "
                f"proj_patch={self.proj_patch_size}")


__all__ = ["BACKBONES", "BACKBONE_TYPES", "BackboneKind", "normalize_backbone", "describe_backbone",
           "backbone_reduction", "backbone_channels", "backbone_embeds", "embedding_problem", "backbone_feature_size",
           "backbone_macs", "build_backbone",
           "init_backbone_", "infer_backbone", "backbone_in_chans", "HybridEmbed",
           "StdConv2dSame", "GroupNormAct", "MaxPool2dSame", "ResNetStem", "Bottleneck", "ResNetStage",
           "ResNetV2Backbone", "ConvNormAct", "ConvBackbone"]
