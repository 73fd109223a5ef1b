"""The hybrids' CNN alone as an image classifier: the CNN side of the paper's comparisons.

:class:`ResNetV2` is the non-pre-activation BiT ResNetV2 of the ViT hybrid (:mod:`.bit`:
GroupNorm, weight standardisation, SAME padding), global average pooling and a linear head
stored as a 1x1 convolution (``head.fc``). BiT's published classifiers and timm's
``resnetv2_50`` are pre-activation networks; this is neither (they are refused by name). It
equals timm's ``ResNetV2(layers, preact=False, stem_type='same',
conv_layer=partial(StdConv2dSame, eps=1e-8))`` parameter for parameter, so timm state dicts
load and export with no renaming. Registered as ``resnetv2_50_nopreact`` (family "resnetv2").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Dict, Mapping, Optional, Tuple

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .bit import ResNetV2Backbone
from .complexity import Complexity, count_params
from .config_base import ImageConfig
from .hybrid import (
    backbone_channels,
    backbone_feature_size,
    backbone_macs,
    backbone_reduction,
    infer_backbone,
    init_backbone_,
    normalize_backbone,
)
from .layers import to_2tuple
from .registry import Family, register_family, register_model
from .serialize import SaveMixin


@dataclass
class ResNetV2Config(ImageConfig):
    """A ResNetV2 classifier: the hybrid's (non-pre-activation) backbone, average pool, linear head.

    Not BiT's pre-activation classifier and not timm's ``resnetv2_50`` (pre-activation with
    BatchNorm): its state dict equals timm's ``ResNetV2(preact=False, stem_type='same',
    conv_layer=StdConv2dSame(eps=1e-8))``, which timm registers under no name.
    """

    KIND: ClassVar[str] = "ResNetV2"

    layers: Tuple[int, ...] = (3, 4, 6, 3)
    width_factor: int = 1
    architecture: str = "resnetv2"

    def __post_init__(self) -> None:
        self.layers = tuple(int(n) for n in self.layers)
        self.img_size = to_2tuple(self.img_size)
        self.validate()

    def validate(self) -> None:
        problems = self._architecture_problems()
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

    def head_names(self) -> Tuple[str, ...]:
        """The attribute holding the classifier (a new class count starts it afresh, as for the ViT families)."""
        return ("head",)

    def get_classifier(self) -> nn.Module:
        """The classifier (timm's API: the head's linear layer, an Identity without classes)."""
        return self.head.fc if self.head.fc is not None else nn.Identity()

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


def resnet_complexity(config: ResNetV2Config) -> Complexity:
    """A CNN has no tokens and no attention: those fields are 0; ``grid`` is its final map."""
    cnn, head = resnet_complexity_macs(config)
    h, w = config.img_size
    r = backbone_reduction(config.backbone)
    pixels = h * w
    return Complexity(
        params=count_params(config), macs=cnn + head, img_size=(h, w), patch_size=(r, r),
        grid=backbone_feature_size(config.backbone, config.img_size), tokens=0, heads=0,
        depth=sum(config.layers), attn_entries_per_layer=0, attn_bytes_per_layer_fp32=0,
        attn_macs_share=0.0, pixel_tokens=pixels, pixel_attn_entries=pixels * pixels, backbone_macs=cnn)


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


def is_resnet_state_dict(keys: Collection[str]) -> bool:
    """timm's ResNetV2 names at the top level (a hybrid's CNN sits under ``patch_embed.backbone.``)."""
    return "stem.conv.weight" in keys and "patch_embed.proj.weight" not in keys \
        and any(k.startswith("stages.") for k in keys)


FAMILY = register_family(Family(
    name="resnetv2", config_cls=ResNetV2Config, model_cls=ResNetV2, complexity=resnet_complexity,
    matches=is_resnet_state_dict, infer_config=infer_resnet_config, detect_priority=10, tokens=False))

# Not timm's resnetv2_50 (pre-activation, BatchNorm), hence its own name.
register_model("resnetv2_50_nopreact", ResNetV2Config(layers=(3, 4, 6, 3)),
               "ResNet-50 of the hybrids (GroupNorm, weight standardisation, not pre-activation) as a classifier")

__all__ = ["ResNetV2Config", "ClassifierHead", "ResNetV2", "resnet_complexity_macs", "resnet_complexity",
           "infer_resnet_config", "is_resnet_state_dict", "FAMILY"]
