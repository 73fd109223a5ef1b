"""A token model as a backbone for dense tasks: feature maps of chosen blocks, timm's ``features_only``.

``create_model(name, features_only=True, out_indices=...)`` wraps the model in a
:class:`FeatureModel` whose forward returns a list of (B, D, gh, gw) maps, those of timm's
``forward_intermediates(..., intermediates_only=True)``, with timm's ``feature_info``
(``channels()``, ``reduction()``, ``module_name()``). The model is kept under ``model.`` (timm's
names) without its classifier, as timm prunes it: :func:`vitkit.load_weights` fills it from a
classifier's checkpoint (its head, of any class count, is left out) or a headless one, and
``create_model`` and ``from_pretrained`` give the same backbone.

``pyramid=True`` adds ViTDet's simple feature pyramid (Li et al. 2022, section 3): the last
chosen map, at stride s, becomes maps at strides s/4, s/2, s and 2s (two transposed convolutions,
one, none, a 2x2 max pool), each projected to ``pyramid_channels`` by a 1x1 and a 3x3 convolution
with channel LayerNorms: what FPN-style detection heads (torchvision's Faster R-CNN, FCOS) take.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..machine import available_memory
from .base import TokenModel
from .config_base import MAX_WIDTH
from .layers import intermediates_plan

#: The pyramid's scales relative to the backbone's map (ViTDet's: strides 4, 8, 16, 32 from 16).
PYRAMID_SCALES = (4.0, 2.0, 1.0, 0.5)


class FeatureInfo:
    """What each output is: channels, stride in pixels (``reduction``) and the module it comes
    from; the accessors of timm's ``FeatureInfo`` (an index or a list of indices, or all)."""

    def __init__(self, entries: List[Dict[str, Any]]):
        self.info = entries

    def _get(self, key: str, idx: Optional[Union[int, Sequence[int]]] = None):
        if idx is None:
            return [e[key] for e in self.info]
        if isinstance(idx, int):
            return self.info[idx][key]
        return [self.info[i][key] for i in idx]

    def channels(self, idx=None):
        return self._get("num_chs", idx)

    def reduction(self, idx=None):
        return self._get("reduction", idx)

    def module_name(self, idx=None):
        return self._get("module", idx)

    def get_dicts(self) -> List[Dict[str, Any]]:
        return [dict(e) for e in self.info]

    def __len__(self) -> int:
        return len(self.info)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map (ViTDet's and ConvNeXt's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


def _rescale(dim: int, scale: float) -> nn.Module:
    if scale == 4.0:
        return nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, 2), LayerNorm2d(dim // 2), nn.GELU(),
                             nn.ConvTranspose2d(dim // 2, dim // 4, 2, 2))
    if scale == 2.0:
        return nn.ConvTranspose2d(dim, dim // 2, 2, 2)
    if scale == 1.0:
        return nn.Identity()
    return nn.MaxPool2d(2, 2)


def _scale_widths(dim: int, scales: Sequence[float]) -> List[int]:
    """The channels of each rescaled map: the transposed convolutions halve them per 2x upscale."""
    return [dim // 4 if s == 4.0 else dim // 2 if s == 2.0 else dim for s in scales]


class SimplePyramid(nn.Module):
    """ViTDet's simple feature pyramid from one map of ``dim`` channels."""

    def __init__(self, dim: int, out_channels: int, scales: Sequence[float] = PYRAMID_SCALES):
        super().__init__()
        self.scales = tuple(scales)
        self.rescale = nn.ModuleList(_rescale(dim, s) for s in self.scales)
        widths = _scale_widths(dim, self.scales)
        self.project = nn.ModuleList(
            nn.Sequential(nn.Conv2d(w, out_channels, 1, bias=False), LayerNorm2d(out_channels),
                          nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False), LayerNorm2d(out_channels))
            for w in widths)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        return [proj(scale(x)) for scale, proj in zip(self.rescale, self.project)]


def _stride(stride: int, scale: float) -> Union[int, float]:
    value = stride / scale
    return int(value) if value.is_integer() else value


def _check_pyramid_fits(dim: int, channels: int) -> None:
    """Refuse pyramid widths past a token model's (a typo would ask the allocator for terabytes),
    or whose weights alone exceed the free memory, naming the field, before anything is built."""
    if channels > MAX_WIDTH:
        raise ValueError(f"pyramid_channels {channels:,} is past {MAX_WIDTH:,} (ViTDet's pyramid has 256)")
    params = sum(w * channels + 9 * channels * channels for w in _scale_widths(dim, PYRAMID_SCALES))
    free = available_memory()
    if free is not None and 4 * params > free:
        raise ValueError(f"pyramid_channels {channels:,} makes a pyramid of {params:,} parameters "
                         f"({4 * params / 2 ** 30:,.1f} GiB in fp32) and {free / 2 ** 30:,.1f} GiB are free")


class FeatureModel(nn.Module):
    """Feature maps of ``model``'s blocks ``out_indices`` (timm's meaning: an int n is the last n
    blocks, a list names blocks, negative from the end; none: the last 3), or ViTDet's pyramid
    over the last of them (none: the last block)."""

    def __init__(self, model: nn.Module, out_indices: Optional[Union[int, Sequence[int]]] = None,
                 norm: bool = False, pyramid: bool = False, pyramid_channels: int = 256):
        super().__init__()
        if not isinstance(model, TokenModel):
            raise ValueError(f"features_only takes a token model (ViT, DeiT, the hybrids, CaiT, ConViT), not "
                             f"{getattr(getattr(model, 'config', None), 'architecture', type(model).__name__)}: "
                             f"a ResNet's stages come from timm's features_only")
        depth = len(model.blocks)
        if out_indices is None:  # timm's default, the last 3 blocks; the pyramid's, the last one
            out_indices = 1 if pyramid else min(3, depth)
        take, _ = intermediates_plan(depth, out_indices, "NCHW", True, True)  # out of range: one ValueError here
        if getattr(model, "num_classes", 0):  # a backbone has no classifier (timm prunes it too)
            model.reset_classifier(0)
        self.model = model
        self.out_indices = sorted(take)
        self.norm = bool(norm)
        dim, stride = model.config.embed_dim, max(model.patch_size)
        if pyramid:
            if not isinstance(pyramid_channels, int) or pyramid_channels < 1:
                raise ValueError(f"pyramid_channels must be a positive integer, got {pyramid_channels!r}")
            _check_pyramid_fits(dim, pyramid_channels)
            if dim % 4:
                raise ValueError(f"the pyramid's 4x map has width / 4 channels: width {dim} is not a multiple of 4")
            self.pyramid: Optional[SimplePyramid] = SimplePyramid(dim, pyramid_channels)
            self.feature_info = FeatureInfo([
                {"module": f"pyramid.project.{i}", "num_chs": pyramid_channels, "reduction": _stride(stride, s),
                 "index": i} for i, s in enumerate(PYRAMID_SCALES)])
        else:
            self.pyramid = None
            self.feature_info = FeatureInfo([{"module": f"blocks.{i}", "num_chs": dim, "reduction": stride, "index": i}
                                             for i in self.out_indices])

    @property
    def config(self):
        return self.model.config

    def save_pretrained(self, directory):
        """The backbone's model, and the blocks it returns under ``"features"`` (``out_indices``, ``norm``):
        ``from_pretrained(folder, features_only=True)`` gives the same maps, as a transformers backbone's config
        names its own (they were dropped, and the reload returned the last 3 blocks' maps in silence). A pyramid
        is not written: its layers belong to the model built on top (save them with it)."""
        from .serialize import save_pretrained

        if self.pyramid is not None:
            warnings.warn("the feature pyramid's layers are not written (from_pretrained(..., features_only=True, "
                          "pyramid=True) builds a new one): save them with the model built on top", UserWarning,
                          stacklevel=2)
        return save_pretrained(self.model, directory, features={"out_indices": list(self.out_indices),
                                                                 "norm": self.norm})

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        indices = self.out_indices[-1:] if self.pyramid is not None else self.out_indices
        maps = self.model.forward_intermediates(x, indices=indices, norm=self.norm, intermediates_only=True)
        return self.pyramid(maps[-1]) if self.pyramid is not None else maps

    def named_maps(self, x: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        """The maps keyed '0', '1', ...: torchvision's detection models take a backbone that returns this."""
        return OrderedDict((str(i), m) for i, m in enumerate(self(x)))


__all__ = ["FeatureInfo", "FeatureModel", "SimplePyramid", "LayerNorm2d", "PYRAMID_SCALES"]
